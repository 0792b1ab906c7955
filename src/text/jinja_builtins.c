/*
 * jinja_builtins.c - the tests (`x is name`), methods (Python's str and
 * dict methods) and global functions (range, namespace, dict, and the
 * raise_exception / strftime_now transformers adds) of the Jinja
 * interpreter, plus helpers the filters (jinja_filters.c) share. Each
 * behaves as jinja2 on Python does, since templates are written and
 * checked against that; anything else is an error naming it, never a
 * guess. Case mapping (upper, lower, title...) is ASCII-only.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "text/jinja_int.h"

#define MAX_RANGE 1000000

/* ---- argument binding ----------------------------------------------- */

bool jb_bind(jctx *c, const jargs *a, const char *what,
             const char *const *params, size_t np, jv **out, int line) {
    for (size_t i = 0; i < np; i++) out[i] = NULL;
    if (a->npos > np) {
        jfail(c, line, KT_ERR_FORMAT, "%s takes at most %zu argument(s), got %zu",
              what, np, a->npos);
        return false;
    }
    for (size_t i = 0; i < a->npos; i++) out[i] = a->pos[i];
    for (size_t k = 0; k < a->nkw; k++) {
        size_t i = 0;
        while (i < np && strcmp(params[i], a->kwn[k])) i++;
        if (i == np) {
            jfail(c, line, KT_ERR_FORMAT, "%s got an unexpected keyword argument '%s'",
                  what, a->kwn[k]);
            return false;
        }
        out[i] = a->kwv[k];
    }
    return true;
}


bool jb_want_str(jctx *c, const jv *v, const char *what, int line) {
    if (v && v->kind == JV_STR) return true;
    if (v && v->kind == JV_UNDEF) return je_undef_error(c, v, line), false;
    jfail(c, line, KT_ERR_FORMAT, "%s expects a string, got %s", what,
          v ? jv_typename(v) : "nothing");
    return false;
}

bool jb_want_int(jctx *c, const jv *v, const char *what, int line) {
    if (v && (v->kind == JV_INT || v->kind == JV_BOOL)) return true;
    jfail(c, line, KT_ERR_FORMAT, "%s expects an integer, got %s", what,
          v ? jv_typename(v) : "nothing");
    return false;
}

int64_t jb_ival(const jv *v) { return v->kind == JV_BOOL ? v->u.b : v->u.i; }

jv *jb_from_buf(jctx *c, jbuf *b) {
    jv *r = b->oom ? jnomem(c) : jv_str(c, b->p ? b->p : "", b->n);
    jbuf_free(b);
    return r;
}

/* Markup stays Markup through these (markupsafe wraps str methods). */
jv *jb_keep_safe(jv *r, const jv *from) {
    if (r && r->kind == JV_STR && from->kind == JV_STR && from->u.str.safe) r->u.str.safe = true;
    return r;
}

/* ---- string helpers ------------------------------------------------- */

static char up(char ch) { return ch >= 'a' && ch <= 'z' ? (char)(ch - 32) : ch; }
static char low(char ch) { return ch >= 'A' && ch <= 'Z' ? (char)(ch + 32) : ch; }
static bool is_alpha(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z'); }

jv *jb_map_case(jctx *c, jv *s, int mode) {
    jv *r = jv_str(c, s->u.str.s, s->u.str.n);
    if (!r) return NULL;
    char *o = (char *)r->u.str.s;
    bool word = false;
    for (size_t i = 0; i < r->u.str.n; i++) {
        char ch = o[i];
        switch (mode) {
        case 0: o[i] = up(ch); break;
        case 1: o[i] = low(ch); break;
        case 2: o[i] = i == 0 ? up(ch) : low(ch); break; /* capitalize */
        case 3: /* Python str.title */
            o[i] = word ? low(ch) : up(ch);
            word = is_alpha(ch) || (unsigned char)ch >= 0x80 || (ch >= '0' && ch <= '9');
            break;
        default: { /* jinja2 title: words start after - whitespace ( { [ < */
            bool start = i == 0 || strchr("-({[< \t\n\r\f\v", o[i - 1]) || s->u.str.s[i - 1] == '-';
            o[i] = start ? up(ch) : low(ch);
        }
        }
    }
    return r;
}

static bool in_chars(const jv *chars, const char *s, size_t n, size_t *len) {
    if (!chars || chars->kind == JV_NONE) return (*len = n > 0 ? ju_space(s, n) : 0) > 0;
    size_t l = ju_offset(s, n, 1);
    *len = l;
    for (size_t i = 0; i < chars->u.str.n;) {
        size_t k = ju_offset(chars->u.str.s + i, chars->u.str.n - i, 1);
        if (k == l && !memcmp(chars->u.str.s + i, s, l)) return true;
        i += k;
    }
    return false;
}

static size_t last_char_len(const char *s, size_t n) {
    size_t i = n - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
    return n - i;
}

jv *jb_strip(jctx *c, jv *s, const jv *chars, bool left, bool right, int line) {
    if (chars && chars->kind != JV_NONE && !jb_want_str(c, chars, "strip", line)) return NULL;
    const char *p = s->u.str.s;
    size_t n = s->u.str.n, l;
    while (left && n && in_chars(chars, p, n, &l)) p += l, n -= l;
    while (right && n) {
        size_t k = last_char_len(p, n);
        if (!in_chars(chars, p + n - k, k, &l) || l != k) break;
        n -= k;
    }
    return jv_str(c, p, n);
}

jv *jb_replace(jctx *c, jv *s, jv *old, jv *new_, int64_t count) {
    jbuf b = {0};
    const char *p = s->u.str.s, *end = p + s->u.str.n;
    size_t on = old->u.str.n;
    for (int64_t k = 0; count < 0 || k < count; k++) {
        const char *hit;
        if (!on) {
            /* Python inserts `new` before every character and at the end */
            jbuf_put(&b, new_->u.str.s, new_->u.str.n);
            if (p >= end) { p = end + 1; break; }
            size_t l = ju_offset(p, (size_t)(end - p), 1);
            jbuf_put(&b, p, l);
            p += l;
            continue;
        }
        if (!(hit = memmem(p, (size_t)(end - p), old->u.str.s, on))) break;
        jbuf_put(&b, p, (size_t)(hit - p));
        jbuf_put(&b, new_->u.str.s, new_->u.str.n);
        p = hit + on;
    }
    if (p <= end) jbuf_put(&b, p, (size_t)(end - p));
    return jb_from_buf(c, &b);
}

static jv *split(jctx *c, jv *s, jv *sep, int64_t maxsplit, int line) {
    jv *l = jv_list(c);
    if (!l) return NULL;
    const char *p = s->u.str.s, *end = p + s->u.str.n;
    if (sep && sep->kind != JV_NONE) {
        if (!jb_want_str(c, sep, "split", line)) return NULL;
        if (!sep->u.str.n) return jfail(c, line, KT_ERR_FORMAT, "split: empty separator");
        for (int64_t k = 0; maxsplit < 0 || k < maxsplit; k++) {
            const char *hit = memmem(p, (size_t)(end - p), sep->u.str.s, sep->u.str.n);
            if (!hit) break;
            jv *part = jv_str(c, p, (size_t)(hit - p));
            if (!part || !jv_list_push(c, l, part)) return NULL;
            p = hit + sep->u.str.n;
        }
        jv *part = jv_str(c, p, (size_t)(end - p));
        return part && jv_list_push(c, l, part) ? l : NULL;
    }
    for (int64_t k = 0;; k++) {
        size_t w;
        while (p < end && (w = ju_space(p, (size_t)(end - p)))) p += w;
        if (p >= end) break;
        const char *q = p;
        if (maxsplit >= 0 && k >= maxsplit) {
            q = end;
            while (q > p && (w = ju_space_back(p, (size_t)(q - p)))) q -= w;
        } else {
            while (q < end && !ju_space(q, (size_t)(end - q))) q += ju_offset(q, (size_t)(end - q), 1);
        }
        jv *part = jv_str(c, p, (size_t)(q - p));
        if (!part || !jv_list_push(c, l, part)) return NULL;
        p = q;
        if (q == end) break;
    }
    return l;
}

static bool has_affix(jctx *c, jv *s, jv *x, bool prefix, int line, int *res) {
    if (x->kind == JV_LIST && x->u.list.tuple) {
        *res = 0;
        for (size_t i = 0; i < x->u.list.n && !*res; i++)
            if (!has_affix(c, s, x->u.list.items[i], prefix, line, res)) return false;
        return true;
    }
    if (!jb_want_str(c, x, prefix ? "startswith" : "endswith", line)) return false;
    size_t n = x->u.str.n;
    *res = n <= s->u.str.n &&
           !memcmp(prefix ? s->u.str.s : s->u.str.s + s->u.str.n - n, x->u.str.s, n);
    return true;
}

/* ---- methods --------------------------------------------------------- */

static const char *const str_methods[] = {
    "startswith", "endswith", "strip", "lstrip", "rstrip", "split", "upper",
    "lower", "title", "capitalize", "replace", "find", "count", "join",
    "splitlines", "isdigit", "isspace", "isalpha", "isalnum", "islower",
    "isupper", NULL};
static const char *const dict_methods[] = {"items", "keys", "values", "get", NULL};

bool jb_in_table(const char *const *t, const char *name) {
    for (; *t; t++)
        if (!strcmp(*t, name)) return true;
    return false;
}

bool jb_is_method(const jv *self, const char *name) {
    if (self->kind == JV_STR) return jb_in_table(str_methods, name);
    if (self->kind == JV_DICT) return jb_in_table(dict_methods, name);
    return false;
}

jv *jb_dict_view(jctx *c, jv *d, int which) {
    jv *l = jv_list(c);
    for (size_t i = 0; l && i < d->u.dict.n; i++) {
        jv *item = which == 0 ? d->u.dict.keys[i] : d->u.dict.vals[i];
        if (which == 2) {
            if (!(item = jv_list(c))) return NULL;
            item->u.list.tuple = true;
            if (!jv_list_push(c, item, d->u.dict.keys[i]) ||
                !jv_list_push(c, item, d->u.dict.vals[i])) return NULL;
        }
        if (!jv_list_push(c, l, item)) return NULL;
    }
    return l;
}

static jv *str_pred(jctx *c, jv *s, const char *name) {
    bool any = false, ok = s->u.str.n > 0, cased = false;
    for (size_t i = 0; i < s->u.str.n; i++) {
        char ch = s->u.str.s[i];
        bool d = ch >= '0' && ch <= '9', al = is_alpha(ch);
        if (!strcmp(name, "isdigit")) ok = ok && d;
        else if (!strcmp(name, "isalpha")) ok = ok && al;
        else if (!strcmp(name, "isalnum")) ok = ok && (al || d);
        else if (!strcmp(name, "isspace")) ok = ok && strchr(" \t\n\r\f\v", ch);
        else if (!strcmp(name, "islower")) { if (ch >= 'A' && ch <= 'Z') ok = false; cased |= al; }
        else { if (ch >= 'a' && ch <= 'z') ok = false; cased |= al; }
        any = true;
    }
    if (!strcmp(name, "islower") || !strcmp(name, "isupper")) ok = ok && cased;
    return jv_bool(c, any && ok);
}

static jv *str_join(jctx *c, jv *sep, jv *items, int line) {
    jv *l = je_iter(c, items, line);
    if (!l) return NULL;
    jbuf b = {0};
    for (size_t i = 0; i < l->u.list.n; i++) {
        if (l->u.list.items[i]->kind != JV_STR) {
            jbuf_free(&b);
            return jfail(c, line, KT_ERR_FORMAT, "sequence item %zu: expected str instance, %s found",
                         i, jv_typename(l->u.list.items[i]));
        }
        if (i) jbuf_put(&b, sep->u.str.s, sep->u.str.n);
        jbuf_put(&b, l->u.list.items[i]->u.str.s, l->u.list.items[i]->u.str.n);
    }
    return jb_from_buf(c, &b);
}

static jv *str_method(jctx *c, jv *s, const char *name, const jargs *a, int line) {
    if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
        BIND(name, "affix");
        int r;
        if (!p[0]) return jfail(c, line, KT_ERR_FORMAT, "%s needs an argument", name);
        return has_affix(c, s, p[0], name[0] == 's', line, &r) ? jv_bool(c, r) : NULL;
    }
    if (strstr(name, "strip")) {
        BIND(name, "chars");
        return jb_strip(c, s, p[0], name[0] != 'r', name[0] != 'l', line);
    }
    if (!strcmp(name, "split")) {
        BIND(name, "sep", "maxsplit");
        if (p[1] && !jb_want_int(c, p[1], "split", line)) return NULL;
        return split(c, s, p[0], p[1] ? jb_ival(p[1]) : -1, line);
    }
    if (!strcmp(name, "upper")) return jb_map_case(c, s, 0);
    if (!strcmp(name, "lower")) return jb_map_case(c, s, 1);
    if (!strcmp(name, "capitalize")) return jb_map_case(c, s, 2);
    if (!strcmp(name, "title")) return jb_map_case(c, s, 3);
    if (!strcmp(name, "replace")) {
        BIND(name, "old", "new", "count");
        if (!jb_want_str(c, p[0], name, line) || !jb_want_str(c, p[1], name, line)) return NULL;
        if (p[2] && !jb_want_int(c, p[2], name, line)) return NULL;
        return jb_replace(c, s, p[0], p[1], p[2] ? jb_ival(p[2]) : -1);
    }
    if (!strcmp(name, "find") || !strcmp(name, "count")) {
        BIND(name, "sub");
        if (!jb_want_str(c, p[0], name, line)) return NULL;
        const char *hit = memmem(s->u.str.s, s->u.str.n, p[0]->u.str.s, p[0]->u.str.n);
        if (name[0] == 'f')
            return jv_int(c, hit ? (int64_t)ju_len(s->u.str.s, (size_t)(hit - s->u.str.s)) : -1);
        int64_t k = 0;
        if (!p[0]->u.str.n) return jv_int(c, (int64_t)ju_len(s->u.str.s, s->u.str.n) + 1);
        for (; hit; k++) {
            const char *from = hit + p[0]->u.str.n;
            hit = memmem(from, s->u.str.n - (size_t)(from - s->u.str.s), p[0]->u.str.s, p[0]->u.str.n);
        }
        return jv_int(c, k);
    }
    if (!strcmp(name, "join")) {
        BIND(name, "iterable");
        if (!p[0]) return jfail(c, line, KT_ERR_FORMAT, "join needs an argument");
        return str_join(c, s, p[0], line);
    }
    if (!strcmp(name, "splitlines")) {
        jv *out = jv_list(c);
        const char *q = s->u.str.s, *end = q + s->u.str.n;
        while (out && q < end) {
            const char *e = q;
            while (e < end && *e != '\n' && *e != '\r') e++;
            jv *part = jv_str(c, q, (size_t)(e - q));
            if (!part || !jv_list_push(c, out, part)) return NULL;
            q = e < end && *e == '\r' && e + 1 < end && e[1] == '\n' ? e + 2 : e + 1;
        }
        return out;
    }
    return str_pred(c, s, name);
}

jv *jb_call_method(jctx *c, jv *self, const char *name, const jargs *a, int line) {
    if (self->kind == JV_STR) return jb_keep_safe(str_method(c, self, name, a, line), self);
    if (!strcmp(name, "cycle")) { /* only loop objects carry it */
        jv *i = jv_dict_gets(self, "index0");
        if (!a->npos) return jfail(c, line, KT_ERR_FORMAT, "no items for cycling given");
        return a->pos[i ? (size_t)i->u.i % a->npos : 0];
    }
    if (!strcmp(name, "get")) {
        BIND("get", "key", "default");
        if (!p[0]) return jfail(c, line, KT_ERR_FORMAT, "get needs a key");
        jv *v = jv_dict_get(self, p[0]);
        return v ? v : p[1] ? p[1] : jv_none(c);
    }
    if (a->npos || a->nkw) return jfail(c, line, KT_ERR_FORMAT, "%s() takes no arguments", name);
    jv *l = jb_dict_view(c, self, !strcmp(name, "keys") ? 0 : !strcmp(name, "values") ? 1 : 2);
    if (l) l->u.list.view = !strcmp(name, "keys") ? 1 : !strcmp(name, "values") ? 2 : 3;
    return l;
}

/* ---- tests ----------------------------------------------------------- */

static const char *const test_names[] = {
    "defined", "undefined", "none", "string", "number", "integer", "float",
    "boolean", "mapping", "iterable", "sequence", "callable", "equalto", "eq",
    "==", "ne", "!=", "sameas", "true", "false", "odd", "even", "divisibleby",
    "in", "lower", "upper", "gt", "greaterthan", ">", "ge", ">=", "lt",
    "lessthan", "<", "le", "<=", "escaped", NULL};

bool jb_has_test(const char *name) { return jb_in_table(test_names, name); }

static int cmp_test(jctx *c, const char *name, jv *v, jv *o, int line) {
    if (!o) { jfail(c, line, KT_ERR_FORMAT, "test '%s' needs an argument", name); return -1; }
    if (!strcmp(name, "equalto") || !strcmp(name, "eq") || !strcmp(name, "=="))
        return jv_equal(v, o);
    if (!strcmp(name, "ne") || !strcmp(name, "!=")) return !jv_equal(v, o);
    if (!strcmp(name, "sameas"))
        return v->kind == o->kind && (v->kind == JV_NONE || v->kind == JV_UNDEF ||
               (v->kind == JV_BOOL ? v->u.b == o->u.b : v == o));
    if (!strcmp(name, "in")) {
        if (o->kind == JV_STR && v->kind == JV_STR)
            return memmem(o->u.str.s, o->u.str.n, v->u.str.s, v->u.str.n) != NULL || !v->u.str.n;
        if (o->kind == JV_DICT) return jv_dict_get(o, v) != NULL;
        jv *l = je_iter(c, o, line);
        if (!l) return -1;
        for (size_t i = 0; i < l->u.list.n; i++)
            if (jv_equal(v, l->u.list.items[i])) return 1;
        return 0;
    }
    int r;
    if (jv_is_num(v) && jv_is_num(o)) {
        r = (jv_num(v) > jv_num(o)) - (jv_num(v) < jv_num(o));
    } else if (v->kind == JV_STR && o->kind == JV_STR) {
        size_t n = v->u.str.n < o->u.str.n ? v->u.str.n : o->u.str.n;
        r = memcmp(v->u.str.s, o->u.str.s, n);
        r = r ? (r > 0) - (r < 0) : (v->u.str.n > o->u.str.n) - (v->u.str.n < o->u.str.n);
    } else {
        jfail(c, line, KT_ERR_FORMAT, "test '%s': cannot compare %s and %s", name,
              jv_typename(v), jv_typename(o));
        return -1;
    }
    if (!strcmp(name, "gt") || !strcmp(name, "greaterthan") || !strcmp(name, ">")) return r > 0;
    if (!strcmp(name, "ge") || !strcmp(name, ">=")) return r >= 0;
    if (!strcmp(name, "lt") || !strcmp(name, "lessthan") || !strcmp(name, "<")) return r < 0;
    return r <= 0;
}

int jb_test(jctx *c, const char *name, jv *v, const jargs *a, int line) {
    jv *o = a->npos ? a->pos[0] : a->nkw ? a->kwv[0] : NULL;
    jv_kind k = v->kind;
    if (!strcmp(name, "defined")) return k != JV_UNDEF;
    if (!strcmp(name, "undefined")) return k == JV_UNDEF;
    if (!strcmp(name, "none")) return k == JV_NONE;
    if (!strcmp(name, "string")) return k == JV_STR;
    if (!strcmp(name, "number")) return k == JV_INT || k == JV_FLOAT || k == JV_BOOL;
    if (!strcmp(name, "integer")) return k == JV_INT;
    if (!strcmp(name, "float")) return k == JV_FLOAT;
    if (!strcmp(name, "boolean")) return k == JV_BOOL;
    if (!strcmp(name, "mapping")) return k == JV_DICT;
    if (!strcmp(name, "iterable")) return k == JV_STR || k == JV_LIST || k == JV_DICT || k == JV_UNDEF;
    if (!strcmp(name, "sequence"))
        return k == JV_STR || (k == JV_LIST && !v->u.list.gen && !v->u.list.view) || k == JV_DICT || k == JV_UNDEF;
    if (!strcmp(name, "callable")) return k == JV_MACRO || k == JV_FUNC || k == JV_METHOD;
    if (!strcmp(name, "true")) return k == JV_BOOL && v->u.b;
    if (!strcmp(name, "false")) return k == JV_BOOL && !v->u.b;
    if (!strcmp(name, "escaped")) return 0;
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) { /* str(v).islower() */
        jv *s = jv_stringify(c, v), *r = s ? str_pred(c, s, name[0] == 'l' ? "islower" : "isupper") : NULL;
        return r ? r->u.b : -1;
    }
    if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
        /* value % 2 == 1, value % 2 == 0, value % num == 0 on numbers */
        jv *d = name[0] == 'd' ? o : NULL;
        if (!jv_is_num(v) || (name[0] == 'd' && (!d || !jv_is_num(d)))) {
            jfail(c, line, KT_ERR_FORMAT, "test '%s' needs numbers, got %s", name,
                  jv_typename(jv_is_num(v) && d ? d : v));
            return -1;
        }
        double x = jv_num(v), y = d ? jv_num(d) : 2;
        if (y == 0) {
            jfail(c, line, KT_ERR_FORMAT, "integer division or modulo by zero");
            return -1;
        }
        double m = fmod(x, y);
        if (m != 0 && ((m < 0) != (y < 0))) m += y;
        return name[0] == 'o' ? m == 1 : m == 0;
    }
    return cmp_test(c, name, v, o, line);
}

/* ---- globals --------------------------------------------------------- */

static const char *const global_names[] = {"range", "namespace", "dict",
                                           "raise_exception", "strftime_now", NULL};

jv *jb_global(jctx *c, const char *name) {
    for (int i = 0; global_names[i]; i++) {
        if (strcmp(global_names[i], name)) continue;
        jv *f = jv_new(c, JV_FUNC);
        if (f) f->u.func.id = i + 1;
        return f;
    }
    return NULL;
}

static jv *g_range(jctx *c, const jargs *a, int line) {
    int64_t v[3] = {0, 0, 1};
    if (a->nkw || a->npos < 1 || a->npos > 3)
        return jfail(c, line, KT_ERR_FORMAT, "range expects 1 to 3 integer arguments");
    for (size_t i = 0; i < a->npos; i++)
        if (!jb_want_int(c, a->pos[i], "range", line)) return NULL;
    if (a->npos == 1) v[1] = jb_ival(a->pos[0]);
    else for (size_t i = 0; i < a->npos; i++) v[i] = jb_ival(a->pos[i]);
    if (!v[2]) return jfail(c, line, KT_ERR_FORMAT, "range() arg 3 must not be zero");
    jv *l = jv_list(c);
    for (int64_t x = v[0]; l && (v[2] > 0 ? x < v[1] : x > v[1]); x += v[2]) {
        if (l->u.list.n >= MAX_RANGE) return jfail(c, line, KT_ERR_UNSUPPORTED, "range() too large (over %d items)", MAX_RANGE);
        jv *i = jv_int(c, x);
        if (!i || !jv_list_push(c, l, i)) return NULL;
        if ((v[2] > 0 && x > INT64_MAX - v[2]) || (v[2] < 0 && x < INT64_MIN - v[2])) break;
    }
    return l;
}

static jv *g_dict(jctx *c, const jargs *a, int line, jv_kind kind) {
    jv *d = jv_new(c, kind);
    if (!d) return NULL;
    if (a->npos > 1) return jfail(c, line, KT_ERR_FORMAT, "expected at most 1 positional argument");
    if (a->npos) {
        jv *src = a->pos[0];
        if (src->kind != JV_DICT && src->kind != JV_NS)
            return jfail(c, line, KT_ERR_FORMAT, "cannot build a mapping from %s", jv_typename(src));
        for (size_t i = 0; i < src->u.dict.n; i++)
            if (!jv_dict_set(c, d, src->u.dict.keys[i], src->u.dict.vals[i])) return NULL;
    }
    for (size_t i = 0; i < a->nkw; i++) {
        jv *k = jv_cstr(c, a->kwn[i]);
        if (!k || !jv_dict_set(c, d, k, a->kwv[i])) return NULL;
    }
    return d;
}

static jv *g_raise(jctx *c, const jargs *a, int line) {
    (void)line;
    jv *msg = a->npos ? jv_stringify(c, a->pos[0]) : jv_str(c, "", 0);
    if (!msg || c->failed) return NULL;
    c->failed = true;
    kt_error_set(c->err, KT_ERR_ARG, "%.*s", (int)(msg->u.str.n > 500 ? 500 : msg->u.str.n), msg->u.str.s);
    return NULL;
}

static jv *g_strftime(jctx *c, const jargs *a, int line) {
    if (a->npos != 1 || !jb_want_str(c, a->pos[0], "strftime_now", line))
        return c->failed ? NULL : jfail(c, line, KT_ERR_FORMAT, "strftime_now expects a format string");
    time_t t = c->now ? (time_t)c->now : time(NULL);
    struct tm tm;
    if (c->now) gmtime_r(&t, &tm);
    else localtime_r(&t, &tm);
    char fmt[256], out[512];
    size_t n = a->pos[0]->u.str.n < sizeof fmt - 1 ? a->pos[0]->u.str.n : sizeof fmt - 1;
    memcpy(fmt, a->pos[0]->u.str.s, n);
    fmt[n] = 0;
    size_t len = strftime(out, sizeof out, fmt, &tm);
    return jv_str(c, out, len);
}

jv *jb_call_func(jctx *c, int id, const jargs *a, int line) {
    switch (id) {
    case JF_RANGE: return g_range(c, a, line);
    case JF_NAMESPACE: return g_dict(c, a, line, JV_NS);
    case JF_DICT: return g_dict(c, a, line, JV_DICT);
    case JF_RAISE: return g_raise(c, a, line);
    case JF_STRFTIME: return g_strftime(c, a, line);
    default: return jfail(c, line, KT_ERR_INTERNAL, "unknown function");
    }
}
