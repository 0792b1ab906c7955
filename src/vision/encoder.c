/*
 * encoder.c - the Qwen-VL vision tower's forward pass over one image, as
 * llama.cpp's libmtmd computes it (tools/mtmd/models/qwen2vl.cpp and
 * qwen3vl.cpp).
 *
 * All patches go through each step together: every GEMM is one kt_matmul
 * with n_tokens = the number of patches (one AMX tile GEMM, ops/amx.h,
 * for a tower loaded onto the tiles, whose attention runs there too:
 * vt_attention_amx). The patches are kept in merge
 * order (merged row, merged column, then (dy, dx) = (0,0), (0,1), (1,0),
 * (1,1)), so that the merger's "4 patches of a group" are 4 consecutive
 * rows and a [n_patches][width] buffer is already the merger's
 * [n_tokens][4 width] input.
 *
 *   patches (F16 im2col) -> conv slice 0 + conv slice 1 (+ bias, + learned
 *   position embedding interpolated bilinearly with align_corners: qwen3vl)
 *   -> blocks: x += attn(norm1(x)); x += mlp(norm2(x)) (qwen3vl: DeepStack
 *   after the blocks that have it) -> post norm -> merger mm.0 -> GELU -> mm.2
 *
 * Window attention (qwen2.5vl): clip.cpp reorders the tokens window by
 * window, masks across windows and undoes the order at the end; attention
 * is the same computed within each window in place, which is what is done
 * here (vt_attention over groups of tokens).
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "ops/amx.h"
#include "ops/matmul.h"
#include "ops/repack.h"
#include "vision/vision_internal.h"

/* One image's sizes and buffers (floats unless said). */
typedef struct vt_run {
    int n_patches, n_tokens; /* patches; merged tokens = n_patches / 4 */
    int px, py;              /* patches per row / column */
    int *pos_y, *pos_x;      /* each patch's row and column, merge order */
    float *rope;             /* [n_patches][d_head]: their rotary cosines, sines (vt_rope_table) */
    int *full_start, *full_members, *win_start, *win_members;
    int n_win;
    float *col;       /* [n_patches][3 p p]: the im2col */
    float *x;         /* [n_patches][width]: the residual stream */
    float *xn;        /* [n_patches][width]: normed */
    float *qkv;       /* [n_patches][3 width] */
    float *att;       /* [n_patches][width] */
    float *tmp;       /* [n_patches][width] */
    float *up, *gate; /* [n_patches][max(n_ff, merger and DeepStack widths)]; gate: gated MLPs only */
    float *xh;        /* [n_patches][max(width, the above)]: a GEMM's input rounded to F16 */
    float *merged;    /* [n_tokens][proj_dim] */
    uint16_t *xa;     /* AMX towers: a GEMM's input split for the tiles (ops/amx.h) */
    float *panels;    /* AMX towers: each thread's output panel, KT_AMX_PANEL_FLOATS */
} vt_run;

static void run_free(vt_run *r) {
    free(r->pos_y);
    free(r->pos_x);
    free(r->rope);
    free(r->full_start);
    free(r->full_members);
    free(r->win_start);
    free(r->win_members);
    free(r->col);
    free(r->x);
    free(r->xn);
    free(r->qkv);
    free(r->att);
    free(r->tmp);
    free(r->up);
    free(r->gate);
    free(r->xh);
    free(r->merged);
    free(r->xa);
    free(r->panels);
}

static void *alloc_floats(size_t rows, size_t cols, bool *ok) {
    void *p = malloc(rows * cols * sizeof(float));
    if (!p) *ok = false;
    return p;
}

/* qwen2.5vl's windows: window_px / patch / 2 merged tokens a side, counted
 * from the top-left corner (partial windows at the right and bottom),
 * windows row-major, each window's tokens row-major, each token's 4
 * patches in merge order: clip.cpp's window_idx / inv_window_idx. */
static void make_windows(const kt_vision *v, vt_run *r) {
    int gx = r->px / 2, gy = r->py / 2, gw = v->window_px / v->patch / 2;
    int n = 0, m = 0;
    for (int y = 0; y < gy; y += gw)
        for (int x = 0; x < gx; x += gw) {
            r->win_start[n++] = m;
            for (int dy = 0; dy < gw && y + dy < gy; dy++)
                for (int dx = 0; dx < gw && x + dx < gx; dx++)
                    for (int k = 0; k < 4; k++) r->win_members[m++] = ((y + dy) * gx + (x + dx)) * 4 + k;
        }
    r->win_start[n] = m;
    r->n_win = n;
}

/* The buffers GEMMs write have rows for kt_amx_rows_pad(P) patches (the
 * AMX kernel writes whole row pairs); q, k and v are that far apart. */
static kt_status run_alloc(const kt_vision *v, const kt_image_prep *img, int n_threads, vt_run *r, kt_error *err) {
    memset(r, 0, sizeof *r);
    r->px = img->width / v->patch;
    r->py = img->height / v->patch;
    r->n_patches = r->px * r->py;
    r->n_tokens = r->n_patches / 4;
    size_t P = (size_t)kt_amx_rows_pad(r->n_patches), w = (size_t)v->width;
    size_t wide = (size_t)v->mm0_w.n_out; /* the widest MLP, merger or DeepStack hidden layer */
    bool gated = false;
    for (int il = 0; il < v->n_layers; il++) {
        const vt_layer *l = &v->layers[il];
        if ((size_t)l->up_w.n_out > wide) wide = (size_t)l->up_w.n_out;
        if (l->deepstack && (size_t)l->ds_fc1_w.n_out > wide) wide = (size_t)l->ds_fc1_w.n_out;
        gated |= l->gate_w.data != NULL;
    }
    int gw = v->window_px / v->patch / 2;
    size_t n_win = gw > 0 ? (size_t)((r->px / 2 + gw - 1) / gw) * ((r->py / 2 + gw - 1) / gw) : 1;
    bool ok = true;
    r->pos_y = malloc(P * sizeof(int));
    r->pos_x = malloc(P * sizeof(int));
    r->full_start = malloc(2 * sizeof(int));
    r->full_members = malloc(P * sizeof(int));
    r->win_start = malloc((n_win + 1) * sizeof(int));
    r->win_members = malloc(P * sizeof(int));
    ok = r->pos_y && r->pos_x && r->full_start && r->full_members && r->win_start && r->win_members;
    r->col = alloc_floats(P, (size_t)3 * v->patch * v->patch, &ok);
    r->x = alloc_floats(P, w, &ok);
    r->xn = alloc_floats(P, w, &ok);
    r->qkv = alloc_floats(P, 3 * w, &ok);
    r->att = alloc_floats(P, w, &ok);
    r->tmp = alloc_floats(P, w, &ok);
    r->up = alloc_floats(P, wide, &ok);
    r->gate = gated ? alloc_floats(P, wide, &ok) : NULL;
    r->xh = alloc_floats(P, wide > w ? wide : w, &ok);
    r->merged = alloc_floats((size_t)kt_amx_rows_pad(r->n_tokens), (size_t)v->proj_dim, &ok);
    r->rope = alloc_floats((size_t)r->n_patches, (size_t)v->d_head, &ok);
    if (v->amx_k_max) {
        r->xa = aligned_alloc(64, kt_amx_act_bytes(v->amx_k_max, r->n_patches));
        r->panels = aligned_alloc(64, (size_t)n_threads * KT_AMX_PANEL_FLOATS * sizeof(float));
        ok = ok && r->xa && r->panels;
    }
    if (!ok)
        return kt_error_set(err, KT_ERR_NOMEM, "vision encoder: out of memory for %d patches of width %d", r->n_patches,
                            v->width);
    for (int t = 0; t < r->n_patches; t++) {
        int g = t / 4, gx = r->px / 2;
        r->pos_y[t] = (g / gx) * 2 + (t % 4) / 2;
        r->pos_x[t] = (g % gx) * 2 + t % 2;
        r->full_members[t] = t;
    }
    vt_rope_table(r->rope, r->pos_y, r->pos_x, r->n_patches, v->d_head);
    r->full_start[0] = 0;
    r->full_start[1] = r->n_patches;
    if (gw > 0) make_windows(v, r);
    return KT_OK;
}

/* ---- GEMMs ---- */

/* The tower's GEMMs in chunks of tokens that the pool's threads take as
 * they come (kt_matmul single-threaded on each), not kt_matmul's fixed
 * halves: on a machine where another process holds part of a core, a
 * fixed split leaves the other thread waiting (ggml's mul_mat takes its
 * chunks the same way). The x16 kernels give each output one fma chain
 * whatever the chunk (matmul.c), so the bits do not change. */
#define VT_GEMM_TOKENS 64

typedef struct gemm_job {
    float *out;
    const void *w;
    kt_dtype type;
    const float *x;
    int n_in, n_out, n_rows;
    atomic_int next;
} gemm_job;

static void gemm_worker(void *ctx, int ith, int nth) {
    (void)ith, (void)nth;
    gemm_job *j = ctx;
    for (;;) {
        int t0 = atomic_fetch_add(&j->next, 1) * VT_GEMM_TOKENS;
        if (t0 >= j->n_rows) return;
        int nt = j->n_rows - t0 < VT_GEMM_TOKENS ? j->n_rows - t0 : VT_GEMM_TOKENS;
        kt_matmul(NULL, j->out + (size_t)t0 * j->n_out, j->w, j->type, j->x + (size_t)t0 * j->n_in, j->n_in,
                  j->n_out, nt);
    }
}

static void gemm(kt_pool *pool, float *out, const void *w, kt_dtype type, const float *x, int n_in, int n_out,
                 int n_rows) {
    gemm_job j = {out, w, type, x, n_in, n_out, n_rows, 0};
    kt_pool_run(pool, gemm_worker, &j);
}

/* The same on the AMX tiles (ops/amx.h): the input split once (threads
 * over rows), then chunks of at most KT_AMX_MAX_ROWS rows, as many for
 * each thread (the weights are read once a chunk), taken as they come. */
typedef struct amx_job {
    float *out;
    const uint16_t *w;
    uint16_t *a;
    const float *x;
    float *panels;
    int n_in, n_out, n_rows, rows_pad, chunk;
    bool round_f16; /* the input rounded to F16 as it is split */
    atomic_int next;
} amx_job;

static void amx_split_worker(void *ctx, int ith, int nth) {
    amx_job *j = ctx;
    long lo, hi;
    kt_split_range(j->rows_pad / 16, ith, nth, &lo, &hi);
    kt_amx_split_rows(j->a, j->x, j->n_in, j->n_rows, (int)lo * 16, (int)hi * 16, j->round_f16);
}

static void amx_gemm_worker(void *ctx, int ith, int nth) {
    (void)nth;
    amx_job *j = ctx;
    for (;;) {
        int r0 = atomic_fetch_add(&j->next, 1) * j->chunk;
        if (r0 >= j->rows_pad) return;
        int r1 = r0 + j->chunk < j->rows_pad ? r0 + j->chunk : j->rows_pad;
        kt_amx_matmul(j->out, j->w, j->a, j->n_in, j->n_out, j->n_rows, r0, r1, j->panels + ith * KT_AMX_PANEL_FLOATS);
    }
}

static void gemm_amx(kt_pool *pool, vt_run *r, float *out, const uint16_t *w, const float *x, int n_in, int n_out,
                     int n_rows, bool round_f16) {
    const int nth = pool ? kt_pool_size(pool) : 1, rows_pad = kt_amx_rows_pad(n_rows);
    int n_chunks = (rows_pad + KT_AMX_MAX_ROWS - 1) / KT_AMX_MAX_ROWS;
    n_chunks = (n_chunks + nth - 1) / nth * nth;
    const int chunk = kt_amx_rows_pad((rows_pad + n_chunks - 1) / n_chunks);
    amx_job j = {out, w, r->xa, x, r->panels, n_in, n_out, n_rows, rows_pad, chunk, round_f16, 0};
    kt_pool_run(pool, amx_split_worker, &j);
    kt_pool_run(pool, amx_gemm_worker, &j);
}

/* ---- input ---- */

/* The im2col of llama.cpp's conv_2d, in merge order: patch t's row holds
 * its 3 x p x p pixels (channel, row, column), rounded to F16 as ggml's
 * F16 im2col does. */
static void build_patches(const kt_vision *v, kt_pool *pool, const kt_image_prep *img, const vt_run *r) {
    int p = v->patch, W = img->width, H = img->height;
    for (int t = 0; t < r->n_patches; t++) {
        float *row = r->col + (size_t)t * 3 * p * p;
        for (int c = 0; c < 3; c++)
            for (int ky = 0; ky < p; ky++) {
                const float *src =
                    img->pixels + ((size_t)c * H + (size_t)r->pos_y[t] * p + ky) * W + (size_t)r->pos_x[t] * p;
                memcpy(row + (c * p + ky) * p, src, (size_t)p * sizeof *row);
            }
    }
    vt_round_f16(pool, r->col, r->col, (long)r->n_patches * 3 * p * p);
}

/* ggml_interpolate(BILINEAR | ALIGN_CORNERS) of the side x side learned
 * position embedding to px x py, added to each patch (float arithmetic as
 * ggml's CPU op). */
static void add_pos_embd(const kt_vision *v, const vt_run *r) {
    const float *pe = v->pos_embd.data;
    int n = v->pos_side, w = v->width;
    float sf0 = r->px > 1 && n > 1 ? (float)(r->px - 1) / (float)(n - 1) : (float)r->px / (float)n;
    float sf1 = r->py > 1 && n > 1 ? (float)(r->py - 1) / (float)(n - 1) : (float)r->py / (float)n;
    for (int t = 0; t < r->n_patches; t++) {
        float fy = (float)r->pos_y[t] / sf1, fx = (float)r->pos_x[t] / sf0;
        int y0 = (int)floorf(fy), x0 = (int)floorf(fx);
        int y1 = y0 + 1, x1 = x0 + 1;
        y0 = y0 < 0 ? 0 : y0 > n - 1 ? n - 1 : y0;
        y1 = y1 < 0 ? 0 : y1 > n - 1 ? n - 1 : y1;
        x0 = x0 < 0 ? 0 : x0 > n - 1 ? n - 1 : x0;
        x1 = x1 < 0 ? 0 : x1 > n - 1 ? n - 1 : x1;
        float dy = fminf(fmaxf(fy - (float)y0, 0.0f), 1.0f), dx = fminf(fmaxf(fx - (float)x0, 0.0f), 1.0f);
        const float *a = pe + ((size_t)y0 * n + x0) * w, *b = pe + ((size_t)y0 * n + x1) * w;
        const float *c = pe + ((size_t)y1 * n + x0) * w, *d = pe + ((size_t)y1 * n + x1) * w;
        float *x = r->x + (size_t)t * w;
        for (int i = 0; i < w; i++)
            x[i] += a[i] * (1 - dx) * (1 - dy) + b[i] * dx * (1 - dy) + c[i] * (1 - dx) * dy + d[i] * dx * dy;
    }
}

static void embed_patches(const kt_vision *v, kt_pool *pool, const kt_image_prep *img, vt_run *r) {
    int n_in = 3 * v->patch * v->patch, w = v->width, P = r->n_patches;
    build_patches(v, pool, img, r);
    for (int k = 0; k < 2; k++) {
        float *out = k ? r->tmp : r->x;
        if (v->patch_amx[k])
            gemm_amx(pool, r, out, v->patch_amx[k], r->col, n_in, w, P, false); /* r->col is F16 already */
        else
            gemm(pool, out, v->patch_w16[k], v->patch_type, r->col, n_in, w, P);
    }
    vt_add(pool, r->x, r->tmp, (long)P * w);
    vt_add_bias(pool, r->x, v->patch_b.data, P, w);
    if (v->pos_embd.data) add_pos_embd(v, r);
    if (v->pre_ln_w.data) vt_norm_rows(pool, v->norm, r->x, r->x, v->pre_ln_w.data, v->pre_ln_b.data, P, w, v->eps);
}

/* ---- blocks ---- */

/* out[t] = W x[t] + b for every row (b may be absent). With F16 weights
 * ggml's CPU mul_mat converts the activations to F16 (F16's vec_dot_type;
 * on x86 tinyBLAS too takes F16 x F16 only), so they are rounded to F16
 * here alike (on the F16 goldens this lowers the rms difference from
 * llama.cpp's embeddings by 15-35%; the max stays ~5e-4 relative). */
static void linear(kt_pool *pool, vt_run *r, float *out, const vt_weight *wt, const vt_weight *b, const float *x,
                   int n_rows) {
    const bool f16 = kt_repack_plain(wt->type) == KT_F16;
    if (wt->amx) { /* the rounding done by the split */
        gemm_amx(pool, r, out, wt->amx, x, wt->n_in, wt->n_out, n_rows, f16);
    } else {
        if (f16) {
            vt_round_f16(pool, r->xh, x, (long)n_rows * wt->n_in);
            x = r->xh;
        }
        gemm(pool, out, wt->data, wt->type, x, wt->n_in, wt->n_out, n_rows);
    }
    vt_add_bias(pool, out, b->data, n_rows, wt->n_out);
}

static kt_status attention(const kt_vision *v, kt_pool *pool, const vt_layer *l, vt_run *r, kt_error *err) {
    int P = r->n_patches, w = v->width, stride;
    float *q, *k, *vv;
    vt_norm_rows(pool, v->norm, r->xn, r->x, l->ln1_w.data, l->ln1_b.data, P, w, v->eps);
    if (l->qkv_w.data) { /* fused: each row q | k | v */
        linear(pool, r, r->qkv, &l->qkv_w, &l->qkv_b, r->xn, P);
        q = r->qkv, k = r->qkv + w, vv = r->qkv + 2 * w, stride = 3 * w;
    } else {
        const size_t Pp = (size_t)kt_amx_rows_pad(P); /* the GEMMs' rows (run_alloc) */
        q = r->qkv, k = r->qkv + Pp * w, vv = r->qkv + 2 * Pp * w, stride = w;
        linear(pool, r, q, &l->q_w, &l->q_b, r->xn, P);
        linear(pool, r, k, &l->k_w, &l->k_b, r->xn, P);
        linear(pool, r, vv, &l->v_w, &l->v_b, r->xn, P);
    }
    vt_rope_2d(pool, q, stride, r->rope, P, v->n_heads, v->d_head);
    vt_rope_2d(pool, k, stride, r->rope, P, v->n_heads, v->d_head);
    bool full = l->full_attn || r->n_win <= 1;
    kt_status (*attend)(kt_pool *, float *, const float *, const float *, const float *, int, int, int, const int *,
                        const int *, int, kt_error *) = v->amx_k_max ? vt_attention_amx : vt_attention;
    kt_status st = attend(pool, r->att, q, k, vv, stride, v->n_heads, v->d_head, full ? r->full_start : r->win_start,
                          full ? r->full_members : r->win_members, full ? 1 : r->n_win, err);
    if (st) return st;
    linear(pool, r, r->tmp, &l->o_w, &l->o_b, r->att, P);
    vt_add(pool, r->x, r->tmp, (long)P * w);
    return KT_OK;
}

static void mlp(const kt_vision *v, kt_pool *pool, const vt_layer *l, vt_run *r) {
    int P = r->n_patches, w = v->width, n_ff = l->up_w.n_out;
    vt_norm_rows(pool, v->norm, r->xn, r->x, l->ln2_w.data, l->ln2_b.data, P, w, v->eps);
    linear(pool, r, r->up, &l->up_w, &l->up_b, r->xn, P);
    float *h = r->up;
    if (l->gate_w.data) { /* act(gate) * up, clip.cpp's swiglu / geglu split */
        linear(pool, r, r->gate, &l->gate_w, &l->gate_b, r->xn, P);
        vt_glu(pool, v->act, r->gate, r->up, (long)P * n_ff);
        h = r->gate;
    } else {
        vt_act_inplace(pool, v->act, r->up, (long)P * n_ff);
    }
    linear(pool, r, r->tmp, &l->down_w, &l->down_b, h, P);
    vt_add(pool, r->x, r->tmp, (long)P * w);
}

/* ---- outputs ---- */

/* norm (over the 4 width of a merge group) -> fc1 -> GELU -> fc2 into the
 * embedding rows at column `col` (stride out_stride); the norm is the
 * merger's only in DeepStack (the main merger's norm is post_ln, applied
 * per patch before). */
static void project(const kt_vision *v, kt_pool *pool, vt_run *r, const float *in, const vt_weight *norm_w,
                    const vt_weight *norm_b, const vt_weight *fc1_w, const vt_weight *fc1_b, const vt_weight *fc2_w,
                    const vt_weight *fc2_b, float *embd, int col, int out_stride) {
    int T = r->n_tokens;
    if (norm_w) {
        vt_norm_rows(pool, v->norm, r->xn, in, norm_w->data, norm_b->data, T, 4 * v->width, v->eps);
        in = r->xn;
    }
    linear(pool, r, r->up, fc1_w, fc1_b, in, T);
    vt_act_inplace(pool, VT_ACT_GELU, r->up, (long)T * fc1_w->n_out);
    linear(pool, r, r->merged, fc2_w, fc2_b, r->up, T);
    for (int t = 0; t < T; t++)
        memcpy(embd + (size_t)t * out_stride + col, r->merged + (size_t)t * v->proj_dim,
               (size_t)v->proj_dim * sizeof *embd);
}

static kt_status check_image(const kt_vision *v, const kt_image_prep *img, kt_error *err) {
    if (!img || !img->pixels) return kt_error_set(err, KT_ERR_ARG, "vision encoder: no image");
    int side = v->patch * v->merge;
    if (img->width <= 0 || img->height <= 0 || img->width % side || img->height % side)
        return kt_error_set(err, KT_ERR_ARG, "vision encoder: image %dx%d is not a multiple of %d pixels a side",
                            img->width, img->height, side);
    if (img->grid_x != img->width / side || img->grid_y != img->height / side)
        return kt_error_set(err, KT_ERR_ARG, "vision encoder: grid %dx%d does not match the image %dx%d", img->grid_x,
                            img->grid_y, img->width, img->height);
    /* beyond 4x the llama.cpp maximum (4096 tokens): a caller's mistake, and
     * keeps every size below in int range */
    if ((int64_t)img->grid_x * img->grid_y > 4 * 4096)
        return kt_error_set(err, KT_ERR_ARG, "vision encoder: %dx%d tokens is too many", img->grid_x, img->grid_y);
    return KT_OK;
}

kt_status kt_vision_encode(kt_vision *v, kt_pool *pool, const kt_image_prep *img, float *embd, kt_error *err) {
    kt_status st = check_image(v, img, err);
    if (st) return st;
    vt_run r;
    if ((st = run_alloc(v, img, pool ? kt_pool_size(pool) : 1, &r, err))) {
        run_free(&r);
        return st;
    }
    int out_stride = v->proj_dim * (1 + v->info.n_deepstack), n_ds = 0;
    embed_patches(v, pool, img, &r);
    for (int il = 0; il < v->n_layers && !st; il++) {
        const vt_layer *l = &v->layers[il];
        if ((st = attention(v, pool, l, &r, err))) break;
        mlp(v, pool, l, &r);
        if (l->deepstack)
            project(v, pool, &r, r.x, &l->ds_norm_w, &l->ds_norm_b, &l->ds_fc1_w, &l->ds_fc1_b, &l->ds_fc2_w,
                    &l->ds_fc2_b, embd, v->proj_dim * (1 + n_ds++), out_stride);
    }
    if (!st) {
        vt_norm_rows(pool, v->norm, r.x, r.x, v->post_ln_w.data, v->post_ln_b.data, r.n_patches, v->width, v->eps);
        project(v, pool, &r, r.x, NULL, NULL, &v->mm0_w, &v->mm0_b, &v->mm2_w, &v->mm2_b, embd, 0, out_stride);
    }
    run_free(&r);
    return st;
}
