/*
 * test_image.c - src/image/: decoding (PNG, JPEG, WebP; limits, alpha,
 * EXIF orientation, hostile files) and the Qwen-VL preprocessing against
 * llama.cpp's goldens in shared/golden/arch, bit for bit.
 *
 * The format tests make their files here with libpng, libjpeg and libwebp
 * (the encoders of the same libraries), so every case says exactly which
 * pixels went in.
 */
#include <setjmp.h>
#include <stddef.h>
#include <stdio.h> /* before jpeglib.h, which needs FILE and size_t */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <jpeglib.h>
#include <nettle/sha2.h>
#include <png.h>
#include <webp/encode.h>

#include "testutil.h"

#include "base/rng.h"
#include "gguf/gguf.h"
#include "image/decode_internal.h"
#include "image/image.h"

/* ---- helpers: a growing byte buffer and encoders into it ---- */

typedef struct membuf {
    uint8_t *p;
    size_t n, cap;
} membuf;

static void mb_append(membuf *m, const void *d, size_t n) {
    if (m->n + n > m->cap) {
        m->cap = (m->n + n) * 2 + 64;
        m->p = realloc(m->p, m->cap);
        assert_non_null(m->p);
    }
    memcpy(m->p + m->n, d, n);
    m->n += n;
}

static void mb_png_write(png_structp png, png_bytep d, size_t n) {
    mb_append(png_get_io_ptr(png), d, n);
}
static void mb_png_flush(png_structp png) {
    (void)png;
}

typedef struct png_spec {
    int w, h, color_type, bit_depth, interlace;
    const uint8_t *data; /* rows as the PNG holds them (16-bit: big-endian) */
    const png_color *palette;
    int n_palette;
    const uint8_t *trns;
    int n_trns;
    const uint8_t *exif;
    int n_exif;
} png_spec;

static membuf png_encode(const png_spec *s) {
    membuf m = {0};
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(png);
    assert_non_null(info);
    if (setjmp(png_jmpbuf(png))) fail_msg("libpng could not write the test PNG");
    png_set_write_fn(png, &m, mb_png_write, mb_png_flush);
    png_set_IHDR(png, info, s->w, s->h, s->bit_depth, s->color_type,
                 s->interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
                 PNG_FILTER_TYPE_DEFAULT);
    if (s->palette) png_set_PLTE(png, info, s->palette, s->n_palette);
    if (s->trns) png_set_tRNS(png, info, s->trns, s->n_trns, NULL);
    if (s->exif) png_set_eXIf_1(png, info, s->n_exif, (png_bytep)s->exif);
    png_write_info(png, info);
    size_t rowbytes = png_get_rowbytes(png, info);
    png_bytep *rows = tu_xmalloc(sizeof *rows * s->h);
    for (int y = 0; y < s->h; y++) rows[y] = (png_bytep)s->data + (size_t)y * rowbytes;
    png_write_image(png, rows); /* does the Adam7 passes itself */
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    free(rows);
    return m;
}

static membuf png_rgb(const uint8_t *rgb, int w, int h, int interlace) {
    png_spec s = {.w = w, .h = h, .color_type = PNG_COLOR_TYPE_RGB, .bit_depth = 8, .interlace = interlace, .data = rgb};
    return png_encode(&s);
}

/* a scan script for the next jpeg_encode (NULL: the default) */
static const jpeg_scan_info *g_scans;
static int g_n_scans;

/* comps 1 (gray), 3 (RGB) or 4 (CMYK); app1 an APP1 payload or NULL */
static membuf jpeg_encode(const uint8_t *px, int w, int h, int comps, int quality, int progressive,
                          const uint8_t *app1, size_t n_app1) {
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr e;
    c.err = jpeg_std_error(&e);
    jpeg_create_compress(&c);
    unsigned char *out = NULL;
    unsigned long n = 0;
    jpeg_mem_dest(&c, &out, &n);
    c.image_width = w;
    c.image_height = h;
    c.input_components = comps;
    c.in_color_space = comps == 1 ? JCS_GRAYSCALE : comps == 3 ? JCS_RGB : JCS_CMYK;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, quality, TRUE);
    if (progressive) jpeg_simple_progression(&c);
    if (g_scans) {
        c.scan_info = g_scans;
        c.num_scans = g_n_scans;
    }
    jpeg_start_compress(&c, TRUE);
    if (app1) jpeg_write_marker(&c, JPEG_APP0 + 1, app1, (unsigned)n_app1);
    while (c.next_scanline < c.image_height) {
        JSAMPROW row = (JSAMPROW)px + (size_t)c.next_scanline * w * comps;
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    membuf m = {0};
    mb_append(&m, out, n);
    free(out);
    return m;
}

static membuf webp_lossless_rgb(const uint8_t *rgb, int w, int h) {
    uint8_t *out = NULL;
    size_t n = WebPEncodeLosslessRGB(rgb, w, h, w * 3, &out);
    assert_true(n > 0);
    membuf m = {0};
    mb_append(&m, out, n);
    WebPFree(out);
    return m;
}

static void expect_refusal(const membuf *m, const kt_image_limits *lim, kt_status want, const char *needle,
                           const char *what);

static kt_image decode_ok(const membuf *m, const char *what) {
    kt_image img;
    kt_error err = {0};
    kt_status st = kt_image_decode(m->p, m->n, NULL, &img, &err);
    if (st != KT_OK) fail_msg("%s: %s", what, err.msg);
    return img;
}

static void assert_rgb_equal(const kt_image *img, const uint8_t *want, int w, int h, const char *what) {
    assert_int_equal(img->width, w);
    assert_int_equal(img->height, h);
    for (size_t i = 0; i < (size_t)w * h * 3; i++)
        if (img->rgb[i] != want[i])
            fail_msg("%s: sample %zu (pixel %zu, channel %zu) is %u, want %u", what, i, i / 3, i % 3, img->rgb[i],
                     want[i]);
}

/* max |a - b| over n samples; *n_diff the count that differ */
static int max_abs_diff(const uint8_t *a, const uint8_t *b, size_t n, size_t *n_diff) {
    int m = 0;
    size_t d = 0;
    for (size_t i = 0; i < n; i++) {
        int v = abs((int)a[i] - (int)b[i]);
        if (v > m) m = v;
        d += v != 0;
    }
    if (n_diff) *n_diff = d;
    return m;
}

static uint8_t *pattern_rgb(int w, int h, uint32_t seed) {
    uint8_t *p = tu_xmalloc((size_t)w * h * 3);
    for (int i = 0; i < w * h * 3; i++) p[i] = (uint8_t)((i * 37 + seed * 101 + (i / 7) * 13) & 0xff);
    return p;
}

/* ---- the goldens: preprocessing for both towers, all three images ---- */

static char *sha256_hex(const void *data, size_t n) {
    struct sha256_ctx ctx;
    uint8_t d[SHA256_DIGEST_SIZE];
    sha256_init(&ctx);
    sha256_update(&ctx, n, data);
    sha256_digest(&ctx, sizeof d, d);
    char *hex = tu_xmalloc(2 * sizeof d + 1);
    for (size_t i = 0; i < sizeof d; i++) sprintf(hex + 2 * i, "%02x", d[i]);
    return hex;
}

static kt_image decode_file(const char *path) {
    size_t n;
    char *bytes = tu_read_file(path, &n);
    if (!bytes) fail_msg("cannot read %s", path);
    kt_image img;
    kt_error err = {0};
    kt_status st = kt_image_decode(bytes, n, NULL, &img, &err);
    free(bytes);
    if (st != KT_OK) fail_msg("%s: %s", path, err.msg);
    return img;
}

static void read_f32_array(gguf_file *f, const char *key, float out[3]) {
    int64_t i = gguf_find_key(f, key);
    assert_true(i >= 0);
    assert_int_equal(gguf_kv_arr_type(f, i), GGUF_F32);
    assert_int_equal(gguf_kv_arr_n(f, i), 3);
    memcpy(out, gguf_kv_arr_data(f, i), 3 * sizeof(float));
}

/* The tower's parameters as kt_vision will take them: patch and mean / std
 * from the mmproj file, merge 2, llama.cpp's 8-4096 merged tokens. */
static kt_image_prep_params params_from_mmproj(const char *tower) {
    char rel[128];
    snprintf(rel, sizeof rel, "golden/arch/mmproj-%s-F16.gguf", tower);
    kt_error err = {0};
    gguf_file *f = gguf_open(tu_shared(rel), &err);
    if (!f) fail_msg("%s", err.msg);
    kt_image_prep_params p = {0};
    int64_t patch = 0;
    assert_true(gguf_get_i64(f, "clip.vision.patch_size", 0, &patch));
    p.patch_size = (int)patch;
    p.merge_size = 2;
    read_f32_array(f, "clip.vision.image_mean", p.mean);
    read_f32_array(f, "clip.vision.image_std", p.std);
    gguf_close(f);
    int64_t a = p.patch_size * p.merge_size;
    p.min_pixels = 8 * a * a;
    p.max_pixels = 4096 * a * a;
    return p;
}

static json_t *load_json(const char *rel) {
    json_error_t je;
    json_t *j = json_load_file(tu_shared(rel), 0, &je);
    if (!j) fail_msg("%s: %s", rel, je.text);
    return j;
}

static int json_int_at(json_t *obj, const char *key, size_t idx) {
    json_t *a = json_object_get(obj, key);
    assert_true(json_is_array(a));
    return (int)json_integer_value(json_array_get(a, idx));
}

static void check_golden(const char *tower, const char *img_name, int patch, const float mean[3],
                         const float std[3]) {
    char rel[160];
    kt_image_prep_params p = params_from_mmproj(tower);
    assert_int_equal(p.patch_size, patch);
    for (int c = 0; c < 3; c++) {
        assert_true(p.mean[c] == mean[c]);
        assert_true(p.std[c] == std[c]);
    }
    snprintf(rel, sizeof rel, "golden/arch/vision-%s-%s.preproc.json", tower, img_name);
    json_t *j = load_json(rel);
    json_t *resize = json_object_get(j, "resize"), *tensor = json_object_get(j, "tensor");
    assert_int_equal(json_integer_value(json_object_get(resize, "min_pixels")), p.min_pixels);
    assert_int_equal(json_integer_value(json_object_get(resize, "max_pixels")), p.max_pixels);

    /* the photo's input is stb_image's decode of the JPEG (libmtmd's decoder) */
    snprintf(rel, sizeof rel, "golden/arch/image-%s.png", strcmp(img_name, "photo") ? img_name : "photo.decoded");
    kt_image img = decode_file(tu_shared(rel));
    char *rgb_sha = sha256_hex(img.rgb, (size_t)img.width * img.height * 3);
    assert_string_equal(rgb_sha, json_string_value(json_object_get(j, "decoded_rgb_sha256")));
    free(rgb_sha);

    kt_image_prep prep;
    kt_error err = {0};
    if (kt_image_preprocess(&img, &p, &prep, &err) != KT_OK) fail_msg("%s %s: %s", tower, img_name, err.msg);
    assert_int_equal(prep.width, json_integer_value(json_object_get(tensor, "width")));
    assert_int_equal(prep.height, json_integer_value(json_object_get(tensor, "height")));
    assert_int_equal(prep.content_w, json_int_at(resize, "resized", 0));
    assert_int_equal(prep.content_h, json_int_at(resize, "resized", 1));
    assert_int_equal(prep.off_x, json_int_at(resize, "offset", 0));
    assert_int_equal(prep.off_y, json_int_at(resize, "offset", 1));
    assert_int_equal(prep.grid_x, prep.width / (2 * patch));
    assert_int_equal(prep.grid_y, prep.height / (2 * patch));

    snprintf(rel, sizeof rel, "golden/arch/vision-%s-%s.preproc.png", tower, img_name);
    kt_image canvas = decode_file(tu_shared(rel));
    char what[160];
    snprintf(what, sizeof what, "%s %s canvas", tower, img_name);
    kt_image ours = {prep.width, prep.height, prep.canvas_rgb};
    assert_rgb_equal(&ours, canvas.rgb, canvas.width, canvas.height, what);

    size_t n_floats = (size_t)3 * prep.width * prep.height;
    char *sha = sha256_hex(prep.pixels, n_floats * sizeof(float));
    if (strcmp(sha, json_string_value(json_object_get(tensor, "sha256"))) != 0)
        fail_msg("%s %s: tensor sha256 %s, golden %s", tower, img_name, sha,
                 json_string_value(json_object_get(tensor, "sha256")));
    free(sha);
    if (strcmp(img_name, "tiny") == 0) {
        snprintf(rel, sizeof rel, "golden/arch/vision-%s-tiny.preproc.f32", tower);
        size_t n;
        char *f32 = tu_read_file(tu_shared(rel), &n);
        assert_non_null(f32);
        assert_int_equal(n, n_floats * sizeof(float));
        assert_memory_equal(f32, prep.pixels, n);
        free(f32);
    }
    kt_image_prep_free(&prep);
    kt_image_free(&canvas);
    kt_image_free(&img);
    json_decref(j);
}

static const float HALF[3] = {0.5f, 0.5f, 0.5f};
static const float CLIP_MEAN[3] = {0.48145466f, 0.4578275f, 0.40821073f};
static const float CLIP_STD[3] = {0.26862954f, 0.26130258f, 0.27577711f};

static void test_golden_qwen3vl(void **state) {
    (void)state;
    const char *imgs[] = {"screenshot", "photo", "tiny"};
    for (int i = 0; i < 3; i++) check_golden("qwen3vl", imgs[i], 16, HALF, HALF);
}

static void test_golden_qwen25vl(void **state) {
    (void)state;
    const char *imgs[] = {"screenshot", "photo", "tiny"};
    for (int i = 0; i < 3; i++) check_golden("qwen25vl", imgs[i], 14, CLIP_MEAN, CLIP_STD);
}

/* libjpeg-turbo's decode of the photo against stb_image's (the README:
 * 3.1% of the samples differ, by at most 3). */
static void test_photo_jpeg_close_to_stb(void **state) {
    (void)state;
    kt_image jpg = decode_file(tu_shared("golden/arch/image-photo.jpg"));
    kt_image ref = decode_file(tu_shared("golden/arch/image-photo.decoded.png"));
    assert_int_equal(jpg.width, 500);
    assert_int_equal(jpg.height, 333);
    assert_int_equal(ref.width, 500);
    assert_int_equal(ref.height, 333);
    size_t n = (size_t)500 * 333 * 3, n_diff;
    int m = max_abs_diff(jpg.rgb, ref.rgb, n, &n_diff);
    printf("photo.jpg vs stb: max diff %d, %.2f%% of samples differ\n", m, 100.0 * n_diff / n);
    assert_true(m <= 3);
    assert_true(n_diff < n / 20);
    kt_image_free(&jpg);
    kt_image_free(&ref);
}

/* ---- preprocessing geometry without goldens ---- */

static void expect_geometry(const kt_image *img, const kt_image_prep_params *p, int w, int h, int cw, int ch,
                            int ox, int oy) {
    kt_image_prep prep;
    kt_error err = {0};
    if (kt_image_preprocess(img, p, &prep, &err) != KT_OK) fail_msg("%s", err.msg);
    if (prep.width != w || prep.height != h || prep.content_w != cw || prep.content_h != ch || prep.off_x != ox ||
        prep.off_y != oy)
        fail_msg("%dx%d: canvas %dx%d content %dx%d at (%d, %d); want %dx%d, %dx%d at (%d, %d)", img->width,
                 img->height, prep.width, prep.height, prep.content_w, prep.content_h, prep.off_x, prep.off_y, w, h, cw,
                 ch, ox, oy);
    int a = p->patch_size * p->merge_size;
    assert_int_equal(prep.grid_x, w / a);
    assert_int_equal(prep.grid_y, h / a);
    kt_image_prep_free(&prep);
}

/* Sizes worked out by hand from calc_size_preserved_ratio's steps. */
static void test_preprocess_geometry(void **state) {
    (void)state;
    kt_image_prep_params p = {16, 2, 8 * 32 * 32, 4096 * 32 * 32, {0.5f, 0.5f, 0.5f}, {0.5f, 0.5f, 0.5f}};
    /* 1 x 1: 32 x 32 after rounding up, under min_pixels (8192): beta =
     * sqrt(8192) = 90.5, each side ceil(90.5 / 32) 32 = 96 */
    uint8_t px[3] = {255, 0, 128};
    kt_image one = {1, 1, px};
    kt_image_prep prep;
    kt_error err = {0};
    assert_int_equal(kt_image_preprocess(&one, &p, &prep, &err), KT_OK);
    assert_int_equal(prep.width, 96);
    assert_int_equal(prep.height, 96);
    assert_int_equal(prep.content_w, 96);
    assert_int_equal(prep.off_x, 0);
    /* a uniform colour stays uniform through the bicubic (weights sum to 1) */
    for (int i = 0; i < 96 * 96; i++) assert_memory_equal(prep.canvas_rgb + 3 * i, px, 3);
    size_t plane = (size_t)96 * 96;
    assert_true(prep.pixels[0] == 1.0f);
    assert_true(prep.pixels[plane] == -1.0f);
    assert_true(prep.pixels[2 * plane + 5] == (128.0f / 255.0f - 0.5f) / 0.5f);
    kt_image_prep_free(&prep);
    /* over max_pixels (here 64 tokens, 65536): 400 x 300 rounds to 416 x
     * 288; beta = sqrt(120000 / 65536) = 1.353, sides floor(300 / beta / 32)
     * 32 = 192 and floor(400 / beta / 32) 32 = 288; s = min(0.72, 0.64):
     * content 256 x 192 at x 16 */
    kt_image_prep_params small = p;
    small.max_pixels = 64 * 32 * 32;
    uint8_t *rgb = pattern_rgb(400, 300, 2);
    kt_image mid = {400, 300, rgb};
    expect_geometry(&mid, &small, 288, 192, 256, 192, 16, 0);
    free(rgb);
    /* a strip: the max(A, ...) floor keeps the height at 32, so the canvas
     * (5120 x 32) ends above max_pixels, as llama.cpp's does; s = 0.64,
     * content 5120 x ceil(12.8) = 13 at y (32 - 13) / 2 = 9 */
    rgb = pattern_rgb(8000, 20, 3);
    kt_image strip = {8000, 20, rgb};
    expect_geometry(&strip, &small, 5120, 32, 5120, 13, 0, 9);
    /* rounding half away from zero: 80 / 32 = 2.5 -> 3 -> 96, 720 / 32 =
     * 22.5 -> 23 -> 736; s = min(1.2, 1.0222): content ceil(81.8) = 82 x
     * min(ceil(736.0), 736) at x (96 - 82) / 2 = 7 */
    expect_geometry(&(kt_image){80, 720, rgb}, &p, 96, 736, 82, 736, 7, 0);
    free(rgb);
    /* bad parameters are refused */
    kt_image_prep_params bad = p;
    bad.std[1] = 0.0f;
    assert_int_equal(kt_image_preprocess(&one, &bad, &prep, &err), KT_ERR_ARG);
    bad = p;
    bad.patch_size = 0;
    assert_int_equal(kt_image_preprocess(&one, &bad, &prep, &err), KT_ERR_ARG);
    bad = p;
    bad.min_pixels = bad.max_pixels + 1;
    assert_int_equal(kt_image_preprocess(&one, &bad, &prep, &err), KT_ERR_ARG);
    kt_image empty = {0};
    assert_int_equal(kt_image_preprocess(&empty, &p, &prep, &err), KT_ERR_ARG);
    assert_null(prep.pixels);
    assert_null(prep.canvas_rgb);
}

/* A deferred prep (image.h) realized is what decode + preprocess give,
 * byte for byte; realizing again does nothing; a grid other than the
 * bytes' is refused with the prep left deferred; bad arguments refused;
 * an unrealized prep freed (ASan sees the kept bytes go). */
static void test_deferred_prep(void **state) {
    (void)state;
    kt_image_prep_params p = {16, 2, 8 * 32 * 32, 4096 * 32 * 32, {0.48f, 0.46f, 0.41f}, {0.27f, 0.26f, 0.28f}};
    kt_image_limits lim;
    kt_image_limits_default(&lim);
    uint8_t *rgb = pattern_rgb(300, 200, 7);
    membuf m = png_rgb(rgb, 300, 200, 0);
    kt_image img;
    kt_image_prep now, later, wrong;
    kt_error err = {0};
    assert_int_equal(kt_image_decode(m.p, m.n, &lim, &img, &err), KT_OK);
    assert_int_equal(kt_image_preprocess(&img, &p, &now, &err), KT_OK);
    kt_image_free(&img);
    assert_int_equal(kt_image_prep_defer(&later, m.p, m.n, &lim, &p, now.grid_x, now.grid_y, &err), KT_OK);
    m.p[0] ^= 0xff; /* the prep keeps its own copy */
    assert_true(kt_image_prep_deferred(&later));
    assert_null(later.pixels);
    assert_int_equal(later.grid_x, now.grid_x);
    assert_int_equal(kt_image_prep_realize(&later, &err), KT_OK);
    assert_false(kt_image_prep_deferred(&later));
    assert_int_equal(later.width, now.width);
    assert_int_equal(later.height, now.height);
    assert_int_equal(later.off_x, now.off_x);
    assert_memory_equal(later.pixels, now.pixels, sizeof(float) * 3 * (size_t)now.width * (size_t)now.height);
    assert_memory_equal(later.canvas_rgb, now.canvas_rgb, 3 * (size_t)now.width * (size_t)now.height);
    assert_int_equal(kt_image_prep_realize(&later, &err), KT_OK); /* not deferred: nothing to do */
    m.p[0] ^= 0xff;
    assert_int_equal(kt_image_prep_defer(&wrong, m.p, m.n, &lim, &p, now.grid_x + 1, now.grid_y, &err), KT_OK);
    assert_int_equal(kt_image_prep_realize(&wrong, &err), KT_ERR_INTERNAL);
    assert_non_null(strstr(err.msg, "not the"));
    assert_true(kt_image_prep_deferred(&wrong));
    kt_image_prep_free(&wrong);
    /* bytes that no longer decode (cut short): the decoder's error, still deferred */
    assert_int_equal(kt_image_prep_defer(&wrong, m.p, m.n / 2, &lim, &p, now.grid_x, now.grid_y, &err), KT_OK);
    assert_int_equal(kt_image_prep_realize(&wrong, &err), KT_ERR_FORMAT);
    assert_true(kt_image_prep_deferred(&wrong));
    kt_image_prep_free(&wrong);
    assert_int_equal(kt_image_prep_defer(&wrong, m.p, 0, &lim, &p, 1, 1, &err), KT_ERR_ARG);
    assert_int_equal(kt_image_prep_defer(&wrong, m.p, m.n, &lim, &p, 0, 1, &err), KT_ERR_ARG);
    assert_false(kt_image_prep_deferred(&wrong));
    kt_image_prep_free(&now), kt_image_prep_free(&later);
    free(m.p), free(rgb);
}

/* ---- formats ---- */

static void test_sniff(void **state) {
    (void)state;
    assert_string_equal(kt_image_sniff("\x89PNG\r\n\x1a\n....", 12), "png");
    assert_string_equal(kt_image_sniff("\xff\xd8\xff\xe0", 4), "jpeg");
    assert_string_equal(kt_image_sniff("RIFF\0\0\0\0WEBPVP8 ", 16), "webp");
    assert_null(kt_image_sniff("RIFF\0\0\0\0WAVEfmt ", 16));
    assert_null(kt_image_sniff("GIF89a", 6));
    assert_null(kt_image_sniff("\x89PN", 3));
    kt_image img;
    kt_error err = {0};
    assert_int_equal(kt_image_decode("GIF89a\x01\0\x01\0\0\0", 12, NULL, &img, &err), KT_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "not a PNG, JPEG or WebP image (starts with 47 49 46 38 39 61"));
    assert_non_null(strstr(err.msg, "GIF"));
    assert_null(img.rgb);
    assert_int_equal(kt_image_decode("hello world", 11, NULL, &img, &err), KT_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "68 65 6c 6c 6f"));
    assert_int_equal(kt_image_decode("", 0, NULL, &img, &err), KT_ERR_FORMAT);
    assert_int_equal(kt_image_decode(NULL, 0, NULL, &img, &err), KT_ERR_FORMAT);
    /* cut inside the signature: truncated, not "another format" */
    assert_int_equal(kt_image_decode("\x89PNG", 4, NULL, &img, &err), KT_ERR_FORMAT);
    assert_int_equal(kt_image_decode("RIFF\0\0", 6, NULL, &img, &err), KT_ERR_FORMAT);
}

static void test_png_rgb_and_interlaced(void **state) {
    (void)state;
    int w = 13, h = 11;
    uint8_t *rgb = pattern_rgb(w, h, 1);
    for (int interlace = 0; interlace < 2; interlace++) {
        membuf m = png_rgb(rgb, w, h, interlace);
        kt_image img = decode_ok(&m, interlace ? "interlaced PNG" : "PNG");
        assert_rgb_equal(&img, rgb, w, h, interlace ? "interlaced PNG" : "PNG");
        kt_image_free(&img);
        free(m.p);
    }
    free(rgb);
}

static void test_png_alpha_over_white(void **state) {
    (void)state;
    /* hand-checked values of (c a + 255 (255 - a) + 127) / 255 */
    assert_int_equal(kt_image_over_white(100, 128), 177);
    assert_int_equal(kt_image_over_white(0, 0), 255);
    assert_int_equal(kt_image_over_white(37, 255), 37);
    assert_int_equal(kt_image_over_white(0, 1), 254);
    assert_int_equal(kt_image_over_white(0, 254), 1);
    int w = 16, h = 16;
    uint8_t rgba[16 * 16 * 4], want[16 * 16 * 3], ga[16 * 16 * 2], want_ga[16 * 16 * 3];
    for (int i = 0; i < w * h; i++) {
        uint8_t a = (uint8_t)(i * 7 + (i == 0 ? 0 : 3)), r = (uint8_t)(i * 3), g = (uint8_t)(255 - i), b = (uint8_t)(i * 11);
        if (i == 1) a = 255;
        rgba[4 * i] = r, rgba[4 * i + 1] = g, rgba[4 * i + 2] = b, rgba[4 * i + 3] = a;
        uint8_t c[3] = {r, g, b};
        for (int k = 0; k < 3; k++) want[3 * i + k] = (uint8_t)((c[k] * a + 255 * (255 - a) + 127) / 255);
        ga[2 * i] = (uint8_t)(i * 5), ga[2 * i + 1] = a;
        for (int k = 0; k < 3; k++) want_ga[3 * i + k] = (uint8_t)((ga[2 * i] * a + 255 * (255 - a) + 127) / 255);
    }
    assert_int_equal(want[0], 255); /* alpha 0: white */
    assert_int_equal(want[3], rgba[4]); /* alpha 255: unchanged */
    png_spec s = {.w = w, .h = h, .color_type = PNG_COLOR_TYPE_RGB_ALPHA, .bit_depth = 8, .interlace = 0, .data = rgba};
    membuf m = png_encode(&s);
    kt_image img = decode_ok(&m, "RGBA PNG");
    assert_rgb_equal(&img, want, w, h, "RGBA PNG");
    kt_image_free(&img);
    free(m.p);
    png_spec g = {.w = w, .h = h, .color_type = PNG_COLOR_TYPE_GRAY_ALPHA, .bit_depth = 8, .interlace = 1, .data = ga};
    m = png_encode(&g);
    img = decode_ok(&m, "gray+alpha PNG");
    assert_rgb_equal(&img, want_ga, w, h, "gray+alpha PNG (interlaced)");
    kt_image_free(&img);
    free(m.p);
    /* the same RGBA pixels as lossless WebP */
    uint8_t *out = NULL;
    size_t n = WebPEncodeLosslessRGBA(rgba, w, h, w * 4, &out);
    assert_true(n > 0);
    membuf wm = {0};
    mb_append(&wm, out, n);
    WebPFree(out);
    img = decode_ok(&wm, "RGBA WebP");
    assert_rgb_equal(&img, want, w, h, "lossless RGBA WebP");
    kt_image_free(&img);
    free(wm.p);
}

static void test_png_16bit_gray_palette(void **state) {
    (void)state;
    int w = 5, h = 3;
    /* 16-bit RGB: the high byte is kept (as stb_image), 0x12ff -> 0x12 */
    uint8_t rgb16[5 * 3 * 6], want[5 * 3 * 3];
    for (int i = 0; i < w * h * 3; i++) {
        rgb16[2 * i] = (uint8_t)(i * 17);
        rgb16[2 * i + 1] = 0xff;
        want[i] = (uint8_t)(i * 17);
    }
    png_spec s = {.w = w, .h = h, .color_type = PNG_COLOR_TYPE_RGB, .bit_depth = 16, .interlace = 0, .data = rgb16};
    membuf m = png_encode(&s);
    kt_image img = decode_ok(&m, "16-bit PNG");
    assert_rgb_equal(&img, want, w, h, "16-bit RGB PNG");
    kt_image_free(&img);
    free(m.p);
    /* 16-bit gray */
    uint8_t g16[5 * 3 * 2], want_g[5 * 3 * 3];
    for (int i = 0; i < w * h; i++) {
        g16[2 * i] = (uint8_t)(200 - i), g16[2 * i + 1] = 0x80;
        for (int k = 0; k < 3; k++) want_g[3 * i + k] = (uint8_t)(200 - i);
    }
    png_spec sg = {.w = w, .h = h, .color_type = PNG_COLOR_TYPE_GRAY, .bit_depth = 16, .interlace = 0, .data = g16};
    m = png_encode(&sg);
    img = decode_ok(&m, "16-bit gray PNG");
    assert_rgb_equal(&img, want_g, w, h, "16-bit gray PNG");
    kt_image_free(&img);
    free(m.p);
    /* 2-bit gray: 0..3 -> 0, 85, 170, 255; each row 5 pixels in 2 bytes */
    uint8_t g2[3 * 2] = {0x1b, 0x00, 0xe4, 0xc0, 0x55, 0x40}; /* 0 1 2 3 0 | 3 2 1 0 3 | 1 1 1 1 1 */
    int vals[15] = {0, 1, 2, 3, 0, 3, 2, 1, 0, 3, 1, 1, 1, 1, 1};
    for (int i = 0; i < 15; i++)
        for (int k = 0; k < 3; k++) want_g[3 * i + k] = (uint8_t)(vals[i] * 85);
    png_spec s2 = {.w = w, .h = h, .color_type = PNG_COLOR_TYPE_GRAY, .bit_depth = 2, .interlace = 0, .data = g2};
    m = png_encode(&s2);
    img = decode_ok(&m, "2-bit gray PNG");
    assert_rgb_equal(&img, want_g, w, h, "2-bit gray PNG");
    kt_image_free(&img);
    free(m.p);
    /* 4-bit palette with a transparent and a half-transparent entry */
    png_color pal[4] = {{255, 0, 0}, {0, 255, 0}, {0, 0, 255}, {10, 20, 30}};
    uint8_t trns[4] = {0, 128, 255, 255};
    uint8_t idx4[3 * 3] = {0x01, 0x23, 0x00, 0x32, 0x10, 0x30, 0x22, 0x22, 0x20};
    int ids[15] = {0, 1, 2, 3, 0, 3, 2, 1, 0, 3, 2, 2, 2, 2, 2};
    uint8_t want_p[15 * 3];
    for (int i = 0; i < 15; i++) {
        const png_color *c = &pal[ids[i]];
        uint8_t cc[3] = {c->red, c->green, c->blue};
        for (int k = 0; k < 3; k++) want_p[3 * i + k] = kt_image_over_white(cc[k], trns[ids[i]]);
    }
    png_spec sp = {.w = w, .h = h, .color_type = PNG_COLOR_TYPE_PALETTE, .bit_depth = 4, .data = idx4,
                   .palette = pal, .n_palette = 4, .trns = trns, .n_trns = 4};
    m = png_encode(&sp);
    img = decode_ok(&m, "palette PNG");
    assert_rgb_equal(&img, want_p, w, h, "4-bit palette PNG with tRNS");
    assert_int_equal(img.rgb[0], 255); /* transparent red -> white */
    assert_int_equal(img.rgb[1], 255);
    kt_image_free(&img);
    free(m.p);
}

static void test_jpeg_variants(void **state) {
    (void)state;
    int w = 48, h = 40;
    /* a smooth image: JPEG keeps it close */
    uint8_t *rgb = tu_xmalloc((size_t)w * h * 3);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            uint8_t *p = rgb + ((size_t)y * w + x) * 3;
            p[0] = (uint8_t)(x * 5), p[1] = (uint8_t)(y * 6), p[2] = (uint8_t)(128 + (x - y));
        }
    membuf base = jpeg_encode(rgb, w, h, 3, 92, 0, NULL, 0);
    membuf prog = jpeg_encode(rgb, w, h, 3, 92, 1, NULL, 0);
    kt_image a = decode_ok(&base, "baseline JPEG"), b = decode_ok(&prog, "progressive JPEG");
    assert_int_equal(b.width, w);
    assert_int_equal(b.height, h);
    size_t n_diff;
    int m_ab = max_abs_diff(a.rgb, b.rgb, (size_t)w * h * 3, &n_diff);
    int m_src = max_abs_diff(a.rgb, rgb, (size_t)w * h * 3, NULL);
    printf("progressive vs baseline: max diff %d; baseline vs source %d\n", m_ab, m_src);
    assert_true(m_ab <= 2);
    assert_true(m_src <= 12);
    kt_image_free(&a);
    kt_image_free(&b);
    free(base.p);
    free(prog.p);
    /* grayscale */
    uint8_t gray[16 * 16];
    memset(gray, 128, sizeof gray);
    membuf g = jpeg_encode(gray, 16, 16, 1, 95, 0, NULL, 0);
    kt_image gi = decode_ok(&g, "gray JPEG");
    for (int i = 0; i < 16 * 16 * 3; i++) assert_true(abs(gi.rgb[i] - 128) <= 1);
    kt_image_free(&gi);
    free(g.p);
    /* CMYK as Photoshop writes it (Adobe marker, inverted): C M Y K =
     * 200 100 50 255 is R G B = 200 100 50 */
    uint8_t cmyk[16 * 16 * 4];
    for (int i = 0; i < 16 * 16; i++) cmyk[4 * i] = 200, cmyk[4 * i + 1] = 100, cmyk[4 * i + 2] = 50, cmyk[4 * i + 3] = 255;
    membuf c = jpeg_encode(cmyk, 16, 16, 4, 95, 0, NULL, 0);
    kt_image ci = decode_ok(&c, "CMYK JPEG");
    const int want[3] = {200, 100, 50};
    for (int i = 0; i < 16 * 16 * 3; i++)
        if (abs(ci.rgb[i] - want[i % 3]) > 2) fail_msg("CMYK sample %d: %d, want %d", i, ci.rgb[i], want[i % 3]);
    kt_image_free(&ci);
    free(c.p);
    free(rgb);
}

/* A valid progressive file of 1 + 3 x 63 x 10 scans (each AC coefficient
 * alone, in 10 successive-approximation steps): every scan is a pass over
 * the image, so such files are refused past 1000 scans. */
static void test_jpeg_too_many_scans(void **state) {
    (void)state;
    enum { N_SCANS = 1 + 3 * 63 * 10 };
    jpeg_scan_info *scans = tu_xmalloc(sizeof *scans * N_SCANS);
    int n = 0;
    scans[n++] = (jpeg_scan_info){3, {0, 1, 2, 0}, 0, 0, 0, 0};
    for (int al = 9; al >= 0; al--)
        for (int comp = 0; comp < 3; comp++)
            for (int k = 1; k <= 63; k++)
                scans[n++] = (jpeg_scan_info){1, {comp, 0, 0, 0}, k, k, al == 9 ? 0 : al + 1, al};
    assert_int_equal(n, N_SCANS);
    uint8_t *rgb = pattern_rgb(8, 8, 4);
    g_scans = scans;
    g_n_scans = n;
    membuf m = jpeg_encode(rgb, 8, 8, 3, 90, 0, NULL, 0);
    g_scans = NULL;
    expect_refusal(&m, NULL, KT_ERR_FORMAT, "more than 1000 progressive scans", "JPEG with 1891 scans");
    free(m.p);
    /* 1 + 3 x 63 scans (no refinement) are fine */
    n = 1;
    for (int comp = 0; comp < 3; comp++)
        for (int k = 1; k <= 63; k++) scans[n++] = (jpeg_scan_info){1, {comp, 0, 0, 0}, k, k, 0, 0};
    g_scans = scans;
    g_n_scans = n;
    m = jpeg_encode(rgb, 8, 8, 3, 90, 0, NULL, 0);
    g_scans = NULL;
    kt_image img = decode_ok(&m, "JPEG with 190 scans");
    assert_int_equal(img.width, 8);
    kt_image_free(&img);
    free(m.p);
    free(scans);
    free(rgb);
}

static void test_webp(void **state) {
    (void)state;
    /* the tiny test PNG's pixels, lossless WebP round trip */
    kt_image tiny = decode_file(tu_shared("golden/arch/image-tiny.png"));
    membuf m = webp_lossless_rgb(tiny.rgb, tiny.width, tiny.height);
    kt_image img = decode_ok(&m, "lossless WebP");
    assert_rgb_equal(&img, tiny.rgb, tiny.width, tiny.height, "lossless WebP");
    kt_image_free(&img);
    free(m.p);
    /* lossy: close */
    uint8_t *out = NULL;
    size_t n = WebPEncodeRGB(tiny.rgb, tiny.width, tiny.height, tiny.width * 3, 95.0f, &out);
    assert_true(n > 0);
    membuf lm = {0};
    mb_append(&lm, out, n);
    WebPFree(out);
    img = decode_ok(&lm, "lossy WebP");
    assert_int_equal(img.width, tiny.width);
    double sum = 0;
    for (size_t i = 0; i < (size_t)tiny.width * tiny.height * 3; i++) sum += abs(img.rgb[i] - tiny.rgb[i]);
    printf("lossy WebP: mean abs diff %.2f\n", sum / (tiny.width * tiny.height * 3));
    assert_true(sum / (tiny.width * tiny.height * 3) < 6.0);
    kt_image_free(&img);
    free(lm.p);
    kt_image_free(&tiny);
}

/* An animated WebP (VP8X with the animation flag, ANIM, one ANMF frame) is
 * refused as unsupported, naming why. */
static void test_webp_animated(void **state) {
    (void)state;
    uint8_t rgb[4 * 4 * 3] = {0};
    membuf simple = webp_lossless_rgb(rgb, 4, 4);
    membuf m = {0};
    uint8_t hdr[30] = "RIFF\0\0\0\0WEBPVP8X\x0a\0\0\0";
    hdr[20] = 0x02; /* animation */
    hdr[24] = 3, hdr[27] = 3;
    mb_append(&m, hdr, 30);
    mb_append(&m, "ANIM\x06\0\0\0\0\0\0\0\0\0", 14);
    uint32_t frame = 16 + (uint32_t)(simple.n - 12);
    uint8_t anmf[24] = {'A', 'N', 'M', 'F', (uint8_t)frame, (uint8_t)(frame >> 8), 0, 0};
    anmf[8 + 6] = 3, anmf[8 + 9] = 3, anmf[8 + 12] = 100; /* 4 x 4, 100 ms */
    mb_append(&m, anmf, 24);
    mb_append(&m, simple.p + 12, simple.n - 12);
    uint32_t riff = (uint32_t)m.n - 8;
    for (int k = 0; k < 4; k++) m.p[4 + k] = (uint8_t)(riff >> (8 * k));
    expect_refusal(&m, NULL, KT_ERR_UNSUPPORTED, "animated WebP", "animated WebP");
    free(m.p);
    free(simple.p);
}

/* ---- EXIF orientation ---- */

/* A TIFF block with two other tags around the orientation, either byte
 * order; prefix adds JPEG's "Exif\0\0". */
static size_t make_exif(uint8_t *b, int big_endian, int orientation, int prefix) {
    size_t o = 0;
    if (prefix) memcpy(b, "Exif\0\0", 6), o = 6;
    uint8_t *t = b + o;
#define PUT16(off, v) (big_endian ? (t[off] = (uint8_t)((v) >> 8), t[(off) + 1] = (uint8_t)(v)) \
                                  : (t[off] = (uint8_t)(v), t[(off) + 1] = (uint8_t)((v) >> 8)))
#define PUT32(off, v) (big_endian ? (PUT16(off, (v) >> 16), PUT16((off) + 2, (v) & 0xffff)) \
                                  : (PUT16(off, (v) & 0xffff), PUT16((off) + 2, (v) >> 16)))
    memcpy(t, big_endian ? "MM" : "II", 2);
    PUT16(2, 42);
    PUT32(4, 8);
    PUT16(8, 3);
    const unsigned tags[3] = {0x010f, 0x0112, 0x0131}, types[3] = {2, 3, 2};
    for (int i = 0; i < 3; i++) {
        size_t e = 10 + 12 * i;
        PUT16(e, tags[i]);
        PUT16(e + 2, types[i]);
        PUT32(e + 4, tags[i] == 0x0112 ? 1u : 4u);
        if (tags[i] == 0x0112) {
            PUT16(e + 8, (unsigned)orientation);
            PUT16(e + 10, 0);
        } else {
            memcpy(t + e + 8, "abc", 4);
        }
    }
    PUT32(46, 0); /* no next IFD */
#undef PUT16
#undef PUT32
    return o + 50;
}

/* Which stored corner (0 TL, 1 TR, 2 BL, 3 BR) each displayed corner
 * shows, per orientation: the EXIF / TIFF 6.0 definitions, written out. */
static const int CORNER_FROM[9][4] = {
    {0, 0, 0, 0},
    {0, 1, 2, 3}, /* 1 */
    {1, 0, 3, 2}, /* 2 mirrored */
    {3, 2, 1, 0}, /* 3 rotated 180 */
    {2, 3, 0, 1}, /* 4 flipped */
    {0, 2, 1, 3}, /* 5 transposed */
    {2, 0, 3, 1}, /* 6 shown after 90 degrees clockwise */
    {3, 1, 2, 0}, /* 7 transversed */
    {1, 3, 0, 2}, /* 8 shown after 90 degrees counter-clockwise */
};

static const uint8_t CORNER_RGB[4][3] = {{255, 0, 0}, {0, 255, 0}, {0, 0, 255}, {255, 255, 255}};

/* A w x h image of four flat quadrants (TL red, TR green, BL blue, BR white). */
static uint8_t *quadrants(int w, int h) {
    uint8_t *p = tu_xmalloc((size_t)w * h * 3);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) memcpy(p + ((size_t)y * w + x) * 3, CORNER_RGB[(y >= h / 2) * 2 + (x >= w / 2)], 3);
    return p;
}

static void check_corners(const kt_image *img, int w, int h, int orientation, int tol, const char *what) {
    int swap = orientation >= 5;
    assert_int_equal(img->width, swap ? h : w);
    assert_int_equal(img->height, swap ? w : h);
    int ow = img->width, oh = img->height;
    const int xs[4] = {1, ow - 2, 1, ow - 2}, ys[4] = {1, 1, oh - 2, oh - 2};
    for (int c = 0; c < 4; c++) {
        const uint8_t *got = img->rgb + ((size_t)ys[c] * ow + xs[c]) * 3;
        const uint8_t *want = CORNER_RGB[CORNER_FROM[orientation][c]];
        for (int k = 0; k < 3; k++)
            if (abs(got[k] - want[k]) > tol)
                fail_msg("%s, orientation %d: corner %d channel %d is %d, want %d", what, orientation, c, k, got[k],
                         want[k]);
    }
}

static void test_exif_parser(void **state) {
    (void)state;
    uint8_t b[80];
    for (int be = 0; be < 2; be++)
        for (int o = 1; o <= 8; o++) {
            size_t n = make_exif(b, be, o, be);
            assert_int_equal(kt_exif_orientation(b, n), o);
        }
    size_t n = make_exif(b, 1, 6, 0);
    assert_int_equal(kt_exif_orientation(b, n), 6);
    /* cut anywhere before the orientation's value: 1, no overread (ASan) */
    for (size_t k = 0; k < 32; k++) {
        uint8_t *cut = tu_xmalloc(k ? k : 1);
        memcpy(cut, b, k);
        assert_int_equal(kt_exif_orientation(cut, k), 1);
        free(cut);
    }
    /* value out of range, wrong type, IFD offset out of range, huge count */
    make_exif(b, 1, 9, 0);
    assert_int_equal(kt_exif_orientation(b, 50), 1);
    make_exif(b, 1, 6, 0);
    b[10 + 12 + 3] = 4; /* LONG instead of SHORT */
    assert_int_equal(kt_exif_orientation(b, 50), 1);
    make_exif(b, 1, 6, 0);
    b[4] = 0x7f; /* IFD0 at 0x7f000008 */
    assert_int_equal(kt_exif_orientation(b, 50), 1);
    make_exif(b, 1, 6, 0);
    b[4] = b[5] = b[6] = b[7] = 0xff; /* IFD0 at 4 GB - 1 */
    assert_int_equal(kt_exif_orientation(b, 50), 1);
    make_exif(b, 0, 6, 0);
    b[8] = b[9] = 0xff; /* 65535 entries in a 50-byte block, tag not first */
    b[10] = 0x01, b[11] = 0x01;
    b[22] = 0x01, b[23] = 0x01;
    assert_int_equal(kt_exif_orientation(b, 50), 1);
    make_exif(b, 1, 6, 0);
    b[4] = b[5] = b[6] = 0, b[7] = 0; /* IFD0 at 0: the header read as a directory */
    assert_int_equal(kt_exif_orientation(b, 50), 1);
    assert_int_equal(kt_exif_orientation(NULL, 10), 1);
    assert_int_equal(kt_exif_orientation((const uint8_t *)"XX*\0\0\0\0\x08", 8), 1);
}

static void test_exif_png_jpeg_webp(void **state) {
    (void)state;
    int w = 32, h = 16; /* MCU-aligned quadrants: JPEG keeps them flat */
    uint8_t *rgb = quadrants(w, h);
    uint8_t exif[80];
    for (int o = 1; o <= 8; o++) {
        /* PNG eXIf: no prefix, big-endian for odd orientations */
        size_t n = make_exif(exif, o & 1, o, 0);
        png_spec s = {.w = w, .h = h, .color_type = PNG_COLOR_TYPE_RGB, .bit_depth = 8, .interlace = 0, .data = rgb};
        s.exif = exif;
        s.n_exif = (int)n;
        membuf m = png_encode(&s);
        kt_image img = decode_ok(&m, "PNG with eXIf");
        check_corners(&img, w, h, o, 0, "PNG eXIf");
        kt_image_free(&img);
        free(m.p);
        /* JPEG APP1 */
        n = make_exif(exif, !(o & 1), o, 1);
        m = jpeg_encode(rgb, w, h, 3, 95, o == 6, exif, n);
        img = decode_ok(&m, "JPEG with Exif");
        check_corners(&img, w, h, o, 12, "JPEG APP1 Exif");
        kt_image_free(&img);
        free(m.p);
    }
    /* PNG: every pixel of a 3 x 2 image rotated for 6 and 8 */
    uint8_t px[3 * 2 * 3];
    for (int i = 0; i < 18; i++) px[i] = (uint8_t)(i * 10);
    for (int o = 6; o <= 8; o += 2) {
        size_t n = make_exif(exif, 0, o, 0);
        png_spec s = {.w = 3, .h = 2, .color_type = PNG_COLOR_TYPE_RGB, .bit_depth = 8, .interlace = 0, .data = px};
        s.exif = exif;
        s.n_exif = (int)n;
        membuf m = png_encode(&s);
        kt_image img = decode_ok(&m, "PNG 3x2");
        assert_int_equal(img.width, 2);
        assert_int_equal(img.height, 3);
        /* stored pixel (x, y) is index y * 3 + x; displayed (x', y') is:
         * 6: stored (y', 1 - x'); 8: stored (2 - y', x') */
        for (int y = 0; y < 3; y++)
            for (int x = 0; x < 2; x++) {
                int sx = o == 6 ? y : 2 - y, sy = o == 6 ? 1 - x : x;
                assert_memory_equal(img.rgb + (y * 2 + x) * 3, px + (sy * 3 + sx) * 3, 3);
            }
        kt_image_free(&img);
        free(m.p);
    }
    /* hostile EXIF in the files: IFD0 out of range, a directory that runs
     * past the block, IFD0 pointing at the header: upright as stored */
    for (int k = 0; k < 3; k++) {
        size_t n = make_exif(exif + 0, 1, 6, 0);
        if (k == 0) exif[4] = 0x40;
        if (k == 1) exif[8] = 0x7f, n = 30;
        if (k == 2) exif[7] = 0;
        png_spec s = {.w = w, .h = h, .color_type = PNG_COLOR_TYPE_RGB, .bit_depth = 8, .data = rgb};
        s.exif = exif;
        s.n_exif = (int)n;
        membuf m = png_encode(&s);
        kt_image img = decode_ok(&m, "PNG with hostile eXIf");
        check_corners(&img, w, h, 1, 0, "PNG hostile eXIf");
        kt_image_free(&img);
        free(m.p);
        uint8_t app1[90];
        memcpy(app1, "Exif\0\0", 6);
        memcpy(app1 + 6, exif, n);
        m = jpeg_encode(rgb, w, h, 3, 95, 0, app1, n + 6);
        img = decode_ok(&m, "JPEG with hostile Exif");
        check_corners(&img, w, h, 1, 12, "JPEG hostile Exif");
        kt_image_free(&img);
        free(m.p);
    }
    /* WebP: an extended (VP8X) file with an EXIF chunk around a lossless
     * bitstream */
    membuf simple = webp_lossless_rgb(rgb, w, h);
    size_t n_exif = make_exif(exif, 0, 8, 0);
    membuf x = {0};
    uint8_t hdr[30] = "RIFF\0\0\0\0WEBPVP8X\x0a\0\0\0";
    hdr[20] = 0x08; /* EXIF present */
    hdr[24] = (uint8_t)(w - 1), hdr[27] = (uint8_t)(h - 1);
    mb_append(&x, hdr, 30);
    mb_append(&x, simple.p + 12, simple.n - 12); /* the VP8L chunk */
    uint8_t ch[8] = {'E', 'X', 'I', 'F', (uint8_t)n_exif, 0, 0, 0};
    mb_append(&x, ch, 8);
    mb_append(&x, exif, n_exif);
    if (n_exif & 1) mb_append(&x, "", 1);
    uint32_t riff = (uint32_t)x.n - 8;
    for (int k = 0; k < 4; k++) x.p[4 + k] = (uint8_t)(riff >> (8 * k));
    kt_image img = decode_ok(&x, "WebP with EXIF");
    check_corners(&img, w, h, 8, 0, "WebP EXIF");
    kt_image_free(&img);
    free(x.p);
    free(simple.p);
    free(rgb);
}

/* ---- limits and hostile input ---- */

static uint32_t crc32_png(const uint8_t *p, size_t n) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1)));
    }
    return ~c;
}

/* A PNG whose IHDR claims w x h, followed by a little IDAT. */
static membuf png_claiming(uint32_t w, uint32_t h) {
    uint8_t one[3] = {1, 2, 3};
    membuf m = png_rgb(one, 1, 1, 0);
    uint8_t *ihdr = m.p + 8 + 8;
    for (int k = 0; k < 4; k++) ihdr[k] = (uint8_t)(w >> (24 - 8 * k)), ihdr[4 + k] = (uint8_t)(h >> (24 - 8 * k));
    uint32_t crc = crc32_png(m.p + 12, 17);
    for (int k = 0; k < 4; k++) m.p[29 + k] = (uint8_t)(crc >> (24 - 8 * k));
    return m;
}

static void expect_refusal(const membuf *m, const kt_image_limits *lim, kt_status want, const char *needle,
                           const char *what) {
    kt_image img;
    kt_error err = {0};
    kt_status st = kt_image_decode(m->p, m->n, lim, &img, &err);
    if (st != want) fail_msg("%s: status %d (%s), want %d", what, st, err.msg, want);
    if (needle && !strstr(err.msg, needle)) fail_msg("%s: message \"%s\" lacks \"%s\"", what, err.msg, needle);
    assert_null(img.rgb);
    assert_int_equal(img.width, 0);
}

static void test_limits(void **state) {
    (void)state;
    kt_image_limits def;
    kt_image_limits_default(&def);
    assert_true(def.max_bytes >= (size_t)10 << 20);
    assert_true(def.max_side >= 8192);
    assert_true(def.max_pixels >= 33177600); /* an 8K screenshot */
    /* a header claiming 100000 x 100000: refused from the header */
    membuf bomb = png_claiming(100000, 100000);
    expect_refusal(&bomb, NULL, KT_ERR_ARG, "100000x100000 pixels; the limit is 16384 pixels per side (--image-max-side)",
                   "PNG bomb");
    free(bomb.p);
    bomb = png_claiming(16000, 16000);
    expect_refusal(&bomb, NULL, KT_ERR_ARG, "16000x16000 pixels; the limit is 40000000 pixels (--image-max-pixels)",
                   "PNG over the pixel limit");
    free(bomb.p);
    /* the same for JPEG (SOF0's size patched) and WebP (VP8L's) */
    uint8_t *rgb = pattern_rgb(16, 16, 5);
    membuf j = jpeg_encode(rgb, 16, 16, 3, 90, 0, NULL, 0);
    size_t sof = 2;
    while (sof + 9 < j.n && !(j.p[sof] == 0xff && j.p[sof + 1] == 0xc0)) sof++;
    assert_true(sof + 9 < j.n);
    j.p[sof + 5] = 0xea, j.p[sof + 6] = 0x60; /* height 60000 */
    j.p[sof + 7] = 0xea, j.p[sof + 8] = 0x60; /* width 60000 */
    expect_refusal(&j, NULL, KT_ERR_ARG, "60000x60000 pixels; the limit is 16384 pixels per side", "JPEG bomb");
    free(j.p);
    membuf wb = webp_lossless_rgb(rgb, 16, 16);
    assert_int_equal(wb.p[20], 0x2f);
    uint32_t bits = (uint32_t)wb.p[21] | (uint32_t)wb.p[22] << 8 | (uint32_t)wb.p[23] << 16 | (uint32_t)wb.p[24] << 24;
    bits = (bits & ~0x0fffffffu) | 16383u | 16383u << 14;
    for (int k = 0; k < 4; k++) wb.p[21 + k] = (uint8_t)(bits >> (8 * k));
    expect_refusal(&wb, NULL, KT_ERR_ARG, "16384x16384 pixels; the limit is 40000000 pixels (--image-max-pixels)",
                   "WebP bomb");
    free(wb.p);
    /* each limit on a real 16 x 16 PNG, at and over it */
    membuf m = png_rgb(rgb, 16, 16, 0);
    kt_image_limits lim = def;
    lim.max_bytes = m.n - 1;
    expect_refusal(&m, &lim, KT_ERR_ARG, "--image-max-bytes", "bytes");
    lim = def;
    lim.max_side = 15;
    expect_refusal(&m, &lim, KT_ERR_ARG, "--image-max-side", "side");
    lim = def;
    lim.max_pixels = 255;
    expect_refusal(&m, &lim, KT_ERR_ARG, "the limit is 255 pixels (--image-max-pixels)", "pixels");
    lim = (kt_image_limits){m.n, 16, 256};
    kt_image img;
    kt_error err = {0};
    assert_int_equal(kt_image_decode(m.p, m.n, &lim, &img, &err), KT_OK);
    kt_image_free(&img);
    free(m.p);
    free(rgb);
}

/* Every prefix (or every stride-th) of a valid file: an error or a valid
 * image, never a crash (the ASan build checks the memory); a cut in the
 * first half is always an error. */
static void truncations(const membuf *m, size_t stride, const char *what) {
    int n_ok = 0;
    for (size_t len = 0; len < m->n; len += stride) {
        uint8_t *cut = tu_xmalloc(len ? len : 1);
        memcpy(cut, m->p, len);
        kt_image img;
        kt_error err = {0};
        kt_status st = kt_image_decode(cut, len, NULL, &img, &err);
        if (st == KT_OK) {
            assert_true(img.width > 0 && img.height > 0 && img.rgb);
            n_ok++;
            if (len < m->n / 2) fail_msg("%s cut to %zu of %zu bytes decoded", what, len, m->n);
        } else {
            assert_null(img.rgb);
            assert_true(st == KT_ERR_FORMAT);
        }
        kt_image_free(&img);
        free(cut);
    }
    printf("%s: %zu bytes, %d of the prefixes decode\n", what, m->n, n_ok);
}

static void test_truncations(void **state) {
    (void)state;
    int w = 24, h = 20;
    uint8_t *rgb = pattern_rgb(w, h, 7);
    size_t stride = 1; /* every length: fast enough under ASan too */
    membuf m = png_rgb(rgb, w, h, 1);
    truncations(&m, stride, "interlaced PNG");
    free(m.p);
    m = jpeg_encode(rgb, w, h, 3, 90, 0, NULL, 0);
    truncations(&m, stride, "baseline JPEG");
    free(m.p);
    m = jpeg_encode(rgb, w, h, 3, 90, 1, NULL, 0);
    truncations(&m, stride, "progressive JPEG");
    free(m.p);
    m = webp_lossless_rgb(rgb, w, h);
    truncations(&m, stride, "lossless WebP");
    free(m.p);
    uint8_t *out = NULL;
    size_t n = WebPEncodeRGB(rgb, w, h, w * 3, 80.0f, &out);
    m = (membuf){0};
    mb_append(&m, out, n);
    WebPFree(out);
    truncations(&m, stride, "lossy WebP");
    free(m.p);
    free(rgb);
}

/* Random bytes after each valid signature, and random flips of valid
 * files: errors or images, never a crash. */
static void test_garbage(void **state) {
    (void)state;
    kt_rng rng;
    kt_rng_seed(&rng, 12345);
    static const char *const heads[3] = {"\x89PNG\r\n\x1a\n", "\xff\xd8\xff", "RIFF\xf0\0\0\0WEBP"};
    static const size_t head_n[3] = {8, 3, 12};
    uint8_t buf[600];
    int iters = 500;
    for (int f = 0; f < 3; f++)
        for (int it = 0; it < iters; it++) {
            size_t n = head_n[f] + kt_rng_u64(&rng) % 512;
            memcpy(buf, heads[f], head_n[f]);
            for (size_t i = head_n[f]; i < n; i++) buf[i] = (uint8_t)kt_rng_u64(&rng);
            kt_image img;
            kt_error err = {0};
            if (kt_image_decode(buf, n, NULL, &img, &err) == KT_OK) assert_non_null(img.rgb);
            kt_image_free(&img);
        }
    /* bit flips in valid small files */
    uint8_t *rgb = pattern_rgb(16, 12, 9);
    membuf files[4] = {png_rgb(rgb, 16, 12, 1), jpeg_encode(rgb, 16, 12, 3, 90, 1, NULL, 0),
                       webp_lossless_rgb(rgb, 16, 12), {0}};
    uint8_t *out = NULL;
    size_t n = WebPEncodeRGB(rgb, 16, 12, 48, 80.0f, &out);
    mb_append(&files[3], out, n);
    WebPFree(out);
    for (int f = 0; f < 4; f++) {
        uint8_t *copy = tu_xmalloc(files[f].n);
        for (int it = 0; it < iters; it++) {
            memcpy(copy, files[f].p, files[f].n);
            int flips = 1 + (int)(kt_rng_u64(&rng) % 4);
            for (int k = 0; k < flips; k++) copy[kt_rng_u64(&rng) % files[f].n] ^= (uint8_t)(1u << (kt_rng_u64(&rng) % 8));
            kt_image img;
            kt_error err = {0};
            if (kt_image_decode(copy, files[f].n, NULL, &img, &err) == KT_OK) assert_non_null(img.rgb);
            kt_image_free(&img);
        }
        free(copy);
        free(files[f].p);
    }
    free(rgb);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sniff),
        cmocka_unit_test(test_png_rgb_and_interlaced),
        cmocka_unit_test(test_png_alpha_over_white),
        cmocka_unit_test(test_png_16bit_gray_palette),
        cmocka_unit_test(test_jpeg_variants),
        cmocka_unit_test(test_jpeg_too_many_scans),
        cmocka_unit_test(test_webp),
        cmocka_unit_test(test_webp_animated),
        cmocka_unit_test(test_exif_parser),
        cmocka_unit_test(test_exif_png_jpeg_webp),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_truncations),
        cmocka_unit_test(test_garbage),
        cmocka_unit_test(test_preprocess_geometry),
        cmocka_unit_test(test_deferred_prep),
        cmocka_unit_test(test_golden_qwen3vl),
        cmocka_unit_test(test_golden_qwen25vl),
        cmocka_unit_test(test_photo_jpeg_close_to_stb),
    };
    return tu_result(cmocka_run_group_tests(tests, NULL, NULL));
}
