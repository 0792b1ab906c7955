/*
 * http.c - the libmicrohttpd daemon of `kettle serve` (see http.h):
 * binding, routing, body limits, API-key checks, the small endpoints
 * (/health, /v1/models, /metrics, /tokenize, /detokenize) and the JSON /
 * error responses every endpoint uses. Generation requests go to gen.c,
 * the chat page (GET /) to webui.c.
 *
 * MHD runs its own worker threads (a small pool, epoll each) and calls
 * on_request once when the headers are in, once per piece of body, then
 * once more when the body is complete: that last call answers. Errors are
 * decided from the whole request, except a Content-Length over the limit,
 * which is answered 413 at once without reading the body.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/timing.h"
#include "base/error.h"
#include "base/json_safe.h"
#include "server/http_internal.h"
#include "server/image_memo.h"
#include "server/reqlog.h"
#include "server/sampled.h"
#include "server/webui.h"

#define DEFAULT_MAX_BODY (8u << 20)
#define DEFAULT_MAX_BODY_IMAGES (128u << 20) /* a model that takes images */
#define DEFAULT_HTTP_TIMEOUT_S 60
#define DEFAULT_MAX_CONNECTIONS 4096

/* ---- routing ---- */

typedef struct route {
    const char *path, *method;
    srv_endpoint ep;
} route;

/* Exact paths; the order is the one `kettle serve --help` lists them in
 * (srv_route_at), matching does not depend on it. */
static const route ROUTES[] = {
    {"/v1/chat/completions", "POST", EP_CHAT},
    {"/v1/completions", "POST", EP_COMPLETIONS},
    {"/v1/responses", "POST", EP_RESPONSES},
    {"/v1/messages", "POST", EP_MESSAGES},
    {"/v1/messages/count_tokens", "POST", EP_COUNT_TOKENS},
    {"/v1/embeddings", "POST", EP_EMBEDDINGS},
    {"/tokenize", "POST", EP_TOKENIZE},
    {"/detokenize", "POST", EP_DETOKENIZE},
    {"/v1/models", "GET", EP_MODELS},
    {"/health", "GET", EP_HEALTH},
    {"/metrics", "GET", EP_METRICS},
};

/* The paths route_of matches by prefix (MODEL_PREFIX, RESPONSE_PREFIX), as
 * the help names them. */
static const route PREFIX_ROUTES[] = {
    {"/v1/models/{id}", "GET", EP_MODEL},
    {"/v1/responses/{id}", "GET", EP_RESPONSE_ID},
};

bool srv_route_at(size_t i, const char **path, const char **method) {
    const size_t n = sizeof ROUTES / sizeof ROUTES[0], n_prefix = sizeof PREFIX_ROUTES / sizeof PREFIX_ROUTES[0];
    if (i >= n + n_prefix) return false;
    const route *r = i < n ? &ROUTES[i] : &PREFIX_ROUTES[i - n];
    *path = r->path, *method = r->method;
    return true;
}

static const char *endpoint_name(srv_endpoint ep) {
    static const char *const NAMES[] = {"health",      "models",     "model",    "metrics",      "tokenize",
                                        "detokenize",  "chat_completions", "completions", "responses",
                                        "response_id", "messages",   "count_tokens", "embeddings", "webui", "other"};
    return NAMES[ep];
}

#define MODEL_PREFIX "/v1/models/" /* GET /v1/models/{id}: the id may hold '/' (OWNER/REPO) */
#define RESPONSE_PREFIX "/v1/responses/" /* GET /v1/responses/{id}: nothing is stored, a 404 saying so */

/* The endpoint for url+method; *status 404 (no such path) or 405. */
static srv_endpoint route_of(const srv_server *s, const char *url, const char *method, int *status) {
    if (!s->cfg.no_webui && srv_webui_find(url)) { /* the chat page's files */
        *status = strcmp(method, "GET") && strcmp(method, "HEAD") ? 405 : 0;
        return EP_WEBUI;
    }
    if (!strncmp(url, MODEL_PREFIX, strlen(MODEL_PREFIX)) && url[strlen(MODEL_PREFIX)]) {
        *status = strcmp(method, "GET") ? 405 : 0;
        return EP_MODEL;
    }
    if (!strncmp(url, RESPONSE_PREFIX, strlen(RESPONSE_PREFIX)) && url[strlen(RESPONSE_PREFIX)]) {
        *status = 0;
        return EP_RESPONSE_ID;
    }
    for (size_t i = 0; i < sizeof ROUTES / sizeof ROUTES[0]; i++) {
        if (strcmp(url, ROUTES[i].path)) continue;
        *status = strcmp(method, ROUTES[i].method) ? 405 : 0;
        return ROUTES[i].ep;
    }
    *status = 404;
    return EP_OTHER;
}

/* ---- responses ---- */

/* What a page may read of an answer besides the simple headers. */
#define CORS_EXPOSED "x-kettle-cache, x-kettle-served-by, x-kettle-fallback-reason, Retry-After"

void srv_add_cors_headers(const srv_conn *c, struct MHD_Response *r) {
    if (!c->cors_origin) return;
    MHD_add_response_header(r, "Access-Control-Allow-Origin", c->cors_origin);
    MHD_add_response_header(r, "Access-Control-Expose-Headers", CORS_EXPOSED);
    MHD_add_response_header(r, "Vary", "Origin");
}

enum MHD_Result srv_respond(srv_conn *c, int status, const char *content_type, char *body, size_t len) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    if (status == 503) MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    if (status == 401) MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (c->result_hit) MHD_add_response_header(r, "x-kettle-cache", "hit");
    if (c->notes.len) MHD_add_response_header(r, "x-kettle-warning", c->notes.text);
    srv_add_cors_headers(c, r);
    if (status == 405 && c->ep == EP_WEBUI) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    if (status == 405)
        for (size_t i = 0; i < sizeof ROUTES / sizeof ROUTES[0]; i++)
            if (ROUTES[i].ep == c->ep) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, ROUTES[i].method);
    enum MHD_Result q = MHD_queue_response(c->mc, (unsigned)status, r);
    MHD_destroy_response(r);
    c->status = status;
    return q;
}

enum MHD_Result srv_respond_json(srv_conn *c, int status, json_t *j) {
    char *s = j ? kt_json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s) {
        srv_error e;
        srv_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
        return srv_respond_error(c, &e);
    }
    return srv_respond(c, status, "application/json", s, strlen(s));
}

enum MHD_Result srv_respond_error(srv_conn *c, const srv_error *e) {
    char *s = c->dialect ? c->dialect->error_json(e) : srv_error_json(e);
    if (!s) return MHD_NO;
    return srv_respond(c, e->status, "application/json", s, strlen(s));
}

/* ---- requests ---- */

json_t *srv_parse_body(srv_conn *c, srv_error *e) {
    json_error_t je;
    if (!c->body.len) return srv_fail(e, 400, "invalid_request_error", NULL, NULL, "the request body is empty; send JSON"), NULL;
    int depth = srv_json_depth(c->body.data, c->body.len);
    if (depth > SRV_MAX_JSON_DEPTH)
        return srv_fail(e, 400, "invalid_request_error", NULL, "nesting_too_deep",
                        "the request body nests %d levels deep; at most %d are allowed", depth, SRV_MAX_JSON_DEPTH),
               NULL;
    json_t *j = kt_json_loadb(c->body.data, c->body.len, 0, &je);
    if (j) return j;
    if (json_error_code(&je) == json_error_out_of_memory) /* the body is not at fault */
        srv_fail(e, 500, "server_error", NULL, NULL, "out of memory reading the request body");
    else if (json_error_code(&je) == json_error_invalid_utf8)
        srv_fail(e, 400, "invalid_request_error", NULL, NULL, "the request body is not valid UTF-8 (%s at byte %d)",
                 je.text, je.position);
    else
        srv_fail(e, 400, "invalid_request_error", NULL, NULL, "malformed JSON in the request body: %s (line %d, column %d)",
                 je.text, je.line, je.column);
    return NULL;
}

srv_state srv_get_state(const srv_server *s) {
    return (srv_state)__atomic_load_n(&s->state, __ATOMIC_ACQUIRE);
}

int srv_busy(srv_server *s) {
    pthread_mutex_lock(&s->link_mu);
    int n = s->n_links_used;
    pthread_mutex_unlock(&s->link_mu);
    return n;
}

/* Ready: 200 with the load a balancer or an operator may weigh (queue,
 * running requests, free KV blocks). Loading, draining, stopping: 503, so
 * an HTTP health check takes the replica out. */
static enum MHD_Result health(srv_conn *c) {
    srv_server *s = c->s;
    srv_state state = srv_get_state(s);
    kt_engine_stats st = {0}, one;
    pthread_mutex_lock(&s->engine_mu);
    bool up = s->n_classes > 0 && !s->stopping;
    for (int i = 0; up && i < s->n_classes; i++) { /* the load of every class together (loaded ones) */
        if (!s->classes[i].engine) continue;
        kt_engine_get_stats(s->classes[i].engine, &one);
        st.queue_depth += one.queue_depth, st.requests_running += one.requests_running;
        st.kv_blocks_free += one.kv_blocks_free, st.kv_blocks_total += one.kv_blocks_total;
    }
    pthread_mutex_unlock(&s->engine_mu);
    if (state == SRV_LOADING) return srv_respond_json(c, 503, json_pack("{s:s}", "status", "loading"));
    if (!up) return srv_respond_json(c, 503, json_pack("{s:s}", "status", "shutting down"));
    if (state == SRV_DRAINING)
        return srv_respond_json(c, 503, json_pack("{s:s, s:i}", "status", "draining", "busy", srv_busy(s)));
    return srv_respond_json(c, 200, json_pack("{s:s, s:s, s:i, s:i, s:i, s:i}", "status", "ok", "state", "ready",
                                              "queued", st.queue_depth, "running", st.requests_running,
                                              "kv_blocks_free", st.kv_blocks_free, "kv_blocks_total",
                                              st.kv_blocks_total));
}

static bool is_generation(srv_endpoint ep) {
    return ep == EP_CHAT || ep == EP_COMPLETIONS || ep == EP_RESPONSES || ep == EP_MESSAGES;
}

/* While loading only /health and /metrics answer (nothing else has a
 * model to use); while draining no new generation starts. Both are 503
 * with Retry-After, which a balancer's retry-on 503 sends elsewhere. */
static bool refused_by_state(const srv_conn *c, srv_error *e) {
    srv_state state = srv_get_state(c->s);
    if (state == SRV_LOADING && c->ep != EP_HEALTH && c->ep != EP_METRICS)
        return srv_fail(e, 503, "server_error", NULL, "loading", "the model is still loading; retry shortly"), true;
    if (state == SRV_DRAINING && is_generation(c->ep))
        return srv_fail(e, 503, "server_error", NULL, "draining",
                        "the server is draining (shutting down); retry, another replica will answer"), true;
    return false;
}

/* Every class's names: its own, then its aliases. */
static enum MHD_Result models(srv_conn *c) {
    return srv_respond_json(c, 200, srv_models_json(c->s));
}

/* GET /v1/models/{id}: a served name's object (srv_model_json). */
static enum MHD_Result one_model(srv_conn *c) {
    srv_error e;
    if (strncmp(c->url, MODEL_PREFIX, strlen(MODEL_PREFIX))) /* the path was not UTF-8 (c->url says so) */
        return srv_respond_error(c, (srv_fail(&e, 404, "invalid_request_error", NULL, "not_found",
                                              "no such model: the path is not UTF-8"), &e));
    json_t *j = srv_model_json(c->s, c->url + strlen(MODEL_PREFIX), &e);
    return j ? srv_respond_json(c, 200, j) : srv_respond_error(c, &e);
}

/* Every class's engine figures (one snapshot each) and result-cache hits. */
static enum MHD_Result metrics(srv_conn *c) {
    srv_server *s = c->s;
    srv_class_stats cs[SRV_MAX_CLASSES] = {{0}};
    pthread_mutex_lock(&s->engine_mu);
    for (int i = 0; i < s->n_classes; i++) {
        const srv_class *k = &s->classes[i];
        cs[i].name = k->cfg.name;
        cs[i].loaded = k->engine != NULL;
        if (k->engine) kt_engine_get_stats(k->engine, &cs[i].engine);
        cs[i].has_results = k->results != NULL;
        cs[i].result_hits = k->results ? srv_results_hits(k->results) : 0;
        if (k->vis.memo) srv_image_memo_counts(k->vis.memo, &cs[i].image_decodes_skipped, &cs[i].image_decodes);
    }
    pthread_mutex_unlock(&s->engine_mu);
    char *text = srv_metrics_text(&s->metrics, cs, s->n_classes);
    if (!text) return MHD_NO;
    return srv_respond(c, 200, "text/plain; version=0.0.4; charset=utf-8", text, strlen(text));
}

static enum MHD_Result tokens(srv_conn *c, bool tokenize) {
    srv_error e;
    json_t *body = srv_parse_body(c, &e), *out = NULL;
    if (body && !json_is_object(body))
        srv_fail(&e, 400, "invalid_request_error", NULL, NULL, "the request body must be a JSON object");
    else if (body && (c->cls = srv_route(c->s, body, &e)) && srv_loaded_now(c, &e))
        out = tokenize ? srv_tokenize(c->cls->model, body, &e) : srv_detokenize(c->cls->model, body, &e);
    json_decref(body);
    return out ? srv_respond_json(c, 200, out) : srv_respond_error(c, &e);
}

/* Constant-time comparison, so the key cannot be guessed byte by byte. */
static bool same_secret(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    unsigned diff = (unsigned)(la ^ lb);
    for (size_t i = 0; i < la; i++) diff |= (unsigned char)a[i] ^ (unsigned char)b[i % (lb ? lb : 1)];
    return diff == 0 && lb > 0;
}

static bool authorized(srv_conn *c) {
    const char *key = c->s->cfg.api_key;
    if (!key || c->ep == EP_HEALTH || c->ep == EP_WEBUI) return true; /* the page is static; its API calls need the key */
    const char *h = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (h && !strncmp(h, "Bearer ", 7) && same_secret(h + 7, key)) return true;
    /* Anthropic's clients send the key in x-api-key */
    const char *x = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "x-api-key");
    return x && same_secret(x, key);
}

/* The Host and Origin rules (origin.h): a 403 saying how to allow what
 * was refused; a --cors-origin page's origin is kept for its answer's
 * CORS headers. */
static bool refused_by_origin(srv_conn *c, srv_error *e) {
    const char *host = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
    const char *origin = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_ORIGIN);
    if (!srv_host_allowed(&c->s->origin_rules, host))
        return srv_fail(e, 403, "invalid_request_error", NULL, "host_not_allowed",
                        "the Host header '%.100s' is not a name of this server; a web page whose own name resolves "
                        "to this machine (DNS rebinding) could otherwise drive it. To allow the name, start kettle "
                        "serve with --allowed-host NAME", host), true;
    srv_origin_verdict v = srv_origin_check(&c->s->origin_rules, origin, host);
    if (v == SRV_ORIGIN_REFUSED)
        return srv_fail(e, 403, "invalid_request_error", NULL, "origin_not_allowed",
                        "a web page from the origin '%.100s' may not call this server (only its own chat page and "
                        "the origins given with --cors-origin may); to allow that page, start kettle serve with "
                        "--cors-origin ORIGIN", origin), true;
    if (v == SRV_ORIGIN_CORS) c->cors_origin = origin;
    return false;
}

/* A --cors-origin page's preflight: 204 allowing the methods and the
 * headers it asks for (SDKs send their own, e.g. x-stainless-*). */
static enum MHD_Result preflight(srv_conn *c) {
    struct MHD_Response *r = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    const char *asked = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "Access-Control-Request-Headers");
    srv_add_cors_headers(c, r);
    MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    MHD_add_response_header(r, "Access-Control-Allow-Headers",
                            asked && asked[0] ? asked : "Authorization, Content-Type, x-api-key");
    MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    enum MHD_Result q = MHD_queue_response(c->mc, MHD_HTTP_NO_CONTENT, r);
    MHD_destroy_response(r);
    c->status = MHD_HTTP_NO_CONTENT;
    return q;
}

static enum MHD_Result dispatch(srv_conn *c) {
    srv_error e;
    if (refused_by_origin(c, &e)) return srv_respond_error(c, &e);
    if (c->cors_origin && !strcmp(c->method, "OPTIONS")) return preflight(c);
    if (c->too_big)
        srv_fail(&e, 413, "invalid_request_error", NULL, "request_too_large",
                 "the request body is larger than the limit of %zu bytes", c->s->cfg.max_body);
    else if (c->route_status == 404)
        srv_fail(&e, 404, "invalid_request_error", NULL, "not_found",
                 "no such endpoint: %s (there are /v1/chat/completions, /v1/completions, /v1/responses, "
                 "/v1/messages[/count_tokens], /v1/embeddings, /v1/models[/ID], /health, /metrics, /tokenize and "
                 "/detokenize)",
                 c->url);
    else if (c->route_status == 405)
        srv_fail(&e, 405, "invalid_request_error", NULL, "method_not_allowed", "%s does not accept %s", c->url,
                 c->method);
    else if (!authorized(c))
        srv_fail(&e, 401, "authentication_error", NULL, "invalid_api_key",
                 "missing or wrong API key: send the header 'Authorization: Bearer KEY' (or 'x-api-key: KEY')");
    else if (!refused_by_state(c, &e))
        e.status = 0;
    if (e.status) return srv_respond_error(c, &e);
    switch (c->ep) {
    case EP_HEALTH: return health(c);
    case EP_MODELS: return models(c);
    case EP_MODEL: return one_model(c);
    case EP_METRICS: return metrics(c);
    case EP_TOKENIZE: return tokens(c, true);
    case EP_DETOKENIZE: return tokens(c, false);
    case EP_CHAT: return srv_gen_start(c, SRV_CHAT);
    case EP_COMPLETIONS: return srv_gen_start(c, SRV_COMPLETION);
    case EP_RESPONSES:
    case EP_MESSAGES: return srv_gen_start(c, SRV_CHAT);
    case EP_COUNT_TOKENS: return srv_count_tokens(c);
    case EP_EMBEDDINGS: return srv_embed_start(c);
    case EP_RESPONSE_ID:
        return srv_respond_error(c, (srv_fail(&e, 404, "invalid_request_error", NULL, "not_found",
                                              "kettle does not store responses (each is answered statelessly, as "
                                              "with store: false); keep the output you need on the client"),
                                     &e));
    case EP_WEBUI: return srv_webui_respond(c);
    default: return MHD_NO;
    }
}

/* The first call for a request: headers only. */
static enum MHD_Result begin(srv_server *s, struct MHD_Connection *mc, const char *url, const char *method,
                             void **con_cls) {
    srv_conn *c = calloc(1, sizeof *c);
    if (!c) return MHD_NO;
    c->s = s, c->mc = mc, c->t0_ms = kt_time_ms();
    snprintf(c->url, sizeof c->url, "%s", srv_utf8_valid(url, strlen(url)) ? url : "(a path that is not UTF-8)");
    snprintf(c->method, sizeof c->method, "%s", srv_utf8_valid(method, strlen(method)) ? method : "?");
    c->ep = route_of(s, url, method, &c->route_status);
    c->dialect = c->ep == EP_RESPONSES                                ? &SRV_DIALECT_RESPONSES
                 : c->ep == EP_MESSAGES || c->ep == EP_COUNT_TOKENS ? &SRV_DIALECT_MESSAGES
                                                                    : NULL;
    *con_cls = c;
    const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl && strtoull(cl, NULL, 10) > s->cfg.max_body) {
        c->too_big = true;
        srv_deadline_received(mc); /* answered now; the body is not read */
        return dispatch(c);
    }
    return MHD_YES;
}

static void take_body(srv_conn *c, const char *data, size_t n) {
    if (c->too_big || c->body.len + n > c->s->cfg.max_body) {
        c->too_big = true;
        srv_buf_free(&c->body);
    } else if (!srv_buf_append(&c->body, data, n)) {
        c->too_big = true; /* out of memory for it: as good as too big */
    }
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_size, void **con_cls) {
    (void)version;
    srv_conn *c = *con_cls;
    if (!c) return begin(cls, mc, url, method, con_cls);
    if (*upload_size) {
        if (srv_deadline_passed(mc)) return c->status = 408, MHD_NO; /* a slow body: closed (deadline.h) */
        take_body(c, upload_data, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (c->status) return MHD_YES; /* answered already (413 at the headers) */
    if (!c->started) {
        srv_deadline_received(mc); /* the whole request is in: answering it has no deadline */
        return dispatch(c);
    }
    if (c->fwd) return srv_fallback_continue(c);
    return c->ep == EP_EMBEDDINGS ? srv_embed_continue(c) : srv_gen_continue(c);
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)toe;
    srv_server *s = cls;
    srv_conn *c = *con_cls;
    bool late = srv_deadline_passed(mc);
    srv_deadline_restart(mc); /* the next request on the connection has its own deadline */
    if (!c) return;
    if (!c->status && !c->started && late) c->status = 408; /* cut: its body came too slowly */
    /* 499 (nginx's "client closed request"): it left before any answer */
    srv_metrics_count(&s->metrics, endpoint_name(c->ep), c->status ? c->status : 499);
    srv_reqlog_conn(c); /* before the release: it reads the request's usage */
    srv_fallback_release(c); /* before the link goes back to its pool */
    srv_embed_release(c);
    srv_gen_release(c);
    srv_class_release(c);
    srv_buf_free(&c->body);
    free(c);
    *con_cls = NULL;
}

/* ---- the daemon ---- */

static bool resolve(const char *host, int port, struct sockaddr_storage *addr, kt_error *err) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *res = NULL;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    int rc = getaddrinfo(host, service, &hints, &res);
    if (rc || !res) {
        snprintf(err->msg, sizeof err->msg, "cannot resolve --host '%s': %s", host, gai_strerror(rc));
        err->status = KT_ERR_ARG;
        return false;
    }
    memcpy(addr, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    return true;
}

/* Whether a socket of ours can bind addr; false with err saying why. MHD
 * is started without its own error printing (MHD_USE_ERROR_LOG writes
 * libmicrohttpd's messages, and one for every client that hangs up, to
 * stderr), so this is how its failure gets a cause a user can act on. */
static bool try_bind(const struct sockaddr_storage *addr, const char *host, int port, kt_error *err) {
    int fd = socket(addr->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0), e = 0, one = 1;
    socklen_t len = addr->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    if (fd < 0) e = errno;
    else if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) || bind(fd, (const struct sockaddr *)addr, len))
        e = errno;
    if (fd >= 0) close(fd);
    if (!e) return true;
    err->status = KT_ERR_IO;
    if (e == EADDRINUSE)
        snprintf(err->msg, sizeof err->msg,
                 "port %d on %s is already in use (another kettle or program is listening); pick another with --port",
                 port, host);
    else if (e == EADDRNOTAVAIL)
        snprintf(err->msg, sizeof err->msg, "cannot listen on %s:%d: %s is not an address of this machine (--host)",
                 host, port, host);
    else if (e == EACCES)
        snprintf(err->msg, sizeof err->msg, "cannot listen on %s:%d: permission denied (ports below 1024 need "
                 "privileges; pick another with --port)", host, port);
    else
        snprintf(err->msg, sizeof err->msg, "cannot listen on %s:%d: %s", host, port, strerror(e));
    return false;
}

static bool is_loopback(const struct sockaddr_storage *addr) {
    if (addr->ss_family == AF_INET) return ntohl(((const struct sockaddr_in *)addr)->sin_addr.s_addr) >> 24 == 127;
    if (addr->ss_family != AF_INET6) return false;
    const struct in6_addr *a = &((const struct sockaddr_in6 *)addr)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
}

static struct MHD_Daemon *start_daemon(srv_server *s, kt_error *err) {
    struct sockaddr_storage addr = {0};
    const char *host = s->cfg.host ? s->cfg.host : "127.0.0.1";
    if (!resolve(host, s->cfg.port, &addr, err)) return NULL;
    /* the Host check guards a loopback server (origin.h): bound elsewhere, only names asked for */
    if (!srv_origin_rules_init(&s->origin_rules, is_loopback(&addr), host, s->cfg.allowed_hosts, s->cfg.cors_origins,
                               err))
        return NULL;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME;
    if (addr.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
        MHD_OPTION_THREAD_POOL_SIZE, (unsigned)s->cfg.http_threads, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_NOTIFY_CONNECTION, srv_deadline_notify, s->deadlines, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)s->cfg.http_timeout_s, MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->cfg.max_connections, MHD_OPTION_END);
    if (!d && try_bind(&addr, host, s->cfg.port, err)) /* it binds now: another cause */
        snprintf(err->msg, sizeof err->msg, "cannot start the HTTP server on %s:%d", host, s->cfg.port);
    return d;
}

/* A class's own parts: its engine, memories and fallback (false with err). */
static bool class_init(srv_server *s, srv_class *k, const srv_class_config *cfg, kt_error *err) {
    k->cfg = *cfg, k->engine = cfg->engine, k->model = cfg->model; /* srv_classes_start decides their state */
    k->vis = (srv_vision_env){.vision = cfg->vision, .limits = s->cfg.image_limits,
                              .fetch_urls = s->cfg.allow_image_urls};
    if (cfg->vision && !(k->vis.memo = srv_image_memo_new()))
        return kt_error_set(err, KT_ERR_NOMEM, "out of memory"), false;
    /* screenshots in an agent's history: base64 images make bodies of tens of MB */
    if (cfg->vision && s->max_body_default) s->cfg.max_body = DEFAULT_MAX_BODY_IMAGES;
    /* 1M ids (4 MB): the replies of many sessions' recent turns */
    bool ok = (k->sampled = srv_sampled_new(1u << 20)) &&
              (cfg->result_cache <= 0 || (k->results = srv_results_new(cfg->result_cache)));
    if (!ok) return kt_error_set(err, KT_ERR_NOMEM, "out of memory"), false;
    return !cfg->fallback.url || (k->fallback = srv_fb_state_new(&k->cfg.fallback, err));
}

/* Names must say one class each: a name two classes answer to would
 * route to the first only. */
static bool names_unique(const srv_class_config *classes, int n, kt_error *err) {
    for (int a = 0; a < n; a++)
        for (int i = -1; i < classes[a].n_aliases; i++) {
            const char *name = i < 0 ? classes[a].name : classes[a].aliases[i];
            for (int b = 0; b <= a; b++)
                for (int j = -1; j < classes[b].n_aliases && !(b == a && j >= i); j++)
                    if (!strcmp(name, j < 0 ? classes[b].name : classes[b].aliases[j])) {
                        kt_error_set(err, KT_ERR_ARG, "the model name '%s' is given twice (names and aliases "
                                     "must be unique across --model classes)", name);
                        return false;
                    }
        }
    return true;
}

srv_server *srv_open(const srv_config *cfg, kt_error *err) {
    srv_server *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return NULL;
    }
    s->cfg = *cfg, s->started = (long long)time(NULL), s->state = SRV_LOADING;
    if ((s->max_body_default = !s->cfg.max_body)) s->cfg.max_body = DEFAULT_MAX_BODY;
    if (!s->cfg.image_limits.max_bytes) kt_image_limits_default(&s->cfg.image_limits);
    if (s->cfg.http_threads <= 0) s->cfg.http_threads = 4;
    if (s->cfg.http_timeout_s <= 0) s->cfg.http_timeout_s = DEFAULT_HTTP_TIMEOUT_S;
    if (s->cfg.max_connections <= 0) s->cfg.max_connections = DEFAULT_MAX_CONNECTIONS;
    pthread_mutex_init(&s->engine_mu, NULL);
    pthread_mutex_init(&s->link_mu, NULL);
    pthread_mutex_init(&s->load_mu, NULL);
    pthread_cond_init(&s->keeper_cv, NULL);
    s->mem_budget = cfg->mem_budget;
    bool keepalive = srv_keepalive_init(s); /* before any stream: they plan their keep-alives with it */
    if (!keepalive) kt_error_set(err, KT_ERR_NOMEM, "cannot start the thread that sends keep-alives on quiet streams");
    if (!keepalive || !srv_metrics_init(&s->metrics) ||
        (s->cfg.fallback.url && !(s->fallback = srv_fb_state_new(&s->cfg.fallback, err))) ||
        !(s->deadlines = srv_deadlines_new(s->cfg.http_timeout_s, err)) || !(s->daemon = start_daemon(s, err))) {
        if (!err->msg[0]) snprintf(err->msg, sizeof err->msg, "cannot start the HTTP server");
        srv_stop(s);
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info ? info->port : cfg->port;
    return s;
}

bool srv_ready_classes(srv_server *s, const srv_class_config *classes, int n, kt_error *err) {
    bool ok = n >= 1 && n <= SRV_MAX_CLASSES;
    if (!ok) kt_error_set(err, KT_ERR_ARG, "1 to %d models can be served", SRV_MAX_CLASSES);
    ok = ok && names_unique(classes, n, err);
    pthread_mutex_lock(&s->engine_mu);
    for (int i = 0; ok && i < n; i++) {
        ok = class_init(s, &s->classes[i], &classes[i], err);
        s->n_classes = i + 1;
    }
    pthread_mutex_unlock(&s->engine_mu);
    if (!ok) { /* the engines are the server's now: those not in a class go */
        for (int i = s->n_classes; i < n; i++) kt_engine_free(classes[i].engine);
        return false;
    }
    if (!srv_classes_start(s)) return kt_error_set(err, KT_ERR_NOMEM, "cannot start the thread that unloads idle models"), false;
    __atomic_store_n(&s->state, SRV_READY, __ATOMIC_RELEASE); /* after the classes: handlers read them once ready */
    return true;
}

void srv_ready(srv_server *s, kt_model *model, kt_engine *engine, kt_pooling embed_pooling) {
    const srv_config *cfg = &s->cfg;
    srv_class_config one = {.name = cfg->model_name ? cfg->model_name : "model", .aliases = cfg->aliases,
                            .n_aliases = cfg->n_aliases, .model = model, .engine = engine,
                            .template_text = cfg->template_text, .embed_pooling = embed_pooling,
                            .result_cache = cfg->result_cache};
    kt_error err = {0};
    srv_ready_classes(s, &one, 1, &err); /* one class: only out of memory can refuse it */
}

void srv_set_mem_budget(srv_server *s, size_t bytes) {
    pthread_mutex_lock(&s->load_mu);
    s->mem_budget = bytes;
    pthread_mutex_unlock(&s->load_mu);
}

void srv_drain(srv_server *s) {
    int ready = SRV_READY; /* a server still loading has nothing to drain */
    __atomic_compare_exchange_n(&s->state, &ready, SRV_DRAINING, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

srv_server *srv_start(kt_model *model, kt_engine *engine, const srv_config *cfg, kt_error *err) {
    srv_server *s = srv_open(cfg, err);
    if (s) srv_ready(s, model, engine, cfg->embed_pooling); /* on failure the engine is still the caller's */
    return s;
}

srv_server *srv_start_classes(const srv_config *cfg, const srv_class_config *classes, int n, kt_error *err) {
    srv_server *s = srv_open(cfg, err);
    if (!s) {
        for (int i = 0; i < n; i++) kt_engine_free(classes[i].engine);
        return NULL;
    }
    if (!srv_ready_classes(s, classes, n, err)) srv_stop(s), s = NULL;
    return s;
}

int srv_port(const srv_server *s) {
    return s->port;
}

void srv_stop(srv_server *s) {
    if (!s) return;
    srv_classes_stop(s); /* no load or unload from here on */
    kt_engine *engines[SRV_MAX_CLASSES];
    pthread_mutex_lock(&s->engine_mu);
    for (int i = 0; i < s->n_classes; i++) engines[i] = s->classes[i].engine, s->classes[i].engine = NULL;
    pthread_mutex_unlock(&s->engine_mu);
    for (int i = 0; i < s->n_classes; i++) kt_engine_free(engines[i]); /* every request ends as cancelled and notifies */
    srv_links_wake_all(s);
    /* let the woken streams send their last chunks and [DONE] (up to 3 s) */
    for (int i = 0; s->daemon && i < 300 && !srv_links_idle(s); i++) nanosleep(&(struct timespec){0, 10000000}, NULL);
    srv_keepalive_stop(s); /* before the daemon: it resumes connections */
    if (s->daemon) MHD_stop_daemon(s->daemon);
    srv_deadlines_free(s->deadlines); /* after the daemon: every connection has closed */
    srv_origin_rules_free(&s->origin_rules);
    srv_fb_state_free(s->fallback); /* after the daemon: every transfer has been released */
    for (int i = 0; i < s->n_classes; i++) srv_fb_state_free(s->classes[i].fallback);
    srv_links_free(s);
    for (int i = 0; i < s->n_classes; i++) {
        srv_class *k = &s->classes[i];
        srv_sampled_free(k->sampled), srv_results_free(k->results), srv_image_memo_free(k->vis.memo);
        if (k->cfg.load) kt_model_free(k->model); /* loaded on demand: the server's */
    }
    srv_metrics_destroy(&s->metrics);
    pthread_mutex_destroy(&s->engine_mu);
    pthread_mutex_destroy(&s->link_mu);
    pthread_mutex_destroy(&s->load_mu);
    pthread_cond_destroy(&s->keeper_cv);
    srv_keepalive_destroy(s);
    free(s);
}
