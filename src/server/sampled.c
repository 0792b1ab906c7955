/*
 * sampled.c - recent replies' sampled ids (see sampled.h).
 *
 * A list, most recently used first, under one mutex. Entries are found by
 * a 64-bit hash of the text and then compared byte for byte; a scan is
 * enough: the list holds a few thousand replies at most, and a request
 * looks up only its assistant messages.
 */
#include "server/sampled.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

typedef struct entry {
    struct entry *prev, *next;
    uint64_t hash;
    char *text;
    size_t len;
    int32_t *ids;
    int n;
} entry;

struct srv_sampled {
    pthread_mutex_t mu;
    entry *head, *tail; /* most / least recently used */
    size_t tokens, max_tokens;
};

srv_sampled *srv_sampled_new(size_t max_tokens) {
    srv_sampled *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    pthread_mutex_init(&m->mu, NULL);
    m->max_tokens = max_tokens;
    return m;
}

static void entry_free(entry *e) {
    free(e->text);
    free(e->ids);
    free(e);
}

void srv_sampled_free(srv_sampled *m) {
    if (!m) return;
    for (entry *e = m->head, *next; e; e = next) next = e->next, entry_free(e);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

static void unlink_entry(srv_sampled *m, entry *e) {
    if (e->prev) e->prev->next = e->next;
    else m->head = e->next;
    if (e->next) e->next->prev = e->prev;
    else m->tail = e->prev;
    m->tokens -= (size_t)e->n;
}

static void push_front(srv_sampled *m, entry *e) {
    e->prev = NULL, e->next = m->head;
    if (m->head) m->head->prev = e;
    else m->tail = e;
    m->head = e;
    m->tokens += (size_t)e->n;
}

/* The entry for text (mu held), or NULL. */
static entry *find(const srv_sampled *m, uint64_t hash, const char *text, size_t len) {
    for (entry *e = m->head; e; e = e->next)
        if (e->hash == hash && e->len == len && memcmp(e->text, text, len) == 0) return e;
    return NULL;
}

void srv_sampled_put(srv_sampled *m, const char *text, size_t len, const int32_t *ids, int n) {
    if (!m || n < 1 || (size_t)n > m->max_tokens) return;
    entry *e = calloc(1, sizeof *e);
    if (e) e->text = malloc(len + 1), e->ids = malloc(sizeof *ids * (size_t)n);
    if (!e || !e->text || !e->ids) {
        if (e) entry_free(e);
        return;
    }
    memcpy(e->text, text, len);
    e->text[len] = 0;
    memcpy(e->ids, ids, sizeof *ids * (size_t)n);
    e->len = len, e->n = n, e->hash = XXH64(text, len, 0);
    pthread_mutex_lock(&m->mu);
    entry *old = find(m, e->hash, text, len);
    if (old) unlink_entry(m, old), entry_free(old); /* the newest sampling wins */
    push_front(m, e);
    while (m->tokens > m->max_tokens) {
        entry *last = m->tail;
        unlink_entry(m, last);
        entry_free(last);
    }
    pthread_mutex_unlock(&m->mu);
}

int srv_sampled_get(srv_sampled *m, const char *text, size_t len, int32_t **ids) {
    *ids = NULL;
    if (!m) return 0;
    uint64_t hash = XXH64(text, len, 0);
    int n = 0;
    pthread_mutex_lock(&m->mu);
    entry *e = find(m, hash, text, len);
    if (e && (*ids = malloc(sizeof **ids * (size_t)e->n))) {
        memcpy(*ids, e->ids, sizeof **ids * (size_t)e->n);
        n = e->n;
        unlink_entry(m, e);
        push_front(m, e);
    }
    pthread_mutex_unlock(&m->mu);
    return n;
}
