/*
 * image_memo.c - the images the server has decoded (see image_memo.h).
 *
 * A set-associative table: a key's set is chosen by its low bits, and
 * within the set's MEMO_WAYS entries the least recently used one (the
 * oldest stamp) gives way. 2048 entries of 40 bytes: far more screenshots
 * than any session's history holds, and a lookup touches one set under
 * the mutex.
 */
#include "server/image_memo.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#define MEMO_SETS 256 /* a power of two */
#define MEMO_WAYS 8

typedef struct memo_entry {
    srv_image_key key;
    srv_image_seen seen;
    uint64_t stamp; /* 0: empty */
} memo_entry;

struct srv_image_memo {
    pthread_mutex_t mu;
    uint64_t seed, clock, hits, misses;
    memo_entry sets[MEMO_SETS][MEMO_WAYS];
};

/* The seed: the system's entropy, or (none readable) the clock and the
 * table's address, still unknown to a client. */
static uint64_t draw_seed(const void *m) {
    uint64_t s = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    const bool ok = f && fread(&s, sizeof s, 1, f) == 1;
    if (f) fclose(f);
    if (!ok) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        s = ((uint64_t)ts.tv_nsec * 6364136223846793005ull) ^ (uint64_t)(uintptr_t)m ^ (uint64_t)ts.tv_sec;
    }
    return s;
}

srv_image_memo *srv_image_memo_new(void) {
    srv_image_memo *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    pthread_mutex_init(&m->mu, NULL);
    m->seed = draw_seed(m);
    return m;
}

void srv_image_memo_free(srv_image_memo *m) {
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

srv_image_key srv_image_memo_key(const srv_image_memo *m, const void *bytes, size_t n_bytes) {
    const XXH128_hash_t h = XXH3_128bits_withSeed(bytes, n_bytes, m->seed);
    return (srv_image_key){.lo = h.low64, .hi = h.high64};
}

static bool same_key(srv_image_key a, srv_image_key b) { return a.lo == b.lo && a.hi == b.hi; }

static memo_entry *set_of(srv_image_memo *m, srv_image_key key) { return m->sets[key.lo & (MEMO_SETS - 1)]; }

bool srv_image_memo_get(srv_image_memo *m, srv_image_key key, srv_image_seen *out) {
    bool found = false;
    pthread_mutex_lock(&m->mu);
    memo_entry *set = set_of(m, key);
    for (int w = 0; w < MEMO_WAYS && !found; w++)
        if (set[w].stamp && same_key(set[w].key, key)) {
            set[w].stamp = ++m->clock;
            *out = set[w].seen;
            found = true;
        }
    if (found) m->hits++;
    else m->misses++;
    pthread_mutex_unlock(&m->mu);
    return found;
}

void srv_image_memo_put(srv_image_memo *m, srv_image_key key, const srv_image_seen *seen) {
    pthread_mutex_lock(&m->mu);
    memo_entry *set = set_of(m, key), *victim = &set[0];
    for (int w = 0; w < MEMO_WAYS; w++) {
        if (set[w].stamp && same_key(set[w].key, key)) { /* two requests decoded it at once */
            victim = &set[w];
            break;
        }
        if (set[w].stamp < victim->stamp) victim = &set[w]; /* an empty entry (0) first */
    }
    *victim = (memo_entry){.key = key, .seen = *seen, .stamp = ++m->clock};
    pthread_mutex_unlock(&m->mu);
}

void srv_image_memo_counts(srv_image_memo *m, uint64_t *hits, uint64_t *misses) {
    pthread_mutex_lock(&m->mu);
    *hits = m->hits, *misses = m->misses;
    pthread_mutex_unlock(&m->mu);
}
