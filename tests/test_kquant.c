/*
 * test_kquant.c - the K-quant formats (Q4_K, Q5_K, Q6_K, Q8_K activations)
 * and their matmul kernels.
 *
 * What is checked, and the tolerances:
 *   - dequantization of hand-built blocks against values written here from
 *     the format definition (byte layouts spelled out below), exactly;
 *   - quantize -> dequantize of Gaussian data: RMSE / std under bounds set
 *     just above the measured values (Q4_K 0.0715 -> < 0.074, Q5_K 0.0362
 *     -> < 0.038, Q6_K 0.0179 -> < 0.019; measured on this test's data), and
 *     an all-zero block giving zeros;
 *   - quantize(dequantize(q)) reproduces q's values: RMSE / std of the two
 *     dequantizations < 1e-4 for Q4_K and Q6_K (measured 0), < 0.002 for
 *     Q5_K (measured 0.0013);
 *   - the Q8_K activation quantizer: scale, rounding and bsums;
 *   - matmul: the SIMD path bit-identical to kt_matmul_ref (the integer
 *     parts are exact and both apply the same two fmaf per block), the
 *     scalar fallback bit-identical too, odd shapes (n_out 1, 3, 17, 67;
 *     1 .. 13 tokens; 1 .. 3 threads), long rows (several token chunks),
 *     and the product close to the float product of the dequantized
 *     weights (within the activation quantization error). Batch invariance
 *     is checked for every type together in test_ops.c.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#include "base/fp16.h"
#include "base/rng.h"
#include "ops/cpu.h"
#include "ops/internal.h"
#include "ops/kquant.h"
#include "ops/matmul.h"
#include "ops/pool.h"
#include "ops/quant.h"

static const kt_dtype K_TYPES[] = {KT_Q4_K, KT_Q5_K, KT_Q6_K};
#define N_K_TYPES 3

/* ---- formats -------------------------------------------------------- */

/* Six-bit scales sc[8] and mins m[8] laid out as the format says: bytes
 * 0-3 = sc[0..3] | (top 2 bits of sc[4..7]) << 6, bytes 4-7 = m[0..3] |
 * (top 2 bits of m[4..7]) << 6, bytes 8-11 = (sc[4..7] & 15) |
 * (m[4..7] & 15) << 4. */
static const uint8_t SC[8] = {1, 2, 63, 4, 17, 33, 48, 63};
static const uint8_t MN[8] = {0, 5, 10, 63, 16, 31, 47, 2};

static void pack_scales(uint8_t *s) {
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)(SC[j] | ((SC[j + 4] >> 4) << 6));
        s[j + 4] = (uint8_t)(MN[j] | ((MN[j + 4] >> 4) << 6));
        s[j + 8] = (uint8_t)((SC[j + 4] & 15) | ((MN[j + 4] & 15) << 4));
    }
}

static void test_scale_bytes_literal(void **state) {
    (void)state;
    uint8_t s[12];
    pack_scales(s);
    /* sc4 = 17 = 01 0001: top bits 01 in byte 0 (with sc0 = 1) -> 0x41;
     * m4 = 16 = 01 0000 -> byte 4 = 0x40 | 0; byte 8 = 1 | 0 << 4 */
    static const uint8_t want[12] = {0x41, 0x82, 0xFF, 0xC4, 0x40, 0x45, 0x8A, 0x3F,
                                     0x01, 0xF1, 0xF0, 0x2F};
    assert_memory_equal(s, want, 12);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        kt_kq_scale_min(j, s, &sc, &m);
        assert_int_equal(sc, SC[j]);
        assert_int_equal(m, MN[j]);
    }
}

static void test_dequant_q4_K_known(void **state) {
    (void)state;
    block_q4_K b;
    b.d = 0x3C00;    /* 1.0 */
    b.dmin = 0x3800; /* 0.5 */
    pack_scales(b.scales);
    for (int i = 0; i < 128; i++) b.qs[i] = (uint8_t)(i * 7 + 3);
    float out[256];
    kt_dequantize_row(KT_Q4_K, &b, out, 256);
    for (int v = 0; v < 256; v++) {
        /* value v: sub-block v / 32; byte 32 * (v / 64) + v % 32, low
         * nibble for the first 32 of each 64, high for the second */
        int byte = b.qs[32 * (v / 64) + v % 32];
        int q = (v % 64) < 32 ? byte & 15 : byte >> 4;
        float want = 1.0f * SC[v / 32] * q - 0.5f * MN[v / 32];
        if (out[v] != want) fail_msg("Q4_K value %d: %g, want %g", v, out[v], want);
    }
}

static void test_dequant_q5_K_known(void **state) {
    (void)state;
    block_q5_K b;
    b.d = 0x3400;    /* 0.25 */
    b.dmin = 0x3C00; /* 1.0 */
    pack_scales(b.scales);
    for (int i = 0; i < 128; i++) b.qs[i] = (uint8_t)(i * 13 + 5);
    for (int i = 0; i < 32; i++) b.qh[i] = (uint8_t)(i * 37 + 11);
    float out[256];
    kt_dequantize_row(KT_Q5_K, &b, out, 256);
    for (int v = 0; v < 256; v++) {
        int byte = b.qs[32 * (v / 64) + v % 32];
        int q = (v % 64) < 32 ? byte & 15 : byte >> 4;
        /* fifth bit: bit (v / 32) of qh[v % 32] */
        q += ((b.qh[v % 32] >> (v / 32)) & 1) * 16;
        float want = 0.25f * SC[v / 32] * q - 1.0f * MN[v / 32];
        if (out[v] != want) fail_msg("Q5_K value %d: %g, want %g", v, out[v], want);
    }
}

static void test_dequant_q6_K_known(void **state) {
    (void)state;
    block_q6_K b;
    b.d = 0xB800; /* -0.5 */
    for (int i = 0; i < 128; i++) b.ql[i] = (uint8_t)(i * 29 + 7);
    for (int i = 0; i < 64; i++) b.qh[i] = (uint8_t)(i * 53 + 1);
    static const int8_t sc[16] = {1, -1, 127, -128, 5, 0, 33, -7, 2, 9, -64, 100, 3, -3, 17, 64};
    memcpy(b.scales, sc, 16);
    float out[256];
    kt_dequantize_row(KT_Q6_K, &b, out, 256);
    for (int v = 0; v < 256; v++) {
        /* half h = v / 128, r = v % 128: low 4 bits from ql[64h + r % 64],
         * low nibble if r < 64 else high; high 2 bits from qh[32h + r % 32],
         * bits 2 * (r / 32) */
        int h = v / 128, r = v % 128;
        int lb = b.ql[64 * h + r % 64];
        int lo = r < 64 ? lb & 15 : lb >> 4;
        int hi = (b.qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
        int q = (lo | hi << 4) - 32;
        float want = -0.5f * sc[v / 16] * q;
        if (out[v] != want) fail_msg("Q6_K value %d: %g, want %g", v, out[v], want);
    }
}

static void test_kquant_supported(void **state) {
    (void)state;
    for (int i = 0; i < N_K_TYPES; i++) {
        assert_true(kt_quantize_supported(K_TYPES[i]));
        assert_true(kt_dequantize_supported(K_TYPES[i]));
        assert_true(kt_matmul_supported(K_TYPES[i]));
    }
    assert_false(kt_quantize_supported(KT_Q8_K)); /* activations only */
    assert_false(kt_matmul_supported(KT_Q8_K));
    assert_int_equal(kt_dtype_row_bytes(KT_Q4_K, 512), 288);
    assert_int_equal(kt_dtype_row_bytes(KT_Q5_K, 256), 176);
    assert_int_equal(kt_dtype_row_bytes(KT_Q6_K, 256), 210);
    assert_int_equal(kt_dtype_row_bytes(KT_Q6_K, 320), 0);
}

/* ---- round trips ---------------------------------------------------- */

static double rel_rmse(const float *x, const float *y, size_t n) {
    double e = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        e += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
        s += (double)x[i] * x[i];
    }
    return sqrt(e / s);
}

static void test_kquant_roundtrip_error(void **state) {
    (void)state;
    enum { N = 256 * 256 };
    static const double bound[N_K_TYPES] = {0.074, 0.038, 0.019};
    float *x = tu_xmalloc(sizeof(float) * N), *y = tu_xmalloc(sizeof(float) * N);
    void *q = tu_xmalloc(kt_dtype_row_bytes(KT_Q6_K, N));
    tu_fill_normal(x, N, 1.0f, 7);
    for (int j = 512; j < 768; j++) x[j] = 0.0f; /* an all-zero super-block */
    for (int i = 0; i < N_K_TYPES; i++) {
        kt_quantize_row(K_TYPES[i], x, q, N);
        kt_dequantize_row(K_TYPES[i], q, y, N);
        double e = rel_rmse(x, y, N);
        print_message("%s: RMSE / std = %.4f\n", kt_dtype_name(K_TYPES[i]), e);
        assert_true(e < bound[i]);
        for (int j = 512; j < 768; j++) assert_true(y[j] == 0.0f);
    }
    free(x);
    free(y);
    free(q);
}

/* Dequantized values quantize again to (nearly) the same values: the
 * re-quantized grid may move by fp16 rounding of the scales, so compare
 * values, relative to the data's scale. */
static void test_kquant_requantize_stable(void **state) {
    (void)state;
    enum { N = 256 * 64 };
    float *x = tu_xmalloc(sizeof(float) * N), *y = tu_xmalloc(sizeof(float) * N);
    float *z = tu_xmalloc(sizeof(float) * N);
    void *q = tu_xmalloc(kt_dtype_row_bytes(KT_Q6_K, N));
    void *q2 = tu_xmalloc(kt_dtype_row_bytes(KT_Q6_K, N));
    tu_fill_normal(x, N, 1.0f, 11);
    for (int i = 0; i < N_K_TYPES; i++) {
        size_t bytes = kt_dtype_row_bytes(K_TYPES[i], N);
        kt_quantize_row(K_TYPES[i], x, q, N);
        kt_dequantize_row(K_TYPES[i], q, y, N);
        kt_quantize_row(K_TYPES[i], y, q2, N);
        kt_dequantize_row(K_TYPES[i], q2, z, N);
        size_t same = 0;
        for (size_t b = 0; b < bytes; b++) same += ((char *)q)[b] == ((char *)q2)[b];
        double e = rel_rmse(y, z, N);
        print_message("%s: requantized: %.1f%% bytes equal, RMSE / std %.5f\n",
                      kt_dtype_name(K_TYPES[i]), 100.0 * same / bytes, e);
        /* measured: Q4_K and Q6_K give the same values again (Q6_K with
         * some scale bytes changed: same products), Q5_K 0.0013 */
        assert_true(e < (K_TYPES[i] == KT_Q5_K ? 0.002 : 1e-4));
    }
    free(x);
    free(y);
    free(z);
    free(q);
    free(q2);
}

static void test_q8_K_act(void **state) {
    (void)state;
    float x[512];
    for (int j = 0; j < 256; j++) x[j] = (float)(j % 17) - 8.0f; /* max |x| 8 at j = 0 */
    x[100] = -12.7f;                                              /* the max: negative */
    for (int j = 256; j < 512; j++) x[j] = 0.0f;
    int8_t qs[512];
    float d[2];
    int16_t bs[32];
    memset(bs, 0x55, sizeof bs);
    kt_quantize_act_q8_K(x, 512, qs, d, bs);
    /* iscale = -127 / -12.7 = 10; d = 1 / iscale */
    const float iscale = -127.f / -12.7f;
    assert_true(d[0] == 1 / iscale);
    assert_int_equal(qs[100], -127);
    for (int j = 0; j < 256; j++) {
        float v = iscale * x[j];
        int want = (int)rintf(v); /* round half to even, as nearest_int */
        if (qs[j] != want) fail_msg("value %d: %d, want %d", j, qs[j], want);
    }
    for (int g = 0; g < 16; g++) {
        int s = 0;
        for (int k = 0; k < 16; k++) s += qs[16 * g + k];
        assert_int_equal(bs[g], s);
    }
    assert_true(d[1] == 0.0f);
    for (int j = 256; j < 512; j++) assert_int_equal(qs[j], 0);
    for (int g = 16; g < 32; g++) assert_int_equal(bs[g], 0);
}

#if defined(__x86_64__) || defined(__i386__)
/* The AVX2 Q8_K quantizer gives the scalar one's bytes, scales and sums:
 * on random blocks, a block of zeros, a block whose largest magnitude
 * comes twice with both signs (the first sets the sign), exact ties at
 * .5 after scaling, and blocks holding inf and NaN. */
static void test_q8_K_act_avx2_is_scalar(void **state) {
    (void)state;
    if (!kt_cpu_has_avx2()) tu_skip("this CPU has no AVX2: only the scalar kernels run");
    enum { NB = 8, N = NB * 256 };
    float *x = tu_xmalloc(sizeof(float) * N);
    tu_fill_normal(x, N, 3.0f, 77);
    for (int j = 256; j < 512; j++) x[j] = 0.0f;                    /* block 1: zeros */
    x[512 + 40] = 9.5f, x[512 + 200] = -9.5f;                       /* block 2: +-max, + first */
    x[768 + 3] = -9.5f, x[768 + 100] = 9.5f;                        /* block 3: -+max, - first */
    for (int j = 1024; j < 1280; j++) x[j] = (float)(j % 9 - 4) * 0.5f; /* block 4: halves */
    x[1024 + 7] = -127.0f / 50.0f;                                  /* iscale 50: x.5 ties */
    x[1280 + 11] = INFINITY;                                        /* block 5 */
    x[1536 + 5] = NAN, x[1536 + 9] = -NAN;                          /* block 6 */
    for (int j = 1792; j < 2048; j++) x[j] = NAN;                   /* block 7: all NaN */
    int8_t qa[N], qb[N];
    float da[NB], db[NB];
    int16_t ba[NB * 16], bb[NB * 16];
    kt_quantize_act_q8_K(x, N, qa, da, ba);
    kt_quantize_act_q8_K_avx2(x, N, qb, db, bb);
    for (int b = 0; b < NB; b++) {
        if (memcmp(&da[b], &db[b], sizeof da[b]) != 0) fail_msg("block %d: d %g, scalar %g", b, db[b], da[b]);
        for (int j = 0; j < 256; j++)
            if (qa[b * 256 + j] != qb[b * 256 + j])
                fail_msg("block %d value %d: %d, scalar %d", b, j, qb[b * 256 + j], qa[b * 256 + j]);
        for (int g = 0; g < 16; g++)
            if (ba[b * 16 + g] != bb[b * 16 + g]) fail_msg("block %d sum %d: %d, scalar %d", b, g, bb[b * 16 + g], ba[b * 16 + g]);
    }
    free(x);
}
#endif

/* ---- matmul --------------------------------------------------------- */

static void check_simd_vs_ref(kt_dtype type, int n_in, int n_out, int nt, kt_pool *pool,
                              uint64_t seed) {
    void *w = tu_make_weights(type, n_in, n_out, seed, 0.0f);
    size_t no = (size_t)nt * n_out;
    float *x = tu_xmalloc(sizeof(float) * (size_t)nt * n_in);
    float *want = tu_xmalloc(sizeof(float) * no), *got = tu_xmalloc(sizeof(float) * no);
    tu_fill_normal(x, (size_t)nt * n_in, 1.0f, seed + 1);
    kt_matmul_ref(want, w, type, x, n_in, n_out, nt);
    kt_matmul(pool, got, w, type, x, n_in, n_out, nt);
    if (memcmp(got, want, sizeof(float) * no) != 0) {
        for (size_t i = 0; i < no; i++)
            if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
                fail_msg("%s n_in %d n_out %d n_tokens %d: element %zu %.9g vs reference %.9g",
                         kt_dtype_name(type), n_in, n_out, nt, i, got[i], want[i]);
    }
    free(x);
    free(want);
    free(got);
    free(w);
}

static void kq_simd_vs_ref_all(void) {
    static const int n_ins[] = {256, 512, 256 * 9};
    static const int n_outs[] = {1, 3, 17, 67};
    static const int n_toks[] = {1, 2, 5, 8, 13};
    kt_pool *pool = kt_pool_new(3, NULL);
    assert_non_null(pool);
    for (int ti = 0; ti < N_K_TYPES; ti++)
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 4; b++)
                for (int c = 0; c < 5; c++)
                    check_simd_vs_ref(K_TYPES[ti], n_ins[a], n_outs[b], n_toks[c],
                                      n_outs[b] == 17 ? NULL : pool,
                                      (uint64_t)(ti * 1000 + a * 100 + b * 10 + c));
    /* long rows: several passes of token chunks */
    for (int ti = 0; ti < N_K_TYPES; ti++) check_simd_vs_ref(K_TYPES[ti], 16384, 20, 30, pool, 5);
    kt_pool_free(pool);
}

/* On every tier the CPU has: AVX-512, AVX-VNNI, AVX2. */
static void test_kq_matmul_simd_vs_ref(void **state) {
    (void)state;
    kq_simd_vs_ref_all();
    if (kt_cpu_has_avx512_vnni()) {
        kt_cpu_force_no_avx512(true);
        kq_simd_vs_ref_all();
        kt_cpu_force_no_avx512(false);
    }
    if (!kt_cpu_has_avx_vnni()) return;
    kt_cpu_force_no_vnni(true);
    kq_simd_vs_ref_all();
    kt_cpu_force_no_vnni(false);
}

static void test_kq_matmul_scalar_is_ref(void **state) {
    (void)state;
    kt_pool *pool = kt_pool_new(3, NULL);
    assert_non_null(pool);
    kt_cpu_force_scalar(true);
    for (int ti = 0; ti < N_K_TYPES; ti++) check_simd_vs_ref(K_TYPES[ti], 512, 37, 6, pool, 31);
    kt_cpu_force_scalar(false);
    kt_pool_free(pool);
}

/* The matmul is the product with the dequantized weights, up to the Q8_K
 * rounding of the activations: |err| <= sum_i |w_i| * d_x / 2 per block,
 * bounded here by 0.6 / 127 * max|x| * sum|w|, plus float noise. */
static void test_kq_matmul_vs_float(void **state) {
    (void)state;
    const int n_in = 1024, n_out = 9, nt = 3;
    for (int ti = 0; ti < N_K_TYPES; ti++) {
        void *w = tu_make_weights(K_TYPES[ti], n_in, n_out, 17, 0.0f);
        float x[3 * 1024], got[27], row[1024];
        tu_fill_normal(x, sizeof x / sizeof x[0], 1.0f, 19);
        kt_matmul(NULL, got, w, K_TYPES[ti], x, n_in, n_out, nt);
        size_t rb = kt_dtype_row_bytes(K_TYPES[ti], n_in);
        for (int r = 0; r < n_out; r++) {
            kt_dequantize_row(K_TYPES[ti], (char *)w + rb * r, row, n_in);
            for (int t = 0; t < nt; t++) {
                double want = 0, lim = 1e-5;
                for (int b = 0; b < n_in / 256; b++) {
                    float amax = 0;
                    for (int i = 0; i < 256; i++) amax = fmaxf(amax, fabsf(x[t * n_in + 256 * b + i]));
                    double aw = 0;
                    for (int i = 0; i < 256; i++) {
                        want += (double)row[256 * b + i] * x[t * n_in + 256 * b + i];
                        aw += fabs(row[256 * b + i]);
                    }
                    lim += aw * amax / 127 * 0.6;
                }
                if (!(fabs(got[t * n_out + r] - want) <= lim))
                    fail_msg("%s row %d token %d: %g vs %g (limit %g)", kt_dtype_name(K_TYPES[ti]),
                             r, t, got[t * n_out + r], want, lim);
            }
        }
        free(w);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scale_bytes_literal),
        cmocka_unit_test(test_dequant_q4_K_known),
        cmocka_unit_test(test_dequant_q5_K_known),
        cmocka_unit_test(test_dequant_q6_K_known),
        cmocka_unit_test(test_kquant_supported),
        cmocka_unit_test(test_kquant_roundtrip_error),
        cmocka_unit_test(test_kquant_requantize_stable),
        cmocka_unit_test(test_q8_K_act),
#if defined(__x86_64__) || defined(__i386__)
        cmocka_unit_test(test_q8_K_act_avx2_is_scalar),
#endif
        cmocka_unit_test(test_kq_matmul_simd_vs_ref),
        cmocka_unit_test(test_kq_matmul_scalar_is_ref),
        cmocka_unit_test(test_kq_matmul_vs_float),
    };
    return tu_result(cmocka_run_group_tests(tests, NULL, NULL));
}
