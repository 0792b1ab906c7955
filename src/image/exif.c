/*
 * exif.c - the EXIF orientation tag and turning an image upright by it.
 *
 * Phones store photos as the sensor saw them and put the rotation in EXIF
 * tag 0x0112; every viewer applies it, so a model that gets the raw pixels
 * sees the photo sideways. Only the orientation is read, from IFD0 of the
 * TIFF structure EXIF is (JPEG APP1, PNG eXIf, WebP EXIF chunk): no
 * library for one tag, and a small parser is easy to make safe. Every
 * read is bounds-checked against the block; the next-IFD links are never
 * followed (the tag lives in IFD0), so a hostile block cannot loop.
 */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "image/decode_internal.h"

#define EXIF_TAG_ORIENTATION 0x0112
#define TIFF_TYPE_SHORT 3

typedef struct tiff_reader {
    const uint8_t *p;
    size_t n;
    int big_endian; /* "MM" (Motorola) or "II" (Intel) */
} tiff_reader;

/* 0 when [off, off + 2) is outside the block */
static int read_u16(const tiff_reader *t, size_t off, unsigned *v) {
    if (off > t->n || t->n - off < 2) return 0;
    const uint8_t *b = t->p + off;
    *v = t->big_endian ? (unsigned)(b[0] << 8 | b[1]) : (unsigned)(b[1] << 8 | b[0]);
    return 1;
}

static int read_u32(const tiff_reader *t, size_t off, uint32_t *v) {
    if (off > t->n || t->n - off < 4) return 0;
    const uint8_t *b = t->p + off;
    if (t->big_endian)
        *v = (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
    else
        *v = (uint32_t)b[3] << 24 | (uint32_t)b[2] << 16 | (uint32_t)b[1] << 8 | b[0];
    return 1;
}

int kt_exif_orientation(const uint8_t *data, size_t n_bytes) {
    if (!data) return 1;
    if (n_bytes >= 6 && memcmp(data, "Exif\0\0", 6) == 0) {
        data += 6;
        n_bytes -= 6;
    }
    if (n_bytes < 8) return 1;
    tiff_reader t = {data, n_bytes, 0};
    if (memcmp(data, "MM", 2) == 0)
        t.big_endian = 1;
    else if (memcmp(data, "II", 2) != 0)
        return 1;
    unsigned magic, n_entries;
    uint32_t ifd0;
    if (!read_u16(&t, 2, &magic) || magic != 42 || !read_u32(&t, 4, &ifd0)) return 1;
    if (!read_u16(&t, ifd0, &n_entries)) return 1;
    for (unsigned i = 0; i < n_entries; i++) {
        size_t entry = (size_t)ifd0 + 2 + 12 * (size_t)i;
        unsigned tag, type, value;
        uint32_t count;
        if (!read_u16(&t, entry, &tag) || !read_u16(&t, entry + 2, &type) || !read_u32(&t, entry + 4, &count))
            return 1; /* the directory runs past the block */
        if (tag != EXIF_TAG_ORIENTATION) continue;
        /* one SHORT: the value sits in the first two bytes of the value field */
        if (type != TIFF_TYPE_SHORT || count < 1 || !read_u16(&t, entry + 8, &value)) return 1;
        return value >= 1 && value <= 8 ? (int)value : 1;
    }
    return 1;
}

/* Where output pixel (x, y) of the upright image (out_w x out_h) comes
 * from in the stored one (w x h), for orientations 2-8 (TIFF 6.0's
 * table of which visual side the stored row 0 and column 0 are). */
static void source_of(int o, int x, int y, int w, int h, int *sx, int *sy) {
    switch (o) {
    case 2: *sx = w - 1 - x; *sy = y; break;             /* mirrored left-right */
    case 3: *sx = w - 1 - x; *sy = h - 1 - y; break;     /* rotated 180 */
    case 4: *sx = x; *sy = h - 1 - y; break;             /* mirrored top-bottom */
    case 5: *sx = y; *sy = x; break;                     /* transposed */
    case 6: *sx = y; *sy = h - 1 - x; break;             /* needs 90 degrees clockwise */
    case 7: *sx = w - 1 - y; *sy = h - 1 - x; break;     /* transversed */
    default: *sx = w - 1 - y; *sy = x; break;            /* 8: needs 90 degrees counter-clockwise */
    }
}

kt_status kt_image_apply_orientation(kt_image *img, int orientation, kt_error *err) {
    if (orientation < 2 || orientation > 8) return KT_OK;
    int w = img->width, h = img->height;
    int swap = orientation >= 5;
    int out_w = swap ? h : w, out_h = swap ? w : h;
    uint8_t *dst = malloc((size_t)w * (size_t)h * 3);
    if (!dst) return kt_error_set(err, KT_ERR_NOMEM, "out of memory turning a %dx%d image upright", w, h);
    for (int y = 0; y < out_h; y++) {
        for (int x = 0; x < out_w; x++) {
            int sx, sy;
            source_of(orientation, x, y, w, h, &sx, &sy);
            memcpy(dst + ((size_t)y * out_w + x) * 3, img->rgb + ((size_t)sy * w + sx) * 3, 3);
        }
    }
    free(img->rgb);
    img->rgb = dst;
    img->width = out_w;
    img->height = out_h;
    return KT_OK;
}
