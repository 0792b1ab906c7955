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
    /* what an earlier call that failed made is kept (the next grammar tries again) */
    if (!eg->eog) eg->eog = malloc(sizeof *eg->eog * (size_t)n);
    if (!eg->mask) eg->mask = malloc(((size_t)n + 63) / 64 * sizeof *eg->mask);
    if (!eg->row) eg->row = malloc(sizeof *eg->row * (size_t)n);
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

/* ---- lazy grammars ---- */

kt_status eng_triggers_init(eng_triggers *t, const kt_gen_params *p, kt_error *err) {
    *t = (eng_triggers){.max_segments = p->max_segments, .in_thinking = p->in_thinking};
    if (p->n_triggers && p->think_open && p->think_close && p->think_open[0] && p->think_close[0] &&
        (!(t->think_open = strdup(p->think_open)) || !(t->think_close = strdup(p->think_close)))) {
        eng_triggers_free(t);
        return kt_error_set(err, KT_ERR_NOMEM, "out of memory");
    }
    if (p->n_triggers < 0 || p->n_triggers > KT_MAX_TRIGGERS)
        return kt_error_set(err, KT_ERR_ARG, "at most %d grammar triggers", KT_MAX_TRIGGERS);
    for (int i = 0; i < p->n_triggers; i++) {
        const char *s = p->triggers[i], *g = p->trigger_grammars[i];
        if (!s || !s[0] || !g) {
            eng_triggers_free(t);
            return kt_error_set(err, KT_ERR_ARG, "grammar trigger %d: empty text or no grammar", i);
        }
        t->len[i] = strlen(s);
        if (!(t->text[i] = strdup(s))) {
            eng_triggers_free(t);
            return kt_error_set(err, KT_ERR_NOMEM, "out of memory");
        }
        t->n = i + 1;
        if (!(t->grammar[i] = kt_grammar_parse(g, strlen(g), NULL, err))) {
            eng_triggers_free(t);
            return kt_error_wrap(err, "the grammar of trigger '%.40s'", s);
        }
        if (t->len[i] > t->max_len) t->max_len = t->len[i];
    }
    return KT_OK;
}

void eng_triggers_free(eng_triggers *t) {
    for (int i = 0; i < t->n; i++) free(t->text[i]), kt_grammar_free(t->grammar[i]);
    free(t->think_open), free(t->think_close);
    *t = (eng_triggers){0};
}

void eng_watch_free(eng_watch *w) {
    free(w->tail);
    *w = (eng_watch){0};
}

static bool watch_add(eng_watch *w, const char *s, size_t n) {
    if (w->n + n + 1 > w->cap) {
        size_t cap = w->cap ? w->cap : 64;
        while (cap < w->n + n + 1) cap *= 2;
        char *p = realloc(w->tail, cap);
        if (!p) return false;
        w->tail = p, w->cap = cap;
    }
    memcpy(w->tail + w->n, s, n);
    w->n += n;
    w->tail[w->n] = 0;
    return true;
}

/* The first trigger that occurs in the watched text (*at: where), or -1. */
static int find_trigger(const eng_triggers *t, const eng_watch *w, size_t *at) {
    int best = -1;
    for (int i = 0; i < t->n; i++) {
        if (w->n < t->len[i]) continue;
        for (size_t k = 0; k + t->len[i] <= w->n; k++) {
            if (best >= 0 && k >= *at) break;
            if (!memcmp(w->tail + k, t->text[i], t->len[i])) {
                best = i, *at = k;
                break;
            }
        }
    }
    return best;
}

/* Drops watched text inside the thinking block (a trigger there is the
 * model thinking about a call, not making one); false while inside. The
 * block is known to open where its marker comes before any trigger. */
static bool skip_thinking(const eng_triggers *t, eng_watch *w) {
    if (!t->think_open) return true;
    if (!w->thinking) w->thinking = t->in_thinking ? 2 : 1;
    for (;;) {
        const bool inside = w->thinking == 2;
        const char *m = inside ? t->think_close : t->think_open;
        char *hit = strstr(w->tail, m);
        if (inside && !hit) { /* keep what may begin the close */
            size_t keep = strlen(m) - 1;
            if (w->n > keep) memmove(w->tail, w->tail + w->n - keep, keep + 1), w->n = keep;
            return false;
        }
        if (!hit) return true;
        if (!inside) { /* an open after a trigger: the trigger comes first */
            size_t at = 0;
            if (find_trigger(t, w, &at) >= 0 && at < (size_t)(hit - w->tail)) return true;
        }
        size_t past = (size_t)(hit - w->tail) + strlen(m);
        memmove(w->tail, w->tail + past, w->n - past + 1);
        w->n -= past;
        w->thinking = inside ? 1 : 2;
    }
}

int eng_grammar_follow(eng_grammar *eg, const kt_model *model, const kt_grammar *initial, const eng_triggers *t,
                       eng_watch *w, kt_constraint **c, const char *piece, size_t n) {
    (void)initial;
    if (*c) {
        if (!kt_constraint_is_done(*c)) return 0;
        kt_constraint_free(*c);
        *c = NULL;
        w->segments++, w->n = 0;
        return !t->n || (t->max_segments && w->segments >= t->max_segments);
    }
    if (!t->n || (t->max_segments && w->segments >= t->max_segments)) return 0;
    if (!watch_add(w, piece, n)) return -1;
    if (!skip_thinking(t, w)) return 0;
    size_t at = 0;
    int k = find_trigger(t, w, &at);
    if (k < 0) { /* keep what may still begin a trigger */
        size_t keep = t->max_len - 1;
        if (w->n > keep) memmove(w->tail, w->tail + w->n - keep, keep), w->n = keep;
        return 0;
    }
    kt_error err = {0};
    kt_constraint *nc = eng_grammar_start(eg, model, t->grammar[k], &err);
    if (!nc) return -1;
    const size_t rest = at + t->len[k];
    if (!kt_constraint_accept_bytes(nc, (const uint8_t *)w->tail + rest, w->n - rest)) {
        /* the token ran past the trigger into text the call cannot have:
         * the model did not start a call after all; keep watching */
        kt_constraint_free(nc);
        w->n = 0;
        return 0;
    }
    w->n = 0;
    *c = nc;
    return kt_constraint_is_done(nc) ? eng_grammar_follow(eg, model, initial, t, w, c, "", 0) : 0;
}
