/*
 * bench_serve.h - the parts of `kettle bench serve` that need no network:
 * an incremental parser for one server-sent-events (SSE) completion
 * stream, nearest-rank percentiles, the per-level summary, and the report
 * writers (Markdown, CSV, JSON, SVG). Kept apart from the libcurl driver
 * (cmd_bench_serve.c) so tests can feed them fixed text and numbers.
 * `kettle bench agent` uses the stream parser and the percentiles too
 * (with keep_text: it sends each reply back in the next turn).
 */
#ifndef KT_CLI_BENCH_SERVE_H
#define KT_CLI_BENCH_SERVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include <jansson.h>

/* ---- one SSE stream ---- */

/* What one streamed /v1/completions (or chat) response has said so far.
 * Only "data:" lines are read; a chunk whose choices carry non-empty text
 * (completions), delta content or delta tool_calls (chat) is a token chunk
 * and gets the time it arrived. */
typedef struct bs_sse {
    char *line;           /* the incomplete last line */
    size_t line_len, line_cap;
    double *tok_ms;       /* arrival time of each token chunk */
    int n_tok, tok_cap;
    int completion_tokens; /* from the usage chunk; -1 until one arrives */
    int prompt_tokens;     /* likewise */
    int cached_tokens;     /* usage.prompt_tokens_details.cached_tokens; -1 if never reported */
    bool keep_text;        /* set after init: collect the text and tool calls below */
    char *text;            /* keep_text: the generated text so far, NUL-terminated (NULL: none yet) */
    size_t text_len, text_cap;
    json_t *tool_calls;    /* keep_text: streamed tool_calls merged by index into
                              [{"id","type","function":{"name","arguments"}}]; NULL: none */
    int n_length, n_stop;  /* finish_reason "length" / anything else */
    char finish[16];       /* the last finish_reason seen, "" if none */
    bool done;             /* saw "data: [DONE]" */
    char error[320];       /* non-empty: an error object, bad JSON, or no memory */
} bs_sse;

void bs_sse_init(bs_sse *s);
void bs_sse_free(bs_sse *s);
/* Feeds bytes received at t_ms. False (and s->error set) on a protocol
 * error or out of memory; the stream should then be abandoned. */
bool bs_sse_feed(bs_sse *s, const char *data, size_t len, double t_ms);

/* ---- statistics ---- */

/* Nearest-rank percentile of n >= 1 ascending samples: the smallest sample
 * such that at least p% of the samples are <= it, i.e. sorted[ceil(p/100 *
 * n) - 1] (clamped to [0, n-1]). No interpolation: every figure reported
 * is a latency that was actually observed. 0 for n == 0. */
double bs_percentile(const double *sorted, int n, double p);
/* Sorts v ascending in place. */
void bs_sort(double *v, int n);

typedef struct bs_pcts {
    double p50, p95, p99, max; /* max: the longest single stall, where a rare one hides past p99 */
    int n;                     /* samples */
} bs_pcts;

/* Sorts v and fills p50/p95/p99/max. */
bs_pcts bs_pcts_of(double *v, int n);

/* The figures of one concurrency level. */
typedef struct bs_level {
    int concurrency, n_requests;
    long n_tokens;             /* generated tokens, all requests */
    long n_prompt_tokens;      /* prompt tokens, all requests */
    int n_finish_length;       /* requests that stopped at max_tokens */
    double wall_ms;            /* first request sent .. last one done */
    double tokens_per_s;       /* n_tokens / wall */
    double ratio;              /* tokens_per_s / that of the base level */
    bs_pcts ttft_ms, itl_ms;
    /* --long-prompt: one extra request while the others decode */
    bool has_long;
    int long_prompt_tokens;
    double long_ttft_ms;
    bs_pcts itl_in_ms, itl_out_ms; /* ITL overlapping the long prefill window, and the rest */
    double health_max_ms;
    int n_health;
} bs_level;

/* ---- reports ---- */

typedef enum bs_fmt { BS_MD, BS_CSV, BS_JSON } bs_fmt;

typedef struct bs_report {
    const char *target; /* the URL, or the model file */
    int prompt_tokens, max_tokens, ratio_base_c;
    const bs_level *levels;
    int n_levels;
} bs_report;

void bs_print(FILE *out, bs_fmt fmt, const bs_report *r);
/* Writes the SVG plot; false (errno set) if the file cannot be written. */
bool bs_write_svg(const char *path, const bs_report *r);

#endif
