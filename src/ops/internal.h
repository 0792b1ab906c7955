/*
 * internal.h - declarations shared inside src/ops/ only: the layout of
 * quantized activations that the matmul kernels read, and the AVX2 kernels
 * that live in the *_avx2.c files (compiled with -mavx2 -mfma -mf16c and
 * only ever called after kt_cpu_has_avx2() said yes).
 */
#ifndef KT_OPS_INTERNAL_H
#define KT_OPS_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "ops/ops.h"

/* ---- Q8_0 activations ------------------------------------------------
 *
 * Activations quantized to Q8_0 blocks as llama.cpp's runtime quantizes
 * them (q = x * 127/amax rounded to nearest, ties to even; d = fp16 of
 * amax/127), stored with the values and the scales apart: the 32 values of
 * block b of token t are the 32 bytes at qs + (t * nb + b) * 32 (aligned
 * if qs is), its scale is d[t * nb + b], the fp16-rounded scale as a
 * float. (The weight quantizer, kt_quantize_row(KT_Q8_0), is ggml's
 * reference one, x * (1/d) with ties away from zero: it must reproduce
 * llama.cpp's files byte for byte. The two differ only on rounding ties;
 * on ties this one is what makes kettle's logits match llama.cpp's, see
 * tests/test_golden.c.)
 * c8[t * nb + b] is 8 times the sum of the block's 32 values: Q4_0 kernels
 * multiply the raw nibbles n and subtract it, since sum (n - 8) x =
 * sum n x - 8 sum x (Q5_0: 2 * c8; Q4_1/Q5_1 use c8 / 8 for their
 * minimum's term). */
typedef struct kt_q8_act {
    const int8_t *qs;
    const float *d;
    const int32_t *c8;
    int nb; /* blocks per token: n_in / 32 */
} kt_q8_act;

/* Bytes of scratch a kt_q8_act of n_tokens x n_in needs (with alignment
 * slack); carving it gives the writable arrays and the read-only view. */
size_t kt_q8_act_bytes(int n_in, int n_tokens);
kt_q8_act kt_q8_act_carve(void *scratch, int n_in, int n_tokens, int8_t **qs, float **d,
                          int32_t **c8);

/* One row of n values (n a multiple of 32) -> n/32 blocks (values, scales,
 * c8), as described above. */
void kt_quantize_act_q8_ref(const float *x, int64_t n, int8_t *qs, float *d, int32_t *c8);

/* The 32 levels of a Q4_0/Q4_1 block (0..15) or of a Q5_0/Q5_1 block
 * (0..31, fifth bits from qh) in element order (quant.c). */
void kt_unpack_q4(const uint8_t *qs, uint8_t *q);
void kt_unpack_q5(const uint8_t *qs, const uint8_t *qh, uint8_t *q);

/* ---- Q8_K activations (K-quant weights) --------------------------------
 *
 * The activations of a matmul with Q2_K..Q6_K or IQ4_XS weights, quantized with
 * kt_quantize_act_q8_K (kquant.h): block b of token t (nb = n_in / 256
 * blocks per token) has its 256 values at qs + (t * nb + b) * 256 (64-byte
 * aligned if qs is), its float scale at d[t * nb + b] and its 16 sums of
 * 16 values at bsums + (t * nb + b) * 16. */
typedef struct kt_q8k_act {
    const int8_t *qs;
    const float *d;
    const int16_t *bsums;
    int nb;
} kt_q8k_act;

size_t kt_q8k_act_bytes(int n_in, int n_tokens);
kt_q8k_act kt_q8k_act_carve(void *scratch, int n_in, int n_tokens, int8_t **qs, float **d,
                            int16_t **bsums);

/* The specification of the K-quant dot products (matmul_k.c): adds weight
 * block b of `row` (type t: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K or IQ4_XS) times
 * one Q8_K activation block (values xq, scale dx, sums bs) to acc:
 *   Q4_K/Q5_K: isum = sum_j sc[j] * sum_l q[32j+l] * xq[32j+l]   (exact)
 *              imin = sum_j m[j] * (bs[2j] + bs[2j+1])            (exact)
 *              acc = fmaf((float)isum, d * dx, acc)
 *              acc = fmaf((float)-imin, dmin * dx, acc)
 *   Q6_K:      isum = sum_g sc[g] * sum_l (q[16g+l] - 32) * xq[16g+l]
 *              acc = fmaf((float)isum, d * dx, acc)
 *   Q2_K:      isum = sum_g sc[g] * sum_l q[16g+l] * xq[16g+l]     (exact)
 *              imin = sum_g m[g] * bs[g]
 *              then Q4_K's two fmaf steps
 *   Q3_K:      isum = sum_g (sc[g] - 32) * sum_l (q[16g+l] - 4) * xq[16g+l]
 *              acc = fmaf((float)isum, d * dx, acc)
 *   IQ4_XS:    isum = sum_j (ls[j] - 32) * sum_l VALUES[q[32j+l]] * xq[32j+l]
 *              acc = fmaf((float)isum, d * dx, acc)
 * Every path (reference, scalar fallback, AVX2) applies exactly these
 * float operations, block after block, so they agree bit for bit. */
float kt_kq_block_step(kt_dtype t, const void *row, int b, const int8_t *xq, float dx,
                       const int16_t *bs, float acc);

/* IQ4_NL weights take Q8_0 activations (32-value blocks) and Q4_0's
 * step: acc = fmaf((float)isum_b, d_w[b] * d_x[b], acc), block after
 * block, isum_b = sum_l KT_IQ4NL_VALUES[q[l]] * xq[l] (matmul_k.c). */
int32_t kt_iq4_nl_idot(const void *row, int b, const int8_t *xq);
/* MXFP4 likewise (the scalar twin of its kernels): isum_b = sum_l
 * KT_MXFP4_VALUES[q[l]] * xq[l] (ggml's sumi1 + sumi2), and the step
 * acc = fmaf((float)isum_b, kt_e8m0_half(e[b]) * d_x[b], acc). */
int32_t kt_mxfp4_idot(const void *row, int b, const int8_t *xq);

/* ---- AVX2 kernels (the *_avx2.c files) --------------------------------- */

void kt_quantize_act_q8_avx2(const float *x, int64_t n, int8_t *qs, float *d, int32_t *c8);
/* kt_quantize_act_q8_K (kquant.h), bit for bit. */
void kt_quantize_act_q8_K_avx2(const float *x, int64_t n, int8_t *qs, float *d, int16_t *bsums);

/* Bytes of the per-thread work area the Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 GEMM
 * needs for n_in (transposed copies of 16 weight rows; a 64-byte
 * multiple). */
size_t kt_matmul_panel_bytes(int n_in);

/* Rows [r0, r1) of out for every token: out[t * n_out + r]. For Q8_0 and
 * Q4_0 weights x is the quantized activations; panel is the calling
 * thread's own kt_matmul_panel_bytes(n_in) bytes, 64-byte aligned, used by
 * Q4_0, Q8_0 (and the other 32-value formats) with n_tokens > 1 (NULL: one GEMV
 * per token instead). For float weights
 * xf. */
void kt_matmul_q8_0_avx2(float *out, const void *w, const kt_q8_act *x, int n_in,
                         int n_out, int n_tokens, int r0, int r1, void *panel);
void kt_matmul_q4_0_avx2(float *out, const void *w, const kt_q8_act *x, int n_in,
                         int n_out, int n_tokens, int r0, int r1, void *panel);
/* Q4_Kx8, Q5_Kx8, Q6_Kx8 weights (ops/repack.h); rows r0, r1 multiples
 * of 8. */
void kt_matmul_q4_K_x8_avx2(float *out, const void *w, const kt_q8k_act *x, int n_in, int n_out,
                            int n_tokens, int r0, int r1);
void kt_matmul_q5_K_x8_avx2(float *out, const void *w, const kt_q8k_act *x, int n_in, int n_out,
                            int n_tokens, int r0, int r1);
void kt_matmul_q6_K_x8_avx2(float *out, const void *w, const kt_q8k_act *x, int n_in, int n_out,
                            int n_tokens, int r0, int r1);
/* Q2_Kx8, Q3_Kx8, IQ4_XSx8 (wtype), rows [r0, r1) in multiples of 8. */
void kt_matmul_lowbit_x8_avx2(float *out, const void *w, kt_dtype wtype, const kt_q8k_act *x, int n_in,
                              int n_out, int n_tokens, int r0, int r1);
/* Q4_0x8 or Q5_0x8 weights (wtype; ops/repack.h); rows r0, r1 multiples
 * of 8. */
void kt_matmul_x8_avx2(float *out, const void *w, kt_dtype wtype, const kt_q8_act *x, int n_in, int n_out,
                       int n_tokens, int r0, int r1);
/* The same on AMX-INT8 tiles (matmul_amx_q8.c), the same bits, for the
 * 32-value x8 formats (Q4_0x8, Q8_0x8, IQ4_NLx8, MXFP4x8) where
 * kt_matmul_x8_amx_takes says so; panel as for kt_matmul_q4_0_avx2 (the
 * calling thread's kt_matmul_amx_panel_bytes(n_in)). Rows and tokens past the
 * last whole tile of 16 go to kt_matmul_x8_avx2. */
bool kt_matmul_x8_amx_takes(kt_dtype wtype, int n_tokens);
/* Bytes of the per-thread work area kt_matmul_x8_amx needs for n_in (a
 * 64-byte multiple). */
size_t kt_matmul_amx_panel_bytes(int n_in);
void kt_matmul_x8_amx(float *out, const void *w, kt_dtype wtype, const kt_q8_act *x, int n_in, int n_out,
                      int n_tokens, int r0, int r1, void *panel);
/* Rows [r0, r1) of every token for Q4_1, Q5_0 or Q5_1 weights (x: the
 * Q8_0 activations), bit-identical to the reference; panel as for Q4_0. */
void kt_matmul_legacy_avx2(float *out, const void *w, kt_dtype wtype, const kt_q8_act *x,
                           int n_in, int n_out, int n_tokens, int r0, int r1, void *panel);
/* Rows [r0, r1) of every token for K-quant weights (Q2_K .. Q6_K,
 * IQ4_XS). */
void kt_matmul_kq_avx2(float *out, const void *w, kt_dtype wtype, const kt_q8k_act *x,
                       int n_in, int n_out, int n_tokens, int r0, int r1);
/* Rows [r0, r1) of every token for IQ4_NL weights (x: the Q8_0
 * activations), bit-identical to the reference (matmul_k_avx2.c). */
void kt_matmul_iq4_nl_avx2(float *out, const void *w, const kt_q8_act *x, int n_in, int n_out,
                           int n_tokens, int r0, int r1);
/* The same for MXFP4 weights (matmul_k_avx2.c). */
void kt_matmul_mxfp4_avx2(float *out, const void *w, const kt_q8_act *x, int n_in, int n_out,
                          int n_tokens, int r0, int r1);
void kt_matmul_float_avx2(float *out, const void *w, kt_dtype wtype, const float *xf,
                          int n_in, int n_out, int n_tokens, int r0, int r1);
/* Float weights in an x16 layout (repack.h) whose plain type is plain
 * (F32, F16 or BF16), rows r0 .. r1 - 1: multiples of 16, as are n_out's
 * (matmul_x16_avx2.c). */
void kt_matmul_x16_avx2(float *out, const void *w, kt_dtype plain, const float *x, int n_in, int n_out,
                        int n_tokens, int r0, int r1);

void kt_fp32_to_fp16_row_avx2(const float *x, uint16_t *out, int64_t n);
/* RoPE's turn of pairs [p0, p0 + nc) of every head by the angles cs/sn
 * (indexed from p0): the scalar twin and its AVX2 kernel, same bits. */
void kt_rope_turn_ref(float *x, int n_heads, int head_dim, int n_pairs, int p0, int nc, const float *cs,
                      const float *sn, kt_rope_style style);
void kt_rope_turn_avx2(float *x, int n_heads, int head_dim, int n_pairs, int p0, int nc, const float *cs,
                       const float *sn, kt_rope_style style);
void kt_rmsnorm_avx2(float *out, const float *x, const float *w, int n, float eps);
void kt_delta_rule_run_avx2(float *S, const float *S_in, const kt_delta_run *run, int dk, int dv);
void kt_delta_rule_run_avx512(float *S, const float *S_in, const kt_delta_run *run, int dk, int dv);
void kt_softmax_avx2(float *x, int n);
/* The attention kernels' exp, 8 and 16 lanes at a time (n a multiple of
 * 16): the same bits, which the kernels' agreement across tiers relies on
 * (a test holds them to it). */
void kt_exp_rows_avx2(const float *x, float *out, int n);
void kt_exp_rows_avx512(const float *x, float *out, int n);
void kt_swiglu_avx2(float *out, const float *gate, const float *up, int n);
void kt_geglu_avx2(float *out, const float *gate, const float *up, int n);
void kt_swiglu_oai_avx2(float *out, const float *gate, const float *up, int n, float alpha, float limit);

/* Gemma 2's score cap in place: s = cap * tanh(s / cap), the reference
 * and the group kernel both (tanhf, so both give the same bits). */
void kt_softcap_row(float *s, int n, float cap);
/* Heads sharing a KV head are done together, at most this many at once. */
#define ATTN_MAX_GROUP 16
/* heads of a group from which one token's attention runs them in the
 * lanes of the block kernel (kt_attention_heads_*) */
#ifndef ATTN_HEADS_MIN
#define ATTN_HEADS_MIN 4
#endif

/* The first position query token t attends to: 0, or under a sliding
 * window the oldest of its last `window` positions. */
static inline int kt_attn_first(const kt_attn_args *a, int t) {
    const int end = a->n_pos ? a->n_pos[t] : a->pos0 + t + 1;
    return a->window > 0 && end > a->window ? end - a->window : 0;
}

/* How many positions query token t attends to. The kernels index them
 * 0 .. kt_attn_n_pos - 1 from kt_attn_first (kt_attn_row adds it), so a
 * window costs them nothing but this offset. */
static inline int kt_attn_n_pos(const kt_attn_args *a, int t) {
    return (a->n_pos ? a->n_pos[t] : a->pos0 + t + 1) - kt_attn_first(a, t);
}

/* Start of the K or V row (base = a->k or a->v) of token t's p-th
 * attended position (kt_attn_first + p): the addressing of kt_attn_args
 * (ops.h). */
static inline const char *kt_attn_row(const kt_attn_args *a, const void *base, int t, int p) {
    p += kt_attn_first(a, t);
    if (!a->blocks) return (const char *)base + (size_t)p * a->kv_stride * sizeof(float);
    return (const char *)base + (size_t)a->blocks[t][p / a->block_tokens] * a->block_bytes +
           (size_t)(p % a->block_tokens) * a->row_bytes;
}

/* Attention of query token t for heads [h0, h1), which must all read the
 * same KV head, at most ATTN_MAX_GROUP of them. */
void kt_attention_group_avx2(const kt_attn_args *a, int t, int h0, int h1, float *scratch, size_t row);

/* Prefill: query tokens t0 .. t0+nt-1 (nt <= 8 with AVX2, 16 with
 * AVX-512; one sequence: the same block table) and heads h0 .. h0+nh-1 of
 * one KV group (nh <= ATTN_MAX_GROUP) together, with the per-token
 * kernel's bits; head_dim a multiple of 8 (16), at most 256. scratch:
 * kt_attention_block_floats floats for the longest of the tokens' n_pos. */
void kt_attention_block_avx2(const kt_attn_args *a, int t0, int nt, int h0, int nh, float *scratch);
void kt_attention_block_avx512(const kt_attn_args *a, int t0, int nt, int h0, int nh, float *scratch);
/* Decode: token t's heads h0 .. h0+nh-1 of one KV group (nh <= 8 with
 * AVX2, 16 with AVX-512) as the lanes of the same kernel, with the same
 * bits; for groups of 4 or more heads (grouped-query attention), where
 * the lanes are mostly used. scratch as for the block kernel with 1 head. */
void kt_attention_heads_avx2(const kt_attn_args *a, int t, int h0, int nh, float *scratch);
void kt_attention_heads_avx512(const kt_attn_args *a, int t, int h0, int nh, float *scratch);

/* Decode of one token (n_tokens 1) at long contexts in three passes,
 * split where the work is independent (see ops_avx2.c): the scores of
 * every head at positions [p0, p1) into S (row h at h * s_row);
 * then for up to 8 heads the exps in place and 1 / their sums (the sums'
 * chains side by side); then dims [d0, d0 +
 * 32) of the group's outputs (head_dim a multiple of 32). scratch: per
 * thread, kt_attn_decode_thread_floats(n_pos) floats. Same bits as
 * kt_attention_group_avx2. */
size_t kt_attn_decode_thread_floats(int n_pos);
void kt_attn_decode_scores_avx2(const kt_attn_args *a, int p0, int p1, float *S, size_t s_row, float *scratch);
void kt_attn_decode_softmax_avx2(float *S, size_t s_row, int h0, int nh, int n_pos, const float *sinks, float *inv);
void kt_attn_decode_values_avx2(const kt_attn_args *a, int kvh, int d0, const float *S, size_t s_row,
                                const float *inv, float *scratch);
size_t kt_attention_block_floats(int head_dim, int heads, int n_pos_max);

#endif
