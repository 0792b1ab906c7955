/*
 * http_internal.h - what http.c (daemon, routing, simple endpoints) and
 * gen.c (generation requests: submit, suspend/resume, streaming) share.
 * Not part of the server's interface (http.h).
 */
#ifndef KT_SERVER_HTTP_INTERNAL_H
#define KT_SERVER_HTTP_INTERNAL_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdbool.h>

#include "server/deadline.h"
#include "server/dialect.h"
#include "server/http.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "server/origin.h"
#include "server/results.h"

/* The engine's way back to a connection. The engine thread calls
 * link_notify(link) when a request has news; if the connection is
 * suspended it is resumed, otherwise `notified` tells it not to suspend.
 * Links are pooled and freed only after the engine is gone, so a late
 * notify can never touch freed memory (at worst it wakes a connection that
 * then finds nothing new and suspends again). */
typedef struct srv_link {
    struct srv_server *s;
    struct MHD_Connection *mc; /* NULL while in the free pool */
    int fd;                    /* mc's socket, for srv_link_client_gone; -1 */
    bool suspended, notified;
    /* --sse-keepalive-ms (keepalive.c): a suspended stream's quiet_since_ms
     * is when its last bytes went to MHD (kt_time_ms; 0: not a stream, no
     * keep-alive); keepalive_due: the keep-alive thread resumed it, so the
     * stream sends a keep-alive if it has nothing else */
    double quiet_since_ms;
    bool keepalive_due;
    struct srv_link *next_free, *next_all;
    struct srv_link *next_waiting; /* in a class's list of requests waiting for its load */
} srv_link;

typedef enum srv_endpoint {
    EP_HEALTH, EP_MODELS, EP_MODEL, EP_METRICS, EP_TOKENIZE, EP_DETOKENIZE, EP_CHAT, EP_COMPLETIONS,
    EP_RESPONSES, EP_RESPONSE_ID, EP_MESSAGES, EP_COUNT_TOKENS, EP_EMBEDDINGS, EP_WEBUI, EP_OTHER
} srv_endpoint;

typedef enum srv_class_state { CLASS_READY, CLASS_UNLOADED, CLASS_LOADING } srv_class_state;

/* A class being served (classes.c). Under the server's engine_mu: state,
 * model, engine, users, last_used_ms, waiters, error, load_gen. A request
 * holds the class (users) from srv_route to its end, so a class with users
 * is never unloaded; model and engine do not change while it is READY
 * and held. */
typedef struct srv_class {
    struct srv_server *s;
    srv_class_config cfg;
    srv_class_state state;
    kt_model *model;        /* NULL unless READY */
    kt_engine *engine;      /* NULL unless READY, and once srv_stop began */
    int users;              /* requests holding it */
    double last_used_ms;    /* when the last request let go */
    srv_link *waiters;      /* requests waiting for the load under way */
    unsigned load_gen;      /* loads begun: a waiter whose load ended without READY failed */
    char error[512];        /* why the last load failed (a kt_error message) */
    size_t mem_bytes;       /* what it holds of the server's mem_budget */
    pthread_t loader;
    bool loader_joinable;
    struct srv_sampled *sampled; /* recent replies' sampled ids (sampled.h): token ids are the class's */
    struct srv_fb_state *fallback; /* its own fallback upstream, or NULL: the server's */
    srv_results *results;   /* its result cache (results.h), or NULL */
    srv_vision_env vis;     /* its vision tower (cfg.vision) and the server's image limits */
} srv_class;

struct srv_server {
    srv_class classes[SRV_MAX_CLASSES]; /* set before state becomes SRV_READY */
    int n_classes;
    pthread_mutex_t load_mu; /* one load or unload at a time (the memory they change) */
    size_t mem_budget, mem_used; /* under load_mu (srv_config.mem_budget) */
    pthread_t keeper;       /* unloads idle classes (classes.c) */
    bool keeper_joinable;
    pthread_cond_t keeper_cv;
    bool stopping;          /* under engine_mu: srv_stop began */
    int state;              /* srv_state (atomic): the classes are set before it becomes SRV_READY */
    srv_config cfg;
    bool max_body_default;  /* cfg.max_body was not given: a class with a vision tower raises it */
    struct MHD_Daemon *daemon;
    int port;
    long long started;      /* unix time, for /v1/models */
    pthread_mutex_t engine_mu; /* guards `engine` against srv_stop */
    pthread_mutex_t link_mu;   /* guards every link and the pools */
    srv_link *free_links, *all_links;
    int n_links_used;       /* generation requests still being answered */
    bool shutting;          /* under link_mu: no more suspending */
    /* the keep-alive thread (keepalive.c), started when cfg.sse_keepalive_ms > 0; it waits on keepalive_cv
     * with link_mu; under link_mu: keepalive_wake_ms (when it wakes next, kt_time_ms; 0: when signalled),
     * keepalive_stop */
    pthread_t keepalive;
    bool keepalive_joinable, keepalive_stop;
    pthread_cond_t keepalive_cv;
    double keepalive_wake_ms;
    srv_metrics metrics;
    struct srv_fb_state *fallback; /* the fallback upstream (fallback.c), or NULL */
    unsigned long long n_requests; /* for ids and default seeds (atomic) */
    srv_origin_rules origin_rules; /* which Host names and page origins may drive the API (origin.h) */
    srv_deadlines *deadlines;      /* slow clients cut (deadline.h) */
};

typedef struct srv_conn {
    srv_server *s;
    struct MHD_Connection *mc;
    srv_endpoint ep;
    srv_class *cls;         /* the class the request's model names (srv_route), held until the request ends */
    unsigned load_gen;      /* waiting for its class's load: the load it waits for */
    bool waiting_class;     /* suspended until its class is loaded */
    srv_kind kind;          /* what srv_gen_start was asked for */
    const srv_dialect *dialect; /* /v1/responses, /v1/messages: how the body and the answer are translated;
                                 * NULL: OpenAI's chat / completions */
    int route_status;       /* 0, or 404 / 405 decided from the URL */
    char url[160], method[16]; /* for messages (cut) */
    double t0_ms;           /* kt_time_ms when the headers came: the log's total_ms */
    srv_buf body;
    bool too_big;
    const char *cors_origin; /* a --cors-origin page's Origin (MHD's copy): answers carry CORS headers; NULL: none */
    int status;             /* the status queued, for /metrics */
    /* generation requests (gen.c) */
    json_t *json;           /* the chat body (a dialect's, translated) */
    json_t *dialect_body;   /* a dialect's own body, or NULL */
    struct srv_xlate *xlate; /* a dialect stream's translation state */
    int n_prompt;           /* the prompt's tokens */
    struct srv_embed *embed; /* /v1/embeddings (embed.c), or NULL */
    srv_gen_req gen;
    srv_notes notes;        /* what was left out of the request: the x-kettle-warning header */
    bool have_gen, have_reply, started, stream_done;
    bool stream_failed;     /* out of memory: the stream ends with an error */
    size_t tail_pos;        /* how much of that ending has been sent */
    kt_request *req;
    srv_link *link;
    srv_reply reply;
    srv_buf out;            /* stream bytes not yet handed to MHD */
    size_t out_pos;
    double quiet_since_ms;  /* a stream: when it last handed bytes to MHD (kt_time_ms), for the keep-alive */
    bool out_fresh;         /* bytes went to MHD since quiet_since_ms was last set */
    /* --result-cache */
    bool result_cacheable;  /* store the answer when it is done */
    bool result_hit;        /* answered from `result` */
    srv_result_key result_key;
    srv_result result;
    /* forwarded to the fallback upstream (fallback.c) */
    struct srv_fwd *fwd;    /* the transfer, or NULL */
    const char *fallback_reason; /* why (a static name), or NULL */
} srv_conn;

/* http.c */
/* The CORS headers of an answer to a --cors-origin page (none otherwise). */
void srv_add_cors_headers(const srv_conn *c, struct MHD_Response *r);
enum MHD_Result srv_respond(srv_conn *c, int status, const char *content_type, char *body, size_t len);
enum MHD_Result srv_respond_json(srv_conn *c, int status, json_t *j);
enum MHD_Result srv_respond_error(srv_conn *c, const srv_error *e);
/* classes.c */
/* The class body's "model" names (absent: the first class); NULL with e
 * filled (a 404 listing what is served, a 400 for a model that is not a
 * string). With one class and no --strict-model-names, any name is it. */
srv_class *srv_route(srv_server *s, json_t *body, srv_error *e);
/* Whether the request's class is loaded now; else (its load begun) a 503 saying it loads. */
bool srv_loaded_now(srv_conn *c, srv_error *e);
/* Lets go of the request's class (the last one out starts its idle time). */
void srv_class_release(srv_conn *c);
/* Whether the request's class is loaded: READY; WAIT after starting its
 * load if needed and, with a link, queueing the connection to be woken
 * when the load ends (srv_link_arm it before); FAILED with e filled (the
 * load failed, or there is no memory for it). */
typedef enum srv_class_wait { CLASS_GO, CLASS_WAIT, CLASS_FAILED } srv_class_wait;
srv_class_wait srv_class_ready(srv_conn *c, srv_link *link, srv_error *e);
/* Starts the thread that unloads idle classes (when any may be), and
 * stops it and any load under way (srv_stop). */
bool srv_classes_start(srv_server *s);
void srv_classes_stop(srv_server *s);
/* What the request parser needs of a class's model. */
srv_model_info srv_class_info(const srv_class *k);
/* The name a reply gives its model: the one the request used, when it is
 * one of the class's names; else the class's. */
const char *srv_reply_name(const srv_class *k, json_t *body);
/* Adds the class's default fields a chat body lacks; false if out of memory. */
bool srv_class_defaults(const srv_class *k, json_t *chat);
/* GET /v1/models and /v1/models/{id}. */
json_t *srv_models_json(const srv_server *s);
json_t *srv_model_json(const srv_server *s, const char *id, srv_error *e);
/* The body parsed as JSON, or NULL with e filled (400, saying where). */
json_t *srv_parse_body(srv_conn *c, srv_error *e);

/* gen.c */
enum MHD_Result srv_gen_start(srv_conn *c, srv_kind kind);
enum MHD_Result srv_gen_continue(srv_conn *c);
/* Waits (suspended) until the request's class is loaded, then calls go;
 * a load that fails is answered with its error. Called again on resume. */
enum MHD_Result srv_class_gate(srv_conn *c, enum MHD_Result (*go)(srv_conn *c));
/* embed.c: POST /v1/embeddings, first call and resumes; release frees its requests. */
typedef struct srv_embed srv_embed;
enum MHD_Result srv_embed_start(srv_conn *c);
enum MHD_Result srv_embed_continue(srv_conn *c);
void srv_embed_release(srv_conn *c);
/* POST /v1/messages/count_tokens: the prompt's token count, nothing generated. */
enum MHD_Result srv_count_tokens(srv_conn *c);
void srv_gen_release(srv_conn *c);
void srv_link_notify(void *link);
/* A link for the connection's requests (NULL: out of memory); back to the
 * pool with srv_link_release. */
srv_link *srv_link_acquire(srv_server *s, struct MHD_Connection *mc);
void srv_link_release(srv_link *l);
/* Before reading a request's events: forget earlier news. True when the
 * keep-alive thread resumed the connection (and no more): a stream with
 * nothing to send sends a keep-alive. */
bool srv_link_arm(srv_link *l);
typedef enum srv_wait { WAIT_SUSPENDED, WAIT_RETRY, WAIT_SHUTDOWN } srv_wait;
/* Suspends the connection unless news came since srv_link_arm: RETRY
 * (read again), or SHUTDOWN (the server is stopping). */
srv_wait srv_link_suspend(srv_link *l);
/* The same for a stream whose last bytes went to MHD at quiet_since_ms
 * (kt_time_ms): the keep-alive thread resumes it once it has been quiet
 * for --sse-keepalive-ms. */
srv_wait srv_link_suspend_stream(srv_link *l, double quiet_since_ms);
/* True when the link's client has closed or reset its connection. */
bool srv_link_client_gone(void *link);
/* At shutdown: resumes every suspended connection (under link_mu). */
void srv_links_wake_all(srv_server *s);
/* True when no generation request is being answered any more. */
bool srv_links_idle(srv_server *s);
void srv_links_free(srv_server *s);
/* keepalive.c: the thread that resumes quiet streams for their keep-alive.
 * srv_keepalive_init before any link is used (false: the thread could not
 * start); srv_keepalive_stop joins it, before MHD_stop_daemon (it resumes
 * connections); srv_keepalive_destroy after. */
bool srv_keepalive_init(srv_server *s);
void srv_keepalive_stop(srv_server *s);
void srv_keepalive_destroy(srv_server *s);

/* fallback.c: the fallback upstream (fallback.h) */
typedef struct srv_fb_state srv_fb_state;
/* Checks the settings, reads the key from its environment variable and
 * starts the upstream thread; NULL with err filled. */
srv_fb_state *srv_fb_state_new(const srv_fallback *cfg, kt_error *err);
void srv_fb_state_free(srv_fb_state *fb);
/* Where gen.c would answer the error e: forwards the request when e is a
 * trigger that applies, else answers e. */
enum MHD_Result srv_fallback_or_error(srv_conn *c, const srv_error *e);
/* A forwarded request's next call (after a resume), until it is answered. */
enum MHD_Result srv_fallback_continue(srv_conn *c);
/* Cancels a running transfer; before srv_gen_release (which frees the link). */
void srv_fallback_release(srv_conn *c);

#endif
