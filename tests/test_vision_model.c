/*
 * test_vision_model.c - the text models of vision-language models against
 * llama.cpp's goldens: image embeddings placed at their tokens with the
 * M-RoPE grid positions, the text after the image on its shifted
 * positions, teacher-forced logits within golden/arch/README.md's
 * tolerances.
 *
 * The vision goldens (vision-T-P-IMG.json) were made by libmtmd: the text
 * before the image, the image's embeddings (the .embd.f32 beside them),
 * then the text after it and 16 greedy tokens. This test feeds the
 * shipped embeddings, so it checks the model's side (llm_batch.embd and
 * pos_mrope, qwen2vl's sequential sections and Qwen 3.5's interleaved
 * ones); the tower's own embeddings are test_vision's. Image token i of a
 * grid nx x ny starting at position p0 sits at (p0, p0 + i / nx,
 * p0 + i % nx, 0); the text after it starts at p0 + max(nx, ny).
 *
 * The F32 text models are not shipped; their goldens are checked on the
 * F16 files widened to F32 (the F32 models are those weights: README).
 * llama.cpp's qwen2vl ignores the file's RMSNorm eps (caveat 14: eps 0);
 * kettle uses the file's 1e-6, so these checks set the config's eps to 0
 * to compare the arithmetic, and say so.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "engine/engine.h"
#include "engine/images.h"
#include "engine/model_internal.h"
#include "kettle.h"
#include "model/forward.h"
#include "testutil.h"

/* A sequence to teacher-force: tokens (image tokens: embd rows), their
 * M-RoPE positions, and which want logits. */
typedef struct tf_seq {
    int n;
    int32_t *tokens;
    const float **embd;
    int *pos4;
    bool *want;
} tf_seq;

static void tf_seq_alloc(tf_seq *s, int n) {
    s->n = n;
    s->tokens = tu_xmalloc(sizeof(int32_t) * (size_t)n);
    s->embd = tu_xmalloc(sizeof(float *) * (size_t)n);
    s->pos4 = tu_xmalloc(sizeof(int) * 4 * (size_t)n);
    s->want = tu_xmalloc(sizeof(bool) * (size_t)n);
}

static void tf_seq_free(tf_seq *s) {
    free(s->tokens), free(s->embd), free(s->pos4), free(s->want);
}

static void put_text(tf_seq *s, int k, int32_t id, int p, bool want) {
    s->tokens[k] = id, s->embd[k] = NULL, s->want[k] = want;
    for (int c = 0; c < 3; c++) s->pos4[4 * k + c] = p;
    s->pos4[4 * k + 3] = 0;
}

/* Runs s through the model in chunks; returns the logits of the tokens
 * that want them, in order (caller frees). */
static float *tf_run(const llm_model *llm, const tf_seq *s, int n_threads) {
    kt_error err = {0};
    kv_pool_params kp = llm_kv_params(llm, 1, s->n, KV_F32);
    kv_pool *kv = kv_pool_new(&kp, &err);
    llm_work *w = llm_work_new(llm, s->n, &err);
    kt_pool *pool = kt_pool_new(n_threads, &err);
    assert_true(kv && w && pool);
    kv_seq *seq = kv_seq_new(kv, &err);
    assert_non_null(seq);
    assert_int_equal(kv_seq_append(seq, s->n, &err), KT_OK);
    int n_want = 0;
    for (int k = 0; k < s->n; k++) n_want += s->want[k];
    const size_t n_vocab = (size_t)llm->cfg.n_vocab;
    float *logits = tu_xmalloc(sizeof(float) * n_vocab * (size_t)(n_want ? n_want : 1));
    int *pos = tu_xmalloc(sizeof(int) * (size_t)s->n);
    kv_seq **seqs = tu_xmalloc(sizeof(kv_seq *) * (size_t)s->n);
    for (int k = 0; k < s->n; k++) pos[k] = k, seqs[k] = seq;
    int done_rows = 0;
    for (int t0 = 0; t0 < s->n; t0 += LLM_MAX_BATCH) {
        const int n = s->n - t0 < LLM_MAX_BATCH ? s->n - t0 : LLM_MAX_BATCH;
        llm_batch b = {.n_tokens = n, .tokens = s->tokens + t0, .pos = pos + t0, .seq = seqs + t0,
                       .logits = s->want + t0, .pos_mrope = s->pos4 + 4 * (size_t)t0, .embd = s->embd + t0};
        llm_forward(llm, w, pool, &b, logits + (size_t)done_rows * n_vocab);
        for (int k = t0; k < t0 + n; k++) done_rows += s->want[k];
    }
    free(pos), free(seqs);
    kv_seq_free(seq);
    kt_pool_free(pool), llm_work_free(w), kv_pool_free(kv);
    return logits;
}

/* The golden's logits against ours; returns the max |diff| over its top
 * entries (no check: control runs, which must differ). */
static double compare(json_t *positions, const float *logits, int n_vocab, double tol, bool check) {
    double maxdiff = 0;
    for (size_t p = 0; p < json_array_size(positions); p++) {
        const float *row = logits + p * (size_t)n_vocab;
        json_t *pos = json_array_get(positions, p), *top = json_object_get(pos, "top");
        if (check) {
            double d = tu_golden_check_position(row, n_vocab, pos, tol, (int)p);
            if (d > maxdiff) maxdiff = d;
            continue;
        }
        for (size_t j = 0; j < json_array_size(top); j++) {
            json_t *e = json_array_get(top, j);
            double d = fabs(row[json_integer_value(json_array_get(e, 0))] - json_real_value(json_array_get(e, 1)));
            if (d > maxdiff) maxdiff = d;
        }
    }
    return maxdiff;
}

static kt_model *load_text_model(const char *file, bool eps0) {
    kt_error err = {0};
    kt_model *m = kt_model_load_ex(tu_shared(file), KT_LOAD_MMAP, &err);
    if (!m) fail_msg("%s: %s", file, err.msg);
    if (eps0) ((llm_model *)m->llm)->cfg.rms_eps = 0; /* llama.cpp's qwen2vl (caveat 14) */
    return m;
}

/* One vision golden: T (qwen3vl / qwen25vl), P (F32 / F16), IMG. With
 * flat set, the image tokens go on 1-D positions (the README's negative
 * control): returns the max |diff| either way. */
static double check_vision_golden(const char *T, const char *P, const char *img, double tol, bool flat) {
    const bool qwen2vl = !strcmp(T, "qwen25vl");
    char rel[256];
    snprintf(rel, sizeof rel, "golden/arch/vision-%s-%s-%s.json", T, P, img);
    json_error_t jerr;
    json_t *g = json_load_file(tu_shared(rel), 0, &jerr);
    if (!g) fail_msg("%s: %s", rel, jerr.text);
    kt_model *m = load_text_model(qwen2vl ? "golden/arch/qwen2vl-F16.gguf" : "golden/arch/qwen35-F16.gguf", qwen2vl);
    const llm_model *llm = m->llm;
    const int n_embd = llm->cfg.n_embd, n_vocab = llm->cfg.n_vocab;
    assert_int_equal(json_integer_value(json_object_get(g, "n_embd")), n_embd);

    json_t *chunks = json_object_get(g, "chunks"), *image = json_array_get(chunks, 1);
    assert_string_equal(json_string_value(json_object_get(image, "type")), "image");
    int n_before, n_after, n_gen;
    int32_t *before = tu_json_ids(json_object_get(json_array_get(chunks, 0), "ids"), &n_before);
    int32_t *after = tu_json_ids(json_object_get(g, "after_ids"), &n_after);
    int32_t *gen = tu_json_ids(json_object_get(g, "gen_ids"), &n_gen);
    const int p0 = (int)json_integer_value(json_object_get(image, "pos0"));
    const int n_img = (int)json_integer_value(json_object_get(image, "n_tokens"));
    const int n_pos = (int)json_integer_value(json_object_get(image, "n_pos"));
    json_t *grid = json_object_get(image, "grid");
    const int nx = (int)json_integer_value(json_array_get(grid, 0)), ny = (int)json_integer_value(json_array_get(grid, 1));
    assert_int_equal(nx * ny, n_img);
    assert_int_equal(n_pos, nx > ny ? nx : ny);
    assert_int_equal(p0, n_before);

    snprintf(rel, sizeof rel, "golden/arch/vision-%s-%s-%s.embd.f32", T, P, img);
    size_t bytes;
    float *embd = (float *)tu_read_file(tu_shared(rel), &bytes);
    assert_non_null(embd);
    assert_int_equal(bytes, sizeof(float) * (size_t)n_img * (size_t)n_embd);

    tf_seq s;
    tf_seq_alloc(&s, n_before + n_img + n_after + n_gen - 1);
    int k = 0;
    for (int i = 0; i < n_before; i++, k++) put_text(&s, k, before[i], i, false);
    for (int i = 0; i < n_img; i++, k++) {
        put_text(&s, k, 0, 0, false);
        s.embd[k] = embd + (size_t)i * n_embd;
        if (flat) {
            for (int c = 0; c < 3; c++) s.pos4[4 * k + c] = p0 + i;
        } else {
            s.pos4[4 * k] = p0, s.pos4[4 * k + 1] = p0 + i / nx, s.pos4[4 * k + 2] = p0 + i % nx;
        }
    }
    const int p_after = flat ? p0 + n_img : p0 + n_pos;
    for (int i = 0; i < n_after + n_gen - 1; i++, k++)
        put_text(&s, k, i < n_after ? after[i] : gen[i - n_after], p_after + i, true);
    json_t *positions = json_object_get(g, "positions");
    assert_int_equal(json_array_size(positions), (size_t)(n_after + n_gen - 1));
    if (!flat) /* the golden's own positions: the text after the image at p0 + n_pos */
        assert_int_equal(json_integer_value(json_object_get(json_array_get(positions, 0), "pos")), p_after);

    float *logits = tf_run(llm, &s, 2);
    double d = compare(positions, logits, n_vocab, tol, !flat);
    printf("  vision-%s-%s-%s: %d image tokens (%dx%d) at %d, %d text after at %d%s: max |diff| %.3g (tolerance %g)\n",
           T, P, img, n_img, nx, ny, p0, n_after + n_gen - 1, p_after, flat ? " (1-D positions, control)" : "",
           d, tol);
    if (!flat) assert_true(d <= tol);
    free(logits), tf_seq_free(&s), free(embd), free(before), free(after), free(gen);
    kt_model_free(m);
    json_decref(g);
    return d;
}

/* Qwen 3.5's text model with qwen3vl_merger embeddings: interleaved
 * M-RoPE sections [3, 3, 2, 0]. F32 goldens 1e-4 (the F16 weights
 * widened), F16 goldens 6e-3 (llama.cpp ran F16 activations). */
static void test_qwen35_with_images(void **state) {
    (void)state;
    static const char *const imgs[] = {"tiny", "photo", "screenshot"};
    for (int i = 0; i < 3; i++) {
        check_vision_golden("qwen3vl", "F32", imgs[i], 1e-4, false);
        check_vision_golden("qwen3vl", "F16", imgs[i], 6e-3, false);
    }
}

/* Qwen2.5-VL's text model (qwen2vl: qwen2 with sequential M-RoPE sections
 * [4, 6, 6, 0]) with qwen2.5vl_merger embeddings. */
static void test_qwen2vl_with_images(void **state) {
    (void)state;
    static const char *const imgs[] = {"tiny", "photo", "screenshot"};
    for (int i = 0; i < 3; i++) {
        check_vision_golden("qwen25vl", "F32", imgs[i], 1e-4, false);
        check_vision_golden("qwen25vl", "F16", imgs[i], 6e-3, false);
    }
}

/* The checks can fail: the same embeddings on 1-D positions are off by
 * far more than the tolerance (README: 0.04-0.08 for qwen3vl, 1.7-2.2 for
 * qwen2.5vl). */
static void test_flat_positions_fail(void **state) {
    (void)state;
    assert_true(check_vision_golden("qwen3vl", "F32", "screenshot", 1e-4, true) > 1e-2);
    assert_true(check_vision_golden("qwen25vl", "F32", "tiny", 1e-4, true) > 0.5);
}

/* qwen2vl's text goldens (no image: M-RoPE text positions (p, p, p, 0)
 * are plain rope), F32 on the widened F16 file and F16. */
static void test_qwen2vl_text(void **state) {
    (void)state;
    static const struct { const char *json; double tol; } runs[] = {{"qwen2vl-F32.json", 1e-4},
                                                                   {"qwen2vl-F16.json", 6e-3}};
    for (int r = 0; r < 2; r++) {
        char rel[128];
        snprintf(rel, sizeof rel, "golden/arch/%s", runs[r].json);
        json_error_t jerr;
        json_t *g = json_load_file(tu_shared(rel), 0, &jerr);
        if (!g) fail_msg("%s: %s", rel, jerr.text);
        kt_model *m = load_text_model("golden/arch/qwen2vl-F16.gguf", true);
        int n_prompt, n_gen;
        int32_t *prompt = tu_json_ids(json_object_get(g, "prompt_ids"), &n_prompt);
        int32_t *gen = tu_json_ids(json_object_get(g, "gen_ids"), &n_gen);
        tf_seq s;
        tf_seq_alloc(&s, n_prompt + n_gen - 1);
        for (int i = 0; i < s.n; i++) put_text(&s, i, i < n_prompt ? prompt[i] : gen[i - n_prompt], i, true);
        float *logits = tf_run(m->llm, &s, 1);
        double d = compare(json_object_get(g, "positions"), logits, m->llm->cfg.n_vocab, runs[r].tol, true);
        printf("  %s: %d positions, max |diff| %.3g (tolerance %g, eps 0 as llama.cpp)\n", runs[r].json, s.n, d,
               runs[r].tol);
        assert_true(d <= runs[r].tol);
        free(logits), tf_seq_free(&s), free(prompt), free(gen);
        kt_model_free(m);
        json_decref(g);
    }
}

/* The file's eps is what kettle runs (not llama.cpp's 0). */
static void test_qwen2vl_keeps_file_eps(void **state) {
    (void)state;
    kt_model *m = load_text_model("golden/arch/qwen2vl-F16.gguf", false);
    assert_true(fabsf(m->llm->cfg.rms_eps - 1e-6f) < 1e-12f);
    assert_int_equal(m->llm->cfg.rope_sections[1], 6);
    assert_false(m->llm->cfg.rope_sections_interleaved);
    kt_model_free(m);
}

/* ---- through the batched engine ---- */

/* A vision golden as an engine request: its prompt with the image's
 * tokens in place, and the image (given embeddings). */
typedef struct vreq {
    int32_t ids[2048];
    int n, n_gen;
    int32_t gen[16];
    kt_prompt_image image;
    float *embd;
} vreq;

static void vreq_load(vreq *v, const char *T, const char *P, const char *img) {
    char rel[256];
    snprintf(rel, sizeof rel, "golden/arch/vision-%s-%s-%s.json", T, P, img);
    json_error_t jerr;
    json_t *g = json_load_file(tu_shared(rel), 0, &jerr);
    if (!g) fail_msg("%s: %s", rel, jerr.text);
    json_t *chunks = json_object_get(g, "chunks"), *image = json_array_get(chunks, 1), *grid = json_object_get(image, "grid");
    int n_before, n_after, n_gen;
    int32_t *before = tu_json_ids(json_object_get(json_array_get(chunks, 0), "ids"), &n_before);
    int32_t *after = tu_json_ids(json_object_get(g, "after_ids"), &n_after);
    int32_t *gen = tu_json_ids(json_object_get(g, "gen_ids"), &n_gen);
    const int nx = (int)json_integer_value(json_array_get(grid, 0)), ny = (int)json_integer_value(json_array_get(grid, 1));
    assert_true(n_before + nx * ny + n_after <= 2048 && n_gen == 16);
    memset(v, 0, sizeof *v);
    memcpy(v->ids, before, sizeof(int32_t) * (size_t)n_before);
    for (int i = 0; i < nx * ny; i++) v->ids[n_before + i] = 0; /* submit writes the image's keys there */
    memcpy(v->ids + n_before + nx * ny, after, sizeof(int32_t) * (size_t)n_after);
    v->n = n_before + nx * ny + n_after;
    memcpy(v->gen, gen, sizeof gen[0] * 16), v->n_gen = 16;
    snprintf(rel, sizeof rel, "golden/arch/vision-%s-%s-%s.embd.f32", T, P, img);
    size_t bytes;
    assert_non_null(v->embd = (float *)tu_read_file(tu_shared(rel), &bytes));
    v->image = (kt_prompt_image){.at = n_before, .grid_x = nx, .grid_y = ny, .embd = v->embd,
                                 .hash = XXH3_64bits(v->embd, bytes)};
    free(before), free(after), free(gen);
    json_decref(g);
}

static kt_request *vreq_submit(kt_engine *e, const vreq *v, int max_tokens) {
    kt_gen_params p = kt_gen_defaults();
    p.prompt = v->ids, p.n_prompt = v->n, p.max_tokens = max_tokens, p.n_choices = 1;
    p.top_logprobs = 0, p.ignore_eos = true;
    p.images = &v->image, p.n_images = 1;
    kt_request *r = NULL;
    kt_error err = {0};
    if (kt_engine_submit(e, &p, &r, &err) != KT_OK) fail_msg("%s", err.msg);
    return r;
}

static kt_engine *vision_engine(kt_model *m, int batch_tokens) {
    kt_engine_params ep = kt_engine_defaults();
    ep.n_ctx = 2048, ep.n_parallel = 4, ep.batch_tokens = batch_tokens, ep.n_threads = 2, ep.kv_type = KT_KV_F32;
    kt_error err = {0};
    kt_engine *e = kt_engine_new(m, &ep, &err);
    if (!e) fail_msg("%s", err.msg);
    return e;
}

/* The golden's image prompt through the engine (prefill in chunks of 64
 * so the image crosses steps): the greedy tokens are the golden's; the
 * same request again takes the image's KV from the prefix cache (its
 * blocks keyed by the image's hash) and gives the same bits; beside a
 * text request, the same bits for both; the same prompt with an image
 * one value different shares the blocks before the image only. */
static void check_engine_images(const char *T, const char *model_file, bool eps0) {
    static vreq v, v2;
    vreq_load(&v, T, "F32", TU_SANITIZED ? "tiny" : "photo"); /* a sanitized build: the 12-token image */
    kt_model *m = load_text_model(model_file, eps0);
    kt_engine *e = vision_engine(m, 64);
    static tu_eng_out alone, again, beside, text_alone, text_beside, other;
    kt_request_usage u = tu_eng_drain(vreq_submit(e, &v, 16), &alone, 1);
    assert_int_equal(u.prompt_tokens, v.n);
    assert_int_equal(u.cached_tokens, 0);
    if (alone.n != 16 || memcmp(alone.tokens, v.gen, sizeof v.gen))
        fail_msg("%s: the engine's greedy tokens after the image are not the golden's", T);
    const kt_request_usage u_again = tu_eng_drain(vreq_submit(e, &v, 16), &again, 1);
    tu_assert_same_out(&again, &alone, "the same image again");
    assert_true(u_again.cached_tokens >= v.image.at + v.image.grid_x * v.image.grid_y - 16);
    const int32_t *text = v.ids + v.image.at + v.image.grid_x * v.image.grid_y;
    const int n_text = v.n - (v.image.at + v.image.grid_x * v.image.grid_y);
    tu_eng_drain(tu_eng_submit(e, text, n_text, 16, 1), &text_alone, 1);
    kt_request *ra = vreq_submit(e, &v, 16), *rb = tu_eng_submit(e, text, n_text, 16, 1);
    tu_eng_drain(ra, &beside, 1);
    tu_eng_drain(rb, &text_beside, 1);
    tu_assert_same_out(&beside, &alone, "beside a text request");
    tu_assert_same_out(&text_beside, &text_alone, "the text request beside the image");
    /* one value of one embedding row changed: another image */
    v2 = v;
    const size_t n_floats = (size_t)v.image.grid_x * v.image.grid_y * (size_t)m->llm->cfg.n_embd;
    v2.embd = tu_xmalloc(sizeof(float) * n_floats);
    memcpy(v2.embd, v.embd, sizeof(float) * n_floats);
    v2.embd[n_floats / 2] += 0.25f;
    v2.image.embd = v2.embd, v2.image.hash = XXH3_64bits(v2.embd, sizeof(float) * n_floats);
    u = tu_eng_drain(vreq_submit(e, &v2, 16), &other, 1);
    assert_true(u.cached_tokens <= v.image.at);
    kt_engine_stats st;
    kt_engine_get_stats(e, &st);
    printf("  %s through the engine: the golden's 16 greedy tokens; again %d of %d prompt tokens cached, same bits; "
           "beside a text request, same bits; an image one value apart: %d cached (the image starts at %d)\n",
           T, (int)u_again.cached_tokens, v.n, (int)u.cached_tokens, v.image.at);
    kt_engine_free(e), kt_model_free(m);
    free(v.embd), free(v2.embd);
}

static void test_engine_images(void **state) {
    (void)state;
    check_engine_images("qwen3vl", "golden/arch/qwen35-F16.gguf", false);
    check_engine_images("qwen25vl", "golden/arch/qwen2vl-F16.gguf", true);
}

/* What submit refuses: an image over the prompt's end, overlapping
 * images, an image without embeddings or pixels on an engine without a
 * tower, an image on a model without M-RoPE. */
static void test_engine_images_refused(void **state) {
    (void)state;
    static vreq v;
    vreq_load(&v, "qwen3vl", "F32", "tiny");
    kt_model *m = load_text_model("golden/arch/qwen35-F16.gguf", false);
    kt_engine *e = vision_engine(m, 64);
    kt_gen_params p = kt_gen_defaults();
    p.prompt = v.ids, p.n_prompt = v.n, p.max_tokens = 4;
    kt_prompt_image im[2] = {v.image, v.image};
    kt_request *r = NULL;
    kt_error err = {0};
    p.images = im, p.n_images = 1;
    im[0].at = v.n - 2;
    assert_int_equal(kt_engine_submit(e, &p, &r, &err), KT_ERR_ARG);
    assert_non_null(strstr(err.msg, "do not fit the prompt"));
    im[0] = v.image, im[1].at = v.image.at + 3, p.n_images = 2;
    assert_int_equal(kt_engine_submit(e, &p, &r, &err), KT_ERR_ARG);
    assert_non_null(strstr(err.msg, "overlaps"));
    im[0].embd = NULL, p.n_images = 1;
    assert_int_equal(kt_engine_submit(e, &p, &r, &err), KT_ERR_ARG);
    assert_non_null(strstr(err.msg, "neither embeddings nor pixels"));
    kt_engine_free(e), kt_model_free(m);
    /* a model without M-RoPE sections */
    char path[4096];
    snprintf(path, sizeof path, "%s/models/stories260K.gguf", tu_shared_dir());
    assert_non_null(m = kt_model_load(path, &err));
    assert_non_null(e = vision_engine(m, 64));
    p.n_prompt = 40, im[0] = v.image, im[0].at = 2, im[0].grid_x = 2, im[0].grid_y = 2;
    for (int i = 0; i < 40; i++) v.ids[i] = 1 + i;
    assert_int_equal(kt_engine_submit(e, &p, &r, &err), KT_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "takes no images"));
    kt_engine_free(e), kt_model_free(m);
    free(v.embd);
}

/* kt_session_save / _load with an image in the session: a restored
 * session gives the same logits, bit for bit, for the tokens after the
 * image as the one that evaluated it (the image's rows and its grid, which
 * the positions after it depend on, come back); a save that would cut an
 * image is refused. Attention (qwen2vl) and hybrid (qwen35) models. */
static void check_session_file_images(const char *T, const char *model_file) {
    vreq v;
    vreq_load(&v, T, "F16", "photo");
    kt_error err = {0};
    kt_model *m = kt_model_load(tu_shared(model_file), &err);
    if (!m) fail_msg("%s", err.msg);
    const kt_session_params sp = {.n_ctx = 1024, .n_threads = 2};
    kt_session *a = kt_session_new(m, &sp, &err), *b = kt_session_new(m, &sp, &err);
    assert_non_null(a), assert_non_null(b);
    const int n_vocab = kt_model_describe(m)->n_vocab, at = v.image.at, n_img = v.image.grid_x * v.image.grid_y;
    float *la = malloc(sizeof(float) * (size_t)n_vocab), *lb = malloc(sizeof(float) * (size_t)n_vocab);
    assert_int_equal(kt_session_eval(a, v.ids, at, la, false, &err), KT_OK);
    assert_int_equal(kt_session_eval_image(a, v.embd, v.image.grid_x, v.image.grid_y, la, &err), KT_OK);
    const int n_after = v.n - at - n_img;
    assert_int_equal(kt_session_eval(a, v.ids + at + n_img, n_after - 1, la, false, &err), KT_OK);
    const char *path = tu_tmp("vision.session");
    if (!strcmp(T, "qwen25vl")) /* attention only: a prefix may be saved */
        assert_int_equal(kt_session_save(a, path, v.ids, at + 3, NULL, &err), KT_ERR_ARG); /* inside the image */
    assert_int_equal(kt_session_save(a, path, v.ids, v.n - 1, "n", &err), KT_OK);
    int32_t *toks = NULL;
    char *note = NULL;
    int n = 0;
    if (kt_session_load(b, path, &toks, &n, &note, &err)) fail_msg("%s", err.msg);
    assert_int_equal(n, v.n - 1);
    assert_memory_equal(toks, v.ids, sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < 4; i++) { /* the last prompt token, then the golden's first three */
        const int32_t t = i ? v.gen[i - 1] : v.ids[v.n - 1];
        assert_int_equal(kt_session_eval(a, &t, 1, la, false, &err), KT_OK);
        assert_int_equal(kt_session_eval(b, &t, 1, lb, false, &err), KT_OK);
        assert_memory_equal(la, lb, sizeof(float) * (size_t)n_vocab);
    }
    printf("  %s: a session with a %dx%d image saved at %d positions and restored: the same logits after it\n",
           model_file, v.image.grid_x, v.image.grid_y, n);
    unlink(path);
    free(toks), free(note), free(la), free(lb), free(v.embd);
    kt_session_free(a), kt_session_free(b);
    kt_model_free(m);
}

static void test_session_file_images(void **state) {
    (void)state;
    check_session_file_images("qwen25vl", "golden/arch/qwen2vl-F16.gguf");
    check_session_file_images("qwen3vl", "golden/arch/qwen35-F16.gguf");
}

/* ---- the whole way: files in, llama.cpp's greedy text out ---- */

/* `kettle run --mmproj --image` on the golden's prompt: kettle's decoder,
 * preprocessing, tower and text model together give llama.cpp's 16
 * greedy tokens (the embeddings differ from llama.cpp's by ~2e-4 of their
 * size; the text's top-1 gaps here are far wider). */
static void check_run_golden(const char *img_file, const char *golden) {
    char rel[256];
    snprintf(rel, sizeof rel, "golden/arch/%s", golden);
    json_error_t jerr;
    json_t *g = json_load_file(tu_shared(rel), 0, &jerr);
    if (!g) fail_msg("%s: %s", rel, jerr.text);
    const char *prompt = json_string_value(json_object_get(g, "prompt"));
    char prompt_path[512];
    snprintf(prompt_path, sizeof prompt_path, "%s", tu_tmp("vision_prompt.txt"));
    assert_int_equal(tu_write_file(prompt_path, prompt, strlen(prompt)), 0);
    char cmd[4096], model[1024], mmproj[1024], image[1024];
    snprintf(model, sizeof model, "%s", tu_shared("golden/arch/qwen35-F16.gguf"));
    snprintf(mmproj, sizeof mmproj, "%s", tu_shared("golden/arch/mmproj-qwen3vl-F32.gguf"));
    snprintf(image, sizeof image, "%s", tu_shared(img_file));
    snprintf(cmd, sizeof cmd, "%s run -m %s --mmproj %s --image %s -f %s -n 16 --temp 0 -t 2", KT_BIN, model, mmproj,
             image, prompt_path);
    char *out = NULL, *err = NULL;
    int rc = tu_run(cmd, &out, &err);
    if (rc != 0) fail_msg("%s\n-> %d\n%s", cmd, rc, err);
    const char *want = json_string_value(json_object_get(g, "gen_text"));
    if (strcmp(out, want)) fail_msg("%s: kettle run wrote\n  '%s'\nllama.cpp\n  '%s'", img_file, out, want);
    printf("  kettle run --image %s: llama.cpp's 16 greedy tokens\n", img_file);
    free(out), free(err);
    json_decref(g);
}

static void test_run_image_golden(void **state) {
    (void)state;
    check_run_golden("golden/arch/image-photo.decoded.png", "vision-qwen3vl-F32-photo.json");
    if (TU_SANITIZED) /* the 3680-patch tower takes ~30 s there */
        printf("  (the screenshot in the optimized build only)\n");
    else
        check_run_golden("golden/arch/image-screenshot.png", "vision-qwen3vl-F32-screenshot.json");
}

/* `kettle chat --mmproj --image` on the golden's conversation (qwen35):
 * the reply is llama.cpp's 16 greedy tokens, so the chat template renders
 * the golden's prompt and the image goes where llama.cpp puts it. */
static void test_chat_image_golden(void **state) {
    (void)state;
    json_error_t jerr;
    json_t *g = json_load_file(tu_shared("golden/arch/vision-qwen3vl-F32-photo.json"), 0, &jerr);
    if (!g) fail_msg("vision-qwen3vl-F32-photo.json: %s", jerr.text);
    char input[512], cmd[8192], model[1024], mmproj[1024], photo[1024];
    snprintf(input, sizeof input, "%s", tu_tmp("chat_image_input.txt"));
    snprintf(model, sizeof model, "%s", tu_shared("golden/arch/qwen35-F16.gguf"));
    snprintf(mmproj, sizeof mmproj, "%s", tu_shared("golden/arch/mmproj-qwen3vl-F32.gguf"));
    snprintf(photo, sizeof photo, "%s", tu_shared("golden/arch/image-photo.decoded.png"));
    const char *line = "Find the Settings button in this screenshot and describe what you see around it.\n";
    assert_int_equal(tu_write_file(input, line, strlen(line)), 0);
    snprintf(cmd, sizeof cmd,
             "%s chat -m %s --mmproj %s --image %s --system 'You are a computer-use agent. You see the screen and "
             "decide the next action.' -n 16 --temp 0 -t 2 < %s",
             KT_BIN, model, mmproj, photo, input);
    char *out = NULL, *err = NULL;
    int rc = tu_run(cmd, &out, &err);
    if (rc != 0) fail_msg("%s\n-> %d\n%s", cmd, rc, err);
    const char *want = json_string_value(json_object_get(g, "gen_text"));
    if (strncmp(out, want, strlen(want))) fail_msg("kettle chat's reply\n  '%s'\nllama.cpp's\n  '%s'", out, want);
    printf("  kettle chat --image: llama.cpp's 16 greedy tokens\n");
    free(out), free(err);
    json_decref(g);
}

/* A tower for another model (64-wide images, a 128-wide model) is
 * refused by run and chat before anything runs (run read past the
 * image's rows). */
static void test_cli_tower_mismatch(void **state) {
    (void)state;
    char cmd[4096], model[1024], mmproj[1024], tiny[1024];
    snprintf(model, sizeof model, "%s", tu_shared("golden/arch/qwen2vl-F16.gguf"));
    snprintf(mmproj, sizeof mmproj, "%s", tu_shared("golden/arch/mmproj-qwen3vl-F16.gguf"));
    snprintf(tiny, sizeof tiny, "%s", tu_shared("golden/arch/image-tiny.png"));
    snprintf(cmd, sizeof cmd, "%s run -m %s --mmproj %s --image %s -p '<__media__> hi' -n 2", KT_BIN, model, mmproj, tiny);
    tu_expect_run(cmd, 1, "images are 64 wide and the model's embeddings 128", "the projector is for another model");
    snprintf(cmd, sizeof cmd, "%s chat -m %s --chat-template chatml --mmproj %s < /dev/null", KT_BIN, model, mmproj);
    tu_expect_run(cmd, 1, "images are 64 wide and the model's embeddings 128", NULL);
}

/* The "[prompt N tokens: R reused" of turn k (0-based) in a chat's stderr. */
static void turn_reuse(const char *err, int k, int *n, int *reused) {
    const char *p = err;
    for (int i = 0; i <= k; i++)
        if (!(p = strstr(i ? p + 1 : p, "[prompt "))) fail_msg("no turn %d:\n%s", k, err);
    if (sscanf(p, "[prompt %d tokens: %d reused", n, reused) != 2) fail_msg("unreadable: %s", p);
}

/* kettle chat with images over turns (qwen2vl, the chatml template): a
 * second turn with another image (/image) reuses the whole first prompt
 * from the KV cache and encodes nothing again; --session keeps the
 * images (paths in the conversation, rows and grids in the KV), so the
 * next run reuses both turns. */
static void test_chat_image_turns(void **state) {
    (void)state;
    char input[512], session[512], cmd[8192], model[1024], mmproj[1024], photo[1024], tiny[1024];
    snprintf(input, sizeof input, "%s", tu_tmp("chat_turns_input.txt"));
    snprintf(session, sizeof session, "%s", tu_tmp("chat_image.session"));
    snprintf(model, sizeof model, "%s", tu_shared("golden/arch/qwen2vl-F16.gguf"));
    snprintf(mmproj, sizeof mmproj, "%s", tu_shared("golden/arch/mmproj-qwen25vl-F16.gguf"));
    snprintf(photo, sizeof photo, "%s", tu_shared("golden/arch/image-photo.decoded.png"));
    snprintf(tiny, sizeof tiny, "%s", tu_shared("golden/arch/image-tiny.png"));
    char script[2048];
    snprintf(script, sizeof script, "What is this?\n/image %s\nAnd this one?\n", tiny);
    assert_int_equal(tu_write_file(input, script, strlen(script)), 0);
    unlink(session);
    snprintf(cmd, sizeof cmd, "%s chat -m %s --chat-template chatml --mmproj %s --image %s -n 8 --temp 0 -t 2 "
             "--session %s < %s", KT_BIN, model, mmproj, photo, session, input);
    char *out = NULL, *err = NULL;
    int rc = tu_run(cmd, &out, &err);
    if (rc != 0) fail_msg("%s\n-> %d\n%s", cmd, rc, err);
    int n[2], reused[2];
    turn_reuse(err, 0, &n[0], &reused[0]), turn_reuse(err, 1, &n[1], &reused[1]);
    const char *second = strstr(strstr(err, "[prompt ") + 1, "[prompt ");
    if (strstr(second, "images encoded")) fail_msg("the second turn encoded an image again:\n%s", err);
    if (reused[1] < n[0]) fail_msg("the second turn reused %d tokens of the first's %d:\n%s", reused[1], n[0], err);
    int saved = -1;
    const char *sv = strstr(err, "[saved ");
    if (!sv || sscanf(sv, "[saved %*d messages and %d tokens", &saved) != 1 || saved < n[1])
        fail_msg("the KV of both turns (%d tokens) was not saved:\n%s", n[1], err);
    printf("  turn 2 reused %d of %d tokens; %d tokens of KV saved\n", reused[1], n[1], saved);
    free(out), free(err);
    /* the next run starts from them */
    assert_int_equal(tu_write_file(input, "Again?\n", 7), 0);
    snprintf(cmd, sizeof cmd, "%s chat -m %s --chat-template chatml --mmproj %s -n 4 --temp 0 -t 2 --session %s < %s",
             KT_BIN, model, mmproj, session, input);
    if ((rc = tu_run(cmd, &out, &err)) != 0) fail_msg("%s\n-> %d\n%s", cmd, rc, err);
    int restored = -1, n0, reused0;
    const char *r = strstr(err, "[restored ");
    if (!r || sscanf(r, "[restored %*d messages and %d tokens", &restored) != 1) fail_msg("%s:\n%s", cmd, err);
    turn_reuse(err, 0, &n0, &reused0);
    if (restored != saved || reused0 < n[1])
        fail_msg("restored %d of the %d saved tokens and reused %d (want >= %d):\n%s", restored, saved, reused0, n[1],
                 err);
    printf("  restored: %d tokens reused of %d, the images encoded again from their files\n", reused0, n0);
    free(out), free(err);
    unlink(session);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen2vl_keeps_file_eps), cmocka_unit_test(test_qwen2vl_text),
        cmocka_unit_test(test_qwen35_with_images),     cmocka_unit_test(test_qwen2vl_with_images),
        cmocka_unit_test(test_flat_positions_fail),    cmocka_unit_test(test_engine_images),
        cmocka_unit_test(test_engine_images_refused),  cmocka_unit_test(test_run_image_golden),
        cmocka_unit_test(test_session_file_images),    cmocka_unit_test(test_chat_image_golden),
        cmocka_unit_test(test_chat_image_turns),       cmocka_unit_test(test_cli_tower_mismatch),
    };
    return tu_result(cmocka_run_group_tests(tests, NULL, NULL));
}
