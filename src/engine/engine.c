/*
 * engine.c - the step loop: admission, continuous batching with chunked
 * prefill, sampling, stop strings and cancellation (see engine.h).
 *
 * One engine thread runs engine_step() while any request is waiting or
 * running. A step:
 *   1. finishes cancelled requests (their KV blocks go back to the pool);
 *   2. admits waiting requests, best priority first, while their worst-case
 *      KV blocks fit beside what running requests have reserved (so a
 *      running sequence never runs out of blocks and is never evicted);
 *   3. builds one ragged batch: the next token of every decoding choice,
 *      then prefill chunks of admitted prompts (the rule below);
 *   4. runs the forward pass once for the whole batch;
 *   5. samples each choice whose logits came out, queues its events, and
 *      retires requests whose choices have all finished.
 * With speculation (engine.h's spec), a decoding choice's token in step 3
 * may bring proposals after it, and step 5 samples its rows in order,
 * keeping proposals while the draws equal them, then truncates the KV of
 * the rest (kv_seq_truncate: within the blocks the append made, so also
 * across a block boundary; a copied shared block stays the sequence's).
 *
 * Scheduling prefill (build_batch). Alone, prompts take the whole token
 * budget. Beside decoding streams, from the measured costs of a
 * decode-only step (t_decode) and of a prefill token (t_token; one in a
 * small chunk costs more than one in a large step, so each has its own
 * estimate, see update_costs):
 *   - the stretch: a step's prefill may cost A = (max_itl_stretch - 1) x
 *     t_decode, so a long prompt is read in chunks while the streams keep
 *     their pace, and it still gets a fixed share of the machine;
 *   - whole: a prompt whose remaining tokens cost at most A +
 *     max_stall_ms goes in whole, in as many steps as batch_tokens needs
 *     (one for an agent's next turn of a few hundred uncached tokens), so
 *     its first token comes at once instead of after remainder / chunk
 *     steps. A long prompt is chunked until its remainder fits, then goes
 *     in whole. So a stream still gets a token every step (a step holds at
 *     most batch_tokens tokens), and one prompt holds it back at most
 *     about max_stall_ms beyond the stretch;
 *   - order: the least prompt left first (an agent's next turn before
 *     another session's long first prompt); one passed over by later
 *     prompts MAX_PREFILL_PASSED_OVER steps goes first, so none starves;
 *   - while the prefill token's cost is unknown (before any prefill ran),
 *     chunks are 8 tokens and remainders of <= SHORT_PROMPT_TOKENS go in
 *     whole, standing in for the stall.
 * Why whole rather than chunked: chunking a prompt costs the streams the
 * same time in all (spread over many stretched steps: more, as small
 * chunks cost more a token) and delays its first token by as many steps;
 * all a chunk buys is a shorter longest gap, and max_stall_ms says how
 * long a stall the streams may see. Why no pay-back of the stall by later
 * steps: in an agent loop prefill is most of the work (PERFORMANCE.md: 90%
 * of the 4-session workload's time on a 2-core CPU), so any rule that
 * gives streams a fixed share over time queues the next turns behind
 * them; every stream still moves each step. The costs are estimates
 * (EMAs), so the bounds hold as well as they do.
 *
 * Invariant (relied on by admission and by the decode step): the sum of
 * blocks_reserved over running requests is <= the pool's blocks, and each
 * request's sequences never hold more than its reservation; the same for
 * slots_reserved and the sliding-window layers' slots.
 */
#include "engine/engine.h"

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "base/huge.h"
#include "engine/draft.h"
#include "engine/images.h"
#include "engine/grammar_sample.h"
#include "engine/model_internal.h"
#include "engine/request.h"
#include "kv/disk_cache.h"
#include "kv/state_pool.h"
#include "kv/prefix_cache.h"
#include "engine/rewind.h"
#include "engine/mtp_engine.h"
#include "model/deepstack.h"
#include "model/mtp.h"
#include "engine/snapshots.h"
#include "model/forward.h"
#include "ops/pool.h"
#include "spec/ngram.h"
#include "spec/policy.h"
#include "spec/table.h"

#define KV_BLOCK_TOKENS 16
#define DEFAULT_CTX_MAX 32768   /* the default context, at most (fill_params) */
#define SHORT_PROMPT_TOKENS 32 /* prompts this short go in whole while the prefill cost is unknown */

const double kt_lat_bucket_ms[KT_LAT_N_BUCKETS - 1] = {1,   2.5,  5,    10,   25,   50,   100,
                                                      250, 500, 1000, 2500, 5000, 10000};

struct kt_engine {
    kt_model *model;
    const llm_model *llm;
    kt_engine_params p;
    kv_pool *kv;
    kv_prefix_cache *cache; /* NULL when params.prefix_cache is off */
    kv_disk *disk;          /* NULL without params.cache_dir */
    eng_snaps snaps;        /* a hybrid model's state snapshots (inert otherwise) */
    eng_rewind rewind;      /* a hybrid model's speculative rollback (inert otherwise) */
    eng_mtp mtp;            /* KT_SPEC_MTP: the MTP block's rows and guesses (inert otherwise) */
    eng_grammar gram;       /* token trie and mask classes, made at the first grammar */
    int32_t *seq_tokens;    /* [n_ctx]: a sequence's ids, for the cache */
    int32_t *hit_blocks;    /* [blocks of n_ctx]: a lookup's result */
    llm_work *work;
    kt_pool *pool;
    pthread_t thread;
    bool thread_started;

    /* under mu: the wait queue, the stop flag, the stats, the hold */
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* the engine thread waits on it for work */
    pthread_cond_t cv_step; /* kt_engine_run_steps waits on it for steps */
    bool stop;
    bool held;              /* kt_engine_hold: run only granted steps */
    long steps_granted;     /* while held: steps the engine may still run */
    bool in_step;           /* the engine thread is running a step */
    kt_request **waiting; /* sorted: best priority first, then arrival */
    int n_waiting;
    uint64_t next_arrival;
    kt_engine_stats stats;

    /* engine thread only */
    kt_request **active; /* admission order */
    int *prefill_order;  /* [n_parallel]: indices into active, shortest prefill left first */
    int n_active, seqs_running, blocks_reserved, slots_reserved; /* slots: window slots (block_pool.h) */
    size_t kv_wanted_bytes; /* a default pool cut to the memory available: what it would have taken */
    int32_t *b_tokens;
    int *b_pos;
    int *b_pos4;        /* per batch token: its M-RoPE position (4 ints), filled always */
    const float **b_embd; /* per batch token: an image's embedding row, or NULL */
    bool b_images;      /* this step's batch has a token of a request with images */
    kt_embd_cache *embd_cache; /* the vision tower's outputs by image hash; NULL: no tower */
    kt_embd_disk *embd_disk;   /* their disk tier under cache_dir; NULL: none */
    kv_seq **b_seq;
    bool *b_logits;
    bool *b_hidden;     /* per batch token: an embedding wants its hidden state */
    kt_request **b_req; /* per batch token: whose */
    int *b_choice;      /* per batch token: which choice, -1 for prefill */
    float *logits;      /* one row per token with b_logits set */
    float *row;         /* one choice's logits, biased, for sampling */
    float *hidden;      /* one row of n_embd per token with b_hidden set */
    double *t_decode_ms; /* [batch_tokens + 1]: measured cost of a decode-only step
                            by its number of tokens, proposals included (EMA; 0: unknown) */
    spec_costs costs;   /* a view of t_decode_ms for spec/policy.h */
    /* every choice's verify results, fading, per source (the guesser's, the
     * lookup's): a new choice starts from them, so an agent's next turn
     * speculates at the k its last turns earned instead of learning anew */
    spec_accept seen_guess, seen_lookup;
    int spec_max_tokens; /* proposals one step may carry (logits rows for them) */
    spec_table *spec_table; /* earlier requests' outputs; NULL: none */
    eng_draft *draft;       /* KT_SPEC_DRAFT's model; NULL: none */
    eng_draft_job *draft_jobs; /* [n_parallel] */
    int32_t *draft_ctx;     /* [n_parallel][n_ctx]: each job's tokens */
    double t_token_ms;  /* measured cost of one prefill token in chunks beside decoding (EMA) */
    bool t_token_measured_beside; /* t_token_ms comes from chunks beside decoding (update_costs) */
    double t_whole_token_ms; /* ... in steps of >= WHOLE_COST_MIN_TOKENS prefill tokens (EMA; 0: unknown) */
    bool costs_fixed;   /* kt_engine_fix_costs: the costs are not measured */
    bool step_has_whole; /* this step's prefill went past the chunk budget (a whole prompt) */
    bool trace;         /* KT_ENGINE_TRACE=1: one line per step on stderr */
    double step_guess_ms; /* this step's draft or MTP guesses (plan_speculation), not in its cost */
};

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

kt_engine_params kt_engine_defaults(void) {
    kt_engine_params p = {
        .n_ctx = 0, .n_parallel = 16, .kv_bytes = 0, .batch_tokens = 256, .n_threads = 0,
        .queue_max = 64, .kv_type = KT_KV_F16, .max_itl_stretch = 1.8f, .max_stall_ms = 5000.0f,
        .prefix_cache = true,
    };
    return p;
}

kt_gen_params kt_gen_defaults(void) {
    kt_gen_params p = {0};
    p.n_choices = 1;
    p.sampling = kt_sampler_defaults();
    p.sampling.temperature = 0.0f;
    p.top_logprobs = -1;
    return p;
}

const char *kt_finish_name(kt_finish f) {
    switch (f) {
    case KT_FINISH_STOP: return "stop";
    case KT_FINISH_LENGTH: return "length";
    case KT_FINISH_CANCELLED: return "cancelled";
    case KT_FINISH_ERROR: return "error";
    default: return NULL;
    }
}

/* ---- stats ----------------------------------------------------------- */

static void hist_add(kt_latency_hist *h, double ms) {
    int b = 0;
    while (b < KT_LAT_N_BUCKETS - 1 && ms > kt_lat_bucket_ms[b]) b++;
    h->counts[b]++;
    h->n++;
    h->sum_ms += ms;
}

/* Copies the engine thread's counts into the stats (mu held). */
static void publish_counts_locked(kt_engine *e) {
    e->stats.running = e->seqs_running;
    e->stats.requests_running = e->n_active;
    e->stats.kv_blocks_reserved = e->blocks_reserved;
    e->stats.kv_window_slots_total = kv_pool_n_window_total(e->kv);
    e->stats.kv_window_slots_used = kv_pool_n_window_used(e->kv);
    e->stats.kv_blocks_total = kv_pool_n_total(e->kv);
    e->stats.kv_blocks_used = kv_pool_n_used(e->kv);
    e->stats.kv_blocks_free = e->stats.kv_blocks_total - e->stats.kv_blocks_used; /* idle cached ones count */
    e->stats.kv_blocks_cached = e->cache ? kv_cache_n_blocks(e->cache) : 0;
    e->stats.cache_evicted_blocks = e->cache ? kv_cache_n_evicted(e->cache) : 0;
    if (e->snaps.cache) {
        e->stats.state_snapshots = kv_cache_n_states(e->cache);
        e->stats.state_snapshots_max = kv_cache_max_states(e->cache);
        e->stats.state_snapshots_evicted = kv_cache_n_states_evicted(e->cache);
        e->stats.state_snapshots_taken = e->snaps.taken;
        e->stats.state_interval = e->snaps.interval;
        e->stats.state_snapshot_bytes = kv_cache_state_bytes(e->cache);
    }
    if (e->disk) {
        kv_disk_stats ds;
        kv_disk_get_stats(e->disk, &ds);
        e->stats.disk_files = ds.files, e->stats.disk_bytes = ds.bytes, e->stats.disk_writes = ds.writes;
        e->stats.disk_reads = ds.reads, e->stats.disk_rejected = ds.rejected, e->stats.disk_removed = ds.removed;
    }
}

void kt_engine_get_stats(kt_engine *e, kt_engine_stats *out) {
    pthread_mutex_lock(&e->mu);
    *out = e->stats; /* the pool's counts as the engine thread last published them */
    out->queue_depth = e->n_waiting;
    out->kv_block_tokens = KV_BLOCK_TOKENS;
    out->kv_block_bytes = kv_pool_block_bytes(e->kv) * 2 * (size_t)kv_pool_get_params(e->kv)->n_layer;
    out->kv_wanted_bytes = e->kv_wanted_bytes;
    out->kv_pool_bytes = kv_pool_bytes(e->kv);
    const kv_state_pool *sp = kv_pool_state(e->kv);
    out->state_slots = sp ? kv_state_n_slots(sp) : 0;
    out->state_slot_bytes = sp ? kv_state_slot_bytes(sp) : 0;
    out->state_spares = sp && kv_state_spare(sp, 0);
    pthread_mutex_unlock(&e->mu);
}

/* ---- setup ----------------------------------------------------------- */

static kt_status fill_params(kt_engine *e, const kt_engine_params *in, kt_error *err) {
    kt_engine_params p = in ? *in : kt_engine_defaults();
    const llm_config *c = &e->llm->cfg;
    /* the training context up to DEFAULT_CTX_MAX: agent clients' first
     * prompts alone are 6k-22k tokens (their system prompts and tools);
     * the KV pool does not grow with it (make_kv_pool) */
    if (p.n_ctx <= 0) p.n_ctx = c->n_ctx_train < DEFAULT_CTX_MAX ? c->n_ctx_train : DEFAULT_CTX_MAX;
    if (p.n_parallel <= 0) p.n_parallel = 16;
    if (p.batch_tokens <= 0) p.batch_tokens = 256;
    if (p.queue_max <= 0) p.queue_max = 64;
    if (p.n_ctx < 2 || p.n_ctx > (1 << 22))
        return kt_error_set(err, KT_ERR_ARG, "context length %d is out of range [2, %d]", p.n_ctx, 1 << 22);
    if (p.n_parallel > 1024)
        return kt_error_set(err, KT_ERR_ARG, "--parallel %d is out of range [1, 1024]", p.n_parallel);
    if (p.batch_tokens <= p.n_parallel)
        return kt_error_set(err, KT_ERR_ARG,
                            "--batch-tokens %d must exceed --parallel %d: every step decodes one "
                            "token of each running sequence and needs room for prefill",
                            p.batch_tokens, p.n_parallel);
    if (p.spec_k_max <= 0) p.spec_k_max = 8;
    if (p.spec_k_max > SPEC_K_MAX) p.spec_k_max = SPEC_K_MAX;
    if (p.spec_table_tokens == 0) p.spec_table_tokens = 65536;
    if (p.spec == KT_SPEC_DRAFT && !p.spec_draft && !p.spec_propose)
        return kt_error_set(err, KT_ERR_ARG, "speculation with a draft model needs the draft model (--draft PATH)");
    if (p.spec == KT_SPEC_MTP && !e->llm->cfg.n_mtp)
        return kt_error_set(err, KT_ERR_UNSUPPORTED, "--spec mtp: the model (%s) has no multi-token-prediction block",
                            e->llm->cfg.arch);
    if (p.spec == KT_SPEC_DRAFT && p.spec_draft && llm_state_bytes(p.spec_draft->llm))
        return kt_error_set(err, KT_ERR_ARG, "the draft model is a hybrid model (recurrent layers): a draft's "
                            "state cannot roll back; use --spec ngram or a transformer draft model");
    kt_status st;
    if (p.vision && (st = kt_vision_check_text(kt_vision_get_info(p.vision), c->arch, c->n_embd, c->n_deepstack, err)))
        return st;
    if (p.vision && !(e->llm->cfg.rope_sections[0] + e->llm->cfg.rope_sections[1] + e->llm->cfg.rope_sections[2]))
        return kt_error_set(err, KT_ERR_UNSUPPORTED, "the model (%s) has no M-RoPE sections: kettle places images "
                            "in Qwen-VL text models (qwen2vl, qwen3vl, qwen3vlmoe, qwen35, qwen35moe)", e->llm->cfg.arch);
    if (p.image_cache_bytes == 0) p.image_cache_bytes = (size_t)512 << 20;
    e->p = p;
    return KT_OK;
}

/* Worst-case window slots of a request: each choice's own span (a
 * sequence appends at most batch_tokens at a time), plus the window the
 * choices share after the prompt (n + 1 spans), never more than its
 * blocks. */
static int slots_needed(const kt_engine *e, int blocks, int n_choices) {
    const long span = kv_window_span(kv_pool_get_params(e->kv), e->p.batch_tokens), slots = span * (n_choices + 1);
    return span == 0 ? 0 : slots < blocks ? (int)slots : blocks;
}

/* Fills kp's blocks and window slots from a budget of bytes (0: no
 * budget: ctx_blocks blocks): the window slots, at most max_slots and
 * never more than the blocks, are paid for first. */
static void split_budget(kv_pool_params *kp, size_t budget, size_t ctx_blocks, size_t max_slots) {
    const size_t layer_bytes = 2 * (size_t)kp->block_tokens * kv_row_bytes(kp->type, kp->kv_dim);
    const int n_win = kv_params_n_windowed(kp);
    const size_t full_bytes = layer_bytes * (size_t)(kp->n_layer - n_win), win_bytes = layer_bytes * (size_t)n_win;
    size_t n_blocks = ctx_blocks, n_slots = max_slots;
    if (budget && (n_win == 0 || budget / (full_bytes + win_bytes) <= max_slots))
        n_blocks = n_slots = budget / (full_bytes + win_bytes);
    else if (budget)
        n_blocks = full_bytes ? (budget - max_slots * win_bytes) / full_bytes : ctx_blocks;
    if (n_slots > n_blocks) n_slots = n_blocks;
    kp->n_blocks = n_blocks > INT_MAX ? INT_MAX : (int)n_blocks;
    kp->n_window_blocks = n_win == 0 ? 0 : (int)n_slots;
}

/* The pool: n_parallel contexts of blocks, or what the --kv-mb budget
 * holds; a default pool larger than the memory available is cut to it
 * (fewer sequences then run at once: admission waits for room), a budget
 * larger than it is refused, so the pool's pages can always be touched.
 * Sliding-window layers (Gemma) get their own slots: enough for every
 * running sequence's window twice over (the rest of the time they keep
 * finished turns' windows for the prefix cache), never more than the
 * blocks. */
static kv_pool *make_kv_pool(kt_engine *e, kt_error *err) {
    const kt_engine_params *p = &e->p;
    kv_type type;
    if (llm_kv_type(e->llm, p->kv_type, KV_F16, &type, err) != KT_OK) return NULL;
    kv_pool_params kp = llm_kv_params(e->llm, 1, KV_BLOCK_TOKENS, type);
    if (p->spec == KT_SPEC_MTP) llm_mtp_kv_params(e->llm, &kp); /* the MTP block's KV layer, cut with the rest */
    const size_t one_ctx = (size_t)((p->n_ctx + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS);
    /* n_parallel sequences of up to KT_POOL_POSITIONS_PER_SEQ each, and at
     * least one whole context: a long context then costs one context's
     * memory, not n_parallel of them (a request reserves what it may use,
     * so few long ones run at once and many short ones) */
    const size_t seq_blocks = p->n_ctx < KT_POOL_POSITIONS_PER_SEQ ? one_ctx : KT_POOL_POSITIONS_PER_SEQ / KV_BLOCK_TOKENS;
    const size_t ctx_blocks = (size_t)p->n_parallel * seq_blocks > one_ctx ? (size_t)p->n_parallel * seq_blocks : one_ctx;
    const size_t max_slots = 2 * (size_t)p->n_parallel * (size_t)kv_window_span(&kp, p->batch_tokens);
    const size_t limit = p->mem_limit ? p->mem_limit : kt_mem_budget(), mib = 1048576;
    if (p->kv_bytes && limit && p->kv_bytes > limit) {
        kt_error_set(err, KT_ERR_NOMEM, "--kv-mb %zu is more than the %zu MiB of memory available now: lower --kv-mb "
                     "(or use --kv-type q8_0)", p->kv_bytes / mib, limit / mib);
        return NULL;
    }
    /* a hybrid model: every sequence that may run at once (--parallel)
     * owns a recurrent-state slot beside its blocks, paid before them, and
     * with speculation a spare state for its verify passes (engine/rewind.h) */
    kp.n_state_slots = p->n_parallel;
    const int states_per_seq = p->spec ? 2 : 1;
    const size_t state_total = kp.state_bytes * (size_t)p->n_parallel * (size_t)states_per_seq;
    if (state_total && limit && state_total >= limit) {
        kt_error_set(err, KT_ERR_NOMEM, "the recurrent state of --parallel %d sequences needs %.0f MiB (%.1f MiB each%s) "
                     "but %zu MiB of memory are available now: lower --parallel", p->n_parallel,
                     (double)state_total / mib, (double)kp.state_bytes * states_per_seq / mib,
                     states_per_seq > 1 ? ", a spare for speculation included" : "", limit / mib);
        return NULL;
    }
    split_budget(&kp, p->kv_bytes, ctx_blocks, max_slots);
    if (!p->kv_bytes && limit && kv_params_bytes(&kp) > limit) { /* the default does not fit: the memory is the budget */
        e->kv_wanted_bytes = kv_params_bytes(&kp);
        split_budget(&kp, limit - state_total, ctx_blocks, max_slots);
        if ((size_t)kp.n_blocks < one_ctx) {
            kt_error_set(err, KT_ERR_NOMEM, "one context of %d positions needs %.0f MiB of KV cache but %zu MiB of memory "
                         "are available now: lower --ctx (or use --kv-type q8_0)", p->n_ctx,
                         (double)e->kv_wanted_bytes * (double)one_ctx / (double)ctx_blocks / mib, limit / mib);
            return NULL;
        }
    }
    if (kp.n_blocks < 1 || kp.n_blocks > 1 << 30) {
        const size_t block_bytes = 2 * (size_t)KV_BLOCK_TOKENS * kv_row_bytes(type, kp.kv_dim) * (size_t)kp.n_layer;
        kt_error_set(err, KT_ERR_ARG, "a KV budget of %.1f MiB holds %d blocks of %d positions (%.2f MiB each); give at "
                     "least one", (double)p->kv_bytes / mib, kp.n_blocks, KV_BLOCK_TOKENS, (double)block_bytes / mib);
        return NULL;
    }
    return kv_pool_new(&kp, err);
}

/* Proposals per step: at most half the budget beyond one token per
 * sequence (prefill keeps the rest), and 64 logits rows. */
static int spec_max_tokens(const kt_engine_params *p) {
    if (!p->spec) return 0;
    int n = (p->batch_tokens - p->n_parallel) / 2, by_k = p->n_parallel * p->spec_k_max;
    if (n > by_k) n = by_k;
    return n < 64 ? n : 64;
}

static bool alloc_batch(kt_engine *e) {
    e->spec_max_tokens = spec_max_tokens(&e->p);
    int cap = e->p.batch_tokens, rows = 2 * e->p.n_parallel + e->spec_max_tokens;
    size_t n_vocab = (size_t)e->llm->cfg.n_vocab;
    e->b_tokens = malloc(sizeof *e->b_tokens * (size_t)cap);
    e->b_pos = malloc(sizeof *e->b_pos * (size_t)cap);
    e->b_pos4 = malloc(sizeof *e->b_pos4 * 4 * (size_t)cap);
    e->b_embd = malloc(sizeof *e->b_embd * (size_t)cap);
    e->b_seq = malloc(sizeof *e->b_seq * (size_t)cap);
    e->b_logits = malloc(sizeof *e->b_logits * (size_t)cap);
    e->b_hidden = malloc(sizeof *e->b_hidden * (size_t)cap);
    e->hidden = malloc(sizeof(float) * (size_t)e->llm->cfg.n_embd * (size_t)cap);
    e->b_req = malloc(sizeof *e->b_req * (size_t)cap);
    e->b_choice = malloc(sizeof *e->b_choice * (size_t)cap);
    e->logits = malloc(sizeof(float) * n_vocab * (size_t)rows);
    e->row = malloc(sizeof(float) * n_vocab);
    e->active = malloc(sizeof *e->active * (size_t)e->p.n_parallel);
    e->prefill_order = malloc(sizeof *e->prefill_order * (size_t)e->p.n_parallel);
    e->waiting = malloc(sizeof *e->waiting * (size_t)e->p.queue_max);
    e->t_decode_ms = calloc((size_t)e->p.batch_tokens + 1, sizeof *e->t_decode_ms);
    e->costs = (spec_costs){e->t_decode_ms, e->p.batch_tokens, 0.0};
    if (e->p.spec == KT_SPEC_NGRAM && e->p.spec_table_tokens > 0 && !e->p.spec_propose &&
        !(e->spec_table = spec_table_new((size_t)e->p.spec_table_tokens)))
        return false;
    if (e->p.spec == KT_SPEC_DRAFT && !e->p.spec_propose &&
        (!(e->draft_jobs = calloc((size_t)e->p.n_parallel, sizeof *e->draft_jobs)) ||
         !(e->draft_ctx = malloc(sizeof *e->draft_ctx * (size_t)e->p.n_parallel * (size_t)e->p.n_ctx))))
        return false;
    e->seq_tokens = malloc(sizeof *e->seq_tokens * (size_t)e->p.n_ctx);
    e->hit_blocks = malloc(sizeof *e->hit_blocks * (size_t)(e->p.n_ctx / KV_BLOCK_TOKENS + 1));
    return e->prefill_order && e->seq_tokens && e->hit_blocks && e->t_decode_ms && e->b_tokens && e->b_pos && e->b_pos4 && e->b_embd && e->b_seq && e->b_logits && e->b_req && e->b_choice &&
           e->b_hidden && e->hidden && e->logits && e->row && e->active && e->waiting;
}

static void *engine_main(void *arg);

/* The disk tier under cache_dir, keyed by the model's KV fingerprint. */
static bool open_disk_tier(kt_engine *e, kt_error *err) {
    if (!e->p.cache_dir) return true;
    if (!e->cache) return kt_error_set(err, KT_ERR_ARG, "--cache-dir needs the prefix cache (--prefix-cache on)"), false;
    const kv_pool_params *layout = kv_pool_get_params(e->kv);
    uint64_t fp = kt_model_kv_fingerprint(e->model, (int)layout->type, layout->block_tokens, e->p.n_ctx);
    /* blocks with the MTP block's KV layer are other files: a folder of their own (other engines' unchanged) */
    if (e->mtp.llm || e->p.spec == KT_SPEC_MTP) fp = fp * 0x9E3779B97F4A7C15ull + (uint64_t)layout->n_layer;
    /* an image's KV is the tower's output, so another tower (or the same on
     * other kernels) is another folder: block keys name an image by its pixels */
    if (e->p.vision) fp = fp * 0x9E3779B97F4A7C15ull + kt_vision_fingerprint(e->p.vision);
    size_t limit = e->p.cache_disk_bytes ? e->p.cache_disk_bytes : (size_t)10 << 30;
    if (!(e->disk = kv_disk_open(e->p.cache_dir, limit, fp, layout, err))) return false;
    kv_cache_set_disk(e->cache, e->disk);
    return true;
}

/* The snapshots' memory: as asked, or 1 GiB but at most an eighth of the
 * memory the pool was sized against (eng_snaps_init keeps 8 at least). */
static size_t state_cache_budget(const kt_engine_params *p) {
    if (p->state_cache_bytes) return p->state_cache_bytes;
    const size_t avail = p->mem_limit ? p->mem_limit : kt_mem_budget(), gib = (size_t)1 << 30;
    return avail / 8 < gib ? (avail / 8 ? avail / 8 : 1) : gib;
}

kt_engine *kt_engine_new(kt_model *model, const kt_engine_params *params, kt_error *err) {
    kt_engine *e = calloc(1, sizeof *e);
    if (!e) {
        kt_error_set(err, KT_ERR_NOMEM, "out of memory");
        return NULL;
    }
    e->model = model;
    e->llm = model->llm;
    e->trace = getenv("KT_ENGINE_TRACE") && strcmp(getenv("KT_ENGINE_TRACE"), "0") != 0;
    spec_accept_init(&e->seen_guess), spec_accept_init(&e->seen_lookup);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    pthread_cond_init(&e->cv_step, NULL);
    if (fill_params(e, params, err) != KT_OK || !(e->kv = make_kv_pool(e, err)) ||
        (e->p.prefix_cache && !(e->cache = kv_cache_new(e->kv, err))) || !open_disk_tier(e, err) ||
        eng_snaps_init(&e->snaps, e->cache, llm_state_bytes(e->llm), state_cache_budget(&e->p), e->p.n_ctx,
                       KV_BLOCK_TOKENS, e->p.batch_tokens, err) != KT_OK ||
        eng_rewind_init(&e->rewind, e->llm, e->kv, e->p.n_parallel, e->p.batch_tokens,
                        e->p.spec ? spec_max_tokens(&e->p) + e->p.n_parallel : 0, err) != KT_OK ||
        !(e->work = llm_work_new(e->llm, e->p.n_ctx, err)) || !(e->pool = kt_pool_new(e->p.n_threads, err)) ||
        (e->p.spec == KT_SPEC_MTP && eng_mtp_init(&e->mtp, e->llm, e->p.n_parallel, e->p.batch_tokens, err) != KT_OK))
        goto fail;
    if (e->p.spec == KT_SPEC_DRAFT && !e->p.spec_propose &&
        !(e->draft = eng_draft_new(model, e->p.spec_draft, e->p.n_parallel, e->p.n_ctx, e->p.spec_k_max, err)))
        goto fail;
    if (e->p.vision && !(e->embd_cache = kt_embd_cache_new(e->p.image_cache_bytes))) {
        kt_error_set(err, KT_ERR_NOMEM, "out of memory");
        goto fail;
    }
    /* a quarter of the disk budget for the tower's outputs, beside the KV's */
    if (e->p.vision && e->p.cache_dir &&
        !(e->embd_disk = kt_embd_disk_open(e->p.cache_dir, e->p.vision, (e->p.cache_disk_bytes ? e->p.cache_disk_bytes
                                                                                             : (size_t)10 << 30) / 4,
                                           err)))
        goto fail;
    publish_counts_locked(e); /* no thread yet: no lock needed */
    if (!alloc_batch(e)) {
        kt_error_set(err, KT_ERR_NOMEM, "out of memory allocating the engine's batch");
        goto fail;
    }
    if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
        kt_error_set(err, KT_ERR_INTERNAL, "could not start the engine thread");
        goto fail;
    }
    e->thread_started = true;
    return e;
fail:
    kt_engine_free(e);
    return NULL;
}

const kt_engine_params *kt_engine_get_params(const kt_engine *e) {
    return &e->p;
}

/* ---- finishing ------------------------------------------------------- */

/* Indexes what the choice's sequence computed: the prompt and, once the
 * choice has started, the tokens it generated (every position the
 * sequence holds has its KV: the last sampled token was never fed). */
static void cache_choice(kt_engine *e, const kt_request *r, const gen_choice *c) {
    if (!e->cache || !c->seq) return;
    int n = c->seq->len;
    memcpy(e->seq_tokens, r->prompt, sizeof(int32_t) * (size_t)(n < r->n_prompt ? n : r->n_prompt));
    if (n > r->n_prompt) memcpy(e->seq_tokens + r->n_prompt, c->generated, sizeof(int32_t) * (size_t)(n - r->n_prompt));
    kv_cache_insert(e->cache, c->seq, e->seq_tokens, n, true);
    eng_snaps_take(&e->snaps, c->seq, e->seq_tokens, n);
}

/* A finished choice's output goes into the cross-request table, led by
 * the prompt's last tokens (so a reply's start is found from its prompt). */
static void table_choice(kt_engine *e, const kt_request *r, const gen_choice *c) {
    if (!e->spec_table || c->n_generated == 0) return;
    const int lead = r->n_prompt < SPEC_TABLE_NGRAM ? r->n_prompt : SPEC_TABLE_NGRAM;
    if (lead + c->n_generated > e->p.n_ctx) return;
    memcpy(e->seq_tokens, r->prompt + r->n_prompt - lead, sizeof(int32_t) * (size_t)lead);
    memcpy(e->seq_tokens + lead, c->generated, sizeof(int32_t) * (size_t)c->n_generated);
    spec_table_add(e->spec_table, e->seq_tokens, lead + c->n_generated);
}

static void choice_release(gen_choice *c) {
    free(c->generated);
    kv_seq_free(c->seq);
    kv_seq_free(c->draft_seq);
    kt_sampler_free(c->sampler);
    kt_constraint_free(c->constraint);
    eng_watch_free(&c->watch);
    kt_detok_free(c->detok);
    free(c->held);
    memset(c, 0, sizeof *c);
}

/* Queues an event; if it cannot be queued (out of memory) the request is
 * cancelled at the next step, and the client sees each unfinished choice
 * end in error after the events queued before (request.h, `lost`). */
static void push_event(kt_request *r, const kt_event *ev) {
    if (!req_push(r, ev)) atomic_store(&r->cancel, true);
}

static void finish_only_event(kt_request *r, int choice, kt_finish f, const char *msg) {
    kt_event ev = {.choice = choice, .token = -1, .text = "", .finish = f, .t_ns = now_ns()};
    if (msg) snprintf(ev.error, sizeof ev.error, "%s", msg);
    push_event(r, &ev);
}

/* The engine could not go on with r (which the block reservation should
 * rule out): every unfinished choice ends in error, and the next step's
 * reap retires the request. */
static void fail_request(kt_request *r, const char *msg) {
    for (int i = 0; i < r->n_choices; i++) {
        if (r->choices[i].finish != KT_FINISH_NONE) continue;
        r->choices[i].finish = KT_FINISH_ERROR;
        finish_only_event(r, i, KT_FINISH_ERROR, msg);
    }
    atomic_store(&r->cancel, true);
}

/* All choices done: the request leaves the engine. */
static void retire(kt_engine *e, kt_request *r) {
    kt_finish worst = KT_FINISH_STOP;
    for (int i = 0; i < r->n_choices; i++) {
        if (r->choices[i].finish > worst || i == 0) worst = r->choices[i].finish;
        cache_choice(e, r, &r->choices[i]);
        table_choice(e, r, &r->choices[i]);
        choice_release(&r->choices[i]);
    }
    if (r->state != REQ_WAITING) {
        e->blocks_reserved -= r->blocks_reserved;
        e->slots_reserved -= r->slots_reserved;
        e->seqs_running -= r->n_choices;
    }
    req_images_release(&r->images, e->embd_cache);
    r->state = REQ_DONE;
    pthread_mutex_lock(&r->mu);
    r->usage.done_ns = now_ns();
    pthread_mutex_unlock(&r->mu);
    /* the stats first, so a client that sees the end sees the blocks back */
    pthread_mutex_lock(&e->mu);
    e->stats.requests_finished[worst]++;
    publish_counts_locked(e);
    pthread_mutex_unlock(&e->mu);
    req_finish(r);
    req_notify(r);
    req_release(r);
}

/* Ends every unfinished choice with f and retires the request. */
static void end_request(kt_engine *e, kt_request *r, kt_finish f, const char *msg) {
    for (int i = 0; i < r->n_choices; i++) {
        if (r->choices[i].finish != KT_FINISH_NONE) continue;
        r->choices[i].finish = f;
        finish_only_event(r, i, f, msg);
    }
    retire(e, r);
}

static void remove_active(kt_engine *e, int i) {
    memmove(e->active + i, e->active + i + 1, sizeof *e->active * (size_t)(e->n_active - i - 1));
    e->n_active--;
}

/* A request whose client has hung up is cancelled like any other. */
static bool cancelled(kt_request *r) {
    if (!atomic_load(&r->cancel) && req_client_gone(r)) atomic_store(&r->cancel, true);
    return atomic_load(&r->cancel);
}

/* Asks each waiting request's client whether it is still there. The
 * callbacks run outside e->mu (they take the client's locks); a waiting
 * request cannot be freed meanwhile: the engine holds a reference. */
static void check_waiting_clients(kt_engine *e) {
    kt_request *snap[64];
    int n = 0;
    pthread_mutex_lock(&e->mu);
    for (int i = 0; i < e->n_waiting && n < 64; i++) snap[n++] = e->waiting[i];
    pthread_mutex_unlock(&e->mu);
    for (int i = 0; i < n; i++) cancelled(snap[i]);
}

static void reap_cancelled(kt_engine *e) {
    for (int i = 0; i < e->n_active;) {
        kt_request *r = e->active[i];
        if (!cancelled(r)) {
            i++;
            continue;
        }
        remove_active(e, i);
        end_request(e, r, KT_FINISH_CANCELLED, NULL);
    }
    /* waiting ones: take them out under the lock, end them outside it */
    check_waiting_clients(e);
    kt_request *gone[64];
    int n_gone = 0;
    pthread_mutex_lock(&e->mu);
    for (int i = 0; i < e->n_waiting && n_gone < 64;) {
        if (atomic_load(&e->waiting[i]->cancel)) {
            gone[n_gone++] = e->waiting[i];
            memmove(e->waiting + i, e->waiting + i + 1, sizeof *e->waiting * (size_t)(e->n_waiting - i - 1));
            e->n_waiting--;
        } else {
            i++;
        }
    }
    pthread_mutex_unlock(&e->mu);
    for (int i = 0; i < n_gone; i++) end_request(e, gone[i], KT_FINISH_CANCELLED, NULL);
}

/* ---- admission ------------------------------------------------------- */

/* Worst-case blocks of a request: the prompt's, shared, plus for each
 * choice its own growth, plus the copies of a shared partial last block:
 * the first n - 1 choices to write into it copy it (copy-on-write), the
 * last finds it unshared and writes in place. One choice, or a prompt
 * that ends on a block boundary, copies nothing, so --parallel requests
 * of a full context fit the default pool of --parallel contexts. */
static int blocks_needed(const kv_pool *kv, int n_prompt, int max_tokens, int n_choices) {
    int prompt = kv_blocks_for(kv, n_prompt);
    int total = kv_blocks_for(kv, n_prompt + max_tokens);
    bool partial = n_prompt % KV_BLOCK_TOKENS != 0;
    return prompt + n_choices * (total - prompt) + (partial ? n_choices - 1 : 0);
}

/* The prompt's longest cached prefix, leaving at least one token to
 * prefill (its logits give the first token). The hit may end inside a
 * block (a cached block whose first positions match, or the tail a
 * finished turn left): the sequence copies that block before its first
 * write, so no cached block is ever written; the copy is taken only when
 * the request's reservation covers it (one block more than the hit
 * holds). Returns the positions taken. */
static int take_cached_prefix(kt_engine *e, kt_request *r, kv_seq *seq) {
    if (!e->cache) return 0;
    kv_cache_hit hit;
    int m = kv_cache_acquire(e->cache, r->prompt, r->n_prompt - 1, e->hit_blocks, r->n_prompt / KV_BLOCK_TOKENS,
                             true, &hit);
    if (m * KV_BLOCK_TOKENS > hit.n_positions && r->blocks_reserved < m + 1) {
        kv_pool_release(e->kv, e->hit_blocks[--m], NULL);
        hit.n_positions = m * KV_BLOCK_TOKENS;
        if (hit.state >= 0) /* the snapshot was the tail's: no state for the whole blocks */
            while (m > 0) kv_pool_release(e->kv, e->hit_blocks[--m], NULL);
    }
    /* a hybrid model's hit comes with the state after it (kv/prefix_cache.h) */
    const float *state = m > 0 && hit.state >= 0 ? kv_cache_state_data(e->cache, hit.state) : NULL;
    bool ok = m > 0 && kv_seq_share_state(seq, e->hit_blocks, m, hit.n_positions, state, NULL) == KT_OK;
    if (ok && state) {
        pthread_mutex_lock(&e->mu);
        e->stats.state_snapshot_hits++;
        pthread_mutex_unlock(&e->mu);
    }
    for (int i = 0; i < m; i++) kv_pool_release(e->kv, e->hit_blocks[i], NULL); /* the sequence holds them now */
    if (hit.from_disk) {
        pthread_mutex_lock(&e->mu);
        e->stats.disk_cached_prompt_tokens += (uint64_t)hit.from_disk * KV_BLOCK_TOKENS;
        pthread_mutex_unlock(&e->mu);
    }
    return ok ? hit.n_positions : 0;
}

/* Counts a hit that grew to n_cached positions (from `before`). */
static void note_cached(kt_engine *e, kt_request *r, int before) {
    pthread_mutex_lock(&r->mu);
    r->usage.cached_tokens = r->n_cached;
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_lock(&e->mu);
    e->stats.cached_prompt_tokens += (uint64_t)(r->n_cached - before);
    pthread_mutex_unlock(&e->mu);
}

static bool start_request(kt_engine *e, kt_request *r) {
    kt_error err;
    gen_choice *c0 = &r->choices[0];
    r->state = REQ_PREFILL; /* admitted: retire gives its reservation back, also when it fails here */
    if (!(c0->seq = kv_seq_new(e->kv, &err))) return false;
    eng_mtp_forget(&e->mtp, c0->seq->state_slot);
    /* an embedding needs every token's hidden state: it computes them all */
    r->n_prefilled = r->n_cached = r->embed ? 0 : take_cached_prefix(e, r, c0->seq);
    note_cached(e, r, 0);
    return true;
}

/* Positions of a's and b's prompts that are equal from the start, in
 * whole blocks. */
static int shared_blocks_len(const kt_request *a, const kt_request *b) {
    int n = a->n_prompt < b->n_prompt ? a->n_prompt : b->n_prompt, k = 0;
    while (k < n && a->prompt[k] == b->prompt[k]) k++;
    return k / KV_BLOCK_TOKENS * KV_BLOCK_TOKENS;
}

/* Before r computes anything of its own: if an earlier request has since
 * put more of r's prefix in the cache, take it (the sequence holds only
 * cached blocks, so it starts over on the longer hit); and if an earlier
 * request is still computing a prefix r shares, r waits for it instead of
 * computing the same KV beside it. */
static void share_prefix(kt_engine *e, int a_index) {
    kt_request *r = e->active[a_index];
    r->waits_for_prefix = false;
    if (!e->cache || r->state != REQ_PREFILL || r->n_prefilled != r->n_cached || r->embed) return;
    kv_seq *seq = r->choices[0].seq;
    int m = kv_cache_lookup(e->cache, r->prompt, r->n_prompt - 1, e->hit_blocks, r->n_prompt / KV_BLOCK_TOKENS);
    if (m * KV_BLOCK_TOKENS > r->n_cached) {
        kv_seq_truncate(seq, 0, NULL);
        int before = r->n_cached;
        r->n_prefilled = r->n_cached = take_cached_prefix(e, r, seq);
        if (r->n_cached > before) note_cached(e, r, before);
    }
    for (int a = 0; a < a_index && !r->waits_for_prefix; a++) {
        const kt_request *o = e->active[a];
        if (o->state != REQ_PREFILL || o->waits_for_prefix) continue;
        const int shared = shared_blocks_len(o, r);
        r->waits_for_prefix = o->n_prefilled < shared && shared > r->n_cached;
        /* a hybrid model's prefix is of use to r only with the state at its end */
        if (r->waits_for_prefix && shared > o->snap_extra) e->active[a]->snap_extra = shared;
    }
}

#define MAX_PASSED_OVER 4 /* then a request is admitted before any cache hit */

/* Whole blocks of r's prompt the cache holds in memory now. */
static int cached_blocks(kt_engine *e, const kt_request *r) {
    return kv_cache_lookup(e->cache, r->prompt, r->n_prompt - 1, e->hit_blocks, r->n_prompt / KV_BLOCK_TOKENS);
}

/* Which waiting request goes next (mu held): among those of the best
 * priority, the one with the longest cached prefix (its prefill is the
 * shortest, and its blocks are reused before they age out), ties in
 * arrival order; a request passed over MAX_PASSED_OVER times goes first,
 * so none starves. */
static int next_waiting_locked(kt_engine *e) {
    kt_request *head = e->waiting[0];
    /* no sequence free: nothing can be admitted, so no lookups (this runs
     * every step, under mu, while requests queue) */
    const bool room = e->n_active < e->p.n_parallel && e->seqs_running < e->p.n_parallel;
    if (!e->cache || !room || head->passed_over >= MAX_PASSED_OVER) return 0;
    int best = 0, best_blocks = cached_blocks(e, head);
    for (int i = 1; i < e->n_waiting && e->waiting[i]->priority == head->priority; i++) {
        int b = cached_blocks(e, e->waiting[i]);
        if (b > best_blocks) best = i, best_blocks = b;
    }
    return best;
}

static void admit(kt_engine *e) {
    for (;;) {
        pthread_mutex_lock(&e->mu);
        int k = e->n_waiting ? next_waiting_locked(e) : 0;
        kt_request *r = e->n_waiting ? e->waiting[k] : NULL;
        bool fits = r && e->seqs_running + r->n_choices <= e->p.n_parallel &&
                    e->n_active < e->p.n_parallel &&
                    e->blocks_reserved + r->blocks_reserved <= kv_pool_n_total(e->kv) &&
                    e->slots_reserved + r->slots_reserved <= kv_pool_n_window_total(e->kv);
        if (fits) {
            for (int i = 0; i < k; i++) e->waiting[i]->passed_over++;
            memmove(e->waiting + k, e->waiting + k + 1, sizeof *e->waiting * (size_t)(e->n_waiting - k - 1));
            e->n_waiting--;
        }
        pthread_mutex_unlock(&e->mu);
        if (!fits) return;
        e->blocks_reserved += r->blocks_reserved;
        e->slots_reserved += r->slots_reserved;
        e->seqs_running += r->n_choices;
        e->active[e->n_active++] = r;
        if (!start_request(e, r)) {
            remove_active(e, e->n_active - 1);
            end_request(e, r, KT_FINISH_ERROR, "out of memory starting the request");
        }
    }
}

/* ---- submit ---------------------------------------------------------- */

/* Checks what a request asks for; *field names the parameter at fault. */
static kt_status check_gen_params(kt_engine *e, const kt_gen_params *p, int *max_tokens, kt_gen_field *field,
                                  kt_error *err) {
    const int n_ctx = e->p.n_ctx, n_vocab = e->llm->cfg.n_vocab;
    *field = KT_FIELD_PROMPT;
    if (!p->prompt || p->n_prompt < 1) return kt_error_set(err, KT_ERR_ARG, "the prompt is empty");
    if (p->embed && p->n_prompt > n_ctx)
        return kt_error_set(err, KT_ERR_CONTEXT, "the input has %d tokens but the context holds %d", p->n_prompt, n_ctx);
    if (!p->embed && p->n_prompt >= n_ctx)
        return kt_error_set(err, KT_ERR_CONTEXT,
                            "the prompt has %d tokens but the context holds %d, and at least one "
                            "must be left to generate",
                            p->n_prompt, n_ctx);
    if (p->prefill_only && (p->embed || p->n_choices != 1))
        return kt_error_set(err, KT_ERR_ARG, "a prefill-only request has one choice and no embedding");
    if (p->n_images && p->embed)
        return kt_error_set(err, KT_ERR_UNSUPPORTED, "an embedding request cannot have images");
    if (p->n_images && !(e->llm->cfg.rope_sections[0] + e->llm->cfg.rope_sections[1] + e->llm->cfg.rope_sections[2]))
        return kt_error_set(err, KT_ERR_UNSUPPORTED, "the model (%s) takes no images", e->llm->cfg.arch);
    for (int i = 0, im = 0; i < p->n_prompt; i++) {
        if (im < p->n_images && p->images && i >= p->images[im].at) { /* an image's tokens: submit writes their keys */
            const long end = (long)p->images[im].at + (long)p->images[im].grid_x * p->images[im].grid_y;
            i = end - 1 < p->n_prompt ? (int)end - 1 : p->n_prompt;
            im++;
            continue;
        }
        if (p->prompt[i] < 0 || p->prompt[i] >= n_vocab)
            return kt_error_set(err, KT_ERR_ARG, "prompt token %d at index %d is outside the vocabulary [0, %d)",
                                p->prompt[i], i, n_vocab);
    }
    *field = KT_FIELD_MAX_TOKENS;
    /* max_tokens is a cap, not a promise: past the room the context leaves
     * it is cut to that room and the reply may end at "length", as
     * llama-server and Ollama do (agent clients ask for 32000 or 64000
     * whatever the model); strict_max_tokens refuses it instead. */
    const int room = n_ctx - p->n_prompt;
    *max_tokens = p->embed ? 0 : p->max_tokens > 0 ? p->max_tokens : room;
    if (!p->embed && *max_tokens > room) {
        if (e->p.strict_max_tokens)
            return kt_error_set(err, KT_ERR_CONTEXT,
                                "max_tokens %d is too large: the prompt has %d tokens and the context "
                                "holds %d, so at most %d can be generated",
                                p->max_tokens, p->n_prompt, n_ctx, room);
        *max_tokens = room;
    }
    *field = KT_FIELD_N_CHOICES;
    if (p->embed && p->n_choices != 1) return kt_error_set(err, KT_ERR_ARG, "an embedding has one choice");
    if (p->n_choices < 1 || p->n_choices > KT_MAX_CHOICES || p->n_choices > e->p.n_parallel)
        return kt_error_set(err, KT_ERR_ARG, "n = %d is out of range [1, %d]", p->n_choices,
                            KT_MAX_CHOICES < e->p.n_parallel ? KT_MAX_CHOICES : e->p.n_parallel);
    *field = KT_FIELD_STOP;
    if (p->n_stop < 0 || p->n_stop > KT_MAX_STOP || (p->n_stop > 0 && !p->stop))
        return kt_error_set(err, KT_ERR_ARG, "at most %d stop strings are allowed (got %d)", KT_MAX_STOP, p->n_stop);
    for (int i = 0; i < p->n_stop; i++)
        if (!p->stop[i] || !p->stop[i][0]) return kt_error_set(err, KT_ERR_ARG, "stop string %d is empty", i);
    *field = KT_FIELD_TOP_LOGPROBS;
    if (p->top_logprobs < -1 || p->top_logprobs > KT_MAX_TOP_LOGPROBS)
        return kt_error_set(err, KT_ERR_ARG, "top_logprobs %d is out of range [0, %d]", p->top_logprobs,
                            KT_MAX_TOP_LOGPROBS);
    *field = KT_FIELD_LOGIT_BIAS;
    for (int i = 0; i < p->n_logit_bias; i++)
        if (p->logit_bias[i].token < 0 || p->logit_bias[i].token >= n_vocab)
            return kt_error_set(err, KT_ERR_ARG, "logit_bias token %d is outside the vocabulary [0, %d)",
                                p->logit_bias[i].token, n_vocab);
    *field = KT_FIELD_MAX_TOKENS; /* the KV a request needs grows with it */
    int need = blocks_needed(e->kv, p->n_prompt, *max_tokens, p->n_choices);
    if (need > kv_pool_n_total(e->kv) && !p->embed && !e->p.strict_max_tokens) {
        /* the same for a pool smaller than n_parallel contexts: the most
         * that fits (blocks_needed grows with max_tokens) */
        int lo = 0, hi = *max_tokens;
        while (lo < hi) {
            int mid = lo + (hi - lo + 1) / 2;
            if (blocks_needed(e->kv, p->n_prompt, mid, p->n_choices) <= kv_pool_n_total(e->kv)) lo = mid;
            else hi = mid - 1;
        }
        if (lo > 0) *max_tokens = lo, need = blocks_needed(e->kv, p->n_prompt, lo, p->n_choices);
    }
    if (need > kv_pool_n_total(e->kv))
        return kt_error_set(err, KT_ERR_ARG,
                            "the request needs up to %d KV blocks of %d positions (%d prompt + %d new "
                            "tokens, %d choices) but the KV pool has %d; lower max_tokens or n, or "
                            "start the server with a larger --kv-mb",
                            need, KV_BLOCK_TOKENS, p->n_prompt, *max_tokens, p->n_choices,
                            kv_pool_n_total(e->kv));
    const int slots = slots_needed(e, need, p->n_choices);
    if (slots > kv_pool_n_window_total(e->kv))
        return kt_error_set(err, KT_ERR_ARG,
                            "the request needs up to %d sliding-window KV slots (%d choices) but the pool has "
                            "%d; lower n, or start the server with a larger --kv-mb",
                            slots, p->n_choices, kv_pool_n_window_total(e->kv));
    *field = KT_FIELD_NONE;
    return KT_OK;
}

/* Sorted insert: best priority first, then arrival order. */
static void enqueue_locked(kt_engine *e, kt_request *r) {
    int i = e->n_waiting;
    while (i > 0 && e->waiting[i - 1]->priority < r->priority) i--;
    memmove(e->waiting + i + 1, e->waiting + i, sizeof *e->waiting * (size_t)(e->n_waiting - i));
    e->waiting[i] = r;
    e->n_waiting++;
}

kt_status kt_engine_submit(kt_engine *e, const kt_gen_params *p, kt_request **out, kt_error *err) {
    return kt_engine_submit_ex(e, p, out, err, NULL);
}

kt_status kt_engine_submit_ex(kt_engine *e, const kt_gen_params *p, kt_request **out, kt_error *err,
                              kt_gen_field *field) {
    int max_tokens = 0;
    kt_gen_field f_local;
    if (!field) field = &f_local;
    *out = NULL;
    kt_status st = check_gen_params(e, p, &max_tokens, field, err);
    if (st != KT_OK) return eng_images_free_given(p), st;
    kt_grammar *g = NULL;
    if (p->grammar && !(g = kt_grammar_parse(p->grammar, p->grammar_len, NULL, err))) {
        *field = KT_FIELD_GRAMMAR;
        return eng_images_free_given(p), kt_error_wrap(err, "grammar");
    }
    eng_triggers trig;
    if ((st = eng_triggers_init(&trig, p, err)) != KT_OK) {
        kt_grammar_free(g);
        *field = KT_FIELD_GRAMMAR;
        return eng_images_free_given(p), st;
    }
    kt_request *r = req_new(p, err);
    if (!r) return kt_grammar_free(g), eng_triggers_free(&trig), eng_images_free_given(p), KT_ERR_NOMEM;
    *field = KT_FIELD_PROMPT;
    if ((st = req_images_copy(&r->images, p, r->prompt, (int)llm_embd_row_floats(&e->llm->cfg), e->p.vision != NULL,
                              err)) != KT_OK) {
        kt_grammar_free(g), eng_triggers_free(&trig);
        req_release(r), req_release(r);
        return st;
    }
    r->grammar = g;
    r->triggers = trig;
    r->special_text = p->special_text;
    r->max_tokens = max_tokens;
    if (r->embed && !(r->embd = calloc((size_t)e->llm->cfg.n_embd, sizeof *r->embd))) {
        req_release(r), req_release(r);
        return kt_error_set(err, KT_ERR_NOMEM, "out of memory for the embedding");
    }
    r->n_embd = e->llm->cfg.n_embd;
    r->blocks_reserved = blocks_needed(e->kv, p->n_prompt, max_tokens, p->n_choices);
    r->slots_reserved = slots_needed(e, r->blocks_reserved, p->n_choices);
    r->usage.submit_ns = now_ns();
    pthread_mutex_lock(&e->mu);
    if (e->stop || e->n_waiting >= e->p.queue_max) {
        bool stopping = e->stop;
        pthread_mutex_unlock(&e->mu);
        req_release(r), req_release(r);
        return stopping ? kt_error_set(err, KT_ERR_BUSY, "the server is shutting down")
                        : kt_error_set(err, KT_ERR_BUSY, "the server is busy: %d requests are already waiting",
                                       e->p.queue_max);
    }
    r->arrival = e->next_arrival++;
    enqueue_locked(e, r);
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    *out = r;
    return KT_OK;
}

/* ---- sampling and output --------------------------------------------- */

static bool start_choice(kt_engine *e, kt_request *r, int i) {
    gen_choice *c = &r->choices[i];
    kt_error err;
    kt_sampler_params sp = r->sampling;
    sp.seed += (uint64_t)i;
    sp.penalty_last_n = r->max_tokens; /* penalties see the whole output (OpenAI's rule) */
    if (i > 0 && !(c->seq = kv_seq_fork(r->choices[0].seq, &err))) return false;
    if (i > 0) eng_mtp_fork(&e->mtp, r->choices[0].seq->state_slot, c->seq->state_slot);
    c->sampler = kt_sampler_new(&sp, e->llm->cfg.n_vocab, &err);
    if (r->grammar && !(c->constraint = eng_grammar_start(&e->gram, e->model, r->grammar, &err))) return false;
    c->detok = kt_detok_new_ex(e->model, r->special_text);
    c->generated = malloc(sizeof *c->generated * (size_t)r->max_tokens);
    spec_accept_inherit(&c->accept, &e->seen_guess);
    spec_accept_inherit(&c->accept_lookup, &e->seen_lookup);
    return c->sampler && c->detok && c->generated;
}

/* ln p of every token from biased logits: the log-sum-exp in double. */
static double log_normalizer(const float *x, int n) {
    float max = x[0];
    for (int i = 1; i < n; i++) max = x[i] > max ? x[i] : max;
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += exp((double)x[i] - max);
    return max + log(sum);
}

/* The k most likely tokens, best first (ties: lower id first). */
static int top_tokens(const float *x, int n, int k, double lse, kt_token_logprob *top) {
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m == k && x[i] <= x[top[m - 1].token]) continue;
        int j = m < k ? m++ : k - 1;
        while (j > 0 && x[top[j - 1].token] < x[i]) {
            top[j] = top[j - 1];
            j--;
        }
        top[j].token = i;
    }
    for (int j = 0; j < m; j++) top[j].logprob = (float)(x[top[j].token] - lse);
    return m;
}

/* Length of the longest suffix of s[0, n) that is a proper prefix of a
 * stop string: that much must be held back. */
static size_t stop_prefix_tail(const kt_request *r, const char *s, size_t n) {
    size_t best = 0;
    for (int k = 0; k < r->n_stop; k++) {
        size_t max = r->stop_len[k] - 1 < n ? r->stop_len[k] - 1 : n;
        for (size_t len = max; len > best; len--)
            if (memcmp(s + n - len, r->stop[k], len) == 0) {
                best = len;
                break;
            }
    }
    return best;
}

static bool held_append(gen_choice *c, const char *s, size_t n) {
    if (c->held_len + n + 1 > c->held_cap) {
        size_t cap = (c->held_len + n + 1) * 2;
        char *h = realloc(c->held, cap);
        if (!h) return false;
        c->held = h, c->held_cap = cap;
    }
    memcpy(c->held + c->held_len, s, n);
    c->held_len += n;
    c->held[c->held_len] = 0;
    return true;
}

/* Takes the releasable part of the held text: all of it when the choice
 * is ending, else all but a tail that may start a stop string; up to a
 * stop string when one has completed (ev->finish becomes STOP). Returns a
 * malloc'd copy (NULL: out of memory). */
static char *release_text(const kt_request *r, gen_choice *c, kt_event *ev) {
    size_t emit = c->held_len;
    for (int k = 0; k < r->n_stop; k++) {
        const char *hit = memmem(c->held, c->held_len, r->stop[k], r->stop_len[k]);
        if (hit && (size_t)(hit - c->held) < emit + (ev->stop_string == 0)) {
            emit = (size_t)(hit - c->held);
            ev->finish = KT_FINISH_STOP;
            ev->stop_string = k + 1; /* the earliest match; the first listed of those at one place */
        }
    }
    /* an ending choice releases everything before any stop string */
    const size_t keep = ev->finish == KT_FINISH_NONE ? stop_prefix_tail(r, c->held, c->held_len) : 0;
    emit -= keep;
    char *out = malloc(emit + 1);
    if (!out) return NULL;
    memcpy(out, c->held, emit);
    out[emit] = 0;
    memmove(c->held, c->held + c->held_len - keep, keep);
    c->held_len = keep;
    return out;
}

static void record_latency(kt_engine *e, kt_request *r, gen_choice *c, uint64_t t) {
    pthread_mutex_lock(&r->mu);
    bool first = r->usage.first_token_ns == 0;
    if (first) r->usage.first_token_ns = t;
    r->usage.completion_tokens++;
    uint64_t submit = r->usage.submit_ns;
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_lock(&e->mu);
    if (first) hist_add(&e->stats.ttft, (double)(t - submit) / 1e6);
    else if (c->last_token_ns) hist_add(&e->stats.itl, (double)(t - c->last_token_ns) / 1e6);
    e->stats.generated_tokens++;
    pthread_mutex_unlock(&e->mu);
    c->last_token_ns = t;
}

static float bias_of(const kt_request *r, int32_t id) {
    float b = 0.0f;
    for (int i = 0; i < r->n_bias; i++)
        if (r->bias[i].token == id) b += r->bias[i].bias;
    return b;
}

/* Queues the event of a sampled token: its text (through the stop-string
 * hold-back), and the choice's end if it ended. */
static void emit_token(kt_engine *e, kt_request *r, int i, kt_event *ev) {
    gen_choice *c = &r->choices[i];
    const int32_t id = ev->token;
    bool ok = true;
    if ((!r->ignore_eos || c->constraint) && kt_token_is_eog(e->model, id)) {
        ev->token = -1; /* the end-of-turn token itself is not output */
        ev->has_logprob = false, ev->n_top = 0;
        ev->finish = KT_FINISH_STOP;
    } else {
        const char *piece = kt_detok_push(c->detok, id);
        const size_t n_piece = strlen(piece);
        int follow = r->grammar || r->triggers.n ? eng_grammar_follow(&e->gram, e->model, r->grammar, &r->triggers,
                                                                      &c->watch, &c->constraint, piece, n_piece)
                                                 : 0;
        ok = follow >= 0 && held_append(c, piece, n_piece);
        if (follow > 0) ev->finish = KT_FINISH_STOP; /* the last grammar is done: nothing can follow */
        else if (c->n_generated >= r->max_tokens || r->n_prompt + c->n_generated >= e->p.n_ctx)
            ev->finish = KT_FINISH_LENGTH;
    }
    if (ok && ev->finish != KT_FINISH_NONE) {
        const char *tail = kt_detok_flush(c->detok);
        ok = held_append(c, tail, strlen(tail));
    }
    char *text = ok ? release_text(r, c, ev) : NULL;
    if (!text) {
        ev->finish = KT_FINISH_ERROR;
        snprintf(ev->error, sizeof ev->error, "out of memory holding generated text");
    }
    ev->text = text ? text : "";
    ev->text_len = text ? strlen(text) : 0;
    push_event(r, ev);
    free(text);
    c->finish = ev->finish;
}

/* Samples choice i of r from its logits row and queues the event. */
static void sample_choice(kt_engine *e, kt_request *r, int i, const float *logits) {
    gen_choice *c = &r->choices[i];
    const int n_vocab = e->llm->cfg.n_vocab;
    float *x = e->row;
    memcpy(x, logits, sizeof(float) * (size_t)n_vocab);
    for (int b = 0; b < r->n_bias; b++) x[r->bias[b].token] += r->bias[b].bias;
    kt_event ev = {.choice = i};
    double lse = 0.0;
    if (r->top_logprobs >= 0) {
        lse = log_normalizer(x, n_vocab);
        ev.n_top = top_tokens(x, n_vocab, r->top_logprobs, lse, ev.top);
    }
    const int32_t id = c->constraint ? eng_grammar_sample(&e->gram, c->constraint, c->sampler, &r->sampling, x, n_vocab)
                                     : kt_sampler_sample(c->sampler, x); /* edits x */
    if (id < 0) { /* a grammar that parsed can always go on or end, unless it hit a limit */
        const char *why = kt_constraint_error(c->constraint);
        char msg[160];
        snprintf(msg, sizeof msg, "grammar: %s", why ? why : "no token is allowed here");
        c->finish = KT_FINISH_ERROR;
        finish_only_event(r, i, KT_FINISH_ERROR, msg);
        return;
    }
    kt_sampler_accept(c->sampler, id);
    ev.token = id;
    ev.t_ns = now_ns();
    if (r->top_logprobs >= 0) {
        ev.has_logprob = true;
        ev.logprob.token = id;
        ev.logprob.logprob = (float)((double)logits[id] + bias_of(r, id) - lse);
    }
    record_latency(e, r, c, ev.t_ns);
    c->generated[c->n_generated++] = id;
    c->next_token = id;
    emit_token(e, r, i, &ev);
}

/* ---- the step -------------------------------------------------------- */

/* Batch token n's M-RoPE position, from its index b_pos[n]: shifted past
 * the request's images, or (p, p, p, 0) in a request without any. */
static void batch_pos4(kt_engine *e, const kt_request *r, int n) {
    int *p4 = e->b_pos4 + 4 * (size_t)n;
    if (r->images.n) {
        req_images_pos4(&r->images, e->b_pos[n], p4);
        e->b_images = true;
    } else {
        p4[0] = p4[1] = p4[2] = e->b_pos[n], p4[3] = 0;
    }
}

/* A token at position seq->len - 1 - after (after: tokens of the same
 * sequence that follow it in this step, already appended). */
static void batch_add(kt_engine *e, int *n, kt_request *r, int choice, kv_seq *seq, int32_t tok, bool logits,
                      int after) {
    e->b_tokens[*n] = tok;
    e->b_pos[*n] = seq->len - 1 - after;
    e->b_embd[*n] = NULL;
    batch_pos4(e, r, *n);
    e->b_seq[*n] = seq;
    e->b_logits[*n] = logits;
    e->b_hidden[*n] = false;
    if (e->snaps.b_snap) e->snaps.b_snap[*n] = NULL;
    e->b_req[*n] = r;
    e->b_choice[*n] = choice;
    (*n)++;
}

/* The measured cost of a decode-only step of n tokens; 0 while unknown.
 * Per n, because it grows with n, and an estimate borrowed from another n
 * sizes prefill chunks wrongly; every n is learned once (one decode-only
 * step) and then kept current by later decode-only steps. */
static double decode_cost_ms(const kt_engine *e, int n) {
    return e->t_decode_ms[n < e->p.batch_tokens ? n : e->p.batch_tokens];
}

/* What a decode-only step of n tokens costs, as prefill is sized and
 * measured against it: the measured cost; with speculation, whose
 * proposals vary the decode tokens step to step, else the nearest smaller
 * measured step's (spec_cost), so prefill is neither held back nor left
 * unmeasured while each size is learned. 0 while unknown. */
static double decode_step_ms(const kt_engine *e, int n) {
    const double ms = decode_cost_ms(e, n);
    return ms <= 0.0 && e->spec_max_tokens ? spec_cost(&e->costs, n) : ms;
}

/* What a step's prefill may hold beside n_decode decode tokens (the
 * scheduling rule at the top of this file). */
typedef struct prefill_budget {
    int chunk_tokens; /* in all, for prompts the step does not finish: the stretch */
    int whole_tokens; /* in all, where the step finishes prompts: the stretch and the stall; may exceed
                       * the batch (a whole remainder then takes whole steps until it is in) */
} prefill_budget;

/* A prefill token's cost in a step that carries a whole prompt: what
 * large steps measured, once they have (see update_costs). */
static double whole_token_ms(const kt_engine *e) {
    return e->t_whole_token_ms > 0.0 ? e->t_whole_token_ms : e->t_token_ms;
}

/* How many prefill tokens cost about ms at per_token_ms (at least 1, at
 * most cap). */
static int tokens_costing(double ms, double per_token_ms, int cap) {
    const double n = ms / per_token_ms;
    return n < 1.0 ? 1 : n < cap ? (int)n : cap;
}

static prefill_budget plan_prefill(const kt_engine *e, int n_decode) {
    const int room = e->p.batch_tokens - n_decode;
    prefill_budget b = {room, room};
    if (n_decode == 0 || e->p.max_itl_stretch <= 1.0f) return b;
    /* a decode-only step first while this decode cost is unknown, then a
     * small chunk to learn the prefill cost */
    const double t_decode = decode_step_ms(e, n_decode);
    if (t_decode <= 0.0) {
        b.chunk_tokens = b.whole_tokens = 0;
        return b;
    }
    if (e->t_token_ms <= 0.0) { /* short prompts stand in for those within the stall */
        b.chunk_tokens = room < 8 ? room : 8;
        b.whole_tokens = SHORT_PROMPT_TOKENS;
        return b;
    }
    const double allowance_ms = (e->p.max_itl_stretch - 1.0) * t_decode;
    b.chunk_tokens = tokens_costing(allowance_ms, e->t_token_ms, room);
    b.whole_tokens = tokens_costing(allowance_ms + e->p.max_stall_ms, whole_token_ms(e), e->p.n_ctx);
    if (b.whole_tokens < b.chunk_tokens) b.whole_tokens = b.chunk_tokens;
    return b;
}

/* A prefill passed over by later prompts this many steps goes before
 * those with less prompt left, from then on (see order_prefills). */
#define MAX_PREFILL_PASSED_OVER 8

/* Whether q's prefill goes before r's (q admitted earlier): one passed
 * over MAX_PREFILL_PASSED_OVER times first, in admission order; then the
 * least prompt left first. */
static bool prefill_before(const kt_request *q, const kt_request *r) {
    const bool q_late = q->prefill_passed_over >= MAX_PREFILL_PASSED_OVER;
    const bool r_late = r->prefill_passed_over >= MAX_PREFILL_PASSED_OVER;
    if (q_late != r_late) return q_late;
    return q_late || q->n_prompt - q->n_prefilled <= r->n_prompt - r->n_prefilled;
}

/* The prefilling requests that may go on this step, the one with the
 * least prompt left first (ties in admission order): an agent's next turn,
 * most of it cached, gets its first token before another session's long
 * first prompt is through, and the step's prefill budget serves it first.
 * Alone, that would starve a long prompt for as long as shorter ones keep
 * coming (a busy server's steady state: a soak test saw first tokens
 * after 40 s); one passed over by later prompts MAX_PREFILL_PASSED_OVER
 * steps goes first until its prompt is in. Returns their number, in e->prefill_order. */
static int order_prefills(kt_engine *e) {
    int n = 0;
    for (int a = 0; a < e->n_active; a++) {
        const kt_request *r = e->active[a];
        if (r->state != REQ_PREFILL || r->waits_for_prefix) continue;
        int i = n++;
        while (i > 0) {
            const kt_request *q = e->active[e->prefill_order[i - 1]];
            if (prefill_before(q, r)) break;
            e->prefill_order[i] = e->prefill_order[i - 1];
            i--;
        }
        e->prefill_order[i] = a;
    }
    return n;
}

/* ---- speculation ------------------------------------------------------ */

/* The choice's tokens (prompt, then output: its pending token last) in
 * ctx[n_ctx]; returns how many. */
static int choice_tokens(const kt_request *r, const gen_choice *c, int32_t *ctx) {
    memcpy(ctx, r->prompt, sizeof *ctx * (size_t)r->n_prompt);
    memcpy(ctx + r->n_prompt, c->generated, sizeof *ctx * (size_t)c->n_generated);
    return r->n_prompt + c->n_generated;
}

/* Cuts proposals at a bad id or where the grammar refuses them: a token
 * the grammar refuses can never be drawn, so none from it on is verified. */
static int cut_proposals(const kt_engine *e, const gen_choice *c, int got) {
    for (int i = 0; i < got; i++)
        if (c->prop[i] < 0 || c->prop[i] >= e->llm->cfg.n_vocab) got = i;
    if (got && c->constraint) got = kt_constraint_allows_run(c->constraint, c->prop, got);
    return got;
}

/* Up to k proposals for what follows choice c's tokens (its pending one
 * last): the caller's proposer, else the choice's own context (prompt and
 * output), else what earlier requests went on to say. */
static int propose(kt_engine *e, const kt_request *r, gen_choice *c, int k) {
    int32_t *ctx = e->seq_tokens; /* [n_ctx]: the prompt and the output fit */
    const int n = choice_tokens(r, c, ctx);
    int32_t *out = c->prop;
    int got = 0;
    if (e->p.spec_propose) {
        got = e->p.spec_propose(e->p.spec_propose_ctx, ctx, n, k, out);
        got = got < 0 ? 0 : got > k ? k : got;
    } else {
        got = spec_ngram_propose(ctx, n, 2, 4, k, out);
        if (!got && e->spec_table) got = spec_table_propose(e->spec_table, ctx, n, k, out);
    }
    return cut_proposals(e, c, got);
}

/* The draft model's guesses for the choices that chose k > 0 (their
 * n_prop, which becomes what the draft gave, cut like any proposals). */
static void draft_proposals(kt_engine *e) {
    int n_jobs = 0;
    for (int a = 0; a < e->n_active; a++) {
        kt_request *r = e->active[a];
        for (int i = 0; r->state == REQ_DECODE && i < r->n_choices; i++) {
            gen_choice *c = &r->choices[i];
            if (r->images.n) c->n_prop = 0; /* the draft model cannot see the images */
            if (c->n_prop == 0) continue;
            int32_t *ctx = e->draft_ctx + (size_t)n_jobs * (size_t)e->p.n_ctx;
            e->draft_jobs[n_jobs++] = (eng_draft_job){.seq = &c->draft_seq, .ctx = ctx, .n = choice_tokens(r, c, ctx),
                                                      .k = c->n_prop, .out = c->prop};
        }
    }
    kt_error err;
    if (!n_jobs) return;
    const bool ok = eng_draft_propose(e->draft, e->pool, e->draft_jobs, n_jobs, e->p.batch_tokens, &err) == KT_OK;
    for (int a = 0, j = 0; a < e->n_active; a++) {
        kt_request *r = e->active[a];
        for (int i = 0; r->state == REQ_DECODE && i < r->n_choices; i++) {
            gen_choice *c = &r->choices[i];
            if (c->n_prop) c->n_prop = ok ? cut_proposals(e, c, e->draft_jobs[j++].got) : 0;
        }
    }
}

/* Which of the step's n tokens make MTP rows (engine/mtp_engine.h): those
 * of requests without images, all while the block is in use, else (it is
 * dormant) those that want logits; and any that wants an embedding, whose
 * hidden state comes out beside them. Dormant: its guesses unused lately
 * or measured useless, unless the caller fixes k (it speculates whatever
 * the rate). */
static void mtp_wants(kt_engine *e, int n) {
    const bool dormant =
        !e->p.spec_fixed_k && (eng_mtp_idle(&e->mtp) || spec_accept_useless(&e->seen_guess));
    for (int t = 0; t < n; t++) {
        const bool row = !e->b_req[t]->images.n && (!dormant || e->b_logits[t]);
        e->mtp.want[t] = row || e->b_hidden[t];
    }
    eng_mtp_rows(&e->mtp, n);
}

/* The MTP block's guesses for the choices that chose k > 0 (their
 * n_prop, which becomes what it gave, cut like any proposals), up to
 * e->mtp.group choices at a time. */
static void mtp_guess_group(kt_engine *e, eng_mtp_job *jobs, kt_request **reqs, gen_choice **chs, int n) {
    kt_error err;
    if (!n) return;
    if (eng_mtp_propose(&e->mtp, e->work, e->pool, jobs, n, &err) != KT_OK)
        for (int j = 0; j < n; j++) fail_request(reqs[j], err.msg);
    for (int j = 0; j < n; j++) {
        gen_choice *c = chs[j];
        c->n_prop = jobs[j].got > 0 ? cut_proposals(e, c, jobs[j].got) : 0;
        if (c->n_prop && e->p.spec_propose) c->n_prop = propose(e, reqs[j], c, c->n_prop); /* the caller's replace them */
    }
}

static void mtp_proposals(kt_engine *e) {
    eng_mtp_job jobs[EMTP_GROUP];
    kt_request *reqs[EMTP_GROUP];
    gen_choice *chs[EMTP_GROUP];
    int n = 0;
    for (int a = 0; a < e->n_active; a++) {
        kt_request *r = e->active[a];
        for (int i = 0; r->state == REQ_DECODE && i < r->n_choices; i++) {
            gen_choice *c = &r->choices[i];
            if (r->images.n) c->n_prop = 0; /* an image's rows are no tokens the MTP block can embed (mtp_wants) */
            if (c->n_prop == 0 || c->finish != KT_FINISH_NONE || c->prop_lookup) continue;
            jobs[n] = (eng_mtp_job){.seq = c->seq, .pending = c->next_token, .k = c->n_prop, .out = c->prop};
            reqs[n] = r, chs[n++] = c;
            if (n == e->mtp.group) mtp_guess_group(e, jobs, reqs, chs, n), n = 0;
        }
    }
    mtp_guess_group(e, jobs, reqs, chs, n);
}

/* Tells the MTP block whether a guess of its goes to verification this
 * step (eng_mtp_used: how long it has been idle). */
static void mtp_note_use(kt_engine *e) {
    bool guessed = false, decoding = false;
    for (int a = 0; a < e->n_active; a++) {
        const kt_request *r = e->active[a];
        for (int i = 0; r->state == REQ_DECODE && i < r->n_choices; i++) {
            const gen_choice *c = &r->choices[i];
            decoding |= c->finish == KT_FINISH_NONE;
            guessed |= c->n_prop > 0 && !c->prop_lookup;
        }
    }
    eng_mtp_used(&e->mtp, guessed, decoding);
}

/* How many proposals each decoding choice feeds this step (c->n_prop):
 * every choice counts its one token first, then each choice in turn
 * takes the k that maximises the step's expected tokens per measured
 * millisecond (policy.h), given what the choices before it took. A choice
 * never verifies past its max_tokens (nor so past its KV reservation, nor
 * its context: max_tokens is within both). */
static void plan_speculation(kt_engine *e) {
    int n_tokens = 0;
    for (int a = 0; a < e->n_active; a++) {
        kt_request *r = e->active[a];
        for (int i = 0; r->state == REQ_DECODE && i < r->n_choices; i++) {
            r->choices[i].n_prop = 0;
            n_tokens += r->choices[i].finish == KT_FINISH_NONE;
        }
    }
    if (!e->spec_max_tokens) return;
    double expected = n_tokens;
    int budget = e->spec_max_tokens;
    bool may_probe = true; /* one probe a step (spec/policy.h) */
    e->costs.ms_token = whole_token_ms(e);
    for (int a = 0; a < e->n_active && budget > 0; a++) {
        kt_request *r = e->active[a];
        for (int i = 0; r->state == REQ_DECODE && i < r->n_choices && budget > 0; i++) {
            gen_choice *c = &r->choices[i];
            int limit = r->max_tokens - c->n_generated - 1; /* the pending token's draw is one more */
            if (limit > e->p.spec_k_max) limit = e->p.spec_k_max;
            if (limit > budget) limit = budget;
            if (c->finish != KT_FINISH_NONE || limit <= 0) continue;
            /* a draft or the MTP block guesses after the choice of k (its guesses cost a pass each); a lookup before */
            /* with a caller's proposer too (benchmarks), the MTP block still guesses (and costs), then
             * the caller's proposals replace its guesses (mtp_proposals) */
            const bool mtp = e->mtp.llm != NULL, guessed = e->draft || mtp;
            int avail = guessed ? limit : propose(e, r, c, limit);
            /* with the MTP block, prompt lookup is tried too: its run is taken where its measured acceptance
             * expects as many tokens from it as the MTP block's from a full k (quoted code, tool results
             * read back), and costs no guessing passes */
            c->prop_lookup = false;
            if (mtp && !e->p.spec_propose) {
                const int n_look = propose(e, r, c, limit);
                if (n_look > 0 && spec_accept_expected(&c->accept_lookup, n_look) >= spec_accept_expected(&c->accept, limit))
                    c->prop_lookup = true, avail = n_look;
            }
            spec_accept *acc = c->prop_lookup ? &c->accept_lookup : &c->accept;
            const double ms_per_k = e->draft ? eng_draft_pass_ms(e->draft) : mtp && !c->prop_lookup ? e->mtp.guess_ms : 0.0;
            /* a hybrid model's rollback on a rejection: the state updates replayed (engine/rewind.h) */
            const double ms_reject = e->rewind.llm ? e->rewind.replay_ms : 0.0;
            const int k = spec_choose_k_paid(acc, &e->costs, avail, n_tokens, expected, e->p.spec_fixed_k, ms_per_k,
                                             ms_reject, &may_probe);
            if (e->trace)
                fprintf(stderr, "kettle engine: k %d of %d (E %.2f, pass %.1f ms for %d, %.1f for %d, guess %.1f ms, rollback %.1f ms)\n",
                        k, avail, spec_accept_expected(acc, k), spec_cost(&e->costs, n_tokens), n_tokens,
                        spec_cost(&e->costs, n_tokens + (k ? k : 1)), n_tokens + (k ? k : 1), ms_per_k, ms_reject);
            c->n_prop = k;
            n_tokens += k, budget -= k;
            expected += spec_accept_expected(acc, k) - 1.0;
        }
    }
    /* the guesses' time is weighed per guess (ms_per_k above), so it is
     * kept out of the step's cost that update_costs notes: counted in both,
     * a guess would weigh double and the policy would speculate too little */
    const double t0 = now_ns() / 1e6;
    if (e->draft) draft_proposals(e);
    if (e->mtp.llm) {
        mtp_proposals(e);
        mtp_note_use(e);
    }
    e->step_guess_ms = now_ns() / 1e6 - t0;
}

/* Samples choice i's rows in order (rows[j]: after its pending token for
 * j = 0, after proposal j otherwise), keeping proposals while the draws
 * equal them; stops where the choice ends. Then the sequence keeps the
 * pending token and the kept proposals: the positions whose rows were
 * drawn from. Returns how many rows it drew from. */
static int verify_choice(kt_engine *e, kt_request *r, int i, const float *rows) {
    gen_choice *c = &r->choices[i];
    const size_t n_vocab = (size_t)e->llm->cfg.n_vocab;
    const int k = c->n_prop, len_before = c->seq->len - (k + 1);
    int j = 0;
    for (;; j++) {
        sample_choice(e, r, i, rows + (size_t)j * n_vocab);
        if (c->finish != KT_FINISH_NONE || j == k || c->next_token != c->prop[j]) break;
    }
    const int kept = j; /* rows 0..j-1 drew their proposals */
    kt_error err;
    const kt_status st = j < k && e->rewind.llm
                             ? eng_rewind_apply(&e->rewind, e->work, e->pool, c->seq, len_before + 1 + j, 1 + j, &err)
                             : kv_seq_truncate(c->seq, len_before + 1 + j, &err);
    if (st != KT_OK) fail_request(r, err.msg);
    eng_draft_keep(c->draft_seq, c->seq->len); /* the draft's guesses that stood stay read */
    spec_accept_note(c->prop_lookup ? &c->accept_lookup : &c->accept, k, kept);
    spec_accept_note(c->prop_lookup ? &e->seen_lookup : &e->seen_guess, k, kept);
    pthread_mutex_lock(&e->mu);
    e->stats.spec_proposed += (uint64_t)k, e->stats.spec_accepted += (uint64_t)kept, e->stats.spec_passes++;
    if (c->prop_lookup) e->stats.spec_lookup_proposed += (uint64_t)k, e->stats.spec_lookup_accepted += (uint64_t)kept;
    pthread_mutex_unlock(&e->mu);
    c->n_prop = 0;
    return j + 1;
}

/* Appends the decode tokens, then prefill chunks; returns the batch size
 * and the number of prefill tokens in *n_prefill. A sequence that cannot
 * grow (which the reservation rules out) ends its request with an error. */
/* The embeddings of the images in r's next chunk of `chunk` prompt
 * tokens: encoded now where the encoder cache has none. False: the
 * request failed. */
static bool images_ready(kt_engine *e, kt_request *r, int chunk) {
    kt_error err = {0};
    eng_encoder enc = {.vision = e->p.vision, .pool = e->pool, .cache = e->embd_cache, .disk = e->embd_disk,
                       .n_row = (int)llm_embd_row_floats(&e->llm->cfg)};
    kt_status st = req_images_ready(&r->images, r->n_prefilled, chunk, &enc, &err);
    pthread_mutex_lock(&e->mu);
    e->stats.image_encodes += (uint64_t)enc.n_encoded;
    e->stats.image_encode_ms += enc.encode_ms;
    e->stats.image_disk_hits += (uint64_t)enc.n_disk_hits;
    if (e->embd_cache) {
        const kt_embd_cache_stats cs = kt_embd_cache_get_stats(e->embd_cache);
        e->stats.image_cache_hits = cs.hits, e->stats.image_cache_bytes = cs.bytes;
        e->stats.image_cache_entries = cs.n_entries;
    }
    pthread_mutex_unlock(&e->mu);
    if (st != KT_OK) fail_request(r, err.msg);
    return st == KT_OK;
}

static int build_batch(kt_engine *e, int *n_prefill) {
    int n = 0;
    kt_error err;
    e->b_images = false;
    eng_rewind_begin(&e->rewind, e->p.batch_tokens);
    plan_speculation(e);
    for (int a = 0; a < e->n_active; a++) {
        kt_request *r = e->active[a];
        if (r->state != REQ_DECODE) continue;
        for (int i = 0; i < r->n_choices; i++) {
            gen_choice *c = &r->choices[i];
            if (c->finish != KT_FINISH_NONE) continue;
            /* a hybrid model verifies proposals only where it can roll its state back */
            if (c->n_prop > 0 && e->rewind.llm && !eng_rewind_plan(&e->rewind, c->seq, n, 1 + c->n_prop)) c->n_prop = 0;
            if (kv_seq_append(c->seq, 1 + c->n_prop, &err) != KT_OK) {
                fail_request(r, err.msg);
                break;
            }
            batch_add(e, &n, r, i, c->seq, c->next_token, true, c->n_prop);
            for (int j = 0; j < c->n_prop; j++) batch_add(e, &n, r, i, c->seq, c->prop[j], true, c->n_prop - 1 - j);
        }
    }
    const int n_decode = n;
    const prefill_budget budget = plan_prefill(e, n_decode);
    for (int a = 0; a < e->n_active; a++) share_prefix(e, a);
    const int n_order = order_prefills(e);
    int youngest_served = -1; /* the latest admitted prompt given tokens so far this step */
    for (int o = 0; o < n_order && budget.whole_tokens > 0; o++) {
        kt_request *r = e->active[e->prefill_order[o]];
        const int left = r->n_prompt - r->n_prefilled, batch_room = e->p.batch_tokens - n;
        const int in_step = n - n_decode;
        if (!r->prefill_whole && batch_room > 0 && left <= budget.whole_tokens - in_step) r->prefill_whole = true;
        int room = r->prefill_whole ? batch_room : budget.chunk_tokens - in_step;
        if (room > batch_room) room = batch_room;
        if (room <= 0) {
            /* the prompts before it took the step; it counts as passed over
             * only if one of them came after it (among prompts of its own
             * age the least left going first is no starvation, and counting
             * it made every long prompt "late" behind a single stream) */
            if (youngest_served > e->prefill_order[o]) r->prefill_passed_over++;
            continue;
        }
        if (e->prefill_order[o] > youngest_served) youngest_served = e->prefill_order[o];
        int chunk = left < room ? left : room;
        kv_seq *seq = r->choices[0].seq;
        if (r->images.n && !images_ready(e, r, chunk)) continue;
        if (kv_seq_append(seq, chunk, &err) != KT_OK) {
            fail_request(r, err.msg);
            continue;
        }
        eng_snaps_plan(&e->snaps, r, r->n_prefilled, chunk, n, r->snap_extra);
        for (int j = 0; j < chunk; j++) {
            int k = r->n_prefilled + j;
            const float *row = r->images.n ? req_images_row(&r->images, k, (int)llm_embd_row_floats(&e->llm->cfg)) : NULL;
            e->b_tokens[n] = row ? 0 : r->prompt[k]; /* an image's row: its key id is no token */
            e->b_embd[n] = row;
            e->b_pos[n] = k;
            batch_pos4(e, r, n);
            e->b_seq[n] = seq;
            e->b_logits[n] = !r->embed && k == r->n_prompt - 1;
            e->b_hidden[n] = r->embed == KT_POOL_MEAN || (r->embed == KT_POOL_CLS && k == 0) ||
                             (r->embed == KT_POOL_LAST && k == r->n_prompt - 1);
            e->b_req[n] = r;
            e->b_choice[n] = -1;
            n++;
        }
        r->n_prefilled += chunk;
    }
    e->step_has_whole = n - n_decode > budget.chunk_tokens;
    *n_prefill = n - n_decode;
    return n;
}

/* The prompt is in: fork the choices and sample each one's first token. */
static void prompt_done(kt_engine *e, kt_request *r, const float *logits) {
    if (r->prefill_only) { /* in the cache now (retire indexes it, a hybrid's state with it): done */
        r->state = REQ_DECODE;
        r->choices[0].finish = KT_FINISH_LENGTH; /* no token was allowed */
        finish_only_event(r, 0, KT_FINISH_LENGTH, NULL);
        return;
    }
    for (int i = 0; i < r->n_choices; i++)
        if (!start_choice(e, r, i)) {
            fail_request(r, "out of memory starting a choice");
            return;
        }
    r->state = REQ_DECODE;
    for (int i = 0; i < r->n_choices; i++) sample_choice(e, r, i, logits);
}

/* The prompt blocks computed so far go into the index after every step,
 * so a request that shares them takes them while this one still reads
 * the rest of its prompt. */
static void cache_prefills(kt_engine *e) {
    if (!e->cache) return;
    for (int a = 0; a < e->n_active; a++) {
        kt_request *r = e->active[a];
        if (r->state == REQ_PREFILL && !atomic_load(&r->cancel))
            kv_cache_insert(e->cache, r->choices[0].seq, r->prompt, r->n_prefilled, false);
    }
}

static void consume_logits(kt_engine *e, int n) {
    const size_t n_vocab = (size_t)e->llm->cfg.n_vocab;
    int row = 0;
    for (int t = 0; t < n; t++) {
        if (!e->b_logits[t]) continue;
        const float *logits = e->logits + (size_t)row++ * n_vocab;
        kt_request *r = e->b_req[t];
        if (atomic_load(&r->cancel)) continue;
        if (e->b_choice[t] < 0) {
            prompt_done(e, r, logits);
            continue;
        }
        const int k = r->choices[e->b_choice[t]].n_prop;
        if (k == 0) {
            sample_choice(e, r, e->b_choice[t], logits);
            continue;
        }
        verify_choice(e, r, e->b_choice[t], logits);
        t += k, row += k; /* its proposals' rows are verify's */
    }
}

/* Embeddings: each hidden row asked for is added to its request's sum;
 * a request whose prompt is all in gets its pooled vector and ends. */
static void consume_hidden(kt_engine *e, int n) {
    const int n_embd = e->llm->cfg.n_embd;
    int row = 0;
    for (int t = 0; t < n; t++) {
        if (!e->b_hidden[t]) continue;
        /* with the MTP block the wanted tokens' rows came out (an embedding's among them), in batch order */
        const float *h = e->mtp.llm ? e->mtp.hid + (size_t)e->mtp.row[t] * (size_t)n_embd
                                    : e->hidden + (size_t)row++ * (size_t)n_embd;
        kt_request *r = e->b_req[t];
        for (int i = 0; i < n_embd; i++) r->embd[i] += h[i];
    }
    for (int a = 0; a < e->n_active; a++) {
        kt_request *r = e->active[a];
        if (!r->embed || r->state != REQ_PREFILL || r->n_prefilled < r->n_prompt || atomic_load(&r->cancel)) continue;
        if (r->embed == KT_POOL_MEAN)
            for (int i = 0; i < n_embd; i++) r->embd[i] /= (float)r->n_prompt;
        pthread_mutex_lock(&r->mu);
        r->embd_done = true;
        pthread_mutex_unlock(&r->mu);
        r->state = REQ_DECODE; /* retire_finished takes it */
        r->choices[0].finish = KT_FINISH_STOP;
        finish_only_event(r, 0, KT_FINISH_STOP, NULL);
    }
}

/* Requests whose choices have all ended leave; the rest hear of their new
 * events. */
static void retire_finished(kt_engine *e) {
    for (int a = 0; a < e->n_active;) {
        kt_request *r = e->active[a];
        bool all_done = r->state == REQ_DECODE;
        for (int i = 0; i < r->n_choices && all_done; i++) all_done = r->choices[i].finish != KT_FINISH_NONE;
        if (all_done) {
            remove_active(e, a);
            retire(e, r);
        } else {
            req_notify(r);
            a++;
        }
    }
}

/* Prefill steps this large give the whole-prompt token cost. */
#define WHOLE_COST_MIN_TOKENS 64

/* A prefill token's cost depends on the step's size: beside one or two
 * decode tokens a one-token chunk cost 22 ms, a token of a 256-token step
 * 9 ms (PERFORMANCE.md's agent workload section, a 2-core AVX2 machine). So
 * two estimates: chunks beside decoding size chunks (t_token_ms), large
 * steps (alone or a whole prompt beside decoding) cost whole prompts
 * (t_whole_token_ms); one learned from the other's steps would size chunks
 * past the stretch, or keep whole prompts out of the stall they fit. Until
 * the first chunk beside decoding, prompts alone give t_token_ms too: the
 * very first step also pays for first touches of memory (24-64 ms a token
 * cold there, against 10-19 warm), and kept alone that guess sized chunks
 * at one token a step. */
static void update_costs(kt_engine *e, int n_decode, int n_prefill, double ms, bool snapped) {
    const double alpha = 0.25;
    const int k = n_decode < e->p.batch_tokens ? n_decode : e->p.batch_tokens;
    const double t_decode = n_decode > 0 ? decode_step_ms(e, k) : 0.0;
    if (e->costs_fixed) return;
    if (n_prefill == 0) {
        /* a step that took state snapshots (a generation's end, on a hybrid
         * model) also copied tens of MB and faulted snapshot memory in: its
         * time is no pass size's cost (a 7-token step at 2x an 8-token one
         * made speculating look cheap, docs/PERFORMANCE.md) */
        if (n_decode > 0 && !snapped) spec_cost_note(&e->costs, k, ms);
        return;
    }
    if (n_decode > 0 && t_decode <= 0.0) return; /* the prefill's share is unknown */
    double per = (ms - t_decode) / n_prefill;
    if (per < 0.0) per = 0.0;
    if (n_prefill >= WHOLE_COST_MIN_TOKENS)
        e->t_whole_token_ms = e->t_whole_token_ms > 0 ? (1 - alpha) * e->t_whole_token_ms + alpha * per : per;
    if (n_decode > 0 && !e->step_has_whole) {
        e->t_token_ms = e->t_token_measured_beside ? (1 - alpha) * e->t_token_ms + alpha * per : per;
        e->t_token_measured_beside = true;
    } else if (n_decode == 0 && !e->t_token_measured_beside) {
        e->t_token_ms = e->t_token_ms > 0 ? (1 - alpha) * e->t_token_ms + alpha * per : per;
    }
}

/* Sequences in the batch: a sequence's tokens are contiguous in it (one
 * decode token, or one prefill chunk). */
static int batch_seqs(const kt_engine *e, int n) {
    int seqs = 0;
    for (int t = 0; t < n; t++) seqs += t == 0 || e->b_seq[t] != e->b_seq[t - 1];
    return seqs;
}

static void engine_step(kt_engine *e) {
    reap_cancelled(e);
    admit(e);
    if (e->n_active == 0) return;
    /* A step's cost, as speculation weighs it, is all of it: proposing,
     * the pass, sampling every verified row. On a model this small that
     * the pass is tens of microseconds, the rest is a real share, and a
     * cost of the pass alone made extra rows look cheaper than they are.
     * All but a draft's or the MTP block's guesses, which the policy
     * weighs per guess (step_guess_ms). */
    const double t_step = now_ns() / 1e6;
    e->step_guess_ms = 0;
    int n_prefill = 0, n = build_batch(e, &n_prefill);
    if (n > 0) {
        const int seqs = batch_seqs(e, n);
        /* published before any event of the step can be read */
        pthread_mutex_lock(&e->mu);
        e->stats.steps++;
        e->stats.steps_multi_seq += seqs > 1;
        if (seqs > e->stats.max_step_seqs) e->stats.max_step_seqs = seqs;
        e->stats.prompt_tokens += (uint64_t)n_prefill;
        publish_counts_locked(e);
        pthread_mutex_unlock(&e->mu);
        double t0 = now_ns() / 1e6;
        const bool snapped = e->snaps.n_pending > 0; /* this pass copies state snapshots */
        bool embeds = false; /* no embedding in the batch: the forward skips the hidden rows' pass */
        for (int t = 0; t < n && !embeds; t++) embeds = e->b_hidden[t];
        if (e->mtp.llm) mtp_wants(e, n);
        llm_batch b = {.n_tokens = n, .tokens = e->b_tokens, .pos = e->b_pos, .seq = e->b_seq, .logits = e->b_logits,
                       .hidden = e->mtp.llm ? e->mtp.want : embeds ? e->b_hidden : NULL,
                       .hidden_out = e->mtp.llm ? e->mtp.hid : e->hidden,
                       .pos_mrope = e->b_images ? e->b_pos4 : NULL, .embd = e->b_images ? e->b_embd : NULL,
                       .state_snap = snapped ? e->snaps.b_snap : NULL,
                       .rec_log = e->rewind.n_log ? e->rewind.b_log : NULL,
                       .rec_from = e->rewind.n_log ? e->rewind.b_from : NULL,
                       .rec_to = e->rewind.n_log ? e->rewind.b_to : NULL};
        llm_forward(e->llm, e->work, e->pool, &b, e->logits);
        eng_rewind_passed(&e->rewind); /* before anything reads a verifying sequence's state */
        kt_error merr;
        if (e->mtp.llm && eng_mtp_pass(&e->mtp, e->work, e->pool, &b, &merr) != KT_OK) /* before its blocks are cached */
            for (int t = 0; t < n; t++) fail_request(e->b_req[t], merr.msg);
        const double ms = now_ns() / 1e6 - t0;
        cache_prefills(e);
        eng_snaps_hang(&e->snaps);
        /* where each sequence ends: before the draws for prompts (choices fork from the prompt's end
         * inside consume_logits), again after them for what the draws kept */
        if (e->mtp.llm) eng_mtp_note(&e->mtp, &b);
        consume_logits(e, n);
        consume_hidden(e, n);
        if (e->mtp.llm) {
            eng_mtp_note(&e->mtp, &b);
            pthread_mutex_lock(&e->mu);
            e->stats.mtp_rows = e->mtp.rows, e->stats.mtp_rows_blind = e->mtp.rows_blind;
            e->stats.mtp_rows_skipped = e->mtp.rows_skipped;
            e->stats.mtp_guesses_blind = e->mtp.guesses_blind;
            pthread_mutex_unlock(&e->mu);
        }
        update_costs(e, n - n_prefill, n_prefill, now_ns() / 1e6 - t_step - e->step_guess_ms, snapped);
        if (e->trace)
            fprintf(stderr, "kettle engine: step %d decode + %d prefill tokens, pass %.3f ms, step %.3f ms (prefill token ~%.2f ms, in whole prompts ~%.2f)\n",
                    n - n_prefill, n_prefill, ms, now_ns() / 1e6 - t_step, e->t_token_ms, e->t_whole_token_ms);
    }
    retire_finished(e);
    pthread_mutex_lock(&e->mu);
    publish_counts_locked(e);
    pthread_mutex_unlock(&e->mu);
}

/* n_active is the engine thread's; the others read it through the stats. */
static bool has_work_locked(const kt_engine *e) {
    return e->n_active > 0 || e->n_waiting > 0;
}

static void *engine_main(void *arg) {
    kt_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    while (!e->stop) {
        if (!has_work_locked(e) || (e->held && e->steps_granted == 0)) {
            pthread_cond_broadcast(&e->cv_step); /* idle or held: run_steps is done */
            pthread_cond_wait(&e->cv, &e->mu);
            continue;
        }
        if (e->held) e->steps_granted--;
        e->in_step = true;
        pthread_mutex_unlock(&e->mu);
        engine_step(e);
        pthread_mutex_lock(&e->mu);
        e->in_step = false;
    }
    pthread_cond_broadcast(&e->cv_step);
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

void kt_engine_hold(kt_engine *e, bool hold) {
    pthread_mutex_lock(&e->mu);
    e->held = hold;
    e->steps_granted = 0;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

void kt_engine_run_steps(kt_engine *e, int n) {
    pthread_mutex_lock(&e->mu);
    e->steps_granted = n > 0 ? n : 0;
    pthread_cond_signal(&e->cv);
    /* the engine broadcasts cv_step whenever it is about to wait; the
     * published counts stand in for n_active, which is the engine's */
    while (e->held && !e->stop &&
           (e->in_step || (e->steps_granted > 0 && (e->n_waiting > 0 || e->stats.requests_running > 0))))
        pthread_cond_wait(&e->cv_step, &e->mu);
    pthread_mutex_unlock(&e->mu);
}

void kt_engine_fix_costs(kt_engine *e, double decode_step_ms, double chunk_token_ms, double whole_token_ms) {
    pthread_mutex_lock(&e->mu); /* the engine thread reads them after taking mu for its next step */
    for (int n = 0; n <= e->p.batch_tokens; n++) e->t_decode_ms[n] = decode_step_ms;
    e->t_token_ms = chunk_token_ms;
    e->t_whole_token_ms = whole_token_ms;
    e->costs_fixed = true;
    pthread_mutex_unlock(&e->mu);
}

void kt_engine_free(kt_engine *e) {
    if (!e) return;
    if (e->thread_started) {
        pthread_mutex_lock(&e->mu);
        e->stop = true;
        pthread_cond_signal(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    while (e->n_active > 0) {
        kt_request *r = e->active[0];
        remove_active(e, 0);
        end_request(e, r, KT_FINISH_CANCELLED, NULL);
    }
    while (e->n_waiting > 0) end_request(e, e->waiting[--e->n_waiting], KT_FINISH_CANCELLED, NULL);
    kv_disk_close(e->disk); /* its queued writes are finished first */
    eng_snaps_free(&e->snaps);
    eng_rewind_free(&e->rewind);
    eng_mtp_free(&e->mtp);
    kv_cache_free(e->cache);
    eng_grammar_free(&e->gram);
    kv_pool_free(e->kv);
    llm_work_free(e->work);
    kt_pool_free(e->pool);
    free(e->b_tokens), free(e->b_pos), free(e->b_pos4), free(e->b_embd), free(e->b_seq), free(e->b_logits), free(e->b_hidden), free(e->hidden);
    kt_embd_cache_free(e->embd_cache);
    kt_embd_disk_close(e->embd_disk);
    free(e->b_req), free(e->b_choice), free(e->logits), free(e->row);
    free(e->active), free(e->waiting), free(e->t_decode_ms), free(e->seq_tokens), free(e->hit_blocks);
    free(e->prefill_order);
    spec_table_free(e->spec_table);
    eng_draft_free(e->draft); /* after the choices: their draft sequences are its pool's */
    if (e->p.spec_draft_owned) kt_model_free((kt_model *)e->p.spec_draft); /* after its pool */
    free(e->draft_jobs), free(e->draft_ctx);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    pthread_cond_destroy(&e->cv_step);
    free(e);
}
