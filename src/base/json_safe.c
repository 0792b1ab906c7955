/*
 * json_safe.c - see json_safe.h.
 */
#include "base/json_safe.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- parsing ---- */

static json_malloc_t inner_malloc;
static _Thread_local bool alloc_failed; /* a jansson allocation of this thread failed */
static pthread_once_t wrap_once = PTHREAD_ONCE_INIT;

static void *noting_malloc(size_t n) {
    void *p = inner_malloc(n);
    if (!p) alloc_failed = true;
    return p;
}

/* Installed once; a thread using jansson meanwhile reads the old or the
 * new function, both of which allocate from the same place. */
static void wrap_allocator(void) {
    json_free_t inner_free;
    json_get_alloc_funcs(&inner_malloc, &inner_free);
    json_set_alloc_funcs(noting_malloc, inner_free);
}

json_t *kt_json_loadb(const char *buf, size_t n, size_t flags, json_error_t *err) {
    pthread_once(&wrap_once, wrap_allocator);
    alloc_failed = false;
    json_t *j = json_loadb(buf, n, flags, err);
    if (!alloc_failed) return j;
    json_decref(j); /* it may hold text with bytes missing */
    if (err) {
        memset(err, 0, sizeof *err);
        err->line = err->column = -1;
        snprintf(err->source, sizeof err->source, "<buffer>");
        snprintf(err->text, sizeof err->text, "out of memory");
        err->text[JSON_ERROR_TEXT_LENGTH - 1] = (char)json_error_out_of_memory; /* what json_error_code reads */
    }
    return NULL;
}

json_t *kt_json_loads(const char *s, size_t flags, json_error_t *err) {
    return kt_json_loadb(s, strlen(s), flags, err);
}

/* ---- dumping ---- */

typedef struct dump_buf {
    char *p;
    size_t len, cap;
    bool failed; /* a piece was lost: jansson may not say so (a key) */
} dump_buf;

static bool reserve(dump_buf *b, size_t n) {
    if (b->len + n + 1 <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return false;
    b->p = p, b->cap = cap;
    return true;
}

static int add(const char *s, size_t n, void *data) {
    dump_buf *b = data;
    if (b->failed || !reserve(b, n)) return b->failed = true, -1;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    return 0;
}

char *kt_json_dumps(const json_t *j, size_t flags) {
    dump_buf b = {0};
    if (!j || json_dump_callback(j, add, &b, flags) != 0 || b.failed || !reserve(&b, 0)) {
        free(b.p);
        return NULL;
    }
    b.p[b.len] = 0;
    return b.p;
}
