/*
 * serve_classes.c - `--model NAME=PATH[,key=value...]` and `--config FILE`
 * into serve_class entries (see serve_classes.h).
 *
 * One table of keys serves both forms: a key's value is a string on the
 * command line and a JSON value in the file. Sampling keys (temperature,
 * top_p, top_k, min_p, max_tokens, seed) become the class's default
 * request fields: a request that gives its own keeps it. Two more default
 * fields, grammar (GBNF text) and logit_bias (an object), exist in the
 * file only: the command line's comma list cannot hold them.
 */
#include "cli/serve_classes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_util.h"

#define CMD "serve"

bool serve_class_is_spec(const char *v) {
    const char *eq = strchr(v, '=');
    /* NAME=PATH: a name before the '=' holds no '/' (a path might) */
    return eq && eq > v && memchr(v, '/', (size_t)(eq - v)) == NULL;
}

/* ---- the keys ---- */

typedef enum key_kind { K_INT, K_STR, K_ALIAS, K_EMBED, K_LAZY, K_DEFAULT_NUM, K_DEFAULT_INT, K_DEFAULT_JSON } key_kind;

typedef struct class_key {
    const char *name;
    key_kind kind;
    long lo, hi;
} class_key;

static const class_key KEYS[] = {
    {"ctx", K_INT, 1, 1 << 24},      {"parallel", K_INT, 1, 1024},       {"kv-mb", K_INT, 1, 1 << 24},
    {"keep-alive", K_INT, 0, 1 << 24}, {"lazy", K_LAZY, 0, 0},
    {"kv-type", K_STR, 0, 0},        {"chat-template", K_STR, 0, 0},     {"alias", K_ALIAS, 0, 0},
    {"fallback", K_STR, 0, 0},       {"fallback-on", K_STR, 0, 0},
    {"spec", K_STR, 0, 0},           {"draft-max", K_INT, 1, 32},       {"draft", K_STR, 0, 0},
    {"mmproj", K_STR, 0, 0},
    {"embeddings", K_EMBED, 0, 0},   {"temperature", K_DEFAULT_NUM, 0, 2}, {"top_p", K_DEFAULT_NUM, 0, 1},
    {"min_p", K_DEFAULT_NUM, 0, 1},  {"top_k", K_DEFAULT_INT, 0, 1 << 20}, {"max_tokens", K_DEFAULT_INT, 1, 1 << 24},
    {"seed", K_DEFAULT_INT, 0, 1L << 30}, {"grammar", K_DEFAULT_JSON, 0, 0}, {"logit_bias", K_DEFAULT_JSON, 0, 0},
};

const char *serve_class_keys_help(void) {
    return "ctx=N, parallel=N, kv-mb=N, kv-type=f16|q8_0|f32, chat-template=FILE|NAME, alias=NAME (repeatable),\n"
           "embeddings[=mean|last|cls], lazy (load on first use), keep-alive=S (unload after S idle seconds),\n"
           "fallback=URL and fallback-on=LIST (its own upstream and triggers), spec=off|ngram|draft|mtp|auto, draft=PATH\n"
           "(its own draft model, the same vocabulary) and draft-max=K (speculative decoding), mmproj=PATH\n"
           "(its vision projector: chat requests may carry images),\n"
           "and request defaults temperature=, top_p=, top_k=, min_p=, max_tokens=, seed=\n"
           "(in a --config file also \"grammar\": GBNF text and \"logit_bias\": {\"TOKEN_ID\": BIAS})";
}

static const class_key *find_key(const char *name, size_t len) {
    for (size_t i = 0; i < sizeof KEYS / sizeof KEYS[0]; i++)
        if (strlen(KEYS[i].name) == len && !strncmp(KEYS[i].name, name, len)) return &KEYS[i];
    return NULL;
}

static int *int_field(serve_class *c, const char *name) {
    if (!strcmp(name, "keep-alive")) return c->keep_alive_set = true, &c->keep_alive_s;
    return !strcmp(name, "ctx") ? &c->n_ctx : !strcmp(name, "parallel") ? &c->n_parallel
           : !strcmp(name, "draft-max") ? &c->draft_max : &c->kv_mb;
}

/* A default request field whose value is JSON as it stands in a --config
 * file (grammar: a string, logit_bias: an object); the server checks its
 * content as it checks a request's own. 0 or 2 (reported). */
static int set_json_default(serve_class *c, const class_key *k, json_t *v, const char *where) {
    bool str = !strcmp(k->name, "grammar");
    if (str ? !json_is_string(v) : !json_is_object(v))
        return cli_usage_error(CMD, "%s: \"%s\" must be %s", where, k->name,
                               str ? "a GBNF string" : "an object of token id -> bias");
    if ((!c->defaults && !(c->defaults = json_object())) || json_object_set(c->defaults, k->name, v))
        return cli_usage_error(CMD, "out of memory");
    return 0;
}

/* One key's value (text from either form) into c; 0 or 2 (reported). */
static int set_key(serve_class *c, const class_key *k, const char *v, const char *where) {
    if (k->kind == K_DEFAULT_JSON) {
        return cli_usage_error(CMD, "%s: %s is a JSON value: give it in a --config file", where, k->name);
    } else if (k->kind == K_INT) {
        if (!v || !cli_parse_int(v, k->lo, k->hi, int_field(c, k->name)))
            return cli_usage_error(CMD, "%s: %s=%s is not an integer in %ld..%ld", where, k->name, v ? v : "", k->lo, k->hi);
    } else if (k->kind == K_STR) {
        if (!v || !v[0]) return cli_usage_error(CMD, "%s: %s needs a value", where, k->name);
        if (!strcmp(k->name, "kv-type") && strcmp(v, "f16") && strcmp(v, "q8_0") && strcmp(v, "f32"))
            return cli_usage_error(CMD, "%s: kv-type=%s (f16, q8_0, f32)", where, v);
        if (!strcmp(k->name, "spec") && strcmp(v, "off") && strcmp(v, "ngram") && strcmp(v, "draft") &&
            strcmp(v, "mtp") && strcmp(v, "auto"))
            return cli_usage_error(CMD, "%s: spec=%s (off, ngram, draft, mtp, auto)", where, v);
        *(!strcmp(k->name, "kv-type")       ? &c->kv_type
          : !strcmp(k->name, "spec")        ? &c->spec
          : !strcmp(k->name, "draft")       ? &c->draft
          : !strcmp(k->name, "mmproj")      ? &c->mmproj
          : !strcmp(k->name, "fallback")    ? &c->fallback
          : !strcmp(k->name, "fallback-on") ? &c->fallback_on
                                            : &c->template_arg) = v;
    } else if (k->kind == K_ALIAS) {
        if (!v || !v[0]) return cli_usage_error(CMD, "%s: alias needs a name", where);
        if (c->n_aliases == SERVE_MAX_ALIASES) return cli_usage_error(CMD, "%s: at most %d aliases", where, SERVE_MAX_ALIASES);
        c->aliases[c->n_aliases++] = v;
    } else if (k->kind == K_LAZY) {
        if (v && strcmp(v, "true")) return cli_usage_error(CMD, "%s: lazy takes no value", where);
        c->lazy = true;
    } else if (k->kind == K_EMBED) {
        if (v && strcmp(v, "mean") && strcmp(v, "last") && strcmp(v, "cls"))
            return cli_usage_error(CMD, "%s: embeddings=%s (mean, last, cls)", where, v);
        c->embeddings = v ? v : "";
    } else {
        float f;
        int i;
        bool ok = k->kind == K_DEFAULT_NUM ? v && cli_parse_float(v, (float)k->lo, (float)k->hi, &f)
                                           : v && cli_parse_int(v, k->lo, k->hi, &i);
        if (!ok) return cli_usage_error(CMD, "%s: %s=%s is not a number in %ld..%ld", where, k->name, v ? v : "", k->lo, k->hi);
        if ((!c->defaults && !(c->defaults = json_object())) ||
            json_object_set_new(c->defaults, k->name, k->kind == K_DEFAULT_NUM ? json_real(f) : json_integer(i)))
            return cli_usage_error(CMD, "out of memory");
    }
    return 0;
}

/* ---- --model NAME=PATH[,key=value...] ---- */

int serve_class_parse(const char *spec, serve_class *c) {
    memset(c, 0, sizeof *c);
    if (!(c->owned = strdup(spec))) return cli_usage_error(CMD, "out of memory");
    char *eq = strchr(c->owned, '=');
    *eq = 0;
    c->name = c->owned;
    c->path = eq + 1;
    char *comma = strchr(eq + 1, ',');
    if (comma) *comma = 0;
    if (!c->path[0]) return cli_usage_error(CMD, "--model %s: the path is empty (NAME=PATH)", c->name);
    for (char *p = comma ? comma + 1 : NULL; p;) {
        char *next = strchr(p, ',');
        if (next) *next = 0;
        char *e = strchr(p, '=');
        const class_key *k = find_key(p, e ? (size_t)(e - p) : strlen(p));
        char where[96];
        snprintf(where, sizeof where, "--model %.60s", c->name);
        if (!k)
            return cli_usage_error(CMD, "%s: unknown key '%.*s' (keys: %s)", where, (int)(e ? e - p : (long)strlen(p)), p,
                                   serve_class_keys_help());
        if (!e && k->kind != K_EMBED && k->kind != K_LAZY) return cli_usage_error(CMD, "%s: %s needs =VALUE", where, k->name);
        int rc = set_key(c, k, e ? e + 1 : NULL, where);
        if (rc) return rc;
        p = next ? next + 1 : NULL;
    }
    return 0;
}

/* ---- --config FILE ---- */

/* A JSON value as the text set_key takes (numbers printed, strings as
 * they are); NULL for other types. buf holds printed numbers. */
static const char *value_text(json_t *v, char *buf, size_t cap) {
    if (json_is_string(v)) return json_string_value(v);
    if (json_is_integer(v)) return snprintf(buf, cap, "%lld", (long long)json_integer_value(v)), buf;
    if (json_is_real(v)) return snprintf(buf, cap, "%.9g", json_real_value(v)), buf;
    if (json_is_true(v)) return NULL; /* "embeddings": true */
    return buf[0] = 0, buf;
}

static int config_entry(json_t *m, size_t i, const char *file, serve_class *c) {
    memset(c, 0, sizeof *c);
    char where[160];
    snprintf(where, sizeof where, "%.100s: models[%zu]", file, i);
    json_t *name = json_object_get(m, "name"), *path = json_object_get(m, "path");
    if (!json_is_object(m) || !json_string_length(name) || !json_string_length(path))
        return cli_usage_error(CMD, "%s needs a non-empty \"name\" and \"path\"", where);
    c->name = json_string_value(name), c->path = json_string_value(path);
    const char *key;
    json_t *v;
    json_object_foreach(m, key, v) {
        if (!strcmp(key, "name") || !strcmp(key, "path")) continue;
        if (!strcmp(key, "aliases")) {
            size_t k;
            json_t *a;
            if (!json_is_array(v)) return cli_usage_error(CMD, "%s: \"aliases\" must be an array of names", where);
            json_array_foreach(v, k, a) {
                int rc = set_key(c, find_key("alias", 5), json_string_value(a), where);
                if (rc) return rc;
            }
            continue;
        }
        const class_key *k = find_key(key, strlen(key));
        if (!k) return cli_usage_error(CMD, "%s: unknown key \"%s\" (keys: name, path, aliases, %s)", where, key,
                                       serve_class_keys_help());
        char buf[64];
        int rc = k->kind == K_DEFAULT_JSON ? set_json_default(c, k, v, where)
                                           : set_key(c, k, value_text(v, buf, sizeof buf), where);
        if (rc) return rc;
    }
    return 0;
}

int serve_config_load(const char *file, serve_class *c, int cap, int *n) {
    json_error_t je;
    json_t *root = json_load_file(file, 0, &je);
    if (!root) return cli_usage_error(CMD, "--config %s: %s (line %d, column %d)", file, je.text, je.line, je.column);
    json_t *models = json_object_get(root, "models");
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) if (strcmp(key, "models")) {
        int rc = cli_usage_error(CMD, "--config %s: unknown key \"%s\" (a config has \"models\": [...])", file, key);
        json_decref(root); /* after the message: key is the document's */
        return rc;
    }
    if (!json_array_size(models)) {
        json_decref(root);
        return cli_usage_error(CMD, "--config %s: \"models\" must be a non-empty array", file);
    }
    size_t i;
    json_t *m;
    json_array_foreach(models, i, m) {
        if (*n == cap) {
            json_decref(root);
            return cli_usage_error(CMD, "--config %s: at most %d models", file, cap);
        }
        int rc = config_entry(m, i, file, &c[*n]);
        c[*n].config = json_incref(root); /* its strings point into root */
        (*n)++;
        if (rc) {
            json_decref(root);
            return rc;
        }
    }
    json_decref(root);
    return 0;
}

void serve_class_free(serve_class *c) {
    json_decref(c->defaults);
    json_decref(c->config);
    free(c->owned);
    memset(c, 0, sizeof *c);
}
