/*
 * http.h - `kettle serve`'s HTTP server: a libmicrohttpd daemon that
 * answers the OpenAI API (openai.h) from one engine (engine.h).
 *
 * A few MHD worker threads, each with its own epoll loop, serve every
 * connection; a connection waiting for tokens is suspended, not parked on
 * a thread, and the engine's notify callback resumes it. So hundreds of
 * open streams cost memory, not threads, and /health never waits behind
 * a prefill.
 */
#ifndef KT_SERVER_HTTP_H
#define KT_SERVER_HTTP_H

#include <stddef.h>

#include "engine/engine.h"
#include "kettle.h"
#include "server/reqlog.h"

typedef struct srv_config {
    const char *host;          /* numeric address or name to bind; NULL: 127.0.0.1 */
    int port;                  /* 0: any free port (see srv_port) */
    const char *api_key;       /* NULL: no authentication */
    const char *model_name;    /* the model's name in the API (the file's), first in /v1/models */
    const char *const *aliases; /* more names it answers to and lists (--alias) */
    int n_aliases;
    bool strict_model_names;   /* a `model` naming none of them is a 404 (default: with one model
                                * served, any name is this model, as clients configured for another
                                * server expect) */
    const char *template_text; /* chat template; NULL: the model's own */
    size_t max_body;           /* request bodies above this get 413; 0: 8 MiB */
    int http_threads;          /* MHD worker threads; <= 0: 4 */
    srv_log_format log_format; /* one line per request on stderr (reqlog.h); 0: off */
    int result_cache;          /* answers of deterministic requests kept (0: off) */
    kt_pooling embed_pooling;  /* /v1/embeddings pools so; KT_POOL_NONE: it is a 400 (the model cannot embed) */
    bool no_webui;             /* no chat page: GET / is a 404 (--no-webui) */
} srv_config;

typedef struct srv_server srv_server;

/* What /health reports, and so what a load balancer does with the server:
 * only a ready one gets traffic (loading and draining answer 503). */
typedef enum srv_state { SRV_LOADING, SRV_READY, SRV_DRAINING } srv_state;

/* Starts serving. The server takes over the engine (srv_stop frees it);
 * the model and the config's strings must outlive the server. */
srv_server *srv_start(kt_model *model, kt_engine *engine, const srv_config *cfg, kt_error *err);
/* Binds and answers before there is a model, so a load balancer sees a
 * replica that is up but not ready: /health is 503 {"status":"loading"},
 * /metrics answers, every other request is 503 with Retry-After until
 * srv_ready. */
srv_server *srv_open(const srv_config *cfg, kt_error *err);
/* The model is loaded: from now on the server answers everything. It
 * takes over the engine as srv_start does. */
void srv_ready(srv_server *s, kt_model *model, kt_engine *engine, kt_pooling embed_pooling);
/* Begins a drain: /health becomes 503 {"status":"draining"} (so health
 * checks take the server out), new generation requests get 503 with
 * Retry-After, and the ones running go on to their end. */
void srv_drain(srv_server *s);
srv_state srv_get_state(const srv_server *s);
/* Generation requests still being answered (streams included). */
int srv_busy(srv_server *s);
/* The port actually bound. */
int srv_port(const srv_server *s);
/* Refuses new work, frees the engine (which ends every request as
 * cancelled), lets suspended connections finish, stops the daemon and
 * frees the server. */
void srv_stop(srv_server *s);

#endif
