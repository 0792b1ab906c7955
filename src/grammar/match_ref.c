/*
 * match_ref.c - the reference matcher of grammar.h: a set of stacks of
 * positions, advanced a byte (or a token) at a time, as llama.cpp's
 * grammar stacks are advanced a code point at a time.
 *
 * This is the oracle the fast token masks are checked against, so it is
 * written to be obviously right rather than fast: every stack is its own
 * array, every step builds a fresh set, and a set is a hash set of whole
 * stacks so identical stacks are kept once.
 *
 * Invariant of every stored state (what "expanded" means): each stack is
 * empty (the root is complete) or its top is a terminal element (BYTE,
 * SET, TOKEN, NOT_TOKEN), never RULE or END. No stack ever holds an END
 * position: a continuation that would be END is not pushed (the tail-call
 * rule that keeps right recursion from growing the stack).
 */
#include "grammar/grammar.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"

#define NONE UINT32_MAX
/* Distinct intermediate stacks one step may visit before it is given up
 * (the step is then refused): bounds the work of a grammar full of
 * nullable rules. */
#define MAX_SEEN (KT_GMATCH_MAX_STACKS * 256u)
/* The same budget in positions (stack lengths summed): deep stacks cost
 * their length to copy and compare. 2^24 positions is 64 MiB. */
#define MAX_SEEN_POSITIONS (1ull << 24)

enum { ST_OK = 0, ST_NOMEM, ST_FULL };

typedef struct gstack {
    uint32_t *pos; /* pos[n - 1] is the top */
    uint32_t n;
} gstack;

/* A set of stacks: the array plus an open-addressing index (slot = index
 * + 1, 0 = empty) kept at most half full. */
typedef struct sset {
    gstack *v;
    uint32_t n, cap;
    uint32_t *slot;
    uint32_t mask;
} sset;

struct kt_gmatch {
    const kt_grammar *g;
    sset cur; /* never empty */
};

/* ---- sets of stacks ----------------------------------------------------- */

static void sset_free(sset *s) {
    for (uint32_t i = 0; i < s->n; i++) free(s->v[i].pos);
    free(s->v);
    free(s->slot);
    *s = (sset){0};
}

static uint64_t stack_hash(const uint32_t *pos, uint32_t n) {
    uint64_t h = 0xcbf29ce484222325ull ^ n;
    for (uint32_t i = 0; i < n; i++) h = (h ^ pos[i]) * 0x100000001b3ull;
    return h ^ (h >> 31);
}

static bool same(const gstack *a, const uint32_t *pos, uint32_t n) {
    return a->n == n && (n == 0 || memcmp(a->pos, pos, sizeof *pos * n) == 0);
}

static bool sset_reindex(sset *s) {
    uint32_t slots = s->mask ? (s->mask + 1) * 2 : 16;
    uint32_t *t = calloc(slots, sizeof *t);
    if (!t) return false;
    for (uint32_t i = 0; i < s->n; i++) {
        uint32_t j = (uint32_t)stack_hash(s->v[i].pos, s->v[i].n) & (slots - 1);
        while (t[j]) j = (j + 1) & (slots - 1);
        t[j] = i + 1;
    }
    free(s->slot);
    s->slot = t;
    s->mask = slots - 1;
    return true;
}

/* Adds a copy of the stack base[0..n) + extra (when extra is not NONE)
 * unless an equal one is there. Returns 1 added, 0 already there, -1 out
 * of memory. */
static int sset_add(sset *s, const uint32_t *base, uint32_t n, uint32_t extra) {
    uint32_t len = n + (extra != NONE);
    uint32_t *pos = malloc(sizeof *pos * (len ? len : 1));
    if (!pos) return -1;
    if (n) memcpy(pos, base, sizeof *pos * n);
    if (extra != NONE) pos[n] = extra;
    if ((uint64_t)(s->n + 1) * 2 > (uint64_t)s->mask + 1 && !sset_reindex(s)) {
        free(pos);
        return -1;
    }
    uint32_t j = (uint32_t)stack_hash(pos, len) & s->mask;
    for (; s->slot[j]; j = (j + 1) & s->mask) {
        if (same(&s->v[s->slot[j] - 1], pos, len)) {
            free(pos);
            return 0;
        }
    }
    if (s->n == s->cap) {
        uint32_t cap = s->cap ? s->cap * 2 : 8;
        gstack *v = realloc(s->v, sizeof *v * cap);
        if (!v) {
            free(pos);
            return -1;
        }
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n] = (gstack){pos, len};
    s->slot[j] = ++s->n;
    return 1;
}

static int sset_copy(const sset *from, sset *to) {
    *to = (sset){0};
    for (uint32_t i = 0; i < from->n; i++) {
        if (sset_add(to, from->v[i].pos, from->v[i].n, NONE) < 0) {
            sset_free(to);
            return ST_NOMEM;
        }
    }
    return ST_OK;
}

/* ---- expansion ------------------------------------------------------- */

typedef struct todo {
    gstack *v;
    uint32_t n, cap;
} todo;

/* Pushes base[0..n) + a + b (each skipped when NONE). */
static int todo_push(todo *t, const uint32_t *base, uint32_t n, uint32_t a, uint32_t b) {
    if (t->n == t->cap) {
        uint32_t cap = t->cap ? t->cap * 2 : 16;
        gstack *v = realloc(t->v, sizeof *v * cap);
        if (!v) return ST_NOMEM;
        t->v = v;
        t->cap = cap;
    }
    uint32_t len = n + (a != NONE) + (b != NONE);
    uint32_t *pos = malloc(sizeof *pos * (len ? len : 1));
    if (!pos) return ST_NOMEM;
    if (n) memcpy(pos, base, sizeof *pos * n);
    if (a != NONE) pos[n++] = a;
    if (b != NONE) pos[n++] = b;
    t->v[t->n++] = (gstack){pos, len};
    return ST_OK;
}

/* The output of one step: the expanded stacks, and every intermediate
 * stack already expanded into them. Expansion depends on the stack alone,
 * so a stack seen once in the step need not be expanded again, whichever
 * stack of the step it came from: nullable rules cannot multiply work. */
typedef struct step_out {
    sset out, seen;
    uint64_t seen_positions; /* lengths of the stacks in `seen`, summed */
} step_out;

/* Adds to o->out every expanded stack that base[0..n) + extra stands for:
 * a RULE on top is replaced, once per alternative, by its continuation
 * (the element after the RULE, unless END) and the alternative's first
 * element (unless the alternative is empty). Terminates because no rule
 * is left-recursive (grammar.h). */
static int expand(const kt_grammar *g, const uint32_t *base, uint32_t n, uint32_t extra, step_out *o) {
    todo t = {0};
    sset *out = &o->out;
    int rc = todo_push(&t, base, n, extra, NONE);
    while (rc == ST_OK && t.n) {
        gstack s = t.v[--t.n];
        int added = sset_add(&o->seen, s.pos, s.n, NONE);
        if (added < 0) {
            rc = ST_NOMEM;
        } else if (added == 0) {
            /* reached before by another path */
        } else if (o->seen.n > MAX_SEEN || (o->seen_positions += s.n) > MAX_SEEN_POSITIONS) {
            rc = ST_FULL;
        } else if (s.n == 0 || g->elems[s.pos[s.n - 1]].type != KT_GE_RULE) {
            if (sset_add(out, s.pos, s.n, NONE) < 0) rc = ST_NOMEM;
            else if (out->n > KT_GMATCH_MAX_STACKS) rc = ST_FULL;
        } else {
            uint32_t top = s.pos[s.n - 1];
            const kt_grule *r = &g->rules[g->elems[top].value];
            uint32_t cont = g->elems[top + 1].type != KT_GE_END ? top + 1 : NONE;
            for (uint32_t a = r->first_alt; a < r->first_alt + r->n_alts && rc == ST_OK; a++) {
                uint32_t first = g->alts[a];
                rc = todo_push(&t, s.pos, s.n - 1, cont, g->elems[first].type != KT_GE_END ? first : NONE);
            }
        }
        free(s.pos);
    }
    for (uint32_t i = 0; i < t.n; i++) free(t.v[i].pos);
    free(t.v);
    return rc;
}

/* The stack s with its top (a terminal just matched) stepped over,
 * expanded into out. */
static int advance_top(const kt_grammar *g, const gstack *s, step_out *out) {
    uint32_t top = s->pos[s->n - 1];
    uint32_t next = g->elems[top + 1].type != KT_GE_END ? top + 1 : NONE;
    return expand(g, s->pos, s->n - 1, next, out);
}

static bool byte_matches(const kt_grammar *g, kt_gelem e, uint8_t b) {
    if (e.type == KT_GE_BYTE) return e.value == b;
    if (e.type == KT_GE_SET) return kt_byteset_has(&g->sets[e.value], b);
    return false; /* token references match only whole tokens */
}

/* out = the stacks of `in` that accept byte b, advanced. */
static int step_set(const kt_grammar *g, const sset *in, uint8_t b, step_out *out) {
    for (uint32_t i = 0; i < in->n; i++) {
        const gstack *s = &in->v[i];
        if (s->n == 0 || !byte_matches(g, g->elems[s->pos[s->n - 1]], b)) continue;
        int rc = advance_top(g, s, out);
        if (rc != ST_OK) return rc;
    }
    return ST_OK;
}

/* out = `from` advanced by n >= 1 bytes (empty when they are not
 * accepted). */
static int run_bytes(const kt_grammar *g, const sset *from, const uint8_t *bytes, size_t n, sset *out) {
    sset cur = {0};
    const sset *src = from;
    for (size_t i = 0; i < n; i++) {
        step_out next = {0};
        int rc = step_set(g, src, bytes[i], &next);
        sset_free(&cur);
        sset_free(&next.seen);
        if (rc != ST_OK || next.out.n == 0) {
            sset_free(&next.out);
            *out = (sset){0};
            return rc;
        }
        cur = next.out;
        src = &cur;
    }
    *out = cur;
    return ST_OK;
}

/* Replaces m's state with `next` when it is not empty; else keeps it. */
static bool commit(kt_gmatch *m, sset *next, int rc) {
    if (rc != ST_OK || next->n == 0) {
        sset_free(next);
        return false;
    }
    sset_free(&m->cur);
    m->cur = *next;
    return true;
}

/* ---- the API ---------------------------------------------------------- */

kt_gmatch *kt_gmatch_new(const kt_grammar *g, kt_error *err) {
    kt_gmatch *m = calloc(1, sizeof *m);
    if (!m) {
        kt_error_set(err, KT_ERR_NOMEM, "out of memory starting a grammar match");
        return NULL;
    }
    m->g = g;
    const kt_grule *root = &g->rules[g->root];
    step_out start = {0};
    int rc = ST_OK;
    for (uint32_t a = root->first_alt; a < root->first_alt + root->n_alts && rc == ST_OK; a++) {
        uint32_t first = g->alts[a];
        rc = expand(g, NULL, 0, g->elems[first].type != KT_GE_END ? first : NONE, &start);
    }
    sset_free(&start.seen);
    m->cur = start.out;
    if (rc != ST_OK) {
        if (rc == ST_FULL)
            kt_error_set(err, KT_ERR_ARG, "the grammar's start expands to more than %u stacks", KT_GMATCH_MAX_STACKS);
        else
            kt_error_set(err, KT_ERR_NOMEM, "out of memory starting a grammar match");
        kt_gmatch_free(m);
        return NULL;
    }
    return m;
}

kt_gmatch *kt_gmatch_clone(const kt_gmatch *m) {
    kt_gmatch *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->g = m->g;
    if (sset_copy(&m->cur, &c->cur) != ST_OK) {
        free(c);
        return NULL;
    }
    return c;
}

void kt_gmatch_free(kt_gmatch *m) {
    if (!m) return;
    sset_free(&m->cur);
    free(m);
}

bool kt_gmatch_byte(kt_gmatch *m, uint8_t byte) {
    step_out next = {0};
    int rc = step_set(m->g, &m->cur, byte, &next);
    sset_free(&next.seen);
    return commit(m, &next.out, rc);
}

bool kt_gmatch_bytes(kt_gmatch *m, const uint8_t *bytes, size_t n) {
    if (n == 0) return true;
    sset next;
    int rc = run_bytes(m->g, &m->cur, bytes, n, &next);
    return commit(m, &next, rc);
}

/* As llama.cpp's llama_grammar_accept_token: a stack whose top is a token
 * reference takes the token by id only; every other stack takes its text
 * (a token with empty text leaves those stacks as they are). */
bool kt_gmatch_token(kt_gmatch *m, int32_t token_id, const uint8_t *bytes, size_t n) {
    const kt_grammar *g = m->g;
    step_out tok = {0};
    sset *next = &tok.out;
    int rc = ST_OK;
    for (uint32_t i = 0; i < m->cur.n && rc == ST_OK; i++) {
        const gstack *s = &m->cur.v[i];
        if (s->n == 0) continue;
        kt_gelem e = g->elems[s->pos[s->n - 1]];
        bool hit = (e.type == KT_GE_TOKEN && e.value == (uint32_t)token_id) ||
                   (e.type == KT_GE_NOT_TOKEN && e.value != (uint32_t)token_id);
        if (hit) rc = advance_top(g, s, &tok);
        else if (bytes && n == 0 && (e.type == KT_GE_BYTE || e.type == KT_GE_SET) &&
                 sset_add(next, s->pos, s->n, NONE) < 0)
            rc = ST_NOMEM;
    }
    if (rc == ST_OK && bytes && n > 0) {
        sset text;
        rc = run_bytes(g, &m->cur, bytes, n, &text);
        for (uint32_t i = 0; i < text.n && rc == ST_OK; i++) {
            if (sset_add(next, text.v[i].pos, text.v[i].n, NONE) < 0) rc = ST_NOMEM;
            else if (next->n > KT_GMATCH_MAX_STACKS) rc = ST_FULL;
        }
        sset_free(&text);
    }
    sset_free(&tok.seen);
    return commit(m, next, rc);
}

bool kt_gmatch_can_end(const kt_gmatch *m) {
    for (uint32_t i = 0; i < m->cur.n; i++)
        if (m->cur.v[i].n == 0) return true;
    return false;
}

bool kt_gmatch_is_done(const kt_gmatch *m) {
    for (uint32_t i = 0; i < m->cur.n; i++)
        if (m->cur.v[i].n != 0) return false;
    return m->cur.n > 0;
}

bool kt_grammar_accepts(const kt_grammar *g, const uint8_t *bytes, size_t n) {
    kt_gmatch *m = kt_gmatch_new(g, NULL);
    if (!m) return false;
    bool ok = kt_gmatch_bytes(m, bytes, n) && kt_gmatch_can_end(m);
    kt_gmatch_free(m);
    return ok;
}
