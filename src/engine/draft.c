/*
 * draft.c - the draft model's proposals (see draft.h).
 *
 * A step's passes: pass 0 reads, for every job, the tokens its draft
 * sequence lacks (up to the pending token) and takes the logits of the
 * last: the first guess is its argmax. Passes 1 .. k-1 feed each job's
 * latest guess and take the next. Guesses are greedy on the draft's raw
 * logits: the target's sampler decides what is kept, so a guess needs to
 * be likely, not drawn.
 */
#include "engine/draft.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/timing.h"
#include "engine/model_internal.h"
#include "spec/vocab_match.h"

#define DRAFT_BLOCK_TOKENS 16

struct eng_draft {
    const kt_model *model;
    kv_pool *kv;
    llm_work *work;
    int n_vocab, cap; /* batch capacity, tokens */
    int32_t *tokens;
    int *pos;
    kv_seq **seqs;
    bool *want;
    float *logits;    /* one row per job */
    int *job_of_row;
    double pass_ms;   /* EMA of a drafting pass (after pass 0) */
};

eng_draft *eng_draft_new(const kt_model *target, const kt_model *draft, int n_parallel, int n_ctx, int k_max,
                         kt_error *err) {
    if (spec_same_vocab(target, draft, err) != KT_OK) return NULL;
    eng_draft *d = calloc(1, sizeof *d);
    if (!d) return kt_error_set(err, KT_ERR_NOMEM, "out of memory"), NULL;
    d->model = draft;
    d->n_vocab = kt_model_describe(draft)->n_vocab;
    kv_type type;
    if (llm_kv_type(draft->llm, KT_KV_F16, KV_F16, &type, err) != KT_OK) return eng_draft_free(d), NULL;
    /* n_parallel contexts, and k_max positions past each for the last guesses */
    const int per_seq = (n_ctx + k_max + DRAFT_BLOCK_TOKENS - 1) / DRAFT_BLOCK_TOKENS + 1;
    kv_pool_params kp = llm_kv_params(draft->llm, n_parallel * per_seq, DRAFT_BLOCK_TOKENS, type);
    if (kp.state_bytes) {
        kt_error_set(err, KT_ERR_ARG, "a hybrid draft model (%s: recurrent layers) is not supported yet (its state "
                     "could not roll back past a step)", draft->llm->cfg.arch);
        return eng_draft_free(d), NULL;
    }
    if (kv_params_n_windowed(&kp) > 0) {
        kt_error_set(err, KT_ERR_ARG, "a draft model with sliding-window layers is not supported (its window "
                     "could not roll back past a step)");
        return eng_draft_free(d), NULL;
    }
    d->cap = n_parallel * (n_ctx + 1);
    d->tokens = malloc(sizeof *d->tokens * (size_t)d->cap);
    d->pos = malloc(sizeof *d->pos * (size_t)d->cap);
    d->seqs = malloc(sizeof *d->seqs * (size_t)d->cap);
    d->want = malloc(sizeof *d->want * (size_t)d->cap);
    d->logits = malloc(sizeof *d->logits * (size_t)d->n_vocab * (size_t)n_parallel);
    d->job_of_row = malloc(sizeof *d->job_of_row * (size_t)n_parallel);
    if (!d->tokens || !d->pos || !d->seqs || !d->want || !d->logits || !d->job_of_row) {
        kt_error_set(err, KT_ERR_NOMEM, "out of memory for the draft model's batch");
        return eng_draft_free(d), NULL;
    }
    if (!(d->kv = kv_pool_new(&kp, err)) || !(d->work = llm_work_new(draft->llm, n_ctx + k_max, err)))
        return kt_error_wrap(err, "the draft model's KV cache"), eng_draft_free(d), NULL;
    return d;
}

void eng_draft_free(eng_draft *d) {
    if (!d) return;
    kv_pool_free(d->kv);
    llm_work_free(d->work);
    free(d->tokens), free(d->pos), free(d->seqs), free(d->want), free(d->logits), free(d->job_of_row);
    free(d);
}

double eng_draft_pass_ms(const eng_draft *d) {
    return d->pass_ms;
}

void eng_draft_keep(kv_seq *seq, int n_valid) {
    if (seq && kv_seq_truncate(seq, n_valid, NULL) != KT_OK) kv_seq_truncate(seq, 0, NULL); /* read again */
}

static int32_t argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++) best = x[i] > x[best] ? i : best;
    return best;
}

/* Appends seq's tokens ctx[from, to) to the batch, the last wanting logits. */
static kt_status add_run(eng_draft *d, int *n, kv_seq *seq, const int32_t *ctx, int from, int to, kt_error *err) {
    if (kv_seq_append(seq, to - from, err) != KT_OK) return err->status;
    for (int p = from; p < to; p++, (*n)++)
        d->tokens[*n] = ctx[p], d->pos[*n] = p, d->seqs[*n] = seq, d->want[*n] = p == to - 1;
    return KT_OK;
}

/* One pass over the batch; row r of d->logits is job job_of_row[r]'s. */
static void run_pass(eng_draft *d, kt_pool *pool, int n) {
    llm_batch b = {.n_tokens = n, .tokens = d->tokens, .pos = d->pos, .seq = d->seqs, .logits = d->want};
    llm_forward(d->model->llm, d->work, pool, &b, d->logits);
}

kt_status eng_draft_propose(eng_draft *d, kt_pool *pool, eng_draft_job *jobs, int n_jobs, int read_budget,
                            kt_error *err) {
    int n = 0, rows = 0, k_most = 0;
    for (int j = 0; j < n_jobs; j++) { /* pass 0: read up to the pending token */
        eng_draft_job *job = &jobs[j];
        job->got = 0;
        if (!*job->seq && !(*job->seq = kv_seq_new(d->kv, err))) return err->status;
        kv_seq *seq = *job->seq;
        if (seq->len > job->n - 1) kv_seq_truncate(seq, job->n - 1, NULL); /* never ahead of the tokens */
        const int backlog = job->n - seq->len;
        if (backlog > read_budget) { /* read part of it now, guess from a later step */
            if (read_budget > 0 && add_run(d, &n, seq, job->ctx, seq->len, seq->len + read_budget, err) != KT_OK)
                return err->status;
            d->want[n - 1] = false, read_budget = 0;
            continue;
        }
        if (add_run(d, &n, seq, job->ctx, seq->len, job->n, err) != KT_OK) return err->status;
        read_budget -= backlog;
        d->job_of_row[rows++] = j;
        if (job->k > k_most) k_most = job->k;
    }
    if (n == 0) return KT_OK;
    run_pass(d, pool, n);
    for (int r = 0; r < rows; r++) {
        eng_draft_job *job = &jobs[d->job_of_row[r]];
        job->out[job->got++] = argmax(d->logits + (size_t)r * (size_t)d->n_vocab, d->n_vocab);
    }
    for (int step = 1; step < k_most; step++) { /* passes 1..: feed each job's latest guess */
        n = rows = 0;
        for (int j = 0; j < n_jobs; j++) {
            eng_draft_job *job = &jobs[j];
            if (job->got == 0 || job->got >= job->k) continue;
            kv_seq *seq = *job->seq;
            if (kv_seq_append(seq, 1, err) != KT_OK) return err->status;
            d->tokens[n] = job->out[job->got - 1], d->pos[n] = seq->len - 1, d->seqs[n] = seq, d->want[n] = true;
            n++, d->job_of_row[rows++] = j;
        }
        if (n == 0) break;
        const double t0 = kt_time_ms();
        run_pass(d, pool, n);
        const double ms = kt_time_ms() - t0;
        d->pass_ms = d->pass_ms > 0 ? 0.75 * d->pass_ms + 0.25 * ms : ms;
        for (int r = 0; r < rows; r++) {
            eng_draft_job *job = &jobs[d->job_of_row[r]];
            job->out[job->got++] = argmax(d->logits + (size_t)r * (size_t)d->n_vocab, d->n_vocab);
        }
    }
    return KT_OK;
}
