/*
 * test_sampler.c - the sampler chain (kt_sampler_* in kettle.h,
 * sample/sampler.h): parameter checks, greedy, top-k, top-p, min-p,
 * temperature, penalties and seed reproducibility. Distributions are
 * checked empirically: tokens outside the kept set must never appear, and
 * frequencies must be within a few standard deviations of the expected
 * probabilities.
 */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "sample/exp_nonpos.h"
#include "sample/sampler.h"

#define N_DRAWS 20000

static kt_sampler_params plain(float temperature) {
    kt_sampler_params p = kt_sampler_defaults();
    p.temperature = temperature;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = 1234;
    return p;
}

static kt_sampler *make(const kt_sampler_params *p, int n_vocab) {
    kt_error err = { 0 };
    kt_sampler *s = kt_sampler_new(p, n_vocab, &err);
    if (!s) fprintf(stderr, "kt_sampler_new: %s\n", err.msg);
    assert_non_null(s);
    return s;
}

/* logits = log(probs): softmax at temperature 1 gives back probs. */
static void log_probs(const double *probs, int n, float *logits) {
    for (int i = 0; i < n; i++) logits[i] = (float)log(probs[i]);
}

/* Draws N_DRAWS tokens from a fresh copy of the logits each time and
 * checks their frequencies against `expect` (0 means never). */
static void check_distribution(kt_sampler *s, const float *logits, int n,
                               const double *expect) {
    int *count = calloc((size_t)n, sizeof *count);
    float *work = malloc((size_t)n * sizeof *work);
    assert_non_null(count);
    assert_non_null(work);
    for (int d = 0; d < N_DRAWS; d++) {
        memcpy(work, logits, (size_t)n * sizeof *work);
        int32_t id = kt_sampler_sample(s, work);
        assert_true(id >= 0 && id < n);
        count[id]++;
    }
    for (int i = 0; i < n; i++) {
        double f = (double)count[i] / N_DRAWS;
        if (expect[i] == 0.0) {
            if (count[i] != 0) fprintf(stderr, "token %d drawn %d times, expected never\n", i, count[i]);
            assert_int_equal(count[i], 0);
            continue;
        }
        double sd = sqrt(expect[i] * (1.0 - expect[i]) / N_DRAWS);
        if (fabs(f - expect[i]) > 5.0 * sd + 1e-9)
            fprintf(stderr, "token %d: frequency %.4f, expected %.4f (sd %.4f)\n", i, f,
                    expect[i], sd);
        assert_true(fabs(f - expect[i]) <= 5.0 * sd + 1e-9);
    }
    free(count);
    free(work);
}

/* ---- parameters -------------------------------------------------------- */

static void test_defaults(void **state) {
    (void)state;
    kt_sampler_params p = kt_sampler_defaults();
    assert_true(p.temperature == 0.8f);
    assert_int_equal(p.top_k, 40);
    assert_true(p.top_p == 0.95f);
    assert_true(p.min_p == 0.05f);
    assert_true(p.repeat_penalty == 1.0f);
    assert_true(p.frequency_penalty == 0.0f && p.presence_penalty == 0.0f);
    assert_int_equal(p.penalty_last_n, 64);
    assert_int_equal(p.seed, 0);
    kt_sampler_free(make(&p, 32000));
    kt_sampler_free(NULL);
}

static void expect_arg_error(const kt_sampler_params *p, int n_vocab, const char *what) {
    kt_error err = { 0 };
    kt_sampler *s = kt_sampler_new(p, n_vocab, &err);
    if (s || err.status != KT_ERR_ARG) fprintf(stderr, "not rejected: %s\n", what);
    assert_null(s);
    assert_int_equal(err.status, KT_ERR_ARG);
    assert_true(strlen(err.msg) > 0);
}

static void test_invalid_params(void **state) {
    (void)state;
    kt_sampler_params p = kt_sampler_defaults();
    expect_arg_error(&p, 0, "n_vocab 0");
    expect_arg_error(&p, -5, "n_vocab -5");
    expect_arg_error(NULL, 10, "NULL params");
    p.temperature = NAN;
    expect_arg_error(&p, 10, "NaN temperature");
    p.temperature = INFINITY;
    expect_arg_error(&p, 10, "inf temperature");
    p = kt_sampler_defaults();
    p.top_p = 0.0f;
    expect_arg_error(&p, 10, "top_p 0");
    p.top_p = -0.5f;
    expect_arg_error(&p, 10, "top_p < 0");
    p.top_p = NAN;
    expect_arg_error(&p, 10, "top_p NaN");
    p = kt_sampler_defaults();
    p.min_p = NAN;
    expect_arg_error(&p, 10, "min_p NaN");
    p = kt_sampler_defaults();
    p.repeat_penalty = 0.0f;
    expect_arg_error(&p, 10, "repeat_penalty 0");
    p = kt_sampler_defaults();
    p.frequency_penalty = NAN;
    expect_arg_error(&p, 10, "frequency_penalty NaN");
    p = kt_sampler_defaults();
    p.penalty_last_n = -1;
    expect_arg_error(&p, 10, "penalty_last_n -1");
    /* Errors without a kt_error must not crash. */
    p = kt_sampler_defaults();
    assert_null(kt_sampler_new(&p, 0, NULL));
}

/* ---- greedy and top-k -------------------------------------------------- */

static void test_greedy(void **state) {
    (void)state;
    kt_sampler_params p = plain(0.0f);
    kt_sampler *s = make(&p, 6);
    float l1[6] = { 0.1f, 3.0f, -1.0f, 2.9f, 3.0f, NAN };
    assert_int_equal(kt_sampler_sample(s, l1), 1); /* tie 1 vs 4: lowest id */
    float l2[6] = { -INFINITY, -INFINITY, -2.0f, -INFINITY, -3.0f, -1.5f };
    assert_int_equal(kt_sampler_sample(s, l2), 5);
    float l3[6] = { NAN, NAN, NAN, NAN, NAN, NAN };
    int32_t id = kt_sampler_sample(s, l3);
    assert_true(id >= 0 && id < 6);
    kt_sampler_free(s);

    p.temperature = -1.0f; /* any value <= 0 is greedy */
    s = make(&p, 6);
    float l4[6] = { 0, 0, 0, 0, 0, 7 };
    assert_int_equal(kt_sampler_sample(s, l4), 5);
    kt_sampler_free(s);
}

static void random_logits(kt_rng *r, float *l, int n) {
    for (int i = 0; i < n; i++) l[i] = 3.0f * kt_rng_normal(r);
}

static void test_top_k_1_is_greedy(void **state) {
    (void)state;
    enum { N = 1000 };
    static const float temps[] = { 0.1f, 0.7f, 1.0f, 2.5f, 100.0f };
    float l[N], g[N];
    kt_rng r;
    kt_rng_seed(&r, 7);
    kt_sampler_params pg = plain(0.0f);
    kt_sampler *greedy = make(&pg, N);
    for (size_t t = 0; t < sizeof temps / sizeof temps[0]; t++) {
        kt_sampler_params p = plain(temps[t]);
        p.top_k = 1;
        p.seed = t;
        kt_sampler *s = make(&p, N);
        for (int trial = 0; trial < 50; trial++) {
            random_logits(&r, l, N);
            if (trial % 10 == 0) l[N - 1] = l[3] = 50.0f; /* a tie: lowest id wins */
            memcpy(g, l, sizeof g);
            assert_int_equal(kt_sampler_sample(s, l), kt_sampler_sample(greedy, g));
        }
        kt_sampler_free(s);
    }
    kt_sampler_free(greedy);
}

static void test_top_k(void **state) {
    (void)state;
    double probs[6] = { 0.1, 0.3, 0.05, 0.25, 0.2, 0.1 };
    float l[6];
    log_probs(probs, 6, l);
    kt_sampler_params p = plain(1.0f);
    p.top_k = 3; /* keeps 1, 3, 4: mass 0.75 */
    kt_sampler *s = make(&p, 6);
    double expect[6] = { 0, 0.3 / 0.75, 0, 0.25 / 0.75, 0.2 / 0.75, 0 };
    check_distribution(s, l, 6, expect);
    kt_sampler_free(s);
}

/* top-k on a large vocabulary must match a plain full sort. */
static void test_top_k_large(void **state) {
    (void)state;
    enum { N = 32000 };
    float *l = malloc(N * sizeof *l), *w = malloc(N * sizeof *w);
    assert_non_null(l);
    assert_non_null(w);
    kt_rng r;
    kt_rng_seed(&r, 99);
    random_logits(&r, l, N);
    /* The 5 best, found by brute force. */
    int best[5];
    for (int k = 0; k < 5; k++) {
        best[k] = -1;
        for (int i = 0; i < N; i++) {
            bool taken = false;
            for (int j = 0; j < k; j++) taken |= best[j] == i;
            if (!taken && (best[k] < 0 || l[i] > l[best[k]])) best[k] = i;
        }
    }
    kt_sampler_params p = plain(1.5f);
    p.top_k = 5;
    kt_sampler *s = make(&p, N);
    for (int d = 0; d < 2000; d++) {
        memcpy(w, l, N * sizeof *w);
        int32_t id = kt_sampler_sample(s, w);
        bool ok = false;
        for (int j = 0; j < 5; j++) ok |= id == best[j];
        assert_true(ok);
    }
    kt_sampler_free(s);
    free(l);
    free(w);
}

/* ---- top-p, min-p, temperature ---------------------------------------- */

static void test_top_p(void **state) {
    (void)state;
    /* Sorted: 0.4 (1), 0.3 (3), 0.15 (4), 0.1 (2), 0.05 (0). Cumulative
     * 0.4, 0.7, 0.85: top_p 0.8 keeps {1, 3, 4}. */
    double probs[5] = { 0.05, 0.4, 0.1, 0.3, 0.15 };
    float l[5];
    log_probs(probs, 5, l);
    kt_sampler_params p = plain(1.0f);
    p.top_p = 0.8f;
    kt_sampler *s = make(&p, 5);
    double expect[5] = { 0, 0.4 / 0.85, 0, 0.3 / 0.85, 0.15 / 0.85 };
    check_distribution(s, l, 5, expect);
    kt_sampler_free(s);

    /* A tiny top_p keeps exactly the best token. */
    p.top_p = 0.01f;
    s = make(&p, 5);
    double only[5] = { 0, 1, 0, 0, 0 };
    check_distribution(s, l, 5, only);
    kt_sampler_free(s);

    /* top_p together with top_k: top-k first (3 kept, mass 0.85), then
     * top-p on the renormalized 0.47, 0.35, 0.18: 0.6 keeps two. */
    p.top_p = 0.6f;
    p.top_k = 3;
    s = make(&p, 5);
    double both[5] = { 0, 0.4 / 0.7, 0, 0.3 / 0.7, 0 };
    check_distribution(s, l, 5, both);
    kt_sampler_free(s);
}

static void test_min_p(void **state) {
    (void)state;
    /* p_max 0.5; min_p 0.2 keeps p >= 0.1: {0, 1, 2}. */
    double probs[5] = { 0.5, 0.25, 0.15, 0.06, 0.04 };
    float l[5];
    log_probs(probs, 5, l);
    kt_sampler_params p = plain(1.0f);
    p.min_p = 0.2f;
    kt_sampler *s = make(&p, 5);
    double expect[5] = { 0.5 / 0.9, 0.25 / 0.9, 0.15 / 0.9, 0, 0 };
    check_distribution(s, l, 5, expect);
    kt_sampler_free(s);
}

static void test_temperature(void **state) {
    (void)state;
    /* p ~ exp(l / T): [0.75, 0.25] at T = 0.5 becomes [0.9, 0.1]. */
    double probs[2] = { 0.75, 0.25 };
    float l[2];
    log_probs(probs, 2, l);
    kt_sampler_params p = plain(0.5f);
    kt_sampler *s = make(&p, 2);
    double expect[2] = { 0.9, 0.1 };
    check_distribution(s, l, 2, expect);
    kt_sampler_free(s);

    /* Temperature comes after min-p: min-p judges the T=1 distribution. */
    double probs3[3] = { 0.6, 0.3, 0.1 };
    float l3[3];
    log_probs(probs3, 3, l3);
    p = plain(2.0f);
    p.min_p = 0.4f; /* keeps p >= 0.24: {0, 1} */
    s = make(&p, 3);
    double e0 = sqrt(0.6), e1 = sqrt(0.3);
    double expect3[3] = { e0 / (e0 + e1), e1 / (e0 + e1), 0 };
    check_distribution(s, l3, 3, expect3);
    kt_sampler_free(s);
}

/* ---- penalties -------------------------------------------------------- */

static void test_penalties(void **state) {
    (void)state;
    kt_sampler_params p = plain(0.0f);
    p.repeat_penalty = 2.0f;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    p.penalty_last_n = 8;
    kt_sampler *s = make(&p, 5);
    kt_sampler_accept(s, 0);
    kt_sampler_accept(s, 1);
    kt_sampler_accept(s, 0);
    kt_sampler_accept(s, 99); /* out of range: ignored */
    kt_sampler_accept(s, -1);
    float l[5] = { 2.0f, -2.0f, 1.0f, 0.0f, 3.0f };
    kt_sampler_apply_penalties(s, l);
    /* token 0: twice: 2 / 2 - 2 * 0.5 - 0.25; token 1: once: -2 * 2 - 0.5 - 0.25 */
    assert_float_equal(l[0], 2.0f / 2.0f - 1.0f - 0.25f, 1e-6);
    assert_float_equal(l[1], -4.0f - 0.5f - 0.25f, 1e-6);
    assert_float_equal(l[2], 1.0f, 0);
    assert_float_equal(l[3], 0.0f, 0);
    assert_float_equal(l[4], 3.0f, 0);
    /* Applying again to fresh logits gives the same (counts restored). */
    float l2[5] = { 2.0f, -2.0f, 1.0f, 0.0f, 3.0f };
    kt_sampler_apply_penalties(s, l2);
    assert_memory_equal(l, l2, sizeof l);
    kt_sampler_free(s);

    /* Greedy is judged after the penalties. */
    p = plain(0.0f);
    p.repeat_penalty = 4.0f;
    s = make(&p, 3);
    float g[3] = { 1.0f, 3.0f, 2.0f };
    assert_int_equal(kt_sampler_sample(s, g), 1);
    kt_sampler_accept(s, 1);
    float g2[3] = { 1.0f, 3.0f, 2.0f };
    assert_int_equal(kt_sampler_sample(s, g2), 2);
    kt_sampler_free(s);
}

static void test_penalty_window(void **state) {
    (void)state;
    kt_sampler_params p = plain(0.0f);
    p.presence_penalty = 1.0f;
    p.penalty_last_n = 3;
    kt_sampler *s = make(&p, 4);
    int32_t seq[] = { 0, 1, 2, 2, 3 }; /* window ends as {2, 2, 3} */
    for (size_t i = 0; i < sizeof seq / sizeof seq[0]; i++) kt_sampler_accept(s, seq[i]);
    float l[4] = { 0, 0, 0, 0 };
    kt_sampler_apply_penalties(s, l);
    assert_float_equal(l[0], 0.0f, 0);
    assert_float_equal(l[1], 0.0f, 0);
    assert_float_equal(l[2], -1.0f, 0); /* presence once, not per occurrence */
    assert_float_equal(l[3], -1.0f, 0);
    kt_sampler_free(s);

    /* penalty_last_n 0 turns penalties off whatever their values. */
    p.penalty_last_n = 0;
    p.repeat_penalty = 3.0f;
    s = make(&p, 4);
    kt_sampler_accept(s, 1);
    float z[4] = { 1, 1, 1, 1 };
    kt_sampler_apply_penalties(s, z);
    for (int i = 0; i < 4; i++) assert_float_equal(z[i], 1.0f, 0);
    kt_sampler_free(s);
}

/* ---- reproducibility --------------------------------------------------- */

static void run_sequence(uint64_t seed, int32_t *out, int n) {
    enum { V = 500 };
    kt_sampler_params p = kt_sampler_defaults(); /* the full chain */
    p.seed = seed;
    p.repeat_penalty = 1.1f;
    p.top_k = 100;
    kt_sampler *s = make(&p, V);
    kt_rng r;
    kt_rng_seed(&r, 42); /* the same logits for every run */
    float l[V];
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < V; j++) l[j] = kt_rng_normal(&r);
        out[i] = kt_sampler_sample(s, l);
        kt_sampler_accept(s, out[i]);
    }
    kt_sampler_free(s);
}

static void test_seed(void **state) {
    (void)state;
    enum { N = 300 };
    int32_t a[N], b[N], c[N];
    run_sequence(1, a, N);
    run_sequence(1, b, N);
    run_sequence(2, c, N);
    assert_memory_equal(a, b, sizeof a);
    int same = 0;
    for (int i = 0; i < N; i++) same += a[i] == c[i];
    assert_true(same < N / 2);
}

/* The softmax terms' exponential against libm's double exp(): within 2
 * ulp over [-87, 0] (a million points and the ends), 0 below and for
 * -inf and NaN (masked and broken logits). */
static void test_exp_nonpos(void **state) {
    (void)state;
    double worst = 0.0;
    for (int i = 0; i <= 1000000; i++) {
        const float x = -87.0f * (float)i / 1000000.0f;
        const double want = exp((double)x), got = kt_exp_nonpos(x);
        const double ulp = nextafterf((float)want, INFINITY) - (float)want;
        const double err = fabs(got - want) / ulp;
        if (err > worst) worst = err;
        if (err > 2.0) fail_msg("e^%.9g: %.9g, exp() %.9g (%.2f ulp)", x, got, want, err);
    }
    printf("# kt_exp_nonpos: worst %.2f ulp over [-87, 0]\n", worst);
    assert_true(kt_exp_nonpos(0.0f) == 1.0f);
    assert_true(kt_exp_nonpos(-88.0f) == 0.0f && kt_exp_nonpos(-INFINITY) == 0.0f && kt_exp_nonpos(NAN) == 0.0f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_invalid_params),
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_top_k_1_is_greedy),
        cmocka_unit_test(test_top_k),
        cmocka_unit_test(test_top_k_large),
        cmocka_unit_test(test_top_p),
        cmocka_unit_test(test_min_p),
        cmocka_unit_test(test_temperature),
        cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_penalty_window),
        cmocka_unit_test(test_seed),
        cmocka_unit_test(test_exp_nonpos),
    };
    return tu_result(cmocka_run_group_tests(tests, NULL, NULL));
}
