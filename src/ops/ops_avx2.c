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
 * attention: two passes per (token, head) over a row of n_pos scores in
 * per-thread scratch (nothing n x n): the scores, each dot summed in
 * element order; then the max, the exps (vector), their sum in double, and
 * V summed unnormalized in position order, scaled at the end. Each lane
 * does exactly the reference's float operations in the reference's order
 * (only exp differs, within ~2 ulp); this order is the one that matches
 * llama.cpp's logits where a different one flips a rounding (see
 * tests/test_golden.c). The heads that share a KV head are done together,
 * so each K row is loaded and transposed once per group, not per head.
 * K/V rows are F32, F16 or Q8_0, found through the token's block table
 * (paged KV); each unit first lists its rows' addresses, so the inner
 * loops do no block arithmetic, and widens F16 / Q8_0 values exactly as
 * the reference does.
 * Cost: this order chains the sums, so prefill attention is slower than
 * the online-softmax kernel it replaced (pp512 -12% on tinyllama, -21% on
 * smollm; docs/PERFORMANCE.md). Prefill goes by blocks of 8 or 16 query
 * tokens that share each K and V row read (kt_attention_block_*, at the
 * end of this file): the same bits, pp2048 1.2x (AVX2) to 1.8x faster.
 */
#include <immintrin.h>
#include <limits.h>
#include <math.h>

#include "base/fp16.h"
#include "ops/cpu.h"
#include "ops/internal.h"
#include "ops/simd_avx2.h"
#include "ops/quant.h"


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

/* ---- F16 rows -------------------------------------------------------- */

/* F16C rounds to nearest even, makes infinities of what overflows, keeps
 * subnormals and quiets NaNs keeping the payload's top bits, exactly as
 * kt_fp32_to_fp16 does (test_ops checks every case). */
void kt_fp32_to_fp16_row_avx2(const float *x, uint16_t *out, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(out + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) out[i] = kt_fp32_to_fp16(x[i]);
}

/* ---- rope ---------------------------------------------------------------
 *
 * Each pair (a, b) turns to (a c - b s, a s + b c), each product rounded
 * and then the sum, as kt_rope_turn_ref does (no fma). Adjacent pairs:
 * 4 pairs a vector, with c and s duplicated per pair and the pair's
 * elements swapped: v * (c c) + swap(v) * (-s s) gives both results (a c +
 * b (-s) is a c - b s exactly). Pairs half a rope_dim apart: 8 pairs a
 * vector, a and b from the two halves. */
void kt_rope_turn_avx2(float *x, int n_heads, int head_dim, int n_pairs, int p0, int nc, const float *cs,
                       const float *sn, kt_rope_style style) {
    const __m256 neg_even = _mm256_castsi256_ps(_mm256_setr_epi32(INT_MIN, 0, INT_MIN, 0, INT_MIN, 0, INT_MIN, 0));
    for (int h = 0; h < n_heads; h++) {
        float *xh = x + (size_t)h * head_dim;
        int i = 0;
        if (style == KT_ROPE_NEOX) {
            for (; i + 8 <= nc; i += 8) {
                float *pa = xh + p0 + i, *pb = pa + n_pairs;
                const __m256 a = _mm256_loadu_ps(pa), b = _mm256_loadu_ps(pb);
                const __m256 c = _mm256_loadu_ps(cs + i), s = _mm256_loadu_ps(sn + i);
                _mm256_storeu_ps(pa, _mm256_sub_ps(_mm256_mul_ps(a, c), _mm256_mul_ps(b, s)));
                _mm256_storeu_ps(pb, _mm256_add_ps(_mm256_mul_ps(a, s), _mm256_mul_ps(b, c)));
            }
        } else {
            for (; i + 4 <= nc; i += 4) {
                float *pv = xh + 2 * (p0 + i);
                const __m128 c4 = _mm_loadu_ps(cs + i), s4 = _mm_loadu_ps(sn + i);
                const __m256 c = _mm256_set_m128(_mm_unpackhi_ps(c4, c4), _mm_unpacklo_ps(c4, c4));
                const __m256 s = _mm256_xor_ps(_mm256_set_m128(_mm_unpackhi_ps(s4, s4), _mm_unpacklo_ps(s4, s4)), neg_even);
                const __m256 v = _mm256_loadu_ps(pv), swapped = _mm256_permute_ps(v, 0xB1);
                _mm256_storeu_ps(pv, _mm256_add_ps(_mm256_mul_ps(v, c), _mm256_mul_ps(swapped, s)));
            }
        }
        if (i < nc) kt_rope_turn_ref(xh, 1, head_dim, n_pairs, p0 + i, nc - i, cs + i, sn + i, style);
    }
}

/* ---- rmsnorm -------------------------------------------------------- */

void kt_rmsnorm_avx2(float *out, const float *x, const float *w, int n, float eps) {
    /* the reference's sum, in double and in order: n adds, cheap next to
     * the matmuls, and the scale then equals the reference's exactly */
    double ss = 0.0;
    int i;
    for (i = 0; i < n; i++) ss += (double)(x[i] * x[i]);
    const float mean = (float)(ss / n);
    const float scale = 1.0f / sqrtf(mean + eps);
    const __m256 vs = _mm256_set1_ps(scale);
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), vs);
        _mm256_storeu_ps(out + i, _mm256_mul_ps(v, _mm256_loadu_ps(w + i)));
    }
    for (; i < n; i++) out[i] = (x[i] * scale) * w[i];
}

/* ---- the gated delta rule ------------------------------------------- */

/* kt_delta_rule_run_avx2 / _avx512: delta_run_impl.h, included with the
 * attention block's vector vocabulary at the end of this file. */

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

/* ---- geglu ---------------------------------------------------------- */

/* gelu(g) * u as kt_geglu_ref: g / (1 + exp(-2c (g + 0.044715 g^3))) * u */
INL __m256 geglu8(__m256 g, __m256 u) {
    const __m256 g3 = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
    const __m256 inner = _mm256_add_ps(g, _mm256_mul_ps(_mm256_set1_ps(0.044715f), g3));
    const __m256 e = exp256(_mm256_mul_ps(_mm256_set1_ps(-2.0f * 0.7978845608f), inner));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

void kt_geglu_avx2(float *out, const float *gate, const float *up, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, geglu8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
    if (i < n)
        store_partial(out + i, geglu8(load_partial(gate + i, n - i, 0.0f), load_partial(up + i, n - i, 0.0f)), n - i);
}

/* ---- swiglu-oai (gpt-oss) ------------------------------------------- */

/* kt_swiglu_oai_ref's operations in its order, 8 at a time: min and max
 * with the limit in the operand order that keeps a NaN input, as
 * std::min / std::clamp do; only exp differs (exp256). */
INL __m256 swiglu_oai8(__m256 g, __m256 u, __m256 lim, __m256 nlim, __m256 alpha) {
    const __m256 x = _mm256_min_ps(lim, g);                      /* lim < g ? lim : g */
    const __m256 y = _mm256_max_ps(nlim, _mm256_min_ps(lim, u)); /* clamp(u, -lim, lim) */
    const __m256 e = exp256(_mm256_mul_ps(alpha, _mm256_sub_ps(_mm256_setzero_ps(), x)));
    return _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e)),
                         _mm256_add_ps(y, _mm256_set1_ps(1.0f)));
}

void kt_swiglu_oai_avx2(float *out, const float *gate, const float *up, int n, float alpha, float limit) {
    const __m256 lim = _mm256_set1_ps(limit), nlim = _mm256_set1_ps(-limit), va = _mm256_set1_ps(alpha);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, swiglu_oai8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i), lim, nlim, va));
    if (i < n)
        store_partial(out + i, swiglu_oai8(load_partial(gate + i, n - i, 0.0f), load_partial(up + i, n - i, 0.0f), lim,
                                           nlim, va), n - i);
}

/* ---- attention ------------------------------------------------------ */

/* Transposes 8 rows of 8 floats in place: r[j] lane i <-> r[i] lane j. */
INL void transpose8(__m256 *r) {
    __m256 t[8], u[8];
#pragma GCC unroll 4
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
#pragma GCC unroll 2
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

/* 8 values of a K or V row from element i (a multiple of 8): F32, F16
 * widened exactly, or Q8_0 levels times their block's scale (the same
 * float product as the reference). */
INL __m256 kv_load8(const char *row, int i, kt_dtype type) {
    if (type == KT_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + (size_t)i * 2)));
    if (type == KT_Q8_0) {
        const block_q8_0 *b = (const block_q8_0 *)row + i / QK8_0;
        const __m128i q = _mm_loadl_epi64((const __m128i *)(b->qs + i % QK8_0));
        const __m256 lv = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
        return _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(b->d)), lv);
    }
    return _mm256_loadu_ps((const float *)row + i);
}

INL float kv_elem(const char *row, int i, kt_dtype type) {
    if (type == KT_F16) return _cvtsh_ss(((const uint16_t *)row)[i]);
    if (type == KT_Q8_0) {
        const block_q8_0 *b = (const block_q8_0 *)row + i / QK8_0;
        return _cvtsh_ss(b->d) * (float)b->qs[i % QK8_0];
    }
    return ((const float *)row)[i];
}

/* How many positions ahead the attention kernels ask for K and V rows: a
 * position's rows are a few cache lines, a whole position row (every KV
 * head) apart, and one block of positions apart from the next block's,
 * where the hardware prefetcher stops. At long contexts the KV cache
 * comes from memory, and without these the kernels wait on it. */
#define KV_PREFETCH 16

INL void kv_prefetch(const char *row, int bytes) {
    for (int o = 0; o < bytes; o += 64) _mm_prefetch(row + o, _MM_HINT_T0);
    _mm_prefetch(row + bytes - 1, _MM_HINT_T0);
}

/* One query token's KV head: the address of every position's K and V row
 * (head offset included), computed once per unit of work so the inner
 * loops do no block arithmetic. */
typedef struct kv_view {
    const char **k, **v; /* [n_pos] */
    kt_dtype type;
} kv_view;

/* Positions [p0, p1) of the view (indexed by position). */
static void kv_view_range(kv_view *kv, const kt_attn_args *a, int t, int kvh, int p0, int p1) {
    const size_t head_bytes = kt_dtype_row_bytes(a->kv_type, (int64_t)kvh * a->head_dim);
    const size_t stride = a->blocks ? a->row_bytes : a->kv_stride * sizeof(float);
    const int first = kt_attn_first(a, t); /* p is counted from it (kt_attn_row) */
    /* a block (or the whole contiguous cache) at a time: one lookup each */
    for (int p = p0; p < p1;) {
        int run = a->blocks ? a->block_tokens - (first + p) % a->block_tokens : p1 - p;
        if (run > p1 - p) run = p1 - p;
        const char *k = kt_attn_row(a, a->k, t, p) + head_bytes, *v = kt_attn_row(a, a->v, t, p) + head_bytes;
        for (int i = 0; i < run; i++) {
            kv->k[p + i] = k + (size_t)i * stride;
            kv->v[p + i] = v + (size_t)i * stride;
        }
        p += run;
    }
}

static void kv_view_build(kv_view *kv, const kt_attn_args *a, int t, int kvh, int n_pos) {
    kv_view_range(kv, a, t, kvh, 0, n_pos);
}

/* Scores of 8 positions starting at p for the nh heads whose queries are
 * qs[]: lane j of head h is (q_h . k_{p+j}) * scale, each dot summed in
 * element order with a separate multiply and add (the reference's
 * arithmetic, lane by lane). Eight elements of the 8 K rows are transposed
 * once, so one vector holds element i of every row, and used by every head
 * of the group (grouped-query attention shares K). */
INL void scores8_t(const float *const *qs, int nh, const kv_view *kv, int hd, int p, float scale,
                   float *const *s, const kt_dtype type) {
    const char *const *rows = kv->k + p;
    __m256 acc[ATTN_MAX_GROUP];
    for (int h = 0; h < nh; h++) acc[h] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= hd; i += 8) {
        __m256 r[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) r[j] = kv_load8(rows[j], i, type);
        transpose8(r);
        for (int h = 0; h < nh; h++) { /* one register chain per head */
            __m256 ah = acc[h];
#pragma GCC unroll 8
            for (int e = 0; e < 8; e++) ah = _mm256_add_ps(ah, _mm256_mul_ps(_mm256_set1_ps(qs[h][i + e]), r[e]));
            acc[h] = ah;
        }
    }
    for (int h = 0; h < nh; h++) {
        float lanes[8];
        _mm256_storeu_ps(lanes, acc[h]);
        for (int j = 0; j < 8; j++) {
            for (int e = i; e < hd; e++) lanes[j] += qs[h][e] * kv_elem(rows[j], e, type);
            s[h][p + j] = lanes[j] * scale;
        }
    }
}

/* One instance per KV type, so the loads inline without a type test. */
static void scores8(const float *const *qs, int nh, const kv_view *kv, int hd, int p, float scale,
                    float *const *s) {
    if (kv->type == KT_F16) scores8_t(qs, nh, kv, hd, p, scale, s, KT_F16);
    else if (kv->type == KT_Q8_0) scores8_t(qs, nh, kv, hd, p, scale, s, KT_Q8_0);
    else scores8_t(qs, nh, kv, hd, p, scale, s, KT_F32);
}

/* s_h[p] for every head h of the group and p in [0, n_pos), from p0 on
 * (the positions before were done by scores16). */
static void attn_scores(const float *const *qs, int nh, const kv_view *kv, int hd, int p0, int n_pos,
                        float scale, float *const *s) {
    int p = p0;
    for (; p + 8 <= n_pos; p += 8) scores8(qs, nh, kv, hd, p, scale, s);
    for (; p < n_pos; p++) {
        const char *kp = kv->k[p];
        for (int h = 0; h < nh; h++) {
            float acc = 0.0f;
            for (int d = 0; d < hd; d++) acc += qs[h][d] * kv_elem(kp, d, kv->type);
            s[h][p] = acc * scale;
        }
    }
}

/* o[d] = (sum_p e[p] * v_p[d]) * inv for d in [d0, hd), summed over
 * positions in order with a separate multiply and add; 64 dims (8
 * independent vectors) at a time, then 8, then one. */
INL void attn_values_t(float *o, const kv_view *kv, int hd, int d0, int n_pos, const float *e, float inv,
                       const kt_dtype type) {
    int d = d0;
    for (; d + 64 <= hd; d += 64) {
        __m256 acc[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();
        for (int p = 0; p < n_pos; p++) {
            const char *vp = kv->v[p];
            const __m256 ep = _mm256_set1_ps(e[p]);
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++)
                acc[j] = _mm256_add_ps(acc[j], _mm256_mul_ps(ep, kv_load8(vp, d + 8 * j, type)));
        }
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) _mm256_storeu_ps(o + d + 8 * j, _mm256_mul_ps(acc[j], _mm256_set1_ps(inv)));
    }
    for (; d + 8 <= hd; d += 8) {
        __m256 acc = _mm256_setzero_ps();
        for (int p = 0; p < n_pos; p++)
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(e[p]), kv_load8(kv->v[p], d, type)));
        _mm256_storeu_ps(o + d, _mm256_mul_ps(acc, _mm256_set1_ps(inv)));
    }
    for (; d < hd; d++) {
        float acc = 0.0f;
        for (int p = 0; p < n_pos; p++) acc += e[p] * kv_elem(kv->v[p], d, type);
        o[d] = acc * inv;
    }
}

static void attn_values(float *o, const kv_view *kv, int hd, int d0, int n_pos, const float *e, float inv) {
    if (kv->type == KT_F16) attn_values_t(o, kv, hd, d0, n_pos, e, inv, KT_F16);
    else if (kv->type == KT_Q8_0) attn_values_t(o, kv, hd, d0, n_pos, e, inv, KT_Q8_0);
    else attn_values_t(o, kv, hd, d0, n_pos, e, inv, KT_F32);
}

/* ---- AVX-512 attention: the same lane arithmetic, twice as wide ------
 *
 * scores16 does scores8's operations for 16 positions (a 16 x 16
 * transpose of K values), attn_values_512 those of attn_values for 16
 * dims per vector: each lane still multiplies and adds separately in the
 * reference's order, so the results are the AVX2 kernels' bits. */

/* 16 values of a K or V row from element i (a multiple of 16). */
TARGET_512 INL __m512 kv_load16(const char *row, int i, kt_dtype type) {
    if (type == KT_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + (size_t)i * 2)));
    if (type == KT_Q8_0) {
        const block_q8_0 *b = (const block_q8_0 *)row + i / QK8_0;
        const __m512 lv = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b->qs + i % QK8_0))));
        return _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(b->d)), lv);
    }
    return _mm512_loadu_ps((const float *)row + i);
}

/* 16 x 16 transpose: r[j] lane i <-> r[i] lane j. In-lane 4 x 4
 * transposes (as transpose8), then the 128-bit lanes regrouped. */
TARGET_512 INL void transpose16(__m512 *r) {
    __m512 t[16], u[16];
#pragma GCC unroll 8
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 16; i += 4) {
        u[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xee);
        u[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    /* u[4g + m], 128-bit lane k: element 4k + m of rows 4g .. 4g+3 */
#pragma GCC unroll 4
    for (int m = 0; m < 4; m++) {
        const __m512 v0 = _mm512_shuffle_f32x4(u[m], u[4 + m], 0x88), v1 = _mm512_shuffle_f32x4(u[m], u[4 + m], 0xdd);
        const __m512 w0 = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0x88), w1 = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0xdd);
        r[m] = _mm512_shuffle_f32x4(v0, w0, 0x88);
        r[8 + m] = _mm512_shuffle_f32x4(v0, w0, 0xdd);
        r[4 + m] = _mm512_shuffle_f32x4(v1, w1, 0x88);
        r[12 + m] = _mm512_shuffle_f32x4(v1, w1, 0xdd);
    }
}

#define SCORES_PREFETCH 48 /* positions ahead */
/* scores8 for 16 positions; hd a multiple of 16. */
TARGET_512 INL void scores16_t(const float *const *qs, int nh, const kv_view *kv, size_t off, int hd, int p,
                               float scale, float *const *s, const kt_dtype type, int n_pos_pf, int row_bytes_pf) {
    const char *const *rows = kv->k + p;
    __m512 acc[ATTN_MAX_GROUP];
    for (int h = 0; h < nh; h++) acc[h] = _mm512_setzero_ps();
    if (p + SCORES_PREFETCH + 16 <= n_pos_pf) /* three steps ahead: a step is a few hundred cycles */
        for (int j = SCORES_PREFETCH; j < SCORES_PREFETCH + 16; j++) kv_prefetch(rows[j] + off, row_bytes_pf);
    for (int i = 0; i < hd; i += 16) {
        __m512 r[16];
#pragma GCC unroll 16
        for (int j = 0; j < 16; j++) r[j] = kv_load16(rows[j] + off, i, type);
        transpose16(r);
        for (int h = 0; h < nh; h++) { /* one register chain per head */
            __m512 ah = acc[h];
#pragma GCC unroll 16
            for (int e = 0; e < 16; e++) ah = _mm512_add_ps(ah, _mm512_mul_ps(_mm512_set1_ps(qs[h][i + e]), r[e]));
            acc[h] = ah;
        }
    }
    for (int h = 0; h < nh; h++) _mm512_storeu_ps(s[h] + p, _mm512_mul_ps(acc[h], _mm512_set1_ps(scale)));
}

TARGET_512 INL void scores16_type(const float *const *qs, int nh, const kv_view *kv, size_t off, int hd, int p,
                                  float scale, float *const *s, int n_pos, const kt_dtype type) {
    const int rb = (int)kt_dtype_row_bytes(type, hd);
    /* groups of 1-3 heads (where decode at long contexts spends its time
     * in these scores) with the head count a constant: their sums stay in
     * registers */
    switch (nh) {
    case 1: scores16_t(qs, 1, kv, off, hd, p, scale, s, type, n_pos, rb); break;
    case 2: scores16_t(qs, 2, kv, off, hd, p, scale, s, type, n_pos, rb); break;
    case 3: scores16_t(qs, 3, kv, off, hd, p, scale, s, type, n_pos, rb); break;
    default: scores16_t(qs, nh, kv, off, hd, p, scale, s, type, n_pos, rb); break;
    }
}

/* off: bytes from each view row to the K head read (0: the view's own;
 * the decode pass reads every group's head through group 0's view). */
TARGET_512 static void scores16(const float *const *qs, int nh, const kv_view *kv, size_t off, int hd, int p,
                                float scale, float *const *s, int n_pos) {
    if (kv->type == KT_F16) scores16_type(qs, nh, kv, off, hd, p, scale, s, n_pos, KT_F16);
    else if (kv->type == KT_Q8_0) scores16_type(qs, nh, kv, off, hd, p, scale, s, n_pos, KT_Q8_0);
    else scores16_type(qs, nh, kv, off, hd, p, scale, s, n_pos, KT_F32);
}

/* attn_values' sums for dims [0, d_end) (d_end a multiple of 64). */
TARGET_512 INL void attn_values_512_t(float *o, const kv_view *kv, int d_end, int n_pos, const float *e, float inv,
                                      const kt_dtype type) {
    for (int d = 0; d < d_end; d += 64) {
        __m512 acc[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) acc[j] = _mm512_setzero_ps();
        for (int p = 0; p < n_pos; p++) {
            const char *vp = kv->v[p];
            const __m512 ep = _mm512_set1_ps(e[p]);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++)
                acc[j] = _mm512_add_ps(acc[j], _mm512_mul_ps(ep, kv_load16(vp, d + 16 * j, type)));
        }
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) _mm512_storeu_ps(o + d + 16 * j, _mm512_mul_ps(acc[j], _mm512_set1_ps(inv)));
    }
}

TARGET_512 static void attn_values_512(float *o, const kv_view *kv, int d_end, int n_pos, const float *e, float inv) {
    if (kv->type == KT_F16) attn_values_512_t(o, kv, d_end, n_pos, e, inv, KT_F16);
    else if (kv->type == KT_Q8_0) attn_values_512_t(o, kv, d_end, n_pos, e, inv, KT_Q8_0);
    else attn_values_512_t(o, kv, d_end, n_pos, e, inv, KT_F32);
}

/* Query token t, the heads [h0, h1) of one KV group (at most
 * ATTN_MAX_GROUP), with `scratch` holding (h1 - h0) rows of n_pos floats:
 * the steps of attention_head_ref (ops.c) for each head, with the vector
 * exp. */
void kt_attention_group_avx2(const kt_attn_args *a, int t, int h0, int h1, float *scratch, size_t row) {
    const int hd = a->head_dim, nh = h1 - h0;
    const int kvh = (int)((long)h0 * a->n_head_kv / a->n_head);
    const int n_pos = kt_attn_n_pos(a, t);
    /* scratch: nh score rows, then the K and V row addresses */
    kv_view kv = {(const char **)(scratch + (size_t)nh * row), NULL, a->kv_type};
    kv.v = kv.k + row;
    kv_view_build(&kv, a, t, kvh, n_pos);
    const float *qs[ATTN_MAX_GROUP];
    float *s[ATTN_MAX_GROUP];
    for (int h = 0; h < nh; h++) {
        qs[h] = a->q + (size_t)t * a->q_stride + (size_t)(h0 + h) * hd;
        s[h] = scratch + (size_t)h * row;
    }
    const bool wide = hd % 16 == 0 && kt_cpu_has_avx512_vnni();
    const float scale = 1.0f / sqrtf((float)hd);
    int p0 = 0;
    if (wide)
        for (; p0 + 16 <= n_pos; p0 += 16) scores16(qs, nh, &kv, 0, hd, p0, scale, s, n_pos);
    attn_scores(qs, nh, &kv, hd, p0, n_pos, scale, s);
    if (a->softcap > 0)
        for (int h = 0; h < nh; h++) kt_softcap_row(s[h], n_pos, a->softcap);
    for (int h = 0; h < nh; h++) {
        float max = s[h][0];
        for (int p = 1; p < n_pos; p++) max = s[h][p] > max ? s[h][p] : max;
        const float sink = a->sinks ? a->sinks[h0 + h] : -INFINITY;
        max = sink > max ? sink : max;
        exp_sub_sum(s[h], n_pos, max);
        double sum = 0.0;
        for (int p = 0; p < n_pos; p++) sum += (double)s[h][p];
        if (a->sinks) sum += (double)expf(sink - max); /* the reference's expf, after the positions */
        float *o = a->out + (size_t)t * a->out_stride + (size_t)(h0 + h) * hd;
        const float inv = (float)(1.0 / sum);
        const int d0 = wide ? hd / 64 * 64 : 0;
        if (d0) attn_values_512(o, &kv, d0, n_pos, s[h], inv);
        attn_values(o, &kv, hd, d0, n_pos, s[h], inv);
    }
}

/* ---- decode at long contexts: three passes over the pool ---------------
 *
 * One query token at thousands of positions reads megabytes of K and V
 * per layer, from memory, and units of (KV group, heads) leave threads
 * idle where there are fewer groups than threads (or read a group's rows
 * once per batch of its heads). ops.c splits the work where it is
 * independent instead: the scores by positions, the softmax by heads, the
 * values by dims (each output dim is its own sum). Each pass does the
 * group kernel's operations on its share, so the bits are its bits. */

size_t kt_attn_decode_thread_floats(int n_pos) {
    return (size_t)2 * n_pos * (sizeof(char *) / sizeof(float)) + 16; /* a K and a V view */
}

/* S[h * s_row + p] for every head, positions [p0, p1). Each block of 16
 * positions runs every KV group before the next block: the groups' K
 * heads are neighbours in a position's row, so the pass streams whole
 * rows (one group at a time read 128 of every 384 bytes, three times). */
void kt_attn_decode_scores_avx2(const kt_attn_args *a, int p0, int p1, float *S, size_t s_row, float *scratch) {
    const int hd = a->head_dim, group = a->n_head / a->n_head_kv, n_pos = kt_attn_n_pos(a, 0);
    kv_view kv = {(const char **)(((uintptr_t)scratch + 7) & ~(uintptr_t)7), NULL, a->kv_type};
    kv.v = kv.k + n_pos;
    const bool wide = hd % 16 == 0 && kt_cpu_has_avx512_vnni() && group <= ATTN_MAX_GROUP;
    const float scale = 1.0f / sqrtf((float)hd);
    const size_t head_bytes = kt_dtype_row_bytes(a->kv_type, hd);
    const float *qs[ATTN_MAX_GROUP];
    float *s[ATTN_MAX_GROUP];
    int p = p0;
    if (wide) {
        kv_view_range(&kv, a, 0, 0, p0, p1);
        for (; p + 16 <= p1; p += 16)
            for (int g = 0; g < a->n_head_kv; g++) {
                for (int h = 0; h < group; h++)
                    qs[h] = a->q + (size_t)(g * group + h) * hd, s[h] = S + (size_t)(g * group + h) * s_row;
                scores16(qs, group, &kv, (size_t)g * head_bytes, hd, p, scale, s, p1);
            }
    }
    for (int g = 0; g < a->n_head_kv && p < p1; g++) /* the rest, a group at a time */
        for (int h0 = g * group; h0 < (g + 1) * group; h0 += ATTN_MAX_GROUP) {
            const int nh = (g + 1) * group - h0 < ATTN_MAX_GROUP ? (g + 1) * group - h0 : ATTN_MAX_GROUP;
            for (int h = 0; h < nh; h++) qs[h] = a->q + (size_t)(h0 + h) * hd, s[h] = S + (size_t)(h0 + h) * s_row;
            kv_view_range(&kv, a, 0, g, p, p1);
            attn_scores(qs, nh, &kv, hd, p, p1, scale, s);
        }
}

/* The max of s[0 .. n): the scalar scan's value (max is exact in any
 * order; a +0 / -0 difference leaves every s - max the same). */
static float row_max(const float *s, int n) {
    __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0;
    int p = 0;
    for (; p + 16 <= n; p += 16)
        m0 = _mm256_max_ps(m0, _mm256_loadu_ps(s + p)), m1 = _mm256_max_ps(m1, _mm256_loadu_ps(s + p + 8));
    float max = hmax8(_mm256_max_ps(m0, m1));
    for (; p < n; p++) max = s[p] > max ? s[p] : max;
    return max;
}

/* inv[k] = (float)(1 / (sum of row k in double, in position order, then
 * + sink[k])) for K rows side by side: each sum is one chain of adds, so
 * K run at once. sink: each row's sink term (0 without sinks: + 0 leaves
 * a positive sum's bits as they are). */
INL void sum_rows_t(float *const *r, int n, const double *sink, float *inv, const int K) {
    double sum[8] = {0};
    for (int p = 0; p < n; p++)
#pragma GCC unroll 8
        for (int k = 0; k < K; k++) sum[k] += (double)r[k][p];
#pragma GCC unroll 8
    for (int k = 0; k < K; k++) inv[k] = (float)(1.0 / (sum[k] + sink[k]));
}

/* Heads h0 .. h0 + nh - 1 (nh <= 8; rows of s_row in S): the scores into
 * exps in place, and inv[h] = (float)(1 / their sum), with each head's
 * sink (sinks non-NULL) in the max and the sum as the reference has it. */
void kt_attn_decode_softmax_avx2(float *S, size_t s_row, int h0, int nh, int n_pos, const float *sinks, float *inv) {
    float *r[8];
    double sink[8] = {0};
    for (int k = 0; k < nh; k++) {
        r[k] = S + (size_t)(h0 + k) * s_row;
        float max = row_max(r[k], n_pos);
        if (sinks) max = sinks[h0 + k] > max ? sinks[h0 + k] : max;
        exp_sub_sum(r[k], n_pos, max);
        if (sinks) sink[k] = (double)expf(sinks[h0 + k] - max);
    }
    switch (nh) {
    case 1: sum_rows_t(r, n_pos, sink, inv + h0, 1); break;
    case 2: sum_rows_t(r, n_pos, sink, inv + h0, 2); break;
    case 3: sum_rows_t(r, n_pos, sink, inv + h0, 3); break;
    case 4: sum_rows_t(r, n_pos, sink, inv + h0, 4); break;
    case 5: sum_rows_t(r, n_pos, sink, inv + h0, 5); break;
    case 6: sum_rows_t(r, n_pos, sink, inv + h0, 6); break;
    case 7: sum_rows_t(r, n_pos, sink, inv + h0, 7); break;
    default: sum_rows_t(r, n_pos, sink, inv + h0, 8); break;
    }
}

/* Dims [d0, d0 + 32) of the outputs of heads [h0, h0 + H) (one KV group,
 * H <= 2: 8 sums, 4 V vectors and a broadcast fit the 16 registers):
 * (sum_p e_h[p] * v_p[d] in position order) * inv[h]. */
#define DECODE_PREFETCH 64 /* positions: a position's work is a few dozen cycles */
INL void decode_values_t(const kt_attn_args *a, const kv_view *kv, int n_pos, int h0, const int H, int d0,
                         const float *S, size_t s_row, const float *inv, const kt_dtype type) {
    const size_t off = kt_dtype_row_bytes(type, d0);
    __m256 acc[2][4];
#pragma GCC unroll 2
    for (int h = 0; h < H; h++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) acc[h][j] = _mm256_setzero_ps();
    for (int p = 0; p < n_pos; p++) {
        const char *vp = kv->v[p];
        if (p + DECODE_PREFETCH < n_pos) _mm_prefetch(kv->v[p + DECODE_PREFETCH] + off, _MM_HINT_T0);
        __m256 v[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) v[j] = kv_load8(vp, d0 + 8 * j, type);
#pragma GCC unroll 2
        for (int h = 0; h < H; h++) {
            const __m256 e = _mm256_set1_ps(S[(size_t)(h0 + h) * s_row + p]);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) acc[h][j] = _mm256_add_ps(acc[h][j], _mm256_mul_ps(e, v[j]));
        }
    }
#pragma GCC unroll 2
    for (int h = 0; h < H; h++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++)
            _mm256_storeu_ps(a->out + (size_t)(h0 + h) * a->head_dim + d0 + 8 * j,
                             _mm256_mul_ps(acc[h][j], _mm256_set1_ps(inv[h0 + h])));
}

INL void decode_values_type(const kt_attn_args *a, const kv_view *kv, int n_pos, int h0, int H, int d0,
                            const float *S, size_t s_row, const float *inv, const kt_dtype type) {
    if (H == 1) decode_values_t(a, kv, n_pos, h0, 1, d0, S, s_row, inv, type);
    else decode_values_t(a, kv, n_pos, h0, 2, d0, S, s_row, inv, type);
}

/* decode_values_t on 16 lanes: 2 vectors a head, so 8 heads' sums (16
 * registers of 32) run together and each V slice is read once for them. */
TARGET_512 INL void decode_values_512_t(const kt_attn_args *a, const kv_view *kv, int n_pos, int h0, const int H,
                                        int d0, const float *S, size_t s_row, const float *inv, const kt_dtype type) {
    const size_t off = kt_dtype_row_bytes(type, d0);
    __m512 acc[8][2];
#pragma GCC unroll 8
    for (int h = 0; h < H; h++) acc[h][0] = acc[h][1] = _mm512_setzero_ps();
    for (int p = 0; p < n_pos; p++) {
        const char *vp = kv->v[p];
        if (p + DECODE_PREFETCH < n_pos) _mm_prefetch(kv->v[p + DECODE_PREFETCH] + off, _MM_HINT_T0);
        const __m512 v0 = kv_load16(vp, d0, type), v1 = kv_load16(vp, d0 + 16, type);
#pragma GCC unroll 8
        for (int h = 0; h < H; h++) {
            const __m512 e = _mm512_set1_ps(S[(size_t)(h0 + h) * s_row + p]);
            acc[h][0] = _mm512_add_ps(acc[h][0], _mm512_mul_ps(e, v0));
            acc[h][1] = _mm512_add_ps(acc[h][1], _mm512_mul_ps(e, v1));
        }
    }
#pragma GCC unroll 8
    for (int h = 0; h < H; h++) {
        float *o = a->out + (size_t)(h0 + h) * a->head_dim + d0;
        const __m512 s = _mm512_set1_ps(inv[h0 + h]);
        _mm512_storeu_ps(o, _mm512_mul_ps(acc[h][0], s));
        _mm512_storeu_ps(o + 16, _mm512_mul_ps(acc[h][1], s));
    }
}

TARGET_512 static void decode_values_512(const kt_attn_args *a, const kv_view *kv, int n_pos, int h0, int H, int d0,
                                         const float *S, size_t s_row, const float *inv) {
#define DV512(n)                                                                                        \
    case n:                                                                                             \
        if (a->kv_type == KT_F16) decode_values_512_t(a, kv, n_pos, h0, n, d0, S, s_row, inv, KT_F16);   \
        else if (a->kv_type == KT_Q8_0) decode_values_512_t(a, kv, n_pos, h0, n, d0, S, s_row, inv, KT_Q8_0); \
        else decode_values_512_t(a, kv, n_pos, h0, n, d0, S, s_row, inv, KT_F32);                       \
        break;
    switch (H) {
        DV512(1) DV512(2) DV512(3) DV512(4) DV512(5) DV512(6) DV512(7)
        default: DV512(8)
    }
#undef DV512
}

/* Dims [d0, d0 + 32) of every head of KV group kvh (head_dim a multiple
 * of 32): eight heads at a time with AVX-512, else two. */
void kt_attn_decode_values_avx2(const kt_attn_args *a, int kvh, int d0, const float *S, size_t s_row,
                                const float *inv, float *scratch) {
    const int group = a->n_head / a->n_head_kv, n_pos = kt_attn_n_pos(a, 0);
    kv_view kv = {(const char **)(((uintptr_t)scratch + 7) & ~(uintptr_t)7), NULL, a->kv_type};
    kv.v = kv.k + n_pos;
    kv_view_build(&kv, a, 0, kvh, n_pos);
    if (kt_cpu_has_avx512_vnni()) {
        for (int h0 = kvh * group; h0 < (kvh + 1) * group; h0 += 8)
            decode_values_512(a, &kv, n_pos, h0, (kvh + 1) * group - h0 < 8 ? (kvh + 1) * group - h0 : 8, d0, S,
                              s_row, inv);
        return;
    }
    for (int h0 = kvh * group; h0 < (kvh + 1) * group; h0 += 2) {
        const int H = (kvh + 1) * group - h0 < 2 ? (kvh + 1) * group - h0 : 2;
        if (a->kv_type == KT_F16) decode_values_type(a, &kv, n_pos, h0, H, d0, S, s_row, inv, KT_F16);
        else if (a->kv_type == KT_Q8_0) decode_values_type(a, &kv, n_pos, h0, H, d0, S, s_row, inv, KT_Q8_0);
        else decode_values_type(a, &kv, n_pos, h0, H, d0, S, s_row, inv, KT_F32);
    }
}

/* ---- prefill: blocks of query tokens -----------------------------------
 *
 * Token by token, every (token, head) streams its KV head's whole K and V
 * rows: at 2,000 positions that is megabytes per token from L3, and
 * attention was over half of a long prefill while doing a tenth of the
 * arithmetic the core can. kt_attention_block_* instead take up to W
 * query tokens of one sequence (W = 8 with AVX2, 16 with AVX-512) and the
 * heads of one KV group together, each K and V row read once for all of
 * them, with the tokens in the W lanes:
 *   scores  lane i of S[h][p] = (q_i,h . k_p) * scale, summed over the
 *           elements in order (Q transposed once per block, k_p broadcast
 *           once for several heads), and each lane's max as they go
 *   softmax per lane: the exps, their sum in double in position order
 *           over the token's own positions (masked lanes: exp 0), chunk
 *           by chunk just before the chunk's values
 *   values  lane i of acc[h][d] = sum_p e_p,i * v_p[d] in position order:
 *           the tokens in the lanes again, v_p[d] broadcast once for
 *           several heads, V widened in chunks of AB_CHUNK rows that stay
 *           in L1 (dims in lanes, one token at a time, ran at half the
 *           speed: a scalar broadcast of e per position and token, and
 *           too few sums in flight)
 * Q goes into the lanes and the outputs come back out by AB_W x AB_W
 * register transposes. Lane by lane these are the operations of the
 * per-token kernels above (exp512 gives exp256's bits on 16 lanes), so
 * the bits are theirs. The body is
 * written once, in attn_block_impl.h, over a small vocabulary of vector
 * operations defined below for each width. */

#define AB_CHUNK 64 /* positions per values pass */

/* exp256 on 16 lanes: its operations, but for the final scaling (below). */
TARGET_512 INL __m512 exp512(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.0f)), _mm512_set1_ps(88.8f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    /* p x 2^n in one instruction. exp256 multiplies by 2^(n/2) and then
     * by 2^(n - n/2): the first product is exact (p is near 1 and the
     * factor >= 2^-76), so both round p x 2^n once: the same bits. */
    return _mm512_scalef_ps(p, n);
}

/* Row p of a K or V view as floats, written to buf as kv_load8 / kv_elem
 * widen it (the same conversion and product, 8 at a time). */
INL void kv_row_widen(const char *row, kt_dtype type, int hd, float *buf) {
    int e = 0;
    for (; e + 8 <= hd; e += 8) _mm256_storeu_ps(buf + e, kv_load8(row, e, type));
    for (; e < hd; e++) buf[e] = kv_elem(row, e, type);
}

/* The row itself (F32) or widened into buf. */
INL const float *kv_row_f32(const char *row, kt_dtype type, int hd, float *buf) {
    if (type == KT_F32) return (const float *)row;
    kv_row_widen(row, type, hd, buf);
    return buf;
}

void kt_exp_rows_avx2(const float *x, float *out, int n) {
    for (int i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, exp256(_mm256_loadu_ps(x + i)));
}

TARGET_512 void kt_exp_rows_avx512(const float *x, float *out, int n) {
    for (int i = 0; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, exp512(_mm512_loadu_ps(x + i)));
}

size_t kt_attention_block_floats(int head_dim, int heads, int n_pos_max) {
    const size_t np_pad = ((size_t)n_pos_max + 7) / 8 * 8, w = 16; /* the wider block */
    return (size_t)heads * head_dim * w * 2 /* Qt, acc */ + (size_t)heads * np_pad * w /* S */ +
           (size_t)(8 + AB_CHUNK) * head_dim /* K, V widened */ + 2 * np_pad * (sizeof(char *) / sizeof(float)) + 64;
}

/* 8 lanes, AVX2. Lane masks are all-ones / zero float lanes. */
#define AB_W 8
#define AB_TARGET
#define AB_NAME(x) x##_avx2
#define AB_F __m256
#define AB_D __m256d
#define ab_set1 _mm256_set1_ps
#define ab_zero _mm256_setzero_ps
#define ab_load _mm256_load_ps
#define ab_loadu _mm256_loadu_ps
#define ab_store _mm256_store_ps
#define ab_storeu _mm256_storeu_ps
#define ab_add _mm256_add_ps
#define ab_sub _mm256_sub_ps
#define ab_mul _mm256_mul_ps
#define ab_exp exp256
#define ab_live(lo, np, p) _mm256_castsi256_ps(_mm256_andnot_si256(                                       \
    _mm256_cmpgt_epi32(_mm256_loadu_si256((const __m256i *)(lo)), _mm256_set1_epi32(p)),                    \
    _mm256_cmpgt_epi32(_mm256_loadu_si256((const __m256i *)(np)), _mm256_set1_epi32(p))))
#define ab_max_live(acc, m, v) _mm256_blendv_ps(acc, _mm256_max_ps(acc, v), m)
#define ab_keep(m, v) _mm256_and_ps(v, m)
#define AB_M __m256
#define AB_DT 4 /* 16 registers: 2 heads x 4 dims, 2 heads x 4 positions */
#define AB_HB 2
#define AB_PB 4
/* + 0 leaves every sum as it is: they start at +0 and never become -0 */
#define ab_add_live(acc, m, v) _mm256_add_ps(acc, _mm256_and_ps(v, m))
#define ab_transpose transpose8
#define ab_dzero _mm256_setzero_pd
#define ab_dlo(v) _mm256_cvtps_pd(_mm256_castps256_ps128(v))
#define ab_dhi(v) _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1))
#define ab_dadd _mm256_add_pd
#define ab_inv(lo, hi) _mm256_set_m128(_mm256_cvtpd_ps(_mm256_div_pd(_mm256_set1_pd(1.0), hi)), \
                                       _mm256_cvtpd_ps(_mm256_div_pd(_mm256_set1_pd(1.0), lo)))
#define ab_fmadd _mm256_fmadd_ps
#include "ops/delta_run_impl.h"
#undef ab_fmadd
#include "ops/attn_block_impl.h"

/* 16 lanes, AVX-512. */
#define AB_W 16
#define AB_TARGET TARGET_512
#define AB_NAME(x) x##_avx512
#define AB_F __m512
#define AB_D __m512d
#define ab_set1 _mm512_set1_ps
#define ab_zero _mm512_setzero_ps
#define ab_load _mm512_load_ps
#define ab_loadu _mm512_loadu_ps
#define ab_store _mm512_store_ps
#define ab_storeu _mm512_storeu_ps
#define ab_add _mm512_add_ps
#define ab_sub _mm512_sub_ps
#define ab_mul _mm512_mul_ps
#define ab_exp exp512
#define ab_live(lo, np, p) ((__mmask16)(~_mm512_cmpgt_epi32_mask(_mm512_loadu_si512(lo), _mm512_set1_epi32(p)) & \
                                       _mm512_cmpgt_epi32_mask(_mm512_loadu_si512(np), _mm512_set1_epi32(p))))
#define ab_max_live(acc, m, v) _mm512_mask_max_ps(acc, m, acc, v)
#define ab_keep(m, v) _mm512_maskz_mov_ps(m, v)
#define AB_M __mmask16
#define AB_DT 8 /* 3 heads x 8 dims or positions: 24 sums of 32 registers */
#define AB_HB 3
#define AB_PB 8
#define ab_add_live(acc, m, v) _mm512_mask_add_ps(acc, m, acc, v)
#define ab_transpose transpose16
#define ab_dzero _mm512_setzero_pd
#define ab_dlo(v) _mm512_cvtps_pd(_mm512_castps512_ps256(v))
#define ab_dhi(v) _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)))
#define ab_dadd _mm512_add_pd
#define ab_inv(lo, hi) _mm512_castpd_ps(_mm512_insertf64x4(                                                   \
    _mm512_castpd256_pd512(_mm256_castps_pd(_mm512_cvtpd_ps(_mm512_div_pd(_mm512_set1_pd(1.0), lo)))),        \
    _mm256_castps_pd(_mm512_cvtpd_ps(_mm512_div_pd(_mm512_set1_pd(1.0), hi))), 1))
#define ab_fmadd _mm512_fmadd_ps
#include "ops/delta_run_impl.h"
#undef ab_fmadd
#include "ops/attn_block_impl.h"
