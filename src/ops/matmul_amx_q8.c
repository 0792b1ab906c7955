/*
 * matmul_amx_q8.c - the prefill GEMM of the 32-value x8 formats (Q4_0x8,
 * Q8_0x8, IQ4_NLx8, MXFP4x8; ops/repack.h) on AMX-INT8 tiles; compiled
 * with -mamx-tile -mamx-int8 and AVX-512 where the compiler has them
 * (CMakeLists.txt), a stub otherwise (kt_cpu_has_amx_int8 is then false).
 *
 * Why: a prompt's prefill is bound by these GEMMs' integer products. The
 * AVX-512 tile does 64 of them per vpdpbusd; one TDPBSSD does 16 x 16 x 32
 * = 8192, so what is left is the per-block float step every format has.
 *
 * The math is the reference's, bit for bit (docs/ARCHITECTURE.md,
 * "Summation orders"): per output and block b, in block order,
 *
 *     acc = fmaf((float)isum_b, d_w[b] * d_x[b], acc)
 *
 * with isum_b the exact integer dot product of the block's 32 weight values
 * and 32 int8 activations. One TDPBSSD with 32-byte rows forms exactly
 * those sums for 16 tokens x 16 rows (int32, no saturation: |isum| <= 32 x
 * 128 x 127), the tile goes to memory, and the AVX-512 steps that follow
 * are the AVX-512 tile's (q4_tile_512): the same conversion, product and
 * fma on the same values. So the result is the same whatever the tier,
 * and a token's logits do not depend on whether it came in a prefill on
 * the tiles or a decode step on the vectors.
 *
 * Tiles: 0-3 the int32 sums of blocks in flight (16 tokens x 16 rows), 4-5
 * their activations (16 tokens x 32 bytes: one Q8_0 block of each, read in
 * place, nb x 32 bytes apart), 6-7 their weights (8 x 64 bytes: row k
 * holds values 4k .. 4k + 3 of each of the 16 rows, TDPBSSD's second
 * operand). The weights come as signed values, unpacked once per 16 rows
 * and chunk of tokens into the caller's panel (a block: 512 bytes of
 * values, then the 16 rows' d_w as floats), which stays in L2 while the
 * chunk's token tiles go by; the chunk's activations stay in L2 too, and
 * their d_x are gathered 16 tokens a block so one pointer reaches them.
 *
 * Where the time goes: not the tile products but the float steps (per
 * block a conversion, a product and an fma per 16 outputs, the
 * specification's three operations, which the AVX-512 tile pays as well
 * beside its 8 vpdpbusd) and the tile stores that feed them; ~1.5x the
 * AVX-512 tiles' prefill on a 4B model (docs/PERFORMANCE.md).
 */
#include "ops/internal.h"

#include "ops/amx.h"
#include "ops/cpu.h"
#include "ops/kquant.h"
#include "ops/repack.h"

#define TOK 16  /* tokens a tile: fewer never come here */
#define ROWS 16 /* rows a tile: two x8 groups */

#if defined(__AMX_TILE__) && defined(__AMX_INT8__)

#include <immintrin.h>

#define VALS_BYTES 512  /* a block's weight tile */
#define BLOCK_BYTES (VALS_BYTES + ROWS * (int)sizeof(float))
#define CHUNK_BYTES (1024 * 1024) /* activations per pass: half of a 2 MiB L2 */

/* tiles 0-3: sums, 16 tokens x 16 int32; 4-5: activations, 16 tokens x
 * 32 bytes; 6-7: weights, 8 rows of 16 x 4 bytes */
static void config_tiles(void) {
    const kt_amx_tile_config c = kt_amx_config((const uint16_t[8]){64, 64, 64, 64, QK8_0, QK8_0, 64, 64},
                                               (const uint8_t[8]){TOK, TOK, TOK, TOK, TOK, TOK, QK8_0 / 4, QK8_0 / 4});
    _tile_loadconfig(&c);
}

typedef enum { K_Q4_0, K_Q8_0, K_IQ4_NL, K_MXFP4 } q8_kind;

static q8_kind kind_of(kt_dtype wtype) {
    switch (wtype) {
    case KT_Q8_0_X8: return K_Q8_0;
    case KT_IQ4_NL_X8: return K_IQ4_NL;
    case KT_MXFP4_X8: return K_MXFP4;
    default: return K_Q4_0;
    }
}

/* Bytes of a group's values per block: 8 rows' nibbles, or (Q8_0) bytes. */
static size_t qs_bytes(q8_kind k) { return k == K_Q8_0 ? KT_Q8X8_QS_BYTES : KT_X8_QS_BYTES; }

/* Vector v of block b of groups g0 and g1 side by side: bytes 0-31 g0's
 * 8 rows, 32-63 g1's, 4 bytes a row (ops/repack.h). */
static inline __m512i pair(const uint8_t *g0, const uint8_t *g1, size_t at) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(g0 + at))),
                              _mm256_loadu_si256((const __m256i *)(g1 + at)), 1);
}

/* The panel of the 16 rows in groups g0, g1: per block the weight tile
 * (signed values: Q4_0 level - 8, the IQ4_NL / MXFP4 table's value, Q8_0's
 * byte) and d_w, the floats the vector tiles multiply by. */
static void build_panel(uint8_t *panel, q8_kind k, const uint8_t *g0, const uint8_t *g1, int nb) {
    const int8_t *table = k == K_IQ4_NL ? KT_IQ4NL_VALUES : KT_MXFP4_VALUES;
    const __m512i tab = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)table));
    const __m512i low = _mm512_set1_epi8(0x0F), eight = _mm512_set1_epi8(8);
    const size_t scales = (size_t)nb * qs_bytes(k);
    for (int b = 0; b < nb; b++) {
        uint8_t *blk = panel + (size_t)b * BLOCK_BYTES;
        if (k == K_Q8_0) {
            for (int v = 0; v < 8; v++) _mm512_store_si512(blk + 64 * v, pair(g0, g1, (size_t)b * KT_Q8X8_QS_BYTES + 32 * v));
        } else {
            for (int v = 0; v < 4; v++) { /* low nibbles: values 4v.., high: 16 + 4v.. */
                const __m512i p = pair(g0, g1, (size_t)b * KT_X8_QS_BYTES + 32 * v);
                __m512i lo = _mm512_and_si512(p, low), hi = _mm512_and_si512(_mm512_srli_epi16(p, 4), low);
                if (k == K_Q4_0) {
                    lo = _mm512_sub_epi8(lo, eight);
                    hi = _mm512_sub_epi8(hi, eight);
                } else {
                    lo = _mm512_shuffle_epi8(tab, lo);
                    hi = _mm512_shuffle_epi8(tab, hi);
                }
                _mm512_store_si512(blk + 64 * v, lo);
                _mm512_store_si512(blk + 64 * (v + 4), hi);
            }
        }
        float *dw = (float *)(blk + VALS_BYTES);
        if (k == K_MXFP4) {
            for (int r = 0; r < ROWS; r++) dw[r] = kt_e8m0_half((r < 8 ? g0 : g1)[scales + (size_t)b * 8 + r % 8]);
        } else {
            const __m256i h = _mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(g0 + scales + (size_t)b * 16))),
                _mm_loadu_si128((const __m128i *)(g1 + scales + (size_t)b * 16)), 1);
            _mm512_store_ps(dw, _mm512_cvtph_ps(h));
        }
    }
}

/* Token m's 16 rows, acc_m, += a block's step, from its sums c[m][16],
 * the rows' d_w and the tokens' d_x (token m's at dx[m]). Sixteen named
 * accumulators: GCC keeps an array of them in memory around the tile
 * instructions, which doubles the step's memory operations. */
#define ACC(m) acc##m = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c_ + 16 * (m))), \
                                        _mm512_mul_ps(dw_, _mm512_set1_ps(dx_[m])), acc##m)
#define BLOCK_STEP(c, dw_at, dx)                                                                    \
    do {                                                                                            \
        const int32_t *c_ = (c);                                                                    \
        const float *dx_ = (dx);                                                                    \
        const __m512 dw_ = _mm512_load_ps(dw_at);                                                   \
        ACC(0), ACC(1), ACC(2), ACC(3), ACC(4), ACC(5), ACC(6), ACC(7);                             \
        ACC(8), ACC(9), ACC(10), ACC(11), ACC(12), ACC(13), ACC(14), ACC(15);                       \
    } while (0)

/* Block bk's product into sums tile C, through activation tile A and
 * weight tile B (constants: tile numbers are immediates). */
#define ISSUE(C, A, B, bk)                                                                          \
    do {                                                                                            \
        _tile_zero(C);                                                                              \
        _tile_loadd(A, xq + (size_t)(bk) * QK8_0, stride);                                          \
        _tile_loadd(B, panel + (size_t)(bk) * BLOCK_BYTES, 64);                                     \
        _tile_dpbssd(C, A, B);                                                                      \
    } while (0)

/* Step b of the pipeline: block b + 2's product issued (sums tile
 * (b + 2) % 4, its operands in tiles 4 + b % 2, 6 + b % 2), block b + 1's
 * sums (issued a step ago) stored, block b's (stored a step ago) stepped.
 * So a product has a block's float steps to finish before its store
 * waits on it, and a store as long before its sums are read back. */
#define STEP(CN, AN, BN, CS)                                                                        \
    do {                                                                                            \
        if (b + 2 < nb) ISSUE(CN, AN, BN, b + 2);                                                   \
        if (b + 1 < nb) _tile_stored(CS, c[(b + 1) & 1], 64);                                       \
        BLOCK_STEP(c[b & 1], (const float *)(panel + (size_t)b * BLOCK_BYTES + VALS_BYTES), dx + b * TOK); \
    } while (0)

/* 16 tokens (activations xq: token 0's block 0; d_x: dx, block b's 16 at
 * dx + 16 b) x the panel's 16 rows, into out (token m's rows at out + m *
 * n_out). */
static void tile(float *out, int n_out, const int8_t *xq, const float *dx, int nb, const uint8_t *panel) {
    const size_t stride = (size_t)nb * QK8_0;
    _Alignas(64) int32_t c[2][TOK * 16];
    __m512 acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, acc8, acc9, acc10, acc11, acc12, acc13, acc14, acc15;
    acc0 = acc1 = acc2 = acc3 = acc4 = acc5 = acc6 = acc7 = _mm512_setzero_ps();
    acc8 = acc9 = acc10 = acc11 = acc12 = acc13 = acc14 = acc15 = _mm512_setzero_ps();
    ISSUE(0, 4, 6, 0);
    if (nb > 1) ISSUE(1, 5, 7, 1);
    _tile_stored(0, c[0], 64);
    for (int b = 0; b < nb; b++) {
        switch (b & 3) {
        case 0: STEP(2, 4, 6, 1); break;
        case 1: STEP(3, 5, 7, 2); break;
        case 2: STEP(0, 4, 6, 3); break;
        default: STEP(1, 5, 7, 0); break;
        }
    }
    const __m512 acc[TOK] = {acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7,
                             acc8, acc9, acc10, acc11, acc12, acc13, acc14, acc15};
    for (int m = 0; m < TOK; m++) _mm512_storeu_ps(out + (size_t)m * n_out, acc[m]);
}

/* Tokens per pass: their activations within CHUNK_BYTES, whole tiles. */
static int chunk_tokens(int n_in) {
    const int n = CHUNK_BYTES / n_in / TOK * TOK;
    return n < TOK ? TOK : n;
}

size_t kt_matmul_amx_panel_bytes(int n_in) {
    const size_t nb = (size_t)n_in / QK8_0;
    return nb * BLOCK_BYTES + (size_t)chunk_tokens(n_in) * nb * sizeof(float);
}

/* The d_x of tokens [t0, t1) (whole tiles) as the tiles read them: tile
 * i's block b at dx + (i * nb + b) * 16, a token's a lane. */
static void gather_dx(float *dx, const kt_q8_act *x, int t0, int t1) {
    const int nb = x->nb;
    for (int t = t0; t < t1; t++) {
        float *tile_dx = dx + (size_t)(t - t0) / TOK * nb * TOK + (t - t0) % TOK;
        for (int b = 0; b < nb; b++) tile_dx[(size_t)b * TOK] = x->d[(size_t)t * nb + b];
    }
}

void kt_matmul_x8_amx(float *out, const void *w, kt_dtype wtype, const kt_q8_act *x, int n_in, int n_out,
                      int n_tokens, int r0, int r1, void *panel) {
    const q8_kind k = kind_of(wtype);
    const int nb = x->nb, chunk = chunk_tokens(n_in);
    const size_t row_bytes = kt_dtype_row_bytes(kt_repack_plain(wtype), n_in);
    const int r16 = r0 + (r1 - r0) / ROWS * ROWS, t16 = n_tokens / TOK * TOK;
    uint8_t *weights = panel;
    float *dx = (float *)(weights + (size_t)nb * BLOCK_BYTES);
    if (r16 > r0 && t16 > 0) {
        config_tiles();
        for (int c0 = 0; c0 < t16; c0 += chunk) {
            const int c1 = c0 + chunk < t16 ? c0 + chunk : t16;
            gather_dx(dx, x, c0, c1);
            for (int r = r0; r < r16; r += ROWS) {
                const uint8_t *g0 = (const uint8_t *)w + (size_t)r * row_bytes;
                build_panel(weights, k, g0, g0 + KT_X8_ROWS * row_bytes, nb);
                for (int t = c0; t < c1; t += TOK)
                    tile(out + (size_t)t * n_out + r, n_out, x->qs + (size_t)t * nb * QK8_0,
                         dx + (size_t)(t - c0) * nb, nb, weights);
            }
        }
        _tile_release();
    }
    if (t16 < n_tokens && r16 > r0) { /* the last tokens, fewer than a tile */
        const kt_q8_act rest = {x->qs + (size_t)t16 * nb * QK8_0, x->d + (size_t)t16 * nb, x->c8 + (size_t)t16 * nb, nb};
        kt_matmul_x8_avx2(out + (size_t)t16 * n_out, w, wtype, &rest, n_in, n_out, n_tokens - t16, r0, r16);
    }
    if (r16 < r1) kt_matmul_x8_avx2(out, w, wtype, x, n_in, n_out, n_tokens, r16, r1); /* the last 8 rows */
}

#else

size_t kt_matmul_amx_panel_bytes(int n_in) {
    (void)n_in;
    return 0; /* never chosen: no AMX-INT8 in this build */
}

void kt_matmul_x8_amx(float *out, const void *w, kt_dtype wtype, const kt_q8_act *x, int n_in, int n_out,
                      int n_tokens, int r0, int r1, void *panel) {
    (void)panel; /* never chosen: no AMX-INT8 in this build */
    kt_matmul_x8_avx2(out, w, wtype, x, n_in, n_out, n_tokens, r0, r1);
}

#endif

bool kt_matmul_x8_amx_takes(kt_dtype wtype, int n_tokens) {
    return n_tokens >= TOK &&
           (wtype == KT_Q4_0_X8 || wtype == KT_Q8_0_X8 || wtype == KT_IQ4_NL_X8 || wtype == KT_MXFP4_X8) &&
           kt_cpu_has_amx_int8();
}
