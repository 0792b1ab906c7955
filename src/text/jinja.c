/*
 * jinja.c - the public face of the Jinja interpreter (see jinja.h):
 * parsing into a template that owns its arena, and rendering, which turns
 * the JSON variables into interpreter values in a per-render arena, runs
 * the evaluator and hands back malloc'ed text.
 */
#include "text/jinja.h"

#include <stdlib.h>
#include <string.h>

#include "text/jinja_int.h"

struct kt_jinja {
    jtemplate t;
};

kt_jinja *kt_jinja_parse(const char *text, kt_error *err) {
    if (!text) {
        kt_error_set(err, KT_ERR_ARG, "template: no text");
        return NULL;
    }
    kt_jinja *j = calloc(1, sizeof *j);
    if (!j) {
        kt_error_set(err, KT_ERR_NOMEM, "template: out of memory");
        return NULL;
    }
    jtok *toks;
    size_t n;
    if (!jlex(&j->t.arena, text, &toks, &n, err) ||
        !jparse(&j->t, toks, n, err)) {
        kt_jinja_free(j);
        return NULL;
    }
    return j;
}

void kt_jinja_free(kt_jinja *t) {
    if (!t) return;
    ja_free_all(&t->t.arena);
    free(t);
}

static jv *from_json(jctx *c, const json_t *j, int depth) {
    if (depth > 200) return jfail(c, 0, KT_ERR_ARG, "template variables nested too deeply");
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        jv *d = jv_dict(c);
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)j, k, v) {
            jv *key = jv_cstr(c, k), *val = from_json(c, v, depth + 1);
            if (!d || !key || !val || !jv_dict_set(c, d, key, val)) return NULL;
        }
        return d;
    }
    case JSON_ARRAY: {
        jv *l = jv_list(c);
        for (size_t i = 0; l && i < json_array_size(j); i++) {
            jv *val = from_json(c, json_array_get(j, i), depth + 1);
            if (!val || !jv_list_push(c, l, val)) return NULL;
        }
        return l;
    }
    case JSON_STRING: return jv_str(c, json_string_value(j), json_string_length(j));
    case JSON_INTEGER: return jv_int(c, (int64_t)json_integer_value(j));
    case JSON_REAL: return jv_float(c, json_real_value(j));
    case JSON_TRUE: return jv_bool(c, true);
    case JSON_FALSE: return jv_bool(c, false);
    default: return jv_none(c);
    }
}

char *kt_jinja_render(const kt_jinja *t, const json_t *vars,
                      const kt_jinja_options *opts, kt_error *err) {
    if (!t || (vars && !json_is_object(vars))) {
        kt_error_set(err, KT_ERR_ARG, "template: variables must be a JSON object");
        return NULL;
    }
    ja_arena arena = {.limit = KT_JINJA_MAX_MEMORY};
    jctx c = {.arena = &arena, .err = err, .now = opts ? opts->now : 0};
    jbuf out = {0};
    jv *root = vars ? from_json(&c, vars, 0) : jv_dict(&c);
    char *res = NULL;
    if (root && je_render(&c, &t->t, root, &out)) {
        res = out.p ? out.p : strdup("");
        if (!res) kt_error_set(err, KT_ERR_NOMEM, "template: out of memory");
        out.p = NULL;
    }
    jbuf_free(&out);
    ja_free_all(&arena);
    return res;
}
