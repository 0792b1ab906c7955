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
 *     three passes (max, sum, weighted sum) with nothing stored; the fast
 *     path is the one-pass online softmax in ops_avx2.c.
 *
 * Every kernel works on whole rows of one token, so a token's results do
 * not depend on the batch it is in.
 */
#include "ops/ops.h"

#include <math.h>
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

/* ---- rope ----------------------------------------------------------- */

#define ROPE_CHUNK 64 /* pairs whose cos/sin are computed at a time */

void kt_rope(float *x, int n_heads, int head_dim, int rope_dim, int pos, float freq_base,
             kt_rope_style style) {
    if (rope_dim > head_dim) rope_dim = head_dim;
    rope_dim &= ~1;
    const int n_pairs = rope_dim / 2;
    const float theta_scale = powf(freq_base, -2.0f / (float)rope_dim);
    float theta = (float)pos;
    float cs[ROPE_CHUNK], sn[ROPE_CHUNK];

    for (int c0 = 0; c0 < n_pairs; c0 += ROPE_CHUNK) {
        const int nc = n_pairs - c0 < ROPE_CHUNK ? n_pairs - c0 : ROPE_CHUNK;
        for (int i = 0; i < nc; i++) {
            cs[i] = cosf(theta);
            sn[i] = sinf(theta);
            theta *= theta_scale;
        }
        for (int h = 0; h < n_heads; h++) {
            float *xh = x + (size_t)h * head_dim;
            for (int i = 0; i < nc; i++) {
                /* the pair's two elements: adjacent, or half a rope_dim apart */
                const int pi = c0 + i;
                float *a = style == KT_ROPE_NEOX ? xh + pi : xh + 2 * pi;
                float *b = style == KT_ROPE_NEOX ? xh + pi + n_pairs : xh + 2 * pi + 1;
                const float x0 = *a, x1 = *b;
                *a = x0 * cs[i] - x1 * sn[i];
                *b = x0 * sn[i] + x1 * cs[i];
            }
        }
    }
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

void kt_swiglu(float *out, const float *gate, const float *up, int n) {
    if (kt_cpu_has_avx2()) kt_swiglu_avx2(out, gate, up, n);
    else kt_swiglu_ref(out, gate, up, n);
}

/* ---- attention ------------------------------------------------------ */

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

/* q . (head kvh of position p's K row), summed in element order. */
static float score_ref(const kt_attn_args *a, const float *q, int t, int kvh, int p) {
    const char *row = kt_attn_row(a, a->k, t, p);
    float s = 0.0f;
    for (int i = 0; i < a->head_dim; i++) s += q[i] * kv_elem(a, row, kvh * a->head_dim + i);
    return s;
}

/* One (token, head), the specification: scores s_p = (q . k_p) * scale,
 * each dot summed in element order; e_p = exp(s_p - max); their sum in
 * double; o = (sum_p e_p * v_p, in position order) * (float)(1 / sum).
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
        float s = score_ref(a, q, t, kvh, p) * scale;
        max = s > max ? s : max;
    }
    double sum = 0.0;
    for (int p = 0; p < n_pos; p++) sum += (double)expf(score_ref(a, q, t, kvh, p) * scale - max);
    for (int d = 0; d < hd; d++) o[d] = 0.0f;
    for (int p = 0; p < n_pos; p++) {
        const float e = expf(score_ref(a, q, t, kvh, p) * scale - max);
        const char *vrow = kt_attn_row(a, a->v, t, p);
        for (int d = 0; d < hd; d++) o[d] += e * kv_elem(a, vrow, kvh * hd + d);
    }
    const float inv = (float)(1.0 / sum);
    for (int d = 0; d < hd; d++) o[d] *= inv;
}

static bool attn_args_ok(const kt_attn_args *a) {
    return a->n_tokens > 0 && a->n_head > 0 && a->n_head_kv > 0 && a->head_dim > 0 &&
           a->pos0 >= 0 && a->n_head % a->n_head_kv == 0 &&
           (!a->blocks || a->block_tokens > 0) && (!a->blocks || a->kv_type == KT_F32 ||
           a->kv_type == KT_F16 || (a->kv_type == KT_Q8_0 && a->head_dim % QK8_0 == 0)) &&
           (a->blocks || a->kv_type == KT_F32);
}

void kt_attention_ref(const kt_attn_args *a) {
    if (!attn_args_ok(a)) return;
    for (int t = 0; t < a->n_tokens; t++)
        for (int h = 0; h < a->n_head; h++) attention_head_ref(a, t, h);
}

typedef struct attn_job {
    const kt_attn_args *a;
    bool simd;
    int per_unit;      /* heads of one KV group per unit of work */
    int n_sub;         /* units per (token, KV group) */
    float *scratch;    /* per thread: per_unit rows of `row` floats, then 2 * row
                          pointers (kt_attention_group_avx2's layout) */
    size_t per_thread; /* floats of scratch per thread */
    size_t row;
} attn_job;

/* Units are (token, KV group, head batch); thread ith takes units ith,
 * ith + nth, ...: causal rows grow with the token, so striding balances
 * the work. */
static void attn_task(void *ctx, int ith, int nth) {
    const attn_job *j = ctx;
    const kt_attn_args *a = j->a;
    const int group = a->n_head / a->n_head_kv;
    const long per_token = (long)a->n_head_kv * j->n_sub;
    float *scratch = j->scratch ? j->scratch + (size_t)ith * j->per_thread : NULL;
    for (long u = ith; u < (long)a->n_tokens * per_token; u += nth) {
        const int t = (int)(u / per_token);
        const long gs = u % per_token; /* group * n_sub + sub */
        const int g_start = (int)(gs / j->n_sub) * group;
        const int h0 = g_start + (int)(gs % j->n_sub) * j->per_unit;
        const int h1 = h0 + j->per_unit < g_start + group ? h0 + j->per_unit : g_start + group;
        if (j->simd) kt_attention_group_avx2(a, t, h0, h1, scratch, j->row);
        else for (int h = h0; h < h1; h++) attention_head_ref(a, t, h);
    }
}

void kt_attention(kt_pool *pool, const kt_attn_args *a) {
    if (!attn_args_ok(a)) return;
    /* Split each group's heads into batches when there are too few
     * (token, group) pairs to keep every thread busy (decode with few KV
     * heads), never more than ATTN_MAX_GROUP heads a batch. */
    const int group = a->n_head / a->n_head_kv, nth = kt_pool_size(pool);
    const long pairs = (long)a->n_tokens * a->n_head_kv;
    int n_sub = pairs >= 2L * nth ? 1 : (int)((2L * nth + pairs - 1) / pairs);
    if (n_sub > group) n_sub = group;
    int per_unit = (group + n_sub - 1) / n_sub;
    if (per_unit > ATTN_MAX_GROUP) per_unit = ATTN_MAX_GROUP;
    n_sub = (group + per_unit - 1) / per_unit;
    /* scores of the longest row, rounded to whole cache lines */
    int longest = 0;
    for (int t = 0; t < a->n_tokens; t++)
        longest = kt_attn_n_pos(a, t) > longest ? kt_attn_n_pos(a, t) : longest;
    size_t row = ((size_t)longest + 15) / 16 * 16;
    attn_job j = {a, kt_cpu_has_avx2(), per_unit, n_sub, NULL, 0, row};
    j.per_thread = row * ((size_t)per_unit + 2 * sizeof(char *) / sizeof(float));
    void *owned = NULL;
    if (j.simd) {
        size_t bytes = j.per_thread * (size_t)nth * sizeof(float);
        j.scratch = pool ? kt_pool_scratch(pool, bytes) : (owned = malloc(bytes));
        if (!j.scratch) j.simd = false; /* out of memory: the reference, slowly */
    }
    kt_pool_run(pool, attn_task, &j);
    free(owned);
}
