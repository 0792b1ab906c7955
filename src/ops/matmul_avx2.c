/*
 * matmul_avx2.c - AVX2/FMA/F16C matmul kernels and the activation
 * quantizer; the scalar twins and the specification are in matmul.c and
 * quant.c. Compiled with -mavx2 -mfma -mf16c, called only when
 * kt_cpu_has_avx2().
 *
 * Every output element (row r, token t) is computed the same way in every
 * path, so results are batch-invariant (see matmul.c):
 *
 *   Q4_0, Q8_0:     one float lane per output:
 *                   acc = fma(float(isum), d_w * d_x, acc) per block
 *   Q4_1, Q5_0, Q5_1: the same, plus for Q4_1/Q5_1 per block
 *                   acc = fma(float(sum x), m_w * d_x, acc)
 *   float weights:  8 float lanes per output: acc = fma(w, x, acc) per 8
 *                   values; out = hsum8(acc) + (the n_in % 8 tail, fmaf)
 *
 * The quantized orders are also the reference's (matmul.c), so for those
 * types SIMD and scalar agree bit for bit.
 *
 * Tiles only change how many outputs are computed at once, never the
 * operations applied to one output's accumulator. Integer sums are exact,
 * so how they are formed may differ between paths.
 *
 * Decode (one token) is memory-bound: rows are processed in groups that
 * share each activation load, and software prefetch fetches the next group
 * of rows (measured 1.5-3x over the hardware prefetcher alone here).
 * Prefill is tiled rows x tokens over chunks of tokens whose activations
 * stay in L2, so weights are read from memory once per chunk.
 */
#include <immintrin.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "ops/cpu.h"
#include "ops/internal.h"
#include "ops/quant.h"
#include "ops/repack.h"
#include "ops/simd_avx2.h"


/* Float weights: GEMV_ROWS rows per step for one token; GEMM tiles of
 * FT_ROWS x FT_TOKENS (measured on Zen 5: 4 x 3 beat 3 x 3, 4 x 2, 2 x 4,
 * 3 x 4 and 4 x 4 -- 12 accumulators leave registers for the operands).
 * The quantized kernels' shapes are with them below. */
#define GEMV_ROWS 4
#define FT_ROWS 4
#define FT_TOKENS 3
#define CHUNK_BYTES (512 * 1024) /* activations per pass: half of a 1 MB L2 */

/* Tokens per pass of the GEMMs: as many as keep their activations (n_in
 * floats or bytes each) within CHUNK_BYTES, at least 12 and at most 128 (a
 * multiple of 12, so of both tile widths); each pass re-reads the weights
 * (quantized: rebuilds the panels), so bigger is better up to the cache. */
static int token_chunk(int n_in, int bytes_per_value) {
    int n = CHUNK_BYTES / (n_in * bytes_per_value + 1);
    n = n > 128 ? 128 : n;
    return n < 12 ? 12 : n / 12 * 12;
}

/* ---- activation quantizer (bit-identical to kt_quantize_act_q8_ref) -- */

/* cvtps rounds in the default mode, to nearest with ties to even: the
 * reference's nearbyintf. */
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
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        d[i] = _cvtsh_ss(_cvtss_sh(di, _MM_FROUND_TO_NEAREST_INT));

        const __m256 vid = _mm256_set1_ps(id);
        __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, vid));
        __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, vid));
        __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, vid));
        __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, vid));
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

/* ---- quantized weights: shared pieces ------------------------------- */

/* ---- the 32-value block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 ---------
 *
 * A block holds 32 unsigned levels q (4 bits; Q5_0/Q5_1 add a fifth bit
 * from a 32-bit word; Q8_0's bytes are taken as 8-bit levels, below), a
 * scale d and, for Q4_1/Q5_1, a minimum m. Per
 * block the reference's float steps (matmul.c) are
 *   acc = fma(float(isum), d_w * d_x, acc)
 *   acc = fma(float(sum x), m_w * d_x, acc)         (Q4_1, Q5_1 only)
 * with isum = sum q x minus, for the formats whose levels are offset,
 * the offset times sum x: 8 sum x = c8 for Q4_0, 16 sum x = 2 c8 for Q5_0
 * (internal.h: c8 = 8 sum x). One description per format drives the
 * GEMV, the panel and every tile, so they cannot disagree. */
typedef struct legacy_fmt {
    size_t bb;    /* block bytes */
    int qs_off;   /* offset of the 16 nibble bytes */
    int qh_off;   /* offset of the 4 fifth-bit bytes; -1 for 4-bit levels */
    int m_off;    /* offset of the fp16 minimum; -1 for Q4_0/Q5_0 */
    int c8_mul;   /* isum -= c8_mul * c8 (the level offset) */
    bool nl;      /* IQ4_NL, MXFP4: levels through the table (below) */
    const int8_t *table; /* nl: the 16 levels */
    bool e8m0;    /* MXFP4: the x8 scales are 8 E8M0 bytes, not 8 fp16 */
    bool q8;      /* Q8_0: the values are the block's signed bytes (below) */
} legacy_fmt;

static const legacy_fmt FMT_Q4_0 = {sizeof(block_q4_0), 2, -1, -1, 1, false, NULL, false, false};
static const legacy_fmt FMT_Q4_1 = {sizeof(block_q4_1), 4, -1, 2, 0, false, NULL, false, false};
static const legacy_fmt FMT_Q5_0 = {sizeof(block_q5_0), 6, 2, -1, 2, false, NULL, false, false};
static const legacy_fmt FMT_Q5_1 = {sizeof(block_q5_1), 8, 4, 2, 0, false, NULL, false, false};
/* IQ4_NL (x8 layout only): a nibble n stands for KT_IQ4NL_VALUES[n], in
 * -127..113. maddubs and vpdpbusd want the weights unsigned, so the
 * tiles look up u = value + 128 (1..241) and the step takes off 128 sum x
 * = 16 c8: sum u x - 16 c8 = sum value x, exactly. (The AVX2 tile cannot
 * use u: a pair 2 * 241 * 127 saturates maddubs' int16. It goes back to
 * the signed value and the sign trick, see q4_tile_avx2.) */
static const legacy_fmt FMT_IQ4_NL = {sizeof(block_iq4_nl), 2, -1, -1, 16, true, KT_IQ4NL_VALUES, false, false};
/* MXFP4 (x8 layout only): the same with KT_MXFP4_VALUES (-12..12, so u =
 * value + 128 is 116..140) and per block 8 exponent bytes where IQ4_NL
 * has 8 fp16 scales (repack.h). */
static const legacy_fmt FMT_MXFP4 = {sizeof(block_mxfp4), 1, -1, -1, 16, true, KT_MXFP4_VALUES, true, false};
/* Q8_0: the levels are the 32 value bytes themselves, -128..127, taken as
 * u = value + 128 (value ^ 0x80) as for IQ4_NL, with the same 16 c8
 * taken off in the step (and the same sign trick in the AVX2 tile). */
static const legacy_fmt FMT_Q8_0 = {sizeof(block_q8_0), 2, -1, -1, 16, false, NULL, false, true};

/* Levels past 15 (u = value + 128): an AVX2 maddubs pair of two of them
 * times activations can saturate int16, so the AVX2 paths multiply the
 * signed values with the sign trick instead. */
INL bool u8_levels(const legacy_fmt *f) { return f->nl || f->q8; }

/* 32 bits -> 32 bytes, byte j = 0x10 where bit j is set: byte j/8 of h is
 * shuffled to byte j, tested against bit j%8. */
INL __m256i fifth_bits(const uint8_t *qh) {
    uint32_t h;
    memcpy(&h, qh, 4);
    const __m256i idx = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                         2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h), idx);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* The 32 levels (0..15 or 0..31; Q8_0: u) of block b of a row, in element order:
 * the 16 nibble bytes broadcast to both halves, the high half shifted
 * right by 4, the mask keeping low nibbles (elements 0..15) then high
 * nibbles (16..31); then the fifth bits. */
INL __m256i load_levels(const legacy_fmt *f, const char *row, int b) {
    const uint8_t *blk = (const uint8_t *)row + (size_t)b * f->bb;
    if (f->q8)
        return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + f->qs_off)), _mm256_set1_epi8((char)0x80));
    __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(blk + f->qs_off)));
    v = _mm256_srlv_epi64(v, _mm256_set_epi64x(4, 4, 0, 0));
    v = _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
    if (f->qh_off >= 0) v = _mm256_or_si256(v, fifth_bits(blk + f->qh_off));
    return v;
}

/* A matrix streamed once (GEMV, panel building) is fetched a group of
 * rows ahead: block b of the R rows that follow these in memory. The
 * hardware prefetcher alone does not keep up with several short row
 * streams here (measured 1.5-3x). One prefetch per row every 64 bytes or
 * less: every block for Q8_0 (34 bytes), every other one for Q4_0 (18).
 * Into L2: a group of rows ahead is tens of KB, which in L1 evicts the
 * rows being read (as x8_prefetch). Past the matrix's end this fetches
 * nothing useful; prefetches never fault. */
INL void prefetch_rows_ahead(const char *const *rows, const int R, size_t row_bytes,
                             size_t block_bytes, int b) {
    if (block_bytes < 32 && (b & 1)) return;
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) _mm_prefetch(rows[r] + (size_t)b * block_bytes + R * row_bytes, _MM_HINT_T1);
}

typedef struct q_args {
    const char *w;       /* row 0 of the matrix */
    size_t row_bytes;
    const kt_q8_act *x;
    float *out;
    int n_out;
    int8_t *panel;       /* panel GEMM: nb * 8 vectors of 32 bytes */
    float *panel_d;      /* panel GEMM: nb * 8 row scales */
    int8_t *panel2;      /* AVX-512 panel GEMM: the next 8 rows' panel */
    float *panel_d2;
    float *panel_m;      /* Q4_1/Q5_1 panel GEMM: nb * 8 row minima */
    float *panel_m2;
} q_args;

#define TILE_TOKENS_MAX 8 /* the widest token tile of any type */

/* The activations of a tile's tokens t0 .. t0+T-1; tokens past nt repeat
 * the last one (computed, not stored). */
typedef struct tile_x {
    const int8_t *q[TILE_TOKENS_MAX];
    const float *d[TILE_TOKENS_MAX];
    const int32_t *c8[TILE_TOKENS_MAX];
} tile_x;

INL void tile_x_init(tile_x *x, const q_args *a, int t0, int nt, const int T) {
    const int nb = a->x->nb;
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        const size_t k = (size_t)(t0 + (t < nt ? t : nt - 1)) * nb;
        x->q[t] = a->x->qs + k * QK8_0;
        x->d[t] = a->x->d + k;
        x->c8[t] = a->x->c8 + k;
    }
}

/* AVX-VNNI's vpdpbusd in 256-bit vectors (the AVX-512 tiles use TARGET_512) */
#define TARGET_VNNI __attribute__((target("avx2,fma,f16c,avxvnni")))

/* ---- the 32-value formats: one output per lane ------------------------
 *
 * A vector holds 8 rows (Q4_ROWS) of one token. Per block the 8 exact
 * integer dot products land in 8 int32 lanes, then the format's float
 * steps (above) -- the reference's operations (matmul.c), and for Q4_0
 * the order of ggml's repacked Q4_0 8x8 AVX2 kernels.
 *
 * GEMV (one token): each row's 32 products are formed in its own vector
 * and a tree of horizontal adds leaves one lane per row.
 *
 * GEMM: the 8 rows' blocks are first transposed into a panel (per block,
 * 8 vectors; vector q holds levels 4q..4q+3 of each row in the row's
 * lane, then the rows' scales and, for Q4_1/Q5_1, minima as floats), so
 * one broadcast of 4 activation bytes against a panel vector gives every
 * row its partial sum in its own lane, with no reduction. The panel is
 * built once per 8 rows and chunk of tokens and reused for all of them;
 * from it every format runs the same tiles.
 *
 * Integer products: the levels q are maddubs' (and vpdpbusd's) unsigned
 * side and the activations the signed one. A pair sum is at most
 * 2 * 15 * 127 for 4-bit levels, so a block's 8 pairs per lane still fit
 * in int16 (30480); 5-bit levels reach 2 * 31 * 127 = 7874 per pair, so
 * the AVX2 tile widens every 2 pairs, and the GEMV widens each row's
 * products before its reduction tree.
 */

#define Q4_ROWS 8      /* rows per vector: one per lane */
#define Q4_TOKENS 4    /* tokens per GEMM tile */
#define Q4_MIN_GEMM 3  /* fewer tokens than this: one GEMV per token */

/* Lane r = sum n x over row r's block b (before - c8). The int16 tree:
 * hadd 8 -> 4 -> 2 -> 1 vectors leaves, in each 128-bit half, the 8 rows'
 * sums over that half's 16 products; widen and add the halves. */
INL __m256i q4_dot8(const char *const *rows, int b, __m256i x) {
    __m256i m[Q4_ROWS];
#pragma GCC unroll 8
    for (int r = 0; r < Q4_ROWS; r++) m[r] = _mm256_maddubs_epi16(load_levels(&FMT_Q4_0, rows[r], b), x);
    __m256i h01 = _mm256_hadd_epi16(m[0], m[1]), h23 = _mm256_hadd_epi16(m[2], m[3]);
    __m256i h45 = _mm256_hadd_epi16(m[4], m[5]), h67 = _mm256_hadd_epi16(m[6], m[7]);
    __m256i h = _mm256_hadd_epi16(_mm256_hadd_epi16(h01, h23), _mm256_hadd_epi16(h45, h67));
    return _mm256_add_epi32(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(h)),
                            _mm256_cvtepi16_epi32(_mm256_extracti128_si256(h, 1)));
}

/* The first n lanes of v to p. */
INL void store_lanes(float *p, __m256 v, int n) {
    if (n == Q4_ROWS) {
        _mm256_storeu_ps(p, v);
        return;
    }
    float buf[Q4_ROWS];
    _mm256_storeu_ps(buf, v);
    for (int i = 0; i < n; i++) p[i] = buf[i];
}

/* Rows r0 .. r0+nr-1 (nr <= 8) as 8 row pointers; the missing ones repeat
 * the last row, whose lanes are computed and not stored. */
INL void tile_rows(const q_args *a, int r0, int nr, const char **rows) {
#pragma GCC unroll 8
    for (int r = 0; r < Q4_ROWS; r++) rows[r] = a->w + (size_t)(r0 + (r < nr ? r : nr - 1)) * a->row_bytes;
}

/* GEMV: outputs r0 .. r0+nr-1 of token t. */
static void q4_gemv(const q_args *a, int r0, int nr, int t) {
    const int nb = a->x->nb;
    const char *rows[Q4_ROWS];
    tile_rows(a, r0, nr, rows);
    const int8_t *xq = a->x->qs + (size_t)t * nb * QK8_0;
    const float *xd = a->x->d + (size_t)t * nb;
    const int32_t *xc = a->x->c8 + (size_t)t * nb;
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        prefetch_rows_ahead(rows, Q4_ROWS, a->row_bytes, sizeof(block_q4_0), b);
        const __m256i x = _mm256_load_si256((const __m256i *)(xq + (size_t)b * QK8_0));
        const __m256i isum = _mm256_sub_epi32(q4_dot8(rows, b, x), _mm256_set1_epi32(xc[b]));
        const __m256 scale = _mm256_mul_ps(halves8(rows, sizeof(block_q4_0), 0, b), _mm256_set1_ps(xd[b]));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc);
    }
    store_lanes(a->out + (size_t)t * a->n_out + r0, acc, nr);
}

/* The panel of rows r0 .. r0+nr-1 of format f: per block, the 8 rows'
 * levels transposed, their scales (and minima) as floats. */
static void panel_build(const q_args *a, const legacy_fmt *f, int r0, int nr) {
    const int nb = a->x->nb;
    const char *rows[Q4_ROWS];
    tile_rows(a, r0, nr, rows);
    for (int b = 0; b < nb; b++) {
        prefetch_rows_ahead(rows, Q4_ROWS, a->row_bytes, f->bb, b);
        __m256i v[Q4_ROWS];
#pragma GCC unroll 8
        for (int r = 0; r < Q4_ROWS; r++) v[r] = load_levels(f, rows[r], b);
        transpose8_epi32(v);
#pragma GCC unroll 8
        for (int q = 0; q < Q4_ROWS; q++)
            _mm256_store_si256((__m256i *)(a->panel + ((size_t)b * Q4_ROWS + q) * 32), v[q]);
        _mm256_store_ps(a->panel_d + (size_t)b * Q4_ROWS, halves8(rows, f->bb, 0, b));
        if (f->m_off >= 0)
            _mm256_store_ps(a->panel_m + (size_t)b * Q4_ROWS, halves8(rows, f->bb, (size_t)f->m_off, b));
    }
}

#define Q4_TOKENS512 8 /* tokens per 16-row AVX-512 tile: 32 registers hold 8 */

/* Activation values 4q..4q+3 of block b of token t, as one int32 (to be
 * broadcast to every lane). */
INL int32_t tile_x4(const tile_x *x, int t, int b, int q) {
    int32_t v;
    memcpy(&v, x->q[t] + (size_t)b * QK8_0 + 4 * q, 4);
    return v;
}

/* One block's float steps for 8 rows, the reference's (the formats'
 * comment above); mw is used only by formats with a minimum. */
INL __m256 q4_block_step(const legacy_fmt *f, __m256 acc, __m256i isum, __m256 dw, __m256 mw,
                         const tile_x *x, int t, int b) {
    if (f->c8_mul) isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(f->c8_mul * x->c8[t][b]));
    const __m256 dx = _mm256_set1_ps(x->d[t][b]);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, dx), acc);
    if (f->m_off >= 0)
        acc = _mm256_fmadd_ps(_mm256_set1_ps((float)(x->c8[t][b] / 8)), _mm256_mul_ps(mw, dx), acc);
    return acc;
}

INL void tile_store8(const q_args *a, const __m256 *acc, const int T, int r0, int nr, int t0, int nt) {
#pragma GCC unroll 4
    for (int t = 0; t < T; t++)
        if (t < nt) store_lanes(a->out + (size_t)(t0 + t) * a->n_out + r0, acc[t], nr);
}

/* ---- the tiles, over a panel or over x8 groups ----------------------------
 *
 * A tile reads its 8 (or 16) rows either from the panel built for this
 * chunk of tokens (any of the four formats) or straight from the rows'
 * x8 group (Q4_0x8, Q4_1x8, Q5_0x8, Q5_1x8; ops/repack.h), whose packed
 * vector v gives the panel's vectors v (low nibbles) and v + 4 (high
 * nibbles) with an and and a shift, plus, for the 5-bit formats, the
 * fifth bits from the vector's mask word: no panel to build, and the
 * scales (and minima) are 8 contiguous fp16. `packed` is a constant in
 * every caller. The integer sums are exact in any order and the float
 * steps are the same, so both sources give the same bits. */

/* Group of rows r0 .. r0+7 of an x8 matrix (r0 a multiple of 8). */
INL const uint8_t *x8_group(const q_args *a, int r0) {
    return (const uint8_t *)a->w + (size_t)r0 * a->row_bytes;
}

/* A group's regions (repack.h): nb x 128 bytes of nibbles (Q8_0x8: nb x
 * 256 bytes of values), (Q5_0x8, Q5_1x8) nb x 32 bytes of fifth-bit
 * masks, nb x 16 bytes of scales, (Q4_1x8, Q5_1x8) nb x 16 bytes of
 * minima. */
INL size_t x8_qs_bytes(const legacy_fmt *f) { return f->q8 ? KT_Q8X8_QS_BYTES : KT_X8_QS_BYTES; }

INL size_t x8_scales_at(const legacy_fmt *f, int nb) {
    return (size_t)nb * (x8_qs_bytes(f) + (f->qh_off >= 0 ? KT_X8_QH_BYTES : 0));
}

INL size_t x8_mins_at(const legacy_fmt *f, int nb) {
    return x8_scales_at(f, nb) + (size_t)nb * 16;
}

/* Q5_0x8, Q5_1x8: the mask word of vector v (0..3: low nibbles, 4..7: high) of
 * block b, bit 4r + k set where value k of the vector's 4 in row r has
 * its fifth bit. */
INL const uint8_t *x8_mask(const q_args *a, const uint8_t *grp, int b, int v) {
    return grp + (size_t)a->x->nb * KT_X8_QS_BYTES + (size_t)b * KT_X8_QH_BYTES + 4 * v;
}

/* Values 4v..4v+3 (lo) and 16+4v..16+4v+3 (hi) of block b of the 8 rows,
 * one row per 32-bit lane. */
INL void q4_vecs(const q_args *a, const legacy_fmt *f, const uint8_t *grp, const int8_t *panel, int b, int v,
                 __m256i *lo, __m256i *hi) {
    if (grp && f->q8) { /* Q8_0x8: vectors v and v + 4 as they are, u = value ^ 0x80 */
        const uint8_t *p = grp + (size_t)b * KT_Q8X8_QS_BYTES + 32 * v;
        *lo = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)p), _mm256_set1_epi8((char)0x80));
        *hi = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(p + 128)), _mm256_set1_epi8((char)0x80));
    } else if (grp) {
        const __m256i p = _mm256_loadu_si256((const __m256i *)(grp + (size_t)b * KT_X8_QS_BYTES + 32 * v));
        *lo = _mm256_and_si256(p, _mm256_set1_epi8(0x0F));
        *hi = _mm256_and_si256(_mm256_srli_epi16(p, 4), _mm256_set1_epi8(0x0F));
        if (f->nl) { /* u = level + 128 (FMT_IQ4_NL, FMT_MXFP4), a byte shuffle */
            const __m256i tab = _mm256_xor_si256(
                _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)f->table)), _mm256_set1_epi8((char)0x80));
            *lo = _mm256_shuffle_epi8(tab, *lo);
            *hi = _mm256_shuffle_epi8(tab, *hi);
        }
        if (f->qh_off >= 0) { /* the byte of each value is bit 4r + k of its mask */
            *lo = _mm256_or_si256(*lo, fifth_bits(x8_mask(a, grp, b, v)));
            *hi = _mm256_or_si256(*hi, fifth_bits(x8_mask(a, grp, b, v + 4)));
        }
    } else {
        (void)a;
        *lo = _mm256_load_si256((const __m256i *)(panel + ((size_t)b * Q4_ROWS + v) * 32));
        *hi = _mm256_load_si256((const __m256i *)(panel + ((size_t)b * Q4_ROWS + v + 4) * 32));
    }
}

/* The 8 rows' scales of block b. */
INL __m256 q4_scales(const q_args *a, const legacy_fmt *f, const uint8_t *grp, const float *panel_d, int b) {
    if (grp && f->e8m0) {
        uint64_t e8;
        memcpy(&e8, grp + x8_scales_at(f, a->x->nb) + (size_t)b * 8, 8);
        return e8m0_half8(e8);
    }
    if (grp) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(grp + x8_scales_at(f, a->x->nb) + (size_t)b * 16)));
    return _mm256_load_ps(panel_d + (size_t)b * Q4_ROWS);
}

/* The 8 rows' minima of block b (of a format with one), else 0. */
INL __m256 q4_mins(const q_args *a, const legacy_fmt *f, const uint8_t *grp, const float *panel_m, int b) {
    if (f->m_off < 0) return _mm256_setzero_ps();
    if (grp) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(grp + x8_mins_at(f, a->x->nb) + (size_t)b * 16)));
    return _mm256_load_ps(panel_m + (size_t)b * Q4_ROWS);
}

/* One token streaming x8 groups: fetch block b of the group `ahead`
 * bytes on (its nibbles every block, its masks every 2nd, its scales
 * every 4th) into L2, not L1: the next group is a whole group ahead
 * (9-55 KB at row lengths 1152-6144), and fetched into L1 it evicted the
 * current one's lines before their use (T0 -> T1: decode +15-70% on
 * tinyllama, Qwen 3, Gemma 3 and Phi-3 shapes, docs/PERFORMANCE.md). */
INL void x8_prefetch(const q_args *a, const legacy_fmt *f, const uint8_t *grp, size_t ahead, int b) {
    const uint8_t *next = grp + ahead;
    const size_t qs = x8_qs_bytes(f);
    for (size_t line = 0; line < qs; line += 64) _mm_prefetch((const char *)next + (size_t)b * qs + line, _MM_HINT_T1);
    if (f->qh_off >= 0 && (b & 1) == 0) _mm_prefetch((const char *)x8_mask(a, next, b, 0), _MM_HINT_T1);
    if ((b & (f->e8m0 ? 7 : 3)) == 0) /* a line of scales: 4 blocks' fp16, 8 blocks' E8M0 */
        _mm_prefetch((const char *)next + x8_scales_at(f, a->x->nb) + (size_t)b * (f->e8m0 ? 8 : 16), _MM_HINT_T1);
    if (f->m_off >= 0 && (b & 3) == 0) _mm_prefetch((const char *)next + x8_mins_at(f, a->x->nb) + (size_t)b * 16, _MM_HINT_T1);
}

/* AVX2: 8 rows x T tokens (T <= Q4_TOKENS) of format f (packed: its x8
 * layout); maddubs pairs summed in int16 (no overflow, see above) and
 * widened once per block, or every 2 pairs for 5-bit levels. */
INL void q4_tile_avx2(const q_args *a, const legacy_fmt *f, const bool packed, const int T, int r0, int nr,
                      int t0, int nt) {
    tile_x x;
    tile_x_init(&x, a, t0, nt, T);
    const uint8_t *grp = packed ? x8_group(a, r0) : NULL;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[Q4_TOKENS];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_ps();

    for (int b = 0; b < a->x->nb; b++) {
        if (packed) x8_prefetch(a, f, grp, Q4_ROWS * a->row_bytes, b);
        __m256i isum[Q4_TOKENS], isum16[Q4_TOKENS];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) isum[t] = isum16[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            __m256i lo, hi;
            q4_vecs(a, f, grp, a->panel, b, v, &lo, &hi);
            if (u8_levels(f)) { /* the signed levels, |w| x sign(x, w): a pair <= 2 * 128 * 127 */
                const __m256i wl = _mm256_xor_si256(lo, _mm256_set1_epi8((char)0x80));
                const __m256i wh = _mm256_xor_si256(hi, _mm256_set1_epi8((char)0x80));
                const __m256i al = _mm256_sign_epi8(wl, wl), ah = _mm256_sign_epi8(wh, wh);
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) {
                    const __m256i pl = _mm256_maddubs_epi16(al, _mm256_sign_epi8(_mm256_set1_epi32(tile_x4(&x, t, b, v)), wl));
                    const __m256i ph = _mm256_maddubs_epi16(ah, _mm256_sign_epi8(_mm256_set1_epi32(tile_x4(&x, t, b, v + 4)), wh));
                    /* widened apart: two such pairs overflow int16 */
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_add_epi32(_mm256_madd_epi16(pl, ones), _mm256_madd_epi16(ph, ones)));
                }
                continue;
            }
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                isum16[t] = _mm256_add_epi16(isum16[t], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(tile_x4(&x, t, b, v))));
                isum16[t] = _mm256_add_epi16(isum16[t], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(tile_x4(&x, t, b, v + 4))));
                if (f->qh_off >= 0 || v == 3) {
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(isum16[t], ones));
                    isum16[t] = _mm256_setzero_si256();
                }
            }
        }
        const __m256 dw = q4_scales(a, f, grp, a->panel_d, b), mw = q4_mins(a, f, grp, a->panel_m, b);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            /* IQ4_NL, Q8_0: these sums have no +128 offset for the step to take off */
            if (u8_levels(f)) isum[t] = _mm256_add_epi32(isum[t], _mm256_set1_epi32(f->c8_mul * x.c8[t][b]));
            acc[t] = q4_block_step(f, acc[t], isum[t], dw, mw, &x, t, b);
        }
    }
    tile_store8(a, acc, T, r0, nr, t0, nt);
}

/* The same tile with AVX-VNNI: vpdpbusd adds the 4 products of each lane
 * straight into int32, one instruction where AVX2 needs maddubs + an
 * int16 add (and a madd per block). The integer sums are exact both ways
 * and the float steps are the same, so the two tiles give the same bits:
 * which one runs depends on the CPU, never on the batch. */
TARGET_VNNI INL void q4_tile_vnni(const q_args *a, const legacy_fmt *f, const bool packed, const int T, int r0,
                                  int nr, int t0, int nt) {
    tile_x x;
    tile_x_init(&x, a, t0, nt, T);
    const uint8_t *grp = packed ? x8_group(a, r0) : NULL;
    __m256 acc[Q4_TOKENS];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_ps();

    for (int b = 0; b < a->x->nb; b++) {
        if (packed) x8_prefetch(a, f, grp, Q4_ROWS * a->row_bytes, b);
        __m256i isum[Q4_TOKENS];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) isum[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            __m256i lo, hi;
            q4_vecs(a, f, grp, a->panel, b, v, &lo, &hi);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                isum[t] = _mm256_dpbusd_avx_epi32(isum[t], lo, _mm256_set1_epi32(tile_x4(&x, t, b, v)));
                isum[t] = _mm256_dpbusd_avx_epi32(isum[t], hi, _mm256_set1_epi32(tile_x4(&x, t, b, v + 4)));
            }
        }
        const __m256 dw = q4_scales(a, f, grp, a->panel_d, b), mw = q4_mins(a, f, grp, a->panel_m, b);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[t] = q4_block_step(f, acc[t], isum[t], dw, mw, &x, t, b);
    }
    tile_store8(a, acc, T, r0, nr, t0, nt);
}

/* AVX-512 VNNI: two 8-row sources side by side in one 512-bit vector, so
 * one vpdpbusd serves 16 rows (lanes 0-7: rows r0.., 8-15: rows r0+8..)
 * and each broadcast activation is used for 16 rows. Lane by lane the
 * same integer sums and float steps as the 8-row tiles: the same bits. */
/* Q5_0x8, Q5_1x8: the mask words of vector v of block b of two groups as one
 * 64-bit mask (bytes 0-31: g0's, 32-63: g1's). */
TARGET_512 INL __mmask64 x8_mask64(const q_args *a, const uint8_t *g0, const uint8_t *g1, int b, int v) {
    uint32_t m0, m1;
    memcpy(&m0, x8_mask(a, g0, b, v), 4);
    memcpy(&m1, x8_mask(a, g1, b, v), 4);
    return _cvtu64_mask64((uint64_t)m1 << 32 | m0);
}

TARGET_512 INL __m512 join_ps(__m256 lo, __m256 hi) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1));
}

/* Q8_0x8: vector v of block b of groups g0 (lanes 0-7) and g1 (8-15) as
 * u = value ^ 0x80. */
TARGET_512 INL __m512i q8_pair512(const uint8_t *g0, const uint8_t *g1, int b, int v) {
    const size_t at = (size_t)b * KT_Q8X8_QS_BYTES + 32 * (size_t)v;
    const __m512i p = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(g0 + at))),
                                         _mm256_loadu_si256((const __m256i *)(g1 + at)), 1);
    return _mm512_xor_si512(p, _mm512_set1_epi8((char)0x80));
}

TARGET_512 INL void q4_tile_512(const q_args *a, const legacy_fmt *f, const bool packed, const int T, int r0,
                                int t0, int nt) {
    tile_x x;
    tile_x_init(&x, a, t0, nt, T);
    const uint8_t *g0 = packed ? x8_group(a, r0) : NULL, *g1 = packed ? x8_group(a, r0 + Q4_ROWS) : NULL;
    const __m512i low = _mm512_set1_epi8(0x0F);
    __m512 acc[Q4_TOKENS512];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();

    for (int b = 0; b < a->x->nb; b++) {
        if (packed) { /* every tile: a wide one is long enough to hide the next group's fetch */
            x8_prefetch(a, f, g0, 2 * Q4_ROWS * a->row_bytes, b);
            x8_prefetch(a, f, g1, 2 * Q4_ROWS * a->row_bytes, b);
        }
        __m512i isum[Q4_TOKENS512];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) isum[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            __m512i lo, hi;
            if (packed && f->q8) { /* both groups' vectors v and v + 4 */
                lo = q8_pair512(g0, g1, b, v);
                hi = q8_pair512(g0, g1, b, v + 4);
            } else if (packed) { /* both groups' packed vectors, unpacked at once */
                const __m512i p = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(g0 + (size_t)b * KT_X8_QS_BYTES + 32 * v))),
                    _mm256_loadu_si256((const __m256i *)(g1 + (size_t)b * KT_X8_QS_BYTES + 32 * v)), 1);
                lo = _mm512_and_si512(p, low);
                hi = _mm512_and_si512(_mm512_srli_epi16(p, 4), low);
                if (f->nl) { /* u = level + 128 (FMT_IQ4_NL, FMT_MXFP4) */
                    const __m512i tab = _mm512_xor_si512(
                        _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)f->table)), _mm512_set1_epi8((char)0x80));
                    lo = _mm512_shuffle_epi8(tab, lo);
                    hi = _mm512_shuffle_epi8(tab, hi);
                }
                if (f->qh_off >= 0) { /* 16 added where the two groups' masks have the bit */
                    lo = _mm512_mask_add_epi8(lo, x8_mask64(a, g0, g1, b, v), lo, _mm512_set1_epi8(16));
                    hi = _mm512_mask_add_epi8(hi, x8_mask64(a, g0, g1, b, v + 4), hi, _mm512_set1_epi8(16));
                }
            } else {
                __m256i lo0, hi0, lo1, hi1;
                q4_vecs(a, f, NULL, a->panel, b, v, &lo0, &hi0);
                q4_vecs(a, f, NULL, a->panel2, b, v, &lo1, &hi1);
                lo = _mm512_inserti64x4(_mm512_castsi256_si512(lo0), lo1, 1);
                hi = _mm512_inserti64x4(_mm512_castsi256_si512(hi0), hi1, 1);
            }
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                isum[t] = _mm512_dpbusd_epi32(isum[t], lo, _mm512_set1_epi32(tile_x4(&x, t, b, v)));
                isum[t] = _mm512_dpbusd_epi32(isum[t], hi, _mm512_set1_epi32(tile_x4(&x, t, b, v + 4)));
            }
        }
        const __m512 dw = join_ps(q4_scales(a, f, g0, a->panel_d, b), q4_scales(a, f, g1, a->panel_d2, b));
        const __m512 mw = join_ps(q4_mins(a, f, g0, a->panel_m, b), q4_mins(a, f, g1, a->panel_m2, b));
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) { /* q4_block_step, 16 lanes */
            __m512i is = isum[t];
            if (f->c8_mul) is = _mm512_sub_epi32(is, _mm512_set1_epi32(f->c8_mul * x.c8[t][b]));
            const __m512 dx = _mm512_set1_ps(x.d[t][b]);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dw, dx), acc[t]);
            if (f->m_off >= 0)
                acc[t] = _mm512_fmadd_ps(_mm512_set1_ps((float)(x.c8[t][b] / 8)), _mm512_mul_ps(mw, dx), acc[t]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++)
        if (t < nt) _mm512_storeu_ps(a->out + (size_t)(t0 + t) * a->n_out + r0, acc[t]);
}

/* ---- Q4_1, Q5_0, Q5_1: the GEMV ----------------------------------------
 *
 * As the Q4_0 GEMV: 8 rows of one token, row r in lane r. The 5-bit
 * levels' pair sums (up to 7874) no longer fit 16 of them in int16, so
 * each row's products are widened to int32 (madd) before the
 * horizontal-add tree. Few tokens (no panel, or too few to pay for one)
 * share each block's unpacked levels, LEGACY_TOKENS at a time.
 */

#define LEGACY_TOKENS 4 /* tokens per tile: each block unpacked once for them */

/* Lane r = sum q x over the levels lv[r] of row r's block, in int32
 * throughout; Q8_0: sum value x (the sign trick: u would saturate
 * maddubs), without u's offset. */
INL __m256i legacy_dot8(const legacy_fmt *f, const __m256i *lv, __m256i x) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i m[Q4_ROWS];
#pragma GCC unroll 8
    for (int r = 0; r < Q4_ROWS; r++) {
        if (f->q8) {
            const __m256i w = _mm256_xor_si256(lv[r], _mm256_set1_epi8((char)0x80));
            m[r] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)), ones);
        } else {
            m[r] = _mm256_madd_epi16(_mm256_maddubs_epi16(lv[r], x), ones);
        }
    }
    /* per 128-bit half: lanes 0..3 = rows 0..3 (h0) or 4..7 (h1) */
    __m256i h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(m[0], m[1]), _mm256_hadd_epi32(m[2], m[3]));
    __m256i h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(m[4], m[5]), _mm256_hadd_epi32(m[6], m[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(h0, h1, 0x20),
                            _mm256_permute2x128_si256(h0, h1, 0x31));
}

/* Outputs r0 .. r0+nr-1 of tokens t0 .. t0+T-1 (T <= LEGACY_TOKENS, a
 * constant after inlining): each block's levels are unpacked once for the
 * T tokens; every output gets the same operations as alone. */
INL void legacy_tile(const legacy_fmt *f, const q_args *a, int r0, int nr, int t0, const int T) {
    const int nb = a->x->nb;
    const char *rows[Q4_ROWS];
    tile_rows(a, r0, nr, rows);
    tile_x x;
    tile_x_init(&x, a, t0, T, T);
    __m256 acc[LEGACY_TOKENS];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        prefetch_rows_ahead(rows, Q4_ROWS, a->row_bytes, f->bb, b);
        __m256i lv[Q4_ROWS];
#pragma GCC unroll 8
        for (int r = 0; r < Q4_ROWS; r++) lv[r] = load_levels(f, rows[r], b);
        const __m256 dw = halves8(rows, f->bb, 0, b);
        const __m256 mw = f->m_off >= 0 ? halves8(rows, f->bb, (size_t)f->m_off, b) : dw;
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const __m256i xv = _mm256_load_si256((const __m256i *)(x.q[t] + (size_t)b * QK8_0));
            __m256i isum = legacy_dot8(f, lv, xv);
            if (f->q8) /* u's offset, which the step takes off */
                isum = _mm256_add_epi32(isum, _mm256_set1_epi32(f->c8_mul * x.c8[t][b]));
            acc[t] = q4_block_step(f, acc[t], isum, dw, mw, &x, t, b);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) store_lanes(a->out + (size_t)(t0 + t) * a->n_out + r0, acc[t], nr);
}

/* Rows [r0, r1) of every token without a panel: per chunk of tokens whose
 * activations stay in L2, per 8 rows, LEGACY_TOKENS tokens at a time. */
INL void legacy_rows(const legacy_fmt *f, const q_args *a, int n_tokens, int r0, int r1) {
    const int chunk = token_chunk(a->x->nb * QK8_0, 1);
    for (int c0 = 0; c0 < n_tokens; c0 += chunk) {
        const int c1 = c0 + chunk < n_tokens ? c0 + chunk : n_tokens;
        for (int r = r0; r < r1; r += Q4_ROWS) {
            const int nr = r1 - r < Q4_ROWS ? r1 - r : Q4_ROWS;
            int t = c0;
            for (; t + LEGACY_TOKENS <= c1; t += LEGACY_TOKENS) legacy_tile(f, a, r, nr, t, LEGACY_TOKENS);
            for (; t < c1; t++) legacy_tile(f, a, r, nr, t, 1);
        }
    }
}

/* Q4_0 without a panel: rows outer, so the 8 rows stay in L1 for every
 * token and a batch of decode tokens streams the matrix once. */
static void q4_few(const q_args *a, int n_tokens, int r0, int r1) {
    for (int r = r0; r < r1; r += Q4_ROWS)
        for (int t = 0; t < n_tokens; t++) q4_gemv(a, r, r1 - r < Q4_ROWS ? r1 - r : Q4_ROWS, t);
}

/* ---- the instances -------------------------------------------------------
 *
 * The x8 layouts: tokens per tile. Panels: per format, a `panel_kind` with its
 * tiles (constant format, so each compiles to that format's code) and
 * its no-panel path. */
typedef void (*q4_tile8_fn)(const q_args *, int r0, int nr, int t0, int nt);
typedef void (*q4_tile16_fn)(const q_args *, int r0, int t0, int nt);

/* The x8 tiles of one format: AVX2 and AVX-VNNI 8 rows x 1, 2, 4 tokens;
 * AVX-512 16 rows x 1, 2, 4, 8 tokens. */
typedef struct x8_kind {
    q4_tile8_fn avx2[3], vnni[3]; /* 1, 2, Q4_TOKENS tokens */
    q4_tile16_fn w[4];            /* 1, 2, 4, Q4_TOKENS512 tokens */
} x8_kind;

#define X8_KIND(ty, FMT)                                                                           \
    static void ty##_a1(const q_args *a, int r0, int nr, int t0, int nt) { q4_tile_avx2(a, &FMT, true, 1, r0, nr, t0, nt); } \
    static void ty##_a2(const q_args *a, int r0, int nr, int t0, int nt) { q4_tile_avx2(a, &FMT, true, 2, r0, nr, t0, nt); } \
    static void ty##_a4(const q_args *a, int r0, int nr, int t0, int nt) { q4_tile_avx2(a, &FMT, true, Q4_TOKENS, r0, nr, t0, nt); } \
    TARGET_VNNI static void ty##_v1(const q_args *a, int r0, int nr, int t0, int nt) { q4_tile_vnni(a, &FMT, true, 1, r0, nr, t0, nt); } \
    TARGET_VNNI static void ty##_v2(const q_args *a, int r0, int nr, int t0, int nt) { q4_tile_vnni(a, &FMT, true, 2, r0, nr, t0, nt); } \
    TARGET_VNNI static void ty##_v4(const q_args *a, int r0, int nr, int t0, int nt) { q4_tile_vnni(a, &FMT, true, Q4_TOKENS, r0, nr, t0, nt); } \
    TARGET_512 static void ty##_w1(const q_args *a, int r0, int t0, int nt) { q4_tile_512(a, &FMT, true, 1, r0, t0, nt); } \
    TARGET_512 static void ty##_w2(const q_args *a, int r0, int t0, int nt) { q4_tile_512(a, &FMT, true, 2, r0, t0, nt); } \
    TARGET_512 static void ty##_w4(const q_args *a, int r0, int t0, int nt) { q4_tile_512(a, &FMT, true, 4, r0, t0, nt); } \
    TARGET_512 static void ty##_w8(const q_args *a, int r0, int t0, int nt) { q4_tile_512(a, &FMT, true, Q4_TOKENS512, r0, t0, nt); } \
    static const x8_kind ty = {{ty##_a1, ty##_a2, ty##_a4}, {ty##_v1, ty##_v2, ty##_v4},              \
                               {ty##_w1, ty##_w2, ty##_w4, ty##_w8}};

X8_KIND(X8_Q4_0, FMT_Q4_0)
X8_KIND(X8_Q4_1, FMT_Q4_1)
X8_KIND(X8_Q5_0, FMT_Q5_0)
X8_KIND(X8_Q5_1, FMT_Q5_1)
X8_KIND(X8_IQ4_NL, FMT_IQ4_NL)
X8_KIND(X8_MXFP4, FMT_MXFP4)
X8_KIND(X8_Q8_0, FMT_Q8_0)

typedef struct panel_kind {
    const legacy_fmt *f;
    void (*few)(const q_args *, int n_tokens, int r0, int r1); /* no panel */
    void (*one)(const q_args *, int r0, int nr, int t);        /* one token, 8 rows */
    q4_tile8_fn avx2, vnni;                                     /* 8 rows x Q4_TOKENS */
    q4_tile16_fn w4, w8;                                        /* AVX-512: 16 rows x 4, x 8 */
} panel_kind;

#define PANEL_KIND(ty, FMT, FEW, ONE)                                                              \
    static void ty##_avx2(const q_args *a, int r0, int nr, int t0, int nt) {                       \
        q4_tile_avx2(a, &FMT, false, Q4_TOKENS, r0, nr, t0, nt);                                   \
    }                                                                                              \
    TARGET_VNNI static void ty##_vnni(const q_args *a, int r0, int nr, int t0, int nt) {           \
        q4_tile_vnni(a, &FMT, false, Q4_TOKENS, r0, nr, t0, nt);                                   \
    }                                                                                              \
    TARGET_512 static void ty##_w4(const q_args *a, int r0, int t0, int nt) {                      \
        q4_tile_512(a, &FMT, false, 4, r0, t0, nt);                                                \
    }                                                                                              \
    TARGET_512 static void ty##_w8(const q_args *a, int r0, int t0, int nt) {                      \
        q4_tile_512(a, &FMT, false, Q4_TOKENS512, r0, t0, nt);                                     \
    }                                                                                              \
    static const panel_kind PANEL_##ty = {&FMT, FEW, ONE, ty##_avx2, ty##_vnni, ty##_w4, ty##_w8};

#define LEGACY_PATHS(ty, FMT)                                                                      \
    static void ty##_few(const q_args *a, int n_tokens, int r0, int r1) {                          \
        legacy_rows(&FMT, a, n_tokens, r0, r1);                                                    \
    }                                                                                              \
    static void ty##_one(const q_args *a, int r0, int nr, int t) { legacy_tile(&FMT, a, r0, nr, t, 1); }

LEGACY_PATHS(q4_1, FMT_Q4_1)
LEGACY_PATHS(q5_0, FMT_Q5_0)
LEGACY_PATHS(q5_1, FMT_Q5_1)
LEGACY_PATHS(q8_0, FMT_Q8_0)
PANEL_KIND(q4_0, FMT_Q4_0, q4_few, q4_gemv)
PANEL_KIND(q4_1, FMT_Q4_1, q4_1_few, q4_1_one)
PANEL_KIND(q5_0, FMT_Q5_0, q5_0_few, q5_0_one)
PANEL_KIND(q5_1, FMT_Q5_1, q5_1_few, q5_1_one)
PANEL_KIND(q8_0, FMT_Q8_0, q8_0_few, q8_0_one)

/* One panel: levels, scales, minima; two of them (the AVX-512 tiles'
 * 16 rows). */
static size_t panel_one_bytes(int nb) { return (size_t)nb * Q4_ROWS * (32 + 2 * sizeof(float)); }

size_t kt_matmul_panel_bytes(int n_in) {
    return 2 * panel_one_bytes(n_in / QK8_0); /* a multiple of 64 */
}

/* Points a at panel p (0 or 1) of the work area. */
static void panel_carve(q_args *a, void *area, int p) {
    const size_t nb = (size_t)a->x->nb;
    int8_t *q = (int8_t *)((char *)area + (size_t)p * panel_one_bytes(a->x->nb));
    float *d = (float *)(q + nb * Q4_ROWS * 32), *m = d + nb * Q4_ROWS;
    if (p == 0) a->panel = q, a->panel_d = d, a->panel_m = m;
    else a->panel2 = q, a->panel_d2 = d, a->panel_m2 = m;
}

/* Rows [r0, r1) of every token: the no-panel path for few tokens;
 * otherwise, per chunk of tokens and 8 (AVX-512: 16) rows, a panel, then
 * the widest tiles that fit the tokens against it. */
static void panel_rows(q_args *a, const panel_kind *k, int n_tokens, int r0, int r1, void *area) {
    /* with VNNI, 2 tokens already pay for a panel (a 4-token tile costs
     * less than two GEMVs); without, from 3 */
    const int min_gemm = kt_cpu_has_avx_vnni() ? 2 : Q4_MIN_GEMM;
    if (n_tokens < min_gemm || !area) {
        k->few(a, n_tokens, r0, r1);
        return;
    }
    panel_carve(a, area, 0);
    panel_carve(a, area, 1);
    q_args second = *a; /* the next 8 rows, built into the second panel */
    second.panel = a->panel2, second.panel_d = a->panel_d2, second.panel_m = a->panel_m2;
    const bool wide = kt_cpu_has_avx512_vnni();
    const int chunk = token_chunk(a->x->nb * QK8_0, 1);
    const q4_tile8_fn tile = kt_cpu_has_avx_vnni() ? k->vnni : k->avx2;
    for (int c0 = 0; c0 < n_tokens; c0 += chunk) {
        const int c1 = c0 + chunk < n_tokens ? c0 + chunk : n_tokens;
        int r = r0;
        for (; wide && r + 2 * Q4_ROWS <= r1; r += 2 * Q4_ROWS) {
            panel_build(a, k->f, r, Q4_ROWS);
            panel_build(&second, k->f, r + Q4_ROWS, Q4_ROWS);
            int t = c0;
            for (; t + Q4_TOKENS512 <= c1; t += Q4_TOKENS512) k->w8(a, r, t, Q4_TOKENS512);
            for (; t + 1 < c1; t += Q4_TOKENS) k->w4(a, r, t, c1 - t < Q4_TOKENS ? c1 - t : Q4_TOKENS);
            if (t < c1) k->one(a, r, Q4_ROWS, t), k->one(a, r + Q4_ROWS, Q4_ROWS, t);
        }
        for (; r < r1; r += Q4_ROWS) {
            const int nr = r1 - r < Q4_ROWS ? r1 - r : Q4_ROWS;
            panel_build(a, k->f, r, nr);
            int t = c0;
            for (; t + 1 < c1; t += Q4_TOKENS) tile(a, r, nr, t, c1 - t < Q4_TOKENS ? c1 - t : Q4_TOKENS);
            if (t < c1) k->one(a, r, nr, t); /* a last single token: no 3 wasted columns */
        }
    }
}

void kt_matmul_q8_0_avx2(float *out, const void *w, const kt_q8_act *x, int n_in, int n_out,
                         int n_tokens, int r0, int r1, void *panel) {
    q_args a = {.w = w, .row_bytes = kt_dtype_row_bytes(KT_Q8_0, n_in), .x = x, .out = out, .n_out = n_out};
    panel_rows(&a, &PANEL_q8_0, n_tokens, r0, r1, panel);
}

void kt_matmul_q4_0_avx2(float *out, const void *w, const kt_q8_act *x, int n_in, int n_out,
                         int n_tokens, int r0, int r1, void *panel) {
    q_args a = {.w = w, .row_bytes = kt_dtype_row_bytes(KT_Q4_0, n_in), .x = x, .out = out, .n_out = n_out};
    panel_rows(&a, &PANEL_q4_0, n_tokens, r0, r1, panel);
}

void kt_matmul_legacy_avx2(float *out, const void *w, kt_dtype wtype, const kt_q8_act *x,
                           int n_in, int n_out, int n_tokens, int r0, int r1, void *panel) {
    q_args a = {.w = w, .row_bytes = kt_dtype_row_bytes(wtype, n_in), .x = x, .out = out, .n_out = n_out};
    const panel_kind *k = wtype == KT_Q4_1 ? &PANEL_q4_1 : wtype == KT_Q5_0 ? &PANEL_q5_0 : &PANEL_q5_1;
    panel_rows(&a, k, n_tokens, r0, r1, panel);
}

/* Q4_0x8, Q4_1x8, Q5_0x8, Q5_1x8 rows [r0, r1) (multiples of 8): the tiles read the
 * groups as stored, so one token takes the 1-token tiles and more take
 * the wide ones directly, with no panel. Tokens go in chunks whose
 * activations stay in L2, as for the panel GEMM. */
void kt_matmul_x8_avx2(float *out, const void *w, kt_dtype wtype, const kt_q8_act *x, int n_in, int n_out,
                       int n_tokens, int r0, int r1) {
    const kt_dtype plain = kt_repack_plain(wtype);
    const q_args a = {.w = w, .row_bytes = kt_dtype_row_bytes(plain, n_in), .x = x, .out = out, .n_out = n_out};
    const x8_kind *k = plain == KT_Q4_1 ? &X8_Q4_1 : plain == KT_Q5_0 ? &X8_Q5_0 : plain == KT_Q5_1 ? &X8_Q5_1
                       : plain == KT_IQ4_NL ? &X8_IQ4_NL : plain == KT_MXFP4 ? &X8_MXFP4
                       : plain == KT_Q8_0 ? &X8_Q8_0 : &X8_Q4_0;
    const bool wide = kt_cpu_has_avx512_vnni();
    const q4_tile8_fn *tile = kt_cpu_has_avx_vnni() ? k->vnni : k->avx2;
    const int chunk = token_chunk(n_in, 1);
    for (int c0 = 0; c0 < n_tokens; c0 += chunk) {
        const int c1 = c0 + chunk < n_tokens ? c0 + chunk : n_tokens;
        int r = r0;
        for (; wide && r + 2 * Q4_ROWS <= r1; r += 2 * Q4_ROWS)
            for (int t = c0; t < c1;) {
                const int n = c1 - t;
                if (n >= Q4_TOKENS512) k->w[3](&a, r, t, Q4_TOKENS512), t += Q4_TOKENS512;
                else if (n >= 3) k->w[2](&a, r, t, n < 4 ? n : 4), t += n < 4 ? n : 4;
                else if (n == 2) k->w[1](&a, r, t, 2), t += 2; /* decode of 2 streams */
                else k->w[0](&a, r, t, 1), t++;
            }
        for (; r < r1; r += Q4_ROWS)
            for (int t = c0; t < c1;) {
                const int n = c1 - t;
                if (n >= 3) tile[2](&a, r, Q4_ROWS, t, n < 4 ? n : 4), t += n < 4 ? n : 4;
                else if (n == 2) tile[1](&a, r, Q4_ROWS, t, 2), t += 2;
                else tile[0](&a, r, Q4_ROWS, t, 1), t++;
            }
    }
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
                _mm_prefetch(rows[r] + (size_t)i * esz + (size_t)R * a->row_bytes, _MM_HINT_T1);
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

/* AVX-512: two outputs per 512-bit vector, each keeping its own 8 lanes
 * (lanes 0-7: row 2p, 8-15: row 2p+1, same token), as the Q8_0 tile does:
 * every lane takes the AVX2 tile's fma sequence, then the same hsum8 and
 * tail, so the bits are those of the AVX2 tiles while each fma does 16
 * multiply-adds. FW_PAIRS row pairs x FW_TOKENS tokens per GEMM tile. */
#ifndef FW_PAIRS
#define FW_PAIRS 4
#endif
#ifndef FW_TOKENS
#define FW_TOKENS 6
#endif
#define FW_PAIRS_MAX 4
#define FW_TOKENS_MAX 8

/* Values i .. i+7 of rows r0 (lanes 0-7) and r1 (lanes 8-15). */
TARGET_512 INL __m512 load_w16(kt_dtype wt, const char *r0, const char *r1, int i) {
    if (wt == KT_F32)
        return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(_mm256_loadu_ps((const float *)r0 + i))),
                                                   _mm256_castps_pd(_mm256_loadu_ps((const float *)r1 + i)), 1));
    const __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)((const uint16_t *)r0 + i))),
                                              _mm_loadu_si128((const __m128i *)((const uint16_t *)r1 + i)), 1);
    if (wt == KT_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); /* BF16 */
}

TARGET_512 INL void f_tile_512(const f_args *a, const kt_dtype wt, const int P, const int T, int r0, int t0) {
    const int n_in = a->n_in, n8 = n_in & ~7;
    const char *rows[2 * FW_PAIRS_MAX];
    const float *xs[FW_TOKENS_MAX];
    __m512 acc[FW_PAIRS_MAX][FW_TOKENS_MAX];
#pragma GCC unroll 8
    for (int r = 0; r < 2 * P; r++) rows[r] = a->w + (size_t)(r0 + r) * a->row_bytes;
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) xs[t] = a->x + (size_t)(t0 + t) * n_in;
#pragma GCC unroll 4
    for (int p = 0; p < P; p++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) acc[p][t] = _mm512_setzero_ps();

    const int esz = wt == KT_F32 ? 4 : 2;
    for (int i = 0; i < n8; i += 8) {
        if (T == 1 && (i & (64 / esz - 1)) == 0) { /* one line ahead of the next 2P rows */
#pragma GCC unroll 8
            for (int r = 0; r < 2 * P; r++)
                _mm_prefetch(rows[r] + (size_t)i * esz + (size_t)2 * P * a->row_bytes, _MM_HINT_T1);
        }
        __m512 w[FW_PAIRS_MAX];
#pragma GCC unroll 4
        for (int p = 0; p < P; p++) w[p] = load_w16(wt, rows[2 * p], rows[2 * p + 1], i);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            const __m512 x = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(xs[t] + i))));
#pragma GCC unroll 4
            for (int p = 0; p < P; p++) acc[p][t] = _mm512_fmadd_ps(w[p], x, acc[p][t]);
        }
    }
#pragma GCC unroll 4
    for (int p = 0; p < P; p++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const char *row = rows[2 * p + h];
                float tail = 0.0f;
                for (int i = n8; i < n_in; i++) tail = fmaf(load_w1(wt, row, i), xs[t][i], tail);
                /* the intrinsic needs a constant half: no loop variable */
                const __m256 lanes = h ? _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[p][t]), 1))
                                       : _mm512_castps512_ps256(acc[p][t]);
                a->out[(size_t)(t0 + t) * a->n_out + r0 + 2 * p + h] = hsum8(lanes) + tail;
            }
}

typedef struct f_tiles512 {
    void (*gemv)(const f_args *a, int r0, int t0);  /* 8 rows x 1 token */
    void (*full)(const f_args *a, int r0, int t0);  /* 2 FW_PAIRS rows x FW_TOKENS tokens */
} f_tiles512;

#define F_TILES512(ty, wt)                                                                         \
    TARGET_512 static void ty##_gemv512(const f_args *a, int r0, int t0) { f_tile_512(a, wt, 4, 1, r0, t0); } \
    TARGET_512 static void ty##_full512(const f_args *a, int r0, int t0) {                         \
        f_tile_512(a, wt, FW_PAIRS, FW_TOKENS, r0, t0);                                            \
    }                                                                                              \
    static const f_tiles512 F_TILES512_##ty = {ty##_gemv512, ty##_full512};

F_TILES512(f32, KT_F32)
F_TILES512(f16, KT_F16)
F_TILES512(bf16, KT_BF16)

void kt_matmul_float_avx2(float *out, const void *w, kt_dtype wtype, const float *xf, int n_in,
                          int n_out, int n_tokens, int r0, int r1) {
    const f_tiles *k = wtype == KT_F16 ? &F_TILES_f16 : wtype == KT_BF16 ? &F_TILES_bf16 : &F_TILES_f32;
    const f_tiles512 *k512 = !kt_cpu_has_avx512_vnni() ? NULL
                             : wtype == KT_F16 ? &F_TILES512_f16 : wtype == KT_BF16 ? &F_TILES512_bf16 : &F_TILES512_f32;
    f_args a = {w, kt_dtype_row_bytes(wtype, n_in), xf, out, n_in, n_out};
    if (n_tokens == 1) {
        int r = r0;
        for (; k512 && r + 8 <= r1; r += 8) k512->gemv(&a, r, 0);
        for (; r + GEMV_ROWS <= r1; r += GEMV_ROWS) k->gemv(&a, r, 0);
        for (; r < r1; r++) k->one(&a, r, 0);
        return;
    }
    const int chunk = token_chunk(n_in, 4);
    for (int c0 = 0; c0 < n_tokens; c0 += chunk) {
        int c1 = c0 + chunk < n_tokens ? c0 + chunk : n_tokens;
        int r = r0;
        for (; k512 && r + 2 * FW_PAIRS <= r1; r += 2 * FW_PAIRS) {
            int t = c0;
            for (; t + FW_TOKENS <= c1; t += FW_TOKENS) k512->full(&a, r, t);
            for (; t < c1; t++) { /* the AVX2 tiles: the same bits */
                int rr = r;
                for (; rr + FT_ROWS <= r + 2 * FW_PAIRS; rr += FT_ROWS) k->rows1(&a, rr, t);
                for (; rr < r + 2 * FW_PAIRS; rr++) k->one(&a, rr, t);
            }
        }
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
