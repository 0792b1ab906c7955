/*
 * matmul_avx2.c - AVX2/FMA/F16C matmul kernels and the activation
 * quantizer; the scalar twins and the specification are in matmul.c and
 * quant.c. Compiled with -mavx2 -mfma -mf16c, called only when
 * kt_cpu_has_avx2().
 *
 * Every output element (row r, token t) is computed the same way in every
 * path, so results are batch-invariant (see matmul.c):
 *
 *   quantized weights:  acc = 0 (8 float lanes)
 *                       for each block b in order:
 *                         lanes = isum of 4 consecutive products each
 *                         acc = fma(float(lanes), d_w * d_x, acc)
 *                       out = hsum8(acc)
 *   float weights:      acc = 0 (8 float lanes)
 *                       for each 8 values i in order: acc = fma(w, x, acc)
 *                       out = hsum8(acc) + (the n_in % 8 tail, fmaf in order)
 *
 * Tiles only change how many (r, t) accumulators are live at once -- each
 * weight block loaded is used for T tokens from registers, each activation
 * block for R rows -- never the operations applied to one accumulator.
 * The integer lanes are exact, so how they are computed (see idot_q8 and
 * idot_q4) may differ between paths without changing a bit of the result.
 *
 * Decode (one token) is memory-bound: GEMV_ROWS rows at a time share each
 * activation load, and software prefetch fetches the next group of rows
 * (measured: 1.5-3x over relying on the hardware prefetcher here).
 * Prefill tiles QT_ROWS x QT_TOKENS outputs over chunks of TOKEN_CHUNK
 * tokens, so a weight block is unpacked once per 3 tokens and comes from L1
 * for the rest of the chunk.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ops/internal.h"
#include "ops/quant.h"

#define INL static inline __attribute__((always_inline))

/* Tile shapes (measured on Zen; 4 x 3 beat 3 x 3, 4 x 2, 2 x 4, 3 x 4 and
 * 4 x 4 -- 12 accumulators leave registers for the operands). */
#define GEMV_ROWS 4     /* float weights: rows per step when n_tokens == 1 */
#define FT_ROWS 4       /* GEMM tile, float weights */
#define FT_TOKENS 3
#ifndef TOKEN_CHUNK
#define TOKEN_CHUNK 48
#endif
//  /* tokens whose activations stay in L2 per pass (multiple of QT and FT_TOKENS) */

/* The fixed horizontal sum of 8 lanes: (0+4, 1+5, 2+6, 3+7), then pairs. */
INL float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* ---- activation quantizer (bit-identical to kt_quantize_act_q8_ref) -- */

/* roundf(v) exactly (half away from zero): trunc, then step away from zero
 * if the dropped fraction is at least 1/2. v - trunc(v) is exact. */
INL __m256 round_half_away(__m256 v) {
    const __m256 sign_mask = _mm256_set1_ps(-0.0f);
    __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256 frac = _mm256_andnot_ps(sign_mask, _mm256_sub_ps(v, t));
    __m256 step = _mm256_and_ps(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ),
                                _mm256_or_ps(_mm256_set1_ps(1.0f), _mm256_and_ps(v, sign_mask)));
    return _mm256_add_ps(t, step);
}

void kt_quantize_act_q8_avx2(const float *x, int64_t n, int8_t *qs, float *d, int32_t *c8) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t i = 0; i < n / QK8_0; i++) {
        const float *xb = x + i * QK8_0;
        __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
        __m256 v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v0, abs_mask), _mm256_and_ps(v1, abs_mask)),
                                 _mm256_max_ps(_mm256_and_ps(v2, abs_mask), _mm256_and_ps(v3, abs_mask)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const float di = amax / 127;
        const float id = di ? 1.0f / di : 0.0f;
        d[i] = _cvtsh_ss(_cvtss_sh(di, _MM_FROUND_TO_NEAREST_INT));

        const __m256 vid = _mm256_set1_ps(id);
        __m256i i0 = _mm256_cvtps_epi32(round_half_away(_mm256_mul_ps(v0, vid)));
        __m256i i1 = _mm256_cvtps_epi32(round_half_away(_mm256_mul_ps(v1, vid)));
        __m256i i2 = _mm256_cvtps_epi32(round_half_away(_mm256_mul_ps(v2, vid)));
        __m256i i3 = _mm256_cvtps_epi32(round_half_away(_mm256_mul_ps(v3, vid)));
        /* packs work within 128-bit lanes; the permute restores the order */
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(qs + i * QK8_0), p);
        __m256i s8 = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        c8[i] = 8 * _mm_cvtsi128_si32(s4);
    }
}

/* ---- quantized weights ----------------------------------------------
 *
 * One output per float lane: a vector holds 8 rows (QR) of one token. Per
 * block the 8 exact integer dot products land in 8 int32 lanes, then
 *   acc = fma(float(isum), d_w * d_x, acc)
 * -- the reference's operations exactly (matmul.c), in every path.
 *
 * GEMV (one token): the 8 rows' products are computed in the usual
 * layout (each row's 32 products spread over the lanes of its own vector)
 * and reduced with a tree of horizontal adds into one lane per row.
 *
 * GEMM: the 8 rows' blocks are first transposed into a panel (per block,
 * 8 vectors; vector q holds values 4q..4q+3 of each row in the row's lane),
 * so that one broadcast of 4 activation bytes against a panel vector gives
 * every row its partial sum in its own lane, with no reduction: per block
 * and token, 8 maddubs accumulate the whole dot product. The panel is built
 * once per row tile and chunk of tokens and reused for all of them.
 *
 * Integer products: maddubs multiplies unsigned by signed bytes.
 *  - Q4_0: the raw nibbles n (0..15) are the unsigned side, and
 *    sum (n - 8) x = sum n x - c8 (internal.h). The int16 pair sums are at
 *    most 2 * 15 * 127, so 8 of them still fit in int16 (30480): the GEMM
 *    accumulates a block in int16, and the GEMV's reduction tree stays in
 *    int16 until the last step.
 *  - Q8_0 (the sign trick): maddubs gets |w| and x with w's sign moved onto
 *    it; |w| <= 128 and |x| <= 127, so a pair sum fits int16 (32512) but two
 *    do not: widen with madd at once.
 */

#define QR 8           /* rows per vector: one per lane */
#ifndef QT
#define QT 4           /* tokens per GEMM tile */
#endif
#define Q_MIN_GEMM 4   /* fewer tokens than this: one GEMV per token */

/* Q8_0 weight block b of a row: 32 signed bytes in element order. */
INL __m256i load_q8_0(const char *row, int b) {
    const block_q8_0 *blk = (const block_q8_0 *)row + b;
    return _mm256_loadu_si256((const __m256i *)blk->qs);
}

/* Q4_0 weight block b of a row: its 32 nibbles (0..15, not minus 8) in
 * element order. The 16 bytes are broadcast to both halves, the high half
 * shifted right by 4, and the mask keeps low nibbles (elements 0..15) then
 * high nibbles (16..31). */
INL __m256i load_q4_0(const char *row, int b) {
    const block_q4_0 *blk = (const block_q4_0 *)row + b;
    __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)blk->qs));
    v = _mm256_srlv_epi64(v, _mm256_set_epi64x(4, 4, 0, 0));
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

INL uint64_t half_bits(const void *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return h;
}

/* The fp16 scales of block b of 8 rows as 8 floats: gathered with integer
 * loads, converted with one vcvtph2ps. */
INL __m256 row_scales8(const char *const *rows, size_t block_bytes, int b) {
    uint64_t lo = 0, hi = 0;
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
        lo |= half_bits(rows[r] + (size_t)b * block_bytes) << (16 * r);
        hi |= half_bits(rows[r + 4] + (size_t)b * block_bytes) << (16 * r);
    }
    return _mm256_cvtph_ps(_mm_set_epi64x((long long)hi, (long long)lo));
}

/* GEMV, Q4_0: lane r = sum n x of row r's block b (before - c8). The int16
 * tree: hadd 8 -> 4 -> 2 -> 1 vectors leaves, in each 128-bit half, the 8
 * rows' sums over that half's 16 products; widen and add the halves. */
INL __m256i q4_dot8(const char *const *rows, int b, __m256i x) {
    __m256i m[QR];
#pragma GCC unroll 8
    for (int r = 0; r < QR; r++) m[r] = _mm256_maddubs_epi16(load_q4_0(rows[r], b), x);
    __m256i h01 = _mm256_hadd_epi16(m[0], m[1]), h23 = _mm256_hadd_epi16(m[2], m[3]);
    __m256i h45 = _mm256_hadd_epi16(m[4], m[5]), h67 = _mm256_hadd_epi16(m[6], m[7]);
    __m256i h = _mm256_hadd_epi16(_mm256_hadd_epi16(h01, h23), _mm256_hadd_epi16(h45, h67));
    return _mm256_add_epi32(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(h)),
                            _mm256_cvtepi16_epi32(_mm256_extracti128_si256(h, 1)));
}

/* GEMV, Q8_0: lane r = isum of row r's block b. Each row widened to int32
 * at once, then hadd 8 -> 4 -> 2 vectors (rows 0-3 and 4-7, each half of
 * a vector summing that half's lanes) and the halves put together. */
INL __m256i q8_dot8(const char *const *rows, int b, __m256i x) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i p[QR];
#pragma GCC unroll 8
    for (int r = 0; r < QR; r++) {
        const __m256i w = load_q8_0(rows[r], b);
        p[r] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)), ones);
    }
    __m256i h0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    __m256i h4567 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(h0123, h4567, 0x20),
                            _mm256_permute2x128_si256(h0123, h4567, 0x31));
}

typedef struct q_args {
    const char *w;       /* row 0 of the matrix */
    size_t row_bytes;
    const kt_q8_act *x;
    float *out;
    int n_out;
    int8_t *panel;       /* GEMM: nb * 8 vectors of 32 bytes */
    float *panel_d;      /* GEMM: nb * 8 row scales */
} q_args;

/* The first n lanes of v to p. */
INL void store_lanes(float *p, __m256 v, int n) {
    if (n == QR) {
        _mm256_storeu_ps(p, v);
        return;
    }
    float buf[QR];
    _mm256_storeu_ps(buf, v);
    for (int i = 0; i < n; i++) p[i] = buf[i];
}

/* Rows r0 .. r0+nr-1 (nr <= 8) as 8 row pointers; the missing ones repeat
 * the last row, whose lanes are computed and not stored. */
INL void tile_rows(const q_args *a, int r0, int nr, const char **rows) {
#pragma GCC unroll 8
    for (int r = 0; r < QR; r++) rows[r] = a->w + (size_t)(r0 + (r < nr ? r : nr - 1)) * a->row_bytes;
}

/* GEMV: outputs r0 .. r0+nr-1 of token t. */
INL void q_gemv8(const q_args *a, const int q4, int r0, int nr, int t) {
    const int nb = a->x->nb;
    const size_t bb = q4 ? sizeof(block_q4_0) : sizeof(block_q8_0);
    const char *rows[QR];
    tile_rows(a, r0, nr, rows);
    const int8_t *xq = a->x->qs + (size_t)t * nb * QK8_0;
    const float *xd = a->x->d + (size_t)t * nb;
    const int32_t *xc = a->x->c8 + (size_t)t * nb;
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        /* the matrix streams through once: fetch the same block of the next
         * 8 rows (right after these in memory) a group ahead -- the
         * hardware prefetcher alone does not keep up with 8 short streams.
         * Q4_0 blocks are 18 bytes: every other block covers each line. */
        if (!q4 || (b & 1) == 0) {
#pragma GCC unroll 8
            for (int r = 0; r < QR; r++)
                _mm_prefetch(rows[r] + (size_t)b * bb + QR * a->row_bytes, _MM_HINT_T0);
        }
        const __m256i x = _mm256_load_si256((const __m256i *)(xq + (size_t)b * QK8_0));
        const __m256i isum = q4 ? _mm256_sub_epi32(q4_dot8(rows, b, x), _mm256_set1_epi32(xc[b]))
                                : q8_dot8(rows, b, x);
        const __m256 scale = _mm256_mul_ps(row_scales8(rows, bb, b), _mm256_set1_ps(xd[b]));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc);
    }
    store_lanes(a->out + (size_t)t * a->n_out + r0, acc, nr);
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

/* The panel of rows r0 .. r0+nr-1: per block, the 8 rows' values
 * transposed (Q4_0: raw nibbles) and their scales as floats. */
INL void q_build_panel(const q_args *a, const int q4, int r0, int nr) {
    const int nb = a->x->nb;
    const size_t bb = q4 ? sizeof(block_q4_0) : sizeof(block_q8_0);
    const char *rows[QR];
    tile_rows(a, r0, nr, rows);
    for (int b = 0; b < nb; b++) {
        __m256i v[QR];
#pragma GCC unroll 8
        for (int r = 0; r < QR; r++) v[r] = q4 ? load_q4_0(rows[r], b) : load_q8_0(rows[r], b);
        transpose8_epi32(v);
#pragma GCC unroll 8
        for (int q = 0; q < QR; q++)
            _mm256_store_si256((__m256i *)(a->panel + ((size_t)b * QR + q) * 32), v[q]);
        _mm256_store_ps(a->panel_d + (size_t)b * QR, row_scales8(rows, bb, b));
    }
}

/* GEMM: outputs (panel rows) x tokens t0 .. t0+nt-1 (nt <= QT; missing
 * tokens repeat the last and are not stored). */
INL void q_gemm_tile(const q_args *a, const int q4, int r0, int nr, int t0, int nt) {
    const int nb = a->x->nb;
    const int8_t *xq[QT];
    const float *xd[QT];
    const int32_t *xc[QT];
#pragma GCC unroll 4
    for (int t = 0; t < QT; t++) {
        const size_t k = (size_t)(t0 + (t < nt ? t : nt - 1)) * nb;
        xq[t] = a->x->qs + k * QK8_0;
        xd[t] = a->x->d + k;
        xc[t] = a->x->c8 + k;
    }
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[QT];
#pragma GCC unroll 4
    for (int t = 0; t < QT; t++) acc[t] = _mm256_setzero_ps();

    for (int b = 0; b < nb; b++) {
        const int8_t *pb = a->panel + (size_t)b * QR * 32;
        __m256i isum[QT];
#pragma GCC unroll 4
        for (int t = 0; t < QT; t++) isum[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int q = 0; q < QR; q++) {
            const __m256i p = _mm256_load_si256((const __m256i *)(pb + q * 32));
            const __m256i ap = q4 ? p : _mm256_sign_epi8(p, p);
#pragma GCC unroll 4
            for (int t = 0; t < QT; t++) {
                int32_t x4;
                memcpy(&x4, xq[t] + (size_t)b * QK8_0 + 4 * q, 4);
                const __m256i xb = _mm256_set1_epi32(x4); /* values 4q..4q+3, every lane */
                if (q4)
                    isum[t] = _mm256_add_epi16(isum[t], _mm256_maddubs_epi16(p, xb));
                else
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(
                        _mm256_maddubs_epi16(ap, _mm256_sign_epi8(xb, p)), ones));
            }
        }
        const __m256 dw = _mm256_load_ps(a->panel_d + (size_t)b * QR);
#pragma GCC unroll 4
        for (int t = 0; t < QT; t++) {
            const __m256i is = q4 ? _mm256_sub_epi32(_mm256_madd_epi16(isum[t], ones),
                                                     _mm256_set1_epi32(xc[t][b]))
                                  : isum[t];
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(dw, _mm256_set1_ps(xd[t][b])),
                                     acc[t]);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < QT; t++)
        if (t < nt) store_lanes(a->out + (size_t)(t0 + t) * a->n_out + r0, acc[t], nr);
}

/* One function per kernel and type (q4: 0 = Q8_0, 1 = Q4_0). */
static void q8_gemv(const q_args *a, int r0, int nr, int t) { q_gemv8(a, 0, r0, nr, t); }
static void q4_gemv(const q_args *a, int r0, int nr, int t) { q_gemv8(a, 1, r0, nr, t); }
static void q8_panel(const q_args *a, int r0, int nr) { q_build_panel(a, 0, r0, nr); }
static void q4_panel(const q_args *a, int r0, int nr) { q_build_panel(a, 1, r0, nr); }
static void q8_tile(const q_args *a, int r0, int nr, int t0, int nt) { q_gemm_tile(a, 0, r0, nr, t0, nt); }
static void q4_tile(const q_args *a, int r0, int nr, int t0, int nt) { q_gemm_tile(a, 1, r0, nr, t0, nt); }

size_t kt_matmul_panel_bytes(int n_in) {
    size_t nb = (size_t)(n_in / QK8_0);
    return nb * QR * 32 + nb * QR * sizeof(float); /* a multiple of 64 */
}

/* Rows [r0, r1) of every token: GEMV per token for few tokens; otherwise,
 * per chunk of TOKEN_CHUNK tokens and 8 rows, a panel, then QT tokens at a
 * time against it. */
static void q_rows(q_args *a, int q4, int n_tokens, int r0, int r1, void *panel) {
    void (*gemv)(const q_args *, int, int, int) = q4 ? q4_gemv : q8_gemv;
    void (*build)(const q_args *, int, int) = q4 ? q4_panel : q8_panel;
    void (*tile)(const q_args *, int, int, int, int) = q4 ? q4_tile : q8_tile;
    if (n_tokens < Q_MIN_GEMM || !panel) {
        for (int t = 0; t < n_tokens; t++)
            for (int r = r0; r < r1; r += QR) gemv(a, r, r1 - r < QR ? r1 - r : QR, t);
        return;
    }
    a->panel = panel;
    a->panel_d = (float *)((char *)panel + (size_t)a->x->nb * QR * 32);
    for (int c0 = 0; c0 < n_tokens; c0 += TOKEN_CHUNK) {
        const int c1 = c0 + TOKEN_CHUNK < n_tokens ? c0 + TOKEN_CHUNK : n_tokens;
        for (int r = r0; r < r1; r += QR) {
            const int nr = r1 - r < QR ? r1 - r : QR;
            build(a, r, nr);
            for (int t = c0; t < c1; t += QT) tile(a, r, nr, t, c1 - t < QT ? c1 - t : QT);
        }
    }
}

void kt_matmul_q8_0_avx2(float *out, const void *w, const kt_q8_act *x, int n_in, int n_out,
                         int n_tokens, int r0, int r1, void *panel) {
    q_args a = {w, kt_dtype_row_bytes(KT_Q8_0, n_in), x, out, n_out, NULL, NULL};
    q_rows(&a, 0, n_tokens, r0, r1, panel);
}

void kt_matmul_q4_0_avx2(float *out, const void *w, const kt_q8_act *x, int n_in, int n_out,
                         int n_tokens, int r0, int r1, void *panel) {
    q_args a = {w, kt_dtype_row_bytes(KT_Q4_0, n_in), x, out, n_out, NULL, NULL};
    q_rows(&a, 1, n_tokens, r0, r1, panel);
}

/* ---- float weights (F32, F16, BF16) ---------------------------------- */

INL __m256 load_w8(kt_dtype wt, const char *row, int i) {
    if (wt == KT_F32) return _mm256_loadu_ps((const float *)row + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + i));
    if (wt == KT_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); /* BF16 */
}

INL float load_w1(kt_dtype wt, const char *row, int i) {
    if (wt == KT_F32) return ((const float *)row)[i];
    uint16_t h;
    memcpy(&h, row + 2 * (size_t)i, 2);
    if (wt == KT_F16) return _cvtsh_ss(h);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

typedef struct f_args {
    const char *w;
    size_t row_bytes;
    const float *x;
    float *out;
    int n_in, n_out;
} f_args;

INL void f_tile(const f_args *a, const kt_dtype wt, const int R, const int T, int r0, int t0) {
    const int n_in = a->n_in, n8 = n_in & ~7;
    const char *rows[4];
    const float *xs[4];
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) rows[r] = a->w + (size_t)(r0 + r) * a->row_bytes;
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) xs[t] = a->x + (size_t)(t0 + t) * n_in;
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();

    const int esz = wt == KT_F32 ? 4 : 2;
    for (int i = 0; i < n8; i += 8) {
        if (T == 1 && (i & (64 / esz - 1)) == 0) { /* one line ahead of the next R rows */
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                _mm_prefetch(rows[r] + (size_t)i * esz + (size_t)R * a->row_bytes, _MM_HINT_T0);
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const __m256 w = load_w8(wt, rows[r], i);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++)
                acc[r][t] = _mm256_fmadd_ps(w, _mm256_loadu_ps(xs[t] + i), acc[r][t]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            float tail = 0.0f;
            for (int i = n8; i < n_in; i++) tail = fmaf(load_w1(wt, rows[r], i), xs[t][i], tail);
            a->out[(size_t)(t0 + t) * a->n_out + r0 + r] = hsum8(acc[r][t]) + tail;
        }
}

/* Tiles as for the quantized types: gemv, one (1 x 1), full, rows (R x 1),
 * tokens (1 x T), for each float type. */
#define F_TILE(name, wt, R, T)                                               \
    static void name(const f_args *a, int r0, int t0) {                      \
        f_tile(a, wt, R, T, r0, t0);                                         \
    }
#define F_TILES(ty, wt)                                                      \
    F_TILE(ty##_gemv, wt, GEMV_ROWS, 1) F_TILE(ty##_one, wt, 1, 1)          \
    F_TILE(ty##_full, wt, FT_ROWS, FT_TOKENS) F_TILE(ty##_rows, wt, FT_ROWS, 1) \
    F_TILE(ty##_tokens, wt, 1, FT_TOKENS)                                    \
    static const f_tiles F_TILES_##ty = {ty##_gemv, ty##_one, ty##_full, ty##_rows, ty##_tokens};

typedef void (*f_tile_fn)(const f_args *a, int r0, int t0);

typedef struct f_tiles {
    f_tile_fn gemv, one, full, rows1, tokens1;
} f_tiles;

F_TILES(f32, KT_F32)
F_TILES(f16, KT_F16)
F_TILES(bf16, KT_BF16)

void kt_matmul_float_avx2(float *out, const void *w, kt_dtype wtype, const float *xf, int n_in,
                          int n_out, int n_tokens, int r0, int r1) {
    const f_tiles *k = wtype == KT_F16 ? &F_TILES_f16 : wtype == KT_BF16 ? &F_TILES_bf16 : &F_TILES_f32;
    f_args a = {w, kt_dtype_row_bytes(wtype, n_in), xf, out, n_in, n_out};
    if (n_tokens == 1) {
        int r = r0;
        for (; r + GEMV_ROWS <= r1; r += GEMV_ROWS) k->gemv(&a, r, 0);
        for (; r < r1; r++) k->one(&a, r, 0);
        return;
    }
    for (int c0 = 0; c0 < n_tokens; c0 += TOKEN_CHUNK) {
        int c1 = c0 + TOKEN_CHUNK < n_tokens ? c0 + TOKEN_CHUNK : n_tokens;
        int r = r0;
        for (; r + FT_ROWS <= r1; r += FT_ROWS) {
            int t = c0;
            for (; t + FT_TOKENS <= c1; t += FT_TOKENS) k->full(&a, r, t);
            for (; t < c1; t++) k->rows1(&a, r, t);
        }
        for (; r < r1; r++) {
            int t = c0;
            for (; t + FT_TOKENS <= c1; t += FT_TOKENS) k->tokens1(&a, r, t);
            for (; t < c1; t++) k->one(&a, r, t);
        }
    }
}
