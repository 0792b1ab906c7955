/*
 * ops_avx2.c - AVX2/FMA versions of the kernels in ops.c (which holds
 * their scalar references). Compiled with -mavx2 -mfma -mf16c, called only
 * when kt_cpu_has_avx2().
 *
 * exp: exp256() is Cephes' expf (range reduction x = n ln2 + r with a
 * two-part ln2, a degree-6 polynomial for e^r on |r| <= ln2/2) in 8 lanes;
 * it stays within ~2 ulp of expf on the range where the result is a
 * normal float, overflows to +inf above ~88.72 and flushes towards 0 below
 * ~-104 (the tests check this).
 *
 * attention: one pass over the positions with an online softmax (running
 * max m, running sum l, output accumulated unnormalized and rescaled by
 * e^(m_old - m_new) when the max grows), ATTN_CHUNK positions at a time so
 * the rescale and the exps are vectorized. Nothing n x n is stored; the
 * only buffer is ATTN_CHUNK scores on the stack. The heads that share a KV
 * head (grouped-query attention) walk the positions together, chunk by
 * chunk, so K and V are read from memory once per group, not per head.
 */
#include <immintrin.h>
#include <math.h>

#include "ops/internal.h"

#define INL static inline __attribute__((always_inline))

#define ATTN_CHUNK 32

INL float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INL float hmax8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* e^x in 8 lanes (see the top comment). */
INL __m256 exp256(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-104.0f)), _mm256_set1_ps(88.8f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    /* times 2^n as 2^(n/2) * 2^(n - n/2): each factor is a normal float
     * for n in [-150, 129] */
    const __m256i ni = _mm256_cvtps_epi32(n);
    const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

/* Loads the first n (< 8) floats, the rest of the lanes `fill`. */
INL __m256 load_partial(const float *p, int n, float fill) {
    float buf[8];
    for (int i = 0; i < 8; i++) buf[i] = i < n ? p[i] : fill;
    return _mm256_loadu_ps(buf);
}

INL void store_partial(float *p, __m256 v, int n) {
    float buf[8];
    _mm256_storeu_ps(buf, v);
    for (int i = 0; i < n; i++) p[i] = buf[i];
}

/* ---- rmsnorm -------------------------------------------------------- */

void kt_rmsnorm_avx2(float *out, const float *x, const float *w, int n, float eps) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
        __m256 v2 = _mm256_loadu_ps(x + i + 16), v3 = _mm256_loadu_ps(x + i + 24);
        a0 = _mm256_fmadd_ps(v0, v0, a0);
        a1 = _mm256_fmadd_ps(v1, v1, a1);
        a2 = _mm256_fmadd_ps(v2, v2, a2);
        a3 = _mm256_fmadd_ps(v3, v3, a3);
    }
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        a0 = _mm256_fmadd_ps(v, v, a0);
    }
    if (i < n) {
        __m256 v = load_partial(x + i, n - i, 0.0f);
        a1 = _mm256_fmadd_ps(v, v, a1);
    }
    const float ss = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    const float scale = 1.0f / sqrtf(ss / (float)n + eps);
    const __m256 vs = _mm256_set1_ps(scale);
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), vs);
        _mm256_storeu_ps(out + i, _mm256_mul_ps(v, _mm256_loadu_ps(w + i)));
    }
    for (; i < n; i++) out[i] = (x[i] * scale) * w[i];
}

/* x[i] = exp(x[i] - max) in place for i < n; returns their sum. The tail
 * is loaded with -inf padding, whose lanes give exp = 0. */
static float exp_sub_sum(float *x, int n, float max) {
    const __m256 vm = _mm256_set1_ps(max);
    __m256 vsum = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
        _mm256_storeu_ps(x + i, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    if (i < n) {
        __m256 e = exp256(_mm256_sub_ps(load_partial(x + i, n - i, -INFINITY), vm));
        store_partial(x + i, e, n - i);
        vsum = _mm256_add_ps(vsum, e);
    }
    return hsum8(vsum);
}

/* ---- softmax -------------------------------------------------------- */

void kt_softmax_avx2(float *x, int n) {
    if (n <= 0) return;
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 8 <= n; i += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(x + i));
    float max = hmax8(vmax);
    for (; i < n; i++) max = x[i] > max ? x[i] : max;

    const __m256 inv = _mm256_set1_ps(1.0f / exp_sub_sum(x, n, max));
    for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
    for (; i < n; i++) x[i] *= _mm256_cvtss_f32(inv);
}

/* ---- swiglu --------------------------------------------------------- */

INL __m256 swiglu8(__m256 g, __m256 u) {
    const __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), g));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

void kt_swiglu_avx2(float *out, const float *gate, const float *up, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, swiglu8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
    if (i < n)
        store_partial(out + i, swiglu8(load_partial(gate + i, n - i, 0.0f),
                                       load_partial(up + i, n - i, 0.0f)), n - i);
}

/* ---- attention ------------------------------------------------------ */

/* The 8 sums of 8 vectors, as one vector: lane i = sum of a[i]'s lanes
 * (a tree of horizontal adds; the same order for every lane). */
INL __m256 reduce8(const __m256 *a) {
    const __m256 h0123 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    const __m256 h4567 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(h0123, h4567, 0x20),
                         _mm256_permute2f128_ps(h0123, h4567, 0x31));
}

/* s[0..8) = q . rows[j] (8 independent FMA chains), reduced with the
 * head_dim % 8 tail added in order. */
INL void dot8(const float *q, const float *const *rows, int n, float *s) {
    __m256 acc[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 qv = _mm256_loadu_ps(q + i);
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) acc[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rows[j] + i), acc[j]);
    }
    _mm256_storeu_ps(s, reduce8(acc));
    for (; i < n; i++)
        for (int j = 0; j < 8; j++) s[j] = fmaf(q[i], rows[j][i], s[j]);
}

/* scores s[0..n) = q . k_p * scale for positions p0 .. p0+n-1, 8 at a
 * time; a last partial group repeats its last row in the missing lanes
 * (s has room for a multiple of 8). */
static void attn_scores(const float *q, const float *k, size_t stride, int hd, int p0, int n,
                        float scale, float *s) {
    for (int i = 0; i < n; i += 8) {
        const float *rows[8];
        for (int j = 0; j < 8; j++)
            rows[j] = k + (size_t)(p0 + (i + j < n ? i + j : n - 1)) * stride;
        dot8(q, rows, hd, s + i);
    }
    for (int i = 0; i < n; i++) s[i] *= scale;
}

/* o[0..hd) = o * corr + sum_i e[i] * v_{p0+i}: 64 columns at a time (8
 * accumulators, so the FMA chains over positions overlap), then 8, then
 * one. */
static void attn_accumulate(float *o, const float *v, size_t stride, int hd, int p0, int n,
                            const float *e, float corr) {
    const __m256 vc = _mm256_set1_ps(corr);
    int d = 0;
    for (; d + 64 <= hd; d += 64) {
        __m256 acc[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) acc[j] = _mm256_mul_ps(_mm256_loadu_ps(o + d + 8 * j), vc);
        for (int i = 0; i < n; i++) {
            const float *vp = v + (size_t)(p0 + i) * stride + d;
            const __m256 ev = _mm256_set1_ps(e[i]);
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) acc[j] = _mm256_fmadd_ps(ev, _mm256_loadu_ps(vp + 8 * j), acc[j]);
        }
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) _mm256_storeu_ps(o + d + 8 * j, acc[j]);
    }
    for (; d + 8 <= hd; d += 8) {
        __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(o + d), vc);
        for (int i = 0; i < n; i++)
            a0 = _mm256_fmadd_ps(_mm256_set1_ps(e[i]),
                                 _mm256_loadu_ps(v + (size_t)(p0 + i) * stride + d), a0);
        _mm256_storeu_ps(o + d, a0);
    }
    for (; d < hd; d++) {
        float a = o[d] * corr;
        for (int i = 0; i < n; i++) a = fmaf(e[i], v[(size_t)(p0 + i) * stride + d], a);
        o[d] = a;
    }
}

/* The running state of one head's online softmax. */
typedef struct head_state {
    const float *q;
    float *o;
    float m, l; /* running max and sum of exp(s - m) */
} head_state;

/* One chunk of positions [p0, p0+n) for one head: scores, new max,
 * rescale, exps, accumulate. */
static void attn_chunk(head_state *hs, const float *k, const float *v, size_t stride, int hd,
                       int p0, int n, float scale) {
    float s[ATTN_CHUNK];
    attn_scores(hs->q, k, stride, hd, p0, n, scale, s);
    float cmax = s[0];
    for (int i = 1; i < n; i++) cmax = s[i] > cmax ? s[i] : cmax;
    const float m_new = cmax > hs->m ? cmax : hs->m;
    const float corr = expf(hs->m - m_new); /* 0 on the first chunk */

    hs->l = hs->l * corr + exp_sub_sum(s, n, m_new);
    attn_accumulate(hs->o, v, stride, hd, p0, n, s, corr);
    hs->m = m_new;
}

#define ATTN_MAX_HEADS 16 /* heads of one group done together */

/* Query token t, heads [h0, h1) (all reading the same KV head, at most
 * ATTN_MAX_HEADS): the positions go by in chunks, and each chunk is used
 * by every head while its K and V rows are in L1. Each head's own
 * operations are the same whatever h0 and h1. */
void kt_attention_heads_avx2(const kt_attn_args *a, int t, int h0, int h1) {
    const int hd = a->head_dim;
    const int kvh = (int)((long)h0 * a->n_head_kv / a->n_head);
    const float *k = a->k + (size_t)kvh * hd;
    const float *v = a->v + (size_t)kvh * hd;
    const int n_pos = a->pos0 + t + 1;
    const float scale = 1.0f / sqrtf((float)hd);
    head_state hs[ATTN_MAX_HEADS];
    const int nh = h1 - h0;
    for (int j = 0; j < nh; j++) {
        hs[j].q = a->q + (size_t)t * a->q_stride + (size_t)(h0 + j) * hd;
        hs[j].o = a->out + (size_t)t * a->out_stride + (size_t)(h0 + j) * hd;
        hs[j].m = -INFINITY;
        hs[j].l = 0.0f;
        for (int d = 0; d < hd; d++) hs[j].o[d] = 0.0f;
    }
    for (int p0 = 0; p0 < n_pos; p0 += ATTN_CHUNK) {
        const int n = n_pos - p0 < ATTN_CHUNK ? n_pos - p0 : ATTN_CHUNK;
        for (int j = 0; j < nh; j++) attn_chunk(&hs[j], k, v, a->kv_stride, hd, p0, n, scale);
    }
    for (int j = 0; j < nh; j++) {
        const float inv = 1.0f / hs[j].l;
        for (int d = 0; d < hd; d++) hs[j].o[d] *= inv;
    }
}
