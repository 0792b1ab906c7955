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
#include "gguf/gguf.h"
#include "ops/quant.h"

#define CMD "quantize"
#define GGML_QNT_VERSION 2
#define NAME_CAP 256

/* What to write: a base type, whether llama.cpp's _M mix applies, and the
 * general.file_type (LLAMA_FTYPE) to record. */
typedef struct recipe {
    kt_dtype base;
    bool mix;
    uint32_t ftype;
} recipe;

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

/* ---- which tensors change ---- */

static bool ends_with(gguf_str s, const char *suffix) {
    size_t n = strlen(suffix);
    return s.len >= n && memcmp(s.ptr + s.len - n, suffix, n) == 0;
}

static bool contains(gguf_str s, const char *needle) {
    size_t n = strlen(needle);
    for (uint64_t i = 0; n <= s.len && i <= s.len - n; i++)
        if (memcmp(s.ptr + i, needle, n) == 0) return true;
    return false;
}

/* ggml_n_dims: dimensions up to the last one larger than 1. */
static uint32_t effective_dims(const gguf_tensor *t) {
    uint32_t n = 1;
    for (uint32_t d = 1; d < t->n_dims; d++)
        if (t->dims[d] > 1) n = d + 1;
    return n;
}

/* llama.cpp's rule (tensor_allows_quantization in src/llama-quant.cpp) for
 * tensors to quantize. For Qwen 3.5 (qwen35, qwen35moe) that keeps
 * ssm_conv1d, ssm_norm, the router ffn_gate_inp and the 1-D tensors (ssm_a
 * and ssm_dt.bias, whose names do not end in "weight", and the shared
 * expert's gate vector ffn_gate_inp_shexp) as they are, and converts
 * ssm_alpha / ssm_beta ([n_embd, value heads]), attn_qkv, attn_gate,
 * ssm_out, the experts and the shared expert; llama.cpp has no rule of its
 * own for MTP (nextn) layers either: their matrices take the type like any
 * other (checked against llama.cpp de3ff81 and its qwen35 / qwen35moe
 * Q8_0 goldens in test_tools). */
static bool is_quantizable(const gguf_tensor *t) {
    static const char *KEEP[] = {"_norm.weight", "ffn_gate_inp.weight",
                                 "ssm_conv1d.weight", "time_mix_first.weight",
                                 "attn_rel_b.weight"};
    if (!ends_with(t->name, "weight") || effective_dims(t) < 2) return false;
    for (size_t i = 0; i < sizeof KEEP / sizeof KEEP[0]; i++)
        if (contains(t->name, KEEP[i])) return false;
    return !gguf_str_eq(t->name, "position_embd.weight") &&
           !gguf_str_eq(t->name, "token_types.weight");
}

/* Types of 256-value blocks, which need whole 256-value rows. */
static bool is_kquant(kt_dtype t) {
    return t == KT_Q2_K || t == KT_Q3_K || t == KT_Q4_K || t == KT_Q5_K || t == KT_Q6_K || t == KT_IQ4_XS;
}

/* llama.cpp's category_is_attn_v: tensors that take attn_v's rule and
 * share its counter. */
static bool is_attn_v_like(gguf_str name) {
    return contains(name, "attn_v.weight") || contains(name, "attn_qkv.weight") ||
           contains(name, "attn_kv_b.weight");
}

/* llama.cpp's use_more_bits: layer i of n gets more bits in the first and
 * last eighth, and every third layer in between. */
static bool use_more_bits(int i, int n) {
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

/* The layer of "blk.N...", or -1 (digits only: sscanf would also take a
 * sign or spaces, which no real tensor name has). */
static long layer_of(gguf_str s) {
    const size_t n = 4; /* "blk." */
    if (s.len <= n || memcmp(s.ptr, "blk.", n) != 0) return -1;
    long v = 0;
    size_t i = n;
    for (; i < s.len && s.ptr[i] >= '0' && s.ptr[i] <= '9' && v < 100000000L; i++)
        v = 10 * v + (s.ptr[i] - '0');
    return i > n ? v : -1;
}

/* Counts over the file (llama.cpp's n_attention_wv; n_ffn_down is the
 * layer count), the running indices (i_attention_wv, i_ffn_down), and the
 * hyper-parameters the rules read: GQA ratio n_head / n_head_kv, experts. */
typedef struct mix_state {
    int n_attn_v, n_layer, i_attn_v, i_ffn_down, n_gqa, n_expert;
    bool has_output, is_70b; /* llama.cpp's LLM_TYPE_70B */
} mix_state;

/* llama.cpp's LLAMA_FTYPE values of the mixes */
enum {
    FT_Q2_K = 10, FT_Q3_K_S = 11, FT_Q3_K_M = 12, FT_Q3_K_L = 13, FT_Q4_K_S = 14, FT_Q4_K_M = 15,
    FT_Q5_K_M = 17, FT_IQ4_NL = 25, FT_IQ4_XS = 30, FT_MXFP4_MOE = 38,
};

static bool is_iq4(uint32_t ft) { return ft == FT_IQ4_NL || ft == FT_IQ4_XS; }

/* attn_v, attn_qkv, attn_kv_b (llama.cpp: the else-if chain, then the
 * 8-expert override; i is this tensor's index among them) */
static kt_dtype mix_attn_v(uint32_t ft, kt_dtype base, int i, const mix_state *m) {
    kt_dtype t = base;
    if (ft == FT_Q2_K) t = m->n_gqa >= 4 ? KT_Q4_K : KT_Q3_K;
    else if (ft == FT_Q3_K_M) t = i < 2 ? KT_Q5_K : KT_Q4_K;
    else if (ft == FT_Q3_K_L) t = KT_Q5_K;
    else if (is_iq4(ft) && m->n_gqa >= 4) t = KT_Q5_K;
    else if ((ft == FT_Q4_K_M || ft == FT_Q5_K_M) && use_more_bits(i, m->n_attn_v)) t = KT_Q6_K;
    /* 70B: 8 query heads share each attn_v row, so more bits cost little */
    if (m->is_70b && (t == KT_Q3_K || t == KT_Q4_K)) t = KT_Q5_K;
    return m->n_expert == 8 ? KT_Q8_0 : t;
}

/* ffn_down of layer il of n */
static kt_dtype mix_ffn_down(uint32_t ft, kt_dtype base, int il, int n) {
    if (ft == FT_Q2_K) return KT_Q3_K;
    if (ft == FT_Q3_K_M) return il < n / 16 ? KT_Q5_K : KT_Q4_K; /* Falcon's Q3_K layers not reproduced */
    if (ft == FT_Q3_K_L) return KT_Q5_K;
    if (ft == FT_Q4_K_M) return use_more_bits(il, n) ? KT_Q6_K : base;
    if (is_iq4(ft)) return il < n / 8 ? KT_Q5_K : base;
    if (ft == FT_Q5_K_M) return use_more_bits(il, n) ? KT_Q6_K : base;
    return base;
}

static kt_dtype mix_attn_output(uint32_t ft, kt_dtype base, const mix_state *m) {
    if (m->n_expert == 8)
        return ft == FT_Q2_K || ft == FT_Q3_K_S || ft == FT_Q3_K_M || is_iq4(ft) || ft == FT_Q4_K_S ||
                       ft == FT_Q4_K_M
                   ? KT_Q5_K
                   : base;
    return ft == FT_Q2_K ? KT_Q3_K : ft == FT_Q3_K_M ? KT_Q4_K : ft == FT_Q3_K_L ? KT_Q5_K : base;
}

/* The type a mix gives a quantizable tensor (before the fallback):
 * llama.cpp's llama_tensor_get_type_impl for these file types. */
static kt_dtype mix_type(const gguf_tensor *t, const recipe *r, mix_state *m) {
    const uint32_t ft = r->ftype;
    if (ft == FT_MXFP4_MOE) /* llama.cpp: output (and tied embedding) Q8_0, then ne[2] > 1 -> MXFP4 */
        return gguf_str_eq(t->name, "output.weight") || (!m->has_output && gguf_str_eq(t->name, "token_embd.weight")) ||
                       t->n_dims < 3 || t->dims[2] <= 1
                   ? KT_Q8_0
                   : r->base;
    if (gguf_str_eq(t->name, "output.weight") || (!m->has_output && gguf_str_eq(t->name, "token_embd.weight")))
        return t->dims[0] % kt_dtype_get(r->base)->block_size ? KT_Q8_0 : r->base == KT_Q8_0 ? KT_Q8_0 : KT_Q6_K;
    if (is_attn_v_like(t->name)) {
        const kt_dtype v = mix_attn_v(ft, r->base, m->i_attn_v, m);
        m->i_attn_v++;
        return v;
    }
    if (contains(t->name, "attn_k.weight")) return m->n_expert == 8 ? KT_Q8_0 : r->base;
    if (contains(t->name, "ffn_down")) {
        /* with experts, llama.cpp reads the layer from the name */
        const int il = m->n_expert > 1 ? (int)layer_of(t->name) : m->i_ffn_down;
        m->i_ffn_down++;
        return mix_ffn_down(ft, r->base, il, m->n_layer);
    }
    if (contains(t->name, "attn_output.weight")) return mix_attn_output(ft, r->base, m);
    return r->base;
}

/* llama.cpp's type for a 256-block tensor whose rows are not a multiple
 * of 256 (tensor_type_fallback). */
static kt_dtype kquant_fallback(kt_dtype t) {
    switch (t) {
    case KT_Q2_K:
    case KT_Q3_K: return KT_Q4_0;
    case KT_Q4_K: return KT_Q5_0;
    case KT_Q5_K: return KT_Q5_1;
    case KT_IQ4_XS: return KT_IQ4_NL;
    default: return KT_Q8_0; /* Q6_K */
    }
}

/* The type a quantizable tensor of row length n0 gets for `want`: K-quants
 * need whole 256-value rows, else their fallback; where even that block
 * (or a 32-value type's own) does not divide the row, F16, as llama.cpp's
 * tensor_type_fallback does ("must use F16 due to unusual shape"). Only
 * block types fall back: F32 / F16 / BF16 fit every row. */
static kt_dtype fit_type(kt_dtype want, int64_t n0) {
    if (is_kquant(want) && n0 % 256) want = kquant_fallback(want);
    return n0 % kt_dtype_get(want)->block_size ? KT_F16 : want;
}

/* ---- llama.cpp's tensor order ----
 * llama-quantize visits tensors in its loader's map order, sorted by the
 * layer number that sscanf("blk.%d.") reads (-1 for other tensors), then
 * by name. The counters of the mix follow that order, so a file whose
 * tensors come in another order (blk.0, blk.1, blk.10, ..., blk.2, ...)
 * must be walked the same way or use_more_bits picks other layers. */

/* std::string's operator<: bytes compared unsigned, a prefix first. */
static int name_cmp(gguf_str a, gguf_str b) {
    int c = memcmp(a.ptr, b.ptr, a.len < b.len ? (size_t)a.len : (size_t)b.len);
    return c ? c : (a.len > b.len) - (a.len < b.len);
}

typedef struct order_key {
    long layer;
    gguf_str name;
    int64_t index;
} order_key;

static int order_cmp(const void *pa, const void *pb) {
    const order_key *a = pa, *b = pb;
    if (a->layer != b->layer) return (a->layer > b->layer) - (a->layer < b->layer);
    return name_cmp(a->name, b->name); /* names are unique */
}

/* Tensor indices in llama.cpp's order; NULL if out of memory. */
static int64_t *tensor_order(const gguf_file *f) {
    int64_t n = gguf_n_tensors(f);
    int64_t *order = malloc(sizeof *order * (size_t)(n ? n : 1));
    order_key *keys = malloc(sizeof *keys * (size_t)(n ? n : 1));
    if (!order || !keys) {
        free(order);
        free(keys);
        return NULL;
    }
    for (int64_t i = 0; i < n; i++) {
        gguf_str name = gguf_tensor_at(f, i)->name;
        keys[i] = (order_key){layer_of(name), name, i};
    }
    qsort(keys, (size_t)n, sizeof *keys, order_cmp);
    for (int64_t i = 0; i < n; i++) order[i] = keys[i].index;
    free(keys);
    return order;
}

/* "<arch>.<suffix>" as an int, or def. */
static int64_t arch_int(const gguf_file *f, const char *arch, const char *suffix, int64_t def) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int64_t v;
    return gguf_get_i64(f, key, def, &v) ? v : def;
}

/* The hyper-parameters llama.cpp's rules read: layers (its n_ffn_down),
 * heads per KV head, experts, whether the loader calls the model a 70B.
 * A file without them gets the values that turn those rules off. */
static void read_hparams(const gguf_file *f, mix_state *m) {
    char a[64] = "";
    gguf_get_str(f, "general.architecture", a, sizeof a);
    const int64_t n_layer = arch_int(f, a, "block_count", 0), n_head = arch_int(f, a, "attention.head_count", 1);
    const int64_t n_kv = arch_int(f, a, "attention.head_count_kv", n_head), e = arch_int(f, a, "expert_count", 0);
    m->n_layer = n_layer > 0 && n_layer < 1 << 20 ? (int)n_layer : 0;
    m->n_gqa = n_kv > 0 && n_head > 0 && n_head / n_kv < 1 << 20 ? (int)(n_head / n_kv) : 1;
    m->n_expert = e > 0 && e < 1 << 20 ? (int)e : 0;
    /* the archs whose loaders call 80 (jais2: 68) layers LLM_TYPE_70B;
     * llama's 80 layers without GQA are its 65B */
    m->is_70b = (!strcmp(a, "llama") && n_layer == 80 && n_head != n_kv) ||
                ((!strcmp(a, "qwen2") || !strcmp(a, "olmo") || !strcmp(a, "deci")) && n_layer == 80) ||
                (!strcmp(a, "jais2") && n_layer == 68);
}

/* The output type of every tensor (indexed as in the file), decided in
 * llama.cpp's order; n_fallback[0] counts the K-quant tensors written in
 * their fallback type, n_fallback[1] those written in F16 because no
 * block fits their rows. NULL if out of memory. */
static kt_dtype *plan_types(const gguf_file *f, const int64_t *order, const recipe *r,
                            int n_fallback[2]) {
    int64_t n = gguf_n_tensors(f);
    kt_dtype *types = malloc(sizeof *types * (size_t)(n ? n : 1));
    if (!types) return NULL;
    mix_state m = {0};
    int n_ffn_down = 0;
    for (int64_t i = 0; i < n; i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        m.n_attn_v += is_attn_v_like(t->name);
        n_ffn_down += contains(t->name, "ffn_down");
        m.has_output |= gguf_str_eq(t->name, "output.weight");
    }
    read_hparams(f, &m);
    if (!m.n_layer) m.n_layer = n_ffn_down; /* no block_count: a dense model has one per layer */
    n_fallback[0] = n_fallback[1] = 0;
    for (int64_t k = 0; k < n; k++) {
        const int64_t i = order[k];
        const gguf_tensor *t = gguf_tensor_at(f, i);
        types[i] = t->type;
        if (!is_quantizable(t)) continue;
        kt_dtype want = r->mix ? mix_type(t, r, &m) : r->base;
        types[i] = fit_type(want, t->dims[0]);
        n_fallback[0] += is_kquant(want) && types[i] == kquant_fallback(want);
        n_fallback[1] += types[i] == KT_F16 && want != KT_F16;
    }
    return types;
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
    recipe r;
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

static kt_status run_quantize(const char *in, const char *out, const recipe *r,
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

/* The TYPEs besides cli_parse_out_type's: the other plain types (K-quants
 * as --pure writes them) and llama.cpp's mixes. The one list that parsing,
 * `kettle quantize --help`, its error and `kettle --help` all read. */
static const struct {
    const char *name;
    kt_dtype base;
    bool mix;
    uint32_t ftype;
    bool alias; /* accepted, not listed */
} RECIPES[] = {
    {"Q4_1", KT_Q4_1, false, 3, false},   /* LLAMA_FTYPE_MOSTLY_Q4_1 */
    {"Q5_0", KT_Q5_0, false, 8, false},   /* LLAMA_FTYPE_MOSTLY_Q5_0 */
    {"Q5_1", KT_Q5_1, false, 9, false},   /* LLAMA_FTYPE_MOSTLY_Q5_1 */
    {"Q4_K", KT_Q4_K, false, 14, false},  /* LLAMA_FTYPE_MOSTLY_Q4_K_S, as --pure writes */
    {"Q5_K", KT_Q5_K, false, 16, false},  /* LLAMA_FTYPE_MOSTLY_Q5_K_S */
    {"Q6_K", KT_Q6_K, false, 18, false},  /* LLAMA_FTYPE_MOSTLY_Q6_K */
    {"Q2_K", KT_Q2_K, true, FT_Q2_K, false},
    {"Q3_K_S", KT_Q3_K, true, FT_Q3_K_S, false},
    {"Q3_K_M", KT_Q3_K, true, FT_Q3_K_M, false},
    {"Q3_K", KT_Q3_K, true, FT_Q3_K_M, true}, /* llama-quantize's alias */
    {"Q3_K_L", KT_Q3_K, true, FT_Q3_K_L, false},
    {"IQ4_NL", KT_IQ4_NL, true, FT_IQ4_NL, false},
    {"IQ4_XS", KT_IQ4_XS, true, FT_IQ4_XS, false},
    {"Q4_K_M", KT_Q4_K, true, 15, false}, /* LLAMA_FTYPE_MOSTLY_Q4_K_M */
    {"Q5_K_M", KT_Q5_K, true, 17, false}, /* LLAMA_FTYPE_MOSTLY_Q5_K_M */
    {"MXFP4_MOE", KT_MXFP4, true, FT_MXFP4_MOE, false},
};
#define N_RECIPES (sizeof RECIPES / sizeof RECIPES[0])

const char *cmd_quantize_types(bool mixes) {
    static char lists[2][256]; /* built once: the CLI is one thread */
    char *buf = lists[mixes];
    if (buf[0]) return buf;
    size_t n = mixes ? 0 : (size_t)snprintf(buf, sizeof lists[0], "%s", cli_out_type_list());
    for (size_t i = 0; i < N_RECIPES && n < sizeof lists[0]; i++) /* 256 holds either list */
        if (RECIPES[i].mix == mixes && !RECIPES[i].alias)
            n += (size_t)snprintf(buf + n, sizeof lists[0] - n, "%s%s", n ? ", " : "", RECIPES[i].name);
    return buf;
}

/* TYPE: a plain type (cli_parse_out_type or a K-quant, --pure) or a mix. */
static bool parse_recipe(const char *name, recipe *r) {
    for (size_t i = 0; i < N_RECIPES; i++)
        if (strcasecmp(name, RECIPES[i].name) == 0) {
            *r = (recipe){RECIPES[i].base, RECIPES[i].mix, RECIPES[i].ftype};
            return true;
        }
    int t = cli_parse_out_type(name);
    if (t < 0) return false;
    *r = (recipe){(kt_dtype)t, false, cli_llama_ftype((kt_dtype)t)};
    return true;
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
    recipe r;
    if (!parse_recipe(pos[2], &r))
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
