// mtp_dump.cpp - llama.cpp's MTP head on a qwen35 file, dumped as JSON: the
// reference kettle's MTP block (src/model/mtp.c) is checked against
// (tests/test_mtp.c reads tests/data/mtp/*.json).
//
// Why a program of its own: llama.cpp's goldens (../shared/golden) stop at
// the trunk's logits; the MTP head only runs through common/speculative.cpp's
// draft-mtp, which this mirrors step for step with the library's calls:
//   1. the target decodes the prompt x_0..x_{N-1} (one batch) with
//      llama_set_embeddings_nextn(ctx_tgt, true, unmasked): h_p for every p;
//   2. an MTP context (LLAMA_CONTEXT_TYPE_MTP, its own one-layer KV) decodes
//      the same tokens at the same positions, row p with h_{p-1} (zeros at
//      p = 0): process()'s "shift the tgt embeddings to the right by one";
//      every row's logits are dumped (row p predicts x_{p+1});
//   3. draft(): the target's greedy next token at N with h_{N-1}, then
//      STEPS - 1 chained rows, each the previous row's argmax at the next
//      position with the MTP's own h_nextn row; those logits are dumped too.
// One thread, F32 KV, flash attention off, as the goldens were made.
//
// Build (llama.cpp de3ff81's native static build in LLAMA_DIR/build):
//   g++ -std=c++17 -O2 tools/mtp_ref/mtp_dump.cpp -I$LLAMA_DIR/include -I$LLAMA_DIR/ggml/include \
//     -I$LLAMA_DIR/src $LLAMA_DIR/build/src/libllama.a $LLAMA_DIR/build/ggml/src/libggml.a \
//     $LLAMA_DIR/build/ggml/src/libggml-cpu.a $LLAMA_DIR/build/ggml/src/libggml-base.a -fopenmp -lpthread -o mtp_dump
// Run: mtp_dump MODEL.gguf OUT.json
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>

#include "llama.h"
#include "llama-ext.h"

static const int N = 24, STEPS = 3, TOP = 8, PROBES = 64;

static void dump_row(FILE *f, const float *l, int n_vocab, int pos, int token, bool last) {
    double mx = -INFINITY;
    for (int i = 0; i < n_vocab; i++) mx = std::max(mx, (double)l[i]);
    double s = 0;
    for (int i = 0; i < n_vocab; i++) s += exp((double)l[i] - mx);
    std::vector<int> idx(n_vocab);
    for (int i = 0; i < n_vocab; i++) idx[i] = i;
    std::partial_sort(idx.begin(), idx.begin() + TOP, idx.end(),
                      [&](int a, int b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    fprintf(f, "    {\"pos\": %d, \"token\": %d, \"lse\": %.9g, \"top\": [", pos, token, mx + log(s));
    for (int i = 0; i < TOP; i++) fprintf(f, "%s[%d, %.9g]", i ? ", " : "", idx[i], l[idx[i]]);
    fprintf(f, "], \"probe\": [");
    for (int i = 0; i < PROBES; i++) fprintf(f, "%s%.9g", i ? ", " : "", l[(long)i * n_vocab / PROBES]);
    fprintf(f, "]}%s\n", last ? "" : ",");
}

static int argmax(const float *l, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (l[i] > l[b]) b = i;
    return b;
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: mtp_dump MODEL.gguf OUT.json\n"); return 2; }
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.load_mtp = true;
    llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
    const llama_vocab *vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab), n_embd = llama_model_n_embd(model);
    if (llama_model_n_layer_nextn(model) < 1) { fprintf(stderr, "the model has no MTP layer\n"); return 1; }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 256, cp.n_batch = 256, cp.n_ubatch = 256, cp.n_threads = 1, cp.n_threads_batch = 1;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED, cp.type_k = GGML_TYPE_F32, cp.type_v = GGML_TYPE_F32;
    llama_context *tgt = llama_init_from_model(model, cp);
    llama_context_params dp = cp;
    dp.ctx_type = LLAMA_CONTEXT_TYPE_MTP, dp.n_rs_seq = 0, dp.ctx_other = tgt;
    llama_context *dft = llama_init_from_model(model, dp);
    if (!tgt || !dft) { fprintf(stderr, "cannot make the contexts\n"); return 1; }
    llama_set_embeddings_nextn(tgt, true, false);
    llama_set_embeddings_nextn(dft, true, true);

    std::vector<llama_token> ids(N);
    for (int i = 0; i < N; i++) ids[i] = 1 + (int)((i * 977L + 13) % (n_vocab - 1));
    llama_batch b = llama_batch_init(256, n_embd, 1);
    b.token = (llama_token *)malloc(sizeof(llama_token) * 256); // both ids and rows, as draft-mtp does
    b.n_tokens = N;
    for (int i = 0; i < N; i++) b.token[i] = ids[i], b.pos[i] = i, b.n_seq_id[i] = 1, b.seq_id[i][0] = 0, b.logits[i] = 1;
    float *keep_embd = b.embd;
    b.embd = nullptr; // the target reads ids only
    if (llama_decode(tgt, b)) { fprintf(stderr, "target decode failed\n"); return 1; }
    b.embd = keep_embd;
    const int next = argmax(llama_get_logits_ith(tgt, N - 1), n_vocab);
    const float *h = llama_get_embeddings_nextn(tgt);
    std::vector<float> h_last(h + (size_t)(N - 1) * n_embd, h + (size_t)N * n_embd);
    memset(b.embd, 0, sizeof(float) * n_embd);
    memcpy(b.embd + n_embd, h, sizeof(float) * n_embd * (N - 1));
    if (llama_decode(dft, b)) { fprintf(stderr, "MTP decode failed\n"); return 1; }

    FILE *f = fopen(argv[2], "w");
    if (!f) { perror(argv[2]); return 1; }
    fprintf(f, "{\n  \"source\": \"llama.cpp de3ff81 draft-mtp path (tools/mtp_ref/mtp_dump.cpp), 1 thread, F32 KV, no flash attention\",\n");
    fprintf(f, "  \"n_vocab\": %d, \"n_embd\": %d, \"top\": %d, \"probes\": %d,\n  \"prompt_ids\": [", n_vocab, n_embd, TOP, PROBES);
    for (int i = 0; i < N; i++) fprintf(f, "%s%d", i ? ", " : "", ids[i]);
    fprintf(f, "],\n  \"target_next\": %d,\n  \"rows\": [\n", next);
    for (int i = 0; i < N; i++) dump_row(f, llama_get_logits_ith(dft, i), n_vocab, i, ids[i], i == N - 1);
    // llama.cpp's own h rows (after the output norm), exact in decimal: kettle runs its MTP block on
    // them too, which checks the block alone (the trunks differ slightly on this random file)
    fprintf(f, "  ],\n  \"target_h\": [\n");
    for (int i = 0; i < N; i++) {
        fprintf(f, "    [");
        for (int j = 0; j < n_embd; j++) fprintf(f, "%s%.9g", j ? ", " : "", h[(size_t)i * n_embd + j]);
        fprintf(f, "]%s\n", i == N - 1 ? "" : ",");
    }
    fprintf(f, "  ],\n  \"target_rows\": [\n"); // the trunk's own logits: how far the h rows agree
    for (int i = 0; i < N; i++) dump_row(f, llama_get_logits_ith(tgt, i), n_vocab, i, ids[i], i == N - 1);
    fprintf(f, "  ],\n  \"chain\": [\n");
    // draft(): the target's next token at N with h_{N-1}, then chained on the MTP's own h
    std::vector<float> hrow = h_last;
    llama_token tok = next;
    for (int s = 0; s < STEPS; s++) {
        b.n_tokens = 1;
        b.token[0] = tok, b.pos[0] = N + s, b.n_seq_id[0] = 1, b.seq_id[0][0] = 0, b.logits[0] = 1;
        memcpy(b.embd, hrow.data(), sizeof(float) * n_embd);
        if (llama_decode(dft, b)) { fprintf(stderr, "MTP draft decode failed\n"); return 1; }
        const float *l = llama_get_logits_ith(dft, 0);
        dump_row(f, l, n_vocab, N + s, tok, s == STEPS - 1);
        const float *hn = llama_get_embeddings_nextn_ith(dft, 0);
        hrow.assign(hn, hn + n_embd);
        tok = argmax(l, n_vocab);
    }
    fprintf(f, "  ]\n}\n");
    fclose(f);
    llama_free(dft), llama_free(tgt), llama_model_free(model);
    return 0;
}
