/*
 * test_cli_text.c - the text commands end to end through the kettle
 * binary: `kettle tokenize` (ids, pieces, files, stdin, errors).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static int run(const char *args, char **out, char **err) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s %s", KT_BIN, args);
    return tu_run(cmd, out, err);
}

static void test_tokenize_ids_match_golden(void **state) {
    (void)state;
    char args[4096], *out = NULL;
    /* golden/stories260K.once.json: "Once upon a time" -> [1, 403, 407, 261, 378] */
    snprintf(args, sizeof args, "tokenize -m '%s' --ids 'Once upon a time'",
             tu_shared("models/stories260K.gguf"));
    assert_int_equal(run(args, &out, NULL), 0);
    assert_string_equal(out, "[1, 403, 407, 261, 378]\n");
    free(out);
    snprintf(args, sizeof args, "tokenize -m '%s' --ids --no-bos 'Once upon a time'",
             tu_shared("models/stories260K.gguf"));
    assert_int_equal(run(args, &out, NULL), 0);
    assert_string_equal(out, "[403, 407, 261, 378]\n");
    free(out);
}

static void test_tokenize_table_and_pieces(void **state) {
    (void)state;
    char args[4096], *out = NULL;
    snprintf(args, sizeof args, "tokenize --vocab '%s' 'Hi'", tu_shared("vocab/ggml-vocab-llama-spm.gguf"));
    assert_int_equal(run(args, &out, NULL), 0);
    assert_string_equal(out, "     1\t'<s>'\n  6324\t' Hi'\n");
    free(out);
    /* pieces from standard input; the newline is a byte token, escaped */
    snprintf(args, sizeof args, "tokenize --vocab '%s' --pieces --no-bos -f - < '%s'",
             tu_shared("vocab/ggml-vocab-llama-spm.gguf"), tu_tmp("tok-input.txt"));
    assert_int_equal(tu_write_file(tu_tmp("tok-input.txt"), "a\nb", 3), 0);
    assert_int_equal(run(args, &out, NULL), 0);
    assert_string_equal(out, " a\n\\n\nb\n");
    free(out);
}

static void test_tokenize_errors(void **state) {
    (void)state;
    char args[4096], *out = NULL, *err = NULL;
    assert_int_equal(run("tokenize hello", &out, &err), 2);
    assert_non_null(strstr(err, "-m MODEL"));
    free(out);
    free(err);
    assert_int_equal(run("tokenize -m /nonexistent.gguf hello", &out, &err), 1);
    assert_non_null(strstr(err, "/nonexistent.gguf"));
    free(out);
    free(err);
    /* invalid UTF-8 input is refused with its byte offset, not mangled */
    assert_int_equal(tu_write_file(tu_tmp("bad-utf8.txt"), "ab\xff", 3), 0);
    snprintf(args, sizeof args, "tokenize --vocab '%s' -f '%s'", tu_shared("vocab/ggml-vocab-llama-spm.gguf"),
             tu_tmp("bad-utf8.txt"));
    assert_int_equal(run(args, &out, &err), 1);
    assert_non_null(strstr(err, "UTF-8"));
    free(out);
    free(err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokenize_ids_match_golden),
        cmocka_unit_test(test_tokenize_table_and_pieces),
        cmocka_unit_test(test_tokenize_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
