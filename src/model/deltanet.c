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
 *                         S = S + k u^T;  o = S^T q
 *   out = ssm_out [RMSNorm(o_j) * ssm_norm * silu(z_j)]_j
 * The matmuls run over the whole chunk; the recurrence runs token after
 * token (each token touches only its own sequence's state). Scalar C.
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
    dw->tmp = malloc(((size_t)c->ssm_conv_dim + c->ssm_d_v) * sizeof(float));
    if (!dw->qkv || !dw->z || !dw->beta || !dw->alpha || !dw->o || !dw->tmp) {
        llm_dn_work_free(dw);
        return kt_error_set(err, KT_ERR_NOMEM, "out of memory allocating the DeltaNet scratch");
    }
    return KT_OK;
}

void llm_dn_work_free(llm_dn_work *dw) {
    free(dw->qkv), free(dw->z), free(dw->beta), free(dw->alpha), free(dw->o), free(dw->tmp);
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

/* The causal convolution of one token: out[c] = sum_k w[c][k] in[t-K+1+k][c]
 * (the state holds the K - 1 inputs before this one, oldest first), then
 * the state moves on and x becomes silu(out). */
static void conv_step(float *x, float *conv_state, const float *w, int C, int K, float *out) {
    for (int c = 0; c < C; c++) {
        float sum = 0;
        for (int k = 0; k < K - 1; k++) sum += conv_state[(size_t)k * C + c] * w[(size_t)c * K + k];
        sum += x[c] * w[(size_t)c * K + K - 1];
        out[c] = sum;
    }
    if (K > 2) memmove(conv_state, conv_state + C, sizeof(float) * (size_t)C * (size_t)(K - 2));
    memcpy(conv_state + (size_t)C * (size_t)(K - 2), x, sizeof(float) * (size_t)C);
    for (int c = 0; c < C; c++) x[c] = silu(out[c]);
}

/* One value head's delta rule for one token: S (dk x dv, row r = key
 * dim) decays by exp(g), takes beta (v - S^T k) along k, and gives
 * o = S^T q. */
static void delta_step(float *S, const float *q, const float *k, const float *v, float g, float beta, int dk, int dv,
                       float *o, float *u) {
    const float decay = expf(g);
    for (int i = 0; i < dk * dv; i++) S[i] *= decay;
    for (int c = 0; c < dv; c++) u[c] = 0;
    for (int r = 0; r < dk; r++) {
        const float kr = k[r], *row = S + (size_t)r * dv;
        for (int c = 0; c < dv; c++) u[c] += row[c] * kr;
    }
    for (int c = 0; c < dv; c++) u[c] = (v[c] - u[c]) * beta;
    for (int c = 0; c < dv; c++) o[c] = 0;
    for (int r = 0; r < dk; r++) {
        float *row = S + (size_t)r * dv;
        const float kr = k[r], qr = q[r];
        for (int c = 0; c < dv; c++) {
            row[c] += kr * u[c];
            o[c] += row[c] * qr;
        }
    }
}

void llm_deltanet_block(const llm_model *m, const llm_layer *l, kt_pool *pool, float *xn, kv_seq *const *seqs, int n,
                        llm_dn_work *dw) {
    const llm_config *c = &m->cfg;
    const int E = c->n_embd, C = c->ssm_conv_dim, K = c->ssm_conv_kernel;
    const int Hk = c->ssm_n_k_heads, Hv = c->ssm_n_v_heads, dk = c->ssm_d_k, dv = c->ssm_d_v, inner = Hv * dv;
    const kt_matmul_part parts[] = {{dw->qkv, l->ssm_qkv.data, l->ssm_qkv.type, C},
                                    {dw->z, l->ssm_z.data, l->ssm_z.type, inner},
                                    {dw->beta, l->ssm_beta.data, l->ssm_beta.type, Hv},
                                    {dw->alpha, l->ssm_alpha.data, l->ssm_alpha.type, Hv}};
    kt_matmul_many(pool, parts, 4, xn, E, n);
    const float *conv_w = l->ssm_conv.data, *dt_bias = l->ssm_dt_bias.data, *a = l->ssm_a.data;
    const float q_scale = 1.0f / sqrtf((float)dk);
    const size_t layer_floats = llm_state_layer_floats(c);
    for (int t = 0; t < n; t++) {
        float *st = seqs[t]->state + layer_floats * (size_t)l->rec_index;
        float *conv_state = st, *S = st + (size_t)(K - 1) * C;
        float *x = dw->qkv + (size_t)t * C;
        conv_step(x, conv_state, conv_w, C, K, dw->tmp);
        float *q = x, *k = x + (size_t)Hk * dk, *v = x + 2 * (size_t)Hk * dk;
        for (int h = 0; h < Hk; h++) {
            l2_norm(q + (size_t)h * dk, dk, c->rms_eps);
            l2_norm(k + (size_t)h * dk, dk, c->rms_eps);
            for (int i = 0; i < dk; i++) q[(size_t)h * dk + i] *= q_scale;
        }
        const float *bx = dw->beta + (size_t)t * Hv, *ax = dw->alpha + (size_t)t * Hv;
        float *o = dw->o + (size_t)t * inner;
        for (int j = 0; j < Hv; j++) {
            const int kh = j % Hk;
            const float g = a[j] * softplus(ax[j] + dt_bias[j]);
            const float beta = 1.0f / (1.0f + expf(-bx[j]));
            delta_step(S + (size_t)j * dk * dv, q + (size_t)kh * dk, k + (size_t)kh * dk, v + (size_t)j * dv, g, beta,
                       dk, dv, o + (size_t)j * dv, dw->tmp + C);
        }
        /* the gated RMSNorm, head by head */
        const float *z = dw->z + (size_t)t * inner;
        for (int j = 0; j < Hv; j++) {
            float *oj = o + (size_t)j * dv;
            kt_rmsnorm(oj, oj, l->ssm_norm.data, dv, c->rms_eps);
            for (int i = 0; i < dv; i++) oj[i] *= silu(z[(size_t)j * dv + i]);
        }
    }
    kt_matmul(pool, xn, l->ssm_out.data, l->ssm_out.type, dw->o, inner, E, n);
}
