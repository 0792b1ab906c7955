/*
 * bench_agent.h - the parts of `kettle bench agent` that need no network:
 * the workload (synthetic agent sessions, or recorded conversations read
 * from JSONL and replayed), the per-turn measurements and their summary,
 * and the reports (Markdown, CSV, JSON, SVG). Kept apart from the libcurl
 * driver (cmd_bench_agent.c) so tests can check them on fixed inputs.
 *
 * A session is one agent conversation, driven turn by turn: each turn is
 * one streamed POST /v1/chat/completions carrying the whole history so
 * far, as agent frameworks send it. Messages are jansson values: they go
 * into the request body as they are.
 */
#ifndef KT_CLI_BENCH_AGENT_H
#define KT_CLI_BENCH_AGENT_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "cli/bench_serve.h"

/* ---- the workload ---- */

typedef struct ba_session {
    char name[160];      /* for messages: "session 2", "swe.jsonl:3 (marshmallow-1867)" */
    json_t *tools;       /* sent with every turn (owned); NULL: none */
    json_t *base;        /* synthetic: [system, user]; replay: the whole conversation, converted */
    json_t *tool_texts;  /* synthetic: the tool result of turn k (array of strings, k < n_turns - 1) */
    int n_turns;
    int *turn_end;       /* replay: turn k sends base[0 .. turn_end[k]) */
} ba_session;

typedef struct ba_workload {
    ba_session *s;
    int n;
    bool synthetic;
    char desc[512]; /* one line saying what it is, for the reports */
} ba_workload;

void ba_workload_free(ba_workload *w);

/* How texts are sized: tokens = words x tokens_per_word (the generator's
 * words are one token each in Llama, GPT-2 and Qwen vocabularies; a period
 * ends every sentence) and JSON tokens = bytes x json_tokens_per_byte. */
typedef struct ba_sizing {
    double tokens_per_word, json_tokens_per_byte;
    bool calibrated; /* measured with the server's /tokenize */
} ba_sizing;

/* Without /tokenize: a period every ~12 words, ~3.3 bytes per JSON token. */
#define BA_SIZING_DEFAULT ((ba_sizing){1.08, 0.3, false})

/* n_words words from a generator seeded by seed, as sentences: the same
 * text on every run. NULL if out of memory. */
char *ba_words(uint64_t seed, int n_words);

typedef struct ba_synth_opts {
    int sessions, turns, system_tokens, doc_tokens, tool_tokens;
    uint64_t seed;
    ba_sizing sz;
    bool tools_in_system; /* the schemas as JSON text in the system prompt, no `tools` field */
} ba_synth_opts;

/* The tool schemas of the synthetic system prompt (a new array): as many
 * as fit, in order, in 60% of system_tokens (all four at the default 1100,
 * ~580 tokens in Llama's vocabulary), so some prompt text is always left. */
json_t *ba_synth_tools(int system_tokens, const ba_sizing *sz);

/* The synthetic workload: every session shares the system prompt and its
 * tools (what a prefix cache can share between sessions); each has its own
 * document and tool results. False with err set if out of memory. */
bool ba_synth_build(const ba_synth_opts *o, ba_workload *w, char *err, size_t cap);

typedef struct ba_replay_opts {
    const char *path;
    int limit;           /* at most this many conversations; 0: all */
    int max_turns;       /* at most this many turns each; 0: all */
    json_t *tools;       /* for conversations that name none (borrowed); NULL: none */
    bool native;         /* send role "tool" and tool_calls as recorded */
} ba_replay_opts;

/* Reads a JSONL file of conversations, one JSON object a line: "messages"
 * (OpenAI messages), or "messages_display" (a "role: text" transcript, as
 * tau-bench's few-shot files), and optionally "tools" (an array, or the
 * name of a JSON file beside it). False with err naming the file and line. */
bool ba_replay_load(const ba_replay_opts *o, ba_workload *w, char *err, size_t cap);

/* ---- one session's conversation, as it runs ---- */

/* A new history for a session in round `round` (1-based): its base
 * messages; from round 2 on the first message starts with "(round N)" so
 * a prefix cache holds nothing of the round before. NULL if out of memory. */
json_t *ba_history_new(const ba_session *s, int round);
/* The messages turn k (0-based) sends: a new reference. */
json_t *ba_turn_messages(const ba_session *s, json_t *history, int turn);
/* After turn k answered `text` (and perhaps tool_calls): a synthetic
 * session appends the reply verbatim and turn k's tool result. A reply
 * with tool_calls goes back as an assistant message with those calls and
 * the result as role "tool" with the first call's id; a plain reply (what
 * kettle's server gives) as assistant content and a user message "Tool
 * result: ...". Replayed sessions send the recorded history: nothing to
 * do. False if out of memory. */
bool ba_feed_reply(const ba_session *s, json_t *history, int turn, const char *text, json_t *tool_calls);

/* ---- measurements ---- */

typedef struct ba_turn_rec {
    int prompt_tokens;     /* from usage; -1: not reported */
    int cached_tokens;     /* usage.prompt_tokens_details.cached_tokens; -1: not reported */
    int completion_tokens; /* from usage, else the token chunks */
    double ttft_ms;        /* request sent .. first token chunk (the whole turn if none came) */
    double turn_ms;        /* request sent .. stream done */
    double decode_ms;      /* first token chunk .. stream done */
    int n_calls;           /* tool calls in the reply */
    bool calls_valid;      /* each names an offered function, with arguments that check (ba_calls_valid) */
} ba_turn_rec;

/* Would a client take these calls (an array of OpenAI tool calls) as they
 * are? Each must name a function of `tools`, with arguments that parse as
 * a JSON object holding every required parameter, each parameter of the
 * schema's top-level type where it names one, and no other key where the
 * schema says additionalProperties false. A turn whose calls fail is one
 * a client retries. (A light check: nested schemas are not walked; the
 * test suite judges kettle's calls with a full validator.) */
bool ba_calls_valid(const json_t *tools, const json_t *calls);

typedef struct ba_sess_rec {
    int round, session; /* 1-based */
    const char *name;   /* the workload's */
    int n_turns;
    ba_turn_rec *turns;
    double task_ms; /* first turn sent .. last turn done */
} ba_sess_rec;

/* Everything measured against one server, all rounds. */
typedef struct ba_result {
    const char *target;
    ba_sess_rec *sess; /* rounds x sessions, round-major */
    int n_sess;
    long long peak_rss; /* bytes, when the server is our child; -1: unknown */
} ba_result;

/* Allocates rounds x w->n session records. False if out of memory. */
bool ba_result_init(ba_result *r, const char *target, const ba_workload *w, int rounds);
void ba_result_free(ba_result *r);

typedef struct ba_turn_stats {
    int n;
    bs_pcts ttft_ms, turn_ms;
    double prompt_mean, cached_mean; /* cached_mean over the samples that report it */
    int n_cached;
} ba_turn_stats;

typedef struct ba_summary {
    ba_turn_stats *per_turn; /* turn index 1..n_turns at [0..n_turns) */
    int n_turns;
    bs_pcts ttft_first_ms, ttft_later_ms, task_ms;
    long long prompt_tokens, cached_tokens, prefill_tokens, decode_tokens;
    int n_turns_total, n_cached; /* turns, and those that reported cached tokens */
    double decode_tokens_per_s;  /* per stream: (tokens - 1 per turn) / time after the first token */
    int n_call_turns, n_valid_call_turns; /* turns whose reply had tool calls; of them, valid ones */
    long long peak_rss;
} ba_summary;

/* False if out of memory. */
bool ba_summarize(const ba_result *r, ba_summary *s);
void ba_summary_free(ba_summary *s);

/* ---- reports ---- */

typedef struct ba_report {
    const ba_workload *w;
    int rounds, concurrency, gen_tokens;
    const ba_result *results;
    const ba_summary *sums;
    int n_targets;
} ba_report;

/* Over the first target: task time p50 and later-turn TTFT p50 of target i. */
void ba_ratios(const ba_report *r, int i, double *task_p50, double *ttft_later_p50);
/* Prints the report; false if out of memory (JSON). */
bool ba_print(FILE *out, bs_fmt fmt, const ba_report *r);
/* TTFT p50 and p95 per turn index, one line per target; false (errno set)
 * if the file cannot be written. */
bool ba_write_svg(const char *path, const ba_report *r);

#endif
