/*
 * bench_http.c - the child server and the HTTP requests of the benches
 * (`kettle bench serve`, `kettle bench agent`). See bench_http.h.
 *
 * The child is this same binary (/proc/self/exe serve ... --port 0); its
 * output goes to an unlinked temporary file that we scan for "listening
 * on", so nothing is left behind and its last lines can be shown when it
 * fails. It gets SIGTERM at the end, also on errors, and PR_SET_PDEATHSIG
 * so it cannot outlive us if we are killed.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/timing.h"
#include "cli/bench_http.h"
#include "cli/cli_util.h"
#include "gguf/gguf.h"

/* ---- server options ---- */

static const char *const SERVER_OPTS[] = {
    "-t",           "--threads", "--ctx",         "--parallel",      "--kv-mb",        "--batch-tokens",
    "--queue",      "--kv-type", "--http-threads", "--load",         "--itl-stretch",  "--chat-template",
    "--prefix-cache", "--cache-dir", "--cache-disk-mb", "--max-stall-ms", "--state-cache-mb",
    "--mmproj"};

const char BH_SERVER_OPTS_USAGE[] =
    "                       passed on to it: -t/--threads, --ctx, --parallel, --kv-mb, --batch-tokens,\n"
    "                       --queue, --kv-type, --http-threads, --load, --itl-stretch, --chat-template,\n"
    "                       --prefix-cache, --cache-dir, --cache-disk-mb, --max-stall-ms, --state-cache-mb,\n"
    "                       --mmproj\n";

int bh_take_server_opt(const char *cmd, int argc, char **argv, int *i, const char **args, int *n_args) {
    for (size_t k = 0; k < sizeof SERVER_OPTS / sizeof SERVER_OPTS[0]; k++) {
        const char *v = NULL;
        int r = cli_opt(cmd, argc, argv, i, SERVER_OPTS[k], &v);
        if (r < 0) return 2;
        if (r == 0) continue;
        if (*n_args + 2 > BH_MAX_SRV_ARGS) return cli_usage_error(cmd, "too many server options");
        args[(*n_args)++] = SERVER_OPTS[k];
        args[(*n_args)++] = v;
        return 1;
    }
    return 0;
}

bool bh_has_server_opt(const char *const *args, int n_args, const char *name) {
    for (int i = 0; i < n_args; i += 2)
        if (!strcmp(args[i], name)) return true;
    return false;
}

bool bh_model_has_template(const char *path) {
    kt_error err = {0};
    gguf_file *f = gguf_open(path, &err);
    if (!f) return true;
    bool has = gguf_find_key(f, "tokenizer.chat_template") >= 0;
    gguf_close(f);
    return has;
}

/* ---- the child ---- */

static int open_log(void) {
    const char *dir = getenv("TMPDIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/kettle-bench-XXXXXX", dir && *dir ? dir : "/tmp");
    int fd = mkstemp(path);
    if (fd >= 0) unlink(path);
    return fd;
}

/* In the child: stdout/stderr to the log, die with the parent, exec. */
static void exec_server(const char *cmd, const char *const *argv, int log_fd, pid_t parent) {
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127); /* the parent died before prctl */
    execv("/proc/self/exe", (char *const *)argv);
    fprintf(stderr, "kettle %s: cannot run /proc/self/exe: %s\n", cmd, strerror(errno));
    _exit(127);
}

/* Prints the last lines the server wrote, for a failure's context. */
static void print_log_tail(const bh_child *c, const char *cmd) {
    char buf[2048];
    off_t end = lseek(c->log_fd, 0, SEEK_END);
    off_t from = end > (off_t)sizeof buf - 1 ? end - (off_t)sizeof buf + 1 : 0;
    ssize_t n = pread(c->log_fd, buf, sizeof buf - 1, from);
    if (n <= 0) return;
    buf[n] = 0;
    fprintf(stderr, "kettle %s: the server's last output:\n%s%s", cmd, buf, buf[n - 1] == '\n' ? "" : "\n");
}

/* Finds "listening on URL" in the log; true once it is there. */
static bool find_listen_line(bh_child *c) {
    static const char KEY[] = "kettle serve: listening on ";
    char buf[16384];
    ssize_t n = pread(c->log_fd, buf, sizeof buf - 1, 0);
    if (n <= 0) return false;
    buf[n] = 0;
    char *p = strstr(buf, KEY), *nl = p ? strchr(p, '\n') : NULL;
    if (!nl) return false;
    p += sizeof KEY - 1;
    snprintf(c->url, sizeof c->url, "%.*s", (int)(nl - p), p);
    return true;
}

void bh_child_stop(bh_child *c) {
    if (c->pid > 0) {
        kill(c->pid, SIGTERM);
        int status;
        double t0 = kt_time_ms();
        while (waitpid(c->pid, &status, WNOHANG) == 0) {
            if (kt_time_ms() - t0 > 10000) { /* a stuck shutdown: do not hang */
                kill(c->pid, SIGKILL);
                waitpid(c->pid, &status, 0);
                break;
            }
            usleep(10000);
        }
    }
    if (c->log_fd >= 0) close(c->log_fd);
    c->pid = -1, c->log_fd = -1;
}

bool bh_server_start(bh_child *c, const char *cmd, const bh_serve_spec *spec) {
    const char *argv[BH_MAX_SRV_ARGS + 16];
    int n = 0;
    argv[n++] = "kettle", argv[n++] = "serve", argv[n++] = "-m", argv[n++] = spec->model;
    argv[n++] = "--port", argv[n++] = "0";
    for (int i = 0; i < spec->n_args && i < BH_MAX_SRV_ARGS; i++) argv[n++] = spec->args[i];
    if (spec->api_key) argv[n++] = "--api-key", argv[n++] = spec->api_key;
    if (spec->chat && !bh_has_server_opt(spec->args, spec->n_args, "--chat-template") &&
        !bh_model_has_template(spec->model)) {
        fprintf(stderr, "kettle %s: %s has no chat template: the server uses chatml (--chat-template to choose)\n",
                cmd, spec->model);
        argv[n++] = "--chat-template", argv[n++] = "chatml";
    }
    argv[n] = NULL;
    return bh_child_start(c, cmd, argv, spec->timeout_s);
}

int bh_run_bench(const char *cmd, const bh_serve_spec *spec, const char *url,
                 int (*run)(void *ctx, const char *url, const bh_child *child), void *ctx) {
    bh_child child = BH_CHILD_NONE;
    if (spec->model && !bh_server_start(&child, cmd, spec)) return 1;
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0) {
        bh_child_stop(&child);
        return fprintf(stderr, "kettle %s: curl_global_init failed\n", cmd), 1;
    }
    char base[1024];
    snprintf(base, sizeof base, "%s", spec->model ? child.url : url ? url : "");
    bh_trim_url(base);
    int rc = run(ctx, base, spec->model ? &child : NULL);
    if (rc) bh_child_report_death(&child, cmd);
    bh_child_stop(&child);
    curl_global_cleanup();
    return rc;
}

bool bh_child_start(bh_child *c, const char *cmd, const char *const *argv, int timeout_s) {
    *c = (bh_child){.pid = -1, .log_fd = open_log()};
    if (c->log_fd < 0) return fprintf(stderr, "kettle %s: temporary file: %s\n", cmd, strerror(errno)), false;
    fflush(NULL);
    pid_t parent = getpid();
    c->pid = fork();
    if (c->pid < 0) return fprintf(stderr, "kettle %s: fork: %s\n", cmd, strerror(errno)), bh_child_stop(c), false;
    if (c->pid == 0) exec_server(cmd, argv, c->log_fd, parent);
    double t0 = kt_time_ms();
    int status;
    while (!find_listen_line(c)) {
        bool died = waitpid(c->pid, &status, WNOHANG) == c->pid;
        if (died || kt_time_ms() - t0 > timeout_s * 1e3) {
            fprintf(stderr, "kettle %s: the server %s\n", cmd,
                    died ? "exited before listening" : "did not listen within --timeout");
            if (died) c->pid = -1;
            print_log_tail(c, cmd);
            bh_child_stop(c);
            return false;
        }
        usleep(20000);
    }
    return true;
}

void bh_child_report_death(bh_child *c, const char *cmd) {
    if (c->pid > 0 && waitpid(c->pid, &(int){0}, WNOHANG) == c->pid) {
        c->pid = -1; /* it died: say what it said */
        print_log_tail(c, cmd);
    }
}

/* A "Key:   N kB" line of /proc/PID/status in bytes; -1 if unknown. */
static long long proc_status_bytes(const bh_child *c, const char *key) {
    char path[64], line[256];
    if (c->pid <= 0) return -1;
    snprintf(path, sizeof path, "/proc/%d/status", (int)c->pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = strlen(key);
    long long kib = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, n) && sscanf(line + n, "%lld", &kib) == 1) break;
    fclose(f);
    return kib >= 0 ? kib * 1024 : -1;
}

long long bh_child_peak_rss(const bh_child *c) { return proc_status_bytes(c, "VmHWM:"); }

long long bh_child_rss(const bh_child *c) { return proc_status_bytes(c, "VmRSS:"); }

/* ---- one HTTP request ---- */

static size_t on_data(char *data, size_t size, size_t n, void *user) {
    bh_req *r = user;
    size_t len = size * n;
    r->last_rx_ms = kt_time_ms();
    if (!r->status) curl_easy_getinfo(r->h, CURLINFO_RESPONSE_CODE, &r->status);
    if (r->keep_body && cli_text_append(data, 1, len, &r->resp) != len) return 0; /* out of memory: abort */
    if (r->status != 200) {
        size_t k = len < sizeof r->err_body - 1 - r->err_len ? len : sizeof r->err_body - 1 - r->err_len;
        memcpy(r->err_body + r->err_len, data, k);
        r->err_len += k;
        r->err_body[r->err_len] = 0;
        return len;
    }
    if (r->plain) return len;
    return bs_sse_feed(&r->sse, data, len, r->last_rx_ms) ? len : 0; /* 0 aborts the transfer */
}

void bh_req_free(bh_req *r) {
    if (r->h) curl_easy_cleanup(r->h);
    curl_slist_free_all(r->headers);
    free(r->body);
    free(r->resp.p);
    bs_sse_free(&r->sse);
    r->h = NULL, r->headers = NULL, r->body = NULL, r->resp = (cli_text){0};
}

static bool req_headers(bh_req *r, const char *api_key) {
    char auth[1024];
    struct curl_slist *l = curl_slist_append(NULL, "Content-Type: application/json");
    if (l) r->headers = l, l = curl_slist_append(l, "Expect:"); /* no 100-continue round trip */
    if (l && api_key) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", api_key);
        l = curl_slist_append(l, auth);
    }
    return l != NULL;
}

bool bh_req_add_header(bh_req *r, const char *line) {
    struct curl_slist *l = curl_slist_append(r->headers, line); /* the head stays: CURLOPT_HTTPHEADER sees it */
    if (!l) return false;
    r->headers = l;
    return true;
}

bool bh_req_init(bh_req *r, const bh_conn *conn, const char *path) {
    char full[1024];
    snprintf(full, sizeof full, "%s%s", conn->url, path);
    bs_sse_init(&r->sse);
    if (!(r->h = curl_easy_init()) || !req_headers(r, conn->api_key)) return false;
    curl_easy_setopt(r->h, CURLOPT_URL, full);
    curl_easy_setopt(r->h, CURLOPT_HTTPHEADER, r->headers);
    curl_easy_setopt(r->h, CURLOPT_PROXY, ""); /* a proxy would distort the figures */
    curl_easy_setopt(r->h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(r->h, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    curl_easy_setopt(r->h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(r->h, CURLOPT_LOW_SPEED_TIME, (long)conn->timeout_s);
    curl_easy_setopt(r->h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(r->h, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(r->h, CURLOPT_PRIVATE, r);
    curl_easy_setopt(r->h, CURLOPT_ERRORBUFFER, r->curl_err);
    if (r->body) {
        curl_easy_setopt(r->h, CURLOPT_POSTFIELDS, r->body);
        curl_easy_setopt(r->h, CURLOPT_POSTFIELDSIZE, (long)strlen(r->body));
    }
    return true;
}

bool bh_req_failed(const bh_req *r, CURLcode rc, char *msg, size_t cap) {
    if (r->sse.error[0]) snprintf(msg, cap, "%s", r->sse.error);
    else if (rc == CURLE_OPERATION_TIMEDOUT)
        snprintf(msg, cap, "timed out: nothing received for --timeout seconds (%s)",
                 r->curl_err[0] ? r->curl_err : curl_easy_strerror(rc));
    else if (rc != CURLE_OK)
        snprintf(msg, cap, "connection failed or dropped (%s)", r->curl_err[0] ? r->curl_err : curl_easy_strerror(rc));
    else if (r->status != 200) snprintf(msg, cap, "HTTP %ld: %s", r->status, r->err_body);
    else if (!r->plain && !r->sse.done)
        snprintf(msg, cap, "the stream ended before 'data: [DONE]' (after %d token chunks)", r->sse.n_tok);
    else if (!strcmp(r->sse.finish, "cancelled"))
        snprintf(msg, cap, "the server cancelled the request (finish_reason 'cancelled' after %d token chunks)",
                 r->sse.n_tok);
    else return false;
    return true;
}

/* ---- /tokenize ---- */

int bh_count_tokens(const bh_conn *conn, const char *text) {
    json_t *req = text ? json_pack("{s:s}", "content", text) : NULL;
    bh_req r = {.plain = true, .body = req ? json_dumps(req, JSON_COMPACT) : NULL};
    cli_text b = {0};
    int n = -1;
    if (r.body && bh_req_init(&r, conn, "/tokenize")) {
        curl_easy_setopt(r.h, CURLOPT_WRITEFUNCTION, cli_text_append);
        curl_easy_setopt(r.h, CURLOPT_WRITEDATA, &b);
        curl_easy_setopt(r.h, CURLOPT_TIMEOUT_MS, 10000L);
        long status = 0;
        if (curl_easy_perform(r.h) == CURLE_OK && !curl_easy_getinfo(r.h, CURLINFO_RESPONSE_CODE, &status) &&
            status == 200 && b.p) {
            json_t *doc = json_loads(b.p, 0, NULL), *toks = json_object_get(doc, "tokens");
            n = json_is_array(toks) ? (int)json_array_size(toks) : -1;
            json_decref(doc);
        }
    }
    free(b.p), json_decref(req), bh_req_free(&r);
    return n;
}

bool bh_drain_done(CURLM *m, bool (*finish)(void *ctx, void *priv, CURLcode rc), void *ctx) {
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(m, &left))) {
        if (msg->msg != CURLMSG_DONE) continue;
        void *priv = NULL;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&priv);
        if (!finish(ctx, priv, msg->data.result)) return false;
    }
    return true;
}

void bh_trim_url(char *url) {
    for (size_t n = strlen(url); n && url[n - 1] == '/'; n--) url[n - 1] = 0; /* we append "/v1/..." */
}
