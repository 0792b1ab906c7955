/*
 * images.c - see images.h.
 */
#include "engine/images.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "base/error.h"
#include "image/image.h"

uint64_t eng_image_hash(const kt_image_prep *prep) {
    const int dims[2] = {prep->width, prep->height};
    XXH64_hash_t h = XXH3_64bits(dims, sizeof dims);
    return XXH3_64bits_withSeed(prep->pixels, sizeof(float) * 3 * (size_t)prep->width * (size_t)prep->height, h);
}

int32_t eng_image_key_id(uint64_t hash, int i) {
    const uint64_t mixed = XXH3_64bits_withSeed(&i, sizeof i, hash);
    return -2 - (int32_t)(mixed & 0x3fffffff); /* [-2^30 - 1, -2]: never an id, never -1 */
}

static void free_prep(kt_image_prep *prep) {
    if (!prep) return;
    kt_image_prep_free(prep);
    free(prep);
}

static void free_given_preps(const kt_gen_params *p, int from) {
    for (int i = from; p->images && i < p->n_images; i++) free_prep(p->images[i].prep);
}

void eng_images_free_given(const kt_gen_params *p) {
    free_given_preps(p, 0);
}

static kt_status copy_one(req_image *im, const kt_prompt_image *pi, int i, int32_t *prompt, int n_prompt, int n_row,
                          bool have_vision, kt_error *err) {
    if (pi->grid_x < 1 || pi->grid_y < 1 || pi->grid_x > 4096 || pi->grid_y > 4096)
        return kt_error_set(err, KT_ERR_ARG, "image %d has a %dx%d grid", i, pi->grid_x, pi->grid_y);
    const int n_tokens = pi->grid_x * pi->grid_y;
    if (pi->at < 0 || n_tokens > n_prompt - pi->at)
        return kt_error_set(err, KT_ERR_ARG, "image %d's %d tokens at index %d do not fit the prompt of %d", i,
                            n_tokens, pi->at, n_prompt);
    if (pi->prep && (pi->prep->grid_x != pi->grid_x || pi->prep->grid_y != pi->grid_y))
        return kt_error_set(err, KT_ERR_ARG, "image %d: a %dx%d grid given with pixels of a %dx%d grid", i,
                            pi->grid_x, pi->grid_y, pi->prep->grid_x, pi->prep->grid_y);
    *im = (req_image){.at = pi->at, .n_tokens = n_tokens, .grid_x = pi->grid_x, .grid_y = pi->grid_y,
                      .n_pos = pi->grid_x > pi->grid_y ? pi->grid_x : pi->grid_y, .hash = pi->hash,
                      .prep = pi->prep};
    if (pi->embd) {
        const size_t n_floats = (size_t)n_tokens * (size_t)n_row;
        if (!(im->own_embd = malloc(sizeof(float) * n_floats)))
            return kt_error_set(err, KT_ERR_NOMEM, "out of memory copying image %d's embeddings", i);
        memcpy(im->own_embd, pi->embd, sizeof(float) * n_floats);
        im->embd = im->own_embd;
    } else if (!pi->prep) {
        return kt_error_set(err, KT_ERR_ARG, "image %d has neither embeddings nor pixels", i);
    } else if (!have_vision) {
        return kt_error_set(err, KT_ERR_UNSUPPORTED,
                            "the request has an image but the model has no vision tower (start kettle with "
                            "--mmproj FILE, the model's projector)");
    }
    for (int t = 0; t < n_tokens; t++) prompt[pi->at + t] = eng_image_key_id(pi->hash, t);
    return KT_OK;
}

kt_status req_images_copy(req_images *ri, const kt_gen_params *p, int32_t *prompt, int n_row, bool have_vision,
                          kt_error *err) {
    memset(ri, 0, sizeof *ri);
    if (p->n_images <= 0) return KT_OK;
    if (p->n_images > KT_MAX_IMAGES) {
        free_given_preps(p, 0);
        return kt_error_set(err, KT_ERR_ARG, "the request has %d images; at most %d are allowed", p->n_images,
                            KT_MAX_IMAGES);
    }
    if (!(ri->v = calloc((size_t)p->n_images, sizeof *ri->v))) {
        free_given_preps(p, 0);
        return kt_error_set(err, KT_ERR_NOMEM, "out of memory queuing a request's images");
    }
    for (int i = 0; i < p->n_images; i++) {
        kt_status st = copy_one(&ri->v[i], &p->images[i], i, prompt, p->n_prompt, n_row, have_vision, err);
        ri->n = i + 1; /* the request owns image i's prep from here on */
        if (!st && i && p->images[i].at < ri->v[i - 1].at + ri->v[i - 1].n_tokens)
            st = kt_error_set(err, KT_ERR_ARG, "image %d (at %d) overlaps or precedes image %d", i, p->images[i].at,
                              i - 1);
        if (st) {
            if (ri->v[i].prep != p->images[i].prep) free_prep(p->images[i].prep);
            free_given_preps(p, i + 1);
            return st;
        }
    }
    return KT_OK;
}

void req_images_release(req_images *ri, kt_embd_cache *cache) {
    for (int i = 0; i < ri->n; i++) {
        req_image *im = &ri->v[i];
        if (im->pinned && cache) kt_embd_cache_unpin(cache, im->hash);
        free_prep(im->prep);
        free(im->own_embd);
    }
    free(ri->v);
    memset(ri, 0, sizeof *ri);
}

void req_images_pos4(const req_images *ri, int k, int *p4) {
    int shift = 0; /* positions the images before k saved: n_tokens - n_pos each */
    for (int i = 0; i < ri->n; i++) {
        const req_image *im = &ri->v[i];
        if (k < im->at) break;
        if (k < im->at + im->n_tokens) {
            const int p0 = im->at - shift, t = k - im->at;
            p4[0] = p0, p4[1] = p0 + t / im->grid_x, p4[2] = p0 + t % im->grid_x, p4[3] = 0;
            return;
        }
        shift += im->n_tokens - im->n_pos;
    }
    p4[0] = p4[1] = p4[2] = k - shift, p4[3] = 0;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Image im's pixels: a deferred prep (image.h, sent by a caller that saw
 * the same bytes before) decoded now, and its pixels checked against the
 * hash its tokens are keyed by: a prefix-cache block of another image's
 * KV must never be taken for this one's. err is not yet wrapped with the
 * image's index. */
static kt_status pixels_of(req_image *im, kt_error *err) {
    if (!kt_image_prep_deferred(im->prep)) return KT_OK;
    if (kt_image_prep_realize(im->prep, err) != KT_OK) return err->status;
    if (eng_image_hash(im->prep) != im->hash)
        return kt_error_set(err, KT_ERR_INTERNAL, "its pixels do not match the hash it was sent with");
    return KT_OK;
}

/* Image im's embeddings from the tower (rows of n_row: the engine
 * checks the tower's DeepStack outputs are the model's), malloc'd; NULL
 * with err. */
static float *encode(req_image *im, int i, eng_encoder *enc, size_t n_floats, kt_error *err) {
    float *out = malloc(sizeof(float) * n_floats);
    if (!out) return kt_error_set(err, KT_ERR_NOMEM, "out of memory encoding image %d", i), NULL;
    kt_status st = pixels_of(im, err);
    if (st == KT_OK) {
        const double t0 = now_ms();
        st = kt_vision_encode(enc->vision, enc->pool, im->prep, out, err);
        enc->encode_ms += now_ms() - t0;
        enc->n_encoded++;
    }
    if (st) {
        free(out);
        kt_error_wrap(err, "image %d", i);
        return NULL;
    }
    if (enc->disk) kt_embd_disk_put(enc->disk, im->hash, out, n_floats);
    return out;
}

/* Image im's embeddings: the cache's, else its disk tier's, else the
 * tower's (then cached). */
static kt_status make_embd(req_image *im, int i, eng_encoder *enc, kt_error *err) {
    const size_t n_floats = (size_t)im->n_tokens * (size_t)enc->n_row;
    kt_embd_cache *cache = enc->cache;
    if (cache && (im->embd = kt_embd_cache_get(cache, im->hash, n_floats))) {
        im->pinned = true;
    } else {
        float *out = enc->disk ? kt_embd_disk_get(enc->disk, im->hash, n_floats) : NULL;
        if (out) enc->n_disk_hits++;
        else if (!(out = encode(im, i, enc, n_floats, err))) return err->status;
        if (cache && (im->embd = kt_embd_cache_put(cache, im->hash, out, n_floats))) {
            im->pinned = true;
        } else if (!cache) {
            im->own_embd = out, im->embd = out;
        } else {
            return kt_error_set(err, KT_ERR_NOMEM, "out of memory keeping image %d's embeddings", i);
        }
    }
    free_prep(im->prep); /* the pixels are not needed again */
    im->prep = NULL;
    return KT_OK;
}

kt_status req_images_ready(req_images *ri, int k0, int n, eng_encoder *enc, kt_error *err) {
    for (int i = 0; i < ri->n; i++) {
        req_image *im = &ri->v[i];
        if (im->at >= k0 + n) break;
        if (im->embd || im->at + im->n_tokens <= k0) continue;
        if (!im->prep || !enc->vision)
            return kt_error_set(err, KT_ERR_INTERNAL, "image %d has no pixels to encode", i);
        kt_status st = make_embd(im, i, enc, err);
        if (st) return st;
    }
    return KT_OK;
}

const float *req_images_row(const req_images *ri, int k, int n_row) {
    for (int i = 0; i < ri->n; i++) {
        const req_image *im = &ri->v[i];
        if (k < im->at) return NULL;
        if (k < im->at + im->n_tokens) return im->embd + (size_t)(k - im->at) * (size_t)n_row;
    }
    return NULL;
}
