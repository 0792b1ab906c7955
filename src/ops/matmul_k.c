/*
 * matmul_k.c - the scalar specification of the K-quant dot products
 * (Q2_K .. Q6_K and IQ4_XS weights times Q8_K activations; IQ4_NL's and
 * MXFP4's integer block dots with Q8_0 activations) and the layout of the Q8_K
 * activation buffer; see internal.h for the exact operations.
 *
 * Integer parts are exact, so only the two float steps per block are
 * fixed; kt_matmul_ref and the scalar fallback (matmul.c) call
 * kt_kq_block_step block by block, and the AVX2 kernels
 * (matmul_k_avx2.c) form the same integers with maddubs/madd and apply the
 * same fmaf steps, so all three agree bit for bit.
 */
#include <math.h>
#include <stdint.h>

#include "base/fp16.h"
#include "ops/internal.h"
#include "ops/kquant.h"

/* sum_j sc[j] * <levels of sub-block j, x> and sum_j m[j] * (its two
 * bsums) of a Q4_K or Q5_K block, whose 256 levels (0..31) are in lv. */
static void affine_sums(const uint8_t *scales, const uint8_t *lv, const int8_t *xq,
                        const int16_t *bs, int32_t *isum, int32_t *imin) {
    *isum = 0;
    *imin = 0;
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t sc, m;
        kt_kq_scale_min(j, scales, &sc, &m);
        int32_t s = 0;
        for (int l = 0; l < 32; l++) s += lv[32 * j + l] * xq[32 * j + l];
        *isum += sc * s;
        *imin += m * (bs[2 * j] + bs[2 * j + 1]);
    }
}

/* The 256 levels of a Q4_K block, in value order. */
static void q4_K_levels(const block_q4_K *blk, uint8_t *lv) {
    for (int k = 0; k < 4; k++)
        for (int l = 0; l < 32; l++) {
            lv[64 * k + l] = blk->qs[32 * k + l] & 0xF;
            lv[64 * k + 32 + l] = blk->qs[32 * k + l] >> 4;
        }
}

static void q5_K_levels(const block_q5_K *blk, uint8_t *lv) {
    for (int k = 0; k < 4; k++)
        for (int l = 0; l < 32; l++) {
            lv[64 * k + l] = (uint8_t)((blk->qs[32 * k + l] & 0xF) |
                                       (((blk->qh[l] >> (2 * k)) & 1) << 4));
            lv[64 * k + 32 + l] = (uint8_t)((blk->qs[32 * k + l] >> 4) |
                                            (((blk->qh[l] >> (2 * k + 1)) & 1) << 4));
        }
}

/* sum_g sc[g] * sum_l (q - 32) * x over a Q6_K block. */
static int32_t q6_K_isum(const block_q6_K *blk, const int8_t *xq) {
    int32_t isum = 0;
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = blk->ql + 64 * h, *qh = blk->qh + 32 * h;
        for (int quarter = 0; quarter < 4; quarter++) {
            for (int half16 = 0; half16 < 2; half16++) {
                const int v0 = 128 * h + 32 * quarter + 16 * half16;
                int32_t s = 0;
                for (int i = 0; i < 16; i++) {
                    const int l = 16 * half16 + i;
                    const int lo = quarter & 1 ? ql[l + 32] : ql[l];
                    const int nib = quarter < 2 ? lo & 0xF : lo >> 4;
                    const int q = nib | (((qh[l] >> (2 * quarter)) & 3) << 4);
                    s += (q - 32) * xq[v0 + i];
                }
                isum += blk->scales[v0 / 16] * s;
            }
        }
    }
    return isum;
}

/* The 2-bit field of value v of a Q2_K/Q3_K block's qs (kquant.h). */
static int q2_field(const uint8_t *qs, int v) {
    return (qs[32 * (v / 128) + v % 32] >> (2 * (v % 128 / 32))) & 3;
}

/* Q2_K: sum_g sc[g] * sum_l q * x and sum_g m[g] * bs[g], 16 groups. */
static void q2_K_sums(const block_q2_K *blk, const int8_t *xq, const int16_t *bs, int32_t *isum,
                      int32_t *imin) {
    *isum = *imin = 0;
    for (int g = 0; g < QK_K / 16; g++) {
        int32_t s = 0;
        for (int l = 0; l < 16; l++) s += q2_field(blk->qs, 16 * g + l) * xq[16 * g + l];
        *isum += (blk->scales[g] & 0xF) * s;
        *imin += (blk->scales[g] >> 4) * bs[g];
    }
}

/* Q3_K: sum_g (sc[g] - 32) * sum_l (q - 4) * x. */
static int32_t q3_K_isum(const block_q3_K *blk, const int8_t *xq) {
    int32_t isum = 0;
    for (int g = 0; g < QK_K / 16; g++) {
        int32_t s = 0;
        for (int l = 0; l < 16; l++) {
            const int v = 16 * g + l;
            const int q = q2_field(blk->qs, v) | (((blk->hmask[v % 32] >> (v / 32)) & 1) << 2);
            s += (q - 4) * xq[v];
        }
        isum += (kt_q3_K_scale(blk->scales, g) - 32) * s;
    }
    return isum;
}

/* IQ4_XS: sum_j (ls[j] - 32) * sum_l KT_IQ4NL_VALUES[q] * x. */
static int32_t iq4_xs_isum(const block_iq4_xs *blk, const int8_t *xq) {
    int32_t isum = 0;
    for (int j = 0; j < QK_K / 32; j++) {
        const uint8_t *qs = blk->qs + 16 * j;
        const int8_t *x = xq + 32 * j;
        int32_t s = 0;
        for (int l = 0; l < 16; l++)
            s += KT_IQ4NL_VALUES[qs[l] & 0xF] * x[l] + KT_IQ4NL_VALUES[qs[l] >> 4] * x[16 + l];
        isum += (kt_iq4_xs_scale(blk, j) - 32) * s;
    }
    return isum;
}

int32_t kt_iq4_nl_idot(const void *row, int b, const int8_t *xq) {
    const block_iq4_nl *blk = (const block_iq4_nl *)row + b;
    int32_t s = 0;
    for (int l = 0; l < 16; l++)
        s += KT_IQ4NL_VALUES[blk->qs[l] & 0xF] * xq[l] + KT_IQ4NL_VALUES[blk->qs[l] >> 4] * xq[16 + l];
    return s;
}

int32_t kt_mxfp4_idot(const void *row, int b, const int8_t *xq) {
    const block_mxfp4 *blk = (const block_mxfp4 *)row + b;
    int32_t s = 0;
    for (int l = 0; l < 16; l++)
        s += KT_MXFP4_VALUES[blk->qs[l] & 0xF] * xq[l] + KT_MXFP4_VALUES[blk->qs[l] >> 4] * xq[16 + l];
    return s;
}

float kt_kq_block_step(kt_dtype t, const void *row, int b, const int8_t *xq, float dx,
                       const int16_t *bs, float acc) {
    uint8_t lv[QK_K];
    int32_t isum, imin;
    float d, dmin;
    if (t == KT_Q3_K) {
        const block_q3_K *blk = (const block_q3_K *)row + b;
        return fmaf((float)q3_K_isum(blk, xq), kt_fp16_to_fp32(blk->d) * dx, acc);
    }
    if (t == KT_IQ4_XS) {
        const block_iq4_xs *blk = (const block_iq4_xs *)row + b;
        return fmaf((float)iq4_xs_isum(blk, xq), kt_fp16_to_fp32(blk->d) * dx, acc);
    }
    if (t == KT_Q2_K) {
        const block_q2_K *blk = (const block_q2_K *)row + b;
        q2_K_sums(blk, xq, bs, &isum, &imin);
        acc = fmaf((float)isum, kt_fp16_to_fp32(blk->d) * dx, acc);
        return fmaf((float)-imin, kt_fp16_to_fp32(blk->dmin) * dx, acc);
    }
    if (t == KT_Q6_K) {
        const block_q6_K *blk = (const block_q6_K *)row + b;
        return fmaf((float)q6_K_isum(blk, xq), kt_fp16_to_fp32(blk->d) * dx, acc);
    }
    if (t == KT_Q4_K) {
        const block_q4_K *blk = (const block_q4_K *)row + b;
        q4_K_levels(blk, lv);
        affine_sums(blk->scales, lv, xq, bs, &isum, &imin);
        d = kt_fp16_to_fp32(blk->d);
        dmin = kt_fp16_to_fp32(blk->dmin);
    } else {
        const block_q5_K *blk = (const block_q5_K *)row + b;
        q5_K_levels(blk, lv);
        affine_sums(blk->scales, lv, xq, bs, &isum, &imin);
        d = kt_fp16_to_fp32(blk->d);
        dmin = kt_fp16_to_fp32(blk->dmin);
    }
    acc = fmaf((float)isum, d * dx, acc);
    return fmaf((float)-imin, dmin * dx, acc);
}

/* ---- the activation buffer ---------------------------------------------- */

#define ACT_ALIGN 64

static size_t align_up(size_t n) {
    return (n + ACT_ALIGN - 1) / ACT_ALIGN * ACT_ALIGN;
}

size_t kt_q8k_act_bytes(int n_in, int n_tokens) {
    size_t nb = (size_t)(n_in / QK_K) * (size_t)n_tokens;
    return align_up(nb * QK_K) + align_up(nb * sizeof(float)) +
           align_up(nb * 16 * sizeof(int16_t)) + ACT_ALIGN;
}

kt_q8k_act kt_q8k_act_carve(void *scratch, int n_in, int n_tokens, int8_t **qs, float **d,
                            int16_t **bsums) {
    size_t nb = (size_t)(n_in / QK_K) * (size_t)n_tokens;
    uintptr_t p = ((uintptr_t)scratch + ACT_ALIGN - 1) & ~(uintptr_t)(ACT_ALIGN - 1);
    *qs = (int8_t *)p;
    *d = (float *)(p + align_up(nb * QK_K));
    *bsums = (int16_t *)(p + align_up(nb * QK_K) + align_up(nb * sizeof(float)));
    return (kt_q8k_act){.qs = *qs, .d = *d, .bsums = *bsums, .nb = n_in / QK_K};
}
