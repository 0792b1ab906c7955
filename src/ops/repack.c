/*
 * repack.c - the x8 and x16 layouts (see repack.h): writing them, and
 * reading an x8 block back (kt_x16_at finds an x16 value). For the x8
 * layouts, one table per layout says where each part of a plain block
 * (its packed values as 4-byte words, its fp16 scales) goes in a group of
 * 8 rows; one pair of loops moves the parts either way. The x16 layouts
 * are a transposition of each group of 16 rows. Scalar and
 * simple: it runs once per matrix at load (about 0.1 s for a 636 MB
 * Q4_K_M file: `kettle run` load time 285-290 ms with --load repack,
 * 167-225 with copy, file in the page cache) and in the reference
 * kernels.
 */
#include "ops/repack.h"

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

/* A part of a block: n units of width bytes (4: a word of packed values,
 * 2: an fp16, 1: MXFP4's exponent) at offset off of the plain block; unit v of row r sits in
 * the group at  nb * per_nb + b * per_b + at + 8 * width * v + width * r. */
typedef struct x8_part {
    size_t off;
    int n, width;
    size_t per_nb, per_b, at;
} x8_part;

typedef struct x8_layout {
    kt_dtype plain, packed;
    int n_parts;
    x8_part parts[5];
    /* Q5_0's fifth bits, which move by nibbles: offset of qh in the plain
     * block, and of the block's 8 mask words in the group (per_nb, per_b);
     * no qh part when per_b is 0 */
    size_t qh_off, qh_per_nb, qh_per_b;
} x8_layout;

#define Q4_0_QS KT_X8_QS_BYTES /* 128: one block of 8 rows' nibbles */
#define Q5_0_QH KT_X8_QH_BYTES /* 32: one block of 8 rows' fifth bits */

static const x8_layout LAYOUTS[] = {
    {KT_Q4_0, KT_Q4_0_X8, 2, {{offsetof(block_q4_0, qs), 4, 4, 0, Q4_0_QS, 0},
                              {offsetof(block_q4_0, d), 1, 2, Q4_0_QS, 2 * KT_X8_ROWS, 0}}, 0, 0, 0},
    /* IQ4_NL's block is Q4_0's (fp16 d, 16 bytes of nibbles): the same moves */
    {KT_IQ4_NL, KT_IQ4_NL_X8, 2, {{offsetof(block_iq4_nl, qs), 4, 4, 0, Q4_0_QS, 0},
                                  {offsetof(block_iq4_nl, d), 1, 2, Q4_0_QS, 2 * KT_X8_ROWS, 0}}, 0, 0, 0},
    /* MXFP4: Q4_0's nibble moves from offset 1, then per block the 8 rows'
     * exponent bytes (8 x 17 = 128 + 8 bytes: in place) */
    {KT_MXFP4, KT_MXFP4_X8, 2, {{offsetof(block_mxfp4, qs), 4, 4, 0, Q4_0_QS, 0},
                                {offsetof(block_mxfp4, e), 1, 1, Q4_0_QS, KT_X8_ROWS, 0}}, 0, 0, 0},
    /* Q8_0: 8 words of bytes a block, the same interleave (8 x 34 = 256 +
     * 16 bytes: in place) */
    {KT_Q8_0, KT_Q8_0_X8, 2, {{offsetof(block_q8_0, qs), 8, 4, 0, KT_Q8X8_QS_BYTES, 0},
                              {offsetof(block_q8_0, d), 1, 2, KT_Q8X8_QS_BYTES, 2 * KT_X8_ROWS, 0}}, 0, 0, 0},
    {KT_Q5_0, KT_Q5_0_X8, 2, {{offsetof(block_q5_0, qs), 4, 4, 0, Q4_0_QS, 0},
                              {offsetof(block_q5_0, d), 1, 2, Q4_0_QS + Q5_0_QH, 2 * KT_X8_ROWS, 0}},
     offsetof(block_q5_0, qh), Q4_0_QS, Q5_0_QH},
    {KT_Q4_1, KT_Q4_1_X8, 3, {{offsetof(block_q4_1, qs), 4, 4, 0, Q4_0_QS, 0},
                              {offsetof(block_q4_1, d), 1, 2, Q4_0_QS, 2 * KT_X8_ROWS, 0},
                              {offsetof(block_q4_1, m), 1, 2, Q4_0_QS + 2 * KT_X8_ROWS, 2 * KT_X8_ROWS, 0}}, 0, 0, 0},
    {KT_Q5_1, KT_Q5_1_X8, 3, {{offsetof(block_q5_1, qs), 4, 4, 0, Q4_0_QS, 0},
                              {offsetof(block_q5_1, d), 1, 2, Q4_0_QS + Q5_0_QH, 2 * KT_X8_ROWS, 0},
                              {offsetof(block_q5_1, m), 1, 2, Q4_0_QS + Q5_0_QH + 2 * KT_X8_ROWS, 2 * KT_X8_ROWS, 0}},
     offsetof(block_q5_1, qh), Q4_0_QS, Q5_0_QH},
    {KT_Q4_K, KT_Q4_K_X8, 4, {{offsetof(block_q4_K, qs), 32, 4, 0, KT_Q4KX8_BLOCK_BYTES, 0},
                  {offsetof(block_q4_K, scales), 3, 4, 0, KT_Q4KX8_BLOCK_BYTES, KT_Q4KX8_SCALES},
                  {offsetof(block_q4_K, d), 1, 2, 0, KT_Q4KX8_BLOCK_BYTES, KT_Q4KX8_D},
                  {offsetof(block_q4_K, dmin), 1, 2, 0, KT_Q4KX8_BLOCK_BYTES, KT_Q4KX8_DMIN}}, 0, 0, 0},
    {KT_Q5_K, KT_Q5_K_X8, 5, {{offsetof(block_q5_K, qs), 32, 4, 0, KT_Q5KX8_BLOCK_BYTES, 0},
                  {offsetof(block_q5_K, qh), 8, 4, 0, KT_Q5KX8_BLOCK_BYTES, KT_Q5KX8_QH},
                  {offsetof(block_q5_K, scales), 3, 4, 0, KT_Q5KX8_BLOCK_BYTES, KT_Q5KX8_SCALES},
                  {offsetof(block_q5_K, d), 1, 2, 0, KT_Q5KX8_BLOCK_BYTES, KT_Q5KX8_D},
                  {offsetof(block_q5_K, dmin), 1, 2, 0, KT_Q5KX8_BLOCK_BYTES, KT_Q5KX8_DMIN}}, 0, 0, 0},
    {KT_Q2_K, KT_Q2_K_X8, 4, {{offsetof(block_q2_K, qs), 16, 4, 0, KT_Q2KX8_BLOCK_BYTES, 0},
                  {offsetof(block_q2_K, scales), 4, 4, 0, KT_Q2KX8_BLOCK_BYTES, KT_Q2KX8_SCALES},
                  {offsetof(block_q2_K, d), 1, 2, 0, KT_Q2KX8_BLOCK_BYTES, KT_Q2KX8_D},
                  {offsetof(block_q2_K, dmin), 1, 2, 0, KT_Q2KX8_BLOCK_BYTES, KT_Q2KX8_DMIN}}, 0, 0, 0},
    {KT_Q3_K, KT_Q3_K_X8, 4, {{offsetof(block_q3_K, hmask), 8, 4, 0, KT_Q3KX8_BLOCK_BYTES, 0},
                  {offsetof(block_q3_K, qs), 16, 4, 0, KT_Q3KX8_BLOCK_BYTES, KT_Q3KX8_QS},
                  {offsetof(block_q3_K, scales), 3, 4, 0, KT_Q3KX8_BLOCK_BYTES, KT_Q3KX8_SCALES},
                  {offsetof(block_q3_K, d), 1, 2, 0, KT_Q3KX8_BLOCK_BYTES, KT_Q3KX8_D}}, 0, 0, 0},
    {KT_IQ4_XS, KT_IQ4_XS_X8, 4, {{offsetof(block_iq4_xs, qs), 32, 4, 0, KT_IQ4XSX8_BLOCK_BYTES, 0},
                  {offsetof(block_iq4_xs, scales_l), 1, 4, 0, KT_IQ4XSX8_BLOCK_BYTES, KT_IQ4XSX8_SCALES_L},
                  {offsetof(block_iq4_xs, d), 1, 2, 0, KT_IQ4XSX8_BLOCK_BYTES, KT_IQ4XSX8_D},
                  {offsetof(block_iq4_xs, scales_h), 1, 2, 0, KT_IQ4XSX8_BLOCK_BYTES, KT_IQ4XSX8_SCALES_H}}, 0, 0, 0},
    {KT_Q6_K, KT_Q6_K_X8, 4, {{offsetof(block_q6_K, ql), 32, 4, 0, KT_Q6KX8_BLOCK_BYTES, 0},
                  {offsetof(block_q6_K, qh), 16, 4, 0, KT_Q6KX8_BLOCK_BYTES, KT_Q6KX8_QH},
                  {offsetof(block_q6_K, scales), 4, 4, 0, KT_Q6KX8_BLOCK_BYTES, KT_Q6KX8_SCALES},
                  {offsetof(block_q6_K, d), 1, 2, 0, KT_Q6KX8_BLOCK_BYTES, KT_Q6KX8_D}}, 0, 0, 0},
};

static const x8_layout *layout_of(kt_dtype plain) {
    for (size_t i = 0; i < sizeof LAYOUTS / sizeof LAYOUTS[0]; i++)
        if (LAYOUTS[i].plain == plain) return &LAYOUTS[i];
    return NULL;
}

/* the x16 form of a float type, or KT_DTYPE_COUNT */
static kt_dtype x16_of(kt_dtype plain) {
    return plain == KT_F32 ? KT_F32_X16 : plain == KT_F16 ? KT_F16_X16 : plain == KT_BF16 ? KT_BF16_X16
                                                                                         : KT_DTYPE_COUNT;
}

kt_dtype kt_repack_type(kt_dtype type, int n_in, int n_out) {
    if (n_in <= 0 || n_out <= 0) return type;
    if (x16_of(type) != KT_DTYPE_COUNT) return n_out % KT_X16_ROWS == 0 ? x16_of(type) : type;
    if (n_out % KT_X8_ROWS != 0 || !layout_of(type)) return type;
    if (n_in % kt_dtype_get(type)->block_size != 0) return type;
    return layout_of(type)->packed;
}

size_t kt_repack_tmp_bytes(kt_dtype type, int n_in) {
    const size_t rows = x16_of(type) != KT_DTYPE_COUNT ? KT_X16_ROWS : KT_X8_ROWS;
    return rows * kt_dtype_row_bytes(type, n_in);
}

/* n units of `width` bytes (a constant in each call, so memcpy is one
 * move) between the group (stride 8 units) and the plain block. */
static inline void move_units(uint8_t *g, uint8_t *x, int n, const int width, bool to_group) {
    for (int v = 0; v < n; v++, g += 8 * width, x += width) {
        if (to_group) memcpy(g, x, (size_t)width);
        else memcpy(x, g, (size_t)width);
    }
}

/* Q5_0's 32 fifth bits of lane r (a little-endian word, bit j: value j)
 * and the group's 8 mask words M[v], either way: nibble v of the row's
 * word is nibble r of M[v] (repack.h). */
static void move_fifth_bits(uint8_t *m, int r, uint8_t *qh, bool to_group) {
    uint32_t h;
    memcpy(&h, qh, 4);
    uint32_t out = 0;
    for (int v = 0; v < KT_X8_ROWS; v++) {
        uint32_t word;
        memcpy(&word, m + 4 * v, 4);
        if (to_group) {
            word = (word & ~(0xFu << 4 * r)) | ((h >> 4 * v) & 0xFu) << 4 * r;
            memcpy(m + 4 * v, &word, 4);
        } else {
            out |= ((word >> 4 * r) & 0xFu) << 4 * v;
        }
    }
    if (!to_group) memcpy(qh, &out, 4);
}

/* Block b of lane r between the plain block blk and group grp, either way. */
static void move_block(const x8_layout *l, uint8_t *grp, int nb, int b, int r, uint8_t *blk, bool to_group) {
    if (l->qh_per_b)
        move_fifth_bits(grp + (size_t)nb * l->qh_per_nb + (size_t)b * l->qh_per_b, r, blk + l->qh_off, to_group);
    for (int p = 0; p < l->n_parts; p++) {
        const x8_part *q = &l->parts[p];
        uint8_t *at = grp + (size_t)nb * q->per_nb + (size_t)b * q->per_b + q->at + (size_t)q->width * r;
        if (q->width == 4) move_units(at, blk + q->off, q->n, 4, to_group);
        else if (q->width == 2) move_units(at, blk + q->off, q->n, 2, to_group);
        else move_units(at, blk + q->off, q->n, 1, to_group);
    }
}

/* One group of 16 rows of esz-byte values (tmp: the rows as they were)
 * into its x16 order: value i of row r at i * 16 + r. Row by row, so
 * the reads are sequential and the writes fall in a few lines at a time. */
static void transpose_x16(uint8_t *grp, const uint8_t *tmp, int n_in, const int esz) {
    for (int r = 0; r < KT_X16_ROWS; r++) {
        const uint8_t *row = tmp + (size_t)r * n_in * esz;
        uint8_t *at = grp + (size_t)r * esz;
        for (int i = 0; i < n_in; i++) memcpy(at + (size_t)i * KT_X16_ROWS * esz, row + (size_t)i * esz, (size_t)esz);
    }
}

static void repack_x16(void *w, kt_dtype type, int n_in, int n_out, void *tmp) {
    const size_t gb = kt_repack_tmp_bytes(type, n_in);
    for (int g = 0; g < n_out / KT_X16_ROWS; g++) {
        uint8_t *grp = (uint8_t *)w + (size_t)g * gb;
        memcpy(tmp, grp, gb);
        if (type == KT_F32) transpose_x16(grp, tmp, n_in, 4);
        else transpose_x16(grp, tmp, n_in, 2);
    }
}

void kt_repack(void *w, kt_dtype type, int n_in, int n_out, void *tmp) {
    if (x16_of(type) != KT_DTYPE_COUNT) {
        repack_x16(w, type, n_in, n_out, tmp);
        return;
    }
    const x8_layout *l = layout_of(type);
    const kt_dtype_info *info = kt_dtype_get(type);
    const int nb = n_in / info->block_size;
    const size_t gb = KT_X8_ROWS * kt_dtype_row_bytes(type, n_in);
    for (int g = 0; g < n_out / KT_X8_ROWS; g++) {
        uint8_t *grp = (uint8_t *)w + (size_t)g * gb;
        memcpy(tmp, grp, gb); /* the group's 8 rows, as they were */
        for (int b = 0; b < nb; b++)
            for (int r = 0; r < KT_X8_ROWS; r++)
                move_block(l, grp, nb, b, r, (uint8_t *)tmp + ((size_t)r * nb + b) * info->block_bytes, true);
    }
}

kt_dtype kt_repack_plain(kt_dtype packed) {
    for (size_t i = 0; i < sizeof LAYOUTS / sizeof LAYOUTS[0]; i++)
        if (LAYOUTS[i].packed == packed) return LAYOUTS[i].plain;
    static const kt_dtype FLOATS[] = {KT_F32, KT_F16, KT_BF16};
    for (size_t i = 0; i < sizeof FLOATS / sizeof FLOATS[0]; i++)
        if (x16_of(FLOATS[i]) == packed) return FLOATS[i];
    return packed;
}

void kt_repack_row_f32(const void *w, kt_dtype type, int n_in, int r, float *out) {
    const kt_dtype plain = kt_repack_plain(type);
    const kt_dtype_info *info = kt_dtype_get(plain);
    if (plain == type) { /* not repacked */
        kt_dequantize_row(type, (const char *)w + (size_t)r * kt_dtype_row_bytes(type, n_in), out, n_in);
        return;
    }
    if (x16_of(plain) == type) { /* one value every 16 */
        for (int i = 0; i < n_in; i++) kt_dequantize_row(plain, kt_x16_at(w, info->block_bytes, n_in, r, i), out + i, 1);
        return;
    }
    _Alignas(16) uint8_t blk[256]; /* the largest block: Q6_K's 210 bytes */
    for (int b = 0; b < n_in / info->block_size; b++) {
        kt_x8_block(w, plain, n_in, r, b, blk);
        kt_dequantize_row(plain, blk, out + (size_t)b * info->block_size, info->block_size);
    }
}

void kt_x8_block(const void *w, kt_dtype type, int n_in, int r, int b, void *out) {
    const int nb = n_in / kt_dtype_get(type)->block_size;
    uint8_t *grp = (uint8_t *)w + (size_t)(r / KT_X8_ROWS) * KT_X8_ROWS * kt_dtype_row_bytes(type, n_in);
    move_block(layout_of(type), grp, nb, b, r % KT_X8_ROWS, out, false);
}
