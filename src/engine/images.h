/*
 * images.h - a request's images inside the engine: their tokens' keys,
 * positions and embeddings.
 *
 * An image takes grid_x * grid_y prompt entries, one per merged patch
 * group. Those entries are not token ids: submit writes there the image's
 * key ids (negative, from the image's hash and the token's index), which
 * the prefix cache compares like ids, so a cached block holds an image's
 * KV only for the same pixels, and a screenshot that comes back in an
 * agent's history is a hit. The forward pass takes the image's embedding
 * rows there instead of embedding table rows (llm_batch.embd).
 *
 * Positions (M-RoPE, as llama.cpp's libmtmd lays them out): image token i
 * of an image whose first token would sit at position p0 is (p0, p0 + i /
 * grid_x, p0 + i % grid_x, 0), and the image advances the positions by
 * max(grid_x, grid_y), not by its token count; everything after it (text,
 * later images, generated tokens) is shifted accordingly. A token's KV row
 * stays its index in the sequence; only its rotary position moves.
 *
 * Embeddings come from the engine's vision tower when the image's tokens
 * are first prefilled, through the encoder cache (vision/embd_cache.h,
 * and its disk tier vision/embd_disk.h),
 * or from the caller (kt_prompt_image.embd). Engine thread only, but for
 * req_images_copy, which submit calls.
 */
#ifndef KT_ENGINE_IMAGES_H
#define KT_ENGINE_IMAGES_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"
#include "ops/pool.h"
#include "vision/embd_cache.h"
#include "vision/embd_disk.h"
#include "vision/vision.h"

typedef struct req_image {
    int at, n_tokens, grid_x, grid_y, n_pos;
    uint64_t hash;
    kt_image_prep *prep;  /* owned; NULL once encoded or when given embd */
    float *own_embd;      /* given by the caller (copied) */
    const float *embd;    /* n_tokens rows of n_row floats (llm_embd_row_floats: n_embd, or with
                             Qwen3-VL's DeepStack slices after it), once known */
    bool pinned;          /* embd is pinned in the encoder cache */
} req_image;

typedef struct req_images {
    req_image *v;
    int n;
} req_images;

/* The hash an image is known by: its preprocessed pixels (which carry the
 * resize and the normalisation) and its canvas. */
uint64_t eng_image_hash(const kt_image_prep *prep);

/* The key id of an image's token i (negative: never a vocabulary id). */
int32_t eng_image_key_id(uint64_t hash, int i);

/* Copies p's images into ri and writes their key ids into prompt; checks
 * they are in order, inside the prompt, not overlapping, and have
 * embeddings or pixels to make them from (need_vision: the engine has a
 * vision tower whose rows are n_row floats wide). Takes ownership of every
 * image's prep, also on failure. */
kt_status req_images_copy(req_images *ri, const kt_gen_params *p, int32_t *prompt, int n_row, bool have_vision,
                          kt_error *err);
void req_images_release(req_images *ri, kt_embd_cache *cache);
/* Frees the preps of p's images (submit failed before taking them). */
void eng_images_free_given(const kt_gen_params *p);

/* The 4 M-RoPE components of the token at index k (prompt or output). */
void req_images_pos4(const req_images *ri, int k, int *p4);

/* Makes sure the images that overlap prompt indices [k0, k0 + n) have
 * their embeddings: from the cache, else encoded now (the pool's threads)
 * and cached. *encoded_ms adds the time spent encoding. */
typedef struct eng_encoder {
    kt_vision *vision;
    kt_pool *pool;
    kt_embd_cache *cache;  /* NULL: none */
    kt_embd_disk *disk;    /* the cache's disk tier; NULL: none */
    int n_row; /* floats in an image token's row (llm_embd_row_floats) */
    /* what req_images_ready did, added up */
    double encode_ms;
    int n_encoded, n_disk_hits;
} eng_encoder;

kt_status req_images_ready(req_images *ri, int k0, int n, eng_encoder *enc, kt_error *err);

/* The embedding row that stands for prompt index k, or NULL (a token). */
const float *req_images_row(const req_images *ri, int k, int n_row);

#endif
