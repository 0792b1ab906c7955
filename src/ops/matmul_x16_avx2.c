/*
 * matmul_x16_avx2.c - float weights (F32, F16, BF16) in the x16 layouts
 * (repack.h: 16 rows side by side, so value i of 16 rows is one 32-byte
 * column, 64 for F32), with AVX2 and AVX-512 tiles. Compiled with -mavx2
 * -mfma -mf16c, called only when kt_cpu_has_avx2(); the AVX-512 tiles
 * only when kt_cpu_has_avx512_vnni().
 *
 * The specification is matmul.c's: each output is one fma chain over its
 * row's values in order, acc = fma(W[r][i], x[i], acc). Every tile, tier
 * and split over threads applies exactly that chain, so every path gives
 * the reference's bits and a token's outputs do not depend on its batch.
 *
 * Why the layout: the plain float GEMM (matmul_avx2.c) multiplies 8
 * values of two rows by the same 8 values of one token, so each fma also
 * reads 32 bytes of activations, and a tile's 6 tokens (48 KB at n_in
 * 2048) come from L2; it runs at about 60% of the FMA peak. Here an fma
 * multiplies one column of 16 rows by one activation broadcast to every
 * lane: per value, a tile of P groups of 16 rows x T tokens loads P
 * columns and T floats for P x T fmas, an eighth of the activation bytes,
 * and it runs near the peak (PERFORMANCE.md, ops bench).
 *
 * The price of one chain per output: a chain cannot be split, so a tile
 * must hold enough independent chains to cover the fma latency (4 cycles
 * x 2 pipes: 8 or more). The GEMM tile has 3 groups x 8 tokens (AVX-512)
 * or 1 group, two vectors of 8 rows, x 6 tokens (AVX2); the GEMV runs 8
 * groups, 128 rows, at once (AVX2: 4).
 */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "ops/cpu.h"
#include "ops/internal.h"
#include "ops/repack.h"
#include "ops/simd_avx2.h"


#define G KT_X16_ROWS    /* rows per group: one column */
#define GEMV_GROUPS 8    /* groups per GEMV step: 8 chains */
/* GEMM tile, AVX-512: 3 groups x 8 tokens (pp512 at 2 threads, smollm
 * F16: 1236-1330 t/s against 1117-1263 for 2 x 12 and 1201-1267 for 2 x
 * 8; tinyllama F16: 170-179 against 143-166; 4 x 6 level with 3 x 8) */
#define GROUPS_512 3
#define TOKENS_512 8
#define TOKENS_256 6     /* AVX2: 1 group (two vectors) x 6 tokens */
#define CHUNK_BYTES (4096 * 1024) /* activations per pass */
/* GEMV: how far ahead in each group's stream to prefetch (ops bench, F16
 * GEMV 5632 x 2048 streamed: AVX-512, 8 streams: 256 B beat 128 B to 2 KB
 * and the next step's groups; AVX2, 4 streams: 2 KB beat 256 B to 1 KB) */
#define PREFETCH_512 256
#define PREFETCH_256 2048

typedef struct x16_args {
    const char *w;   /* the matrix, group g at g * G * n_in * esz */
    const float *x;  /* n_tokens rows of n_in */
    float *out;      /* n_tokens rows of n_out */
    int n_in, n_out;
} x16_args;

static inline int elem_bytes(kt_dtype wt) {
    return wt == KT_F32 ? 4 : 2;
}

/* Group of rows r .. r + 15 (r a multiple of 16). */
static inline const char *group_at(const x16_args *a, kt_dtype wt, int r) {
    return a->w + (size_t)r * a->n_in * elem_bytes(wt);
}

/* ---- AVX-512: one column per vector ----------------------------------- */

TARGET_512 INL __m512 col_512(kt_dtype wt, const char *g, int i) {
    if (wt == KT_F32) return _mm512_loadu_ps((const float *)g + (size_t)G * i);
    const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)g + (size_t)G * i));
    if (wt == KT_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); /* BF16 */
}

/* Rows r0 .. r0 + 16P - 1 x tokens t0 .. t0 + T - 1. */
TARGET_512 INL void tile_512(const x16_args *a, const kt_dtype wt, const int P, const int T, int r0, int t0) {
    const char *g[GEMV_GROUPS];
    const float *xs[TOKENS_512];
    __m512 acc[GEMV_GROUPS][TOKENS_512];
#pragma GCC unroll 8
    for (int p = 0; p < P; p++) g[p] = group_at(a, wt, r0 + G * p);
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) xs[t] = a->x + (size_t)(t0 + t) * a->n_in;
#pragma GCC unroll 8
    for (int p = 0; p < P; p++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) acc[p][t] = _mm512_setzero_ps();
    const int col_bytes = G * elem_bytes(wt);
    for (int i = 0; i < a->n_in; i++) {
        if (T == 1 && (i * col_bytes) % 64 == 0) { /* a line of each stream, ahead */
#pragma GCC unroll 8
            for (int p = 0; p < P; p++) _mm_prefetch(g[p] + (size_t)i * col_bytes + PREFETCH_512, _MM_HINT_T0);
        }
        __m512 w[GEMV_GROUPS];
#pragma GCC unroll 8
        for (int p = 0; p < P; p++) w[p] = col_512(wt, g[p], i);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            const __m512 xb = _mm512_set1_ps(xs[t][i]);
#pragma GCC unroll 8
            for (int p = 0; p < P; p++) acc[p][t] = _mm512_fmadd_ps(w[p], xb, acc[p][t]);
        }
    }
#pragma GCC unroll 8
    for (int p = 0; p < P; p++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) _mm512_storeu_ps(a->out + (size_t)(t0 + t) * a->n_out + r0 + G * p, acc[p][t]);
}

/* ---- AVX2: one column as two vectors of 8 rows ------------------------ */

INL void col_256(kt_dtype wt, const char *g, int i, __m256 *lo, __m256 *hi) {
    if (wt == KT_F32) {
        const float *c = (const float *)g + (size_t)G * i;
        *lo = _mm256_loadu_ps(c), *hi = _mm256_loadu_ps(c + 8);
        return;
    }
    const __m128i *c = (const __m128i *)((const uint16_t *)g + (size_t)G * i);
    const __m128i h0 = _mm_loadu_si128(c), h1 = _mm_loadu_si128(c + 1);
    if (wt == KT_F16) {
        *lo = _mm256_cvtph_ps(h0), *hi = _mm256_cvtph_ps(h1);
        return;
    }
    *lo = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h0), 16)); /* BF16 */
    *hi = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h1), 16));
}

/* Rows r0 .. r0 + 16P - 1 x tokens t0 .. t0 + T - 1; acc[2p + h] holds
 * rows r0 + 16p + 8h .. + 7. */
INL void tile_256(const x16_args *a, const kt_dtype wt, const int P, const int T, int r0, int t0) {
    const char *g[4];
    const float *xs[TOKENS_256];
    __m256 acc[8][TOKENS_256];
#pragma GCC unroll 4
    for (int p = 0; p < P; p++) g[p] = group_at(a, wt, r0 + G * p);
#pragma GCC unroll 6
    for (int t = 0; t < T; t++) xs[t] = a->x + (size_t)(t0 + t) * a->n_in;
#pragma GCC unroll 8
    for (int v = 0; v < 2 * P; v++)
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) acc[v][t] = _mm256_setzero_ps();
    const int col_bytes = G * elem_bytes(wt);
    for (int i = 0; i < a->n_in; i++) {
        if (T == 1 && (i * col_bytes) % 64 == 0) {
#pragma GCC unroll 4
            for (int p = 0; p < P; p++) _mm_prefetch(g[p] + (size_t)i * col_bytes + PREFETCH_256, _MM_HINT_T0);
        }
        __m256 w[8];
#pragma GCC unroll 4
        for (int p = 0; p < P; p++) col_256(wt, g[p], i, &w[2 * p], &w[2 * p + 1]);
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) {
            const __m256 xb = _mm256_broadcast_ss(xs[t] + i);
#pragma GCC unroll 8
            for (int v = 0; v < 2 * P; v++) acc[v][t] = _mm256_fmadd_ps(w[v], xb, acc[v][t]);
        }
    }
#pragma GCC unroll 8
    for (int v = 0; v < 2 * P; v++)
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) _mm256_storeu_ps(a->out + (size_t)(t0 + t) * a->n_out + r0 + 8 * v, acc[v][t]);
}

/* ---- the tiles of each type and tier ---------------------------------- */

/* The GEMM tiles with nt (1 .. the tier's maximum) as a constant, so each
 * width is unrolled; groups: 1 or the tier's maximum. */
TARGET_512 INL void gemm_512(const x16_args *a, const kt_dtype wt, int groups, int r0, int t0, int nt) {
#define T512(n)                                                                                         \
    case n:                                                                                             \
        if (groups == 1) tile_512(a, wt, 1, n, r0, t0);                                                 \
        else tile_512(a, wt, GROUPS_512, n, r0, t0);                                                    \
        break;
    switch (nt) {
        T512(1) T512(2) T512(3) T512(4) T512(5) T512(6) T512(7)
        default: T512(8)
    }
#undef T512
}

INL void gemm_256(const x16_args *a, const kt_dtype wt, int r0, int t0, int nt) {
#define T256(n)                                                                                         \
    case n: tile_256(a, wt, 1, n, r0, t0); break;
    switch (nt) {
        T256(1) T256(2) T256(3) T256(4) T256(5)
        default: T256(6)
    }
#undef T256
}

/* The GEMV on the groups left after the full steps (1 .. the step's
 * groups - 1) as one tile: their chains interleave instead of waiting on
 * each other's fma latency one group at a time. */
TARGET_512 INL void gemv_rest_512(const x16_args *a, const kt_dtype wt, int r0, int groups) {
#define R512(n) case n: tile_512(a, wt, n, 1, r0, 0); break;
    switch (groups) {
        R512(2) R512(3) R512(4) R512(5) R512(6) R512(7)
        default: R512(1)
    }
#undef R512
}

INL void gemv_rest_256(const x16_args *a, const kt_dtype wt, int r0, int groups) {
#define R256(n) case n: tile_256(a, wt, n, 1, r0, 0); break;
    switch (groups) {
        R256(2) R256(3)
        default: R256(1)
    }
#undef R256
}

/* gemv: gemv_groups groups, one token; gemv_rest: fewer groups, one
 * token; gemm: groups (1 or max_groups) x nt tokens (1 .. max_tokens). */
typedef struct x16_tiles {
    void (*gemv)(const x16_args *a, int r0);
    void (*gemv_rest)(const x16_args *a, int r0, int groups);
    void (*gemm)(const x16_args *a, int groups, int r0, int t0, int nt);
    int gemv_groups, max_groups, max_tokens;
} x16_tiles;

#define X16_TILES(ty, wt)                                                                               \
    TARGET_512 static void ty##_gemv_512(const x16_args *a, int r0) { tile_512(a, wt, GEMV_GROUPS, 1, r0, 0); } \
    TARGET_512 static void ty##_rest_512(const x16_args *a, int r0, int groups) {                        \
        gemv_rest_512(a, wt, r0, groups);                                                               \
    }                                                                                                   \
    TARGET_512 static void ty##_gemm_512(const x16_args *a, int groups, int r0, int t0, int nt) {         \
        gemm_512(a, wt, groups, r0, t0, nt);                                                            \
    }                                                                                                   \
    static void ty##_gemv_256(const x16_args *a, int r0) { tile_256(a, wt, 4, 1, r0, 0); }             \
    static void ty##_rest_256(const x16_args *a, int r0, int groups) { gemv_rest_256(a, wt, r0, groups); } \
    static void ty##_gemm_256(const x16_args *a, int groups, int r0, int t0, int nt) {                  \
        (void)groups;                                                                                   \
        gemm_256(a, wt, r0, t0, nt);                                                                    \
    }                                                                                                   \
    static const x16_tiles ty##_TILES[2] = {                                                            \
        {ty##_gemv_256, ty##_rest_256, ty##_gemm_256, 4, 1, TOKENS_256},                                \
        {ty##_gemv_512, ty##_rest_512, ty##_gemm_512, GEMV_GROUPS, GROUPS_512, TOKENS_512}};

X16_TILES(f32, KT_F32)
X16_TILES(f16, KT_F16)
X16_TILES(bf16, KT_BF16)

/* Tokens per pass of the GEMM: as many as keep their activations within
 * CHUNK_BYTES, a multiple of the widest tile; each pass reads the weights
 * once, and each group's columns stay in L2 while the pass's token tiles
 * run over them. */
static int token_chunk(int n_in) {
    int n = CHUNK_BYTES / (n_in * (int)sizeof(float) + 1);
    n = n > 240 ? 240 : n;
    return n < TOKENS_512 ? TOKENS_512 : n / TOKENS_512 * TOKENS_512;
}

void kt_matmul_x16_avx2(float *out, const void *w, kt_dtype plain, const float *x, int n_in, int n_out,
                        int n_tokens, int r0, int r1) {
    const x16_tiles *k = &(plain == KT_F16 ? f16_TILES : plain == KT_BF16 ? bf16_TILES : f32_TILES)[kt_cpu_has_avx512_vnni()];
    const x16_args a = {w, x, out, n_in, n_out};
    if (n_tokens == 1) {
        int r = r0;
        for (; r + k->gemv_groups * G <= r1; r += k->gemv_groups * G) k->gemv(&a, r);
        if (r < r1) k->gemv_rest(&a, r, (r1 - r) / G);
        return;
    }
    const int chunk = token_chunk(n_in);
    for (int c0 = 0; c0 < n_tokens; c0 += chunk) {
        const int c1 = c0 + chunk < n_tokens ? c0 + chunk : n_tokens;
        for (int r = r0; r < r1;) {
            const int groups = (r1 - r) / G >= k->max_groups ? k->max_groups : 1;
            for (int t = c0; t < c1;) {
                const int nt = c1 - t < k->max_tokens ? c1 - t : k->max_tokens;
                k->gemm(&a, groups, r, t, nt);
                t += nt;
            }
            r += groups * G;
        }
    }
}
