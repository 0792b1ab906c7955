/*
 * repack.c - the Q4_0x8 layout (see repack.h): writing it and reading a
 * block back. Scalar and simple: it runs once per matrix at load (about
 * 0.1 s for a 1B model) and in the reference kernels.
 */
#include "ops/repack.h"

#include <stddef.h>
#include <string.h>

#define X8_QS_BYTES (KT_X8_ROWS * QK4_0 / 2) /* 128: one block of 8 rows' nibbles */
#define X8_D_BYTES (KT_X8_ROWS * 2)          /* 16: their fp16 scales */

kt_dtype kt_repack_type(kt_dtype type, int n_in, int n_out) {
    if (n_in <= 0 || n_out <= 0 || n_out % KT_X8_ROWS != 0) return type;
    if (type == KT_Q4_0 && n_in % QK4_0 == 0) return KT_Q4_0_X8;
    if (type == KT_Q4_K && n_in % QK_K == 0) return KT_Q4_K_X8;
    if (type == KT_Q6_K && n_in % QK_K == 0) return KT_Q6_K_X8;
    return type;
}

/* Group g's bytes (8 rows' worth). */
static size_t group_bytes_of(kt_dtype t, int n_in) {
    return KT_X8_ROWS * kt_dtype_row_bytes(t, n_in);
}

static size_t group_bytes(int n_in) {
    return group_bytes_of(KT_Q4_0, n_in);
}

void kt_repack_q4_0_x8(void *w, int n_in, int n_out, void *tmp) {
    const int nb = n_in / QK4_0;
    const size_t gb = group_bytes(n_in);
    for (int g = 0; g < n_out / KT_X8_ROWS; g++) {
        uint8_t *grp = (uint8_t *)w + (size_t)g * gb;
        const block_q4_0 *rows = tmp; /* the group's 8 rows, as they were */
        memcpy(tmp, grp, gb);
        for (int b = 0; b < nb; b++)
            for (int r = 0; r < KT_X8_ROWS; r++) {
                const block_q4_0 *blk = &rows[(size_t)r * nb + b];
                for (int v = 0; v < 4; v++)
                    memcpy(grp + (size_t)b * X8_QS_BYTES + 32 * v + 4 * r, blk->qs + 4 * v, 4);
                memcpy(grp + (size_t)nb * X8_QS_BYTES + (size_t)b * X8_D_BYTES + 2 * r, &blk->d, 2);
            }
    }
}

void kt_q4_0_x8_block(const void *w, int n_in, int r, int b, block_q4_0 *out) {
    const int nb = n_in / QK4_0, lane = r % KT_X8_ROWS;
    const uint8_t *grp = (const uint8_t *)w + (size_t)(r / KT_X8_ROWS) * group_bytes(n_in);
    for (int v = 0; v < 4; v++) memcpy(out->qs + 4 * v, grp + (size_t)b * X8_QS_BYTES + 32 * v + 4 * lane, 4);
    memcpy(&out->d, grp + (size_t)nb * X8_QS_BYTES + (size_t)b * X8_D_BYTES + 2 * lane, 2);
}

/* ---- Q4_Kx8 ---- */

void kt_repack_q4_K_x8(void *w, int n_in, int n_out, void *tmp) {
    const int nb = n_in / QK_K;
    const size_t gb = group_bytes_of(KT_Q4_K, n_in);
    for (int g = 0; g < n_out / KT_X8_ROWS; g++) {
        uint8_t *grp = (uint8_t *)w + (size_t)g * gb;
        const block_q4_K *rows = tmp;
        memcpy(tmp, grp, gb);
        for (int b = 0; b < nb; b++) {
            uint8_t *o = grp + (size_t)b * KT_Q4KX8_BLOCK_BYTES;
            for (int r = 0; r < KT_X8_ROWS; r++) {
                const block_q4_K *blk = &rows[(size_t)r * nb + b];
                for (int v = 0; v < 32; v++) memcpy(o + 32 * v + 4 * r, blk->qs + 4 * v, 4);
                for (int u = 0; u < 3; u++) memcpy(o + KT_Q4KX8_SCALES + 32 * u + 4 * r, blk->scales + 4 * u, 4);
                memcpy(o + KT_Q4KX8_D + 2 * r, &blk->d, 2);
                memcpy(o + KT_Q4KX8_DMIN + 2 * r, &blk->dmin, 2);
            }
        }
    }
}

void kt_q4_K_x8_block(const void *w, int n_in, int r, int b, block_q4_K *out) {
    const int lane = r % KT_X8_ROWS;
    const uint8_t *o = (const uint8_t *)w + (size_t)(r / KT_X8_ROWS) * group_bytes_of(KT_Q4_K, n_in) +
                       (size_t)b * KT_Q4KX8_BLOCK_BYTES;
    for (int v = 0; v < 32; v++) memcpy(out->qs + 4 * v, o + 32 * v + 4 * lane, 4);
    for (int u = 0; u < 3; u++) memcpy(out->scales + 4 * u, o + KT_Q4KX8_SCALES + 32 * u + 4 * lane, 4);
    memcpy(&out->d, o + KT_Q4KX8_D + 2 * lane, 2);
    memcpy(&out->dmin, o + KT_Q4KX8_DMIN + 2 * lane, 2);
}

/* ---- Q6_Kx8 ---- */

/* The words of a Q6_K block and their places: ql (32), qh (16), scales (4). */
static const struct { size_t at, off; int n; } Q6_PARTS[3] = {
    {0, offsetof(block_q6_K, ql), 32},
    {KT_Q6KX8_QH, offsetof(block_q6_K, qh), 16},
    {KT_Q6KX8_SCALES, offsetof(block_q6_K, scales), 4},
};

void kt_repack_q6_K_x8(void *w, int n_in, int n_out, void *tmp) {
    const int nb = n_in / QK_K;
    const size_t gb = group_bytes_of(KT_Q6_K, n_in);
    for (int g = 0; g < n_out / KT_X8_ROWS; g++) {
        uint8_t *grp = (uint8_t *)w + (size_t)g * gb;
        const block_q6_K *rows = tmp;
        memcpy(tmp, grp, gb);
        for (int b = 0; b < nb; b++) {
            uint8_t *o = grp + (size_t)b * KT_Q6KX8_BLOCK_BYTES;
            for (int r = 0; r < KT_X8_ROWS; r++) {
                const uint8_t *blk = (const uint8_t *)&rows[(size_t)r * nb + b];
                for (int p = 0; p < 3; p++)
                    for (int v = 0; v < Q6_PARTS[p].n; v++)
                        memcpy(o + Q6_PARTS[p].at + 32 * v + 4 * r, blk + Q6_PARTS[p].off + 4 * v, 4);
                memcpy(o + KT_Q6KX8_D + 2 * r, blk + offsetof(block_q6_K, d), 2);
            }
        }
    }
}

void kt_q6_K_x8_block(const void *w, int n_in, int r, int b, block_q6_K *out) {
    const int lane = r % KT_X8_ROWS;
    const uint8_t *o = (const uint8_t *)w + (size_t)(r / KT_X8_ROWS) * group_bytes_of(KT_Q6_K, n_in) +
                       (size_t)b * KT_Q6KX8_BLOCK_BYTES;
    uint8_t *blk = (uint8_t *)out;
    for (int p = 0; p < 3; p++)
        for (int v = 0; v < Q6_PARTS[p].n; v++)
            memcpy(blk + Q6_PARTS[p].off + 4 * v, o + Q6_PARTS[p].at + 32 * v + 4 * lane, 4);
    memcpy(blk + offsetof(block_q6_K, d), o + KT_Q6KX8_D + 2 * lane, 2);
}

void kt_repack(void *w, kt_dtype type, int n_in, int n_out, void *tmp) {
    if (type == KT_Q4_0) kt_repack_q4_0_x8(w, n_in, n_out, tmp);
    else if (type == KT_Q4_K) kt_repack_q4_K_x8(w, n_in, n_out, tmp);
    else if (type == KT_Q6_K) kt_repack_q6_K_x8(w, n_in, n_out, tmp);
}
