/*
 * vit_attention_amx.c - the tower's attention on AMX tiles (ops/amx.h):
 * softmax(q K^T / sqrt(d)) V as vt_attention computes it, with both
 * products as AMX GEMMs. For one window and head, K (keys as the output
 * columns) and V^T (head dims as the output columns) are packed once;
 * a block of VT_AMX_QUERIES queries is split and multiplied by K, the
 * scores' rows go through the same softmax (vt_softmax_row, normalized
 * after P V), the probabilities are split and multiplied by V^T.
 *
 * Precision: q, k, v and the probabilities are f32, split into bf16 hi +
 * lo (16 of their 24 bits); each product carries ~2^-16 of relative
 * error (amx.h), against f32's 2^-24 in vt_attention. On the golden
 * towers the embeddings move by less than the f32 path's own distance
 * to a float64 reference (docs/PERFORMANCE.md, issue 40).
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "ops/amx.h"
#include "vision/vision_internal.h"
#include "vision/vit_simd.h"

#define VT_AMX_QUERIES 64 /* queries per block: two row pairs of the tiles (32 and 128: the same speed) */

typedef struct amx_attn_job {
    float *out;
    const float *q, *k, *v;
    int stride, n_heads, d;
    const int *win_start, *members;
    long n_tasks;
    const long *task_start; /* first task of each window, n_windows + 1 */
    char *scratch;          /* per thread: scratch_bytes */
    size_t scratch_bytes;
    int max_n;        /* the largest window's keys */
    atomic_long next; /* the next task to take */
} amx_attn_job;

/* one thread's buffers, carved from its scratch */
typedef struct amx_attn_bufs {
    float *kv;          /* [max_n][d]: K, then V, of one window and head gathered */
    uint16_t *bk, *bv;  /* K packed (max_n outputs of d), V^T packed (d outputs of max_n) */
    uint16_t *aq, *ap;  /* a block's queries split, its probabilities split */
    float *qb, *s, *ob; /* a block's queries, scores [VT_AMX_QUERIES][max_n], outputs [..][d] */
    float *panel;       /* kt_amx_matmul's */
} amx_attn_bufs;

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* the next `bytes` of a thread's scratch (64-byte aligned pieces) */
static char *take(char *base, size_t *off, size_t bytes) {
    char *p = base ? base + *off : NULL;
    *off += align64(bytes);
    return p;
}

/* carves b from base (NULL: only counts); returns the bytes */
static size_t carve(char *base, int max_n, int d, amx_attn_bufs *b) {
    size_t off = 0;
    b->kv = (float *)take(base, &off, (size_t)max_n * d * sizeof(float));
    b->bk = (uint16_t *)take(base, &off, kt_amx_packed_bytes(d, max_n));
    b->bv = (uint16_t *)take(base, &off, kt_amx_packed_bytes(max_n, d));
    b->aq = (uint16_t *)take(base, &off, kt_amx_act_bytes(d, VT_AMX_QUERIES));
    b->ap = (uint16_t *)take(base, &off, kt_amx_act_bytes(max_n, VT_AMX_QUERIES));
    b->qb = (float *)take(base, &off, (size_t)VT_AMX_QUERIES * d * sizeof(float));
    b->s = (float *)take(base, &off, (size_t)VT_AMX_QUERIES * max_n * sizeof(float));
    b->ob = (float *)take(base, &off, (size_t)VT_AMX_QUERIES * d * sizeof(float));
    b->panel = (float *)take(base, &off, KT_AMX_PANEL_FLOATS * sizeof(float));
    return off;
}

/* K and V^T of window w, head h, packed; each gathered first so that an
 * output's neighbours are the next floats (kt_amx_pack_f32's fast case):
 * K transposed ([d][n]: the keys are its outputs), V as it is ([n][d]). */
static void pack_kv(const amx_attn_job *a, int w, int h, const amx_attn_bufs *b) {
    const int ws = a->win_start[w], n = a->win_start[w + 1] - ws, d = a->d;
    for (int j0 = 0; j0 < n; j0 += 16) { /* 16 keys at a time: their rows stay in L1, each write is 16 floats in a row */
        const int j1 = j0 + 16 < n ? j0 + 16 : n;
        const float *kr[16];
        for (int j = j0; j < j1; j++) kr[j - j0] = a->k + (long)a->members[ws + j] * a->stride + (long)h * d;
        for (int c = 0; c < d; c++) {
            float *dst = b->kv + (size_t)c * n;
            for (int j = j0; j < j1; j++) dst[j] = kr[j - j0][c];
        }
    }
    kt_amx_pack_f32(b->bk, b->kv, d, n, 1, (size_t)n);
    for (int j = 0; j < n; j++)
        memcpy(b->kv + (size_t)j * d, a->v + (long)a->members[ws + j] * a->stride + (long)h * d, (size_t)d * sizeof(float));
    kt_amx_pack_f32(b->bv, b->kv, n, d, 1, (size_t)d);
}

/* queries i0 .. i1 - 1 of window w, head h */
static void attend_block(const amx_attn_job *a, int w, int h, int i0, int i1, const amx_attn_bufs *b) {
    const int ws = a->win_start[w], n = a->win_start[w + 1] - ws, d = a->d, B = i1 - i0, rows = kt_amx_rows_pad(B);
    for (int i = 0; i < B; i++)
        memcpy(b->qb + (size_t)i * d, a->q + (long)a->members[ws + i0 + i] * a->stride + (long)h * d,
               (size_t)d * sizeof(float));
    kt_amx_split_rows(b->aq, b->qb, d, B, 0, rows, false);
    kt_amx_matmul(b->s, b->bk, b->aq, d, n, B, 0, rows, b->panel);
    const float scale = 1.0f / sqrtf((float)d);
    float inv[VT_AMX_QUERIES];
    const int k_pad = kt_amx_k_pad(n), n_kb = k_pad / KT_AMX_K;
    for (int i = 0; i < rows; i++) { /* each row's probabilities straight into the split layout (amx.h) */
        uint16_t *dst = b->ap + (size_t)(i / 16) * n_kb * VT_SPLIT_BLOCK + (size_t)(i % 16) * KT_AMX_K;
        if (i < B) {
            inv[i] = vt_softmax_split_row(b->s + (size_t)i * n, n, scale, dst, k_pad);
            continue;
        }
        for (int kb = 0; kb < n_kb; kb++) { /* a padding row: zeros */
            memset(dst + (size_t)kb * VT_SPLIT_BLOCK, 0, KT_AMX_K * sizeof *dst);
            memset(dst + (size_t)kb * VT_SPLIT_BLOCK + VT_SPLIT_LO, 0, KT_AMX_K * sizeof *dst);
        }
    }
    kt_amx_matmul(b->ob, b->bv, b->ap, n, d, B, 0, rows, b->panel);
    for (int i = 0; i < B; i++) {
        float *o = a->out + (long)a->members[ws + i0 + i] * a->n_heads * d + (long)h * d;
        for (int c = 0; c < d; c++) o[c] = b->ob[(size_t)i * d + c] * inv[i];
    }
}

static void amx_attn_worker(void *ctx, int ith, int nth) {
    (void)nth;
    amx_attn_job *a = ctx;
    amx_attn_bufs b;
    carve(a->scratch + (size_t)ith * a->scratch_bytes, a->max_n, a->d, &b);
    int have_w = -1, have_h = -1, w = 0;
    for (;;) { /* tasks ascend: w only moves forward, and neighbours share K and V */
        long task = atomic_fetch_add(&a->next, 1);
        if (task >= a->n_tasks) return;
        while (task >= a->task_start[w + 1]) w++;
        int n = a->win_start[w + 1] - a->win_start[w];
        long n_blocks = (n + VT_AMX_QUERIES - 1) / VT_AMX_QUERIES, local = task - a->task_start[w];
        int h = (int)(local / n_blocks), blk = (int)(local % n_blocks);
        if (w != have_w || h != have_h) {
            pack_kv(a, w, h, &b);
            have_w = w, have_h = h;
        }
        int i0 = blk * VT_AMX_QUERIES, i1 = i0 + VT_AMX_QUERIES < n ? i0 + VT_AMX_QUERIES : n;
        attend_block(a, w, h, i0, i1, &b);
    }
}

kt_status vt_attention_amx(kt_pool *pool, float *out, const float *q, const float *k, const float *v, int stride,
                           int n_heads, int d_head, const int *win_start, const int *members, int n_windows,
                           kt_error *err) {
    long *task_start = vt_attention_tasks(win_start, n_windows, n_heads, VT_AMX_QUERIES, err);
    if (!task_start) return err->status;
    const long n_tasks = task_start[n_windows];
    int max_n = 0;
    for (int w = 0; w < n_windows; w++)
        if (win_start[w + 1] - win_start[w] > max_n) max_n = win_start[w + 1] - win_start[w];
    const int nth = pool ? kt_pool_size(pool) : 1;
    amx_attn_bufs unused;
    const size_t per = carve(NULL, max_n, d_head, &unused);
    /* the pool's scratch, kept between calls: 8 MiB a thread at 3600 keys,
     * which fresh each layer cost as much in page faults as the softmax */
    char *owned = pool ? NULL : aligned_alloc(64, per), *scratch = pool ? kt_pool_scratch(pool, (size_t)nth * per) : owned;
    if (!scratch) {
        free(task_start);
        return kt_error_set(err, KT_ERR_NOMEM, "vision attention: out of memory for %d threads x %d keys", nth, max_n);
    }
    amx_attn_job a = {out, q, k, v, stride, n_heads, d_head, win_start, members, n_tasks, task_start, scratch, per,
                      max_n, 0};
    kt_pool_run(pool, amx_attn_worker, &a);
    free(owned);
    free(task_start);
    return KT_OK;
}
