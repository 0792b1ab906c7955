/*
 * upstream.h - HTTP transfers to a fallback upstream (fallback.h), run by
 * libcurl's multi interface on ONE thread of their own, so that no MHD
 * worker ever blocks on another server.
 *
 * A transfer (srv_fwd) is started from an MHD thread and then shared: the
 * upstream thread writes what comes back (status, headers, body bytes)
 * into it and calls the request's notify callback after every change; the
 * connection reads it (srv_fwd_peek, srv_fwd_read) and suspends between
 * notifications, as gen.c does with the engine. Nothing here knows about
 * MHD: notify and client_gone are the connection's srv_link functions.
 *
 * Bounds: a connect timeout, a first-byte timeout (until the upstream's
 * response headers), an overall cap, a cap on a gathered body; a stream
 * whose client reads slowly is paused (never buffered without bound).
 * Only a refused connection is retried, once: nothing was sent, so the
 * POST cannot have been executed upstream.
 */
#ifndef KT_SERVER_UPSTREAM_H
#define KT_SERVER_UPSTREAM_H

#include <stdbool.h>
#include <stddef.h>

#include "kettle.h"

typedef struct srv_upstream srv_upstream;
typedef struct srv_fwd srv_fwd;

/* Starts the thread (and curl_global_init). NULL with err filled. */
srv_upstream *srv_upstream_new(kt_error *err);
/* Ends every transfer (each ends as cancelled and notifies), joins the
 * thread. Transfers not yet released stay valid until srv_fwd_release. */
void srv_upstream_free(srv_upstream *u);

typedef struct srv_fwd_request {
    const char *url;                 /* the whole URL to POST to */
    const char *body;                /* copied */
    size_t body_len;
    const char *const *headers;      /* "Name: value" lines, copied (may hold a key: never logged) */
    int n_headers;
    int connect_ms, first_byte_ms, total_ms; /* > 0 */
    void (*notify)(void *ctx);       /* after every change; called with the transfer's lock held */
    bool (*client_gone)(void *ctx);  /* polled: true cancels the transfer */
    void *ctx;
} srv_fwd_request;

/* How a transfer failed. */
typedef enum srv_fwd_failure {
    FWD_OK = 0,
    FWD_CONNECT,   /* the upstream could not be reached (nothing answered) */
    FWD_BROKEN,    /* the connection failed after the request went out */
    FWD_TIMEOUT,   /* connect, first byte or the overall cap */
    FWD_TOO_BIG,   /* a gathered answer over the cap */
    FWD_CANCELLED, /* the client left, or the server is stopping */
} srv_fwd_failure;

/* What has come back so far. */
typedef struct srv_fwd_view {
    int status;              /* the upstream's HTTP status once its headers are in, else 0 */
    bool streaming;          /* a 2xx text/event-stream: pass it through as it comes */
    char content_type[128];
    char retry_after[32];    /* the upstream's Retry-After, or "" */
    bool done;               /* the transfer ended; failure says how */
    srv_fwd_failure failure;
    char error[256];         /* what failed, for the client (names no key) */
    size_t available;        /* body bytes not yet read */
} srv_fwd_view;

/* Queues a transfer; NULL when out of memory or stopping. The caller owns
 * one reference (srv_fwd_release). */
srv_fwd *srv_fwd_start(srv_upstream *u, const srv_fwd_request *rq);
void srv_fwd_peek(srv_fwd *f, srv_fwd_view *v);
/* Takes up to max body bytes; 0 when none are ready. */
size_t srv_fwd_read(srv_fwd *f, char *buf, size_t max);
/* The connection is done with it: a running transfer is cancelled, no
 * notify comes after this returns. */
void srv_fwd_release(srv_fwd *f);

#endif
