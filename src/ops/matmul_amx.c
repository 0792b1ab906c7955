/*
 * matmul_amx.c - kt_amx_matmul (amx.h) on AMX tiles; compiled with
 * -mamx-tile -mamx-bf16 where the compiler has them (CMakeLists.txt), a
 * stub otherwise (kt_cpu_has_amx_bf16 is then false).
 *
 * Tiles: 0-3 accumulate a 32 x 32 block of outputs (two row tiles x two
 * column tiles), 4-5 hold two row tiles of activations, 6-7 two column
 * tiles of weights. Per K block: hi . hi, hi . lo, lo . hi (amx.h), ten
 * tile loads for twelve products.
 *
 * Blocking, for a core's caches (48 KiB L1, 2 MiB L2 where tuned): a
 * panel of KT_AMX_NC columns x 128 values of weights (128 KiB, split)
 * stays in L2 while every row pair of the call runs over it; a row pair's
 * 128 values (16 KiB) stay in L1 while the panel's column pairs go by.
 * The outputs accumulate in the caller's panel buffer, 4 KiB blocks in a
 * row (the output rows, n_out floats apart, would fall in one L1 set);
 * after the last K panel a block goes straight to out (a column pair
 * past n_out through the panel). The weights are read from memory
 * once per call, so callers give a few hundred rows at a time. Measured
 * on machine C (one core, 960 rows x 1024 x 4096): ~2.8x the F16x16 FMA
 * kernel, 440-540 GFLOP/s, the tile products at ~40% of their peak,
 * bound by the tiles' trips from L2 (the same loop on L1-resident tiles
 * runs at ~1.2 TFLOP/s of these three-product FLOPs).
 */
#include "ops/amx.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)

#include <immintrin.h>
#include <stdbool.h>

#define TILE_VALUES 512
#define KC_BLOCKS 4 /* K blocks (of 32) per panel: 128 values (8: ~15% slower on machine C) */

static void config_tiles(void) { /* every tile 16 rows of 64 bytes */
    const kt_amx_tile_config c = kt_amx_config((const uint16_t[8]){64, 64, 64, 64, 64, 64, 64, 64},
                                               (const uint8_t[8]){16, 16, 16, 16, 16, 16, 16, 16});
    _tile_loadconfig(&c);
}

/* tiles 0-3 += 4-5 times 6-7: the 2 x 2 block's four products */
static inline void products(void) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
}

/* tiles 0-3 from / to a 32 x 32 block (row tile-major) at c, ld floats a
 * row: tile t at row 16 (t / 2), column 16 (t % 2) */
static inline void block_zero(void) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
}
static inline void block_load(const float *c, size_t ld) {
    _tile_loadd(0, c, ld * sizeof(float));
    _tile_loadd(1, c + 16, ld * sizeof(float));
    _tile_loadd(2, c + 16 * ld, ld * sizeof(float));
    _tile_loadd(3, c + 16 * ld + 16, ld * sizeof(float));
}
static inline void block_store(float *c, size_t ld) {
    _tile_stored(0, c, ld * sizeof(float));
    _tile_stored(1, c + 16, ld * sizeof(float));
    _tile_stored(2, c + 16 * ld, ld * sizeof(float));
    _tile_stored(3, c + 16 * ld + 16, ld * sizeof(float));
}

/* tiles 0-3 += the row pair whose first row tile is at a0 (hi, lo of
 * each K block, the second row tile n_kb blocks further) times the column
 * pair b0, b1, over K blocks [kb0, kb1): hi . hi, hi . lo, lo . hi */
static inline void row_pair(const uint16_t *a0, int n_kb, const uint16_t *b0, const uint16_t *b1, int kb0, int kb1) {
    const uint16_t *a1 = a0 + (size_t)n_kb * 2 * TILE_VALUES;
    for (int kb = kb0; kb < kb1; kb++) {
        const uint16_t *ah0 = a0 + (size_t)kb * 2 * TILE_VALUES, *ah1 = a1 + (size_t)kb * 2 * TILE_VALUES;
        const uint16_t *bh0 = b0 + (size_t)kb * 2 * TILE_VALUES, *bh1 = b1 + (size_t)kb * 2 * TILE_VALUES;
        _tile_loadd(4, ah0, 64);
        _tile_loadd(5, ah1, 64);
        _tile_loadd(6, bh0, 64);
        _tile_loadd(7, bh1, 64);
        products();
        _tile_loadd(6, bh0 + TILE_VALUES, 64);
        _tile_loadd(7, bh1 + TILE_VALUES, 64);
        products();
        _tile_loadd(4, ah0 + TILE_VALUES, 64);
        _tile_loadd(5, ah1 + TILE_VALUES, 64);
        _tile_loadd(6, bh0, 64);
        _tile_loadd(7, bh1, 64);
        products();
    }
}

/* the 32 x 32 outputs (row-major, 32 floats a row) of row pair p, column
 * pair q of a panel of n_pairs column pairs */
static inline float *panel_block(float *panel, int p, int q, int n_pairs) {
    return panel + ((size_t)p * n_pairs + q) * 1024;
}

/* out's columns [from, nc_end) of rows [row0, row1), from the panel of
 * columns [nc, nc_end) */
static void panel_out(float *out, const float *panel, int n_out, int nc, int from, int nc_end, int row0, int row1) {
    const int n_pairs = (nc_end - nc) / 32;
    for (int m = row0; m < row1; m++)
        for (int n0 = from; n0 < nc_end && n0 < n_out; n0 += 16) {
            const int p = (m - row0) / 32, q = (n0 - nc) / 32;
            const float *c = panel_block((float *)panel, p, q, n_pairs) + ((m - row0) % 32) * 32 + (n0 - nc) % 32;
            const int left = n_out - n0;
            const __mmask16 k = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
            _mm512_mask_storeu_ps(out + (size_t)m * n_out + n0, k, _mm512_load_ps(c)); /* a tile row: 64 bytes */
        }
}

/* The whole K in one panel: each 32 x 32 block stored where it goes,
 * through the panel only where its columns pass n_out. */
static void direct(float *out, const uint16_t *w, const uint16_t *a, int n_kb, int n_out, int row0, int row1,
                   float *panel) {
    const int n_pad = kt_amx_rows_pad(n_out);
    for (int n0 = 0; n0 < n_pad; n0 += 32) {
        const uint16_t *b0 = w + (size_t)(n0 / 16) * n_kb * 2 * TILE_VALUES;
        const bool whole = n0 + 32 <= n_out;
        for (int m0 = row0; m0 < row1; m0 += 32) {
            block_zero();
            row_pair(a + (size_t)(m0 / 16) * n_kb * 2 * TILE_VALUES, n_kb, b0, b0 + (size_t)n_kb * 2 * TILE_VALUES, 0,
                     n_kb);
            if (whole)
                block_store(out + (size_t)m0 * n_out + n0, (size_t)n_out);
            else
                block_store(panel_block(panel, (m0 - row0) / 32, 0, 1), 32);
        }
        if (!whole) panel_out(out, panel, n_out, n0, n0, n0 + 32, row0, row1);
    }
}

void kt_amx_matmul(float *out, const uint16_t *w, const uint16_t *a, int n_in, int n_out, int n_rows, int row0,
                   int row1, float *panel) {
    (void)n_rows;
    const int n_kb = kt_amx_k_pad(n_in) / KT_AMX_K, n_pad = kt_amx_rows_pad(n_out);
    config_tiles();
    if (n_kb <= KC_BLOCKS) { /* one K panel (attention's q K^T, d <= 128): the tiles go straight to out */
        direct(out, w, a, n_kb, n_out, row0, row1, panel);
        _tile_release();
        return;
    }
    for (int nc = 0; nc < n_pad; nc += KT_AMX_NC) {
        const int nc_end = nc + KT_AMX_NC < n_pad ? nc + KT_AMX_NC : n_pad, n_pairs = (nc_end - nc) / 32;
        for (int kb0 = 0; kb0 < n_kb; kb0 += KC_BLOCKS) {
            const int kb1 = kb0 + KC_BLOCKS < n_kb ? kb0 + KC_BLOCKS : n_kb;
            for (int m0 = row0; m0 < row1; m0 += 32) {
                const uint16_t *am = a + (size_t)(m0 / 16) * n_kb * 2 * TILE_VALUES;
                for (int n0 = nc; n0 < nc_end; n0 += 32) {
                    float *c = panel_block(panel, (m0 - row0) / 32, (n0 - nc) / 32, n_pairs);
                    if (kb0 == 0)
                        block_zero();
                    else
                        block_load(c, 32);
                    const uint16_t *b0 = w + (size_t)(n0 / 16) * n_kb * 2 * TILE_VALUES;
                    row_pair(am, n_kb, b0, b0 + (size_t)n_kb * 2 * TILE_VALUES, kb0, kb1);
                    if (kb1 == n_kb && n0 + 32 <= n_out) /* done: where it goes */
                        block_store(out + (size_t)m0 * n_out + n0, (size_t)n_out);
                    else
                        block_store(c, 32);
                }
            }
        }
        /* the column pairs past whole_end went to the panel (nc < n_pad < n_out + 32, so n_out - nc > -32) */
        const int whole_end = nc + (n_out - nc) / 32 * 32;
        if (whole_end < nc_end) panel_out(out, panel, n_out, nc, whole_end, nc_end, row0, row1);
    }
    _tile_release();
}

long kt_amx_probe_dp(long iters) {
    config_tiles();
    block_zero();
    _tile_zero(4);
    _tile_zero(5);
    _tile_zero(6);
    _tile_zero(7);
    for (long i = 0; i < iters; i++) products(); /* four independent accumulators, as row_pair keeps */
    float c[256];
    _tile_stored(0, c, 64);
    _tile_release();
    return (long)c[0];
}

/* kt_amx_split_rows_c's to_bf16 on 16 lanes: nearest even, a NaN kept a
 * NaN; the 16-bit results in the low halves of the lanes */
static inline __m512i to_bf16_16(__m512i u) {
    const __m512i rounded = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
                         _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))),
        16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
}

void kt_amx_split_rows_avx512(uint16_t *a, const float *x, int n_in, int n_rows, int row0, int row1, bool round_f16) {
    const int n_kb = kt_amx_k_pad(n_in) / KT_AMX_K;
    for (int m = row0; m < row1; m++)
        for (int kb = 0; kb < n_kb; kb++) {
            uint16_t *hi = a + (((size_t)(m / 16) * n_kb + kb) * 2) * TILE_VALUES + (m % 16) * KT_AMX_K;
            uint16_t *lo = hi + TILE_VALUES;
            const int c0 = kb * KT_AMX_K, n = m >= n_rows ? 0 : n_in - c0 < KT_AMX_K ? n_in - c0 : KT_AMX_K;
            for (int h = 0; h < 2; h++) { /* two halves of 16 values */
                const int left = n - 16 * h;
                const __mmask16 k = left >= 16 ? 0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
                __m512 v = _mm512_maskz_loadu_ps(k, x + (size_t)m * n_in + c0 + 16 * h);
                if (round_f16) v = _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
                const __m512i vh = to_bf16_16(_mm512_castps_si512(v));
                const __m512 rest = _mm512_sub_ps(v, _mm512_castsi512_ps(_mm512_slli_epi32(vh, 16)));
                const __m512i vl = to_bf16_16(_mm512_castps_si512(rest));
                _mm256_storeu_si256((__m256i *)(hi + 16 * h), _mm512_cvtepi32_epi16(vh));
                _mm256_storeu_si256((__m256i *)(lo + 16 * h), _mm512_cvtepi32_epi16(vl));
            }
        }
}

/* kt_amx_pack_f32 for ld_out == 1 (an output's neighbours are the next
 * floats): a tile row is, for 16 outputs, the pair (value 2r, value 2r +
 * 1): two 16-float loads, split, the second's bf16 in the high halves. */
void kt_amx_pack_f32_avx512(uint16_t *dst, const float *w, int n_in, int n_out, size_t ld_in) {
    const int n_kb = kt_amx_k_pad(n_in) / KT_AMX_K, n_nb = kt_amx_rows_pad(n_out) / 16;
    for (int nb = 0; nb < n_nb; nb++) {
        const int left = n_out - 16 * nb;
        const __mmask16 k = left >= 16 ? 0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
        for (int kb = 0; kb < n_kb; kb++) {
            uint16_t *hi = dst + ((size_t)nb * n_kb + kb) * 2 * TILE_VALUES, *lo = hi + TILE_VALUES;
            for (int r = 0; r < 16; r++) {
                __m512i h[2], l[2];
                for (int e = 0; e < 2; e++) {
                    const int col = KT_AMX_K * kb + 2 * r + e;
                    const __m512 v = col < n_in ? _mm512_maskz_loadu_ps(k, w + (size_t)col * ld_in + 16 * nb)
                                                : _mm512_setzero_ps();
                    h[e] = to_bf16_16(_mm512_castps_si512(v));
                    l[e] = to_bf16_16(_mm512_castps_si512(_mm512_sub_ps(v, _mm512_castsi512_ps(_mm512_slli_epi32(h[e], 16)))));
                }
                _mm512_storeu_si512(hi + r * 32, _mm512_or_si512(h[0], _mm512_slli_epi32(h[1], 16)));
                _mm512_storeu_si512(lo + r * 32, _mm512_or_si512(l[0], _mm512_slli_epi32(l[1], 16)));
            }
        }
    }
}

#else

long kt_amx_probe_dp(long iters) {
    (void)iters;
    return 0; /* never called: no AMX in this build */
}

void kt_amx_pack_f32_avx512(uint16_t *dst, const float *w, int n_in, int n_out, size_t ld_in) {
    kt_amx_pack_f32_c(dst, w, n_in, n_out, 1, ld_in); /* never chosen: no AMX in this build */
}

void kt_amx_split_rows_avx512(uint16_t *a, const float *x, int n_in, int n_rows, int row0, int row1, bool round_f16) {
    kt_amx_split_rows_c(a, x, n_in, n_rows, row0, row1, round_f16); /* never chosen: no AMX in this build */
}

void kt_amx_matmul(float *out, const uint16_t *w, const uint16_t *a, int n_in, int n_out, int n_rows, int row0,
                   int row1, float *panel) {
    (void)panel;
    kt_amx_matmul_ref(out, w, a, n_in, n_out, n_rows, row0, row1); /* never chosen: no AMX in this build */
}

#endif
