/*
 * prefix_cache.h - an index over the KV pool's full blocks by the tokens
 * they hold, so a request whose prompt starts like an earlier one reuses
 * that KV instead of computing it again.
 *
 * Why: an agent re-sends its whole history every turn (system prompt,
 * tools, documents, earlier replies). With the index, turn N+1 prefills
 * only what turn N did not already put in the pool.
 *
 * Design: hash-chained blocks. Block i of a sequence is keyed by
 * h_i = XXH64(its block_tokens token ids, seed h_{i-1}) (h_{-1} a
 * constant), so one 64-bit key names the whole prefix up to the block and
 * a lookup is one hash-table probe per block, walking from the start. A
 * radix tree would find the same longest prefix; the chain needs no tree
 * nodes to split. Hits inside a block come from each entry's place on its
 * parent's children list (prefix_cache.c). An entry
 * is trusted only when its own tokens equal the request's and its parent
 * is the block (id and generation) the walk came from, so a hash collision
 * or a reused parent block can never serve KV computed for other tokens.
 *
 * Ownership: the index holds no references. A cached block that no
 * sequence holds sits on the pool's idle list and is taken back, least
 * recently released first, only when no block is free; the pool's
 * eviction hook removes it from the index then (block_pool.h). So memory
 * used by the cache is always reclaimable, and admission's reservations
 * stay exact.
 *
 * Not thread-safe: the engine thread owns it, with the pool.
 */
#ifndef KT_KV_PREFIX_CACHE_H
#define KT_KV_PREFIX_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/block_pool.h"
#include "kv/disk_cache.h"

typedef struct kv_prefix_cache kv_prefix_cache;

/* An empty index over pool's blocks; installs the pool's eviction hook.
 * NULL with err when out of memory. */
kv_prefix_cache *kv_cache_new(kv_pool *pool, kt_error *err);
void kv_cache_free(kv_prefix_cache *c);

/* The longest cached prefix of tokens[0..n) in whole blocks: their ids in
 * blocks[0..returned), at most max_blocks. The blocks are not retained:
 * hand them to kv_seq_share before anything else touches the pool. On a
 * pool with sliding-window layers the prefix also ends where a sequence
 * can resume (kv_pool_window_resume_len), as in kv_cache_acquire. */
int kv_cache_lookup(const kv_prefix_cache *c, const int32_t *tokens, int n, int32_t *blocks, int max_blocks);
typedef struct kv_cache_hit {
    int n_positions; /* prompt positions the returned blocks hold */
    int from_disk;   /* whole blocks read back from the disk tier */
    int state;       /* hybrid models: the snapshot of the state after n_positions (kv_cache_state_data), -1 none */
} kv_cache_hit;

/* The same, going on in the disk tier (if any) where memory has no more:
 * blocks read back are allocated from the pool, indexed, and counted in
 * hit->from_disk. With `partial`, the hit then goes on inside one more
 * block: the cached block (a whole one, or a finished sequence's tail)
 * whose first positions match the most of what is left of tokens[0..n);
 * it is returned after the whole blocks, and hit->n_positions stops
 * inside it (the caller's sequence must copy it before writing: it is
 * cached, and kv_seq_share arranges that). Every block returned is
 * retained once for the caller, who releases it (typically after
 * kv_seq_share). With sliding-window layers, the hit is cut back to the
 * longest length whose window rows are all still there. Returns the
 * number of blocks, at most max_blocks + 1. */
int kv_cache_acquire(kv_prefix_cache *c, const int32_t *tokens, int n, int32_t *blocks, int max_blocks,
                     bool partial, kv_cache_hit *hit);
/* Every block indexed from now on is also written to disk (NULL: none). */
void kv_cache_set_disk(kv_prefix_cache *c, kv_disk *disk);

/* Indexes the full blocks of seq that hold positions [0, n) (n <= seq->len)
 * of tokens, whose KV has been computed. A block whose prefix is already
 * indexed (by itself, or by a twin computed by another sequence) is left
 * as it is. With `with_tail` (the sequence is finished and will never
 * write again) and n == seq->len, a partial last block is indexed too,
 * for hits inside it (unless a cached block already covers its tokens). */
void kv_cache_insert(kv_prefix_cache *c, const kv_seq *seq, const int32_t *tokens, int n, bool with_tail);

/*
 * Hybrid models (Qwen 3.5): a sequence is its attention layers' KV blocks
 * plus one recurrent state (kv/state_pool.h) that cannot go back, so a
 * cached prefix is of use only where a copy of the state at its end was
 * kept. Snapshots are those copies, hung on index entries: a snapshot on
 * a whole block is the state after that block's last position, one on a
 * tail entry the state after the tail. Once states are enabled, lookups
 * and acquires end only where a snapshot hangs (kv_cache_hit.state names
 * it; copy it into the sequence before anything else reserves one).
 * A snapshot leaves with its entry (the block evicted) or, when a new one
 * is wanted and all are taken, least recently hung or hit first. The
 * budget is a fixed number of snapshot slots, made here.
 */
kt_status kv_cache_enable_states(kv_prefix_cache *c, int n_snaps, size_t bytes, kt_error *err);
bool kv_cache_has_states(const kv_prefix_cache *c);
/* A snapshot slot to fill (kv_cache_state_data), evicting the least
 * recently used hung one if none is free; -1 when states are off or
 * every slot is reserved and not yet hung. */
int kv_cache_state_reserve(kv_prefix_cache *c);
float *kv_cache_state_data(const kv_prefix_cache *c, int s);
size_t kv_cache_state_bytes(const kv_prefix_cache *c); /* of one snapshot */
/* Gives back a reserved slot that was not hung (hung ones: no effect). */
void kv_cache_state_release(kv_prefix_cache *c, int s);
/* Hangs reserved slot s, holding the state after tokens[0..n), on the
 * entry standing for that prefix (indexed: kv_cache_insert, with the
 * tail for n off a block boundary). False, and s given back, when there
 * is no such entry or it has a snapshot already (the same state). */
bool kv_cache_state_hang(kv_prefix_cache *c, int s, const int32_t *tokens, int n);
int kv_cache_n_states(const kv_prefix_cache *c);     /* hung now */
int kv_cache_max_states(const kv_prefix_cache *c);   /* slots */
uint64_t kv_cache_n_states_evicted(const kv_prefix_cache *c);

/* Blocks indexed now (held by sequences or idle). */
int kv_cache_n_blocks(const kv_prefix_cache *c);
/* Blocks taken back from the index since it was made. */
uint64_t kv_cache_n_evicted(const kv_prefix_cache *c);

/* Verifies the index against the pool (every entry's block is cached,
 * every cached block has an entry, the table finds each entry, each
 * snapshot and its entry name each other);
 * KT_ERR_INTERNAL naming the first violation. For tests. */
kt_status kv_cache_check(const kv_prefix_cache *c, kt_error *err);

#endif
