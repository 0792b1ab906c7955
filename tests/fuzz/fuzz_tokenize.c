/*
 * fuzz_tokenize.c - libFuzzer target: the tokenizers on arbitrary bytes
 * (invalid UTF-8 included), as raw user text and with control tokens
 * matched, then the ids decoded back through the streaming detokenizer.
 * Vocabularies load once (LLVMFuzzerInitialize): SentencePiece (llama
 * SPM), byte-level BPE (llama 3 and Qwen 2) and WordPiece (BERT), from
 * KT_SHARED_DIR (compile time; the environment variable of that name
 * overrides it).
 *
 * Goes through text/vocab.h rather than kettle.h's kt_tokenize: that is
 * what kt_tokenize calls, and a vocabulary-only GGUF has no weights to
 * load as a kt_model.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "gguf/gguf.h"
#include "text/detok.h"
#include "text/vocab.h"

#ifndef KT_SHARED_DIR
#define KT_SHARED_DIR "../shared"
#endif

#define MAX_IDS 4096 /* more ids than that: the KT_ERR_ARG path is fuzzed too */

static const char *const VOCABS[] = {
    "ggml-vocab-llama-spm.gguf", "ggml-vocab-llama-bpe.gguf", "ggml-vocab-qwen2.gguf",
    "ggml-vocab-bert-bge.gguf",
};
#define N_VOCABS (sizeof VOCABS / sizeof VOCABS[0])
static kt_vocab *vocabs[N_VOCABS];

static kt_vocab *load(const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/vocab/%s", dir, name);
    kt_error err = {0};
    gguf_file *f = gguf_open(path, &err);
    kt_vocab *v = f ? kt_vocab_from_gguf(f, &err) : NULL;
    gguf_close(f);
    if (!v) fprintf(stderr, "fuzz_tokenize: %s: %s\n", path, err.msg);
    return v;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *dir = getenv("KT_SHARED_DIR");
    if (!dir) dir = KT_SHARED_DIR;
    for (size_t i = 0; i < N_VOCABS; i++)
        if (!(vocabs[i] = load(dir, VOCABS[i]))) exit(1); /* setup, not input: nothing to fuzz without them */
    return 0;
}

static void detok(const kt_vocab *v, const int32_t *ids, int n) {
    kt_text_detok *d = kt_text_detok_new(v, true);
    if (!d) return;
    kt_text_detok_show_control(d, n % 2 == 1);
    volatile size_t sink = 0;
    for (int i = 0; i < n; i++) sink += kt_text_detok_push(d, ids[i])[0];
    sink += kt_text_detok_flush(d)[0];
    (void)sink;
    kt_text_detok_free(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int32_t ids[MAX_IDS];
    for (size_t i = 0; i < N_VOCABS; i++) {
        for (int specials = 0; specials < 2; specials++) {
            kt_error err = {0};
            int n = kt_vocab_encode_ex(vocabs[i], (const char *)data, size, specials == 1 && kt_vocab_bos(vocabs[i]) >= 0, specials == 1, ids,
                                       MAX_IDS, &err);
            if (n > 0) detok(vocabs[i], ids, n);
        }
    }
    return 0;
}
