/*
 * repack.h - Q4_0, Q8_0, IQ4_NL, MXFP4, Q4_1, Q2_K, Q3_K, IQ4_XS, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K and float weights
 * rewritten at load into the layout the SIMD kernels read fastest
 * (KT_Q4_0_X8, KT_Q8_0_X8, KT_IQ4_NL_X8, ..., KT_Q5_K_X8, KT_F32_X16, KT_F16_X16, KT_BF16_X16),
 * with kt_load_mode KT_LOAD_REPACK (the CLI's default).
 *
 * A GGUF Q4_0 matrix stores each row's blocks one after another (an fp16
 * scale, then 16 bytes of nibbles), so a kernel computing 8 rows at once
 * gathers 8 scattered scales and transposes 8 rows' nibbles for every
 * block, either per token (the GEMV) or into a panel per chunk of tokens
 * (the GEMM). Q4_0x8 does that once, at load, per group of 8 rows:
 *
 *   group g (rows 8g .. 8g+7) starts at byte g * 8 * row_bytes and holds
 *     nb x 128 bytes of nibbles: block b at b * 128, four 32-byte vectors;
 *       vector v, bytes 4r .. 4r+3 = bytes 4v .. 4v+3 of row 8g+r's qs
 *       (so v & 0x0F holds values 4v .. 4v+3 of each row in its lane, and
 *       (v >> 4) & 0x0F values 16+4v .. 16+4v+3)
 *     then nb x 16 bytes of scales: block b at nb * 128 + b * 16, the 8
 *       rows' fp16 d in row order.
 *
 * Same size as the Q4_0 matrix (8 x 18 = 128 + 16 bytes per block of 8
 * rows), so it is rewritten in place. IQ4_NLx8 is the same layout for
 * IQ4_NL, whose block is byte for byte Q4_0's (only the nibbles' levels
 * differ: KT_IQ4NL_VALUES[n] instead of n - 8). MXFP4x8 is that layout
 * for MXFP4 (its 16 nibble bytes come from offset 1 of its 17-byte
 * block), with the scales region holding per block the 8 rows' E8M0
 * exponent bytes in row order (nb x 8 bytes at nb * 128 + b * 8): 8 x
 * 17 = 128 + 8 bytes, in place.
 *
 * Q4_Kx8 does the same for Q4_K (super-blocks of 256 values): group g at
 * g * 8 * row_bytes holds, per block b, 1152 bytes at b * 1152:
 *     32 vectors of 32 bytes of nibbles: vector 8k + c, bytes 4r .. 4r+3
 *       = qs[32k + 4c .. 32k + 4c + 3] of row 8g+r (low nibbles: values
 *       64k + 4c .., of sub-block 2k; high: 64k + 32 + 4c .., of 2k + 1)
 *     3 vectors of 32 bytes of 6-bit scales and mins: vector u, bytes
 *       4r .. 4r+3 = scales[4u .. 4u+3] of row 8g+r (still packed)
 *     the 8 rows' fp16 d, then their fp16 dmin.
 * 8 x 144 bytes: in place as well.
 *
 * Q5_Kx8 is Q4_Kx8 with the fifth bits after the nibbles: per block b,
 * 1408 bytes at b * 1408: the 32 nibble vectors as Q4_Kx8's, 8 vectors of
 * qh (vector c, bytes 4r .. 4r+3 = qh[4c .. 4c+3] of row r: bit 2k of
 * each byte is the fifth bit of the same byte's low nibble in nibble
 * vector 8k + c, bit 2k + 1 of its high nibble), then the scales, d and
 * dmin as Q4_Kx8's. 8 x 176 bytes.
 *
 * Q6_Kx8 likewise for Q6_K, per block b 1680 bytes at b * 1680: 32
 * vectors of ql (vector w, bytes 4r .. 4r+3 = ql[4w .. 4w+3] of row r),
 * 16 of qh (qh[4w ..]), 4 of scales (scales[4u ..]), then the 8 fp16 d.
 *
 * Q2_Kx8, Q3_Kx8 and IQ4_XSx8 likewise, every 4-byte word of a block
 * interleaved (vector w, bytes 4r .. 4r+3 = word w of the part in row r)
 * and the fp16 fields as 8 rows' values in row order. Per block b:
 *   Q2_Kx8, 672 bytes at b * 672: 16 vectors of qs, 4 of scales, the
 *     8 d, the 8 dmin.
 *   Q3_Kx8, 880 bytes at b * 880: 8 vectors of hmask, 16 of qs, 3 of
 *     scales, the 8 d.
 *   IQ4_XSx8, 1088 bytes at b * 1088: 32 vectors of qs, 1 of scales_l,
 *     the 8 d, the 8 scales_h (little-endian 16-bit words).
 * Each is 8 plain blocks' bytes: in place.
 *
 * Q5_0x8 is Q4_0x8 plus the fifth bits: nb x 128 bytes of nibbles as
 * Q4_0x8's, then nb x 32 bytes of masks, then nb x 16 bytes of scales.
 * Block b's masks are 8 little-endian words M[0..7] at nb * 128 + b * 32:
 * bit 4r + k of M[v] is the fifth bit of value 4v + k of row 8g+r (qh
 * bit 4v + k), so M[v] lines up byte for byte with nibble vector v (v <
 * 4: low nibbles; v >= 4: high nibbles of vector v - 4): a mask-add, or
 * AVX2's byte shuffle and compare, puts the bits in place. 8 x 22 bytes
 * per block: in place too. Q4_1x8 and Q5_1x8 are Q4_0x8 and Q5_0x8 with
 * nb x 16 bytes of the 8 rows' fp16 minima after the scales (8 x 20 and
 * 8 x 24 bytes per block).
 *
 * Q8_0x8 is the same interleave for Q8_0, whose 32 values are bytes:
 * group g holds nb x 256 bytes of values, block b at b * 256, eight
 * 32-byte vectors (vector v, bytes 4r .. 4r+3 = qs[4v .. 4v+3] of row
 * 8g+r: values 4v .. 4v+3 of each row in its lane, as the Q4_0x8 vectors
 * give once unpacked), then nb x 16 bytes of the 8 rows' fp16 d. 8 x 34
 * = 256 + 16 bytes: in place.
 *
 * Matrices whose row count is not a multiple of 8 keep their type. The
 * values are the same; every kernel computes the same bits from either
 * layout (matmul.c), so repacking quantized weights changes speed, never
 * results.
 *
 * F32x16, F16x16 and BF16x16 put 16 rows of float weights side by side:
 * group g (rows 16g .. 16g+15) at g * 16 * row_bytes holds, for i = 0 ..
 * n_in - 1, value i of its 16 rows in row order (32 bytes, 64 for F32).
 * One load is then one column of 16 rows, which the GEMM multiplies by
 * one activation of each of its tokens (an outer product; see
 * matmul_x16_avx2.c for why that is faster). Any n_in; rows in multiples
 * of 16, in place. Their kernels sum each output with one fma per value
 * in the order i = 0, 1, ... (matmul.c), which is not the order of the
 * plain float kernels: repacking float weights changes the last bits of
 * the results (within the tolerance the tests state), not their values'
 * meaning. Every path over an x16 layout gives the same bits.
 */
#ifndef KT_OPS_REPACK_H
#define KT_OPS_REPACK_H

#include <stdbool.h>
#include <stddef.h>

#include "base/dtype.h"
#include "ops/kquant.h"
#include "ops/quant.h"

#define KT_X8_ROWS 8
#define KT_X16_ROWS 16

/* The repacked type of a matrix of this type and shape, or the type
 * itself when it is not repacked. */
kt_dtype kt_repack_type(kt_dtype type, int n_in, int n_out);
static inline bool kt_repack_supported(kt_dtype type, int n_in, int n_out) {
    return kt_repack_type(type, n_in, n_out) != type;
}

/* Bytes of scratch kt_repack needs for a matrix of this type and row
 * length: one group of rows. */
size_t kt_repack_tmp_bytes(kt_dtype type, int n_in);

/* Rewrites a matrix (kt_repack_supported) in place in its repacked layout.
 * tmp: kt_repack_tmp_bytes(type, n_in) bytes of scratch. */
void kt_repack(void *w, kt_dtype type, int n_in, int n_out, void *tmp);

/* Block b of row r of a repacked matrix whose plain type is `type`, back
 * in that type's form at out (the reference reads the layouts through
 * this). */
void kt_x8_block(const void *w, kt_dtype type, int n_in, int r, int b, void *out);

/* The plain type a repacked type was made from; the type itself when it
 * is not a repacked one. */
kt_dtype kt_repack_plain(kt_dtype packed);

/* Row r of a matrix of type `type` (plain or repacked, n_in values a row)
 * as floats: the embedding lookup of a table that is also the output
 * matrix (tied embeddings), repacked for the output's GEMV. */
void kt_repack_row_f32(const void *w, kt_dtype type, int n_in, int r, float *out);

/* Value i of row r of an x16 matrix whose plain type (F32, F16 or BF16)
 * has elements of esz bytes: where it is. */
static inline const void *kt_x16_at(const void *w, int esz, int n_in, int r, int i) {
    return (const char *)w + ((size_t)(r / KT_X16_ROWS) * KT_X16_ROWS * (size_t)n_in +
                              (size_t)i * KT_X16_ROWS + (size_t)(r % KT_X16_ROWS)) * (size_t)esz;
}

/* Bytes per block of the 32-value x8 layouts' regions (see above): 8 rows'
 * nibbles, and (Q5_0x8, Q5_1x8) their fifth-bit masks. */
#define KT_X8_QS_BYTES (KT_X8_ROWS * QK4_0 / 2)
#define KT_X8_QH_BYTES (KT_X8_ROWS * 4)
/* Q8_0x8: 8 rows' 32 bytes of values a block */
#define KT_Q8X8_QS_BYTES (KT_X8_ROWS * QK8_0)

/* Bytes of one block of a Q4_Kx8 / Q5_Kx8 / Q6_Kx8 group, and the
 * offsets in it. */
#define KT_Q4KX8_BLOCK_BYTES (KT_X8_ROWS * 144)
#define KT_Q4KX8_SCALES 1024
#define KT_Q4KX8_D (1024 + 96)
#define KT_Q4KX8_DMIN (1024 + 96 + 16)
#define KT_Q5KX8_BLOCK_BYTES (KT_X8_ROWS * 176)
#define KT_Q5KX8_QH 1024
#define KT_Q5KX8_SCALES (1024 + 256)
#define KT_Q5KX8_D (1024 + 256 + 96)
#define KT_Q5KX8_DMIN (1024 + 256 + 96 + 16)
#define KT_Q6KX8_BLOCK_BYTES (KT_X8_ROWS * 210)
#define KT_Q6KX8_QH 1024
#define KT_Q6KX8_SCALES (1024 + 512)
#define KT_Q6KX8_D (1024 + 512 + 128)
#define KT_Q2KX8_BLOCK_BYTES (KT_X8_ROWS * 84)
#define KT_Q2KX8_SCALES 512
#define KT_Q2KX8_D (512 + 128)
#define KT_Q2KX8_DMIN (512 + 128 + 16)
#define KT_Q3KX8_BLOCK_BYTES (KT_X8_ROWS * 110)
#define KT_Q3KX8_QS 256
#define KT_Q3KX8_SCALES (256 + 512)
#define KT_Q3KX8_D (256 + 512 + 96)
#define KT_IQ4XSX8_BLOCK_BYTES (KT_X8_ROWS * 136)
#define KT_IQ4XSX8_SCALES_L 1024
#define KT_IQ4XSX8_D (1024 + 32)
#define KT_IQ4XSX8_SCALES_H (1024 + 32 + 16)

#endif
