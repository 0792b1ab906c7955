/*
 * policy.c - the choice of k (see policy.h).
 */
#include "spec/policy.h"

#include <string.h>

#define FORGET 0.95f  /* how much of the counts a verifying step keeps */
#define PRIOR_P 0.5f  /* depth 0 before any evidence */
#define COST_EMA 0.25 /* weight of the newest pass in the cost averages */
#define MARGIN 1.03   /* speculate only for a gain past the timer's noise: on a model whose
                       * passes cost the same at any k, noise alone would pick k > 0 half the time */
#define PAYS_E 1.25   /* E(k) from which a chosen k pays on acceptance, not on timer noise */
#define BOUND 1.5     /* a pass already this many times a one-token pass: compute-bound (a batch of
                       * sequences fills the GEMM), where a token more costs its full share */

void spec_accept_init(spec_accept *a) {
    memset(a, 0, sizeof *a);
    a->probe_every = SPEC_PROBE_EVERY;
    /* the first chance is a probe: a new sequence learns what its proposals
     * are worth at once, not after a wait; the waits start after it */
    a->idle_steps = SPEC_PROBE_EVERY - 1;
}

void spec_accept_inherit(spec_accept *a, const spec_accept *seen) {
    spec_accept_init(a);
    memcpy(a->kept, seen->kept, sizeof a->kept);
    memcpy(a->tried, seen->tried, sizeof a->tried);
    if (a->tried[0] > 0) a->idle_steps = 0; /* evidence already: the usual wait before a probe */
}

void spec_accept_note(spec_accept *a, int k, int accepted) {
    if (k <= 0) return;
    a->idle_steps = 0;
    for (int i = 0; i < SPEC_K_MAX; i++) a->kept[i] *= FORGET, a->tried[i] *= FORGET;
    for (int i = 0; i < accepted && i < SPEC_K_MAX; i++) a->kept[i] += 1, a->tried[i] += 1;
    if (accepted < k && accepted < SPEC_K_MAX) a->tried[accepted] += 1; /* the first one drawn otherwise */
    /* depths past it were not tried: no evidence */
}

/* E(k), and in *all the chance that all k are kept. */
static double expected_and_all(const spec_accept *a, int k, double *all) {
    double e = 1.0, run = 1.0, p = PRIOR_P;
    for (int i = 0; i < k && i < SPEC_K_MAX; i++) {
        p = (a->kept[i] + p) / (a->tried[i] + 1.0); /* one pseudo-trial at the depth before's rate */
        run *= p, e += run;
    }
    if (all) *all = run;
    return e;
}

double spec_accept_expected(const spec_accept *a, int k) { return expected_and_all(a, k, NULL); }

bool spec_accept_useless(const spec_accept *a) { /* E(1) - 1: the first proposal's rate, as the policy sees it */
    return a->tried[0] >= SPEC_USELESS_TRIED && spec_accept_expected(a, 1) - 1.0 < SPEC_USELESS_P;
}

/* The largest measured size <= n (0: none), the smallest measured > n
 * (n_max + 1: none). */
static int measured_at_most(const spec_costs *c, int n) {
    while (n >= 1 && c->ms[n] <= 0) n--;
    return n;
}
static int measured_above(const spec_costs *c, int n) {
    int hi = n + 1;
    while (hi <= c->n_max && c->ms[hi] <= 0) hi++;
    return hi;
}

double spec_cost(const spec_costs *c, int n) {
    if (n > c->n_max) n = c->n_max;
    const int m = measured_at_most(c, n), hi = measured_above(c, n);
    if (m < 1) return 0;
    if (m == n) return c->ms[n];
    /* between two measured sizes: the line through them (a tile's step shows in both) */
    if (hi <= c->n_max && c->ms[hi] >= c->ms[m]) return c->ms[m] + (c->ms[hi] - c->ms[m]) * (n - m) / (hi - m);
    const int m2 = measured_at_most(c, m - 1);
    double slope = m2 >= 1 ? (c->ms[m] - c->ms[m2]) / (m - m2) : 0.25 * c->ms[m];
    if (slope < 0) slope = 0; /* timer noise: flat at worst, and the size, once tried, is known */
    return c->ms[m] + slope * (n - m);
}

void spec_cost_note(spec_costs *c, int n, double ms) {
    if (n < 1 || n > c->n_max) return;
    c->ms[n] = c->ms[n] > 0 ? (1 - COST_EMA) * c->ms[n] + COST_EMA * ms : ms;
}

/* In a compute-bound pass a size not yet measured is guessed at no less
 * than its full share of the base pass: the line through two measured
 * sizes can come out flat from timer noise, and there a wrong guess
 * costs every sequence of the batch a slower step. */
static double guess_cost(const spec_costs *c, int n, int n_base, double base_cost, bool bound) {
    const double line = spec_cost(c, n);
    if (n > c->n_max || c->ms[n] > 0) return line;
    if (bound) {
        const double share = base_cost * n / n_base;
        return line > share ? line : share;
    }
    /* past the largest measured size m: at least ms_token a token more
     * (between measured sizes the line between them stands) */
    const int m = measured_at_most(c, n);
    if (m < 1 || c->ms_token <= 0 || measured_above(c, n) <= c->n_max) return line;
    const double floor = c->ms[m] + (n - m) * c->ms_token;
    return line > floor ? line : floor;
}

int spec_choose_k(spec_accept *a, const spec_costs *c, int avail, int n_tokens, double expected, bool fixed) {
    return spec_choose_k_paid(a, c, avail, n_tokens, expected, fixed, 0.0, 0.0, NULL);
}

int spec_choose_k_paid(spec_accept *a, const spec_costs *c, int avail, int n_tokens, double expected, bool fixed,
                       double ms_per_k, double ms_reject, bool *may_probe) {
    if (avail > SPEC_K_MAX) avail = SPEC_K_MAX;
    if (avail <= 0 || fixed) return avail > 0 ? avail : 0;
    const double base_cost = spec_cost(c, n_tokens);
    if (base_cost <= 0) return 0; /* plain decoding's cost first: what every k is weighed against */
    /* compute-bound: no optimism about unmeasured sizes and no probes, which
     * would cost every sequence of the batch a slower step */
    const double one = spec_cost(c, 1);
    const bool bound = one > 0 && base_cost >= BOUND * one;
    int best = 0;
    const double plain_rate = MARGIN * expected / base_cost;
    double best_rate = plain_rate;
    bool could_pay = false; /* were every proposal kept, some k would beat plain decoding */
    for (int k = 1; k <= avail; k++) {
        double all;
        const double e = expected_and_all(a, k, &all);
        const double cost = guess_cost(c, n_tokens + k, n_tokens, base_cost, bound) + k * ms_per_k;
        const double rate = (expected - 1.0 + e) / (cost + (1.0 - all) * ms_reject);
        if (rate > best_rate) best = k, best_rate = rate;
        could_pay = could_pay || (expected + k) / cost > plain_rate; /* all kept: no rejection to pay for */
    }
    /* A probe looks for acceptance rising; where even all kept could not
     * pay (a pass whose every extra row costs a whole token's work: a
     * model so small that per-row work is the pass), there is nothing to
     * look for, and each probe is a loss. */
    if (best > 0) {
        /* it pays on acceptance: should it stop, look again soon (a k
         * chosen on a cost reading alone, a pass timed in a quiet spell
         * against plain decoding's in a busy one, is no such reason) */
        if (spec_accept_expected(a, best) >= PAYS_E) a->probe_every = SPEC_PROBE_EVERY;
    } else if (!bound && could_pay && ++a->idle_steps >= a->probe_every && (!may_probe || *may_probe)) {
        /* each probe that leaves plain decoding the better choice makes the
         * next wait longer, a kept one too: near the break-even point a
         * probe is kept now and then without ever paying for itself */
        a->idle_steps = 0;
        if (may_probe) *may_probe = false;
        if (a->probe_every < SPEC_PROBE_MAX) a->probe_every *= 2;
        return avail < SPEC_PROBE_K ? avail : SPEC_PROBE_K;
    }
    return best;
}
