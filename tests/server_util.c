/*
 * server_util.c - what the tests that drive `kettle serve` over HTTP share
 * (see server_util.h).
 */
#include "server_util.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/timing.h"
#include "testutil.h"

/* ---- the server process ---- */



void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The port from "kettle serve: listening on http://HOST:PORT", or 0. */
static int port_from_log(const char *path) {
    char *log = tu_read_file(path, NULL);
    const char *p = log ? strstr(log, "listening on http://") : NULL;
    const char *colon = p ? strchr(p + 20, ':') : NULL;
    int port = colon && strchr(colon, '\n') ? atoi(colon + 1) : 0;
    free(log);
    return port;
}

server start_server_model(const char *name, const char *model, const char *args) {
    server s = {0};
    snprintf(s.log, sizeof s.log, "%s", tu_tmp(name));
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "exec %s serve -m %s --port 0 -t 1 %s 2>%s >/dev/null", KT_BIN,
             model, args, s.log);
    unlink(s.log);
    s.pid = fork();
    assert_true(s.pid >= 0);
    if (s.pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 600 && !s.port; i++) { /* up to 30 s */
        int status;
        if (waitpid(s.pid, &status, WNOHANG) == s.pid) {
            char *log = tu_read_file(s.log, NULL);
            fail_msg("kettle serve exited early: %s", log ? log : "(no log)");
        }
        s.port = port_from_log(s.log);
        if (!s.port) sleep_ms(50);
    }
    if (!s.port) {
        kill(s.pid, SIGKILL), waitpid(s.pid, NULL, 0);
        fail_msg("kettle serve did not print its listening line within 30 s");
    }
    return s;
}

server start_server(const char *name, const char *args) {
    return start_server_model(name, tu_shared("models/stories260K.gguf"), args);
}

/* SIGTERM; the server must exit 0 within 10 s (else SIGKILL and fail). */
void stop_server(server *s) {
    if (s->pid <= 0) return;
    kill(s->pid, SIGTERM);
    int status = 0;
    pid_t r = 0;
    for (int i = 0; i < 200 && (r = waitpid(s->pid, &status, WNOHANG)) == 0; i++) sleep_ms(50);
    if (r == 0) {
        kill(s->pid, SIGKILL), waitpid(s->pid, NULL, 0);
        s->pid = 0;
        fail_msg("kettle serve did not stop within 10 s of SIGTERM");
    }
    s->pid = 0;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        char *log = tu_read_file(s->log, NULL);
        fail_msg("kettle serve exited with status %d: %s", status, log ? log : "");
    }
}

/* ---- HTTP ---- */



size_t on_body(char *data, size_t size, size_t n, void *ctx) {
    reply *r = ctx;
    size_t add = size * n;
    if (!r->t_first_ms) r->t_first_ms = kt_time_ms();
    char *b = realloc(r->body, r->len + add + 1);
    if (!b) return 0;
    memcpy(b + r->len, data, add);
    r->body = b, r->len += add, r->body[r->len] = 0;
    return r->abort_after && r->len >= r->abort_after ? 0 : add;
}

/* A header line's value into out when it is `name:`. */
static void take_header(const char *data, size_t n, const char *name, char *out, size_t cap) {
    size_t k = strlen(name);
    if (n > k + 2 && !strncasecmp(data, name, k) && data[k] == ':')
        snprintf(out, cap, "%.*s", (int)strcspn(data + k + 2, "\r\n"), data + k + 2);
}

size_t on_header(char *data, size_t size, size_t n, void *ctx) {
    reply *r = ctx;
    take_header(data, size * n, "x-kettle-served-by", r->served_by, sizeof r->served_by);
    take_header(data, size * n, "x-kettle-warning", r->warning, sizeof r->warning);
    take_header(data, size * n, "x-kettle-fallback-reason", r->fallback_reason, sizeof r->fallback_reason);
    take_header(data, size * n, "Content-Type", r->content_type, sizeof r->content_type);
    if (size * n >= 19 && !strncasecmp(data, "x-kettle-cache: hit", 19)) r->cache_hit = true;
    if (size * n > 13 && !strncasecmp(data, "Retry-After: ", 13))
        snprintf(r->retry_after, sizeof r->retry_after, "%.*s", (int)strcspn(data + 13, "\r\n"), data + 13);
    return size * n;
}

CURL *make_easy(const server *s, const char *method, const char *path, const char *body, size_t body_len,
                       struct curl_slist *headers, reply *r) {
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", s->port, path);
    CURL *c = curl_easy_init();
    assert_non_null(c);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
    }
    return c;
}

reply http_full(const server *s, const char *method, const char *path, const char *body, size_t body_len,
                       const char *header) {
    reply r = {0};
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    if (header) h = curl_slist_append(h, header);
    CURL *c = make_easy(s, method, path, body, body_len, h, &r);
    CURLcode rc = curl_easy_perform(c);
    r.t_end_ms = kt_time_ms();
    if (rc != CURLE_OK) fail_msg("%s %s: %s", method, path, curl_easy_strerror(rc));
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
    curl_easy_cleanup(c);
    curl_slist_free_all(h);
    if (!r.body) r.body = calloc(1, 1);
    return r;
}

reply post(const server *s, const char *path, const char *body) {
    return http_full(s, "POST", path, body, strlen(body), NULL);
}

reply get(const server *s, const char *path) {
    return http_full(s, "GET", path, NULL, 0, NULL);
}

json_t *parse(const char *text) {
    json_error_t e;
    json_t *j = json_loads(text, 0, &e);
    if (!j) fail_msg("not JSON (%s): %s", e.text, text);
    return j;
}

/* POSTs, expects 200 and returns the parsed body. */
json_t *post_ok(const server *s, const char *path, const char *body) {
    reply r = post(s, path, body);
    if (r.status != 200) fail_msg("POST %s %s: %ld %s", path, body, r.status, r.body);
    json_t *j = parse(r.body);
    free(r.body);
    return j;
}

void expect_error(const server *s, const char *path, const char *body, long status, const char *msg) {
    reply r = post(s, path, body);
    json_t *j = parse(r.body);
    const char *m = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
    if (r.status != status || !m || !strstr(m, msg))
        fail_msg("POST %s %.200s: %ld %s (want %ld, '%s')", path, body, r.status, r.body, status, msg);
    json_decref(j);
    free(r.body);
}

/* The SSE events of a stream body, each parsed; "[DONE]" must end it. */
json_t *sse_events(const char *body) {
    json_t *events = json_array();
    const char *p = body;
    bool done = false;
    while ((p = strstr(p, "data: "))) {
        p += 6;
        const char *end = strstr(p, "\n\n");
        assert_non_null(end);
        assert_false(done); /* nothing after [DONE] */
        if (!strncmp(p, "[DONE]", 6)) done = true;
        else {
            char *one = strndup(p, (size_t)(end - p));
            json_array_append_new(events, parse(one));
            free(one);
        }
        p = end + 2;
    }
    assert_true(done);
    return events;
}

const char *jstr(json_t *o, const char *path0, const char *path1) {
    json_t *v = json_object_get(o, path0);
    if (path1) v = json_object_get(v, path1);
    return json_string_value(v);
}

