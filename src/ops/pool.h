/*
 * pool.h - a small pool of worker threads for splitting kernels.
 *
 * kt_pool_run(pool, fn, ctx) calls fn(ctx, ith, nth) once on every thread
 * (the caller is thread 0) and returns when all have finished. Workers
 * spin briefly, then sleep, between jobs, so back-to-back kernels in a
 * forward pass do not pay a futex wake-up each.
 */
#ifndef KT_OPS_POOL_H
#define KT_OPS_POOL_H

#include <stddef.h>

#include "kettle.h"

typedef struct kt_pool kt_pool;
typedef void (*kt_pool_fn)(void *ctx, int ith, int nth);

/* n_threads <= 0: the number of online CPUs. */
kt_pool *kt_pool_new(int n_threads, kt_error *err);
void kt_pool_free(kt_pool *pool);
int kt_pool_size(const kt_pool *pool);
/* pool may be NULL: then fn(ctx, 0, 1) runs on the caller. */
void kt_pool_run(kt_pool *pool, kt_pool_fn fn, void *ctx);

/* A scratch buffer owned by the pool, at least `bytes` long, 64-byte
 * aligned, valid until the next call (only the caller thread, i.e. outside
 * kt_pool_run, may call it). NULL if allocation fails. */
void *kt_pool_scratch(kt_pool *pool, size_t bytes);

/* Splits [0, n) into nth nearly equal ranges; thread ith gets [*lo, *hi). */
static inline void kt_split_range(long n, int ith, int nth, long *lo, long *hi) {
    long per = n / nth, extra = n % nth;
    *lo = ith * per + (ith < extra ? ith : extra);
    *hi = *lo + per + (ith < extra ? 1 : 0);
}

#endif
