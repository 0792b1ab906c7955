/*
 * grammar_sample.c - sampling under a grammar (see grammar_sample.h).
 */
#include "engine/grammar_sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "engine/model_internal.h"

#define MASK_CACHE_BYTES ((size_t)256 << 20) /* classes of every grammar seen, shared */

static kt_status ensure(eng_grammar *eg, const kt_model *model, kt_error *err) {
    if (eg->trie) return KT_OK;
    const int n = kt_vocab_size(model->vocab);
    eg->eog = malloc(sizeof *eg->eog * (size_t)n);
    eg->mask = malloc(((size_t)n + 63) / 64 * sizeof *eg->mask);
    eg->row = malloc(sizeof *eg->row * (size_t)n);
    if (!eg->eog || !eg->mask || !eg->row) return kt_error_set(err, KT_ERR_NOMEM, "out of memory for grammar sampling");
    eg->n_eog = 0;
    for (int32_t i = 0; i < n; i++)
        if (kt_token_is_eog(model, i)) eg->eog[eg->n_eog++] = i;
    if (!(eg->trie = kt_token_trie_from_vocab(model->vocab, err))) return err ? err->status : KT_ERR_NOMEM;
    if (!(eg->cache = kt_gmask_cache_new(eg->trie, MASK_CACHE_BYTES, err))) {
        kt_token_trie_free(eg->trie);
        eg->trie = NULL;
        return err ? err->status : KT_ERR_NOMEM;
    }
    return KT_OK;
}

kt_constraint *eng_grammar_start(eng_grammar *eg, const kt_model *model, const kt_grammar *g, kt_error *err) {
    if (ensure(eg, model, err) != KT_OK) return NULL;
    return kt_constraint_new(g, eg->trie, eg->cache, eg->eog, eg->n_eog, err);
}

void eng_grammar_free(eng_grammar *eg) {
    kt_gmask_cache_free(eg->cache);
    kt_token_trie_free(eg->trie);
    free(eg->eog), free(eg->mask), free(eg->row);
    memset(eg, 0, sizeof *eg);
}

/* Refused tokens' logits become -inf; false when none is allowed. */
static bool apply_mask(eng_grammar *eg, kt_constraint *c, float *x, int n_vocab) {
    kt_constraint_mask(c, eg->mask);
    bool any = false;
    for (int t = 0; t < n_vocab; t++) {
        bool ok = (eg->mask[(uint32_t)t >> 6] >> ((uint32_t)t & 63)) & 1;
        if (!ok) x[t] = -INFINITY;
        any |= ok;
    }
    return any;
}

/* Top-k, top-p and min-p cut the distribution before it is drawn from:
 * the mask must come first for the result to be the masked distribution's. */
static bool truncates(const kt_sampler_params *sp) {
    return sp->temperature > 0.0f && (sp->top_k > 0 || sp->top_p < 1.0f || sp->min_p > 0.0f);
}

int32_t eng_grammar_sample(eng_grammar *eg, kt_constraint *c, kt_sampler *s, const kt_sampler_params *sp, float *x,
                           int n_vocab) {
    int32_t id = -1;
    if (!truncates(sp)) {
        memcpy(eg->row, x, sizeof *x * (size_t)n_vocab);
        id = kt_sampler_sample(s, x);
        if (id >= 0 && kt_constraint_allows(c, id)) return kt_constraint_accept(c, id), id;
        x = eg->row; /* the draw was refused: again, masked */
    }
    if (!apply_mask(eg, c, x, n_vocab)) return -1;
    id = kt_sampler_sample(s, x);
    if (id < 0 || !kt_constraint_accept(c, id)) return -1; /* cannot be: only allowed ids are finite */
    return id;
}
