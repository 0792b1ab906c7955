/*
 * amx.h - F16-weight GEMMs on Intel AMX tiles (AMX-BF16), for the vision
 * tower.
 *
 * Why: a screenshot's encode is ~3.6 TFLOP of F16-weight GEMMs and
 * attention, which the f32 FMA kernels run at about half of a core's FMA
 * peak; one AMX tile product (TDPBF16PS: 16 x 16 outputs, 32 values deep)
 * does the work of 512 FMAs, about ten times that peak on one core.
 *
 * The math: a bf16 keeps 8 significant bits, an F16 weight 11, so each
 * weight is split at pack time into hi + lo, two bf16 whose sum is the
 * weight exactly (hi: the weight rounded to bf16; lo: what is left, at
 * most 3 bits, which a bf16 holds exactly). Each activation row is split
 * the same way; an F16-rounded activation (the tower rounds a GEMM's input
 * to F16 as ggml does) is then exact too. Per 32 values of the row
 *
 *     out += xh . Wh  +  xh . Wl  +  xl . Wh      (three tile products)
 *
 * in that order, and the fourth term xl . Wl, at most 2^-16 of each
 * product, is dropped. The products of two bf16 are exact in f32; the
 * hardware's sums are f32 but its internal order is its own, so results
 * agree with the scalar twin (kt_amx_matmul_ref, the same three products
 * as fma chains) to a few f32 rounding steps, not bit for bit.
 * Determinism: an output depends only on its activation row, its weight
 * column and K's order, never on how rows are grouped into calls or
 * threads: a chunked or batched encode gives the same bits.
 *
 * Layouts:
 *   packed weights (kt_amx_pack_f16): n_out padded to a multiple of 32
 *     (zero rows), n_in to k_pad = a multiple of 32 (zeros). Column block
 *     nb (outputs 16 nb .. 16 nb + 15), K block kb (values 32 kb ..
 *     32 kb + 31): two 1 KiB tiles at ((nb * n_kb + kb) * 2 + h) * 512
 *     uint16s, h = 0 for hi, 1 for lo; tile row r, column n holds the
 *     pair (W[16 nb + n][32 kb + 2r], W[16 nb + n][32 kb + 2r + 1]) as
 *     TDPBF16PS reads its second operand.
 *   activations (kt_amx_split_rows): rows padded to a multiple of 32 (zero
 *     rows). Row tile mt (rows 16 mt .. 16 mt + 15), K block kb: two 1 KiB
 *     tiles at ((mt * n_kb + kb) * 2 + h) * 512 uint16s (h = 0 hi, 1 lo),
 *     tile row r = values 32 kb .. 32 kb + 31 of row 16 mt + r. Every tile
 *     is 1 KiB in a row: rows k_pad apart would fall in one L1 set.
 *
 * Only where kt_cpu_has_amx_bf16() (ops/cpu.h): the CPU has AMX-TILE and
 * AMX-BF16, the OS saves tile state and grants this process the tile data.
 */
#ifndef KT_OPS_AMX_H
#define KT_OPS_AMX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KT_AMX_K 32    /* values per tile row (bf16) */
#define KT_AMX_ROWS 32 /* rows the kernel takes at once (two tiles of 16), both operands */
#define KT_AMX_MAX_ROWS 512 /* most rows one kt_amx_matmul call takes */
#define KT_AMX_NC 256       /* columns per weight panel (matmul_amx.c) */
/* floats of the panel buffer kt_amx_matmul needs (2 MiB: each thread its own) */
#define KT_AMX_PANEL_FLOATS ((size_t)KT_AMX_MAX_ROWS * KT_AMX_NC)

static inline int kt_amx_k_pad(int n_in) { return (n_in + KT_AMX_K - 1) / KT_AMX_K * KT_AMX_K; }
static inline int kt_amx_rows_pad(int n) { return (n + KT_AMX_ROWS - 1) / KT_AMX_ROWS * KT_AMX_ROWS; }

/* Bytes of a packed [n_out][n_in] matrix. */
size_t kt_amx_packed_bytes(int n_in, int n_out);
/* Packs plain F16 rows w[n_out][n_in] (row stride n_in) into dst
 * (kt_amx_packed_bytes, 64-byte aligned). */
void kt_amx_pack_f16(uint16_t *dst, const uint16_t *w, int n_in, int n_out);

/* Packs float weights (value i of output o at w[o * ld_out + i * ld_in]:
 * rows, or columns of a matrix read transposed) the same way; a value
 * with more than 16 significant bits loses the rest (2^-17 of it), so
 * their products carry ~2^-16 of relative error, not F16's exactness. */
void kt_amx_pack_f32(uint16_t *dst, const float *w, int n_in, int n_out, size_t ld_out, size_t ld_in);
/* Its scalar form, and the AVX-512 twin of the ld_out == 1 case (the same
 * bits; needs kt_cpu_has_amx_bf16()). */
void kt_amx_pack_f32_c(uint16_t *dst, const float *w, int n_in, int n_out, size_t ld_out, size_t ld_in);
void kt_amx_pack_f32_avx512(uint16_t *dst, const float *w, int n_in, int n_out, size_t ld_in);

/* Bytes of n_rows split activation rows of n_in values. */
size_t kt_amx_act_bytes(int n_in, int n_rows);
/* Splits rows [row0, row1) of x[][n_in] into a (kt_amx_act_bytes for the
 * whole matrix, 64-byte aligned); rows from n_rows up to the padding must
 * be split too (x ignored there: zeros), so give row1 up to
 * kt_amx_rows_pad(n_rows). round_f16: each value rounded to F16 first
 * (nearest even, as kt_fp32_to_fp16), which an F16 weight's GEMM wants
 * (the split is then exact), in the same pass. */
void kt_amx_split_rows(uint16_t *a, const float *x, int n_in, int n_rows, int row0, int row1, bool round_f16);
/* Its scalar form and its AVX-512 twin (the same bits; the twin needs
 * kt_cpu_has_amx_bf16(), which implies AVX-512). */
void kt_amx_split_rows_c(uint16_t *a, const float *x, int n_in, int n_rows, int row0, int row1, bool round_f16);
void kt_amx_split_rows_avx512(uint16_t *a, const float *x, int n_in, int n_rows, int row0, int row1, bool round_f16);

/* out[m][0 .. n_out) for rows m in [row0, row1): the packed weights
 * times the split activations. row0 and row1 are multiples of KT_AMX_ROWS
 * (or row1 = kt_amx_rows_pad(n_rows)), at most KT_AMX_MAX_ROWS apart; out
 * has room for row1 rows (the padding rows past n_rows get zeros).
 * panel: KT_AMX_PANEL_FLOATS floats of scratch, 64-byte aligned.
 * Single-threaded: callers split the rows. Needs kt_cpu_has_amx_bf16(). */
void kt_amx_matmul(float *out, const uint16_t *w, const uint16_t *a, int n_in, int n_out, int n_rows, int row0,
                   int row1, float *panel);
/* The same by the definition above, in scalar C (any CPU); writes rows
 * below n_rows only. */
void kt_amx_matmul_ref(float *out, const uint16_t *w, const uint16_t *a, int n_in, int n_out, int n_rows, int row0,
                       int row1);

/* LDTILECFG's 64-byte block, palette 1: tiles 0-7, each colsb[t] bytes
 * a row and rows[t] rows (the AMX kernels' shapes: matmul_amx.c,
 * matmul_amx_q8.c). */
typedef struct kt_amx_tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} kt_amx_tile_config;

static inline kt_amx_tile_config kt_amx_config(const uint16_t colsb[8], const uint8_t rows[8]) {
    kt_amx_tile_config c = {.palette = 1};
    for (int t = 0; t < 8; t++) c.colsb[t] = colsb[t], c.rows[t] = rows[t];
    return c;
}

/* iters x 4 tile products on resident tiles (16 x 16 x 32 bf16 each), for
 * `kettle bench --peak` (ops/probe.c); needs kt_cpu_has_amx_bf16(). */
long kt_amx_probe_dp(long iters);

#endif
