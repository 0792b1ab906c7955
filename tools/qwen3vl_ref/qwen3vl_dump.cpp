// qwen3vl_dump.cpp - llama.cpp's qwen3vl text model after a Qwen3-VL image
// with DeepStack, dumped as JSON: the reference kettle's qwen3vl model
// (src/model/deepstack.c, the engine's image rows) is checked against
// (tests/test_vision_model.c reads tests/data/qwen3vl/*.json).
//
// Why a program of its own: the shared goldens have no DeepStack tower and
// no qwen3vl text model. This runs libmtmd as llama-mtmd-cli does, without
// a chat template: the prompt verbatim (one <__media__> marker), split by
// mtmd_tokenize into text, image, text; the text before decoded, the image
// encoded (rows of n_embd * (1 + n_deepstack): mtmd_get_output_embd) and
// decoded by mtmd_helper_decode_image_chunk (M-RoPE grid positions), then
// the text after it with logits at every token, then STEPS greedy tokens
// one at a time. Each logits row goes out as the goldens' positions are
// (golden/arch/README.md): pos, token (the one that follows it), the
// log-sum-exp, the top TOP (id, logit). One thread, F32 KV, flash
// attention off, CPU only, as the goldens were made.
//
// Build (llama.cpp de3ff81's native static build in LLAMA_DIR/build):
//   g++ -std=c++17 -O2 tools/qwen3vl_ref/qwen3vl_dump.cpp -I$LLAMA_DIR/include -I$LLAMA_DIR/ggml/include \
//     -I$LLAMA_DIR/tools/mtmd $LLAMA_DIR/build/tools/mtmd/libmtmd.a $LLAMA_DIR/build/src/libllama.a \
//     $LLAMA_DIR/build/ggml/src/libggml.a $LLAMA_DIR/build/ggml/src/libggml-cpu.a \
//     $LLAMA_DIR/build/ggml/src/libggml-base.a -fopenmp -lpthread -o qwen3vl_dump
// Run: qwen3vl_dump MODEL.gguf MMPROJ.gguf IMAGE PROMPT OUT.json
// (with QWEN3VL_EMBD_OUT=FILE also the image's rows as libmtmd hands them to
// the text model: float32 [n_tokens][n_embd * (1 + n_deepstack)])
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "llama.h"
#include "mtmd-helper.h"
#include "mtmd.h"

static const int STEPS = 8, TOP = 8;

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
    fprintf(f, "]}%s\n", last ? "" : ",");
}

static int argmax(const float *l, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    return b;
}

static void ids_json(FILE *f, const char *key, const llama_token *t, size_t n) {
    fprintf(f, "  \"%s\": [", key);
    for (size_t i = 0; i < n; i++) fprintf(f, "%s%d", i ? ", " : "", t[i]);
    fprintf(f, "],\n");
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: qwen3vl_dump MODEL.gguf MMPROJ.gguf IMAGE PROMPT OUT.json\n");
        return 2;
    }
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) return fprintf(stderr, "cannot load %s\n", argv[1]), 1;
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 1024, cp.n_batch = 1024, cp.n_ubatch = 1024, cp.n_threads = 1, cp.n_threads_batch = 1;
    cp.type_k = GGML_TYPE_F32, cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    llama_context *ctx = llama_init_from_model(model, cp);
    mtmd_context_params mcp = mtmd_context_params_default();
    mcp.use_gpu = false, mcp.n_threads = 1, mcp.warmup = false, mcp.print_timings = false;
    mtmd_context *mctx = mtmd_init_from_file(argv[2], model, mcp);
    if (!ctx || !mctx) return fprintf(stderr, "cannot start llama.cpp / libmtmd\n"), 1;
    mtmd_helper_bitmap_wrapper bw = mtmd_helper_bitmap_init_from_file(mctx, argv[3], false, mtmd_helper_init_opt_default());
    if (!bw.bitmap) return fprintf(stderr, "cannot read %s\n", argv[3]), 1;
    mtmd_input_text txt = {argv[4], strlen(argv[4]), false, true};
    mtmd_input_chunks *chunks = mtmd_input_chunks_init();
    const mtmd_bitmap *bms[1] = {bw.bitmap};
    if (mtmd_tokenize(mctx, chunks, &txt, bms, 1) || mtmd_input_chunks_size(chunks) != 3)
        return fprintf(stderr, "the prompt must be text, one <__media__>, text\n"), 1;
    const mtmd_input_chunk *c0 = mtmd_input_chunks_get(chunks, 0), *ci = mtmd_input_chunks_get(chunks, 1),
                           *c2 = mtmd_input_chunks_get(chunks, 2);
    size_t n_before = 0, n_after = 0;
    const llama_token *before = mtmd_input_chunk_get_tokens_text(c0, &n_before);
    const llama_token *after = mtmd_input_chunk_get_tokens_text(c2, &n_after);
    llama_pos n_past = 0;
    if (mtmd_helper_eval_chunk_single(mctx, ctx, c0, 0, 0, 1024, false, &n_past))
        return fprintf(stderr, "decode failed (text before)\n"), 1;
    const llama_pos p_img = n_past;
    if (mtmd_encode_chunk(mctx, ci)) return fprintf(stderr, "encode failed\n"), 1;
    float *embd = mtmd_get_output_embd(mctx);
    if (const char *ep = getenv("QWEN3VL_EMBD_OUT")) { // the image's rows, float32 [n_tokens][n_embd_inp]
        FILE *fe = fopen(ep, "wb");
        const size_t n = (size_t)llama_model_n_embd_inp(model) * mtmd_input_chunk_get_n_tokens(ci);
        if (!fe || fwrite(embd, sizeof(float), n, fe) != n || fclose(fe)) return fprintf(stderr, "cannot write %s\n", ep), 1;
    }
    if (mtmd_helper_decode_image_chunk(mctx, ctx, ci, embd, n_past, 0, 1024, &n_past, nullptr, nullptr))
        return fprintf(stderr, "decode failed (image)\n"), 1;
    const mtmd_image_tokens *it = mtmd_input_chunk_get_tokens_image(ci);
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    FILE *f = fopen(argv[5], "w");
    if (!f) return fprintf(stderr, "cannot write %s\n", argv[5]), 1;
    fprintf(f, "{\n  \"model\": \"%s\", \"mmproj\": \"%s\", \"image\": \"%s\",\n", argv[1], argv[2], argv[3]);
    fprintf(f, "  \"n_embd_inp\": %d, \"n_embd\": %d,\n", llama_model_n_embd_inp(model), llama_model_n_embd(model));
    fprintf(f, "  \"image_pos0\": %d, \"image_tokens\": %zu, \"image_n_pos\": %d, \"grid\": [%zu, %zu],\n", p_img,
            mtmd_input_chunk_get_n_tokens(ci), (int)mtmd_input_chunk_get_n_pos(ci),
            (size_t)mtmd_image_tokens_get_nx(it), (size_t)mtmd_image_tokens_get_ny(it));
    ids_json(f, "before_ids", before, n_before);
    ids_json(f, "after_ids", after, n_after);
    // the text after the image, teacher-forced, logits at every token
    llama_batch b = llama_batch_init(1024, 0, 1);
    for (size_t i = 0; i < n_after; i++) {
        b.token[i] = after[i], b.pos[i] = n_past + (llama_pos)i, b.n_seq_id[i] = 1, b.seq_id[i][0] = 0;
        b.logits[i] = 1;
    }
    b.n_tokens = (int)n_after;
    if (llama_decode(ctx, b)) return fprintf(stderr, "decode failed (text after)\n"), 1;
    std::vector<std::vector<float>> rows;
    for (size_t i = 0; i < n_after; i++) {
        const float *l = llama_get_logits_ith(ctx, (int)i);
        rows.emplace_back(l, l + n_vocab);
    }
    n_past += (llama_pos)n_after;
    std::vector<llama_token> gen;
    for (int s = 0; s < STEPS; s++) {
        llama_token t = argmax(rows.back().data(), n_vocab);
        gen.push_back(t);
        if (s == STEPS - 1) break;
        b.token[0] = t, b.pos[0] = n_past++, b.n_seq_id[0] = 1, b.seq_id[0][0] = 0, b.logits[0] = 1, b.n_tokens = 1;
        if (llama_decode(ctx, b)) return fprintf(stderr, "decode failed (generation)\n"), 1;
        const float *l = llama_get_logits_ith(ctx, 0);
        rows.emplace_back(l, l + n_vocab);
    }
    ids_json(f, "gen_ids", gen.data(), gen.size());
    fprintf(f, "  \"positions\": [\n");
    const llama_pos p_after = p_img + mtmd_input_chunk_get_n_pos(ci);
    for (size_t r = 0; r < rows.size(); r++) {
        const int next = r + 1 < n_after ? after[r + 1] : gen[r + 1 - n_after];
        dump_row(f, rows[r].data(), n_vocab, p_after + (int)r, next, r + 1 == rows.size());
    }
    fprintf(f, "  ]\n}\n");
    fclose(f);
    llama_batch_free(b);
    mtmd_input_chunks_free(chunks);
    mtmd_bitmap_free(bw.bitmap);
    mtmd_free(mctx);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
