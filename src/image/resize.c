/*
 * resize.c - Pillow-compatible bicubic resampling (Pillow's
 * libImaging/Resample.c, as llama.cpp's libmtmd ports it), bit for bit.
 *
 * Why bit for bit: llama.cpp's vision goldens (and the models' reference
 * processors, which use Pillow) are made from these exact pixels; a
 * "better" resize would move every embedding by a little and make the
 * goldens useless as a check. So the arithmetic is Pillow's: a separable
 * filter, horizontal pass first, then vertical; per output pixel the
 * filter's support is widened by the downscale factor, the float64
 * weights are normalised to sum 1 and rounded to 22-bit fixed point
 * (+-0.5 then truncation), accumulated in int32 from a bias of 0.5, and
 * each pass is clamped to uint8. A pass whose size does not change is
 * skipped, as Pillow skips it.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "image/resize.h"

#define PRECISION_BITS (32 - 8 - 2) /* int32 minus the 8 bits of a pixel minus 2 of headroom */
#define BICUBIC_SUPPORT 2.0
#define BICUBIC_A (-0.5) /* Pillow's; PyTorch and OpenCV use -0.75 */

static double bicubic(double x) {
    if (x < 0.0) x = -x;
    if (x < 1.0) return ((BICUBIC_A + 2.0) * x - (BICUBIC_A + 3.0)) * x * x + 1;
    if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * BICUBIC_A;
    return 0.0;
}

static uint8_t clip8(int32_t v) {
    return v < 0 ? 0 : v > 255 ? 255 : (uint8_t)v;
}

/* One dimension's filter: for output index i, the input range
 * [bounds[2i], bounds[2i] + bounds[2i+1]) and its fixed-point weights
 * weights[i * ksize ...]. */
typedef struct filter_1d {
    int ksize;
    int *bounds;
    int32_t *weights;
} filter_1d;

static void filter_free(filter_1d *f) {
    free(f->bounds);
    free(f->weights);
    f->bounds = NULL;
    f->weights = NULL;
}

static kt_status filter_make(int in_size, int out_size, filter_1d *f, kt_error *err) {
    double scale = (double)in_size / out_size, filterscale = scale < 1.0 ? 1.0 : scale;
    double support = BICUBIC_SUPPORT * filterscale;
    int ksize = (int)ceil(support) * 2 + 1;
    f->ksize = ksize;
    f->bounds = malloc(sizeof *f->bounds * 2 * (size_t)out_size);
    f->weights = malloc(sizeof *f->weights * (size_t)ksize * out_size);
    double *w = malloc(sizeof *w * (size_t)ksize);
    if (!f->bounds || !f->weights || !w) {
        free(w);
        filter_free(f);
        return kt_error_set(err, KT_ERR_NOMEM, "out of memory for a %d -> %d resize filter", in_size, out_size);
    }
    const double fxp_scale = ldexp(1.0, PRECISION_BITS), ss = 1.0 / filterscale;
    for (int xx = 0; xx < out_size; xx++) {
        double center = (xx + 0.5) * scale, ww = 0.0;
        int xmin = (int)(center - support + 0.5), xmax = (int)(center + support + 0.5);
        if (xmin < 0) xmin = 0;
        if (xmax > in_size) xmax = in_size;
        xmax -= xmin;
        for (int x = 0; x < xmax; x++) {
            w[x] = bicubic((x + xmin - center + 0.5) * ss);
            ww += w[x];
        }
        int32_t *k = f->weights + (size_t)xx * ksize;
        for (int x = 0; x < ksize; x++) {
            double v = x < xmax ? (ww != 0.0 ? w[x] / ww : w[x]) : 0.0;
            k[x] = (int32_t)(v * fxp_scale + (v < 0 ? -0.5 : 0.5));
        }
        f->bounds[2 * xx] = xmin;
        f->bounds[2 * xx + 1] = xmax;
    }
    free(w);
    return KT_OK;
}

static void pass_horizontal(const uint8_t *src, int in_w, int h, uint8_t *dst, int out_w, const filter_1d *f) {
    for (int y = 0; y < h; y++) {
        const uint8_t *row = src + (size_t)y * in_w * 3;
        uint8_t *out = dst + (size_t)y * out_w * 3;
        for (int xx = 0; xx < out_w; xx++) {
            int xmin = f->bounds[2 * xx], xcnt = f->bounds[2 * xx + 1];
            const int32_t *k = f->weights + (size_t)xx * f->ksize;
            const uint8_t *p = row + (size_t)xmin * 3;
            int32_t s0 = 1 << (PRECISION_BITS - 1), s1 = s0, s2 = s0;
            for (int x = 0; x < xcnt; x++, p += 3) {
                s0 += p[0] * k[x];
                s1 += p[1] * k[x];
                s2 += p[2] * k[x];
            }
            out[3 * xx] = clip8(s0 >> PRECISION_BITS);
            out[3 * xx + 1] = clip8(s1 >> PRECISION_BITS);
            out[3 * xx + 2] = clip8(s2 >> PRECISION_BITS);
        }
    }
}

/* acc: a row of w * 3 int32 (the caller's scratch) */
static void pass_vertical(const uint8_t *src, int w, uint8_t *dst, int out_h, const filter_1d *f,
                          int32_t *acc) {
    size_t row_elems = (size_t)w * 3;
    for (int yy = 0; yy < out_h; yy++) {
        int ymin = f->bounds[2 * yy], ycnt = f->bounds[2 * yy + 1];
        const int32_t *k = f->weights + (size_t)yy * f->ksize;
        for (size_t i = 0; i < row_elems; i++) acc[i] = 1 << (PRECISION_BITS - 1);
        for (int y = 0; y < ycnt; y++) {
            const uint8_t *row = src + (size_t)(ymin + y) * row_elems;
            int32_t wt = k[y];
            for (size_t i = 0; i < row_elems; i++) acc[i] += row[i] * wt;
        }
        uint8_t *out = dst + (size_t)yy * row_elems;
        for (size_t i = 0; i < row_elems; i++) out[i] = clip8(acc[i] >> PRECISION_BITS);
    }
}

kt_status kt_image_resize_bicubic(const uint8_t *src, int src_w, int src_h, uint8_t *dst, int dst_w, int dst_h,
                                  kt_error *err) {
    if (src_w <= 0 || src_h <= 0 || dst_w <= 0 || dst_h <= 0)
        return kt_error_set(err, KT_ERR_ARG, "resize %dx%d -> %dx%d: sizes must be positive", src_w, src_h, dst_w,
                            dst_h);
    int need_h = dst_w != src_w, need_v = dst_h != src_h;
    filter_1d fh = {0}, fv = {0};
    uint8_t *tmp = NULL;
    int32_t *acc = NULL;
    kt_status st = KT_OK;
    if (need_h) st = filter_make(src_w, dst_w, &fh, err);
    if (st == KT_OK && need_v) st = filter_make(src_h, dst_h, &fv, err);
    if (st == KT_OK && need_h && need_v) {
        tmp = malloc((size_t)dst_w * src_h * 3);
        if (!tmp) st = kt_error_set(err, KT_ERR_NOMEM, "out of memory resizing to %dx%d", dst_w, dst_h);
    }
    if (st == KT_OK && need_v) {
        acc = malloc(sizeof *acc * (size_t)dst_w * 3);
        if (!acc) st = kt_error_set(err, KT_ERR_NOMEM, "out of memory resizing to %dx%d", dst_w, dst_h);
    }
    if (st == KT_OK) {
        if (need_h && need_v) {
            pass_horizontal(src, src_w, src_h, tmp, dst_w, &fh);
            pass_vertical(tmp, dst_w, dst, dst_h, &fv, acc);
        } else if (need_h) {
            pass_horizontal(src, src_w, src_h, dst, dst_w, &fh);
        } else if (need_v) {
            pass_vertical(src, src_w, dst, dst_h, &fv, acc);
        } else {
            memcpy(dst, src, (size_t)src_w * src_h * 3);
        }
    }
    free(tmp);
    free(acc);
    filter_free(&fh);
    filter_free(&fv);
    return st;
}
