/*
 * sampler.h - the sampler chain behind kt_sampler_* in kettle.h.
 *
 * Order (llama.cpp's default, so settings carry over): penalties
 * (repetition, frequency, presence over the last penalty_last_n accepted
 * tokens) -> top-k -> top-p -> min-p -> temperature -> draw from the
 * softmax with the seeded generator. temperature <= 0 is greedy (argmax
 * after penalties; ties go to the lowest id). The same seed and the same
 * logits give the same tokens on every run.
 */
#ifndef KT_SAMPLE_SAMPLER_H
#define KT_SAMPLE_SAMPLER_H

#include "kettle.h"

/*
 * Parameter rules (kt_sampler_new fails with KT_ERR_ARG otherwise):
 * n_vocab > 0; temperature finite; top_p > 0 (not NaN); min_p <= 1 (not
 * NaN); repeat_penalty finite and > 0; frequency and presence penalties
 * finite; penalty_last_n >= 0. top_k <= 0 or >= n_vocab is off.
 *
 * Penalties (llama.cpp's): for each distinct token t among the last
 * penalty_last_n accepted tokens, occurring c times there,
 *     logit = logit > 0 ? logit / repeat_penalty : logit * repeat_penalty;
 *     logit -= c * frequency_penalty + presence_penalty;
 * top-p and min-p look at the softmax of the logits before temperature
 * (llama.cpp's order). NaN logits count as -inf. Ids passed to
 * kt_sampler_accept outside [0, n_vocab) are ignored; kt_sampler_sample
 * returns -1 only for a NULL sampler or logits.
 */

/* The penalty stage alone, applied in place to n_vocab logits (what
 * kt_sampler_sample does first); exposed for tests and tools. */
void kt_sampler_apply_penalties(kt_sampler *s, float *logits);

#endif
