/*
 * test_ops.c - the kernel layer (src/ops): thread pool, CPU dispatch,
 * quantization formats, matmul, and the element-wise and attention kernels.
 *
 * What is checked, and the tolerances:
 *   - quantizers: dequantize against values written from the format
 *     definition on hand-made blocks; quantize -> dequantize within the
 *     format's error bound; the SIMD activation quantizer bit-identical to
 *     the reference; and the reference quantizers reproducing llama.cpp's
 *     bytes on ../shared/models/test-tiny-{Q8_0,Q4_0}.gguf from the F16
 *     file (GGUF parsed by hand here, independently of src/gguf).
 *   - matmul: every type, odd sizes, 1..3 threads. The SIMD path against
 *     kt_matmul_ref within 1e-4 x sum|w_i x_i| (float weights: only the
 *     summation order differs); for Q8_0/Q4_0/Q4_1/Q5_0/Q5_1 weights
 *     (more on the last three in test_q5.c) SIMD and reference
 *     are bit-identical (integer parts exact, then the same fma per block);
 *     the scalar fallback bit-identical to the reference; and batch
 *     invariance: a token's outputs bit-identical alone and in a batch,
 *     whatever the thread count.
 *   - rmsnorm, softmax: SIMD within 1e-5 relative of the reference (sums
 *     reordered); swiglu within 2e-6 relative (vector exp, ~2 ulp);
 *     attention within 1e-5 x max|v| absolute, and batch invariant.
 *   - rope against a double-precision evaluation of the angles, and
 *     bit-exact against llama.cpp's angle recurrence.
 *
 * KT_OPS_BENCH=1 in the environment runs a throughput measurement instead
 * (GEMV GB/s and GEMM GFLOP/s on 2048 x 5632 matrices); it is not a test.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#include "base/fp16.h"
#include "base/rng.h"
#include "base/timing.h"
#include "ops/cpu.h"
#include "ops/internal.h"
#include "ops/matmul.h"
#include "ops/ops.h"
#include "ops/pool.h"
#include "ops/quant.h"
#include "ops/repack.h"

/* ---- helpers -------------------------------------------------------- */

/* sum_i |w_i x_i| for each output, with dequantized weights: the scale of
 * the float rounding a reordered sum can make. */
static void abs_sums(double *s, const void *w, kt_dtype type, const float *x, int n_in,
                     int n_out, int n_tokens) {
    size_t rb = kt_dtype_row_bytes(type, n_in);
    float *row = tu_xmalloc(sizeof(float) * (size_t)n_in);
    for (int r = 0; r < n_out; r++) {
        kt_dequantize_row(type, (const char *)w + rb * (size_t)r, row, n_in);
        for (int t = 0; t < n_tokens; t++) {
            double a = 0;
            for (int i = 0; i < n_in; i++) a += fabs((double)row[i] * x[(size_t)t * n_in + i]);
            s[(size_t)t * n_out + r] = a;
        }
    }
    free(row);
}

static bool has_simd(void) {
    return kt_cpu_has_avx2();
}

/* ---- pool ----------------------------------------------------------- */

typedef struct count_ctx {
    int hits[16];
    int nth_seen[16];
} count_ctx;

static void count_fn(void *ctx, int ith, int nth) {
    count_ctx *c = ctx;
    c->hits[ith]++;
    c->nth_seen[ith] = nth;
}

static void test_pool_runs_every_thread(void **state) {
    (void)state;
    for (int n = 1; n <= 4; n++) {
        kt_error err;
        kt_pool *p = kt_pool_new(n, &err);
        assert_non_null(p);
        assert_int_equal(kt_pool_size(p), n);
        count_ctx c = {0};
        for (int it = 0; it < 2000; it++) kt_pool_run(p, count_fn, &c);
        for (int i = 0; i < n; i++) {
            assert_int_equal(c.hits[i], 2000);
            assert_int_equal(c.nth_seen[i], n);
        }
        assert_int_equal(c.hits[n], 0);
        kt_pool_free(p);
    }
    /* NULL pool: fn(ctx, 0, 1) on the caller */
    count_ctx c = {0};
    kt_pool_run(NULL, count_fn, &c);
    assert_int_equal(c.hits[0], 1);
    assert_int_equal(c.nth_seen[0], 1);
    assert_int_equal(kt_pool_size(NULL), 1);
    /* default size */
    kt_pool *p = kt_pool_new(0, NULL);
    assert_non_null(p);
    assert_true(kt_pool_size(p) >= 1);
    kt_pool_free(p);
}

typedef struct sum_ctx {
    const int *v;
    long n;
    long partial[8];
} sum_ctx;

static void sum_fn(void *ctx, int ith, int nth) {
    sum_ctx *c = ctx;
    long lo, hi, s = 0;
    kt_split_range(c->n, ith, nth, &lo, &hi);
    for (long i = lo; i < hi; i++) s += c->v[i];
    c->partial[ith] = s;
}

/* Work done by workers is visible to the caller after kt_pool_run, also
 * after the workers have gone to sleep. */
static void test_pool_memory_visibility(void **state) {
    (void)state;
    kt_pool *p = kt_pool_new(3, NULL);
    assert_non_null(p);
    int v[1000];
    for (int i = 0; i < 1000; i++) v[i] = i;
    for (int it = 0; it < 300; it++) {
        sum_ctx c = {v, 1000 - it, {0}};
        kt_pool_run(p, sum_fn, &c);
        long n = 1000 - it;
        assert_int_equal(c.partial[0] + c.partial[1] + c.partial[2], n * (n - 1) / 2);
        if (it % 100 == 99) { /* let the workers fall asleep */
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, NULL);
        }
    }
    kt_pool_free(p);
}

static void test_split_range(void **state) {
    (void)state;
    for (long n = 0; n < 40; n++)
        for (int nth = 1; nth <= 5; nth++) {
            long prev = 0;
            for (int i = 0; i < nth; i++) {
                long lo, hi;
                kt_split_range(n, i, nth, &lo, &hi);
                assert_int_equal(lo, prev);
                assert_true(hi - lo == n / nth || hi - lo == n / nth + 1);
                prev = hi;
            }
            assert_int_equal(prev, n);
        }
}

static void test_pool_scratch(void **state) {
    (void)state;
    kt_pool *p = kt_pool_new(2, NULL);
    assert_non_null(p);
    size_t sizes[] = {1, 100, 64, 5000, 4999, 100000, 10};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        unsigned char *s = kt_pool_scratch(p, sizes[i]);
        assert_non_null(s);
        assert_int_equal((uintptr_t)s % 64, 0);
        memset(s, 0xab, sizes[i]); /* ASan checks the size */
    }
    assert_null(kt_pool_scratch(NULL, 10));
    kt_pool_free(p);
    kt_pool_free(NULL);
}

/* ---- cpu ------------------------------------------------------------ */

static void test_cpu_dispatch(void **state) {
    (void)state;
    const char *f = kt_cpu_features();
    assert_non_null(f);
    print_message("cpu: %s\n", f);
    bool had = kt_cpu_has_avx2();
    kt_cpu_force_scalar(true);
    assert_false(kt_cpu_has_avx2());
    kt_cpu_force_scalar(false);
    assert_int_equal(kt_cpu_has_avx2(), had);
}

/* ---- quant: formats ------------------------------------------------- */

static void test_dequant_q4_0_known(void **state) {
    (void)state;
    block_q4_0 b[2];
    b[0].d = kt_fp32_to_fp16(0.5f);
    for (int j = 0; j < 16; j++) b[0].qs[j] = (uint8_t)(j | ((15 - j) << 4));
    b[1].d = kt_fp32_to_fp16(-2.0f);
    for (int j = 0; j < 16; j++) b[1].qs[j] = 0x8F; /* low 15, high 8 */
    float out[64];
    kt_dequantize_row(KT_Q4_0, b, out, 64);
    for (int j = 0; j < 16; j++) {
        assert_true(out[j] == (float)(j - 8) * 0.5f);           /* low nibble */
        assert_true(out[j + 16] == (float)(15 - j - 8) * 0.5f); /* high nibble */
        assert_true(out[32 + j] == 7 * -2.0f);
        assert_true(out[48 + j] == 0.0f);
    }
}

static void test_dequant_q8_0_known(void **state) {
    (void)state;
    block_q8_0 b;
    b.d = kt_fp32_to_fp16(0.25f);
    for (int j = 0; j < 32; j++) b.qs[j] = (int8_t)(j * 8 - 128);
    float out[32];
    kt_dequantize_row(KT_Q8_0, &b, out, 32);
    for (int j = 0; j < 32; j++) assert_true(out[j] == (float)(j * 8 - 128) * 0.25f);
}

static void test_plain_types_roundtrip(void **state) {
    (void)state;
    float x[5] = {1.0f, -2.5f, 65504.0f, 0.0f, 3.0e-5f};
    uint16_t h[5];
    float y[5];
    kt_quantize_row(KT_F16, x, h, 5);
    kt_dequantize_row(KT_F16, h, y, 5);
    for (int i = 0; i < 4; i++) assert_true(x[i] == y[i]);
    assert_true(fabsf(y[4] - x[4]) < 1e-7f);
    assert_int_equal(h[0], 0x3c00);
    kt_quantize_row(KT_BF16, x, h, 5);
    kt_dequantize_row(KT_BF16, h, y, 5);
    assert_int_equal(h[0], 0x3f80);
    assert_true(y[1] == -2.5f);
    float z[5];
    kt_quantize_row(KT_F32, x, z, 5);
    kt_dequantize_row(KT_F32, z, y, 5);
    assert_memory_equal(x, y, sizeof x);
    assert_true(kt_quantize_supported(KT_Q4_0) && !kt_quantize_supported(KT_Q8_1));
    assert_true(kt_dequantize_supported(KT_BF16) && !kt_dequantize_supported(KT_Q8_K));
}

/* F16 rows (the KV cache's stores): kt_quantize_row's SIMD conversion
 * gives kt_fp32_to_fp16's bits on every kind of float: a sweep over all
 * exponents, and every pattern around where rounding, subnormals,
 * overflow and NaNs begin, both signs; odd lengths for the tail. */
static void test_f16_row_matches_scalar(void **state) {
    (void)state;
    static const uint32_t edges[] = {0x00000000u, 0x33000000u, 0x38800000u, 0x477fe000u, 0x477ff000u,
                                     0x7f7fffffu, 0x7f800000u, 0x7fc00000u, 0x7fffffffu};
    enum { SWEEP = 65521, SPAN = 8192 };
    const size_t n = SWEEP + 2 * SPAN * (sizeof edges / sizeof edges[0]);
    uint32_t *bits = tu_xmalloc(sizeof(uint32_t) * n);
    size_t k = 0;
    for (uint32_t i = 0; i < SWEEP; i++) bits[k++] = i * 65521u; /* strides through every exponent */
    for (size_t e = 0; e < sizeof edges / sizeof edges[0]; e++)
        for (int d = -SPAN; d < SPAN; d++) bits[k++] = (edges[e] + (uint32_t)d) ^ (d & 1 ? 0x80000000u : 0);
    float *x = tu_xmalloc(sizeof(float) * n);
    memcpy(x, bits, sizeof(float) * n);
    uint16_t *fast = tu_xmalloc(sizeof(uint16_t) * n);
    for (size_t len = n; len > n - 9; len -= 3) { /* lengths with every tail */
        kt_quantize_row(KT_F16, x, fast, (int64_t)len);
        for (size_t i = 0; i < len; i++)
            if (fast[i] != kt_fp32_to_fp16(x[i]))
                fail_msg("F16 of 0x%08x: 0x%04x, scalar 0x%04x", bits[i], fast[i], kt_fp32_to_fp16(x[i]));
    }
    free(bits), free(x), free(fast);
}

/* exp512 (AVX-512) scales by 2^n in one step where exp256 takes two: the
 * same bits on every input the kernels can see, over [-110, 95] (past
 * both clamps) in steps of 1/4096, through the subnormal results, and on
 * the infinities and a NaN. */
static void test_exp_tiers_agree(void **state) {
    (void)state;
    /* the instructions exp512 is compiled for (TARGET_512), whether or not
     * kettle's dispatch picks the AVX-512 tier on this CPU */
    __builtin_cpu_init();
    if (!kt_cpu_has_avx2() || !__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx512vnni"))
        tu_skip("this CPU has no AVX-512 F/BW/VL/VNNI: exp512 cannot run");
    enum { N = 205 * 4096 + 16 };
    float *x = tu_xmalloc(sizeof(float) * N), *a = tu_xmalloc(sizeof(float) * N), *b = tu_xmalloc(sizeof(float) * N);
    for (int i = 0; i < N - 16; i++) x[i] = -110.0f + (float)i / 4096.0f;
    for (int i = N - 16; i < N; i++) x[i] = i % 3 == 0 ? INFINITY : i % 3 == 1 ? -INFINITY : NAN;
    kt_exp_rows_avx2(x, a, N);
    kt_exp_rows_avx512(x, b, N);
    for (int i = 0; i < N; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0) fail_msg("exp(%.9g): %.9g (8 lanes), %.9g (16)", x[i], a[i], b[i]);
    int subnormal = 0;
    for (int i = 0; i < N; i++) subnormal += a[i] > 0 && a[i] < FLT_MIN;
    assert_true(subnormal > 1000); /* the sweep reaches them */
    free(x), free(a), free(b);
}

static void test_quant_roundtrip_error(void **state) {
    (void)state;
    enum { N = 32 * 64 };
    float x[N], y[N];
    tu_fill_normal(x, N, 1.0f, 7);
    x[5] = 0.0f;
    for (int j = 64; j < 96; j++) x[j] = 0.0f; /* an all-zero block */
    block_q8_0 q8[N / 32];
    block_q4_0 q4[N / 32];
    kt_quantize_row(KT_Q8_0, x, q8, N);
    kt_dequantize_row(KT_Q8_0, q8, y, N);
    for (int b = 0; b < N / 32; b++) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[b * 32 + j]));
        /* half a step, plus the fp16 rounding of d times |q| <= 127 */
        float bound = amax / 127 * (0.5f + 127.0f / 2048) + 1e-12f;
        for (int j = 0; j < 32; j++) assert_true(fabsf(x[b * 32 + j] - y[b * 32 + j]) <= bound);
    }
    kt_quantize_row(KT_Q4_0, x, q4, N);
    kt_dequantize_row(KT_Q4_0, q4, y, N);
    for (int b = 0; b < N / 32; b++) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[b * 32 + j]));
        /* a step (the clamp at 15 on the side opposite the max), plus the
         * fp16 rounding of d times |q| <= 8 */
        float bound = amax / 8 * (1.0f + 8.0f / 2048) + 1e-12f;
        for (int j = 0; j < 32; j++) assert_true(fabsf(x[b * 32 + j] - y[b * 32 + j]) <= bound);
    }
    for (int j = 64; j < 96; j++) assert_true(y[j] == 0.0f);
}

/* Q4_0's scale keeps the sign of the value with the largest |x|, the first
 * one on ties; that value maps to nibble 0 exactly. */
static void test_q4_0_max_sign_and_ties(void **state) {
    (void)state;
    float x[32] = {0};
    x[3] = -2.0f;
    x[10] = 2.0f;
    x[20] = 1.0f;
    block_q4_0 b;
    kt_quantize_row(KT_Q4_0, x, &b, 32);
    assert_true(kt_fp16_to_fp32(b.d) == 0.25f); /* -2 / -8 */
    assert_int_equal(b.qs[3] & 0x0F, 0);        /* -2 / 0.25 + 8 = 0 */
    assert_int_equal(b.qs[10] & 0x0F, 15);      /* 2 / 0.25 + 8.5 = 16.5 -> clamp */
    assert_int_equal(b.qs[4] >> 4, 12);         /* x[20] = 1: 4 + 8.5 -> 12 */
    x[3] = 2.0f;
    x[10] = -2.0f;
    kt_quantize_row(KT_Q4_0, x, &b, 32);
    assert_true(kt_fp16_to_fp32(b.d) == -0.25f);
    assert_int_equal(b.qs[3] & 0x0F, 0);
}

/* Q8_0 rounds half away from zero (roundf), not to even. */
static void test_q8_0_rounding(void **state) {
    (void)state;
    float x[32] = {0};
    x[0] = 127.0f; /* d = 1, id = 1 */
    x[1] = 2.5f;
    x[2] = -2.5f;
    x[3] = 3.5f;
    x[4] = 0.49999997f;
    block_q8_0 b;
    kt_quantize_row(KT_Q8_0, x, &b, 32);
    assert_true(kt_fp16_to_fp32(b.d) == 1.0f);
    assert_int_equal(b.qs[0], 127);
    assert_int_equal(b.qs[1], 3);
    assert_int_equal(b.qs[2], -3);
    assert_int_equal(b.qs[3], 4);
    assert_int_equal(b.qs[4], 0);
}

/* The activation quantizers (reference and SIMD) follow their definition
 * (llama.cpp's runtime one): q = x * (127 / amax) rounded to nearest with
 * ties to even, d = fp16(amax / 127), c8 = 8 * sum(q). On ties they differ
 * from the weight quantizer (ties away from zero), on purpose. */
static void test_act_quant_matches_q8_0(void **state) {
    (void)state;
    enum { N = 32 * 40 };
    float x[N];
    tu_fill_normal(x, N, 3.0f, 11);
    /* ties: with amax = 127, id = 1 and x * id lands on k + 0.5 */
    for (int j = 0; j < 32; j++) x[j] = (float)(j - 16) + 0.5f;
    x[0] = 127.0f;
    for (int j = 32; j < 64; j++) x[j] = 0.0f;
    for (int j = 64; j < 96; j++) x[j] = 1e-30f * (float)(j - 80); /* tiny: subnormal d */
    for (int j = 96; j < 128; j++) x[j] = 6e4f * (j % 2 ? 1 : -1);
    int8_t qs[N], qs2[N];
    float d[N / 32], d2[N / 32];
    int32_t c8[N / 32], c82[N / 32];
    kt_quantize_act_q8_ref(x, N, qs, d, c8);
    for (int b = 0; b < N / 32; b++) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[b * 32 + j]));
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        int32_t sum = 0;
        for (int j = 0; j < 32; j++) {
            float r = nearbyintf(x[b * 32 + j] * id);
            int want = r > 127 ? 127 : r < -128 ? -128 : (int)r;
            assert_int_equal(qs[b * 32 + j], want);
            sum += want;
        }
        assert_true(d[b] == kt_fp16_to_fp32(kt_fp32_to_fp16(amax / 127.0f)));
        assert_int_equal(c8[b], 8 * sum);
    }
    /* the ties of block 0: x = j - 15.5 for j >= 1 */
    assert_int_equal(qs[16], 0);  /*  0.5 ->  0 */
    assert_int_equal(qs[17], 2);  /*  1.5 ->  2 */
    assert_int_equal(qs[18], 2);  /*  2.5 ->  2 */
    assert_int_equal(qs[14], -2); /* -1.5 -> -2 */
    assert_int_equal(qs[13], -2); /* -2.5 -> -2 */
    if (!has_simd()) return;
    kt_quantize_act_q8_avx2(x, N, qs2, d2, c82);
    assert_memory_equal(qs, qs2, N);
    assert_memory_equal(d, d2, sizeof d);
    assert_memory_equal(c8, c82, sizeof c8);
}

/* ---- quant: llama.cpp's bytes on the shared model files -------------- */

typedef struct gg_tensor {
    char name[96];
    int n_dims;
    int64_t dims[4];
    uint32_t type;
    uint64_t offset;
} gg_tensor;

typedef struct gg_file {
    unsigned char *buf;
    size_t size;
    uint64_t data; /* start of the data section */
    int n_tensors;
    gg_tensor t[64];
} gg_file;

typedef struct rd {
    const unsigned char *p, *end;
    bool ok;
} rd;

static uint64_t rd_n(rd *r, int n) {
    uint64_t v = 0;
    if (r->end - r->p < n) {
        r->ok = false;
        return 0;
    }
    for (int i = 0; i < n; i++) v |= (uint64_t)r->p[i] << (8 * i);
    r->p += n;
    return v;
}

static void rd_skip(rd *r, uint64_t n) {
    if ((uint64_t)(r->end - r->p) < n) r->ok = false;
    else r->p += n;
}

static int gg_scalar_size(uint32_t type) {
    static const int sz[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return type < 13 ? sz[type] : -1;
}

static void gg_skip_value(rd *r, uint32_t type, uint64_t *alignment, bool is_align) {
    if (type == 8) {
        rd_skip(r, rd_n(r, 8));
    } else if (type == 9) {
        uint32_t et = (uint32_t)rd_n(r, 4);
        uint64_t n = rd_n(r, 8);
        for (uint64_t i = 0; i < n && r->ok; i++) gg_skip_value(r, et, NULL, false);
    } else if (gg_scalar_size(type) > 0) {
        uint64_t v = rd_n(r, gg_scalar_size(type));
        if (is_align && alignment) *alignment = v;
    } else {
        r->ok = false;
    }
}

/* Reads the header and tensor infos of a GGUF file (enough for this test). */
static bool gg_open(gg_file *f, const char *path) {
    memset(f, 0, sizeof *f);
    f->buf = (unsigned char *)tu_read_file(path, &f->size);
    if (!f->buf) return false;
    rd r = {f->buf, f->buf + f->size, true};
    if (rd_n(&r, 4) != 0x46554747u) return false; /* "GGUF" */
    rd_n(&r, 4);
    uint64_t nt = rd_n(&r, 8), nkv = rd_n(&r, 8), alignment = 32;
    if (nt > 64) return false;
    for (uint64_t i = 0; i < nkv && r.ok; i++) {
        uint64_t klen = rd_n(&r, 8);
        bool is_align = klen == 17 && (uint64_t)(r.end - r.p) >= 17 &&
                        memcmp(r.p, "general.alignment", 17) == 0;
        rd_skip(&r, klen);
        gg_skip_value(&r, (uint32_t)rd_n(&r, 4), &alignment, is_align);
    }
    for (uint64_t i = 0; i < nt && r.ok; i++) {
        gg_tensor *t = &f->t[i];
        uint64_t nlen = rd_n(&r, 8);
        if (nlen >= sizeof t->name || (uint64_t)(r.end - r.p) < nlen) return false;
        memcpy(t->name, r.p, nlen);
        rd_skip(&r, nlen);
        t->n_dims = (int)rd_n(&r, 4);
        if (t->n_dims < 1 || t->n_dims > 4) return false;
        for (int d = 0; d < 4; d++) t->dims[d] = d < t->n_dims ? (int64_t)rd_n(&r, 8) : 1;
        t->type = (uint32_t)rd_n(&r, 4);
        t->offset = rd_n(&r, 8);
    }
    if (!r.ok || alignment == 0) return false;
    f->n_tensors = (int)nt;
    uint64_t pos = (uint64_t)(r.p - f->buf);
    f->data = (pos + alignment - 1) / alignment * alignment;
    return true;
}

static const gg_tensor *gg_find(const gg_file *f, const char *name) {
    for (int i = 0; i < f->n_tensors; i++)
        if (strcmp(f->t[i].name, name) == 0) return &f->t[i];
    return NULL;
}

static const void *gg_data(const gg_file *f, const gg_tensor *t, size_t bytes) {
    if (f->data + t->offset + bytes > f->size) return NULL;
    return f->buf + f->data + t->offset;
}

/* Quantizes every 2-D F16 tensor of the F16 file to `type` and compares the
 * bytes with llama.cpp's file. */
static void check_llama_bytes(kt_dtype type, const char *file) {
    gg_file src, dst;
    if (!gg_open(&src, tu_shared("models/test-tiny-F16.gguf")) ||
        !gg_open(&dst, tu_shared(file))) {
        free(src.buf);
        fail_msg("cannot read the shared test models (../shared/models)");
    }
    int n_checked = 0;
    for (int i = 0; i < src.n_tensors; i++) {
        const gg_tensor *s = &src.t[i];
        if (s->n_dims != 2 || s->type != KT_F16) continue;
        const gg_tensor *d = gg_find(&dst, s->name);
        assert_non_null(d);
        assert_int_equal(d->type, type);
        int64_t n_in = s->dims[0], n_rows = s->dims[1];
        size_t rb_src = kt_dtype_row_bytes(KT_F16, n_in), rb_dst = kt_dtype_row_bytes(type, n_in);
        const unsigned char *ps = gg_data(&src, s, rb_src * (size_t)n_rows);
        const unsigned char *pd = gg_data(&dst, d, rb_dst * (size_t)n_rows);
        assert_non_null(ps);
        assert_non_null(pd);
        float *row = tu_xmalloc(sizeof(float) * (size_t)n_in);
        unsigned char *q = tu_xmalloc(rb_dst);
        for (int64_t r = 0; r < n_rows; r++) {
            kt_dequantize_row(KT_F16, ps + rb_src * (size_t)r, row, n_in);
            kt_quantize_row(type, row, q, n_in);
            if (memcmp(q, pd + rb_dst * (size_t)r, rb_dst) != 0) {
                free(row);
                free(q);
                fail_msg("%s: %s row %lld differs from llama.cpp's bytes", file, s->name,
                         (long long)r);
            }
        }
        free(row);
        free(q);
        n_checked++;
    }
    assert_true(n_checked >= 8);
    free(src.buf);
    free(dst.buf);
}

static void test_q8_0_bytes_match_llama(void **state) {
    (void)state;
    check_llama_bytes(KT_Q8_0, "models/test-tiny-Q8_0.gguf");
}

static void test_q4_0_bytes_match_llama(void **state) {
    (void)state;
    check_llama_bytes(KT_Q4_0, "models/test-tiny-Q4_0.gguf");
}

/* ---- matmul --------------------------------------------------------- */

static const kt_dtype MM_TYPES[] = {KT_F32, KT_F16, KT_BF16, KT_Q8_0,
                                    KT_Q4_0, KT_Q4_1, KT_Q5_0, KT_Q5_1};
#define N_MM_TYPES 8

/* the quantized weight types whose SIMD kernels are bit-identical to the
 * reference (all but the float types) */
static bool is_exact_type(kt_dtype t) {
    return t != KT_F32 && t != KT_F16 && t != KT_BF16;
}

static void test_matmul_ref_small(void **state) {
    (void)state;
    /* F32: a hand-checkable product */
    float w[2 * 3] = {1, 2, 3, -1, 0, 0.5f};
    float x[2 * 3] = {1, 1, 1, 2, 0, -2};
    float out[4];
    kt_matmul_ref(out, w, KT_F32, x, 3, 2, 2);
    assert_true(out[0] == 6.0f && out[1] == -0.5f && out[2] == -4.0f && out[3] == -3.0f);
    /* Q8_0: weights exactly representable; activations whose Q8_0 is exact */
    float wf[32], xf[32];
    for (int j = 0; j < 32; j++) {
        wf[j] = (float)(j - 16) / 16.0f * 2.0f; /* multiples of 1/8 */
        xf[j] = j == 0 ? 127.0f : (float)(j % 5); /* d = 1 */
    }
    block_q8_0 wq;
    kt_quantize_row(KT_Q8_0, wf, &wq, 32);
    double want = 0;
    float wd[32];
    kt_dequantize_row(KT_Q8_0, &wq, wd, 32);
    for (int j = 0; j < 32; j++) want += (double)wd[j] * xf[j];
    kt_matmul_ref(out, &wq, KT_Q8_0, xf, 32, 1, 1);
    assert_true(fabs(out[0] - want) <= 1e-5 * fabs(want));
    /* unsupported type: NaN, no crash */
    kt_matmul_ref(out, &wq, KT_Q2_K, xf, 32, 1, 1);
    assert_true(isnan(out[0]));
}

/* out vs want within tol * sum|terms| (plus a tiny absolute floor) */
static void expect_close_mm(const float *out, const float *want, const double *asum, size_t n,
                            double tol, const char *what) {
    for (size_t i = 0; i < n; i++) {
        double lim = tol * asum[i] + 1e-30;
        if (!(fabs((double)out[i] - want[i]) <= lim))
            fail_msg("%s: element %zu: %.9g vs reference %.9g (limit %.3g)", what, i, out[i],
                     want[i], lim);
    }
}

static void check_simd_vs_ref(void) {
    static const int n_ins[] = {32, 64, 96, 2048 + 32};
    static const int n_outs[] = {1, 3, 17, 67};
    static const int n_toks[] = {1, 2, 5, 8, 13};
    kt_pool *pool = kt_pool_new(2, NULL);
    assert_non_null(pool);
    for (int ti = 0; ti < N_MM_TYPES; ti++) {
        kt_dtype type = MM_TYPES[ti];
        for (int a = 0; a < 4; a++)
            for (int b = 0; b < 4; b++) {
                int n_in = n_ins[a], n_out = n_outs[b];
                void *w = tu_make_weights(type, n_in, n_out, (uint64_t)(ti * 100 + a * 10 + b), 0.0f);
                for (int c = 0; c < 5; c++) {
                    int nt = n_toks[c];
                    size_t no = (size_t)nt * n_out;
                    float *x = tu_xmalloc(sizeof(float) * (size_t)nt * n_in);
                    float *want = tu_xmalloc(sizeof(float) * no), *got = tu_xmalloc(sizeof(float) * no);
                    double *asum = tu_xmalloc(sizeof(double) * no);
                    tu_fill_normal(x, (size_t)nt * n_in, 1.0f, (uint64_t)(a * 1000 + b * 100 + c));
                    kt_matmul_ref(want, w, type, x, n_in, n_out, nt);
                    abs_sums(asum, w, type, x, n_in, n_out, nt);
                    /* n_out 17: no pool (the kernels' own allocation) */
                    kt_matmul(n_out == 17 ? NULL : pool, got, w, type, x, n_in, n_out, nt);
                    char what[96];
                    snprintf(what, sizeof what, "%s n_in %d n_out %d n_tokens %d",
                             kt_dtype_name(type), n_in, n_out, nt);
                    expect_close_mm(got, want, asum, no, 1e-4, what);
                    /* quantized weights: the SIMD kernels do the reference's
                     * operations exactly (one fma per block per output) */
                    if (is_exact_type(type))
                        if (memcmp(got, want, sizeof(float) * no) != 0)
                            fail_msg("%s: not bit-identical to the reference", what);
                    free(x);
                    free(want);
                    free(got);
                    free(asum);
                }
                free(w);
            }
    }
    kt_pool_free(pool);
}

/* Runs check on every int8 tile tier this CPU has: AVX-512 VNNI, AVX-512
 * VNNI without AVX-VNNI (as some hypervisors show Zen 4 / 5: the
 * dispatch must still reach the AVX-512 tiles, and the AVX2 ones where a
 * 256-bit VNNI tile would serve), AVX-VNNI alone, and plain AVX2. */
static void on_every_int8_tier(void (*check)(bool), bool arg) {
    check(arg);
    if (kt_cpu_has_amx_int8()) { /* the AVX-512 tier under it */
        kt_cpu_force_no_amx(true);
        check(arg);
        kt_cpu_force_no_amx(false);
    }
    if (kt_cpu_has_avx512_vnni()) {
        kt_cpu_force_no_avx512(true);
        check(arg);
        kt_cpu_force_no_avx512(false);
        if (kt_cpu_has_avx_vnni()) {
            kt_cpu_hide_avx_vnni(true);
            assert_true(kt_cpu_has_avx512_vnni());
            check(arg);
            kt_cpu_hide_avx_vnni(false);
        }
    }
    if (kt_cpu_has_avx_vnni()) {
        kt_cpu_force_no_vnni(true);
        check(arg);
        kt_cpu_force_no_vnni(false);
    }
}

static void check_simd_vs_ref_tier(bool unused) {
    (void)unused;
    check_simd_vs_ref();
}

static void test_matmul_simd_vs_ref(void **state) {
    (void)state;
    on_every_int8_tier(check_simd_vs_ref_tier, false);
}

/* Q8_0 at its extremes: quants of -128 (a quantizer writes none, a file
 * may hold them; |w| = 128 is the largest unsigned factor maddubs gets)
 * and 127 against activations that quantize to +-127, so maddubs' int16
 * pairs reach 2 * 128 * 127 = 32512 (no saturation) and the VNNI tiers'
 * corrections are at their largest; one token and batches that take
 * every tile shape, with rows left over: the reference's bits. */
static void check_q8_0_extremes(bool unused) {
    (void)unused;
    enum { NB = 3, N_IN = NB * 32, N_OUT = 23, NT = 11 };
    block_q8_0 *w = tu_xmalloc(sizeof(block_q8_0) * NB * N_OUT);
    for (int r = 0; r < N_OUT; r++)
        for (int b = 0; b < NB; b++) {
            block_q8_0 *blk = w + r * NB + b;
            blk->d = kt_fp32_to_fp16(0.001f * (float)(1 + (r + b) % 5));
            for (int j = 0; j < 32; j++)
                blk->qs[j] = (int8_t)(r % 3 == 0 ? -128 : r % 3 == 1 ? 127 : (j + b) % 2 ? -128 : 127);
        }
    float *x = tu_xmalloc(sizeof(float) * NT * N_IN);
    for (int t = 0; t < NT; t++)
        for (int i = 0; i < N_IN; i++)
            x[t * N_IN + i] = (float)(1 + t) * (t % 3 == 0 ? -1.0f : t % 3 == 1 ? 1.0f : i % 2 ? 1.0f : -1.0f);
    float want[NT * N_OUT], got[NT * N_OUT];
    kt_pool *pool = kt_pool_new(2, NULL);
    assert_non_null(pool);
    static const int nts[] = {1, 2, 3, 4, 7, NT};
    for (size_t k = 0; k < sizeof nts / sizeof nts[0]; k++) {
        const int nt = nts[k];
        kt_matmul_ref(want, w, KT_Q8_0, x, N_IN, N_OUT, nt);
        for (int p = 0; p < 2; p++) {
            kt_matmul(p ? pool : NULL, got, w, KT_Q8_0, x, N_IN, N_OUT, nt);
            if (memcmp(want, got, sizeof(float) * (size_t)(nt * N_OUT)) != 0)
                fail_msg("Q8_0 extremes, %d tokens%s: not the reference's bits", nt, p ? " (pool)" : "");
        }
    }
    kt_pool_free(pool);
    free(x);
    free(w);
}

static void test_matmul_q8_0_extremes(void **state) {
    (void)state;
    on_every_int8_tier(check_q8_0_extremes, false);
}

/* Float weights allow any n_in (the SIMD tail). */
static void test_matmul_float_odd_n_in(void **state) {
    (void)state;
    static const int n_ins[] = {1, 7, 9, 33, 100};
    for (int ti = 0; ti < 3; ti++)
        for (int a = 0; a < 5; a++) {
            int n_in = n_ins[a], n_out = 9, nt = 5;
            size_t no = (size_t)nt * n_out;
            void *w = tu_make_weights(MM_TYPES[ti], n_in, n_out, (uint64_t)(77 + a), 0.0f);
            float *x = tu_xmalloc(sizeof(float) * (size_t)nt * n_in);
            float want[45], got[45];
            double asum[45];
            tu_fill_normal(x, (size_t)nt * n_in, 1.0f, (uint64_t)(5 + a));
            kt_matmul_ref(want, w, MM_TYPES[ti], x, n_in, n_out, nt);
            abs_sums(asum, w, MM_TYPES[ti], x, n_in, n_out, nt);
            kt_matmul(NULL, got, w, MM_TYPES[ti], x, n_in, n_out, nt);
            expect_close_mm(got, want, asum, no, 1e-5, kt_dtype_name(MM_TYPES[ti]));
            free(x);
            free(w);
        }
}

/* The AVX-512 float tiles keep each output's 8 lanes and the AVX2 tiles'
 * operations: with AVX-512 on and off the bits are the same (where the
 * CPU has no AVX-512 both runs take the AVX2 tiles). */
static void test_matmul_float_tiers_agree(void **state) {
    (void)state;
    static const int n_ins[] = {8, 100, 2048 + 7};
    static const int n_outs[] = {8, 17, 67};
    static const int n_toks[] = {1, 5, 13};
    kt_pool *pool = kt_pool_new(2, NULL);
    assert_non_null(pool);
    for (int ti = 0; ti < 3; ti++)
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 3; b++)
                for (int c = 0; c < 3; c++) {
                    const int n_in = n_ins[a], n_out = n_outs[b], nt = n_toks[c];
                    const size_t no = (size_t)nt * n_out;
                    void *w = tu_make_weights(MM_TYPES[ti], n_in, n_out, (uint64_t)(a + 3 * b), 0.0f);
                    float *x = tu_xmalloc(sizeof(float) * (size_t)nt * n_in);
                    float *wide = tu_xmalloc(sizeof(float) * no), *narrow = tu_xmalloc(sizeof(float) * no);
                    tu_fill_normal(x, (size_t)nt * n_in, 1.0f, (uint64_t)(a + b + c));
                    kt_matmul(pool, wide, w, MM_TYPES[ti], x, n_in, n_out, nt);
                    kt_cpu_force_no_avx512(true);
                    kt_matmul(pool, narrow, w, MM_TYPES[ti], x, n_in, n_out, nt);
                    kt_cpu_force_no_avx512(false);
                    if (memcmp(wide, narrow, sizeof(float) * no) != 0)
                        fail_msg("%s n_in %d n_out %d n_tokens %d: AVX-512 and AVX2 tiles differ",
                                 kt_dtype_name(MM_TYPES[ti]), n_in, n_out, nt);
                    free(w);
                    free(x);
                    free(wide);
                    free(narrow);
                }
    kt_pool_free(pool);
}

/* With the SIMD kernels off, kt_matmul (threaded) is the reference,
 * bit for bit. */
static void test_matmul_scalar_is_ref(void **state) {
    (void)state;
    kt_pool *pool = kt_pool_new(3, NULL);
    assert_non_null(pool);
    kt_cpu_force_scalar(true);
    for (int ti = 0; ti < N_MM_TYPES; ti++) {
        int n_in = 96, n_out = 37, nt = 6;
        void *w = tu_make_weights(MM_TYPES[ti], n_in, n_out, 31, 0.0f);
        float x[6 * 96], want[6 * 37], got[6 * 37];
        tu_fill_normal(x, sizeof x / sizeof x[0], 1.0f, 3);
        kt_matmul_ref(want, w, MM_TYPES[ti], x, n_in, n_out, nt);
        kt_matmul(pool, got, w, MM_TYPES[ti], x, n_in, n_out, nt);
        assert_memory_equal(want, got, sizeof want);
        free(w);
    }
    kt_cpu_force_scalar(false);
    kt_pool_free(pool);
}

/* A token's outputs are the same bits alone and in batches of any size,
 * with any number of threads (every type, on the path this CPU uses). */
/* Every matmul type, K-quants included (rows of 768: three super-blocks). */
static const kt_dtype INV_TYPES[] = {KT_F32, KT_F16, KT_BF16, KT_Q8_0, KT_Q4_0, KT_Q4_1,
                                     KT_Q5_0, KT_Q5_1, KT_Q4_K, KT_Q5_K, KT_Q6_K,
                                     KT_Q2_K, KT_Q3_K, KT_IQ4_NL, KT_IQ4_XS, KT_MXFP4};

static void check_batch_invariance(bool scalar) {
    kt_pool *pools[3] = {NULL, kt_pool_new(2, NULL), kt_pool_new(3, NULL)};
    assert_non_null(pools[1]);
    assert_non_null(pools[2]);
    kt_cpu_force_scalar(scalar);
    static const int batches[] = {7, 50}; /* 50: more than one token chunk */
    for (size_t ti = 0; ti < sizeof INV_TYPES / sizeof INV_TYPES[0]; ti++) {
        int n_in = kt_dtype_get(INV_TYPES[ti])->block_size == 256 ? 768 : 256 + 32, n_out = 67;
        void *w = tu_make_weights(INV_TYPES[ti], n_in, n_out, 99, 0.0f);
        for (int bi = 0; bi < 2; bi++) {
            int nt = batches[bi];
            float *x = tu_xmalloc(sizeof(float) * (size_t)nt * n_in);
            float *batch = tu_xmalloc(sizeof(float) * (size_t)nt * n_out);
            tu_fill_normal(x, (size_t)nt * n_in, 1.0f, (uint64_t)(1234 + bi));
            kt_matmul(pools[bi + 1], batch, w, INV_TYPES[ti], x, n_in, n_out, nt);
            for (int t = 0; t < nt; t += (bi ? 7 : 1)) {
                for (int p = 0; p < 3; p++) {
                    float alone[67];
                    kt_matmul(pools[p], alone, w, INV_TYPES[ti], x + (size_t)t * n_in, n_in,
                              n_out, 1);
                    if (memcmp(alone, batch + (size_t)t * n_out, sizeof alone) != 0)
                        fail_msg("%s%s: token %d of %d differs alone (pool %d)",
                                 kt_dtype_name(INV_TYPES[ti]), scalar ? " (scalar)" : "", t,
                                 nt, p);
                }
            }
            /* and a sub-batch starting at token 2 */
            float *sub = tu_xmalloc(sizeof(float) * (size_t)5 * n_out);
            kt_matmul(pools[2], sub, w, INV_TYPES[ti], x + (size_t)2 * n_in, n_in, n_out, 5);
            assert_memory_equal(sub, batch + (size_t)2 * n_out, sizeof(float) * 5 * n_out);
            free(sub);
            free(x);
            free(batch);
        }
        free(w);
    }
    kt_cpu_force_scalar(false);
    kt_pool_free(pools[1]);
    kt_pool_free(pools[2]);
}

static void test_matmul_batch_invariance(void **state) {
    (void)state;
    check_batch_invariance(true);
    on_every_int8_tier(check_batch_invariance, false);
}

/* kt_matmul_many gives each part kt_matmul's bits: parts sharing one job
 * (K-quants together, Q8_0-activation types together, floats together,
 * with different heights) and parts that cannot (mixed kinds, run one by
 * one), for one token and a batch, with and without a pool. */
static void test_matmul_many(void **state) {
    (void)state;
    static const kt_dtype sets[][3] = {{KT_Q4_K, KT_Q4_K, KT_Q6_K}, {KT_Q5_0, KT_Q5_0, KT_Q8_0},
                                       {KT_Q4_0, KT_Q4_1, KT_Q5_1}, {KT_F16, KT_F16, KT_F32},
                                       {KT_MXFP4, KT_MXFP4, KT_Q8_0},
                                       {KT_Q4_0, KT_F16, KT_Q6_K}};
    static const int heights[3] = {64, 24, 40};
    const int n_in = 512;
    kt_pool *pool = kt_pool_new(2, NULL);
    assert_non_null(pool);
    float *x = tu_xmalloc(sizeof(float) * 9 * n_in);
    tu_fill_normal(x, (size_t)9 * n_in, 1.0f, 31);
    for (size_t s = 0; s < sizeof sets / sizeof sets[0]; s++)
        for (int c = 0; c < 4; c++) {
            const int nt = c % 2 ? 9 : 1;
            kt_pool *p = c < 2 ? pool : NULL;
            kt_matmul_part parts[3];
            void *w[3];
            float *want[3];
            for (int i = 0; i < 3; i++) {
                w[i] = tu_make_weights(sets[s][i], n_in, heights[i], (uint64_t)(s * 10 + i), 0.0f);
                want[i] = tu_xmalloc(sizeof(float) * (size_t)nt * heights[i]);
                kt_matmul(p, want[i], w[i], sets[s][i], x, n_in, heights[i], nt);
                parts[i] = (kt_matmul_part){tu_xmalloc(sizeof(float) * (size_t)nt * heights[i]), w[i], sets[s][i], heights[i]};
            }
            kt_matmul_many(p, parts, 3, x, n_in, nt);
            for (int i = 0; i < 3; i++) {
                if (memcmp(parts[i].out, want[i], sizeof(float) * (size_t)nt * heights[i]) != 0)
                    fail_msg("set %zu part %d (%s), %d tokens: not kt_matmul's bits", s, i,
                             kt_dtype_name(sets[s][i]), nt);
                free(parts[i].out), free(want[i]), free(w[i]);
            }
        }
    free(x);
    kt_pool_free(pool);
}

/* ---- the repacked (x8) layouts --------------------------------------- */

/* A copy of w (n_out rows of n_in values of type) in its repacked layout. */
static void *repacked_copy(const void *w, kt_dtype type, int n_in, int n_out) {
    const size_t bytes = kt_dtype_row_bytes(type, n_in) * (size_t)n_out;
    void *c = tu_xmalloc(bytes), *tmp = tu_xmalloc(kt_repack_tmp_bytes(type, n_in));
    memcpy(c, w, bytes);
    kt_repack(c, type, n_in, n_out, tmp);
    free(tmp);
    return c;
}

/* A matrix of n_out rows of n_in, repacked, reads back block by block
 * through kt_x8_block, and the layout did change. */
static void check_layout(kt_dtype type, int n_in, int n_out) {
    const int nb = n_in / kt_dtype_get(type)->block_size;
    const size_t row_bytes = kt_dtype_row_bytes(type, n_in), bb = (size_t)kt_dtype_get(type)->block_bytes;
    uint8_t *w = tu_make_weights(type, n_in, n_out, 9, 0.0f);
    uint8_t *x8 = repacked_copy(w, type, n_in, n_out);
    assert_true(memcmp(x8, w, row_bytes * n_out) != 0);
    for (int r = 0; r < n_out; r++)
        for (int b = 0; b < nb; b++) {
            uint8_t got[256];
            kt_x8_block(x8, type, n_in, r, b, got);
            assert_memory_equal(got, w + ((size_t)r * nb + b) * bb, bb);
        }
    free(w), free(x8);
}

/* Repacking keeps every block and the matrix size; only the types with an
 * x8 layout (ops/repack.h), with rows in multiples of 8, qualify, and the
 * in-memory types never count as file types. */
static void test_repack_layout(void **state) {
    (void)state;
    check_layout(KT_Q4_0, 96, 24);
    check_layout(KT_Q4_K, 512, 16);
    check_layout(KT_Q5_K, 512, 16);
    check_layout(KT_Q6_K, 512, 16);
    check_layout(KT_Q5_0, 96, 24);
    check_layout(KT_Q4_1, 96, 24);
    check_layout(KT_Q5_1, 96, 24);
    check_layout(KT_IQ4_NL, 96, 24);
    check_layout(KT_Q8_0, 96, 24);
    check_layout(KT_Q2_K, 512, 16);
    check_layout(KT_Q3_K, 512, 16);
    check_layout(KT_IQ4_XS, 512, 16);
    check_layout(KT_MXFP4, 96, 24);
    assert_int_equal(kt_repack_type(KT_MXFP4, 64, 8), KT_MXFP4_X8);
    assert_int_equal(kt_repack_type(KT_MXFP4, 64, 12), KT_MXFP4);
    assert_false(kt_dtype_known(KT_MXFP4_X8));
    assert_int_equal(kt_repack_plain(KT_MXFP4_X8), KT_MXFP4);
    assert_int_equal(kt_dtype_row_bytes(KT_MXFP4_X8, 96), kt_dtype_row_bytes(KT_MXFP4, 96));
    assert_int_equal(kt_repack_type(KT_Q2_K, 512, 16), KT_Q2_K_X8);
    assert_int_equal(kt_repack_type(KT_Q3_K, 512, 16), KT_Q3_K_X8);
    assert_int_equal(kt_repack_type(KT_IQ4_XS, 512, 16), KT_IQ4_XS_X8);
    assert_int_equal(kt_repack_type(KT_Q2_K, 512, 12), KT_Q2_K);
    assert_false(kt_dtype_known(KT_Q2_K_X8));
    assert_false(kt_dtype_known(KT_Q3_K_X8));
    assert_false(kt_dtype_known(KT_IQ4_XS_X8));
    assert_int_equal(kt_repack_type(KT_IQ4_NL, 64, 8), KT_IQ4_NL_X8);
    assert_int_equal(kt_repack_type(KT_IQ4_NL, 64, 12), KT_IQ4_NL);
    assert_false(kt_dtype_known(KT_IQ4_NL_X8));
    assert_int_equal(kt_dtype_row_bytes(KT_IQ4_NL_X8, 96), kt_dtype_row_bytes(KT_IQ4_NL, 96));
    assert_int_equal(kt_repack_type(KT_Q4_K, 512, 16), KT_Q4_K_X8);
    assert_int_equal(kt_repack_type(KT_Q4_K, 512, 12), KT_Q4_K);
    assert_int_equal(kt_repack_type(KT_Q6_K, 512, 16), KT_Q6_K_X8);
    assert_int_equal(kt_repack_type(KT_Q5_K, 512, 16), KT_Q5_K_X8);
    assert_int_equal(kt_repack_type(KT_Q5_K, 512, 20), KT_Q5_K);
    assert_false(kt_dtype_known(KT_Q4_K_X8));
    assert_false(kt_dtype_known(KT_Q5_K_X8));
    assert_false(kt_dtype_known(KT_Q6_K_X8));
    assert_false(kt_dtype_known(KT_Q5_0_X8));
    assert_int_equal(kt_repack_type(KT_Q5_0, 64, 8), KT_Q5_0_X8);
    assert_int_equal(kt_repack_type(KT_Q5_1, 64, 8), KT_Q5_1_X8);
    assert_int_equal(kt_repack_type(KT_Q4_1, 64, 8), KT_Q4_1_X8);
    assert_false(kt_dtype_known(KT_Q4_1_X8));
    assert_false(kt_dtype_known(KT_Q5_1_X8));
    assert_true(kt_repack_supported(KT_Q4_0, 64, 8));
    assert_false(kt_repack_supported(KT_Q4_0, 64, 12));
    assert_int_equal(kt_repack_type(KT_Q8_0, 64, 8), KT_Q8_0_X8);
    assert_false(kt_repack_supported(KT_Q8_0, 64, 12));
    assert_false(kt_dtype_known(KT_Q8_0_X8));
    assert_int_equal(kt_repack_plain(KT_Q8_0_X8), KT_Q8_0);
    assert_int_equal(kt_dtype_row_bytes(KT_Q8_0_X8, 96), kt_dtype_row_bytes(KT_Q8_0, 96));
    assert_false(kt_repack_supported(KT_Q4_0, 48, 8));
    assert_false(kt_dtype_known(KT_Q4_0_X8)); /* never accepted from a file */
    assert_string_equal(kt_dtype_name(KT_Q4_0_X8), "Q4_0x8");
    assert_int_equal(kt_dtype_row_bytes(KT_Q4_0_X8, 96), kt_dtype_row_bytes(KT_Q4_0, 96));
}

/* Every x8 path (each SIMD tier, the scalar fallback, the reference)
 * gives the bits of the plain type's reference on the original matrix, for one
 * token, decode-sized batches, and batches that span token chunks
 * (under AddressSanitizer those, the slow reference's largest, at one
 * width only: the same chunking, a ninth of the arithmetic). */
static void check_repacked_type(kt_dtype type) {
    const kt_dtype x8_type = kt_repack_type(type, 256, 8);
    const int unit = kt_dtype_get(type)->block_size;
    const int n_ins[] = {unit, 3 * unit, 2048 + unit};
    static const int n_outs[] = {8, 24, 48, 136};
    static const int n_toks[] = {1, 2, 3, 5, 8, 9, 13, 140};
    kt_pool *pool = kt_pool_new(2, NULL);
    assert_non_null(pool);
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 4; b++) {
            const int n_in = n_ins[a], n_out = n_outs[b];
            void *w = tu_make_weights(type, n_in, n_out, (uint64_t)(a * 10 + b), 0.0f);
            void *x8 = repacked_copy(w, type, n_in, n_out);
            for (int c = 0; c < 8; c++) {
                const int nt = n_toks[c];
                if (nt > 13 && n_in < 2048) continue; /* chunks need long rows */
                if (nt > 13 && TU_SANITIZED && b != 1) continue;
                const size_t no = (size_t)nt * n_out;
                float *x = tu_xmalloc(sizeof(float) * (size_t)nt * n_in);
                float *want = tu_xmalloc(sizeof(float) * no), *got = tu_xmalloc(sizeof(float) * no);
                tu_fill_normal(x, (size_t)nt * n_in, 1.0f, (uint64_t)(100 * a + 10 * b + c));
                kt_matmul_ref(want, w, type, x, n_in, n_out, nt);
                kt_matmul(b == 0 ? NULL : pool, got, x8, x8_type, x, n_in, n_out, nt);
                if (memcmp(got, want, sizeof(float) * no) != 0)
                    fail_msg("%s n_in %d n_out %d n_tokens %d: not the %s reference's bits", kt_dtype_name(x8_type),
                             n_in, n_out, nt, kt_dtype_name(type));
                if (nt <= 3) {
                    kt_matmul_ref(got, x8, x8_type, x, n_in, n_out, nt);
                    assert_memory_equal(got, want, sizeof(float) * no);
                    kt_cpu_force_scalar(true);
                    kt_matmul(pool, got, x8, x8_type, x, n_in, n_out, nt);
                    kt_cpu_force_scalar(false);
                    assert_memory_equal(got, want, sizeof(float) * no);
                }
                free(x);
                free(want);
                free(got);
            }
            free(w);
            free(x8);
        }
    kt_pool_free(pool);
}

static void check_repacked_matmul(bool unused) {
    (void)unused;
    check_repacked_type(KT_Q4_0);
    check_repacked_type(KT_Q4_K);
    check_repacked_type(KT_Q5_K);
    check_repacked_type(KT_Q6_K);
    check_repacked_type(KT_Q5_0);
    check_repacked_type(KT_Q4_1);
    check_repacked_type(KT_Q5_1);
    check_repacked_type(KT_IQ4_NL);
    check_repacked_type(KT_Q2_K);
    check_repacked_type(KT_Q3_K);
    check_repacked_type(KT_IQ4_XS);
    check_repacked_type(KT_MXFP4);
    check_repacked_type(KT_Q8_0);
}

static void test_repacked_matmul(void **state) {
    (void)state;
    on_every_int8_tier(check_repacked_matmul, false);
}

/* K-quant matrices at their top levels (every level byte 0xFF) against
 * activations all at one extreme: the largest integer sums any tile
 * forms. AVX2 adds maddubs pairs in int16 where they cannot overflow (8
 * of Q4_K's 2 x 15 x 127, not of Q5_K's 2 x 31 x 127); random data
 * never comes near that bound, this does. Plain and repacked, against
 * the reference. Q2_K, Q3_K, IQ4_XS likewise (their x8 tiles keep group
 * sums in int16 halves, |s| <= 22352 for Q3_K), IQ4_XS also at its most
 * negative level. */
static void check_kquant_extremes(bool unused) {
    (void)unused;
    /* IQ4_XS twice: every nibble 15 (level 113), then every nibble 0 (-127) */
    static const kt_dtype types[] = {KT_Q4_K, KT_Q5_K, KT_Q6_K, KT_Q2_K, KT_Q3_K, KT_IQ4_XS, KT_IQ4_XS};
    static const int n_toks[] = {1, 2, 5, 9};
    enum { N_IN = 512, N_OUT = 16 };
    kt_pool *pool = kt_pool_new(2, NULL);
    assert_non_null(pool);
    for (int ti = 0; ti < 7; ti++) {
        const kt_dtype type = types[ti];
        const size_t bb = (size_t)kt_dtype_get(type)->block_bytes, n_blocks = (size_t)N_OUT * N_IN / QK_K;
        uint8_t *w = tu_xmalloc(bb * n_blocks);
        memset(w, 0xFF, bb * n_blocks);
        const uint16_t one = 0x3C00; /* fp16 1.0 for d (and dmin): 0xFFFF is a NaN */
        for (size_t b = 0; b < n_blocks; b++) {
            uint8_t *blk = w + b * bb;
            if (type == KT_Q2_K) {
                memcpy(blk + offsetof(block_q2_K, d), &one, 2);
                memcpy(blk + offsetof(block_q2_K, dmin), &one, 2);
                continue;
            }
            if (type == KT_Q3_K) {
                memcpy(blk + offsetof(block_q3_K, d), &one, 2);
                continue;
            }
            if (type == KT_IQ4_XS) {
                memcpy(blk + offsetof(block_iq4_xs, d), &one, 2);
                if (ti == 6) memset(blk + offsetof(block_iq4_xs, qs), 0, QK_K / 2);
                continue;
            }
            if (type == KT_Q6_K) {
                memcpy(blk + offsetof(block_q6_K, d), &one, 2);
                continue;
            }
            memcpy(blk + offsetof(block_q4_K, d), &one, 2); /* Q5_K's d, dmin sit there too */
            memcpy(blk + offsetof(block_q4_K, dmin), &one, 2);
        }
        void *x8 = repacked_copy(w, type, N_IN, N_OUT);
        const kt_dtype x8_type = kt_repack_type(type, N_IN, N_OUT);
        for (int c = 0; c < 4; c++) {
            const int nt = n_toks[c];
            float *x = tu_xmalloc(sizeof(float) * nt * N_IN), *want = tu_xmalloc(sizeof(float) * nt * N_OUT),
                  *got = tu_xmalloc(sizeof(float) * nt * N_OUT);
            for (int i = 0; i < nt * N_IN; i++) x[i] = c % 2 ? -1.0f : 1.0f;
            kt_matmul_ref(want, w, type, x, N_IN, N_OUT, nt);
            for (int packed = 0; packed < 2; packed++) {
                kt_matmul(pool, got, packed ? x8 : w, packed ? x8_type : type, x, N_IN, N_OUT, nt);
                if (memcmp(got, want, sizeof(float) * nt * N_OUT) != 0)
                    fail_msg("%s, %d tokens at the extremes: %.9g, reference %.9g", kt_dtype_name(packed ? x8_type : type),
                             nt, got[0], want[0]);
            }
            free(x), free(want), free(got);
        }
        free(w), free(x8);
    }
    kt_pool_free(pool);
}

static void test_kquant_extremes(void **state) {
    (void)state;
    on_every_int8_tier(check_kquant_extremes, false);
}

/* A 32-value type whose block is an fp16 d then its value bytes (IQ4_NL,
 * Q8_0), every block filled with one byte (fills[k]: every value
 * levels[k]), d = 1, against activations all at +-1 (quantized to
 * +-127): the largest integer sums the tiles form. Plain and x8, against
 * the reference. */
static void check_level_extremes(kt_dtype type, const uint8_t fills[2], const float levels[2]) {
    static const int n_toks[] = {1, 2, 5, 9, 17};
    enum { N_IN = 256, N_OUT = 32 };
    kt_pool *pool = kt_pool_new(2, NULL);
    assert_non_null(pool);
    const size_t bb = kt_dtype_get(type)->block_bytes, n_blocks = (size_t)N_OUT * N_IN / 32;
    const kt_dtype x8_type = kt_repack_type(type, N_IN, N_OUT);
    assert_int_not_equal(x8_type, type);
    uint8_t *w = tu_xmalloc(bb * n_blocks);
    for (int fill = 0; fill < 2; fill++) {
        for (size_t b = 0; b < n_blocks; b++) {
            const uint16_t one = 0x3C00; /* fp16 1.0 */
            memcpy(w + b * bb, &one, 2);
            memset(w + b * bb + 2, fills[fill], bb - 2);
        }
        void *x8 = repacked_copy(w, type, N_IN, N_OUT);
        for (int c = 0; c < 5; c++) {
            const int nt = n_toks[c];
            float *x = tu_xmalloc(sizeof(float) * nt * N_IN), *want = tu_xmalloc(sizeof(float) * nt * N_OUT),
                  *got = tu_xmalloc(sizeof(float) * nt * N_OUT);
            for (int i = 0; i < nt * N_IN; i++) x[i] = c % 2 ? -1.0f : 1.0f;
            kt_matmul_ref(want, w, type, x, N_IN, N_OUT, nt);
            /* the sums really are at the extremes: level x 256 x (+-1) */
            const float sign = c % 2 ? -1.0f : 1.0f;
            assert_true(fabsf(want[0] - levels[fill] * sign * N_IN) < 1e-3f * N_IN * 128.0f);
            for (int packed = 0; packed < 2; packed++) {
                kt_matmul(pool, got, packed ? x8 : (void *)w, packed ? x8_type : type, x, N_IN, N_OUT, nt);
                if (memcmp(got, want, sizeof(float) * nt * N_OUT) != 0)
                    fail_msg("%s, fill %d, %d tokens at the extremes: %.9g, reference %.9g",
                             kt_dtype_name(packed ? x8_type : type), fill, nt, got[0], want[0]);
            }
            free(x), free(want), free(got);
        }
        free(x8);
    }
    free(w);
    kt_pool_free(pool);
}

/* IQ4_NL at its extreme levels (every nibble 0: -127; every nibble 15:
 * 113): the AVX2 tile's maddubs pairs reach 2 x 127 x 127, one short of
 * int16's limit, and the VNNI tiles' +128 levels 241 x 127 per product.
 * Q8_0 at its extreme values (every byte -128, which a file may hold
 * though kettle's quantizer writes -127..127; every byte 127): the AVX2
 * sign trick's pairs reach 2 x 128 x 127, 255 short of int16's limit, and
 * the VNNI tiles' u = value + 128 is 0 or 255. */
static void check_byte_level_extremes(bool unused) {
    (void)unused;
    check_level_extremes(KT_IQ4_NL, (const uint8_t[2]){0x00, 0xFF}, (const float[2]){-127.0f, 113.0f});
    check_level_extremes(KT_Q8_0, (const uint8_t[2]){0x80, 0x7F}, (const float[2]){-128.0f, 127.0f});
}

static void test_byte_level_extremes(void **state) {
    (void)state;
    on_every_int8_tier(check_byte_level_extremes, false);
}

/* MXFP4 over its whole exponent range and at its extreme levels, plain
 * and x8, against the reference: blocks whose E8M0 bytes run through
 * 0 .. 255 (subnormal scales 0 and 1, the top ones near float's limit,
 * where d_w * d_x and the sums overflow to infinity on every path alike:
 * the SIMD scales are built from bits, kt_e8m0_half from the same bits),
 * then every nibble 7 (+12) or 15 (-12) against activations at +-1 (a
 * sum of 12 x 127 x 32 per block). */
static void check_mxfp4_scales_extremes(bool unused) {
    (void)unused;
    static const int n_toks[] = {1, 2, 5, 9, 17};
    enum { N_IN = 256, N_OUT = 32, NB = N_IN / QK_MXFP4 };
    kt_pool *pool = kt_pool_new(2, NULL);
    assert_non_null(pool);
    block_mxfp4 *w = tu_make_weights(KT_MXFP4, N_IN, N_OUT, 5, 0.0f);
    for (int fill = 0; fill < 3; fill++) {
        for (int b = 0; b < NB * N_OUT; b++) {
            if (fill == 0) w[b].e = (uint8_t)((b * 37) % 256); /* every byte: 37 is odd */
            else {
                w[b].e = 127;
                memset(w[b].qs, fill == 1 ? 0x77 : 0xFF, sizeof w[b].qs);
            }
        }
        void *x8 = repacked_copy(w, KT_MXFP4, N_IN, N_OUT);
        for (int c = 0; c < 5; c++) {
            const int nt = n_toks[c];
            float *x = tu_xmalloc(sizeof(float) * nt * N_IN), *want = tu_xmalloc(sizeof(float) * nt * N_OUT),
                  *got = tu_xmalloc(sizeof(float) * nt * N_OUT);
            if (fill == 0) tu_fill_normal(x, (size_t)nt * N_IN, 1.0f, (uint64_t)c);
            else
                for (int i = 0; i < nt * N_IN; i++) x[i] = c % 2 ? -1.0f : 1.0f;
            kt_matmul_ref(want, w, KT_MXFP4, x, N_IN, N_OUT, nt);
            if (fill) { /* the sums really are at the extremes: +-6 x 256 x (+-1) */
                const float level = fill == 1 ? 6.0f : -6.0f, sign = c % 2 ? -1.0f : 1.0f;
                assert_true(fabsf(want[0] - level * sign * N_IN) < 1e-3f * N_IN * 6.0f);
            }
            for (int packed = 0; packed < 2; packed++) {
                kt_matmul(c % 2 ? pool : NULL, got, packed ? x8 : (void *)w, packed ? KT_MXFP4_X8 : KT_MXFP4, x, N_IN,
                          N_OUT, nt);
                if (memcmp(got, want, sizeof(float) * nt * N_OUT) != 0)
                    fail_msg("%s, fill %d, %d tokens: %.9g, reference %.9g", packed ? "MXFP4x8" : "MXFP4", fill, nt,
                             got[0], want[0]);
            }
            free(x), free(want), free(got);
        }
        free(x8);
    }
    free(w);
    kt_pool_free(pool);
}

static void test_mxfp4_scales_extremes(void **state) {
    (void)state;
    on_every_int8_tier(check_mxfp4_scales_extremes, false);
}

/* MoE experts: a merged [n_in, n_out, n_expert] MXFP4 tensor is used as
 * n_expert matrices, expert e the e-th slab of n_out rows (model.c's
 * bind_experts): its rows are not aligned (17-byte blocks) and the
 * kernels read it as any matrix. Each expert's product, plain and
 * repacked (as llm_model_repack does it per slab), is the reference's on
 * a copy of that expert alone, and the expert's own (not a neighbour's:
 * the experts differ). */
static void test_mxfp4_expert_views(void **state) {
    (void)state;
    enum { N_IN = 96, N_OUT = 24, N_EXP = 3, NT = 5 };
    const size_t slab = kt_dtype_row_bytes(KT_MXFP4, N_IN) * N_OUT;
    /* rows of 51 bytes, and the tensor itself at an odd address: no load
     * may assume alignment */
    uint8_t *made = tu_make_weights(KT_MXFP4, N_IN, N_OUT * N_EXP, 77, 0.0f);
    uint8_t *buf = tu_xmalloc(slab * N_EXP + 1), *merged = buf + 1;
    memcpy(merged, made, slab * N_EXP);
    free(made);
    float x[NT * N_IN], want[NT * N_OUT], got[NT * N_OUT], prev[NT * N_OUT];
    tu_fill_normal(x, NT * N_IN, 1.0f, 8);
    kt_pool *pool = kt_pool_new(2, NULL);
    assert_non_null(pool);
    uint8_t *tmp = tu_xmalloc(kt_repack_tmp_bytes(KT_MXFP4, N_IN));
    for (int e = 0; e < N_EXP; e++) {
        uint8_t *view = merged + slab * (size_t)e, *alone = tu_xmalloc(slab);
        memcpy(alone, view, slab);
        for (int nt = 1; nt <= NT; nt += NT - 1) {
            kt_matmul_ref(want, alone, KT_MXFP4, x, N_IN, N_OUT, nt);
            kt_matmul(pool, got, view, KT_MXFP4, x, N_IN, N_OUT, nt);
            assert_memory_equal(got, want, sizeof(float) * nt * N_OUT);
            if (e > 0 && nt == NT) assert_true(memcmp(got, prev, sizeof got) != 0);
        }
        memcpy(prev, got, sizeof got);
        free(alone);
    }
    /* repacked in place slab by slab, each expert still its own product */
    uint8_t *orig = tu_xmalloc(slab * N_EXP);
    memcpy(orig, merged, slab * N_EXP);
    for (int e = 0; e < N_EXP; e++) {
        assert_true(kt_repack_supported(KT_MXFP4, N_IN, N_OUT));
        kt_repack(merged + slab * (size_t)e, KT_MXFP4, N_IN, N_OUT, tmp);
    }
    for (int e = 0; e < N_EXP; e++) {
        kt_matmul_ref(want, orig + slab * (size_t)e, KT_MXFP4, x, N_IN, N_OUT, NT);
        kt_matmul(pool, got, merged + slab * (size_t)e, KT_MXFP4_X8, x, N_IN, N_OUT, NT);
        assert_memory_equal(got, want, sizeof got);
    }
    free(orig), free(tmp), free(buf);
    kt_pool_free(pool);
}

/* ---- the x16 layouts (float weights) ---------------------------------- */

/* A float matrix repacked to x16 keeps every value where kt_x16_at says
 * (the bytes themselves: no conversion), in place and at the same size. */
static void check_x16_layout(kt_dtype type, int n_in, int n_out) {
    const size_t row_bytes = kt_dtype_row_bytes(type, n_in), esz = (size_t)kt_dtype_get(type)->block_bytes;
    uint8_t *w = tu_make_weights(type, n_in, n_out, 7, 0.0f);
    uint8_t *x16 = repacked_copy(w, type, n_in, n_out);
    assert_true(memcmp(x16, w, row_bytes * n_out) != 0);
    for (int r = 0; r < n_out; r++)
        for (int i = 0; i < n_in; i++)
            assert_memory_equal(kt_x16_at(x16, (int)esz, n_in, r, i), w + (size_t)r * row_bytes + (size_t)i * esz, esz);
    free(w), free(x16);
}

/* kt_repack_row_f32 reads every row of a repacked matrix back as the
 * plain type's dequantized row, and a plain matrix's rows as they are. */
static void check_row_f32(kt_dtype type, int n_in, int n_out) {
    const size_t row_bytes = kt_dtype_row_bytes(type, n_in);
    uint8_t *w = tu_make_weights(type, n_in, n_out, 11, 0.0f);
    uint8_t *packed = repacked_copy(w, type, n_in, n_out);
    const kt_dtype packed_type = kt_repack_type(type, n_in, n_out);
    assert_int_not_equal(packed_type, type);
    assert_int_equal(kt_repack_plain(packed_type), type);
    float *want = tu_xmalloc(sizeof(float) * n_in), *got = tu_xmalloc(sizeof(float) * n_in);
    for (int r = 0; r < n_out; r++) {
        kt_dequantize_row(type, w + (size_t)r * row_bytes, want, n_in);
        kt_repack_row_f32(packed, packed_type, n_in, r, got);
        assert_memory_equal(got, want, sizeof(float) * n_in);
        kt_repack_row_f32(w, type, n_in, r, got);
        assert_memory_equal(got, want, sizeof(float) * n_in);
    }
    free(w), free(packed), free(want), free(got);
}

static void test_repacked_rows(void **state) {
    (void)state;
    static const kt_dtype types[] = {KT_Q4_0, KT_Q4_1, KT_Q5_0, KT_Q5_1, KT_Q4_K, KT_Q6_K, KT_F16, KT_BF16, KT_F32,
                                     KT_IQ4_NL, KT_Q2_K, KT_Q3_K, KT_IQ4_XS, KT_MXFP4};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        check_row_f32(types[i], kt_dtype_get(types[i])->block_size == 256 ? 512 : 96, 48);
    assert_int_equal(kt_repack_plain(KT_Q8_0), KT_Q8_0);
}

static void test_x16_layout(void **state) {
    (void)state;
    check_x16_layout(KT_F16, 40, 32);
    check_x16_layout(KT_BF16, 7, 48);
    check_x16_layout(KT_F32, 33, 16);
    assert_int_equal(kt_repack_type(KT_F16, 40, 32), KT_F16_X16);
    assert_int_equal(kt_repack_type(KT_BF16, 1, 16), KT_BF16_X16);
    assert_int_equal(kt_repack_type(KT_F32, 5, 64), KT_F32_X16);
    assert_int_equal(kt_repack_type(KT_F16, 40, 24), KT_F16); /* not whole groups */
    assert_int_equal(kt_repack_tmp_bytes(KT_F16, 40), 16 * 80);
    assert_int_equal(kt_repack_tmp_bytes(KT_Q4_0, 64), 8 * 36);
    assert_false(kt_dtype_known(KT_F16_X16));
    assert_false(kt_dtype_known(KT_BF16_X16));
    assert_false(kt_dtype_known(KT_F32_X16));
    assert_string_equal(kt_dtype_name(KT_F16_X16), "F16x16");
    assert_int_equal(kt_dtype_row_bytes(KT_F16_X16, 40), kt_dtype_row_bytes(KT_F16, 40));
    assert_int_equal(kt_dtype_row_bytes(KT_F32_X16, 40), kt_dtype_row_bytes(KT_F32, 40));
    /* an x16 matrix must come in whole groups: other shapes give NaN and
     * write nothing past out (the canary) */
    const int n_in = 40, n_out = 20;
    uint16_t *w = tu_xmalloc(sizeof(uint16_t) * 32 * n_in);
    memset(w, 0, sizeof(uint16_t) * 32 * n_in);
    float x[40] = {0}, out[21];
    out[20] = 123.0f;
    kt_pool *pool = kt_pool_new(2, NULL);
    assert_non_null(pool);
    kt_matmul(pool, out, w, KT_F16_X16, x, n_in, n_out, 1);
    for (int r = 0; r < n_out; r++) assert_true(isnan(out[r]));
    kt_matmul_ref(out, w, KT_F16_X16, x, n_in, n_out, 1);
    for (int r = 0; r < n_out; r++) assert_true(isnan(out[r]));
    assert_true(out[20] == 123.0f);
    kt_pool_free(pool);
    free(w);
}

/* Every x16 path (both SIMD tiers, the scalar fallback, 1 or 2 threads)
 * gives the x16 reference's bits, one fma chain per output, for one token,
 * every GEMM tile width, and batches that span token chunks; and that
 * reference is the plain type's product within float rounding.
 * Under AddressSanitizer the long rows (2048 + 5) run at the two smaller
 * heights only: the same tiles, tails and token chunks, a third of the
 * slow references' arithmetic; the larger heights (their row groups split
 * over the threads) still run on the shorter rows. */
static void check_x16_type(kt_dtype type) {
    const kt_dtype x16_type = kt_repack_type(type, 16, 16);
    static const int n_ins[] = {1, 7, 40, 2048 + 5};
    static const int n_outs[] = {16, 48, 144, 272};
    static const int n_toks[] = {1, 2, 3, 5, 6, 7, 11, 12, 13, 25, 140};
    kt_pool *pool = kt_pool_new(2, NULL);
    assert_non_null(pool);
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++) {
            const int n_in = n_ins[a], n_out = n_outs[b];
            void *w = tu_make_weights(type, n_in, n_out, (uint64_t)(a * 10 + b), 0.0f);
            void *x16 = repacked_copy(w, type, n_in, n_out);
            for (size_t c = 0; c < sizeof n_toks / sizeof n_toks[0]; c++) {
                const int nt = n_toks[c];
                if (nt > 13 && n_in < 2048 && b != 1) continue; /* chunks need long rows */
                if (TU_SANITIZED && n_in > 2048 && b > 1) continue;
                const size_t no = (size_t)nt * n_out;
                float *x = tu_xmalloc(sizeof(float) * (size_t)nt * n_in);
                float *want = tu_xmalloc(sizeof(float) * no), *got = tu_xmalloc(sizeof(float) * no);
                double *asum = tu_xmalloc(sizeof(double) * no);
                tu_fill_normal(x, (size_t)nt * n_in, 1.0f, (uint64_t)(100 * a + 10 * b + (int)c));
                kt_matmul_ref(want, x16, x16_type, x, n_in, n_out, nt);
                kt_matmul_ref(got, w, type, x, n_in, n_out, nt);
                abs_sums(asum, w, type, x, n_in, n_out, nt);
                expect_close_mm(want, got, asum, no, 1e-5, kt_dtype_name(x16_type));
                for (int path = 0; path < 4; path++) {
                    kt_cpu_force_no_avx512(path == 1);
                    kt_cpu_force_scalar(path == 2);
                    kt_matmul(path == 3 ? NULL : pool, got, x16, x16_type, x, n_in, n_out, nt);
                    kt_cpu_force_no_avx512(false);
                    kt_cpu_force_scalar(false);
                    if (memcmp(got, want, sizeof(float) * no) != 0)
                        fail_msg("%s n_in %d n_out %d n_tokens %d path %d: not the reference's bits",
                                 kt_dtype_name(x16_type), n_in, n_out, nt, path);
                }
                free(x), free(want), free(got), free(asum);
            }
            free(w), free(x16);
        }
    kt_pool_free(pool);
}

/* Rows this long make the x16 GEMM take 70 tokens in two passes: every
 * path still gives the reference's bits, and one token alone its row of
 * the batch. */
static void check_x16_chunks(kt_dtype type) {
    const int n_in = 16384 + 3, n_out = 32, nt = 70;
    const kt_dtype x16_type = kt_repack_type(type, n_in, n_out);
    void *plain = tu_make_weights(type, n_in, n_out, 77, 0.0f);
    void *w = repacked_copy(plain, type, n_in, n_out);
    free(plain);
    float *x = tu_xmalloc(sizeof(float) * (size_t)nt * n_in);
    float *want = tu_xmalloc(sizeof(float) * (size_t)nt * n_out), *got = tu_xmalloc(sizeof(float) * (size_t)nt * n_out);
    tu_fill_normal(x, (size_t)nt * n_in, 1.0f, 78);
    kt_matmul_ref(want, w, x16_type, x, n_in, n_out, nt);
    kt_pool *pool = kt_pool_new(2, NULL);
    assert_non_null(pool);
    for (int path = 0; path < 2; path++) {
        kt_cpu_force_no_avx512(path == 1);
        kt_matmul(pool, got, w, x16_type, x, n_in, n_out, nt);
        assert_memory_equal(got, want, sizeof(float) * (size_t)nt * n_out);
        kt_matmul(pool, got, w, x16_type, x + (size_t)69 * n_in, n_in, n_out, 1);
        assert_memory_equal(got, want + (size_t)69 * n_out, sizeof(float) * n_out);
        kt_cpu_force_no_avx512(false);
    }
    kt_pool_free(pool);
    free(w), free(x), free(want), free(got);
}

static void test_x16_matmul(void **state) {
    (void)state;
    if (TU_SANITIZED) printf("  (ASan build: the x16 long rows at heights 16 and 48 only)\n");
    check_x16_type(KT_F16);
    check_x16_type(KT_BF16);
    check_x16_type(KT_F32);
    check_x16_chunks(KT_F16);
}

/* Long rows make the GEMMs split the tokens into several passes (the
 * chunk shrinks as n_in grows); results must not notice. */
static void test_matmul_token_chunks(void **state) {
    (void)state;
    const int n_in = 16384, n_out = 20, nt = 30;
    kt_pool *pool = kt_pool_new(2, NULL);
    assert_non_null(pool);
    float *x = tu_xmalloc(sizeof(float) * (size_t)nt * n_in);
    tu_fill_normal(x, (size_t)nt * n_in, 1.0f, 555);
    float want[30 * 20], got[30 * 20], one[20];
    double asum[30 * 20];
    for (int ti = 0; ti < N_MM_TYPES; ti++) {
        kt_dtype type = MM_TYPES[ti];
        void *w = tu_make_weights(type, n_in, n_out, 4242, 0.0f);
        kt_matmul_ref(want, w, type, x, n_in, n_out, nt);
        abs_sums(asum, w, type, x, n_in, n_out, nt);
        kt_matmul(pool, got, w, type, x, n_in, n_out, nt);
        expect_close_mm(got, want, asum, (size_t)nt * n_out, 1e-4, kt_dtype_name(type));
        if (is_exact_type(type)) assert_memory_equal(got, want, sizeof want);
        for (int t = 0; t < nt; t += 7) {
            kt_matmul(pool, one, w, type, x + (size_t)t * n_in, n_in, n_out, 1);
            assert_memory_equal(one, got + (size_t)t * n_out, sizeof one);
        }
        free(w);
    }
    free(x);
    kt_pool_free(pool);
}

static void test_matmul_supported(void **state) {
    (void)state;
    for (int i = 0; i < N_MM_TYPES; i++) assert_true(kt_matmul_supported(MM_TYPES[i]));
    assert_false(kt_matmul_supported(KT_Q8_K)); /* activations only; K-quants: test_kquant.c */
    assert_false(kt_matmul_supported(KT_I32));
}

/* ---- element-wise kernels ------------------------------------------- */

static const int EW_SIZES[] = {1, 7, 8, 31, 64, 100, 2048 + 5};

static void expect_rel(const float *got, const float *want, int n, float rel, float abs_floor,
                       const char *what) {
    for (int i = 0; i < n; i++) {
        float lim = rel * fabsf(want[i]) + abs_floor;
        if (!(fabsf(got[i] - want[i]) <= lim))
            fail_msg("%s: element %d of %d: %.9g vs reference %.9g", what, i, n, got[i], want[i]);
    }
}

/* The delta rule: a run of tokens through each SIMD kernel gives the
 * reference's bits token after token (in place, and with the first token
 * reading a state it leaves untouched), whatever the run's length; and
 * the reference is the definition (double) within float rounding. */
static void check_delta_rule(void) {
    const int shapes[][2] = {{128, 128}, {32, 8}, {16, 40}, {64, 24}, {7, 16}};
    const int runs[] = {1, 3, 1, 5}; /* 10 tokens in runs of these lengths */
    enum { N_TOK = 10 };
    for (int s = 0; s < 5; s++) {
        const int dk = shapes[s][0], dv = shapes[s][1];
        const size_t n_s = (size_t)dk * dv;
        float *S0 = tu_xmalloc(sizeof(float) * n_s), *S1 = tu_xmalloc(sizeof(float) * n_s);
        float *Sin = tu_xmalloc(sizeof(float) * n_s), *Sref = tu_xmalloc(sizeof(float) * n_s);
        double *Sd = tu_xmalloc(sizeof(double) * n_s);
        float *q = tu_xmalloc(sizeof(float) * dk * N_TOK), *k = tu_xmalloc(sizeof(float) * dk * N_TOK);
        float *v = tu_xmalloc(sizeof(float) * dv * N_TOK), *u = tu_xmalloc(sizeof(float) * dv);
        float *o0 = tu_xmalloc(sizeof(float) * dv * N_TOK), *o1 = tu_xmalloc(sizeof(float) * dv * N_TOK);
        float decay[N_TOK], beta[N_TOK];
        const float *qp[N_TOK], *kp[N_TOK], *vp[N_TOK];
        float *op0[N_TOK], *op1[N_TOK];
        for (int t = 0; t < N_TOK; t++) {
            tu_fill_normal(q + t * dk, dk, 0.3f, 100 * s + 3 * t), tu_fill_normal(k + t * dk, dk, 0.3f, 100 * s + 3 * t + 1);
            tu_fill_normal(v + t * dv, dv, 1.0f, 100 * s + 3 * t + 2);
            decay[t] = 0.5f + 0.05f * t, beta[t] = 0.9f - 0.07f * t;
            qp[t] = q + t * dk, kp[t] = k + t * dk, vp[t] = v + t * dv, op0[t] = o0 + t * dv, op1[t] = o1 + t * dv;
        }
        tu_fill_normal(S0, (int)n_s, 0.5f, 7 + s);
        memcpy(S1, S0, sizeof(float) * n_s);
        for (size_t i = 0; i < n_s; i++) Sd[i] = S0[i];
        for (int r = 0, t0 = 0; r < 4; t0 += runs[r++]) {
            const kt_delta_run run0 = {runs[r], qp + t0, kp + t0, vp + t0, decay + t0, beta + t0, op0 + t0};
            const kt_delta_run run1 = {runs[r], qp + t0, kp + t0, vp + t0, decay + t0, beta + t0, op1 + t0};
            kt_delta_rule_run_ref(S0, S0, &run0, dk, dv, u);
            if (r % 2) { /* out of place: S1 moves on from a copy it must not write */
                memcpy(Sin, S1, sizeof(float) * n_s), memcpy(Sref, S1, sizeof(float) * n_s);
                tu_fill_normal(S1, (int)n_s, 9.0f, 1); /* garbage where the run writes */
                kt_delta_rule_run(S1, Sin, &run1, dk, dv, u);
                if (memcmp(Sin, Sref, sizeof(float) * n_s) != 0)
                    fail_msg("delta rule %d x %d, run %d: out of place wrote the state it read", dk, dv, r);
            } else {
                kt_delta_rule_run(S1, S1, &run1, dk, dv, u);
            }
            if (memcmp(S0, S1, sizeof(float) * n_s) != 0 ||
                memcmp(o0 + t0 * dv, o1 + t0 * dv, sizeof(float) * dv * runs[r]) != 0)
                fail_msg("delta rule %d x %d, run %d of %d tokens: the SIMD state or output differs from the reference",
                         dk, dv, r, runs[r]);
        }
        for (int t = 0; t < N_TOK; t++) { /* the definition in double */
            for (int c = 0; c < dv; c++) {
                double kv = 0, oc = 0;
                for (int r = 0; r < dk; r++) kv += Sd[(size_t)r * dv + c] * decay[t] * k[t * dk + r];
                const double uc = (v[t * dv + c] - kv) * beta[t];
                for (int r = 0; r < dk; r++) {
                    Sd[(size_t)r * dv + c] = Sd[(size_t)r * dv + c] * decay[t] + k[t * dk + r] * uc;
                    oc += Sd[(size_t)r * dv + c] * q[t * dk + r];
                }
                if (!(fabs(o0[t * dv + c] - oc) <= 1e-4 * (1 + fabs(oc))))
                    fail_msg("delta rule %d x %d, token %d, column %d: %.9g vs %.9g in double", dk, dv, t, c,
                             o0[t * dv + c], oc);
            }
        }
        free(S0), free(S1), free(Sin), free(Sref), free(Sd), free(q), free(k), free(v), free(u), free(o0), free(o1);
    }
}

static void test_delta_rule(void **state) {
    (void)state;
    check_delta_rule(); /* the widest tier this CPU has */
    kt_cpu_force_no_avx512(true); /* and AVX2 where that was AVX-512 */
    check_delta_rule();
    kt_cpu_force_no_avx512(false);
}

/* SIMD within 1e-5 relative: only the sum of squares is ordered
 * differently (and the ref's sequential float sum is the less exact). */
static void test_rmsnorm(void **state) {
    (void)state;
    for (int s = 0; s < 7; s++) {
        int n = EW_SIZES[s];
        float *x = tu_xmalloc(sizeof(float) * n), *w = tu_xmalloc(sizeof(float) * n);
        float *a = tu_xmalloc(sizeof(float) * n), *b = tu_xmalloc(sizeof(float) * n);
        tu_fill_normal(x, n, 2.0f, 1 + s);
        tu_fill_normal(w, n, 1.0f, 100 + s);
        kt_rmsnorm_ref(a, x, w, n, 1e-5f);
        kt_rmsnorm(b, x, w, n, 1e-5f);
        expect_rel(b, a, n, 1e-5f, 0.0f, "rmsnorm");
        /* the definition, in double */
        double ss = 0;
        for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
        double sc = 1.0 / sqrt(ss / n + 1e-5);
        for (int i = 0; i < n; i++) assert_true(fabs(a[i] - x[i] * sc * w[i]) <= 1e-5 * fabs(x[i] * sc * w[i]) + 1e-30);
        /* in place */
        memcpy(a, x, sizeof(float) * n);
        kt_rmsnorm(a, a, w, n, 1e-5f);
        assert_memory_equal(a, b, sizeof(float) * n);
        free(x);
        free(w);
        free(a);
        free(b);
    }
}

/* SIMD exp within ~2 ulp of expf, and the sum of n terms reordered (the
 * reference adds them one by one in float): 1e-5 relative. */
static void test_softmax(void **state) {
    (void)state;
    for (int s = 0; s < 7; s++) {
        int n = EW_SIZES[s];
        float *a = tu_xmalloc(sizeof(float) * n), *b = tu_xmalloc(sizeof(float) * n);
        tu_fill_normal(a, n, 5.0f, 40 + s);
        if (n > 3) a[3] = -1e30f; /* underflows to 0 */
        memcpy(b, a, sizeof(float) * n);
        kt_softmax_ref(a, n);
        kt_softmax(b, n);
        expect_rel(b, a, n, 1e-5f, 1e-37f, "softmax");
        double sum = 0;
        for (int i = 0; i < n; i++) sum += b[i];
        assert_true(fabs(sum - 1.0) < 1e-5);
        free(a);
        free(b);
    }
}

/* GeGLU: the SIMD twin against the reference (vector exp: 2e-6
 * relative), in place, and the reference against the textbook tanh GELU
 * in double (the sigmoid form is the same function). */
static void test_geglu(void **state) {
    (void)state;
    for (int s = 0; s < 7; s++) {
        int n = EW_SIZES[s];
        float *g = tu_xmalloc(sizeof(float) * n), *u = tu_xmalloc(sizeof(float) * n);
        float *a = tu_xmalloc(sizeof(float) * n), *b = tu_xmalloc(sizeof(float) * n);
        tu_fill_normal(g, n, 4.0f, 160 + s);
        tu_fill_normal(u, n, 1.0f, 180 + s);
        kt_geglu_ref(a, g, u, n);
        kt_geglu(b, g, u, n);
        expect_rel(b, a, n, 2e-6f, 1e-30f, "geglu");
        for (int i = 0; i < n; i++) {
            const double x = g[i], want = 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))) * u[i];
            /* 5e-6: float rounding of the exponent (~10 at g = -4.5) is
             * 1e-6 of exp; absolute 1e-12: for g < -6 the double tanh form itself
             * cancels (1 + tanh u ~ 1e-16) */
            if (!(fabs(a[i] - want) <= 5e-6 * fabs(want) + 1e-12))
                fail_msg("gelu(%.9g) * %.9g = %.9g, tanh form %.9g", g[i], u[i], a[i], want);
        }
        kt_geglu(g, g, u, n); /* in place over gate */
        assert_memory_equal(g, b, sizeof(float) * n);
        free(g), free(u), free(a), free(b);
    }
    /* the ends: gelu(-1e4) ~ 0, gelu(1e4) = 1e4, gelu(0) = 0 */
    float g[3] = {-1e4f, 1e4f, 0.0f}, u[3] = {1, 1, 1}, b[3];
    kt_geglu(b, g, u, 3);
    assert_true(fabsf(b[0]) < 1e-30f && b[1] == 1e4f && b[2] == 0.0f);
}

/* gpt-oss's SwiGLU-OAI: the reference against its definition in double
 * (the gate clamped above at the limit, not below; up clamped both
 * ways, + 1 on up), the dispatched (AVX2) one against the reference
 * within exp256's few ulp, in place (out aliasing gate) with the same
 * bits, odd lengths for the tails, NaN kept as ggml keeps it. Values
 * around and past +-limit. */
static void test_swiglu_oai(void **state) {
    (void)state;
    enum { N = 203 };
    float g[N], u[N], ref[N], out[N], g2[N];
    for (int i = 0; i < N; i++) g[i] = -12.0f + 24.0f * (float)i / N, u[i] = 11.0f - 0.1f * (float)i;
    g[17] = NAN;
    kt_swiglu_oai_ref(ref, g, u, N, 1.702f, 7.0f);
    for (int n = N; n > N - 9; n--) {
        memcpy(g2, g, sizeof g);
        kt_swiglu_oai(out, g, u, n, 1.702f, 7.0f);
        kt_swiglu_oai(g2, g2, u, n, 1.702f, 7.0f);
        for (int i = 0; i < n; i++) {
            if (i == 17) {
                assert_true(isnan(ref[i]) && isnan(out[i]));
                continue;
            }
            const double x = g[i] < 7.0 ? g[i] : 7.0, y = u[i] < -7.0 ? -7.0 : u[i] > 7.0 ? 7.0 : u[i];
            const double want = x / (1.0 + exp(-1.702 * x)) * (y + 1.0);
            if (!(fabs(ref[i] - want) <= 1e-5 * (1.0 + fabs(want))))
                fail_msg("elem %d (gate %g, up %g): reference %.9g, definition %.9g", i, g[i], u[i], ref[i], want);
            if (!(fabsf(out[i] - ref[i]) <= 4 * FLT_EPSILON * (1.0f + fabsf(ref[i]))))
                fail_msg("elem %d of %d: %.9g, reference %.9g", i, n, out[i], ref[i]);
            assert_true(out[i] == g2[i]);
        }
    }
}

static void test_swiglu(void **state) {
    (void)state;
    for (int s = 0; s < 7; s++) {
        int n = EW_SIZES[s];
        float *g = tu_xmalloc(sizeof(float) * n), *u = tu_xmalloc(sizeof(float) * n);
        float *a = tu_xmalloc(sizeof(float) * n), *b = tu_xmalloc(sizeof(float) * n);
        tu_fill_normal(g, n, 4.0f, 60 + s);
        tu_fill_normal(u, n, 1.0f, 80 + s);
        kt_swiglu_ref(a, g, u, n);
        kt_swiglu(b, g, u, n);
        expect_rel(b, a, n, 2e-6f, 1e-30f, "swiglu");
        kt_swiglu(g, g, u, n); /* in place over gate */
        assert_memory_equal(g, b, sizeof(float) * n);
        free(g);
        free(u);
        free(a);
        free(b);
    }
    /* the ends of exp's range, and exp's accuracy over it */
    enum { M = 4096 };
    float g[M], u[M], a[M], b[M];
    for (int i = 0; i < M; i++) {
        g[i] = -110.0f + 200.0f * (float)i / M;
        u[i] = 1.0f;
    }
    g[0] = -1e4f;
    g[1] = 1e4f;
    g[2] = 0.0f;
    g[3] = -88.0f;
    g[4] = 87.0f;
    kt_swiglu_ref(a, g, u, M);
    kt_swiglu(b, g, u, M);
    assert_true(b[0] == 0.0f && b[1] == 1e4f && b[2] == 0.0f);
    /* where silu is a normal float it matches within 4 ulp-ish */
    for (int i = 0; i < M; i++)
        if (fabsf(a[i]) > 1e-36f) assert_true(fabsf(a[i] - b[i]) <= 5e-7f * fabsf(a[i]));
}

/* ---- rope ----------------------------------------------------------- */

/* Reference angles in double: theta_i = pos * base^(-2i/d), which the
 * float recurrence tracks within ~i ulp of theta. */
/* The angles computed once and applied (the forward pass's way) give
 * kt_rope's bits: both styles, partial, odd and oversized rope_dim, and
 * head_dim 256 (more pairs than kt_rope computes at a time); and the
 * SIMD turn gives its scalar twin's bits (pair counts with every tail). */
static void test_rope_angles_apply(void **state) {
    (void)state;
    static const int shapes[][2] = {{64, 64}, {64, 32}, {64, 33}, {64, 80}, {256, 256}, {128, 96},
                                    {64, 14}, {64, 22}, {40, 40}, {6, 6}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int style = 0; style < 2; style++)
            for (int pos = 0; pos < 5000; pos += 977) {
                enum { H = 3 };
                const int D = shapes[si][0], rdim = shapes[si][1];
                float x[H * 256], y[H * 256], cs[128], sn[128];
                tu_fill_normal(x, (size_t)H * D, 1.0f, (uint64_t)(pos + 11 * si + style));
                memcpy(y, x, sizeof(float) * H * D);
                kt_rope(x, H, D, rdim, pos, 500000.0f, (kt_rope_style)style);
                kt_rope_angles(cs, sn, D, rdim, pos, 500000.0f);
                float z[H * 256];
                memcpy(z, y, sizeof(float) * H * D);
                kt_rope_apply(y, H, D, rdim, cs, sn, (kt_rope_style)style);
                assert_int_equal(kt_rope_pairs(D, rdim), (rdim < D ? rdim : D) / 2);
                assert_memory_equal(x, y, sizeof(float) * H * D);
                /* the scalar twin of the SIMD turn: the same bits */
                kt_cpu_force_scalar(true);
                kt_rope_apply(z, H, D, rdim, cs, sn, (kt_rope_style)style);
                kt_cpu_force_scalar(false);
                assert_memory_equal(y, z, sizeof(float) * H * D);
            }
}

/* Rope scaling (kt_rope_scaling): no scaling is the plain angles' bits;
 * YaRN's correction range and ramp are llama.cpp's for Qwen 2.5-style
 * files (golden/arch/qwen2-yarn: rope_dim 32, original context 64, base
 * 1e4, factor 4 -> pairs [0, 5], ramp 1, .8, .6, .4, .2, 0, ...); the
 * per-pair factors divide the angles. */
static void test_rope_scaling(void **state) {
    (void)state;
    enum { D = 32, P = D / 2 };
    float cs[P], sn[P], cs2[P], sn2[P];
    const kt_rope_scaling none = {.freq_scale = 1, .mscale = 1};
    kt_rope_angles(cs, sn, D, D, 77, 10000.0f);
    kt_rope_angles_scaled(cs2, sn2, D, D, 77, 10000.0f, &none);
    assert_memory_equal(cs, cs2, sizeof cs);
    assert_memory_equal(sn, sn2, sizeof sn);
    float lo, hi;
    kt_rope_yarn_corr(D, 64, 10000.0f, 32, 1, &lo, &hi);
    assert_true(lo == 0.0f && hi == 5.0f);
    const float mscale = 1.0f + 0.1f * logf(4.0f);
    const kt_rope_scaling yarn = {.freq_scale = 0.25f, .ext_factor = 1, .mscale = mscale, .corr_lo = lo, .corr_hi = hi};
    const int pos = 150;
    kt_rope_angles_scaled(cs2, sn2, D, D, pos, 10000.0f, &yarn);
    for (int i = 0; i < P; i++) {
        const double extrap = pos * pow(10000.0, -2.0 * i / D), ramp = i >= 5 ? 0 : 1 - i / 5.0;
        const double theta = extrap * 0.25 * (1 - ramp) + extrap * ramp;
        assert_float_equal(cs2[i], cos(theta) * mscale, 2e-4 * (1 + fabs(theta)));
        assert_float_equal(sn2[i], sin(theta) * mscale, 2e-4 * (1 + fabs(theta)));
    }
    float factors[P];
    for (int i = 0; i < P; i++) factors[i] = 1.0f + (float)i;
    const kt_rope_scaling llama31 = {.freq_scale = 1, .mscale = 1, .factors = factors};
    kt_rope_angles_scaled(cs2, sn2, D, D, pos, 10000.0f, &llama31);
    for (int i = 0; i < P; i++) {
        const double theta = pos * pow(10000.0, -2.0 * i / D) / factors[i];
        assert_float_equal(cs2[i], cos(theta), 2e-4 * (1 + fabs(theta)));
    }
}

static void test_rope(void **state) {
    (void)state;
    enum { H = 3, D = 64 };
    static const int rope_dims[] = {64, 32};
    for (int style = 0; style < 2; style++)
        for (int rd = 0; rd < 2; rd++)
            for (int pos = 0; pos < 300; pos += 37) {
                int rdim = rope_dims[rd];
                float x[H * D], y[H * D];
                tu_fill_normal(x, H * D, 1.0f, (uint64_t)(pos + 7 * style + rd));
                memcpy(y, x, sizeof x);
                kt_rope(y, H, D, rdim, pos, 10000.0f, (kt_rope_style)style);
                for (int h = 0; h < H; h++) {
                    for (int i = 0; i < rdim / 2; i++) {
                        int ia = style == KT_ROPE_NEOX ? i : 2 * i;
                        int ib = style == KT_ROPE_NEOX ? i + rdim / 2 : 2 * i + 1;
                        double th = pos * pow(10000.0, -2.0 * i / rdim);
                        double x0 = x[h * D + ia], x1 = x[h * D + ib];
                        double w0 = x0 * cos(th) - x1 * sin(th), w1 = x0 * sin(th) + x1 * cos(th);
                        /* |theta error| <= ~(i+2) ulp of pos */
                        double tol = 1e-6 + 1.2e-7 * (i + 2) * pos * (fabs(x0) + fabs(x1));
                        assert_true(fabs(y[h * D + ia] - w0) <= tol);
                        assert_true(fabs(y[h * D + ib] - w1) <= tol);
                    }
                    for (int i = rdim; i < D; i++) assert_true(y[h * D + i] == x[h * D + i]);
                }
                if (pos == 0) assert_memory_equal(x, y, sizeof x);
            }
}

/* The recurrence itself: exactly ggml_rope_cache_init's angles. */
static void test_rope_matches_ggml_recurrence(void **state) {
    (void)state;
    enum { D = 128 };
    float x[D], y[D];
    for (int i = 0; i < D; i++) x[i] = (i % 2) ? 0.0f : 1.0f; /* (1, 0) pairs */
    memcpy(y, x, sizeof x);
    kt_rope(y, 1, D, D, 1000, 500000.0f, KT_ROPE_ADJACENT);
    const float theta_scale = powf(500000.0f, -2.0f / D);
    float theta = 1000.0f;
    for (int i = 0; i < D / 2; i++) {
        /* rotating (1, 0) gives (cos, sin) exactly */
        assert_true(y[2 * i] == cosf(theta));
        assert_true(y[2 * i + 1] == sinf(theta));
        theta *= theta_scale;
    }
}

/* ---- attention ------------------------------------------------------ */

typedef struct attn_case {
    int n_tokens, pos0, n_head, n_head_kv, head_dim;
} attn_case;

static void run_attention(const attn_case *c, kt_pool *pool, bool ref, float *out, const float *q,
                          const float *k, const float *v, size_t q_stride, size_t kv_stride,
                          size_t out_stride) {
    kt_attn_args a = {.out = out, .q = q, .k = k, .v = v, .n_tokens = c->n_tokens,
                      .pos0 = c->pos0, .n_head = c->n_head, .n_head_kv = c->n_head_kv,
                      .head_dim = c->head_dim, .q_stride = q_stride, .kv_stride = kv_stride,
                      .out_stride = out_stride};
    if (ref) kt_attention_ref(&a);
    else kt_attention(pool, &a);
}

/* SIMD (online softmax, vector exp, reordered sums) vs the three-pass
 * reference: within 1e-5 x max|v|. */
static void test_attention(void **state) {
    (void)state;
    static const attn_case cases[] = {
        {1, 0, 1, 1, 8},    {1, 0, 4, 2, 64},  {1, 40, 8, 2, 64}, {5, 0, 4, 4, 64},
        {7, 30, 8, 2, 64},  {3, 100, 2, 1, 20}, {4, 3, 6, 3, 7},  {2, 70, 4, 1, 128},
        {2, 5, 20, 1, 16},  {1, 33, 40, 2, 8}, /* groups of 20: split in batches of <= 16 */
        /* whole blocks of query tokens, values in several chunks of 64 positions */
        {40, 50, 6, 2, 64}, {20, 0, 4, 1, 128}, {33, 70, 4, 2, 32},
    };
    kt_pool *pool = kt_pool_new(3, NULL);
    assert_non_null(pool);
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const attn_case *c = &cases[ci];
        int n_pos = c->pos0 + c->n_tokens;
        size_t q_stride = (size_t)c->n_head * c->head_dim + 3;
        size_t kv_stride = (size_t)c->n_head_kv * c->head_dim + 5;
        size_t out_stride = (size_t)c->n_head * c->head_dim + 1;
        float *q = tu_xmalloc(sizeof(float) * q_stride * c->n_tokens);
        float *k = tu_xmalloc(sizeof(float) * kv_stride * n_pos);
        float *v = tu_xmalloc(sizeof(float) * kv_stride * n_pos);
        float *a = tu_xmalloc(sizeof(float) * out_stride * c->n_tokens);
        float *b = tu_xmalloc(sizeof(float) * out_stride * c->n_tokens);
        tu_fill_normal(q, q_stride * c->n_tokens, 2.0f, ci * 3 + 1);
        tu_fill_normal(k, kv_stride * n_pos, 2.0f, ci * 3 + 2);
        tu_fill_normal(v, kv_stride * n_pos, 1.0f, ci * 3 + 3);
        memset(a, 0, sizeof(float) * out_stride * c->n_tokens);
        memset(b, 0, sizeof(float) * out_stride * c->n_tokens);
        run_attention(c, NULL, true, a, q, k, v, q_stride, kv_stride, out_stride);
        run_attention(c, pool, false, b, q, k, v, q_stride, kv_stride, out_stride);
        float vmax = 0;
        for (size_t i = 0; i < kv_stride * n_pos; i++) vmax = fmaxf(vmax, fabsf(v[i]));
        for (int t = 0; t < c->n_tokens; t++)
            for (int i = 0; i < c->n_head * c->head_dim; i++) {
                float x = a[t * out_stride + i], y = b[t * out_stride + i];
                if (!(fabsf(x - y) <= 1e-5f * vmax))
                    fail_msg("attention case %zu token %d elem %d: %.9g vs ref %.9g", ci, t, i, y, x);
            }
        /* the stride padding is untouched */
        for (int t = 0; t < c->n_tokens; t++) assert_true(b[t * out_stride + out_stride - 1] == 0.0f);

        /* first token: one position, output = v_0 of its kv head */
        if (c->pos0 == 0)
            for (int h = 0; h < c->n_head; h++) {
                int kvh = h / (c->n_head / c->n_head_kv);
                for (int d = 0; d < c->head_dim; d++)
                    assert_true(fabsf(b[h * c->head_dim + d] - v[kvh * c->head_dim + d]) <= 1e-6f);
            }

        /* batch invariance: each token alone (as a batch of one at its
         * position) gives the same bits */
        for (int t = 0; t < c->n_tokens; t++) {
            attn_case one = *c;
            one.n_tokens = 1;
            one.pos0 = c->pos0 + t;
            float *o1 = tu_xmalloc(sizeof(float) * out_stride);
            run_attention(&one, NULL, false, o1, q + t * q_stride, k, v, q_stride, kv_stride,
                          out_stride);
            assert_memory_equal(o1, b + t * out_stride, sizeof(float) * c->n_head * c->head_dim);
            free(o1);
        }
        /* the AVX-512 kernels do the AVX2 ones' lane arithmetic: the same
         * bits (both runs take AVX2 where the CPU has no AVX-512) */
        kt_cpu_force_no_avx512(true);
        run_attention(c, pool, false, a, q, k, v, q_stride, kv_stride, out_stride);
        kt_cpu_force_no_avx512(false);
        for (int t = 0; t < c->n_tokens; t++)
            assert_memory_equal(a + t * out_stride, b + t * out_stride, sizeof(float) * c->n_head * c->head_dim);
        free(q);
        free(k);
        free(v);
        free(a);
        free(b);
    }
    kt_pool_free(pool);
}

/* A token's output does not depend on the positions after its own, even
 * when one holds an infinite V element (an F16 cache overflows to inf):
 * the prefill blocks run the lanes of several tokens together over the
 * block's positions, and 0 x inf would be NaN in a lane that should not
 * see that position at all. */
static void test_attention_future_inf(void **state) {
    (void)state;
    const attn_case c = {16, 0, 2, 1, 16};
    const size_t q_stride = 32, kv_stride = 16, out_stride = 32;
    float q[16 * 32], k[16 * 16], v[16 * 16], out[16 * 32], one[32];
    tu_fill_normal(q, 16 * 32, 1.0f, 41);
    tu_fill_normal(k, 16 * 16, 1.0f, 42);
    tu_fill_normal(v, 16 * 16, 1.0f, 43);
    v[15 * kv_stride + 3] = INFINITY; /* the last position only */
    kt_pool *pool = kt_pool_new(2, NULL);
    assert_non_null(pool);
    run_attention(&c, pool, false, out, q, k, v, q_stride, kv_stride, out_stride);
    for (int t = 0; t < 15; t++) {
        attn_case alone = c;
        alone.n_tokens = 1, alone.pos0 = t;
        run_attention(&alone, NULL, false, one, q + t * q_stride, k, v, q_stride, kv_stride, out_stride);
        for (int i = 0; i < 32; i++) assert_true(isfinite(out[t * out_stride + i]));
        assert_memory_equal(one, out + t * out_stride, sizeof one);
    }
    kt_pool_free(pool);
}

/* Decode at long contexts (one token, 512 positions or more, groups of
 * fewer than 4 heads) runs in three passes split by positions, heads and
 * dims: the same bits as the (token, group) kernel that a batch of two
 * sequences' tokens takes, and close to the reference; paged F32, F16
 * and Q8_0 rows in blocks of 16, head sizes 64 and 128, groups of 1-3. */
static void test_attention_decode_long(void **state) {
    (void)state;
    enum { BT = 16, NPOS = 700, NB = (NPOS + BT - 1) / BT };
    static const int shapes[][3] = {{4, 4, 64}, {4, 2, 64}, {6, 2, 64}, {3, 1, 128}}; /* heads, KV heads, dim */
    static const kt_dtype types[] = {KT_F32, KT_F16, KT_Q8_0};
    kt_pool *pool = kt_pool_new(2, NULL);
    assert_non_null(pool);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
            const int nh = shapes[si][0], nkv = shapes[si][1], hd = shapes[si][2];
            const int q_dim = nh * hd, kv_dim = nkv * hd;
            const size_t row_bytes = kt_dtype_row_bytes(types[ti], kv_dim), block_bytes = row_bytes * BT;
            char *k = tu_xmalloc(block_bytes * 2 * NB), *v = tu_xmalloc(block_bytes * 2 * NB);
            int32_t table[2][NB];
            for (int b = 0; b < 2 * NB; b++) table[b % 2][b / 2] = (b * 37 + 5) % (2 * NB); /* scrambled */
            float *row = tu_xmalloc(sizeof(float) * kv_dim);
            for (int sq = 0; sq < 2; sq++)
                for (int p = 0; p < NPOS; p++) {
                    const size_t at = (size_t)table[sq][p / BT] * block_bytes + (size_t)(p % BT) * row_bytes;
                    tu_fill_normal(row, kv_dim, 1.5f, 1000 * sq + p);
                    kt_quantize_row(types[ti], row, k + at, kv_dim);
                    tu_fill_normal(row, kv_dim, 1.0f, 7000 + 1000 * sq + p);
                    kt_quantize_row(types[ti], row, v + at, kv_dim);
                }
            float *q = tu_xmalloc(sizeof(float) * 2 * q_dim);
            /* the first token's scores spread over a few nats; the
             * second's over tens, so most of its exps are tiny or
             * underflow (the max and the masking show; the order of the
             * double sums does not: reversing it still rounds 1 / sum to
             * the same float, as a mutation showed) */
            tu_fill_normal(q, (size_t)q_dim, 1.5f, 99 + si);
            tu_fill_normal(q + q_dim, (size_t)q_dim, 8.0f, 199 + si);
            const int32_t *blocks[2] = {table[0], table[1]};
            int n_pos[2] = {NPOS, NPOS - 77};
            float *batch = tu_xmalloc(sizeof(float) * 2 * q_dim), *alone = tu_xmalloc(sizeof(float) * q_dim);
            float *ref = tu_xmalloc(sizeof(float) * 2 * q_dim);
            kt_attn_args a = {.out = batch, .q = q, .k = k, .v = v, .n_tokens = 2, .n_head = nh, .n_head_kv = nkv,
                              .head_dim = hd, .q_stride = q_dim, .out_stride = q_dim, .kv_type = types[ti],
                              .blocks = blocks, .block_tokens = BT, .row_bytes = row_bytes,
                              .block_bytes = block_bytes, .n_pos = n_pos};
            kt_attention(pool, &a);
            a.out = ref;
            kt_attention_ref(&a);
            for (int i = 0; i < 2 * q_dim; i++)
                if (!(fabsf(ref[i] - batch[i]) <= 1e-5f * 4.0f))
                    fail_msg("shape %zu type %d elem %d: %.9g vs ref %.9g", si, (int)types[ti], i, batch[i], ref[i]);
            for (int t = 0; t < 2; t++) {
                kt_attn_args a1 = a;
                a1.out = alone, a1.q = q + (size_t)t * q_dim, a1.n_tokens = 1, a1.blocks = blocks + t,
                a1.n_pos = n_pos + t;
                kt_attention(pool, &a1);
                assert_memory_equal(alone, batch + (size_t)t * q_dim, sizeof(float) * q_dim);
                kt_attention(NULL, &a1); /* no pool: the same passes on the calling thread */
                assert_memory_equal(alone, batch + (size_t)t * q_dim, sizeof(float) * q_dim);
                kt_cpu_force_no_avx512(true); /* the AVX2 passes: the same bits */
                kt_attention(pool, &a1);
                kt_cpu_force_no_avx512(false);
                assert_memory_equal(alone, batch + (size_t)t * q_dim, sizeof(float) * q_dim);
            }
            free(k), free(v), free(row), free(q), free(batch), free(alone), free(ref);
        }
    kt_pool_free(pool);
}

/* Attention as Gemma's layers ask for it, in double precision: each
 * token over the last `window` of its positions (0: all), scores capped
 * at cap * tanh(s / cap) (cap 0: not), each head's sink (gpt-oss; NULL:
 * none) one more term of the softmax's sum. Contiguous F32 rows. */
static void attention_naive(const kt_attn_args *a, const float *k, const float *v, float *out) {
    const int hd = a->head_dim, group = a->n_head / a->n_head_kv;
    for (int t = 0; t < a->n_tokens; t++) {
        const int end = a->n_pos[t], first = a->window && end > a->window ? end - a->window : 0;
        for (int h = 0; h < a->n_head; h++) {
            const float *q = a->q + (size_t)t * a->q_stride + (size_t)h * hd;
            const int kvh = h / group;
            double s[1024], max = -INFINITY, sum = 0, o[256] = {0};
            for (int p = first; p < end; p++) {
                double d = 0;
                for (int i = 0; i < hd; i++) d += (double)q[i] * k[(size_t)p * a->kv_stride + kvh * hd + i];
                d /= sqrt((double)hd);
                if (a->softcap > 0) d = a->softcap * tanh(d / a->softcap);
                s[p - first] = d;
                max = d > max ? d : max;
            }
            for (int p = first; p < end; p++) sum += s[p - first] = exp(s[p - first] - max);
            if (a->sinks) sum += exp((double)a->sinks[h] - max); /* a logit with no value */
            for (int p = first; p < end; p++)
                for (int i = 0; i < hd; i++) o[i] += s[p - first] * v[(size_t)p * a->kv_stride + kvh * hd + i];
            for (int i = 0; i < hd; i++) out[(size_t)t * a->out_stride + h * hd + i] = (float)(o[i] / sum);
        }
    }
}

/* Sliding windows and soft-capped scores (Gemma 2 / 3) and attention
 * sinks (gpt-oss): the reference
 * against the double-precision definition, and every SIMD path (prefill
 * blocks, the heads kernel, the group kernel, the long-decode passes)
 * against the reference, each token alone giving the same bits as in its
 * batch. Windows start mid-block and in later blocks of a scrambled
 * block table; one ends beyond position 0 (window longer than the
 * sequence). */
static void test_attention_window_softcap(void **state) {
    (void)state;
    enum { BT = 16, NPOS = 700, NB = (NPOS + BT - 1) / BT };
    static const struct { int n_tokens, last, n_head, n_head_kv, head_dim, window; float cap; bool sinks; } cases[] = {
        {40, 100, 4, 2, 64, 24, 0, false},   /* prefill: a window, not a block */
        {40, 100, 4, 2, 64, 0, 10, false},   /* prefill: capped */
        {20, 60, 8, 1, 64, 37, 5, false},    /* the heads kernel's group, both */
        {3, 50, 4, 2, 32, 200, 0, false},    /* a window longer than the sequence */
        {1, 700, 4, 2, 64, 600, 0, false},   /* decode over the long-context passes, from position 100 */
        {1, 700, 4, 2, 64, 600, 10, false},  /* the same capped: the group kernel */
        {1, 700, 8, 1, 128, 650, 0, false},  /* the heads kernel at a long context */
        /* gpt-oss's sinks: prefill blocks with and without a window, the
         * heads kernel (one token's heads in the lanes), the group
         * kernel (head size 40: no block kernel), the long-decode passes */
        {40, 100, 4, 2, 64, 24, 0, true},
        {40, 130, 8, 2, 64, 0, 0, true},
        {20, 60, 8, 1, 64, 37, 0, true},
        {5, 60, 6, 2, 40, 0, 0, true},
        {1, 700, 4, 2, 64, 600, 0, true},
        {1, 700, 4, 2, 64, 0, 0, true},
        {1, 700, 8, 1, 128, 650, 0, true},
        {1, 90, 4, 2, 64, 0, 0, true},
    };
    kt_pool *pool = kt_pool_new(2, NULL);
    assert_non_null(pool);
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int nt = cases[ci].n_tokens, nh = cases[ci].n_head, nkv = cases[ci].n_head_kv, hd = cases[ci].head_dim;
        const int q_dim = nh * hd, kv_dim = nkv * hd;
        float *ck = tu_xmalloc(sizeof(float) * NPOS * kv_dim), *cv = tu_xmalloc(sizeof(float) * NPOS * kv_dim);
        tu_fill_normal(ck, (size_t)NPOS * kv_dim, 1.5f, 40 + ci);
        tu_fill_normal(cv, (size_t)NPOS * kv_dim, 1.0f, 50 + ci);
        const size_t row_bytes = sizeof(float) * kv_dim, block_bytes = row_bytes * BT;
        char *k = tu_xmalloc(block_bytes * NB), *v = tu_xmalloc(block_bytes * NB);
        int32_t table[NB];
        for (int b = 0; b < NB; b++) table[b] = (b * 17 + 3) % NB; /* 17 and NB = 44 are coprime */
        for (int p = 0; p < NPOS; p++) {
            const size_t at = (size_t)table[p / BT] * block_bytes + (size_t)(p % BT) * row_bytes;
            memcpy(k + at, ck + (size_t)p * kv_dim, row_bytes);
            memcpy(v + at, cv + (size_t)p * kv_dim, row_bytes);
        }
        float *q = tu_xmalloc(sizeof(float) * nt * q_dim);
        tu_fill_normal(q, (size_t)nt * q_dim, 2.0f, 60 + ci);
        const int32_t *blocks[64];
        int n_pos[64];
        for (int t = 0; t < nt; t++) blocks[t] = table, n_pos[t] = cases[ci].last - nt + 1 + t;
        kt_attn_args a = {.q = q, .k = k, .v = v, .n_tokens = nt, .n_head = nh, .n_head_kv = nkv, .head_dim = hd,
                          .q_stride = q_dim, .kv_stride = kv_dim, .out_stride = q_dim, .kv_type = KT_F32,
                          .blocks = blocks, .block_tokens = BT, .row_bytes = row_bytes, .block_bytes = block_bytes,
                          .n_pos = n_pos, .softcap = cases[ci].cap, .window = cases[ci].window};
        /* sinks around the scores' range (q 2, k 1.5: scores of a few
         * units), one far above them (the sink takes the max), one far below */
        float sinks[16];
        for (int h = 0; h < nh; h++) sinks[h] = h == 1 ? 30.0f : h == 2 ? -40.0f : 0.7f * (float)h - 1.0f;
        if (cases[ci].sinks) a.sinks = sinks;
        float *naive = tu_xmalloc(sizeof(float) * nt * q_dim), *ref = tu_xmalloc(sizeof(float) * nt * q_dim);
        float *fast = tu_xmalloc(sizeof(float) * nt * q_dim), *one = tu_xmalloc(sizeof(float) * q_dim);
        attention_naive(&a, ck, cv, naive);
        a.out = ref;
        kt_attention_ref(&a);
        a.out = fast;
        kt_attention(pool, &a);
        for (int i = 0; i < nt * q_dim; i++) {
            if (!(fabsf(ref[i] - naive[i]) <= 1e-5f * 5.0f))
                fail_msg("case %zu elem %d: reference %.9g vs definition %.9g", ci, i, ref[i], naive[i]);
            if (!(fabsf(fast[i] - ref[i]) <= 1e-5f * 5.0f))
                fail_msg("case %zu elem %d: %.9g vs reference %.9g", ci, i, fast[i], ref[i]);
        }
        for (int t = 0; t < nt; t++) {
            kt_attn_args a1 = a;
            a1.q = q + (size_t)t * q_dim, a1.out = one, a1.n_tokens = 1, a1.blocks = blocks + t, a1.n_pos = n_pos + t;
            kt_attention(pool, &a1);
            assert_memory_equal(one, fast + (size_t)t * q_dim, sizeof(float) * q_dim);
        }
        if (cases[ci].sinks) {
            /* the AVX2 forms too where the machine has AVX-512 */
            float *narrow = tu_xmalloc(sizeof(float) * nt * q_dim);
            kt_cpu_force_no_avx512(true);
            a.out = narrow;
            kt_attention(pool, &a);
            kt_cpu_force_no_avx512(false);
            for (int i = 0; i < nt * q_dim; i++)
                if (!(fabsf(narrow[i] - ref[i]) <= 1e-5f * 5.0f))
                    fail_msg("case %zu elem %d, AVX-512 off: %.9g vs reference %.9g", ci, i, narrow[i], ref[i]);
            free(narrow);
            /* the sink is live: without it the outputs move */
            kt_attn_args a0 = a;
            a0.sinks = NULL, a0.out = one, a0.n_tokens = 1, a0.q = q + (size_t)(nt - 1) * q_dim;
            a0.blocks = blocks + nt - 1, a0.n_pos = n_pos + nt - 1;
            kt_attention(pool, &a0);
            assert_true(memcmp(one, fast + (size_t)(nt - 1) * q_dim, sizeof(float) * q_dim) != 0);
            /* the contiguous cache (kt_attention's other addressing) gives the paged bits */
            if (!cases[ci].window) {
                kt_attn_args c = a;
                c.k = ck, c.v = cv, c.blocks = NULL, c.block_tokens = 0, c.row_bytes = c.block_bytes = 0;
                c.n_pos = NULL, c.pos0 = n_pos[0] - 1;
                float *cont = tu_xmalloc(sizeof(float) * nt * q_dim);
                c.out = cont;
                kt_attention(pool, &c);
                assert_memory_equal(cont, fast, sizeof(float) * nt * q_dim);
                c.out = one, c.n_tokens = 1, c.q = q + (size_t)(nt - 1) * q_dim, c.pos0 = n_pos[nt - 1] - 1;
                kt_attention_ref(&c);
                assert_memory_equal(one, ref + (size_t)(nt - 1) * q_dim, sizeof(float) * q_dim);
                free(cont);
            }
        }
        free(ck), free(cv), free(k), free(v), free(q), free(naive), free(ref), free(fast), free(one);
    }
    kt_pool_free(pool);
}

/* Paged attention: a ragged batch of tokens from 3 sequences whose
 * positions live in shuffled blocks of 16, with F32, F16 and Q8_0 rows.
 * Checks: SIMD vs the reference (each reading the same stored values);
 * paged F32 vs the contiguous kernel, bit for bit; every token of the
 * ragged batch vs the same token run alone, bit for bit. */
typedef struct paged_kv {
    kt_dtype type;
    int n_seq, n_blocks, bt, kv_dim;
    size_t row_bytes, block_bytes;
    char *k, *v;          /* n_blocks * block_bytes each */
    int32_t table[3][16]; /* each sequence's blocks */
} paged_kv;

static void paged_store(paged_kv *pk, char *plane, int s, int p, const float *row) {
    char *dst = plane + (size_t)pk->table[s][p / pk->bt] * pk->block_bytes + (size_t)(p % pk->bt) * pk->row_bytes;
    if (pk->type == KT_F32) memcpy(dst, row, sizeof(float) * (size_t)pk->kv_dim);
    else kt_quantize_row(pk->type, row, dst, pk->kv_dim);
}

static void test_attention_paged(void **state) {
    (void)state;
    const int NH = 8, NKV = 2, HD = 64, BT = 16, NSEQ = 3;
    const int len[3] = {37, 5, 70}; /* positions per sequence */
    const int kv_dim = NKV * HD, q_dim = NH * HD;
    kt_pool *pool = kt_pool_new(2, NULL);
    assert_non_null(pool);
    /* per sequence, contiguous F32 K/V as the source of truth */
    float *ck[3], *cv[3];
    for (int s = 0; s < NSEQ; s++) {
        ck[s] = tu_xmalloc(sizeof(float) * (size_t)len[s] * kv_dim);
        cv[s] = tu_xmalloc(sizeof(float) * (size_t)len[s] * kv_dim);
        tu_fill_normal(ck[s], (size_t)len[s] * kv_dim, 1.5f, 100 + s);
        tu_fill_normal(cv[s], (size_t)len[s] * kv_dim, 1.0f, 200 + s);
    }
    /* the batch: the last 4 positions of seq 0, 1 of seq 1, 6 of seq 2 */
    enum { NT = 11 };
    const int tok_seq[NT] = {0, 0, 0, 0, 1, 2, 2, 2, 2, 2, 2};
    int n_pos[NT];
    for (int t = 0; t < NT; t++) { /* a sequence's batch tokens end at its last position */
        int after = 0;
        for (int u = t + 1; u < NT && tok_seq[u] == tok_seq[t]; u++) after++;
        n_pos[t] = len[tok_seq[t]] - after;
    }
    float *q = tu_xmalloc(sizeof(float) * NT * q_dim);
    tu_fill_normal(q, (size_t)NT * q_dim, 1.5f, 300);
    const kt_dtype types[3] = {KT_F32, KT_F16, KT_Q8_0};
    for (int ti = 0; ti < 3; ti++) {
        paged_kv pk = {.type = types[ti], .n_seq = NSEQ, .bt = BT, .kv_dim = kv_dim, .n_blocks = 12};
        pk.row_bytes = kt_dtype_row_bytes(pk.type, kv_dim);
        pk.block_bytes = pk.row_bytes * BT;
        pk.k = tu_xmalloc(pk.block_bytes * pk.n_blocks);
        pk.v = tu_xmalloc(pk.block_bytes * pk.n_blocks);
        /* blocks handed out in a scrambled order: 7, 2, 11, 0, ... */
        for (int s = 0, next = 0; s < NSEQ; s++)
            for (int b = 0; b * BT < len[s]; b++, next++) pk.table[s][b] = (next * 7 + 3) % pk.n_blocks;
        for (int s = 0; s < NSEQ; s++)
            for (int p = 0; p < len[s]; p++) {
                paged_store(&pk, pk.k, s, p, ck[s] + (size_t)p * kv_dim);
                paged_store(&pk, pk.v, s, p, cv[s] + (size_t)p * kv_dim);
            }
        const int32_t *blocks[NT];
        for (int t = 0; t < NT; t++) blocks[t] = pk.table[tok_seq[t]];
        kt_attn_args a = {.q = q, .k = pk.k, .v = pk.v, .n_tokens = NT, .n_head = NH, .n_head_kv = NKV,
                          .head_dim = HD, .q_stride = q_dim, .out_stride = q_dim, .kv_type = pk.type,
                          .blocks = blocks, .block_tokens = BT, .row_bytes = pk.row_bytes,
                          .block_bytes = pk.block_bytes, .n_pos = n_pos};
        float *ref = tu_xmalloc(sizeof(float) * NT * q_dim), *fast = tu_xmalloc(sizeof(float) * NT * q_dim);
        a.out = ref;
        kt_attention_ref(&a);
        a.out = fast;
        kt_attention(pool, &a);
        for (int i = 0; i < NT * q_dim; i++)
            if (!(fabsf(ref[i] - fast[i]) <= 1e-5f * 4.0f))
                fail_msg("paged attention type %d elem %d: %.9g vs ref %.9g", (int)pk.type, i, fast[i], ref[i]);
        /* the AVX-512 kernels do the AVX2 ones' lane arithmetic */
        a.out = ref;
        kt_cpu_force_no_avx512(true);
        kt_attention(pool, &a);
        kt_cpu_force_no_avx512(false);
        a.out = fast;
        assert_memory_equal(ref, fast, sizeof(float) * NT * q_dim);
        /* each token alone: the same bits */
        for (int t = 0; t < NT; t++) {
            float one[8 * 64];
            kt_attn_args a1 = a;
            a1.q = q + (size_t)t * q_dim, a1.out = one, a1.n_tokens = 1;
            a1.blocks = blocks + t, a1.n_pos = n_pos + t;
            kt_attention(pool, &a1);
            assert_memory_equal(one, fast + (size_t)t * q_dim, sizeof(float) * q_dim);
        }
        /* the contiguous kernel on each sequence's own F32 rows: the same
         * bits from F32 storage, F16 / Q8_0 within their rounding */
        const float tol = pk.type == KT_F32 ? 0.0f : pk.type == KT_F16 ? 5e-3f : 5e-2f;
        for (int t = 0; t < NT; t++) {
            int s = tok_seq[t];
            float one[8 * 64];
            kt_attn_args c = {.out = one, .q = q + (size_t)t * q_dim, .k = ck[s], .v = cv[s],
                              .n_tokens = 1, .pos0 = n_pos[t] - 1, .n_head = NH, .n_head_kv = NKV,
                              .head_dim = HD, .q_stride = q_dim, .kv_stride = kv_dim,
                              .out_stride = q_dim};
            kt_attention(pool, &c);
            if (pk.type == KT_F32) assert_memory_equal(one, fast + (size_t)t * q_dim, sizeof(float) * q_dim);
            for (int i = 0; i < q_dim; i++)
                if (!(fabsf(one[i] - fast[(size_t)t * q_dim + i]) <= tol))
                    fail_msg("type %d token %d elem %d: %.6g vs F32 %.6g", (int)pk.type, t, i,
                             fast[(size_t)t * q_dim + i], one[i]);
        }
        free(ref), free(fast), free(pk.k), free(pk.v);
    }
    for (int s = 0; s < NSEQ; s++) free(ck[s]), free(cv[s]);
    free(q);
    kt_pool_free(pool);
}

/* ---- throughput (KT_OPS_BENCH=1; not a test) ------------------------ */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double bench_matmul(kt_pool *pool, kt_dtype type, int n_in, int n_out, int nt, int reps,
                           const void *w, const float *x, float *out) {
    kt_matmul(pool, out, w, type, x, n_in, n_out, nt); /* warm up */
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = kt_time_ms();
        kt_matmul(pool, out, w, type, x, n_in, n_out, nt);
        double dt = kt_time_ms() - t0;
        best = dt < best ? dt : best;
    }
    return best;
}

/* A matrix of type (plain or repacked) with random values. */
static void *bench_weights(kt_dtype type, int n_in, int n_out, uint64_t seed) {
    const kt_dtype plain = kt_repack_plain(type);
    void *w = tu_make_weights(plain, n_in, n_out, seed, 0.0f);
    if (plain == type) return w;
    void *packed = repacked_copy(w, plain, n_in, n_out);
    free(w);
    return packed;
}

/* pp512's attention: 512 tokens from position 0 over an F16 cache in one
 * block (as the engine stores it), head_dim 64; GFLOP/s counts the causal
 * pairs' 4 x head_dim flops (scores and values). */
static void bench_attention_pp512(int n_head, int n_head_kv, kt_pool *pool2) {
    enum { NT = 512, HD = 64 };
    const size_t q_dim = (size_t)n_head * HD, kv_dim = (size_t)n_head_kv * HD;
    float *q = tu_xmalloc(sizeof(float) * NT * q_dim), *o = tu_xmalloc(sizeof(float) * NT * q_dim);
    float *row = tu_xmalloc(sizeof(float) * kv_dim);
    char *k = tu_xmalloc(2 * NT * kv_dim), *v = tu_xmalloc(2 * NT * kv_dim);
    tu_fill_normal(q, NT * q_dim, 1.0f, 1);
    for (int p = 0; p < NT; p++) {
        tu_fill_normal(row, kv_dim, 1.0f, 2 + p);
        kt_quantize_row(KT_F16, row, k + 2 * p * kv_dim, (int)kv_dim);
        tu_fill_normal(row, kv_dim, 1.0f, 1000 + p);
        kt_quantize_row(KT_F16, row, v + 2 * p * kv_dim, (int)kv_dim);
    }
    static const int32_t block0 = 0;
    const int32_t *blocks[NT];
    for (int t = 0; t < NT; t++) blocks[t] = &block0;
    const kt_attn_args a = {.out = o, .q = q, .k = k, .v = v, .n_tokens = NT, .n_head = n_head,
                            .n_head_kv = n_head_kv, .head_dim = HD, .q_stride = q_dim, .out_stride = q_dim,
                            .kv_type = KT_F16, .blocks = blocks, .block_tokens = NT,
                            .row_bytes = 2 * kv_dim, .block_bytes = 2 * kv_dim * NT};
    const double gflop = 4.0 * HD * n_head * (NT * (NT + 1) / 2.0) * 1e-9;
    double best[2] = {1e30, 1e30};
    for (int rep = 0; rep < 10; rep++)
        for (int pi = 0; pi < 2; pi++) {
            double t0 = kt_time_ms();
            kt_attention(pi ? pool2 : NULL, &a);
            double dt = kt_time_ms() - t0;
            best[pi] = dt < best[pi] ? dt : best[pi];
        }
    print_message("bench attention pp512, %d heads (%d KV) of %d, F16 cache: %.2f ms = %.1f GFLOP/s (1 thr), "
                  "%.2f ms = %.1f GFLOP/s (2 thr)\n",
                  n_head, n_head_kv, HD, best[0], gflop / best[0] * 1e3, best[1], gflop / best[1] * 1e3);
    free(q), free(o), free(row), free(k), free(v);
}

/* only: a type name (KT_OPS_BENCH=Q8_0) to time just that type's matmul,
 * or "attention" */
static void run_bench(const char *only) {
    const int n_in = 2048, n_out = 5632;
    kt_pool *pool = kt_pool_new(2, NULL);
    assert_non_null(pool);
    float *x = tu_xmalloc(sizeof(float) * 64 * n_in);
    float *out = tu_xmalloc(sizeof(float) * 64 * n_out);
    tu_fill_normal(x, (size_t)64 * n_in, 1.0f, 5);
    /* the repacked layouts (Q4_0x8, ..., F16x16, ...) follow their plain types */
    static const kt_dtype types[] = {KT_Q4_0, KT_Q4_0_X8, KT_Q4_1, KT_Q4_1_X8, KT_Q5_0, KT_Q5_0_X8, KT_Q5_1,
                                     KT_Q5_1_X8, KT_Q4_K, KT_Q4_K_X8, KT_Q5_K, KT_Q5_K_X8, KT_Q6_K, KT_Q6_K_X8, KT_Q8_0, KT_F16,
                                     KT_F16_X16, KT_BF16, KT_BF16_X16, KT_F32, KT_F32_X16,
                                     KT_Q2_K, KT_Q3_K, KT_IQ4_NL, KT_IQ4_XS, KT_MXFP4, KT_MXFP4_X8};
    for (int i = 0; i < (int)(sizeof types / sizeof types[0]); i++) {
        if (only && strcmp(only, kt_dtype_name(types[i])) != 0) continue;
        const kt_dtype plain = kt_repack_plain(types[i]);
        void *w = bench_weights(types[i], n_in, n_out, 1);
        double bytes = (double)kt_dtype_row_bytes(plain, n_in) * n_out;
        /* copies of the matrix (>= 128 MB in all, more than any L3) used in
         * turn, so that each GEMV streams its weights from DRAM */
        int copies = (int)(128e6 / bytes) + 1;
        if (copies > 16) copies = 16;
        void *ws[16];
        for (int c = 0; c < copies; c++) {
            ws[c] = tu_xmalloc((size_t)bytes);
            memcpy(ws[c], w, (size_t)bytes);
        }
        enum { REPS = 200 };
        double times[REPS];
        for (int rep = 0; rep < REPS; rep++) {
            double t0 = kt_time_ms();
            kt_matmul(pool, out, ws[rep % copies], types[i], x, n_in, n_out, 1);
            times[rep] = kt_time_ms() - t0;
        }
        qsort(times, REPS, sizeof times[0], cmp_double);
        double best = times[0], median = times[REPS / 2];
        double gemm = bench_matmul(pool, types[i], n_in, n_out, 64, 5, w, x, out);
        double gemm1 = bench_matmul(NULL, types[i], n_in, n_out, 64, 3, w, x, out);
        /* one core's compute rate: the first 512 rows (in L2), one thread,
         * best of 20 runs of 100 GEMVs */
        double hot = 1e30;
        for (int rep = 0; rep < 20; rep++) {
            double t0 = kt_time_ms();
            for (int k = 0; k < 100; k++) kt_matmul(NULL, out, w, types[i], x, n_in, 512, 1);
            double dt = (kt_time_ms() - t0) / 100;
            hot = dt < hot ? dt : hot;
        }
        print_message("bench %-5s GEMV %d x %d: median %.3f ms = %.1f GB/s (best %.1f GB/s; 512 rows in L2, "
                      "1 thr: %.1f GB/s) | GEMM 64 tok: %.1f ms, %.1f GFLOP/s (2 thr), %.1f GFLOP/s (1 thr)\n",
                      kt_dtype_name(types[i]), n_out, n_in, median, bytes / median / 1e6,
                      bytes / best / 1e6, bytes / n_out * 512 / hot / 1e6, gemm,
                      2.0 * n_in * n_out * 64 / gemm / 1e6, 2.0 * n_in * n_out * 64 / gemm1 / 1e6);
        /* a thread's share of a small model's K or V (96 rows of 576;
         * the K-quants, whose blocks are 256 values: of 512): what the
         * tiles do with few rows, one thread, hot */
        {
            const int sn_in = 576 % kt_dtype_get(plain)->block_size == 0 ? 576 : 512, sn_out = 96;
            void *sw = bench_weights(types[i], sn_in, sn_out, 2);
            double small = 1e30;
            for (int rep = 0; rep < 20; rep++) {
                double t0 = kt_time_ms();
                for (int k = 0; k < 1000; k++) kt_matmul(NULL, out, sw, types[i], x, sn_in, sn_out, 1);
                double dt = (kt_time_ms() - t0) / 1000;
                small = dt < small ? dt : small;
            }
            print_message("      GEMV 96 x %d, 1 thr, hot: %.2f us\n", sn_in, small * 1e3);
            free(sw);
        }
        /* the naive alternative: 64 GEMVs */
        double t0 = kt_time_ms();
        for (int t = 0; t < 64; t++)
            kt_matmul(pool, out + (size_t)t * n_out, w, types[i], x + (size_t)t * n_in, n_in, n_out, 1);
        double naive = kt_time_ms() - t0;
        print_message("      64 x GEMV: %.1f ms, %.1f GFLOP/s\n", naive,
                      2.0 * n_in * n_out * 64 / naive / 1e6);
        for (int c = 0; c < copies; c++) free(ws[c]);
        free(w);
    }
    /* attention: decode at position 1023 and a 64-token prefill, 32 heads
     * (4 KV heads) of 64 */
    if (!only || strcmp(only, "attention") == 0) {
        enum { NP = 1024, NH = 32, NKV = 4, HD = 64 };
        float *q = tu_xmalloc(sizeof(float) * 64 * NH * HD), *o = tu_xmalloc(sizeof(float) * 64 * NH * HD);
        float *k = tu_xmalloc(sizeof(float) * NP * NKV * HD), *v = tu_xmalloc(sizeof(float) * NP * NKV * HD);
        tu_fill_normal(q, (size_t)64 * NH * HD, 1.0f, 1);
        tu_fill_normal(k, (size_t)NP * NKV * HD, 1.0f, 2);
        tu_fill_normal(v, (size_t)NP * NKV * HD, 1.0f, 3);
        kt_attn_args a = {.out = o, .q = q, .k = k, .v = v, .n_tokens = 1, .pos0 = NP - 1, .n_head = NH,
                          .n_head_kv = NKV, .head_dim = HD, .q_stride = NH * HD,
                          .kv_stride = NKV * HD, .out_stride = NH * HD};
        double best = 1e30, best_ref = 1e30;
        for (int rep = 0; rep < 20; rep++) {
            double t0 = kt_time_ms();
            kt_attention(pool, &a);
            double t1 = kt_time_ms();
            if (rep < 3) kt_attention_ref(&a);
            double t2 = kt_time_ms();
            best = t1 - t0 < best ? t1 - t0 : best;
            if (rep < 3) best_ref = t2 - t1 < best_ref ? t2 - t1 : best_ref;
        }
        print_message("bench attention decode, %d positions: %.3f ms (2 thr; reference 1 thr %.3f ms)\n",
                      NP, best, best_ref);
        a.n_tokens = 64;
        a.pos0 = NP - 64;
        best = 1e30;
        for (int rep = 0; rep < 5; rep++) {
            double t0 = kt_time_ms();
            kt_attention(pool, &a);
            double dt = kt_time_ms() - t0;
            best = dt < best ? dt : best;
        }
        print_message("bench attention prefill, 64 tokens at %d..%d: %.3f ms (2 thr)\n", NP - 64, NP - 1, best);
        free(q);
        free(o);
        free(k);
        free(v);
    }
    if (!only || strcmp(only, "attention") == 0) {
        bench_attention_pp512(9, 3, pool);  /* smollm-135m */
        bench_attention_pp512(32, 4, pool); /* tinyllama-1.1b */
    }
    /* pool overhead: back-to-back empty jobs */
    count_ctx c = {0};
    double t0 = kt_time_ms();
    for (int i = 0; i < 100000; i++) kt_pool_run(pool, count_fn, &c);
    print_message("bench pool_run (2 threads, empty job): %.2f us\n", (kt_time_ms() - t0) * 1e3 / 1e5);
    free(x);
    free(out);
    kt_pool_free(pool);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_runs_every_thread),
        cmocka_unit_test(test_pool_memory_visibility),
        cmocka_unit_test(test_split_range),
        cmocka_unit_test(test_pool_scratch),
        cmocka_unit_test(test_cpu_dispatch),
        cmocka_unit_test(test_dequant_q4_0_known),
        cmocka_unit_test(test_dequant_q8_0_known),
        cmocka_unit_test(test_plain_types_roundtrip),
        cmocka_unit_test(test_f16_row_matches_scalar),
        cmocka_unit_test(test_quant_roundtrip_error),
        cmocka_unit_test(test_q4_0_max_sign_and_ties),
        cmocka_unit_test(test_q8_0_rounding),
        cmocka_unit_test(test_act_quant_matches_q8_0),
        cmocka_unit_test(test_q8_0_bytes_match_llama),
        cmocka_unit_test(test_q4_0_bytes_match_llama),
        cmocka_unit_test(test_matmul_supported),
        cmocka_unit_test(test_matmul_ref_small),
        cmocka_unit_test(test_matmul_simd_vs_ref),
        cmocka_unit_test(test_matmul_q8_0_extremes),
        cmocka_unit_test(test_matmul_float_odd_n_in),
        cmocka_unit_test(test_matmul_float_tiers_agree),
        cmocka_unit_test(test_matmul_scalar_is_ref),
        cmocka_unit_test(test_matmul_batch_invariance),
        cmocka_unit_test(test_matmul_token_chunks),
        cmocka_unit_test(test_matmul_many),
        cmocka_unit_test(test_repack_layout),
        cmocka_unit_test(test_repacked_matmul),
        cmocka_unit_test(test_kquant_extremes),
        cmocka_unit_test(test_byte_level_extremes),
        cmocka_unit_test(test_mxfp4_scales_extremes),
        cmocka_unit_test(test_mxfp4_expert_views),
        cmocka_unit_test(test_x16_layout),
        cmocka_unit_test(test_repacked_rows),
        cmocka_unit_test(test_x16_matmul),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_delta_rule),
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_geglu),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_rope_scaling),
        cmocka_unit_test(test_rope_angles_apply),
        cmocka_unit_test(test_exp_tiers_agree),
        cmocka_unit_test(test_rope_matches_ggml_recurrence),
        cmocka_unit_test(test_swiglu_oai),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_future_inf),
        cmocka_unit_test(test_attention_paged),
        cmocka_unit_test(test_attention_decode_long),
        cmocka_unit_test(test_attention_window_softcap),
    };
    /* The throughput measurement is not a test: it runs instead of the
     * tests when asked for, and never shows up as a skipped test. */
    const char *bench = getenv("KT_OPS_BENCH");
    if (bench && *bench && strcmp(bench, "0") != 0) {
        run_bench(strcmp(bench, "1") == 0 ? NULL : bench);
        return 0;
    }
    if (getenv("KT_TEST_FILTER")) cmocka_set_test_filter(getenv("KT_TEST_FILTER")); /* e.g. test_attention* */
    return tu_result(cmocka_run_group_tests(tests, NULL, NULL));
}
