/*
 * rewind.h - speculative rollback of a hybrid model's recurrent state.
 *
 * Why: a verify pass feeds a choice's pending token and k proposals, and
 * every one of them moves the recurrent state on; when the draws keep
 * only the first j proposals, the state must be the one after the
 * pending token and those j, or every later token is wrong. A state holds
 * only its last position, so the engine keeps, per choice that verifies
 * proposals, a copy of its state from before the pass and a log of what
 * each of its tokens' state updates read (llm_batch.rec_log); a rollback
 * restores the copy and replays the kept tokens from their logs
 * (llm_state_replay): the same operations on the same inputs, so the
 * state has the bits plain decoding would have given it.
 *
 * Cost: one state copy per verifying choice and step (for Qwen3.5-4B
 * 48 MB, 5-10 ms against a decode pass of ~90-150 ms on two cores) and,
 * on a rejection, a copy back and the kept tokens' state updates again
 * (no matmuls). copy_ms says what a copy costs here, so the policy can
 * weigh it before it speculates (docs/PERFORMANCE.md: eight sequences
 * probing in one step moved ~800 MB). Engine thread only.
 */
#ifndef KT_ENGINE_REWIND_H
#define KT_ENGINE_REWIND_H

#include <stdbool.h>
#include <stddef.h>

#include "kv/block_pool.h"
#include "model/forward.h"

typedef struct eng_rewind {
    const llm_model *llm;   /* NULL: not a hybrid model, nothing here does anything */
    size_t state_bytes, log_floats;
    int n_slots;            /* the pool's state slots */
    float **pre;            /* per state slot: the state before this step's pass (made when first needed) */
    int *pre_b0;            /* per state slot: the batch index of its first logged token */
    float *log_mem;         /* log_cap logs of log_floats */
    int log_cap, n_log;
    float **b_log;          /* per batch token: its log, or NULL */
    double copy_ms;         /* one state copy: timed at init, then a running mean of the real ones */
} eng_rewind;

/* For llm (no-op unless it has recurrent state): n_slots state slots, a
 * batch of batch_cap tokens, at most log_cap of them logged a step. */
kt_status eng_rewind_init(eng_rewind *rw, const llm_model *llm, int n_slots, int batch_cap, int log_cap,
                          kt_error *err);
void eng_rewind_free(eng_rewind *rw);
/* A new step of batch_cap tokens at most: no token logged yet. */
void eng_rewind_begin(eng_rewind *rw, int batch_cap);
/* seq's next n tokens go in at batch index b0 and may be rolled back:
 * its state is copied and the tokens get logs. False (nothing done) when
 * the step's logs are used up or memory is short: verify no proposals. */
bool eng_rewind_plan(eng_rewind *rw, const kv_seq *seq, int b0, int n);
/* After the pass: seq keeps keep of those tokens (1 <= keep < n): its
 * state becomes the one after them and its length len_before + keep. */
kt_status eng_rewind_apply(eng_rewind *rw, llm_work *work, kt_pool *pool, kv_seq *seq, int new_len, int keep,
                           kt_error *err);

#endif
