/*
 * test_perplexity.c - `kettle perplexity` against a value computed
 * independently here, through the public API, by the definition:
 * chunks of CTX tokens starting with BOS, second-half tokens scored with
 * -log softmax in long double.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kettle.h"
#include "testutil.h"

#define CTX 64

static double reference_ppl(const char *model_path, const char *text, int *n_scored) {
    kt_error err = {0};
    kt_model *m = kt_model_load(model_path, &err);
    assert_non_null(m);
    const kt_model_desc *d = kt_model_describe(m);
    int32_t toks[4096];
    int n = kt_tokenize(m, text, strlen(text), toks, 4096, 1, &err);
    assert_true(n > 2 * CTX && n < 4096);
    float *logits = malloc(sizeof(float) * CTX * (size_t)d->n_vocab);
    assert_non_null(logits);
    long double total = 0;
    *n_scored = 0;
    for (int c = 0; c < n / CTX; c++) {
        kt_session *s = kt_session_new(m, &(kt_session_params){.n_ctx = CTX, .n_threads = 1}, &err);
        int32_t chunk[CTX];
        memcpy(chunk, toks + c * CTX, sizeof chunk);
        chunk[0] = d->bos_id;
        assert_int_equal(kt_session_eval(s, chunk, CTX, logits, true, &err), KT_OK);
        for (int j = CTX / 2; j < CTX - 1; j++) {
            const float *l = logits + (size_t)j * d->n_vocab;
            long double z = 0;
            for (int i = 0; i < d->n_vocab; i++) z += expl((long double)l[i]);
            total += logl(z) - l[chunk[j + 1]];
            (*n_scored)++;
        }
        kt_session_free(s);
    }
    free(logits);
    kt_model_free(m);
    return (double)expl(total / *n_scored);
}

static void test_perplexity_matches_definition(void **state) {
    (void)state;
    char *story = tu_read_file(tu_shared("golden/stories260K.once.txt"), NULL);
    assert_non_null(story);
    /* the story twice: 2 x ~150 tokens, so several 64-token chunks */
    size_t len = strlen(story);
    char *text = malloc(2 * len + 2);
    assert_non_null(text);
    snprintf(text, 2 * len + 2, "%s\n%s", story, story);
    assert_int_equal(tu_write_file(tu_tmp("ppl.txt"), text, strlen(text)), 0);
    char model[4096];
    snprintf(model, sizeof model, "%s", tu_shared("models/stories260K.gguf"));
    int n_scored;
    double want = reference_ppl(model, text, &n_scored);

    char cmd[8192], *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd, "%s perplexity -m '%s' -f '%s' -c %d -t 2", KT_BIN, model, tu_tmp("ppl.txt"), CTX);
    assert_int_equal(tu_run(cmd, &out, &err), 0);
    double got, got_err;
    assert_int_equal(sscanf(out, "Final estimate: PPL = %lf +/- %lf", &got, &got_err), 2);
    printf("  PPL %.4f +/- %.5f (reference %.4f, %d tokens)\n", got, got_err, want, n_scored);
    assert_true(fabs(got - want) <= 1e-4 * want + 1e-4);
    assert_true(got > 1 && got < 20); /* a trained model on its own kind of text */
    assert_true(got_err > 0 && got_err < got);
    char count[64];
    snprintf(count, sizeof count, "%d scored tokens", n_scored);
    assert_non_null(strstr(err, count));
    free(out);
    free(err);
    free(text);
    free(story);
}

static void test_perplexity_text_too_short(void **state) {
    (void)state;
    assert_int_equal(tu_write_file(tu_tmp("short.txt"), "Once upon a time", 16), 0);
    char cmd[8192], *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd, "%s perplexity -m '%s' -f '%s' -c 64", KT_BIN, tu_shared("models/stories260K.gguf"),
             tu_tmp("short.txt"));
    assert_int_equal(tu_run(cmd, &out, &err), 1);
    assert_non_null(strstr(err, "fewer than one 64-token chunk"));
    free(out);
    free(err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_perplexity_matches_definition),
        cmocka_unit_test(test_perplexity_text_too_short),
    };
    return tu_result(cmocka_run_group_tests(tests, NULL, NULL));
}
