/*
 * matmul_k_avx2.c - AVX2 matmul kernels for K-quant weights (Q4_K, Q5_K,
 * Q6_K) times Q8_K activations. The specification and scalar twin is
 * kt_kq_block_step (matmul_k.c, internal.h); these kernels form the same
 * exact integer sums with maddubs/madd and apply the same two fmaf steps
 * per block in the same block order, so they equal the reference bit for
 * bit, whatever the number of tokens or the thread split (batch
 * invariance: each output is one accumulator running over its row).
 *
 * Per weight block the 256 levels are unpacked into 8 vectors of 32
 * unsigned bytes (vector j = values 32j .. 32j+31) with, for each, an
 * int16 multiplier vector (the sub-block scale; Q6_K: two scales, one per
 * 128-bit half, since its scales cover 16 values). Then per token:
 *   isum = hsum( sum_j madd(maddubs(q_j, x_j), scale_j) )
 * maddubs pairs stay below 2 * 63 * 128 = 16128, so int16 never
 * saturates. Q6_K's levels are q + 32: the offset is taken off with the
 * activation's bsums, isum -= 32 * sum_g sc[g] * bsums[g]. Q4_K/Q5_K's
 * mins term imin = sum_j m[j] * (bsums[2j] + bsums[2j+1]) is one madd
 * (bsums against the mins, each repeated twice), reduced together with
 * isum. Scales are decoded with 32-bit masks and broadcast per vector with
 * byte shuffles.
 *
 * Decode (one token): rows one after another, the matrix streamed once;
 * each block prefetches the block PF_BYTES ahead in the stream. Prefill:
 * per row, tokens in tiles of KQ_TOKENS share each unpacked block (the row
 * stays in L1 across the tile loop), over chunks of tokens whose
 * activations stay in L2.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "base/fp16.h"
#include "ops/internal.h"
#include "ops/kquant.h"

#define INL static inline __attribute__((always_inline))

#define KQ_TOKENS 8              /* tokens per prefill tile */
#define PF_BYTES 1024            /* decode prefetch distance in the stream */
#define CHUNK_BYTES (256 * 1024) /* activation bytes per prefill pass */

typedef struct kq_block {
    __m256i q[8];  /* levels of values 32j .. 32j+31 */
    __m256i sc[8]; /* int16 multipliers of vector j */
    __m256i sc16;  /* Q6_K: the 16 scales as int16, for the offset */
    __m256i m2;    /* Q4_K/Q5_K: int16 lanes m[0], m[0], m[1], m[1], ... */
    float d, dmin;
} kq_block;

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

/* The 6-bit scales and mins of a Q4_K/Q5_K block into u (kt_kq_scale_min
 * on 32-bit words: u0, u1, u2 = bytes 0-3, 4-7, 8-11):
 *   sc[0..3] = u0 & 63            m[0..3] = u1 & 63
 *   sc[4..7] = (u2 & 15) | (u0 >> 6) << 4
 *   m[4..7]  = (u2 >> 4 & 15) | (u1 >> 6) << 4      (per byte) */
INL void unpack_scales(const uint8_t *q, kq_block *u) {
    uint32_t u0, u1, u2;
    memcpy(&u0, q, 4);
    memcpy(&u1, q + 4, 4);
    memcpy(&u2, q + 8, 4);
    const uint32_t sc_lo = u0 & 0x3f3f3f3f, m_lo = u1 & 0x3f3f3f3f;
    const uint32_t sc_hi = (u2 & 0x0f0f0f0f) | (((u0 >> 6) & 0x03030303) << 4);
    const uint32_t m_hi = ((u2 >> 4) & 0x0f0f0f0f) | (((u1 >> 6) & 0x03030303) << 4);
    const __m128i b = _mm_setr_epi32((int)sc_lo, (int)sc_hi, (int)m_lo, (int)m_hi);
    const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(b));
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) u->sc[j] = pick16(sc, j, j);
    const __m128i m = _mm_cvtepu8_epi16(_mm_srli_si128(b, 8));
    u->m2 = _mm256_set_m128i(_mm_unpackhi_epi16(m, m), _mm_unpacklo_epi16(m, m));
}

INL void unpack_q4_K(const block_q4_K *blk, kq_block *u) {
    const __m256i low = _mm256_set1_epi8(0x0F);
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(blk->qs + 32 * k));
        u->q[2 * k] = _mm256_and_si256(q, low);
        u->q[2 * k + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
    }
    unpack_scales(blk->scales, u);
    u->d = half_at(&blk->d);
    u->dmin = half_at(&blk->dmin);
}

/* Q5_K: bit 2k of qh[l] is the fifth bit of value 64k + l, bit 2k+1 that
 * of value 64k + 32 + l; shifted down to bit 0, masked, moved to bit 4. */
INL void unpack_q5_K(const block_q5_K *blk, kq_block *u) {
    const __m256i low = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    const __m256i qh = _mm256_loadu_si256((const __m256i *)blk->qh);
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(blk->qs + 32 * k));
        const __m256i h0 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * k)), one);
        const __m256i h1 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * k + 1)), one);
        u->q[2 * k] = _mm256_or_si256(_mm256_and_si256(q, low), _mm256_slli_epi16(h0, 4));
        u->q[2 * k + 1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), low),
                                          _mm256_slli_epi16(h1, 4));
    }
    unpack_scales(blk->scales, u);
    u->d = half_at(&blk->d);
    u->dmin = half_at(&blk->dmin);
}

/* Q6_K: per half h, vector 4h+k holds values 128h + 32k .. +31: low bits
 * from ql (low nibbles of ql[0..31] for k = 0, of ql[32..63] for k = 1,
 * high nibbles for k = 2, 3), high bits from qh bits 2k, 2k+1 (moved to
 * bits 4, 5; the 16-bit shifts only move a byte's own bits into 4-5). */
INL void unpack_q6_K(const block_q6_K *blk, kq_block *u) {
    const __m256i low = _mm256_set1_epi8(0x0F), hi2 = _mm256_set1_epi8(0x30);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m256i qa = _mm256_loadu_si256((const __m256i *)(blk->ql + 64 * h));
        const __m256i qb = _mm256_loadu_si256((const __m256i *)(blk->ql + 64 * h + 32));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk->qh + 32 * h));
        u->q[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(qa, low),
                                          _mm256_and_si256(_mm256_slli_epi16(qh, 4), hi2));
        u->q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(qb, low),
                                          _mm256_and_si256(_mm256_slli_epi16(qh, 2), hi2));
        u->q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qa, 4), low),
                                          _mm256_and_si256(qh, hi2));
        u->q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qb, 4), low),
                                          _mm256_and_si256(_mm256_srli_epi16(qh, 2), hi2));
    }
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

INL void unpack(const kt_dtype t, const char *row, int b, kq_block *u) {
    if (t == KT_Q4_K) unpack_q4_K((const block_q4_K *)row + b, u);
    else if (t == KT_Q5_K) unpack_q5_K((const block_q5_K *)row + b, u);
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
        s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(u->q[j], x), u->sc[j]));
    }
    if (t == KT_Q6_K) {
        const __m256i off = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)bs), u->sc16);
        s = _mm256_sub_epi32(s, _mm256_slli_epi32(off, 5));
        return fmaf((float)hsum_epi32(s), u->d * dx, acc);
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

/* Row r times tokens t0 .. t0+T-1 (T a constant after inlining). */
INL void kq_tile(const kq_args *a, const kt_dtype t, const int T, int r, int t0) {
    const int nb = a->x->nb;
    const char *row = a->w + (size_t)r * a->row_bytes;
    float acc[KQ_TOKENS] = {0};
    for (int b = 0; b < nb; b++) {
        if (T == 1) {
            const char *p = row + (size_t)b * a->block_bytes + PF_BYTES;
            _mm_prefetch(p, _MM_HINT_T0);
            _mm_prefetch(p + 64, _MM_HINT_T0);
            _mm_prefetch(p + 128, _MM_HINT_T0);
            if (a->block_bytes > 192) _mm_prefetch(p + 192, _MM_HINT_T0);
        }
        kq_block u;
        unpack(t, row, b, &u);
#pragma GCC unroll 4
        for (int k = 0; k < T; k++) {
            const size_t i = (size_t)(t0 + k) * nb + b;
            acc[k] = block_step(t, &u, a->x->qs + i * QK_K, a->x->d[i], a->x->bsums + i * 16,
                                acc[k]);
        }
    }
#pragma GCC unroll 4
    for (int k = 0; k < T; k++) a->out[(size_t)(t0 + k) * a->n_out + r] = acc[k];
}

#define KQ_KERNELS(ty, wt)                                                               \
    static void ty##_one(const kq_args *a, int r, int t0) { kq_tile(a, wt, 1, r, t0); }   \
    static void ty##_tile(const kq_args *a, int r, int t0) {                              \
        kq_tile(a, wt, KQ_TOKENS, r, t0);                                                 \
    }
KQ_KERNELS(q4k, KT_Q4_K)
KQ_KERNELS(q5k, KT_Q5_K)
KQ_KERNELS(q6k, KT_Q6_K)

typedef void (*kq_fn)(const kq_args *a, int r, int t0);

void kt_matmul_kq_avx2(float *out, const void *w, kt_dtype wtype, const kt_q8k_act *x,
                       int n_in, int n_out, int n_tokens, int r0, int r1) {
    kq_fn one = q4k_one, tile = q4k_tile;
    if (wtype == KT_Q5_K) {
        one = q5k_one;
        tile = q5k_tile;
    } else if (wtype == KT_Q6_K) {
        one = q6k_one;
        tile = q6k_tile;
    }
    const size_t bb = (size_t)kt_dtype_get(wtype)->block_bytes;
    kq_args a = {w, kt_dtype_row_bytes(wtype, n_in), bb, x, out, n_out};
    int chunk = CHUNK_BYTES / (n_in + 1);
    chunk = chunk < KQ_TOKENS ? KQ_TOKENS : chunk / KQ_TOKENS * KQ_TOKENS;
    for (int c0 = 0; c0 < n_tokens; c0 += chunk) {
        const int c1 = c0 + chunk < n_tokens ? c0 + chunk : n_tokens;
        for (int r = r0; r < r1; r++) {
            int t = c0;
            for (; t + KQ_TOKENS <= c1; t += KQ_TOKENS) tile(&a, r, t);
            for (; t < c1; t++) one(&a, r, t);
        }
    }
}
