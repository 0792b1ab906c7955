/*
 * timing.h - monotonic wall-clock time for measurements.
 */
#ifndef KT_BASE_TIMING_H
#define KT_BASE_TIMING_H

#include <time.h>

static inline double kt_time_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

#endif
