/*
 * cmd_bench_soak.c - `kettle bench soak`: many clients against the server
 * for a fixed time, every kind of request mixed (issue 23's soak test).
 * What it shows is not speed but that nothing breaks: no 5xx but the
 * deliberate 503 of a full queue, no request that hangs, no answer that
 * is wrong for its kind, memory flat after warm-up, and the KV cache back
 * to its idle level once the load is gone.
 *
 * --clients clients each send one request after another until --duration
 * ends, drawing each from the seeded mix of bench_soak_work.c (chat and
 * completions, whole and streamed, n > 1, tools, json_schema, stop
 * strings, streams abandoned mid-way, malformed requests), and every
 * answer is judged by bench_soak_check.c. libcurl's multi interface
 * drives them all from one thread, as in bench serve. After a 503 a
 * client waits the second its Retry-After asks for.
 *
 * Every --rss-every seconds the server is sampled: its RSS (VmRSS of the
 * child with -m; process_resident_memory_bytes of /metrics with --url) and
 * its KV blocks in use and cached (/metrics). After the load, the run
 * waits (within --timeout) until /health shows nothing running or queued,
 * then reads the KV blocks again: in use must be back to where they were
 * right after start-up; cached blocks nobody holds are free to take, and
 * are reported apart.
 *
 * Exit status 1 on any failed check (the first failures are printed with
 * their client and request), 2 on a usage error.
 */
#include <curl/curl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/timing.h"
#include "cli/bench_http.h"
#include "cli/bench_soak.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/model_store.h"

#define CMD "bench soak"
#define MAX_FAILURES_SHOWN 20
#define RETRY_AFTER_MS 1000.0  /* the server's Retry-After: 1 on a 503 */
#define SETTLE_POLL_MS 100
#define MAX_ANSWER_BYTES (1 << 20)

typedef struct soak_opts {
    const char *url, *model, *api_key;
    const char *srv_args[BH_MAX_SRV_ARGS];
    int n_srv_args;
    int clients, duration_s, rss_every_s, timeout_s;
    uint64_t seed;
    bs_fmt fmt;
} soak_opts;

static void usage(FILE *out) {
    fprintf(out,
            "usage: kettle bench soak (--url URL | -m MODEL [server options]) [options]\n"
            "Soak and load test: clients send a seeded mix of requests (chat and completions, whole and\n"
            "streamed, n 2..3, tools with tool_choice, json_schema, stop strings, 10%% streams abandoned\n"
            "mid-way, 5%% malformed) for a fixed time; every answer is checked. Reports requests by kind,\n"
            "outcome and status, latency p50/p95/p99, the server's RSS and KV blocks over time.\n"
            "  --url URL            a running server (loopback), e.g. http://127.0.0.1:8080\n"
            "  -m, --model FILE     start 'kettle serve -m FILE --port 0' for the run (stopped at the end);\n"
            "%s"
            "                       (chatml is used if the model has no chat template and none is given)\n"
            "  --clients N          clients sending at once (default 64)\n"
            "  --duration S         seconds of load (default 600); answers in flight then are awaited\n"
            "  --seed N             the mix and every request's contents (default 1)\n"
            "  --rss-every S        sample the server's RSS and KV blocks every S seconds (default 10)\n"
            "  --timeout S          a request that receives nothing for S seconds is hung (default 60)\n"
            "  --api-key KEY        sent as 'Authorization: Bearer KEY' (and given to the server with -m)\n"
            "  --md | --json        output (default md)\n"
            "Exit status 1 if any check fails: a 5xx other than 503, a hung request, an unexpected status\n"
            "or answer, a transport error, RSS growth of %.0f%% or more over the last half of a run of at\n"
            "least %d s, or KV blocks in use at the end above the idle level; 2 on usage.\n",
            BH_SERVER_OPTS_USAGE, SK_RSS_MAX_GROWTH_PCT, SK_RSS_MIN_DURATION_S);
}

/* ---- options ---- */

/* An option of the bench itself: 1 taken, 0 unknown, 2 usage error. */
static int take_bench_opt(int argc, char **argv, int *i, soak_opts *o) {
    const cli_int_opt ints[] = {{"--clients", 1, 1024, &o->clients}, {"--duration", 1, 7 * 86400, &o->duration_s},
                                {"--rss-every", 1, 86400, &o->rss_every_s}, {"--timeout", 1, 86400, &o->timeout_s}};
    const cli_str_opt strs[] = {
        {"--url", &o->url}, {"-m", &o->model}, {"--model", &o->model}, {"--api-key", &o->api_key}};
    int r = cli_take_opt(CMD, argc, argv, i, ints, sizeof ints / sizeof ints[0], strs, sizeof strs / sizeof strs[0]);
    if (r) return r;
    const char *v = NULL;
    if ((r = cli_opt(CMD, argc, argv, i, "--seed", &v))) {
        if (r < 0) return 2;
        return cli_parse_u64(v, &o->seed) ? 1 : cli_usage_error(CMD, "invalid --seed '%s'", v);
    }
    return 0;
}

static int parse_opts(int argc, char **argv, soak_opts *o) {
    *o = (soak_opts){.clients = 64, .duration_s = 600, .rss_every_s = 10, .timeout_s = 60, .seed = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r;
        if (!strcmp(a, "--md")) o->fmt = BS_MD;
        else if (!strcmp(a, "--json")) o->fmt = BS_JSON;
        else if ((r = take_bench_opt(argc, argv, &i, o)) ||
                 (r = bh_take_server_opt(CMD, argc, argv, &i, o->srv_args, &o->n_srv_args))) {
            if (r == 2) return 2;
        } else {
            return cli_usage_error(CMD, "unknown option '%s'", a);
        }
    }
    if (!o->url == !o->model) return cli_usage_error(CMD, "give either --url URL or -m MODEL");
    if (o->url && o->n_srv_args) return cli_usage_error(CMD, "server options (%s) need -m MODEL", o->srv_args[0]);
    if (o->api_key && !o->api_key[0]) return cli_usage_error(CMD, "--api-key must not be empty");
    return 0;
}

/* ---- the run's state ---- */

typedef struct client {
    int index;      /* 1-based, for messages */
    int n_sent;     /* requests started so far */
    kt_rng rng;     /* this client's own: its requests do not depend on the others' timing */
    sk_request q;
    bh_req h;
    bool busy;
    double wait_until_ms; /* after a 503 */
} client;

typedef struct soak {
    const soak_opts *o;
    bh_conn conn;
    const bh_child *child; /* NULL with --url */
    CURLM *m;
    client *clients;
    int n_busy, n_shown;
    double t0_ms, t_stop_ms, next_sample_ms;
    bh_req probe;          /* GET /metrics for the sample being taken */
    bool probe_busy;
    sk_sample pending;
    sk_result *res;
    char error[256];       /* what stopped the run (out of memory, curl) */
} soak;

static bool soak_fail(soak *s, const char *msg) {
    if (!s->error[0]) snprintf(s->error, sizeof s->error, "%s", msg);
    return false;
}

/* ---- one client's request ---- */

static bool start_client(soak *s, client *c) {
    if (!sk_request_make(&c->rng, &c->q)) return soak_fail(s, "out of memory");
    bool plain = !c->q.stream || c->q.kind == SK_MALFORMED; /* a refusal is one JSON error, streamed or not */
    c->h = (bh_req){.kind = (int)c->q.kind, .index = ++c->n_sent, .plain = plain, .keep_body = plain,
                    .body = c->q.body};
    c->q.body = NULL; /* the request owns it now */
    if (!bh_req_init(&c->h, &s->conn, sk_request_path(&c->q))) return soak_fail(s, "out of memory");
    c->h.sse.keep_text = true; /* text and tool calls, for the checks */
    c->h.resp.max = MAX_ANSWER_BYTES;
    curl_easy_setopt(c->h.h, CURLOPT_PRIVATE, c);
    c->h.start_ms = kt_time_ms();
    if (curl_multi_add_handle(s->m, c->h.h) != CURLM_OK) return soak_fail(s, "curl_multi_add_handle failed");
    c->busy = true, s->n_busy++;
    return true;
}

static void show_failure(soak *s, const client *c, sk_outcome o, const char *why) {
    if (++s->n_shown > MAX_FAILURES_SHOWN) {
        if (s->n_shown == MAX_FAILURES_SHOWN + 1) fprintf(stderr, "kettle %s: (further failures not shown)\n", CMD);
        return;
    }
    const char *curl_err = o == SK_TRANSPORT || o == SK_HUNG ? c->h.curl_err : "";
    fprintf(stderr, "kettle %s: client %d, request %d (%s%s%s): %s: %s%s%s\n", CMD, c->index, c->h.index,
            sk_kind_names[c->q.kind], c->q.kind == SK_MALFORMED ? ", " : "",
            c->q.kind == SK_MALFORMED ? sk_fault_names[c->q.fault] : "", sk_outcome_names[o], why,
            curl_err[0] ? " - " : "", curl_err);
}

static sk_transport transport_of(CURLcode rc, bool abandoned) {
    if (abandoned || rc == CURLE_OK) return SK_NET_OK;
    return rc == CURLE_OPERATION_TIMEDOUT ? SK_NET_TIMEOUT : SK_NET_ERROR;
}

/* A request is over (or abandoned on purpose): judge it, count it, and
 * free it; the connection of an abandoned stream is closed by removing
 * its unfinished transfer. */
static bool finish_client(soak *s, client *c, CURLcode rc, bool abandoned) {
    bh_req *h = &c->h;
    h->end_ms = kt_time_ms();
    curl_multi_remove_handle(s->m, h->h);
    long status = h->status;
    if (!status) curl_easy_getinfo(h->h, CURLINFO_RESPONSE_CODE, &status);
    sk_answer a = {.net = transport_of(rc, abandoned), .status = status,
                   .body = h->plain ? h->resp.p : h->err_body, .sse = h->plain ? NULL : &h->sse,
                   .abandoned = abandoned};
    bool cut;
    char why[640];
    sk_outcome o = sk_check(&c->q, &a, &cut, why, sizeof why);
    double ttft_ms = !h->plain && h->sse.n_tok ? h->sse.tok_ms[0] - h->start_ms : -1;
    bool ok = sk_stats_add(&s->res->stats, &c->q, status, o, cut, h->end_ms - h->start_ms, ttft_ms);
    if (o != SK_OK && o != SK_OVERLOAD) show_failure(s, c, o, why);
    if (o == SK_OVERLOAD) c->wait_until_ms = h->end_ms + RETRY_AFTER_MS;
    bh_req_free(h);
    sk_request_free(&c->q);
    c->busy = false, s->n_busy--;
    return ok ? true : soak_fail(s, "out of memory");
}

/* A request has received nothing for --timeout seconds: it is hung (its
 * transfer is dropped, as the client would). Measured here rather than by
 * libcurl's low-speed limit, which averages over several seconds and
 * counts the bytes sent. */
static bool is_hung(const soak *s, const client *c, double now) {
    double last_ms = c->h.last_rx_ms > 0 ? c->h.last_rx_ms : c->h.start_ms;
    return now - last_ms > s->o->timeout_s * 1e3;
}

/* Streams to abandon that have had their few chunks: hang up now; and
 * requests that are hung. */
static bool police_clients(soak *s) {
    double now = kt_time_ms();
    for (int i = 0; i < s->o->clients; i++) {
        client *c = &s->clients[i];
        if (!c->busy) continue;
        bool abandon = c->q.kind == SK_ABANDON && c->h.status == 200 && !c->h.sse.done &&
                       c->h.sse.n_tok >= c->q.abandon_after;
        if (abandon && !finish_client(s, c, CURLE_OK, true)) return false;
        if (!abandon && is_hung(s, c, now) && !finish_client(s, c, CURLE_OPERATION_TIMEDOUT, false)) return false;
    }
    return true;
}

static bool start_due(soak *s, double now) {
    for (int i = 0; i < s->o->clients; i++) {
        client *c = &s->clients[i];
        if (!c->busy && now >= c->wait_until_ms && !start_client(s, c)) return false;
    }
    return true;
}

/* ---- samples of the server ---- */

static bool start_probe(soak *s, double now) {
    s->pending = (sk_sample){.t_s = (now - s->t0_ms) / 1e3, .rss_bytes = -1, .kv_used = -1, .kv_cached = -1,
                             .queued = -1, .in_flight = s->n_busy};
    if (s->child) s->pending.rss_bytes = bh_child_rss(s->child);
    s->next_sample_ms += s->o->rss_every_s * 1e3;
    s->probe = (bh_req){.plain = true, .keep_body = true};
    if (!bh_req_init(&s->probe, &s->conn, "/metrics")) return soak_fail(s, "out of memory");
    s->probe.resp.max = MAX_ANSWER_BYTES;
    curl_easy_setopt(s->probe.h, CURLOPT_TIMEOUT_MS, (long)s->o->timeout_s * 1000);
    curl_easy_setopt(s->probe.h, CURLOPT_PRIVATE, NULL); /* not a client */
    if (curl_multi_add_handle(s->m, s->probe.h) != CURLM_OK) return soak_fail(s, "curl_multi_add_handle failed");
    s->probe_busy = true;
    return true;
}

/* The KV figures (and RSS with --url) of a /metrics text into x. */
static void read_metrics(const char *text, bool rss, sk_sample *x) {
    double v;
    if (!text) return;
    if (sk_metric_sum(text, "kettle_kv_blocks_used", &v)) x->kv_used = v;
    if (sk_metric_sum(text, "kettle_cache_blocks", &v)) x->kv_cached = v;
    if (sk_metric_sum(text, "kettle_queue_depth", &v)) x->queued = v;
    if (rss && sk_metric_sum(text, "process_resident_memory_bytes", &v)) x->rss_bytes = (long long)v;
}

static void print_progress(const soak *s, const sk_sample *x) {
    fprintf(stderr, "kettle %s: t=%.0f s: %d requests, RSS %.1f MiB, KV used %.0f cached %.0f, %d in flight, "
            "%.0f queued\n", CMD, x->t_s, s->res->stats.n_requests, x->rss_bytes > 0 ? x->rss_bytes / 1048576.0 : -1.0,
            x->kv_used, x->kv_cached, x->in_flight, x->queued);
}

static bool finish_probe(soak *s, CURLcode rc) {
    curl_multi_remove_handle(s->m, s->probe.h);
    long status = 0;
    curl_easy_getinfo(s->probe.h, CURLINFO_RESPONSE_CODE, &status);
    if (rc == CURLE_OK && status == 200) read_metrics(s->probe.resp.p, !s->child, &s->pending);
    else fprintf(stderr, "kettle %s: GET /metrics failed at t=%.0f s (HTTP %ld, %s)\n", CMD, s->pending.t_s, status,
                 curl_easy_strerror(rc));
    bh_req_free(&s->probe);
    s->probe_busy = false;
    if (s->pending.kv_used > s->res->kv_peak_used) s->res->kv_peak_used = s->pending.kv_used;
    print_progress(s, &s->pending);
    return sk_stats_add_sample(&s->res->stats, &s->pending) ? true : soak_fail(s, "out of memory");
}

/* ---- the load ---- */

/* bh_drain_done's finish: a client's request (its client is the private
 * pointer), or the metrics probe (none). */
static bool finish_done(void *s, void *c, CURLcode rc) {
    return c ? finish_client(s, c, rc, false) : finish_probe(s, rc);
}

static bool drain_done(soak *s) {
    return bh_drain_done(s->m, finish_done, s);
}

static bool sample_due(const soak *s, double now) {
    return !s->probe_busy && now >= s->next_sample_ms && s->next_sample_ms <= s->t_stop_ms + 1;
}

/* Until --duration has passed, every idle client starts its next request;
 * then the answers in flight are awaited (each bounded by --timeout). */
static bool soak_loop(soak *s) {
    for (;;) {
        double now = kt_time_ms();
        bool loading = now < s->t_stop_ms;
        if (loading && !start_due(s, now)) return false;
        if (sample_due(s, now) && !start_probe(s, now)) return false;
        if (!loading && !s->n_busy && !s->probe_busy && s->next_sample_ms > s->t_stop_ms + 1) return true;
        int running;
        if (curl_multi_perform(s->m, &running) != CURLM_OK) return soak_fail(s, "curl_multi_perform failed");
        if (!drain_done(s) || !police_clients(s)) return false;
        if (curl_multi_poll(s->m, NULL, 0, 20, NULL) != CURLM_OK) return soak_fail(s, "curl_multi_poll failed");
    }
}

static void soak_cleanup(soak *s) {
    for (int i = 0; s->clients && i < s->o->clients; i++) {
        client *c = &s->clients[i];
        if (c->h.h) curl_multi_remove_handle(s->m, c->h.h);
        bh_req_free(&c->h);
        sk_request_free(&c->q);
    }
    if (s->probe.h) curl_multi_remove_handle(s->m, s->probe.h);
    bh_req_free(&s->probe);
    free(s->clients);
}

/* ---- before and after the load ---- */

/* A blocking GET of path; its body (malloc'ed) or NULL. */
static char *get_text(const bh_conn *conn, const char *path, int timeout_s) {
    bh_req r = {.plain = true, .keep_body = true};
    char *text = NULL;
    if (bh_req_init(&r, conn, path)) {
        r.resp.max = MAX_ANSWER_BYTES;
        curl_easy_setopt(r.h, CURLOPT_TIMEOUT_MS, (long)timeout_s * 1000);
        long status = 0;
        if (curl_easy_perform(r.h) == CURLE_OK && !curl_easy_getinfo(r.h, CURLINFO_RESPONSE_CODE, &status) &&
            status == 200)
            text = r.resp.p, r.resp.p = NULL;
    }
    bh_req_free(&r);
    return text;
}

/* KV blocks in use and cached, and the pool's size, from /metrics. */
static bool read_kv(const bh_conn *conn, int timeout_s, double *used, double *cached, double *total) {
    char *text = get_text(conn, "/metrics", timeout_s);
    bool ok = text && sk_metric_sum(text, "kettle_kv_blocks_used", used) &&
              sk_metric_sum(text, "kettle_cache_blocks", cached) &&
              sk_metric_sum(text, "kettle_kv_blocks_total", total);
    free(text);
    return ok;
}

/* Polls /health until nothing runs or waits (abandoned streams are
 * cancelled at the engine's next step), at most timeout_s. */
static bool settle(const bh_conn *conn, int timeout_s, double *took_s) {
    double t0 = kt_time_ms();
    for (;;) {
        char *text = get_text(conn, "/health", timeout_s);
        json_t *doc = text ? json_loads(text, 0, NULL) : NULL;
        bool idle = json_integer_value(json_object_get(doc, "running")) == 0 &&
                    json_integer_value(json_object_get(doc, "queued")) == 0 && json_object_get(doc, "running");
        json_decref(doc), free(text);
        *took_s = (kt_time_ms() - t0) / 1e3;
        if (idle) return true;
        if (*took_s > timeout_s) return false;
        usleep(SETTLE_POLL_MS * 1000);
    }
}

/* One short chat request before the load: a server that cannot chat (no
 * template) is found here, with its message, not as thousands of 400s. */
static bool warm_up(const bh_conn *conn) {
    bh_req r = {.plain = true, .keep_body = true};
    r.body = strdup("{\"messages\":[{\"role\":\"user\",\"content\":\"Hello.\"}],\"max_tokens\":2}");
    bool ok = r.body && bh_req_init(&r, conn, "/v1/chat/completions");
    long status = 0;
    CURLcode rc = ok ? curl_easy_perform(r.h) : CURLE_OUT_OF_MEMORY;
    if (ok) curl_easy_getinfo(r.h, CURLINFO_RESPONSE_CODE, &status);
    ok = rc == CURLE_OK && status == 200;
    if (!ok)
        fprintf(stderr, "kettle %s: %s, warm-up chat request: %s (HTTP %ld) %.300s\n", CMD, conn->url,
                rc == CURLE_OK ? "refused" : curl_easy_strerror(rc), status, r.resp.p ? r.resp.p : "");
    bh_req_free(&r);
    return ok;
}

/* ---- the run ---- */

static bool run_load(const soak_opts *o, const bh_conn *conn, const bh_child *child, sk_result *res) {
    soak s = {.o = o, .conn = *conn, .child = child, .res = res};
    s.m = curl_multi_init();
    s.clients = calloc((size_t)o->clients, sizeof *s.clients);
    if (!s.m || !s.clients) soak_fail(&s, "out of memory");
    for (int i = 0; s.clients && i < o->clients; i++) {
        s.clients[i].index = i + 1;
        kt_rng_seed(&s.clients[i].rng, o->seed * 0x100000001b3ull + (uint64_t)i); /* a stream per client */
    }
    s.t0_ms = s.next_sample_ms = kt_time_ms();
    s.t_stop_ms = s.t0_ms + o->duration_s * 1e3;
    bool ok = !s.error[0] && soak_loop(&s);
    res->wall_s = (kt_time_ms() - s.t0_ms) / 1e3;
    if (!ok) fprintf(stderr, "kettle %s: %s\n", CMD, s.error);
    soak_cleanup(&s);
    if (s.m) curl_multi_cleanup(s.m);
    return ok;
}

/* After the load: settled, the KV figures, one last sample. */
static void read_end(const soak_opts *o, const bh_conn *conn, const bh_child *child, double t0_ms, sk_result *res) {
    res->settled = settle(conn, o->timeout_s, &res->settle_s);
    if (!res->settled) fprintf(stderr, "kettle %s: requests still running %d s after the load\n", CMD, o->timeout_s);
    double total;
    if (!read_kv(conn, o->timeout_s, &res->kv_end_used, &res->kv_end_cached, &total))
        fprintf(stderr, "kettle %s: cannot read the KV blocks from /metrics after the run\n", CMD);
    sk_sample x = {.t_s = (kt_time_ms() - t0_ms) / 1e3, .rss_bytes = child ? bh_child_rss(child) : -1,
                   .kv_used = res->kv_end_used, .kv_cached = res->kv_end_cached, .queued = -1};
    if (!child) {
        char *text = get_text(conn, "/metrics", o->timeout_s);
        read_metrics(text, true, &x);
        free(text);
    }
    if (!sk_stats_add_sample(&res->stats, &x)) fprintf(stderr, "kettle %s: out of memory\n", CMD);
}

static int run(const soak_opts *o, const char *url, const bh_child *child) {
    bh_conn conn = {.url = url, .api_key = o->api_key, .timeout_s = o->timeout_s};
    sk_result res = {.target = o->model ? o->model : url, .clients = o->clients, .duration_s = o->duration_s,
                     .rss_every_s = o->rss_every_s, .timeout_s = o->timeout_s, .seed = o->seed,
                     .kv_idle_used = -1, .kv_end_used = -1, .kv_peak_used = -1};
    if (!read_kv(&conn, o->timeout_s, &res.kv_idle_used, &res.kv_idle_cached, &res.kv_total)) {
        fprintf(stderr, "kettle %s: %s: cannot read the KV blocks from /metrics\n", CMD, url);
        return 1;
    }
    if (!warm_up(&conn)) return 1;
    double t0_ms = kt_time_ms();
    int rc = run_load(o, &conn, child, &res) ? 0 : 1;
    if (!rc) read_end(o, &conn, child, t0_ms, &res);
    sk_verdict v = sk_judge(&res);
    if (!rc && !sk_print(stdout, o->fmt, &res, &v)) {
        fprintf(stderr, "kettle %s: out of memory\n", CMD);
        rc = 1;
    }
    if (!rc && !v.ok) rc = 1;
    sk_stats_free(&res.stats);
    return rc;
}

/* bh_run_bench's run. */
static int run_soak(void *o, const char *url, const bh_child *child) {
    return run(o, url, child);
}

int cmd_bench_soak(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    soak_opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc;
    char model_path[MS_PATH_MAX]; /* -m OWNER/REPO:QUANT: the pulled file */
    if (ms_resolve_opt(CMD, &o.model, model_path, sizeof model_path)) return 1;
    bh_serve_spec spec = {.model = o.model, .args = o.srv_args, .n_args = o.n_srv_args, .api_key = o.api_key,
                          .chat = true, .timeout_s = o.timeout_s};
    return bh_run_bench(CMD, &spec, o.url, run_soak, &o);
}
