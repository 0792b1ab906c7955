/*
 * block_pool.c - the KV block pool and per-sequence block tables; see
 * block_pool.h for the layout and the invariants.
 *
 * The pool is a free stack of block ids plus one refcount per block: alloc
 * pops, a release that reaches 0 pushes, both O(1). Cached blocks whose
 * last reference goes wait on the idle list instead, a doubly linked list
 * in release order (oldest at the head), which alloc falls back on; a
 * sequence is released from its last block to its first, so within one
 * sequence the leaves grow old before their parents. Sequence operations
 * check everything that can fail (table growth, free blocks) before they
 * change anything, so a failed call leaves pool and table as they were.
 */
#include "kv/block_pool.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/huge.h"

struct kv_pool {
    kv_pool_params p;
    size_t row_bytes, block_bytes, plane_bytes;
    uint8_t *mem;       /* 2 * n_layer planes of plane_bytes, page-aligned */
    size_t mem_bytes;   /* as mapped (kt_huge_alloc) */
    int32_t *refcount;  /* per block */
    int32_t *free_stack; /* free block ids; the top is free_stack[n_free-1] */
    int n_free;
    uint8_t *cached;     /* per block: holds KV the prefix cache indexes */
    uint32_t *gen;       /* per block: times alloc handed it out */
    int32_t *idle_prev, *idle_next; /* the idle list; -1 ends it */
    int32_t idle_head, idle_tail;   /* oldest, newest; -1 when empty */
    int n_idle;
    void (*evict)(void *ctx, int32_t id);
    void *evict_ctx;
};

size_t kv_row_bytes(kv_type t, int kv_dim) {
    if (kv_dim < 1) return 0;
    switch (t) {
    case KV_F32: return (size_t)kv_dim * 4;
    case KV_F16: return (size_t)kv_dim * 2;
    case KV_Q8_0: return kv_dim % 32 ? 0 : kt_dtype_row_bytes(KT_Q8_0, kv_dim);
    }
    return 0;
}

kt_dtype kv_type_dtype(kv_type t) {
    return t == KV_F16 ? KT_F16 : t == KV_Q8_0 ? KT_Q8_0 : KT_F32;
}

/* *out = a * b; false on size_t overflow. */
static bool mul_size(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) return false;
    *out = a * b;
    return true;
}

static kt_status check_params(const kv_pool_params *p, kt_error *err) {
    if (!p || p->n_blocks < 1 || p->block_tokens < 1 || p->n_layer < 1 || p->kv_dim < 1)
        return kt_error_set(err, KT_ERR_ARG,
                            "kv pool: n_blocks, block_tokens, n_layer and kv_dim must be >= 1");
    if (kv_row_bytes(p->type, p->kv_dim) == 0)
        return kt_error_set(err, KT_ERR_ARG,
                            "kv pool: element type %d cannot hold rows of %d values (Q8_0 needs a "
                            "multiple of 32)", (int)p->type, p->kv_dim);
    return KT_OK;
}

/* Fills the strides; the total size in *total. False on overflow. */
static bool compute_layout(kv_pool *pool, size_t *total) {
    const kv_pool_params *p = &pool->p;
    pool->row_bytes = kv_row_bytes(p->type, p->kv_dim);
    return mul_size(pool->row_bytes, (size_t)p->block_tokens, &pool->block_bytes) &&
           mul_size(pool->block_bytes, (size_t)p->n_blocks, &pool->plane_bytes) &&
           mul_size(pool->plane_bytes, 2 * (size_t)p->n_layer, total);
}

kv_pool *kv_pool_new(const kv_pool_params *params, kt_error *err) {
    if (check_params(params, err) != KT_OK) return NULL;
    kv_pool *pool = calloc(1, sizeof *pool);
    if (!pool) {
        kt_error_set(err, KT_ERR_NOMEM, "kv pool: out of memory");
        return NULL;
    }
    pool->p = *params;
    size_t total = 0;
    if (!compute_layout(pool, &total)) {
        kt_error_set(err, KT_ERR_ARG, "kv pool: %d blocks x %d positions x %d layers x %d values "
                     "overflows the address space", params->n_blocks, params->block_tokens,
                     params->n_layer, params->kv_dim);
        free(pool);
        return NULL;
    }
    pool->mem = kt_huge_alloc(total, &pool->mem_bytes); /* huge pages: decode at depth walks it all */
    pool->refcount = calloc((size_t)params->n_blocks, sizeof *pool->refcount);
    pool->free_stack = malloc((size_t)params->n_blocks * sizeof *pool->free_stack);
    pool->cached = calloc((size_t)params->n_blocks, 1);
    pool->gen = calloc((size_t)params->n_blocks, sizeof *pool->gen);
    pool->idle_prev = malloc((size_t)params->n_blocks * sizeof *pool->idle_prev);
    pool->idle_next = malloc((size_t)params->n_blocks * sizeof *pool->idle_next);
    pool->idle_head = pool->idle_tail = -1;
    if (!pool->mem || !pool->refcount || !pool->free_stack || !pool->cached || !pool->gen || !pool->idle_prev ||
        !pool->idle_next) {
        kt_error_set(err, KT_ERR_NOMEM, "kv pool: cannot allocate %zu bytes for %d blocks",
                     total, params->n_blocks);
        kv_pool_free(pool);
        return NULL;
    }
    /* Pushed in reverse so that block 0 is allocated first. */
    for (int i = 0; i < params->n_blocks; i++) pool->free_stack[i] = params->n_blocks - 1 - i;
    pool->n_free = params->n_blocks;
    return pool;
}

void kv_pool_free(kv_pool *pool) {
    if (!pool) return;
    kt_huge_free(pool->mem, pool->mem_bytes);
    free(pool->refcount);
    free(pool->free_stack);
    free(pool->cached);
    free(pool->gen);
    free(pool->idle_prev);
    free(pool->idle_next);
    free(pool);
}

const kv_pool_params *kv_pool_get_params(const kv_pool *pool) { return &pool->p; }
int kv_pool_n_total(const kv_pool *pool) { return pool->p.n_blocks; }
int kv_pool_n_free(const kv_pool *pool) { return pool->n_free; }
int kv_pool_n_idle(const kv_pool *pool) { return pool->n_idle; }
int kv_pool_n_used(const kv_pool *pool) { return pool->p.n_blocks - pool->n_free - pool->n_idle; }
bool kv_pool_can_alloc(const kv_pool *pool, int n) { return n <= pool->n_free + pool->n_idle; }

int kv_blocks_for(const kv_pool *pool, int n) {
    int bt = pool->p.block_tokens;
    return n / bt + (n % bt != 0);
}

/* ---- the idle list (cached blocks nobody holds), O(1) each ---- */

static void idle_push_newest(kv_pool *pool, int32_t b) {
    pool->idle_prev[b] = pool->idle_tail;
    pool->idle_next[b] = -1;
    if (pool->idle_tail >= 0) pool->idle_next[pool->idle_tail] = b;
    else pool->idle_head = b;
    pool->idle_tail = b;
    pool->n_idle++;
}

static void idle_unlink(kv_pool *pool, int32_t b) {
    int32_t p = pool->idle_prev[b], n = pool->idle_next[b];
    if (p >= 0) pool->idle_next[p] = n;
    else pool->idle_head = n;
    if (n >= 0) pool->idle_prev[n] = p;
    else pool->idle_tail = p;
    pool->n_idle--;
}

/* The oldest idle block, no longer cached: the index is told first. */
static int32_t evict_oldest(kv_pool *pool) {
    int32_t b = pool->idle_head;
    idle_unlink(pool, b);
    if (pool->evict) pool->evict(pool->evict_ctx, b);
    pool->cached[b] = 0;
    return b;
}

kt_status kv_pool_alloc(kv_pool *pool, int32_t *id, kt_error *err) {
    if (pool->n_free == 0 && pool->n_idle == 0)
        return kt_error_set(err, KT_ERR_NOMEM, "KV cache full: all %d blocks are in use",
                            pool->p.n_blocks);
    int32_t b = pool->n_free > 0 ? pool->free_stack[--pool->n_free] : evict_oldest(pool);
    pool->refcount[b] = 1;
    pool->gen[b]++;
    *id = b;
    return KT_OK;
}

static bool valid_id(const kv_pool *pool, int32_t id) {
    return id >= 0 && id < pool->p.n_blocks;
}

kt_status kv_pool_retain(kv_pool *pool, int32_t id, kt_error *err) {
    if (!valid_id(pool, id) || (pool->refcount[id] < 1 && !pool->cached[id]))
        return kt_error_set(err, KT_ERR_INTERNAL, "kv pool: retain of %s block %d",
                            valid_id(pool, id) ? "free" : "invalid", (int)id);
    if (pool->refcount[id]++ == 0) idle_unlink(pool, id); /* a cache hit revives it */
    return KT_OK;
}

kt_status kv_pool_release(kv_pool *pool, int32_t id, kt_error *err) {
    if (!valid_id(pool, id) || pool->refcount[id] < 1)
        return kt_error_set(err, KT_ERR_INTERNAL, "kv pool: release of %s block %d",
                            valid_id(pool, id) ? "free" : "invalid", (int)id);
    if (--pool->refcount[id] > 0) return KT_OK;
    if (pool->cached[id]) idle_push_newest(pool, id);
    else pool->free_stack[pool->n_free++] = id;
    return KT_OK;
}

void kv_pool_mark_cached(kv_pool *pool, int32_t id) {
    if (valid_id(pool, id) && pool->refcount[id] > 0) pool->cached[id] = 1;
}

bool kv_pool_is_cached(const kv_pool *pool, int32_t id) {
    return valid_id(pool, id) && pool->cached[id];
}

void kv_pool_set_evict_hook(kv_pool *pool, void (*evict)(void *ctx, int32_t id), void *ctx) {
    pool->evict = evict;
    pool->evict_ctx = ctx;
}

uint32_t kv_pool_generation(const kv_pool *pool, int32_t id) {
    return valid_id(pool, id) ? pool->gen[id] : 0;
}

int kv_pool_refcount(const kv_pool *pool, int32_t id) {
    return valid_id(pool, id) ? pool->refcount[id] : -1;
}

size_t kv_pool_row_bytes(const kv_pool *pool) { return pool->row_bytes; }
size_t kv_pool_block_bytes(const kv_pool *pool) { return pool->block_bytes; }

void *kv_pool_plane(const kv_pool *pool, int layer, kv_kind kind) {
    return pool->mem + ((size_t)layer * 2 + (size_t)kind) * pool->plane_bytes;
}

void *kv_pool_row(const kv_pool *pool, int32_t id, int layer, kv_kind kind, int off) {
    uint8_t *plane = kv_pool_plane(pool, layer, kind);
    return plane + (size_t)id * pool->block_bytes + (size_t)off * pool->row_bytes;
}

void kv_pool_copy_block(kv_pool *pool, int32_t dst, int32_t src, int n_pos) {
    size_t bytes = (size_t)n_pos * pool->row_bytes;
    for (int l = 0; l < pool->p.n_layer; l++)
        for (int k = 0; k < 2; k++)
            memcpy(kv_pool_row(pool, dst, l, (kv_kind)k, 0),
                   kv_pool_row(pool, src, l, (kv_kind)k, 0), bytes);
}

/* Marks the blocks of the idle list in where[] (2); fails on a bad link,
 * a repeat, or a count other than n_idle. */
static kt_status check_idle_list(const kv_pool *pool, uint8_t *where, kt_error *err) {
    int count = 0;
    for (int32_t b = pool->idle_head, prev = -1; b != -1; prev = b, b = pool->idle_next[b]) {
        if (!valid_id(pool, b) || where[b] || pool->idle_prev[b] != prev || count > pool->n_idle)
            return kt_error_set(err, KT_ERR_INTERNAL, "kv pool: idle list broken at block %d", (int)b);
        where[b] = 2;
        count++;
        if (pool->idle_next[b] == -1 && pool->idle_tail != b)
            return kt_error_set(err, KT_ERR_INTERNAL, "kv pool: idle list ends at %d, tail is %d", (int)b,
                                (int)pool->idle_tail);
    }
    if (count != pool->n_idle)
        return kt_error_set(err, KT_ERR_INTERNAL, "kv pool: %d blocks on the idle list, n_idle %d", count,
                            pool->n_idle);
    return KT_OK;
}

kt_status kv_pool_check(const kv_pool *pool, kt_error *err) {
    int n = pool->p.n_blocks;
    if (pool->n_free < 0 || pool->n_free > n || pool->n_idle < 0 || pool->n_free + pool->n_idle > n)
        return kt_error_set(err, KT_ERR_INTERNAL, "kv pool: n_free %d, n_idle %d out of [0, %d]",
                            pool->n_free, pool->n_idle, n);
    uint8_t *where = calloc((size_t)n, 1); /* 1: free stack, 2: idle list */
    if (!where) return kt_error_set(err, KT_ERR_NOMEM, "kv pool check: out of memory");
    kt_status st = KT_OK;
    for (int i = 0; i < pool->n_free && st == KT_OK; i++) {
        int32_t b = pool->free_stack[i];
        if (!valid_id(pool, b) || where[b])
            st = kt_error_set(err, KT_ERR_INTERNAL, "kv pool: free stack entry %d (block %d) "
                              "invalid or repeated", i, (int)b);
        else where[b] = 1;
    }
    if (st == KT_OK) st = check_idle_list(pool, where, err);
    for (int b = 0; b < n && st == KT_OK; b++) {
        int want = pool->refcount[b] > 0 ? 0 : pool->cached[b] ? 2 : 1; /* P1, P3 */
        if (pool->refcount[b] < 0 || where[b] != want)
            st = kt_error_set(err, KT_ERR_INTERNAL, "kv pool: block %d has refcount %d, is %scached, "
                              "but is %s", b, (int)pool->refcount[b], pool->cached[b] ? "" : "not ",
                              where[b] == 1 ? "on the free stack" : where[b] == 2 ? "on the idle list"
                                                                  : "on neither list");
    }
    free(where);
    return st;
}

/* ---- sequences ------------------------------------------------------ */

kv_seq *kv_seq_new(kv_pool *pool, kt_error *err) {
    kv_seq *s = calloc(1, sizeof *s);
    if (!s) {
        kt_error_set(err, KT_ERR_NOMEM, "kv sequence: out of memory");
        return NULL;
    }
    s->pool = pool;
    s->block_tokens = pool->p.block_tokens;
    return s;
}

/* Releases table entries [from, n_blocks), the last first: cached ones
 * then reach the idle list leaves before parents, so eviction takes a
 * sequence's tail before its prefix. Every entry holds a reference (S1),
 * so release cannot fail here. */
static void release_from(kv_seq *s, int from) {
    for (int i = s->n_blocks - 1; i >= from; i--) kv_pool_release(s->pool, s->blocks[i], NULL);
    if (from < s->n_blocks) s->n_blocks = from;
}

void kv_seq_free(kv_seq *seq) {
    if (!seq) return;
    release_from(seq, 0);
    free(seq->blocks);
    free(seq);
}

/* Grows the table to hold at least n entries; changes only capacity. */
static kt_status reserve_table(kv_seq *s, int n, kt_error *err) {
    if (n <= s->cap) return KT_OK;
    int cap = s->cap ? s->cap : 8;
    while (cap < n) cap = cap > INT_MAX / 2 ? n : cap * 2;
    int32_t *t = realloc(s->blocks, (size_t)cap * sizeof *t);
    if (!t) return kt_error_set(err, KT_ERR_NOMEM, "kv sequence: out of memory for %d blocks", n);
    s->blocks = t;
    s->cap = cap;
    return KT_OK;
}

static kt_status no_blocks(const kv_seq *s, int need, kt_error *err) {
    return kt_error_set(err, KT_ERR_NOMEM, "KV cache full: need %d blocks, %d of %d free",
                        need, s->pool->n_free + s->pool->n_idle, s->pool->p.n_blocks);
}

/* Replaces shared table entry i by a private copy of its first n_pos
 * positions. The caller has checked that a block is free. */
static void cow_entry(kv_seq *s, int i, int n_pos) {
    int32_t old = s->blocks[i], fresh = -1;
    kv_pool_alloc(s->pool, &fresh, NULL);
    kv_pool_copy_block(s->pool, fresh, old, n_pos);
    kv_pool_release(s->pool, old, NULL); /* others keep it, or the cache's idle list */
    s->blocks[i] = fresh;
}

/* Positions of table entry i that lie before len. */
static int used_in_entry(const kv_seq *s, int i) {
    int n = s->len - i * s->block_tokens;
    return n < s->block_tokens ? n : s->block_tokens;
}

/* Entry i may not be written in place: another sequence holds it, or the
 * prefix cache indexes its content (which must never change). */
static bool entry_shared(const kv_seq *s, int i) {
    int32_t b = s->blocks[i];
    return s->pool->refcount[b] > 1 || s->pool->cached[b];
}

kt_status kv_seq_append(kv_seq *s, int n, kt_error *err) {
    if (n < 0 || n > INT_MAX - s->len)
        return kt_error_set(err, KT_ERR_ARG, "kv sequence: cannot append %d positions to %d",
                            n, s->len);
    if (n == 0) return KT_OK;
    int need_new = kv_blocks_for(s->pool, s->len + n) - s->n_blocks;
    bool cow = s->len % s->block_tokens != 0 && entry_shared(s, s->n_blocks - 1);
    kt_status st = reserve_table(s, s->n_blocks + need_new, err);
    if (st != KT_OK) return st;
    if (!kv_pool_can_alloc(s->pool, need_new + cow)) return no_blocks(s, need_new + cow, err);
    if (cow) cow_entry(s, s->n_blocks - 1, used_in_entry(s, s->n_blocks - 1));
    for (int i = 0; i < need_new; i++) kv_pool_alloc(s->pool, &s->blocks[s->n_blocks++], NULL);
    s->len += n;
    return KT_OK;
}

void kv_seq_truncate(kv_seq *s, int n) {
    if (n < 0) n = 0;
    if (n >= s->len) return;
    s->len = n;
    release_from(s, kv_blocks_for(s->pool, n));
}

kv_seq *kv_seq_fork(const kv_seq *s, kt_error *err) {
    kv_seq *f = kv_seq_new(s->pool, err);
    if (!f) return NULL;
    if (reserve_table(f, s->n_blocks, err) != KT_OK) {
        kv_seq_free(f);
        return NULL;
    }
    for (int i = 0; i < s->n_blocks; i++) {
        kv_pool_retain(s->pool, s->blocks[i], NULL);
        f->blocks[i] = s->blocks[i];
    }
    f->n_blocks = s->n_blocks;
    f->len = s->len;
    return f;
}

kt_status kv_seq_share(kv_seq *s, const int32_t *blocks, int n_blocks, int len, kt_error *err) {
    if (s->n_blocks != 0 || n_blocks < 0 || len < 0 || kv_blocks_for(s->pool, len) != n_blocks)
        return kt_error_set(err, KT_ERR_ARG, "kv sequence: cannot share %d blocks as %d positions of a "
                            "sequence of %d", n_blocks, len, s->len);
    for (int i = 0; i < n_blocks; i++)
        if (!valid_id(s->pool, blocks[i]) || (s->pool->refcount[blocks[i]] < 1 && !s->pool->cached[blocks[i]]))
            return kt_error_set(err, KT_ERR_INTERNAL, "kv sequence: block %d to share is free", (int)blocks[i]);
    kt_status st = reserve_table(s, n_blocks, err);
    if (st != KT_OK) return st;
    for (int i = 0; i < n_blocks; i++) {
        kv_pool_retain(s->pool, blocks[i], NULL);
        s->blocks[i] = blocks[i];
    }
    s->n_blocks = n_blocks;
    s->len = len;
    return KT_OK;
}

kt_status kv_seq_make_writable(kv_seq *s, int pos, kt_error *err) {
    if (pos < 0 || pos >= s->len)
        return kt_error_set(err, KT_ERR_ARG, "kv sequence: position %d outside [0, %d)",
                            pos, s->len);
    int i = pos / s->block_tokens;
    if (!entry_shared(s, i)) return KT_OK;
    if (!kv_pool_can_alloc(s->pool, 1)) return no_blocks(s, 1, err);
    cow_entry(s, i, used_in_entry(s, i));
    return KT_OK;
}

void *kv_seq_row(const kv_seq *s, int layer, kv_kind kind, int pos) {
    kv_loc l = kv_seq_locate(s, pos);
    return kv_pool_row(s->pool, l.block, layer, kind, l.off);
}
