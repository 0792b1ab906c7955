/*
 * lexical.c - what the token masks need to know about a grammar, worked
 * out once when it is compiled: which positions are lexical, and a
 * fingerprint of the whole grammar.
 *
 * A rule *nests* when it can reach itself through a call that is not last
 * in its alternative (a JSON value inside an array: the stack grows with
 * the input). A tail call (a repetition's loop, `x ::= c x?`) does not
 * nest. A rule is *lexical* when neither it nor any rule it can reach
 * nests: strings, numbers, keywords, whitespace, a format's characters,
 * a flat object of such. A position's rest is lexical when every element
 * from it to its alternative's END is a terminal or a lexical rule. The
 * masks (constraint.c) classify the vocabulary once for a whole lexeme,
 * so lexical rests are where they can.
 *
 * Byte classes: bytes that every BYTE and SET element takes or refuses
 * together step every parse state alike, so the masks keep one step per
 * class. The partition is refined by each element in turn.
 *
 * Lexical rules are linear in the grammar: the strongly connected components of
 * the call graph (Tarjan's algorithm, iterative, so a deep grammar cannot
 * overflow the C stack). Within a component every call edge lies on a
 * cycle through every member, so a rule nests iff its component holds a
 * non-tail call between two of its members; and Tarjan finishes
 * components callees first, so "reaches a nesting rule" is one pass.
 */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "grammar/grammar.h"

/* The call graph: calls of rule r are callee[off[r] .. off[r + 1]),
 * tail[i] says whether call i is last in its alternative. */
typedef struct call_graph {
    uint32_t *off, *callee;
    uint8_t *tail;
} call_graph;

static bool call_graph_build(const kt_grammar *g, call_graph *cg) {
    uint32_t n_calls = 0;
    for (uint32_t p = 0; p < g->n_elems; p++) n_calls += g->elems[p].type == KT_GE_RULE;
    cg->off = malloc(((size_t)g->n_rules + 1) * sizeof *cg->off);
    cg->callee = malloc(((size_t)n_calls + 1) * sizeof *cg->callee);
    cg->tail = malloc((size_t)n_calls + 1);
    if (!cg->off || !cg->callee || !cg->tail) return false;
    uint32_t n = 0;
    for (uint32_t r = 0; r < g->n_rules; r++) {
        cg->off[r] = n;
        const kt_grule *rule = &g->rules[r];
        for (uint32_t a = 0; a < rule->n_alts; a++)
            for (uint32_t p = g->alts[rule->first_alt + a]; g->elems[p].type != KT_GE_END; p++)
                if (g->elems[p].type == KT_GE_RULE) {
                    cg->callee[n] = g->elems[p].value;
                    cg->tail[n++] = g->elems[p + 1].type == KT_GE_END;
                }
    }
    cg->off[g->n_rules] = n;
    return true;
}

static void call_graph_free(call_graph *cg) {
    free(cg->off), free(cg->callee), free(cg->tail);
}

/* lex[r] for every rule (see the top of the file); comp[r] numbers r's
 * strongly connected component, and `order` lists the rules component by
 * component, callees' components first. */
static bool lexical_rules(const kt_grammar *g, const call_graph *cg, uint8_t *lex, uint32_t *comp, uint32_t *order) {
    const uint32_t n = g->n_rules, UNSEEN = UINT32_MAX;
    uint32_t *index = malloc((size_t)n * sizeof *index), *low = malloc((size_t)n * sizeof *low);
    uint32_t *stack = malloc((size_t)n * sizeof *stack);
    uint32_t *call_stack = malloc((size_t)n * sizeof *call_stack), *next_edge = malloc((size_t)n * sizeof *next_edge);
    uint8_t *on_stack = calloc(n, 1), *comp_bad = calloc(n, 1);
    bool ok = index && low && stack && call_stack && next_edge && on_stack && comp_bad;
    if (ok) memset(index, 0xff, (size_t)n * sizeof *index);
    uint32_t counter = 0, sp = 0, n_comp = 0, n_order = 0;
    for (uint32_t root = 0; ok && root < n; root++) {
        if (index[root] != UNSEEN) continue;
        uint32_t depth = 0;
        call_stack[depth++] = root;
        index[root] = low[root] = counter++, next_edge[root] = cg->off[root];
        stack[sp++] = root, on_stack[root] = 1;
        while (depth) {
            uint32_t r = call_stack[depth - 1];
            if (next_edge[r] < cg->off[r + 1]) {
                uint32_t to = cg->callee[next_edge[r]++];
                if (index[to] == UNSEEN) {
                    index[to] = low[to] = counter++, next_edge[to] = cg->off[to];
                    stack[sp++] = to, on_stack[to] = 1;
                    call_stack[depth++] = to;
                } else if (on_stack[to] && index[to] < low[r]) {
                    low[r] = index[to];
                }
                continue;
            }
            depth--;
            if (depth && low[r] < low[call_stack[depth - 1]]) low[call_stack[depth - 1]] = low[r];
            if (low[r] != index[r]) continue;
            /* r roots a component: pop it; callee components are finished */
            uint32_t c = n_comp++, first = sp;
            do first--, on_stack[stack[first]] = 0, comp[stack[first]] = c;
            while (stack[first] != r);
            bool bad = false;
            for (uint32_t i = first; i < sp; i++)
                for (uint32_t e = cg->off[stack[i]]; e < cg->off[stack[i] + 1]; e++) {
                    uint32_t to = cg->callee[e];
                    if (comp[to] == c) bad |= !cg->tail[e];      /* nests */
                    else bad |= comp_bad[comp[to]];              /* reaches a rule that nests */
                }
            comp_bad[c] = bad;
            for (uint32_t i = first; i < sp; i++) order[n_order++] = stack[i];
            sp = first;
        }
    }
    for (uint32_t r = 0; ok && r < n; r++) lex[r] = !comp_bad[comp[r]];
    free(index), free(low), free(stack), free(call_stack), free(next_edge), free(on_stack), free(comp_bad);
    return ok;
}

/* ---- structural hashes of lexical rules ---------------------------------
 * rule_hash[r] names the structure rule r can reach (every rule it calls,
 * all their alternatives): equal for rules of any grammars that match the
 * same language the same way, so token classes keyed on them are shared
 * (constraint.c). Merkle-style: a rule's serialization names each callee
 * outside its component by the callee's hash (finished earlier, callees
 * first), and the rules of its own component (a loop) by local numbers in
 * order of first call from r. A component larger than HASH_MAX_COMPONENT
 * (quadratic to hash from every entry) hashes as the grammar's rule r. */
#define HASH_MAX_COMPONENT 64

enum { H_BYTE = 1u << 28, H_SET = 2u << 28, H_LOCAL = 3u << 28, H_TOKEN = 4u << 28, H_NOT = 5u << 28, H_END = 6u << 28,
       H_RULE_END = 7u << 28, H_CALLEE = 8u << 28, H_GRAMMAR = 9u << 28 };

typedef struct hbuf {
    uint32_t *v;
    size_t n, cap;
    bool failed;
} hbuf;

static void hpush(hbuf *b, uint32_t x) {
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        uint32_t *nv = realloc(b->v, cap * sizeof *nv);
        if (!nv) {
            b->failed = true;
            return;
        }
        b->v = nv, b->cap = cap;
    }
    b->v[b->n++] = x;
}

static void hpush128(hbuf *b, const uint64_t h[2]) {
    for (int w = 0; w < 2; w++) hpush(b, (uint32_t)h[w]), hpush(b, (uint32_t)(h[w] >> 32));
}

/* Serializes what rule `entry` reaches into b; local[] (per rule, stamped
 * with `stamp`) numbers the component's rules from this entry. */
static void serialize_from(const kt_grammar *g, const uint32_t *comp, uint32_t entry, uint32_t *local, uint32_t *seen,
                           uint32_t stamp, uint32_t *queue, hbuf *b) {
    uint32_t n_queue = 0;
    queue[n_queue++] = entry, seen[entry] = stamp, local[entry] = 0;
    for (uint32_t q = 0; q < n_queue; q++) {
        const kt_grule *r = &g->rules[queue[q]];
        for (uint32_t a = 0; a < r->n_alts; a++) {
            for (uint32_t p = g->alts[r->first_alt + a];; p++) {
                const kt_gelem *e = &g->elems[p];
                if (e->type == KT_GE_END) break;
                switch (e->type) {
                case KT_GE_BYTE: hpush(b, H_BYTE | (e->value & 0xff)); break;
                case KT_GE_SET:
                    hpush(b, H_SET);
                    for (int w = 0; w < 4; w++)
                        hpush(b, (uint32_t)g->sets[e->value].bits[w]), hpush(b, (uint32_t)(g->sets[e->value].bits[w] >> 32));
                    break;
                case KT_GE_TOKEN: hpush(b, H_TOKEN), hpush(b, e->value); break;
                case KT_GE_NOT_TOKEN: hpush(b, H_NOT), hpush(b, e->value); break;
                default: /* KT_GE_RULE */
                    if (comp[e->value] != comp[entry]) {
                        hpush(b, H_CALLEE), hpush128(b, g->rule_hash[e->value]);
                        break;
                    }
                    if (seen[e->value] != stamp) seen[e->value] = stamp, local[e->value] = n_queue, queue[n_queue++] = e->value;
                    hpush(b, H_LOCAL | local[e->value]);
                }
            }
            hpush(b, H_END);
        }
        hpush(b, H_RULE_END);
    }
}

static bool rule_hashes(kt_grammar *g, const uint8_t *lex, const uint32_t *comp, const uint32_t *order) {
    const uint32_t n = g->n_rules;
    uint32_t *local = malloc(((size_t)n + 1) * sizeof *local), *seen = calloc((size_t)n + 1, sizeof *seen);
    uint32_t *queue = malloc(((size_t)n + 1) * sizeof *queue);
    hbuf b = {0};
    bool ok = local && seen && queue;
    uint32_t stamp = 0;
    for (uint32_t i = 0, j; ok && i < n; i = j) {
        for (j = i + 1; j < n && comp[order[j]] == comp[order[i]]; j++) {}
        for (uint32_t k = i; k < j; k++) {
            const uint32_t r = order[k];
            b.n = 0;
            if (!lex[r] || j - i > HASH_MAX_COMPONENT) { /* never keyed structurally, or too big to */
                hpush(&b, H_GRAMMAR), hpush128(&b, g->fingerprint), hpush(&b, r);
            } else {
                serialize_from(g, comp, r, local, seen, ++stamp, queue, &b);
            }
            if (b.failed) {
                ok = false;
                break;
            }
            XXH128_hash_t h = XXH3_128bits(b.v, b.n * sizeof *b.v);
            g->rule_hash[r][0] = h.low64, g->rule_hash[r][1] = h.high64;
        }
    }
    free(local), free(seen), free(queue), free(b.v);
    return ok;
}

/* Splits every class of `cls` into the bytes in `set` and those not. */
static void refine(uint8_t cls[256], uint32_t *n, const kt_byteset *set) {
    int16_t split[256][2];
    memset(split, -1, sizeof split);
    uint32_t m = 0;
    for (int b = 0; b < 256; b++) {
        int in = kt_byteset_has(set, (uint8_t)b);
        if (split[cls[b]][in] < 0) split[cls[b]][in] = (int16_t)m++;
        cls[b] = (uint8_t)split[cls[b]][in];
    }
    *n = m; /* at most 256: a partition of 256 bytes */
}

static void byte_classes(kt_grammar *g) {
    memset(g->byte_class, 0, sizeof g->byte_class);
    g->n_byte_classes = 1;
    for (uint32_t i = 0; i < g->n_sets; i++) refine(g->byte_class, &g->n_byte_classes, &g->sets[i]);
    uint8_t done[256] = {0}; /* BYTE elements, each value once */
    for (uint32_t p = 0; p < g->n_elems; p++) {
        if (g->elems[p].type != KT_GE_BYTE || done[g->elems[p].value & 255]) continue;
        kt_byteset one = {{0, 0, 0, 0}};
        one.bits[g->elems[p].value >> 6 & 3] = 1ull << (g->elems[p].value & 63);
        done[g->elems[p].value & 255] = 1;
        refine(g->byte_class, &g->n_byte_classes, &one);
    }
}

/* The compiled form, not the text: grammars that differ only in rule
 * names, spacing or comments share their token classes. */
static bool fingerprint(kt_grammar *g) {
    XXH3_state_t *st = XXH3_createState();
    if (!st) return false;
    XXH3_128bits_reset(st);
    XXH3_128bits_update(st, g->elems, (size_t)g->n_elems * sizeof *g->elems);
    XXH3_128bits_update(st, g->alts, (size_t)g->n_alts_total * sizeof *g->alts);
    XXH3_128bits_update(st, g->rules, (size_t)g->n_rules * sizeof *g->rules);
    XXH3_128bits_update(st, g->sets, (size_t)g->n_sets * sizeof *g->sets);
    XXH3_128bits_update(st, &g->root, sizeof g->root);
    XXH128_hash_t h = XXH3_128bits_digest(st);
    XXH3_freeState(st);
    g->fingerprint[0] = h.low64, g->fingerprint[1] = h.high64;
    return true;
}

bool kt_grammar_analyze(kt_grammar *g) {
    byte_classes(g);
    if (!fingerprint(g)) return false;
    call_graph cg = {0};
    uint8_t *lex = g->rule_lexical = malloc((size_t)g->n_rules + 1);
    g->rest_lexical = malloc((size_t)g->n_elems + 1);
    g->rule_hash = malloc(((size_t)g->n_rules + 1) * sizeof *g->rule_hash);
    uint32_t *comp = malloc(((size_t)g->n_rules + 1) * sizeof *comp), *order = malloc(((size_t)g->n_rules + 1) * sizeof *order);
    bool ok = lex && g->rest_lexical && g->rule_hash && comp && order && call_graph_build(g, &cg) &&
              lexical_rules(g, &cg, lex, comp, order) && rule_hashes(g, lex, comp, order);
    for (uint32_t p = g->n_elems; ok && p-- > 0;) {
        const kt_gelem *e = &g->elems[p];
        if (e->type == KT_GE_END) g->rest_lexical[p] = 1;
        else if (e->type == KT_GE_RULE) g->rest_lexical[p] = lex[e->value] && g->rest_lexical[p + 1];
        else g->rest_lexical[p] = g->rest_lexical[p + 1];
    }
    call_graph_free(&cg);
    free(comp), free(order);
    return ok;
}
