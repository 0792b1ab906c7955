/*
 * images.c - a chat request's images: data: URLs decoded and made ready
 * for the model's vision tower, and their tokens placed in the prompt.
 *
 * The parser (openai.c) left an SRV_IMAGE_MARKER in the text where each
 * image part was and the parts' URLs in order. Here each URL's bytes are
 * decoded (src/image/: PNG, JPEG, WebP, within the server's limits) and
 * preprocessed as the tower wants; the image's hash (engine/images.h)
 * keys the encoder cache and the prefix cache. Then the rendered prompt
 * is tokenized piece by piece between markers, and at each marker go the
 * image's start token, one placeholder per merged patch group (submit
 * writes the image's key ids there) and its end token, as llama.cpp's
 * libmtmd lays out a Qwen-VL prompt. Every failure is a 400 naming the
 * image and what is wrong with it.
 */
#include <nettle/base64.h>
#include <stdlib.h>
#include <string.h>

#include "engine/images.h"
#include "image/image.h"
#include "server/http_internal.h"
#include "server/openai.h"
#include "vision/vision.h"

#define INVALID "invalid_request_error"

void srv_images_free(srv_gen_req *r) {
    for (int i = 0; i < r->n_images; i++)
        if (r->images[i].prep) kt_image_prep_free(r->images[i].prep), free(r->images[i].prep);
    free(r->images);
    r->images = NULL, r->n_images = 0;
}

/* The bytes of a base64 data: URL (malloc'd), or NULL with e filled. */
static uint8_t *data_url_bytes(const char *url, size_t url_len, int i, const kt_image_limits *lim, size_t *n,
                               srv_error *e) {
    if (!strncmp(url, "http://", 7) || !strncmp(url, "https://", 8))
        return srv_fail(e, 400, INVALID, "messages", NULL, "image %d: kettle does not fetch image URLs; send the "
                        "image as a data: URL (data:image/png;base64,...)", i), NULL;
    const char *comma = strncmp(url, "data:", 5) ? NULL : memchr(url, ',', url_len);
    if (!comma)
        return srv_fail(e, 400, INVALID, "messages", NULL, "image %d: the URL is not a data: URL "
                        "(data:image/png;base64,...)", i), NULL;
    const size_t head = (size_t)(comma - url), b64_len = url_len - head - 1;
    if (head < 12 || memcmp(comma - 7, ";base64", 7))
        return srv_fail(e, 400, INVALID, "messages", NULL, "image %d: the data: URL is not base64 (data:MIME;base64,...)",
                        i), NULL;
    if (b64_len / 4 * 3 > lim->max_bytes + 3)
        return srv_fail(e, 400, INVALID, "messages", NULL, "image %d is over %zu bytes (--image-max-bytes)", i,
                        lim->max_bytes), NULL;
    uint8_t *bytes = malloc(BASE64_DECODE_LENGTH(b64_len) + 1);
    if (!bytes) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory"), NULL;
    struct base64_decode_ctx ctx;
    base64_decode_init(&ctx);
    size_t got = BASE64_DECODE_LENGTH(b64_len);
    if (!base64_decode_update(&ctx, &got, bytes, b64_len, comma + 1) || !base64_decode_final(&ctx)) {
        free(bytes);
        return srv_fail(e, 400, INVALID, "messages", NULL, "image %d: the data: URL's base64 is malformed", i), NULL;
    }
    *n = got;
    return bytes;
}

/* Image i: decoded, preprocessed for the tower, hashed. */
static bool load_one(const char *url, size_t url_len, int i, kt_vision *v, const kt_image_limits *lim,
                     kt_prompt_image *out, srv_error *e) {
    size_t n = 0;
    uint8_t *bytes = data_url_bytes(url, url_len, i, lim, &n, e);
    if (!bytes) return false;
    kt_image img = {0};
    kt_error err = {0};
    kt_image_prep_params pp;
    kt_vision_prep_params(v, &pp);
    kt_image_prep *prep = calloc(1, sizeof *prep);
    kt_status st = prep ? kt_image_decode(bytes, n, lim, &img, &err) : KT_ERR_NOMEM;
    free(bytes);
    if (st == KT_OK) st = kt_image_preprocess(&img, &pp, prep, &err);
    kt_image_free(&img);
    if (st != KT_OK) {
        free(prep);
        const bool oom = st == KT_ERR_NOMEM;
        return srv_fail(e, oom ? 500 : 400, oom ? "server_error" : INVALID, oom ? NULL : "messages", NULL,
                        "image %d: %s", i, err.msg[0] ? err.msg : "out of memory");
    }
    *out = (kt_prompt_image){.grid_x = prep->grid_x, .grid_y = prep->grid_y, .hash = eng_image_hash(prep),
                             .prep = prep};
    return true;
}

bool srv_images_load(srv_gen_req *r, kt_vision *v, const kt_image_limits *lim, int max_tokens, srv_error *e) {
    const size_t n = json_array_size(r->image_urls);
    if (n == 0) return true;
    if (!v) /* the parser collects URLs only for a model with a tower */
        return srv_fail(e, 400, INVALID, "messages", NULL, "the model takes no images (start kettle with --mmproj FILE)");
    long tokens = 0;
    if (!(r->images = calloc(n, sizeof *r->images)))
        return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *u = json_array_get(r->image_urls, i);
        if (!load_one(json_string_value(u), json_string_length(u), (int)i, v, lim, &r->images[i], e)) return false;
        r->n_images = (int)i + 1;
        /* the images' pixels wait for the engine: bounded by what a context can hold */
        tokens += (long)r->images[i].grid_x * r->images[i].grid_y;
        if (max_tokens > 0 && tokens > max_tokens)
            return srv_fail(e, 400, INVALID, "messages", "context_length_exceeded", "the images up to image %zu take "
                            "%ld tokens; the context holds %d", i, tokens, max_tokens);
    }
    return true;
}
