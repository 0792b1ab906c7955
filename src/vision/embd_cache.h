/*
 * embd_cache.h - image embeddings kept by the hash of the image.
 *
 * An agent sends the same screenshot again and again (it stays in the
 * history): the vision tower is the most expensive thing an image costs,
 * so its output is kept, keyed by the image's hash (kt_image_hash: the
 * preprocessed pixels and the preprocessing parameters, so one changed
 * pixel is another key). Least recently used entries leave first when the
 * byte budget is exceeded; an entry a request is reading is pinned and
 * never leaves under it. One thread (the engine's) uses a cache.
 */
#ifndef KT_VISION_EMBD_CACHE_H
#define KT_VISION_EMBD_CACHE_H

#include <stddef.h>
#include <stdint.h>

typedef struct kt_embd_cache kt_embd_cache;

typedef struct kt_embd_cache_stats {
    uint64_t hits, misses, evicted;
    size_t bytes, n_entries;
} kt_embd_cache_stats;

/* max_bytes: the budget (0: nothing kept beyond the pinned). */
kt_embd_cache *kt_embd_cache_new(size_t max_bytes);
void kt_embd_cache_free(kt_embd_cache *c);

/* The entry's floats, pinned (kt_embd_cache_unpin when done), or NULL
 * (counted as a miss). n_floats must match what was put. */
const float *kt_embd_cache_get(kt_embd_cache *c, uint64_t hash, size_t n_floats);
/* Takes `embd` (malloc'd, n_floats) as the entry for hash, pinned; NULL
 * when out of memory (embd is freed). An entry already there is kept and
 * embd freed. */
const float *kt_embd_cache_put(kt_embd_cache *c, uint64_t hash, float *embd, size_t n_floats);
void kt_embd_cache_unpin(kt_embd_cache *c, uint64_t hash);
kt_embd_cache_stats kt_embd_cache_get_stats(const kt_embd_cache *c);

#endif
