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

#define CHAIN_SEED 0x6b6574746c65ull /* h_{-1}: "kettle" */

struct kv_prefix_cache {
    kv_pool *pool;
    int n_blocks, block_tokens;
    uint64_t *key;       /* per block: h_i */
    int32_t *parent;     /* per block: the previous block of the prefix, -1 for the first */
    uint32_t *parent_gen; /* per block: the parent's generation at insertion */
    int32_t *tokens;     /* per block: block_tokens ids */
    uint8_t *indexed;    /* per block: has an entry */
    int32_t *slot;       /* the table: block ids, -1 empty */
    uint32_t mask;       /* slots - 1 (a power of two) */
    int n_indexed;
    uint64_t n_evicted;
    kv_disk *disk;       /* the disk tier, or NULL */
};

static uint64_t chain_key(uint64_t prev, const int32_t *tokens, int n) {
    return XXH64(tokens, sizeof(int32_t) * (size_t)n, prev);
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

/* The pool takes b back: it leaves the index. */
static void on_evict(void *ctx, int32_t b) {
    kv_prefix_cache *c = ctx;
    if (!c->indexed[b]) return;
    table_remove(c, b);
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
    c->slot = malloc((size_t)slots * sizeof *c->slot);
    if (!c->key || !c->parent || !c->parent_gen || !c->tokens || !c->indexed || !c->slot) goto nomem;
    memset(c->slot, 0xff, (size_t)slots * sizeof *c->slot); /* -1 */
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
    return m;
}

static void index_block(kv_prefix_cache *c, int32_t b, uint64_t key, int32_t parent, const int32_t *tokens) {
    c->key[b] = key;
    c->parent[b] = parent;
    c->parent_gen[b] = parent >= 0 ? kv_pool_generation(c->pool, parent) : 0;
    memcpy(c->tokens + (size_t)b * (size_t)c->block_tokens, tokens, sizeof(int32_t) * (size_t)c->block_tokens);
    c->indexed[b] = 1;
    c->n_indexed++;
    table_put(c, b);
    kv_pool_mark_cached(c->pool, b);
}

void kv_cache_insert(kv_prefix_cache *c, const kv_seq *seq, const int32_t *tokens, int n) {
    const int bt = c->block_tokens;
    if (n > seq->len) n = seq->len;
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
            index_block(c, b, key, parent, t);
            if (c->disk) kv_disk_put(c->disk, c->pool, b, dkey, dparent, t);
            have = b;
        }
        parent = have;
    }
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
    index_block(c, b, key, parent, t);
    return b;
}

int kv_cache_acquire(kv_prefix_cache *c, const int32_t *tokens, int n, int32_t *blocks, int max_blocks,
                     int *from_disk) {
    const int bt = c->block_tokens;
    uint64_t key = CHAIN_SEED;
    kv_disk_key dkey = kv_disk_root();
    int32_t parent = -1;
    int m = 0;
    *from_disk = 0;
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
    }
    return m;
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
        uint32_t i = (uint32_t)c->key[b] & c->mask;
        while (c->slot[i] >= 0 && c->slot[i] != b) i = (i + 1) & c->mask;
        if (c->slot[i] != b)
            return kt_error_set(err, KT_ERR_INTERNAL, "prefix cache: block %d is not reachable in the table", (int)b);
    }
    int in_table = 0;
    for (uint32_t i = 0; i <= c->mask; i++) in_table += c->slot[i] >= 0;
    if (n != c->n_indexed || in_table != n)
        return kt_error_set(err, KT_ERR_INTERNAL, "prefix cache: %d blocks indexed, count %d, table %d", n,
                            c->n_indexed, in_table);
    return KT_OK;
}
