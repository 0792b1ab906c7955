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
 * Never slower: k is chosen each step by spec/policy.h, against the
 * measured cost of a pass of k + 1 tokens, down to 0 (plain decoding); a
 * step with no proposal costs nothing extra.
 */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/timing.h"
#include "kettle.h"
#include "spec/ngram.h"
#include "spec/policy.h"

struct kt_spec {
    kt_spec_params p;
    int n_vocab;
    float *rows;                     /* (k_max + 1) x n_vocab logits */
    int32_t *batch;                  /* pending + proposals */
    double cost_ms[SPEC_K_MAX + 2];  /* measured pass time by tokens in it */
    spec_costs costs;                /* over cost_ms */
    spec_accept accept;
    kt_spec_stats stats;
};

kt_spec *kt_spec_new(const kt_model *m, const kt_spec_params *p, kt_error *err) {
    kt_spec *sp = calloc(1, sizeof *sp);
    if (!sp) return kt_error_set(err, KT_ERR_NOMEM, "out of memory"), NULL;
    sp->p = p ? *p : (kt_spec_params){0};
    if (sp->p.k_max <= 0) sp->p.k_max = 8;
    if (sp->p.k_max > SPEC_K_MAX) sp->p.k_max = SPEC_K_MAX;
    if (sp->p.min_match <= 0) sp->p.min_match = 2;
    if (sp->p.max_match < sp->p.min_match) sp->p.max_match = sp->p.min_match > 4 ? sp->p.min_match : 4;
    sp->n_vocab = kt_model_describe(m)->n_vocab;
    sp->costs = (spec_costs){sp->cost_ms, SPEC_K_MAX + 1};
    spec_accept_init(&sp->accept);
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

/* Up to k proposals for what follows ctx[0..n). */
static int propose(const kt_spec *sp, const int32_t *ctx, int n, int k, int32_t *out) {
    if (k <= 0) return 0;
    int got = sp->p.propose ? sp->p.propose(sp->p.propose_ctx, ctx, n, k, out)
                            : spec_ngram_propose(ctx, n, sp->p.min_match, sp->p.max_match, k, out);
    return got < 0 ? 0 : got > k ? k : got;
}

int kt_spec_step(kt_spec *sp, kt_session *s, kt_sampler *smp, const int32_t *ctx, int n, int32_t *out,
                 kt_error *err) {
    if (n < 1 || kt_session_n_past(s) != n - 1)
        return kt_error_set(err, KT_ERR_ARG, "the session holds %d tokens; the step needs the %d before the pending one",
                            kt_session_n_past(s), n - 1), -1;
    const int room = kt_session_n_ctx(s) - n; /* proposals that fit after the pending token */
    int k = propose(sp, ctx, n, room < sp->p.k_max ? room : sp->p.k_max, sp->batch + 1);
    k = spec_choose_k(&sp->accept, &sp->costs, k, 1, 1.0, sp->p.fixed_k);
    sp->batch[0] = ctx[n - 1];
    const double t0 = kt_time_ms();
    if (kt_session_eval(s, sp->batch, k + 1, sp->rows, true, err) != KT_OK) return -1;
    spec_cost_note(&sp->costs, k + 1, kt_time_ms() - t0);
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
    spec_accept_note(&sp->accept, k, a);
    return a + 1;
}
