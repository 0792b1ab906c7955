/*
 * responses.c - OpenAI's Responses API (POST /v1/responses), the OpenAI
 * Agents SDK's default path, as a dialect of chat completions (see
 * dialect.h).
 *
 * Stateless: a request carries its whole conversation in `input`
 * (messages, function_call items and their function_call_output items,
 * reasoning items); `previous_response_id` and `conversation` are refused
 * with a message saying so, and `store` is answered as false. Function
 * tools, `tool_choice`, `text.format` (JSON Schema or JSON object output)
 * and the sampling fields map onto their chat counterparts; hosted tools
 * (web search, file search, computer use...) and non-text input parts are
 * refused naming what was sent.
 *
 * The answer's output items are, in order: a reasoning item (the model's
 * thinking, as reasoning_text content), a message with one output_text
 * part, and one function_call item per call. Streams send OpenAI's
 * semantic events (response.created, output_item.added,
 * output_text.delta, function_call_arguments.delta, ...,
 * response.completed), each with its sequence_number.
 */
#include "server/dialect.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define INVALID "invalid_request_error"

static const char *const TEXT_PARTS[] = {"input_text", "output_text", "text", NULL};

/* ---- the request, as a chat body ---- */

/* A reasoning item's text: its reasoning_text content, else its summary. */
static json_t *reasoning_text(json_t *item) {
    static const char *const CONTENT[] = {"reasoning_text", NULL}, *const SUMMARY[] = {"summary_text", NULL};
    srv_error ignored;
    json_t *content = json_object_get(item, "content");
    json_t *t = json_array_size(content) ? srv_parts_text(content, CONTENT, "content", &ignored) : NULL;
    if (!t && json_array_size(json_object_get(item, "summary")))
        t = srv_parts_text(json_object_get(item, "summary"), SUMMARY, "summary", &ignored);
    return t;
}

typedef struct conv {
    json_t *messages;
    json_t *reasoning; /* a reasoning item's text, for the next assistant message */
} conv;

static bool conv_add(conv *cv, json_t *msg, srv_error *e) {
    if (!msg || json_array_append_new(cv->messages, msg))
        return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    return true;
}

/* The assistant message a call or a reasoning text belongs to: the last
 * message when it is the assistant's, else a new one. */
static json_t *assistant_msg(conv *cv, srv_error *e) {
    size_t n = json_array_size(cv->messages);
    json_t *last = n ? json_array_get(cv->messages, n - 1) : NULL;
    const char *role = json_string_value(json_object_get(last, "role"));
    if (role && !strcmp(role, "assistant")) return last;
    json_t *m = json_pack("{s:s, s:n}", "role", "assistant", "content");
    return conv_add(cv, m, e) ? m : NULL;
}

static bool take_reasoning(conv *cv, json_t *assistant) {
    if (!cv->reasoning) return true;
    bool ok = !json_object_set_new(assistant, "reasoning_content", cv->reasoning);
    cv->reasoning = NULL;
    return ok;
}

static bool add_message(conv *cv, json_t *item, size_t i, srv_error *e) {
    char where[64];
    snprintf(where, sizeof where, "input[%zu].content", i);
    const char *role = json_string_value(json_object_get(item, "role"));
    if (!role || (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system") &&
                  strcmp(role, "developer")))
        return srv_fail(e, 400, INVALID, "input", NULL,
                        "'input[%zu].role' must be \"user\", \"assistant\", \"system\" or \"developer\"", i);
    json_t *text = srv_parts_text(json_object_get(item, "content"), TEXT_PARTS, where, e);
    if (!text) return false;
    /* chat templates know "system"; a developer message is the same instruction */
    json_t *m = json_pack("{s:s, s:o}", "role", strcmp(role, "developer") ? role : "system", "content", text);
    if (!strcmp(role, "assistant") && m && !take_reasoning(cv, m)) json_decref(m), m = NULL;
    return conv_add(cv, m, e);
}

static bool add_call(conv *cv, json_t *item, size_t i, srv_error *e) {
    json_t *id = json_object_get(item, "call_id"), *name = json_object_get(item, "name");
    json_t *args = json_object_get(item, "arguments");
    if (!json_is_string(id) || !json_is_string(name) || !json_is_string(args))
        return srv_fail(e, 400, INVALID, "input", NULL,
                        "'input[%zu]' (function_call) needs string 'call_id', 'name' and 'arguments'", i);
    json_t *a = assistant_msg(cv, e);
    if (!a || !take_reasoning(cv, a)) return a ? srv_fail(e, 500, "server_error", NULL, NULL, "out of memory") : false;
    json_t *calls = json_object_get(a, "tool_calls");
    if (!calls && (json_object_set_new(a, "tool_calls", json_array()) || !(calls = json_object_get(a, "tool_calls"))))
        return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    json_t *call = json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", id, "type", "function", "function", "name", name,
                             "arguments", args);
    if (!call || json_array_append_new(calls, call)) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    return true;
}

/* The name of the call a tool result answers, for templates that show it. */
static json_t *call_name(json_t *messages, const char *call_id) {
    size_t i, k;
    json_t *m, *call;
    json_array_foreach(messages, i, m) json_array_foreach(json_object_get(m, "tool_calls"), k, call) {
        const char *id = json_string_value(json_object_get(call, "id"));
        if (id && !strcmp(id, call_id)) return json_object_get(json_object_get(call, "function"), "name");
    }
    return NULL;
}

static bool add_call_output(conv *cv, json_t *item, size_t i, srv_error *e) {
    char where[64];
    snprintf(where, sizeof where, "input[%zu].output", i);
    json_t *id = json_object_get(item, "call_id");
    if (!json_is_string(id))
        return srv_fail(e, 400, INVALID, "input", NULL, "'input[%zu]' (function_call_output) needs a string 'call_id'", i);
    json_t *text = srv_parts_text(json_object_get(item, "output"), TEXT_PARTS, where, e);
    if (!text) return false;
    json_t *m = json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id", id, "content", text);
    json_t *name = call_name(cv->messages, json_string_value(id));
    if (m && name && json_object_set(m, "name", name)) json_decref(m), m = NULL;
    return conv_add(cv, m, e);
}

static bool add_item(conv *cv, json_t *item, size_t i, srv_error *e) {
    if (!json_is_object(item)) return srv_fail(e, 400, INVALID, "input", NULL, "'input[%zu]' must be an object", i);
    const char *type = json_string_value(json_object_get(item, "type"));
    if (!type && json_object_get(item, "role")) type = "message";
    if (type && !strcmp(type, "message")) return add_message(cv, item, i, e);
    if (type && !strcmp(type, "function_call")) return add_call(cv, item, i, e);
    if (type && !strcmp(type, "function_call_output")) return add_call_output(cv, item, i, e);
    if (type && !strcmp(type, "reasoning")) {
        json_decref(cv->reasoning);
        cv->reasoning = reasoning_text(item);
        return true;
    }
    if (type && !strcmp(type, "item_reference"))
        return srv_fail(e, 400, INVALID, "input", NULL,
                        "'input[%zu]' is an item_reference; kettle does not store responses, so send the item itself", i);
    return srv_fail(e, 400, INVALID, "input", "unsupported_item",
                    "'input[%zu]' has type '%.40s'; kettle takes message, function_call, function_call_output and "
                    "reasoning items",
                    i, type ? type : "(none)");
}

/* instructions + input -> messages. */
static json_t *messages_of(json_t *body, srv_error *e) {
    json_t *input = json_object_get(body, "input"), *instr = json_object_get(body, "instructions");
    if (!input || json_is_null(input)) return srv_fail(e, 400, INVALID, "input", NULL, "'input' is required"), NULL;
    if (instr && !json_is_null(instr) && !json_is_string(instr))
        return srv_fail(e, 400, INVALID, "instructions", NULL, "'instructions' must be a string"), NULL;
    conv cv = {.messages = json_array()};
    bool ok = cv.messages != NULL || srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    if (ok && json_string_length(instr))
        ok = conv_add(&cv, json_pack("{s:s, s:O}", "role", "system", "content", instr), e);
    if (ok && json_is_string(input)) {
        ok = conv_add(&cv, json_pack("{s:s, s:O}", "role", "user", "content", input), e);
    } else if (ok && json_is_array(input)) {
        size_t i;
        json_t *item;
        json_array_foreach(input, i, item) if (ok) ok = add_item(&cv, item, i, e);
    } else if (ok) {
        ok = srv_fail(e, 400, INVALID, "input", NULL, "'input' must be a string or an array of items");
    }
    json_decref(cv.reasoning);
    if (ok && !json_array_size(cv.messages)) ok = srv_fail(e, 400, INVALID, "input", NULL, "'input' has no messages");
    if (!ok) json_decref(cv.messages), cv.messages = NULL;
    return cv.messages;
}

/* Responses function tools ({type, name, description, parameters}) as
 * chat tools; hosted tools are refused. */
static json_t *tools_of(json_t *tools, srv_error *e) {
    if (!json_is_array(tools)) return srv_fail(e, 400, INVALID, "tools", NULL, "'tools' must be an array"), NULL;
    json_t *out = json_array();
    if (!out) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory"), NULL;
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const char *type = json_string_value(json_object_get(t, "type"));
        if (!type || strcmp(type, "function")) {
            srv_fail(e, 400, INVALID, "tools", "unsupported_tool",
                     "'tools[%zu]' has type '%.40s'; kettle runs function tools only (hosted tools such as web or "
                     "file search are not available locally)",
                     i, type ? type : "(none)");
            return json_decref(out), NULL;
        }
        json_t *fn = json_object();
        const char *keys[] = {"name", "description", "parameters", "strict"};
        for (size_t k = 0; fn && k < sizeof keys / sizeof keys[0]; k++)
            if (!srv_copy_field(fn, t, keys[k])) json_decref(fn), fn = NULL;
        if (!fn || json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", fn))) {
            json_decref(out);
            return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory"), NULL;
        }
    }
    return out;
}

/* "none" | "auto" | "required" | {"type": "function", "name"}. */
static json_t *tool_choice_of(json_t *tc, srv_error *e) {
    if (json_is_string(tc)) return json_incref(tc);
    const char *type = json_string_value(json_object_get(tc, "type"));
    json_t *name = json_object_get(tc, "name");
    if (type && !strcmp(type, "function") && json_is_string(name))
        return json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name);
    return srv_fail(e, 400, INVALID, "tool_choice", NULL,
                    "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"name\": ...}"),
           NULL;
}

/* text: {format: {type: text | json_schema | json_object}} ->
 * response_format (NULL and no error: plain text). */
static bool text_format_of(json_t *text, json_t *chat, srv_error *e) {
    const char *k;
    json_t *v;
    json_object_foreach(text, k, v) {
        if (!strcmp(k, "format") || json_is_null(v)) continue;
        if (!strcmp(k, "verbosity") && json_is_string(v) && !strcmp(json_string_value(v), "medium")) continue;
        return srv_fail(e, 400, INVALID, "text", "unsupported_parameter", "'text.%.40s' is not supported by kettle", k);
    }
    json_t *f = json_object_get(text, "format");
    const char *type = json_string_value(json_object_get(f, "type"));
    if (!f || json_is_null(f) || (type && !strcmp(type, "text"))) return true;
    json_t *rf = NULL;
    if (type && !strcmp(type, "json_object")) rf = json_pack("{s:s}", "type", "json_object");
    else if (type && !strcmp(type, "json_schema")) {
        json_t *js = json_object();
        const char *keys[] = {"name", "description", "schema", "strict"};
        for (size_t i = 0; js && i < sizeof keys / sizeof keys[0]; i++)
            if (!srv_copy_field(js, f, keys[i])) json_decref(js), js = NULL;
        rf = js ? json_pack("{s:s, s:o}", "type", "json_schema", "json_schema", js) : NULL;
    } else
        return srv_fail(e, 400, INVALID, "text.format", NULL,
                        "'text.format.type' must be \"text\", \"json_schema\" or \"json_object\"");
    if (!rf || json_object_set_new(chat, "response_format", rf))
        return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    return true;
}

/* Fields copied to the chat body as they are. */
static const char *const PASSED[] = {"model", "temperature", "top_p", "top_k", "min_p", "seed", "stream",
                                     "parallel_tool_calls", "priority", "chat_template_kwargs", "reasoning_format",
                                     "user", NULL};
/* Fields read above. */
static const char *const MAPPED[] = {"input", "instructions", "tools", "tool_choice", "text", "max_output_tokens", NULL};

static bool listed(const char *k, const char *const *list) {
    for (int i = 0; list[i]; i++)
        if (!strcmp(list[i], k)) return true;
    return false;
}

static bool is_str(json_t *v, const char *a, const char *b) {
    const char *s = json_string_value(v);
    return s && (!strcmp(s, a) || (b && !strcmp(s, b)));
}

/* Fields accepted that change nothing here, each checked for a value
 * that would: true when k is one of them with such a value. */
static bool accepted_as_is(const char *k, json_t *v, srv_error *e, bool *ok) {
    *ok = true;
    if (!strcmp(k, "store") || !strcmp(k, "metadata") || !strcmp(k, "safety_identifier") ||
        !strcmp(k, "prompt_cache_key") || !strcmp(k, "prompt_cache_retention") || !strcmp(k, "stream_options"))
        return true; /* nothing is stored (answered as store: false); kettle caches every prefix anyway */
    if (!strcmp(k, "include")) {
        if (!json_array_size(v)) return true;
        *ok = srv_fail(e, 400, INVALID, "include", "unsupported_parameter",
                       "'include' asks for '%.60s'; kettle adds no extra output data",
                       json_string_value(json_array_get(v, 0)) ? json_string_value(json_array_get(v, 0)) : "?");
        return true;
    }
    if (!strcmp(k, "truncation")) {
        if (!is_str(v, "disabled", NULL))
            *ok = srv_fail(e, 400, INVALID, "truncation", "unsupported_parameter",
                           "'truncation' must be \"disabled\": kettle never drops input; a conversation longer than "
                           "the context is a context_length_exceeded error");
        return true;
    }
    if (!strcmp(k, "service_tier")) {
        if (!is_str(v, "auto", "default"))
            *ok = srv_fail(e, 400, INVALID, "service_tier", "unsupported_parameter",
                           "'service_tier' must be \"auto\" or \"default\" (a local server has one tier)");
        return true;
    }
    if (!strcmp(k, "reasoning")) {
        const char *rk;
        json_t *rv;
        json_object_foreach(v, rk, rv) if (!json_is_null(rv)) {
            *ok = srv_fail(e, 400, INVALID, "reasoning", "unsupported_parameter",
                           "'reasoning.%.30s' is not supported; chat_template_kwargs can turn a model's thinking on "
                           "or off where its template allows",
                           rk);
            break;
        }
        return true;
    }
    return false;
}

static bool unsupported(const char *k, srv_error *e) {
    if (!strcmp(k, "previous_response_id") || !strcmp(k, "conversation"))
        return srv_fail(e, 400, INVALID, k, "unsupported_parameter",
                        "'%s' needs stored responses; kettle answers statelessly: send the whole conversation in "
                        "'input' (the prefix cache makes resending it cheap)",
                        k);
    if (!strcmp(k, "background"))
        return srv_fail(e, 400, INVALID, k, "unsupported_parameter", "background responses are not supported; use 'stream'");
    return srv_fail(e, 400, INVALID, k, "unsupported_parameter",
                    "'%.60s' is not a parameter kettle implements for /v1/responses; remove it", k);
}

static bool check_fields(json_t *body, json_t *chat, srv_error *e) {
    const char *k;
    json_t *v;
    json_object_foreach(body, k, v) {
        bool ok;
        if (listed(k, MAPPED) || json_is_null(v)) continue;
        if (listed(k, PASSED)) {
            if (json_object_set(chat, k, v)) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
            continue;
        }
        if (accepted_as_is(k, v, e, &ok)) {
            if (!ok) return false;
            continue;
        }
        if ((json_is_false(v) && strcmp(k, "store")) || (!strcmp(k, "top_logprobs") && json_integer_value(v) == 0))
            continue; /* an explicit "off" is no setting at all */
        return unsupported(k, e);
    }
    return true;
}

static json_t *responses_to_chat(json_t *body, srv_notes *notes, srv_error *e) {
    (void)notes;
    if (!json_is_object(body)) return srv_fail(e, 400, INVALID, NULL, NULL, "the body must be a JSON object"), NULL;
    json_t *chat = json_object(), *msgs = NULL;
    if (!chat) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory"), NULL;
    bool ok = check_fields(body, chat, e) && (msgs = messages_of(body, e)) &&
              !json_object_set_new(chat, "messages", msgs);
    json_t *tools = json_object_get(body, "tools"), *tc = json_object_get(body, "tool_choice");
    json_t *t = NULL;
    if (ok && tools && !json_is_null(tools)) ok = (t = tools_of(tools, e)) && !json_object_set_new(chat, "tools", t);
    if (ok && tc && !json_is_null(tc)) ok = (t = tool_choice_of(tc, e)) && !json_object_set_new(chat, "tool_choice", t);
    json_t *text = json_object_get(body, "text"), *max = json_object_get(body, "max_output_tokens");
    if (ok && json_is_object(text)) ok = text_format_of(text, chat, e);
    else if (ok && text && !json_is_null(text)) ok = srv_fail(e, 400, INVALID, "text", NULL, "'text' must be an object");
    /* chat's own checks then name max_tokens; keep the Responses name */
    if (ok && max && !json_is_null(max) && !json_is_integer(max))
        ok = srv_fail(e, 400, INVALID, "max_output_tokens", NULL, "'max_output_tokens' must be an integer");
    if (ok && json_is_integer(max)) ok = !json_object_set(chat, "max_tokens", max);
    if (!ok) {
        if (!e->status) srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        json_decref(chat);
        return NULL;
    }
    return chat;
}

/* ---- the answer ---- */

/* Item ids from the response's: resp_HEX -> PREFIX_HEX_K. */
static void item_id(char *out, size_t n, const srv_reply *rp, const char *prefix, int k) {
    const char *hex = strchr(rp->id, '_');
    snprintf(out, n, "%s_%s_%d", prefix, hex ? hex + 1 : rp->id, k);
}

static json_t *usage_of(int prompt, int cached, int completion) {
    return json_pack("{s:i, s:{s:i}, s:i, s:i}", "input_tokens", prompt, "input_tokens_details", "cached_tokens", cached,
                     "output_tokens", completion, "total_tokens", prompt + completion);
}

/* body[key], or `dflt` (stolen) when absent. */
static json_t *echo(json_t *body, const char *key, json_t *dflt) {
    json_t *v = json_object_get(body, key);
    if (v && !json_is_null(v)) {
        json_decref(dflt);
        return json_incref(v);
    }
    return dflt;
}

/* The response object; output, usage, incomplete and error are stolen
 * (NULL: none; a caller whose value could not be made must not pass NULL
 * for it, which would answer null in its place). */
static json_t *response_object(json_t *body, const srv_reply *rp, const char *status, json_t *output, json_t *usage,
                               json_t *incomplete, json_t *error) {
    json_t *o = json_pack(
        "{s:s, s:s, s:I, s:s, s:b, s:o, s:o, s:o, s:o, s:s, s:o, s:o, s:n, s:{s:n, s:n}, s:b, s:o, s:o, s:o, s:o, "
        "s:o, s:s, s:o, s:o}",
        "id", rp->id, "object", "response", "created_at", (json_int_t)rp->created, "status", status, "background", 0,
        "error", error ? error : json_null(), "incomplete_details", incomplete ? incomplete : json_null(),
        "instructions", echo(body, "instructions", json_null()), "max_output_tokens",
        echo(body, "max_output_tokens", json_null()), "model", rp->model_name, "output", output ? output : json_array(),
        "parallel_tool_calls", echo(body, "parallel_tool_calls", json_true()), "previous_response_id", "reasoning",
        "effort", "summary", "store", 0, "temperature", echo(body, "temperature", json_real(1.0)), "text",
        echo(body, "text", json_pack("{s:{s:s}}", "format", "type", "text")), "tool_choice",
        echo(body, "tool_choice", json_string("auto")), "tools", echo(body, "tools", json_array()), "top_p",
        echo(body, "top_p", json_real(1.0)), "truncation", "disabled", "usage", usage ? usage : json_null(), "metadata",
        echo(body, "metadata", json_object()));
    return o;
}

static json_t *reasoning_item(const char *id, const char *s, size_t n) {
    return json_pack("{s:s, s:s, s:[], s:[{s:s, s:s%}]}", "id", id, "type", "reasoning", "summary", "content", "type",
                     "reasoning_text", "text", s, n);
}

static json_t *text_part(const char *s, size_t n) {
    return json_pack("{s:s, s:s%, s:[], s:[]}", "type", "output_text", "text", s, n, "annotations", "logprobs");
}

static json_t *message_item(const char *id, const char *status, json_t *content) {
    return json_pack("{s:s, s:s, s:s, s:s, s:o}", "id", id, "type", "message", "status", status, "role", "assistant",
                     "content", content);
}

static json_t *call_item(const char *id, const char *status, const char *call_id, const char *name, const char *args,
                         size_t n) {
    return json_pack("{s:s, s:s, s:s, s:s, s:s, s:s%}", "id", id, "type", "function_call", "status", status, "call_id",
                     call_id, "name", name, "arguments", args, n);
}

static bool push(json_t *arr, json_t *item) { return item && !json_array_append_new(arr, item); }

/* The chat message as output items; the last is "incomplete" when the
 * reply was cut by its length. */
static json_t *output_of(const srv_reply *rp, json_t *msg, bool cut) {
    json_t *out = json_array(), *reasoning = json_object_get(msg, "reasoning_content");
    json_t *content = json_object_get(msg, "content"), *calls = json_object_get(msg, "tool_calls");
    char id[96];
    int k = 0;
    bool ok = out != NULL;
    if (ok && json_string_length(reasoning)) {
        item_id(id, sizeof id, rp, "rs", k++);
        ok = push(out, reasoning_item(id, json_string_value(reasoning), json_string_length(reasoning)));
    }
    size_t n_calls = json_array_size(calls);
    if (ok && (json_string_length(content) || !n_calls)) {
        item_id(id, sizeof id, rp, "msg", k++);
        const char *s = json_is_string(content) ? json_string_value(content) : "";
        ok = push(out, message_item(id, cut && !n_calls ? "incomplete" : "completed",
                                    json_pack("[o]", text_part(s, strlen(s)))));
    }
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c) if (ok) {
        json_t *fn = json_object_get(c, "function"), *args = json_object_get(fn, "arguments");
        item_id(id, sizeof id, rp, "fc", k++);
        ok = push(out, call_item(id, cut && i + 1 == n_calls ? "incomplete" : "completed",
                                 json_string_value(json_object_get(c, "id")),
                                 json_string_value(json_object_get(fn, "name")), json_string_value(args),
                                 json_string_length(args)));
    }
    if (!ok) json_decref(out), out = NULL;
    return out;
}

static json_t *responses_from_chat(json_t *body, json_t *done, const srv_reply *rp, const srv_gen_req *r) {
    (void)r;
    json_t *choice = json_array_get(json_object_get(done, "choices"), 0), *u = json_object_get(done, "usage");
    const char *finish = json_string_value(json_object_get(choice, "finish_reason"));
    bool cut = finish && !strcmp(finish, "length");
    json_t *output = output_of(rp, json_object_get(choice, "message"), cut);
    if (!output) return NULL;
    json_t *usage = usage_of((int)json_integer_value(json_object_get(u, "prompt_tokens")),
                             (int)json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"),
                                                                     "cached_tokens")),
                             (int)json_integer_value(json_object_get(u, "completion_tokens")));
    json_t *incomplete = cut ? json_pack("{s:s}", "reason", "max_output_tokens") : NULL;
    if (!usage || (cut && !incomplete)) return json_decref(output), json_decref(usage), json_decref(incomplete), NULL;
    return response_object(body, rp, cut ? "incomplete" : "completed", output, usage, incomplete, NULL);
}

static char *responses_error_json(const srv_error *e) { return srv_error_json(e); }

/* ---- streams ---- */

struct srv_xlate {
    json_t *body;
    const srv_reply *rp;
    srv_blocks blocks;
    json_t *output; /* the items done so far */
    int seq;        /* sequence_number of the next event */
    bool started;
    srv_buf *out;   /* where the events of the current call go */
};

/* An event {type, sequence_number, ...fields} (fields stolen). */
static bool event(srv_xlate *x, const char *type, json_t *fields) {
    if (!fields || json_object_set_new(fields, "type", json_string(type)) ||
        json_object_set_new(fields, "sequence_number", json_integer(x->seq++))) {
        json_decref(fields);
        return false;
    }
    return srv_buf_event(x->out, type, fields);
}

static bool start(srv_xlate *x) {
    if (x->started) return true;
    x->started = true;
    return event(x, "response.created",
                 json_pack("{s:o}", "response", response_object(x->body, x->rp, "in_progress", NULL, NULL, NULL, NULL))) &&
           event(x, "response.in_progress",
                 json_pack("{s:o}", "response", response_object(x->body, x->rp, "in_progress", NULL, NULL, NULL, NULL)));
}

static const char *kind_prefix(srv_block_kind k) {
    return k == SRV_BLOCK_REASONING ? "rs" : k == SRV_BLOCK_TEXT ? "msg" : "fc";
}

/* The block's item, with status and its text so far. */
static json_t *block_item(const srv_xlate *x, const srv_block *b, const char *status) {
    char id[96];
    item_id(id, sizeof id, x->rp, kind_prefix(b->kind), b->index);
    const char *s = b->text.data ? b->text.data : "";
    switch (b->kind) {
    case SRV_BLOCK_REASONING:
        if (!strcmp(status, "in_progress")) return json_pack("{s:s, s:s, s:[], s:[]}", "id", id, "type", "reasoning", "summary", "content");
        return reasoning_item(id, s, b->text.len);
    case SRV_BLOCK_TEXT:
        return message_item(id, status, strcmp(status, "in_progress") ? json_pack("[o]", text_part(s, b->text.len))
                                                                      : json_array());
    case SRV_BLOCK_CALL: return call_item(id, status, b->call_id, b->name, s, b->text.len);
    }
    return NULL;
}

static json_t *item_ref(const srv_xlate *x, const srv_block *b) {
    char id[96];
    item_id(id, sizeof id, x->rp, kind_prefix(b->kind), b->index);
    return json_pack("{s:s, s:i}", "item_id", id, "output_index", b->index);
}

static bool on_open(void *ctx, const srv_block *b) {
    srv_xlate *x = ctx;
    bool ok = event(x, "response.output_item.added",
                    json_pack("{s:i, s:o}", "output_index", b->index, "item", block_item(x, b, "in_progress")));
    if (ok && b->kind == SRV_BLOCK_TEXT) {
        json_t *f = item_ref(x, b);
        ok = f && !json_object_set_new(f, "content_index", json_integer(0)) &&
             !json_object_set_new(f, "part", text_part("", 0));
        ok = ok ? event(x, "response.content_part.added", f) : (json_decref(f), false); /* event takes f */
    }
    return ok;
}

static bool on_delta(void *ctx, const srv_block *b, const char *s, size_t n) {
    srv_xlate *x = ctx;
    json_t *f = item_ref(x, b);
    if (!f || json_object_set_new(f, "delta", json_stringn(s, n))) return json_decref(f), false;
    /* event takes f; a field that could not be set leaves it to us */
    switch (b->kind) {
    case SRV_BLOCK_REASONING:
        if (json_object_set_new(f, "content_index", json_integer(0))) break;
        return event(x, "response.reasoning_text.delta", f);
    case SRV_BLOCK_TEXT:
        if (json_object_set_new(f, "content_index", json_integer(0)) || json_object_set_new(f, "logprobs", json_array()))
            break;
        return event(x, "response.output_text.delta", f);
    case SRV_BLOCK_CALL: return event(x, "response.function_call_arguments.delta", f);
    }
    json_decref(f);
    return false;
}

static bool on_close(void *ctx, const srv_block *b) {
    srv_xlate *x = ctx;
    json_t *f = item_ref(x, b), *text = json_stringn(b->text.data ? b->text.data : "", b->text.len);
    bool ok = f && text;
    if (ok && b->kind == SRV_BLOCK_CALL)
        ok = !json_object_set_new(f, "name", json_string(b->name)) && !json_object_set(f, "arguments", text) &&
             event(x, "response.function_call_arguments.done", json_incref(f));
    else if (ok)
        ok = !json_object_set_new(f, "content_index", json_integer(0)) && !json_object_set(f, "text", text) &&
             (b->kind == SRV_BLOCK_REASONING
                  ? event(x, "response.reasoning_text.done", json_incref(f))
                  : !json_object_set_new(f, "logprobs", json_array()) &&
                        event(x, "response.output_text.done", json_incref(f)));
    if (ok && b->kind == SRV_BLOCK_TEXT) {
        json_t *p = item_ref(x, b);
        ok = p && !json_object_set_new(p, "content_index", json_integer(0)) &&
             !json_object_set_new(p, "part", text_part(b->text.data ? b->text.data : "", b->text.len));
        ok = ok ? event(x, "response.content_part.done", p) : (json_decref(p), false); /* event takes p */
    }
    json_decref(f), json_decref(text);
    /* the block the finish closes is the one a length limit cut */
    json_t *item = ok ? block_item(x, b, strcmp(x->blocks.finish, "length") ? "completed" : "incomplete") : NULL;
    if (item && json_array_append(x->output, item)) json_decref(item), item = NULL; /* our reference, not taken */
    ok = item && event(x, "response.output_item.done", json_pack("{s:i, s:o}", "output_index", b->index, "item", item));
    return ok;
}

static const srv_block_ops OPS = {on_open, on_delta, on_close};

static srv_xlate *responses_stream_new(json_t *body, const srv_reply *rp, const srv_gen_req *r, int n_prompt) {
    (void)r, (void)n_prompt;
    srv_xlate *x = calloc(1, sizeof *x);
    if (!x || !(x->output = json_array())) return free(x), NULL;
    x->body = json_incref(body), x->rp = rp;
    return x;
}

static bool responses_stream_chunk(srv_xlate *x, json_t *chunk, srv_buf *out) {
    x->out = out;
    bool ok = start(x) && srv_blocks_feed(&x->blocks, chunk, &OPS, x);
    json_decref(chunk);
    return ok;
}

static bool responses_stream_end(srv_xlate *x, const kt_request_usage *u, srv_buf *out) {
    x->out = out;
    if (!start(x) || !srv_blocks_close(&x->blocks, &OPS, x)) return false;
    bool cut = !strcmp(x->blocks.finish, "length");
    json_t *usage = usage_of(u->prompt_tokens, u->cached_tokens, u->completion_tokens);
    json_t *incomplete = cut ? json_pack("{s:s}", "reason", "max_output_tokens") : NULL;
    if (!usage || (cut && !incomplete)) return json_decref(usage), json_decref(incomplete), false;
    json_t *resp = response_object(x->body, x->rp, cut ? "incomplete" : "completed", json_incref(x->output), usage,
                                   incomplete, NULL);
    return event(x, cut ? "response.incomplete" : "response.completed", json_pack("{s:o}", "response", resp));
}

static bool responses_stream_error(srv_xlate *x, const char *msg, srv_buf *out) {
    x->out = out;
    const char *m = msg[0] ? msg : "the engine failed";
    json_t *err = json_pack("{s:s, s:s}", "code", "server_error", "message", m);
    if (!err || !start(x) ||
        !event(x, "error", json_pack("{s:s, s:s, s:n}", "code", "server_error", "message", m, "param")))
        return json_decref(err), false;
    return event(x, "response.failed",
                 json_pack("{s:o}", "response",
                           response_object(x->body, x->rp, "failed", json_incref(x->output), NULL, NULL, err)));
}

static void responses_stream_free(srv_xlate *x) {
    if (!x) return;
    srv_blocks_free(&x->blocks);
    json_decref(x->output), json_decref(x->body);
    free(x);
}

const srv_dialect SRV_DIALECT_RESPONSES = {
    .path = "/v1/responses",
    .to_chat = responses_to_chat,
    .from_chat = responses_from_chat,
    .error_json = responses_error_json,
    .stream_new = responses_stream_new,
    .stream_chunk = responses_stream_chunk,
    .stream_end = responses_stream_end,
    .stream_error = responses_stream_error,
    .stream_free = responses_stream_free,
    .stream_oom_end = "event: error\ndata: {\"type\":\"error\",\"code\":\"out_of_memory\",\"message\":\"the server ran "
                      "out of memory while streaming this reply; the text so far is incomplete\",\"param\":null,"
                      "\"sequence_number\":0}\n\n",
};
