/*
 * matmul.c - the reference matmul, the scalar fallback, and the dispatcher
 * that quantizes activations and splits rows over the pool; see matmul.h.
 *
 * The specification (kt_matmul_ref):
 *   - F32/F16/BF16 weights: out = sum_i float(W[r][i]) * x[i], summed in
 *     float in the order i = 0, 1, 2, ...
 *   - Q8_0/Q4_0/Q4_1/Q5_0/Q5_1 weights: each activation row is quantized
 *     to Q8_0 blocks with the reference quantizer (quant.c); the integer
 *     dot products are exact, and the float steps are fixed:
 *       Q4_0, Q8_0: acc = 0; per block b in order:
 *               acc = fmaf((float)isum_b, d_w[b] * d_x[b], acc)
 *       Q5_0: as Q4_0, with isum_b = sum (q - 16) * x_q over the block
 *       Q4_1, Q5_1: acc = 0; per block b in order, with isum_b =
 *             sum q * x_q (q the unsigned levels) and sx_b = sum x_q:
 *               acc = fmaf((float)isum_b, d_w[b] * d_x[b], acc)
 *               acc = fmaf((float)sx_b, m_w[b] * d_x[b], acc)
 *             (ggml pairs these types with Q8_1 activations and adds
 *             m_w * s_x, s_x = fp16(d_x * sum x_q); kettle reads the exact
 *             sum x_q from the Q8_0 activations' c8 / 8 instead.)
 *       IQ4_NL: as Q4_0, isum_b = sum KT_IQ4NL_VALUES[q] * x_q (kquant.h)
 *       MXFP4: as IQ4_NL, isum_b = sum KT_MXFP4_VALUES[q] * x_q and d_w =
 *             kt_e8m0_half(e) (ggml's ggml_vec_dot_mxfp4_q8_0: the block's
 *             integer dot times the product of the scales; ggml sums the
 *             blocks in other lanes, so within rounding of llama.cpp)
 *     The order is that of ggml's repacked Q4_0 kernels and lets the
 *     GEMMs keep one output per lane, so Q8_0 runs on the 32-value
 *     formats' tiles. Until 2026-12-07 Q8_0 kept ggml's AVX2 order (8
 *     float lanes per output, ggml_vec_dot_q8_0_q8_0's), which costs a
 *     conversion and an fma per 4 products (0.4x Q4_0's prefill on
 *     AVX-512) and matched llama.cpp's golden Q8_0 logits to 0.0108; in
 *     this order they are 0.0282 off (tests/test_golden.c says why).
 *     The AVX2 kernels (matmul_avx2.c) do exactly these
 *     operations, so for the quantized types SIMD, scalar fallback and
 *     reference agree bit for bit.
 *   - Q2_K/Q3_K/Q4_K/Q5_K/Q6_K/IQ4_XS weights: each activation row is
 *     quantized to Q8_K
 *     blocks of 256 (kquant.c, ggml's quantize_row_q8_K_ref); per weight
 *     block, in order, the exact integer sums and one or two fmaf steps
 *     given by kt_kq_block_step (matmul_k.c, internal.h). The AVX2 kernels
 *     (matmul_k_avx2.c) apply the same steps: bit-identical as well. The
 *     activation quantizer is the scalar one on every path.
 *
 * The x8 layouts (ops/repack.h: Q4_0x8, Q8_0x8, IQ4_NLx8, Q4_Kx8, Q2_Kx8, ...)
 * are the plain types with 8 rows' blocks interleaved at load; the reference reads their blocks back and
 * applies the plain type's steps, and the SIMD kernels must (and do, per
 * the tests) give the same bits from either layout.
 *
 * The AVX2 kernels for float weights keep 8 lanes per output and add them
 * up at the end, so they differ from the reference in summation order.
 *
 * F32x16/F16x16/BF16x16 (float weights, 16 rows side by side; repack.h)
 * have their own specification, which every path follows bit for bit:
 *     acc = 0; per value i in order: acc = fmaf(float(W[r][i]), x[i], acc)
 * (one fma chain per output: the outer-product GEMM of
 * matmul_x16_avx2.c computes exactly that).
 *
 * Batch invariance: every output element is computed by one kernel over
 * its whole row, in an order that depends only on n_in -- not on n_tokens,
 * on how rows are split over threads, or on which tile of the GEMM it
 * falls in. So a token's outputs are bit-identical whether it is
 * multiplied alone or in a batch. The scalar fallback used with
 * KETTLE_NO_SIMD is bit-identical to kt_matmul_ref.
 *
 * Threads: rows are split into contiguous ranges whose boundaries are
 * multiples of 16 rows (64 bytes of floats), so no two threads write the
 * same cache line of an output row.
 */
#include "ops/matmul.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/fp16.h"
#include "ops/cpu.h"
#include "ops/internal.h"
#include "ops/kquant.h"
#include "ops/quant.h"
#include "ops/repack.h"

#define ROW_GRAIN 16 /* thread row ranges start on multiples of this (and
                        * of KT_X16_ROWS, which the x16 kernels rely on) */

/* Q4_1, Q5_0, Q5_1: the other 32-value types (one accumulator, Q8_0
 * activations); Q5_0x8 is Q5_0 repacked */
static bool is_legacy(kt_dtype t) {
    return t == KT_Q4_1 || t == KT_Q5_0 || t == KT_Q5_1;
}

/* their repacked forms (kt_repack_plain: which) */
static bool is_legacy_x8(kt_dtype t) {
    return t == KT_Q4_1_X8 || t == KT_Q5_0_X8 || t == KT_Q5_1_X8;
}

static bool is_legacy_any(kt_dtype t) {
    return is_legacy(t) || is_legacy_x8(t);
}

/* float weights with 16 rows side by side (kt_repack_plain: which) */
static bool is_x16(kt_dtype t) {
    return t == KT_F32_X16 || t == KT_F16_X16 || t == KT_BF16_X16;
}

/* K-quant weights repacked by groups of 8 rows */
static bool is_kquant_x8(kt_dtype t) {
    return t == KT_Q4_K_X8 || t == KT_Q5_K_X8 || t == KT_Q6_K_X8 || t == KT_Q2_K_X8 || t == KT_Q3_K_X8 ||
           t == KT_IQ4_XS_X8;
}

/* Q8_0, Q4_0, IQ4_NL, MXFP4 and their x8 forms: one exact integer sum
 * per block, then one step (block_step) */
static bool is_block_step(kt_dtype t) {
    return t == KT_Q8_0 || t == KT_Q8_0_X8 || t == KT_Q4_0 || t == KT_Q4_0_X8 || t == KT_IQ4_NL ||
           t == KT_IQ4_NL_X8 || t == KT_MXFP4 || t == KT_MXFP4_X8;
}

/* weights whose activations are quantized to Q8_0 blocks */
static bool is_quant(kt_dtype t) {
    return is_block_step(t) || is_legacy_any(t);
}

/* K-quant weights: activations quantized to Q8_K (matmul_k.c) */
static bool is_kquant(kt_dtype t) {
    return t == KT_Q2_K || t == KT_Q3_K || t == KT_Q4_K || t == KT_Q5_K || t == KT_Q6_K ||
           t == KT_IQ4_XS || is_kquant_x8(t);
}

bool kt_matmul_supported(kt_dtype wtype) {
    return wtype == KT_F32 || wtype == KT_F16 || wtype == KT_BF16 || is_x16(wtype) || is_quant(wtype) ||
           is_kquant(wtype);
}

/* A matrix kt_matmul can multiply: a supported type, whole blocks a row,
 * and for the x16 layouts whole groups of 16 rows (which repacking
 * guarantees; a caller passing anything else gets NaN, not a write past
 * out). */
static bool shape_ok(kt_dtype wtype, int n_in, int n_out) {
    return kt_matmul_supported(wtype) && kt_dtype_row_bytes(wtype, n_in) != 0 &&
           (!is_x16(wtype) || n_out % KT_X16_ROWS == 0);
}

/* ---- scalar building blocks (shared by the reference and the fallback) */

/* float(W[i]) of a row of a plain type */
static float weight_at(const void *row, kt_dtype t, int i) {
    switch (t) {
    case KT_F16: return kt_fp16_to_fp32(((const uint16_t *)row)[i]);
    case KT_BF16: return kt_bf16_to_fp32(((const uint16_t *)row)[i]);
    default: return ((const float *)row)[i];
    }
}

static float dot_float_ref(const void *row, kt_dtype t, const float *x, int n) {
    float sum = 0.0f;
    for (int i = 0; i < n; i++) sum += weight_at(row, t, i) * x[i];
    return sum;
}

/* Row r of an x16 matrix (type t) times x: the x16 specification. */
static float dot_x16_ref(const void *w, kt_dtype t, int n_in, int r, const float *x) {
    const kt_dtype plain = kt_repack_plain(t);
    const int esz = (int)kt_dtype_get(plain)->block_bytes;
    float acc = 0.0f;
    for (int i = 0; i < n_in; i++) acc = fmaf(weight_at(kt_x16_at(w, esz, n_in, r, i), plain, 0), x[i], acc);
    return acc;
}

/* Integer dot product of weight block b of a row with 32 int8 activations. */
static int32_t idot_block(const void *row, kt_dtype t, int b, const int8_t *xq) {
    int32_t s = 0;
    if (t == KT_Q8_0) {
        const block_q8_0 *blk = (const block_q8_0 *)row + b;
        for (int j = 0; j < QK8_0; j++) s += blk->qs[j] * xq[j];
    } else {
        const block_q4_0 *blk = (const block_q4_0 *)row + b;
        for (int j = 0; j < QK4_0 / 2; j++) {
            s += ((blk->qs[j] & 0x0F) - 8) * xq[j];
            s += ((blk->qs[j] >> 4) - 8) * xq[j + QK4_0 / 2];
        }
    }
    return s;
}

static float block_scale(const void *row, kt_dtype t, int b) {
    uint16_t d = t == KT_Q8_0 ? ((const block_q8_0 *)row)[b].d : ((const block_q4_0 *)row)[b].d;
    return kt_fp16_to_fp32(d);
}

/* Q4_0 (and IQ4_NL, MXFP4): adds one block's term, fmaf((float)isum,
 * d_w * d_x, acc). */
static float block_step(const void *row, kt_dtype t, int b, const int8_t *xq, float dx,
                        float acc) {
    if (t == KT_MXFP4)
        return fmaf((float)kt_mxfp4_idot(row, b, xq), kt_e8m0_half(((const block_mxfp4 *)row)[b].e) * dx, acc);
    if (t == KT_IQ4_NL)
        return fmaf((float)kt_iq4_nl_idot(row, b, xq),
                    kt_fp16_to_fp32(((const block_iq4_nl *)row)[b].d) * dx, acc);
    return fmaf((float)idot_block(row, t, b, xq), block_scale(row, t, b) * dx, acc);
}

/* Q8_0, Q4_0, IQ4_NL, MXFP4 and their x8 forms: block step for block b
 * of row r of w (an x8 block read back in its plain form, so both layouts
 * take the same operations). */
static float row_block_step(const void *w, kt_dtype t, int n_in, int r, int b, const int8_t *xq,
                            float dx, float acc) {
    if (t != KT_Q4_0_X8 && t != KT_Q8_0_X8 && t != KT_IQ4_NL_X8 && t != KT_MXFP4_X8)
        return block_step((const char *)w + (size_t)r * kt_dtype_row_bytes(t, n_in), t, b, xq, dx, acc);
    union { block_q4_0 q4_0; block_q8_0 q8_0; block_iq4_nl iq4_nl; block_mxfp4 mxfp4; } blk;
    kt_x8_block(w, kt_repack_plain(t), n_in, r, b, &blk);
    return block_step(&blk, kt_repack_plain(t), 0, xq, dx, acc);
}

/* Q4_1/Q5_0/Q5_1 weight block b: its 32 levels, d and m (0 for Q5_0). */
static void legacy_block(const void *row, kt_dtype t, int b, uint8_t *q, float *d, float *m) {
    if (t == KT_Q4_1) {
        const block_q4_1 *blk = (const block_q4_1 *)row + b;
        kt_unpack_q4(blk->qs, q);
        *d = kt_fp16_to_fp32(blk->d);
        *m = kt_fp16_to_fp32(blk->m);
    } else if (t == KT_Q5_0) {
        const block_q5_0 *blk = (const block_q5_0 *)row + b;
        kt_unpack_q5(blk->qs, blk->qh, q);
        *d = kt_fp16_to_fp32(blk->d);
        *m = 0.0f;
    } else {
        const block_q5_1 *blk = (const block_q5_1 *)row + b;
        kt_unpack_q5(blk->qs, blk->qh, q);
        *d = kt_fp16_to_fp32(blk->d);
        *m = kt_fp16_to_fp32(blk->m);
    }
}

/* Q4_1/Q5_0/Q5_1: adds one block's terms (see the specification above);
 * sx is the sum of the 32 activation values (c8 / 8). */
static float block_step_legacy(const void *row, kt_dtype t, int b, const int8_t *xq, float dx,
                               int32_t sx, float acc) {
    uint8_t q[32];
    float d, m;
    legacy_block(row, t, b, q, &d, &m);
    const int off = t == KT_Q5_0 ? 16 : 0;
    int32_t s = 0;
    for (int j = 0; j < 32; j++) s += (q[j] - off) * xq[j];
    acc = fmaf((float)s, d * dx, acc);
    if (t != KT_Q5_0) acc = fmaf((float)sx, m * dx, acc);
    return acc;
}

/* The same for block b of row r of w, a repacked matrix read back as its
 * plain type (the same operations in both layouts). */
static float row_block_step_legacy(const void *w, kt_dtype t, int n_in, int r, int b, const int8_t *xq,
                                   float dx, int32_t sx, float acc) {
    if (!is_legacy_x8(t))
        return block_step_legacy((const char *)w + (size_t)r * kt_dtype_row_bytes(t, n_in), t, b, xq, dx, sx, acc);
    union { block_q4_1 q4_1; block_q5_0 q5_0; block_q5_1 q5_1; } blk; /* aligned for each */
    kt_x8_block(w, kt_repack_plain(t), n_in, r, b, &blk);
    return block_step_legacy(&blk, kt_repack_plain(t), 0, xq, dx, sx, acc);
}

/* K-quant block step for block b of row r of w (a repacked block read
 * back in its plain form: the same operations in both layouts). */
static float kq_row_block_step(const void *w, kt_dtype t, int n_in, int r, int b, const int8_t *xq,
                               float dx, const int16_t *bs, float acc) {
    if (!is_kquant_x8(t))
        return kt_kq_block_step(t, (const char *)w + (size_t)r * kt_dtype_row_bytes(t, n_in), b, xq, dx, bs, acc);
    const kt_dtype plain = kt_repack_plain(t);
    _Static_assert(sizeof(block_q6_K) >= sizeof(block_q5_K) && sizeof(block_q6_K) >= sizeof(block_q4_K) &&
                       sizeof(block_q6_K) >= sizeof(block_q3_K) && sizeof(block_q6_K) >= sizeof(block_iq4_xs),
                   "blk holds any K-quant block");
    _Alignas(16) uint8_t blk[sizeof(block_q6_K)];
    kt_x8_block(w, plain, n_in, r, b, blk);
    return kt_kq_block_step(plain, blk, 0, xq, dx, bs, acc);
}

/* K-quant weights, row r: per block, the activations quantized to Q8_K,
 * then the block's step (internal.h). */
static float dot_kquant_ref(const void *w, kt_dtype t, int r, const float *x, int n) {
    float acc = 0.0f;
    for (int b = 0; b < n / QK_K; b++) {
        int8_t xq[QK_K];
        int16_t bs[QK_K / 16];
        float dx;
        kt_quantize_act_q8_K(x + b * QK_K, QK_K, xq, &dx, bs);
        acc = kq_row_block_step(w, t, n, r, b, xq, dx, bs, acc);
    }
    return acc;
}

/* ---- the reference --------------------------------------------------- */

void kt_matmul_ref(float *out, const void *w, kt_dtype wtype, const float *x, int n_in,
                   int n_out, int n_tokens) {
    const size_t row_bytes = kt_dtype_row_bytes(wtype, n_in);
    if (!shape_ok(wtype, n_in, n_out)) {
        for (long i = 0; i < (long)n_out * n_tokens; i++) out[i] = NAN;
        return;
    }
    for (int t = 0; t < n_tokens; t++) {
        const float *xt = x + (size_t)t * n_in;
        float *ot = out + (size_t)t * n_out;
        if (is_kquant(wtype)) {
            for (int r = 0; r < n_out; r++)
                ot[r] = dot_kquant_ref(w, wtype, r, xt, n_in);
            continue;
        }
        if (is_x16(wtype)) {
            for (int r = 0; r < n_out; r++) ot[r] = dot_x16_ref(w, wtype, n_in, r, xt);
            continue;
        }
        if (!is_quant(wtype)) {
            for (int r = 0; r < n_out; r++)
                ot[r] = dot_float_ref((const char *)w + r * row_bytes, wtype, xt, n_in);
            continue;
        }
        /* Quantized: per row, one activation block at a time (quantized
         * again for each row: slow, but the reference needs no heap). */
        for (int r = 0; r < n_out; r++) {
            float acc = 0.0f;
            for (int b = 0; b < n_in / QK8_0; b++) {
                int8_t xq[QK8_0];
                float dx;
                int32_t c8;
                kt_quantize_act_q8_ref(xt + b * QK8_0, QK8_0, xq, &dx, &c8);
                if (is_legacy_any(wtype)) acc = row_block_step_legacy(w, wtype, n_in, r, b, xq, dx, c8 / 8, acc);
                else acc = row_block_step(w, wtype, n_in, r, b, xq, dx, acc);
            }
            ot[r] = acc;
        }
    }
}

/* ---- the scalar fallback (threaded; bit-identical to the reference) --- */

static void rows_scalar(float *out, const void *w, kt_dtype wtype, const float *x,
                        const kt_q8_act *xa, const kt_q8k_act *xk, int n_in, int n_out,
                        int n_tokens, int r0, int r1) {
    const size_t row_bytes = kt_dtype_row_bytes(wtype, n_in);
    for (int t = 0; t < n_tokens; t++) {
        for (int r = r0; r < r1; r++) {
            const void *row = (const char *)w + r * row_bytes;
            float sum = 0.0f;
            if (is_block_step(wtype)) {
                for (int b = 0; b < xa->nb; b++) {
                    size_t k = (size_t)t * xa->nb + b;
                    sum = row_block_step(w, wtype, n_in, r, b, xa->qs + k * QK8_0, xa->d[k], sum);
                }
            } else if (is_legacy_any(wtype)) {
                for (int b = 0; b < xa->nb; b++) {
                    size_t k = (size_t)t * xa->nb + b;
                    sum = row_block_step_legacy(w, wtype, n_in, r, b, xa->qs + k * QK8_0, xa->d[k],
                                                xa->c8[k] / 8, sum);
                }
            } else if (is_kquant(wtype)) {
                for (int b = 0; b < xk->nb; b++) {
                    size_t k = (size_t)t * xk->nb + b;
                    sum = kq_row_block_step(w, wtype, n_in, r, b, xk->qs + k * QK_K, xk->d[k],
                                            xk->bsums + k * 16, sum);
                }
            } else if (is_x16(wtype)) {
                sum = dot_x16_ref(w, wtype, n_in, r, x + (size_t)t * n_in);
            } else {
                sum = dot_float_ref(row, wtype, x + (size_t)t * n_in, n_in);
            }
            out[(size_t)t * n_out + r] = sum;
        }
    }
}

/* ---- dispatch -------------------------------------------------------- */

typedef struct mm_job {
    float *out;
    const void *w;
    kt_dtype wtype;
    const float *x;   /* float activations (float weights) */
    kt_q8_act xa;     /* quantized activations (Q8_0/Q4_0/Q4_1/Q5_0/Q5_1) */
    kt_q8k_act xk;    /* quantized activations (K-quant weights) */
    int n_in, n_out, n_tokens;
    bool simd;
    char *panels;       /* per-thread GEMM work areas, panel_bytes apart */
    size_t panel_bytes;
    /* activation quantization job */
    int8_t *qs;
    float *d;
    int32_t *c8;
    int16_t *bsums; /* K-quants: Q8_K sums (qs, d as above) */
    /* the matrices sharing x; out, w, wtype and n_out above are set from
     * each in turn by mm_task (wtype is parts[0]'s until then, which
     * quantize_tokens reads: every part wants the same activations) */
    kt_matmul_part parts[KT_MATMUL_MAX_PARTS];
    int n_parts;
} mm_job;

static void mm_rows(mm_job *j, int ith, int r0, int r1) {
    if (r0 >= r1) return;
    void *panel = j->panels ? j->panels + (size_t)ith * j->panel_bytes : NULL;
    if (!j->simd) {
        rows_scalar(j->out, j->w, j->wtype, j->x, &j->xa, &j->xk, j->n_in, j->n_out,
                    j->n_tokens, r0, r1);
        return;
    }
#if defined(__x86_64__) || defined(__i386__)
    switch (j->wtype) {
    case KT_Q8_0:
        kt_matmul_q8_0_avx2(j->out, j->w, &j->xa, j->n_in, j->n_out, j->n_tokens, r0, r1, panel);
        break;
    case KT_Q4_0:
        kt_matmul_q4_0_avx2(j->out, j->w, &j->xa, j->n_in, j->n_out, j->n_tokens, r0, r1, panel);
        break;
    case KT_Q4_0_X8:
    case KT_Q8_0_X8:
    case KT_IQ4_NL_X8:
    case KT_MXFP4_X8:
        if (panel && kt_matmul_x8_amx_takes(j->wtype, j->n_tokens)) {
            kt_matmul_x8_amx(j->out, j->w, j->wtype, &j->xa, j->n_in, j->n_out, j->n_tokens, r0, r1, panel);
            break;
        }
        kt_matmul_x8_avx2(j->out, j->w, j->wtype, &j->xa, j->n_in, j->n_out, j->n_tokens, r0, r1);
        break;
    case KT_Q4_1_X8:
    case KT_Q5_0_X8:
    case KT_Q5_1_X8:
        kt_matmul_x8_avx2(j->out, j->w, j->wtype, &j->xa, j->n_in, j->n_out, j->n_tokens, r0, r1);
        break;
    case KT_Q4_1:
    case KT_Q5_0:
    case KT_Q5_1:
        kt_matmul_legacy_avx2(j->out, j->w, j->wtype, &j->xa, j->n_in, j->n_out, j->n_tokens,
                              r0, r1, panel);
        break;
    case KT_Q4_K_X8:
        kt_matmul_q4_K_x8_avx2(j->out, j->w, &j->xk, j->n_in, j->n_out, j->n_tokens, r0, r1);
        break;
    case KT_Q5_K_X8:
        kt_matmul_q5_K_x8_avx2(j->out, j->w, &j->xk, j->n_in, j->n_out, j->n_tokens, r0, r1);
        break;
    case KT_Q6_K_X8:
        kt_matmul_q6_K_x8_avx2(j->out, j->w, &j->xk, j->n_in, j->n_out, j->n_tokens, r0, r1);
        break;
    case KT_Q2_K_X8:
    case KT_Q3_K_X8:
    case KT_IQ4_XS_X8:
        kt_matmul_lowbit_x8_avx2(j->out, j->w, j->wtype, &j->xk, j->n_in, j->n_out, j->n_tokens, r0, r1);
        break;
    case KT_F32_X16:
    case KT_F16_X16:
    case KT_BF16_X16:
        kt_matmul_x16_avx2(j->out, j->w, kt_repack_plain(j->wtype), j->x, j->n_in, j->n_out, j->n_tokens, r0, r1);
        break;
    case KT_IQ4_NL:
        kt_matmul_iq4_nl_avx2(j->out, j->w, &j->xa, j->n_in, j->n_out, j->n_tokens, r0, r1);
        break;
    case KT_MXFP4:
        kt_matmul_mxfp4_avx2(j->out, j->w, &j->xa, j->n_in, j->n_out, j->n_tokens, r0, r1);
        break;
    case KT_Q2_K:
    case KT_Q3_K:
    case KT_Q4_K:
    case KT_Q5_K:
    case KT_Q6_K:
    case KT_IQ4_XS:
        kt_matmul_kq_avx2(j->out, j->w, j->wtype, &j->xk, j->n_in, j->n_out, j->n_tokens, r0,
                          r1);
        break;
    default:
        kt_matmul_float_avx2(j->out, j->w, j->wtype, j->x, j->n_in, j->n_out, j->n_tokens,
                             r0, r1);
        break;
    }
#endif
}

/* Each part's rows are split evenly between the threads (in grains of
 * ROW_GRAIN), so each thread does its share of every part in turn; the
 * job is copied with the part's matrix in place of the first. */
static void mm_task(void *ctx, int ith, int nth) {
    const mm_job *j = ctx;
    for (int p = 0; p < j->n_parts; p++) {
        mm_job jp = *j;
        jp.out = j->parts[p].out, jp.w = j->parts[p].w, jp.wtype = j->parts[p].wtype, jp.n_out = j->parts[p].n_out;
        long n_chunks = (jp.n_out + ROW_GRAIN - 1) / ROW_GRAIN, lo, hi;
        kt_split_range(n_chunks, ith, nth, &lo, &hi);
        int r0 = (int)(lo * ROW_GRAIN), r1 = (int)(hi * ROW_GRAIN);
        mm_rows(&jp, ith, r0, r1 < jp.n_out ? r1 : jp.n_out);
    }
}

static void quantize_tokens(mm_job *j, int t0, int t1) {
    for (int t = t0; t < t1; t++) {
        const float *xt = j->x + (size_t)t * j->n_in;
        if (is_kquant(j->wtype)) { /* the SIMD quantizer gives the scalar one's bits */
            size_t k = (size_t)t * j->xk.nb;
#if defined(__x86_64__) || defined(__i386__)
            if (j->simd) {
                kt_quantize_act_q8_K_avx2(xt, j->n_in, j->qs + k * QK_K, j->d + k, j->bsums + k * 16);
                continue;
            }
#endif
            kt_quantize_act_q8_K(xt, j->n_in, j->qs + k * QK_K, j->d + k, j->bsums + k * 16);
            continue;
        }
        size_t k = (size_t)t * j->xa.nb;
        if (j->simd) {
#if defined(__x86_64__) || defined(__i386__)
            kt_quantize_act_q8_avx2(xt, j->n_in, j->qs + k * QK8_0, j->d + k, j->c8 + k);
#endif
        } else {
            kt_quantize_act_q8_ref(xt, j->n_in, j->qs + k * QK8_0, j->d + k, j->c8 + k);
        }
    }
}

static void quantize_task(void *ctx, int ith, int nth) {
    mm_job *j = ctx;
    long lo, hi;
    kt_split_range(j->n_tokens, ith, nth, &lo, &hi);
    quantize_tokens(j, (int)lo, (int)hi);
}

/* How a weight type wants its activations: 2 Q8_K blocks (K-quants), 1
 * Q8_0 blocks, 0 floats as they are. */
static int act_kind(kt_dtype t) {
    return is_kquant(t) ? 2 : is_quant(t) ? 1 : 0;
}

/* Every part runs on its own if they cannot share one job. */
static bool parts_share(const kt_matmul_part *parts, int n_parts, int n_in) {
    if (n_parts > KT_MATMUL_MAX_PARTS) return false;
    for (int p = 0; p < n_parts; p++)
        if (!shape_ok(parts[p].wtype, n_in, parts[p].n_out) ||
            parts[p].n_out <= 0 || act_kind(parts[p].wtype) != act_kind(parts[0].wtype))
            return false;
    return true;
}

/* out of memory: the same answer (bit for bit), slowly */
static void parts_ref(const kt_matmul_part *parts, int n_parts, const float *x, int n_in, int n_tokens) {
    for (int p = 0; p < n_parts; p++)
        kt_matmul_ref(parts[p].out, parts[p].w, parts[p].wtype, x, n_in, parts[p].n_out, n_tokens);
}

void kt_matmul_many(kt_pool *pool, const kt_matmul_part *parts, int n_parts, const float *x, int n_in,
                    int n_tokens) {
    if (n_parts <= 0 || n_tokens <= 0) return;
    if (!parts_share(parts, n_parts, n_in)) {
        for (int p = 0; p < n_parts; p++)
            kt_matmul(pool, parts[p].out, parts[p].w, parts[p].wtype, x, n_in, parts[p].n_out, n_tokens);
        return;
    }
    const kt_dtype wtype = parts[0].wtype;
    mm_job j = {.wtype = wtype, .x = x, .n_in = n_in, .n_tokens = n_tokens, .simd = kt_cpu_has_avx2(),
                .n_parts = n_parts};
    memcpy(j.parts, parts, sizeof *parts * (size_t)n_parts);
    void *owned = NULL;
    if (is_quant(wtype)) {
        /* scratch: the quantized activations, then (the SIMD GEMM of the
         * 32-value formats) one panel per thread */
        size_t act = (kt_q8_act_bytes(n_in, n_tokens) + 63) / 64 * 64;
        bool panels = false, amx = false;
        for (int p = 0; p < n_parts; p++) {
            panels |= j.simd && n_tokens > 1 &&
                      (parts[p].wtype == KT_Q4_0 || parts[p].wtype == KT_Q8_0 || is_legacy(parts[p].wtype));
            amx |= kt_matmul_x8_amx_takes(parts[p].wtype, n_tokens);
        }
#if defined(__x86_64__) || defined(__i386__)
        if (panels) j.panel_bytes = kt_matmul_panel_bytes(n_in);
        if (amx && kt_matmul_amx_panel_bytes(n_in) > j.panel_bytes) j.panel_bytes = kt_matmul_amx_panel_bytes(n_in);
        panels |= amx;
#endif
        size_t need = act + 64 + (size_t)kt_pool_size(pool) * j.panel_bytes;
        void *buf = pool ? kt_pool_scratch(pool, need) : (owned = malloc(need));
        if (!buf) {
            parts_ref(parts, n_parts, x, n_in, n_tokens);
            return;
        }
        j.xa = kt_q8_act_carve(buf, n_in, n_tokens, &j.qs, &j.d, &j.c8);
        if (panels)
            j.panels = (char *)(((uintptr_t)buf + act + 63) & ~(uintptr_t)63);
        /* one token is ~n_in floats of work: not worth waking the pool */
        if (n_tokens == 1) quantize_tokens(&j, 0, 1);
        else kt_pool_run(pool, quantize_task, &j);
    } else if (is_kquant(wtype)) {
        size_t need = kt_q8k_act_bytes(n_in, n_tokens);
        void *buf = pool ? kt_pool_scratch(pool, need) : (owned = malloc(need));
        if (!buf) {
            parts_ref(parts, n_parts, x, n_in, n_tokens);
            return;
        }
        j.xk = kt_q8k_act_carve(buf, n_in, n_tokens, &j.qs, &j.d, &j.bsums);
        if (n_tokens == 1) quantize_tokens(&j, 0, 1);
        else kt_pool_run(pool, quantize_task, &j);
    }
    kt_pool_run(pool, mm_task, &j);
    free(owned);
}

void kt_matmul(kt_pool *pool, float *out, const void *w, kt_dtype wtype, const float *x,
               int n_in, int n_out, int n_tokens) {
    if (n_out <= 0 || n_tokens <= 0) return;
    if (!shape_ok(wtype, n_in, n_out)) {
        kt_matmul_ref(out, w, wtype, x, n_in, n_out, n_tokens); /* fills NaN */
        return;
    }
    const kt_matmul_part part = {out, w, wtype, n_out};
    kt_matmul_many(pool, &part, 1, x, n_in, n_tokens);
}
