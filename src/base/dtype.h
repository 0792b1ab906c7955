/*
 * dtype.h - tensor element types, with GGUF's (ggml's) numeric ids.
 *
 * A row of n values of a block type takes n / block_size blocks of
 * block_bytes each; n must be a multiple of block_size. The ids are part of
 * the GGUF format and must never change.
 */
#ifndef KT_BASE_DTYPE_H
#define KT_BASE_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum kt_dtype {
    KT_F32 = 0,
    KT_F16 = 1,
    KT_Q4_0 = 2,
    KT_Q4_1 = 3,
    KT_Q5_0 = 6,
    KT_Q5_1 = 7,
    KT_Q8_0 = 8,
    KT_Q8_1 = 9,
    KT_Q2_K = 10,
    KT_Q3_K = 11,
    KT_Q4_K = 12,
    KT_Q5_K = 13,
    KT_Q6_K = 14,
    KT_Q8_K = 15,
    KT_IQ4_NL = 20, /* 32 values: fp16 d, 16 bytes of indices into a 16-entry table */
    KT_IQ4_XS = 23, /* 256 values: IQ4_NL's table with 6-bit scales per 32 */
    KT_I8 = 24,
    KT_I16 = 25,
    KT_I32 = 26,
    KT_I64 = 27,
    KT_F64 = 28,
    KT_BF16 = 30,
    KT_MXFP4 = 39, /* 32 values: E8M0 exponent byte, 16 bytes of E2M1 nibbles (OCP MX) */
    KT_DTYPE_COUNT = 40,
    /* kettle's in-memory layouts: never read from or written to a file
     * (past KT_DTYPE_COUNT, so kt_dtype_known() rejects them in a GGUF
     * header), but kt_dtype_get/name/row_bytes describe them */
    KT_Q4_0_X8 = 64, /* Q4_0 repacked by groups of 8 rows (ops/repack.h) */
    KT_Q4_K_X8 = 65, /* Q4_K likewise */
    KT_Q6_K_X8 = 66, /* Q6_K likewise */
    KT_Q5_0_X8 = 67, /* Q5_0 likewise */
    KT_Q4_1_X8 = 68, /* Q4_1 likewise */
    KT_Q5_1_X8 = 69, /* Q5_1 likewise */
    KT_F32_X16 = 70,  /* F32 with 16 rows side by side (ops/repack.h) */
    KT_F16_X16 = 71,  /* F16 likewise */
    KT_BF16_X16 = 72, /* BF16 likewise */
    KT_Q5_K_X8 = 73,  /* Q5_K repacked by groups of 8 rows (ops/repack.h) */
    KT_IQ4_NL_X8 = 74, /* IQ4_NL likewise (Q4_0x8's layout) */
    KT_Q2_K_X8 = 75,   /* Q2_K repacked by groups of 8 rows (ops/repack.h) */
    KT_Q3_K_X8 = 76,   /* Q3_K likewise */
    KT_IQ4_XS_X8 = 77, /* IQ4_XS likewise */
    KT_MXFP4_X8 = 78,  /* MXFP4 likewise (Q4_0x8's nibbles, then 8 exponent bytes) */
    KT_Q8_0_X8 = 79    /* Q8_0 likewise (8 vectors of 8 rows' bytes a block, then the scales) */
} kt_dtype;

typedef struct kt_dtype_info {
    const char *name;   /* "Q4_0"; NULL for ids no format uses */
    int block_size;     /* values per block (1 for plain types) */
    int block_bytes;    /* bytes per block */
} kt_dtype_info;

/* NULL-name entry for unknown ids; check kt_dtype_known() first (a file
 * type) -- the in-memory layouts are described but not "known". */
const kt_dtype_info *kt_dtype_get(uint32_t id);
bool kt_dtype_known(uint32_t id);
const char *kt_dtype_name(uint32_t id);
/* Parses "q4_0", "Q8_0", "f16"... (case-insensitive); -1 if unknown. */
int kt_dtype_parse(const char *name);
/* Bytes of a row of n values; 0 if n is not a multiple of the block. */
size_t kt_dtype_row_bytes(kt_dtype t, int64_t n);

#endif
