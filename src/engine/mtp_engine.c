/*
 * mtp_engine.c - the MTP block's proposals in the engine (see
 * mtp_engine.h for what and why).
 */
#include "engine/mtp_engine.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/timing.h"
#include "model/mtp.h"

kt_status eng_mtp_init(eng_mtp *mt, const llm_model *llm, int n_slots, int cap, kt_error *err) {
    memset(mt, 0, sizeof *mt);
    const size_t E = (size_t)llm->cfg.n_embd;
    mt->h = calloc((size_t)n_slots * E, sizeof(float));
    mt->h_pos = malloc(sizeof *mt->h_pos * (size_t)n_slots);
    mt->hid = malloc(sizeof(float) * E * (size_t)cap);
    mt->want = malloc(sizeof *mt->want * (size_t)cap);
    mt->row = malloc(sizeof *mt->row * (size_t)cap);
    mt->sub_tok = malloc(sizeof *mt->sub_tok * (size_t)cap);
    mt->sub_pos = malloc(sizeof *mt->sub_pos * (size_t)cap);
    mt->sub_seq = malloc(sizeof *mt->sub_seq * (size_t)cap);
    /* the guesses' pass: EMTP_GROUP rows in and out, their logits and each job's hidden row */
    const size_t in_rows = (size_t)cap > 2 * EMTP_GROUP ? (size_t)cap : 2 * EMTP_GROUP;
    mt->in = malloc(sizeof(float) * E * in_rows);
    mt->group = n_slots < EMTP_GROUP ? n_slots : EMTP_GROUP; /* a sequence a slot: no more jobs at once */
    mt->logits = malloc(sizeof(float) * (size_t)llm->cfg.n_vocab * (size_t)mt->group);
    mt->guess_h = malloc(sizeof(float) * E * (size_t)mt->group);
    if (!mt->h || !mt->h_pos || !mt->hid || !mt->in || !mt->want || !mt->row || !mt->sub_tok || !mt->sub_pos ||
        !mt->sub_seq || !mt->logits || !mt->guess_h) {
        eng_mtp_free(mt);
        return kt_error_set(err, KT_ERR_NOMEM, "out of memory for the MTP block's rows");
    }
    for (int i = 0; i < n_slots; i++) mt->h_pos[i] = -1;
    mt->llm = llm, mt->n_slots = n_slots, mt->cap = cap;
    return KT_OK;
}

void eng_mtp_free(eng_mtp *mt) {
    free(mt->h), free(mt->h_pos), free(mt->hid), free(mt->in), free(mt->want), free(mt->row), free(mt->logits),
        free(mt->guess_h);
    free(mt->sub_tok), free(mt->sub_pos), free(mt->sub_seq);
    memset(mt, 0, sizeof *mt);
}

void eng_mtp_forget(eng_mtp *mt, int slot) {
    if (mt->llm && slot >= 0 && slot < mt->n_slots) mt->h_pos[slot] = -1;
}

void eng_mtp_fork(eng_mtp *mt, int from, int to) {
    if (!mt->llm || from < 0 || to < 0 || from >= mt->n_slots || to >= mt->n_slots) return;
    const size_t E = (size_t)mt->llm->cfg.n_embd;
    memcpy(mt->h + (size_t)to * E, mt->h + (size_t)from * E, sizeof(float) * E);
    mt->h_pos[to] = mt->h_pos[from];
}

/* The hidden state before position pos of the sequence in slot, or zeros
 * (false). */
static bool h_before(const eng_mtp *mt, int slot, int pos, float *out) {
    const size_t E = (size_t)mt->llm->cfg.n_embd;
    if (slot >= 0 && slot < mt->n_slots && pos > 0 && mt->h_pos[slot] == pos - 1) {
        memcpy(out, mt->h + (size_t)slot * E, sizeof(float) * E);
        return true;
    }
    memset(out, 0, sizeof(float) * E);
    return false;
}

void eng_mtp_used(eng_mtp *mt, bool guessed, bool decoding) {
    if (guessed) mt->idle_steps = 0;
    else if (decoding && mt->idle_steps < EMTP_IDLE_STEPS) mt->idle_steps++;
}

void eng_mtp_rows(eng_mtp *mt, int n) {
    int rows = 0;
    for (int t = 0; t < n; t++) mt->row[t] = mt->want[t] ? rows++ : -1;
}

kt_status eng_mtp_pass(eng_mtp *mt, llm_work *w, kt_pool *pool, const llm_batch *b, kt_error *err) {
    const size_t E = (size_t)mt->llm->cfg.n_embd;
    int n = 0; /* the wanted tokens: a sub-batch, in batch order */
    for (int t = 0; t < b->n_tokens; t++) {
        if (mt->row[t] < 0) continue;
        float *in = mt->in + (size_t)n * E;
        /* a sequence's tokens are contiguous, in position order: the one before, if its row came out */
        if (t > 0 && b->seq[t] == b->seq[t - 1] && mt->row[t - 1] >= 0)
            memcpy(in, mt->hid + (size_t)mt->row[t - 1] * E, sizeof(float) * E);
        else
            mt->rows_blind += !h_before(mt, b->seq[t]->state_slot, b->pos[t], in);
        mt->sub_tok[n] = b->tokens[t], mt->sub_pos[n] = b->pos[t], mt->sub_seq[n] = b->seq[t];
        n++;
    }
    mt->rows += (uint64_t)n;
    mt->rows_skipped += (uint64_t)(b->n_tokens - n);
    if (!n) return KT_OK;
    llm_batch mb = {.n_tokens = n, .tokens = mt->sub_tok, .pos = mt->sub_pos, .seq = mt->sub_seq};
    return llm_mtp_kv(mt->llm, w, pool, &mb, mt->in, err);
}

void eng_mtp_note(eng_mtp *mt, const llm_batch *b) {
    const size_t E = (size_t)mt->llm->cfg.n_embd;
    for (int t = 0; t < b->n_tokens; t++) {
        const kv_seq *s = b->seq[t];
        const int slot = s->state_slot;
        if (mt->row[t] < 0 || slot < 0 || slot >= mt->n_slots) continue;
        if (s->len != b->pos[t] + 1) continue; /* not its last kept position */
        memcpy(mt->h + (size_t)slot * E, mt->hid + (size_t)mt->row[t] * E, sizeof(float) * E);
        mt->h_pos[slot] = b->pos[t];
    }
}

/* Depth i of the jobs with k > i, one row each, through the block at once:
 * every row reads the weights of the same pass. hs: each job's hidden row
 * in (its last guess's, or the target's), replaced by the block's own. */
static kt_status guess_depth(eng_mtp *mt, llm_work *w, kt_pool *pool, eng_mtp_job *jobs, int n, int i, float *hs,
                             kt_error *err) {
    const llm_model *m = mt->llm;
    const size_t E = (size_t)m->cfg.n_embd, V = (size_t)m->cfg.n_vocab;
    int32_t tok[EMTP_GROUP];
    int pos[EMTP_GROUP], row_job[EMTP_GROUP], n_rows = 0;
    kv_seq *seqs[EMTP_GROUP];
    for (int j = 0; j < n; j++) {
        if (jobs[j].got <= i) continue;
        tok[n_rows] = i ? jobs[j].out[i - 1] : jobs[j].pending;
        pos[n_rows] = jobs[j].seq->len - jobs[j].got + i; /* the sequence holds its k guess rows */
        seqs[n_rows] = jobs[j].seq;
        memcpy(mt->in + (size_t)n_rows * E, hs + (size_t)j * E, sizeof(float) * E);
        row_job[n_rows++] = j;
    }
    if (!n_rows) return KT_OK;
    llm_batch b = {.n_tokens = n_rows, .tokens = tok, .pos = pos, .seq = seqs};
    float *h_out = mt->in + (size_t)EMTP_GROUP * E;
    if (llm_mtp_forward(m, w, pool, &b, mt->in, mt->logits, h_out, err) != KT_OK) return err->status;
    for (int r = 0; r < n_rows; r++) {
        const float *l = mt->logits + (size_t)r * V;
        int32_t best = 0;
        for (int32_t v = 1; v < (int32_t)V; v++)
            if (l[v] > l[best]) best = v;
        jobs[row_job[r]].out[i] = best;
        memcpy(hs + (size_t)row_job[r] * E, h_out + (size_t)r * E, sizeof(float) * E); /* a chained guess reads the MTP's own */
    }
    return KT_OK;
}

kt_status eng_mtp_propose(eng_mtp *mt, llm_work *w, kt_pool *pool, eng_mtp_job *jobs, int n, kt_error *err) {
    const size_t E = (size_t)mt->llm->cfg.n_embd;
    if (n > mt->group) return kt_error_set(err, KT_ERR_ARG, "%d MTP jobs at once (at most %d)", n, mt->group);
    const double t0 = kt_time_ms();
    int k_max = 0, n_guesses = 0;
    for (int j = 0; j < n; j++) { /* each sequence takes its guesses' rows; no room: no guesses */
        eng_mtp_job *jb = &jobs[j];
        jb->got = jb->k > 0 && kv_seq_append(jb->seq, jb->k, NULL) == KT_OK ? jb->k : 0;
        if (!jb->got) continue;
        mt->guesses_blind += !h_before(mt, jb->seq->state_slot, jb->seq->len - jb->got, mt->guess_h + (size_t)j * E);
        k_max = jb->got > k_max ? jb->got : k_max;
        n_guesses += jb->got;
    }
    kt_status st = KT_OK;
    for (int i = 0; i < k_max && st == KT_OK; i++) st = guess_depth(mt, w, pool, jobs, n, i, mt->guess_h, err);
    /* the recurrent state was not touched: only MTP rows past each sequence's end were written */
    for (int j = 0; j < n; j++) {
        if (!jobs[j].got) continue;
        const kt_status st2 = kv_seq_truncate_rewound(jobs[j].seq, jobs[j].seq->len - jobs[j].got, st ? NULL : err);
        if (st2 && !st) st = st2;
        if (st) jobs[j].got = 0;
    }
    if (st) return st;
    if (n_guesses) {
        const double ms = (kt_time_ms() - t0) / n_guesses;
        mt->guess_ms = mt->guess_ms > 0 ? 0.8 * mt->guess_ms + 0.2 * ms : ms;
    }
    return KT_OK;
}
