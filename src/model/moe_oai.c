/*
 * moe_oai.c - gpt-oss's routing and expert activation (moe_oai.h).
 *
 * As llama.cpp computes them (llama-graph.cpp build_moe_ffn, ggml-cpu
 * ops.cpp): the router's logits plus its bias; ggml_argsort_top_k on the
 * logits themselves (no softmax before the choice); ggml_soft_max over
 * the k chosen logits (max subtracted, expf, the sum in double, each
 * exp times (float)(1 / sum)); per expert g = W_g x + b_g and u = W_u x +
 * b_u, ggml_swiglu_oai(g, u) with alpha 1.702 and limit 7; W_d a + b_d,
 * times the weight, summed over the slots in order (forward.c moe_sum).
 */
#include "model/moe_oai.h"

#include <math.h>

#include "ops/ops.h"

void llm_oai_route(const float *logits, int n_expert, int k, int *expert, float *weight) {
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n_expert; e++) {
            bool taken = false;
            for (int i = 0; i < j; i++) taken |= expert[i] == e;
            if (!taken && (best < 0 || logits[e] > logits[best])) best = e;
        }
        expert[j] = best;
    }
    float max = -INFINITY;
    for (int j = 0; j < k; j++) max = logits[expert[j]] > max ? logits[expert[j]] : max;
    double sum = 0;
    for (int j = 0; j < k; j++) sum += (double)(weight[j] = expf(logits[expert[j]] - max));
    const float inv = (float)(1.0 / sum);
    for (int j = 0; j < k; j++) weight[j] *= inv;
}

/* rows rows of n values += expert e's bias row (b: F32 [n, n_expert]) */
static void add_expert_bias(const llm_tensor *b, int e, float *x, int rows, int n) {
    const float *bias = (const float *)b->data + (size_t)e * (size_t)n;
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < n; i++) x[(size_t)r * n + i] += bias[i];
}

void llm_oai_glu(const llm_layer *l, int e, float *gate, float *up, int rows, int F) {
    add_expert_bias(&l->exp_bias[0], e, gate, rows, F);
    add_expert_bias(&l->exp_bias[1], e, up, rows, F);
    for (int r = 0; r < rows; r++)
        kt_swiglu_oai(gate + (size_t)r * F, gate + (size_t)r * F, up + (size_t)r * F, F, LLM_OAI_ALPHA, LLM_OAI_LIMIT);
}

void llm_oai_down_bias(const llm_layer *l, int e, float *out, int rows, int D) {
    add_expert_bias(&l->exp_bias[2], e, out, rows, D);
}
