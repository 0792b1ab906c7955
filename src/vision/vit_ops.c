/*
 * vit_ops.c - the vision tower's kernels other than the GEMMs: norms,
 * activations, the 2-D rotary and bidirectional (full or windowed)
 * attention, in plain C with threads over rows or heads.
 *
 * Each follows the ggml CPU op llama.cpp's graph uses, so that the
 * embeddings agree with libmtmd's to rounding: LayerNorm / RMSNorm sums in
 * double, GELU and quick GELU through ggml's F16 lookup (the argument and
 * the result rounded to F16: ggml_vec_gelu_f32 with GGML_GELU_FP16), the
 * rotary's angles by repeated multiplication in float as
 * ggml_mrope_cache_init computes them, softmax normalised before P x V.
 * The inner loops run over keys (scores) and over the head dim (P x V)
 * with no reduction across lanes, so the compiler vectorizes them without
 * -ffast-math.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/fp16.h"
#include "ops/cpu.h"
#include "ops/matmul.h"
#include "ops/repack.h"
#include "vision/vision_internal.h"
#include "vision/vit_simd.h"

#include <pthread.h>

/* ---- norms ---- */

typedef struct norm_job {
    vt_norm kind;
    float *y;
    const float *x, *w, *b;
    int n_rows, n;
    float eps;
} norm_job;

static void norm_row(const norm_job *j, float *y, const float *x) {
    int n = j->n;
    float scale;
    if (j->kind == VT_NORM_LAYER) {
        double sum = 0;
        for (int i = 0; i < n; i++) sum += x[i];
        float mean = (float)sum / (float)n;
        double var = 0;
        for (int i = 0; i < n; i++) {
            y[i] = x[i] - mean;
            var += (double)(y[i] * y[i]);
        }
        scale = 1.0f / sqrtf((float)(var / n) + j->eps);
    } else {
        double sum = 0;
        for (int i = 0; i < n; i++) sum += (double)(x[i] * x[i]);
        scale = 1.0f / sqrtf((float)(sum / n) + j->eps);
        if (y != x) memcpy(y, x, (size_t)n * sizeof *y);
    }
    for (int i = 0; i < n; i++) y[i] *= scale;
    if (j->w)
        for (int i = 0; i < n; i++) y[i] *= j->w[i];
    if (j->b)
        for (int i = 0; i < n; i++) y[i] += j->b[i];
}

static void norm_worker(void *ctx, int ith, int nth) {
    const norm_job *j = ctx;
    long lo, hi;
    kt_split_range(j->n_rows, ith, nth, &lo, &hi);
    for (long r = lo; r < hi; r++) norm_row(j, j->y + r * j->n, j->x + r * j->n);
}

void vt_norm_rows(kt_pool *pool, vt_norm kind, float *y, const float *x, const float *w, const float *b, int n_rows,
                  int n, float eps) {
    norm_job j = {kind, y, x, w, b, n_rows, n, eps};
    kt_pool_run(pool, norm_worker, &j);
}

/* ---- element-wise ---- */

/* The element-wise passes over whole activations (60 MB at 3680 patches
 * x 4096), split over the pool: one thread alone left the other idle for
 * a few % of a 4B tower's time. */
typedef enum ew_op { EW_ADD, EW_BIAS, EW_ROUND } ew_op;

typedef struct ew_job {
    ew_op op;
    float *y;
    const float *x;
    long n_rows;
    int n;
} ew_job;

static void ew_worker(void *ctx, int ith, int nth) {
    const ew_job *j = ctx;
    long lo, hi;
    kt_split_range(j->n_rows, ith, nth, &lo, &hi);
    float *y = j->y + lo * j->n;
    const float *x = j->x + (j->op == EW_BIAS ? 0 : lo * j->n);
    long len = (hi - lo) * j->n;
    if (j->op == EW_ADD)
        for (long i = 0; i < len; i++) y[i] += x[i];
    else if (j->op == EW_ROUND)
        vt_round_f16_to(y, x, len);
    else
        for (long r = 0; r < hi - lo; r++)
            for (int i = 0; i < j->n; i++) y[r * j->n + i] += x[i];
}

/* rows of 1024 values (whole cache lines per thread) unless n is small */
static void ew_run(kt_pool *pool, ew_op op, float *y, const float *x, long n) {
    int row = n % 1024 == 0 ? 1024 : 1;
    ew_job j = {op, y, x, n / row, row};
    kt_pool_run(pool, ew_worker, &j);
}

void vt_add_bias(kt_pool *pool, float *x, const float *b, int n_rows, int n) {
    if (!b) return;
    ew_job j = {EW_BIAS, x, b, n_rows, n};
    kt_pool_run(pool, ew_worker, &j);
}

void vt_add(kt_pool *pool, float *y, const float *x, long n) { ew_run(pool, EW_ADD, y, x, n); }

void vt_round_f16(kt_pool *pool, float *y, const float *x, long n) { ew_run(pool, EW_ROUND, y, x, n); }

static float f16_round(float x) { return kt_fp16_to_fp32(kt_fp32_to_fp16(x)); }

/* ggml_gelu_f32: the tanh form, in float */
static float gelu_tanh(float x) {
    const float coef_a = 0.044715f, sqrt_2_over_pi = 0.79788456080286535587989211986876f;
    return 0.5f * x * (1.0f + tanhf(sqrt_2_over_pi * x * (1.0f + coef_a * x * x)));
}

static float silu(float x) { return x / (1.0f + expf(-x)); }

/* GELU and quick GELU as ggml's CPU computes them are functions of the
 * F16 value of their argument: tables of all 65536 (fp16 bits -> the
 * result), made once, as ggml_cpu_init makes its own. A lookup is a
 * conversion and a gather instead of a tanh or exp (they took ~15% of a
 * 4B tower's time). */
static float g_gelu_tab[65536], g_gelu_quick_tab[65536];
static pthread_once_t g_tabs_once = PTHREAD_ONCE_INIT;

static void make_tables(void) {
    for (uint32_t h = 0; h < 65536; h++) {
        float x = kt_fp16_to_fp32((uint16_t)h);
        g_gelu_tab[h] = f16_round(gelu_tanh(x));
        g_gelu_quick_tab[h] = f16_round(x * (1.0f / (1.0f + expf(-1.702f * x))));
    }
}

/* x[i] = act(x[i]) (* up[i] when up is given), split over the pool: with
 * a real tower's MLP (3680 patches x 4304) the activation costs as much as
 * a GEMM's share per thread */
typedef struct act_job {
    vt_act act;
    float *x;
    const float *up;
    long n;
} act_job;

/* the scalar twin of vt_act_table_avx2 */
static void act_table_c(const float *table, bool clamp10, float *x, const float *up, long n) {
    for (long i = 0; i < n; i++) {
        float y = vt_act_table1(table, clamp10, x[i]);
        x[i] = up ? y * up[i] : y;
    }
}

void vt_act_table(const float *table, bool clamp10, float *x, const float *up, long n) {
    if (kt_cpu_has_avx2()) vt_act_table_avx2(table, clamp10, x, up, n);
    else act_table_c(table, clamp10, x, up, n);
}

static void act_worker(void *ctx, int ith, int nth) {
    const act_job *j = ctx;
    long lo, hi;
    kt_split_range(j->n, ith, nth, &lo, &hi);
    const float *up = j->up ? j->up + lo : NULL;
    if (j->act == VT_ACT_SILU) {
        for (long i = lo; i < hi; i++) j->x[i] = silu(j->x[i]) * (j->up ? j->up[i] : 1.0f);
        return;
    }
    bool gelu = j->act == VT_ACT_GELU;
    vt_act_table(gelu ? g_gelu_tab : g_gelu_quick_tab, gelu, j->x + lo, up, hi - lo);
}

const float *vt_gelu_table(bool quick) {
    pthread_once(&g_tabs_once, make_tables);
    return quick ? g_gelu_quick_tab : g_gelu_tab;
}

void vt_act_inplace(kt_pool *pool, vt_act act, float *x, long n) {
    pthread_once(&g_tabs_once, make_tables);
    act_job j = {act, x, NULL, n};
    kt_pool_run(pool, act_worker, &j);
}

void vt_glu(kt_pool *pool, vt_act act, float *gate, const float *up, long n) {
    pthread_once(&g_tabs_once, make_tables);
    act_job j = {act, gate, up, n};
    kt_pool_run(pool, act_worker, &j);
}

void vt_round_f16_ref(float *y, const float *x, long n) {
    for (long i = 0; i < n; i++) y[i] = f16_round(x[i]);
}

void vt_round_f16_to(float *y, const float *x, long n) {
    if (kt_cpu_has_avx2()) vt_round_f16_avx2(y, x, n);
    else vt_round_f16_ref(y, x, n);
}

/* ---- 2-D rotary ---- */

typedef struct rope_job {
    float *x;
    int stride;
    const float *table;
    int n_tokens, n_heads, d;
} rope_job;

/* cos / sin of pair j for one token, as ggml_mrope_cache_init computes them
 * in vision mode (n_dims = d/2, sections d/4 each, indep_sects): the angle
 * runs from the row at j = 0 and restarts from the column at j = d/4, each
 * step times base^(-2 / n_dims) in float. */
static void rope_cache(int d, int pos_y, int pos_x, float *cs, float *sn) {
    const float theta_scale = powf(10000.0f, -2.0f / (float)(d / 2));
    float theta_y = (float)pos_y, theta_x = (float)pos_x;
    for (int j = 0; j < d / 2; j++) {
        if (j == d / 4) theta_x = (float)pos_x;
        float theta = j < d / 4 ? theta_y : theta_x;
        cs[j] = cosf(theta);
        sn[j] = sinf(theta);
        theta_y *= theta_scale;
        theta_x *= theta_scale;
    }
}

void vt_rope_table(float *table, const int *pos_y, const int *pos_x, int n_tokens, int d_head) {
    for (int t = 0; t < n_tokens; t++) {
        float *cs = table + (size_t)t * d_head;
        rope_cache(d_head, pos_y[t], pos_x[t], cs, cs + d_head / 2);
    }
}

static void rope_worker(void *ctx, int ith, int nth) {
    const rope_job *r = ctx;
    int d = r->d, half = d / 2;
    long lo, hi;
    kt_split_range(r->n_tokens, ith, nth, &lo, &hi);
    for (long t = lo; t < hi; t++) {
        const float *cs = r->table + t * d, *sn = cs + half;
        for (int h = 0; h < r->n_heads; h++) {
            float *v = r->x + t * r->stride + (long)h * d;
            for (int j = 0; j < half; j++) {
                float x0 = v[j], x1 = v[j + half];
                v[j] = x0 * cs[j] - x1 * sn[j];
                v[j + half] = x0 * sn[j] + x1 * cs[j];
            }
        }
    }
}

void vt_rope_2d(kt_pool *pool, float *x, int stride, const float *table, int n_tokens, int n_heads, int d_head) {
    rope_job r = {x, stride, table, n_tokens, n_heads, d_head};
    kt_pool_run(pool, rope_worker, &r);
}

/* ---- attention ---- */

#define VT_QUERY_CHUNK 32 /* queries per task: enough work per gather of K and V */

typedef struct attn_job {
    float *out;
    const float *q, *k, *v;
    int stride, n_heads, d;
    const int *win_start, *members;
    int n_windows;
    long n_tasks;
    const long *task_start; /* first task of each window, n_windows + 1 */
    float *scratch;         /* per thread: scratch_floats */
    size_t scratch_floats;
    int max_win;
} attn_job;

/* K of one window and head transposed to [d][n] (scores loop over keys)
 * and V gathered to [n][d] (P x V loops over the head dim). */
static void gather_kv(const attn_job *a, int w, int h, float *kt, float *vw) {
    int ws = a->win_start[w], n = a->win_start[w + 1] - ws, d = a->d;
    for (int j = 0; j < n; j++) {
        long t = a->members[ws + j];
        const float *kr = a->k + t * a->stride + (long)h * d;
        const float *vr = a->v + t * a->stride + (long)h * d;
        for (int c = 0; c < d; c++) kt[(long)c * n + j] = kr[c];
        memcpy(vw + (long)j * d, vr, (size_t)d * sizeof *vw);
    }
}

/* softmax(q K^T / sqrt(d)) V for one query over the n gathered keys */
static void attend_one(const attn_job *a, const float *qi, int n, const float *kt, const float *vw, float *s,
                       float *acc, float *o) {
    int d = a->d;
    const float scale = 1.0f / sqrtf((float)d);
    for (int j = 0; j < n; j++) s[j] = 0.0f;
    for (int c = 0; c < d; c++) {
        const float qc = qi[c], *kr = kt + (long)c * n;
        for (int j = 0; j < n; j++) s[j] += qc * kr[j];
    }
    float mx = -INFINITY;
    for (int j = 0; j < n; j++) {
        s[j] *= scale;
        if (s[j] > mx) mx = s[j];
    }
    double sum = 0;
    for (int j = 0; j < n; j++) {
        s[j] = expf(s[j] - mx);
        sum += s[j];
    }
    const float inv = (float)(1.0 / sum);
    for (int c = 0; c < d; c++) acc[c] = 0.0f;
    for (int j = 0; j < n; j++) {
        const float p = s[j] * inv, *vr = vw + (long)j * d;
        for (int c = 0; c < d; c++) acc[c] += p * vr[c];
    }
    memcpy(o, acc, (size_t)d * sizeof *o);
}

static void attn_worker(void *ctx, int ith, int nth) {
    const attn_job *a = ctx;
    int d = a->d;
    float *kt = a->scratch + (size_t)ith * a->scratch_floats;
    float *vw = kt + (size_t)a->max_win * d, *s = vw + (size_t)a->max_win * d, *acc = s + a->max_win;
    int have_w = -1, have_h = -1, w = 0;
    for (long task = ith; task < a->n_tasks; task += nth) {
        while (task >= a->task_start[w + 1]) w++; /* tasks ascend, so w only moves forward */
        int ws = a->win_start[w], n = a->win_start[w + 1] - ws;
        long n_chunks = (n + VT_QUERY_CHUNK - 1) / VT_QUERY_CHUNK;
        long local = task - a->task_start[w];
        int h = (int)(local / n_chunks), chunk = (int)(local % n_chunks);
        if (w != have_w || h != have_h) {
            gather_kv(a, w, h, kt, vw);
            have_w = w;
            have_h = h;
        }
        int i_end = (chunk + 1) * VT_QUERY_CHUNK < n ? (chunk + 1) * VT_QUERY_CHUNK : n;
        for (int i = chunk * VT_QUERY_CHUNK; i < i_end; i++) {
            long t = a->members[ws + i];
            attend_one(a, a->q + t * a->stride + (long)h * d, n, kt, vw, s, acc,
                       a->out + t * (long)a->n_heads * d + (long)h * d);
        }
    }
}

/* The first task of each window: a task is (window, head, block of
 * `block` queries), numbered window by window; entry n_windows is the
 * count. NULL with err set. */
long *vt_attention_tasks(const int *win_start, int n_windows, int n_heads, int block, kt_error *err) {
    long *task_start = malloc(((size_t)n_windows + 1) * sizeof *task_start);
    if (!task_start) {
        kt_error_set(err, KT_ERR_NOMEM, "vision attention: out of memory for %d windows", n_windows);
        return NULL;
    }
    task_start[0] = 0;
    for (int w = 0; w < n_windows; w++) {
        long n = win_start[w + 1] - win_start[w];
        task_start[w + 1] = task_start[w] + (long)n_heads * ((n + block - 1) / block);
    }
    return task_start;
}

kt_status vt_attention_ref(kt_pool *pool, float *out, const float *q, const float *k, const float *v, int stride,
                           int n_heads, int d_head, const int *win_start, const int *members, int n_windows,
                           kt_error *err) {
    int max_win = 0;
    for (int w = 0; w < n_windows; w++)
        if (win_start[w + 1] - win_start[w] > max_win) max_win = win_start[w + 1] - win_start[w];
    long *task_start = vt_attention_tasks(win_start, n_windows, n_heads, VT_QUERY_CHUNK, err);
    if (!task_start) return err->status;
    int nth = pool ? kt_pool_size(pool) : 1;
    size_t per = 2 * (size_t)max_win * d_head + (size_t)max_win + (size_t)d_head;
    per = (per + 15) & ~(size_t)15; /* threads' scratch on separate cache lines */
    float *scratch = malloc((size_t)nth * per * sizeof *scratch);
    if (!scratch) {
        free(task_start);
        return kt_error_set(err, KT_ERR_NOMEM, "vision attention: out of memory for %d threads x %d keys", nth,
                            max_win);
    }
    attn_job a = {
        out,        q,       k,   v,      stride, n_heads, d_head, win_start, members, n_windows, task_start[n_windows],
        task_start, scratch, per, max_win};
    kt_pool_run(pool, attn_worker, &a);
    free(scratch);
    free(task_start);
    return KT_OK;
}

/* ---- attention through the GEMM ----
 *
 * The same softmax(q K^T / sqrt(d)) V, with both products as kt_matmul
 * over the F32x16 layout (ops/repack.h), which runs near the FMA peak:
 * for one window and head, K is the "weight" of Q K^T (rows = keys, 16
 * keys side by side) and V^T that of P V (rows = head dims, 16 side by
 * side); a block of VT_QUERY_BLOCK queries is the activations. The keys
 * are padded to a multiple of 16 with zero rows, whose scores are dropped
 * before the softmax and whose probabilities are 0. The softmax is
 * normalized after P V (d values a query, not n: one pass over the
 * scores less). Threads take (window,
 * head, query block) tasks; each gathers its window's K and V once per
 * (window, head) and calls kt_matmul single-threaded. Softmax as the plain
 * version's. The sums run in another order (one fma chain per score and
 * per output, not the plain loops'), so results differ in the last bits. */

#ifndef VT_QUERY_BLOCK
#define VT_QUERY_BLOCK 48 /* queries per GEMM: 8 tiles of 6 (the AVX2 x16 tile); S is 48 x n floats */
#endif

typedef struct fattn_job {
    float *out;
    const float *q, *k, *v;
    int stride, n_heads, d;
    const int *win_start, *members;
    long n_tasks;
    const long *task_start; /* first task of each window, n_windows + 1 */
    float *scratch;         /* per thread: scratch_floats */
    size_t scratch_floats;
    int max_pad; /* the largest window's keys rounded up to 16 */
    atomic_long next; /* the next task to take */
} fattn_job;

static int pad16(int n) { return (n + KT_X16_ROWS - 1) / KT_X16_ROWS * KT_X16_ROWS; }

/* K of window w, head h, as F32x16 rows of d (group g: for each c, keys
 * 16g .. 16g+15), and V^T as F32x16 rows of n_pad (group g: for each key
 * j, dims 16g .. 16g+15); padded keys are zero. */
static void gather_kv_x16(const fattn_job *a, int w, int h, int n_pad, float *kx, float *vx) {
    int ws = a->win_start[w], n = a->win_start[w + 1] - ws, d = a->d;
    for (int j = 0; j < n_pad; j++) {
        float *kg = kx + (size_t)(j / KT_X16_ROWS) * KT_X16_ROWS * d + j % KT_X16_ROWS;
        if (j >= n) {
            for (int c = 0; c < d; c++) kg[(size_t)c * KT_X16_ROWS] = 0.0f;
            for (int c = 0; c < d; c++) vx[((size_t)(c / KT_X16_ROWS) * n_pad + j) * KT_X16_ROWS + c % KT_X16_ROWS] = 0;
            continue;
        }
        long t = a->members[ws + j];
        const float *kr = a->k + t * a->stride + (long)h * d, *vr = a->v + t * a->stride + (long)h * d;
        for (int c = 0; c < d; c++) kg[(size_t)c * KT_X16_ROWS] = kr[c];
        for (int g = 0; g < d / KT_X16_ROWS; g++)
            memcpy(vx + ((size_t)g * n_pad + j) * KT_X16_ROWS, vr + g * KT_X16_ROWS, KT_X16_ROWS * sizeof *vx);
    }
}

/* softmax of a row of scores, as ggml's soft_max but normalized after
 * P V (vit_simd.h): the scalar twin of vt_softmax_row_avx2 */
float vt_softmax_row_c(float *s, int n, int n_pad, float scale) {
    const int n8 = n & ~7;
    float mx = -INFINITY;
    for (int j = 0; j < n; j++) mx = s[j] > mx ? s[j] : mx;
    const float ms = mx * scale;
    double lanes[8] = {0}, sum = 0;
    for (int j = 0; j < n8; j++) {
        s[j] = vt_expf_neg(fmaf(s[j], scale, -ms));
        lanes[j % 8] += (double)s[j];
    }
    for (int k = 0; k < 8; k++) sum += lanes[k];
    for (int j = n8; j < n; j++) {
        s[j] = vt_expf_neg(fmaf(s[j], scale, -ms));
        sum += s[j];
    }
    for (int j = n; j < n_pad; j++) s[j] = 0.0f;
    return (float)(1.0 / sum);
}

float vt_softmax_row(float *s, int n, int n_pad, float scale) {
    return kt_cpu_has_avx2() ? vt_softmax_row_avx2(s, n, n_pad, scale) : vt_softmax_row_c(s, n, n_pad, scale);
}

/* vt_softmax_row_c's values, written split (vit_simd.h); their sum in 16
 * double lanes (lane k: the values j = k mod 16 below n & ~15, in order),
 * then the lanes in order, then the tail: two independent chains in the
 * AVX-512 twin, where one 8-lane chain was as slow as the exp itself */
float vt_softmax_split_row_c(const float *s, int n, float scale, uint16_t *dst, int k_pad) {
    const int n16 = n & ~15;
    float mx = -INFINITY;
    for (int j = 0; j < n; j++) mx = s[j] > mx ? s[j] : mx;
    const float ms = mx * scale;
    double lanes[16] = {0}, sum = 0;
    for (int j = 0; j < n16; j++) {
        const float e = vt_expf_neg(fmaf(s[j], scale, -ms));
        lanes[j % 16] += (double)e;
        vt_split_store(dst, j, e);
    }
    for (int k = 0; k < 16; k++) sum += lanes[k];
    for (int j = n16; j < n; j++) {
        const float e = vt_expf_neg(fmaf(s[j], scale, -ms));
        sum += e;
        vt_split_store(dst, j, e);
    }
    for (int j = n; j < k_pad; j++) dst[VT_SPLIT_AT(j)] = dst[VT_SPLIT_AT(j) + VT_SPLIT_LO] = 0;
    return (float)(1.0 / sum);
}

float vt_softmax_split_row(const float *s, int n, float scale, uint16_t *dst, int k_pad) {
    /* AVX-512 where the tiles are (every AMX CPU has it) */
    return kt_cpu_has_amx_bf16() ? vt_softmax_split_row_avx512(s, n, scale, dst, k_pad)
           : kt_cpu_has_avx2()   ? vt_softmax_split_row_avx2(s, n, scale, dst, k_pad)
                                 : vt_softmax_split_row_c(s, n, scale, dst, k_pad);
}

/* queries i0 .. i1 - 1 of window w, head h, against the gathered K, V */
static void attend_block(const fattn_job *a, int w, int h, int i0, int i1, const float *kx, const float *vx,
                         float *qb, float *sb, float *ob) {
    int ws = a->win_start[w], n = a->win_start[w + 1] - ws, n_pad = pad16(n), d = a->d, B = i1 - i0;
    for (int i = 0; i < B; i++)
        memcpy(qb + (size_t)i * d, a->q + (long)a->members[ws + i0 + i] * a->stride + (long)h * d,
               (size_t)d * sizeof *qb);
    kt_matmul(NULL, sb, kx, KT_F32_X16, qb, d, n_pad, B);
    const float scale = 1.0f / sqrtf((float)d);
    float inv[VT_QUERY_BLOCK];
    for (int i = 0; i < B; i++) inv[i] = vt_softmax_row(sb + (size_t)i * n_pad, n, n_pad, scale);
    kt_matmul(NULL, ob, vx, KT_F32_X16, sb, n_pad, d, B);
    for (int i = 0; i < B; i++) {
        float *o = a->out + (long)a->members[ws + i0 + i] * a->n_heads * d + (long)h * d;
        for (int c = 0; c < d; c++) o[c] = ob[(size_t)i * d + c] * inv[i];
    }
}

static void fattn_worker(void *ctx, int ith, int nth) {
    (void)nth;
    fattn_job *a = ctx;
    size_t kv = (size_t)a->max_pad * a->d;
    float *kx = a->scratch + (size_t)ith * a->scratch_floats, *vx = kx + kv;
    float *qb = vx + kv, *ob = qb + (size_t)VT_QUERY_BLOCK * a->d, *sb = ob + (size_t)VT_QUERY_BLOCK * a->d;
    int have_w = -1, have_h = -1, w = 0;
    /* tasks taken as they come (a thread that shares its core with
     * another process takes fewer); they ascend, so w only moves forward
     * and consecutive tasks mostly share (window, head) and its K and V */
    for (;;) {
        long task = atomic_fetch_add(&a->next, 1);
        if (task >= a->n_tasks) return;
        while (task >= a->task_start[w + 1]) w++;
        int n = a->win_start[w + 1] - a->win_start[w];
        long n_blocks = (n + VT_QUERY_BLOCK - 1) / VT_QUERY_BLOCK, local = task - a->task_start[w];
        int h = (int)(local / n_blocks), blk = (int)(local % n_blocks);
        if (w != have_w || h != have_h) {
            gather_kv_x16(a, w, h, pad16(n), kx, vx);
            have_w = w;
            have_h = h;
        }
        int i0 = blk * VT_QUERY_BLOCK, i1 = i0 + VT_QUERY_BLOCK < n ? i0 + VT_QUERY_BLOCK : n;
        attend_block(a, w, h, i0, i1, kx, vx, qb, sb, ob);
    }
}

kt_status vt_attention(kt_pool *pool, float *out, const float *q, const float *k, const float *v, int stride,
                       int n_heads, int d_head, const int *win_start, const int *members, int n_windows,
                       kt_error *err) {
    if (d_head % KT_X16_ROWS) /* V^T's rows are the head dims: x16 needs 16 of them */
        return vt_attention_ref(pool, out, q, k, v, stride, n_heads, d_head, win_start, members, n_windows, err);
    int max_pad = 0;
    for (int w = 0; w < n_windows; w++)
        if (pad16(win_start[w + 1] - win_start[w]) > max_pad) max_pad = pad16(win_start[w + 1] - win_start[w]);
    long *task_start = vt_attention_tasks(win_start, n_windows, n_heads, VT_QUERY_BLOCK, err);
    if (!task_start) return err->status;
    int nth = pool ? kt_pool_size(pool) : 1;
    size_t per = 2 * (size_t)max_pad * d_head + 2 * (size_t)VT_QUERY_BLOCK * d_head + (size_t)VT_QUERY_BLOCK * max_pad;
    per = (per + 15) & ~(size_t)15; /* threads' scratch on separate cache lines */
    float *scratch = malloc((size_t)nth * per * sizeof *scratch);
    if (!scratch) {
        free(task_start);
        return kt_error_set(err, KT_ERR_NOMEM, "vision attention: out of memory for %d threads x %d keys", nth,
                            max_pad);
    }
    fattn_job a = {out,        q,       k,   v,      stride, n_heads, d_head, win_start, members, task_start[n_windows],
                   task_start, scratch, per, max_pad, 0};
    kt_pool_run(pool, fattn_worker, &a);
    free(scratch);
    free(task_start);
    return KT_OK;
}
