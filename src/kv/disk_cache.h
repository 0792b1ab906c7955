/*
 * disk_cache.h - the prefix cache's disk tier: cached KV blocks written to
 * files, found again by the tokens of their prefix, also after a restart.
 *
 * Why: an agent's context (system prompt, tools, documents, the turns so
 * far) outlives one server process, and the memory budget. Every block
 * the in-memory index takes in (prefix_cache.h) is also written here once,
 * by a thread of its own; a lookup that runs out of memory hits goes on
 * here, and blocks read back become ordinary cached blocks.
 *
 * Files: DIR/<model fingerprint>/<prefix key>.kvb, one block each. The
 * prefix key is a 128-bit hash chain over the token ids (XXH3-128 of the
 * parent's key and the block's ids), so a name stands for the whole prefix
 * up to the block. A file holds its key, its parent's key, its token ids,
 * the block's K and V rows of every layer and an XXH3-64 checksum of all
 * that; it is loaded only if its size, magic, version, fingerprint, keys,
 * token ids and checksum all match what the lookup expects. Anything else
 * (another model, another KV type, a truncated or flipped file) is
 * skipped, removed and counted, never loaded. Writes go to a temporary
 * name, are fsynced and renamed: a kill -9 at any moment leaves either a
 * whole file or a temporary that the next start removes.
 *
 * Size: at most max_bytes of block files; past that the least recently
 * used (written or read) go first. Without a directory nothing here is
 * made and nothing touches the disk.
 *
 * Threading: kv_disk_put and kv_disk_get run on the engine thread; the
 * writer thread does the writing and the removals; the index of files is
 * shared under a mutex.
 */
#ifndef KT_KV_DISK_CACHE_H
#define KT_KV_DISK_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/block_pool.h"

typedef struct kv_disk kv_disk;

/* The 128-bit chain key of a prefix (see above). */
typedef struct kv_disk_key {
    uint64_t lo, hi;
} kv_disk_key;

/* The key of the first block's parent (no parent). */
kv_disk_key kv_disk_root(void);
/* The key of a block of block_tokens ids after a prefix with key parent. */
kv_disk_key kv_disk_chain(kv_disk_key parent, const int32_t *ids, int block_tokens);

/* Opens (creating) dir/<fingerprint>: removes temporaries a killed run
 * left, indexes the block files there (oldest use first, by mtime) and
 * starts the writer. fingerprint names the model and KV layout (see
 * kv_disk_fingerprint_*). NULL with err when dir cannot be made or
 * written (the message says which path and why). */
kv_disk *kv_disk_open(const char *dir, size_t max_bytes, uint64_t fingerprint, const kv_pool_params *layout,
                      kt_error *err);
/* Finishes the writes queued so far, stops the writer, frees. */
void kv_disk_close(kv_disk *d);

/* Queues block `id` of pool (its KV is copied now) to be written as the
 * prefix key, after parent, holding ids. Already on disk, or the queue
 * full: nothing (counted). */
void kv_disk_put(kv_disk *d, const kv_pool *pool, int32_t id, kv_disk_key key, kv_disk_key parent,
                 const int32_t *ids);
/* True if a file for key is indexed (it may still fail to load). */
bool kv_disk_has(kv_disk *d, kv_disk_key key);
/* Reads the file of key into block id of pool, after checking it is the
 * block of ids after parent; false (the file removed if it was bad) when
 * there is no such file or it does not check. The sliding-window layers'
 * rows, where the file has them and the pool a window slot, come with a
 * slot the caller holds: kv_pool_window_release it once the block is
 * cached (or released). */
bool kv_disk_get(kv_disk *d, kv_pool *pool, int32_t id, kv_disk_key key, kv_disk_key parent, const int32_t *ids);

/* Hybrid models (the layout's state_bytes): the recurrent-state snapshot
 * after the block whose key is `block`, written as a file of its own
 * (queued as kv_disk_put; state is copied now). has / get: whether a
 * file for it is indexed; read it into out (state_bytes), checked (size,
 * magic, fingerprint, key, checksum; a bad one is removed and counted),
 * false on a miss. */
void kv_disk_put_state(kv_disk *d, kv_disk_key block, const void *state);
bool kv_disk_has_state(kv_disk *d, kv_disk_key block);
bool kv_disk_get_state(kv_disk *d, kv_disk_key block, void *out);
/* The key a block's state file is indexed by. */
kv_disk_key kv_disk_state_key(kv_disk_key block);
/* Whether the n bytes of a state file check (the reader's check, apart
 * for fuzzing). */
bool kv_disk_check_state(const uint8_t *bytes, size_t n, uint64_t fingerprint, kv_disk_key key, size_t state_bytes);

typedef struct kv_disk_stats {
    uint64_t files, bytes;       /* on disk now */
    uint64_t writes, reads;      /* blocks written, blocks read back */
    uint64_t rejected;           /* files skipped and removed: bad size, checksum, keys, model */
    uint64_t removed;            /* removed to stay under the size limit */
    uint64_t dropped;            /* writes not queued: the writer was behind */
    uint64_t write_errors;       /* writes that failed (disk full, ...) */
} kv_disk_stats;

/* What a block file must say to be loaded: the cache's layout and the
 * lookup's key, parent and ids (block_tokens of them). */
typedef struct kv_disk_expect {
    uint64_t fingerprint;
    uint32_t block_tokens, n_layer, row_bytes, kv_type, n_win_layers;
    size_t file_bytes, file_bytes_nowin; /* with / without the window layers' rows */
    kv_disk_key key, parent;
    const int32_t *ids;
} kv_disk_expect;

/* Whether the n bytes of a block file check against x (size, magic,
 * version, layout, fingerprint, keys, ids, checksum); *windows: whether
 * they hold the window layers' rows. Reads nothing past bytes + n. The
 * file reader's check, apart so that it can be fuzzed from a buffer
 * (tests/fuzz/fuzz_disk_cache.c). */
bool kv_disk_check_block(const uint8_t *bytes, size_t n, const kv_disk_expect *x, bool *windows);

void kv_disk_get_stats(kv_disk *d, kv_disk_stats *out);
/* Waits until every queued write is done (tests, shutdown). */
void kv_disk_flush(kv_disk *d);

#endif
