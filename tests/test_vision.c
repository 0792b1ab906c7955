/*
 * test_vision.c - the vision towers (src/vision): mmproj loading and the
 * Qwen-VL encoders against llama.cpp's image embeddings.
 *
 *  - goldens (shared/golden/arch, "Third batch" of its README): for the
 *    qwen3vl_merger and qwen2.5vl_merger test projectors, F32 and F16
 *    files, three images (tiny, photo, screenshot), the embeddings of the
 *    preprocessed canvas (read here with libpng, since kettle's own image
 *    decoder is written separately) must be within the README's tolerance,
 *    max |d| <= 1.5e-3 * max |golden|; the errors are printed. Under ASan
 *    (~7x slower) the screenshot (3680 / 4784 patches) is left out, saying
 *    so; the tiny and photo images run there.
 *  - a float64 reference written here from llama.cpp's graphs, checked
 *    against the goldens of both projectors (F32 and F16 files, tiny
 *    image), then used where there is no golden: DeepStack (the qwen3vl
 *    file with random DeepStack mergers added after blocks 0 and 2: its
 *    main embedding must still match llama.cpp's) and qwen2vl_merger (a
 *    file made from the qwen2.5vl one: LayerNorm with biases, a plain MLP,
 *    quick GELU, no windows; the photo image, the tiny one under ASan).
 *  - one thread and two give the same numbers; encode refuses an image
 *    whose size or grid is wrong.
 *  - `kettle info` on an mmproj file prints the tower.
 *  - refusals: another projector type (KT_ERR_UNSUPPORTED naming it), a
 *    missing tensor, a tensor of the wrong shape and a missing key
 *    (KT_ERR_FORMAT naming them), each in a file written here.
 */
#include <math.h>
#include <png.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "testutil.h"

#include "base/fp16.h"
#include "gguf/gguf.h"
#include "ops/cpu.h"
#include "ops/pool.h"
#include "vision/embd_disk.h"
#include "vision/vision.h"

/* ---- inputs --------------------------------------------------------------- */

/* An 8-bit RGB PNG (the preprocessed canvas) read with libpng; NULL if it
 * cannot be read. Caller frees. */
static uint8_t *read_png_rgb(const char *path, int *w, int *h) {
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_file(&img, path)) return NULL;
    img.format = PNG_FORMAT_RGB;
    uint8_t *rgb = malloc(PNG_IMAGE_SIZE(img));
    if (!rgb || !png_image_finish_read(&img, NULL, rgb, 0, NULL)) {
        png_image_free(&img);
        free(rgb);
        return NULL;
    }
    *w = (int)img.width;
    *h = (int)img.height;
    return rgb;
}

/* The encoder's input from the uint8 canvas: planar (u8 / 255 - mean) / std
 * in float32, as llama.cpp's normalize_image_u8_to_f32. */
static void make_prep(const kt_image_prep_params *pp, const uint8_t *rgb, int w, int h, kt_image_prep *prep) {
    memset(prep, 0, sizeof *prep);
    prep->width = prep->content_w = w;
    prep->height = prep->content_h = h;
    prep->grid_x = w / (pp->patch_size * pp->merge_size);
    prep->grid_y = h / (pp->patch_size * pp->merge_size);
    prep->pixels = tu_xmalloc((size_t)3 * w * h * sizeof(float));
    for (int c = 0; c < 3; c++)
        for (long i = 0; i < (long)w * h; i++)
            prep->pixels[(long)c * w * h + i] = ((float)rgb[i * 3 + c] / 255.0f - pp->mean[c]) / pp->std[c];
}

static const char *golden(const char *fmt, const char *a, const char *b, const char *c) {
    static char rel[256];
    snprintf(rel, sizeof rel, fmt, a, b, c);
    return tu_shared(rel);
}

/* ---- float64 reference of llama.cpp's Qwen-VL graphs ---------------------- */

/* Written straight from tools/mtmd/models/qwen2vl.cpp / qwen3vl.cpp, with
 * none of the encoder's code: patches in raster order (mapped to merge
 * groups only at the merger), weights read from the file to double, exact
 * GELU tanh form (no F16 table, no F16 im2col), attention by the mask of
 * clip.cpp's windows. Slow, so run on the tiny image only. */
typedef struct ref_model {
    gguf_file *f;
    char proj[32];
    int w, heads, d, layers, patch, proj_dim, n_wa;
    bool rms, gelu_quick, silu, gelu;
    double eps;
} ref_model;

/* tensor `name` as doubles (caller frees); NULL when absent */
static double *ref_tensor(const ref_model *m, const char *fmt, int il, int64_t *n_out) {
    char name[96];
    snprintf(name, sizeof name, fmt, il);
    const gguf_tensor *t = gguf_tensor_find(m->f, name);
    if (!t) return NULL;
    int64_t n = 1;
    for (uint32_t i = 0; i < t->n_dims; i++) n *= t->dims[i];
    double *x = tu_xmalloc((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; i++)
        x[i] = t->type == KT_F16 ? kt_fp16_to_fp32(((const uint16_t *)t->data)[i]) : ((const float *)t->data)[i];
    if (n_out) *n_out = t->n_dims > 1 ? t->dims[1] : 1;
    return x;
}

/* y[t][o] = sum_i W[o][i] x[t][i] + b[o] */
static void ref_linear(double *y, const double *W, const double *b, const double *x, int n_in, int n_out, int n) {
    for (int t = 0; t < n; t++)
        for (int o = 0; o < n_out; o++) {
            double s = b ? b[o] : 0;
            for (int i = 0; i < n_in; i++) s += W[(size_t)o * n_in + i] * x[(size_t)t * n_in + i];
            y[(size_t)t * n_out + o] = s;
        }
}

static void ref_norm(const ref_model *m, double *y, const double *x, const double *g, const double *b, int n,
                     int width) {
    for (int t = 0; t < n; t++) {
        const double *r = x + (size_t)t * width;
        double mean = 0, var = 0;
        if (!m->rms)
            for (int i = 0; i < width; i++) mean += r[i] / width;
        for (int i = 0; i < width; i++) var += (r[i] - mean) * (r[i] - mean) / width;
        for (int i = 0; i < width; i++)
            y[(size_t)t * width + i] = (r[i] - mean) / sqrt(var + m->eps) * (g ? g[i] : 1) + (b ? b[i] : 0);
    }
}

static double ref_gelu(double x) { return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * x * (1 + 0.044715 * x * x))); }
static double ref_act(const ref_model *m, double x) {
    if (m->silu) return x / (1 + exp(-x));
    if (m->gelu) return ref_gelu(x);
    return x / (1 + exp(-1.702 * x));
}

static bool ref_same_window(const ref_model *m, int yi, int xi, int yj, int xj) {
    int gw = 112 / m->patch / 2; /* merged tokens a side */
    return (yi / 2) / gw == (yj / 2) / gw && (xi / 2) / gw == (xj / 2) / gw;
}

/* merge groups: token (gy, gx) concatenates patches (2gy+dy, 2gx+dx), the
 * patches in raster order [py][px][w] */
static double *ref_merge_groups(const double *x, int px, int py, int w) {
    int T = px * py / 4, gx = px / 2;
    double *cat = tu_xmalloc((size_t)T * 4 * w * sizeof *cat);
    for (int t = 0; t < T; t++)
        for (int u = 0; u < 4; u++) {
            int y = (t / gx) * 2 + u / 2, xx = (t % gx) * 2 + u % 2;
            memcpy(cat + ((size_t)t * 4 + u) * w, x + ((size_t)y * px + xx) * w, (size_t)w * sizeof *cat);
        }
    return cat;
}

/* [T][4w] -> (norm) -> fc1 -> GELU -> fc2 into out[t * stride + col] */
static void ref_project(const ref_model *m, const double *cat, int T, int w, const char *norm_w, const char *norm_b,
                        const char *fc1_w, const char *fc1_b, const char *fc2_w, const char *fc2_b, int il, double *out,
                        int stride, int col) {
    double *in = tu_xmalloc((size_t)T * 4 * w * sizeof *in);
    memcpy(in, cat, (size_t)T * 4 * w * sizeof *in);
    if (norm_w) { /* DeepStack's LayerNorm (qwen3vl's norm type) over the group */
        double *g = ref_tensor(m, norm_w, il, NULL), *b = ref_tensor(m, norm_b, il, NULL);
        ref_norm(m, in, cat, g, b, T, 4 * w);
        free(g), free(b);
    }
    int64_t hid = 0;
    double *W0 = ref_tensor(m, fc1_w, il, &hid), *b0 = ref_tensor(m, fc1_b, il, NULL);
    double *W2 = ref_tensor(m, fc2_w, il, NULL), *b2 = ref_tensor(m, fc2_b, il, NULL);
    double *h1 = tu_xmalloc((size_t)T * hid * sizeof *h1), *o = tu_xmalloc((size_t)T * m->proj_dim * sizeof *o);
    ref_linear(h1, W0, b0, in, 4 * w, (int)hid, T);
    for (size_t i = 0; i < (size_t)T * hid; i++) h1[i] = ref_gelu(h1[i]);
    ref_linear(o, W2, b2, h1, (int)hid, m->proj_dim, T);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < m->proj_dim; i++) out[(size_t)t * stride + col + i] = o[(size_t)t * m->proj_dim + i];
    free(W0), free(b0), free(W2), free(b2), free(h1), free(o), free(in);
}

/* the whole tower on `img`; returns [n_tokens][proj_dim * (1 + n_ds)] in
 * merged-grid row-major order: the main embedding, then each DeepStack
 * output (n_ds: blocks with v.deepstack.N.fc1.weight) */
static double *ref_encode(const ref_model *m, const kt_image_prep *img, int *n_ds_out) {
    int p = m->patch, px = img->width / p, py = img->height / p, P = px * py, w = m->w, d = m->d;
    int n_in = 3 * p * p;
    double *x = calloc((size_t)P * w, sizeof *x), *xn = calloc((size_t)P * w, sizeof *x);
    double *q = calloc((size_t)P * w, sizeof *x), *k = calloc((size_t)P * w, sizeof *x);
    double *v = calloc((size_t)P * w, sizeof *x), *o = calloc((size_t)P * w, sizeof *x);
    double *col = calloc((size_t)P * n_in, sizeof *x), *s = calloc((size_t)P, sizeof *x);
    assert_non_null(x && xn && q && k && v && o && col && s);
    int n_ds = 0, T = P / 4;
    for (int il = 0; il < m->layers; il++) {
        char name[64];
        snprintf(name, sizeof name, "v.deepstack.%d.fc1.weight", il);
        n_ds += gguf_tensor_find(m->f, name) != NULL;
    }
    int stride = m->proj_dim * (1 + n_ds), ds = 0;
    double *out = tu_xmalloc((size_t)T * stride * sizeof *out);
    /* patches in raster order: conv of both temporal slices */
    for (int t = 0; t < P; t++)
        for (int c = 0; c < 3; c++)
            for (int ky = 0; ky < p; ky++)
                for (int kx = 0; kx < p; kx++)
                    col[(size_t)t * n_in + (c * p + ky) * p + kx] =
                        img->pixels[((size_t)c * img->height + (t / px) * p + ky) * img->width + (t % px) * p + kx];
    double *w0 = ref_tensor(m, "v.patch_embd.weight", 0, NULL), *w1 = ref_tensor(m, "v.patch_embd.weight.1", 0, NULL);
    double *pb = ref_tensor(m, "v.patch_embd.bias", 0, NULL);
    for (int i = 0; i < n_in * w; i++) w0[i] += w1[i];
    ref_linear(x, w0, pb, col, n_in, w, P);
    free(w0), free(w1), free(pb);
    int64_t n_pos = 0;
    double *pe = ref_tensor(m, "v.position_embd.weight", 0, &n_pos);
    if (pe) { /* bilinear, align_corners */
        int n = (int)lround(sqrt((double)n_pos));
        for (int t = 0; t < P; t++) {
            double fy = (double)(t / px) * (n - 1) / (py - 1), fx = (double)(t % px) * (n - 1) / (px - 1);
            int y0 = (int)floor(fy), x0 = (int)floor(fx), y1 = y0 + 1 < n ? y0 + 1 : n - 1,
                x1 = x0 + 1 < n ? x0 + 1 : n - 1;
            double dy = fy - y0, dx = fx - x0;
            for (int i = 0; i < w; i++)
                x[(size_t)t * w + i] += pe[((size_t)y0 * n + x0) * w + i] * (1 - dx) * (1 - dy) +
                                        pe[((size_t)y0 * n + x1) * w + i] * dx * (1 - dy) +
                                        pe[((size_t)y1 * n + x0) * w + i] * (1 - dx) * dy +
                                        pe[((size_t)y1 * n + x1) * w + i] * dx * dy;
        }
        free(pe);
    }
    for (int il = 0; il < m->layers; il++) {
        bool full = m->n_wa > 0 ? (il + 1) % m->n_wa == 0 : true;
        double *g1 = ref_tensor(m, "v.blk.%d.ln1.weight", il, NULL), *b1 = ref_tensor(m, "v.blk.%d.ln1.bias", il, NULL);
        ref_norm(m, xn, x, g1, b1, P, w);
        free(g1), free(b1);
        double *qkv = ref_tensor(m, "v.blk.%d.attn_qkv.weight", il, NULL);
        if (qkv) {
            double *bq = ref_tensor(m, "v.blk.%d.attn_qkv.bias", il, NULL);
            ref_linear(q, qkv, bq, xn, w, w, P);
            ref_linear(k, qkv + (size_t)w * w, bq + w, xn, w, w, P);
            ref_linear(v, qkv + (size_t)2 * w * w, bq + 2 * w, xn, w, w, P);
            free(qkv), free(bq);
        } else {
            const char *names[3][2] = {{"v.blk.%d.attn_q.weight", "v.blk.%d.attn_q.bias"},
                                       {"v.blk.%d.attn_k.weight", "v.blk.%d.attn_k.bias"},
                                       {"v.blk.%d.attn_v.weight", "v.blk.%d.attn_v.bias"}};
            double *outs[3] = {q, k, v};
            for (int j = 0; j < 3; j++) {
                double *W = ref_tensor(m, names[j][0], il, NULL), *b = ref_tensor(m, names[j][1], il, NULL);
                ref_linear(outs[j], W, b, xn, w, w, P);
                free(W), free(b);
            }
        }
        /* 2-D rotary on pairs (j, j + d/2): row for j < d/4, column after */
        for (int t = 0; t < P; t++)
            for (int h = 0; h < m->heads; h++)
                for (int j = 0; j < d / 2; j++) {
                    double pos = j < d / 4 ? t / px : t % px, jj = j < d / 4 ? j : j - d / 4;
                    double th = pos * pow(10000.0, -4.0 * jj / d), cs = cos(th), sn = sin(th);
                    double *vs[2] = {q, k};
                    for (int u = 0; u < 2; u++) {
                        double *r = vs[u] + (size_t)t * w + h * d, a = r[j], b = r[j + d / 2];
                        r[j] = a * cs - b * sn;
                        r[j + d / 2] = a * sn + b * cs;
                    }
                }
        for (int h = 0; h < m->heads; h++)
            for (int i = 0; i < P; i++) {
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j < P; j++) {
                    s[j] = -INFINITY;
                    if (!full && !ref_same_window(m, i / px, i % px, j / px, j % px)) continue;
                    double dot = 0;
                    for (int c = 0; c < d; c++) dot += q[(size_t)i * w + h * d + c] * k[(size_t)j * w + h * d + c];
                    s[j] = dot / sqrt((double)d);
                    if (s[j] > mx) mx = s[j];
                }
                for (int j = 0; j < P; j++) sum += s[j] = exp(s[j] - mx);
                for (int c = 0; c < d; c++) {
                    double acc = 0;
                    for (int j = 0; j < P; j++) acc += s[j] / sum * v[(size_t)j * w + h * d + c];
                    o[(size_t)i * w + h * d + c] = acc;
                }
            }
        double *Wo = ref_tensor(m, "v.blk.%d.attn_out.weight", il, NULL),
               *bo = ref_tensor(m, "v.blk.%d.attn_out.bias", il, NULL);
        ref_linear(q, Wo, bo, o, w, w, P);
        free(Wo), free(bo);
        for (size_t i = 0; i < (size_t)P * w; i++) x[i] += q[i];
        double *g2 = ref_tensor(m, "v.blk.%d.ln2.weight", il, NULL), *b2 = ref_tensor(m, "v.blk.%d.ln2.bias", il, NULL);
        ref_norm(m, xn, x, g2, b2, P, w);
        free(g2), free(b2);
        int64_t n_ff = 0;
        double *Wu = ref_tensor(m, "v.blk.%d.ffn_up.weight", il, &n_ff),
               *bu = ref_tensor(m, "v.blk.%d.ffn_up.bias", il, NULL);
        double *Wg = ref_tensor(m, "v.blk.%d.ffn_gate.weight", il, NULL),
               *bg = ref_tensor(m, "v.blk.%d.ffn_gate.bias", il, NULL);
        double *Wd = ref_tensor(m, "v.blk.%d.ffn_down.weight", il, NULL),
               *bd = ref_tensor(m, "v.blk.%d.ffn_down.bias", il, NULL);
        double *up = tu_xmalloc((size_t)P * n_ff * sizeof *up), *gt = tu_xmalloc((size_t)P * n_ff * sizeof *gt);
        ref_linear(up, Wu, bu, xn, w, (int)n_ff, P);
        if (Wg) {
            ref_linear(gt, Wg, bg, xn, w, (int)n_ff, P);
            for (size_t i = 0; i < (size_t)P * n_ff; i++) up[i] *= ref_act(m, gt[i]);
        } else {
            for (size_t i = 0; i < (size_t)P * n_ff; i++) up[i] = ref_act(m, up[i]);
        }
        ref_linear(q, Wd, bd, up, (int)n_ff, w, P);
        for (size_t i = 0; i < (size_t)P * w; i++) x[i] += q[i];
        free(Wu), free(bu), free(Wg), free(bg), free(Wd), free(bd), free(up), free(gt);
        char fc1[64];
        snprintf(fc1, sizeof fc1, "v.deepstack.%d.fc1.weight", il);
        if (gguf_tensor_find(m->f, fc1)) {
            double *cat = ref_merge_groups(x, px, py, w);
            ref_project(m, cat, T, w, "v.deepstack.%d.norm.weight", "v.deepstack.%d.norm.bias",
                        "v.deepstack.%d.fc1.weight", "v.deepstack.%d.fc1.bias", "v.deepstack.%d.fc2.weight",
                        "v.deepstack.%d.fc2.bias", il, out, stride, m->proj_dim * (1 + ds++));
            free(cat);
        }
    }
    double *gp = ref_tensor(m, "v.post_ln.weight", 0, NULL), *bp = ref_tensor(m, "v.post_ln.bias", 0, NULL);
    ref_norm(m, xn, x, gp, bp, P, w);
    free(gp), free(bp);
    double *cat = ref_merge_groups(xn, px, py, w);
    ref_project(m, cat, T, w, NULL, NULL, "mm.0.weight", "mm.0.bias", "mm.2.weight", "mm.2.bias", 0, out, stride, 0);
    free(cat);
    free(x), free(xn), free(q), free(k), free(v), free(o), free(col), free(s);
    *n_ds_out = n_ds;
    return out;
}

static void ref_open(ref_model *m, const char *path) {
    kt_error err = {0};
    memset(m, 0, sizeof *m);
    m->f = gguf_open(path, &err);
    assert_non_null(m->f);
    int64_t i;
    assert_true(gguf_get_str(m->f, "clip.projector_type", m->proj, sizeof m->proj));
    int64_t vals[7];
    const char *keys[7] = {"clip.vision.embedding_length",  "clip.vision.attention.head_count",
                           "clip.vision.block_count",       "clip.vision.patch_size",
                           "clip.vision.projection_dim",    "clip.vision.n_wa_pattern",
                           "clip.vision.spatial_merge_size"};
    for (int j = 0; j < 7; j++) gguf_get_i64(m->f, keys[j], 0, &vals[j]);
    m->w = (int)vals[0], m->heads = (int)vals[1], m->layers = (int)vals[2], m->patch = (int)vals[3];
    m->proj_dim = (int)vals[4], m->d = m->w / m->heads;
    m->n_wa = strcmp(m->proj, "qwen2.5vl_merger") == 0 ? (int)vals[5] : 0;
    m->rms = strcmp(m->proj, "qwen2.5vl_merger") == 0;
    gguf_get_bool(m->f, "clip.use_gelu", false, &m->gelu);
    gguf_get_bool(m->f, "clip.use_silu", false, &m->silu);
    gguf_get_f64(m->f, "clip.vision.attention.layer_norm_epsilon", 0, &m->eps);
    (void)i;
}

/* ---- comparisons ---------------------------------------------------------- */

typedef struct diff {
    double max_abs, max_ref, rms;
} diff;

static diff compare(const float *got, const float *want, size_t n) {
    diff d = {0, 0, 0};
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]);
        if (!(e <= d.max_abs)) d.max_abs = e; /* NaN sticks */
        if (fabs(want[i]) > d.max_ref) d.max_ref = fabs(want[i]);
        d.rms += e * e;
    }
    d.rms = sqrt(d.rms / (double)n);
    return d;
}

/* ---- goldens ---------------------------------------------------------------- */

static int n_json_int(json_t *j, const char *key) { return (int)json_integer_value(json_object_get(j, key)); }

/* tower T (qwen3vl / qwen25vl), file P (F32 / F16), image IMG */
static void check_golden(kt_pool *pool, const char *tower, const char *prec, const char *image, const char *want_proj) {
    kt_error err = {0};
    char path[512];
    snprintf(path, sizeof path, "%s", golden("golden/arch/mmproj-%s-%s.gguf%s", tower, prec, ""));
    kt_vision *v = kt_vision_load(path, &err);
    if (!v) fail_msg("%s: %s", path, err.msg);
    const kt_vision_info *info = kt_vision_get_info(v);
    assert_string_equal(info->projector, want_proj);
    assert_int_equal(info->n_deepstack, 0);
    kt_image_prep_params pp;
    kt_vision_prep_params(v, &pp);

    json_error_t jerr;
    json_t *pj = json_load_file(golden("golden/arch/vision-%s-%s.preproc.json", tower, image, ""), 0, &jerr);
    json_t *ej = json_load_file(golden("golden/arch/vision-%s-%s-%s.embd.json", tower, prec, image), 0, &jerr);
    assert_non_null(pj);
    assert_non_null(ej);
    /* the limits llama.cpp used for this image */
    json_t *resize = json_object_get(pj, "resize");
    assert_int_equal(pp.min_pixels, json_integer_value(json_object_get(resize, "min_pixels")));
    assert_int_equal(pp.max_pixels, json_integer_value(json_object_get(resize, "max_pixels")));
    for (int c = 0; c < 3; c++) {
        assert_float_equal(pp.mean[c], json_real_value(json_array_get(json_object_get(pj, "mean"), c)), 1e-7);
        assert_float_equal(pp.std[c], json_real_value(json_array_get(json_object_get(pj, "std"), c)), 1e-7);
    }

    int w = 0, h = 0;
    uint8_t *rgb = read_png_rgb(golden("golden/arch/vision-%s-%s.preproc.png", tower, image, ""), &w, &h);
    assert_non_null(rgb);
    kt_image_prep prep;
    make_prep(&pp, rgb, w, h, &prep);
    free(rgb);
    if (strcmp(image, "tiny") == 0) { /* the float tensor itself: ours must be bit for bit */
        size_t n = 0;
        char *f32 = tu_read_file(golden("golden/arch/vision-%s-%s.preproc.f32", tower, image, ""), &n);
        assert_non_null(f32);
        assert_int_equal(n, (size_t)3 * w * h * sizeof(float));
        assert_memory_equal(f32, prep.pixels, n);
        free(f32);
    }
    json_t *grid = json_object_get(ej, "grid");
    assert_int_equal(prep.grid_x, json_integer_value(json_array_get(grid, 0)));
    assert_int_equal(prep.grid_y, json_integer_value(json_array_get(grid, 1)));
    int n_tokens = n_json_int(ej, "n_tokens"), n_embd = n_json_int(ej, "n_embd");
    assert_int_equal(n_tokens, prep.grid_x * prep.grid_y);
    assert_int_equal(n_embd, info->n_embd);

    size_t n_bytes = 0;
    float *want = (float *)tu_read_file(golden("golden/arch/vision-%s-%s-%s.embd.f32", tower, prec, image), &n_bytes);
    assert_non_null(want);
    assert_int_equal(n_bytes, (size_t)n_tokens * n_embd * sizeof(float));
    float *got = tu_xmalloc(n_bytes);
    for (size_t i = 0; i < n_bytes / sizeof(float); i++) got[i] = NAN;
    if (kt_vision_encode(v, pool, &prep, got, &err)) fail_msg("encode: %s", err.msg);
    diff d = compare(got, want, n_bytes / sizeof(float));
    printf("  %-8s %-3s %-10s %4d tokens: max|d| %.3g, max|golden| %.3g, max|d|/max|golden| %.3g, rms %.3g\n", tower,
           prec, image, n_tokens, d.max_abs, d.max_ref, d.max_abs / d.max_ref, d.rms);
    assert_true(d.max_ref > 0.1); /* a real golden, not zeros */
    if (!(d.max_abs <= 1.5e-3 * d.max_ref))
        fail_msg("%s %s %s: max |d| %g over the tolerance %g", tower, prec, image, d.max_abs, 1.5e-3 * d.max_ref);
    free(got);
    free(want);
    free(prep.pixels);
    json_decref(pj);
    json_decref(ej);
    kt_vision_free(v);
}

static void test_goldens(void **state) {
    (void)state;
    kt_error err = {0};
    kt_pool *pool = kt_pool_new(2, &err);
    assert_non_null(pool);
    const char *towers[2][2] = {{"qwen3vl", "qwen3vl_merger"}, {"qwen25vl", "qwen2.5vl_merger"}};
    const char *precs[2] = {"F32", "F16"};
    const char *images[3] = {"tiny", "photo", "screenshot"};
    int n_images = TU_SANITIZED ? 2 : 3;
    if (TU_SANITIZED) printf("  (ASan build: the screenshot images are left out, tiny and photo run)\n");
    for (int t = 0; t < 2; t++)
        for (int p = 0; p < 2; p++)
            for (int i = 0; i < n_images; i++) check_golden(pool, towers[t][0], precs[p], images[i], towers[t][1]);
    if (kt_cpu_has_amx_bf16()) {
        /* the towers above ran on the AMX tiles: the FMA kernels, as on a
         * CPU without them, against the same goldens; the two are other
         * towers to the caches (their fingerprints differ) */
        char path[512];
        snprintf(path, sizeof path, "%s", golden("golden/arch/mmproj-%s-%s.gguf%s", "qwen3vl", "F16", ""));
        kt_vision *amx = kt_vision_load(path, &err);
        kt_cpu_force_no_amx(true);
        kt_vision *fma = kt_vision_load(path, &err);
        assert_non_null(amx), assert_non_null(fma);
        assert_true(kt_vision_uses_amx(amx) && !kt_vision_uses_amx(fma));
        assert_true(kt_vision_fingerprint(amx) != kt_vision_fingerprint(fma));
        kt_vision_free(amx), kt_vision_free(fma);
        printf("  again with AMX off (the FMA kernels):\n");
        for (int t = 0; t < 2; t++)
            for (int p = 0; p < 2; p++)
                for (int i = 0; i < n_images; i++) check_golden(pool, towers[t][0], precs[p], images[i], towers[t][1]);
        kt_cpu_force_no_amx(false);
    } else {
        printf("  (no AMX-BF16 here, %s: the FMA kernels only)\n", kt_cpu_features());
    }
    kt_pool_free(pool);
}

/* ---- files written here --------------------------------------------------- */

/* A copy of mmproj `src` with changes: the projector type replaced, keys
 * left out, tensors left out (exact name, or every name containing a
 * substring), one tensor written with half its first dim, and LayerNorm
 * biases (std 0.1, seeded) added for each ln1 / ln2 / post_ln weight that
 * has none. */
typedef struct variant {
    const char *projector;
    const char *drop_keys[4];
    const char *drop_tensor, *drop_containing, *halve_tensor;
    bool add_ln_biases;
    int deepstack_mask; /* bit il: add random DeepStack tensors after block il (qwen3vl) */
} variant;

static bool dropped(const variant *x, const char *name) {
    return (x->drop_tensor && strcmp(name, x->drop_tensor) == 0) ||
           (x->drop_containing && strstr(name, x->drop_containing));
}

static void write_variant(const char *src, const char *dst, const variant *x) {
    kt_error err = {0};
    gguf_file *f = gguf_open(src, &err);
    if (!f) fail_msg("%s", err.msg);
    gguf_writer *w = gguf_writer_new(&err);
    assert_non_null(w);
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        gguf_str k = gguf_kv_key(f, i);
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)k.len, k.ptr);
        bool drop = false;
        for (int j = 0; j < 4 && x->drop_keys[j]; j++) drop |= strcmp(key, x->drop_keys[j]) == 0;
        if (drop) continue;
        if (x->projector && strcmp(key, "clip.projector_type") == 0)
            assert_int_equal(gguf_writer_set_str(w, key, x->projector, &err), KT_OK);
        else
            assert_int_equal(gguf_writer_copy_kv(w, f, i, &err), KT_OK);
    }
    /* the tensors' bytes, in the order they are declared */
    const void *data[512];
    size_t sizes[512];
    float *owned[512];
    int n = 0;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        if (dropped(x, name)) continue;
        int64_t dims[4];
        memcpy(dims, t->dims, sizeof dims);
        size_t bytes = t->n_bytes;
        if (x->halve_tensor && strcmp(name, x->halve_tensor) == 0) {
            dims[0] /= 2;
            bytes /= 2;
        }
        assert_int_equal(gguf_writer_add_tensor(w, name, t->type, t->n_dims, dims, &err), KT_OK);
        owned[n] = NULL, data[n] = t->data, sizes[n++] = bytes;
        size_t len = strlen(name);
        bool ln = len > 7 && strcmp(name + len - 7, ".weight") == 0 &&
                  (strstr(name, ".ln1.") || strstr(name, ".ln2.") || strstr(name, "post_ln."));
        if (x->add_ln_biases && ln) {
            char bias[128];
            snprintf(bias, sizeof bias, "%.*s.bias", (int)(len - 7), name);
            if (gguf_tensor_find(f, bias)) continue;
            assert_int_equal(gguf_writer_add_tensor(w, bias, KT_F32, 1, dims, &err), KT_OK);
            owned[n] = tu_xmalloc((size_t)dims[0] * sizeof(float));
            tu_fill_normal(owned[n], (size_t)dims[0], 0.1f, 7000 + (uint64_t)n);
            data[n] = owned[n], sizes[n++] = (size_t)dims[0] * sizeof(float);
        }
        assert_true(n < 510);
    }
    int64_t width = 0, proj = 0;
    gguf_get_i64(f, "clip.vision.embedding_length", 0, &width);
    gguf_get_i64(f, "clip.vision.projection_dim", 0, &proj);
    for (int il = 0; il < 16; il++) {
        if (!(x->deepstack_mask >> il & 1)) continue;
        const struct {
            const char *suffix;
            int64_t d0, d1;
            float std, mean;
        } ds[] = {{"norm.weight", 4 * width, 1, 0.1f, 1.0f},      {"norm.bias", 4 * width, 1, 0.1f, 0},
                  {"fc1.weight", 4 * width, 4 * width, 0.06f, 0}, {"fc1.bias", 4 * width, 1, 0.1f, 0},
                  {"fc2.weight", 4 * width, proj, 0.06f, 0},      {"fc2.bias", proj, 1, 0.1f, 0}};
        for (int j = 0; j < 6; j++) {
            char name[96];
            snprintf(name, sizeof name, "v.deepstack.%d.%s", il, ds[j].suffix);
            if (dropped(x, name)) continue;
            int64_t dims[4] = {ds[j].d0, ds[j].d1, 1, 1};
            assert_int_equal(gguf_writer_add_tensor(w, name, KT_F32, ds[j].d1 > 1 ? 2 : 1, dims, &err), KT_OK);
            size_t ne = (size_t)(ds[j].d0 * ds[j].d1);
            owned[n] = tu_xmalloc(ne * sizeof(float));
            tu_fill_normal(owned[n], ne, ds[j].std, 8000 + (uint64_t)n);
            for (size_t e = 0; e < ne; e++) owned[n][e] += ds[j].mean;
            data[n] = owned[n], sizes[n++] = ne * sizeof(float);
        }
    }
    if (gguf_writer_begin(w, dst, &err)) fail_msg("%s", err.msg);
    for (int i = 0; i < n; i++) assert_int_equal(gguf_writer_write_tensor(w, data[i], sizes[i], &err), KT_OK);
    assert_int_equal(gguf_writer_finish(w, &err), KT_OK);
    gguf_writer_free(w);
    for (int i = 0; i < n; i++) free(owned[i]);
    gguf_close(f);
}

/* loading dst must fail with `status` and a message containing `what` */
static void expect_refused(const char *path, kt_status status, const char *what) {
    kt_error err = {0};
    kt_vision *v = kt_vision_load(path, &err);
    if (v) fail_msg("%s loaded; expected a refusal naming '%s'", path, what);
    printf("  refused: %s\n", err.msg);
    assert_int_equal(err.status, status);
    if (!strstr(err.msg, what)) fail_msg("message '%s' does not name '%s'", err.msg, what);
}

static void test_refusals(void **state) {
    (void)state;
    char src[512];
    snprintf(src, sizeof src, "%s", tu_shared("golden/arch/mmproj-qwen3vl-F16.gguf"));
    const char *dst = tu_tmp("vision-variant.gguf");
    /* the unchanged copy loads: the refusals below are the changes' doing */
    write_variant(src, dst, &(variant){0});
    kt_error err = {0};
    kt_vision *v = kt_vision_load(dst, &err);
    if (!v) fail_msg("%s", err.msg);
    kt_vision_free(v);

    write_variant(src, dst, &(variant){.projector = "gemma3"});
    expect_refused(dst, KT_ERR_UNSUPPORTED, "'gemma3'");
    write_variant(src, dst, &(variant){.drop_tensor = "v.blk.1.attn_out.weight"});
    expect_refused(dst, KT_ERR_FORMAT, "'v.blk.1.attn_out.weight'");
    write_variant(src, dst, &(variant){.drop_tensor = "v.position_embd.weight"});
    expect_refused(dst, KT_ERR_FORMAT, "'v.position_embd.weight'");
    write_variant(src, dst, &(variant){.halve_tensor = "v.blk.2.ln2.bias"});
    expect_refused(dst, KT_ERR_FORMAT, "'v.blk.2.ln2.bias'");
    write_variant(src, dst, &(variant){.halve_tensor = "mm.2.weight"});
    expect_refused(dst, KT_ERR_FORMAT, "'mm.2.weight'");
    write_variant(src, dst, &(variant){.drop_keys = {"clip.vision.patch_size"}});
    expect_refused(dst, KT_ERR_FORMAT, "'clip.vision.patch_size'");
    write_variant(src, dst, &(variant){.drop_keys = {"clip.projector_type"}});
    expect_refused(dst, KT_ERR_FORMAT, "'clip.projector_type'");
    /* qwen2.5vl: its required window pattern, and a separate q */
    snprintf(src, sizeof src, "%s", tu_shared("golden/arch/mmproj-qwen25vl-F16.gguf"));
    write_variant(src, dst, &(variant){.drop_keys = {"clip.vision.n_wa_pattern"}});
    expect_refused(dst, KT_ERR_FORMAT, "'clip.vision.n_wa_pattern'");
    write_variant(src, dst, &(variant){.drop_tensor = "v.blk.3.attn_q.bias"});
    expect_refused(dst, KT_ERR_FORMAT, "'v.blk.3.attn_q.bias'");
    /* a text model is no mmproj */
    expect_refused(tu_shared("golden/arch/qwen2vl-F16.gguf"), KT_ERR_FORMAT, "general.architecture");
}

/* the encoder against the float64 reference on one canvas (all of each
 * token's outputs, DeepStack included); with golden_embd, also the
 * reference's and kettle's main embedding (the first n_embd of each
 * token) against llama.cpp's */
static void check_reference(kt_pool *pool, const char *mmproj, const char *canvas_png, const float *golden_embd,
                            const char *label) {
    kt_error err = {0};
    kt_vision *v = kt_vision_load(mmproj, &err);
    if (!v) fail_msg("%s: %s", mmproj, err.msg);
    kt_image_prep_params pp;
    kt_vision_prep_params(v, &pp);
    int w = 0, h = 0;
    uint8_t *rgb = read_png_rgb(canvas_png, &w, &h);
    assert_non_null(rgb);
    kt_image_prep prep;
    make_prep(&pp, rgb, w, h, &prep);
    free(rgb);
    const kt_vision_info *info = kt_vision_get_info(v);
    int n_embd = info->n_embd, stride = n_embd * (1 + info->n_deepstack), T = prep.grid_x * prep.grid_y;
    size_t n = (size_t)T * stride;
    float *got = tu_xmalloc(n * sizeof *got), *ref = tu_xmalloc(n * sizeof *ref);
    for (size_t i = 0; i < n; i++) got[i] = NAN;
    if (kt_vision_encode(v, pool, &prep, got, &err)) fail_msg("encode: %s", err.msg);
    ref_model m;
    ref_open(&m, mmproj);
    int n_ds = -1;
    double *r64 = ref_encode(&m, &prep, &n_ds);
    assert_int_equal(n_ds, info->n_deepstack);
    for (size_t i = 0; i < n; i++) ref[i] = (float)r64[i];
    /* each output (main, DeepStack 1, ...) on its own scale */
    for (int part = 0; part <= n_ds; part++) {
        float *g1 = tu_xmalloc((size_t)T * n_embd * sizeof *g1), *r1 = tu_xmalloc((size_t)T * n_embd * sizeof *r1);
        for (int t = 0; t < T; t++) {
            memcpy(g1 + (size_t)t * n_embd, got + (size_t)t * stride + part * n_embd, (size_t)n_embd * sizeof *g1);
            memcpy(r1 + (size_t)t * n_embd, ref + (size_t)t * stride + part * n_embd, (size_t)n_embd * sizeof *r1);
        }
        diff d = compare(g1, r1, (size_t)T * n_embd);
        printf("  %-26s %s %d: kettle vs float64 reference: max|d| %.3g, max|ref| %.3g, ratio %.3g, rms %.3g\n", label,
               part ? "deepstack" : "main", part, d.max_abs, d.max_ref, d.max_abs / d.max_ref, d.rms);
        assert_true(d.max_ref > 0.1);
        if (!(d.max_abs <= 1.5e-3 * d.max_ref))
            fail_msg("%s output %d: max |d| %g over %g", label, part, d.max_abs, 1.5e-3 * d.max_ref);
        if (part == 0 && golden_embd) { /* the reference itself, and kettle, against llama.cpp */
            diff g = compare(r1, golden_embd, (size_t)T * n_embd), k = compare(g1, golden_embd, (size_t)T * n_embd);
            printf("  %-26s reference vs llama.cpp golden: ratio %.3g (README: 4e-4 - 7e-4); kettle %.3g\n", label,
                   g.max_abs / g.max_ref, k.max_abs / k.max_ref);
            if (!(g.max_abs <= 1.5e-3 * g.max_ref))
                fail_msg("%s: the reference is off the golden: %g", label, g.max_abs);
            if (!(k.max_abs <= 1.5e-3 * k.max_ref)) fail_msg("%s: kettle is off the golden: %g", label, k.max_abs);
        }
        free(g1);
        free(r1);
    }
    free(r64);
    free(got);
    free(ref);
    free(prep.pixels);
    gguf_close(m.f);
    kt_vision_free(v);
}

static void test_reference(void **state) {
    (void)state;
    kt_error err = {0};
    kt_pool *pool = kt_pool_new(2, &err);
    assert_non_null(pool);
    char mm[512], png[512];
    const char *towers[2] = {"qwen3vl", "qwen25vl"}, *precs[2] = {"F32", "F16"};
    for (int t = 0; t < 2; t++)
        for (int p = 0; p < 2; p++) {
            snprintf(mm, sizeof mm, "%s", golden("golden/arch/mmproj-%s-%s.gguf%s", towers[t], precs[p], ""));
            snprintf(png, sizeof png, "%s", golden("golden/arch/vision-%s-%s.preproc.png", towers[t], "tiny", ""));
            size_t nb = 0;
            float *g =
                (float *)tu_read_file(golden("golden/arch/vision-%s-%s-%s.embd.f32", towers[t], precs[p], "tiny"), &nb);
            assert_non_null(g);
            char label[64];
            snprintf(label, sizeof label, "%s %s", towers[t], precs[p]);
            check_reference(pool, mm, png, g, label);
            free(g);
        }
    /* DeepStack (Qwen3-VL): the qwen3vl test file with random DeepStack
     * mergers after blocks 0 and 2; the main embedding must still be
     * llama.cpp's, the DeepStack outputs the reference's */
    snprintf(mm, sizeof mm, "%s", tu_shared("golden/arch/mmproj-qwen3vl-F32.gguf"));
    char ds_path[512];
    snprintf(ds_path, sizeof ds_path, "%s", tu_tmp("vision-deepstack.gguf"));
    write_variant(mm, ds_path, &(variant){.deepstack_mask = 5});
    kt_vision *v = kt_vision_load(ds_path, &err);
    if (!v) fail_msg("%s", err.msg);
    assert_int_equal(kt_vision_get_info(v)->n_deepstack, 2);
    kt_vision_free(v);
    size_t nb = 0;
    float *g3 = (float *)tu_read_file(tu_shared("golden/arch/vision-qwen3vl-F32-tiny.embd.f32"), &nb);
    assert_non_null(g3);
    check_reference(pool, ds_path, tu_shared("golden/arch/vision-qwen3vl-tiny.preproc.png"), g3,
                    "qwen3vl F32 + deepstack");
    free(g3);
    write_variant(mm, ds_path, &(variant){.deepstack_mask = 5, .drop_tensor = "v.deepstack.2.fc2.bias"});
    expect_refused(ds_path, KT_ERR_FORMAT, "'v.deepstack.2.fc2.bias'");

    /* qwen2vl_merger: the qwen2.5vl test file turned into Qwen2-VL's form
     * (LayerNorm with biases, fc1 -> quick GELU -> fc2, no windows) */
    snprintf(mm, sizeof mm, "%s", tu_shared("golden/arch/mmproj-qwen25vl-F32.gguf"));
    const char *q2 = tu_tmp("vision-qwen2vl.gguf");
    char q2path[512];
    snprintf(q2path, sizeof q2path, "%s", q2);
    write_variant(mm, q2path,
                  &(variant){.projector = "qwen2vl_merger",
                             .drop_keys = {"clip.use_silu", "clip.vision.n_wa_pattern"},
                             .drop_containing = "ffn_gate",
                             .add_ln_biases = true});
    v = kt_vision_load(q2path, &err);
    if (!v) fail_msg("%s", err.msg);
    const kt_vision_info *info = kt_vision_get_info(v);
    assert_string_equal(info->projector, "qwen2vl_merger");
    assert_int_equal(info->n_embd, 128);
    assert_int_equal(info->n_layers, 4);
    kt_vision_free(v);
    snprintf(png, sizeof png, "%s", tu_shared("golden/arch/vision-qwen25vl-photo.preproc.png"));
    if (TU_SANITIZED) /* the float64 reference on 864 patches takes minutes under ASan */
        snprintf(png, sizeof png, "%s", tu_shared("golden/arch/vision-qwen25vl-tiny.preproc.png"));
    check_reference(pool, q2path, png, NULL, "qwen2vl (made, no golden)");
    kt_pool_free(pool);
}

/* The same image with no pool and with 2 threads: the same numbers (each
 * thread's share of every kernel is computed as a single thread would);
 * and encode's argument checks. */
static void test_threads_and_args(void **state) {
    (void)state;
    kt_error err = {0};
    kt_vision *v = kt_vision_load(tu_shared("golden/arch/mmproj-qwen25vl-F16.gguf"), &err);
    if (!v) fail_msg("%s", err.msg);
    kt_image_prep_params pp;
    kt_vision_prep_params(v, &pp);
    int w = 0, h = 0;
    uint8_t *rgb = read_png_rgb(tu_shared("golden/arch/vision-qwen25vl-photo.preproc.png"), &w, &h);
    assert_non_null(rgb);
    kt_image_prep prep;
    make_prep(&pp, rgb, w, h, &prep);
    free(rgb);
    size_t n = (size_t)prep.grid_x * prep.grid_y * kt_vision_get_info(v)->n_embd;
    float *a = tu_xmalloc(n * sizeof *a), *b = tu_xmalloc(n * sizeof *b);
    kt_pool *pool = kt_pool_new(2, &err);
    assert_non_null(pool);
    assert_int_equal(kt_vision_encode(v, NULL, &prep, a, &err), KT_OK);
    assert_int_equal(kt_vision_encode(v, pool, &prep, b, &err), KT_OK);
    diff d = compare(a, b, n);
    printf("  1 thread vs 2: max|d| %.3g\n", d.max_abs);
    assert_true(d.max_abs == 0);

    kt_image_prep bad = prep;
    bad.grid_x++;
    assert_int_equal(kt_vision_encode(v, pool, &bad, a, &err), KT_ERR_ARG);
    printf("  refused: %s\n", err.msg);
    bad = prep;
    bad.width -= 14; /* not a multiple of 28 */
    assert_int_equal(kt_vision_encode(v, pool, &bad, a, &err), KT_ERR_ARG);
    assert_non_null(strstr(err.msg, "multiple of 28"));
    bad = prep;
    bad.pixels = NULL;
    assert_int_equal(kt_vision_encode(v, pool, &bad, a, &err), KT_ERR_ARG);
    assert_int_equal(kt_vision_encode(v, pool, NULL, a, &err), KT_ERR_ARG);
    kt_pool_free(pool);
    free(a);
    free(b);
    free(prep.pixels);
    kt_vision_free(v);
}

/* `kettle info` on an mmproj file adds what the tower loader makes of it */
static void test_info_cli(void **state) {
    (void)state;
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s info %s", KT_BIN, tu_shared("golden/arch/mmproj-qwen25vl-F16.gguf"));
    assert_int_equal(tu_run(cmd, &out, NULL), 0);
    assert_non_null(out);
    if (!strstr(out, "vision tower: qwen2.5vl_merger, 4 blocks, width 64, 4 heads, 315840 params") ||
        !strstr(out, "6272 to 3211264 pixels (8 to 4096 tokens)"))
        fail_msg("kettle info printed:\n%s", out);
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_goldens),          cmocka_unit_test(test_refusals), cmocka_unit_test(test_reference),
        cmocka_unit_test(test_threads_and_args), cmocka_unit_test(test_info_cli),
    };
    return tu_result(cmocka_run_group_tests(tests, NULL, NULL));
}
