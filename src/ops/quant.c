/*
 * quant.c - reference quantizers and dequantizers; see quant.h.
 *
 * These are ggml's reference routines (quantize_row_q8_0_ref,
 * quantize_row_q4_0_ref, _q4_1_ref, _q5_0_ref, _q5_1_ref and the
 * dequantizers) written out again, operation
 * for operation, because `kettle quantize` must reproduce llama.cpp's bytes
 * exactly (../shared/docs/FORMATS.md): the same float operations in the
 * same order, fp32 -> fp16 rounded to nearest even. This file is compiled
 * without FMA, so `x * id + 8.5f` is two roundings, as in ggml's reference.
 *
 * Also here: the scalar quantizer of activations for the matmul kernels
 * (same numbers as Q8_0, laid out as values and float scales apart, plus
 * each block's 8 * sum; see internal.h).
 */
#include "ops/quant.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "base/fp16.h"
#include "ops/cpu.h"
#include "ops/internal.h"
#include "ops/kquant.h"

bool kt_quantize_supported(kt_dtype type) {
    return type == KT_F32 || type == KT_F16 || type == KT_BF16 || type == KT_Q8_0 ||
           type == KT_Q4_0 || type == KT_Q4_1 || type == KT_Q5_0 || type == KT_Q5_1 ||
           type == KT_Q2_K || type == KT_Q3_K || type == KT_Q4_K || type == KT_Q5_K || type == KT_Q6_K ||
           type == KT_IQ4_NL || type == KT_IQ4_XS || type == KT_MXFP4;
}

bool kt_dequantize_supported(kt_dtype type) {
    return kt_quantize_supported(type);
}

/* (int8_t)v for v the compiler may not assume finite or in range: NaN
 * (from NaN or infinite inputs) becomes 0 and values beyond the int8 range
 * (a subnormal scale's infinite inverse) saturate, instead of undefined
 * behaviour; wherever the plain cast is defined the result is the same. */
static int8_t to_i8(float v) {
    return isnan(v) ? 0 : v >= 127.0f ? 127 : v <= -128.0f ? -128 : (int8_t)v;
}

/* ---- Q8_0 ---------------------------------------------------------------
 *   amax = max |x|;  d = amax / 127;  id = d ? 1/d : 0;  q = roundf(x * id)
 */

/* Quantizes 32 values into qs; returns the unrounded float scale d. */
static float q8_0_block(const float *x, int8_t *qs) {
    float amax = 0.0f;
    for (int j = 0; j < QK8_0; j++) {
        float a = fabsf(x[j]);
        amax = a > amax ? a : amax;
    }
    const float d = amax / ((1 << 7) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    for (int j = 0; j < QK8_0; j++) qs[j] = to_i8(roundf(x[j] * id));
    return d;
}

static void quantize_row_q8_0(const float *x, block_q8_0 *y, int64_t n) {
    for (int64_t i = 0; i < n / QK8_0; i++) {
        float d = q8_0_block(x + i * QK8_0, y[i].qs);
        y[i].d = kt_fp32_to_fp16(d);
    }
}

static void dequantize_row_q8_0(const block_q8_0 *y, float *x, int64_t n) {
    for (int64_t i = 0; i < n / QK8_0; i++) {
        const float d = kt_fp16_to_fp32(y[i].d);
        for (int j = 0; j < QK8_0; j++) x[i * QK8_0 + j] = y[i].qs[j] * d;
    }
}

void kt_quantize_act_q8_ref(const float *x, int64_t n, int8_t *qs, float *d, int32_t *c8) {
    for (int64_t i = 0; i < n / QK8_0; i++) {
        int8_t *q = qs + i * QK8_0;
        const float *xb = x + i * QK8_0;
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++) amax = fabsf(xb[j]) > amax ? fabsf(xb[j]) : amax;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        for (int j = 0; j < QK8_0; j++) q[j] = to_i8(nearbyintf(xb[j] * id)); /* ties to even */
        d[i] = kt_fp16_to_fp32(kt_fp32_to_fp16(amax / 127.0f));
        int32_t sum = 0;
        for (int j = 0; j < QK8_0; j++) sum += q[j];
        c8[i] = 8 * sum;
    }
}

/* ---- Q4_0 ---------------------------------------------------------------
 *   max = the x with the largest |x| (sign kept; the first on ties)
 *   d = max / -8;  id = d ? 1/d : 0;  q = MIN(15, (int8_t)(x * id + 8.5f))
 * Element j < 16 goes to the low nibble of qs[j], element j + 16 to its
 * high nibble. Since d has the sign of -max, x * id lies in [-8, 8] and the
 * nibble in [0, 16] before the clamp.
 */
static void quantize_row_q4_0(const float *x, block_q4_0 *y, int64_t n) {
    for (int64_t i = 0; i < n / QK4_0; i++) {
        const float *xb = x + i * QK4_0;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK4_0; j++) {
            if (amax < fabsf(xb[j])) {
                amax = fabsf(xb[j]);
                max = xb[j];
            }
        }
        const float d = max / -8;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = kt_fp32_to_fp16(d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            const float x0 = xb[j] * id;
            const float x1 = xb[QK4_0 / 2 + j] * id;
            int8_t q0 = to_i8(x0 + 8.5f), q1 = to_i8(x1 + 8.5f);
            const uint8_t xi0 = (uint8_t)(q0 < 15 ? q0 : 15);
            const uint8_t xi1 = (uint8_t)(q1 < 15 ? q1 : 15);
            y[i].qs[j] = (uint8_t)(xi0 | (xi1 << 4));
        }
    }
}

static void dequantize_row_q4_0(const block_q4_0 *y, float *x, int64_t n) {
    for (int64_t i = 0; i < n / QK4_0; i++) {
        const float d = kt_fp16_to_fp32(y[i].d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            const int x0 = (y[i].qs[j] & 0x0F) - 8;
            const int x1 = (y[i].qs[j] >> 4) - 8;
            x[i * QK4_0 + j] = x0 * d;
            x[i * QK4_0 + j + QK4_0 / 2] = x1 * d;
        }
    }
}

/* ---- Q4_1, Q5_0, Q5_1 ---------------------------------------------------
 * The element order of all three is Q4_0's (quant.h); the 5-bit types keep
 * each value's fifth bit in qh, bit j for element j.
 */

void kt_unpack_q4(const uint8_t *qs, uint8_t *q) {
    for (int j = 0; j < 16; j++) {
        q[j] = qs[j] & 0x0F;
        q[j + 16] = qs[j] >> 4;
    }
}

void kt_unpack_q5(const uint8_t *qs, const uint8_t *qh, uint8_t *q) {
    uint32_t h;
    memcpy(&h, qh, 4); /* little-endian, like GGUF */
    kt_unpack_q4(qs, q);
    for (int j = 0; j < 32; j++) q[j] |= (uint8_t)(((h >> j) & 1) << 4);
}

/* The inverse of kt_unpack_q5 (and of kt_unpack_q4 for qh NULL): 32 levels
 * whose bits above the fifth (fourth) are ignored. */
static void pack_levels(const uint8_t *q, uint8_t *qs, uint8_t *qh) {
    uint32_t h = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4));
        h |= (uint32_t)((q[j] >> 4) & 1) << j;
        h |= (uint32_t)((q[j + 16] >> 4) & 1) << (j + 16);
    }
    if (qh) memcpy(qh, &h, 4);
}

/* min and max of 32 values as ggml finds them (NaN never replaces one). */
static void block_min_max(const float *x, float *min, float *max) {
    float lo = FLT_MAX, hi = -FLT_MAX;
    for (int j = 0; j < 32; j++) {
        if (x[j] < lo) lo = x[j];
        if (x[j] > hi) hi = x[j];
    }
    *min = lo;
    *max = hi;
}

/* Q4_1 (levels 15) and Q5_1 (levels 31), one block:
 *   d = (max - min) / levels;  id = d ? 1/d : 0
 *   q = (int8_t)((x - min) * id + 0.5f), clamped to 15 for Q4_1 only
 * (ggml's Q5_1 reference has no clamp; (x - min) * id <= 31 anyway).
 * Writes the levels to q; returns d, *m gets min. */
static float q_1_block(const float *x, int levels, uint8_t *q, float *m) {
    float min, max;
    block_min_max(x, &min, &max);
    const float d = (max - min) / levels;
    const float id = d ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; j++) {
        int8_t v = to_i8((x[j] - min) * id + 0.5f);
        q[j] = (uint8_t)(levels == 15 && v > 15 ? 15 : v);
    }
    *m = min;
    return d;
}

static void quantize_row_q4_1(const float *x, block_q4_1 *y, int64_t n) {
    for (int64_t i = 0; i < n / QK4_1; i++) {
        uint8_t q[32];
        float m;
        y[i].d = kt_fp32_to_fp16(q_1_block(x + i * QK4_1, 15, q, &m));
        y[i].m = kt_fp32_to_fp16(m);
        pack_levels(q, y[i].qs, NULL);
    }
}

static void quantize_row_q5_1(const float *x, block_q5_1 *y, int64_t n) {
    for (int64_t i = 0; i < n / QK5_1; i++) {
        uint8_t q[32];
        float m;
        y[i].d = kt_fp32_to_fp16(q_1_block(x + i * QK5_1, 31, q, &m));
        y[i].m = kt_fp32_to_fp16(m);
        pack_levels(q, y[i].qs, y[i].qh);
    }
}

/* Q5_0: as Q4_0 with 16 levels either side:
 *   max = the x with the largest |x| (first on ties);  d = max / -16
 *   q = MIN(31, (int8_t)(x * id + 16.5f)) */
static void quantize_row_q5_0(const float *x, block_q5_0 *y, int64_t n) {
    for (int64_t i = 0; i < n / QK5_0; i++) {
        const float *xb = x + i * QK5_0;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK5_0; j++) {
            if (amax < fabsf(xb[j])) {
                amax = fabsf(xb[j]);
                max = xb[j];
            }
        }
        const float d = max / -16;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = kt_fp32_to_fp16(d);
        uint8_t q[32];
        for (int j = 0; j < QK5_0; j++) {
            int8_t v = to_i8(xb[j] * id + 16.5f);
            q[j] = (uint8_t)(v < 31 ? v : 31);
        }
        pack_levels(q, y[i].qs, y[i].qh);
    }
}

static void dequantize_row_q4_1(const block_q4_1 *y, float *x, int64_t n) {
    for (int64_t i = 0; i < n / QK4_1; i++) {
        const float d = kt_fp16_to_fp32(y[i].d), m = kt_fp16_to_fp32(y[i].m);
        uint8_t q[32];
        kt_unpack_q4(y[i].qs, q);
        for (int j = 0; j < 32; j++) x[i * QK4_1 + j] = q[j] * d + m;
    }
}

static void dequantize_row_q5_0(const block_q5_0 *y, float *x, int64_t n) {
    for (int64_t i = 0; i < n / QK5_0; i++) {
        const float d = kt_fp16_to_fp32(y[i].d);
        uint8_t q[32];
        kt_unpack_q5(y[i].qs, y[i].qh, q);
        for (int j = 0; j < 32; j++) x[i * QK5_0 + j] = (q[j] - 16) * d;
    }
}

static void dequantize_row_q5_1(const block_q5_1 *y, float *x, int64_t n) {
    for (int64_t i = 0; i < n / QK5_1; i++) {
        const float d = kt_fp16_to_fp32(y[i].d), m = kt_fp16_to_fp32(y[i].m);
        uint8_t q[32];
        kt_unpack_q5(y[i].qs, y[i].qh, q);
        for (int j = 0; j < 32; j++) x[i * QK5_1 + j] = q[j] * d + m;
    }
}

/* ---- the plain types ---------------------------------------------------- */

void kt_quantize_row(kt_dtype type, const float *x, void *out, int64_t n) {
    switch (type) {
    case KT_F32:
        memcpy(out, x, (size_t)n * sizeof(float));
        break;
    case KT_F16: {
        uint16_t *h = out;
#if defined(__x86_64__) || defined(__i386__)
        if (kt_cpu_has_avx2()) {
            kt_fp32_to_fp16_row_avx2(x, h, n);
            break;
        }
#endif
        for (int64_t i = 0; i < n; i++) h[i] = kt_fp32_to_fp16(x[i]);
        break;
    }
    case KT_BF16: {
        uint16_t *h = out;
        for (int64_t i = 0; i < n; i++) h[i] = kt_fp32_to_bf16(x[i]);
        break;
    }
    case KT_Q8_0:
        quantize_row_q8_0(x, out, n);
        break;
    case KT_Q4_0:
        quantize_row_q4_0(x, out, n);
        break;
    case KT_Q4_1:
        quantize_row_q4_1(x, out, n);
        break;
    case KT_Q5_0:
        quantize_row_q5_0(x, out, n);
        break;
    case KT_Q5_1:
        quantize_row_q5_1(x, out, n);
        break;
    case KT_Q4_K:
        kt_quantize_row_q4_K(x, out, n);
        break;
    case KT_Q5_K:
        kt_quantize_row_q5_K(x, out, n);
        break;
    case KT_Q6_K:
        kt_quantize_row_q6_K(x, out, n);
        break;
    case KT_Q2_K:
        kt_quantize_row_q2_K(x, out, n);
        break;
    case KT_Q3_K:
        kt_quantize_row_q3_K(x, out, n);
        break;
    case KT_IQ4_NL:
        kt_quantize_row_iq4_nl(x, out, n);
        break;
    case KT_IQ4_XS:
        kt_quantize_row_iq4_xs(x, out, n);
        break;
    case KT_MXFP4:
        kt_quantize_row_mxfp4(x, out, n);
        break;
    default:
        break; /* unsupported: callers check kt_quantize_supported() */
    }
}

void kt_dequantize_row(kt_dtype type, const void *in, float *out, int64_t n) {
    switch (type) {
    case KT_F32:
        memcpy(out, in, (size_t)n * sizeof(float));
        break;
    case KT_F16: {
        const uint16_t *h = in;
        for (int64_t i = 0; i < n; i++) out[i] = kt_fp16_to_fp32(h[i]);
        break;
    }
    case KT_BF16: {
        const uint16_t *h = in;
        for (int64_t i = 0; i < n; i++) out[i] = kt_bf16_to_fp32(h[i]);
        break;
    }
    case KT_Q8_0:
        dequantize_row_q8_0(in, out, n);
        break;
    case KT_Q4_0:
        dequantize_row_q4_0(in, out, n);
        break;
    case KT_Q4_1:
        dequantize_row_q4_1(in, out, n);
        break;
    case KT_Q5_0:
        dequantize_row_q5_0(in, out, n);
        break;
    case KT_Q5_1:
        dequantize_row_q5_1(in, out, n);
        break;
    case KT_Q4_K:
        kt_dequantize_row_q4_K(in, out, n);
        break;
    case KT_Q5_K:
        kt_dequantize_row_q5_K(in, out, n);
        break;
    case KT_Q6_K:
        kt_dequantize_row_q6_K(in, out, n);
        break;
    case KT_Q2_K:
        kt_dequantize_row_q2_K(in, out, n);
        break;
    case KT_Q3_K:
        kt_dequantize_row_q3_K(in, out, n);
        break;
    case KT_IQ4_NL:
        kt_dequantize_row_iq4_nl(in, out, n);
        break;
    case KT_IQ4_XS:
        kt_dequantize_row_iq4_xs(in, out, n);
        break;
    case KT_MXFP4:
        kt_dequantize_row_mxfp4(in, out, n);
        break;
    default:
        break; /* unsupported: callers check kt_dequantize_supported() */
    }
}

/* ---- the activation buffer layout (internal.h) ------------------------- */

#define ACT_ALIGN 64

static size_t align_up(size_t n) {
    return (n + ACT_ALIGN - 1) / ACT_ALIGN * ACT_ALIGN;
}

size_t kt_q8_act_bytes(int n_in, int n_tokens) {
    size_t nb = (size_t)(n_in / QK8_0) * (size_t)n_tokens;
    return align_up(nb * QK8_0) + 2 * align_up(nb * sizeof(float)) + ACT_ALIGN;
}

kt_q8_act kt_q8_act_carve(void *scratch, int n_in, int n_tokens, int8_t **qs, float **d,
                          int32_t **c8) {
    size_t nb = (size_t)(n_in / QK8_0) * (size_t)n_tokens;
    uintptr_t p = ((uintptr_t)scratch + ACT_ALIGN - 1) & ~(uintptr_t)(ACT_ALIGN - 1);
    *qs = (int8_t *)p;
    *d = (float *)(p + align_up(nb * QK8_0));
    *c8 = (int32_t *)(p + align_up(nb * QK8_0) + align_up(nb * sizeof(float)));
    return (kt_q8_act){.qs = *qs, .d = *d, .c8 = *c8, .nb = n_in / QK8_0};
}
