/*
 * cmd_bench_serve.c - `kettle bench serve`: a load generator for the
 * OpenAI-compatible server, producing the figures issue 5 asks for: time
 * to first token (TTFT), inter-token latency (ITL) and aggregate tokens/s
 * at concurrency 1, 2, 4, 8, 16, and (with --long-prompt) whether a long
 * prefill hurts the streams decoding beside it and whether /health still
 * answers during it.
 *
 * For each concurrency level c, c streaming POST /v1/completions requests
 * are kept in flight (libcurl's multi interface, one thread: no client
 * thread scheduling in the measured latencies); when one finishes the next
 * starts, until the level's requests are done. Each token chunk of the
 * server-sent events is timestamped as it arrives (bench_serve_stats.c):
 * TTFT = first token chunk - request sent, ITL = time between consecutive
 * token chunks of one request, tokens/s = generated tokens of the level /
 * the level's wall time. Prompts are deterministic word salads, different
 * for every request, so no prefix cache can make them cheaper.
 *
 * With -m the server is this same binary (/proc/self/exe serve --port 0),
 * started as a child (bench_http.c, shared with `kettle bench agent`); it
 * gets SIGTERM at the end, also on errors, and cannot outlive us.
 *
 * Every failure (unreachable server, non-200 status, a stream that ends
 * before "data: [DONE]", no bytes for --timeout seconds) names the level
 * and request and makes the exit status 1; nothing waits forever.
 */
#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/timing.h"
#include "cli/bench_http.h"
#include "cli/bench_serve.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/model_store.h"

#define CMD "bench serve"
#define MAX_LEVELS 16
#define HEALTH_EVERY_MS 20.0
#define CALIBRATION_WORDS 100

typedef struct bs_opts {
    const char *url, *model, *api_key, *svg;
    const char *srv_args[BH_MAX_SRV_ARGS];
    int n_srv_args;
    int levels[MAX_LEVELS], n_levels;
    int requests; /* per level; 0: max(2c, 4) */
    int prompt_tokens, max_tokens, long_prompt, long_at_ms, timeout_s;
    bs_fmt fmt;
} bs_opts;

static void usage(FILE *out) {
    fprintf(out,
            "usage: kettle bench serve (--url URL | -m MODEL [server options]) [options]\n"
            "  --url URL            a running server, e.g. http://127.0.0.1:8080\n"
            "  -m, --model FILE     start 'kettle serve -m FILE --port 0' for the run (stopped at the end);\n"
            "%s"
            "  -c LIST              concurrency levels, comma-separated (default 1,2,4,8,16)\n"
            "  --requests N         requests per level (default 2 x c, at least 4)\n"
            "  -p N                 prompt length, about N tokens (default 128)\n"
            "  -n N                 max_tokens of each request (default 64; ignore_eos is sent)\n"
            "  --long-prompt N      at each level, also send one request with a prompt of about N tokens\n"
            "  --long-at-ms T       ... T ms after the level starts (default 1000); reports the other\n"
            "                       streams' ITL p95 during its prefill vs outside it, its TTFT, and the\n"
            "                       slowest GET /health polled every 20 ms meanwhile\n"
            "  --md | --csv | --json  output format (default md)\n"
            "  --svg FILE           also plot tokens/s, TTFT and ITL vs concurrency\n"
            "  --api-key KEY        sent as 'Authorization: Bearer KEY' (and given to the server with -m)\n"
            "  --timeout S          fail a request that receives nothing for S seconds (default 120)\n",
            BH_SERVER_OPTS_USAGE);
}

/* ---- options ---- */

static bool parse_levels(const char *s, bs_opts *o) {
    o->n_levels = 0;
    while (*s) {
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (errno || end == s || v < 1 || v > 1024 || o->n_levels == MAX_LEVELS) return false;
        o->levels[o->n_levels++] = (int)v;
        if (*end == ',') end++;
        else if (*end) return false;
        s = end;
    }
    return o->n_levels > 0;
}

/* Server options taken with their value and handed to `kettle serve`. */
static int take_server_opt(int argc, char **argv, int *i, bs_opts *o) {
    return bh_take_server_opt(CMD, argc, argv, i, o->srv_args, &o->n_srv_args);
}

/* An option of the bench itself: 1 taken, 0 unknown, 2 usage error. */
static int take_bench_opt(int argc, char **argv, int *i, bs_opts *o) {
    const cli_int_opt ints[] = {
        {"--requests", 1, 1 << 20, &o->requests}, {"-p", 1, 1 << 20, &o->prompt_tokens},
        {"-n", 1, 1 << 20, &o->max_tokens},       {"--long-prompt", 1, 1 << 22, &o->long_prompt},
        {"--long-at-ms", 0, 1 << 26, &o->long_at_ms}, {"--timeout", 1, 86400, &o->timeout_s}};
    const cli_str_opt strs[] = {
        {"--url", &o->url}, {"-m", &o->model}, {"--model", &o->model}, {"--svg", &o->svg}, {"--api-key", &o->api_key}};
    int r = cli_take_opt(CMD, argc, argv, i, ints, sizeof ints / sizeof ints[0], strs, sizeof strs / sizeof strs[0]);
    if (r) return r;
    const char *v = NULL;
    if ((r = cli_opt(CMD, argc, argv, i, "-c", &v))) {
        if (r < 0) return 2;
        return parse_levels(v, o) ? 1 : cli_usage_error(CMD, "invalid -c '%s' (e.g. 1,2,4,8,16)", v);
    }
    return 0;
}

static int parse_opts(int argc, char **argv, bs_opts *o) {
    *o = (bs_opts){.levels = {1, 2, 4, 8, 16}, .n_levels = 5, .prompt_tokens = 128, .max_tokens = 64,
                   .long_at_ms = 1000, .timeout_s = 120};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r;
        if (!strcmp(a, "--md")) o->fmt = BS_MD;
        else if (!strcmp(a, "--csv")) o->fmt = BS_CSV;
        else if (!strcmp(a, "--json")) o->fmt = BS_JSON;
        else if ((r = take_bench_opt(argc, argv, &i, o)) || (r = take_server_opt(argc, argv, &i, o))) {
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

/* ---- prompts ---- */

static const char *const WORDS[] = {
    "the", "cat", "sat", "on", "a", "mat", "and", "then", "ran", "to", "big", "red", "house", "where", "little",
    "girl", "named", "Lily", "lived", "with", "her", "mom", "dog", "park", "sun", "was", "happy", "tree", "ball",
    "friend", "played", "all", "day", "saw", "bird", "fish", "water", "blue", "sky", "said", "you", "can", "help",
    "me", "find", "my", "toy", "box", "in", "garden", "flower", "boy", "Tom", "jumped", "over", "small", "rock",
    "went", "home", "ate", "cake", "good", "night", "warm"};

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* "Story L-I: " then n_words words drawn from a generator seeded by
 * (level, index): the same text on every run, different for every request
 * from its first tokens on. NULL if out of memory. */
static char *build_prompt(int level, int index, int n_words) {
    size_t cap = 32 + (size_t)n_words * 10, len;
    char *s = malloc(cap);
    if (!s) return NULL;
    len = (size_t)snprintf(s, cap, "Story %d-%d:", level, index);
    uint64_t seed = (uint64_t)level << 32 | (uint32_t)index;
    for (int i = 0; i < n_words; i++) {
        const char *w = WORDS[splitmix64(&seed) % (sizeof WORDS / sizeof WORDS[0])];
        len += (size_t)snprintf(s + len, cap - len, " %s", w); /* words are < 9 bytes */
    }
    return s;
}

/* The JSON body of a streaming completion; NULL if out of memory. */
static char *request_body(int level, int index, int n_words, int max_tokens) {
    char *prompt = build_prompt(level, index, n_words);
    json_t *b = prompt ? json_pack("{s:s, s:i, s:i, s:b, s:{s:b}, s:b}", "prompt", prompt, "max_tokens", max_tokens,
                                   "temperature", 0, "stream", 1, "stream_options", "include_usage", 1,
                                   "ignore_eos", 1)
                       : NULL;
    char *text = b ? json_dumps(b, JSON_COMPACT) : NULL;
    json_decref(b);
    free(prompt);
    return text;
}

/* ---- one concurrency level ---- */

typedef enum req_kind { REQ_STREAM, REQ_LONG, REQ_HEALTH } req_kind;

static bool req_init(bh_req *r, const char *url, const char *path, const bs_opts *o) {
    bh_conn conn = {.url = url, .api_key = o->api_key, .timeout_s = o->timeout_s};
    return bh_req_init(r, &conn, path);
}


typedef struct level_run {
    const bs_opts *o;
    const char *url, *label; /* label: "level c=4" or "warm-up", for messages */
    int c, n_req, n_words, long_words;
    CURLM *m;
    bh_req *reqs;
    int n_started, n_done, n_health_open;
    bh_req long_req;
    bool long_started, long_done;
    double t0_ms, t_end_ms, next_health_ms, win0_ms, win1_ms;
    double *health_ms;          /* latencies of finished /health polls */
    int n_health, health_cap;
    bh_req **polls;             /* every /health poll started, freed at the end */
    int n_polls, polls_cap;
    char error[768];
} level_run;

/* Keeps the first failure: "LABEL, WHAT: MSG". */
static bool run_fail(level_run *lr, const char *what, const char *msg) {
    if (!lr->error[0]) snprintf(lr->error, sizeof lr->error, "%s, %s: %s", lr->label, what, msg);
    return false;
}

static bool start_req(level_run *lr, bh_req *r, const char *path) {
    if (!req_init(r, lr->url, path, lr->o)) return run_fail(lr, "setup", "out of memory");
    r->start_ms = kt_time_ms();
    if (curl_multi_add_handle(lr->m, r->h) != CURLM_OK) return run_fail(lr, "setup", "curl_multi_add_handle failed");
    return true;
}

static bool start_stream(level_run *lr) {
    bh_req *r = &lr->reqs[lr->n_started];
    *r = (bh_req){.kind = REQ_STREAM, .index = lr->n_started + 1};
    r->body = request_body(lr->c, r->index, lr->n_words, lr->o->max_tokens);
    lr->n_started++;
    return r->body ? start_req(lr, r, "/v1/completions") : run_fail(lr, "setup", "out of memory");
}

static bool start_long(level_run *lr) {
    bh_req *r = &lr->long_req;
    *r = (bh_req){.kind = REQ_LONG, .index = 0};
    r->body = request_body(lr->c, 0, lr->long_words, 1);
    lr->long_started = true;
    lr->win0_ms = kt_time_ms();
    return r->body ? start_req(lr, r, "/v1/completions") : run_fail(lr, "setup", "out of memory");
}

static bool start_health(level_run *lr) {
    if (lr->n_polls == lr->polls_cap) {
        int cap = lr->polls_cap ? 2 * lr->polls_cap : 256;
        bh_req **p = realloc(lr->polls, sizeof *p * (size_t)cap);
        if (!p) return run_fail(lr, "setup", "out of memory");
        lr->polls = p, lr->polls_cap = cap;
    }
    bh_req *r = calloc(1, sizeof *r);
    if (!r) return run_fail(lr, "setup", "out of memory");
    lr->polls[lr->n_polls++] = r;
    r->kind = REQ_HEALTH, r->plain = true;
    lr->next_health_ms = kt_time_ms() + HEALTH_EVERY_MS;
    if (!req_init(r, lr->url, "/health", lr->o)) return run_fail(lr, "setup", "out of memory");
    curl_easy_setopt(r->h, CURLOPT_TIMEOUT_MS, 10000L);
    r->start_ms = kt_time_ms();
    if (curl_multi_add_handle(lr->m, r->h) != CURLM_OK) return run_fail(lr, "setup", "curl_multi_add_handle failed");
    lr->n_health_open++;
    return true;
}

/* Starts what is due: streams up to c in flight, the long request at
 * --long-at-ms, a /health poll every 20 ms during the long prefill. */
static bool start_due(level_run *lr) {
    while (lr->n_started < lr->n_req && lr->n_started - lr->n_done < lr->c)
        if (!start_stream(lr)) return false;
    double now = kt_time_ms();
    if (lr->o->long_prompt && !lr->long_started && now - lr->t0_ms >= lr->o->long_at_ms && !start_long(lr))
        return false;
    if (lr->long_started && !lr->long_done && now >= lr->next_health_ms) return start_health(lr);
    return true;
}

static bool push_health(level_run *lr, double ms) {
    if (lr->n_health == lr->health_cap) {
        int cap = lr->health_cap ? 2 * lr->health_cap : 256;
        double *p = realloc(lr->health_ms, sizeof *p * (size_t)cap);
        if (!p) return run_fail(lr, "setup", "out of memory");
        lr->health_ms = p, lr->health_cap = cap;
    }
    lr->health_ms[lr->n_health++] = ms;
    return true;
}

/* A transfer is over: check it and account for it. */
static bool finish_req(level_run *lr, bh_req *r, CURLcode rc) {
    char msg[640], what[64];
    r->end_ms = kt_time_ms();
    curl_multi_remove_handle(lr->m, r->h);
    if (r->kind == REQ_STREAM) snprintf(what, sizeof what, "request %d/%d", r->index, lr->n_req);
    else snprintf(what, sizeof what, "%s", r->kind == REQ_LONG ? "the long-prompt request" : "GET /health");
    if (bh_req_failed(r, rc, msg, sizeof msg)) return run_fail(lr, what, msg);
    if (r->kind == REQ_HEALTH) {
        lr->n_health_open--;
        bh_req_free(r); /* its curl handle; the struct stays in lr->polls */
        return push_health(lr, r->end_ms - r->start_ms);
    }
    if (r->kind == REQ_LONG) {
        lr->long_done = true;
        lr->win1_ms = r->sse.n_tok ? r->sse.tok_ms[0] : r->end_ms;
    } else {
        lr->n_done++;
        lr->t_end_ms = r->end_ms;
    }
    return true;
}

/* bh_drain_done's finish: a request (its bh_req is the private pointer). */
static bool finish_done(void *lr, void *r, CURLcode rc) {
    return finish_req(lr, r, rc);
}

static bool drain_done(level_run *lr) {
    return bh_drain_done(lr->m, finish_done, lr);
}

static bool level_busy(const level_run *lr) {
    return lr->n_done < lr->n_req || (lr->o->long_prompt && !lr->long_done) || lr->n_health_open > 0;
}

static bool level_loop(level_run *lr) {
    lr->t0_ms = kt_time_ms();
    while (level_busy(lr)) {
        int running;
        if (curl_multi_perform(lr->m, &running) != CURLM_OK) return run_fail(lr, "curl", "multi_perform failed");
        /* start the next request before sleeping: a new handle makes the poll return at once */
        if (!drain_done(lr) || !start_due(lr)) return false;
        int wait_ms = lr->o->long_prompt && !lr->long_done ? 2 : 100;
        if (curl_multi_poll(lr->m, NULL, 0, wait_ms, NULL) != CURLM_OK) return run_fail(lr, "curl", "poll failed");
    }
    return true;
}

/* Removes whatever is still in flight (after an error) and frees all. */
static void level_cleanup(level_run *lr) {
    for (int i = 0; i < lr->n_started; i++) {
        if (lr->reqs[i].h) curl_multi_remove_handle(lr->m, lr->reqs[i].h);
        bh_req_free(&lr->reqs[i]);
    }
    if (lr->long_req.h) curl_multi_remove_handle(lr->m, lr->long_req.h);
    bh_req_free(&lr->long_req);
    for (int i = 0; i < lr->n_polls; i++) {
        if (lr->polls[i]->h) curl_multi_remove_handle(lr->m, lr->polls[i]->h);
        bh_req_free(lr->polls[i]);
        free(lr->polls[i]);
    }
    free(lr->polls);
    free(lr->reqs);
    free(lr->health_ms);
}

/* ---- summaries ---- */

static int req_tokens(const bh_req *r) {
    return r->sse.completion_tokens >= 0 ? r->sse.completion_tokens : r->sse.n_tok;
}

/* Gaps between token chunks: all of them, and split by whether they
 * overlap the long prefill window. Arrays hold total_gaps entries. */
static void collect_itl(const level_run *lr, double *all, double *in, double *out, int *n_all, int *n_in, int *n_out) {
    *n_all = *n_in = *n_out = 0;
    for (int i = 0; i < lr->n_req; i++) {
        const bs_sse *s = &lr->reqs[i].sse;
        for (int k = 1; k < s->n_tok; k++) {
            double a = s->tok_ms[k - 1], b = s->tok_ms[k];
            all[(*n_all)++] = b - a;
            if (!lr->long_started) continue;
            if (b >= lr->win0_ms && a <= lr->win1_ms) in[(*n_in)++] = b - a;
            else out[(*n_out)++] = b - a;
        }
    }
}

static void summarize_long(const level_run *lr, double *in, int n_in, double *out, int n_out, bs_level *l) {
    l->has_long = true;
    l->long_prompt_tokens = lr->long_req.sse.prompt_tokens;
    l->long_ttft_ms = lr->win1_ms - lr->win0_ms;
    l->itl_in_ms = bs_pcts_of(in, n_in);
    l->itl_out_ms = bs_pcts_of(out, n_out);
    for (int i = 0; i < lr->n_health; i++) l->health_max_ms = fmax(l->health_max_ms, lr->health_ms[i]);
    l->n_health = lr->n_health;
    if (!n_in)
        fprintf(stderr, "kettle bench serve: c=%d: no stream was decoding during the long prefill "
                        "(raise -n or lower --long-at-ms)\n", lr->c);
}

static bool summarize(const level_run *lr, bs_level *l) {
    int gaps = 0;
    for (int i = 0; i < lr->n_req; i++) gaps += lr->reqs[i].sse.n_tok > 1 ? lr->reqs[i].sse.n_tok - 1 : 0;
    double *ttft = malloc(sizeof(double) * (size_t)lr->n_req), *itl = malloc(sizeof(double) * (size_t)(3 * gaps + 1));
    if (!ttft || !itl) return free(ttft), free(itl), false;
    *l = (bs_level){.concurrency = lr->c, .n_requests = lr->n_req, .wall_ms = lr->t_end_ms - lr->t0_ms};
    int n_ttft = 0, n_all, n_in, n_out;
    for (int i = 0; i < lr->n_req; i++) {
        const bh_req *r = &lr->reqs[i];
        if (r->sse.n_tok) ttft[n_ttft++] = r->sse.tok_ms[0] - r->start_ms;
        l->n_tokens += req_tokens(r);
        l->n_prompt_tokens += r->sse.prompt_tokens > 0 ? r->sse.prompt_tokens : 0;
        l->n_finish_length += r->sse.n_length;
    }
    l->tokens_per_s = l->wall_ms > 0 ? l->n_tokens / (l->wall_ms / 1e3) : 0;
    l->ttft_ms = bs_pcts_of(ttft, n_ttft);
    collect_itl(lr, itl, itl + gaps, itl + 2 * gaps, &n_all, &n_in, &n_out);
    l->itl_ms = bs_pcts_of(itl, n_all);
    if (lr->long_started) summarize_long(lr, itl + gaps, n_in, itl + 2 * gaps, n_out, l);
    free(ttft), free(itl);
    return true;
}

/* Prompt sizing: tokens = header_tokens + words x tokens_per_word. */
typedef struct bs_sizing {
    double header_tokens, tokens_per_word;
} bs_sizing;

static int words_for(int n_tokens, const bs_sizing *sz) {
    int w = (int)lround((n_tokens - sz->header_tokens) / sz->tokens_per_word);
    return w > 1 ? w : 1;
}

/* Runs level c and fills *l; false with a message on stderr. */
static bool run_level(const bs_opts *o, const char *url, CURLM *m, int c, const bs_sizing *sz, bs_level *l) {
    char label[32];
    snprintf(label, sizeof label, "level c=%d", c);
    level_run lr = {.o = o, .url = url, .label = label, .c = c, .m = m};
    lr.n_req = o->requests ? o->requests : (2 * c > 4 ? 2 * c : 4);
    lr.n_words = words_for(o->prompt_tokens, sz);
    lr.long_words = words_for(o->long_prompt, sz);
    lr.reqs = calloc((size_t)lr.n_req, sizeof *lr.reqs);
    bool ok = lr.reqs && level_loop(&lr) && summarize(&lr, l);
    if (!ok) fprintf(stderr, "kettle bench serve: %s\n", lr.error[0] ? lr.error : "out of memory");
    level_cleanup(&lr);
    return ok;
}

/* ---- the run ---- */

/* One unmeasured request of n_words words; its prompt token count (-1 if
 * the server reports none), or -2 on failure (message printed). */
static int warm_request(const bs_opts *o, const char *url, CURLM *m, int n_words) {
    bs_opts one = *o;
    one.requests = 1, one.long_prompt = 0, one.max_tokens = 4;
    level_run lr = {.o = &one, .url = url, .label = "warm-up", .c = 1, .m = m, .n_req = 1, .n_words = n_words};
    lr.reqs = calloc(1, sizeof *lr.reqs);
    bool ok = lr.reqs && level_loop(&lr);
    int n = ok ? lr.reqs[0].sse.prompt_tokens : -2;
    if (!ok) fprintf(stderr, "kettle bench serve: %s\n", lr.error[0] ? lr.error : "out of memory");
    level_cleanup(&lr);
    return n;
}

/* Tokens in n_words prompt words by POST /tokenize; -1 if that does not work. */
static int count_tokens(const bs_opts *o, const char *url, int n_words) {
    char *prompt = build_prompt(0, 0, n_words);
    bh_conn conn = {.url = url, .api_key = o->api_key, .timeout_s = o->timeout_s};
    int n = prompt ? bh_count_tokens(&conn, prompt) : -1;
    free(prompt);
    return n;
}

/* Sizing from two texts of the same generator: a words are ta tokens, b
 * words tb tokens (b > a, tb > ta). */
static void fit(bs_sizing *sz, int a, int ta, int b, int tb) {
    sz->tokens_per_word = (double)(tb - ta) / (b - a);
    sz->header_tokens = fmax(0, ta - a * sz->tokens_per_word);
}

/* Two unmeasured requests (warm-up: connections, first-touch costs) with
 * prompts of w and 2w words (2w words are fewer than -p tokens unless a word
 * takes 4 tokens: they fit wherever -p fits); the difference
 * of their token counts gives tokens per word, so prompts of any length
 * come out near the asked size; a server with POST /tokenize gives a larger
 * sample, 100 and 1000 words, free of the context limit. False on failure. */
static bool warm_up(const bs_opts *o, const char *url, CURLM *m, bs_sizing *sz) {
    int w = (int)fmin(CALIBRATION_WORDS, fmax(4, o->prompt_tokens / 8.0)); /* 2w words: < -p tokens */
    int t1 = warm_request(o, url, m, w), t2 = t1 < -1 ? -2 : warm_request(o, url, m, 2 * w);
    if (t1 < -1 || t2 < -1) return false;
    *sz = (bs_sizing){0, 1.3}; /* no counts at all: a typical English figure */
    int n1 = count_tokens(o, url, CALIBRATION_WORDS), n2 = n1 > 0 ? count_tokens(o, url, 10 * CALIBRATION_WORDS) : -1;
    if (n2 > n1) fit(sz, CALIBRATION_WORDS, n1, 10 * CALIBRATION_WORDS, n2); /* /tokenize: a large sample */
    else if (t1 > 0 && t2 > t1) fit(sz, w, t1, 2 * w, t2);
    return true;
}

static void set_ratios(bs_level *lv, int n, int *base_c) {
    int b = 0;
    for (int i = 0; i < n; i++)
        if (lv[i].concurrency == 1) {
            b = i;
            break;
        }
    *base_c = lv[b].concurrency;
    for (int i = 0; i < n; i++) lv[i].ratio = lv[b].tokens_per_s > 0 ? lv[i].tokens_per_s / lv[b].tokens_per_s : 0;
}

static int report(const bs_opts *o, const char *target, bs_level *lv) {
    bs_report r = {.target = target, .prompt_tokens = o->prompt_tokens, .max_tokens = o->max_tokens,
                   .levels = lv, .n_levels = o->n_levels};
    set_ratios(lv, o->n_levels, &r.ratio_base_c);
    bs_print(stdout, o->fmt, &r);
    if (o->svg && !bs_write_svg(o->svg, &r)) {
        fprintf(stderr, "kettle bench serve: cannot write %s: %s\n", o->svg, strerror(errno));
        return 1;
    }
    return 0;
}

static int run_all(const bs_opts *o, const char *url) {
    CURLM *m = curl_multi_init();
    if (!m) return fprintf(stderr, "kettle bench serve: curl_multi_init failed\n"), 1;
    bs_level lv[MAX_LEVELS];
    bs_sizing sz;
    int rc = warm_up(o, url, m, &sz) ? 0 : 1;
    for (int i = 0; i < o->n_levels && !rc; i++) {
        if (!run_level(o, url, m, o->levels[i], &sz, &lv[i])) rc = 1;
        else fprintf(stderr, "kettle bench serve: c=%d: %d requests in %.2f s\n", lv[i].concurrency,
                     lv[i].n_requests, lv[i].wall_ms / 1e3);
    }
    curl_multi_cleanup(m);
    return rc ? rc : report(o, o->model ? o->model : url, lv);
}

/* bh_run_bench's run: every level against url. */
static int run_levels(void *o, const char *url, const bh_child *child) {
    (void)child;
    return run_all(o, url);
}

int cmd_bench_serve(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    bs_opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc;
    char model_path[MS_PATH_MAX]; /* -m OWNER/REPO:QUANT: the pulled file */
    if (ms_resolve_opt(CMD, &o.model, model_path, sizeof model_path)) return 1;
    bh_serve_spec spec = {.model = o.model, .args = o.srv_args, .n_args = o.n_srv_args, .api_key = o.api_key,
                          .chat = false, .timeout_s = o.timeout_s};
    return bh_run_bench(CMD, &spec, o.url, run_levels, &o);
}
