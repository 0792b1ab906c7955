/*
 * state_pool.h - fixed-size recurrent state per sequence, beside the
 * paged KV pool (hybrid models: Qwen 3.5's Gated DeltaNet layers).
 *
 * A recurrent layer does not keep a row per position: it keeps one state
 * (its convolution's last inputs and the DeltaNet state matrices) that
 * every token updates. So a sequence of a hybrid model is its block table
 * (the attention layers' KV) plus one state *slot*, which holds the state
 * after the sequence's len positions. The slots are sized when the pool is
 * made (n_slots x slot_bytes, from the number of sequences that may run at
 * once) and handed out by kv_seq_new (block_pool.c), one per sequence,
 * zeroed; kv_seq_free gives it back, kv_seq_fork copies it.
 *
 * What a slot cannot do is go back: a state after len positions says
 * nothing about the state after fewer. So on a pool with state, kv_seq
 * refuses what would need that (truncating to 0 < n < len, sharing cached
 * blocks into a sequence): a caller that gets KV without its state would
 * compute wrong results, silently.
 *
 * Spares (speculation): a verify pass moves a sequence's state on by
 * tokens that may be rejected, so it writes the state after them into the
 * slot's spare buffer and leaves the state before them untouched; then
 * kv_state_flip makes the spare the slot's state (a pointer swap, no
 * copy), and a rollback flips back and replays the kept tokens (see
 * engine/rewind.h).
 *
 * Not thread-safe: one engine thread owns it (as the block pool).
 */
#ifndef KT_KV_STATE_POOL_H
#define KT_KV_STATE_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "kettle.h"

typedef struct kv_state_pool kv_state_pool;

/* n_slots slots of slot_bytes (a multiple of sizeof(float)); NULL with
 * err (KT_ERR_NOMEM naming the bytes and what to lower) on failure. */
kv_state_pool *kv_state_pool_new(int n_slots, size_t slot_bytes, kt_error *err);
void kv_state_pool_free(kv_state_pool *sp);

int kv_state_n_slots(const kv_state_pool *sp);
int kv_state_n_free(const kv_state_pool *sp);
size_t kv_state_slot_bytes(const kv_state_pool *sp);

/* A free slot, zeroed (the state of an empty sequence), or -1 with err
 * (KT_ERR_NOMEM: every slot is held by a sequence). */
int kv_state_alloc(kv_state_pool *sp, kt_error *err);
void kv_state_release(kv_state_pool *sp, int slot);
/* The slot's floats (slot_bytes of them as bytes). */
float *kv_state_data(const kv_state_pool *sp, int slot);
void kv_state_zero(kv_state_pool *sp, int slot);
void kv_state_copy(kv_state_pool *sp, int dst, int src);

/* A spare buffer for every slot, its pages faulted in (once; KT_ERR_NOMEM
 * naming the bytes when they are not there). */
kt_status kv_state_make_spares(kv_state_pool *sp, kt_error *err);
/* The slot's spare (slot_bytes, contents undefined), NULL without spares. */
float *kv_state_spare(const kv_state_pool *sp, int slot);
/* The spare becomes the slot's state and the state its spare (callers
 * holding kv_state_data's pointer take it again: kv_seq_state_flip). */
void kv_state_flip(kv_state_pool *sp, int slot);

#endif
