/*
 * bench_agent_shots.h - `kettle bench agent --screenshots`: the loop of a
 * computer-use agent as a workload. Each step sends a new synthetic
 * screenshot (bench_screens.h) with the history so far and asks for one
 * action as JSON under a schema; the agent then "executes" it (a sleep of
 * --action-ms) and captures the next screen. With --prepare, the
 * conversation so far is sent during that sleep as a max_tokens 0 request
 * (the prepared step), so the next request only has the new screenshot to
 * prefill.
 *
 * This header holds the network-free half (the conversation, the action
 * check, the records, their summary and the reports) so tests can check
 * it on fixed inputs; the driver is bench_agent_shots_run.c.
 */
#ifndef KT_CLI_BENCH_AGENT_SHOTS_H
#define KT_CLI_BENCH_AGENT_SHOTS_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "cli/bench_serve.h"

typedef struct ba_shots_opts {
    int steps;          /* per session */
    int sessions;       /* run one after another */
    int keep_screens;   /* screenshots kept as images in the history (the newest); 0: all */
    int screen_w, screen_h;
    int action_ms;      /* the agent executing an action, before the next capture */
    int gen_tokens;     /* max_tokens of a step */
    bool prepare;       /* also run every target with the prepared step */
    uint64_t seed;
    const char *model_name; /* the requests' "model"; NULL: none */
} ba_shots_opts;

/* The text omitted screenshots are replaced with, as agent frameworks do. */
#define BA_SHOT_OMITTED "[screenshot omitted]"

/* ---- the conversation ---- */

/* The response_format of every step: a json_schema for one action on a
 * w x h screen (a new object). NULL if out of memory. */
json_t *ba_shots_response_format(int w, int h);

/* The history a session starts with: [system]. NULL if out of memory. */
json_t *ba_shots_history_new(void);

/* Appends step `step` (0-based): a user message of its text and the
 * screenshot as an image_url part (data_url: "data:image/png;base64,...").
 * False if out of memory. */
bool ba_shots_add_screen(json_t *history, int step, const char *data_url);

/* Appends the assistant's reply, verbatim. False if out of memory. */
bool ba_shots_add_reply(json_t *history, const char *text);

/* The messages to send (a new array): the history with only the newest
 * `keep` screenshots as images (keep 0: all), the older ones replaced by
 * BA_SHOT_OMITTED, counting `coming` screenshots that are not in the
 * history yet: the prepared step sends the history as the next step will
 * send it, so the screenshot that will drop out is already dropped and
 * the prefix it prefills is the next step's. *n_images: the images kept.
 * NULL if out of memory. */
json_t *ba_shots_messages(json_t *history, int keep, int coming, int *n_images);

/* Would an agent take this reply as an action? A JSON object with
 * "action" one of click, type, key, scroll, done, integer "x" and "y" on
 * the w x h screen, an optional string "text" of at most 40 characters,
 * and nothing else (the response_format's schema). */
bool ba_action_valid(const char *text, int w, int h);

/* The start of text in dst[cap], cut at a character boundary: a cut
 * inside a UTF-8 sequence would make the JSON report unwritable. */
void ba_reply_start(char *dst, size_t cap, const char *text);

/* ---- measurements ---- */

typedef struct ba_step_rec {
    bool done;             /* measured (a failed target stops part way) */
    int images;            /* screenshots sent as images */
    int prompt_tokens;     /* from usage; -1: not reported */
    int cached_tokens;     /* usage.prompt_tokens_details.cached_tokens; -1: not reported */
    int completion_tokens; /* from usage, else the token chunks */
    double ttft_ms;        /* request sent .. first token chunk (the whole request if none came) */
    double action_ms;      /* request sent .. reply parsed as an action: screenshot-to-action */
    bool action_valid;     /* ba_action_valid */
    char reply[128];       /* the start of the reply, for the JSON report */
    char finish[16];       /* its finish_reason ("length": cut at max_tokens) */
    /* the target's /metrics across the request; -1: not known (no such metric) */
    double encode_ms;      /* kettle_image_encode_seconds_total's delta */
    int encodes;           /* kettle_image_encodes_total's delta */
    int encoder_hits;      /* kettle_image_cache_hits_total's delta */
    /* --prepare: the prepared request sent while this step's action ran */
    bool prepared;
    double prep_ms;        /* sent .. its stream done */
    int prep_prompt_tokens, prep_cached_tokens; /* -1: not reported */
    int prep_encodes;      /* -1: not known */
    double prep_wait_ms;   /* how long the prepared request outlasted the action (0: it did not) */
} ba_step_rec;

typedef struct ba_shots_sess {
    int session; /* 1-based */
    int n_steps;
    ba_step_rec *steps;
    double task_ms; /* first step sent .. last action parsed; 0 if not finished */
} ba_shots_sess;

/* One target: a server, plain or with the prepared step. */
typedef struct ba_shots_result {
    const char *target; /* what the reports call it */
    bool prepare;
    ba_shots_sess *sess;
    int n_sess;
    char error[1024]; /* non-empty: the target failed (session, step and the server's message) */
} ba_shots_result;

/* False if out of memory. */
bool ba_shots_result_init(ba_shots_result *r, const char *target, bool prepare, int sessions, int steps);
void ba_shots_result_free(ba_shots_result *r);

typedef struct ba_step_stats {
    int n;
    bs_pcts ttft_ms, action_ms;
    double images_mean, prompt_mean, cached_mean, encode_ms_mean, encodes_mean;
    int n_cached, n_encode; /* samples that report cached tokens / encode figures */
} ba_step_stats;

typedef struct ba_shots_summary {
    ba_step_stats *per_step; /* step 1..n_steps at [0..n_steps) */
    int n_steps;
    bs_pcts action_ms, ttft_ms;  /* every step */
    bs_pcts ttft_later_ms;       /* steps >= 2: after a prepared step where the target prepares */
    bs_pcts encode_ms;           /* per step, where known */
    bs_pcts task_ms;             /* sessions that finished */
    bs_pcts prep_ms;             /* the prepared requests */
    int n_prep_waits;            /* prepared requests that outlasted the action */
    int n_steps_done, n_valid;
    long long prompt_tokens, cached_tokens;
    int n_cached;
} ba_shots_summary;

bool ba_shots_summarize(const ba_shots_result *r, ba_shots_summary *s);
void ba_shots_summary_free(ba_shots_summary *s);

/* ---- reports ---- */

typedef struct ba_shots_report {
    const ba_shots_opts *o;
    const ba_shots_result *results;
    const ba_shots_summary *sums;
    int n_targets;
} ba_shots_report;

/* Over the first target: target i's step (screenshot-to-action) time p50,
 * later-step TTFT p50 and task time p50; 0 where either has none. */
void ba_shots_ratios(const ba_shots_report *r, int i, double *action_p50, double *ttft_later_p50, double *task_p50);
/* Prints the report (BS_MD, BS_CSV: one row per step, BS_JSON); false if
 * out of memory. */
bool ba_shots_print(FILE *out, bs_fmt fmt, const ba_shots_report *r);


/* ---- the run (bench_agent_shots_run.c) ---- */

struct bh_conn;
/* Runs o's sessions against each server (names: what the reports call
 * them; with o->prepare each twice, plain and prepared) and prints the
 * report in fmt. The exit status: 0, or 1 if a target failed (it is in the
 * report) or a server did not answer its warm-up. */
int ba_shots_main(const ba_shots_opts *o, bs_fmt fmt, const struct bh_conn *conns, const char *const *names,
                  int n_urls);

#endif
