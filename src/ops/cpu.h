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
/* AVX-VNNI (vpdpbusd on 256-bit vectors) on top of kt_cpu_has_avx2: the
 * int8 GEMM tiles use it when present. KETTLE_NO_VNNI=1 turns it off. */
bool kt_cpu_has_avx_vnni(void);
/* AVX-512 F + BW + VL + VNNI with the OS saving ZMM state, on top of AVX2
 * (not necessarily AVX-VNNI): the Q4_0 GEMM then runs 16 rows per vector,
 * the Q8_0 tiles two outputs. KETTLE_NO_AVX512=1, or anything that turns
 * AVX-VNNI off (KETTLE_NO_VNNI=1, kt_cpu_force_no_vnni), turns it off. */
bool kt_cpu_has_avx512_vnni(void);
/* Turns AVX-VNNI off (on = true) or back on, for tests that check both
 * GEMM paths; same rules as kt_cpu_force_scalar. */
void kt_cpu_force_no_vnni(bool on);
/* Turns the AVX-512 tiles off (on = true) or back on, leaving AVX-VNNI;
 * same rules as kt_cpu_force_scalar. */
void kt_cpu_force_no_avx512(bool on);
/* Hides AVX-VNNI (on = true) or shows it again, leaving AVX-512 VNNI as it
 * is: the CPU as some hypervisors show AMD Zen 4 / 5, for tests that check
 * that the AVX-512 tiles still run there; same rules as
 * kt_cpu_force_scalar. */
void kt_cpu_hide_avx_vnni(bool on);
/* AMX-TILE + AMX-BF16 (and the AVX-512 F and BF16 that come with them)
 * with the OS saving tile state and granting it to this process, in a
 * build whose compiler has them (ops/amx.h: the vision tower's F16 GEMMs). KETTLE_NO_AMX=1 turns it off; so does
 * anything that turns the SIMD kernels off. */
bool kt_cpu_has_amx_bf16(void);
/* AMX-TILE + AMX-INT8 on the same terms, a tier above AVX-512 VNNI (so
 * false whenever that is): the prefill GEMMs of the 32-value x8 formats
 * (kt_matmul_x8_amx, ops/internal.h). */
bool kt_cpu_has_amx_int8(void);
/* Turns AMX off (on = true) or back on; same rules as kt_cpu_force_scalar. */
void kt_cpu_force_no_amx(bool on);
/* Turns the SIMD kernels off (on = true) or back on, for the whole
 * process, like KETTLE_NO_SIMD=1 does at start-up; for tests that compare
 * the scalar and SIMD paths end to end. Not to be called while kernels
 * run on other threads. */
void kt_cpu_force_scalar(bool on);
/* Short description, e.g. "AVX2 FMA F16C". */
const char *kt_cpu_features(void);

#endif
