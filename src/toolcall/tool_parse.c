/*
 * tool_parse.c - the incremental parser of a reply: content, reasoning
 * and tool calls, in any family's syntax (toolcall.h, format_int.h).
 *
 * Input is appended to `pend`; `run` consumes it state by state and stops
 * when it needs more text to decide. Two rules make a stream correct
 * whatever the token boundaries:
 *   - text that might be the beginning of a marker is held back (`hold`)
 *     until it completes the marker or cannot any more, so no marker is
 *     ever emitted as content or reasoning;
 *   - a call is announced (KT_TD_CALL, whole name) only once its name is
 *     complete, and its arguments go out as the raw JSON text the model
 *     wrote, so every delta appends and the pieces join to the whole.
 * A call that turns out malformed before it was announced is emitted as
 * content (marker included): nothing is lost. Under a grammar that cannot
 * happen; without one (a call cut by max_tokens, a model writing a marker
 * in prose) it is the honest rendering of what the model wrote.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json_safe.h"
#include "text/utf8.h"
#include "toolcall/format_int.h"

typedef struct tbuf {
    char *p;
    size_t n, cap;
} tbuf;

static bool tb_add(tbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return false;
        b->p = p, b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

static void tb_drop(tbuf *b, size_t n) { /* removes the first n bytes */
    memmove(b->p, b->p + n, b->n - n);
    b->n -= n;
    if (b->p) b->p[b->n] = 0;
}

static bool empty(const char *s) { return !s || !s[0]; }

/* ---- JSON scanning ---- */

/* Where a JSON value's parts are, found one byte at a time. Used for a
 * call envelope (object mode: the values of name_key and args_key at depth
 * 1) and for bare arguments (value mode: the whole value). */
typedef struct jscan {
    int depth;
    bool in_str, esc, done, bad, started;
    int phase;              /* depth 1: 0 key or '}', 1 in key, 2 ':', 3 value, 4 in value, 5 ',' or '}' */
    tbuf key;
    bool scalar;            /* the value being read at depth 1 is a scalar */
    size_t value_from;
    int which;              /* 1 name, 2 args, 0 other */
    size_t name_from, name_to, args_from, args_to; /* args_to 0: not ended */
    bool has_name, has_args;
} jscan;

static void value_end(jscan *j, size_t at) {
    if (j->which == 1) j->name_from = j->value_from, j->name_to = at, j->has_name = true;
    if (j->which == 2) j->args_to = at;
    j->phase = 5;
}

static void value_start(jscan *j, size_t at, const kt_tool_format *f) {
    j->value_from = at;
    j->which = j->key.n && !strcmp(j->key.p, f->name_key) ? 1 : j->key.n && !strcmp(j->key.p, f->args_key) ? 2 : 0;
    if (j->which == 2) j->args_from = at, j->has_args = true;
    j->phase = 4;
}

/* One byte of an envelope object at offset `at` of the call text. */
static bool scan_object(jscan *j, const kt_tool_format *f, char c, size_t at) {
    if (j->in_str) {
        if (j->depth == 1 && j->phase == 1 && !(c == '"' && !j->esc) && !tb_add(&j->key, &c, 1)) return false;
        if (j->esc) j->esc = false;
        else if (c == '\\') j->esc = true;
        else if (c == '"') {
            j->in_str = false;
            if (j->depth == 1 && j->phase == 1) j->phase = 2;
            else if (j->depth == 1 && j->phase == 4 && j->scalar) value_end(j, at + 1);
        }
        return true;
    }
    if (isspace((unsigned char)c)) {
        if (j->depth == 1 && j->phase == 4 && j->scalar) value_end(j, at);
        return true;
    }
    if (j->depth == 0) {
        if (c != '{') j->bad = true;
        j->depth = 1, j->phase = 0, j->started = true;
        return true;
    }
    if (j->depth == 1 && j->phase == 4 && j->scalar && (c == ',' || c == '}')) value_end(j, at);
    switch (c) {
    case '{':
    case '[':
        if (j->depth == 1) {
            if (j->phase != 3) j->bad = true;
            value_start(j, at, f);
            j->scalar = false;
        }
        j->depth++;
        break;
    case '}':
    case ']':
        j->depth--;
        if (j->depth == 0) j->done = true;
        else if (j->depth == 1) value_end(j, at + 1);
        break;
    case '"':
        j->in_str = true;
        if (j->depth == 1 && (j->phase == 0)) j->phase = 1, j->key.n = 0, tb_add(&j->key, "", 0);
        else if (j->depth == 1 && j->phase == 3) value_start(j, at, f), j->scalar = true;
        else if (j->depth == 1 && j->phase != 3 && j->phase != 4) j->bad = true;
        break;
    case ':':
        if (j->depth == 1) j->phase = j->phase == 2 ? 3 : (j->bad = true, j->phase);
        break;
    case ',':
        if (j->depth == 1) j->phase = 0;
        break;
    default:
        if (j->depth == 1 && j->phase == 3) value_start(j, at, f), j->scalar = true;
        else if (j->depth == 1 && j->phase != 4) j->bad = true;
    }
    return true;
}

/* One byte of a bare JSON value (the arguments of NAME_ARGS). */
static void scan_value(jscan *j, char c, size_t at) {
    if (j->in_str) {
        if (j->esc) j->esc = false;
        else if (c == '\\') j->esc = true;
        else if (c == '"') j->in_str = false, j->done = j->depth == 0;
        return;
    }
    if (!j->started) {
        if (isspace((unsigned char)c)) return;
        j->started = true, j->args_from = at, j->has_args = true;
        if (c != '{' && c != '[') j->bad = true;
    }
    if (c == '"') j->in_str = true;
    else if (c == '{' || c == '[') j->depth++;
    else if (c == '}' || c == ']') {
        if (--j->depth == 0) j->done = true, j->args_to = at + 1;
    }
}

/* ---- the parser ---- */

typedef enum pstate {
    ST_CONTENT,
    ST_REASONING,
    ST_SECTION,   /* inside section markers, between calls */
    ST_JSON,      /* a JSON envelope */
    ST_NAME,      /* NAME_ARGS / XML: the function's name */
    ST_ARGS,      /* NAME_ARGS: the arguments' JSON */
    ST_AFTER,     /* a call's body ended: its close marker */
    ST_SECTION_END, /* a JSON list ended: the section's close marker */
    ST_XML_OPEN,  /* XML: the name's opener */
    ST_XML_PARAMS,
    ST_XML_KEY,
    ST_XML_VALOPEN,
    ST_XML_VALUE,
    ST_H_HEADER,  /* harmony: a message header up to <|message|> */
    ST_H_BODY,
    ST_PYTAG,     /* Llama 3.1: after <|python_tag|>, JSON, NAME.call(...) or code */
    ST_PYCALL,    /* NAME.call( read: the keyword arguments up to ')' */
    ST_CODE,      /* the code of a code tool's call, streamed as a JSON string */
} pstate;

typedef enum hkind { H_CONTENT, H_REASONING, H_CALL } hkind;

struct kt_tool_parser {
    const kt_tool_format *f;
    kt_tool_parse_opts o;
    kt_tool_emit emit;
    void *ctx;
    char *id_seed;
    tbuf pend;
    pstate st;
    bool final, failed;
    bool cut;          /* the reply was cut short: a marker's beginning held back at the end is dropped */
    int n_calls;
    bool skip_lead;       /* drop whitespace before the next text (see drop_lead) */
    bool list_open;       /* JSON list section: its '[' was read */
    /* the call being read */
    tbuf raw;             /* its text from the opener on (for the fallback) */
    tbuf name;
    bool announced;
    jscan js;
    size_t args_sent;     /* bytes of raw (from args_from) already emitted */
    tbuf key, val;
    int n_params;
    hkind hk;
    /* Python (ST_PYCALL): inside a string (its quote), escaped, paren depth */
    char py_quote;
    bool py_esc;
    int py_depth;
};

static bool out(kt_tool_parser *p, kt_tool_delta_kind k, const char *s, size_t n) {
    if (!n && k != KT_TD_CALL) return true;
    kt_tool_delta d = {.kind = k, .index = p->n_calls - 1, .text = s, .len = n};
    if (!p->emit(p->ctx, &d)) return p->failed = true, false;
    return true;
}

/* ---- markers ---- */

/* 1: s[0..n) starts with m; -1: s is a proper prefix of m; 0 neither. */
static int starts(const char *s, size_t n, const char *m) {
    size_t k = strlen(m);
    if (n >= k) return memcmp(s, m, k) == 0;
    return memcmp(s, m, n) == 0 ? -1 : 0;
}

/* The first position in s[0..n) where one of the markers occurs whole
 * (*which its index), or where one might begin in the text to come
 * (*which -1); n if neither. */
static size_t find_markers(const char *s, size_t n, const char *const *m, int nm, int *which) {
    for (size_t i = 0; i < n; i++) {
        bool partial = false;
        for (int k = 0; k < nm; k++) {
            if (empty(m[k])) continue;
            int r = starts(s + i, n - i, m[k]);
            if (r == 1) return *which = k, i;
            partial |= r == -1;
        }
        if (partial) return *which = -1, i;
    }
    *which = -1;
    return n;
}

/* Content text s[0..n): whitespace at its end is held back (the caller
 * keeps it in pend) unless the reply is over, and dropped at the end of a
 * reply that made calls. Returns the bytes consumed. */
static size_t emit_content(kt_tool_parser *p, const char *s, size_t n, bool at_end) {
    size_t keep = n;
    if (!at_end || p->n_calls)
        while (keep && isspace((unsigned char)s[keep - 1])) keep--;
    if (keep && !out(p, KT_TD_CONTENT, s, keep)) return 0;
    return at_end ? n : keep;
}

/* Whitespace the template writes after a thinking block or a call is not
 * the answer's: dropped while `skip_lead` is set. False: pend is empty. */
static bool drop_lead(kt_tool_parser *p) {
    if (!p->skip_lead) return p->pend.n > 0;
    size_t i = 0;
    while (i < p->pend.n && isspace((unsigned char)p->pend.p[i])) i++;
    tb_drop(&p->pend, i);
    if (p->pend.n) p->skip_lead = false;
    return p->pend.n > 0;
}

static bool skip_ws(kt_tool_parser *p) {
    size_t i = 0;
    while (i < p->pend.n && isspace((unsigned char)p->pend.p[i])) i++;
    tb_drop(&p->pend, i);
    return p->pend.n > 0;
}

/* Starts reading call number n_calls (the opener is already consumed,
 * `opener` its text for the fallback). */
static bool call_begin(kt_tool_parser *p, const char *opener, pstate next) {
    p->raw.n = p->name.n = p->key.n = p->val.n = 0;
    p->announced = false, p->args_sent = 0, p->n_params = 0;
    jscan fresh = {.key = p->js.key};
    fresh.key.n = 0;
    p->js = fresh;
    p->st = next;
    return tb_add(&p->raw, opener, strlen(opener)) && tb_add(&p->name, "", 0);
}

/* The name a family writes, as OpenAI names it (Kimi's
 * "functions.NAME:0", Mistral's "NAME[CALL_ID]id"). */
static void clean_name(tbuf *name) {
    char *s = name->p;
    if (!strncmp(s, "functions.", 10)) memmove(s, s + 10, strlen(s + 10) + 1);
    char *cut = strstr(s, "[CALL_ID]");
    if (cut) *cut = 0;
    char *colon = strrchr(s, ':');
    if (colon && colon[1] && strspn(colon + 1, "0123456789") == strlen(colon + 1)) *colon = 0;
    size_t a = 0, b = strlen(s);
    while (a < b && isspace((unsigned char)s[a])) a++;
    while (b > a && isspace((unsigned char)s[b - 1])) b--;
    memmove(s, s + a, b - a);
    s[b - a] = 0;
    name->n = b - a;
}

static bool announce(kt_tool_parser *p) {
    clean_name(&p->name);
    if (!p->name.n) return true;
    char id[48];
    kt_tool_call_id(p->f, p->id_seed, p->n_calls, id, sizeof id);
    p->n_calls++;
    p->announced = true;
    kt_tool_delta d = {.kind = KT_TD_CALL, .index = p->n_calls - 1, .text = p->name.p, .len = p->name.n, .id = id};
    if (!p->emit(p->ctx, &d)) return p->failed = true, false;
    return true;
}

/* A call that cannot be one: its text so far becomes content. */
static bool call_abandon(kt_tool_parser *p) {
    p->st = ST_CONTENT;
    if (p->announced) return true; /* its arguments are what was sent */
    bool ok = !p->raw.n || out(p, KT_TD_CONTENT, p->raw.p, p->raw.n);
    p->raw.n = 0;
    return ok;
}

/* The reply ended inside a call (max_tokens, or the context): a call
 * already announced keeps the arguments it got (finish_reason says
 * "length"); one not yet named is dropped rather than shown as content,
 * where its marker would mislead (a client sees finish_reason "length"). */
static bool call_cut(kt_tool_parser *p) {
    p->st = ST_CONTENT;
    p->raw.n = 0;
    return false;
}

static bool call_end(kt_tool_parser *p) {
    p->st = ST_AFTER;
    p->skip_lead = true;
    return true;
}

/* ---- states ---- */

static bool content_state(kt_tool_parser *p) {
    const kt_tool_format *f = p->f;
    const char *m[8] = {0};
    int nm = 0;
    const int THINK = nm;
    m[nm++] = p->o.reasoning ? f->think_open : NULL;
    m[nm++] = !p->o.calls ? NULL : !empty(f->section_open) ? f->section_open : f->call_open;
    m[nm++] = p->o.calls && empty(f->section_open) ? f->call_open2 : NULL;
    const int STRIP = nm;
    for (int i = 0; i < 3; i++) m[nm++] = f->strip[i];
    const int HARMONY = nm;
    if (f->shape == SHAPE_HARMONY) m[nm++] = "<|channel|>", m[nm++] = "<|start|>";
    if (!drop_lead(p)) return false;
    int which;
    size_t at = find_markers(p->pend.p, p->pend.n, m, nm, &which);
    if (which < 0) { /* no whole marker: emit what cannot start one */
        size_t upto = p->final && !p->cut ? p->pend.n : at;
        tb_drop(&p->pend, emit_content(p, p->pend.p, upto, p->final));
        if (p->final && p->cut) p->pend.n = 0; /* "<tool" of a call max_tokens cut: not the answer's text */
        return false; /* needs more text */
    }
    emit_content(p, p->pend.p, at, false);
    if (p->failed) return false;
    tb_drop(&p->pend, at);
    const char *mk = m[which];
    if (which == THINK) {
        tb_drop(&p->pend, strlen(mk));
        p->st = ST_REASONING, p->skip_lead = true;
        return true;
    }
    if (which >= STRIP && which < HARMONY) {
        tb_drop(&p->pend, strlen(mk));
        return true;
    }
    if (which >= HARMONY) {
        return call_begin(p, "", ST_H_HEADER);
    }
    bool body_marker = f->shape == SHAPE_JSON && mk == f->call_open && mk[0] == '{';
    if (!body_marker) tb_drop(&p->pend, strlen(mk));
    if (!empty(f->section_open) && mk == f->section_open) {
        p->st = ST_SECTION, p->list_open = false;
        p->raw.n = 0;
        return tb_add(&p->raw, mk, strlen(mk)) || (p->failed = true, false);
    }
    pstate next = f->shape == SHAPE_JSON ? ST_JSON : f->shape == SHAPE_XML ? ST_XML_OPEN : ST_NAME;
    if (f->shape == SHAPE_JSON && mk == f->call_open2) next = empty(f->builtin_var) ? ST_JSON : ST_PYTAG;
    return call_begin(p, body_marker ? "" : mk, next);
}

static bool reasoning_state(kt_tool_parser *p) {
    const char *m[1] = {p->f->think_close};
    if (!drop_lead(p)) return false;
    int which;
    size_t at = find_markers(p->pend.p, p->pend.n, m, 1, &which);
    size_t keep = which < 0 && p->final ? p->pend.n : at;
    if (which >= 0 || !p->final) /* whitespace before the close is the template's */
        while (keep && isspace((unsigned char)p->pend.p[keep - 1])) keep--;
    if (!out(p, KT_TD_REASONING, p->pend.p, keep)) return false;
    if (which < 0) {
        tb_drop(&p->pend, keep);
        return false;
    }
    tb_drop(&p->pend, at + strlen(m[0]));
    p->st = ST_CONTENT, p->skip_lead = true;
    return true;
}

/* Streams what is new of the arguments (raw bytes from args_from). */
static bool send_args(kt_tool_parser *p, size_t upto) {
    if (!p->announced || !p->js.has_args) return true;
    size_t from = p->js.args_from + p->args_sent;
    if (upto <= from) return true;
    if (p->raw.p[p->js.args_from] == '"') return true; /* a string: decoded at the end */
    p->args_sent += upto - from;
    return out(p, KT_TD_ARGS, p->raw.p + from, upto - from);
}

/* s[0..n) as a JSON value, or NULL: not JSON, or (*oom) out of memory,
 * which must not pass for "not JSON" (a call would lose its arguments or
 * turn into content). */
static json_t *parse_any(const char *s, size_t n, bool *oom) {
    json_error_t je;
    json_t *j = kt_json_loadb(s, n, JSON_DECODE_ANY, &je);
    *oom = !j && json_error_code(&je) == json_error_out_of_memory;
    return j;
}

/* Arguments given as a JSON string holding JSON: sent decoded, once. */
static bool send_string_args(kt_tool_parser *p) {
    if (!p->js.has_args || p->raw.p[p->js.args_from] != '"' || p->args_sent) return true;
    bool oom;
    json_t *s = parse_any(p->raw.p + p->js.args_from, p->js.args_to - p->js.args_from, &oom);
    if (oom) return p->failed = true, false;
    bool ok = !json_is_string(s) || out(p, KT_TD_ARGS, json_string_value(s), json_string_length(s));
    p->args_sent = 1;
    json_decref(s);
    return ok;
}

static bool json_state(kt_tool_parser *p) {
    size_t i = 0;
    for (; i < p->pend.n && !p->js.done && !p->js.bad; i++) {
        if (!tb_add(&p->raw, p->pend.p + i, 1)) return p->failed = true, false;
        if (!p->js.started && isspace((unsigned char)p->pend.p[i])) continue;
        if (!scan_object(&p->js, p->f, p->pend.p[i], p->raw.n - 1)) return p->failed = true, false;
        if (!p->announced && p->js.has_name) {
            bool oom;
            json_t *s = parse_any(p->raw.p + p->js.name_from, p->js.name_to - p->js.name_from, &oom);
            if (oom) return p->failed = true, false;
            bool ok = json_is_string(s) && tb_add(&p->name, json_string_value(s), json_string_length(s));
            json_decref(s);
            if (ok && !announce(p)) return false;
        }
    }
    tb_drop(&p->pend, i);
    if (p->js.bad) return call_abandon(p);
    if (!send_args(p, p->js.args_to ? p->js.args_to : p->raw.n)) return false;
    if (!p->js.done) return p->final ? call_cut(p) : false;
    if (!p->announced) return call_abandon(p);
    if (p->js.args_to && !send_string_args(p)) return false;
    if (!p->js.has_args && !out(p, KT_TD_ARGS, "{}", 2)) return false;
    return call_end(p);
}

/* Text up to one of the markers (not consumed) is added to b; true when
 * a marker was reached (*which), false when more text is needed. */
static bool collect_until(kt_tool_parser *p, tbuf *b, const char *const *m, int nm, int *which) {
    size_t at = find_markers(p->pend.p, p->pend.n, m, nm, which);
    if (!tb_add(b, p->pend.p, at) || !tb_add(&p->raw, p->pend.p, at)) return p->failed = true, false;
    tb_drop(&p->pend, at);
    return *which >= 0;
}

static bool consume(kt_tool_parser *p, const char *m) {
    size_t k = strlen(m);
    if (!tb_add(&p->raw, p->pend.p, k)) return p->failed = true, false;
    tb_drop(&p->pend, k);
    return true;
}

static bool name_state(kt_tool_parser *p) {
    const kt_tool_format *f = p->f;
    const char *m[4] = {f->name_end, f->shape == SHAPE_XML ? f->key_open : NULL,
                        f->shape == SHAPE_XML ? (empty(f->fn_close) ? f->call_close : f->fn_close) : NULL, "\n"};
    int nm = f->shape == SHAPE_XML ? 3 : 1;
    int which;
    bool reached = collect_until(p, &p->name, m, nm, &which);
    if (p->failed) return false;
    if (!reached) {
        if (p->name.n > 256) return call_abandon(p);
        /* v3.2's first segment without its name line is the answer's text */
        return p->final ? (empty(f->reply_open) ? call_cut(p) : call_abandon(p)) : false;
    }
    if (which == 0 && !consume(p, f->name_end)) return false;
    if (!empty(f->text_name) && !strcmp(p->name.p, f->text_name)) { /* v3.2's `>>>all`: text follows */
        p->st = ST_CONTENT, p->raw.n = 0;
        return true;
    }
    /* a reply_open family: the first line names a function only when it is offered (and calls are
     * parsed); anything else is text the model wrote without `all` */
    if (!empty(f->reply_open) && (!p->o.calls || !tc_find_tool(p->o.tools, p->name.p, p->name.n))) return call_abandon(p);
    if (!announce(p)) return false;
    if (!p->announced) return call_abandon(p);
    p->st = f->shape == SHAPE_XML ? ST_XML_PARAMS : ST_ARGS;
    return true;
}

static bool code_begin(kt_tool_parser *p, const char *param);

static bool args_state(kt_tool_parser *p) {
    if (!p->js.started && tc_is_code_tool(p->name.p)) { /* `>>>python\nprint(1)`: code, not JSON */
        size_t k = 0;
        while (k < p->pend.n && isspace((unsigned char)p->pend.p[k])) k++;
        if (k == p->pend.n && !p->final) return false;
        const char *param = NULL;
        if (k < p->pend.n && p->pend.p[k] != '{' && tc_code_tool(p->o.tools, &param)) {
            tb_drop(&p->pend, k);
            return code_begin(p, param);
        }
    }
    size_t i = 0;
    for (; i < p->pend.n && !p->js.done && !p->js.bad; i++) {
        if (!tb_add(&p->raw, p->pend.p + i, 1)) return p->failed = true, false;
        scan_value(&p->js, p->pend.p[i], p->raw.n - 1);
    }
    tb_drop(&p->pend, i);
    if (p->js.bad) { /* not JSON: the call has no arguments the API can carry */
        if (!out(p, KT_TD_ARGS, "{}", 2)) return false;
        return call_abandon(p);
    }
    if (!send_args(p, p->js.args_to ? p->js.args_to : p->raw.n)) return false;
    if (!p->js.done) return p->final ? call_cut(p) : false;
    return call_end(p);
}

/* After a call: its close marker, then the next call or the section's end. */
static bool after_state(kt_tool_parser *p) {
    const kt_tool_format *f = p->f;
    if (!skip_ws(p)) return false;
    const char *close = f->call_close;
    while (close && isspace((unsigned char)*close)) close++;
    if (!empty(close)) {
        int r = starts(p->pend.p, p->pend.n, close);
        if (r < 0) return p->final ? (p->st = ST_CONTENT, true) : false;
        if (r == 1) tb_drop(&p->pend, strlen(close));
    }
    p->st = !empty(f->section_open) ? ST_SECTION : ST_CONTENT;
    return true;
}

static bool section_state(kt_tool_parser *p) {
    const kt_tool_format *f = p->f;
    if (!skip_ws(p)) return p->final ? (p->st = ST_CONTENT, false) : false;
    char c = p->pend.p[0];
    if (f->json_list) {
        if (!p->list_open) {
            if (c != '[') return call_abandon(p);
            p->list_open = true;
            return consume(p, "[");
        }
        if (c == ',') return tb_drop(&p->pend, 1), true;
        if (c == ']') {
            tb_drop(&p->pend, 1);
            p->list_open = false;
            p->st = empty(f->section_close) ? ST_CONTENT : ST_SECTION_END;
            return true;
        }
        if (c == '{') return call_begin(p, "", ST_JSON);
        return call_abandon(p);
    }
    const char *m[2] = {f->call_open, f->section_close};
    for (int k = 0; k < 2; k++) {
        if (empty(m[k])) continue;
        int r = starts(p->pend.p, p->pend.n, m[k]);
        if (r < 0) return p->final ? (p->st = ST_CONTENT, true) : false;
        if (r == 1) {
            tb_drop(&p->pend, strlen(m[k]));
            if (k == 1) return p->st = ST_CONTENT, p->skip_lead = true, true;
            return call_begin(p, m[0], f->shape == SHAPE_XML ? ST_XML_OPEN : ST_NAME);
        }
    }
    p->st = ST_CONTENT;
    return true;
}

static bool section_end_state(kt_tool_parser *p) {
    if (!skip_ws(p)) return false;
    int r = starts(p->pend.p, p->pend.n, p->f->section_close);
    if (r < 0 && !p->final) return false;
    if (r == 1) tb_drop(&p->pend, strlen(p->f->section_close));
    p->st = ST_CONTENT, p->skip_lead = true;
    return true;
}

/* ---- XML arguments ---- */

/* The parameter's schema type in the offered tool, or NULL. */
static const char *param_type(const kt_tool_parser *p, const char *key) {
    const json_t *t = tc_find_tool(p->o.tools, p->name.p, p->name.n);
    if (!t) return NULL;
    json_t *fn = json_object_get(t, "function");
    json_t *prop = json_object_get(json_object_get(json_object_get(fn, "parameters"), "properties"), key);
    json_t *ty = json_object_get(prop, "type");
    if (json_is_string(ty)) return json_string_value(ty);
    if (json_is_array(ty)) return json_string_value(json_array_get(ty, 0));
    return json_object_get(prop, "enum") || json_object_get(prop, "const") ? "any" : NULL;
}

/* `"key": value` with the value as JSON: a string parameter as a string,
 * anything else parsed (a value that is not JSON stays a string). */
static bool send_param(kt_tool_parser *p) {
    char *v = p->val.p ? p->val.p : "";
    size_t n = p->val.n;
    if (n && v[0] == '\n') v++, n--;
    if (n && v[n - 1] == '\n') n--;
    const char *ty = param_type(p, p->key.p);
    json_t *val = NULL;
    bool oom = false;
    if (!ty || strcmp(ty, "string")) val = parse_any(v, n, &oom);
    if (oom) return p->failed = true, false;
    if (!val) val = json_stringn(v, n);
    char *vs = val ? kt_json_dumps(val, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    json_t *k = json_string(p->key.p);
    char *ks = k ? kt_json_dumps(k, JSON_ENCODE_ANY) : NULL;
    tbuf b = {0};
    bool ok = vs && ks && tb_add(&b, p->n_params ? ", " : "{", p->n_params ? 2 : 1) && tb_add(&b, ks, strlen(ks)) &&
              tb_add(&b, ": ", 2) && tb_add(&b, vs, strlen(vs));
    ok = ok && out(p, KT_TD_ARGS, b.p, b.n);
    p->n_params++;
    free(b.p), free(vs), free(ks);
    json_decref(val), json_decref(k);
    if (!ok) p->failed = true;
    return ok;
}

static bool xml_open_state(kt_tool_parser *p) {
    const kt_tool_format *f = p->f;
    if (empty(f->name_open)) return p->st = ST_NAME, true;
    if (!skip_ws(p)) return p->final ? call_cut(p) : false;
    int r = starts(p->pend.p, p->pend.n, f->name_open);
    if (r < 0) return p->final ? call_cut(p) : false;
    if (r == 0) return call_abandon(p);
    if (!consume(p, f->name_open)) return false;
    p->st = ST_NAME;
    return true;
}

static bool xml_params_state(kt_tool_parser *p) {
    const kt_tool_format *f = p->f;
    if (!skip_ws(p)) return p->final ? (out(p, KT_TD_ARGS, p->n_params ? "}" : "{}", p->n_params ? 1 : 2),
                                        p->st = ST_CONTENT, false)
                                     : false;
    const char *end = empty(f->fn_close) ? f->call_close : f->fn_close;
    int r = starts(p->pend.p, p->pend.n, f->key_open);
    int e = starts(p->pend.p, p->pend.n, end);
    if (r == 1) {
        p->key.n = p->val.n = 0;
        if (!consume(p, f->key_open) || !tb_add(&p->key, "", 0)) return p->failed = true, false;
        p->st = ST_XML_KEY;
        return true;
    }
    if (e == 1) {
        if (!empty(f->fn_close)) tb_drop(&p->pend, strlen(end));
        if (!out(p, KT_TD_ARGS, p->n_params ? "}" : "{}", p->n_params ? 1 : 2)) return false;
        return call_end(p);
    }
    if ((r < 0 || e < 0) && !p->final) return false;
    if (!out(p, KT_TD_ARGS, p->n_params ? "}" : "{}", p->n_params ? 1 : 2)) return false;
    p->st = ST_CONTENT;
    return true;
}

static bool xml_key_state(kt_tool_parser *p) {
    const char *m[1] = {p->f->key_close};
    int which;
    if (!collect_until(p, &p->key, m, 1, &which)) {
        if (p->failed) return false;
        return p->final ? (out(p, KT_TD_ARGS, p->n_params ? "}" : "{}", p->n_params ? 1 : 2), p->st = ST_CONTENT,
                           false)
                        : false;
    }
    if (!consume(p, m[0])) return false;
    p->st = ST_XML_VALOPEN;
    return true;
}

static bool xml_valopen_state(kt_tool_parser *p) {
    const char *vo = p->f->value_open;
    if (!empty(vo)) {
        if (!skip_ws(p)) return false;
        int r = starts(p->pend.p, p->pend.n, vo);
        if (r < 0) return false;
        if (r == 1) tb_drop(&p->pend, strlen(vo));
    }
    if (!tb_add(&p->val, "", 0)) return p->failed = true, false;
    p->st = ST_XML_VALUE;
    return true;
}

static bool xml_value_state(kt_tool_parser *p) {
    const char *m[1] = {p->f->value_close};
    int which;
    if (!collect_until(p, &p->val, m, 1, &which)) {
        if (p->failed) return false;
        if (p->final) {
            send_param(p);
            out(p, KT_TD_ARGS, "}", 1);
            p->st = ST_CONTENT;
        }
        return false;
    }
    tb_drop(&p->pend, strlen(m[0]));
    if (!send_param(p)) return false;
    p->st = ST_XML_PARAMS;
    return true;
}

/* ---- harmony (gpt-oss) ---- */

/* A header: "<|channel|>CHANNEL[ to=functions.NAME][ <|constrain|>json]"
 * or "assistant to=functions.NAME<|channel|>commentary json" (after
 * <|start|>), up to <|message|>. */
static bool h_header_state(kt_tool_parser *p) {
    const char *m[1] = {"<|message|>"};
    int which;
    if (!collect_until(p, &p->name, m, 1, &which)) {
        if (p->failed) return false;
        if (p->final) p->st = ST_CONTENT;
        return false;
    }
    tb_drop(&p->pend, strlen(m[0]));
    const char *h = p->name.p;
    const char *to = strstr(h, "to=functions.");
    if (to && p->o.calls) {
        const char *a = to + 13, *b = a;
        while (*b && !isspace((unsigned char)*b) && *b != '<') b++;
        tbuf nm = {0};
        if (!tb_add(&nm, a, (size_t)(b - a))) return p->failed = true, false;
        free(p->name.p);
        p->name = nm;
        p->hk = H_CALL;
        if (!announce(p)) return false;
        p->js = (jscan){.key = p->js.key};
        p->raw.n = 0;
    } else {
        p->hk = strstr(h, "analysis") && p->o.reasoning ? H_REASONING : H_CONTENT;
    }
    p->st = ST_H_BODY;
    return true;
}

static bool h_body_state(kt_tool_parser *p) {
    const char *m[4] = {"<|end|>", "<|call|>", "<|return|>", "<|start|>"};
    int which;
    size_t at = find_markers(p->pend.p, p->pend.n, m, 4, &which);
    size_t upto = p->final && which < 0 ? p->pend.n : at;
    bool ok = true;
    if (p->hk == H_CALL && p->announced) {
        if (!tb_add(&p->raw, p->pend.p, upto)) return p->failed = true, false;
        ok = out(p, KT_TD_ARGS, p->pend.p, upto);
    } else if (p->hk == H_REASONING) {
        ok = out(p, KT_TD_REASONING, p->pend.p, upto);
    } else {
        size_t sent = emit_content(p, p->pend.p, upto, p->final && which < 0);
        ok = !p->failed;
        if (which < 0) upto = sent; /* else the message ended: its trailing whitespace with it */
    }
    if (!ok) return false;
    tb_drop(&p->pend, upto);
    if (which < 0) return false;
    if (which != 3) tb_drop(&p->pend, strlen(m[which]));
    p->st = ST_CONTENT;
    if (p->hk == H_CALL && p->announced && p->raw.n == 0 && !out(p, KT_TD_ARGS, "{}", 2)) return false;
    return true;
}

/* ---- Python: Llama 3.1's built-in tools, code tools ---- */

/* s[0..n) as the inside of a JSON string. */
static bool json_escaped(tbuf *b, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char e[8];
        const char *t = e;
        size_t k = 2;
        if (c == '"' || c == '\\') e[0] = '\\', e[1] = (char)c;
        else if (c == '\n') t = "\\n";
        else if (c == '\t') t = "\\t";
        else if (c == '\r') t = "\\r";
        else if (c < 0x20) k = (size_t)snprintf(e, sizeof e, "\\u%04x", c);
        else e[0] = (char)c, k = 1;
        if (!tb_add(b, t, k)) return false;
    }
    return true;
}

/* Sends code s[0..n) as more of the current call's JSON string. */
static bool send_code(kt_tool_parser *p, const char *s, size_t n) {
    tbuf b = {0};
    bool ok = json_escaped(&b, s, n) && out(p, KT_TD_ARGS, b.p ? b.p : "", b.n);
    free(b.p);
    return ok || (p->failed = true, false);
}

/* The call is the code tool's: announced now, its arguments opened as
 * {"PARAM": " and the code streamed into that string (code_state). */
static bool code_begin(kt_tool_parser *p, const char *param) {
    if (!p->announced) {
        const char *unused;
        const char *name = tc_code_tool(p->o.tools, &unused);
        p->name.n = 0;
        if (!tb_add(&p->name, name, strlen(name))) return p->failed = true, false;
        if (!announce(p) || !p->announced) return false;
    }
    tbuf b = {0};
    bool ok = tb_add(&b, "{\"", 2) && json_escaped(&b, param, strlen(param)) && tb_add(&b, "\": \"", 4) &&
              out(p, KT_TD_ARGS, b.p, b.n);
    free(b.p);
    if (!ok) return p->failed = true, false;
    p->st = ST_CODE;
    return true;
}

/* Code runs to the end of the reply (or, in functionary v3.2, to the
 * next `>>>`). */
static bool code_state(kt_tool_parser *p) {
    const char *m[1] = {p->f->reply_open};
    int which;
    size_t at = find_markers(p->pend.p, p->pend.n, m, 1, &which);
    size_t upto = which < 0 && p->final ? p->pend.n : at;
    if (!send_code(p, p->pend.p, upto)) return false;
    tb_drop(&p->pend, upto);
    if (which < 0 && !p->final) return false;
    if (!out(p, KT_TD_ARGS, "\"}", 2)) return false;
    p->st = ST_CONTENT; /* the next `>>>` opens the next call */
    return true;
}

/* One Python literal at s[0..n) as JSON: a quoted string, True / False /
 * None, or JSON itself (numbers, lists and dicts written as JSON). */
static json_t *py_literal(const char *s, size_t n, bool *oom) {
    *oom = false;
    while (n && isspace((unsigned char)s[n - 1])) n--;
    if (n == 4 && !memcmp(s, "True", 4)) return json_true();
    if (n == 5 && !memcmp(s, "False", 5)) return json_false();
    if (n == 4 && !memcmp(s, "None", 4)) return json_null();
    if (n >= 2 && s[0] == '\'' && s[n - 1] == '\'') { /* 'text': unescaped, then a JSON string */
        tbuf b = {0};
        bool ok = tb_add(&b, "", 0);
        for (size_t i = 1; ok && i + 1 < n; i++) {
            char c = s[i];
            if (c == '\\' && i + 2 < n) {
                c = s[++i];
                c = c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c;
            }
            ok = tb_add(&b, &c, 1);
        }
        json_t *v = ok ? json_stringn(b.p, b.n) : NULL;
        *oom = !ok || (!v && kt_utf8_valid(b.p, b.n, NULL)); /* else not text JSON can hold */
        free(b.p);
        return v;
    }
    return parse_any(s, n, oom);
}

/* `k1="v", k2=3` as a JSON object's text (malloc'ed), or NULL: not such
 * text, or (*oom) out of memory. */
static char *py_kwargs_json(const char *s, size_t n, bool *oom) {
    json_t *obj = json_object();
    size_t i = 0;
    bool ok = obj != NULL;
    *oom = !obj;
    while (ok) {
        while (i < n && isspace((unsigned char)s[i])) i++;
        if (i == n) break;
        size_t k0 = i;
        while (i < n && (isalnum((unsigned char)s[i]) || s[i] == '_')) i++;
        size_t k1 = i;
        while (i < n && isspace((unsigned char)s[i])) i++;
        if (k1 == k0 || i == n || s[i] != '=') ok = false;
        if (!ok) break;
        size_t v0 = ++i;
        char quote = 0;
        int depth = 0;
        for (; i < n; i++) { /* to the ',' that ends the value */
            char c = s[i];
            if (quote) {
                if (c == '\\') i++;
                else if (c == quote) quote = 0;
            } else if (c == '"' || c == '\'') quote = c;
            else if (c == '[' || c == '{' || c == '(') depth++;
            else if (c == ']' || c == '}' || c == ')') depth--;
            else if (c == ',' && depth == 0) break;
        }
        while (v0 < i && isspace((unsigned char)s[v0])) v0++;
        json_t *v = py_literal(s + v0, i - v0, oom);
        ok = v && !json_object_setn_new(obj, s + k0, k1 - k0, v);
        if (v && !ok) *oom = true; /* setn refuses only for memory here: the key is ASCII */
        if (i < n) i++; /* the ',' */
    }
    char *text = ok ? kt_json_dumps(obj, JSON_COMPACT) : NULL;
    if (ok && !text) *oom = true;
    json_decref(obj);
    return text;
}

/* After <|python_tag|>: a JSON call, NAME.call(...) of an offered
 * function, or code for the code tool; else the text is content. */
static bool pytag_state(kt_tool_parser *p) {
    if (!skip_ws(p)) return p->final ? call_cut(p) : false;
    const char *s = p->pend.p;
    size_t n = p->pend.n, i = 0;
    if (s[0] == '{') return p->st = ST_JSON, true;
    while (i < n && i <= 64 && (isalnum((unsigned char)s[i]) || s[i] == '_')) i++;
    int r = i && i <= 64 ? starts(s + i, n - i, ".call(") : 0;
    if (r < 0 && !p->final) return false;
    if (r == 1 && tc_find_tool(p->o.tools, s, i)) {
        p->name.n = 0;
        if (!tb_add(&p->name, s, i)) return p->failed = true, false;
        p->val.n = 0, p->py_quote = 0, p->py_esc = false, p->py_depth = 1;
        if (!tb_add(&p->val, "", 0) || !tb_add(&p->raw, s, i + 6)) return p->failed = true, false;
        tb_drop(&p->pend, i + 6);
        p->st = ST_PYCALL;
        return true;
    }
    const char *param = NULL;
    if (tc_code_tool(p->o.tools, &param)) return code_begin(p, param);
    return call_abandon(p);
}

/* NAME.call(...) that is not a call the API can carry (its arguments
 * are not literals, or it never closes): code for the code tool when one
 * is offered, else the text stays, as content. */
static bool py_not_a_call(kt_tool_parser *p) {
    const char *param = NULL;
    if (!tc_code_tool(p->o.tools, &param)) return call_abandon(p);
    const size_t opener = strlen(p->f->call_open2);
    tbuf code = {0};
    if (!tb_add(&code, p->raw.p + opener, p->raw.n - opener)) return p->failed = true, false;
    bool ok = code_begin(p, param) && send_code(p, code.p, code.n);
    free(code.p);
    return ok;
}

/* The keyword arguments of NAME.call(, up to the ')' that closes it. */
static bool pycall_state(kt_tool_parser *p) {
    size_t i = 0;
    for (; i < p->pend.n && p->py_depth > 0; i++) {
        char c = p->pend.p[i];
        if (p->py_quote) {
            if (p->py_esc) p->py_esc = false;
            else if (c == '\\') p->py_esc = true;
            else if (c == p->py_quote) p->py_quote = 0;
        } else if (c == '"' || c == '\'') p->py_quote = c;
        else if (c == '(' || c == '[' || c == '{') p->py_depth++;
        else if (c == ')' || c == ']' || c == '}') p->py_depth--;
    }
    bool closed = p->py_depth == 0;
    if (!tb_add(&p->raw, p->pend.p, i) || !tb_add(&p->val, p->pend.p, closed ? i - 1 : i))
        return p->failed = true, false;
    tb_drop(&p->pend, i);
    if (!closed) return p->final ? py_not_a_call(p) : false;
    bool oom;
    char *args = py_kwargs_json(p->val.p, p->val.n, &oom);
    if (oom) return p->failed = true, false;
    if (!args) return py_not_a_call(p);
    bool ok = announce(p) && p->announced && out(p, KT_TD_ARGS, args, strlen(args));
    free(args);
    return ok ? call_end(p) : (p->announced ? false : call_abandon(p));
}

/* ---- driving ---- */

static bool step(kt_tool_parser *p) {
    switch (p->st) {
    case ST_CONTENT: return content_state(p);
    case ST_REASONING: return reasoning_state(p);
    case ST_SECTION: return section_state(p);
    case ST_JSON: return json_state(p);
    case ST_NAME: return name_state(p);
    case ST_ARGS: return args_state(p);
    case ST_AFTER: return after_state(p);
    case ST_SECTION_END: return section_end_state(p);
    case ST_XML_OPEN: return xml_open_state(p);
    case ST_XML_PARAMS: return xml_params_state(p);
    case ST_XML_KEY: return xml_key_state(p);
    case ST_XML_VALOPEN: return xml_valopen_state(p);
    case ST_XML_VALUE: return xml_value_state(p);
    case ST_H_HEADER: return h_header_state(p);
    case ST_H_BODY: return h_body_state(p);
    case ST_PYTAG: return pytag_state(p);
    case ST_PYCALL: return pycall_state(p);
    case ST_CODE: return code_state(p);
    }
    return false;
}

kt_tool_parser *kt_tool_parser_new(const kt_tool_format *f, const kt_tool_parse_opts *o, kt_tool_emit emit,
                                   void *ctx) {
    kt_tool_parser *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->f = f, p->o = *o, p->emit = emit, p->ctx = ctx;
    p->id_seed = strdup(o->id_seed ? o->id_seed : "");
    if (!p->id_seed || !tb_add(&p->pend, "", 0) || !tb_add(&p->raw, "", 0) || !tb_add(&p->name, "", 0)) {
        kt_tool_parser_free(p);
        return NULL;
    }
    p->st = o->in_thinking && o->reasoning && kt_tool_format_think_open(f) ? ST_REASONING : ST_CONTENT;
    if (!empty(f->reply_open) && !call_begin(p, "", ST_NAME)) { /* the prompt opened the first segment */
        kt_tool_parser_free(p);
        return NULL;
    }
    return p;
}

bool kt_tool_parser_feed(kt_tool_parser *p, const char *text, size_t n, bool final) {
    if (p->failed) return false;
    if (!tb_add(&p->pend, text, n)) return p->failed = true, false;
    p->final = final;
    /* every step consumes text or changes state, and returns false when
     * it needs more text; at the end each state flushes what it holds and
     * goes back to content, which takes the rest */
    for (int guard = 0; guard < 1 << 24 && step(p); guard++) continue;
    if (final && p->pend.n && !p->failed) tb_drop(&p->pend, emit_content(p, p->pend.p, p->pend.n, true));
    return !p->failed;
}

void kt_tool_parser_cut(kt_tool_parser *p) { p->cut = true; }

int kt_tool_parser_calls(const kt_tool_parser *p) { return p->n_calls; }

void kt_tool_parser_free(kt_tool_parser *p) {
    if (!p) return;
    free(p->pend.p), free(p->raw.p), free(p->name.p), free(p->js.key.p), free(p->key.p), free(p->val.p);
    free(p->id_seed);
    free(p);
}
