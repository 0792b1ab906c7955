/*
 * block_pool.h - the paged KV cache's memory: a pool of fixed-size,
 * reference-counted blocks, and per-sequence block tables (kv_seq).
 *
 * Why: the server (issue 5) runs many sequences at once out of one memory
 * budget. Giving each sequence a contiguous n_ctx cache wastes most of it;
 * instead KV lives in blocks of `block_tokens` positions taken from one
 * pool, and a sequence is a table of block ids. Blocks are reference
 * counted so n > 1 choices (fork) and, later, the prefix cache share the
 * prompt's blocks; a shared block is copied before it is written
 * (copy-on-write, only ever needed for a partial last block in practice).
 *
 * Layout (one 64-byte aligned allocation, owned by the pool):
 *
 *     plane (layer, kind)   kind 0 = K, 1 = V; plane index = layer*2 + kind
 *       block b             block_bytes = block_tokens * row_bytes
 *         position p        row_bytes   = kv_row_bytes(type, kv_dim)
 *           values          (F32, F16, or Q8_0 blocks of 32)
 *
 *     addr(b, layer, kind, p) = base + (layer*2 + kind) * plane_bytes
 *                             + b * block_bytes + p * row_bytes
 *     plane_bytes = n_blocks * block_bytes
 *
 * so every address is O(1), one position's K (or V) row of kv_dim values
 * (all KV heads, head after head) is contiguous, and an attention kernel
 * for one layer needs only kv_pool_plane() and the two strides. Block
 * memory is not zeroed: a position holds garbage until it is written.
 *
 * Window layers (Gemma's sliding-window layers, params.window > 0 with
 * params.windowed[layer] set) attend only the last `window` positions,
 * so their planes do not hold a row for every block: they form a second
 * group of planes with n_window_blocks block-sized *window slots*, and a
 * block has a slot only while somebody needs its window rows. The
 * full-context layers' planes come first, in layer order, then the window
 * layers'; a window layer's row of block b is at slot_of(b) * block_bytes
 * in its plane (kv_pool_row translates; kv_seq.slots is the table the
 * attention kernels read). A sequence of len positions holds the slots of
 * its blocks from win_lo on (W4 below), which covers every position the
 * next token attends, plus one block of slack so that a rollback of up to
 * block_tokens positions keeps its window. A slot nobody holds is freed,
 * or, when its block is cached, parked on the window idle list (LRU) so
 * that a prefix-cache hit ending in that block finds its window; slot
 * allocation takes the oldest idle slot when none is free. Hence a
 * cached block may have lost its window: kv_pool_window_covers says
 * whether a hit of a given length can be resumed.
 *
 * Cached blocks (the prefix cache, kv/prefix_cache.c): a block marked
 * cached holds KV that an index can find by its tokens. Its positions are
 * never written again (a sequence that would write one copies it first),
 * and when its last reference goes it is not freed but parked on the idle
 * list, least recently released first, still findable; a hit retains it
 * back. Only when no block is free does alloc take the oldest idle one,
 * and the eviction hook tells the index it is gone. So the only blocks
 * ever taken back are cached blocks that no sequence holds.
 *
 * Invariants (P1-P3 checked by kv_pool_check, S1-S2 by tests/test_kv.c;
 * alloc, release and the kv_seq functions rely on them):
 *   P1  a block is on the free stack iff its refcount is 0 and it is not
 *       cached, and at most once;
 *   P2  n_free == number of blocks on the free stack, n_idle == number on
 *       the idle list, n_used = n_total - n_free - n_idle;
 *   P3  a block is on the idle list iff its refcount is 0 and it is cached;
 *   S1  every block id in a kv_seq table has refcount >= 1 and each table
 *       entry holds one reference, so when kv_seq tables are the only
 *       owners, sum of refcounts == sum of table lengths;
 *   S2  a kv_seq with len positions holds exactly ceil(len / block_tokens)
 *       blocks; position p lives in blocks[p / block_tokens] at offset
 *       p % block_tokens.
 * Window slots (W1-W3 checked by kv_pool_check):
 *   W1  slot_of(b) == s iff owner(s) == b; a slot is free iff it has no
 *       owner, and then it is on the window free stack, once;
 *   W2  a slot with holders is on neither list; one without holders is
 *       on the window idle list iff its owner is cached (else it is free);
 *   W3  counts as P2, for slots;
 *   W4  a kv_seq holds one slot reference for each table entry i >=
 *       win_lo (slots[i] == slot_of(blocks[i])), win_lo <= the first block
 *       the token at position len attends (kv_window_first_block), and
 *       slots[i] == -1 below win_lo.
 *
 * Not thread-safe: one engine thread owns the pool and its sequences.
 */
#ifndef KT_KV_BLOCK_POOL_H
#define KT_KV_BLOCK_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "kettle.h"

/* KV_Q8_0 rows are ggml Q8_0 blocks (32 values: fp16 scale + 32 int8),
 * so kv_dim must be a multiple of 32. */
typedef enum kv_type { KV_F32 = 0, KV_F16 = 1, KV_Q8_0 = 2 } kv_type;
typedef enum kv_kind { KV_K = 0, KV_V = 1 } kv_kind;

typedef struct kv_pool_params {
    int n_blocks;     /* blocks in the pool, >= 1 */
    int block_tokens; /* positions per block, e.g. 16 */
    int n_layer;      /* layers, >= 1 */
    int kv_dim;       /* n_head_kv * head_dim: values per position per K or V */
    kv_type type;     /* element type; the pool only sizes and addresses bytes */
    /* window layers (see above); window 0: none, every layer full */
    int window;              /* positions a window layer's token attends, itself included */
    const uint8_t *windowed; /* n_layer flags (copied by kv_pool_new) */
    int n_window_blocks;     /* window slots, in [1, n_blocks] when some layer is windowed */
    /* hybrid models (kv/state_pool.h): every sequence also owns a slot of
     * state_bytes of recurrent state; n_state_slots of them beside the
     * blocks (state_bytes 0: none) */
    size_t state_bytes;
    int n_state_slots;
} kv_pool_params;

typedef struct kv_pool kv_pool;

/* Bytes of one position's row of kv_dim values of type t; 0 for an
 * unknown type or a kv_dim the type cannot hold (Q8_0: kv_dim % 32). */
size_t kv_row_bytes(kv_type t, int kv_dim);
/* The element type as the kernels name it (KT_F32, F16, Q8_0). */
kt_dtype kv_type_dtype(kv_type t);

/* Allocates the whole pool; NULL with err (KT_ERR_ARG for bad parameters,
 * KT_ERR_NOMEM when the memory is not there) on failure. */
kv_pool *kv_pool_new(const kv_pool_params *params, kt_error *err);
void kv_pool_free(kv_pool *pool);
const kv_pool_params *kv_pool_get_params(const kv_pool *pool);

/* Counters (for /metrics): free (empty), idle (cached, unreferenced,
 * reclaimable) and used (referenced by sequences) blocks. */
int kv_pool_n_total(const kv_pool *pool);
int kv_pool_n_free(const kv_pool *pool);
int kv_pool_n_idle(const kv_pool *pool);
int kv_pool_n_used(const kv_pool *pool);
/* True if n blocks can be allocated now (free or idle), each with a
 * window slot where the pool has window layers. */
bool kv_pool_can_alloc(const kv_pool *pool, int n);

/* ---- window slots ---- */

/* Layers with window planes that pools of p have (0: none: window 0 or
 * no layer flagged). */
int kv_params_n_windowed(const kv_pool_params *p);
/* Bytes of K and V a pool of p holds: blocks of the full layers, slots of
 * the window layers (SIZE_MAX where that overflows). */
size_t kv_params_bytes(const kv_pool_params *p);
/* Window slots one sequence of a pool of p can hold at once when it
 * appends at most `chunk` positions at a time (W4: its next token's
 * window, the slack block, the chunk, the partial blocks at either end);
 * 0 without window layers. What pools are sized and requests reserved by. */
int kv_window_span(const kv_pool_params *p, int chunk);
/* kv_params_bytes of the pool's own parameters. */
size_t kv_pool_bytes(const kv_pool *pool);

/* Layers with window planes (0: the pool has no window group). */
int kv_pool_n_window_layers(const kv_pool *pool);
bool kv_pool_layer_windowed(const kv_pool *pool, int layer);
/* Slot counters, as the block ones (all 0 without window layers). */
int kv_pool_n_window_total(const kv_pool *pool);
int kv_pool_n_window_used(const kv_pool *pool);
/* The first block whose positions the token at position len attends in a
 * window layer: floor(max(0, len + 1 - window) / block_tokens). */
int kv_window_first_block(const kv_pool *pool, int len);
/* Whether block id has its window rows (always true without window
 * layers). */
bool kv_pool_has_window(const kv_pool *pool, int32_t id);
/* Whether a sequence of len positions over blocks[0..ceil(len / bt)) could go on:
 * every block the next token attends in a window layer still has its
 * window rows. */
bool kv_pool_window_covers(const kv_pool *pool, const int32_t *blocks, int len);
/* The longest length <= len that a sequence over blocks[0..) can resume
 * (kv_pool_window_covers): len, or a whole number of blocks, or 0. */
int kv_pool_window_resume_len(const kv_pool *pool, const int32_t *blocks, int len);
/* Gives block id (referenced, without a window) a slot with one holder,
 * the caller; KT_ERR_NOMEM when no slot is free or idle. For loading a
 * block's window rows (the disk cache). */
kt_status kv_pool_window_alloc(kv_pool *pool, int32_t id, kt_error *err);
/* Drops the caller's hold on block id's slot (kv_pool_window_alloc's). */
void kv_pool_window_release(kv_pool *pool, int32_t id);

/* Takes a free block (refcount 1) into *id in O(1), or, when none is
 * free, the least recently released idle cached block (which stops being
 * cached; the eviction hook is told first). KT_ERR_NOMEM with a message
 * when neither exists (the pool is unchanged). */
kt_status kv_pool_alloc(kv_pool *pool, int32_t *id, kt_error *err);
/* refcount += 1; an idle cached block leaves the idle list. KT_ERR_INTERNAL
 * (nothing changed) for an invalid or free block: a bug in the caller. */
kt_status kv_pool_retain(kv_pool *pool, int32_t id, kt_error *err);
/* refcount -= 1; at 0 the block goes back on the free stack, or, if it is
 * cached, to the idle list's newest end (O(1)). KT_ERR_INTERNAL (nothing
 * changed) for an invalid or already free block. */
kt_status kv_pool_release(kv_pool *pool, int32_t id, kt_error *err);

/* Marks a referenced block cached (see above); it stays so until alloc
 * takes it back. */
void kv_pool_mark_cached(kv_pool *pool, int32_t id);
bool kv_pool_is_cached(const kv_pool *pool, int32_t id);
/* Called by alloc with each idle block it takes back, before reusing it. */
void kv_pool_set_evict_hook(kv_pool *pool, void (*evict)(void *ctx, int32_t id), void *ctx);
/* Bumped every time alloc hands the block out: an index entry that names a
 * block with the generation it had can tell that block was reused. */
uint32_t kv_pool_generation(const kv_pool *pool, int32_t id);
/* The block's refcount, or -1 for an invalid id. */
int kv_pool_refcount(const kv_pool *pool, int32_t id);

/* Strides of the layout above. */
size_t kv_pool_row_bytes(const kv_pool *pool);
size_t kv_pool_block_bytes(const kv_pool *pool);
/* Start of the (layer, kind) plane: block b of it is at + b * block_bytes
 * (a window layer's: slot s at + s * block_bytes). */
void *kv_pool_plane(const kv_pool *pool, int layer, kv_kind kind);
/* The row (kv_dim elements) of position `off` of block `id`. No checks:
 * the caller passes ids from a table and in-range layer/off, and for a
 * window layer a block that has its window. */
void *kv_pool_row(const kv_pool *pool, int32_t id, int layer, kv_kind kind, int off);
/* Copies the first n_pos positions of every plane of block src to dst
 * (the window planes where both have slots). */
void kv_pool_copy_block(kv_pool *pool, int32_t dst, int32_t src, int n_pos);

/* Verifies P1 and P2 in O(n_blocks); KT_ERR_INTERNAL naming the first
 * violation. For tests and debugging. */
kt_status kv_pool_check(const kv_pool *pool, kt_error *err);

/* ---- per-sequence block tables ------------------------------------- */

/* Fields are read-only outside block_pool.c. */
typedef struct kv_seq {
    kv_pool *pool;
    int32_t *blocks; /* blocks[i] holds positions [i*bt, (i+1)*bt) */
    int32_t *slots;  /* blocks[i]'s window slot from win_lo on, -1 before (NULL: no window layers) */
    int win_lo;      /* W4 */
    int n_blocks;    /* == ceil(len / block_tokens) (S2) */
    int cap;         /* allocated entries of blocks */
    int len;         /* positions in the sequence */
    int block_tokens; /* the pool's, copied for an inline kv_seq_locate */
    int state_slot;   /* its recurrent-state slot (kv/state_pool.h), -1: the pool has none */
    float *state;     /* that slot's floats: the state after len positions (NULL: none) */
} kv_seq;

typedef struct kv_loc {
    int32_t block; /* block id */
    int off;       /* position inside the block */
} kv_loc;

/* An empty sequence on `pool`; NULL with err on allocation failure (or,
 * on a pool with recurrent state, when every state slot is held). */
kv_seq *kv_seq_new(kv_pool *pool, kt_error *err);
/* Whether the pool's sequences carry recurrent state (a hybrid model):
 * then kv_seq_truncate goes back only to 0 (the state zeroed) and a
 * non-empty prefix is shared only with its state (kv_seq_share_state),
 * since a state cannot be rolled back or found by tokens. */
bool kv_pool_has_state(const kv_pool *pool);
/* The state pool (NULL: none), for its counters. */
struct kv_state_pool *kv_pool_state(const kv_pool *pool);
/* Releases every block of the table and frees the sequence (NULL: no-op). */
void kv_seq_free(kv_seq *seq);

/* Makes positions [len, len + n) writable and sets len += n: copies the
 * partial last block if it is shared (copy-on-write) and allocates new
 * blocks as needed. All or nothing: when the blocks are not there it fails
 * with KT_ERR_NOMEM, naming how many it needed and how many were free, and
 * changes nothing (but the window slots it no longer needs, which it
 * gives back first). */
kt_status kv_seq_append(kv_seq *seq, int n, kt_error *err);
/* An empty sequence takes blocks[0..n_blocks) (each retained; an idle
 * cached block is revived) as its first len positions; n_blocks must be
 * exactly ceil(len / block_tokens). A shared or cached last block is
 * copied before the sequence writes into it. KT_ERR_ARG / KT_ERR_INTERNAL
 * (nothing changed) for a non-empty sequence, a count that does not
 * match, a free block, or window rows that are gone
 * (kv_pool_window_covers). */
kt_status kv_seq_share(kv_seq *seq, const int32_t *blocks, int n_blocks, int len, kt_error *err);
/* kv_seq_share on a pool with recurrent state: state (slot bytes, the
 * state after the len positions: a prefix-cache snapshot) becomes the
 * sequence's; NULL only for len 0. */
kt_status kv_seq_share_state(kv_seq *seq, const int32_t *blocks, int n_blocks, int len, const float *state,
                             kt_error *err);
/* Keeps the first n positions (n >= len: no-op; n < 0 counts as 0) and
 * (on a pool with recurrent state: only n == 0, which zeroes the state;
 * 0 < n < len is KT_ERR_ARG, nothing changed)
 * releases the blocks wholly past them. KT_ERR_ARG (nothing changed) when
 * the window layers no longer hold what position n's token attends: a
 * sequence gives back window rows as it grows, so it can roll back to 0
 * or to any length >= (its length before its last append) - block_tokens. */
kt_status kv_seq_truncate(kv_seq *seq, int n, kt_error *err);
/* kv_seq_truncate on a pool with recurrent state, to any n, for a caller
 * that has already set the sequence's state to the one after n positions
 * (a speculative rollback that replayed the kept tokens). */
kt_status kv_seq_truncate_rewound(kv_seq *seq, int n, kt_error *err);
/* The sequence's state slot takes its spare as its state (kv_state_flip):
 * seq->state follows. No-op without state or spares. */
void kv_seq_state_flip(kv_seq *seq);
/* The spare buffer of seq's state slot (NULL: no state, or no spares). */
float *kv_seq_state_spare(const kv_seq *seq);
/* A new sequence sharing every block of seq (each retained once more); the
 * next write to a shared block copies it. NULL with err on failure. */
kv_seq *kv_seq_fork(const kv_seq *seq, kt_error *err);
/* Makes position pos (< len) private before it is overwritten: if its block
 * is shared, the sequence gets a copy of it (positions before len only).
 * KT_ERR_NOMEM (nothing changed) if no block is free, KT_ERR_ARG if pos is
 * out of range. */
kt_status kv_seq_make_writable(kv_seq *seq, int pos, kt_error *err);

/* Gives back the window slots of the blocks before first_block (kept
 * when that is past what position len attends, W4). For a sequence
 * restored row by row whose window rows start there. */
void kv_seq_window_trim(kv_seq *seq, int first_block);

/* Blocks a sequence of n >= 0 positions needs. */
int kv_blocks_for(const kv_pool *pool, int n);

/* Position -> (block, offset) in O(1); pos must be in [0, len). */
static inline kv_loc kv_seq_locate(const kv_seq *seq, int pos) {
    kv_loc l = {seq->blocks[pos / seq->block_tokens], pos % seq->block_tokens};
    return l;
}

/* The K or V row of position pos (in [0, len)) of the sequence. */
void *kv_seq_row(const kv_seq *seq, int layer, kv_kind kind, int pos);

#endif
