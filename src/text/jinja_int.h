/*
 * jinja_int.h - internals of the Jinja-subset interpreter (see jinja.h),
 * shared by its files: the arena every template and render allocates from,
 * the value type the evaluator computes with, the token stream and the AST.
 *
 * Why an arena: a render makes many short-lived strings, lists and dicts
 * that share structure (values are immutable once built, except namespace
 * attributes); freeing them all at once at the end keeps the evaluator
 * simple and leak-free by construction.
 */
#ifndef KT_TEXT_JINJA_INT_H
#define KT_TEXT_JINJA_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

/* ---- arena ---------------------------------------------------------- */

typedef struct ja_chunk ja_chunk;
typedef struct ja_arena {
    ja_chunk *head;
    size_t used; /* bytes handed out, for the memory limit */
    size_t limit; /* 0: JA_LIMIT; renders use KT_JINJA_MAX_MEMORY */
    bool over_limit; /* an allocation was refused by the limit, not by malloc */
} ja_arena;

/* Zeroed memory, or NULL when out of memory (or over the limit). */
void *ja_alloc(ja_arena *a, size_t size);
char *ja_strndup(ja_arena *a, const char *s, size_t n);
void ja_free_all(ja_arena *a);

/* ---- growable byte buffer (malloc'ed) -------------------------------- */

typedef struct jbuf {
    char *p;
    size_t n, cap;
    bool oom;
} jbuf;

bool jbuf_put(jbuf *b, const char *s, size_t n);
bool jbuf_puts(jbuf *b, const char *s);
bool jbuf_putc(jbuf *b, char c);
void jbuf_free(jbuf *b);

/* ---- values ---------------------------------------------------------- */

typedef enum jv_kind {
    JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT,
    JV_NS,     /* namespace(): a dict whose attributes can be assigned */
    JV_MACRO,  /* a {% macro %} */
    JV_FUNC,   /* a global function (range, namespace, ...) */
    JV_METHOD  /* a bound method such as dict.items */
} jv_kind;

typedef struct jv jv;
typedef struct jnode jnode;
typedef struct jframe jframe;

struct jv {
    jv_kind kind;
    union {
        bool b;
        int64_t i;
        double f;
        struct { const char *s; size_t n; bool safe; } str; /* safe: Markup */
        struct {
            jv **items;
            size_t n, cap;
            bool tuple, gen; /* gen: a generator (map, select, ...) */
            int view;        /* 1 dict_keys, 2 dict_values, 3 dict_items */
        } list;
        struct { jv **keys, **vals; size_t n, cap; } dict; /* also JV_NS */
        struct { const char *name; } undef; /* name for error messages */
        struct { const jnode *node; jframe *frame; } macro;
        struct { int id; } func;
        struct { jv *self; const char *name; } method;
    } u;
};

/* ---- tokens ---------------------------------------------------------- */

typedef enum jt_kind {
    JT_EOF, JT_DATA, JT_VAR_BEGIN, JT_VAR_END, JT_BLOCK_BEGIN, JT_BLOCK_END,
    JT_NAME, JT_STRING, JT_INT, JT_FLOAT, JT_OP
} jt_kind;

typedef struct jtok {
    jt_kind kind;
    int line;
    const char *s; /* text: data, name, decoded string, operator */
    size_t n;
    int64_t i;
    double f;
} jtok;

/* Splits (normalized) source into tokens, jinja2's lexer with trim_blocks
 * and lstrip_blocks. Returns false with err set. */
bool jlex(ja_arena *a, const char *src, jtok **toks, size_t *ntok,
          kt_error *err);

/* ---- AST ------------------------------------------------------------- */

typedef enum jn_kind {
    /* expressions */
    E_LIT, E_NAME, E_LIST, E_TUPLE, E_DICT, E_GETATTR, E_GETITEM, E_SLICE,
    E_BINOP, E_AND, E_OR, E_NOT, E_NEG, E_POS, E_CMP, E_COND, E_CALL,
    E_FILTER, E_TEST,
    /* statements */
    S_TEXT, S_OUTPUT, S_IF, S_FOR, S_SET, S_SETBLOCK, S_MACRO, S_BREAK,
    S_CONTINUE, S_FILTERBLOCK, S_WITH, S_GROUP
} jn_kind;

typedef struct jlist {
    jnode **v;
    size_t n, cap;
} jlist;

struct jnode {
    jn_kind kind;
    int line;
    const char *name; /* identifier, attribute, filter/test name, operator */
    jnode *a, *b, *c, *d;
    jlist args;       /* positional args, list items, dict keys, body */
    jlist kwvals;     /* keyword arg values, dict values, else body */
    const char **kwnames;
    const char **names; /* for/set targets, macro params */
    size_t nnames;
    bool neg;           /* `is not` */
    jv *lit;
};

bool jlist_push(ja_arena *a, jlist *l, jnode *n);

typedef struct jtemplate {
    ja_arena arena;
    jlist body;
} jtemplate;

/* Parses tokens into t->body. */
bool jparse(jtemplate *t, const jtok *toks, size_t ntok, kt_error *err);

/* ---- evaluator state, shared by jinja_eval.c and jinja_builtins.c ----- */

typedef struct jctx {
    ja_arena *arena;
    kt_error *err;
    bool failed;
    int depth;        /* macro calls */
    int nest;         /* evaluator recursion */
    uint64_t steps;   /* statements and expressions run (KT_JINJA_MAX_STEPS) */
    int64_t now;      /* seconds since the epoch, for strftime_now */
    jframe *root;
} jctx;

/* Sets the error (first one wins) and returns NULL. */
void *jfail(jctx *c, int line, kt_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void *jnomem(jctx *c);

/* value constructors; NULL when out of memory */
jv *jv_new(jctx *c, jv_kind k);
jv *jv_str(jctx *c, const char *s, size_t n);
jv *jv_cstr(jctx *c, const char *s);
jv *jv_int(jctx *c, int64_t i);
jv *jv_float(jctx *c, double f);
jv *jv_bool(jctx *c, bool b);
jv *jv_none(jctx *c);
jv *jv_undef(jctx *c, const char *name);
jv *jv_list(jctx *c);
jv *jv_dict(jctx *c);
bool jv_list_push(jctx *c, jv *l, jv *item);
bool jv_dict_set(jctx *c, jv *d, jv *key, jv *val);
jv *jv_dict_get(const jv *d, const jv *key);
jv *jv_dict_gets(const jv *d, const char *key);

bool jv_truthy(const jv *v);
bool jv_equal(const jv *a, const jv *b);
const char *jv_typename(const jv *v);
bool jv_is_num(const jv *v); /* int, float or bool */
double jv_num(const jv *v);

/* Python str() and repr() of a value, appended to b. */
bool jv_to_str(jctx *c, jbuf *b, const jv *v);
bool jv_repr(jctx *c, jbuf *b, const jv *v);
/* Python repr of a float. */
void jv_float_repr(double f, char out[40]);
/* markupsafe.escape(v): a safe string, HTML-escaped unless already safe. */
jv *jv_escape(jctx *c, const jv *v);
/* str(v) as a new string value. */
jv *jv_stringify(jctx *c, const jv *v);
/* json.dumps(v, ensure_ascii=False, ...) as transformers' tojson; false
 * with the error set for values JSON cannot hold. */
typedef struct jjson_opts {
    int indent;              /* < 0: none */
    const char *item_sep, *key_sep;
    bool sort_keys;
} jjson_opts;
bool jv_tojson(jctx *c, jbuf *b, const jv *v, const jjson_opts *o, int line);

/* UTF-8 helpers (Python semantics on code points). */
size_t ju_len(const char *s, size_t n);        /* code points */
size_t ju_offset(const char *s, size_t n, size_t cp); /* byte offset */
size_t ju_space(const char *s, size_t n);      /* bytes of a leading
                                                  Python whitespace char */
size_t ju_space_back(const char *s, size_t n); /* same, at the end */

/* ---- builtins (jinja_builtins.c), called by the evaluator ------------ */

typedef struct jargs {
    jv **pos;
    size_t npos;
    const char **kwn;
    jv **kwv;
    size_t nkw;
} jargs;

enum { JF_RANGE = 1, JF_NAMESPACE, JF_DICT, JF_RAISE, JF_STRFTIME };

/* Shared by the builtins' files (jinja_builtins.c, jinja_filters.c). */
/* Binds args to params by position then keyword; unset ones stay NULL. */
bool jb_bind(jctx *c, const jargs *a, const char *what,
             const char *const *params, size_t np, jv **out, int line);
/* BIND("name", "p1", "p2") declares jv *p[2] bound from `a` (or returns
 * NULL from the calling function on a bad call). */
#define BIND(what, ...)                                                     \
    static const char *const params_[] = {__VA_ARGS__};                    \
    jv *p[sizeof params_ / sizeof *params_];                                \
    if (!jb_bind(c, a, what, params_, sizeof params_ / sizeof *params_, p, line)) \
        return NULL
bool jb_want_str(jctx *c, const jv *v, const char *what, int line);
bool jb_want_int(jctx *c, const jv *v, const char *what, int line);
int64_t jb_ival(const jv *v); /* an int or bool value */
jv *jb_from_buf(jctx *c, jbuf *b); /* string value from b; frees b */
jv *jb_keep_safe(jv *r, const jv *from); /* Markup in, Markup out */
/* mode: 0 upper, 1 lower, 2 capitalize, 3 str.title, 4 jinja2 title */
jv *jb_map_case(jctx *c, jv *s, int mode);
jv *jb_strip(jctx *c, jv *s, const jv *chars, bool left, bool right, int line);
jv *jb_replace(jctx *c, jv *s, jv *old, jv *new_, int64_t count);
bool jb_in_table(const char *const *t, const char *name);
/* which: 0 keys, 1 values, 2 (key, value) tuples */
jv *jb_dict_view(jctx *c, jv *d, int which);

jv *jb_global(jctx *c, const char *name);
jv *jb_call_func(jctx *c, int id, const jargs *a, int line);
jv *jb_filter(jctx *c, const char *name, jv *v, const jargs *a, int line);
bool jb_has_filter(const char *name);
/* Python's `fmt % args` (args: a tuple, a dict or one value). */
jv *jb_format(jctx *c, jv *fmt, jv *args, int line);
/* -1 error, else 0/1 */
int jb_test(jctx *c, const char *name, jv *v, const jargs *a, int line);
bool jb_has_test(const char *name);
bool jb_is_method(const jv *self, const char *name);
jv *jb_call_method(jctx *c, jv *self, const char *name, const jargs *a,
                   int line);

/* attribute / item access as jinja2's environment does it */
jv *je_getattr(jctx *c, jv *obj, const char *name, int line);
jv *je_getitem(jctx *c, jv *obj, jv *key, int line);
/* Calls a macro or function value. */
jv *je_call(jctx *c, jv *fn, const jargs *a, int line);
/* Iterates: fills a list value (dict -> keys, str -> chars); error for
 * non-iterables. */
jv *je_iter(jctx *c, jv *v, int line);
/* Runs a parsed template with `vars` (a dict) as the root scope. */
bool je_render(jctx *c, const jtemplate *t, jv *vars, jbuf *out);
/* Error when an undefined value is used (jinja2's UndefinedError). */
void *je_undef_error(jctx *c, const jv *v, int line);

#endif
