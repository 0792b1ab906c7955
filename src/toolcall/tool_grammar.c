/*
 * tool_grammar.c - the GBNF that keeps a family's tool calls valid (see
 * toolcall.h): each function's parameter schema through kettle's JSON
 * Schema converter (its rules prefixed "tN-" so all functions live in one
 * grammar), written into the family's call text (format_int.h's g_call).
 *
 * Free text inside a constrained reply (the thinking block under
 * `required`, an XML string argument) is "text that does not contain the
 * closing marker M", written as the alternatives
 *     [^m0 c] | m0 [^m1 c] | m0 m1 [^m2 c] | ...     (c = m0)
 * repeated: every proper prefix of M followed by a byte that neither
 * continues M nor starts it again. It refuses a few odd strings (a prefix
 * of M right before another m0, such as "</" then "</think>") and never
 * accepts M itself, so the marker always ends the text.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "grammar/gbnf_text.h"
#include "grammar/json_schema.h"
#include "toolcall/format_int.h"

static bool empty(const char *s) { return !s || !s[0]; }

typedef struct gcx {
    const kt_tool_format *f;
    sbuf rules; /* every tool's rules */
    kt_tool_control_id control_id;
    void *ctx;
    kt_error *err;
    sbuf python;    /* " | py-N" for each tool called in Python (Llama 3.1's built-in tools) */
    char *relaxed;  /* the grammar's `relaxed` (what is enforced only in part) */
    size_t relaxed_cap;
} gcx;

/* Adds "tool 'T': what" to g->relaxed (cut when full). */
static void note_relaxed(gcx *g, const char *tool, const char *what) {
    size_t len = strlen(g->relaxed);
    snprintf(g->relaxed + len, g->relaxed_cap - len, "%stool '%.64s': %s", len ? "; " : "", tool, what);
}

/* A GBNF literal for s[0..n). */
static void put_lit(sbuf *b, const char *s, size_t n) {
    if (!n) return;
    sb_puts(b, " \"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') sb_printf(b, "\\%c", c);
        else if (c == '\n') sb_puts(b, "\\n");
        else if (c == '\t') sb_puts(b, "\\t");
        else if (c == '\r') sb_puts(b, "\\r");
        else if (c < 0x20) sb_printf(b, "\\x%02X", c);
        else sb_putn(b, (const char *)&c, 1);
    }
    sb_puts(b, "\"");
}

/* Where s[0..n) starts with a control token's text (a marker like
 * [TOOL_CALLS]: `<` or `[` ... `>` or `]`), its id and *len; else -1. */
static int32_t control_at(const gcx *g, const char *s, size_t n, size_t *len) {
    if (!g || !g->control_id || (s[0] != '<' && s[0] != '[')) return -1;
    for (size_t k = 2; k <= n && k <= 48; k++) {
        if (s[k - 1] != '>' && s[k - 1] != ']') continue;
        int32_t id = g->control_id(g->ctx, s, k);
        if (id >= 0) return *len = k, id;
    }
    return -1;
}

/* Text as GBNF: literals, with each control token's text as its token
 * reference <[id]> (its bytes are not text the trie can match). */
static void put_text(const gcx *g, sbuf *b, const char *s, size_t n) {
    size_t from = 0;
    for (size_t i = 0; i < n;) {
        size_t len;
        int32_t id = control_at(g, s + i, n - i, &len);
        if (id < 0) {
            i++;
            continue;
        }
        put_lit(b, s + from, i - from);
        sb_printf(b, " <[%d]>", (int)id);
        i += len, from = i;
    }
    put_lit(b, s + from, n - from);
}

/* A character class byte, escaped. */
static void put_class_byte(sbuf *b, unsigned char c) {
    if (c == ']' || c == '\\' || c == '^' || c == '-' || c == '[') sb_printf(b, "\\%c", c);
    else if (c == '\n') sb_puts(b, "\\n");
    else if (c < 0x20 || c >= 0x80) sb_printf(b, "\\x%02X", c);
    else sb_putn(b, (const char *)&c, 1);
}

/* rule ::= text not containing m (see the top of the file). */
static void rule_without(sbuf *b, const char *rule, const char *m) {
    size_t k = strlen(m);
    sb_printf(b, "%s ::= (", rule);
    for (size_t j = 0; j < k; j++) {
        sb_puts(b, j ? " |" : "");
        put_lit(b, m, j);
        sb_puts(b, " [^");
        put_class_byte(b, (unsigned char)m[j]);
        if (m[j] != m[0]) put_class_byte(b, (unsigned char)m[0]);
        sb_puts(b, "]");
    }
    sb_puts(b, " )*\n");
}

/* ---- one function ---- */

static const char *fn_name(const json_t *tool) {
    return json_string_value(json_object_get(json_object_get(tool, "function"), "name"));
}

static const json_t *fn_params(const json_t *tool) {
    return json_object_get(json_object_get(tool, "function"), "parameters");
}

/* Every object schema of s (in place) that lists properties and says
 * nothing of others gets additionalProperties false: a tool's arguments
 * are the parameters it declares (as OpenAI's strict mode, llama.cpp and
 * XGrammar read such a schema for a call). Left open, a model may append
 * invented properties until max_tokens cuts the call. */
static bool close_objects(json_t *s) { /* false: out of memory */
    if (!json_is_object(s)) return true;
    if (json_is_object(json_object_get(s, "properties")) && !json_object_get(s, "additionalProperties") &&
        !json_object_get(s, "patternProperties") && !json_object_get(s, "unevaluatedProperties") &&
        json_object_set_new(s, "additionalProperties", json_false()))
        return false;
    static const char *const maps[] = {"properties", "$defs", "definitions"};
    static const char *const lists[] = {"anyOf", "oneOf", "allOf", "prefixItems"};
    for (size_t i = 0; i < sizeof maps / sizeof maps[0]; i++) {
        const char *k;
        json_t *v;
        json_object_foreach(json_object_get(s, maps[i]), k, v) if (!close_objects(v)) return false;
    }
    for (size_t i = 0; i < sizeof lists / sizeof lists[0]; i++) {
        size_t j;
        json_t *v;
        json_array_foreach(json_object_get(s, lists[i]), j, v) if (!close_objects(v)) return false;
    }
    return close_objects(json_object_get(s, "items"));
}

/* Appends schema's rules as PREFIX-*; false with err set. Bounds past the
 * grammar's limit are relaxed (kt_schema_opts), noted under `tool`. */
static bool add_schema(gcx *g, const json_t *schema, const char *prefix, const char *what, const char *tool) {
    kt_error e = {0};
    char relaxed[256] = "";
    kt_schema_opts opts = {.relax_bounds = true, .relaxed = relaxed, .relaxed_cap = sizeof relaxed};
    json_t *own = schema ? json_deep_copy(schema) : json_pack("{s:s, s:{}}", "type", "object", "properties");
    char *gbnf = own && close_objects(own) ? kt_json_schema_to_gbnf_ex(own, &opts, &e) : NULL;
    if (gbnf && relaxed[0]) note_relaxed(g, tool, relaxed);
    json_decref(own);
    if (!gbnf) {
        kt_error_set(g->err, e.status ? e.status : KT_ERR_NOMEM, "%s: %s", what, e.msg[0] ? e.msg : "out of memory");
        return false;
    }
    sb_gbnf_prefixed(&g->rules, gbnf, prefix);
    free(gbnf);
    return true;
}

/* A string parameter of an XML family is raw text, which carries nothing
 * that constrains a string beyond its enum. The keywords that shape its
 * text (lengths, pattern, format) are the model's to respect and the
 * client's to check: noted as not enforced. Any other constraint is
 * refused (false with err set). */
static bool plain_text_ok(gcx *g, const json_t *prop, const char *tool, const char *key) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)prop, k, v) {
        if (!strcmp(k, "type") || !strcmp(k, "description") || !strcmp(k, "title") || !strcmp(k, "default") ||
            !strcmp(k, "examples") || !strcmp(k, "enum") || !strcmp(k, "$comment"))
            continue;
        if (!strcmp(k, "minLength") || !strcmp(k, "maxLength") || !strcmp(k, "pattern") || !strcmp(k, "format")) {
            char what[160];
            snprintf(what, sizeof what, "parameter '%.60s': '%s' not enforced (the %s format's arguments are raw text)",
                     key, k, g->f->name);
            note_relaxed(g, tool, what);
            continue;
        }
        kt_error_set(g->err, KT_ERR_UNSUPPORTED,
                     "tool '%.80s', parameter '%.80s': keyword '%.40s' cannot be enforced on the raw-text "
                     "arguments of the %s format",
                     tool, key, k, g->f->name);
        return false;
    }
    return true;
}

/* The value rule of XML parameter `key` of tool t (rule name in out). */
static bool xml_value_rule(gcx *g, const json_t *prop, int t, int j, const char *key, const char *tool,
                           char *out, size_t cap) {
    const json_t *type = json_object_get(prop, "type");
    const json_t *en = json_object_get(prop, "enum");
    bool text = json_is_string(type) && !strcmp(json_string_value(type), "string");
    if (text && !plain_text_ok(g, prop, tool, key)) return false;
    snprintf(out, cap, "t%d-v%d", t, j);
    if (text && json_is_array(en)) {
        sb_printf(&g->rules, "%s ::=", out);
        size_t i;
        json_t *v;
        json_array_foreach(en, i, v) {
            if (!json_is_string(v)) continue;
            sb_puts(&g->rules, i ? " |" : "");
            put_text(g, &g->rules, json_string_value(v), json_string_length(v));
        }
        sb_puts(&g->rules, "\n");
        return true;
    }
    if (text) return snprintf(out, cap, "xml-text"), true;
    char prefix[48], what[256];
    snprintf(prefix, sizeof prefix, "t%d-p%d-", t, j);
    snprintf(what, sizeof what, "tool '%.80s', parameter '%.80s'", tool, key);
    if (!add_schema(g, prop, prefix, what, tool)) return false;
    snprintf(out, cap, "t%d-p%d-root", t, j);
    return true;
}

/* Writes template text (g_call or g_param) as a GBNF sequence: literal
 * runs, and rules for %n (name), %a (arguments), %p (XML parameters),
 * %k (key), %v (value rule), %i (an index). */
static void expand(const gcx *g, sbuf *b, const char *tpl, const char *name, const char *args, const char *params,
                   const char *key, const char *value) {
    sbuf lit = {0};
    for (const char *s = tpl; *s; s++) {
        if (*s != '%' || !s[1]) {
            sb_putn(&lit, s, 1);
            continue;
        }
        char c = *++s;
        if (c == 'n' || c == 'k') {
            sb_puts(&lit, c == 'n' ? name : key);
            continue;
        }
        put_text(g, b, lit.p ? lit.p : "", lit.n);
        lit.n = 0;
        if (c == 'a') sb_printf(b, " %s", args);
        else if (c == 'p') sb_printf(b, " %s", params);
        else if (c == 'v') sb_printf(b, " %s", value);
        else if (c == 'i') sb_puts(b, " [0-9]");
    }
    put_text(g, b, lit.p ? lit.p : "", lit.n);
    b->oom |= lit.oom;
    free(lit.p);
}

/* tN-params ::= one g_param per property, required ones mandatory, in the
 * schema's order. */
static bool xml_params(gcx *g, const json_t *tool, int t) {
    const json_t *ps = fn_params(tool);
    const json_t *props = json_object_get(ps, "properties"), *req = json_object_get(ps, "required");
    sbuf seq = {0};
    const char *key;
    json_t *prop;
    int j = 0;
    bool ok = true;
    json_object_foreach((json_t *)props, key, prop) {
        char vrule[64];
        if (!(ok = xml_value_rule(g, prop, t, j, key, fn_name(tool), vrule, sizeof vrule))) break;
        bool required = false;
        size_t i;
        json_t *r;
        json_array_foreach(req, i, r) required |= json_is_string(r) && !strcmp(json_string_value(r), key);
        sb_puts(&seq, " (");
        expand(g, &seq, g->f->g_param, NULL, NULL, NULL, key, vrule);
        sb_puts(&seq, required ? " )" : " )?");
        j++;
    }
    if (ok) sb_printf(&g->rules, "t%d-params ::=%s\n", t, seq.p ? seq.p : " \"\"");
    g->rules.oom |= seq.oom;
    free(seq.p);
    return ok;
}

/* ---- Llama 3.1's built-in tools (format_int.h) ---- */

static bool is_required(const json_t *req, const char *key) {
    size_t i;
    json_t *r;
    json_array_foreach((json_t *)req, i, r) if (json_is_string(r) && !strcmp(json_string_value(r), key)) return true;
    return false;
}

/* py-N ::= NAME.call(k="v", ...): the required keywords in the schema's
 * order, then each optional one; when none is required, the first
 * optional one comes before any other. Values are JSON by each
 * property's schema (a JSON string is a Python string; the parser reads
 * JSON's true / false / null too). */
static bool py_call(gcx *g, const json_t *tool, int t) {
    const json_t *ps = fn_params(tool);
    const json_t *props = json_object_get(ps, "properties"), *req = json_object_get(ps, "required");
    char head[200];
    snprintf(head, sizeof head, "%.180s.call(", fn_name(tool));
    sbuf r = {0}; /* the rule, apart: add_schema appends the values' rules meanwhile */
    sb_printf(&r, "py-%d ::=", t);
    put_lit(&r, head, strlen(head));
    int n_written = 0, n_open = 0;
    for (int pass = 0; pass < 2; pass++) { /* required ones, then optional ones */
        const char *key;
        json_t *prop;
        int j = 0;
        json_object_foreach((json_t *)props, key, prop) {
            const int k = j++;
            if (is_required(req, key) != (pass == 0)) continue;
            char prefix[48], what[256], kv[300];
            snprintf(prefix, sizeof prefix, "t%d-k%d-", t, k);
            snprintf(what, sizeof what, "tool '%.80s', parameter '%.80s'", fn_name(tool), key);
            if (!add_schema(g, prop, prefix, what, fn_name(tool))) return free(r.p), false;
            snprintf(kv, sizeof kv, "%s%.200s=", n_written ? ", " : "", key);
            if (pass == 1) sb_puts(&r, " ("), n_open++;
            put_lit(&r, kv, strlen(kv));
            sb_printf(&r, " t%d-k%d-root", t, k);
            if (pass == 1 && n_written) sb_puts(&r, " )?"), n_open--;
            n_written++;
        }
    }
    while (n_open--) sb_puts(&r, " )?"); /* the first optional one, when none is required */
    sb_puts(&r, " \")\"\n");
    if (!r.oom) sb_putn(&g->rules, r.p, r.n); /* oom: r.p may be NULL */
    g->rules.oom |= r.oom;
    free(r.p);
    return true;
}

/* Whether tool t is called in Python after <|python_tag|> (py-N). */
static bool pythonic(const gcx *g, const json_t *tool) {
    return !empty(g->f->builtin_var) && (tc_is_builtin_call(fn_name(tool)) || tc_is_code_tool(fn_name(tool)));
}

/* call-N ::= the call of tool t; after-N: the same without the trigger's
 * text when the call starts with it (Llama 3's `{"name"`). */
static bool add_tool(gcx *g, const json_t *tool, int t) {
    const char *name = fn_name(tool);
    char what[160], prefix[32], args[48], params[48];
    snprintf(what, sizeof what, "tool '%.80s' parameters", name);
    snprintf(prefix, sizeof prefix, "t%d-", t);
    snprintf(args, sizeof args, "t%d-root", t);
    snprintf(params, sizeof params, "t%d-params", t);
    if (g->f->shape == SHAPE_XML ? !xml_params(g, tool, t) : !add_schema(g, fn_params(tool), prefix, what, name))
        return false;
    if (pythonic(g, tool)) {
        if (tc_is_code_tool(name)) sb_printf(&g->rules, "py-%d ::= [^{ \\t\\n] .*\n", t);
        else if (!py_call(g, tool, t)) return false;
        sb_printf(&g->python, " | py-%d", t);
    }
    const char *call = g->f->g_call;
    size_t tl = strlen(g->f->trigger);
    sb_printf(&g->rules, "call-%d ::=", t);
    expand(g, &g->rules, call, name, args, params, NULL, NULL);
    sb_printf(&g->rules, "\nafter-%d ::=", t);
    expand(g, &g->rules, strncmp(call, g->f->trigger, tl) ? call : call + tl, name, args, params, NULL, NULL);
    sb_puts(&g->rules, "\n");
    return true;
}

/* ---- the grammars ---- */

static char *finish(sbuf *root, const sbuf *rules) {
    if (!rules->oom) sb_putn(root, rules->p, rules->n); /* oom: rules->p may be NULL */
    if (root->oom || rules->oom) {
        free(root->p);
        return NULL;
    }
    return root->p;
}

/* body ::= what follows the trigger: calls with their list or section. */
static void body_rules(gcx *g, int n_tools, bool parallel) {
    const kt_tool_format *f = g->f;
    sb_puts(&g->rules, "call ::=");
    for (int t = 0; t < n_tools; t++) sb_printf(&g->rules, "%s call-%d", t ? " |" : "", t);
    sb_puts(&g->rules, "\nafter ::=");
    for (int t = 0; t < n_tools; t++) sb_printf(&g->rules, "%s after-%d", t ? " |" : "", t);
    sb_puts(&g->rules, "\n");
    if (f->g_more) { /* the calls are a list or a section after the trigger */
        sb_puts(&g->rules, "body ::=");
        put_text(g, &g->rules, f->g_start, strlen(f->g_start));
        sb_puts(&g->rules, " call");
        if (parallel) {
            sb_puts(&g->rules, " (");
            put_text(g, &g->rules, f->g_more, strlen(f->g_more));
            sb_puts(&g->rules, f->g_more[0] ? " call )*" : " \"\" call )*");
        }
        put_text(g, &g->rules, f->g_end, strlen(f->g_end));
        sb_puts(&g->rules, "\n");
    } else if (parallel) { /* each further call opened by the trigger again */
        sb_puts(&g->rules, "body ::= after ( " TC_WS);
        put_text(g, &g->rules, f->trigger, strlen(f->trigger));
        sb_puts(&g->rules, " after )*\n");
    } else {
        sb_puts(&g->rules, "body ::= after\n");
    }
    if (f->shape == SHAPE_XML) rule_without(&g->rules, "xml-text", f->value_close);
    if (g->python.n) sb_printf(&g->rules, "pyrest ::= call%.*s\n", (int)g->python.n, g->python.p);
    g->rules.oom |= g->python.oom;
}

/* root ::= what the reply of a reply_open family is (functionary v3.2:
 * the prompt ends with `>>>`): calls, or under auto "all\n" and text
 * (or the response_format's answer), which a call may follow. */
static char *open_reply(gcx *g, bool text_allowed, const char *content) {
    const kt_tool_format *f = g->f;
    sbuf root = {0};
    sb_puts(&root, "root ::= body");
    if (text_allowed) {
        sb_puts(&root, " |");
        put_text(g, &root, f->text_name, strlen(f->text_name));
        put_text(g, &root, f->name_end, strlen(f->name_end));
        if (content) sb_puts(&root, " rf-root");
        else {
            sb_puts(&root, " reply-text (");
            put_text(g, &root, f->call_open, strlen(f->call_open));
            sb_puts(&root, " body )?");
        }
    }
    sb_puts(&root, "\n");
    if (text_allowed && !content) rule_without(&root, "reply-text", f->call_open);
    if (content) sb_gbnf_prefixed(&root, content, "rf-"), sb_puts(&root, "\n");
    return finish(&root, &g->rules);
}

/* root ::= [thinking] trigger body, for required / named; with a content
 * grammar (response_format under auto), [thinking] (content | trigger body). */
static char *whole_reply(gcx *g, kt_tool_think think, const char *content) {
    const kt_tool_format *f = g->f;
    const char *open = f->g_think_open ? f->g_think_open : f->think_open;
    const char *close = f->g_think_close ? f->g_think_close : f->think_close;
    sbuf root = {0};
    sb_puts(&root, "root ::=");
    const bool thinks = !empty(close) && think != KT_THINK_DONE, in_thinking = think == KT_THINK_OPEN;
    if (thinks) {
        if (!in_thinking) sb_puts(&root, " (");
        if (!in_thinking) put_text(g, &root, open, strlen(open));
        sb_puts(&root, " think-text");
        put_text(g, &root, close, strlen(close));
        sb_puts(&root, " " TC_WS);
        if (!in_thinking) sb_puts(&root, " )?");
    }
    bool trigger_in_call = !strncmp(f->g_call, f->trigger, strlen(f->trigger));
    sb_puts(&root, content ? " ( rf-root |" : "");
    if (!trigger_in_call) put_text(g, &root, f->trigger, strlen(f->trigger));
    if (trigger_in_call && g->python.n) { /* Llama 3.1: or a call in Python after <|python_tag|> */
        sb_puts(&root, " ( call |");
        put_text(g, &root, f->trigger2, strlen(f->trigger2));
        sb_puts(&root, " pyrest )");
    } else {
        sb_puts(&root, trigger_in_call ? " call" : " body");
    }
    sb_puts(&root, content ? " )\n" : "\n");
    if (thinks) rule_without(&root, "think-text", close);
    if (content) sb_gbnf_prefixed(&root, content, "rf-"), sb_puts(&root, "\n");
    return finish(&root, &g->rules);
}

static char *after_trigger(gcx *g, bool second) {
    sbuf root = {0};
    sb_puts(&root, !second ? "root ::= body\n" : g->python.n ? "root ::= pyrest\n" : "root ::= call\n");
    return finish(&root, &g->rules);
}

kt_tool_think kt_tool_think_state(const kt_tool_format *f, const char *prompt) {
    const char *open = f->think_open, *close = f->think_close;
    if (empty(open)) return KT_THINK_MAYBE;
    size_t n = strlen(prompt);
    while (n && (prompt[n - 1] == '\n' || prompt[n - 1] == ' ')) n--;
    if (n >= strlen(open) && !memcmp(prompt + n - strlen(open), open, strlen(open))) return KT_THINK_OPEN;
    if (n >= strlen(close) && !memcmp(prompt + n - strlen(close), close, strlen(close))) return KT_THINK_DONE;
    return KT_THINK_MAYBE;
}

kt_status kt_tool_grammar_build(const kt_tool_format *f, const json_t *tools, kt_tool_choice choice,
                                const char *name, bool parallel, kt_tool_think think, const char *content_gbnf,
                                kt_tool_control_id control_id, void *ctx, kt_tool_grammar *out, kt_error *err) {
    *out = (kt_tool_grammar){.special_text = f->special_text};
    if (choice == KT_TOOL_NONE || !json_array_size(tools)) return KT_OK;
    gcx g = {.f = f, .control_id = control_id, .ctx = ctx, .err = err, .relaxed = out->relaxed,
             .relaxed_cap = sizeof out->relaxed};
    int n = 0;
    if (choice == KT_TOOL_NAMED) {
        const json_t *t = tc_find_tool(tools, name, strlen(name));
        if (!t) return kt_error_set(err, KT_ERR_ARG, "tool_choice names the function '%.80s', which is not in 'tools'", name);
        if (!add_tool(&g, t, n++)) goto fail;
    } else {
        size_t i;
        json_t *t;
        json_array_foreach(tools, i, t) if (!add_tool(&g, t, n++)) goto fail;
    }
    parallel = parallel && !f->one_call && choice != KT_TOOL_NAMED;
    body_rules(&g, n, parallel);
    /* one constrained segment holds every call (the body repeats them),
     * so the reply ends when the grammar does: no text after the calls */
    out->max_calls = 1;
    const bool open = !empty(f->reply_open), whole = choice != KT_TOOL_AUTO || content_gbnf || open;
    const char *content = choice == KT_TOOL_AUTO ? content_gbnf : NULL;
    if (whole && !(out->grammar = open ? open_reply(&g, choice == KT_TOOL_AUTO, content)
                                       : whole_reply(&g, think, content)))
        goto nomem;
    if (!(out->triggers[0] = strdup(f->trigger)) || !(out->trigger_grammars[0] = after_trigger(&g, false))) goto nomem;
    out->n_triggers = 1;
    if (!empty(f->trigger2)) {
        if (!(out->triggers[1] = strdup(f->trigger2)) || !(out->trigger_grammars[1] = after_trigger(&g, true)))
            goto nomem;
        out->n_triggers = 2;
    }
    free(g.rules.p), free(g.python.p);
    return KT_OK;
nomem:
    kt_error_set(err, KT_ERR_NOMEM, "out of memory building the tool-call grammar");
fail:
    free(g.rules.p), free(g.python.p);
    kt_tool_grammar_free(out);
    return err ? err->status : KT_ERR_NOMEM;
}

void kt_tool_grammar_free(kt_tool_grammar *g) {
    free(g->grammar);
    for (int i = 0; i < KT_TOOL_MAX_TRIGGERS; i++) free(g->triggers[i]), free(g->trigger_grammars[i]);
    *g = (kt_tool_grammar){0};
}
