/*
 * forward.h - the forward pass of one sequence over a contiguous KV cache.
 *
 * llm_forward appends n tokens at positions [pos0, pos0 + n) and writes
 * their logits. Long inputs are processed in chunks of at most
 * LLM_MAX_BATCH tokens; within a chunk every matmul is a GEMM over the
 * chunk's tokens, so weights are read once per chunk, not once per token.
 *
 * The KV cache holds, per layer, K and V rows of n_head_kv * head_dim
 * floats for positions [0, n_ctx). F32, so results match a reference
 * implementation to 1e-4 (paged F16 KV comes with the server).
 */
#ifndef KT_MODEL_FORWARD_H
#define KT_MODEL_FORWARD_H

#include <stdbool.h>

#include "model/model.h"
#include "ops/pool.h"

#define LLM_MAX_BATCH 256

typedef struct llm_state llm_state;

/* Allocates the KV cache for n_ctx positions and the scratch buffers. */
llm_state *llm_state_new(const llm_model *m, int n_ctx, kt_error *err);
void llm_state_free(llm_state *s);
int llm_state_n_ctx(const llm_state *s);

/* Runs tokens at positions [pos0, pos0 + n); the caller guarantees
 * pos0 + n <= n_ctx and every token id < n_vocab. logits (may be NULL)
 * receives n_vocab floats for each token when all_logits, else for the
 * last token only. */
void llm_forward(const llm_model *m, llm_state *s, kt_pool *pool, const int32_t *tokens,
                 int n, int pos0, float *logits, bool all_logits);

#endif
