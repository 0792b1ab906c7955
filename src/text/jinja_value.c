/*
 * jinja_value.c - the value type of the Jinja interpreter: the arena it
 * lives in, constructors, Python truthiness/equality, str()/repr(), and
 * json.dumps as transformers' `tojson` does it (ensure_ascii=False, no key
 * sorting, Python's separators and float formatting).
 *
 * Values follow Python semantics because chat templates are written
 * against jinja2 running on Python: `{{ none }}` prints "None", 1.0 prints
 * "1.0", True == 1.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja.h"
#include "text/jinja_int.h"

/* ---- arena ---------------------------------------------------------- */

#define JA_CHUNK 65536
#define JA_LIMIT ((size_t)1 << 30) /* a render never needs a GiB */

struct ja_chunk {
    ja_chunk *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
};

void *ja_alloc(ja_arena *a, size_t size) {
    size = (size + 15) & ~(size_t)15;
    const size_t limit = a->limit ? a->limit : JA_LIMIT;
    if (size > limit || a->used + size > limit) {
        a->over_limit = true;
        return NULL;
    }
    ja_chunk *h = a->head;
    if (!h || h->size - h->used < size) {
        size_t cap = size > JA_CHUNK ? size : JA_CHUNK;
        ja_chunk *n = malloc(sizeof *n + cap);
        if (!n) return NULL;
        n->size = cap;
        n->used = 0;
        if (h && size > JA_CHUNK) { /* keep filling the current chunk */
            n->next = h->next;
            h->next = n;
        } else {
            n->next = h;
            a->head = n;
        }
        h = n;
    }
    void *p = h->data + h->used;
    h->used += size;
    a->used += size;
    memset(p, 0, size);
    return p;
}

char *ja_strndup(ja_arena *a, const char *s, size_t n) {
    char *p = ja_alloc(a, n + 1);
    if (p && n) memcpy(p, s, n);
    return p;
}

void ja_free_all(ja_arena *a) {
    ja_chunk *c = a->head;
    while (c) {
        ja_chunk *n = c->next;
        free(c);
        c = n;
    }
    a->head = NULL;
    a->used = 0;
}

/* ---- jbuf ----------------------------------------------------------- */

bool jbuf_put(jbuf *b, const char *s, size_t n) {
    if (b->oom) return false;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        if (cap > JA_LIMIT) { b->oom = true; return false; }
        char *p = realloc(b->p, cap);
        if (!p) { b->oom = true; return false; }
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

bool jbuf_puts(jbuf *b, const char *s) { return jbuf_put(b, s, strlen(s)); }
bool jbuf_putc(jbuf *b, char c) { return jbuf_put(b, &c, 1); }

void jbuf_free(jbuf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* ---- errors --------------------------------------------------------- */

void *jfail(jctx *c, int line, kt_status st, const char *fmt, ...) {
    if (c->failed) return NULL;
    c->failed = true;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (line > 0)
        kt_error_set(c->err, st, "template line %d: %s", line, msg);
    else
        kt_error_set(c->err, st, "%s", msg);
    return NULL;
}

void *jnomem(jctx *c) {
    if (c->arena->over_limit)
        return jfail(c, 0, KT_ERR_FORMAT, "template: the render needs more than %zu MiB of memory (the limit)",
                     KT_JINJA_MAX_MEMORY >> 20);
    return jfail(c, 0, KT_ERR_NOMEM, "template: out of memory");
}

/* ---- constructors ---------------------------------------------------- */

jv *jv_new(jctx *c, jv_kind k) {
    jv *v = ja_alloc(c->arena, sizeof *v);
    if (!v) return jnomem(c);
    v->kind = k;
    return v;
}

jv *jv_str(jctx *c, const char *s, size_t n) {
    jv *v = jv_new(c, JV_STR);
    if (!v) return NULL;
    char *p = ja_strndup(c->arena, s, n);
    if (!p) return jnomem(c);
    v->u.str.s = p;
    v->u.str.n = n;
    return v;
}

jv *jv_cstr(jctx *c, const char *s) { return jv_str(c, s, strlen(s)); }

jv *jv_int(jctx *c, int64_t i) {
    jv *v = jv_new(c, JV_INT);
    if (v) v->u.i = i;
    return v;
}

jv *jv_float(jctx *c, double f) {
    jv *v = jv_new(c, JV_FLOAT);
    if (v) v->u.f = f;
    return v;
}

jv *jv_bool(jctx *c, bool b) {
    jv *v = jv_new(c, JV_BOOL);
    if (v) v->u.b = b;
    return v;
}

jv *jv_none(jctx *c) { return jv_new(c, JV_NONE); }

jv *jv_undef(jctx *c, const char *name) {
    jv *v = jv_new(c, JV_UNDEF);
    if (v) v->u.undef.name = name;
    return v;
}

jv *jv_list(jctx *c) { return jv_new(c, JV_LIST); }
jv *jv_dict(jctx *c) { return jv_new(c, JV_DICT); }

static bool grow(jctx *c, jv ***arr, size_t n, size_t *cap) {
    if (n < *cap) return true;
    size_t nc = *cap ? *cap * 2 : 8;
    jv **p = ja_alloc(c->arena, nc * sizeof *p);
    if (!p) { jnomem(c); return false; }
    if (n) memcpy(p, *arr, n * sizeof *p);
    *arr = p;
    *cap = nc;
    return true;
}

bool jv_list_push(jctx *c, jv *l, jv *item) {
    if (!grow(c, &l->u.list.items, l->u.list.n, &l->u.list.cap)) return false;
    l->u.list.items[l->u.list.n++] = item;
    return true;
}

static long dict_find(const jv *d, const jv *key) {
    for (size_t i = 0; i < d->u.dict.n; i++)
        if (jv_equal(d->u.dict.keys[i], key)) return (long)i;
    return -1;
}

bool jv_dict_set(jctx *c, jv *d, jv *key, jv *val) {
    long i = dict_find(d, key);
    if (i >= 0) {
        d->u.dict.vals[i] = val;
        return true;
    }
    size_t kcap = d->u.dict.cap, n = d->u.dict.n;
    if (!grow(c, &d->u.dict.keys, n, &kcap)) return false;
    if (!grow(c, &d->u.dict.vals, n, &d->u.dict.cap)) return false;
    d->u.dict.keys[n] = key;
    d->u.dict.vals[n] = val;
    d->u.dict.n++;
    return true;
}

jv *jv_dict_get(const jv *d, const jv *key) {
    long i = dict_find(d, key);
    return i < 0 ? NULL : d->u.dict.vals[i];
}

jv *jv_dict_gets(const jv *d, const char *key) {
    size_t n = strlen(key);
    for (size_t i = 0; i < d->u.dict.n; i++) {
        const jv *k = d->u.dict.keys[i];
        if (k->kind == JV_STR && k->u.str.n == n && !memcmp(k->u.str.s, key, n))
            return d->u.dict.vals[i];
    }
    return NULL;
}

/* ---- Python semantics ------------------------------------------------ */

bool jv_is_num(const jv *v) {
    return v->kind == JV_INT || v->kind == JV_FLOAT || v->kind == JV_BOOL;
}

double jv_num(const jv *v) {
    switch (v->kind) {
    case JV_INT: return (double)v->u.i;
    case JV_FLOAT: return v->u.f;
    case JV_BOOL: return v->u.b;
    default: return 0;
    }
}

bool jv_truthy(const jv *v) {
    switch (v->kind) {
    case JV_UNDEF: case JV_NONE: return false;
    case JV_BOOL: return v->u.b;
    case JV_INT: return v->u.i != 0;
    case JV_FLOAT: return v->u.f != 0;
    case JV_STR: return v->u.str.n != 0;
    case JV_LIST: return v->u.list.gen || v->u.list.n != 0;
    case JV_DICT: return v->u.dict.n != 0;
    default: return true;
    }
}

bool jv_equal(const jv *a, const jv *b) {
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a->kind != JV_FLOAT && b->kind != JV_FLOAT) {
            int64_t x = a->kind == JV_INT ? a->u.i : a->u.b;
            int64_t y = b->kind == JV_INT ? b->u.i : b->u.b;
            return x == y;
        }
        return jv_num(a) == jv_num(b);
    }
    if (a->kind != b->kind) return false;
    switch (a->kind) {
    case JV_UNDEF: case JV_NONE: return true;
    case JV_STR:
        return a->u.str.n == b->u.str.n &&
               !memcmp(a->u.str.s, b->u.str.s, a->u.str.n);
    case JV_LIST:
        if (a->u.list.gen || b->u.list.gen) return a == b;
        if (a->u.list.tuple != b->u.list.tuple || a->u.list.n != b->u.list.n)
            return false;
        for (size_t i = 0; i < a->u.list.n; i++)
            if (!jv_equal(a->u.list.items[i], b->u.list.items[i])) return false;
        return true;
    case JV_DICT:
        if (a->u.dict.n != b->u.dict.n) return false;
        for (size_t i = 0; i < a->u.dict.n; i++) {
            jv *o = jv_dict_get(b, a->u.dict.keys[i]);
            if (!o || !jv_equal(a->u.dict.vals[i], o)) return false;
        }
        return true;
    case JV_MACRO: return a->u.macro.node == b->u.macro.node;
    case JV_FUNC: return a->u.func.id == b->u.func.id;
    default: return a == b;
    }
}

const char *jv_typename(const jv *v) {
    switch (v->kind) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST:
        if (v->u.list.view)
            return v->u.list.view == 1 ? "dict_keys" : v->u.list.view == 2 ? "dict_values" : "dict_items";
        return v->u.list.gen ? "generator" : v->u.list.tuple ? "tuple" : "list";
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_MACRO: return "Macro";
    case JV_FUNC: return "function";
    case JV_METHOD: return "builtin_function_or_method";
    }
    return "?";
}

/* ---- UTF-8 ---------------------------------------------------------- */

static size_t u8_len(unsigned char c) {
    return c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
}

static uint32_t u8_decode(const char *s, size_t n, size_t *len) {
    const unsigned char *p = (const unsigned char *)s;
    size_t l = u8_len(p[0]);
    if (l > n) l = 1;
    *len = l;
    if (l == 1) return p[0];
    uint32_t cp = p[0] & (0xFF >> (l + 1));
    for (size_t i = 1; i < l; i++) cp = (cp << 6) | (p[i] & 0x3F);
    return cp;
}

size_t ju_len(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; k++) {
        size_t l;
        u8_decode(s + i, n - i, &l);
        i += l;
    }
    return k;
}

size_t ju_offset(const char *s, size_t n, size_t cp) {
    size_t i = 0;
    while (cp-- > 0 && i < n) {
        size_t l;
        u8_decode(s + i, n - i, &l);
        i += l;
    }
    return i;
}

static bool py_space_cp(uint32_t c) {
    return (c >= 9 && c <= 13) || (c >= 0x1C && c <= 0x20) || c == 0x85 ||
           c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

size_t ju_space(const char *s, size_t n) {
    if (!n) return 0;
    size_t l;
    uint32_t cp = u8_decode(s, n, &l);
    return py_space_cp(cp) ? l : 0;
}

size_t ju_space_back(const char *s, size_t n) {
    if (!n) return 0;
    size_t start = n - 1;
    while (start > 0 && n - start < 4 &&
           ((unsigned char)s[start] & 0xC0) == 0x80)
        start--;
    size_t l;
    uint32_t cp = u8_decode(s + start, n - start, &l);
    if (start + l != n) return 0;
    return py_space_cp(cp) ? l : 0;
}

/* ---- str() / repr() ------------------------------------------------- */

void jv_float_repr(double f, char out[40]) {
    if (isnan(f)) { strcpy(out, "nan"); return; }
    if (isinf(f)) { strcpy(out, f < 0 ? "-inf" : "inf"); return; }
    char tmp[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    /* tmp is "-d.ddde[+-]XX": split into sign, digits and exponent. */
    char digits[24];
    int nd = 0, neg = tmp[0] == '-';
    const char *p = tmp + neg;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    int exp = atoi(p + 1);
    char *o = out;
    if (neg) *o++ = '-';
    if (exp < -4 || exp >= 16) {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            memcpy(o, digits + 1, nd - 1);
            o += nd - 1;
        }
        sprintf(o, "e%c%02d", exp < 0 ? '-' : '+', abs(exp));
        return;
    }
    if (exp < 0) {
        o += sprintf(o, "0.");
        for (int i = 0; i < -exp - 1; i++) *o++ = '0';
        sprintf(o, "%s", digits);
        return;
    }
    for (int i = 0; i <= exp; i++) *o++ = i < nd ? digits[i] : '0';
    *o++ = '.';
    if (nd > exp + 1) {
        memcpy(o, digits + exp + 1, nd - exp - 1);
        o += nd - exp - 1;
    } else {
        *o++ = '0';
    }
    *o = 0;
}

static bool num_to_str(jbuf *b, const jv *v) {
    char tmp[40];
    if (v->kind == JV_INT) snprintf(tmp, sizeof tmp, "%lld", (long long)v->u.i);
    else if (v->kind == JV_BOOL) strcpy(tmp, v->u.b ? "True" : "False");
    else jv_float_repr(v->u.f, tmp);
    return jbuf_puts(b, tmp);
}

static bool str_repr(jbuf *b, const char *s, size_t n) {
    char q = memchr(s, '\'', n) && !memchr(s, '"', n) ? '"' : '\'';
    bool ok = jbuf_putc(b, q);
    for (size_t i = 0; i < n && ok; i++) {
        unsigned char ch = (unsigned char)s[i];
        char esc[8];
        if (ch == '\\' || ch == (unsigned char)q) {
            esc[0] = '\\'; esc[1] = (char)ch; esc[2] = 0;
        } else if (ch == '\n') strcpy(esc, "\\n");
        else if (ch == '\r') strcpy(esc, "\\r");
        else if (ch == '\t') strcpy(esc, "\\t");
        else if (ch < 0x20 || ch == 0x7F) snprintf(esc, sizeof esc, "\\x%02x", ch);
        else { ok = jbuf_putc(b, (char)ch); continue; }
        ok = jbuf_puts(b, esc);
    }
    return ok && jbuf_putc(b, q);
}

bool jv_repr(jctx *c, jbuf *b, const jv *v) {
    switch (v->kind) {
    case JV_STR: return str_repr(b, v->u.str.s, v->u.str.n);
    case JV_LIST: {
        if (v->u.list.gen) return jbuf_puts(b, "<generator object>");
        bool ok = true;
        if (v->u.list.view) ok = jbuf_puts(b, jv_typename(v)) && jbuf_putc(b, '(');
        ok = ok && jbuf_putc(b, v->u.list.tuple ? '(' : '[');
        for (size_t i = 0; i < v->u.list.n && ok; i++) {
            if (i) ok = jbuf_puts(b, ", ");
            ok = ok && jv_repr(c, b, v->u.list.items[i]);
        }
        if (ok && v->u.list.tuple && v->u.list.n == 1) ok = jbuf_putc(b, ',');
        ok = ok && jbuf_putc(b, v->u.list.tuple ? ')' : ']');
        return ok && (!v->u.list.view || jbuf_putc(b, ')'));
    }
    case JV_DICT: case JV_NS: {
        bool ok = jbuf_puts(b, v->kind == JV_NS ? "<Namespace {" : "{");
        for (size_t i = 0; i < v->u.dict.n && ok; i++) {
            if (i) ok = jbuf_puts(b, ", ");
            ok = ok && jv_repr(c, b, v->u.dict.keys[i]) && jbuf_puts(b, ": ") &&
                 jv_repr(c, b, v->u.dict.vals[i]);
        }
        return ok && jbuf_puts(b, v->kind == JV_NS ? "}>" : "}");
    }
    default: return jv_to_str(c, b, v);
    }
}

bool jv_to_str(jctx *c, jbuf *b, const jv *v) {
    switch (v->kind) {
    case JV_UNDEF: return true;
    case JV_NONE: return jbuf_puts(b, "None");
    case JV_BOOL: case JV_INT: case JV_FLOAT: return num_to_str(b, v);
    case JV_STR: return jbuf_put(b, v->u.str.s, v->u.str.n);
    case JV_LIST: case JV_DICT: case JV_NS: return jv_repr(c, b, v);
    case JV_MACRO: return jbuf_puts(b, "<Macro>");
    case JV_FUNC: return jbuf_puts(b, "<function>");
    case JV_METHOD: return jbuf_puts(b, "<built-in method>");
    }
    return true;
}

jv *jv_stringify(jctx *c, const jv *v) {
    if (v->kind == JV_STR) return (jv *)v;
    jbuf b = {0};
    if (!jv_to_str(c, &b, v) || !jbuf_put(&b, "", 0)) {
        jbuf_free(&b);
        return jnomem(c);
    }
    jv *r = jv_str(c, b.p, b.n);
    jbuf_free(&b);
    return r;
}

jv *jv_escape(jctx *c, const jv *v) {
    if (v->kind == JV_STR && v->u.str.safe) return (jv *)v;
    jv *s = jv_stringify(c, v);
    if (!s) return NULL;
    jbuf b = {0};
    for (size_t i = 0; i < s->u.str.n; i++) {
        char ch = s->u.str.s[i];
        const char *e = ch == '&' ? "&amp;" : ch == '<' ? "&lt;" : ch == '>' ? "&gt;"
                      : ch == '"' ? "&#34;" : ch == '\'' ? "&#39;" : NULL;
        if (e) jbuf_puts(&b, e);
        else jbuf_putc(&b, ch);
    }
    jv *r = b.oom ? jnomem(c) : jv_str(c, b.p ? b.p : "", b.n);
    jbuf_free(&b);
    if (r) r->u.str.safe = true;
    return r;
}

/* ---- tojson --------------------------------------------------------- */

static bool json_str(jbuf *b, const char *s, size_t n) {
    bool ok = jbuf_putc(b, '"');
    for (size_t i = 0; i < n && ok; i++) {
        unsigned char ch = (unsigned char)s[i];
        char esc[8] = {0};
        switch (ch) {
        case '"': strcpy(esc, "\\\""); break;
        case '\\': strcpy(esc, "\\\\"); break;
        case '\n': strcpy(esc, "\\n"); break;
        case '\r': strcpy(esc, "\\r"); break;
        case '\t': strcpy(esc, "\\t"); break;
        case '\b': strcpy(esc, "\\b"); break;
        case '\f': strcpy(esc, "\\f"); break;
        default:
            if (ch < 0x20) snprintf(esc, sizeof esc, "\\u%04x", ch);
        }
        ok = esc[0] ? jbuf_puts(b, esc) : jbuf_putc(b, (char)ch);
    }
    return ok && jbuf_putc(b, '"');
}

static bool json_nl(jbuf *b, int indent, int level) {
    if (!jbuf_putc(b, '\n')) return false;
    for (int i = 0; i < indent * level; i++)
        if (!jbuf_putc(b, ' ')) return false;
    return true;
}

static bool json_val(jctx *c, jbuf *b, const jv *v, const jjson_opts *o,
                     int level, int line);

static bool json_key(jctx *c, jbuf *b, const jv *k, int line) {
    if (k->kind == JV_STR) return json_str(b, k->u.str.s, k->u.str.n);
    if (!jv_is_num(k) && k->kind != JV_NONE) {
        jfail(c, line, KT_ERR_FORMAT, "tojson: keys must be str, int, float, "
              "bool or None, not %s", jv_typename(k));
        return false;
    }
    jbuf t = {0};
    bool ok = k->kind == JV_NONE ? jbuf_puts(&t, "null")
              : k->kind == JV_BOOL ? jbuf_puts(&t, k->u.b ? "true" : "false")
              : jv_to_str(c, &t, k);
    ok = ok && json_str(b, t.p, t.n);
    jbuf_free(&t);
    return ok;
}

static int key_cmp(const jv *a, const jv *b) {
    size_t n = a->u.str.n < b->u.str.n ? a->u.str.n : b->u.str.n;
    int r = memcmp(a->u.str.s, b->u.str.s, n);
    return r ? r : (a->u.str.n > b->u.str.n) - (a->u.str.n < b->u.str.n);
}

/* Item order: insertion order, or sorted by key for sort_keys. */
static size_t *json_order(jctx *c, const jv *v, const jjson_opts *o, int line) {
    size_t n = v->u.dict.n;
    size_t *idx = ja_alloc(c->arena, (n + 1) * sizeof *idx);
    if (!idx) return jnomem(c);
    for (size_t i = 0; i < n; i++) {
        size_t j = i;
        if (o->sort_keys && v->u.dict.keys[i]->kind != JV_STR)
            return jfail(c, line, KT_ERR_UNSUPPORTED, "tojson: sort_keys needs string keys");
        while (o->sort_keys && j > 0 &&
               key_cmp(v->u.dict.keys[idx[j - 1]], v->u.dict.keys[i]) > 0) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = i;
    }
    return idx;
}

static bool json_container(jctx *c, jbuf *b, const jv *v, const jjson_opts *o,
                           int level, int line) {
    bool list = v->kind == JV_LIST;
    size_t n = list ? v->u.list.n : v->u.dict.n;
    size_t *idx = list ? NULL : json_order(c, v, o, line);
    if ((!list && !idx) || !jbuf_putc(b, list ? '[' : '{')) return false;
    for (size_t i = 0; i < n; i++) {
        if (i && !jbuf_puts(b, o->item_sep)) return false;
        if (o->indent >= 0 && !json_nl(b, o->indent, level + 1)) return false;
        if (!list && (!json_key(c, b, v->u.dict.keys[idx[i]], line) ||
                      !jbuf_puts(b, o->key_sep)))
            return false;
        const jv *item = list ? v->u.list.items[i] : v->u.dict.vals[idx[i]];
        if (!json_val(c, b, item, o, level + 1, line)) return false;
    }
    if (n && o->indent >= 0 && !json_nl(b, o->indent, level)) return false;
    return jbuf_putc(b, list ? ']' : '}');
}

static bool json_val(jctx *c, jbuf *b, const jv *v, const jjson_opts *o,
                     int level, int line) {
    char tmp[40];
    if (level > 200) {
        jfail(c, line, KT_ERR_FORMAT, "tojson: value nested too deeply");
        return false;
    }
    switch (v->kind) {
    case JV_NONE: return jbuf_puts(b, "null");
    case JV_BOOL: return jbuf_puts(b, v->u.b ? "true" : "false");
    case JV_INT: return num_to_str(b, v);
    case JV_FLOAT:
        if (isnan(v->u.f)) return jbuf_puts(b, "NaN");
        if (isinf(v->u.f)) return jbuf_puts(b, v->u.f < 0 ? "-Infinity" : "Infinity");
        jv_float_repr(v->u.f, tmp);
        return jbuf_puts(b, tmp);
    case JV_STR: return json_str(b, v->u.str.s, v->u.str.n);
    case JV_LIST:
        /* jinja2 refuses a generator (map(...) | tojson) as Python's json
         * does; templates written for llama.cpp's engine rely on it being
         * the list it yields, and refusing helps nobody: it is that list */
        if (v->u.list.view) break;
        return json_container(c, b, v, o, level, line);
    case JV_DICT: return json_container(c, b, v, o, level, line);
    default: break;
    }
    if (!c->failed)
        jfail(c, line, KT_ERR_FORMAT, "tojson: Object of type %s is not JSON "
              "serializable", jv_typename(v));
    return false;
}

bool jv_tojson(jctx *c, jbuf *b, const jv *v, const jjson_opts *o, int line) {
    if (!json_val(c, b, v, o, 0, line)) {
        if (!c->failed) jnomem(c);
        return false;
    }
    return true;
}
