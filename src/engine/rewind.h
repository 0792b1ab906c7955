/*
 * rewind.h - speculative rollback of a hybrid model's recurrent state.
 *
 * Why: a verify pass feeds a choice's pending token and k proposals, and
 * every one of them moves the recurrent state on; when the draws keep
 * only the first j proposals, the state must be the one after the
 * pending token and those j, or every later token is wrong. A state holds
 * only its last position, so the pass leaves the state from before it
 * where it was: its tokens move the state on in the slot's spare buffer
 * (kv/state_pool.h; llm_batch.rec_from / rec_to) and log what each of
 * their state updates read (llm_batch.rec_log). Right after the pass the
 * spare becomes the sequence's state (a pointer swap), as if the pass had
 * run in place; a rollback swaps back to the state from before the pass
 * and replays the kept tokens from their logs (llm_state_replay): the
 * same operations on the same inputs, so the state has the bits plain
 * decoding would have given it.
 *
 * Cost: no state copy at all (a copy of Qwen3.5-4B's 48 MB state per
 * verifying sequence and step, and one back on a rejection, was what
 * this replaced: eight sequences probing in one step moved ~800 MB,
 * docs/PERFORMANCE.md); a rejection pays the kept tokens' state updates
 * again (no matmuls, but every layer's state read and written once),
 * replay_ms, which the policy weighs by the chance of a rejection. The
 * price is memory: a spare state per sequence, made (and faulted in) at
 * init. Engine thread only.
 */
#ifndef KT_ENGINE_REWIND_H
#define KT_ENGINE_REWIND_H

#include <stdbool.h>
#include <stddef.h>

#include "kv/block_pool.h"
#include "model/forward.h"

typedef struct eng_rewind {
    const llm_model *llm;   /* NULL: not a hybrid model, nothing here does anything */
    size_t log_floats;
    int n_slots;            /* the pool's state slots */
    int *pre_b0;            /* per state slot: the batch index of its first logged token */
    bool *passed;           /* per state slot: flipped after this step's pass, a rollback may flip back */
    float *log_mem;         /* log_cap logs of log_floats */
    int log_cap, n_log;
    float **b_log;          /* per batch token: its log, or NULL */
    float **b_from, **b_to; /* per batch token: where its state update reads / writes (NULL: the sequence's state) */
    kv_seq **planned;       /* this step's verifying sequences (n_planned; at most one per slot) */
    int n_planned;
    double replay_ms;       /* a rollback's replay: a state copy timed at init, then a running mean */
} eng_rewind;

/* For llm (no-op unless it has recurrent state): the state pool of kv
 * gets its spares (KT_ERR_NOMEM naming the bytes when they are not
 * there), n_slots state slots, a batch of batch_cap tokens, at most
 * log_cap of them logged a step. */
kt_status eng_rewind_init(eng_rewind *rw, const llm_model *llm, kv_pool *kv, int n_slots, int batch_cap, int log_cap,
                          kt_error *err);
void eng_rewind_free(eng_rewind *rw);
/* A new step of batch_cap tokens at most: no token logged yet. */
void eng_rewind_begin(eng_rewind *rw, int batch_cap);
/* seq's next n tokens go in at batch index b0 and may be rolled back:
 * they get logs and move the state on in the slot's spare. False
 * (nothing done) when the step's logs are used up: verify no proposals. */
bool eng_rewind_plan(eng_rewind *rw, kv_seq *seq, int b0, int n);
/* Right after the pass, before anything reads a state: every planned
 * sequence takes the state its tokens wrote (the spare). */
void eng_rewind_passed(eng_rewind *rw);
/* After eng_rewind_passed: seq keeps keep of its planned tokens
 * (1 <= keep < n): its state becomes the one after them and its length
 * new_len (its length before the pass + keep). */
kt_status eng_rewind_apply(eng_rewind *rw, llm_work *work, kt_pool *pool, kv_seq *seq, int new_len, int keep,
                           kt_error *err);

#endif
