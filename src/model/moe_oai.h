/*
 * moe_oai.h - gpt-oss's mixture of experts (llama.cpp's build_moe_ffn with
 * LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT and LLM_FFN_SWIGLU_OAI_MOE),
 * the parts where it differs from the other MoE models; forward.c's
 * moe_block runs the experts and calls these.
 */
#ifndef KT_MODEL_MOE_OAI_H
#define KT_MODEL_MOE_OAI_H

#include "model/model.h"

/* gpt-oss's constants: llama.cpp hard-codes them (no GGUF key). */
#define LLM_OAI_ALPHA 1.702f
#define LLM_OAI_LIMIT 7.0f

/* A token's experts from its router logits (bias already added): the k
 * largest logits (descending, the lower index first on a tie), weighted
 * by the softmax over those k logits alone. */
void llm_oai_route(const float *logits, int n_expert, int k, int *expert, float *weight);

/* rows rows of expert e's gate and up outputs (F wide each): their
 * biases added, then gate = SwiGLU-OAI(gate, up) in place. */
void llm_oai_glu(const llm_layer *l, int e, float *gate, float *up, int rows, int F);

/* rows rows of expert e's down outputs (D wide): its bias added. */
void llm_oai_down_bias(const llm_layer *l, int e, float *out, int rows, int D);

#endif
