/*
 * reqlog.h - `kettle serve`'s request log: one line per finished request
 * on stderr, as text or as JSON (--log-format), written from http.c when
 * libmicrohttpd says a request is complete, so every request is logged,
 * whatever endpoint answered it and however it ended.
 *
 * text:  2025-01-02T03:04:05.678Z POST /v1/chat/completions 200 model="m" prompt=12 cached=0 generated=20 ttft_ms=35 total_ms=120
 * json:  {"time": "...", "method": "POST", "path": "...", "status": 200, "model": "m", "prompt_tokens": 12,
 *         "cached_tokens": 0, "generated_tokens": 20, "ttft_ms": 35.1, "total_ms": 120.4}
 *
 * A request forwarded to the fallback upstream has fallback=REASON
 * (json: "fallback": "REASON") before total_ms.
 *
 * Requests that generate nothing (/health, /v1/models, a 4xx refused
 * before the engine) carry only time, method, path, status and total_ms.
 * A text value with spaces, quotes or control characters is written as a
 * JSON string, so one request is always one line.
 */
#ifndef KT_SERVER_REQLOG_H
#define KT_SERVER_REQLOG_H

#include <stdbool.h>
#include <stdio.h>

typedef enum srv_log_format { SRV_LOG_OFF = 0, SRV_LOG_TEXT, SRV_LOG_JSON } srv_log_format;

/* "off", "text" or "json" -> *out; false for anything else. */
bool srv_log_format_parse(const char *s, srv_log_format *out);

typedef struct srv_reqlog_entry {
    double unix_ms;             /* when the request ended */
    const char *method, *path;
    int status;                 /* 499: the client left before an answer */
    double total_ms;            /* headers in -> request complete */
    bool generated;             /* a generation request: the fields below are set */
    const char *model;          /* the request's "model"; NULL: it named none */
    int prompt_tokens, cached_tokens, generated_tokens;
    double ttft_ms;             /* submit -> first token; < 0: none came */
    const char *fallback;       /* forwarded to the fallback upstream: why ("context", ...); NULL: not */
} srv_reqlog_entry;

/* The entry as one line ending in '\n', malloc'ed; NULL if out of memory
 * or the format is SRV_LOG_OFF. */
char *srv_reqlog_line(srv_log_format f, const srv_reqlog_entry *e);
/* Writes the line to `out` in one call (lines of concurrent requests do
 * not interleave); nothing for SRV_LOG_OFF. */
void srv_reqlog_write(FILE *out, srv_log_format f, const srv_reqlog_entry *e);

/* The entry of a finished connection (http_internal.h), written to stderr
 * in the server's --log-format; called by http.c before the connection's
 * request is released. */
struct srv_conn;
void srv_reqlog_conn(const struct srv_conn *c);

#endif
