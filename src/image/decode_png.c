/*
 * decode_png.c - PNG through libpng, to 8-bit RGB.
 *
 * libpng reports errors by longjmp: the error handler copies the message
 * and jumps back to the setjmp in kt_image_decode_png, which frees what
 * was made (the state that changes under the setjmp lives in a heap
 * png_ctx, not in locals, whose values a longjmp leaves indeterminate).
 * Warnings are dropped: a library must not print. libpng's transforms do the conversions: palette
 * and low bit depths expanded, tRNS to alpha, 16 bits to 8 by dropping the
 * low byte (png_set_strip_16, as stb_image, which llama.cpp's goldens
 * decode with, does), gray to RGB, Adam7 deinterlaced; alpha is then
 * composited over white (decode.c).
 */
#include <png.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "image/decode_internal.h"

typedef struct png_ctx {
    const uint8_t *data;
    size_t n_bytes, pos;
    char msg[160]; /* libpng's error text */
    uint8_t *px;   /* the pixels being decoded */
    png_bytep *rows;
} png_ctx;

static void png_on_error(png_structp png, png_const_charp msg) {
    png_ctx *c = png_get_error_ptr(png);
    snprintf(c->msg, sizeof c->msg, "%s", msg ? msg : "unknown error");
    png_longjmp(png, 1);
}

static void png_on_warning(png_structp png, png_const_charp msg) {
    (void)png;
    (void)msg;
}

static void png_read_mem(png_structp png, png_bytep out, size_t n) {
    png_ctx *c = png_get_io_ptr(png);
    if (n > c->n_bytes - c->pos) png_error(png, "the file is truncated");
    memcpy(out, c->data + c->pos, n);
    c->pos += n;
}

/* The transforms to 8-bit RGB or RGBA; returns the channels after them. */
static int png_set_transforms(png_structp png, png_infop info) {
    int color = png_get_color_type(png, info);
    png_set_expand(png); /* palette -> RGB, gray < 8 bits -> 8, tRNS -> alpha */
    png_set_strip_16(png);
    if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    return png_get_channels(png, info);
}

static int png_orientation(png_structp png, png_infop info) {
    png_uint_32 n = 0;
    png_bytep exif = NULL;
    if (png_get_eXIf_1(png, info, &n, &exif) && exif) return kt_exif_orientation(exif, n);
    return 1;
}

/* Runs under png_decode's setjmp; jumps out on any libpng error. */
static kt_status png_decode_body(png_structp png, png_infop info, png_ctx *c, const kt_image_limits *lim,
                                 kt_image *out, int *orientation, kt_error *err) {
    png_read_info(png, info);
    png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
    kt_status st = kt_image_check_dims(w, h, lim, err);
    if (st != KT_OK) return st;
    int channels = png_set_transforms(png, info);
    if ((channels != 3 && channels != 4) || png_get_rowbytes(png, info) != (size_t)w * channels)
        return kt_error_set(err, KT_ERR_FORMAT, "PNG: unexpected layout after conversion (%d channels)", channels);
    c->px = malloc((size_t)w * h * channels);
    c->rows = malloc(sizeof *c->rows * h);
    if (!c->px || !c->rows) return kt_error_set(err, KT_ERR_NOMEM, "out of memory decoding a %ux%u PNG", w, h);
    for (png_uint_32 y = 0; y < h; y++) c->rows[y] = c->px + (size_t)y * w * channels;
    png_read_image(png, c->rows);
    *orientation = png_orientation(png, info);
    if (channels == 4) {
        kt_image_rgba_to_rgb(c->px, (size_t)w * h);
        uint8_t *shrunk = realloc(c->px, (size_t)w * h * 3);
        if (shrunk) c->px = shrunk; /* else the larger block serves as well */
    }
    out->width = (int)w;
    out->height = (int)h;
    out->rgb = c->px;
    c->px = NULL;
    return KT_OK;
}

kt_status kt_image_decode_png(const uint8_t *data, size_t n_bytes, const kt_image_limits *lim,
                              kt_image *out, int *orientation, kt_error *err) {
    png_ctx *c = calloc(1, sizeof *c);
    if (!c) return kt_error_set(err, KT_ERR_NOMEM, "out of memory starting the PNG decoder");
    c->data = data;
    c->n_bytes = n_bytes;
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, c, png_on_error, png_on_warning);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!info) {
        png_destroy_read_struct(&png, NULL, NULL);
        free(c);
        return kt_error_set(err, KT_ERR_NOMEM, "out of memory starting the PNG decoder");
    }
    /* our limits say what is too big, with a message naming them */
    png_set_user_limits(png, PNG_UINT_31_MAX, PNG_UINT_31_MAX);
    png_set_read_fn(png, c, png_read_mem);
    kt_status st;
    if (setjmp(png_jmpbuf(png)))
        st = kt_error_set(err, KT_ERR_FORMAT, "malformed PNG: %s", c->msg);
    else
        st = png_decode_body(png, info, c, lim, out, orientation, err);
    free(c->px);
    free(c->rows);
    free(c);
    png_destroy_read_struct(&png, &info, NULL);
    return st;
}
