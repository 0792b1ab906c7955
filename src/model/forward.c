/*
 * forward.c - the llama transformer over a ragged batch, chunk by chunk.
 *
 * For each layer:   h = x + Wo * attn(rope(Wq * norm(x)), rope(Wk * ..), Wv * ..)
 *                   x = h + Wdown * (silu(Wgate * norm(h)) * (Wup * norm(h)))
 * then logits = Wout * norm(x). Activations are row-major [token][feature].
 * Matmuls and attention are split over the thread pool; the cheap
 * element-wise steps run on the calling thread. K and V rows go into each
 * token's sequence's KV blocks (F32 or F16, as the pool says) before
 * attention reads them, so a token sees its own row as every later token
 * does: results do not depend on how a sequence's tokens were chunked.
 */
#include "model/forward.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/fp16.h"
#include "ops/matmul.h"
#include "ops/ops.h"
#include "ops/quant.h"

struct llm_work {
    /* each [LLM_MAX_BATCH][width] */
    float *x, *xn, *q, *k, *v, *att, *gate, *up;
    /* per token of a chunk: its block table and attention length */
    const int32_t **blocks;
    int *n_pos;
};

llm_work *llm_work_new(const llm_model *m, kt_error *err) {
    const llm_config *c = &m->cfg;
    llm_work *w = calloc(1, sizeof *w);
    if (!w) goto nomem;
    size_t B = LLM_MAX_BATCH, q_dim = (size_t)c->n_head * c->head_dim;
    size_t kv_dim = (size_t)c->n_head_kv * c->head_dim;
    size_t wide = (size_t)c->n_embd > q_dim ? (size_t)c->n_embd : q_dim;
    w->x = malloc(B * c->n_embd * sizeof(float));
    w->xn = malloc(B * wide * sizeof(float));
    w->q = malloc(B * q_dim * sizeof(float));
    w->k = malloc(B * kv_dim * sizeof(float));
    w->v = malloc(B * kv_dim * sizeof(float));
    w->att = malloc(B * q_dim * sizeof(float));
    w->gate = malloc(B * c->n_ff * sizeof(float));
    w->up = malloc(B * c->n_ff * sizeof(float));
    w->blocks = malloc(B * sizeof *w->blocks);
    w->n_pos = malloc(B * sizeof *w->n_pos);
    if (!w->x || !w->xn || !w->q || !w->k || !w->v || !w->att || !w->gate || !w->up ||
        !w->blocks || !w->n_pos)
        goto nomem;
    return w;
nomem:
    llm_work_free(w);
    kt_error_set(err, KT_ERR_NOMEM, "out of memory allocating forward-pass scratch");
    return NULL;
}

void llm_work_free(llm_work *w) {
    if (!w) return;
    free(w->x);
    free(w->xn);
    free(w->q);
    free(w->k);
    free(w->v);
    free(w->att);
    free(w->gate);
    free(w->up);
    free(w->blocks);
    free(w->n_pos);
    free(w);
}

kv_pool_params llm_kv_params(const llm_model *m, int n_blocks, int block_tokens, kv_type type) {
    kv_pool_params p = {
        .n_blocks = n_blocks, .block_tokens = block_tokens, .n_layer = m->cfg.n_layer,
        .kv_dim = m->cfg.n_head_kv * m->cfg.head_dim, .type = type,
    };
    return p;
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

/* One row of K or V into the token's KV block row, in the pool's type. */
static void store_kv_row(void *dst, const float *src, int n, kv_type type) {
    if (type == KV_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
    } else if (type == KV_F16) {
        uint16_t *h = dst;
        for (int i = 0; i < n; i++) h[i] = kt_fp32_to_fp16(src[i]);
    } else {
        kt_quantize_row(KT_Q8_0, src, dst, n);
    }
}

static void store_kv(const llm_batch *b, int t0, int n, int il, const float *k, const float *v,
                     int kv_dim) {
    const kv_type type = kv_pool_get_params(b->seq[t0]->pool)->type;
    for (int t = 0; t < n; t++) {
        kv_seq *seq = b->seq[t0 + t];
        store_kv_row(kv_seq_row(seq, il, KV_K, b->pos[t0 + t]), k + (size_t)t * kv_dim, kv_dim, type);
        store_kv_row(kv_seq_row(seq, il, KV_V, b->pos[t0 + t]), v + (size_t)t * kv_dim, kv_dim, type);
    }
}

static void attention_block(const llm_model *m, llm_work *w, kt_pool *pool, const llm_batch *b,
                            int il, int t0, int n) {
    const llm_config *c = &m->cfg;
    const llm_layer *l = &m->layers[il];
    int q_dim = c->n_head * c->head_dim, kv_dim = c->n_head_kv * c->head_dim;
    rmsnorm_rows(w->xn, w->x, &l->attn_norm, n, c->n_embd, c->rms_eps);
    const kt_matmul_part qkv[] = {{w->q, l->wq.data, l->wq.type, l->wq.n_out},
                                  {w->k, l->wk.data, l->wk.type, l->wk.n_out},
                                  {w->v, l->wv.data, l->wv.type, l->wv.n_out}};
    kt_matmul_many(pool, qkv, 3, w->xn, l->wq.n_in, n);
    add_bias(w->q, &l->bq, n);
    add_bias(w->k, &l->bk, n);
    add_bias(w->v, &l->bv, n);
    for (int t = 0; t < n; t++) {
        const int pos = b->pos[t0 + t];
        kt_rope(w->q + (size_t)t * q_dim, c->n_head, c->head_dim, c->rope_dim, pos, c->rope_freq_base, c->rope_style);
        kt_rope(w->k + (size_t)t * kv_dim, c->n_head_kv, c->head_dim, c->rope_dim, pos, c->rope_freq_base, c->rope_style);
    }
    store_kv(b, t0, n, il, w->k, w->v, kv_dim);
    const kv_pool *kv = b->seq[t0]->pool;
    const kv_pool_params *kp = kv_pool_get_params(kv);
    kt_attn_args a = {
        .out = w->att, .q = w->q,
        .k = kv_pool_plane(kv, il, KV_K), .v = kv_pool_plane(kv, il, KV_V),
        .n_tokens = n, .n_head = c->n_head, .n_head_kv = c->n_head_kv, .head_dim = c->head_dim,
        .q_stride = q_dim, .out_stride = q_dim,
        .kv_type = kv_type_dtype(kp->type), .blocks = w->blocks, .block_tokens = kp->block_tokens,
        .row_bytes = kv_pool_row_bytes(kv), .block_bytes = kv_pool_block_bytes(kv), .n_pos = w->n_pos,
    };
    kt_attention(pool, &a);
    matmul(pool, w->xn, &l->wo, w->att, n);
    add_rows(w->x, w->xn, (size_t)n * c->n_embd);
}

static void ffn_block(const llm_model *m, llm_work *w, kt_pool *pool, int il, int n) {
    const llm_config *c = &m->cfg;
    const llm_layer *l = &m->layers[il];
    rmsnorm_rows(w->xn, w->x, &l->ffn_norm, n, c->n_embd, c->rms_eps);
    const kt_matmul_part gate_up[] = {{w->gate, l->w_gate.data, l->w_gate.type, l->w_gate.n_out},
                                      {w->up, l->w_up.data, l->w_up.type, l->w_up.n_out}};
    kt_matmul_many(pool, gate_up, 2, w->xn, l->w_gate.n_in, n);
    kt_swiglu(w->gate, w->gate, w->up, n * c->n_ff);
    matmul(pool, w->xn, &l->w_down, w->gate, n);
    add_rows(w->x, w->xn, (size_t)n * c->n_embd);
}

/* Logits of the chunk's tokens that want them, gathered into consecutive
 * rows of xn, into out (n_vocab each); returns how many. */
static int classify(const llm_model *m, llm_work *w, kt_pool *pool, const llm_batch *b, int t0,
                    int n, float *out) {
    const llm_config *c = &m->cfg;
    int n_out = 0;
    if (!out) return 0;
    for (int t = 0; t < n; t++) {
        if (!b->logits || !b->logits[t0 + t]) continue;
        kt_rmsnorm(w->xn + (size_t)n_out * c->n_embd, w->x + (size_t)t * c->n_embd,
                   m->output_norm.data, c->n_embd, c->rms_eps);
        n_out++;
    }
    if (n_out) matmul(pool, out, &m->output, w->xn, n_out);
    return n_out;
}

static int forward_chunk(const llm_model *m, llm_work *w, kt_pool *pool, const llm_batch *b,
                         int t0, int n, float *logits) {
    for (int t = 0; t < n; t++) {
        w->blocks[t] = b->seq[t0 + t]->blocks;
        w->n_pos[t] = b->pos[t0 + t] + 1;
    }
    embed(m, b->tokens + t0, n, w->x);
    for (int il = 0; il < m->cfg.n_layer; il++) {
        attention_block(m, w, pool, b, il, t0, n);
        ffn_block(m, w, pool, il, n);
    }
    return classify(m, w, pool, b, t0, n, logits);
}

void llm_forward(const llm_model *m, llm_work *w, kt_pool *pool, const llm_batch *b,
                 float *logits) {
    size_t n_vocab = (size_t)m->cfg.n_vocab;
    size_t n_out = 0;
    for (int t0 = 0; t0 < b->n_tokens; t0 += LLM_MAX_BATCH) {
        int n = b->n_tokens - t0 < LLM_MAX_BATCH ? b->n_tokens - t0 : LLM_MAX_BATCH;
        n_out += (size_t)forward_chunk(m, w, pool, b, t0, n, logits ? logits + n_out * n_vocab : NULL);
    }
}
