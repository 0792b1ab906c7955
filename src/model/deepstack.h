/*
 * deepstack.h - Qwen3-VL's DeepStack in the text model: an image token's
 * embedding row carries, after its n_embd input floats, one slice of
 * n_embd per DeepStack layer (the vision tower's DeepStack mergers'
 * outputs, src/vision/encoder.c); slice il + 1 is added to the token's
 * hidden state after decoder layer il < cfg.n_deepstack, as llama.cpp's
 * qwen3vl.cpp does (text tokens: nothing). Kept apart from forward.c so
 * the forward pass grows by one call.
 */
#ifndef KT_MODEL_DEEPSTACK_H
#define KT_MODEL_DEEPSTACK_H

#include "model/model.h"

/* The floats in one image embedding row of a model with config c:
 * n_embd * (1 + n_deepstack). */
size_t llm_embd_row_floats(const llm_config *c);

/* Adds slice il + 1 of each image token's row (embd[t], NULL for text
 * tokens) to that token's row of out (n rows of n_embd), if layer il is a
 * DeepStack layer; embd NULL: nothing. */
void llm_deepstack_add(const llm_config *c, const float *const *embd, int n, int il, float *out);

#endif
