/*
 * reqlog.c - the request log's two line formats (see reqlog.h). The
 * fields come from http.c, which knows the connection; this file only
 * writes them, so the formats can be tested without a server.
 */
#include "server/reqlog.h"

#include "base/json_safe.h"
#include "base/timing.h"
#include "server/http_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

bool srv_log_format_parse(const char *s, srv_log_format *out) {
    static const char *const NAMES[] = {"off", "text", "json"};
    for (int i = 0; i < 3; i++)
        if (!strcmp(s, NAMES[i])) return *out = (srv_log_format)i, true;
    return false;
}

/* "2025-01-02T03:04:05.678Z" (UTC, milliseconds). */
static void iso_time(double unix_ms, char *buf, size_t cap) {
    time_t sec = (time_t)(unix_ms / 1000);
    struct tm tm;
    gmtime_r(&sec, &tm);
    size_t n = strftime(buf, cap, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, cap - n, ".%03dZ", (int)(unix_ms - (double)sec * 1000));
}

/* Bare when it cannot be mistaken for two values or two lines. */
static bool safe_bare(const char *s) {
    if (!*s) return false;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p <= ' ' || *p == '"' || *p == '=' || *p == '\\' || *p == 0x7f) return false;
    return true;
}

/* s as a JSON string (quotes and escapes), malloc'ed. */
static char *quoted(const char *s) {
    json_t *j = json_string(s);
    if (!j) j = json_string("(not UTF-8)");
    char *q = j ? kt_json_dumps(j, JSON_ENCODE_ANY) : NULL;
    json_decref(j);
    return q;
}

static char *text_line(const srv_reqlog_entry *e, const char *when) {
    char *path = safe_bare(e->path) ? strdup(e->path) : quoted(e->path);
    char *model = e->model ? quoted(e->model) : strdup("-");
    char gen[300] = "";
    int n = 0;
    if (e->generated)
        n = snprintf(gen, sizeof gen, " prompt=%d cached=%d generated=%d ttft_ms=%.1f", e->prompt_tokens,
                     e->cached_tokens, e->generated_tokens, e->ttft_ms);
    if (e->fallback && n >= 0 && (size_t)n < sizeof gen && safe_bare(e->fallback))
        snprintf(gen + n, sizeof gen - (size_t)n, " fallback=%.32s", e->fallback);
    char *line = NULL;
    if (path && model) {
        size_t cap = strlen(path) + strlen(model) + strlen(gen) + 160;
        if ((line = malloc(cap)))
            snprintf(line, cap, "%s %s %s %d%s%s%s total_ms=%.1f\n", when, safe_bare(e->method) ? e->method : "?",
                     path, e->status, e->generated ? " model=" : "", e->generated ? model : "", gen, e->total_ms);
    }
    free(path), free(model);
    return line;
}

static char *json_line(const srv_reqlog_entry *e, const char *when) {
    json_t *j = json_pack("{s:s, s:s, s:s, s:i}", "time", when, "method", e->method, "path", e->path, "status", e->status);
    if (j && e->generated) {
        json_object_set_new(j, "model", e->model ? json_string(e->model) : json_null());
        json_object_set_new(j, "prompt_tokens", json_integer(e->prompt_tokens));
        json_object_set_new(j, "cached_tokens", json_integer(e->cached_tokens));
        json_object_set_new(j, "generated_tokens", json_integer(e->generated_tokens));
        json_object_set_new(j, "ttft_ms", e->ttft_ms >= 0 ? json_real(e->ttft_ms) : json_null());
    }
    if (j && e->fallback) json_object_set_new(j, "fallback", json_string(e->fallback));
    if (j) json_object_set_new(j, "total_ms", json_real(e->total_ms));
    char *s = j ? kt_json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6)) : NULL;
    json_decref(j);
    char *line = s ? realloc(s, strlen(s) + 2) : NULL;
    if (!line) return free(s), NULL;
    strcat(line, "\n");
    return line;
}

char *srv_reqlog_line(srv_log_format f, const srv_reqlog_entry *e) {
    char when[40];
    iso_time(e->unix_ms, when, sizeof when);
    return f == SRV_LOG_TEXT ? text_line(e, when) : f == SRV_LOG_JSON ? json_line(e, when) : NULL;
}

void srv_reqlog_write(FILE *out, srv_log_format f, const srv_reqlog_entry *e) {
    char *line = srv_reqlog_line(f, e);
    if (line) fputs(line, out);
    free(line);
}

/* ---- a connection's entry ---- */

static double unix_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* The token counts of a generation request: the engine's, or the result
 * cache's when it answered (all cached, nothing computed). */
static void add_usage(const srv_conn *c, srv_reqlog_entry *e) {
    kt_request_usage u;
    if (c->req) u = kt_request_get_usage(c->req);
    else if (c->result_hit) u = c->result.usage, u.cached_tokens = u.prompt_tokens, u.first_token_ns = 0;
    else return; /* refused before the engine saw it */
    e->generated = true;
    e->prompt_tokens = u.prompt_tokens, e->cached_tokens = u.cached_tokens, e->generated_tokens = u.completion_tokens;
    e->ttft_ms = u.first_token_ns && u.submit_ns ? (double)(u.first_token_ns - u.submit_ns) / 1e6 : -1;
    /* the request's own body: a dialect's (gen.c keeps it beside the chat body made of it) */
    e->model = json_string_value(json_object_get(c->dialect_body ? c->dialect_body : c->json, "model"));
}

/* The endpoints that generate: the chat path and the dialects over it. */
static bool generates(srv_endpoint ep) {
    return ep == EP_CHAT || ep == EP_COMPLETIONS || ep == EP_RESPONSES || ep == EP_MESSAGES;
}

void srv_reqlog_conn(const srv_conn *c) {
    srv_log_format f = c->s->cfg.log_format;
    if (f == SRV_LOG_OFF) return;
    srv_reqlog_entry e = {.unix_ms = unix_now_ms(), .method = c->method, .path = c->url,
                          .status = c->status ? c->status : 499, .total_ms = kt_time_ms() - c->t0_ms, .ttft_ms = -1,
                          .fallback = c->fallback_reason};
    if (generates(c->ep)) add_usage(c, &e);
    srv_reqlog_write(stderr, f, &e);
}
