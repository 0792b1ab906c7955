/*
 * fuzz_jinja.c - libFuzzer target: the Jinja lexer, parser and evaluator
 * (text/jinja.h) on arbitrary template text, rendered with a small fixed
 * set of chat variables. A chat template comes from a downloaded GGUF, so
 * it is hostile input: whatever it does (loops, recursion, huge strings
 * or ranges) must end in an error value within the fuzzer's time and
 * memory limits, never a hang, a crash or an exhausted machine.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja.h"

/* Messages of every role, a tool, the usual flags: what a chat render
 * gets (see text/chat.c), so templates reach their real branches. */
static const char VARS_JSON[] =
    "{\"messages\":["
    "{\"role\":\"system\",\"content\":\"You are helpful.\"},"
    "{\"role\":\"user\",\"content\":\"Hi \\u00e9\\ud83d\\ude00\"},"
    "{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":\"think\","
    "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
    "\"function\":{\"name\":\"get\",\"arguments\":{\"x\":1}}}]},"
    "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"42\"},"
    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"part\"}]}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get\",\"description\":\"d\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"}},"
    "\"required\":[\"x\"]}}}],"
    "\"add_generation_prompt\":true,\"bos_token\":\"<s>\",\"eos_token\":\"</s>\","
    "\"enable_thinking\":false}";

static json_t *vars;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    vars = json_loads(VARS_JSON, 0, NULL);
    return vars ? 0 : 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* the parser takes NUL-terminated text: copy and terminate */
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    kt_error err = {0};
    kt_jinja *t = kt_jinja_parse(text, &err);
    free(text);
    if (!t) return 0;
    const kt_jinja_options opts = {.now = 1700000000}; /* fixed: runs must repeat */
    char *out = kt_jinja_render(t, vars, &opts, &err);
    free(out);
    kt_jinja_free(t);
    return 0;
}
