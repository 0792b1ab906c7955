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
 * For Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 weights the activations are
 * quantized once to Q8_0 blocks, for the K-quants (Q4_K, Q5_K, Q6_K) to Q8_K blocks, and the
 * inner loop is an integer dot product. F16/BF16 weights are
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

/* The scalar reference: same contract, single thread, plain C. The
 * specification every SIMD path is tested against. */
void kt_matmul_ref(float *out, const void *w, kt_dtype wtype, const float *x,
                   int n_in, int n_out, int n_tokens);

#endif
