/*
 * probe_avx2.c - register- and bandwidth-bound loops for probe.c.
 */
#include "ops/probe_avx2.h"

#include <immintrin.h>

#include "ops/simd_avx2.h"

float kt_probe_read_avx2(const float *x, size_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < n; i += 32) {
        a0 = _mm256_add_ps(a0, _mm256_loadu_ps(x + i));
        a1 = _mm256_add_ps(a1, _mm256_loadu_ps(x + i + 8));
        a2 = _mm256_add_ps(a2, _mm256_loadu_ps(x + i + 16));
        a3 = _mm256_add_ps(a3, _mm256_loadu_ps(x + i + 24));
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

void kt_probe_triad_avx2(float *a, const float *b, const float *c, float s, size_t n) {
    const __m256 vs = _mm256_set1_ps(s);
    for (size_t i = 0; i < n; i += 8)
        _mm256_storeu_ps(a + i, _mm256_fmadd_ps(vs, _mm256_loadu_ps(c + i), _mm256_loadu_ps(b + i)));
}

float kt_probe_fma_avx2(long iters) {
    __m256 acc[KT_PROBE_CHAINS];
    const __m256 m = _mm256_set1_ps(0.999999f), k = _mm256_set1_ps(1e-7f);
    for (int c = 0; c < KT_PROBE_CHAINS; c++) acc[c] = _mm256_set1_ps((float)c);
    /* unrolled so the chains live in registers, not in memory */
    for (long i = 0; i < iters; i++) {
#pragma GCC unroll 16
        for (int c = 0; c < KT_PROBE_CHAINS; c++) acc[c] = _mm256_fmadd_ps(acc[c], m, k);
    }
    __m256 s = acc[0];
    for (int c = 1; c < KT_PROBE_CHAINS; c++) s = _mm256_add_ps(s, acc[c]);
    return _mm_cvtss_f32(_mm256_castps256_ps128(s));
}

int kt_probe_maddubs_avx2(long iters) {
    __m256i acc[KT_PROBE_CHAINS];
    const __m256i w = _mm256_set1_epi8(1);
    for (int c = 0; c < KT_PROBE_CHAINS; c++) acc[c] = _mm256_set1_epi8((char)c);
    /* each result (int16 pairs) feeds the next maddubs as bytes: a chain */
    for (long i = 0; i < iters; i++) {
#pragma GCC unroll 16
        for (int c = 0; c < KT_PROBE_CHAINS; c++) acc[c] = _mm256_maddubs_epi16(acc[c], w);
    }
    __m256i s = acc[0];
    for (int c = 1; c < KT_PROBE_CHAINS; c++) s = _mm256_xor_si256(s, acc[c]);
    return _mm_cvtsi128_si32(_mm256_castsi256_si128(s));
}


TARGET_512 float kt_probe_fma_512(long iters) {
    __m512 acc[KT_PROBE_CHAINS];
    const __m512 m = _mm512_set1_ps(0.999999f), k = _mm512_set1_ps(1e-7f);
    for (int c = 0; c < KT_PROBE_CHAINS; c++) acc[c] = _mm512_set1_ps((float)c);
    for (long i = 0; i < iters; i++) {
#pragma GCC unroll 16
        for (int c = 0; c < KT_PROBE_CHAINS; c++) acc[c] = _mm512_fmadd_ps(acc[c], m, k);
    }
    __m512 s = acc[0];
    for (int c = 1; c < KT_PROBE_CHAINS; c++) s = _mm512_add_ps(s, acc[c]);
    return _mm512_reduce_add_ps(s);
}

TARGET_512 int kt_probe_dpbusd_512(long iters) {
    __m512i acc[KT_PROBE_CHAINS];
    const __m512i u = _mm512_set1_epi8(1), w = _mm512_set1_epi8(-1);
    for (int c = 0; c < KT_PROBE_CHAINS; c++) acc[c] = _mm512_set1_epi32(c);
    /* 64 byte products (4 per int32 lane) added into each accumulator */
    for (long i = 0; i < iters; i++) {
#pragma GCC unroll 16
        for (int c = 0; c < KT_PROBE_CHAINS; c++) acc[c] = _mm512_dpbusd_epi32(acc[c], u, w);
    }
    __m512i s = acc[0];
    for (int c = 1; c < KT_PROBE_CHAINS; c++) s = _mm512_xor_si512(s, acc[c]);
    return _mm512_reduce_add_epi32(s);
}
