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
 *
 * Which tokens make rows (mt->want, set by the engine each step): a row
 * at a position needs the target's hidden state before it, so every
 * token that makes one goes through the target's last layer (otherwise
 * only the tokens that want logits do): on a 32-layer file ~3% of a
 * prefill, on a 4-layer one a quarter. So rows are made only where a
 * guess may read them: never for a request with images (the block takes
 * no guesses for one: an image's rows are no tokens it can embed), and
 * not for prompt tokens while the block is dormant: its guesses measured
 * useless (spec_accept_useless: random weights, a fine-tune that left the
 * block behind) or unused for the last EMTP_IDLE_STEPS decoding steps
 * (the policy finds no k that pays, a batch too large, say); decode and
 * verify tokens and a prompt's last token make theirs, so probes go on
 * and the block wakes when a guess is taken. A position without its row
 * holds whatever its block held before, which the block's attention
 * reads: acceptance again, never exactness.
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
    float *hid;     /* [cap][n_embd]: the wanted tokens' hidden states in batch order (the forward's hidden_out) */
    bool *want;     /* [cap]: the forward's hidden flags: token t makes a row (or wants an embedding) */
    int *row;       /* [cap]: token t's row in hid, -1: not wanted (eng_mtp_rows) */
    int idle_steps; /* decoding steps since a guess of the block's was verified */
    int32_t *sub_tok; /* [cap] each: the wanted tokens' ids, positions, sequences */
    int *sub_pos;
    kv_seq **sub_seq;
    float *in;      /* [cap][n_embd]: the MTP pass's hidden inputs */
    float *logits;  /* [group][n_vocab]: a depth's guesses' */
    float *guess_h; /* [group][n_embd]: each job's hidden row between depths */
    double guess_ms; /* one guess, smoothed (0: not measured) */
    uint64_t rows, rows_blind, rows_skipped, guesses_blind; /* kt_engine_stats' mtp_* */
} eng_mtp;

/* For llm (which must have an MTP block), n_slots state slots, batches of cap. */
kt_status eng_mtp_init(eng_mtp *mt, const llm_model *llm, int n_slots, int cap, kt_error *err);
void eng_mtp_free(eng_mtp *mt);
/* A new sequence in slot: nothing known. */
void eng_mtp_forget(eng_mtp *mt, int slot);
/* A fork: slot `to` starts where `from` is. */
void eng_mtp_fork(eng_mtp *mt, int from, int to);
/* Idle: no guess of the block's verified for this many decoding steps. */
#define EMTP_IDLE_STEPS 16
static inline bool eng_mtp_idle(const eng_mtp *mt) { return mt->idle_steps >= EMTP_IDLE_STEPS; }
/* After a step's speculation plan: whether a guess of the block's goes to
 * verification this step (else, with decoding tokens, one idle step). */
void eng_mtp_used(eng_mtp *mt, bool guessed, bool decoding);
/* Before the step's forward, mt->want[0 .. n) set: each wanted token's
 * row in hid (mt->row). */
void eng_mtp_rows(eng_mtp *mt, int n);
/* After the step's forward (its hidden rows in mt->hid): the MTP block's
 * K and V rows for the batch's tokens, each on the hidden state before it
 * (llm_mtp_kv: what later guesses attend; nothing else of the block),
 * for the tokens that wanted their hidden state. */
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
