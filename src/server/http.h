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

#include <jansson.h>
#include <stddef.h>

#include "engine/engine.h"
#include "image/image.h"
#include "kettle.h"
#include "server/fallback.h"
#include "server/reqlog.h"

/* One model served under a name: an inference class (a small fast router,
 * a bigger reasoner, ...). Requests go to the class their `model` names. */
typedef struct srv_class_config {
    const char *name;          /* its name in the API, listed first */
    const char *const *aliases; /* more names it answers to and lists */
    int n_aliases;
    kt_model *model;           /* the caller's; outlives the server */
    kt_engine *engine;         /* the server takes it over (srv_stop frees it) */
    const char *template_text; /* chat template; NULL: the model's own */
    kt_pooling embed_pooling;  /* /v1/embeddings pools so; KT_POOL_NONE: a 400 (the model cannot embed) */
    json_t *defaults;          /* request fields a request without them gets (e.g. {"temperature": 0} for a
                                * router); NULL: none. Borrowed */
    int result_cache;          /* answers of deterministic requests kept (0: off) */
    /* Loading on demand. Without `load` the class is loaded for the
     * server's life and its model stays the caller's. With it, the server
     * owns the class's model (srv_stop frees it) and may unload the class
     * (engine and model freed) after keep_alive_s seconds without a
     * request, loading it again, with `load`, for the next one. */
    kt_status (*load)(void *ctx, size_t kv_limit, kt_model **model, kt_engine **engine, kt_error *err);
    void *load_ctx;
    bool lazy;                 /* with load: not loaded yet (model and engine NULL): the first request loads it */
    int keep_alive_s;          /* with load: unloaded after this many idle seconds; < 0: never (pinned) */
    size_t load_bytes;         /* what a load takes besides the KV cache (the weights), for srv_config.mem_budget */
    size_t kv_bytes;           /* the KV budget a load asks for (an explicit kv-mb); 0: what is left */
    srv_fallback fallback;     /* its own fallback upstream (fallback.h); url NULL: the server's */
    struct kt_vision *vision;  /* its vision tower (the caller's, outlives the server; its engines were given
                                * it): chat requests may carry images; NULL: they may not */
} srv_class_config;

typedef struct srv_config {
    const char *host;          /* numeric address or name to bind; NULL: 127.0.0.1 */
    int port;                  /* 0: any free port (see srv_port) */
    const char *api_key;       /* NULL: no authentication */
    /* srv_start's one class (srv_start_classes takes its own) */
    const char *model_name;    /* the model's name in the API (the file's), first in /v1/models */
    const char *const *aliases; /* more names it answers to and lists (--alias) */
    int n_aliases;
    const char *template_text; /* chat template; NULL: the model's own */
    int result_cache;          /* answers of deterministic requests kept (0: off) */
    kt_pooling embed_pooling;  /* /v1/embeddings pools so; KT_POOL_NONE: it is a 400 (the model cannot embed) */
    /* the server's */
    bool strict_model_names;   /* a `model` naming no class is a 404 (default: with one class
                                * served, any name is that class, as clients configured for another
                                * server expect; with several, an unknown name is always a 404) */
    size_t max_body;           /* request bodies above this get 413; 0: 8 MiB (128 MiB with a vision tower) */
    kt_image_limits image_limits; /* what one image may be (max_bytes 0: kt_image_limits_default) */
    bool allow_image_urls;     /* http(s) image URLs are fetched (10 s, the byte limit, 3 redirects) */
    int http_threads;          /* MHD worker threads; <= 0: 4 */
    int http_timeout_s;        /* a request must arrive whole within this many seconds of its connection opening
                                * or the previous answer ending, and an idle connection closes after it
                                * (deadline.h); <= 0: 60 */
    int max_connections;       /* open connections at once, beyond which new ones are refused; <= 0: 4096 */
    const char *allowed_hosts; /* comma list of more Host names to answer (origin.h; "*": any); NULL: none */
    const char *cors_origins;  /* comma list of origins whose pages may call the API (origin.h; "*": any);
                                * NULL: none, only the server's own page */
    int sse_keepalive_ms;      /* a streamed reply that has sent nothing for this long gets a keep-alive: the
                                * API's own (Anthropic's ping event, an SSE comment elsewhere), so clients and
                                * proxies with an idle timeout keep a stream that waits for its first token
                                * (keepalive.c); <= 0: none (kettle serve's default is 1000) */
    srv_log_format log_format; /* one line per request on stderr (reqlog.h); 0: off */
    bool no_webui;             /* no chat page: GET / is a 404 (--no-webui) */
    size_t mem_budget;         /* what the classes' weights and KV caches may take together (srv_set_mem_budget
                                * may set it later): a load that would pass it first unloads idle classes,
                                * else is refused. 0: no accounting */
    srv_fallback fallback;     /* where refused generation requests go (fallback.h); url NULL: nowhere */
} srv_config;

typedef struct srv_server srv_server;

/* The i-th route the server answers (its path, "/v1/models/{id}" where a
 * path holds an id, and the method it takes); false past the last. The
 * chat page's files at / are not among them (--no-webui drops them).
 * `kettle serve --help` lists the endpoints from here, so it names every
 * one the server has. */
bool srv_route_at(size_t i, const char **path, const char **method);

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
/* The models are loaded: from now on the server answers everything. It
 * takes over every class's engine (srv_stop frees them), also when it
 * refuses the classes (1..SRV_MAX_CLASSES, names and aliases unique
 * across them: false with err). */
#define SRV_MAX_CLASSES 16
bool srv_ready_classes(srv_server *s, const srv_class_config *classes, int n, kt_error *err);
/* srv_ready_classes with srv_open's config's one class (model_name,
 * aliases, template_text, result_cache) and this model and engine. */
void srv_ready(srv_server *s, kt_model *model, kt_engine *engine, kt_pooling embed_pooling);
/* The memory budget (srv_config.mem_budget), before srv_ready_classes. */
void srv_set_mem_budget(srv_server *s, size_t bytes);
/* srv_open then srv_ready_classes. */
srv_server *srv_start_classes(const srv_config *cfg, const srv_class_config *classes, int n, kt_error *err);
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
