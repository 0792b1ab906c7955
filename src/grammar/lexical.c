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

/* lex[r] for every rule (see the top of the file). */
static bool lexical_rules(const kt_grammar *g, const call_graph *cg, uint8_t *lex) {
    const uint32_t n = g->n_rules, UNSEEN = UINT32_MAX;
    uint32_t *index = malloc((size_t)n * sizeof *index), *low = malloc((size_t)n * sizeof *low);
    uint32_t *comp = malloc((size_t)n * sizeof *comp), *stack = malloc((size_t)n * sizeof *stack);
    uint32_t *call_stack = malloc((size_t)n * sizeof *call_stack), *next_edge = malloc((size_t)n * sizeof *next_edge);
    uint8_t *on_stack = calloc(n, 1), *comp_bad = calloc(n, 1);
    bool ok = index && low && comp && stack && call_stack && next_edge && on_stack && comp_bad;
    if (ok) memset(index, 0xff, (size_t)n * sizeof *index);
    uint32_t counter = 0, sp = 0, n_comp = 0;
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
            sp = first;
        }
    }
    for (uint32_t r = 0; ok && r < n; r++) lex[r] = !comp_bad[comp[r]];
    free(index), free(low), free(comp), free(stack), free(call_stack), free(next_edge), free(on_stack), free(comp_bad);
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

bool kt_grammar_analyze(kt_grammar *g) {
    byte_classes(g);
    call_graph cg = {0};
    uint8_t *lex = g->rule_lexical = malloc((size_t)g->n_rules + 1);
    g->rest_lexical = malloc((size_t)g->n_elems + 1);
    bool ok = lex && g->rest_lexical && call_graph_build(g, &cg) && lexical_rules(g, &cg, lex);
    for (uint32_t p = g->n_elems; ok && p-- > 0;) {
        const kt_gelem *e = &g->elems[p];
        if (e->type == KT_GE_END) g->rest_lexical[p] = 1;
        else if (e->type == KT_GE_RULE) g->rest_lexical[p] = lex[e->value] && g->rest_lexical[p + 1];
        else g->rest_lexical[p] = g->rest_lexical[p + 1];
    }
    call_graph_free(&cg);
    if (!ok) return false;
    /* the compiled form, not the text: grammars that differ only in rule
     * names, spacing or comments share their token classes */
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
