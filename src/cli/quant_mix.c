/*
 * quant_mix.c - which type each tensor gets in `kettle quantize`'s types
 * and llama.cpp's mixes, and llama.cpp's tensor order (quant_mix.h); moved
 * out of cmd_quantize.c so that `kettle gen-model --type MXFP4_MOE` (and
 * the other mixes) applies the very same rules instead of a copy.
 *
 * Which tensors change follows llama.cpp's `llama-quantize --pure`: every
 * tensor whose name ends in "weight" with at least two dimensions, except
 * norms and the few small tensors llama.cpp always keeps (MoE gate inputs,
 * position/token-type embeddings, ...). The mixes follow llama.cpp's
 * llama_tensor_get_type_impl rule for rule (cmd_quantize.c's comment lists
 * them); a K-quant needs rows that are a multiple of 256 values, others get
 * llama.cpp's fallback types, and F16 where no block fits the row.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/quant_mix.h"

/* llama.cpp's LLAMA_FTYPE values of the mixes */
enum {
    FT_Q2_K = 10, FT_Q3_K_S = 11, FT_Q3_K_M = 12, FT_Q3_K_L = 13, FT_Q4_K_S = 14, FT_Q4_K_M = 15,
    FT_Q5_K_M = 17, FT_IQ4_NL = 25, FT_IQ4_XS = 30, FT_MXFP4_MOE = 38,
};

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
static kt_dtype mix_type(const gguf_tensor *t, const quant_recipe *r, mix_state *m) {
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

int64_t *quant_tensor_order(const gguf_tensor *t, int64_t n) {
    int64_t *order = malloc(sizeof *order * (size_t)(n ? n : 1));
    order_key *keys = malloc(sizeof *keys * (size_t)(n ? n : 1));
    if (!order || !keys) {
        free(order);
        free(keys);
        return NULL;
    }
    for (int64_t i = 0; i < n; i++) keys[i] = (order_key){layer_of(t[i].name), t[i].name, i};
    qsort(keys, (size_t)n, sizeof *keys, order_cmp);
    for (int64_t i = 0; i < n; i++) order[i] = keys[i].index;
    free(keys);
    return order;
}

/* The values of hp that llama.cpp's rules read: layers (its n_ffn_down),
 * heads per KV head, experts, whether the loader calls the model a 70B.
 * A file without them gets the values that turn those rules off. */
static void mix_hparams(const quant_hparams *hp, mix_state *m) {
    const char *a = hp->arch;
    const int64_t n_layer = hp->n_layer, n_head = hp->n_head, n_kv = hp->n_head_kv, e = hp->n_expert;
    m->n_layer = n_layer > 0 && n_layer < 1 << 20 ? (int)n_layer : 0;
    m->n_gqa = n_kv > 0 && n_head > 0 && n_head / n_kv < 1 << 20 ? (int)(n_head / n_kv) : 1;
    m->n_expert = e > 0 && e < 1 << 20 ? (int)e : 0;
    /* the archs whose loaders call 80 (jais2: 68) layers LLM_TYPE_70B;
     * llama's 80 layers without GQA are its 65B */
    m->is_70b = (!strcmp(a, "llama") && n_layer == 80 && n_head != n_kv) ||
                ((!strcmp(a, "qwen2") || !strcmp(a, "olmo") || !strcmp(a, "deci")) && n_layer == 80) ||
                (!strcmp(a, "jais2") && n_layer == 68);
}

kt_dtype *quant_plan_types(const gguf_tensor *ts, int64_t n, const int64_t *order,
                           const quant_recipe *r, const quant_hparams *hp, int n_fallback[2]) {
    kt_dtype *types = malloc(sizeof *types * (size_t)(n ? n : 1));
    if (!types) return NULL;
    mix_state m = {0};
    int n_ffn_down = 0;
    for (int64_t i = 0; i < n; i++) {
        const gguf_tensor *t = &ts[i];
        m.n_attn_v += is_attn_v_like(t->name);
        n_ffn_down += contains(t->name, "ffn_down");
        m.has_output |= gguf_str_eq(t->name, "output.weight");
    }
    mix_hparams(hp, &m);
    if (!m.n_layer) m.n_layer = n_ffn_down; /* no block_count: a dense model has one per layer */
    n_fallback[0] = n_fallback[1] = 0;
    for (int64_t k = 0; k < n; k++) {
        const int64_t i = order[k];
        const gguf_tensor *t = &ts[i];
        types[i] = t->type;
        if (!is_quantizable(t)) continue;
        kt_dtype want = r->mix ? mix_type(t, r, &m) : r->base;
        types[i] = fit_type(want, t->dims[0]);
        n_fallback[0] += is_kquant(want) && types[i] == kquant_fallback(want);
        n_fallback[1] += types[i] == KT_F16 && want != KT_F16;
    }
    return types;
}

/* ---- the types ---- */

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

bool quant_recipe_parse(const char *name, quant_recipe *r) {
    for (size_t i = 0; i < N_RECIPES; i++)
        if (strcasecmp(name, RECIPES[i].name) == 0) {
            *r = (quant_recipe){RECIPES[i].base, RECIPES[i].mix, RECIPES[i].ftype};
            return true;
        }
    int t = cli_parse_out_type(name);
    if (t < 0) return false;
    *r = (quant_recipe){(kt_dtype)t, false, cli_llama_ftype((kt_dtype)t)};
    return true;
}

bool quant_recipe_is_mix(const char *name) {
    for (size_t i = 0; i < N_RECIPES; i++)
        if (strcasecmp(name, RECIPES[i].name) == 0) return RECIPES[i].mix;
    return false;
}
