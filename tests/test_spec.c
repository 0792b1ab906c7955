/*
 * test_spec.c - speculative decoding for a session (src/spec/): the
 * prompt-lookup proposer, and the claim that matters, that kt_spec_step
 * emits plain decoding's tokens exactly (greedy, sampled with a seed,
 * with penalties, F32 and Q4_0 weights, fixed and adaptive k, up to a
 * full context) while fewer forward passes produce them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kettle.h"
#include "spec/ngram.h"
#include "testutil.h"

/* ---- the proposer ---- */

static void test_ngram(void **state) {
    (void)state;
    int32_t out[8];
    /* ... 5 6 7 8 ... 5 6 -> 7 8 follow the earlier 5 6 */
    const int32_t a[] = {1, 5, 6, 7, 8, 9, 2, 5, 6};
    assert_int_equal(spec_ngram_propose(a, 9, 2, 4, 3, out), 3);
    assert_int_equal(out[0], 7), assert_int_equal(out[1], 8), assert_int_equal(out[2], 9);
    /* the latest occurrence wins; k caps the copy */
    const int32_t b[] = {5, 6, 1, 5, 6, 2, 5, 6};
    assert_int_equal(spec_ngram_propose(b, 8, 2, 4, 1, out), 1);
    assert_int_equal(out[0], 2);
    /* the longest suffix that occurs wins over a shorter, later one */
    const int32_t c[] = {4, 5, 6, 7, 0, 5, 6, 8, 4, 5, 6};
    assert_int_equal(spec_ngram_propose(c, 11, 2, 4, 2, out), 2);
    assert_int_equal(out[0], 7), assert_int_equal(out[1], 0);
    /* no occurrence, too short a context, k 0 */
    const int32_t d[] = {1, 2, 3, 4};
    assert_int_equal(spec_ngram_propose(d, 4, 2, 4, 4, out), 0);
    assert_int_equal(spec_ngram_propose(d, 1, 1, 4, 4, out), 0);
    assert_int_equal(spec_ngram_propose(a, 9, 2, 4, 0, out), 0);
    /* a repeating pattern: the longest earlier match (3 4 3 at 0) proposes what
     * followed it, up to the end of what is known (4 3) */
    const int32_t e[] = {3, 4, 3, 4, 3};
    assert_int_equal(spec_ngram_propose(e, 5, 2, 4, 8, out), 2);
    assert_int_equal(out[0], 4), assert_int_equal(out[1], 3);
}

/* ---- exactness ---- */

#define N_GEN 240

typedef struct gen_out {
    int32_t tokens[N_GEN + 40];
    int n;
    kt_status end; /* KT_OK, or why it stopped (KT_ERR_CONTEXT) */
    kt_spec_stats stats;
} gen_out;

static kt_session *session_for(kt_model *m, int n_ctx, const char *prompt, int32_t *ids, int *n_ids, float *logits) {
    kt_error err = {0};
    kt_session *s = kt_session_new(m, &(kt_session_params){.n_ctx = n_ctx, .n_threads = 2}, &err);
    assert_non_null(s);
    *n_ids = kt_tokenize(m, prompt, strlen(prompt), ids, 512, true, &err);
    assert_true(*n_ids > 0);
    assert_int_equal(kt_session_eval(s, ids, *n_ids, logits, false, &err), KT_OK);
    return s;
}

static kt_sampler *sampler(const kt_model *m, float temp, float repeat, const int32_t *ids, int n) {
    kt_sampler_params sp = kt_sampler_defaults();
    sp.temperature = temp, sp.repeat_penalty = repeat, sp.seed = 7;
    kt_error err = {0};
    kt_sampler *smp = kt_sampler_new(&sp, kt_model_describe(m)->n_vocab, &err);
    assert_non_null(smp);
    for (int i = 0; i < n; i++) kt_sampler_accept(smp, ids[i]);
    return smp;
}

/* Plain decoding: sample, accept, evaluate one token at a time. */
static void plain(kt_model *m, int n_ctx, const char *prompt, float temp, float repeat, gen_out *g) {
    int32_t ids[512];
    int n;
    float *logits = malloc(sizeof(float) * (size_t)kt_model_describe(m)->n_vocab);
    kt_session *s = session_for(m, n_ctx, prompt, ids, &n, logits);
    kt_sampler *smp = sampler(m, temp, repeat, ids, n);
    kt_error err = {0};
    for (g->n = 0, g->end = KT_OK; g->n < N_GEN;) {
        int32_t t = kt_sampler_sample(smp, logits);
        kt_sampler_accept(smp, t);
        g->tokens[g->n++] = t;
        if ((g->end = kt_session_eval(s, &t, 1, logits, false, &err)) != KT_OK) break;
    }
    kt_sampler_free(smp), kt_session_free(s), free(logits);
}

/* The same through kt_spec_step. */
static void spec(kt_model *m, int n_ctx, const char *prompt, float temp, float repeat, bool fixed, gen_out *g) {
    int32_t ids[512], ctx[1024], out[33];
    int n;
    float *logits = malloc(sizeof(float) * (size_t)kt_model_describe(m)->n_vocab);
    kt_session *s = session_for(m, n_ctx, prompt, ids, &n, logits);
    kt_sampler *smp = sampler(m, temp, repeat, ids, n);
    kt_error err = {0};
    kt_spec *sp = kt_spec_new(m, &(kt_spec_params){.k_max = 8, .fixed_k = fixed}, &err);
    assert_non_null(sp);
    memcpy(ctx, ids, sizeof *ids * (size_t)n);
    int32_t t = kt_sampler_sample(smp, logits);
    kt_sampler_accept(smp, t);
    ctx[n++] = t, g->tokens[0] = t, g->n = 1, g->end = KT_OK;
    while (g->n < N_GEN) {
        int got = kt_spec_step(sp, s, smp, ctx, n, out, &err);
        if (got < 0) {
            g->end = err.status;
            assert_int_equal(kt_session_n_past(s), n - 1); /* a failed step changes nothing */
            break;
        }
        assert_int_equal(kt_session_n_past(s), n + got - 1);
        for (int i = 0; i < got && g->n < N_GEN; i++) ctx[n++] = out[i], g->tokens[g->n++] = out[i];
    }
    g->stats = kt_spec_get_stats(sp);
    kt_spec_free(sp), kt_sampler_free(smp), kt_session_free(s), free(logits);
}

static void expect_same(const gen_out *a, const gen_out *b, const char *what) {
    assert_int_equal(a->end, b->end);
    int n = a->n < b->n ? a->n : b->n;
    for (int i = 0; i < n; i++)
        if (a->tokens[i] != b->tokens[i]) fail_msg("%s: token %d differs (%d vs %d)", what, i, a->tokens[i], b->tokens[i]);
    if (a->end == KT_OK) assert_int_equal(a->n, b->n);
}

static kt_model *load(const char *rel) {
    kt_error err = {0};
    kt_model *m = kt_model_load(tu_shared(rel), &err);
    if (!m) fail_msg("%s", err.msg);
    return m;
}

/* stories260K retells its own stories: greedy decoding finds proposals,
 * and every emitted token is plain decoding's, in fewer passes. */
static void test_exact_greedy_and_sampled(void **state) {
    (void)state;
    kt_model *m = load("models/stories260K.gguf");
    const char *prompt = "Once upon a time";
    struct { float temp, repeat; bool fixed; const char *what; } cases[] = {
        {0.0f, 1.0f, false, "greedy, adaptive k"}, {0.0f, 1.0f, true, "greedy, fixed k"},
        {0.8f, 1.0f, true, "temperature 0.8, seed 7"}, {1.0f, 1.3f, false, "temperature 1, repeat penalty 1.3"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        gen_out *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
        plain(m, 2048, prompt, cases[c].temp, cases[c].repeat, a);
        spec(m, 2048, prompt, cases[c].temp, cases[c].repeat, cases[c].fixed, b);
        expect_same(a, b, cases[c].what);
        if (c == 1) { /* greedy with every proposal verified: some are kept, fewer passes than tokens */
            printf("# %s: %llu passes for %d tokens, %llu of %llu proposed accepted\n", cases[c].what,
                   (unsigned long long)b->stats.steps, b->n, (unsigned long long)b->stats.accepted,
                   (unsigned long long)b->stats.proposed);
            assert_true(b->stats.accepted > 0);
            assert_true(b->stats.steps + 1 < (unsigned long long)b->n);
        }
        free(a), free(b);
    }
    kt_model_free(m);
}

/* Q4_0 weights (the quantized GEMM verifies, the GEMV decodes): a prompt
 * that repeats so proposals are long; and a context that fills up ends
 * both at the same token. */
static void test_exact_q4_0_and_full_context(void **state) {
    (void)state;
    kt_model *m = load("models/test-tiny-Q4_0.gguf");
    const char *prompt = "the cat sat on the mat and the cat sat on the mat and the cat sat on the";
    gen_out *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    plain(m, 2048, prompt, 0.0f, 1.0f, a);
    spec(m, 2048, prompt, 0.0f, 1.0f, true, b);
    expect_same(a, b, "Q4_0 greedy");
    assert_true(b->stats.proposed > 0);
    free(a), free(b);
    kt_model_free(m);
    m = load("models/stories260K.gguf");
    a = calloc(1, sizeof *a), b = calloc(1, sizeof *b);
    plain(m, 96, "Once upon a time", 0.0f, 1.0f, a);
    spec(m, 96, "Once upon a time", 0.0f, 1.0f, true, b);
    assert_int_equal(a->end, KT_ERR_CONTEXT);
    expect_same(a, b, "up to a full context");
    assert_int_equal(a->n, b->n);
    free(a), free(b);
    kt_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ngram),
        cmocka_unit_test(test_exact_greedy_and_sampled),
        cmocka_unit_test(test_exact_q4_0_and_full_context),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
