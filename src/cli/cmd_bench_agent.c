/*
 * cmd_bench_agent.c - `kettle bench agent`: what users of an agent feel.
 * An agent does not send one prompt: it sends a long system prompt with
 * tool schemas, a document, then turn after turn the whole history again
 * with the model's last reply and a tool result appended. What matters is
 * how long each turn takes to start answering (TTFT), whether later turns
 * are cheaper than the first (a prefix cache's work: they re-send what the
 * server has already seen), and how long a whole task takes.
 *
 * The sessions (synthetic, bench_agent_work.c, or recorded conversations
 * replayed, bench_agent_replay.c) run --concurrency at a time; each has one
 * streaming POST /v1/chat/completions in flight, and the next turn starts
 * as soon as the last one is done (the tools take no time). libcurl's
 * multi interface drives them all from one thread, as in bench serve, so
 * no client thread scheduling gets into the latencies. Each request's
 * stream is parsed as it arrives (bench_serve_stats.c): TTFT = request
 * sent .. first chunk with content (or a tool call), turn time = sent ..
 * [DONE], task time = first turn sent .. last turn done.
 *
 * With several --url the same workload runs against each in turn, A B A B
 * for --rounds, in one sitting, so their ratios are not skewed by whatever
 * else the machine did in between. With -m the server is this binary's
 * `kettle serve` as a child (bench_http.c), and its peak RSS is reported.
 *
 * Every failure (unreachable server, non-200, a malformed stream, one that
 * ends before [DONE], nothing received for --timeout seconds) names the
 * server, the session and the turn, and makes the exit status 1.
 *
 * --screenshots is another workload, the loop of a computer-use agent,
 * with its own driver (bench_agent_shots_run.c): this file parses its
 * options and hands it the servers.
 */
#include <curl/curl.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/timing.h"
#include "cli/bench_agent.h"
#include "cli/bench_agent_shots.h"
#include "cli/bench_screens.h"
#include "cli/bench_http.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/model_store.h"

#define CMD "bench agent"
#define MAX_URLS 4
#define CALIBRATION_WORDS 100

typedef struct ba_opts {
    const char *urls[MAX_URLS];
    int n_urls;
    const char *model, *api_key, *model_name, *svg, *replay, *replay_tools, *tool_choice;
    const char *logit_bias; /* a JSON object sent as every request's logit_bias */
    const char *session_header; /* a header naming the session, for a balancer's affinity; NULL: none */
    const char *srv_args[BH_MAX_SRV_ARGS];
    int n_srv_args;
    int sessions, concurrency, turns, system_tokens, doc_tokens, tool_tokens, gen_tokens;
    int replay_limit, rounds, timeout_s, seed;
    bool native_tools, tools_in_system;
    const char *synth_only; /* the first option given that only the synthetic workload takes */
    bool turns_set, gen_set, sessions_set;
    /* --screenshots: the computer-use loop (bench_agent_shots.h) */
    bool screenshots, prepare;
    int steps, keep_screens, action_ms, screen_w, screen_h;
    const char *shots_only; /* the first option given that only --screenshots takes */
    const char *not_shots;  /* the first option given that --screenshots does not take */
    bs_fmt fmt;
} ba_opts;

/* The options --screenshots has no use for (its requests are its own). */
static const char *const NOT_SHOTS[] = {"--turns", "--system-tokens", "--doc-tokens", "--tool-tokens",
                                        "--tools-in-system", "--replay", "--replay-limit", "--replay-tools",
                                        "--tool-format", "--tool-choice", "--logit-bias", "--rounds",
                                        "--session-header", "--svg", "--concurrency"};

static void usage(FILE *out) {
    fprintf(out,
            "usage: kettle bench agent (--url URL [--url URL2 ...] | -m MODEL [server options]) [options]\n"
            "Runs agent sessions against an OpenAI-compatible server: every turn re-sends the whole\n"
            "history (system prompt + tools, document, replies, tool results) as a streaming\n"
            "POST /v1/chat/completions at temperature 0 with ignore_eos, and reports TTFT per turn,\n"
            "first vs later turns, task time per session, tokens sent, cached and prefilled.\n"
            "  --url URL            a running server; up to 4 --url: the same workload against each,\n"
            "                       alternating (A B A B ...), with ratios to the first\n"
            "  -m, --model FILE     start 'kettle serve -m FILE --port 0' for the run (stopped at the end);\n"
            "%s"
            "                       (chatml is used if the model has no chat template and none is given)\n"
            "synthetic workload (default):\n"
            "  --sessions N         agent sessions (default 4)\n"
            "  --turns T            turns per session (default 4)\n"
            "  --system-tokens N    shared system prompt incl. tool schemas, ~N tokens (default 1100)\n"
            "  --doc-tokens N       each session's document in its first message (default 1300)\n"
            "  --tool-tokens N      the tool result appended after each turn (default 280)\n"
            "  --seed N             another seed gives other texts of the same sizes (default 1)\n"
            "  --tools-in-system    put the tool schemas into the system prompt as JSON text and send\n"
            "                       no `tools` field: the same prompt for servers whose template drops\n"
            "                       tools, or that refuse tools with streaming (llama-server b4753)\n"
            "                       token sizes take a k suffix (x1000): --doc-tokens 8k, 32k\n"
            "replay of recorded conversations:\n"
            "  --replay FILE.jsonl  one conversation a line: \"messages\" (OpenAI) or \"messages_display\"\n"
            "                       (\"role: text\" lines), optional \"tools\"; every assistant message is\n"
            "                       a turn, sent with the recorded history before it\n"
            "  --replay-limit N     the first N conversations only\n"
            "  --replay-tools FILE  tool schemas (JSON array) for conversations that name none\n"
            "  --tool-format F      text (default): tool calls as assistant text, tool results as user\n"
            "                       messages, for any chat template; native: role \"tool\" and tool_calls\n"
            "  --turns T            at most T turns per conversation (default all)\n"
            "both:\n"
            "  --concurrency C      sessions running at once (default: all)\n"
            "  --gen-tokens N       max_tokens of every turn (default 32)\n"
            "  --tool-choice C      send tool_choice C (auto, required, none) with the tools; every reply's\n"
            "                       tool calls are checked and counted (default: not sent)\n"
            "  --logit-bias JSON    send this logit_bias with every turn, e.g. '{\"1\": 10}' (a random-weight\n"
            "                       model ends its strings sooner where token 1 is '\"')\n"
            "  --rounds R           run everything R times per server (default 1); from round 2 on the\n"
            "                       first message starts with \"(round R)\", so no cache carries over\n"
            "  --model-name NAME    the \"model\" field of requests (default: none sent)\n"
            "  --session-header H   send header H with every turn, one value per session and round\n"
            "                       (agent-rROUND-sSESSION), so a balancer hashing on it keeps a session\n"
            "                       on one replica (e.g. --session-header X-Session-Id; default: none)\n"
            "  --api-key KEY        sent as 'Authorization: Bearer KEY' (and given to the server with -m)\n"
            "  --timeout S          fail a turn that receives nothing for S seconds (default 120)\n"
            "  --md | --csv | --json  output (default md; csv: one row per turn measured)\n"
            "  --svg FILE           also plot TTFT p50/p95 and prompt/cached tokens per turn\n"
            "computer-use screenshots (a server with a vision projector: kettle serve --mmproj, or -m with\n"
            "--mmproj FILE; llama-server --mmproj):\n"
            "  --screenshots        each step sends a new synthetic desktop screenshot (PNG, deterministic)\n"
            "                       with the history of earlier screenshots and actions, and asks for one\n"
            "                       action as JSON under a schema (click/type/key/scroll/done, x, y, text);\n"
            "                       reports per step the screenshot-to-action time (request sent .. action\n"
            "                       parsed), TTFT, image encode ms (the target's /metrics; '-' where it has\n"
            "                       none), cached prompt tokens, and the task time, p50/p95\n"
            "  --steps N            steps per session (default 10)\n"
            "  --sessions N         sessions, one after another, each with its own screens (default 1)\n"
            "  --screen WxH         screenshot size, e.g. 1280x720 (default) or 1920x1080 (160x120 .. 3840x2160)\n"
            "  --keep-screens K     only the last K screenshots stay images in the history; older ones become\n"
            "                       \"" BA_SHOT_OMITTED "\" (default: all kept)\n"
            "  --action-ms MS       the agent executing an action before the next capture (default 300)\n"
            "  --prepare            also run each server with the prepared step: during the action, the\n"
            "                       conversation so far goes out as a max_tokens 0 request, so the next step\n"
            "                       only prefills its new screenshot; reported as its own target (+prepare)\n"
            "  --seed N, --gen-tokens N (default 48), --model-name, --api-key, --timeout, --md/--csv/--json\n"
            "Exit status 1 on any failed turn (the message names server, session and turn), 2 on usage.\n",
            BH_SERVER_OPTS_USAGE);
}

/* ---- options ---- */

/* A token count: digits with an optional k (x1000). */
static bool parse_tokens(const char *s, long lo, long hi, int *out) {
    char buf[32];
    size_t n = strlen(s);
    if (n == 0 || n >= sizeof buf) return false;
    bool k = s[n - 1] == 'k' || s[n - 1] == 'K';
    snprintf(buf, sizeof buf, "%.*s", (int)(n - k), s);
    int v;
    if (!cli_parse_int(buf, k ? (lo + 999) / 1000 : lo, k ? hi / 1000 : hi, &v)) return false;
    *out = k ? v * 1000 : v;
    return true;
}

typedef struct int_opt {
    const char *name;
    long lo, hi;
    int *dst;
    bool synth_only, tokens, shots_only;
} int_opt;

static int take_int(int argc, char **argv, int *i, const int_opt *io, ba_opts *o) {
    const char *v = NULL;
    int r = cli_opt(CMD, argc, argv, i, io->name, &v);
    if (r <= 0) return r < 0 ? 2 : 0;
    bool ok = io->tokens ? parse_tokens(v, io->lo, io->hi, io->dst) : cli_parse_int(v, io->lo, io->hi, io->dst);
    if (!ok) return cli_usage_error(CMD, "invalid value '%s' for %s (%ld..%ld)", v, io->name, io->lo, io->hi);
    if (io->synth_only && !o->synth_only) o->synth_only = io->name;
    if (io->shots_only && !o->shots_only) o->shots_only = io->name;
    if (io->dst == &o->turns) o->turns_set = true;
    if (io->dst == &o->gen_tokens) o->gen_set = true;
    if (io->dst == &o->sessions) o->sessions_set = true;
    return 1;
}

/* --screenshots, --prepare and --screen WxH. */
static int take_shots_flag(int argc, char **argv, int *i, ba_opts *o) {
    if (!strcmp(argv[*i], "--screenshots")) return o->screenshots = true, 1;
    if (!strcmp(argv[*i], "--prepare")) {
        o->prepare = true;
        if (!o->shots_only) o->shots_only = "--prepare";
        return 1;
    }
    const char *v = NULL;
    int r = cli_opt(CMD, argc, argv, i, "--screen", &v);
    if (r <= 0) return r < 0 ? 2 : 0;
    char tail;
    if (sscanf(v, "%dx%d%c", &o->screen_w, &o->screen_h, &tail) != 2 || o->screen_w < BA_SCREEN_MIN_W ||
        o->screen_h < BA_SCREEN_MIN_H || o->screen_w > BA_SCREEN_MAX_W || o->screen_h > BA_SCREEN_MAX_H)
        return cli_usage_error(CMD, "--screen takes WIDTHxHEIGHT, %dx%d .. %dx%d, like 1280x720", BA_SCREEN_MIN_W,
                               BA_SCREEN_MIN_H, BA_SCREEN_MAX_W, BA_SCREEN_MAX_H);
    if (!o->shots_only) o->shots_only = "--screen";
    return 1;
}

static int take_string(int argc, char **argv, int *i, ba_opts *o) {
    const cli_str_opt strs[] = {
        {"-m", &o->model},         {"--model", &o->model},   {"--svg", &o->svg},
        {"--api-key", &o->api_key}, {"--replay", &o->replay}, {"--replay-tools", &o->replay_tools},
        {"--tool-choice", &o->tool_choice}, {"--logit-bias", &o->logit_bias},
        {"--model-name", &o->model_name}, {"--session-header", &o->session_header}};
    int r = cli_take_opt(CMD, argc, argv, i, NULL, 0, strs, sizeof strs / sizeof strs[0]);
    if (r) return r;
    const char *v = NULL;
    if ((r = cli_opt(CMD, argc, argv, i, "--url", &v))) {
        if (r < 0) return 2;
        if (o->n_urls == MAX_URLS) return cli_usage_error(CMD, "at most %d --url", MAX_URLS);
        o->urls[o->n_urls++] = v;
        return 1;
    }
    if (!strcmp(argv[*i], "--tools-in-system")) {
        o->tools_in_system = true;
        if (!o->synth_only) o->synth_only = "--tools-in-system";
        return 1;
    }
    if ((r = take_shots_flag(argc, argv, i, o))) return r;
    if ((r = cli_opt(CMD, argc, argv, i, "--tool-format", &v))) {
        if (r < 0) return 2;
        if (strcmp(v, "text") && strcmp(v, "native")) return cli_usage_error(CMD, "--tool-format is text or native");
        o->native_tools = !strcmp(v, "native");
        return 1;
    }
    return 0;
}

/* An option of the bench itself: 1 taken, 0 unknown, 2 usage error. */
static int take_bench_opt(int argc, char **argv, int *i, ba_opts *o) {
    const int_opt ints[] = {
        {"--sessions", 1, 4096, &o->sessions, true, false, false},
        {"--concurrency", 1, 4096, &o->concurrency, false, false, false},
        {"--turns", 1, 10000, &o->turns, false, false, false},
        {"--system-tokens", 1, 1 << 21, &o->system_tokens, true, true, false},
        {"--doc-tokens", 1, 1 << 21, &o->doc_tokens, true, true, false},
        {"--tool-tokens", 1, 1 << 21, &o->tool_tokens, true, true, false},
        {"--gen-tokens", 1, 1 << 20, &o->gen_tokens, false, true, false},
        {"--seed", 0, 1 << 30, &o->seed, true, false, false},
        {"--replay-limit", 1, 1 << 20, &o->replay_limit, false, false, false},
        {"--rounds", 1, 1000, &o->rounds, false, false, false},
        {"--timeout", 1, 86400, &o->timeout_s, false, false, false},
        {"--steps", 1, 10000, &o->steps, false, false, true},
        {"--keep-screens", 1, 10000, &o->keep_screens, false, false, true},
        {"--action-ms", 0, 3600000, &o->action_ms, false, false, true}};
    for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++) {
        int r = take_int(argc, argv, i, &ints[k], o);
        if (r) return r;
    }
    return take_string(argc, argv, i, o);
}

/* --screenshots takes its own options and a few of the others. */
static int check_shots_opts(ba_opts *o) {
    if (!o->screenshots && o->shots_only) return cli_usage_error(CMD, "%s needs --screenshots", o->shots_only);
    if (!o->screenshots) return 0;
    if (o->not_shots) return cli_usage_error(CMD, "%s is not for --screenshots", o->not_shots);
    if (!o->gen_set) o->gen_tokens = 48; /* an action: ~25 tokens of JSON, with room */
    if (!o->sessions_set) o->sessions = 1;
    return 0;
}

static int check_opts(ba_opts *o) {
    if (!o->n_urls == !o->model) return cli_usage_error(CMD, "give either --url URL (up to %d) or -m MODEL", MAX_URLS);
    int r = check_shots_opts(o);
    if (r) return r;
    if (o->n_urls && o->n_srv_args) return cli_usage_error(CMD, "server options (%s) need -m MODEL", o->srv_args[0]);
    if (o->api_key && !o->api_key[0]) return cli_usage_error(CMD, "--api-key must not be empty");
    if (o->session_header && (!o->session_header[0] || strpbrk(o->session_header, ": \t\r\n")))
        return cli_usage_error(CMD, "--session-header takes a header name, like X-Session-Id");
    if (o->replay && o->synth_only)
        return cli_usage_error(CMD, "%s is for the synthetic workload, not --replay (use --replay-limit)",
                               o->synth_only);
    if (!o->replay && (o->replay_limit || o->replay_tools || o->native_tools))
        return cli_usage_error(CMD, "--replay-limit, --replay-tools and --tool-format need --replay FILE");
    if (o->logit_bias) {
        json_t *b = json_loads(o->logit_bias, 0, NULL);
        bool ok = json_is_object(b);
        json_decref(b);
        if (!ok) return cli_usage_error(CMD, "--logit-bias takes a JSON object of token id: bias, like '{\"1\": 10}'");
    }
    if (o->replay && !o->turns_set) o->turns = 0; /* all of each conversation */
    return 0;
}

static int parse_opts(int argc, char **argv, ba_opts *o) {
    *o = (ba_opts){.sessions = 4, .turns = 4, .system_tokens = 1100, .doc_tokens = 1300, .tool_tokens = 280,
                   .gen_tokens = 32, .rounds = 1, .timeout_s = 120, .seed = 1, .steps = 10, .action_ms = 300,
                   .screen_w = 1280, .screen_h = 720};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r;
        for (size_t k = 0; !o->not_shots && k < sizeof NOT_SHOTS / sizeof NOT_SHOTS[0]; k++)
            if (!strcmp(a, NOT_SHOTS[k])) o->not_shots = NOT_SHOTS[k];
        if (!strcmp(a, "--md")) o->fmt = BS_MD;
        else if (!strcmp(a, "--csv")) o->fmt = BS_CSV;
        else if (!strcmp(a, "--json")) o->fmt = BS_JSON;
        else if ((r = take_bench_opt(argc, argv, &i, o)) ||
                 (r = bh_take_server_opt(CMD, argc, argv, &i, o->srv_args, &o->n_srv_args))) {
            if (r == 2) return 2;
        } else {
            return cli_usage_error(CMD, "unknown option '%s'", a);
        }
    }
    return check_opts(o);
}

/* ---- the workload ---- */

static int count_words_tokens(const bh_conn *c, int n_words) {
    char *text = ba_words(7, n_words);
    int n = text ? bh_count_tokens(c, text) : -1;
    free(text);
    return n;
}

static int count_json_tokens(const bh_conn *c, json_t *v, size_t *bytes) {
    char *text = json_dumps(v, JSON_COMPACT);
    int n = text ? bh_count_tokens(c, text) : -1;
    *bytes = text ? strlen(text) : 0;
    free(text);
    return n;
}

/* Tokens per word and per JSON byte from the server's /tokenize: the
 * difference of two sizes, so a BOS token does not count. */
static ba_sizing calibrate(const bh_conn *c) {
    ba_sizing sz = BA_SIZING_DEFAULT;
    int n1 = count_words_tokens(c, CALIBRATION_WORDS), n2 = n1 > 0 ? count_words_tokens(c, 10 * CALIBRATION_WORDS) : -1;
    if (n2 <= n1) return sz;
    sz.tokens_per_word = (double)(n2 - n1) / (9 * CALIBRATION_WORDS);
    sz.calibrated = true;
    json_t *all = ba_synth_tools(1 << 30, &sz), *one = json_array();
    size_t b1 = 0, b4 = 0;
    if (all && one && !json_array_append(one, json_array_get(all, 0))) {
        int t1 = count_json_tokens(c, one, &b1), t4 = count_json_tokens(c, all, &b4);
        if (t1 > 0 && t4 > t1 && b4 > b1) sz.json_tokens_per_byte = (double)(t4 - t1) / (double)(b4 - b1);
    }
    json_decref(all), json_decref(one);
    return sz;
}

static bool build_workload(const ba_opts *o, const bh_conn *first, ba_workload *w) {
    char err[1024];
    bool ok;
    if (o->replay) {
        json_error_t jerr;
        json_t *tools = o->replay_tools ? json_load_file(o->replay_tools, 0, &jerr) : NULL;
        if (o->replay_tools && !json_is_array(tools)) {
            fprintf(stderr, "kettle %s: --replay-tools %s: not a JSON array of tools (%s)\n", CMD, o->replay_tools,
                    tools ? "another JSON value" : jerr.text);
            json_decref(tools);
            return false;
        }
        ba_replay_opts ro = {.path = o->replay, .limit = o->replay_limit, .max_turns = o->turns, .tools = tools,
                             .native = o->native_tools};
        ok = ba_replay_load(&ro, w, err, sizeof err);
        json_decref(tools);
    } else {
        ba_synth_opts so = {.sessions = o->sessions, .turns = o->turns, .system_tokens = o->system_tokens,
                            .doc_tokens = o->doc_tokens, .tool_tokens = o->tool_tokens, .seed = (uint64_t)o->seed,
                            .sz = calibrate(first), .tools_in_system = o->tools_in_system};
        ok = ba_synth_build(&so, w, err, sizeof err);
    }
    if (!ok) fprintf(stderr, "kettle %s: %s\n", CMD, err);
    return ok;
}

/* ---- one round against one server ---- */

/* --concurrency, or every session at once; never more than there are. */
static int concurrency_of(const ba_opts *o, const ba_workload *w) {
    return o->concurrency && o->concurrency < w->n ? o->concurrency : w->n;
}

typedef struct sess_run {
    const ba_session *s;
    ba_sess_rec *rec;
    json_t *history;
    int turn; /* 0-based: the one in flight */
    bh_req req;
    double t0_ms;
} sess_run;

typedef struct round_run {
    const ba_opts *o;
    const ba_workload *w;
    bh_conn conn;
    CURLM *m;
    int round, concurrency;
    sess_run *runs;
    int next, n_active, n_done;
    char label[320]; /* "http://...: round 1" */
    char error[1024];
} round_run;

/* Keeps the first failure: "LABEL, SESSION, turn K: MSG". */
static bool run_fail(round_run *rr, const sess_run *sr, const char *msg) {
    if (rr->error[0]) return false;
    if (sr)
        snprintf(rr->error, sizeof rr->error, "%s, %s, turn %d/%d: %s", rr->label, sr->s->name, sr->turn + 1,
                 sr->s->n_turns, msg);
    else snprintf(rr->error, sizeof rr->error, "%s: %s", rr->label, msg);
    return false;
}

/* The JSON body of one turn; NULL if out of memory. */
static char *turn_body(const ba_opts *o, json_t *messages, json_t *tools) {
    json_t *bias = o->logit_bias ? json_loads(o->logit_bias, 0, NULL) : NULL; /* checked in check_opts */
    json_t *b = json_pack("{s:O, s:O*, s:i, s:i, s:b, s:{s:b}, s:b, s:s*, s:s*, s:o*}", "messages", messages, "tools",
                          tools, "max_tokens", o->gen_tokens, "temperature", 0, "stream", 1, "stream_options",
                          "include_usage", 1, "ignore_eos", 1, "model", o->model_name, "tool_choice",
                          tools ? o->tool_choice : NULL, "logit_bias", bias);
    char *text = b ? json_dumps(b, JSON_COMPACT) : NULL;
    json_decref(b);
    return text;
}

/* --session-header: the same value on every turn of a session, another
 * for each session and round. */
static bool add_session_header(const round_run *rr, sess_run *sr) {
    if (!rr->o->session_header) return true;
    char line[512];
    snprintf(line, sizeof line, "%s: agent-r%d-s%d", rr->o->session_header, rr->round, (int)(sr - rr->runs) + 1);
    return bh_req_add_header(&sr->req, line);
}

static bool start_turn(round_run *rr, sess_run *sr) {
    json_t *msgs = ba_turn_messages(sr->s, sr->history, sr->turn);
    sr->req = (bh_req){.index = sr->turn};
    sr->req.body = msgs ? turn_body(rr->o, msgs, sr->s->tools) : NULL;
    json_decref(msgs);
    if (!sr->req.body || !bh_req_init(&sr->req, &rr->conn, "/v1/chat/completions") || !add_session_header(rr, sr))
        return run_fail(rr, sr, "out of memory");
    sr->req.sse.keep_text = true; /* the reply goes back in the next turn */
    curl_easy_setopt(sr->req.h, CURLOPT_PRIVATE, sr);
    sr->req.start_ms = kt_time_ms();
    if (sr->turn == 0) sr->t0_ms = sr->req.start_ms;
    if (curl_multi_add_handle(rr->m, sr->req.h) != CURLM_OK) return run_fail(rr, sr, "curl_multi_add_handle failed");
    return true;
}

static bool start_session(round_run *rr) {
    sess_run *sr = &rr->runs[rr->next];
    sr->s = &rr->w->s[rr->next];
    rr->next++, rr->n_active++;
    if (!(sr->history = ba_history_new(sr->s, rr->round))) return run_fail(rr, sr, "out of memory");
    return start_turn(rr, sr);
}

static void record_turn(sess_run *sr) {
    const bh_req *r = &sr->req;
    const bs_sse *s = &r->sse;
    ba_turn_rec *tr = &sr->rec->turns[sr->turn];
    double first = s->n_tok ? s->tok_ms[0] : r->end_ms; /* nothing came: the whole turn was the wait */
    *tr = (ba_turn_rec){.prompt_tokens = s->prompt_tokens, .cached_tokens = s->cached_tokens,
                        .completion_tokens = s->completion_tokens >= 0 ? s->completion_tokens : s->n_tok,
                        .ttft_ms = first - r->start_ms, .turn_ms = r->end_ms - r->start_ms,
                        .decode_ms = r->end_ms - first, .n_calls = (int)json_array_size(s->tool_calls)};
    tr->calls_valid = tr->n_calls && ba_calls_valid(sr->s->tools, s->tool_calls);
}

/* A turn's stream is over: check it, record it, start the next turn. */
static bool finish_turn(round_run *rr, sess_run *sr, CURLcode rc) {
    char msg[800];
    sr->req.end_ms = kt_time_ms();
    curl_multi_remove_handle(rr->m, sr->req.h);
    if (bh_req_failed(&sr->req, rc, msg, sizeof msg)) return run_fail(rr, sr, msg);
    record_turn(sr);
    if (!ba_feed_reply(sr->s, sr->history, sr->turn, sr->req.sse.text, sr->req.sse.tool_calls))
        return run_fail(rr, sr, "out of memory");
    bh_req_free(&sr->req);
    if (++sr->turn < sr->s->n_turns) return start_turn(rr, sr);
    sr->rec->task_ms = sr->req.end_ms - sr->t0_ms;
    json_decref(sr->history);
    sr->history = NULL;
    rr->n_active--, rr->n_done++;
    return true;
}

/* bh_drain_done's finish: a session's turn (its sess_run is the private pointer). */
static bool finish_done(void *rr, void *sr, CURLcode rc) {
    return finish_turn(rr, sr, rc);
}

static bool drain_done(round_run *rr) {
    return bh_drain_done(rr->m, finish_done, rr);
}

static bool round_loop(round_run *rr) {
    while (rr->n_done < rr->w->n) {
        while (rr->next < rr->w->n && rr->n_active < rr->concurrency)
            if (!start_session(rr)) return false;
        int running;
        if (curl_multi_perform(rr->m, &running) != CURLM_OK) return run_fail(rr, NULL, "curl multi_perform failed");
        if (!drain_done(rr)) return false;
        if (rr->n_done == rr->w->n) break;
        if (curl_multi_poll(rr->m, NULL, 0, 100, NULL) != CURLM_OK) return run_fail(rr, NULL, "curl poll failed");
    }
    return true;
}

static void round_cleanup(round_run *rr) {
    for (int i = 0; i < rr->next; i++) {
        if (rr->runs[i].req.h) curl_multi_remove_handle(rr->m, rr->runs[i].req.h);
        bh_req_free(&rr->runs[i].req);
        json_decref(rr->runs[i].history);
    }
    free(rr->runs);
}

/* Round `round` against target t; false with a message on stderr. */
static bool run_round(const ba_opts *o, const ba_workload *w, const bh_conn *conn, CURLM *m, int round,
                      ba_result *res, char tag) {
    round_run rr = {.o = o, .w = w, .conn = *conn, .m = m, .round = round};
    rr.concurrency = concurrency_of(o, w);
    snprintf(rr.label, sizeof rr.label, "%s, round %d", res->target, round);
    rr.runs = calloc((size_t)w->n, sizeof *rr.runs);
    for (int i = 0; rr.runs && i < w->n; i++) rr.runs[i].rec = &res->sess[(round - 1) * w->n + i];
    double t0 = kt_time_ms();
    bool ok = rr.runs ? round_loop(&rr) : run_fail(&rr, NULL, "out of memory");
    if (ok) {
        int turns = 0;
        for (int i = 0; i < w->n; i++) turns += w->s[i].n_turns;
        fprintf(stderr, "kettle %s: %c %s, round %d: %d session%s, %d turns in %.2f s\n", CMD, tag, res->target,
                round, w->n, w->n == 1 ? "" : "s", turns, (kt_time_ms() - t0) / 1e3);
    } else {
        fprintf(stderr, "kettle %s: %s\n", CMD, rr.error);
    }
    round_cleanup(&rr);
    return ok;
}

/* One short unmeasured request: connects, touches the server's first-use
 * costs, and finds a server that cannot chat before any figure is taken. */
static bool warm_up(const ba_opts *o, const bh_conn *conn, const char *target) {
    json_t *msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", "Hello.");
    ba_opts one = *o;
    one.gen_tokens = 2;
    bh_req r = {0};
    r.body = msgs ? turn_body(&one, msgs, NULL) : NULL;
    json_decref(msgs);
    char msg[800] = "out of memory";
    bool ok = r.body && bh_req_init(&r, conn, "/v1/chat/completions");
    ok = ok && !bh_req_failed(&r, curl_easy_perform(r.h), msg, sizeof msg);
    if (!ok) fprintf(stderr, "kettle %s: %s, warm-up request: %s\n", CMD, target, msg);
    bh_req_free(&r);
    return ok;
}

/* ---- the run ---- */

typedef struct run_ctx {
    const ba_opts *o;
    bh_conn conns[MAX_URLS];
    char urls[MAX_URLS][1024];
    const char *names[MAX_URLS]; /* what the reports call each server */
    int n;
    const bh_child *child; /* the server with -m; NULL with --url */
    ba_workload *w;
} run_ctx;

static int fail_oom(void) {
    fprintf(stderr, "kettle %s: out of memory\n", CMD);
    return 1;
}

/* The ratio lines on stderr, where CSV has no room for them. */
static void print_ratios_stderr(const ba_report *r) {
    for (int i = 1; i < r->n_targets; i++) {
        double task, later;
        ba_ratios(r, i, &task, &later);
        fprintf(stderr, "kettle %s: ratio %c/A: task time p50 x%.3f, later-turn TTFT p50 x%.3f\n", CMD, 'A' + i,
                task, later);
    }
}

static int report(const ba_opts *o, const ba_workload *w, ba_result *res, int n) {
    ba_summary sums[MAX_URLS];
    int made = 0, rc = 0;
    while (made < n && ba_summarize(&res[made], &sums[made])) made++;
    ba_report r = {.w = w, .rounds = o->rounds, .concurrency = concurrency_of(o, w), .gen_tokens = o->gen_tokens,
                   .results = res, .sums = sums, .n_targets = n};
    if (made < n || !ba_print(stdout, o->fmt, &r)) rc = fail_oom();
    if (!rc && o->fmt == BS_CSV) print_ratios_stderr(&r);
    if (!rc && o->svg && !ba_write_svg(o->svg, &r)) {
        fprintf(stderr, "kettle %s: cannot write %s: %s\n", CMD, o->svg, strerror(errno));
        rc = 1;
    }
    for (int i = 0; i < made; i++) ba_summary_free(&sums[i]);
    return rc;
}

/* Every round against every server, alternating; then the report. */
static int run_all(run_ctx *c, const ba_workload *w, CURLM *m) {
    ba_result res[MAX_URLS];
    int made = 0, rc = 0;
    while (made < c->n && ba_result_init(&res[made], c->names[made], w, c->o->rounds)) made++;
    if (made < c->n) rc = fail_oom();
    for (int i = 0; !rc && i < c->n; i++)
        if (!warm_up(c->o, &c->conns[i], c->names[i])) rc = 1;
    for (int round = 1; !rc && round <= c->o->rounds; round++)
        for (int i = 0; !rc && i < c->n; i++)
            if (!run_round(c->o, w, &c->conns[i], m, round, &res[i], (char)('A' + i))) rc = 1;
    if (!rc && c->child) res[0].peak_rss = bh_child_peak_rss(c->child);
    if (!rc) rc = report(c->o, w, res, c->n);
    for (int i = 0; i < made; i++) ba_result_free(&res[i]);
    return rc;
}

/* The servers: with -m the one started (its URL server_url), else every --url. */
static void set_targets(run_ctx *c, const char *server_url) {
    const ba_opts *o = c->o;
    c->n = o->model ? 1 : o->n_urls;
    for (int i = 0; i < c->n; i++) {
        snprintf(c->urls[i], sizeof c->urls[i], "%s", o->model ? server_url : o->urls[i]);
        bh_trim_url(c->urls[i]);
        c->conns[i] = (bh_conn){.url = c->urls[i], .api_key = o->api_key, .timeout_s = o->timeout_s};
        c->names[i] = o->model ? o->model : c->urls[i];
    }
}

/* --screenshots: bench_agent_shots_run.c's loop against the servers. */
static int run_shots(const run_ctx *c) {
    const ba_opts *o = c->o;
    ba_shots_opts so = {.steps = o->steps, .sessions = o->sessions, .keep_screens = o->keep_screens,
                        .screen_w = o->screen_w, .screen_h = o->screen_h, .action_ms = o->action_ms,
                        .gen_tokens = o->gen_tokens, .prepare = o->prepare, .seed = (uint64_t)o->seed,
                        .model_name = o->model_name};
    return ba_shots_main(&so, o->fmt, c->conns, c->names, c->n);
}

/* bh_run_bench's run: url is the started server's (none with --url). */
static int run(void *ctx, const char *url, const bh_child *child) {
    run_ctx *c = ctx;
    ba_workload *w = c->w;
    c->child = child;
    set_targets(c, url);
    CURLM *m = curl_multi_init();
    int rc = 0;
    if (!m) {
        fprintf(stderr, "kettle %s: curl_multi_init failed\n", CMD);
        rc = 1;
    }
    if (!rc && c->o->screenshots) {
        rc = run_shots(c);
    } else {
        if (!rc && !w->n && !build_workload(c->o, &c->conns[0], w)) rc = 1; /* synthetic: sized by the first server */
        if (!rc) rc = run_all(c, w, m);
    }
    if (m) curl_multi_cleanup(m);
    return rc;
}

int cmd_bench_agent(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    ba_opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc;
    char model_path[MS_PATH_MAX]; /* -m OWNER/REPO:QUANT: the pulled file */
    if (ms_resolve_opt(CMD, &o.model, model_path, sizeof model_path)) return 1;
    ba_workload w = {0};
    if (o.replay && !build_workload(&o, NULL, &w)) return 1; /* a bad file fails before any server starts */
    run_ctx c = {.o = &o, .w = &w};
    bh_serve_spec spec = {.model = o.model, .args = o.srv_args, .n_args = o.n_srv_args, .api_key = o.api_key,
                          .chat = true, .timeout_s = o.timeout_s};
    rc = bh_run_bench(CMD, &spec, NULL, run, &c);
    ba_workload_free(&w);
    return rc;
}
