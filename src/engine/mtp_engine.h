/*
 * mtp_engine.h - the MTP block's proposals in the engine (KT_SPEC_MTP),
 * the engine's twin of a kt_session's (engine/session_spec.c).
 *
 * Why: each running sequence's MTP rows must follow its target rows (one
 * MTP row per position, on the target's hidden state before it), through
 * continuous batching, chunked prefill, forks of n choices and rejected
 * proposals. The pool carries the MTP's KV layer (llm_mtp_kv_params), so
 * the engine's truncations and rollbacks cut it with the target's; what
 * is left here is the hidden state each sequence's next MTP row reads,
 * kept per recurrent-state slot (every sequence of a hybrid model owns
 * one, and Qwen 3.5 is hybrid) with the position it belongs to: a row
 * whose position does not follow reads zeros (a cache hit's first row),
 * which costs acceptance, never exactness.
 * Engine thread only.
 */
#ifndef KT_ENGINE_MTP_ENGINE_H
#define KT_ENGINE_MTP_ENGINE_H

#include <stdbool.h>

#include "kv/block_pool.h"
#include "model/forward.h"

typedef struct eng_mtp {
    const llm_model *llm; /* NULL: off */
    int n_slots, cap, group; /* group: most jobs a call of eng_mtp_propose takes */
    float *h;       /* [n_slots][n_embd]: per slot, the target's hidden state at position h_pos */
    int *h_pos;     /* -1: none */
    float *hid;     /* [cap][n_embd]: the step's tokens' hidden states (the forward's hidden_out) */
    bool *all;      /* [cap], all true: the forward's hidden flags */
    float *in;      /* [cap][n_embd]: the MTP pass's hidden inputs */
    float *logits;  /* [group][n_vocab]: a depth's guesses' */
    float *guess_h; /* [group][n_embd]: each job's hidden row between depths */
    double guess_ms; /* one guess, smoothed (0: not measured) */
    uint64_t rows, rows_blind, guesses_blind; /* kt_engine_stats' mtp_* */
} eng_mtp;

/* For llm (which must have an MTP block), n_slots state slots, batches of cap. */
kt_status eng_mtp_init(eng_mtp *mt, const llm_model *llm, int n_slots, int cap, kt_error *err);
void eng_mtp_free(eng_mtp *mt);
/* A new sequence in slot: nothing known. */
void eng_mtp_forget(eng_mtp *mt, int slot);
/* A fork: slot `to` starts where `from` is. */
void eng_mtp_fork(eng_mtp *mt, int from, int to);
/* After the step's forward (its hidden rows in mt->hid): the MTP block's
 * K and V rows for the batch's tokens, each on the hidden state before it
 * (llm_mtp_kv: what later guesses attend; nothing else of the block). */
kt_status eng_mtp_pass(eng_mtp *mt, llm_work *w, kt_pool *pool, const llm_batch *b, kt_error *err);
/* After the step's draws and rollbacks: each sequence whose last position
 * this step computed keeps that position's hidden state. */
void eng_mtp_note(eng_mtp *mt, const llm_batch *b);
/* One sequence's guesses: up to k greedy guesses of what follows
 * `pending` (at position seq->len), chained on the MTP's own hidden state;
 * got: how many it made (0 where the sequence has no room for their rows). */
typedef struct eng_mtp_job {
    kv_seq *seq;
    int32_t pending;
    int k, got;
    int32_t *out; /* [k] */
} eng_mtp_job;

/* Most jobs one call takes: each depth's rows go through the block in one
 * pass, so n sequences' guesses read its weights (the head is the model's
 * output matrix) once a depth, not n times. */
#define EMTP_GROUP 16

/* The guesses of n <= mt->group jobs (distinct sequences); the MTP rows
 * they write past each sequence's end are dropped again. KT_OK, or err
 * (every job's got 0). */
kt_status eng_mtp_propose(eng_mtp *mt, llm_work *w, kt_pool *pool, eng_mtp_job *jobs, int n, kt_error *err);

#endif
