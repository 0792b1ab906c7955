/*
 * cu_ops.cu - the element-wise kernels of a decode step: RMSNorm, RoPE
 * (adjacent and NeoX pairs) and SwiGLU, each the arithmetic of its scalar
 * reference in src/ops/ops.c (kt_rmsnorm_ref, kt_rope, kt_swiglu_ref),
 * with the same float operations where the order allows: RoPE's angles
 * are the same float product chain (pos * scale^i, multiplied pair after
 * pair) with the scale computed on the host by the same powf; sinf / cosf
 * / expf are CUDA's full-precision ones (no fast math), a few ulp from
 * glibc's. RMSNorm sums squares in float in a tree (the reference: in
 * double, in order), so its scale differs by rounding only.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/cuda_launch.h"

#define KT_NORM_THREADS 256

__global__ void __launch_bounds__(KT_NORM_THREADS)
    kt_k_rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    __shared__ float part[KT_NORM_THREADS / 32];
    const float *xr = x + (size_t)blockIdx.x * n;
    float *outr = out + (size_t)blockIdx.x * n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    float tot = 0.0f;
#pragma unroll
    for (int i = 0; i < KT_NORM_THREADS / 32; i++) tot += part[i];
    const float scale = 1.0f / sqrtf(tot / (float)n + eps);
    /* every thread has read x before any writes out (out may alias x):
     * each element is read and written by the same thread */
    for (int i = threadIdx.x; i < n; i += blockDim.x) outr[i] = (xr[i] * scale) * w[i];
}

/* one thread per (token, head, pair) */
__global__ void kt_k_rope(float *x, int n_tokens, size_t row_stride, int n_heads, int head_dim, int n_pairs,
                          const int32_t *pos, float theta_scale, int neox) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long per_tok = (long long)n_heads * n_pairs;
    if (idx >= per_tok * n_tokens) return;
    const int t = (int)(idx / per_tok);
    const int h = (int)((idx % per_tok) / n_pairs);
    const int i = (int)(idx % n_pairs);
    float theta = (float)pos[t];
    for (int k = 0; k < i; k++) theta *= theta_scale; /* the reference's product chain */
    float sn, cs;
    sincosf(theta, &sn, &cs);
    float *xh = x + (size_t)t * row_stride + (size_t)h * head_dim;
    float *a = neox ? xh + i : xh + 2 * i;
    float *b = neox ? xh + i + n_pairs : xh + 2 * i + 1;
    const float x0 = *a, x1 = *b;
    *a = x0 * cs - x1 * sn;
    *b = x0 * sn + x1 * cs;
}

__global__ void kt_k_swiglu(float *out, const float *gate, const float *up, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = gate[i];
    out[i] = g / (1.0f + expf(-g)) * up[i];
}

int kt_cu_rmsnorm(float *out, const float *x, const float *w, int n, int n_rows, float eps) {
    kt_k_rmsnorm<<<n_rows, KT_NORM_THREADS>>>(out, x, w, n, eps);
    return (int)cudaGetLastError();
}

int kt_cu_rope(float *x, int n_tokens, size_t row_stride, int n_heads, int head_dim, int n_pairs,
               const int32_t *pos, float theta_scale, int neox) {
    const long long n = (long long)n_tokens * n_heads * n_pairs;
    kt_k_rope<<<(unsigned)((n + 255) / 256), 256>>>(x, n_tokens, row_stride, n_heads, head_dim, n_pairs, pos,
                                                    theta_scale, neox);
    return (int)cudaGetLastError();
}

int kt_cu_swiglu(float *out, const float *gate, const float *up, int n) {
    kt_k_swiglu<<<(n + 255) / 256, 256>>>(out, gate, up, n);
    return (int)cudaGetLastError();
}
