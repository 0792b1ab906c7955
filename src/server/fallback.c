/*
 * fallback.c - forwarding a refused generation request to the fallback
 * upstream (see fallback.h), on the HTTP side: which refusals forward,
 * the request as it goes upstream, and the answer as it comes back.
 *
 * gen.c hands every error it would answer to srv_fallback_or_error. A
 * trigger that applies starts a transfer on the upstream thread
 * (upstream.c) and the connection waits the way generation requests do:
 * suspended on its srv_link, resumed by the transfer's notify. Once the
 * upstream's headers are in, a 2xx event stream is passed through as it
 * comes (MHD_create_response_from_callback over the bytes curl
 * delivered); any other answer is gathered and sent whole with the
 * upstream's status and content type. Failures of the upstream itself
 * are kettle's answers: 502 (unreachable, broken), 504 (timeout), in the
 * endpoint's error shape, naming the upstream's host, never its key.
 */
#include "server/fallback.h"

#include <ctype.h>
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json_safe.h"
#include "server/http_internal.h"
#include "server/upstream.h"

/* ---- settings ---- */

static const char *const REASONS[SRV_FB_N_REASONS] = {"context", "busy", "unknown-model", "error"};
static const char *const FAILURES[SRV_FB_N_FAILURES] = {"connect", "timeout", "status"};

const char *srv_fb_reason_name(srv_fb_reason r) {
    return r >= 0 && r < SRV_FB_N_REASONS ? REASONS[r] : "none";
}

const char *srv_fb_failure_name(srv_fb_failure f) {
    return f >= 0 && f < SRV_FB_N_FAILURES ? FAILURES[f] : "none";
}

static int reason_named(const char *s, size_t n) {
    for (int r = 0; r < SRV_FB_N_REASONS; r++)
        if (strlen(REASONS[r]) == n && !strncmp(s, REASONS[r], n)) return r;
    return -1;
}

bool srv_fb_parse_triggers(const char *list, unsigned *out, char *msg, size_t cap) {
    unsigned set = 0;
    for (const char *p = list;; p++) {
        size_t n = strcspn(p, ",");
        int r = reason_named(p, n);
        if (r < 0) {
            snprintf(msg, cap, "'%.*s' is not a fallback trigger (context, busy, unknown-model, error)", (int)n, p);
            return false;
        }
        set |= 1u << r;
        p += n;
        if (!*p) break;
    }
    *out = set;
    return true;
}

bool srv_fb_check_env_name(const char *name) {
    if (!name[0] || !(isalpha((unsigned char)name[0]) || name[0] == '_')) return false;
    for (const char *p = name; *p; p++)
        if (!(isalnum((unsigned char)*p) || *p == '_')) return false;
    return true;
}

/* One part of a parsed URL (NULL when absent), for the checks. */
static char *url_part(CURLU *h, CURLUPart what) {
    char *v = NULL;
    return curl_url_get(h, what, &v, 0) == CURLUE_OK ? v : NULL;
}

static bool check_parts(CURLU *h, char *msg, size_t cap) {
    char *scheme = url_part(h, CURLUPART_SCHEME), *host = url_part(h, CURLUPART_HOST);
    char *user = url_part(h, CURLUPART_USER), *query = url_part(h, CURLUPART_QUERY);
    bool ok = false;
    if (!scheme || (strcmp(scheme, "http") && strcmp(scheme, "https")))
        snprintf(msg, cap, "the fallback URL must start with http:// or https://");
    else if (!host || !host[0])
        snprintf(msg, cap, "the fallback URL names no host");
    else if (user)
        snprintf(msg, cap, "the fallback URL must not hold a user or password; put the API key in the environment "
                           "variable --fallback-key-env names");
    else if (query)
        snprintf(msg, cap, "the fallback URL must not have a query (?...): give the base URL, e.g. http://HOST:PORT/v1");
    else
        ok = true;
    curl_free(scheme), curl_free(host), curl_free(user), curl_free(query);
    return ok;
}

bool srv_fb_check_url(const char *url, char *msg, size_t cap) {
    CURLU *h = curl_url();
    if (!h) return snprintf(msg, cap, "out of memory"), false;
    bool ok = curl_url_set(h, CURLUPART_URL, url, 0) == CURLUE_OK;
    if (!ok) snprintf(msg, cap, "'%.200s' is not a URL (e.g. http://127.0.0.1:9000/v1)", url);
    ok = ok && check_parts(h, msg, cap);
    curl_url_cleanup(h);
    return ok;
}

srv_fb_reason srv_fb_reason_of(const srv_error *e) {
    if (e->code && !strcmp(e->code, "context_length_exceeded")) return SRV_FB_CONTEXT;
    /* a class that is not served, or could not be loaded: the upstream may have it */
    if (e->code && (!strcmp(e->code, "model_not_found") || !strcmp(e->code, "model_not_loaded")))
        return SRV_FB_UNKNOWN_MODEL;
    if (e->status == 503 && e->code && !strcmp(e->code, "server_busy")) return SRV_FB_BUSY;
    if (e->status == 500) return SRV_FB_ERROR;
    return SRV_FB_NONE;
}

/* Whether url has no path (or only "/"). */
static bool is_root_url(const char *url) {
    CURLU *h = curl_url();
    char *path = NULL;
    bool root = h && curl_url_set(h, CURLUPART_URL, url, 0) == CURLUE_OK &&
                curl_url_get(h, CURLUPART_PATH, &path, 0) == CURLUE_OK && (!path[0] || !strcmp(path, "/"));
    curl_free(path);
    curl_url_cleanup(h);
    return root;
}

/* ---- the server's upstream ---- */

struct srv_fb_state {
    srv_fallback cfg;
    srv_upstream *up;
    char base[1024];   /* the URL without a trailing '/' */
    char host[300];    /* host[:port], for messages */
    char *auth, *xapi; /* "Authorization: Bearer KEY", "x-api-key: KEY"; NULL without a key */
};

static bool key_headers(srv_fb_state *fb) {
    const char *key = getenv(fb->cfg.key_env);
    if (!key || !key[0]) return true;
    size_t n = strlen(key) + 32;
    if (!(fb->auth = malloc(n)) || !(fb->xapi = malloc(n))) return false;
    snprintf(fb->auth, n, "Authorization: Bearer %s", key);
    snprintf(fb->xapi, n, "x-api-key: %s", key);
    return true;
}

static void host_of(const char *url, char *out, size_t cap) {
    CURLU *h = curl_url();
    char *host = NULL, *port = NULL;
    if (h && curl_url_set(h, CURLUPART_URL, url, 0) == CURLUE_OK) {
        curl_url_get(h, CURLUPART_HOST, &host, 0);
        curl_url_get(h, CURLUPART_PORT, &port, 0);
    }
    snprintf(out, cap, "%s%s%s", host ? host : "?", port ? ":" : "", port ? port : "");
    curl_free(host), curl_free(port);
    curl_url_cleanup(h);
}

static void free_secret(char *s) {
    if (s) memset(s, 0, strlen(s)), free(s);
}

void srv_fb_state_free(srv_fb_state *fb) {
    if (!fb) return;
    srv_upstream_free(fb->up);
    free_secret(fb->auth), free_secret(fb->xapi);
    free(fb);
}

srv_fb_state *srv_fb_state_new(const srv_fallback *cfg, kt_error *err) {
    char msg[300];
    if (!srv_fb_check_url(cfg->url, msg, sizeof msg)) {
        snprintf(err->msg, sizeof err->msg, "--fallback: %s", msg);
        err->status = KT_ERR_ARG;
        return NULL;
    }
    srv_fb_state *fb = calloc(1, sizeof *fb);
    if (!fb) return snprintf(err->msg, sizeof err->msg, "out of memory"), NULL;
    fb->cfg = *cfg;
    if (!fb->cfg.key_env) fb->cfg.key_env = SRV_FB_DEFAULT_KEY_ENV;
    if (!fb->cfg.triggers) fb->cfg.triggers = SRV_FB_ALL;
    if (fb->cfg.timeout_s <= 0) fb->cfg.timeout_s = SRV_FB_DEFAULT_TIMEOUT_S;
    if (fb->cfg.max_s <= 0) fb->cfg.max_s = SRV_FB_DEFAULT_MAX_S;
    snprintf(fb->base, sizeof fb->base, "%s", cfg->url);
    for (size_t n = strlen(fb->base); n && fb->base[n - 1] == '/'; n--) fb->base[n - 1] = 0;
    /* a server's root (http://HOST:PORT, as Ollama's and llama-server's
     * URLs are often given) serves the API under /v1: forwarded requests
     * went to /chat/completions and came back 404 */
    if (is_root_url(cfg->url) && strlen(fb->base) + 3 < sizeof fb->base) strcat(fb->base, "/v1");
    host_of(cfg->url, fb->host, sizeof fb->host);
    if (!key_headers(fb)) {
        srv_fb_state_free(fb);
        return snprintf(err->msg, sizeof err->msg, "out of memory"), NULL;
    }
    if (!(fb->up = srv_upstream_new(err))) return srv_fb_state_free(fb), NULL;
    return fb;
}

/* ---- answers ---- */

static enum MHD_Result queue(srv_conn *c, int status, struct MHD_Response *r, const char *ctype,
                             const char *retry_after) {
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype && ctype[0] ? ctype : "application/json");
    MHD_add_response_header(r, "x-kettle-served-by", "fallback");
    MHD_add_response_header(r, "x-kettle-fallback-reason", c->fallback_reason);
    if (retry_after && retry_after[0]) MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, retry_after);
    srv_add_cors_headers(c, r);
    enum MHD_Result q = MHD_queue_response(c->mc, (unsigned)status, r);
    MHD_destroy_response(r);
    c->status = status;
    return q;
}

static enum MHD_Result queue_text(srv_conn *c, int status, char *body, const char *ctype, const char *retry_after) {
    if (!body) return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) free(body);
    return queue(c, status, r, ctype, retry_after);
}

/* kettle's own answer about the upstream, in the endpoint's error shape. */
static enum MHD_Result answer_error(srv_conn *c, const srv_error *e) {
    char *j = c->dialect ? c->dialect->error_json(e) : srv_error_json(e);
    return queue_text(c, e->status, j, "application/json", e->status == 503 ? "1" : NULL);
}

static srv_fb_failure failure_kind(srv_fwd_failure f) {
    return f == FWD_TIMEOUT ? SRV_FB_FAIL_TIMEOUT : SRV_FB_FAIL_CONNECT;
}

/* The upstream failed (or the client left / the server stops). */
static enum MHD_Result answer_failure(srv_conn *c, const srv_fwd_view *v) {
    const srv_fb_state *fb = c->s->fallback;
    srv_error e;
    if (v->failure == FWD_CANCELLED)
        return srv_fail(&e, 503, "server_error", NULL, NULL, "%s", v->error), answer_error(c, &e);
    srv_metrics_fallback_failure(&c->s->metrics, failure_kind(v->failure));
    if (v->failure == FWD_TIMEOUT)
        srv_fail(&e, 504, "server_error", NULL, "upstream_timeout",
                 "kettle could not serve this request (%s) and the fallback upstream %s did not answer in time: %s",
                 c->fallback_reason, fb->host, v->error);
    else
        srv_fail(&e, 502, "server_error", NULL, "upstream_failed",
                 "kettle could not serve this request (%s) and the fallback upstream %s failed: %s",
                 c->fallback_reason, fb->host, v->error);
    return answer_error(c, &e);
}

/* A whole answer, with the upstream's status and content type. */
static enum MHD_Result answer_whole(srv_conn *c, const srv_fwd_view *v) {
    char *body = malloc(v->available + 1);
    if (!body) {
        srv_error e;
        return srv_fail(&e, 500, "server_error", NULL, NULL, "out of memory"), answer_error(c, &e);
    }
    size_t n = srv_fwd_read(c->fwd, body, v->available);
    body[n] = 0;
    if (v->status >= 400) srv_metrics_fallback_failure(&c->s->metrics, SRV_FB_FAIL_STATUS);
    struct MHD_Response *r = MHD_create_response_from_buffer(n, body, MHD_RESPMEM_MUST_FREE);
    if (!r) free(body);
    return queue(c, v->status, r, v->content_type, v->retry_after);
}

/* MHD's content reader for a passed-through stream: the bytes curl
 * delivered, or suspend until it delivers more. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    srv_conn *c = cls;
    for (;;) {
        srv_link_arm(c->link);
        size_t n = srv_fwd_read(c->fwd, buf, max);
        if (n) return (ssize_t)n;
        srv_fwd_view v;
        srv_fwd_peek(c->fwd, &v);
        if (v.available) continue; /* came in meanwhile */
        if (v.done) {
            if (v.failure && v.failure != FWD_CANCELLED)
                srv_metrics_fallback_failure(&c->s->metrics, failure_kind(v.failure));
            /* a stream cut short ends as a broken chunked body, which clients report */
            return v.failure ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
        }
        srv_wait w = srv_link_suspend(c->link);
        if (w == WAIT_SUSPENDED) return 0;
        if (w == WAIT_SHUTDOWN) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

static enum MHD_Result answer_stream(srv_conn *c, const srv_fwd_view *v) {
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, c, NULL);
    if (r) MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    return queue(c, v->status, r, v->content_type, NULL);
}

enum MHD_Result srv_fallback_continue(srv_conn *c) {
    for (;;) {
        srv_link_arm(c->link);
        srv_fwd_view v;
        srv_fwd_peek(c->fwd, &v);
        if (v.done && v.failure) return answer_failure(c, &v);
        if (v.status && v.streaming) return answer_stream(c, &v);
        if (v.done) return answer_whole(c, &v);
        srv_wait w = srv_link_suspend(c->link);
        if (w == WAIT_SUSPENDED) return MHD_YES;
        if (w == WAIT_SHUTDOWN) {
            srv_error e;
            return srv_fail(&e, 503, "server_error", NULL, NULL, "the server is shutting down"), answer_error(c, &e);
        }
    }
}

/* ---- the request upstream ---- */

static bool forwardable(const srv_conn *c) {
    return c->ep == EP_CHAT || c->ep == EP_COMPLETIONS || c->ep == EP_RESPONSES || c->ep == EP_MESSAGES;
}

static bool stopping(srv_server *s) {
    pthread_mutex_lock(&s->engine_mu);
    bool stop = s->stopping;
    pthread_mutex_unlock(&s->engine_mu);
    return stop;
}

/* The body that goes upstream: the client's bytes, or (--fallback-model)
 * the same JSON with `model` replaced. NULL: out of memory. */
static char *upstream_body(const srv_conn *c, const srv_fb_state *fb, size_t *len) {
    if (!fb->cfg.model) {
        char *b = malloc(c->body.len + 1);
        if (b) memcpy(b, c->body.data, c->body.len), b[c->body.len] = 0, *len = c->body.len;
        return b;
    }
    json_t *j = kt_json_loadb(c->body.data, c->body.len, 0, NULL); /* parsed once already: it is JSON */
    char *s = NULL;
    if (j && !json_object_set_new(j, "model", json_string(fb->cfg.model))) s = kt_json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (s) *len = strlen(s);
    return s;
}

/* Whether the client asked for a stream: its first byte bounds the wait
 * (a whole answer's headers come only once it is all generated). */
static bool wants_stream(const srv_conn *c) {
    json_t *body = c->dialect_body ? c->dialect_body : c->json;
    return json_is_true(json_object_get(body, "stream"));
}

/* Anthropic's version headers go on with a /v1/messages request. */
static void client_header(const srv_conn *c, const char *name, const char *dflt, char *out, size_t cap) {
    const char *v = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, name);
    if (v && v[0] && !strpbrk(v, "\r\n")) snprintf(out, cap, "%s: %s", name, v);
    else if (dflt) snprintf(out, cap, "%s: %s", name, dflt);
    else out[0] = 0;
}

static bool start_forward(srv_conn *c, srv_fb_state *fb, srv_fb_reason reason) {
    char url[1200], version[128], beta[256];
    snprintf(url, sizeof url, "%s%s", fb->base, c->url + 3); /* every forwarded path starts with /v1 */
    const char *headers[8];
    int n = 0;
    headers[n++] = "Content-Type: application/json";
    headers[n++] = "Expect:"; /* no 100-continue round trip */
    headers[n++] = "User-Agent: kettle-fallback";
    if (fb->auth) headers[n++] = fb->auth;
    if (c->ep == EP_MESSAGES) {
        if (fb->xapi) headers[n++] = fb->xapi;
        client_header(c, "anthropic-version", "2023-06-01", version, sizeof version);
        client_header(c, "anthropic-beta", NULL, beta, sizeof beta);
        headers[n++] = version;
        if (beta[0]) headers[n++] = beta;
    }
    size_t len = 0;
    char *body = upstream_body(c, fb, &len);
    if (!body || (!c->link && !(c->link = srv_link_acquire(c->s, c->mc)))) return free(body), false;
    int timeout_ms = fb->cfg.timeout_s * 1000, max_ms = fb->cfg.max_s * 1000;
    srv_fwd_request rq = {.url = url, .body = body, .body_len = len, .headers = headers, .n_headers = n,
                          .connect_ms = timeout_ms, .first_byte_ms = wants_stream(c) ? timeout_ms : max_ms,
                          .total_ms = max_ms, .notify = srv_link_notify, .client_gone = srv_link_client_gone,
                          .ctx = c->link};
    c->fwd = srv_fwd_start(fb->up, &rq);
    free(body);
    if (!c->fwd) return false;
    c->fallback_reason = srv_fb_reason_name(reason);
    srv_metrics_fallback(&c->s->metrics, reason);
    return true;
}

enum MHD_Result srv_fallback_or_error(srv_conn *c, const srv_error *e) {
    /* the class's own upstream, else the server's (also for a name no class has) */
    srv_fb_state *fb = c->cls && c->cls->fallback ? c->cls->fallback : c->s->fallback;
    srv_fb_reason reason = srv_fb_reason_of(e);
    if (!fb || reason == SRV_FB_NONE || !(fb->cfg.triggers & (1u << reason)) || !forwardable(c) || c->fwd ||
        stopping(c->s) || !start_forward(c, fb, reason))
        return srv_respond_error(c, e);
    return srv_fallback_continue(c);
}

void srv_fallback_release(srv_conn *c) {
    srv_fwd_release(c->fwd);
    c->fwd = NULL;
}
