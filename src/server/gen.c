/*
 * gen.c - generation requests over HTTP: validate, tokenize, submit to the
 * engine, and hand the events to the client without ever blocking an MHD
 * thread.
 *
 * The wait is a suspend/resume handshake on the connection's srv_link:
 *
 *   MHD thread                          engine thread (notify)
 *   lock; notified = false; unlock      lock; notified = true;
 *   poll every ready event              if suspended: suspended = false,
 *   nothing? lock;                          MHD_resume_connection
 *     notified? -> poll again           unlock
 *     else suspended = true,
 *          MHD_suspend_connection
 *   unlock
 *
 * An event queued between the poll and the suspend sets `notified`, so the
 * connection polls again instead of sleeping through it. Streaming replies
 * suspend from MHD's content-reader callback (returning 0 bytes), others
 * from the access handler; MHD calls either again after the resume.
 *
 * A client that goes away must stop its request within one engine step,
 * at any stage. MHD sees a disconnect only on a connection it polls, and a
 * suspended one (waiting in the queue, during prefill, between tokens) is
 * not polled; so the engine asks srv_link_client_gone before every step,
 * which peeks at the socket (MSG_PEEK: nothing is consumed) for the
 * peer's end of stream or a reset. The engine then cancels the request and
 * notifies; the resumed connection lets MHD see the close and call the
 * request-completed callback, which (through srv_gen_release) frees the
 * engine request.
 *
 * A stream that has nothing to send for --sse-keepalive-ms is resumed by
 * the keep-alive thread (keepalive.c) with `keepalive_due` set, found by
 * srv_link_arm; stream_read then sends its API's keep-alive instead of
 * events and suspends again.
 *
 * Lock order: the engine calls srv_link_notify and srv_link_client_gone
 * with the request's notify_mu held; they take link_mu, then
 * MHD_resume_connection takes MHD's own (the keep-alive thread takes
 * link_mu, then MHD's). Nothing here calls into a kt_request while
 * holding link_mu.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "base/error.h"
#include "base/timing.h"
#include "server/http_internal.h"
#include "server/results.h"
#include "server/sampled.h"

/* ---- links ---- */

srv_link *srv_link_acquire(srv_server *s, struct MHD_Connection *mc) {
    pthread_mutex_lock(&s->link_mu);
    srv_link *l = s->free_links;
    if (l) s->free_links = l->next_free;
    else if ((l = calloc(1, sizeof *l))) l->s = s, l->next_all = s->all_links, s->all_links = l;
    if (l) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        l->mc = mc, l->fd = ci ? ci->connect_fd : -1;
        l->suspended = false, l->notified = false, s->n_links_used++;
        l->quiet_since_ms = 0, l->keepalive_due = false;
    }
    pthread_mutex_unlock(&s->link_mu);
    return l;
}

void srv_link_release(srv_link *l) {
    srv_server *s = l->s;
    pthread_mutex_lock(&s->link_mu);
    l->mc = NULL, l->fd = -1, l->suspended = false;
    l->next_free = s->free_links, s->free_links = l;
    s->n_links_used--;
    pthread_mutex_unlock(&s->link_mu);
}

void srv_link_notify(void *ctx) {
    srv_link *l = ctx;
    pthread_mutex_lock(&l->s->link_mu);
    l->notified = true;
    if (l->suspended && l->mc) {
        l->suspended = false;
        MHD_resume_connection(l->mc);
    }
    pthread_mutex_unlock(&l->s->link_mu);
}

/* The peer closed or reset the connection. Data waiting to be read (a
 * pipelined request) means it is still there. */
static bool socket_closed(int fd) {
    char b;
    ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0) return false;
    if (n == 0) return true;
    return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

bool srv_link_client_gone(void *ctx) {
    srv_link *l = ctx;
    pthread_mutex_lock(&l->s->link_mu);
    bool gone = l->mc && l->fd >= 0 && socket_closed(l->fd);
    pthread_mutex_unlock(&l->s->link_mu);
    return gone;
}

bool srv_link_arm(srv_link *l) {
    pthread_mutex_lock(&l->s->link_mu);
    bool keepalive = l->keepalive_due;
    l->notified = false, l->keepalive_due = false;
    pthread_mutex_unlock(&l->s->link_mu);
    return keepalive;
}

/* Tells the keep-alive thread when a stream that just suspended is due,
 * if that is before it means to wake (it sleeps until signalled when no
 * stream is suspended). Flowing streams are due after that, so they never
 * wake it. Under link_mu. */
static void keepalive_plan(srv_server *s, double quiet_since_ms) {
    if (s->cfg.sse_keepalive_ms <= 0 || !quiet_since_ms) return;
    double due = quiet_since_ms + s->cfg.sse_keepalive_ms;
    if (s->keepalive_wake_ms && s->keepalive_wake_ms <= due) return;
    s->keepalive_wake_ms = due;
    pthread_cond_signal(&s->keepalive_cv);
}

/* Suspends the connection unless news came since link_arm; a stream's
 * (quiet_since_ms > 0) keep-alive is planned. */
static srv_wait suspend(srv_link *l, double quiet_since_ms) {
    srv_wait r = WAIT_SUSPENDED;
    srv_server *s = l->s;
    pthread_mutex_lock(&s->link_mu);
    if (s->shutting) r = WAIT_SHUTDOWN;
    else if (l->notified) r = WAIT_RETRY;
    else {
        l->suspended = true, l->quiet_since_ms = quiet_since_ms;
        MHD_suspend_connection(l->mc);
        keepalive_plan(s, quiet_since_ms);
    }
    pthread_mutex_unlock(&s->link_mu);
    return r;
}

srv_wait srv_link_suspend(srv_link *l) {
    return suspend(l, 0);
}

srv_wait srv_link_suspend_stream(srv_link *l, double quiet_since_ms) {
    return suspend(l, quiet_since_ms);
}

void srv_links_wake_all(srv_server *s) {
    pthread_mutex_lock(&s->link_mu);
    s->shutting = true;
    for (srv_link *l = s->all_links; l; l = l->next_all)
        if (l->suspended && l->mc) l->suspended = false, MHD_resume_connection(l->mc);
    pthread_mutex_unlock(&s->link_mu);
}

bool srv_links_idle(srv_server *s) {
    pthread_mutex_lock(&s->link_mu);
    bool idle = s->n_links_used == 0;
    pthread_mutex_unlock(&s->link_mu);
    return idle;
}

void srv_links_free(srv_server *s) {
    while (s->all_links) {
        srv_link *next = s->all_links->next_all;
        free(s->all_links);
        s->all_links = next;
    }
    s->free_links = NULL;
}

/* ---- events ---- */

/* A chunk into the stream: as it is, or through the dialect's
 * translation (steals chunk). */
static bool emit(srv_conn *c, json_t *chunk) {
    if (!c->xlate) return srv_buf_sse(&c->out, chunk);
    return chunk && c->dialect->stream_chunk(c->xlate, chunk, &c->out);
}

static bool sse_error(srv_conn *c, const char *msg) {
    if (c->xlate) return c->dialect->stream_error(c->xlate, msg, &c->out);
    srv_buf *out = &c->out;
    srv_error e;
    srv_fail(&e, 500, "server_error", NULL, NULL, "%s", msg[0] ? msg : "the engine failed");
    char *j = srv_error_json(&e);
    bool ok = j && srv_buf_append(out, "data: ", 6) && srv_buf_append(out, j, strlen(j)) && srv_buf_append(out, "\n\n", 2);
    free(j);
    return ok;
}

/* One event as stream chunks: the delta, then the finish chunk (and an
 * error object when the engine failed). */
static bool stream_event(srv_conn *c, const kt_event *ev) {
    bool iu = c->gen.include_usage;
    json_t *chunks;
    if (!srv_chunk_event(&c->reply, ev, iu, &chunks)) return false;
    size_t i;
    json_t *j;
    bool ok = true;
    json_array_foreach(chunks, i, j) ok = ok && emit(c, json_incref(j));
    json_decref(chunks);
    if (!ok) return false;
    if (ev->finish == KT_FINISH_NONE) return true;
    if (!emit(c, srv_chunk_finish(&c->reply, ev->choice, ev->finish, iu))) return false;
    return ev->finish != KT_FINISH_ERROR || sse_error(c, ev->error);
}

/* Takes every ready event: 1 when the request is finished, 0 when more
 * will come, -1 out of memory (the stream bytes of the event that failed
 * are taken back, so what is left in c->out is whole events). */
static int drain(srv_conn *c) {
    kt_event ev;
    int r;
    while ((r = kt_request_poll(c->req, &ev)) == 1) {
        size_t mark = c->out.len;
        bool ok = c->gen.stream ? srv_reply_track(&c->reply, &ev) && stream_event(c, &ev)
                                : srv_reply_add(&c->reply, &ev);
        if (!ok) {
            c->out.len = mark;
            return -1;
        }
    }
    if (r < 0) {
        srv_reply_remember(&c->reply, c->cls->sampled);
        if (c->result_cacheable) {
            kt_request_usage u = kt_request_get_usage(c->req);
            srv_results_put(c->cls->results, c->result_key, &c->reply, &u);
        }
    }
    return r < 0 ? 1 : 0;
}

/* How a stream that ran out of memory ends: from static memory, since
 * nothing more can be allocated, so the client always sees why its text
 * stopped (OpenAI's error shape, then [DONE]). */
static const char STREAM_OOM_END[] =
    "data: {\"error\":{\"message\":\"the server ran out of memory while streaming this reply; the text "
    "so far is incomplete\",\"type\":\"server_error\",\"param\":null,\"code\":\"out_of_memory\"}}\n\n"
    "data: [DONE]\n\n";

/* What a quiet chat or completions stream sends (--sse-keepalive-ms): an
 * SSE comment, which every SSE parser skips; the other APIs say theirs in
 * srv_dialect.stream_keepalive. */
static const char STREAM_KEEPALIVE[] = ": keep-alive\n\n";

/* The stream's keep-alive into c->out: its API's, or the comment while a
 * dialect's stream has not begun (an event there would come before the
 * stream's opening one, e.g. a ping before message_start). Out of memory
 * it is skipped, and the stream counts as having just sent, so the next
 * try comes one interval later rather than at once. */
static void stream_keepalive(srv_conn *c) {
    const srv_dialect *d = c->dialect;
    const bool begun = d && (!d->stream_begun || d->stream_begun(c->xlate));
    const char *ka = begun ? d->stream_keepalive : STREAM_KEEPALIVE;
    if (!srv_buf_append(&c->out, ka, strlen(ka))) c->out_fresh = true;
}

/* Copies what is left of a static stream ending into MHD's buffer. */
static ssize_t stream_tail(srv_conn *c, char *buf, size_t max) {
    const char *end = c->dialect ? c->dialect->stream_oom_end : STREAM_OOM_END;
    size_t left = strlen(end) - c->tail_pos;
    if (left == 0) return MHD_CONTENT_READER_END_OF_STREAM;
    size_t n = left < max ? left : max;
    memcpy(buf, end + c->tail_pos, n);
    c->tail_pos += n;
    return (ssize_t)n;
}

static bool stream_end_with(srv_conn *c, const kt_request_usage *u) {
    if (c->xlate) return c->dialect->stream_end(c->xlate, u, &c->out);
    if (c->gen.include_usage && !srv_buf_sse(&c->out, srv_chunk_usage(&c->reply, u))) return false;
    return srv_buf_append(&c->out, "data: [DONE]\n\n", 14);
}

static bool stream_end(srv_conn *c) {
    kt_request_usage u = kt_request_get_usage(c->req);
    return stream_end_with(c, &u);
}

/* MHD's content reader for a stream: bytes ready, or suspend until the
 * engine has more (or the stream is due a keep-alive). */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    srv_conn *c = cls;
    for (;;) {
        if (c->out_pos < c->out.len) {
            size_t n = c->out.len - c->out_pos < max ? c->out.len - c->out_pos : max;
            memcpy(buf, c->out.data + c->out_pos, n);
            c->out_pos += n;
            c->out_fresh = true;
            return (ssize_t)n;
        }
        c->out.len = c->out_pos = 0;
        if (c->stream_failed) return stream_tail(c, buf, max);
        if (c->stream_done) return MHD_CONTENT_READER_END_OF_STREAM;
        bool keepalive = srv_link_arm(c->link);
        int r = drain(c);
        size_t mark = c->out.len;
        if (r == 1 && !stream_end(c)) c->out.len = mark, r = -1;
        if (r < 0) {
            /* the whole events before the failure go out first */
            kt_request_cancel(c->req);
            c->stream_failed = true;
            continue;
        }
        if (r == 1) {
            c->stream_done = true;
            continue;
        }
        if (!c->out.len && keepalive) stream_keepalive(c); /* quiet for the interval: events would have done */
        if (c->out.len) continue;
        /* MHD asks for more once it has room, so the bytes handed to it
         * last are on their way: the quiet starts now */
        if (c->out_fresh) c->quiet_since_ms = kt_time_ms(), c->out_fresh = false;
        srv_wait w = srv_link_suspend_stream(c->link, c->quiet_since_ms);
        if (w == WAIT_SUSPENDED) return 0;
        if (w == WAIT_SHUTDOWN) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

/* ---- starting ---- */

static uint64_t mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static uint64_t fresh_random(srv_server *s) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    unsigned long long n = __atomic_fetch_add(&s->n_requests, 1, __ATOMIC_RELAXED);
    return mix64((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ mix64(n));
}

static kt_gen_params gen_params(const srv_gen_req *g, const int32_t *ids, int n, srv_link *link) {
    kt_gen_params p = kt_gen_defaults();
    p.prompt = ids, p.n_prompt = n;
    p.max_tokens = g->max_tokens, p.n_choices = g->n_choices, p.sampling = g->sampling;
    p.stop = g->stop, p.n_stop = g->n_stop, p.top_logprobs = g->top_logprobs;
    p.logit_bias = g->logit_bias, p.n_logit_bias = g->n_logit_bias, p.priority = g->priority;
    p.ignore_eos = g->ignore_eos;
    p.prefill_only = g->prefill_only;
    p.grammar = g->grammar, p.grammar_len = g->grammar ? strlen(g->grammar) : 0;
    const kt_tool_grammar *tg = &g->tools_grammar;
    if (tg->n_triggers) { /* tools: their grammar (with response_format's inside it under auto) */
        p.grammar = tg->grammar, p.grammar_len = tg->grammar ? strlen(tg->grammar) : 0;
        p.triggers = (const char *const *)tg->triggers, p.trigger_grammars = (const char *const *)tg->trigger_grammars;
        p.n_triggers = tg->n_triggers, p.max_segments = tg->max_calls;
        if (g->format && g->reasoning_split) { /* a trigger while thinking is not a call */
            p.think_open = kt_tool_format_think_open(g->format);
            p.think_close = kt_tool_format_think_close(g->format);
            p.in_thinking = g->think == KT_THINK_OPEN;
        }
    }
    p.special_text = srv_gen_special_text(g);
    p.notify = srv_link_notify, p.notify_ctx = link;
    p.client_gone = srv_link_client_gone;
    return p;
}

/* A prompt (or, with --strict-max-tokens, a prompt and max_tokens) that
 * does not fit the context, in the words of the API the client speaks:
 * agent clients recover by matching them (Claude Code compacts its
 * history on Anthropic's "prompt is too long: N tokens > M maximum";
 * OpenAI clients look for the code context_length_exceeded). */
static void context_error(const srv_conn *c, kt_gen_field field, int n_prompt, int n_ctx, srv_error *e) {
    const bool anthropic = c->dialect == &SRV_DIALECT_MESSAGES, responses = c->dialect == &SRV_DIALECT_RESPONSES;
    const bool chat = c->gen.kind == SRV_CHAT;
    const char *code = "context_length_exceeded", *type = "invalid_request_error";
    if (field == KT_FIELD_MAX_TOKENS) { /* only under --strict-max-tokens */
        const int max = c->gen.max_tokens;
        if (anthropic)
            srv_fail(e, 400, type, "max_tokens", code,
                     "input length and `max_tokens` exceed context limit: %d + %d > %d, decrease input length or "
                     "`max_tokens` and try again", n_prompt, max, n_ctx);
        else
            srv_fail(e, 400, type, responses ? "max_output_tokens" : "max_tokens", code,
                     "This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the "
                     "%s, %d in the completion). Please reduce the length of the %s or completion.",
                     n_ctx, n_prompt + max, n_prompt, chat ? "messages" : "prompt", max, chat ? "messages" : "prompt");
        return;
    }
    if (anthropic)
        srv_fail(e, 400, type, "messages", code, "prompt is too long: %d tokens > %d maximum", n_prompt, n_ctx - 1);
    else
        srv_fail(e, 400, type, responses ? "input" : chat ? "messages" : "prompt", code,
                 "This model's maximum context length is %d tokens. However, your %s resulted in %d tokens (and one "
                 "must be left to generate). Please reduce the length of the %s.",
                 n_ctx, responses ? "input" : chat ? "messages" : "prompt", n_prompt,
                 responses ? "input" : chat ? "messages" : "prompt");
}

/* Submits under engine_mu so srv_stop cannot free the engine meanwhile. */
static bool submit(srv_conn *c, const int32_t *ids, int n, srv_error *e) {
    srv_server *s = c->s;
    kt_gen_params p = gen_params(&c->gen, ids, n, c->link);
    p.images = c->gen.images, p.n_images = c->gen.n_images;
    kt_error err = {0};
    kt_gen_field field = KT_FIELD_NONE;
    int n_ctx = 0;
    pthread_mutex_lock(&s->engine_mu); /* srv_stop clears the engines under it */
    kt_status st = c->cls->engine ? kt_engine_submit_ex(c->cls->engine, &p, &c->req, &err, &field)
                             : kt_error_set(&err, KT_ERR_BUSY, "the server is shutting down");
    const bool submitted = c->cls->engine != NULL; /* submit took the images' pixels, also when it failed */
    if (submitted) n_ctx = kt_engine_get_params(c->cls->engine)->n_ctx;
    pthread_mutex_unlock(&s->engine_mu);
    for (int i = 0; submitted && i < c->gen.n_images; i++) c->gen.images[i].prep = NULL;
    if (st == KT_OK) return true;
    if (st == KT_ERR_CONTEXT && n_ctx > 0) context_error(c, field, n, n_ctx, e);
    else srv_submit_error(&err, field, c->gen.kind, e);
    return false;
}

static bool start_reply(srv_conn *c, srv_error *e) {
    srv_server *s = c->s;
    char id[48];
    const char *prefix = c->dialect == &SRV_DIALECT_RESPONSES  ? "resp_"
                         : c->dialect == &SRV_DIALECT_MESSAGES ? "msg_"
                         : c->gen.kind == SRV_CHAT             ? "chatcmpl-"
                                                               : "cmpl-";
    snprintf(id, sizeof id, "%s%016llx", prefix, (unsigned long long)fresh_random(s));
    c->have_reply = true;
    if (!srv_reply_init(&c->reply, &c->gen, c->cls->model, srv_reply_name(c->cls, c->json), id,
                        (long long)time(NULL)))
        return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    c->reply.req = c->req;
    if (!c->gen.stream || c->gen.kind != SRV_CHAT) return true;
    if (c->dialect && !(c->xlate = c->dialect->stream_new(c->dialect_body, &c->reply, &c->gen, c->n_prompt)))
        return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    for (int i = 0; i < c->gen.n_choices; i++)
        if (!emit(c, srv_chunk_role(&c->reply, i, c->gen.include_usage)))
            return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    return true;
}

static enum MHD_Result start_stream(srv_conn *c) {
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, c, NULL);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    if (c->notes.len) MHD_add_response_header(r, "x-kettle-warning", c->notes.text);
    srv_add_cors_headers(c, r);
    c->quiet_since_ms = kt_time_ms(); /* the headers go now: a stream with no first event still gets keep-alives */
    enum MHD_Result q = MHD_queue_response(c->mc, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    c->status = MHD_HTTP_OK;
    return q;
}

/* The class's tower and image limits, the images of a request bounded by
 * its engine's context (read under engine_mu: srv_stop clears the
 * engines under it). */
static srv_vision_env class_vision(srv_server *s, const srv_class *k) {
    srv_vision_env v = k->vis;
    pthread_mutex_lock(&s->engine_mu);
    if (k->engine) v.max_tokens = kt_engine_get_params(k->engine)->n_ctx;
    pthread_mutex_unlock(&s->engine_mu);
    return v;
}

/* Translate, validate, tokenize, submit (the body parsed and routed, the
 * class loaded); on success the connection owns a request. */
static bool prepare(srv_conn *c, srv_kind kind, srv_error *e) {
    srv_server *s = c->s;
    srv_class *k = c->cls;
    const srv_model_info mi = srv_class_info(k);
    if (c->dialect) {
        c->dialect_body = c->json;
        if (!(c->json = c->dialect->to_chat(c->dialect_body, &c->notes, e))) return false;
    }
    if (!srv_class_defaults(k, c->json)) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    if (!srv_parse_gen(c->json, kind, &mi, fresh_random(s), &c->gen, e)) return false;
    c->have_gen = true;
    c->gen.notes = &c->notes;
    if (c->dialect && c->gen.n_choices != 1)
        return srv_fail(e, 400, "invalid_request_error", "n", NULL, "%s answers one choice", c->dialect->path);
    int32_t *ids = NULL;
    const srv_vision_env vis = class_vision(s, k);
    int n = srv_prompt_tokens(k->model, k->cfg.template_text, k->sampled, &c->gen, &vis, &ids, e);
    if (n < 0) return false;
    c->n_prompt = n;
    if (k->results && srv_result_cacheable(&c->gen) && !c->gen.n_images) { /* image tokens are placeholders in ids */
        c->result_key = srv_result_key_of(&c->gen, ids, n);
        c->result_hit = srv_results_get(k->results, c->result_key, &c->result);
        c->result_cacheable = !c->result_hit;
    }
    bool ok = c->result_hit || c->link || (c->link = srv_link_acquire(s, c->mc)) != NULL;
    if (!ok) srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    ok = ok && (c->result_hit || submit(c, ids, n, e)) && start_reply(c, e);
    free(ids);
    return ok;
}

/* The whole answer: the chat completion, or the dialect's made from it. */
static json_t *answer_json(srv_conn *c, const kt_request_usage *u) {
    json_t *done = srv_reply_json(&c->reply, u);
    if (!done || !c->dialect) return done;
    json_t *j = c->dialect->from_chat(c->dialect_body, done, &c->reply, &c->gen);
    json_decref(done);
    return j;
}

/* --result-cache hit: the stored answer, as a stream or a whole reply,
 * without the engine (x-kettle-cache: hit). */
static enum MHD_Result answer_from_results(srv_conn *c) {
    srv_error e;
    srv_result *res = &c->result;
    kt_request_usage u = res->usage;
    u.cached_tokens = u.prompt_tokens; /* nothing was computed */
    bool ok = true;
    for (int i = 0; ok && i < res->n_choices; i++) {
        kt_event ev = {.choice = i, .token = -1, .text = res->text[i], .text_len = res->len[i], .finish = res->finish[i],
                     .stop_string = res->stop_string[i]};
        ok = c->gen.stream ? srv_reply_track(&c->reply, &ev) && stream_event(c, &ev) : srv_reply_add(&c->reply, &ev);
    }
    if (!ok) return srv_fail(&e, 500, "server_error", NULL, NULL, "out of memory"), srv_respond_error(c, &e);
    if (!c->gen.stream) return srv_respond_json(c, 200, answer_json(c, &u));
    if (!stream_end_with(c, &u)) return srv_fail(&e, 500, "server_error", NULL, NULL, "out of memory"), srv_respond_error(c, &e);
    char *body = c->out.data;
    size_t len = c->out.len;
    c->out = (srv_buf){0};
    return srv_respond(c, 200, "text/event-stream", body, len);
}

enum MHD_Result srv_class_gate(srv_conn *c, enum MHD_Result (*go)(srv_conn *c)) {
    srv_error e;
    for (;;) {
        if (c->link) srv_link_arm(c->link); /* before queueing: a load that ends at once is not missed */
        srv_class_wait w = srv_class_ready(c, c->link, &e);
        if (w == CLASS_GO) return go(c);
        if (w == CLASS_FAILED) return srv_fallback_or_error(c, &e); /* it could not be loaded */
        if (!c->link) {
            if (!(c->link = srv_link_acquire(c->s, c->mc)))
                return srv_fail(&e, 500, "server_error", NULL, NULL, "out of memory"), srv_respond_error(c, &e);
            continue; /* queue it */
        }
        srv_wait r = srv_link_suspend(c->link);
        if (r == WAIT_SUSPENDED) return MHD_YES;
        if (r == WAIT_SHUTDOWN)
            return srv_fail(&e, 503, "server_error", NULL, NULL, "the server is shutting down"), srv_respond_error(c, &e);
    }
}

/* The class is loaded: the request goes on as it came. */
static enum MHD_Result begin(srv_conn *c) {
    srv_error e;
    if (!prepare(c, c->kind, &e)) return srv_fallback_or_error(c, &e); /* forwarded, or the error answered */
    if (c->result_hit) return answer_from_results(c);
    return c->gen.stream ? start_stream(c) : srv_gen_continue(c);
}

enum MHD_Result srv_gen_start(srv_conn *c, srv_kind kind) {
    srv_error e;
    c->started = true, c->kind = kind;
    if (!(c->json = srv_parse_body(c, &e))) return srv_respond_error(c, &e);
    if (!(c->cls = srv_route(c->s, c->json, &e))) return srv_fallback_or_error(c, &e); /* an unknown model */
    return srv_class_gate(c, begin);
}

/* A non-streaming request: gather events; answer once finished. */
enum MHD_Result srv_gen_continue(srv_conn *c) {
    srv_error e;
    if (c->waiting_class) return srv_class_gate(c, begin);
    for (;;) {
        srv_link_arm(c->link);
        int r = drain(c);
        if (r < 0) return srv_fail(&e, 500, "server_error", NULL, NULL, "out of memory"), srv_respond_error(c, &e);
        if (r == 1) break;
        srv_wait w = srv_link_suspend(c->link);
        if (w == WAIT_SUSPENDED) return MHD_YES;
        if (w == WAIT_SHUTDOWN)
            return srv_fail(&e, 503, "server_error", NULL, NULL, "the server is shutting down"), srv_respond_error(c, &e);
    }
    int bad = srv_reply_error_choice(&c->reply);
    if (bad >= 0) { /* nothing was sent yet: the fallback upstream may answer instead */
        srv_fail(&e, 500, "server_error", NULL, NULL, "%s", c->reply.choices[bad].error[0] ? c->reply.choices[bad].error : "the engine failed");
        return srv_fallback_or_error(c, &e);
    }
    kt_request_usage u = kt_request_get_usage(c->req);
    json_t *j = answer_json(c, &u);
    if (!j) return srv_fail(&e, 500, "server_error", NULL, NULL, "out of memory"), srv_respond_error(c, &e);
    return srv_respond_json(c, 200, j);
}

void srv_gen_release(srv_conn *c) {
    if (c->req) {
        kt_request_cancel(c->req);
        kt_request_free(c->req);
        c->req = NULL;
    }
    if (c->link) srv_link_release(c->link), c->link = NULL;
    if (c->have_reply) srv_reply_free(&c->reply), c->have_reply = false;
    srv_result_clear(&c->result);
    if (c->have_gen) srv_gen_req_free(&c->gen), c->have_gen = false;
    json_decref(c->json), c->json = NULL;
    json_decref(c->dialect_body), c->dialect_body = NULL;
    if (c->xlate) c->dialect->stream_free(c->xlate), c->xlate = NULL;
    srv_buf_free(&c->out);
}

enum MHD_Result srv_count_tokens(srv_conn *c) {
    srv_error e;
    int32_t *ids = NULL;
    int n = -1;
    srv_model_info mi = {0};
    srv_fail(&e, 500, "server_error", NULL, NULL, "out of memory"); /* what is left if nothing below says more */
    if ((c->dialect_body = srv_parse_body(c, &e)) && (c->cls = srv_route(c->s, c->dialect_body, &e)) &&
        srv_loaded_now(c, &e) && (mi = srv_class_info(c->cls), c->json = srv_messages_count_body(c->dialect_body, &c->notes, &e)) &&
        srv_class_defaults(c->cls, c->json) && srv_parse_gen(c->json, SRV_CHAT, &mi, 0, &c->gen, &e)) {
        const srv_class *k = c->cls;
        c->have_gen = true;
        c->gen.notes = &c->notes;
        const srv_vision_env vis = class_vision(c->s, k);
        n = srv_prompt_tokens(k->model, k->cfg.template_text, k->sampled, &c->gen, &vis, &ids, &e);
    }
    free(ids);
    if (n < 0) return srv_respond_error(c, &e);
    return srv_respond_json(c, 200, json_pack("{s:i}", "input_tokens", n));
}
