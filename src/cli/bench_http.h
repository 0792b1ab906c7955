/*
 * bench_http.h - the network half shared by `kettle bench serve`, `kettle
 * bench agent` and `kettle bench soak`: this same binary's `kettle serve` started as a
 * child process for the run, and one HTTP request to an OpenAI-compatible
 * server set up for libcurl's multi interface, its streamed answer fed to
 * the SSE parser of bench_serve.h as it arrives.
 *
 * Every request has a connect timeout and fails when no byte arrives for
 * timeout_s seconds, so a bench never waits forever.
 */
#ifndef KT_CLI_BENCH_HTTP_H
#define KT_CLI_BENCH_HTTP_H

#include <curl/curl.h>
#include <stdbool.h>
#include <sys/types.h>

#include "cli/bench_serve.h"
#include "cli/cli_util.h"

#define BH_MAX_SRV_ARGS 32

/* ---- the server as a child process ---- */

/* If argv[*i] is a `kettle serve` option the benches pass on (-t, --ctx,
 * --parallel, ...) appends it and its value to args (advancing *i) and
 * returns 1; 0 if it is not one; 2 after a usage error. */
int bh_take_server_opt(const char *cmd, int argc, char **argv, int *i, const char **args, int *n_args);
/* The usage lines naming those options, for --help. */
extern const char BH_SERVER_OPTS_USAGE[];
/* Whether args (name, value pairs from bh_take_server_opt) hold `name`. */
bool bh_has_server_opt(const char *const *args, int n_args, const char *name);
/* Whether a GGUF file has a chat template; true if it cannot be read (the
 * server will say why). A bench that sends chat requests gives a model
 * without one `--chat-template chatml`. */
bool bh_model_has_template(const char *path);

typedef struct bh_child {
    pid_t pid;  /* -1: none */
    int log_fd; /* its stdout and stderr: an unlinked temporary file; -1: none */
    char url[256];
} bh_child;

#define BH_CHILD_NONE ((bh_child){.pid = -1, .log_fd = -1})

/* Runs /proc/self/exe with argv (NULL-terminated, argv[0] "kettle", then
 * "serve", ..., "--port", "0") and waits at most timeout_s until it prints
 * "listening on URL". It dies with us (PR_SET_PDEATHSIG). False with a
 * message on stderr (naming `cmd`, and the server's last output). */
bool bh_child_start(bh_child *c, const char *cmd, const char *const *argv, int timeout_s);
/* The server a bench runs against with -m: `kettle serve -m MODEL --port 0
 * ARGS [--api-key KEY]`. */
typedef struct bh_serve_spec {
    const char *model;       /* NULL: none (the bench has --url) */
    const char *const *args; /* name, value pairs from bh_take_server_opt */
    int n_args;              /* at most BH_MAX_SRV_ARGS */
    const char *api_key;     /* NULL: none */
    bool chat; /* the bench sends chat requests: a model without a chat template gets `--chat-template chatml`
                * (said on stderr) unless args choose one */
    int timeout_s;
} bh_serve_spec;

/* Starts spec's server by bh_child_start. */
bool bh_server_start(bh_child *c, const char *cmd, const bh_serve_spec *spec);
/* What every bench command does around its measurement: spec's server
 * started when spec->model is set, libcurl set up, then run(ctx, URL,
 * child) with the server's URL (child: the server) or `url` (child NULL;
 * url may be NULL when the bench keeps its own list), trailing '/'
 * dropped; after a failed run the server's last output if it died; the
 * server stopped and libcurl cleaned up, whatever happened. run's exit
 * status, or 1 when the server or libcurl did not start. */
int bh_run_bench(const char *cmd, const bh_serve_spec *spec, const char *url,
                 int (*run)(void *ctx, const char *url, const bh_child *child), void *ctx);
/* SIGTERM, then SIGKILL after 10 s; closes the log. Safe on BH_CHILD_NONE. */
void bh_child_stop(bh_child *c);
/* After a failure: if the server has died, says so with its last output. */
void bh_child_report_death(bh_child *c, const char *cmd);
/* The server's peak resident memory (VmHWM of /proc/PID/status) in bytes;
 * -1 if unknown. */
long long bh_child_peak_rss(const bh_child *c);
/* Its resident memory now (VmRSS) in bytes; -1 if unknown. */
long long bh_child_rss(const bh_child *c);

/* ---- one HTTP request ---- */

typedef struct bh_req {
    int kind, index; /* the caller's: what the request is, for its messages */
    bool plain;      /* not a stream: the body is not parsed (GET /health) */
    bool keep_body;  /* keep the whole answer, whatever its status, in resp */
    cli_text resp;   /* keep_body: the answer's bytes (resp.p NULL: none came) */
    CURL *h;
    struct curl_slist *headers;
    char *body; /* owned; POSTed when not NULL */
    double start_ms, end_ms;
    double last_rx_ms; /* when the last bytes of the answer came; 0: none yet */
    bs_sse sse;
    long status;
    char err_body[512]; /* the start of a non-200 answer */
    size_t err_len;
    char curl_err[CURL_ERROR_SIZE];
} bh_req;

typedef struct bh_conn {
    const char *url;     /* no trailing '/': paths are appended */
    const char *api_key; /* NULL: none */
    int timeout_s;       /* fail after this long without a byte */
} bh_conn;

/* Sets up r (kind, index, plain and body set by the caller) for conn->url
 * + path: a streaming POST when there is a body. CURLOPT_PRIVATE is r.
 * False if out of memory. */
bool bh_req_init(bh_req *r, const bh_conn *conn, const char *path);
/* One more request header, "Name: value" (before the request starts).
 * False if out of memory. */
bool bh_req_add_header(bh_req *r, const char *line);
/* Frees the handle, headers, body and parser state (r itself stays). */
void bh_req_free(bh_req *r);
/* Why a finished request failed (transport, HTTP status, a stream error,
 * no [DONE], a cancelled request), into msg; false if it did not fail. */
bool bh_req_failed(const bh_req *r, CURLcode rc, char *msg, size_t cap);

/* Tokens of text by POST /tokenize ({"content": TEXT} -> {"tokens": [...]},
 * as kettle and llama.cpp's server); -1 if that does not work. */
int bh_count_tokens(const bh_conn *conn, const char *text);

/* Hands each finished transfer of m to finish(ctx, its CURLOPT_PRIVATE,
 * its result) until none is left; false as soon as finish returns false
 * (the bench then stops). */
bool bh_drain_done(CURLM *m, bool (*finish)(void *ctx, void *priv, CURLcode rc), void *ctx);

/* Drops trailing '/' from url (in place). */
void bh_trim_url(char *url);

#endif
