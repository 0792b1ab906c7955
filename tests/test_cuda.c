/*
 * test_cuda.c - every CUDA kernel against its CPU twin, on random data of
 * real models' shapes, and the decode matmul's speed.
 *
 * With no usable GPU (this machine, CI) it prints the probe's reason and
 * exits 77, which ctest reports as skipped, never as passed;
 * KT_CUDA_REQUIRE=1 (scripts/gpu_check.sh) makes that a failure. With a
 * GPU each check prints its largest error beside its tolerance, whose
 * reason is written next to it below; any check over it fails the test.
 * KT_CUDA_NO_TIMING=1 leaves out the speed table (the compute-sanitizer
 * run). Plain C with no test framework: scripts/gpu_check.sh builds it on a bare
 * GPU machine without cmocka (cmake/device_check.cmake).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fp16.h"
#include "base/rng.h"
#include "base/timing.h"
#include "cuda/kt_cuda.h"
#include "kv/block_pool.h"
#include "ops/ops.h"
#include "ops/quant.h"

static int n_fail, n_checks;

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "test_cuda: out of host memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

static void die_on(kt_status st, const kt_error *err, const char *what) {
    if (st == KT_OK) return;
    fprintf(stderr, "test_cuda: %s: %s\n", what, err->msg);
    exit(1);
}

static void fill_normal(float *x, size_t n, float std, uint64_t seed) {
    kt_rng r;
    kt_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) x[i] = std * kt_rng_normal(&r);
}

/* one line per check: its worst error beside its tolerance */
static void report(const char *what, double worst, double tol_at_worst, int n_bad) {
    n_checks++;
    if (n_bad) n_fail++;
    printf("%-4s %-56s max|err| %.3g (tol there %.3g)\n", n_bad ? "FAIL" : "ok", what, worst, tol_at_worst);
    if (n_bad) printf("     %d values over tolerance\n", n_bad);
}

/* compares got with want: |got - want| <= tol[i] (tol NULL: atol + rtol |want|) */
static void compare(const char *what, const float *got, const float *want, size_t n, const double *tol, double atol,
                    double rtol) {
    double worst = -1, worst_tol = 0;
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        const double e = fabs((double)got[i] - (double)want[i]);
        const double t = tol ? tol[i] : atol + rtol * fabs((double)want[i]);
        if (!(e <= t)) bad++; /* NaN is bad too */
        if (e > worst || isnan(e)) {
            worst = isnan(e) ? INFINITY : e;
            worst_tol = t;
        }
    }
    report(what, worst, worst_tol, bad);
}

static void *dev_upload(kt_cuda_buf *b, const void *host, size_t bytes, const char *what) {
    kt_error err;
    die_on(kt_cuda_alloc(b, bytes, what, &err), &err, what);
    die_on(kt_cuda_to_device(b, 0, host, bytes, &err), &err, what);
    return b->ptr;
}

static void dev_download(void *host, const kt_cuda_buf *b, size_t bytes) {
    kt_error err;
    die_on(kt_cuda_sync(&err), &err, "a kernel");
    die_on(kt_cuda_to_host(host, b, 0, bytes, &err), &err, "download");
}

/* ---- matmul --------------------------------------------------------- */

/* n_out rows of n_in random N(0,1) values as wtype (the reference quantizer) */
static void *random_weights(kt_dtype wtype, int n_in, int n_out, uint64_t seed) {
    const size_t row = kt_dtype_row_bytes(wtype, n_in);
    unsigned char *w = xmalloc(row * (size_t)n_out);
    float *f = xmalloc((size_t)n_in * sizeof *f);
    for (int r = 0; r < n_out; r++) {
        fill_normal(f, (size_t)n_in, 1.0f, seed + (uint64_t)r);
        kt_quantize_row(wtype, f, w + (size_t)r * row, n_in);
    }
    free(f);
    return w;
}

static void check_matmul(kt_dtype wtype, int n_in, int n_out, int n_tokens) {
    kt_error err;
    void *w = random_weights(wtype, n_in, n_out, 1000 + (uint64_t)n_in);
    float *x = xmalloc((size_t)n_in * n_tokens * sizeof *x);
    fill_normal(x, (size_t)n_in * n_tokens, 1.0f, 7);
    float *want = xmalloc((size_t)n_out * n_tokens * sizeof *want), *got = xmalloc((size_t)n_out * n_tokens * sizeof *got);
    double *tol = xmalloc((size_t)n_out * n_tokens * sizeof *tol);
    kt_cuda_matmul_twin(want, w, wtype, x, n_in, n_out, n_tokens);
    /* Tolerance: 1.5 * depth * 2^-24 * sum_i |w_i x_i| per output, the
     * worst-case bound of a float sum in which each product passes at most
     * `depth` roundings. The twin is exact but for its last rounding (1).
     * The kernel, Q4_0 / Q8_0: 32 products per block and d * sum (33), one
     * block sum per lane per 32 blocks (n_in / 1024), a 5-level warp tree;
     * the K-quants: 32 products of dequantized values per sub-block (the
     * CPU's values, rounded as it rounds them), one sub-block sum per lane
     * per 32 sub-blocks, the tree; F16 / BF16: each lane adds n_in / 32
     * products in turn, then the tree. So
     * 3.8e-6 of the sum of magnitudes for Q4_0 at n_in 4096, 1.2e-5 for
     * F16 (typical errors grow as sqrt(depth), not depth). One wrong weight
     * of a row is off by ~|w x| ~ 1 against a sum of magnitudes ~ 0.8 n_in
     * (~3e-4 of it at n_in 4096), far over either. */
    const int depth = (wtype == KT_F16 || wtype == KT_BF16 ? (n_in + 31) / 32 : 33 + (n_in + 1023) / 1024) + 5 + 1;
    const double rel = 1.5 * depth * 5.9604644775390625e-8;
    float *row = xmalloc((size_t)n_in * sizeof *row);
    const size_t rb = kt_dtype_row_bytes(wtype, n_in);
    for (int r = 0; r < n_out; r++) {
        kt_dequantize_row(wtype, (const unsigned char *)w + (size_t)r * rb, row, n_in);
        for (int t = 0; t < n_tokens; t++) {
            double s = 0;
            for (int i = 0; i < n_in; i++) s += fabs((double)row[i] * x[(size_t)t * n_in + i]);
            tol[(size_t)t * n_out + r] = rel * s + 1e-30;
        }
    }
    kt_cuda_buf dw, dx, dout;
    kt_error e2;
    die_on(kt_cuda_upload_weight(&dw, w, wtype, n_in, n_out, "test weight", &e2), &e2, "upload_weight");
    dev_upload(&dx, x, (size_t)n_in * n_tokens * sizeof *x, "x");
    die_on(kt_cuda_alloc(&dout, (size_t)n_out * n_tokens * sizeof(float), "out", &err), &err, "alloc out");
    die_on(kt_cuda_matmul(dout.ptr, dw.ptr, wtype, dx.ptr, n_in, n_out, n_tokens, &err), &err, "matmul");
    dev_download(got, &dout, (size_t)n_out * n_tokens * sizeof *got);
    char what[96];
    snprintf(what, sizeof what, "matmul %s %d in x %d out, %d token%s", kt_dtype_name(wtype), n_in, n_out, n_tokens,
             n_tokens > 1 ? "s" : "");
    compare(what, got, want, (size_t)n_out * n_tokens, tol, 0, 0);
    kt_cuda_free(&dw);
    kt_cuda_free(&dx);
    kt_cuda_free(&dout);
    free(w), free(x), free(want), free(got), free(tol), free(row);
}

/* ---- element-wise ops ----------------------------------------------- */

static void check_rmsnorm(int n, int n_rows) {
    kt_error err;
    float *x = xmalloc((size_t)n * n_rows * sizeof *x), *w = xmalloc((size_t)n * sizeof *w);
    float *want = xmalloc((size_t)n * n_rows * sizeof *want), *got = xmalloc((size_t)n * n_rows * sizeof *got);
    fill_normal(x, (size_t)n * n_rows, 3.0f, 11);
    fill_normal(w, (size_t)n, 1.0f, 12);
    for (int r = 0; r < n_rows; r++) kt_rmsnorm_ref(want + (size_t)r * n, x + (size_t)r * n, w, n, 1e-5f);
    kt_cuda_buf dx, dw;
    dev_upload(&dx, x, (size_t)n * n_rows * sizeof *x, "x");
    dev_upload(&dw, w, (size_t)n * sizeof *w, "w");
    die_on(kt_cuda_rmsnorm(dx.ptr, dx.ptr, dw.ptr, n, n_rows, 1e-5f, &err), &err, "rmsnorm"); /* in place */
    dev_download(got, &dx, (size_t)n * n_rows * sizeof *got);
    char what[96];
    snprintf(what, sizeof what, "rmsnorm %d x %d (in place)", n_rows, n);
    /* The reference sums squares in double, the kernel in float (16 per
     * thread, then two 8- and 32-wide trees): ~30 roundings, 2e-6 of the
     * scale; out = x * scale * w then differs by that relatively. 2e-5
     * relative (plus 1e-6 for outputs near 0) leaves a factor 10. */
    compare(what, got, want, (size_t)n * n_rows, NULL, 1e-6, 2e-5);
    kt_cuda_free(&dx);
    kt_cuda_free(&dw);
    free(x), free(w), free(want), free(got);
}

static void check_rope(int n_heads, int head_dim, int rope_dim, float base, kt_rope_style style) {
    kt_error err;
    const int32_t pos[5] = {0, 1, 17, 4096, 131071};
    const int nt = 5;
    const size_t stride = (size_t)n_heads * head_dim + 8; /* rows with a gap: the stride is honoured */
    float *x = xmalloc(stride * nt * sizeof *x), *want = xmalloc(stride * nt * sizeof *want);
    float *got = xmalloc(stride * nt * sizeof *got);
    fill_normal(x, stride * nt, 1.0f, 21);
    memcpy(want, x, stride * nt * sizeof *x);
    for (int t = 0; t < nt; t++) kt_rope(want + stride * t, n_heads, head_dim, rope_dim, pos[t], base, style);
    kt_cuda_buf dx, dp;
    dev_upload(&dx, x, stride * nt * sizeof *x, "x");
    dev_upload(&dp, pos, sizeof pos, "pos");
    die_on(kt_cuda_rope(dx.ptr, nt, stride, n_heads, head_dim, rope_dim, dp.ptr, base, style, &err), &err, "rope");
    dev_download(got, &dx, stride * nt * sizeof *got);
    char what[96];
    snprintf(what, sizeof what, "rope %s %d heads of %d, rope_dim %d, base %g", style == KT_ROPE_NEOX ? "neox" : "normal",
             n_heads, head_dim, rope_dim, base);
    /* The angles are the reference's bits (same powf on the host, same
     * float product chain); CUDA's sincosf and glibc's sinf / cosf are
     * each within 2 ulp, and the kernel may fuse a multiply-add: each out
     * = x0 c - x1 s is off by a few ulp of |x0| + |x1| (<~ 8 for N(0,1)):
     * 1e-5 absolute covers 8 * 4 * 6e-8 * 8 with room; a wrong pair or
     * angle is off by O(1). The gap between rows must stay untouched:
     * compared too (want holds x there). */
    compare(what, got, want, stride * nt, NULL, 1e-5, 0);
    kt_cuda_free(&dx);
    kt_cuda_free(&dp);
    free(x), free(want), free(got);
}

static void check_swiglu(int n) {
    kt_error err;
    float *g = xmalloc((size_t)n * sizeof *g), *u = xmalloc((size_t)n * sizeof *u);
    float *want = xmalloc((size_t)n * sizeof *want), *got = xmalloc((size_t)n * sizeof *got);
    fill_normal(g, (size_t)n, 4.0f, 31);
    fill_normal(u, (size_t)n, 1.0f, 32);
    kt_swiglu_ref(want, g, u, n);
    kt_cuda_buf dg, du;
    dev_upload(&dg, g, (size_t)n * sizeof *g, "gate");
    dev_upload(&du, u, (size_t)n * sizeof *u, "up");
    die_on(kt_cuda_swiglu(dg.ptr, dg.ptr, du.ptr, n, &err), &err, "swiglu");
    dev_download(got, &dg, (size_t)n * sizeof *got);
    char what[64];
    snprintf(what, sizeof what, "swiglu %d (out aliasing gate)", n);
    /* expf within 2 ulp on both sides, the division and product exact
     * roundings (no fast math): a few ulp, 2e-6 relative covers them. */
    compare(what, got, want, (size_t)n, NULL, 1e-30, 2e-6);
    kt_cuda_free(&dg);
    kt_cuda_free(&du);
    free(g), free(u), free(want), free(got);
}

/* ---- decode attention over the paged KV ----------------------------- */

static void check_attention(int n_head, int n_head_kv, int head_dim) {
    kt_error err;
    const int lens[] = {1, 15, 16, 17, 4095, 4097};
    const int n_base = (int)(sizeof lens / sizeof lens[0]);
    kv_pool_params pp = {.n_blocks = 600, .block_tokens = 16, .n_layer = 1, .kv_dim = n_head_kv * head_dim,
                         .type = KV_F16};
    kv_pool *pool = kv_pool_new(&pp, &err);
    die_on(pool ? KT_OK : KT_ERR_NOMEM, &err, "kv_pool_new");
    kv_seq *seqs[8];
    for (int s = 0; s < n_base; s++) {
        seqs[s] = kv_seq_new(pool, &err);
        die_on(seqs[s] ? KT_OK : KT_ERR_NOMEM, &err, "kv_seq_new");
        die_on(kv_seq_append(seqs[s], lens[s], &err), &err, "kv_seq_append");
    }
    /* a fork of the 4097-position sequence grown by 20: it shares 256
     * prefix blocks in place and has its own copy of the partial one */
    seqs[n_base] = kv_seq_fork(seqs[n_base - 1], &err);
    die_on(seqs[n_base] ? KT_OK : KT_ERR_NOMEM, &err, "kv_seq_fork");
    die_on(kv_seq_append(seqs[n_base], 20, &err), &err, "kv_seq_append fork");
    const int n_seqs = n_base + 1, nt = n_seqs;
    /* every block of both planes random (after the appends, so copies too) */
    const size_t plane_bytes = (size_t)pp.n_blocks * kv_pool_block_bytes(pool);
    kt_rng r;
    kt_rng_seed(&r, 41);
    for (int kind = 0; kind < 2; kind++) {
        uint16_t *h = kv_pool_plane(pool, 0, (kv_kind)kind);
        for (size_t i = 0; i < plane_bytes / 2; i++) h[i] = kt_fp32_to_fp16(kt_rng_normal(&r));
    }
    int tok_seq[8], n_pos[8];
    const int32_t *tables[8];
    for (int t = 0; t < nt; t++) {
        tok_seq[t] = t;
        n_pos[t] = seqs[t]->len;
        tables[t] = seqs[t]->blocks;
    }
    const size_t qn = (size_t)n_head * head_dim;
    float *q = xmalloc(qn * nt * sizeof *q), *want = xmalloc(qn * nt * sizeof *want), *got = xmalloc(qn * nt * sizeof *got);
    fill_normal(q, qn * nt, 1.0f, 42);
    kt_attn_args ra = {.out = want, .q = q, .k = kv_pool_plane(pool, 0, KV_K), .v = kv_pool_plane(pool, 0, KV_V),
                       .n_tokens = nt, .n_head = n_head, .n_head_kv = n_head_kv, .head_dim = head_dim,
                       .q_stride = qn, .out_stride = qn, .kv_type = KT_F16, .blocks = tables,
                       .block_tokens = pp.block_tokens, .row_bytes = kv_pool_row_bytes(pool),
                       .block_bytes = kv_pool_block_bytes(pool), .n_pos = n_pos};
    kt_attention_ref(&ra);
    kt_cuda_attn_meta meta = {0};
    die_on(kt_cuda_attn_meta_build(&meta, (const kv_seq *const *)seqs, n_seqs, tok_seq, n_pos, nt, &err), &err,
           "attn_meta_build");
    kt_cuda_buf dk, dv, dm, dq, dout;
    dev_upload(&dk, kv_pool_plane(pool, 0, KV_K), plane_bytes, "K plane");
    dev_upload(&dv, kv_pool_plane(pool, 0, KV_V), plane_bytes, "V plane");
    dev_upload(&dm, meta.buf, kt_cuda_attn_meta_len(&meta) * sizeof(int32_t), "attention metadata");
    dev_upload(&dq, q, qn * nt * sizeof *q, "q");
    die_on(kt_cuda_alloc(&dout, qn * nt * sizeof(float), "attention out", &err), &err, "alloc");
    kt_cuda_attn_args a = {.out = dout.ptr, .q = dq.ptr, .k_plane = dk.ptr, .v_plane = dv.ptr, .meta_dev = dm.ptr,
                           .n_tokens = nt, .n_entries = meta.n_entries, .n_head = n_head, .n_head_kv = n_head_kv,
                           .head_dim = head_dim, .block_tokens = meta.block_tokens, .q_stride = qn, .out_stride = qn,
                           .row_bytes = meta.row_bytes, .block_bytes = meta.block_bytes};
    die_on(kt_cuda_attn_decode(&a, &err), &err, "attn_decode");
    dev_download(got, &dout, qn * nt * sizeof *got);
    char what[96];
    snprintf(what, sizeof what, "attention %d q heads / %d kv, head_dim %d, 7 seqs 1..4117", n_head, n_head_kv,
             head_dim);
    /* Same fp16 K / V bits on both sides; the scores differ only in the
     * dot's summation order (a few ulp of |q||k| ~ 1e-6 after the 1/sqrt(D)
     * scale), the weights by expf's 2 ulp, their sums (online, 4 warps
     * merged, vs the reference's double) by ~1e-6 relative: each output,
     * a weighted mean of N(0,1) values, moves by ~1e-5 at the most.
     * 5e-5 + 5e-5 |want|; a wrong block or row gives O(0.1). */
    compare(what, got, want, qn * nt, NULL, 5e-5, 5e-5);
    kt_cuda_free(&dk), kt_cuda_free(&dv), kt_cuda_free(&dm), kt_cuda_free(&dq), kt_cuda_free(&dout);
    kt_cuda_attn_meta_free(&meta);
    for (int s = 0; s < n_seqs; s++) kv_seq_free(seqs[s]);
    kv_pool_free(pool);
    free(q), free(want), free(got);
}

/* ---- speed ---------------------------------------------------------- */

/* GB/s of the weights' bytes read by kt_cuda_matmul on n_in x n_out, over
 * copies that together pass 256 MB, so the 50 MB L2 does not hold them. */
static void time_matmul(kt_dtype wtype, int n_in, int n_out, double peak_gbs) {
    kt_error err;
    void *w = random_weights(wtype, n_in, n_out, 5);
    const int n_tokens = KT_CUDA_MAX_TOKENS;
    const size_t bytes = kt_dtype_row_bytes(wtype, n_in) * (size_t)n_out;
    int copies = (int)((256u << 20) / bytes) + 1;
    if (copies > 16) copies = 16;
    kt_cuda_buf dw[16], dx, dout;
    for (int c = 0; c < copies; c++)
        die_on(kt_cuda_upload_weight(&dw[c], w, wtype, n_in, n_out, "timed weight", &err), &err, "upload");
    float *x = xmalloc((size_t)n_in * n_tokens * sizeof *x);
    fill_normal(x, (size_t)n_in * n_tokens, 1.0f, 3);
    dev_upload(&dx, x, (size_t)n_in * n_tokens * sizeof *x, "x");
    die_on(kt_cuda_alloc(&dout, (size_t)n_out * n_tokens * sizeof(float), "out", &err), &err, "alloc");
    for (int nt = 1; nt <= n_tokens; nt += n_tokens - 1) {
        for (int i = 0; i < 3; i++)
            die_on(kt_cuda_matmul(dout.ptr, dw[i % copies].ptr, wtype, dx.ptr, n_in, n_out, nt, &err), &err, "mm");
        die_on(kt_cuda_sync(&err), &err, "warm-up");
        const int reps = 50;
        const double t0 = kt_time_ms();
        for (int i = 0; i < reps; i++)
            die_on(kt_cuda_matmul(dout.ptr, dw[i % copies].ptr, wtype, dx.ptr, n_in, n_out, nt, &err), &err, "mm");
        die_on(kt_cuda_sync(&err), &err, "timed runs");
        const double ms = (kt_time_ms() - t0) / reps;
        const double gbs = (double)bytes / (ms * 1e-3) / 1e9;
        printf("| %-5s | %5d x %-5d | %d | %8.1f | %7.1f | %5.1f%% |\n", kt_dtype_name(wtype), n_in, n_out, nt,
               ms * 1e3, gbs, 100.0 * gbs / peak_gbs);
    }
    for (int c = 0; c < copies; c++) kt_cuda_free(&dw[c]);
    kt_cuda_free(&dx), kt_cuda_free(&dout);
    free(w), free(x);
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    kt_cuda_info info;
    kt_error err;
    if (kt_cuda_probe(&info, &err) != KT_OK) {
        const char *req = getenv("KT_CUDA_REQUIRE");
        const bool required = req && *req && strcmp(req, "0") != 0;
        printf("test_cuda: %s: no usable GPU: %s\n", required ? "FAILED (KT_CUDA_REQUIRE is set)" : "SKIPPED",
               err.msg);
        return required ? 1 : 77;
    }
    const kt_cuda_device *d = &info.dev[0];
    printf("test_cuda: GPU 0: %s, compute capability %d.%d, %d SMs, %.1f GiB (%.1f free); CUDA runtime %d, driver "
           "%d; built for %s\n",
           d->name, d->cc_major, d->cc_minor, d->n_sm, (double)d->mem_total_bytes / (1 << 30),
           (double)d->mem_free_bytes / (1 << 30), info.runtime_version, info.driver_version, info.archs);

    const kt_dtype types[4] = {KT_Q4_0, KT_Q8_0, KT_F16, KT_BF16};
    for (int i = 0; i < 4; i++) {
        /* Llama-3-8B's FFN up (16-byte path), its down (many chunks), and
         * rows that are not a multiple of 16 bytes (the narrow loads) */
        check_matmul(types[i], 4096, 14336, 1);
        check_matmul(types[i], 4096, 14336, KT_CUDA_MAX_TOKENS);
        for (int nt = 2; nt < KT_CUDA_MAX_TOKENS; nt++) check_matmul(types[i], 4096, 512, nt);
        check_matmul(types[i], 14336, 4096, 1);
        check_matmul(types[i], 96, 37, 3);
        check_matmul(types[i], 896, 131, 8); /* Qwen2.5-0.5B's width: 28 blocks */
    }
    check_matmul(KT_F16, 100, 9, 2); /* F16 rows of 200 bytes */
    check_matmul(KT_BF16, 100, 9, 2);
    const kt_dtype kquants[3] = {KT_Q4_K, KT_Q5_K, KT_Q6_K};
    for (int i = 0; i < 3; i++) {
        /* whole chunks of 8 super-blocks (16-byte copies), a partial last
         * chunk, and Q6_K rows of 9 super-blocks (1890 bytes: byte copies) */
        check_matmul(kquants[i], 4096, 14336, 1);
        check_matmul(kquants[i], 4096, 14336, KT_CUDA_MAX_TOKENS);
        for (int nt = 2; nt < KT_CUDA_MAX_TOKENS; nt++) check_matmul(kquants[i], 4096, 512, nt);
        check_matmul(kquants[i], 14336, 4096, 1);
        check_matmul(kquants[i], 2304, 131, 3);
        check_matmul(kquants[i], 256, 37, 8);
    }
    check_rmsnorm(4096, 3);
    check_rmsnorm(896, 1);
    check_rope(32, 128, 128, 500000.0f, KT_ROPE_ADJACENT);
    check_rope(32, 128, 128, 1000000.0f, KT_ROPE_NEOX);
    check_rope(8, 128, 64, 10000.0f, KT_ROPE_NEOX); /* partial rotary */
    check_swiglu(14336 * 3 + 5);
    check_attention(32, 8, 128);  /* Llama-3-8B */
    check_attention(32, 4, 128);  /* Qwen3-30B-A3B: 8 query heads per KV head */
    check_attention(14, 2, 64);   /* Qwen2.5-0.5B: 7 per KV head */
    check_attention(8, 4, 256);   /* head_dim 256 (Gemma-like) */

    if (getenv("KT_CUDA_NO_TIMING")) { /* compute-sanitizer's run: checks only */
        printf("\ntest_cuda: %d of %d checks failed (timing skipped: KT_CUDA_NO_TIMING)\n", n_fail, n_checks);
        return n_fail ? 1 : 0;
    }
    /* the H100 SXM's HBM3: 3.35 TB/s (the spec; a device-to-device copy
     * measured about 3.0 TB/s on these machines, device/KINDS.md) */
    const double peak = 3350.0;
    printf("\nmatmul speed (weights read once per call, over copies larger than L2; %% of 3350 GB/s):\n");
    printf("| type  | n_in x n_out  | t | us/call  | GB/s    | of peak |\n");
    printf("|-------|---------------|---|----------|---------|---------|\n");
    for (int i = 0; i < 4; i++) time_matmul(types[i], 4096, 14336, peak);
    for (int i = 0; i < 3; i++) time_matmul(kquants[i], 4096, 14336, peak);
    printf("\ntest_cuda: %d of %d checks failed\n", n_fail, n_checks);
    return n_fail ? 1 : 0;
}
