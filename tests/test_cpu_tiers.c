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

#include "ops/cpu.h"
#include "testutil.h"

/* The tier kettle's dispatch would choose is off on this machine: say
 * what the CPU reports, so the reason is on the page. */
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
}

static void test_tier_avx_vnni(void **state) {
    (void)state;
    TIER(kt_cpu_has_avx_vnni(), "AVX-VNNI");
}

/* kt_cpu_has_avx512_vnni also needs AVX-VNNI (see ops/cpu.c). */
static void test_tier_avx512_vnni(void **state) {
    (void)state;
    TIER(kt_cpu_has_avx512_vnni(), "AVX-512 VNNI");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tier_avx2),
        cmocka_unit_test(test_tier_avx_vnni),
        cmocka_unit_test(test_tier_avx512_vnni),
    };
    return tu_result(cmocka_run_group_tests(tests, NULL, NULL));
}
