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
 *
 * Integer dot product of 32 int8 pairs (the "sign trick"): maddubs
 * multiplies unsigned by signed bytes, so it is given |w| and x with w's
 * sign moved onto it; |w| <= 128 and |x| <= 127 so the pairwise int16 sums
 * cannot saturate; madd with ones then adds pairs of int16 into 8 int32
 * lanes, lane k holding products 4k .. 4k+3.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ops/internal.h"
#include "ops/quant.h"

#define INL static inline __attribute__((always_inline))

#define GEMV_ROWS 4     /* rows per step when n_tokens == 1 */
#define QT_ROWS 3       /* GEMM tile, quantized weights: rows x tokens */
#define QT_TOKENS 3
#define FT_ROWS 4       /* GEMM tile, float weights */
#define FT_TOKENS 3
#define TOKEN_CHUNK 48
#ifndef PF_BYTES
#define PF_BYTES 512
#endif  /* tokens whose activations stay in L2 per pass */

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

void kt_quantize_act_q8_avx2(const float *x, int64_t n, int8_t *qs, float *d) {
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
    }
}

/* ---- quantized weights ---------------------------------------------- */

/* Q8_0 weight block b of a row: 32 signed bytes in element order. */
INL __m256i load_q8_0(const char *row, int b) {
    const block_q8_0 *blk = (const block_q8_0 *)row + b;
    return _mm256_loadu_si256((const __m256i *)blk->qs);
}

/* Q4_0 weight block b of a row: its 32 nibbles (0..15, not yet minus 8)
 * in element order. The 16 bytes are broadcast to both halves, the high
 * half shifted right by 4, and the mask keeps low nibbles (elements
 * 0..15) then high nibbles (16..31). */
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

/* The fp16 scales of block b of up to 4 rows, as 4 floats (0 beyond R).
 * Gathered with integer loads and converted with one vcvtph2ps, which
 * keeps the vector ports for the dot products. */
INL __m128 row_scales(const char *const *rows, const int R, const int q4, int b) {
    const size_t bb = q4 ? sizeof(block_q4_0) : sizeof(block_q8_0);
    uint64_t h = 0;
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) h |= half_bits(rows[r] + (size_t)b * bb) << (16 * r);
    return _mm_cvtph_ps(_mm_cvtsi64_si128((long long)h));
}

/* Integer dot products of 32 byte pairs as 8 int32 lanes, lane k holding
 * products 4k .. 4k+3. Both forms below give the same exact lanes.
 *
 * Q8_0 (the sign trick): maddubs multiplies unsigned by signed bytes, so
 * it gets |w| and x with w's sign moved onto it; |w| <= 128, |x| <= 127, so
 * the pairwise int16 sums cannot saturate.
 *
 * Q4_0: the nibbles n are already unsigned, so maddubs(n, x) works as is
 * (|sums| <= 2 * 15 * 127), and sum (n - 8) x = sum n x - 8 sum x; the
 * correction 8 sum x (per lane) depends only on the activation block and
 * is computed once per block for all rows. */
INL __m256i idot_q8(__m256i aw, __m256i w, __m256i x) {
    __m256i p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

INL __m256i q4_correction(__m256i x) {
    __m256i p = _mm256_maddubs_epi16(_mm256_set1_epi8(8), x);
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

INL __m256i idot_q4(__m256i n, __m256i x, __m256i corr) {
    __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(n, x), _mm256_set1_epi16(1));
    return _mm256_sub_epi32(p, corr);
}

typedef struct q_args {
    const char *w;       /* row 0 of the matrix */
    size_t row_bytes;
    const kt_q8_act *x;
    float *out;
    int n_out;
} q_args;

/* Outputs (r0 .. r0+R-1) x (t0 .. t0+T-1). R, T <= 4 are constants after
 * inlining, so acc lives in registers. Per block: the R x T scale products
 * d_w * d_x go through a small array (so each is one broadcast load), each
 * weight block is unpacked once and used for T tokens, each activation
 * block loaded once per row. */
INL void q_tile(const q_args *a, const int q4, const int R, const int T, int r0, int t0) {
    const int nb = a->x->nb;
    const char *rows[4];
    const int8_t *xq[4];
    const float *xd[4];
    __m256 acc[4][4];
    float sc[4][4] __attribute__((aligned(16))); /* sc[t][r] = d_w[r] * d_x[t] */
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) rows[r] = a->w + (size_t)(r0 + r) * a->row_bytes;
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        xq[t] = a->x->qs + (size_t)(t0 + t) * nb * QK8_0;
        xd[t] = a->x->d + (size_t)(t0 + t) * nb;
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();

    const size_t bb = q4 ? sizeof(block_q4_0) : sizeof(block_q8_0);
    for (int b = 0; b < nb; b++) {
        if (PF_BYTES) {
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) _mm_prefetch(rows[r] + (size_t)b * bb + PF_BYTES, _MM_HINT_T0);
        }
        const __m128 dw = row_scales(rows, R, q4, b);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) _mm_store_ps(sc[t], _mm_mul_ps(dw, _mm_set1_ps(xd[t][b])));

        __m256i corr[4];
        if (q4) {
#pragma GCC unroll 4
            for (int t = 0; t < T; t++)
                corr[t] = q4_correction(_mm256_load_si256((const __m256i *)(xq[t] + b * QK8_0)));
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const __m256i w = q4 ? load_q4_0(rows[r], b) : load_q8_0(rows[r], b);
            const __m256i aw = q4 ? w : _mm256_sign_epi8(w, w);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                const __m256i xv = _mm256_load_si256((const __m256i *)(xq[t] + b * QK8_0));
                const __m256i dot = q4 ? idot_q4(w, xv, corr[t]) : idot_q8(aw, w, xv);
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_broadcast_ss(&sc[t][r]),
                                            acc[r][t]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
            a->out[(size_t)(t0 + t) * a->n_out + r0 + r] = hsum8(acc[r][t]);
}

/* The tiles the drivers use, one function each (q4: 0 = Q8_0, 1 = Q4_0). */
#define Q_TILE(q4, R, T)                                                     \
    static void q_tile_##q4##_##R##x##T(const q_args *a, int r0, int t0) {   \
        q_tile(a, q4, R, T, r0, t0);                                         \
    }
Q_TILE(0, 1, 1) Q_TILE(0, 4, 1) Q_TILE(0, 3, 3) Q_TILE(0, 3, 1) Q_TILE(0, 1, 3)
Q_TILE(1, 1, 1) Q_TILE(1, 4, 1) Q_TILE(1, 3, 3) Q_TILE(1, 3, 1) Q_TILE(1, 1, 3)

typedef void (*q_tile_fn)(const q_args *a, int r0, int t0);

typedef struct q_tiles {
    q_tile_fn gemv, gemv1;            /* GEMV_ROWS x 1, 1 x 1 */
    q_tile_fn full, rows1, tokens1;   /* RxT, Rx1, 1xT */
} q_tiles;

static const q_tiles Q_TILES[2] = {
    {q_tile_0_4x1, q_tile_0_1x1, q_tile_0_3x3, q_tile_0_3x1, q_tile_0_1x3},
    {q_tile_1_4x1, q_tile_1_1x1, q_tile_1_3x3, q_tile_1_3x1, q_tile_1_1x3},
};

/* Rows [r0, r1) of every token: GEMV_ROWS at a time for one token;
 * otherwise R x T tiles per chunk of tokens, the edges with R x 1, 1 x T
 * and 1 x 1 tiles. */
static void q_rows(const q_args *a, int q4, int n_tokens, int r0, int r1) {
    const q_tiles *k = &Q_TILES[q4];
    if (n_tokens == 1) {
        int r = r0;
        for (; r + GEMV_ROWS <= r1; r += GEMV_ROWS) k->gemv(a, r, 0);
        for (; r < r1; r++) k->gemv1(a, r, 0);
        return;
    }
    for (int c0 = 0; c0 < n_tokens; c0 += TOKEN_CHUNK) {
        int c1 = c0 + TOKEN_CHUNK < n_tokens ? c0 + TOKEN_CHUNK : n_tokens;
        int r = r0;
        for (; r + QT_ROWS <= r1; r += QT_ROWS) {
            int t = c0;
            for (; t + QT_TOKENS <= c1; t += QT_TOKENS) k->full(a, r, t);
            for (; t < c1; t++) k->rows1(a, r, t);
        }
        for (; r < r1; r++) {
            int t = c0;
            for (; t + QT_TOKENS <= c1; t += QT_TOKENS) k->tokens1(a, r, t);
            for (; t < c1; t++) k->gemv1(a, r, t);
        }
    }
}

void kt_matmul_q8_0_avx2(float *out, const void *w, const kt_q8_act *x, int n_in, int n_out,
                         int n_tokens, int r0, int r1) {
    q_args a = {w, kt_dtype_row_bytes(KT_Q8_0, n_in), x, out, n_out};
    q_rows(&a, 0, n_tokens, r0, r1);
}

void kt_matmul_q4_0_avx2(float *out, const void *w, const kt_q8_act *x, int n_in, int n_out,
                         int n_tokens, int r0, int r1) {
    q_args a = {w, kt_dtype_row_bytes(KT_Q4_0, n_in), x, out, n_out};
    q_rows(&a, 1, n_tokens, r0, r1);
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

    for (int i = 0; i < n8; i += 8) {
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

#define F_TILE(name, wt, R, T)                                               \
    static void f_tile_##name##_##R##x##T(const f_args *a, int r0, int t0) { \
        f_tile(a, wt, R, T, r0, t0);                                         \
    }
#define F_TILES(name, wt)                                                    \
    F_TILE(name, wt, 1, 1) F_TILE(name, wt, 4, 1) F_TILE(name, wt, 4, 3)     \
    F_TILE(name, wt, 1, 3)
F_TILES(f32, KT_F32)
F_TILES(f16, KT_F16)
F_TILES(bf16, KT_BF16)

typedef void (*f_tile_fn)(const f_args *a, int r0, int t0);

typedef struct f_tiles {
    f_tile_fn gemv, one, full, tokens1; /* 4x1 (also the GEMM's Rx1), 1x1, RxT, 1xT */
} f_tiles;

static const f_tiles F_TILES_F32 = {f_tile_f32_4x1, f_tile_f32_1x1, f_tile_f32_4x3, f_tile_f32_1x3};
static const f_tiles F_TILES_F16 = {f_tile_f16_4x1, f_tile_f16_1x1, f_tile_f16_4x3, f_tile_f16_1x3};
static const f_tiles F_TILES_BF16 = {f_tile_bf16_4x1, f_tile_bf16_1x1, f_tile_bf16_4x3,
                                     f_tile_bf16_1x3};

void kt_matmul_float_avx2(float *out, const void *w, kt_dtype wtype, const float *xf, int n_in,
                          int n_out, int n_tokens, int r0, int r1) {
    const f_tiles *k = wtype == KT_F16 ? &F_TILES_F16 : wtype == KT_BF16 ? &F_TILES_BF16 : &F_TILES_F32;
    f_args a = {w, kt_dtype_row_bytes(wtype, n_in), xf, out, n_in, n_out};
    for (int c0 = 0; c0 < n_tokens; c0 += TOKEN_CHUNK) {
        int c1 = c0 + TOKEN_CHUNK < n_tokens ? c0 + TOKEN_CHUNK : n_tokens;
        int r = r0;
        for (; r + FT_ROWS <= r1; r += FT_ROWS) {
            int t = c0;
            for (; t + FT_TOKENS <= c1; t += FT_TOKENS) k->full(&a, r, t);
            for (; t < c1; t++) k->gemv(&a, r, t);
        }
        for (; r < r1; r++) {
            int t = c0;
            for (; t + FT_TOKENS <= c1; t += FT_TOKENS) k->tokens1(&a, r, t);
            for (; t < c1; t++) k->one(&a, r, t);
        }
    }
}
