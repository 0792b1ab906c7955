/*
 * jinja_filters.c - the filters of the Jinja interpreter (`x|name(args)`):
 * jinja2's built-in filters that chat templates use, transformers' tojson,
 * and Python's printf-style formatting (the `format` filter and `str % x`).
 * Each follows jinja2 on Python: map/select/reject/items give generators
 * (no len(), not JSON serializable), None or Undefined input to them gives
 * nothing, str() of Undefined is "".
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_int.h"

static char low(char ch) { return ch >= 'A' && ch <= 'Z' ? (char)(ch + 32) : ch; }
static bool is_alpha(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z'); }

static size_t last_char_len(const char *s, size_t n) {
    size_t i = n - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
    return n - i;
}

/* ---- filters: helpers ------------------------------------------------ */

/* `a.b.0` attribute paths as map/selectattr/sort take them */
static jv *attr_path(jctx *c, jv *v, jv *attr, int line) {
    if (!attr || attr->kind == JV_NONE) return v;
    if (attr->kind == JV_INT) return je_getitem(c, v, attr, line);
    if (!jb_want_str(c, attr, "attribute", line)) return NULL;
    const char *s = attr->u.str.s, *end = s + attr->u.str.n;
    while (v) {
        const char *dot = memchr(s, '.', (size_t)(end - s));
        const char *e = dot ? dot : end;
        jv *key;
        bool digits = e > s;
        for (const char *q = s; q < e; q++) digits = digits && *q >= '0' && *q <= '9';
        if (digits) key = jv_int(c, strtoll(s, NULL, 10));
        else key = jv_str(c, s, (size_t)(e - s));
        if (!key) return NULL;
        if (v->kind == JV_UNDEF) return v;
        v = je_getitem(c, v, key, line);
        if (!dot) break;
        s = dot + 1;
    }
    return v;
}

static jv *iter_or_fail(jctx *c, jv *v, int line) { return je_iter(c, v, line); }

static jv *gen_list(jctx *c) {
    jv *l = jv_list(c);
    if (l) l->u.list.gen = true;
    return l;
}

/* select/reject/selectattr/rejectattr */
static jv *f_select(jctx *c, jv *v, const jargs *a, int line, bool attr, bool keep) {
    if (!jv_truthy(v)) return gen_list(c); /* jinja2: `if value:` */
    jv *l = iter_or_fail(c, v, line), *out = gen_list(c);
    if (!l || !out) return NULL;
    size_t first = attr ? 1 : 0;
    if (attr && !a->npos) return jfail(c, line, KT_ERR_FORMAT, "selectattr/rejectattr need an attribute");
    const char *test = NULL;
    if (a->npos > first) {
        if (!jb_want_str(c, a->pos[first], "test name", line)) return NULL;
        test = ja_strndup(c->arena, a->pos[first]->u.str.s, a->pos[first]->u.str.n);
        if (!test) return jnomem(c);
        if (!jb_has_test(test)) return jfail(c, line, KT_ERR_FORMAT, "unknown test '%s'", test);
    }
    jargs targs = {.pos = a->pos + (a->npos > first ? first + 1 : a->npos), .npos = a->npos > first ? a->npos - first - 1 : 0};
    for (size_t i = 0; i < l->u.list.n; i++) {
        jv *item = l->u.list.items[i];
        jv *x = attr ? attr_path(c, item, a->pos[0], line) : item;
        if (!x) return NULL;
        int r = test ? jb_test(c, test, x, &targs, line) : jv_truthy(x);
        if (r < 0) return NULL;
        if ((r != 0) == keep && !jv_list_push(c, out, item)) return NULL;
    }
    return out;
}

static jv *f_map(jctx *c, jv *v, const jargs *a, int line) {
    if (!jv_truthy(v)) return gen_list(c); /* jinja2: `if value:` */
    jv *l = iter_or_fail(c, v, line), *out = gen_list(c);
    if (!l || !out) return NULL;
    jv *attr = NULL, *def = NULL;
    for (size_t k = 0; k < a->nkw; k++) {
        if (!strcmp(a->kwn[k], "attribute")) attr = a->kwv[k];
        else if (!strcmp(a->kwn[k], "default")) def = a->kwv[k];
        else return jfail(c, line, KT_ERR_FORMAT, "map got an unexpected keyword argument '%s'", a->kwn[k]);
    }
    const char *filter = NULL;
    if (!attr) {
        if (!a->npos || !jb_want_str(c, a->pos[0], "map filter name", line)) return a->npos ? NULL :
            jfail(c, line, KT_ERR_FORMAT, "map needs a filter name or attribute=");
        filter = ja_strndup(c->arena, a->pos[0]->u.str.s, a->pos[0]->u.str.n);
        if (!filter) return jnomem(c);
        if (!jb_has_filter(filter)) return jfail(c, line, KT_ERR_FORMAT, "unknown filter '%s'", filter);
    }
    jargs fargs = {.pos = a->pos + (a->npos ? 1 : 0), .npos = a->npos ? a->npos - 1 : 0};
    for (size_t i = 0; i < l->u.list.n; i++) {
        jv *x = filter ? jb_filter(c, filter, l->u.list.items[i], &fargs, line)
                       : attr_path(c, l->u.list.items[i], attr, line);
        if (!x) return NULL;
        if (def && x->kind == JV_UNDEF) x = def;
        if (!jv_list_push(c, out, x)) return NULL;
    }
    return out;
}

static int order(jctx *c, jv *x, jv *y, bool case_sensitive, int line) {
    if (!case_sensitive && x->kind == JV_STR && y->kind == JV_STR) {
        size_t n = x->u.str.n < y->u.str.n ? x->u.str.n : y->u.str.n;
        for (size_t i = 0; i < n; i++) {
            char a = low(x->u.str.s[i]), b = low(y->u.str.s[i]);
            if (a != b) return (unsigned char)a < (unsigned char)b ? -1 : 1;
        }
        return x->u.str.n < y->u.str.n ? -1 : x->u.str.n > y->u.str.n;
    }
    if (jv_is_num(x) && jv_is_num(y)) return jv_num(x) < jv_num(y) ? -1 : jv_num(x) > jv_num(y);
    if (x->kind == JV_STR && y->kind == JV_STR) {
        size_t n = x->u.str.n < y->u.str.n ? x->u.str.n : y->u.str.n;
        int r = memcmp(x->u.str.s, y->u.str.s, n);
        if (r) return r < 0 ? -1 : 1;
        return x->u.str.n < y->u.str.n ? -1 : x->u.str.n > y->u.str.n;
    }
    jfail(c, line, KT_ERR_FORMAT, "'<' not supported between instances of '%s' and '%s'",
          jv_typename(x), jv_typename(y));
    return 0;
}

static jv *f_sort(jctx *c, jv *v, const jargs *a, int line) {
    BIND("sort", "reverse", "case_sensitive", "attribute");
    jv *l = iter_or_fail(c, v, line), *out = jv_list(c);
    if (!l || !out) return NULL;
    bool rev = p[0] && jv_truthy(p[0]), cs = p[1] && jv_truthy(p[1]);
    jv **keys = ja_alloc(c->arena, (l->u.list.n + 1) * sizeof *keys);
    if (!keys) return jnomem(c);
    for (size_t i = 0; i < l->u.list.n; i++) {
        jv *item = l->u.list.items[i], *key = attr_path(c, item, p[2], line);
        if (!key) return NULL;
        size_t j = out->u.list.n;
        if (!jv_list_push(c, out, item)) return NULL;
        while (j > 0) { /* stable insertion sort */
            int r = order(c, keys[j - 1], key, cs, line);
            if (c->failed) return NULL;
            if (rev ? r >= 0 : r <= 0) break;
            out->u.list.items[j] = out->u.list.items[j - 1];
            keys[j] = keys[j - 1];
            j--;
        }
        out->u.list.items[j] = item;
        keys[j] = key;
    }
    return out;
}

static jv *f_unique(jctx *c, jv *v, const jargs *a, int line) {
    BIND("unique", "case_sensitive", "attribute");
    jv *l = iter_or_fail(c, v, line), *out = gen_list(c), *seen = jv_list(c);
    if (!l || !out || !seen) return NULL;
    for (size_t i = 0; i < l->u.list.n; i++) {
        jv *key = attr_path(c, l->u.list.items[i], p[1], line);
        if (!key) return NULL;
        if (key->kind == JV_STR && !(p[0] && jv_truthy(p[0])) && !(key = jb_map_case(c, key, 1))) return NULL;
        bool dup = false;
        for (size_t k = 0; k < seen->u.list.n && !dup; k++) dup = jv_equal(seen->u.list.items[k], key);
        if (dup) continue;
        if (!jv_list_push(c, seen, key) || !jv_list_push(c, out, l->u.list.items[i])) return NULL;
    }
    return out;
}

static jv *f_minmax(jctx *c, jv *v, const jargs *a, int line, bool max) {
    BIND(max ? "max" : "min", "case_sensitive", "attribute");
    jv *l = iter_or_fail(c, v, line), *best = NULL, *bkey = NULL;
    if (!l) return NULL;
    for (size_t i = 0; i < l->u.list.n; i++) {
        jv *key = attr_path(c, l->u.list.items[i], p[1], line);
        if (!key) return NULL;
        int r = bkey ? order(c, key, bkey, p[0] && jv_truthy(p[0]), line) : 0;
        if (c->failed) return NULL;
        if (!best || (max ? r > 0 : r < 0)) best = l->u.list.items[i], bkey = key;
    }
    return best ? best : jv_undef(c, "No aggregated item, sequence was empty.");
}

static jv *f_indent(jctx *c, jv *v, const jargs *a, int line) {
    BIND("indent", "width", "first", "blank");
    if (v->kind != JV_STR) /* jinja2 appends "\n" to its input as is */
        return jfail(c, line, KT_ERR_FORMAT, "unsupported operand type(s) for +=: '%s' and 'str'",
                     jv_typename(v));
    jv *s = v;
    jbuf ind = {0}, b = {0};
    if (p[0] && p[0]->kind == JV_STR) jbuf_put(&ind, p[0]->u.str.s, p[0]->u.str.n);
    else {
        if (p[0] && !jb_want_int(c, p[0], "indent width", line)) return NULL;
        for (int64_t i = 0; i < (p[0] ? jb_ival(p[0]) : 4) && i < 4096; i++) jbuf_putc(&ind, ' ');
    }
    bool first = p[1] && jv_truthy(p[1]), blank = p[2] && jv_truthy(p[2]);
    const char *q = s->u.str.s, *end = q + s->u.str.n;
    if (first) jbuf_put(&b, ind.p ? ind.p : "", ind.n);
    /* splitlines() of s + "\n": every line, the last one ends the text */
    for (bool start = true; q < end; start = false) {
        const char *e = q;
        while (e < end && *e != '\n' && *e != '\r' && *e != '\v' && *e != '\f') e++;
        if (!start) {
            jbuf_putc(&b, '\n');
            if (blank || e > q) jbuf_put(&b, ind.p ? ind.p : "", ind.n);
        }
        jbuf_put(&b, q, (size_t)(e - q));
        q = e < end && *e == '\r' && e + 1 < end && e[1] == '\n' ? e + 2 : e + 1;
    }
    jbuf_free(&ind);
    return jb_from_buf(c, &b);
}

static jv *f_join(jctx *c, jv *v, const jargs *a, int line) {
    BIND("join", "d", "attribute");
    jv *l = iter_or_fail(c, v, line);
    if (!l) return NULL;
    if (p[0] && !jb_want_str(c, p[0], "join separator", line)) return NULL;
    jbuf b = {0};
    for (size_t i = 0; i < l->u.list.n; i++) {
        jv *x = attr_path(c, l->u.list.items[i], p[1], line);
        if (!x) { jbuf_free(&b); return NULL; }
        if (i && p[0]) jbuf_put(&b, p[0]->u.str.s, p[0]->u.str.n);
        if (!jv_to_str(c, &b, x)) break;
    }
    return jb_from_buf(c, &b);
}

static bool sep_pair(jctx *c, const jv *v, jjson_opts *o, int line) {
    if (v->kind != JV_LIST || v->u.list.n != 2 || v->u.list.items[0]->kind != JV_STR ||
        v->u.list.items[1]->kind != JV_STR) {
        jfail(c, line, KT_ERR_FORMAT, "tojson: separators must be a pair of strings");
        return false;
    }
    const jv *a = v->u.list.items[0], *b = v->u.list.items[1];
    o->item_sep = ja_strndup(c->arena, a->u.str.s, a->u.str.n);
    o->key_sep = ja_strndup(c->arena, b->u.str.s, b->u.str.n);
    return (o->item_sep && o->key_sep) || (jnomem(c), false);
}

static jv *f_tojson(jctx *c, jv *v, const jargs *a, int line) {
    BIND("tojson", "ensure_ascii", "indent", "separators", "sort_keys");
    if (p[0] && jv_truthy(p[0]))
        return jfail(c, line, KT_ERR_UNSUPPORTED, "tojson: ensure_ascii=True is not supported");
    jjson_opts o = {.indent = -1, .item_sep = ", ", .key_sep = ": ",
                    .sort_keys = p[3] && jv_truthy(p[3])};
    if (p[1] && p[1]->kind != JV_NONE) {
        if (!jb_want_int(c, p[1], "tojson indent", line)) return NULL;
        o.indent = jb_ival(p[1]) < 0 ? 0 : jb_ival(p[1]) > 64 ? 64 : (int)jb_ival(p[1]);
        o.item_sep = ",";
    }
    if (p[2] && p[2]->kind != JV_NONE && !sep_pair(c, p[2], &o, line)) return NULL;
    jbuf b = {0};
    if (!jv_tojson(c, &b, v, &o, line)) { jbuf_free(&b); return NULL; }
    return jb_from_buf(c, &b);
}

static jv *f_length(jctx *c, jv *v, int line) {
    switch (v->kind) {
    case JV_STR: return jv_int(c, (int64_t)ju_len(v->u.str.s, v->u.str.n));
    case JV_LIST:
        if (!v->u.list.gen) return jv_int(c, (int64_t)v->u.list.n);
        break;
    case JV_DICT: return jv_int(c, (int64_t)v->u.dict.n);
    case JV_UNDEF: return jv_int(c, 0);
    default: break;
    }
    return jfail(c, line, KT_ERR_FORMAT, "object of type '%s' has no len()", jv_typename(v));
}

static jv *f_int(jctx *c, jv *v, const jargs *a, int line, bool is_float) {
    BIND(is_float ? "float" : "int", "default", "base");
    jv *def = p[0] ? p[0] : is_float ? jv_float(c, 0) : jv_int(c, 0);
    if (!def) return NULL;
    if (v->kind == JV_UNDEF) return je_undef_error(c, v, line); /* int(Undefined) */
    if (v->kind == JV_INT || v->kind == JV_BOOL)
        return is_float ? jv_float(c, (double)jb_ival(v)) : jv_int(c, jb_ival(v));
    if (v->kind == JV_FLOAT) {
        if (is_float) return v;
        if (!isfinite(v->u.f) || fabs(v->u.f) > 9.2e18) return def;
        return jv_int(c, (int64_t)v->u.f);
    }
    if (v->kind != JV_STR) return def;
    char buf[128];
    size_t n = v->u.str.n < sizeof buf - 1 ? v->u.str.n : sizeof buf - 1;
    memcpy(buf, v->u.str.s, n);
    buf[n] = 0;
    char *end;
    if (!is_float) {
        long long i = strtoll(buf, &end, p[1] ? (int)jb_ival(p[1]) : 10);
        while (*end == ' ' || *end == '\t' || *end == '\n') end++;
        if (end != buf && !*end) return jv_int(c, i);
    }
    double f = strtod(buf, &end);
    while (*end == ' ' || *end == '\t' || *end == '\n') end++;
    if (end == buf || *end) return def;
    if (is_float) return jv_float(c, f);
    if (!isfinite(f) || fabs(f) > 9.2e18) return def;
    return jv_int(c, (int64_t)f);
}

static jv *f_round(jctx *c, jv *v, const jargs *a, int line) {
    BIND("round", "precision", "method");
    if (!jv_is_num(v)) return jfail(c, line, KT_ERR_FORMAT, "round expects a number, got %s", jv_typename(v));
    int64_t prec = 0;
    if (p[0] && !jb_want_int(c, p[0], "round precision", line)) return NULL;
    if (p[0]) prec = jb_ival(p[0]);
    if (prec < 0 || prec > 30) return jfail(c, line, KT_ERR_UNSUPPORTED, "round: precision %lld is not supported", (long long)prec);
    double x = jv_num(v), m = pow(10, (double)prec);
    const char *method = "common";
    char mb[16] = "common";
    if (p[1]) {
        if (!jb_want_str(c, p[1], "round method", line)) return NULL;
        snprintf(mb, sizeof mb, "%.*s", (int)(p[1]->u.str.n < 15 ? p[1]->u.str.n : 15), p[1]->u.str.s);
        method = mb;
    }
    if (!strcmp(method, "common") && v->kind != JV_FLOAT) return jv_int(c, jb_ival(v)); /* round(int) */
    if (!strcmp(method, "floor")) return jv_float(c, floor(x * m) / m);
    if (!strcmp(method, "ceil")) return jv_float(c, ceil(x * m) / m);
    if (strcmp(method, "common")) return jfail(c, line, KT_ERR_FORMAT, "method must be common, ceil or floor");
    char buf[400];
    snprintf(buf, sizeof buf, "%.*f", (int)prec, x);
    return jv_float(c, strtod(buf, NULL));
}

static jv *f_first_last(jctx *c, jv *v, int line, bool last) {
    if (v->kind == JV_DICT && last) return jfail(c, line, KT_ERR_FORMAT, "'dict' object is not reversible");
    jv *l = iter_or_fail(c, v, line);
    if (!l) return NULL;
    if (!l->u.list.n) return jv_undef(c, last ? "No last item, sequence was empty." : "No first item, sequence was empty.");
    return l->u.list.items[last ? l->u.list.n - 1 : 0];
}

static jv *f_reverse(jctx *c, jv *v, int line) {
    if (v->kind == JV_STR) {
        jbuf b = {0};
        for (size_t n = v->u.str.n; n;) {
            size_t k = last_char_len(v->u.str.s, n);
            jbuf_put(&b, v->u.str.s + n - k, k);
            n -= k;
        }
        return jb_from_buf(c, &b);
    }
    jv *l = iter_or_fail(c, v, line), *out = gen_list(c);
    for (size_t i = l ? l->u.list.n : 0; out && i > 0; i--)
        if (!jv_list_push(c, out, l->u.list.items[i - 1])) return NULL;
    return l ? out : NULL;
}

static jv *f_escape(jctx *c, jv *v, bool force) {
    if (force && v->kind == JV_STR && v->u.str.safe) {
        jv *plain = jv_str(c, v->u.str.s, v->u.str.n);
        return plain ? jv_escape(c, plain) : NULL;
    }
    return jv_escape(c, v);
}

static jv *f_items(jctx *c, jv *v, int line) {
    if (v->kind == JV_UNDEF) return gen_list(c);
    if (v->kind != JV_DICT) return jfail(c, line, KT_ERR_FORMAT, "Can only get item pairs from a mapping.");
    jv *l = jb_dict_view(c, v, 2);
    if (l) l->u.list.gen = true;
    return l;
}

static jv *f_default(jctx *c, jv *v, const jargs *a, int line) {
    BIND("default", "default_value", "boolean");
    bool boolean = p[1] && jv_truthy(p[1]);
    if (v->kind == JV_UNDEF || (boolean && !jv_truthy(v))) return p[0] ? p[0] : jv_str(c, "", 0);
    return v;
}

static jv *f_sum(jctx *c, jv *v, const jargs *a, int line) {
    BIND("sum", "attribute", "start");
    jv *l = iter_or_fail(c, v, line), *acc = p[1] ? p[1] : jv_int(c, 0);
    if (!l || !acc) return NULL;
    for (size_t i = 0; i < l->u.list.n; i++) {
        jv *x = attr_path(c, l->u.list.items[i], p[0], line);
        if (!x) return NULL;
        if (!jv_is_num(x) || !jv_is_num(acc))
            return jfail(c, line, KT_ERR_FORMAT, "sum: unsupported operand types '%s' and '%s'", jv_typename(acc), jv_typename(x));
        if (acc->kind == JV_FLOAT || x->kind == JV_FLOAT) acc = jv_float(c, jv_num(acc) + jv_num(x));
        else acc = jv_int(c, jb_ival(acc) + jb_ival(x));
        if (!acc) return NULL;
    }
    return acc;
}

static jv *f_wordcount(jctx *c, jv *v) {
    jv *s = jv_stringify(c, v);
    if (!s) return NULL;
    int64_t n = 0;
    bool in = false;
    for (size_t i = 0; i < s->u.str.n; i++) {
        unsigned char ch = (unsigned char)s->u.str.s[i];
        bool w = is_alpha((char)ch) || (ch >= '0' && ch <= '9') || ch == '_' || ch >= 0x80;
        if (w && !in) n++;
        in = w;
    }
    return jv_int(c, n);
}


/* ---- printf-style formatting (Python's str % args) ------------------- */

static jv *fmt_arg(jctx *c, jv *args, size_t *next, const char *key, size_t klen, int line) {
    if (key) {
        jv *k = jv_str(c, key, klen), *v = k && args->kind == JV_DICT ? jv_dict_get(args, k) : NULL;
        return v ? v : k ? jfail(c, line, KT_ERR_FORMAT, "format: missing key '%.*s'", (int)klen, key) : NULL;
    }
    bool tuple = args->kind == JV_LIST && args->u.list.tuple;
    if (!tuple) {
        if ((*next)++ == 0) return args;
    } else if (*next < args->u.list.n) {
        return args->u.list.items[(*next)++];
    }
    return jfail(c, line, KT_ERR_FORMAT, "not enough arguments for format string");
}

static bool fmt_one(jctx *c, jbuf *b, const char *spec, char conv, jv *v, int line) {
    char f[48], out[512];
    if (conv == 's' || conv == 'r') {
        jbuf t = {0};
        bool ok = conv == 's' ? jv_to_str(c, &t, v) : jv_repr(c, &t, v);
        snprintf(f, sizeof f, "%%%ss", spec);
        if (ok) {
            int n = snprintf(NULL, 0, f, t.p ? t.p : "");
            char *tmp = n >= 0 ? malloc((size_t)n + 1) : NULL;
            if (tmp) {
                snprintf(tmp, (size_t)n + 1, f, t.p ? t.p : "");
                ok = jbuf_put(b, tmp, (size_t)n);
                free(tmp);
            } else ok = false;
        }
        jbuf_free(&t);
        if (!ok) jnomem(c);
        return ok;
    }
    if (!jv_is_num(v)) {
        jfail(c, line, KT_ERR_FORMAT, "%%%c format: a real number is required, not %s", conv, jv_typename(v));
        return false;
    }
    if (strchr("dixXoc", conv)) {
        long long i = v->kind == JV_FLOAT ? (long long)v->u.f : (long long)jb_ival(v);
        snprintf(f, sizeof f, "%%%sll%c", spec, conv == 'i' ? 'd' : conv);
        if (conv == 'c') snprintf(f, sizeof f, "%%%sc", spec);
        if (conv == 'c') snprintf(out, sizeof out, f, (int)i);
        else snprintf(out, sizeof out, f, i);
    } else {
        snprintf(f, sizeof f, "%%%s%c", spec, conv);
        snprintf(out, sizeof out, f, jv_num(v));
    }
    return jbuf_puts(b, out) || (jnomem(c), false);
}

static jv *py_format(jctx *c, jv *fmt, jv *args, int line) {
    jbuf b = {0};
    size_t next = 0;
    const char *p = fmt->u.str.s, *end = p + fmt->u.str.n;
    while (p < end) {
        const char *pct = memchr(p, '%', (size_t)(end - p));
        if (!pct) { jbuf_put(&b, p, (size_t)(end - p)); break; }
        jbuf_put(&b, p, (size_t)(pct - p));
        p = pct + 1;
        const char *key = NULL;
        size_t klen = 0;
        if (p < end && *p == '(') {
            const char *close = memchr(p, ')', (size_t)(end - p));
            if (!close) break;
            key = p + 1;
            klen = (size_t)(close - p - 1);
            p = close + 1;
        }
        char spec[24];
        size_t k = 0;
        while (p < end && strchr("-+ #0123456789.", *p) && k < sizeof spec - 1) spec[k++] = *p++;
        spec[k] = 0;
        if (p >= end) { jbuf_free(&b); return jfail(c, line, KT_ERR_FORMAT, "incomplete format"); }
        char conv = *p++;
        if (conv == '%') { jbuf_putc(&b, '%'); continue; }
        if (!strchr("srdixXofFeEgGc", conv)) {
            jbuf_free(&b);
            return jfail(c, line, KT_ERR_FORMAT, "unsupported format character '%c'", conv);
        }
        jv *v = fmt_arg(c, args, &next, key, klen, line);
        if (!v || !fmt_one(c, &b, spec, conv, v, line)) { jbuf_free(&b); return NULL; }
    }
    bool tuple = args->kind == JV_LIST && args->u.list.tuple;
    bool mapping = args->kind == JV_DICT;
    if (!c->failed && ((tuple && next < args->u.list.n) || (!tuple && !mapping && !next))) {
        jbuf_free(&b);
        return jfail(c, line, KT_ERR_FORMAT, "not all arguments converted during string formatting");
    }
    return jb_from_buf(c, &b);
}

jv *jb_format(jctx *c, jv *fmt, jv *args, int line) { return py_format(c, fmt, args, line); }

static jv *f_format(jctx *c, jv *v, const jargs *a, int line) {
    jv *s = jv_stringify(c, v), *args;
    if (!s) return NULL;
    if (a->nkw) {
        if (a->npos) return jfail(c, line, KT_ERR_FORMAT, "can't handle positional and keyword arguments at the same time");
        if (!(args = jv_dict(c))) return NULL;
        for (size_t i = 0; i < a->nkw; i++) {
            jv *k = jv_cstr(c, a->kwn[i]);
            if (!k || !jv_dict_set(c, args, k, a->kwv[i])) return NULL;
        }
    } else {
        if (!(args = jv_list(c))) return NULL;
        args->u.list.tuple = true;
        for (size_t i = 0; i < a->npos; i++)
            if (!jv_list_push(c, args, a->pos[i])) return NULL;
    }
    return py_format(c, s, args, line);
}

/* ---- filter dispatch ------------------------------------------------- */

static const char *const filter_names[] = {
    "trim", "tojson", "length", "count", "upper", "lower", "capitalize",
    "title", "items", "join", "replace", "default", "d", "first", "last",
    "list", "string", "int", "float", "abs", "round", "selectattr",
    "rejectattr", "select", "reject", "map", "unique", "sort", "reverse",
    "indent", "safe", "e", "escape", "forceescape", "wordcount", "min", "max",
    "sum", "attr", "dictsort", "batch", "format", NULL};

bool jb_has_filter(const char *name) { return jb_in_table(filter_names, name); }

static jv *filter_str(jctx *c, const char *name, jv *v, const jargs *a, int line) {
    jv *s = jv_stringify(c, v); /* str(Undefined) is "" */
    if (!s) return NULL;
    if (!strcmp(name, "trim")) {
        BIND("trim", "chars");
        return jb_strip(c, s, p[0], true, true, line);
    }
    if (!strcmp(name, "upper")) return jb_map_case(c, s, 0);
    if (!strcmp(name, "lower")) return jb_map_case(c, s, 1);
    if (!strcmp(name, "capitalize")) return jb_map_case(c, s, 2);
    if (!strcmp(name, "title")) return jb_map_case(c, s, 4);
    BIND("replace", "old", "new", "count");
    if (!jb_want_str(c, p[0], "replace", line)) return NULL;
    jv *nw = p[1] ? jv_stringify(c, p[1]) : NULL;
    if (!nw) return p[1] ? NULL : jfail(c, line, KT_ERR_FORMAT, "replace needs two arguments");
    if (p[2] && !jb_want_int(c, p[2], "replace count", line)) return NULL;
    return jb_replace(c, s, p[0], nw, p[2] ? jb_ival(p[2]) : -1);
}

static jv *f_dictsort(jctx *c, jv *v, const jargs *a, int line) {
    BIND("dictsort", "case_sensitive", "by", "reverse");
    if (v->kind != JV_DICT) return jfail(c, line, KT_ERR_FORMAT, "You can only sort by either \"key\" or \"value\"");
    jv *items = jb_dict_view(c, v, 2), *attr = jv_int(c, p[1] && p[1]->kind == JV_STR && p[1]->u.str.n == 5 ? 1 : 0);
    if (!items || !attr) return NULL;
    jv *args[3] = {p[2] ? p[2] : jv_bool(c, false), p[0] ? p[0] : jv_bool(c, false), attr};
    jargs sa = {.pos = args, .npos = 3};
    return f_sort(c, items, &sa, line);
}

static jv *f_batch(jctx *c, jv *v, const jargs *a, int line) {
    BIND("batch", "linecount", "fill_with");
    if (!jb_want_int(c, p[0], "batch", line) || jb_ival(p[0]) <= 0) return c->failed ? NULL : jfail(c, line, KT_ERR_FORMAT, "batch needs a positive count");
    jv *l = iter_or_fail(c, v, line), *out = gen_list(c), *cur = NULL;
    for (size_t i = 0; l && out && i < l->u.list.n; i++) {
        if (!cur || (int64_t)cur->u.list.n == jb_ival(p[0])) {
            if (!(cur = jv_list(c)) || !jv_list_push(c, out, cur)) return NULL;
        }
        if (!jv_list_push(c, cur, l->u.list.items[i])) return NULL;
    }
    while (p[1] && cur && (int64_t)cur->u.list.n < jb_ival(p[0]))
        if (!jv_list_push(c, cur, p[1])) return NULL;
    return l ? out : NULL;
}

jv *jb_filter(jctx *c, const char *name, jv *v, const jargs *a, int line) {
    if (!strcmp(name, "trim") || !strcmp(name, "upper") || !strcmp(name, "lower") ||
        !strcmp(name, "capitalize") || !strcmp(name, "title") || !strcmp(name, "replace"))
        return jb_keep_safe(filter_str(c, name, v, a, line), v);
    if (!strcmp(name, "tojson")) return f_tojson(c, v, a, line);
    if (!strcmp(name, "length") || !strcmp(name, "count")) return f_length(c, v, line);
    if (!strcmp(name, "items")) return f_items(c, v, line);
    if (!strcmp(name, "join")) return f_join(c, v, a, line);
    if (!strcmp(name, "default") || !strcmp(name, "d")) return f_default(c, v, a, line);
    if (!strcmp(name, "first") || !strcmp(name, "last")) return f_first_last(c, v, line, name[0] == 'l');
    if (!strcmp(name, "list")) {
        jv *l = iter_or_fail(c, v, line), *out = jv_list(c);
        for (size_t i = 0; l && out && i < l->u.list.n; i++)
            if (!jv_list_push(c, out, l->u.list.items[i])) return NULL;
        return l ? out : NULL;
    }
    if (!strcmp(name, "string")) return jv_stringify(c, v);
    if (!strcmp(name, "int") || !strcmp(name, "float")) return f_int(c, v, a, line, name[0] == 'f');
    if (!strcmp(name, "abs")) {
        if (!jv_is_num(v)) return jfail(c, line, KT_ERR_FORMAT, "bad operand type for abs(): '%s'", jv_typename(v));
        return v->kind == JV_FLOAT ? jv_float(c, fabs(v->u.f)) : jv_int(c, llabs(jb_ival(v)));
    }
    if (!strcmp(name, "round")) return f_round(c, v, a, line);
    if (!strcmp(name, "selectattr") || !strcmp(name, "rejectattr"))
        return f_select(c, v, a, line, true, name[0] == 's');
    if (!strcmp(name, "select") || !strcmp(name, "reject"))
        return f_select(c, v, a, line, false, name[2] == 'l');
    if (!strcmp(name, "map")) return f_map(c, v, a, line);
    if (!strcmp(name, "unique")) return f_unique(c, v, a, line);
    if (!strcmp(name, "sort")) return f_sort(c, v, a, line);
    if (!strcmp(name, "reverse")) return f_reverse(c, v, line);
    if (!strcmp(name, "indent")) return f_indent(c, v, a, line);
    if (!strcmp(name, "safe")) {
        jv *s = jv_stringify(c, v), *r = s ? jv_str(c, s->u.str.s, s->u.str.n) : NULL;
        if (r) r->u.str.safe = true;
        return r;
    }
    if (!strcmp(name, "e") || !strcmp(name, "escape") || !strcmp(name, "forceescape"))
        return f_escape(c, v, name[0] == 'f');
    if (!strcmp(name, "wordcount")) return f_wordcount(c, v);
    if (!strcmp(name, "min") || !strcmp(name, "max")) return f_minmax(c, v, a, line, name[1] == 'a');
    if (!strcmp(name, "sum")) return f_sum(c, v, a, line);
    if (!strcmp(name, "attr")) {
        BIND("attr", "name");
        if (!jb_want_str(c, p[0], "attr", line)) return NULL;
        const char *n = ja_strndup(c->arena, p[0]->u.str.s, p[0]->u.str.n);
        return n ? je_getattr(c, v, n, line) : jnomem(c);
    }
    if (!strcmp(name, "dictsort")) return f_dictsort(c, v, a, line);
    if (!strcmp(name, "batch")) return f_batch(c, v, a, line);
    if (!strcmp(name, "format")) return f_format(c, v, a, line);
    return jfail(c, line, KT_ERR_FORMAT, "unknown filter '%s'", name);
}
