/*
 * matmul_k_avx2.c - AVX2 matmul kernels for K-quant weights (Q4_K, Q5_K,
 * Q6_K) times Q8_K activations. The specification and scalar twin is
 * kt_kq_block_step (matmul_k.c, internal.h); these kernels form the same
 * exact integer sums with maddubs/madd and apply the same two fmaf steps
 * per block in the same block order, so they equal the reference bit for
 * bit, whatever the number of tokens or the thread split (batch
 * invariance: each output is one accumulator running over its row).
 *
 * Decode (one token, kq_gemv): rows one after another, the matrix
 * streamed once; each block prefetches the block PF_BYTES ahead. Per
 * weight block the 256 levels are unpacked into 8 vectors of 32 unsigned
 * bytes (vector j = values 32j .. 32j+31) with, for each, an int16
 * multiplier vector (the sub-block scale; Q6_K: two scales, one per
 * 128-bit half, since its scales cover 16 values), and
 *   isum = hsum( sum_j madd(maddubs(q_j, x_j), scale_j) )
 * maddubs pairs stay below 2 * 63 * 128 = 16128, so int16 never
 * saturates. Q6_K's levels are q + 32: the offset is taken off with the
 * activation's bsums, isum -= 32 * sum_g sc[g] * bsums[g]. Q4_K/Q5_K's
 * mins term imin = sum_j m[j] * (bsums[2j] + bsums[2j+1]) is one madd
 * (bsums against the mins, each repeated twice), reduced together with
 * isum. Scales are decoded with 32-bit masks and broadcast per vector with
 * byte shuffles.
 *
 * Prefill (2 or more tokens): a register-tiled GEMM like the Q4_0 one
 * (matmul_avx2.c). Unpacking a block per row and reducing every (row,
 * token, block) sum horizontally cost about as much as the products; so
 * instead 8 rows' blocks are unpacked once into a panel, transposed so
 * that int32 lane r belongs to row r (vector v: values 4v .. 4v+3 of each
 * row), with the scales as per-lane (s, s) int16 pairs. One broadcast of 4
 * activation bytes against a panel vector gives all 8 rows their partial
 * sums; a tile of 8 rows x 4 tokens loads each panel vector once for 4
 * tokens and each activation broadcast once for 8 rows, and nothing is
 * reduced across lanes. maddubs pairs are summed in int16 for as long as
 * they cannot overflow (8 for Q4_K, 4 for Q5_K, 2 for Q6_K), then one madd
 * by the scale widens and scales them. The per-block float steps are the
 * reference's, one lane per row (vector fma = fmaf). The panel covers
 * KQ_KBLOCKS blocks (11.5 KB, in L1); the 8 rows' accumulators for a
 * chunk of KQ_CHUNK tokens live in a stack buffer between panels, so each
 * output still runs over its blocks in order in one float accumulator.
 */
#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/fp16.h"
#include "ops/cpu.h"
#include "ops/internal.h"
#include "ops/kquant.h"
#include "ops/repack.h"
#include "ops/simd_avx2.h"


#define PF_BYTES 1024 /* decode prefetch distance in the stream */
#define KQ_ROWS 8      /* rows per panel: one per int32 lane */
#define KQ_TOKENS 4    /* tokens per register tile */
#define KQ_KBLOCKS 4   /* weight blocks per panel: 11.5 KB, stays in L1 */
#define KQ_CHUNK 256   /* tokens per pass: 256 KB of activations per panel */
#define KQ_MIN_GEMM 2  /* fewer tokens: one GEMV per token */

typedef struct kq_block {
    __m256i q[8];  /* levels of values 32j .. 32j+31 (IQ4_XS: the table's
                      signed values) */
    __m256i sc[8]; /* int16 multipliers of vector j */
    __m256i sc16;  /* Q6_K, Q3_K: the 16 scales as int16, for the offset;
                      Q2_K: the 16 mins */
    __m256i m2;    /* Q4_K/Q5_K: int16 lanes m[0], m[0], m[1], m[1], ... */
    float d, dmin;
} kq_block;

/* vpdpbusd (AVX-VNNI, VEX-encoded) as inline assembly: the tiles are one
 * body for the AVX2 and the VNNI tier (a constant flag picks the
 * instructions), and an intrinsic would need the VNNI target on the AVX2
 * instance too, where this branch is dead and removed. Only executed
 * where kt_cpu_has_avx_vnni(). */
INL __m256i vnni_dot(__m256i acc, __m256i q, __m256i x) {
    __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(q), "x"(x));
    return acc;
}

/* vpdpbusd (AVX-512 VNNI + VL, EVEX-encoded) of q with the 4 bytes at x4
 * broadcast from memory: the broadcast costs no instruction of its own.
 * Only in TARGET_512 functions. */
INL __m256i vnni_dot_bcast(__m256i acc, __m256i q, const int8_t *x4) {
    __asm__("vpdpbusd %2%{1to8%}, %1, %0" : "+v"(acc) : "v"(q), "m"(*(const int32_t *)x4));
    return acc;
}

/* acc + the int32 sums of q * x over each lane's 4 bytes: vpdpbusd, or
 * maddubs widened at once (for levels whose pairs may not be summed in
 * int16). */
INL __m256i dot_i32(const bool vnni, __m256i acc, __m256i q, __m256i x) {
    if (vnni) return vnni_dot(acc, q, x);
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(q, x), _mm256_set1_epi16(1)));
}

INL int32_t hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

INL float half_at(const uint16_t *p) {
    return _cvtsh_ss(*p);
}

/* int16 lane k of a 128-bit vector broadcast to every int16 lane of the
 * low half, lane k2 to every lane of the high half (v holds the vector in
 * both halves). */
INL __m256i pick16(__m256i v, int k, int k2) {
    const __m256i idx = _mm256_set_m128i(_mm_set1_epi16((short)((2 * k2) | (2 * k2 + 1) << 8)),
                                         _mm_set1_epi16((short)((2 * k) | (2 * k + 1) << 8)));
    return _mm256_shuffle_epi8(v, idx);
}

/* The 6-bit scales and mins of a Q4_K/Q5_K block as 16 bytes sc[0..7],
 * m[0..7] (kt_kq_scale_min on 32-bit words: u0, u1, u2 = bytes 0-3, 4-7,
 * 8-11):
 *   sc[0..3] = u0 & 63            m[0..3] = u1 & 63
 *   sc[4..7] = (u2 & 15) | (u0 >> 6) << 4
 *   m[4..7]  = (u2 >> 4 & 15) | (u1 >> 6) << 4      (per byte) */
INL __m128i scale_min_bytes(const uint8_t *q) {
    uint32_t u0, u1, u2;
    memcpy(&u0, q, 4);
    memcpy(&u1, q + 4, 4);
    memcpy(&u2, q + 8, 4);
    const uint32_t sc_lo = u0 & 0x3f3f3f3f, m_lo = u1 & 0x3f3f3f3f;
    const uint32_t sc_hi = (u2 & 0x0f0f0f0f) | (((u0 >> 6) & 0x03030303) << 4);
    const uint32_t m_hi = ((u2 >> 4) & 0x0f0f0f0f) | (((u1 >> 6) & 0x03030303) << 4);
    return _mm_setr_epi32((int)sc_lo, (int)sc_hi, (int)m_lo, (int)m_hi);
}

/* The scales and mins as kq_block's multiplier vectors. */
INL void unpack_scales(const uint8_t *q, kq_block *u) {
    const __m128i b = scale_min_bytes(q);
    const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(b));
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) u->sc[j] = pick16(sc, j, j);
    const __m128i m = _mm_cvtepu8_epi16(_mm_srli_si128(b, 8));
    u->m2 = _mm256_set_m128i(_mm_unpackhi_epi16(m, m), _mm_unpacklo_epi16(m, m));
}

/* Levels of a block: q[j] = values 32j .. 32j+31 as unsigned bytes. */
INL void levels_q4_K(const block_q4_K *blk, __m256i *lv) {
    const __m256i low = _mm256_set1_epi8(0x0F);
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(blk->qs + 32 * k));
        lv[2 * k] = _mm256_and_si256(q, low);
        lv[2 * k + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
    }
}

INL void unpack_q4_K(const block_q4_K *blk, kq_block *u) {
    levels_q4_K(blk, u->q);
    unpack_scales(blk->scales, u);
    u->d = half_at(&blk->d);
    u->dmin = half_at(&blk->dmin);
}

/* Q5_K: bit 2k of qh[l] is the fifth bit of value 64k + l, bit 2k+1 that
 * of value 64k + 32 + l; shifted down to bit 0, masked, moved to bit 4. */
INL void levels_q5_K(const block_q5_K *blk, __m256i *lv) {
    const __m256i low = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    const __m256i qh = _mm256_loadu_si256((const __m256i *)blk->qh);
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(blk->qs + 32 * k));
        const __m256i h0 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * k)), one);
        const __m256i h1 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * k + 1)), one);
        lv[2 * k] = _mm256_or_si256(_mm256_and_si256(q, low), _mm256_slli_epi16(h0, 4));
        lv[2 * k + 1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), low),
                                        _mm256_slli_epi16(h1, 4));
    }
}

INL void unpack_q5_K(const block_q5_K *blk, kq_block *u) {
    levels_q5_K(blk, u->q);
    unpack_scales(blk->scales, u);
    u->d = half_at(&blk->d);
    u->dmin = half_at(&blk->dmin);
}

/* Q6_K: per half h, vector 4h+k holds values 128h + 32k .. +31: low bits
 * from ql (low nibbles of ql[0..31] for k = 0, of ql[32..63] for k = 1,
 * high nibbles for k = 2, 3), high bits from qh bits 2k, 2k+1 (moved to
 * bits 4, 5; the 16-bit shifts only move a byte's own bits into 4-5). */
INL void levels_q6_K(const block_q6_K *blk, __m256i *lv) {
    const __m256i low = _mm256_set1_epi8(0x0F), hi2 = _mm256_set1_epi8(0x30);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m256i qa = _mm256_loadu_si256((const __m256i *)(blk->ql + 64 * h));
        const __m256i qb = _mm256_loadu_si256((const __m256i *)(blk->ql + 64 * h + 32));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk->qh + 32 * h));
        lv[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(qa, low),
                                        _mm256_and_si256(_mm256_slli_epi16(qh, 4), hi2));
        lv[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(qb, low),
                                        _mm256_and_si256(_mm256_slli_epi16(qh, 2), hi2));
        lv[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qa, 4), low),
                                        _mm256_and_si256(qh, hi2));
        lv[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qb, 4), low),
                                        _mm256_and_si256(_mm256_srli_epi16(qh, 2), hi2));
    }
}

INL void unpack_q6_K(const block_q6_K *blk, kq_block *u) {
    levels_q6_K(blk, u->q);
    const __m128i s8 = _mm_loadu_si128((const __m128i *)blk->scales);
    u->sc16 = _mm256_cvtepi8_epi16(s8);
    /* vector j: scale 2j in its low 128 bits, 2j+1 in its high ones */
    const __m256i lo = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(u->sc16));
    const __m256i hi = _mm256_broadcastsi128_si256(_mm256_extracti128_si256(u->sc16, 1));
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        u->sc[j] = pick16(lo, 2 * j, 2 * j + 1);
        u->sc[j + 4] = pick16(hi, 2 * j, 2 * j + 1);
    }
    u->d = half_at(&blk->d);
}

/* 16 int16 scales (one per 16 values) as kq_block's multipliers: vector
 * j takes scale 2j in its low 128 bits, 2j+1 in its high ones. */
INL void group16_scales(__m256i sc16, __m256i *sc) {
    const __m256i lo = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sc16));
    const __m256i hi = _mm256_broadcastsi128_si256(_mm256_extracti128_si256(sc16, 1));
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        sc[j] = pick16(lo, 2 * j, 2 * j + 1);
        sc[j + 4] = pick16(hi, 2 * j, 2 * j + 1);
    }
}

/* Q2_K/Q3_K's 2-bit fields: vector 4h+k (values 128h + 32k .. +31) is
 * bits 2k, 2k+1 of qs[32h .. 32h+31] (a byte's own bits after the 16-bit
 * shift and the mask). */
INL void levels_q2(const uint8_t *qs, __m256i *lv) {
    const __m256i m3 = _mm256_set1_epi8(3);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
        lv[4 * h + 0] = _mm256_and_si256(q, m3);
        lv[4 * h + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 2), m3);
        lv[4 * h + 2] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m3);
        lv[4 * h + 3] = _mm256_and_si256(_mm256_srli_epi16(q, 6), m3);
    }
}

/* Q3_K: the 2-bit fields plus the third bit, bit j of hmask[l] for vector
 * j, moved to bit 2 (shifts of at most 5 places: bit 2 of each byte
 * comes from the same byte). Levels 0..7 = q + 4. */
INL void levels_q3_K(const block_q3_K *blk, __m256i *lv) {
    levels_q2(blk->qs, lv);
    const __m256i hm = _mm256_loadu_si256((const __m256i *)blk->hmask), b2 = _mm256_set1_epi8(4);
    lv[0] = _mm256_or_si256(lv[0], _mm256_and_si256(_mm256_slli_epi16(hm, 2), b2));
    lv[1] = _mm256_or_si256(lv[1], _mm256_and_si256(_mm256_slli_epi16(hm, 1), b2));
    lv[2] = _mm256_or_si256(lv[2], _mm256_and_si256(hm, b2));
    lv[3] = _mm256_or_si256(lv[3], _mm256_and_si256(_mm256_srli_epi16(hm, 1), b2));
    lv[4] = _mm256_or_si256(lv[4], _mm256_and_si256(_mm256_srli_epi16(hm, 2), b2));
    lv[5] = _mm256_or_si256(lv[5], _mm256_and_si256(_mm256_srli_epi16(hm, 3), b2));
    lv[6] = _mm256_or_si256(lv[6], _mm256_and_si256(_mm256_srli_epi16(hm, 4), b2));
    lv[7] = _mm256_or_si256(lv[7], _mm256_and_si256(_mm256_srli_epi16(hm, 5), b2));
}

/* Q3_K's 16 six-bit scales (kt_q3_K_scale) minus 32 as int16, by 32-bit
 * words as ggml's dequantizer decodes them: words a0, a1 = bytes 0-7 give
 * the low nibbles (scales 0-7 low, 8-15 high), word t = bytes 8-11 the
 * top bits (2 per scale, scale 4i + k at bits 2i of byte k). */
INL __m256i q3_K_scales16(const uint8_t *q) {
    uint32_t a0, a1, t;
    memcpy(&a0, q, 4);
    memcpy(&a1, q + 4, 4);
    memcpy(&t, q + 8, 4);
    const uint32_t k1 = 0x03030303, k2 = 0x0f0f0f0f;
    const uint32_t s0 = (a0 & k2) | ((t & k1) << 4), s1 = (a1 & k2) | (((t >> 2) & k1) << 4);
    const uint32_t s2 = ((a0 >> 4) & k2) | (((t >> 4) & k1) << 4), s3 = ((a1 >> 4) & k2) | (((t >> 6) & k1) << 4);
    const __m128i b = _mm_setr_epi32((int)s0, (int)s1, (int)s2, (int)s3);
    return _mm256_sub_epi16(_mm256_cvtepu8_epi16(b), _mm256_set1_epi16(32));
}

INL void unpack_q2_K(const block_q2_K *blk, kq_block *u) {
    levels_q2(blk->qs, u->q);
    const __m128i sm = _mm_loadu_si128((const __m128i *)blk->scales);
    group16_scales(_mm256_cvtepu8_epi16(_mm_and_si128(sm, _mm_set1_epi8(0x0F))), u->sc);
    u->sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sm, 4), _mm_set1_epi8(0x0F)));
    u->d = half_at(&blk->d);
    u->dmin = half_at(&blk->dmin);
}

INL void unpack_q3_K(const block_q3_K *blk, kq_block *u) {
    levels_q3_K(blk, u->q);
    u->sc16 = q3_K_scales16(blk->scales);
    group16_scales(u->sc16, u->sc);
    u->d = half_at(&blk->d);
}

/* IQ4_XS: 32 bytes of qs hold sub-blocks 2k (low 16 bytes) and 2k+1; a
 * sub-block's values are its bytes' low nibbles, then their high ones;
 * the table lookup is a byte shuffle. */
INL void levels_iq4_xs(const block_iq4_xs *blk, __m256i *lv) {
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)KT_IQ4NL_VALUES));
    const __m256i low = _mm256_set1_epi8(0x0F);
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(blk->qs + 32 * k));
        const __m256i lo = _mm256_and_si256(q, low), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
        lv[2 * k] = _mm256_shuffle_epi8(table, _mm256_permute2x128_si256(lo, hi, 0x20));
        lv[2 * k + 1] = _mm256_shuffle_epi8(table, _mm256_permute2x128_si256(lo, hi, 0x31));
    }
}

/* IQ4_XS's 8 six-bit scales minus 32 as int16 lanes 0-7 (kt_iq4_xs_scale:
 * nibble j % 2 of scales_l[j / 2], bits 2j of scales_h as bits 4-5). */
INL __m128i iq4_xs_scales8(const block_iq4_xs *blk) {
    uint32_t l4; /* nibble j = bits 4j .. 4j+3 (little-endian) */
    memcpy(&l4, blk->scales_l, 4);
    const uint32_t h = blk->scales_h;
    int16_t s[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) s[j] = (int16_t)((int)(((l4 >> (4 * j)) & 0xF) | (((h >> (2 * j)) & 3) << 4)) - 32);
    return _mm_loadu_si128((const __m128i *)s);
}

INL void unpack_iq4_xs(const block_iq4_xs *blk, kq_block *u) {
    levels_iq4_xs(blk, u->q);
    const __m256i sc = _mm256_broadcastsi128_si256(iq4_xs_scales8(blk));
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) u->sc[j] = pick16(sc, j, j);
    u->d = half_at(&blk->d);
}

INL void unpack(const kt_dtype t, const char *row, int b, kq_block *u) {
    if (t == KT_Q4_K) unpack_q4_K((const block_q4_K *)row + b, u);
    else if (t == KT_Q5_K) unpack_q5_K((const block_q5_K *)row + b, u);
    else if (t == KT_Q2_K) unpack_q2_K((const block_q2_K *)row + b, u);
    else if (t == KT_Q3_K) unpack_q3_K((const block_q3_K *)row + b, u);
    else if (t == KT_IQ4_XS) unpack_iq4_xs((const block_iq4_xs *)row + b, u);
    else unpack_q6_K((const block_q6_K *)row + b, u);
}

/* One block's step for one token (internal.h): the exact integer sums,
 * then the reference's fmaf steps. */
INL float block_step(const kt_dtype t, const kq_block *u, const int8_t *xq, float dx,
                     const int16_t *bs, float acc) {
    __m256i s = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        const __m256i x = _mm256_load_si256((const __m256i *)(xq + 32 * j));
        /* IQ4_XS's values are signed: |q| times x with q's sign (pairs at
         * most 2 * 127 * 127: no saturation; Q8_K values are > -128) */
        const __m256i p = t == KT_IQ4_XS ? _mm256_maddubs_epi16(_mm256_abs_epi8(u->q[j]), _mm256_sign_epi8(x, u->q[j]))
                                         : _mm256_maddubs_epi16(u->q[j], x);
        s = _mm256_add_epi32(s, _mm256_madd_epi16(p, u->sc[j]));
    }
    if (t == KT_IQ4_XS) return fmaf((float)hsum_epi32(s), u->d * dx, acc);
    if (t == KT_Q6_K || t == KT_Q3_K) { /* levels are q + 32 (Q3_K: q + 4) */
        const __m256i off = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)bs), u->sc16);
        s = _mm256_sub_epi32(s, _mm256_slli_epi32(off, t == KT_Q6_K ? 5 : 2));
        return fmaf((float)hsum_epi32(s), u->d * dx, acc);
    }
    if (t == KT_Q2_K) { /* mins: one per 16 values, against the bsums as they are */
        const __m256i mins = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)bs), u->sc16);
        acc = fmaf((float)hsum_epi32(s), u->d * dx, acc);
        return fmaf((float)-hsum_epi32(mins), u->dmin * dx, acc);
    }
    /* lane j: m[j] * (bs[2j] + bs[2j+1]); both sums reduced together */
    const __m256i mins = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)bs), u->m2);
    const __m256i h = _mm256_hadd_epi32(s, mins); /* s01 s23 m01 m23 | s45 s67 m45 m67 */
    __m128i r = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    r = _mm_hadd_epi32(r, r); /* isum, imin, isum, imin */
    const int32_t isum = _mm_cvtsi128_si32(r), imin = _mm_extract_epi32(r, 1);
    acc = fmaf((float)isum, u->d * dx, acc);
    return fmaf((float)-imin, u->dmin * dx, acc);
}

typedef struct kq_args {
    const char *w;
    size_t row_bytes, block_bytes;
    const kt_q8k_act *x;
    float *out;
    int n_out;
} kq_args;

/* ---- decode: one row times one token ----------------------------------- */

INL void kq_gemv(const kq_args *a, const kt_dtype t, int r, int tok) {
    const int nb = a->x->nb;
    const char *row = a->w + (size_t)r * a->row_bytes;
    float acc = 0.0f;
    for (int b = 0; b < nb; b++) {
        const char *p = row + (size_t)b * a->block_bytes + PF_BYTES;
        _mm_prefetch(p, _MM_HINT_T0);
        _mm_prefetch(p + 64, _MM_HINT_T0);
        _mm_prefetch(p + 128, _MM_HINT_T0);
        if (a->block_bytes > 192) _mm_prefetch(p + 192, _MM_HINT_T0);
        kq_block u;
        unpack(t, row, b, &u);
        const size_t i = (size_t)tok * nb + b;
        acc = block_step(t, &u, a->x->qs + i * QK_K, a->x->d[i], a->x->bsums + i * 16, acc);
    }
    a->out[(size_t)tok * a->n_out + r] = acc;
}

/* ---- prefill: panels of 8 rows, register tiles of 8 rows x T tokens ---- */

/* One weight block of KQ_ROWS rows, transposed so that int32 lane r is
 * row r: one broadcast of 4 activation bytes against q[v] gives each row
 * its partial sum in its own lane. */
typedef struct kq_pblock {
    __m256i q[64];  /* values 4v .. 4v+3 of each row */
    __m256i sc[16]; /* (s, s) int16 pairs: the scale of vector v is
                       sc[v / 8] (Q4_K/Q5_K) or sc[v / 4] (Q6_K) */
    __m256i sc32[16]; /* the scales of sc as int32 lanes (the VNNI tiles) */
    __m256i mp[8];  /* Q4_K/Q5_K (m[2k], m[2k+1]) against the pair
                       (bs[4k] + bs[4k+1], bs[4k+2] + bs[4k+3]), k < 4;
                       Q6_K (sc[2k], sc[2k+1]) against (bs[2k], bs[2k+1]) */
    __m256 d, dmin;
} kq_pblock;

/* A block's 16 scale words as int16: Q4_K/Q5_K sc[0..7], m[0..7];
 * Q6_K its 16 signed scales. */
INL __m256i scale_words(const kt_dtype t, const char *row, int b) {
    if (t == KT_Q6_K) {
        const int8_t *sc = ((const block_q6_K *)row + b)->scales;
        return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc));
    }
    const uint8_t *sc = t == KT_Q4_K ? ((const block_q4_K *)row + b)->scales
                                     : ((const block_q5_K *)row + b)->scales;
    return _mm256_cvtepu8_epi16(scale_min_bytes(sc));
}

INL void levels(const kt_dtype t, const char *row, int b, __m256i *lv) {
    if (t == KT_Q4_K) levels_q4_K((const block_q4_K *)row + b, lv);
    else if (t == KT_Q5_K) levels_q5_K((const block_q5_K *)row + b, lv);
    else levels_q6_K((const block_q6_K *)row + b, lv);
}

/* Scales: transposing the 8 rows' 16 words as 8 dwords gives w[k] lane r
 * = (s_r[2k], s_r[2k+1]); each word repeated over its pair is the
 * multiplier of a madd that also widens. */
INL void panel_scales(const kt_dtype t, const char *const *rows, int b, kq_pblock *p) {
    const __m256i dup_lo = _mm256_set_epi64x(0x0d0c0d0c09080908, 0x0504050401000100,
                                             0x0d0c0d0c09080908, 0x0504050401000100);
    const __m256i dup_hi = _mm256_set_epi64x(0x0f0e0f0e0b0a0b0a, 0x0706070603020302,
                                             0x0f0e0f0e0b0a0b0a, 0x0706070603020302);
    __m256i w[KQ_ROWS];
#pragma GCC unroll 8
    for (int r = 0; r < KQ_ROWS; r++) w[r] = scale_words(t, rows[r], b);
    transpose8_epi32(w);
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        const __m256i lo = _mm256_shuffle_epi8(w[k], dup_lo);
        const __m256i hi = _mm256_shuffle_epi8(w[k], dup_hi);
        if (t == KT_Q6_K) {
            p->sc[2 * k] = lo;
            p->sc[2 * k + 1] = hi;
            p->mp[k] = w[k];
        } else if (k < 4) {
            p->sc[2 * k] = lo;
            p->sc[2 * k + 1] = hi;
        } else {
            p->mp[k - 4] = w[k];
        }
    }
    /* (s, s) madd (1, 0) = s, sign kept (Q6_K's scales are signed) */
    const int n_sc = t == KT_Q6_K ? 16 : 8;
    for (int i = 0; i < n_sc; i++) p->sc32[i] = _mm256_madd_epi16(p->sc[i], _mm256_set1_epi32(1));
}

/* Block b of the 8 rows into p: levels transposed 32 values at a time. */
INL void panel_block(const kt_dtype t, const char *const *rows, size_t bb, int b, kq_pblock *p) {
    __m256i lv[KQ_ROWS][8];
#pragma GCC unroll 8
    for (int r = 0; r < KQ_ROWS; r++) levels(t, rows[r], b, lv[r]);
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        __m256i v[KQ_ROWS];
#pragma GCC unroll 8
        for (int r = 0; r < KQ_ROWS; r++) v[r] = lv[r][j];
        transpose8_epi32(v);
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) p->q[8 * j + i] = v[i];
    }
    panel_scales(t, rows, b, p);
    if (t == KT_Q6_K) {
        p->d = halves8(rows, bb, offsetof(block_q6_K, d), b);
    } else {
        p->d = halves8(rows, bb, offsetof(block_q4_K, d), b); /* same offsets in Q5_K */
        p->dmin = halves8(rows, bb, offsetof(block_q4_K, dmin), b);
    }
}

typedef struct kq_gemm {
    const kq_args *a;
    const kq_pblock *panel; /* blocks b0 .. b0+nkb-1 */
    int b0, nkb;
    int c0;                /* first token of the chunk */
    float (*acc)[KQ_ROWS]; /* the chunk's accumulators, token t at t - c0 */
} kq_gemm;

/* sum_v sc(v) * <q[v], x[4v .. 4v+3]> for T tokens. maddubs pairs are at
 * most 2 * 63 * 128 = 16128 (Q6_K), 7936 (Q5_K), 3840 (Q4_K), so 2, 4 or
 * 8 of them are summed in int16 before the madd that scales and widens. */
INL void tile_isum(const kt_dtype t, const bool vnni, const int T, const kq_pblock *p, const int8_t *const *xq,
                   __m256i *isum) {
    const int run = t == KT_Q4_K ? 8 : t == KT_Q5_K ? 4 : 2;
    const int per_scale = t == KT_Q6_K ? 4 : 8;
    if (vnni) { /* exact int32 sums per scale group (at most 8 * 4 * 63 * 128), then times the scale */
        for (int v = 0; v < 64; v += per_scale) {
            __m256i s32[KQ_TOKENS];
#pragma GCC unroll 4
            for (int k = 0; k < T; k++) s32[k] = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int i = 0; i < per_scale; i++) {
                const __m256i w = _mm256_load_si256(&p->q[v + i]);
#pragma GCC unroll 4
                for (int k = 0; k < T; k++) {
                    int32_t x4;
                    memcpy(&x4, xq[k] + 4 * (v + i), 4);
                    s32[k] = vnni_dot(s32[k], w, _mm256_set1_epi32(x4));
                }
            }
            const __m256i sc = _mm256_load_si256(&p->sc32[v / per_scale]);
#pragma GCC unroll 4
            for (int k = 0; k < T; k++) isum[k] = _mm256_add_epi32(isum[k], _mm256_mullo_epi32(s32[k], sc));
        }
        return;
    }
    for (int v = 0; v < 64; v += run) {
        __m256i s16[KQ_TOKENS];
#pragma GCC unroll 8
        for (int i = 0; i < run; i++) {
            const __m256i w = _mm256_load_si256(&p->q[v + i]);
#pragma GCC unroll 4
            for (int k = 0; k < T; k++) {
                int32_t x4;
                memcpy(&x4, xq[k] + 4 * (v + i), 4);
                const __m256i m = _mm256_maddubs_epi16(w, _mm256_set1_epi32(x4));
                s16[k] = i == 0 ? m : _mm256_add_epi16(s16[k], m);
                /* keep the sum a chain: reassociated into a tree, GCC
                   holds all 4 x 8 products at once and spills */
                __asm__("" : "+x"(s16[k]));
            }
        }
        const __m256i sc = _mm256_load_si256(&p->sc[v / per_scale]);
#pragma GCC unroll 4
        for (int k = 0; k < T; k++)
            isum[k] = _mm256_add_epi32(isum[k], _mm256_madd_epi16(s16[k], sc));
    }
}

/* Q6_K: sum_g sc[g] * bs[g], 16 terms as 8 madds of int16 pairs; mp[j]
 * holds (sc[2j], sc[2j+1]) per lane. Shared by the panel GEMM and the
 * Q6_Kx8 decode tile. */
INL void tile_offset(const int T, const __m256i *mps, const int16_t *const *bs, __m256i *imin) {
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        const __m256i mp = _mm256_load_si256(&mps[j]);
#pragma GCC unroll 4
        for (int k = 0; k < T; k++) {
            int32_t b2;
            memcpy(&b2, bs[k] + 2 * j, 4);
            imin[k] = _mm256_add_epi32(imin[k], _mm256_madd_epi16(mp, _mm256_set1_epi32(b2)));
        }
    }
}

/* Q4_K/Q5_K: sum_j m[j] * (bs[2j] + bs[2j+1]). hadd forms the 8 pair
 * sums (at most 32 * 128, no saturation) in dwords 0, 1, 4, 5; each dword
 * broadcast meets 2 mins (mp[j]: (m[2j], m[2j+1]) per lane): 4 madds
 * where 8 would take the bsums as they are. Shared by the panel GEMM and
 * the Q4_Kx8 decode tile. */
INL void tile_mins(const int T, const __m256i *mps, const int16_t *const *bs, __m256i *imin) {
    __m256i h[KQ_TOKENS];
#pragma GCC unroll 4
    for (int k = 0; k < T; k++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)bs[k]);
        h[k] = _mm256_hadd_epi16(v, v);
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        const __m256i mp = _mm256_load_si256(&mps[j]);
        const __m256i idx = _mm256_set1_epi32(j < 2 ? j : j + 2);
#pragma GCC unroll 4
        for (int k = 0; k < T; k++) {
            const __m256i pairs = _mm256_permutevar8x32_epi32(h[k], idx);
            imin[k] = _mm256_add_epi32(imin[k], _mm256_madd_epi16(mp, pairs));
        }
    }
}

/* One panel block for T tokens: the integer sums, then the reference's
 * fmaf steps, lane by lane (fnmadd(i, m, a) = fmaf(-i, m, a) exactly). */
INL void tile_block(const kt_dtype t, const bool vnni, const int T, const kq_pblock *p, const int8_t *const *xq,
                    const float *dx, const int16_t *const *bs, __m256 *acc) {
    __m256i isum[KQ_TOKENS], imin[KQ_TOKENS];
#pragma GCC unroll 4
    for (int k = 0; k < T; k++) isum[k] = imin[k] = _mm256_setzero_si256();
    tile_isum(t, vnni, T, p, xq, isum);
    if (t == KT_Q6_K) tile_offset(T, p->mp, bs, imin);
    else tile_mins(T, p->mp, bs, imin);
#pragma GCC unroll 4
    for (int k = 0; k < T; k++) {
        const __m256 x = _mm256_set1_ps(dx[k]);
        if (t == KT_Q6_K) { /* levels are q + 32 */
            const __m256i s = _mm256_sub_epi32(isum[k], _mm256_slli_epi32(imin[k], 5));
            acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(p->d, x), acc[k]);
        } else {
            acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[k]), _mm256_mul_ps(p->d, x), acc[k]);
            acc[k] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(imin[k]), _mm256_mul_ps(p->dmin, x),
                                      acc[k]);
        }
    }
}

/* Tokens tok .. tok+T-1 over the panel's blocks, continuing their
 * accumulators. */
INL void gemm_tile(const kq_gemm *g, const kt_dtype t, const bool vnni, const int T, int tok) {
    const kt_q8k_act *x = g->a->x;
    const int8_t *xq[KQ_TOKENS];
    const float *dx[KQ_TOKENS];
    const int16_t *bs[KQ_TOKENS];
    __m256 acc[KQ_TOKENS];
#pragma GCC unroll 4
    for (int k = 0; k < T; k++) {
        const size_t i = (size_t)(tok + k) * x->nb + g->b0;
        xq[k] = x->qs + i * QK_K;
        dx[k] = x->d + i;
        bs[k] = x->bsums + i * 16;
        acc[k] = _mm256_load_ps(g->acc[tok + k - g->c0]);
    }
    for (int b = 0; b < g->nkb; b++) {
        float d[KQ_TOKENS];
        const int8_t *q[KQ_TOKENS];
        const int16_t *s[KQ_TOKENS];
#pragma GCC unroll 4
        for (int k = 0; k < T; k++) {
            q[k] = xq[k] + (size_t)b * QK_K;
            d[k] = dx[k][b];
            s[k] = bs[k] + (size_t)b * 16;
        }
        tile_block(t, vnni, T, &g->panel[b], q, d, s, acc);
    }
#pragma GCC unroll 4
    for (int k = 0; k < T; k++) _mm256_store_ps(g->acc[tok + k - g->c0], acc[k]);
}

/* Tokens tok .. tok+nt-1 (nt <= KQ_TOKENS), T a constant in each tile. */
_Static_assert(KQ_TOKENS == 4, "gemm_tokens dispatches 1 .. 4 tokens");
INL void gemm_tokens(const kq_gemm *g, const kt_dtype t, const bool vnni, int tok, int nt) {
    if (nt == 4) gemm_tile(g, t, vnni, 4, tok);
    else if (nt == 3) gemm_tile(g, t, vnni, 3, tok);
    else if (nt == 2) gemm_tile(g, t, vnni, 2, tok);
    else gemm_tile(g, t, vnni, 1, tok);
}

/* Rows r .. r+nr-1 (nr <= 8; missing rows repeat the last, computed and
 * not stored) times tokens c0 .. c1-1: per KQ_KBLOCKS blocks a panel (it
 * stays in L1), then every token tile over it; the accumulators stay in
 * acc between panels. */
INL void gemm_rows(const kq_args *a, const kt_dtype t, const bool vnni, int r, int nr, int c0, int c1) {
    kq_pblock panel[KQ_KBLOCKS];
    _Alignas(32) float acc[KQ_CHUNK][KQ_ROWS];
    const char *rows[KQ_ROWS];
#pragma GCC unroll 8
    for (int i = 0; i < KQ_ROWS; i++)
        rows[i] = a->w + (size_t)(r + (i < nr ? i : nr - 1)) * a->row_bytes;
    memset(acc, 0, sizeof(float) * KQ_ROWS * (size_t)(c1 - c0));
    kq_gemm g = {a, panel, 0, 0, c0, acc};
    for (g.b0 = 0; g.b0 < a->x->nb; g.b0 += KQ_KBLOCKS) {
        g.nkb = a->x->nb - g.b0 < KQ_KBLOCKS ? a->x->nb - g.b0 : KQ_KBLOCKS;
        for (int b = 0; b < g.nkb; b++) panel_block(t, rows, a->block_bytes, g.b0 + b, &panel[b]);
        for (int tok = c0; tok < c1; tok += KQ_TOKENS)
            gemm_tokens(&g, t, vnni, tok, c1 - tok < KQ_TOKENS ? c1 - tok : KQ_TOKENS);
    }
    for (int tok = c0; tok < c1; tok++)
        for (int i = 0; i < nr; i++) a->out[(size_t)tok * a->n_out + r + i] = acc[tok - c0][i];
}


/* ---- prefill, AVX-512 VNNI: two panels side by side, 16 rows ------------
 *
 * As the VNNI tiles above, with the first panel's 8 rows in lanes 0-7 and
 * the second's in 8-15 of each 512-bit vector: one vpdpbusd, multiply and
 * float step serve 16 rows, lane by lane the same operations (same bits;
 * the activations' bsums are the same for every row, broadcast to both
 * halves). */


TARGET_512 INL __m512i join_i(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

TARGET_512 INL __m512 join_f(__m256 lo, __m256 hi) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1));
}

TARGET_512 INL void tile_block_512(const kt_dtype t, const int T, const kq_pblock *pa, const kq_pblock *pb,
                                   const int8_t *const *xq, const float *dx, const int16_t *const *bs, __m512 *acc) {
    const int per_scale = t == KT_Q6_K ? 4 : 8;
    __m512i isum[KQ_TOKENS], imin[KQ_TOKENS];
#pragma GCC unroll 4
    for (int k = 0; k < T; k++) isum[k] = imin[k] = _mm512_setzero_si512();
    for (int v = 0; v < 64; v += per_scale) {
        __m512i s32[KQ_TOKENS];
#pragma GCC unroll 4
        for (int k = 0; k < T; k++) s32[k] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int i = 0; i < per_scale; i++) {
            const __m512i w = join_i(_mm256_load_si256(&pa->q[v + i]), _mm256_load_si256(&pb->q[v + i]));
#pragma GCC unroll 4
            for (int k = 0; k < T; k++) {
                int32_t x4;
                memcpy(&x4, xq[k] + 4 * (v + i), 4);
                s32[k] = _mm512_dpbusd_epi32(s32[k], w, _mm512_set1_epi32(x4));
            }
        }
        const __m512i sc = join_i(pa->sc32[v / per_scale], pb->sc32[v / per_scale]);
#pragma GCC unroll 4
        for (int k = 0; k < T; k++) isum[k] = _mm512_add_epi32(isum[k], _mm512_mullo_epi32(s32[k], sc));
    }
    if (t == KT_Q6_K) { /* tile_offset */
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            const __m512i mp = join_i(pa->mp[j], pb->mp[j]);
#pragma GCC unroll 4
            for (int k = 0; k < T; k++) {
                int32_t b2;
                memcpy(&b2, bs[k] + 2 * j, 4);
                imin[k] = _mm512_add_epi32(imin[k], _mm512_madd_epi16(mp, _mm512_set1_epi32(b2)));
            }
        }
    } else { /* tile_mins */
#pragma GCC unroll 4
        for (int k = 0; k < T; k++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)bs[k]), h = _mm256_hadd_epi16(v, v);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                const __m256i pairs = _mm256_permutevar8x32_epi32(h, _mm256_set1_epi32(j < 2 ? j : j + 2));
                imin[k] = _mm512_add_epi32(imin[k], _mm512_madd_epi16(join_i(pa->mp[j], pb->mp[j]), join_i(pairs, pairs)));
            }
        }
    }
    const __m512 d = join_f(pa->d, pb->d), dmin = join_f(pa->dmin, pb->dmin);
#pragma GCC unroll 4
    for (int k = 0; k < T; k++) {
        const __m512 x = _mm512_set1_ps(dx[k]);
        if (t == KT_Q6_K) {
            const __m512i s = _mm512_sub_epi32(isum[k], _mm512_slli_epi32(imin[k], 5));
            acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(d, x), acc[k]);
        } else {
            acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[k]), _mm512_mul_ps(d, x), acc[k]);
            acc[k] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(imin[k]), _mm512_mul_ps(dmin, x), acc[k]);
        }
    }
}

/* Tokens tok .. tok+T-1 over both panels' blocks b0 .. b0+nkb-1. */
TARGET_512 INL void gemm_tile_512(const kq_args *a, const kt_dtype t, const int T, const kq_pblock *pa,
                                  const kq_pblock *pb, int b0, int nkb, int tok, float (*acc16)[2 * KQ_ROWS]) {
    const kt_q8k_act *x = a->x;
    __m512 acc[KQ_TOKENS];
#pragma GCC unroll 4
    for (int k = 0; k < T; k++) acc[k] = _mm512_loadu_ps(acc16[k]);
    for (int b = 0; b < nkb; b++) {
        const int8_t *q[KQ_TOKENS];
        float d[KQ_TOKENS];
        const int16_t *s[KQ_TOKENS];
#pragma GCC unroll 4
        for (int k = 0; k < T; k++) {
            const size_t i = (size_t)(tok + k) * x->nb + b0 + b;
            q[k] = x->qs + i * QK_K;
            d[k] = x->d[i];
            s[k] = x->bsums + i * 16;
        }
        tile_block_512(t, T, &pa[b], &pb[b], q, d, s, acc);
    }
#pragma GCC unroll 4
    for (int k = 0; k < T; k++) _mm512_storeu_ps(acc16[k], acc[k]);
}

/* Rows r .. r+15 (all present) times tokens c0 .. c1-1, as gemm_rows. */
TARGET_512 INL void gemm_rows_512(const kq_args *a, const kt_dtype t, int r, int c0, int c1) {
    kq_pblock pa[KQ_KBLOCKS], pb[KQ_KBLOCKS];
    float acc[KQ_CHUNK][2 * KQ_ROWS];
    const char *ra[KQ_ROWS], *rb[KQ_ROWS];
#pragma GCC unroll 8
    for (int i = 0; i < KQ_ROWS; i++) {
        ra[i] = a->w + (size_t)(r + i) * a->row_bytes;
        rb[i] = a->w + (size_t)(r + KQ_ROWS + i) * a->row_bytes;
    }
    memset(acc, 0, sizeof(float) * 2 * KQ_ROWS * (size_t)(c1 - c0));
    for (int b0 = 0; b0 < a->x->nb; b0 += KQ_KBLOCKS) {
        const int nkb = a->x->nb - b0 < KQ_KBLOCKS ? a->x->nb - b0 : KQ_KBLOCKS;
        for (int b = 0; b < nkb; b++) {
            panel_block(t, ra, a->block_bytes, b0 + b, &pa[b]);
            panel_block(t, rb, a->block_bytes, b0 + b, &pb[b]);
        }
        for (int tok = c0; tok < c1; tok += KQ_TOKENS) {
            const int nt = c1 - tok < KQ_TOKENS ? c1 - tok : KQ_TOKENS;
            float (*ac)[2 * KQ_ROWS] = acc + (tok - c0);
            if (nt == 4) gemm_tile_512(a, t, 4, pa, pb, b0, nkb, tok, ac);
            else if (nt == 3) gemm_tile_512(a, t, 3, pa, pb, b0, nkb, tok, ac);
            else if (nt == 2) gemm_tile_512(a, t, 2, pa, pb, b0, nkb, tok, ac);
            else gemm_tile_512(a, t, 1, pa, pb, b0, nkb, tok, ac);
        }
    }
    for (int tok = c0; tok < c1; tok++)
        memcpy(a->out + (size_t)tok * a->n_out + r, acc[tok - c0], sizeof(float) * 2 * KQ_ROWS);
}

#define KQ_KERNELS(ty, wt)                                                                   \
    static void ty##_gemv(const kq_args *a, int r, int tok) { kq_gemv(a, wt, r, tok); }      \
    static void ty##_gemm(const kq_args *a, int r, int nr, int c0, int c1) {                 \
        gemm_rows(a, wt, false, r, nr, c0, c1);                                              \
    }                                                                                        \
    static void ty##_gemm_vnni(const kq_args *a, int r, int nr, int c0, int c1) {            \
        gemm_rows(a, wt, true, r, nr, c0, c1);                                               \
    }                                                                                        \
    TARGET_512 static void ty##_gemm16(const kq_args *a, int r, int c0, int c1) {            \
        gemm_rows_512(a, wt, r, c0, c1);                                                     \
    }
KQ_KERNELS(q4k, KT_Q4_K)
KQ_KERNELS(q5k, KT_Q5_K)
KQ_KERNELS(q6k, KT_Q6_K)

/* ---- prefill of Q2_K, Q3_K, IQ4_XS: blocks unpacked once for a tile ----
 *
 * These types have no panel GEMM: per block the 8 rows' blocks are
 * unpacked once (as for the GEMV) and every token of the chunk takes the
 * GEMV's block step on each, one float accumulator per (row, token) in
 * acc, blocks in order: the GEMV's bits. The activation block is read
 * from L1 for all 8 rows; the unpacking, which the GEMV pays per row and
 * token, is paid once per row. */
INL void gemm_rows_unpacked(const kq_args *a, const kt_dtype t, int r, int nr, int c0, int c1) {
    _Alignas(32) float acc[KQ_CHUNK][KQ_ROWS];
    const int nb = a->x->nb;
    const char *rows[KQ_ROWS];
    for (int i = 0; i < nr; i++) rows[i] = a->w + (size_t)(r + i) * a->row_bytes;
    memset(acc, 0, sizeof(float) * KQ_ROWS * (size_t)(c1 - c0));
    for (int b = 0; b < nb; b++) {
        kq_block u[KQ_ROWS];
        for (int i = 0; i < nr; i++) unpack(t, rows[i], b, &u[i]);
        for (int tok = c0; tok < c1; tok++) {
            const size_t k = (size_t)tok * nb + b;
            const int8_t *xq = a->x->qs + k * QK_K;
            const int16_t *bs = a->x->bsums + k * 16;
            const float dx = a->x->d[k];
            for (int i = 0; i < nr; i++) acc[tok - c0][i] = block_step(t, &u[i], xq, dx, bs, acc[tok - c0][i]);
        }
    }
    for (int tok = c0; tok < c1; tok++)
        for (int i = 0; i < nr; i++) a->out[(size_t)tok * a->n_out + r + i] = acc[tok - c0][i];
}

#define KQ_KERNELS_UNPACKED(ty, wt)                                                          \
    static void ty##_gemv(const kq_args *a, int r, int tok) { kq_gemv(a, wt, r, tok); }      \
    static void ty##_gemm(const kq_args *a, int r, int nr, int c0, int c1) {                 \
        gemm_rows_unpacked(a, wt, r, nr, c0, c1);                                            \
    }
KQ_KERNELS_UNPACKED(q2k, KT_Q2_K)
KQ_KERNELS_UNPACKED(q3k, KT_Q3_K)
KQ_KERNELS_UNPACKED(iq4xs, KT_IQ4_XS)

void kt_matmul_kq_avx2(float *out, const void *w, kt_dtype wtype, const kt_q8k_act *x,
                       int n_in, int n_out, int n_tokens, int r0, int r1) {
    const bool vnni = kt_cpu_has_avx_vnni();
    void (*gemv)(const kq_args *, int, int) = q4k_gemv;
    void (*gemm)(const kq_args *, int, int, int, int) = vnni ? q4k_gemm_vnni : q4k_gemm;
    void (*gemm16)(const kq_args *, int, int, int) = q4k_gemm16;
    if (wtype == KT_Q5_K) {
        gemv = q5k_gemv;
        gemm = vnni ? q5k_gemm_vnni : q5k_gemm;
        gemm16 = q5k_gemm16;
    } else if (wtype == KT_Q6_K) {
        gemv = q6k_gemv;
        gemm = vnni ? q6k_gemm_vnni : q6k_gemm;
        gemm16 = q6k_gemm16;
    } else if (wtype == KT_Q2_K || wtype == KT_Q3_K || wtype == KT_IQ4_XS) {
        gemv = wtype == KT_Q2_K ? q2k_gemv : wtype == KT_Q3_K ? q3k_gemv : iq4xs_gemv;
        gemm = wtype == KT_Q2_K ? q2k_gemm : wtype == KT_Q3_K ? q3k_gemm : iq4xs_gemm;
        gemm16 = NULL; /* no 16-row AVX-512 tile for these */
    }
    if (!kt_cpu_has_avx512_vnni()) gemm16 = NULL;
    const size_t bb = (size_t)kt_dtype_get(wtype)->block_bytes;
    kq_args a = {w, kt_dtype_row_bytes(wtype, n_in), bb, x, out, n_out};
    if (n_tokens < KQ_MIN_GEMM) {
        for (int tok = 0; tok < n_tokens; tok++)
            for (int r = r0; r < r1; r++) gemv(&a, r, tok);
        return;
    }
    for (int c0 = 0; c0 < n_tokens; c0 += KQ_CHUNK) {
        const int c1 = c0 + KQ_CHUNK < n_tokens ? c0 + KQ_CHUNK : n_tokens;
        int r = r0;
        for (; gemm16 && r + 2 * KQ_ROWS <= r1; r += 2 * KQ_ROWS) gemm16(&a, r, c0, c1);
        for (; r < r1; r += KQ_ROWS) gemm(&a, r, r1 - r < KQ_ROWS ? r1 - r : KQ_ROWS, c0, c1);
    }
}

/* ---- the Q8_K activation quantizer ----------------------------------
 *
 * kt_quantize_act_q8_K (kquant.c) with 8 values per instruction and the
 * same bits: the first value of largest magnitude sets iscale = -127 / max
 * (max_ps keeps its first operand's NaN out, as the scalar comparison
 * does), iscale * x is the same single multiply, ggml's nearest_int is
 * done the same way (add 1.5 * 2^23, read the mantissa), and the
 * saturating packs are the clamp to [-128, 127]. */
void kt_quantize_act_q8_K_avx2(const float *x, int64_t n, int8_t *qs, float *d, int16_t *bsums) {
    const __m256 sign = _mm256_set1_ps(-0.0f), magic = _mm256_set1_ps(12582912.f);
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float *xb = x + i * QK_K;
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < QK_K; j += 8) m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(xb + j)), m);
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        int8_t *q = qs + i * QK_K;
        if (!amax) {
            d[i] = 0;
            memset(q, 0, QK_K);
            memset(bsums + i * 16, 0, 16 * sizeof *bsums);
            continue;
        }
        int first = 0; /* the first j with |x[j]| == amax: the scalar loop's max */
        for (int j = 0; j < QK_K; j += 8) {
            const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(xb + j)),
                                                             _mm256_set1_ps(amax), _CMP_EQ_OQ));
            if (hit) {
                first = j + __builtin_ctz((unsigned)hit);
                break;
            }
        }
        const float iscale = -127.f / xb[first];
        const __m256 vs = _mm256_set1_ps(iscale);
        for (int j = 0; j < QK_K; j += 32) {
            __m256i v[4];
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const __m256 f = _mm256_add_ps(_mm256_mul_ps(vs, _mm256_loadu_ps(xb + j + 8 * k)), magic);
                v[k] = _mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(f), _mm256_set1_epi32(0x007fffff)),
                                        _mm256_set1_epi32(0x00400000));
            }
            /* packs work within 128-bit lanes; the permute restores the order */
            const __m256i p16a = _mm256_packs_epi32(v[0], v[1]), p16b = _mm256_packs_epi32(v[2], v[3]);
            const __m256i p = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b),
                                                          _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(q + j), p);
            /* the two groups of 16: sums of the stored bytes */
            const __m256i w = _mm256_maddubs_epi16(_mm256_set1_epi8(1), p); /* pairs, int16 */
            const __m256i s32 = _mm256_madd_epi16(w, _mm256_set1_epi16(1)); /* quads */
            __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm_shuffle_epi32(_mm256_castsi256_si128(s32), 0x4e));
            __m128i t = _mm_add_epi32(_mm256_extracti128_si256(s32, 1), _mm_shuffle_epi32(_mm256_extracti128_si256(s32, 1), 0x4e));
            s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
            t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
            bsums[i * 16 + j / 16] = (int16_t)_mm_cvtsi128_si32(s);
            bsums[i * 16 + j / 16 + 1] = (int16_t)_mm_cvtsi128_si32(t);
        }
        d[i] = 1 / iscale;
    }
}

/* ---- Q4_Kx8 and Q5_Kx8: 8 rows per vector, read as repacked ------------
 *
 * The rows of a Q4_Kx8 group (ops/repack.h) sit one per int32 lane, so a
 * broadcast of 4 activation bytes against a packed vector's low (high)
 * nibbles gives 8 rows' partial sums of sub-block 2k (2k + 1) with no
 * reduction across lanes. Per token and block, the reference's integers
 * (matmul_k.c) lane by lane:
 *   isum = sum_j sc[j] * (sum over sub-block j of q * x)     (exact int32)
 *   imin = sum_j m[j] * (bsums[2j] + bsums[2j + 1])
 * then its two fmaf steps, so the bits are those of the reference and of
 * the row-at-a-time kernels above. sc and m are decoded from the packed
 * 6-bit form once per block for all 8 rows (one row per lane). With more
 * than one token the nibbles are unpacked once per block into a buffer
 * that every token then reads. Tiers: AVX2 (maddubs, int16 sums of at
 * most 8 pairs of 15 * 128: no overflow) and AVX-VNNI (vpdpbusd), which
 * AVX-512 CPUs take as well, with the activation words broadcast from
 * memory. A 16-row AVX-512 tile (two groups side by side) ran 41-46%
 * faster from L2 but streamed 10-15% slower in the model (its prefetch
 * runs two groups ahead), so decode stays 8 rows a tile; prefill (8
 * tokens or more) goes to the panel GEMMs, 16 rows at a time with
 * AVX-512.
 *
 * Q5_Kx8 is the same tile with each level's fifth bit or-ed in from the
 * block's qh vectors (bit 2k of qh vector c for the low nibbles of
 * nibble vector 8k + c, bit 2k + 1 for the high ones). Its levels reach
 * 31, so AVX2's maddubs pairs (up to 2 * 31 * 127) are widened at once
 * instead of summed 8 at a time in int16, and the VNNI tier takes the
 * high nibbles shifted down (16 times a 5-bit level does not fit a
 * byte). */

#define X8_TOKENS 4 /* tokens per tile */

/* Byte i of each 32-bit lane of v, zero-extended; with pair, bytes i and
 * i + 1 as the lane's two int16 halves. One byte shuffle. */
INL __m256i lane_bytes(__m256i v, int i, bool pair) {
    const uint32_t hi = pair ? (uint32_t)(i + 1) << 16 | 0x80000000u : 0x80800000u;
    const __m256i ctl = _mm256_set1_epi32((int)(hi | 0x8000u | (uint32_t)i));
    const __m256i off = _mm256_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12); /* the lane's own bytes */
    return _mm256_shuffle_epi8(v, _mm256_add_epi32(ctl, _mm256_add_epi32(off, pair ? _mm256_slli_epi32(off, 16) : _mm256_setzero_si256())));
}
INL __m256i lane_byte(__m256i v, int i) { return lane_bytes(v, i, false); }

/* Sub-block j's 6-bit scale of 8 rows (one per lane) from the packed
 * words u[0..2] (kt_kq_scale_min, lane by lane). */
INL __m256i x8_scale(const __m256i *u, int j) {
    if (j < 4) return _mm256_and_si256(lane_byte(u[0], j), _mm256_set1_epi32(63));
    const __m256i lo = _mm256_and_si256(lane_byte(u[2], j - 4), _mm256_set1_epi32(15));
    const __m256i hi = _mm256_srli_epi32(_mm256_and_si256(lane_byte(u[0], j - 4), _mm256_set1_epi32(0xC0)), 2);
    return _mm256_or_si256(lo, hi);
}

/* The mins of sub-blocks 2i and 2i + 1 of 8 rows as int16 pairs (low:
 * m[2i], high: m[2i + 1]) per lane: tile_mins' pair vectors. */
INL __m256i x8_min_pair(const __m256i *u, int i) {
    if (i < 2) return _mm256_and_si256(lane_bytes(u[1], 2 * i, true), _mm256_set1_epi32(63 << 16 | 63));
    const int k = 2 * i - 4; /* m[4 + k] = (u2 byte k >> 4) | (u1 byte k >> 6) << 4 */
    const __m256i q8 = lane_bytes(u[2], k, true), q6 = lane_bytes(u[1], k, true);
    return _mm256_or_si256(_mm256_srli_epi16(q8, 4), _mm256_srli_epi16(_mm256_and_si256(q6, _mm256_set1_epi32(0x00C000C0)), 2));
}

/* The 8 rows' values of vector 8k + c of block o, low (sub-block 2k)
 * and high (2k + 1) nibbles. */
INL void x8_nibbles(const uint8_t *o, int v, __m256i *lo, __m256i *hi) {
    const __m256i p = _mm256_loadu_si256((const __m256i *)(o + 32 * v));
    *lo = _mm256_and_si256(p, _mm256_set1_epi8(0x0F));
    *hi = _mm256_and_si256(_mm256_srli_epi16(p, 4), _mm256_set1_epi8(0x0F));
}


/* Where the parts of a Q4_Kx8 or Q5_Kx8 block sit (qh: Q5_Kx8 only). */
typedef struct kx8_fmt {
    int block_bytes, qh, scales, d, dmin;
} kx8_fmt;

static const kx8_fmt Q4KX8 = {KT_Q4KX8_BLOCK_BYTES, 0, KT_Q4KX8_SCALES, KT_Q4KX8_D, KT_Q4KX8_DMIN};
static const kx8_fmt Q5KX8 = {KT_Q5KX8_BLOCK_BYTES, KT_Q5KX8_QH, KT_Q5KX8_SCALES, KT_Q5KX8_D, KT_Q5KX8_DMIN};

/* Bit `bit` of each byte of qh moved to bit 4 (0x10 or 0). The 16-bit
 * shifts move no other byte's bit onto bit 4 (at most 4 places). */
INL __m256i fifth_bit(__m256i qh, const int bit) {
    const __m256i at4 = bit < 4 ? _mm256_slli_epi16(qh, 4 - bit) : bit > 4 ? _mm256_srli_epi16(qh, bit - 4) : qh;
    return _mm256_and_si256(at4, _mm256_set1_epi8(0x10));
}

/* The 8 rows' levels of nibble vector 8k + c of block o: x8_nibbles,
 * plus (q5) the fifth bits. */
INL void kx8_levels(const uint8_t *o, const bool q5, int k, int c, __m256i *lo, __m256i *hi) {
    x8_nibbles(o, 8 * k + c, lo, hi);
    if (!q5) return;
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(o + KT_Q5KX8_QH + 32 * c));
    *lo = _mm256_or_si256(*lo, fifth_bit(qh, 2 * k));
    *hi = _mm256_or_si256(*hi, fifth_bit(qh, 2 * k + 1));
}

/* 8 rows x T tokens (T <= X8_TOKENS) of one Q4_Kx8 (q5: Q5_Kx8) group,
 * tokens past nt repeating the last; vnni a constant (the callers'
 * target allows it). */
INL void kx8_tile(const kq_args *a, const bool q5, const bool vnni, const bool evex, const int T, int r0, int t0,
                  int nt) {
    const int nb = a->x->nb;
    const kx8_fmt *f = q5 ? &Q5KX8 : &Q4KX8;
    const bool hi16 = T == 1 && vnni && !q5; /* high nibbles as 16 * level */
    const bool wide = q5 && !vnni;          /* maddubs pairs widened at once */
    const uint8_t *grp = (const uint8_t *)a->w + (size_t)r0 * a->row_bytes;
    __m256i unpacked[64] __attribute__((aligned(32))); /* T > 1: [2v] lo, [2v + 1] hi */
    __m256 acc[X8_TOKENS];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *o = grp + (size_t)b * f->block_bytes;
        /* every tile, the next group into L2 (see x8_prefetch in matmul_avx2.c) */
#pragma GCC unroll 22
        for (int l = 0; l < f->block_bytes; l += 64) _mm_prefetch((const char *)o + 8 * a->row_bytes + l, _MM_HINT_T1);
        __m256i u[3], sc[8], mp[4];
        for (int i = 0; i < 3; i++) u[i] = _mm256_loadu_si256((const __m256i *)(o + f->scales + 32 * i));
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) sc[j] = x8_scale(u, j);
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) mp[i] = x8_min_pair(u, i);
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(o + f->d)));
        const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(o + f->dmin)));
        if (T > 1)
            for (int v = 0; v < 32; v++) kx8_levels(o, q5, v / 8, v % 8, &unpacked[2 * v], &unpacked[2 * v + 1]);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const size_t i = (size_t)(t0 + (t < nt ? t : nt - 1)) * nb + b;
            const int8_t *xq = a->x->qs + i * QK_K;
            const int16_t *bs = a->x->bsums + i * 16;
            __m256i isum = _mm256_setzero_si256(), imin = _mm256_setzero_si256(), isum16 = _mm256_setzero_si256();
            for (int k = 0; k < 4; k++) {
                __m256i slo = _mm256_setzero_si256(), shi = _mm256_setzero_si256();
#pragma GCC unroll 8
                for (int c = 0; c < 8; c++) {
                    __m256i lo, hi;
                    if (hi16) { /* hi as 16 * nibble: one and, no shift (see below) */
                        const __m256i p = _mm256_loadu_si256((const __m256i *)(o + 32 * (8 * k + c)));
                        lo = _mm256_and_si256(p, _mm256_set1_epi8(0x0F));
                        hi = _mm256_and_si256(p, _mm256_set1_epi8((char)0xF0));
                    } else if (T == 1) kx8_levels(o, q5, k, c, &lo, &hi);
                    else lo = unpacked[2 * (8 * k + c)], hi = unpacked[2 * (8 * k + c) + 1];
                    const int8_t *pl = xq + 64 * k + 4 * c, *ph = pl + 32; /* activation words */
                    int32_t xl, xh;
                    memcpy(&xl, pl, 4);
                    memcpy(&xh, ph, 4);
                    if (evex) {
                        slo = vnni_dot_bcast(slo, lo, pl);
                        shi = vnni_dot_bcast(shi, hi, ph);
                    } else if (vnni) {
                        slo = vnni_dot(slo, lo, _mm256_set1_epi32(xl));
                        shi = vnni_dot(shi, hi, _mm256_set1_epi32(xh));
                    } else if (wide) {
                        slo = dot_i32(false, slo, lo, _mm256_set1_epi32(xl));
                        shi = dot_i32(false, shi, hi, _mm256_set1_epi32(xh));
                    } else {
                        slo = _mm256_add_epi16(slo, _mm256_maddubs_epi16(lo, _mm256_set1_epi32(xl)));
                        shi = _mm256_add_epi16(shi, _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xh)));
                    }
                }
                if (!vnni && !wide) {
                    slo = _mm256_madd_epi16(slo, _mm256_set1_epi16(1));
                    shi = _mm256_madd_epi16(shi, _mm256_set1_epi16(1));
                }
                isum = _mm256_add_epi32(isum, _mm256_mullo_epi32(slo, sc[2 * k]));
                if (hi16) isum16 = _mm256_add_epi32(isum16, _mm256_mullo_epi32(shi, sc[2 * k + 1]));
                else isum = _mm256_add_epi32(isum, _mm256_mullo_epi32(shi, sc[2 * k + 1]));
            }
            /* 16 * the high nibbles' exact sum: a multiple of 16 */
            if (hi16) isum = _mm256_add_epi32(isum, _mm256_srai_epi32(isum16, 4));
            tile_mins(1, mp, &bs, &imin);
            const __m256 dx = _mm256_set1_ps(a->x->d[i]);
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d, dx), acc[t]);
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_setzero_si256(), imin)),
                                     _mm256_mul_ps(dmin, dx), acc[t]);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++)
        if (t < nt) _mm256_storeu_ps(a->out + (size_t)(t0 + t) * a->n_out + r0, acc[t]);
}

/* The tiles of one format: 1 and X8_TOKENS tokens, AVX2 and VNNI; one
 * token with AVX-512's broadcast vpdpbusd. */
typedef void (*kx8_tile_fn)(const kq_args *a, int r0, int t0, int nt);
typedef struct kx8_tiles {
    kx8_tile_fn avx2_1, avx2_4, vnni_1, vnni_4, evex_1;
} kx8_tiles;

#define KX8_TILES(ty, Q5)                                                                                  \
    static void ty##_avx2_1(const kq_args *a, int r0, int t0, int nt) { kx8_tile(a, Q5, false, false, 1, r0, t0, nt); } \
    static void ty##_avx2_4(const kq_args *a, int r0, int t0, int nt) {                                    \
        kx8_tile(a, Q5, false, false, X8_TOKENS, r0, t0, nt);                                              \
    }                                                                                                      \
    static void ty##_vnni_1(const kq_args *a, int r0, int t0, int nt) { kx8_tile(a, Q5, true, false, 1, r0, t0, nt); } \
    static void ty##_vnni_4(const kq_args *a, int r0, int t0, int nt) {                                    \
        kx8_tile(a, Q5, true, false, X8_TOKENS, r0, t0, nt);                                               \
    }                                                                                                      \
    TARGET_512 static void ty##_evex_1(const kq_args *a, int r0, int t0, int nt) {                         \
        kx8_tile(a, Q5, true, true, 1, r0, t0, nt);                                                        \
    }                                                                                                      \
    static const kx8_tiles ty = {ty##_avx2_1, ty##_avx2_4, ty##_vnni_1, ty##_vnni_4, ty##_evex_1};

KX8_TILES(Q4KX8_TILES, false)
KX8_TILES(Q5KX8_TILES, true)

/* Prefill: the 8-row tiles above redo the per-token scale products that
 * the panel GEMM (gemm_rows) folds into its madds, and measured 30%
 * slower on pp512; so for many tokens each group is turned back into 8
 * plain Q4_K (Q5_K) rows (the repacking's transposes undone with
 * transpose8) and given to gemm_rows. Same bits either way. */
#define X8_MIN_GEMM 8

/* 8 repacked vectors at src (32-bit lane r: row r's next 4 bytes) back
 * in row order: the 32 bytes of row r to dst[r]. */
INL void x8_words_to_rows(const uint8_t *src, uint8_t *const *dst) {
    __m256i v[8];
    for (int c = 0; c < 8; c++) v[c] = _mm256_loadu_si256((const __m256i *)(src + 32 * c));
    transpose8_epi32(v);
    for (int r = 0; r < KT_X8_ROWS; r++) _mm256_storeu_si256((__m256i *)dst[r], v[r]);
}

/* kx8_unrepack writes a Q5_K block's d, dmin and scales through a
 * block_q4_K: they sit at the same offsets in both. */
_Static_assert(offsetof(block_q4_K, d) == offsetof(block_q5_K, d) &&
                   offsetof(block_q4_K, dmin) == offsetof(block_q5_K, dmin) &&
                   offsetof(block_q4_K, scales) == offsetof(block_q5_K, scales),
               "Q4_K and Q5_K blocks start alike");

/* Rows r0 .. r0+7 of a Q4_Kx8 (q5: Q5_Kx8) matrix as 8 plain Q4_K (Q5_K)
 * rows at dst. */
INL void kx8_unrepack(const kq_args *a, const bool q5, int r0, uint8_t *dst) {
    const kx8_fmt *f = q5 ? &Q5KX8 : &Q4KX8;
    const size_t bb = q5 ? sizeof(block_q5_K) : sizeof(block_q4_K);
    const size_t qs = q5 ? offsetof(block_q5_K, qs) : offsetof(block_q4_K, qs), qh = offsetof(block_q5_K, qh);
    const int nb = a->x->nb;
    const uint8_t *grp = (const uint8_t *)a->w + (size_t)r0 * a->row_bytes;
    for (int b = 0; b < nb; b++) {
        const uint8_t *o = grp + (size_t)b * f->block_bytes;
        uint8_t *blk[KT_X8_ROWS], *to[KT_X8_ROWS];
        for (int r = 0; r < KT_X8_ROWS; r++) blk[r] = dst + ((size_t)r * nb + b) * bb;
        for (int k = 0; k < 4; k++) { /* vectors 8k .. 8k+7: qs[32k ..] of every row */
            for (int r = 0; r < KT_X8_ROWS; r++) to[r] = blk[r] + qs + 32 * k;
            x8_words_to_rows(o + 256 * k, to);
        }
        if (q5) {
            for (int r = 0; r < KT_X8_ROWS; r++) to[r] = blk[r] + qh;
            x8_words_to_rows(o + f->qh, to);
        }
        for (int r = 0; r < KT_X8_ROWS; r++) {
            block_q4_K *head = (block_q4_K *)blk[r]; /* d, dmin, scales: where Q5_K has them too */
            for (int u = 0; u < 3; u++) memcpy(head->scales + 4 * u, o + f->scales + 32 * u + 4 * r, 4);
            memcpy(&head->d, o + f->d + 2 * r, 2);
            memcpy(&head->dmin, o + f->dmin + 2 * r, 2);
        }
    }
}

static void q4x8_unrepack(const kq_args *a, int r0, void *dst) { kx8_unrepack(a, false, r0, dst); }
static void q5x8_unrepack(const kq_args *a, int r0, void *dst) { kx8_unrepack(a, true, r0, dst); }

/* How a repacked type's prefill runs: its groups turned back into plain
 * rows (unrepack: 8 rows from r0 into dst), then the plain type's panel
 * GEMMs, 16 rows at a time with AVX-512. */
typedef struct x8_prefill {
    void (*unrepack)(const kq_args *a, int r0, void *dst);
    void (*gemm16)(const kq_args *a, int r, int c0, int c1);
    void (*gemm_vnni)(const kq_args *a, int r, int nr, int c0, int c1);
    void (*gemm)(const kq_args *a, int r, int nr, int c0, int c1);
} x8_prefill;

/* Rows [r0, r1) of every token through the panel GEMMs on unrepacked
 * groups; false if out of memory (the caller then takes the tiles). */
static bool x8_gemm(const x8_prefill *k, const kq_args *a, int n_tokens, int r0, int r1) {
    char *rows = malloc(2 * KT_X8_ROWS * a->row_bytes);
    if (!rows) return false;
    const bool wide = kt_cpu_has_avx512_vnni();
    void (*gemm8)(const kq_args *, int, int, int, int) = kt_cpu_has_avx_vnni() ? k->gemm_vnni : k->gemm;
    for (int r = r0; r < r1;) {
        const int n = wide && r + 2 * KT_X8_ROWS <= r1 ? 2 * KT_X8_ROWS : KT_X8_ROWS;
        for (int g8 = 0; g8 < n; g8 += KT_X8_ROWS) k->unrepack(a, r + g8, rows + (size_t)g8 * a->row_bytes);
        kq_args g = *a;
        g.w = rows;
        g.out = a->out + r;
        for (int c0 = 0; c0 < n_tokens; c0 += KQ_CHUNK) {
            const int c1 = c0 + KQ_CHUNK < n_tokens ? c0 + KQ_CHUNK : n_tokens;
            if (n == 2 * KT_X8_ROWS) k->gemm16(&g, 0, c0, c1);
            else gemm8(&g, 0, KT_X8_ROWS, c0, c1);
        }
        r += n;
    }
    free(rows);
    return true;
}

static const x8_prefill Q4K_PREFILL = {q4x8_unrepack, q4k_gemm16, q4k_gemm_vnni, q4k_gemm};
static const x8_prefill Q5K_PREFILL = {q5x8_unrepack, q5k_gemm16, q5k_gemm_vnni, q5k_gemm};

/* Q4_Kx8 or Q5_Kx8 (plain: which): the panel GEMMs for 8 tokens or more,
 * else the tiles. */
static void kx8_matmul(kt_dtype plain, const kx8_tiles *k, const x8_prefill *pf, float *out, const void *w,
                       const kt_q8k_act *x, int n_in, int n_out, int n_tokens, int r0, int r1) {
    const kq_args a = {w, kt_dtype_row_bytes(plain, n_in), kt_dtype_get(plain)->block_bytes, x, out, n_out};
    if (n_tokens >= X8_MIN_GEMM && x8_gemm(pf, &a, n_tokens, r0, r1)) return;
    const bool vnni = kt_cpu_has_avx_vnni();
    kx8_tile_fn tile1 = kt_cpu_has_avx512_vnni() ? k->evex_1 : vnni ? k->vnni_1 : k->avx2_1;
    kx8_tile_fn tile4 = vnni ? k->vnni_4 : k->avx2_4;
    for (int c0 = 0; c0 < n_tokens; c0 += KQ_CHUNK) {
        const int c1 = c0 + KQ_CHUNK < n_tokens ? c0 + KQ_CHUNK : n_tokens;
        for (int r = r0; r < r1; r += KT_X8_ROWS)
            for (int t = c0; t < c1;) {
                const int n = c1 - t < X8_TOKENS ? c1 - t : X8_TOKENS;
                if (n == 1) tile1(&a, r, t, 1);
                else tile4(&a, r, t, n);
                t += n;
            }
    }
}

void kt_matmul_q4_K_x8_avx2(float *out, const void *w, const kt_q8k_act *x, int n_in, int n_out,
                            int n_tokens, int r0, int r1) {
    kx8_matmul(KT_Q4_K, &Q4KX8_TILES, &Q4K_PREFILL, out, w, x, n_in, n_out, n_tokens, r0, r1);
}

void kt_matmul_q5_K_x8_avx2(float *out, const void *w, const kt_q8k_act *x, int n_in, int n_out,
                            int n_tokens, int r0, int r1) {
    kx8_matmul(KT_Q5_K, &Q5KX8_TILES, &Q5K_PREFILL, out, w, x, n_in, n_out, n_tokens, r0, r1);
}

/* ---- Q6_Kx8: decode on the repacked groups ------------------------------
 *
 * As Q4_Kx8: 8 rows in the int32 lanes, per block the reference's integers
 * lane by lane (matmul_k.c): per group g of 16 values, s_g = sum q x over
 * the 6-bit levels q (low nibble from ql, 2 bits from qh), then
 *   isum = sum_g sc_g * s_g - 32 * sum_g sc_g * bsums_g
 * and the one fmaf step. With AVX2 a maddubs pair can reach 2 * 63 * 128,
 * so each step is widened with madd before adding. Prefill (8 tokens or
 * more) undoes the transposes and runs the panel GEMM. */

INL void q6kx8_tile(const kq_args *a, const bool vnni, const bool evex, int r0, int tok) {
    const int nb = a->x->nb;
    const uint8_t *grp = (const uint8_t *)a->w + (size_t)r0 * a->row_bytes;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *o = grp + (size_t)b * KT_Q6KX8_BLOCK_BYTES;
#pragma GCC unroll 27
        for (int l = 0; l < KT_Q6KX8_BLOCK_BYTES; l += 64) _mm_prefetch((const char *)o + 8 * a->row_bytes + l, _MM_HINT_T1);
        const size_t i = (size_t)tok * nb + b;
        const int8_t *xq = a->x->qs + i * QK_K;
        const int16_t *bs = a->x->bsums + i * 16;
        /* the scales of groups 2p and 2p + 1 as sign-extended int16 pairs:
         * the offset term is one madd per pair against bsums[2p], [2p + 1] */
        __m256i scp[8], off = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int p = 0; p < 8; p++) {
            const __m256i w = _mm256_loadu_si256((const __m256i *)(o + KT_Q6KX8_SCALES + 32 * (p / 2)));
            scp[p] = _mm256_srai_epi16(_mm256_slli_epi16(lane_bytes(w, 2 * p % 4, true), 8), 8);
        }
        tile_offset(1, scp, &bs, &off);
        __m256i isum = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++)
            for (int half = 0; half < 2; half++) { /* groups 8h + 2qq + half */
                __m256i s[4];
#pragma GCC unroll 4
                for (int qq = 0; qq < 4; qq++) s[qq] = _mm256_setzero_si256();
#pragma GCC unroll 4
                for (int c = 4 * half; c < 4 * half + 4; c++) {
                    const __m256i A = _mm256_loadu_si256((const __m256i *)(o + 32 * (16 * h + c)));
                    const __m256i B = _mm256_loadu_si256((const __m256i *)(o + 32 * (16 * h + 8 + c)));
                    const __m256i Q = _mm256_loadu_si256((const __m256i *)(o + KT_Q6KX8_QH + 32 * (8 * h + c)));
                    __m256i q[4];
                    /* level = low nibble | 2 high bits << 4; the 16-bit
                     * shifts move bits across bytes only where the and drops them */
                    q[0] = _mm256_or_si256(_mm256_and_si256(A, m4), _mm256_and_si256(_mm256_slli_epi16(Q, 4), m30));
                    q[1] = _mm256_or_si256(_mm256_and_si256(B, m4), _mm256_and_si256(_mm256_slli_epi16(Q, 2), m30));
                    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(A, 4), m4), _mm256_and_si256(Q, m30));
                    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(B, 4), m4),
                                           _mm256_and_si256(_mm256_srli_epi16(Q, 2), m30));
#pragma GCC unroll 4
                    for (int qq = 0; qq < 4; qq++) {
                        const int8_t *x = xq + 128 * h + 32 * qq + 4 * c;
                        int32_t x4;
                        memcpy(&x4, x, 4);
                        s[qq] = evex ? vnni_dot_bcast(s[qq], q[qq], x) : dot_i32(vnni, s[qq], q[qq], _mm256_set1_epi32(x4));
                    }
                }
#pragma GCC unroll 4
                for (int qq = 0; qq < 4; qq++) { /* group g = 8h + 2qq + half: pair 4h + qq */
                    const __m256i pr = scp[4 * h + qq];
                    const __m256i sc = half ? _mm256_srai_epi32(pr, 16) : _mm256_srai_epi32(_mm256_slli_epi32(pr, 16), 16);
                    isum = _mm256_add_epi32(isum, _mm256_mullo_epi32(s[qq], sc));
                }
            }
        isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(off, 5));
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(o + KT_Q6KX8_D)));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d, _mm256_set1_ps(a->x->d[i])), acc);
    }
    _mm256_storeu_ps(a->out + (size_t)tok * a->n_out + r0, acc);
}

static void q6kx8_avx2(const kq_args *a, int r0, int tok) { q6kx8_tile(a, false, false, r0, tok); }
static void q6kx8_vnni(const kq_args *a, int r0, int tok) { q6kx8_tile(a, true, false, r0, tok); }
TARGET_512 static void q6kx8_evex(const kq_args *a, int r0, int tok) { q6kx8_tile(a, true, true, r0, tok); }

/* Rows r0 .. r0+7 of a Q6_Kx8 matrix as 8 Q6_K rows at dst: ql and qh by
 * 8 x 8 transposes of 32-bit words (as q4x8_unrepack), scales and d word by
 * word. */
static void q6x8_unrepack(const kq_args *a, int r0, void *dst_rows) {
    block_q6_K *dst = dst_rows;
    const int nb = a->x->nb;
    const uint8_t *grp = (const uint8_t *)a->w + (size_t)r0 * a->row_bytes;
    for (int b = 0; b < nb; b++) {
        const uint8_t *o = grp + (size_t)b * KT_Q6KX8_BLOCK_BYTES;
        for (int k = 0; k < 6; k++) { /* vectors 8k .. 8k+7: ql (k < 4), then qh */
            uint8_t *to[KT_X8_ROWS];
            for (int r = 0; r < KT_X8_ROWS; r++) {
                block_q6_K *blk = &dst[(size_t)r * nb + b];
                to[r] = k < 4 ? blk->ql + 32 * k : blk->qh + 32 * (k - 4);
            }
            x8_words_to_rows(o + 256 * k, to);
        }
        for (int r = 0; r < KT_X8_ROWS; r++) {
            block_q6_K *blk = &dst[(size_t)r * nb + b];
            for (int u = 0; u < 4; u++) memcpy(blk->scales + 4 * u, o + KT_Q6KX8_SCALES + 32 * u + 4 * r, 4);
            memcpy(&blk->d, o + KT_Q6KX8_D + 2 * r, 2);
        }
    }
}

static const x8_prefill Q6K_PREFILL = {q6x8_unrepack, q6k_gemm16, q6k_gemm_vnni, q6k_gemm};

void kt_matmul_q6_K_x8_avx2(float *out, const void *w, const kt_q8k_act *x, int n_in, int n_out,
                            int n_tokens, int r0, int r1) {
    const kq_args a = {w, kt_dtype_row_bytes(KT_Q6_K, n_in), sizeof(block_q6_K), x, out, n_out};
    if (n_tokens >= X8_MIN_GEMM && x8_gemm(&Q6K_PREFILL, &a, n_tokens, r0, r1)) return;
    void (*tile)(const kq_args *, int, int) = kt_cpu_has_avx512_vnni() ? q6kx8_evex : kt_cpu_has_avx_vnni() ? q6kx8_vnni : q6kx8_avx2;
    for (int r = r0; r < r1; r += KT_X8_ROWS)
        for (int t = 0; t < n_tokens; t++) tile(&a, r, t);
}

/* ---- IQ4_NL and MXFP4: 8 rows at a time against Q8_0 activations -------
 *
 * The specification is Q4_0's (internal.h): per 32-value block, in order,
 * acc = fmaf((float)isum, d_w * d_x, acc). A row's block is 16 bytes: the
 * low nibbles (values 0-15) and high nibbles (16-31) make one vector of
 * table indices, the table lookup one byte shuffle, and the products with
 * the activations maddubs of |w| against x signed like w (pairs at most
 * 2 * 127 * 128 < 2^15: no saturation). The 8 rows' int32 vectors are
 * reduced together by a tree of hadds into one vector whose lane i is row
 * i's exact isum, so the float step is one vector fma for the 8 rows
 * (lane by lane fmaf). Missing rows of a last group repeat the last row
 * (computed, not stored). Tokens of a chunk run over each group in turn,
 * whose weights stay in L1/L2 between them. */

#define NL_ROWS 8
#define NL_CHUNK 64 /* tokens per pass: their activations stay in L2 */

/* lane i = the sum of the 8 int32 lanes of v[i] */
INL __m256i hsum8_rows(const __m256i *v) {
    const __m256i h01 = _mm256_hadd_epi32(v[0], v[1]), h23 = _mm256_hadd_epi32(v[2], v[3]);
    const __m256i h45 = _mm256_hadd_epi32(v[4], v[5]), h67 = _mm256_hadd_epi32(v[6], v[7]);
    const __m256i a = _mm256_hadd_epi32(h01, h23), b = _mm256_hadd_epi32(h45, h67);
    /* a: rows 0-3 from the low halves, then rows 0-3 from the high halves */
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

/* The two 16-entry-table formats on this path: IQ4_NL (fp16 d at 0, qs
 * at 2) and MXFP4 (E8M0 e at 0, qs at 1; its values at most 12, the same
 * maddubs with room to spare). `f` is a constant in each caller. */
typedef struct nl_fmt {
    const int8_t *table;
    size_t bb, qs_off;
    bool e8m0; /* scale: kt_e8m0_half of byte 0, else the fp16 at 0 */
} nl_fmt;

static const nl_fmt NL_IQ4_NL = {KT_IQ4NL_VALUES, sizeof(block_iq4_nl), offsetof(block_iq4_nl, qs), false};
static const nl_fmt NL_MXFP4 = {KT_MXFP4_VALUES, sizeof(block_mxfp4), offsetof(block_mxfp4, qs), true};

INL void nl_group(const nl_fmt *f, const kq_args *a, const kt_q8_act *x, int r, int nr, int tok) {
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)f->table));
    const __m128i low = _mm_set1_epi8(0x0F);
    const char *rows[NL_ROWS];
#pragma GCC unroll 8
    for (int i = 0; i < NL_ROWS; i++) rows[i] = a->w + (size_t)(r + (i < nr ? i : nr - 1)) * a->row_bytes;
    const int nb = x->nb;
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const size_t k = (size_t)tok * nb + b;
        const __m256i xv = _mm256_load_si256((const __m256i *)(x->qs + k * 32));
        __m256i s[NL_ROWS];
#pragma GCC unroll 8
        for (int i = 0; i < NL_ROWS; i++) {
            const char *blk = rows[i] + (size_t)b * f->bb;
            _mm_prefetch(blk + PF_BYTES, _MM_HINT_T0);
            const __m128i q = _mm_loadu_si128((const __m128i *)(blk + f->qs_off));
            const __m256i idx = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), low), _mm_and_si128(q, low));
            const __m256i wv = _mm256_shuffle_epi8(table, idx);
            const __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(xv, wv));
            s[i] = _mm256_madd_epi16(p, _mm256_set1_epi16(1));
        }
        const __m256 dw = f->e8m0 ? e8m0_half8(bytes8(rows, f->bb, 0, b)) : halves8(rows, f->bb, 0, b);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hsum8_rows(s)), _mm256_mul_ps(dw, _mm256_set1_ps(x->d[k])), acc);
    }
    float o[NL_ROWS];
    _mm256_storeu_ps(o, acc);
    for (int i = 0; i < nr; i++) a->out[(size_t)tok * a->n_out + r + i] = o[i];
}

INL void nl_rows(const nl_fmt *f, const void *w, const kt_q8_act *x, int n_in, int n_out, int n_tokens,
                 float *out, int r0, int r1) {
    const kq_args a = {w, (size_t)(n_in / 32) * f->bb, f->bb, NULL, out, n_out};
    for (int c0 = 0; c0 < n_tokens; c0 += NL_CHUNK) {
        const int c1 = c0 + NL_CHUNK < n_tokens ? c0 + NL_CHUNK : n_tokens;
        for (int r = r0; r < r1; r += NL_ROWS)
            for (int tok = c0; tok < c1; tok++) nl_group(f, &a, x, r, r1 - r < NL_ROWS ? r1 - r : NL_ROWS, tok);
    }
}

void kt_matmul_iq4_nl_avx2(float *out, const void *w, const kt_q8_act *x, int n_in, int n_out,
                           int n_tokens, int r0, int r1) {
    nl_rows(&NL_IQ4_NL, w, x, n_in, n_out, n_tokens, out, r0, r1);
}

/* MXFP4 (ggml's ggml_vec_dot_mxfp4_q8_0 does the same lookup and maddubs,
 * one row at a time): the scales are powers of two, 8 exponent bytes made
 * floats by shifting them into place (e8m0_half8). */
void kt_matmul_mxfp4_avx2(float *out, const void *w, const kt_q8_act *x, int n_in, int n_out,
                          int n_tokens, int r0, int r1) {
    nl_rows(&NL_MXFP4, w, x, n_in, n_out, n_tokens, out, r0, r1);
}

/* ---- Q2_Kx8, Q3_Kx8, IQ4_XSx8: decode on the repacked groups -------------
 *
 * As Q4_Kx8 (ops/repack.h): 8 rows in the int32 lanes, one load of a
 * packed vector feeds all 8, and per token and block the reference's
 * integers lane by lane (matmul_k.c), then its fmaf steps: the same bits.
 * A group's scales are decoded once per block for its 8 rows.
 *
 *   Q2_K:   s_g = sum q x over group g (16 values, 2-bit q); isum = sum_g
 *           sc_g s_g, imin = sum_g m_g bsums_g.
 *   Q3_K:   s_g = sum q x - 4 bsums_g (q the 3-bit level + 4, so s_g =
 *           sum (q - 4) x); isum = sum_g (sc_g - 32) s_g.
 *   IQ4_XS: s_j = sum u x - 128 (bsums_2j + bsums_2j+1) over sub-block j
 *           (u = KT_IQ4NL_VALUES[n] + 128, unsigned for vpdpbusd; AVX2
 *           takes the signed value and the sign trick instead);
 *           isum = sum_j (ls_j - 32) s_j.
 * The Q2_K and Q3_K group sums fit int16 (|s_g| <= 16 x 7 x 127 + 4 x
 * 16 x 127 = 22352; Q2_K's one-token tile forms 4 s_g for half of them,
 * <= 24384), so the scale product is one madd against the scale as the
 * int16 pair (sc, 0); IQ4_XS's do not (32 x 241 x 127) and take
 * mullo. AVX2's maddubs pairs (2 x 7 x 127 at most for Q3_K) are summed
 * 4 at a time in int16 before the madd.
 *
 * Two tokens or more: per chunk of tokens, per group, each block is
 * unpacked once (lx8_rows) and every token of the chunk meets it, 4 at a
 * time (each level vector loaded once for the 4); pp512 on tinyllama, 2
 * threads: Q2_K 137, IQ4_XS 146, Q3_K_S 119 t/s, where turning the groups
 * back into plain rows for the plain types' GEMM gave 65, 61, 76. */

/* Q2_Kx8: the scale of group g (0..15) of the 8 rows as the int16 pair
 * (sc, 0) per lane (the low nibble of scales byte g), and the mins of
 * groups 2p, 2p+1 as the pair (m_2p, m_2p+1) (high nibbles of bytes 2p,
 * 2p+1). u: the block's 4 scale vectors. */
INL __m256i q2x8_scale(const __m256i *u, int g) {
    return _mm256_and_si256(lane_byte(u[g / 4], g % 4), _mm256_set1_epi32(15));
}
INL __m256i q2x8_min_pair(const __m256i *u, int p) {
    return _mm256_srli_epi16(lane_bytes(u[p / 2], 2 * (p % 2), true), 4);
}

/* acc + q x (4 bytes a lane) for the tiers: AVX-512's broadcast vpdpbusd,
 * AVX-VNNI's, or (AVX2) maddubs into int16 lanes, to be widened by the
 * caller. */
INL __m256i lx8_dot(const bool vnni, const bool evex, __m256i acc, __m256i q, const int8_t *x) {
    if (evex) return vnni_dot_bcast(acc, q, x);
    int32_t x4;
    memcpy(&x4, x, 4);
    if (vnni) return vnni_dot(acc, q, _mm256_set1_epi32(x4));
    return _mm256_add_epi16(acc, _mm256_maddubs_epi16(q, _mm256_set1_epi32(x4)));
}

/* s (int32 lanes, or AVX2's int16 pair sums) times the scale pair (sc,
 * 0), widened: one madd. AVX2's int16 lanes hold two partial sums of the
 * same group, so there the scale goes in both halves. */
INL __m256i lx8_scaled(const bool vnni, __m256i s, __m256i sc) {
    if (!vnni) sc = _mm256_or_si256(sc, _mm256_slli_epi32(sc, 16));
    return _mm256_madd_epi16(s, sc);
}

/* Prefetch block o's bytes in the group 8 rows on. */
INL void lx8_prefetch(const kq_args *a, const uint8_t *o, const int bytes) {
#pragma GCC unroll 17
    for (int l = 0; l < bytes; l += 64) _mm_prefetch((const char *)o + 8 * a->row_bytes + l, _MM_HINT_T1);
}

INL void q2kx8_tile(const kq_args *a, const bool vnni, const bool evex, int r0, int tok) {
    const int nb = a->x->nb;
    const uint8_t *grp = (const uint8_t *)a->w + (size_t)r0 * a->row_bytes;
    const __m256i m3 = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *o = grp + (size_t)b * KT_Q2KX8_BLOCK_BYTES;
        lx8_prefetch(a, o, KT_Q2KX8_BLOCK_BYTES);
        const size_t i = (size_t)tok * nb + b;
        const int8_t *xq = a->x->qs + i * QK_K;
        const int16_t *bs = a->x->bsums + i * 16;
        __m256i u[4], mp[8], imin = _mm256_setzero_si256(), isum = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) u[k] = _mm256_loadu_si256((const __m256i *)(o + KT_Q2KX8_SCALES + 32 * k));
#pragma GCC unroll 8
        for (int p = 0; p < 8; p++) mp[p] = q2x8_min_pair(u, p);
        tile_offset(1, mp, &bs, &imin);
        /* the fields of odd k are taken in place (v & 0x0C: 4 q), one
         * shift fewer per field; their sums are 4 times the true ones
         * (|4 s_g| <= 24384, still the madd's int16) and go to isum4,
         * divided by 4 once per block (exact: a multiple of 4) */
        __m256i isum4 = _mm256_setzero_si256();
        const __m256i m12 = _mm256_set1_epi8(12);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            /* vector 8h + c: values 128h + 32k + 4c .. +3 in bits 2k (k = 0..3),
             * of group 8h + 2k + c / 4 */
            __m256i s[4][2];
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) s[k][0] = s[k][1] = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(o + 32 * (8 * h + c)));
                const __m256i v4 = _mm256_srli_epi16(v, 4);
#pragma GCC unroll 4
                for (int k = 0; k < 4; k++) {
                    const __m256i q = _mm256_and_si256(k < 2 ? v : v4, k % 2 ? m12 : m3);
                    s[k][c / 4] = lx8_dot(vnni, evex, s[k][c / 4], q, xq + 128 * h + 32 * k + 4 * c);
                }
            }
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                __m256i *to = k % 2 ? &isum4 : &isum;
                *to = _mm256_add_epi32(*to, lx8_scaled(vnni, s[k][0], q2x8_scale(u, 8 * h + 2 * k)));
                *to = _mm256_add_epi32(*to, lx8_scaled(vnni, s[k][1], q2x8_scale(u, 8 * h + 2 * k + 1)));
            }
        }
        isum = _mm256_add_epi32(isum, _mm256_srai_epi32(isum4, 2));
        const __m256 dx = _mm256_set1_ps(a->x->d[i]);
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(o + KT_Q2KX8_D)));
        const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(o + KT_Q2KX8_DMIN)));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d, dx), acc);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_setzero_si256(), imin)),
                              _mm256_mul_ps(dmin, dx), acc);
    }
    _mm256_storeu_ps(a->out + (size_t)tok * a->n_out + r0, acc);
}

static void q2kx8_avx2(const kq_args *a, int r0, int tok) { q2kx8_tile(a, false, false, r0, tok); }
static void q2kx8_vnni(const kq_args *a, int r0, int tok) { q2kx8_tile(a, true, false, r0, tok); }
TARGET_512 static void q2kx8_evex(const kq_args *a, int r0, int tok) { q2kx8_tile(a, true, true, r0, tok); }

/* Q3_Kx8: the scale of group g of the 8 rows minus 32 as the int16 pair
 * (sc - 32, 0) per lane (kt_q3_K_scale: the low nibble of scales byte g,
 * or the high one of byte g - 8; bits 2 (g / 4) .. +1 of byte 8 + g % 4
 * on top). u: the block's 3 scale vectors. */
INL __m256i q3x8_scale(const __m256i *u, int g) {
    const __m256i b = lane_byte(u[g % 8 / 4], g % 4);
    const __m256i low = g < 8 ? _mm256_and_si256(b, _mm256_set1_epi32(15)) : _mm256_srli_epi32(b, 4);
    const __m256i top = _mm256_and_si256(_mm256_srli_epi32(lane_byte(u[2], g % 4), 2 * (g / 4)), _mm256_set1_epi32(3));
    const __m256i sc = _mm256_sub_epi32(_mm256_or_si256(low, _mm256_slli_epi32(top, 4)), _mm256_set1_epi32(32));
    return _mm256_and_si256(sc, _mm256_set1_epi32(0xFFFF));
}

/* Bit j of each byte of v moved to bit 2 (4 or 0): 16-bit shifts of at
 * most 5 places, so bit 2 comes from the same byte. */
INL __m256i bit_to_2(__m256i v, const int j) {
    const __m256i at2 = j > 2 ? _mm256_srli_epi16(v, j - 2) : j < 2 ? _mm256_slli_epi16(v, 2 - j) : v;
    return _mm256_and_si256(at2, _mm256_set1_epi8(4));
}

INL void q3kx8_tile(const kq_args *a, const bool vnni, const bool evex, int r0, int tok) {
    const int nb = a->x->nb;
    const uint8_t *grp = (const uint8_t *)a->w + (size_t)r0 * a->row_bytes;
    const __m256i m3 = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *o = grp + (size_t)b * KT_Q3KX8_BLOCK_BYTES;
        lx8_prefetch(a, o, KT_Q3KX8_BLOCK_BYTES);
        const size_t i = (size_t)tok * nb + b;
        const int8_t *xq = a->x->qs + i * QK_K;
        const int16_t *bs = a->x->bsums + i * 16;
        __m256i u[3], isum = _mm256_setzero_si256();
#pragma GCC unroll 3
        for (int k = 0; k < 3; k++) u[k] = _mm256_loadu_si256((const __m256i *)(o + KT_Q3KX8_SCALES + 32 * k));
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            /* qs vector 8h + c: values 128h + 32k + 4c .. +3 in bits 2k, their
             * third bits bit 4h + k of hmask vector c; group 8h + 2k + c / 4 */
            __m256i s[4][2];
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) s[k][0] = s[k][1] = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(o + KT_Q3KX8_QS + 32 * (8 * h + c)));
                const __m256i hm = _mm256_loadu_si256((const __m256i *)(o + 32 * c));
#pragma GCC unroll 4
                for (int k = 0; k < 4; k++) {
                    const __m256i q = _mm256_or_si256(_mm256_and_si256(k ? _mm256_srli_epi16(v, 2 * k) : v, m3),
                                                      bit_to_2(hm, 4 * h + k));
                    s[k][c / 4] = lx8_dot(vnni, evex, s[k][c / 4], q, xq + 128 * h + 32 * k + 4 * c);
                }
            }
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++)
#pragma GCC unroll 2
                for (int e = 0; e < 2; e++) {
                    const int g = 8 * h + 2 * k + e;
                    __m256i sg = vnni ? s[k][e] : _mm256_madd_epi16(s[k][e], _mm256_set1_epi16(1));
                    sg = _mm256_sub_epi32(sg, _mm256_set1_epi32(4 * bs[g])); /* sum (q - 4) x */
                    isum = _mm256_add_epi32(isum, _mm256_madd_epi16(sg, q3x8_scale(u, g)));
                }
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(o + KT_Q3KX8_D)));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d, _mm256_set1_ps(a->x->d[i])), acc);
    }
    _mm256_storeu_ps(a->out + (size_t)tok * a->n_out + r0, acc);
}

static void q3kx8_avx2(const kq_args *a, int r0, int tok) { q3kx8_tile(a, false, false, r0, tok); }
static void q3kx8_vnni(const kq_args *a, int r0, int tok) { q3kx8_tile(a, true, false, r0, tok); }
TARGET_512 static void q3kx8_evex(const kq_args *a, int r0, int tok) { q3kx8_tile(a, true, true, r0, tok); }

INL void iq4xsx8_tile(const kq_args *a, const bool vnni, const bool evex, int r0, int tok) {
    const int nb = a->x->nb;
    const uint8_t *grp = (const uint8_t *)a->w + (size_t)r0 * a->row_bytes;
    const __m256i low = _mm256_set1_epi8(0x0F);
    const __m256i values = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)KT_IQ4NL_VALUES));
    const __m256i tab = vnni ? _mm256_xor_si256(values, _mm256_set1_epi8((char)0x80)) : values; /* u or the value */
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *o = grp + (size_t)b * KT_IQ4XSX8_BLOCK_BYTES;
        lx8_prefetch(a, o, KT_IQ4XSX8_BLOCK_BYTES);
        const size_t i = (size_t)tok * nb + b;
        const int8_t *xq = a->x->qs + i * QK_K;
        const int16_t *bs = a->x->bsums + i * 16;
        /* ls_j = nibble j of the scales_l word | bits 2j, 2j+1 of scales_h << 4 */
        const __m256i sl = _mm256_loadu_si256((const __m256i *)(o + KT_IQ4XSX8_SCALES_L));
        const __m256i sh = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(o + KT_IQ4XSX8_SCALES_H)));
        __m256i isum = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            const __m256i ls = _mm256_sub_epi32(
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(sl, 4 * j), _mm256_set1_epi32(15)),
                                _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(sh, 2 * j), _mm256_set1_epi32(3)), 4)),
                _mm256_set1_epi32(32));
            /* vector 4j + c: values 32j + 4c .. +3 (low nibbles), 32j + 16 + 4c .. (high) */
            __m256i sj = _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(o + 32 * (4 * j + c)));
                const __m256i lo = _mm256_shuffle_epi8(tab, _mm256_and_si256(v, low));
                const __m256i hi = _mm256_shuffle_epi8(tab, _mm256_and_si256(_mm256_srli_epi16(v, 4), low));
                const int8_t *xl = xq + 32 * j + 4 * c, *xh = xl + 16;
                if (vnni) {
                    sj = lx8_dot(true, evex, sj, lo, xl);
                    sj = lx8_dot(true, evex, sj, hi, xh);
                } else { /* |value| x sign(x, value): pairs <= 2 x 127 x 127, widened apart */
                    int32_t x4l, x4h;
                    memcpy(&x4l, xl, 4);
                    memcpy(&x4h, xh, 4);
                    const __m256i pl = _mm256_maddubs_epi16(_mm256_sign_epi8(lo, lo), _mm256_sign_epi8(_mm256_set1_epi32(x4l), lo));
                    const __m256i ph = _mm256_maddubs_epi16(_mm256_sign_epi8(hi, hi), _mm256_sign_epi8(_mm256_set1_epi32(x4h), hi));
                    sj = _mm256_add_epi32(sj, _mm256_add_epi32(_mm256_madd_epi16(pl, _mm256_set1_epi16(1)),
                                                               _mm256_madd_epi16(ph, _mm256_set1_epi16(1))));
                }
            }
            if (vnni) sj = _mm256_sub_epi32(sj, _mm256_set1_epi32(128 * (bs[2 * j] + bs[2 * j + 1])));
            isum = _mm256_add_epi32(isum, _mm256_mullo_epi32(sj, ls));
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(o + KT_IQ4XSX8_D)));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d, _mm256_set1_ps(a->x->d[i])), acc);
    }
    _mm256_storeu_ps(a->out + (size_t)tok * a->n_out + r0, acc);
}

static void iq4xsx8_avx2(const kq_args *a, int r0, int tok) { iq4xsx8_tile(a, false, false, r0, tok); }
static void iq4xsx8_vnni(const kq_args *a, int r0, int tok) { iq4xsx8_tile(a, true, false, r0, tok); }
TARGET_512 static void iq4xsx8_evex(const kq_args *a, int r0, int tok) { iq4xsx8_tile(a, true, true, r0, tok); }

/* More than one token: each block's 64 level vectors are unpacked once
 * into lv, vector n in the lanes' order of activation bytes 4n .. 4n+3
 * (Q2_K, Q3_K: n = 32h + 8k + c, group n / 4; IQ4_XS: n = 8j + c for
 * the low nibbles, 8j + 4 + c the high, sub-block n / 8), and the scales
 * once, then every token of the tile takes the same integer sums and
 * float steps as the one-token tiles above. */
#define LX8_TOKENS 4

INL void lx8_levels(const kt_dtype t, const bool vnni, const uint8_t *o, __m256i *lv) {
    const __m256i m3 = _mm256_set1_epi8(3), low = _mm256_set1_epi8(0x0F);
    if (t == KT_IQ4_XS) {
        const __m256i values = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)KT_IQ4NL_VALUES));
        const __m256i tab = vnni ? _mm256_xor_si256(values, _mm256_set1_epi8((char)0x80)) : values;
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++)
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(o + 32 * (4 * j + c)));
                lv[8 * j + c] = _mm256_shuffle_epi8(tab, _mm256_and_si256(v, low));
                lv[8 * j + 4 + c] = _mm256_shuffle_epi8(tab, _mm256_and_si256(_mm256_srli_epi16(v, 4), low));
            }
        return;
    }
    const size_t qs = t == KT_Q3_K ? KT_Q3KX8_QS : 0;
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++)
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(o + qs + 32 * (8 * h + c)));
            const __m256i hm = t == KT_Q3_K ? _mm256_loadu_si256((const __m256i *)(o + 32 * c)) : v;
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                __m256i q = _mm256_and_si256(k ? _mm256_srli_epi16(v, 2 * k) : v, m3);
                if (t == KT_Q3_K) q = _mm256_or_si256(q, bit_to_2(hm, 4 * h + k));
                lv[32 * h + 8 * k + c] = q;
            }
        }
}

/* One block of a group, unpacked: its levels, scales (Q2_K, Q3_K: the 16
 * group scales as (sc, 0) pairs; IQ4_XS: the 8 ls - 32), Q2_K's min
 * pairs, d and dmin. */
typedef struct lx8_block {
    __m256i lv[64], sc[16], mp[8];
    __m256 d, dmin;
} lx8_block;

INL void lx8_unpack(const kt_dtype t, const bool vnni, const uint8_t *o, lx8_block *u) {
    lx8_levels(t, vnni, o, u->lv);
    if (t == KT_Q2_K) {
        __m256i w[4];
        for (int k = 0; k < 4; k++) w[k] = _mm256_loadu_si256((const __m256i *)(o + KT_Q2KX8_SCALES + 32 * k));
        for (int g = 0; g < 16; g++) u->sc[g] = q2x8_scale(w, g);
        for (int p = 0; p < 8; p++) u->mp[p] = q2x8_min_pair(w, p);
        u->d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(o + KT_Q2KX8_D)));
        u->dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(o + KT_Q2KX8_DMIN)));
    } else if (t == KT_Q3_K) {
        __m256i w[3];
        for (int k = 0; k < 3; k++) w[k] = _mm256_loadu_si256((const __m256i *)(o + KT_Q3KX8_SCALES + 32 * k));
        for (int g = 0; g < 16; g++) u->sc[g] = q3x8_scale(w, g);
        u->d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(o + KT_Q3KX8_D)));
    } else {
        const __m256i sl = _mm256_loadu_si256((const __m256i *)(o + KT_IQ4XSX8_SCALES_L));
        const __m256i sh = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(o + KT_IQ4XSX8_SCALES_H)));
        for (int j = 0; j < 8; j++)
            u->sc[j] = _mm256_sub_epi32(
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(sl, 4 * j), _mm256_set1_epi32(15)),
                                _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(sh, 2 * j), _mm256_set1_epi32(3)), 4)),
                _mm256_set1_epi32(32));
        u->d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(o + KT_IQ4XSX8_D)));
    }
}

/* Block b (unpacked in u) for tokens tok .. tok+T-1, continuing their
 * accumulators acc[k] (8 rows each): each level vector loaded once for
 * the T tokens. */
INL void lx8_tokens(const kq_args *a, const kt_dtype t, const bool vnni, const bool evex, const int T,
                    const lx8_block *u, int b, int tok, float (*acc)[KQ_ROWS]) {
    const int nb = a->x->nb;
    const int8_t *xq[LX8_TOKENS];
    const int16_t *bs[LX8_TOKENS];
    __m256i isum[LX8_TOKENS];
#pragma GCC unroll 4
    for (int k = 0; k < T; k++) {
        const size_t i = (size_t)(tok + k) * nb + b;
        xq[k] = a->x->qs + i * QK_K;
        bs[k] = a->x->bsums + i * 16;
        isum[k] = _mm256_setzero_si256();
    }
    const int run = t == KT_IQ4_XS ? 8 : 4; /* vectors per scale */
    for (int g = 0; g < 64 / run; g++) {
        __m256i sg[LX8_TOKENS];
#pragma GCC unroll 4
        for (int k = 0; k < T; k++) sg[k] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int n = run * g; n < run * g + run; n++) {
            const __m256i q = _mm256_load_si256(&u->lv[n]);
            if (t == KT_IQ4_XS && !vnni) { /* |value| x sign(x, value), widened at once */
                const __m256i aq = _mm256_sign_epi8(q, q);
#pragma GCC unroll 4
                for (int k = 0; k < T; k++) {
                    int32_t x4;
                    memcpy(&x4, xq[k] + 4 * n, 4);
                    const __m256i p = _mm256_maddubs_epi16(aq, _mm256_sign_epi8(_mm256_set1_epi32(x4), q));
                    sg[k] = _mm256_add_epi32(sg[k], _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
                }
            } else {
#pragma GCC unroll 4
                for (int k = 0; k < T; k++) sg[k] = lx8_dot(vnni, evex, sg[k], q, xq[k] + 4 * n);
            }
        }
#pragma GCC unroll 4
        for (int k = 0; k < T; k++) {
            if (t == KT_IQ4_XS) {
                if (vnni) sg[k] = _mm256_sub_epi32(sg[k], _mm256_set1_epi32(128 * (bs[k][2 * g] + bs[k][2 * g + 1])));
                isum[k] = _mm256_add_epi32(isum[k], _mm256_mullo_epi32(sg[k], u->sc[g]));
            } else if (t == KT_Q2_K) {
                isum[k] = _mm256_add_epi32(isum[k], lx8_scaled(vnni, sg[k], u->sc[g]));
            } else {
                __m256i s32 = vnni ? sg[k] : _mm256_madd_epi16(sg[k], _mm256_set1_epi16(1));
                s32 = _mm256_sub_epi32(s32, _mm256_set1_epi32(4 * bs[k][g])); /* sum (q - 4) x */
                isum[k] = _mm256_add_epi32(isum[k], _mm256_madd_epi16(s32, u->sc[g]));
            }
        }
    }
#pragma GCC unroll 4
    for (int k = 0; k < T; k++) {
        const __m256 dx = _mm256_set1_ps(a->x->d[(size_t)(tok + k) * nb + b]);
        __m256 ac = _mm256_load_ps(acc[k]);
        ac = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[k]), _mm256_mul_ps(u->d, dx), ac);
        if (t == KT_Q2_K) {
            __m256i imin = _mm256_setzero_si256();
            tile_offset(1, u->mp, &bs[k], &imin);
            ac = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_setzero_si256(), imin)),
                                 _mm256_mul_ps(u->dmin, dx), ac);
        }
        _mm256_store_ps(acc[k], ac);
    }
}

/* Rows r .. r+7 times tokens c0 .. c1-1 (c1 - c0 <= KQ_CHUNK): per block,
 * unpacked once, every token in tiles of LX8_TOKENS; the accumulators
 * stay in acc between blocks, each output's blocks in order. */
INL void lx8_rows(const kq_args *a, const kt_dtype t, const bool vnni, const bool evex, int r, int c0, int c1) {
    const int bb = t == KT_Q2_K ? KT_Q2KX8_BLOCK_BYTES : t == KT_Q3_K ? KT_Q3KX8_BLOCK_BYTES : KT_IQ4XSX8_BLOCK_BYTES;
    const uint8_t *grp = (const uint8_t *)a->w + (size_t)r * a->row_bytes;
    _Alignas(32) float acc[KQ_CHUNK][KQ_ROWS];
    lx8_block u;
    memset(acc, 0, sizeof(float) * KQ_ROWS * (size_t)(c1 - c0));
    for (int b = 0; b < a->x->nb; b++) {
        lx8_unpack(t, vnni, grp + (size_t)b * bb, &u);
        int tok = c0;
        for (; tok + LX8_TOKENS <= c1; tok += LX8_TOKENS) lx8_tokens(a, t, vnni, evex, LX8_TOKENS, &u, b, tok, acc + (tok - c0));
        for (; tok < c1; tok++) lx8_tokens(a, t, vnni, evex, 1, &u, b, tok, acc + (tok - c0));
    }
    for (int tok = c0; tok < c1; tok++) memcpy(a->out + (size_t)tok * a->n_out + r, acc[tok - c0], sizeof acc[0]);
}

typedef void (*lx8_tileT_fn)(const kq_args *a, int r, int c0, int c1);

#define LX8_TILES(ty, wt)                                                                                   \
    static void ty##_avx2_4(const kq_args *a, int r, int c0, int c1) { lx8_rows(a, wt, false, false, r, c0, c1); } \
    static void ty##_vnni_4(const kq_args *a, int r, int c0, int c1) { lx8_rows(a, wt, true, false, r, c0, c1); } \
    TARGET_512 static void ty##_evex_4(const kq_args *a, int r, int c0, int c1) { lx8_rows(a, wt, true, true, r, c0, c1); }
LX8_TILES(q2kx8, KT_Q2_K)
LX8_TILES(q3kx8, KT_Q3_K)
LX8_TILES(iq4xsx8, KT_IQ4_XS)

typedef void (*lx8_tile_fn)(const kq_args *a, int r0, int tok);

void kt_matmul_lowbit_x8_avx2(float *out, const void *w, kt_dtype wtype, const kt_q8k_act *x, int n_in,
                              int n_out, int n_tokens, int r0, int r1) {
    const kt_dtype plain = kt_repack_plain(wtype);
    const kq_args a = {w, kt_dtype_row_bytes(plain, n_in), kt_dtype_get(plain)->block_bytes, x, out, n_out};
    static const lx8_tile_fn Q2KX8[3] = {q2kx8_avx2, q2kx8_vnni, q2kx8_evex};
    static const lx8_tile_fn Q3KX8[3] = {q3kx8_avx2, q3kx8_vnni, q3kx8_evex};
    static const lx8_tile_fn IQ4XSX8[3] = {iq4xsx8_avx2, iq4xsx8_vnni, iq4xsx8_evex};
    const lx8_tile_fn *tiles = plain == KT_Q2_K ? Q2KX8 : plain == KT_Q3_K ? Q3KX8 : IQ4XSX8;
    static const lx8_tileT_fn Q2KX8_4[3] = {q2kx8_avx2_4, q2kx8_vnni_4, q2kx8_evex_4};
    static const lx8_tileT_fn Q3KX8_4[3] = {q3kx8_avx2_4, q3kx8_vnni_4, q3kx8_evex_4};
    static const lx8_tileT_fn IQ4XSX8_4[3] = {iq4xsx8_avx2_4, iq4xsx8_vnni_4, iq4xsx8_evex_4};
    const lx8_tileT_fn *tiles4 = plain == KT_Q2_K ? Q2KX8_4 : plain == KT_Q3_K ? Q3KX8_4 : IQ4XSX8_4;
    const int tier = kt_cpu_has_avx512_vnni() ? 2 : kt_cpu_has_avx_vnni() ? 1 : 0;
    if (n_tokens == 1) {
        for (int r = r0; r < r1; r += KT_X8_ROWS) tiles[tier](&a, r, 0);
        return;
    }
    for (int c0 = 0; c0 < n_tokens; c0 += KQ_CHUNK) {
        const int c1 = c0 + KQ_CHUNK < n_tokens ? c0 + KQ_CHUNK : n_tokens;
        for (int r = r0; r < r1; r += KT_X8_ROWS) tiles4[tier](&a, r, c0, c1);
    }
}
