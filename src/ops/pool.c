/*
 * pool.c - the worker thread pool; see pool.h.
 *
 * A job is published by bumping an atomic generation counter. Workers wait
 * for the counter to move: first by spinning on it for a short while
 * (KT_POOL_SPIN_NS, tens of microseconds: a forward pass issues hundreds of
 * small kernels per token back to back, and a spinning worker picks the next
 * one up in well under a microsecond), then by sleeping on a condition
 * variable so an idle pool costs no CPU. The caller runs share 0 itself and
 * then spins until the count of busy workers drops to zero.
 *
 * Sleeping without lost wake-ups: a worker announces itself in `n_sleeping`
 * (under the mutex) and re-checks the generation before waiting; the caller
 * bumps the generation and then reads `n_sleeping`. Both are sequentially
 * consistent atomics, so at least one side sees the other: either the
 * worker sees the new generation and does not wait, or the caller sees a
 * sleeper and broadcasts under the mutex (which it can only take once the
 * worker is inside pthread_cond_wait).
 *
 * One thread owns a pool: kt_pool_run and kt_pool_scratch are not to be
 * called concurrently, nor from inside a job.
 */
#include "ops/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/error.h"

#define KT_POOL_SPIN_NS 50000L /* how long an idle worker spins */
#define KT_POOL_MAX_THREADS 256
#define KT_POOL_ALIGN 64

struct kt_pool;

typedef struct kt_worker {
    struct kt_pool *pool;
    int ith;
    pthread_t thread;
} kt_worker;

struct kt_pool {
    int n_threads;            /* including the caller (thread 0) */
    kt_worker *workers;       /* n_threads - 1 of them */
    int n_started;

    /* the current job, written by the caller before the generation bump */
    kt_pool_fn fn;
    void *ctx;

    _Atomic unsigned generation; /* bumped once per job */
    _Atomic int n_busy;          /* workers still running the job */
    _Atomic int n_sleeping;      /* workers inside (or entering) cond_wait */
    _Atomic bool stop;

    pthread_mutex_t mutex;
    pthread_cond_t wake;

    void *scratch;
    size_t scratch_bytes;
};

/* A hint to the core that we are busy-waiting (lets the sibling hyper-
 * thread run and saves power); a no-op elsewhere. */
static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* Spins until the generation differs from `seen` or the time is up.
 * Returns the generation last read. */
static unsigned spin_for_job(kt_pool *p, unsigned seen) {
    long deadline = 0;
    for (int i = 0;; i++) {
        unsigned g = atomic_load_explicit(&p->generation, memory_order_acquire);
        if (g != seen || atomic_load_explicit(&p->stop, memory_order_relaxed))
            return g;
        if ((i & 255) == 0) { /* read the clock rarely: it costs ~20 ns */
            long t = now_ns();
            if (deadline == 0) deadline = t + KT_POOL_SPIN_NS;
            else if (t > deadline) return g;
        }
        cpu_relax();
    }
}

/* Sleeps until the generation differs from `seen` or the pool stops. */
static unsigned sleep_for_job(kt_pool *p, unsigned seen) {
    pthread_mutex_lock(&p->mutex);
    atomic_fetch_add(&p->n_sleeping, 1);
    unsigned g;
    while ((g = atomic_load(&p->generation)) == seen && !atomic_load(&p->stop))
        pthread_cond_wait(&p->wake, &p->mutex);
    atomic_fetch_sub(&p->n_sleeping, 1);
    pthread_mutex_unlock(&p->mutex);
    return g;
}

static void *worker_main(void *arg) {
    kt_worker *w = arg;
    kt_pool *p = w->pool;
    unsigned seen = 0; /* the generation starts at 0: no job yet */
    for (;;) {
        unsigned g = spin_for_job(p, seen);
        if (g == seen && !atomic_load(&p->stop)) g = sleep_for_job(p, seen);
        if (atomic_load(&p->stop)) break;
        seen = g;
        p->fn(p->ctx, w->ith, p->n_threads);
        atomic_fetch_sub_explicit(&p->n_busy, 1, memory_order_release);
    }
    return NULL;
}

static int online_cpus(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}

kt_pool *kt_pool_new(int n_threads, kt_error *err) {
    if (n_threads <= 0) n_threads = online_cpus();
    if (n_threads > KT_POOL_MAX_THREADS) n_threads = KT_POOL_MAX_THREADS;

    kt_pool *p = calloc(1, sizeof *p);
    if (!p) {
        kt_error_set(err, KT_ERR_NOMEM, "thread pool: out of memory");
        return NULL;
    }
    p->n_threads = n_threads;
    atomic_init(&p->generation, 0);
    atomic_init(&p->n_busy, 0);
    atomic_init(&p->n_sleeping, 0);
    atomic_init(&p->stop, false);
    if (pthread_mutex_init(&p->mutex, NULL) != 0) {
        free(p);
        kt_error_set(err, KT_ERR_INTERNAL, "thread pool: pthread_mutex_init failed");
        return NULL;
    }
    if (pthread_cond_init(&p->wake, NULL) != 0) {
        pthread_mutex_destroy(&p->mutex);
        free(p);
        kt_error_set(err, KT_ERR_INTERNAL, "thread pool: pthread_cond_init failed");
        return NULL;
    }
    if (n_threads > 1) {
        p->workers = calloc((size_t)n_threads - 1, sizeof *p->workers);
        if (!p->workers) {
            kt_pool_free(p);
            kt_error_set(err, KT_ERR_NOMEM, "thread pool: out of memory");
            return NULL;
        }
    }
    for (int i = 1; i < n_threads; i++) {
        kt_worker *w = &p->workers[i - 1];
        w->pool = p;
        w->ith = i;
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            kt_pool_free(p);
            kt_error_set(err, KT_ERR_INTERNAL,
                         "thread pool: could not start thread %d of %d", i, n_threads);
            return NULL;
        }
        p->n_started++;
    }
    return p;
}

void kt_pool_free(kt_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mutex);
    atomic_store(&p->stop, true);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mutex);
    for (int i = 0; i < p->n_started; i++) pthread_join(p->workers[i].thread, NULL);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->mutex);
    free(p->workers);
    free(p->scratch);
    free(p);
}

int kt_pool_size(const kt_pool *p) {
    return p ? p->n_threads : 1;
}

void kt_pool_run(kt_pool *p, kt_pool_fn fn, void *ctx) {
    if (!p || p->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->n_busy, p->n_threads - 1, memory_order_relaxed);
    /* seq_cst: orders the job fields and n_busy before the bump, and the
     * bump before the n_sleeping read below (see the top comment) */
    atomic_fetch_add(&p->generation, 1);
    if (atomic_load(&p->n_sleeping) > 0) {
        pthread_mutex_lock(&p->mutex);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mutex);
    }

    fn(ctx, 0, p->n_threads);

    /* The workers are either spinning (done within microseconds) or were
     * just woken; spin, yielding the core now and then in case this machine
     * is oversubscribed. */
    for (int i = 1; atomic_load_explicit(&p->n_busy, memory_order_acquire) != 0; i++) {
        cpu_relax();
        if ((i & 1023) == 0) sched_yield();
    }
}

void *kt_pool_scratch(kt_pool *p, size_t bytes) {
    if (!p) return NULL;
    if (bytes <= p->scratch_bytes && p->scratch) return p->scratch;
    /* grow geometrically so a slowly rising need does not reallocate often */
    size_t want = p->scratch_bytes + p->scratch_bytes / 2;
    if (want < bytes) want = bytes;
    want = (want + KT_POOL_ALIGN - 1) / KT_POOL_ALIGN * KT_POOL_ALIGN;
    if (want < bytes) return NULL; /* overflow */
    void *buf = aligned_alloc(KT_POOL_ALIGN, want);
    if (!buf) return NULL;
    free(p->scratch);
    p->scratch = buf;
    p->scratch_bytes = want;
    return buf;
}
