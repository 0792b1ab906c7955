/*
 * cu_attn.cu - decode attention over kettle's paged KV: each query token
 * attends positions [0, n_pos) of its sequence through the sequence's
 * block table (kt_cuda_attn_meta: blocks | off | n_pos | pos, one int32
 * array), reading F16 K and V rows where kv/block_pool.h puts them:
 * plane + block * block_bytes + (p % block_tokens) * row_bytes, KV head
 * kvh's head_dim values from kvh * head_dim. Shared prefix blocks are
 * just the same ids in two tables.
 *
 * One thread block per (token, KV head), 4 warps; the group of query
 * heads that share the KV head is done together, so each K / V row is
 * read once for all of them. Warp w takes positions w, w + 4, ...; a lane
 * holds head_dim / 32 consecutive dims (2, 4 or 8 halves: one 4-, 8- or
 * 16-byte load, coalesced across the warp). Scores are (q . k) / sqrt(D)
 * with an online softmax per warp (running max, sum, weighted V), the 4
 * warps merged in shared memory at the end. The twin is kt_attention_ref
 * (src/ops/ops.c, kv_type F16): the same scores and weights, summed in
 * another order.
 * Not yet: split-K over long contexts (one block per (token, KV head) is
 * too few blocks for a small batch), windows, soft-caps, sinks, prefill.
 */
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "cuda/cuda_launch.h"

#define KT_ATT_WARPS 4
#define KT_ATT_GMAX 8 /* query heads per KV head */

template <int DPL>
__device__ __forceinline__ void kt_load_halves(const __half *p, float *f) {
    if constexpr (DPL == 8) {
        const uint4 r = *reinterpret_cast<const uint4 *>(p);
        const __half2 *h = reinterpret_cast<const __half2 *>(&r);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float2 v = __half22float2(h[j]);
            f[2 * j] = v.x;
            f[2 * j + 1] = v.y;
        }
    } else if constexpr (DPL == 4) {
        const uint2 r = *reinterpret_cast<const uint2 *>(p);
        const __half2 *h = reinterpret_cast<const __half2 *>(&r);
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const float2 v = __half22float2(h[j]);
            f[2 * j] = v.x;
            f[2 * j + 1] = v.y;
        }
    } else {
        const float2 v = __half22float2(*reinterpret_cast<const __half2 *>(p));
        f[0] = v.x;
        f[1] = v.y;
    }
}

template <int DPL>
__global__ void __launch_bounds__(KT_ATT_WARPS * 32)
    kt_k_attn_decode(float *out, const float *q, const uint8_t *kp, const uint8_t *vp, const int32_t *meta,
                     int n_tokens, int n_entries, int n_head, int n_head_kv, int block_tokens, size_t q_stride,
                     size_t out_stride, size_t row_bytes, size_t block_bytes) {
    constexpr int D = DPL * 32;
    __shared__ float sm_m[KT_ATT_WARPS][KT_ATT_GMAX], sm_l[KT_ATT_WARPS][KT_ATT_GMAX];
    __shared__ float sm_o[KT_ATT_WARPS][KT_ATT_GMAX][D];
    const int t = blockIdx.x, kvh = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int G = n_head / n_head_kv;
    const int32_t *blocks = meta + meta[n_entries + t];
    const int n_pos = meta[n_entries + n_tokens + t];
    const float scale = 1.0f / sqrtf((float)D);

    float qr[KT_ATT_GMAX][DPL], acc[KT_ATT_GMAX][DPL], m[KT_ATT_GMAX], l[KT_ATT_GMAX];
    const float *qt = q + (size_t)t * q_stride + (size_t)kvh * G * D + lane * DPL;
#pragma unroll
    for (int g = 0; g < KT_ATT_GMAX; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int d = 0; d < DPL; d++) {
            qr[g][d] = g < G ? qt[(size_t)g * D + d] : 0.0f;
            acc[g][d] = 0.0f;
        }
    }
    const size_t head_off = (size_t)kvh * D + lane * DPL; /* halves into a row */
    for (int p = warp; p < n_pos; p += KT_ATT_WARPS) {
        const size_t at = (size_t)blocks[p / block_tokens] * block_bytes + (size_t)(p % block_tokens) * row_bytes;
        float kf[DPL], vf[DPL];
        kt_load_halves<DPL>(reinterpret_cast<const __half *>(kp + at) + head_off, kf);
        kt_load_halves<DPL>(reinterpret_cast<const __half *>(vp + at) + head_off, vf);
#pragma unroll
        for (int g = 0; g < KT_ATT_GMAX; g++) {
            if (g >= G) break;
            float s = 0.0f;
#pragma unroll
            for (int d = 0; d < DPL; d++) s += qr[g][d] * kf[d];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            s *= scale;
            const float mn = fmaxf(m[g], s);
            const float c = expf(m[g] - mn), e = expf(s - mn);
            l[g] = l[g] * c + e;
#pragma unroll
            for (int d = 0; d < DPL; d++) acc[g][d] = acc[g][d] * c + e * vf[d];
            m[g] = mn;
        }
    }
#pragma unroll
    for (int g = 0; g < KT_ATT_GMAX; g++) {
        if (g >= G) break;
        if (lane == 0) {
            sm_m[warp][g] = m[g];
            sm_l[warp][g] = l[g];
        }
#pragma unroll
        for (int d = 0; d < DPL; d++) sm_o[warp][g][lane * DPL + d] = acc[g][d];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < G * D; i += blockDim.x) {
        const int g = i / D, d = i % D;
        float mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < KT_ATT_WARPS; w++) mx = fmaxf(mx, sm_m[w][g]);
        float sum = 0.0f, o = 0.0f;
#pragma unroll
        for (int w = 0; w < KT_ATT_WARPS; w++) {
            /* a warp that saw no position has m = -inf, l = 0: weight 0 */
            const float c = sm_l[w][g] > 0.0f ? expf(sm_m[w][g] - mx) : 0.0f;
            sum += sm_l[w][g] * c;
            o += sm_o[w][g][d] * c;
        }
        out[(size_t)t * out_stride + (size_t)(kvh * G + g) * D + d] = o / sum;
    }
}

int kt_cu_attn_decode(float *out, const float *q, const void *k_plane, const void *v_plane, const int32_t *meta,
                      int n_tokens, int n_entries, int n_head, int n_head_kv, int head_dim, int block_tokens,
                      size_t q_stride, size_t out_stride, size_t row_bytes, size_t block_bytes) {
    const dim3 grid((unsigned)n_tokens, (unsigned)n_head_kv), block(KT_ATT_WARPS * 32);
    const uint8_t *kp = static_cast<const uint8_t *>(k_plane), *vp = static_cast<const uint8_t *>(v_plane);
#define KT_ATT_ARGS out, q, kp, vp, meta, n_tokens, n_entries, n_head, n_head_kv, block_tokens, q_stride, out_stride, \
                    row_bytes, block_bytes
    if (head_dim == 64) kt_k_attn_decode<2><<<grid, block>>>(KT_ATT_ARGS);
    else if (head_dim == 128) kt_k_attn_decode<4><<<grid, block>>>(KT_ATT_ARGS);
    else kt_k_attn_decode<8><<<grid, block>>>(KT_ATT_ARGS);
#undef KT_ATT_ARGS
    return (int)cudaGetLastError();
}
