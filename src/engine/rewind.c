/*
 * rewind.c - speculative rollback of the recurrent state (see rewind.h).
 */
#include "engine/rewind.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "model/deltanet.h"

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
    if (!rw->pre || !rw->pre_b0 || !rw->b_log || !rw->log_mem) {
        eng_rewind_free(rw);
        return kt_error_set(err, KT_ERR_NOMEM, "out of memory for speculation's state rollback (%.1f MiB of logs)",
                            (double)(sizeof(float) * rw->log_floats * (size_t)log_cap) / 1048576.0);
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
    memcpy(rw->pre[slot], seq->state, rw->state_bytes);
    rw->pre_b0[slot] = b0;
    for (int t = 0; t < n; t++) rw->b_log[b0 + t] = rw->log_mem + rw->log_floats * (size_t)rw->n_log++;
    return true;
}

kt_status eng_rewind_apply(eng_rewind *rw, llm_work *work, kt_pool *pool, kv_seq *seq, int new_len, int keep,
                           kt_error *err) {
    const int slot = seq->state_slot;
    if (!rw->llm || slot < 0 || !rw->pre[slot])
        return kt_error_set(err, KT_ERR_INTERNAL, "speculation: no saved state to roll back to");
    memcpy(seq->state, rw->pre[slot], rw->state_bytes);
    llm_state_replay(rw->llm, work, pool, seq, (const float *const *)(rw->b_log + rw->pre_b0[slot]), keep);
    return kv_seq_truncate_rewound(seq, new_len, err);
}
