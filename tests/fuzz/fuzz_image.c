/*
 * fuzz_image.c - libFuzzer target: kt_image_decode on arbitrary bytes
 * (PNG through libpng, JPEG through libjpeg-turbo, WebP through libwebp,
 * the EXIF parser), then, for what decodes, the Qwen3-VL preprocessing
 * (target size, bicubic resize, letterbox, normalisation).
 *
 * Small limits (64 KB, 1024 per side, 256K pixels) keep each input to
 * milliseconds: the limit checks are what stop a bomb, and those paths are
 * fuzzed too (most mutated headers claim huge sizes). The preprocessing
 * gets a small max_pixels for the same reason.
 */
#include <stddef.h>
#include <stdint.h>

#include "image/image.h"

static volatile unsigned g_sink; /* keeps the reads from being optimised away */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kt_image_limits lim = {.max_bytes = 64 << 10, .max_side = 1024, .max_pixels = 256 * 1024};
    kt_image img;
    kt_error err;
    if (kt_image_decode(data, size, &lim, &img, &err) != KT_OK) return 0;
    /* touch every pixel so ASan checks the whole buffer */
    unsigned sum = 0;
    for (size_t i = 0; i < (size_t)img.width * img.height * 3; i++) sum += img.rgb[i];
    kt_image_prep_params p = {.patch_size = 16, .merge_size = 2, .min_pixels = 8 * 32 * 32,
                              .max_pixels = 64 * 32 * 32, .mean = {0.5f, 0.5f, 0.5f}, .std = {0.5f, 0.5f, 0.5f}};
    kt_image_prep prep;
    if (kt_image_preprocess(&img, &p, &prep, &err) == KT_OK) {
        for (size_t i = 0; i < (size_t)3 * prep.width * prep.height; i++) sum += prep.pixels[i] > 0.0f;
        kt_image_prep_free(&prep);
    }
    kt_image_free(&img);
    g_sink = sum;
    return 0;
}
