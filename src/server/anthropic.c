/*
 * anthropic.c - Anthropic's Messages API (POST /v1/messages and
 * /v1/messages/count_tokens), which coding agents and the Anthropic SDKs
 * speak, as a dialect of chat completions (see dialect.h).
 *
 * A request's `system`, its messages' content blocks (text, image,
 * tool_use, tool_result with text and image content, thinking), `tools`
 * (name, description, input_schema),
 * `tool_choice` (auto / any / tool / none, disable_parallel_tool_use),
 * `stop_sequences`, `thinking` (enabled / disabled: the template's
 * enable_thinking) and the sampling fields map onto the chat request;
 * images go on as chat image_url parts (the model must have a vision
 * tower); documents and Anthropic's server tools are refused naming what
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

/* A tool_result block as a chat tool message; NULL with e filled (a 400
 * for a malformed block: the client's fault is never a 500). */
static json_t *tool_result_msg(json_t *blk, const char *where, srv_error *e) {
    json_t *id = json_object_get(blk, "tool_use_id"), *content = json_object_get(blk, "content");
    if (!json_is_string(id))
        return srv_fail(e, 400, INVALID, "messages", NULL, "'%s' (tool_result) needs a string 'tool_use_id'", where), NULL;
    char inner[96];
    snprintf(inner, sizeof inner, "%s.content", where);
    json_t *text = content && !json_is_null(content) ? srv_parts_chat(content, TEXT_BLOCKS, inner, e) : json_string("");
    if (!text) return content && !json_is_null(content) ? NULL : (oom(e), NULL);
    /* chat templates have no error flag: the result says it in words */
    if (json_is_true(json_object_get(blk, "is_error")) && json_is_string(text)) {
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

/* Text gathered from consecutive text blocks, pushed as one message of
 * `role` (the blocks joined by SRV_TEXT_PART_SEP). With an image among
 * them, the run is pushed as chat parts instead (text and image_url, the
 * chat parser joins the text the same way). */
typedef struct text_run {
    srv_buf buf;
    bool any;
    json_t *parts; /* the run's blocks as chat parts, once an image is in it */
    json_t *texts; /* its text blocks so far (borrowed), to make parts from */
} text_run;

static bool run_add(text_run *t, json_t *text, srv_error *e) {
    if (t->parts) return !json_array_append_new(t->parts, json_pack("{s:s, s:O}", "type", "text", "text", text)) || oom(e);
    if (t->any && !srv_buf_append(&t->buf, SRV_TEXT_PART_SEP, strlen(SRV_TEXT_PART_SEP))) return oom(e);
    t->any = true;
    if ((!t->texts && !(t->texts = json_array())) || json_array_append(t->texts, text)) return oom(e);
    return srv_buf_append(&t->buf, json_string_value(text), json_string_length(text)) || oom(e);
}

/* An image block joins the run: from here on it is a parts array. */
static bool run_add_image(text_run *t, json_t *part, srv_error *e) {
    if (!t->parts) {
        if (!(t->parts = json_array())) return json_decref(part), oom(e);
        size_t k;
        json_t *x;
        json_array_foreach(t->texts, k, x)
            if (json_array_append_new(t->parts, json_pack("{s:s, s:O}", "type", "text", "text", x)))
                return json_decref(part), oom(e);
        t->any = true;
    }
    return !json_array_append_new(t->parts, part) || oom(e);
}

static void run_free(text_run *t) {
    srv_buf_free(&t->buf);
    json_decref(t->parts), json_decref(t->texts);
    t->parts = t->texts = NULL;
}

static bool run_flush(text_run *t, json_t *msgs, const char *role, srv_error *e) {
    json_array_clear(t->texts);
    if (!t->any) return true;
    t->any = false;
    json_t *m = t->parts ? json_pack("{s:s, s:o}", "role", role, "content", t->parts)
                         : json_pack("{s:s, s:s%}", "role", role, "content", t->buf.data ? t->buf.data : "", t->buf.len);
    t->parts = NULL, t->buf.len = 0;
    return push(msgs, m, e);
}

/* A user message's blocks, in their order: each run of text blocks one
 * user message, each tool_result a tool message. */
static bool add_user_blocks(json_t *msgs, json_t *blocks, size_t i, srv_error *e) {
    text_run run = {0};
    bool ok = true;
    size_t k;
    json_t *b;
    json_array_foreach(blocks, k, b) {
        char where[64];
        snprintf(where, sizeof where, "messages[%zu].content[%zu]", i, k);
        const char *type = json_string_value(json_object_get(b, "type"));
        json_t *t = json_object_get(b, "text");
        bool bad = false;
        char base[48];
        snprintf(base, sizeof base, "messages[%zu].content", i);
        json_t *img = srv_image_part(b, base, k, &bad, e);
        if (bad) {
            ok = false;
        } else if (img) {
            ok = run_add_image(&run, img, e);
        } else if (type && !strcmp(type, "text") && json_is_string(t)) {
            ok = run_add(&run, t, e);
        } else if (type && !strcmp(type, "tool_result")) {
            json_t *m = (ok = run_flush(&run, msgs, "user", e)) ? tool_result_msg(b, where, e) : NULL;
            ok = m && push(msgs, m, e);
        } else {
            ok = srv_fail(e, 400, INVALID, "messages", "unsupported_content",
                          "'%s' is a block of type '%.40s'; kettle takes text, image, tool_use, tool_result and "
                          "thinking blocks",
                          where, type ? type : "(none)");
        }
        if (!ok) break;
    }
    if (ok) ok = run_flush(&run, msgs, "user", e);
    run_free(&run);
    return ok;
}

/* A tool_use block as a chat tool call (the input as arguments text). */
static bool add_call(json_t *calls, json_t *id, json_t *name, json_t *input, srv_error *e) {
    char *args = kt_json_dumps(input, JSON_COMPACT);
    json_t *c = args ? json_pack("{s:O, s:s, s:{s:O, s:s}}", "id", id, "type", "function", "function", "name", name,
                                 "arguments", args)
                     : NULL;
    free(args);
    return push(calls, c, e);
}

/* An assistant message's blocks: text, thinking (reasoning_content) and
 * tool_use (tool_calls). */
static bool add_assistant_blocks(json_t *msgs, json_t *blocks, size_t i, srv_error *e) {
    text_run text = {0}, thinking = {0};
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
            ok = run_add(&text, t, e);
        } else if (type && !strcmp(type, "thinking") && json_is_string(th)) {
            ok = run_add(&thinking, th, e);
        } else if (type && !strcmp(type, "redacted_thinking")) {
            continue; /* encrypted by another server: nothing kettle can read */
        } else if (type && !strcmp(type, "tool_use") && json_is_string(id) && json_is_string(name) &&
                   json_is_object(input)) {
            ok = add_call(calls, id, name, input, e);
        } else {
            ok = srv_fail(e, 400, INVALID, "messages", "unsupported_content",
                          "'messages[%zu].content[%zu]' is a block of type '%.40s' (or lacks its fields); an "
                          "assistant message takes text, thinking and tool_use {id, name, input} blocks",
                          i, k, type ? type : "(none)");
        }
    }
    json_t *m = ok ? json_pack("{s:s, s:o}", "role", "assistant", "content",
                               text.any || !json_array_size(calls)
                                   ? json_stringn(text.buf.data ? text.buf.data : "", text.buf.len)
                                   : json_null())
                   : NULL;
    if (ok && m && thinking.any &&
        json_object_set_new(m, "reasoning_content", json_stringn(thinking.buf.data ? thinking.buf.data : "", thinking.buf.len)))
        json_decref(m), m = NULL;
    if (ok && m && json_array_size(calls) && json_object_set(m, "tool_calls", calls)) json_decref(m), m = NULL;
    if (ok) ok = push(msgs, m, e);
    json_decref(calls);
    run_free(&text), run_free(&thinking);
    return ok;
}

/* Claude Code opens its system prompt with a block "x-anthropic-billing-
 * header: cc_version=...; cc_entrypoint=...; ..." whose values change from
 * prompt to prompt. It is a note to Anthropic's billing, not to the model,
 * and at the very start of the prompt it would make every request's
 * tokens differ from the first position on: no prefix-cache hit, the
 * whole history prefilled again on every turn. It is left out. */
static const char CLIENT_HEADER[] = "x-anthropic-billing-header:";

static bool is_client_header(const char *text) { return !strncmp(text, CLIENT_HEADER, strlen(CLIENT_HEADER)); }

/* `system` (a string or text blocks) without the client's header, as a
 * string; NULL with e filled. */
static json_t *system_text(json_t *sys, srv_error *e) {
    if (json_is_string(sys)) {
        const char *s = json_string_value(sys), *nl = strchr(s, '\n');
        if (!is_client_header(s)) return json_incref(sys);
        return nl ? json_string(nl + 1) : json_string("");
    }
    if (!json_is_array(sys)) return srv_parts_text(sys, TEXT_BLOCKS, "system", e);
    json_t *kept = json_array();
    if (!kept) return oom(e), NULL;
    size_t i;
    json_t *b;
    json_array_foreach(sys, i, b) {
        const char *t = json_string_value(json_object_get(b, "text"));
        if (t && is_client_header(t)) continue;
        if (json_array_append(kept, b)) return json_decref(kept), oom(e), NULL;
    }
    json_t *text = srv_parts_text(kept, TEXT_BLOCKS, "system", e);
    json_decref(kept);
    return text;
}

static bool empty_content(json_t *content) {
    return (json_is_string(content) && !json_string_length(content)) || (json_is_array(content) && !json_array_size(content));
}

static bool add_message(json_t *msgs, json_t *m, size_t i, bool last, srv_error *e) {
    const char *role = json_string_value(json_object_get(m, "role"));
    json_t *content = json_object_get(m, "content");
    bool user = role && !strcmp(role, "user"), assistant = role && !strcmp(role, "assistant");
    bool system = role && !strcmp(role, "system");
    if (!user && !assistant && !system)
        return srv_fail(e, 400, INVALID, "messages", NULL,
                        "'messages[%zu].role' must be \"user\", \"assistant\" or \"system\"", i);
    if (!json_is_string(content) && !json_is_array(content))
        return srv_fail(e, 400, INVALID, "messages", NULL,
                        "'messages[%zu].content' must be a string or an array of content blocks", i);
    if (empty_content(content)) {
        /* Anthropic's rule: an empty final assistant turn is no prefill at all */
        if (assistant && last) return true;
        return srv_fail(e, 400, INVALID, "messages", NULL,
                        "messages.%zu: all messages must have non-empty content except for the optional final "
                        "assistant message", i);
    }
    if (system) { /* in place where the template allows it (tool_prepare merges it otherwise) */
        char where[40];
        snprintf(where, sizeof where, "messages[%zu].content", i);
        json_t *text = srv_parts_text(content, TEXT_BLOCKS, where, e);
        return text && push(msgs, json_pack("{s:s, s:o}", "role", "system", "content", text), e);
    }
    if (json_is_string(content)) return push(msgs, json_pack("{s:s, s:O}", "role", role, "content", content), e);
    return user ? add_user_blocks(msgs, content, i, e) : add_assistant_blocks(msgs, content, i, e);
}

static json_t *messages_of(json_t *body, srv_error *e) {
    json_t *in = json_object_get(body, "messages"), *sys = json_object_get(body, "system");
    if (!json_is_array(in) || !json_array_size(in))
        return srv_fail(e, 400, INVALID, "messages", NULL, "'messages' must be a non-empty array"), NULL;
    json_t *msgs = json_array();
    bool ok = msgs || oom(e);
    if (ok && sys && !json_is_null(sys)) {
        json_t *text = system_text(sys, e);
        ok = text && (json_string_length(text) == 0 ? (json_decref(text), true)
                                                     : push(msgs, json_pack("{s:s, s:o}", "role", "system", "content",
                                                                            text), e));
    }
    size_t i;
    json_t *m;
    json_array_foreach(in, i, m) {
        if (!ok) break;
        ok = json_is_object(m) ? add_message(msgs, m, i, i + 1 == json_array_size(in), e)
                               : srv_fail(e, 400, INVALID, "messages", NULL, "'messages[%zu]' must be an object", i);
    }
    if (!ok) json_decref(msgs), msgs = NULL;
    return msgs;
}

/* Tools Anthropic defines itself, by their versioned type's stem: its
 * servers run the first group (nothing kettle can run), the client runs
 * the second with a schema Anthropic's models know by heart (kettle's
 * model does not). Either way kettle leaves them out of the prompt under
 * tool_choice auto, saying so in x-kettle-warning, and refuses a request
 * that forces one. */
static const char *const HOSTED_TOOLS[] = {"web_search_", "web_fetch_", "code_execution_", "tool_search_tool_",
                                           "mcp_toolset", "bash_", "text_editor_", "computer_", "memory_", NULL};

static bool is_hosted_tool(const char *type) {
    for (int i = 0; HOSTED_TOOLS[i]; i++)
        if (!strncmp(type, HOSTED_TOOLS[i], strlen(HOSTED_TOOLS[i]))) return true;
    return false;
}

/* Anthropic's tools ({name, description, input_schema}) as chat tools;
 * Anthropic's own tools left out (noted), anything else refused. */
static json_t *tools_of(json_t *tools, srv_notes *notes, srv_error *e) {
    if (!json_is_array(tools)) return srv_fail(e, 400, INVALID, "tools", NULL, "'tools' must be an array"), NULL;
    json_t *out = json_array();
    if (!out) return oom(e), NULL;
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const char *type = json_string_value(json_object_get(t, "type"));
        const char *name = json_string_value(json_object_get(t, "name"));
        if (type && strcmp(type, "custom")) {
            if (!is_hosted_tool(type)) {
                srv_fail(e, 400, INVALID, "tools", "unsupported_tool",
                         "'tools[%zu]' has type '%.40s', which kettle does not know; it runs the client's own tools "
                         "({name, description, input_schema})",
                         i, type);
                return json_decref(out), NULL;
            }
            srv_note(notes, "tools[%zu] (%.40s '%.64s') left out: Anthropic's own tool, which this server cannot run",
                     i, type, name ? name : "");
            continue;
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

/* Whether tools (the request's own) has a tool named `name` that was left out. */
static bool left_out(json_t *tools, const char *name) {
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const char *type = json_string_value(json_object_get(t, "type"));
        const char *n = json_string_value(json_object_get(t, "name"));
        if (type && strcmp(type, "custom") && n && !strcmp(n, name)) return true;
    }
    return false;
}

/* tool_choice {type: auto | any | tool | none, name, disable_parallel_tool_use}. */
static bool tool_choice_of(json_t *tc, json_t *tools, json_t *chat, srv_error *e) {
    const char *type = json_string_value(json_object_get(tc, "type"));
    json_t *name = json_object_get(tc, "name"), *v = NULL;
    if (type && !strcmp(type, "tool") && json_is_string(name) && left_out(tools, json_string_value(name)))
        return srv_fail(e, 400, INVALID, "tool_choice", "unsupported_tool",
                        "'tool_choice' forces '%.64s', one of Anthropic's own tools, which this server cannot run",
                        json_string_value(name));
    if (type && !strcmp(type, "any") && !json_array_size(json_object_get(chat, "tools")))
        return srv_fail(e, 400, INVALID, "tool_choice", "unsupported_tool",
                        "'tool_choice' any: none of the tools is one this server can run (Anthropic's own tools are "
                        "left out)");
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

/* chat_template_kwargs[key] = v (stolen), unless the request set it there itself. */
static bool set_kwarg(json_t *chat, const char *key, json_t *v, srv_error *e) {
    json_t *kw = json_object_get(chat, "chat_template_kwargs");
    if (!kw && (json_object_set_new(chat, "chat_template_kwargs", json_object()) ||
                !(kw = json_object_get(chat, "chat_template_kwargs"))))
        return json_decref(v), oom(e);
    if (!json_is_object(kw)) return json_decref(v), true; /* the chat path says what is wrong with it */
    if (json_object_get(kw, key)) return json_decref(v), true;
    return !json_object_set_new(kw, key, v) || oom(e);
}

/* thinking {type: enabled | adaptive | disabled, budget_tokens}: the
 * template's enable_thinking. Absent means off, as in Anthropic's API
 * (a Qwen 3 template thinks unless told not to). A budget cannot be held
 * to: the thinking ends when the model ends it, within max_tokens. */
static bool thinking_of(json_t *th, json_t *chat, srv_notes *notes, srv_error *e) {
    if (!th || json_is_null(th)) return set_kwarg(chat, "enable_thinking", json_false(), e);
    const char *type = json_string_value(json_object_get(th, "type"));
    if (!json_is_object(th) || !type || (strcmp(type, "enabled") && strcmp(type, "adaptive") && strcmp(type, "disabled")))
        return srv_fail(e, 400, INVALID, "thinking", NULL,
                        "'thinking.type' must be \"enabled\", \"adaptive\" or \"disabled\"");
    const char *k;
    json_t *v;
    json_object_foreach(th, k, v) {
        if (!strcmp(k, "type") || json_is_null(v)) continue;
        if (!strcmp(k, "budget_tokens") && json_is_integer(v)) {
            srv_note(notes, "thinking.budget_tokens %lld not enforced: the thinking ends when the model ends it",
                     (long long)json_integer_value(v));
            continue;
        }
        return srv_fail(e, 400, INVALID, "thinking", "unsupported_parameter",
                        "'thinking.%.40s' is not a field kettle implements (type, budget_tokens)", k);
    }
    return set_kwarg(chat, "enable_thinking", json_boolean(strcmp(type, "disabled") != 0), e);
}

/* output_config {effort, format} (and the older top-level output_format):
 * effort is the chat path's reasoning_effort (the template's thinking
 * switch and its reasoning_effort variable), format a JSON Schema output. */
static bool format_of(json_t *f, json_t *chat, const char *where, srv_error *e) {
    const char *type = json_string_value(json_object_get(f, "type"));
    json_t *schema = json_object_get(f, "schema");
    if (!type || strcmp(type, "json_schema") || !json_is_object(schema))
        return srv_fail(e, 400, INVALID, where, NULL, "'%s' must be {\"type\": \"json_schema\", \"schema\": {...}}",
                        where);
    json_t *rf = json_pack("{s:s, s:{s:s, s:O, s:b}}", "type", "json_schema", "json_schema", "name", "output",
                           "schema", schema, "strict", 1);
    return (rf && !json_object_set_new(chat, "response_format", rf)) || oom(e);
}

static bool output_config_of(json_t *oc, json_t *chat, srv_error *e) {
    if (!json_is_object(oc)) return srv_fail(e, 400, INVALID, "output_config", NULL, "'output_config' must be an object");
    const char *k;
    json_t *v;
    json_object_foreach(oc, k, v) {
        if (json_is_null(v)) continue;
        bool ok = true;
        if (!strcmp(k, "effort")) {
            if (!json_is_string(v))
                return srv_fail(e, 400, INVALID, "output_config", NULL, "'output_config.effort' must be a string");
            ok = !json_object_set(chat, "reasoning_effort", v) || oom(e);
        } else if (!strcmp(k, "format")) {
            ok = format_of(v, chat, "output_config.format", e);
        } else {
            return srv_fail(e, 400, INVALID, "output_config", "unsupported_parameter",
                            "'output_config.%.40s' is not a field kettle implements (effort, format)", k);
        }
        if (!ok) return false;
    }
    return true;
}

static const char *const PASSED[] = {"model", "temperature", "top_p", "top_k", "min_p", "seed", "stream", "priority",
                                     "chat_template_kwargs", NULL};
static const char *const MAPPED[] = {"messages", "system", "max_tokens", "stop_sequences", "tools", "tool_choice",
                                     "thinking", "output_config", "output_format", NULL};
/* Accepted, and nothing for a local server to do: metadata.user_id (for
 * abuse reports), service_tier (one tier here), context_management (its
 * edits clear old thinking and tool results from the provider's stored
 * context; kettle stores nothing, the client sends its history as it
 * wants it read), inference_geo (where the model runs: here). */
static const char *const ACCEPTED[] = {"metadata", "service_tier", "context_management", "inference_geo", NULL};

static bool listed(const char *k, const char *const *list) {
    for (int i = 0; list[i]; i++)
        if (!strcmp(list[i], k)) return true;
    return false;
}

static bool check_fields(json_t *body, json_t *chat, bool counting, srv_error *e) {
    const char *k;
    json_t *v;
    json_object_foreach(body, k, v) {
        if (listed(k, MAPPED)) continue;
        if (listed(k, PASSED) && !(counting && !strcmp(k, "stream"))) {
            if (!json_is_null(v) && json_object_set(chat, k, v)) return oom(e);
            continue;
        }
        if (listed(k, ACCEPTED) || listed(k, PASSED)) continue;
        if (json_is_null(v) && (!strcmp(k, "mcp_servers") || !strcmp(k, "container"))) continue; /* not set */
        if (!strcmp(k, "mcp_servers") && json_is_array(v) && !json_array_size(v)) continue; /* none asked for */
        if (!strcmp(k, "mcp_servers") || !strcmp(k, "container"))
            return srv_fail(e, 400, INVALID, k, "unsupported_parameter",
                            "'%s' asks for Anthropic's hosted %s, which a local server cannot give; remove it", k,
                            !strcmp(k, "mcp_servers") ? "MCP connector" : "code execution container");
        return srv_fail(e, 400, INVALID, k, "unsupported_parameter",
                        "'%.60s' is not a parameter kettle implements for /v1/messages; remove it", k);
    }
    return true;
}

static json_t *to_chat(json_t *body, bool counting, srv_notes *notes, srv_error *e) {
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
    json_t *tc = json_object_get(body, "tool_choice"), *oc = json_object_get(body, "output_config");
    json_t *of = json_object_get(body, "output_format");
    if (ok && stop && !json_is_null(stop))
        ok = json_is_array(stop) ? !json_object_set(chat, "stop", stop) || oom(e)
                                 : srv_fail(e, 400, INVALID, "stop_sequences", NULL, "'stop_sequences' must be an array of strings");
    if (ok && t && !json_is_null(t))
        ok = (tools = tools_of(t, notes, e)) &&
             (json_array_size(tools) ? !json_object_set_new(chat, "tools", tools) || oom(e) : (json_decref(tools), true));
    if (ok && tc && !json_is_null(tc)) ok = tool_choice_of(tc, t, chat, e);
    if (ok) ok = thinking_of(json_object_get(body, "thinking"), chat, notes, e);
    if (ok && oc && !json_is_null(oc)) ok = output_config_of(oc, chat, e);
    if (ok && of && !json_is_null(of)) ok = format_of(of, chat, "output_format", e);
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

/* message_start goes out with the reply's first news (a token, the end,
 * an error; a keep-alive before it is an SSE comment, see
 * messages_stream_begun), not when the request is queued: by then the
 * engine has taken the prompt's cached prefix, and the usage it carries
 * says how much of the prompt the cache served, as Anthropic's does. */
static bool start(srv_xlate *x) {
    if (x->started) return true;
    x->started = true;
    int cached = x->rp->req ? kt_request_get_usage(x->rp->req).cached_tokens : x->n_prompt;
    json_t *msg = message_object(x->rp, json_array(), NULL, NULL, usage_of(x->n_prompt, cached, 0));
    return event(x, "message_start", json_pack("{s:o}", "message", msg)) && event(x, "ping", json_object());
}

/* A chunk with something to say: text, thinking, a call, a finish (the
 * role chunk a stream opens with has none). */
static bool has_news(json_t *chunk) {
    json_t *choice = json_array_get(json_object_get(chunk, "choices"), 0), *d = json_object_get(choice, "delta");
    return !choice || json_is_string(json_object_get(choice, "finish_reason")) ||
           json_string_length(json_object_get(d, "content")) || json_string_length(json_object_get(d, "reasoning_content")) ||
           json_array_size(json_object_get(d, "tool_calls"));
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
    bool ok = !has_news(chunk) || (start(x) && srv_blocks_feed(&x->blocks, chunk, &OPS, x));
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

/* message_start is out (it waits for the reply's first news). */
static bool messages_stream_begun(const srv_xlate *x) {
    return x->started;
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
    /* Anthropic's own keep-alive, which its SDKs skip; only after message_start, which Anthropic's streams
     * open with (before it, the SSE comment: message_start waits for the cached count, see start) */
    .stream_keepalive = "event: ping\ndata: {\"type\":\"ping\"}\n\n",
    .stream_begun = messages_stream_begun,
};
