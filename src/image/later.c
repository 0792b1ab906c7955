/*
 * later.c - deferred preprocessing (image.h): an image kept as its
 * compressed bytes until its pixels are needed.
 *
 * Why: in a computer-use agent's loop every request carries the earlier
 * screenshots again. Their KV is in the prefix cache and their embeddings
 * in the encoder cache, so the pixels of all but the newest are never
 * read, and decoding plus resizing each one again costs 10-30 ms a
 * screenshot, a step's cost that grows with the history. The caller that
 * has decoded the same bytes before (server/image_memo.h) knows the grid
 * and the pixels' hash; it makes a deferred prep, and only the engine,
 * when the caches miss, pays for the pixels.
 *
 * Invariant relied on by the engine: a realized prep is exactly what
 * kt_image_decode + kt_image_preprocess give for the kept bytes, limits
 * and parameters (it is made by them), and its grid is the one given at
 * kt_image_prep_defer (checked here; the engine checks the pixels' hash).
 */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "image/image.h"

kt_status kt_image_prep_defer(kt_image_prep *out, const void *bytes, size_t n_bytes, const kt_image_limits *lim,
                              const kt_image_prep_params *p, int grid_x, int grid_y, kt_error *err) {
    memset(out, 0, sizeof *out);
    if (!bytes || !n_bytes || !lim || !p || grid_x < 1 || grid_y < 1)
        return kt_error_set(err, KT_ERR_ARG, "deferred image: no bytes, limits or parameters, or a %dx%d grid",
                            grid_x, grid_y);
    kt_image_later *later = malloc(sizeof *later);
    uint8_t *copy = malloc(n_bytes);
    if (!later || !copy) {
        free(later), free(copy);
        return kt_error_set(err, KT_ERR_NOMEM, "out of memory keeping a %zu-byte image", n_bytes);
    }
    memcpy(copy, bytes, n_bytes);
    *later = (kt_image_later){.bytes = copy, .n_bytes = n_bytes, .limits = *lim, .params = *p};
    out->grid_x = grid_x, out->grid_y = grid_y, out->later = later;
    return KT_OK;
}

kt_status kt_image_prep_realize(kt_image_prep *prep, kt_error *err) {
    kt_image_later *later = prep->later;
    if (!later) return KT_OK;
    kt_image img = {0};
    kt_image_prep made;
    kt_status st = kt_image_decode(later->bytes, later->n_bytes, &later->limits, &img, err);
    if (st == KT_OK) st = kt_image_preprocess(&img, &later->params, &made, err);
    kt_image_free(&img);
    if (st != KT_OK) return st;
    if (made.grid_x != prep->grid_x || made.grid_y != prep->grid_y) {
        st = kt_error_set(err, KT_ERR_INTERNAL, "a deferred image decoded to a %dx%d grid, not the %dx%d it was sent "
                          "with", made.grid_x, made.grid_y, prep->grid_x, prep->grid_y);
        kt_image_prep_free(&made);
        return st;
    }
    kt_image_prep_free(prep); /* the kept bytes */
    *prep = made;
    return KT_OK;
}
