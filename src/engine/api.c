/*
 * api.c - the public API of kettle.h over the model, text and ops layers.
 *
 * A kt_model owns the mapped GGUF file, the bound weights and the
 * vocabulary. A kt_session owns one sequence: its KV cache, scratch and
 * thread pool. Sessions of one model are independent (each may be used
 * from its own thread); the model is read-only after load.
 */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "gguf/gguf.h"
#include "kettle.h"
#include "model/forward.h"
#include "model/model.h"
#include "ops/pool.h"
#include "text/detok.h"
#include "text/vocab.h"

struct kt_model {
    gguf_file *file;
    llm_model *llm;
    kt_vocab *vocab;
    kt_model_desc desc;
};

struct kt_session {
    kt_model *model;
    llm_state *state;
    kt_pool *pool;
    int n_past;
};

struct kt_detok {
    kt_text_detok *impl;
};

static void describe(kt_model *m) {
    const llm_config *c = &m->llm->cfg;
    m->desc = (kt_model_desc){
        .arch = c->arch, .n_vocab = c->n_vocab, .n_embd = c->n_embd, .n_layer = c->n_layer,
        .n_head = c->n_head, .n_head_kv = c->n_head_kv, .n_ff = c->n_ff,
        .n_ctx_train = c->n_ctx_train, .head_dim = c->head_dim,
        .rope_freq_base = c->rope_freq_base, .rms_eps = c->rms_eps,
        .weight_bytes = m->llm->weight_bytes, .n_params = m->llm->n_params,
        .bos_id = kt_vocab_bos(m->vocab), .eos_id = kt_vocab_eos(m->vocab),
    };
}

kt_model *kt_model_load(const char *path, kt_error *err) {
    kt_model *m = calloc(1, sizeof *m);
    if (!m) {
        kt_error_set(err, KT_ERR_NOMEM, "out of memory");
        return NULL;
    }
    if (!(m->file = gguf_open(path, err))) goto fail;
    if (!(m->llm = llm_model_load(m->file, err)) || !(m->vocab = kt_vocab_from_gguf(m->file, err))) {
        kt_error_wrap(err, "%s", path);
        goto fail;
    }
    if (kt_vocab_size(m->vocab) != m->llm->cfg.n_vocab) {
        kt_error_set(err, KT_ERR_FORMAT, "%s: the tokenizer has %d tokens but the weights have %d rows",
                     path, kt_vocab_size(m->vocab), m->llm->cfg.n_vocab);
        goto fail;
    }
    describe(m);
    return m;
fail:
    kt_model_free(m);
    return NULL;
}

void kt_model_free(kt_model *m) {
    if (!m) return;
    kt_vocab_free(m->vocab);
    llm_model_free(m->llm);
    gguf_close(m->file);
    free(m);
}

const kt_model_desc *kt_model_describe(const kt_model *m) {
    return &m->desc;
}

int kt_tokenize(const kt_model *m, const char *text, size_t len, int32_t *ids, int cap, int add_bos,
                kt_error *err) {
    bool bos = add_bos < 0 ? kt_vocab_add_bos(m->vocab) : add_bos != 0;
    return kt_vocab_encode(m->vocab, text, len, bos, ids, cap, err);
}

kt_detok *kt_detok_new(const kt_model *m) {
    kt_detok *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    /* Generated text continues the prompt, so its leading space is real. */
    if (!(d->impl = kt_text_detok_new(m->vocab, false))) {
        free(d);
        return NULL;
    }
    return d;
}

const char *kt_detok_push(kt_detok *d, int32_t id) {
    return kt_text_detok_push(d->impl, id);
}

const char *kt_detok_flush(kt_detok *d) {
    return kt_text_detok_flush(d->impl);
}

void kt_detok_free(kt_detok *d) {
    if (!d) return;
    kt_text_detok_free(d->impl);
    free(d);
}

kt_session *kt_session_new(kt_model *m, const kt_session_params *p, kt_error *err) {
    int n_ctx = p && p->n_ctx > 0 ? p->n_ctx : m->llm->cfg.n_ctx_train;
    if (!(p && p->n_ctx > 0) && n_ctx > 4096) n_ctx = 4096;
    if (n_ctx < 1 || n_ctx > (1 << 24)) {
        kt_error_set(err, KT_ERR_ARG, "context length %d is out of range", n_ctx);
        return NULL;
    }
    kt_session *s = calloc(1, sizeof *s);
    if (!s) {
        kt_error_set(err, KT_ERR_NOMEM, "out of memory");
        return NULL;
    }
    s->model = m;
    if (!(s->state = llm_state_new(m->llm, n_ctx, err)) ||
        !(s->pool = kt_pool_new(p ? p->n_threads : 0, err))) {
        kt_session_free(s);
        return NULL;
    }
    return s;
}

void kt_session_free(kt_session *s) {
    if (!s) return;
    llm_state_free(s->state);
    kt_pool_free(s->pool);
    free(s);
}

int kt_session_n_past(const kt_session *s) {
    return s->n_past;
}

void kt_session_truncate(kt_session *s, int n_keep) {
    if (n_keep >= 0 && n_keep < s->n_past) s->n_past = n_keep;
}

kt_status kt_session_eval(kt_session *s, const int32_t *tokens, int n, float *logits,
                          bool all_logits, kt_error *err) {
    int n_ctx = llm_state_n_ctx(s->state), n_vocab = s->model->llm->cfg.n_vocab;
    if (n < 0 || (n > 0 && !tokens)) return kt_error_set(err, KT_ERR_ARG, "invalid token array");
    if (n > n_ctx - s->n_past)
        return kt_error_set(err, KT_ERR_CONTEXT,
                            "%d tokens do not fit: %d of the %d-token context are used (%d free)", n,
                            s->n_past, n_ctx, n_ctx - s->n_past);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= n_vocab)
            return kt_error_set(err, KT_ERR_ARG, "token id %d at index %d is outside the vocabulary [0, %d)",
                                tokens[i], i, n_vocab);
    if (n == 0) return KT_OK;
    llm_forward(s->model->llm, s->state, s->pool, tokens, n, s->n_past, logits, all_logits);
    s->n_past += n;
    return KT_OK;
}
