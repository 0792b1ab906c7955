/*
 * amx.c - the host side of the AMX GEMM (amx.h): packing the weights,
 * splitting the activations, and the scalar twin of the kernel in
 * matmul_amx.c. Plain C: it runs on every CPU.
 */
#include "ops/amx.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "base/fp16.h"
#include "ops/cpu.h"

#define TILE_VALUES 512 /* 16 rows x 32 bf16 */

static inline int n_pad32(int n_out) { return kt_amx_rows_pad(n_out); }

size_t kt_amx_packed_bytes(int n_in, int n_out) {
    return (size_t)n_pad32(n_out) * kt_amx_k_pad(n_in) * 2 * sizeof(uint16_t);
}

/* fp32 -> bf16, nearest even (NaN kept a NaN), inline and branch-free so
 * that the split loop vectorizes */
static inline uint16_t to_bf16(float v) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : rounded);
}

static inline float from_bf16(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* v = hi + lo, both bf16: exact when v has at most 16 significant bits
 * (an F16 value does) */
static inline void split1(float v, uint16_t *hi, uint16_t *lo) {
    *hi = to_bf16(v);
    *lo = to_bf16(v - from_bf16(*hi));
}

/* The packing of amx.h: value i of output o is w[o * ld_out + i * ld_in],
 * F16 or float (f16: a loop-invariant branch) */
static void pack(uint16_t *dst, const void *w, bool f16, int n_in, int n_out, size_t ld_out, size_t ld_in) {
    const int k_pad = kt_amx_k_pad(n_in), n_kb = k_pad / KT_AMX_K, n_nb = n_pad32(n_out) / 16;
    for (int nb = 0; nb < n_nb; nb++)
        for (int kb = 0; kb < n_kb; kb++) {
            uint16_t *hi = dst + ((size_t)nb * n_kb + kb) * 2 * TILE_VALUES, *lo = hi + TILE_VALUES;
            for (int n = 0; n < 16; n++) {
                const int row = 16 * nb + n;
                for (int i = 0; i < KT_AMX_K; i++) { /* value i of the block: tile row i / 2, pair half i % 2 */
                    const int col = KT_AMX_K * kb + i, at = (i / 2) * 32 + 2 * n + i % 2;
                    const size_t src = (size_t)row * ld_out + (size_t)col * ld_in;
                    const float v = row >= n_out || col >= n_in ? 0.0f
                                    : f16                       ? kt_fp16_to_fp32(((const uint16_t *)w)[src])
                                                                : ((const float *)w)[src];
                    split1(v, &hi[at], &lo[at]);
                }
            }
        }
}

void kt_amx_pack_f16(uint16_t *dst, const uint16_t *w, int n_in, int n_out) {
    pack(dst, w, true, n_in, n_out, (size_t)n_in, 1);
}

void kt_amx_pack_f32(uint16_t *dst, const float *w, int n_in, int n_out, size_t ld_out, size_t ld_in) {
    if (ld_out == 1 && kt_cpu_has_amx_bf16())
        kt_amx_pack_f32_avx512(dst, w, n_in, n_out, ld_in);
    else
        kt_amx_pack_f32_c(dst, w, n_in, n_out, ld_out, ld_in);
}

void kt_amx_pack_f32_c(uint16_t *dst, const float *w, int n_in, int n_out, size_t ld_out, size_t ld_in) {
    pack(dst, w, false, n_in, n_out, ld_out, ld_in);
}

size_t kt_amx_act_bytes(int n_in, int n_rows) {
    return (size_t)kt_amx_rows_pad(n_rows) * kt_amx_k_pad(n_in) * 2 * sizeof(uint16_t);
}

/* the tile (row tile mt, K block kb, hi or lo) of a split matrix */
static inline uint16_t *act_tile(uint16_t *a, int n_kb, int mt, int kb, int h) {
    return a + (((size_t)mt * n_kb + kb) * 2 + h) * TILE_VALUES;
}

void kt_amx_split_rows(uint16_t *a, const float *x, int n_in, int n_rows, int row0, int row1, bool round_f16) {
    if (kt_cpu_has_amx_bf16())
        kt_amx_split_rows_avx512(a, x, n_in, n_rows, row0, row1, round_f16);
    else
        kt_amx_split_rows_c(a, x, n_in, n_rows, row0, row1, round_f16);
}

void kt_amx_split_rows_c(uint16_t *a, const float *x, int n_in, int n_rows, int row0, int row1, bool round_f16) {
    const int n_kb = kt_amx_k_pad(n_in) / KT_AMX_K;
    for (int m = row0; m < row1; m++)
        for (int kb = 0; kb < n_kb; kb++) {
            uint16_t *hi = act_tile(a, n_kb, m / 16, kb, 0) + (m % 16) * KT_AMX_K;
            uint16_t *lo = act_tile(a, n_kb, m / 16, kb, 1) + (m % 16) * KT_AMX_K;
            const int c0 = kb * KT_AMX_K, n = m >= n_rows ? 0 : n_in - c0 < KT_AMX_K ? n_in - c0 : KT_AMX_K;
            const float *xr = x + (size_t)m * n_in + c0;
            int c = 0;
            for (; c < n; c++) split1(round_f16 ? kt_fp16_to_fp32(kt_fp32_to_fp16(xr[c])) : xr[c], &hi[c], &lo[c]);
            for (; c < KT_AMX_K; c++) hi[c] = lo[c] = 0;
        }
}

/* sum over one K block of a . b (pairs as TDPBF16PS reads them), as an fma chain */
static float block_dot(float acc, const uint16_t *a, const uint16_t *b_tile, int n) {
    for (int r = 0; r < 16; r++)
        for (int e = 0; e < 2; e++)
            acc = fmaf(from_bf16(a[2 * r + e]), from_bf16(b_tile[r * 32 + 2 * n + e]), acc);
    return acc;
}

void kt_amx_matmul_ref(float *out, const uint16_t *w, const uint16_t *a, int n_in, int n_out, int n_rows, int row0,
                       int row1) {
    const int n_kb = kt_amx_k_pad(n_in) / KT_AMX_K;
    for (int m = row0; m < row1 && m < n_rows; m++)
        for (int o = 0; o < n_out; o++) {
            const uint16_t *col = w + (size_t)(o / 16) * n_kb * 2 * TILE_VALUES;
            float acc = 0.0f;
            for (int kb = 0; kb < n_kb; kb++) {
                const uint16_t *bh = col + (size_t)kb * 2 * TILE_VALUES, *bl = bh + TILE_VALUES;
                const uint16_t *ah = act_tile((uint16_t *)a, n_kb, m / 16, kb, 0) + (m % 16) * KT_AMX_K;
                const uint16_t *al = act_tile((uint16_t *)a, n_kb, m / 16, kb, 1) + (m % 16) * KT_AMX_K;
                acc = block_dot(acc, ah, bh, o % 16);
                acc = block_dot(acc, ah, bl, o % 16);
                acc = block_dot(acc, al, bh, o % 16);
            }
            out[(size_t)m * n_out + o] = acc;
        }
}
