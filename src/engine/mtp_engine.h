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
    int n_slots, cap;
    float *h;       /* [n_slots][n_embd]: per slot, the target's hidden state at position h_pos */
    int *h_pos;     /* -1: none */
    float *hid;     /* [cap][n_embd]: the step's tokens' hidden states (the forward's hidden_out) */
    bool *all;      /* [cap], all true: the forward's hidden flags */
    float *in;      /* [cap][n_embd]: the MTP pass's hidden inputs */
    float *logits;  /* [n_vocab]: a guess's */
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
/* Up to k greedy guesses (chained on the MTP's own hidden state) of what
 * follows `pending` for seq (pending at position seq->len); the MTP rows
 * they write past seq->len are dropped again. Returns how many (0 where
 * the blocks are not there), or -1 with err. */
int eng_mtp_propose(eng_mtp *mt, llm_work *w, kt_pool *pool, kv_seq *seq, int32_t pending, int k, int32_t *out,
                    kt_error *err);

#endif
