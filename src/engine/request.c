/*
 * request.c - the client's side of a generation request: copying what
 * was asked, the event FIFO the engine fills and the client drains, and
 * the two-owner lifetime (see request.h).
 */
#include "engine/request.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"

static char *dup_bytes(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) memcpy(d, s, n), d[n] = 0;
    return d;
}

static void req_free_memory(kt_request *r) {
    if (!r) return;
    for (int i = 0; i < r->ev_len; i++) free(r->events[(r->ev_head + i) % r->ev_cap].text);
    free(r->events);
    free(r->client_text);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->prompt);
    req_images_release(&r->images, NULL); /* the engine dropped its pins when it retired it */
    free(r->bias);
    free(r->embd);
    kt_grammar_free(r->grammar);
    eng_triggers_free(&r->triggers);
    free(r->choices);
    pthread_mutex_destroy(&r->mu);
    pthread_mutex_destroy(&r->notify_mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

kt_request *req_new(const kt_gen_params *p, kt_error *err) {
    kt_request *r = calloc(1, sizeof *r);
    if (!r) goto nomem;
    pthread_mutex_init(&r->mu, NULL);
    pthread_mutex_init(&r->notify_mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->refs = 2; /* the client's and the engine's */
    r->n_prompt = p->n_prompt;
    r->max_tokens = p->max_tokens;
    r->n_choices = p->n_choices;
    r->top_logprobs = p->top_logprobs;
    r->priority = p->priority;
    r->sampling = p->sampling;
    r->ignore_eos = p->ignore_eos;
    r->prefill_only = p->prefill_only;
    r->embed = p->embed;
    r->notify = p->notify;
    r->client_gone = p->client_gone;
    r->notify_ctx = p->notify_ctx;
    r->usage.prompt_tokens = p->n_prompt;
    if (!(r->prompt = malloc(sizeof(int32_t) * (size_t)p->n_prompt))) goto nomem;
    memcpy(r->prompt, p->prompt, sizeof(int32_t) * (size_t)p->n_prompt);
    for (int i = 0; i < p->n_stop; i++) {
        r->stop_len[i] = strlen(p->stop[i]);
        if (!(r->stop[i] = dup_bytes(p->stop[i], r->stop_len[i]))) goto nomem;
        r->n_stop = i + 1;
    }
    if (p->n_logit_bias > 0) {
        if (!(r->bias = malloc(sizeof *r->bias * (size_t)p->n_logit_bias))) goto nomem;
        memcpy(r->bias, p->logit_bias, sizeof *r->bias * (size_t)p->n_logit_bias);
        r->n_bias = p->n_logit_bias;
    }
    if (!(r->choices = calloc((size_t)p->n_choices, sizeof *r->choices))) goto nomem;
    return r;
nomem:
    req_free_memory(r);
    kt_error_set(err, KT_ERR_NOMEM, "out of memory queuing a request");
    return NULL;
}

_Static_assert(KT_MAX_CHOICES <= 32, "finish_queued and finish_lost are bit sets of choices");

/* An event was dropped (mu held): the rest will be too. */
static bool lose_locked(kt_request *r) {
    r->lost = true;
    pthread_cond_broadcast(&r->cv);
    r->events_pending = true;
    return false;
}

bool req_push(kt_request *r, const kt_event *ev) {
    char *text = dup_bytes(ev->text ? ev->text : "", ev->text ? ev->text_len : 0);
    pthread_mutex_lock(&r->mu);
    if (!text || r->lost) {
        free(text);
        bool ok = lose_locked(r);
        pthread_mutex_unlock(&r->mu);
        return ok;
    }
    if (r->ev_len == r->ev_cap) {
        int cap = r->ev_cap ? 2 * r->ev_cap : 16;
        queued_event *q = malloc(sizeof *q * (size_t)cap);
        if (!q) {
            bool ok = lose_locked(r);
            pthread_mutex_unlock(&r->mu);
            free(text);
            return ok;
        }
        for (int i = 0; i < r->ev_len; i++) q[i] = r->events[(r->ev_head + i) % r->ev_cap];
        free(r->events);
        r->events = q, r->ev_cap = cap, r->ev_head = 0;
    }
    queued_event *slot = &r->events[(r->ev_head + r->ev_len) % r->ev_cap];
    slot->ev = *ev;
    slot->text = text;
    slot->ev.text = text;
    r->ev_len++;
    if (ev->finish != KT_FINISH_NONE && ev->choice >= 0 && ev->choice < 32) r->finish_queued |= 1u << ev->choice;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    r->events_pending = true;
    return true;
}

void req_finish(kt_request *r) {
    pthread_mutex_lock(&r->mu);
    r->done = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    r->events_pending = true;
}

void req_notify(kt_request *r) {
    if (!r->events_pending) return;
    r->events_pending = false;
    pthread_mutex_lock(&r->notify_mu);
    if (r->notify) r->notify(r->notify_ctx);
    pthread_mutex_unlock(&r->notify_mu);
}

bool req_client_gone(kt_request *r) {
    pthread_mutex_lock(&r->notify_mu);
    bool gone = r->client_gone && r->client_gone(r->notify_ctx);
    pthread_mutex_unlock(&r->notify_mu);
    return gone;
}

void req_release(kt_request *r) {
    pthread_mutex_lock(&r->mu);
    bool last = --r->refs == 0;
    pthread_mutex_unlock(&r->mu);
    if (last) req_free_memory(r);
}

/* After the queued events of a lost request: an error end for the next
 * choice whose end was not queued, from no memory; 0 when none is left. */
static int lost_end_locked(kt_request *r, kt_event *ev) {
    for (int i = 0; i < r->n_choices && i < 32; i++) {
        if ((r->finish_queued | r->finish_lost) & (1u << i)) continue;
        r->finish_lost |= 1u << i;
        *ev = (kt_event){.choice = i, .token = -1, .text = "", .finish = KT_FINISH_ERROR};
        snprintf(ev->error, sizeof ev->error, "out of memory: the engine could not hand over this reply's text");
        return 1;
    }
    return 0;
}

/* Pops the oldest event into *ev (mu held); its text now belongs to the
 * client until the next pop. */
static int pop_locked(kt_request *r, kt_event *ev) {
    if (r->ev_len == 0 && r->lost && lost_end_locked(r, ev)) return 1;
    if (r->ev_len == 0) return r->done ? -1 : 0;
    queued_event *q = &r->events[r->ev_head];
    free(r->client_text);
    r->client_text = q->text;
    *ev = q->ev;
    r->ev_head = (r->ev_head + 1) % r->ev_cap;
    r->ev_len--;
    return 1;
}

int kt_request_poll(kt_request *r, kt_event *ev) {
    pthread_mutex_lock(&r->mu);
    int rc = pop_locked(r, ev);
    pthread_mutex_unlock(&r->mu);
    return rc;
}

int kt_request_wait(kt_request *r, kt_event *ev, int timeout_ms) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    if (timeout_ms > 0) {
        until.tv_sec += timeout_ms / 1000;
        until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&r->mu);
    int rc;
    while ((rc = pop_locked(r, ev)) == 0 && timeout_ms != 0) {
        if (timeout_ms < 0) pthread_cond_wait(&r->cv, &r->mu);
        else if (pthread_cond_timedwait(&r->cv, &r->mu, &until) != 0) break;
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

void kt_request_cancel(kt_request *r) {
    if (r) atomic_store(&r->cancel, true);
}

kt_request_usage kt_request_get_usage(kt_request *r) {
    pthread_mutex_lock(&r->mu);
    kt_request_usage u = r->usage;
    pthread_mutex_unlock(&r->mu);
    return u;
}

const float *kt_request_embedding(kt_request *r, int *n) {
    pthread_mutex_lock(&r->mu);
    const bool done = r->embd_done;
    pthread_mutex_unlock(&r->mu);
    *n = done ? r->n_embd : 0;
    return done ? r->embd : NULL;
}

void kt_request_free(kt_request *r) {
    if (!r) return;
    kt_request_cancel(r);
    pthread_mutex_lock(&r->notify_mu);
    r->notify = NULL;
    r->client_gone = NULL;
    pthread_mutex_unlock(&r->notify_mu);
    req_release(r);
}
