/*
 * preprocess.c - kt_image_preprocess: an upright RGB image to the tensor a
 * Qwen-VL vision tower reads, as llama.cpp's libmtmd makes it
 * (mtmd_image_preprocessor_dyn_size with PAD_CEIL).
 *
 * The steps, each matching llama.cpp's arithmetic (float32 where it uses
 * float, C's roundf / ceilf / floorf for std::round / ceil / floor) so the
 * canvas is the goldens' bit for bit:
 *   1. the canvas size: each side rounded to a multiple of A = patch x
 *      merge, then scaled down or up (keeping the aspect ratio) into
 *      [min_pixels, max_pixels] (calc_size_preserved_ratio);
 *   2. the image resized to fit inside it with its aspect ratio kept,
 *      Pillow's bicubic (resize.c), pasted centred on black;
 *   3. (u8 / 255 - mean) / std in float32, planar [3][H][W].
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "image/image.h"
#include "image/resize.h"

/* llama.cpp's resize refuses sides above this; so do we (beyond it the
 * canvas would not fit any tower's position table anyway). */
#define PREP_MAX_SIDE 65536

static int round_by(float x, int a) {
    return (int)roundf(x / (float)a) * a;
}
static int ceil_by(float x, int a) {
    return (int)ceilf(x / (float)a) * a;
}
static int floor_by(float x, int a) {
    return (int)floorf(x / (float)a) * a;
}
static int max_int(int a, int b) {
    return a > b ? a : b;
}
static int min_int(int a, int b) {
    return a < b ? a : b;
}

/* calc_size_preserved_ratio without longest_edge, in float32 as there. */
static void target_size(int w, int h, int a, int64_t min_px, int64_t max_px, int *tw, int *th) {
    int w_bar = max_int(a, round_by((float)w, a)), h_bar = max_int(a, round_by((float)h, a));
    if (max_px > 0 && (int64_t)w_bar * h_bar > max_px) {
        float beta = sqrtf((float)h * (float)w / (float)max_px);
        h_bar = max_int(a, floor_by((float)h / beta, a));
        w_bar = max_int(a, floor_by((float)w / beta, a));
    } else if (min_px > 0 && (int64_t)w_bar * h_bar < min_px) {
        float beta = sqrtf((float)min_px / ((float)h * (float)w));
        h_bar = ceil_by((float)h * beta, a);
        w_bar = ceil_by((float)w * beta, a);
    }
    *tw = w_bar;
    *th = h_bar;
}

static kt_status check_params(const kt_image *img, const kt_image_prep_params *p, kt_error *err) {
    if (!img || !img->rgb || img->width <= 0 || img->height <= 0 || img->width > PREP_MAX_SIDE ||
        img->height > PREP_MAX_SIDE)
        return kt_error_set(err, KT_ERR_ARG, "preprocess: no image, or its size (%dx%d) is out of range",
                            img ? img->width : 0, img ? img->height : 0);
    if (p->patch_size <= 0 || p->merge_size <= 0 || p->patch_size > 1024 || p->merge_size > 16)
        return kt_error_set(err, KT_ERR_ARG, "preprocess: patch size %d / merge size %d out of range", p->patch_size,
                            p->merge_size);
    /* int32 bounds, as llama.cpp's: the sizes derived from them then fit an int */
    if (p->min_pixels < 0 || p->max_pixels < 0 || p->min_pixels > INT32_MAX || p->max_pixels > INT32_MAX ||
        (p->max_pixels > 0 && p->min_pixels > p->max_pixels))
        return kt_error_set(err, KT_ERR_ARG, "preprocess: min / max pixels %lld / %lld are inconsistent",
                            (long long)p->min_pixels, (long long)p->max_pixels);
    for (int c = 0; c < 3; c++)
        if (!(p->std[c] != 0.0f) || !isfinite(p->std[c]) || !isfinite(p->mean[c]))
            return kt_error_set(err, KT_ERR_ARG, "preprocess: mean / std of channel %d are not usable", c);
    return KT_OK;
}

/* Step 2: the letterboxed uint8 canvas. */
static kt_status make_canvas(const kt_image *img, kt_image_prep *out, kt_error *err) {
    int w = img->width, h = img->height, tw = out->width, th = out->height;
    float scale = fminf((float)tw / (float)w, (float)th / (float)h);
    out->content_w = min_int((int)ceilf((float)w * scale), tw);
    out->content_h = min_int((int)ceilf((float)h * scale), th);
    out->off_x = (tw - out->content_w) / 2;
    out->off_y = (th - out->content_h) / 2;
    size_t content_bytes = (size_t)out->content_w * out->content_h * 3;
    uint8_t *content = malloc(content_bytes);
    out->canvas_rgb = calloc((size_t)tw * th, 3); /* black */
    if (!content || !out->canvas_rgb) {
        free(content);
        return kt_error_set(err, KT_ERR_NOMEM, "out of memory for a %dx%d image canvas", tw, th);
    }
    kt_status st = kt_image_resize_bicubic(img->rgb, w, h, content, out->content_w, out->content_h, err);
    if (st == KT_OK) {
        size_t row = (size_t)out->content_w * 3;
        for (int y = 0; y < out->content_h; y++)
            memcpy(out->canvas_rgb + (((size_t)(y + out->off_y) * tw) + out->off_x) * 3, content + y * row, row);
    }
    free(content);
    return st;
}

/* Step 3, as clip_image_f32::from_u8 then normalize. */
static void normalise(const uint8_t *rgb, int w, int h, const kt_image_prep_params *p, float *planes) {
    size_t n = (size_t)w * h;
    for (int c = 0; c < 3; c++) {
        float *plane = planes + c * n;
        for (size_t i = 0; i < n; i++) {
            float v = (float)rgb[3 * i + c] / 255.0f;
            plane[i] = (v - p->mean[c]) / p->std[c];
        }
    }
}

kt_status kt_image_preprocess(const kt_image *img, const kt_image_prep_params *p, kt_image_prep *out,
                              kt_error *err) {
    if (!out || !p) return kt_error_set(err, KT_ERR_ARG, "preprocess: no parameters or no output");
    memset(out, 0, sizeof *out);
    kt_status st = check_params(img, p, err);
    if (st != KT_OK) return st;
    int a = p->patch_size * p->merge_size;
    target_size(img->width, img->height, a, p->min_pixels, p->max_pixels, &out->width, &out->height);
    if (out->width <= 0 || out->height <= 0 || out->width > PREP_MAX_SIDE || out->height > PREP_MAX_SIDE) {
        st = kt_error_set(err, KT_ERR_ARG, "preprocess: a %dx%d image gives a %dx%d canvas, out of range", img->width,
                          img->height, out->width, out->height);
        memset(out, 0, sizeof *out);
        return st;
    }
    out->grid_x = out->width / a;
    out->grid_y = out->height / a;
    st = make_canvas(img, out, err);
    if (st == KT_OK) {
        out->pixels = malloc(sizeof *out->pixels * 3 * (size_t)out->width * out->height);
        if (!out->pixels)
            st = kt_error_set(err, KT_ERR_NOMEM, "out of memory for a %dx%d image tensor", out->width, out->height);
        else
            normalise(out->canvas_rgb, out->width, out->height, p, out->pixels);
    }
    if (st != KT_OK) kt_image_prep_free(out);
    return st;
}

void kt_image_prep_free(kt_image_prep *prep) {
    if (!prep) return;
    free(prep->pixels);
    free(prep->canvas_rgb);
    if (prep->later) free(prep->later->bytes), free(prep->later);
    memset(prep, 0, sizeof *prep);
}
