/*
 * classes.c - the models one `kettle serve` serves (inference classes):
 * which class a request goes to, each class's names in /v1/models, and the
 * default fields a class gives its requests.
 *
 * A request's "model" is matched against every class's name and aliases;
 * no "model" means the first class. An unknown name is a 404 listing what
 * is served, except with a single class and no --strict-model-names,
 * where any name is that class (clients configured for another server
 * send their own model names). Each class has its own engine, KV cache,
 * prefix cache, template, sampled-ids memory and result cache; they share
 * the HTTP threads and the machine.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "server/http_internal.h"

#define INVALID "invalid_request_error"

static bool answers_to(const srv_class *k, const char *name) {
    if (!strcmp(k->cfg.name, name)) return true;
    for (int i = 0; i < k->cfg.n_aliases; i++)
        if (!strcmp(k->cfg.aliases[i], name)) return true;
    return false;
}

/* Every served name, quoted, for messages. */
static void served_names(const srv_server *s, char *out, size_t cap) {
    size_t n = 0;
    out[0] = 0;
    for (int c = 0; c < s->n_classes; c++) {
        const srv_class *k = &s->classes[c];
        for (int i = -1; i < k->cfg.n_aliases && n < cap; i++) {
            int w = snprintf(out + n, cap - n, "%s'%.100s'", n ? ", " : "", i < 0 ? k->cfg.name : k->cfg.aliases[i]);
            if (w < 0) return;
            n += (size_t)w;
        }
    }
}

static bool not_found(const srv_server *s, const char *name, srv_error *e) {
    char names[512];
    served_names(s, names, sizeof names);
    return srv_fail(e, 404, INVALID, "model", "model_not_found",
                    "The model '%.200s' does not exist; this server serves %s%s", name, names,
                    s->n_classes == 1 ? " (it was started with --strict-model-names)" : "");
}

srv_class *srv_route(srv_server *s, json_t *body, srv_error *e) {
    json_t *v = json_object_get(body, "model");
    if (!v || json_is_null(v)) return &s->classes[0];
    if (!json_is_string(v)) return srv_fail(e, 400, INVALID, "model", NULL, "'model' must be a string"), NULL;
    for (int c = 0; c < s->n_classes; c++)
        if (answers_to(&s->classes[c], json_string_value(v))) return &s->classes[c];
    if (s->n_classes == 1 && !s->cfg.strict_model_names) return &s->classes[0];
    return not_found(s, json_string_value(v), e), NULL;
}

srv_model_info srv_class_info(const srv_class *k) {
    return (srv_model_info){.name = k->cfg.name, .aliases = k->cfg.aliases, .n_aliases = k->cfg.n_aliases,
                            .n_vocab = kt_model_describe(k->cfg.model)->n_vocab};
}

const char *srv_reply_name(const srv_class *k, json_t *body) {
    json_t *v = json_object_get(body, "model");
    return json_is_string(v) && answers_to(k, json_string_value(v)) ? json_string_value(v) : k->cfg.name;
}

bool srv_class_defaults(const srv_class *k, json_t *chat) {
    const char *key;
    json_t *v;
    json_object_foreach(k->cfg.defaults, key, v) {
        json_t *have = json_object_get(chat, key);
        if ((!have || json_is_null(have)) && json_object_set(chat, key, v)) return false;
    }
    return true;
}

static json_t *model_object(const srv_server *s, const char *name) {
    return json_pack("{s:s, s:s, s:I, s:s}", "id", name, "object", "model", "created", (json_int_t)s->started,
                     "owned_by", "kettle");
}

json_t *srv_models_json(const srv_server *s) {
    json_t *data = json_array();
    for (int c = 0; data && c < s->n_classes; c++) {
        const srv_class *k = &s->classes[c];
        for (int i = -1; data && i < k->cfg.n_aliases; i++)
            if (json_array_append_new(data, model_object(s, i < 0 ? k->cfg.name : k->cfg.aliases[i])))
                json_decref(data), data = NULL;
    }
    return data ? json_pack("{s:s, s:o}", "object", "list", "data", data) : NULL;
}

json_t *srv_model_json(const srv_server *s, const char *id, srv_error *e) {
    for (int c = 0; c < s->n_classes; c++)
        if (answers_to(&s->classes[c], id)) return model_object(s, id);
    /* one class, not strict: every name is it (its object, under its name) */
    if (s->n_classes == 1 && !s->cfg.strict_model_names) return model_object(s, s->classes[0].cfg.name);
    return not_found(s, id, e), NULL;
}
