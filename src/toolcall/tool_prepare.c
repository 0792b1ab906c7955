/*
 * tool_prepare.c - an OpenAI conversation made ready for a chat template
 * (see kt_tool_prepare in toolcall.h).
 *
 * OpenAI clients send what templates were not all written for: `content:
 * null` beside `tool_calls` (templates concatenate or search it),
 * arguments as a JSON string (most templates index them as an object, a
 * few concatenate the string), any id (Mistral's templates demand nine
 * alphanumerics). And many templates have no place for tools at all
 * (Gemma 2, Phi-3.5, kettle's plain built-ins): for those the tools go
 * into the system message, with the generic format's instructions, and
 * the tool loop is written as text in that same format, so the model sees
 * its earlier calls the way it is asked to write new ones. Nothing of the
 * conversation is dropped.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/json_safe.h"
#include "text/chat.h"
#include "toolcall/format_int.h"

bool kt_tool_template_has_tools(const char *t) {
    return t && strstr(t, "tools") != NULL;
}

static bool is_role(const json_t *msg, const char *role) {
    const char *r = msg ? json_string_value(json_object_get(msg, "role")) : NULL;
    return r && !strcmp(r, role);
}

static bool id9(const char *s) {
    if (!s || strlen(s) != 9) return false;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s)) return false;
    return true;
}

/* An id in the family's form: kept when it already is, else derived from
 * it (the same id always maps to the same one, so a call and its result
 * still match). */
static json_t *family_id(const kt_tool_format *f, json_t *id) {
    if (f->ids != IDS_MISTRAL9 || !json_is_string(id) || id9(json_string_value(id))) return json_incref(id);
    char out[16];
    kt_tool_call_id(f, json_string_value(id), 0, out, sizeof out);
    return json_string(out);
}

/* Arguments as the template wants them: an object parsed from the JSON
 * string, or the string (made from an object if need be). */
static bool fix_arguments(json_t *fn, bool as_string) {
    json_t *a = json_object_get(fn, "arguments");
    if (as_string && !json_is_string(a)) {
        char *s = a ? kt_json_dumps(a, JSON_COMPACT | JSON_ENCODE_ANY) : strdup("{}");
        bool ok = s && !json_object_set_new(fn, "arguments", json_string(s));
        free(s);
        return ok;
    }
    if (!as_string && json_is_string(a)) {
        json_error_t je;
        json_t *parsed = kt_json_loads(json_string_value(a), 0, &je);
        if (!parsed && json_error_code(&je) == json_error_out_of_memory) return false; /* not "not JSON" */
        if (json_is_object(parsed)) return !json_object_set_new(fn, "arguments", parsed);
        json_decref(parsed);
    }
    return true;
}

/* gpt-oss's template reads an assistant turn's analysis channel from
 * `thinking`, and renders it before a call (the one place its chain of
 * thought stays in the prompt, as the model was trained); clients send it
 * back as reasoning_content (kettle's own replies, the Responses API's
 * reasoning items, Anthropic's thinking blocks). Not beside text content
 * in a call's turn: the template refuses both there, and renders the
 * content as the analysis itself. False: out of memory. */
static bool harmony_thinking(const kt_tool_format *f, json_t *msg) {
    json_t *r = json_object_get(msg, "reasoning_content");
    if (f->shape != SHAPE_HARMONY || !is_role(msg, "assistant") || !json_string_length(r) ||
        json_object_get(msg, "thinking"))
        return true;
    const char *content = json_string_value(json_object_get(msg, "content"));
    if (json_object_get(msg, "tool_calls") && content && content[0]) return true;
    return !json_object_set(msg, "thinking", r);
}

static bool fix_message(const kt_tool_format *f, json_t *msg, bool as_string) {
    json_t *calls = json_object_get(msg, "tool_calls");
    if (is_role(msg, "assistant") && json_is_null(json_object_get(msg, "content")) &&
        json_object_set_new(msg, "content", json_string("")))
        return false;
    if (json_is_array(calls) && !json_array_size(calls)) json_object_del(msg, "tool_calls"), calls = NULL;
    if (!harmony_thinking(f, msg)) return false;
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c) {
        json_t *fn = json_object_get(c, "function");
        if (!json_is_object(c) || !json_is_object(fn)) return false;
        if (!fix_arguments(fn, as_string)) return false;
        if (json_object_get(c, "id") && json_object_set_new(c, "id", family_id(f, json_object_get(c, "id"))))
            return false;
    }
    json_t *tid = json_object_get(msg, "tool_call_id");
    if (tid && json_object_set_new(msg, "tool_call_id", family_id(f, tid))) return false;
    return true;
}

/* ---- templates without tools ---- */

static bool append_text(json_t *msg, const char *sep, const char *text) {
    const char *old = json_string_value(json_object_get(msg, "content"));
    size_t n = (old ? strlen(old) : 0) + strlen(sep) + strlen(text) + 1;
    char *s = malloc(n);
    if (!s) return false;
    snprintf(s, n, "%s%s%s", old && old[0] ? old : "", old && old[0] ? sep : "", text);
    bool ok = !json_object_set_new(msg, "content", json_string(s));
    free(s);
    return ok;
}

/* The system text that offers the tools in the generic format. */
static char *tools_text(const json_t *tools) {
    size_t cap = 1024, n = 0;
    char *s = malloc(cap);
    const char *head = "You can call these tools (JSON Schema of each function's arguments):\n<tools>\n";
    const char *tail = "</tools>\nTo call a tool, reply with one line per call, exactly:\n<tool_call>\n"
                       "{\"name\": \"FUNCTION\", \"arguments\": {ARGUMENTS}}\n</tool_call>\n"
                       "Tool results come back inside <tool_response></tool_response>.";
    bool ok = s != NULL;
    size_t i;
    json_t *t;
#define PUT(str)                                                                                                       \
    do {                                                                                                               \
        size_t k_ = strlen(str);                                                                                       \
        while (ok && n + k_ + 1 > cap) {                                                                               \
            char *p_ = realloc(s, cap *= 2);                                                                           \
            if (!p_) ok = false;                                                                                       \
            else s = p_;                                                                                               \
        }                                                                                                              \
        if (ok) memcpy(s + n, str, k_), n += k_;                                                                       \
    } while (0)
    PUT(head);
    json_array_foreach(tools, i, t) {
        char *j = kt_json_dumps(json_object_get(t, "function") ? json_object_get(t, "function") : t, JSON_COMPACT);
        if (!j) ok = false;
        else {
            PUT(j);
            PUT("\n");
        }
        free(j);
    }
    PUT(tail);
#undef PUT
    if (!ok) return free(s), NULL;
    s[n] = 0;
    return s;
}

/* An assistant's calls as the generic format's text after its content. */
static bool calls_as_text(json_t *msg) {
    json_t *calls = json_object_get(msg, "tool_calls");
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c) {
        json_t *fn = json_object_get(c, "function");
        json_t *args = json_object_get(fn, "arguments");
        json_error_t je;
        json_t *parsed = json_is_string(args) ? kt_json_loads(json_string_value(args), 0, &je) : json_incref(args);
        if (json_is_string(args) && !parsed && json_error_code(&je) == json_error_out_of_memory) return false;
        json_t *call = json_pack("{s:O, s:o}", "name", json_object_get(fn, "name"), "arguments",
                                 parsed ? parsed : json_object());
        char *j = call ? kt_json_dumps(call, JSON_COMPACT) : NULL;
        json_decref(call);
        size_t n = j ? strlen(j) + 32 : 0;
        char *text = j ? malloc(n) : NULL;
        if (text) snprintf(text, n, "<tool_call>\n%s\n</tool_call>", j);
        bool ok = text && append_text(msg, "\n", text);
        free(j), free(text);
        if (!ok) return false;
    }
    json_object_del(msg, "tool_calls");
    return true;
}

/* A tool result as a user turn, merged into the user turn before it. */
static bool result_as_user(json_t *out, json_t *msg) {
    const char *c = json_string_value(json_object_get(msg, "content"));
    size_t n = (c ? strlen(c) : 0) + 48;
    char *text = malloc(n);
    if (!text) return false;
    snprintf(text, n, "<tool_response>\n%s\n</tool_response>", c ? c : "");
    json_t *last = json_array_get(out, json_array_size(out) - 1);
    bool ok;
    if (last && is_role(last, "user")) ok = append_text(last, "\n", text);
    else ok = !json_array_append_new(out, json_pack("{s:s, s:s}", "role", "user", "content", text));
    free(text);
    return ok;
}

static json_t *without_tools(json_t *msgs, const json_t *tools) {
    json_t *out = json_array();
    char *offer = json_array_size(tools) ? tools_text(tools) : NULL;
    bool ok = out && (offer || !json_array_size(tools));
    size_t i;
    json_t *m;
    if (ok && offer) {
        json_t *first = json_array_get(msgs, 0);
        if (first && is_role(first, "system")) ok = append_text(first, "\n\n", offer);
        else ok = !json_array_append_new(out, json_pack("{s:s, s:s}", "role", "system", "content", offer));
    }
    json_array_foreach(msgs, i, m) {
        if (!ok) break;
        if (is_role(m, "tool")) ok = result_as_user(out, m);
        else if (is_role(m, "assistant") && json_object_get(m, "tool_calls")) ok = calls_as_text(m) && !json_array_append(out, m);
        else if (is_role(m, "user") && is_role(json_array_get(out, json_array_size(out) - 1), "user"))
            ok = append_text(json_array_get(out, json_array_size(out) - 1), "\n\n",
                             json_string_value(json_object_get(m, "content")) ? json_string_value(json_object_get(m, "content")) : "");
        else ok = !json_array_append(out, m);
    }
    free(offer);
    if (!ok) json_decref(out), out = NULL;
    return out;
}

/* The tool result of msgs[from, to) for call `id` (the first unused one
 * with that tool_call_id, else the first unused one whose id names none of
 * `calls`), or -1. */
static long result_for(json_t *msgs, size_t from, size_t to, const bool *used, const char *id, json_t *calls) {
    long any = -1;
    for (size_t k = from; k < to; k++) {
        if (used[k - from]) continue;
        const char *tid = json_string_value(json_object_get(json_array_get(msgs, k), "tool_call_id"));
        if (tid && id && !strcmp(tid, id)) return (long)k;
        bool names_one = false;
        size_t c;
        json_t *call;
        json_array_foreach(calls, c, call) {
            const char *cid = json_string_value(json_object_get(call, "id"));
            names_one |= tid && cid && !strcmp(tid, cid);
        }
        if (!names_one && any < 0) any = (long)k;
    }
    return any;
}

/* gpt-oss's template renders an assistant message's first call only (in
 * harmony each call is a message of its own) and names each tool result
 * after the latest call. A message with several calls (from a client's
 * history, another model's) becomes one message per call, each followed
 * by its result (by tool_call_id, else in order), as gpt-oss writes and
 * reads them; its text and analysis stay with the first. False: out of
 * memory. */
static bool harmony_one_call_each(json_t *msgs) {
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i), *calls = json_object_get(m, "tool_calls");
        if (!is_role(m, "assistant") || json_array_size(calls) < 2) continue;
        size_t end = i + 1;
        while (end < json_array_size(msgs) && is_role(json_array_get(msgs, end), "tool")) end++;
        bool *used = calloc(end - i, sizeof *used);
        json_t *out = json_array();
        bool ok = used && out;
        size_t c;
        json_t *call;
        json_array_foreach(calls, c, call) {
            json_t *one = ok ? json_copy(m) : NULL;
            ok = one && !json_array_append_new(out, one) &&
                 !json_object_set_new(one, "tool_calls", json_pack("[O]", call));
            if (ok && c) { /* the text and the analysis went with the first call */
                json_object_del(one, "thinking"), json_object_del(one, "reasoning_content");
                ok = !json_object_set_new(one, "content", json_string(""));
            }
            long r = ok ? result_for(msgs, i + 1, end, used, json_string_value(json_object_get(call, "id")), calls) : -1;
            if (r >= 0) used[r - (long)(i + 1)] = true, ok = !json_array_append(out, json_array_get(msgs, (size_t)r));
        }
        for (size_t k = i + 1; ok && k < end; k++) /* results no call claimed: after the last call */
            if (!used[k - i - 1]) ok = !json_array_append(out, json_array_get(msgs, k));
        for (size_t k = i; ok && k < end; k++) json_array_remove(msgs, i);
        for (size_t k = 0; ok && k < json_array_size(out); k++) ok = !json_array_insert(msgs, i + k, json_array_get(out, k));
        if (ok) i += json_array_size(out) - 1;
        free(used), json_decref(out);
        if (!ok) return false;
    }
    return true;
}

json_t *kt_tool_prepare(const kt_tool_format *f, const char *template_text, const json_t *messages,
                        const json_t *tools, bool arguments_as_strings, json_t **tools_out, kt_error *err) {
    *tools_out = NULL;
    json_t *msgs = json_deep_copy(messages);
    if (!msgs) return kt_error_set(err, KT_ERR_NOMEM, "out of memory"), NULL;
    size_t i;
    json_t *m;
    /* OpenAI's developer role is the system role of its newer models; a
     * template that has no such role (all but gpt-oss's) gets it as system */
    const bool has_developer = template_text && strstr(template_text, "developer");
    json_array_foreach(msgs, i, m) {
        if (!has_developer && is_role(m, "developer") && json_object_set_new(m, "role", json_string("system"))) {
            json_decref(msgs);
            kt_error_set(err, KT_ERR_NOMEM, "out of memory");
            return NULL;
        }
        if (!fix_message(f, m, arguments_as_strings)) {
            json_decref(msgs);
            kt_error_set(err, KT_ERR_ARG, "'messages[%zu].tool_calls' must be a list of {id, type, function: {name, arguments}}", i);
            return NULL;
        }
    }
    if (kt_tool_template_has_tools(template_text)) {
        if (f->shape == SHAPE_HARMONY && !harmony_one_call_each(msgs)) {
            json_decref(msgs);
            kt_error_set(err, KT_ERR_NOMEM, "out of memory");
            return NULL;
        }
        *tools_out = tools ? json_incref((json_t *)tools) : NULL;
        return msgs;
    }
    json_t *out = without_tools(msgs, tools);
    json_decref(msgs);
    if (!out) kt_error_set(err, KT_ERR_NOMEM, "out of memory");
    return out;
}

/* Tools with a description on every function and parameter, "" where
 * there was none (templates that print them unconditionally). */
static json_t *with_descriptions(const json_t *tools) { /* NULL: out of memory */
    json_t *t = json_deep_copy(tools);
    size_t i;
    json_t *tool;
    bool ok = t != NULL;
    json_array_foreach(t, i, tool) {
        json_t *fn = json_object_get(tool, "function");
        if (json_is_object(fn) && !json_object_get(fn, "description"))
            ok = ok && !json_object_set_new(fn, "description", json_string(""));
        const char *k;
        json_t *prop;
        json_object_foreach(json_object_get(json_object_get(fn, "parameters"), "properties"), k, prop)
            if (json_is_object(prop) && !json_object_get(prop, "description"))
                ok = ok && !json_object_set_new(prop, "description", json_string(""));
    }
    if (!ok) json_decref(t), t = NULL;
    return t;
}

/* System (and developer) messages after the first turn appended to the
 * leading one (made if there is none), for templates that allow a system message only at
 * the start (Llama 3's raise on any other; Claude Code sends one
 * mid-conversation). False: out of memory. */
static bool is_system(const json_t *m) { return is_role(m, "system") || is_role(m, "developer"); }

static bool merge_late_system(json_t *msgs) {
    json_t *first = json_array_get(msgs, 0);
    bool lead = first && is_system(first);
    for (size_t i = lead ? 1 : 0; i < json_array_size(msgs);) {
        json_t *m = json_array_get(msgs, i);
        if (!is_system(m)) {
            i++;
            continue;
        }
        const char *text = json_string_value(json_object_get(m, "content"));
        if (!lead) {
            json_t *sys = json_pack("{s:s, s:s}", "role", "system", "content", text ? text : "");
            if (!sys || json_array_insert_new(msgs, 0, sys)) return false;
            first = json_array_get(msgs, 0), lead = true;
            json_array_remove(msgs, i + 1);
            i = 1;
            continue;
        }
        if (!append_text(first, "\n\n", text ? text : "")) return false;
        json_array_remove(msgs, i);
    }
    return true;
}

/* Whether every system (or developer) message is in the rendered prompt:
 * some templates drop one without raising (DeepSeek R1's keeps only the
 * last system message, gpt-oss's only a first one). */
static bool systems_rendered(const json_t *msgs, const char *out) {
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        const json_t *m = json_array_get(msgs, i);
        const char *text = json_string_value(json_object_get(m, "content"));
        if (is_system(m) && text && text[0] && !strstr(out, text)) return false;
    }
    return true;
}

/* The system message folded into the first user turn (templates that
 * refuse the system role, such as Gemma 2's). */
static bool fold_system(json_t *msgs) { /* false: out of memory */
    json_t *sys = json_array_get(msgs, 0);
    if (!sys || !is_role(sys, "system")) return true;
    for (size_t i = 1; i < json_array_size(msgs); i++) {
        json_t *u = json_array_get(msgs, i);
        if (!is_role(u, "user")) continue;
        const char *a = json_string_value(json_object_get(sys, "content"));
        const char *b = json_string_value(json_object_get(u, "content"));
        size_t n = (a ? strlen(a) : 0) + (b ? strlen(b) : 0) + 3;
        char *joined = malloc(n);
        if (!joined) return false;
        snprintf(joined, n, "%s\n\n%s", a ? a : "", b ? b : "");
        bool ok = !json_object_set_new(u, "content", json_string(joined)); /* else the system message stays */
        free(joined);
        if (ok) json_array_remove(msgs, 0);
        return ok;
    }
    return true;
}

/* Llama 3.1's built-in tools (format_int.h) go to the template as its
 * `builtin_tools` list, by the names the template knows (python is its
 * code_interpreter), and not among the JSON tools. False: out of memory. */
static bool split_builtins(const kt_tool_format *f, const char *template_text, const json_t *tools,
                           const json_t *vars, json_t **tools_out, json_t **vars_out) {
    *tools_out = json_incref((json_t *)tools), *vars_out = json_incref((json_t *)vars);
    if (!f->builtin_var || !f->builtin_var[0] || !strstr(template_text, f->builtin_var) || !tools) return true;
    json_t *builtin = json_array(), *rest = json_array();
    size_t i;
    json_t *t;
    bool ok = builtin && rest;
    json_array_foreach(tools, i, t) {
        const char *name = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
        if (!ok) break;
        if (tc_is_builtin_call(name)) ok = !json_array_append_new(builtin, json_string(name));
        else if (tc_is_code_tool(name)) ok = !json_array_append_new(builtin, json_string("code_interpreter"));
        else ok = !json_array_append(rest, t);
    }
    if (ok && json_array_size(builtin)) {
        json_t *v = vars ? json_deep_copy(vars) : json_object();
        ok = v && !json_object_set(v, f->builtin_var, builtin);
        json_decref(*tools_out), json_decref(*vars_out);
        *tools_out = json_array_size(rest) ? json_incref(rest) : NULL, *vars_out = v;
    }
    json_decref(builtin), json_decref(rest);
    return ok;
}

char *kt_tool_render(const kt_tool_format *f, const char *template_text, const json_t *messages,
                     const json_t *tools_in, const json_t *vars_in, int64_t now, kt_error *err) {
    json_t *tools = NULL, *vars = NULL;
    if (!split_builtins(f, template_text, tools_in, vars_in, &tools, &vars)) {
        json_decref(tools), json_decref(vars);
        kt_error_set(err, KT_ERR_NOMEM, "out of memory");
        return NULL;
    }
    char *out = NULL;
    kt_error first = {0};
    json_t *described = NULL;
    /* rungs: as sent, described, late system messages merged, the system
     * message folded; on each, arguments as objects before strings (a
     * template that serializes them, as gpt-oss's `|tojson`, would write
     * a string's JSON twice-quoted, so strings come only where objects
     * failed on that rung) */
    for (int attempt = 0; attempt < 8 && !out; attempt++) {
        const int rung = attempt / 2;
        kt_error e = {0};
        json_t *t = NULL;
        if (attempt == 2 && tools && !(described = with_descriptions(tools))) {
            kt_error_set(&first, KT_ERR_NOMEM, "out of memory");
            break;
        }
        json_t *msgs = kt_tool_prepare(f, template_text, messages, rung >= 1 && described ? described : tools,
                                       attempt % 2, &t, &e);
        if (msgs && rung >= 2 && !merge_late_system(msgs)) kt_error_set(&e, KT_ERR_NOMEM, "out of memory");
        else if (msgs && rung == 3 && !fold_system(msgs)) kt_error_set(&e, KT_ERR_NOMEM, "out of memory");
        else if (msgs) out = kt_chat_render_at(template_text, msgs, t, true, vars, now, &e);
        if (out && rung < 2 && !systems_rendered(msgs, out)) { /* the next rungs merge them */
            free(out), out = NULL;
            kt_error_set(&e, KT_ERR_FORMAT, "the template dropped a system message after the first turn");
        }
        if (attempt == 0 || e.status == KT_ERR_NOMEM) first = e;
        json_decref(msgs), json_decref(t);
        if (!msgs) break; /* a malformed message: no retry helps */
        if (!out && e.status == KT_ERR_NOMEM) break; /* the next rung would render another prompt */
    }
    json_decref(described), json_decref(tools), json_decref(vars);
    if (!out && err) *err = first;
    return out;
}
