/*
 * responses_tools.c - a Responses request's tools as chat tools, and the
 * map from chat names back to them (see responses_tools.h).
 */
#include "server/responses_tools.h"

#include "server/dialect.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define INVALID "invalid_request_error"

static bool oom(srv_error *e) { return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory"); }

/* ---- names ---- */

#define NAME_CUT 55 /* what a long name keeps before '_' and its hash: 55 + 1 + 8 = 64 */

static uint32_t fnv1a(uint32_t h, const char *s) {
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

/* Appends s to out[*n..] up to `cap` characters in all. */
static void put(char *out, size_t *n, size_t cap, const char *s) {
    for (; *s && *n < cap; s++) out[(*n)++] = *s;
    out[*n] = 0;
}

void rsp_chat_name(const char *ns, const char *name, char out[RSP_NAME_MAX + 1]) {
    const bool bare = !ns || !*ns || !strcmp(ns, "functions");
    const char *pre = bare ? "" : ns, *sep = bare ? "" : "__";
    size_t n = 0;
    if (strlen(pre) + strlen(sep) + strlen(name) <= RSP_NAME_MAX) {
        put(out, &n, RSP_NAME_MAX, pre), put(out, &n, RSP_NAME_MAX, sep), put(out, &n, RSP_NAME_MAX, name);
        return;
    }
    uint32_t h = fnv1a(fnv1a(fnv1a(2166136261u, pre), sep), name);
    put(out, &n, NAME_CUT, pre), put(out, &n, NAME_CUT, sep), put(out, &n, NAME_CUT, name);
    while (n && (unsigned char)out[n - 1] >= 0x80) n--; /* no character cut in two (a call item's name is not checked) */
    snprintf(out + n, RSP_NAME_MAX + 1 - n, "_%08x", (unsigned)h);
}

/* A tool or namespace name chat templates and grammars can carry: what
 * chat allows in a function name (openai.c), 1 to 128 characters (the
 * Responses limit; the chat name is cut to 64 above). */
static bool name_ok(json_t *name) {
    const char *s = json_string_value(name);
    if (!s || !*s || strlen(s) > 128) return false;
    for (; *s; s++)
        if (!(*s == '_' || *s == '-' || *s == '.' || (*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'z') ||
              (*s >= 'A' && *s <= 'Z')))
            return false;
    return true;
}

/* ---- hosted tools ---- */

/* Tools OpenAI runs on its side (or whose calls are items of their own),
 * and why kettle cannot. */
static const struct hosted {
    const char *type, *why;
} HOSTED[] = {
    {"web_search", "kettle has no web access"},
    {"web_search_2025_08_26", "kettle has no web access"},
    {"web_search_preview", "kettle has no web access"},
    {"web_search_preview_2025_03_11", "kettle has no web access"},
    {"file_search", "kettle has no vector stores"},
    {"code_interpreter", "kettle runs no code sandbox"},
    {"image_generation", "kettle serves text models"},
    {"computer", "computer use needs screenshots and kettle serves text models"},
    {"computer_use", "computer use needs screenshots and kettle serves text models"},
    {"computer_use_preview", "computer use needs screenshots and kettle serves text models"},
    {"mcp", "kettle connects to no remote MCP server"},
    {"tool_search", "kettle shows every tool from the start"},
    {"local_shell", "its calls are local_shell_call items, which kettle does not make"},
    {"shell", "its calls are shell_call items, which kettle does not make"},
    {"apply_patch", "its calls are apply_patch_call items, which kettle does not make"},
    {"programmatic_tool_calling", "kettle runs no programs"},
};

static const char *hosted_why(const char *type) {
    for (size_t i = 0; type && i < sizeof HOSTED / sizeof HOSTED[0]; i++)
        if (!strcmp(HOSTED[i].type, type)) return HOSTED[i].why;
    return NULL;
}

/* ---- the walk over the request's tools ---- */

typedef struct toolset {
    json_t *chat;      /* chat tools, in order */
    json_t *callables; /* chat name -> {type, name, namespace?} */
    json_t *hosted;    /* the hosted tool types left out, each once */
    const char *param; /* the field the tools being walked came in: "tools" or "input" */
    srv_notes *notes;
    srv_error *e;
} toolset;

static bool function_tool(json_t *t, const char *chat_name, json_t **out) {
    json_t *fn = json_pack("{s:s}", "name", chat_name);
    const char *keys[] = {"description", "parameters", "strict"};
    for (size_t k = 0; fn && k < sizeof keys / sizeof keys[0]; k++)
        if (!srv_copy_field(fn, t, keys[k])) json_decref(fn), fn = NULL;
    *out = fn ? json_pack("{s:s, s:o}", "type", "function", "function", fn) : NULL;
    return *out != NULL;
}

/* s + more... as a JSON string (NULL: out of memory). */
static json_t *joined(const char *const *parts, size_t n) {
    srv_buf b = {0};
    bool ok = true;
    for (size_t i = 0; ok && i < n; i++) ok = srv_buf_append(&b, parts[i], strlen(parts[i]));
    json_t *s = ok ? json_stringn(b.data ? b.data : "", b.len) : NULL;
    srv_buf_free(&b);
    return s;
}

/* A custom tool as a function of one string, `input`: a regex format is
 * that string's pattern (the grammar engine enforces it); a Lark grammar
 * has no translation here, so the model is shown it in the description
 * and the note says it is not enforced. */
static bool custom_tool(toolset *ts, json_t *t, const char *chat_name, const char *where, json_t **out) {
    json_t *format = json_object_get(t, "format"), *def = json_object_get(format, "definition");
    const char *ftype = json_string_value(json_object_get(format, "type"));
    const char *syntax = json_string_value(json_object_get(format, "syntax"));
    const char *desc = json_string_value(json_object_get(t, "description"));
    const bool plain = !format || json_is_null(format) || (ftype && !strcmp(ftype, "text"));
    const bool grammar = ftype && !strcmp(ftype, "grammar") && json_is_string(def) && syntax;
    const bool regex = grammar && !strcmp(syntax, "regex"), lark = grammar && !strcmp(syntax, "lark");
    *out = NULL;
    if (!plain && !regex && !lark)
        return srv_fail(ts->e, 400, INVALID, ts->param, NULL,
                        "'%s.format' must be {\"type\": \"text\"} or {\"type\": \"grammar\", \"syntax\": \"lark\" or "
                        "\"regex\", \"definition\": ...}",
                        where);
    json_t *input = json_pack("{s:s}", "type", "string");
    if (input && regex) {
        const char *pattern[] = {"^(?:", json_string_value(def), ")$"};
        if (json_object_set_new(input, "pattern", joined(pattern, 3))) json_decref(input), input = NULL;
    }
    json_t *params = json_pack("{s:s, s:{s:o}, s:[s], s:b}", "type", "object", "properties", "input", input, "required",
                               "input", "additionalProperties", 0);
    json_t *fn = json_pack("{s:s, s:o}", "name", chat_name, "parameters", params), *description = NULL;
    if (fn && lark) {
        const char *text[] = {desc ? desc : "", desc ? "\n\n" : "", "The input must follow this Lark grammar:\n",
                              json_string_value(def)};
        description = joined(text, 4);
    } else if (fn && desc) {
        description = json_string(desc);
    }
    if ((lark || desc) && (!description || json_object_set_new(fn, "description", description)))
        json_decref(fn), fn = NULL; /* set_new took description, or there was none */
    if (!fn || !(*out = json_pack("{s:s, s:o}", "type", "function", "function", fn))) return oom(ts->e);
    if (lark)
        srv_note(ts->notes, "custom tool '%.64s': its Lark grammar is described to the model, not enforced",
                 json_string_value(json_object_get(t, "name")));
    return true;
}

/* A function or custom tool (type), at the top level or in namespace ns. */
static bool add_callable(toolset *ts, json_t *t, const char *type, const char *ns, const char *where) {
    json_t *name = json_object_get(t, "name");
    if (!name_ok(name))
        return srv_fail(ts->e, 400, INVALID, ts->param, NULL,
                        "'%s.name' must be 1 to 128 letters, digits, '_', '-' or '.'", where);
    char chat_name[RSP_NAME_MAX + 1];
    rsp_chat_name(ns, json_string_value(name), chat_name);
    if (json_object_get(ts->callables, chat_name))
        return srv_fail(ts->e, 400, INVALID, ts->param, NULL,
                        "'%s' is a second tool the model would know as '%s'; tool names must differ (a top-level "
                        "tool and one in the namespace \"functions\" share the top level)",
                        where, chat_name);
    json_t *tool = NULL;
    const bool custom = !strcmp(type, "custom");
    if (custom && !custom_tool(ts, t, chat_name, where, &tool)) return false;
    if (!custom && !function_tool(t, chat_name, &tool)) return oom(ts->e);
    json_t *what = json_pack("{s:s, s:O}", "type", type, "name", name);
    if (what && ns && json_object_set_new(what, "namespace", json_string(ns))) json_decref(what), what = NULL;
    if (!what || json_object_set_new(ts->callables, chat_name, what)) return json_decref(tool), oom(ts->e);
    return !json_array_append_new(ts->chat, tool) || oom(ts->e); /* which takes tool, even when it fails */
}

/* A namespace's function and custom tools, under its name. */
static bool add_namespace(toolset *ts, json_t *t, const char *where) {
    json_t *name = json_object_get(t, "name"), *tools = json_object_get(t, "tools");
    if (!name_ok(name))
        return srv_fail(ts->e, 400, INVALID, ts->param, NULL,
                        "'%s.name' must be 1 to 128 letters, digits, '_', '-' or '.'", where);
    if (!json_is_array(tools))
        return srv_fail(ts->e, 400, INVALID, ts->param, NULL, "'%s.tools' must be an array of function and custom tools",
                        where);
    size_t i;
    json_t *child;
    json_array_foreach(tools, i, child) {
        char at[96];
        snprintf(at, sizeof at, "%s.tools[%zu]", where, i);
        const char *type = json_string_value(json_object_get(child, "type"));
        if (!type || (strcmp(type, "function") && strcmp(type, "custom")))
            return srv_fail(ts->e, 400, INVALID, ts->param, "unsupported_tool",
                            "'%s' has type '%.40s'; a namespace holds function and custom tools", at,
                            type ? type : "(none)");
        if (!add_callable(ts, child, type, json_string_value(name), at)) return false;
    }
    return true;
}

static bool add_hosted(toolset *ts, const char *type) {
    size_t i;
    json_t *t;
    json_array_foreach(ts->hosted, i, t) if (!strcmp(json_string_value(t), type)) return true;
    return !json_array_append_new(ts->hosted, json_string(type)) || oom(ts->e);
}

static bool add_tool(toolset *ts, json_t *t, const char *where) {
    const char *type = json_string_value(json_object_get(t, "type"));
    if (type && (!strcmp(type, "function") || !strcmp(type, "custom"))) return add_callable(ts, t, type, NULL, where);
    if (type && !strcmp(type, "namespace")) return add_namespace(ts, t, where);
    if (hosted_why(type)) return add_hosted(ts, type);
    return srv_fail(ts->e, 400, INVALID, ts->param, "unsupported_tool",
                    "'%s' has type '%.40s'; kettle takes function, custom and namespace tools (and leaves hosted "
                    "tools such as web_search out)",
                    where, type ? type : "(none)");
}

/* `tools`, then the tools of each additional_tools input item (the
 * Responses "lite" shape: tools that join the conversation midway; the
 * model sees them all from the start here). */
static bool walk(toolset *ts, json_t *body) {
    json_t *tools = json_object_get(body, "tools"), *input = json_object_get(body, "input"), *t, *item;
    size_t i, k;
    char where[64];
    ts->param = "tools";
    if (tools && !json_is_null(tools) && !json_is_array(tools))
        return srv_fail(ts->e, 400, INVALID, "tools", NULL, "'tools' must be an array");
    json_array_foreach(tools, i, t) {
        snprintf(where, sizeof where, "tools[%zu]", i);
        if (!add_tool(ts, t, where)) return false;
    }
    ts->param = "input";
    json_array_foreach(input, k, item) {
        const char *type = json_string_value(json_object_get(item, "type"));
        if (!type || strcmp(type, "additional_tools")) continue;
        if (!json_is_array(json_object_get(item, "tools")))
            return srv_fail(ts->e, 400, INVALID, "input", NULL, "'input[%zu].tools' must be an array", k);
        json_array_foreach(json_object_get(item, "tools"), i, t) {
            snprintf(where, sizeof where, "input[%zu].tools[%zu]", k, i);
            if (!add_tool(ts, t, where)) return false;
        }
    }
    return true;
}

/* ---- tool_choice ---- */

/* The chat name of the tool {name, namespace?} names: its qualified name,
 * or a name alone that is one tool's at the top level or in exactly one
 * namespace (Responses' tool_choice has no namespace field yet). */
static bool resolve(toolset *ts, json_t *ref, char out[RSP_NAME_MAX + 1]) {
    json_t *name = json_object_get(ref, "name"), *ns = json_object_get(ref, "namespace");
    if (!json_is_string(name))
        return srv_fail(ts->e, 400, INVALID, "tool_choice", NULL, "'tool_choice' names a tool without a string 'name'");
    const char *n = json_string_value(name);
    rsp_chat_name(json_string_value(ns), n, out);
    if (json_object_get(ts->callables, out)) return true;
    if (json_is_string(ns))
        return srv_fail(ts->e, 400, INVALID, "tool_choice", NULL,
                        "'tool_choice' names '%.64s' in namespace '%.64s', which 'tools' does not have", n,
                        json_string_value(ns));
    int found = 0;
    const char *key;
    json_t *what;
    json_object_foreach(ts->callables, key, what) if (!strcmp(json_string_value(json_object_get(what, "name")), n)) {
        if (!found++) snprintf(out, RSP_NAME_MAX + 1, "%s", key);
    }
    if (found == 1) return true;
    return srv_fail(ts->e, 400, INVALID, "tool_choice", NULL,
                    found ? "'tool_choice' names '%.64s', which more than one namespace has; add its 'namespace'"
                          : "'tool_choice' names '%.64s', which is not a function or custom tool in 'tools'",
                    n);
}

static bool set_choice(json_t *chat, json_t *choice, srv_error *e) {
    return (choice && !json_object_set_new(chat, "tool_choice", choice)) || oom(e);
}

static bool forced_hosted(toolset *ts, const char *type) {
    return srv_fail(ts->e, 400, INVALID, "tool_choice", "unsupported_tool",
                    "'tool_choice' forces the hosted tool '%.40s', which kettle cannot run (%s)", type,
                    hosted_why(type));
}

/* The chat tools whose names `names` (an object) has, in their order. */
static json_t *tools_named(json_t *tools, json_t *names) {
    json_t *keep = json_array(), *t;
    size_t i;
    json_array_foreach(tools, i, t) {
        const char *n = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
        if (keep && n && json_object_get(names, n) && json_array_append(keep, t)) json_decref(keep), keep = NULL;
    }
    return keep;
}

/* {"type": "allowed_tools", "mode", "tools": [...]}: the tools not listed
 * are left out, and mode is chat's tool_choice. */
static bool allowed_tools(toolset *ts, json_t *tc, json_t *chat) {
    const char *mode = json_string_value(json_object_get(tc, "mode"));
    json_t *list = json_object_get(tc, "tools"), *ref;
    if (!mode || (strcmp(mode, "auto") && strcmp(mode, "required")))
        return srv_fail(ts->e, 400, INVALID, "tool_choice", NULL, "'tool_choice.mode' must be \"auto\" or \"required\"");
    if (!json_is_array(list))
        return srv_fail(ts->e, 400, INVALID, "tool_choice", NULL, "'tool_choice.tools' must be an array of tools");
    json_t *allowed = json_object(), *keep = NULL;
    if (!allowed) return oom(ts->e);
    size_t i;
    bool ok = true;
    json_array_foreach(list, i, ref) if (ok) {
        const char *type = json_string_value(json_object_get(ref, "type"));
        char name[RSP_NAME_MAX + 1];
        if (hosted_why(type)) continue; /* left out already */
        if (!type || (strcmp(type, "function") && strcmp(type, "custom")))
            ok = srv_fail(ts->e, 400, INVALID, "tool_choice", NULL,
                          "'tool_choice.tools[%zu]' must name a function, custom or hosted tool", i);
        else
            ok = resolve(ts, ref, name) && (!json_object_set_new(allowed, name, json_true()) || oom(ts->e));
    }
    if (ok) ok = (keep = tools_named(ts->chat, allowed)) != NULL || oom(ts->e);
    json_decref(allowed);
    if (ok && !strcmp(mode, "required") && !json_array_size(keep))
        ok = srv_fail(ts->e, 400, INVALID, "tool_choice", NULL,
                      "'tool_choice' requires a call of one of its tools, and kettle runs none of them");
    if (!ok) return json_decref(keep), false;
    json_decref(ts->chat);
    ts->chat = keep;
    return !json_array_size(keep) || set_choice(chat, json_string(mode), ts->e);
}

static bool choice_to_chat(toolset *ts, json_t *tc, json_t *chat) {
    if (!tc || json_is_null(tc)) return true;
    const bool have = json_array_size(ts->chat) > 0;
    if (json_is_string(tc)) {
        const char *s = json_string_value(tc);
        if (!strcmp(s, "required") && !have)
            return srv_fail(ts->e, 400, INVALID, "tool_choice", NULL,
                            "'tool_choice' is \"required\" but 'tools' has no tool kettle runs (hosted tools are left "
                            "out)");
        if (!strcmp(s, "none") || !strcmp(s, "auto") || !strcmp(s, "required"))
            return !have || set_choice(chat, json_incref(tc), ts->e);
    }
    const char *type = json_string_value(json_object_get(tc, "type"));
    char name[RSP_NAME_MAX + 1];
    if (type && (!strcmp(type, "function") || !strcmp(type, "custom")))
        return resolve(ts, tc, name) &&
               set_choice(chat, json_pack("{s:s, s:{s:s}}", "type", "function", "function", "name", name), ts->e);
    if (type && !strcmp(type, "allowed_tools")) return allowed_tools(ts, tc, chat);
    if (hosted_why(type)) return forced_hosted(ts, type);
    return srv_fail(ts->e, 400, INVALID, "tool_choice", NULL,
                    "'tool_choice' must be \"none\", \"auto\", \"required\", {\"type\": \"function\" or \"custom\", "
                    "\"name\": ...} or {\"type\": \"allowed_tools\", ...}");
}

/* ---- the two entry points ---- */

static bool toolset_init(toolset *ts, srv_notes *notes, srv_error *e) {
    *ts = (toolset){.chat = json_array(), .callables = json_object(), .hosted = json_array(), .notes = notes, .e = e};
    return (ts->chat && ts->callables && ts->hosted) || oom(e);
}

static void toolset_free(toolset *ts) { json_decref(ts->chat), json_decref(ts->callables), json_decref(ts->hosted); }

/* "hosted tools left out of the prompt (...): web_search, image_generation" */
static void note_hosted(const toolset *ts) {
    char list[256] = "";
    size_t i, n = 0;
    json_t *t;
    json_array_foreach(ts->hosted, i, t) {
        int k = snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "", json_string_value(t));
        if (k < 0 || (size_t)k >= sizeof list - n) break;
        n += (size_t)k;
    }
    if (n) srv_note(ts->notes, "hosted tools left out of the prompt (kettle cannot run them): %s", list);
}

bool rsp_tools_to_chat(json_t *body, json_t *chat, srv_notes *notes, srv_error *e) {
    toolset ts;
    if (!toolset_init(&ts, notes, e)) return toolset_free(&ts), false;
    bool ok = walk(&ts, body) && choice_to_chat(&ts, json_object_get(body, "tool_choice"), chat);
    if (ok && json_array_size(ts.chat)) ok = !json_object_set(chat, "tools", ts.chat) || oom(e);
    if (ok) note_hosted(&ts);
    toolset_free(&ts);
    return ok;
}

json_t *rsp_callables(json_t *body) {
    toolset ts;
    srv_error e;
    json_t *map = NULL;
    if (toolset_init(&ts, NULL, &e) && walk(&ts, body)) map = json_incref(ts.callables);
    toolset_free(&ts);
    return map;
}
