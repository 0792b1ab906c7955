/*
 * server_util.h - `kettle serve` as a child process for tests, and HTTP
 * helpers over libcurl: each server is stopped with SIGTERM and must exit
 * 0 within 10 s (else it is killed and the test fails), so no server
 * outlives its test and a hung server fails rather than hangs.
 */
#ifndef KT_TESTS_SERVER_UTIL_H
#define KT_TESTS_SERVER_UTIL_H

#include <curl/curl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

typedef struct server {
    pid_t pid;
    int port;
    char log[512];
} server;

typedef struct reply {
    long status;
    char *body;
    size_t len;
    char retry_after[16];
    char served_by[32], fallback_reason[32]; /* x-kettle-served-by, x-kettle-fallback-reason ("": none) */
    char content_type[64];
    char warning[1024];  /* x-kettle-warning: what the server left out ("": nothing) */
    double t_first_ms;  /* when the first body byte came (kt_time_ms) */
    double t_end_ms;    /* when the transfer ended (set by whoever performed it) */
    bool cache_hit;     /* x-kettle-cache: hit */
    size_t abort_after; /* > 0: drop the connection after this many bytes */
} reply;

void sleep_ms(int ms);
/* `kettle serve -m MODEL --port 0 -t 1 ARGS`, its log at tu_tmp(name);
 * returns once it listens (fails the test after 30 s). */
server start_server_model(const char *name, const char *model, const char *args);
/* The same on shared/models/stories260K.gguf. */
server start_server(const char *name, const char *args);
void stop_server(server *s);

CURL *make_easy(const server *s, const char *method, const char *path, const char *body, size_t body_len,
                struct curl_slist *headers, reply *r);
reply http_full(const server *s, const char *method, const char *path, const char *body, size_t body_len,
                const char *header);
reply post(const server *s, const char *path, const char *body);
reply get(const server *s, const char *path);
json_t *parse(const char *text);
/* POSTs, expects 200 and returns the parsed body. */
json_t *post_ok(const server *s, const char *path, const char *body);
/* POSTs, expects `status` and an error message containing msg. */
void expect_error(const server *s, const char *path, const char *body, long status, const char *msg);
/* The SSE events of a stream body, each parsed; "[DONE]" must end it. */
json_t *sse_events(const char *body);
const char *jstr(json_t *o, const char *path0, const char *path1);

#endif
