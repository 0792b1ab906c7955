/*
 * probe.h - the machine's ceilings, measured: memory bandwidth and peak
 * arithmetic throughput, so every kernel figure can be stated as a fraction
 * of what the hardware can do (`kettle bench --membw --peak`).
 *
 * Bandwidth follows STREAM's conventions: "read" streams one large array
 * (bytes read / s); "triad" computes a[i] = b[i] + s * c[i] over three
 * arrays and counts 3 x 4 bytes per element. Each is the best of several
 * repetitions, split over the pool's threads.
 *
 * Peak arithmetic runs independent register-only chains on every thread:
 * fp32 FMA (2 flops per lane) and int8 multiply-add with `maddubs`
 * (2 ops per byte product: the multiply and the add), the instruction the
 * quantized matmul kernels are built on -- or, where the CPU has the
 * AVX-512 tier the kernels use, 512-bit FMA and vpdpbusd. Without AVX2
 * the peaks are 0.
 */
#ifndef KT_OPS_PROBE_H
#define KT_OPS_PROBE_H

#include <stddef.h>

#include "kettle.h"
#include "ops/pool.h"

typedef struct kt_membw {
    double read_gbs, triad_gbs;
} kt_membw;

/* Uses arrays of `bytes` each (read: one, triad: three). */
kt_status kt_probe_membw(kt_pool *pool, size_t bytes, int reps, kt_membw *out, kt_error *err);

/* GFLOP/s of fp32 FMA and GOP/s of int8 maddubs over all pool threads. */
double kt_probe_peak_fma(kt_pool *pool);
double kt_probe_peak_int8(kt_pool *pool);
/* GFLOP/s of AMX bf16 tile products (TDPBF16PS, 2 flops per product) over
 * all pool threads; 0 where the CPU has no AMX-BF16. */
double kt_probe_peak_amx_bf16(kt_pool *pool);

#endif
