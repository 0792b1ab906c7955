/*
 * test_qwen3vl.c - Qwen3-VL's text models (qwen3vl, qwen3vlmoe) with
 * DeepStack against llama.cpp: kettle's tower and text model on an image,
 * the logits after it within the shared goldens' F32 tolerance.
 *
 * There is no shared golden for DeepStack: the reference is
 * tests/data/qwen3vl/ (its README says how llama.cpp made it, with
 * tools/qwen3vl_ref), computed on files this test makes again with
 * `kettle gen-model` (qwen3vl-tiny / qwen3vlmoe-tiny and the
 * mmproj-qwen3vl-tiny tower: 3 DeepStack outputs, image rows of 4 x 64
 * floats), and the shared image-tiny.png. Checked:
 *   - kt_session: the prompt's text, the image (the tower's rows through
 *     kt_session_eval_image), the text after it, teacher-forced: every
 *     logits row's top entries and log-sum-exp within 1e-4; a control with
 *     the DeepStack slices zeroed (what a model without the add computes)
 *     must miss by far more;
 *   - the engine, its tower encoding the pixels: llama.cpp's greedy tokens;
 *   - the refusals: a DeepStack tower with a text model that is not
 *     qwen3vl, a tower whose DeepStack count is not the model's.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/images.h"
#include "image/image.h"
#include "kettle.h"
#include "testutil.h"
#include "vision/vision.h"

#define TOL 1e-4      /* the goldens' F32 tolerance: kettle's tower and text model */
#define TOL_TEXT 1e-5 /* the text model alone, on llama.cpp's image rows */

typedef struct q3_ref {
    json_t *json;
    int32_t *before, *after, *gen;
    int n_before, n_after, n_gen, grid_x, grid_y;
} q3_ref;

static void ref_load(q3_ref *r, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/qwen3vl/%s", KT_TEST_DATA, name);
    json_error_t jerr;
    memset(r, 0, sizeof *r);
    if (!(r->json = json_load_file(path, 0, &jerr))) fail_msg("%s: %s", path, jerr.text);
    r->before = tu_json_ids(json_object_get(r->json, "before_ids"), &r->n_before);
    r->after = tu_json_ids(json_object_get(r->json, "after_ids"), &r->n_after);
    r->gen = tu_json_ids(json_object_get(r->json, "gen_ids"), &r->n_gen);
    json_t *grid = json_object_get(r->json, "grid");
    r->grid_x = (int)json_integer_value(json_array_get(grid, 0));
    r->grid_y = (int)json_integer_value(json_array_get(grid, 1));
}

static void ref_free(q3_ref *r) {
    free(r->before), free(r->after), free(r->gen);
    json_decref(r->json);
}

/* The gen-model tower, loaded. */
static kt_vision *tiny_tower(const char *shape) {
    char cmd[8192], path[4096], file[128];
    snprintf(file, sizeof file, "%s-F32.gguf", shape);
    snprintf(path, sizeof path, "%s", tu_tmp(file));
    snprintf(cmd, sizeof cmd, "%s gen-model --shape %s --type F32 -o '%s'", KT_BIN, shape, path);
    tu_expect_run(cmd, 0, "wrote", NULL);
    kt_error err = {0};
    kt_vision *v = kt_vision_load(path, &err);
    if (!v) fail_msg("%s: %s", path, err.msg);
    return v;
}

static kt_model *tiny_model(const char *shape) {
    char args[4096], file[128];
    snprintf(args, sizeof args, "--shape %s --type F32 --vocab %s", shape, tu_shared("golden/arch/qwen2vl-F16.gguf"));
    snprintf(file, sizeof file, "%s-F32.gguf", shape);
    return tu_gen_model(KT_BIN, file, args);
}

/* image-tiny.png preprocessed for tower v (malloc'd, for the engine to take). */
static kt_image_prep *tiny_prep(kt_vision *v) {
    size_t n = 0;
    char *bytes = tu_read_file(tu_shared("golden/arch/image-tiny.png"), &n);
    assert_non_null(bytes);
    kt_image img = {0};
    kt_image_prep *prep = tu_xmalloc(sizeof *prep);
    kt_image_prep_params pp;
    kt_vision_prep_params(v, &pp);
    kt_error err = {0};
    if (kt_image_decode(bytes, n, NULL, &img, &err) || kt_image_preprocess(&img, &pp, prep, &err))
        fail_msg("image-tiny.png: %s", err.msg);
    kt_image_free(&img);
    free(bytes);
    return prep;
}

/* The tower's rows for the image (n_embd * (1 + n_deepstack) each). */
static float *encode_tiny(kt_vision *v, const q3_ref *r) {
    kt_image_prep *prep = tiny_prep(v);
    assert_int_equal(prep->grid_x, r->grid_x);
    assert_int_equal(prep->grid_y, r->grid_y);
    const kt_vision_info *vi = kt_vision_get_info(v);
    float *rows = tu_xmalloc(sizeof(float) * (size_t)vi->n_embd * (size_t)(1 + vi->n_deepstack) *
                             (size_t)(r->grid_x * r->grid_y));
    kt_error err = {0};
    if (kt_vision_encode(v, NULL, prep, rows, &err)) fail_msg("encode: %s", err.msg);
    kt_image_prep_free(prep), free(prep);
    return rows;
}

/* The reference's sequence through a session, teacher-forced; returns the
 * max |diff| over the reference's top entries (check: each row within
 * TOL, else no check: the control). */
static double session_diff(kt_model *m, const q3_ref *r, const float *rows, bool check) {
    kt_error err = {0};
    const kt_session_params sp = {.n_ctx = 256, .n_threads = 2};
    kt_session *s = kt_session_new(m, &sp, &err);
    if (!s) fail_msg("%s", err.msg);
    const int n_vocab = kt_model_describe(m)->n_vocab, n_tf = r->n_after + r->n_gen - 1;
    int32_t *tf = tu_xmalloc(sizeof(int32_t) * (size_t)n_tf);
    memcpy(tf, r->after, sizeof(int32_t) * (size_t)r->n_after);
    memcpy(tf + r->n_after, r->gen, sizeof(int32_t) * (size_t)(r->n_gen - 1));
    float *logits = tu_xmalloc(sizeof(float) * (size_t)n_vocab * (size_t)n_tf);
    assert_int_equal(kt_session_eval(s, r->before, r->n_before, NULL, false, &err), KT_OK);
    assert_int_equal(kt_session_eval_image(s, rows, r->grid_x, r->grid_y, NULL, &err), KT_OK);
    assert_int_equal(kt_session_eval(s, tf, n_tf, logits, true, &err), KT_OK);
    json_t *positions = json_object_get(r->json, "positions");
    assert_int_equal(json_array_size(positions), (size_t)n_tf);
    double maxdiff = 0;
    for (int p = 0; p < n_tf; p++) {
        json_t *pos = json_array_get(positions, (size_t)p), *top = json_object_get(pos, "top");
        const float *row = logits + (size_t)p * (size_t)n_vocab;
        double d = 0;
        if (check) {
            d = tu_golden_check_position(row, n_vocab, pos, TOL, p);
        } else {
            for (size_t j = 0; j < json_array_size(top); j++) {
                json_t *e = json_array_get(top, j);
                const double x = fabs(row[json_integer_value(json_array_get(e, 0))] - json_real_value(json_array_get(e, 1)));
                if (x > d) d = x;
            }
        }
        if (d > maxdiff) maxdiff = d;
    }
    free(tf), free(logits);
    kt_session_free(s);
    return maxdiff;
}

/* image-tiny.png as a deferred prep (image/image.h): its bytes kept, the
 * grid given, the pixels made by the engine when it encodes. */
static kt_image_prep *tiny_deferred(kt_vision *v, int grid_x, int grid_y) {
    size_t n = 0;
    char *bytes = tu_read_file(tu_shared("golden/arch/image-tiny.png"), &n);
    assert_non_null(bytes);
    kt_image_prep *prep = tu_xmalloc(sizeof *prep);
    kt_image_prep_params pp;
    kt_vision_prep_params(v, &pp);
    kt_image_limits lim;
    kt_image_limits_default(&lim);
    kt_error err = {0};
    if (kt_image_prep_defer(prep, bytes, n, &lim, &pp, grid_x, grid_y, &err)) fail_msg("%s", err.msg);
    assert_true(kt_image_prep_deferred(prep));
    free(bytes);
    return prep;
}

/* An engine with tower v. */
static kt_engine *greedy_engine(kt_model *m, kt_vision *v) {
    kt_engine_params ep = kt_engine_defaults();
    ep.n_ctx = 256, ep.n_parallel = 2, ep.batch_tokens = 16, ep.n_threads = 2, ep.kv_type = KT_KV_F32;
    ep.vision = v;
    kt_error err = {0};
    kt_engine *e = kt_engine_new(m, &ep, &err);
    if (!e) fail_msg("%s", err.msg);
    return e;
}

/* The reference's prompt with image im (placed here) through a fresh
 * engine, nothing cached: its greedy tokens in out; false where the
 * request ended in an error, its message in error. */
static bool greedy_run(kt_model *m, kt_vision *v, const q3_ref *r, kt_prompt_image im, tu_eng_out *out,
                       char *error, size_t error_cap) {
    kt_engine *e = greedy_engine(m, v);
    const int n_img = r->grid_x * r->grid_y, n = r->n_before + n_img + r->n_after;
    int32_t *ids = tu_xmalloc(sizeof(int32_t) * (size_t)n);
    memcpy(ids, r->before, sizeof(int32_t) * (size_t)r->n_before);
    memset(ids + r->n_before, 0, sizeof(int32_t) * (size_t)n_img);
    memcpy(ids + r->n_before + n_img, r->after, sizeof(int32_t) * (size_t)r->n_after);
    im.at = r->n_before, im.grid_x = r->grid_x, im.grid_y = r->grid_y;
    kt_gen_params p = kt_gen_defaults();
    p.prompt = ids, p.n_prompt = n, p.max_tokens = r->n_gen, p.n_choices = 1, p.top_logprobs = 0, p.ignore_eos = true;
    p.images = &im, p.n_images = 1;
    kt_request *req = NULL;
    kt_error err = {0};
    if (kt_engine_submit(e, &p, &req, &err)) fail_msg("%s", err.msg);
    memset(out, 0, sizeof *out);
    bool ok = true;
    kt_event ev;
    int rc;
    while ((rc = kt_request_wait(req, &ev, 60000)) == 1) {
        if (ev.finish == KT_FINISH_ERROR) ok = false, snprintf(error, error_cap, "%s", ev.error);
        if (ev.token >= 0 && out->n < 64) out->tokens[out->n++] = ev.token;
    }
    assert_int_equal(rc, -1);
    kt_request_free(req);
    kt_engine_free(e);
    free(ids);
    return ok;
}

/* The engine with tower v: the reference's prompt, the image as pixels
 * (the engine encodes them); its greedy tokens are llama.cpp's. The same
 * with the image deferred (its bytes, decoded by the engine): the same
 * tokens; deferred with a hash other than its pixels': refused, never
 * taken for that other image. */
static void engine_greedy(kt_model *m, kt_vision *v, const q3_ref *r) {
    static tu_eng_out out;
    char error[512] = "";
    kt_image_prep *prep = tiny_prep(v);
    const uint64_t hash = eng_image_hash(prep);
    if (!greedy_run(m, v, r, (kt_prompt_image){.hash = hash, .prep = prep}, &out, error, sizeof error))
        fail_msg("%s", error);
    assert_int_equal(out.n, r->n_gen);
    assert_memory_equal(out.tokens, r->gen, sizeof(int32_t) * (size_t)r->n_gen);
    kt_image_prep *later = tiny_deferred(v, r->grid_x, r->grid_y);
    if (!greedy_run(m, v, r, (kt_prompt_image){.hash = hash, .prep = later}, &out, error, sizeof error))
        fail_msg("deferred: %s", error);
    assert_int_equal(out.n, r->n_gen);
    assert_memory_equal(out.tokens, r->gen, sizeof(int32_t) * (size_t)r->n_gen);
    later = tiny_deferred(v, r->grid_x, r->grid_y);
    assert_false(greedy_run(m, v, r, (kt_prompt_image){.hash = hash ^ 1, .prep = later}, &out, error, sizeof error));
    assert_non_null(strstr(error, "do not match the hash"));
    assert_int_equal(out.n, 0);
}

/* The rows libmtmd handed llama.cpp's text model (the README's
 * QWEN3VL_EMBD_OUT), and the tower's own against them: max |d| over
 * max |ref|, per part (main, each DeepStack slice). */
static float *llama_rows(const q3_ref *r, const float *ours, int n_embd) {
    char path[4096];
    snprintf(path, sizeof path, "%s/qwen3vl/mmproj-qwen3vl-tiny-image-tiny.embd.f32", KT_TEST_DATA);
    size_t bytes = 0;
    float *rows = (float *)tu_read_file(path, &bytes);
    const size_t n_img = (size_t)(r->grid_x * r->grid_y), E = (size_t)n_embd;
    assert_non_null(rows);
    assert_int_equal(bytes, sizeof(float) * n_img * 4 * E);
    for (size_t part = 0; part < 4; part++) {
        double d = 0, ref = 0;
        for (size_t t = 0; t < n_img; t++)
            for (size_t i = 0; i < E; i++) {
                const size_t k = t * 4 * E + part * E + i;
                d = fmax(d, fabs((double)ours[k] - rows[k])), ref = fmax(ref, fabs((double)rows[k]));
            }
        printf("  the tower's rows, %s %zu: max |d| %.3g, max |ref| %.3g\n", part ? "DeepStack" : "main", part, d, ref);
        assert_true(ref > 0.1 && d <= 1.5e-3 * ref); /* test_vision's tower tolerance */
    }
    return rows;
}

static void check_model(const char *shape, const char *ref_name) {
    q3_ref r;
    ref_load(&r, ref_name);
    kt_model *m = tiny_model(shape);
    kt_vision *v = tiny_tower("mmproj-qwen3vl-tiny");
    const kt_vision_info *vi = kt_vision_get_info(v);
    assert_int_equal(kt_model_describe(m)->n_deepstack, 3);
    assert_int_equal(vi->n_deepstack, 3);
    float *rows = encode_tiny(v, &r), *ref_rows = llama_rows(&r, rows, vi->n_embd);
    /* the text model alone, on llama.cpp's own rows */
    const double d_text = session_diff(m, &r, ref_rows, true);
    /* the whole way: kettle's tower, then its text model */
    const double d = session_diff(m, &r, rows, true);
    /* the control: llama.cpp's rows without their DeepStack slices */
    const size_t E = (size_t)vi->n_embd, n_img = (size_t)(r.grid_x * r.grid_y);
    for (size_t t = 0; t < n_img; t++) memset(ref_rows + t * 4 * E + E, 0, sizeof(float) * 3 * E);
    const double d0 = session_diff(m, &r, ref_rows, false);
    printf("  %s + mmproj-qwen3vl-tiny on image-tiny (%dx%d tokens, 3 DeepStack layers), logits against llama.cpp's: "
           "max |diff| %.3g on llama.cpp's rows, %.3g on kettle's tower (tolerance %g); without the DeepStack "
           "slices %.3g\n", shape, r.grid_x, r.grid_y, d_text, d, TOL, d0);
    assert_true(d_text <= TOL_TEXT && d <= TOL);
    assert_true(d0 > 20 * TOL);
    engine_greedy(m, v, &r);
    printf("  %s through the engine (the tower on the pixels, and on a deferred image's bytes): llama.cpp's %d greedy tokens; a deferred image whose pixels miss its hash refused\n", shape, r.n_gen);
    free(rows), free(ref_rows);
    kt_vision_free(v);
    kt_model_free(m);
    ref_free(&r);
}

static void test_qwen3vl_deepstack(void **state) {
    (void)state;
    check_model("qwen3vl-tiny", "qwen3vl-tiny-image-tiny.json");
}

static void test_qwen3vlmoe_deepstack(void **state) {
    (void)state;
    check_model("qwen3vlmoe-tiny", "qwen3vlmoe-tiny-image-tiny.json");
}

static void expect_engine_refusal(kt_model *m, kt_vision *v, kt_status want, const char *msg) {
    kt_engine_params ep = kt_engine_defaults();
    ep.n_ctx = 64, ep.n_parallel = 1, ep.batch_tokens = 16, ep.n_threads = 1, ep.vision = v;
    kt_error err = {0};
    kt_engine *e = kt_engine_new(m, &ep, &err);
    if (e) {
        kt_engine_free(e);
        fail_msg("the engine took a tower it should refuse (%s)", msg);
    }
    assert_int_equal(err.status, want);
    if (!strstr(err.msg, msg)) fail_msg("'%s' does not say '%s'", err.msg, msg);
}

/* A DeepStack tower with another text model (qwen35, the same n_embd),
 * and a qwen3vl model with a tower of no DeepStack outputs: refused, by
 * the engine and by `kettle run`. */
static void test_tower_refusals(void **state) {
    (void)state;
    kt_error err = {0};
    kt_model *q35 = kt_model_load(tu_shared("golden/arch/qwen35-F16.gguf"), &err);
    if (!q35) fail_msg("%s", err.msg);
    kt_model *q3vl = tiny_model("qwen3vl-tiny");
    kt_vision *ds = tiny_tower("mmproj-qwen3vl-tiny"), *plain = tiny_tower("mmproj-qwen3.5-tiny");
    expect_engine_refusal(q35, ds, KT_ERR_UNSUPPORTED, "only a qwen3vl or qwen3vlmoe text model takes; the model is qwen35");
    expect_engine_refusal(q3vl, plain, KT_ERR_ARG, "has 0 DeepStack outputs and the model (qwen3vl) has 3");
    char cmd[8192], model[1024];
    snprintf(model, sizeof model, "%s", tu_shared("golden/arch/qwen35-F16.gguf"));
    snprintf(cmd, sizeof cmd, "%s run -m %s --mmproj %s --image %s -p '<__media__> hi' -n 2", KT_BIN, model,
             tu_tmp("mmproj-qwen3vl-tiny-F32.gguf"), tu_shared("golden/arch/image-tiny.png"));
    tu_expect_run(cmd, 1, "DeepStack outputs", "qwen3vl or qwen3vlmoe");
    kt_vision_free(ds), kt_vision_free(plain);
    kt_model_free(q35), kt_model_free(q3vl);
}

/* `kettle run` with the tiny files: the tower's wide rows through the
 * CLI's session path (a run that read past n_embd-wide rows would fault
 * under the sanitizers). */
static void test_run_qwen3vl(void **state) {
    (void)state;
    kt_model_free(tiny_model("qwen3vl-tiny"));
    kt_vision_free(tiny_tower("mmproj-qwen3vl-tiny"));
    char cmd[16384], model[4096], mmproj[4096];
    snprintf(model, sizeof model, "%s", tu_tmp("qwen3vl-tiny-F32.gguf"));
    snprintf(mmproj, sizeof mmproj, "%s", tu_tmp("mmproj-qwen3vl-tiny-F32.gguf"));
    snprintf(cmd, sizeof cmd, "%s run -m %s --mmproj %s --image %s -p 'A photo: <__media__> It is' -n 4 --temp 0 -t 2",
             KT_BIN, model, mmproj, tu_shared("golden/arch/image-tiny.png"));
    tu_expect_run(cmd, 0, "image tokens:", NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3vl_deepstack),
        cmocka_unit_test(test_qwen3vlmoe_deepstack),
        cmocka_unit_test(test_tower_refusals),
        cmocka_unit_test(test_run_qwen3vl),
    };
    return tu_result(cmocka_run_group_tests(tests, NULL, NULL));
}
