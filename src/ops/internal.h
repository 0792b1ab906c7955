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
 * Activations quantized with the reference Q8_0 quantizer, stored with the
 * values and the scales apart: the 32 values of block b of token t are the
 * 32 bytes at qs + (t * nb + b) * 32 (aligned if qs is), its scale is
 * d[t * nb + b], the fp16-rounded scale as a float. These are exactly the
 * numbers kt_quantize_row(KT_Q8_0, ...) stores, only laid out for loads. */
typedef struct kt_q8_act {
    const int8_t *qs;
    const float *d;
    int nb; /* blocks per token: n_in / 32 */
} kt_q8_act;

/* Bytes of scratch a kt_q8_act of n_tokens x n_in needs (with alignment
 * slack), and how to carve it: qs first (64-aligned), then d. */
size_t kt_q8_act_bytes(int n_in, int n_tokens);
kt_q8_act kt_q8_act_carve(void *scratch, int n_in, int n_tokens, int8_t **qs, float **d);

/* One row of n values (n a multiple of 32) -> n/32 blocks. Bit-identical
 * to the reference Q8_0 quantizer. */
void kt_quantize_act_q8_ref(const float *x, int64_t n, int8_t *qs, float *d);

/* ---- AVX2 kernels (the *_avx2.c files) --------------------------------- */

void kt_quantize_act_q8_avx2(const float *x, int64_t n, int8_t *qs, float *d);

/* Rows [r0, r1) of out for every token: out[t * n_out + r]. For Q8_0 and
 * Q4_0 weights x is the quantized activations; for float weights xf. */
void kt_matmul_q8_0_avx2(float *out, const void *w, const kt_q8_act *x, int n_in,
                         int n_out, int n_tokens, int r0, int r1);
void kt_matmul_q4_0_avx2(float *out, const void *w, const kt_q8_act *x, int n_in,
                         int n_out, int n_tokens, int r0, int r1);
void kt_matmul_float_avx2(float *out, const void *w, kt_dtype wtype, const float *xf,
                          int n_in, int n_out, int n_tokens, int r0, int r1);

void kt_rmsnorm_avx2(float *out, const float *x, const float *w, int n, float eps);
void kt_softmax_avx2(float *x, int n);
void kt_swiglu_avx2(float *out, const float *gate, const float *up, int n);
/* Attention of query token t, head h (one output row of head_dim). */
void kt_attention_head_avx2(const kt_attn_args *a, int t, int h);

#endif
