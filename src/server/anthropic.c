/*
 * anthropic.c - Anthropic's Messages API (POST /v1/messages and
 * /v1/messages/count_tokens), which coding agents and the Anthropic SDKs
 * speak, as a dialect of chat completions (see dialect.h).
 *
 * A request's `system`, its messages' content blocks (text, tool_use,
 * tool_result, thinking), `tools` (name, description, input_schema),
 * `tool_choice` (auto / any / tool / none, disable_parallel_tool_use),
 * `stop_sequences`, `thinking` (enabled / disabled: the template's
 * enable_thinking) and the sampling fields map onto the chat request;
 * images, documents and Anthropic's server tools are refused naming what
 * was sent. The answer's content is a thinking block, a text block and
 * one tool_use block per call; stop_reason is end_turn, stop_sequence
 * (naming the one that matched), max_tokens or tool_use. usage counts the
 * prompt tokens the prefix cache served as cache_read_input_tokens and
 * the rest as input_tokens, as Anthropic's own cache is reported. Errors
 * are {"type": "error", "error": {"type", "message"}}.
 */
#include "server/dialect.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json_safe.h"

#define INVALID "invalid_request_error"

static bool oom(srv_error *e) { return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory"); }

static bool push(json_t *arr, json_t *v, srv_error *e) {
    return (v && !json_array_append_new(arr, v)) || oom(e);
}

/* ---- the request, as a chat body ---- */

static const char *const TEXT_BLOCKS[] = {"text", NULL};

/* A tool_result block as a chat tool message. */
static json_t *tool_result_msg(json_t *blk, const char *where, srv_error *e) {
    json_t *id = json_object_get(blk, "tool_use_id"), *content = json_object_get(blk, "content");
    if (!json_is_string(id))
        return srv_fail(e, 400, INVALID, "messages", NULL, "'%s' (tool_result) needs a string 'tool_use_id'", where), NULL;
    json_t *text = content && !json_is_null(content) ? srv_parts_text(content, TEXT_BLOCKS, where, e) : json_string("");
    if (!text) return NULL;
    /* chat templates have no error flag: the result says it in words */
    if (json_is_true(json_object_get(blk, "is_error"))) {
        size_t n = json_string_length(text);
        char *s = malloc(n + 8);
        if (s) memcpy(s, "Error: ", 7), memcpy(s + 7, json_string_value(text), n);
        json_decref(text);
        text = s ? json_stringn(s, n + 7) : NULL;
        free(s);
        if (!text) return oom(e), NULL;
    }
    json_t *m = json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id", id, "content", text);
    return m ? m : (oom(e), NULL);
}

/* A user message's blocks: each tool_result a tool message, the text
 * blocks one user message after them. */
static bool add_user_blocks(json_t *msgs, json_t *blocks, size_t i, srv_error *e) {
    srv_buf text = {0};
    bool ok = true, any_text = false;
    size_t k;
    json_t *b;
    json_array_foreach(blocks, k, b) {
        char where[64];
        snprintf(where, sizeof where, "messages[%zu].content[%zu]", i, k);
        const char *type = json_string_value(json_object_get(b, "type"));
        json_t *t = json_object_get(b, "text");
        if (type && !strcmp(type, "text") && json_is_string(t)) {
            any_text = true;
            ok = srv_buf_append(&text, json_string_value(t), json_string_length(t)) || oom(e);
        } else if (type && !strcmp(type, "tool_result")) {
            ok = push(msgs, tool_result_msg(b, where, e), e);
        } else {
            ok = srv_fail(e, 400, INVALID, "messages", "unsupported_content",
                          "'%s' is a block of type '%.40s'; kettle serves text models and takes text, tool_use, "
                          "tool_result and thinking blocks",
                          where, type ? type : "(none)");
        }
        if (!ok) break;
    }
    if (ok && any_text)
        ok = push(msgs, json_pack("{s:s, s:s%}", "role", "user", "content", text.data ? text.data : "", text.len), e);
    srv_buf_free(&text);
    return ok;
}

/* An assistant message's blocks: text, thinking (reasoning_content) and
 * tool_use (tool_calls, the input as arguments text). */
static bool add_assistant_blocks(json_t *msgs, json_t *blocks, size_t i, srv_error *e) {
    srv_buf text = {0}, thinking = {0};
    json_t *calls = json_array();
    bool ok = calls || oom(e);
    size_t k;
    json_t *b;
    json_array_foreach(blocks, k, b) {
        if (!ok) break;
        const char *type = json_string_value(json_object_get(b, "type"));
        json_t *t = json_object_get(b, "text"), *th = json_object_get(b, "thinking");
        json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name"), *input = json_object_get(b, "input");
        if (type && !strcmp(type, "text") && json_is_string(t)) {
            ok = srv_buf_append(&text, json_string_value(t), json_string_length(t)) || oom(e);
        } else if (type && !strcmp(type, "thinking") && json_is_string(th)) {
            ok = srv_buf_append(&thinking, json_string_value(th), json_string_length(th)) || oom(e);
        } else if (type && !strcmp(type, "redacted_thinking")) {
            continue; /* encrypted by another server: nothing kettle can read */
        } else if (type && !strcmp(type, "tool_use") && json_is_string(id) && json_is_string(name) &&
                   json_is_object(input)) {
            char *args = kt_json_dumps(input, JSON_COMPACT);
            ok = args && push(calls, json_pack("{s:O, s:s, s:{s:O, s:s}}", "id", id, "type", "function", "function",
                                               "name", name, "arguments", args), e);
            free(args);
            if (!ok && !e->status) oom(e);
        } else {
            ok = srv_fail(e, 400, INVALID, "messages", "unsupported_content",
                          "'messages[%zu].content[%zu]' is a block of type '%.40s' (or lacks its fields); an "
                          "assistant message takes text, thinking and tool_use {id, name, input} blocks",
                          i, k, type ? type : "(none)");
        }
    }
    json_t *m = ok ? json_pack("{s:s, s:o}", "role", "assistant", "content",
                               text.len || !json_array_size(calls) ? json_stringn(text.data ? text.data : "", text.len)
                                                                   : json_null())
                   : NULL;
    if (ok && m && thinking.len && json_object_set_new(m, "reasoning_content", json_stringn(thinking.data, thinking.len)))
        json_decref(m), m = NULL;
    if (ok && m && json_array_size(calls) && json_object_set(m, "tool_calls", calls)) json_decref(m), m = NULL;
    if (ok) ok = push(msgs, m, e);
    json_decref(calls);
    srv_buf_free(&text), srv_buf_free(&thinking);
    return ok;
}

static json_t *messages_of(json_t *body, srv_error *e) {
    json_t *in = json_object_get(body, "messages"), *sys = json_object_get(body, "system");
    if (!json_is_array(in) || !json_array_size(in))
        return srv_fail(e, 400, INVALID, "messages", NULL, "'messages' must be a non-empty array"), NULL;
    json_t *msgs = json_array();
    bool ok = msgs || oom(e);
    if (ok && sys && !json_is_null(sys)) {
        json_t *text = srv_parts_text(sys, TEXT_BLOCKS, "system", e);
        ok = text && (json_string_length(text) == 0 ? (json_decref(text), true)
                                                     : push(msgs, json_pack("{s:s, s:o}", "role", "system", "content",
                                                                            text), e));
    }
    size_t i;
    json_t *m;
    json_array_foreach(in, i, m) {
        if (!ok) break;
        const char *role = json_string_value(json_object_get(m, "role"));
        json_t *content = json_object_get(m, "content");
        bool user = role && !strcmp(role, "user"), assistant = role && !strcmp(role, "assistant");
        if (!user && !assistant)
            ok = srv_fail(e, 400, INVALID, "messages", NULL, "'messages[%zu].role' must be \"user\" or \"assistant\"", i);
        else if (json_is_string(content))
            ok = push(msgs, json_pack("{s:s, s:O}", "role", role, "content", content), e);
        else if (!json_is_array(content))
            ok = srv_fail(e, 400, INVALID, "messages", NULL,
                          "'messages[%zu].content' must be a string or an array of content blocks", i);
        else
            ok = user ? add_user_blocks(msgs, content, i, e) : add_assistant_blocks(msgs, content, i, e);
    }
    if (!ok) json_decref(msgs), msgs = NULL;
    return msgs;
}

/* Anthropic's tools ({name, description, input_schema}) as chat tools;
 * server tools (a versioned `type`) are refused. */
static json_t *tools_of(json_t *tools, srv_error *e) {
    if (!json_is_array(tools)) return srv_fail(e, 400, INVALID, "tools", NULL, "'tools' must be an array"), NULL;
    json_t *out = json_array();
    if (!out) return oom(e), NULL;
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const char *type = json_string_value(json_object_get(t, "type"));
        if (type && strcmp(type, "custom")) {
            srv_fail(e, 400, INVALID, "tools", "unsupported_tool",
                     "'tools[%zu]' is Anthropic's server tool '%.40s'; kettle runs the client's own tools only "
                     "({name, description, input_schema})",
                     i, type);
            return json_decref(out), NULL;
        }
        json_t *fn = json_object();
        if (fn && (!srv_copy_field(fn, t, "name") || !srv_copy_field(fn, t, "description"))) json_decref(fn), fn = NULL;
        json_t *schema = json_object_get(t, "input_schema");
        if (fn && schema && json_object_set(fn, "parameters", schema)) json_decref(fn), fn = NULL;
        if (!push(out, fn ? json_pack("{s:s, s:o}", "type", "function", "function", fn) : NULL, e)) {
            json_decref(out);
            return NULL;
        }
    }
    return out;
}

/* tool_choice {type: auto | any | tool | none, name, disable_parallel_tool_use}. */
static bool tool_choice_of(json_t *tc, json_t *chat, srv_error *e) {
    const char *type = json_string_value(json_object_get(tc, "type"));
    json_t *name = json_object_get(tc, "name"), *v = NULL;
    if (type && !strcmp(type, "auto")) v = json_string("auto");
    else if (type && !strcmp(type, "any")) v = json_string("required");
    else if (type && !strcmp(type, "none")) v = json_string("none");
    else if (type && !strcmp(type, "tool") && json_is_string(name))
        v = json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name);
    else
        return srv_fail(e, 400, INVALID, "tool_choice", NULL,
                        "'tool_choice' must be {\"type\": \"auto\" | \"any\" | \"none\"} or {\"type\": \"tool\", "
                        "\"name\": ...}");
    if (!v || json_object_set_new(chat, "tool_choice", v)) return oom(e);
    if (json_is_true(json_object_get(tc, "disable_parallel_tool_use")) &&
        json_object_set_new(chat, "parallel_tool_calls", json_false()))
        return oom(e);
    return true;
}

/* thinking {type: enabled | disabled}: the template's enable_thinking. */
static bool thinking_of(json_t *th, json_t *chat, srv_error *e) {
    const char *type = json_string_value(json_object_get(th, "type"));
    if (!type || (strcmp(type, "enabled") && strcmp(type, "disabled")))
        return srv_fail(e, 400, INVALID, "thinking", NULL, "'thinking.type' must be \"enabled\" or \"disabled\"");
    json_t *kw = json_object_get(chat, "chat_template_kwargs");
    if (!kw && (json_object_set_new(chat, "chat_template_kwargs", json_object()) ||
                !(kw = json_object_get(chat, "chat_template_kwargs"))))
        return oom(e);
    return !json_object_set_new(kw, "enable_thinking", json_boolean(!strcmp(type, "enabled"))) || oom(e);
}

static const char *const PASSED[] = {"model", "temperature", "top_p", "top_k", "min_p", "seed", "stream", "priority",
                                     "chat_template_kwargs", NULL};
static const char *const MAPPED[] = {"messages", "system", "max_tokens", "stop_sequences", "tools", "tool_choice",
                                     "thinking", NULL};

static bool listed(const char *k, const char *const *list) {
    for (int i = 0; list[i]; i++)
        if (!strcmp(list[i], k)) return true;
    return false;
}

static bool check_fields(json_t *body, json_t *chat, bool counting, srv_error *e) {
    const char *k;
    json_t *v;
    json_object_foreach(body, k, v) {
        if (listed(k, MAPPED) || json_is_null(v)) continue;
        if (listed(k, PASSED) && !(counting && !strcmp(k, "stream"))) {
            if (json_object_set(chat, k, v)) return oom(e);
            continue;
        }
        if (!strcmp(k, "metadata")) continue; /* user_id: for abuse reports, nothing to do locally */
        if (!strcmp(k, "service_tier") && json_is_string(v) &&
            (!strcmp(json_string_value(v), "auto") || !strcmp(json_string_value(v), "standard_only")))
            continue;
        return srv_fail(e, 400, INVALID, k, "unsupported_parameter",
                        "'%.60s' is not a parameter kettle implements for /v1/messages; remove it", k);
    }
    return true;
}

static json_t *to_chat(json_t *body, bool counting, srv_notes *notes, srv_error *e) {
    (void)notes;
    if (!json_is_object(body)) return srv_fail(e, 400, INVALID, NULL, NULL, "the body must be a JSON object"), NULL;
    json_t *max = json_object_get(body, "max_tokens");
    if (!counting && !json_is_integer(max))
        return srv_fail(e, 400, INVALID, "max_tokens", NULL, "'max_tokens' is required and must be an integer"), NULL;
    if (!counting && json_integer_value(max) < 1)
        return srv_fail(e, 400, INVALID, "max_tokens", NULL, "'max_tokens' must be at least 1"), NULL;
    json_t *chat = json_object(), *msgs = NULL, *tools = NULL;
    bool ok = (chat || oom(e)) && check_fields(body, chat, counting, e) && (msgs = messages_of(body, e)) &&
              (!json_object_set_new(chat, "messages", msgs) || oom(e));
    if (ok && !counting) ok = !json_object_set(chat, "max_tokens", max) || oom(e);
    json_t *stop = json_object_get(body, "stop_sequences"), *t = json_object_get(body, "tools");
    json_t *tc = json_object_get(body, "tool_choice"), *th = json_object_get(body, "thinking");
    if (ok && stop && !json_is_null(stop))
        ok = json_is_array(stop) ? !json_object_set(chat, "stop", stop) || oom(e)
                                 : srv_fail(e, 400, INVALID, "stop_sequences", NULL, "'stop_sequences' must be an array of strings");
    if (ok && t && !json_is_null(t)) ok = (tools = tools_of(t, e)) && (!json_object_set_new(chat, "tools", tools) || oom(e));
    if (ok && tc && !json_is_null(tc)) ok = tool_choice_of(tc, chat, e);
    if (ok && th && !json_is_null(th)) ok = thinking_of(th, chat, e);
    if (!ok) json_decref(chat), chat = NULL;
    return chat;
}

static json_t *messages_to_chat(json_t *body, srv_notes *notes, srv_error *e) { return to_chat(body, false, notes, e); }

json_t *srv_messages_count_body(json_t *body, srv_notes *notes, srv_error *e) { return to_chat(body, true, notes, e); }

/* ---- the answer ---- */

/* stop_reason and stop_sequence from the chat finish. */
static const char *stop_reason(const char *finish, const srv_reply *rp, const srv_gen_req *r, const char **seq) {
    *seq = NULL;
    if (finish && !strcmp(finish, "tool_calls")) return "tool_use";
    if (finish && !strcmp(finish, "length")) return "max_tokens";
    int k = rp->n_choices ? rp->choices[0].stop_string : 0;
    if (k > 0 && k <= r->n_stop) {
        *seq = r->stop[k - 1];
        return "stop_sequence";
    }
    return "end_turn";
}

static json_t *usage_of(int prompt, int cached, int completion) {
    return json_pack("{s:i, s:i, s:i, s:i}", "input_tokens", prompt - cached, "cache_creation_input_tokens", 0,
                     "cache_read_input_tokens", cached, "output_tokens", completion);
}

/* NULL when the arguments are not a JSON object: the grammar makes them
 * one, so only a call cut by max_tokens is left out (stop_reason says so);
 * *oom: NULL because memory ran out, which must fail the answer instead. */
static json_t *tool_use_block(const char *id, const char *name, const char *args, size_t n, bool *oom) {
    json_t *input = srv_args_object(args, n, oom);
    json_t *blk = input ? json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use", "id", id, "name", name, "input", input) : NULL;
    if (input && !blk) *oom = true;
    return blk;
}

static json_t *content_of(json_t *msg) {
    json_t *out = json_array(), *reasoning = json_object_get(msg, "reasoning_content");
    json_t *content = json_object_get(msg, "content"), *calls = json_object_get(msg, "tool_calls");
    srv_error e;
    bool ok = out != NULL;
    if (ok && json_string_length(reasoning))
        ok = push(out, json_pack("{s:s, s:O, s:s}", "type", "thinking", "thinking", reasoning, "signature", ""), &e);
    if (ok && json_string_length(content)) ok = push(out, json_pack("{s:s, s:O}", "type", "text", "text", content), &e);
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c) if (ok) {
        json_t *fn = json_object_get(c, "function"), *args = json_object_get(fn, "arguments");
        bool oom;
        json_t *blk = tool_use_block(json_string_value(json_object_get(c, "id")),
                                     json_string_value(json_object_get(fn, "name")), json_string_value(args),
                                     json_string_length(args), &oom);
        ok = blk ? push(out, blk, &e) : !oom;
    }
    if (!ok) json_decref(out), out = NULL;
    return out;
}

static json_t *message_object(const srv_reply *rp, json_t *content, const char *reason, const char *seq, json_t *usage) {
    return json_pack("{s:s, s:s, s:s, s:s, s:o, s:o, s:o, s:o}", "id", rp->id, "type", "message", "role", "assistant",
                     "model", rp->model_name, "content", content, "stop_reason",
                     reason ? json_string(reason) : json_null(), "stop_sequence", seq ? json_string(seq) : json_null(),
                     "usage", usage);
}

static json_t *messages_from_chat(json_t *body, json_t *done, const srv_reply *rp, const srv_gen_req *r) {
    (void)body;
    json_t *choice = json_array_get(json_object_get(done, "choices"), 0), *u = json_object_get(done, "usage");
    json_t *content = content_of(json_object_get(choice, "message"));
    if (!content) return NULL;
    const char *seq, *reason = stop_reason(json_string_value(json_object_get(choice, "finish_reason")), rp, r, &seq);
    json_t *usage = usage_of((int)json_integer_value(json_object_get(u, "prompt_tokens")),
                             (int)json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"),
                                                                     "cached_tokens")),
                             (int)json_integer_value(json_object_get(u, "completion_tokens")));
    return message_object(rp, content, reason, seq, usage);
}

/* Anthropic's error types by status. */
static const char *error_type(int status) {
    switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status < 500 ? "invalid_request_error" : "api_error";
    }
}

static char *messages_error_json(const srv_error *e) {
    char msg[sizeof e->msg];
    snprintf(msg, sizeof msg, "%s", srv_utf8_valid(e->msg, strlen(e->msg)) ? e->msg : "invalid request");
    json_t *j = json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", error_type(e->status), "message", msg);
    char *s = j ? kt_json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    return s;
}

/* ---- streams ---- */

struct srv_xlate {
    const srv_reply *rp;
    const srv_gen_req *r;
    int n_prompt;
    srv_blocks blocks;
    bool started;
    srv_buf *out;
};

/* An event {type, ...fields} (fields stolen). */
static bool event(srv_xlate *x, const char *type, json_t *fields) {
    if (!fields || json_object_set_new(fields, "type", json_string(type))) {
        json_decref(fields);
        return false;
    }
    return srv_buf_event(x->out, type, fields);
}

static bool start(srv_xlate *x) {
    if (x->started) return true;
    x->started = true;
    /* the cache's share is known at the end (message_delta's usage) */
    json_t *msg = message_object(x->rp, json_array(), NULL, NULL, usage_of(x->n_prompt, 0, 0));
    return event(x, "message_start", json_pack("{s:o}", "message", msg)) && event(x, "ping", json_object());
}

static bool on_open(void *ctx, const srv_block *b) {
    srv_xlate *x = ctx;
    json_t *blk = b->kind == SRV_BLOCK_TEXT ? json_pack("{s:s, s:s}", "type", "text", "text", "")
                  : b->kind == SRV_BLOCK_REASONING
                      ? json_pack("{s:s, s:s, s:s}", "type", "thinking", "thinking", "", "signature", "")
                      : json_pack("{s:s, s:s, s:s, s:{}}", "type", "tool_use", "id", b->call_id, "name", b->name, "input");
    return event(x, "content_block_start", json_pack("{s:i, s:o}", "index", b->index, "content_block", blk));
}

static bool on_delta(void *ctx, const srv_block *b, const char *s, size_t n) {
    srv_xlate *x = ctx;
    json_t *d = b->kind == SRV_BLOCK_TEXT        ? json_pack("{s:s, s:s%}", "type", "text_delta", "text", s, n)
                : b->kind == SRV_BLOCK_REASONING ? json_pack("{s:s, s:s%}", "type", "thinking_delta", "thinking", s, n)
                                                 : json_pack("{s:s, s:s%}", "type", "input_json_delta", "partial_json", s, n);
    return event(x, "content_block_delta", json_pack("{s:i, s:o}", "index", b->index, "delta", d));
}

static bool on_close(void *ctx, const srv_block *b) {
    srv_xlate *x = ctx;
    return event(x, "content_block_stop", json_pack("{s:i}", "index", b->index));
}

static const srv_block_ops OPS = {on_open, on_delta, on_close};

static srv_xlate *messages_stream_new(json_t *body, const srv_reply *rp, const srv_gen_req *r, int n_prompt) {
    (void)body;
    srv_xlate *x = calloc(1, sizeof *x);
    if (x) x->rp = rp, x->r = r, x->n_prompt = n_prompt;
    return x;
}

static bool messages_stream_chunk(srv_xlate *x, json_t *chunk, srv_buf *out) {
    x->out = out;
    bool ok = start(x) && srv_blocks_feed(&x->blocks, chunk, &OPS, x);
    json_decref(chunk);
    return ok;
}

static bool messages_stream_end(srv_xlate *x, const kt_request_usage *u, srv_buf *out) {
    x->out = out;
    if (!start(x) || !srv_blocks_close(&x->blocks, &OPS, x)) return false;
    const char *seq, *reason = stop_reason(x->blocks.finish, x->rp, x->r, &seq);
    json_t *usage = usage_of(u->prompt_tokens, u->cached_tokens, u->completion_tokens);
    json_t *delta = json_pack("{s:s, s:o}", "stop_reason", reason, "stop_sequence", seq ? json_string(seq) : json_null());
    return event(x, "message_delta", json_pack("{s:o, s:o}", "delta", delta, "usage", usage)) &&
           event(x, "message_stop", json_object());
}

static bool messages_stream_error(srv_xlate *x, const char *msg, srv_buf *out) {
    x->out = out;
    return start(x) && event(x, "error", json_pack("{s:{s:s, s:s}}", "error", "type", "api_error", "message",
                                                    msg[0] ? msg : "the engine failed"));
}

static void messages_stream_free(srv_xlate *x) {
    if (!x) return;
    srv_blocks_free(&x->blocks);
    free(x);
}

const srv_dialect SRV_DIALECT_MESSAGES = {
    .path = "/v1/messages",
    .to_chat = messages_to_chat,
    .from_chat = messages_from_chat,
    .error_json = messages_error_json,
    .stream_new = messages_stream_new,
    .stream_chunk = messages_stream_chunk,
    .stream_end = messages_stream_end,
    .stream_error = messages_stream_error,
    .stream_free = messages_stream_free,
    .stream_oom_end = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"the "
                      "server ran out of memory while streaming this reply; the text so far is incomplete\"}}\n\n",
};
