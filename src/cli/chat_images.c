/*
 * chat_images.c - see chat_images.h.
 */
#include "cli/chat_images.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"

typedef struct kept_image {
    char *path;
    cli_image im;
} kept_image;

struct chat_images {
    kt_vision *vision;
    kt_pool *pool;
    kept_image *v;
    int n;
    double encode_ms;
};

chat_images *chat_images_new(kt_vision *v, int n_threads, kt_error *err) {
    chat_images *ci = calloc(1, sizeof *ci);
    if (!ci) return kt_error_set(err, KT_ERR_NOMEM, "out of memory"), NULL;
    ci->vision = v;
    if (!(ci->pool = kt_pool_new(n_threads, err))) return free(ci), NULL;
    return ci;
}

void chat_images_free(chat_images *ci) {
    if (!ci) return;
    for (int i = 0; i < ci->n; i++) free(ci->v[i].path), cli_image_free(&ci->v[i].im);
    free(ci->v);
    kt_pool_free(ci->pool);
    free(ci);
}

double chat_images_encode_ms(const chat_images *ci) { return ci->encode_ms; }

const cli_image *chat_images_get(chat_images *ci, const char *path, kt_error *err) {
    for (int i = 0; i < ci->n; i++)
        if (!strcmp(ci->v[i].path, path)) return &ci->v[i].im;
    kept_image *v = realloc(ci->v, sizeof *v * (size_t)(ci->n + 1));
    if (!v) return kt_error_set(err, KT_ERR_NOMEM, "out of memory"), NULL;
    ci->v = v;
    kept_image *k = &ci->v[ci->n];
    if (!(k->path = strdup(path))) return kt_error_set(err, KT_ERR_NOMEM, "out of memory"), NULL;
    if (cli_image_encode(ci->vision, ci->pool, path, &k->im, &ci->encode_ms, err)) return free(k->path), NULL;
    ci->n++;
    return &k->im;
}

/* The key id of an image's entry i: negative, never a vocabulary id. */
static int32_t key_id(uint64_t hash, int i) {
    return -1 - (int32_t)((hash + (uint64_t)i * 0x9E3779B97F4A7C15ull) >> 34);
}

/* A growing list of prompt entries. */
typedef struct entries {
    int32_t *v;
    int n, cap;
} entries;

static bool reserve(entries *e, int more) {
    if (e->n + more <= e->cap) return true;
    int cap = e->cap ? e->cap : 1024;
    while (cap < e->n + more) cap *= 2;
    int32_t *v = realloc(e->v, sizeof *v * (size_t)cap);
    if (!v) return false;
    e->v = v, e->cap = cap;
    return true;
}

static kt_status push_text(entries *e, kt_model *m, const char *text, size_t len, int add_bos, kt_error *err) {
    int n = kt_tokenize_ex(m, text, len, NULL, 0, add_bos, true, err);
    if (n < 0) return err->status;
    if (!reserve(e, n)) return kt_error_set(err, KT_ERR_NOMEM, "out of memory for %d prompt tokens", n);
    if (kt_tokenize_ex(m, text, len, e->v + e->n, n, add_bos, true, err) != n) return err->status;
    e->n += n;
    return KT_OK;
}

static kt_status push_control(entries *e, kt_model *m, const char *name, kt_error *err) {
    const int32_t id = kt_token_control_id(m, name, strlen(name));
    if (id < 0) return kt_error_set(err, KT_ERR_UNSUPPORTED, "the model's vocabulary has no %s token to hold an image", name);
    if (!reserve(e, 1)) return kt_error_set(err, KT_ERR_NOMEM, "out of memory");
    e->v[e->n++] = id;
    return KT_OK;
}

/* The image files of messages, in order (borrowed strings). */
static int image_paths(json_t *messages, const char **paths, int cap) {
    size_t i, j;
    json_t *msg, *p;
    int n = 0;
    json_array_foreach(messages, i, msg) {
        json_array_foreach(json_object_get(msg, "images"), j, p) {
            if (n < cap) paths[n] = json_string_value(p); /* NULL: not a string (a hand-edited /load file) */
            n++;
        }
    }
    return n;
}

int chat_images_tokenize(chat_images *ci, kt_model *m, const char *text, int add_bos, json_t *messages,
                         int32_t **toks, chat_span **spans, int *n_spans, kt_error *err) {
    const int n_paths = image_paths(messages, NULL, 0);
    const char **paths = malloc(sizeof *paths * (size_t)(n_paths ? n_paths : 1));
    chat_span *sp = malloc(sizeof *sp * (size_t)(n_paths ? n_paths : 1));
    entries e = {0};
    kt_status st = paths && sp ? KT_OK : kt_error_set(err, KT_ERR_NOMEM, "out of memory");
    if (!st) image_paths(messages, paths, n_paths);
    const size_t len = strlen(text), mlen = strlen(CLI_IMAGE_MARKER);
    size_t at = 0;
    int k = 0;
    for (const char *mark; !st && (mark = cli_find_marker(text + at, len - at)); k++) {
        const size_t upto = (size_t)(mark - text);
        if (k == n_paths) {
            st = kt_error_set(err, KT_ERR_ARG, "the prompt has more image markers than the conversation has images (%d)",
                              n_paths);
            break;
        }
        const cli_image *im = paths[k] ? chat_images_get(ci, paths[k], err) : NULL;
        if (!paths[k]) kt_error_set(err, KT_ERR_ARG, "image %d of the conversation is not a file name (a message's "
                                    "\"images\" holds strings)", k + 1);
        st = im ? push_text(&e, m, text + at, upto - at, at == 0 ? add_bos : 0, err) : err->status;
        if (!st) st = push_control(&e, m, "<|vision_start|>", err);
        const int n_img = im ? im->grid_x * im->grid_y : 0;
        if (!st && !reserve(&e, n_img)) st = kt_error_set(err, KT_ERR_NOMEM, "out of memory for an image");
        if (!st) {
            sp[k] = (chat_span){.at = e.n, .n = n_img, .im = im};
            for (int i = 0; i < n_img; i++) e.v[e.n++] = key_id(im->hash, i);
            st = push_control(&e, m, "<|vision_end|>", err);
        }
        at = upto + mlen;
    }
    if (!st && k < n_paths)
        st = kt_error_set(err, KT_ERR_ARG, "the chat template left out %d of the conversation's %d images", n_paths - k,
                          n_paths);
    if (!st) st = push_text(&e, m, text + at, len - at, at == 0 ? add_bos : 0, err);
    free(paths);
    if (st) {
        free(sp), free(e.v);
        return -1;
    }
    *toks = e.v, *spans = sp, *n_spans = k;
    return e.n;
}
