/*
 * image.h - images in: decoding and the vision towers' preprocessing.
 *
 * A request's image arrives as bytes (a data: URL's payload, a file). It is
 * decoded here with Debian's libraries (libpng, libjpeg-turbo, libwebp),
 * turned upright by its EXIF orientation, its alpha composited, and checked
 * against limits before any pixel buffer is allocated: a decompression
 * bomb or a truncated file is an error value, never a crash. Then the
 * model's preprocessing as llama.cpp's libmtmd does it for Qwen-VL towers
 * (target size a multiple of patch x merge within min / max pixels, the
 * aspect ratio kept, Pillow-compatible bicubic resize, letterboxed on a
 * black canvas, normalised with the file's mean / std) gives the planar
 * float tensor the encoder (src/vision/) reads.
 *
 * This layer knows nothing of models or requests: the vision tower fills
 * kt_image_prep_params from its file, the server fills kt_image_limits
 * from its flags.
 */
#ifndef KT_IMAGE_IMAGE_H
#define KT_IMAGE_IMAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kettle.h"

/* A decoded image: 8-bit RGB, row-major, upright, no alpha. */
typedef struct kt_image {
    int width, height;
    uint8_t *rgb; /* width * height * 3 bytes */
} kt_image;

/* What one image may be. Each refusal names the limit it hit. */
typedef struct kt_image_limits {
    size_t max_bytes;   /* encoded size */
    int max_side;       /* width and height, each */
    int64_t max_pixels; /* width * height, checked from the header before decoding */
} kt_image_limits;

void kt_image_limits_default(kt_image_limits *lim);

/* "png", "jpeg", "webp" from the first bytes, or NULL. */
const char *kt_image_sniff(const void *data, size_t n_bytes);

/* Decodes PNG, JPEG or WebP. On failure *out is left empty ({0}) and err
 * says what was wrong with the image (KT_ERR_FORMAT: malformed or
 * truncated; KT_ERR_UNSUPPORTED: another format; KT_ERR_ARG: over a
 * limit, naming it). */
kt_status kt_image_decode(const void *data, size_t n_bytes, const kt_image_limits *lim, kt_image *out,
                          kt_error *err);
void kt_image_free(kt_image *img);

/* The vision tower's preprocessing parameters (from the mmproj file). */
typedef struct kt_image_prep_params {
    int patch_size;     /* pixels per patch side (14, 16) */
    int merge_size;     /* patches per merged token side (2) */
    int64_t min_pixels; /* of the target canvas */
    int64_t max_pixels;
    float mean[3], std[3];
} kt_image_prep_params;

/* What a deferred prep keeps to make its pixels later (kt_image_prep_defer). */
typedef struct kt_image_later {
    uint8_t *bytes; /* the compressed image, a copy */
    size_t n_bytes;
    kt_image_limits limits;
    kt_image_prep_params params;
} kt_image_later;

/* A preprocessed image: what the encoder reads. */
typedef struct kt_image_prep {
    int width, height;           /* the canvas, multiples of patch_size * merge_size */
    int content_w, content_h;    /* the resized image on it */
    int off_x, off_y;            /* where it is pasted */
    int grid_x, grid_y;          /* merged tokens: width / (patch * merge), height / (...) */
    float *pixels;               /* planar [3][height][width], (u8 / 255 - mean) / std */
    uint8_t *canvas_rgb;         /* the uint8 canvas the floats were made from, [height][width][3] */
    kt_image_later *later;       /* deferred (kt_image_prep_defer): pixels and canvas NULL until realized */
} kt_image_prep;

kt_status kt_image_preprocess(const kt_image *img, const kt_image_prep_params *p, kt_image_prep *out,
                              kt_error *err);
void kt_image_prep_free(kt_image_prep *prep);

/* Deferred preprocessing (later.c). An agent sends the same screenshots
 * back in its history step after step; their tokens are prefix-cache hits
 * and their embeddings encoder-cache hits, so their pixels are almost
 * never read again, yet decoding and resizing one costs 10-30 ms. A prep
 * made by kt_image_prep_defer keeps a copy of the compressed bytes, the
 * limits and the parameters, and only the grid the caller knows from an
 * earlier decode of the same bytes; kt_image_prep_realize makes the
 * pixels when they are needed (kt_image_decode + kt_image_preprocess,
 * the same pixels), and refuses if the grid comes out other than the one
 * given. */
kt_status kt_image_prep_defer(kt_image_prep *out, const void *bytes, size_t n_bytes, const kt_image_limits *lim,
                              const kt_image_prep_params *p, int grid_x, int grid_y, kt_error *err);
static inline bool kt_image_prep_deferred(const kt_image_prep *prep) { return prep->later != NULL; }
/* A deferred prep's pixels made (KT_OK at once for one that is not); on
 * failure the prep stays deferred and err says why. */
kt_status kt_image_prep_realize(kt_image_prep *prep, kt_error *err);

#endif
