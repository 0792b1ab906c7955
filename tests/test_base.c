/*
 * test_base.c - the base layer: fp16/bf16 conversions against the
 * hardware (F16C) and the format definition, dtype table, error messages.
 */
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/dtype.h"
#include "base/error.h"
#include "base/fp16.h"
#include "base/rng.h"
#include "testutil.h"

__attribute__((target("f16c"))) static uint16_t hw_fp32_to_fp16(float f) {
    return (uint16_t)_cvtss_sh(f, 0);
}

__attribute__((target("f16c"))) static float hw_fp16_to_fp32(uint16_t h) {
    return _cvtsh_ss(h);
}

static bool have_f16c(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2"); /* every AVX2 CPU has F16C */
}

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void test_fp16_to_fp32_every_half(void **state) {
    (void)state;
    if (!have_f16c()) tu_skip("this CPU has no F16C (AVX2) to compare with");
    for (uint32_t h = 0; h < 65536; h++) {
        float a = kt_fp16_to_fp32((uint16_t)h), b = hw_fp16_to_fp32((uint16_t)h);
        if (isnan(b)) assert_true(isnan(a));
        else assert_int_equal(bits(a), bits(b));
    }
}

static void test_fp32_to_fp16_matches_f16c(void **state) {
    (void)state;
    if (!have_f16c()) tu_skip("this CPU has no F16C (AVX2) to compare with");
    /* every half value and the midpoints next to it (ties to even) */
    for (uint32_t h = 0; h < 0x7c00; h++) {
        float f = kt_fp16_to_fp32((uint16_t)h);
        for (int sign = 0; sign < 2; sign++) {
            for (int delta = -1; delta <= 1; delta++) {
                float g = from_bits(bits(f) + (uint32_t)delta);
                if (sign) g = -g;
                assert_int_equal(kt_fp32_to_fp16(g), hw_fp32_to_fp16(g));
            }
            float mid = from_bits(bits(f) + (1u << 12)); /* halfway to the next half */
            if (sign) mid = -mid;
            assert_int_equal(kt_fp32_to_fp16(mid), hw_fp32_to_fp16(mid));
        }
    }
    kt_rng r;
    kt_rng_seed(&r, 1);
    for (int i = 0; i < 2000000; i++) {
        float f = from_bits((uint32_t)kt_rng_u64(&r));
        if (isnan(f)) continue;
        assert_int_equal(kt_fp32_to_fp16(f), hw_fp32_to_fp16(f));
    }
    assert_int_equal(kt_fp32_to_fp16(INFINITY), 0x7c00);
    assert_int_equal(kt_fp32_to_fp16(70000.0f), 0x7c00);
    assert_true(isnan(kt_fp16_to_fp32(kt_fp32_to_fp16(NAN))));
}

static void test_bf16(void **state) {
    (void)state;
    assert_int_equal(kt_fp32_to_bf16(1.0f), 0x3f80);
    /* 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties to even -> 1.0 */
    assert_int_equal(kt_fp32_to_bf16(1.00390625f), 0x3f80);
    /* 1 + 3 * 2^-8 is halfway between 0x3f81 and 0x3f82: even is 0x3f82 */
    assert_int_equal(kt_fp32_to_bf16(1.01171875f), 0x3f82);
    assert_int_equal(kt_fp32_to_bf16(-2.0f), 0xc000);
    assert_true(isnan(kt_bf16_to_fp32(kt_fp32_to_bf16(NAN))));
    for (uint32_t h = 0; h < 65536; h++) {
        float f = kt_bf16_to_fp32((uint16_t)h);
        if (!isnan(f)) assert_int_equal(kt_fp32_to_bf16(f), h);
    }
}

static void test_dtype_table(void **state) {
    (void)state;
    assert_int_equal(kt_dtype_row_bytes(KT_Q4_0, 64), 36);
    assert_int_equal(kt_dtype_row_bytes(KT_Q8_0, 32), 34);
    assert_int_equal(kt_dtype_row_bytes(KT_Q8_0, 33), 0);
    assert_int_equal(kt_dtype_row_bytes(KT_F16, 3), 6);
    assert_int_equal(kt_dtype_row_bytes(KT_Q6_K, 256), 210);
    assert_int_equal(kt_dtype_parse("q4_0"), KT_Q4_0);
    assert_int_equal(kt_dtype_parse("BF16"), KT_BF16);
    assert_int_equal(kt_dtype_parse("Q9_9"), -1);
    assert_false(kt_dtype_known(4));
    assert_false(kt_dtype_known(1000));
    assert_string_equal(kt_dtype_name(1000), "unknown");
}

static void test_error_wrap(void **state) {
    (void)state;
    kt_error err;
    assert_int_equal(kt_error_set(&err, KT_ERR_FORMAT, "bad %s", "thing"), KT_ERR_FORMAT);
    kt_error_wrap(&err, "%s", "file.gguf");
    assert_string_equal(err.msg, "file.gguf: bad thing");
    assert_int_equal(err.status, KT_ERR_FORMAT);
    char longs[600];
    memset(longs, 'x', sizeof longs - 1);
    longs[sizeof longs - 1] = 0;
    kt_error_wrap(&err, "%s", longs); /* truncates, never overflows */
    assert_true(strlen(err.msg) < sizeof err.msg);
    assert_int_equal(strncmp(err.msg, "xxxx", 4), 0);
    assert_int_equal(kt_error_set(NULL, KT_ERR_IO, "ignored"), KT_ERR_IO);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp16_to_fp32_every_half),
        cmocka_unit_test(test_fp32_to_fp16_matches_f16c),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_dtype_table),
        cmocka_unit_test(test_error_wrap),
    };
    return tu_result(cmocka_run_group_tests(tests, NULL, NULL));
}
