/*
 * rewind.c - speculative rollback of the recurrent state (see rewind.h).
 */
#include "engine/rewind.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/timing.h"
#include "kv/state_pool.h"
#include "model/deltanet.h"

/* What a rollback costs before one has run: its replay reads and writes
 * every recurrent layer's state once (heads outer, tokens inner, however
 * many tokens it keeps), about one copy of the state. Timed on slot 0's
 * spare (faulted in, its contents free: a session's state may be live),
 * one half onto the other and back. */
static double time_a_copy(kv_state_pool *sp) {
    const size_t half = kv_state_slot_bytes(sp) / (2 * sizeof(float)); /* floats: the halves never overlap */
    float *spare = kv_state_spare(sp, 0);
    const double t0 = kt_time_ms();
    memcpy(spare, spare + half, half * sizeof(float));
    memcpy(spare + half, spare, half * sizeof(float));
    return kt_time_ms() - t0;
}

kt_status eng_rewind_init(eng_rewind *rw, const llm_model *llm, kv_pool *kv, int n_slots, int batch_cap, int log_cap,
                          kt_error *err) {
    memset(rw, 0, sizeof *rw);
    if (!llm_state_bytes(llm) || log_cap <= 0) return KT_OK;
    if (kv_state_make_spares(kv_pool_state(kv), err) != KT_OK) return err->status;
    rw->log_floats = llm_rec_log_floats(&llm->cfg);
    rw->n_slots = n_slots;
    rw->log_cap = log_cap < batch_cap ? log_cap : batch_cap;
    rw->pre_b0 = calloc((size_t)n_slots, sizeof *rw->pre_b0);
    rw->passed = calloc((size_t)n_slots, sizeof *rw->passed);
    rw->planned = calloc((size_t)n_slots, sizeof *rw->planned);
    rw->b_log = calloc((size_t)batch_cap, sizeof *rw->b_log);
    rw->b_from = calloc((size_t)batch_cap, sizeof *rw->b_from);
    rw->b_to = calloc((size_t)batch_cap, sizeof *rw->b_to);
    rw->log_mem = malloc(sizeof(float) * rw->log_floats * (size_t)rw->log_cap);
    if (!rw->pre_b0 || !rw->passed || !rw->planned || !rw->b_log || !rw->b_from || !rw->b_to || !rw->log_mem ||
        n_slots < 1) {
        const double log_mib = (double)(sizeof(float) * rw->log_floats * (size_t)rw->log_cap) / 1048576.0;
        eng_rewind_free(rw);
        return kt_error_set(err, KT_ERR_NOMEM, "out of memory for speculation's state rollback (%.1f MiB of logs)",
                            log_mib);
    }
    rw->llm = llm;
    rw->replay_ms = time_a_copy(kv_pool_state(kv));
    return KT_OK;
}

void eng_rewind_free(eng_rewind *rw) {
    free(rw->pre_b0), free(rw->passed), free(rw->planned);
    free(rw->b_log), free(rw->b_from), free(rw->b_to), free(rw->log_mem);
    memset(rw, 0, sizeof *rw);
}

void eng_rewind_begin(eng_rewind *rw, int batch_cap) {
    if (!rw->llm) return;
    rw->n_log = rw->n_planned = 0;
    memset(rw->b_log, 0, sizeof *rw->b_log * (size_t)batch_cap);
    memset(rw->b_from, 0, sizeof *rw->b_from * (size_t)batch_cap);
    memset(rw->b_to, 0, sizeof *rw->b_to * (size_t)batch_cap);
    memset(rw->passed, 0, sizeof *rw->passed * (size_t)rw->n_slots);
}

bool eng_rewind_plan(eng_rewind *rw, kv_seq *seq, int b0, int n) {
    if (!rw->llm || seq->state_slot < 0 || seq->state_slot >= rw->n_slots || rw->n_log + n > rw->log_cap ||
        rw->n_planned >= rw->n_slots)
        return false;
    float *spare = kv_seq_state_spare(seq);
    if (!spare) return false;
    rw->pre_b0[seq->state_slot] = b0;
    rw->planned[rw->n_planned++] = seq;
    for (int t = 0; t < n; t++) {
        rw->b_log[b0 + t] = rw->log_mem + rw->log_floats * (size_t)rw->n_log++;
        rw->b_from[b0 + t] = t == 0 ? NULL : spare; /* the first token reads the state before the pass */
        rw->b_to[b0 + t] = spare;
    }
    return true;
}

void eng_rewind_passed(eng_rewind *rw) {
    for (int i = 0; i < rw->n_planned; i++) {
        kv_seq_state_flip(rw->planned[i]);
        rw->passed[rw->planned[i]->state_slot] = true;
    }
    rw->n_planned = 0;
}

kt_status eng_rewind_apply(eng_rewind *rw, llm_work *work, kt_pool *pool, kv_seq *seq, int new_len, int keep,
                           kt_error *err) {
    const int slot = seq->state_slot;
    if (!rw->llm || slot < 0 || slot >= rw->n_slots || !rw->passed[slot])
        return kt_error_set(err, KT_ERR_INTERNAL, "speculation: no state from before the pass to roll back to");
    rw->passed[slot] = false;
    kv_seq_state_flip(seq); /* the state from before the pass, untouched by it */
    const double t0 = kt_time_ms();
    llm_state_replay(rw->llm, work, pool, seq, (const float *const *)(rw->b_log + rw->pre_b0[slot]), keep);
    rw->replay_ms = 0.75 * rw->replay_ms + 0.25 * (kt_time_ms() - t0);
    return kv_seq_truncate_rewound(seq, new_len, err);
}
