/*
 * test_amx.c - the AMX tile GEMM (src/ops/amx.h, matmul_amx.c) and its
 * scalar twin:
 *
 *  - the split: every F16 value is hi + lo exactly (both bf16);
 *  - the twin against the exact product (double): within 2^-15 of the sum
 *    of |w x| (the dropped lo . lo term and f32 sums), on any CPU;
 *  - the tile kernel against the twin: within a few f32 roundings of the
 *    sum of |w x| (the hardware sums in its own order), for shapes with K,
 *    column and row tails, one K panel and several, one column panel and
 *    several; and the same bits however the rows are split into calls.
 *    Skipped, visibly, where the CPU has no AMX.
 *  - the AMX-INT8 prefill GEMM of the 32-value x8 formats (Q4_0, Q8_0,
 *    IQ4_NL, MXFP4): the reference's bits, for token and row counts with
 *    and without tails, one token chunk and several; the AVX-512 tier's
 *    bits too. Skipped, visibly, where the CPU has no AMX-INT8.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#include "base/fp16.h"
#include "ops/amx.h"
#include "ops/cpu.h"
#include "ops/matmul.h"
#include "ops/pool.h"
#include "ops/repack.h"

typedef struct gemm_case {
    int n_in, n_out, n_rows;
    uint16_t *w;     /* [n_out][n_in] F16 */
    float *x;        /* [n_rows][n_in], F16-rounded */
    uint16_t *packed, *a;
    double *exact, *mag; /* [n_rows][n_out]: sum w x, sum |w x| */
} gemm_case;

static float rnd(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffffff) / (float)0x1000000 - 0.5f;
}

static void case_make(gemm_case *c, int n_in, int n_out, int n_rows, unsigned seed) {
    memset(c, 0, sizeof *c);
    c->n_in = n_in, c->n_out = n_out, c->n_rows = n_rows;
    c->w = malloc((size_t)n_out * n_in * sizeof *c->w);
    c->x = malloc((size_t)kt_amx_rows_pad(n_rows) * n_in * sizeof *c->x);
    c->packed = aligned_alloc(64, kt_amx_packed_bytes(n_in, n_out));
    c->a = aligned_alloc(64, kt_amx_act_bytes(n_in, n_rows));
    c->exact = malloc((size_t)n_rows * n_out * sizeof *c->exact);
    c->mag = malloc((size_t)n_rows * n_out * sizeof *c->mag);
    assert_non_null(c->w), assert_non_null(c->x), assert_non_null(c->packed), assert_non_null(c->a);
    assert_non_null(c->exact), assert_non_null(c->mag);
    for (size_t i = 0; i < (size_t)n_out * n_in; i++) c->w[i] = kt_fp32_to_fp16(rnd(&seed) * 0.2f);
    for (size_t i = 0; i < (size_t)n_rows * n_in; i++) /* F16-rounded, wide range: lo parts matter */
        c->x[i] = kt_fp16_to_fp32(kt_fp32_to_fp16(rnd(&seed) * 8.0f));
    for (int m = 0; m < n_rows; m++)
        for (int o = 0; o < n_out; o++) {
            double s = 0, a = 0;
            for (int k = 0; k < n_in; k++) {
                double p = (double)kt_fp16_to_fp32(c->w[(size_t)o * n_in + k]) * c->x[(size_t)m * n_in + k];
                s += p, a += fabs(p);
            }
            c->exact[(size_t)m * n_out + o] = s, c->mag[(size_t)m * n_out + o] = a;
        }
    kt_amx_pack_f16(c->packed, c->w, n_in, n_out);
    kt_amx_split_rows(c->a, c->x, n_in, n_rows, 0, kt_amx_rows_pad(n_rows), false);
}

static void case_free(gemm_case *c) {
    free(c->w), free(c->x), free(c->packed), free(c->a), free(c->exact), free(c->mag);
}

/* the largest |out - want| / mag, want from `ref` or the exact sums */
static double worst(const gemm_case *c, const float *out, const float *ref) {
    double m = 0;
    for (size_t i = 0; i < (size_t)c->n_rows * c->n_out; i++) {
        double want = ref ? ref[i] : c->exact[i], d = fabs(out[i] - want) / (c->mag[i] + 1e-30);
        if (!(d <= m)) m = d; /* NaN counts */
    }
    return m;
}

/* value c of row m of a split matrix: hi + lo, as floats */
static void split_at(const uint16_t *a, int n_in, int m, int c, float *hi, float *lo) {
    const int n_kb = kt_amx_k_pad(n_in) / KT_AMX_K;
    const uint16_t *t = a + (((size_t)(m / 16) * n_kb + c / KT_AMX_K) * 2) * 512 + (m % 16) * KT_AMX_K + c % KT_AMX_K;
    *hi = kt_bf16_to_fp32(t[0]), *lo = kt_bf16_to_fp32(t[512]);
}

static void test_split_exact(void **state) {
    (void)state;
    /* every finite F16 value, as 64 rows of 1021 (a K tail) and the rest */
    enum { N_IN = 1021 };
    static float x[1 << 16];
    int n = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float v = kt_fp16_to_fp32((uint16_t)h);
        if (isfinite(v)) x[n++] = v;
    }
    const int n_rows = n / N_IN, rows_pad = kt_amx_rows_pad(n_rows + 1);
    size_t bytes = kt_amx_act_bytes(N_IN, rows_pad);
    uint16_t *a = aligned_alloc(64, bytes), *b = aligned_alloc(64, bytes);
    assert_non_null(a), assert_non_null(b);
    kt_amx_split_rows_c(a, x, N_IN, n_rows, 0, rows_pad, false);
    int bad = 0;
    for (int m = 0; m < n_rows; m++)
        for (int c = 0; c < N_IN; c++) {
            float hi, lo;
            split_at(a, N_IN, m, c, &hi, &lo);
            bad += hi + lo != x[(size_t)m * N_IN + c];
        }
    assert_int_equal(bad, 0);
    for (int m = n_rows; m < rows_pad; m++) /* padding rows and the K tail are zeros */
        for (int c = 0; c < kt_amx_k_pad(N_IN); c++) {
            float hi, lo;
            split_at(a, N_IN, m, c, &hi, &lo);
            assert_true(hi == 0.0f && lo == 0.0f);
        }
    for (int c = N_IN; c < kt_amx_k_pad(N_IN); c++) {
        float hi, lo;
        split_at(a, N_IN, 0, c, &hi, &lo);
        assert_true(hi == 0.0f && lo == 0.0f);
    }
    if (kt_cpu_has_amx_bf16()) { /* the AVX-512 twin: the same bits (NaN, infinities and f32 values too) */
        float odd[3 * N_IN];
        unsigned s = 5;
        for (int i = 0; i < 3 * N_IN; i++) odd[i] = rnd(&s) * 1e3f;
        odd[3] = NAN, odd[4] = INFINITY, odd[5] = -INFINITY, odd[6] = 1e-40f;
        memcpy(x, odd, sizeof odd);
        for (int f16 = 0; f16 < 2; f16++) { /* and rounded to F16 on the way */
            memset(b, 0xff, bytes);
            kt_amx_split_rows_c(a, x, N_IN, n_rows, 0, rows_pad, f16);
            kt_amx_split_rows_avx512(b, x, N_IN, n_rows, 0, rows_pad, f16);
            assert_memory_equal(a, b, bytes);
        }
    } else {
        printf("  the AVX-512 split is not checked: no AMX-BF16 here (%s)\n", kt_cpu_features());
    }
    free(a), free(b);
}

/* the float packer's twins: the same bits, rows or columns, with tails */
static void test_pack_f32_twins(void **state) {
    (void)state;
    const int shapes[][2] = {{64, 3600}, {16, 37}, {100, 40}, {3616, 64}, {20, 90}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int n_in = shapes[s][0], n_out = shapes[s][1];
        float *w = malloc((size_t)n_in * n_out * sizeof *w);
        size_t bytes = kt_amx_packed_bytes(n_in, n_out);
        uint16_t *rows = aligned_alloc(64, bytes), *c = aligned_alloc(64, bytes), *v = aligned_alloc(64, bytes);
        assert_non_null(w), assert_non_null(rows), assert_non_null(c), assert_non_null(v);
        unsigned seed = 11u + (unsigned)s;
        for (size_t i = 0; i < (size_t)n_in * n_out; i++) w[i] = rnd(&seed) * 30.0f;
        w[0] = NAN, w[1] = INFINITY;
        /* w as [n_in][n_out] (ld_out 1): the same matrix as its transpose read by rows */
        float *wt = malloc((size_t)n_in * n_out * sizeof *wt);
        assert_non_null(wt);
        for (int o = 0; o < n_out; o++)
            for (int i = 0; i < n_in; i++) wt[(size_t)o * n_in + i] = w[(size_t)i * n_out + o];
        kt_amx_pack_f32_c(rows, wt, n_in, n_out, (size_t)n_in, 1);
        kt_amx_pack_f32_c(c, w, n_in, n_out, 1, (size_t)n_out);
        assert_memory_equal(rows, c, bytes);
        if (kt_cpu_has_amx_bf16()) {
            memset(v, 0x5a, bytes);
            kt_amx_pack_f32_avx512(v, w, n_in, n_out, (size_t)n_out);
            assert_memory_equal(c, v, bytes);
        }
        free(w), free(wt), free(rows), free(c), free(v);
    }
    if (!kt_cpu_has_amx_bf16()) printf("  the AVX-512 packer is not checked: no AMX-BF16 here\n");
}

static const int SHAPES[][3] = {
    /* n_in, n_out, rows */
    {100, 40, 37},   /* K tail, column tail (not a multiple of 32 or 16), row tail; one K panel: stored direct */
    {768, 1024, 70}, /* the patch embedding's K; four column panels; three K panels */
    {1024, 96, 64},  /* an odd count of 16-column tiles in the last pair */
    {64, 160, 512},  /* the golden tower's MLP, the most rows a call takes */
    {4096, 72, 33},  /* a long K (16 panels), columns 64 + a tail of 8 */
    {288, 600, 96},  /* three column panels, the last 88 wide; two K panels */
};

static void test_ref_vs_exact(void **state) {
    (void)state;
    for (size_t s = 0; s < sizeof SHAPES / sizeof SHAPES[0]; s++) {
        gemm_case c;
        case_make(&c, SHAPES[s][0], SHAPES[s][1], SHAPES[s][2], 7u + (unsigned)s);
        float *ref = malloc((size_t)c.n_rows * c.n_out * sizeof *ref);
        assert_non_null(ref);
        kt_amx_matmul_ref(ref, c.packed, c.a, c.n_in, c.n_out, c.n_rows, 0, kt_amx_rows_pad(c.n_rows));
        double e = worst(&c, ref, NULL);
        printf("  ref vs exact, %d x %d x %d: %.3g of sum |w x|\n", c.n_rows, c.n_in, c.n_out, e);
        assert_true(e <= 0x1p-15);
        free(ref);
        case_free(&c);
    }
}

static void test_tiles_vs_ref(void **state) {
    (void)state;
    if (!kt_cpu_has_amx_bf16()) {
        tu_skip("this CPU (or build) has no AMX-BF16: %s", kt_cpu_features());
        return;
    }
    for (size_t s = 0; s < sizeof SHAPES / sizeof SHAPES[0]; s++) {
        gemm_case c;
        case_make(&c, SHAPES[s][0], SHAPES[s][1], SHAPES[s][2], 7u + (unsigned)s);
        const int rows_pad = kt_amx_rows_pad(c.n_rows);
        size_t n = (size_t)rows_pad * c.n_out;
        float *ref = malloc(n * sizeof *ref), *one = malloc(n * sizeof *one), *split = malloc(n * sizeof *split);
        float *panel = aligned_alloc(64, KT_AMX_PANEL_FLOATS * sizeof *panel);
        assert_non_null(ref), assert_non_null(one), assert_non_null(split), assert_non_null(panel);
        kt_amx_matmul_ref(ref, c.packed, c.a, c.n_in, c.n_out, c.n_rows, 0, rows_pad);
        kt_amx_matmul(one, c.packed, c.a, c.n_in, c.n_out, c.n_rows, 0, rows_pad, panel);
        for (int m = 0; m < rows_pad; m += KT_AMX_ROWS) /* a call per row pair, last first */
            kt_amx_matmul(split, c.packed, c.a, c.n_in, c.n_out, c.n_rows, rows_pad - KT_AMX_ROWS - m,
                          rows_pad - m, panel);
        double d_ref = worst(&c, one, ref), d_exact = worst(&c, one, NULL);
        printf("  tiles, %d x %d x %d: %.3g of sum |w x| from the twin, %.3g from exact\n", c.n_rows, c.n_in,
               c.n_out, d_ref, d_exact);
        assert_true(d_ref <= 0x1p-20);
        assert_true(d_exact <= 0x1p-15);
        assert_memory_equal(one, split, (size_t)c.n_rows * c.n_out * sizeof *one);
        for (size_t i = (size_t)c.n_rows * c.n_out; i < n; i++) assert_true(one[i] == 0.0f); /* zero rows */
        free(ref), free(one), free(split), free(panel);
        case_free(&c);
    }
}

/* x8 matrices through kt_matmul on the int8 tiles: the plain type's
 * reference bits (the specification every tier keeps). Shapes: whole
 * tiles only; row and token tails (to the AVX-512 tiles); a K of 8192
 * whose 150 tokens span two token chunks of the tiles' pass. */
static void test_int8_tiles_vs_ref(void **state) {
    (void)state;
    if (!kt_cpu_has_amx_int8()) {
        tu_skip("this CPU (or build) has no AMX-INT8: %s", kt_cpu_features());
        return;
    }
    static const kt_dtype types[] = {KT_Q4_0, KT_Q8_0, KT_IQ4_NL, KT_MXFP4};
    static const int shapes[][3] = {{64, 16, 16}, {96, 40, 33}, {2080, 24, 47}, {8192, 32, 150}};
    kt_pool *pool = kt_pool_new(2, NULL);
    assert_non_null(pool);
    for (int ti = 0; ti < 4; ti++)
        for (int si = 0; si < 4; si++) {
            const kt_dtype type = types[ti];
            const int n_in = shapes[si][0], n_out = shapes[si][1], nt = shapes[si][2];
            if (TU_SANITIZED && si == 3 && ti > 0) continue; /* the slow reference, once */
            const kt_dtype x8_type = kt_repack_type(type, n_in, n_out);
            assert_int_not_equal(x8_type, type);
            void *w = tu_make_weights(type, n_in, n_out, (uint64_t)(ti * 10 + si), 0.0f);
            const size_t bytes = kt_dtype_row_bytes(type, n_in) * (size_t)n_out;
            void *x8 = tu_xmalloc(bytes), *tmp = tu_xmalloc(kt_repack_tmp_bytes(type, n_in));
            memcpy(x8, w, bytes);
            kt_repack(x8, type, n_in, n_out, tmp);
            const size_t no = (size_t)nt * n_out;
            float *x = tu_xmalloc(sizeof(float) * (size_t)nt * n_in);
            float *want = tu_xmalloc(sizeof(float) * no), *got = tu_xmalloc(sizeof(float) * no);
            tu_fill_normal(x, (size_t)nt * n_in, 1.0f, (uint64_t)(7 * ti + si));
            kt_matmul_ref(want, w, type, x, n_in, n_out, nt);
            kt_matmul(pool, got, x8, x8_type, x, n_in, n_out, nt);
            if (memcmp(got, want, sizeof(float) * no) != 0)
                fail_msg("%s on AMX-INT8, %d x %d x %d tokens: not the %s reference's bits", kt_dtype_name(x8_type), n_in,
                         n_out, nt, kt_dtype_name(type));
            kt_cpu_force_no_amx(true);
            kt_matmul(NULL, got, x8, x8_type, x, n_in, n_out, nt);
            kt_cpu_force_no_amx(false);
            assert_memory_equal(got, want, sizeof(float) * no);
            free(w), free(x8), free(tmp), free(x), free(want), free(got);
        }
    kt_pool_free(pool);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_exact),
        cmocka_unit_test(test_pack_f32_twins),
        cmocka_unit_test(test_ref_vs_exact),
        cmocka_unit_test(test_tiles_vs_ref),
        cmocka_unit_test(test_int8_tiles_vs_ref),
    };
    return tu_result(cmocka_run_group_tests(tests, NULL, NULL));
}
