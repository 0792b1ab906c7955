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
#include "server/fallback.h"
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
    srv_fallback fallback;     /* where refused generation requests go (fallback.h); url NULL: nowhere */
} srv_config;

typedef struct srv_server srv_server;

/* Starts serving. The server takes over the engine (srv_stop frees it);
 * the model and the config's strings must outlive the server. */
srv_server *srv_start(kt_model *model, kt_engine *engine, const srv_config *cfg, kt_error *err);
/* Whether host:port can be bound now (a port in use, an address not of
 * this machine: false with err saying so), so `kettle serve` can say it
 * before loading a model; srv_start binds for real. */
bool srv_check_listen(const char *host, int port, kt_error *err);
/* The port actually bound. */
int srv_port(const srv_server *s);
/* Refuses new work, frees the engine (which ends every request as
 * cancelled), lets suspended connections finish, stops the daemon and
 * frees the server. */
void srv_stop(srv_server *s);

#endif
