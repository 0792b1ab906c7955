/*
 * grammar_sample.h - sampling under a grammar, for the engine.
 *
 * A request with a grammar (GBNF; response_format's JSON Schema arrives
 * here converted) gets one kt_constraint per choice. Each token is drawn
 * as usual; if the grammar refuses it, the full mask is computed, every
 * refused token's logit becomes -inf and the draw is repeated. With plain
 * temperature sampling (or greedy) this is exact: accepting an allowed
 * draw and redrawing from the masked distribution otherwise gives each
 * allowed token p(t) / p(allowed). With top-k, top-p or min-p, which
 * would cut the distribution before the mask, the mask is applied first.
 *
 * The vocabulary's token trie and the class cache are built on first use
 * (a model that never sees a grammar pays nothing) and kept for the
 * engine's life; they are the engine thread's alone.
 */
#ifndef KT_ENGINE_GRAMMAR_SAMPLE_H
#define KT_ENGINE_GRAMMAR_SAMPLE_H

#include "engine/engine.h"
#include "grammar/constraint.h"
#include "kettle.h"

typedef struct eng_grammar {
    kt_token_trie *trie;
    kt_gmask_cache *cache;
    int32_t *eog;     /* the model's end-of-generation ids */
    int n_eog;
    uint64_t *mask;   /* one mask of the vocabulary */
    float *row;       /* logits before the first draw */
} eng_grammar;

/* A constraint for g at its start (the trie and cache made if needed);
 * NULL with err. */
kt_constraint *eng_grammar_start(eng_grammar *eg, const kt_model *model, const kt_grammar *g, kt_error *err);
void eng_grammar_free(eng_grammar *eg);

/* A request's lazy grammars (engine.h's triggers), parsed at submit. */
typedef struct eng_triggers {
    char *text[KT_MAX_TRIGGERS];
    size_t len[KT_MAX_TRIGGERS];
    kt_grammar *grammar[KT_MAX_TRIGGERS];
    int n, max_segments;
    size_t max_len;
    char *think_open, *think_close; /* not watched between them; NULL: none */
    bool in_thinking;
} eng_triggers;

/* A choice's watch for them: grammars completed, recent text. */
typedef struct eng_watch {
    int segments;
    int thinking;   /* 0: not yet looked (the request's in_thinking then), 1 outside the block, 2 inside */
    char *tail;     /* the last bytes that may hold the start of a trigger, then the new text */
    size_t n, cap;
} eng_watch;

/* Copies and parses p's triggers into t; KT_ERR_ARG naming the trigger
 * whose grammar does not parse. */
kt_status eng_triggers_init(eng_triggers *t, const kt_gen_params *p, kt_error *err);
void eng_triggers_free(eng_triggers *t);
void eng_watch_free(eng_watch *w);

/* After a choice took a token whose text is piece[0..n): an active
 * grammar that is done ends its segment (*c freed), a watched trigger
 * starts one. Returns 1 when the choice must end (its last segment is
 * done), 0 to go on, -1 on allocation failure. */
int eng_grammar_follow(eng_grammar *eg, const kt_model *model, const kt_grammar *initial, const eng_triggers *t,
                       eng_watch *w, kt_constraint **c, const char *piece, size_t n);

/* Draws a token from x (n_vocab biased logits; edited) with s under c and
 * takes it into c; -1 when the grammar allows no token at all. */
int32_t eng_grammar_sample(eng_grammar *eg, kt_constraint *c, kt_sampler *s, const kt_sampler_params *sp, float *x,
                           int n_vocab);

#endif
