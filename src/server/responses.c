/*
 * responses.c - OpenAI's Responses API (POST /v1/responses), the OpenAI
 * Agents SDK's default path and OpenAI Codex's, as a dialect of chat
 * completions (see dialect.h).
 *
 * Every request field is honoured, accepted with a stated meaning, or
 * refused with a 400 naming it, and refused only where honouring it is
 * impossible and ignoring it would change the answer (README, "API
 * compatibility" -> "Responses API", has the table). What is accepted but
 * left out is said in the x-kettle-warning header (srv_note).
 *
 * Stateless: a request carries its whole conversation in `input`
 * (messages, function_call / custom_tool_call items and their outputs,
 * reasoning items); `previous_response_id` and `conversation` are refused
 * with a message saying so, and `store` is answered as false. Tools are
 * responses_tools.c's (namespaces flattened, custom tools as functions of
 * one string, hosted tools left out under tool_choice auto).
 * `reasoning.effort` is chat's `reasoning_effort` (the template's thinking
 * switch); `text.format` and the sampling fields map onto their chat
 * counterparts.
 *
 * The answer's output items are, in order: a reasoning item (the model's
 * thinking as reasoning_text content; also as its own summary_text when
 * reasoning.summary asks for a summary, since kettle does not summarize;
 * and as encrypted_content when `include` asks for it: a readable, NOT
 * encrypted, copy that a later request's reasoning item gives back to the
 * assistant turn), a message with one output_text part, and one
 * function_call or custom_tool_call item per call (with the namespace its
 * tool came in). Streams send OpenAI's semantic events (response.created,
 * output_item.added, output_text.delta, function_call_arguments.delta,
 * ..., response.completed), each with its sequence_number.
 */
#include "server/dialect.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json_safe.h"
#include "server/responses_tools.h"

#define INVALID "invalid_request_error"

static const char *const TEXT_PARTS[] = {"input_text", "output_text", "text", NULL};

static bool oom(srv_error *e) { return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory"); }

static bool one_of(const char *s, const char *const *list) {
    for (int i = 0; s && list[i]; i++)
        if (!strcmp(list[i], s)) return true;
    return false;
}

/* ---- reasoning kettle can read back: encrypted_content ----
 * base64 of {"kettle_reasoning": 1, "text": THINKING}. Not encryption:
 * the client holds the whole conversation anyway, and a stateless server
 * can only give the thinking back if the client carries it. The version
 * field lets a later format be told apart. */

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static bool base64_encode(srv_buf *out, const unsigned char *p, size_t n) {
    bool ok = true;
    for (size_t i = 0; ok && i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        char q[4] = {B64[v >> 18 & 63], B64[v >> 12 & 63], i + 1 < n ? B64[v >> 6 & 63] : '=',
                     i + 2 < n ? B64[v & 63] : '='};
        ok = srv_buf_append(out, q, 4);
    }
    return ok;
}

/* Decodes base64 (padding optional); false for anything else, or out of
 * memory (*oom). */
static bool base64_decode(srv_buf *out, const char *s, size_t n, bool *oom) {
    uint32_t v = 0;
    int bits = 0;
    while (n && s[n - 1] == '=') n--;
    for (size_t i = 0; i < n; i++) {
        const char *c = s[i] ? strchr(B64, s[i]) : NULL;
        if (!c) return false;
        v = v << 6 | (uint32_t)(c - B64), bits += 6;
        if (bits >= 8) {
            char byte = (char)(v >> (bits - 8) & 0xff);
            bits -= 8;
            if (!srv_buf_append(out, &byte, 1)) return !(*oom = true);
        }
    }
    return true;
}

/* The thinking s[0..n) as encrypted_content (a JSON string), or NULL. */
static json_t *seal(const char *s, size_t n) {
    json_t *j = json_pack("{s:i, s:s%}", "kettle_reasoning", 1, "text", s, n);
    char *text = j ? kt_json_dumps(j, JSON_COMPACT) : NULL;
    srv_buf b = {0};
    bool ok = text && base64_encode(&b, (const unsigned char *)text, strlen(text));
    json_t *sealed = ok ? json_stringn(b.data, b.len) : NULL;
    srv_buf_free(&b), free(text), json_decref(j);
    return sealed;
}

/* The thinking in an encrypted_content kettle made, or NULL: not kettle's
 * (another server's encryption), or out of memory (*oom). */
static json_t *unseal(const char *s, size_t n, bool *oom) {
    srv_buf b = {0};
    json_t *j = NULL, *text = NULL;
    json_error_t je;
    if (base64_decode(&b, s, n, oom) && b.len) {
        j = kt_json_loadb(b.data, b.len, 0, &je);
        if (!j && json_error_code(&je) == json_error_out_of_memory) *oom = true;
    }
    if (json_integer_value(json_object_get(j, "kettle_reasoning")) == 1 && json_is_string(json_object_get(j, "text")))
        text = json_incref(json_object_get(j, "text"));
    json_decref(j), srv_buf_free(&b);
    return text;
}

/* ---- the request, as a chat body ---- */

typedef struct conv {
    json_t *messages;
    json_t *reasoning; /* a reasoning item's text, for the next assistant message */
    int foreign;       /* reasoning items whose encrypted_content kettle did not make */
} conv;

/* A reasoning item's text: kettle's encrypted_content, else its
 * reasoning_text content, else its summary (NULL: none, or out of memory:
 * e filled). Another server's encrypted_content is counted, not read. */
static bool reasoning_text(conv *cv, json_t *item, json_t **out, srv_error *e) {
    static const char *const CONTENT[] = {"reasoning_text", "text", NULL}, *const SUMMARY[] = {"summary_text", NULL};
    json_t *enc = json_object_get(item, "encrypted_content");
    bool no_memory = false;
    *out = NULL;
    if (json_string_length(enc)) {
        if ((*out = unseal(json_string_value(enc), json_string_length(enc), &no_memory))) return true;
        if (no_memory) return oom(e);
        cv->foreign++;
    }
    srv_error err = {0};
    json_t *content = json_object_get(item, "content"), *summary = json_object_get(item, "summary");
    if (json_array_size(content)) *out = srv_parts_text(content, CONTENT, "content", &err);
    if (!*out && err.status != 500 && json_array_size(summary)) *out = srv_parts_text(summary, SUMMARY, "summary", &err);
    return err.status != 500 || oom(e); /* a part of another type: no text, as for none */
}

static bool conv_add(conv *cv, json_t *msg, srv_error *e) {
    if (!msg || json_array_append_new(cv->messages, msg)) return oom(e);
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
    json_t *text = !strcmp(role, "user") ? srv_parts_chat(json_object_get(item, "content"), TEXT_PARTS, where, e)
                                         : srv_parts_text(json_object_get(item, "content"), TEXT_PARTS, where, e);
    if (!text) return false;
    /* chat templates know "system"; a developer message is the same instruction */
    json_t *m = json_pack("{s:s, s:o}", "role", strcmp(role, "developer") ? role : "system", "content", text);
    if (!strcmp(role, "assistant") && m && !take_reasoning(cv, m)) json_decref(m), m = NULL;
    return conv_add(cv, m, e);
}

/* A call the assistant made: a function_call's arguments, or a
 * custom_tool_call's input as the one argument its chat function has. The
 * name is the chat name of the tool (its namespace's, if it names one). */
static bool add_call(conv *cv, json_t *item, size_t i, bool custom, srv_error *e) {
    json_t *id = json_object_get(item, "call_id"), *name = json_object_get(item, "name");
    json_t *ns = json_object_get(item, "namespace"), *args = json_object_get(item, custom ? "input" : "arguments");
    if (!json_is_string(id) || !json_is_string(name) || !json_is_string(args) ||
        (ns && !json_is_null(ns) && !json_is_string(ns)))
        return srv_fail(e, 400, INVALID, "input", NULL, "'input[%zu]' (%s) needs string 'call_id', 'name' and '%s'", i,
                        custom ? "custom_tool_call" : "function_call", custom ? "input" : "arguments");
    char chat_name[RSP_NAME_MAX + 1];
    rsp_chat_name(json_string_value(ns), json_string_value(name), chat_name);
    json_t *a = assistant_msg(cv, e), *calls = NULL;
    if (!a) return false;
    if (!take_reasoning(cv, a) ||
        (!(calls = json_object_get(a, "tool_calls")) &&
         (json_object_set_new(a, "tool_calls", json_array()) || !(calls = json_object_get(a, "tool_calls")))))
        return oom(e);
    json_t *text = custom ? json_pack("{s:O}", "input", args) : json_incref(args);
    char *dumped = custom && text ? kt_json_dumps(text, JSON_COMPACT) : NULL;
    json_t *arguments = custom ? (dumped ? json_string(dumped) : NULL) : json_incref(text);
    free(dumped), json_decref(text);
    json_t *call = arguments ? json_pack("{s:O, s:s, s:{s:s, s:o}}", "id", id, "type", "function", "function", "name",
                                         chat_name, "arguments", arguments)
                             : NULL;
    return (call && !json_array_append_new(calls, call)) || oom(e);
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

/* function_call_output and custom_tool_call_output: a tool message. */
static bool add_call_output(conv *cv, json_t *item, size_t i, const char *type, srv_error *e) {
    char where[64];
    snprintf(where, sizeof where, "input[%zu].output", i);
    json_t *id = json_object_get(item, "call_id");
    if (!json_is_string(id))
        return srv_fail(e, 400, INVALID, "input", NULL, "'input[%zu]' (%s) needs a string 'call_id'", i, type);
    json_t *text = srv_parts_chat(json_object_get(item, "output"), TEXT_PARTS, where, e);
    if (!text) return false;
    json_t *m = json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id", id, "content", text);
    json_t *name = call_name(cv->messages, json_string_value(id));
    if (m && name && json_object_set(m, "name", name)) json_decref(m), m = NULL;
    return conv_add(cv, m, e);
}

static bool add_reasoning(conv *cv, json_t *item, srv_error *e) {
    json_t *text;
    if (!reasoning_text(cv, item, &text, e)) return false;
    json_decref(cv->reasoning);
    cv->reasoning = text;
    return true;
}

static bool add_item(conv *cv, json_t *item, size_t i, srv_error *e) {
    if (!json_is_object(item)) return srv_fail(e, 400, INVALID, "input", NULL, "'input[%zu]' must be an object", i);
    const char *type = json_string_value(json_object_get(item, "type"));
    if (!type && json_object_get(item, "role")) type = "message";
    if (type && !strcmp(type, "message")) return add_message(cv, item, i, e);
    if (type && !strcmp(type, "function_call")) return add_call(cv, item, i, false, e);
    if (type && !strcmp(type, "custom_tool_call")) return add_call(cv, item, i, true, e);
    if (type && (!strcmp(type, "function_call_output") || !strcmp(type, "custom_tool_call_output")))
        return add_call_output(cv, item, i, type, e);
    if (type && !strcmp(type, "reasoning")) return add_reasoning(cv, item, e);
    if (type && !strcmp(type, "additional_tools")) return true; /* its tools are the tools' (responses_tools.c) */
    if (type && !strcmp(type, "item_reference"))
        return srv_fail(e, 400, INVALID, "input", NULL,
                        "'input[%zu]' is an item_reference; kettle does not store responses, so send the item itself", i);
    return srv_fail(e, 400, INVALID, "input", "unsupported_item",
                    "'input[%zu]' has type '%.40s'; kettle takes message, function_call, function_call_output, "
                    "custom_tool_call, custom_tool_call_output, reasoning and additional_tools items",
                    i, type ? type : "(none)");
}

/* instructions + input -> messages. */
static json_t *messages_of(json_t *body, srv_notes *notes, srv_error *e) {
    json_t *input = json_object_get(body, "input"), *instr = json_object_get(body, "instructions");
    if (!input || json_is_null(input)) return srv_fail(e, 400, INVALID, "input", NULL, "'input' is required"), NULL;
    if (instr && !json_is_null(instr) && !json_is_string(instr))
        return srv_fail(e, 400, INVALID, "instructions", NULL, "'instructions' must be a string"), NULL;
    conv cv = {.messages = json_array()};
    bool ok = cv.messages != NULL || oom(e);
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
    if (ok && cv.foreign)
        srv_note(notes, "%d reasoning item(s) carry encrypted_content kettle did not make (another server's); their "
                        "thinking is left out of the prompt", cv.foreign);
    if (!ok) json_decref(cv.messages), cv.messages = NULL;
    return cv.messages;
}

/* text: {format: {type: text | json_schema | json_object}, verbosity} ->
 * response_format (none for plain text). */
static bool text_format_of(json_t *text, json_t *chat, srv_notes *notes, srv_error *e) {
    static const char *const VERBOSITY[] = {"low", "medium", "high", NULL};
    const char *k;
    json_t *v;
    json_object_foreach(text, k, v) {
        if (!strcmp(k, "format") || json_is_null(v)) continue;
        if (!strcmp(k, "verbosity")) {
            const char *s = json_string_value(v);
            if (!one_of(s, VERBOSITY))
                return srv_fail(e, 400, INVALID, "text.verbosity", NULL,
                                "'text.verbosity' '%.20s' is not one of \"low\", \"medium\" or \"high\"", s ? s : "?");
            if (strcmp(s, "medium")) /* a hint to OpenAI's models; the model's own length is kept */
                srv_note(notes, "text.verbosity '%s' has no effect: the model answers at its usual length", s);
            continue;
        }
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
    if (!rf || json_object_set_new(chat, "response_format", rf)) return oom(e);
    return true;
}

/* reasoning.effort -> chat's reasoning_effort (the template's thinking
 * switch: none / minimal off, low..max on, and its reasoning_effort
 * variable). */
static bool effort_of(json_t *v, json_t *chat, srv_error *e) {
    static const char *const EFFORTS[] = {"none", "minimal", "low", "medium", "high", "xhigh", "max", NULL};
    const char *s = json_string_value(v);
    if (!one_of(s, EFFORTS))
        return srv_fail(e, 400, INVALID, "reasoning.effort", NULL,
                        "'reasoning.effort' '%.20s' is not one of \"none\", \"minimal\", \"low\", \"medium\", "
                        "\"high\", \"xhigh\" or \"max\"",
                        s ? s : "?");
    return !json_object_set(chat, "reasoning_effort", v) || oom(e);
}

/* reasoning: {effort, summary (generate_summary), context, mode}. A
 * summary is answered with the thinking itself (see the top). */
static bool reasoning_of(json_t *r, json_t *chat, srv_notes *notes, srv_error *e) {
    static const char *const SUMMARIES[] = {"auto", "concise", "detailed", "none", NULL};
    static const char *const CONTEXTS[] = {"auto", "current_turn", "all_turns", NULL};
    if (!json_is_object(r)) return srv_fail(e, 400, INVALID, "reasoning", NULL, "'reasoning' must be an object");
    const char *k;
    json_t *v;
    json_object_foreach(r, k, v) {
        const char *s = json_string_value(v);
        if (json_is_null(v)) continue;
        if (!strcmp(k, "effort")) {
            if (!effort_of(v, chat, e)) return false;
        } else if (!strcmp(k, "summary") || !strcmp(k, "generate_summary")) {
            if (!one_of(s, SUMMARIES))
                return srv_fail(e, 400, INVALID, "reasoning.summary", NULL,
                                "'reasoning.%s' '%.20s' is not one of \"auto\", \"concise\", \"detailed\" or \"none\"", k,
                                s ? s : "?");
        } else if (!strcmp(k, "context")) {
            if (!one_of(s, CONTEXTS))
                return srv_fail(e, 400, INVALID, "reasoning.context", NULL,
                                "'reasoning.context' must be \"auto\", \"current_turn\" or \"all_turns\"");
            if (strcmp(s, "auto"))
                srv_note(notes, "reasoning.context '%s': the chat template decides which turns' reasoning it shows", s);
        } else if (!strcmp(k, "mode")) {
            if (!s || strcmp(s, "standard"))
                return srv_fail(e, 400, INVALID, "reasoning.mode", "unsupported_parameter",
                                "'reasoning.mode' '%.20s': kettle has one reasoning mode, \"standard\"", s ? s : "?");
        } else {
            return srv_fail(e, 400, INVALID, "reasoning", "unsupported_parameter",
                            "'reasoning.%.30s' is not a reasoning field kettle knows; remove it", k);
        }
    }
    return true;
}

/* include: extra output data. reasoning.encrypted_content is answered
 * (see the top); the values about hosted tool calls and input images ask
 * for data of items kettle never makes or takes; logprobs are not on
 * this path. */
static bool include_ok(json_t *v, srv_error *e) {
    static const char *const NOTHING_HERE[] = {"reasoning.encrypted_content", "file_search_call.results",
                                               "web_search_call.results", "web_search_call.action.sources",
                                               "code_interpreter_call.outputs", "message.input_image.image_url",
                                               "computer_call_output.output.image_url", NULL};
    if (!json_is_array(v)) return srv_fail(e, 400, INVALID, "include", NULL, "'include' must be an array of strings");
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) {
        const char *what = json_string_value(s);
        if (one_of(what, NOTHING_HERE)) continue;
        if (what && !strcmp(what, "message.output_text.logprobs"))
            return srv_fail(e, 400, INVALID, "include", "unsupported_parameter",
                            "'include' asks for 'message.output_text.logprobs'; kettle returns logprobs on "
                            "/v1/chat/completions (\"logprobs\": true), not on /v1/responses");
        return srv_fail(e, 400, INVALID, "include", "unsupported_parameter",
                        "'include' asks for '%.60s', which is not an output kettle knows", what ? what : "?");
    }
    return true;
}

/* Fields copied to the chat body as they are. */
static const char *const PASSED[] = {"model", "temperature", "top_p", "top_k", "min_p", "seed", "stream",
                                     "parallel_tool_calls", "priority", "chat_template_kwargs", "reasoning_format",
                                     "user", NULL};
/* Fields read by responses_to_chat itself. */
static const char *const MAPPED[] = {"input", "instructions", "tools", "tool_choice", "text", "max_output_tokens",
                                     "reasoning", "include", NULL};
/* Fields that change nothing kettle does, whatever their value: nothing
 * is stored (store is answered as false), kettle caches every prefix
 * anyway, streams carry no obfuscation, metadata is the client's. */
static const char *const INERT[] = {"store", "metadata", "client_metadata", "safety_identifier", "prompt_cache_key",
                                    "prompt_cache_retention", "prompt_cache_options", "stream_options", NULL};

static bool is_str(json_t *v, const char *a, const char *b) {
    const char *s = json_string_value(v);
    return s && (!strcmp(s, a) || (b && !strcmp(s, b)));
}

typedef enum field_verdict { FIELD_UNKNOWN, FIELD_OK, FIELD_REFUSED } field_verdict;

/* Fields whose value decides: accepted (maybe with a note), or refused. */
static field_verdict checked_field(const char *k, json_t *v, srv_notes *notes, srv_error *e) {
    static const char *const TIERS[] = {"flex", "scale", "priority", NULL};
    if (!strcmp(k, "truncation")) {
        if (is_str(v, "auto", NULL)) /* overflow is an error, never a silently different answer */
            srv_note(notes, "truncation 'auto': kettle never drops input; a conversation longer than the context is a "
                            "context_length_exceeded error");
        else if (!is_str(v, "disabled", NULL))
            return srv_fail(e, 400, INVALID, k, NULL, "'truncation' must be \"auto\" or \"disabled\""), FIELD_REFUSED;
    } else if (!strcmp(k, "context_management")) {
        if (!json_is_array(v))
            return srv_fail(e, 400, INVALID, k, NULL, "'context_management' must be an array"), FIELD_REFUSED;
        srv_note(notes, "context_management: kettle does not compact; a conversation longer than the context is a "
                        "context_length_exceeded error");
    } else if (!strcmp(k, "service_tier")) {
        if (one_of(json_string_value(v), TIERS))
            srv_note(notes, "service_tier '%s': kettle has one tier", json_string_value(v));
        else if (!is_str(v, "auto", "default"))
            return srv_fail(e, 400, INVALID, k, NULL,
                            "'service_tier' must be \"auto\", \"default\", \"flex\", \"scale\" or \"priority\""),
                   FIELD_REFUSED;
    } else if (!strcmp(k, "top_logprobs")) {
        if (json_integer_value(v) != 0 || !json_is_integer(v))
            return srv_fail(e, 400, INVALID, k, "unsupported_parameter",
                            "'top_logprobs' asks for logprobs, which kettle returns on /v1/chat/completions, not on "
                            "/v1/responses"),
                   FIELD_REFUSED;
    } else if (!strcmp(k, "previous_response_id") || !strcmp(k, "conversation")) {
        return srv_fail(e, 400, INVALID, k, "unsupported_parameter",
                        "'%s' needs stored responses; kettle answers statelessly: send the whole conversation in "
                        "'input' (the prefix cache makes resending it cheap)",
                        k),
               FIELD_REFUSED;
    } else if (!strcmp(k, "background")) {
        if (!json_is_false(v))
            return srv_fail(e, 400, INVALID, k, "unsupported_parameter",
                            "background responses are not supported (nothing is stored to poll); use 'stream'"),
                   FIELD_REFUSED;
    } else if (!strcmp(k, "prompt")) {
        return srv_fail(e, 400, INVALID, k, "unsupported_parameter",
                        "'prompt' names a stored prompt template; kettle stores none: send 'instructions' and 'input'"),
               FIELD_REFUSED;
    } else if (!strcmp(k, "moderation")) {
        return srv_fail(e, 400, INVALID, k, "unsupported_parameter",
                        "'moderation' asks for a moderation model's verdict on input and output; kettle runs none"),
               FIELD_REFUSED;
    } else {
        return FIELD_UNKNOWN;
    }
    return FIELD_OK;
}

static bool check_fields(json_t *body, json_t *chat, srv_notes *notes, srv_error *e) {
    const char *k;
    json_t *v;
    json_object_foreach(body, k, v) {
        if (one_of(k, MAPPED) || one_of(k, INERT)) continue;
        if (one_of(k, PASSED)) {
            if (!json_is_null(v) && json_object_set(chat, k, v)) return oom(e);
            continue;
        }
        if (json_is_null(v) || json_is_false(v)) { /* an explicit "off" of a field the API has is no setting */
            srv_error unused;
            if (checked_field(k, v, NULL, &unused) != FIELD_UNKNOWN) continue;
        } else {
            field_verdict f = checked_field(k, v, notes, e);
            if (f == FIELD_REFUSED) return false;
            if (f == FIELD_OK) continue;
        }
        return srv_fail(e, 400, INVALID, k, "unsupported_parameter",
                        "'%.60s' is not a parameter kettle implements for /v1/responses; remove it", k);
    }
    return true;
}

static json_t *responses_to_chat(json_t *body, srv_notes *notes, srv_error *e) {
    if (!json_is_object(body)) return srv_fail(e, 400, INVALID, NULL, NULL, "the body must be a JSON object"), NULL;
    json_t *chat = json_object(), *msgs = NULL;
    if (!chat) return oom(e), NULL;
    json_t *text = json_object_get(body, "text"), *max = json_object_get(body, "max_output_tokens");
    json_t *reasoning = json_object_get(body, "reasoning"), *include = json_object_get(body, "include");
    bool ok = check_fields(body, chat, notes, e) && (msgs = messages_of(body, notes, e)) &&
              (!json_object_set_new(chat, "messages", msgs) || oom(e)) && rsp_tools_to_chat(body, chat, notes, e);
    if (ok && reasoning && !json_is_null(reasoning)) ok = reasoning_of(reasoning, chat, notes, e);
    if (ok && include && !json_is_null(include)) ok = include_ok(include, e);
    if (ok && json_is_object(text)) ok = text_format_of(text, chat, notes, e);
    else if (ok && text && !json_is_null(text)) ok = srv_fail(e, 400, INVALID, "text", NULL, "'text' must be an object");
    /* chat's own checks then name max_tokens; keep the Responses name */
    if (ok && max && !json_is_null(max) && !json_is_integer(max))
        ok = srv_fail(e, 400, INVALID, "max_output_tokens", NULL, "'max_output_tokens' must be an integer");
    if (ok && json_is_integer(max)) ok = !json_object_set(chat, "max_tokens", max) || oom(e);
    if (!ok) json_decref(chat), chat = NULL;
    return chat;
}

/* ---- the answer ---- */

/* What the request asked of its answer, beyond the chat completion. */
typedef struct answer_opts {
    bool summary;      /* reasoning.summary asked for one: the thinking is its own summary */
    bool sealed;       /* include asks for reasoning.encrypted_content */
    json_t *callables; /* chat name -> the tool it stands for (responses_tools.h) */
} answer_opts;

static bool include_has(json_t *body, const char *what) {
    size_t i;
    json_t *s;
    json_array_foreach(json_object_get(body, "include"), i, s) if (is_str(s, what, NULL)) return true;
    return false;
}

/* False when out of memory. */
static bool answer_opts_of(json_t *body, answer_opts *o) {
    json_t *r = json_object_get(body, "reasoning");
    json_t *summary = json_object_get(r, "summary");
    if (!json_is_string(summary)) summary = json_object_get(r, "generate_summary");
    o->summary = json_is_string(summary) && !is_str(summary, "none", NULL);
    o->sealed = include_has(body, "reasoning.encrypted_content");
    o->callables = rsp_callables(body);
    return o->callables != NULL;
}

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

/* The request's text settings as the response says them: its format
 * "text" unless it named one. */
static json_t *text_echo(json_t *body) {
    json_t *text = json_object_get(body, "text"), *t = json_is_object(text) ? json_copy(text) : json_object();
    json_t *f = json_object_get(t, "format");
    if (t && (!f || json_is_null(f)) && json_object_set_new(t, "format", json_pack("{s:s}", "type", "text")))
        json_decref(t), t = NULL;
    return t;
}

/* The response object; output, usage, incomplete and error are stolen
 * (NULL: none; a caller whose value could not be made must not pass NULL
 * for it, which would answer null in its place). */
static json_t *response_object(json_t *body, const srv_reply *rp, const char *status, json_t *output, json_t *usage,
                               json_t *incomplete, json_t *error) {
    json_t *o = json_pack(
        "{s:s, s:s, s:I, s:s, s:b, s:o, s:o, s:o, s:o, s:s, s:o, s:o, s:n, s:o, s:b, s:o, s:o, s:o, s:o, "
        "s:o, s:s, s:o, s:o}",
        "id", rp->id, "object", "response", "created_at", (json_int_t)rp->created, "status", status, "background", 0,
        "error", error ? error : json_null(), "incomplete_details", incomplete ? incomplete : json_null(),
        "instructions", echo(body, "instructions", json_null()), "max_output_tokens",
        echo(body, "max_output_tokens", json_null()), "model", rp->model_name, "output", output ? output : json_array(),
        "parallel_tool_calls", echo(body, "parallel_tool_calls", json_true()), "previous_response_id", "reasoning",
        echo(body, "reasoning", json_pack("{s:n, s:n}", "effort", "summary")), "store", 0, "temperature",
        echo(body, "temperature", json_real(1.0)), "text", text_echo(body),
        "tool_choice", echo(body, "tool_choice", json_string("auto")), "tools", echo(body, "tools", json_array()), "top_p",
        echo(body, "top_p", json_real(1.0)), "truncation", "disabled", "usage", usage ? usage : json_null(), "metadata",
        echo(body, "metadata", json_object()));
    return o;
}

/* The reasoning item: the thinking as reasoning_text, and as the summary
 * and encrypted_content when asked for. */
static json_t *reasoning_item(const char *id, const char *s, size_t n, const answer_opts *o) {
    json_t *item = json_pack("{s:s, s:s, s:[], s:[{s:s, s:s%}]}", "id", id, "type", "reasoning", "summary", "content",
                             "type", "reasoning_text", "text", s, n);
    json_t *summary = item && o->summary ? json_pack("{s:s, s:s%}", "type", "summary_text", "text", s, n) : NULL;
    if (item && o->summary && json_array_append_new(json_object_get(item, "summary"), summary))
        json_decref(item), item = NULL;
    if (item && o->sealed && json_object_set_new(item, "encrypted_content", seal(s, n))) json_decref(item), item = NULL;
    return item;
}

static json_t *text_part(const char *s, size_t n) {
    return json_pack("{s:s, s:s%, s:[], s:[]}", "type", "output_text", "text", s, n, "annotations", "logprobs");
}

static json_t *message_item(const char *id, const char *status, json_t *content) {
    return json_pack("{s:s, s:s, s:s, s:s, s:o}", "id", id, "type", "message", "status", status, "role", "assistant",
                     "content", content);
}

/* The tool a chat call's name stands for: {type, name, namespace?}, or
 * NULL (a name the request's tools do not have: answered as it is). */
static json_t *callable(const answer_opts *o, const char *chat_name) { return json_object_get(o->callables, chat_name); }

static bool is_custom(const answer_opts *o, const char *chat_name) {
    return is_str(json_object_get(callable(o, chat_name), "type"), "custom", NULL);
}

/* args[0..n) with its string and object closed: `"}` after it. */
static json_t *closed_args(const char *args, size_t n, bool *no_memory) {
    srv_buf b = {0};
    json_t *a = NULL;
    if (srv_buf_append(&b, args, n) && srv_buf_append(&b, "\"}", 2)) a = srv_args_object(b.data, b.len, no_memory);
    else *no_memory = true;
    srv_buf_free(&b);
    return a;
}

/* A custom tool's input: the `input` argument of its chat call. A call
 * cut short (max_output_tokens) stops inside that string: it is closed
 * where it stopped (an escape cut in two dropped), else the arguments
 * text is given as it is. NULL when out of memory. */
static json_t *custom_input(const char *args, size_t n) {
    bool no_memory = false;
    json_t *a = srv_args_object(args, n, &no_memory);
    for (size_t drop = 0; !a && !no_memory && drop < n && drop <= 6; drop++) a = closed_args(args, n - drop, &no_memory);
    json_t *input = json_object_get(a, "input");
    json_t *s = json_is_string(input) ? json_incref(input) : no_memory ? NULL : json_stringn(args, n);
    json_decref(a);
    return s;
}

/* A call as the client's item: a function_call with its arguments, or a
 * custom_tool_call with its input, under the tool's own name and
 * namespace. */
static json_t *call_item(const answer_opts *o, const char *id, const char *status, const char *call_id,
                         const char *chat_name, const char *args, size_t n) {
    json_t *what = callable(o, chat_name), *ns = json_object_get(what, "namespace");
    const char *name = what ? json_string_value(json_object_get(what, "name")) : chat_name;
    json_t *item;
    if (is_custom(o, chat_name))
        item = json_pack("{s:s, s:s, s:s, s:s, s:s, s:o}", "id", id, "type", "custom_tool_call", "status", status,
                         "call_id", call_id, "name", name, "input", custom_input(args, n));
    else
        item = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s%}", "id", id, "type", "function_call", "status", status,
                         "call_id", call_id, "name", name, "arguments", args, n);
    if (item && ns && json_object_set(item, "namespace", ns)) json_decref(item), item = NULL;
    return item;
}

static bool push(json_t *arr, json_t *item) { return item && !json_array_append_new(arr, item); }

/* The chat message as output items; the last is "incomplete" when the
 * reply was cut by its length. */
static json_t *output_of(const srv_reply *rp, json_t *msg, bool cut, const answer_opts *o) {
    json_t *out = json_array(), *reasoning = json_object_get(msg, "reasoning_content");
    json_t *content = json_object_get(msg, "content"), *calls = json_object_get(msg, "tool_calls");
    char id[96];
    int k = 0;
    bool ok = out != NULL;
    if (ok && json_string_length(reasoning)) {
        item_id(id, sizeof id, rp, "rs", k++);
        ok = push(out, reasoning_item(id, json_string_value(reasoning), json_string_length(reasoning), o));
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
        const char *name = json_string_value(json_object_get(fn, "name"));
        item_id(id, sizeof id, rp, name && is_custom(o, name) ? "ctc" : "fc", k++);
        ok = push(out, call_item(o, id, cut && i + 1 == n_calls ? "incomplete" : "completed",
                                 json_string_value(json_object_get(c, "id")), name ? name : "",
                                 json_string_value(args), json_string_length(args)));
    }
    if (!ok) json_decref(out), out = NULL;
    return out;
}

static json_t *responses_from_chat(json_t *body, json_t *done, const srv_reply *rp, const srv_gen_req *r) {
    (void)r;
    answer_opts o;
    if (!answer_opts_of(body, &o)) return NULL;
    json_t *choice = json_array_get(json_object_get(done, "choices"), 0), *u = json_object_get(done, "usage");
    const char *finish = json_string_value(json_object_get(choice, "finish_reason"));
    bool cut = finish && !strcmp(finish, "length");
    json_t *output = output_of(rp, json_object_get(choice, "message"), cut, &o);
    json_decref(o.callables);
    if (!output) return NULL;
    json_t *usage = usage_of((int)json_integer_value(json_object_get(u, "prompt_tokens")),
                             (int)json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"),
                                                                     "cached_tokens")),
                             (int)json_integer_value(json_object_get(u, "completion_tokens")));
    json_t *incomplete = cut ? json_pack("{s:s}", "reason", "max_output_tokens") : NULL;
    if (!usage || (cut && !incomplete)) return json_decref(output), json_decref(usage), json_decref(incomplete), NULL;
    return response_object(body, rp, cut ? "incomplete" : "completed", output, usage, incomplete, NULL);
}

/* Errors name the Responses field a client must change: the chat path
 * behind says messages, max_tokens... (srv_submit_error, srv_parse_gen). */
static char *responses_error_json(const srv_error *e) {
    static const char *const RENAMED[][2] = {{"messages", "input"},
                                             {"max_tokens", "max_output_tokens"},
                                             {"max_completion_tokens", "max_output_tokens"},
                                             {"response_format", "text.format"},
                                             {"reasoning_effort", "reasoning.effort"}};
    srv_error renamed = *e;
    for (size_t i = 0; i < sizeof RENAMED / sizeof RENAMED[0]; i++)
        if (!strcmp(e->param, RENAMED[i][0])) snprintf(renamed.param, sizeof renamed.param, "%s", RENAMED[i][1]);
    return srv_error_json(&renamed);
}

/* ---- streams ---- */

struct srv_xlate {
    json_t *body;
    const srv_reply *rp;
    answer_opts opts;
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

static const char *block_prefix(const srv_xlate *x, const srv_block *b) {
    if (b->kind != SRV_BLOCK_CALL) return b->kind == SRV_BLOCK_REASONING ? "rs" : "msg";
    return is_custom(&x->opts, b->name) ? "ctc" : "fc";
}

static bool block_is_custom(const srv_xlate *x, const srv_block *b) {
    return b->kind == SRV_BLOCK_CALL && is_custom(&x->opts, b->name);
}

/* The block's item, with status and its text so far. */
static json_t *block_item(const srv_xlate *x, const srv_block *b, const char *status) {
    char id[96];
    item_id(id, sizeof id, x->rp, block_prefix(x, b), b->index);
    const char *s = b->text.data ? b->text.data : "";
    const bool open = !strcmp(status, "in_progress");
    switch (b->kind) {
    case SRV_BLOCK_REASONING:
        if (open) return json_pack("{s:s, s:s, s:[], s:[]}", "id", id, "type", "reasoning", "summary", "content");
        return reasoning_item(id, s, b->text.len, &x->opts);
    case SRV_BLOCK_TEXT:
        return message_item(id, status, open ? json_array() : json_pack("[o]", text_part(s, b->text.len)));
    case SRV_BLOCK_CALL: return call_item(&x->opts, id, status, b->call_id, b->name, s, b->text.len);
    }
    return NULL;
}

static json_t *item_ref(const srv_xlate *x, const srv_block *b) {
    char id[96];
    item_id(id, sizeof id, x->rp, block_prefix(x, b), b->index);
    return json_pack("{s:s, s:i}", "item_id", id, "output_index", b->index);
}

/* item_ref with one more field (v stolen); NULL when out of memory. */
static json_t *ref_with(const srv_xlate *x, const srv_block *b, const char *k, json_t *v) {
    json_t *f = item_ref(x, b);
    if (!f) return json_decref(v), NULL;
    if (json_object_set_new(f, k, v)) return json_decref(f), NULL; /* v went with the failed set */
    return f;
}

static json_t *summary_part(const srv_block *b) {
    return json_pack("{s:s, s:s%}", "type", "summary_text", "text", b->text.data ? b->text.data : "", b->text.len);
}

/* Summary events carry summary_index 0: the one summary part is the
 * thinking itself. */
static bool summary_event(srv_xlate *x, const srv_block *b, const char *type, const char *k, json_t *v) {
    json_t *f = ref_with(x, b, "summary_index", json_integer(0));
    if (f && json_object_set_new(f, k, v)) json_decref(f), f = NULL;
    else if (!f) json_decref(v);
    return event(x, type, f);
}

static bool on_open(void *ctx, const srv_block *b) {
    srv_xlate *x = ctx;
    bool ok = event(x, "response.output_item.added",
                    json_pack("{s:i, s:o}", "output_index", b->index, "item", block_item(x, b, "in_progress")));
    if (ok && b->kind == SRV_BLOCK_TEXT) {
        json_t *f = ref_with(x, b, "content_index", json_integer(0));
        ok = f && !json_object_set_new(f, "part", text_part("", 0));
        ok = ok ? event(x, "response.content_part.added", f) : (json_decref(f), false); /* event takes f */
    }
    if (ok && b->kind == SRV_BLOCK_REASONING && x->opts.summary)
        ok = summary_event(x, b, "response.reasoning_summary_part.added", "part", summary_part(b));
    return ok;
}

static bool on_delta(void *ctx, const srv_block *b, const char *s, size_t n) {
    srv_xlate *x = ctx;
    if (block_is_custom(x, b)) return true; /* its input is whole only once the arguments are (on_close) */
    json_t *f = ref_with(x, b, "delta", json_stringn(s, n));
    if (!f) return false;
    /* event takes f; a field that could not be set leaves it to us */
    switch (b->kind) {
    case SRV_BLOCK_REASONING:
        if (json_object_set_new(f, "content_index", json_integer(0))) break;
        return event(x, "response.reasoning_text.delta", f) &&
               (!x->opts.summary ||
                summary_event(x, b, "response.reasoning_summary_text.delta", "delta", json_stringn(s, n)));
    case SRV_BLOCK_TEXT:
        if (json_object_set_new(f, "content_index", json_integer(0)) || json_object_set_new(f, "logprobs", json_array()))
            break;
        return event(x, "response.output_text.delta", f);
    case SRV_BLOCK_CALL: return event(x, "response.function_call_arguments.delta", f);
    }
    json_decref(f);
    return false;
}

/* A call's closing events: its arguments, or its custom input in one delta. */
static bool close_call(srv_xlate *x, const srv_block *b, json_t *text) {
    if (block_is_custom(x, b)) {
        json_t *input = custom_input(json_string_value(text), json_string_length(text));
        if (!input) return false;
        if (json_string_length(input) &&
            !event(x, "response.custom_tool_call_input.delta", ref_with(x, b, "delta", json_incref(input))))
            return json_decref(input), false;
        return event(x, "response.custom_tool_call_input.done", ref_with(x, b, "input", input));
    }
    json_t *what = callable(&x->opts, b->name), *f = ref_with(x, b, "arguments", json_incref(text));
    const char *name = what ? json_string_value(json_object_get(what, "name")) : b->name;
    if (f && json_object_set_new(f, "name", json_string(name))) json_decref(f), f = NULL;
    return event(x, "response.function_call_arguments.done", f);
}

/* Reasoning's closing events: its text, and its summary when asked for. */
static bool close_reasoning(srv_xlate *x, const srv_block *b, json_t *text) {
    json_t *f = ref_with(x, b, "content_index", json_integer(0));
    if (f && json_object_set(f, "text", text)) json_decref(f), f = NULL;
    return event(x, "response.reasoning_text.done", f) &&
           (!x->opts.summary ||
            (summary_event(x, b, "response.reasoning_summary_text.done", "text", json_incref(text)) &&
             summary_event(x, b, "response.reasoning_summary_part.done", "part", summary_part(b))));
}

static bool close_text(srv_xlate *x, const srv_block *b, json_t *text) {
    json_t *f = ref_with(x, b, "content_index", json_integer(0));
    if (f && (json_object_set(f, "text", text) || json_object_set_new(f, "logprobs", json_array())))
        json_decref(f), f = NULL;
    if (!event(x, "response.output_text.done", f)) return false;
    json_t *p = ref_with(x, b, "content_index", json_integer(0));
    if (p && json_object_set_new(p, "part", text_part(b->text.data ? b->text.data : "", b->text.len)))
        json_decref(p), p = NULL;
    return event(x, "response.content_part.done", p);
}

static bool on_close(void *ctx, const srv_block *b) {
    srv_xlate *x = ctx;
    json_t *text = json_stringn(b->text.data ? b->text.data : "", b->text.len);
    bool ok = text && (b->kind == SRV_BLOCK_CALL        ? close_call(x, b, text)
                       : b->kind == SRV_BLOCK_REASONING ? close_reasoning(x, b, text)
                                                        : close_text(x, b, text));
    json_decref(text);
    /* the block the finish closes is the one a length limit cut */
    json_t *item = ok ? block_item(x, b, strcmp(x->blocks.finish, "length") ? "completed" : "incomplete") : NULL;
    if (item && json_array_append(x->output, item)) json_decref(item), item = NULL; /* our reference, not taken */
    return item && event(x, "response.output_item.done", json_pack("{s:i, s:o}", "output_index", b->index, "item", item));
}

static const srv_block_ops OPS = {on_open, on_delta, on_close};

static srv_xlate *responses_stream_new(json_t *body, const srv_reply *rp, const srv_gen_req *r, int n_prompt) {
    (void)r, (void)n_prompt;
    srv_xlate *x = calloc(1, sizeof *x);
    if (!x || !(x->output = json_array()) || !answer_opts_of(body, &x->opts)) {
        if (x) json_decref(x->output);
        return free(x), NULL;
    }
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
    json_decref(x->output), json_decref(x->body), json_decref(x->opts.callables);
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
    /* a comment: the Responses API has no keep-alive event, and an event would take a sequence_number */
    .stream_keepalive = ": keep-alive\n\n",
};
