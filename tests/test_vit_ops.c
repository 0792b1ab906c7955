/*
 * test_vit_ops.c - the vision tower's kernels (src/vision/vit_ops.c)
 * against their plain twins:
 *
 *  - attention through kt_matmul (vt_attention) against the plain
 *    per-query loops (vt_attention_ref): full attention over 3680-like
 *    and odd key counts, windows of uneven sizes (qwen2.5vl's partial
 *    windows), head dims 16 and 64, one thread and two; max |d| printed.
 *    A head dim that is not a multiple of 16 takes the plain path (same
 *    bits). Where the CPU has AMX, the tiles' attention (vt_attention_amx)
 *    against the same loops, within its bf16 split's error.
 *  - the element-wise kernels with an AVX2 twin give their scalar twin's
 *    bits: softmax rows (ggml's exp, sums in 8 double lanes; and written
 *    split for the AMX tiles, vt_softmax_split_row), the GELU /
 *    quick GELU tables (with and without the gate's up), F16 rounding; and
 *    the tables hold ggml's formulas.
 *  - gen-model's tower shape loads in kettle (`kettle info`).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#include "base/fp16.h"
#include "ops/amx.h"
#include "ops/cpu.h"
#include "ops/pool.h"
#include "vision/vision_internal.h"
#include "vision/vit_simd.h"

typedef struct att_case {
    int n_tokens, n_heads, d, win; /* win 0: full attention; else windows of `win` tokens, the last partial */
} att_case;

static double max_abs_diff(const float *a, const float *b, size_t n, double *max_ref) {
    double m = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= m)) m = d; /* NaN counts */
        if (fabs(b[i]) > r) r = fabs(b[i]);
    }
    *max_ref = r;
    return m;
}

/* the AMX attention's bound: its products carry ~2^-16 of relative error
 * (ops/amx.h), the scores (sums over d of q k, std 1.5 each) so much of
 * the sum of |q k|, and a probability moves by that times its score's
 * spread; measured 1.5e-5 - 8.4e-5 on these cases (max |ref| 2.7 - 5.3) */
#define AMX_TOL 1e-4

static void run_case(const att_case *c, kt_pool *pool) {
    int T = c->n_tokens, w = c->n_heads * c->d, stride = 3 * w;
    float *qkv = tu_xmalloc((size_t)T * stride * sizeof(float));
    float *out = tu_xmalloc((size_t)T * w * sizeof(float)), *ref = tu_xmalloc((size_t)T * w * sizeof(float));
    /* scores of a real tower span several units: q and k of std 1.5 */
    tu_fill_normal(qkv, (size_t)T * stride, 1.5f, 1000 + (uint64_t)T * 7 + (uint64_t)c->d);
    int n_win = c->win ? (T + c->win - 1) / c->win : 1;
    int *start = tu_xmalloc(((size_t)n_win + 1) * sizeof(int)), *members = tu_xmalloc((size_t)T * sizeof(int));
    for (int i = 0; i <= n_win; i++) start[i] = c->win ? (i * c->win < T ? i * c->win : T) : (i ? T : 0);
    /* members out of order, as windows gather tokens across rows */
    for (int t = 0; t < T; t++) members[t] = (int)(((long)t * 7919) % T);
    kt_error err = {0};
    assert_int_equal(vt_attention(pool, out, qkv, qkv + w, qkv + 2 * w, stride, c->n_heads, c->d, start, members,
                                  n_win, &err),
                     KT_OK);
    assert_int_equal(vt_attention_ref(NULL, ref, qkv, qkv + w, qkv + 2 * w, stride, c->n_heads, c->d, start,
                                      members, n_win, &err),
                     KT_OK);
    double mref, m = max_abs_diff(out, ref, (size_t)T * w, &mref);
    printf("  attention %5d tokens, %2d heads of %2d, %s: max |d| %.2e (max |ref| %.2f)\n", T, c->n_heads, c->d,
           c->win ? "windows" : "full   ", m, mref);
    /* different summation orders over up to 3680 keys, in float */
    if (!(m <= 2e-5 * (mref > 1 ? mref : 1))) fail_msg("attention differs from the plain loops by %g", m);
    if (c->d % 16 && m != 0) fail_msg("head dim %d must take the plain path exactly", c->d);
    if (kt_cpu_has_amx_bf16()) { /* the AMX tiles: products through bf16 hi + lo, ~2^-16 each */
        assert_int_equal(vt_attention_amx(pool, out, qkv, qkv + w, qkv + 2 * w, stride, c->n_heads, c->d, start,
                                          members, n_win, &err),
                         KT_OK);
        m = max_abs_diff(out, ref, (size_t)T * w, &mref);
        printf("  AMX attention %5d tokens, %2d heads of %2d, %s: max |d| %.2e\n", T, c->n_heads, c->d,
               c->win ? "windows" : "full   ", m);
        if (!(m <= AMX_TOL * (mref > 1 ? mref : 1))) fail_msg("AMX attention differs from the plain loops by %g", m);
    }
    free(qkv);
    free(out);
    free(ref);
    free(start);
    free(members);
}

static void test_attention(void **state) {
    (void)state;
    kt_error err = {0};
    kt_pool *pool = kt_pool_new(2, &err);
    assert_non_null(pool);
    const att_case cases[] = {
        {1000, 2, 64, 0}, {37, 3, 16, 0}, {1, 1, 16, 0}, {300, 2, 16, 64}, {250, 4, 64, 40}, {90, 2, 20, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        run_case(&cases[i], i % 2 ? NULL : pool);
        run_case(&cases[i], i % 2 ? pool : NULL);
    }
    kt_pool_free(pool);
}

static bool same_bits(const float *a, const float *b, long n, long *at) {
    for (long i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof *a)) {
            *at = i;
            return false;
        }
    return true;
}

static void test_softmax_twins(void **state) {
    (void)state;
    if (!kt_cpu_has_avx2()) tu_skip("no AVX2 on this CPU: only the scalar softmax runs");
    const int sizes[] = {1, 7, 8, 9, 16, 24, 40, 64, 100, 3680};
    for (size_t c = 0; c < sizeof sizes / sizeof sizes[0]; c++) {
        int n = sizes[c], n_pad = (n + 15) / 16 * 16;
        float *a = tu_xmalloc((size_t)n_pad * sizeof *a), *b = tu_xmalloc((size_t)n_pad * sizeof *b);
        tu_fill_normal(a, (size_t)n_pad, 12.0f, 77 + (uint64_t)n); /* a spread reaching the exp clamp */
        memcpy(b, a, (size_t)n_pad * sizeof *a);
        /* the split form (for the AMX tiles) from the same scores, both twins */
        const int k_pad = kt_amx_k_pad(n);
        const size_t n_split = (size_t)(k_pad / 32) * VT_SPLIT_BLOCK;
        uint16_t *sc = tu_xmalloc(n_split * sizeof *sc), *sa = tu_xmalloc(n_split * sizeof *sa);
        memset(sc, 0xab, n_split * sizeof *sc), memset(sa, 0xab, n_split * sizeof *sa);
        float fc = vt_softmax_split_row_c(a, n, 0.125f, sc, k_pad), fa = vt_softmax_split_row_avx2(a, n, 0.125f, sa, k_pad);
        assert_memory_equal(sc, sa, n_split * sizeof *sc);
        float f512 = fc;
        if (kt_cpu_has_amx_bf16()) { /* the AVX-512 twin, used beside the tiles */
            memset(sa, 0xab, n_split * sizeof *sa);
            f512 = vt_softmax_split_row_avx512(a, n, 0.125f, sa, k_pad);
            assert_memory_equal(sc, sa, n_split * sizeof *sc);
        }
        float ia = vt_softmax_row_avx2(a, n, n_pad, 0.125f), ib = vt_softmax_row_c(b, n, n_pad, 0.125f);
        /* the twins' factors are one; against the in-place softmax's, another order of the same sum */
        assert_true(memcmp(&fc, &fa, sizeof fc) == 0 && memcmp(&f512, &fc, sizeof fc) == 0);
        assert_true(fabsf(fc - ib) <= 1e-6f * ib);
        for (int j = 0; j < k_pad; j++) { /* vt_softmax_row's values, split (subnormals to zero) */
            const float e = j < n ? b[j] : 0.0f;
            const uint16_t h = vt_bf16_daz(e), l = vt_bf16_daz(e - kt_bf16_to_fp32(h));
            if (sc[VT_SPLIT_AT(j)] != h || sc[VT_SPLIT_AT(j) + VT_SPLIT_LO] != l) fail_msg("split n=%d at %d", n, j);
        }
        free(sc);
        free(sa);
        long at;
        if (!same_bits(a, b, n_pad, &at)) fail_msg("softmax n=%d differs at %ld: %g vs %g", n, at, a[at], b[at]);
        assert_true(memcmp(&ia, &ib, sizeof ia) == 0);
        double sum = 0;
        for (int j = 0; j < n; j++) sum += a[j] * ia;
        assert_true(fabs(sum - 1) < 1e-5);
        free(a);
        free(b);
    }
    /* values whose lo part is subnormal (e near 2^-118): the twins flush it
     * alike (VCVTNEPS2BF16's rule in the AVX-512 one) */
    {
        enum { N = 200 };
        float sc_in[N];
        uint64_t seed = 99;
        tu_fill_normal(sc_in, N, 0.5f, seed);
        for (int j = 0; j < N; j++) sc_in[j] = -656.0f + sc_in[j]; /* (s - max) / 8 near -82 */
        sc_in[0] = 0.0f;
        uint16_t c[7 * VT_SPLIT_BLOCK], a2[7 * VT_SPLIT_BLOCK], a5[7 * VT_SPLIT_BLOCK]; /* 224 values: 7 blocks */
        memset(c, 0, sizeof c), memset(a2, 0, sizeof a2), memset(a5, 0, sizeof a5);
        float fc = vt_softmax_split_row_c(sc_in, N, 0.125f, c, 224);
        float f2 = vt_softmax_split_row_avx2(sc_in, N, 0.125f, a2, 224);
        assert_memory_equal(c, a2, sizeof c);
        assert_true(memcmp(&fc, &f2, sizeof fc) == 0);
        int flushed = 0;
        for (int j = 1; j < N; j++) flushed += c[VT_SPLIT_AT(j) + VT_SPLIT_LO] == 0;
        assert_true(flushed > 0); /* the case was reached */
        if (kt_cpu_has_amx_bf16()) {
            float f5 = vt_softmax_split_row_avx512(sc_in, N, 0.125f, a5, 224);
            assert_memory_equal(c, a5, sizeof c);
            assert_true(memcmp(&fc, &f5, sizeof fc) == 0);
        }
    }
    /* the exp itself: within 2 ulp-ish of libm's over [-87, 0] */
    for (float x = -87.0f; x <= 0; x += 0.37f) {
        float e = vt_expf_neg(x), r = expf(x);
        if (!(fabsf(e - r) <= 3e-7f * r)) fail_msg("exp(%g) = %g, libm %g", x, e, r);
    }
}

static float gelu_tanh_ref(float x) {
    const float coef_a = 0.044715f, sqrt_2_over_pi = 0.79788456080286535587989211986876f;
    return 0.5f * x * (1.0f + tanhf(sqrt_2_over_pi * x * (1.0f + coef_a * x * x)));
}

static float f16r(float x) { return kt_fp16_to_fp32(kt_fp32_to_fp16(x)); }

static void test_act_twins(void **state) {
    (void)state;
    const long n = 10007;
    float *x = tu_xmalloc(n * sizeof *x), *up = tu_xmalloc(n * sizeof *up);
    float *a = tu_xmalloc(n * sizeof *a), *b = tu_xmalloc(n * sizeof *b);
    tu_fill_normal(x, (size_t)n, 5.0f, 5); /* past +-10 now and then */
    tu_fill_normal(up, (size_t)n, 1.0f, 6);
    const float *gelu = vt_gelu_table(false), *quick = vt_gelu_table(true);
    for (long i = 0; i < n; i++) { /* ggml's formulas (ggml_vec_gelu_f32 / _quick_f32 with the F16 tables) */
        float g = x[i] <= -10.0f ? 0.0f : x[i] >= 10.0f ? x[i] : f16r(gelu_tanh_ref(f16r(x[i])));
        float h = f16r(x[i]), q = f16r(h * (1.0f / (1.0f + expf(-1.702f * h))));
        assert_true(vt_act_table1(gelu, true, x[i]) == g);
        assert_true(vt_act_table1(quick, false, x[i]) == q);
    }
    if (!kt_cpu_has_avx2()) tu_skip("no AVX2 on this CPU: the tables were checked, not the SIMD twins");
    for (int variant = 0; variant < 4; variant++) {
        const float *table = variant & 1 ? quick : gelu;
        const float *u = variant & 2 ? up : NULL;
        memcpy(a, x, n * sizeof *a);
        memcpy(b, x, n * sizeof *b);
        vt_act_table_avx2(table, !(variant & 1), a, u, n);
        kt_cpu_force_scalar(true);
        vt_act_table(table, !(variant & 1), b, u, n);
        kt_cpu_force_scalar(false);
        long at;
        if (!same_bits(a, b, n, &at)) fail_msg("activation %d differs at %ld: %g vs %g", variant, at, a[at], b[at]);
    }
    vt_round_f16_avx2(a, x, n);
    vt_round_f16_ref(b, x, n);
    long at;
    if (!same_bits(a, b, n, &at)) fail_msg("F16 rounding differs at %ld", at);
    free(x);
    free(up);
    free(a);
    free(b);
}

/* a tower as gen-model writes it is one kettle loads (and prints) */
static void test_gen_model_tower(void **state) {
    (void)state;
    char cmd[1024], *out = NULL;
    const char *path = tu_tmp("gen-tower-tiny.gguf");
    snprintf(cmd, sizeof cmd, "%s gen-model --shape mmproj-qwen3.5-tiny --type F16 -o %s", KT_BIN, path);
    assert_int_equal(tu_run(cmd, NULL, NULL), 0);
    snprintf(cmd, sizeof cmd, "%s info %s", KT_BIN, path);
    assert_int_equal(tu_run(cmd, &out, NULL), 0);
    if (!out || !strstr(out, "vision tower: qwen3vl_merger, 3 blocks, width 64, 4 heads"))
        fail_msg("kettle info printed:\n%s", out ? out : "(nothing)");
    free(out);
    remove(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_softmax_twins),
        cmocka_unit_test(test_act_twins),
        cmocka_unit_test(test_gen_model_tower),
    };
    return tu_result(cmocka_run_group_tests(tests, NULL, NULL));
}
