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
 *
 * A class with a load function may be loaded on first use and unloaded
 * when idle (keep_alive_s, as Ollama's keep_alive): its first request
 * starts a loader thread and waits (suspended, like a request waiting for
 * tokens); a keeper thread unloads a class no request has held for
 * keep_alive_s. Loads and unloads take load_mu, one at a time, and keep
 * the classes within the server's memory budget: a load that does not fit
 * first unloads idle classes (least recently used first) and is otherwise
 * refused with a message saying what holds the memory. A running request
 * holds its class, so it is never unloaded under it, and a load touches
 * nothing of the other classes but what they have left idle.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "base/timing.h"
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

static srv_class *find_class(srv_server *s, json_t *body, srv_error *e) {
    json_t *v = json_object_get(body, "model");
    if (!v || json_is_null(v)) return &s->classes[0];
    if (!json_is_string(v)) return srv_fail(e, 400, INVALID, "model", NULL, "'model' must be a string"), NULL;
    for (int c = 0; c < s->n_classes; c++)
        if (answers_to(&s->classes[c], json_string_value(v))) return &s->classes[c];
    if (s->n_classes == 1 && !s->cfg.strict_model_names) return &s->classes[0];
    return not_found(s, json_string_value(v), e), NULL;
}

/* The routed request holds its class (c->cls) until srv_class_release. */
srv_class *srv_route(srv_server *s, json_t *body, srv_error *e) {
    srv_class *k = find_class(s, body, e);
    if (!k) return NULL;
    pthread_mutex_lock(&s->engine_mu);
    k->users++;
    pthread_mutex_unlock(&s->engine_mu);
    return k;
}

void srv_class_release(srv_conn *c) {
    if (!c->cls) return;
    srv_server *s = c->s;
    pthread_mutex_lock(&s->engine_mu);
    if (--c->cls->users == 0) c->cls->last_used_ms = kt_time_ms();
    pthread_mutex_unlock(&s->engine_mu);
    c->cls = NULL;
}

srv_model_info srv_class_info(const srv_class *k) {
    return (srv_model_info){.n_vocab = kt_model_describe(k->model)->n_vocab, .vision = k->cfg.vision != NULL};
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

/* ---- loading and unloading ---- */

static bool may_unload(const srv_class *k) {
    return k->state == CLASS_READY && k->users == 0 && k->cfg.load && k->cfg.keep_alive_s >= 0;
}

/* Takes an idle class's model and engine out (engine_mu held by the
 * caller; freed by unload_parts outside it). */
static void take_out(srv_class *k, kt_model **model, kt_engine **engine) {
    *model = k->model, *engine = k->engine;
    k->model = NULL, k->engine = NULL, k->state = CLASS_UNLOADED;
}

/* Frees what take_out took (load_mu held: the memory comes back). */
static void unload_parts(srv_server *s, srv_class *k, kt_model *model, kt_engine *engine, const char *why) {
    kt_engine_free(engine);
    kt_model_free(model);
    s->mem_used -= k->mem_bytes < s->mem_used ? k->mem_bytes : s->mem_used;
    fprintf(stderr, "kettle serve: unloaded '%s' (%s; %zu MiB back)\n", k->cfg.name, why, k->mem_bytes >> 20);
    k->mem_bytes = 0;
}

/* Unloads idle classes, least recently used first, until `need` more
 * bytes fit the budget (load_mu held). False if they cannot. */
static bool make_room(srv_server *s, srv_class *for_k, size_t need) {
    while (s->mem_budget && s->mem_used + need > s->mem_budget) {
        srv_class *lru = NULL;
        kt_model *model = NULL;
        kt_engine *engine = NULL;
        pthread_mutex_lock(&s->engine_mu);
        for (int i = 0; i < s->n_classes; i++) {
            srv_class *k = &s->classes[i];
            if (k != for_k && may_unload(k) && (!lru || k->last_used_ms < lru->last_used_ms)) lru = k;
        }
        if (lru) take_out(lru, &model, &engine);
        pthread_mutex_unlock(&s->engine_mu);
        if (!lru) return false;
        unload_parts(s, lru, model, engine, "to make room");
    }
    return true;
}

/* Loads class k (load_mu held); false with err. */
static bool load_class(srv_server *s, srv_class *k, kt_model **model, kt_engine **engine, kt_error *err) {
    if (!make_room(s, k, k->cfg.load_bytes + k->cfg.kv_bytes)) {
        kt_error_set(err, KT_ERR_NOMEM, "not enough memory to load '%s' (about %zu MiB of weights; %zu of %zu MiB are "
                     "held by classes that are busy or pinned)", k->cfg.name, k->cfg.load_bytes >> 20, s->mem_used >> 20,
                     s->mem_budget >> 20);
        return false;
    }
    size_t kv_limit = s->mem_budget ? s->mem_budget - s->mem_used - k->cfg.load_bytes : 0;
    if (s->mem_budget && !kv_limit) kv_limit = 1; /* nothing left: the engine refuses, naming the flag */
    if (k->cfg.load(k->cfg.load_ctx, kv_limit, model, engine, err) != KT_OK) return false;
    kt_engine_stats st;
    kt_engine_get_stats(*engine, &st);
    k->mem_bytes = k->cfg.load_bytes + st.kv_pool_bytes;
    s->mem_used += k->mem_bytes;
    return true;
}

/* Wakes every request waiting for k's load (engine_mu held). */
static void wake_waiters(srv_class *k) {
    for (srv_link *l = k->waiters, *next; l; l = next) {
        next = l->next_waiting;
        l->next_waiting = NULL;
        srv_link_notify(l);
    }
    k->waiters = NULL;
}

static void *loader_main(void *arg) {
    srv_class *k = arg;
    srv_server *s = k->s;
    kt_model *model = NULL;
    kt_engine *engine = NULL;
    kt_error err = {0};
    double t0 = kt_time_ms();
    pthread_mutex_lock(&s->load_mu);
    bool ok = load_class(s, k, &model, &engine, &err);
    pthread_mutex_unlock(&s->load_mu);
    if (ok) fprintf(stderr, "kettle serve: loaded '%s' in %.1f s\n", k->cfg.name, (kt_time_ms() - t0) / 1e3);
    else fprintf(stderr, "kettle serve: cannot load '%s': %s\n", k->cfg.name, err.msg);
    pthread_mutex_lock(&s->engine_mu);
    if (ok && !s->stopping) {
        k->model = model, k->engine = engine, k->state = CLASS_READY;
        model = NULL, engine = NULL;
        k->last_used_ms = kt_time_ms();
    } else {
        snprintf(k->error, sizeof k->error, "%s", ok ? "the server is shutting down" : err.msg);
        k->state = CLASS_UNLOADED;
    }
    wake_waiters(k);
    pthread_mutex_unlock(&s->engine_mu);
    kt_engine_free(engine); /* loaded as the server stopped */
    kt_model_free(model);
    return NULL;
}

/* Starts k's load (engine_mu held); false when no thread can be made. */
static bool start_load(srv_class *k) {
    if (k->loader_joinable) pthread_join(k->loader, NULL); /* the last load's thread, long done */
    k->loader_joinable = false;
    k->state = CLASS_LOADING;
    k->load_gen++;
    if (pthread_create(&k->loader, NULL, loader_main, k)) {
        k->state = CLASS_UNLOADED;
        snprintf(k->error, sizeof k->error, "cannot start a thread to load it");
        return false;
    }
    k->loader_joinable = true;
    return true;
}

srv_class_wait srv_class_ready(srv_conn *c, srv_link *link, srv_error *e) {
    srv_class *k = c->cls;
    srv_server *s = c->s;
    srv_class_wait r = CLASS_WAIT;
    pthread_mutex_lock(&s->engine_mu);
    /* the load this request waited for ended, and not READY */
    bool failed = c->waiting_class && k->state != CLASS_READY && !(k->state == CLASS_LOADING && k->load_gen == c->load_gen);
    if (s->stopping) r = CLASS_FAILED, snprintf(k->error, sizeof k->error, "the server is shutting down");
    else if (k->state == CLASS_READY) r = CLASS_GO;
    else if (failed || (k->state == CLASS_UNLOADED && !start_load(k))) r = CLASS_FAILED;
    if (r == CLASS_WAIT) {
        c->load_gen = k->load_gen;
        if (link && !c->waiting_class) link->next_waiting = k->waiters, k->waiters = link;
        c->waiting_class = link != NULL;
    }
    if (r == CLASS_FAILED) srv_fail(e, 503, "server_error", "model", "model_not_loaded", "the model '%s' could not be loaded: %s",
                                    k->cfg.name, k->error);
    if (r != CLASS_WAIT) c->waiting_class = false;
    pthread_mutex_unlock(&s->engine_mu);
    return r;
}

/* Tokenize and the like (no waiting) answer at once: a class still loading is a 503
 * (its load begun), as for a server still loading. */
bool srv_loaded_now(srv_conn *c, srv_error *e) {
    srv_class_wait w = srv_class_ready(c, NULL, e);
    if (w == CLASS_WAIT)
        srv_fail(e, 503, "server_error", "model", "loading", "the model '%s' is loading; retry shortly", c->cls->cfg.name);
    return w == CLASS_GO;
}

/* The keeper: every half second, unloads a class no request has held for
 * its keep_alive_s. */
static void *keeper_main(void *arg) {
    srv_server *s = arg;
    pthread_mutex_lock(&s->engine_mu);
    while (!s->stopping) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 500000000L;
        if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&s->keeper_cv, &s->engine_mu, &until);
        const double now = kt_time_ms();
        for (int i = 0; i < s->n_classes && !s->stopping; i++) {
            srv_class *k = &s->classes[i];
            if (!may_unload(k) || now - k->last_used_ms < k->cfg.keep_alive_s * 1000.0) continue;
            kt_model *model;
            kt_engine *engine;
            take_out(k, &model, &engine);
            pthread_mutex_unlock(&s->engine_mu);
            char why[64];
            snprintf(why, sizeof why, "idle for %d s", k->cfg.keep_alive_s);
            pthread_mutex_lock(&s->load_mu);
            unload_parts(s, k, model, engine, why);
            pthread_mutex_unlock(&s->load_mu);
            pthread_mutex_lock(&s->engine_mu);
        }
    }
    pthread_mutex_unlock(&s->engine_mu);
    return NULL;
}

bool srv_classes_start(srv_server *s) {
    bool any = false;
    for (int i = 0; i < s->n_classes; i++) {
        srv_class *k = &s->classes[i];
        k->s = s;
        k->model = k->cfg.lazy ? NULL : k->cfg.model;
        k->state = k->model ? CLASS_READY : CLASS_UNLOADED;
        k->last_used_ms = kt_time_ms();
        if (k->model) { /* what the classes loaded at start hold of the budget */
            kt_engine_stats st;
            kt_engine_get_stats(k->engine, &st);
            k->mem_bytes = k->cfg.load_bytes + st.kv_pool_bytes;
            s->mem_used += k->mem_bytes;
        }
        any |= k->cfg.load && k->cfg.keep_alive_s >= 0;
    }
    if (!any) return true;
    s->keeper_joinable = pthread_create(&s->keeper, NULL, keeper_main, s) == 0;
    return s->keeper_joinable;
}

void srv_classes_stop(srv_server *s) {
    pthread_mutex_lock(&s->engine_mu);
    s->stopping = true;
    pthread_cond_broadcast(&s->keeper_cv);
    pthread_mutex_unlock(&s->engine_mu);
    if (s->keeper_joinable) pthread_join(s->keeper, NULL), s->keeper_joinable = false;
    for (int i = 0; i < s->n_classes; i++) /* a load under way finishes and finds the server stopping */
        if (s->classes[i].loader_joinable) pthread_join(s->classes[i].loader, NULL), s->classes[i].loader_joinable = false;
}
