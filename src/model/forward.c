/*
 * forward.c - the llama transformer, one chunk of tokens at a time.
 *
 * For each layer:   h = x + Wo * attn(rope(Wq * norm(x)), rope(Wk * ..), Wv * ..)
 *                   x = h + Wdown * (silu(Wgate * norm(h)) * (Wup * norm(h)))
 * then logits = Wout * norm(x). Activations are row-major [token][feature].
 * Matmuls and attention are split over the thread pool; the cheap
 * element-wise steps run on the calling thread.
 */
#include "model/forward.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "ops/matmul.h"
#include "ops/ops.h"
#include "ops/quant.h"

struct llm_state {
    int n_ctx, kv_dim;
    float *k_cache, *v_cache; /* [n_layer][n_ctx][kv_dim] */
    /* scratch, each [LLM_MAX_BATCH][width] */
    float *x, *xn, *q, *k, *v, *att, *gate, *up;
};

static size_t kv_layer_floats(const llm_state *s) {
    return (size_t)s->n_ctx * (size_t)s->kv_dim;
}

llm_state *llm_state_new(const llm_model *m, int n_ctx, kt_error *err) {
    const llm_config *c = &m->cfg;
    llm_state *s = calloc(1, sizeof *s);
    if (!s) goto nomem;
    s->n_ctx = n_ctx;
    s->kv_dim = c->n_head_kv * c->head_dim;
    size_t kv = (size_t)c->n_layer * kv_layer_floats(s);
    size_t B = LLM_MAX_BATCH, q_dim = (size_t)c->n_head * c->head_dim;
    size_t wide = (size_t)c->n_embd > q_dim ? (size_t)c->n_embd : q_dim;
    s->k_cache = calloc(kv, sizeof(float));
    s->v_cache = calloc(kv, sizeof(float));
    s->x = malloc(B * c->n_embd * sizeof(float));
    s->xn = malloc(B * wide * sizeof(float));
    s->q = malloc(B * q_dim * sizeof(float));
    s->k = malloc(B * s->kv_dim * sizeof(float));
    s->v = malloc(B * s->kv_dim * sizeof(float));
    s->att = malloc(B * q_dim * sizeof(float));
    s->gate = malloc(B * c->n_ff * sizeof(float));
    s->up = malloc(B * c->n_ff * sizeof(float));
    if (!s->k_cache || !s->v_cache || !s->x || !s->xn || !s->q || !s->k || !s->v || !s->att ||
        !s->gate || !s->up)
        goto nomem;
    return s;
nomem:
    llm_state_free(s);
    kt_error_set(err, KT_ERR_NOMEM, "out of memory allocating a %d-token KV cache (%.1f MiB)", n_ctx,
                 2.0 * c->n_layer * n_ctx * c->n_head_kv * c->head_dim * 4 / 1048576.0);
    return NULL;
}

void llm_state_free(llm_state *s) {
    if (!s) return;
    free(s->k_cache);
    free(s->v_cache);
    free(s->x);
    free(s->xn);
    free(s->q);
    free(s->k);
    free(s->v);
    free(s->att);
    free(s->gate);
    free(s->up);
    free(s);
}

int llm_state_n_ctx(const llm_state *s) {
    return s->n_ctx;
}

static void matmul(kt_pool *pool, float *out, const llm_tensor *w, const float *x, int n) {
    kt_matmul(pool, out, w->data, w->type, x, w->n_in, w->n_out, n);
}

static void rmsnorm_rows(float *out, const float *x, const llm_tensor *w, int n, int dim, float eps) {
    for (int t = 0; t < n; t++)
        kt_rmsnorm(out + (size_t)t * dim, x + (size_t)t * dim, w->data, dim, eps);
}

static void add_bias(float *x, const llm_tensor *b, int n) {
    if (!b->data) return;
    const float *bias = b->data;
    for (int t = 0; t < n; t++)
        for (int i = 0; i < b->n_in; i++) x[(size_t)t * b->n_in + i] += bias[i];
}

static void add_rows(float *x, const float *y, size_t count) {
    for (size_t i = 0; i < count; i++) x[i] += y[i];
}

/* Embedding lookup: token_embd rows may be quantized, so dequantize. */
static void embed(const llm_model *m, const int32_t *tokens, int n, float *x) {
    const llm_tensor *e = &m->tok_embd;
    size_t row_bytes = kt_dtype_row_bytes(e->type, e->n_in);
    for (int t = 0; t < n; t++)
        kt_dequantize_row(e->type, (const char *)e->data + (size_t)tokens[t] * row_bytes,
                          x + (size_t)t * e->n_in, e->n_in);
}

static void attention_block(const llm_model *m, llm_state *s, kt_pool *pool, int il, int n, int pos0) {
    const llm_config *c = &m->cfg;
    const llm_layer *l = &m->layers[il];
    int q_dim = c->n_head * c->head_dim, kv_dim = s->kv_dim;
    rmsnorm_rows(s->xn, s->x, &l->attn_norm, n, c->n_embd, c->rms_eps);
    matmul(pool, s->q, &l->wq, s->xn, n);
    matmul(pool, s->k, &l->wk, s->xn, n);
    matmul(pool, s->v, &l->wv, s->xn, n);
    add_bias(s->q, &l->bq, n);
    add_bias(s->k, &l->bk, n);
    add_bias(s->v, &l->bv, n);
    float *kc = s->k_cache + il * kv_layer_floats(s), *vc = s->v_cache + il * kv_layer_floats(s);
    for (int t = 0; t < n; t++) {
        float *q = s->q + (size_t)t * q_dim, *k = s->k + (size_t)t * kv_dim;
        kt_rope(q, c->n_head, c->head_dim, c->rope_dim, pos0 + t, c->rope_freq_base, c->rope_style);
        kt_rope(k, c->n_head_kv, c->head_dim, c->rope_dim, pos0 + t, c->rope_freq_base, c->rope_style);
    }
    memcpy(kc + (size_t)pos0 * kv_dim, s->k, (size_t)n * kv_dim * sizeof(float));
    memcpy(vc + (size_t)pos0 * kv_dim, s->v, (size_t)n * kv_dim * sizeof(float));
    kt_attn_args a = {
        .out = s->att, .q = s->q, .k = kc, .v = vc,
        .n_tokens = n, .pos0 = pos0, .n_head = c->n_head, .n_head_kv = c->n_head_kv,
        .head_dim = c->head_dim, .q_stride = q_dim, .kv_stride = kv_dim, .out_stride = q_dim,
    };
    kt_attention(pool, &a);
    matmul(pool, s->xn, &l->wo, s->att, n);
    add_rows(s->x, s->xn, (size_t)n * c->n_embd);
}

static void ffn_block(const llm_model *m, llm_state *s, kt_pool *pool, int il, int n) {
    const llm_config *c = &m->cfg;
    const llm_layer *l = &m->layers[il];
    rmsnorm_rows(s->xn, s->x, &l->ffn_norm, n, c->n_embd, c->rms_eps);
    matmul(pool, s->gate, &l->w_gate, s->xn, n);
    matmul(pool, s->up, &l->w_up, s->xn, n);
    kt_swiglu(s->gate, s->gate, s->up, n * c->n_ff);
    matmul(pool, s->xn, &l->w_down, s->gate, n);
    add_rows(s->x, s->xn, (size_t)n * c->n_embd);
}

/* Logits of the chunk's tokens [first, n) into out (n_vocab each). */
static void classify(const llm_model *m, llm_state *s, kt_pool *pool, int first, int n, float *out) {
    const llm_config *c = &m->cfg;
    const float *x = s->x + (size_t)first * c->n_embd;
    rmsnorm_rows(s->xn, x, &m->output_norm, n - first, c->n_embd, c->rms_eps);
    matmul(pool, out, &m->output, s->xn, n - first);
}

static void forward_chunk(const llm_model *m, llm_state *s, kt_pool *pool, const int32_t *tokens,
                          int n, int pos0, float *logits, bool all_logits) {
    embed(m, tokens, n, s->x);
    for (int il = 0; il < m->cfg.n_layer; il++) {
        attention_block(m, s, pool, il, n, pos0);
        ffn_block(m, s, pool, il, n);
    }
    if (logits) classify(m, s, pool, all_logits ? 0 : n - 1, n, logits);
}

void llm_forward(const llm_model *m, llm_state *s, kt_pool *pool, const int32_t *tokens, int n,
                 int pos0, float *logits, bool all_logits) {
    size_t n_vocab = (size_t)m->cfg.n_vocab;
    for (int done = 0; done < n;) {
        int chunk = n - done < LLM_MAX_BATCH ? n - done : LLM_MAX_BATCH;
        bool last = done + chunk == n;
        float *out = NULL;
        if (logits && all_logits) out = logits + (size_t)done * n_vocab;
        else if (logits && last) out = logits;
        forward_chunk(m, s, pool, tokens + done, chunk, pos0 + done, out, all_logits);
        done += chunk;
    }
}
