/*
 * bench_agent_shots_run.c - the driver of `kettle bench agent
 * --screenshots`: each session is the loop of a computer-use agent, step
 * after step against one server: capture a screen (a new synthetic PNG),
 * send it with the history as a streaming chat request under the action
 * schema, parse the action, execute it (sleep --action-ms), repeat.
 *
 * One request is in flight at a time, as in an agent's loop, so the
 * requests are plain blocking libcurl transfers; the stream is parsed as
 * it arrives (bench_serve_stats.c), so TTFT is the first token chunk's
 * arrival. The step time is request sent .. action parsed: what the agent
 * waits for between a screenshot and its next move.
 *
 * The vision encoder's work per step is read from the target's /metrics
 * around each request (kettle_image_encode_seconds_total and
 * kettle_image_encodes_total); a server without those (llama-server) gets
 * "-", never a guess (they are the server's counters: a target serving
 * other clients' images meanwhile would count those too). With --prepare every target also runs with the
 * prepared step: while the action "executes", the history with the reply
 * just parsed goes out as a max_tokens 0 request so the server prefills it
 * then; the next capture waits for that request to end (how often it
 * outlasted the action is reported), so a step's figures never overlap
 * the prepared request's. Those runs use other screenshots (another seed)
 * so no run finds the other's images in the server's caches.
 *
 * Targets run session by session, alternating (A, A prepared, B, ...), in
 * one sitting. A target that fails a step is reported as failed with the
 * server's message and skipped from then on; the exit status is then 1.
 */
#include <curl/curl.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/timing.h"
#include "cli/bench_agent_shots.h"
#include "cli/bench_http.h"
#include "cli/bench_screens.h"
#include "cli/bench_soak.h" /* sk_metric_sum: a metric summed over its label sets */

#define CMD "bench agent"
#define MAX_TARGETS 8
#define METRICS_MAX_BYTES (4u << 20)
#define METRICS_TIMEOUT_MS 10000L

typedef struct target {
    const bh_conn *conn;
    bool has_metrics; /* /metrics has the encoder's figures */
    char name[1100];
} target;

/* ---- /metrics ---- */

typedef struct enc_counters {
    double seconds, encodes, hits;
} enc_counters;

/* The encoder's counters now; false if the target does not give them. */
static bool read_counters(const bh_conn *conn, enc_counters *c) {
    bh_req r = {.plain = true, .keep_body = true};
    bool ok = false;
    if (bh_req_init(&r, conn, "/metrics")) {
        r.resp.max = METRICS_MAX_BYTES;
        curl_easy_setopt(r.h, CURLOPT_TIMEOUT_MS, METRICS_TIMEOUT_MS);
        long status = 0;
        ok = curl_easy_perform(r.h) == CURLE_OK && !curl_easy_getinfo(r.h, CURLINFO_RESPONSE_CODE, &status) &&
             status == 200 && r.resp.p && sk_metric_sum(r.resp.p, "kettle_image_encode_seconds_total", &c->seconds) &&
             sk_metric_sum(r.resp.p, "kettle_image_encodes_total", &c->encodes);
        if (ok && !sk_metric_sum(r.resp.p, "kettle_image_cache_hits_total", &c->hits)) c->hits = -1;
    }
    bh_req_free(&r);
    return ok;
}

/* ---- one request ---- */

/* Every request the same but for max_tokens (0: the prepared step), so
 * the prepared one is what the next step's request starts with, even on a
 * server that would put the schema into the prompt. */
static char *request_body(const ba_shots_opts *o, json_t *msgs, int max_tokens) {
    json_t *rf = ba_shots_response_format(o->screen_w, o->screen_h);
    json_t *b = json_pack("{s:O, s:i, s:i, s:b, s:{s:b}, s:o, s:s*}", "messages", msgs, "max_tokens", max_tokens,
                          "temperature", 0, "stream", 1, "stream_options", "include_usage", 1, "response_format", rf,
                          "model", o->model_name);
    char *text = b ? json_dumps(b, JSON_COMPACT) : NULL;
    json_decref(b);
    return text;
}

/* A streaming POST /v1/chat/completions of body (taken); r holds the
 * answer. False with msg set if it failed. */
static bool post(const bh_conn *conn, char *body, bh_req *r, char *msg, size_t cap) {
    *r = (bh_req){.body = body};
    if (!body || !bh_req_init(r, conn, "/v1/chat/completions")) return snprintf(msg, cap, "out of memory"), false;
    r->sse.keep_text = true;
    r->start_ms = kt_time_ms();
    CURLcode rc = curl_easy_perform(r->h);
    r->end_ms = kt_time_ms();
    if (!r->status) curl_easy_getinfo(r->h, CURLINFO_RESPONSE_CODE, &r->status);
    return !bh_req_failed(r, rc, msg, cap);
}

/* ---- one session ---- */

typedef struct sess_ctx {
    const ba_shots_opts *o;
    target *t;
    ba_shots_result *res;
    ba_shots_sess *rec;
    json_t *history;
    uint64_t seed;
    int step; /* 0-based, the one being run */
} sess_ctx;

static bool sess_fail(sess_ctx *s, const char *what, const char *msg) {
    snprintf(s->res->error, sizeof s->res->error, "session %d, step %d/%d%s: %s", s->rec->session, s->step + 1,
             s->o->steps, what, msg);
    return false;
}

/* Captures the screen: the step's PNG as a data: URL in a new user message. */
static bool capture(sess_ctx *s) {
    uint8_t *png = NULL;
    size_t n = 0;
    char err[256];
    if (!ba_screen_png(s->seed, s->step, s->o->screen_w, s->o->screen_h, &png, &n, err, sizeof err))
        return sess_fail(s, "", err);
    char *b64 = ba_base64(png, n);
    free(png);
    size_t len = b64 ? strlen(b64) + 32 : 0;
    char *url = b64 ? malloc(len) : NULL;
    if (url) snprintf(url, len, "data:image/png;base64,%s", b64);
    bool ok = url && ba_shots_add_screen(s->history, s->step, url);
    free(b64), free(url);
    return ok || sess_fail(s, "", "out of memory");
}

static void record_counters(const enc_counters *a, const enc_counters *b, ba_step_rec *x) {
    x->encode_ms = (b->seconds - a->seconds) * 1e3;
    x->encodes = (int)(b->encodes - a->encodes + 0.5);
    x->encoder_hits = a->hits >= 0 && b->hits >= 0 ? (int)(b->hits - a->hits + 0.5) : -1;
}

/* The step's answer: its action parsed (and checked) first, so the step
 * time ends when an agent would have its action. */
static void record_step(const bh_req *r, ba_step_rec *x, const ba_shots_opts *o) {
    const bs_sse *e = &r->sse;
    x->action_valid = ba_action_valid(e->text, o->screen_w, o->screen_h);
    x->action_ms = kt_time_ms() - r->start_ms;
    double first = e->n_tok ? e->tok_ms[0] : r->end_ms; /* nothing came: the whole request was the wait */
    x->prompt_tokens = e->prompt_tokens, x->cached_tokens = e->cached_tokens;
    x->completion_tokens = e->completion_tokens >= 0 ? e->completion_tokens : e->n_tok;
    x->ttft_ms = first - r->start_ms;
    ba_reply_start(x->reply, sizeof x->reply, e->text ? e->text : "");
    snprintf(x->finish, sizeof x->finish, "%s", e->finish);
    x->done = true;
}

/* Sends the step's request and records it; its reply joins the history. */
static bool ask_action(sess_ctx *s) {
    ba_step_rec *x = &s->rec->steps[s->step];
    *x = (ba_step_rec){.encode_ms = -1, .encodes = -1, .encoder_hits = -1, .prep_encodes = -1};
    json_t *msgs = ba_shots_messages(s->history, s->o->keep_screens, 0, &x->images);
    char *body = msgs ? request_body(s->o, msgs, s->o->gen_tokens) : NULL;
    json_decref(msgs);
    enc_counters before, after;
    bool counted = s->t->has_metrics && read_counters(s->t->conn, &before);
    bh_req r;
    char msg[800];
    bool ok = post(s->t->conn, body, &r, msg, sizeof msg);
    if (ok) {
        record_step(&r, x, s->o);
        if (counted && read_counters(s->t->conn, &after)) record_counters(&before, &after, x);
        ok = ba_shots_add_reply(s->history, r.sse.text) || (snprintf(msg, sizeof msg, "out of memory"), false);
    }
    bh_req_free(&r);
    return ok || sess_fail(s, "", msg);
}

/* The prepared step: the history as the next step will send it, without
 * its new screenshot, at max_tokens 0. */
static bool prepare_next(sess_ctx *s) {
    ba_step_rec *x = &s->rec->steps[s->step];
    int n_images;
    json_t *msgs = ba_shots_messages(s->history, s->o->keep_screens, 1, &n_images);
    char *body = msgs ? request_body(s->o, msgs, 0) : NULL;
    json_decref(msgs);
    enc_counters before, after;
    bool counted = s->t->has_metrics && read_counters(s->t->conn, &before);
    bh_req r;
    char msg[800];
    bool ok = post(s->t->conn, body, &r, msg, sizeof msg);
    if (ok) {
        x->prepared = true, x->prep_ms = r.end_ms - r.start_ms;
        x->prep_prompt_tokens = r.sse.prompt_tokens, x->prep_cached_tokens = r.sse.cached_tokens;
        if (counted && read_counters(s->t->conn, &after)) x->prep_encodes = (int)(after.encodes - before.encodes + 0.5);
    }
    bh_req_free(&r);
    return ok || sess_fail(s, ", the prepared request (max_tokens 0)", msg);
}

static void sleep_ms(double ms) {
    long long us = (long long)(ms * 1e3);
    struct timespec t = {.tv_sec = (time_t)(us / 1000000), .tv_nsec = (long)(us % 1000000) * 1000};
    while (nanosleep(&t, &t) && errno == EINTR) {
    }
}

/* The agent executes the action: --action-ms, with the prepared request
 * sent meanwhile under --prepare. */
static bool act(sess_ctx *s) {
    double t0 = kt_time_ms();
    if (s->res->prepare && !prepare_next(s)) return false;
    double left_ms = s->o->action_ms - (kt_time_ms() - t0);
    if (left_ms > 0) sleep_ms(left_ms);
    else if (s->res->prepare) s->rec->steps[s->step].prep_wait_ms = -left_ms;
    return true;
}

static bool run_steps(sess_ctx *s) {
    double t0 = 0, last = 0;
    for (s->step = 0; s->step < s->o->steps; s->step++) {
        if (!capture(s)) return false;
        if (s->step == 0) t0 = kt_time_ms();
        if (!ask_action(s)) return false;
        last = kt_time_ms();
        if (s->step + 1 < s->o->steps && !act(s)) return false;
    }
    s->rec->task_ms = last - t0;
    return true;
}

/* Session k (0-based) of target t; false (the target's error set) if it failed. */
static bool run_session(const ba_shots_opts *o, target *t, ba_shots_result *res, int k) {
    /* each session and mode its own screens: neither finds the other's in the caches */
    uint64_t seed = o->seed * 1000003u + (uint64_t)k * 2u + (res->prepare ? 1u : 0u);
    sess_ctx s = {.o = o, .t = t, .res = res, .rec = &res->sess[k], .history = ba_shots_history_new(), .seed = seed};
    bool ok = s.history ? run_steps(&s) : sess_fail(&s, "", "out of memory");
    json_decref(s.history);
    return ok;
}

/* ---- the run ---- */

/* One short text request, unmeasured: connects, touches first-use costs,
 * and finds a server that cannot chat before any figure is taken; then
 * whether /metrics has the encoder's counters. */
static bool warm_up(const ba_shots_opts *o, target *t) {
    json_t *msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", "Hello.");
    char *body = msgs ? request_body(o, msgs, 2) : NULL;
    json_decref(msgs);
    bh_req r;
    char msg[800];
    bool ok = post(t->conn, body, &r, msg, sizeof msg);
    bh_req_free(&r);
    if (!ok) fprintf(stderr, "kettle %s: %s, warm-up request: %s\n", CMD, t->name, msg);
    enc_counters c;
    t->has_metrics = ok && read_counters(t->conn, &c);
    return ok;
}

static bool report(const ba_shots_opts *o, bs_fmt fmt, const ba_shots_result *res, int n) {
    ba_shots_summary sums[MAX_TARGETS];
    int made = 0;
    while (made < n && ba_shots_summarize(&res[made], &sums[made])) made++;
    ba_shots_report r = {.o = o, .results = res, .sums = sums, .n_targets = n};
    bool ok = made == n && ba_shots_print(stdout, fmt, &r);
    for (int i = 1; ok && fmt == BS_CSV && i < n; i++) { /* CSV has no room for them */
        double action, later, task;
        ba_shots_ratios(&r, i, &action, &later, &task);
        fprintf(stderr, "kettle %s: ratio %c/A: step time p50 x%.3f, later-step TTFT p50 x%.3f, task time p50 x%.3f\n",
                CMD, 'A' + i, action, later, task);
    }
    for (int i = 0; i < made; i++) ba_shots_summary_free(&sums[i]);
    if (made < n) fprintf(stderr, "kettle %s: out of memory\n", CMD);
    else if (!ok) fprintf(stderr, "kettle %s: the report could not be written (out of memory, or stdout failed)\n", CMD);
    return ok;
}

static void run_targets(const ba_shots_opts *o, target *t, ba_shots_result *res, int n) {
    for (int k = 0; k < o->sessions; k++)
        for (int i = 0; i < n; i++) {
            if (res[i].error[0]) continue;
            double t0 = kt_time_ms();
            if (run_session(o, &t[i], &res[i], k))
                fprintf(stderr, "kettle %s: %c %s, session %d: %d steps in %.2f s\n", CMD, 'A' + i, t[i].name, k + 1,
                        o->steps, (kt_time_ms() - t0) / 1e3);
            else fprintf(stderr, "kettle %s: %c %s FAILED: %s\n", CMD, 'A' + i, t[i].name, res[i].error);
        }
}

int ba_shots_main(const ba_shots_opts *o, bs_fmt fmt, const struct bh_conn *conns, const char *const *names,
                  int n_urls) {
    target t[MAX_TARGETS];
    ba_shots_result res[MAX_TARGETS];
    int n = 0, made = 0, rc = 0;
    for (int i = 0; i < n_urls && n + 2 <= MAX_TARGETS; i++)
        for (int prep = 0; prep <= (o->prepare ? 1 : 0); prep++, n++) {
            t[n] = (target){.conn = &conns[i]};
            snprintf(t[n].name, sizeof t[n].name, "%s%s", names[i], prep ? " +prepare" : "");
        }
    while (made < n && ba_shots_result_init(&res[made], t[made].name, o->prepare && made % 2, o->sessions, o->steps))
        made++;
    if (made < n) fprintf(stderr, "kettle %s: out of memory\n", CMD), rc = 1;
    for (int i = 0; !rc && i < n; i++) {
        bool same_server = o->prepare && i % 2; /* the prepared run of the server before it */
        if (same_server) t[i].has_metrics = t[i - 1].has_metrics;
        else if (!warm_up(o, &t[i])) rc = 1;
    }
    if (!rc) run_targets(o, t, res, n);
    if (!rc && !report(o, fmt, res, n)) rc = 1;
    for (int i = 0; !rc && i < n; i++)
        if (res[i].error[0]) rc = 1;
    for (int i = 0; i < made; i++) ba_shots_result_free(&res[i]);
    return rc;
}
