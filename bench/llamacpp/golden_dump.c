/*
 * golden_dump.c - llama.cpp's logits on a model file, in the JSON format of
 * ../shared/golden (see its README): the prompt's ids, then N greedy
 * tokens one at a time, and for every position the log-sum-exp of the
 * logits and the top 8 [id, logit] pairs. kettle's tests compare against
 * files made with it (tests/data/golden-*.json) for the weight types whose
 * reference files ../shared does not have.
 *
 * It runs llama.cpp as the shared goldens were made: one thread, F32 KV
 * cache, flash attention off, the prompt in one batch. A development tool,
 * not part of kettle's build: it links the llama.cpp build that
 * docs/PERFORMANCE.md describes (llama.h is a C header):
 *
 *   L=/work/peer/llsrc
 *   cc -O2 -std=c11 -I$L/include -I$L/ggml/include bench/llamacpp/golden_dump.c \
 *      -L$L/build/bin -lllama -lggml -lggml-base -Wl,-rpath,$L/build/bin -o /tmp/golden_dump
 *   /tmp/golden_dump MODEL.gguf PROMPT.txt 32 > golden.json
 *
 * GOLDEN_NO_REPACK=1 in the environment turns off llama.cpp's repacked
 * weight layouts (model param use_extra_bufts).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

#define TOP 8

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (!s || fread(s, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        free(s);
        return NULL;
    }
    fclose(f);
    s[n] = 0;
    while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == '\r')) s[--n] = 0;
    return s;
}

/* JSON string body: quotes, backslashes and control bytes escaped. */
static void put_json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

static void put_position(const float *logits, int n_vocab, int first) {
    double max = -INFINITY, sum = 0;
    for (int i = 0; i < n_vocab; i++) max = logits[i] > max ? logits[i] : max;
    for (int i = 0; i < n_vocab; i++) sum += exp(logits[i] - max);
    int top[TOP];
    for (int k = 0; k < TOP; k++) {
        top[k] = -1;
        for (int i = 0; i < n_vocab; i++) {
            int taken = 0;
            for (int j = 0; j < k; j++) taken |= top[j] == i;
            if (!taken && (top[k] < 0 || logits[i] > logits[top[k]])) top[k] = i;
        }
    }
    printf("%s\n  {\"lse\": %.9g, \"top\": [", first ? "" : ",", max + log(sum));
    for (int k = 0; k < TOP; k++) printf("%s[%d, %.9g]", k ? ", " : "", top[k], logits[top[k]]);
    printf("]}");
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) best = x[i] > x[best] ? i : best;
    return best;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s MODEL.gguf PROMPT.txt N_GEN\n", argv[0]);
        return 2;
    }
    const int n_gen = atoi(argv[3]);
    char *prompt = read_text(argv[2]);
    if (!prompt || n_gen < 1) {
        fprintf(stderr, "cannot read %s (or N_GEN < 1)\n", argv[2]);
        return 1;
    }
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    /* GOLDEN_NO_REPACK=1: ggml's plain kernels instead of its repacked
     * ones, to see how far the two orders of summing are apart */
    if (getenv("GOLDEN_NO_REPACK")) mp.use_extra_bufts = false;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) return 1;
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    llama_token ids[4096];
    const int n_prompt = llama_tokenize(vocab, prompt, (int)strlen(prompt), ids, 4096 - n_gen, true, false);
    if (n_prompt <= 0) return 1;
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(n_prompt + n_gen + 8);
    cp.n_batch = cp.n_ubatch = (uint32_t)n_prompt;
    cp.n_threads = cp.n_threads_batch = 1;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.type_k = cp.type_v = GGML_TYPE_F32;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) return 1;

    struct llama_batch b = llama_batch_init(n_prompt, 0, 1);
    for (int i = 0; i < n_prompt; i++) {
        b.token[i] = ids[i], b.pos[i] = i, b.n_seq_id[i] = 1, b.seq_id[i][0] = 0, b.logits[i] = 1;
    }
    b.n_tokens = n_prompt;
    if (llama_decode(ctx, b)) return 1;
    printf("{\"model\": ");
    put_json_string(strrchr(argv[1], '/') ? strrchr(argv[1], '/') + 1 : argv[1]);
    printf(", \"prompt\": ");
    put_json_string(prompt);
    printf(", \"n_vocab\": %d, \"prompt_ids\": [", n_vocab);
    for (int i = 0; i < n_prompt; i++) printf("%s%d", i ? ", " : "", ids[i]);
    printf("], \"positions\": [");
    for (int i = 0; i < n_prompt; i++) put_position(llama_get_logits_ith(ctx, i), n_vocab, i == 0);
    llama_token gen[4096];
    gen[0] = argmax(llama_get_logits_ith(ctx, n_prompt - 1), n_vocab);
    for (int g = 1; g < n_gen; g++) {
        struct llama_batch one = llama_batch_get_one(&gen[g - 1], 1);
        if (llama_decode(ctx, one)) return 1;
        const float *l = llama_get_logits_ith(ctx, -1);
        put_position(l, n_vocab, 0);
        gen[g] = argmax(l, n_vocab);
    }
    printf("\n], \"gen_ids\": [");
    for (int g = 0; g < n_gen; g++) printf("%s%d", g ? ", " : "", gen[g]);
    printf("]}\n");
    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(model);
    free(prompt);
    return 0;
}
