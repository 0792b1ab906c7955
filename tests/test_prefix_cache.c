/*
 * test_prefix_cache.c - the prefix cache's index over the KV pool
 * (src/kv/prefix_cache.h) and the pool's idle list (block_pool.h).
 *
 * Sequences here "compute" KV by writing a signature of (token, position)
 * into every K row they hold, so a test can tell that a hit serves exactly
 * the KV computed for its tokens. After every step the pool's invariants
 * (kv_pool_check) and the index's (kv_cache_check) are verified.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "kv/block_pool.h"
#include "kv/prefix_cache.h"
#include "testutil.h"

#define BT 4 /* positions per block */

typedef struct rig {
    kv_pool *pool;
    kv_prefix_cache *cache;
} rig;

static rig rig_new(int n_blocks) {
    kv_pool_params p = {.n_blocks = n_blocks, .block_tokens = BT, .n_layer = 1, .kv_dim = 4, .type = KV_F32};
    kt_error err = {0};
    rig r = {kv_pool_new(&p, &err), NULL};
    assert_non_null(r.pool);
    r.cache = kv_cache_new(r.pool, &err);
    assert_non_null(r.cache);
    return r;
}

static void rig_free(rig *r) {
    kv_cache_free(r->cache);
    kv_pool_free(r->pool);
}

static void check(const rig *r) {
    kt_error err = {0};
    if (kv_pool_check(r->pool, &err) != KT_OK || kv_cache_check(r->cache, &err) != KT_OK) fail_msg("%s", err.msg);
}

static float signature(int32_t token, int pos) {
    return (float)token * 1000.0f + (float)pos;
}

/* Appends tokens[seq->len .. n) and "computes" their KV. */
static void compute(kv_seq *s, const int32_t *tokens, int n) {
    int from = s->len;
    kt_error err = {0};
    if (kv_seq_append(s, n - from, &err) != KT_OK) fail_msg("%s", err.msg);
    for (int p = from; p < n; p++) ((float *)kv_seq_row(s, 0, KV_K, p))[0] = signature(tokens[p], p);
}

/* Every position of s holds the KV of tokens[0..s->len). */
static void assert_kv_of(const kv_seq *s, const int32_t *tokens) {
    for (int p = 0; p < s->len; p++)
        if (((float *)kv_seq_row(s, 0, KV_K, p))[0] != signature(tokens[p], p))
            fail_msg("position %d holds %g, not the KV of token %d", p, ((float *)kv_seq_row(s, 0, KV_K, p))[0],
                     (int)tokens[p]);
}

/* A new sequence over tokens[0..n) as the engine starts one: the cached
 * prefix shared, leaving at least the last token to compute (in whole
 * blocks, or, with `partial`, going on inside a block as
 * kv_cache_acquire finds it), the rest computed and indexed; returns it,
 * with the hit's length in *hit. */
static kv_seq *start_ex(rig *r, const int32_t *tokens, int n, int *hit, bool partial) {
    kt_error err = {0};
    kv_seq *s = kv_seq_new(r->pool, &err);
    assert_non_null(s);
    int32_t blocks[65];
    if (partial) {
        kv_cache_hit h;
        int m = kv_cache_acquire(r->cache, tokens, n - 1, blocks, 64, true, &h);
        assert_true(h.n_positions <= n - 1 && h.n_positions > (m - 1) * BT && h.n_positions <= m * BT);
        if (m) assert_int_equal(kv_seq_share(s, blocks, m, h.n_positions, &err), KT_OK);
        for (int i = 0; i < m; i++) kv_pool_release(r->pool, blocks[i], NULL);
        *hit = m ? h.n_positions : 0;
    } else {
        int m = kv_cache_lookup(r->cache, tokens, n - 1, blocks, 64);
        if (m) assert_int_equal(kv_seq_share(s, blocks, m, m * BT, &err), KT_OK);
        *hit = m * BT;
    }
    compute(s, tokens, n);
    assert_kv_of(s, tokens);
    kv_cache_insert(r->cache, s, tokens, n, false);
    check(r);
    return s;
}

static kv_seq *start(rig *r, const int32_t *tokens, int n, int *hit) {
    return start_ex(r, tokens, n, hit, false);
}

/* The sequence ends as a request's does: everything it holds is indexed,
 * its partial last block too, and it is freed. */
static void finish(rig *r, kv_seq *s, const int32_t *tokens) {
    kv_cache_insert(r->cache, s, tokens, s->len, true);
    kv_seq_free(s);
    check(r);
}

static void test_hit_partial_miss(void **state) {
    (void)state;
    rig r = rig_new(32);
    int32_t a[14], b[14], blocks[8];
    for (int i = 0; i < 14; i++) a[i] = b[i] = 10 + i;
    int hit;
    kv_seq *s = start(&r, a, 14, &hit);
    assert_int_equal(hit, 0);
    assert_int_equal(kv_cache_n_blocks(r.cache), 3); /* 3 whole blocks; the 4th is partial */
    assert_int_equal(kv_cache_lookup(r.cache, a, 14, blocks, 8), 3);
    for (int i = 0; i < 3; i++) assert_int_equal(blocks[i], s->blocks[i]);
    assert_int_equal(kv_cache_lookup(r.cache, a, 11, blocks, 8), 2); /* whole blocks only */
    assert_int_equal(kv_cache_lookup(r.cache, a, 14, blocks, 1), 1); /* at most max_blocks */
    b[5] = 999;                                                      /* differs in block 1 */
    assert_int_equal(kv_cache_lookup(r.cache, b, 14, blocks, 8), 1);
    b[0] = 999;
    assert_int_equal(kv_cache_lookup(r.cache, b, 14, blocks, 8), 0);
    /* a second sequence with the same start shares the blocks */
    kv_seq *t = start(&r, a, 13, &hit);
    assert_int_equal(hit, 12);
    for (int i = 0; i < 3; i++) assert_int_equal(t->blocks[i], s->blocks[i]);
    assert_int_equal(kv_pool_refcount(r.pool, s->blocks[0]), 2);
    kv_seq_free(s), kv_seq_free(t);
    check(&r);
    assert_int_equal(kv_pool_n_used(r.pool), 0);
    assert_int_equal(kv_pool_n_idle(r.pool), 3); /* cached, nobody holds them */
    assert_int_equal(kv_cache_lookup(r.cache, a, 14, blocks, 8), 3); /* still found */
    rig_free(&r);
}

/* A hit that ends inside a block: in a whole cached block whose first
 * positions match, and in the tail a finished sequence left (an agent's
 * turn N+1 re-sends all of turn N). The shared block is copied before it
 * is written, so its cached KV stays as it was. */
static void test_hit_inside_block(void **state) {
    (void)state;
    rig r = rig_new(32);
    int32_t a[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, b[9] = {1, 2, 3, 4, 5, 6, 70, 80, 90};
    int32_t c[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    int hit;
    kv_seq *s = start_ex(&r, a, 10, &hit, true);
    assert_int_equal(hit, 0);
    assert_int_equal(kv_cache_n_blocks(r.cache), 2); /* a running sequence's tail is not indexed */
    int32_t tail = s->blocks[2];
    finish(&r, s, a);
    assert_int_equal(kv_cache_n_blocks(r.cache), 3); /* now its tail [9, 10] is */
    /* diverges at position 6: block 1 matches for 2 positions */
    kv_seq *t = start_ex(&r, b, 9, &hit, true);
    assert_int_equal(hit, 6);
    finish(&r, t, b);
    /* extends a: the whole blocks and a's tail */
    kv_seq *u = start_ex(&r, c, 12, &hit, true);
    assert_int_equal(hit, 10);
    assert_true(u->blocks[2] != tail); /* copied before positions 10, 11 were written */
    kv_seq_free(u);
    check(&r);
    /* a's tail still holds a's KV (start_ex checks every position) */
    kv_seq *v = start_ex(&r, a, 10, &hit, true);
    assert_int_equal(hit, 9); /* one token is always left to compute */
    finish(&r, v, a);
    assert_int_equal(kv_cache_n_blocks(r.cache), 6); /* a's 3, b's last two, c's last; a's tail again is not new */
    /* the whole-block lookup knows nothing of tails */
    int32_t blocks[4];
    assert_int_equal(kv_cache_lookup(r.cache, c, 11, blocks, 4), 2);
    assert_int_equal(kv_pool_n_used(r.pool), 0);
    rig_free(&r);
}

/* A hit block is evicted only when nobody holds it; evicting a parent
 * leaves no child that a walk could reach. */
static void test_tail_after_eviction(void **state) {
    (void)state;
    rig r = rig_new(3);
    int32_t a[6] = {1, 2, 3, 4, 5, 6}, b[12] = {9, 9, 9, 9, 8, 8, 8, 8, 7, 7, 7, 7};
    int hit;
    kv_seq *s = start_ex(&r, a, 6, &hit, true);
    finish(&r, s, a); /* block [1..4] and tail [5, 6] idle */
    kv_seq *t = start_ex(&r, b, 12, &hit, true); /* needs all 3 blocks: both evicted */
    assert_int_equal(hit, 0);
    assert_int_equal(kv_cache_n_evicted(r.cache), 2);
    kv_seq_free(t);
    check(&r);
    kv_seq *u = start_ex(&r, a, 6, &hit, true);
    assert_int_equal(hit, 0);
    kv_seq_free(u);
    check(&r);
    rig_free(&r);
}

/* The same tokens after another prefix are another entry: a block is found
 * only through the chain of the blocks before it. */
static void test_chain_not_confused(void **state) {
    (void)state;
    rig r = rig_new(32);
    int32_t a[8] = {1, 2, 3, 4, 7, 7, 7, 7}, b[8] = {5, 6, 7, 8, 7, 7, 7, 7}, blocks[4];
    int hit;
    kv_seq *s = start(&r, a, 8, &hit), *t = start(&r, b, 8, &hit);
    assert_int_equal(hit, 0);
    assert_int_equal(kv_cache_n_blocks(r.cache), 4);
    assert_int_equal(kv_cache_lookup(r.cache, b, 8, blocks, 4), 2);
    assert_int_equal(blocks[1], t->blocks[1]);
    assert_true(blocks[1] != s->blocks[1]);
    kv_seq_free(s), kv_seq_free(t);
    check(&r);
    rig_free(&r);
}

/* Idle cached blocks are taken back only when no block is free, oldest
 * first, and a sequence's tail before its prefix. */
static void test_eviction_order(void **state) {
    (void)state;
    rig r = rig_new(8);
    int32_t a[12], blocks[4];
    for (int i = 0; i < 12; i++) a[i] = 100 + i;
    int hit;
    kv_seq *s = start(&r, a, 12, &hit);
    int32_t a0 = s->blocks[0], a2 = s->blocks[2];
    kv_seq_free(s);
    check(&r);
    assert_int_equal(kv_pool_n_free(r.pool), 5);
    assert_int_equal(kv_pool_n_idle(r.pool), 3);
    /* five free blocks go first: the cached ones stay */
    kt_error err = {0};
    kv_seq *other = kv_seq_new(r.pool, &err);
    assert_int_equal(kv_seq_append(other, 5 * BT, &err), KT_OK);
    assert_int_equal(kv_cache_lookup(r.cache, a, 12, blocks, 4), 3);
    /* then the leaf */
    assert_int_equal(kv_seq_append(other, BT, &err), KT_OK);
    assert_int_equal(other->blocks[5], a2);
    assert_int_equal(kv_cache_lookup(r.cache, a, 12, blocks, 4), 2);
    assert_int_equal(kv_cache_n_evicted(r.cache), 1);
    check(&r);
    /* a hit revives block 0, which then cannot be taken; t's new block is
     * the last idle one (block 1 is cached, but the last token of a
     * prompt is always computed) */
    kv_seq *t = start(&r, a, 8, &hit);
    assert_int_equal(hit, 4);
    assert_int_equal(t->blocks[0], a0);
    assert_int_equal(kv_cache_n_evicted(r.cache), 2);
    assert_int_equal(kv_pool_n_used(r.pool), 8);
    assert_false(kv_pool_can_alloc(r.pool, 1));
    assert_int_equal(kv_seq_append(other, BT, &err), KT_ERR_NOMEM); /* t's blocks are never taken */
    assert_kv_of(t, a);
    kv_seq_free(t), kv_seq_free(other);
    check(&r);
    assert_int_equal(kv_pool_n_used(r.pool), 0);
    rig_free(&r);
}

/* A sequence that shares a cached block and writes past its end inside it
 * gets a copy: the cached content never changes. */
static void test_cached_block_never_written(void **state) {
    (void)state;
    rig r = rig_new(8);
    int32_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[8] = {1, 2, 3, 4, 5, 6, 70, 80}, blocks[2];
    int hit;
    kv_seq *s = start(&r, a, 8, &hit);
    kv_seq_free(s);
    kt_error err = {0};
    kv_seq *t = kv_seq_new(r.pool, &err);
    assert_int_equal(kv_cache_lookup(r.cache, a, 8, blocks, 2), 2);
    assert_int_equal(kv_seq_share(t, blocks, 2, 6, &err), KT_OK); /* ends inside block 1 */
    compute(t, b, 8);
    assert_kv_of(t, b);
    assert_true(t->blocks[1] != blocks[1]); /* copied */
    kv_seq_free(t);
    kv_seq *u = start(&r, a, 8, &hit); /* the cached block still holds a's KV */
    assert_int_equal(hit, 4);
    assert_int_equal(kv_cache_lookup(r.cache, a, 8, blocks, 2), 2);
    kv_seq_free(u);
    /* wrong counts are refused, changing nothing */
    kv_seq *v = kv_seq_new(r.pool, &err);
    assert_int_equal(kv_seq_share(v, blocks, 2, 9, &err), KT_ERR_ARG);
    assert_int_equal(v->len, 0);
    kv_seq_free(v);
    check(&r);
    rig_free(&r);
}

/* Random sequences over a few shared prefixes, freed in random order, in a
 * pool too small to keep them all: every hit holds exactly the KV of its
 * tokens, the invariants hold at every step, and everything comes back. */
static void test_random_workload(void **state) {
    (void)state;
    rig r = rig_new(40);
    kt_rng rng;
    kt_rng_seed(&rng, 7);
    enum { LIVE = 4, ROUNDS = 400 };
    kv_seq *live[LIVE] = {0};
    int32_t toks[LIVE][40];
    int hits = 0, inside = 0;
    for (int round = 0; round < ROUNDS; round++) {
        int k = (int)(kt_rng_u64(&rng) % LIVE);
        if (live[k]) {
            assert_kv_of(live[k], toks[k]);
            finish(&r, live[k], toks[k]);
            live[k] = NULL;
            continue;
        }
        int prefix = (int)(kt_rng_u64(&rng) % 3), n = 4 + (int)(kt_rng_u64(&rng) % 36);
        for (int i = 0; i < n; i++)
            toks[k][i] = i < 16 ? prefix * 100 + i : (int32_t)(kt_rng_u64(&rng) % 3) + 1000 * prefix;
        int held = 0;
        for (int j = 0; j < LIVE; j++) held += live[j] ? live[j]->n_blocks : 0;
        if (held + kv_blocks_for(r.pool, n) > 40) continue; /* admission's job, not the cache's */
        int hit;
        live[k] = start_ex(&r, toks[k], n, &hit, true);
        hits += hit > 0;
        inside += hit % BT != 0;
    }
    for (int j = 0; j < LIVE; j++) kv_seq_free(live[j]);
    check(&r);
    assert_int_equal(kv_pool_n_used(r.pool), 0);
    assert_int_equal(kv_pool_n_free(r.pool) + kv_pool_n_idle(r.pool), 40);
    assert_true(hits > ROUNDS / 8);
    assert_true(inside > ROUNDS / 16); /* hits that end inside a block */
    assert_true(kv_cache_n_evicted(r.cache) > 0);
    printf("random workload: %d hits (%d inside a block), %llu evictions\n", hits, inside,
           (unsigned long long)kv_cache_n_evicted(r.cache));
    rig_free(&r);
}

/* ---- hybrid models: recurrent-state snapshots ---- */

/* A stand-in recurrent state: a hash folded over (token, position), kept
 * in the first float's bits, so a resumed sequence can tell that the
 * state it got is exactly the one after its prefix. */
static uint32_t fold(uint32_t h, int32_t token, int pos) {
    return (h ^ (uint32_t)(token * 31 + pos)) * 16777619u;
}

static uint32_t state_of_tokens(const int32_t *tokens, int n) {
    uint32_t h = 2166136261u;
    for (int p = 0; p < n; p++) h = fold(h, tokens[p], p);
    return h;
}

static uint32_t seq_state(const kv_seq *s) {
    uint32_t h;
    memcpy(&h, s->state, sizeof h);
    return s->len == 0 ? 2166136261u : h;
}

/* compute() that also moves the state on. */
static void compute_hybrid(kv_seq *s, const int32_t *tokens, int n) {
    uint32_t h = seq_state(s);
    for (int p = s->len; p < n; p++) h = fold(h, tokens[p], p);
    compute(s, tokens, n);
    memcpy(s->state, &h, sizeof h);
}

/* The state after s's len positions, snapshotted and hung (as the
 * engine does at a prompt's block boundary and a generation's end). */
static bool snapshot(rig *r, const kv_seq *s, const int32_t *tokens) {
    int slot = kv_cache_state_reserve(r->cache);
    assert_true(slot >= 0);
    memcpy(kv_cache_state_data(r->cache, slot), s->state, kv_cache_state_bytes(r->cache));
    return kv_cache_state_hang(r->cache, slot, tokens, s->len);
}

static rig rig_new_hybrid(int n_blocks, int n_seqs, int n_snaps) {
    kv_pool_params p = {.n_blocks = n_blocks, .block_tokens = BT, .n_layer = 1, .kv_dim = 4, .type = KV_F32,
                        .state_bytes = 2 * sizeof(float), .n_state_slots = n_seqs};
    kt_error err = {0};
    rig r = {kv_pool_new(&p, &err), NULL};
    assert_non_null(r.pool);
    r.cache = kv_cache_new(r.pool, &err);
    assert_non_null(r.cache);
    assert_int_equal(kv_cache_enable_states(r.cache, n_snaps, 2 * sizeof(float), &err), KT_OK);
    return r;
}

/* A hybrid sequence started as the engine starts one: the hit (if any)
 * ends at a snapshot and comes with exactly the state after its prefix;
 * the rest is computed with a snapshot at a block boundary `at` (0:
 * none) and indexed. */
static kv_seq *start_hybrid(rig *r, const int32_t *tokens, int n, int at, int *hit) {
    kt_error err = {0};
    kv_seq *s = kv_seq_new(r->pool, &err);
    assert_non_null(s);
    int32_t blocks[65];
    kv_cache_hit h;
    int m = kv_cache_acquire(r->cache, tokens, n - 1, blocks, 64, true, &h);
    if (m) {
        assert_true(h.state >= 0);
        uint32_t got;
        memcpy(&got, kv_cache_state_data(r->cache, h.state), sizeof got);
        if (got != state_of_tokens(tokens, h.n_positions))
            fail_msg("a hit of %d positions came with another prefix's state", h.n_positions);
        assert_int_equal(kv_seq_share_state(s, blocks, m, h.n_positions, kv_cache_state_data(r->cache, h.state), &err),
                         KT_OK);
    } else {
        assert_int_equal(h.state, -1);
    }
    for (int i = 0; i < m; i++) kv_pool_release(r->pool, blocks[i], NULL);
    *hit = m ? h.n_positions : 0;
    if (at > *hit && at < n) {
        compute_hybrid(s, tokens, at);
        kv_cache_insert(r->cache, s, tokens, at, false);
        snapshot(r, s, tokens);
        check(r);
    }
    compute_hybrid(s, tokens, n);
    assert_kv_of(s, tokens);
    assert_true(seq_state(s) == state_of_tokens(tokens, n));
    kv_cache_insert(r->cache, s, tokens, n, false);
    check(r);
    return s;
}

/* A hybrid model's hit ends only where a snapshot hangs: blocks without
 * one are not served (their KV without the state would be wrong), a
 * finished sequence's tail snapshot serves a next turn to the position,
 * and a sequence refuses a prefix without its state. */
static void test_hybrid_hits_end_at_snapshots(void **state) {
    (void)state;
    rig r = rig_new_hybrid(32, 2, 4);
    int32_t t[40];
    for (int i = 0; i < 40; i++) t[i] = 500 + i;
    int hit;
    kv_seq *s = start_hybrid(&r, t, 22, 0, &hit); /* 5 whole blocks indexed, no snapshot */
    assert_int_equal(hit, 0);
    kv_seq_free(s);
    s = start_hybrid(&r, t, 22, 0, &hit);
    assert_int_equal(hit, 0); /* the blocks are there, no state for them */
    kv_cache_insert(r.cache, s, t, s->len, true);
    assert_true(snapshot(&r, s, t)); /* the generation's end: 22 positions, on the tail entry */
    kv_seq_free(s);
    check(&r);
    s = start_hybrid(&r, t, 30, 0, &hit); /* the next turn */
    assert_int_equal(hit, 22);
    kv_seq_free(s);
    s = start_hybrid(&r, t, 16, 8, &hit); /* a snapshot at 8 */
    kv_seq_free(s);
    int32_t other[40];
    memcpy(other, t, sizeof other);
    other[13] = 7; /* diverges inside the fourth block: the snapshot at 8 serves it */
    s = start_hybrid(&r, other, 20, 0, &hit);
    assert_int_equal(hit, 8);
    kv_seq_free(s);
    /* the same state twice is hung once */
    s = start_hybrid(&r, t, 12, 8, &hit);
    assert_int_equal(hit, 8);
    assert_int_equal(kv_cache_n_states(r.cache), 2);
    /* no prefix without its state */
    kt_error err = {0};
    kv_seq *bare = kv_seq_new(r.pool, &err);
    int32_t blocks[4];
    assert_int_equal(kv_cache_lookup(r.cache, t, 11, blocks, 4), 2);
    assert_int_equal(kv_seq_share(bare, blocks, 2, 8, &err), KT_ERR_ARG);
    assert_non_null(strstr(err.msg, "state"));
    kv_seq_free(bare), kv_seq_free(s);
    check(&r);
    rig_free(&r);
}

/* Random hybrid sequences over a few shared prefixes, snapshots at random
 * block boundaries and at every end, far more snapshots wanted than the
 * budget holds and more blocks than the pool: every hit comes with the
 * state of exactly its prefix, the invariants (snapshots and entries
 * naming each other, no more hung than slots) hold after every step, and
 * snapshots leave both with their blocks and least recently used first. */
static void test_hybrid_random_workload(void **state) {
    (void)state;
    enum { LIVE = 4, ROUNDS = 600, SNAPS = 6, BLOCKS = 48 };
    rig r = rig_new_hybrid(BLOCKS, LIVE, SNAPS);
    kt_rng rng;
    kt_rng_seed(&rng, 11);
    kv_seq *live[LIVE] = {0};
    int32_t toks[LIVE][48];
    int hits = 0, inside = 0;
    for (int round = 0; round < ROUNDS; round++) {
        int k = (int)(kt_rng_u64(&rng) % LIVE);
        if (live[k]) {
            kv_cache_insert(r.cache, live[k], toks[k], live[k]->len, true);
            snapshot(&r, live[k], toks[k]);
            kv_seq_free(live[k]);
            live[k] = NULL;
            check(&r);
            assert_true(kv_cache_n_states(r.cache) <= SNAPS);
            continue;
        }
        int prefix = (int)(kt_rng_u64(&rng) % 3), n = 4 + (int)(kt_rng_u64(&rng) % 44);
        for (int i = 0; i < n; i++)
            toks[k][i] = i < 20 ? prefix * 100 + i : (int32_t)(kt_rng_u64(&rng) % 3) + 1000 * prefix;
        int held = 0;
        for (int j = 0; j < LIVE; j++) held += live[j] ? live[j]->n_blocks : 0;
        if (held + kv_blocks_for(r.pool, n) > BLOCKS) continue;
        int hit, at = (int)(kt_rng_u64(&rng) % (size_t)(n / BT + 1)) * BT;
        live[k] = start_hybrid(&r, toks[k], n, at, &hit);
        hits += hit > 0;
        inside += hit % BT != 0;
    }
    for (int j = 0; j < LIVE; j++) kv_seq_free(live[j]);
    check(&r);
    assert_int_equal(kv_pool_n_used(r.pool), 0);
    assert_true(hits > ROUNDS / 8);
    assert_true(inside > 0); /* tail snapshots */
    assert_true(kv_cache_n_states_evicted(r.cache) > 0);
    assert_true(kv_cache_n_evicted(r.cache) > 0);
    printf("hybrid random workload: %d hits (%d at a tail), %llu snapshots and %llu blocks evicted\n", hits, inside,
           (unsigned long long)kv_cache_n_states_evicted(r.cache), (unsigned long long)kv_cache_n_evicted(r.cache));
    rig_free(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hit_partial_miss),
        cmocka_unit_test(test_hit_inside_block),
        cmocka_unit_test(test_tail_after_eviction),
        cmocka_unit_test(test_chain_not_confused),
        cmocka_unit_test(test_eviction_order),
        cmocka_unit_test(test_cached_block_never_written),
        cmocka_unit_test(test_random_workload),
        cmocka_unit_test(test_hybrid_hits_end_at_snapshots),
        cmocka_unit_test(test_hybrid_random_workload),
    };
    return tu_result(cmocka_run_group_tests(tests, NULL, NULL));
}
