/*
 * ops.h - the element-wise and attention kernels of the llama forward pass.
 *
 * Each kernel has a scalar reference (`_ref`) that is its specification and
 * a dispatched version (no suffix) that uses AVX2/FMA when the CPU has it.
 * Tests compare the two on random inputs of odd sizes.
 */
#ifndef KT_OPS_OPS_H
#define KT_OPS_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "ops/pool.h"

/* out[i] = x[i] * w[i] / sqrt(mean(x^2) + eps); out may alias x. */
void kt_rmsnorm(float *out, const float *x, const float *w, int n, float eps);
void kt_rmsnorm_ref(float *out, const float *x, const float *w, int n, float eps);

/* One token of the gated delta rule (Gated DeltaNet) on one head's state
 * S (dk rows, the key dims, of dv values):
 *   kv = S^T k;  u = beta (v - decay kv)
 *   S  = decay S + k u^T;  o = S^T q
 * which is ggml's order with the decay folded into the two passes over S
 * (decay S^T k for (decay S)^T k), so S is read twice per token, not
 * three times. Every sum runs over r in order with fmaf, so the SIMD
 * version (dv a multiple of 8) gives the reference's bits, and a token's
 * result does not depend on how tokens were split into steps: prefill,
 * decode and a prefix-cache resume compute the same state. u: dv floats
 * of scratch. S_in: the state before the token, read; S: the state
 * after it, written (S_in == S: in place; a verify pass writes a copy and
 * leaves the state before it untouched, kv/state_pool.h). */
void kt_delta_rule_ref(float *S, const float *S_in, const float *q, const float *k, const float *v, float decay,
                       float beta, int dk, int dv, float *o, float *u);

/* A run of n tokens of one sequence through one head, in order. */
typedef struct kt_delta_run {
    int n;
    const float *const *q, *const *k, *const *v; /* per token: dk, dk and dv floats */
    const float *decay, *beta;                   /* per token */
    float *const *o;                             /* per token: dv floats, written */
} kt_delta_run;

/* The run's tokens as n calls of kt_delta_rule_ref, the first reading
 * S_in and writing S, the others in place on S: the same bits. Each
 * column of S (a value dim) is a recurrence of its own, so the SIMD
 * versions (AVX2, AVX-512: the same lane arithmetic) take a block of 32
 * or 64 columns (16 or 32 KiB of a 128 x 128 state) and
 * runs every token of the run over it while it sits in L1, instead of
 * streaming the whole state through L2 twice a token. u: dv floats. */
void kt_delta_rule_run(float *S, const float *S_in, const kt_delta_run *run, int dk, int dv, float *u);
void kt_delta_rule_run_ref(float *S, const float *S_in, const kt_delta_run *run, int dk, int dv, float *u);

typedef enum kt_rope_style {
    KT_ROPE_ADJACENT, /* llama, mistral: rotate (x[2i], x[2i+1]) */
    KT_ROPE_NEOX      /* qwen2: rotate (x[i], x[i + rope_dim/2]) */
} kt_rope_style;

/* Rotates, in place, the first rope_dim values of each of n_heads heads of
 * head_dim values (x holds n_heads * head_dim floats) for position pos:
 * pair i turns by pos * freq_base^(-2i/rope_dim). */
void kt_rope(float *x, int n_heads, int head_dim, int rope_dim, int pos,
             float freq_base, kt_rope_style style);

/* kt_rope in two steps, so a token's angles are computed once for every
 * layer's Q and K (the trigonometry was most of a small model's rope):
 * kt_rope_angles writes the cos and sin of each of the kt_rope_pairs
 * pairs' angles at pos, kt_rope_apply turns the heads by them. Together
 * they give kt_rope's bits. */
int kt_rope_pairs(int head_dim, int rope_dim);
void kt_rope_angles(float *cs, float *sn, int head_dim, int rope_dim, int pos, float freq_base);
void kt_rope_apply(float *x, int n_heads, int head_dim, int rope_dim, const float *cs, const float *sn,
                   kt_rope_style style);

/* How a model stretches rope beyond its training context, as llama.cpp
 * computes it (ggml's rope_yarn). Pair i's angle at pos is
 *   extrap = pos * base^(-2i/rope_dim) / factors[i]  (Llama 3.1's rope_freqs; NULL: 1)
 *   interp = extrap * freq_scale                      (linear, YaRN: 1 / factor)
 *   theta  = interp * (1 - r_i) + extrap * r_i        (r_i = ext_factor * YaRN's ramp:
 *            1 below pair corr_lo, 0 above corr_hi, linear between)
 * and cos / sin are multiplied by mscale (YaRN's 1 + 0.1 ln factor). */
typedef struct kt_rope_scaling {
    float freq_scale, ext_factor, mscale, corr_lo, corr_hi;
    const float *factors; /* kt_rope_pairs of them, or NULL */
} kt_rope_scaling;

/* YaRN's correction range [lo, hi] of pairs, from the original context
 * (ggml_rope_yarn_corr_dims with beta_fast, beta_slow). */
void kt_rope_yarn_corr(int rope_dim, int n_ctx_orig, float freq_base, float beta_fast, float beta_slow, float *lo,
                       float *hi);
/* kt_rope_angles under a scaling (s NULL: exactly kt_rope_angles). */
void kt_rope_angles_scaled(float *cs, float *sn, int head_dim, int rope_dim, int pos, float freq_base,
                           const kt_rope_scaling *s);

/* In place, numerically stable (max subtracted). */
void kt_softmax(float *x, int n);
void kt_softmax_ref(float *x, int n);

/* out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)). out may
 * alias gate. */
void kt_swiglu(float *out, const float *gate, const float *up, int n);
void kt_swiglu_ref(float *out, const float *gate, const float *up, int n);

/* gpt-oss's clamped SwiGLU, ggml's swiglu_oai: with x = min(gate, limit)
 * and u = clamp(up, -limit, limit), out = x * sigmoid(alpha x) * (u + 1),
 * computed as x / (1 + exp(alpha * -x)) * (u + 1) in ggml's order (a
 * NaN gate or up stays NaN, as with ggml's std::min / std::clamp). out
 * may alias gate. */
void kt_swiglu_oai(float *out, const float *gate, const float *up, int n, float alpha, float limit);
void kt_swiglu_oai_ref(float *out, const float *gate, const float *up, int n, float alpha, float limit);

/* Gemma's GeGLU: out[i] = gelu(gate[i]) * up[i] with the tanh GELU,
 * gelu(g) = g/2 (1 + tanh(c (g + 0.044715 g^3))), c = sqrt(2/pi), computed
 * as g / (1 + exp(-2 c (g + 0.044715 g^3))) (the same function: 1 + tanh u
 * = 2 / (1 + e^-2u)). Exact, not llama.cpp's F16 table. out may alias gate. */
void kt_geglu(float *out, const float *gate, const float *up, int n);
void kt_geglu_ref(float *out, const float *gate, const float *up, int n);

/* Causal attention of n_tokens query tokens over a KV cache.
 *
 *   q:   n_tokens rows of n_head * head_dim floats (row stride q_stride)
 *   k,v: per position, a row of n_head_kv * head_dim values of kv_type:
 *        F32, F16, or Q8_0 (blocks of 32, so head_dim % 32 == 0). Query
 *        token t attends positions [0, n_pos[t]) of its sequence (n_pos
 *        NULL: [0, pos0 + t], one causal run).
 *   out: n_tokens rows of n_head * head_dim floats (row stride out_stride).
 *
 * Where position p's row starts:
 *   blocks NULL: one contiguous F32 cache, p * kv_stride floats from k/v;
 *   paged:       blocks[t][p / block_tokens] * block_bytes
 *                + (p % block_tokens) * row_bytes bytes from k/v,
 * blocks[t] being token t's sequence's block table (kv/block_pool.h), so
 * one call serves a ragged batch of tokens from many sequences.
 *
 * Head h reads KV head h / (n_head / n_head_kv) (grouped-query attention).
 * Scores are scaled by 1/sqrt(head_dim), then (softcap > 0, Gemma 2)
 * capped: s = softcap * tanh(s / softcap). window > 0 (a sliding-window
 * layer): token t attends only the last `window` of its positions,
 * [max(0, n_pos[t] - window), n_pos[t]), itself included, as llama.cpp's
 * standard SWA mask does. sinks (gpt-oss) non-NULL: per query head h one
 * more logit sinks[h] in the softmax's denominator, as llama.cpp's
 * soft_max with sinks computes it (the max taken over the scores and the
 * sink, exp(sink - max) added to the sum after the positions'), with no
 * value of its own: the weights sum to less than 1. The work is split over the pool by
 * (token, KV group) units; each unit's arithmetic depends only on its own
 * token's query and KV rows, never on the rest of the batch. */
typedef struct kt_attn_args {
    float *out;
    const float *q;
    const void *k, *v;
    int n_tokens, pos0, n_head, n_head_kv, head_dim;
    size_t q_stride, kv_stride, out_stride;
    /* paged KV (zero: contiguous F32) */
    kt_dtype kv_type;             /* KT_F32 (0), F16 or Q8_0 */
    const int32_t *const *blocks; /* per token; NULL: contiguous */
    int block_tokens;
    size_t row_bytes, block_bytes;
    const int *n_pos;             /* per token; NULL: pos0 + t + 1 */
    float softcap;                /* 0: none */
    int window;                   /* 0: every position */
    const float *sinks;           /* n_head extra logits (gpt-oss), or NULL: none */
} kt_attn_args;

void kt_attention(kt_pool *pool, const kt_attn_args *a);
void kt_attention_ref(const kt_attn_args *a);

#endif
