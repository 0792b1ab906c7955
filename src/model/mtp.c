/*
 * mtp.c - Qwen 3.5's MTP block as llama.cpp's qwen35.cpp graph_mtp
 * computes it (see mtp.h for what and why):
 *   e = rmsnorm(embed(x_p)) * enorm,  g = rmsnorm(h_{p-1}) * hnorm,
 *   y = eh_proj [e | g]               (the embedding half first: ggml_concat(e_norm, h_norm)),
 *   y = the block (gated attention at p, its own KV layer; FFN),
 *   h' = rmsnorm(y) * head_norm,  logits = head h'.
 */
#include "model/mtp.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "ops/matmul.h"
#include "ops/ops.h"
#include "ops/repack.h"

void llm_mtp_kv_params(const llm_model *m, kv_pool_params *p) {
    p->n_layer = m->cfg.n_kv_layer + m->cfg.n_mtp; /* kv_windowed has room for it: 0, a full layer */
}

/* The block's input rows for tokens [t0, t0 + n) of b into y (n x
 * n_embd): eh_proj [rmsnorm(embed(x)) * enorm | rmsnorm(h) * hnorm]. */
static void mtp_input(const llm_model *m, kt_pool *pool, const llm_batch *b, const float *h_in, int t0, int n,
                      float *cat, float *row, float *y) {
    const llm_config *c = &m->cfg;
    const llm_mtp *t = &m->mtp;
    const size_t E = (size_t)c->n_embd;
    for (int i = 0; i < n; i++) {
        float *e = cat + (size_t)i * 2 * E, *g = e + E;
        kt_repack_row_f32(t->embed_tokens.data, t->embed_tokens.type, (int)E, b->tokens[t0 + i], row);
        kt_rmsnorm(e, row, t->enorm.data, (int)E, c->rms_eps);
        if (h_in) kt_rmsnorm(g, h_in + (size_t)(t0 + i) * E, t->hnorm.data, (int)E, c->rms_eps);
        else memset(g, 0, sizeof(float) * E); /* rmsnorm(0) = 0 */
    }
    kt_matmul(pool, y, t->eh_proj.data, t->eh_proj.type, cat, t->eh_proj.n_in, t->eh_proj.n_out, n);
}

/* Scratch for LLM_MAX_BATCH rows: cat (2 x n_embd a row), y, h (n_embd a row), row (one). */
typedef struct mtp_scratch {
    float *cat, *y, *h, *row;
} mtp_scratch;

static kt_status scratch_alloc(const llm_config *c, mtp_scratch *s, kt_error *err) {
    const size_t E = (size_t)c->n_embd, B = LLM_MAX_BATCH;
    s->cat = malloc(sizeof(float) * B * 2 * E), s->y = malloc(sizeof(float) * B * E);
    s->h = malloc(sizeof(float) * B * E), s->row = malloc(sizeof(float) * E);
    if (s->cat && s->y && s->h && s->row) return KT_OK;
    free(s->cat), free(s->y), free(s->h), free(s->row);
    return kt_error_set(err, KT_ERR_NOMEM, "out of memory for the MTP block's scratch");
}

static void scratch_free(mtp_scratch *s) {
    free(s->cat), free(s->y), free(s->h), free(s->row);
}

kt_status llm_mtp_forward(const llm_model *m, llm_work *w, kt_pool *pool, const llm_batch *b, const float *h_in,
                          float *logits, float *h_out, kt_error *err) {
    const llm_config *c = &m->cfg;
    const llm_mtp *t = &m->mtp;
    if (!c->n_mtp) return kt_error_set(err, KT_ERR_UNSUPPORTED, "the model has no MTP block");
    const size_t E = (size_t)c->n_embd, V = (size_t)c->n_vocab;
    mtp_scratch s;
    if (scratch_alloc(c, &s, err) != KT_OK) return err->status;
    size_t n_out = 0;
    for (int t0 = 0; t0 < b->n_tokens; t0 += LLM_MAX_BATCH) {
        const int n = b->n_tokens - t0 < LLM_MAX_BATCH ? b->n_tokens - t0 : LLM_MAX_BATCH;
        mtp_input(m, pool, b, h_in, t0, n, s.cat, s.row, s.y);
        llm_batch chunk = {.n_tokens = n, .tokens = b->tokens + t0, .pos = b->pos + t0, .seq = b->seq + t0};
        llm_forward_block(m, w, pool, &chunk, c->n_layer, s.y, &t->head_norm, s.h);
        if (h_out) memcpy(h_out + (size_t)t0 * E, s.h, sizeof(float) * (size_t)n * E);
        if (!logits) continue;
        int kept = 0; /* the rows that want logits, closed up at the front of h */
        for (int i = 0; i < n; i++) {
            if (b->logits && !b->logits[t0 + i]) continue;
            if (kept != i) memmove(s.h + (size_t)kept * E, s.h + (size_t)i * E, sizeof(float) * E);
            kept++;
        }
        if (kept) kt_matmul(pool, logits + n_out * V, t->head.data, t->head.type, s.h, t->head.n_in, t->head.n_out, kept);
        n_out += (size_t)kept;
    }
    scratch_free(&s);
    return KT_OK;
}

kt_status llm_mtp_kv(const llm_model *m, llm_work *w, kt_pool *pool, const llm_batch *b, const float *h_in,
                     kt_error *err) {
    const llm_config *c = &m->cfg;
    if (!c->n_mtp) return kt_error_set(err, KT_ERR_UNSUPPORTED, "the model has no MTP block");
    mtp_scratch s;
    if (scratch_alloc(c, &s, err) != KT_OK) return err->status;
    for (int t0 = 0; t0 < b->n_tokens; t0 += LLM_MAX_BATCH) {
        const int n = b->n_tokens - t0 < LLM_MAX_BATCH ? b->n_tokens - t0 : LLM_MAX_BATCH;
        mtp_input(m, pool, b, h_in, t0, n, s.cat, s.row, s.y);
        llm_batch chunk = {.n_tokens = n, .tokens = b->tokens + t0, .pos = b->pos + t0, .seq = b->seq + t0};
        llm_forward_block_kv(m, w, pool, &chunk, c->n_layer, s.y);
    }
    scratch_free(&s);
    return KT_OK;
}
