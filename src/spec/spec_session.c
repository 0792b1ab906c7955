/*
 * spec_session.c - speculative decoding for a kt_session with prompt
 * lookup proposals or a draft model's (see kettle.h, "speculative
 * decoding").
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
 * step with no proposal costs nothing extra. A draft's guesses cost a
 * draft pass each, weighed per proposal (spec_choose_k_paid) before it
 * guesses.
 *
 * The draft's session holds d.tok[0..n_past): the sequence as far as the
 * draft has read it, then its guesses. Each step cuts it back to where it
 * still agrees with the sequence (kept guesses stay: their KV is the
 * sequence's), reads the rest, and guesses one token per pass.
 *
 * MTP (p.mtp): the target's own MTP block guesses, chained on its own
 * hidden state (kt_session_mtp_draft); its KV lives in the session's pool
 * beside the target's, run by every pass of the session, so it is cut back
 * with it. Each guess costs an MTP pass, weighed like a draft's. Prompt
 * lookup is tried first: its run is verified instead where its own measured
 * acceptance expects as many tokens from it as the MTP's from a full k.
 *
 * Hybrid models (recurrent layers): the verify pass goes through
 * kt_session_spec_eval / _keep, which roll the recurrent state back to
 * the kept tokens exactly (engine/rewind.c's copy and replay).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/timing.h"
#include "engine/model_internal.h"
#include "kettle.h"
#include "spec/ngram.h"
#include "spec/policy.h"
#include "spec/vocab_match.h"

typedef struct spec_draft {
    kt_session *s;   /* made at the first step, as long as the target's context */
    int32_t *tok;    /* what s holds */
    float *logits;   /* one row */
    double pass_ms;  /* a one-token draft pass, smoothed */
} spec_draft;

struct kt_spec {
    kt_spec_params p;
    int n_vocab;
    float *rows;                     /* (k_max + 1) x n_vocab logits */
    int32_t *batch;                  /* pending + proposals */
    double cost_ms[SPEC_K_MAX + 2];  /* measured pass time by tokens in it */
    spec_costs costs;                /* over cost_ms */
    spec_accept accept;
    kt_spec_stats stats;
    spec_draft d;    /* with p.draft */
    double mtp_ms;   /* with p.mtp: one MTP guess, smoothed */
    double reject_ms; /* cutting a pass back after a rejection (a hybrid model's rollback replays), smoothed */
    spec_accept accept_lookup; /* with p.mtp: prompt lookup's acceptance beside the MTP block's (accept) */
    bool lookup;               /* this step's proposals are the lookup's */
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
    if (sp->p.mtp && !m->llm->cfg.n_mtp) {
        kt_spec_free(sp);
        return kt_error_set(err, KT_ERR_UNSUPPORTED, "--spec mtp: the model (%s) has no multi-token-prediction block",
                            m->llm->cfg.arch), NULL;
    }
    sp->costs = (spec_costs){sp->cost_ms, SPEC_K_MAX + 1, 0.0};
    spec_accept_init(&sp->accept);
    spec_accept_init(&sp->accept_lookup);
    const int rows = sp->p.k_max + 1;
    sp->rows = malloc(sizeof *sp->rows * (size_t)sp->n_vocab * (size_t)rows);
    sp->batch = malloc(sizeof *sp->batch * (size_t)rows);
    if (sp->p.draft && spec_same_vocab(m, sp->p.draft, err) != KT_OK) return kt_spec_free(sp), NULL;
    if (sp->p.draft) sp->d.logits = malloc(sizeof *sp->d.logits * (size_t)sp->n_vocab);
    if (!sp->rows || !sp->batch || (sp->p.draft && !sp->d.logits)) {
        kt_spec_free(sp);
        return kt_error_set(err, KT_ERR_NOMEM, "out of memory for %d rows of logits", rows), NULL;
    }
    return sp;
}

void kt_spec_free(kt_spec *sp) {
    if (!sp) return;
    free(sp->rows);
    free(sp->batch);
    kt_session_free(sp->d.s);
    free(sp->d.tok), free(sp->d.logits);
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

static int32_t argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* The draft's session, as long as the target's context. */
static kt_status draft_open(spec_draft *d, const kt_spec_params *p, int n_ctx, kt_error *err) {
    if (d->s) return KT_OK;
    kt_session_params sp = {.n_ctx = n_ctx, .n_threads = p->draft_threads};
    d->tok = malloc(sizeof *d->tok * (size_t)n_ctx);
    if (!d->tok) return kt_error_set(err, KT_ERR_NOMEM, "out of memory for the draft's %d tokens", n_ctx);
    if (!(d->s = kt_session_new(p->draft, &sp, err))) return kt_error_wrap(err, "the draft model"), err->status;
    return KT_OK;
}

static kt_status draft_eval(spec_draft *d, const int32_t *tokens, int n, kt_error *err) {
    const int at = kt_session_n_past(d->s);
    if (kt_session_eval(d->s, tokens, n, d->logits, false, err) != KT_OK) return err->status;
    memcpy(d->tok + at, tokens, sizeof *tokens * (size_t)n);
    return KT_OK;
}

/* k greedy guesses of the draft for what follows ctx[0..n); how many
 * (k), or -1 with err. */
static int draft_guess(spec_draft *d, int n_vocab, const int32_t *ctx, int n, int k, int32_t *out, kt_error *err) {
    int same = 0; /* what the draft holds that is still the sequence (at most all but the pending token) */
    const int held = kt_session_n_past(d->s);
    while (same < held && same < n - 1 && d->tok[same] == ctx[same]) same++;
    kt_session_truncate(d->s, same);
    if (draft_eval(d, ctx + same, n - same, err) != KT_OK) return -1;
    for (int i = 0; i < k; i++) {
        out[i] = argmax(d->logits, n_vocab);
        if (i + 1 == k) break;
        const double t0 = kt_time_ms();
        if (draft_eval(d, &out[i], 1, err) != KT_OK) return -1;
        const double ms = kt_time_ms() - t0;
        d->pass_ms = d->pass_ms > 0 ? 0.8 * d->pass_ms + 0.2 * ms : ms;
    }
    return k;
}

int kt_spec_step(kt_spec *sp, kt_session *s, kt_sampler *smp, const int32_t *ctx, int n, int32_t *out,
                 kt_error *err) {
    if (n < 1 || kt_session_n_past(s) != n - 1)
        return kt_error_set(err, KT_ERR_ARG, "the session holds %d tokens; the step needs the %d before the pending one",
                            kt_session_n_past(s), n - 1), -1;
    const int room = kt_session_n_ctx(s) - n; /* proposals that fit after the pending token */
    const int limit = room < sp->p.k_max ? room : sp->p.k_max;
    int k;
    sp->lookup = false;
    int n_look = 0;
    if (sp->p.mtp && !sp->p.propose) /* prompt lookup too: its run where it expects as many tokens as the MTP's k */
        n_look = propose(sp, ctx, n, limit, sp->batch + 1);
    if (n_look > 0 && spec_accept_expected(&sp->accept_lookup, n_look) >= spec_accept_expected(&sp->accept, limit)) {
        sp->lookup = true;
        k = spec_choose_k_paid(&sp->accept_lookup, &sp->costs, n_look, 1, 1.0, sp->p.fixed_k, 0.0, sp->reject_ms, NULL);
    } else if (sp->p.mtp && !sp->p.propose) { /* the MTP block guesses after the choice of k: each costs a pass */
        k = spec_choose_k_paid(&sp->accept, &sp->costs, limit, 1, 1.0, sp->p.fixed_k, sp->mtp_ms, sp->reject_ms, NULL);
        const double t0 = kt_time_ms();
        if (k > 0 && (k = kt_session_mtp_draft(s, ctx[n - 1], k, sp->batch + 1, err)) < 0) return -1;
        if (k > 0) {
            const double ms = (kt_time_ms() - t0) / k;
            sp->mtp_ms = sp->mtp_ms > 0 ? 0.8 * sp->mtp_ms + 0.2 * ms : ms;
        }
    } else if (sp->p.draft && !sp->p.propose) { /* a draft guesses after the choice of k: each guess costs a pass */
        if (draft_open(&sp->d, &sp->p, kt_session_n_ctx(s), err) != KT_OK) return -1;
        k = spec_choose_k_paid(&sp->accept, &sp->costs, limit, 1, 1.0, sp->p.fixed_k, sp->d.pass_ms, sp->reject_ms, NULL);
        if (k > 0 && draft_guess(&sp->d, sp->n_vocab, ctx, n, k, sp->batch + 1, err) < 0) return -1;
    } else {
        k = propose(sp, ctx, n, limit, sp->batch + 1);
        k = spec_choose_k_paid(&sp->accept, &sp->costs, k, 1, 1.0, sp->p.fixed_k, 0.0, sp->reject_ms, NULL);
    }
    sp->batch[0] = ctx[n - 1];
    const double t0 = kt_time_ms();
    if (kt_session_spec_eval(s, sp->batch, k + 1, sp->rows, err) != KT_OK) return -1;
    spec_cost_note(&sp->costs, k + 1, kt_time_ms() - t0);
    int a = 0;
    for (;; a++) { /* draw from row a; keep the proposal it equals */
        int32_t x = kt_sampler_sample(smp, sp->rows + (size_t)a * (size_t)sp->n_vocab);
        kt_sampler_accept(smp, x);
        out[a] = x;
        if (a == k || x != sp->batch[a + 1]) break;
    }
    /* the pending token and the accepted proposals (a hybrid model's state rolled back to them) */
    const double t_keep = kt_time_ms();
    if (kt_session_spec_keep(s, a + 1, err) != KT_OK) return -1;
    if (a < k) sp->reject_ms = 0.75 * sp->reject_ms + 0.25 * (kt_time_ms() - t_keep);
    sp->stats.steps++;
    sp->stats.proposed += (uint64_t)k, sp->stats.accepted += (uint64_t)a;
    if (sp->lookup) sp->stats.lookup_proposed += (uint64_t)k, sp->stats.lookup_accepted += (uint64_t)a;
    spec_accept_note(sp->lookup ? &sp->accept_lookup : &sp->accept, k, a);
    return a + 1;
}
