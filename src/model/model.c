/*
 * model.c - hyper-parameters and weights of a llama-family model from GGUF.
 *
 * Everything the forward pass relies on is checked here, once: each weight
 * exists, has exactly the shape the hyper-parameters imply, and has a type
 * the matmul kernels support; norms and biases are F32 vectors. After
 * llm_model_load succeeds the forward pass does no validation at all.
 */
#include "model/model.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "ops/matmul.h"
#include "ops/repack.h"

/* ---- hyper-parameters ---- */

/* Reads "<arch>.<suffix>" as an int in [lo, hi]; absent -> def (or error
 * when def < 0, meaning required). */
static kt_status read_int(const gguf_file *f, const char *arch, const char *suffix,
                          int64_t def, int64_t lo, int64_t hi, int *out, kt_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int64_t i = gguf_find_key(f, key), v = def;
    if (i < 0) {
        if (def < 0) return kt_error_set(err, KT_ERR_FORMAT, "missing metadata key '%s'", key);
    } else if (!gguf_kv_get_i64(f, i, &v)) {
        return kt_error_set(err, KT_ERR_FORMAT, "metadata key '%s' is a %s, expected an integer",
                            key, gguf_type_name(gguf_kv_type(f, i)));
    }
    if (v < lo || v > hi)
        return kt_error_set(err, KT_ERR_FORMAT, "metadata key '%s' = %lld is out of range [%lld, %lld]",
                            key, (long long)v, (long long)lo, (long long)hi);
    *out = (int)v;
    return KT_OK;
}

static kt_status read_float(const gguf_file *f, const char *arch, const char *suffix,
                            double def, double lo, double hi, float *out, kt_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int64_t i = gguf_find_key(f, key);
    double v = def;
    if (i >= 0 && !gguf_kv_get_f64(f, i, &v))
        return kt_error_set(err, KT_ERR_FORMAT, "metadata key '%s' is a %s, expected a float",
                            key, gguf_type_name(gguf_kv_type(f, i)));
    if (!(v >= lo && v <= hi))
        return kt_error_set(err, KT_ERR_FORMAT, "metadata key '%s' = %g is out of range [%g, %g]",
                            key, v, lo, hi);
    *out = (float)v;
    return KT_OK;
}

/* rope.scaling.*, as llama.cpp reads them (see kt_rope_scaling): "linear"
 * (or the older rope.scale_linear) divides every angle by the factor;
 * "yarn" interpolates the slow pairs, keeps the fast ones, ramps between
 * (YaRN's beta_fast 32, beta_slow 1 over original_context_length) and
 * scales cos / sin by 1 + 0.1 ln factor. Anything else is refused: a
 * scaling read wrong gives wrong logits, silently. */
static kt_status read_rope_scaling(const gguf_file *f, llm_config *c, kt_error *err) {
    const char *a = c->arch;
    char key[160], type[32] = "";
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    if (gguf_find_key(f, key) >= 0 && !gguf_get_str(f, key, type, sizeof type))
        return kt_error_set(err, KT_ERR_FORMAT, "metadata key '%s' is not a short string", key);
    float factor = 1, linear = 0, attn_factor = 1, beta_fast = 32, beta_slow = 1, ext = 1;
    int n_ctx_orig = 0;
    kt_status st;
    if ((st = read_float(f, a, "rope.scale_linear", 0, 0, 1e6, &linear, err)) ||
        (st = read_float(f, a, "rope.scaling.factor", 1, 0, 1e6, &factor, err)) ||
        (st = read_float(f, a, "rope.scaling.attn_factor", 1, 0, 1e3, &attn_factor, err)) ||
        (st = read_float(f, a, "rope.scaling.yarn_beta_fast", 32, 0, 1e6, &beta_fast, err)) ||
        (st = read_float(f, a, "rope.scaling.yarn_beta_slow", 1, 0, 1e6, &beta_slow, err)) ||
        (st = read_float(f, a, "rope.scaling.yarn_ext_factor", 1, 0, 1e3, &ext, err)) ||
        (st = read_int(f, a, "rope.scaling.original_context_length", c->n_ctx_train, 1, 1 << 24, &n_ctx_orig, err)))
        return st;
    /* llama.cpp's gpt-oss reads none of the YaRN keys (its converter
     * writes beta_fast / beta_slow): its defaults whatever the file says */
    if (c->moe_oai) beta_fast = 32, beta_slow = 1, ext = 1;
    snprintf(key, sizeof key, "%s.rope.scaling.yarn_log_multiplier", a);
    if (gguf_find_key(f, key) >= 0)
        return kt_error_set(err, KT_ERR_UNSUPPORTED, "'%s' (DeepSeek's YaRN magnitude) is not supported yet", key);
    if (!type[0] && linear > 0) strcpy(type, "linear"), factor = linear;
    if (factor <= 0) factor = 1;
    kt_rope_scaling *r = &c->rope_scaling;
    /* llama.cpp multiplies cos / sin by attn_factor whatever the type
     * (llama_context: yarn_attn_factor *= rope_attn_factor) */
    *r = (kt_rope_scaling){.freq_scale = 1, .mscale = attn_factor};
    c->n_ctx_orig = n_ctx_orig;
    c->rope_scaled = attn_factor != 1;
    /* "longrope": Phi-3's factors (bind_rope_factors checks they are there) */
    c->longrope_named = !strcmp(type, "longrope");
    if (!type[0] || !strcmp(type, "none") || c->longrope_named) return KT_OK;
    if (!strcmp(type, "linear")) {
        r->freq_scale = 1 / factor;
    } else if (!strcmp(type, "yarn")) {
        r->freq_scale = 1 / factor;
        r->ext_factor = ext;
        r->mscale = attn_factor * (1.0f + 0.1f * logf(1.0f / r->freq_scale));
        kt_rope_yarn_corr(c->rope_dim, n_ctx_orig, c->rope_freq_base, beta_fast, beta_slow, &r->corr_lo, &r->corr_hi);
    } else {
        return kt_error_set(err, KT_ERR_UNSUPPORTED,
                            "rope scaling '%s' (%s.rope.scaling.type) is not supported (kettle implements linear, "
                            "yarn, Llama 3.1's rope_freqs and Phi-3's rope_factors_long / _short)", type, a);
    }
    c->rope_scaled = true;
    return KT_OK;
}

/* A mixture of experts, as llama.cpp runs llama (Mixtral) and qwen3moe
 * files: softmax over every expert's router logit, the top
 * expert_used_count, their weights renormalized to sum 1. Anything that
 * asks for other routing is refused, not run the wrong way. */
static kt_status read_experts(const gguf_file *f, llm_config *c, kt_error *err) {
    const char *a = c->arch;
    kt_status st;
    int gating = 1, shared = 0;
    if ((st = read_int(f, a, "expert_count", 0, 0, 4096, &c->n_expert, err))) return st;
    if (!c->n_expert) {
        if (!strcmp(a, "qwen3moe") || !strcmp(a, "qwen3vlmoe"))
            return kt_error_set(err, KT_ERR_FORMAT, "missing metadata key '%s.expert_count'", a);
        return KT_OK;
    }
    if ((st = read_int(f, a, "expert_used_count", -1, 1, c->n_expert, &c->n_expert_used, err)) ||
        /* gpt-oss: required (llama.cpp reads no other width for its experts) */
        (st = read_int(f, a, "expert_feed_forward_length", c->n_ff && !c->moe_oai ? c->n_ff : -1, 1, 1 << 20,
                       &c->n_ff_exp, err)))
        return st;
    if ((st = read_int(f, a, "expert_gating_func", 1, 0, 16, &gating, err)) ||
        (st = read_int(f, a, "expert_shared_count", 0, 0, 4096, &shared, err)))
        return st;
    if (c->moe_oai) gating = 1; /* llama.cpp's gpt-oss reads no gating key: SOFTMAX_WEIGHT (moe_oai) always */
    if (gating != 1)
        return kt_error_set(err, KT_ERR_UNSUPPORTED, "%s.expert_gating_func %d: kettle routes experts by softmax (1) only",
                            a, gating);
    if (c->hybrid) { /* qwen35moe: one shared expert, gated (llama.cpp requires it) */
        if ((st = read_int(f, a, "expert_shared_feed_forward_length", -1, 1, 1 << 20, &c->n_ff_shexp, err))) return st;
        shared = 0;
    }
    if (shared)
        return kt_error_set(err, KT_ERR_UNSUPPORTED, "%s.expert_shared_count %d: shared experts are not supported yet", a,
                            shared);
    char key[128];
    snprintf(key, sizeof key, "%s.expert_weights_scale", a);
    if (gguf_find_key(f, key) >= 0) return kt_error_set(err, KT_ERR_UNSUPPORTED, "'%s' is not supported yet", key);
    return KT_OK;
}

/* Which layers attend through the window, as llama.cpp's
 * load_swa_pattern: attention.sliding_window_pattern as an array of a
 * boolean per layer, or as a period (every layer but each period-th;
 * 0: every layer), else the architecture's period. */
static kt_status read_swa_pattern(const gguf_file *f, llm_config *c, int period, kt_error *err) {
    const char *a = c->arch;
    c->swa_period = period;
    char key[128];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", a);
    const int64_t i = gguf_find_key(f, key);
    if (i >= 0 && gguf_kv_type(f, i) == GGUF_ARRAY) {
        if (gguf_kv_arr_type(f, i) != GGUF_BOOL || gguf_kv_arr_n(f, i) != (uint64_t)c->n_layer)
            return kt_error_set(err, KT_ERR_FORMAT, "metadata key '%s' is not an array of %d booleans", key, c->n_layer);
        c->swa_flags = gguf_kv_arr_data(f, i);
        return KT_OK;
    }
    return i >= 0 ? read_int(f, a, "attention.sliding_window_pattern", 0, 0, 4096, &c->swa_period, err) : KT_OK;
}

/* Gemma 2 and 3 as llama.cpp runs them (src/models/gemma2.cpp,
 * gemma3.cpp): the embedding times sqrt(n_embd); Q scaled by
 * 1/sqrt(n_embd / n_head) instead of 1/sqrt(head_dim) at the 27B sizes
 * (gemma2 46 layers, gemma3 62, gemma_pytorch's query_pre_attn_scalar);
 * GeGLU; gemma2 caps attention scores (default 50) and logits (30),
 * gemma3 the logits only where the file says. Sliding-window layers:
 * gemma2 always (window 4096 unless the file says), gemma3 when
 * attention.sliding_window > 0; the period of the pattern is 2 (gemma2:
 * even layers local) or 6 (gemma3: 5 local, 1 global) unless
 * attention.sliding_window_pattern says otherwise. Local layers turn rope
 * by rope.freq_base_swa (gemma2: rope.freq_base; gemma3: 10000). */
static kt_status read_gemma(const gguf_file *f, llm_config *c, kt_error *err) {
    const char *a = c->arch;
    const bool g2 = !strcmp(a, "gemma2");
    kt_status st;
    c->embd_scale = sqrtf((float)c->n_embd);
    c->geglu = true;
    if ((g2 && c->n_layer == 46) || (!g2 && c->n_layer == 62))
        c->q_scale = sqrtf((float)c->head_dim) / sqrtf((float)(c->n_embd / c->n_head));
    if ((st = read_float(f, a, "attn_logit_softcapping", g2 ? 50 : 0, 0, 1e6, &c->attn_softcap, err)) ||
        (st = read_float(f, a, "final_logit_softcapping", g2 ? 30 : 0, 0, 1e6, &c->final_softcap, err)) ||
        (st = read_int(f, a, "attention.sliding_window", g2 ? 4096 : 0, 0, 1 << 24, &c->n_swa, err)) ||
        (st = read_float(f, a, "rope.freq_base_swa", g2 ? c->rope_freq_base : 10000.0, 1.0, 1e12,
                         &c->rope_freq_base_swa, err)))
        return st;
    c->swa_rope_plain = !g2; /* llama.cpp: gemma3's local layers keep rope unscaled (freq scale 1) */
    if (!g2 && c->attn_softcap > 0)
        return kt_error_set(err, KT_ERR_FORMAT, "gemma3.attn_logit_softcapping: Gemma 3 has no attention soft-cap");
    return read_swa_pattern(f, c, g2 ? 2 : 6, err);
}

/* gpt-oss as llama.cpp reads it (src/models/openai-moe.cpp): the window
 * attention.sliding_window (required), on the layers load_swa_pattern(2)
 * picks (even layers, unless attention.sliding_window_pattern says
 * otherwise), rope.freq_base_swa for them (optional: rope.freq_base),
 * the same rope scaling on every layer; experts sized by
 * expert_feed_forward_length and routed by SOFTMAX_WEIGHT whatever
 * expert_gating_func says (llama.cpp hard-codes it). */
static kt_status read_gpt_oss(const gguf_file *f, llm_config *c, kt_error *err) {
    const char *a = c->arch;
    kt_status st;
    if ((st = read_int(f, a, "attention.sliding_window", -1, 1, 1 << 24, &c->n_swa, err)) ||
        (st = read_float(f, a, "rope.freq_base_swa", c->rope_freq_base, 1.0, 1e12, &c->rope_freq_base_swa, err)))
        return st;
    if (gguf_find_key(f, "gpt-oss.expert_count") < 0)
        return kt_error_set(err, KT_ERR_FORMAT, "missing metadata key 'gpt-oss.expert_count'");
    c->moe_oai = true;
    return read_swa_pattern(f, c, 2, err);
}

/* Whether layer il attends through a sliding window: llama.cpp's
 * set_swa_pattern (period n: every layer but each n-th; 0: every layer). */
static bool layer_is_swa(const llm_config *c, int il) {
    if (c->n_swa <= 0) return false;
    if (c->swa_flags) return c->swa_flags[il] != 0;
    return c->swa_period == 0 || il % c->swa_period < c->swa_period - 1;
}

/* M-RoPE's sections (rope.dimension_sections: how many rotated pairs take
 * the temporal, height, width and extra position components), for the
 * Qwen-VL text models (qwen2vl, qwen3vl, qwen3vlmoe: required) and Qwen
 * 3.5 (optional; text alone reduces to plain rope). qwen2vl takes the
 * sections one after another (ggml's MROPE), Qwen 3.5 and Qwen3-VL
 * interleave them (IMROPE; llama_model_rope_type). */
static kt_status read_rope_sections(const gguf_file *f, llm_config *c, bool required, kt_error *err) {
    const char *a = c->arch;
    char key[128];
    snprintf(key, sizeof key, "%s.rope.dimension_sections", a);
    c->rope_sections_interleaved = !strncmp(a, "qwen35", 6) || !strncmp(a, "qwen3vl", 7);
    int64_t i = gguf_find_key(f, key);
    if (i < 0)
        return required ? kt_error_set(err, KT_ERR_FORMAT, "missing metadata key '%s' (M-RoPE sections)", key) : KT_OK;
    const uint64_t n = gguf_kv_type(f, i) == GGUF_ARRAY ? gguf_kv_arr_n(f, i) : 0;
    if (n < 1 || n > 4 || (gguf_kv_arr_type(f, i) != GGUF_I32 && gguf_kv_arr_type(f, i) != GGUF_U32))
        return kt_error_set(err, KT_ERR_FORMAT, "metadata key '%s' is not an array of up to 4 integers", key);
    const uint8_t *data = gguf_kv_arr_data(f, i); /* not aligned in the file */
    /* (sections may cover more pairs than rope turns: ggml takes a
     * pair's sector modulo their sum all the same) */
    int sum = 0;
    for (uint64_t j = 0; j < n; j++) {
        int32_t v;
        memcpy(&v, data + 4 * j, 4);
        if (v < 0 || v > 4096)
            return kt_error_set(err, KT_ERR_FORMAT, "metadata key '%s' has section %d = %d", key, (int)j, (int)v);
        c->rope_sections[j] = v, sum += v;
    }
    if (sum == 0) return kt_error_set(err, KT_ERR_FORMAT, "metadata key '%s' has no non-zero section", key);
    return KT_OK;
}

/* Qwen3-VL's text models as llama.cpp reads them (qwen3vl.cpp,
 * qwen3vlmoe.cpp): rope.dimension_sections required (interleaved),
 * n_deepstack_layers optional (0). DeepStack adds after layers [0, n), so
 * n must leave the last layer out (its rows are cut to the outputs). */
static kt_status read_qwen3vl(const gguf_file *f, llm_config *c, kt_error *err) {
    kt_status st;
    if ((st = read_rope_sections(f, c, true, err)) ||
        (st = read_int(f, c->arch, "n_deepstack_layers", 0, 0, 64, &c->n_deepstack, err)))
        return st;
    if (c->n_deepstack >= c->n_layer)
        return kt_error_set(err, KT_ERR_UNSUPPORTED, "%s.n_deepstack_layers %d: kettle adds DeepStack rows after "
                            "layers before the last (the model has %d)", c->arch, c->n_deepstack, c->n_layer);
    return KT_OK;
}

/* Qwen 3.5's hybrid layers as llama.cpp reads them (qwen35.cpp,
 * llama-model.cpp): ssm.conv_kernel, ssm.state_size (the key head size),
 * ssm.group_count (key heads), ssm.time_step_rank (value heads),
 * ssm.inner_size (value heads x value head size); which layers are
 * recurrent from attention.recurrent_layers, else every layer but each
 * full_attention_interval-th; rope.dimension_sections for M-RoPE;
 * nextn_predict_layers (MTP) at the end of block_count are not run. */
static kt_status read_hybrid(const gguf_file *f, llm_config *c, const uint8_t **flags, int *interval, kt_error *err) {
    const char *a = c->arch;
    kt_status st;
    int inner, nextn;
    c->hybrid = true;
    if ((st = read_int(f, a, "ssm.conv_kernel", -1, 2, 64, &c->ssm_conv_kernel, err)) ||
        (st = read_int(f, a, "ssm.state_size", -1, 1, 4096, &c->ssm_d_k, err)) ||
        (st = read_int(f, a, "ssm.group_count", -1, 1, 4096, &c->ssm_n_k_heads, err)) ||
        (st = read_int(f, a, "ssm.time_step_rank", -1, 1, 4096, &c->ssm_n_v_heads, err)) ||
        (st = read_int(f, a, "ssm.inner_size", -1, 1, 1 << 20, &inner, err)) ||
        (st = read_int(f, a, "nextn_predict_layers", 0, 0, c->n_layer - 1, &nextn, err)))
        return st;
    if (inner % c->ssm_n_v_heads || c->ssm_n_v_heads % c->ssm_n_k_heads)
        return kt_error_set(err, KT_ERR_FORMAT, "%s.ssm.inner_size %d / ssm.time_step_rank %d / ssm.group_count %d: the "
                            "value heads must divide the inner size and be a multiple of the key heads", a, inner,
                            c->ssm_n_v_heads, c->ssm_n_k_heads);
    c->ssm_d_v = inner / c->ssm_n_v_heads;
    if (c->ssm_d_v > 1024)
        return kt_error_set(err, KT_ERR_UNSUPPORTED, "%s.ssm.inner_size %d / ssm.time_step_rank %d: a value head of %d "
                            "(kettle's DeltaNet takes up to 1024)", a, inner, c->ssm_n_v_heads, c->ssm_d_v);
    c->ssm_conv_dim = 2 * c->ssm_n_k_heads * c->ssm_d_k + inner;
    c->n_layer -= nextn; /* the MTP layers: not in the trunk; bound apart (bind_mtp) */
    c->n_nextn = nextn;
    char key[128];
    snprintf(key, sizeof key, "%s.attention.recurrent_layers", a);
    int64_t i = gguf_find_key(f, key);
    *flags = NULL, *interval = 0;
    if (i >= 0) {
        if (gguf_kv_type(f, i) != GGUF_ARRAY || gguf_kv_arr_type(f, i) != GGUF_BOOL ||
            gguf_kv_arr_n(f, i) < (uint64_t)c->n_layer)
            return kt_error_set(err, KT_ERR_FORMAT, "metadata key '%s' is not an array of %d booleans", key, c->n_layer);
        *flags = gguf_kv_arr_data(f, i);
    } else {
        snprintf(key, sizeof key, "%s.full_attention_interval", a);
        if (gguf_find_key(f, key) < 0)
            return kt_error_set(err, KT_ERR_FORMAT, "missing metadata key '%s.attention.recurrent_layers' (or '%s'): "
                                "which layers are recurrent", a, key);
        if ((st = read_int(f, a, "full_attention_interval", -1, 1, 4096, interval, err))) return st;
    }
    if ((st = read_rope_sections(f, c, false, err))) return st;
    int n_rec = 0;
    for (int il = 0; il < c->n_layer; il++)
        n_rec += *flags ? (*flags)[il] != 0 : (il + 1) % *interval != 0;
    c->n_recurrent = n_rec;
    return KT_OK;
}

size_t llm_state_layer_floats(const llm_config *c) {
    return (size_t)(c->ssm_conv_kernel - 1) * (size_t)c->ssm_conv_dim +
           (size_t)c->ssm_n_v_heads * (size_t)c->ssm_d_k * (size_t)c->ssm_d_v;
}

size_t llm_state_bytes(const llm_model *m) {
    if (!m->cfg.hybrid) return 0;
    return llm_state_layer_floats(&m->cfg) * (size_t)m->cfg.n_recurrent * sizeof(float);
}

static kt_status read_config(const gguf_file *f, llm_config *c, kt_error *err) {
    memset(c, 0, sizeof *c);
    if (!gguf_get_str(f, "general.architecture", c->arch, sizeof c->arch))
        return kt_error_set(err, KT_ERR_FORMAT, "missing metadata key 'general.architecture'");
    const char *a = c->arch;
    static const char *const ARCHS[] = {"llama",      "mistral", "qwen2",  "qwen2vl", "qwen3",  "qwen3moe",  "qwen3vl",
                                        "qwen3vlmoe", "phi3",    "gemma2", "gemma3",  "qwen35", "qwen35moe", "gpt-oss"};
    bool known = false;
    for (size_t i = 0; i < sizeof ARCHS / sizeof ARCHS[0]; i++) known |= !strcmp(a, ARCHS[i]);
    if (!known)
        return kt_error_set(err, KT_ERR_UNSUPPORTED,
                            "architecture '%s' is not supported (kettle runs llama, mistral, qwen2, qwen2vl, qwen3, "
                            "qwen3moe, qwen3vl, qwen3vlmoe, phi3, gemma2, gemma3, qwen35, qwen35moe, gpt-oss)", a);
    const int64_t big = 1 << 20;
    /* qwen35moe has no dense FFN: llama.cpp's converter writes
     * feed_forward_length only when the HF config has intermediate_size,
     * and Qwen 3.5's MoE configs have none (llama.cpp reads it as optional) */
    const bool no_dense_ffn = !strcmp(a, "qwen35moe") || !strcmp(a, "gpt-oss"); /* gpt-oss: llama.cpp reads only
                                                                                  expert_feed_forward_length */
    kt_status st;
    if ((st = read_int(f, a, "embedding_length", -1, 1, big, &c->n_embd, err)) ||
        (st = read_int(f, a, "block_count", -1, 1, 4096, &c->n_layer, err)) ||
        (st = read_int(f, a, "attention.head_count", -1, 1, 4096, &c->n_head, err)) ||
        (st = read_int(f, a, "attention.head_count_kv", c->n_head, 1, c->n_head, &c->n_head_kv, err)) ||
        (st = read_int(f, a, "feed_forward_length", no_dense_ffn ? 0 : -1, no_dense_ffn ? 0 : 1, big, &c->n_ff, err)) ||
        (st = read_int(f, a, "context_length", 2048, 1, 1 << 24, &c->n_ctx_train, err)) ||
        (st = read_int(f, a, "pooling_type", 0, 0, 4, &c->pooling_type, err)))
        return st;
    if (c->n_head % c->n_head_kv)
        return kt_error_set(err, KT_ERR_FORMAT, "head_count %d is not a multiple of head_count_kv %d",
                            c->n_head, c->n_head_kv);
    int def_head_dim = c->n_embd % c->n_head ? -1 : c->n_embd / c->n_head;
    if ((st = read_int(f, a, "attention.key_length", def_head_dim, 2, 1024, &c->head_dim, err)))
        return st;
    int value_dim;
    if ((st = read_int(f, a, "attention.value_length", c->head_dim, 2, 1024, &value_dim, err)))
        return st;
    if (value_dim != c->head_dim || c->head_dim % 2)
        return kt_error_set(err, KT_ERR_UNSUPPORTED, "head size %d / value size %d: kettle needs equal, even sizes",
                            c->head_dim, value_dim);
    if ((st = read_int(f, a, "rope.dimension_count", c->head_dim, 2, c->head_dim, &c->rope_dim, err)))
        return st;
    if (c->rope_dim % 2)
        return kt_error_set(err, KT_ERR_FORMAT, "rope.dimension_count %d is odd", c->rope_dim);
    if ((st = read_float(f, a, "rope.freq_base", 10000.0, 1.0, 1e12, &c->rope_freq_base, err)) ||
        (st = read_float(f, a, "attention.layer_norm_rms_epsilon", 1e-5, 0.0, 1.0, &c->rms_eps, err)))
        return st;
    c->rope_style = strcmp(a, "llama") && strcmp(a, "mistral") ? KT_ROPE_NEOX : KT_ROPE_ADJACENT;
    c->embd_scale = 1, c->q_scale = 1;
    c->rope_freq_base_swa = c->rope_freq_base;
    if (!strncmp(a, "gemma", 5) && (st = read_gemma(f, c, err))) return st;
    if (!strncmp(a, "qwen35", 6)) {
        if ((st = read_hybrid(f, c, &c->recurrent_flags, &c->full_attn_interval, err))) return st;
        if (!strcmp(a, "qwen35moe") && gguf_find_key(f, "qwen35moe.expert_count") < 0)
            return kt_error_set(err, KT_ERR_FORMAT, "missing metadata key 'qwen35moe.expert_count'");
    }
    if (!strcmp(a, "qwen2vl") && (st = read_rope_sections(f, c, true, err))) return st;
    if (!strncmp(a, "qwen3vl", 7) && (st = read_qwen3vl(f, c, err))) return st;
    if (!strcmp(a, "gpt-oss") && (st = read_gpt_oss(f, c, err))) return st;
    if ((st = read_experts(f, c, err))) return st;
    return read_rope_scaling(f, c, err);
}

/* ---- weights ---- */

/* Binds tensor `name` and checks it is [n_in, n_out] (n_out 0: a vector of
 * n_in) of a type the kernels read; a missing optional tensor leaves
 * t->data NULL. */
static kt_status bind(const gguf_file *f, const char *name, int n_in, int n_out, bool optional,
                      llm_tensor *t, kt_error *err) {
    memset(t, 0, sizeof *t);
    const gguf_tensor *g = gguf_tensor_find(f, name);
    if (!g) {
        if (optional) return KT_OK;
        return kt_error_set(err, KT_ERR_FORMAT, "missing tensor '%s'", name);
    }
    bool vector = n_out == 0;
    int want_dims = vector ? 1 : 2;
    bool shape_ok = g->dims[0] == n_in && (vector ? g->n_dims == 1 : g->n_dims == 2 && g->dims[1] == n_out);
    if (!shape_ok)
        return kt_error_set(err, KT_ERR_FORMAT,
                            "tensor '%s' has shape [%lld, %lld] (%u dims), expected [%d, %d] (%d dims)",
                            name, (long long)g->dims[0], (long long)g->dims[1], g->n_dims, n_in,
                            vector ? 1 : n_out, want_dims);
    if (vector ? g->type != KT_F32 : !kt_matmul_supported(g->type))
        return kt_error_set(err, KT_ERR_UNSUPPORTED, "tensor '%s' has type %s, which kettle cannot %s yet",
                            name, kt_dtype_name(g->type), vector ? "use for a norm or bias (needs F32)" : "multiply");
    t->data = g->data;
    t->type = g->type;
    t->n_in = n_in;
    t->n_out = vector ? 1 : n_out;
    return KT_OK;
}

/* Tensor `name` of per-pair rope factors (n_pairs F32 values, each > 0),
 * or NULL where the file has none. */
static kt_status bind_factors(const gguf_file *f, const char *name, int n_pairs, const float **out, kt_error *err) {
    llm_tensor t;
    kt_status st = bind(f, name, n_pairs, 0, true, &t, err);
    if (st) return st;
    *out = t.data;
    for (int i = 0; t.data && i < n_pairs; i++)
        if (!((*out)[i] > 0 && (*out)[i] < 1e6f))
            return kt_error_set(err, KT_ERR_FORMAT, "tensor '%s' has factor %d = %g (not > 0)", name, i,
                                (double)(*out)[i]);
    return KT_OK;
}

/* Per-pair rope factors, which divide pair i's angle (ggml_rope_ext's
 * freq_factors): Llama 3.1's rope_freqs (the tensor's presence is the
 * signal: its converter writes no rope.scaling key for them), or Phi-3's
 * LongRoPE pair, rope_factors_long for contexts beyond
 * rope.scaling.original_context_length and rope_factors_short within it
 * (llama_model::get_rope_factors; chosen per context in llm_work_new),
 * with cos / sin times rope.scaling.attn_factor (read with the scaling). */
static kt_status bind_rope_factors(const gguf_file *f, llm_config *c, kt_error *err) {
    const int n_pairs = kt_rope_pairs(c->head_dim, c->rope_dim);
    const float *freqs, *lng, *sht;
    kt_status st;
    if ((st = bind_factors(f, "rope_freqs.weight", n_pairs, &freqs, err)) ||
        (st = bind_factors(f, "rope_factors_long.weight", n_pairs, &lng, err)) ||
        (st = bind_factors(f, "rope_factors_short.weight", n_pairs, &sht, err)))
        return st;
    if (c->longrope_named && !lng)
        return kt_error_set(err, KT_ERR_FORMAT,
                            "rope scaling 'longrope' (%s.rope.scaling.type) needs the tensors rope_factors_long.weight "
                            "and rope_factors_short.weight, which the file lacks", c->arch);
    if (!lng != !sht)
        return kt_error_set(err, KT_ERR_FORMAT, "the file has rope_factors_%s.weight but not rope_factors_%s.weight",
                            lng ? "long" : "short", lng ? "short" : "long");
    const bool scaled = c->rope_scaling.freq_scale != 1 || c->rope_scaling.ext_factor != 0;
    if ((freqs && lng) || ((freqs || lng) && scaled))
        return kt_error_set(err, KT_ERR_UNSUPPORTED,
                            "the file combines rope scalings (rope_freqs, rope_factors_long / _short, "
                            "rope.scaling.type): kettle applies one at a time");
    c->rope_factors_long = lng, c->rope_factors_short = sht;
    c->rope_scaling.factors = freqs ? freqs : sht;
    c->rope_scaled |= freqs || sht;
    return KT_OK;
}

/* Rows [r0, r0 + n) of t, as a matrix of its own (rows are contiguous
 * in every type, so this is a pointer into the same bytes). */
static llm_tensor rows_of(const llm_tensor *t, int r0, int n) {
    llm_tensor v = *t;
    v.data = (const char *)t->data + kt_dtype_row_bytes(t->type, t->n_in) * (size_t)r0;
    v.n_out = n;
    return v;
}

/* Phi-3's fused matrices as llama.cpp splits them: attn_qkv's rows are
 * Q | K | V, ffn_up's are gate | up (SwiGLU takes silu of the first half). */
static kt_status split_fused(const gguf_file *f, const llm_config *c, int il, llm_layer *l, kt_error *err) {
    const int q_dim = c->n_head * c->head_dim, kv_dim = c->n_head_kv * c->head_dim;
    char name[96];
    snprintf(name, sizeof name, "blk.%d.attn_qkv.weight", il);
    llm_tensor qkv;
    kt_status st = bind(f, name, c->n_embd, q_dim + 2 * kv_dim, !!l->wq.data, &qkv, err);
    if (st) return st;
    if (qkv.data) l->wq = rows_of(&qkv, 0, q_dim), l->wk = rows_of(&qkv, q_dim, kv_dim),
                  l->wv = rows_of(&qkv, q_dim + kv_dim, kv_dim);
    if (!l->w_gate.data) {
        const llm_tensor up = l->w_up;
        l->w_gate = rows_of(&up, 0, c->n_ff), l->w_up = rows_of(&up, c->n_ff, c->n_ff);
    }
    return KT_OK;
}

/* The layer's router and its experts: each merged ffn_*_exps tensor is
 * [n_in, n_out, n_expert], expert e's matrix the e-th [n_in, n_out] slab. */
static kt_status bind_experts(const gguf_file *f, const llm_config *c, int il, llm_layer *l, kt_error *err) {
    char name[96];
    snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.weight", il);
    kt_status st = bind(f, name, c->n_embd, c->n_expert, false, &l->router, err);
    if (st) return st;
    if (!(l->experts = calloc((size_t)c->n_expert * 3, sizeof *l->experts)))
        return kt_error_set(err, KT_ERR_NOMEM, "out of memory loading the model");
    static const char *const parts[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    for (int p = 0; p < 3; p++) {
        const int n_in = p == 2 ? c->n_ff_exp : c->n_embd, n_out = p == 2 ? c->n_embd : c->n_ff_exp;
        snprintf(name, sizeof name, "blk.%d.%s.weight", il, parts[p]);
        const gguf_tensor *g = gguf_tensor_find(f, name);
        if (!g) return kt_error_set(err, KT_ERR_FORMAT, "missing tensor '%s' (kettle reads merged expert tensors)", name);
        if (g->n_dims != 3 || g->dims[0] != n_in || g->dims[1] != n_out || g->dims[2] != c->n_expert)
            return kt_error_set(err, KT_ERR_FORMAT,
                                "tensor '%s' has shape [%lld, %lld, %lld] (%u dims), expected [%d, %d, %d]", name,
                                (long long)g->dims[0], (long long)g->dims[1], (long long)g->dims[2], g->n_dims, n_in,
                                n_out, c->n_expert);
        if (!kt_matmul_supported(g->type))
            return kt_error_set(err, KT_ERR_UNSUPPORTED, "tensor '%s' has type %s, which kettle cannot multiply yet",
                                name, kt_dtype_name(g->type));
        const size_t slab = kt_dtype_row_bytes(g->type, n_in) * (size_t)n_out;
        for (int e = 0; e < c->n_expert; e++)
            l->experts[3 * e + p] = (llm_tensor){.data = (const char *)g->data + slab * (size_t)e, .type = g->type,
                                                 .n_in = n_in, .n_out = n_out};
    }
    return KT_OK;
}

/* Binds the table of tensors of layer il (name, shape, optional), as
 * bind does each. */
typedef struct tensor_spec {
    const char *name;
    int n_in, n_out;
    bool optional;
    llm_tensor *t;
} tensor_spec;

static kt_status bind_specs(const gguf_file *f, int il, const tensor_spec *specs, size_t n, kt_error *err) {
    for (size_t i = 0; i < n; i++) {
        char name[96];
        snprintf(name, sizeof name, "blk.%d.%s", il, specs[i].name);
        kt_status st = bind(f, name, specs[i].n_in, specs[i].n_out, specs[i].optional, specs[i].t, err);
        if (st) return st;
    }
    return KT_OK;
}

static bool layer_is_recurrent(const llm_config *c, int il) {
    return c->recurrent_flags ? c->recurrent_flags[il] != 0 : (il + 1) % c->full_attn_interval != 0;
}

static kt_status bind_experts(const gguf_file *f, const llm_config *c, int il, llm_layer *l, kt_error *err);

/* A layer of Qwen 3.5 (qwen35.cpp / qwen35moe.cpp): a Gated DeltaNet or a
 * gated attention mixer, post_attention_norm as the FFN's input norm, a
 * dense SwiGLU or experts with a gated shared expert. */
static kt_status bind_hybrid_layer(const gguf_file *f, const llm_config *c, int il, llm_layer *l, kt_error *err) {
    const int E = c->n_embd, q_dim = c->n_head * c->head_dim, kv_dim = c->n_head_kv * c->head_dim;
    const int Hv = c->ssm_n_v_heads, inner = Hv * c->ssm_d_v;
    const bool moe = c->n_expert > 0;
    l->recurrent = il < c->n_layer && layer_is_recurrent(c, il); /* an MTP block is full attention */
    l->attn_gated = !l->recurrent;
    kt_status st;
    const tensor_spec common[] = {
        {"attn_norm.weight", E, 0, false, &l->attn_norm},
        {"post_attention_norm.weight", E, 0, false, &l->ffn_norm},
        {"ffn_gate.weight", E, c->n_ff, moe, &l->w_gate},
        {"ffn_up.weight", E, c->n_ff, moe, &l->w_up},
        {"ffn_down.weight", c->n_ff, E, moe, &l->w_down},
    };
    if ((st = bind_specs(f, il, common, sizeof common / sizeof common[0], err))) return st;
    if (l->recurrent) {
        const tensor_spec rec[] = {
            {"attn_qkv.weight", E, c->ssm_conv_dim, false, &l->ssm_qkv},
            {"attn_gate.weight", E, inner, false, &l->ssm_z},
            {"ssm_conv1d.weight", c->ssm_conv_kernel, c->ssm_conv_dim, false, &l->ssm_conv},
            {"ssm_dt.bias", Hv, 0, false, &l->ssm_dt_bias},
            {"ssm_a", Hv, 0, false, &l->ssm_a},
            {"ssm_beta.weight", E, Hv, false, &l->ssm_beta},
            {"ssm_alpha.weight", E, Hv, false, &l->ssm_alpha},
            {"ssm_norm.weight", c->ssm_d_v, 0, false, &l->ssm_norm},
            {"ssm_out.weight", inner, E, false, &l->ssm_out},
        };
        if ((st = bind_specs(f, il, rec, sizeof rec / sizeof rec[0], err))) return st;
        if (l->ssm_conv.type != KT_F32)
            return kt_error_set(err, KT_ERR_UNSUPPORTED, "tensor 'blk.%d.ssm_conv1d.weight' has type %s (kettle needs F32)",
                                il, kt_dtype_name(l->ssm_conv.type));
    } else {
        const tensor_spec att[] = {
            {"attn_q.weight", E, 2 * q_dim, false, &l->wq}, /* per head: Q, then its gate */
            {"attn_k.weight", E, kv_dim, false, &l->wk},
            {"attn_v.weight", E, kv_dim, false, &l->wv},
            {"attn_output.weight", q_dim, E, false, &l->wo},
            {"attn_q_norm.weight", c->head_dim, 0, false, &l->q_norm},
            {"attn_k_norm.weight", c->head_dim, 0, false, &l->k_norm},
        };
        if ((st = bind_specs(f, il, att, sizeof att / sizeof att[0], err))) return st;
    }
    if (!moe) return KT_OK;
    if ((st = bind_experts(f, c, il, l, err))) return st;
    const tensor_spec sh[] = {
        {"ffn_gate_inp_shexp.weight", E, 0, false, &l->shexp_inp},
        {"ffn_gate_shexp.weight", E, c->n_ff_shexp, false, &l->shexp_gate},
        {"ffn_up_shexp.weight", E, c->n_ff_shexp, false, &l->shexp_up},
        {"ffn_down_shexp.weight", c->n_ff_shexp, E, false, &l->shexp_down},
    };
    return bind_specs(f, il, sh, sizeof sh / sizeof sh[0], err);
}

/* A matrix of per-expert F32 bias rows, [n, n_expert] (gpt-oss's
 * ffn_*_exps.bias). */
static kt_status bind_expert_bias(const gguf_file *f, const llm_config *c, int il, const char *part, int n,
                                  llm_tensor *t, kt_error *err) {
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s.bias", il, part);
    kt_status st = bind(f, name, n, c->n_expert, false, t, err);
    if (!st && t->type != KT_F32)
        return kt_error_set(err, KT_ERR_UNSUPPORTED, "tensor '%s' has type %s (kettle needs F32 biases)", name,
                            kt_dtype_name(t->type));
    return st;
}

/* A layer of gpt-oss (llama.cpp's openai-moe.cpp): biased Q, K, V and
 * output, a sink per head, post_attention_norm as the FFN's input norm,
 * the biased router and experts. Every tensor is required (llama.cpp
 * reads the Q/K/V biases as optional, but its converter always writes
 * them: a file without them is not gpt-oss as trained). */
static kt_status bind_gpt_oss_layer(const gguf_file *f, const llm_config *c, int il, llm_layer *l, kt_error *err) {
    const int E = c->n_embd, q_dim = c->n_head * c->head_dim, kv_dim = c->n_head_kv * c->head_dim;
    l->swa = layer_is_swa(c, il);
    const tensor_spec specs[] = {
        {"attn_norm.weight", E, 0, false, &l->attn_norm},
        {"attn_q.weight", E, q_dim, false, &l->wq},
        {"attn_k.weight", E, kv_dim, false, &l->wk},
        {"attn_v.weight", E, kv_dim, false, &l->wv},
        {"attn_output.weight", q_dim, E, false, &l->wo},
        {"attn_q.bias", q_dim, 0, false, &l->bq},
        {"attn_k.bias", kv_dim, 0, false, &l->bk},
        {"attn_v.bias", kv_dim, 0, false, &l->bv},
        {"attn_output.bias", E, 0, false, &l->bo},
        {"attn_sinks.weight", c->n_head, 0, false, &l->sinks},
        {"post_attention_norm.weight", E, 0, false, &l->ffn_norm},
        {"ffn_gate_inp.bias", c->n_expert, 0, false, &l->router_bias},
    };
    kt_status st;
    if ((st = bind_specs(f, il, specs, sizeof specs / sizeof specs[0], err)) ||
        (st = bind_experts(f, c, il, l, err)) ||
        (st = bind_expert_bias(f, c, il, "ffn_gate_exps", c->n_ff_exp, &l->exp_bias[0], err)) ||
        (st = bind_expert_bias(f, c, il, "ffn_up_exps", c->n_ff_exp, &l->exp_bias[1], err)) ||
        (st = bind_expert_bias(f, c, il, "ffn_down_exps", E, &l->exp_bias[2], err)))
        return st;
    return KT_OK;
}

/* Qwen 3.5's first MTP block, blk.{n_layer} (the tensors llama.cpp's
 * load_block_mtp reads; real files carry one: the HF configs'
 * mtp_num_hidden_layers is 1, and llama.cpp runs one). A file whose
 * nextn_predict_layers is 0, or that lacks the block's eh_proj (a
 * converter told to leave the MTP out), loads without it: cfg.n_mtp 0.
 * A block that is there is checked like any layer. Further MTP blocks
 * are left in the file, as llama.cpp leaves them. */
static kt_status bind_mtp(const gguf_file *f, llm_model *m, kt_error *err) {
    llm_config *c = &m->cfg;
    const int il = c->n_layer, E = c->n_embd;
    char name[96];
    snprintf(name, sizeof name, "blk.%d.nextn.eh_proj.weight", il);
    if (!c->n_nextn || !gguf_tensor_find(f, name)) return KT_OK;
    llm_layer *l = &m->layers[il];
    llm_mtp *t = &m->mtp;
    kt_status st = bind_hybrid_layer(f, c, il, l, err);
    if (st) return st;
    const tensor_spec nextn[] = {
        {"nextn.eh_proj.weight", 2 * E, E, false, &t->eh_proj},
        {"nextn.enorm.weight", E, 0, false, &t->enorm},
        {"nextn.hnorm.weight", E, 0, false, &t->hnorm},
        {"nextn.embed_tokens.weight", E, c->n_vocab, true, &t->embed_tokens},
        {"nextn.shared_head_head.weight", E, c->n_vocab, true, &t->head},
        {"nextn.shared_head_norm.weight", E, 0, true, &t->head_norm},
    };
    if ((st = bind_specs(f, il, nextn, sizeof nextn / sizeof nextn[0], err))) return st;
    if (!t->embed_tokens.data) t->embed_tokens = m->tok_embd;
    if (!t->head.data) t->head = m->output;
    if (!t->head_norm.data) t->head_norm = m->output_norm;
    l->kv_layer = c->n_kv_layer; /* a KV layer after the trunk's, in pools made for it */
    c->n_mtp = 1;
    return KT_OK;
}

static kt_status bind_layer(const gguf_file *f, const llm_config *c, int il, llm_layer *l,
                            kt_error *err) {
    if (c->hybrid) return bind_hybrid_layer(f, c, il, l, err);
    if (c->moe_oai) return bind_gpt_oss_layer(f, c, il, l, err);
    int q_dim = c->n_head * c->head_dim, kv_dim = c->n_head_kv * c->head_dim;
    bool biased = !strcmp(c->arch, "qwen2") || !strcmp(c->arch, "qwen2vl"),
         qk_normed = !strcmp(c->arch, "qwen3") || !strcmp(c->arch, "qwen3moe") || !strncmp(c->arch, "qwen3vl", 7) ||
                     !strcmp(c->arch, "gemma3");
    const bool post_normed = !strncmp(c->arch, "gemma", 5);
    const bool fused = strcmp(c->arch, "phi3") == 0; /* attn_qkv and ffn_up (gate | up), split below */
    const bool moe = c->n_expert > 0;               /* no dense FFN: experts, bound below */
    struct {
        const char *name;
        int n_in, n_out;
        bool optional;
        llm_tensor *t;
    } specs[] = {
        {"attn_norm.weight", c->n_embd, 0, false, &l->attn_norm},
        {"attn_q.weight", c->n_embd, q_dim, fused, &l->wq},
        {"attn_k.weight", c->n_embd, kv_dim, fused, &l->wk},
        {"attn_v.weight", c->n_embd, kv_dim, fused, &l->wv},
        {"attn_output.weight", q_dim, c->n_embd, false, &l->wo},
        {"attn_q.bias", q_dim, 0, !biased, &l->bq},
        {"attn_k.bias", kv_dim, 0, !biased, &l->bk},
        {"attn_v.bias", kv_dim, 0, !biased, &l->bv},
        {"attn_q_norm.weight", c->head_dim, 0, !qk_normed, &l->q_norm},
        {"attn_k_norm.weight", c->head_dim, 0, !qk_normed, &l->k_norm},
        {"ffn_norm.weight", c->n_embd, 0, false, &l->ffn_norm},
        {"ffn_gate.weight", c->n_embd, c->n_ff, fused || moe, &l->w_gate},
        {"ffn_up.weight", c->n_embd, fused ? 2 * c->n_ff : c->n_ff, moe, &l->w_up},
        {"ffn_down.weight", c->n_ff, c->n_embd, moe, &l->w_down},
        {"post_attention_norm.weight", c->n_embd, 0, !post_normed, &l->post_attn_norm},
        {"post_ffw_norm.weight", c->n_embd, 0, !post_normed, &l->post_ffn_norm},
    };
    l->swa = layer_is_swa(c, il);
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        char name[96];
        snprintf(name, sizeof name, "blk.%d.%s", il, specs[i].name);
        kt_status st = bind(f, name, specs[i].n_in, specs[i].n_out, specs[i].optional, specs[i].t, err);
        if (st) return st;
    }
    if (moe) return bind_experts(f, c, il, l, err);
    return fused ? split_fused(f, c, il, l, err) : KT_OK;
}

static kt_status bind_weights(const gguf_file *f, llm_model *m, kt_error *err) {
    llm_config *c = &m->cfg;
    const gguf_tensor *emb = gguf_tensor_find(f, "token_embd.weight");
    if (!emb) return kt_error_set(err, KT_ERR_FORMAT, "missing tensor 'token_embd.weight'");
    if (emb->n_dims != 2 || emb->dims[1] < 1 || emb->dims[1] > (1 << 24))
        return kt_error_set(err, KT_ERR_FORMAT, "tensor 'token_embd.weight' has a bad shape");
    c->n_vocab = (int)emb->dims[1];
    kt_status st;
    if ((st = bind(f, "token_embd.weight", c->n_embd, c->n_vocab, false, &m->tok_embd, err)) ||
        (st = bind(f, "output_norm.weight", c->n_embd, 0, false, &m->output_norm, err)) ||
        (st = bind(f, "output.weight", c->n_embd, c->n_vocab, true, &m->output, err)))
        return st;
    if (!m->output.data && c->moe_oai) /* llama.cpp requires it: gpt-oss is never tied */
        return kt_error_set(err, KT_ERR_FORMAT, "missing tensor 'output.weight' (gpt-oss's output matrix is not tied)");
    if (!m->output.data || !strcmp(c->arch, "gemma2")) m->output = m->tok_embd; /* tied (gemma2 always is) */
    if ((st = bind_rope_factors(f, c, err))) return st;
    c->n_kv_layer = 0;
    for (int il = 0, rec = 0; il < c->n_layer; il++) {
        if ((st = bind_layer(f, c, il, &m->layers[il], err))) return st;
        if (m->layers[il].recurrent) m->layers[il].rec_index = rec++;
        else m->layers[il].kv_layer = c->n_kv_layer++;
    }
    if (c->hybrid && (st = bind_mtp(f, m, err))) return st;
    uint64_t expert_bytes = 0;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        m->weight_bytes += t->n_bytes;
        m->n_params += (uint64_t)(t->dims[0] * t->dims[1] * t->dims[2] * t->dims[3]);
        if (t->n_dims == 3 && c->n_expert && t->dims[2] == c->n_expert) expert_bytes += t->n_bytes;
    }
    /* a decoded token reads its experts' slabs only, and one row of an
     * embedding table that is not also the output matrix */
    m->active_bytes = m->weight_bytes -
                      (c->n_expert ? expert_bytes / (uint64_t)c->n_expert * (uint64_t)(c->n_expert - c->n_expert_used) : 0);
    if (m->output.data != m->tok_embd.data) {
        const gguf_tensor *emb = gguf_tensor_find(f, "token_embd.weight");
        if (emb && emb->n_bytes > 0 && emb->dims[1] > 0) m->active_bytes -= emb->n_bytes - emb->n_bytes / (uint64_t)emb->dims[1];
    }
    return KT_OK;
}

llm_model *llm_model_load(const gguf_file *f, kt_error *err) {
    llm_model *m = calloc(1, sizeof *m);
    if (!m) {
        kt_error_set(err, KT_ERR_NOMEM, "out of memory loading the model");
        return NULL;
    }
    if (read_config(f, &m->cfg, err)) goto fail;
    /* + 1: room for an MTP block and its KV layer (bind_mtp) */
    m->layers = calloc((size_t)m->cfg.n_layer + 1, sizeof *m->layers);
    m->kv_windowed = calloc((size_t)m->cfg.n_layer + 1, 1);
    if (!m->layers || !m->kv_windowed) {
        kt_error_set(err, KT_ERR_NOMEM, "out of memory loading the model");
        goto fail;
    }
    if (bind_weights(f, m, err)) goto fail;
    for (int il = 0; il < m->cfg.n_layer; il++)
        if (!m->layers[il].recurrent) m->kv_windowed[m->layers[il].kv_layer] = m->layers[il].swa;
    return m;
fail:
    llm_model_free(m);
    return NULL;
}

/* Every matrix the forward pass multiplies by, n at most 15 per layer + 1:
 * the output matrix too when it is the embedding table (tied), whose
 * rows the lookup then reads back through kt_repack_row_f32. */
static int matmul_weights(llm_model *m, llm_tensor **out) {
    int n = 0;
    for (int il = 0; il < m->cfg.n_layer + m->cfg.n_mtp; il++) {
        llm_layer *l = &m->layers[il];
        llm_tensor *ts[] = {&l->wq, &l->wk, &l->wv, &l->wo, &l->w_gate, &l->w_up, &l->w_down,
                            &l->ssm_qkv, &l->ssm_z, &l->ssm_beta, &l->ssm_alpha, &l->ssm_out,
                            &l->shexp_gate, &l->shexp_up, &l->shexp_down};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) out[n++] = ts[i];
        for (int e = 0; l->experts && e < 3 * m->cfg.n_expert; e++) out[n++] = &l->experts[e];
    }
    out[n++] = &m->output;
    if (m->cfg.n_mtp) { /* the MTP head's matrices of its own (shared ones are the output, above) */
        out[n++] = &m->mtp.eh_proj;
        if (m->mtp.head.data != m->output.data) out[n++] = &m->mtp.head;
    }
    return n;
}

int llm_model_repack(llm_model *m, kt_progress_fn progress, void *user, kt_error *err) {
    llm_tensor **ts = malloc(sizeof *ts * ((size_t)(m->cfg.n_layer + m->cfg.n_mtp) * (15 + 3 * (size_t)m->cfg.n_expert) + 3));
    if (!ts) return kt_error_set(err, KT_ERR_NOMEM, "out of memory repacking the weights"), -1;
    const int n = matmul_weights(m, ts);
    size_t tmp_bytes = 0;
    for (int i = 0; i < n; i++)
        if (kt_repack_supported(ts[i]->type, ts[i]->n_in, ts[i]->n_out)) {
            size_t b = kt_repack_tmp_bytes(ts[i]->type, ts[i]->n_in);
            tmp_bytes = b > tmp_bytes ? b : tmp_bytes;
        }
    void *tmp = tmp_bytes ? malloc(tmp_bytes) : NULL;
    if (tmp_bytes && !tmp) {
        free(ts);
        return kt_error_set(err, KT_ERR_NOMEM, "out of memory repacking the weights"), -1;
    }
    int repacked = 0;
    for (int i = 0; i < n; i++) {
        llm_tensor *t = ts[i];
        if (!kt_repack_supported(t->type, t->n_in, t->n_out)) continue;
        /* the caller made the file's copy writable; the tensor is ours */
        kt_repack((void *)(uintptr_t)t->data, t->type, t->n_in, t->n_out, tmp);
        if (progress) progress(user, "repacking", (uint64_t)i + 1, (uint64_t)n);
        t->type = kt_repack_type(t->type, t->n_in, t->n_out);
        if (t->data == m->tok_embd.data) m->tok_embd.type = t->type; /* tied: one table */
        repacked++;
    }
    if (progress && n) progress(user, "repacking", (uint64_t)n, (uint64_t)n); /* the last ones may not repack */
    /* the MTP head's fallbacks are copies of the trunk's tensors: same data, now retyped */
    if (m->mtp.head.data == m->output.data) m->mtp.head = m->output;
    if (m->mtp.embed_tokens.data == m->tok_embd.data) m->mtp.embed_tokens = m->tok_embd;
    free(tmp);
    free(ts);
    return repacked;
}

void llm_model_free(llm_model *m) {
    if (!m) return;
    for (int il = 0; m->layers && il < m->cfg.n_layer + m->cfg.n_mtp; il++) free(m->layers[il].experts);
    free(m->layers);
    free(m->kv_windowed);
    free(m);
}
