/*
 * make_image_seeds.c - writes the seed corpus of fuzz_image
 * (tests/fuzz/corpus/image/): one small file per decoder path, so the
 * fuzzer starts inside each format instead of at its magic bytes. Not
 * part of the build; rerun by hand if a path is added:
 *
 *   cc -std=c11 -o /tmp/make_image_seeds tests/fuzz/make_image_seeds.c \
 *      $(pkg-config --cflags --libs libpng libjpeg libwebp)
 *   /tmp/make_image_seeds tests/fuzz/corpus/image
 */
#include <stddef.h>
#include <stdio.h> /* before jpeglib.h, which needs FILE and size_t */
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <png.h>
#include <webp/encode.h>

static const char *g_dir;

static void save(const char *name, const void *p, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

/* an EXIF block (big-endian TIFF, IFD0 with the orientation only) */
static size_t exif_block(unsigned char *b, int prefix, int orientation) {
    static const unsigned char tiff[26] = {'M', 'M', 0, 42, 0, 0, 0, 8, 0, 1, 0x01, 0x12, 0, 3, 0, 0, 0, 1, 0, 0,
                                           0, 0, 0, 0, 0, 0};
    size_t o = prefix ? 6 : 0;
    if (prefix) memcpy(b, "Exif\0\0", 6);
    memcpy(b + o, tiff, sizeof tiff);
    b[o + 19] = (unsigned char)orientation;
    return o + sizeof tiff;
}

static void write_png(const char *name, int w, int h, int color, int depth, int interlace, const unsigned char *px,
                      int orientation) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "wb");
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(png);
    if (!f || !info || setjmp(png_jmpbuf(png))) exit(1);
    png_init_io(png, f);
    png_set_IHDR(png, info, w, h, depth, color, interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    if (color == PNG_COLOR_TYPE_PALETTE) {
        png_color pal[4] = {{255, 0, 0}, {0, 255, 0}, {0, 0, 255}, {9, 9, 9}};
        unsigned char trns[2] = {0, 128};
        png_set_PLTE(png, info, pal, 4);
        png_set_tRNS(png, info, trns, 2, NULL);
    }
    unsigned char exif[64];
    if (orientation) png_set_eXIf_1(png, info, (png_uint_32)exif_block(exif, 0, orientation), exif);
    png_write_info(png, info);
    size_t rb = png_get_rowbytes(png, info);
    png_bytep rows[64];
    for (int y = 0; y < h; y++) rows[y] = (png_bytep)px + y * rb;
    png_write_image(png, rows);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    fclose(f);
}

static void write_jpeg(const char *name, int w, int h, int comps, int progressive, const unsigned char *px,
                       int orientation) {
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
    jpeg_set_quality(&c, 80, TRUE);
    if (progressive) jpeg_simple_progression(&c);
    jpeg_start_compress(&c, TRUE);
    unsigned char exif[64];
    if (orientation) jpeg_write_marker(&c, JPEG_APP0 + 1, exif, (unsigned)exif_block(exif, 1, orientation));
    while (c.next_scanline < c.image_height) {
        JSAMPROW row = (JSAMPROW)px + c.next_scanline * w * comps;
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    save(name, out, n);
    free(out);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    g_dir = argv[1];
    enum { W = 12, H = 10 };
    unsigned char rgba[W * H * 4], rgb[W * H * 3], cmyk[W * H * 4], idx[W * H];
    for (int i = 0; i < W * H; i++) {
        rgba[4 * i] = rgb[3 * i] = (unsigned char)(i * 7);
        rgba[4 * i + 1] = rgb[3 * i + 1] = (unsigned char)(255 - i * 3);
        rgba[4 * i + 2] = rgb[3 * i + 2] = (unsigned char)(i * 13);
        rgba[4 * i + 3] = (unsigned char)(i * 19);
        for (int k = 0; k < 4; k++) cmyk[4 * i + k] = (unsigned char)(i * (k + 3));
        idx[i] = (unsigned char)(i % 4);
    }
    unsigned char pal4[W * H / 2]; /* 2 bits per pixel, W = 12: 3 bytes per row */
    for (int y = 0; y < H; y++)
        for (int b = 0; b < 3; b++)
            pal4[y * 3 + b] = (unsigned char)(idx[y * W + 4 * b] << 6 | idx[y * W + 4 * b + 1] << 4 |
                                              idx[y * W + 4 * b + 2] << 2 | idx[y * W + 4 * b + 3]);
    write_png("rgb.png", W, H, PNG_COLOR_TYPE_RGB, 8, 0, rgb, 0);
    write_png("rgba_interlaced.png", W, H, PNG_COLOR_TYPE_RGB_ALPHA, 8, 1, rgba, 0);
    write_png("palette_trns.png", W, H, PNG_COLOR_TYPE_PALETTE, 2, 0, pal4, 0);
    write_png("gray16_exif6.png", W / 2, H, PNG_COLOR_TYPE_GRAY, 16, 0, rgb, 6);
    write_jpeg("baseline.jpg", W, H, 3, 0, rgb, 0);
    write_jpeg("progressive_exif8.jpg", W, H, 3, 1, rgb, 8);
    write_jpeg("gray.jpg", W, H, 1, 0, idx, 0);
    write_jpeg("cmyk.jpg", W, H, 4, 0, cmyk, 3);
    unsigned char *out = NULL;
    size_t n = WebPEncodeLosslessRGBA(rgba, W, H, W * 4, &out);
    save("lossless_alpha.webp", out, n);
    WebPFree(out);
    n = WebPEncodeRGB(rgb, W, H, W * 3, 75.0f, &out);
    save("lossy.webp", out, n);
    WebPFree(out);
    n = WebPEncodeRGBA(rgba, W, H, W * 4, 75.0f, &out); /* lossy with an ALPH chunk (VP8X) */
    save("lossy_alpha.webp", out, n);
    WebPFree(out);
    return 0;
}
