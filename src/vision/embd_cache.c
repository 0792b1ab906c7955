/*
 * embd_cache.c - see embd_cache.h. A list in recency order (most recent
 * first); the entries are few (one per distinct image of the last
 * minutes), so a linear search costs nothing beside one encode.
 */
#include "vision/embd_cache.h"

#include <stdlib.h>

typedef struct entry {
    uint64_t hash;
    float *embd;
    size_t n_floats;
    int pins;
    struct entry *next;
} entry;

struct kt_embd_cache {
    entry *head;
    size_t max_bytes;
    kt_embd_cache_stats stats;
};

kt_embd_cache *kt_embd_cache_new(size_t max_bytes) {
    kt_embd_cache *c = calloc(1, sizeof *c);
    if (c) c->max_bytes = max_bytes;
    return c;
}

void kt_embd_cache_free(kt_embd_cache *c) {
    if (!c) return;
    for (entry *e = c->head, *next; e; e = next) next = e->next, free(e->embd), free(e);
    free(c);
}

/* Unlinks the entry for hash (its predecessor's link), or NULL. */
static entry *unlink_entry(kt_embd_cache *c, uint64_t hash) {
    for (entry **p = &c->head; *p; p = &(*p)->next)
        if ((*p)->hash == hash) {
            entry *e = *p;
            *p = e->next;
            return e;
        }
    return NULL;
}

static void push_front(kt_embd_cache *c, entry *e) {
    e->next = c->head;
    c->head = e;
}

/* Drops unpinned entries from the least recent end while over budget. */
static void trim(kt_embd_cache *c) {
    while (c->stats.bytes > c->max_bytes) {
        entry **victim = NULL;
        for (entry **p = &c->head; *p; p = &(*p)->next)
            if (!(*p)->pins) victim = p; /* the last unpinned: least recent */
        if (!victim) return;
        entry *e = *victim;
        *victim = e->next;
        c->stats.bytes -= e->n_floats * sizeof(float);
        c->stats.n_entries--;
        c->stats.evicted++;
        free(e->embd), free(e);
    }
}

const float *kt_embd_cache_get(kt_embd_cache *c, uint64_t hash, size_t n_floats) {
    entry *e = unlink_entry(c, hash);
    if (!e) {
        c->stats.misses++;
        return NULL;
    }
    push_front(c, e);
    if (e->n_floats != n_floats) { /* another shape under one hash: never hand it out */
        c->stats.misses++;
        return NULL;
    }
    c->stats.hits++;
    e->pins++;
    return e->embd;
}

const float *kt_embd_cache_put(kt_embd_cache *c, uint64_t hash, float *embd, size_t n_floats) {
    entry *e = unlink_entry(c, hash);
    if (e) {
        push_front(c, e);
        if (e->n_floats == n_floats) {
            free(embd);
            e->pins++;
            return e->embd;
        }
        if (e->pins) { /* a shape clash under a pinned entry: keep it, hand back nothing */
            free(embd);
            return NULL;
        }
        c->stats.bytes -= e->n_floats * sizeof(float);
        free(e->embd);
    } else if (!(e = calloc(1, sizeof *e))) {
        free(embd);
        return NULL;
    } else {
        e->hash = hash;
        c->stats.n_entries++;
        push_front(c, e);
    }
    e->embd = embd, e->n_floats = n_floats, e->pins = 1;
    c->stats.bytes += n_floats * sizeof(float);
    trim(c);
    return embd;
}

void kt_embd_cache_unpin(kt_embd_cache *c, uint64_t hash) {
    for (entry *e = c->head; e; e = e->next)
        if (e->hash == hash) {
            if (e->pins > 0) e->pins--;
            break;
        }
    trim(c);
}

kt_embd_cache_stats kt_embd_cache_get_stats(const kt_embd_cache *c) {
    return c->stats;
}
