/*
 * exp_nonpos.h - e^x for x <= 0, the sampler's softmax terms (a logit
 * minus the largest, over the temperature).
 *
 * A draw at a temperature takes one exponential per candidate: with no
 * top_k (OpenAI's API has none) that is the whole vocabulary, 150K terms
 * a token for Qwen's, where libm's double exp() was a fifth of a small
 * model's decode time. This is the Cephes single-precision method (x =
 * n ln2 + r, |r| <= ln2 / 2, a degree-6 polynomial for e^r, 2^n put in
 * the exponent bits): no call, within 2 ulp of e^x (tests/test_sampler.c
 * checks it against exp()), and 0 below -87 where floats would go
 * subnormal (a term under 1e-38 of the best one's never changes a draw).
 */
#ifndef KT_SAMPLE_EXP_NONPOS_H
#define KT_SAMPLE_EXP_NONPOS_H

#include <stdint.h>
#include <string.h>

static inline float kt_exp_nonpos(float x) {
    if (!(x >= -87.0f)) return 0.0f; /* and NaN */
    if (x > 0.0f) x = 0.0f;
    const int n = (int)(x * 1.44269504088896341f - 0.5f); /* round(x / ln2): x <= 0, so truncation of t - 0.5 */
    float r = x - (float)n * 0.693359375f;                 /* ln2 in two parts: the first exact in 9 bits */
    r -= (float)n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t bits = (int32_t)((uint32_t)(n + 127) << 23); /* 2^n: n >= -126 for x >= -87 */
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    return p * two_n;
}

#endif
