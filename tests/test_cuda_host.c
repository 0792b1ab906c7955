/*
 * test_cuda_host.c - the CUDA backend's CPU side, which runs anywhere
 * (tests/test_cuda.c is the GPU side, skipped without one):
 *   - the attention metadata builder: a batch's kv_seq block tables
 *     (lengths 1, 15, 16, 17, 4095, 4097, a fork sharing a prefix, a
 *     sequence with two tokens) flattened as the kernel reads them, and
 *     the CPU attention over the flat arrays equal, bit for bit, to the
 *     one over the tables themselves; its refusals;
 *   - the matmul twin (F32 activations) against kt_matmul_ref (Q8_0
 *     activations) within the bound of the activations' quantization;
 *   - the probe and `kettle devices`: a usable GPU listed, or none and a
 *     reason that names what to do.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/fp16.h"
#include "base/rng.h"
#include "cuda/kt_cuda.h"
#include "kv/block_pool.h"
#include "ops/matmul.h"
#include "ops/ops.h"
#include "ops/quant.h"
#include "testutil.h"

static kv_pool *f16_pool(int n_blocks, int kv_dim, kv_type type) {
    kv_pool_params pp = {.n_blocks = n_blocks, .block_tokens = 16, .n_layer = 1, .kv_dim = kv_dim, .type = type};
    kt_error err;
    kv_pool *p = kv_pool_new(&pp, &err);
    assert_non_null(p);
    return p;
}

static kv_seq *seq_of(kv_pool *pool, int len) {
    kt_error err;
    kv_seq *s = kv_seq_new(pool, &err);
    assert_non_null(s);
    assert_int_equal(kv_seq_append(s, len, &err), KT_OK);
    return s;
}

static void test_meta_layout(void **state) {
    (void)state;
    const int n_head = 8, n_head_kv = 2, hd = 64;
    kv_pool *pool = f16_pool(600, n_head_kv * hd, KV_F16);
    kt_error err;
    const int lens[] = {1, 15, 16, 17, 4095, 4097};
    kv_seq *seqs[7];
    for (int s = 0; s < 6; s++) seqs[s] = seq_of(pool, lens[s]);
    seqs[6] = kv_seq_fork(seqs[5], &err); /* shares 257 blocks, then copies the partial last one */
    assert_non_null(seqs[6]);
    assert_int_equal(kv_seq_append(seqs[6], 20, &err), KT_OK);
    /* 8 tokens: one per sequence, and a second one of sequence 3 (a
     * verify pass) that attends one position less */
    int tok_seq[8] = {0, 1, 2, 3, 4, 5, 6, 3}, n_pos[8];
    for (int t = 0; t < 7; t++) n_pos[t] = seqs[t]->len;
    n_pos[7] = seqs[3]->len - 1;
    kt_cuda_attn_meta m = {0};
    assert_int_equal(kt_cuda_attn_meta_build(&m, (const kv_seq *const *)seqs, 7, tok_seq, n_pos, 8, &err), KT_OK);
    int entries = 0;
    for (int s = 0; s < 7; s++) entries += seqs[s]->n_blocks; /* sequence 3's table once */
    assert_int_equal(m.n_entries, entries);
    assert_int_equal(m.n_tokens, 8);
    assert_int_equal((int)kt_cuda_attn_meta_len(&m), entries + 3 * 8);
    assert_int_equal(m.block_tokens, 16);
    assert_true(m.row_bytes == kv_pool_row_bytes(pool) && m.block_bytes == kv_pool_block_bytes(pool));
    const int32_t *off = kt_cuda_attn_meta_off(&m), *np = kt_cuda_attn_meta_npos(&m), *pos = kt_cuda_attn_meta_pos(&m);
    assert_int_equal(off[7], off[3]);
    for (int t = 0; t < 8; t++) {
        const kv_seq *s = seqs[tok_seq[t]];
        assert_int_equal(np[t], n_pos[t]);
        assert_int_equal(pos[t], n_pos[t] - 1);
        for (int p = 0; p < np[t]; p++) /* the kernel's lookup is the table's */
            assert_int_equal(m.buf[off[t] + p / 16], s->blocks[p / 16]);
    }
    /* the fork reads the original's blocks in place up to its copied one */
    for (int b = 0; b < 256; b++) assert_int_equal(m.buf[off[6] + b], m.buf[off[5] + b]);
    assert_int_not_equal(m.buf[off[6] + 256], m.buf[off[5] + 256]);

    /* attention through the flat arrays (per-token pointers into m.buf,
     * as the kernel indexes them) equals attention through the tables */
    const size_t plane = (size_t)600 * kv_pool_block_bytes(pool);
    kt_rng r;
    kt_rng_seed(&r, 5);
    for (int k = 0; k < 2; k++) {
        uint16_t *h = kv_pool_plane(pool, 0, (kv_kind)k);
        for (size_t i = 0; i < plane / 2; i++) h[i] = kt_fp32_to_fp16(kt_rng_normal(&r));
    }
    const size_t qn = (size_t)n_head * hd;
    float *q = tu_xmalloc(qn * 8 * sizeof *q), *o1 = tu_xmalloc(qn * 8 * sizeof *o1);
    float *o2 = tu_xmalloc(qn * 8 * sizeof *o2);
    tu_fill_normal(q, qn * 8, 1.0f, 9);
    const int32_t *direct[8], *flat[8];
    for (int t = 0; t < 8; t++) {
        direct[t] = seqs[tok_seq[t]]->blocks;
        flat[t] = m.buf + off[t];
    }
    kt_attn_args a = {.out = o1, .q = q, .k = kv_pool_plane(pool, 0, KV_K), .v = kv_pool_plane(pool, 0, KV_V),
                      .n_tokens = 8, .n_head = n_head, .n_head_kv = n_head_kv, .head_dim = hd, .q_stride = qn,
                      .out_stride = qn, .kv_type = KT_F16, .blocks = direct, .block_tokens = 16,
                      .row_bytes = m.row_bytes, .block_bytes = m.block_bytes, .n_pos = n_pos};
    kt_attention_ref(&a);
    a.out = o2;
    a.blocks = flat;
    a.n_pos = np;
    kt_attention_ref(&a);
    assert_memory_equal(o1, o2, qn * 8 * sizeof *o1);

    /* rebuilt smaller, the buffer is kept */
    int32_t *buf = m.buf;
    assert_int_equal(kt_cuda_attn_meta_build(&m, (const kv_seq *const *)seqs, 7, tok_seq, n_pos, 2, &err), KT_OK);
    assert_ptr_equal(m.buf, buf);
    assert_int_equal(m.n_entries, seqs[0]->n_blocks + seqs[1]->n_blocks);
    kt_cuda_attn_meta_free(&m);
    free(q), free(o1), free(o2);
    for (int s = 0; s < 7; s++) kv_seq_free(seqs[s]);
    kv_pool_free(pool);
}

static void test_meta_refusals(void **state) {
    (void)state;
    kv_pool *pool = f16_pool(8, 128, KV_F16), *other = f16_pool(8, 128, KV_F16), *f32 = f16_pool(8, 128, KV_F32);
    kv_seq *a = seq_of(pool, 20), *b = seq_of(other, 3), *c = seq_of(f32, 3);
    kt_cuda_attn_meta m = {0};
    kt_error err;
    int ts[1] = {0}, np[1] = {21};
    const kv_seq *one[1] = {a};
    /* attends past the sequence's length */
    assert_int_equal(kt_cuda_attn_meta_build(&m, one, 1, ts, np, 1, &err), KT_ERR_ARG);
    assert_non_null(strstr(err.msg, "attends 21 positions"));
    np[0] = 0;
    assert_int_equal(kt_cuda_attn_meta_build(&m, one, 1, ts, np, 1, &err), KT_ERR_ARG);
    np[0] = 5;
    ts[0] = 1;
    assert_int_equal(kt_cuda_attn_meta_build(&m, one, 1, ts, np, 1, &err), KT_ERR_ARG);
    ts[0] = 0;
    const kv_seq *two[2] = {a, b};
    assert_int_equal(kt_cuda_attn_meta_build(&m, two, 2, ts, np, 1, &err), KT_ERR_ARG);
    assert_non_null(strstr(err.msg, "another pool"));
    const kv_seq *fl[1] = {c};
    np[0] = 3;
    assert_int_equal(kt_cuda_attn_meta_build(&m, fl, 1, ts, np, 1, &err), KT_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "F16"));
    assert_null(m.buf); /* nothing built by a refusal */
    kv_seq_free(a), kv_seq_free(b), kv_seq_free(c);
    kv_pool_free(pool), kv_pool_free(other), kv_pool_free(f32);
}

/* The twin (F32 activations, double sums) against kettle's reference
 * (activations quantized to Q8_0 for the block types, to Q8_K for the
 * K-quants): they differ by the activations' rounding, at most |x - x'|
 * <= 0.6 d per element with d = amax / 127 of its block of 32 (256 for
 * Q8_K) (half a step, plus the fp16 rounding of Q8_0's d: 127 * 2^-11 d),
 * so by sum |w_i| 0.6 d_i, plus float rounding in the reference (1e-5 of
 * sum |w x|). F16 and BF16 weights: the reference is F32 too. */
static void check_twin(kt_dtype type, int n_in, int n_out, int nt) {
    void *w = tu_make_weights(type, n_in, n_out, 77, 0.0f);
    float *x = tu_xmalloc((size_t)n_in * nt * sizeof *x), *a = tu_xmalloc((size_t)n_out * nt * sizeof *a);
    float *b = tu_xmalloc((size_t)n_out * nt * sizeof *b), *row = tu_xmalloc((size_t)n_in * sizeof *row);
    tu_fill_normal(x, (size_t)n_in * nt, 1.0f, 78);
    kt_cuda_matmul_twin(a, w, type, x, n_in, n_out, nt);
    kt_matmul_ref(b, w, type, x, n_in, n_out, nt);
    const size_t rb = kt_dtype_row_bytes(type, n_in);
    for (int r = 0; r < n_out; r++) {
        kt_dequantize_row(type, (const char *)w + r * rb, row, n_in);
        for (int t = 0; t < nt; t++) {
            const float *xt = x + (size_t)t * n_in;
            double bound = 0, mag = 0;
            for (int i = 0; i < n_in; i++) {
                mag += fabs((double)row[i] * xt[i]);
                if (type != KT_F16 && type != KT_BF16) {
                    const int qb = type == KT_Q4_K || type == KT_Q5_K || type == KT_Q6_K ? 256 : 32;
                    float amax = 0;
                    for (int j = i / qb * qb; j < i / qb * qb + qb; j++) amax = fmaxf(amax, fabsf(xt[j]));
                    bound += fabs(row[i]) * 0.6 * amax / 127.0;
                }
            }
            bound += 1e-5 * mag + 1e-30;
            const double e = fabs((double)a[(size_t)t * n_out + r] - b[(size_t)t * n_out + r]);
            if (!(e <= bound)) fail_msg("%s %dx%d t%d row %d: twin %g, reference %g, bound %g", kt_dtype_name(type),
                                        n_in, n_out, t, r, a[(size_t)t * n_out + r], b[(size_t)t * n_out + r], bound);
        }
    }
    free(w), free(x), free(a), free(b), free(row);
}

static void test_matmul_twin(void **state) {
    (void)state;
    const kt_dtype types[4] = {KT_Q4_0, KT_Q8_0, KT_F16, KT_BF16};
    for (int i = 0; i < 4; i++) {
        check_twin(types[i], 96, 13, 3);
        check_twin(types[i], 512, 17, 8);
        check_twin(types[i], 896, 5, 1);
    }
    const kt_dtype kquants[3] = {KT_Q4_K, KT_Q5_K, KT_Q6_K};
    for (int i = 0; i < 3; i++) {
        check_twin(kquants[i], 256, 11, 3);
        check_twin(kquants[i], 2304, 7, 8); /* 9 super-blocks: not a whole chunk of the kernel's 8 */
    }
    assert_true(kt_cuda_matmul_supported(KT_Q4_0) && kt_cuda_matmul_supported(KT_F16));
    assert_true(kt_cuda_matmul_supported(KT_Q4_K) && kt_cuda_matmul_supported(KT_Q5_K) &&
                kt_cuda_matmul_supported(KT_Q6_K) && kt_cuda_matmul_supported(KT_BF16));
    assert_false(kt_cuda_matmul_supported(KT_Q3_K) || kt_cuda_matmul_supported(KT_IQ4_NL));
}

/* Without a usable GPU (CI, this project's machines): the probe says why
 * and `kettle devices` prints the same reason and exits 1; with one it is
 * listed and usable, and devices exits 0. */
static void test_probe_and_devices(void **state) {
    (void)state;
    kt_cuda_info info;
    kt_error err;
    const kt_status st = kt_cuda_probe(&info, &err);
    char *out = NULL, *errs = NULL;
    const int rc = tu_run(KT_BIN " devices", &out, &errs);
    assert_non_null(out);
    assert_non_null(errs);
    if (st == KT_OK) {
        assert_int_equal(rc, 0);
        assert_true(info.n_devices >= 1 && info.dev[0].usable);
        assert_non_null(strstr(out, info.dev[0].name));
    } else {
        assert_int_equal(st, KT_ERR_UNSUPPORTED);
        assert_int_equal(rc, 1);
        /* one of the reasons, each with what to do */
        assert_true(strstr(err.msg, "built without the CUDA backend") || strstr(err.msg, "libcuda.so.1") ||
                    strstr(err.msg, "driver is too old") || strstr(err.msg, "no CUDA device") ||
                    strstr(err.msg, "rebuild with -DCMAKE_CUDA_ARCHITECTURES") ||
                    strstr(err.msg, "failed: cuda")); /* any other runtime error, by its name */
        assert_non_null(strstr(errs, "no usable GPU"));
        assert_non_null(strstr(errs, err.msg));
        assert_non_null(strstr(out, info.built ? "CUDA backend: built for architectures" : "CUDA backend: not built"));
#ifndef KT_HAVE_CUDA
        assert_false(info.built);
        assert_non_null(strstr(err.msg, "-DKETTLE_CUDA=OFF"));
#endif
    }
    /* every GPU-side call fails cleanly where there is no GPU */
    if (st != KT_OK) {
        kt_cuda_buf b;
        assert_int_not_equal(kt_cuda_alloc(&b, 64, "probe test", &err), KT_OK);
        assert_null(b.ptr);
        assert_int_not_equal(kt_cuda_sync(&err), KT_OK);
    }
    free(out);
    free(errs);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_meta_layout),
        cmocka_unit_test(test_meta_refusals),
        cmocka_unit_test(test_matmul_twin),
        cmocka_unit_test(test_probe_and_devices),
    };
    return tu_result(cmocka_run_group_tests(tests, NULL, NULL));
}
