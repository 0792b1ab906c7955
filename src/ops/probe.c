/*
 * probe.c - measuring bandwidth and peak throughput; see probe.h.
 */
#include "ops/probe.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/timing.h"
#include "ops/amx.h"
#include "ops/cpu.h"
#include "ops/probe_avx2.h"

/* ---- bandwidth ---- */

typedef struct bw_job {
    float *a, *b, *c;
    size_t n; /* floats per array, a multiple of 32 * threads */
    bool triad;
    float sink[64];
} bw_job;

static float read_scalar(const float *x, size_t n) {
    float s = 0.0f;
    for (size_t i = 0; i < n; i++) s += x[i];
    return s;
}

static void bw_task(void *ctx, int ith, int nth) {
    bw_job *j = ctx;
    long lo, hi;
    kt_split_range((long)(j->n / 32), ith, nth, &lo, &hi);
    size_t i0 = (size_t)lo * 32, n = (size_t)(hi - lo) * 32;
    bool simd = kt_cpu_has_avx2();
    if (j->triad) {
        if (simd) kt_probe_triad_avx2(j->a + i0, j->b + i0, j->c + i0, 3.0f, n);
        else for (size_t i = i0; i < i0 + n; i++) j->a[i] = j->b[i] + 3.0f * j->c[i];
    } else {
        float s = simd ? kt_probe_read_avx2(j->a + i0, n) : read_scalar(j->a + i0, n);
        if (ith < 64) j->sink[ith] = s;
    }
}

static double best_gbs(kt_pool *pool, bw_job *j, int reps, double bytes) {
    double best = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = kt_time_ms();
        kt_pool_run(pool, bw_task, j);
        double s = (kt_time_ms() - t0) / 1e3;
        if (s > 0 && bytes / s / 1e9 > best) best = bytes / s / 1e9;
    }
    return best;
}

kt_status kt_probe_membw(kt_pool *pool, size_t bytes, int reps, kt_membw *out, kt_error *err) {
    bw_job j = {0};
    j.n = bytes / sizeof(float) / 1024 * 1024;
    j.a = malloc(j.n * sizeof(float));
    j.b = malloc(j.n * sizeof(float));
    j.c = malloc(j.n * sizeof(float));
    if (!j.a || !j.b || !j.c || j.n == 0) {
        free(j.a), free(j.b), free(j.c);
        return kt_error_set(err, KT_ERR_NOMEM, "cannot allocate 3 x %zu bytes for the bandwidth probe", bytes);
    }
    /* touch every page first, so the timing sees memory, not page faults */
    for (size_t i = 0; i < j.n; i++) j.a[i] = 1.0f, j.b[i] = 2.0f, j.c[i] = 0.5f;
    double array_bytes = (double)j.n * sizeof(float);
    j.triad = false;
    out->read_gbs = best_gbs(pool, &j, reps, array_bytes);
    j.triad = true;
    out->triad_gbs = best_gbs(pool, &j, reps, 3 * array_bytes);
    free(j.a), free(j.b), free(j.c);
    return KT_OK;
}

/* ---- peak arithmetic ---- */

typedef enum peak_kind { PEAK_FMA, PEAK_INT8, PEAK_AMX } peak_kind;

typedef struct peak_job {
    long iters;
    peak_kind kind;
    bool wide; /* wide: the 512-bit loops (AVX-512 tier) */
    volatile int sink;
} peak_job;

static void peak_task(void *ctx, int ith, int nth) {
    (void)ith, (void)nth;
    peak_job *j = ctx;
    if (j->kind == PEAK_AMX) j->sink += (int)kt_amx_probe_dp(j->iters);
    else if (j->kind == PEAK_INT8) j->sink += j->wide ? kt_probe_dpbusd_512(j->iters) : kt_probe_maddubs_avx2(j->iters);
    else j->sink += (int)(j->wide ? kt_probe_fma_512(j->iters) : kt_probe_fma_avx2(j->iters));
}

/* ops per iteration per thread: 12 chains x 8 (16) lanes x 2 (fp32 FMA),
 * or 12 chains x 32 (64) byte products x 2 (maddubs; vpdpbusd), or 4 tile
 * products of 16 x 16 outputs 32 deep x 2 (AMX). The widest tier the
 * kernels use on this CPU is the ceiling they are held to. */
static double peak(kt_pool *pool, peak_kind kind) {
    peak_job j = {.iters = 2000, .kind = kind, .wide = kt_cpu_has_avx512_vnni()};
    kt_pool_run(pool, peak_task, &j); /* warm-up (clocks, caches) */
    const double per_iter = kind == PEAK_AMX ? 4.0 * 16 * 16 * 32 * 2
                                             : KT_PROBE_CHAINS * (kind == PEAK_INT8 ? 32 : 8) * (j.wide ? 2 : 1) * 2.0;
    double best = 0;
    for (int r = 0; r < 5; r++) {
        j.iters = kind == PEAK_AMX ? 200000 : 2000000;
        double t0 = kt_time_ms();
        kt_pool_run(pool, peak_task, &j);
        double s = (kt_time_ms() - t0) / 1e3;
        double gops = per_iter * (double)j.iters * kt_pool_size(pool) / s / 1e9;
        if (gops > best) best = gops;
    }
    return best;
}

double kt_probe_peak_amx_bf16(kt_pool *pool) {
    return kt_cpu_has_amx_bf16() ? peak(pool, PEAK_AMX) : 0;
}

double kt_probe_peak_fma(kt_pool *pool) {
    return kt_cpu_has_avx2() ? peak(pool, PEAK_FMA) : 0;
}

double kt_probe_peak_int8(kt_pool *pool) {
    return kt_cpu_has_avx2() ? peak(pool, PEAK_INT8) : 0;
}
