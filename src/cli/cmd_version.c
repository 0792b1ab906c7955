/*
 * cmd_version.c - `kettle --version` / `kettle version`: what was built
 * and which kernels this machine will run, the three things a bug report
 * needs first.
 *
 *   kettle 0.1.0 (git 0f5928a-dirty)
 *   kernels: AVX-512 VNNI (CPU: AVX AVX2 FMA F16C AVX-VNNI AVX512F AVX512-VNNI)
 *
 * The version is CMake's project version, the git text `git describe` as
 * it was when cmake configured the build (see CMakeLists.txt).
 */
#include <stdio.h>

#include "cli/commands.h"
#include "ops/cpu.h"

#ifndef KT_VERSION
#define KT_VERSION "unknown"
#endif
#ifndef KT_GIT_DESCRIBE
#define KT_GIT_DESCRIBE "unknown"
#endif

/* The tier the matmul dispatch picks (ops/cpu.h), after the KETTLE_NO_*
 * switches, so the line says what will run, not only what the CPU has. */
static const char *kernel_tier(void) {
    if (kt_cpu_has_amx_int8()) return "AMX-INT8 + AVX-512 VNNI";
    if (kt_cpu_has_avx512_vnni()) return "AVX-512 VNNI";
    if (kt_cpu_has_avx_vnni()) return "AVX-VNNI";
    if (kt_cpu_has_avx2()) return "AVX2";
    return "scalar";
}

int cmd_version(int argc, char **argv) {
    (void)argc, (void)argv;
    printf("kettle %s (git %s)\n", KT_VERSION, KT_GIT_DESCRIBE);
    printf("kernels: %s (CPU: %s)\n", kernel_tier(), kt_cpu_features());
    return 0;
}
