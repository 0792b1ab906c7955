/*
 * jinja_eval.c - the Jinja evaluator: runs the AST against variables.
 *
 * Scoping follows jinja2: `{% set %}` inside a for loop or macro stays
 * there (hence namespace() for state across iterations), `if` opens no
 * scope, macros see the scope they were defined in. Undefined values
 * behave like jinja2's default Undefined: they print as "", are false and
 * iterate as empty, but using them in arithmetic or taking an attribute of
 * them is an error. Everything else follows Python, which jinja2 runs on.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "text/jinja.h"
#include "text/jinja_int.h"

#define MAX_CALL_DEPTH 100
#define LOOP_STEPS 16 /* steps one for-loop iteration counts (KT_JINJA_MAX_STEPS) */
#define MAX_NEST 800 /* evaluator recursion, keeps the C stack bounded */

struct jframe {
    jframe *parent;
    jv *vars; /* JV_DICT */
};

typedef enum { X_OK, X_ERR, X_BREAK, X_CONTINUE } xres;

static jv *eval(jctx *c, jframe *f, const jnode *n);
static xres exec_body(jctx *c, jframe *f, const jlist *body, jbuf *out);

/* ---- frames ---------------------------------------------------------- */

static jframe *frame_new(jctx *c, jframe *parent) {
    jframe *f = ja_alloc(c->arena, sizeof *f);
    if (!f) return jnomem(c);
    f->parent = parent;
    if (!(f->vars = jv_dict(c))) return NULL;
    return f;
}

static bool frame_set(jctx *c, jframe *f, const char *name, jv *v) {
    jv *k = jv_cstr(c, name);
    return k && jv_dict_set(c, f->vars, k, v);
}

static jv *undef_named(jctx *c, const char *name);

static jv *lookup(jctx *c, jframe *f, const char *name) {
    for (; f; f = f->parent) {
        jv *v = jv_dict_gets(f->vars, name);
        if (v) return v;
    }
    jv *g = jb_global(c, name);
    if (g || c->failed) return g;
    return undef_named(c, name);
}

static jv *undef_named(jctx *c, const char *name) {
    char *msg = ja_alloc(c->arena, strlen(name) + 20);
    if (!msg) return jnomem(c);
    sprintf(msg, "'%s' is undefined", name);
    return jv_undef(c, msg);
}

void *je_undef_error(jctx *c, const jv *v, int line) {
    return jfail(c, line, KT_ERR_FORMAT, "%s",
                 v->u.undef.name ? v->u.undef.name : "undefined value");
}

/* ---- attribute and item access -------------------------------------- */

static jv *missing(jctx *c, const jv *obj, const char *what, const char *key) {
    char *msg = ja_alloc(c->arena, strlen(key) + 64);
    if (!msg) return jnomem(c);
    sprintf(msg, "'%s object' has no %s '%.400s'", jv_typename(obj), what, key);
    return jv_undef(c, msg);
}

static jv *method(jctx *c, jv *obj, const char *name) {
    jv *m = jv_new(c, JV_METHOD);
    if (!m) return NULL;
    m->u.method.self = obj;
    m->u.method.name = name;
    return m;
}

jv *je_getattr(jctx *c, jv *obj, const char *name, int line) {
    if (obj->kind == JV_UNDEF) return je_undef_error(c, obj, line);
    if (jb_is_method(obj, name)) return method(c, obj, name);
    if (obj->kind == JV_DICT || obj->kind == JV_NS) {
        jv *v = jv_dict_gets(obj, name);
        if (v) return v;
    }
    return missing(c, obj, "attribute", name);
}

/* Python's index normalization; false when out of range. */
static bool norm_index(int64_t *i, size_t n) {
    if (*i < 0) *i += (int64_t)n;
    return *i >= 0 && *i < (int64_t)n;
}

jv *je_getitem(jctx *c, jv *obj, jv *key, int line) {
    if (obj->kind == JV_UNDEF) return je_undef_error(c, obj, line);
    if (obj->kind == JV_DICT || obj->kind == JV_NS) {
        jv *v = jv_dict_get(obj, key);
        if (v) return v;
    } else if ((obj->kind == JV_LIST && !obj->u.list.gen && !obj->u.list.view) || obj->kind == JV_STR) {
        if (key->kind == JV_INT || key->kind == JV_BOOL) {
            int64_t i = key->kind == JV_INT ? key->u.i : key->u.b;
            if (obj->kind == JV_LIST) {
                if (norm_index(&i, obj->u.list.n)) return obj->u.list.items[i];
            } else {
                size_t n = ju_len(obj->u.str.s, obj->u.str.n);
                if (norm_index(&i, n)) {
                    size_t a = ju_offset(obj->u.str.s, obj->u.str.n, (size_t)i);
                    size_t b = ju_offset(obj->u.str.s, obj->u.str.n, (size_t)i + 1);
                    return jv_str(c, obj->u.str.s + a, b - a);
                }
            }
            return jv_undef(c, "index out of range");
        }
    }
    if (key->kind == JV_STR) {
        char *name = ja_strndup(c->arena, key->u.str.s, key->u.str.n);
        if (!name) return jnomem(c);
        if (jb_is_method(obj, name)) return method(c, obj, name);
        return missing(c, obj, "element", name);
    }
    return jv_undef(c, "no such element");
}

/* Python slice index adjustment (PySlice_AdjustIndices). */
static int64_t slice_bound(const jv *v, int64_t def, int64_t n, int64_t step) {
    if (!v || v->kind == JV_NONE) return def;
    int64_t i = v->kind == JV_BOOL ? v->u.b : v->u.i;
    if (i < 0) {
        i += n;
        if (i < 0) i = step < 0 ? -1 : 0;
    } else if (i >= n) {
        i = step < 0 ? n - 1 : n;
    }
    return i;
}

static bool slice_arg_ok(const jv *v) {
    return !v || v->kind == JV_NONE || v->kind == JV_INT || v->kind == JV_BOOL;
}

static jv *do_slice(jctx *c, jv *obj, jv *lo, jv *hi, jv *st, int line) {
    if (obj->kind == JV_UNDEF) return je_undef_error(c, obj, line);
    if (!slice_arg_ok(lo) || !slice_arg_ok(hi) || !slice_arg_ok(st))
        return jfail(c, line, KT_ERR_FORMAT, "slice indices must be integers or None");
    bool is_str = obj->kind == JV_STR;
    if (!is_str && (obj->kind != JV_LIST || obj->u.list.gen || obj->u.list.view))
        return jfail(c, line, KT_ERR_FORMAT, obj->kind == JV_DICT ? "unhashable type: 'slice'"
                     : "'%s' object is not subscriptable", jv_typename(obj));
    int64_t step = st && st->kind != JV_NONE ? (st->kind == JV_BOOL ? st->u.b : st->u.i) : 1;
    if (step == 0) return jfail(c, line, KT_ERR_FORMAT, "slice step cannot be zero");
    int64_t n = is_str ? (int64_t)ju_len(obj->u.str.s, obj->u.str.n) : (int64_t)obj->u.list.n;
    int64_t a = slice_bound(lo, step < 0 ? n - 1 : 0, n, step);
    int64_t b = slice_bound(hi, step < 0 ? -1 : n, n, step);
    jbuf sb = {0};
    jv *out = is_str ? NULL : jv_list(c);
    if (!is_str && !out) return NULL;
    if (!is_str) out->u.list.tuple = obj->u.list.tuple;
    for (int64_t i = a; step > 0 ? i < b : i > b; i += step) {
        if (is_str) {
            size_t x = ju_offset(obj->u.str.s, obj->u.str.n, (size_t)i);
            size_t y = ju_offset(obj->u.str.s, obj->u.str.n, (size_t)i + 1);
            if (!jbuf_put(&sb, obj->u.str.s + x, y - x)) break;
        } else if (!jv_list_push(c, out, obj->u.list.items[i])) return NULL;
    }
    if (!is_str) return out;
    if (sb.oom) { jbuf_free(&sb); return jnomem(c); }
    jv *r = jv_str(c, sb.p ? sb.p : "", sb.n);
    jbuf_free(&sb);
    return r;
}

/* ---- operators ------------------------------------------------------- */

static jv *type_error(jctx *c, int line, const char *op, const jv *a, const jv *b) {
    return jfail(c, line, KT_ERR_FORMAT, "unsupported operand type(s) for %s: "
                 "'%s' and '%s'", op, jv_typename(a), jv_typename(b));
}

static bool steps(jctx *c, int line, unsigned n);

static jv *concat(jctx *c, const jv *a, const jv *b) {
    if (a->kind == JV_STR && a->u.str.n + b->u.str.n > KT_JINJA_MAX_STRING)
        return jfail(c, 0, KT_ERR_FORMAT, "template: a string over %zu MiB (the limit)", KT_JINJA_MAX_STRING >> 20);
    jv *r = jv_new(c, a->kind);
    if (!r) return NULL;
    if (a->kind == JV_STR) {
        char *p = ja_alloc(c->arena, a->u.str.n + b->u.str.n + 1);
        if (!p) return jnomem(c);
        memcpy(p, a->u.str.s, a->u.str.n);
        memcpy(p + a->u.str.n, b->u.str.s, b->u.str.n);
        r->u.str.s = p;
        r->u.str.n = a->u.str.n + b->u.str.n;
        return r;
    }
    r->u.list.tuple = a->u.list.tuple;
    for (size_t i = 0; i < a->u.list.n; i++)
        if (!jv_list_push(c, r, a->u.list.items[i])) return NULL;
    for (size_t i = 0; i < b->u.list.n; i++)
        if (!jv_list_push(c, r, b->u.list.items[i])) return NULL;
    return r;
}

static jv *repeat(jctx *c, const jv *seq, int64_t times, int line) {
    size_t unit = seq->kind == JV_STR ? seq->u.str.n : seq->u.list.n;
    if (times < 0) times = 0;
    if (unit && (uint64_t)times > KT_JINJA_MAX_STRING / unit)
        return jfail(c, line, KT_ERR_FORMAT, "repetition result over %zu MiB (the limit)", KT_JINJA_MAX_STRING >> 20);
    if (seq->kind == JV_STR) {
        /* built in one piece: concatenating `times` times would be quadratic */
        size_t n = unit * (size_t)times;
        jv *r = jv_new(c, JV_STR);
        char *s = r ? ja_alloc(c->arena, n + 1) : NULL; /* zeroed: NUL-terminated */
        if (!s) return jnomem(c);
        for (size_t k = 0; k < (size_t)times; k++) memcpy(s + k * unit, seq->u.str.s, unit);
        r->u.str.s = s, r->u.str.n = n, r->u.str.safe = seq->u.str.safe;
        return r;
    }
    jv *r = jv_list(c);
    for (int64_t k = 0; r && k < times; k++)
        for (size_t i = 0; i < unit; i++)
            if (!jv_list_push(c, r, seq->u.list.items[i])) return NULL;
    return r;
}

static double py_fmod(double a, double b) {
    double m = fmod(a, b);
    if (m != 0 && ((m < 0) != (b < 0))) m += b;
    return m;
}

static int64_t as_int(const jv *v) { return v->kind == JV_INT ? v->u.i : v->u.b; }

static jv *int_arith(jctx *c, const char *op, int64_t x, int64_t y, int line) {
    int64_t r;
    bool ovf = false;
    switch (op[0]) {
    case '+': ovf = __builtin_add_overflow(x, y, &r); break;
    case '-': ovf = __builtin_sub_overflow(x, y, &r); break;
    case '*':
        if (op[1] == '*') {
            if (y < 0) return jv_float(c, pow((double)x, (double)y));
            r = 1;
            for (int64_t k = 0; k < y && !ovf; k++) ovf = __builtin_mul_overflow(r, x, &r);
            break;
        }
        ovf = __builtin_mul_overflow(x, y, &r);
        break;
    default: /* // and % */
        if (y == 0) return jfail(c, line, KT_ERR_FORMAT, "integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) { ovf = true; break; }
        r = op[0] == '%' ? x % y : x / y;
        if (op[0] == '%') { if (r && ((r < 0) != (y < 0))) r += y; }
        else if ((x % y) && ((x < 0) != (y < 0))) r--;
    }
    if (ovf) return jfail(c, line, KT_ERR_FORMAT, "integer overflow in '%s'", op);
    return jv_int(c, r);
}

static jv *arith(jctx *c, const char *op, jv *a, jv *b, int line) {
    if (a->kind == JV_UNDEF) return je_undef_error(c, a, line);
    if (b->kind == JV_UNDEF) return je_undef_error(c, b, line);
    if (jv_is_num(a) && jv_is_num(b)) {
        if (!strcmp(op, "/")) {
            if (jv_num(b) == 0) return jfail(c, line, KT_ERR_FORMAT, "division by zero");
            return jv_float(c, jv_num(a) / jv_num(b));
        }
        if (a->kind != JV_FLOAT && b->kind != JV_FLOAT)
            return int_arith(c, op, as_int(a), as_int(b), line);
        double x = jv_num(a), y = jv_num(b);
        switch (op[0]) {
        case '+': return jv_float(c, x + y);
        case '-': return jv_float(c, x - y);
        case '*': return jv_float(c, op[1] ? pow(x, y) : x * y);
        default:
            if (y == 0) return jfail(c, line, KT_ERR_FORMAT, "float division by zero");
            return jv_float(c, op[0] == '%' ? py_fmod(x, y) : floor(x / y));
        }
    }
    bool seq_a = a->kind == JV_STR || (a->kind == JV_LIST && !a->u.list.gen && !a->u.list.view);
    bool seq_b = b->kind == JV_STR || (b->kind == JV_LIST && !b->u.list.gen && !b->u.list.view);
    bool markup = (a->kind == JV_STR && a->u.str.safe) || (b->kind == JV_STR && b->u.str.safe);
    if (!strcmp(op, "+") && markup && a->kind == JV_STR && b->kind == JV_STR) {
        jv *x = jv_escape(c, a), *y = x ? jv_escape(c, b) : NULL, *r = y ? concat(c, x, y) : NULL;
        if (r) r->u.str.safe = true;
        return r;
    }
    if (!strcmp(op, "+") && seq_a && seq_b && a->kind == b->kind &&
        (a->kind == JV_STR || a->u.list.tuple == b->u.list.tuple))
        return concat(c, a, b);
    if (!strcmp(op, "*") && seq_a && (b->kind == JV_INT || b->kind == JV_BOOL))
        return repeat(c, a, as_int(b), line);
    if (!strcmp(op, "*") && seq_b && (a->kind == JV_INT || a->kind == JV_BOOL))
        return repeat(c, b, as_int(a), line);
    if (!strcmp(op, "%") && a->kind == JV_STR) return jb_format(c, a, b, line);
    if (!strcmp(op, "+") && a->kind == JV_STR)
        return jfail(c, line, KT_ERR_FORMAT, "can only concatenate str (not \"%s\") to str",
                     jv_typename(b));
    return type_error(c, line, op, a, b);
}

static int compare_order(jctx *c, const jv *a, const jv *b, const char *op, int line, bool *ok) {
    *ok = true;
    if (jv_is_num(a) && jv_is_num(b)) {
        double x = jv_num(a), y = jv_num(b);
        return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a->kind == JV_STR && b->kind == JV_STR) {
        size_t n = a->u.str.n < b->u.str.n ? a->u.str.n : b->u.str.n;
        int r = memcmp(a->u.str.s, b->u.str.s, n);
        if (r) return r < 0 ? -1 : 1;
        return a->u.str.n < b->u.str.n ? -1 : a->u.str.n > b->u.str.n;
    }
    if (a->kind == JV_LIST && b->kind == JV_LIST && !a->u.list.gen && !b->u.list.gen) {
        for (size_t i = 0; i < a->u.list.n && i < b->u.list.n; i++) {
            if (jv_equal(a->u.list.items[i], b->u.list.items[i])) continue;
            return compare_order(c, a->u.list.items[i], b->u.list.items[i], op, line, ok);
        }
        return a->u.list.n < b->u.list.n ? -1 : a->u.list.n > b->u.list.n;
    }
    *ok = false;
    jfail(c, line, KT_ERR_FORMAT, "'%s' not supported between instances of "
          "'%s' and '%s'", op, jv_typename(a), jv_typename(b));
    return 0;
}

/* `a in b`: -1 on error */
static int contains(jctx *c, jv *a, jv *b, int line) {
    switch (b->kind) {
    case JV_STR:
        if (a->kind == JV_UNDEF) return je_undef_error(c, a, line), -1;
        if (a->kind != JV_STR) {
            jfail(c, line, KT_ERR_FORMAT, "'in <string>' requires string as left operand, not %s", jv_typename(a));
            return -1;
        }
        if (!a->u.str.n) return 1;
        return memmem(b->u.str.s, b->u.str.n, a->u.str.s, a->u.str.n) != NULL;
    case JV_LIST:
        for (size_t i = 0; i < b->u.list.n; i++)
            if (jv_equal(a, b->u.list.items[i])) return 1;
        return 0;
    case JV_DICT: case JV_NS: return jv_dict_get(b, a) != NULL;
    case JV_UNDEF: return 0;
    default:
        jfail(c, line, KT_ERR_FORMAT, "argument of type '%s' is not iterable", jv_typename(b));
        return -1;
    }
}

static jv *compare(jctx *c, const char *op, jv *a, jv *b, int line) {
    if (!strcmp(op, "==")) return jv_bool(c, jv_equal(a, b));
    if (!strcmp(op, "!=")) return jv_bool(c, !jv_equal(a, b));
    if (!strcmp(op, "in") || !strcmp(op, "notin")) {
        int r = contains(c, a, b, line);
        if (r < 0) return NULL;
        return jv_bool(c, op[0] == 'n' ? !r : r);
    }
    if (a->kind == JV_UNDEF) return je_undef_error(c, a, line);
    if (b->kind == JV_UNDEF) return je_undef_error(c, b, line);
    bool ok;
    int r = compare_order(c, a, b, op, line, &ok);
    if (!ok) return NULL;
    bool v = !strcmp(op, "<") ? r < 0 : !strcmp(op, "<=") ? r <= 0
           : !strcmp(op, ">") ? r > 0 : r >= 0;
    return jv_bool(c, v);
}

/* ---- calls ----------------------------------------------------------- */

static bool eval_args(jctx *c, jframe *f, const jnode *n, jargs *a) {
    a->npos = n->args.n;
    a->nkw = n->kwvals.n;
    a->pos = ja_alloc(c->arena, (a->npos + 1) * sizeof *a->pos);
    a->kwv = ja_alloc(c->arena, (a->nkw + 1) * sizeof *a->kwv);
    a->kwn = n->kwnames;
    if (!a->pos || !a->kwv) return jnomem(c), false;
    for (size_t i = 0; i < n->args.n; i++)
        if (!(a->pos[i] = eval(c, f, n->args.v[i]))) return false;
    for (size_t i = 0; i < n->kwvals.n; i++)
        if (!(a->kwv[i] = eval(c, f, n->kwvals.v[i]))) return false;
    return true;
}

static jv *call_macro(jctx *c, jv *m, const jargs *a, int line) {
    const jnode *def = m->u.macro.node;
    if (a->npos > def->nnames)
        return jfail(c, line, KT_ERR_FORMAT, "macro '%s' takes not more than %zu argument(s)",
                     def->name, def->nnames);
    if (c->depth >= MAX_CALL_DEPTH)
        return jfail(c, line, KT_ERR_FORMAT, "macro '%s': calls nested too deeply", def->name);
    jframe *f = frame_new(c, m->u.macro.frame);
    if (!f) return NULL;
    for (size_t i = 0; i < a->nkw; i++) {
        size_t k = 0;
        while (k < def->nnames && strcmp(def->names[k], a->kwn[i])) k++;
        if (k == def->nnames || k < a->npos)
            return jfail(c, line, KT_ERR_FORMAT, "macro '%s' got an unexpected keyword argument '%s'",
                         def->name, a->kwn[i]);
        if (!frame_set(c, f, a->kwn[i], a->kwv[i])) return NULL;
    }
    for (size_t i = 0; i < def->nnames; i++) {
        jv *v = i < a->npos ? a->pos[i] : jv_dict_gets(f->vars, def->names[i]);
        if (!v && def->kwvals.v[i]) v = eval(c, f, def->kwvals.v[i]);
        else if (!v) v = undef_named(c, def->names[i]);
        if (!v || !frame_set(c, f, def->names[i], v)) return NULL;
    }
    jbuf out = {0};
    c->depth++;
    xres r = exec_body(c, f, &def->args, &out);
    c->depth--;
    jv *res = NULL;
    if (r != X_ERR) {
        if (out.oom) jnomem(c);
        else res = jv_str(c, out.p ? out.p : "", out.n);
    }
    jbuf_free(&out);
    return res;
}

jv *je_call(jctx *c, jv *fn, const jargs *a, int line) {
    switch (fn->kind) {
    case JV_MACRO: return call_macro(c, fn, a, line);
    case JV_FUNC: return jb_call_func(c, fn->u.func.id, a, line);
    case JV_METHOD: return jb_call_method(c, fn->u.method.self, fn->u.method.name, a, line);
    case JV_UNDEF: return je_undef_error(c, fn, line);
    default:
        return jfail(c, line, KT_ERR_FORMAT, "'%s' object is not callable", jv_typename(fn));
    }
}

jv *je_iter(jctx *c, jv *v, int line) {
    switch (v->kind) {
    case JV_UNDEF: return jv_list(c);
    case JV_LIST: return v;
    case JV_DICT: {
        jv *l = jv_list(c);
        for (size_t i = 0; l && i < v->u.dict.n; i++)
            if (!jv_list_push(c, l, v->u.dict.keys[i])) return NULL;
        return l;
    }
    case JV_STR: {
        jv *l = jv_list(c);
        for (size_t i = 0; l && i < v->u.str.n;) {
            size_t k = ju_offset(v->u.str.s + i, v->u.str.n - i, 1);
            jv *ch = jv_str(c, v->u.str.s + i, k);
            if (!ch || !jv_list_push(c, l, ch)) return NULL;
            i += k;
        }
        return l;
    }
    default:
        return jfail(c, line, KT_ERR_FORMAT, "'%s' object is not iterable", jv_typename(v));
    }
}

/* ---- expressions ---------------------------------------------------- */

static jv *eval_seq(jctx *c, jframe *f, const jnode *n) {
    jv *l = n->kind == E_DICT ? jv_dict(c) : jv_list(c);
    if (!l) return NULL;
    if (n->kind == E_TUPLE) l->u.list.tuple = true;
    for (size_t i = 0; i < n->args.n; i++) {
        jv *k = eval(c, f, n->args.v[i]);
        if (!k) return NULL;
        if (n->kind != E_DICT) {
            if (!jv_list_push(c, l, k)) return NULL;
            continue;
        }
        jv *v = eval(c, f, n->kwvals.v[i]);
        if (!v) return NULL;
        if (k->kind == JV_LIST && !k->u.list.tuple)
            return jfail(c, n->line, KT_ERR_FORMAT, "unhashable type: 'list'");
        if (!jv_dict_set(c, l, k, v)) return NULL;
    }
    return l;
}

static jv *eval_filter(jctx *c, jframe *f, const jnode *n, jv *input) {
    jv *v = input;
    if (n->a) v = n->a->kind == E_FILTER && !input ? eval(c, f, n->a)
                  : n->a->kind == E_FILTER ? eval_filter(c, f, n->a, input)
                  : eval(c, f, n->a);
    if (!v) return NULL;
    jargs a;
    if (!eval_args(c, f, n, &a)) return NULL;
    /* a filter walks its input: a big string costs a step per KiB, or
     * `s|length` in a loop over a 16 MiB s would run for hours */
    if (v->kind == JV_STR && !steps(c, n->line, (unsigned)(v->u.str.n >> 10))) return NULL;
    return jb_filter(c, n->name, v, &a, n->line);
}

static jv *eval_test(jctx *c, jframe *f, const jnode *n) {
    jv *v = eval(c, f, n->a);
    if (!v) return NULL;
    jargs a;
    if (!eval_args(c, f, n, &a)) return NULL;
    int r = jb_test(c, n->name, v, &a, n->line);
    if (r < 0) return NULL;
    return jv_bool(c, n->neg ? !r : r);
}

static jv *eval_call(jctx *c, jframe *f, const jnode *n) {
    jv *fn = eval(c, f, n->a);
    if (!fn) return NULL;
    jargs a;
    if (!eval_args(c, f, n, &a)) return NULL;
    return je_call(c, fn, &a, n->line);
}

static jv *eval_binary(jctx *c, jframe *f, const jnode *n) {
    jv *a = eval(c, f, n->a);
    if (!a) return NULL;
    if (n->kind == E_AND && !jv_truthy(a)) return a;
    if (n->kind == E_OR && jv_truthy(a)) return a;
    jv *b = eval(c, f, n->b);
    if (!b || n->kind == E_AND || n->kind == E_OR) return b;
    if (n->kind == E_CMP) return compare(c, n->name, a, b, n->line);
    if (!strcmp(n->name, "~")) {
        jbuf s = {0};
        bool ok = jv_to_str(c, &s, a) && jv_to_str(c, &s, b) && jbuf_put(&s, "", 0);
        jv *r = !ok ? jnomem(c)
                : s.n > KT_JINJA_MAX_STRING ? jfail(c, n->line, KT_ERR_FORMAT, "a string over %zu MiB (the limit)",
                                                    KT_JINJA_MAX_STRING >> 20)
                : jv_str(c, s.p, s.n);
        jbuf_free(&s);
        return r;
    }
    return arith(c, n->name, a, b, n->line);
}

static jv *eval_unary(jctx *c, jframe *f, const jnode *n) {
    jv *a = eval(c, f, n->a);
    if (!a) return NULL;
    if (n->kind == E_NOT) return jv_bool(c, !jv_truthy(a));
    if (a->kind == JV_UNDEF) return je_undef_error(c, a, n->line);
    if (!jv_is_num(a))
        return jfail(c, n->line, KT_ERR_FORMAT, "bad operand type for unary %s: '%s'",
                     n->kind == E_NEG ? "-" : "+", jv_typename(a));
    if (n->kind == E_POS) return a->kind == JV_BOOL ? jv_int(c, a->u.b) : a;
    if (a->kind == JV_FLOAT) return jv_float(c, -a->u.f);
    if (as_int(a) == INT64_MIN) return jfail(c, n->line, KT_ERR_FORMAT, "integer overflow");
    return jv_int(c, -as_int(a));
}

static jv *eval_slice(jctx *c, jframe *f, const jnode *n) {
    jv *obj = eval(c, f, n->a), *p[3] = {0};
    const jnode *parts[3] = {n->b, n->c, n->d};
    if (!obj) return NULL;
    for (int i = 0; i < 3; i++)
        if (parts[i] && !(p[i] = eval(c, f, parts[i]))) return NULL;
    return do_slice(c, obj, p[0], p[1], p[2], n->line);
}

static jv *eval_node(jctx *c, jframe *f, const jnode *n);

/* One more statement or expression run; false (the error set) past the
 * budget, which is what ends a loop over loops (each loop alone is bounded
 * by range()'s limit, not their product). */
static bool steps(jctx *c, int line, unsigned n) {
    if ((c->steps += n) <= KT_JINJA_MAX_STEPS) return true;
    jfail(c, line, KT_ERR_FORMAT, "template runs more than %d steps (the limit)", KT_JINJA_MAX_STEPS);
    return false;
}

static jv *eval(jctx *c, jframe *f, const jnode *n) {
    if (c->failed || !steps(c, n->line, 1)) return NULL;
    if (++c->nest > MAX_NEST) {
        c->nest--;
        return jfail(c, n->line, KT_ERR_FORMAT, "template nested too deeply when run");
    }
    jv *v = eval_node(c, f, n);
    c->nest--;
    return v;
}

static jv *eval_node(jctx *c, jframe *f, const jnode *n) {
    jv *a, *b;
    switch (n->kind) {
    case E_LIT: return n->lit;
    case E_NAME: return lookup(c, f, n->name);
    case E_LIST: case E_TUPLE: case E_DICT: return eval_seq(c, f, n);
    case E_GETATTR:
        return (a = eval(c, f, n->a)) ? je_getattr(c, a, n->name, n->line) : NULL;
    case E_GETITEM:
        if (!(a = eval(c, f, n->a)) || !(b = eval(c, f, n->b))) return NULL;
        return je_getitem(c, a, b, n->line);
    case E_SLICE: return eval_slice(c, f, n);
    case E_BINOP: case E_AND: case E_OR: case E_CMP: return eval_binary(c, f, n);
    case E_NOT: case E_NEG: case E_POS: return eval_unary(c, f, n);
    case E_COND:
        if (!(a = eval(c, f, n->b))) return NULL;
        if (jv_truthy(a)) return eval(c, f, n->a);
        return n->c ? eval(c, f, n->c) : jv_undef(c, "the inline if-expression evaluated to false and no else section was defined");
    case E_CALL: return eval_call(c, f, n);
    case E_FILTER: return eval_filter(c, f, n, NULL);
    case E_TEST: return eval_test(c, f, n);
    default: return jfail(c, n->line, KT_ERR_INTERNAL, "not an expression");
    }
}

/* ---- statements ----------------------------------------------------- */

static bool assign(jctx *c, jframe *f, const jnode *n, jv *v) {
    if (!n->neg) return frame_set(c, f, n->names[0], v);
    jv *items = v->kind == JV_LIST ? v : je_iter(c, v, n->line);
    if (!items) return false;
    if (items->u.list.n != n->nnames) {
        jfail(c, n->line, KT_ERR_FORMAT, "cannot unpack %zu values into %zu names",
              items->u.list.n, n->nnames);
        return false;
    }
    for (size_t i = 0; i < n->nnames; i++)
        if (!frame_set(c, f, n->names[i], items->u.list.items[i])) return false;
    return true;
}

static xres exec_set(jctx *c, jframe *f, const jnode *n) {
    jv *v = eval(c, f, n->a);
    if (!v) return X_ERR;
    if (!n->name) return assign(c, f, n, v) ? X_OK : X_ERR;
    jv *ns = lookup(c, f, n->name);
    if (!ns) return X_ERR;
    if (ns->kind != JV_NS) {
        jfail(c, n->line, KT_ERR_FORMAT, "cannot assign attribute on non-namespace object");
        return X_ERR;
    }
    jv *k = jv_cstr(c, n->names[0]);
    return k && jv_dict_set(c, ns, k, v) ? X_OK : X_ERR;
}

static jv *render_to_value(jctx *c, jframe *f, const jlist *body) {
    jbuf out = {0};
    jv *r = NULL;
    if (exec_body(c, f, body, &out) == X_OK)
        r = out.oom ? jnomem(c) : jv_str(c, out.p ? out.p : "", out.n);
    jbuf_free(&out);
    return r;
}

static jv *loop_obj(jctx *c, jv *items, size_t i) {
    size_t n = items->u.list.n;
    jv *d = jv_dict(c);
    if (!d) return NULL;
    struct { const char *k; jv *v; } e[] = {
        {"index", jv_int(c, (int64_t)i + 1)}, {"index0", jv_int(c, (int64_t)i)},
        {"revindex", jv_int(c, (int64_t)(n - i))}, {"revindex0", jv_int(c, (int64_t)(n - i - 1))},
        {"first", jv_bool(c, i == 0)}, {"last", jv_bool(c, i + 1 == n)},
        {"length", jv_int(c, (int64_t)n)}, {"depth", jv_int(c, 1)}, {"depth0", jv_int(c, 0)},
        {"previtem", i > 0 ? items->u.list.items[i - 1] : NULL},
        {"nextitem", i + 1 < n ? items->u.list.items[i + 1] : NULL},
    };
    for (size_t k = 0; k < sizeof e / sizeof *e; k++) {
        if (!e[k].v) {
            if (c->failed) return NULL;
            continue;
        }
        jv *key = jv_cstr(c, e[k].k);
        if (!key || !jv_dict_set(c, d, key, e[k].v)) return NULL;
    }
    /* loop.cycle(a, b, ...): a method bound to this loop object only */
    jv *cycle = method(c, d, "cycle"), *key = jv_cstr(c, "cycle");
    if (!cycle || !key || !jv_dict_set(c, d, key, cycle)) return NULL;
    return d;
}

static jv *loop_items(jctx *c, jframe *lf, const jnode *n) {
    jv *src = eval(c, lf->parent, n->a);
    if (!src || !(src = je_iter(c, src, n->line))) return NULL;
    if (!n->b) return src;
    jv *out = jv_list(c);
    for (size_t i = 0; out && i < src->u.list.n; i++) {
        if (!assign(c, lf, n, src->u.list.items[i])) return NULL;
        jv *ok = eval(c, lf, n->b);
        if (!ok) return NULL;
        if (jv_truthy(ok) && !jv_list_push(c, out, src->u.list.items[i])) return NULL;
    }
    return out;
}

static xres exec_for(jctx *c, jframe *f, const jnode *n, jbuf *out) {
    jframe *lf = frame_new(c, f);
    jv *items = lf ? loop_items(c, lf, n) : NULL;
    if (!items) return X_ERR;
    if (!items->u.list.n) return exec_body(c, f, &n->kwvals, out) == X_ERR ? X_ERR : X_OK;
    for (size_t i = 0; i < items->u.list.n; i++) {
        /* an iteration costs its loop object's values: a long loop with a
         * tiny body ends within the budget's time too (found by fuzzing) */
        if (!steps(c, n->line, LOOP_STEPS)) return X_ERR;
        /* jinja2: assignments in the body do not survive the iteration */
        jv *loop = loop_obj(c, items, i);
        if (!loop || !(lf = frame_new(c, f)) || !frame_set(c, lf, "loop", loop))
            return X_ERR;
        if (!assign(c, lf, n, items->u.list.items[i])) return X_ERR;
        xres r = exec_body(c, lf, &n->args, out);
        if (r == X_ERR) return X_ERR;
        if (r == X_BREAK) break;
    }
    return X_OK;
}

static xres exec_block_filter(jctx *c, jframe *f, const jnode *n, jbuf *out) {
    jv *body = render_to_value(c, f, &n->args);
    if (!body) return X_ERR;
    jv *v = n->b ? eval_filter(c, f, n->b, body) : body;
    if (!v) return X_ERR;
    if (n->kind == S_SETBLOCK) return frame_set(c, f, n->names[0], v) ? X_OK : X_ERR;
    return jv_to_str(c, out, v) ? X_OK : (jnomem(c), X_ERR);
}

static xres exec_with(jctx *c, jframe *f, const jnode *n, jbuf *out) {
    jframe *wf = frame_new(c, f);
    if (!wf) return X_ERR;
    for (size_t i = 0; i < n->kwvals.n; i++) {
        const jnode *s = n->kwvals.v[i];
        jv *v = eval(c, f, s->a);
        if (!v || !assign(c, wf, s, v)) return X_ERR;
    }
    return exec_body(c, wf, &n->args, out);
}

static xres exec_if(jctx *c, jframe *f, const jnode *n, jbuf *out) {
    jv *cond = eval(c, f, n->a);
    if (!cond) return X_ERR;
    return exec_body(c, f, jv_truthy(cond) ? &n->args : &n->kwvals, out);
}

/* Text written by one template or block past KT_JINJA_MAX_OUTPUT: an
 * error, checked after each statement (it may overshoot by one value,
 * which the memory limit bounds). */
static xres out_checked(jctx *c, const jnode *n, const jbuf *out, xres r) {
    if (r != X_ERR && out->n > KT_JINJA_MAX_OUTPUT) {
        jfail(c, n->line, KT_ERR_FORMAT, "template writes more than %zu MiB (the limit)", KT_JINJA_MAX_OUTPUT >> 20);
        return X_ERR;
    }
    return r;
}

static xres exec_stmt_kind(jctx *c, jframe *f, const jnode *n, jbuf *out);

static xres exec_stmt(jctx *c, jframe *f, const jnode *n, jbuf *out) {
    if (!steps(c, n->line, 1)) return X_ERR;
    return out_checked(c, n, out, exec_stmt_kind(c, f, n, out));
}

static xres exec_stmt_kind(jctx *c, jframe *f, const jnode *n, jbuf *out) {
    jv *v;
    switch (n->kind) {
    case S_TEXT: return jbuf_put(out, n->name, n->nnames) ? X_OK : (jnomem(c), X_ERR);
    case S_OUTPUT:
        if (!(v = eval(c, f, n->a))) return X_ERR;
        return jv_to_str(c, out, v) ? X_OK : (jnomem(c), X_ERR);
    case S_IF: return exec_if(c, f, n, out);
    case S_FOR: return exec_for(c, f, n, out);
    case S_SET: return exec_set(c, f, n);
    case S_SETBLOCK: case S_FILTERBLOCK: return exec_block_filter(c, f, n, out);
    case S_MACRO:
        if (!(v = jv_new(c, JV_MACRO))) return X_ERR;
        v->u.macro.node = n;
        v->u.macro.frame = f;
        return frame_set(c, f, n->name, v) ? X_OK : X_ERR;
    case S_BREAK: return X_BREAK;
    case S_CONTINUE: return X_CONTINUE;
    case S_WITH: return exec_with(c, f, n, out);
    case S_GROUP: return exec_body(c, f, &n->args, out);
    default:
        jfail(c, n->line, KT_ERR_INTERNAL, "not a statement");
        return X_ERR;
    }
}

static xres exec_body(jctx *c, jframe *f, const jlist *body, jbuf *out) {
    if (++c->nest > MAX_NEST) {
        jfail(c, body->n ? body->v[0]->line : 0, KT_ERR_FORMAT,
              "template nested too deeply when run");
        c->nest--;
        return X_ERR;
    }
    xres r = X_OK;
    for (size_t i = 0; i < body->n && r == X_OK; i++) {
        r = exec_stmt(c, f, body->v[i], out);
        if (c->failed) r = X_ERR;
    }
    c->nest--;
    return r;
}

/* Runs a parsed template with `vars` (a dict value) as the root scope. */
bool je_render(jctx *c, const jtemplate *t, jv *vars, jbuf *out) {
    jframe *root = frame_new(c, NULL);
    if (!root) return false;
    root->vars = vars;
    c->root = root;
    xres r = exec_body(c, root, &t->body, out);
    if (r == X_ERR || c->failed) return false;
    if (out->oom) { jnomem(c); return false; }
    return true;
}
