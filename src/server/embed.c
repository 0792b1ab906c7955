/*
 * embed.c - POST /v1/embeddings: OpenAI's embeddings API on the engine's
 * embedding requests (kt_gen_params.embed).
 *
 * Each input (a string, an array of strings, an array of token ids or an
 * array of such arrays) is one engine request, all submitted at once so
 * they prefill side by side in the running batch; the connection is
 * suspended until every one has finished. A vector is the model's pooling
 * of its tokens' last hidden states (the file's pooling_type, or the one
 * --embeddings chose for a generative model), L2-normalized as OpenAI's
 * are, sent as floats or as base64 of little-endian float32 (what the
 * openai npm package asks for by default). A server whose model has no
 * pooling, started without --embeddings, answers 400 saying how to start
 * it; so does a reranker (pooling "rank").
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "server/http_internal.h"

#define INVALID "invalid_request_error"
#define MAX_INPUTS 256

struct srv_embed {
    int n;
    kt_request *reqs[MAX_INPUTS];
    int n_tokens[MAX_INPUTS];
    bool done[MAX_INPUTS];
    bool base64;
};

/* ---- the inputs as token ids ---- */

/* One input's ids (malloc'ed) into *ids; its count, or -1 with e filled. */
static int input_ids(const kt_model *m, json_t *in, size_t i, int32_t **ids, srv_error *e) {
    const int n_vocab = kt_model_describe(m)->n_vocab;
    if (json_is_string(in)) {
        size_t len = json_string_length(in), cap = len + 8;
        if (!len) return srv_fail(e, 400, INVALID, "input", NULL, "'input[%zu]' is empty", i), -1;
        if (!(*ids = malloc(sizeof **ids * cap))) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory"), -1;
        kt_error err = {0};
        int n = kt_tokenize(m, json_string_value(in), len, *ids, (int)cap, true, &err);
        if (n < 0) return srv_fail(e, 400, INVALID, "input", NULL, "'input[%zu]': %s", i, err.msg), -1;
        return n;
    }
    size_t n = json_array_size(in);
    if (!json_is_array(in) || !n)
        return srv_fail(e, 400, INVALID, "input", NULL, "'input[%zu]' must be a non-empty string or array of token ids", i), -1;
    if (!(*ids = malloc(sizeof **ids * n))) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory"), -1;
    for (size_t k = 0; k < n; k++) {
        json_t *t = json_array_get(in, k);
        json_int_t v = json_is_integer(t) ? json_integer_value(t) : -1;
        if (v < 0 || v >= n_vocab)
            return srv_fail(e, 400, INVALID, "input", NULL, "'input[%zu][%zu]' is not a token id in [0, %d)", i, k, n_vocab), -1;
        (*ids)[k] = (int32_t)v;
    }
    return (int)n;
}

/* The body's input as a list of inputs (new reference): a string or one
 * array of ids is a list of one. */
static json_t *inputs_of(json_t *body, srv_error *e) {
    json_t *in = json_object_get(body, "input");
    if (!in || json_is_null(in)) return srv_fail(e, 400, INVALID, "input", NULL, "'input' is required"), NULL;
    if (json_is_string(in) || (json_is_array(in) && json_is_integer(json_array_get(in, 0))))
        return json_pack("[O]", in);
    if (!json_is_array(in) || !json_array_size(in))
        return srv_fail(e, 400, INVALID, "input", NULL, "'input' must be a string, an array of strings or of token ids"),
               NULL;
    if (json_array_size(in) > MAX_INPUTS)
        return srv_fail(e, 400, INVALID, "input", NULL, "'input' has %zu entries; at most %d are allowed",
                        json_array_size(in), MAX_INPUTS),
               NULL;
    return json_incref(in);
}

/* model, encoding_format, dimensions, user; anything else is refused. */
static bool check_fields(srv_conn *c, json_t *body, srv_error *e) {
    const int n_embd = kt_model_describe(c->cls->model)->n_embd;
    const char *k;
    json_t *v;
    json_object_foreach(body, k, v) {
        if (!strcmp(k, "input") || !strcmp(k, "user") || !strcmp(k, "model") || json_is_null(v)) continue;
        if (!strcmp(k, "encoding_format")) {
            const char *f = json_string_value(v);
            if (!f || (strcmp(f, "float") && strcmp(f, "base64")))
                return srv_fail(e, 400, INVALID, k, NULL, "'encoding_format' must be \"float\" or \"base64\"");
            c->embed->base64 = !strcmp(f, "base64");
        } else if (!strcmp(k, "dimensions")) {
            if (json_integer_value(v) != n_embd || !json_is_integer(v))
                return srv_fail(e, 400, INVALID, k, "unsupported_parameter",
                                "'dimensions': this model's embeddings have %d dimensions and cannot be shortened", n_embd);
        } else {
            return srv_fail(e, 400, INVALID, k, "unsupported_parameter",
                            "'%.60s' is not a parameter kettle implements for /v1/embeddings; remove it", k);
        }
    }
    return true;
}

/* ---- submitting ---- */

static bool submit_one(srv_conn *c, const int32_t *ids, int n, srv_error *e) {
    srv_server *s = c->s;
    kt_gen_params p = kt_gen_defaults();
    p.prompt = ids, p.n_prompt = n, p.embed = c->cls->cfg.embed_pooling;
    p.notify = srv_link_notify, p.notify_ctx = c->link, p.client_gone = srv_link_client_gone;
    kt_error err = {0};
    kt_gen_field field = KT_FIELD_NONE;
    kt_request **slot = &c->embed->reqs[c->embed->n];
    pthread_mutex_lock(&s->engine_mu);
    kt_status st = c->cls->engine ? kt_engine_submit_ex(c->cls->engine, &p, slot, &err, &field)
                             : kt_error_set(&err, KT_ERR_BUSY, "the server is shutting down");
    pthread_mutex_unlock(&s->engine_mu);
    if (st != KT_OK) {
        srv_submit_error(&err, field, SRV_CHAT, e);
        if (field == KT_FIELD_PROMPT) snprintf(e->param, sizeof e->param, "input");
        return false;
    }
    c->embed->n_tokens[c->embed->n++] = n;
    return true;
}

/* Why this server cannot embed, or NULL. */
static const char *cannot_embed(const srv_class *k) {
    if (kt_model_describe(k->model)->pooling_type == 4)
        return "this model is a reranker (pooling \"rank\"): it scores pairs and makes no embeddings";
    if (k->cfg.embed_pooling == KT_POOL_NONE)
        return "this model is a text generator (its file declares no pooling); start kettle serve with "
               "--embeddings to embed with the mean of its last hidden states";
    return NULL;
}

static bool start(srv_conn *c, srv_error *e) {
    const char *why = cannot_embed(c->cls);
    if (why) return srv_fail(e, 400, INVALID, "model", "model_cannot_embed", "%s", why);
    if (!(c->embed = calloc(1, sizeof *c->embed))) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    json_t *inputs = NULL;
    bool ok = check_fields(c, c->json, e) && (inputs = inputs_of(c->json, e));
    if (ok && !c->link && !(c->link = srv_link_acquire(c->s, c->mc)))
        ok = srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    size_t i;
    json_t *in;
    json_array_foreach(inputs, i, in) {
        if (!ok) break;
        int32_t *ids = NULL;
        int n = input_ids(c->cls->model, in, i, &ids, e);
        ok = n > 0 && submit_one(c, ids, n, e);
        free(ids);
    }
    json_decref(inputs);
    return ok;
}

/* ---- the answer ---- */

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* The bytes as base64 text (json string); NULL if out of memory. */
static json_t *base64(const unsigned char *p, size_t n) {
    char *out = malloc((n + 2) / 3 * 4 + 1), *o = out;
    if (!out) return NULL;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)p[i] << 16 | (i + 1 < n ? (unsigned)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        *o++ = B64[v >> 18 & 63], *o++ = B64[v >> 12 & 63];
        *o++ = i + 1 < n ? B64[v >> 6 & 63] : '=';
        *o++ = i + 2 < n ? B64[v & 63] : '=';
    }
    *o = 0;
    json_t *s = json_string(out);
    free(out);
    return s;
}

/* The vector, unit length, in the asked encoding. */
static json_t *vector_json(const float *v, int n, bool b64) {
    double norm = 0;
    for (int i = 0; i < n; i++) norm += (double)v[i] * v[i];
    const float scale = norm > 0 ? (float)(1.0 / sqrt(norm)) : 0.0f;
    float *u = malloc(sizeof *u * (size_t)n);
    if (!u) return NULL;
    for (int i = 0; i < n; i++) u[i] = v[i] * scale;
    json_t *j = NULL;
    if (b64) { /* little-endian float32, as numpy's frombuffer reads it (x86 and arm64 are little-endian) */
        j = base64((const unsigned char *)u, sizeof *u * (size_t)n);
    } else if ((j = json_array())) {
        for (int i = 0; i < n; i++)
            if (json_array_append_new(j, json_real(u[i]))) {
                json_decref(j), j = NULL;
                break;
            }
    }
    free(u);
    return j;
}

static enum MHD_Result answer(srv_conn *c) {
    srv_error e;
    srv_embed *em = c->embed;
    json_t *data = json_array();
    int tokens = 0;
    for (int i = 0; data && i < em->n; i++) {
        int n = 0;
        const float *v = kt_request_embedding(em->reqs[i], &n);
        if (!v) {
            json_decref(data);
            return srv_fail(&e, 500, "server_error", NULL, NULL, "input %d could not be embedded (the engine stopped it)", i),
                   srv_respond_error(c, &e);
        }
        json_t *item = json_pack("{s:s, s:i, s:o}", "object", "embedding", "index", i, "embedding",
                                 vector_json(v, n, em->base64));
        if (!item || json_array_append_new(data, item)) json_decref(data), data = NULL;
        tokens += em->n_tokens[i];
    }
    json_t *j = data ? json_pack("{s:s, s:o, s:s, s:{s:i, s:i}}", "object", "list", "data", data, "model", srv_reply_name(c->cls, c->json),
                                 "usage", "prompt_tokens", tokens, "total_tokens", tokens)
                     : NULL;
    return srv_respond_json(c, 200, j);
}

/* Reads what came; true when every input is done. */
static bool all_done(srv_embed *em) {
    bool all = true;
    for (int i = 0; i < em->n; i++) {
        kt_event ev;
        int r = 1;
        while (!em->done[i] && (r = kt_request_poll(em->reqs[i], &ev)) == 1) {}
        em->done[i] = em->done[i] || r < 0;
        all = all && em->done[i];
    }
    return all;
}

static enum MHD_Result begin(srv_conn *c) {
    srv_error e;
    if (!start(c, &e)) return srv_respond_error(c, &e);
    return srv_embed_continue(c);
}

enum MHD_Result srv_embed_continue(srv_conn *c) {
    srv_error e;
    if (c->waiting_class) return srv_class_gate(c, begin);
    for (;;) {
        srv_link_arm(c->link);
        if (all_done(c->embed)) return answer(c);
        srv_wait w = srv_link_suspend(c->link);
        if (w == WAIT_SUSPENDED) return MHD_YES;
        if (w == WAIT_SHUTDOWN)
            return srv_fail(&e, 503, "server_error", NULL, NULL, "the server is shutting down"), srv_respond_error(c, &e);
    }
}

enum MHD_Result srv_embed_start(srv_conn *c) {
    srv_error e;
    c->started = true;
    if (!(c->json = srv_parse_body(c, &e)) || !(c->cls = srv_route(c->s, c->json, &e))) return srv_respond_error(c, &e);
    return srv_class_gate(c, begin);
}

void srv_embed_release(srv_conn *c) {
    srv_embed *em = c->embed;
    if (!em) return;
    for (int i = 0; i < em->n; i++) kt_request_free(em->reqs[i]); /* cancels the unfinished */
    free(em);
    c->embed = NULL;
}
