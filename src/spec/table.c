/*
 * table.c - the cross-request n-gram table (see table.h).
 *
 * Positions are counted from the table's start (uint64_t, never reused);
 * position p lives at ring[p % cap]. A run starts with a separator (-1),
 * so no n-gram crosses from one run into the next. index[h] holds 1 + the
 * position just after the latest n-gram hashing to h (0: empty).
 *
 * Invariant (relied on by propose): a position q is still in the ring iff
 * q + cap > n_written; the n-gram before it and the tokens after it are
 * read only from positions that pass that test.
 */
#include "spec/table.h"

#include <stdlib.h>
#include <string.h>

#define SEP (-1)

struct spec_table {
    int32_t *ring;
    size_t cap;
    uint64_t n_written;
    uint64_t *index;
    size_t index_mask; /* index size - 1 (a power of two) */
};

spec_table *spec_table_new(size_t cap) {
    if (cap < 64) cap = 64;
    size_t slots = 1;
    while (slots < 2 * cap) slots <<= 1;
    spec_table *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->ring = malloc(sizeof *t->ring * cap);
    t->index = calloc(slots, sizeof *t->index);
    if (!t->ring || !t->index) {
        spec_table_free(t);
        return NULL;
    }
    t->cap = cap, t->index_mask = slots - 1;
    return t;
}

void spec_table_free(spec_table *t) {
    if (!t) return;
    free(t->ring);
    free(t->index);
    free(t);
}

size_t spec_table_bytes(const spec_table *t) {
    return t->cap * sizeof *t->ring + (t->index_mask + 1) * sizeof *t->index;
}

static size_t hash_ngram(const int32_t *g) {
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < SPEC_TABLE_NGRAM; i++) h = (h ^ (uint32_t)g[i]) * 0xff51afd7ed558ccdull, h ^= h >> 29;
    return (size_t)h;
}

static int32_t at(const spec_table *t, uint64_t pos) {
    return t->ring[pos % t->cap];
}

static void put(spec_table *t, int32_t tok) {
    t->ring[t->n_written % t->cap] = tok;
    t->n_written++;
    if (t->n_written < SPEC_TABLE_NGRAM) return;
    int32_t g[SPEC_TABLE_NGRAM];
    for (int i = 0; i < SPEC_TABLE_NGRAM; i++) {
        g[i] = at(t, t->n_written - SPEC_TABLE_NGRAM + (uint64_t)i);
        if (g[i] == SEP) return; /* not an n-gram of one run */
    }
    t->index[hash_ngram(g) & t->index_mask] = t->n_written + 1;
}

void spec_table_add(spec_table *t, const int32_t *tokens, int n) {
    if (n <= 0) return;
    if ((size_t)n >= t->cap) tokens += (size_t)n - (t->cap - 1), n = (int)(t->cap - 1);
    put(t, SEP);
    for (int i = 0; i < n; i++) put(t, tokens[i] < 0 ? SEP : tokens[i]);
}

int spec_table_propose(const spec_table *t, const int32_t *ctx, int n, int k, int32_t *out) {
    if (n < SPEC_TABLE_NGRAM || k <= 0) return 0;
    const int32_t *g = ctx + n - SPEC_TABLE_NGRAM;
    const uint64_t slot = t->index[hash_ngram(g) & t->index_mask];
    if (slot == 0) return 0;
    const uint64_t after = slot - 1; /* the position after the n-gram */
    if (after < SPEC_TABLE_NGRAM || after - SPEC_TABLE_NGRAM + t->cap <= t->n_written) return 0; /* overwritten */
    for (int i = 0; i < SPEC_TABLE_NGRAM; i++)
        if (at(t, after - SPEC_TABLE_NGRAM + (uint64_t)i) != g[i]) return 0; /* a collision */
    int got = 0;
    for (uint64_t p = after; got < k && p < t->n_written && at(t, p) != SEP; p++) out[got++] = at(t, p);
    return got;
}
