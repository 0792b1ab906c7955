/*
 * deltanet.c - the Gated DeltaNet layer, recurrent form (see deltanet.h).
 *
 * Per token, with H_k key heads and H_v value heads of d values:
 *   qkv = attn_qkv x, z = attn_gate x, beta = sigmoid(ssm_beta x),
 *   g = ssm_a * softplus(ssm_alpha x + ssm_dt.bias)     (per value head)
 *   qkv = silu(causal depthwise conv(qkv))               (kernel K, the
 *         last K - 1 inputs kept in the state)
 *   q, k L2-normalised per head, q scaled by 1 / sqrt(d_k)
 *   value head j uses key head j % H_k (ggml's tiled broadcast), and its
 *   state S (d_k x d_v):  S = exp(g) S;  u = beta (v - S^T k);
 *                         S = S + k u^T;  o = S^T q   (kt_delta_rule, ops/)
 *   out = ssm_out [RMSNorm(o_j) * ssm_norm * silu(z_j)]_j
 * The matmuls run over the whole chunk; the recurrence runs token after
 * token (each token touches only its own sequence's state), split
 * between threads by channels and value heads, a sequence's tokens in a
 * row through a head together (kt_delta_rule_run: the same bits).
 *
 * Prefill runs the recurrence token by token too, not the chunked (WY)
 * form: the per-token form makes a token's result independent of how the
 * prompt was cut into steps, so a prefix-cache resume from a state
 * snapshot gives the cold run's bits (kv/state_pool.h); measured against
 * the matmuls in docs/PERFORMANCE.md.
 */
#include "model/deltanet.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "ops/matmul.h"
#include "ops/ops.h"

kt_status llm_dn_work_init(llm_dn_work *dw, const llm_config *c, int n_max, kt_error *err) {
    memset(dw, 0, sizeof *dw);
    const size_t n = (size_t)n_max, inner = (size_t)c->ssm_n_v_heads * c->ssm_d_v;
    dw->qkv = malloc(n * c->ssm_conv_dim * sizeof(float));
    dw->z = malloc(n * inner * sizeof(float));
    dw->beta = malloc(n * c->ssm_n_v_heads * sizeof(float));
    dw->alpha = malloc(n * c->ssm_n_v_heads * sizeof(float));
    dw->o = malloc(n * inner * sizeof(float));
    if (!dw->qkv || !dw->z || !dw->beta || !dw->alpha || !dw->o) {
        llm_dn_work_free(dw);
        return kt_error_set(err, KT_ERR_NOMEM, "out of memory allocating the DeltaNet scratch");
    }
    return KT_OK;
}

void llm_dn_work_free(llm_dn_work *dw) {
    free(dw->qkv), free(dw->z), free(dw->beta), free(dw->alpha), free(dw->o);
    memset(dw, 0, sizeof *dw);
}

static float silu(float x) { return x / (1.0f + expf(-x)); }

/* ggml_softplus */
static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* ggml_l2_norm: x / max(||x||, eps), the sum in double */
static void l2_norm(float *x, int n, float eps) {
    double sum = 0;
    for (int i = 0; i < n; i++) sum += (double)(x[i] * x[i]);
    const float scale = 1.0f / fmaxf(sqrtf((float)sum), eps);
    for (int i = 0; i < n; i++) x[i] *= scale;
}

/* The work of one layer over a chunk, split between the pool's threads
 * in three phases, each element computed as a serial loop would: the
 * convolution by channels (each thread runs its channels' tokens in
 * order: a token's inputs come after its sequence's earlier ones), the
 * normalisations by tokens, the delta rule and the gated norm by value
 * heads (tokens in order again: the states are per head). */
typedef struct dn_job {
    const llm_config *c;
    const llm_layer *l;
    kv_seq *const *seqs;
    llm_rec_io io;
    llm_dn_work *dw;
    int n, phase;
    size_t layer_floats;
    bool state_only; /* a replay: the states move on, no output */
} dn_job;

/* This layer's part of the state token t reads, and of the one it writes
 * (the same buffer but for a verify pass's first token). */
static const float *state_in(const dn_job *j, int t) {
    const float *s = j->io.from && j->io.from[t] ? j->io.from[t] : j->seqs[t]->state;
    return s + j->layer_floats * (size_t)j->l->rec_index;
}
static float *state_out(const dn_job *j, int t) {
    float *s = j->io.to && j->io.to[t] ? j->io.to[t] : j->seqs[t]->state;
    return s + j->layer_floats * (size_t)j->l->rec_index;
}

static void dn_conv(const dn_job *j, int c0, int c1) {
    const llm_config *c = j->c;
    const int C = c->ssm_conv_dim, K = c->ssm_conv_kernel;
    const float *w = j->l->ssm_conv.data;
    for (int t = 0; t < j->n; t++) {
        /* [K - 1][C], oldest first; in and out may be one buffer: each
         * entry is read before it is written */
        const float *ci = state_in(j, t);
        float *cs = state_out(j, t);
        float *x = j->dw->qkv + (size_t)t * C;
        for (int ch = c0; ch < c1; ch++) {
            float sum = 0;
            for (int k = 0; k < K - 1; k++) sum += ci[(size_t)k * C + ch] * w[(size_t)ch * K + k];
            sum += x[ch] * w[(size_t)ch * K + K - 1];
            for (int k = 0; k < K - 2; k++) cs[(size_t)k * C + ch] = ci[(size_t)(k + 1) * C + ch];
            cs[(size_t)(K - 2) * C + ch] = x[ch];
            x[ch] = silu(sum);
        }
        if (j->io.snap && j->io.snap[t]) {
            float *d = j->io.snap[t] + j->layer_floats * (size_t)j->l->rec_index;
            for (int k = 0; k < K - 1; k++)
                memcpy(d + (size_t)k * C + c0, cs + (size_t)k * C + c0, sizeof(float) * (size_t)(c1 - c0));
        }
    }
}

static void dn_norm(const dn_job *j, int t0, int t1) {
    const llm_config *c = j->c;
    const int Hk = c->ssm_n_k_heads, dk = c->ssm_d_k;
    const float q_scale = 1.0f / sqrtf((float)dk);
    for (int t = t0; t < t1; t++) {
        float *q = j->dw->qkv + (size_t)t * c->ssm_conv_dim, *k = q + (size_t)Hk * dk;
        for (int h = 0; h < Hk; h++) {
            l2_norm(q + (size_t)h * dk, dk, c->rms_eps);
            l2_norm(k + (size_t)h * dk, dk, c->rms_eps);
            for (int i = 0; i < dk; i++) q[(size_t)h * dk + i] *= q_scale;
        }
    }
}

#define LLM_DN_RUN_MAX 64 /* tokens a head's run takes at once (dn_heads' arrays) */

/* Where the run of tokens that starts at t0 ends: the tokens of one
 * sequence in a row, each reading the state the one before wrote (a
 * verify pass's first token starts a run of its own: it reads the state
 * and writes the spare), ending at a token whose state is snapshotted
 * (the run's state is only whole at its end). */
static int run_end(const dn_job *j, int t0) {
    int t = t0 + 1;
    while (t < j->n && j->seqs[t] == j->seqs[t0] && state_in(j, t) == state_out(j, t - 1) &&
           !(j->io.snap && j->io.snap[t - 1]))
        t++;
    return t;
}

/* Heads outer, runs of a sequence's tokens inner: a head's state (d_k x
 * d_v floats, 64 KiB for Qwen 3.5) is worked a column block at a time
 * across the run (kt_delta_rule_run), then each token's output gated. */
static void dn_heads(const dn_job *j, int h0, int h1, float *u) {
    const llm_config *c = j->c;
    const llm_layer *l = j->l;
    const int C = c->ssm_conv_dim, K = c->ssm_conv_kernel;
    const int Hk = c->ssm_n_k_heads, Hv = c->ssm_n_v_heads, dk = c->ssm_d_k, dv = c->ssm_d_v, inner = Hv * dv;
    const float *dt_bias = l->ssm_dt_bias.data, *a = l->ssm_a.data;
    const float *q[LLM_DN_RUN_MAX], *k[LLM_DN_RUN_MAX], *v[LLM_DN_RUN_MAX];
    float decay[LLM_DN_RUN_MAX], beta[LLM_DN_RUN_MAX], *o[LLM_DN_RUN_MAX];
    for (int h = h0; h < h1; h++) {
        const int kh = h % Hk; /* ggml's tiled broadcast */
        const size_t at = (size_t)(K - 1) * C + (size_t)h * dk * dv;
        for (int t0 = 0, t1; t0 < j->n; t0 = t1) {
            t1 = run_end(j, t0);
            if (t1 - t0 > LLM_DN_RUN_MAX) t1 = t0 + LLM_DN_RUN_MAX;
            for (int t = t0; t < t1; t++) {
                const float *x = j->dw->qkv + (size_t)t * C;
                const int i = t - t0;
                q[i] = x + (size_t)kh * dk, k[i] = x + (size_t)(Hk + kh) * dk, v[i] = x + 2 * (size_t)Hk * dk + (size_t)h * dv;
                decay[i] = expf(a[h] * softplus(j->dw->alpha[(size_t)t * Hv + h] + dt_bias[h]));
                beta[i] = 1.0f / (1.0f + expf(-j->dw->beta[(size_t)t * Hv + h]));
                o[i] = j->dw->o + (size_t)t * inner + (size_t)h * dv;
            }
            const kt_delta_run run = {t1 - t0, q, k, v, decay, beta, o};
            float *S = state_out(j, t1 - 1) + at;
            kt_delta_rule_run(S, state_in(j, t0) + at, &run, dk, dv, u);
            if (j->state_only) continue;
            if (j->io.snap && j->io.snap[t1 - 1])
                memcpy(j->io.snap[t1 - 1] + j->layer_floats * (size_t)l->rec_index + at, S, sizeof(float) * (size_t)dk * dv);
            for (int t = t0; t < t1; t++) { /* the gated RMSNorm */
                float *oh = o[t - t0];
                const float *z = j->dw->z + (size_t)t * inner + (size_t)h * dv;
                kt_rmsnorm(oh, oh, l->ssm_norm.data, dv, c->rms_eps);
                for (int i = 0; i < dv; i++) oh[i] *= silu(z[i]);
            }
        }
    }
}

static void dn_task(void *p, int ith, int nth) {
    const dn_job *j = p;
    const llm_config *c = j->c;
    const int n_items = j->phase == 0 ? c->ssm_conv_dim : j->phase == 1 ? j->n : c->ssm_n_v_heads;
    long lo, hi;
    kt_split_range(n_items, ith, nth, &lo, &hi);
    if (lo >= hi) return;
    if (j->phase == 0) dn_conv(j, (int)lo, (int)hi);
    else if (j->phase == 1) dn_norm(j, (int)lo, (int)hi);
    else {
        float u[1024]; /* d_v <= 1024 (model.c) */
        dn_heads(j, (int)lo, (int)hi, u);
    }
}

size_t llm_rec_log_floats(const llm_config *c) {
    return (size_t)c->n_recurrent * ((size_t)c->ssm_conv_dim + 2 * (size_t)c->ssm_n_v_heads);
}

/* Copies the n tokens' projections of layer l into their logs (or, with
 * !to_log, back from them), skipping tokens without a log. */
static void log_inputs(const llm_config *c, const llm_layer *l, float *const *log, int n, llm_dn_work *dw,
                       bool to_log) {
    const size_t C = (size_t)c->ssm_conv_dim, Hv = (size_t)c->ssm_n_v_heads;
    for (int t = 0; t < n; t++) {
        if (!log[t]) continue;
        float *at = log[t] + (size_t)l->rec_index * (C + 2 * Hv);
        float *qkv = dw->qkv + (size_t)t * C, *beta = dw->beta + (size_t)t * Hv, *alpha = dw->alpha + (size_t)t * Hv;
        if (to_log) {
            memcpy(at, qkv, C * sizeof(float)), memcpy(at + C, beta, Hv * sizeof(float));
            memcpy(at + C + Hv, alpha, Hv * sizeof(float));
        } else {
            memcpy(qkv, at, C * sizeof(float)), memcpy(beta, at + C, Hv * sizeof(float));
            memcpy(alpha, at + C + Hv, Hv * sizeof(float));
        }
    }
}

static void run_phases(kt_pool *pool, dn_job *j) {
    for (j->phase = 0; j->phase < 3; j->phase++) {
        /* a few tokens' convolution and norms cost less than waking the pool */
        if (kt_pool_size(pool) == 1 || (j->phase < 2 && j->n < 16)) dn_task(j, 0, 1);
        else kt_pool_run(pool, dn_task, j);
    }
}

void llm_deltanet_block(const llm_model *m, const llm_layer *l, kt_pool *pool, float *xn, kv_seq *const *seqs,
                        const llm_rec_io *io, int n, llm_dn_work *dw) {
    const llm_config *c = &m->cfg;
    const int E = c->n_embd, C = c->ssm_conv_dim, Hv = c->ssm_n_v_heads, inner = Hv * c->ssm_d_v;
    const kt_matmul_part parts[] = {{dw->qkv, l->ssm_qkv.data, l->ssm_qkv.type, C},
                                    {dw->z, l->ssm_z.data, l->ssm_z.type, inner},
                                    {dw->beta, l->ssm_beta.data, l->ssm_beta.type, Hv},
                                    {dw->alpha, l->ssm_alpha.data, l->ssm_alpha.type, Hv}};
    kt_matmul_many(pool, parts, 4, xn, E, n);
    if (io->log) log_inputs(c, l, io->log, n, dw, true);
    dn_job j = {c, l, seqs, *io, dw, n, 0, llm_state_layer_floats(c), false};
    run_phases(pool, &j);
    kt_matmul(pool, xn, l->ssm_out.data, l->ssm_out.type, dw->o, inner, E, n);
}

void llm_deltanet_replay(const llm_model *m, const llm_layer *l, kt_pool *pool, kv_seq *seq, const float *const *log,
                         int n, llm_dn_work *dw) {
    kv_seq *seqs[64];
    for (int done = 0; done < n; done += 64) {
        const int nb = n - done < 64 ? n - done : 64;
        for (int t = 0; t < nb; t++) seqs[t] = seq;
        log_inputs(&m->cfg, l, (float *const *)(log + done), nb, dw, false);
        dn_job j = {&m->cfg, l, seqs, {0}, dw, nb, 0, llm_state_layer_floats(&m->cfg), true};
        run_phases(pool, &j);
    }
}
