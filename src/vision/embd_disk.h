/*
 * embd_disk.h - the encoder cache's disk tier: image embeddings kept in
 * files under the server's --cache-dir, so a screenshot the tower has seen
 * is not encoded again after a restart (or after the memory cache let it
 * go) where its KV is not cached either.
 *
 * One file per image, `images-<tower fingerprint>/<hash>.kve`: a header
 * (magic, version, the tower's fingerprint, the image hash, the count of
 * floats, a checksum of them), then the floats. Written whole and renamed
 * into place (a crash leaves the old file or none); read back only when
 * every field and the checksum agree, otherwise removed (a truncated,
 * hostile or other-tower file is never handed out). Files beyond the byte
 * budget go oldest first. One thread (the engine's) uses it.
 */
#ifndef KT_VISION_EMBD_DISK_H
#define KT_VISION_EMBD_DISK_H

#include <stddef.h>
#include <stdint.h>

#include "kettle.h"
#include "vision/vision.h"

typedef struct kt_embd_disk kt_embd_disk;

typedef struct kt_embd_disk_stats {
    uint64_t reads, writes, rejected, removed;
    size_t bytes, files;
} kt_embd_disk_stats;

/* dir: the cache folder (its images-<fp> subfolder is made); max_bytes:
 * the budget (0: 1 GiB). NULL with err when the folder cannot be made. */
kt_embd_disk *kt_embd_disk_open(const char *dir, const kt_vision *v, size_t max_bytes, kt_error *err);
void kt_embd_disk_close(kt_embd_disk *d);

/* The floats kept for hash (malloc'd, n_floats), or NULL. */
float *kt_embd_disk_get(kt_embd_disk *d, uint64_t hash, size_t n_floats);
/* Keeps them (best effort: a failed write is counted, never an error). */
void kt_embd_disk_put(kt_embd_disk *d, uint64_t hash, const float *embd, size_t n_floats);
kt_embd_disk_stats kt_embd_disk_get_stats(const kt_embd_disk *d);

/* A tower's fingerprint: its tensors' names, types, shapes and samples of
 * their data (another file of the same shapes is another tower), and
 * whether it runs on the AMX tiles (ops/amx.h: other bits than the FMA
 * kernels', so their embeddings, and the KV made from them, are kept
 * apart). */
uint64_t kt_vision_fingerprint(const kt_vision *v);

/* Checks a .kve file's bytes (the fuzz target's entry): true when they
 * are whole and agree with the fingerprint, hash and count. */
bool kt_embd_disk_check(const uint8_t *bytes, size_t n, uint64_t fingerprint, uint64_t hash, size_t n_floats);

#endif
