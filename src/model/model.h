/*
 * model.h - a llama-family transformer bound to the tensors of a GGUF file.
 *
 * llm_model_load reads the hyper-parameters from GGUF metadata (keys are
 * prefixed by general.architecture: "llama.embedding_length", ...), finds
 * every weight by its llama.cpp name, and checks each one's shape and type
 * before anything runs, so the forward pass can trust them. Weights are not
 * copied: they point into the mapped file.
 *
 * Architectures: `llama` (and `mistral`-style files, which use it),
 * `mistral`, `qwen2` (NeoX RoPE, biases on Q, K and V), `qwen2vl`
 * (Qwen2.5-VL's text model: qwen2 with M-RoPE sections) and `qwen3` (NeoX
 * RoPE, an RMSNorm of each head of Q and K before it), `qwen3vl` and
 * `qwen3vlmoe` (Qwen3-VL's text models: qwen3 / qwen3moe with interleaved
 * M-RoPE sections and DeepStack image rows), `qwen3moe` and
 * Mixtral-style `llama` files (a mixture of experts in place of the FFN:
 * softmax router, top-k, weights renormalized), `phi3` (fused QKV and
 * gate/up), `gemma2` and `gemma3` (embedding scale, GeGLU, norms after
 * attention and FFN, soft-capping, sliding-window layers), `qwen35` and
 * `qwen35moe` (Qwen 3.5's hybrid: Gated DeltaNet layers with recurrent
 * state, model/deltanet.c, beside gated attention layers), `gpt-oss`
 * (OpenAI's: Q/K/V and output biases, a learned sink logit per head in
 * the attention softmax, sliding-window layers alternating with full
 * ones, experts with biases routed by the top-k router logits and
 * weighted by their softmax, the clamped SwiGLU-OAI, model/moe_oai.c;
 * YaRN rope). Rope may be
 * scaled (cfg.rope_scaling): linear or YaRN from rope.scaling.*, or by
 * per-pair factors: Llama 3.1's rope_freqs.weight, Phi-3's LongRoPE
 * rope_factors_long / _short.
 */
#ifndef KT_MODEL_MODEL_H
#define KT_MODEL_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "base/dtype.h"
#include "gguf/gguf.h"
#include "kettle.h"
#include "ops/ops.h"

/* One weight matrix (or vector): data in the mapping, n_out rows of n_in. */
typedef struct llm_tensor {
    const void *data;
    kt_dtype type;
    int n_in, n_out;
} llm_tensor;

typedef struct llm_layer {
    llm_tensor attn_norm, wq, wk, wv, wo;
    llm_tensor bq, bk, bv; /* qwen2 only (data NULL otherwise) */
    llm_tensor q_norm, k_norm; /* qwen3, gemma3: per-head RMSNorm of Q and K before rope (NULL otherwise) */
    llm_tensor ffn_norm, w_gate, w_up, w_down; /* dense FFN (data NULL in a mixture of experts) */
    /* gemma: RMSNorms of the attention's and the FFN's outputs before
     * their residual adds (NULL otherwise) */
    llm_tensor post_attn_norm, post_ffn_norm;
    bool swa; /* a sliding-window layer: attends the last cfg.n_swa positions, rope base rope_freq_base_swa */
    /* mixture of experts (qwen3moe, Mixtral's llama files): the router
     * [n_embd -> n_expert] and each expert's gate, up, down (views into
     * the merged 3-D tensors), experts[3 e + 0 / 1 / 2] */
    llm_tensor router;
    llm_tensor *experts;
    /* qwen35moe's shared expert: gate, up, down and its sigmoid gate
     * (a vector of n_embd: one logit per token); NULL otherwise */
    llm_tensor shexp_gate, shexp_up, shexp_down, shexp_inp;
    /* hybrid models (qwen35, qwen35moe): a Gated DeltaNet layer
     * (recurrent, model/deltanet.c) or a gated attention layer (wq's rows
     * hold, per head, Q then a gate: attn_gated) */
    bool recurrent, attn_gated;
    int rec_index; /* a recurrent layer's index among them (its place in the state) */
    int kv_layer;  /* an attention layer's layer in the KV pool (== its index but in hybrid models,
                      whose recurrent layers keep no KV) */
    llm_tensor ssm_qkv, ssm_z, ssm_conv, ssm_dt_bias, ssm_a, ssm_beta, ssm_alpha, ssm_norm, ssm_out;
    /* gpt-oss (NULL otherwise): attn_output's bias, the sinks (n_head
     * F32 logits), the router's bias (n_expert), and the experts' gate,
     * up and down biases, F32 [n_out, n_expert]: expert e's at
     * data + e * n_out (exp_bias[0 / 1 / 2]) */
    llm_tensor bo, sinks, router_bias, exp_bias[3];
} llm_layer;

typedef struct llm_config {
    char arch[32];
    int n_vocab, n_embd, n_layer, n_head, n_head_kv, n_ff, n_ctx_train;
    int pooling_type;  /* embedding models: GGUF's pooling_type (0 none, 1 mean, 2 cls, 3 last, 4 rank) */
    int head_dim, rope_dim;
    int n_expert, n_expert_used, n_ff_exp; /* 0 experts: a dense FFN */
    float rope_freq_base, rms_eps;
    kt_rope_style rope_style;
    /* gemma: the embedding times embd_scale (sqrt(n_embd); 1 otherwise),
     * Q times q_scale before the 1/sqrt(head_dim) of attention (Gemma's
     * 27B sizes scale by n_embd / n_head instead), GeGLU for SwiGLU,
     * attention scores and logits soft-capped (0: not), sliding-window
     * layers (llm_layer.swa) of n_swa positions with their own rope base */
    float embd_scale, q_scale;
    bool geglu;
    float attn_softcap, final_softcap;
    int n_swa, swa_period;
    const uint8_t *swa_flags; /* per layer (the file's bool array), or NULL: by swa_period */
    float rope_freq_base_swa;
    bool swa_rope_plain; /* local layers ignore rope_scaling (gemma3) */
    /* rope beyond the training context: linear, YaRN (rope.scaling.*) or
     * Llama 3.1's per-pair factors (the rope_freqs.weight tensor) */
    bool rope_scaled;
    kt_rope_scaling rope_scaling;
    /* Phi-3's LongRoPE: per-pair factors for contexts beyond n_ctx_orig
     * (long) and within it (short; rope_scaling.factors by default), or
     * NULL; llm_work_new picks one for its context */
    const float *rope_factors_long, *rope_factors_short;
    int n_ctx_orig;
    bool longrope_named; /* rope.scaling.type says "longrope" */
    /* hybrid models (qwen35, qwen35moe): Gated DeltaNet layers beside
     * gated attention ones. H_k key heads and H_v value heads of ssm_d_k
     * / ssm_d_v values, a causal convolution of ssm_conv_kernel taps over
     * the conv_dim = 2 H_k d_k + H_v d_v channels q | k | v. */
    bool hybrid;
    int n_recurrent; /* recurrent layers */
    const uint8_t *recurrent_flags; /* per layer (the file's bool array), or NULL: by full_attn_interval */
    int full_attn_interval;
    int ssm_conv_kernel, ssm_n_k_heads, ssm_n_v_heads, ssm_d_k, ssm_d_v, ssm_conv_dim;
    int rope_sections[4]; /* M-RoPE (rope.dimension_sections; all 0: none) */
    bool rope_sections_interleaved; /* Qwen 3.5's and Qwen3-VL's IMROPE; else qwen2vl's MROPE, sections in a row */
    /* Qwen3-VL (qwen3vl, qwen3vlmoe): DeepStack layers (n_deepstack_layers;
     * 0: none). An image token's embedding row is then n_embd * (1 +
     * n_deepstack) wide, and slice il + 1 is added to its hidden state
     * after layer il < n_deepstack (model/deepstack.c). */
    int n_deepstack;
    int n_ff_shexp;       /* the shared expert's width (0: none) */
    /* gpt-oss's experts: the top-k by router logit (+ bias) weighted by
     * the softmax of those k logits, biased, SwiGLU-OAI (model/moe_oai.c) */
    bool moe_oai;
    int n_kv_layer;       /* layers with KV (attention layers): n_layer - n_recurrent */
    /* multi-token prediction (Qwen 3.5's MTP, "nextn" in GGUF): the file's
     * nextn_predict_layers (counted in its block_count, not in n_layer) and
     * how many of them are bound (llm_model.mtp; 0: the file has none) */
    int n_nextn, n_mtp;
} llm_config;

/* Qwen 3.5's multi-token-prediction head (llama.cpp's qwen35.cpp graph_mtp,
 * HF's mtp.*): h' = eh_proj [enorm(embed(token)) | hnorm(h)], then one
 * gated full-attention decoder block (llm_model.layers[cfg.n_layer], its
 * KV in the pool's layer cfg.n_kv_layer), then head_norm and head. h is
 * the target's last hidden state after its output norm. Optional tensors
 * absent fall back as llama.cpp's do: embed_tokens -> tok_embd,
 * shared_head_head -> output, shared_head_norm -> output_norm. */
typedef struct llm_mtp {
    llm_tensor eh_proj;          /* [2 n_embd -> n_embd] */
    llm_tensor enorm, hnorm;     /* RMSNorm weights of the embedding and of h */
    llm_tensor embed_tokens;     /* the model's tok_embd unless the file has its own */
    llm_tensor head_norm, head;  /* output_norm / output unless the file has shared_head_* */
} llm_mtp;

typedef struct llm_model {
    llm_config cfg;
    llm_tensor tok_embd, output_norm, output; /* output may be tok_embd */
    llm_layer *layers;                        /* cfg.n_layer of them, then cfg.n_mtp MTP blocks */
    llm_mtp mtp;                              /* with cfg.n_mtp */
    uint8_t *kv_windowed;                     /* per layer: llm_layer.swa, as the KV pool takes it */
    uint64_t weight_bytes, n_params;
    uint64_t active_bytes; /* weight_bytes less the experts a token does not use and an untied embedding table (one row) */
} llm_model;

/* Floats of recurrent state one sequence of a hybrid model keeps per
 * recurrent layer: the convolution's last ssm_conv_kernel - 1 inputs of
 * conv_dim channels, then H_v state matrices of d_k x d_v; and bytes for
 * all of its layers (0: not a hybrid model). */
size_t llm_state_layer_floats(const llm_config *c);
size_t llm_state_bytes(const llm_model *m);

/* Validates and binds; errors name the key or tensor at fault. */
llm_model *llm_model_load(const gguf_file *f, kt_error *err);
void llm_model_free(llm_model *m);

/* Rewrites every Q4_0, Q4_K and Q6_K matrix the forward pass multiplies
 * by (rows in multiples of 8; not the embedding table) in place in its x8
 * layout (ops/repack.h) and retypes it. The weights must be writable: the caller
 * owns a copy of the file. Returns how many were repacked, or -1 with err
 * set (out of memory; nothing half-done: each matrix is all or nothing). */
int llm_model_repack(llm_model *m, kt_progress_fn progress, void *user, kt_error *err);

#endif
