/*
 * draft.h - a draft model's proposals for the engine's speculation.
 *
 * A small model of the same family (the same vocabulary, checked token by
 * token at start) guesses the next k tokens of each decoding choice
 * greedily; the engine verifies them in its ragged pass like any other
 * proposals (engine.h, spec), so the output stays the target's exactly.
 *
 * The draft keeps a KV sequence per choice, in step with the target's:
 * it holds the choice's tokens as far as the draft has read them. Each
 * step, the draft first reads what it has not (the prompt once, then the
 * tokens the target emitted), then drafts k tokens one pass at a time;
 * all choices share every pass (one ragged batch of the draft). After the
 * target's verification, keep() cuts the draft's sequence back to the
 * tokens that stood. Its own pool: the draft's layers and widths are not
 * the target's, so its blocks are not the target pool's blocks (sized for
 * n_parallel contexts of the draft, it never runs out).
 *
 * Engine thread only.
 */
#ifndef KT_ENGINE_DRAFT_H
#define KT_ENGINE_DRAFT_H

#include <stdint.h>

#include "kettle.h"
#include "kv/block_pool.h"
#include "ops/pool.h"

typedef struct eng_draft eng_draft;

/* A draft for target (NULL with err: another vocabulary, named by the
 * first token that differs; out of memory). */
eng_draft *eng_draft_new(const kt_model *target, const kt_model *draft, int n_parallel, int n_ctx, int k_max,
                         kt_error *err);
void eng_draft_free(eng_draft *d);

/* One choice's request to the draft. */
typedef struct eng_draft_job {
    kv_seq **seq;        /* the choice's draft sequence (made on first use; freed by the engine) */
    const int32_t *ctx;  /* the choice's tokens, its pending one last */
    int n;
    int k;               /* tokens wanted */
    int32_t *out;        /* gets them */
    int got;             /* how many it got (0: the draft could not read this far yet) */
} eng_draft_job;

/* Drafts for every job, sharing each pass; a choice the draft is more
 * than read_budget tokens behind reads part of its backlog and gets
 * nothing this step. Fails only if the draft's pool is exhausted (which
 * its sizing rules out). */
kt_status eng_draft_propose(eng_draft *d, kt_pool *pool, eng_draft_job *jobs, int n_jobs, int read_budget,
                            kt_error *err);
/* After verification: the choice's tokens [0, n_valid) stood (the
 * draft's sequence keeps at most that many). */
void eng_draft_keep(kv_seq *seq, int n_valid);
/* The measured cost of one drafting pass, ms (0: none yet). */
double eng_draft_pass_ms(const eng_draft *d);

#endif
