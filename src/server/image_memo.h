/*
 * image_memo.h - what the server already knows of an image's bytes: the
 * hash of its preprocessed pixels and its grid, so that a screenshot sent
 * again (a computer-use agent sends its whole history of screenshots each
 * step) is not decoded and resized again.
 *
 * One memo per model class (its vision tower fixes the preprocessing;
 * the server's image limits are fixed at start). Keys are 128-bit XXH3
 * hashes of the compressed bytes with a seed drawn at start, so a client
 * cannot craft two images that share a key offline and make another
 * client's screenshot be taken for its own; a hit gives a deferred prep
 * (image/image.h), whose pixels the engine makes and checks against the
 * hash when its caches miss. Fixed size, the least recently used entry of
 * a set replaced; thread-safe (the HTTP threads share it).
 */
#ifndef KT_SERVER_IMAGE_MEMO_H
#define KT_SERVER_IMAGE_MEMO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct srv_image_memo srv_image_memo;

/* What a decode of the bytes gave. */
typedef struct srv_image_seen {
    uint64_t hash; /* eng_image_hash of the preprocessed pixels */
    int grid_x, grid_y;
} srv_image_seen;

/* A key: the bytes' seeded hash. */
typedef struct srv_image_key {
    uint64_t lo, hi;
} srv_image_key;

srv_image_memo *srv_image_memo_new(void);
void srv_image_memo_free(srv_image_memo *m);
srv_image_key srv_image_memo_key(const srv_image_memo *m, const void *bytes, size_t n_bytes);
/* true with *out filled when the bytes were seen (and counts a hit). */
bool srv_image_memo_get(srv_image_memo *m, srv_image_key key, srv_image_seen *out);
void srv_image_memo_put(srv_image_memo *m, srv_image_key key, const srv_image_seen *seen);
/* Lookups that found the bytes, and those that did not. */
void srv_image_memo_counts(srv_image_memo *m, uint64_t *hits, uint64_t *misses);

#endif
