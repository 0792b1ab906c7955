/*
 * kquant.h - the K-quant block formats (Q4_K, Q5_K, Q6_K, and Q8_K for
 * activations), bit-compatible with GGUF/ggml, and their reference
 * conversions from and to float.
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
 *
 * The quantizers are ggml's reference ones (no importance matrix), written
 * again operation for operation so `kettle quantize` can reproduce
 * llama.cpp's bytes; see kquant.c for the element order of each format.
 */
#ifndef KT_OPS_KQUANT_H
#define KT_OPS_KQUANT_H

#include <stdint.h>

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

/* Q8_K (activations), ggml's quantize_row_q8_K_ref, with the values, the
 * scales and the bsums of each block stored apart: block b's 256 values
 * at qs + 256 b, scale d[b], sums bsums + 16 b. An all-zero block gets
 * d = 0, zero values and zero sums. */
void kt_quantize_act_q8_K(const float *x, int64_t n, int8_t *qs, float *d, int16_t *bsums);

#endif
