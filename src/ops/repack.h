/*
 * repack.h - Q4_0 weights rewritten at load into the layout the SIMD
 * kernels read fastest (KT_Q4_0_X8), when the user asks for it
 * (kt_load_mode KT_LOAD_REPACK).
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
 * rows), so it is rewritten in place. Matrices whose row count is not a
 * multiple of 8 stay Q4_0. The values are the same; every kernel computes
 * the same bits from either layout (matmul.c), so repacking changes speed,
 * never results.
 */
#ifndef KT_OPS_REPACK_H
#define KT_OPS_REPACK_H

#include <stdbool.h>
#include <stddef.h>

#include "base/dtype.h"
#include "ops/quant.h"

#define KT_X8_ROWS 8

/* Can a matrix of this type and shape be stored as Q4_0x8? */
bool kt_repack_supported(kt_dtype type, int n_in, int n_out);

/* Rewrites a Q4_0 matrix (kt_repack_supported) in place as Q4_0x8. tmp:
 * KT_X8_ROWS rows of scratch, kt_dtype_row_bytes(KT_Q4_0, n_in) each. */
void kt_repack_q4_0_x8(void *w, int n_in, int n_out, void *tmp);

/* Block b of row r of a Q4_0x8 matrix, in Q4_0 form (the reference reads
 * the layout through this). */
void kt_q4_0_x8_block(const void *w, int n_in, int r, int b, block_q4_0 *out);

#endif
