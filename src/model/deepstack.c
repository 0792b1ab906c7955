/*
 * deepstack.c - Qwen3-VL's DeepStack adds (see deepstack.h): the vision
 * tower's per-layer features of an image token go into the text model's
 * hidden state after its first n_deepstack layers.
 */
#include "model/deepstack.h"

size_t llm_embd_row_floats(const llm_config *c) {
    return (size_t)c->n_embd * (size_t)(1 + c->n_deepstack);
}

void llm_deepstack_add(const llm_config *c, const float *const *embd, int n, int il, float *out) {
    if (!embd || il >= c->n_deepstack) return;
    const size_t d = (size_t)c->n_embd;
    for (int t = 0; t < n; t++) {
        if (!embd[t]) continue;
        const float *ds = embd[t] + (size_t)(il + 1) * d;
        float *row = out + (size_t)t * d;
        for (size_t i = 0; i < d; i++) row[i] += ds[i];
    }
}
