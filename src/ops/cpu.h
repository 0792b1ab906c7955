/*
 * cpu.h - run-time CPU feature detection for kernel dispatch.
 *
 * KETTLE_NO_SIMD=1 in the environment forces the scalar kernels (for
 * debugging and for comparing paths end to end).
 */
#ifndef KT_OPS_CPU_H
#define KT_OPS_CPU_H

#include <stdbool.h>

/* AVX2 + FMA + F16C, all three (the kernels assume them together). */
bool kt_cpu_has_avx2(void);
/* Short description, e.g. "AVX2 FMA F16C". */
const char *kt_cpu_features(void);

#endif
