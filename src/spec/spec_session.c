/*
 * spec_session.c - speculative decoding for a kt_session with prompt
 * lookup proposals (see kettle.h, "speculative decoding").
 *
 * Exactness: a step evaluates [pending, p1..pk] in one pass. Row i holds
 * the logits for the position after token i, with the same bits a
 * one-token pass would give (every matmul row and attention unit depends
 * on its own token alone: the engine's batch invariance), and the sampler
 * draws from the rows in order, exactly the draws plain decoding makes. A
 * proposal is kept while the draw equals it; the first draw that differs
 * is the next pending token. So the emitted tokens are plain decoding's,
 * at any temperature and with any penalties, and the random state moves
 * the same way.
 *
 * Never slower: verifying k tokens costs more than one (on a CPU the
 * cost jumps where a GEMM tile fills), so k is chosen each step to
 * maximise expected tokens per millisecond: E(k) = (1 - a^(k+1)) / (1 - a)
 * tokens for a per-token acceptance a (an average of recent steps),
 * against the measured cost of a pass of k + 1 tokens. k = 0 is plain
 * decoding; a step with no proposal costs nothing extra. While k stays 0
 * a short proposal is still tried every EXPLORE_EVERY steps, so a context
 * that starts to repeat itself is noticed.
 */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/timing.h"
#include "kettle.h"
#include "spec/ngram.h"

#define K_MAX_LIMIT 32
#define EXPLORE_EVERY 16
#define EMA 0.2

struct kt_spec {
    kt_spec_params p;
    int n_vocab;
    float *rows;                   /* (k_max + 1) x n_vocab logits */
    int32_t *batch;                /* pending + proposals */
    double cost_ms[K_MAX_LIMIT + 2]; /* measured pass time by tokens in it (EMA; 0: not yet) */
    double accept;                 /* per-token acceptance (EMA) */
    int idle_steps;                /* steps since the last proposal verified */
    kt_spec_stats stats;
};

kt_spec *kt_spec_new(const kt_model *m, const kt_spec_params *p, kt_error *err) {
    kt_spec *sp = calloc(1, sizeof *sp);
    if (!sp) return kt_error_set(err, KT_ERR_NOMEM, "out of memory"), NULL;
    sp->p = p ? *p : (kt_spec_params){0};
    if (sp->p.k_max <= 0) sp->p.k_max = 8;
    if (sp->p.k_max > K_MAX_LIMIT) sp->p.k_max = K_MAX_LIMIT;
    if (sp->p.min_match <= 0) sp->p.min_match = 2;
    if (sp->p.max_match < sp->p.min_match) sp->p.max_match = sp->p.min_match > 4 ? sp->p.min_match : 4;
    sp->n_vocab = kt_model_describe(m)->n_vocab;
    sp->accept = 0.5;
    const int rows = sp->p.k_max + 1;
    sp->rows = malloc(sizeof *sp->rows * (size_t)sp->n_vocab * (size_t)rows);
    sp->batch = malloc(sizeof *sp->batch * (size_t)rows);
    if (!sp->rows || !sp->batch) {
        kt_spec_free(sp);
        return kt_error_set(err, KT_ERR_NOMEM, "out of memory for %d rows of logits", rows), NULL;
    }
    return sp;
}

void kt_spec_free(kt_spec *sp) {
    if (!sp) return;
    free(sp->rows);
    free(sp->batch);
    free(sp);
}

kt_spec_stats kt_spec_get_stats(const kt_spec *sp) {
    return sp->stats;
}

/* A pass of n tokens: measured, else guessed from a one-token pass. */
static double pass_cost(const kt_spec *sp, int n) {
    if (sp->cost_ms[n] > 0) return sp->cost_ms[n];
    return sp->cost_ms[1] > 0 ? sp->cost_ms[1] * (1.0 + 0.1 * (n - 1)) : 0;
}

/* How many of the `avail` proposals to verify this step. */
static int choose_k(kt_spec *sp, int avail) {
    if (!avail || sp->p.fixed_k) return avail;
    if (pass_cost(sp, 1) <= 0) return avail; /* nothing measured yet: try */
    int best = 0;
    double best_rate = 1.0 / pass_cost(sp, 1), a = sp->accept, expected = 1.0, term = 1.0;
    for (int k = 1; k <= avail; k++) {
        term *= a, expected += term; /* 1 + a + ... + a^k */
        double cost = pass_cost(sp, k + 1);
        if (cost <= 0) return k; /* unmeasured size: try it */
        if (expected / cost > best_rate) best = k, best_rate = expected / cost;
    }
    /* backed off: still look now and then, with a short proposal */
    if (!best && ++sp->idle_steps >= EXPLORE_EVERY) return sp->idle_steps = 0, avail < 2 ? avail : 2;
    return best;
}

static void note_cost(kt_spec *sp, int n, double ms) {
    sp->cost_ms[n] = sp->cost_ms[n] > 0 ? (1 - EMA) * sp->cost_ms[n] + EMA * ms : ms;
}

int kt_spec_step(kt_spec *sp, kt_session *s, kt_sampler *smp, const int32_t *ctx, int n, int32_t *out,
                 kt_error *err) {
    if (n < 1 || kt_session_n_past(s) != n - 1)
        return kt_error_set(err, KT_ERR_ARG, "the session holds %d tokens; the step needs the %d before the pending one",
                            kt_session_n_past(s), n - 1), -1;
    const int room = kt_session_n_ctx(s) - n; /* proposals that fit after the pending token */
    int k = spec_ngram_propose(ctx, n, sp->p.min_match, sp->p.max_match, room < sp->p.k_max ? room : sp->p.k_max,
                               sp->batch + 1);
    k = choose_k(sp, k > 0 ? k : 0);
    sp->batch[0] = ctx[n - 1];
    const double t0 = kt_time_ms();
    if (kt_session_eval(s, sp->batch, k + 1, sp->rows, true, err) != KT_OK) return -1;
    note_cost(sp, k + 1, kt_time_ms() - t0);
    int a = 0;
    for (;; a++) { /* draw from row a; keep the proposal it equals */
        int32_t x = kt_sampler_sample(smp, sp->rows + (size_t)a * (size_t)sp->n_vocab);
        kt_sampler_accept(smp, x);
        out[a] = x;
        if (a == k || x != sp->batch[a + 1]) break;
    }
    kt_session_truncate(s, n + a); /* the pending token and the accepted proposals */
    sp->stats.steps++;
    sp->stats.proposed += (uint64_t)k, sp->stats.accepted += (uint64_t)a;
    if (k) sp->accept = (1 - EMA) * sp->accept + EMA * ((double)a / k), sp->idle_steps = 0;
    return a + 1;
}
