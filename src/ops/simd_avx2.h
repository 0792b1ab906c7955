/*
 * simd_avx2.h - small AVX2 building blocks shared by the *_avx2.c kernel
 * files (each compiled with -mavx2 -mfma -mf16c; never include this from
 * a file that is not). One copy of each, so the kernels that rely on the
 * same lane order (horizontal sums, panel transposes) agree by
 * construction.
 */
#ifndef KT_OPS_SIMD_AVX2_H
#define KT_OPS_SIMD_AVX2_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define INL static inline __attribute__((always_inline))

/* The AVX-512 tier's target: exactly the features kt_cpu_has_avx512_vnni()
 * checks (cpu.h), so a function with it runs only where that said yes,
 * and the compiler may use any of them (EVEX forms of 256-bit ops and
 * their memory broadcasts included). */
#define TARGET_512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

/* Lanes 0..7 summed in a fixed order: (lo + hi) halves, then pairs. */
INL float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 8 x 8 transpose of 32-bit elements: v[q] lane r = old v[r] lane q. */
INL void transpose8_epi32(__m256i *v) {
    __m256i t[8], u[8];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
    }
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++) {
        u[4 * i + 0] = _mm256_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
        u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
        u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x20);
        v[i + 4] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x31);
    }
}

/* The 16 bits at p (an fp16), unaligned. */
INL uint64_t half_bits(const void *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return h;
}

/* The fp16 at byte offset off of block b (blocks of bb bytes) of 8 rows,
 * as 8 floats: gathered with integer loads, one vcvtph2ps. */
INL __m256 halves8(const char *const *rows, size_t bb, size_t off, int b) {
    uint64_t lo = 0, hi = 0;
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
        lo |= half_bits(rows[r] + (size_t)b * bb + off) << (16 * r);
        hi |= half_bits(rows[r + 4] + (size_t)b * bb + off) << (16 * r);
    }
    return _mm256_cvtph_ps(_mm_set_epi64x((long long)hi, (long long)lo));
}

/* 8 E8M0 bytes (byte r of e8: row r) as kt_e8m0_half's floats, 2^(e-128):
 * the bits (e - 1) << 23, or for e < 2 the subnormal 0x00200000 << e. */
INL __m256 e8m0_half8(uint64_t e8) {
    const __m256i e = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)e8));
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    const __m256i small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, sub, small));
}

/* Byte off of block b (bb bytes a block) of 8 rows, as e8m0_half8 wants. */
INL uint64_t bytes8(const char *const *rows, size_t bb, size_t off, int b) {
    uint64_t v = 0;
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++) v |= (uint64_t)(uint8_t)rows[r][(size_t)b * bb + off] << (8 * r);
    return v;
}

#endif
