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
