/*
 * decode_webp.c - WebP (lossy, lossless, with alpha) through libwebp, to
 * 8-bit RGB.
 *
 * libwebp returns status codes (no longjmp) and decodes into a buffer we
 * allocate after WebPGetFeatures has given the size, so the limits are
 * checked before any pixel memory exists. Animated files are refused (the
 * first frame alone would misrepresent them). The EXIF chunk of an
 * extended (VP8X) file is read with WebPDemux for the orientation.
 */
#include <stdlib.h>
#include <string.h>

#include <webp/decode.h>
#include <webp/demux.h>

#include "base/error.h"
#include "image/decode_internal.h"

static const char *webp_status_text(VP8StatusCode s) {
    switch (s) {
    case VP8_STATUS_OUT_OF_MEMORY: return "out of memory";
    case VP8_STATUS_INVALID_PARAM: return "invalid parameter";
    case VP8_STATUS_BITSTREAM_ERROR: return "bitstream error";
    case VP8_STATUS_UNSUPPORTED_FEATURE: return "unsupported feature";
    case VP8_STATUS_NOT_ENOUGH_DATA: return "the file is truncated";
    default: return "decoding failed";
    }
}

static int webp_orientation(const uint8_t *data, size_t n_bytes) {
    WebPData wd = {data, n_bytes};
    WebPDemuxer *demux = WebPDemux(&wd);
    if (!demux) return 1;
    int o = 1;
    WebPChunkIterator it;
    if (WebPDemuxGetChunk(demux, "EXIF", 1, &it)) {
        o = kt_exif_orientation(it.chunk.bytes, it.chunk.size);
        WebPDemuxReleaseChunkIterator(&it);
    }
    WebPDemuxDelete(demux);
    return o;
}

kt_status kt_image_decode_webp(const uint8_t *data, size_t n_bytes, const kt_image_limits *lim,
                               kt_image *out, int *orientation, kt_error *err) {
    WebPBitstreamFeatures f;
    VP8StatusCode vs = WebPGetFeatures(data, n_bytes, &f);
    if (vs != VP8_STATUS_OK) return kt_error_set(err, KT_ERR_FORMAT, "malformed WebP: %s", webp_status_text(vs));
    kt_status st = kt_image_check_dims(f.width, f.height, lim, err);
    if (st != KT_OK) return st;
    if (f.has_animation) return kt_error_set(err, KT_ERR_UNSUPPORTED, "animated WebP images are not supported");
    size_t n_px = (size_t)f.width * (size_t)f.height;
    int channels = f.has_alpha ? 4 : 3;
    uint8_t *px = malloc(n_px * channels);
    if (!px) return kt_error_set(err, KT_ERR_NOMEM, "out of memory decoding a %dx%d WebP", f.width, f.height);
    size_t stride = (size_t)f.width * channels;
    const uint8_t *ok = f.has_alpha ? WebPDecodeRGBAInto(data, n_bytes, px, n_px * 4, (int)stride)
                                    : WebPDecodeRGBInto(data, n_bytes, px, n_px * 3, (int)stride);
    if (!ok) {
        free(px);
        return kt_error_set(err, KT_ERR_FORMAT, "malformed or truncated WebP (%dx%d)", f.width, f.height);
    }
    if (f.has_alpha) {
        kt_image_rgba_to_rgb(px, n_px);
        uint8_t *shrunk = realloc(px, n_px * 3);
        if (shrunk) px = shrunk;
    }
    *orientation = webp_orientation(data, n_bytes);
    out->width = f.width;
    out->height = f.height;
    out->rgb = px;
    return KT_OK;
}
