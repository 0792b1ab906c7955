/*
 * serve_classes.h - the inference classes of `kettle serve`: several
 * models in one server, each under its own name with its own context,
 * parallel sequences, KV budget and type, chat template, default sampling
 * fields and aliases.
 *
 * Declared on the command line (`--model NAME=PATH[,key=value...]`,
 * repeatable) or in a JSON file (`--config FILE`); the keys are the same
 * in both (see serve_class_keys_help). A setting a class does not give is
 * the command line's (`--ctx`, `--parallel`, ...).
 */
#ifndef KT_CLI_SERVE_CLASSES_H
#define KT_CLI_SERVE_CLASSES_H

#include <jansson.h>
#include <stdbool.h>

#include "cli/model_store.h"
#include "server/fallback.h"

#define SERVE_MAX_CLASSES 16
#define SERVE_MAX_ALIASES 16

typedef struct serve_class {
    const char *name, *path;
    const char *aliases[SERVE_MAX_ALIASES];
    int n_aliases;
    int n_ctx, n_parallel, kv_mb; /* 0: the command line's */
    const char *kv_type;          /* NULL: the command line's */
    const char *template_arg;     /* a file or a built-in name; NULL: the command line's, else the model's */
    const char *embeddings;       /* NULL: the command line's; "" the file's pooling or mean; mean, last, cls */
    const char *fallback;         /* its own fallback upstream's URL; NULL: the command line's --fallback */
    const char *fallback_on;      /* which refusals it forwards; NULL: the command line's --fallback-on */
    const char *spec;             /* speculative decoding: off, ngram; NULL: the command line's --spec */
    int draft_max;                /* proposals per step; 0: the command line's --draft-max */
    const char *draft;            /* its draft model's path (spec=draft); NULL: none (--draft with one model) */
    const char *mmproj;           /* its vision projector's path; NULL: none (--mmproj with one model) */
    srv_fallback fb;              /* its own upstream as cmd_serve built it (url NULL: the server's) */
    bool lazy;                    /* loaded on its first request, not at start */
    bool keep_alive_set;
    int keep_alive_s;             /* unloaded after this many idle seconds (keep_alive_set); else never */
    json_t *defaults;             /* request fields given to requests without them (temperature, ...); owned */
    char *owned;                  /* the spec text the strings above point into */
    json_t *config;               /* the config file's JSON the strings point into */
    char path_buf[MS_PATH_MAX];   /* a pulled OWNER/REPO[:QUANT], resolved */
} serve_class;

/* Whether a --model value is a class (NAME=PATH...) rather than a path. */
bool serve_class_is_spec(const char *v);
/* "NAME=PATH[,key=value...]" -> *c. Returns 0, or 2 after a usage error
 * naming the key. */
int serve_class_parse(const char *spec, serve_class *c);
/* The classes of a JSON config file ({"models": [{"name", "path", ...}]})
 * appended to c[*n..cap). Returns 0, or 2 after an error naming the file
 * and the entry. */
int serve_config_load(const char *file, serve_class *c, int cap, int *n);
void serve_class_free(serve_class *c);
/* The keys, for --help. */
const char *serve_class_keys_help(void);

#endif
