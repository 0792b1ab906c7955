/*
 * snapshots.c - the engine's recurrent-state snapshots (see snapshots.h).
 */
#include "engine/snapshots.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

#define DEFAULT_BUDGET ((size_t)1 << 30)
#define MIN_SNAPSHOTS 8
#define MIN_INTERVAL 512

kt_status eng_snaps_init(eng_snaps *s, kv_prefix_cache *cache, size_t slot_bytes, size_t budget_bytes, int n_ctx,
                         int block_tokens, int batch_cap, kt_error *err) {
    memset(s, 0, sizeof *s);
    if (!cache || slot_bytes == 0) return KT_OK;
    size_t n = (budget_bytes ? budget_bytes : DEFAULT_BUDGET) / slot_bytes;
    if (n < MIN_SNAPSHOTS) n = MIN_SNAPSHOTS;
    if (n > 65536) n = 65536;
    kt_status st = kv_cache_enable_states(cache, (int)n, slot_bytes, err);
    if (st != KT_OK) return st;
    if (!(s->b_snap = calloc((size_t)batch_cap, sizeof *s->b_snap)))
        return kt_error_set(err, KT_ERR_NOMEM, "out of memory for the snapshot table");
    const int per_ctx = (int)(n / 4 > 0 ? n / 4 : 1);
    int interval = (n_ctx + per_ctx - 1) / per_ctx;
    if (interval < MIN_INTERVAL) interval = MIN_INTERVAL;
    s->interval = (interval + block_tokens - 1) / block_tokens * block_tokens;
    s->block_tokens = block_tokens;
    s->cache = cache;
    return KT_OK;
}

void eng_snaps_free(eng_snaps *s) {
    free(s->b_snap);
    memset(s, 0, sizeof *s);
}

/* p is a block boundary. The prompt's last boundary serves its next
 * turn; the one before its last token (the same one unless the prompt
 * ends on a boundary) serves the same prompt again (a retry, a
 * regeneration), which must compute its last token for the logits. */
static bool is_snapshot_pos(const eng_snaps *s, int p, int n_prompt, int extra) {
    const int bt = s->block_tokens;
    return p % s->interval == 0 || p == n_prompt / bt * bt || p == (n_prompt - 1) / bt * bt || p == extra;
}

void eng_snaps_plan(eng_snaps *s, kt_request *r, int k0, int n, int b0, int extra) {
    if (!s->cache) return;
    for (int j = 0; j < n; j++) {
        const int p = k0 + j + 1; /* the state after token k0 + j holds p positions */
        s->b_snap[b0 + j] = NULL;
        if (p % s->block_tokens != 0 || !is_snapshot_pos(s, p, r->n_prompt, extra)) continue;
        if (s->n_pending == ENG_SNAPS_PENDING_MAX) continue;
        const int slot = kv_cache_state_reserve(s->cache);
        if (slot < 0) continue;
        s->b_snap[b0 + j] = kv_cache_state_data(s->cache, slot);
        s->pending[s->n_pending].slot = slot, s->pending[s->n_pending].n = p, s->pending[s->n_pending].r = r;
        s->n_pending++;
    }
}

void eng_snaps_hang(eng_snaps *s) {
    for (int i = 0; i < s->n_pending; i++) {
        kt_request *r = s->pending[i].r;
        if (r->state == REQ_PREFILL && !atomic_load(&r->cancel) && r->n_prefilled >= s->pending[i].n &&
            kv_cache_state_hang(s->cache, s->pending[i].slot, r->prompt, s->pending[i].n))
            s->taken++;
        else
            kv_cache_state_release(s->cache, s->pending[i].slot); /* no effect if the hang gave it back */
    }
    s->n_pending = 0;
}

void eng_snaps_take(eng_snaps *s, const kv_seq *seq, const int32_t *tokens, int n) {
    if (!s->cache || n <= 0 || n != seq->len) return;
    const int slot = kv_cache_state_reserve(s->cache);
    if (slot < 0) return;
    memcpy(kv_cache_state_data(s->cache, slot), seq->state, kv_cache_state_bytes(s->cache));
    if (kv_cache_state_hang(s->cache, slot, tokens, n)) s->taken++;
}
