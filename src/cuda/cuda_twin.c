/*
 * cuda_twin.c - the CPU twins of the CUDA kernels that src/ops has no
 * reference for: the matmul with F32 activations and weights dequantized
 * block by block (the GPU kernel's arithmetic, summed here in double, so
 * the twin is the exact value up to one final rounding). The other
 * kernels' twins are src/ops's own references (kt_rmsnorm_ref, kt_rope,
 * kt_swiglu_ref, kt_attention_ref).
 */
#include "base/fp16.h"
#include "cuda/kt_cuda.h"
#include "ops/kquant.h"
#include "ops/quant.h"

static double dot_block(const void *blk, kt_dtype wtype, const float *x) {
    double s = 0.0;
    if (wtype == KT_Q4_0) {
        const block_q4_0 *b = blk;
        for (int j = 0; j < 16; j++)
            s += (double)((b->qs[j] & 15) - 8) * x[j] + (double)((b->qs[j] >> 4) - 8) * x[j + 16];
        return s * kt_fp16_to_fp32(b->d);
    }
    const block_q8_0 *b = blk;
    for (int j = 0; j < 32; j++) s += (double)b->qs[j] * x[j];
    return s * kt_fp16_to_fp32(b->d);
}

/* A K-quant row: each super-block dequantized as ggml does (the kernel
 * rounds its values the same way), the products summed in double. */
static double dot_kquant_row(const void *row, kt_dtype wtype, const float *x, int n_in) {
    float y[QK_K];
    double s = 0.0;
    for (int b = 0; b < n_in / QK_K; b++) {
        if (wtype == KT_Q4_K) kt_dequantize_row_q4_K((const block_q4_K *)row + b, y, QK_K);
        else if (wtype == KT_Q5_K) kt_dequantize_row_q5_K((const block_q5_K *)row + b, y, QK_K);
        else kt_dequantize_row_q6_K((const block_q6_K *)row + b, y, QK_K);
        for (int i = 0; i < QK_K; i++) s += (double)y[i] * x[(size_t)b * QK_K + i];
    }
    return s;
}

void kt_cuda_matmul_twin(float *out, const void *w, kt_dtype wtype, const float *x, int n_in, int n_out,
                         int n_tokens) {
    const size_t row_bytes = kt_dtype_row_bytes(wtype, n_in);
    for (int t = 0; t < n_tokens; t++) {
        const float *xt = x + (size_t)t * n_in;
        for (int r = 0; r < n_out; r++) {
            const unsigned char *wr = (const unsigned char *)w + (size_t)r * row_bytes;
            double acc = 0.0;
            if (wtype == KT_F16 || wtype == KT_BF16) {
                const uint16_t *h = (const uint16_t *)wr;
                for (int i = 0; i < n_in; i++)
                    acc += (double)(wtype == KT_F16 ? kt_fp16_to_fp32(h[i]) : kt_bf16_to_fp32(h[i])) * xt[i];
            } else if (wtype == KT_Q4_K || wtype == KT_Q5_K || wtype == KT_Q6_K) {
                acc = dot_kquant_row(wr, wtype, xt, n_in);
            } else {
                const size_t bb = wtype == KT_Q4_0 ? sizeof(block_q4_0) : sizeof(block_q8_0);
                for (int b = 0; b < n_in / 32; b++) acc += dot_block(wr + (size_t)b * bb, wtype, xt + (size_t)b * 32);
            }
            out[(size_t)t * n_out + r] = (float)acc;
        }
    }
}
