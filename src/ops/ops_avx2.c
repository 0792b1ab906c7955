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
 * only buffer is ATTN_CHUNK scores on the stack.
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

/* ---- softmax -------------------------------------------------------- */

void kt_softmax_avx2(float *x, int n) {
    if (n <= 0) return;
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 8 <= n; i += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(x + i));
    float max = hmax8(vmax);
    for (; i < n; i++) max = x[i] > max ? x[i] : max;

    const __m256 vm = _mm256_set1_ps(max);
    __m256 vsum = _mm256_setzero_ps();
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
        _mm256_storeu_ps(x + i, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    if (i < n) {
        __m256 e = exp256(_mm256_sub_ps(load_partial(x + i, n - i, -INFINITY), vm));
        store_partial(x + i, e, n - i);
        vsum = _mm256_add_ps(vsum, e); /* the -inf lanes gave 0 */
    }
    const __m256 inv = _mm256_set1_ps(1.0f / hsum8(vsum));
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

/* Dot products of q with 4 rows k0..k3 at once (4 independent chains). */
INL void dot4(const float *q, const float *k0, const float *k1, const float *k2,
              const float *k3, int n, float *s) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 qv = _mm256_loadu_ps(q + i);
        a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + i), a0);
        a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + i), a1);
        a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + i), a2);
        a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + i), a3);
    }
    s[0] = hsum8(a0);
    s[1] = hsum8(a1);
    s[2] = hsum8(a2);
    s[3] = hsum8(a3);
    for (; i < n; i++) {
        s[0] = fmaf(q[i], k0[i], s[0]);
        s[1] = fmaf(q[i], k1[i], s[1]);
        s[2] = fmaf(q[i], k2[i], s[2]);
        s[3] = fmaf(q[i], k3[i], s[3]);
    }
}

/* scores s[0..n) = q . k_p * scale for positions p0 .. p0+n-1 */
static void attn_scores(const float *q, const float *k, size_t stride, int hd, int p0, int n,
                        float scale, float *s) {
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const float *kp = k + (size_t)(p0 + i) * stride;
        dot4(q, kp, kp + stride, kp + 2 * stride, kp + 3 * stride, hd, s + i);
    }
    for (; i < n; i++) { /* the last 1..3: repeat the row, keep one result */
        const float *kp = k + (size_t)(p0 + i) * stride;
        float tmp[4];
        dot4(q, kp, kp, kp, kp, hd, tmp);
        s[i] = tmp[0];
    }
    for (i = 0; i < n; i++) s[i] *= scale;
}

/* o[0..hd) = o * corr + sum_i e[i] * v_{p0+i} */
static void attn_accumulate(float *o, const float *v, size_t stride, int hd, int p0, int n,
                            const float *e, float corr) {
    const __m256 vc = _mm256_set1_ps(corr);
    int d = 0;
    for (; d + 16 <= hd; d += 16) {
        __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(o + d), vc);
        __m256 a1 = _mm256_mul_ps(_mm256_loadu_ps(o + d + 8), vc);
        for (int i = 0; i < n; i++) {
            const float *vp = v + (size_t)(p0 + i) * stride + d;
            const __m256 ev = _mm256_set1_ps(e[i]);
            a0 = _mm256_fmadd_ps(ev, _mm256_loadu_ps(vp), a0);
            a1 = _mm256_fmadd_ps(ev, _mm256_loadu_ps(vp + 8), a1);
        }
        _mm256_storeu_ps(o + d, a0);
        _mm256_storeu_ps(o + d + 8, a1);
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

void kt_attention_head_avx2(const kt_attn_args *a, int t, int h) {
    const int hd = a->head_dim;
    const int kvh = (int)((long)h * a->n_head_kv / a->n_head);
    const float *q = a->q + (size_t)t * a->q_stride + (size_t)h * hd;
    const float *k = a->k + (size_t)kvh * hd;
    const float *v = a->v + (size_t)kvh * hd;
    float *o = a->out + (size_t)t * a->out_stride + (size_t)h * hd;
    const int n_pos = a->pos0 + t + 1;
    const float scale = 1.0f / sqrtf((float)hd);

    float m = -INFINITY, l = 0.0f;
    for (int d = 0; d < hd; d++) o[d] = 0.0f;
    for (int p0 = 0; p0 < n_pos; p0 += ATTN_CHUNK) {
        const int n = n_pos - p0 < ATTN_CHUNK ? n_pos - p0 : ATTN_CHUNK;
        float s[ATTN_CHUNK];
        attn_scores(q, k, a->kv_stride, hd, p0, n, scale, s);
        float cmax = s[0];
        for (int i = 1; i < n; i++) cmax = s[i] > cmax ? s[i] : cmax;
        const float m_new = cmax > m ? cmax : m;
        const float corr = expf(m - m_new); /* 0 on the first chunk */

        /* e = exp(s - m_new), 8 at a time; padding lanes are exp(-inf) = 0 */
        const __m256 vm = _mm256_set1_ps(m_new);
        __m256 vsum = _mm256_setzero_ps();
        int i = 0;
        for (; i + 8 <= n; i += 8) {
            __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + i), vm));
            _mm256_storeu_ps(s + i, e);
            vsum = _mm256_add_ps(vsum, e);
        }
        if (i < n) {
            __m256 e = exp256(_mm256_sub_ps(load_partial(s + i, n - i, -INFINITY), vm));
            store_partial(s + i, e, n - i);
            vsum = _mm256_add_ps(vsum, e);
        }
        l = l * corr + hsum8(vsum);
        attn_accumulate(o, v, a->kv_stride, hd, p0, n, s, corr);
        m = m_new;
    }
    const float inv = 1.0f / l;
    for (int d = 0; d < hd; d++) o[d] *= inv;
}
