/*
 * constraint.c - the fast token masks of constraint.h.
 *
 * Frames: a stack is a chain of frames; frame f = (pos, parent), where pos
 * is the position the frame is at (for the top: the next terminal to
 * match; below: where the rule call returns to) and parent is the frame
 * below. Frames are hash-consed, so equal stacks are equal ids. Two ids
 * are special: FRAME_DONE, below the root (a stack that reached it is
 * complete: the grammar can end), and FRAME_CTX, "the unknown rest of the
 * stack" that classification starts from (a stack that reached it popped
 * past the position's rule).
 *
 * States: an interned, sorted, duplicate-free set of frame ids, each a
 * top frame whose position is a terminal (BYTE, SET, TOKEN, NOT_TOKEN),
 * or FRAME_DONE / FRAME_CTX. State 0 is the empty set: dead.
 *
 * Invariants relied on:
 *   - expanding a position always terminates, because kt_grammar_parse
 *     refuses left recursion (a cap on steps still stops a pathological
 *     grammar, which then allows nothing and says so);
 *   - a class (accept bitset, context nodes) depends only on the structure
 *     reachable from its position without popping, which is exactly what
 *     its cache key names (the rests of its frames, and the rules they
 *     call by 128-bit structural hash), so sharing classes across
 *     grammars is exact up to a 128-bit hash collision.
 */
#include "grammar/constraint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "base/error.h"

#define FRAME_DONE 0u
#define FRAME_CTX 1u
#define DEAD 0u

#define MAX_FRAMES (1u << 24)
#define MAX_STATES (1u << 22)
#define MAX_EXPAND_STEPS (1u << 20) /* per expansion */
#define MAX_CHAIN 16                /* frames a class covers */
#define MAX_COVERED 8               /* a parent with more fixed text after the call ends a chain (chain_of) */
#define ROW_BYTES (16u << 20)       /* dense step rows per constraint, at most */
#define STEP_SIGS 4                 /* per state: steps remembered by signature (compute_step) */
#define UNI_GROUPS 4                /* successors of a state's ASCII bytes kept apart (a string body: itself, escape, close, dead) */

/* ---- small open-addressing tables ----------------------------------- */

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* uint64 key -> uint32 value; key 0 is "empty" (keys are offset by 1). */
typedef struct u64map {
    uint64_t *keys;
    uint32_t *vals;
    uint32_t mask, n;
} u64map;

static bool u64map_init(u64map *m, uint32_t slots) {
    m->keys = calloc(slots, sizeof *m->keys);
    m->vals = malloc(slots * sizeof *m->vals);
    m->mask = slots - 1, m->n = 0;
    return m->keys && m->vals;
}

static void u64map_free(u64map *m) {
    free(m->keys), free(m->vals);
}

static bool u64map_get(const u64map *m, uint64_t key, uint32_t *val) {
    key += 1;
    for (uint32_t i = (uint32_t)mix64(key) & m->mask;; i = (i + 1) & m->mask) {
        if (m->keys[i] == key) return *val = m->vals[i], true;
        if (!m->keys[i]) return false;
    }
}

static bool u64map_put(u64map *m, uint64_t key, uint32_t val) {
    if ((m->n + 1) * 2 > m->mask + 1) { /* keep it at most half full */
        u64map big;
        if (!u64map_init(&big, (m->mask + 1) * 2)) return u64map_free(&big), false;
        for (uint32_t i = 0; i <= m->mask; i++)
            if (m->keys[i]) u64map_put(&big, m->keys[i] - 1, m->vals[i]);
        u64map_free(m);
        *m = big;
    }
    key += 1;
    uint32_t i = (uint32_t)mix64(key) & m->mask;
    while (m->keys[i] && m->keys[i] != key) i = (i + 1) & m->mask;
    if (!m->keys[i]) m->n++;
    m->keys[i] = key, m->vals[i] = val;
    return true;
}

/* A growable uint32 vector. A push that could not grow it sets `failed`
 * for good: most pushes are in loops that go on, and the vector's owner
 * checks the flag once it is done with them (a frame, a key word or a
 * context node lost would give wrong masks). */
typedef struct u32vec {
    uint32_t *v;
    uint32_t n, cap;
    bool failed;
} u32vec;

static bool u32vec_grow(u32vec *a) {
    uint32_t cap = a->cap ? a->cap * 2 : 64;
    uint32_t *nv = realloc(a->v, cap * sizeof *nv);
    if (!nv) return a->failed = true, false;
    a->v = nv, a->cap = cap;
    return true;
}

/* Inline: expansions and keys push tens of millions of times. */
static inline bool u32vec_push(u32vec *a, uint32_t x) {
    if (a->n == a->cap && !u32vec_grow(a)) return false;
    a->v[a->n++] = x;
    return true;
}

/* ---- the class cache ----------------------------------------------- */

typedef struct gclass {
    uint64_t hash;
    uint32_t *key, n_key;   /* the serialized structure (see class_key) */
    /* the tokens taken inside the chains: a bitset of n_words, or (when
     * few, as for a keyword or a punctuation mark) their ids, so most
     * classes cost a few bytes rather than n_vocab / 8 */
    uint64_t *accept;       /* NULL: see ids */
    uint32_t *ids, n_ids;
    /* the children of the trie nodes where the walk popped past the chain,
     * by their byte: ctx_child[ctx_off[b] .. ctx_off[b + 1]) have byte b,
     * so a run-time walk from a continuation starts only at children whose
     * byte the continuation takes */
    uint32_t *ctx_child, n_ctx, ctx_off[257];
    int refs;               /* constraints mapping it; evictable at 0 */
    struct gclass *lru_prev, *lru_next, *next_in_bucket;
    size_t bytes;
} gclass;

struct kt_gmask_cache {
    const kt_token_trie *trie;
    size_t max_bytes, bytes;
    uint32_t n_words;
    gclass **bucket;
    uint32_t n_buckets;
    gclass *lru_head, *lru_tail; /* head: most recently used */
    uint64_t computed, hits;
    uint64_t *all;               /* every token of the trie, as bits */
};

static void set_range(uint64_t *bits, const int32_t *ids, uint32_t from, uint32_t to);

kt_gmask_cache *kt_gmask_cache_new(const kt_token_trie *trie, size_t max_bytes, kt_error *err) {
    kt_gmask_cache *c = calloc(1, sizeof *c);
    if (c) c->bucket = calloc(4096, sizeof *c->bucket);
    if (!c || !c->bucket) {
        free(c);
        kt_error_set(err, KT_ERR_NOMEM, "out of memory for the grammar mask cache");
        return NULL;
    }
    c->trie = trie, c->max_bytes = max_bytes, c->n_buckets = 4096;
    c->n_words = ((uint32_t)trie->n_vocab + 63) / 64;
    if (!(c->all = calloc(c->n_words, sizeof *c->all))) {
        kt_gmask_cache_free(c);
        kt_error_set(err, KT_ERR_NOMEM, "out of memory for the grammar mask cache");
        return NULL;
    }
    set_range(c->all, trie->sorted, 0, trie->n_sorted);
    return c;
}

static void class_free(gclass *k) {
    if (!k) return;
    free(k->key), free(k->accept), free(k->ids), free(k->ctx_child), free(k);
}

static void lru_unlink(kt_gmask_cache *c, gclass *k) {
    if (k->lru_prev) k->lru_prev->lru_next = k->lru_next;
    else c->lru_head = k->lru_next;
    if (k->lru_next) k->lru_next->lru_prev = k->lru_prev;
    else c->lru_tail = k->lru_prev;
    k->lru_prev = k->lru_next = NULL;
}

static void lru_push_head(kt_gmask_cache *c, gclass *k) {
    k->lru_prev = NULL, k->lru_next = c->lru_head;
    if (c->lru_head) c->lru_head->lru_prev = k;
    c->lru_head = k;
    if (!c->lru_tail) c->lru_tail = k;
}

static void bucket_remove(kt_gmask_cache *c, gclass *k) {
    gclass **pp = &c->bucket[k->hash & (c->n_buckets - 1)];
    while (*pp != k) pp = &(*pp)->next_in_bucket;
    *pp = k->next_in_bucket;
}

/* Drops unreferenced classes, oldest first, until the cache fits. */
static void cache_trim(kt_gmask_cache *c) {
    for (gclass *k = c->lru_tail; k && c->bytes > c->max_bytes;) {
        gclass *prev = k->lru_prev;
        if (k->refs == 0) {
            lru_unlink(c, k);
            bucket_remove(c, k);
            c->bytes -= k->bytes;
            class_free(k);
        }
        k = prev;
    }
}

void kt_gmask_cache_free(kt_gmask_cache *c) {
    if (!c) return;
    for (gclass *k = c->lru_head, *next; k; k = next) {
        next = k->lru_next;
        class_free(k);
    }
    free(c->bucket), free(c->all);
    free(c);
}

void kt_gmask_cache_counts(const kt_gmask_cache *c, uint64_t *computed, uint64_t *hits, size_t *bytes) {
    if (computed) *computed = c->computed;
    if (hits) *hits = c->hits;
    if (bytes) *bytes = c->bytes;
}

static gclass *cache_find(kt_gmask_cache *c, uint64_t hash, const uint32_t *key, uint32_t n_key) {
    for (gclass *k = c->bucket[hash & (c->n_buckets - 1)]; k; k = k->next_in_bucket)
        if (k->hash == hash && k->n_key == n_key && memcmp(k->key, key, n_key * sizeof *key) == 0) return k;
    return NULL;
}

static void cache_add(kt_gmask_cache *c, gclass *k) {
    uint32_t b = k->hash & (c->n_buckets - 1);
    k->next_in_bucket = c->bucket[b];
    c->bucket[b] = k;
    lru_push_head(c, k);
    c->bytes += k->bytes;
}

/* ---- the constraint -------------------------------------------------- */

struct kt_constraint {
    const kt_grammar *g;
    const kt_token_trie *trie;
    kt_gmask_cache *cache;
    uint32_t n_words;
    int32_t *eog;
    int n_eog;
    /* frames */
    uint32_t *fpos, *fpar, *fstamp;
    uint32_t n_frames, cap_frames;
    u64map frame_of; /* (pos << 32 | parent) -> frame */
    uint32_t stamp;
    /* states */
    u32vec members;          /* every state's frames, one after another */
    uint32_t *st_off, *st_n; /* per state */
    uint8_t *st_flags;       /* per state: ST_* */
    uint32_t n_states, cap_states;
    u64map state_of;         /* hash of the frames -> state (chains checked by content) */
    /* steps: (state, byte class) -> state. The first max_rows states to
     * step get a dense row (next + 1 per class, 0: not known yet), the
     * trie walks' inner loop; past the budget (ROW_BYTES), the hash map */
    uint32_t **row;          /* per state (cap_states), NULL: no row */
    struct uniform {         /* per state, learned as walks ask (see subtree_live) */
        uint32_t succ[UNI_GROUPS]; /* + 1: a state ASCII bytes lead to (0: slot unused; 1: DEAD) */
        uint64_t bits[UNI_GROUPS][2]; /* the ASCII bytes known to lead to succ[g] */
        uint32_t utf8_to;    /* + 1: where every multi-byte character leads (1: not one live state; 0: not known) */
        uint64_t chain_set[2]; /* subtree_live found every path over these bytes, */
        uint16_t chain_depth;  /* this long, live from here (0: nothing yet) */
        uint8_t flags;       /* UNI_* */
        uint8_t n_sigs;      /* steps remembered by the frames that take the byte (compute_step) */
        uint32_t sig_next[STEP_SIGS];
        uint64_t sig[STEP_SIGS];
    } *uni;
    uint32_t n_rows, max_rows;
    u64map step;             /* (state << 8 | class) -> state, for states without a row */
    /* classes: a state's frames in groups (see state_groups), each with
     * its class; group_of_state maps a state to its first group + 1 */
    struct sgroup {
        gclass *k;
        uint32_t cont;       /* the state after the group's chains (DEAD: nothing follows) */
        uint32_t n_in_state; /* in a state's first group: how many the state has */
    } *groups;
    uint32_t n_groups, cap_groups;
    u64map group_of_state;
    gclass **held;           /* every class this constraint uses (one reference each) */
    uint32_t n_held, cap_held;
    /* scratch */
    uint64_t *scratch;       /* n_words: a class's accept bits while it is walked */
    u32vec out, work, key;
    struct walk_level { uint32_t end, state; } *walk;
    /* the state now */
    uint32_t state;
    bool ended;
    char error[160];
};

enum { ST_DONE = 1, ST_CTX = 2, ST_TOKREF = 4 };

static void fail(kt_constraint *c, const char *msg) {
    if (!c->error[0]) snprintf(c->error, sizeof c->error, "%s", msg);
}

/* The frame (pos, parent), made if new; FRAME_DONE when out of room (the
 * constraint then records an error and allows nothing). */
static uint32_t frame(kt_constraint *c, uint32_t pos, uint32_t parent) {
    uint64_t k = (uint64_t)pos << 32 | parent;
    uint32_t f;
    if (u64map_get(&c->frame_of, k, &f)) return f;
    if (c->n_frames == c->cap_frames) {
        uint32_t cap = c->cap_frames * 2;
        uint32_t *a = realloc(c->fpos, cap * sizeof *a), *b = a ? realloc(c->fpar, cap * sizeof *b) : NULL;
        if (a) c->fpos = a;
        if (b) c->fpar = b;
        uint32_t *s = b ? realloc(c->fstamp, cap * sizeof *s) : NULL;
        if (!s || cap > MAX_FRAMES) return fail(c, "the grammar needs too many parse frames"), FRAME_DONE;
        memset(s + c->cap_frames, 0, (cap - c->cap_frames) * sizeof *s);
        c->fstamp = s, c->cap_frames = cap;
    }
    f = c->n_frames++;
    c->fpos[f] = pos, c->fpar[f] = parent, c->fstamp[f] = 0;
    if (!u64map_put(&c->frame_of, k, f)) fail(c, "out of memory for parse frames");
    return f;
}

static bool is_terminal(uint32_t type) {
    return type == KT_GE_BYTE || type == KT_GE_SET || type == KT_GE_TOKEN || type == KT_GE_NOT_TOKEN;
}

/* Adds to c->out the top frames of every stack that (pos, parent) can
 * start: rule calls are entered, ends of alternatives return to the
 * parent. Each (pos, parent) is visited once per expansion (stamps). */
static void expand(kt_constraint *c, uint32_t pos, uint32_t parent) {
    const kt_grammar *g = c->g;
    c->work.n = 0;
    u32vec_push(&c->work, pos), u32vec_push(&c->work, parent);
    uint32_t steps = 0;
    /* work holds (pos, parent) pairs: one half lost would misread the rest */
    while (c->work.n && !c->work.failed && !c->out.failed) {
        parent = c->work.v[--c->work.n];
        pos = c->work.v[--c->work.n];
        if (++steps > MAX_EXPAND_STEPS) return fail(c, "the grammar's expansion does not terminate");
        const kt_gelem *e = &g->elems[pos];
        if (e->type == KT_GE_END) {
            if (parent == FRAME_DONE || parent == FRAME_CTX) {
                u32vec_push(&c->out, parent);
                continue;
            }
            pos = c->fpos[parent], parent = c->fpar[parent];
            u32vec_push(&c->work, pos), u32vec_push(&c->work, parent);
            continue;
        }
        if (parent == FRAME_CTX && e->type == KT_GE_RULE && !g->rule_lexical[e->value]) {
            /* classification: the class stops before a rule that nests;
             * the run-time walk continues from here (chain_cont) */
            u32vec_push(&c->out, FRAME_CTX);
            continue;
        }
        uint32_t f = frame(c, pos, parent);
        if (c->fstamp[f] == c->stamp) continue;
        c->fstamp[f] = c->stamp;
        if (is_terminal(e->type)) {
            u32vec_push(&c->out, f);
            continue;
        }
        /* a rule call: each alternative, returning to pos + 1; a call last
         * in its alternative returns straight to the parent (a tail call),
         * so a repetition's right recursion keeps the stack flat and its
         * states repeat */
        uint32_t ret = g->elems[pos + 1].type == KT_GE_END ? parent : frame(c, pos + 1, parent);
        const kt_grule *r = &g->rules[e->value];
        for (uint32_t a = 0; a < r->n_alts; a++)
            u32vec_push(&c->work, g->alts[r->first_alt + a]), u32vec_push(&c->work, ret);
    }
    if (c->work.failed || c->out.failed) fail(c, "out of memory expanding the grammar");
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* The state whose frames are c->out[from..) (sorted and deduplicated
 * here), interned; DEAD for an empty set or on failure. */
static uint32_t intern(kt_constraint *c, uint32_t from) {
    uint32_t *v = c->out.v + from, n = c->out.n - from;
    if (n == 0) return DEAD;
    if (n < 24) {
        for (uint32_t i = 1; i < n; i++)
            for (uint32_t j = i; j > 0 && v[j - 1] > v[j]; j--) {
                uint32_t t = v[j];
                v[j] = v[j - 1], v[j - 1] = t;
            }
    } else {
        qsort(v, n, sizeof *v, cmp_u32);
    }
    uint32_t m = 1;
    for (uint32_t i = 1; i < n; i++)
        if (v[i] != v[m - 1]) v[m++] = v[i];
    uint64_t h = XXH3_64bits(v, m * sizeof *v), probe = h;
    uint32_t s;
    /* chained by rehashing: equal hashes of different sets are told apart by content */
    while (u64map_get(&c->state_of, probe, &s)) {
        if (c->st_n[s] == m && memcmp(c->members.v + c->st_off[s], v, m * sizeof *v) == 0) return s;
        probe = mix64(probe + 1);
    }
    if (c->n_states == c->cap_states) {
        uint32_t cap = c->cap_states * 2;
        if (cap > MAX_STATES) return fail(c, "the grammar needs too many parse states"), DEAD;
        uint32_t *o = realloc(c->st_off, cap * sizeof *o), *nn = o ? realloc(c->st_n, cap * sizeof *nn) : NULL;
        if (o) c->st_off = o;
        if (nn) c->st_n = nn;
        uint8_t *fl = nn ? realloc(c->st_flags, cap) : NULL;
        if (fl) c->st_flags = fl;
        uint32_t **rw = fl ? realloc(c->row, cap * sizeof *rw) : NULL;
        if (rw) c->row = rw;
        struct uniform *sl = rw ? realloc(c->uni, cap * sizeof *sl) : NULL;
        if (!sl) return fail(c, "out of memory for parse states"), DEAD;
        memset(rw + c->cap_states, 0, (cap - c->cap_states) * sizeof *rw);
        memset(sl + c->cap_states, 0, (cap - c->cap_states) * sizeof *sl);
        c->uni = sl, c->cap_states = cap;
    }
    s = c->n_states++;
    c->st_off[s] = c->members.n, c->st_n[s] = m;
    uint8_t flags = 0;
    for (uint32_t i = 0; i < m; i++) {
        uint32_t f = v[i];
        if (f == FRAME_DONE) flags |= ST_DONE;
        else if (f == FRAME_CTX) flags |= ST_CTX;
        else if (c->g->elems[c->fpos[f]].type == KT_GE_TOKEN || c->g->elems[c->fpos[f]].type == KT_GE_NOT_TOKEN)
            flags |= ST_TOKREF;
        if (!u32vec_push(&c->members, f)) return fail(c, "out of memory for parse states"), DEAD;
    }
    c->st_flags[s] = flags;
    if (!u64map_put(&c->state_of, probe, s)) fail(c, "out of memory for parse states");
    return s;
}

static bool byte_matches(const kt_grammar *g, const kt_gelem *e, uint8_t b) {
    if (e->type == KT_GE_BYTE) return e->value == b;
    if (e->type == KT_GE_SET) return kt_byteset_has(&g->sets[e->value], b);
    return false;
}

/* Which of state s's first 64 frames take byte b (bit i: frame i). */
static uint64_t step_signature(const kt_constraint *c, uint32_t s, uint8_t b) {
    const uint32_t *fr = c->members.v + c->st_off[s];
    uint64_t sig = 0;
    for (uint32_t i = 0; i < c->st_n[s]; i++)
        if (fr[i] > FRAME_CTX && byte_matches(c->g, &c->g->elems[c->fpos[fr[i]]], b)) sig |= 1ull << i;
    return sig;
}

/* The state after byte b from state s, computed: the terminals of s
 * that take b, advanced and expanded. Bytes that the same frames take
 * lead to the same state, so a state of at most 64 frames remembers its
 * last STEP_SIGS signatures: a string body's letters, which a big
 * grammar's literals split into dozens of byte classes, expand once. */
static uint32_t compute_step(kt_constraint *c, uint32_t s, uint8_t b) {
    const bool small = c->st_n[s] <= 64;
    const uint64_t sig = small ? step_signature(c, s, b) : 0;
    if (small) {
        if (!sig) return DEAD;
        const struct uniform *u = &c->uni[s];
        for (uint32_t j = 0; j < u->n_sigs; j++)
            if (u->sig[j] == sig) return u->sig_next[j];
    }
    const uint32_t from = c->out.n;
    c->stamp++;
    for (uint32_t i = 0; i < c->st_n[s]; i++) {
        uint32_t f = c->members.v[c->st_off[s] + i];
        if (f <= FRAME_CTX) continue;
        const bool takes = small ? (sig >> i) & 1 : byte_matches(c->g, &c->g->elems[c->fpos[f]], b);
        if (takes) expand(c, c->fpos[f] + 1, c->fpar[f]);
    }
    uint32_t next = c->error[0] ? DEAD : intern(c, from);
    c->out.n = from;
    struct uniform *u = &c->uni[s]; /* intern may have grown c->uni */
    if (small && !c->error[0]) {
        const uint32_t j = u->n_sigs < STEP_SIGS ? u->n_sigs++ : (uint32_t)(sig % STEP_SIGS);
        u->sig[j] = sig, u->sig_next[j] = next;
    }
    return next;
}

static uint32_t step_byte_slow(kt_constraint *c, uint32_t s, uint8_t b);

/* The state after byte b from state s (memoized per byte class: bytes
 * no terminal tells apart step alike, see grammar.h). Inline: the trie
 * walks' inner loop is mostly this row load. */
static inline uint32_t step_byte(kt_constraint *c, uint32_t s, uint8_t b) {
    const uint32_t *row = c->row[s];
    if (row && row[c->g->byte_class[b]]) return row[c->g->byte_class[b]] - 1;
    return step_byte_slow(c, s, b);
}

static uint32_t step_byte_slow(kt_constraint *c, uint32_t s, uint8_t b) {
    const uint8_t cl = c->g->byte_class[b];
    uint32_t *row = c->row[s];
    const uint64_t k = (uint64_t)s << 8 | cl;
    uint32_t next;
    if (!row && u64map_get(&c->step, k, &next)) return next;
    next = compute_step(c, s, b); /* may grow c->row */
    if (!row && c->n_rows < c->max_rows && (row = calloc(c->g->n_byte_classes, sizeof *row))) c->row[s] = row, c->n_rows++;
    if (row) row[cl] = next + 1;
    else if (!u64map_put(&c->step, k, next)) fail(c, "out of memory for parse steps");
    return next;
}

/* The state a single frame's position starts (no memo: rare). */
static uint32_t state_at(kt_constraint *c, uint32_t pos, uint32_t parent) {
    const uint32_t from = c->out.n;
    c->stamp++;
    expand(c, pos, parent);
    uint32_t s = c->error[0] ? DEAD : intern(c, from);
    c->out.n = from;
    return s;
}

/* ---- classes ---------------------------------------------------------- */

enum { K_BYTE = 1u << 28, K_SET = 2u << 28, K_RULE = 3u << 28, K_TOKEN = 4u << 28, K_NOT = 5u << 28,
       K_END = 6u << 28, K_GRAMMAR = 8u << 28, K_CHAIN_SEP = 9u << 28,
       K_STOP = 10u << 28 };

/* Appends one alternative's elements from pos to its END; a lexical
 * rule call is named by its structural hash (grammar.h), so the key holds
 * everything the class can reach without listing it. */
static void key_alt(kt_constraint *c, uint32_t pos) {
    const kt_grammar *g = c->g;
    for (;; pos++) {
        const kt_gelem *e = &g->elems[pos];
        switch (e->type) {
        case KT_GE_END: u32vec_push(&c->key, K_END); return;
        case KT_GE_BYTE: u32vec_push(&c->key, K_BYTE | e->value); break;
        case KT_GE_SET:
            u32vec_push(&c->key, K_SET);
            for (int w = 0; w < 4; w++)
                u32vec_push(&c->key, (uint32_t)g->sets[e->value].bits[w]),
                    u32vec_push(&c->key, (uint32_t)(g->sets[e->value].bits[w] >> 32));
            break;
        case KT_GE_TOKEN: u32vec_push(&c->key, K_TOKEN), u32vec_push(&c->key, e->value); break;
        case KT_GE_NOT_TOKEN: u32vec_push(&c->key, K_NOT), u32vec_push(&c->key, e->value); break;
        default: /* KT_GE_RULE */
            if (!g->rule_lexical[e->value]) { /* a class stops before a rule that nests (see expand) */
                u32vec_push(&c->key, K_STOP);
                return;
            }
            u32vec_push(&c->key, K_RULE);
            for (int w = 0; w < 2; w++)
                u32vec_push(&c->key, (uint32_t)g->rule_hash[e->value][w]),
                    u32vec_push(&c->key, (uint32_t)(g->rule_hash[e->value][w] >> 32));
        }
    }
}

/* Elements a class would cover from position p: to its alternative's END
 * or to the first rule that nests, whichever comes first. */
static uint32_t covered_len(const kt_grammar *g, uint32_t p) {
    uint32_t n = 0;
    for (const kt_gelem *e = &g->elems[p]; e->type != KT_GE_END; e++, n++)
        if (e->type == KT_GE_RULE && !g->rule_lexical[e->value]) break;
    return n;
}

/* The frames a class of top frame f covers, top first: f, then its
 * parents as long as the last frame's rest is lexical (see lexical.c), at
 * most MAX_CHAIN; the last frame's rest may end in a rule that nests,
 * where the class stops (expand), and a parent that would add more than
 * MAX_COVERED elements is left out: past a string in a flat object comes
 * the rest of the object, which no other position shares, so the class
 * of the string body is shared when it stops at the string and computed
 * for every field when it does not. So a class spans a whole lexeme and
 * the short fixed text after it: for a character inside a JSON object key it
 * reaches over the key's closing quote, the colon and the space after,
 * and the run-time walk starts only where the value begins (a class of
 * the character rule alone would leave it almost every token, since that
 * rule ends after each character). Returns the count. */
static int chain_of(const kt_constraint *c, uint32_t f, uint32_t *chain) {
    int n = 0;
    chain[n++] = f;
    while (n < MAX_CHAIN && c->g->rest_lexical[c->fpos[f]] && c->fpar[f] > FRAME_CTX &&
           covered_len(c->g, c->fpos[c->fpar[f]]) <= MAX_COVERED) {
        f = c->fpar[f];
        chain[n++] = f;
        if (!c->g->rest_lexical[c->fpos[f]]) break;
    }
    return n;
}

/* Keys longer than this name the grammar instead (see class_key). */
#define KEY_MAX_SHARED 1024

/* A chain of frames, top first, as chain_of gives it. */
typedef struct chain {
    uint32_t f[MAX_CHAIN];
    int n;
} chain;

/* c->key = the structure reachable from the chains without popping their
 * last frames: the rest of each frame's alternative, chains apart, with
 * the rules they call named by structural hash. Such a key is shared by
 * every grammar with that structure, whatever its size or where in it
 * the positions are. A key longer than KEY_MAX_SHARED (a long literal)
 * is the grammar's fingerprint and the chains' positions instead: exact
 * for this grammar (and for the same grammar in a later request), and
 * bounded to build and compare. */
static bool class_key(kt_constraint *c, const chain *ch, uint32_t n_chains) {
    c->key.n = 0;
    for (uint32_t j = 0; j < n_chains && c->key.n <= KEY_MAX_SHARED; j++) {
        for (int i = 0; i < ch[j].n && c->key.n <= KEY_MAX_SHARED; i++) key_alt(c, c->fpos[ch[j].f[i]]);
        u32vec_push(&c->key, K_CHAIN_SEP);
    }
    if (c->key.n > KEY_MAX_SHARED) {
        c->key.n = 0;
        u32vec_push(&c->key, K_GRAMMAR);
        for (int w = 0; w < 2; w++)
            u32vec_push(&c->key, (uint32_t)c->g->fingerprint[w]),
                u32vec_push(&c->key, (uint32_t)(c->g->fingerprint[w] >> 32));
        for (uint32_t j = 0; j < n_chains; j++) {
            for (int i = 0; i < ch[j].n; i++) u32vec_push(&c->key, c->fpos[ch[j].f[i]]);
            u32vec_push(&c->key, K_CHAIN_SEP);
        }
    }
    return !c->key.failed && c->key.n > 0;
}

static void set_range(uint64_t *bits, const int32_t *ids, uint32_t from, uint32_t to) {
    for (uint32_t k = from; k < to; k++) bits[(uint32_t)ids[k] >> 6] |= 1ull << ((uint32_t)ids[k] & 63);
}

static void clear_range(uint64_t *bits, const int32_t *ids, uint32_t from, uint32_t to) {
    for (uint32_t k = from; k < to; k++) bits[(uint32_t)ids[k] >> 6] &= ~(1ull << ((uint32_t)ids[k] & 63));
}

/* What a whole-trie walk takes, as runs [v[2i], v[2i + 1]) of the trie's
 * sorted order: preorder is sorted order, so takes come in increasing
 * order and mostly touch, and a string body's walk (almost every token)
 * is a few hundred runs. Turned into bits at the end by setting the
 * runs or clearing the gaps, whichever is fewer tokens (runs_to_bits). */
typedef struct runs {
    u32vec v;
    uint32_t n_tokens;
    bool failed;
} runs;

/* Takes the tokens sorted[from .. to): into r, or straight into bits. */
static inline void take(uint64_t *bits, runs *r, const int32_t *ids, uint32_t from, uint32_t to) {
    if (!r) return set_range(bits, ids, from, to);
    if (from == to) return;
    r->n_tokens += to - from;
    if (r->v.n && r->v.v[r->v.n - 1] == from) r->v.v[r->v.n - 1] = to;
    else if (!u32vec_push(&r->v, from) || !u32vec_push(&r->v, to)) r->failed = true;
}

/* bits = the tokens of r; `all` has every token of the trie. */
static void runs_to_bits(const kt_token_trie *t, const runs *r, const uint64_t *all, uint64_t *bits, uint32_t n_words) {
    if (r->n_tokens * 2 <= t->n_sorted) {
        memset(bits, 0, n_words * sizeof *bits);
        for (uint32_t i = 0; i < r->v.n; i += 2) set_range(bits, t->sorted, r->v.v[i], r->v.v[i + 1]);
        return;
    }
    memcpy(bits, all, n_words * sizeof *bits);
    uint32_t done = 0;
    for (uint32_t i = 0; i < r->v.n; i += 2) clear_range(bits, t->sorted, done, r->v.v[i]), done = r->v.v[i + 1];
    clear_range(bits, t->sorted, done, t->n_sorted);
}

enum { UNI_CHAIN_HIGH = 1, UNI_CHAIN_NO_CTX = 2 };
#define SKIP_MIN_NODES 8       /* smaller subtrees are walked: not worth the check */
#define UTF8_CHECK_BUDGET 4096 /* (state, bytes due) pairs a UTF-8 check may visit */

/* Do the continuation bytes from state `at` (k more due after this one,
 * each in 80-BF) all stay live and end in `to`? Depth first; `seen`
 * holds (state, k) pairs already checked, `budget` bounds the work (out
 * of it: no, which only costs a walk). */
static bool utf8_tail_leads(kt_constraint *c, uint32_t to, uint32_t at, int k, u64map *seen, int *budget) {
    const uint8_t *cls = c->g->byte_class;
    for (int b = 0x80; b <= 0xBF; b++) {
        if (b > 0x80 && cls[b] == cls[b - 1]) continue; /* same class, same step */
        uint32_t next = step_byte(c, at, (uint8_t)b);
        if (next == DEAD) return false;
        if (k == 0) {
            if (next != to) return false;
            continue;
        }
        uint32_t v;
        uint64_t key = (uint64_t)next << 2 | (uint64_t)k;
        if (u64map_get(seen, key, &v)) continue;
        if (--*budget < 0 || !u64map_put(seen, key, 1) || !utf8_tail_leads(c, to, next, k - 1, seen, budget))
            return false;
    }
    return true;
}

/* Does every valid UTF-8 character of two or more bytes lead from s to
 * `to`, through live states only? (A string body's [^"\\] does, to the
 * state its ASCII characters lead to.) Lead bytes with their restricted
 * second byte. */
static bool utf8_leads(kt_constraint *c, uint32_t s, uint32_t to) {
    static const struct { uint8_t lo, hi, second_lo, second_hi; int more; } leads[] = {
        {0xC2, 0xDF, 0x80, 0xBF, 0}, {0xE0, 0xE0, 0xA0, 0xBF, 1}, {0xE1, 0xEC, 0x80, 0xBF, 1},
        {0xED, 0xED, 0x80, 0x9F, 1}, {0xEE, 0xEF, 0x80, 0xBF, 1}, {0xF0, 0xF0, 0x90, 0xBF, 2},
        {0xF1, 0xF3, 0x80, 0xBF, 2}, {0xF4, 0xF4, 0x80, 0x8F, 2},
    };
    u64map seen;
    if (!u64map_init(&seen, 256)) return false;
    int budget = UTF8_CHECK_BUDGET;
    bool ok = true;
    const uint8_t *cls = c->g->byte_class;
    for (size_t l = 0; ok && l < sizeof leads / sizeof *leads; l++)
        for (int lead = leads[l].lo; ok && lead <= leads[l].hi; lead++) {
            if (lead > leads[l].lo && cls[lead] == cls[lead - 1]) continue; /* same class, same steps */
            uint32_t s1 = step_byte(c, s, (uint8_t)lead);
            ok = s1 != DEAD;
            for (int b = leads[l].second_lo; ok && b <= leads[l].second_hi; b++) {
                if (b > leads[l].second_lo && cls[b] == cls[b - 1]) continue;
                uint32_t s2 = step_byte(c, s1, (uint8_t)b), v;
                uint64_t key = (uint64_t)s2 << 2 | (uint64_t)leads[l].more;
                if (s2 == DEAD) ok = false;
                else if (leads[l].more == 0) ok = s2 == to;
                else if (!u64map_get(&seen, key, &v))
                    ok = --budget >= 0 && u64map_put(&seen, key, 1) &&
                         utf8_tail_leads(c, to, s2, leads[l].more - 1, &seen, &budget);
            }
        }
    u64map_free(&seen);
    return ok;
}

/* Which of state s's successor groups ASCII byte b is in, learned on
 * first ask; -1 when s has more successors than UNI_GROUPS (the caller
 * then steps the byte itself). */
static int uni_group(kt_constraint *c, uint32_t s, int b) {
    const int w = b >> 6;
    const uint64_t bit = 1ull << (b & 63);
    for (int g = 0; g < UNI_GROUPS && c->uni[s].succ[g]; g++)
        if (c->uni[s].bits[g][w] & bit) return g;
    const uint32_t next = step_byte(c, s, (uint8_t)b); /* may grow c->uni */
    struct uniform *u = &c->uni[s];
    for (int g = 0; g < UNI_GROUPS; g++) {
        if (!u->succ[g]) u->succ[g] = next + 1;
        if (u->succ[g] == next + 1) return u->bits[g][w] |= bit, g;
    }
    return -1;
}

static uint32_t uni_next(kt_constraint *c, uint32_t s, int b) {
    const int g = uni_group(c, s, b);
    return g >= 0 ? c->uni[s].succ[g] - 1 : step_byte(c, s, (uint8_t)b);
}

/* The one state every byte of `need` (ASCII, not empty) leads s to,
 * live; DEAD if there is none. The successor is the lowest byte's; the
 * others are checked against it, each learned once per state. */
static uint32_t uniform_step(kt_constraint *c, uint32_t s, const uint64_t need[2]) {
    const int b0 = need[0] ? __builtin_ctzll(need[0]) : 64 + __builtin_ctzll(need[1]);
    const int g0 = uni_group(c, s, b0);
    const uint32_t succ = g0 >= 0 ? c->uni[s].succ[g0] - 1 : step_byte(c, s, (uint8_t)b0);
    if (succ == DEAD) return DEAD;
    for (int w = 0; w < 2; w++)
        for (uint64_t todo = need[w] & ~(g0 >= 0 ? c->uni[s].bits[g0][w] : 0); todo; todo &= todo - 1)
            if (uni_next(c, s, w * 64 + __builtin_ctzll(todo)) != succ) return DEAD;
    return succ;
}

/* The one live state every valid multi-byte UTF-8 character leads s to
 * (a string body's [^"\\] leads them where its ASCII characters go);
 * DEAD if they do not all lead to one. Learned once per state. */
static uint32_t utf8_successor(kt_constraint *c, uint32_t s) {
    if (!c->uni[s].utf8_to) {
        uint32_t to = step_byte(c, step_byte(c, s, 0xC2), 0x80); /* the first two-byte character */
        if (to != DEAD && !utf8_leads(c, s, to)) to = DEAD;     /* may grow c->uni */
        c->uni[s].utf8_to = to + 1;
    }
    return c->uni[s].utf8_to - 1;
}

/* Is every path below trie node i live from state s (the state the walk
 * reached i in), without FRAME_CTX when ctx nodes are collected? Then
 * every token below i is allowed and the walk takes the subtree at once.
 * True when, for as many characters as the subtree's height, every byte
 * that occurs below (ASCII, and valid UTF-8 characters if any) leads to
 * one same live state: a string body (a loop: one state), or a string of
 * bounded length (a chain: one state per character). */
static bool subtree_live(kt_constraint *c, uint32_t s, uint32_t i, bool ctx) {
    const kt_token_trie *t = c->trie;
    const uint8_t flags = t->below_flags[i];
    const bool high = flags & KT_TRIE_HIGH_BELOW;
    const uint64_t *need = t->below_ascii[i];
    const uint32_t height = t->below_height[i];
    if (high && !(flags & KT_TRIE_UTF8_BELOW)) return false;
    /* a bounded string's chain was checked before, over more bytes and as
     * deep: the same answer without walking its links again */
    const struct uniform *m = &c->uni[s];
    if (height <= m->chain_depth && !(need[0] & ~m->chain_set[0]) && !(need[1] & ~m->chain_set[1]) &&
        (!high || (m->flags & UNI_CHAIN_HIGH)) && (!ctx || (m->flags & UNI_CHAIN_NO_CTX)))
        return true;
    const uint32_t s0 = s;
    const bool ascii = need[0] | need[1];
    for (uint32_t h = 0; h < height; h++) {
        const uint32_t next = ascii ? uniform_step(c, s, need) : utf8_successor(c, s);
        if (next == DEAD || (ctx && (c->st_flags[next] & ST_CTX))) return false;
        if (high && ascii && utf8_successor(c, s) != next) return false;
        if (next == s) return true; /* a loop: the rest of the chain is the same */
        s = next;
    }
    struct uniform *w = &c->uni[s0]; /* the walk may have grown c->uni */
    if (height >= w->chain_depth) {
        w->chain_set[0] = need[0], w->chain_set[1] = need[1], w->chain_depth = (uint16_t)height;
        w->flags = (uint8_t)((w->flags & ~(UNI_CHAIN_HIGH | UNI_CHAIN_NO_CTX)) | (high ? UNI_CHAIN_HIGH : 0) |
                             (ctx ? UNI_CHAIN_NO_CTX : 0));
    }
    return true;
}

/* Walks the trie below node u from state s: every token reached with a
 * live state is set in bits; with ctx (classification) the nodes where
 * the state holds FRAME_CTX are collected. A subtree the state cannot
 * leave is taken whole (subtree_live). */
static void walk(kt_constraint *c, uint32_t u, uint32_t s, uint64_t *bits, runs *r, u32vec *ctx) {
    const kt_token_trie *t = c->trie;
    uint32_t sp = 0, i = u + 1;
    c->walk[0].end = t->end[u], c->walk[0].state = s;
    while (i < c->walk[0].end) {
        while (i >= c->walk[sp].end) sp--;
        uint32_t next = step_byte(c, c->walk[sp].state, t->byte[i]);
        if (next == DEAD) {
            i = t->end[i];
            continue;
        }
        take(bits, r, t->sorted, t->first[i], t->first[i + 1]);
        const bool at_ctx = c->st_flags[next] & ST_CTX;
        if (ctx && at_ctx) u32vec_push(ctx, i); /* failed: the caller sees ctx->failed */
        if (t->end[i] > i + 1) {
            if (t->end[i] - i >= SKIP_MIN_NODES && !(ctx && at_ctx) && subtree_live(c, next, i, ctx != NULL)) {
                take(bits, r, t->sorted, t->first[i + 1], t->first[t->end[i]]);
                i = t->end[i];
                continue;
            }
            sp++;
            c->walk[sp].end = t->end[i], c->walk[sp].state = next;
        }
        i++;
    }
}

static int cmp_u32(const void *a, const void *b);

/* k's context children: the children of the nodes in ctx, and the nodes
 * in `more` (NULL: none), grouped by byte (a counting sort). Children of
 * distinct nodes are distinct; with `more` they may repeat and are made
 * unique first. */
static bool group_ctx(const kt_token_trie *t, const u32vec *ctx, const u32vec *more, gclass *k) {
    uint32_t n = more ? more->n : 0;
    for (uint32_t i = 0; i < ctx->n; i++)
        for (uint32_t u = ctx->v[i], x = u + 1; x < t->end[u]; x = t->end[x]) n++;
    uint32_t *all = malloc(((size_t)n + 1) * sizeof *all);
    k->ctx_child = malloc(((size_t)n + 1) * sizeof *k->ctx_child);
    if (!all || !k->ctx_child) return free(all), false;
    n = 0;
    for (uint32_t i = 0; i < ctx->n; i++)
        for (uint32_t u = ctx->v[i], x = u + 1; x < t->end[u]; x = t->end[x]) all[n++] = x;
    if (more && more->n) {
        memcpy(all + n, more->v, more->n * sizeof *all);
        n += more->n;
        qsort(all, n, sizeof *all, cmp_u32);
        uint32_t m = 0;
        for (uint32_t i = 0; i < n; i++)
            if (m == 0 || all[i] != all[m - 1]) all[m++] = all[i];
        n = m;
    }
    uint32_t count[256] = {0};
    for (uint32_t i = 0; i < n; i++) count[t->byte[all[i]]]++;
    k->ctx_off[0] = 0;
    for (int b = 0; b < 256; b++) k->ctx_off[b + 1] = k->ctx_off[b] + count[b];
    uint32_t fill[256];
    memcpy(fill, k->ctx_off, sizeof fill);
    for (uint32_t i = 0; i < n; i++) k->ctx_child[fill[t->byte[all[i]]]++] = all[i];
    k->n_ctx = n;
    free(all);
    return true;
}

/* Sets the tokens at and below trie node x, entered with state s. */
static void walk_from(kt_constraint *c, uint32_t x, uint32_t s, uint64_t *bits) {
    set_range(bits, c->trie->sorted, c->trie->first[x], c->trie->first[x + 1]);
    if (c->trie->end[x] > x + 1) walk(c, x, s, bits, NULL, NULL);
}

/* The classification state of chains: the same positions, on FRAME_CTX. */
static uint32_t chains_start(kt_constraint *c, const chain *ch, uint32_t n_chains) {
    const uint32_t from = c->out.n;
    for (uint32_t j = 0; j < n_chains; j++) {
        uint32_t f = FRAME_CTX;
        for (int i = ch[j].n - 1; i >= 0; i--) f = frame(c, c->fpos[ch[j].f[i]], f);
        if (!u32vec_push(&c->out, f)) fail(c, "out of memory for parse states");
    }
    uint32_t s = c->error[0] ? DEAD : intern(c, from);
    c->out.n = from;
    return s;
}

static bool hold(kt_constraint *c, gclass *k) {
    if (c->n_held == c->cap_held) {
        uint32_t cap = c->cap_held ? c->cap_held * 2 : 16;
        gclass **nh = realloc(c->held, cap * sizeof *nh);
        if (!nh) return false;
        c->held = nh, c->cap_held = cap;
    }
    c->held[c->n_held++] = k;
    k->refs++; /* before any trim: held classes are never dropped */
    return true;
}

/* k's accept set from the walk's bits in c->scratch: ids when they take
 * less room than a quarter of the bitset (counted only that far). */
static bool store_accept(kt_constraint *c, gclass *k) {
    const uint32_t few = c->n_words / 2; /* ids below this many: less room than a quarter of the bitset */
    uint32_t n = 0;
    for (uint32_t w = 0; w < c->n_words && n < few; w++)
        if (c->scratch[w]) n += (uint32_t)__builtin_popcountll(c->scratch[w]);
    if (n < few) {
        k->ids = malloc(((size_t)n + 1) * sizeof *k->ids);
        if (!k->ids) return false;
        for (uint32_t w = 0; w < c->n_words; w++)
            for (uint64_t m = c->scratch[w]; m; m &= m - 1) k->ids[k->n_ids++] = w * 64 + (uint32_t)__builtin_ctzll(m);
        return true;
    }
    k->accept = malloc(c->n_words * sizeof *k->accept);
    if (!k->accept) return false;
    memcpy(k->accept, c->scratch, c->n_words * sizeof *k->accept);
    return true;
}

/* Is the rest of the alternative from p fixed text (terminals only, at
 * least one): a string's closing quote? */
static bool rest_is_text(const kt_grammar *g, uint32_t p) {
    if (g->elems[p].type == KT_GE_END) return false;
    for (; g->elems[p].type != KT_GE_END; p++)
        if (g->elems[p].type != KT_GE_BYTE && g->elems[p].type != KT_GE_SET) return false;
    return true;
}

/* Where a group's chains end their lexeme: the first frame below the top
 * whose rest is fixed text (a string's closing quote), when more frames
 * follow it (the text after the string: a comma, the next key). The
 * group's class is then composed from the lexeme's class, which every
 * string of that kind in every grammar shares, and a short walk of the
 * text after it (compose_class). 0: no split (chains of a group share
 * every frame but the top; checked). */
static int lexeme_end(const kt_constraint *c, const chain *ch, uint32_t n_chains) {
    for (uint32_t j = 1; j < n_chains; j++) {
        if (ch[j].n != ch[0].n) return 0;
        for (int i = 1; i < ch[0].n; i++)
            if (ch[j].f[i] != ch[0].f[i]) return 0;
    }
    for (int i = 1; i < ch[0].n - 1; i++)
        if (rest_is_text(c->g, c->fpos[ch[0].f[i]])) return i;
    return 0;
}

static gclass *class_of(kt_constraint *c, const chain *ch, uint32_t n_chains);

/* The classification state where chain ch continues once frame j's rest
 * is done: the frames below j, on FRAME_CTX. */
static uint32_t state_below(kt_constraint *c, const chain *ch, int j) {
    uint32_t parent = FRAME_CTX;
    for (int i = ch->n - 1; i > j + 1; i--) parent = frame(c, c->fpos[ch->f[i]], parent);
    return state_at(c, c->fpos[ch->f[j + 1]], parent);
}

/* Class k of chains ch, split after frame j: the lexeme's class (chains
 * cut after j), plus what the text after the lexeme takes from there. A
 * token is allowed iff some parse of it stays in the lexeme (the
 * lexeme's accept set) or leaves it at a byte boundary, which is one of
 * the lexeme's context nodes, and goes on in the text after it: a walk
 * from the context children whose byte that text takes. Context nodes
 * of k are where that walk pops past the chains, and, when the text
 * after the lexeme can be empty, the lexeme's own. The same sets a whole
 * walk would give, at the cost of a few subtrees. */
static bool compose_class(kt_constraint *c, const chain *ch, uint32_t n_chains, int j, u32vec *ctx, u32vec *more) {
    chain *lex = malloc(n_chains * sizeof *lex);
    if (!lex) return false;
    for (uint32_t i = 0; i < n_chains; i++) lex[i] = ch[i], lex[i].n = j + 1;
    const gclass *kl = class_of(c, lex, n_chains); /* held: outlives this walk */
    free(lex);
    if (!kl) return false;
    const uint32_t after = state_below(c, &ch[0], j);
    memset(c->scratch, 0, c->n_words * sizeof *c->scratch);
    if (kl->accept) memcpy(c->scratch, kl->accept, c->n_words * sizeof *c->scratch);
    for (uint32_t i = 0; i < kl->n_ids; i++) c->scratch[kl->ids[i] >> 6] |= 1ull << (kl->ids[i] & 63);
    if (after == DEAD) return true;
    const bool empty_after = c->st_flags[after] & ST_CTX;
    const kt_token_trie *t = c->trie;
    for (int b = 0; b < 256; b++) {
        if (kl->ctx_off[b + 1] == kl->ctx_off[b]) continue;
        for (uint32_t i = kl->ctx_off[b]; empty_after && i < kl->ctx_off[b + 1]; i++)
            if (!u32vec_push(more, kl->ctx_child[i])) return false;
        const uint32_t next = step_byte(c, after, (uint8_t)b);
        if (next == DEAD) continue;
        for (uint32_t i = kl->ctx_off[b]; i < kl->ctx_off[b + 1]; i++) {
            const uint32_t x = kl->ctx_child[i];
            set_range(c->scratch, t->sorted, t->first[x], t->first[x + 1]);
            if ((c->st_flags[next] & ST_CTX) && !u32vec_push(ctx, x)) return false;
            if (t->end[x] > x + 1) walk(c, x, next, c->scratch, NULL, ctx);
        }
    }
    return !c->error[0] && !ctx->failed;
}

/* The class of chains ch (one group): from the cache, or computed by
 * walking the whole trie once from their classification state, or
 * composed from their lexeme's class (compose_class). */
static gclass *class_of(kt_constraint *c, const chain *ch, uint32_t n_chains) {
    if (!class_key(c, ch, n_chains)) return fail(c, "out of memory for grammar classes"), NULL;
    uint64_t h = XXH3_64bits(c->key.v, c->key.n * sizeof *c->key.v);
    gclass *k = cache_find(c->cache, h, c->key.v, c->key.n);
    if (k) {
        c->cache->hits++;
        lru_unlink(c->cache, k);
        lru_push_head(c->cache, k);
    } else {
        k = calloc(1, sizeof *k);
        u32vec ctx = {0}, more = {0};
        if (k) k->key = malloc(c->key.n * sizeof *k->key);
        if (!k || !k->key) {
            class_free(k);
            return fail(c, "out of memory for grammar classes"), NULL;
        }
        memcpy(k->key, c->key.v, c->key.n * sizeof *k->key); /* before compose_class builds other keys */
        k->n_key = c->key.n, k->hash = h;
        const int j = lexeme_end(c, ch, n_chains);
        bool ok;
        if (j) {
            ok = compose_class(c, ch, n_chains, j, &ctx, &more);
        } else {
            uint32_t s0 = chains_start(c, ch, n_chains);
            runs r = {0};
            if (s0 != DEAD) walk(c, 0, s0, c->scratch, &r, &ctx);
            runs_to_bits(c->trie, &r, c->cache->all, c->scratch, c->n_words);
            ok = !r.failed && !ctx.failed;
            free(r.v.v);
        }
        ok = ok && store_accept(c, k) && group_ctx(c->trie, &ctx, &more, k);
        free(ctx.v), free(more.v);
        if (!ok) {
            class_free(k);
            return fail(c, "out of memory for grammar classes"), NULL;
        }
        k->bytes = sizeof *k + (k->accept ? c->n_words * 8 : k->n_ids * 4) + k->n_key * 4 + k->n_ctx * 4;
        c->cache->computed++;
        cache_add(c->cache, k);
    }
    if (!hold(c, k)) return fail(c, "out of memory for grammar classes"), NULL;
    cache_trim(c->cache);
    return k;
}

#define NO_CONT UINT32_MAX /* a chain_cont position: nothing follows the root */

/* Where the run-time walk goes on after chain ch (from its FRAME_CTX):
 * when the last frame's rest is lexical, where that frame returns to
 * (*pos = NO_CONT past the root); else the rule that nests where its rest
 * stops (see expand), on the last frame's parent. */
static void chain_cont(const kt_constraint *c, const chain *ch, uint32_t *pos, uint32_t *parent) {
    const kt_grammar *g = c->g;
    const uint32_t last = ch->f[ch->n - 1];
    uint32_t q = c->fpos[last];
    if (g->rest_lexical[q]) {
        const uint32_t p = c->fpar[last];
        *pos = p == FRAME_DONE ? NO_CONT : c->fpos[p];
        *parent = p == FRAME_DONE ? FRAME_DONE : c->fpar[p];
        return;
    }
    while (!(g->elems[q].type == KT_GE_RULE && !g->rule_lexical[g->elems[q].value])) q++;
    *pos = q, *parent = c->fpar[last];
}

/* A chain's group: its top's parent (the rule call whose alternative it
 * is) and where the run-time walk goes on after it. */
typedef struct group_id {
    uint32_t call, pos, parent;
} group_id;

static group_id group_of(const kt_constraint *c, const chain *ch) {
    group_id id = {.call = c->fpar[ch->f[0]]};
    chain_cont(c, ch, &id.pos, &id.parent);
    return id;
}

static int group_cmp(group_id x, group_id y) {
    if (x.call != y.call) return x.call < y.call ? -1 : 1;
    if (x.pos != y.pos) return x.pos < y.pos ? -1 : 1;
    return x.parent < y.parent ? -1 : x.parent > y.parent;
}

/* Chains in a canonical order: groups together, then by positions, so
 * equal structures give equal keys whatever the frame ids. */
static int chain_cmp(const kt_constraint *c, const chain *x, const chain *y) {
    int g = group_cmp(group_of(c, x), group_of(c, y));
    if (g) return g;
    for (int i = 0; i < x->n && i < y->n; i++)
        if (c->fpos[x->f[i]] != c->fpos[y->f[i]]) return c->fpos[x->f[i]] < c->fpos[y->f[i]] ? -1 : 1;
    return x->n - y->n;
}

static bool push_group(kt_constraint *c, gclass *k, uint32_t cont) {
    if (c->n_groups == c->cap_groups) {
        uint32_t cap = c->cap_groups ? c->cap_groups * 2 : 64;
        struct sgroup *ng = realloc(c->groups, cap * sizeof *ng);
        if (!ng) return false;
        c->groups = ng, c->cap_groups = cap;
    }
    c->groups[c->n_groups++] = (struct sgroup){.k = k, .cont = cont};
    return true;
}

/* The groups of state s, made once per state: its terminal frames (token
 * references aside) grouped by rule call (the same parent frame) and by
 * the frame that follows their chains. The alternatives of one call (the
 * character ranges of a string body's [^"\\], the keywords of a value)
 * are walked once together, and their context nodes lead to one
 * continuation; grouping wider (every frame of a lexeme) would make a
 * class per combination of calls, which states rarely share.
 * Returns the first group's index; *n gets the count. */
static uint32_t state_groups(kt_constraint *c, uint32_t s, uint32_t *n) {
    uint32_t first;
    if (u64map_get(&c->group_of_state, s, &first)) {
        first--;
        *n = c->n_groups > first ? c->groups[first].n_in_state : 0;
        return first;
    }
    first = c->n_groups, *n = 0;
    const uint32_t n_frames = c->st_n[s];
    chain *ch = malloc(((size_t)n_frames + 1) * sizeof *ch);
    if (!ch) return fail(c, "out of memory for grammar classes"), first;
    uint32_t m = 0;
    for (uint32_t i = 0; i < n_frames; i++) {
        uint32_t f = c->members.v[c->st_off[s] + i];
        if (f <= FRAME_CTX) continue;
        uint32_t type = c->g->elems[c->fpos[f]].type;
        if (type == KT_GE_TOKEN || type == KT_GE_NOT_TOKEN) continue;
        ch[m].n = chain_of(c, f, ch[m].f);
        m++;
    }
    for (uint32_t i = 1; i < m; i++) /* insertion sort: states hold few frames */
        for (uint32_t j = i; j > 0 && chain_cmp(c, &ch[j - 1], &ch[j]) > 0; j--) {
            chain tmp = ch[j];
            ch[j] = ch[j - 1], ch[j - 1] = tmp;
        }
    for (uint32_t a = 0, b; a < m && !c->error[0]; a = b) {
        const group_id id = group_of(c, &ch[a]);
        for (b = a + 1; b < m && group_cmp(id, group_of(c, &ch[b])) == 0; b++) {}
        gclass *k = class_of(c, ch + a, b - a);
        if (!k) break;
        uint32_t cont = DEAD; /* nothing can follow the root */
        if (k->n_ctx && id.pos != NO_CONT) cont = state_at(c, id.pos, id.parent);
        if (!push_group(c, k, cont)) fail(c, "out of memory for grammar classes");
        else (*n)++;
    }
    free(ch);
    if (*n) c->groups[first].n_in_state = *n;
    if (!c->error[0] && !u64map_put(&c->group_of_state, s, first + 1)) fail(c, "out of memory for grammar classes");
    return first;
}

/* ---- the API ----------------------------------------------------------- */

static bool is_eog(const kt_constraint *c, int32_t token) {
    for (int i = 0; i < c->n_eog; i++)
        if (c->eog[i] == token) return true;
    return false;
}

/* Frames of state s, and their count. */
static const uint32_t *frames_of(const kt_constraint *c, uint32_t s, uint32_t *n) {
    *n = c->st_n[s];
    return c->members.v + c->st_off[s];
}

/* The state after token from s: its token references step over it, its
 * bytes (if it has any in the trie) are matched; DEAD if neither. */
static uint32_t step_token(kt_constraint *c, uint32_t s, int32_t token) {
    if (s == DEAD) return DEAD;
    uint32_t by_bytes = DEAD;
    if (kt_token_trie_has(c->trie, token)) {
        const uint8_t *b = c->trie->bytes + c->trie->tok_off[token];
        by_bytes = s;
        for (uint32_t i = 0; i < c->trie->tok_len[token] && by_bytes != DEAD; i++) by_bytes = step_byte(c, by_bytes, b[i]);
    }
    if (!(c->st_flags[s] & ST_TOKREF)) return by_bytes;
    const uint32_t from = c->out.n;
    uint32_t n;
    const uint32_t *fr = frames_of(c, s, &n);
    c->stamp++;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t f = fr[i];
        if (f <= FRAME_CTX) continue;
        const kt_gelem *e = &c->g->elems[c->fpos[f]];
        bool ok = (e->type == KT_GE_TOKEN && (int32_t)e->value == token) ||
                  (e->type == KT_GE_NOT_TOKEN && (int32_t)e->value != token);
        if (ok) expand(c, c->fpos[f] + 1, c->fpar[f]);
        fr = frames_of(c, s, &n); /* expand may grow members: re-read */
    }
    if (by_bytes != DEAD) {
        uint32_t m;
        const uint32_t *bf = frames_of(c, by_bytes, &m);
        for (uint32_t i = 0; i < m; i++) u32vec_push(&c->out, bf[i]);
        if (c->out.failed) fail(c, "out of memory for parse states");
    }
    uint32_t next = c->error[0] ? DEAD : intern(c, from);
    c->out.n = from;
    return next;
}

bool kt_constraint_can_end(const kt_constraint *c) {
    return !c->error[0] && (c->st_flags[c->state] & ST_DONE);
}

bool kt_constraint_is_done(const kt_constraint *c) {
    return c->ended || c->error[0] || (c->st_n[c->state] == 1 && (c->st_flags[c->state] & ST_DONE));
}

const char *kt_constraint_error(const kt_constraint *c) {
    return c->error[0] ? c->error : NULL;
}

/* An end-of-generation id ends generation, so it is allowed exactly where
 * the grammar can end, whatever its bytes or a token reference say. */
bool kt_constraint_allows(kt_constraint *c, int32_t token) {
    if (c->error[0] || c->ended || token < 0 || token >= c->trie->n_vocab) return false;
    if (is_eog(c, token)) return kt_constraint_can_end(c);
    return step_token(c, c->state, token) != DEAD;
}

int kt_constraint_allows_run(kt_constraint *c, const int32_t *tokens, int n) {
    if (c->error[0] || c->ended) return 0;
    uint32_t state = c->state;
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= c->trie->n_vocab) return i;
        if (is_eog(c, tokens[i])) return c->st_flags[state] & ST_DONE ? i + 1 : i; /* nothing follows an end */
        if ((state = step_token(c, state, tokens[i])) == DEAD) return i;
    }
    return n;
}

bool kt_constraint_accept(kt_constraint *c, int32_t token) {
    if (c->error[0] || c->ended || token < 0 || token >= c->trie->n_vocab) return false;
    if (is_eog(c, token)) {
        if (!kt_constraint_can_end(c)) return false;
        c->ended = true;
        return true;
    }
    uint32_t next = step_token(c, c->state, token);
    if (next == DEAD) return false;
    c->state = next;
    return true;
}

bool kt_constraint_accept_bytes(kt_constraint *c, const uint8_t *bytes, size_t n) {
    if (c->error[0] || c->ended) return false;
    uint32_t s = c->state;
    for (size_t i = 0; i < n && s != DEAD; i++) s = step_byte(c, s, bytes[i]);
    if (s == DEAD) return false;
    c->state = s;
    return true;
}

static void set_bit(uint64_t *m, int32_t t) {
    m[(uint32_t)t >> 6] |= 1ull << ((uint32_t)t & 63);
}

/* Adds the tokens a token-reference frame allows. */
static void mask_token_ref(const kt_constraint *c, const kt_gelem *e, uint64_t *mask) {
    if (e->type == KT_GE_TOKEN) {
        if ((int32_t)e->value < c->trie->n_vocab) set_bit(mask, (int32_t)e->value);
        return;
    }
    uint32_t keep = (uint32_t)c->trie->n_vocab & 63;
    for (uint32_t w = 0; w < c->n_words; w++) mask[w] = ~0ull;
    if (keep) mask[c->n_words - 1] = (1ull << keep) - 1;
    if ((int32_t)e->value < c->trie->n_vocab) mask[e->value >> 6] &= ~(1ull << (e->value & 63));
}

/* Adds the tokens below each of class k's context nodes that the real
 * rest of the stack (state cont) takes. */
static void mask_ctx(kt_constraint *c, const gclass *k, uint32_t cont, uint64_t *mask) {
    for (int b = 0; b < 256; b++) {
        if (k->ctx_off[b + 1] == k->ctx_off[b]) continue;
        uint32_t next = step_byte(c, cont, (uint8_t)b);
        if (next == DEAD) continue;
        for (uint32_t i = k->ctx_off[b]; i < k->ctx_off[b + 1]; i++) walk_from(c, k->ctx_child[i], next, mask);
    }
}

/* Each group adds its class's accept set (once per class) and what its
 * context nodes lead to (once per class and continuation). */
void kt_constraint_mask(kt_constraint *c, uint64_t *mask) {
    memset(mask, 0, c->n_words * sizeof *mask);
    if (c->error[0] || c->ended) return;
    const uint32_t s = c->state;
    if (c->st_flags[s] & ST_TOKREF)
        for (uint32_t i = 0; i < c->st_n[s]; i++) {
            uint32_t f = c->members.v[c->st_off[s] + i];
            if (f <= FRAME_CTX) continue;
            const kt_gelem *e = &c->g->elems[c->fpos[f]];
            if (e->type == KT_GE_TOKEN || e->type == KT_GE_NOT_TOKEN) mask_token_ref(c, e, mask);
        }
    uint32_t n;
    const uint32_t first = state_groups(c, s, &n);
    for (uint32_t i = first; i < first + n && !c->error[0]; i++) {
        const struct sgroup g = c->groups[i];
        bool ored = false, walked = false;
        for (uint32_t j = first; j < i; j++) {
            ored |= c->groups[j].k == g.k;
            walked |= c->groups[j].k == g.k && c->groups[j].cont == g.cont;
        }
        if (!ored && g.k->accept)
            for (uint32_t w = 0; w < c->n_words; w++) mask[w] |= g.k->accept[w];
        else if (!ored)
            for (uint32_t j = 0; j < g.k->n_ids; j++) mask[g.k->ids[j] >> 6] |= 1ull << (g.k->ids[j] & 63);
        if (!walked && g.cont != DEAD) mask_ctx(c, g.k, g.cont, mask);
    }
    for (int i = 0; i < c->n_eog; i++) { /* see kt_constraint_allows */
        uint32_t t = (uint32_t)c->eog[i];
        if (kt_constraint_can_end(c)) mask[t >> 6] |= 1ull << (t & 63);
        else mask[t >> 6] &= ~(1ull << (t & 63));
    }
    if (c->error[0]) memset(mask, 0, c->n_words * sizeof *mask);
}

void kt_constraint_free(kt_constraint *c) {
    if (!c) return;
    for (uint32_t i = 0; i < c->n_held; i++) c->held[i]->refs--;
    if (c->cache) cache_trim(c->cache);
    free(c->fpos), free(c->fpar), free(c->fstamp);
    u64map_free(&c->frame_of), u64map_free(&c->state_of), u64map_free(&c->step);
    for (uint32_t i = 0; c->row && i < c->cap_states; i++) free(c->row[i]);
    free(c->row), free(c->uni), free(c->scratch);
    free(c->members.v), free(c->st_off), free(c->st_n), free(c->st_flags);
    free(c->held), free(c->groups), u64map_free(&c->group_of_state);
    free(c->out.v), free(c->work.v), free(c->key.v);
    free(c->walk), free(c->eog);
    free(c);
}

kt_constraint *kt_constraint_new(const kt_grammar *g, const kt_token_trie *trie, kt_gmask_cache *cache,
                                 const int32_t *eog, int n_eog, kt_error *err) {
    kt_constraint *c = calloc(1, sizeof *c);
    if (!c) goto nomem;
    c->g = g, c->trie = trie, c->cache = cache;
    c->n_words = ((uint32_t)trie->n_vocab + 63) / 64;
    c->cap_frames = 256, c->cap_states = 256;
    c->max_rows = ROW_BYTES / (4 * g->n_byte_classes);
    c->fpos = malloc(c->cap_frames * sizeof *c->fpos);
    c->fpar = malloc(c->cap_frames * sizeof *c->fpar);
    c->fstamp = calloc(c->cap_frames, sizeof *c->fstamp);
    c->st_off = malloc(c->cap_states * sizeof *c->st_off);
    c->st_n = malloc(c->cap_states * sizeof *c->st_n);
    c->st_flags = malloc(c->cap_states);
    c->row = calloc(c->cap_states, sizeof *c->row);
    c->scratch = malloc(c->n_words * sizeof *c->scratch);
    c->uni = calloc(c->cap_states, sizeof *c->uni);
    c->walk = malloc(((size_t)trie->max_depth + 2) * sizeof *c->walk);
    c->eog = malloc(((size_t)n_eog + 1) * sizeof *c->eog);
    if (!c->fpos || !c->fpar || !c->fstamp || !c->st_off || !c->st_n || !c->st_flags || !c->row || !c->scratch || !c->uni ||
        !c->walk || !c->eog || !u64map_init(&c->frame_of, 1024) ||
        !u64map_init(&c->state_of, 1024) || !u64map_init(&c->step, 4096) || !u64map_init(&c->group_of_state, 256))
        goto nomem;
    if (n_eog > 0) memcpy(c->eog, eog, (size_t)n_eog * sizeof *eog);
    c->n_eog = n_eog;
    /* frames 0 and 1 are FRAME_DONE and FRAME_CTX; state 0 is DEAD */
    c->fpos[0] = c->fpos[1] = 0, c->fpar[0] = c->fpar[1] = 0, c->n_frames = 2;
    c->st_off[0] = 0, c->st_n[0] = 0, c->st_flags[0] = 0, c->n_states = 1;
    const kt_grule *root = &g->rules[g->root];
    const uint32_t from = c->out.n;
    c->stamp++;
    for (uint32_t a = 0; a < root->n_alts; a++) expand(c, g->alts[root->first_alt + a], FRAME_DONE);
    c->state = c->error[0] ? DEAD : intern(c, from);
    c->out.n = from;
    if (c->error[0] || c->state == DEAD) {
        kt_error_set(err, KT_ERR_ARG, "grammar: %s", c->error[0] ? c->error : "the start state is empty");
        kt_constraint_free(c);
        return NULL;
    }
    return c;
nomem:
    kt_constraint_free(c);
    kt_error_set(err, KT_ERR_NOMEM, "out of memory for a grammar constraint");
    return NULL;
}
