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
    mt->in = malloc(sizeof(float) * E * (size_t)cap);
    mt->all = malloc(sizeof *mt->all * (size_t)cap);
    mt->logits = malloc(sizeof(float) * (size_t)llm->cfg.n_vocab);
    if (!mt->h || !mt->h_pos || !mt->hid || !mt->in || !mt->all || !mt->logits) {
        eng_mtp_free(mt);
        return kt_error_set(err, KT_ERR_NOMEM, "out of memory for the MTP block's rows");
    }
    for (int i = 0; i < n_slots; i++) mt->h_pos[i] = -1;
    for (int t = 0; t < cap; t++) mt->all[t] = true;
    mt->llm = llm, mt->n_slots = n_slots, mt->cap = cap;
    return KT_OK;
}

void eng_mtp_free(eng_mtp *mt) {
    free(mt->h), free(mt->h_pos), free(mt->hid), free(mt->in), free(mt->all), free(mt->logits);
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

kt_status eng_mtp_pass(eng_mtp *mt, llm_work *w, kt_pool *pool, const llm_batch *b, kt_error *err) {
    const size_t E = (size_t)mt->llm->cfg.n_embd;
    for (int t = 0; t < b->n_tokens; t++) {
        float *row = mt->in + (size_t)t * E;
        if (t > 0 && b->seq[t] == b->seq[t - 1]) /* a sequence's tokens are contiguous, in position order */
            memcpy(row, mt->hid + (size_t)(t - 1) * E, sizeof(float) * E);
        else
            mt->rows_blind += !h_before(mt, b->seq[t]->state_slot, b->pos[t], row);
    }
    mt->rows += (uint64_t)b->n_tokens;
    llm_batch mb = {.n_tokens = b->n_tokens, .tokens = b->tokens, .pos = b->pos, .seq = b->seq};
    return llm_mtp_kv(mt->llm, w, pool, &mb, mt->in, err);
}

void eng_mtp_note(eng_mtp *mt, const llm_batch *b) {
    const size_t E = (size_t)mt->llm->cfg.n_embd;
    for (int t = 0; t < b->n_tokens; t++) {
        const kv_seq *s = b->seq[t];
        const int slot = s->state_slot;
        if (slot < 0 || slot >= mt->n_slots || s->len != b->pos[t] + 1) continue; /* not its last kept position */
        memcpy(mt->h + (size_t)slot * E, mt->hid + (size_t)t * E, sizeof(float) * E);
        mt->h_pos[slot] = b->pos[t];
    }
}

int eng_mtp_propose(eng_mtp *mt, llm_work *w, kt_pool *pool, kv_seq *seq, int32_t pending, int k, int32_t *out,
                    kt_error *err) {
    const llm_model *m = mt->llm;
    const int len = seq->len, E = m->cfg.n_embd, nv = m->cfg.n_vocab;
    if (k <= 0 || kv_seq_append(seq, k, NULL) != KT_OK) return 0; /* no room: no guesses */
    const double t0 = kt_time_ms();
    float *h = mt->in, *h_next = mt->in + E; /* the pass's inputs are free between steps */
    mt->guesses_blind += !h_before(mt, seq->state_slot, len, h);
    int32_t tok = pending;
    kt_status st = KT_OK;
    for (int i = 0; i < k && st == KT_OK; i++) {
        const int pos = len + i;
        llm_batch b = {.n_tokens = 1, .tokens = &tok, .pos = &pos, .seq = &seq};
        st = llm_mtp_forward(m, w, pool, &b, h, mt->logits, h_next, err);
        memcpy(h, h_next, sizeof(float) * (size_t)E); /* a chained guess reads the MTP's own hidden state */
        int32_t best = 0;
        for (int v = 1; v < nv; v++)
            if (mt->logits[v] > mt->logits[best]) best = v;
        out[i] = tok = best;
    }
    /* the recurrent state was not touched: only MTP rows past len were written */
    const kt_status st2 = kv_seq_truncate_rewound(seq, len, st ? NULL : err);
    if (st || st2) return -1;
    const double ms = (kt_time_ms() - t0) / k;
    mt->guess_ms = mt->guess_ms > 0 ? 0.8 * mt->guess_ms + 0.2 * ms : ms;
    return k;
}
