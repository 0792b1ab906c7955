/*
 * decode_jpeg.c - JPEG through libjpeg-turbo (the libjpeg API), to 8-bit
 * RGB.
 *
 * libjpeg's default error manager prints and calls exit(): ours copies
 * the message and longjmps back to jpeg_decode, and drops warnings
 * (corrupt-data warnings still give an image, as browsers show one). The
 * source manager reads from memory and treats running out of data as an
 * error, where jpeg_mem_src would pad a truncated file with an EOI and
 * hand back a grey half. A hostile progressive file can hold thousands of
 * tiny scans that each cost a pass over the image: more than
 * JPEG_MAX_SCANS is refused. Grayscale, YCbCr and RGB come out as RGB from
 * libjpeg; CMYK / YCCK come out as CMYK and are converted here (Adobe's
 * inverted convention when the file has an Adobe marker, as Photoshop
 * writes them). The APP1 "Exif" segment gives the orientation.
 */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <jerror.h>

#include "base/error.h"
#include "image/decode_internal.h"

#define JPEG_MAX_SCANS 1000 /* libjpeg-turbo's djpeg -maxscans advice; real files have < 20 */

typedef struct jpeg_ctx {
    struct jpeg_error_mgr mgr; /* first: libjpeg hands back this pointer */
    jmp_buf jump;
    char msg[JMSG_LENGTH_MAX];
    struct jpeg_source_mgr src;
    struct jpeg_progress_mgr progress;
    uint8_t *px;
    uint8_t *row; /* one CMYK row */
} jpeg_ctx;

static void jpeg_on_error(j_common_ptr cinfo) {
    jpeg_ctx *c = (jpeg_ctx *)cinfo->err;
    cinfo->err->format_message(cinfo, c->msg);
    longjmp(c->jump, 1);
}

static void jpeg_on_message(j_common_ptr cinfo, int level) {
    (void)cinfo;
    (void)level;
}

static void src_init(j_decompress_ptr cinfo) {
    (void)cinfo;
}

/* The whole file is in the buffer from the start: asking for more means
 * it ended early. */
static boolean src_fill(j_decompress_ptr cinfo) {
    ERREXIT(cinfo, JERR_INPUT_EOF);
    return FALSE;
}

static void src_skip(j_decompress_ptr cinfo, long n) {
    struct jpeg_source_mgr *s = cinfo->src;
    if (n <= 0) return;
    if ((size_t)n > s->bytes_in_buffer) ERREXIT(cinfo, JERR_INPUT_EOF);
    s->next_input_byte += n;
    s->bytes_in_buffer -= (size_t)n;
}

static void src_term(j_decompress_ptr cinfo) {
    (void)cinfo;
}

static void on_progress(j_common_ptr cinfo) {
    j_decompress_ptr d = (j_decompress_ptr)cinfo;
    if (d->input_scan_number > JPEG_MAX_SCANS) {
        jpeg_ctx *c = (jpeg_ctx *)cinfo->err;
        snprintf(c->msg, sizeof c->msg, "more than %d progressive scans", JPEG_MAX_SCANS);
        longjmp(c->jump, 1);
    }
}

static int jpeg_orientation(j_decompress_ptr cinfo) {
    for (jpeg_saved_marker_ptr m = cinfo->marker_list; m; m = m->next) {
        if (m->marker == JPEG_APP0 + 1 && m->data_length >= 6 && memcmp(m->data, "Exif\0\0", 6) == 0)
            return kt_exif_orientation(m->data, m->data_length);
    }
    return 1;
}

static void cmyk_to_rgb(const uint8_t *cmyk, uint8_t *rgb, JDIMENSION w, int adobe_inverted) {
    for (JDIMENSION x = 0; x < w; x++) {
        unsigned k = cmyk[4 * x + 3];
        for (int ch = 0; ch < 3; ch++) {
            unsigned v = cmyk[4 * x + ch];
            rgb[3 * x + ch] = adobe_inverted ? (uint8_t)((v * k + 127) / 255)
                                             : (uint8_t)(((255 - v) * (255 - k) + 127) / 255);
        }
    }
}

/* Runs under jpeg_decode's setjmp. */
static kt_status jpeg_decode_body(j_decompress_ptr cinfo, jpeg_ctx *c, const kt_image_limits *lim,
                                  kt_image *out, int *orientation, kt_error *err) {
    jpeg_save_markers(cinfo, JPEG_APP0 + 1, 0xFFFF);
    jpeg_read_header(cinfo, TRUE);
    kt_status st = kt_image_check_dims(cinfo->image_width, cinfo->image_height, lim, err);
    if (st != KT_OK) return st;
    int cmyk = cinfo->jpeg_color_space == JCS_CMYK || cinfo->jpeg_color_space == JCS_YCCK;
    cinfo->out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
    jpeg_start_decompress(cinfo);
    JDIMENSION w = cinfo->output_width, h = cinfo->output_height;
    if (cinfo->output_components != (cmyk ? 4 : 3))
        return kt_error_set(err, KT_ERR_FORMAT, "JPEG: %d components after conversion", cinfo->output_components);
    c->px = malloc((size_t)w * h * 3);
    c->row = cmyk ? malloc((size_t)w * 4) : NULL;
    if (!c->px || (cmyk && !c->row))
        return kt_error_set(err, KT_ERR_NOMEM, "out of memory decoding a %ux%u JPEG", w, h);
    while (cinfo->output_scanline < h) {
        uint8_t *dst = c->px + (size_t)cinfo->output_scanline * w * 3;
        JSAMPROW row = cmyk ? c->row : dst;
        if (jpeg_read_scanlines(cinfo, &row, 1) != 1) ERREXIT(cinfo, JERR_INPUT_EOF);
        if (cmyk) cmyk_to_rgb(c->row, dst, w, cinfo->saw_Adobe_marker);
    }
    *orientation = jpeg_orientation(cinfo);
    /* the rest of the file (trailing markers) is not needed for the pixels */
    jpeg_abort_decompress(cinfo);
    out->width = (int)w;
    out->height = (int)h;
    out->rgb = c->px;
    c->px = NULL;
    return KT_OK;
}

kt_status kt_image_decode_jpeg(const uint8_t *data, size_t n_bytes, const kt_image_limits *lim,
                               kt_image *out, int *orientation, kt_error *err) {
    /* on the heap: its fields change between setjmp and longjmp */
    jpeg_ctx *c = calloc(1, sizeof *c);
    struct jpeg_decompress_struct *cinfo = calloc(1, sizeof *cinfo);
    if (!c || !cinfo) {
        free(c);
        free(cinfo);
        return kt_error_set(err, KT_ERR_NOMEM, "out of memory starting the JPEG decoder");
    }
    cinfo->err = jpeg_std_error(&c->mgr);
    c->mgr.error_exit = jpeg_on_error;
    c->mgr.emit_message = jpeg_on_message;
    kt_status st;
    if (setjmp(c->jump)) {
        st = kt_error_set(err, KT_ERR_FORMAT, "malformed JPEG: %s", c->msg);
    } else {
        jpeg_create_decompress(cinfo);
        c->src = (struct jpeg_source_mgr){.next_input_byte = data, .bytes_in_buffer = n_bytes,
                                          .init_source = src_init, .fill_input_buffer = src_fill,
                                          .skip_input_data = src_skip, .resync_to_restart = jpeg_resync_to_restart,
                                          .term_source = src_term};
        cinfo->src = &c->src;
        c->progress.progress_monitor = on_progress;
        cinfo->progress = &c->progress;
        st = jpeg_decode_body(cinfo, c, lim, out, orientation, err);
    }
    jpeg_destroy_decompress(cinfo);
    free(c->px);
    free(c->row);
    free(c);
    free(cinfo);
    return st;
}
