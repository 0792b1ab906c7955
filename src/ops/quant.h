/*
 * quant.h - quantized block formats (bit-compatible with GGUF/ggml) and the
 * reference conversions between them and float.
 *
 * The quantizers are the reference ones that ggml uses, so `kettle quantize`
 * reproduces llama.cpp's bytes exactly (see ../shared/docs/FORMATS.md).
 */
#ifndef KT_OPS_QUANT_H
#define KT_OPS_QUANT_H

#include <stdbool.h>
#include <stdint.h>

#include "base/dtype.h"

#define QK8_0 32
#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32

typedef struct block_q8_0 {
    uint16_t d; /* fp16 scale */
    int8_t qs[QK8_0];
} block_q8_0;

typedef struct block_q4_0 {
    uint16_t d; /* fp16 scale */
    uint8_t qs[QK4_0 / 2]; /* j < 16: low nibble of qs[j]; j+16: high nibble */
} block_q4_0;

/* The legacy 32-value types llama.cpp falls back to for rows that are not
 * a multiple of 256 (Q4_K -> Q5_0, Q5_K -> Q5_1). Element j < 16 is the
 * low nibble of qs[j], element j + 16 its high nibble; for the 5-bit types
 * bit j of qh (a little-endian uint32) is element j's fifth bit.
 *   Q4_1: x = q * d + m            (q 0..15)
 *   Q5_0: x = (q - 16) * d         (q 0..31)
 *   Q5_1: x = q * d + m            (q 0..31) */
typedef struct block_q4_1 {
    uint16_t d; /* fp16 scale */
    uint16_t m; /* fp16 minimum */
    uint8_t qs[QK4_1 / 2];
} block_q4_1;

typedef struct block_q5_0 {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[QK5_0 / 2];
} block_q5_0;

typedef struct block_q5_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qh[4];
    uint8_t qs[QK5_1 / 2];
} block_q5_1;

_Static_assert(sizeof(block_q4_1) == 20, "block_q4_1 is 20 bytes");
_Static_assert(sizeof(block_q5_0) == 22, "block_q5_0 is 22 bytes");
_Static_assert(sizeof(block_q5_1) == 24, "block_q5_1 is 24 bytes");
_Static_assert(sizeof(block_q8_0) == 34, "block_q8_0 is 34 bytes");
_Static_assert(sizeof(block_q4_0) == 18, "block_q4_0 is 18 bytes");

/* Types kt_quantize_row can produce: F32, F16, BF16, Q8_0, Q4_0, Q4_1,
 * Q5_0, Q5_1, the K-quants Q2_K .. Q6_K and IQ4_NL, IQ4_XS, MXFP4
 * (kquant.h). */
bool kt_quantize_supported(kt_dtype type);
/* Types kt_dequantize_row can read: the same. */
bool kt_dequantize_supported(kt_dtype type);

/* x: n floats -> out: kt_dtype_row_bytes(type, n) bytes. n must be a
 * multiple of the block size. */
void kt_quantize_row(kt_dtype type, const float *x, void *out, int64_t n);
void kt_dequantize_row(kt_dtype type, const void *in, float *out, int64_t n);

#endif
