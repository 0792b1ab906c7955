/*
 * test_cpu_tiers.c - which SIMD tiers this machine can test.
 *
 * The kernel tests (test_ops, test_kquant, test_q5) run every tier the CPU
 * has, each against the scalar reference, by switching the higher tiers
 * off in turn. A tier the CPU lacks cannot run here at all; rather than
 * let that pass silently inside those programs, each tier is a test of
 * its own here, skipped (and shown as skipped by ctest) where the CPU
 * lacks it, so a run says which tiers it did not cover.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/cpu.h"
#include "ops/matmul.h"
#include "ops/quant.h"
#include "ops/repack.h"
#include "testutil.h"

/* The weight types added with Q2_K, Q3_K, IQ4_NL and IQ4_XS, and MXFP4: on the tier
 * under test (the higher ones switched off by the caller), kt_matmul
 * gives kt_matmul_ref's bits for one token (GEMV) and six (GEMM), with an
 * n_out that leaves a partial group of rows. */
static void check_new_types_on_tier(const char *tier) {
    static const kt_dtype types[] = {KT_Q2_K, KT_Q3_K, KT_IQ4_NL, KT_IQ4_XS, KT_MXFP4};
    enum { N_IN = 512, N_OUT = 19, NT = 6 };
    float *x = tu_xmalloc(sizeof(float) * NT * N_IN);
    float want[NT * N_OUT], got[NT * N_OUT];
    tu_fill_normal(x, NT * N_IN, 1.0f, 3);
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        void *w = tu_make_weights(types[i], N_IN, N_OUT, 11 + i, 0.0f);
        for (int nt = 1; nt <= NT; nt += NT - 1) {
            kt_matmul_ref(want, w, types[i], x, N_IN, N_OUT, nt);
            kt_matmul(NULL, got, w, types[i], x, N_IN, N_OUT, nt);
            if (memcmp(want, got, sizeof(float) * (size_t)(nt * N_OUT)) != 0)
                fail_msg("%s on %s, %d tokens: not the reference's bits", kt_dtype_name(types[i]), tier, nt);
        }
        free(w);
    }
    /* and their x8 layouts (rows in whole groups of 8): one token, 3 (the
     * per-token tiles) and 9 (the plain GEMM on unrepacked rows) */
    enum { N_OUT8 = 24, NT8 = 9 };
    float *x8x = tu_xmalloc(sizeof(float) * NT8 * N_IN);
    float want8[NT8 * N_OUT8], got8[NT8 * N_OUT8];
    tu_fill_normal(x8x, NT8 * N_IN, 1.0f, 5);
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        const size_t bytes = kt_dtype_row_bytes(types[i], N_IN) * N_OUT8;
        void *w = tu_make_weights(types[i], N_IN, N_OUT8, 21 + i, 0.0f);
        void *p = tu_xmalloc(bytes), *tmp = tu_xmalloc(kt_repack_tmp_bytes(types[i], N_IN));
        memcpy(p, w, bytes);
        kt_repack(p, types[i], N_IN, N_OUT8, tmp);
        const kt_dtype packed = kt_repack_type(types[i], N_IN, N_OUT8);
        assert_int_not_equal(packed, types[i]);
        for (int nt = 1; nt <= NT8; nt = nt == 1 ? 3 : nt + 6) {
            kt_matmul_ref(want8, w, types[i], x8x, N_IN, N_OUT8, nt);
            kt_matmul(NULL, got8, p, packed, x8x, N_IN, N_OUT8, nt);
            if (memcmp(want8, got8, sizeof(float) * (size_t)(nt * N_OUT8)) != 0)
                fail_msg("%s on %s, %d tokens: not the reference's bits", kt_dtype_name(packed), tier, nt);
        }
        free(w), free(p), free(tmp);
    }
    free(x8x);
    free(x);
}

/* A tier this CPU lacks is a skip, saying why. A tier it has is what the
 * kernel tests run, and they reach the tiers below it by switching it off:
 * check that the switch does switch it off, and back on. */
#define TIER(present, name)                                                                     \
    do {                                                                                        \
        if (!(present))                                                                         \
            tu_skip("the %s tier is off on this CPU (%s): its kernels are not tested here", name, \
                    kt_cpu_features());                                                         \
        printf("%s: on, tested by test_ops, test_kquant and test_q5\n", name);                 \
    } while (0)

static void test_tier_avx2(void **state) {
    (void)state;
    TIER(kt_cpu_has_avx2(), "AVX2 + FMA + F16C");
    kt_cpu_force_no_vnni(true); /* also switches AVX-512 VNNI off */
    check_new_types_on_tier("AVX2");
    kt_cpu_force_no_vnni(false);
    kt_cpu_force_scalar(true);
    check_new_types_on_tier("scalar");
    assert_false(kt_cpu_has_avx2());
    kt_cpu_force_scalar(false);
    assert_true(kt_cpu_has_avx2());
}

static void test_tier_avx_vnni(void **state) {
    (void)state;
    TIER(kt_cpu_has_avx_vnni(), "AVX-VNNI");
    kt_cpu_force_no_avx512(true);
    check_new_types_on_tier("AVX-VNNI");
    kt_cpu_force_no_avx512(false);
    kt_cpu_force_no_vnni(true);
    assert_false(kt_cpu_has_avx_vnni());
    assert_true(kt_cpu_has_avx2());
    kt_cpu_force_no_vnni(false);
    assert_true(kt_cpu_has_avx_vnni());
}

/* kt_cpu_has_avx512_vnni needs AVX-512 F/BW/VL/VNNI, not AVX-VNNI
 * (ops/cpu.c); the VNNI switch turns it off too. */
static void test_tier_avx512_vnni(void **state) {
    (void)state;
    TIER(kt_cpu_has_avx512_vnni(), "AVX-512 VNNI");
    check_new_types_on_tier("AVX-512 VNNI");
    kt_cpu_force_no_avx512(true);
    assert_false(kt_cpu_has_avx512_vnni());
    assert_true(kt_cpu_has_avx2());
    kt_cpu_force_no_avx512(false);
    kt_cpu_force_no_vnni(true);
    assert_false(kt_cpu_has_avx512_vnni());
    kt_cpu_force_no_vnni(false);
    assert_true(kt_cpu_has_avx512_vnni());
}

/* AMX-INT8 (the prefill tiles of the 32-value x8 formats) sits above
 * AVX-512 VNNI: the switches that drop that drop it too, and the AMX
 * switch drops it alone. */
static void test_tier_amx_int8(void **state) {
    (void)state;
    TIER(kt_cpu_has_amx_int8(), "AMX-INT8");
    check_new_types_on_tier("AMX-INT8");
    kt_cpu_force_no_avx512(true);
    assert_false(kt_cpu_has_amx_int8());
    kt_cpu_force_no_avx512(false);
    kt_cpu_force_no_amx(true);
    assert_false(kt_cpu_has_amx_int8());
    assert_true(kt_cpu_has_avx512_vnni());
    kt_cpu_force_no_amx(false);
    assert_true(kt_cpu_has_amx_int8());
}

/* AVX-512 VNNI shown without AVX-VNNI, as some hypervisors show Zen 4 /
 * 5 (machine A on 2026-12-01): the AVX-512 tiles must still run, Q8_0's
 * included (issue 38: they were gated on AVX-VNNI), and give the
 * reference's bits, as must the new types. test_ops runs every int8
 * kernel this way too. */
static void test_tier_avx512_without_avx_vnni(void **state) {
    (void)state;
    TIER(kt_cpu_has_avx512_vnni() && kt_cpu_has_avx_vnni(), "AVX-512 VNNI without AVX-VNNI (hidden)");
    kt_cpu_hide_avx_vnni(true);
    assert_false(kt_cpu_has_avx_vnni());
    assert_true(kt_cpu_has_avx512_vnni());
    check_new_types_on_tier("AVX-512 VNNI without AVX-VNNI");
    enum { N_IN = 512, N_OUT = 19, NT = 6 };
    float *x = tu_xmalloc(sizeof(float) * NT * N_IN);
    float want[NT * N_OUT], got[NT * N_OUT];
    tu_fill_normal(x, NT * N_IN, 1.0f, 7);
    void *w = tu_make_weights(KT_Q8_0, N_IN, N_OUT, 13, 0.0f);
    for (int nt = 1; nt <= NT; nt += NT - 1) {
        kt_matmul_ref(want, w, KT_Q8_0, x, N_IN, N_OUT, nt);
        kt_matmul(NULL, got, w, KT_Q8_0, x, N_IN, N_OUT, nt);
        if (memcmp(want, got, sizeof(float) * (size_t)(nt * N_OUT)) != 0)
            fail_msg("Q8_0 with AVX-VNNI hidden, %d tokens: not the reference's bits", nt);
    }
    free(w), free(x);
    kt_cpu_hide_avx_vnni(false);
    assert_true(kt_cpu_has_avx_vnni());
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tier_avx2),
        cmocka_unit_test(test_tier_avx_vnni),
        cmocka_unit_test(test_tier_avx512_vnni),
        cmocka_unit_test(test_tier_avx512_without_avx_vnni),
        cmocka_unit_test(test_tier_amx_int8),
    };
    return tu_result(cmocka_run_group_tests(tests, NULL, NULL));
}
