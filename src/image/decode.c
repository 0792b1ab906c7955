/*
 * decode.c - kt_image_decode: the format from the magic bytes, the size
 * limits, then the format's decoder (decode_png.c, decode_jpeg.c,
 * decode_webp.c) and the EXIF orientation (exif.c).
 *
 * Why limits here and not in the server: an image is a few KB on the wire
 * and can claim to be 100000 x 100000 pixels (30 GB of RGB). Every decoder
 * reads its header first and asks kt_image_check_dims before a pixel
 * buffer exists, so a decompression bomb costs a header parse.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "image/decode_internal.h"
#include "image/image.h"

static const uint8_t PNG_MAGIC[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
static const uint8_t JPEG_MAGIC[3] = {0xff, 0xd8, 0xff};

/* Defaults: 20 MiB of encoded bytes is more than any photo a phone takes
 * (a 48-megapixel JPEG is ~15 MB) and bounds what a request body may hold
 * per image. 16384 per side is libwebp's own maximum and Pillow-era
 * decoders' common one. 40 megapixels (120 MB of RGB, plus the decoder's
 * own buffers) covers 8K screenshots (33 Mpx) and most camera photos, and
 * keeps one request's decode well under a second and a few hundred MB;
 * the vision towers downscale everything to at most ~4 Mpx anyway. */
void kt_image_limits_default(kt_image_limits *lim) {
    lim->max_bytes = (size_t)20 << 20;
    lim->max_side = 16384;
    lim->max_pixels = (int64_t)40 * 1000 * 1000;
}

static int is_webp(const uint8_t *p, size_t n) {
    return n >= 12 && memcmp(p, "RIFF", 4) == 0 && memcmp(p + 8, "WEBP", 4) == 0;
}

const char *kt_image_sniff(const void *data, size_t n_bytes) {
    const uint8_t *p = data;
    if (!p) return NULL;
    if (n_bytes >= sizeof PNG_MAGIC && memcmp(p, PNG_MAGIC, sizeof PNG_MAGIC) == 0) return "png";
    if (n_bytes >= sizeof JPEG_MAGIC && memcmp(p, JPEG_MAGIC, sizeof JPEG_MAGIC) == 0) return "jpeg";
    if (is_webp(p, n_bytes)) return "webp";
    return NULL;
}

/* 1 when the n bytes are the start of one of the magics (a file cut off
 * inside its signature: truncated, not another format). */
static int is_magic_prefix(const uint8_t *p, size_t n) {
    if (n < sizeof PNG_MAGIC && memcmp(p, PNG_MAGIC, n) == 0) return 1;
    if (n < sizeof JPEG_MAGIC && memcmp(p, JPEG_MAGIC, n) == 0) return 1;
    if (n < 4) return memcmp(p, "RIFF", n) == 0;
    return n < 12 && memcmp(p, "RIFF", 4) == 0 && (n <= 8 || memcmp(p + 8, "WEBP", n - 8) == 0);
}

/* A name for the formats people most often send instead ("" if none). */
static const char *other_format_name(const uint8_t *p, size_t n) {
    if (n >= 6 && (memcmp(p, "GIF87a", 6) == 0 || memcmp(p, "GIF89a", 6) == 0)) return ": a GIF";
    if (n >= 2 && memcmp(p, "BM", 2) == 0) return ": a BMP?";
    if (n >= 4 && (memcmp(p, "II*\0", 4) == 0 || memcmp(p, "MM\0*", 4) == 0)) return ": a TIFF";
    if (n >= 12 && memcmp(p + 4, "ftyp", 4) == 0) return ": an ISO media file (HEIC / AVIF?)";
    if (n >= 1 && p[0] == '<') return ": text (SVG / HTML?)";
    return "";
}

static kt_status refuse_unknown(const uint8_t *p, size_t n, kt_error *err) {
    char hex[3 * 8 + 1] = "";
    size_t shown = n < 8 ? n : 8;
    size_t len = 0;
    for (size_t i = 0; i < shown; i++) len += (size_t)snprintf(hex + len, sizeof hex - len, "%s%02x", i ? " " : "", p[i]);
    return kt_error_set(err, KT_ERR_UNSUPPORTED, "not a PNG, JPEG or WebP image (starts with %s%s)", hex,
                        other_format_name(p, n));
}

kt_status kt_image_check_dims(int64_t width, int64_t height, const kt_image_limits *lim,
                              kt_error *err) {
    if (width <= 0 || height <= 0)
        return kt_error_set(err, KT_ERR_FORMAT, "image header says %" PRId64 "x%" PRId64 " pixels", width,
                            height);
    if (width > lim->max_side || height > lim->max_side)
        return kt_error_set(err, KT_ERR_ARG,
                            "image is %" PRId64 "x%" PRId64 " pixels; the limit is %d pixels per side "
                            "(--image-max-side)",
                            width, height, lim->max_side);
    /* both sides are <= max_side (an int), so the product fits in int64 */
    if (width * height > lim->max_pixels)
        return kt_error_set(err, KT_ERR_ARG,
                            "image is %" PRId64 "x%" PRId64 " pixels; the limit is %" PRId64 " pixels "
                            "(--image-max-pixels)",
                            width, height, lim->max_pixels);
    return KT_OK;
}

/* Alpha over white: a transparent region then looks as an image viewer or
 * a browser shows it (a logo's background white, not whatever colour the
 * encoder left under alpha 0, often black). llama.cpp's stb_image load
 * drops alpha instead; fully opaque images, which is what the goldens
 * have, come out the same either way (a = 255 gives c exactly). */
void kt_image_rgba_to_rgb(uint8_t *px, size_t n_pixels) {
    for (size_t i = 0; i < n_pixels; i++) {
        const uint8_t *s = px + 4 * i;
        unsigned r = s[0], g = s[1], b = s[2], a = s[3];
        uint8_t *d = px + 3 * i; /* never ahead of s: 3i <= 4i */
        d[0] = kt_image_over_white(r, a);
        d[1] = kt_image_over_white(g, a);
        d[2] = kt_image_over_white(b, a);
    }
}

kt_status kt_image_decode(const void *data, size_t n_bytes, const kt_image_limits *lim, kt_image *out,
                          kt_error *err) {
    kt_image_limits def;
    if (!lim) {
        kt_image_limits_default(&def);
        lim = &def;
    }
    if (!out) return kt_error_set(err, KT_ERR_ARG, "kt_image_decode: no output image");
    memset(out, 0, sizeof *out);
    const uint8_t *p = data;
    if (!p || n_bytes == 0) return kt_error_set(err, KT_ERR_FORMAT, "the image is empty (0 bytes)");
    if (n_bytes > lim->max_bytes)
        return kt_error_set(err, KT_ERR_ARG, "image is %zu bytes; the limit is %zu bytes (--image-max-bytes)",
                            n_bytes, lim->max_bytes);
    const char *fmt = kt_image_sniff(p, n_bytes);
    if (!fmt) {
        if (is_magic_prefix(p, n_bytes))
            return kt_error_set(err, KT_ERR_FORMAT, "the image is truncated (%zu bytes, inside its signature)",
                                n_bytes);
        return refuse_unknown(p, n_bytes, err);
    }
    int orientation = 1;
    kt_status st;
    if (fmt[0] == 'p')
        st = kt_image_decode_png(p, n_bytes, lim, out, &orientation, err);
    else if (fmt[0] == 'j')
        st = kt_image_decode_jpeg(p, n_bytes, lim, out, &orientation, err);
    else
        st = kt_image_decode_webp(p, n_bytes, lim, out, &orientation, err);
    if (st == KT_OK) st = kt_image_apply_orientation(out, orientation, err);
    if (st != KT_OK) kt_image_free(out);
    return st;
}

void kt_image_free(kt_image *img) {
    if (!img) return;
    free(img->rgb);
    memset(img, 0, sizeof *img);
}
