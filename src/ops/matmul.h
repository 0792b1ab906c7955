/*
 * matmul.h - the one matrix multiply of the forward pass.
 *
 *   out[t * n_out + r] = sum_i W[r][i] * x[t * n_in + i]
 *
 * for tokens t < n_tokens and rows r < n_out. W is n_out rows of n_in values
 * of `wtype`, row-major as GGUF stores a weight of dims [n_in, n_out]. With
 * n_tokens == 1 this is the decode GEMV (memory-bound); with more it is the
 * prefill GEMM (compute-bound, rows x tokens tiled).
 *
 * For Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL and MXFP4 weights the activations are
 * quantized once to Q8_0 blocks, for the K-quants (Q2_K .. Q6_K) and
 * IQ4_XS to Q8_K blocks, and the inner loop is an integer dot product. F16/BF16 weights are
 * converted on the fly and multiplied in fp32.
 */
#ifndef KT_OPS_MATMUL_H
#define KT_OPS_MATMUL_H

#include <stdbool.h>

#include "base/dtype.h"
#include "ops/pool.h"

bool kt_matmul_supported(kt_dtype wtype);

/* Chooses the fastest kernel this CPU has. pool may be NULL. */
void kt_matmul(kt_pool *pool, float *out, const void *w, kt_dtype wtype,
               const float *x, int n_in, int n_out, int n_tokens);

/* One of several matrices multiplied by the same activations. */
typedef struct kt_matmul_part {
    float *out;
    const void *w;
    kt_dtype wtype;
    int n_out;
} kt_matmul_part;

#define KT_MATMUL_MAX_PARTS 16 /* a mixture of experts' decode: 8 experts' gate and up */

/* kt_matmul for each part, all with the same x, n_in and n_tokens (a
 * layer's Q, K and V; its gate and up): the activations are quantized once
 * and the threads meet once instead of once per matrix, which counts in
 * decode, where a small model's matmuls take microseconds. Parts whose
 * types want their activations differently (Q8_0 blocks, Q8_K blocks,
 * floats) run one after another, as do more than KT_MATMUL_MAX_PARTS.
 * Every output has the bits kt_matmul gives it. */
void kt_matmul_many(kt_pool *pool, const kt_matmul_part *parts, int n_parts, const float *x, int n_in,
                    int n_tokens);

/* The scalar reference: same contract, single thread, plain C. The
 * specification every SIMD path is tested against. */
void kt_matmul_ref(float *out, const void *w, kt_dtype wtype, const float *x,
                   int n_in, int n_out, int n_tokens);

#endif
