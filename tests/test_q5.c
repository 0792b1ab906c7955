/*
 * test_q5.c - the legacy 32-value block types Q4_1, Q5_0 and Q5_1 (the
 * types llama.cpp falls back to for K-quant tensors whose rows are not a
 * multiple of 256): their formats, reference quantizers and matmul.
 *
 * What is checked:
 *   - dequantization of hand-built blocks against values computed here
 *     from the format definition (nibble order, fifth bits from qh as a
 *     little-endian uint32, d and m);
 *   - the quantizers' structure (the ggml reference rules: min/max levels,
 *     Q5_0's sign and clamp) and quantize -> dequantize error bounds;
 *   - matmul: the reference against a double-precision dot product with
 *     the dequantized weights and activations; the AVX2 kernels and the
 *     scalar fallback bit-identical to the reference on odd shapes (n_out
 *     1, 3, 17, 67; n_tokens 1..13; 1..3 threads); batch invariance.
 * The generic matmul tests in test_ops.c cover these types as well.
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
#include "ops/matmul.h"
#include "ops/pool.h"
#include "ops/quant.h"

static const kt_dtype TYPES[] = {KT_Q4_1, KT_Q5_0, KT_Q5_1};
#define N_TYPES 3

/* The 5-bit level of element j, read straight from the format definition. */
static int level5(const uint8_t *qs, const uint8_t *qh, int j) {
    uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 |
                 (uint32_t)qh[3] << 24;
    int nib = j < 16 ? qs[j] & 0x0F : qs[j - 16] >> 4;
    return nib | (int)((h >> j) & 1) << 4;
}

/* ---- formats -------------------------------------------------------- */

static void test_supported(void **state) {
    (void)state;
    for (int i = 0; i < N_TYPES; i++) {
        assert_true(kt_quantize_supported(TYPES[i]));
        assert_true(kt_dequantize_supported(TYPES[i]));
        assert_true(kt_matmul_supported(TYPES[i]));
    }
    assert_int_equal(kt_dtype_row_bytes(KT_Q4_1, 64), 40);
    assert_int_equal(kt_dtype_row_bytes(KT_Q5_0, 64), 44);
    assert_int_equal(kt_dtype_row_bytes(KT_Q5_1, 64), 48);
}

static void test_dequant_q4_1_known(void **state) {
    (void)state;
    block_q4_1 b;
    b.d = kt_fp32_to_fp16(0.25f);
    b.m = kt_fp32_to_fp16(-1.5f);
    for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(j | ((15 - j) << 4));
    float out[32];
    kt_dequantize_row(KT_Q4_1, &b, out, 32);
    for (int j = 0; j < 16; j++) {
        assert_true(out[j] == j * 0.25f - 1.5f);
        assert_true(out[j + 16] == (15 - j) * 0.25f - 1.5f);
    }
}

static void test_dequant_q5_known(void **state) {
    (void)state;
    /* qh bytes 0x0F 0xA0 0x01 0x80: fifth bits set for elements 0-3, 13,
     * 15, 16 and 31 (little-endian) */
    const uint8_t qh[4] = {0x0F, 0xA0, 0x01, 0x80};
    block_q5_0 b0;
    block_q5_1 b1;
    b0.d = kt_fp32_to_fp16(-0.5f);
    b1.d = kt_fp32_to_fp16(0.125f);
    b1.m = kt_fp32_to_fp16(2.0f);
    memcpy(b0.qh, qh, 4);
    memcpy(b1.qh, qh, 4);
    for (int j = 0; j < 16; j++) {
        b0.qs[j] = b1.qs[j] = (uint8_t)((j * 7 % 16) | (((j * 5 + 3) % 16) << 4));
    }
    float o0[32], o1[32];
    kt_dequantize_row(KT_Q5_0, &b0, o0, 32);
    kt_dequantize_row(KT_Q5_1, &b1, o1, 32);
    static const int high[] = {0, 1, 2, 3, 13, 15, 16, 31};
    for (int j = 0; j < 32; j++) {
        int nib = j < 16 ? (j * 7 % 16) : ((j - 16) * 5 + 3) % 16;
        int hb = 0;
        for (int k = 0; k < 8; k++) hb |= high[k] == j;
        int q = nib + 16 * hb;
        assert_int_equal(level5(b0.qs, b0.qh, j), q);
        assert_true(o0[j] == (q - 16) * -0.5f);
        assert_true(o1[j] == q * 0.125f + 2.0f);
    }
}

/* ggml's rules on a block built to hit them: the _1 types map min to level
 * 0 and max to the top level with m = min; Q5_0 maps the value with the
 * largest |x| to level 0 (d = max / -16) and clamps the opposite end. */
static void test_quantizer_rules(void **state) {
    (void)state;
    float x[32];
    for (int j = 0; j < 32; j++) x[j] = (float)(j - 10) * 0.5f; /* -5 .. 10.5 */
    block_q4_1 a;
    block_q5_1 c;
    block_q5_0 z;
    kt_quantize_row(KT_Q4_1, x, &a, 32);
    kt_quantize_row(KT_Q5_1, x, &c, 32);
    assert_true(kt_fp16_to_fp32(a.m) == -5.0f && kt_fp16_to_fp32(c.m) == -5.0f);
    assert_true(kt_fp16_to_fp32(a.d) == kt_fp16_to_fp32(kt_fp32_to_fp16(15.5f / 15)));
    assert_true(kt_fp16_to_fp32(c.d) == 0.5f); /* 15.5 / 31 */
    assert_int_equal(a.qs[0] & 0x0F, 0);
    assert_int_equal(a.qs[15] >> 4, 15);
    for (int j = 0; j < 32; j++) assert_int_equal(level5(c.qs, c.qh, j), j); /* exact grid */
    /* Q5_0: max |x| is 10.5 (positive): d = -10.5/16; 10.5 -> level 0; the
     * most negative, -5, -> 16 + 5 * 16 / 10.5 = 23.6 -> 24 */
    kt_quantize_row(KT_Q5_0, x, &z, 32);
    assert_true(kt_fp16_to_fp32(z.d) == kt_fp16_to_fp32(kt_fp32_to_fp16(-10.5f / 16)));
    assert_int_equal(level5(z.qs, z.qh, 31), 0);
    assert_int_equal(level5(z.qs, z.qh, 0), 24);
    /* a negative max: -8 maps to level 0, +8 would be 32 -> clamped 31 */
    for (int j = 0; j < 32; j++) x[j] = j == 3 ? -8.0f : j == 4 ? 8.0f : 0.0f;
    x[5] = 7.75f;
    kt_quantize_row(KT_Q5_0, x, &z, 32);
    assert_true(kt_fp16_to_fp32(z.d) == 0.5f);
    assert_int_equal(level5(z.qs, z.qh, 3), 0);
    assert_int_equal(level5(z.qs, z.qh, 4), 31);
    assert_int_equal(level5(z.qs, z.qh, 5), 31);
    assert_int_equal(level5(z.qs, z.qh, 0), 16);
    /* subnormal inputs: 1/d overflows to infinity; the levels saturate
     * (no undefined float -> int conversion, checked under UBSan) and the
     * decoded values stay finite and tiny */
    for (int j = 0; j < 32; j++) x[j] = (float)j * 1e-44f;
    for (int i = 0; i < N_TYPES; i++) {
        uint8_t buf[24];
        float y[32];
        kt_quantize_row(TYPES[i], x, buf, 32);
        kt_dequantize_row(TYPES[i], buf, y, 32);
        for (int j = 0; j < 32; j++) assert_true(isfinite(y[j]) && fabsf(y[j]) < 1e-30f);
    }
    /* all zeros: d = 0, every value decodes to 0 */
    float zero[32] = {0}, y[32];
    for (int i = 0; i < N_TYPES; i++) {
        uint8_t buf[24];
        kt_quantize_row(TYPES[i], zero, buf, 32);
        kt_dequantize_row(TYPES[i], buf, y, 32);
        for (int j = 0; j < 32; j++) assert_true(y[j] == 0.0f);
    }
}

/* Quantize -> dequantize error per block, against the bound from the
 * format: half a step (a whole step at Q5_0's clamped end) plus the fp16
 * rounding of d times the largest level and of m. Measured on normal data
 * (max error / step): Q4_1 0.506, Q5_0 0.965 (at the clamped end), Q5_1
 * 0.512 (the excess over 0.5: fp16 rounding of d and m). */
static void test_roundtrip_error(void **state) {
    (void)state;
    enum { N = 32 * 256 };
    float *x = tu_xmalloc(sizeof(float) * N), *y = tu_xmalloc(sizeof(float) * N);
    uint8_t *q = tu_xmalloc(24 * N / 32);
    tu_fill_normal(x, N, 1.0f, 17);
    for (int j = 0; j < 32; j++) x[64 + j] += 3.0f; /* a block far from 0 */
    for (int i = 0; i < N_TYPES; i++) {
        kt_dtype t = TYPES[i];
        kt_quantize_row(t, x, q, N);
        kt_dequantize_row(t, q, y, N);
        double worst = 0; /* error / step, for the message */
        for (int b = 0; b < N / 32; b++) {
            const float *xb = x + b * 32, *yb = y + b * 32;
            float mn = xb[0], mx = xb[0], amax = 0;
            for (int j = 0; j < 32; j++) {
                mn = fminf(mn, xb[j]);
                mx = fmaxf(mx, xb[j]);
                amax = fmaxf(amax, fabsf(xb[j]));
            }
            double step, bound;
            if (t == KT_Q5_0) {
                step = amax / 16.0;
                bound = step * (1.0 + 16.0 / 2048);
            } else {
                int levels = t == KT_Q4_1 ? 15 : 31;
                step = (mx - mn) / levels;
                bound = step * (0.5 + levels / 2048.0) + fabs(mn) / 2048 + 1e-6 * (fabs(mn) + fabs(mx));
            }
            for (int j = 0; j < 32; j++) {
                double e = fabs((double)xb[j] - yb[j]);
                if (e / step > worst) worst = e / step;
                if (!(e <= bound + 1e-12))
                    fail_msg("%s block %d element %d: error %.3g > bound %.3g",
                             kt_dtype_name(t), b, j, e, bound);
            }
        }
        print_message("%s: max error %.3f steps\n", kt_dtype_name(t), worst);
    }
    free(x);
    free(y);
    free(q);
}

/* ---- matmul --------------------------------------------------------- */

/* The reference against the plain dot product of the dequantized weights
 * and the Q8_0-rounded activations: only float rounding differs. */
static void test_ref_vs_dequantized(void **state) {
    (void)state;
    const int n_in = 256 + 64, n_out = 5;
    float x[256 + 64], xd[256 + 64], wrow[256 + 64], out[5];
    tu_fill_normal(x, (size_t)n_in, 1.0f, 3);
    block_q8_0 xq[(256 + 64) / 32];
    kt_quantize_row(KT_Q8_0, x, xq, n_in);
    kt_dequantize_row(KT_Q8_0, xq, xd, n_in);
    for (int i = 0; i < N_TYPES; i++) {
        void *w = tu_make_weights(TYPES[i], n_in, n_out, 11, 0.3f);
        kt_matmul_ref(out, w, TYPES[i], x, n_in, n_out, 1);
        size_t rb = kt_dtype_row_bytes(TYPES[i], n_in);
        for (int r = 0; r < n_out; r++) {
            kt_dequantize_row(TYPES[i], (const char *)w + rb * (size_t)r, wrow, n_in);
            double want = 0, asum = 0;
            for (int k = 0; k < n_in; k++) {
                want += (double)wrow[k] * xd[k];
                asum += fabs((double)wrow[k] * xd[k]);
            }
            if (!(fabs(out[r] - want) <= 1e-5 * asum))
                fail_msg("%s row %d: %.9g vs %.9g", kt_dtype_name(TYPES[i]), r, out[r], want);
        }
        free(w);
    }
}

/* kt_matmul (AVX2 where the CPU has it, then the scalar fallback) against
 * kt_matmul_ref, bit for bit, on odd shapes, 1..13 tokens, 1..3 threads. */
static void check_vs_ref(bool scalar) {
    static const int n_ins[] = {32, 96, 896 + 32};
    static const int n_outs[] = {1, 3, 17, 67};
    kt_pool *pools[3] = {NULL, kt_pool_new(2, NULL), kt_pool_new(3, NULL)};
    assert_non_null(pools[1]);
    assert_non_null(pools[2]);
    kt_cpu_force_scalar(scalar);
    for (int ti = 0; ti < N_TYPES; ti++)
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 4; b++) {
                int n_in = n_ins[a], n_out = n_outs[b];
                void *w = tu_make_weights(TYPES[ti], n_in, n_out, (uint64_t)(ti * 100 + a * 10 + b), 0.3f);
                float *x = tu_xmalloc(sizeof(float) * 13 * (size_t)n_in);
                float *want = tu_xmalloc(sizeof(float) * 13 * (size_t)n_out);
                float *got = tu_xmalloc(sizeof(float) * 13 * (size_t)n_out);
                tu_fill_normal(x, 13 * (size_t)n_in, 1.0f, (uint64_t)(a * 7 + b));
                kt_matmul_ref(want, w, TYPES[ti], x, n_in, n_out, 13);
                for (int nt = 1; nt <= 13; nt++) {
                    kt_pool *p = pools[nt % 3];
                    kt_matmul(p, got, w, TYPES[ti], x, n_in, n_out, nt);
                    if (memcmp(got, want, sizeof(float) * (size_t)nt * n_out) != 0)
                        fail_msg("%s%s n_in %d n_out %d n_tokens %d threads %d: not the "
                                 "reference's bits", kt_dtype_name(TYPES[ti]),
                                 scalar ? " (scalar)" : "", n_in, n_out, nt, nt % 3 + 1);
                }
                free(x);
                free(want);
                free(got);
                free(w);
            }
    kt_cpu_force_scalar(false);
    kt_pool_free(pools[1]);
    kt_pool_free(pools[2]);
}

static void test_matmul_vs_ref(void **state) {
    (void)state;
    check_vs_ref(false);
    check_vs_ref(true);
}

#if defined(__x86_64__) || defined(__i386__)
/* The AVX2 kernel called directly on a row range that does not start at 0
 * and is not a multiple of 8 rows, against the reference: without a panel
 * (the GEMV tiles) and with one (the panel tiles: 16 rows x 8 and 4
 * tokens with AVX-512, 8 x 4 otherwise, a last token alone), on every
 * int8 tier this CPU has. */
static void check_kernel_row_range(void) {
    enum { n_in = 64, n_out = 29, nt = 11, r0 = 5, r1 = 26 };
    float x[nt * n_in], want[nt * n_out], got[nt * n_out];
    tu_fill_normal(x, sizeof x / sizeof x[0], 1.0f, 9);
    void *scratch = tu_xmalloc(kt_q8_act_bytes(n_in, nt));
    void *panel = aligned_alloc(64, kt_matmul_panel_bytes(n_in));
    assert_non_null(panel);
    int8_t *qs;
    float *d;
    int32_t *c8;
    kt_q8_act xa = kt_q8_act_carve(scratch, n_in, nt, &qs, &d, &c8);
    for (int t = 0; t < nt; t++)
        kt_quantize_act_q8_ref(x + t * n_in, n_in, qs + t * n_in, d + t * 2, c8 + t * 2);
    for (int ti = 0; ti < N_TYPES; ti++) {
        void *w = tu_make_weights(TYPES[ti], n_in, n_out, 5, 0.3f);
        kt_matmul_ref(want, w, TYPES[ti], x, n_in, n_out, nt);
        for (int p = 0; p < 2; p++) {
            for (int i = 0; i < nt * n_out; i++) got[i] = -1.0f;
            kt_matmul_legacy_avx2(got, w, TYPES[ti], &xa, n_in, n_out, nt, r0, r1, p ? panel : NULL);
            for (int t = 0; t < nt; t++)
                for (int r = 0; r < n_out; r++) {
                    float g = got[t * n_out + r];
                    if (r < r0 || r >= r1) assert_true(g == -1.0f); /* untouched */
                    else if (memcmp(&g, &want[t * n_out + r], sizeof g) != 0)
                        fail_msg("%s %s panel, token %d row %d: %.9g, reference %.9g",
                                 kt_dtype_name(TYPES[ti]), p ? "with a" : "without a", t, r, g,
                                 want[t * n_out + r]);
                }
        }
        free(w);
    }
    free(panel);
    free(scratch);
}

static void test_avx2_kernel_row_range(void **state) {
    (void)state;
    if (!kt_cpu_has_avx2()) tu_skip("this CPU has no AVX2: only the scalar kernels run");
    check_kernel_row_range();
    if (kt_cpu_has_avx512_vnni()) {
        kt_cpu_force_no_avx512(true);
        check_kernel_row_range();
        kt_cpu_force_no_avx512(false);
    }
    if (kt_cpu_has_avx_vnni()) {
        kt_cpu_force_no_vnni(true);
        check_kernel_row_range();
        kt_cpu_force_no_vnni(false);
    }
}
#endif

/* A token's outputs are the same bits alone and in a batch, whatever the
 * thread count, on the SIMD and the scalar path. */
static void test_batch_invariance(void **state) {
    (void)state;
    kt_pool *pools[3] = {NULL, kt_pool_new(2, NULL), kt_pool_new(3, NULL)};
    assert_non_null(pools[1]);
    assert_non_null(pools[2]);
    const int n_in = 576, n_out = 67, nt = 21;
    float *x = tu_xmalloc(sizeof(float) * (size_t)nt * n_in);
    float *batch = tu_xmalloc(sizeof(float) * (size_t)nt * n_out), alone[67];
    tu_fill_normal(x, (size_t)nt * n_in, 1.0f, 4321);
    for (int s = 0; s < 2; s++) {
        kt_cpu_force_scalar(s == 1);
        for (int ti = 0; ti < N_TYPES; ti++) {
            void *w = tu_make_weights(TYPES[ti], n_in, n_out, 77, 0.3f);
            kt_matmul(pools[2], batch, w, TYPES[ti], x, n_in, n_out, nt);
            for (int t = 0; t < nt; t += 4)
                for (int p = 0; p < 3; p++) {
                    kt_matmul(pools[p], alone, w, TYPES[ti], x + (size_t)t * n_in, n_in, n_out, 1);
                    if (memcmp(alone, batch + (size_t)t * n_out, sizeof alone) != 0)
                        fail_msg("%s%s: token %d differs alone (pool %d)",
                                 kt_dtype_name(TYPES[ti]), s ? " (scalar)" : "", t, p);
                }
            free(w);
        }
    }
    kt_cpu_force_scalar(false);
    free(x);
    free(batch);
    kt_pool_free(pools[1]);
    kt_pool_free(pools[2]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_supported),
        cmocka_unit_test(test_dequant_q4_1_known),
        cmocka_unit_test(test_dequant_q5_known),
        cmocka_unit_test(test_quantizer_rules),
        cmocka_unit_test(test_roundtrip_error),
        cmocka_unit_test(test_ref_vs_dequantized),
        cmocka_unit_test(test_matmul_vs_ref),
#if defined(__x86_64__) || defined(__i386__)
        cmocka_unit_test(test_avx2_kernel_row_range),
#endif
        cmocka_unit_test(test_batch_invariance),
    };
    return tu_result(cmocka_run_group_tests(tests, NULL, NULL));
}
