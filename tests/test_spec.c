/*
 * test_spec.c - speculative decoding for a session (src/spec/): the
 * prompt-lookup proposer, and the claim that matters, that kt_spec_step
 * emits plain decoding's tokens exactly (greedy, sampled with a seed,
 * with penalties, F32 and Q4_0 weights, fixed and adaptive k, up to a
 * full context) while fewer forward passes produce them; the rule's
 * statistics at temperature 1; the cross-request table and the choice of
 * k (spec/policy.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kettle.h"
#include "spec/ngram.h"
#include "spec/policy.h"
#include "spec/table.h"
#include "testutil.h"

#include <math.h>

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

/* ---- the cross-request table ---- */

static void test_table(void **state) {
    (void)state;
    spec_table *t = spec_table_new(64);
    assert_non_null(t);
    int32_t out[8];
    const int32_t run1[] = {10, 11, 12, 13, 14, 15};
    spec_table_add(t, run1, 6);
    const int32_t ctx[] = {1, 2, 10, 11, 12};
    assert_int_equal(spec_table_propose(t, ctx, 5, 8, out), 3); /* to the run's end */
    assert_int_equal(out[0], 13), assert_int_equal(out[2], 15);
    assert_int_equal(spec_table_propose(t, ctx, 5, 2, out), 2); /* k caps */
    assert_int_equal(spec_table_propose(t, ctx, 2, 8, out), 0); /* shorter than the n-gram */
    /* runs do not join: 14 15 | 20 is no n-gram, and the latest occurrence wins */
    const int32_t run2[] = {20, 10, 11, 12, 99};
    spec_table_add(t, run2, 5);
    assert_int_equal(spec_table_propose(t, ctx, 5, 8, out), 1);
    assert_int_equal(out[0], 99);
    const int32_t across[] = {14, 15, 20};
    assert_int_equal(spec_table_propose(t, across, 3, 8, out), 0);
    /* overwritten entries are misses: 200 tokens through a 64-token ring */
    int32_t big[200];
    for (int i = 0; i < 200; i++) big[i] = 1000 + i;
    spec_table_add(t, big, 200);
    assert_int_equal(spec_table_propose(t, ctx, 5, 8, out), 0);
    const int32_t late[] = {1190, 1191, 1192};
    assert_int_equal(spec_table_propose(t, late, 3, 8, out), 7);
    assert_int_equal(out[0], 1193), assert_int_equal(out[6], 1199);
    const int32_t early[] = {1000, 1001, 1002};
    assert_int_equal(spec_table_propose(t, early, 3, 8, out), 0);
    spec_table_free(t);
}

/* ---- the choice of k ---- */

/* A new sequence's tracker: with nothing seen, its first chance is a
 * probe (no wait to learn); after other sequences' verify results, it
 * starts from them, with the usual wait before a probe. */
static void test_policy_inherit(void **state) {
    (void)state;
    double ms[40] = {0};
    spec_costs c = {ms, 39, 0.0};
    spec_cost_note(&c, 1, 100.0), spec_cost_note(&c, 2, 180.0); /* one proposal pays only if kept ~3 times in 4 */
    spec_accept seen, a;
    spec_accept_init(&seen);
    spec_accept_inherit(&a, &seen);
    assert_int_equal(spec_choose_k(&a, &c, 1, 1, 1.0, false), SPEC_PROBE_K);
    assert_int_equal(spec_choose_k(&a, &c, 1, 1, 1.0, false), 0); /* then the wait */
    for (int i = 0; i < 20; i++) spec_accept_note(&seen, 4, 4);
    spec_accept_inherit(&a, &seen);
    assert_true(spec_accept_expected(&a, 4) > 4.0);
    assert_int_equal(spec_choose_k(&a, &c, 1, 1, 1.0, false), 1); /* kept every time: it pays at once */
    for (int i = 0; i < 40; i++) spec_accept_note(&seen, 1, 0);
    spec_accept_inherit(&a, &seen);
    for (int i = 0; i < SPEC_PROBE_EVERY - 1; i++) assert_int_equal(spec_choose_k(&a, &c, 1, 1, 1.0, false), 0);
    assert_int_equal(spec_choose_k(&a, &c, 1, 1, 1.0, false), SPEC_PROBE_K); /* never kept: probes after the wait */
}

/* The cost of a rejection (a hybrid model's rollback) is weighed by its
 * chance: proposals kept half the time that pay against the pass alone
 * are dropped when the rollbacks eat their gain, and ones always kept
 * still pay against a dear rollback. */
static void test_policy_fixed_cost(void **state) {
    (void)state;
    double ms[40] = {0};
    spec_costs c = {ms, 39, 0.0};
    for (int n = 1; n <= 39; n++) spec_cost_note(&c, n, 100.0 + 10.0 * n);
    spec_accept seen, a, b;
    spec_accept_init(&seen);
    spec_accept_inherit(&a, &seen);
    spec_accept_inherit(&b, &seen);
    assert_true(spec_choose_k_paid(&a, &c, 3, 1, 1.0, false, 0.0, 0.0, NULL) > 0);
    /* half kept (1.5 tokens for 120 ms, or 1.875 for 140) against 1 for 110 pays alone, not with 200 ms
     * paid on each rejection (half or more of the passes) */
    for (int i = 0; i < 20; i++) spec_accept_note(&b, 1, i % 2);
    assert_true(spec_choose_k_paid(&b, &c, 3, 1, 1.0, false, 0.0, 0.0, NULL) > 0);
    for (int i = 0; i < 4; i++) assert_int_equal(spec_choose_k_paid(&b, &c, 3, 1, 1.0, false, 0.0, 200.0, NULL), 0);
    /* kept every time: 3 pay (3.9 tokens for 140 ms against 1 for 110) even with 400 ms a rejection,
     * which is rare */
    for (int i = 0; i < 20; i++) spec_accept_note(&a, 3, 3);
    assert_int_equal(spec_choose_k_paid(&a, &c, 3, 1, 1.0, false, 0.0, 0.0, NULL), 3);
    assert_int_equal(spec_choose_k_paid(&a, &c, 3, 1, 1.0, false, 0.0, 400.0, NULL), 3);
}

/* One probe a step: two new sequences at their first chance in one
 * step, the second waits for the next step (acceptance is not in yet). */
static void test_policy_one_probe_a_step(void **state) {
    (void)state;
    double ms[40] = {0};
    spec_costs c = {ms, 39, 0.0};
    spec_cost_note(&c, 1, 100.0), spec_cost_note(&c, 2, 101.0), spec_cost_note(&c, 3, 130.0);
    spec_accept seen, a, b;
    spec_accept_init(&seen);
    spec_accept_inherit(&a, &seen), spec_accept_inherit(&b, &seen);
    /* no evidence: neither pays on its rate (prior 1/2 a depth), both could were all kept */
    spec_cost_note(&c, 4, 160.0), spec_cost_note(&c, 5, 170.0);
    bool may = true;
    assert_int_equal(spec_choose_k_paid(&a, &c, 3, 2, 2.0, false, 0.0, 0.0, &may), SPEC_PROBE_K);
    assert_false(may);
    assert_int_equal(spec_choose_k_paid(&b, &c, 3, 3, 3.0, false, 0.0, 0.0, &may), 0);
    may = true; /* the next step */
    assert_int_equal(spec_choose_k_paid(&b, &c, 3, 2, 2.0, false, 0.0, 0.0, &may), SPEC_PROBE_K);
    assert_false(may);
}

/* A pass past the largest measured one, where a prefill token's cost is
 * known, is guessed at no less than that a token more: beside 8 streams
 * (163 ms, 127 for one) a 9-token probe is not worth it at 15 ms a token,
 * where the line through 1 and 8 (5 ms a token) would try it; a lone
 * stream still tries proposals. */
static void test_policy_token_floor(void **state) {
    (void)state;
    double ms[40] = {0};
    spec_costs c = {ms, 39, 0.0};
    spec_cost_note(&c, 1, 127.0), spec_cost_note(&c, 8, 163.0);
    spec_accept seen, a, b;
    spec_accept_init(&seen);
    spec_accept_inherit(&a, &seen), spec_accept_inherit(&b, &seen);
    assert_int_equal(spec_choose_k_paid(&a, &c, 3, 8, 8.0, false, 5.0, 0.0, NULL), SPEC_PROBE_K); /* the line */
    c.ms_token = 15.0;
    for (int i = 0; i < 4 * SPEC_PROBE_MAX; i++) assert_int_equal(spec_choose_k_paid(&b, &c, 3, 8, 8.0, false, 5.0, 0.0, NULL), 0);
    spec_accept_init(&b);
    assert_true(spec_choose_k_paid(&b, &c, 3, 1, 1.0, false, 5.0, 0.0, NULL) > 0);
}

static void test_policy(void **state) {
    (void)state;
    double ms[40] = {0};
    spec_costs c = {ms, 39, 0.0};
    spec_accept a;
    spec_accept_init(&a);
    assert_int_equal(spec_choose_k(&a, &c, 8, 1, 1.0, false), 0); /* plain decoding's cost first */
    spec_cost_note(&c, 1, 30.0);
    /* then, with no evidence on acceptance (1/2 a depth) and the cost prior, a short try */
    assert_int_equal(spec_choose_k(&a, &c, 8, 1, 1.0, false), 1);
    /* flat costs (bandwidth-bound decode) and proposals kept: verify them all */
    for (int n = 1; n <= 39; n++) spec_cost_note(&c, n, 30.0 + 0.5 * n);
    for (int i = 0; i < 20; i++) spec_accept_note(&a, 8, 8);
    assert_true(spec_accept_expected(&a, 8) > 8.0);
    assert_int_equal(spec_choose_k(&a, &c, 8, 1, 1.0, false), 8);
    /* one-token proposals always kept: deeper ones, never tried, take that rate, so they are tried */
    spec_accept_init(&a);
    for (int i = 0; i < 20; i++) spec_accept_note(&a, 1, 1);
    assert_true(spec_accept_expected(&a, 8) > 7.0);
    assert_int_equal(spec_choose_k(&a, &c, 8, 1, 1.0, false), 8);
    const double e8 = spec_accept_expected(&a, 8);
    spec_accept_note(&a, 8, 3); /* a first look at depth 4: it fails there, and what lies past it looks worse */
    assert_true(spec_accept_expected(&a, 3) > 3.5 && spec_accept_expected(&a, 8) < e8 - 1.0);
    /* never kept: back off to 0, with a one-token probe after SPEC_PROBE_EVERY
     * calls, the wait doubling while probes find nothing (16, 32, 64, 128, 256) */
    for (int n = 1; n <= 39; n++) ms[n] = 30.0 + 10.0 * n; /* where a kept proposal in 6 would not pay */
    spec_accept_init(&a);
    for (int i = 0; i < 5; i++) spec_accept_note(&a, 8, 0);
    a.probe_every = SPEC_PROBE_EVERY;
    int probes = 0, last = 0;
    for (int i = 1; i <= 16 + 32 + 64 + 128 + 256; i++) {
        int k = spec_choose_k(&a, &c, 8, 1, 1.0, false);
        assert_true(k == 0 || k == SPEC_PROBE_K);
        if (k) probes++, last = i, spec_accept_note(&a, k, 0);
    }
    assert_int_equal(probes, 5);
    assert_int_equal(last, 16 + 32 + 64 + 128 + 256);
    /* probes kept until speculation pays bring the short wait back */
    for (int i = 0; i < 10; i++) spec_accept_note(&a, 1, 1);
    assert_true(spec_choose_k(&a, &c, 8, 1, 1.0, false) > 0);
    assert_int_equal(a.probe_every, SPEC_PROBE_EVERY);
    /* near break-even (kept at 60%, where a 2-token pass pays from 75%):
     * the probes' waits still double */
    for (int n = 1; n <= 39; n++) ms[n] = 0.0;
    spec_cost_note(&c, 1, 40.0), spec_cost_note(&c, 2, 70.0), spec_cost_note(&c, 3, 100.0);
    spec_accept_init(&a);
    for (int i = 0; i < 30; i++) spec_accept_note(&a, 1, i % 5 < 3);
    probes = 0;
    for (int i = 1; i <= 16 + 32 + 64 + 128 + 256; i++) {
        int k = spec_choose_k(&a, &c, 1, 1, 1.0, false);
        assert_true(k == 0 || k == SPEC_PROBE_K);
        if (k) spec_accept_note(&a, k, probes++ % 5 < 3);
    }
    assert_int_equal(probes, 5);
    /* half kept but the pass is compute-bound (cost grows with every
     * token: a batch that already fills the GEMM): not worth it */
    for (int n = 1; n <= 39; n++) ms[n] = 10.0 * n;
    spec_accept_init(&a);
    for (int i = 0; i < 20; i++) spec_accept_note(&a, 4, 2);
    assert_int_equal(spec_choose_k(&a, &c, 8, 16, 16.0, false), 0);
    assert_int_equal(spec_choose_k(&a, &c, 8, 16, 16.0, true), 8); /* fixed: all */
    /* unmeasured sizes: the largest measured smaller one, a quarter more per token */
    double ms2[40] = {0};
    spec_costs c2 = {ms2, 39, 0.0};
    spec_cost_note(&c2, 3, 8.0);
    assert_true(spec_cost(&c2, 3) == 8.0 && spec_cost(&c2, 7) == 16.0 && spec_cost(&c2, 2) == 0.0);
    /* two measured: the line through the two largest below, flat at worst */
    spec_cost_note(&c2, 1, 4.0);
    assert_true(spec_cost(&c2, 5) == 12.0); /* 8 + 2 x (8 - 4) / 2 */
    spec_cost_note(&c2, 4, 7.0);            /* cheaper than 3 (noise): flat */
    assert_true(spec_cost(&c2, 9) == 7.0);
    /* between two measured sizes: the line between them (a kernel tile's step, 4 -> 8, shows) */
    spec_cost_note(&c2, 8, 19.0);
    assert_true(spec_cost(&c2, 6) == 13.0 && spec_cost(&c2, 9) == 22.0); /* past 8: the line through 4 and 8 */
    spec_cost_note(&c2, 12, 10.0); /* a larger one measured cheaper (noise): not a line between */
    assert_true(spec_cost(&c2, 10) == 25.0);
    /* a model whose extra rows cost a whole token each (2 tokens 2.3x one:
     * per-row work is the pass) and a lookup that keeps about half: the
     * line says no larger pass pays, so none is tried */
    double ms3[40] = {0};
    spec_costs c3 = {ms3, 39, 0.0};
    spec_cost_note(&c3, 1, 10.0), spec_cost_note(&c3, 2, 23.0);
    spec_accept_init(&a);
    for (int i = 0; i < 20; i++) spec_accept_note(&a, 8, 0), spec_accept_note(&a, 8, 1);
    for (int i = 0; i < 8; i++) assert_int_equal(spec_choose_k(&a, &c3, 8, 1, 1.0, false), 0);
    /* nor probed: even all kept, 9 tokens for a 9-token pass (the line's
     * 101) do not beat one token for 10 */
    for (int i = 0; i < 4 * SPEC_PROBE_MAX; i++) assert_int_equal(spec_choose_k(&a, &c3, 8, 1, 1.0, false), 0);
    /* the same line where the pass is flat (bandwidth-bound) and proposals are kept: all 8 tried */
    double ms4[40] = {0};
    spec_costs c4 = {ms4, 39, 0.0};
    spec_cost_note(&c4, 1, 30.0), spec_cost_note(&c4, 2, 31.0);
    spec_accept_init(&a);
    for (int i = 0; i < 20; i++) spec_accept_note(&a, 1, 1);
    assert_int_equal(spec_choose_k(&a, &c4, 8, 1, 1.0, false), 8);
    /* compute-bound (8 streams, a step 3.3x one token's) and the line flat
     * from noise (7 and 8 tokens alike): an unmeasured size is guessed at
     * its full share, so nothing is tried on the flat line's word */
    spec_cost_note(&c4, 7, 99.0), spec_cost_note(&c4, 8, 99.0);
    assert_int_equal(spec_choose_k(&a, &c4, 8, 8, 8.0, false), 0);
    spec_cost_note(&c4, 16, 110.0); /* measured cheap (a filling tile): taken */
    assert_int_equal(spec_choose_k(&a, &c4, 8, 8, 8.0, false), 8);
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

static kt_model *g_draft; /* spec()'s draft model; NULL: prompt lookup */

/* The same through kt_spec_step. */
static void spec(kt_model *m, int n_ctx, const char *prompt, float temp, float repeat, bool fixed, gen_out *g) {
    int32_t ids[512], ctx[1024], out[33];
    int n;
    float *logits = malloc(sizeof(float) * (size_t)kt_model_describe(m)->n_vocab);
    kt_session *s = session_for(m, n_ctx, prompt, ids, &n, logits);
    kt_sampler *smp = sampler(m, temp, repeat, ids, n);
    kt_error err = {0};
    kt_spec *sp = kt_spec_new(m, &(kt_spec_params){.k_max = 8, .fixed_k = fixed, .draft = g_draft, .draft_threads = 1}, &err);
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

/* A draft model (stories260K drafting for itself, so its greedy guesses
 * are kept at temperature 0 and often at 0.8): plain decoding's tokens,
 * up to a full context, the draft's session cut back and read again
 * after each rejection; a draft of another vocabulary is refused. */
static void test_exact_with_draft(void **state) {
    (void)state;
    kt_model *m = load("models/stories260K.gguf");
    g_draft = m;
    struct { int n_ctx; float temp, repeat; bool fixed; const char *what; } cases[] = {
        {2048, 0.0f, 1.0f, true, "draft, greedy, fixed k"}, {2048, 0.8f, 1.0f, false, "draft, temperature 0.8"},
        {2048, 1.0f, 1.3f, true, "draft, temperature 1, repeat penalty"}, {96, 0.0f, 1.0f, true, "draft, full context"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        gen_out *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
        plain(m, cases[c].n_ctx, "Once upon a time", cases[c].temp, cases[c].repeat, a);
        spec(m, cases[c].n_ctx, "Once upon a time", cases[c].temp, cases[c].repeat, cases[c].fixed, b);
        expect_same(a, b, cases[c].what);
        printf("# %s: %llu passes for %d tokens, %llu of %llu proposed accepted\n", cases[c].what,
               (unsigned long long)b->stats.steps, b->n, (unsigned long long)b->stats.accepted,
               (unsigned long long)b->stats.proposed);
        if (c == 0) assert_true(b->stats.accepted == b->stats.proposed && b->stats.steps * 4 < (unsigned long long)b->n);
        if (c == 2) assert_true(b->stats.accepted > 0 && b->stats.accepted < b->stats.proposed);
        free(a), free(b);
    }
    g_draft = NULL;
    kt_model *other = load("models/test-tiny-Q4_0.gguf");
    kt_error err = {0};
    assert_null(kt_spec_new(m, &(kt_spec_params){.draft = other}, &err));
    if (!strstr(err.msg, "a draft needs the same vocabulary")) fail_msg("%s", err.msg);
    kt_model_free(other);
    kt_model_free(m);
}

/* ---- the rule's statistics ----
 *
 * The rule for a proposal y from a draft distribution q is "keep y with
 * probability min(1, p(y) / q(y)), else draw from the residual
 * max(0, p - q), normalized". kettle's proposals are single tokens (q is
 * one-hot on y), where the rule is "keep y with probability p(y), else
 * draw from p without y": drawing x from p and keeping y iff x == y is
 * that rule. Checked at temperature 1 over 4000 seeds on stories260K (512
 * tokens): the first token's distribution is p, y is kept at rate p(y),
 * and after a kept y the next token follows p(. | y). */
typedef struct fixed_prop {
    int32_t y[2];
} fixed_prop;

static int propose_fixed(void *ctx, const int32_t *tokens, int n, int k, int32_t *out) {
    (void)tokens, (void)n;
    const fixed_prop *f = ctx;
    int got = k < 2 ? k : 2;
    memcpy(out, f->y, sizeof *out * (size_t)got);
    return got;
}

/* Softmax at temperature 1 of the logits after ctx[0..n). */
static void target_dist(kt_model *m, const int32_t *ctx, int n, double *p) {
    const int n_vocab = kt_model_describe(m)->n_vocab;
    float *logits = malloc(sizeof(float) * (size_t)n_vocab);
    kt_error err = {0};
    kt_session *s = kt_session_new(m, &(kt_session_params){.n_ctx = 256, .n_threads = 2}, &err);
    assert_non_null(s);
    assert_int_equal(kt_session_eval(s, ctx, n, logits, false, &err), KT_OK);
    double max = logits[0], sum = 0;
    for (int i = 1; i < n_vocab; i++) max = logits[i] > max ? logits[i] : max;
    for (int i = 0; i < n_vocab; i++) sum += p[i] = exp(logits[i] - max);
    for (int i = 0; i < n_vocab; i++) p[i] /= sum;
    kt_session_free(s), free(logits);
}

/* Pearson's chi-square of counts against p (bins of expected < 5 pooled);
 * fails past 6 standard deviations of its distribution. */
static void expect_distribution(const int *count, const double *p, int n_vocab, int total, const char *what) {
    double chi2 = 0, pooled_e = 0, pooled_o = 0;
    int df = -1;
    for (int i = 0; i < n_vocab; i++) {
        double e = p[i] * total;
        if (e < 5) {
            pooled_e += e, pooled_o += count[i];
            continue;
        }
        chi2 += (count[i] - e) * (count[i] - e) / e, df++;
    }
    if (pooled_e >= 5) chi2 += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e, df++;
    const double limit = df + 6 * sqrt(2.0 * df);
    printf("# %s: chi-square %.1f, %d degrees of freedom (limit %.1f)\n", what, chi2, df, limit);
    assert_true(df >= 3 && chi2 < limit);
}

static void test_rule_statistics(void **state) {
    (void)state;
    kt_model *m = load("models/stories260K.gguf");
    const int runs = TU_SANITIZED ? 1500 : 4000; /* the sanitized build: fewer seeds, the same test */
    const int n_vocab = kt_model_describe(m)->n_vocab;
    int32_t ctx[64], out[9];
    kt_error err = {0};
    int n = kt_tokenize(m, "Once upon a time, there was a", 29, ctx, 60, true, &err);
    assert_true(n > 0);
    double *p1 = calloc((size_t)n_vocab, sizeof *p1), *p2 = calloc((size_t)n_vocab, sizeof *p2);
    int *c1 = calloc((size_t)n_vocab, sizeof *c1), *c2 = calloc((size_t)n_vocab, sizeof *c2);
    target_dist(m, ctx, n, p1);
    /* the proposals: the likeliest first token (kept often), then the likeliest after it */
    fixed_prop f;
    f.y[0] = 0;
    for (int i = 1; i < n_vocab; i++) f.y[0] = p1[i] > p1[f.y[0]] ? i : f.y[0];
    ctx[n] = f.y[0];
    target_dist(m, ctx, n + 1, p2);
    f.y[1] = 0;
    for (int i = 1; i < n_vocab; i++) f.y[1] = p2[i] > p2[f.y[1]] ? i : f.y[1];
    /* the session holds ctx[0..n-1); ctx[n-1] is the pending token */
    kt_session *s = kt_session_new(m, &(kt_session_params){.n_ctx = 256, .n_threads = 2}, &err);
    float *logits = malloc(sizeof(float) * (size_t)n_vocab);
    assert_int_equal(kt_session_eval(s, ctx, n - 1, logits, false, &err), KT_OK);
    kt_spec *sp = kt_spec_new(m, &(kt_spec_params){.k_max = 2, .fixed_k = true, .propose = propose_fixed,
                                                   .propose_ctx = &f}, &err);
    assert_non_null(sp);
    int kept = 0, n_second = 0;
    for (int r = 0; r < runs; r++) {
        kt_sampler_params spp = {.temperature = 1.0f, .top_p = 1.0f, .repeat_penalty = 1.0f, .seed = 1000 + (uint64_t)r};
        kt_sampler *smp = kt_sampler_new(&spp, n_vocab, &err);
        assert_non_null(smp);
        int got = kt_spec_step(sp, s, smp, ctx, n, out, &err);
        assert_true(got >= 1 && got <= 3);
        c1[out[0]]++;
        if (out[0] == f.y[0]) kept++, n_second++, c2[out[1]]++;
        kt_session_truncate(s, n - 1);
        kt_sampler_free(smp);
    }
    /* kept at rate p(y): a binomial, within 5 standard deviations */
    const double sd = sqrt(runs * p1[f.y[0]] * (1 - p1[f.y[0]]));
    printf("# first proposal kept %d of %d (p(y) %.3f: %.0f expected)\n", kept, runs, p1[f.y[0]], runs * p1[f.y[0]]);
    assert_true(fabs(kept - runs * p1[f.y[0]]) < 5 * sd);
    expect_distribution(c1, p1, n_vocab, runs, "first token");
    expect_distribution(c2, p2, n_vocab, n_second, "second token after a kept proposal");
    kt_spec_free(sp), kt_session_free(s), free(logits);
    free(p1), free(p2), free(c1), free(c2);
    kt_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ngram),
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_policy),
        cmocka_unit_test(test_policy_inherit),
        cmocka_unit_test(test_policy_fixed_cost),
        cmocka_unit_test(test_policy_one_probe_a_step),
        cmocka_unit_test(test_policy_token_floor),
        cmocka_unit_test(test_rule_statistics),
        cmocka_unit_test(test_exact_greedy_and_sampled),
        cmocka_unit_test(test_exact_q4_0_and_full_context),
        cmocka_unit_test(test_exact_with_draft),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
