/*
 * upstream.c - the fallback upstream's transfers on one libcurl multi
 * thread (see upstream.h).
 *
 * Ownership: a transfer has two references, the connection's and the
 * thread's. The thread drops its own once the transfer is over (finished,
 * failed, timed out or cancelled) and out of the multi handle; whichever
 * side drops the last frees it. Everything both sides touch is under the
 * transfer's mutex; the easy handle and the list links only the thread
 * touches (after the hand-over through the inbox).
 *
 * Lock order: transfer mutex, then whatever notify takes (the link's
 * mutex, then MHD's). The connection never holds its link's mutex while
 * taking a transfer's, so the order has no cycle.
 */
#include "server/upstream.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/timing.h"

#define PAUSE_AT (1u << 20)    /* a stream pauses with this much unread */
#define GATHER_CAP (64u << 20) /* a gathered (non-stream) answer's limit */
#define RETRY_DELAY_MS 200     /* before the one retry of a refused connection */

struct srv_fwd {
    pthread_mutex_t mu;
    int refs;
    srv_upstream *u;           /* NULL once the thread has let go of every transfer */
    /* under mu: what both sides see */
    srv_fwd_view v;
    char *buf;                 /* body bytes [pos, len) unread */
    size_t pos, len, cap;
    bool paused, want_resume, cancelled;
    void (*notify)(void *);
    bool (*client_gone)(void *);
    void *ctx;
    /* the thread's own */
    CURL *easy;
    struct curl_slist *headers;
    char *url, *body;
    size_t body_len;
    int connect_ms, first_byte_ms, total_ms;
    double t_start, retry_at;  /* kt_time_ms; retry_at 0: none pending */
    int attempts;
    bool in_multi;
    char errbuf[CURL_ERROR_SIZE];
    struct srv_fwd *next;
};

struct srv_upstream {
    pthread_t thread;
    CURLM *multi;
    pthread_mutex_t mu;        /* guards inbox and stopping */
    srv_fwd *inbox;
    bool stopping;
    srv_fwd *active;           /* the thread's */
};

/* ---- a transfer's life ---- */

static void wipe_headers(struct curl_slist *h) {
    for (struct curl_slist *p = h; p; p = p->next) memset(p->data, 0, strlen(p->data)); /* the key is in one */
    curl_slist_free_all(h);
}

static void fwd_free(srv_fwd *f) {
    if (f->easy) curl_easy_cleanup(f->easy);
    wipe_headers(f->headers);
    free(f->url), free(f->body), free(f->buf);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

static void drop_ref(srv_fwd *f) {
    pthread_mutex_lock(&f->mu);
    bool last = --f->refs == 0;
    pthread_mutex_unlock(&f->mu);
    if (last) fwd_free(f);
}

/* Under f->mu: tells the connection something changed. */
static void tell(srv_fwd *f) {
    if (f->notify) f->notify(f->ctx);
}

/* The transfer is over (out of the multi): records how, wakes the
 * connection, drops the thread's reference. */
static void finish(srv_fwd *f, srv_fwd_failure failure, const char *msg) {
    pthread_mutex_lock(&f->mu);
    f->u = NULL; /* the thread is done with it: nothing to wake for */
    if (!f->v.done) {
        f->v.done = true;
        if (!f->v.failure) f->v.failure = failure;
        if (failure && !f->v.error[0]) snprintf(f->v.error, sizeof f->v.error, "%s", msg);
    }
    tell(f);
    pthread_mutex_unlock(&f->mu);
    drop_ref(f);
}

/* ---- curl callbacks (the thread) ---- */

static bool buf_append(srv_fwd *f, const char *data, size_t n) {
    if (!n) return true;
    if (f->pos == f->len) f->pos = f->len = 0;
    if (f->len + n > f->cap && f->pos) { /* reuse the read part first */
        memmove(f->buf, f->buf + f->pos, f->len - f->pos);
        f->len -= f->pos, f->pos = 0;
    }
    if (f->len + n > f->cap) {
        size_t cap = f->cap ? f->cap : 16384;
        while (cap < f->len + n) cap *= 2;
        char *b = realloc(f->buf, cap);
        if (!b) return false;
        f->buf = b, f->cap = cap;
    }
    memcpy(f->buf + f->len, data, n);
    f->len += n;
    f->v.available = f->len - f->pos;
    return true;
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *ctx) {
    srv_fwd *f = ctx;
    size_t n = size * nmemb, r = n;
    pthread_mutex_lock(&f->mu);
    if (f->cancelled) r = 0;
    else if (f->v.streaming && f->len - f->pos >= PAUSE_AT) f->paused = true, r = CURL_WRITEFUNC_PAUSE;
    else if (!f->v.streaming && f->len - f->pos + n > GATHER_CAP) {
        f->v.failure = FWD_TOO_BIG;
        snprintf(f->v.error, sizeof f->v.error, "the upstream's answer is larger than %u MiB", GATHER_CAP >> 20);
        r = 0;
    } else if (!buf_append(f, data, n)) {
        f->v.failure = FWD_BROKEN;
        snprintf(f->v.error, sizeof f->v.error, "out of memory for the upstream's answer");
        r = 0;
    } else {
        tell(f);
    }
    pthread_mutex_unlock(&f->mu);
    return r;
}

/* "Name: value\r\n" -> value (trimmed) into out when the name matches. */
static void header_value(const char *line, size_t n, const char *name, char *out, size_t cap) {
    size_t k = strlen(name);
    if (n <= k + 1 || strncasecmp(line, name, k) || line[k] != ':') return;
    const char *v = line + k + 1;
    size_t m = n - k - 1;
    while (m && (*v == ' ' || *v == '\t')) v++, m--;
    while (m && (v[m - 1] == '\r' || v[m - 1] == '\n' || v[m - 1] == ' ')) m--;
    snprintf(out, cap, "%.*s", (int)m, v);
}

/* A header block ends with an empty line; 1xx blocks are not the answer. */
static void headers_done(srv_fwd *f) {
    long code = 0;
    curl_easy_getinfo(f->easy, CURLINFO_RESPONSE_CODE, &code);
    if (code < 200) return;
    f->v.status = (int)code;
    f->v.streaming = code < 300 && !strncasecmp(f->v.content_type, "text/event-stream", 17);
    tell(f);
}

static size_t on_header(char *data, size_t size, size_t nmemb, void *ctx) {
    srv_fwd *f = ctx;
    size_t n = size * nmemb;
    pthread_mutex_lock(&f->mu);
    if (n >= 5 && !strncmp(data, "HTTP/", 5)) /* a new block (after a 100 Continue) */
        f->v.content_type[0] = f->v.retry_after[0] = 0;
    else if (n <= 2 && (data[0] == '\r' || data[0] == '\n'))
        headers_done(f);
    header_value(data, n, "content-type", f->v.content_type, sizeof f->v.content_type);
    header_value(data, n, "retry-after", f->v.retry_after, sizeof f->v.retry_after);
    pthread_mutex_unlock(&f->mu);
    return n;
}

/* ---- the thread ---- */

static bool setup_easy(srv_fwd *f) {
    if (!(f->easy = curl_easy_init())) return false;
    CURL *e = f->easy;
    curl_easy_setopt(e, CURLOPT_URL, f->url);
    curl_easy_setopt(e, CURLOPT_POST, 1L);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, f->body);
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)f->body_len);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, f->headers);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)f->connect_ms);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)f->total_ms);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, f);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, f);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, f->errbuf);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_PRIVATE, f);
    return true;
}

static void add_to_multi(srv_upstream *u, srv_fwd *f) {
    f->attempts++, f->retry_at = 0, f->errbuf[0] = 0;
    f->in_multi = curl_multi_add_handle(u->multi, f->easy) == CURLM_OK;
}

static void remove_from_multi(srv_upstream *u, srv_fwd *f) {
    if (f->in_multi) curl_multi_remove_handle(u->multi, f->easy);
    f->in_multi = false;
}

/* Unlinks f from the active list. */
static void unlink_active(srv_upstream *u, srv_fwd *f) {
    for (srv_fwd **p = &u->active; *p; p = &(*p)->next)
        if (*p == f) {
            *p = f->next;
            return;
        }
}

static void end_transfer(srv_upstream *u, srv_fwd *f, srv_fwd_failure failure, const char *msg) {
    remove_from_multi(u, f);
    unlink_active(u, f);
    finish(f, failure, msg);
}

static void take_inbox(srv_upstream *u) {
    pthread_mutex_lock(&u->mu);
    srv_fwd *in = u->inbox;
    u->inbox = NULL;
    pthread_mutex_unlock(&u->mu);
    while (in) {
        srv_fwd *f = in;
        in = in->next;
        f->next = u->active, u->active = f;
        f->t_start = kt_time_ms();
        if (!setup_easy(f)) {
            end_transfer(u, f, FWD_BROKEN, "out of memory starting the upstream request");
            continue;
        }
        add_to_multi(u, f);
    }
}

/* What the connection side asked for, and the limits curl cannot keep:
 * cancellation, a client gone, the first-byte deadline, a due retry. */
static void check_active(srv_upstream *u) {
    double now = kt_time_ms();
    srv_fwd *next;
    for (srv_fwd *f = u->active; f; f = next) {
        next = f->next;
        pthread_mutex_lock(&f->mu);
        bool cancelled = f->cancelled || (f->client_gone && f->client_gone(f->ctx));
        bool resume = f->want_resume && !cancelled;
        bool late = !f->v.status && now - f->t_start > f->first_byte_ms;
        f->want_resume = false;
        if (resume) f->paused = false;
        pthread_mutex_unlock(&f->mu);
        if (cancelled) end_transfer(u, f, FWD_CANCELLED, "the client went away");
        else if (late)
            end_transfer(u, f, FWD_TIMEOUT, "the upstream sent no answer in time");
        else if (f->retry_at && now >= f->retry_at)
            add_to_multi(u, f);
        else if (resume)
            curl_easy_pause(f->easy, CURLPAUSE_CONT); /* may call on_body at once: not under f->mu */
    }
}

static srv_fwd_failure failure_of(CURLcode rc) {
    switch (rc) {
    case CURLE_OK: return FWD_OK;
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION: return FWD_CONNECT;
    case CURLE_OPERATION_TIMEDOUT: return FWD_TIMEOUT;
    default: return FWD_BROKEN;
    }
}

static void transfer_done(srv_upstream *u, srv_fwd *f, CURLcode rc) {
    remove_from_multi(u, f);
    pthread_mutex_lock(&f->mu);
    bool retry = rc == CURLE_COULDNT_CONNECT && f->attempts < 2 && !f->cancelled;
    pthread_mutex_unlock(&f->mu);
    if (retry) { /* refused: nothing was sent, so trying again cannot run the request twice */
        f->retry_at = kt_time_ms() + RETRY_DELAY_MS;
        return;
    }
    char msg[sizeof f->v.error];
    snprintf(msg, sizeof msg, "%s", f->errbuf[0] ? f->errbuf : curl_easy_strerror(rc));
    unlink_active(u, f);
    finish(f, failure_of(rc), msg);
}

static void read_messages(srv_upstream *u) {
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(u->multi, &left)))
        if (m->msg == CURLMSG_DONE) {
            srv_fwd *f = NULL;
            curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&f);
            if (f) transfer_done(u, f, m->data.result);
        }
}

static bool stopping(srv_upstream *u) {
    pthread_mutex_lock(&u->mu);
    bool s = u->stopping;
    pthread_mutex_unlock(&u->mu);
    return s;
}

static void *run(void *arg) {
    srv_upstream *u = arg;
    while (!stopping(u)) {
        take_inbox(u);
        check_active(u);
        int running = 0;
        curl_multi_perform(u->multi, &running);
        read_messages(u);
        /* short while transfers run: deadlines and departed clients are checked here */
        curl_multi_poll(u->multi, NULL, 0, u->active ? 100 : 1000, NULL);
    }
    take_inbox(u);
    while (u->active) end_transfer(u, u->active, FWD_CANCELLED, "the server is stopping");
    return NULL;
}

/* ---- the interface ---- */

srv_upstream *srv_upstream_new(kt_error *err) {
    srv_upstream *u = calloc(1, sizeof *u);
    if (!u || curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK || !(u->multi = curl_multi_init())) {
        snprintf(err->msg, sizeof err->msg, "cannot start the fallback upstream's HTTP client (out of memory?)");
        err->status = KT_ERR_NOMEM;
        if (u) free(u);
        return NULL;
    }
    pthread_mutex_init(&u->mu, NULL);
    if (pthread_create(&u->thread, NULL, run, u)) {
        snprintf(err->msg, sizeof err->msg, "cannot start the fallback upstream's thread");
        err->status = KT_ERR_NOMEM;
        curl_multi_cleanup(u->multi);
        pthread_mutex_destroy(&u->mu);
        free(u);
        return NULL;
    }
    return u;
}

void srv_upstream_free(srv_upstream *u) {
    if (!u) return;
    pthread_mutex_lock(&u->mu);
    u->stopping = true;
    pthread_mutex_unlock(&u->mu);
    curl_multi_wakeup(u->multi);
    pthread_join(u->thread, NULL);
    curl_multi_cleanup(u->multi);
    pthread_mutex_destroy(&u->mu);
    free(u);
}

static struct curl_slist *copy_headers(const srv_fwd_request *rq) {
    struct curl_slist *h = NULL;
    for (int i = 0; i < rq->n_headers; i++) {
        struct curl_slist *n = curl_slist_append(h, rq->headers[i]);
        if (!n) return wipe_headers(h), NULL;
        h = n;
    }
    return h;
}

srv_fwd *srv_fwd_start(srv_upstream *u, const srv_fwd_request *rq) {
    srv_fwd *f = calloc(1, sizeof *f);
    if (!f) return NULL;
    pthread_mutex_init(&f->mu, NULL);
    f->refs = 2, f->u = u;
    f->notify = rq->notify, f->client_gone = rq->client_gone, f->ctx = rq->ctx;
    f->connect_ms = rq->connect_ms, f->first_byte_ms = rq->first_byte_ms, f->total_ms = rq->total_ms;
    f->url = strdup(rq->url);
    f->body = malloc(rq->body_len + 1);
    f->headers = copy_headers(rq);
    if (!f->url || !f->body || (rq->n_headers && !f->headers)) return fwd_free(f), NULL;
    memcpy(f->body, rq->body, rq->body_len);
    f->body[rq->body_len] = 0, f->body_len = rq->body_len;
    pthread_mutex_lock(&u->mu);
    bool ok = !u->stopping;
    if (ok) f->next = u->inbox, u->inbox = f;
    pthread_mutex_unlock(&u->mu);
    if (!ok) return fwd_free(f), NULL;
    curl_multi_wakeup(u->multi);
    return f;
}

void srv_fwd_peek(srv_fwd *f, srv_fwd_view *v) {
    pthread_mutex_lock(&f->mu);
    *v = f->v;
    pthread_mutex_unlock(&f->mu);
}

size_t srv_fwd_read(srv_fwd *f, char *buf, size_t max) {
    pthread_mutex_lock(&f->mu);
    size_t n = f->len - f->pos < max ? f->len - f->pos : max;
    if (n) memcpy(buf, f->buf + f->pos, n); /* no body yet: buf may be NULL */
    f->pos += n;
    f->v.available = f->len - f->pos;
    /* a paused stream goes on once the client has taken most of it */
    if (f->paused && !f->want_resume && f->v.available < PAUSE_AT / 4 && f->u) {
        f->want_resume = true;
        curl_multi_wakeup(f->u->multi);
    }
    pthread_mutex_unlock(&f->mu);
    return n;
}

void srv_fwd_release(srv_fwd *f) {
    if (!f) return;
    pthread_mutex_lock(&f->mu);
    f->cancelled = true;
    f->notify = NULL, f->client_gone = NULL; /* the link goes back to its pool */
    bool last = --f->refs == 0;
    if (!last && f->u) curl_multi_wakeup(f->u->multi); /* under mu: the multi outlives every held transfer */
    pthread_mutex_unlock(&f->mu);
    if (last) fwd_free(f);
}
