/*
 * vision_internal.h - what mmproj.c (loading) hands encoder.c (the forward
 * pass) and vit_ops.c (the element-wise and attention kernels): the bound
 * weights and the hyper-parameters of one vision tower, as llama.cpp's
 * clip.cpp reads them for the Qwen-VL projectors.
 */
#ifndef KT_VISION_INTERNAL_H
#define KT_VISION_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "base/dtype.h"
#include "gguf/gguf.h"
#include "ops/pool.h"
#include "vision/vision.h"

/* One tensor inside the mapped file: a matrix of n_out rows of n_in
 * values (GGUF dims [n_in, n_out]) or a vector (n_out 1, F32). data NULL:
 * absent (only for the optional ones). */
/* head dims above this are refused at load (the rotary's per-token table) */
#define VT_MAX_HEAD_DIM 256

typedef struct vt_weight {
    const void *data;
    kt_dtype type;
    int n_in, n_out;
    const uint16_t *amx; /* F16 weights packed for the AMX tiles (ops/amx.h), or NULL: then data and type */
} vt_weight;

typedef enum vt_projector { VT_QWEN2VL, VT_QWEN25VL, VT_QWEN3VL } vt_projector;
typedef enum vt_norm { VT_NORM_LAYER, VT_NORM_RMS } vt_norm;
/* the ViT MLP's activation (clip.use_gelu / clip.use_silu, default quick
 * GELU as in clip.cpp); with a gate tensor it is the gated form */
typedef enum vt_act { VT_ACT_GELU, VT_ACT_SILU, VT_ACT_GELU_QUICK } vt_act;

typedef struct vt_layer {
    vt_weight ln1_w, ln1_b, ln2_w, ln2_b;   /* biases absent for RMSNorm */
    vt_weight qkv_w, qkv_b;                 /* qwen3vl: fused, rows q | k | v */
    vt_weight q_w, q_b, k_w, k_b, v_w, v_b; /* qwen2vl / qwen2.5vl */
    vt_weight o_w, o_b;
    vt_weight up_w, up_b, gate_w, gate_b, down_w, down_b; /* gate absent: plain MLP */
    bool full_attn;                                       /* false: window attention (qwen2.5vl) */
    bool deepstack;                                       /* qwen3vl DeepStack merger after this block */
    vt_weight ds_norm_w, ds_norm_b, ds_fc1_w, ds_fc1_b, ds_fc2_w, ds_fc2_b;
} vt_layer;

struct kt_vision {
    gguf_file *file;
    kt_vision_info info;
    vt_projector proj;
    vt_norm norm;
    vt_act act;
    int width, n_heads, d_head, n_ff, n_layers;
    int patch, merge, proj_dim, image_size;
    int window_px; /* qwen2.5vl: window side in pixels (112, hard-coded in clip.cpp) */
    float eps;
    float mean[3], std[3];
    /* the two temporal slices of the Conv3d patch embedding as F16 rows
     * (width rows of 3 * patch * patch), owned: llama.cpp's conv_2d
     * multiplies an F16 im2col by the kernel converted to F16, so an F32
     * file's kernel is rounded to F16 here once */
    uint16_t *patch_w16[2];
    kt_dtype patch_type; /* KT_F16, or KT_F16_X16 where repacked (mmproj.c) */
    const uint16_t *patch_amx[2]; /* the same packed for the AMX tiles, or NULL */
    vt_weight patch_b;  /* qwen3vl */
    vt_weight pos_embd; /* qwen3vl: [width, side * side] */
    int pos_side;
    vt_weight pre_ln_w, pre_ln_b, post_ln_w, post_ln_b;
    vt_weight mm0_w, mm0_b, mm2_w, mm2_b;
    vt_layer *layers;
    void *packed; /* owned: the matrices in their GEMM layouts (mmproj.c, repack_matrices) */
    int amx_k_max;  /* the longest row among the AMX-packed matrices (0: none) */
};

/* ---- vit_ops.c: the kernels written here (the GEMMs are kt_matmul) ---- */

/* LayerNorm or RMSNorm of each of n_rows rows of n values, times w, plus
 * b (either may be NULL), into y (may equal x); ggml_norm / ggml_rms_norm. */
void vt_norm_rows(kt_pool *pool, vt_norm kind, float *y, const float *x, const float *w, const float *b, int n_rows,
                  int n, float eps);
/* x[r][i] += b[i] (b NULL: nothing), split over the pool */
void vt_add_bias(kt_pool *pool, float *x, const float *b, int n_rows, int n);
/* y[i] += x[i], split over the pool */
void vt_add(kt_pool *pool, float *y, const float *x, long n);
/* x[i] = act(x[i]) in place: GELU as ggml's CPU computes it (tanh form
 * looked up through its F16 table), quick GELU x * sigmoid(1.702 x) (also
 * through its F16 table), SiLU */
void vt_act_inplace(kt_pool *pool, vt_act act, float *x, long n);
/* gate[i] = act(gate[i]) * up[i] */
void vt_glu(kt_pool *pool, vt_act act, float *gate, const float *up, long n);
/* y[i] = x[i] rounded to the nearest F16 (llama.cpp's F16 im2col, and
 * the activations of F16 GEMMs); y may be x. vt_round_f16 splits it over
 * the pool; _to is one thread, F16C or its scalar twin _ref. */
void vt_round_f16(kt_pool *pool, float *y, const float *x, long n);
void vt_round_f16_to(float *y, const float *x, long n);
void vt_round_f16_ref(float *y, const float *x, long n);
/* The GELU (tanh form) or quick GELU table: fp16 bits -> ggml's result. */
const float *vt_gelu_table(bool quick);
/* x[i] = table[fp16(x[i])] (0 at or below -10 and x at or above 10 with
 * clamp10: ggml's GELU), times up[i] when up is given; SIMD or scalar. */
void vt_act_table(const float *table, bool clamp10, float *x, const float *up, long n);
/* Softmax of one row of n scores times scale, in place, not normalized,
 * s[n .. n_pad) set to 0; returns the normalizing factor 1 / sum
 * (vit_simd.h says the order); _c: the scalar twin. */
float vt_softmax_row(float *s, int n, int n_pad, float scale);
float vt_softmax_row_c(float *s, int n, int n_pad, float scale);
/* The same written split for the AMX tiles (vit_simd.h says how), s kept;
 * _c: the scalar twin. */
float vt_softmax_split_row(const float *s, int n, float scale, uint16_t *dst, int k_pad);
float vt_softmax_split_row_c(const float *s, int n, float scale, uint16_t *dst, int k_pad);

/* 2-D rotary (ggml_rope_multi, GGML_ROPE_TYPE_VISION, base 10000): for
 * every patch t and head, pair (j, j + d/2) rotates by
 * pos_y[t] * base^(-4j/d) for j < d/4 and by pos_x[t] * base^(-4(j - d/4)/d)
 * for j >= d/4. vt_rope_table writes each patch's cosines then sines (d
 * floats a patch) once an image, for every layer's q and k; vt_rope_2d
 * turns x's rows (`stride` floats, heads at h * d) by them. */
void vt_rope_table(float *table, const int *pos_y, const int *pos_x, int n_tokens, int d_head);
void vt_rope_2d(kt_pool *pool, float *x, int stride, const float *table, int n_tokens, int n_heads, int d_head);

/* Bidirectional attention within groups of tokens: win_start[w] ..
 * win_start[w + 1] indexes members[], the tokens of group w (every token in
 * exactly one group; one group of all tokens is full attention). q, k, v
 * rows of `stride` floats, head h at h * d; out rows of n_heads * d.
 * Scratch per thread is allocated here (KT_ERR_NOMEM if it fails). */
kt_status vt_attention(kt_pool *pool, float *out, const float *q, const float *k, const float *v, int stride,
                       int n_heads, int d_head, const int *win_start, const int *members, int n_windows, kt_error *err);
/* The attention's tasks (window, head, block of `block` queries), numbered
 * window by window: entry w is window w's first, entry n_windows the
 * count (malloc'd; NULL with err set). */
long *vt_attention_tasks(const int *win_start, int n_windows, int n_heads, int block, kt_error *err);
/* The same on AMX tiles (vit_attention_amx.c; needs kt_cpu_has_amx_bf16()):
 * the products through bf16 hi + lo splits, ~2^-16 relative error each. */
kt_status vt_attention_amx(kt_pool *pool, float *out, const float *q, const float *k, const float *v, int stride,
                           int n_heads, int d_head, const int *win_start, const int *members, int n_windows,
                           kt_error *err);
/* The same in plain loops, one query at a time (the scalar reference the
 * GEMM path is tested against; vt_attention falls back to it when the
 * head dim is not a multiple of 16). */
kt_status vt_attention_ref(kt_pool *pool, float *out, const float *q, const float *k, const float *v, int stride,
                           int n_heads, int d_head, const int *win_start, const int *members, int n_windows,
                           kt_error *err);

#endif
