/*
 * deadline.c - slow clients cut (see deadline.h).
 *
 * Each connection's entry lives from MHD's STARTED notification to its
 * CLOSED one, in a list under one mutex. libmicrohttpd's cleanup calls
 * CLOSED before it closes the socket, and the cutting thread shuts a
 * socket down only under that mutex, so it does not touch a descriptor
 * MHD has closed; in case a version orders it otherwise (or fails a
 * connection without CLOSED), the peer address is compared before the
 * shutdown, so a reused descriptor of another client is left alone.
 */
#include "server/deadline.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "base/timing.h"

#define TICK_MS 100 /* how often late connections are looked for: the cut comes at most this late */

typedef struct conn_entry {
    int fd;
    struct sockaddr_storage peer;
    socklen_t peer_len;
    double due_ms;   /* its request must be in whole by then (kt_time_ms); 0: it is, being answered */
    bool cut;        /* shut down for passing due_ms */
    struct srv_deadlines *d;
    struct conn_entry *prev, *next;
} conn_entry;

struct srv_deadlines {
    double timeout_ms;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    pthread_t thread;
    conn_entry *head;
    unsigned long long n_cut;
};

static bool same_peer(const conn_entry *c) {
    struct sockaddr_storage now;
    socklen_t len = sizeof now;
    return !getpeername(c->fd, (struct sockaddr *)&now, &len) && len == c->peer_len && !memcmp(&now, &c->peer, len);
}

/* Shuts down every late connection's socket (under d->mu). */
static void cut_late(struct srv_deadlines *d, double now) {
    for (conn_entry *c = d->head; c; c = c->next) {
        if (c->cut || !c->due_ms || now < c->due_ms || !same_peer(c)) continue;
        shutdown(c->fd, SHUT_RDWR);
        c->cut = true;
        d->n_cut++;
    }
}

static void *cutter(void *arg) {
    struct srv_deadlines *d = arg;
    pthread_mutex_lock(&d->mu);
    while (!d->stop) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += TICK_MS * 1000000L;
        if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&d->cv, &d->mu, &until);
        cut_late(d, kt_time_ms());
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

srv_deadlines *srv_deadlines_new(int timeout_s, kt_error *err) {
    struct srv_deadlines *d = calloc(1, sizeof *d);
    if (!d) return kt_error_set(err, KT_ERR_NOMEM, "out of memory"), NULL;
    d->timeout_ms = timeout_s * 1000.0;
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&d->cv, &attr);
    pthread_condattr_destroy(&attr);
    pthread_mutex_init(&d->mu, NULL);
    if (pthread_create(&d->thread, NULL, cutter, d)) {
        pthread_cond_destroy(&d->cv), pthread_mutex_destroy(&d->mu), free(d);
        return kt_error_set(err, KT_ERR_NOMEM, "cannot start the thread that times out slow clients"), NULL;
    }
    return d;
}

void srv_deadlines_free(srv_deadlines *d) {
    if (!d) return;
    pthread_mutex_lock(&d->mu);
    d->stop = true;
    pthread_cond_signal(&d->cv);
    pthread_mutex_unlock(&d->mu);
    pthread_join(d->thread, NULL);
    while (d->head) { /* none should be left once the daemon stopped */
        conn_entry *c = d->head;
        d->head = c->next;
        free(c);
    }
    pthread_cond_destroy(&d->cv);
    pthread_mutex_destroy(&d->mu);
    free(d);
}

static void track(struct srv_deadlines *d, struct MHD_Connection *mc, void **socket_context) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    conn_entry *c = ci ? calloc(1, sizeof *c) : NULL;
    if (!c) return; /* untracked: MHD's inactivity timeout still holds it */
    c->fd = ci->connect_fd, c->d = d, c->peer_len = sizeof c->peer;
    if (getpeername(c->fd, (struct sockaddr *)&c->peer, &c->peer_len)) c->peer_len = 0;
    pthread_mutex_lock(&d->mu);
    c->due_ms = kt_time_ms() + d->timeout_ms;
    c->next = d->head;
    if (d->head) d->head->prev = c;
    d->head = c;
    pthread_mutex_unlock(&d->mu);
    *socket_context = c;
}

static void untrack(conn_entry *c) {
    struct srv_deadlines *d = c->d;
    pthread_mutex_lock(&d->mu);
    if (c->prev) c->prev->next = c->next;
    else d->head = c->next;
    if (c->next) c->next->prev = c->prev;
    pthread_mutex_unlock(&d->mu);
    free(c);
}

void srv_deadline_notify(void *cls, struct MHD_Connection *mc, void **socket_context,
                         enum MHD_ConnectionNotificationCode code) {
    if (code == MHD_CONNECTION_NOTIFY_STARTED) track(cls, mc, socket_context);
    else if (code == MHD_CONNECTION_NOTIFY_CLOSED && *socket_context) untrack(*socket_context), *socket_context = NULL;
}

static conn_entry *entry_of(struct MHD_Connection *mc) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

void srv_deadline_received(struct MHD_Connection *mc) {
    conn_entry *c = entry_of(mc);
    if (!c) return;
    pthread_mutex_lock(&c->d->mu);
    c->due_ms = 0;
    pthread_mutex_unlock(&c->d->mu);
}

void srv_deadline_restart(struct MHD_Connection *mc) {
    conn_entry *c = entry_of(mc);
    if (!c) return;
    pthread_mutex_lock(&c->d->mu);
    c->due_ms = kt_time_ms() + c->d->timeout_ms;
    pthread_mutex_unlock(&c->d->mu);
}

bool srv_deadline_passed(struct MHD_Connection *mc) {
    conn_entry *c = entry_of(mc);
    if (!c) return false;
    pthread_mutex_lock(&c->d->mu);
    bool late = c->cut || (c->due_ms && kt_time_ms() >= c->due_ms);
    pthread_mutex_unlock(&c->d->mu);
    return late;
}

unsigned long long srv_deadlines_cut(srv_deadlines *d) {
    pthread_mutex_lock(&d->mu);
    unsigned long long n = d->n_cut;
    pthread_mutex_unlock(&d->mu);
    return n;
}
