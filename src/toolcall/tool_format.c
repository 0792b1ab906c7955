/*
 * tool_format.c - the table of model families' tool-call syntaxes (see
 * format_int.h for what each field means) and their detection from a
 * chat template's text.
 *
 * Detection is by markers the template writes when it renders a call:
 * a family whose template renders calls in its syntax asks the model for
 * the same syntax. Rows are tried in order, the more specific first
 * (Qwen3-Coder's XML before Hermes' JSON, both inside <tool_call>).
 */
#include "toolcall/format_int.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* DeepSeek's markers (fullwidth bars, U+2581 for spaces) */
#define DS_CALLS_BEGIN "<｜tool▁calls▁begin｜>"
#define DS_CALLS_END "<｜tool▁calls▁end｜>"
#define DS_CALL_BEGIN "<｜tool▁call▁begin｜>"
#define DS_CALL_END "<｜tool▁call▁end｜>"
#define DS_SEP "<｜tool▁sep｜>"

static const kt_tool_format FORMATS[] = {
    {.name = "gpt-oss", .detect = {"<|channel|>", "<|message|>"}, .shape = SHAPE_HARMONY, .special_text = true,
     .one_call = true,
     .trigger = "<|channel|>commentary to=functions.", .g_call = "%n <|constrain|>json<|message|>%a",
     .g_think_open = "<|channel|>analysis<|message|>", .g_think_close = "<|end|><|start|>assistant"},
    {.name = "kimi-k2", .detect = {"<|tool_calls_section_begin|>"}, .shape = SHAPE_NAME_ARGS,
     .think_open = "<think>", .think_close = "</think>", .section_open = "<|tool_calls_section_begin|>",
     .section_close = "<|tool_calls_section_end|>", .call_open = "<|tool_call_begin|>",
     .name_end = "<|tool_call_argument_begin|>", .call_close = "<|tool_call_end|>", .special_text = true,
     .trigger = "<|tool_calls_section_begin|>",
     .g_call = "<|tool_call_begin|>functions.%n:%i<|tool_call_argument_begin|>%a<|tool_call_end|>",
     .g_start = "", .g_more = "", .g_end = "<|tool_calls_section_end|>"},
    {.name = "deepseek-r1", .detect = {"tool▁calls▁begin", "```json"},
     .shape = SHAPE_NAME_ARGS, .think_open = "<think>", .think_close = "</think>",
     .section_open = DS_CALLS_BEGIN,
     .section_close = DS_CALLS_END,
     .call_open = DS_CALL_BEGIN "function" DS_SEP,
     .name_end = "\n```json\n",
     .call_close = "\n```" DS_CALL_END,
     .special_text = true,
     .trigger = DS_CALLS_BEGIN,
     .g_call = DS_CALL_BEGIN "function" DS_SEP "%n\n```json\n%a\n```" DS_CALL_END, .g_start = "", .g_more = "",
     .g_end = DS_CALLS_END},
    {.name = "deepseek-v3.1", .detect = {"tool▁calls▁begin", "tool▁sep"},
     .shape = SHAPE_NAME_ARGS, .think_open = "<think>", .think_close = "</think>",
     .section_open = DS_CALLS_BEGIN,
     .section_close = DS_CALLS_END,
     .call_open = DS_CALL_BEGIN,
     .name_end = DS_SEP,
     .call_close = DS_CALL_END, .special_text = true,
     .trigger = DS_CALLS_BEGIN,
     .g_call = DS_CALL_BEGIN "%n" DS_SEP "%a" DS_CALL_END, .g_start = "", .g_more = "", .g_end = DS_CALLS_END},
    {.name = "minimax-m2", .detect = {"<minimax:tool_call>"}, .shape = SHAPE_XML, .think_open = "<think>",
     .think_close = "</think>", .call_open = "<minimax:tool_call>", .call_close = "</minimax:tool_call>",
     .name_open = "<invoke name=\"", .name_end = "\">", .key_open = "<parameter name=\"", .key_close = "\">",
     .value_close = "</parameter>", .fn_close = "</invoke>",
     .trigger = "<minimax:tool_call>", .g_call = "\n<invoke name=\"%n\">\n%p</invoke>\n</minimax:tool_call>",
     .g_param = "<parameter name=\"%k\">%v</parameter>\n"},
    {.name = "glm-4.5", .detect = {"<arg_key>", "<tool_call>"}, .shape = SHAPE_XML, .think_open = "<think>",
     .think_close = "</think>", .call_open = "<tool_call>", .call_close = "</tool_call>", .name_end = "\n",
     .key_open = "<arg_key>", .key_close = "</arg_key>", .value_open = "<arg_value>",
     .value_close = "</arg_value>",
     .trigger = "<tool_call>", .g_call = "%n\n%p</tool_call>",
     .g_param = "<arg_key>%k</arg_key>\n<arg_value>%v</arg_value>\n"},
    {.name = "qwen3-coder", .detect = {"<function=", "<parameter=", "<tool_call>"}, .shape = SHAPE_XML,
     .think_open = "<think>", .think_close = "</think>", .call_open = "<tool_call>", .call_close = "</tool_call>",
     .name_open = "<function=", .name_end = ">", .key_open = "<parameter=", .key_close = ">",
     .value_close = "</parameter>", .fn_close = "</function>",
     .trigger = "<tool_call>", .g_call = "\n<function=%n>\n%p</function>\n</tool_call>",
     .g_param = "<parameter=%k>\n%v\n</parameter>\n"},
    {.name = "hermes", .detect = {"<tool_call>"}, .shape = SHAPE_JSON, .think_open = "<think>",
     .think_close = "</think>", .call_open = "<tool_call>", .call_close = "</tool_call>", .name_key = "name",
     .args_key = "arguments",
     .trigger = "<tool_call>", .g_call = "\n{\"name\": \"%n\", \"arguments\": %a}\n</tool_call>"},
    {.name = "functionary-v3.2", .detect = {">>>all"}, .shape = SHAPE_NAME_ARGS, .call_open = ">>>",
     .name_end = "\n", .reply_open = ">>>", .text_name = "all",
     .trigger = ">>>", .g_call = "%n\n%a", .g_start = "", .g_more = ">>>", .g_end = ""},
    {.name = "functionary-v3.1", .detect = {"<function=", "<|python_tag|>"}, .shape = SHAPE_NAME_ARGS,
     .call_open = "<function=", .name_end = ">", .call_close = "</function>", .special_text = true,
     .trigger = "<function=", .g_call = "%n>%a</function>"},
    {.name = "mistral", .detect = {"[TOOL_CALLS]", "[ARGS]"}, .shape = SHAPE_NAME_ARGS, .call_open = "[TOOL_CALLS]",
     .name_end = "[ARGS]", .special_text = true, .ids = IDS_MISTRAL9,
     .trigger = "[TOOL_CALLS]", .g_call = "%n[ARGS]%a"},
    {.name = "mistral-nemo", .detect = {"[TOOL_CALLS]"}, .shape = SHAPE_JSON, .section_open = "[TOOL_CALLS]",
     .json_list = true, .name_key = "name", .args_key = "arguments", .special_text = true, .ids = IDS_MISTRAL9,
     .trigger = "[TOOL_CALLS]", .g_call = "{\"name\": \"%n\", \"arguments\": %a}", .g_start = "[",
     .g_more = ", ", .g_end = "]"},
    {.name = "command-r7b", .detect = {"<|START_ACTION|>"}, .shape = SHAPE_JSON, .section_open = "<|START_ACTION|>",
     .section_close = "<|END_ACTION|>", .json_list = true, .name_key = "tool_name", .args_key = "parameters",
     .think_open = "<|START_THINKING|>", .think_close = "<|END_THINKING|>",
     .strip = {"<|START_RESPONSE|>", "<|END_RESPONSE|>"}, .special_text = true,
     .trigger = "<|START_ACTION|>",
     .g_call = "{\"tool_call_id\": \"%i\", \"tool_name\": \"%n\", \"parameters\": %a}", .g_start = "[\n    ",
     .g_more = ",\n    ", .g_end = "\n]<|END_ACTION|>"},
    {.name = "command-r-plus", .detect = {"<|START_OF_TURN_TOKEN|>", "Action:", "```json"}, .shape = SHAPE_JSON,
     .section_open = "Action: ```json", .section_close = "```", .json_list = true, .name_key = "tool_name",
     .args_key = "parameters", .special_text = true,
     .trigger = "Action: ```json", .g_call = "{\"tool_name\": \"%n\", \"parameters\": %a}",
     .g_start = "\n[\n    ", .g_more = ",\n    ", .g_end = "\n]\n```"},
    {.name = "granite", .detect = {"<|tool_call|>"}, .shape = SHAPE_JSON, .section_open = "<|tool_call|>",
     .json_list = true, .name_key = "name", .args_key = "arguments", .think_open = "<think>",
     .think_close = "</think>", .think_var = "thinking", .strip = {"<response>", "</response>"}, .special_text = true,
     .trigger = "<|tool_call|>", .g_call = "{\"name\": \"%n\", \"arguments\": %a}", .g_start = "[",
     .g_more = ", ", .g_end = "]"},
    {.name = "llama3", .detect = {"<|start_header_id|>", "\"parameters\""}, .shape = SHAPE_JSON,
     .call_open = "{\"name\"", .call_open2 = "<|python_tag|>", .name_key = "name", .args_key = "parameters",
     .special_text = true, .one_call = true, .builtin_var = "builtin_tools",
     .trigger = "{\"name\"", .trigger2 = "<|python_tag|>", .g_call = "{\"name\": \"%n\", \"parameters\": %a}"},
};

/* For templates of no known family: calls as Hermes writes them. */
static const kt_tool_format GENERIC = {.name = "generic", .shape = SHAPE_JSON, .think_open = "<think>",
                                       .think_close = "</think>", .think_var = "enable_thinking",
     .call_open = "<tool_call>",
                                       .call_close = "</tool_call>", .name_key = "name", .args_key = "arguments",
                                       .trigger = "<tool_call>",
                                       .g_call = "\n{\"name\": \"%n\", \"arguments\": %a}\n</tool_call>"};

#define N_FORMATS (sizeof FORMATS / sizeof FORMATS[0])

static bool matches(const kt_tool_format *f, const char *t) {
    for (int i = 0; i < 3; i++)
        if (f->detect[i] && !strstr(t, f->detect[i])) return false;
    return !(f->unless && f->unless[0] && strstr(t, f->unless));
}

const kt_tool_format *kt_tool_format_detect(const char *template_text) {
    if (template_text)
        for (size_t i = 0; i < N_FORMATS; i++)
            if (matches(&FORMATS[i], template_text)) return &FORMATS[i];
    return &GENERIC;
}

const kt_tool_format *kt_tool_format_by_name(const char *name) {
    if (!strcmp(name, GENERIC.name)) return &GENERIC;
    for (size_t i = 0; i < N_FORMATS; i++)
        if (!strcmp(FORMATS[i].name, name)) return &FORMATS[i];
    return NULL;
}

const char *kt_tool_format_name(const kt_tool_format *f) { return f->name; }

const char *kt_tool_format_names(void) {
    return "gpt-oss, kimi-k2, deepseek-r1, deepseek-v3.1, minimax-m2, glm-4.5, qwen3-coder, hermes, "
           "functionary-v3.2, functionary-v3.1, mistral, mistral-nemo, command-r7b, command-r-plus, granite, llama3, generic";
}

bool kt_tool_format_special_text(const kt_tool_format *f) { return f->special_text; }

const char *kt_tool_format_think_var(const kt_tool_format *f) {
    return f->think_var && f->think_var[0] ? f->think_var : NULL;
}

const char *kt_tool_format_think_close(const kt_tool_format *f) {
    return f->think_close && f->think_close[0] ? f->think_close : NULL;
}

const char *kt_tool_format_think_open(const kt_tool_format *f) {
    return f->think_open && f->think_open[0] ? f->think_open : NULL;
}

const json_t *tc_find_tool(const json_t *tools, const char *name, size_t len) {
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *n = json_object_get(json_object_get(t, "function"), "name");
        if (json_is_string(n) && json_string_length(n) == len && !memcmp(json_string_value(n), name, len)) return t;
    }
    return NULL;
}

/* ---- Llama 3.1's built-in tools ---- */

bool tc_is_builtin_call(const char *name) {
    return name && (!strcmp(name, "brave_search") || !strcmp(name, "wolfram_alpha"));
}

bool tc_is_code_tool(const char *name) { return name && (!strcmp(name, "python") || !strcmp(name, "code_interpreter")); }

const char *tc_code_tool(const json_t *tools, const char **param) {
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *fn = json_object_get(t, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (!tc_is_code_tool(name)) continue;
        json_t *props = json_object_get(json_object_get(fn, "parameters"), "properties");
        *param = json_object_size(props) == 1 ? json_object_iter_key(json_object_iter(props)) : "code";
        return name;
    }
    return NULL;
}

/* ---- call ids ---- */

static uint64_t mix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

void kt_tool_call_id(const kt_tool_format *f, const char *seed, int i, char *out, size_t cap) {
    static const char ALNUM[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *s = seed ? seed : ""; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    h = mix(h ^ (uint64_t)i);
    const bool short9 = f->ids == IDS_MISTRAL9;
    size_t n = short9 ? 9 : 24, at = 0;
    if (!short9 && cap > 5) memcpy(out, "call_", 5), at = 5;
    for (size_t k = 0; k < n && at + 1 < cap; k++) {
        if (k % 8 == 0) h = mix(h + k);
        out[at++] = ALNUM[h % 62];
        h /= 62;
    }
    out[at < cap ? at : cap - 1] = 0;
}
