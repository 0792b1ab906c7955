/*
 * bench_soak.h - the parts of `kettle bench soak` that need no network:
 * the seeded mix of requests (what each client sends next, and its JSON
 * body), the check of each answer against what its kind must get, the
 * counts and latencies, the RSS series and its growth, /metrics parsing,
 * the pass / fail verdict and the reports. Kept apart from the libcurl
 * driver (cmd_bench_soak.c) so tests can check them on fixed inputs.
 *
 * A soak run is many clients, each sending one request after another for
 * a fixed time, drawn from a weighted mix of every kind of request the
 * server takes (and some it must refuse); what matters is that nothing
 * fails, nothing hangs, and the server's memory and KV cache come back to
 * where they were.
 */
#ifndef KT_CLI_BENCH_SOAK_H
#define KT_CLI_BENCH_SOAK_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/rng.h"
#include "cli/bench_serve.h"

/* ---- the mix ---- */

typedef enum sk_kind {
    SK_CHAT,              /* /v1/chat/completions, whole answer */
    SK_CHAT_STREAM,       /* the same, streamed */
    SK_COMPLETION,        /* /v1/completions, whole answer */
    SK_COMPLETION_STREAM, /* the same, streamed */
    SK_MULTI,             /* n = 2..3 choices, either endpoint, streamed or not */
    SK_TOOLS,             /* chat with two small tools and a tool_choice */
    SK_SCHEMA,            /* chat with response_format json_schema */
    SK_STOP,              /* completions with 1..3 stop strings */
    SK_ABANDON,           /* a long stream the client hangs up on after a few chunks */
    SK_MALFORMED,         /* a request the server must refuse with a 4xx */
    SK_N_KINDS
} sk_kind;

extern const char *const sk_kind_names[SK_N_KINDS];
/* Each kind's share of the requests, in percent (they sum to 100):
 * abandoned streams 10, malformed requests 5, as issue 23 asks. */
extern const int sk_kind_pct[SK_N_KINDS];

/* The ways a malformed request is wrong. */
typedef enum sk_fault {
    SK_FAULT_JSON,       /* a valid body cut short: not JSON */
    SK_FAULT_TYPE,       /* a known field of the wrong type */
    SK_FAULT_UNKNOWN,    /* a field kettle does not implement, with a value */
    SK_FAULT_UTF8,       /* invalid UTF-8 inside a string */
    SK_FAULT_EMPTY_STOP, /* an empty stop string (it would end every reply at once) */
    SK_FAULT_SCHEMA,     /* a json_schema that is no schema */
    SK_FAULT_N,          /* n above the engine's KT_MAX_CHOICES (16) */
    SK_FAULT_STOP,       /* 9 stop strings, above KT_MAX_STOP (8) */
    SK_N_FAULTS
} sk_fault;

extern const char *const sk_fault_names[SK_N_FAULTS];

/* The tool_choice a SK_TOOLS request sends. */
typedef enum sk_tool_choice { SK_TC_AUTO, SK_TC_REQUIRED, SK_TC_NAMED, SK_TC_NONE, SK_N_TC } sk_tool_choice;

/* One request, and what its answer must show. */
typedef struct sk_request {
    sk_kind kind;
    sk_fault fault;     /* SK_MALFORMED */
    bool chat;          /* /v1/chat/completions, else /v1/completions */
    bool stream;
    int n_choices;
    int max_tokens;
    sk_tool_choice tool_choice; /* SK_TOOLS */
    unsigned stop_mask; /* SK_STOP: which of sk_stop_strings it sent */
    int abandon_after;  /* SK_ABANDON: token chunks received, then hang up */
    char *body;         /* the JSON text sent (malloc'ed) */
} sk_request;

#define SK_N_STOP_STRINGS 5
extern const char *const sk_stop_strings[SK_N_STOP_STRINGS];

/* The tools SK_TOOLS requests offer (borrowed; made on first use, lives
 * until exit). NULL if out of memory. */
const json_t *sk_tools(void);

/* A kind drawn by sk_kind_pct. */
sk_kind sk_pick(kt_rng *rng);
/* Draws a kind and everything about the request (prompt, lengths, flags)
 * from rng, and builds its body. False if out of memory. */
bool sk_request_make(kt_rng *rng, sk_request *out);
/* The same for a given kind. */
bool sk_request_make_kind(kt_rng *rng, sk_kind kind, sk_request *out);
void sk_request_free(sk_request *r);
const char *sk_request_path(const sk_request *r);

/* ---- one answer ---- */

typedef enum sk_outcome {
    SK_OK,          /* what its kind must get */
    SK_OVERLOAD,    /* 503: the queue was full (counted apart, not a failure) */
    SK_HUNG,        /* nothing received for --timeout seconds */
    SK_TRANSPORT,   /* the connection failed or dropped */
    SK_BAD_STATUS,  /* a status its kind must not get (any 5xx but 503 among them) */
    SK_BAD_ANSWER,  /* the status was right, the answer was not */
    SK_N_OUTCOMES
} sk_outcome;

extern const char *const sk_outcome_names[SK_N_OUTCOMES];

typedef enum sk_transport { SK_NET_OK, SK_NET_TIMEOUT, SK_NET_ERROR } sk_transport;

/* What came back for a request. */
typedef struct sk_answer {
    sk_transport net;
    long status;          /* 0: none */
    const char *body;     /* a whole answer (not streamed) or an error's start; may be NULL */
    const bs_sse *sse;    /* a stream's parse (keep_text) */
    bool abandoned;       /* the client hung up as planned, after abandon_after chunks */
} sk_answer;

/* Judges an answer. Besides its status, a whole answer must be the JSON
 * its kind makes (choices, finish reasons, usage within max_tokens); a
 * stream must end with [DONE] unless abandoned; a json_schema answer that
 * finished must parse and match the schema; a tool call must name an
 * offered tool with arguments that check; stop strings must not be in
 * the text; a refusal must be an error object. *cut is set when the
 * answer stopped at max_tokens before what would be checked (a schema
 * answer or a tool call cut short). why gets the reason when not SK_OK. */
sk_outcome sk_check(const sk_request *r, const sk_answer *a, bool *cut, char *why, size_t cap);

/* ---- counts, latencies, samples ---- */

typedef struct sk_samples {
    double *v;
    int n, cap;
} sk_samples;

typedef struct sk_kind_stats {
    int n;
    int by_outcome[SK_N_OUTCOMES];
    int n_cut;           /* answers cut by max_tokens before their check applied */
    sk_samples lat_ms;   /* sent .. done (abandoned: .. hung up), answers SK_OK */
    sk_samples ttft_ms;  /* streams: sent .. first token chunk */
} sk_kind_stats;

#define SK_MAX_STATUSES 32

/* One sample of the server, every --rss-every seconds. */
typedef struct sk_sample {
    double t_s;          /* since the load started */
    long long rss_bytes; /* -1: unknown */
    double kv_used, kv_cached; /* kettle_kv_blocks_used, kettle_cache_blocks; -1: unknown */
    int in_flight;       /* client requests open then */
    double queued;       /* of them, waiting for admission (kettle_queue_depth); -1: unknown */
} sk_sample;

typedef struct sk_stats {
    sk_kind_stats kinds[SK_N_KINDS];
    long status_code[SK_MAX_STATUSES]; /* each status seen (0: no answer), with its count */
    int status_n[SK_MAX_STATUSES], n_statuses;
    int n_requests;
    sk_sample *samples;
    int n_samples, cap_samples;
} sk_stats;

/* Adds one judged request. ttft_ms < 0: none. False if out of memory. */
bool sk_stats_add(sk_stats *s, const sk_request *r, long status, sk_outcome o, bool cut, double lat_ms,
                  double ttft_ms);
bool sk_stats_add_sample(sk_stats *s, const sk_sample *x);
void sk_stats_free(sk_stats *s);

/* RSS growth over the last half of a run of duration_s seconds, in
 * percent: the first and last samples at or after duration_s / 2 with a
 * known RSS. NAN if there are fewer than two. */
double sk_rss_growth_pct(const sk_sample *s, int n, double duration_s);

/* The sum of every series of a metric in Prometheus text ("NAME v" and
 * "NAME{...} v" lines: one per inference class). False if none. */
bool sk_metric_sum(const char *text, const char *name, double *out);

/* ---- the verdict and the reports ---- */

/* RSS is judged only for runs this long: shorter ones are mostly warm-up. */
#define SK_RSS_MIN_DURATION_S 120
#define SK_RSS_MAX_GROWTH_PCT 5.0

typedef struct sk_result {
    const char *target; /* the model file or the URL */
    int clients, duration_s, rss_every_s, timeout_s;
    uint64_t seed;
    double wall_s;      /* the load: first request .. last answer */
    sk_stats stats;
    /* KV blocks: right after start-up, the most seen while loaded, after the run settled */
    double kv_idle_used, kv_idle_cached, kv_peak_used, kv_end_used, kv_end_cached, kv_total;
    bool settled;       /* no request running or queued before the end figures were read */
    double settle_s;    /* how long that took */
} sk_result;

typedef struct sk_verdict {
    int n_5xx;          /* 5xx other than 503 */
    int n_hung, n_transport, n_bad_status, n_bad_answer;
    double rss_growth_pct; /* NAN: not known */
    bool rss_judged;    /* duration >= SK_RSS_MIN_DURATION_S */
    bool rss_ok, kv_ok, ok;
} sk_verdict;

sk_verdict sk_judge(const sk_result *r);
/* The report, Markdown or one JSON document; false if out of memory. */
bool sk_print(FILE *f, bs_fmt fmt, const sk_result *r, const sk_verdict *v);

#endif
