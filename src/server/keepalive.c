/*
 * keepalive.c - keep-alives on quiet streams (--sse-keepalive-ms).
 *
 * A streamed reply can go quiet for long: queued behind other requests,
 * prefilling a long prompt, or between two tokens of a slow step. Clients
 * and proxies with an idle timeout drop such a stream (Claude Code gives
 * up after 300 s without a byte and retries without streaming; others
 * wait far less). A quiet stream's connection is suspended (gen.c), and
 * libmicrohttpd polls no suspended connection, so no MHD thread ever
 * notices the silence. This thread does: it sleeps until the first moment
 * a suspended stream will have been quiet for the interval, then resumes
 * every stream that has, with the link's `keepalive_due` set; the stream's
 * content reader finds no event, sees the flag (srv_link_arm) and sends
 * its API's keep-alive (srv_dialect.stream_keepalive), then suspends
 * again, quiet from then on.
 *
 * Flowing streams cost next to nothing: one clock read at each suspend,
 * where a stream moves its own quiet_since_ms forward; it signals the
 * thread only when it is due before the thread means to wake, which
 * happens only when the thread sleeps with no stream to watch. Otherwise
 * the thread wakes at most once per interval while any stream is
 * suspended (flowing ones are, between tokens), finds the flowing ones not
 * due, and sleeps again.
 *
 * Locking: all of it is under the server's link_mu (the thread waits on
 * keepalive_cv with it), and MHD_resume_connection takes MHD's own lock
 * inside, the order of every link path (notify_mu -> link_mu -> MHD's);
 * the thread never touches a kt_request. It resumes only a link that has
 * a connection (mc, cleared under link_mu by srv_link_release from the
 * request-completed callback) and is suspended, so never a connection
 * MHD has finished with; srv_stop joins it before MHD_stop_daemon.
 */
#include <time.h>

#include "base/timing.h"
#include "server/http_internal.h"

/* Resumes every suspended stream quiet for the interval by `now`, due a
 * keep-alive; returns when the next of the others will be (0: no stream
 * is suspended). Under link_mu. */
static double resume_quiet(srv_server *s, double now) {
    const double interval_ms = s->cfg.sse_keepalive_ms;
    double next = 0;
    for (srv_link *l = s->all_links; l; l = l->next_all) {
        if (!l->mc || !l->suspended || !l->quiet_since_ms) continue; /* free, running, or not a stream */
        double due = l->quiet_since_ms + interval_ms;
        if (due <= now) {
            l->keepalive_due = true, l->suspended = false;
            MHD_resume_connection(l->mc);
        } else if (!next || due < next) {
            next = due;
        }
    }
    return next;
}

/* kt_time_ms's clock (CLOCK_MONOTONIC, keepalive_cv's) at ms. */
static struct timespec at_ms(double ms) {
    struct timespec t = {.tv_sec = (time_t)(ms / 1000.0)};
    long ns = (long)((ms - (double)t.tv_sec * 1000.0) * 1e6);
    t.tv_nsec = ns < 0 ? 0 : ns > 999999999L ? 999999999L : ns;
    return t;
}

static void *keepalive_main(void *arg) {
    srv_server *s = arg;
    pthread_mutex_lock(&s->link_mu);
    while (!s->keepalive_stop) {
        double next = resume_quiet(s, kt_time_ms());
        s->keepalive_wake_ms = next; /* a stream suspending due before it signals (gen.c, keepalive_plan) */
        if (next) {
            struct timespec until = at_ms(next);
            pthread_cond_timedwait(&s->keepalive_cv, &s->link_mu, &until);
        } else {
            pthread_cond_wait(&s->keepalive_cv, &s->link_mu);
        }
    }
    pthread_mutex_unlock(&s->link_mu);
    return NULL;
}

bool srv_keepalive_init(srv_server *s) {
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&s->keepalive_cv, &attr);
    pthread_condattr_destroy(&attr);
    if (s->cfg.sse_keepalive_ms <= 0) return true;
    s->keepalive_joinable = pthread_create(&s->keepalive, NULL, keepalive_main, s) == 0;
    return s->keepalive_joinable;
}

void srv_keepalive_stop(srv_server *s) {
    pthread_mutex_lock(&s->link_mu);
    s->keepalive_stop = true;
    pthread_cond_signal(&s->keepalive_cv);
    pthread_mutex_unlock(&s->link_mu);
    if (s->keepalive_joinable) pthread_join(s->keepalive, NULL), s->keepalive_joinable = false;
}

void srv_keepalive_destroy(srv_server *s) {
    pthread_cond_destroy(&s->keepalive_cv);
}
