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
 *   - MXFP4 (E2M1 values, E8M0 scales): dequantization against the
 *     E2M1 definition, its quantizer's bytes against llama.cpp's, edges
 *     (subnormal and huge blocks) included;
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
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#include "base/fp16.h"
#include "base/rng.h"
#include "gguf/gguf.h"
#include "ops/cpu.h"
#include "ops/internal.h"
#include "ops/kquant.h"
#include "ops/matmul.h"
#include "ops/pool.h"
#include "ops/quant.h"

static const kt_dtype K_TYPES[] = {KT_Q4_K, KT_Q5_K, KT_Q6_K};
#define N_K_TYPES 3
/* the types added after them: Q2_K, Q3_K (Q8_K activations), IQ4_NL (Q8_0
 * activations), IQ4_XS (Q8_K), MXFP4 (Q8_0) */
static const kt_dtype NEW_TYPES[] = {KT_Q2_K, KT_Q3_K, KT_IQ4_NL, KT_IQ4_XS, KT_MXFP4};
#define N_NEW_TYPES 5
#define BOUND_Q2_K 0.31 /* measured 0.2986 */
#define BOUND_Q3_K 0.16 /* 0.1518 */
#define BOUND_IQ4_NL 0.079 /* 0.0760 */
#define BOUND_IQ4_XS 0.079 /* 0.0766 */
#define BOUND_MXFP4 0.12 /* 0.1149 */

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

/* ---- Q2_K, Q3_K, IQ4_NL, IQ4_XS ----------------------------------------- */

static void test_dequant_q2_K_known(void **state) {
    (void)state;
    block_q2_K b;
    b.d = 0x3800;    /* 0.5 */
    b.dmin = 0x3400; /* 0.25 */
    for (int g = 0; g < 16; g++) b.scales[g] = (uint8_t)(g * 17 + 3); /* sc = low nibble, m = high */
    for (int i = 0; i < 64; i++) b.qs[i] = (uint8_t)(i * 29 + 5);
    /* byte offsets: scales 0-15, qs 16-79, d 80, dmin 82 */
    assert_int_equal(offsetof(block_q2_K, qs), 16);
    assert_int_equal(offsetof(block_q2_K, d), 80);
    assert_int_equal(offsetof(block_q2_K, dmin), 82);
    float out[256];
    kt_dequantize_row(KT_Q2_K, &b, out, 256);
    for (int v = 0; v < 256; v++) {
        /* value v = 128h + 32k + l: bits 2k, 2k+1 of qs[32h + l]; group v / 16 */
        int h = v / 128, k = v % 128 / 32, l = v % 32;
        int q = (b.qs[32 * h + l] >> (2 * k)) & 3;
        int sc = b.scales[v / 16] & 15, m = b.scales[v / 16] >> 4;
        float want = 0.5f * sc * q - 0.25f * m;
        if (out[v] != want) fail_msg("Q2_K value %d: %g, want %g", v, out[v], want);
    }
}

/* 16 six-bit scales s[g] as Q3_K packs them, here byte by byte: bytes 0-7
 * low nibbles (g < 8 low, g >= 8 high), bytes 8-11 top bits (scale g at
 * bits 2 (g / 4) of byte 8 + g % 4). */
static const uint8_t Q3SC[16] = {0, 1, 31, 32, 33, 63, 17, 48, 5, 60, 40, 20, 2, 62, 47, 16};

static void test_q3_K_scale_bytes_literal(void **state) {
    (void)state;
    uint8_t s[12] = {0};
    for (int g = 0; g < 16; g++) {
        if (g < 8) s[g] |= Q3SC[g] & 15;
        else s[g - 8] |= (uint8_t)((Q3SC[g] & 15) << 4);
        s[8 + g % 4] |= (uint8_t)((Q3SC[g] >> 4) << (2 * (g / 4)));
    }
    /* e.g. byte 0 = s[0] & 15 | (s[8] & 15) << 4 = 0x50; byte 8 = top
     * bits of s[0], s[4], s[8], s[12]: 0 | 2 << 2 | 0 << 4 | 0 << 6 = 0x08 */
    static const uint8_t want[12] = {0x50, 0xC1, 0x8F, 0x40, 0x21, 0xEF, 0xF1, 0x00,
                                     0x08, 0xFC, 0xA5, 0x5E};
    assert_memory_equal(s, want, 12);
    for (int g = 0; g < 16; g++) assert_int_equal(kt_q3_K_scale(s, g), Q3SC[g]);
}

static void test_dequant_q3_K_known(void **state) {
    (void)state;
    block_q3_K b;
    for (int i = 0; i < 32; i++) b.hmask[i] = (uint8_t)(i * 41 + 7);
    for (int i = 0; i < 64; i++) b.qs[i] = (uint8_t)(i * 23 + 1);
    memset(b.scales, 0, 12);
    for (int g = 0; g < 16; g++) {
        if (g < 8) b.scales[g] |= Q3SC[g] & 15;
        else b.scales[g - 8] |= (uint8_t)((Q3SC[g] & 15) << 4);
        b.scales[8 + g % 4] |= (uint8_t)((Q3SC[g] >> 4) << (2 * (g / 4)));
    }
    b.d = 0xBC00; /* -1.0 */
    assert_int_equal(offsetof(block_q3_K, qs), 32);
    assert_int_equal(offsetof(block_q3_K, scales), 96);
    assert_int_equal(offsetof(block_q3_K, d), 108);
    float out[256];
    kt_dequantize_row(KT_Q3_K, &b, out, 256);
    for (int v = 0; v < 256; v++) {
        /* low 2 bits as Q2_K; third bit = bit v / 32 of hmask[v % 32];
         * the stored level is q + 4 with the third bit set */
        int h = v / 128, k = v % 128 / 32, l = v % 32;
        int q = ((b.qs[32 * h + l] >> (2 * k)) & 3) + 4 * ((b.hmask[l] >> (v / 32)) & 1) - 4;
        float want = -1.0f * (Q3SC[v / 16] - 32) * q;
        if (out[v] != want) fail_msg("Q3_K value %d: %g, want %g", v, out[v], want);
    }
}

/* ggml's kvalues_iq4nl, written out again */
static const int8_t IQ4[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static void test_dequant_iq4_nl_known(void **state) {
    (void)state;
    assert_memory_equal(KT_IQ4NL_VALUES, IQ4, 16);
    block_iq4_nl b[2];
    b[0].d = 0x3C00;              /* 1.0 */
    b[1].d = 0xC000;              /* -2.0 */
    for (int i = 0; i < 16; i++) b[0].qs[i] = (uint8_t)(i | (15 - i) << 4);
    for (int i = 0; i < 16; i++) b[1].qs[i] = (uint8_t)(i * 37 + 9);
    const uint8_t *bytes = (const uint8_t *)b; /* d is bytes 0-1, qs 2-17 */
    assert_int_equal(bytes[18], 0x00);
    assert_int_equal(bytes[19], 0xC0);
    assert_int_equal(bytes[20], 9);
    float out[64];
    kt_dequantize_row(KT_IQ4_NL, b, out, 64);
    for (int j = 0; j < 16; j++) {
        assert_true(out[j] == IQ4[j]);           /* low nibbles: values 0-15 */
        assert_true(out[16 + j] == IQ4[15 - j]); /* high nibbles: 16-31 */
        assert_true(out[32 + j] == -2.0f * IQ4[b[1].qs[j] & 15]);
        assert_true(out[48 + j] == -2.0f * IQ4[b[1].qs[j] >> 4]);
    }
}

/* ggml's kvalues_mxfp4 (E2M1 doubled), written out again */
static const int8_t FP4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* E8M0 byte e: 2^(e - 127); MXFP4 halves it against the doubled table.
 * The exponent byte first, then the nibbles, low nibbles values 0-15. */
static void test_dequant_mxfp4_known(void **state) {
    (void)state;
    assert_memory_equal(KT_MXFP4_VALUES, FP4, 16);
    assert_true(kt_e8m0_half(127) == 0.5f);
    assert_true(kt_e8m0_half(128) == 1.0f);
    assert_true(kt_e8m0_half(2) == ldexpf(1.0f, -126)); /* the smallest normal */
    assert_true(kt_e8m0_half(1) == ldexpf(1.0f, -127)); /* subnormals */
    assert_true(kt_e8m0_half(0) == ldexpf(1.0f, -128));
    assert_true(kt_e8m0_half(255) == ldexpf(1.0f, 127));
    for (int e = 0; e < 256; e++) assert_true(kt_e8m0_half((uint8_t)e) == ldexpf(1.0f, e - 128));
    block_mxfp4 b[2];
    b[0].e = 127; /* 2^0 / 2 */
    b[1].e = 130; /* 2^3 / 2 = 4 */
    for (int i = 0; i < 16; i++) b[0].qs[i] = (uint8_t)(i | (15 - i) << 4);
    for (int i = 0; i < 16; i++) b[1].qs[i] = (uint8_t)(i * 37 + 9);
    const uint8_t *bytes = (const uint8_t *)b; /* e is byte 0, qs 1-16 */
    assert_int_equal(sizeof b, 34);
    assert_int_equal(bytes[17], 130);
    assert_int_equal(bytes[18], 9);
    float out[64];
    kt_dequantize_row(KT_MXFP4, b, out, 64);
    /* E2M1: code s eem, value (-1)^s 2^(ee-1) (1 + m/2), ee = 0 subnormal m / 2 */
    static const float E2M1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    for (int j = 0; j < 16; j++) {
        const float lo = (j & 8 ? -1.0f : 1.0f) * E2M1[j & 7], hi = ((15 - j) & 8 ? -1.0f : 1.0f) * E2M1[(15 - j) & 7];
        assert_true(out[j] == lo);       /* low nibbles: values 0-15 */
        assert_true(out[16 + j] == hi);  /* high nibbles: 16-31 */
        const int ql = b[1].qs[j] & 15, qh = b[1].qs[j] >> 4;
        assert_true(out[32 + j] == 8.0f * (ql & 8 ? -1.0f : 1.0f) * E2M1[ql & 7]);
        assert_true(out[48 + j] == 8.0f * (qh & 8 ? -1.0f : 1.0f) * E2M1[qh & 7]);
    }
}

/* MXFP4's quantizer at its edges against llama.cpp's bytes (the same
 * throwaway program as REF_HEX): a block of subnormals (e 0), one of
 * +-3e38 (e 252, clipped to 6), quarter steps, all ones (a power of two:
 * e = 125, level 8 x 0.125), alternating signs, and a block whose top
 * value 6 sits exactly on the largest level. */
static void test_mxfp4_quantizer_edges(void **state) {
    (void)state;
    float e[32 * 6];
    for (int i = 0; i < 32; i++) {
        e[i] = 1e-39f * (float)(i + 1);
        e[32 + i] = 3e38f * (float)((i % 3) - 1);
        e[64 + i] = (float)(i - 16) * 0.25f;
        e[96 + i] = 1.0f;
        e[128 + i] = (i % 2 ? -1.0f : 1.0f) * (0.25f * (float)i);
        e[160 + i] = i == 0 ? 6.0f : (float)i * 0.125f;
    }
    static const char *want_hex =
        "0050515151626262636363646464747575fc0f70f70f70f70f70f70f70f70f70f70f7f0e0e1d1d2d2d3c3c4c4b4b5a5a"
        "5959607d666666666666666666666666666666667f60e061e962fa73fb74fc74fd75fd75fe7f47404041415151525252"
        "525353636364";
    uint8_t q[6 * 17];
    kt_quantize_row(KT_MXFP4, e, q, 32 * 6);
    assert_int_equal(strlen(want_hex), 2 * sizeof q);
    for (size_t i = 0; i < sizeof q; i++) {
        unsigned v;
        sscanf(want_hex + 2 * i, "%2x", &v);
        if (q[i] != v) fail_msg("MXFP4 edge byte %zu (block %zu): %02x, llama.cpp %02x", i, i / 17, q[i], v);
    }
    /* all zeros: e 0, every nibble 0 */
    float z[32] = {0};
    kt_quantize_row(KT_MXFP4, z, q, 32);
    for (int i = 0; i < 17; i++) assert_int_equal(q[i], 0);
}

static void test_dequant_iq4_xs_known(void **state) {
    (void)state;
    block_iq4_xs b;
    b.d = 0x3800; /* 0.5 */
    /* scales 6 bits: ls[j] = nibble j % 2 of scales_l[j / 2] | bits 2j of
     * scales_h << 4; chosen ls = 32 + {-32, -1, 0, 1, 31, 7, -20, 13} */
    static const int ls[8] = {0, 31, 32, 33, 63, 39, 12, 45};
    b.scales_h = 0;
    for (int j = 0; j < 8; j++) {
        if (j % 2 == 0) b.scales_l[j / 2] = (uint8_t)(ls[j] & 15);
        else b.scales_l[j / 2] |= (uint8_t)((ls[j] & 15) << 4);
        b.scales_h |= (uint16_t)((ls[j] >> 4) << (2 * j));
    }
    static const uint8_t want_sl[4] = {0xF0, 0x10, 0x7F, 0xDC};
    assert_memory_equal(b.scales_l, want_sl, 4);
    assert_int_equal(b.scales_h, 0x8BA4); /* 2-bit fields 0,1,2,2,3,2,0,2 from bit 0 up */
    for (int j = 0; j < 8; j++) assert_int_equal(kt_iq4_xs_scale(&b, j), ls[j]);
    for (int i = 0; i < 128; i++) b.qs[i] = (uint8_t)(i * 53 + 11);
    assert_int_equal(offsetof(block_iq4_xs, scales_l), 4);
    assert_int_equal(offsetof(block_iq4_xs, qs), 8);
    float out[256];
    kt_dequantize_row(KT_IQ4_XS, &b, out, 256);
    for (int v = 0; v < 256; v++) {
        int j = v / 32, l = v % 32;
        int byte = b.qs[16 * j + l % 16];
        int q = l < 16 ? byte & 15 : byte >> 4;
        float want = 0.5f * (ls[j] - 32) * IQ4[q];
        if (out[v] != want) fail_msg("IQ4_XS value %d: %g, want %g", v, out[v], want);
    }
}

static void test_new_types_supported(void **state) {
    (void)state;
    static const int bytes[N_NEW_TYPES] = {84, 110, 18, 136, 17}, values[N_NEW_TYPES] = {256, 256, 32, 256, 32};
    static const int ids[N_NEW_TYPES] = {10, 11, 20, 23, 39}; /* GGUF's ids */
    for (int i = 0; i < N_NEW_TYPES; i++) {
        assert_int_equal(NEW_TYPES[i], ids[i]);
        assert_true(kt_dtype_known(ids[i]));
        assert_int_equal(kt_dtype_get(ids[i])->block_bytes, bytes[i]);
        assert_int_equal(kt_dtype_get(ids[i])->block_size, values[i]);
        assert_true(kt_quantize_supported(NEW_TYPES[i]));
        assert_true(kt_dequantize_supported(NEW_TYPES[i]));
        assert_true(kt_matmul_supported(NEW_TYPES[i]));
    }
    assert_int_equal(kt_dtype_parse("iq4_xs"), KT_IQ4_XS);
    assert_int_equal(kt_dtype_parse("IQ4_NL"), KT_IQ4_NL);
    assert_int_equal(kt_dtype_row_bytes(KT_IQ4_NL, 96), 54);
    assert_int_equal(kt_dtype_row_bytes(KT_IQ4_XS, 96), 0);
    assert_int_equal(kt_dtype_parse("mxfp4"), KT_MXFP4);
    assert_string_equal(kt_dtype_name(KT_MXFP4), "MXFP4");
    assert_int_equal(kt_dtype_row_bytes(KT_MXFP4, 96), 51);
    assert_int_equal(kt_dtype_row_bytes(KT_MXFP4, 80), 0);
}

/* quantize -> dequantize of Gaussian data, RMSE / std under bounds just
 * above the measured values (this data), an all-zero super-block giving
 * zeros */
static void test_new_roundtrip_error(void **state) {
    (void)state;
    enum { N = 256 * 256 };
    static const double bound[N_NEW_TYPES] = {BOUND_Q2_K, BOUND_Q3_K, BOUND_IQ4_NL, BOUND_IQ4_XS, BOUND_MXFP4};
    float *x = tu_xmalloc(sizeof(float) * N), *y = tu_xmalloc(sizeof(float) * N);
    void *q = tu_xmalloc(kt_dtype_row_bytes(KT_IQ4_NL, N));
    tu_fill_normal(x, N, 1.0f, 7);
    for (int j = 512; j < 768; j++) x[j] = 0.0f;
    for (int i = 0; i < N_NEW_TYPES; i++) {
        kt_quantize_row(NEW_TYPES[i], x, q, N);
        kt_dequantize_row(NEW_TYPES[i], q, y, N);
        double e = rel_rmse(x, y, N);
        print_message("%s: RMSE / std = %.4f\n", kt_dtype_name(NEW_TYPES[i]), e);
        assert_true(e < bound[i]);
        for (int j = 512; j < 768; j++) assert_true(y[j] == 0.0f);
    }
    free(x);
    free(y);
    free(q);
}

/* ---- byte-exactness against llama.cpp ---------------------------------
 *
 * ref_row(r) is a fixed generator (integer LCG, uniform values exact in
 * float, sums of four, scales 2^(2 (r % 13) - 24), rows with zeros, a
 * zero sub-block or an outlier). REF_HEX is row 3 quantized by llama.cpp
 * (ggml_quantize_chunk(type, x, q, 0, 1, 512, NULL): libggml-base of the
 * llama.cpp build beside kettle, peer/llsrc), REF_HASH the FNV-1a hash of
 * rows 0 .. 47 quantized so; both printed by a throwaway program with
 * this generator linked against ggml. kettle's quantizers must give the
 * same bytes (`kettle quantize` reproduces llama-quantize's files when it
 * runs without an importance matrix). */
static uint64_t ref_state;
static uint32_t ref_next31(void) {
    ref_state = ref_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(ref_state >> 33);
}
static float ref_unif(void) {
    return ((float)(int32_t)(ref_next31() & 0xFFFFFF) - 8388608.0f) / 8388608.0f;
}
static void ref_row(int r, float *x, int n) {
    ref_state = 0x9E3779B97F4A7C15ull ^ (uint64_t)r;
    float scale = 1.0f;
    for (int k = 0; k < r % 13; k++) scale *= 4.0f;
    for (int k = 0; k < 6; k++) scale *= 0.0625f;
    for (int i = 0; i < n; i++) x[i] = (ref_unif() + ref_unif() + ref_unif() + ref_unif()) * scale;
    if (r % 4 == 1)
        for (int i = 0; i < n; i += 3) x[i] = 0.0f;
    if (r % 4 == 2)
        for (int i = 32; i < 64; i++) x[i] = 0.0f;
    if (r % 4 == 3) x[(r * 37) % n] *= 50.0f;
}

static const char *const REF_HEX[N_NEW_TYPES] = {
    /* Q2_K: 168 bytes */
    "010101011111ff010101010101011101f0f0d1f4f0f0f0f1e0f0e4f0f0f0f13470716010703135343034343070306020"
    "c4814084d0c0c0c0d4c4c08480c0d1c01000010180000041010400005100040571005001cbcbfdac89bb2989aaef8d9a"
    "68caebbfe96a1d2f6b0a77789d4c49a632b55bca657a61d528696b05669b9b7b9edbbb27d1cae29db7dac9b259397446"
    "a7b3b5f55a696721b06517757a497e61763654e908000e00",
    /* Q3_K: 220 bytes */
    "8e1e7e4deda8fb1edf9b8d5b7aaafce1a6c7f3db17cfdd5c1ee0fcca35cef3fa030731180c0f0d143021372023230e30"
    "9662ac0189022d82b8f709b51c67a812257e1c86623740fc25b13f458173670b03874265395e955af647143d46d958aa"
    "f1ff11f1f11ff0115a95629a2780e6d7ba4fbfd9c53642122a75bdb4a3a3b6a5f6ca449695c2f7abf985d9f98d6753d0"
    "7616135dfde1b7d5279c24aff260c7eccfba8dd3de56d4727eed65ee2a524b6d78d622086fdc9f6ca190212a13673573"
    "428bd57cbe5f5016283b1c906d47a707b1a85a794eeec0003cc30280",
    /* IQ4_NL: 288 bytes */
    "01004ac98ea8b8cbb54f095622188a697c380180b77be893d5954e1ac928329849a7d69002807749bffa878130892da4"
    "9e956455b8d52800888888888888888888888888888888800100404ec8c3a215a8d7db4a841beb068ee6018072e58ee1"
    "d9abe8c5d24066a257c73a4d01800d8a85d7439ba7ba447bbae9099ba4c8010078525054f9574ad5a86d8892d31a6a49"
    "01005499522d0f4bdc3094d0e4c7b7d4ddd8020058972b4cb796b4575c9caab5e0b4c87901008bea964a6ca1ae0db561"
    "42eb3e3dd5a20280a0a4ab49c6aaa6d5a3646793683385d10100b55bf7530c77f559942791399b8d055501805e739de0"
    "f8b2a4af735527d7b99eb95a010048527b75ce5733bfc50dee54bcbd3f8e028085a4b5ea57b6d5aacd9f8d8d77e9b805",
    /* IQ4_XS: 272 bytes */
    "018029691f011ff14bd98ea8b8dbc54f095622189a697c38b77ce893d5954e1ad928329949a7d6906739cffb8780208a"
    "1ea29f945344c8e588888888888888888888888888888880515dc8c4932698c8cb49852adb168ed672f58ee1d9abe8c5"
    "e24066a247c73a4d0d8a85d7439ba7ba447bbae9099ba3c878425053f9573ae5a86d8891e30a6b490080c0cc07e9a4f8"
    "5499522d0f4bdc3094d0e4c7b7d4ddd858972b4cb796b4575c9caab5e0b4c8798bea964a6ca1ae0db56142eb3e3dd5a2"
    "a0a4ab49c6aaa6d5a3646793683385d1b55bf7530c77f559942791399b8d05555e739de0f8b2a4af735527d7b99eb95a"
    "48527b75ce5733bfc50dee54bcbd3f8e85a4b5ea57b6d5aacd9f8d8d77e9b805",
    /* MXFP4: 272 bytes (quantize_row_mxfp4_ref through ggml_quantize_chunk,
     * libggml-base.a of llama.cpp de3ff81) */
    "6cc241062030434bc6e1aadee0129194d06cb11ce095d3934d6ac950459939a0d2976c2149cffb0107570a6ea59e942544"
    "c0e3710000000000000000000000000000000e6cbeb5404c1dda104043b10bd253ea05596c15e30de6d9abe0c3d54722a5"
    "30c15a4d6c7d0a02d1359ba1ba341bbad9699ba4c06c90cebfbc71b0c25b20a5001e5de293c16cbc11bdd5f6c354ce1c5f"
    "5c49395c55506cb02ae4c5491b4db9c515224c6f4d40926c03521ab2942e26e43aaebd53c5c44b2d6ca7a4bb59d2bab3d3"
    "b5243195305504d66c3bb360bdf4906bb12ce91ed11405fbbb6c3d149dd7e0b5a4ae142351d1b99eb92a6cc0ad939a45a9"
    "cd364bf555ac3435d6056c04b5c3eb41b2d4bbceaf0d0d11e9c074",
};
static const uint64_t REF_HASH[N_NEW_TYPES] = {0xdadef949dbf56f90ull, 0x9283f9d6683a4851ull, 0xadf34f866c0398c9ull, 0x526a90399ac76302ull,
                                               0x52746e2bb01e78b0ull};

static void test_new_quantizers_are_llamacpp(void **state) {
    (void)state;
    enum { N = 512, ROWS = 48 };
    float x[N];
    uint8_t q[512], want[512];
    for (int t = 0; t < N_NEW_TYPES; t++) {
        const size_t rb = kt_dtype_row_bytes(NEW_TYPES[t], N);
        assert_int_equal(strlen(REF_HEX[t]), 2 * rb);
        for (size_t i = 0; i < rb; i++) {
            unsigned v;
            sscanf(REF_HEX[t] + 2 * i, "%2x", &v);
            want[i] = (uint8_t)v;
        }
        uint64_t h = 0xcbf29ce484222325ull;
        for (int r = 0; r < ROWS; r++) {
            ref_row(r, x, N);
            kt_quantize_row(NEW_TYPES[t], x, q, N);
            for (size_t i = 0; i < rb; i++) h = (h ^ q[i]) * 0x100000001b3ull;
            if (r == 3)
                for (size_t i = 0; i < rb; i++)
                    if (q[i] != want[i])
                        fail_msg("%s row 3 byte %zu: %02x, llama.cpp %02x", kt_dtype_name(NEW_TYPES[t]), i, q[i], want[i]);
        }
        if (h != REF_HASH[t])
            fail_msg("%s: hash of %d rows %016llx, llama.cpp's %016llx", kt_dtype_name(NEW_TYPES[t]), ROWS,
                     (unsigned long long)h, (unsigned long long)REF_HASH[t]);
    }
}

/* ---- the golden MXFP4 file -----------------------------------------------
 *
 * golden/arch/gpt-oss-MXFP4.gguf is `llama-quantize gpt-oss-F16.gguf ...
 * MXFP4_MOE` (llama.cpp de3ff81), whose MXFP4 path is quantize_mxfp4 ->
 * quantize_row_mxfp4_ref whatever the importance matrix. So every MXFP4
 * tensor of that file must read back with GGUF type 39 and its shape, and
 * equal, byte for byte, kettle's quantizer applied to the F16 file's
 * tensor of the same name; and kettle's dequantization of it must give,
 * value for value, the E2M1 definition decoded here independently
 * (sign, exponent, mantissa bits; ldexp of the E8M0 byte), and stay within
 * MXFP4's rounding of the F16 values: at most 2^(e-126) per value with
 * scale 2^(e-127) (the block's largest |x| is 4 to 8 scales and the top
 * level is 6, so it may clip by up to 2 scales; elsewhere the error is
 * half a step, at most 1). */
static float e2m1_decode(int code, int e8m0) {
    const int s = code >> 3, ex = (code >> 1) & 3, m = code & 1;
    const float mag = ex == 0 ? 0.5f * (float)m : ldexpf(1.0f + 0.5f * (float)m, ex - 1);
    return (s ? -mag : mag) * ldexpf(1.0f, e8m0 - 127);
}

static void test_mxfp4_golden_file(void **state) {
    (void)state;
    kt_error err = {0};
    char mx_path[4096];
    snprintf(mx_path, sizeof mx_path, "%s", tu_shared("golden/arch/gpt-oss-MXFP4.gguf"));
    gguf_file *mx = gguf_open(mx_path, &err), *f16 = gguf_open(tu_shared("golden/arch/gpt-oss-F16.gguf"), &err);
    if (!mx || !f16) fail_msg("golden files: %s", err.msg);
    int n_mxfp4 = 0;
    for (int64_t i = 0; i < gguf_n_tensors(mx); i++) {
        const gguf_tensor *t = gguf_tensor_at(mx, i);
        if (t->type != KT_MXFP4) continue;
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        /* only the experts: blk.N.ffn_{gate,up,down}_exps.weight, 3-D */
        if (!strstr(name, "_exps.weight") || t->n_dims != 3) fail_msg("%s: MXFP4 but not an expert tensor", name);
        const gguf_tensor *src = gguf_tensor_find(f16, name);
        assert_non_null(src);
        assert_int_equal(src->type, KT_F16);
        for (int d = 0; d < 3; d++) assert_int_equal(src->dims[d], t->dims[d]);
        const int64_t n0 = t->dims[0], rows = t->dims[1] * t->dims[2];
        const size_t rb = kt_dtype_row_bytes(KT_MXFP4, n0);
        assert_int_equal(t->n_bytes, rb * (size_t)rows);
        float *x = tu_xmalloc(sizeof(float) * (size_t)n0), *y = tu_xmalloc(sizeof(float) * (size_t)n0);
        uint8_t *q = tu_xmalloc(rb);
        for (int64_t r = 0; r < rows; r++) {
            const uint8_t *file_row = (const uint8_t *)t->data + (size_t)r * rb;
            kt_dequantize_row(KT_F16, (const uint16_t *)src->data + (size_t)r * (size_t)n0, x, n0);
            kt_quantize_row(KT_MXFP4, x, q, n0);
            if (memcmp(q, file_row, rb) != 0) {
                size_t k = 0;
                while (q[k] == file_row[k]) k++;
                fail_msg("%s row %lld byte %zu: kettle %02x, llama-quantize %02x", name, (long long)r, k, q[k],
                         file_row[k]);
            }
            kt_dequantize_row(KT_MXFP4, file_row, y, n0);
            for (int64_t j = 0; j < n0; j++) {
                const block_mxfp4 *blk = (const block_mxfp4 *)file_row + j / 32;
                const int l = (int)(j % 32), code = l < 16 ? blk->qs[l] & 15 : blk->qs[l - 16] >> 4;
                if (y[j] != e2m1_decode(code, blk->e))
                    fail_msg("%s row %lld value %lld: %g, E2M1 says %g", name, (long long)r, (long long)j, y[j],
                             e2m1_decode(code, blk->e));
                if (!(fabsf(y[j] - x[j]) <= ldexpf(1.0f, blk->e - 126)))
                    fail_msg("%s row %lld value %lld: %g from %g", name, (long long)r, (long long)j, y[j], x[j]);
            }
        }
        free(x), free(y), free(q);
        n_mxfp4++;
    }
    /* gpt-oss golden: 4 layers x (gate, up, down) experts */
    assert_int_equal(n_mxfp4, 12);
    gguf_close(mx);
    gguf_close(f16);
}

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
    /* the newer types; IQ4_NL also on rows of 7 blocks of 32, and more
     * tokens than its chunk of 64 */
    for (int ti = 0; ti < N_NEW_TYPES; ti++)
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 4; b++)
                for (int c = 0; c < 5; c++)
                    check_simd_vs_ref(NEW_TYPES[ti], n_ins[a], n_outs[b], n_toks[c],
                                      n_outs[b] == 17 ? NULL : pool,
                                      (uint64_t)(5000 + ti * 1000 + a * 100 + b * 10 + c));
    for (int ti = 0; ti < N_NEW_TYPES; ti++) check_simd_vs_ref(NEW_TYPES[ti], 16384, 20, 30, pool, 6);
    check_simd_vs_ref(KT_IQ4_NL, 224, 13, 3, pool, 7);
    check_simd_vs_ref(KT_IQ4_NL, 512, 9, 70, pool, 8);
    check_simd_vs_ref(KT_MXFP4, 224, 13, 3, pool, 9);
    check_simd_vs_ref(KT_MXFP4, 512, 9, 70, pool, 10);
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
    for (int ti = 0; ti < N_NEW_TYPES; ti++) check_simd_vs_ref(NEW_TYPES[ti], 512, 37, 6, pool, 32);
    kt_cpu_force_scalar(false);
    kt_pool_free(pool);
}

/* The matmul is the product with the dequantized weights, up to the Q8_K
 * (IQ4_NL: Q8_0, whose scale per 32 is no larger) rounding of the
 * activations: |err| <= sum_i |w_i| * d_x / 2 per block,
 * bounded here by 0.6 / 127 * max|x| * sum|w|, plus float noise. */
static void test_kq_matmul_vs_float(void **state) {
    (void)state;
    const int n_in = 1024, n_out = 9, nt = 3;
    static const kt_dtype types[] = {KT_Q4_K, KT_Q5_K, KT_Q6_K, KT_Q2_K, KT_Q3_K, KT_IQ4_NL, KT_IQ4_XS, KT_MXFP4};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        void *w = tu_make_weights(types[ti], n_in, n_out, 17, 0.0f);
        float x[3 * 1024], got[27], row[1024];
        tu_fill_normal(x, sizeof x / sizeof x[0], 1.0f, 19);
        kt_matmul(NULL, got, w, types[ti], x, n_in, n_out, nt);
        size_t rb = kt_dtype_row_bytes(types[ti], n_in);
        for (int r = 0; r < n_out; r++) {
            kt_dequantize_row(types[ti], (char *)w + rb * r, row, n_in);
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
                    fail_msg("%s row %d token %d: %g vs %g (limit %g)", kt_dtype_name(types[ti]),
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
        cmocka_unit_test(test_dequant_q2_K_known),
        cmocka_unit_test(test_q3_K_scale_bytes_literal),
        cmocka_unit_test(test_dequant_q3_K_known),
        cmocka_unit_test(test_dequant_iq4_nl_known),
        cmocka_unit_test(test_dequant_iq4_xs_known),
        cmocka_unit_test(test_dequant_mxfp4_known),
        cmocka_unit_test(test_mxfp4_quantizer_edges),
        cmocka_unit_test(test_mxfp4_golden_file),
        cmocka_unit_test(test_new_types_supported),
        cmocka_unit_test(test_new_roundtrip_error),
        cmocka_unit_test(test_new_quantizers_are_llamacpp),
        cmocka_unit_test(test_kq_matmul_simd_vs_ref),
        cmocka_unit_test(test_kq_matmul_scalar_is_ref),
        cmocka_unit_test(test_kq_matmul_vs_float),
    };
    return tu_result(cmocka_run_group_tests(tests, NULL, NULL));
}
