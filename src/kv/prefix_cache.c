/*
 * prefix_cache.c - the hash-chained block index (see prefix_cache.h).
 *
 * Per block of the pool: the key h_i of the prefix ending with it, its
 * parent (block id and that block's generation when the entry was made)
 * and a copy of its token ids. An open-addressing table (linear probing,
 * at least twice as many slots as blocks, deletion by backward shift so
 * no tombstones pile up) maps a key to the blocks carrying it; several
 * blocks may share a key only by a 64-bit collision, and the full check
 * (tokens, parent, generation) tells them apart.
 */
#include "kv/prefix_cache.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "base/error.h"
#include "kv/state_pool.h"

#define CHAIN_SEED 0x6b6574746c65ull /* h_{-1}: "kettle" */

struct kv_prefix_cache {
    kv_pool *pool;
    int n_blocks, block_tokens;
    uint64_t *key;       /* per block: h_i */
    int32_t *parent;     /* per block: the previous block of the prefix, -1 for the first */
    uint32_t *parent_gen; /* per block: the parent's generation at insertion */
    int32_t *tokens;     /* per block: block_tokens ids */
    uint8_t *indexed;    /* per block: has an entry */
    int16_t *n_valid;    /* per block: positions of the entry (block_tokens, or fewer for a tail) */
    int32_t *first_child, *next_sib, *prev_sib; /* the children lists, -1 terminated */
    int32_t root_first;  /* the first blocks' list */
    int32_t *slot;       /* the table: block ids, -1 empty */
    uint32_t mask;       /* slots - 1 (a power of two) */
    int n_indexed;
    uint64_t n_evicted;
    kv_disk *disk;       /* the disk tier, or NULL */
    /* hybrid models: recurrent-state snapshots hung on entries */
    kv_state_pool *snaps; /* NULL: the model has no recurrent state */
    int32_t *snap_of;     /* per block: the snapshot after its entry's last position, -1 none */
    int32_t *snap_block;  /* per snapshot: the block it hangs on, -1 reserved but not hung */
    uint64_t *snap_used;  /* per snapshot: the tick of its last hang or hit (LRU) */
    uint64_t tick, n_snaps_evicted;
};

static uint64_t chain_key(uint64_t prev, const int32_t *tokens, int n) {
    return XXH64(tokens, sizeof(int32_t) * (size_t)n, prev);
}

static bool in_table(const kv_prefix_cache *c, int32_t b) { return c->n_valid[b] == c->block_tokens; }

/* The head of parent's children list (parent -1: the root's). */
static int32_t *children_of(kv_prefix_cache *c, int32_t parent) {
    return parent >= 0 ? &c->first_child[parent] : &c->root_first;
}

static void link_child(kv_prefix_cache *c, int32_t b, int32_t parent) {
    int32_t *head = children_of(c, parent);
    c->prev_sib[b] = -1;
    c->next_sib[b] = *head;
    if (*head >= 0) c->prev_sib[*head] = b;
    *head = b;
}

/* Takes b off its parent's list, if it is on one (an orphan is not). */
static void unlink_child(kv_prefix_cache *c, int32_t b) {
    if (c->prev_sib[b] >= 0) c->next_sib[c->prev_sib[b]] = c->next_sib[b];
    else if (c->parent[b] >= 0 && c->first_child[c->parent[b]] == b) c->first_child[c->parent[b]] = c->next_sib[b];
    else if (c->parent[b] < 0 && c->root_first == b) c->root_first = c->next_sib[b];
    if (c->next_sib[b] >= 0) c->prev_sib[c->next_sib[b]] = c->prev_sib[b];
    c->next_sib[b] = c->prev_sib[b] = -1;
}

/* b leaves: its children become orphans, reachable by no walk. */
static void orphan_children(kv_prefix_cache *c, int32_t b) {
    for (int32_t k = c->first_child[b], next; k >= 0; k = next) {
        next = c->next_sib[k];
        c->next_sib[k] = c->prev_sib[k] = -1;
    }
    c->first_child[b] = -1;
}

/* Does block b's entry stand for these tokens after this parent? */
static bool entry_is(const kv_prefix_cache *c, int32_t b, uint64_t key, int32_t parent, const int32_t *tokens) {
    uint32_t pgen = parent >= 0 ? kv_pool_generation(c->pool, parent) : 0;
    return c->key[b] == key && c->parent[b] == parent && c->parent_gen[b] == pgen &&
           memcmp(c->tokens + (size_t)b * (size_t)c->block_tokens, tokens,
                  sizeof(int32_t) * (size_t)c->block_tokens) == 0;
}

/* The indexed block for (key, parent, tokens), or -1. */
static int32_t find(const kv_prefix_cache *c, uint64_t key, int32_t parent, const int32_t *tokens) {
    for (uint32_t i = (uint32_t)key & c->mask;; i = (i + 1) & c->mask) {
        int32_t b = c->slot[i];
        if (b < 0) return -1;
        if (entry_is(c, b, key, parent, tokens)) return b;
    }
}

static void table_put(kv_prefix_cache *c, int32_t b) {
    uint32_t i = (uint32_t)c->key[b] & c->mask;
    while (c->slot[i] >= 0) i = (i + 1) & c->mask;
    c->slot[i] = b;
}

/* Removes b from the table, shifting later entries of its probe run back
 * so every remaining entry stays reachable from its home slot. */
static void table_remove(kv_prefix_cache *c, int32_t b) {
    uint32_t i = (uint32_t)c->key[b] & c->mask;
    while (c->slot[i] != b) i = (i + 1) & c->mask; /* it is there: indexed[b] */
    for (uint32_t j = (i + 1) & c->mask; c->slot[j] >= 0; j = (j + 1) & c->mask) {
        uint32_t home = (uint32_t)c->key[c->slot[j]] & c->mask;
        /* j's entry may move to i if i lies cyclically in [home, j) */
        bool movable = i <= j ? (home <= i || home > j) : (home <= i && home > j);
        if (movable) {
            c->slot[i] = c->slot[j];
            i = j;
        }
    }
    c->slot[i] = -1;
}

/* b's snapshot (if any) goes back to the free ones. */
static void drop_snapshot(kv_prefix_cache *c, int32_t b) {
    if (!c->snaps || c->snap_of[b] < 0) return;
    const int32_t s = c->snap_of[b];
    c->snap_of[b] = -1;
    c->snap_block[s] = -1;
    kv_state_release(c->snaps, s);
}

/* The pool takes b back: it leaves the index. */
static void on_evict(void *ctx, int32_t b) {
    kv_prefix_cache *c = ctx;
    if (!c->indexed[b]) return;
    drop_snapshot(c, b);
    if (in_table(c, b)) table_remove(c, b);
    unlink_child(c, b);
    orphan_children(c, b);
    c->indexed[b] = 0;
    c->n_indexed--;
    c->n_evicted++;
}

kv_prefix_cache *kv_cache_new(kv_pool *pool, kt_error *err) {
    kv_prefix_cache *c = calloc(1, sizeof *c);
    if (!c) goto nomem;
    const kv_pool_params *p = kv_pool_get_params(pool);
    c->pool = pool;
    c->n_blocks = p->n_blocks;
    c->block_tokens = p->block_tokens;
    uint32_t slots = 16;
    while (slots < 2u * (uint32_t)p->n_blocks && slots < (1u << 31)) slots *= 2;
    c->mask = slots - 1;
    size_t nb = (size_t)p->n_blocks;
    c->key = malloc(nb * sizeof *c->key);
    c->parent = malloc(nb * sizeof *c->parent);
    c->parent_gen = malloc(nb * sizeof *c->parent_gen);
    c->tokens = malloc(nb * (size_t)p->block_tokens * sizeof *c->tokens);
    c->indexed = calloc(nb, 1);
    c->n_valid = calloc(nb, sizeof *c->n_valid);
    c->first_child = malloc(nb * sizeof *c->first_child);
    c->next_sib = malloc(nb * sizeof *c->next_sib);
    c->prev_sib = malloc(nb * sizeof *c->prev_sib);
    c->slot = malloc((size_t)slots * sizeof *c->slot);
    if (!c->key || !c->parent || !c->parent_gen || !c->tokens || !c->indexed || !c->n_valid || !c->first_child ||
        !c->next_sib || !c->prev_sib || !c->slot)
        goto nomem;
    memset(c->slot, 0xff, (size_t)slots * sizeof *c->slot); /* -1 */
    memset(c->first_child, 0xff, nb * sizeof *c->first_child);
    memset(c->next_sib, 0xff, nb * sizeof *c->next_sib);
    memset(c->prev_sib, 0xff, nb * sizeof *c->prev_sib);
    c->root_first = -1;
    kv_pool_set_evict_hook(pool, on_evict, c);
    return c;
nomem:
    kv_cache_free(c);
    kt_error_set(err, KT_ERR_NOMEM, "prefix cache: out of memory for its index");
    return NULL;
}

void kv_cache_free(kv_prefix_cache *c) {
    if (!c) return;
    if (c->pool && c->slot) kv_pool_set_evict_hook(c->pool, NULL, NULL);
    free(c->key), free(c->parent), free(c->parent_gen), free(c->tokens), free(c->indexed), free(c->slot);
    free(c->n_valid), free(c->first_child), free(c->next_sib), free(c->prev_sib);
    kv_state_pool_free(c->snaps);
    free(c->snap_of), free(c->snap_block), free(c->snap_used);
    free(c);
}

int kv_cache_lookup(const kv_prefix_cache *c, const int32_t *tokens, int n, int32_t *blocks, int max_blocks) {
    const int bt = c->block_tokens;
    uint64_t key = CHAIN_SEED;
    int32_t parent = -1;
    int m = 0;
    for (; m < max_blocks && (m + 1) * bt <= n; m++) {
        const int32_t *t = tokens + (size_t)m * (size_t)bt;
        key = chain_key(key, t, bt);
        int32_t b = find(c, key, parent, t);
        if (b < 0) break;
        blocks[m] = parent = b;
    }
    if (c->snaps) /* a hybrid model resumes only where a snapshot is */
        while (m > 0 && c->snap_of[blocks[m - 1]] < 0) m--;
    return kv_pool_window_resume_len(c->pool, blocks, m * bt) / bt; /* see kv_cache_acquire */
}

/* Indexes b as the n_valid positions of tokens after parent: a whole
 * block goes in the table too, a tail only on the children list. */
static void index_block(kv_prefix_cache *c, int32_t b, uint64_t key, int32_t parent, const int32_t *tokens,
                        int n_valid) {
    c->key[b] = key;
    c->parent[b] = parent;
    c->parent_gen[b] = parent >= 0 ? kv_pool_generation(c->pool, parent) : 0;
    c->n_valid[b] = (int16_t)n_valid;
    memcpy(c->tokens + (size_t)b * (size_t)c->block_tokens, tokens, sizeof(int32_t) * (size_t)n_valid);
    c->indexed[b] = 1;
    c->n_indexed++;
    c->first_child[b] = -1;
    if (in_table(c, b)) table_put(c, b);
    link_child(c, b, parent);
    kv_pool_mark_cached(c->pool, b);
}

/* Tokens t[0..) equal to block b's from the start, at most n. */
static int common_run(const kv_prefix_cache *c, int32_t b, const int32_t *t, int n) {
    const int32_t *bt = c->tokens + (size_t)b * (size_t)c->block_tokens;
    if (n > c->n_valid[b]) n = c->n_valid[b];
    int k = 0;
    while (k < n && bt[k] == t[k]) k++;
    return k;
}

/* The child of parent sharing the longest run with t[0..n) (n <
 * block_tokens, or a whole block that did not match), or -1; the run in
 * *run. A child's own parent generation is checked again, though
 * evictions unlink children, so a stale entry can never be served. */
static int32_t best_child(kv_prefix_cache *c, int32_t parent, const int32_t *t, int n, int *run) {
    uint32_t pgen = parent >= 0 ? kv_pool_generation(c->pool, parent) : 0;
    int32_t best = -1;
    *run = 0;
    for (int32_t k = *children_of(c, parent); k >= 0; k = c->next_sib[k]) {
        if (c->parent_gen[k] != pgen) continue;
        int r = common_run(c, k, t, n);
        if (r > *run) *run = r, best = k;
    }
    return best;
}

/* The tail: the last n_tail positions of a finished sequence, in block b
 * after parent, unless an entry after parent already covers them. */
static void insert_tail(kv_prefix_cache *c, int32_t b, int32_t parent, const int32_t *t, int n_tail) {
    int run = 0;
    if (c->indexed[b]) return; /* a hit's block: it stands for these tokens already */
    best_child(c, parent, t, n_tail, &run);
    if (run == n_tail) return;
    index_block(c, b, 0, parent, t, n_tail);
}

void kv_cache_insert(kv_prefix_cache *c, const kv_seq *seq, const int32_t *tokens, int n, bool with_tail) {
    const int bt = c->block_tokens;
    if (n > seq->len) n = seq->len;
    if (n < seq->len) with_tail = false;
    uint64_t key = CHAIN_SEED;
    kv_disk_key dkey = kv_disk_root();
    int32_t parent = -1;
    for (int i = 0; (i + 1) * bt <= n; i++) {
        const int32_t *t = tokens + (size_t)i * (size_t)bt;
        const int32_t b = seq->blocks[i];
        key = chain_key(key, t, bt);
        kv_disk_key dparent = dkey;
        if (c->disk) dkey = kv_disk_chain(dkey, t, bt);
        /* the prefix may be indexed already: by b itself (a hit, or an
         * earlier insert of this sequence) or by a twin with the same KV;
         * either way the chain goes on from the indexed block */
        int32_t have = find(c, key, parent, t);
        if (have < 0) {
            if (c->indexed[b]) return; /* b stands for another prefix: cannot be (content never changes) */
            index_block(c, b, key, parent, t, bt);
            if (c->disk) kv_disk_put(c->disk, c->pool, b, dkey, dparent, t);
            have = b;
        }
        parent = have;
    }
    const int n_full = n / bt, n_tail = n - n_full * bt;
    /* the walk reached the end unless it returned above */
    if (with_tail && n_tail > 0) insert_tail(c, seq->blocks[n_full], parent, tokens + (size_t)n_full * (size_t)bt, n_tail);
}

void kv_cache_set_disk(kv_prefix_cache *c, kv_disk *disk) {
    c->disk = disk;
}

/* Block m of tokens from the disk tier into a fresh block, indexed after
 * parent; -1 when the disk has no good file for it or no block is free. */
static int32_t load_from_disk(kv_prefix_cache *c, const int32_t *t, uint64_t key, int32_t parent,
                              kv_disk_key dkey, kv_disk_key dparent) {
    int32_t b;
    if (!kv_disk_has(c->disk, dkey) || kv_pool_alloc(c->pool, &b, NULL) != KT_OK) return -1;
    if (!kv_disk_get(c->disk, c->pool, b, dkey, dparent, t)) {
        kv_pool_release(c->pool, b, NULL);
        return -1;
    }
    index_block(c, b, key, parent, t, c->block_tokens);
    kv_pool_window_release(c->pool, b); /* cached now: its window rows stay, idle, until a slot is wanted */
    return b;
}

/* A tail entry after parent with a snapshot whose positions all equal
 * t[0..n), the longest; -1 if none. */
static int32_t snapshot_child(kv_prefix_cache *c, int32_t parent, const int32_t *t, int n) {
    uint32_t pgen = parent >= 0 ? kv_pool_generation(c->pool, parent) : 0;
    int32_t best = -1;
    for (int32_t k = *children_of(c, parent); k >= 0; k = c->next_sib[k]) {
        const int nv = c->n_valid[k];
        if (c->parent_gen[k] != pgen || c->snap_of[k] < 0 || nv > n || (best >= 0 && nv <= c->n_valid[best])) continue;
        if (common_run(c, k, t, nv) == nv) best = k;
    }
    return best;
}

/* A state file on disk after the first n_blocks of a walk (0: none). */
typedef struct disk_snapshot {
    int n_blocks;
    kv_disk_key key;
} disk_snapshot;

/* The disk's snapshot read into a fresh slot and hung on block b; false
 * (nothing hung) when no slot is free or the file does not check. */
static bool load_snapshot(kv_prefix_cache *c, int32_t b, kv_disk_key key) {
    const int s = kv_cache_state_reserve(c);
    if (s < 0) return false;
    if (!kv_disk_get_state(c->disk, key, kv_state_data(c->snaps, s))) {
        kv_state_release(c->snaps, s);
        return false;
    }
    c->snap_of[b] = s;
    c->snap_block[s] = b;
    c->snap_used[s] = ++c->tick;
    return true;
}

/* kv_cache_acquire on a hybrid model: the m whole blocks walked are cut
 * back to the longest prefix that ends at a snapshot (a tail entry
 * after them, one of them, or one read back from disk), since the
 * attention layers' KV is of no use without the recurrent state at the
 * same position. */
static int cut_to_snapshot(kv_prefix_cache *c, const int32_t *tokens, int n, int32_t *blocks, int m, int32_t parent,
                           bool partial, const disk_snapshot *disk, kv_cache_hit *hit) {
    const int bt = c->block_tokens;
    int32_t tail = partial && m * bt < n ? snapshot_child(c, parent, tokens + (size_t)m * bt, n - m * bt) : -1;
    int keep = m;
    while (keep > 0 && c->snap_of[blocks[keep - 1]] < 0) keep--;
    if (tail < 0 && disk->n_blocks > keep && load_snapshot(c, blocks[disk->n_blocks - 1], disk->key))
        keep = disk->n_blocks;
    if (tail >= 0) {
        kv_pool_retain(c->pool, tail, NULL);
        blocks[m++] = tail;
        hit->n_positions += c->n_valid[tail];
    } else {
        /* blocks read back from disk are the walk's last ones (a block
         * after a missing one is unreachable): those cut off count no more */
        const int cut = m - keep;
        hit->from_disk = hit->from_disk > cut ? hit->from_disk - cut : 0;
        while (m > keep) kv_pool_release(c->pool, blocks[--m], NULL);
        hit->n_positions = m * bt;
    }
    if (m > 0) {
        hit->state = c->snap_of[blocks[m - 1]];
        c->snap_used[hit->state] = ++c->tick;
    }
    return m;
}

int kv_cache_acquire(kv_prefix_cache *c, const int32_t *tokens, int n, int32_t *blocks, int max_blocks,
                     bool partial, kv_cache_hit *hit) {
    const int bt = c->block_tokens;
    uint64_t key = CHAIN_SEED;
    kv_disk_key dkey = kv_disk_root();
    int32_t parent = -1;
    int m = 0, *from_disk = &hit->from_disk;
    *from_disk = 0;
    disk_snapshot disk_state = {0, {0, 0}}; /* the longest prefix with a state file */
    for (; m < max_blocks && (m + 1) * bt <= n; m++) {
        const int32_t *t = tokens + (size_t)m * (size_t)bt;
        key = chain_key(key, t, bt);
        kv_disk_key dparent = dkey;
        if (c->disk) dkey = kv_disk_chain(dkey, t, bt);
        int32_t b = find(c, key, parent, t);
        if (b >= 0) kv_pool_retain(c->pool, b, NULL); /* held: a disk load below cannot take it */
        else if (c->disk && (b = load_from_disk(c, t, key, parent, dkey, dparent)) >= 0) (*from_disk)++;
        if (b < 0) break;
        blocks[m] = parent = b;
        if (c->snaps && c->disk && c->snap_of[b] < 0 && kv_disk_has_state(c->disk, dkey))
            disk_state.n_blocks = m + 1, disk_state.key = dkey;
    }
    hit->n_positions = m * bt;
    hit->state = -1;
    if (c->snaps) return cut_to_snapshot(c, tokens, n, blocks, m, parent, partial, &disk_state, hit);
    int run = 0;
    int32_t b = partial && m * bt < n ? best_child(c, parent, tokens + (size_t)m * (size_t)bt, n - m * bt, &run) : -1;
    if (b >= 0 && run > 0) {
        kv_pool_retain(c->pool, b, NULL);
        blocks[m++] = b;
        hit->n_positions += run;
    }
    /* a sliding-window model resumes only where the window rows are still there */
    hit->n_positions = kv_pool_window_resume_len(c->pool, blocks, hit->n_positions);
    for (int keep = kv_blocks_for(c->pool, hit->n_positions); m > keep;) kv_pool_release(c->pool, blocks[--m], NULL);
    return m;
}

/* ---- recurrent-state snapshots (hybrid models) ---------------------- */

kt_status kv_cache_enable_states(kv_prefix_cache *c, int n_snaps, size_t bytes, kt_error *err) {
    if (!(c->snaps = kv_state_pool_new(n_snaps, bytes, err))) return err ? err->status : KT_ERR_NOMEM;
    c->snap_of = malloc(sizeof *c->snap_of * (size_t)c->n_blocks);
    c->snap_block = malloc(sizeof *c->snap_block * (size_t)n_snaps);
    c->snap_used = calloc((size_t)n_snaps, sizeof *c->snap_used);
    if (!c->snap_of || !c->snap_block || !c->snap_used)
        return kt_error_set(err, KT_ERR_NOMEM, "prefix cache: out of memory for the snapshots' index");
    memset(c->snap_of, 0xff, sizeof *c->snap_of * (size_t)c->n_blocks);
    memset(c->snap_block, 0xff, sizeof *c->snap_block * (size_t)n_snaps);
    return KT_OK;
}

bool kv_cache_has_states(const kv_prefix_cache *c) { return c->snaps != NULL; }

int kv_cache_state_reserve(kv_prefix_cache *c) {
    if (!c->snaps) return -1;
    if (kv_state_n_free(c->snaps) == 0) { /* the least recently hung or hit goes */
        int32_t lru = -1;
        for (int32_t s = 0; s < kv_state_n_slots(c->snaps); s++)
            if (c->snap_block[s] >= 0 && (lru < 0 || c->snap_used[s] < c->snap_used[lru])) lru = s;
        if (lru < 0) return -1; /* every one reserved by a step in flight */
        drop_snapshot(c, c->snap_block[lru]);
        c->n_snaps_evicted++;
    }
    return kv_state_alloc(c->snaps, NULL);
}

float *kv_cache_state_data(const kv_prefix_cache *c, int s) { return kv_state_data(c->snaps, s); }
size_t kv_cache_state_bytes(const kv_prefix_cache *c) { return c->snaps ? kv_state_slot_bytes(c->snaps) : 0; }

void kv_cache_state_release(kv_prefix_cache *c, int s) {
    if (c->snaps && s >= 0 && c->snap_block[s] < 0) kv_state_release(c->snaps, s);
}

/* The entry that stands for tokens[0..n) (n > 0): the n/bt-th whole
 * block of the chain (its disk key in *dkey), or a tail entry of exactly
 * the rest; -1 if none. */
static int32_t entry_for(kv_prefix_cache *c, const int32_t *tokens, int n, kv_disk_key *dkey) {
    const int bt = c->block_tokens;
    uint64_t key = CHAIN_SEED;
    int32_t parent = -1;
    *dkey = kv_disk_root();
    for (int i = 0; (i + 1) * bt <= n; i++) {
        const int32_t *t = tokens + (size_t)i * (size_t)bt;
        key = chain_key(key, t, bt);
        if (c->disk) *dkey = kv_disk_chain(*dkey, t, bt);
        if ((parent = find(c, key, parent, t)) < 0) return -1;
    }
    const int rest = n % bt;
    if (rest == 0) return parent;
    uint32_t pgen = parent >= 0 ? kv_pool_generation(c->pool, parent) : 0;
    for (int32_t k = *children_of(c, parent); k >= 0; k = c->next_sib[k])
        if (c->parent_gen[k] == pgen && c->n_valid[k] == rest && common_run(c, k, tokens + (n - rest), rest) == rest)
            return k;
    return -1;
}

bool kv_cache_state_hang(kv_prefix_cache *c, int s, const int32_t *tokens, int n) {
    kv_disk_key dkey;
    const int32_t b = c->snaps && s >= 0 && n > 0 ? entry_for(c, tokens, n, &dkey) : -1;
    if (b < 0 || c->snap_of[b] >= 0) { /* not indexed, or a snapshot of the same prefix is there */
        if (b >= 0) c->snap_used[c->snap_of[b]] = ++c->tick;
        kv_cache_state_release(c, s);
        return false;
    }
    c->snap_of[b] = s;
    c->snap_block[s] = b;
    c->snap_used[s] = ++c->tick;
    /* the disk tier keeps whole blocks only: a tail's state stays here */
    if (c->disk && n % c->block_tokens == 0) kv_disk_put_state(c->disk, dkey, kv_state_data(c->snaps, s));
    return true;
}

int kv_cache_n_states(const kv_prefix_cache *c) {
    if (!c->snaps) return 0;
    int n = 0;
    for (int32_t s = 0; s < kv_state_n_slots(c->snaps); s++) n += c->snap_block[s] >= 0;
    return n;
}
int kv_cache_max_states(const kv_prefix_cache *c) { return c->snaps ? kv_state_n_slots(c->snaps) : 0; }
uint64_t kv_cache_n_states_evicted(const kv_prefix_cache *c) { return c->n_snaps_evicted; }

/* Every snapshot hangs on one indexed entry that names it, and back. */
static kt_status check_states(const kv_prefix_cache *c, kt_error *err) {
    if (!c->snaps) return KT_OK;
    const int n_snaps = kv_state_n_slots(c->snaps);
    int hung = 0;
    for (int32_t b = 0; b < c->n_blocks; b++) {
        const int32_t s = c->snap_of[b];
        if (s < 0) continue;
        hung++;
        if (s >= n_snaps || c->snap_block[s] != b || !c->indexed[b])
            return kt_error_set(err, KT_ERR_INTERNAL, "prefix cache: block %d's snapshot %d is not its own", (int)b, (int)s);
    }
    for (int32_t s = 0; s < n_snaps; s++)
        if (c->snap_block[s] >= 0 && c->snap_of[c->snap_block[s]] != s)
            return kt_error_set(err, KT_ERR_INTERNAL, "prefix cache: snapshot %d names block %d, which does not name it",
                                (int)s, (int)c->snap_block[s]);
    if (hung > n_snaps - kv_state_n_free(c->snaps))
        return kt_error_set(err, KT_ERR_INTERNAL, "prefix cache: %d snapshots hung, %d slots in use", hung,
                            n_snaps - kv_state_n_free(c->snaps));
    return KT_OK;
}

int kv_cache_n_blocks(const kv_prefix_cache *c) { return c->n_indexed; }
uint64_t kv_cache_n_evicted(const kv_prefix_cache *c) { return c->n_evicted; }

kt_status kv_cache_check(const kv_prefix_cache *c, kt_error *err) {
    int n = 0;
    for (int32_t b = 0; b < c->n_blocks; b++) {
        if (c->indexed[b] != kv_pool_is_cached(c->pool, b))
            return kt_error_set(err, KT_ERR_INTERNAL, "prefix cache: block %d is %sindexed but %scached", (int)b,
                                c->indexed[b] ? "" : "not ", kv_pool_is_cached(c->pool, b) ? "" : "not ");
        if (!c->indexed[b]) continue;
        n++;
        if (c->n_valid[b] < 1 || c->n_valid[b] > c->block_tokens)
            return kt_error_set(err, KT_ERR_INTERNAL, "prefix cache: block %d holds %d positions", (int)b, c->n_valid[b]);
        if (!in_table(c, b)) continue;
        uint32_t i = (uint32_t)c->key[b] & c->mask;
        while (c->slot[i] >= 0 && c->slot[i] != b) i = (i + 1) & c->mask;
        if (c->slot[i] != b)
            return kt_error_set(err, KT_ERR_INTERNAL, "prefix cache: block %d is not reachable in the table", (int)b);
    }
    int n_table = 0, n_whole = 0, n_listed = 0;
    for (uint32_t i = 0; i <= c->mask; i++) n_table += c->slot[i] >= 0;
    for (int32_t b = 0; b < c->n_blocks; b++) n_whole += c->indexed[b] && in_table(c, b);
    if (n != c->n_indexed || n_table != n_whole)
        return kt_error_set(err, KT_ERR_INTERNAL, "prefix cache: %d blocks indexed, count %d, table %d of %d whole", n,
                            c->n_indexed, n_table, n_whole);
    /* every listed child is indexed and names the list's owner as parent */
    for (int32_t p = -1; p < c->n_blocks; p++) {
        if (p >= 0 && !c->indexed[p] && c->first_child[p] >= 0)
            return kt_error_set(err, KT_ERR_INTERNAL, "prefix cache: evicted block %d still has children", (int)p);
        for (int32_t k = p >= 0 ? c->first_child[p] : c->root_first; k >= 0; k = c->next_sib[k], n_listed++) {
            if (!c->indexed[k] || c->parent[k] != p)
                return kt_error_set(err, KT_ERR_INTERNAL, "prefix cache: block %d is on block %d's list", (int)k, (int)p);
            if (n_listed > n)
                return kt_error_set(err, KT_ERR_INTERNAL, "prefix cache: a children list loops");
        }
    }
    return check_states(c, err);
}
