/*
 * forward.c - the llama transformer over a ragged batch, chunk by chunk.
 *
 * For each layer:   h = x + Wo * attn(rope(Wq * norm(x)), rope(Wk * ..), Wv * ..)
 *                   x = h + Wdown * (silu(Wgate * norm(h)) * (Wup * norm(h)))
 * then logits = Wout * norm(x). Activations are row-major [token][feature].
 * Gemma scales the embedding, norms each block's output before its add,
 * gates with GELU, and may cap scores and logits and attend a window on
 * some layers (with their own rope angles); a mixture of experts replaces
 * the FFN by the routed experts' FFNs, weighted (gpt-oss's routing and
 * clamped, biased experts: model/moe_oai.c); gpt-oss adds biases to the
 * attention's output and a sink logit per head to its softmax; Qwen3-VL
 * adds an image token's DeepStack rows after its first layers
 * (model/deepstack.c).
 * Only the tokens that want logits go past the last layer's K and V: the
 * others' last outputs reach nothing (in a pp512 that is 511 tokens' Q,
 * attention, Wo and FFN of one layer, 1/n_layer of the work).
 * Matmuls and attention are split over the thread pool; so are the
 * element-wise steps of a chunk of many tokens (by tokens: each token's
 * steps are the same whichever thread runs them), while a few tokens'
 * run on the calling thread, where waking the pool would cost more.
 * K and V rows go into each token's sequence's KV blocks (F32 or F16, as
 * the pool says) before attention reads them, so a token sees its own row
 * as every later token does: results do not depend on how a sequence's
 * tokens were chunked.
 */
#include "model/forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "model/deepstack.h"
#include "model/deltanet.h"
#include "model/moe_oai.h"
#include "ops/matmul.h"
#include "ops/ops.h"
#include "ops/repack.h"
#include "ops/quant.h"

struct llm_work {
    /* each [LLM_MAX_BATCH][width] */
    float *x, *xn, *q, *k, *v, *att, *gate, *up;
    /* mixture of experts: router logits [B][n_expert]; per (token, slot)
     * the expert, its weight and its output [B * n_expert_used][n_embd];
     * an expert's gathered inputs and outputs [B][n_embd] */
    float *router, *moe_w, *moe_y, *moe_x, *moe_out;
    int *moe_e, *moe_rows;
    /* per token of a chunk: its block table and attention length, and
     * the cos / sin of its rope angles ([LLM_MAX_BATCH][rope pairs]) */
    const int32_t **blocks;
    const int32_t **slots; /* per token: its sequence's window slots (kv_seq.slots), for window layers */
    int *n_pos;
    float *rope_cs, *rope_sn;
    float *rope_cs_swa, *rope_sn_swa; /* the sliding-window layers' own angles (NULL: none) */
    kt_rope_scaling rope; /* the model's, with LongRoPE's factors for this context */
    /* hybrid models: a gated attention layer's Q | gate rows per head
     * [B][2 q_dim] and the gates [B][q_dim]; the DeltaNet layers' scratch;
     * the shared expert's output [B][n_embd] */
    float *qg, *qgate, *shexp;
    llm_dn_work dn;
};

llm_work *llm_work_new(const llm_model *m, int n_ctx, kt_error *err) {
    const llm_config *c = &m->cfg;
    llm_work *w = calloc(1, sizeof *w);
    if (!w) goto nomem;
    w->rope = c->rope_scaling;
    if (c->rope_factors_long) /* llama.cpp: long beyond the original context */
        w->rope.factors = n_ctx > c->n_ctx_orig ? c->rope_factors_long : c->rope_factors_short;
    size_t B = LLM_MAX_BATCH, q_dim = (size_t)c->n_head * c->head_dim;
    size_t kv_dim = (size_t)c->n_head_kv * c->head_dim;
    size_t wide = (size_t)c->n_embd > q_dim ? (size_t)c->n_embd : q_dim;
    w->x = malloc(B * c->n_embd * sizeof(float));
    w->xn = malloc(B * wide * sizeof(float));
    w->q = malloc(B * q_dim * sizeof(float));
    w->k = malloc(B * kv_dim * sizeof(float));
    w->v = malloc(B * kv_dim * sizeof(float));
    w->att = malloc(B * q_dim * sizeof(float));
    const size_t ff = (size_t)(c->n_ff > c->n_ff_exp ? c->n_ff : c->n_ff_exp);
    w->gate = malloc(B * ff * sizeof(float));
    w->up = malloc(B * ff * sizeof(float));
    if (c->n_expert) {
        const size_t slots = B * (size_t)c->n_expert_used;
        w->router = malloc(B * c->n_expert * sizeof(float));
        w->moe_w = malloc(slots * sizeof(float));
        w->moe_y = malloc(slots * c->n_embd * sizeof(float));
        w->moe_x = malloc(B * c->n_embd * sizeof(float));
        w->moe_out = malloc(B * c->n_embd * sizeof(float));
        w->moe_e = malloc(slots * sizeof(int));
        w->moe_rows = malloc(slots * sizeof(int));
        if (!w->router || !w->moe_w || !w->moe_y || !w->moe_x || !w->moe_out || !w->moe_e || !w->moe_rows)
            goto nomem;
    }
    w->blocks = malloc(B * sizeof *w->blocks);
    w->slots = malloc(B * sizeof *w->slots);
    w->n_pos = malloc(B * sizeof *w->n_pos);
    const size_t pairs = (size_t)kt_rope_pairs(c->head_dim, c->rope_dim) + 1; /* + 1: never 0 bytes */
    w->rope_cs = malloc(B * pairs * sizeof(float));
    w->rope_sn = malloc(B * pairs * sizeof(float));
    /* local layers' own angles only where they differ (gemma2's are the
     * global ones) */
    if (c->n_swa > 0 && (c->rope_freq_base_swa != c->rope_freq_base || (c->swa_rope_plain && c->rope_scaled))) {
        w->rope_cs_swa = malloc(B * pairs * sizeof(float));
        w->rope_sn_swa = malloc(B * pairs * sizeof(float));
        if (!w->rope_cs_swa || !w->rope_sn_swa) goto nomem;
    }
    if (c->hybrid) {
        w->qg = malloc(B * 2 * q_dim * sizeof(float));
        w->qgate = malloc(B * q_dim * sizeof(float));
        if (!w->qg || !w->qgate || llm_dn_work_init(&w->dn, c, (int)B, err) != KT_OK) goto nomem;
        if (c->n_ff_shexp) {
            const size_t fs = (size_t)c->n_ff_shexp;
            if (fs > ff) { /* the shared expert's gate and up go in gate / up */
                free(w->gate), free(w->up);
                w->gate = malloc(B * fs * sizeof(float));
                w->up = malloc(B * fs * sizeof(float));
            }
            if (!(w->shexp = malloc(B * c->n_embd * sizeof(float)))) goto nomem;
        }
    }
    if (!w->x || !w->xn || !w->q || !w->k || !w->v || !w->att || !w->gate || !w->up ||
        !w->blocks || !w->slots || !w->n_pos || !w->rope_cs || !w->rope_sn)
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
    free(w->slots);
    free(w->n_pos);
    free(w->rope_cs);
    free(w->rope_sn);
    free(w->rope_cs_swa), free(w->rope_sn_swa);
    free(w->router), free(w->moe_w), free(w->moe_y), free(w->moe_x), free(w->moe_out);
    free(w->moe_e), free(w->moe_rows);
    free(w->qg), free(w->qgate), free(w->shexp);
    llm_dn_work_free(&w->dn);
    free(w);
}

kv_pool_params llm_kv_params(const llm_model *m, int n_blocks, int block_tokens, kv_type type) {
    kv_pool_params p = {
        .n_blocks = n_blocks, .block_tokens = block_tokens, .n_layer = m->cfg.n_kv_layer,
        .kv_dim = m->cfg.n_head_kv * m->cfg.head_dim, .type = type,
        .window = m->cfg.n_swa > 0 ? m->cfg.n_swa : 0, .windowed = m->kv_windowed, .n_window_blocks = n_blocks,
        .state_bytes = llm_state_bytes(m), .n_state_slots = 1,
    };
    return p;
}

kt_status llm_kv_type(const llm_model *m, kt_kv_type asked, kv_type dflt, kv_type *out, kt_error *err) {
    *out = asked == KT_KV_F16 ? KV_F16 : asked == KT_KV_F32 ? KV_F32 : asked == KT_KV_Q8_0 ? KV_Q8_0 : dflt;
    if (*out == KV_Q8_0 && m->cfg.head_dim % 32 != 0)
        return kt_error_set(err, KT_ERR_ARG,
                            "a Q8_0 KV cache needs a head size that is a multiple of 32; this model's is %d (use f16)",
                            m->cfg.head_dim);
    return KT_OK;
}

/* ---- element-wise steps, by tokens ----------------------------------- */

#define PAR_MIN_TOKENS 16 /* fewer: the calling thread does it alone */

typedef void (*tokens_fn)(void *ctx, int t0, int t1);

typedef struct tokens_job {
    tokens_fn fn;
    void *ctx;
    int n;
} tokens_job;

static void tokens_task(void *p, int ith, int nth) {
    const tokens_job *j = p;
    long lo, hi;
    kt_split_range(j->n, ith, nth, &lo, &hi);
    if (lo < hi) j->fn(j->ctx, (int)lo, (int)hi);
}

/* fn over tokens [0, n), split between the pool's threads when n is large. */
static void over_tokens(kt_pool *pool, int n, tokens_fn fn, void *ctx) {
    if (n < PAR_MIN_TOKENS || kt_pool_size(pool) == 1) {
        fn(ctx, 0, n);
        return;
    }
    tokens_job j = {fn, ctx, n};
    kt_pool_run(pool, tokens_task, &j);
}

static void matmul(kt_pool *pool, float *out, const llm_tensor *w, const float *x, int n) {
    kt_matmul(pool, out, w->data, w->type, x, w->n_in, w->n_out, n);
}

typedef struct rows_ctx {
    float *out;
    const float *x;
    const float *w;
    int dim;
    float eps;
} rows_ctx;

static void rmsnorm_some(void *p, int t0, int t1) {
    const rows_ctx *c = p;
    for (int t = t0; t < t1; t++)
        kt_rmsnorm(c->out + (size_t)t * c->dim, c->x + (size_t)t * c->dim, c->w, c->dim, c->eps);
}

static void rmsnorm_rows(kt_pool *pool, float *out, const float *x, const llm_tensor *w, int n, int dim,
                         float eps) {
    rows_ctx c = {out, x, w->data, dim, eps};
    over_tokens(pool, n, rmsnorm_some, &c);
}

/* The residual step between blocks, fused with the next block's norm:
 * per token, x += y, then y = rmsnorm(x) * w (w NULL: after the last
 * layer, the add alone). One pass over the rows instead of two, and the
 * same operations as an add followed by a norm. */
typedef struct add_norm_ctx {
    float *x, *y;
    const float *w;
    int dim;
    float eps;
} add_norm_ctx;

static void add_norm_some(void *p, int t0, int t1) {
    const add_norm_ctx *c = p;
    for (int t = t0; t < t1; t++) {
        float *x = c->x + (size_t)t * c->dim, *y = c->y + (size_t)t * c->dim;
        for (int i = 0; i < c->dim; i++) x[i] += y[i];
        if (c->w) kt_rmsnorm(y, x, c->w, c->dim, c->eps);
    }
}

static void add_norm_rows(kt_pool *pool, float *x, float *y, const llm_tensor *w, int n, int dim, float eps) {
    add_norm_ctx c = {x, y, w ? w->data : NULL, dim, eps};
    over_tokens(pool, n, add_norm_some, &c);
}

/* out = silu(out) * x (the gate, in place), row by row: a row's values
 * take the same SIMD and tail steps however the rows are split */
static void swiglu_some(void *p, int t0, int t1) {
    const rows_ctx *c = p;
    for (int t = t0; t < t1; t++) {
        float *g = c->out + (size_t)t * c->dim;
        kt_swiglu(g, g, c->x + (size_t)t * c->dim, c->dim);
    }
}

/* out = gelu(out) * x, Gemma's GeGLU, the same way */
static void geglu_some(void *p, int t0, int t1) {
    const rows_ctx *c = p;
    for (int t = t0; t < t1; t++) {
        float *g = c->out + (size_t)t * c->dim;
        kt_geglu(g, g, c->x + (size_t)t * c->dim, c->dim);
    }
}

static void gated_rows(kt_pool *pool, bool geglu, float *gate, const float *up, int n, int dim) {
    rows_ctx c = {gate, up, NULL, dim, 0};
    over_tokens(pool, n, geglu ? geglu_some : swiglu_some, &c);
}

/* x *= s, row by row (Gemma's embedding scale) */
static void scale_rows(float *x, float s, int n, int dim) {
    for (size_t i = 0; i < (size_t)n * dim; i++) x[i] *= s;
}

/* Gemma 2's final soft-cap of the logits, as llama.cpp computes it:
 * scaled by 1 / cap, tanh, scaled by cap. */
static void softcap_rows(float *x, float cap, int n, int dim) {
    const float inv = 1.0f / cap;
    for (size_t i = 0; i < (size_t)n * dim; i++) x[i] = cap * tanhf(x[i] * inv);
}

static void add_bias(float *x, const llm_tensor *b, int n) {
    if (!b->data) return;
    const float *bias = b->data;
    for (int t = 0; t < n; t++)
        for (int i = 0; i < b->n_in; i++) x[(size_t)t * b->n_in + i] += bias[i];
}

/* Embedding lookup: token_embd rows may be quantized, and repacked when
 * the table is also the output matrix, so read them back as floats. A
 * token given its embedding (embd[t], an image's) takes that instead. */
static void embed(const llm_model *m, const int32_t *tokens, const float *const *embd, int n, float *x) {
    const llm_tensor *e = &m->tok_embd;
    for (int t = 0; t < n; t++) {
        if (embd && embd[t])
            memcpy(x + (size_t)t * e->n_in, embd[t], sizeof(float) * (size_t)e->n_in);
        else
            kt_repack_row_f32(e->data, e->type, e->n_in, tokens[t], x + (size_t)t * e->n_in);
    }
}

/* One row of K or V into the token's KV block row, in the pool's type. */
static void store_kv_row(void *dst, const float *src, int n, kv_type type) {
    kt_quantize_row(kv_type_dtype(type), src, dst, n);
}

/* Per token: the cos / sin of its rope angles, once per chunk for every
 * layer. */
typedef struct angles_ctx {
    const llm_config *c;
    const llm_batch *b;
    int t0;
    llm_work *w;
} angles_ctx;

/* Which position component (0 t, 1 h, 2 w, 3 e) rotates the pair in
 * sector s (the pair's index mod the sections' sum). Interleaved M-RoPE
 * (ggml's IMROPE, Qwen 3.5): t, h, w in turn while each section lasts,
 * else e; plain M-RoPE (MROPE, Qwen2-VL's text model): the sections one
 * after another. */
static int mrope_component(const int *sec, bool interleaved, int s) {
    if (interleaved)
        return s % 3 == 1 && s < 3 * sec[1]   ? 1
               : s % 3 == 2 && s < 3 * sec[2] ? 2
               : s % 3 == 0 && s < 3 * sec[0] ? 0
                                              : 3;
    return s < sec[0] ? 0 : s < sec[0] + sec[1] ? 1 : s < sec[0] + sec[1] + sec[2] ? 2 : 3;
}

/* A token's angles under M-RoPE: pair i takes the angles of its sector's
 * position component, each component's the plain ones at its position. */
static void mrope_angles(const llm_config *c, const kt_rope_scaling *scaling, const int *p4, float *cs, float *sn) {
    enum { MAX_PAIRS = 512 };
    const int pairs = kt_rope_pairs(c->head_dim, c->rope_dim);
    const int *sec = c->rope_sections, sect = sec[0] + sec[1] + sec[2] + sec[3];
    float tc[4][MAX_PAIRS], ts[4][MAX_PAIRS];
    for (int k = 0; k < 4; k++)
        kt_rope_angles_scaled(tc[k], ts[k], c->head_dim, c->rope_dim, p4[k], c->rope_freq_base, scaling);
    for (int i = 0; i < pairs && i < MAX_PAIRS; i++) {
        const int k = mrope_component(sec, c->rope_sections_interleaved, i % sect);
        cs[i] = tc[k][i], sn[i] = ts[k][i];
    }
}

static void rope_angles_some(void *p, int s0, int s1) {
    const angles_ctx *a = p;
    const llm_config *c = a->c;
    const size_t pairs = (size_t)kt_rope_pairs(c->head_dim, c->rope_dim);
    const kt_rope_scaling *scaling = c->rope_scaled ? &a->w->rope : NULL;
    const bool mrope = a->b->pos_mrope && c->rope_sections[0] + c->rope_sections[1] + c->rope_sections[2] +
                                                 c->rope_sections[3] > 0;
    for (int t = s0; t < s1; t++) {
        if (mrope) {
            mrope_angles(c, scaling, a->b->pos_mrope + 4 * (size_t)(a->t0 + t), a->w->rope_cs + t * pairs,
                         a->w->rope_sn + t * pairs);
            continue;
        }
        const int pos = a->b->pos[a->t0 + t];
        kt_rope_angles_scaled(a->w->rope_cs + t * pairs, a->w->rope_sn + t * pairs, c->head_dim, c->rope_dim, pos,
                              c->rope_freq_base, scaling);
        if (a->w->rope_cs_swa)
            kt_rope_angles_scaled(a->w->rope_cs_swa + t * pairs, a->w->rope_sn_swa + t * pairs, c->head_dim,
                                  c->rope_dim, pos, c->rope_freq_base_swa, c->swa_rope_plain ? NULL : scaling);
    }
}

/* Per token: RoPE on its Q and K rows, then its K and V rows into its
 * sequence's KV blocks (each token writes its own position's rows).
 * q NULL: K and V only; k NULL: Q only (rows already in the cache). */
typedef struct rope_store_ctx {
    const llm_config *c;
    const llm_layer *l;
    const llm_batch *b;
    int t0, il;
    float *q, *k;
    const float *v;
    const float *cs, *sn; /* the chunk's angles */
    kv_type type;
} rope_store_ctx;

/* Qwen 3's RMSNorm of each head (one weight vector for all heads), in
 * place; nothing where the layer has none. */
static void head_norm(float *x, int n_heads, int head_dim, const llm_tensor *w, float eps) {
    if (!w->data) return;
    for (int h = 0; h < n_heads; h++) kt_rmsnorm(x + (size_t)h * head_dim, x + (size_t)h * head_dim, w->data, head_dim, eps);
}

/* The chunk's rope angles for layer l: a sliding-window layer's own
 * where the model gives those layers another base or scaling. */
static const float *layer_cs(const llm_work *w, const llm_layer *l) {
    return l->swa && w->rope_cs_swa ? w->rope_cs_swa : w->rope_cs;
}

static const float *layer_sn(const llm_work *w, const llm_layer *l) {
    return l->swa && w->rope_sn_swa ? w->rope_sn_swa : w->rope_sn;
}

static void rope_store_some(void *p, int s0, int s1) {
    const rope_store_ctx *r = p;
    const llm_config *c = r->c;
    const int q_dim = c->n_head * c->head_dim, kv_dim = c->n_head_kv * c->head_dim;
    const size_t pairs = (size_t)kt_rope_pairs(c->head_dim, c->rope_dim);
    for (int t = s0; t < s1; t++) {
        const float *cs = r->cs + t * pairs, *sn = r->sn + t * pairs;
        if (r->q) {
            float *q = r->q + (size_t)t * q_dim;
            head_norm(q, c->n_head, c->head_dim, &r->l->q_norm, c->rms_eps);
            kt_rope_apply(q, c->n_head, c->head_dim, c->rope_dim, cs, sn, c->rope_style);
            if (c->q_scale != 1)
                for (int i = 0; i < q_dim; i++) q[i] *= c->q_scale;
        }
        if (!r->k) continue;
        float *k = r->k + (size_t)t * kv_dim;
        head_norm(k, c->n_head_kv, c->head_dim, &r->l->k_norm, c->rms_eps);
        kt_rope_apply(k, c->n_head_kv, c->head_dim, c->rope_dim, cs, sn, c->rope_style);
        const int pos = r->b->pos[r->t0 + t];
        kv_seq *seq = r->b->seq[r->t0 + t];
        store_kv_row(kv_seq_row(seq, r->l->kv_layer, KV_K, pos), k, kv_dim, r->type);
        store_kv_row(kv_seq_row(seq, r->l->kv_layer, KV_V, pos), r->v + (size_t)t * kv_dim, kv_dim, r->type);
    }
}

/* The chunk's first n tokens attend (Q in w->q, roped; their K and V rows
 * already stored), then out = Wo * attention, into xn. */
static void attend(const llm_model *m, llm_work *w, kt_pool *pool, const kv_pool *kv, int il, int n) {
    const llm_config *c = &m->cfg;
    const int q_dim = c->n_head * c->head_dim;
    const kv_pool_params *kp = kv_pool_get_params(kv);
    /* a window layer's rows live in its own planes, addressed by slot */
    const int kl = m->layers[il].kv_layer; /* its layer in the pool */
    const bool by_slot = kv_pool_layer_windowed(kv, kl);
    kt_attn_args a = {
        .out = w->att, .q = w->q,
        .k = kv_pool_plane(kv, kl, KV_K), .v = kv_pool_plane(kv, kl, KV_V),
        .n_tokens = n, .n_head = c->n_head, .n_head_kv = c->n_head_kv, .head_dim = c->head_dim,
        .q_stride = q_dim, .out_stride = q_dim,
        .kv_type = kv_type_dtype(kp->type), .blocks = by_slot ? w->slots : w->blocks, .block_tokens = kp->block_tokens,
        .row_bytes = kv_pool_row_bytes(kv), .block_bytes = kv_pool_block_bytes(kv), .n_pos = w->n_pos,
        .softcap = c->attn_softcap, .window = m->layers[il].swa ? c->n_swa : 0, .sinks = m->layers[il].sinks.data,
    };
    kt_attention(pool, &a);
    if (m->layers[il].attn_gated) /* Qwen 3.5: attention * sigmoid(gate) */
        for (size_t i = 0; i < (size_t)n * q_dim; i++) w->att[i] *= 1.0f / (1.0f + expf(-w->qgate[i]));
    matmul(pool, w->xn, &m->layers[il].wo, w->att, n);
    add_bias(w->xn, &m->layers[il].bo, n); /* gpt-oss */
}

/* Q (with_q), K and V of the chunk's n tokens from norm(x) in xn, with
 * their biases; RoPE, and K and V into the cache. Returns the cache's
 * pool (every sequence of a batch uses one). */
/* A gated layer's Q rows (per head: Q, then its gate; in qg) apart:
 * Q into q, the gates into qgate. */
static void split_q_gate(const llm_config *c, llm_work *w, int n) {
    const size_t hd = (size_t)c->head_dim, q_dim = (size_t)c->n_head * hd;
    for (size_t t = 0; t < (size_t)n; t++)
        for (size_t h = 0; h < (size_t)c->n_head; h++) {
            const float *src = w->qg + t * 2 * q_dim + h * 2 * hd;
            memcpy(w->q + t * q_dim + h * hd, src, hd * sizeof(float));
            memcpy(w->qgate + t * q_dim + h * hd, src + hd, hd * sizeof(float));
        }
}

static const kv_pool *project_and_store(const llm_model *m, llm_work *w, kt_pool *pool, const llm_batch *b,
                                        int il, int t0, int n, bool with_q) {
    const llm_layer *l = &m->layers[il];
    const kt_matmul_part qkv[] = {{l->attn_gated ? w->qg : w->q, l->wq.data, l->wq.type, l->wq.n_out},
                                  {w->k, l->wk.data, l->wk.type, l->wk.n_out},
                                  {w->v, l->wv.data, l->wv.type, l->wv.n_out}};
    kt_matmul_many(pool, qkv + !with_q, 3 - !with_q, w->xn, l->wk.n_in, n);
    if (with_q && l->attn_gated) split_q_gate(&m->cfg, w, n);
    if (with_q) add_bias(w->q, &l->bq, n);
    add_bias(w->k, &l->bk, n);
    add_bias(w->v, &l->bv, n);
    const kv_pool *kv = b->seq[t0]->pool;
    rope_store_ctx rs = {&m->cfg, l, b, t0, il, with_q ? w->q : NULL, w->k, w->v, layer_cs(w, l), layer_sn(w, l),
                         kv_pool_get_params(kv)->type};
    over_tokens(pool, n, rope_store_some, &rs);
    return kv;
}

static void attention_block(const llm_model *m, llm_work *w, kt_pool *pool, const llm_batch *b,
                            int il, int t0, int n) {
    attend(m, w, pool, project_and_store(m, w, pool, b, il, t0, n, true), il, n);
}

/* Whether token t of the batch goes through the last layer: it wants
 * logits (and there is somewhere to put them) or its hidden state. */
static bool wants_output(const llm_batch *b, int t, const float *out) {
    return (out && b->logits && b->logits[t]) || (b->hidden && b->hidden[t]);
}

/* Moves the rows of the chunk's tokens that want an output
 * (wants_output) to the front: their x and xn rows, block tables,
 * attention lengths and rope angles. Returns how many. Kept rows only move
 * down (row t to row j <= t), so the copy is safe in place. */
static int keep_output_rows(const llm_config *c, llm_work *w, const llm_batch *b, int t0, int n,
                            const float *out) {
    const size_t pairs = (size_t)kt_rope_pairs(c->head_dim, c->rope_dim);
    const size_t embd_bytes = (size_t)c->n_embd * sizeof(float), pair_bytes = pairs * sizeof(float);
    int j = 0;
    for (int t = 0; t < n; t++) {
        if (!wants_output(b, t0 + t, out)) continue;
        if (j != t) {
            memcpy(w->x + (size_t)j * c->n_embd, w->x + (size_t)t * c->n_embd, embd_bytes);
            memcpy(w->xn + (size_t)j * c->n_embd, w->xn + (size_t)t * c->n_embd, embd_bytes);
            memcpy(w->rope_cs + j * pairs, w->rope_cs + t * pairs, pair_bytes);
            memcpy(w->rope_sn + j * pairs, w->rope_sn + t * pairs, pair_bytes);
            if (w->rope_cs_swa) {
                memcpy(w->rope_cs_swa + j * pairs, w->rope_cs_swa + t * pairs, pair_bytes);
                memcpy(w->rope_sn_swa + j * pairs, w->rope_sn_swa + t * pairs, pair_bytes);
            }
            w->blocks[j] = w->blocks[t];
            w->slots[j] = w->slots[t];
            w->n_pos[j] = w->n_pos[t];
        }
        j++;
    }
    return j;
}

/* The last layer's attention: every token's K and V rows go to the cache
 * (later tokens read them), but only the tokens that want logits go on:
 * the others' outputs of this layer reach nothing. Their Q, attention, Wo
 * and FFN are skipped. Returns how many go on, in rows 0 .. n_keep - 1
 * (keep_output_rows). Each kept row gets the bits it would get in a full
 * pass: every kernel's result for a token depends on that token alone. */
static int last_attention_block(const llm_model *m, llm_work *w, kt_pool *pool, const llm_batch *b,
                                int il, int t0, int n, const float *out) {
    const llm_layer *l = &m->layers[il];
    const kv_pool *kv = project_and_store(m, w, pool, b, il, t0, n, false);
    const int n_keep = keep_output_rows(&m->cfg, w, b, t0, n, out);
    if (!n_keep) return 0;
    if (l->attn_gated) {
        matmul(pool, w->qg, &l->wq, w->xn, n_keep);
        split_q_gate(&m->cfg, w, n_keep);
    } else {
        matmul(pool, w->q, &l->wq, w->xn, n_keep);
    }
    add_bias(w->q, &l->bq, n_keep);
    rope_store_ctx rq = {&m->cfg, l, b, t0, il, w->q, NULL, NULL, layer_cs(w, l), layer_sn(w, l), KV_F32}; /* Q only */
    over_tokens(pool, n_keep, rope_store_some, &rq);
    attend(m, w, pool, kv, il, n_keep);
    return n_keep;
}

/* A token's experts as llama.cpp picks them: softmax over all router
 * logits, the k most probable (in descending order, the lower index
 * first on a tie), their probabilities divided by their sum. */
static void route(const float *logits, int n_expert, int k, int *expert, float *weight) {
    float p[4096];
    memcpy(p, logits, sizeof(float) * (size_t)n_expert);
    kt_softmax_ref(p, n_expert);
    float sum = 0;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n_expert; e++) {
            bool taken = false;
            for (int i = 0; i < j; i++) taken |= expert[i] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        expert[j] = best, weight[j] = p[best];
        sum += p[best];
    }
    if (sum < 6.103515625e-5f) sum = 6.103515625e-5f; /* llama.cpp's clamp */
    for (int j = 0; j < k; j++) weight[j] /= sum;
}

/* Each token's output in xn: its K slots' outputs (moe_y) weighted,
 * summed in slot order. */
static void moe_sum(llm_work *w, int n, int K, int D) {
    for (int t = 0; t < n; t++) {
        float *out = w->xn + (size_t)t * D;
        for (int i = 0; i < D; i++) out[i] = 0;
        for (int j = 0; j < K; j++) {
            const float wt = w->moe_w[t * K + j], *y = w->moe_y + (size_t)(t * K + j) * D;
            for (int i = 0; i < D; i++) out[i] += wt * y[i];
        }
    }
}

/* One token's experts: they all read the same input, so the K experts'
 * gate and up matrices go in one kt_matmul_many (the activations quantized
 * once, the threads met once instead of 2 K times); each output row is
 * the one a matmul of that expert alone gives (kernels are per row).
 * Slot j's output lands in moe_y row j, as the batched path puts it. */
static void moe_decode(const llm_model *m, llm_work *w, kt_pool *pool, int il) {
    const llm_config *c = &m->cfg;
    const llm_layer *l = &m->layers[il];
    const int K = c->n_expert_used, D = c->n_embd, F = c->n_ff_exp;
    kt_matmul_part parts[2 * 64] = {{0}};
    int n_parts = 0;
    for (int j = 0; j < K && j < 64; j++) {
        const llm_tensor *g = &l->experts[3 * w->moe_e[j]], *u = g + 1;
        parts[n_parts++] = (kt_matmul_part){w->gate + (size_t)j * F, g->data, g->type, F};
        parts[n_parts++] = (kt_matmul_part){w->up + (size_t)j * F, u->data, u->type, F};
    }
    kt_matmul_many(pool, parts, n_parts, w->xn, D, 1);
    for (int j = 64; j < K; j++) { /* more than 64 experts a token: one at a time */
        const llm_tensor *g = &l->experts[3 * w->moe_e[j]], *u = g + 1;
        const kt_matmul_part gu[] = {{w->gate + (size_t)j * F, g->data, g->type, F},
                                     {w->up + (size_t)j * F, u->data, u->type, F}};
        kt_matmul_many(pool, gu, 2, w->xn, D, 1);
    }
    for (int j = 0; j < K; j++) {
        const int e = w->moe_e[j];
        if (c->moe_oai) llm_oai_glu(l, e, w->gate + (size_t)j * F, w->up + (size_t)j * F, 1, F);
        else kt_swiglu(w->gate + (size_t)j * F, w->gate + (size_t)j * F, w->up + (size_t)j * F, F);
        matmul(pool, w->moe_y + (size_t)j * D, &l->experts[3 * e + 2], w->gate + (size_t)j * F, 1);
        if (c->moe_oai) llm_oai_down_bias(l, e, w->moe_y + (size_t)j * D, 1, D);
    }
    moe_sum(w, 1, K, D);
}

/* gpt-oss's biased SwiGLU-OAI over an expert's rows, split by rows */
typedef struct oai_glu_ctx {
    const llm_layer *l;
    int e, F;
    float *gate, *up;
} oai_glu_ctx;

static void oai_glu_some(void *p, int t0, int t1) {
    const oai_glu_ctx *g = p;
    llm_oai_glu(g->l, g->e, g->gate + (size_t)t0 * g->F, g->up + (size_t)t0 * g->F, t1 - t0, g->F);
}

/* The mixture of experts in place of the FFN: each expert runs once, as
 * matmuls over only the tokens routed to it (decode reads the chosen
 * experts' weights only); each token's output is its slots' outputs
 * weighted, summed in slot order. Input norm(x) in xn, output there. */
static void moe_block(const llm_model *m, llm_work *w, kt_pool *pool, int il, int n) {
    const llm_config *c = &m->cfg;
    const llm_layer *l = &m->layers[il];
    const int E = c->n_expert, K = c->n_expert_used, D = c->n_embd, F = c->n_ff_exp;
    matmul(pool, w->router, &l->router, w->xn, n);
    add_bias(w->router, &l->router_bias, n); /* gpt-oss */
    for (int t = 0; t < n; t++)
        (c->moe_oai ? llm_oai_route : route)(w->router + (size_t)t * E, E, K, w->moe_e + t * K, w->moe_w + t * K);
    if (n == 1) {
        moe_decode(m, w, pool, il);
        return;
    }
    for (int e = 0; e < E; e++) {
        int cnt = 0;
        for (int s = 0; s < n * K; s++)
            if (w->moe_e[s] == e) {
                memcpy(w->moe_x + (size_t)cnt * D, w->xn + (size_t)(s / K) * D, sizeof(float) * (size_t)D);
                w->moe_rows[cnt++] = s;
            }
        if (!cnt) continue;
        const llm_tensor *g = &l->experts[3 * e], *u = &l->experts[3 * e + 1], *d = &l->experts[3 * e + 2];
        const kt_matmul_part gate_up[] = {{w->gate, g->data, g->type, F}, {w->up, u->data, u->type, F}};
        kt_matmul_many(pool, gate_up, 2, w->moe_x, D, cnt);
        oai_glu_ctx gc = {l, e, F, w->gate, w->up};
        if (c->moe_oai) over_tokens(pool, cnt, oai_glu_some, &gc);
        else gated_rows(pool, false, w->gate, w->up, cnt, F);
        matmul(pool, w->moe_out, d, w->gate, cnt);
        if (c->moe_oai) llm_oai_down_bias(l, e, w->moe_out, cnt, D);
        for (int i = 0; i < cnt; i++)
            memcpy(w->moe_y + (size_t)w->moe_rows[i] * D, w->moe_out + (size_t)i * D, sizeof(float) * (size_t)D);
    }
    moe_sum(w, n, K, D);
}

/* Qwen 3.5 MoE's shared expert, into w->shexp: sigmoid(shexp_inp . x)
 * times down(silu(gate x) * up x), from norm(x) in xn (left as it is). */
static void shared_expert(const llm_model *m, llm_work *w, kt_pool *pool, int il, int n) {
    const llm_config *c = &m->cfg;
    const llm_layer *l = &m->layers[il];
    const int D = c->n_embd, F = c->n_ff_shexp;
    const kt_matmul_part gate_up[] = {{w->gate, l->shexp_gate.data, l->shexp_gate.type, F},
                                      {w->up, l->shexp_up.data, l->shexp_up.type, F}};
    kt_matmul_many(pool, gate_up, 2, w->xn, D, n);
    gated_rows(pool, false, w->gate, w->up, n, F);
    matmul(pool, w->shexp, &l->shexp_down, w->gate, n);
    const float *gi = l->shexp_inp.data;
    for (int t = 0; t < n; t++) {
        const float *x = w->xn + (size_t)t * D;
        float dot = 0;
        for (int i = 0; i < D; i++) dot += gi[i] * x[i];
        const float s = 1.0f / (1.0f + expf(-dot));
        for (int i = 0; i < D; i++) w->shexp[(size_t)t * D + i] *= s;
    }
}

static void ffn_block(const llm_model *m, llm_work *w, kt_pool *pool, int il, int n) {
    const llm_config *c = &m->cfg;
    const llm_layer *l = &m->layers[il];
    if (l->router.data) {
        if (l->shexp_gate.data) shared_expert(m, w, pool, il, n);
        moe_block(m, w, pool, il, n);
        if (l->shexp_gate.data)
            for (size_t i = 0; i < (size_t)n * c->n_embd; i++) w->xn[i] += w->shexp[i];
        return;
    }
    const kt_matmul_part gate_up[] = {{w->gate, l->w_gate.data, l->w_gate.type, l->w_gate.n_out},
                                      {w->up, l->w_up.data, l->w_up.type, l->w_up.n_out}};
    kt_matmul_many(pool, gate_up, 2, w->xn, l->w_gate.n_in, n);
    gated_rows(pool, c->geglu, w->gate, w->up, n, c->n_ff);
    matmul(pool, w->xn, &l->w_down, w->gate, n);
}

/* The kept rows (keep_output_rows' order) that want their hidden state
 * go to hidden_out; the rest, which want logits, close up at the front.
 * Returns how many are left for logits; *n_hidden: how many went out. */
static int take_hidden_rows(const llm_config *c, llm_work *w, const llm_batch *b, int t0, int n_chunk, int n_kept,
                            const float *out, float *hidden_out, int *n_hidden) {
    const size_t embd = (size_t)c->n_embd;
    int j = 0, n_logits = 0;
    *n_hidden = 0;
    for (int t = 0; t < n_chunk && j < n_kept; t++) {
        if (!wants_output(b, t0 + t, out)) continue;
        const float *row = w->xn + (size_t)j++ * embd;
        const bool hid = b->hidden && b->hidden[t0 + t];
        if (hid) memcpy(hidden_out + (size_t)(*n_hidden)++ * embd, row, embd * sizeof(float));
        if (!hid || (out && b->logits && b->logits[t0 + t])) /* both: the MTP reads h beside the logits */
            memmove(w->xn + (size_t)n_logits++ * embd, row, embd * sizeof(float));
    }
    return n_logits;
}

/* The chunk's per-token attention inputs: block tables, lengths, rope angles. */
static void begin_chunk(const llm_model *m, llm_work *w, kt_pool *pool, const llm_batch *b, int t0, int n) {
    for (int t = 0; t < n; t++) {
        w->blocks[t] = b->seq[t0 + t]->blocks;
        w->slots[t] = b->seq[t0 + t]->slots;
        w->n_pos[t] = b->pos[t0 + t] + 1;
    }
    angles_ctx ac = {&m->cfg, b, t0, w};
    over_tokens(pool, n, rope_angles_some, &ac);
}

void llm_forward_block(const llm_model *m, llm_work *w, kt_pool *pool, const llm_batch *b, int il, const float *x,
                       const llm_tensor *out_norm, float *h_out) {
    const llm_config *c = &m->cfg;
    const llm_layer *l = &m->layers[il];
    const int n = b->n_tokens;
    const size_t bytes = sizeof(float) * (size_t)n * (size_t)c->n_embd;
    begin_chunk(m, w, pool, b, 0, n);
    memcpy(w->x, x, bytes);
    rmsnorm_rows(pool, w->xn, w->x, &l->attn_norm, n, c->n_embd, c->rms_eps);
    attention_block(m, w, pool, b, il, 0, n);
    add_norm_rows(pool, w->x, w->xn, &l->ffn_norm, n, c->n_embd, c->rms_eps);
    ffn_block(m, w, pool, il, n);
    add_norm_rows(pool, w->x, w->xn, out_norm, n, c->n_embd, c->rms_eps);
    memcpy(h_out, w->xn, bytes);
}

void llm_forward_block_kv(const llm_model *m, llm_work *w, kt_pool *pool, const llm_batch *b, int il,
                          const float *x) {
    const llm_config *c = &m->cfg;
    const int n = b->n_tokens;
    begin_chunk(m, w, pool, b, 0, n);
    memcpy(w->x, x, sizeof(float) * (size_t)n * (size_t)c->n_embd);
    rmsnorm_rows(pool, w->xn, w->x, &m->layers[il].attn_norm, n, c->n_embd, c->rms_eps);
    project_and_store(m, w, pool, b, il, 0, n, false); /* K and V only: the rows' outputs reach nothing */
}

/* Runs the chunk's tokens through every layer; returns how many logits
 * rows it wrote to out (the tokens with b->logits set, in batch order);
 * the hidden states asked for go to hidden_out (*n_hidden rows). */
static int forward_chunk(const llm_model *m, llm_work *w, kt_pool *pool, const llm_batch *b,
                         int t0, int n, float *out, float *hidden_out, int *n_hidden) {
    const int n_chunk = n;
    *n_hidden = 0;
    const llm_config *c = &m->cfg;
    begin_chunk(m, w, pool, b, t0, n);
    embed(m, b->tokens + t0, b->embd ? b->embd + t0 : NULL, n, w->x);
    if (c->embd_scale != 1) scale_rows(w->x, c->embd_scale, n, c->n_embd);
    rmsnorm_rows(pool, w->xn, w->x, &m->layers[0].attn_norm, n, c->n_embd, c->rms_eps);
    for (int il = 0; il < c->n_layer; il++) {
        /* each block takes norm(x) in xn and leaves its output there */
        const bool last = il == c->n_layer - 1;
        const llm_layer *l = &m->layers[il];
        if (l->recurrent) { /* every token moves its sequence's state on, wanted or not */
            const llm_rec_io io = {b->state_snap ? b->state_snap + t0 : NULL, b->rec_log ? b->rec_log + t0 : NULL,
                                   b->rec_from ? b->rec_from + t0 : NULL, b->rec_to ? b->rec_to + t0 : NULL};
            llm_deltanet_block(m, l, pool, w->xn, b->seq + t0, &io, n, &w->dn);
            if (last && !(n = keep_output_rows(c, w, b, t0, n, out))) return 0;
        } else if (!last) {
            attention_block(m, w, pool, b, il, t0, n);
        } else if (!(n = last_attention_block(m, w, pool, b, il, t0, n, out))) {
            return 0;
        }
        if (l->post_attn_norm.data) rmsnorm_rows(pool, w->xn, w->xn, &l->post_attn_norm, n, c->n_embd, c->rms_eps);
        add_norm_rows(pool, w->x, w->xn, &l->ffn_norm, n, c->n_embd, c->rms_eps);
        ffn_block(m, w, pool, il, n);
        if (l->post_ffn_norm.data) rmsnorm_rows(pool, w->xn, w->xn, &l->post_ffn_norm, n, c->n_embd, c->rms_eps);
        llm_deepstack_add(c, b->embd ? b->embd + t0 : NULL, n, il, w->xn); /* Qwen3-VL: before the last layer only */
        /* after the last layer, xn = the output norm of x: the classifier's input */
        add_norm_rows(pool, w->x, w->xn, last ? &m->output_norm : &m->layers[il + 1].attn_norm, n, c->n_embd,
                      c->rms_eps);
    }
    if (b->hidden) n = take_hidden_rows(c, w, b, t0, n_chunk, n, out, hidden_out, n_hidden);
    if (n == 0) return 0;
    matmul(pool, out, &m->output, w->xn, n);
    if (c->final_softcap > 0) softcap_rows(out, c->final_softcap, n, c->n_vocab);
    return n;
}

void llm_state_replay(const llm_model *m, llm_work *w, kt_pool *pool, kv_seq *seq, const float *const *log, int n) {
    for (int il = 0; il < m->cfg.n_layer; il++)
        if (m->layers[il].recurrent) llm_deltanet_replay(m, &m->layers[il], pool, seq, log, n, &w->dn);
}

void llm_forward(const llm_model *m, llm_work *w, kt_pool *pool, const llm_batch *b,
                 float *logits) {
    size_t n_vocab = (size_t)m->cfg.n_vocab;
    size_t n_out = 0, n_hidden = 0;
    for (int t0 = 0; t0 < b->n_tokens; t0 += LLM_MAX_BATCH) {
        int n = b->n_tokens - t0 < LLM_MAX_BATCH ? b->n_tokens - t0 : LLM_MAX_BATCH, h = 0;
        float *hidden = b->hidden ? b->hidden_out + n_hidden * (size_t)m->cfg.n_embd : NULL;
        n_out += (size_t)forward_chunk(m, w, pool, b, t0, n, logits ? logits + n_out * n_vocab : NULL, hidden, &h);
        n_hidden += (size_t)h;
    }
}
