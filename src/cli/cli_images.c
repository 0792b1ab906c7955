/*
 * cli_images.c - see cli_images.h.
 */
#include "cli/cli_images.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "base/error.h"
#include "base/timing.h"
#include "cli/cli_util.h"
#include "image/image.h"

kt_vision *cli_vision_load(const char *path, const kt_model *m, kt_error *err) {
    kt_vision *v = kt_vision_load(path, err);
    if (!v) return NULL;
    const kt_vision_info *vi = kt_vision_get_info(v);
    const kt_model_desc *d = kt_model_describe(m);
    if (kt_vision_check_text(vi, d->arch, d->n_embd, d->n_deepstack, err) == KT_OK) return v;
    kt_vision_free(v);
    return NULL;
}

void cli_image_free(cli_image *im) {
    free(im->embd);
    *im = (cli_image){0};
}

kt_status cli_image_encode(kt_vision *v, kt_pool *pool, const char *path, cli_image *im, double *ms, kt_error *err) {
    *im = (cli_image){0};
    size_t n = 0;
    char *bytes = cli_read_file(path, &n);
    if (!bytes) return kt_error_set(err, KT_ERR_IO, "cannot read image %s", path);
    im->hash = XXH3_64bits(bytes, n);
    kt_image img = {0};
    kt_image_prep prep = {0};
    kt_image_prep_params pp;
    kt_vision_prep_params(v, &pp);
    kt_status st = kt_image_decode(bytes, n, NULL, &img, err);
    free(bytes);
    im->width = img.width, im->height = img.height;
    if (!st) st = kt_image_preprocess(&img, &pp, &prep, err);
    kt_image_free(&img);
    const size_t n_tok = (size_t)prep.grid_x * (size_t)prep.grid_y;
    const kt_vision_info *vi = kt_vision_get_info(v);
    const size_t row = (size_t)vi->n_embd * (size_t)(1 + vi->n_deepstack); /* with Qwen3-VL's DeepStack outputs */
    if (!st && !(im->embd = malloc(sizeof(float) * row * (n_tok ? n_tok : 1))))
        st = kt_error_set(err, KT_ERR_NOMEM, "out of memory encoding %s", path);
    const double t0 = kt_time_ms();
    if (!st) st = kt_vision_encode(v, pool, &prep, im->embd, err);
    *ms += kt_time_ms() - t0;
    im->grid_x = prep.grid_x, im->grid_y = prep.grid_y;
    kt_image_prep_free(&prep);
    if (st) {
        cli_image_free(im);
        kt_error_wrap(err, "image %s", path);
    }
    return st;
}

const char *cli_find_marker(const char *text, size_t len) {
    const size_t m = strlen(CLI_IMAGE_MARKER);
    for (size_t i = 0; i + m <= len; i++)
        if (!memcmp(text + i, CLI_IMAGE_MARKER, m)) return text + i;
    return NULL;
}

static kt_status eval_text(kt_model *m, kt_session *s, const char *text, size_t len, int bos, float *logits,
                           cli_image_stats *st, kt_error *err) {
    if (len == 0 && bos == 0) return KT_OK;
    /* a prompt with images is chat-shaped: its control tokens (<|im_start|>) are read as such */
    int n = kt_tokenize_ex(m, text, len, NULL, 0, bos, true, err);
    int32_t *ids = n >= 0 ? malloc(sizeof *ids * ((size_t)n + 1)) : NULL;
    if (n < 0) return err->status;
    if (!ids) return kt_error_set(err, KT_ERR_NOMEM, "out of memory for %d prompt tokens", n);
    kt_status rc = kt_tokenize_ex(m, text, len, ids, n, bos, true, err) == n ? kt_session_eval(s, ids, n, logits, false, err)
                                                                    : err->status;
    free(ids);
    st->n_tokens += n;
    return rc;
}

static kt_status eval_marker(kt_model *m, kt_session *s, const char *name, float *logits, cli_image_stats *st,
                             kt_error *err) {
    const int32_t id = kt_token_control_id(m, name, strlen(name));
    if (id < 0) return kt_error_set(err, KT_ERR_UNSUPPORTED, "the model's vocabulary has no %s token to hold an image", name);
    st->n_tokens++;
    return kt_session_eval(s, &id, 1, logits, false, err);
}

kt_status cli_images_eval(kt_model *m, kt_session *s, kt_vision *v, int n_threads, const char *const *paths,
                          int n_paths, const char *text, size_t len, int bos, float *logits, cli_image_stats *st,
                          kt_error *err) {
    memset(st, 0, sizeof *st);
    kt_pool *pool = kt_pool_new(n_threads, err);
    if (!pool) return err->status;
    kt_status rc = KT_OK;
    size_t at = 0;
    for (int i = 0; i < n_paths && !rc; i++) {
        const char *mark = cli_find_marker(text + at, len - at);
        const size_t upto = mark ? (size_t)(mark - text) : at; /* no marker: the images first */
        cli_image im;
        rc = cli_image_encode(v, pool, paths[i], &im, &st->encode_ms, err);
        const int gx = im.grid_x, gy = im.grid_y;
        if (!rc) rc = eval_text(m, s, text + at, upto - at, at == 0 ? bos : 0, logits, st, err);
        if (!rc) rc = eval_marker(m, s, "<|vision_start|>", logits, st, err);
        if (!rc) rc = kt_session_eval_image(s, im.embd, gx, gy, logits, err);
        if (!rc) rc = eval_marker(m, s, "<|vision_end|>", logits, st, err);
        if (!rc) st->n_tokens += gx * gy, st->n_image_tokens += gx * gy;
        cli_image_free(&im);
        if (mark) at = upto + strlen(CLI_IMAGE_MARKER);
        if (!mark && i == 0) bos = 0; /* the BOS went before the first image */
    }
    if (!rc && cli_find_marker(text + at, len - at))
        rc = kt_error_set(err, KT_ERR_ARG, "the prompt has more %s markers than --image files (%d)", CLI_IMAGE_MARKER,
                          n_paths);
    if (!rc) rc = eval_text(m, s, text + at, len - at, at == 0 ? bos : 0, logits, st, err);
    kt_pool_free(pool);
    return rc;
}
