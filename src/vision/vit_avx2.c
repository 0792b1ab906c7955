/*
 * vit_avx2.c - AVX2 twins of the vision tower's element-wise kernels
 * (vit_ops.c has the scalar ones and says what each computes). Compiled
 * with -mavx2 -mfma -mf16c, called only when kt_cpu_has_avx2(). Each gives
 * its scalar twin's bits (test_vit_ops checks): the same operations in the
 * same order, lane k of a vector doing what the twin does for element
 * i = k mod 8.
 */
#include <immintrin.h>
#include <stdint.h>

#include "vision/vit_simd.h"

/* vt_expf_neg on 8 lanes (ggml_v_expf's fast path, input clamped) */
static inline __m256 expf_neg8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(VT_EXP_MIN));
    const __m256 r = _mm256_set1_ps(0x1.8p23f);
    const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), r);
    const __m256 n = _mm256_sub_ps(z, r);
    const __m256 b =
        _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f), _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
    const __m256 k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1))));
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
                        _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
        u, _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
    return _mm256_fmadd_ps(j, k, k);
}

float vt_softmax_row_avx2(float *s, int n, int n_pad, float scale) {
    const int n8 = n & ~7;
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    for (int j = 0; j < n8; j += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(s + j));
    float lanes[8], mx = -INFINITY;
    _mm256_storeu_ps(lanes, vmax);
    for (int k = 0; k < 8; k++) mx = lanes[k] > mx ? lanes[k] : mx;
    for (int j = n8; j < n; j++) mx = s[j] > mx ? s[j] : mx;
    const float ms = mx * scale;
    const __m256 vs = _mm256_set1_ps(scale), vm = _mm256_set1_ps(-ms);
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
    for (int j = 0; j < n8; j += 8) {
        __m256 e = expf_neg8(_mm256_fmadd_ps(_mm256_loadu_ps(s + j), vs, vm));
        _mm256_storeu_ps(s + j, e);
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    double dl[8];
    _mm256_storeu_pd(dl, lo);
    _mm256_storeu_pd(dl + 4, hi);
    double sum = 0;
    for (int k = 0; k < 8; k++) sum += dl[k];
    for (int j = n8; j < n; j++) {
        s[j] = vt_expf_neg(fmaf(s[j], scale, -ms));
        sum += s[j];
    }
    for (int j = n; j < n_pad; j++) s[j] = 0.0f;
    return (float)(1.0 / sum);
}

/* vt_bf16_daz on 8 lanes, packed to 8 uint16 */
static inline __m128i to_bf16_8(__m256 v) {
    const __m256i sub = _mm256_and_si256(
        _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7f800000)), _mm256_setzero_si256()),
        _mm256_set1_epi32(0x7fffffff)); /* subnormals (and zeros): keep only the sign */
    const __m256i u = _mm256_andnot_si256(sub, _mm256_castps_si256(v));
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)),
                         _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1))),
        16);
    const __m256i nan =
        _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
    const __m256i h = _mm256_blendv_epi8(rounded, _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(64)), nan);
    const __m256i packed = _mm256_packus_epi32(h, h); /* per 128-bit half: 4 values, twice */
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08)); /* halves' first 4 values, in order */
}

float vt_softmax_split_row_avx2(const float *s, int n, float scale, uint16_t *dst, int k_pad) {
    const int n8 = n & ~7, n16 = n & ~15;
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    for (int j = 0; j < n8; j += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(s + j));
    float lanes[8], mx = -INFINITY;
    _mm256_storeu_ps(lanes, vmax);
    for (int k = 0; k < 8; k++) mx = lanes[k] > mx ? lanes[k] : mx; /* a max is exact in any order */
    for (int j = n8; j < n; j++) mx = s[j] > mx ? s[j] : mx;
    const float ms = mx * scale;
    const __m256 vs = _mm256_set1_ps(scale), vm = _mm256_set1_ps(-ms);
    __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
    for (int j = 0; j < n16; j += 8) { /* acc[2h], acc[2h + 1]: lanes 8h .. 8h + 7 of vt_softmax_split_row_c */
        const __m256 e = expf_neg8(_mm256_fmadd_ps(_mm256_loadu_ps(s + j), vs, vm));
        const int h = (j / 8) % 2;
        acc[2 * h] = _mm256_add_pd(acc[2 * h], _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        acc[2 * h + 1] = _mm256_add_pd(acc[2 * h + 1], _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
        const __m128i eh = to_bf16_8(e);
        const __m256 rest = _mm256_sub_ps(e, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(eh), 16)));
        uint16_t *at = dst + VT_SPLIT_AT(j);
        _mm_storeu_si128((__m128i *)at, eh);
        _mm_storeu_si128((__m128i *)(at + VT_SPLIT_LO), to_bf16_8(rest));
    }
    double dl[16];
    for (int q = 0; q < 4; q++) _mm256_storeu_pd(dl + 4 * q, acc[q]);
    double sum = 0;
    for (int k = 0; k < 16; k++) sum += dl[k];
    for (int j = n16; j < n; j++) {
        const float e = vt_expf_neg(fmaf(s[j], scale, -ms));
        sum += e;
        vt_split_store(dst, j, e);
    }
    for (int j = n; j < k_pad; j++) dst[VT_SPLIT_AT(j)] = dst[VT_SPLIT_AT(j) + VT_SPLIT_LO] = 0;
    return (float)(1.0 / sum);
}

/* The same on 16 lanes (AVX-512F and AVX512-BF16, which every AMX CPU
 * has): the exp's steps as expf_neg8's, the split by VCVTNEPS2BF16 (what
 * vt_bf16_daz computes), the sums' lanes as the twins' (two accumulators
 * of 8 doubles). */
#define TARGET_512F __attribute__((target("avx2,fma,f16c,avx512f,avx512bf16")))

TARGET_512F static inline __m512 expf_neg16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(VT_EXP_MIN));
    const __m512 r = _mm512_set1_ps(0x1.8p23f);
    const __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), r);
    const __m512 n = _mm512_sub_ps(z, r);
    const __m512 b =
        _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.7f7d1cp-20f), _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e4p-1f), x));
    const __m512i e = _mm512_slli_epi32(_mm512_castps_si512(z), 23);
    const __m512 k = _mm512_castsi512_ps(_mm512_add_epi32(e, _mm512_castps_si512(_mm512_set1_ps(1))));
    const __m512 u = _mm512_mul_ps(b, b);
    const __m512 j = _mm512_fmadd_ps(
        _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), b, _mm512_set1_ps(0x1.573e2ep-5f)), u,
                        _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b, _mm512_set1_ps(0x1.fffdb6p-2f))),
        u, _mm512_mul_ps(_mm512_set1_ps(0x1.ffffecp-1f), b));
    return _mm512_fmadd_ps(j, k, k);
}

TARGET_512F float vt_softmax_split_row_avx512(const float *s, int n, float scale, uint16_t *dst, int k_pad) {
    const int n16 = n & ~15;
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    for (int j = 0; j < n16; j += 16) vmax = _mm512_max_ps(vmax, _mm512_loadu_ps(s + j));
    float mx = _mm512_reduce_max_ps(vmax);
    for (int j = n16; j < n; j++) mx = s[j] > mx ? s[j] : mx;
    const float ms = mx * scale;
    const __m512 vs = _mm512_set1_ps(scale), vm = _mm512_set1_ps(-ms);
    __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
    for (int j = 0; j < n16; j += 16) {
        const __m512 e = expf_neg16(_mm512_fmadd_ps(_mm512_loadu_ps(s + j), vs, vm));
        lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        hi = _mm512_add_pd(hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
        const __m256i eh = (__m256i)_mm512_cvtneps_pbh(e);
        const __m512 rest = _mm512_sub_ps(e, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(eh), 16)));
        uint16_t *at = dst + VT_SPLIT_AT(j);
        _mm256_storeu_si256((__m256i *)at, eh);
        _mm256_storeu_si256((__m256i *)(at + VT_SPLIT_LO), (__m256i)_mm512_cvtneps_pbh(rest));
    }
    double dl[16];
    _mm512_storeu_pd(dl, lo);
    _mm512_storeu_pd(dl + 8, hi);
    double sum = 0;
    for (int k = 0; k < 16; k++) sum += dl[k];
    for (int j = n16; j < n; j++) {
        const float e = vt_expf_neg(fmaf(s[j], scale, -ms));
        sum += e;
        vt_split_store(dst, j, e);
    }
    for (int j = n; j < k_pad; j++) dst[VT_SPLIT_AT(j)] = dst[VT_SPLIT_AT(j) + VT_SPLIT_LO] = 0;
    return (float)(1.0 / sum);
}

/* table[fp16(x)] for 8 values: F16C rounds to nearest even, as
 * kt_fp32_to_fp16 does */
static inline __m256 lookup8(const float *table, __m256 x) {
    __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm256_i32gather_ps(table, _mm256_cvtepu16_epi32(h), 4);
}

void vt_act_table_avx2(const float *table, bool clamp10, float *x, const float *up, long n) {
    long i = 0;
    const __m256 lo = _mm256_set1_ps(-10.0f), hi = _mm256_set1_ps(10.0f);
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i), y = lookup8(table, v);
        if (clamp10) {
            y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(v, lo, _CMP_LE_OQ));
            y = _mm256_blendv_ps(y, v, _mm256_cmp_ps(v, hi, _CMP_GE_OQ));
        }
        if (up) y = _mm256_mul_ps(y, _mm256_loadu_ps(up + i));
        _mm256_storeu_ps(x + i, y);
    }
    for (; i < n; i++) {
        float y = vt_act_table1(table, clamp10, x[i]);
        x[i] = up ? y * up[i] : y;
    }
}

void vt_round_f16_avx2(float *y, const float *x, long n) {
    long i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(h));
    }
    for (; i < n; i++) y[i] = vt_round_f16_1(x[i]);
}
