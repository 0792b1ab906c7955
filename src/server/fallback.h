/*
 * fallback.h - a fallback upstream: another OpenAI-compatible server that
 * gets a generation request kettle would otherwise refuse for its own
 * reasons (the prompt does not fit the context, the queue is full, the
 * model is unknown, the engine failed), never one refused for the
 * request's own fault (malformed JSON, a bad parameter: it would fail
 * there too).
 *
 * The request goes as it came (the client's JSON, `model` replaced when
 * configured) to the same path under the upstream's base URL; the answer
 * comes back as the upstream gave it, streams chunk by chunk, marked
 * x-kettle-served-by: fallback and x-kettle-fallback-reason: REASON.
 * The forwarding itself is fallback.c (the HTTP side) and upstream.c
 * (the libcurl thread).
 *
 * srv_fallback is one upstream's settings: the server holds one today
 * (srv_config.fallback); each model class will hold its own.
 */
#ifndef KT_SERVER_FALLBACK_H
#define KT_SERVER_FALLBACK_H

#include <stdbool.h>
#include <stddef.h>

#include "server/openai.h"

/* Why a request was forwarded (the --fallback-on names). */
typedef enum srv_fb_reason {
    SRV_FB_NONE = -1, /* not a trigger: kettle answers its own error */
    SRV_FB_CONTEXT = 0,
    SRV_FB_BUSY,
    SRV_FB_UNKNOWN_MODEL,
    SRV_FB_ERROR,
    SRV_FB_N_REASONS
} srv_fb_reason;

/* How a forwarded request failed (kettle_fallback_failures_total). */
typedef enum srv_fb_failure {
    SRV_FB_FAIL_CONNECT = 0, /* the upstream could not be reached, or its connection broke */
    SRV_FB_FAIL_TIMEOUT,     /* connect, first byte or the overall cap */
    SRV_FB_FAIL_STATUS,      /* the upstream answered an error status (passed on) */
    SRV_FB_N_FAILURES
} srv_fb_failure;

#define SRV_FB_DEFAULT_KEY_ENV "KETTLE_FALLBACK_API_KEY"
#define SRV_FB_DEFAULT_TIMEOUT_S 10
#define SRV_FB_DEFAULT_MAX_S 600
#define SRV_FB_ALL ((1u << SRV_FB_N_REASONS) - 1)

typedef struct srv_fallback {
    const char *url;     /* the upstream's base URL, as OpenAI clients take it (http://host:port/v1); NULL: none */
    const char *key_env; /* the environment variable holding its API key; NULL: SRV_FB_DEFAULT_KEY_ENV. The key
                          * is read from it when the server starts, sent as a Bearer token, never logged */
    unsigned triggers;   /* 1u << srv_fb_reason for each that forwards; 0: all */
    const char *model;   /* the `model` sent upstream; NULL: the request's own */
    int timeout_s;       /* connect, and a stream's first byte; <= 0: SRV_FB_DEFAULT_TIMEOUT_S */
    int max_s;           /* the whole transfer (and a whole answer's first byte); <= 0: SRV_FB_DEFAULT_MAX_S */
} srv_fallback;

/* "context", "busy", "unknown-model", "error". */
const char *srv_fb_reason_name(srv_fb_reason r);
/* "connect", "timeout", "status". */
const char *srv_fb_failure_name(srv_fb_failure f);
/* A comma list of reason names -> a trigger set; false with msg naming
 * the item that is none. */
bool srv_fb_parse_triggers(const char *list, unsigned *out, char *msg, size_t cap);
/* Whether url can be an upstream: http or https, a host, no user or
 * password in it (a key belongs in the environment), no query; false
 * with msg saying what is wrong. */
bool srv_fb_check_url(const char *url, char *msg, size_t cap);
/* Whether name can be an environment variable's ([A-Za-z_][A-Za-z0-9_]*). */
bool srv_fb_check_env_name(const char *name);
/* The trigger an error answer is, or SRV_FB_NONE for one that is the
 * request's own fault. */
srv_fb_reason srv_fb_reason_of(const srv_error *e);

#endif
