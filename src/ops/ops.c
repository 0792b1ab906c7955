/*
 * ops.c - the scalar reference kernels of ops.h, their dispatchers, and
 * RoPE (scalar only: it is cheap); the AVX2 versions are in ops_avx2.c.
 *
 * The references follow llama.cpp's CPU operations where the golden tests
 * compare against it:
 *   - rmsnorm: scale = 1 / sqrtf(sum(x^2) / n + eps), out = (x * scale) * w
 *     (the sum in float, in order);
 *   - rope: theta_0 = pos, theta_{i+1} = theta_i * powf(base, -2/rope_dim),
 *     cosf/sinf of each, exactly as ggml_rope_cache_init builds its table
 *     (ggml multiplies up the angle rather than calling powf per pair; the
 *     two differ by a few ulp of theta, which at large positions is more
 *     than the 1e-5 we want to match llama.cpp by);
 *   - softmax: e = expf(x - max), x = e * (1 / sum e);
 *   - swiglu: out = gate / (1 + expf(-gate)) * up;
 *   - attention: softmax(q.k / sqrt(head_dim)) . v, written as the textbook
 *     three passes (max, sum, weighted sum) with nothing stored; the SIMD
 *     kernels in ops_avx2.c keep its order (scores stored, then the exps
 *     and their sum, then V), per token or, in prefill with AVX-512, per
 *     block of 16 tokens of one sequence.
 *
 * Every kernel works on whole rows of one token, so a token's results do
 * not depend on the batch it is in.
 */
#include "ops/ops.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/fp16.h"
#include "ops/cpu.h"
#include "ops/internal.h"
#include "ops/quant.h"

/* ---- rmsnorm -------------------------------------------------------- */

void kt_rmsnorm_ref(float *out, const float *x, const float *w, int n, float eps) {
    /* the sum of squares in double, the mean in float, as ggml computes it */
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)(x[i] * x[i]);
    const float mean = (float)(ss / n);
    const float scale = 1.0f / sqrtf(mean + eps);
    for (int i = 0; i < n; i++) out[i] = (x[i] * scale) * w[i];
}

void kt_rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    if (kt_cpu_has_avx2()) kt_rmsnorm_avx2(out, x, w, n, eps);
    else kt_rmsnorm_ref(out, x, w, n, eps);
}

/* ---- the gated delta rule ------------------------------------------- */

void kt_delta_rule_ref(float *S, const float *S_in, const float *q, const float *k, const float *v, float decay,
                       float beta, int dk, int dv, float *o, float *u) {
    for (int c = 0; c < dv; c++) u[c] = 0;
    for (int r = 0; r < dk; r++) {
        const float *row = S_in + (size_t)r * dv;
        for (int c = 0; c < dv; c++) u[c] = fmaf(row[c], k[r], u[c]);
    }
    for (int c = 0; c < dv; c++) u[c] = (v[c] - decay * u[c]) * beta;
    for (int c = 0; c < dv; c++) o[c] = 0;
    for (int r = 0; r < dk; r++) {
        const float *in = S_in + (size_t)r * dv;
        float *row = S + (size_t)r * dv;
        for (int c = 0; c < dv; c++) {
            row[c] = fmaf(k[r], u[c], in[c] * decay);
            o[c] = fmaf(row[c], q[r], o[c]);
        }
    }
}

void kt_delta_rule_run_ref(float *S, const float *S_in, const kt_delta_run *run, int dk, int dv, float *u) {
    for (int t = 0; t < run->n; t++)
        kt_delta_rule_ref(S, t == 0 ? S_in : S, run->q[t], run->k[t], run->v[t], run->decay[t], run->beta[t], dk, dv,
                          run->o[t], u);
}

void kt_delta_rule_run(float *S, const float *S_in, const kt_delta_run *run, int dk, int dv, float *u) {
    if (dv % 16 == 0 && kt_cpu_has_avx512_vnni()) kt_delta_rule_run_avx512(S, S_in, run, dk, dv);
    else if (dv % 8 == 0 && kt_cpu_has_avx2()) kt_delta_rule_run_avx2(S, S_in, run, dk, dv);
    else kt_delta_rule_run_ref(S, S_in, run, dk, dv, u);
}

/* ---- rope ----------------------------------------------------------- */

#define ROPE_CHUNK 64 /* pairs whose cos/sin kt_rope computes at a time */

int kt_rope_pairs(int head_dim, int rope_dim) {
    if (rope_dim > head_dim) rope_dim = head_dim;
    return rope_dim / 2;
}

/* Pairs [p0, p0 + n) at angles theta, theta * scale, ...; returns the
 * angle after the last, so chunks continue the same product chain. */
static float rope_angles_from(float *cs, float *sn, int n, float theta, float theta_scale) {
    for (int i = 0; i < n; i++) {
        cs[i] = cosf(theta);
        sn[i] = sinf(theta);
        theta *= theta_scale;
    }
    return theta;
}

static float rope_theta_scale(int n_pairs, float freq_base) {
    return powf(freq_base, -2.0f / (float)(2 * n_pairs));
}

/* Pairs [p0, p0 + nc) of every head, cs/sn indexed from p0. */
static void rope_turn(float *x, int n_heads, int head_dim, int n_pairs, int p0, int nc, const float *cs,
                      const float *sn, kt_rope_style style) {
#if defined(__x86_64__) || defined(__i386__)
    if (kt_cpu_has_avx2()) {
        kt_rope_turn_avx2(x, n_heads, head_dim, n_pairs, p0, nc, cs, sn, style);
        return;
    }
#endif
    kt_rope_turn_ref(x, n_heads, head_dim, n_pairs, p0, nc, cs, sn, style);
}

void kt_rope_turn_ref(float *x, int n_heads, int head_dim, int n_pairs, int p0, int nc, const float *cs,
                      const float *sn, kt_rope_style style) {
    for (int h = 0; h < n_heads; h++) {
        float *xh = x + (size_t)h * head_dim;
        for (int i = 0; i < nc; i++) {
            /* the pair's two elements: adjacent, or half a rope_dim apart */
            const int pi = p0 + i;
            float *a = style == KT_ROPE_NEOX ? xh + pi : xh + 2 * pi;
            float *b = style == KT_ROPE_NEOX ? xh + pi + n_pairs : xh + 2 * pi + 1;
            const float x0 = *a, x1 = *b;
            *a = x0 * cs[i] - x1 * sn[i];
            *b = x0 * sn[i] + x1 * cs[i];
        }
    }
}

void kt_rope(float *x, int n_heads, int head_dim, int rope_dim, int pos, float freq_base,
             kt_rope_style style) {
    const int n_pairs = kt_rope_pairs(head_dim, rope_dim);
    const float theta_scale = rope_theta_scale(n_pairs, freq_base);
    float theta = (float)pos;
    float cs[ROPE_CHUNK], sn[ROPE_CHUNK];
    for (int c0 = 0; c0 < n_pairs; c0 += ROPE_CHUNK) {
        const int nc = n_pairs - c0 < ROPE_CHUNK ? n_pairs - c0 : ROPE_CHUNK;
        theta = rope_angles_from(cs, sn, nc, theta, theta_scale);
        rope_turn(x, n_heads, head_dim, n_pairs, c0, nc, cs, sn, style);
    }
}

void kt_rope_angles(float *cs, float *sn, int head_dim, int rope_dim, int pos, float freq_base) {
    const int n_pairs = kt_rope_pairs(head_dim, rope_dim);
    rope_angles_from(cs, sn, n_pairs, (float)pos, rope_theta_scale(n_pairs, freq_base));
}

void kt_rope_yarn_corr(int rope_dim, int n_ctx_orig, float freq_base, float beta_fast, float beta_slow, float *lo,
                       float *hi) {
    /* the pair index at which a wave turns beta times over n_ctx_orig positions */
    const float two_pi = 6.28318530717958647692f;
    const float d_fast = rope_dim * logf(n_ctx_orig / (beta_fast * two_pi)) / (2 * logf(freq_base));
    const float d_slow = rope_dim * logf(n_ctx_orig / (beta_slow * two_pi)) / (2 * logf(freq_base));
    const float start = floorf(d_fast), end = ceilf(d_slow);
    *lo = start > 0 ? start : 0;
    *hi = end < rope_dim - 1 ? end : (float)(rope_dim - 1);
}

void kt_rope_angles_scaled(float *cs, float *sn, int head_dim, int rope_dim, int pos, float freq_base,
                           const kt_rope_scaling *s) {
    if (!s) {
        kt_rope_angles(cs, sn, head_dim, rope_dim, pos, freq_base);
        return;
    }
    const int n_pairs = kt_rope_pairs(head_dim, rope_dim);
    const float theta_scale = rope_theta_scale(n_pairs, freq_base);
    const float span = s->corr_hi - s->corr_lo > 0.001f ? s->corr_hi - s->corr_lo : 0.001f;
    float theta_base = (float)pos; /* the same product chain as the plain angles */
    for (int i = 0; i < n_pairs; i++) {
        const float extrap = s->factors ? theta_base / s->factors[i] : theta_base;
        const float interp = s->freq_scale * extrap;
        float theta = interp;
        if (s->ext_factor != 0.0f) {
            float y = ((float)i - s->corr_lo) / span;
            y = y < 0 ? 0 : y > 1 ? 1 : y;
            const float mix = (1 - y) * s->ext_factor;
            theta = interp * (1 - mix) + extrap * mix;
        }
        cs[i] = cosf(theta) * s->mscale;
        sn[i] = sinf(theta) * s->mscale;
        theta_base *= theta_scale;
    }
}

void kt_rope_apply(float *x, int n_heads, int head_dim, int rope_dim, const float *cs, const float *sn,
                   kt_rope_style style) {
    const int n_pairs = kt_rope_pairs(head_dim, rope_dim);
    rope_turn(x, n_heads, head_dim, n_pairs, 0, n_pairs, cs, sn, style);
}

/* ---- softmax -------------------------------------------------------- */

void kt_softmax_ref(float *x, int n) {
    if (n <= 0) return;
    float max = x[0];
    for (int i = 1; i < n; i++) max = x[i] > max ? x[i] : max;
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    const float inv = 1.0f / sum;
    for (int i = 0; i < n; i++) x[i] *= inv;
}

void kt_softmax(float *x, int n) {
    if (kt_cpu_has_avx2()) kt_softmax_avx2(x, n);
    else kt_softmax_ref(x, n);
}

/* ---- swiglu --------------------------------------------------------- */

void kt_swiglu_ref(float *out, const float *gate, const float *up, int n) {
    for (int i = 0; i < n; i++) {
        const float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void kt_swiglu_oai_ref(float *out, const float *gate, const float *up, int n, float alpha, float limit) {
    for (int i = 0; i < n; i++) {
        const float x = limit < gate[i] ? limit : gate[i]; /* std::min(gate, limit): a NaN gate stays NaN */
        const float u = up[i] < -limit ? -limit : up[i] > limit ? limit : up[i];
        out[i] = x / (1.0f + expf(alpha * (-x))) * (u + 1.0f);
    }
}

void kt_swiglu_oai(float *out, const float *gate, const float *up, int n, float alpha, float limit) {
    if (kt_cpu_has_avx2()) kt_swiglu_oai_avx2(out, gate, up, n, alpha, limit);
    else kt_swiglu_oai_ref(out, gate, up, n, alpha, limit);
}

void kt_swiglu(float *out, const float *gate, const float *up, int n) {
    if (kt_cpu_has_avx2()) kt_swiglu_avx2(out, gate, up, n);
    else kt_swiglu_ref(out, gate, up, n);
}

/* ---- geglu ---------------------------------------------------------- */

void kt_geglu_ref(float *out, const float *gate, const float *up, int n) {
    for (int i = 0; i < n; i++) {
        const float g = gate[i];
        out[i] = g / (1.0f + expf(-2.0f * 0.7978845608f * (g + 0.044715f * (g * g * g)))) * up[i];
    }
}

void kt_geglu(float *out, const float *gate, const float *up, int n) {
    if (kt_cpu_has_avx2()) kt_geglu_avx2(out, gate, up, n);
    else kt_geglu_ref(out, gate, up, n);
}

/* ---- attention ------------------------------------------------------ */

void kt_softcap_row(float *s, int n, float cap) {
    const float inv = 1.0f / cap;
    for (int i = 0; i < n; i++) s[i] = cap * tanhf(s[i] * inv);
}

/* Element d of a K or V row: F32, F16, or Q8_0 (scale * level, the
 * product in float). */
static float kv_elem(const kt_attn_args *a, const char *row, int d) {
    switch (a->kv_type) {
    case KT_F16: return kt_fp16_to_fp32(((const uint16_t *)row)[d]);
    case KT_Q8_0: {
        const block_q8_0 *b = (const block_q8_0 *)row + d / QK8_0;
        return kt_fp16_to_fp32(b->d) * (float)b->qs[d % QK8_0];
    }
    default: return ((const float *)row)[d];
    }
}

/* (q . (head kvh of position p's K row), summed in element order) *
 * scale, then capped where the model caps scores. */
static float score_ref(const kt_attn_args *a, const float *q, int t, int kvh, int p, float scale) {
    const char *row = kt_attn_row(a, a->k, t, p);
    float s = 0.0f;
    for (int i = 0; i < a->head_dim; i++) s += q[i] * kv_elem(a, row, kvh * a->head_dim + i);
    s *= scale;
    if (a->softcap > 0) kt_softcap_row(&s, 1, a->softcap);
    return s;
}

/* One (token, head), the specification: scores s_p = (q . k_p) * scale,
 * each dot summed in element order; e_p = exp(s_p - max); their sum in
 * double (then a sink's exp, where the head has one); o = (sum_p e_p *
 * v_p, in position order) * (float)(1 / sum).
 * Three passes over the positions (the scores are recomputed), nothing
 * stored. Every sum runs in a fixed order that does not depend on the
 * batch, and this order reproduces llama.cpp's logits where others flip a
 * rounding (tests/test_golden.c). */
static void attention_head_ref(const kt_attn_args *a, int t, int h) {
    const int hd = a->head_dim;
    const int kvh = (int)((long)h * a->n_head_kv / a->n_head); /* = h / group */
    const float *q = a->q + (size_t)t * a->q_stride + (size_t)h * hd;
    float *o = a->out + (size_t)t * a->out_stride + (size_t)h * hd;
    const int n_pos = kt_attn_n_pos(a, t);
    const float scale = 1.0f / sqrtf((float)hd);

    float max = -INFINITY;
    for (int p = 0; p < n_pos; p++) {
        float s = score_ref(a, q, t, kvh, p, scale);
        max = s > max ? s : max;
    }
    if (a->sinks) max = a->sinks[h] > max ? a->sinks[h] : max;
    double sum = 0.0;
    for (int p = 0; p < n_pos; p++) sum += (double)expf(score_ref(a, q, t, kvh, p, scale) - max);
    if (a->sinks) sum += (double)expf(a->sinks[h] - max); /* llama.cpp's order: after the positions */
    for (int d = 0; d < hd; d++) o[d] = 0.0f;
    for (int p = 0; p < n_pos; p++) {
        const float e = expf(score_ref(a, q, t, kvh, p, scale) - max);
        const char *vrow = kt_attn_row(a, a->v, t, p);
        for (int d = 0; d < hd; d++) o[d] += e * kv_elem(a, vrow, kvh * hd + d);
    }
    const float inv = (float)(1.0 / sum);
    for (int d = 0; d < hd; d++) o[d] *= inv;
}

static bool attn_args_ok(const kt_attn_args *a) {
    return a->n_tokens > 0 && a->n_head > 0 && a->n_head_kv > 0 && a->head_dim > 0 &&
           a->pos0 >= 0 && a->n_head % a->n_head_kv == 0 && a->window >= 0 && !(a->softcap < 0) &&
           (!a->blocks || a->block_tokens > 0) && (!a->blocks || a->kv_type == KT_F32 ||
           a->kv_type == KT_F16 || (a->kv_type == KT_Q8_0 && a->head_dim % QK8_0 == 0)) &&
           (a->blocks || a->kv_type == KT_F32);
}

void kt_attention_ref(const kt_attn_args *a) {
    if (!attn_args_ok(a)) return;
    for (int t = 0; t < a->n_tokens; t++)
        for (int h = 0; h < a->n_head; h++) attention_head_ref(a, t, h);
}

/* A unit of attention work: query tokens [t0, t0 + nt) (nt > 1: a block
 * of one sequence for kt_attention_block_avx512) and heads [h0, h1) of one
 * KV group. */
typedef struct attn_unit {
    int t0, nt, h0, h1;
} attn_unit;

typedef struct attn_job {
    const kt_attn_args *a;
    bool simd;
    int block_tokens;  /* the block kernel's width (8, 16), or 0: none */
    int heads_lanes;   /* single tokens: the heads kernel's widest (8, 16), or 0: none */
    attn_unit *units;
    long n_units;
    float *scratch;    /* per thread: per_thread floats */
    size_t per_thread;
    size_t row;        /* kt_attention_group_avx2's score row length */
    atomic_long taken; /* units claimed so far */
} attn_job;

/* One token's heads [h0, h1) of a KV group in the lanes of the block
 * kernel: 16 lanes where there are more than 8 heads, else 8. */
static void attention_heads(const attn_job *j, int t, int h0, int h1, float *scratch) {
    if (h1 - h0 > 8 && j->heads_lanes == 16) {
        kt_attention_heads_avx512(j->a, t, h0, h1 - h0, scratch);
        return;
    }
    for (; h0 < h1; h0 += 8) kt_attention_heads_avx2(j->a, t, h0, h1 - h0 < 8 ? h1 - h0 : 8, scratch);
}

/* The next of n_units units for the calling thread, or -1. Threads
 * claim units one at a time, so a thread slowed by the host or by a
 * longer unit leaves the rest to the others; a unit's result is the same
 * whichever thread runs it. */
static long claim_unit(atomic_long *taken, long n_units) {
    const long u = atomic_fetch_add_explicit(taken, 1, memory_order_relaxed);
    return u < n_units ? u : -1;
}

/* Units are claimed last first: the longest rows (later tokens attend
 * more positions) go before the short ones fill the gaps. */
static void attn_task(void *ctx, int ith, int nth) {
    attn_job *j = ctx;
    (void)nth;
    float *scratch = j->scratch ? j->scratch + (size_t)ith * j->per_thread : NULL;
    for (long k; (k = claim_unit(&j->taken, j->n_units)) >= 0;) {
        const attn_unit *w = &j->units[j->n_units - 1 - k];
        if (!j->simd)
            for (int h = w->h0; h < w->h1; h++) attention_head_ref(j->a, w->t0, h);
        else if (w->nt > 1 && j->block_tokens == 16)
            kt_attention_block_avx512(j->a, w->t0, w->nt, w->h0, w->h1 - w->h0, scratch);
        else if (w->nt > 1)
            kt_attention_block_avx2(j->a, w->t0, w->nt, w->h0, w->h1 - w->h0, scratch);
        else if (j->heads_lanes && w->h1 - w->h0 >= ATTN_HEADS_MIN)
            attention_heads(j, w->t0, w->h0, w->h1, scratch);
        else
            kt_attention_group_avx2(j->a, w->t0, w->h0, w->h1, scratch, j->row);
    }
}

/* Tokens from t that share t's KV rows (contiguous cache, or the same
 * block table), at most w. */
static int run_length(const kt_attn_args *a, int t, int w) {
    int n = 1;
    while (n < w && t + n < a->n_tokens && (!a->blocks || a->blocks[t + n] == a->blocks[t])) n++;
    return n;
}

/* The units: per run of tokens (blocks of a sequence's prefill where the
 * AVX-512 block kernel applies, else single tokens) and KV group, the
 * group's heads in batches -- more batches when there are too few units
 * to keep every thread busy (decode with few KV heads), never more than
 * ATTN_MAX_GROUP heads a batch. NULL if out of memory. */
static int unit_tokens(const kt_attn_args *a, int t, int w) {
    const int n = w ? run_length(a, t, w) : 1;
    return n >= 4 ? n : 1; /* shorter runs: a block would be mostly empty lanes */
}

static attn_unit *plan_units(const kt_attn_args *a, int w, int nth, long *n_units) {
    const int group = a->n_head / a->n_head_kv;
    long runs = 0;
    for (int t = 0; t < a->n_tokens; runs++) t += unit_tokens(a, t, w);
    const long pairs = runs * a->n_head_kv;
    int n_sub = pairs >= 2L * nth ? 1 : (int)((2L * nth + pairs - 1) / pairs);
    if (n_sub > group) n_sub = group;
    int per_unit = (group + n_sub - 1) / n_sub;
    if (per_unit > ATTN_MAX_GROUP) per_unit = ATTN_MAX_GROUP;
    n_sub = (group + per_unit - 1) / per_unit;
    attn_unit *u = malloc(sizeof *u * (size_t)(pairs * n_sub));
    if (!u) return NULL;
    long n = 0;
    for (int t = 0; t < a->n_tokens;) {
        const int nt = unit_tokens(a, t, w);
        for (int g = 0; g < a->n_head_kv; g++)
            for (int s = 0; s < n_sub; s++) {
                const int h0 = g * group + s * per_unit, h1 = h0 + per_unit < (g + 1) * group ? h0 + per_unit : (g + 1) * group;
                u[n++] = (attn_unit){t, nt, h0, h1};
            }
        t += nt;
    }
    *n_units = n;
    return u;
}

/* ---- decode at long contexts ------------------------------------------ */

#define DECODE_CHUNK 256   /* positions per scores unit */
#ifndef DECODE_MIN_POS
#define DECODE_MIN_POS 512 /* shorter: the (token, group) units cost less */
#endif

typedef struct decode_job {
    const kt_attn_args *a;
    float *S, *inv;  /* n_head rows of s_row scores (then exps); n_head inverse sums */
    size_t s_row;
    float *scratch;  /* per thread: per_thread floats */
    size_t per_thread;
    int n_pos, n_chunks;
    atomic_long taken[3]; /* per pass: units claimed so far */
} decode_job;

static float *decode_scratch(const decode_job *j, int ith) {
    return j->scratch + (size_t)ith * j->per_thread;
}

static void decode_scores_task(void *ctx, int ith, int nth) {
    decode_job *j = ctx;
    (void)nth;
    for (long u; (u = claim_unit(&j->taken[0], j->n_chunks)) >= 0;) {
        const int p0 = (int)u * DECODE_CHUNK, p1 = p0 + DECODE_CHUNK < j->n_pos ? p0 + DECODE_CHUNK : j->n_pos;
        kt_attn_decode_scores_avx2(j->a, p0, p1, j->S, j->s_row, decode_scratch(j, ith));
    }
}

/* Heads in units of up to 8, one unit per thread where that is enough:
 * a unit runs its heads' sums side by side (each is a chain of adds). */
static void decode_softmax_task(void *ctx, int ith, int nth) {
    decode_job *j = ctx;
    (void)ith;
    const int n_head = j->a->n_head;
    int per = (n_head + nth - 1) / nth;
    per = per > 8 ? 8 : per;
    for (long u; (u = claim_unit(&j->taken[1], (n_head + per - 1) / per)) >= 0;) {
        const int h0 = (int)u * per;
        kt_attn_decode_softmax_avx2(j->S, j->s_row, h0, n_head - h0 < per ? n_head - h0 : per, j->n_pos,
                                    j->a->sinks, j->inv);
    }
}

static void decode_values_task(void *ctx, int ith, int nth) {
    decode_job *j = ctx;
    (void)nth;
    const int slices = j->a->head_dim / 32;
    for (long u; (u = claim_unit(&j->taken[2], (long)j->a->n_head_kv * slices)) >= 0;)
        kt_attn_decode_values_avx2(j->a, (int)(u / slices), (int)(u % slices) * 32, j->S, j->s_row, j->inv,
                                   decode_scratch(j, ith));
}

/* One token over a long context: the three passes, when the scratch can
 * be had; false leaves the work to the (token, group) units. */
static bool attention_decode(kt_pool *pool, const kt_attn_args *a) {
    const int n_pos = kt_attn_n_pos(a, 0), nth = kt_pool_size(pool);
    /* groups of ATTN_HEADS_MIN heads or more: the heads kernel does better */
    if (a->n_tokens != 1 || n_pos < DECODE_MIN_POS || a->head_dim % 32 != 0 || !kt_cpu_has_avx2() || a->softcap > 0 ||
        a->n_head / a->n_head_kv >= ATTN_HEADS_MIN)
        return false;
    decode_job j = {.a = a, .n_pos = n_pos, .s_row = ((size_t)n_pos + 15) / 16 * 16,
                    .n_chunks = (n_pos + DECODE_CHUNK - 1) / DECODE_CHUNK,
                    .per_thread = (kt_attn_decode_thread_floats(n_pos) + 15) / 16 * 16};
    for (int pass = 0; pass < 3; pass++) atomic_init(&j.taken[pass], 0);
    const size_t shared = (size_t)a->n_head * j.s_row + ((size_t)a->n_head + 15) / 16 * 16;
    void *owned = NULL;
    const size_t bytes = sizeof(float) * (shared + (size_t)nth * j.per_thread) + 64;
    void *buf = pool ? kt_pool_scratch(pool, bytes) : (owned = malloc(bytes));
    if (!buf) return false;
    j.S = (float *)(((uintptr_t)buf + 63) & ~(uintptr_t)63);
    j.inv = j.S + (size_t)a->n_head * j.s_row;
    j.scratch = j.S + shared;
    kt_pool_run(pool, decode_scores_task, &j);
    kt_pool_run(pool, decode_softmax_task, &j);
    kt_pool_run(pool, decode_values_task, &j);
    free(owned);
    return true;
}

void kt_attention(kt_pool *pool, const kt_attn_args *a) {
    if (!attn_args_ok(a)) return;
    if (attention_decode(pool, a)) return;
    const int nth = kt_pool_size(pool), group = a->n_head / a->n_head_kv;
    const int per_unit_max = group < ATTN_MAX_GROUP ? group : ATTN_MAX_GROUP;
    /* scores of the longest row, rounded to whole cache lines */
    int longest = 0;
    for (int t = 0; t < a->n_tokens; t++)
        longest = kt_attn_n_pos(a, t) > longest ? kt_attn_n_pos(a, t) : longest;
    attn_job j = {.a = a, .simd = kt_cpu_has_avx2(), .row = ((size_t)longest + 15) / 16 * 16};
    atomic_init(&j.taken, 0);
    /* prefill: blocks of 16 (AVX-512) or 8 (AVX2) query tokens */
    const int w = !j.simd || a->n_tokens < 4 || a->head_dim > 256 ? 0
                  : kt_cpu_has_avx512_vnni() && a->head_dim % 16 == 0 ? 16
                  : a->head_dim % 8 == 0 ? 8 : 0;
    j.block_tokens = w;
    j.heads_lanes = !j.simd || a->head_dim % 8 != 0 || a->head_dim > 256 ? 0 : kt_cpu_has_avx512_vnni() && a->head_dim % 16 == 0 ? 16 : 8;
    j.units = plan_units(a, w, nth, &j.n_units);
    j.per_thread = j.row * ((size_t)per_unit_max + 2 * sizeof(char *) / sizeof(float));
    /* under a window a block's view spans its first token's window and
     * the w - 1 tokens after it */
    const size_t b = w ? kt_attention_block_floats(a->head_dim, per_unit_max, longest + (a->window > 0 ? w : 0))
                     : j.heads_lanes ? kt_attention_block_floats(a->head_dim, 1, longest) : 0;
    j.per_thread = b > j.per_thread ? b : j.per_thread;
    void *owned = NULL;
    if (j.simd) {
        size_t bytes = j.per_thread * (size_t)nth * sizeof(float);
        j.scratch = pool ? kt_pool_scratch(pool, bytes) : (owned = malloc(bytes));
    }
    if (!j.units || (j.simd && !j.scratch)) { /* out of memory: the reference, slowly */
        free(j.units);
        free(owned);
        kt_attention_ref(a);
        return;
    }
    kt_pool_run(pool, attn_task, &j);
    free(j.units);
    free(owned);
}
