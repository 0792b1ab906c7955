/*
 * policy.h - how many proposed tokens to verify: the choice that makes
 * speculation never slower than plain decoding.
 *
 * Verifying k proposals costs a pass of k more tokens; on a CPU that cost
 * is flat while the weights dominate and jumps where a GEMM tile fills or
 * the arithmetic becomes the bound (a batch of many sequences). So k is
 * chosen against measured costs, not assumed: the expected tokens of a
 * pass with k proposals (from the sequence's acceptance so far) over the
 * measured cost of a pass of that many tokens, maximised over k, with
 * k = 0 (plain decoding) whenever nothing beats it.
 *
 * Acceptance is tracked by depth: p[i] is the chance that proposal i + 1
 * is kept given proposal i was, so the expected tokens of a pass with k
 * proposals are
 *   E(k) = 1 + p[0] + p[0] p[1] + ... + p[0] ... p[k-1].
 * This fits both ways proposals fail: a geometric fall-off (every token a
 * fresh guess) and a prefix that holds for a while then stops (a quoted
 * span that ends). Each p[i] is counted, kept over tried (both counts
 * fading by FORGET a verifying step, so the recent past speaks), with one
 * pseudo-trial at the rate of the depth before it: a depth never tried
 * is expected to do as the one before (kept proposals tend to go on being
 * kept), and one trial already moves it most of the way.
 */
#ifndef KT_SPEC_POLICY_H
#define KT_SPEC_POLICY_H

#include <stdbool.h>

#define SPEC_K_MAX 32       /* most proposals one pass verifies */
#define SPEC_PROBE_EVERY 16 /* backed off to k = 0: a one-token proposal after this many steps, */
#define SPEC_PROBE_MAX 256  /* the wait doubling after each probe while plain decoding stays better, up to this */
#define SPEC_PROBE_K 1

typedef struct spec_accept {
    float kept[SPEC_K_MAX], tried[SPEC_K_MAX]; /* proposal i + 1, given proposal i was kept (fading counts) */
    int idle_steps;      /* steps at k = 0 with proposals available */
    int probe_every;     /* the wait before the next probe (SPEC_PROBE_EVERY..SPEC_PROBE_MAX) */
} spec_accept;

void spec_accept_init(spec_accept *a);
/* A new sequence's tracker starting from what earlier ones saw (seen: a
 * tracker every verify result was also noted to): their fading counts, a
 * fresh probe wait (its first chance a probe only where seen is empty). */
void spec_accept_inherit(spec_accept *a, const spec_accept *seen);
/* A pass verified k proposals and kept the first `accepted` of them. */
void spec_accept_note(spec_accept *a, int k, int accepted);
/* E(k): the expected tokens a pass with k proposals emits (>= 1). */
double spec_accept_expected(const spec_accept *a, int k);
/* Whether a's proposer is measured useless: SPEC_USELESS_TRIED first
 * proposals or more tried (fading counts: four in a row) and the first
 * kept at a rate under SPEC_USELESS_P (the pseudo-trial included; one
 * kept lifts it back over). What keeps such a proposer ready to guess may
 * rest until it is kept again (engine/mtp_engine.h: its rows for
 * prompts). */
#define SPEC_USELESS_TRIED 3.5f
#define SPEC_USELESS_P 0.12
bool spec_accept_useless(const spec_accept *a);

/* Measured pass costs by tokens in the pass: cost_ms[n] for n in
 * [1, n_max] (0: not measured yet), an average of recent passes. */
typedef struct spec_costs {
    double *ms;
    int n_max;
    /* a prefill token's measured cost (0: unknown): a pass larger than any
     * measured is guessed at no less than this a token more, since the
     * line from small passes cannot see a kernel tile's end (the 9th
     * token of an 8-token tile costs ~4x the 8th, docs/PERFORMANCE.md) */
    double ms_token;
} spec_costs;

/* The cost of a pass of n tokens: measured, or, not yet measured, the
 * line between the measured sizes either side of it (where a larger one
 * costs no less), or the line through the two largest measured smaller
 * passes carried on to n
 * (flat at worst), or from the only one, m: C(m) (1 + (n - m) / 4), a
 * CPU's usual slope while the weights' reads dominate. A guess a size
 * must beat once to be tried, and then it is known: where passes grow by
 * a whole token's work each (a model so small that attention and
 * per-row work are the pass) larger ones are never tried for a gain
 * they cannot give; where a GEMM tile fills and the curve flattens, a
 * high acceptance still pays for the line's guess, and the try finds
 * the flat part. 0 when nothing is measured. */
double spec_cost(const spec_costs *c, int n);
void spec_cost_note(spec_costs *c, int n, double ms);

/* How many of `avail` proposals this sequence verifies, in a pass that
 * already holds n_tokens tokens expected to emit `expected` tokens (one
 * per decoding sequence, plus what earlier sequences' proposals are
 * expected to add): the k maximising (expected - 1 + E(k)) / cost(n_tokens
 * + k). While that is 0, a probe still verifies SPEC_PROBE_K now and
 * then (at the first call, then after SPEC_PROBE_EVERY calls, the wait doubling after each probe
 * while plain decoding stays the better choice, back to the shortest
 * once speculation pays), so a sequence that starts to repeat its
 * context is noticed and one that never does costs almost nothing; no
 * probe where even all proposals kept could not pay. Until a pass of n_tokens
 * is measured, 0 (plain decoding's cost is what every k is weighed
 * against). In a pass already compute-bound (1.5 x a one-token pass or
 * more: a batch that fills the GEMM), no probes and no optimism, only
 * measured gains. fixed: all of avail. */
int spec_choose_k(spec_accept *a, const spec_costs *c, int avail, int n_tokens, double expected, bool fixed);
/* The same when each proposal also costs ms_per_k to make (a draft
 * model's pass) and a rejection costs ms_reject (a hybrid model's
 * rollback, which replays the kept tokens' state updates, engine/rewind.h),
 * weighed by the chance that not all k are kept. may_probe (NULL: always)
 * says whether a probe may be taken now, and is cleared when one is:
 * one probe a step is enough to learn from (acceptance is shared, and
 * the pass size it tries is then measured), where eight new streams
 * probing at their first chance made a pass of 16 tokens that cost every
 * stream of the batch (docs/PERFORMANCE.md); a sequence whose probe is
 * due and refused takes it at its next chance. */
int spec_choose_k_paid(spec_accept *a, const spec_costs *c, int avail, int n_tokens, double expected, bool fixed,
                       double ms_per_k, double ms_reject, bool *may_probe);

#endif
