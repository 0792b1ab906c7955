/*
 * engine.h - many generation requests over one model: the step loop.
 *
 * One engine thread owns the model's forward pass, the paged KV pool and
 * every running sequence. Other threads (the HTTP server, the bench) only
 * submit requests and read their events; they never touch the model or
 * the KV pool. Each engine step runs, in one forward pass, one decode
 * token of every running sequence plus prefill chunks of waiting ones,
 * under a token budget (continuous batching with chunked prefill).
 *
 * Requests wait in a priority queue (higher priority first, then arrival
 * order) until the KV blocks their prompt needs are free; a running
 * sequence is never evicted to admit another. When the queue is full,
 * submit fails with KT_ERR_BUSY (the server answers 503 + Retry-After).
 *
 * Batch invariance: every per-token computation (matmul rows, attention,
 * sampling) has a reduction order that does not depend on which other
 * tokens share the step, so at temperature 0 a request gets the same
 * tokens alone or beside 15 others (tests/test_engine.c checks it).
 *
 * Threading contract of a kt_request: submit, poll/wait, cancel and free
 * may be called from any client thread (one at a time per request); the
 * notify callback is called from the engine thread (keep it short and
 * non-blocking, e.g. MHD_resume_connection) after each step that queued
 * events for the request, and once when it finishes. Once kt_request_free
 * has returned, notify is never called again for that request.
 */
#ifndef KT_ENGINE_ENGINE_H
#define KT_ENGINE_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kettle.h"

/* The default KV pool: n_parallel sequences of up to this many positions
 * (at least one whole context), whatever the context (make_kv_pool). */
#define KT_POOL_POSITIONS_PER_SEQ 4096

typedef struct kt_engine_params {
    int n_ctx;         /* positions per sequence (prompt + output); <= 0: model's n_ctx_train */
    int n_parallel;    /* sequences decoding at once (choices count each); default 16 */
    size_t kv_bytes;   /* KV pool budget in bytes; 0: n_parallel * n_ctx positions, cut to the memory
                        * available (see mem_limit) */
    size_t mem_limit;  /* memory the KV pool may take; 0: kt_mem_budget() (90% of what the machine has
                        * available now). A kv_bytes above it is refused, a default pool cut to it */
    int batch_tokens;  /* tokens per step (decode + prefill); default 256 */
    int n_threads;     /* forward-pass threads; <= 0: all CPUs */
    int queue_max;     /* requests waiting for admission before KT_ERR_BUSY; default 64 */
    kt_kv_type kv_type; /* default (KT_KV_DEFAULT): F16 */
    /* Beside decoding sequences, a step that also carries prefill is sized
     * (from measured costs) to take about this times a decode-only step,
     * so running streams keep their inter-token latency while a long
     * prompt is read. Default 1.8; <= 1: prefill takes the whole token
     * budget every step. */
    float max_itl_stretch;
    /* Beside decoding sequences, a prompt whose remaining tokens are
     * estimated to cost at most this (ms, measured per-token cost) goes
     * in whole, stalling the streams by up to this much beyond the stretch
     * above, so its first token comes at once (an agent's next turn, most
     * of it cached); the streams still get a token every step. Default
     * 5000; 0: prompts go in whole only where the stretch allows.
     * Engine.c's top comment has the whole rule. */
    float max_stall_ms;
    /* Reuse the KV of earlier requests' prompts and outputs (the prefix
     * cache, kv/prefix_cache.h): a request prefills only what no earlier
     * one computed. On by default; idle cached blocks are taken back
     * whenever a running request needs room. */
    bool prefix_cache;
    /* A max_tokens past the room the context (or the KV pool) leaves is an
     * error (KT_ERR_CONTEXT, field max_tokens) instead of being cut to
     * that room. Default false: cut, the reply ends at "length". */
    bool strict_max_tokens;
    /* The prefix cache's disk tier (kv/disk_cache.h): every cached block is
     * also written under cache_dir, and found there again, also after a
     * restart; at most cache_disk_bytes of files (0: 10 GiB). NULL: nothing
     * touches the disk. */
    const char *cache_dir;
    size_t cache_disk_bytes;
    /* Hybrid models (recurrent layers): memory for the prefix cache's
     * snapshots of the recurrent state (kv/prefix_cache.h), taken at the
     * end of every prompt (its last block boundary), every
     * state_interval positions of a long prefill and at the end of every
     * generation. 0: 1 GiB, or an eighth of the memory available
     * (mem_limit) if that is less; at least 8 snapshots either way. */
    size_t state_cache_bytes;
    /* Speculative decoding (spec/): each step, a decoding choice may feed
     * up to spec_k_max proposed tokens after its pending one, in the same
     * ragged pass as everyone else's tokens; the choice samples the rows in
     * order and keeps a proposal while the draw equals it, and the KV of
     * the rest is truncated. Every token is the draw plain decoding makes
     * from the same bits with the same random state, so the output (and
     * its logprobs) is plain decoding's at any temperature, with grammars,
     * penalties, stop strings and n > 1; only fewer passes produce it. k is
     * chosen per choice and step against measured pass costs (policy.h),
     * down to 0. */
    kt_spec_kind spec;        /* KT_SPEC_OFF (default), KT_SPEC_NGRAM, KT_SPEC_DRAFT or KT_SPEC_MTP (the
                                 model's own MTP block: its KV layer in the pool, engine/mtp_engine.c) */
    /* KT_SPEC_DRAFT: the draft model (the same vocabulary, checked; it must
     * outlive the engine). Its KV is a pool of its own (draft.h). */
    const kt_model *spec_draft;
    /* kt_engine_free frees spec_draft (once kt_engine_new succeeded; on a
     * failure it stays the caller's): a class's own draft, unloaded with it. */
    bool spec_draft_owned;
    int spec_k_max;           /* most proposals per choice and step; <= 0: 8 (at most 32) */
    bool spec_fixed_k;        /* verify every proposal found, up to spec_k_max (benchmarks) */
    int spec_table_tokens;    /* the cross-request n-gram table's size (table.h); 0: 65536; < 0: none */
    /* Proposals from the caller instead of the lookup or the draft (benchmarks that
     * force an acceptance rate, tests); NULL: spec's own. With KT_SPEC_MTP the
     * MTP block still guesses (its cost paid), then these replace its guesses.
     * Engine thread. */
    kt_spec_propose_fn spec_propose;
    void *spec_propose_ctx;
    /* A vision-language model's tower (src/vision/, borrowed; outlives the
     * engine): requests' images are encoded with it when their tokens are
     * first prefilled. NULL: images must come with their embeddings. The
     * encoder's outputs are kept by image hash up to image_cache_bytes
     * (0: 512 MiB). */
    struct kt_vision *vision;
    size_t image_cache_bytes;
} kt_engine_params;

kt_engine_params kt_engine_defaults(void);

typedef struct kt_engine kt_engine;

/* Starts the engine thread. The model must outlive the engine. */
kt_engine *kt_engine_new(kt_model *model, const kt_engine_params *params, kt_error *err);
/* Cancels everything still running, stops the thread, frees the pool.
 * Requests not yet freed by their clients stay valid (finished with
 * KT_FINISH_CANCELLED) until kt_request_free. */
void kt_engine_free(kt_engine *e);
/* The parameters in effect (defaults filled in). */
const kt_engine_params *kt_engine_get_params(const kt_engine *e);

typedef struct kt_logit_bias {
    int32_t token;
    float bias; /* added to the logit; -INFINITY bans the token */
} kt_logit_bias;

#define KT_MAX_TOP_LOGPROBS 20
#define KT_MAX_STOP 8
#define KT_MAX_CHOICES 16
#define KT_MAX_TRIGGERS 4

/* How an embedding pools its tokens' hidden states. */
typedef enum kt_pooling {
    KT_POOL_NONE = 0, /* no embedding: generate */
    KT_POOL_MEAN,     /* the mean over every prompt token */
    KT_POOL_CLS,      /* the first token's */
    KT_POOL_LAST,     /* the last token's (causal embedding models: Qwen3-Embedding) */
} kt_pooling;

/* An image in a prompt (engine/images.h): its grid_x * grid_y tokens take
 * prompt indices [at, at + grid_x * grid_y), whose values submit replaces
 * by the image's key ids. Its embeddings are given (embd: that many rows
 * of the model's n_embd floats, or n_embd * (1 + n_deepstack) in
 * Qwen3-VL models, copied) or made by the engine's vision
 * tower from prep (taken by submit, also when it fails; hash from
 * eng_image_hash). */
typedef struct kt_prompt_image {
    int at, grid_x, grid_y;
    uint64_t hash;
    struct kt_image_prep *prep;
    const float *embd;
} kt_prompt_image;

#define KT_MAX_IMAGES 64 /* per request */

typedef struct kt_gen_params {
    const int32_t *prompt;  /* copied by submit; n_prompt >= 1 */
    int n_prompt;
    const kt_prompt_image *images; /* in prompt order, not overlapping; NULL: none */
    int n_images;
    /* Only read the prompt into the cache: no token is generated; the
     * request ends (length: no token allowed) once its KV (and a hybrid's state) is indexed,
     * so a request sent next with this prompt as its prefix starts after
     * it. One choice. The prepared step of an agent loop. */
    bool prefill_only;
    int max_tokens;         /* generated tokens per choice; <= 0: until the context is full */
    int n_choices;          /* 1..KT_MAX_CHOICES, sharing the prompt's KV blocks */
    kt_sampler_params sampling; /* choice i samples with seed + i; penalties
                                   count every token the choice generated
                                   (penalty_last_n is ignored) */
    const char *const *stop; /* up to KT_MAX_STOP non-empty strings, copied */
    int n_stop;
    int top_logprobs;       /* -1: no logprobs; 0..KT_MAX_TOP_LOGPROBS: the sampled
                               token's logprob plus that many alternatives */
    const kt_logit_bias *logit_bias; /* copied */
    int n_logit_bias;
    int priority;           /* higher runs first; ties in arrival order */
    bool ignore_eos;        /* do not stop at end-of-generation tokens (except
                               under a grammar: it ends where the grammar allows) */
    /* GBNF (grammar.h) every choice's output must match; NULL: none. Parsed
     * by submit (a bad grammar is refused with line and column); an
     * end-of-generation token is allowed only where the grammar can end,
     * and a choice ends (stop) when nothing more can follow. */
    const char *grammar;
    size_t grammar_len;
    /* Lazy grammars (tool calls under tool_choice "auto"): while no
     * grammar is active, the choice's text is watched for each trigger;
     * when trigger i appears, trigger_grammars[i] (GBNF of what follows
     * the trigger's text) starts, taking any bytes of that token past the
     * trigger. When an active grammar (this one or `grammar`) is done, the
     * choice goes back to watching, or ends (stop) once max_segments
     * grammars have been completed (0: no limit). */
    const char *const *triggers;
    const char *const *trigger_grammars;
    int n_triggers;         /* 0..KT_MAX_TRIGGERS */
    int max_segments;
    /* Text between these markers is thinking, where a trigger is only
     * talk about a call: it is not watched (NULL: none). `in_thinking`:
     * the prompt opened the block. */
    const char *think_open, *think_close;
    bool in_thinking;
    /* Control tokens (other than end-of-generation ones) appear in the
     * text as their vocabulary text: tool-call markers such as
     * [TOOL_CALLS] or <|python_tag|>, which a parser must see. */
    bool special_text;
    /* Called from the engine thread when events are queued or the request
     * finishes; may be NULL (then poll or wait). */
    void (*notify)(void *ctx);
    void *notify_ctx;
    /* Called from the engine thread (with notify_ctx) at the start of every
     * step while the request is queued or running; true cancels it within
     * that step. For a server, "has the client hung up?": a connection
     * waiting for its first token has nothing to write, so nothing else
     * would notice. Must be cheap and non-blocking; may be NULL. */
    bool (*client_gone)(void *ctx);
    /* != KT_POOL_NONE: an embedding, not a generation. The prompt (up to
     * the whole context) is prefilled without taking the prefix cache's
     * hits (every token's hidden state is needed; what it computes is
     * cached for others), its tokens' last hidden states (the output norm
     * of the last layer) are pooled into one vector of n_embd floats
     * (kt_request_embedding), and the request ends with one finish-only
     * event (stop). One choice; the sampling fields are not used. */
    kt_pooling embed;
} kt_gen_params;

kt_gen_params kt_gen_defaults(void); /* 1 choice, greedy, no stop, no logprobs */

typedef enum kt_finish {
    KT_FINISH_NONE = 0,  /* still generating */
    KT_FINISH_STOP,      /* end-of-generation token or a stop string */
    KT_FINISH_LENGTH,    /* max_tokens or the context is full */
    KT_FINISH_CANCELLED, /* kt_request_cancel, or the engine shut down */
    KT_FINISH_ERROR,     /* the engine failed (message in the event) */
} kt_finish;

const char *kt_finish_name(kt_finish f); /* "stop", "length", "cancelled", "error" */

typedef struct kt_token_logprob {
    int32_t token;
    float logprob; /* natural log of the model's probability (after logit_bias) */
} kt_token_logprob;

/* One event: a sampled token of one choice, and/or the end of that choice.
 * Text is UTF-8, complete characters only; text held back because it might
 * start a stop string is released by a later event, or dropped if the stop
 * string completes (stop strings never appear in the output). The event's
 * text stays valid until the next poll/wait/free on the request. */
typedef struct kt_event {
    int choice;
    int32_t token;          /* -1: no token (a finish-only event) */
    const char *text;       /* NUL-terminated, may be "" */
    size_t text_len;
    bool has_logprob;
    kt_token_logprob logprob; /* the sampled token's */
    int n_top;
    kt_token_logprob top[KT_MAX_TOP_LOGPROBS]; /* most likely first */
    kt_finish finish;       /* != NONE: this choice is done, no more events for it */
    char error[160];        /* with KT_FINISH_ERROR */
    int stop_string;        /* KT_FINISH_STOP by a stop string: its index + 1 (0: none, e.g. end of turn) */
    uint64_t t_ns;          /* engine's monotonic clock when the token was sampled */
} kt_event;

typedef struct kt_request kt_request;

typedef struct kt_request_usage {
    int prompt_tokens;
    int cached_tokens;      /* of the prompt, taken from the prefix cache */
    int completion_tokens;  /* all choices together */
    uint64_t submit_ns, first_token_ns, done_ns; /* 0 until they happen */
} kt_request_usage;

/* The kt_gen_params field a refused submit is about, so a server can
 * name the request's parameter without reading the message. */
typedef enum kt_gen_field {
    KT_FIELD_NONE = 0,    /* not a field (busy, shutting down, out of memory) */
    KT_FIELD_PROMPT,      /* empty, too long for the context, or a bad token id */
    KT_FIELD_MAX_TOKENS,  /* past the context, or more KV than the pool holds */
    KT_FIELD_N_CHOICES,
    KT_FIELD_STOP,
    KT_FIELD_TOP_LOGPROBS,
    KT_FIELD_LOGIT_BIAS,
    KT_FIELD_GRAMMAR,     /* the grammar does not parse, or is too big */
} kt_gen_field;

/* Queues a request. Errors: KT_ERR_CONTEXT when the prompt does not fit
 * the context (the message says both numbers); KT_ERR_ARG with a message
 * naming the value (max_tokens past the context; bad n_choices / stop /
 * logprobs / token ids; more KV than the whole pool); KT_ERR_BUSY when the
 * wait queue is full or the engine is shutting down. */
kt_status kt_engine_submit(kt_engine *e, const kt_gen_params *p, kt_request **out,
                           kt_error *err);
/* The same; *field (if not NULL) says which parameter a refusal is about. */
kt_status kt_engine_submit_ex(kt_engine *e, const kt_gen_params *p, kt_request **out,
                              kt_error *err, kt_gen_field *field);

/* Next event without blocking: 1 and *ev filled, 0 if none yet, -1 when
 * the request is finished and every event has been read. */
int kt_request_poll(kt_request *r, kt_event *ev);
/* Like poll, but waits up to timeout_ms (< 0: forever) for an event. */
int kt_request_wait(kt_request *r, kt_event *ev, int timeout_ms);
/* Asks the engine to stop the request: its sequences and KV blocks are
 * freed within one step, and each unfinished choice ends with
 * KT_FINISH_CANCELLED. Safe to call more than once. */
void kt_request_cancel(kt_request *r);
/* Counts so far (final once poll returned -1). */
kt_request_usage kt_request_get_usage(kt_request *r);
/* An embedding request's pooled vector (not normalized) and its length,
 * once the request finished with KT_FINISH_STOP; NULL before, or for a
 * generation. Valid until kt_request_free. */
const float *kt_request_embedding(kt_request *r, int *n);
/* Cancels if needed and releases the client's reference; the engine frees
 * the memory once it has let go too. */
void kt_request_free(kt_request *r);

/* Latency histogram buckets, in milliseconds (the last bucket is +Inf). */
#define KT_LAT_N_BUCKETS 14
extern const double kt_lat_bucket_ms[KT_LAT_N_BUCKETS - 1];

typedef struct kt_latency_hist {
    uint64_t counts[KT_LAT_N_BUCKETS]; /* non-cumulative */
    uint64_t n;
    double sum_ms;
} kt_latency_hist;

typedef struct kt_engine_stats {
    int queue_depth;        /* waiting for admission */
    int running;            /* sequences prefilling or decoding */
    int requests_running;   /* admitted requests not yet retired */
    int kv_blocks_total, kv_blocks_used, kv_blocks_free;
    int kv_blocks_reserved; /* committed to running requests (their worst case) */
    int kv_window_slots_total, kv_window_slots_used; /* the sliding-window layers' (0: none) */
    int kv_blocks_cached;   /* indexed by the prefix cache (held or idle) */
    uint64_t cache_evicted_blocks; /* idle cached blocks taken back for room */
    /* the disk tier (zero without cache_dir) */
    uint64_t disk_files, disk_bytes, disk_writes, disk_reads, disk_rejected, disk_removed;
    uint64_t disk_cached_prompt_tokens; /* of cached_prompt_tokens, read back from disk */
    int kv_block_tokens;
    size_t kv_block_bytes;  /* one block: every layer's K and V rows */
    size_t kv_pool_bytes;   /* the whole pool: blocks of the full layers, slots of the window layers
                               (and a hybrid model's recurrent-state slots) */
    int state_slots;        /* a hybrid model's recurrent-state slots (one per --parallel sequence; 0: none) */
    size_t state_slot_bytes; /* bytes of one */
    bool state_spares;       /* and as many spares again (speculation's verify passes, engine/rewind.h) */
    /* the prefix cache's snapshots of that state (kv/prefix_cache.h) */
    int state_snapshots, state_snapshots_max;
    size_t state_snapshot_bytes; /* of one (state_slot_bytes); 0: no snapshots */
    uint64_t state_snapshots_taken, state_snapshots_evicted, state_snapshot_hits;
    int state_interval;     /* positions between a long prefill's snapshots */
    size_t kv_wanted_bytes; /* what n_parallel x n_ctx positions would have taken, when the pool was cut
                             * to the available memory (0: it was not) */
    uint64_t requests_finished[5]; /* by kt_finish */
    uint64_t prompt_tokens, generated_tokens; /* prompt_tokens: prefilled (computed) */
    uint64_t cached_prompt_tokens; /* prompt tokens served from the prefix cache */
    uint64_t steps;
    uint64_t steps_multi_seq; /* steps whose batch held two or more sequences */
    int max_step_seqs;      /* the most sequences one step's batch held */
    /* speculation: proposed tokens verified, of them kept, passes of a
     * choice that verified any */
    uint64_t spec_proposed, spec_accepted, spec_passes;
    /* KT_SPEC_MTP: MTP rows run, and of them those without the target's
     * hidden state before them (a sequence's first position, the first
     * after a prefix-cache hit); tokens that made none (a request with
     * images; prompts while the block is dormant: engine/mtp_engine.h);
     * guesses made without the hidden state
     * (0 unless the rows' bookkeeping is wrong) */
    uint64_t mtp_rows, mtp_rows_blind, mtp_rows_skipped, mtp_guesses_blind;
    /* KT_SPEC_MTP: of spec_proposed / spec_accepted, prompt lookup's (the rest are the MTP block's) */
    uint64_t spec_lookup_proposed, spec_lookup_accepted;
    /* images: encodes by the vision tower and their time, the encoder
     * cache's hits and what it holds */
    uint64_t image_encodes, image_cache_hits, image_disk_hits;
    double image_encode_ms;
    size_t image_cache_bytes, image_cache_entries;
    kt_latency_hist ttft;   /* submit -> first token */
    kt_latency_hist itl;    /* between consecutive tokens of one choice */
} kt_engine_stats;

/* A consistent snapshot; any thread. */
void kt_engine_get_stats(kt_engine *e, kt_engine_stats *out);

/* Test hook: while held, the engine thread runs only the steps that
 * kt_engine_run_steps grants, and waits between them, so a test can stop a
 * request at a chosen stage (queued, prefilling, decoding) regardless of
 * how fast the machine is. Releasing lets it run freely again. */
void kt_engine_hold(kt_engine *e, bool hold);
/* While held: lets the engine run n more steps and returns once they are
 * done, or sooner if it runs out of work. */
void kt_engine_run_steps(kt_engine *e, int n);
/* Test hook: the engine stops measuring its costs and takes these: a
 * decode-only step of any size costs decode_step_ms, a prefill token
 * chunk_token_ms in chunks beside decoding and whole_token_ms in a step
 * that carries a whole prompt. Then how a step's prefill is sized does
 * not depend on the machine's speed. Call while held or idle. */
void kt_engine_fix_costs(kt_engine *e, double decode_step_ms, double chunk_token_ms, double whole_token_ms);

#endif
