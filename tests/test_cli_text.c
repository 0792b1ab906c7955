/*
 * test_cli_text.c - the text commands end to end through the kettle
 * binary: `kettle tokenize` (ids, pieces, files, stdin, errors),
 * `kettle template` (a real template against its expected rendering, a
 * template's own refusal, built-ins) and `kettle chat` (turns reuse the KV
 * cache; greedy replies are reproducible).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

static int run(const char *args, char **out, char **err) {
    char cmd[32768];
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

/* Control tokens in text are text unless --specials says otherwise. */
static void test_tokenize_specials(void **state) {
    (void)state;
    char args[4096], *out = NULL;
    snprintf(args, sizeof args, "tokenize --vocab '%s' --ids --no-bos 'a</s>'", tu_shared("vocab/ggml-vocab-llama-spm.gguf"));
    assert_int_equal(run(args, &out, NULL), 0);
    assert_null(strstr(out, ", 2]")); /* </s> (id 2) not matched */
    free(out);
    snprintf(args, sizeof args, "tokenize --vocab '%s' --ids --no-bos --specials 'a</s>'",
             tu_shared("vocab/ggml-vocab-llama-spm.gguf"));
    assert_int_equal(run(args, &out, NULL), 0);
    assert_string_equal(out, "[263, 2]\n");
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

/* Writes case `name` of ../shared/templates/cases.json as a messages file
 * (with tools) and the shared context as a context file. */
static void write_case(const char *name, const char *messages_path, const char *context_path) {
    json_error_t jerr;
    json_t *cases = json_load_file(tu_shared("templates/cases.json"), 0, &jerr);
    assert_non_null(cases);
    json_t *c = json_object_get(json_object_get(cases, "cases"), name);
    assert_non_null(c);
    assert_int_equal(json_dump_file(c, messages_path, 0), 0);
    assert_int_equal(json_dump_file(json_object_get(cases, "context"), context_path, 0), 0);
    json_decref(cases);
}

static void test_template_renders_expected(void **state) {
    (void)state;
    char msgs[4096], ctx[4096], tmpl[4096], args[16384], *out = NULL, *err = NULL;
    snprintf(msgs, sizeof msgs, "%s", tu_tmp("case-msgs.json"));
    snprintf(ctx, sizeof ctx, "%s", tu_tmp("case-ctx.json"));
    write_case("system_user", msgs, ctx);
    snprintf(tmpl, sizeof tmpl, "%s", tu_shared("templates/Qwen-Qwen2.5-7B-Instruct.jinja"));
    snprintf(args, sizeof args, "template --template '%s' --messages '%s' --context '%s'", tmpl, msgs, ctx);
    assert_int_equal(run(args, &out, &err), 0);
    char *want = tu_read_file(tu_shared("templates/expected/Qwen-Qwen2.5-7B-Instruct__system_user.txt"), NULL);
    assert_non_null(want);
    assert_string_equal(out, want);
    free(want), free(out), free(err);
    /* the template's own refusal comes back as the error, verbatim */
    snprintf(tmpl, sizeof tmpl, "%s", tu_shared("templates/google-gemma-2-2b-it.jinja"));
    snprintf(args, sizeof args, "template --template '%s' --messages '%s' --context '%s'", tmpl, msgs, ctx);
    assert_int_equal(run(args, &out, &err), 1);
    assert_non_null(strstr(err, "System role not supported"));
    free(out), free(err);
}

static void test_template_builtin_and_errors(void **state) {
    (void)state;
    char args[8192], *out = NULL, *err = NULL;
    const char *msgs = "[{\"role\": \"user\", \"content\": \"Hi\"}]";
    assert_int_equal(tu_write_file(tu_tmp("hi.json"), msgs, strlen(msgs)), 0);
    snprintf(args, sizeof args, "template --template chatml --messages '%s'", tu_tmp("hi.json"));
    assert_int_equal(run(args, &out, &err), 0);
    assert_string_equal(out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    free(out), free(err);
    snprintf(args, sizeof args, "template --template chatml --messages '%s' --no-generation-prompt", tu_tmp("hi.json"));
    assert_int_equal(run(args, &out, &err), 0);
    assert_string_equal(out, "<|im_start|>user\nHi<|im_end|>\n");
    free(out), free(err);
    /* a model without a template says so and names the way out */
    snprintf(args, sizeof args, "template -m '%s' --messages '%s'", tu_shared("models/stories260K.gguf"), tu_tmp("hi.json"));
    assert_int_equal(run(args, &out, &err), 1);
    assert_non_null(strstr(err, "no chat template"));
    free(out), free(err);
    /* malformed messages JSON */
    assert_int_equal(tu_write_file(tu_tmp("bad.json"), "[{", 2), 0);
    snprintf(args, sizeof args, "template --template chatml --messages '%s'", tu_tmp("bad.json"));
    assert_int_equal(run(args, &out, &err), 1);
    assert_non_null(strstr(err, "bad.json"));
    free(out), free(err);
}

/* Two turns with stories260K through the chatml built-in: the second turn
 * prefills only its new tokens. */
static void test_chat_reuses_kv_between_turns(void **state) {
    (void)state;
    assert_int_equal(tu_write_file(tu_tmp("chat-in.txt"), "Once upon a time\nThe dog ran\n", 29), 0);
    char args[8192], *out = NULL, *err = NULL, *out2 = NULL;
    snprintf(args, sizeof args, "chat -m '%s' --chat-template chatml --temp 0 -n 12 < '%s'",
             tu_shared("models/stories260K.gguf"), tu_tmp("chat-in.txt"));
    assert_int_equal(run(args, &out, &err), 0);
    int n1, r1, p1, n2, r2, p2;
    const char *first = strstr(err, "[prompt ");
    assert_non_null(first);
    assert_int_equal(sscanf(first, "[prompt %d tokens: %d reused, %d prefilled", &n1, &r1, &p1), 3);
    const char *second = strstr(first + 1, "[prompt ");
    assert_non_null(second);
    assert_int_equal(sscanf(second, "[prompt %d tokens: %d reused, %d prefilled", &n2, &r2, &p2), 3);
    assert_int_equal(r1, 0);
    assert_true(n2 > n1);
    assert_true(r2 >= n1); /* the whole first prompt stayed in the cache */
    assert_int_equal(p2, n2 - r2);
    assert_true(strlen(out) > 10);
    assert_int_equal(run(args, &out2, NULL), 0);
    assert_string_equal(out, out2); /* greedy: the same replies */
    free(out), free(out2), free(err);
}

/* --session: the second run restores the first's conversation and KV, so
 * its first prompt reuses every token the first run left; another model's
 * run refuses the file with a message and leaves it as it is. */
static void test_chat_session_file(void **state) {
    (void)state;
    char sess[512], in1[512], in2[512];
    snprintf(sess, sizeof sess, "%s", tu_tmp("chat.kts"));
    snprintf(in1, sizeof in1, "%s", tu_tmp("chat-s1.txt"));
    snprintf(in2, sizeof in2, "%s", tu_tmp("chat-s2.txt"));
    unlink(sess);
    assert_int_equal(tu_write_file(in1, "Once upon a time\n", 17), 0);
    assert_int_equal(tu_write_file(in2, "The dog ran\n", 12), 0);
    char args[8192], *out = NULL, *err = NULL;
    snprintf(args, sizeof args, "chat -m '%s' --chat-template chatml --temp 0 -n 12 --session '%s' < '%s'",
             tu_shared("models/stories260K.gguf"), sess, in1);
    assert_int_equal(run(args, &out, &err), 0);
    int n_saved = -1, n_msgs = -1;
    const char *saved = strstr(err, "[saved ");
    assert_non_null(saved);
    assert_int_equal(sscanf(saved, "[saved %d messages and %d tokens", &n_msgs, &n_saved), 2);
    assert_int_equal(n_msgs, 2);
    free(out), free(err);
    snprintf(args, sizeof args, "chat -m '%s' --chat-template chatml --temp 0 -n 12 --session '%s' < '%s'",
             tu_shared("models/stories260K.gguf"), sess, in2);
    assert_int_equal(run(args, &out, &err), 0);
    int n, reused, prefilled;
    const char *p = strstr(err, "[prompt ");
    assert_non_null(strstr(err, "[restored 2 messages"));
    assert_non_null(p);
    assert_int_equal(sscanf(p, "[prompt %d tokens: %d reused, %d prefilled", &n, &reused, &prefilled), 3);
    assert_int_equal(reused, n_saved);
    free(out), free(err);
    size_t before;
    char *was = tu_read_file(sess, &before);
    snprintf(args, sizeof args, "chat -m '%s' --chat-template chatml -n 2 --session '%s' < '%s'",
             tu_shared("models/test-tiny-Q4_0.gguf"), sess, in2);
    assert_int_not_equal(run(args, &out, &err), 0);
    assert_non_null(strstr(err, "another model"));
    size_t after;
    char *now = tu_read_file(sess, &after);
    assert_int_equal(before, after);
    assert_memory_equal(was, now, before);
    free(was), free(now), free(out), free(err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokenize_ids_match_golden),
        cmocka_unit_test(test_tokenize_table_and_pieces),
        cmocka_unit_test(test_tokenize_specials),
        cmocka_unit_test(test_tokenize_errors),
        cmocka_unit_test(test_template_renders_expected),
        cmocka_unit_test(test_template_builtin_and_errors),
        cmocka_unit_test(test_chat_reuses_kv_between_turns),
        cmocka_unit_test(test_chat_session_file),
    };
    return tu_result(cmocka_run_group_tests(tests, NULL, NULL));
}
