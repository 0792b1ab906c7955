/*
 * snapshots.h - when the engine snapshots a hybrid model's recurrent
 * state for the prefix cache, and hangs the snapshots on its entries.
 *
 * Why: a hybrid model's cached KV is of use only up to a position where a
 * copy of the recurrent state was kept (kv/prefix_cache.h). An agent's
 * next turn starts with its last turn's prompt and reply, so the engine
 * keeps the state at
 *   - the last block boundary of every prompt (the next turn repeats it)
 *     and the last one before its last token (the same prompt again),
 *   - every `interval` positions of a long prefill (another session with
 *     the same system prompt and tools, a history cut in the middle),
 *   - a boundary another request waits for (it shares the prefix),
 *   - the end of every generation (prompt + reply: the next turn's start).
 * Prefill snapshots are taken inside the forward pass, after the token
 * that ends them (llm_batch.state_snap), so no chunk is cut for them;
 * they are hung once the step has indexed the blocks they follow.
 *
 * The recurrent form computes a token's state the same way whatever the
 * steps were, so a resume from a snapshot gives the cold run's bits.
 * Engine thread only.
 */
#ifndef KT_ENGINE_SNAPSHOTS_H
#define KT_ENGINE_SNAPSHOTS_H

#include <stdint.h>

#include "engine/request.h"
#include "kv/prefix_cache.h"

#define ENG_SNAPS_PENDING_MAX 64 /* snapshots one step may take (more: skipped, they are optional) */

typedef struct eng_snaps {
    kv_prefix_cache *cache; /* NULL: not a hybrid model, or no prefix cache: nothing here does anything */
    int interval, block_tokens;
    float **b_snap;         /* per batch token: where its state goes after it, or NULL */
    int n_pending;
    struct {
        int slot, n;
        kt_request *r;
    } pending[ENG_SNAPS_PENDING_MAX];
    uint64_t taken;         /* hung */
} eng_snaps;

/* Enables the cache's snapshots: as many of slot_bytes as budget_bytes
 * holds (0: 1 GiB), at least 8 (up to 65536); the interval from the budget: a quarter
 * of the snapshots cover one n_ctx prefill, every 512 positions at most
 * often. batch_cap: the batch's tokens. */
kt_status eng_snaps_init(eng_snaps *s, kv_prefix_cache *cache, size_t slot_bytes, size_t budget_bytes, int n_ctx,
                         int block_tokens, int batch_cap, kt_error *err);
void eng_snaps_free(eng_snaps *s);

/* r's prompt positions [k0, k0 + n) go into the batch at index b0: the
 * tokens that end a snapshot position get a reserved slot. extra: one
 * more boundary to keep (a waiting request's shared prefix; 0: none). */
void eng_snaps_plan(eng_snaps *s, kt_request *r, int k0, int n, int b0, int extra);
/* After the step's blocks are indexed: hangs what the step took (given
 * back for a request cancelled or failed since). */
void eng_snaps_hang(eng_snaps *s);
/* The state after tokens[0..n) of seq (its whole length, indexed with
 * its tail): a finished generation's. */
void eng_snaps_take(eng_snaps *s, const kv_seq *seq, const int32_t *tokens, int n);

#endif
