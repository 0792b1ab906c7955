/*
 * cmd_gen_model.c - `kettle gen-model --shape NAME --type TYPE --vocab
 * VOCAB.gguf -o OUT.gguf [--seed S] [--layers N]`: writes a model of a real
 * model's shape (TinyLlama 1.1B, SmolLM 135M, Llama 3.2 1B, Qwen 3 0.6B,
 * Qwen 3 30B-A3B's mixture of experts cut to 12 layers and its dense twin,
 * Gemma 3 1B, Phi-3 mini, Qwen 3.5 0.8B / 4B / 9B / 35B-A3B, gpt-oss-20b, tiny test
 * shapes) filled with deterministic random weights; --layers writes only the
 * first N layers of one (the 35B-A3B is about 19 GB in Q4_0). Shapes named
 * mmproj-* are vision towers (llama.cpp's mmproj files, no --vocab): see
 * "vision towers" below.
 *
 * Why: benchmarks and memory/speed tests need full-size models, and real
 * weights cannot be downloaded here. The weights are small (about N(0,
 * 0.02), the scale of trained models) and norms are 1, so activations stay
 * in a realistic range. The tokenizer is copied key by key from any GGUF
 * that has one (tokenizer.*), and the vocabulary size follows its token
 * list.
 *
 * Determinism and speed: each row of each tensor has its own splitmix64
 * stream seeded from (seed, tensor index, row), so the file's bytes depend
 * only on the seed, never on the number of threads, and rows are generated
 * in parallel. Normals are approximated by the sum of four 16-bit uniforms
 * from one 64-bit draw (Irwin-Hall: mean 0, the right variance, tails cut
 * at 3.5 sigma), computed in integers so every machine gives the same
 * floats, and about 20x faster than Box-Muller. Tensors are generated and
 * written one at a time, in parts of about 16 MB of whole rows, so memory
 * stays small whatever the model (gpt-oss-20b in MXFP4_MOE is 12 GB).
 *
 * Mixes (--type MXFP4_MOE, Q4_K_M, ...): each tensor gets the type
 * `kettle quantize` gives it in that mix (quant_mix.c: the same rules and
 * fallbacks), tensors come in llama.cpp's order and the file-type keys
 * last, as quantize writes them, so the file is byte for byte the one
 * `gen-model --type F32` then `kettle quantize ... MIX` gives with the same
 * seed, without the F32 file (42 GB for gpt-oss-20b) ever existing.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/rng.h"
#include "base/timing.h"
#include "cli/cli_util.h"
#include "ops/pool.h"
#include "cli/commands.h"
#include "cli/quant_mix.h"
#include "gguf/gguf.h"
#include "ops/quant.h"

#define CMD "gen-model"
#define WEIGHT_STD 0.02
#define GGML_QNT_VERSION 2

typedef struct shape {
    const char *name;
    int64_t dim, n_layers, n_heads, n_kv_heads, ffn, ctx;
    float rope_base, eps;
    bool tied; /* classifier = token embedding */
    const char *arch;   /* NULL: llama */
    int64_t head_dim;   /* 0: dim / n_heads */
    int64_t n_expert, n_expert_used, ffn_exp; /* qwen3moe */
    int64_t n_swa; float rope_base_swa;       /* gemma3: the local layers' window and rope base */
    /* qwen35 (Gated DeltaNet hybrid): key and value heads of ssm_head
     * values (every 4th layer is gated full attention, rope on a quarter
     * of the head) */
    int64_t ssm_k_heads, ssm_v_heads, ssm_head;
    int64_t ffn_shexp; /* qwen35moe: the gated shared expert's FFN width */
    float yarn_factor; int64_t yarn_orig_ctx; /* gpt-oss: YaRN over the original context (0: no scaling) */
    /* Qwen 3.5's multi-token-prediction blocks (nextn_predict_layers):
     * every Qwen 3.5 file llama.cpp's converter writes from the released
     * checkpoints carries one (their config.json's mtp_num_hidden_layers
     * is 1; llama.cpp conversion/qwen.py, _QwenMtpMixin, counts it into
     * block_count), so the shapes do too; --no-mtp leaves it out */
    int64_t n_mtp;
    /* Qwen3-VL (qwen3vl, qwen3vlmoe): n_deepstack_layers, the DeepStack
     * mergers of the tower the model is made for; interleaved M-RoPE
     * sections in Qwen3-VL's proportions [24, 20, 20] of the rotated pairs */
    int64_t n_deepstack;
} shape;

/* gemma3-1b is Gemma 3 1B's (head size 256, one KV head, 5 local layers
 * of window 512 to each global one; its real vocabulary has 262,144
 * tokens), phi3-mini Phi-3-mini-4k's (fused QKV and gate/up, head size
 * 96, no rope factors). llama-80l-tiny has a 70B's 80 layers and GQA in
 * small matrices, for llama.cpp's 70B quantization rules. The qwen3 shapes are Qwen 3's own (0.6B; the 30B-A3B mixture of
 * experts with its 128 experts, top 8, expert FFN 768 and attention, cut
 * to 12 of its 48 layers to fit in memory), and the same 12 layers with
 * a dense FFN of 8 x 768: the dense model with the MoE's active
 * parameters, its decode speed's yardstick. */
static const shape SHAPES[] = {
    {"tinyllama-1.1b", 2048, 22, 32, 4, 5632, 2048, 10000.0f, 1e-5f, false, NULL, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"smollm-135m", 576, 30, 9, 3, 1536, 2048, 10000.0f, 1e-5f, true, NULL, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"test-tiny", 256, 4, 8, 2, 704, 512, 10000.0f, 1e-5f, true, NULL, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"llama3.2-1b", 2048, 16, 32, 8, 8192, 131072, 500000.0f, 1e-5f, true, NULL, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"qwen3-0.6b", 1024, 28, 16, 8, 3072, 40960, 1e6f, 1e-6f, true, "qwen3", 128, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"qwen3-30b-a3b-12l", 2048, 12, 32, 4, 6144, 40960, 1e6f, 1e-6f, false, "qwen3moe", 128, 128, 8, 768, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"qwen3-dense-a3b-12l", 2048, 12, 32, 4, 6144, 40960, 1e6f, 1e-6f, false, "qwen3", 128, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"qwen3moe-tiny", 256, 4, 8, 2, 704, 512, 1e6f, 1e-6f, true, "qwen3moe", 32, 8, 2, 128, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"gemma3-1b", 1152, 26, 4, 1, 6912, 32768, 1e6f, 1e-6f, true, "gemma3", 256, 0, 0, 0, 512, 10000.0f, 0, 0, 0, 0, 0, 0, 0, 0},
    {"phi3-mini", 3072, 32, 32, 32, 8192, 4096, 10000.0f, 1e-5f, false, "phi3", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"gemma3-tiny", 256, 6, 4, 1, 512, 512, 1e6f, 1e-6f, true, "gemma3", 64, 0, 0, 0, 8, 10000.0f, 0, 0, 0, 0, 0, 0, 0, 0},
    {"phi3-tiny", 256, 4, 8, 8, 512, 512, 10000.0f, 1e-5f, false, "phi3", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"llama-80l-tiny", 256, 80, 8, 2, 256, 512, 10000.0f, 1e-5f, true, NULL, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    /* Qwen 3.5's 0.8B and 4B (their config.json: head size 256, linear
     * attention 16 key heads, 16 / 32 value heads of 128, kernel 4, rope
     * base 1e7 on a quarter of the head; the real vocabulary has 248,320
     * tokens); qwen3.5-tiny their layout in small matrices, for tests */
    {"qwen3.5-0.8b", 1024, 24, 8, 2, 3584, 262144, 1e7f, 1e-6f, true, "qwen35", 256, 0, 0, 0, 0, 0, 16, 16, 128, 0, 0, 0, 1, 0},
    {"qwen3.5-4b", 2560, 32, 16, 4, 9216, 262144, 1e7f, 1e-6f, true, "qwen35", 256, 0, 0, 0, 0, 0, 16, 32, 128, 0, 0, 0, 1, 0},
    {"qwen3.5-tiny", 256, 8, 4, 2, 512, 512, 1e7f, 1e-6f, true, "qwen35", 64, 0, 0, 0, 0, 0, 2, 4, 32, 0, 0, 0, 1, 0},
    /* Qwen 3.5 9B (its config.json: hidden 4096, 32 layers, attention 16
     * heads / 4 KV of 256, linear attention 16 key / 32 value heads of 128,
     * FFN 12288; output not tied to the embedding) and 35B-A3B (hidden
     * 2048, 40 layers, attention 16 / 2 KV of 256, linear attention 16 /
     * 32 of 128, 256 experts, top 8, expert FFN 512, one gated shared
     * expert of 512, no dense FFN: like llama.cpp's converter, which writes
     * feed_forward_length only when the config has intermediate_size, the
     * file has none; untied). Both: kernel 4, every 4th layer full
     * attention, rope base 1e7 on a quarter of the head, 262,144 positions.
     * The real vocabulary has 248,320 tokens. qwen3.5moe-tiny is the
     * 35B-A3B's layout in small matrices. */
    {"qwen3.5-9b", 4096, 32, 16, 4, 12288, 262144, 1e7f, 1e-6f, false, "qwen35", 256, 0, 0, 0, 0, 0, 16, 32, 128, 0, 0, 0, 1, 0},
    {"qwen3.5-35b-a3b", 2048, 40, 16, 2, 0, 262144, 1e7f, 1e-6f, false, "qwen35moe", 256, 256, 8, 512, 0, 0, 16, 32, 128, 512, 0, 0, 1, 0},
    {"qwen3.5moe-tiny", 256, 8, 4, 2, 0, 512, 1e7f, 1e-6f, false, "qwen35moe", 64, 8, 2, 128, 0, 0, 2, 4, 32, 128, 0, 0, 1, 0},
    /* gpt-oss-20b (its config.json: hidden 2880, 24 layers, 64 heads / 8
     * KV of 64, 32 experts, top 4, expert FFN 2880 (intermediate_size,
     * which the converter also writes as feed_forward_length), sliding
     * window 128 on the even layers, rope base 150000, YaRN factor 32 over
     * 4096 positions (beta 32 / 1, llama.cpp's defaults), 131072
     * positions, rms eps 1e-5, output untied; the real o200k vocabulary
     * has 201088 tokens). Uncertain: nothing in the shape; the published
     * file's MXFP4 experts and Q8_0 rest are --type MXFP4_MOE, and its
     * biases and sinks are learned where these are 0 and 1.
     * gpt-oss-tiny is its layout in small matrices, for tests (YaRN over
     * 256 positions so that short prompts cross the ramp). */
    {"gpt-oss-20b", 2880, 24, 64, 8, 2880, 131072, 150000.0f, 1e-5f, false, "gpt-oss", 64, 32, 4, 2880, 128, 0, 0, 0, 0, 0, 32.0f, 4096, 0, 0},
    {"gpt-oss-tiny", 256, 4, 8, 2, 128, 8192, 150000.0f, 1e-5f, false, "gpt-oss", 32, 8, 2, 128, 16, 0, 0, 0, 0, 0, 32.0f, 256, 0, 0},
    /* Qwen3-VL-4B-Instruct's text model (its config.json text_config:
     * hidden 2560, 36 layers, 32 heads / 8 KV of 128, intermediate 9728,
     * rope_theta 5e6, mrope_section [24, 20, 20] interleaved, 262144
     * positions, rms eps 1e-6, tied embeddings; vision_config's
     * deepstack_visual_indexes [5, 11, 17]: 3 DeepStack layers; the real
     * vocabulary has 151,936 tokens). qwen3vl-tiny and qwen3vlmoe-tiny
     * are its layout in small matrices for tests, n_embd 64 with 3
     * DeepStack layers to take mmproj-qwen3vl-tiny's images. */
    {"qwen3vl-4b", 2560, 36, 32, 8, 9728, 262144, 5e6f, 1e-6f, true, "qwen3vl", 128, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3},
    {"qwen3vl-tiny", 64, 4, 4, 2, 192, 4096, 5e6f, 1e-6f, true, "qwen3vl", 32, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3},
    {"qwen3vlmoe-tiny", 64, 4, 4, 2, 192, 4096, 5e6f, 1e-6f, true, "qwen3vlmoe", 32, 8, 2, 64, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3},
};

static const char *arch_of(const shape *s) { return s->arch ? s->arch : "llama"; }
static int64_t head_dim_of(const shape *s) { return s->head_dim ? s->head_dim : s->dim / s->n_heads; }
#define N_SHAPES (sizeof SHAPES / sizeof SHAPES[0])

/* vision towers: see "vision towers" below for the sources */
typedef struct tower_shape {
    const char *name;
    int64_t width, n_layers, n_heads, ffn, patch, pos_side, proj_dim;
    int deepstack[4], n_deepstack; /* block indexes with a DeepStack merger */
} tower_shape;

static const tower_shape TOWERS[] = {
    {"mmproj-qwen3.5-4b", 1024, 24, 16, 4096, 16, 48, 2560, {0}, 0},
    {"mmproj-qwen3vl-4b", 1024, 24, 16, 4096, 16, 48, 2560, {5, 11, 17}, 3},
    /* the test goldens' tower (mmproj-qwen3vl-*.gguf) in shape: for tests;
     * and with a fourth block and DeepStack mergers after blocks 0-2, for
     * qwen3vl-tiny */
    {"mmproj-qwen3.5-tiny", 64, 3, 4, 160, 16, 48, 64, {0}, 0},
    {"mmproj-qwen3vl-tiny", 64, 4, 4, 160, 16, 48, 64, {0, 1, 2}, 3},
};
#define N_TOWERS (sizeof TOWERS / sizeof TOWERS[0])

static void usage(FILE *out) {
    fprintf(out,
            "usage: kettle gen-model --shape NAME --type TYPE --vocab VOCAB.gguf -o OUT.gguf\n"
            "                        [--seed S] [--ctx-train N] [--layers N]\n"
            "\n"
            "Writes a model of a real shape (llama, qwen3, qwen3moe, qwen3vl, qwen3vlmoe, gemma3, phi3, qwen35,\n"
            "qwen35moe, gpt-oss)\n"
            "with deterministic random weights (about N(0, 0.02); norms 1; gpt-oss's 1-D biases 0 and sinks 1):\n"
            "the same seed gives the same file bytes.\n"
            "\n"
            "  --shape NAME     ");
    for (size_t i = 0; i < N_SHAPES; i++) fprintf(out, "%s%s", i ? ", " : "", SHAPES[i].name);
    fprintf(out, "\n                   vision towers (mmproj files; no --vocab): ");
    for (size_t i = 0; i < N_TOWERS; i++) fprintf(out, "%s%s", i ? ", " : "", TOWERS[i].name);
    fprintf(out,
            "\n"
            "  --type TYPE      type of the 2-D weights: %s (norms stay F32),\n"
            "                   or one of llama.cpp's mixes, with the types `kettle quantize`\n"
            "                   gives each tensor (and the same bytes as quantizing --type F32):\n"
            "                   %s\n"
            "                   (MXFP4_MOE: gpt-oss's experts MXFP4, the other matrices Q8_0)\n"
            "  --vocab FILE     a GGUF whose tokenizer.* keys are copied; the vocabulary\n"
            "                   size is its token count\n"
            "  -o, --output OUT the file to write\n"
            "  --seed S         random seed (default 0)\n"
            "  --ctx-train N    the training context written in the metadata (default: the shape's)\n"
            "  --layers N       write only the first N layers (default: the shape's count), to test\n"
            "                   a shape too large to write in full (a Qwen 3.5 shape's MTP block\n"
            "                   follows them)\n"
            "  --no-mtp         a Qwen 3.5 shape without its multi-token-prediction block (which\n"
            "                   the real files carry: one, counted in block_count)\n",
            cli_out_type_list(), cmd_quantize_types(true));
}

/* ---- the tensor list ---- */

typedef struct gen_tensor {
    char name[64];
    uint32_t n_dims;
    int64_t dims[4]; /* rows of dims[0]: dims[1] x dims[2] x dims[3] of them */
    kt_dtype type;
    bool zero; /* a 1-D tensor of zeros (a tower's biases) instead of ones */
} gen_tensor;

typedef struct gen_plan {
    gen_tensor *t;
    int64_t n;
} gen_plan;

static void add3(gen_plan *p, const char *name, int64_t d0, int64_t d1, int64_t d2, kt_dtype type) {
    gen_tensor *t = &p->t[p->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = d2 ? 3 : d1 ? 2 : 1;
    t->dims[0] = d0;
    t->dims[1] = d1 ? d1 : 1;
    t->dims[2] = d2 ? d2 : 1;
    t->dims[3] = 1;
    t->type = d1 ? type : KT_F32;
    t->zero = false;
}

static void add(gen_plan *p, const char *name, int64_t d0, int64_t d1, kt_dtype type) {
    add3(p, name, d0, d1, 0, type);
}

/* layer i's 1-D tensor `suffix` of n zeros (gpt-oss's biases) */
static void add_zero_bias(gen_plan *p, int64_t i, const char *suffix, int64_t n) {
    char name[64];
    snprintf(name, sizeof name, "blk.%" PRId64 ".%s", i, suffix);
    add3(p, name, n, 0, 0, KT_F32);
    p->t[p->n - 1].zero = true;
}

/* Layer i; mtp: the MTP block after the trunk (always full attention). */
static void add_layer(gen_plan *p, const shape *s, int64_t i, bool mtp, kt_dtype type) {
    const int64_t hd = head_dim_of(s), q = hd * s->n_heads, kv = hd * s->n_kv_heads, E = s->n_expert;
    const char *a = arch_of(s);
    const bool qk_norm = !strcmp(a, "qwen3") || !strcmp(a, "qwen3moe") || !strncmp(a, "qwen3vl", 7) || !strcmp(a, "gemma3");
    const bool gemma = !strcmp(a, "gemma3"), fused = !strcmp(a, "phi3");
    char n[64];
#define LAYER(suffix, d0, d1, d2)                                    \
    do {                                                             \
        snprintf(n, sizeof n, "blk.%" PRId64 "." suffix, i);         \
        add3(p, n, d0, d1, d2, type);                                \
    } while (0)
    LAYER("attn_norm.weight", s->dim, 0, 0);
    if (!strcmp(a, "gpt-oss")) { /* llama.cpp's openai-moe tensors; biases 0, sinks 1 */
        LAYER("attn_q.weight", s->dim, q, 0);
        add_zero_bias(p, i, "attn_q.bias", q);
        LAYER("attn_k.weight", s->dim, kv, 0);
        add_zero_bias(p, i, "attn_k.bias", kv);
        LAYER("attn_v.weight", s->dim, kv, 0);
        add_zero_bias(p, i, "attn_v.bias", kv);
        LAYER("attn_output.weight", q, s->dim, 0);
        add_zero_bias(p, i, "attn_output.bias", s->dim);
        LAYER("attn_sinks.weight", s->n_heads, 0, 0);
        LAYER("post_attention_norm.weight", s->dim, 0, 0);
        LAYER("ffn_gate_inp.weight", s->dim, E, 0);
        add_zero_bias(p, i, "ffn_gate_inp.bias", E);
        /* the experts' biases are [n_out, n_expert] F32 matrices: random
         * (std 0.02) like the weights, so each expert's differ */
        LAYER("ffn_gate_exps.weight", s->dim, s->ffn_exp, E);
        LAYER("ffn_gate_exps.bias", s->ffn_exp, E, 0);
        p->t[p->n - 1].type = KT_F32;
        LAYER("ffn_up_exps.weight", s->dim, s->ffn_exp, E);
        LAYER("ffn_up_exps.bias", s->ffn_exp, E, 0);
        p->t[p->n - 1].type = KT_F32;
        LAYER("ffn_down_exps.weight", s->ffn_exp, s->dim, E);
        LAYER("ffn_down_exps.bias", s->dim, E, 0);
        p->t[p->n - 1].type = KT_F32;
        return;
    }
    if (s->ssm_head) { /* qwen35 */
        const int64_t hk = s->ssm_k_heads * s->ssm_head, inner = s->ssm_v_heads * s->ssm_head;
        if ((i + 1) % 4 && !mtp) {
            LAYER("attn_qkv.weight", s->dim, 2 * hk + inner, 0);
            LAYER("attn_gate.weight", s->dim, inner, 0);
            LAYER("ssm_conv1d.weight", 4, 2 * hk + inner, 0);
            p->t[p->n - 1].type = KT_F32; /* as llama.cpp's converter writes it */
            LAYER("ssm_dt.bias", s->ssm_v_heads, 0, 0);
            snprintf(n, sizeof n, "blk.%" PRId64 ".ssm_a", i);
            add3(p, n, s->ssm_v_heads, 0, 0, type);
            LAYER("ssm_beta.weight", s->dim, s->ssm_v_heads, 0);
            LAYER("ssm_alpha.weight", s->dim, s->ssm_v_heads, 0);
            LAYER("ssm_norm.weight", s->ssm_head, 0, 0);
            LAYER("ssm_out.weight", inner, s->dim, 0);
        } else {
            LAYER("attn_q.weight", s->dim, 2 * q, 0); /* per head: Q, then its gate */
            LAYER("attn_k.weight", s->dim, kv, 0);
            LAYER("attn_v.weight", s->dim, kv, 0);
            LAYER("attn_output.weight", q, s->dim, 0);
            LAYER("attn_q_norm.weight", hd, 0, 0);
            LAYER("attn_k_norm.weight", hd, 0, 0);
        }
        LAYER("post_attention_norm.weight", s->dim, 0, 0);
        if (E) { /* qwen35moe: routed experts, then the gated shared expert */
            LAYER("ffn_gate_inp.weight", s->dim, E, 0);
            LAYER("ffn_gate_exps.weight", s->dim, s->ffn_exp, E);
            LAYER("ffn_down_exps.weight", s->ffn_exp, s->dim, E);
            LAYER("ffn_up_exps.weight", s->dim, s->ffn_exp, E);
            LAYER("ffn_gate_inp_shexp.weight", s->dim, 0, 0); /* [n_embd]: one gate logit per token */
            LAYER("ffn_gate_shexp.weight", s->dim, s->ffn_shexp, 0);
            LAYER("ffn_down_shexp.weight", s->ffn_shexp, s->dim, 0);
            LAYER("ffn_up_shexp.weight", s->dim, s->ffn_shexp, 0);
            return;
        }
        LAYER("ffn_gate.weight", s->dim, s->ffn, 0);
        LAYER("ffn_down.weight", s->ffn, s->dim, 0);
        LAYER("ffn_up.weight", s->dim, s->ffn, 0);
        return;
    }
    if (fused) {
        LAYER("attn_qkv.weight", s->dim, q + 2 * kv, 0);
    } else {
        LAYER("attn_q.weight", s->dim, q, 0);
        LAYER("attn_k.weight", s->dim, kv, 0);
        LAYER("attn_v.weight", s->dim, kv, 0);
    }
    LAYER("attn_output.weight", q, s->dim, 0);
    if (qk_norm) {
        LAYER("attn_q_norm.weight", hd, 0, 0);
        LAYER("attn_k_norm.weight", hd, 0, 0);
    }
    if (gemma) LAYER("post_attention_norm.weight", s->dim, 0, 0);
    LAYER("ffn_norm.weight", s->dim, 0, 0);
    if (fused) {
        LAYER("ffn_down.weight", s->ffn, s->dim, 0);
        LAYER("ffn_up.weight", s->dim, 2 * s->ffn, 0); /* gate | up */
    } else if (E) {
        LAYER("ffn_gate_inp.weight", s->dim, E, 0);
        LAYER("ffn_gate_exps.weight", s->dim, s->ffn_exp, E);
        LAYER("ffn_down_exps.weight", s->ffn_exp, s->dim, E);
        LAYER("ffn_up_exps.weight", s->dim, s->ffn_exp, E);
    } else {
        LAYER("ffn_gate.weight", s->dim, s->ffn, 0);
        LAYER("ffn_down.weight", s->ffn, s->dim, 0);
        LAYER("ffn_up.weight", s->dim, s->ffn, 0);
    }
    if (gemma) LAYER("post_ffw_norm.weight", s->dim, 0, 0);
#undef LAYER
}

/* The MTP block (llama.cpp's load_block_mtp): a full-attention layer,
 * then the nextn tensors a converted Qwen 3.5 checkpoint has (mtp.fc ->
 * eh_proj, pre_fc_norm_embedding -> enorm, pre_fc_norm_hidden -> hnorm,
 * norm -> shared_head_norm; no embed_tokens or shared_head_head: the
 * embedding and the output are shared). */
static void add_mtp(gen_plan *p, const shape *s, int64_t il, kt_dtype type) {
    char n[64];
    add_layer(p, s, il, true, type);
    snprintf(n, sizeof n, "blk.%" PRId64 ".nextn.eh_proj.weight", il);
    add(p, n, 2 * s->dim, s->dim, type);
    static const char *const norms[] = {"enorm", "hnorm", "shared_head_norm"};
    for (int k = 0; k < 3; k++) {
        snprintf(n, sizeof n, "blk.%" PRId64 ".nextn.%s.weight", il, norms[k]);
        add(p, n, s->dim, 0, type);
    }
}

/* Same order as llama.cpp's converters write them, but for the MTP
 * block, written last: the trunk's tensors keep their places, and so
 * their random values, with or without it. */
static kt_status make_plan(gen_plan *p, const shape *s, int64_t n_vocab, kt_dtype type,
                           kt_error *err) {
    p->n = 0;
    p->t = calloc((size_t)(24 * (s->n_layers + s->n_mtp) + 3 + 4 * s->n_mtp), sizeof *p->t); /* qwen35moe: 19 a layer, gpt-oss 20 */
    if (!p->t) return kt_error_set(err, KT_ERR_NOMEM, "out of memory");
    add(p, "token_embd.weight", s->dim, n_vocab, type);
    for (int64_t i = 0; i < s->n_layers; i++) add_layer(p, s, i, false, type);
    add(p, "output_norm.weight", s->dim, 0, type);
    if (!s->tied) add(p, "output.weight", s->dim, n_vocab, type);
    for (int64_t i = 0; i < s->n_mtp; i++) add_mtp(p, s, s->n_layers + i, type);
    return KT_OK;
}

static int64_t n_rows(const gen_tensor *t) { return t->dims[1] * t->dims[2] * t->dims[3]; }

static size_t tensor_bytes(const gen_tensor *t) {
    return kt_dtype_row_bytes(t->type, t->dims[0]) * (size_t)n_rows(t);
}

/* ---- random rows ---- */

static uint64_t mix64(uint64_t x) {
    kt_rng r;
    kt_rng_seed(&r, x);
    return kt_rng_u64(&r);
}

static uint64_t row_seed(uint64_t seed, uint64_t tensor, uint64_t row) {
    return mix64(mix64(mix64(seed) ^ tensor) ^ row);
}

/* n values of about N(0, WEIGHT_STD): Irwin-Hall sum of four 16-bit
 * uniforms, centred in integers (exact), then one float multiply. */
static void fill_normal(kt_rng *r, float *x, int64_t n) {
    /* std of the sum of 4 uniforms on {0..65535}: sqrt(4 (65536^2 - 1) / 12) */
    const float scale = (float)(WEIGHT_STD / sqrt(4.0 * (65536.0 * 65536.0 - 1.0) / 12.0));
    for (int64_t j = 0; j < n; j++) {
        uint64_t u = kt_rng_u64(r);
        int32_t s = (int32_t)((u & 0xffff) + ((u >> 16) & 0xffff) + ((u >> 32) & 0xffff) +
                              (u >> 48)) - 131070;
        x[j] = (float)s * scale;
    }
}

typedef struct gen_job {
    const gen_tensor *t;
    uint64_t seed, index;
    unsigned char *out; /* rows row0 .. row0 + n - 1 */
    float *scratch; /* CLI_MAX_THREADS rows */
    size_t row_bytes;
    int64_t row0, n;
} gen_job;

static void gen_rows(void *ctx, int ith, int nth) {
    const gen_job *j = ctx;
    long lo, hi;
    int64_t n = j->t->dims[0];
    float *row = j->scratch + (size_t)ith * (size_t)n;
    bool ones = j->t->n_dims == 1;
    /* a DeltaNet's decay ssm_a holds -exp(A_log): -1 (ones would make every
     * state grow without bound) */
    const size_t name_len = strlen(j->t->name);
    float one = name_len >= 6 && !strcmp(j->t->name + name_len - 6, ".ssm_a") ? -1.0f : 1.0f;
    if (j->t->zero) one = 0.0f;
    kt_split_range(j->n, ith, nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        if (ones) {
            for (int64_t k = 0; k < n; k++) row[k] = one;
        } else {
            kt_rng rng;
            kt_rng_seed(&rng, row_seed(j->seed, j->index, (uint64_t)(j->row0 + r)));
            fill_normal(&rng, row, n);
        }
        kt_quantize_row(j->t->type, row, j->out + (size_t)r * j->row_bytes, n);
    }
}

/* ---- metadata ---- */

/* ftype: general.file_type. Its keys come first for a plain type; a mix
 * (ftype_last) has them written after the tokenizer by write_model, where
 * `kettle quantize` puts them, so that the file equals quantize's of the
 * same weights in F32. */
static kt_status set_metadata(gguf_writer *w, const shape *s, int64_t n_vocab,
                              uint32_t ftype, bool ftype_last, kt_error *err) {
    kt_status st;
#define TRY(call) do { if ((st = (call)) != KT_OK) return st; } while (0)
    const char *a = arch_of(s);
    char key[96];
#define U32(suffix, v) (snprintf(key, sizeof key, "%s." suffix, a), gguf_writer_set_u32(w, key, (uint32_t)(v), err))
#define F32(suffix, v) (snprintf(key, sizeof key, "%s." suffix, a), gguf_writer_set_f32(w, key, (v), err))
    TRY(gguf_writer_set_str(w, "general.architecture", a, err));
    TRY(gguf_writer_set_str(w, "general.name", s->name, err));
    if (!ftype_last) {
        TRY(gguf_writer_set_u32(w, "general.file_type", ftype, err));
        TRY(gguf_writer_set_u32(w, "general.quantization_version", GGML_QNT_VERSION, err));
    }
    TRY(U32("context_length", s->ctx));
    TRY(U32("embedding_length", s->dim));
    TRY(U32("block_count", s->n_layers + s->n_mtp)); /* the MTP blocks counted in, as the converter does */
    if (s->n_mtp) TRY(U32("nextn_predict_layers", s->n_mtp));
    if (s->ffn) TRY(U32("feed_forward_length", s->ffn)); /* qwen35moe: none, as llama.cpp's converter writes it */
    TRY(U32("rope.dimension_count", s->ssm_head ? head_dim_of(s) / 4 : head_dim_of(s)));
    if (s->ssm_head) {
        /* Qwen 3.5's [11, 11, 10] over the 32 rotated pairs, scaled */
        const int32_t pairs = (int32_t)(head_dim_of(s) / 8), s0 = (pairs * 11 + 16) / 32;
        const int32_t sections[4] = {s0, s0, pairs - 2 * s0, 0};
        TRY(U32("ssm.conv_kernel", 4));
        TRY(U32("ssm.state_size", s->ssm_head));
        TRY(U32("ssm.group_count", s->ssm_k_heads));
        TRY(U32("ssm.time_step_rank", s->ssm_v_heads));
        TRY(U32("ssm.inner_size", s->ssm_v_heads * s->ssm_head));
        TRY(U32("full_attention_interval", 4));
        snprintf(key, sizeof key, "%s.rope.dimension_sections", a);
        TRY(gguf_writer_set_arr(w, key, GGUF_I32, sections, 4, err));
    }
    if (!strncmp(a, "qwen3vl", 7)) { /* as llama.cpp's converter writes Qwen3-VL's text model */
        const int32_t pairs = (int32_t)(head_dim_of(s) / 2), s0 = pairs * 24 / 64, s1 = pairs * 20 / 64;
        const int32_t sections[4] = {s0, s1, pairs - s0 - s1, 0};
        snprintf(key, sizeof key, "%s.rope.dimension_sections", a);
        TRY(gguf_writer_set_arr(w, key, GGUF_I32, sections, 4, err));
        TRY(U32("n_deepstack_layers", s->n_deepstack));
    }
    TRY(U32("attention.head_count", s->n_heads));
    TRY(U32("attention.head_count_kv", s->n_kv_heads));
    if (s->head_dim) {
        TRY(U32("attention.key_length", s->head_dim));
        TRY(U32("attention.value_length", s->head_dim));
    }
    if (s->n_expert) {
        TRY(U32("expert_count", s->n_expert));
        TRY(U32("expert_used_count", s->n_expert_used));
        TRY(U32("expert_feed_forward_length", s->ffn_exp));
        if (s->ffn_shexp) TRY(U32("expert_shared_feed_forward_length", s->ffn_shexp));
    }
    TRY(F32("attention.layer_norm_rms_epsilon", s->eps));
    TRY(F32("rope.freq_base", s->rope_base));
    if (s->n_swa) TRY(U32("attention.sliding_window", s->n_swa));
    if (s->rope_base_swa > 0) TRY(F32("rope.freq_base_swa", s->rope_base_swa)); /* gpt-oss: none, as its converter */
    if (s->yarn_factor > 0) { /* as llama.cpp's converter writes gpt-oss's rope_scaling */
        snprintf(key, sizeof key, "%s.rope.scaling.type", a);
        TRY(gguf_writer_set_str(w, key, "yarn", err));
        TRY(F32("rope.scaling.factor", s->yarn_factor));
        TRY(U32("rope.scaling.original_context_length", s->yarn_orig_ctx));
        TRY(F32("rope.scaling.yarn_beta_fast", 32.0f));
        TRY(F32("rope.scaling.yarn_beta_slow", 1.0f));
    }
    TRY(U32("vocab_size", n_vocab));
#undef U32
#undef F32
#undef TRY
    return KT_OK;
}

static bool has_prefix(gguf_str s, const char *prefix) {
    size_t n = strlen(prefix);
    return s.len >= n && memcmp(s.ptr, prefix, n) == 0;
}

/* The vocabulary size: the length of tokenizer.ggml.tokens. */
static kt_status vocab_size(const gguf_file *v, const char *path, int64_t *n, kt_error *err) {
    int64_t k = gguf_find_key(v, "tokenizer.ggml.tokens");
    if (k < 0)
        return kt_error_set(err, KT_ERR_FORMAT, "%s: no tokenizer (key "
                            "tokenizer.ggml.tokens is missing)", path);
    if (gguf_kv_type(v, k) != GGUF_ARRAY || gguf_kv_arr_type(v, k) != GGUF_STRING)
        return kt_error_set(err, KT_ERR_FORMAT, "%s: tokenizer.ggml.tokens is not an array "
                            "of strings", path);
    uint64_t count = gguf_kv_arr_n(v, k);
    if (count == 0 || count > INT32_MAX)
        return kt_error_set(err, KT_ERR_FORMAT, "%s: tokenizer.ggml.tokens has %" PRIu64
                            " tokens", path, count);
    *n = (int64_t)count;
    return KT_OK;
}

static kt_status copy_tokenizer(gguf_writer *w, const gguf_file *v, kt_error *err) {
    for (int64_t i = 0; i < gguf_n_kv(v); i++) {
        if (!has_prefix(gguf_kv_key(v, i), "tokenizer.")) continue;
        kt_status st = gguf_writer_copy_kv(w, v, i, err);
        if (st != KT_OK) return st;
    }
    return KT_OK;
}

/* ---- vision towers (mmproj files) ----
 *
 * A Qwen-VL vision tower as llama.cpp's converter writes it
 * (conversion/qwen3vl.py, Qwen3VLVisionModel, over MmprojModel in
 * conversion/base.py) and tools/mtmd/clip.cpp reads it: arch `clip`,
 * projector `qwen3vl_merger`, the Conv3d patch embedding split into two
 * [p, p, 3, width] slices (F16 in an F16 file, else F32: the converter's
 * tensor_force_quant), a learned position embedding (always F32:
 * V_ENC_EMBD_POS), blocks of LayerNorm (weight and bias) -> fused QKV with
 * bias -> out -> LayerNorm -> up -> GELU-tanh -> down (biases), the merger
 * (post_ln over the width, mm.0 [4w, 4w], GELU, mm.2 to the text model's
 * n_embd) and, for Qwen3-VL, DeepStack mergers after some blocks.
 *
 * Where the numbers come from: the models' config.json vision_config
 * (depth, hidden_size, intermediate_size, num_heads, patch_size 16,
 * spatial_merge_size 2, temporal_patch_size 2, num_position_embeddings
 * 2304 = 48 x 48, out_hidden_size, deepstack_visual_indexes), image mean
 * and std 0.5 (preprocessor_config.json), the layer-norm epsilon the
 * converter takes from text_config.rms_norm_eps (1e-6). Uncertain, from
 * memory of the Hugging Face configs (no network here): that Qwen 3.5 4B's
 * vision_config equals Qwen3-VL-4B's (24 x 1024, 16 heads, FFN 4096, out
 * 2560) with no DeepStack indexes, and Qwen3-VL-4B's indexes [5, 11, 17].
 * The arithmetic per patch is what counts for speed, and that does not
 * depend on the values. Weights are N(0, 0.02) as above, norm weights 1,
 * biases 0. */

static bool tower_has_deepstack(const tower_shape *s, int64_t il) {
    for (int i = 0; i < s->n_deepstack; i++)
        if (s->deepstack[i] == il) return true;
    return false;
}

/* a 1-D tensor of zeros: the tower's biases */
static void add_bias(gen_plan *p, const char *name, int64_t n) {
    add(p, name, n, 0, KT_F32);
    p->t[p->n - 1].zero = true;
}

static void add_tower_block(gen_plan *p, const tower_shape *s, int64_t il, kt_dtype type) {
    const int64_t w = s->width;
    char n[64];
#define BLK(suffix) (snprintf(n, sizeof n, "v.blk.%" PRId64 "." suffix, il), n)
    add(p, BLK("attn_qkv.weight"), w, 3 * w, type);
    add_bias(p, BLK("attn_qkv.bias"), 3 * w);
    add(p, BLK("attn_out.weight"), w, w, type);
    add_bias(p, BLK("attn_out.bias"), w);
    add(p, BLK("ln1.weight"), w, 0, type);
    add(p, BLK("ln2.weight"), w, 0, type);
    add_bias(p, BLK("ln1.bias"), w);
    add_bias(p, BLK("ln2.bias"), w);
    add(p, BLK("ffn_up.weight"), w, s->ffn, type);
    add_bias(p, BLK("ffn_up.bias"), s->ffn);
    add(p, BLK("ffn_down.weight"), s->ffn, w, type);
    add_bias(p, BLK("ffn_down.bias"), w);
#undef BLK
    if (!tower_has_deepstack(s, il)) return;
#define DS(suffix) (snprintf(n, sizeof n, "v.deepstack.%" PRId64 "." suffix, il), n)
    add(p, DS("norm.weight"), 4 * w, 0, type);
    add_bias(p, DS("norm.bias"), 4 * w);
    add(p, DS("fc1.weight"), 4 * w, 4 * w, type);
    add_bias(p, DS("fc1.bias"), 4 * w);
    add(p, DS("fc2.weight"), 4 * w, s->proj_dim, type);
    add_bias(p, DS("fc2.bias"), s->proj_dim);
#undef DS
}

static kt_status make_tower_plan(gen_plan *p, const tower_shape *s, kt_dtype type, kt_error *err) {
    const int64_t w = s->width, pp = s->patch;
    /* the converter keeps the patch embedding F16 only in F16 files */
    const kt_dtype patch_type = type == KT_F16 ? KT_F16 : KT_F32;
    p->n = 0;
    p->t = calloc((size_t)(18 * s->n_layers + 10), sizeof *p->t);
    if (!p->t) return kt_error_set(err, KT_ERR_NOMEM, "out of memory");
    for (int k = 0; k < 2; k++) {
        add3(p, k ? "v.patch_embd.weight.1" : "v.patch_embd.weight", pp, pp, 3, patch_type);
        gen_tensor *t = &p->t[p->n - 1];
        t->n_dims = 4;
        t->dims[3] = w;
    }
    add_bias(p, "v.patch_embd.bias", w);
    add(p, "v.position_embd.weight", w, s->pos_side * s->pos_side, KT_F32);
    for (int64_t il = 0; il < s->n_layers; il++) add_tower_block(p, s, il, type);
    add(p, "v.post_ln.weight", w, 0, type);
    add_bias(p, "v.post_ln.bias", w);
    add(p, "mm.0.weight", 4 * w, 4 * w, type);
    add_bias(p, "mm.0.bias", 4 * w);
    add(p, "mm.2.weight", 4 * w, s->proj_dim, type);
    add_bias(p, "mm.2.bias", s->proj_dim);
    return KT_OK;
}

/* The keys the converter writes for a Qwen3-VL / Qwen 3.5 mmproj (the
 * test goldens' mmproj-qwen3vl files have exactly these). */
static kt_status set_tower_metadata(gguf_writer *w, const tower_shape *s, kt_dtype type, kt_error *err) {
    kt_status st;
    const float half[3] = {0.5f, 0.5f, 0.5f};
    bool ds[1024] = {false};
    for (int i = 0; i < s->n_deepstack; i++)
        if (s->deepstack[i] < s->n_layers) ds[s->deepstack[i]] = true;
#define TRY(call) do { if ((st = (call)) != KT_OK) return st; } while (0)
    TRY(gguf_writer_set_str(w, "general.architecture", "clip", err));
    TRY(gguf_writer_set_str(w, "general.name", s->name, err));
    TRY(gguf_writer_set_u32(w, "general.file_type", cli_llama_ftype(type), err));
    TRY(gguf_writer_set_str(w, "general.type", "mmproj", err));
    TRY(gguf_writer_set_bool(w, "clip.has_vision_encoder", true, err));
    TRY(gguf_writer_set_u32(w, "clip.vision.projection_dim", (uint32_t)s->proj_dim, err));
    TRY(gguf_writer_set_u32(w, "clip.vision.image_size", (uint32_t)(s->pos_side * s->patch), err));
    TRY(gguf_writer_set_u32(w, "clip.vision.patch_size", (uint32_t)s->patch, err));
    TRY(gguf_writer_set_u32(w, "clip.vision.embedding_length", (uint32_t)s->width, err));
    TRY(gguf_writer_set_u32(w, "clip.vision.feed_forward_length", (uint32_t)s->ffn, err));
    TRY(gguf_writer_set_u32(w, "clip.vision.block_count", (uint32_t)s->n_layers, err));
    TRY(gguf_writer_set_u32(w, "clip.vision.attention.head_count", (uint32_t)s->n_heads, err));
    TRY(gguf_writer_set_arr(w, "clip.vision.image_mean", GGUF_F32, half, 3, err));
    TRY(gguf_writer_set_arr(w, "clip.vision.image_std", GGUF_F32, half, 3, err));
    TRY(gguf_writer_set_str(w, "clip.projector_type", "qwen3vl_merger", err));
    TRY(gguf_writer_set_bool(w, "clip.use_gelu", true, err));
    TRY(gguf_writer_set_u32(w, "clip.vision.spatial_merge_size", 2, err));
    TRY(gguf_writer_set_f32(w, "clip.vision.attention.layer_norm_epsilon", 1e-6f, err));
    TRY(gguf_writer_set_arr(w, "clip.vision.is_deepstack_layers", GGUF_BOOL, ds, (uint64_t)s->n_layers, err));
#undef TRY
    return KT_OK;
}


/* ---- writing ---- */

typedef struct gen_args {
    const char *shape_name, *type_name, *vocab, *out, *seed_str, *ctx_str, *layers_str;
    bool no_mtp; /* --no-mtp: a Qwen 3.5 shape without its MTP block */
    const shape *shape;
    shape custom; /* the shape with --ctx-train's context, --layers' layer count */
    const tower_shape *tower; /* a vision tower instead (shapes named mmproj-*) */
    tower_shape tower_custom; /* the tower with --layers' block count */
    kt_dtype type;      /* a plain type: every 2-D weight's; a mix: its base type */
    quant_recipe mix;   /* --type of one of quantize's mixes (mix.mix set): the types per tensor */
    uint64_t seed;
} gen_args;

/* Bytes generated at a time: a tensor is written in parts of about this
 * size, so memory stays small whatever the model (gpt-oss-20b's token
 * embedding is 615 MB in Q8_0). */
#define PART_BYTES ((size_t)16 << 20)

static kt_status check_plan(const gen_plan *p, size_t *max_bytes, int64_t *max_row,
                            kt_error *err) {
    *max_bytes = 0;
    *max_row = 1;
    for (int64_t i = 0; i < p->n; i++) {
        const gen_tensor *t = &p->t[i];
        const size_t row = kt_dtype_row_bytes(t->type, t->dims[0]);
        if (row == 0)
            return kt_error_set(err, KT_ERR_UNSUPPORTED, "tensor '%s': row of %" PRId64
                                " values is not a multiple of the %s block", t->name,
                                t->dims[0], kt_dtype_name(t->type));
        const int64_t per_part = PART_BYTES / row > 0 ? (int64_t)(PART_BYTES / row) : 1;
        const size_t part = row * (size_t)(n_rows(t) < per_part ? n_rows(t) : per_part);
        if (part > *max_bytes) *max_bytes = part; /* the buffer: one part */
        if (t->dims[0] > *max_row) *max_row = t->dims[0];
    }
    return KT_OK;
}

/* Generates and writes the tensors in the order given (their random
 * values follow their index in the plan, not the order), each in parts
 * of whole rows. */
static kt_status write_tensors(gguf_writer *w, const gen_plan *p, const int64_t *order,
                               uint64_t seed, kt_error *err) {
    size_t max_bytes;
    int64_t max_row;
    kt_status st = check_plan(p, &max_bytes, &max_row, err);
    if (st != KT_OK) return st;
    unsigned char *buf = malloc(max_bytes);
    float *scratch = malloc((size_t)max_row * CLI_MAX_THREADS * sizeof(float));
    if (!buf || !scratch) st = kt_error_set(err, KT_ERR_NOMEM, "out of memory (%zu bytes "
                                            "for a part of a tensor)", max_bytes);
    cli_progress prog;
    uint64_t total = 0;
    for (int64_t i = 0; i < p->n; i++) total += tensor_bytes(&p->t[i]);
    cli_progress_start(&prog, total);
    for (int64_t k = 0; k < p->n && st == KT_OK; k++) {
        const int64_t i = order ? order[k] : k;
        const gen_tensor *t = &p->t[i];
        const size_t row = kt_dtype_row_bytes(t->type, t->dims[0]);
        const int64_t per_part = max_bytes / row > 0 ? (int64_t)(max_bytes / row) : 1;
        for (int64_t r0 = 0; r0 < n_rows(t) && st == KT_OK; r0 += per_part) {
            const int64_t n = n_rows(t) - r0 < per_part ? n_rows(t) - r0 : per_part;
            gen_job j = {t, seed, (uint64_t)i, buf, scratch, row, r0, n};
            cli_parallel(n, gen_rows, &j);
            st = gguf_writer_write_part(w, buf, row * (size_t)n, err);
        }
        cli_progress_add(&prog, tensor_bytes(t), t->name);
    }
    cli_progress_end(&prog);
    free(buf);
    free(scratch);
    return st;
}

/* The planned tensors declared (in `order`, NULL: the plan's), the file
 * begun, filled and finished (st: the setup's status so far); frees the
 * writer and the plan. */
static kt_status write_plan(gguf_writer *w, gen_plan *p, const int64_t *order, const gen_args *a,
                            kt_status st, kt_error *err) {
    for (int64_t k = 0; st == KT_OK && k < p->n; k++) {
        const gen_tensor *t = &p->t[order ? order[k] : k];
        st = gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->dims, err);
    }
    if (st == KT_OK) st = gguf_writer_begin(w, a->out, err);
    if (st == KT_OK) st = write_tensors(w, p, order, a->seed, err);
    if (st == KT_OK) st = gguf_writer_finish(w, err);
    gguf_writer_free(w);
    free(p->t);
    return st;
}

/* A mix (--type MXFP4_MOE, Q4_K_M, ...): the plan made in F32, then each
 * tensor given the type `kettle quantize` would give it (quant_mix.c, the
 * same rules and fallbacks), and *order set to llama.cpp's tensor order,
 * which quantize writes. Generating a row and quantizing it is what
 * quantize does to the F32 file's row, so the bytes are the same. */
static kt_status plan_mix(gen_plan *p, const shape *s, const quant_recipe *r, int64_t **order,
                          kt_error *err) {
    gguf_tensor *ts = calloc((size_t)(p->n ? p->n : 1), sizeof *ts);
    if (!ts) return kt_error_set(err, KT_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < p->n; i++) {
        ts[i].name = (gguf_str){p->t[i].name, strlen(p->t[i].name)};
        ts[i].n_dims = p->t[i].n_dims;
        for (int d = 0; d < GGUF_MAX_DIMS; d++) ts[i].dims[d] = d < 4 ? p->t[i].dims[d] : 1;
        ts[i].type = p->t[i].type;
    }
    quant_hparams hp = {.n_layer = s->n_layers + s->n_mtp, .n_head = s->n_heads,
                        .n_head_kv = s->n_kv_heads, .n_expert = s->n_expert};
    snprintf(hp.arch, sizeof hp.arch, "%s", arch_of(s));
    int n_fallback[2];
    *order = quant_tensor_order(ts, p->n);
    kt_dtype *types = *order ? quant_plan_types(ts, p->n, *order, r, &hp, n_fallback) : NULL;
    free(ts);
    if (!types) return kt_error_set(err, KT_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < p->n; i++) p->t[i].type = types[i];
    free(types);
    if (n_fallback[0] || n_fallback[1])
        fprintf(stderr, "kettle gen-model: %d tensor(s) in llama.cpp's fallback types and %d in F16 "
                "(rows not a multiple of the block), as `kettle quantize` writes them\n",
                n_fallback[0], n_fallback[1]);
    return KT_OK;
}

static kt_status write_model(const gen_args *a, const gguf_file *v, int64_t n_vocab,
                             kt_error *err) {
    gen_plan p = {0};
    int64_t *order = NULL;
    const bool mix = a->mix.mix;
    gguf_writer *w = gguf_writer_new(err);
    if (!w) return err ? err->status : KT_ERR_NOMEM;
    const uint32_t ftype = mix ? a->mix.ftype : cli_llama_ftype(a->type);
    kt_status st = set_metadata(w, a->shape, n_vocab, ftype, mix, err);
    if (st == KT_OK) st = copy_tokenizer(w, v, err);
    if (st == KT_OK && mix) /* where quantize writes them: after every other key */
        st = gguf_writer_set_u32(w, "general.quantization_version", GGML_QNT_VERSION, err);
    if (st == KT_OK && mix) st = gguf_writer_set_u32(w, "general.file_type", ftype, err);
    if (st == KT_OK) st = make_plan(&p, a->shape, n_vocab, mix ? KT_F32 : a->type, err);
    if (st == KT_OK && mix) st = plan_mix(&p, a->shape, &a->mix, &order, err);
    st = write_plan(w, &p, order, a, st, err);
    free(order);
    return st;
}


static kt_status write_tower(const gen_args *a, kt_error *err) {
    gen_plan p = {0};
    gguf_writer *w = gguf_writer_new(err);
    if (!w) return err ? err->status : KT_ERR_NOMEM;
    kt_status st = set_tower_metadata(w, a->tower, a->type, err);
    if (st == KT_OK) st = make_tower_plan(&p, a->tower, a->type, err);
    return write_plan(w, &p, NULL, a, st, err);
}

static kt_status run_gen(const gen_args *a, kt_error *err) {
    if (a->tower) return write_tower(a, err); /* a tower has no tokenizer */
    int64_t n_vocab = 0;
    gguf_file *v = gguf_open(a->vocab, err);
    if (!v) return err ? err->status : KT_ERR_IO;
    kt_status st = vocab_size(v, a->vocab, &n_vocab, err);
    if (st == KT_OK) st = write_model(a, v, n_vocab, err);
    gguf_close(v);
    return st;
}

/* ---- arguments ---- */

static int parse_opts(int argc, char **argv, gen_args *a) {
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = cli_opt(CMD, argc, argv, &i, "--shape", &a->shape_name)) ||
            (r = cli_opt(CMD, argc, argv, &i, "--type", &a->type_name)) ||
            (r = cli_opt(CMD, argc, argv, &i, "--vocab", &a->vocab)) ||
            (r = cli_opt(CMD, argc, argv, &i, "--seed", &a->seed_str)) ||
            (r = cli_opt(CMD, argc, argv, &i, "--ctx-train", &a->ctx_str)) ||
            (r = cli_opt(CMD, argc, argv, &i, "--layers", &a->layers_str)) ||
            (r = cli_opt(CMD, argc, argv, &i, "-o", &a->out)) ||
            (r = cli_opt(CMD, argc, argv, &i, "--output", &a->out))) {
            if (r < 0) return 2;
        } else if (!strcmp(argv[i], "--no-mtp")) {
            a->no_mtp = true;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return cli_usage_error(CMD, "unknown option '%s'", argv[i]);
        } else {
            return cli_usage_error(CMD, "unexpected argument '%s'", argv[i]);
        }
    }
    return 0;
}

/* A tower shape (mmproj-*): no vocabulary; --layers cuts its blocks (the
 * DeepStack indexes beyond them are dropped), --ctx-train does not apply. */
static int check_tower_args(gen_args *a) {
    if (a->ctx_str) return cli_usage_error(CMD, "--ctx-train does not apply to a vision tower");
    uint64_t layers = 0;
    if (a->layers_str &&
        (!cli_parse_u64(a->layers_str, &layers) || layers < 1 || layers > (uint64_t)a->tower->n_layers))
        return cli_usage_error(CMD, "invalid --layers '%s' (expected 1 to %" PRId64 ", the blocks of %s)",
                               a->layers_str, a->tower->n_layers, a->tower->name);
    if (a->layers_str) {
        a->tower_custom = *a->tower;
        a->tower_custom.n_layers = (int64_t)layers;
        a->tower = &a->tower_custom;
    }
    return 0;
}

static int unknown_shape(const char *name) {
    char names[1024] = "";
    for (size_t i = 0; i < N_SHAPES; i++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", SHAPES[i].name);
    for (size_t i = 0; i < N_TOWERS; i++)
        snprintf(names + strlen(names), sizeof names - strlen(names), ", %s", TOWERS[i].name);
    return cli_usage_error(CMD, "unknown shape '%s' (expected one of %s)", name, names);
}

static int check_args(gen_args *a) {
    if (!a->shape_name) return cli_usage_error(CMD, "missing --shape NAME");
    if (!a->type_name) return cli_usage_error(CMD, "missing --type TYPE");
    if (!a->out) return cli_usage_error(CMD, "missing -o OUT.gguf");
    for (size_t i = 0; i < N_SHAPES; i++)
        if (!strcmp(a->shape_name, SHAPES[i].name)) a->shape = &SHAPES[i];
    for (size_t i = 0; i < N_TOWERS; i++)
        if (!strcmp(a->shape_name, TOWERS[i].name)) a->tower = &TOWERS[i];
    if (!a->shape && !a->tower) return unknown_shape(a->shape_name);
    int t = cli_parse_out_type(a->type_name);
    if (t < 0 && quant_recipe_is_mix(a->type_name) && quant_recipe_parse(a->type_name, &a->mix))
        t = (int)a->mix.base;
    if (t < 0)
        return cli_usage_error(CMD, "unknown type '%s' (expected one of %s, or a mix: %s)", a->type_name,
                               cli_out_type_list(), cmd_quantize_types(true));
    a->type = (kt_dtype)t;
    if (a->seed_str && !cli_parse_u64(a->seed_str, &a->seed))
        return cli_usage_error(CMD, "invalid seed '%s' (expected a non-negative integer)",
                               a->seed_str);
    if (a->tower && a->mix.mix)
        return cli_usage_error(CMD, "--type %s: a mix is for language models; a vision tower takes one "
                               "type (%s)", a->type_name, cli_out_type_list());
    if (a->tower) return check_tower_args(a);
    if (!a->vocab) return cli_usage_error(CMD, "missing --vocab VOCAB.gguf");
    uint64_t ctx = 0;
    if (a->ctx_str && (!cli_parse_u64(a->ctx_str, &ctx) || ctx < 1 || ctx > UINT32_MAX))
        return cli_usage_error(CMD, "invalid --ctx-train '%s' (expected 1 to %u positions)", a->ctx_str, UINT32_MAX);
    uint64_t layers = 0;
    if (a->layers_str && (!cli_parse_u64(a->layers_str, &layers) || layers < 1 || layers > (uint64_t)a->shape->n_layers))
        return cli_usage_error(CMD, "invalid --layers '%s' (expected 1 to %" PRId64 ", the layers of %s)",
                               a->layers_str, a->shape->n_layers, a->shape->name);
    if (a->no_mtp && !a->shape->n_mtp)
        return cli_usage_error(CMD, "--no-mtp: %s has no MTP block (only the Qwen 3.5 shapes do)", a->shape->name);
    if (a->ctx_str || a->layers_str || a->no_mtp) {
        a->custom = *a->shape;
        if (a->no_mtp) a->custom.n_mtp = 0;
        /* files of real models say 131072 and more: --ctx-train tests their defaults */
        if (a->ctx_str) a->custom.ctx = (int64_t)ctx;
        /* the first N layers of a model too large to write here (block_count says N) */
        if (a->layers_str) a->custom.n_layers = (int64_t)layers;
        if (a->custom.n_deepstack >= a->custom.n_layers) /* DeepStack adds before the last layer */
            a->custom.n_deepstack = a->custom.n_layers - 1;
        a->shape = &a->custom;
    }
    return 0;
}

int cmd_gen_model(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    gen_args a = {0};
    int rc = parse_opts(argc, argv, &a);
    if (!rc) rc = check_args(&a);
    if (rc) return rc;
    kt_error err = {0};
    double t0 = kt_time_ms();
    if (run_gen(&a, &err) != KT_OK) return cli_fail(CMD, &err);
    fprintf(stderr, "kettle gen-model: wrote %s (%s, %s) in %.1f s\n", a.out, a.tower ? a.tower->name : a.shape->name,
            a.mix.mix ? a.type_name : kt_dtype_name(a.type), (kt_time_ms() - t0) / 1e3);
    return 0;
}
