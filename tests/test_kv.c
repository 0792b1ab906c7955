/*
 * test_kv.c - the paged KV block pool and block tables (src/kv).
 *
 * What is checked:
 *   - layout: every row address follows the formula documented in
 *     block_pool.h, and no two (block, layer, kind, position) rows overlap;
 *   - alloc/retain/release accounting, and errors (never crashes) for
 *     exhaustion, double release, bad parameters and sizes that overflow;
 *   - a sequence: append allocates blocks as needed, all or nothing;
 *     truncate releases whole blocks; fork shares blocks by refcount and a
 *     write after fork copies the shared block without changing the other
 *     sequence's data (values written and read back through the addressing
 *     functions);
 *   - a randomized stress test (sequences appending, overwriting,
 *     truncating, forking, freeing, for F32 and F16 pools): after every step
 *     the pool invariants hold, each block's refcount equals the number of
 *     table entries naming it, the free count equals the blocks nobody
 *     names, and each sequence reads back exactly what it wrote;
 *   - the same with window layers (a sliding-window layer among full
 *     ones, fewer window slots than blocks), plus cache-and-share of freed
 *     sequences: W1-W4 after every step, a sequence holds at most its
 *     window's slots, a share is refused exactly when
 *     kv_pool_window_covers says the window is gone, a rollback past the
 *     window is refused and changes nothing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#include "base/rng.h"
#include "kv/block_pool.h"
#include "kv/state_pool.h"

static kv_pool *make_pool(int n_blocks, int bt, int n_layer, int kv_dim, kv_type t) {
    kv_pool_params p = {n_blocks, bt, n_layer, kv_dim, t, 0, NULL, 0, 0, 0};
    kt_error err = {0};
    kv_pool *pool = kv_pool_new(&p, &err);
    if (!pool) fail_msg("kv_pool_new: %s", err.msg);
    return pool;
}

static void assert_pool_ok(const kv_pool *pool) {
    kt_error err = {0};
    if (kv_pool_check(pool, &err) != KT_OK) fail_msg("%s", err.msg);
}

/* The value stored at element d of (tag, layer, kind): distinct per input. */
static uint32_t elem_value(uint32_t tag, int layer, int kind, int d) {
    return tag * 1000u + (uint32_t)layer * 100u + (uint32_t)kind * 50u + (uint32_t)d;
}

/* Writes the row of pos with values derived from tag (raw bytes: the pool
 * does not interpret them; F16 rows keep the low 16 bits). */
/* A window layer has rows only from the sequence's win_lo block on. */
static bool has_row(const kv_seq *s, int layer, int pos) {
    return !kv_pool_layer_windowed(s->pool, layer) || pos >= s->win_lo * s->block_tokens;
}

static void write_pos(kv_seq *s, int pos, uint32_t tag) {
    const kv_pool_params *p = kv_pool_get_params(s->pool);
    for (int l = 0; l < p->n_layer; l++)
        for (int k = 0; k < 2 && has_row(s, l, pos); k++) {
            void *row = kv_seq_row(s, l, (kv_kind)k, pos);
            for (int d = 0; d < p->kv_dim; d++) {
                uint32_t v = elem_value(tag, l, k, d);
                if (p->type == KV_F32) ((uint32_t *)row)[d] = v;
                else ((uint16_t *)row)[d] = (uint16_t)v;
            }
        }
}

/* True if the row of pos holds exactly what write_pos(tag) wrote. */
static bool pos_holds(const kv_seq *s, int pos, uint32_t tag) {
    const kv_pool_params *p = kv_pool_get_params(s->pool);
    for (int l = 0; l < p->n_layer; l++)
        for (int k = 0; k < 2 && has_row(s, l, pos); k++) {
            const void *row = kv_seq_row(s, l, (kv_kind)k, pos);
            for (int d = 0; d < p->kv_dim; d++) {
                uint32_t v = elem_value(tag, l, k, d);
                bool ok = p->type == KV_F32 ? ((const uint32_t *)row)[d] == v
                                            : ((const uint16_t *)row)[d] == (uint16_t)v;
                if (!ok) return false;
            }
        }
    return true;
}

static kv_seq *new_seq(kv_pool *pool) {
    kt_error err = {0};
    kv_seq *s = kv_seq_new(pool, &err);
    if (!s) fail_msg("kv_seq_new: %s", err.msg);
    return s;
}

static void append_ok(kv_seq *s, int n) {
    kt_error err = {0};
    if (kv_seq_append(s, n, &err) != KT_OK) fail_msg("kv_seq_append: %s", err.msg);
}

/* ---- pool ----------------------------------------------------------- */

static void test_layout(void **state) {
    (void)state;
    enum { NB = 5, BT = 4, NL = 3, DIM = 7 };
    kv_pool *pool = make_pool(NB, BT, NL, DIM, KV_F16);
    size_t row = (size_t)DIM * 2, block = row * BT, plane = block * NB;
    assert_int_equal(kv_row_bytes(KV_F32, 64), 256);
    assert_int_equal(kv_row_bytes(KV_F16, 64), 128);
    assert_int_equal(kv_row_bytes(KV_Q8_0, 64), 68);
    assert_int_equal(kv_row_bytes(KV_Q8_0, 48), 0); /* not whole blocks */
    assert_int_equal(kv_pool_row_bytes(pool), row);
    assert_int_equal(kv_pool_block_bytes(pool), block);
    uint8_t *base = kv_pool_plane(pool, 0, KV_K);
    assert_int_equal((uintptr_t)base % 64, 0);
    /* The formula, and every row once: offsets are distinct multiples of
     * row inside [0, total) exactly when the map is a bijection. */
    size_t total = plane * 2 * NL, n_rows = total / row;
    uint8_t *seen = calloc(n_rows, 1);
    assert_non_null(seen);
    for (int b = 0; b < NB; b++)
        for (int l = 0; l < NL; l++)
            for (int k = 0; k < 2; k++)
                for (int p = 0; p < BT; p++) {
                    uint8_t *r = kv_pool_row(pool, b, l, (kv_kind)k, p);
                    size_t off = (size_t)(r - base);
                    assert_int_equal(off, (size_t)(l * 2 + k) * plane + (size_t)b * block +
                                              (size_t)p * row);
                    assert_ptr_equal(kv_pool_plane(pool, l, (kv_kind)k),
                                     base + (size_t)(l * 2 + k) * plane);
                    assert_true(off < total && seen[off / row] == 0);
                    seen[off / row] = 1;
                    memset(r, 0xab, row); /* the whole row is addressable (ASan) */
                }
    free(seen);
    kv_pool_free(pool);
}

static void test_alloc_free(void **state) {
    (void)state;
    enum { NB = 8 };
    kv_pool *pool = make_pool(NB, 16, 2, 4, KV_F32);
    assert_int_equal(kv_pool_n_total(pool), NB);
    assert_int_equal(kv_pool_n_free(pool), NB);
    assert_int_equal(kv_pool_n_used(pool), 0);
    int32_t ids[NB];
    uint8_t seen[NB] = {0};
    for (int i = 0; i < NB; i++) {
        assert_int_equal(kv_pool_alloc(pool, &ids[i], NULL), KT_OK);
        assert_true(ids[i] >= 0 && ids[i] < NB && !seen[ids[i]]);
        seen[ids[i]] = 1;
        assert_int_equal(kv_pool_refcount(pool, ids[i]), 1);
        assert_int_equal(kv_pool_n_used(pool), i + 1);
        assert_pool_ok(pool);
    }
    assert_int_equal(kv_pool_retain(pool, ids[3], NULL), KT_OK);
    assert_int_equal(kv_pool_refcount(pool, ids[3]), 2);
    assert_int_equal(kv_pool_release(pool, ids[3], NULL), KT_OK);
    assert_int_equal(kv_pool_n_free(pool), 0); /* still held once */
    assert_int_equal(kv_pool_release(pool, ids[3], NULL), KT_OK);
    assert_int_equal(kv_pool_n_free(pool), 1);
    assert_int_equal(kv_pool_refcount(pool, ids[3]), 0);
    /* Misuse is an error value, and changes nothing. */
    kt_error err = {0};
    assert_int_equal(kv_pool_release(pool, ids[3], &err), KT_ERR_INTERNAL);
    assert_non_null(strstr(err.msg, "release of free block"));
    assert_int_equal(kv_pool_retain(pool, ids[3], NULL), KT_ERR_INTERNAL);
    assert_int_equal(kv_pool_retain(pool, NB, NULL), KT_ERR_INTERNAL);
    assert_int_equal(kv_pool_release(pool, -1, NULL), KT_ERR_INTERNAL);
    assert_int_equal(kv_pool_refcount(pool, NB), -1);
    assert_int_equal(kv_pool_n_free(pool), 1);
    assert_pool_ok(pool);
    /* The freed block is the one handed out next (a stack). */
    int32_t again = -1;
    assert_int_equal(kv_pool_alloc(pool, &again, NULL), KT_OK);
    assert_int_equal(again, ids[3]);
    for (int i = 0; i < NB; i++) assert_int_equal(kv_pool_release(pool, ids[i], NULL), KT_OK);
    assert_int_equal(kv_pool_n_free(pool), NB);
    assert_pool_ok(pool);
    kv_pool_free(pool);
}

static void test_bad_params(void **state) {
    (void)state;
    kt_error err = {0};
    kv_pool_params p = {0, 16, 2, 4, KV_F16, 0, NULL, 0, 0, 0};
    assert_null(kv_pool_new(&p, &err));
    assert_int_equal(err.status, KT_ERR_ARG);
    p = (kv_pool_params){4, 16, 2, 4, (kv_type)7, 0, NULL, 0, 0, 0};
    assert_null(kv_pool_new(&p, &err));
    assert_int_equal(err.status, KT_ERR_ARG);
    assert_non_null(strstr(err.msg, "element type 7"));
    p = (kv_pool_params){4, 16, 2, 48, KV_Q8_0, 0, NULL, 0, 0, 0}; /* rows not whole Q8_0 blocks */
    assert_null(kv_pool_new(&p, &err));
    assert_non_null(strstr(err.msg, "multiple of 32"));
    p = (kv_pool_params){INT32_MAX, INT32_MAX, INT32_MAX, INT32_MAX, KV_F32, 0, NULL, 0, 0, 0};
    memset(&err, 0, sizeof err);
    assert_null(kv_pool_new(&p, &err));
    assert_int_equal(err.status, KT_ERR_ARG);
    assert_non_null(strstr(err.msg, "overflows"));
    assert_null(kv_pool_new(NULL, NULL));
}

static void test_exhaustion(void **state) {
    (void)state;
    enum { NB = 4, BT = 4 };
    kv_pool *pool = make_pool(NB, BT, 1, 2, KV_F32);
    kv_seq *a = new_seq(pool);
    append_ok(a, 3 * BT - 1); /* 3 blocks */
    assert_int_equal(kv_pool_n_free(pool), 1);
    assert_true(kv_pool_can_alloc(pool, 1));
    assert_false(kv_pool_can_alloc(pool, 2));
    /* Needs 2 more blocks (positions 11..16): refused, nothing changes. */
    int32_t table[3];
    memcpy(table, a->blocks, sizeof table);
    kt_error err = {0};
    assert_int_equal(kv_seq_append(a, 6, &err), KT_ERR_NOMEM);
    assert_non_null(strstr(err.msg, "KV cache full: need 2 blocks, 1 of 4 free"));
    assert_int_equal(a->len, 3 * BT - 1);
    assert_int_equal(a->n_blocks, 3);
    assert_memory_equal(a->blocks, table, sizeof table);
    assert_int_equal(kv_pool_n_free(pool), 1);
    assert_pool_ok(pool);
    /* What fits still works, then the pool is empty. */
    append_ok(a, 5);
    assert_int_equal(kv_pool_n_free(pool), 0);
    int32_t id;
    assert_int_equal(kv_pool_alloc(pool, &id, &err), KT_ERR_NOMEM);
    assert_non_null(strstr(err.msg, "all 4 blocks are in use"));
    kv_seq *b = new_seq(pool);
    assert_int_equal(kv_seq_append(b, 1, &err), KT_ERR_NOMEM);
    assert_int_equal(b->len, 0);
    /* A fork needs no blocks, but writing into its shared partial block does. */
    kv_seq_truncate(a, 4 * BT - 2, NULL);
    kv_seq *f = kv_seq_fork(a, &err);
    assert_non_null(f);
    assert_int_equal(kv_seq_append(f, 1, &err), KT_ERR_NOMEM);
    assert_int_equal(f->len, 4 * BT - 2);
    assert_int_equal(kv_seq_make_writable(f, 0, &err), KT_ERR_NOMEM);
    assert_int_equal(kv_seq_make_writable(f, f->len, &err), KT_ERR_ARG);
    assert_pool_ok(pool);
    kv_seq_free(f);
    kv_seq_free(b);
    kv_seq_free(a);
    assert_int_equal(kv_pool_n_free(pool), NB);
    assert_pool_ok(pool);
    kv_pool_free(pool);
}

/* ---- sequences ------------------------------------------------------ */

static void test_append_truncate(void **state) {
    (void)state;
    enum { BT = 4 };
    kv_pool *pool = make_pool(16, BT, 2, 3, KV_F16);
    kv_seq *s = new_seq(pool);
    append_ok(s, 0);
    assert_int_equal(s->n_blocks, 0);
    append_ok(s, 1);
    assert_int_equal(s->n_blocks, 1);
    append_ok(s, 9); /* 10 positions: 3 blocks */
    assert_int_equal(s->len, 10);
    assert_int_equal(s->n_blocks, 3);
    assert_int_equal(kv_pool_n_used(pool), 3);
    for (int p = 0; p < s->len; p++) {
        kv_loc l = kv_seq_locate(s, p);
        assert_int_equal(l.block, s->blocks[p / BT]);
        assert_int_equal(l.off, p % BT);
        write_pos(s, p, (uint32_t)p + 1);
    }
    kt_error err = {0};
    assert_int_equal(kv_seq_append(s, -1, &err), KT_ERR_ARG);
    kv_seq_truncate(s, 20, NULL); /* past the end: nothing */
    assert_int_equal(s->len, 10);
    kv_seq_truncate(s, 8, NULL); /* block 2 wholly past: released */
    assert_int_equal(s->n_blocks, 2);
    assert_int_equal(kv_pool_n_used(pool), 2);
    kv_seq_truncate(s, 5, NULL); /* block 1 still holds position 4 */
    assert_int_equal(s->n_blocks, 2);
    for (int p = 0; p < 5; p++) assert_true(pos_holds(s, p, (uint32_t)p + 1));
    append_ok(s, 3); /* refills block 1, no new block */
    assert_int_equal(kv_pool_n_used(pool), 2);
    kv_seq_truncate(s, -3, NULL);
    assert_int_equal(s->len, 0);
    assert_int_equal(s->n_blocks, 0);
    assert_int_equal(kv_pool_n_free(pool), 16);
    assert_pool_ok(pool);
    kv_seq_free(s);
    kv_pool_free(pool);
}

static void test_fork_cow(void **state) {
    (void)state;
    enum { BT = 4 };
    kv_pool *pool = make_pool(16, BT, 2, 5, KV_F32);
    kv_seq *a = new_seq(pool);
    append_ok(a, 10);
    for (int p = 0; p < 10; p++) write_pos(a, p, 100 + (uint32_t)p);
    kt_error err = {0};
    kv_seq *b = kv_seq_fork(a, &err);
    assert_non_null(b);
    assert_int_equal(b->len, 10);
    assert_memory_equal(b->blocks, a->blocks, 3 * sizeof(int32_t));
    for (int i = 0; i < 3; i++) assert_int_equal(kv_pool_refcount(pool, a->blocks[i]), 2);
    assert_int_equal(kv_pool_n_used(pool), 3);
    /* b writes position 10 (in the shared partial block 2): b gets a copy. */
    int32_t shared_last = a->blocks[2];
    append_ok(b, 1);
    write_pos(b, 10, 555);
    assert_int_not_equal(b->blocks[2], shared_last);
    assert_int_equal(a->blocks[2], shared_last);
    assert_int_equal(kv_pool_refcount(pool, shared_last), 1);
    assert_int_equal(kv_pool_refcount(pool, b->blocks[2]), 1);
    assert_int_equal(kv_pool_refcount(pool, a->blocks[0]), 2);
    assert_int_equal(kv_pool_n_used(pool), 4);
    /* a's last block is private again: its append copies nothing. */
    append_ok(a, 1);
    write_pos(a, 10, 777);
    assert_int_equal(a->blocks[2], shared_last);
    assert_int_equal(kv_pool_n_used(pool), 4);
    for (int p = 0; p < 10; p++) {
        assert_true(pos_holds(a, p, 100 + (uint32_t)p));
        assert_true(pos_holds(b, p, 100 + (uint32_t)p)); /* copied prefix */
    }
    assert_true(pos_holds(a, 10, 777));
    assert_true(pos_holds(b, 10, 555));
    /* Overwriting a position in a shared full block copies that block. */
    assert_int_equal(kv_seq_make_writable(b, 1, &err), KT_OK);
    write_pos(b, 1, 999);
    assert_int_not_equal(b->blocks[0], a->blocks[0]);
    assert_true(pos_holds(a, 1, 101));
    assert_true(pos_holds(b, 1, 999));
    assert_true(pos_holds(b, 3, 103));
    assert_int_equal(kv_seq_make_writable(b, 1, &err), KT_OK); /* private now: no-op */
    assert_int_equal(kv_pool_n_used(pool), 5);
    /* Freeing one side leaves the other's blocks with one reference. */
    kv_seq_free(a);
    for (int i = 0; i < 3; i++) assert_int_equal(kv_pool_refcount(pool, b->blocks[i]), 1);
    assert_int_equal(kv_pool_n_used(pool), 3);
    for (int p = 2; p < 10; p++) assert_true(pos_holds(b, p, 100 + (uint32_t)p));
    assert_pool_ok(pool);
    kv_seq_free(b);
    assert_int_equal(kv_pool_n_free(pool), 16);
    kv_pool_free(pool);
}

/* ---- randomized stress ---------------------------------------------- */

enum { SLOTS = 8, MAX_LEN = 64 };

typedef struct shadow {
    kv_seq *seq;            /* NULL: slot empty */
    uint32_t tags[MAX_LEN]; /* the tag written at each position */
} shadow;

/* Every invariant of block_pool.h, and every sequence's data. */
static void check_all(const kv_pool *pool, const shadow *sh) {
    assert_pool_ok(pool);
    int nb = kv_pool_n_total(pool), bt = kv_pool_get_params(pool)->block_tokens;
    int *refs = calloc((size_t)nb, sizeof *refs), *window_refs = calloc((size_t)nb, sizeof *window_refs);
    assert_non_null(refs);
    assert_non_null(window_refs);
    /* a sequence holds its next token's window, one block of slack, and
     * what its last append (at most 12 positions) added */
    const kv_pool_params *pp = kv_pool_get_params(pool);
    const int max_held = (pp->window + 12 + bt - 1) / bt + 2;
    long total_refs = 0, total_entries = 0;
    for (int i = 0; i < SLOTS; i++) {
        const kv_seq *s = sh[i].seq;
        if (!s) continue;
        assert_int_equal(s->n_blocks, (s->len + bt - 1) / bt); /* S2 */
        total_entries += s->n_blocks;
        for (int j = 0; j < s->n_blocks; j++) refs[s->blocks[j]]++;
        if (kv_pool_n_window_layers(pool) > 0) { /* W4 */
            if (s->len > 0) assert_true(s->win_lo <= kv_window_first_block(pool, s->len));
            for (int j = 0; j < s->n_blocks; j++) {
                if (j < s->win_lo) assert_int_equal(s->slots[j], -1);
                else assert_true(kv_pool_has_window(pool, s->blocks[j]) && s->slots[j] >= 0);
                window_refs[s->blocks[j]] += j >= s->win_lo;
            }
            assert_true(s->n_blocks - s->win_lo <= max_held);
        }
        for (int p = 0; p < s->len; p++)
            if (!pos_holds(s, p, sh[i].tags[p])) fail_msg("slot %d pos %d: wrong data", i, p);
    }
    int unnamed = 0;
    for (int b = 0; b < nb; b++) {
        assert_int_equal(kv_pool_refcount(pool, b), refs[b]); /* S1 */
        total_refs += kv_pool_refcount(pool, b);
        unnamed += refs[b] == 0;
    }
    assert_int_equal(total_refs, total_entries);
    assert_int_equal(kv_pool_n_free(pool) + kv_pool_n_idle(pool), unnamed); /* free, or cached and idle */
    if (kv_pool_n_window_layers(pool) > 0) { /* the slots in use are the ones sequences hold */
        int held = 0;
        for (int b = 0; b < nb; b++) held += window_refs[b] > 0;
        assert_int_equal(kv_pool_n_window_used(pool), held);
    }
    free(refs);
    free(window_refs);
}

static uint32_t next_tag = 1;
/* How often the interesting paths ran: the test asserts each did. */
static int n_refused, n_copied, n_forked, n_shared, n_rollback_refused, n_share_refused;

/* True if entry i of s names a block shared with another table. */
static bool shared_at(const kv_seq *s, int i) {
    return kv_pool_refcount(s->pool, s->blocks[i]) > 1;
}

static void op_append(kv_pool *pool, shadow *sh, kt_rng *r) {
    kv_seq *s = sh->seq;
    int n = 1 + (int)(kt_rng_u64(r) % 12);
    if (s->len + n > MAX_LEN) n = MAX_LEN - s->len;
    int free_before = kv_pool_n_free(pool), len = s->len, bt = s->block_tokens;
    bool cow = len % bt != 0 && shared_at(s, s->n_blocks - 1);
    kt_error err = {0};
    kt_status st = kv_seq_append(s, n, &err);
    if (st != KT_OK) { /* all or nothing */
        n_refused++;
        assert_int_equal(st, KT_ERR_NOMEM);
        assert_int_equal(s->len, len);
        assert_int_equal(kv_pool_n_free(pool), free_before);
        return;
    }
    n_copied += cow;
    for (int p = len; p < s->len; p++) {
        sh->tags[p] = next_tag++;
        write_pos(s, p, sh->tags[p]);
    }
}

static void op_overwrite(shadow *sh, kt_rng *r) {
    kv_seq *s = sh->seq;
    if (s->len == 0) return;
    int pos = (int)(kt_rng_u64(r) % (uint64_t)s->len);
    bool cow = shared_at(s, pos / s->block_tokens);
    if (kv_seq_make_writable(s, pos, NULL) != KT_OK) return;
    n_copied += cow;
    sh->tags[pos] = next_tag++;
    write_pos(s, pos, sh->tags[pos]);
}

static void op_fork(shadow *sh, int from) {
    for (int i = 0; i < SLOTS; i++) {
        if (sh[i].seq) continue;
        kt_error err = {0};
        sh[i].seq = kv_seq_fork(sh[from].seq, &err);
        if (!sh[i].seq) fail_msg("fork: %s", err.msg);
        memcpy(sh[i].tags, sh[from].tags, sizeof sh[i].tags);
        n_forked++;
        return;
    }
}

/* A truncation is refused only where the window layers gave the rows
 * back, and then changes nothing. */
static void op_truncate(shadow *sh, kt_rng *r) {
    kv_seq *s = sh->seq;
    int n = (int)(kt_rng_u64(r) % (uint64_t)(s->len + 1)), len = s->len;
    kt_error err = {0};
    if (kv_seq_truncate(s, n, &err) == KT_OK) return;
    n_rollback_refused++;
    assert_int_equal(err.status, KT_ERR_ARG);
    assert_true(n > 0 && s->win_lo > kv_window_first_block(s->pool, n));
    assert_int_equal(s->len, len);
}

/* What a freed, cached sequence left (as the prefix cache remembers it):
 * its blocks with their generations, and its data. */
static struct {
    int32_t blocks[MAX_LEN];
    uint32_t gen[MAX_LEN];
    int n_blocks, len;
    uint32_t tags[MAX_LEN];
} ghost;

/* Frees sh's sequence; with `cache`, as a finished request: its blocks
 * marked cached first and remembered in the ghost. */
static void op_free(kv_pool *pool, shadow *sh, bool cache) {
    kv_seq *s = sh->seq;
    if (cache) {
        for (int j = 0; j < s->n_blocks; j++) {
            kv_pool_mark_cached(pool, s->blocks[j]);
            ghost.blocks[j] = s->blocks[j];
            ghost.gen[j] = kv_pool_generation(pool, s->blocks[j]);
        }
        ghost.n_blocks = s->n_blocks, ghost.len = s->len;
        memcpy(ghost.tags, sh->tags, sizeof ghost.tags);
    }
    kv_seq_free(s);
    sh->seq = NULL;
}

/* A new sequence in an empty shadow takes the ghost's blocks over, as a
 * prefix-cache hit does, when they are all still cached (not taken back)
 * and their window is still there: kv_pool_window_covers says whether it
 * is, and share agrees. */
static void op_cache_share(kv_pool *pool, shadow *sh) {
    for (int j = 0; j < ghost.n_blocks; j++)
        if (!kv_pool_is_cached(pool, ghost.blocks[j]) || kv_pool_generation(pool, ghost.blocks[j]) != ghost.gen[j])
            return;
    for (int i = 0; i < SLOTS; i++) {
        if (sh[i].seq) continue;
        kv_seq *t = new_seq(pool);
        bool covers = kv_pool_window_covers(pool, ghost.blocks, ghost.len);
        kt_error err = {0};
        kt_status st = kv_seq_share(t, ghost.blocks, ghost.n_blocks, ghost.len, &err);
        assert_int_equal(st, covers ? KT_OK : KT_ERR_ARG);
        if (st != KT_OK) {
            n_share_refused++;
            kv_seq_free(t);
            return;
        }
        sh[i].seq = t;
        memcpy(sh[i].tags, ghost.tags, sizeof sh[i].tags);
        n_shared++;
        return;
    }
}

static void stress_step(kv_pool *pool, shadow *sh, kt_rng *r) {
    int i = (int)(kt_rng_u64(r) % SLOTS), op = (int)(kt_rng_u64(r) % 11);
    if (!sh[i].seq) {
        sh[i].seq = new_seq(pool);
        return;
    }
    if (op < 4) op_append(pool, &sh[i], r);
    else if (op < 6) op_overwrite(&sh[i], r);
    else if (op < 8) op_truncate(&sh[i], r);
    else if (op < 9) op_fork(sh, i);
    else if (op < 10) op_cache_share(pool, sh);
    else op_free(pool, &sh[i], kt_rng_u64(r) % 2);
}

/* window 0: every layer full; else layer 1 of 3 is a window layer of
 * `window` positions with n_slots slots. */
static void run_stress(kv_type type, uint64_t seed, int window, int n_slots) {
    /* Few blocks for 8 sequences of up to 64 positions: exhaustion and
     * copy-on-write both happen often. */
    static const uint8_t windowed[3] = {0, 1, 0};
    kv_pool_params p = {40, 4, 3, 3, type, window, windowed, n_slots, 0, 0};
    kt_error err = {0};
    kv_pool *pool = kv_pool_new(&p, &err);
    if (!pool) fail_msg("kv_pool_new: %s", err.msg);
    shadow *sh = calloc(SLOTS, sizeof *sh);
    assert_non_null(sh);
    kt_rng r;
    kt_rng_seed(&r, seed);
    ghost.n_blocks = ghost.len = 0;
    n_refused = n_copied = n_forked = n_shared = n_rollback_refused = n_share_refused = 0;
    for (int step = 0; step < 4000; step++) {
        stress_step(pool, sh, &r);
        check_all(pool, sh);
    }
    for (int i = 0; i < SLOTS; i++) kv_seq_free(sh[i].seq);
    print_message("stress seed %llu, window %d: %d appends refused, %d blocks copied, %d forks, %d shares, "
                  "%d rollbacks and %d shares refused\n", (unsigned long long)seed, window, n_refused, n_copied,
                  n_forked, n_shared, n_rollback_refused, n_share_refused);
    assert_true(n_refused > 50 && n_copied > 50 && n_forked > 50 && n_shared > 50);
    if (window) assert_true(n_rollback_refused > 20 && n_share_refused > 0);
    assert_int_equal(kv_pool_n_used(pool), 0);
    assert_int_equal(kv_pool_n_window_used(pool), 0);
    assert_pool_ok(pool);
    free(sh);
    kv_pool_free(pool);
}

static void test_stress_f32(void **state) {
    (void)state;
    run_stress(KV_F32, 1, 0, 0);
    run_stress(KV_F32, 2, 0, 0);
}

static void test_stress_f16(void **state) {
    (void)state;
    run_stress(KV_F16, 3, 0, 0);
    run_stress(KV_F16, 4, 0, 0);
}

/* Window layers: a window of 6 positions in blocks of 4 (a token's window
 * spans 2 or 3 blocks), 16 slots for 40 blocks, so slots run out (and
 * idle ones are taken back) as well as blocks; and a window of 1. */
static void test_stress_window(void **state) {
    (void)state;
    run_stress(KV_F32, 5, 6, 16);
    run_stress(KV_F16, 6, 6, 16);
    run_stress(KV_F32, 7, 1, 12);
}

/* 8 blocks of 4 positions, 2 layers, kv_dim 4, and 2 recurrent-state
 * slots of 3 floats. */
static const kv_pool_params STATE_POOL = {8, 4, 2, 4, KV_F32, 0, NULL, 0, 3 * sizeof(float), 2};

static kv_pool *state_pool_new(void) {
    kt_error err = {0};
    kv_pool *pool = kv_pool_new(&STATE_POOL, &err);
    if (!pool) fail_msg("state pool: %s", err.msg);
    return pool;
}

/* A pool with recurrent state (a hybrid model): every sequence gets a
 * zeroed slot until they run out (refused, naming --parallel), the slot
 * comes back with the sequence, a fork copies it, truncation goes back
 * only to 0 (zeroing it) and a non-empty prefix cannot be shared. */
static void test_state_slots(void **state) {
    (void)state;
    kt_error err = {0};
    kv_pool *pool = state_pool_new();
    assert_true(kv_pool_has_state(pool));
    assert_int_equal(kv_params_bytes(&STATE_POOL), 8 * 2 * 2 * 4 * 4 * 4 + 2 * 3 * 4); /* KV + the slots */
    kv_seq *a = kv_seq_new(pool, &err), *b = kv_seq_new(pool, &err);
    assert_true(a && b && a->state && b->state && a->state != b->state);
    for (int i = 0; i < 3; i++) assert_true(a->state[i] == 0.0f && b->state[i] == 0.0f);
    assert_null(kv_seq_new(pool, &err)); /* two slots */
    assert_int_equal(err.status, KT_ERR_NOMEM);
    assert_non_null(strstr(err.msg, "--parallel"));
    assert_int_equal(kv_seq_append(a, 6, &err), KT_OK);
    a->state[0] = 1, a->state[1] = 2, a->state[2] = 3;
    kv_seq_free(b);
    kv_seq *f = kv_seq_fork(a, &err); /* the freed slot, with a's state */
    assert_non_null(f);
    assert_true(f->state[0] == 1 && f->state[1] == 2 && f->state[2] == 3 && f->state != a->state);
    assert_int_equal(kv_seq_truncate(a, 3, &err), KT_ERR_ARG);
    assert_int_equal(a->len, 6);
    assert_int_equal(kv_seq_truncate(a, 6, &err), KT_OK); /* no-op */
    assert_int_equal(kv_seq_truncate(a, 0, &err), KT_OK);
    assert_true(a->state[0] == 0 && a->state[1] == 0 && a->state[2] == 0 && a->len == 0);
    assert_true(f->state[0] == 1);
    assert_int_equal(kv_seq_share(a, f->blocks, 1, 4, &err), KT_ERR_ARG);
    assert_non_null(strstr(err.msg, "recurrent state"));
    kv_seq_free(a), kv_seq_free(f);
    assert_int_equal(kv_pool_n_used(pool), 0);
    assert_int_equal(kv_state_n_free(kv_pool_state(pool)), 2);
    kv_pool_free(pool);
}

/* Spares (speculation's verify passes): none until made; then a flip
 * makes the spare the slot's state and back, and what reads the slot's
 * state (fork, truncation to 0, kv_state_data) follows the flip. */
static void test_state_spares(void **state) {
    (void)state;
    kt_error err = {0};
    kv_pool *pool = state_pool_new();
    kv_seq *a = kv_seq_new(pool, &err);
    assert_non_null(a);
    assert_null(kv_seq_state_spare(a));
    kv_seq_state_flip(a); /* no spares: a no-op */
    assert_ptr_equal(a->state, kv_state_data(kv_pool_state(pool), a->state_slot));
    assert_int_equal(kv_state_make_spares(kv_pool_state(pool), &err), KT_OK);
    assert_int_equal(kv_state_make_spares(kv_pool_state(pool), &err), KT_OK); /* once */
    float *before = a->state, *spare = kv_seq_state_spare(a);
    assert_non_null(spare);
    assert_ptr_not_equal(spare, before);
    assert_true(spare[0] == 0 && spare[1] == 0 && spare[2] == 0); /* faulted in as zeros */
    before[0] = 1, spare[0] = 2;
    kv_seq_state_flip(a);
    assert_ptr_equal(a->state, spare);
    assert_ptr_equal(kv_seq_state_spare(a), before);
    assert_ptr_equal(kv_state_data(kv_pool_state(pool), a->state_slot), spare);
    assert_int_equal(kv_seq_append(a, 5, &err), KT_OK);
    kv_seq *f = kv_seq_fork(a, &err); /* copies the flipped-to state */
    assert_non_null(f);
    assert_true(f->state[0] == 2);
    assert_int_equal(kv_seq_truncate(a, 0, &err), KT_OK); /* zeroes the current state only */
    assert_true(a->state[0] == 0 && before[0] == 1);
    kv_seq_state_flip(a);
    assert_ptr_equal(a->state, before);
    assert_true(a->state[0] == 1);
    kv_seq_free(a), kv_seq_free(f);
    kv_pool_free(pool);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_alloc_free),
        cmocka_unit_test(test_bad_params),
        cmocka_unit_test(test_exhaustion),
        cmocka_unit_test(test_append_truncate),
        cmocka_unit_test(test_fork_cow),
        cmocka_unit_test(test_stress_f32),
        cmocka_unit_test(test_stress_f16),
        cmocka_unit_test(test_stress_window),
        cmocka_unit_test(test_state_slots),
        cmocka_unit_test(test_state_spares),
    };
    return tu_result(cmocka_run_group_tests(tests, NULL, NULL));
}
