/*
 * results.c - the exact-result cache (see results.h): a list of stored
 * answers, most recently used first, under one mutex; found by a 128-bit
 * key (XXH3) that a scan compares. N is small (hundreds), and a lookup is
 * once per request.
 */
#include "server/results.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

typedef struct entry {
    struct entry *prev, *next;
    srv_result_key key;
    srv_result r;
} entry;

struct srv_results {
    pthread_mutex_t mu;
    entry *head, *tail;
    int n, max;
    uint64_t hits;
};

srv_results *srv_results_new(int max_entries) {
    srv_results *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    pthread_mutex_init(&c->mu, NULL);
    c->max = max_entries;
    return c;
}

void srv_result_clear(srv_result *r) {
    for (int i = 0; i < r->n_choices; i++) free(r->text[i]);
    memset(r, 0, sizeof *r);
}

static void unlink_entry(srv_results *c, entry *e) {
    if (e->prev) e->prev->next = e->next;
    else c->head = e->next;
    if (e->next) e->next->prev = e->prev;
    else c->tail = e->prev;
    c->n--;
}

static void push_front(srv_results *c, entry *e) {
    e->prev = NULL, e->next = c->head;
    if (c->head) c->head->prev = e;
    else c->tail = e;
    c->head = e;
    c->n++;
}

void srv_results_free(srv_results *c) {
    if (!c) return;
    for (entry *e = c->head, *next; e; e = next) next = e->next, srv_result_clear(&e->r), free(e);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

bool srv_result_cacheable(const srv_gen_req *g) {
    return (g->sampling.temperature <= 0.0f || g->seed_given) && g->top_logprobs < 0;
}

srv_result_key srv_result_key_of(const srv_gen_req *g, const int32_t *ids, int n) {
    XXH3_state_t *st = XXH3_createState();
    if (!st) return (srv_result_key){0, 0};
    XXH3_128bits_reset(st);
    /* every field that changes the answer; each with its size, so no two
     * different requests hash the same bytes */
    const int32_t head[6] = {(int32_t)g->kind, n, g->max_tokens, g->n_choices, g->n_stop, g->n_logit_bias};
    XXH3_128bits_update(st, head, sizeof head);
    XXH3_128bits_update(st, ids, sizeof *ids * (size_t)n);
    const kt_sampler_params *sp = &g->sampling;
    const float f[7] = {sp->temperature, sp->top_p, sp->min_p, sp->repeat_penalty, sp->frequency_penalty,
                        sp->presence_penalty, (float)sp->top_k};
    XXH3_128bits_update(st, f, sizeof f);
    const uint64_t seed = sp->temperature > 0.0f ? sp->seed : 0; /* greedy ignores it */
    XXH3_128bits_update(st, &seed, sizeof seed);
    const uint8_t ign = g->ignore_eos;
    XXH3_128bits_update(st, &ign, 1);
    for (int i = 0; i < g->n_stop; i++) {
        const uint64_t len = strlen(g->stop[i]);
        XXH3_128bits_update(st, &len, sizeof len);
        XXH3_128bits_update(st, g->stop[i], len);
    }
    for (int i = 0; i < g->n_logit_bias; i++) XXH3_128bits_update(st, &g->logit_bias[i], sizeof g->logit_bias[i]);
    if (g->grammar) XXH3_128bits_update(st, g->grammar, strlen(g->grammar) + 1); /* "" and none differ: the NUL */
    /* tools: their grammars, and how the reply is parsed */
    const kt_tool_grammar *tg = &g->tools_grammar;
    const int32_t tools[5] = {(int32_t)g->tool_choice, tg->n_triggers, tg->max_calls, g->reasoning_split,
                              (int32_t)g->think};
    XXH3_128bits_update(st, tools, sizeof tools);
    if (tg->grammar) XXH3_128bits_update(st, tg->grammar, strlen(tg->grammar) + 1);
    for (int i = 0; i < tg->n_triggers; i++) {
        XXH3_128bits_update(st, tg->triggers[i], strlen(tg->triggers[i]) + 1);
        XXH3_128bits_update(st, tg->trigger_grammars[i], strlen(tg->trigger_grammars[i]) + 1);
    }
    const char *fmt = g->format ? kt_tool_format_name(g->format) : "";
    XXH3_128bits_update(st, fmt, strlen(fmt) + 1);
    XXH128_hash_t h = XXH3_128bits_digest(st);
    XXH3_freeState(st);
    return (srv_result_key){h.low64, h.high64};
}

static bool copy_result(const srv_result *from, srv_result *to) {
    memset(to, 0, sizeof *to);
    to->usage = from->usage;
    for (int i = 0; i < from->n_choices; i++) {
        if (!(to->text[i] = malloc(from->len[i] + 1))) {
            srv_result_clear(to);
            return false;
        }
        memcpy(to->text[i], from->text[i], from->len[i] + 1);
        to->len[i] = from->len[i], to->finish[i] = from->finish[i];
        to->stop_string[i] = from->stop_string[i];
        to->n_choices = i + 1;
    }
    return true;
}

static entry *find(srv_results *c, srv_result_key key) {
    for (entry *e = c->head; e; e = e->next)
        if (e->key.lo == key.lo && e->key.hi == key.hi) return e;
    return NULL;
}

bool srv_results_get(srv_results *c, srv_result_key key, srv_result *out) {
    pthread_mutex_lock(&c->mu);
    entry *e = find(c, key);
    bool ok = e && copy_result(&e->r, out);
    if (ok) {
        unlink_entry(c, e);
        push_front(c, e);
        c->hits++;
    }
    pthread_mutex_unlock(&c->mu);
    return ok;
}

void srv_results_put(srv_results *c, srv_result_key key, const srv_reply *rp, const kt_request_usage *u) {
    srv_result r = {.usage = *u};
    for (int i = 0; i < rp->n_choices; i++)
        if (rp->choices[i].finish != KT_FINISH_STOP && rp->choices[i].finish != KT_FINISH_LENGTH) return;
    srv_result tmp = {.n_choices = rp->n_choices, .usage = *u};
    for (int i = 0; i < rp->n_choices; i++) {
        tmp.text[i] = rp->choices[i].text ? rp->choices[i].text : (char *)"";
        tmp.len[i] = rp->choices[i].len, tmp.finish[i] = rp->choices[i].finish;
        tmp.stop_string[i] = rp->choices[i].stop_string;
    }
    entry *e = calloc(1, sizeof *e);
    if (!e || !copy_result(&tmp, &r)) {
        free(e);
        return;
    }
    e->key = key, e->r = r;
    pthread_mutex_lock(&c->mu);
    entry *old = find(c, key);
    if (old) unlink_entry(c, old), srv_result_clear(&old->r), free(old);
    push_front(c, e);
    while (c->n > c->max) {
        entry *last = c->tail;
        unlink_entry(c, last);
        srv_result_clear(&last->r);
        free(last);
    }
    pthread_mutex_unlock(&c->mu);
}

uint64_t srv_results_hits(srv_results *c) {
    pthread_mutex_lock(&c->mu);
    uint64_t h = c->hits;
    pthread_mutex_unlock(&c->mu);
    return h;
}
