/*
 * kt_cuda.h - the CUDA backend's one boundary (issue 41), plain C.
 *
 * Why: the forward pass is C11 and stays so. Everything that touches the
 * GPU sits behind this header: the device probe, device memory (weights
 * uploaded in their GGUF block layouts, activations), and the kernels a
 * one-token decode step of a dense Llama / Qwen model needs. CUDA C++
 * lives only in the .cu files of this folder, which export launch
 * functions (cuda_launch.h); the C side here checks every argument and
 * turns every CUDA error into a kt_status with an actionable message.
 *
 * State: compiled for sm_90 and tested against the CPU reference by
 * tests/test_cuda.c on a GPU only. Nothing here is wired into the forward
 * pass yet (no --device, no --gpu-layers). Built without nvcc (or with
 * -DKETTLE_CUDA=OFF) every function but the CPU-side ones below fails
 * with KT_ERR_UNSUPPORTED saying so.
 *
 * Device pointers are plain `void *` / `float *`; every kernel is queued
 * on the default stream and its launch checked; kt_cuda_sync waits and
 * reports errors that happened while it ran.
 */
#ifndef KT_CUDA_KT_CUDA_H
#define KT_CUDA_KT_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "kettle.h"
#include "kv/block_pool.h"
#include "ops/ops.h"

/* ---- the probe ------------------------------------------------------ */

#define KT_CUDA_MAX_DEVICES 16

typedef struct kt_cuda_device {
    char name[128];
    int cc_major, cc_minor;        /* compute capability */
    int n_sm;                      /* multiprocessors */
    size_t mem_total_bytes, mem_free_bytes;
    bool usable;                   /* this build has code for it */
} kt_cuda_device;

typedef struct kt_cuda_info {
    bool built;                    /* this kettle has the CUDA backend */
    const char *archs;             /* the build's CMAKE_CUDA_ARCHITECTURES ("" without CUDA) */
    int runtime_version;           /* CUDA runtime linked in, e.g. 13000 (0: none) */
    int driver_version;            /* the driver's CUDA version (0: no driver) */
    int n_devices;                 /* devices the driver sees (at most KT_CUDA_MAX_DEVICES listed) */
    kt_cuda_device dev[KT_CUDA_MAX_DEVICES];
} kt_cuda_info;

/* Fills info and returns KT_OK when device 0 is usable (the one the
 * kernels run on); otherwise KT_ERR_UNSUPPORTED with err saying why and
 * what to do: no CUDA in this build, no driver (libcuda.so.1 not found),
 * a driver older than the runtime, no device, a device older than the
 * build's architectures. info is filled as far as the probe got. */
kt_status kt_cuda_probe(kt_cuda_info *info, kt_error *err);

/* ---- device memory -------------------------------------------------- */

typedef struct kt_cuda_buf {
    void *ptr;                     /* device memory, NULL: none */
    size_t bytes;
} kt_cuda_buf;

/* cudaMalloc of bytes (> 0) into b; what names the buffer in errors. */
kt_status kt_cuda_alloc(kt_cuda_buf *b, size_t bytes, const char *what, kt_error *err);
/* Frees b's memory (b->ptr NULL: no-op) and clears b. */
void kt_cuda_free(kt_cuda_buf *b);
/* Host -> device: bytes from host to b->ptr + off_bytes (in range). */
kt_status kt_cuda_to_device(kt_cuda_buf *b, size_t off_bytes, const void *host, size_t bytes, kt_error *err);
/* Device -> host: bytes from b->ptr + off_bytes. Waits for the copy. */
kt_status kt_cuda_to_host(void *host, const kt_cuda_buf *b, size_t off_bytes, size_t bytes, kt_error *err);
/* A weight tensor of n_out rows of n_in values of wtype, as the GGUF file
 * holds it (plain layout, never the repacked x8 / x16 ones), allocated
 * and copied into b. KT_ERR_UNSUPPORTED naming the tensor and its type
 * for a type the kernels do not read. */
kt_status kt_cuda_upload_weight(kt_cuda_buf *b, const void *host, kt_dtype wtype, int n_in, int n_out,
                                const char *name, kt_error *err);
/* Waits for every queued kernel; reports an error any of them hit. */
kt_status kt_cuda_sync(kt_error *err);

/* ---- kernels (device pointers; each has a CPU twin, see below) ------- */

#define KT_CUDA_MAX_TOKENS 8 /* the small-batch matmul's tokens per weight read */

/* Whether kt_cuda_matmul reads weights of this type (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K, F16, BF16). */
bool kt_cuda_matmul_supported(kt_dtype wtype);
/* out[t * n_out + r] = sum_i W[r][i] * x[t * n_in + i], t < n_tokens in
 * [1, KT_CUDA_MAX_TOKENS], W in its GGUF blocks (dequantized in the
 * kernel), x and out F32; n_in a multiple of the type's block (32, 256 for
 * the K-quants). Twin: kt_cuda_matmul_twin. */
kt_status kt_cuda_matmul(float *out, const void *w, kt_dtype wtype, const float *x, int n_in, int n_out,
                         int n_tokens, kt_error *err);
/* n_rows rows of n: kt_rmsnorm_ref on each (out may alias x). */
kt_status kt_cuda_rmsnorm(float *out, const float *x, const float *w, int n, int n_rows, float eps, kt_error *err);
/* kt_rope on each of n_tokens rows (row_stride floats apart, n_heads heads
 * of head_dim) at position pos[t] (a device array). */
kt_status kt_cuda_rope(float *x, int n_tokens, size_t row_stride, int n_heads, int head_dim, int rope_dim,
                       const int32_t *pos, float freq_base, kt_rope_style style, kt_error *err);
/* kt_swiglu_ref over n values (out may alias gate). */
kt_status kt_cuda_swiglu(float *out, const float *gate, const float *up, int n, kt_error *err);

/* ---- decode attention over the paged KV ----------------------------- */

/* The per-step metadata the attention kernel reads, built on the host
 * from the batch's kv_seq block tables and uploaded in one copy: one int32
 * array of
 *   blocks[n_entries]  every distinct sequence's table, one after another
 *   off[n_tokens]      where token t's sequence's table starts in blocks
 *   n_pos[n_tokens]    positions token t attends: [0, n_pos)
 *   pos[n_tokens]      token t's own position, n_pos - 1 (RoPE's)
 * Blocks are the pool's ids, so a device copy of the pool's planes
 * (block b of a plane at b * block_bytes, as kv/block_pool.h lays it out)
 * is read in place, shared prefix blocks included. */
typedef struct kt_cuda_attn_meta {
    int32_t *buf;                  /* host: blocks | off | n_pos | pos */
    size_t cap;                    /* int32s allocated */
    int n_tokens, n_entries;
    int block_tokens;
    size_t row_bytes, block_bytes; /* the pool's strides */
} kt_cuda_attn_meta;

/* Builds m for n_tokens tokens: token t belongs to seqs[tok_seq[t]] and
 * attends n_pos[t] positions (1 <= n_pos[t] <= that sequence's len). A
 * sequence's table is copied once however many tokens it has. Every
 * sequence on one F16 pool without window layers (what the kernel reads);
 * KT_ERR_ARG / KT_ERR_UNSUPPORTED naming what is wrong otherwise. m's
 * buffer is kept and grown across steps (zero-initialize m first). */
kt_status kt_cuda_attn_meta_build(kt_cuda_attn_meta *m, const kv_seq *const *seqs, int n_seqs, const int *tok_seq,
                                  const int *n_pos, int n_tokens, kt_error *err);
void kt_cuda_attn_meta_free(kt_cuda_attn_meta *m);
/* Int32s of m's array, and where each part starts in it. */
size_t kt_cuda_attn_meta_len(const kt_cuda_attn_meta *m);
static inline const int32_t *kt_cuda_attn_meta_off(const kt_cuda_attn_meta *m) { return m->buf + m->n_entries; }
static inline const int32_t *kt_cuda_attn_meta_npos(const kt_cuda_attn_meta *m) {
    return m->buf + m->n_entries + m->n_tokens;
}
static inline const int32_t *kt_cuda_attn_meta_pos(const kt_cuda_attn_meta *m) {
    return m->buf + m->n_entries + 2 * (size_t)m->n_tokens;
}

/* Decode attention: token t's query (n_head * head_dim floats at
 * q + t * q_stride) over positions [0, n_pos[t]) of its sequence in one
 * layer's F16 K and V planes; out likewise (out_stride). Head h reads KV
 * head h / (n_head / n_head_kv). head_dim 64, 128 or 256; a group of at
 * most 8 query heads per KV head; no window, soft-cap or sinks (yet).
 * meta_dev: kt_cuda_attn_meta's array on the device. Twin:
 * kt_attention_ref with the same block tables (kv_type KT_F16). */
typedef struct kt_cuda_attn_args {
    float *out;
    const float *q;
    const void *k_plane, *v_plane;
    const int32_t *meta_dev;
    int n_tokens, n_entries, n_head, n_head_kv, head_dim, block_tokens;
    size_t q_stride, out_stride, row_bytes, block_bytes;
} kt_cuda_attn_args;

kt_status kt_cuda_attn_decode(const kt_cuda_attn_args *a, kt_error *err);

/* ---- CPU twins (plain C, built and tested with or without CUDA) ------ */

/* kt_cuda_matmul's scalar twin: each weight block dequantized exactly as
 * the kernel does (q * d; a K-quant super-block as ggml's dequantize_row
 * does), dotted with the F32 activations, summed in double. Differs from
 * kt_matmul_ref, which quantizes the activations to Q8_0 (Q8_K for the
 * K-quants) first; tests/test_cuda_host.c bounds that difference. */
void kt_cuda_matmul_twin(float *out, const void *w, kt_dtype wtype, const float *x, int n_in, int n_out,
                         int n_tokens);

#endif
