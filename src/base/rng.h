/*
 * rng.h - small deterministic random numbers (xoshiro-free, splitmix64).
 *
 * Used where output must be reproducible from a seed: the sampler and
 * gen-model. The same seed gives the same stream on every machine.
 */
#ifndef KT_BASE_RNG_H
#define KT_BASE_RNG_H

#include <math.h>
#include <stdint.h>

typedef struct kt_rng {
    uint64_t state;
} kt_rng;

static inline void kt_rng_seed(kt_rng *r, uint64_t seed) {
    r->state = seed;
}

static inline uint64_t kt_rng_u64(kt_rng *r) {
    uint64_t z = (r->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1). */
static inline double kt_rng_uniform(kt_rng *r) {
    return (double)(kt_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
}

/* Standard normal (Box-Muller; one value per call, simple over fast). */
static inline float kt_rng_normal(kt_rng *r) {
    double u1 = kt_rng_uniform(r), u2 = kt_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

#endif
