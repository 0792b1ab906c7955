/*
 * bench_soak_check.c - how `kettle bench soak` judges each answer: the
 * status its kind must get, then what the answer must hold. See
 * bench_soak.h.
 *
 * A whole answer and a stream are first reduced to the same parts (the
 * first choice's finish reason, text and tool calls; how many choices
 * finished; the completion tokens of the usage), so each kind's rule is
 * written once.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/bench_agent.h"
#include "cli/bench_soak.h"

static sk_outcome say(sk_outcome o, char *why, size_t cap, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static sk_outcome say(sk_outcome o, char *why, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, cap, fmt, ap);
    va_end(ap);
    return o;
}

/* What an answer's checks read, from a whole answer or a stream. */
typedef struct parts {
    const char *finish;      /* the first choice's finish_reason; NULL: none */
    const char *text;        /* its text or content ("" if none) */
    const json_t *calls;     /* its tool calls; NULL: none */
    int n_finished;          /* choices that came with a finish_reason */
    long completion_tokens;  /* usage; -1: not reported */
} parts;

static void whole_parts(json_t *doc, bool chat, parts *p) {
    json_t *choices = json_object_get(doc, "choices"), *c;
    size_t i;
    *p = (parts){.completion_tokens = -1, .text = ""};
    json_array_foreach(choices, i, c) p->n_finished += json_is_string(json_object_get(c, "finish_reason"));
    json_t *c0 = json_array_get(choices, 0), *msg = json_object_get(c0, "message");
    p->finish = json_string_value(json_object_get(c0, "finish_reason"));
    const char *text = json_string_value(chat ? json_object_get(msg, "content") : json_object_get(c0, "text"));
    if (text) p->text = text;
    p->calls = json_object_get(msg, "tool_calls");
    json_t *ct = json_object_get(json_object_get(doc, "usage"), "completion_tokens");
    if (json_is_integer(ct)) p->completion_tokens = (long)json_integer_value(ct);
}

static void stream_parts(const bs_sse *s, parts *p) {
    *p = (parts){.finish = s->finish[0] ? s->finish : NULL, .text = s->text ? s->text : "", .calls = s->tool_calls,
                 .n_finished = s->n_length + s->n_stop, .completion_tokens = s->completion_tokens};
}

/* ---- each kind's rule ---- */

static bool is(const char *a, const char *b) {
    return a && !strcmp(a, b);
}

static bool calls_named(const json_t *calls, const char *name) {
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c) if (!is(json_string_value(json_object_get(json_object_get(c, "function"), "name")), name)) return false;
    return true;
}

/* Under "none" no call; a finished call names an offered tool with
 * arguments that check (and the named one, if named); "required" and a
 * named choice end in a call unless max_tokens cut it. */
static sk_outcome check_tools(const sk_request *q, const parts *p, bool *cut, char *why, size_t cap) {
    size_t n_calls = json_array_size(p->calls);
    if (q->tool_choice == SK_TC_NONE && n_calls)
        return say(SK_BAD_ANSWER, why, cap, "tool_choice \"none\", yet %zu tool calls", n_calls);
    if (is(p->finish, "tool_calls")) {
        if (!n_calls) return say(SK_BAD_ANSWER, why, cap, "finish_reason \"tool_calls\" without a call");
        if (!ba_calls_valid(sk_tools(), p->calls) ||
            (q->tool_choice == SK_TC_NAMED && !calls_named(p->calls, "get_weather"))) {
            char *text = json_dumps(p->calls, JSON_COMPACT);
            say(SK_BAD_ANSWER, why, cap, "a tool call that does not check: %.200s", text ? text : "?");
            free(text);
            return SK_BAD_ANSWER;
        }
        return SK_OK;
    }
    bool forced = q->tool_choice == SK_TC_REQUIRED || q->tool_choice == SK_TC_NAMED;
    if (forced && !is(p->finish, "length"))
        return say(SK_BAD_ANSWER, why, cap, "tool_choice forces a call, yet the answer ended '%s' without one",
                   p->finish ? p->finish : "");
    *cut = forced;
    return SK_OK;
}

/* The answer matches the schema of bench_soak_work.c exactly. */
static bool schema_matches(const char *text) {
    json_t *doc = json_loads(text, 0, NULL);
    const char *mood = json_string_value(json_object_get(doc, "mood"));
    bool ok = json_is_object(doc) && json_object_size(doc) == 2 && json_is_boolean(json_object_get(doc, "ok")) &&
              (is(mood, "happy") || is(mood, "sad") || is(mood, "calm"));
    json_decref(doc);
    return ok;
}

static sk_outcome check_schema(const parts *p, bool *cut, char *why, size_t cap) {
    if (is(p->finish, "length")) return *cut = true, SK_OK;
    if (!schema_matches(p->text))
        return say(SK_BAD_ANSWER, why, cap, "a json_schema answer that does not match the schema: %.200s", p->text);
    return SK_OK;
}

static sk_outcome check_stop(const sk_request *q, const parts *p, char *why, size_t cap) {
    for (int i = 0; i < SK_N_STOP_STRINGS; i++)
        if ((q->stop_mask & (1u << i)) && strstr(p->text, sk_stop_strings[i]))
            return say(SK_BAD_ANSWER, why, cap, "the stop string '%s' is in the text: %.200s", sk_stop_strings[i],
                       p->text);
    return SK_OK;
}

/* Every answer: each choice finished, a known finish reason, usage
 * within n x max_tokens; then the kind's own rule. */
static sk_outcome check_parts(const sk_request *q, const parts *p, bool *cut, char *why, size_t cap) {
    if (p->n_finished != q->n_choices)
        return say(SK_BAD_ANSWER, why, cap, "%d choices finished, %d asked", p->n_finished, q->n_choices);
    if (!is(p->finish, "stop") && !is(p->finish, "length") && !is(p->finish, "tool_calls"))
        return say(SK_BAD_ANSWER, why, cap, "finish_reason '%s'", p->finish ? p->finish : "(none)");
    long most = (long)q->n_choices * q->max_tokens;
    if (p->completion_tokens < 0 || p->completion_tokens > most)
        return say(SK_BAD_ANSWER, why, cap, "usage.completion_tokens %ld, not within 0..%ld", p->completion_tokens,
                   most);
    switch (q->kind) {
    case SK_TOOLS: return check_tools(q, p, cut, why, cap);
    case SK_SCHEMA: return check_schema(p, cut, why, cap);
    case SK_STOP: return check_stop(q, p, why, cap);
    default: return SK_OK;
    }
}

/* ---- statuses ---- */

/* A malformed request: a 4xx whose body is an OpenAI error object. */
static sk_outcome check_refusal(const sk_request *q, const sk_answer *a, char *why, size_t cap) {
    if (a->status < 400 || a->status > 499)
        return say(SK_BAD_STATUS, why, cap, "a malformed request (%s) got HTTP %ld, not a 4xx",
                   sk_fault_names[q->fault], a->status);
    json_t *doc = a->body ? json_loads(a->body, 0, NULL) : NULL;
    bool ok = json_is_string(json_object_get(json_object_get(doc, "error"), "message"));
    json_decref(doc);
    if (!ok)
        return say(SK_BAD_ANSWER, why, cap, "the %ld refusing a malformed request (%s) is no error object: %.200s",
                   a->status, sk_fault_names[q->fault], a->body ? a->body : "");
    return SK_OK;
}

static sk_outcome check_whole(const sk_request *q, const sk_answer *a, bool *cut, char *why, size_t cap) {
    json_t *doc = a->body ? json_loads(a->body, 0, NULL) : NULL;
    if (!json_is_object(doc)) {
        json_decref(doc);
        return say(SK_BAD_ANSWER, why, cap, "the answer is not a JSON object: %.200s", a->body ? a->body : "");
    }
    parts p;
    whole_parts(doc, q->chat, &p);
    sk_outcome o = check_parts(q, &p, cut, why, cap);
    json_decref(doc);
    return o;
}

static sk_outcome check_stream(const sk_request *q, const sk_answer *a, bool *cut, char *why, size_t cap) {
    if (!a->sse->done)
        return say(SK_BAD_ANSWER, why, cap, "the stream ended before 'data: [DONE]' (after %d token chunks)",
                   a->sse->n_tok);
    parts p;
    stream_parts(a->sse, &p);
    return check_parts(q, &p, cut, why, cap);
}

sk_outcome sk_check(const sk_request *r, const sk_answer *a, bool *cut, char *why, size_t cap) {
    *cut = false;
    why[0] = 0;
    if (a->net == SK_NET_TIMEOUT) return say(SK_HUNG, why, cap, "nothing received for --timeout seconds");
    if (a->sse && a->sse->error[0]) return say(SK_BAD_ANSWER, why, cap, "%s", a->sse->error);
    if (a->net == SK_NET_ERROR) return say(SK_TRANSPORT, why, cap, "the connection failed or dropped");
    if (a->status == 503) return say(SK_OVERLOAD, why, cap, "503: the server is busy");
    if (r->kind == SK_MALFORMED) return check_refusal(r, a, why, cap);
    if (a->status != 200)
        return say(SK_BAD_STATUS, why, cap, "HTTP %ld: %.300s", a->status, a->body ? a->body : "");
    if (a->abandoned) return SK_OK; /* it was streaming when the client hung up */
    return r->stream ? check_stream(r, a, cut, why, cap) : check_whole(r, a, cut, why, cap);
}
