/*
 * decode_internal.h - what the per-format decoders (decode_png.c,
 * decode_jpeg.c, decode_webp.c) share with decode.c and exif.c. Not part
 * of image.h: callers only see kt_image_decode.
 *
 * Each decoder reads the header, calls kt_image_check_dims before it
 * allocates any pixel buffer, and returns 8-bit RGB (alpha composited over
 * white) plus the EXIF orientation it found (1 when none), which decode.c
 * then applies.
 */
#ifndef KT_IMAGE_DECODE_INTERNAL_H
#define KT_IMAGE_DECODE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "image/image.h"

/* KT_ERR_ARG naming the limit (and its flag) when width x height is over
 * one; KT_ERR_FORMAT for a zero or negative side. */
kt_status kt_image_check_dims(int64_t width, int64_t height, const kt_image_limits *lim,
                              kt_error *err);

/* c (0-255) with alpha a (0-255) over white, exactly rounded:
 * (c a + 255 (255 - a) + 127) / 255. */
static inline uint8_t kt_image_over_white(unsigned c, unsigned a) {
    return (uint8_t)((c * a + 255u * (255u - a) + 127u) / 255u);
}

/* Composites n_pixels RGBA pixels over white into RGB, in place (the RGB
 * result is written to the start of the same buffer). */
void kt_image_rgba_to_rgb(uint8_t *px, size_t n_pixels);

kt_status kt_image_decode_png(const uint8_t *data, size_t n_bytes, const kt_image_limits *lim,
                              kt_image *out, int *orientation, kt_error *err);
kt_status kt_image_decode_jpeg(const uint8_t *data, size_t n_bytes, const kt_image_limits *lim,
                               kt_image *out, int *orientation, kt_error *err);
kt_status kt_image_decode_webp(const uint8_t *data, size_t n_bytes, const kt_image_limits *lim,
                               kt_image *out, int *orientation, kt_error *err);

/* The orientation (1-8) in an EXIF block: a TIFF header and IFD0, with or
 * without the "Exif\0\0" prefix of JPEG's APP1. 1 when the tag is absent
 * or the block is malformed (an unreadable orientation is no reason to
 * refuse the image). */
int kt_exif_orientation(const uint8_t *data, size_t n_bytes);

/* Turns img upright for EXIF orientation 2-8 (a new buffer; 1 and unknown
 * values leave it as is). */
kt_status kt_image_apply_orientation(kt_image *img, int orientation, kt_error *err);

#endif
