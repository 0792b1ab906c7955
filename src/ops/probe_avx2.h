/*
 * probe_avx2.h - the AVX2 loops behind probe.c (see probe.h). Called only
 * after kt_cpu_has_avx2().
 */
#ifndef KT_OPS_PROBE_AVX2_H
#define KT_OPS_PROBE_AVX2_H

#include <stddef.h>
#include <stdint.h>

/* Sum of n floats (n a multiple of 32), 4 accumulators. */
float kt_probe_read_avx2(const float *x, size_t n);
/* a[i] = b[i] + s * c[i] for n floats (n a multiple of 8). */
void kt_probe_triad_avx2(float *a, const float *b, const float *c, float s, size_t n);
/* Runs `iters` iterations of 12 independent FMA (resp. maddubs) chains;
 * returns a value derived from the results so the work is not removed. */
float kt_probe_fma_avx2(long iters);
int kt_probe_maddubs_avx2(long iters);
/* The same with 512-bit FMA and vpdpbusd (AVX-512 F + VNNI; only call
 * where kt_cpu_has_avx512_vnni()): the kernels' widest tier. */
float kt_probe_fma_512(long iters);
int kt_probe_dpbusd_512(long iters);

#define KT_PROBE_CHAINS 12

#endif
