/*
 * cpu.c - run-time CPU feature detection; see cpu.h.
 *
 * The AVX2 kernels need AVX2, FMA and F16C from the CPU (cpuid) and the OS
 * saving the YMM registers on context switches (OSXSAVE set and XCR0 bits 1
 * and 2, read with xgetbv). The answer is computed once and cached;
 * KETTLE_NO_SIMD=1 (read at that moment) or kt_cpu_force_scalar() turns the
 * SIMD kernels off.
 */
#include "ops/cpu.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define KT_X86 1
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define KT_AMX_LINUX 1
#endif
#ifndef KT_AMX_BUILT /* CMakeLists.txt: 1 where matmul_amx.c is compiled for AMX */
#define KT_AMX_BUILT 0
#endif
#ifndef KT_AMX_INT8_BUILT /* CMakeLists.txt: 1 where matmul_amx_q8.c is compiled for AMX-INT8 */
#define KT_AMX_INT8_BUILT 0
#endif

typedef struct cpu_info {
    bool avx, avx2, fma, f16c, avx512f, avx512bw, avx512vl, avx512vnni, avx_vnni, os_ymm, os_zmm;
    bool amx_tile, amx_bf16, amx_int8, avx512_bf16, os_amx;
} cpu_info;

static cpu_info detect(void) {
    cpu_info c = {0};
#ifdef KT_X86
    unsigned a, b, cx, d;
    if (!__get_cpuid(1, &a, &b, &cx, &d)) return c;
    bool osxsave = (cx >> 27) & 1;
    c.avx = (cx >> 28) & 1;
    c.fma = (cx >> 12) & 1;
    c.f16c = (cx >> 29) & 1;
    if (osxsave) {
        /* xgetbv(0): XCR0; bit 1 = SSE state, bit 2 = AVX (YMM) state */
        unsigned lo, hi;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        c.os_ymm = (lo & 6u) == 6u;
        c.os_zmm = (lo & 0xe6u) == 0xe6u; /* + opmask, ZMM0-15 upper, ZMM16-31 */
        c.os_amx = (lo & 0x60000u) == 0x60000u; /* XTILECFG (bit 17), XTILEDATA (bit 18) */
    }
    if (__get_cpuid_count(7, 0, &a, &b, &cx, &d)) {
        c.avx2 = (b >> 5) & 1;
        c.avx512f = (b >> 16) & 1;
        c.avx512bw = (b >> 30) & 1;
        c.avx512vl = (b >> 31) & 1;
        c.avx512vnni = (cx >> 11) & 1;
        c.amx_bf16 = (d >> 22) & 1;
        c.amx_tile = (d >> 24) & 1;
        c.amx_int8 = (d >> 25) & 1;
    }
    if (__get_cpuid_count(7, 1, &a, &b, &cx, &d)) {
        c.avx_vnni = (a >> 4) & 1;    /* leaf 7.1 EAX bit 4 */
        c.avx512_bf16 = (a >> 5) & 1; /* bit 5 */
    }
#endif
    return c;
}

static bool env_no_simd(void) {
    const char *v = getenv("KETTLE_NO_SIMD");
    return v && *v && strcmp(v, "0") != 0;
}

/* -1: not yet known; 0/1: the answer */
static _Atomic int g_has_avx2 = -1;
static _Atomic int g_forced_scalar = 0;

bool kt_cpu_has_avx2(void) {
    if (atomic_load_explicit(&g_forced_scalar, memory_order_relaxed)) return false;
    int v = atomic_load_explicit(&g_has_avx2, memory_order_relaxed);
    if (v < 0) { /* racing first callers compute the same answer */
        cpu_info c = detect();
        v = c.avx && c.avx2 && c.fma && c.f16c && c.os_ymm && !env_no_simd();
        atomic_store_explicit(&g_has_avx2, v, memory_order_relaxed);
    }
    return v == 1;
}

void kt_cpu_force_scalar(bool on) {
    atomic_store(&g_forced_scalar, on ? 1 : 0);
}

static _Atomic int g_has_vnni = -1;
static _Atomic int g_forced_no_vnni = 0;
static _Atomic int g_hidden_vnni = 0; /* kt_cpu_hide_avx_vnni: this tier only */

bool kt_cpu_has_avx_vnni(void) {
    if (!kt_cpu_has_avx2() || atomic_load_explicit(&g_forced_no_vnni, memory_order_relaxed) ||
        atomic_load_explicit(&g_hidden_vnni, memory_order_relaxed))
        return false;
    int v = atomic_load_explicit(&g_has_vnni, memory_order_relaxed);
    if (v < 0) {
        const char *env = getenv("KETTLE_NO_VNNI");
        v = detect().avx_vnni && !(env && *env && strcmp(env, "0") != 0);
        atomic_store_explicit(&g_has_vnni, v, memory_order_relaxed);
    }
    return v == 1;
}

void kt_cpu_force_no_vnni(bool on) {
    atomic_store(&g_forced_no_vnni, on ? 1 : 0);
}

void kt_cpu_hide_avx_vnni(bool on) {
    atomic_store(&g_hidden_vnni, on ? 1 : 0);
}

static _Atomic int g_has_vnni512 = -1;
static _Atomic int g_forced_no_avx512 = 0;

/* The switches that turn AVX-VNNI off (KETTLE_NO_VNNI, kt_cpu_force_no_vnni)
 * turn this tier off too, but the CPU need not have AVX-VNNI itself: the
 * AVX-512 tier's dot products are EVEX-encoded (AVX-512 VNNI + VL), and
 * where a 256-bit VNNI tile would serve, the dispatch asks
 * kt_cpu_has_avx_vnni and otherwise takes the AVX2 tile (the same bits).
 * Some CPUs (AMD Zen 4 / 5 as some hypervisors show them) report AVX-512
 * VNNI without AVX-VNNI. */
static _Atomic int g_env_no_vnni = -1; /* KETTLE_NO_VNNI, read once: this is asked per matmul call */

static bool vnni_switched_off(void) {
    if (atomic_load_explicit(&g_forced_no_vnni, memory_order_relaxed)) return true;
    int v = atomic_load_explicit(&g_env_no_vnni, memory_order_relaxed);
    if (v < 0) {
        const char *env = getenv("KETTLE_NO_VNNI");
        v = env && *env && strcmp(env, "0") != 0;
        atomic_store_explicit(&g_env_no_vnni, v, memory_order_relaxed);
    }
    return v == 1;
}

bool kt_cpu_has_avx512_vnni(void) {
    if (!kt_cpu_has_avx2() || vnni_switched_off()) return false;
    if (atomic_load_explicit(&g_forced_no_avx512, memory_order_relaxed)) return false;
    int v = atomic_load_explicit(&g_has_vnni512, memory_order_relaxed);
    if (v < 0) {
        cpu_info c = detect();
        const char *env = getenv("KETTLE_NO_AVX512");
        v = c.avx512f && c.avx512bw && c.avx512vl && c.avx512vnni && c.os_zmm && !(env && *env && strcmp(env, "0") != 0);
        atomic_store_explicit(&g_has_vnni512, v, memory_order_relaxed);
    }
    return v == 1;
}

void kt_cpu_force_no_avx512(bool on) {
    atomic_store(&g_forced_no_avx512, on ? 1 : 0);
}

static _Atomic int g_has_amx = -1;
static _Atomic int g_has_amx_int8 = -1;
static _Atomic int g_forced_no_amx = 0;

static bool env_no_amx(void) {
    const char *env = getenv("KETTLE_NO_AMX");
    return env && *env && strcmp(env, "0") != 0;
}

/* Linux hands out the 8 KiB of tile data per process only on request
 * (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA); without it the
 * first tile instruction faults. */
static bool amx_permitted(void) {
#ifdef KT_AMX_LINUX
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
#else
    return false;
#endif
}

bool kt_cpu_has_amx_bf16(void) {
    if (!kt_cpu_has_avx2() || atomic_load_explicit(&g_forced_no_amx, memory_order_relaxed)) return false;
    int v = atomic_load_explicit(&g_has_amx, memory_order_relaxed);
    if (v < 0) { /* racing first callers ask the kernel twice: it grants the same */
        cpu_info c = detect();
        v = c.amx_tile && c.amx_bf16 && c.os_amx && c.avx512f && c.avx512_bf16 && c.os_zmm && !env_no_amx() &&
            KT_AMX_BUILT && amx_permitted();
        atomic_store_explicit(&g_has_amx, v, memory_order_relaxed);
    }
    return v == 1;
}

/* The int8 tiles post-process on AVX-512 (the AVX-512 tier's float
 * steps), so they are a tier above it and go when it goes. */
bool kt_cpu_has_amx_int8(void) {
    if (!kt_cpu_has_avx512_vnni() || atomic_load_explicit(&g_forced_no_amx, memory_order_relaxed)) return false;
    int v = atomic_load_explicit(&g_has_amx_int8, memory_order_relaxed);
    if (v < 0) {
        cpu_info c = detect();
        v = c.amx_tile && c.amx_int8 && c.os_amx && !env_no_amx() && KT_AMX_INT8_BUILT && amx_permitted();
        atomic_store_explicit(&g_has_amx_int8, v, memory_order_relaxed);
    }
    return v == 1;
}

void kt_cpu_force_no_amx(bool on) {
    atomic_store(&g_forced_no_amx, on ? 1 : 0);
}

static char g_features[160];
static pthread_once_t g_features_once = PTHREAD_ONCE_INIT;

static void describe(void) {
    cpu_info c = detect();
    const char *tier = kt_cpu_has_amx_int8()    ? "(AMX-INT8 + AVX-512 kernels)"
                       : kt_cpu_has_avx512_vnni() ? "(AVX-512 kernels)"
                       : kt_cpu_has_avx_vnni()  ? "(AVX-VNNI kernels)"
                       : kt_cpu_has_avx2()      ? "(AVX2 kernels)"
                                                : "(scalar kernels)";
    snprintf(g_features, sizeof g_features, "%s%s%s%s%s%s%s%s%s%s", c.avx && c.os_ymm ? "AVX " : "",
             c.avx2 ? "AVX2 " : "", c.fma ? "FMA " : "", c.f16c ? "F16C " : "",
             c.avx_vnni ? "AVX-VNNI " : "", c.avx512f ? "AVX512F " : "",
             c.avx512f && c.avx512bw && c.avx512vl && c.avx512vnni ? "AVX512-VNNI " : "",
             kt_cpu_has_amx_bf16() ? "AMX-BF16 " : "", kt_cpu_has_amx_int8() ? "AMX-INT8 " : "", tier);
}

const char *kt_cpu_features(void) {
    pthread_once(&g_features_once, describe);
    return g_features;
}
