/*
 * reply.c - OpenAI's response objects built from engine events (see
 * openai.h): whole answers (chat.completion, text_completion) gathered
 * choice by choice, and stream chunks (chat.completion.chunk,
 * text_completion) made one event at a time.
 *
 * Shapes follow OpenAI's API reference: chat logprobs are
 * logprobs.content[] of {token, logprob, bytes, top_logprobs[]}; legacy
 * completion logprobs are four parallel arrays (tokens, token_logprobs,
 * top_logprobs as {token: logprob} objects, text_offset counted from the
 * start of the prompt). Token strings are each token decoded alone.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/openai.h"
#include "server/sampled.h"

/* ---- logprobs ---- */

/* {token, logprob, bytes}, plus top_logprobs when `top` is given. */
static json_t *chat_lp_item(const kt_model *m, const kt_token_logprob *lp, const kt_event *top) {
    json_t *bytes = NULL, *tok = srv_token_json(m, lp->token, &bytes);
    json_t *o = tok ? json_pack("{s:o, s:f, s:o}", "token", tok, "logprob", (double)lp->logprob, "bytes", bytes) : NULL;
    if (!o || !top) return o;
    json_t *arr = json_array();
    for (int i = 0; arr && i < top->n_top; i++) /* out of memory: no answer, rather than one missing an item */
        if (json_array_append_new(arr, chat_lp_item(m, &top->top[i], NULL))) json_decref(arr), arr = NULL;
    if (!arr || json_object_set_new(o, "top_logprobs", arr)) json_decref(o), o = NULL;
    return o;
}

/* Appends one token to the four completion arrays; `offset` advances. */
static bool completion_lp_add(const kt_model *m, const kt_event *ev, json_t *tokens, json_t *tlps, json_t *tops,
                              json_t *offsets, size_t *offset) {
    json_t *tok = srv_token_json(m, ev->logprob.token, NULL), *top = json_object();
    if (!tok || !top) return json_decref(tok), json_decref(top), false;
    bool ok = true; /* out of memory: the caller fails the answer, rather than send one missing an item */
    for (int i = 0; ok && i < ev->n_top; i++) {
        json_t *t = srv_token_json(m, ev->top[i].token, NULL);
        ok = t && !json_object_set_new(top, json_string_value(t), json_real(ev->top[i].logprob));
        json_decref(t);
    }
    if (!ok || json_array_append_new(offsets, json_integer((json_int_t)*offset)))
        return json_decref(tok), json_decref(top), false;
    *offset += json_string_length(tok);
    if (json_array_append_new(tokens, tok) || json_array_append_new(tlps, json_real(ev->logprob.logprob)))
        return json_decref(top), false; /* top was not handed over yet */
    return !json_array_append_new(tops, top);
}

/* ---- gathering a whole answer ---- */

/* ---- the parse of a chat reply ---- */

static bool buf_add(srv_buf *b, const char *s, size_t n) { return srv_buf_append(b, s, n); }

/* A delta as a stream chunk's choice object. */
static json_t *delta_choice(const srv_choice *c, const kt_tool_delta *d) {
    json_t *delta = NULL;
    switch (d->kind) {
    case KT_TD_CONTENT: delta = json_pack("{s:s%}", "content", d->text, d->len); break;
    case KT_TD_REASONING: delta = json_pack("{s:s%}", "reasoning_content", d->text, d->len); break;
    case KT_TD_CALL:
        delta = json_pack("{s:[{s:i, s:s, s:s, s:{s:s%, s:s}}]}", "tool_calls", "index", d->index, "id", d->id, "type",
                          "function", "function", "name", d->text, d->len, "arguments", "");
        break;
    case KT_TD_ARGS:
        delta = json_pack("{s:[{s:i, s:{s:s%}}]}", "tool_calls", "index", d->index, "function", "arguments", d->text,
                          d->len);
        break;
    }
    return delta ? json_pack("{s:i, s:o, s:n, s:n}", "index", c->index, "delta", delta, "logprobs", "finish_reason")
                 : NULL;
}

/* Appends text to call k's arguments. */
static bool args_append(json_t *calls, int k, const char *s, size_t n) {
    json_t *fn = json_object_get(json_array_get(calls, (size_t)k), "function");
    json_t *a = json_object_get(fn, "arguments");
    if (!json_is_string(a)) return false;
    size_t old = json_string_length(a);
    char *joined = malloc(old + n + 1);
    if (!joined) return false;
    memcpy(joined, json_string_value(a), old);
    memcpy(joined + old, s, n);
    joined[old + n] = 0;
    bool ok = !json_object_set_new(fn, "arguments", json_stringn(joined, old + n));
    free(joined);
    return ok;
}

/* The parser's callback: the delta is gathered into the choice and, when
 * streaming, becomes a chunk. */
static bool on_delta(void *ctx, const kt_tool_delta *d) {
    srv_choice *c = ctx;
    srv_reply *rp = c->reply;
    bool ok = true;
    switch (d->kind) {
    case KT_TD_CONTENT: ok = buf_add(&c->content, d->text, d->len); break;
    case KT_TD_REASONING: ok = buf_add(&c->reasoning, d->text, d->len); break;
    case KT_TD_CALL:
        ok = (c->calls || (c->calls = json_array())) &&
             !json_array_append_new(c->calls, json_pack("{s:s, s:s, s:{s:s%, s:s}}", "id", d->id, "type", "function",
                                                        "function", "name", d->text, d->len, "arguments", ""));
        break;
    case KT_TD_ARGS: ok = args_append(c->calls, d->index, d->text, d->len); break;
    }
    if (ok && rp->streaming) {
        json_t *ch = delta_choice(c, d);
        if (ch && !rp->pending && !(rp->pending = json_array())) json_decref(ch), ch = NULL;
        ok = ch && !json_array_append_new(rp->pending, ch);
    }
    return ok;
}

static bool start_parser(srv_reply *rp, const srv_gen_req *r, int i) {
    srv_choice *c = &rp->choices[i];
    c->reply = rp, c->index = i;
    if (r->kind != SRV_CHAT || !r->format) return true;
    const bool calls = r->tools && r->tool_choice != KT_TOOL_NONE;
    const bool thinks = r->reasoning_split && (kt_tool_format_think_open(r->format) ||
                                               !strcmp(kt_tool_format_name(r->format), "gpt-oss"));
    if (!calls && !thinks) return true;
    char seed[64];
    snprintf(seed, sizeof seed, "%s/%d", rp->id, i);
    kt_tool_parse_opts o = {.calls = calls, .reasoning = r->reasoning_split, .in_thinking = r->think == KT_THINK_OPEN,
                            .tools = r->tools, .id_seed = seed};
    return (c->parser = kt_tool_parser_new(r->format, &o, on_delta, c)) != NULL;
}

bool srv_reply_init(srv_reply *rp, const srv_gen_req *r, const kt_model *m, const char *model_name, const char *id,
                    long long created) {
    *rp = (srv_reply){.kind = r->kind, .model = m, .model_name = model_name, .created = created,
                      .n_choices = r->n_choices, .logprobs = r->top_logprobs >= 0,
                      .prompt_chars = r->prompt ? strlen(r->prompt) : 0, .streaming = r->stream};
    snprintf(rp->id, sizeof rp->id, "%s", id);
    for (int i = 0; i < rp->n_choices; i++) {
        srv_choice *c = &rp->choices[i];
        c->text_offset = rp->prompt_chars;
        if (!start_parser(rp, r, i)) return false;
        if (!rp->logprobs) continue;
        if (r->kind == SRV_CHAT) {
            if (!(c->lp_content = json_array())) return false;
        } else if (!(c->lp_tokens = json_array()) || !(c->lp_token_logprobs = json_array()) ||
                   !(c->lp_top = json_array()) || !(c->lp_offsets = json_array())) {
            return false;
        }
    }
    return true;
}

void srv_reply_free(srv_reply *rp) {
    for (int i = 0; i < rp->n_choices; i++) {
        srv_choice *c = &rp->choices[i];
        free(c->text);
        free(c->ids);
        kt_tool_parser_free(c->parser);
        srv_buf_free(&c->content), srv_buf_free(&c->reasoning);
        json_decref(c->calls);
        json_decref(c->lp_content), json_decref(c->lp_tokens), json_decref(c->lp_token_logprobs);
        json_decref(c->lp_top), json_decref(c->lp_offsets);
    }
    rp->n_choices = 0;
    json_decref(rp->pending), rp->pending = NULL;
}

static bool choice_append(srv_choice *c, const char *s, size_t n) {
    srv_buf b = {c->text, c->len, c->cap};
    bool ok = srv_buf_append(&b, s, n);
    c->text = b.data, c->len = b.len, c->cap = b.cap;
    return ok;
}

static bool ids_append(srv_choice *c, int32_t id) {
    if (c->n_ids == c->cap_ids) {
        int cap = c->cap_ids ? 2 * c->cap_ids : 64;
        int32_t *p = realloc(c->ids, sizeof *p * (size_t)cap);
        if (!p) return false;
        c->ids = p, c->cap_ids = cap;
    }
    c->ids[c->n_ids++] = id;
    return true;
}

bool srv_reply_track(srv_reply *rp, const kt_event *ev) {
    if (ev->choice < 0 || ev->choice >= rp->n_choices) return true;
    srv_choice *c = &rp->choices[ev->choice];
    if (ev->text_len && !choice_append(c, ev->text, ev->text_len)) return false;
    if (ev->token >= 0 && !ids_append(c, ev->token)) return false;
    /* a stop string ends on a sampled token; an end-of-turn token ends
     * with a finish-only event (token -1) */
    if (ev->finish == KT_FINISH_STOP && ev->token >= 0) c->ids_cut = true;
    if (ev->finish != KT_FINISH_NONE) {
        c->finish = ev->finish;
        c->stop_string = ev->stop_string;
        snprintf(c->error, sizeof c->error, "%s", ev->error);
    }
    json_decref(rp->pending), rp->pending = NULL;
    rp->pending_choice = ev->choice;
    if (!c->parser || (!ev->text_len && ev->finish == KT_FINISH_NONE)) return true;
    if (ev->finish == KT_FINISH_LENGTH) kt_tool_parser_cut(c->parser);
    return kt_tool_parser_feed(c->parser, ev->text, ev->text_len, ev->finish != KT_FINISH_NONE);
}

void srv_reply_remember(const srv_reply *rp, srv_sampled *m) {
    if (!m || rp->kind != SRV_CHAT) return;
    for (int i = 0; i < rp->n_choices; i++) {
        const srv_choice *c = &rp->choices[i];
        bool whole = c->finish == KT_FINISH_LENGTH || (c->finish == KT_FINISH_STOP && !c->ids_cut);
        if (whole && c->len > 0 && c->n_ids > 0) srv_sampled_put(m, c->text, c->len, c->ids, c->n_ids);
    }
}

bool srv_reply_add(srv_reply *rp, const kt_event *ev) {
    if (ev->choice < 0 || ev->choice >= rp->n_choices) return true;
    if (!srv_reply_track(rp, ev)) return false;
    srv_choice *c = &rp->choices[ev->choice];
    if (ev->token >= 0 && ev->has_logprob && rp->logprobs) {
        bool ok = rp->kind == SRV_CHAT
                      ? !json_array_append_new(c->lp_content, chat_lp_item(rp->model, &ev->logprob, ev))
                      : completion_lp_add(rp->model, ev, c->lp_tokens, c->lp_token_logprobs, c->lp_top,
                                          c->lp_offsets, &c->text_offset);
        if (!ok) return false;
    }
    return true;
}

int srv_reply_error_choice(const srv_reply *rp) {
    for (int i = 0; i < rp->n_choices; i++)
        if (rp->choices[i].finish == KT_FINISH_ERROR) return i;
    return -1;
}

/* OpenAI's usage, with the prompt tokens the prefix cache served as
 * prompt_tokens_details.cached_tokens (as OpenAI reports its own cache). */
static json_t *usage_json(const kt_request_usage *u) {
    return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", u->prompt_tokens, "completion_tokens",
                     u->completion_tokens, "total_tokens", u->prompt_tokens + u->completion_tokens,
                     "prompt_tokens_details", "cached_tokens", u->cached_tokens);
}

static json_t *finish_json(kt_finish f) {
    return f == KT_FINISH_NONE ? json_null() : json_string(kt_finish_name(f));
}

static json_t *choice_logprobs(const srv_reply *rp, const srv_choice *c) {
    if (!rp->logprobs) return json_null();
    if (rp->kind == SRV_CHAT) return json_pack("{s:O}", "content", c->lp_content);
    return json_pack("{s:O, s:O, s:O, s:O}", "tokens", c->lp_tokens, "token_logprobs", c->lp_token_logprobs,
                     "top_logprobs", c->lp_top, "text_offset", c->lp_offsets);
}

/* OpenAI's finish_reason: "tool_calls" for a reply that ended with calls. */
static json_t *choice_finish(const srv_choice *c, kt_finish f) {
    if (f == KT_FINISH_STOP && json_array_size(c->calls)) return json_string("tool_calls");
    return finish_json(f);
}

/* message: content (null beside calls when there is no text),
 * reasoning_content when the model thought, tool_calls when it called. */
static json_t *parsed_message(const srv_choice *c) {
    bool calls = json_array_size(c->calls) > 0;
    json_t *m = json_pack("{s:s, s:o}", "role", "assistant", "content",
                          calls && !c->content.len ? json_null()
                                                   : json_stringn(c->content.data ? c->content.data : "", c->content.len));
    if (m && c->reasoning.len &&
        json_object_set_new(m, "reasoning_content", json_stringn(c->reasoning.data, c->reasoning.len)))
        json_decref(m), m = NULL;
    if (m && calls && json_object_set(m, "tool_calls", c->calls)) json_decref(m), m = NULL;
    return m;
}

static json_t *choice_json(const srv_reply *rp, int i) {
    const srv_choice *c = &rp->choices[i];
    const char *text = c->text ? c->text : "";
    if (rp->kind == SRV_CHAT && c->parser)
        return json_pack("{s:i, s:o, s:o, s:o}", "index", i, "message", parsed_message(c), "logprobs",
                         choice_logprobs(rp, c), "finish_reason", choice_finish(c, c->finish));
    if (rp->kind == SRV_CHAT)
        return json_pack("{s:i, s:{s:s, s:s%}, s:o, s:o}", "index", i, "message", "role", "assistant", "content", text,
                         c->len, "logprobs", choice_logprobs(rp, c), "finish_reason", finish_json(c->finish));
    return json_pack("{s:s%, s:i, s:o, s:o}", "text", text, c->len, "index", i, "logprobs", choice_logprobs(rp, c),
                     "finish_reason", finish_json(c->finish));
}

static json_t *envelope(const srv_reply *rp, const char *object) {
    return json_pack("{s:s, s:s, s:I, s:s, s:s}", "id", rp->id, "object", object, "created", (json_int_t)rp->created,
                     "model", rp->model_name, "system_fingerprint", "kettle");
}

json_t *srv_reply_json(const srv_reply *rp, const kt_request_usage *u) {
    json_t *o = envelope(rp, rp->kind == SRV_CHAT ? "chat.completion" : "text_completion"), *choices = json_array();
    for (int i = 0; choices && i < rp->n_choices; i++) {
        json_t *c = choice_json(rp, i);
        if (!c || json_array_append_new(choices, c)) json_decref(choices), choices = NULL;
    }
    if (!o || !choices || json_object_set_new(o, "choices", choices) ||
        json_object_set_new(o, "usage", usage_json(u))) {
        if (!o) json_decref(choices); /* else the failed set took it */
        json_decref(o);
        return NULL;
    }
    return o;
}

/* ---- stream chunks ---- */

/* The chunk envelope with one choice. */
static json_t *chunk(const srv_reply *rp, json_t *choice, bool include_usage) {
    json_t *o = envelope(rp, rp->kind == SRV_CHAT ? "chat.completion.chunk" : "text_completion");
    if (!o || !choice) { /* the one that was made is ours to free */
        json_decref(o), json_decref(choice);
        return NULL;
    }
    if (json_object_set_new(o, "choices", json_pack("[o]", choice)) ||
        (include_usage && json_object_set_new(o, "usage", json_null()))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *srv_chunk_role(const srv_reply *rp, int i, bool include_usage) {
    return chunk(rp,
                 json_pack("{s:i, s:{s:s, s:s}, s:n, s:n}", "index", i, "delta", "role", "assistant", "content", "",
                           "logprobs", "finish_reason"),
                 include_usage);
}

/* A chunk's logprobs for one event, or null. */
static json_t *event_logprobs(srv_reply *rp, const kt_event *ev) {
    if (!rp->logprobs || ev->token < 0 || !ev->has_logprob) return json_null();
    if (rp->kind == SRV_CHAT) return json_pack("{s:[o]}", "content", chat_lp_item(rp->model, &ev->logprob, ev));
    json_t *t = json_array(), *l = json_array(), *top = json_array(), *off = json_array();
    json_t *o = t && l && top && off ? json_pack("{s:O, s:O, s:O, s:O}", "tokens", t, "token_logprobs", l,
                                                 "top_logprobs", top, "text_offset", off)
                                     : NULL;
    if (o && !completion_lp_add(rp->model, ev, t, l, top, off, &rp->choices[ev->choice].text_offset))
        json_decref(o), o = NULL;
    json_decref(t), json_decref(l), json_decref(top), json_decref(off);
    return o;
}

/* A parsed chat event: one chunk per delta, the event's logprobs on the
 * first (or on an empty delta when the text is still held back). */
static bool parsed_chunks(srv_reply *rp, const kt_event *ev, bool include_usage, json_t **out) {
    bool has_lp = rp->logprobs && ev->token >= 0 && ev->has_logprob;
    size_t n = rp->pending && ev->choice == rp->pending_choice ? json_array_size(rp->pending) : 0;
    if (!n && !has_lp) return true;
    json_t *arr = json_array();
    if (!arr) return false;
    if (!n && !json_array_append_new(rp->pending ? rp->pending : (rp->pending = json_array()),
                                     json_pack("{s:i, s:{}, s:n, s:n}", "index", ev->choice, "delta", "logprobs",
                                               "finish_reason")))
        n = 1;
    if (!n) return json_decref(arr), false;
    for (size_t i = 0; i < n; i++) {
        json_t *ch = json_incref(json_array_get(rp->pending, i));
        if (i == 0 && has_lp && json_object_set_new(ch, "logprobs", event_logprobs(rp, ev))) ch = (json_decref(ch), NULL);
        json_t *k = ch ? chunk(rp, ch, include_usage) : NULL;
        if (!k || json_array_append_new(arr, k)) return json_decref(arr), false;
    }
    json_decref(rp->pending), rp->pending = NULL;
    *out = arr;
    return true;
}

bool srv_chunk_event(srv_reply *rp, const kt_event *ev, bool include_usage, json_t **out) {
    *out = NULL;
    if (ev->choice < 0 || ev->choice >= rp->n_choices) return true; /* the engine's choices are in range */
    if (rp->kind == SRV_CHAT && rp->choices[ev->choice].parser) return parsed_chunks(rp, ev, include_usage, out);
    bool has_lp = rp->logprobs && ev->token >= 0 && ev->has_logprob;
    if (!ev->text_len && !has_lp) return true;
    json_t *lp = event_logprobs(rp, ev), *c;
    if (rp->kind == SRV_CHAT)
        c = json_pack("{s:i, s:{s:s%}, s:o, s:n}", "index", ev->choice, "delta", "content", ev->text, ev->text_len,
                      "logprobs", lp, "finish_reason");
    else
        c = json_pack("{s:s%, s:i, s:o, s:n}", "text", ev->text, ev->text_len, "index", ev->choice, "logprobs", lp,
                      "finish_reason");
    json_t *k = chunk(rp, c, include_usage);
    *out = k ? json_pack("[o]", k) : NULL;
    return *out != NULL;
}

json_t *srv_chunk_finish(const srv_reply *rp, int i, kt_finish f, bool include_usage) {
    json_t *c = rp->kind == SRV_CHAT
                    ? json_pack("{s:i, s:{}, s:n, s:o}", "index", i, "delta", "logprobs", "finish_reason",
                                choice_finish(&rp->choices[i], f))
                    : json_pack("{s:s, s:i, s:n, s:o}", "text", "", "index", i, "logprobs", "finish_reason",
                                finish_json(f));
    return chunk(rp, c, include_usage);
}

json_t *srv_chunk_usage(const srv_reply *rp, const kt_request_usage *u) {
    json_t *o = envelope(rp, rp->kind == SRV_CHAT ? "chat.completion.chunk" : "text_completion");
    if (!o || json_object_set_new(o, "choices", json_array()) || json_object_set_new(o, "usage", usage_json(u))) {
        json_decref(o);
        return NULL;
    }
    return o;
}
