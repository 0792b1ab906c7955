/*
 * kquant.c - reference quantizers and dequantizers of the K-quants; see
 * kquant.h.
 *
 * These follow ggml's reference routines (quantize_row_q4_K_ref, ..._q5_K,
 * ..._q6_K, quantize_row_q8_K_ref, make_qkx2_quants, make_qx_quants and the
 * dequantizers) operation for operation, in float, so that `kettle
 * quantize` gives llama.cpp's bytes: same operations in the same order,
 * nearest_int's round-half-even, fp32 -> fp16 rounded to nearest even.
 * Like quant.c this file is compiled without FMA (no contraction under
 * -std=c11 and no -mfma), as ggml's reference code is.
 *
 * Element order within a super-block:
 *   Q4_K/Q5_K: values 64k .. 64k+31 are the low nibbles of qs[32k ..
 *     32k+31] (sub-block 2k), values 64k+32 .. 64k+63 their high nibbles
 *     (sub-block 2k+1). Q5_K's fifth bit of value 64k+l is bit 2k of
 *     qh[l], of value 64k+32+l bit 2k+1 of qh[l].
 *   Q6_K: per half h (128 values; ql + 64h, qh + 32h, scales + 8h), for
 *     l < 32: value l      = ql[l] low  | (qh[l] bits 0-1) << 4
 *             value l + 32 = ql[l+32] low | (qh[l] bits 2-3) << 4
 *             value l + 64 = ql[l] high  | (qh[l] bits 4-5) << 4
 *             value l + 96 = ql[l+32] high | (qh[l] bits 6-7) << 4
 *     each minus 32; scale index = value / 16.
 */
#include "ops/kquant.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "base/fp16.h"

#define GROUP_MAX_EPS 1e-15f

/* ggml's nearest_int: round to nearest, ties to even, for |v| < 2^22, by
 * adding 1.5 * 2^23 and reading the mantissa. Outside that range (or for
 * NaN) the result is meaningless but defined; callers clamp it. */
static int nearest_int(float v) {
    float f = v + 12582912.f;
    int32_t i;
    memcpy(&i, &f, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

static int clampi(int v, int lo, int hi) {
    return v < lo ? lo : v > hi ? hi : v;
}

void kt_kq_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* The inverse of kt_kq_scale_min for sub-block j; j = 0..3 must be set
 * before 4..7 (they OR their top bits into bytes 0-7). */
static void put_scale_min(int j, uint8_t *q, uint8_t ls, uint8_t lm) {
    if (j < 4) {
        q[j] = ls;
        q[j + 4] = lm;
    } else {
        q[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
        q[j - 4] |= (uint8_t)((ls >> 4) << 6);
        q[j] |= (uint8_t)((lm >> 4) << 6);
    }
}

/* ---- make_qkx2_quants: scale and min of an affine sub-block -----------
 *
 * Finds scale s and min m >= 0 with x ~ s * L - m, L in 0..nmax, by
 * minimizing the weighted squared error (use_mad: the weighted absolute
 * error): start from the min/max grid, then try nstep+1 grids iscale = (rmin + rdelta * is + nmax) / (max - min),
 * each followed by the weighted least-squares fit of (s, -m) to its L.
 * Returns s; *the_min = m; L holds the best levels. */
static float make_qkx2_quants(int n, int nmax, const float *x, const float *weights,
                              uint8_t *L, float *the_min, uint8_t *Laux, float rmin,
                              float rdelta, int nstep, bool use_mad) {
    float min = x[0], max = x[0];
    float sum_w = weights[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        for (int i = 0; i < n; i++) L[i] = 0;
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; i++) {
        int l = clampi(nearest_int(iscale * (x[i] - min)), 0, nmax);
        L[i] = (uint8_t)l;
        float diff = scale * L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best_error += weights[i] * diff;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = clampi(nearest_int(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = (uint8_t)l;
            float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                cur_error += weights[i] * diff;
            }
            if (cur_error < best_error) {
                for (int i = 0; i < n; i++) L[i] = Laux[i];
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* The x of largest |x|, its sign kept (the first of equal ones), and
 * |x| in *amax: the scale every ggml quantizer starts from. */
static float signed_absmax(const float *x, int n, float *amax) {
    float max = 0;
    *amax = 0;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > *amax) {
            *amax = ax;
            max = x[i];
        }
    }
    return max;
}

/* ---- make_qx_quants (rmse_type 1): scale of a symmetric sub-block ------
 *
 * x ~ s * (L - nmax), L - nmax in -nmax .. nmax-1, weights x^2: tries the
 * grids iscale = -(nmax + 0.1 is) / max for is = -9..9 (max = the x of
 * largest |x|, sign kept) and keeps the one with the best weighted
 * least-squares fit (largest sumlx^2 / suml2). Returns s. */
static float make_qx_quants(int n, int nmax, const float *x, int8_t *L) {
    float amax;
    const float max = signed_absmax(x, n, &amax);
    if (amax < GROUP_MAX_EPS) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
            float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++)
                L[i] = (int8_t)(nmax + clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* ---- Q4_K and Q5_K ------------------------------------------------------
 * Per sub-block of 32: weights av_x + |x| (av_x = rms of the sub-block),
 * make_qkx2_quants; then the 8 scales and 8 mins are quantized to 6 bits
 * against the largest of each (d = max_scale / 63, dmin = max_min / 63),
 * and every value is quantized again against its sub-block's rounded
 * scale and min: L = nearest_int((x + dmin * m) / (d * sc)).
 * Returns the packed scales in `scales`, d and dmin, and L (0..nmax).
 */
static void kq_affine_block(const float *x, int nmax, float rmin, float rdelta, int nstep,
                            uint8_t *scales, uint16_t *d_out, uint16_t *dmin_out,
                            uint8_t *L) {
    float mins[QK_K / 32], sub_scales[QK_K / 32], weights[32];
    uint8_t Laux[32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < QK_K / 32; j++) {
        const float *xs = x + 32 * j;
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += xs[l] * xs[l];
        float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf(xs[l]);
        sub_scales[j] = make_qkx2_quants(32, nmax, xs, weights, L + 32 * j, &mins[j], Laux,
                                         rmin, rdelta, nstep, false);
        if (sub_scales[j] > max_scale) max_scale = sub_scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t ls = (uint8_t)nearest_int(inv_scale * sub_scales[j]);
        uint8_t lm = (uint8_t)nearest_int(inv_min * mins[j]);
        put_scale_min(j, scales, ls < 63 ? ls : 63, lm < 63 ? lm : 63);
    }
    *d_out = kt_fp32_to_fp16(max_scale / 63.f);
    *dmin_out = kt_fp32_to_fp16(max_min / 63.f);
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t sc, m;
        kt_kq_scale_min(j, scales, &sc, &m);
        const float d = kt_fp16_to_fp32(*d_out) * sc;
        if (!d) continue; /* keeps make_qkx2_quants' levels, as ggml does */
        const float dm = kt_fp16_to_fp32(*dmin_out) * m;
        for (int ii = 0; ii < 32; ii++)
            L[32 * j + ii] = (uint8_t)clampi(nearest_int((x[32 * j + ii] + dm) / d), 0, nmax);
    }
}

void kt_quantize_row_q4_K(const float *x, block_q4_K *y, int64_t n) {
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t L[QK_K];
        kq_affine_block(x + i * QK_K, 15, -1.f, 0.1f, 20, y[i].scales, &y[i].d, &y[i].dmin, L);
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < 32; l++)
                y[i].qs[32 * k + l] = (uint8_t)(L[64 * k + l] | (L[64 * k + 32 + l] << 4));
    }
}

void kt_quantize_row_q5_K(const float *x, block_q5_K *y, int64_t n) {
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t L[QK_K];
        kq_affine_block(x + i * QK_K, 31, -0.5f, 0.1f, 15, y[i].scales, &y[i].d, &y[i].dmin, L);
        memset(y[i].qh, 0, sizeof y[i].qh);
        for (int k = 0; k < 4; k++) {
            for (int l = 0; l < 32; l++) {
                int l1 = L[64 * k + l], l2 = L[64 * k + 32 + l];
                if (l1 > 15) {
                    l1 -= 16;
                    y[i].qh[l] |= (uint8_t)(1u << (2 * k));
                }
                if (l2 > 15) {
                    l2 -= 16;
                    y[i].qh[l] |= (uint8_t)(1u << (2 * k + 1));
                }
                y[i].qs[32 * k + l] = (uint8_t)(l1 | (l2 << 4));
            }
        }
    }
}

void kt_dequantize_row_q4_K(const block_q4_K *y, float *x, int64_t n) {
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = kt_fp16_to_fp32(y[i].d), dmin = kt_fp16_to_fp32(y[i].dmin);
        float *out = x + i * QK_K;
        for (int k = 0; k < 4; k++) {
            uint8_t sc, m;
            kt_kq_scale_min(2 * k, y[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            kt_kq_scale_min(2 * k + 1, y[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            const uint8_t *q = y[i].qs + 32 * k;
            for (int l = 0; l < 32; l++) out[64 * k + l] = d1 * (q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) out[64 * k + 32 + l] = d2 * (q[l] >> 4) - m2;
        }
    }
}

void kt_dequantize_row_q5_K(const block_q5_K *y, float *x, int64_t n) {
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = kt_fp16_to_fp32(y[i].d), dmin = kt_fp16_to_fp32(y[i].dmin);
        float *out = x + i * QK_K;
        for (int k = 0; k < 4; k++) {
            uint8_t sc, m;
            kt_kq_scale_min(2 * k, y[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            kt_kq_scale_min(2 * k + 1, y[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            const uint8_t *q = y[i].qs + 32 * k;
            for (int l = 0; l < 32; l++) {
                int h = (y[i].qh[l] >> (2 * k)) & 1;
                out[64 * k + l] = d1 * ((q[l] & 0xF) + 16 * h) - m1;
            }
            for (int l = 0; l < 32; l++) {
                int h = (y[i].qh[l] >> (2 * k + 1)) & 1;
                out[64 * k + 32 + l] = d2 * ((q[l] >> 4) + 16 * h) - m2;
            }
        }
    }
}

/* ---- Q6_K ---------------------------------------------------------------
 * Per 16 values make_qx_quants(nmax 32); the 16 scales are quantized to
 * int8 against the one of largest |scale| (iscale = -128 / max_scale,
 * d = 1 / iscale), then each value again: L = nearest_int(x / (d * sc)),
 * clamped to -32..31, stored + 32.
 */
static void q6_K_pack(const int8_t *L, block_q6_K *y) {
    for (int h = 0; h < 2; h++) {
        const int8_t *Lh = L + 128 * h;
        uint8_t *ql = y->ql + 64 * h, *qh = y->qh + 32 * h;
        for (int l = 0; l < 32; l++) {
            ql[l] = (uint8_t)((Lh[l] & 0xF) | ((Lh[l + 64] & 0xF) << 4));
            ql[l + 32] = (uint8_t)((Lh[l + 32] & 0xF) | ((Lh[l + 96] & 0xF) << 4));
            qh[l] = (uint8_t)((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) | ((Lh[l + 64] >> 4) << 4) |
                              ((Lh[l + 96] >> 4) << 6));
        }
    }
}

void kt_quantize_row_q6_K(const float *x, block_q6_K *y, int64_t n) {
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float *xb = x + i * QK_K;
        int8_t L[QK_K];
        float scales[QK_K / 16];
        float max_scale = 0, max_abs_scale = 0;
        for (int ib = 0; ib < QK_K / 16; ib++) {
            scales[ib] = make_qx_quants(16, 32, xb + 16 * ib, L + 16 * ib);
            if (fabsf(scales[ib]) > max_abs_scale) {
                max_abs_scale = fabsf(scales[ib]);
                max_scale = scales[ib];
            }
        }
        if (max_abs_scale < GROUP_MAX_EPS) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        float iscale = -128.f / max_scale;
        y[i].d = kt_fp32_to_fp16(1 / iscale);
        for (int ib = 0; ib < QK_K / 16; ib++) {
            int s = nearest_int(iscale * scales[ib]);
            y[i].scales[ib] = (int8_t)(s < 127 ? s : 127);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = kt_fp16_to_fp32(y[i].d) * y[i].scales[j];
            if (!d) continue;
            for (int ii = 0; ii < 16; ii++)
                L[16 * j + ii] = (int8_t)(clampi(nearest_int(xb[16 * j + ii] / d), -32, 31) + 32);
        }
        q6_K_pack(L, &y[i]);
    }
}

/* The 6-bit level (0..63) of value v of a Q6_K block. */
static int q6_K_level(const block_q6_K *b, int v) {
    const int h = v / 128, r = v % 128, l = r % 32, quarter = r / 32;
    const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
    const int lo = quarter & 1 ? ql[l + 32] : ql[l];
    const int nib = quarter < 2 ? lo & 0xF : lo >> 4;
    return nib | (((qh[l] >> (2 * quarter)) & 3) << 4);
}

void kt_dequantize_row_q6_K(const block_q6_K *y, float *x, int64_t n) {
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = kt_fp16_to_fp32(y[i].d);
        for (int v = 0; v < QK_K; v++)
            x[i * QK_K + v] = d * y[i].scales[v / 16] * (q6_K_level(&y[i], v) - 32);
    }
}

/* ---- Q2_K ---------------------------------------------------------------
 * Per group of 16: weights |x|, make_qkx2_quants(nmax 3, absolute error);
 * the 16 scales and 16 mins are quantized to 4 bits against the largest
 * of each (d = max_scale / 15, dmin = max_min / 15), then every value
 * again against its group's rounded scale and min, as Q4_K.
 */
void kt_quantize_row_q2_K(const float *x, block_q2_K *y, int64_t n) {
    const float q4scale = 15.f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float *xb = x + i * QK_K;
        uint8_t L[QK_K], Laux[16];
        float weights[16], mins[QK_K / 16], scales[QK_K / 16];
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < QK_K / 16; j++) {
            for (int l = 0; l < 16; l++) weights[l] = fabsf(xb[16 * j + l]);
            scales[j] = make_qkx2_quants(16, 3, xb + 16 * j, weights, L + 16 * j, &mins[j], Laux,
                                         -0.5f, 0.1f, 15, true);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        if (max_scale > 0) {
            const float iscale = q4scale / max_scale;
            for (int j = 0; j < QK_K / 16; j++) y[i].scales[j] = (uint8_t)nearest_int(iscale * scales[j]);
            y[i].d = kt_fp32_to_fp16(max_scale / q4scale);
        } else {
            memset(y[i].scales, 0, sizeof y[i].scales);
            y[i].d = kt_fp32_to_fp16(0.f);
        }
        if (max_min > 0) {
            const float iscale = q4scale / max_min;
            for (int j = 0; j < QK_K / 16; j++)
                y[i].scales[j] |= (uint8_t)(nearest_int(iscale * mins[j]) << 4);
            y[i].dmin = kt_fp32_to_fp16(max_min / q4scale);
        } else {
            y[i].dmin = kt_fp32_to_fp16(0.f);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = kt_fp16_to_fp32(y[i].d) * (y[i].scales[j] & 0xF);
            if (!d) continue; /* keeps make_qkx2_quants' levels, as ggml does */
            const float dm = kt_fp16_to_fp32(y[i].dmin) * (y[i].scales[j] >> 4);
            for (int ii = 0; ii < 16; ii++)
                L[16 * j + ii] = (uint8_t)clampi(nearest_int((xb[16 * j + ii] + dm) / d), 0, 3);
        }
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 32; l++) {
                const uint8_t *Lh = L + 128 * h;
                y[i].qs[32 * h + l] =
                    (uint8_t)(Lh[l] | (Lh[l + 32] << 2) | (Lh[l + 64] << 4) | (Lh[l + 96] << 6));
            }
    }
}

/* The 2-bit field of value v (0..255) in a Q2_K/Q3_K qs array. */
static int q2_bits(const uint8_t *qs, int v) {
    return (qs[32 * (v / 128) + v % 32] >> (2 * (v % 128 / 32))) & 3;
}

void kt_dequantize_row_q2_K(const block_q2_K *y, float *x, int64_t n) {
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = kt_fp16_to_fp32(y[i].d), dmin = kt_fp16_to_fp32(y[i].dmin);
        for (int v = 0; v < QK_K; v++) {
            const uint8_t sc = y[i].scales[v / 16];
            const float dl = d * (sc & 0xF), ml = dmin * (sc >> 4);
            x[i * QK_K + v] = dl * q2_bits(y[i].qs, v) - ml;
        }
    }
}

/* ---- Q3_K ---------------------------------------------------------------
 * make_q3_quants: x ~ s * L, L in -nmax .. nmax-1, weights x^2, from the
 * grid -nmax / max (max: the x of largest |x|, sign kept), then (do_rmse)
 * up to 5 sweeps that move single levels to the weighted least-squares
 * optimum while that improves sumlx^2 / suml2. Levels come back + nmax.
 */
static float make_q3_quants(int n, int nmax, const float *x, int8_t *L, bool do_rmse) {
    float amax;
    const float max = signed_absmax(x, n, &amax);
    if (amax < GROUP_MAX_EPS) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.f;
    }
    float iscale = -nmax / max;
    if (do_rmse) {
        float sumlx = 0, suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
            L[i] = (int8_t)l;
            float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        for (int itry = 0; itry < 5; itry++) {
            int n_changed = 0;
            for (int i = 0; i < n; i++) {
                float w = x[i] * x[i];
                float slx = sumlx - w * x[i] * L[i];
                if (slx > 0) {
                    float sl2 = suml2 - w * L[i] * L[i];
                    int new_l = clampi(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
                    if (new_l != L[i]) {
                        slx += w * x[i] * new_l;
                        sl2 += w * new_l * new_l;
                        if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                            L[i] = (int8_t)new_l;
                            sumlx = slx;
                            suml2 = sl2;
                            n_changed++;
                        }
                    }
                }
            }
            if (!n_changed) break;
        }
        for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
        return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1) + nmax);
    return 1 / iscale;
}

int kt_q3_K_scale(const uint8_t *scales, int g) {
    const int lo = g < 8 ? scales[g] & 0xF : scales[g - 8] >> 4;
    return lo | (((scales[8 + g % 4] >> (2 * (g / 4))) & 3) << 4);
}

/* Per group of 16 make_q3_quants(nmax 4); the 16 scales quantized to 6
 * bits (signed, stored + 32) against the one of largest |scale|
 * (iscale = -32 / max_scale, d = 1 / iscale), then each value again:
 * L = nearest_int(x / (d * sc)) clamped to -4..3, stored + 4. */
void kt_quantize_row_q3_K(const float *x, block_q3_K *y, int64_t n) {
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float *xb = x + i * QK_K;
        int8_t L[QK_K];
        float scales[QK_K / 16];
        float max_scale = 0, amax = 0;
        for (int j = 0; j < QK_K / 16; j++) {
            scales[j] = make_q3_quants(16, 4, xb + 16 * j, L + 16 * j, true);
            float scale = fabsf(scales[j]);
            if (scale > amax) {
                amax = scale;
                max_scale = scales[j];
            }
        }
        memset(y[i].scales, 0, sizeof y[i].scales);
        if (max_scale) {
            const float iscale = -32.f / max_scale;
            for (int j = 0; j < QK_K / 16; j++) {
                /* ggml keeps nearest_int in an int8_t before clamping;
                 * |iscale * scale| <= 32, so the narrowing never wraps */
                const int l = clampi((int8_t)nearest_int(iscale * scales[j]), -32, 31) + 32;
                if (j < 8) y[i].scales[j] = (uint8_t)(l & 0xF);
                else y[i].scales[j - 8] |= (uint8_t)((l & 0xF) << 4);
                y[i].scales[j % 4 + 8] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
            }
            y[i].d = kt_fp32_to_fp16(1 / iscale);
        } else {
            y[i].d = kt_fp32_to_fp16(0.f);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            const int sc = kt_q3_K_scale(y[i].scales, j) - 32;
            const float d = kt_fp16_to_fp32(y[i].d) * sc;
            if (!d) continue; /* keeps make_q3_quants' levels, as ggml does */
            for (int ii = 0; ii < 16; ii++)
                L[16 * j + ii] = (int8_t)(clampi(nearest_int(xb[16 * j + ii] / d), -4, 3) + 4);
        }
        memset(y[i].hmask, 0, sizeof y[i].hmask);
        for (int v = 0; v < QK_K; v++)
            if (L[v] > 3) {
                y[i].hmask[v % 32] |= (uint8_t)(1u << (v / 32));
                L[v] = (int8_t)(L[v] - 4);
            }
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 32; l++) {
                const int8_t *Lh = L + 128 * h;
                y[i].qs[32 * h + l] =
                    (uint8_t)(Lh[l] | (Lh[l + 32] << 2) | (Lh[l + 64] << 4) | (Lh[l + 96] << 6));
            }
    }
}

void kt_dequantize_row_q3_K(const block_q3_K *y, float *x, int64_t n) {
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = kt_fp16_to_fp32(y[i].d);
        for (int v = 0; v < QK_K; v++) {
            const float dl = d * (kt_q3_K_scale(y[i].scales, v / 16) - 32);
            const int hbit = (y[i].hmask[v % 32] >> (v / 32)) & 1;
            x[i * QK_K + v] = dl * (q2_bits(y[i].qs, v) - (hbit ? 0 : 4));
        }
    }
}

/* ---- IQ4_NL and IQ4_XS --------------------------------------------------
 * ggml's quantize_row_iq4_nl_impl without an importance matrix (weights
 * x^2) and with ntry 7, what llama-quantize uses for both types: per 32
 * values, the scale d = -max / values[0] (max: the x of largest |x|, sign
 * kept), each value to its nearest table level (best_index), then the 15
 * grids id = (itry + values[0]) / max, itry = -7..7, each with its
 * weighted least-squares scale, the best kept. IQ4_NL stores that scale
 * and re-picks the levels against it; IQ4_XS quantizes the 8 scales to
 * 6 bits against d = -max_scale / 32 and re-picks the levels against each
 * rounded scale.
 */
const int8_t KT_IQ4NL_VALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                    1,    13,   25,  38,  53,  69,  89,  113};

/* ggml's best_index_int8: the nearest of the n ascending values to x (the
 * upper one on a tie), by bisection. */
static int best_index_int8(int n, const int8_t *val, float x) {
    if (x <= val[0]) return 0;
    if (x >= val[n - 1]) return n - 1;
    int ml = 0, mu = n - 1;
    while (mu - ml > 1) {
        int mav = (ml + mu) / 2;
        if (x < val[mav]) mu = mav;
        else ml = mav;
    }
    return x - val[mu - 1] < val[mu] - x ? mu - 1 : mu;
}

#define IQ4_NTRY 7

/* The scale of 32 values xb and (in Lb) their levels against the first
 * grid; 0 for a block under GROUP_MAX_EPS (Lb then untouched). */
static float iq4_block_scale(const float *xb, uint8_t *Lb) {
    const int8_t *values = KT_IQ4NL_VALUES;
    float weight[32];
    for (int j = 0; j < 32; j++) weight[j] = xb[j] * xb[j];
    float amax = 0, max = 0;
    for (int j = 0; j < 32; j++) {
        float ax = fabsf(xb[j]);
        if (ax > amax) {
            amax = ax;
            max = xb[j];
        }
    }
    if (amax < GROUP_MAX_EPS) return 0;
    float d = -max / values[0];
    float id = 1 / d;
    float sumqx = 0, sumq2 = 0;
    for (int j = 0; j < 32; j++) {
        float al = id * xb[j];
        int l = best_index_int8(16, values, al);
        Lb[j] = (uint8_t)l;
        float q = values[l];
        float w = weight[j];
        sumqx += w * q * xb[j];
        sumq2 += w * q * q;
    }
    d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
    float best = d * sumqx;
    for (int itry = -IQ4_NTRY; itry <= IQ4_NTRY; itry++) {
        id = (itry + values[0]) / max;
        sumqx = sumq2 = 0;
        for (int j = 0; j < 32; j++) {
            float al = id * xb[j];
            int l = best_index_int8(16, values, al);
            float q = values[l];
            float w = weight[j];
            sumqx += w * q * xb[j];
            sumq2 += w * q * q;
        }
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    return d;
}

/* 32 levels into 16 bytes: value j low nibble, value 16 + j high. */
static void iq4_pack(const uint8_t *L, uint8_t *q4) {
    for (int j = 0; j < 16; j++) q4[j] = (uint8_t)(L[j] | (L[16 + j] << 4));
}

void kt_quantize_row_iq4_nl(const float *x, block_iq4_nl *y, int64_t n) {
    /* ggml keeps L across blocks; an all-zero block's levels are all
     * re-picked below (against id 0: level 8), so none is read stale */
    uint8_t L[QK4_NL] = {0};
    for (int64_t i = 0; i < n / QK4_NL; i++) {
        const float *xb = x + i * QK4_NL;
        const float scale = iq4_block_scale(xb, L);
        y[i].d = kt_fp32_to_fp16(scale);
        const float id = scale ? 1 / scale : 0;
        for (int j = 0; j < QK4_NL; j++) L[j] = (uint8_t)best_index_int8(16, KT_IQ4NL_VALUES, id * xb[j]);
        iq4_pack(L, y[i].qs);
    }
}

int kt_iq4_xs_scale(const block_iq4_xs *b, int j) {
    return ((b->scales_l[j / 2] >> (4 * (j % 2))) & 0xF) | (((b->scales_h >> (2 * j)) & 3) << 4);
}

void kt_quantize_row_iq4_xs(const float *x, block_iq4_xs *y, int64_t n) {
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float *xb = x + i * QK_K;
        uint8_t L[QK_K];
        float scales[QK_K / 32];
        float max_scale = 0, amax_scale = 0;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            scales[ib] = iq4_block_scale(xb + 32 * ib, L + 32 * ib);
            float abs_d = fabsf(scales[ib]);
            if (abs_d > amax_scale) {
                amax_scale = abs_d;
                max_scale = scales[ib];
            }
        }
        y[i].scales_h = 0;
        /* an all-zero super-block gives d = -0.0 (fp16 0x8000), as in ggml */
        const float d = -max_scale / 32;
        y[i].d = kt_fp32_to_fp16(d);
        const float id = d ? 1 / d : 0.f;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            int l = clampi(nearest_int(id * scales[ib]), -32, 31);
            const float dl = d * l;
            const float idl = dl ? 1 / dl : 0.f;
            for (int j = 0; j < 32; j++)
                L[32 * ib + j] = (uint8_t)best_index_int8(16, KT_IQ4NL_VALUES, idl * xb[32 * ib + j]);
            l += 32;
            if (ib % 2 == 0) y[i].scales_l[ib / 2] = (uint8_t)(l & 0xF);
            else y[i].scales_l[ib / 2] |= (uint8_t)((l & 0xF) << 4);
            y[i].scales_h |= (uint16_t)((l >> 4) << (2 * ib));
        }
        for (int ib = 0; ib < QK_K / 32; ib++) iq4_pack(L + 32 * ib, y[i].qs + 16 * ib);
    }
}

void kt_dequantize_row_iq4_nl(const block_iq4_nl *y, float *x, int64_t n) {
    for (int64_t i = 0; i < n / QK4_NL; i++) {
        const float d = kt_fp16_to_fp32(y[i].d);
        for (int j = 0; j < 16; j++) {
            x[i * QK4_NL + j] = d * KT_IQ4NL_VALUES[y[i].qs[j] & 0xF];
            x[i * QK4_NL + 16 + j] = d * KT_IQ4NL_VALUES[y[i].qs[j] >> 4];
        }
    }
}

void kt_dequantize_row_iq4_xs(const block_iq4_xs *y, float *x, int64_t n) {
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = kt_fp16_to_fp32(y[i].d);
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const float dl = d * (kt_iq4_xs_scale(&y[i], ib) - 32);
            const uint8_t *qs = y[i].qs + 16 * ib;
            float *out = x + i * QK_K + 32 * ib;
            for (int j = 0; j < 16; j++) {
                out[j] = dl * KT_IQ4NL_VALUES[qs[j] & 0xF];
                out[16 + j] = dl * KT_IQ4NL_VALUES[qs[j] >> 4];
            }
        }
    }
}

/* ---- MXFP4 ---------------------------------------------------------------
 * ggml's quantize_row_mxfp4_ref: per 32 values, amax = max |x|; the
 * exponent e = floor(log2(amax)) - 2 + 127 (so amax / 2^(e-127) is in
 * [4, 8): the largest E2M1 value is 6, so the top of the range clips to
 * 6, as ggml's does), 0 for an all-zero block; each value to the nearest
 * of the 16 doubled values times d = 2^(e - 128) by a linear search (the
 * first on a tie, so +0 before -0 and the lower index otherwise).
 */
const int8_t KT_MXFP4_VALUES[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* ggml's best_index_mxfp4 */
static int best_index_mxfp4(float x, float d) {
    int best = 0;
    float best_err = fabsf(KT_MXFP4_VALUES[0] * d - x);
    for (int i = 1; i < 16; i++) {
        const float err = fabsf(KT_MXFP4_VALUES[i] * d - x);
        if (err < best_err) best = i, best_err = err;
    }
    return best;
}

/* ggml's (uint8_t)(floorf(log2f(amax)) - 2 + 127). The float is an integer
 * in [-24, 253] for any finite amax > 0; where it is negative (amax under
 * 2^-125) C leaves the conversion to uint8_t undefined, and ggml's x86
 * build truncates through int32 (cvttss2si), which this does on purpose. */
static uint8_t mxfp4_exponent(float amax) {
    if (!(amax > 0.0f)) return 0;
    const float e = floorf(log2f(amax)) - 2 + 127;
    if (!(e < 2147483648.0f)) return 0; /* amax infinite: cvttss2si's 0x80000000 */
    return (uint8_t)(uint32_t)(int32_t)e;
}

void kt_quantize_row_mxfp4(const float *x, block_mxfp4 *y, int64_t n) {
    for (int64_t i = 0; i < n / QK_MXFP4; i++) {
        const float *xb = x + i * QK_MXFP4;
        float amax = 0.0f;
        for (int j = 0; j < QK_MXFP4; j++)
            if (amax < fabsf(xb[j])) amax = fabsf(xb[j]);
        const uint8_t e = mxfp4_exponent(amax);
        const float d = kt_e8m0_half(e);
        y[i].e = e;
        for (int j = 0; j < QK_MXFP4 / 2; j++)
            y[i].qs[j] = (uint8_t)(best_index_mxfp4(xb[j], d) | best_index_mxfp4(xb[QK_MXFP4 / 2 + j], d) << 4);
    }
}

void kt_dequantize_row_mxfp4(const block_mxfp4 *y, float *x, int64_t n) {
    for (int64_t i = 0; i < n / QK_MXFP4; i++) {
        const float d = kt_e8m0_half(y[i].e);
        for (int j = 0; j < QK_MXFP4 / 2; j++) {
            x[i * QK_MXFP4 + j] = KT_MXFP4_VALUES[y[i].qs[j] & 0xF] * d;
            x[i * QK_MXFP4 + QK_MXFP4 / 2 + j] = KT_MXFP4_VALUES[y[i].qs[j] >> 4] * d;
        }
    }
}

/* ---- Q8_K ---------------------------------------------------------------
 *   max = the x of largest |x| (sign kept); iscale = -127 / max;
 *   q = MIN(127, nearest_int(iscale * x)); d = 1 / iscale
 */
void kt_quantize_act_q8_K(const float *x, int64_t n, int8_t *qs, float *d, int16_t *bsums) {
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float *xb = x + i * QK_K;
        int8_t *q = qs + i * QK_K;
        float amax;
        const float max = signed_absmax(xb, QK_K, &amax);
        if (!amax) {
            d[i] = 0;
            memset(q, 0, QK_K);
            memset(bsums + i * 16, 0, 16 * sizeof *bsums);
            continue;
        }
        const float iscale = -127.f / max;
        for (int j = 0; j < QK_K; j++) {
            int v = nearest_int(iscale * xb[j]);
            q[j] = (int8_t)clampi(v, -128, 127);
        }
        for (int g = 0; g < QK_K / 16; g++) {
            int sum = 0;
            for (int k = 0; k < 16; k++) sum += q[16 * g + k];
            bsums[i * 16 + g] = (int16_t)sum;
        }
        d[i] = 1 / iscale;
    }
}
