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
#include "kv/state_pool.h"

/* Reference-counted ids with a free stack and an idle list (ids nobody
 * holds that are kept findable, least recently released first): the
 * blocks, and the window slots. */
typedef struct id_list {
    int n;
    int32_t *ref;        /* per id */
    int32_t *free_stack; /* free ids; the top is free_stack[n_free-1] */
    int n_free;
    int32_t *prev, *next; /* the idle list; -1 ends it */
    int32_t head, tail;   /* oldest, newest; -1 when empty */
    int n_idle;
} id_list;

struct kv_pool {
    kv_pool_params p;
    uint8_t *windowed;  /* per layer (p.windowed points here) */
    int n_win_layers;
    int *plane_of;      /* per layer: its index among the layers of its group */
    size_t row_bytes, block_bytes, plane_bytes, win_plane_bytes;
    uint8_t *mem;       /* the full layers' planes, then the window layers', page-aligned */
    uint8_t *win_mem;   /* the first window plane */
    size_t mem_bytes;   /* as mapped (kt_huge_alloc) */
    id_list blk;        /* blocks: refcount, free stack, idle (cached) list */
    uint8_t *cached;    /* per block: holds KV the prefix cache indexes */
    uint32_t *gen;      /* per block: times alloc handed it out */
    id_list win;        /* window slots: holders, free stack, idle list */
    int32_t *slot_of;   /* per block: its window slot, or -1 */
    int32_t *owner;     /* per slot: its block, or -1 when free */
    void (*evict)(void *ctx, int32_t id);
    void *evict_ctx;
    kv_state_pool *state; /* recurrent state slots (NULL: not a hybrid model) */
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

static bool valid_id(const kv_pool *pool, int32_t id) {
    return id >= 0 && id < pool->p.n_blocks;
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
    if (p->window < 0 || (p->window > 0 && !p->windowed))
        return kt_error_set(err, KT_ERR_ARG, "kv pool: window %d without its layer flags", p->window);
    return KT_OK;
}

int kv_params_n_windowed(const kv_pool_params *p) {
    int n = 0;
    for (int l = 0; p->window > 0 && p->windowed && l < p->n_layer; l++) n += p->windowed[l] != 0;
    return n;
}

size_t kv_params_bytes(const kv_pool_params *p) {
    const int n_win = kv_params_n_windowed(p);
    const double layer = 2.0 * (double)p->block_tokens * (double)kv_row_bytes(p->type, p->kv_dim);
    const double bytes = layer * ((double)(p->n_layer - n_win) * p->n_blocks + (double)n_win * p->n_window_blocks) +
                         (double)p->state_bytes * (p->state_bytes ? p->n_state_slots : 0);
    return bytes >= (double)SIZE_MAX ? SIZE_MAX : (size_t)bytes;
}

int kv_window_span(const kv_pool_params *p, int chunk) {
    if (kv_params_n_windowed(p) == 0) return 0;
    return (p->window + chunk + p->block_tokens - 1) / p->block_tokens + 3;
}

/* Fills the strides; the total size in *total. False on overflow. */
static bool compute_layout(kv_pool *pool, size_t *total) {
    const kv_pool_params *p = &pool->p;
    size_t full = 0, win = 0;
    pool->row_bytes = kv_row_bytes(p->type, p->kv_dim);
    return mul_size(pool->row_bytes, (size_t)p->block_tokens, &pool->block_bytes) &&
           mul_size(pool->block_bytes, (size_t)p->n_blocks, &pool->plane_bytes) &&
           mul_size(pool->block_bytes, (size_t)p->n_window_blocks, &pool->win_plane_bytes) &&
           mul_size(pool->plane_bytes, 2 * (size_t)(p->n_layer - pool->n_win_layers), &full) &&
           mul_size(pool->win_plane_bytes, 2 * (size_t)pool->n_win_layers, &win) && full <= SIZE_MAX - win &&
           (*total = full + win, true);
}

/* ---- id lists, O(1) each ---- */

/* n ids, all free, pushed in reverse so that id 0 is taken first. */
static bool ids_init(id_list *l, int n) {
    const size_t cap = n > 0 ? (size_t)n : 1; /* no window slots: still one entry, so no NULL means failure */
    l->n = n;
    l->ref = calloc(cap, sizeof *l->ref);
    l->free_stack = malloc(cap * sizeof *l->free_stack);
    l->prev = malloc(cap * sizeof *l->prev);
    l->next = malloc(cap * sizeof *l->next);
    l->head = l->tail = -1;
    if (!l->ref || !l->free_stack || !l->prev || !l->next) return false;
    for (int i = 0; i < n; i++) l->free_stack[i] = n - 1 - i;
    l->n_free = n;
    return true;
}

static void ids_free(id_list *l) {
    free(l->ref), free(l->free_stack), free(l->prev), free(l->next);
}

static void idle_push_newest(id_list *l, int32_t b) {
    l->prev[b] = l->tail;
    l->next[b] = -1;
    if (l->tail >= 0) l->next[l->tail] = b;
    else l->head = b;
    l->tail = b;
    l->n_idle++;
}

static void idle_unlink(id_list *l, int32_t b) {
    int32_t p = l->prev[b], n = l->next[b];
    if (p >= 0) l->next[p] = n;
    else l->head = n;
    if (n >= 0) l->prev[n] = p;
    else l->tail = p;
    l->n_idle--;
}

kv_pool *kv_pool_new(const kv_pool_params *params, kt_error *err) {
    if (check_params(params, err) != KT_OK) return NULL;
    kv_pool *pool = calloc(1, sizeof *pool);
    if (!pool) {
        kt_error_set(err, KT_ERR_NOMEM, "kv pool: out of memory");
        return NULL;
    }
    pool->p = *params;
    pool->n_win_layers = kv_params_n_windowed(params);
    if (pool->n_win_layers == 0) pool->p.window = 0, pool->p.windowed = NULL, pool->p.n_window_blocks = 0;
    else if (params->n_window_blocks < 1 || params->n_window_blocks > params->n_blocks) {
        kt_error_set(err, KT_ERR_ARG, "kv pool: %d window slots for %d blocks (give 1 to n_blocks)",
                     params->n_window_blocks, params->n_blocks);
        free(pool);
        return NULL;
    }
    size_t total = 0;
    if (!compute_layout(pool, &total)) {
        kt_error_set(err, KT_ERR_ARG, "kv pool: %d blocks x %d positions x %d layers x %d values "
                     "overflows the address space", params->n_blocks, params->block_tokens,
                     params->n_layer, params->kv_dim);
        free(pool);
        return NULL;
    }
    const int n = params->n_blocks, n_slots = pool->p.n_window_blocks;
    pool->mem = kt_huge_alloc(total, &pool->mem_bytes); /* huge pages: decode at depth walks it all */
    pool->windowed = calloc((size_t)params->n_layer, 1);
    pool->plane_of = malloc((size_t)params->n_layer * sizeof *pool->plane_of);
    pool->cached = calloc((size_t)n, 1);
    pool->gen = calloc((size_t)n, sizeof *pool->gen);
    pool->slot_of = malloc((size_t)n * sizeof *pool->slot_of);
    pool->owner = malloc((size_t)(n_slots ? n_slots : 1) * sizeof *pool->owner);
    bool ok = ids_init(&pool->blk, n) && ids_init(&pool->win, n_slots);
    if (!pool->mem || !pool->windowed || !pool->plane_of || !pool->cached || !pool->gen || !pool->slot_of ||
        !pool->owner || !ok) {
        kt_error_set(err, KT_ERR_NOMEM, "kv pool: cannot allocate %zu bytes for %d blocks", total, n);
        kv_pool_free(pool);
        return NULL;
    }
    int n_full = 0, n_win = 0;
    for (int l = 0; l < params->n_layer; l++) {
        pool->windowed[l] = pool->n_win_layers > 0 && params->windowed[l];
        pool->plane_of[l] = pool->windowed[l] ? n_win++ : n_full++;
    }
    if (pool->n_win_layers > 0) pool->p.windowed = pool->windowed;
    pool->win_mem = pool->mem + 2 * (size_t)n_full * pool->plane_bytes;
    for (int i = 0; i < n; i++) pool->slot_of[i] = -1;
    for (int i = 0; i < n_slots; i++) pool->owner[i] = -1;
    if (params->state_bytes && !(pool->state = kv_state_pool_new(params->n_state_slots, params->state_bytes, err))) {
        kv_pool_free(pool);
        return NULL;
    }
    return pool;
}

bool kv_pool_has_state(const kv_pool *pool) { return pool->state != NULL; }
struct kv_state_pool *kv_pool_state(const kv_pool *pool) { return pool->state; }

void kv_pool_free(kv_pool *pool) {
    if (!pool) return;
    kt_huge_free(pool->mem, pool->mem_bytes);
    free(pool->windowed);
    free(pool->plane_of);
    free(pool->cached);
    free(pool->gen);
    free(pool->slot_of);
    free(pool->owner);
    ids_free(&pool->blk);
    ids_free(&pool->win);
    kv_state_pool_free(pool->state);
    free(pool);
}

const kv_pool_params *kv_pool_get_params(const kv_pool *pool) { return &pool->p; }
int kv_pool_n_total(const kv_pool *pool) { return pool->p.n_blocks; }
int kv_pool_n_free(const kv_pool *pool) { return pool->blk.n_free; }
int kv_pool_n_idle(const kv_pool *pool) { return pool->blk.n_idle; }
int kv_pool_n_used(const kv_pool *pool) { return pool->p.n_blocks - pool->blk.n_free - pool->blk.n_idle; }
int kv_pool_n_window_layers(const kv_pool *pool) { return pool->n_win_layers; }
int kv_pool_n_window_total(const kv_pool *pool) { return pool->p.n_window_blocks; }
int kv_pool_n_window_used(const kv_pool *pool) {
    return pool->p.n_window_blocks - pool->win.n_free - pool->win.n_idle;
}

bool kv_pool_layer_windowed(const kv_pool *pool, int layer) {
    return pool->n_win_layers > 0 && layer >= 0 && layer < pool->p.n_layer && pool->windowed[layer];
}

bool kv_pool_can_alloc(const kv_pool *pool, int n) {
    return n <= pool->blk.n_free + pool->blk.n_idle &&
           (pool->n_win_layers == 0 || n <= pool->win.n_free + pool->win.n_idle);
}

int kv_blocks_for(const kv_pool *pool, int n) {
    int bt = pool->p.block_tokens;
    return n / bt + (n % bt != 0);
}

int kv_window_first_block(const kv_pool *pool, int len) {
    int first = len + 1 - pool->p.window;
    return pool->n_win_layers == 0 || first <= 0 ? 0 : first / pool->p.block_tokens;
}

/* ---- window slots ---- */

static void win_free_slot(kv_pool *pool, int32_t s) {
    pool->slot_of[pool->owner[s]] = -1;
    pool->owner[s] = -1;
    pool->win.free_stack[pool->win.n_free++] = s;
}

/* Block b (without a slot) gets one with one holder: a free slot, or the
 * oldest idle one, whose block loses its window rows. False when neither
 * exists. */
static bool win_take(kv_pool *pool, int32_t b) {
    id_list *w = &pool->win;
    int32_t s;
    if (w->n_free > 0) s = w->free_stack[--w->n_free];
    else if (w->n_idle > 0) {
        s = w->head;
        idle_unlink(w, s);
        pool->slot_of[pool->owner[s]] = -1;
    } else return false;
    pool->owner[s] = b;
    pool->slot_of[b] = s;
    w->ref[s] = 1;
    return true;
}

/* One more holder of block b's slot (b has one); an idle slot is revived. */
static void win_retain(kv_pool *pool, int32_t b) {
    int32_t s = pool->slot_of[b];
    if (pool->win.ref[s]++ == 0) idle_unlink(&pool->win, s);
}

/* One holder fewer; the last one parks a cached block's slot on the idle
 * list and frees anyone else's (W2). */
static void win_drop(kv_pool *pool, int32_t b) {
    int32_t s = pool->slot_of[b];
    if (--pool->win.ref[s] > 0) return;
    if (pool->cached[b]) idle_push_newest(&pool->win, s);
    else win_free_slot(pool, s);
}

bool kv_pool_has_window(const kv_pool *pool, int32_t id) {
    return pool->n_win_layers == 0 || (valid_id(pool, id) && pool->slot_of[id] >= 0);
}

/* The last of the blocks the token after len positions attends in a
 * window layer that has lost its window rows, or -1. */
static int last_gap(const kv_pool *pool, const int32_t *blocks, int len) {
    for (int i = kv_blocks_for(pool, len) - 1; pool->n_win_layers > 0 && i >= kv_window_first_block(pool, len); i--)
        if (!kv_pool_has_window(pool, blocks[i])) return i;
    return -1;
}

bool kv_pool_window_covers(const kv_pool *pool, const int32_t *blocks, int len) {
    return last_gap(pool, blocks, len) < 0;
}

int kv_pool_window_resume_len(const kv_pool *pool, const int32_t *blocks, int len) {
    /* no length whose window spans a gap can resume: the next candidate
     * ends where the gap's block begins */
    for (int gap; len > 0 && (gap = last_gap(pool, blocks, len)) >= 0;) len = gap * pool->p.block_tokens;
    return len;
}

size_t kv_pool_bytes(const kv_pool *pool) { return kv_params_bytes(&pool->p); }

kt_status kv_pool_window_alloc(kv_pool *pool, int32_t id, kt_error *err) {
    if (pool->n_win_layers == 0 || !valid_id(pool, id) || pool->blk.ref[id] < 1 || pool->slot_of[id] >= 0)
        return kt_error_set(err, KT_ERR_INTERNAL, "kv pool: window slot for block %d, which cannot take one", (int)id);
    if (!win_take(pool, id))
        return kt_error_set(err, KT_ERR_NOMEM, "KV cache full: all %d window slots are in use", pool->p.n_window_blocks);
    return KT_OK;
}

void kv_pool_window_release(kv_pool *pool, int32_t id) {
    if (pool->n_win_layers > 0 && valid_id(pool, id) && pool->slot_of[id] >= 0) win_drop(pool, id);
}

/* ---- blocks ---- */

/* The oldest idle block, no longer cached: the index is told first. Its
 * window slot, idle too (nobody holds the block), is freed. */
static int32_t evict_oldest(kv_pool *pool) {
    int32_t b = pool->blk.head;
    idle_unlink(&pool->blk, b);
    if (pool->evict) pool->evict(pool->evict_ctx, b);
    pool->cached[b] = 0;
    if (pool->n_win_layers > 0 && pool->slot_of[b] >= 0) {
        idle_unlink(&pool->win, pool->slot_of[b]);
        win_free_slot(pool, pool->slot_of[b]);
    }
    return b;
}

kt_status kv_pool_alloc(kv_pool *pool, int32_t *id, kt_error *err) {
    id_list *l = &pool->blk;
    if (l->n_free == 0 && l->n_idle == 0)
        return kt_error_set(err, KT_ERR_NOMEM, "KV cache full: all %d blocks are in use",
                            pool->p.n_blocks);
    int32_t b = l->n_free > 0 ? l->free_stack[--l->n_free] : evict_oldest(pool);
    l->ref[b] = 1;
    pool->gen[b]++;
    *id = b;
    return KT_OK;
}

kt_status kv_pool_retain(kv_pool *pool, int32_t id, kt_error *err) {
    if (!valid_id(pool, id) || (pool->blk.ref[id] < 1 && !pool->cached[id]))
        return kt_error_set(err, KT_ERR_INTERNAL, "kv pool: retain of %s block %d",
                            valid_id(pool, id) ? "free" : "invalid", (int)id);
    if (pool->blk.ref[id]++ == 0) idle_unlink(&pool->blk, id); /* a cache hit revives it */
    return KT_OK;
}

kt_status kv_pool_release(kv_pool *pool, int32_t id, kt_error *err) {
    if (!valid_id(pool, id) || pool->blk.ref[id] < 1)
        return kt_error_set(err, KT_ERR_INTERNAL, "kv pool: release of %s block %d",
                            valid_id(pool, id) ? "free" : "invalid", (int)id);
    if (--pool->blk.ref[id] > 0) return KT_OK;
    if (pool->cached[id]) idle_push_newest(&pool->blk, id);
    else pool->blk.free_stack[pool->blk.n_free++] = id; /* its slot went with its last holder (W2) */
    return KT_OK;
}

void kv_pool_mark_cached(kv_pool *pool, int32_t id) {
    if (valid_id(pool, id) && pool->blk.ref[id] > 0) pool->cached[id] = 1;
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
    return valid_id(pool, id) ? pool->blk.ref[id] : -1;
}

size_t kv_pool_row_bytes(const kv_pool *pool) { return pool->row_bytes; }
size_t kv_pool_block_bytes(const kv_pool *pool) { return pool->block_bytes; }

void *kv_pool_plane(const kv_pool *pool, int layer, kv_kind kind) {
    const size_t i = (size_t)pool->plane_of[layer] * 2 + (size_t)kind;
    return kv_pool_layer_windowed(pool, layer) ? pool->win_mem + i * pool->win_plane_bytes
                                               : pool->mem + i * pool->plane_bytes;
}

void *kv_pool_row(const kv_pool *pool, int32_t id, int layer, kv_kind kind, int off) {
    uint8_t *plane = kv_pool_plane(pool, layer, kind);
    if (kv_pool_layer_windowed(pool, layer)) id = pool->slot_of[id];
    return plane + (size_t)id * pool->block_bytes + (size_t)off * pool->row_bytes;
}

void kv_pool_copy_block(kv_pool *pool, int32_t dst, int32_t src, int n_pos) {
    size_t bytes = (size_t)n_pos * pool->row_bytes;
    bool windows = pool->n_win_layers > 0 && pool->slot_of[dst] >= 0 && pool->slot_of[src] >= 0;
    for (int l = 0; l < pool->p.n_layer; l++)
        for (int k = 0; k < 2 && (windows || !pool->windowed[l]); k++)
            memcpy(kv_pool_row(pool, dst, l, (kv_kind)k, 0),
                   kv_pool_row(pool, src, l, (kv_kind)k, 0), bytes);
}

/* Marks the ids of the free stack (1) and the idle list (2) in where[];
 * fails on a bad link, a repeat, or counts other than n_free / n_idle. */
static kt_status check_lists(const id_list *l, uint8_t *where, const char *what, kt_error *err) {
    if (l->n_free < 0 || l->n_free > l->n || l->n_idle < 0 || l->n_free + l->n_idle > l->n)
        return kt_error_set(err, KT_ERR_INTERNAL, "kv pool: %s: n_free %d, n_idle %d out of [0, %d]", what,
                            l->n_free, l->n_idle, l->n);
    for (int i = 0; i < l->n_free; i++) {
        int32_t b = l->free_stack[i];
        if (b < 0 || b >= l->n || where[b])
            return kt_error_set(err, KT_ERR_INTERNAL, "kv pool: %s free stack entry %d (%d) invalid or repeated",
                                what, i, (int)b);
        where[b] = 1;
    }
    int count = 0;
    for (int32_t b = l->head, prev = -1; b != -1; prev = b, b = l->next[b]) {
        if (b < 0 || b >= l->n || where[b] || l->prev[b] != prev || count > l->n_idle)
            return kt_error_set(err, KT_ERR_INTERNAL, "kv pool: %s idle list broken at %d", what, (int)b);
        where[b] = 2;
        count++;
        if (l->next[b] == -1 && l->tail != b)
            return kt_error_set(err, KT_ERR_INTERNAL, "kv pool: %s idle list ends at %d, tail is %d", what, (int)b,
                                (int)l->tail);
    }
    if (count != l->n_idle)
        return kt_error_set(err, KT_ERR_INTERNAL, "kv pool: %d %s on the idle list, n_idle %d", count, what,
                            l->n_idle);
    return KT_OK;
}

static const char *where_name(uint8_t w) {
    return w == 1 ? "on the free stack" : w == 2 ? "on the idle list" : "on neither list";
}

/* W1-W3, with where[] the slots' lists (check_lists). */
static kt_status check_slots(const kv_pool *pool, const uint8_t *where, kt_error *err) {
    for (int32_t s = 0; s < pool->win.n; s++) {
        const int32_t b = pool->owner[s], ref = pool->win.ref[s];
        const int want = b < 0 ? 1 : ref > 0 ? 0 : pool->cached[b] ? 2 : -1;
        if ((b >= 0 && (!valid_id(pool, b) || pool->slot_of[b] != s)) || ref < 0 || where[s] != want)
            return kt_error_set(err, KT_ERR_INTERNAL, "kv pool: window slot %d of block %d has %d holders but is %s",
                                (int)s, (int)b, (int)ref, where_name(where[s]));
    }
    for (int32_t b = 0; b < pool->p.n_blocks; b++)
        if (pool->slot_of[b] >= 0 && (pool->slot_of[b] >= pool->win.n || pool->owner[pool->slot_of[b]] != b))
            return kt_error_set(err, KT_ERR_INTERNAL, "kv pool: block %d names window slot %d, which is not its",
                                (int)b, (int)pool->slot_of[b]);
    return KT_OK;
}

kt_status kv_pool_check(const kv_pool *pool, kt_error *err) {
    const int n = pool->p.n_blocks, n_slots = pool->win.n;
    uint8_t *where = calloc((size_t)n + (size_t)n_slots, 1); /* 1: free stack, 2: idle list */
    if (!where) return kt_error_set(err, KT_ERR_NOMEM, "kv pool check: out of memory");
    kt_status st = check_lists(&pool->blk, where, "blocks", err);
    for (int b = 0; b < n && st == KT_OK; b++) {
        int want = pool->blk.ref[b] > 0 ? 0 : pool->cached[b] ? 2 : 1; /* P1, P3 */
        if (pool->blk.ref[b] < 0 || where[b] != want)
            st = kt_error_set(err, KT_ERR_INTERNAL, "kv pool: block %d has refcount %d, is %scached, "
                              "but is %s", b, (int)pool->blk.ref[b], pool->cached[b] ? "" : "not ",
                              where_name(where[b]));
    }
    if (st == KT_OK) st = check_lists(&pool->win, where + n, "window slots", err);
    if (st == KT_OK) st = check_slots(pool, where + n, err);
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
    s->state_slot = -1;
    if (pool->state) {
        if ((s->state_slot = kv_state_alloc(pool->state, err)) < 0) {
            free(s);
            return NULL;
        }
        s->state = kv_state_data(pool->state, s->state_slot);
    }
    return s;
}

static bool has_windows(const kv_seq *s) { return s->pool->n_win_layers > 0; }

/* Entry i (>= win_lo) takes a hold on its block's slot (W4). */
static void hold_window(kv_seq *s, int i) {
    win_retain(s->pool, s->blocks[i]);
    s->slots[i] = s->pool->slot_of[s->blocks[i]];
}

/* Entry i gives its slot back. */
static void drop_window(kv_seq *s, int i) {
    win_drop(s->pool, s->blocks[i]);
    s->slots[i] = -1;
}

/* Gives back the slots of entries [win_lo, lo): no later token of the
 * sequence attends them. */
static void trim_window(kv_seq *s, int lo) {
    if (lo > s->n_blocks) lo = s->n_blocks;
    for (int i = s->win_lo; i < lo; i++) drop_window(s, i);
    if (lo > s->win_lo) s->win_lo = lo;
}

void kv_seq_window_trim(kv_seq *s, int first_block) {
    if (has_windows(s) && first_block <= kv_window_first_block(s->pool, s->len)) trim_window(s, first_block);
}

/* Releases table entries [from, n_blocks), the last first: cached ones
 * then reach the idle list leaves before parents, so eviction takes a
 * sequence's tail before its prefix. Every entry holds a reference (S1),
 * so release cannot fail here. */
static void release_from(kv_seq *s, int from) {
    for (int i = s->n_blocks - 1; i >= from; i--) {
        if (has_windows(s) && i >= s->win_lo) drop_window(s, i);
        kv_pool_release(s->pool, s->blocks[i], NULL);
    }
    if (from < s->n_blocks) s->n_blocks = from;
}

void kv_seq_free(kv_seq *seq) {
    if (!seq) return;
    release_from(seq, 0);
    if (seq->state_slot >= 0) kv_state_release(seq->pool->state, seq->state_slot);
    free(seq->blocks);
    free(seq->slots);
    free(seq);
}

/* Grows the table to hold at least n entries; changes only capacity. */
static kt_status reserve_table(kv_seq *s, int n, kt_error *err) {
    if (n <= s->cap) return KT_OK;
    int cap = s->cap ? s->cap : 8;
    while (cap < n) cap = cap > INT_MAX / 2 ? n : cap * 2;
    int32_t *t = realloc(s->blocks, (size_t)cap * sizeof *t);
    if (t) s->blocks = t;
    int32_t *w = t && has_windows(s) ? realloc(s->slots, (size_t)cap * sizeof *w) : NULL;
    if (w) s->slots = w;
    if (!t || (has_windows(s) && !w))
        return kt_error_set(err, KT_ERR_NOMEM, "kv sequence: out of memory for %d blocks", n);
    s->cap = cap;
    return KT_OK;
}

static kt_status no_blocks(const kv_seq *s, int need, kt_error *err) {
    const kv_pool *p = s->pool;
    if (p->blk.n_free + p->blk.n_idle >= need)
        return kt_error_set(err, KT_ERR_NOMEM, "KV cache full: need %d window slots, %d of %d free", need,
                            p->win.n_free + p->win.n_idle, p->p.n_window_blocks);
    return kt_error_set(err, KT_ERR_NOMEM, "KV cache full: need %d blocks, %d of %d free",
                        need, p->blk.n_free + p->blk.n_idle, p->p.n_blocks);
}

/* A fresh block for table entry i, with a window slot if i >= win_lo.
 * The caller has checked kv_pool_can_alloc. */
static int32_t alloc_entry(kv_seq *s, int i) {
    int32_t b = -1;
    kv_pool_alloc(s->pool, &b, NULL);
    if (has_windows(s)) {
        bool windowed = i >= s->win_lo && win_take(s->pool, b);
        s->slots[i] = windowed ? s->pool->slot_of[b] : -1;
    }
    return b;
}

/* Replaces shared table entry i by a private copy of its first n_pos
 * positions. The caller has checked that a block is free. */
static void cow_entry(kv_seq *s, int i, int n_pos) {
    int32_t old = s->blocks[i], fresh = alloc_entry(s, i);
    kv_pool_copy_block(s->pool, fresh, old, n_pos);
    if (has_windows(s) && i >= s->win_lo) win_drop(s->pool, old);
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
    return s->pool->blk.ref[b] > 1 || s->pool->cached[b];
}

kt_status kv_seq_append(kv_seq *s, int n, kt_error *err) {
    if (n < 0 || n > INT_MAX - s->len)
        return kt_error_set(err, KT_ERR_ARG, "kv sequence: cannot append %d positions to %d",
                            n, s->len);
    if (n == 0) return KT_OK;
    /* The new tokens attend from position len's window on; one block more
     * is kept so that a rollback of up to block_tokens keeps its window. */
    if (has_windows(s)) trim_window(s, kv_window_first_block(s->pool, s->len) - 1);
    int need_new = kv_blocks_for(s->pool, s->len + n) - s->n_blocks;
    bool cow = s->len % s->block_tokens != 0 && entry_shared(s, s->n_blocks - 1);
    kt_status st = reserve_table(s, s->n_blocks + need_new, err);
    if (st != KT_OK) return st;
    if (!kv_pool_can_alloc(s->pool, need_new + cow)) return no_blocks(s, need_new + cow, err);
    if (cow) cow_entry(s, s->n_blocks - 1, used_in_entry(s, s->n_blocks - 1));
    for (int i = 0; i < need_new; i++, s->n_blocks++) s->blocks[s->n_blocks] = alloc_entry(s, s->n_blocks);
    s->len += n;
    return KT_OK;
}

kt_status kv_seq_truncate(kv_seq *s, int n, kt_error *err) {
    if (n < 0) n = 0;
    if (n >= s->len) return KT_OK;
    if (n > 0 && s->state)
        return kt_error_set(err, KT_ERR_ARG, "kv sequence: cannot roll back from %d to %d positions: a hybrid model's "
                            "recurrent state holds only the last position (start over from 0)", s->len, n);
    if (n == 0 && s->state) kv_state_zero(s->pool->state, s->state_slot);
    if (n > 0 && s->win_lo > kv_window_first_block(s->pool, n))
        return kt_error_set(err, KT_ERR_ARG, "kv sequence: cannot roll back from %d to %d positions: the "
                            "sliding-window layers no longer hold the positions before %d", s->len, n,
                            s->win_lo * s->block_tokens);
    s->len = n;
    release_from(s, kv_blocks_for(s->pool, n));
    if (n == 0) s->win_lo = 0;
    return KT_OK;
}

kt_status kv_seq_truncate_rewound(kv_seq *s, int n, kt_error *err) {
    if (!s->state || n <= 0 || n >= s->len) return kv_seq_truncate(s, n, err);
    if (s->win_lo > kv_window_first_block(s->pool, n))
        return kt_error_set(err, KT_ERR_ARG, "kv sequence: cannot roll back from %d to %d positions: the "
                            "sliding-window layers no longer hold the positions before %d", s->len, n,
                            s->win_lo * s->block_tokens);
    s->len = n;
    release_from(s, kv_blocks_for(s->pool, n));
    return KT_OK;
}

void kv_seq_state_flip(kv_seq *s) {
    if (!s->state) return;
    kv_state_flip(s->pool->state, s->state_slot);
    s->state = kv_state_data(s->pool->state, s->state_slot);
}

float *kv_seq_state_spare(const kv_seq *s) { return s->state ? kv_state_spare(s->pool->state, s->state_slot) : NULL; }

kv_seq *kv_seq_fork(const kv_seq *s, kt_error *err) {
    kv_seq *f = kv_seq_new(s->pool, err);
    if (!f) return NULL;
    if (reserve_table(f, s->n_blocks, err) != KT_OK) {
        kv_seq_free(f);
        return NULL;
    }
    f->win_lo = s->win_lo;
    for (int i = 0; i < s->n_blocks; i++) {
        kv_pool_retain(s->pool, s->blocks[i], NULL);
        f->blocks[i] = s->blocks[i];
        if (has_windows(s)) {
            f->slots[i] = -1;
            if (i >= f->win_lo) hold_window(f, i);
        }
    }
    f->n_blocks = s->n_blocks;
    f->len = s->len;
    if (s->state) kv_state_copy(s->pool->state, f->state_slot, s->state_slot); /* the state after len, too */
    return f;
}

kt_status kv_seq_share(kv_seq *s, const int32_t *blocks, int n_blocks, int len, kt_error *err) {
    return kv_seq_share_state(s, blocks, n_blocks, len, NULL, err);
}

kt_status kv_seq_share_state(kv_seq *s, const int32_t *blocks, int n_blocks, int len, const float *state,
                             kt_error *err) {
    if (s->n_blocks != 0 || n_blocks < 0 || len < 0 || kv_blocks_for(s->pool, len) != n_blocks)
        return kt_error_set(err, KT_ERR_ARG, "kv sequence: cannot share %d blocks as %d positions of a "
                            "sequence of %d", n_blocks, len, s->len);
    if (s->state && len > 0 && !state)
        return kt_error_set(err, KT_ERR_ARG, "kv sequence: cannot take a %d-position prefix from blocks: a hybrid "
                            "model's recurrent state is not in them (give the state after them)", len);
    for (int i = 0; i < n_blocks; i++)
        if (!valid_id(s->pool, blocks[i]) || (s->pool->blk.ref[blocks[i]] < 1 && !s->pool->cached[blocks[i]]))
            return kt_error_set(err, KT_ERR_INTERNAL, "kv sequence: block %d to share is free", (int)blocks[i]);
    if (!kv_pool_window_covers(s->pool, blocks, len))
        return kt_error_set(err, KT_ERR_ARG, "kv sequence: the sliding-window rows of a %d-position prefix are gone",
                            len);
    kt_status st = reserve_table(s, n_blocks, err);
    if (st != KT_OK) return st;
    s->win_lo = kv_window_first_block(s->pool, len);
    for (int i = 0; i < n_blocks; i++) {
        kv_pool_retain(s->pool, blocks[i], NULL);
        s->blocks[i] = blocks[i];
        if (has_windows(s)) {
            s->slots[i] = -1;
            if (i >= s->win_lo) hold_window(s, i);
        }
    }
    s->n_blocks = n_blocks;
    s->len = len;
    if (s->state && len > 0) memcpy(s->state, state, kv_state_slot_bytes(s->pool->state));
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
