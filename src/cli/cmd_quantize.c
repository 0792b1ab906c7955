/*
 * cmd_quantize.c - `kettle quantize IN.gguf OUT.gguf TYPE`: rewrites a
 * model with its weight matrices in another element type (Q8_0, Q4_0,
 * Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, F16, BF16 or F32), or in llama.cpp's
 * Q2_K, Q3_K_S/M/L, IQ4_NL, IQ4_XS, Q4_K_M, Q5_K_M and MXFP4_MOE mixes.
 *
 * Which tensors change follows llama.cpp's `llama-quantize --pure`: every
 * tensor whose name ends in "weight" with at least two dimensions, except
 * norms and the few small tensors llama.cpp always keeps (MoE gate inputs,
 * position/token-type embeddings, ...). Rows are converted by dequantizing
 * to float and quantizing with the reference kernels of ops/quant.h, so the
 * bytes equal llama.cpp's. Tensors whose row length is not a multiple of
 * the target block size get llama.cpp's fallback type (below), or F16 where
 * no block fits (llama.cpp's tensor_type_fallback). Quantizing an already
 * quantized tensor is refused (the errors would compound); dequantizing one
 * to F32/F16/BF16 is allowed, and a tensor already of the target type is
 * copied.
 *
 * Tensors are processed and written in llama.cpp's order (llama_model_loader's
 * weights_map): by layer number ("blk.N."; other tensors first), then by
 * name. The mix counters below run in that order, and with the same tensor
 * order the output file is byte-identical to llama-quantize's.
 *
 * Memory: the input is mapped by the GGUF reader and unchanged tensors are
 * written straight from the mapping; a converted tensor is built in one
 * buffer, its rows split over the CPUs, so peak memory is about one
 * tensor. All metadata is copied; general.file_type becomes llama.cpp's
 * LLAMA_FTYPE for the target and general.quantization_version is set to 2,
 * as llama.cpp does.
 *
 * The mixes follow llama.cpp's llama_tensor_get_type_impl (mix_type and
 * its helpers below, rule for rule). For Q4_K_M / Q5_K_M every tensor gets
 * the base type (Q4_K or Q5_K) except
 *   - output.weight (token_embd.weight when there is no output.weight):
 *     Q6_K;
 *   - the attn_v-like tensors (attn_v, a fused attn_qkv, MLA's attn_kv_b)
 *     and ffn_down.weight of the layers use_more_bits picks (the first n/8,
 *     the last n/8 and every third in between, counted in llama.cpp's
 *     tensor order over the tensors of that kind): Q6_K. llama.cpp's
 *     category_is_attn_v sends attn_qkv down the attn_v branch, so its
 *     later Q5_K (Q4_K_M) / Q6_K (Q5_K_M) rule for attn_qkv never applies.
 * Q2_K, Q3_K_S/M/L and IQ4_NL/XS add their own rules for attn_v (by the
 * GQA ratio), attn_output and ffn_down, and 8-expert models' attn_k /
 * attn_v (Q8_0) and attn_output (Q5_K), and 70B models' attn_v (Q5_K for
 * Q3_K / Q4_K). Not reproduced: Falcon's rules and importance matrices. A K-quant needs rows that are a multiple of 256 values; other
 * tensors get llama.cpp's fallback types (Q5_0 for Q4_K, Q5_1 for Q5_K,
 * Q8_0 for Q6_K), and the tool says how many. Plain K types (TYPE Q4_K,
 * Q5_K, Q6_K) are --pure: every tensor the base type, with the same
 * fallback.
 *
 * The rules live in quant_mix.c, which gen-model reads too.
 *
 * MXFP4_MOE (gpt-oss's format) follows the same function's MXFP4_MOE
 * branches: the output matrix (or a tied embedding table) Q8_0, every
 * quantizable tensor whose third dimension is more than 1 (the merged
 * experts, ffn_*_exps) MXFP4, every other quantizable tensor Q8_0; 1-D
 * tensors, biases, norms and the router stay as they are.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/error.h"
#include "base/timing.h"
#include "cli/cli_util.h"
#include "ops/pool.h"
#include "cli/commands.h"
#include "cli/quant_mix.h"
#include "gguf/gguf.h"
#include "ops/quant.h"

#define CMD "quantize"
#define GGML_QNT_VERSION 2
#define NAME_CAP 256

static void usage(FILE *out) {
    fprintf(out,
            "usage: kettle quantize [--pure] IN.gguf OUT.gguf TYPE\n"
            "\n"
            "Writes IN with every 2-D weight tensor converted to TYPE, one of\n"
            "  %s;\n"
            "norms and other 1-D tensors stay as they are (like llama.cpp's\n"
            "llama-quantize --pure). A TYPE of llama.cpp's mixes,\n"
            "  %s (Q3_K: Q3_K_M),\n"
            "writes the mix of that name instead (the output, and\n"
            "some attn_v, attn_output and ffn_down tensors with more bits;\n"
            "MXFP4_MOE: the experts MXFP4, the other matrices Q8_0);\n"
            "--pure gives every tensor the base type. Tensors whose rows are\n"
            "not a multiple of a type's block get llama.cpp's fallback types\n"
            "(Q2_K, Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0,\n"
            "IQ4_XS -> IQ4_NL), and F16 where no block fits the rows. Source\n"
            "weights must be F32, F16 or BF16.\n",
            cmd_quantize_types(false), cmd_quantize_types(true));
}

/* "<arch>.<suffix>" as an int, or def. */
static int64_t arch_int(const gguf_file *f, const char *arch, const char *suffix, int64_t def) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int64_t v;
    return gguf_get_i64(f, key, def, &v) ? v : def;
}

/* The hyper-parameters the mix rules read (quant_mix.h's defaults where
 * the file has none). */
static void read_hparams(const gguf_file *f, quant_hparams *hp) {
    gguf_get_str(f, "general.architecture", hp->arch, sizeof hp->arch);
    hp->n_layer = arch_int(f, hp->arch, "block_count", 0);
    hp->n_head = arch_int(f, hp->arch, "attention.head_count", 1);
    hp->n_head_kv = arch_int(f, hp->arch, "attention.head_count_kv", hp->n_head);
    hp->n_expert = arch_int(f, hp->arch, "expert_count", 0);
}

/* The output type of every tensor (quant_plan_types over the file's
 * tensors); NULL if out of memory. */
static kt_dtype *plan_types(const gguf_file *f, const int64_t *order, const quant_recipe *r,
                            int n_fallback[2]) {
    const int64_t n = gguf_n_tensors(f);
    gguf_tensor *ts = malloc(sizeof *ts * (size_t)(n ? n : 1));
    if (!ts) return NULL;
    for (int64_t i = 0; i < n; i++) ts[i] = *gguf_tensor_at(f, i);
    quant_hparams hp = {0};
    read_hparams(f, &hp);
    kt_dtype *types = quant_plan_types(ts, n, order, r, &hp, n_fallback);
    free(ts);
    return types;
}

/* Tensor indices in llama.cpp's order; NULL if out of memory. */
static int64_t *tensor_order(const gguf_file *f) {
    const int64_t n = gguf_n_tensors(f);
    gguf_tensor *ts = malloc(sizeof *ts * (size_t)(n ? n : 1));
    if (!ts) return NULL;
    for (int64_t i = 0; i < n; i++) ts[i] = *gguf_tensor_at(f, i);
    int64_t *order = quant_tensor_order(ts, n);
    free(ts);
    return order;
}

static bool is_plain_float(kt_dtype t) {
    return t == KT_F32 || t == KT_F16 || t == KT_BF16;
}

static void copy_name(gguf_str s, char *buf) {
    size_t n = s.len < NAME_CAP - 1 ? (size_t)s.len : NAME_CAP - 1;
    memcpy(buf, s.ptr, n);
    buf[n] = 0;
}

/* Checks every conversion is possible before any output is written; sets
 * *max_bytes to the largest converted tensor's output size. */
static kt_status check_plan(const gguf_file *f, const kt_dtype *types, size_t *max_bytes,
                            kt_error *err) {
    char name[NAME_CAP];
    *max_bytes = 0;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        kt_dtype to = types[i];
        if (to == t->type) continue;
        copy_name(t->name, name);
        if (!is_plain_float(t->type) && (!is_plain_float(to) ||
                                         !kt_dequantize_supported(t->type)))
            return kt_error_set(err, KT_ERR_UNSUPPORTED,
                                "tensor '%s': %s %s is not supported "
                                "(start from an F32, F16 or BF16 model)", name,
                                kt_dtype_get(t->type)->block_size > 1 ? "requantizing"
                                                                      : "converting",
                                kt_dtype_name(t->type));
        if (t->name.len >= NAME_CAP)
            return kt_error_set(err, KT_ERR_FORMAT, "tensor '%s...': name too long", name);
        size_t bytes = kt_dtype_row_bytes(to, t->dims[0]) * (size_t)(t->n_bytes /
                       kt_dtype_row_bytes(t->type, t->dims[0]));
        if (bytes > *max_bytes) *max_bytes = bytes;
    }
    return KT_OK;
}

/* ---- metadata and tensor declarations ---- */

static kt_status copy_metadata(gguf_writer *w, const gguf_file *f, uint32_t ftype,
                               kt_error *err) {
    kt_status st;
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        gguf_str key = gguf_kv_key(f, i);
        if (gguf_str_eq(key, "general.file_type") ||
            gguf_str_eq(key, "general.quantization_version"))
            continue;
        if ((st = gguf_writer_copy_kv(w, f, i, err)) != KT_OK) return st;
    }
    st = gguf_writer_set_u32(w, "general.quantization_version", GGML_QNT_VERSION, err);
    if (st == KT_OK)
        st = gguf_writer_set_u32(w, "general.file_type", ftype, err);
    return st;
}

static kt_status declare_tensors(gguf_writer *w, const gguf_file *f, const int64_t *order,
                                 const kt_dtype *types, kt_error *err) {
    char name[NAME_CAP];
    for (int64_t k = 0; k < gguf_n_tensors(f); k++) {
        const int64_t i = order[k];
        const gguf_tensor *t = gguf_tensor_at(f, i);
        if (t->name.len >= NAME_CAP)
            return kt_error_set(err, KT_ERR_FORMAT, "tensor %" PRId64 ": name too long", i);
        copy_name(t->name, name);
        kt_status st = gguf_writer_add_tensor(w, name, types[i], t->n_dims, t->dims, err);
        if (st != KT_OK) return st;
    }
    return KT_OK;
}

/* ---- converting rows ---- */

typedef struct conv_job {
    const gguf_tensor *t;
    kt_dtype to;
    unsigned char *out;
    float *scratch; /* CLI_MAX_THREADS rows */
    int64_t n_rows;
    size_t in_row, out_row;
} conv_job;

static void conv_rows(void *ctx, int ith, int nth) {
    const conv_job *j = ctx;
    long lo, hi;
    int64_t n = j->t->dims[0];
    float *row = j->scratch + (size_t)ith * (size_t)n;
    const unsigned char *in = j->t->data;
    kt_split_range(j->n_rows, ith, nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        kt_dequantize_row(j->t->type, in + (size_t)r * j->in_row, row, n);
        kt_quantize_row(j->to, row, j->out + (size_t)r * j->out_row, n);
    }
}

/* Converts tensor t into out (large enough) and returns its size. */
static size_t convert_tensor(const gguf_tensor *t, kt_dtype to, unsigned char *out,
                             float *scratch) {
    conv_job j = {t, to, out, scratch, 0, kt_dtype_row_bytes(t->type, t->dims[0]),
                  kt_dtype_row_bytes(to, t->dims[0])};
    j.n_rows = (int64_t)(t->n_bytes / j.in_row);
    cli_parallel(j.n_rows, conv_rows, &j);
    return (size_t)j.n_rows * j.out_row;
}

/* Drops the input pages of a tensor already written, so resident memory
 * stays about one tensor instead of growing to the whole input. The reader
 * maps the file read-only (gguf.h), so this only discards clean page-cache
 * pages; they would be read again from the file if touched. */
static void release_input(const gguf_tensor *t) {
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0) return;
    uintptr_t lo = ((uintptr_t)t->data + (uintptr_t)page - 1) & ~(uintptr_t)(page - 1);
    uintptr_t hi = ((uintptr_t)t->data + t->n_bytes) & ~(uintptr_t)(page - 1);
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

typedef struct quant_state {
    gguf_file *f;
    quant_recipe r;
    int64_t *order;     /* tensor indices in writing order */
    kt_dtype *types;    /* output type of each tensor */
    unsigned char *buf; /* one converted tensor */
    float *scratch;     /* per-thread rows */
} quant_state;

static kt_status write_tensors(gguf_writer *w, quant_state *q, kt_error *err) {
    cli_progress prog;
    uint64_t total = 0;
    for (int64_t i = 0; i < gguf_n_tensors(q->f); i++) total += gguf_tensor_at(q->f, i)->n_bytes;
    cli_progress_start(&prog, total);
    kt_status st = KT_OK;
    char name[NAME_CAP];
    for (int64_t k = 0; k < gguf_n_tensors(q->f) && st == KT_OK; k++) {
        const int64_t i = q->order[k];
        const gguf_tensor *t = gguf_tensor_at(q->f, i);
        kt_dtype to = q->types[i];
        if (to == t->type) {
            st = gguf_writer_write_tensor(w, t->data, t->n_bytes, err);
        } else {
            size_t n = convert_tensor(t, to, q->buf, q->scratch);
            st = gguf_writer_write_tensor(w, q->buf, n, err);
        }
        release_input(t);
        copy_name(t->name, name);
        cli_progress_add(&prog, t->n_bytes, name);
    }
    cli_progress_end(&prog);
    return st;
}

/* Allocates the conversion buffers: one output tensor, and one float row
 * per thread of the longest converted row. */
static kt_status alloc_buffers(quant_state *q, size_t max_bytes, kt_error *err) {
    int64_t max_row = 1;
    for (int64_t i = 0; i < gguf_n_tensors(q->f); i++) {
        const gguf_tensor *t = gguf_tensor_at(q->f, i);
        if (q->types[i] != t->type && t->dims[0] > max_row) max_row = t->dims[0];
    }
    q->buf = malloc(max_bytes ? max_bytes : 1);
    q->scratch = malloc((size_t)max_row * CLI_MAX_THREADS * sizeof(float));
    if (!q->buf || !q->scratch)
        return kt_error_set(err, KT_ERR_NOMEM, "out of memory (%zu bytes for one tensor)",
                            max_bytes);
    return KT_OK;
}

static kt_status write_output(quant_state *q, const char *out, kt_error *err) {
    gguf_writer *w = gguf_writer_new(err);
    if (!w) return err ? err->status : KT_ERR_NOMEM;
    kt_status st = copy_metadata(w, q->f, q->r.ftype, err);
    if (st == KT_OK) st = declare_tensors(w, q->f, q->order, q->types, err);
    if (st == KT_OK) st = gguf_writer_begin(w, out, err);
    if (st == KT_OK) st = write_tensors(w, q, err);
    if (st == KT_OK) st = gguf_writer_finish(w, err);
    gguf_writer_free(w);
    return st;
}

static kt_status run_quantize(const char *in, const char *out, const quant_recipe *r,
                              kt_error *err) {
    size_t max_bytes;
    int n_fallback[2] = {0, 0};
    quant_state q = {gguf_open(in, err), *r, NULL, NULL, NULL, NULL};
    if (!q.f) return err ? err->status : KT_ERR_IO;
    kt_status st = KT_OK;
    q.order = tensor_order(q.f);
    q.types = q.order ? plan_types(q.f, q.order, r, n_fallback) : NULL;
    if (!q.types) st = kt_error_set(err, KT_ERR_NOMEM, "out of memory");
    if (st == KT_OK) st = check_plan(q.f, q.types, &max_bytes, err);
    if (st == KT_OK && n_fallback[0])
        fprintf(stderr,
                "kettle quantize: %d tensor(s) with rows not a multiple of 256 written in "
                "llama.cpp's fallback types (Q2_K, Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, "
                "Q6_K -> Q8_0, IQ4_XS -> IQ4_NL)\n",
                n_fallback[0]);
    if (st == KT_OK && n_fallback[1])
        fprintf(stderr, "kettle quantize: %d tensor(s) whose rows no block of the type fits written in F16, "
                "as llama.cpp does\n", n_fallback[1]);
    if (st == KT_OK) st = alloc_buffers(&q, max_bytes, err);
    if (st == KT_OK) st = write_output(&q, out, err);
    free(q.order);
    free(q.types);
    free(q.buf);
    free(q.scratch);
    gguf_close(q.f);
    return st;
}

int cmd_quantize(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    const char *pos[3];
    int n_pos = 0;
    bool pure = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--pure")) pure = true;
        else if (argv[i][0] == '-' && argv[i][1]) return cli_usage_error(CMD, "unknown option '%s'", argv[i]);
        else if (n_pos < 3) pos[n_pos++] = argv[i];
        else return cli_usage_error(CMD, "expected IN.gguf OUT.gguf TYPE");
    }
    if (n_pos != 3) return cli_usage_error(CMD, "expected IN.gguf OUT.gguf TYPE");
    quant_recipe r;
    if (!quant_recipe_parse(pos[2], &r))
        return cli_usage_error(CMD, "unknown type '%s' (expected one of %s, or a mix: %s)", pos[2],
                               cmd_quantize_types(false), cmd_quantize_types(true));
    if (pure) r.mix = false; /* llama-quantize --pure: the base type everywhere, the mix's file type */
    kt_error err = {0};
    double t0 = kt_time_ms();
    if (run_quantize(pos[0], pos[1], &r, &err) != KT_OK) return cli_fail(CMD, &err);
    fprintf(stderr, "kettle quantize: wrote %s (%s%s) in %.1f s\n", pos[1], pos[2], pure ? ", pure" : "",
            (kt_time_ms() - t0) / 1e3);
    return 0;
}
