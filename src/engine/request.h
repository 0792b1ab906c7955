/*
 * request.h - a kt_request inside engine/: what the client asked for, the
 * event queue between the engine thread and the client, and the shared
 * ownership of the two.
 *
 * Ownership: a request starts with two references, the client's and the
 * engine's. kt_request_free drops the client's (cancelling first); the
 * engine drops its own once every choice has finished and the last event
 * is queued. Whoever drops the last one frees the memory.
 *
 * Locking: `mu` guards the event queue, `refs`, `done` and `usage`; the
 * cancel flag is atomic so the engine can read it without the lock.
 * `notify_mu` guards the client's callbacks (notify, client_gone): the
 * engine calls them with notify_mu held and kt_request_free clears them
 * under notify_mu, so once kt_request_free returns they are never called
 * again (their context may be gone). The callbacks may take the client's
 * own locks (the server's link mutex, then libmicrohttpd's), so the lock
 * order is notify_mu -> client locks, and nothing holding a client lock
 * may call into the request (kt_request_free, poll, cancel take notify_mu
 * or mu). `mu` is never held while notify_mu is taken, nor the reverse.
 * The fields under "engine only" are touched by the engine thread alone.
 */
#ifndef KT_ENGINE_REQUEST_H
#define KT_ENGINE_REQUEST_H

#include <pthread.h>
#include <stdatomic.h>

#include "engine/engine.h"
#include "engine/grammar_sample.h"
#include "engine/images.h"
#include "grammar/constraint.h"
#include "kv/block_pool.h"
#include "spec/policy.h"

/* One choice's generation state (engine only). */
typedef struct gen_choice {
    kv_seq *seq;
    int32_t *generated;  /* the sampled ids, max_tokens of room (for the prefix cache) */
    kt_sampler *sampler;
    kt_constraint *constraint; /* the grammar's state for this choice, or NULL */
    eng_watch watch;     /* lazy grammars: text watched for a trigger */
    kt_detok *detok;
    int32_t next_token;  /* sampled, to be fed at the next decode step */
    int n_generated;
    kt_finish finish;
    char *held;          /* decoded text not yet released: may start a stop string */
    size_t held_len, held_cap;
    uint64_t last_token_ns;
    /* speculation: this step's proposals (fed after next_token), and how
     * well this choice's proposals have fared */
    int32_t prop[SPEC_K_MAX];
    int n_prop;
    kv_seq *draft_seq;   /* the draft model's sequence (draft.h), or NULL */
    spec_accept accept;
    /* KT_SPEC_MTP: prompt lookup's own acceptance beside the MTP block's
     * (accept), and whether this step's proposals are the lookup's */
    spec_accept accept_lookup;
    bool prop_lookup;
} gen_choice;

typedef enum req_state { REQ_WAITING, REQ_PREFILL, REQ_DECODE, REQ_DONE } req_state;

typedef struct queued_event {
    kt_event ev;  /* ev.text points into text */
    char *text;
} queued_event;

struct kt_request {
    /* what was asked (immutable after submit) */
    int32_t *prompt;      /* ids, and images' key ids (images.h) */
    req_images images;
    int n_prompt, max_tokens, n_choices, top_logprobs, priority;
    kt_sampler_params sampling;
    char *stop[KT_MAX_STOP];
    size_t stop_len[KT_MAX_STOP];
    int n_stop;
    kt_logit_bias *bias;
    int n_bias;
    bool ignore_eos;
    bool prefill_only;    /* kt_gen_params.prefill_only */
    kt_grammar *grammar;  /* NULL: unconstrained */
    eng_triggers triggers; /* lazy grammars (n == 0: none) */
    bool special_text;
    kt_pooling embed;     /* KT_POOL_NONE: a generation */
    float *embd;          /* embed: the pooled vector being summed, n_embd floats */
    int n_embd;
    bool embd_done;       /* embd is final (under mu) */
    void (*notify)(void *ctx); /* under notify_mu */
    bool (*client_gone)(void *ctx); /* under notify_mu */
    void *notify_ctx;
    uint64_t arrival;     /* submit order, for ties in priority */
    int passed_over;      /* admissions of later requests of its priority ahead of it (under the engine's mu) */
    int blocks_reserved;  /* KV blocks committed to it at admission */
    int slots_reserved;   /* and window slots (0 without sliding-window layers) */

    pthread_mutex_t notify_mu;

    /* shared with the client, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    queued_event *events;
    int ev_head, ev_len, ev_cap; /* a FIFO: events[ev_head .. ev_head + ev_len) */
    int refs;
    bool done;            /* the engine queued its last event */
    kt_request_usage usage;
    char *client_text;    /* text of the event the client read last */
    /* An event could not be queued (out of memory): every later one is
     * dropped, and once the client has read the queued ones each choice
     * whose end was not queued ends in KT_FINISH_ERROR, made by the pop
     * without memory, so an answer never goes on with a gap or ends as if
     * complete. */
    bool lost;
    uint32_t finish_queued, finish_lost; /* by choice: an end queued; an error end handed out */
    atomic_bool cancel;

    /* engine only */
    req_state state;
    int n_prefilled;
    int n_cached;         /* of n_prefilled, taken from the prefix cache */
    bool waits_for_prefix; /* this step: an earlier request is computing a prefix it shares */
    int snap_extra;       /* hybrid models: a prefix length a waiting request shares, snapshotted (snapshots.h) */
    int prefill_passed_over; /* steps whose prefill budget went to later prompts with less left, not to it */
    bool prefill_whole;   /* its remainder goes in whole (whole steps until it is in; see build_batch) */
    gen_choice *choices;
    bool events_pending;  /* queued since the last notify */
};

/* A request with its parameters copied; NULL with err. */
kt_request *req_new(const kt_gen_params *p, kt_error *err);
/* Queues an event (text copied); false if out of memory, and then the
 * request is `lost` (above). */
bool req_push(kt_request *r, const kt_event *ev);
/* Marks the request finished (no more events) and wakes the client. */
void req_finish(kt_request *r);
/* Calls the client's notify if events were queued since the last call. */
void req_notify(kt_request *r);
/* Asks the client's client_gone callback (false without one). */
bool req_client_gone(kt_request *r);
/* Drops one reference; frees at zero. */
void req_release(kt_request *r);

#endif
