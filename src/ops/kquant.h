/*
 * kquant.h - the K-quant block formats (Q2_K .. Q6_K, and Q8_K for
 * activations) and the non-linear IQ4_NL and IQ4_XS, bit-compatible with
 * GGUF/ggml, and their reference conversions from and to float.
 *
 * K-quants pack 256 values (QK_K) into a super-block with one or two fp16
 * factors and small per-sub-block scales:
 *
 *   Q4_K (144 bytes): d, dmin (fp16); 12 bytes holding 8 six-bit scales
 *        sc[j] and 8 six-bit mins m[j] (one per 32 values); 128 bytes of
 *        nibbles q.  value = d * sc[j] * q - dmin * m[j]
 *   Q5_K (176 bytes): as Q4_K, plus 32 bytes qh giving each q a fifth bit.
 *   Q6_K (210 bytes): 128 bytes ql (low 4 bits), 64 bytes qh (high 2 bits),
 *        16 int8 scales (one per 16 values), fp16 d.
 *        value = d * scales[j] * (q - 32)
 *   Q8_K (292 bytes): float d, int8 qs[256], int16 bsums[16] (sums of each
 *        16 values). Only for activations; never stored in files.
 *   Q2_K (84 bytes): 16 bytes scales (one per 16 values: low nibble the
 *        scale sc[g], high nibble the min m[g]); 64 bytes qs of 2-bit
 *        levels; fp16 d, dmin.  value = d * sc[g] * q - dmin * m[g]
 *   Q3_K (110 bytes): 32 bytes hmask (third bits), 64 bytes qs (low 2
 *        bits), 12 bytes holding 16 six-bit scales, fp16 d.
 *        value = d * (sc[g] - 32) * (q - 4), q = low 2 bits | third bit << 2
 *   IQ4_NL (18 bytes, 32 values): fp16 d, 16 bytes of nibbles, each an
 *        index into KT_IQ4NL_VALUES.  value = d * KT_IQ4NL_VALUES[q]
 *   IQ4_XS (136 bytes): fp16 d, uint16 scales_h (top 2 bits of 8 six-bit
 *        scales), 4 bytes scales_l (their low nibbles), 128 bytes of
 *        nibbles as IQ4_NL's.  value = d * (ls[j] - 32) * KT_IQ4NL_VALUES[q]
 *   MXFP4 (17 bytes, 32 values; OCP microscaling FP4): one E8M0 byte e,
 *        16 bytes of nibbles as IQ4_NL's, each an E2M1 code (sign, 2-bit
 *        exponent, 1-bit mantissa) read through KT_MXFP4_VALUES, which
 *        holds the E2M1 values doubled (so they are integers).
 *        value = 2^(e - 128) * KT_MXFP4_VALUES[q]  (2^(e-127) / 2: the
 *        halved scale undoes the doubling; kt_e8m0_half)
 *
 * The quantizers are ggml's reference ones (no importance matrix), written
 * again operation for operation so `kettle quantize` can reproduce
 * llama.cpp's bytes; see kquant.c for the element order of each format.
 * (IQ4_NL and IQ4_XS: ggml's quantize_iq4_nl / quantize_iq4_xs without
 * an importance matrix, which is what llama-quantize writes then.)
 */
#ifndef KT_OPS_KQUANT_H
#define KT_OPS_KQUANT_H

#include <stdint.h>
#include <string.h>

#define QK_K 256
#define K_SCALE_SIZE 12

typedef struct block_q4_K {
    uint16_t d;    /* fp16 scale of the scales */
    uint16_t dmin; /* fp16 scale of the mins */
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qs[QK_K / 2];
} block_q4_K;

typedef struct block_q5_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8]; /* fifth bits */
    uint8_t qs[QK_K / 2]; /* low nibbles */
} block_q5_K;

typedef struct block_q6_K {
    uint8_t ql[QK_K / 2];     /* low 4 bits */
    uint8_t qh[QK_K / 4];     /* high 2 bits */
    int8_t scales[QK_K / 16]; /* per 16 values */
    uint16_t d;               /* fp16 super-block scale */
} block_q6_K;

typedef struct block_q8_K {
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];
} block_q8_K;

/* Q2_K. Byte layout: scales[0..15] (value v's group g = v / 16: scale
 * scales[g] & 15, min scales[g] >> 4), qs[0..63], d, dmin. Value v = 128h
 * + 32k + l (h < 2, k < 4, l < 32) is bits 2k, 2k+1 of qs[32h + l]. */
typedef struct block_q2_K {
    uint8_t scales[QK_K / 16];
    uint8_t qs[QK_K / 4];
    uint16_t d;    /* fp16 scale of the scales */
    uint16_t dmin; /* fp16 scale of the mins */
} block_q2_K;

/* Q3_K. Byte layout: hmask[0..31], qs[0..63], scales[0..11], d. Value v
 * = 128h + 32k + l: low 2 bits = bits 2k, 2k+1 of qs[32h + l] (as Q2_K),
 * third bit = bit 4h + k (= v / 32) of hmask[l]. Scale of group g (v /
 * 16), 6 bits: low nibble of scales[g] (g < 8) or high nibble of
 * scales[g - 8] (g >= 8), top 2 bits = bits 2(g / 4), 2(g / 4)+1 of
 * scales[8 + g % 4]; stored + 32. */
typedef struct block_q3_K {
    uint8_t hmask[QK_K / 8];
    uint8_t qs[QK_K / 4];
    uint8_t scales[12];
    uint16_t d;
} block_q3_K;

#define QK4_NL 32

/* IQ4_NL. Byte layout: d, qs[0..15]; value j < 16 is the low nibble of
 * qs[j], value 16 + j its high nibble. */
typedef struct block_iq4_nl {
    uint16_t d;
    uint8_t qs[QK4_NL / 2];
} block_iq4_nl;

/* IQ4_XS. Byte layout: d (bytes 0-1), scales_h (2-3, little-endian),
 * scales_l (4-7), qs (8-135). Sub-block j (values 32j .. 32j+31) has the
 * 6-bit scale ls[j] = nibble j % 2 of scales_l[j / 2] (low first) | bits
 * 2j, 2j+1 of scales_h << 4, stored + 32; its values are qs[16j ..
 * 16j+15] as in IQ4_NL (low nibbles first). */
typedef struct block_iq4_xs {
    uint16_t d;
    uint16_t scales_h;
    uint8_t scales_l[QK_K / 64];
    uint8_t qs[QK_K / 2];
} block_iq4_xs;

/* The 16 levels of IQ4_NL and IQ4_XS (ggml's kvalues_iq4nl). */
extern const int8_t KT_IQ4NL_VALUES[16];

#define QK_MXFP4 32

/* MXFP4 (GGUF type 39). Byte layout: e, qs[0..15]; value j < 16 is the
 * low nibble of qs[j], value 16 + j its high nibble (as IQ4_NL). */
typedef struct block_mxfp4 {
    uint8_t e; /* E8M0: the block's scale is 2^(e - 127) */
    uint8_t qs[QK_MXFP4 / 2];
} block_mxfp4;

/* The 16 E2M1 values, doubled (ggml's kvalues_mxfp4): codes 0-7 are
 * 0, 0.5, 1, 1.5, 2, 3, 4, 6 times 2, codes 8-15 the same negated. */
extern const int8_t KT_MXFP4_VALUES[16];

/* ggml's GGML_E8M0_TO_FP32_HALF: 2^(e - 128), built from its bits (e < 2
 * a subnormal). Exact, a power of two, so a product with it (the matmul's
 * d_w * d_x) is exact too unless it underflows. */
static inline float kt_e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

_Static_assert(sizeof(block_q2_K) == 84, "block_q2_K is 84 bytes");
_Static_assert(sizeof(block_q3_K) == 110, "block_q3_K is 110 bytes");
_Static_assert(sizeof(block_iq4_nl) == 18, "block_iq4_nl is 18 bytes");
_Static_assert(sizeof(block_iq4_xs) == 136, "block_iq4_xs is 136 bytes");
_Static_assert(sizeof(block_mxfp4) == 17, "block_mxfp4 is 17 bytes");
_Static_assert(sizeof(block_q4_K) == 144, "block_q4_K is 144 bytes");
_Static_assert(sizeof(block_q5_K) == 176, "block_q5_K is 176 bytes");
_Static_assert(sizeof(block_q6_K) == 210, "block_q6_K is 210 bytes");
_Static_assert(sizeof(block_q8_K) == 292, "block_q8_K is 292 bytes");

/* Sub-block j (0..7) scale and min of a Q4_K/Q5_K scales array: ggml's
 * get_scale_min_k4. Bytes 0-3 hold sc[0..3] in their low 6 bits, bytes
 * 4-7 m[0..3]; bytes 8-11 hold the low 4 bits of sc[4..7] (low nibble) and
 * m[4..7] (high nibble), whose top 2 bits are the top bits of bytes 0-3
 * (sc) and 4-7 (m). */
void kt_kq_scale_min(int j, const uint8_t *scales, uint8_t *sc, uint8_t *m);

/* n values (a multiple of 256) <-> n / 256 blocks. */
void kt_quantize_row_q4_K(const float *x, block_q4_K *y, int64_t n);
void kt_quantize_row_q5_K(const float *x, block_q5_K *y, int64_t n);
void kt_quantize_row_q6_K(const float *x, block_q6_K *y, int64_t n);
void kt_dequantize_row_q4_K(const block_q4_K *y, float *x, int64_t n);
void kt_dequantize_row_q5_K(const block_q5_K *y, float *x, int64_t n);
void kt_dequantize_row_q6_K(const block_q6_K *y, float *x, int64_t n);
void kt_quantize_row_q2_K(const float *x, block_q2_K *y, int64_t n);
void kt_quantize_row_q3_K(const float *x, block_q3_K *y, int64_t n);
void kt_dequantize_row_q2_K(const block_q2_K *y, float *x, int64_t n);
void kt_dequantize_row_q3_K(const block_q3_K *y, float *x, int64_t n);
/* n a multiple of 32 (IQ4_NL) or of 256 (IQ4_XS). */
void kt_quantize_row_iq4_nl(const float *x, block_iq4_nl *y, int64_t n);
void kt_quantize_row_iq4_xs(const float *x, block_iq4_xs *y, int64_t n);
void kt_dequantize_row_iq4_nl(const block_iq4_nl *y, float *x, int64_t n);
void kt_dequantize_row_iq4_xs(const block_iq4_xs *y, float *x, int64_t n);
/* MXFP4, n a multiple of 32: ggml's quantize_row_mxfp4_ref (what
 * llama-quantize writes: MXFP4 has no importance-matrix variant) and
 * dequantize_row_mxfp4. */
void kt_quantize_row_mxfp4(const float *x, block_mxfp4 *y, int64_t n);
void kt_dequantize_row_mxfp4(const block_mxfp4 *y, float *x, int64_t n);

/* Group g's 6-bit scale (0..63, stored + 32) of a Q3_K scales array, and
 * sub-block j's (0..63) of an IQ4_XS block. */
int kt_q3_K_scale(const uint8_t *scales, int g);
int kt_iq4_xs_scale(const block_iq4_xs *b, int j);

/* Q8_K (activations), ggml's quantize_row_q8_K_ref, with the values, the
 * scales and the bsums of each block stored apart: block b's 256 values
 * at qs + 256 b, scale d[b], sums bsums + 16 b. An all-zero block gets
 * d = 0, zero values and zero sums. */
void kt_quantize_act_q8_K(const float *x, int64_t n, int8_t *qs, float *d, int16_t *bsums);

#endif
