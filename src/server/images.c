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
#include <curl/curl.h>
#include <nettle/base64.h>
#include <stdlib.h>
#include <string.h>

#include "engine/images.h"
#include "image/image.h"
#include "server/http_internal.h"
#include "server/image_memo.h"
#include "server/openai.h"
#include "vision/vision.h"

#define INVALID "invalid_request_error"
#define SRV_IMAGE_FETCH_S 10 /* --allow-image-urls: one image's fetch, redirects included */

void srv_images_free(srv_gen_req *r) {
    for (int i = 0; i < r->n_images; i++)
        if (r->images[i].prep) kt_image_prep_free(r->images[i].prep), free(r->images[i].prep);
    free(r->images);
    r->images = NULL, r->n_images = 0;
}

/* A fetch's body, cut off past its cap. */
typedef struct fetch_buf {
    uint8_t *data;
    size_t len, cap;
    bool too_big;
} fetch_buf;

static size_t fetch_write(char *p, size_t size, size_t n, void *user) {
    fetch_buf *b = user;
    const size_t add = size * n;
    if (add > b->cap - b->len) return b->too_big = true, 0; /* aborts the transfer */
    if (!b->data && !(b->data = malloc(b->cap ? b->cap : 1))) return 0;
    memcpy(b->data + b->len, p, add);
    b->len += add;
    return add;
}

/* An http(s) image URL fetched (--allow-image-urls): at most the image
 * byte limit, SRV_IMAGE_FETCH_S seconds, 3 redirects, http and https
 * only. NULL with e filled, naming what failed. */
static uint8_t *fetch_url(const char *url, int i, const kt_image_limits *lim, size_t *n, srv_error *e) {
    CURL *h = curl_easy_init();
    fetch_buf b = {.cap = lim->max_bytes};
    long status = 0;
    if (!h) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory"), NULL;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(h, CURLOPT_MAXREDIRS, 3L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, (long)SRV_IMAGE_FETCH_S);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, fetch_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    CURLcode rc = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(h);
    if (b.too_big) {
        free(b.data);
        return srv_fail(e, 400, INVALID, "messages", NULL, "image %d: %.200s is over %zu bytes (--image-max-bytes)", i,
                        url, lim->max_bytes), NULL;
    }
    if (rc != CURLE_OK || status != 200) {
        free(b.data);
        return srv_fail(e, 400, INVALID, "messages", NULL, "image %d: fetching %.200s failed: %s", i, url,
                        rc != CURLE_OK ? curl_easy_strerror(rc) : status ? "the server answered an error status"
                                                                        : "no answer"), NULL;
    }
    *n = b.len;
    return b.data ? b.data : calloc(1, 1);
}

/* The bytes of a base64 data: URL (malloc'd), or of a fetched http(s) URL
 * where the server allows it; NULL with e filled. */
static uint8_t *data_url_bytes(const char *url, size_t url_len, int i, const kt_image_limits *lim, bool fetch,
                               size_t *n, srv_error *e) {
    if (!strncmp(url, "http://", 7) || !strncmp(url, "https://", 8)) {
        if (fetch && strlen(url) == url_len) return fetch_url(url, i, lim, n, e);
        return srv_fail(e, 400, INVALID, "messages", NULL, "image %d: kettle fetches no image URLs unless started with "
                        "--allow-image-urls; send the image as a data: URL (data:image/png;base64,...)", i), NULL;
    }
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

/* Image i from its bytes: seen before (the class's memo), a deferred prep
 * with the hash and grid that decode gave (the engine makes its pixels
 * only if its caches miss); else decoded, preprocessed for the tower,
 * hashed, and remembered. */
static bool load_one(const char *url, size_t url_len, int i, const srv_vision_env *env, kt_prompt_image *out,
                     srv_error *e) {
    size_t n = 0;
    kt_vision *v = env->vision;
    const kt_image_limits *lim = &env->limits;
    uint8_t *bytes = data_url_bytes(url, url_len, i, lim, env->fetch_urls, &n, e);
    if (!bytes) return false;
    kt_error err = {0};
    kt_image_prep_params pp;
    kt_vision_prep_params(v, &pp);
    kt_image_prep *prep = calloc(1, sizeof *prep);
    const srv_image_key key = env->memo ? srv_image_memo_key(env->memo, bytes, n) : (srv_image_key){0};
    srv_image_seen seen;
    kt_status st = KT_ERR_NOMEM;
    if (prep && env->memo && srv_image_memo_get(env->memo, key, &seen)) {
        st = kt_image_prep_defer(prep, bytes, n, lim, &pp, seen.grid_x, seen.grid_y, &err);
    } else if (prep) {
        kt_image img = {0};
        st = kt_image_decode(bytes, n, lim, &img, &err);
        if (st == KT_OK) st = kt_image_preprocess(&img, &pp, prep, &err);
        kt_image_free(&img);
        seen = (srv_image_seen){.hash = st == KT_OK ? eng_image_hash(prep) : 0, .grid_x = prep->grid_x,
                                .grid_y = prep->grid_y};
        if (st == KT_OK && env->memo) srv_image_memo_put(env->memo, key, &seen);
    }
    free(bytes);
    if (st != KT_OK) {
        free(prep);
        const bool oom = st == KT_ERR_NOMEM;
        return srv_fail(e, oom ? 500 : 400, oom ? "server_error" : INVALID, oom ? NULL : "messages", NULL,
                        "image %d: %s", i, err.msg[0] ? err.msg : "out of memory");
    }
    *out = (kt_prompt_image){.grid_x = seen.grid_x, .grid_y = seen.grid_y, .hash = seen.hash, .prep = prep};
    return true;
}

bool srv_images_load(srv_gen_req *r, const srv_vision_env *env, srv_error *e) {
    const size_t n = json_array_size(r->image_urls);
    const int max_tokens = env ? env->max_tokens : 0;
    if (n == 0) return true;
    if (!env || !env->vision) /* the parser collects URLs only for a model with a tower */
        return srv_fail(e, 400, INVALID, "messages", NULL, "the model takes no images (start kettle with --mmproj FILE)");
    long tokens = 0;
    if (!(r->images = calloc(n, sizeof *r->images)))
        return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *u = json_array_get(r->image_urls, i);
        if (!load_one(json_string_value(u), json_string_length(u), (int)i, env, &r->images[i], e)) return false;
        r->n_images = (int)i + 1;
        /* the images' pixels wait for the engine: bounded by what a context can hold */
        tokens += (long)r->images[i].grid_x * r->images[i].grid_y;
        if (max_tokens > 0 && tokens > max_tokens)
            return srv_fail(e, 400, INVALID, "messages", "context_length_exceeded", "the images up to image %zu take "
                            "%ld tokens; the context holds %d", i, tokens, max_tokens);
    }
    return true;
}
