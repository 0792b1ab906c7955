/*
 * vit_simd.h - the vision tower's element-wise kernels that have an AVX2
 * twin (vit_avx2.c): their scalar forms, inline so both files share them,
 * and the AVX2 entry points. vit_ops.c dispatches (kt_cpu_has_avx2).
 */
#ifndef KT_VISION_VIT_SIMD_H
#define KT_VISION_VIT_SIMD_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "base/fp16.h"

/* exp(x) for x <= 0 as ggml's CPU softmax computes it (ggml_v_expf, its
 * AVX2 exp, 1-2 ulp): the input clamped to -87 so that only its fast path
 * is needed (exp(-87) = 1.6e-38; a softmax sums at least 1, so below that
 * nothing changes but denormals) */
#define VT_EXP_MIN -87.0f
static inline float vt_expf_neg(float x) {
    x = x > VT_EXP_MIN ? x : VT_EXP_MIN; /* _mm256_max_ps(x, min): NaN gives the min as well */
    const float r = 0x1.8p23f;
    const float z = fmaf(x, 0x1.715476p+0f, r), n = z - r;
    const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
    uint32_t zi, ki;
    memcpy(&zi, &z, 4);
    ki = (zi << 23) + 0x3f800000u;
    float k;
    memcpy(&k, &ki, 4);
    const float u = b * b;
    const float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)), u,
                         0x1.ffffecp-1f * b);
    return fmaf(j, k, k);
}

static inline float vt_round_f16_1(float x) { return kt_fp16_to_fp32(kt_fp32_to_fp16(x)); }

/* table[fp16(x)], GELU's +-10 clamp when asked (ggml_vec_gelu_f32) */
static inline float vt_act_table1(const float *table, bool clamp10, float x) {
    if (clamp10 && x <= -10.0f) return 0.0f;
    if (clamp10 && x >= 10.0f) return x;
    return table[kt_fp32_to_fp16(x)];
}

/* softmax of the scores s[0 .. n) times scale, in place but not
 * normalized, s[n .. n_pad) set to 0; returns the factor that normalizes
 * it, (float)(1 / sum), which the caller applies to P V's output rows (d
 * values, not n). ms = max(s) * scale (the max of the scaled scores: a
 * positive scale keeps the order); e = vt_expf_neg(fma(s, scale, -ms));
 * the sum in double in 8 lanes (lane k: the e of j = k mod 8 below
 * n & ~7; then the lanes in order, then the tail in order). */
float vt_softmax_row_avx2(float *s, int n, int n_pad, float scale);
/* The same softmax with its values written split for the AMX tiles
 * (ops/amx.h) instead of in place: value j as bf16 hi + lo into one row of
 * a split matrix, whose K blocks of 32 are VT_SPLIT_BLOCK uint16s apart
 * (hi, then lo VT_SPLIT_LO further), zeros up to k_pad; s is only read.
 * The values are vt_softmax_row's, split (as kt_amx_split_rows_c splits,
 * but for vt_bf16_daz's subnormals);
 * the factor sums them in another order (vt_softmax_split_row_c says
 * which). dst: the row's place in block 0's hi tile. */
#define VT_SPLIT_BLOCK 1024
#define VT_SPLIT_LO 512
#define VT_SPLIT_AT(j) ((size_t)((j) / 32) * VT_SPLIT_BLOCK + (size_t)((j) % 32))
/* fp32 -> bf16 as AVX512-BF16's VCVTNEPS2BF16 converts: nearest even, a
 * NaN quieted, a subnormal to a zero of its sign (the AVX-512 twin uses
 * the instruction; only a value below 2^-117, whose lo is subnormal,
 * splits otherwise than kt_fp32_to_bf16 would split it) */
static inline uint16_t vt_bf16_daz(float x) {
    return kt_fp32_to_bf16(x != 0.0f && fabsf(x) < 0x1p-126f ? copysignf(0.0f, x) : x);
}
static inline void vt_split_store(uint16_t *dst, int j, float e) {
    const uint16_t h = vt_bf16_daz(e);
    dst[VT_SPLIT_AT(j)] = h;
    dst[VT_SPLIT_AT(j) + VT_SPLIT_LO] = vt_bf16_daz(e - kt_bf16_to_fp32(h));
}
float vt_softmax_split_row_avx2(const float *s, int n, float scale, uint16_t *dst, int k_pad);
/* AVX-512F + AVX512-BF16 (every AMX-BF16 CPU has both; kt_cpu_has_amx_bf16 checks) */
float vt_softmax_split_row_avx512(const float *s, int n, float scale, uint16_t *dst, int k_pad);
/* x[i] = table1(x[i]) (* up[i] when up is given) */
void vt_act_table_avx2(const float *table, bool clamp10, float *x, const float *up, long n);
void vt_round_f16_avx2(float *y, const float *x, long n);

#endif
