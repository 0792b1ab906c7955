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

#endif
