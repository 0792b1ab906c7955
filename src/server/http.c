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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/timing.h"
#include "server/http_internal.h"
#include "server/reqlog.h"
#include "server/sampled.h"
#include "server/webui.h"

#define DEFAULT_MAX_BODY (8u << 20)

/* ---- routing ---- */

typedef struct route {
    const char *path, *method;
    srv_endpoint ep;
} route;

static const route ROUTES[] = {
    {"/health", "GET", EP_HEALTH},
    {"/v1/models", "GET", EP_MODELS},
    {"/metrics", "GET", EP_METRICS},
    {"/tokenize", "POST", EP_TOKENIZE},
    {"/detokenize", "POST", EP_DETOKENIZE},
    {"/v1/chat/completions", "POST", EP_CHAT},
    {"/v1/completions", "POST", EP_COMPLETIONS},
    {"/v1/responses", "POST", EP_RESPONSES},
    {"/v1/messages", "POST", EP_MESSAGES},
    {"/v1/messages/count_tokens", "POST", EP_COUNT_TOKENS},
    {"/v1/embeddings", "POST", EP_EMBEDDINGS},
};

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
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
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
    json_t *j = json_loadb(c->body.data, c->body.len, 0, &je);
    if (j) return j;
    if (json_error_code(&je) == json_error_invalid_utf8)
        srv_fail(e, 400, "invalid_request_error", NULL, NULL, "the request body is not valid UTF-8 (%s at byte %d)",
                 je.text, je.position);
    else
        srv_fail(e, 400, "invalid_request_error", NULL, NULL, "malformed JSON in the request body: %s (line %d, column %d)",
                 je.text, je.line, je.column);
    return NULL;
}

static enum MHD_Result health(srv_conn *c) {
    pthread_mutex_lock(&c->s->engine_mu);
    bool up = c->s->engine != NULL;
    pthread_mutex_unlock(&c->s->engine_mu);
    return srv_respond_json(c, up ? 200 : 503, json_pack("{s:s}", "status", up ? "ok" : "shutting down"));
}

srv_model_info srv_model_info_of(const srv_server *s) {
    return (srv_model_info){.name = s->cfg.model_name, .aliases = s->cfg.aliases, .n_aliases = s->cfg.n_aliases,
                            .strict = s->cfg.strict_model_names};
}

static json_t *model_object(const srv_server *s, const char *name) {
    return json_pack("{s:s, s:s, s:I, s:s}", "id", name, "object", "model", "created", (json_int_t)s->started,
                     "owned_by", "kettle");
}

/* Every name the model answers to: the file's, then the aliases. */
static enum MHD_Result models(srv_conn *c) {
    srv_server *s = c->s;
    json_t *data = json_array();
    if (data) json_array_append_new(data, model_object(s, s->cfg.model_name));
    for (int i = 0; data && i < s->cfg.n_aliases; i++) json_array_append_new(data, model_object(s, s->cfg.aliases[i]));
    return srv_respond_json(c, 200, data ? json_pack("{s:s, s:o}", "object", "list", "data", data) : NULL);
}

/* GET /v1/models/{id}: a served name's object; another name is this
 * model too (its object, under the file's name) unless
 * --strict-model-names, where it is a 404 as for a generation request. */
static enum MHD_Result one_model(srv_conn *c) {
    srv_server *s = c->s;
    srv_error e;
    if (strncmp(c->url, MODEL_PREFIX, strlen(MODEL_PREFIX))) /* the path was not UTF-8 (c->url says so) */
        return srv_respond_error(c, (srv_fail(&e, 404, "invalid_request_error", NULL, "not_found",
                                              "no such model: the path is not UTF-8"), &e));
    const char *id = c->url + strlen(MODEL_PREFIX);
    srv_model_info mi = srv_model_info_of(s);
    if (srv_model_served(&mi, id)) return srv_respond_json(c, 200, model_object(s, id));
    if (!mi.strict) return srv_respond_json(c, 200, model_object(s, s->cfg.model_name));
    srv_model_not_found(&mi, id, &e);
    return srv_respond_error(c, &e);
}

static enum MHD_Result metrics(srv_conn *c) {
    srv_server *s = c->s;
    kt_engine_stats st = {0};
    pthread_mutex_lock(&s->engine_mu);
    if (s->engine) kt_engine_get_stats(s->engine, &st);
    pthread_mutex_unlock(&s->engine_mu);
    char *text = srv_metrics_text(&s->metrics, &st);
    if (!text) return MHD_NO;
    if (s->results) { /* the result cache is the server's, not the engine's */
        srv_buf b = {text, strlen(text), strlen(text) + 1};
        char line[200];
        int n = snprintf(line, sizeof line,
                         "# HELP kettle_result_cache_hits_total requests answered from --result-cache\n"
                         "# TYPE kettle_result_cache_hits_total counter\nkettle_result_cache_hits_total %llu\n",
                         (unsigned long long)srv_results_hits(s->results));
        if (!srv_buf_append(&b, line, (size_t)n)) {
            free(b.data);
            return MHD_NO;
        }
        text = b.data;
    }
    return srv_respond(c, 200, "text/plain; version=0.0.4; charset=utf-8", text, strlen(text));
}

static enum MHD_Result tokens(srv_conn *c, bool tokenize) {
    srv_error e;
    json_t *body = srv_parse_body(c, &e), *out = NULL;
    if (body && !json_is_object(body))
        srv_fail(&e, 400, "invalid_request_error", NULL, NULL, "the request body must be a JSON object");
    else if (body)
        out = tokenize ? srv_tokenize(c->s->model, body, &e) : srv_detokenize(c->s->model, body, &e);
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

static enum MHD_Result dispatch(srv_conn *c) {
    srv_error e;
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
    else
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
        take_body(c, upload_data, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (c->status) return MHD_YES; /* answered already (413 at the headers) */
    if (!c->started) return dispatch(c);
    if (c->fwd) return srv_fallback_continue(c);
    return c->embed ? srv_embed_continue(c) : srv_gen_continue(c);
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)mc, (void)toe;
    srv_server *s = cls;
    srv_conn *c = *con_cls;
    if (!c) return;
    /* 499 (nginx's "client closed request"): it left before any answer */
    srv_metrics_count(&s->metrics, endpoint_name(c->ep), c->status ? c->status : 499);
    srv_reqlog_conn(c); /* before the release: it reads the request's usage */
    srv_fallback_release(c); /* before the link goes back to its pool */
    srv_embed_release(c);
    srv_gen_release(c);
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

bool srv_check_listen(const char *host, int port, kt_error *err) {
    struct sockaddr_storage addr = {0};
    if (!host) host = "127.0.0.1";
    return resolve(host, port, &addr, err) && try_bind(&addr, host, port, err);
}

static struct MHD_Daemon *start_daemon(srv_server *s, kt_error *err) {
    struct sockaddr_storage addr = {0};
    const char *host = s->cfg.host ? s->cfg.host : "127.0.0.1";
    if (!resolve(host, s->cfg.port, &addr, err)) return NULL;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME;
    if (addr.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
        MHD_OPTION_THREAD_POOL_SIZE, (unsigned)s->cfg.http_threads, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)300, MHD_OPTION_CONNECTION_LIMIT, (unsigned)4096, MHD_OPTION_END);
    if (!d && try_bind(&addr, host, s->cfg.port, err)) /* it binds now: another cause */
        snprintf(err->msg, sizeof err->msg, "cannot start the HTTP server on %s:%d", host, s->cfg.port);
    return d;
}

srv_server *srv_start(kt_model *model, kt_engine *engine, const srv_config *cfg, kt_error *err) {
    srv_server *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return NULL;
    }
    s->model = model, s->engine = engine, s->cfg = *cfg, s->started = (long long)time(NULL);
    if (!s->cfg.max_body) s->cfg.max_body = DEFAULT_MAX_BODY;
    if (s->cfg.http_threads <= 0) s->cfg.http_threads = 4;
    pthread_mutex_init(&s->engine_mu, NULL);
    pthread_mutex_init(&s->link_mu, NULL);
    /* 1M ids (4 MB): the replies of many sessions' recent turns */
    if (!srv_metrics_init(&s->metrics) || !(s->sampled = srv_sampled_new(1u << 20)) ||
        (s->cfg.result_cache > 0 && !(s->results = srv_results_new(s->cfg.result_cache))) ||
        (s->cfg.fallback.url && !(s->fallback = srv_fb_state_new(&s->cfg.fallback, err))) ||
        !(s->daemon = start_daemon(s, err))) {
        if (!err->msg[0]) snprintf(err->msg, sizeof err->msg, "cannot start the HTTP server");
        s->engine = NULL; /* still the caller's */
        srv_stop(s);
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info ? info->port : cfg->port;
    return s;
}

int srv_port(const srv_server *s) {
    return s->port;
}

void srv_stop(srv_server *s) {
    if (!s) return;
    pthread_mutex_lock(&s->engine_mu);
    kt_engine *e = s->engine;
    s->engine = NULL;
    pthread_mutex_unlock(&s->engine_mu);
    if (e) kt_engine_free(e); /* every request ends as cancelled and notifies */
    srv_links_wake_all(s);
    /* let the woken streams send their last chunks and [DONE] (up to 3 s) */
    for (int i = 0; s->daemon && i < 300 && !srv_links_idle(s); i++) nanosleep(&(struct timespec){0, 10000000}, NULL);
    if (s->daemon) MHD_stop_daemon(s->daemon);
    srv_fb_state_free(s->fallback); /* after the daemon: every transfer has been released */
    srv_links_free(s);
    srv_sampled_free(s->sampled);
    srv_results_free(s->results);
    srv_metrics_destroy(&s->metrics);
    pthread_mutex_destroy(&s->engine_mu);
    pthread_mutex_destroy(&s->link_mu);
    free(s);
}
