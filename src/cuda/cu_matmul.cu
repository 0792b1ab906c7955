/*
 * cu_matmul.cu - decode and small-batch matmul over weights in their GGUF
 * block layouts: out[t][r] = sum_i W[r][i] x[t][i] for 1..8 tokens.
 *
 * One warp per output row, 4 rows per thread block; every token's
 * activations (F32) are read against one read of the row, so a step of up
 * to 8 sequences reads the weights once. Q4_0 / Q8_0: the warp copies 32
 * blocks of its row at a time into shared memory with 16-byte loads
 * (coalesced: consecutive lanes, consecutive 16 bytes; a row of n_in % 256
 * == 0 values is a multiple of 16 bytes), then each lane dequantizes one
 * block (q, unscaled), dots it with the tokens' 32 activations and adds
 * d * sum. F16: each lane reads 8 halves (16 bytes) at a time. Rows whose
 * bytes are not a multiple of 16 take the same kernels with narrower
 * loads. The scalar twin is kt_cuda_matmul_twin (cuda_twin.c).
 *
 * Q4_K / Q5_K / Q6_K (super-blocks of 256 values): the warp stages 8
 * super-blocks of its row at a time, and each lane takes 32-value
 * sub-blocks of them (two per chunk), dequantizing each value as ggml's
 * dequantize_row_q4_K / _q5_K / _q6_K does (d * sc * q - dmin * m; (d *
 * sc) * q), rounded the same way (__fmul_rn / __fsub_rn: nvcc would fuse
 * them), so the kernel reads the CPU's dequantized weights and differs
 * from the twin by its sums only. BF16 goes through the F16 kernel, its
 * values widened by a shift.
 * Not yet: activations quantized to int8 with dp4a, several loads in
 * flight per lane (the issue's bandwidth target).
 */
#include <cuda_fp16.h>
#include <stdint.h>

#include "base/dtype.h"
#include "cuda/cuda_launch.h"

#define KT_MM_WARPS 4
#define KT_MM_CHUNK 32 /* blocks a warp stages at a time: one per lane */

struct kt_q4_0 {
    static constexpr int BYTES = 18;
    /* values q - 8, j < 16 from the low nibbles, j + 16 from the high */
    __device__ static void unpack(const uint8_t *b, float *q) {
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int v = b[2 + j];
            q[j] = (float)((v & 15) - 8);
            q[j + 16] = (float)((v >> 4) - 8);
        }
    }
};

struct kt_q8_0 {
    static constexpr int BYTES = 34;
    __device__ static void unpack(const uint8_t *b, float *q) {
#pragma unroll
        for (int j = 0; j < 32; j++) q[j] = (float)(int8_t)b[2 + j];
    }
};

/* Super-block formats: BYTES each; sub(b, j, q) writes sub-block j's 32
 * dequantized values (j < 8), as ggml's dequantize_row_* computes them. */
struct kt_q4_k {
    static constexpr int BYTES = 144; /* d, dmin (fp16), scales[12], qs[128] */
    /* ggml's get_scale_min_k4: 6-bit scale and min of sub-block j */
    __device__ static void scale_min(int j, const uint8_t *q, int *sc, int *m) {
        if (j < 4) {
            *sc = q[j] & 63, *m = q[j + 4] & 63;
        } else {
            *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
            *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
        }
    }
    __device__ static void sub(const uint8_t *b, int j, float *y) {
        const float d = __half2float(__ushort_as_half((unsigned short)(b[0] | (b[1] << 8))));
        const float dmin = __half2float(__ushort_as_half((unsigned short)(b[2] | (b[3] << 8))));
        int sc, m;
        scale_min(j, b + 4, &sc, &m);
        const float d1 = __fmul_rn(d, (float)sc), m1 = __fmul_rn(dmin, (float)m);
        const uint8_t *qs = b + 16 + 32 * (j / 2); /* sub-blocks 2c (low nibbles) and 2c + 1 (high) */
        const int shift = 4 * (j & 1);
#pragma unroll
        for (int l = 0; l < 32; l++) y[l] = __fsub_rn(__fmul_rn(d1, (float)((qs[l] >> shift) & 0xF)), m1);
    }
};

struct kt_q5_k {
    static constexpr int BYTES = 176; /* d, dmin (fp16), scales[12], qh[32] (fifth bits), qs[128] */
    __device__ static void sub(const uint8_t *b, int j, float *y) {
        const float d = __half2float(__ushort_as_half((unsigned short)(b[0] | (b[1] << 8))));
        const float dmin = __half2float(__ushort_as_half((unsigned short)(b[2] | (b[3] << 8))));
        int sc, m;
        kt_q4_k::scale_min(j, b + 4, &sc, &m);
        const float d1 = __fmul_rn(d, (float)sc), m1 = __fmul_rn(dmin, (float)m);
        const uint8_t *qh = b + 16, *qs = b + 48 + 32 * (j / 2);
        const int shift = 4 * (j & 1);
#pragma unroll
        for (int l = 0; l < 32; l++) {
            const int q = ((qs[l] >> shift) & 0xF) + 16 * ((qh[l] >> j) & 1);
            y[l] = __fsub_rn(__fmul_rn(d1, (float)q), m1);
        }
    }
};

struct kt_q6_k {
    static constexpr int BYTES = 210; /* ql[128], qh[64], scales[16] (int8), d (fp16) */
    __device__ static void sub(const uint8_t *b, int j, float *y) {
        const float d = __half2float(__ushort_as_half((unsigned short)(b[208] | (b[209] << 8))));
        const int half = j / 4, quarter = j % 4; /* values 128 half + 32 quarter + l */
        const uint8_t *ql = b + 64 * half + 32 * (quarter & 1), *qh = b + 128 + 32 * half;
        const int8_t *sc = reinterpret_cast<const int8_t *>(b + 192) + 8 * half + 2 * quarter;
        const int lo_shift = 4 * (quarter >> 1), hi_shift = 2 * quarter;
#pragma unroll
        for (int l = 0; l < 32; l++) {
            const int q = (((ql[l] >> lo_shift) & 0xF) | (((qh[l] >> hi_shift) & 3) << 4)) - 32;
            y[l] = __fmul_rn(__fmul_rn(d, (float)sc[l / 16]), (float)q);
        }
    }
};

__device__ __forceinline__ float kt_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Each token's row sum, the warp's lanes added, stored by lane 0. */
template <int NT>
__device__ __forceinline__ void kt_store_rows(float *out, const float *acc, int nt, int n_out, int row, int lane) {
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t >= nt) break;
        const float v = kt_warp_sum(acc[t]);
        if (lane == 0) out[(size_t)t * n_out + row] = v;
    }
}

/* 32 activations from x (16-byte aligned), dotted with q */
__device__ __forceinline__ float kt_dot32(const float *x, const float *q) {
    const float4 *x4 = reinterpret_cast<const float4 *>(x);
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const float4 v = __ldg(x4 + j);
        s += q[4 * j] * v.x + q[4 * j + 1] * v.y + q[4 * j + 2] * v.z + q[4 * j + 3] * v.w;
    }
    return s;
}

template <class T, int NT, bool VEC>
__global__ void __launch_bounds__(KT_MM_WARPS * 32)
    kt_k_mm_quant(float *out, const uint8_t *w, const float *x, int n_in, int n_out, int nt) {
    __shared__ __align__(16) uint8_t stage[KT_MM_WARPS][KT_MM_CHUNK * T::BYTES];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * KT_MM_WARPS + warp;
    if (row >= n_out) return; /* the whole warp: only __syncwarp below */
    const int nb = n_in / 32;
    const uint8_t *wr = w + (size_t)row * nb * T::BYTES;
    uint8_t *s = stage[warp];
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    for (int b0 = 0; b0 < nb; b0 += KT_MM_CHUNK) {
        const int nbc = min(KT_MM_CHUNK, nb - b0);
        const uint8_t *src = wr + (size_t)b0 * T::BYTES;
        const int bytes = nbc * T::BYTES;
        __syncwarp();
        if (VEC) {
            /* bytes is a multiple of 16 here (see the top comment) */
            const uint4 *s4 = reinterpret_cast<const uint4 *>(src);
            for (int i = lane; i < bytes / 16; i += 32) reinterpret_cast<uint4 *>(s)[i] = __ldg(s4 + i);
        } else {
            for (int i = lane; i < bytes; i += 32) s[i] = src[i];
        }
        __syncwarp();
        if (lane < nbc) {
            const uint8_t *bb = s + lane * T::BYTES;
            const float d = __half2float(__ushort_as_half((unsigned short)(bb[0] | (bb[1] << 8))));
            float q[32];
            T::unpack(bb, q);
            const size_t xo = (size_t)(b0 + lane) * 32;
#pragma unroll
            for (int t = 0; t < NT; t++)
                if (t < nt) acc[t] += d * kt_dot32(x + (size_t)t * n_in + xo, q);
        }
    }
    kt_store_rows<NT>(out, acc, nt, n_out, row, lane);
}

#define KT_MM_KCHUNK 8 /* super-blocks a warp stages at a time: 8 sub-blocks each, two per lane */

/* The same over super-block formats (kt_q4_k, kt_q5_k, kt_q6_k). VEC:
 * the row starts 16-byte aligned and a chunk of 8 super-blocks is whole
 * 16-byte words (144, 176 or 210 bytes, times 8), so all but a last
 * partial chunk's tail are copied 16 bytes at a time. */
template <class T, int NT, bool VEC>
__global__ void __launch_bounds__(KT_MM_WARPS * 32)
    kt_k_mm_kquant(float *out, const uint8_t *w, const float *x, int n_in, int n_out, int nt) {
    __shared__ __align__(16) uint8_t stage[KT_MM_WARPS][KT_MM_KCHUNK * T::BYTES];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * KT_MM_WARPS + warp;
    if (row >= n_out) return;
    const int nb = n_in / 256;
    const uint8_t *wr = w + (size_t)row * nb * T::BYTES;
    uint8_t *s = stage[warp];
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    for (int b0 = 0; b0 < nb; b0 += KT_MM_KCHUNK) {
        const int nbc = min(KT_MM_KCHUNK, nb - b0);
        const uint8_t *src = wr + (size_t)b0 * T::BYTES;
        const int bytes = nbc * T::BYTES, words = VEC ? bytes / 16 : 0;
        __syncwarp();
        const uint4 *s4 = reinterpret_cast<const uint4 *>(src);
        for (int i = lane; i < words; i += 32) reinterpret_cast<uint4 *>(s)[i] = __ldg(s4 + i);
        for (int i = 16 * words + lane; i < bytes; i += 32) s[i] = src[i];
        __syncwarp();
        for (int k = lane; k < nbc * 8; k += 32) { /* sub-block k % 8 of super-block k / 8 */
            float y[32];
            T::sub(s + (k / 8) * T::BYTES, k % 8, y);
            const size_t xo = (size_t)b0 * 256 + (size_t)k * 32;
#pragma unroll
            for (int t = 0; t < NT; t++)
                if (t < nt) acc[t] += kt_dot32(x + (size_t)t * n_in + xo, y);
        }
    }
    kt_store_rows<NT>(out, acc, nt, n_out, row, lane);
}

/* a 16-bit float's value: F16, or BF16 (the top half of an F32) */
template <bool BF>
__device__ __forceinline__ float kt_h2f(uint16_t h) {
    return BF ? __uint_as_float((uint32_t)h << 16) : __half2float(__ushort_as_half(h));
}

template <int NT, bool VEC, bool BF>
__global__ void __launch_bounds__(KT_MM_WARPS * 32)
    kt_k_mm_f16(float *out, const uint16_t *w, const float *x, int n_in, int n_out, int nt) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * KT_MM_WARPS + warp;
    if (row >= n_out) return;
    const uint16_t *wr = w + (size_t)row * n_in;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    if (VEC) {
        for (int i = lane * 8; i < n_in; i += 32 * 8) {
            const uint4 raw = __ldg(reinterpret_cast<const uint4 *>(wr + i));
            const uint16_t *h = reinterpret_cast<const uint16_t *>(&raw);
            float wf[8];
#pragma unroll
            for (int j = 0; j < 8; j++) wf[j] = kt_h2f<BF>(h[j]);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < nt) {
                    const float4 *x4 = reinterpret_cast<const float4 *>(x + (size_t)t * n_in + i);
                    const float4 a = __ldg(x4), b = __ldg(x4 + 1);
                    acc[t] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w + wf[4] * b.x + wf[5] * b.y +
                              wf[6] * b.z + wf[7] * b.w;
                }
            }
        }
    } else {
        for (int i = lane; i < n_in; i += 32) {
            const float wf = kt_h2f<BF>(wr[i]);
#pragma unroll
            for (int t = 0; t < NT; t++)
                if (t < nt) acc[t] += wf * x[(size_t)t * n_in + i];
        }
    }
    kt_store_rows<NT>(out, acc, nt, n_out, row, lane);
}

template <int NT>
static void kt_mm_launch(float *out, const void *w, int wtype, const float *x, int n_in, int n_out, int nt) {
    const dim3 grid((unsigned)((n_out + KT_MM_WARPS - 1) / KT_MM_WARPS)), block(KT_MM_WARPS * 32);
    const bool w16 = ((uintptr_t)w & 15) == 0;
    const uint8_t *wb = static_cast<const uint8_t *>(w);
    if (wtype == KT_Q4_0) {
        if (w16 && (n_in / 32) % 8 == 0) kt_k_mm_quant<kt_q4_0, NT, true><<<grid, block>>>(out, wb, x, n_in, n_out, nt);
        else kt_k_mm_quant<kt_q4_0, NT, false><<<grid, block>>>(out, wb, x, n_in, n_out, nt);
    } else if (wtype == KT_Q8_0) {
        if (w16 && (n_in / 32) % 8 == 0) kt_k_mm_quant<kt_q8_0, NT, true><<<grid, block>>>(out, wb, x, n_in, n_out, nt);
        else kt_k_mm_quant<kt_q8_0, NT, false><<<grid, block>>>(out, wb, x, n_in, n_out, nt);
    } else if (wtype == KT_Q4_K) { /* 144-byte rows: whole 16-byte words */
        if (w16) kt_k_mm_kquant<kt_q4_k, NT, true><<<grid, block>>>(out, wb, x, n_in, n_out, nt);
        else kt_k_mm_kquant<kt_q4_k, NT, false><<<grid, block>>>(out, wb, x, n_in, n_out, nt);
    } else if (wtype == KT_Q5_K) { /* 176-byte rows: whole 16-byte words */
        if (w16) kt_k_mm_kquant<kt_q5_k, NT, true><<<grid, block>>>(out, wb, x, n_in, n_out, nt);
        else kt_k_mm_kquant<kt_q5_k, NT, false><<<grid, block>>>(out, wb, x, n_in, n_out, nt);
    } else if (wtype == KT_Q6_K) { /* 210-byte super-blocks: rows of 8k of them are whole words */
        if (w16 && (n_in / 256) % 8 == 0) kt_k_mm_kquant<kt_q6_k, NT, true><<<grid, block>>>(out, wb, x, n_in, n_out, nt);
        else kt_k_mm_kquant<kt_q6_k, NT, false><<<grid, block>>>(out, wb, x, n_in, n_out, nt);
    } else {
        const uint16_t *wh = static_cast<const uint16_t *>(w);
        const bool vec = w16 && n_in % 8 == 0;
        if (wtype == KT_BF16) {
            if (vec) kt_k_mm_f16<NT, true, true><<<grid, block>>>(out, wh, x, n_in, n_out, nt);
            else kt_k_mm_f16<NT, false, true><<<grid, block>>>(out, wh, x, n_in, n_out, nt);
        } else {
            if (vec) kt_k_mm_f16<NT, true, false><<<grid, block>>>(out, wh, x, n_in, n_out, nt);
            else kt_k_mm_f16<NT, false, false><<<grid, block>>>(out, wh, x, n_in, n_out, nt);
        }
    }
}

int kt_cu_matmul(float *out, const void *w, int wtype, const float *x, int n_in, int n_out, int n_tokens) {
    if (n_tokens <= 1) kt_mm_launch<1>(out, w, wtype, x, n_in, n_out, n_tokens);
    else if (n_tokens <= 2) kt_mm_launch<2>(out, w, wtype, x, n_in, n_out, n_tokens);
    else if (n_tokens <= 4) kt_mm_launch<4>(out, w, wtype, x, n_in, n_out, n_tokens);
    else kt_mm_launch<8>(out, w, wtype, x, n_in, n_out, n_tokens);
    return (int)cudaGetLastError();
}
