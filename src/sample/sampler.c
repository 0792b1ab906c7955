/*
 * sampler.c - the sampler chain behind kt_sampler_* (see sampler.h and
 * kettle.h).
 *
 * One call of kt_sampler_sample() runs, in llama.cpp's default order:
 *
 *   penalties -> (greedy: argmax) -> top-k -> top-p -> min-p ->
 *   temperature -> draw from the softmax with the seeded generator.
 *
 * Why it is built this way:
 * - Penalties need the number of times each token occurs in the last
 *   penalty_last_n accepted tokens. A ring buffer holds the window and a
 *   per-token count array is kept in step with it, so accepting a token is
 *   O(1) and applying the penalties is O(window), never O(n_vocab).
 * - top-k with a small k selects with a bounded min-heap (O(n log k))
 *   instead of sorting every logit of a 32000+ vocabulary.
 * - Every ordering is total (logit descending, then id ascending), so the
 *   result never depends on qsort's instability: the same seed and the
 *   same logits give the same token on every machine.
 */
#include "sample/sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/rng.h"
#include "sample/exp_nonpos.h"

typedef struct kt_cand {
    int32_t id;
    float logit;
} kt_cand;

struct kt_sampler {
    kt_sampler_params p;
    int n_vocab;
    kt_rng rng;
    /* Penalty window: ring[0..ring_len) holds the last accepted tokens,
     * the oldest at ring_pos once the ring is full (ring_len == cap).
     * Invariant: counts[t] == occurrences of t in ring[0..ring_len). */
    int32_t *ring;
    int ring_cap, ring_len, ring_pos;
    int32_t *counts;     /* n_vocab entries; NULL when penalties are off */
    kt_cand *cand;       /* n_vocab entries of scratch */
    double *probs;       /* n_vocab entries of scratch */
};

/* ---- parameters ------------------------------------------------------ */

kt_sampler_params kt_sampler_defaults(void) {
    kt_sampler_params p;
    memset(&p, 0, sizeof p);
    p.temperature = 0.8f;
    p.top_k = 40;
    p.top_p = 0.95f;
    p.min_p = 0.05f;
    p.repeat_penalty = 1.0f;
    p.frequency_penalty = 0.0f;
    p.presence_penalty = 0.0f;
    p.penalty_last_n = 64;
    p.seed = 0;
    return p;
}

static kt_status check_params(const kt_sampler_params *p, int n_vocab,
                              kt_error *err) {
    if (!p) return kt_error_set(err, KT_ERR_ARG, "sampler: params is NULL");
    if (n_vocab <= 0)
        return kt_error_set(err, KT_ERR_ARG, "sampler: n_vocab must be > 0 (got %d)",
                            n_vocab);
    if (isnan(p->temperature) || isinf(p->temperature))
        return kt_error_set(err, KT_ERR_ARG, "sampler: temperature must be finite (got %g)",
                            (double)p->temperature);
    if (!(p->top_p > 0.0f))
        return kt_error_set(err, KT_ERR_ARG, "sampler: top_p must be > 0 (got %g)",
                            (double)p->top_p);
    if (isnan(p->min_p) || p->min_p > 1.0f)
        return kt_error_set(err, KT_ERR_ARG, "sampler: min_p must be <= 1 (got %g)",
                            (double)p->min_p);
    if (!(p->repeat_penalty > 0.0f) || isinf(p->repeat_penalty))
        return kt_error_set(err, KT_ERR_ARG,
                            "sampler: repeat_penalty must be finite and > 0 (got %g)",
                            (double)p->repeat_penalty);
    if (!isfinite(p->frequency_penalty) || !isfinite(p->presence_penalty))
        return kt_error_set(err, KT_ERR_ARG,
                            "sampler: frequency and presence penalties must be finite");
    if (p->penalty_last_n < 0)
        return kt_error_set(err, KT_ERR_ARG, "sampler: penalty_last_n must be >= 0 (got %d)",
                            p->penalty_last_n);
    return KT_OK;
}

static bool penalties_on(const kt_sampler_params *p) {
    return p->penalty_last_n > 0 &&
           (p->repeat_penalty != 1.0f || p->frequency_penalty != 0.0f ||
            p->presence_penalty != 0.0f);
}

/* ---- lifetime -------------------------------------------------------- */

kt_sampler *kt_sampler_new(const kt_sampler_params *params, int n_vocab,
                           kt_error *err) {
    if (check_params(params, n_vocab, err) != KT_OK) return NULL;
    kt_sampler *s = calloc(1, sizeof *s);
    if (!s) goto nomem;
    s->p = *params;
    s->n_vocab = n_vocab;
    kt_rng_seed(&s->rng, params->seed);
    s->cand = malloc((size_t)n_vocab * sizeof *s->cand);
    s->probs = malloc((size_t)n_vocab * sizeof *s->probs);
    if (!s->cand || !s->probs) goto nomem;
    if (penalties_on(params)) {
        s->ring_cap = params->penalty_last_n;
        s->ring = malloc((size_t)s->ring_cap * sizeof *s->ring);
        s->counts = calloc((size_t)n_vocab, sizeof *s->counts);
        if (!s->ring || !s->counts) goto nomem;
    }
    return s;
nomem:
    kt_sampler_free(s);
    kt_error_set(err, KT_ERR_NOMEM, "sampler: out of memory (n_vocab %d)", n_vocab);
    return NULL;
}

void kt_sampler_free(kt_sampler *s) {
    if (!s) return;
    free(s->ring);
    free(s->counts);
    free(s->cand);
    free(s->probs);
    free(s);
}

void kt_sampler_accept(kt_sampler *s, int32_t id) {
    if (!s || !s->counts || id < 0 || id >= s->n_vocab) return;
    if (s->ring_len < s->ring_cap) {
        s->ring[s->ring_len++] = id;
    } else {
        s->counts[s->ring[s->ring_pos]]--;
        s->ring[s->ring_pos] = id;
        s->ring_pos = (s->ring_pos + 1) % s->ring_cap;
    }
    s->counts[id]++;
}

/* ---- penalties ------------------------------------------------------- */

/* Applies the penalties once per distinct token of the window. A token is
 * marked done by negating its count; the second pass restores the counts,
 * so the invariant on counts holds again on return. */
void kt_sampler_apply_penalties(kt_sampler *s, float *logits) {
    if (!s || !logits || !s->counts || s->ring_len == 0) return;
    const kt_sampler_params *p = &s->p;
    for (int i = 0; i < s->ring_len; i++) {
        int32_t t = s->ring[i];
        int32_t c = s->counts[t];
        if (c <= 0) continue; /* already penalized */
        float l = logits[t];
        l = l > 0.0f ? l / p->repeat_penalty : l * p->repeat_penalty;
        l -= (float)c * p->frequency_penalty + p->presence_penalty;
        logits[t] = l;
        s->counts[t] = -c;
    }
    for (int i = 0; i < s->ring_len; i++) {
        int32_t t = s->ring[i];
        if (s->counts[t] < 0) s->counts[t] = -s->counts[t];
    }
}

/* ---- ordering -------------------------------------------------------- */

/* NaN sorts as -inf so a broken logit can never be picked over real ones;
 * +inf becomes the largest float so softmax never computes inf - inf. */
static float clean(float x) {
    if (isnan(x)) return -INFINITY;
    return x == INFINITY ? FLT_MAX : x;
}

/* True when a ranks before b: higher logit, then lower id. */
static bool ranks_before(const kt_cand *a, const kt_cand *b) {
    if (a->logit != b->logit) return a->logit > b->logit;
    return a->id < b->id;
}

static int cmp_cand(const void *pa, const void *pb) {
    const kt_cand *a = pa, *b = pb;
    if (a->id == b->id) return 0;
    return ranks_before(a, b) ? -1 : 1;
}

static int32_t argmax(const float *logits, int n) {
    int32_t best = 0;
    float bv = clean(logits[0]);
    for (int i = 1; i < n; i++) {
        float v = clean(logits[i]);
        if (v > bv) { bv = v; best = i; } /* strict: ties keep the lower id */
    }
    return best;
}

/* Min-heap on rank (the root ranks last) of at most k candidates. */
static void heap_sift_down(kt_cand *h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && ranks_before(&h[m], &h[l])) m = l;
        if (r < n && ranks_before(&h[m], &h[r])) m = r;
        if (m == i) return;
        kt_cand t = h[i]; h[i] = h[m]; h[m] = t;
        i = m;
    }
}

static void heap_sift_up(kt_cand *h, int i) {
    while (i > 0) {
        int parent = (i - 1) / 2;
        if (!ranks_before(&h[parent], &h[i])) return;
        kt_cand t = h[i]; h[i] = h[parent]; h[parent] = t;
        i = parent;
    }
}

/* Keeps the k best of all logits in s->cand[0..k), sorted best first. */
static int select_top_k(kt_sampler *s, const float *logits, int k) {
    kt_cand *h = s->cand;
    int n = 0;
    for (int i = 0; i < s->n_vocab; i++) {
        kt_cand c = { i, clean(logits[i]) };
        if (n < k) {
            h[n] = c;
            heap_sift_up(h, n++);
        } else if (ranks_before(&c, &h[0])) {
            h[0] = c;
            heap_sift_down(h, n, 0);
        }
    }
    qsort(h, (size_t)n, sizeof *h, cmp_cand);
    return n;
}

/* All logits as candidates; sorted only when a later stage needs it. */
static int select_all(kt_sampler *s, const float *logits, bool sort) {
    for (int i = 0; i < s->n_vocab; i++) {
        s->cand[i].id = i;
        s->cand[i].logit = clean(logits[i]);
    }
    if (sort) qsort(s->cand, (size_t)s->n_vocab, sizeof *s->cand, cmp_cand);
    return s->n_vocab;
}

/* ---- truncation ------------------------------------------------------ */

static float max_logit(const kt_cand *c, int n) {
    float m = c[0].logit;
    for (int i = 1; i < n; i++)
        if (c[i].logit > m) m = c[i].logit;
    return m;
}

/* probs[i] = exp(logit_i / temp - max / temp) for the n candidates;
 * returns their sum (>= 1 when max is finite: the best term is 1). The
 * terms in float (exp_nonpos.h: a call of exp() per vocabulary entry was
 * most of a draw), summed in double. */
static double softmax_terms(const kt_cand *c, int n, double temp, double *probs) {
    const float m = max_logit(c, n), inv_temp = (float)(1.0 / temp);
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        probs[i] = (m == -INFINITY) ? 1.0 : (double)kt_exp_nonpos((c[i].logit - m) * inv_temp);
        sum += probs[i];
    }
    return sum;
}

/* Candidates must be sorted best first. Keeps the shortest prefix whose
 * probability mass reaches top_p (at least one). */
static int apply_top_p(kt_sampler *s, int n) {
    double sum = softmax_terms(s->cand, n, 1.0, s->probs), cum = 0.0;
    for (int i = 0; i < n; i++) {
        cum += s->probs[i] / sum;
        if (cum >= (double)s->p.top_p) return i + 1;
    }
    return n;
}

/* Keeps candidates with p >= min_p * p_max, i.e. logit >= max + log(min_p);
 * the best candidate always stays. Order is preserved. */
static int apply_min_p(kt_sampler *s, int n) {
    double cut = (double)max_logit(s->cand, n) + log((double)s->p.min_p);
    int kept = 0;
    for (int i = 0; i < n; i++)
        if ((double)s->cand[i].logit >= cut) s->cand[kept++] = s->cand[i];
    return kept > 0 ? kept : n;
}

/* ---- drawing --------------------------------------------------------- */

static int32_t draw(kt_sampler *s, int n) {
    double sum = softmax_terms(s->cand, n, (double)s->p.temperature, s->probs);
    double u = kt_rng_uniform(&s->rng) * sum, cum = 0.0;
    for (int i = 0; i < n; i++) {
        cum += s->probs[i];
        if (u < cum) return s->cand[i].id;
    }
    /* Rounding can leave u just above the last partial sum. */
    for (int i = n - 1; i > 0; i--)
        if (s->probs[i] > 0.0) return s->cand[i].id;
    return s->cand[0].id;
}

int32_t kt_sampler_sample(kt_sampler *s, float *logits) {
    if (!s || !logits) return -1;
    kt_sampler_apply_penalties(s, logits);
    if (s->p.temperature <= 0.0f) return argmax(logits, s->n_vocab);

    bool top_p_on = s->p.top_p < 1.0f;
    int n;
    if (s->p.top_k > 0 && s->p.top_k < s->n_vocab)
        n = select_top_k(s, logits, s->p.top_k);
    else
        n = select_all(s, logits, top_p_on);
    if (top_p_on) n = apply_top_p(s, n);
    if (s->p.min_p > 0.0f) n = apply_min_p(s, n);
    return draw(s, n);
}
