/*
 * rewind.c - speculative rollback of the recurrent state (see rewind.h).
 */
#include "engine/rewind.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/timing.h"
#include "model/deltanet.h"

/* Folds one timed copy into the running mean (the latest weighs 1/4). */
static void note_copy(eng_rewind *rw, double t0) {
    const double ms = kt_time_ms() - t0;
    rw->copy_ms = rw->copy_ms > 0 ? 0.75 * rw->copy_ms + 0.25 * ms : ms;
}

/* What a state copy costs, before any is needed: slot 0's buffer is made
 * (its pages faulted in) and one half of it copied onto the other, twice.
 * The policy weighs this from the first step, so the first proposals of
 * a batch are not taken blind. */
static bool time_a_copy(eng_rewind *rw) {
    if (!(rw->pre[0] = malloc(rw->state_bytes))) return false;
    memset(rw->pre[0], 0, rw->state_bytes);
    const size_t half = rw->state_bytes / (2 * sizeof(float)); /* floats: the halves never overlap */
    const double t0 = kt_time_ms();
    memcpy(rw->pre[0], rw->pre[0] + half, half * sizeof(float));
    memcpy(rw->pre[0] + half, rw->pre[0], half * sizeof(float));
    note_copy(rw, t0);
    return true;
}

kt_status eng_rewind_init(eng_rewind *rw, const llm_model *llm, int n_slots, int batch_cap, int log_cap,
                          kt_error *err) {
    memset(rw, 0, sizeof *rw);
    const size_t state_bytes = llm_state_bytes(llm);
    if (!state_bytes || log_cap <= 0) return KT_OK;
    rw->state_bytes = state_bytes;
    rw->log_floats = llm_rec_log_floats(&llm->cfg);
    rw->n_slots = n_slots;
    rw->log_cap = log_cap < batch_cap ? log_cap : batch_cap;
    rw->pre = calloc((size_t)n_slots, sizeof *rw->pre);
    rw->pre_b0 = calloc((size_t)n_slots, sizeof *rw->pre_b0);
    rw->b_log = calloc((size_t)batch_cap, sizeof *rw->b_log);
    rw->log_mem = malloc(sizeof(float) * rw->log_floats * (size_t)rw->log_cap);
    if (!rw->pre || !rw->pre_b0 || !rw->b_log || !rw->log_mem || n_slots < 1 || !time_a_copy(rw)) {
        /* the sizes before eng_rewind_free clears them */
        const double log_mib = (double)(sizeof(float) * rw->log_floats * (size_t)rw->log_cap) / 1048576.0;
        const double state_mib = (double)state_bytes / 1048576.0;
        eng_rewind_free(rw);
        return kt_error_set(err, KT_ERR_NOMEM,
                            "out of memory for speculation's state rollback (%.1f MiB of logs, %.1f MiB a saved state)",
                            log_mib, state_mib);
    }
    rw->llm = llm;
    return KT_OK;
}

void eng_rewind_free(eng_rewind *rw) {
    for (int i = 0; rw->pre && i < rw->n_slots; i++) free(rw->pre[i]);
    free(rw->pre), free(rw->pre_b0), free(rw->b_log), free(rw->log_mem);
    memset(rw, 0, sizeof *rw);
}

void eng_rewind_begin(eng_rewind *rw, int batch_cap) {
    if (!rw->llm) return;
    rw->n_log = 0;
    memset(rw->b_log, 0, sizeof *rw->b_log * (size_t)batch_cap);
}

bool eng_rewind_plan(eng_rewind *rw, const kv_seq *seq, int b0, int n) {
    if (!rw->llm || seq->state_slot < 0 || rw->n_log + n > rw->log_cap) return false;
    const int slot = seq->state_slot;
    if (!rw->pre[slot] && !(rw->pre[slot] = malloc(rw->state_bytes))) return false;
    const double t0 = kt_time_ms();
    memcpy(rw->pre[slot], seq->state, rw->state_bytes);
    note_copy(rw, t0);
    rw->pre_b0[slot] = b0;
    for (int t = 0; t < n; t++) rw->b_log[b0 + t] = rw->log_mem + rw->log_floats * (size_t)rw->n_log++;
    return true;
}

kt_status eng_rewind_apply(eng_rewind *rw, llm_work *work, kt_pool *pool, kv_seq *seq, int new_len, int keep,
                           kt_error *err) {
    const int slot = seq->state_slot;
    if (!rw->llm || slot < 0 || !rw->pre[slot])
        return kt_error_set(err, KT_ERR_INTERNAL, "speculation: no saved state to roll back to");
    const double t0 = kt_time_ms();
    memcpy(seq->state, rw->pre[slot], rw->state_bytes);
    note_copy(rw, t0);
    llm_state_replay(rw->llm, work, pool, seq, (const float *const *)(rw->b_log + rw->pre_b0[slot]), keep);
    return kv_seq_truncate_rewound(seq, new_len, err);
}
