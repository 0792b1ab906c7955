/*
 * test_toolcall.c - the tool-call formats (src/toolcall/): every family's
 * parser on hand-written model outputs, whole and cut at every byte (the
 * streamed deltas must join to the whole answer, arguments only ever
 * append, no marker ever reaches content); the family's required-call
 * grammar accepting the call its parser reads; detection of the real
 * templates in shared/templates; and the conversation preparation
 * (null content, string arguments, Mistral ids, templates without tools).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include <dirent.h>

#include "grammar/grammar.h"
#include "text/chat_builtin.h"
#include "testutil.h"
#include "toolcall/toolcall.h"

/* Iterates the .jinja files of shared/templates (name: the file name). */
#define DIR_LIST_TEMPLATES(name)                                                                                       \
    DIR *dir_ = opendir(tu_shared("templates"));                                                                       \
    assert_non_null(dir_);                                                                                             \
    for (struct dirent *de_; (de_ = readdir(dir_));)                                                                   \
        for (const char *name = de_->d_name; name && strlen(name) > 6 && !strcmp(name + strlen(name) - 6, ".jinja");  \
             name = NULL)
#define DIR_LIST_END closedir(dir_)

/* ---- gathering deltas ---- */

#define MAX_CALLS 8

typedef struct got {
    char content[4096], reasoning[4096];
    size_t n_content, n_reasoning;
    int n_calls;
    char names[MAX_CALLS][64], ids[MAX_CALLS][48], args[MAX_CALLS][1024];
    size_t n_args[MAX_CALLS];
    int order_errors; /* arguments before their call, a call announced twice */
} got;

static void put(char *dst, size_t *n, size_t cap, const char *s, size_t k) {
    assert_true(*n + k < cap);
    memcpy(dst + *n, s, k);
    *n += k;
    dst[*n] = 0;
}

static bool collect(void *ctx, const kt_tool_delta *d) {
    got *g = ctx;
    switch (d->kind) {
    case KT_TD_CONTENT: put(g->content, &g->n_content, sizeof g->content, d->text, d->len); break;
    case KT_TD_REASONING: put(g->reasoning, &g->n_reasoning, sizeof g->reasoning, d->text, d->len); break;
    case KT_TD_CALL:
        if (d->index != g->n_calls || d->index >= MAX_CALLS) g->order_errors++;
        else {
            snprintf(g->names[d->index], sizeof g->names[0], "%.*s", (int)d->len, d->text);
            snprintf(g->ids[d->index], sizeof g->ids[0], "%s", d->id);
            g->n_calls++;
        }
        break;
    case KT_TD_ARGS:
        if (d->index < 0 || d->index >= g->n_calls) g->order_errors++;
        else put(g->args[d->index], &g->n_args[d->index], sizeof g->args[0], d->text, d->len);
        break;
    }
    return true;
}

static const char *TOOLS_JSON =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"}},\"required\":[\"city\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"brave_search\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"query\":{\"type\":\"string\"},\"count\":{\"type\":\"integer\"}},\"required\":[\"query\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"python\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"code\":{\"type\":\"string\"}},\"required\":[\"code\"]}}}]";

/* Parses text fed in pieces cut at `cuts` (ascending, < n; may be NULL). */
static void parse_cut(const char *family, const char *text, const size_t *cuts, int n_cuts, bool in_thinking,
                      bool calls, got *g) {
    memset(g, 0, sizeof *g);
    json_t *tools = json_loads(TOOLS_JSON, 0, NULL);
    assert_non_null(tools);
    const kt_tool_format *f = kt_tool_format_by_name(family);
    assert_non_null(f);
    kt_tool_parse_opts o = {.calls = calls, .reasoning = true, .in_thinking = in_thinking, .tools = tools,
                            .id_seed = "chatcmpl-test"};
    kt_tool_parser *p = kt_tool_parser_new(f, &o, collect, g);
    assert_non_null(p);
    size_t n = strlen(text), at = 0;
    for (int i = 0; i < n_cuts; i++) {
        assert_true(kt_tool_parser_feed(p, text + at, cuts[i] - at, false));
        at = cuts[i];
    }
    assert_true(kt_tool_parser_feed(p, text + at, n - at, true));
    assert_int_equal(kt_tool_parser_calls(p), g->n_calls);
    kt_tool_parser_free(p);
    json_decref(tools);
}

/* A reply max_tokens cut inside a call marker ("<t", "<tool" of
 * "<tool_call>") shows no marker fragment as content; the same text at a
 * normal end is the answer's ("a < b and <tool" above). */
static void test_parse_cut_marker(void **state) {
    (void)state;
    static const char *const texts[][2] = {{"Let me look.<t", "Let me look."}, {"Sure <tool", "Sure "},
                                           {"x <tool_cal", "x "}, {"a < b", "a < b"}};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        got g;
        memset(&g, 0, sizeof g);
        kt_tool_parse_opts o = {.calls = true, .reasoning = true, .id_seed = "chatcmpl-test"};
        kt_tool_parser *p = kt_tool_parser_new(kt_tool_format_by_name("hermes"), &o, collect, &g);
        assert_non_null(p);
        assert_true(kt_tool_parser_feed(p, texts[i][0], strlen(texts[i][0]) - 2, false));
        kt_tool_parser_cut(p);
        assert_true(kt_tool_parser_feed(p, texts[i][0] + strlen(texts[i][0]) - 2, 2, true));
        if (strcmp(g.content, texts[i][1])) fail_msg("'%s' cut: content '%s', want '%s'", texts[i][0], g.content, texts[i][1]);
        kt_tool_parser_free(p);
    }
}

typedef struct pcase {
    const char *family, *text;
    const char *content, *reasoning;
    const char *calls[3][2]; /* name, arguments (JSON, compared as values) */
    bool in_thinking;
} pcase;

#define TC_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define TC_END "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>"
#define T_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define T_END "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>"
#define T_SEP "<\xef\xbd\x9ctool\xe2\x96\x81sep\xef\xbd\x9c>"

static const pcase CASES[] = {
    {"hermes", "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
     "Let me check.", "", {{"get_weather", "{\"city\": \"Paris\"}"}}, false},
    {"hermes",
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>\n"
     "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
     "", "", {{"get_weather", "{\"city\": \"Paris\", \"days\": 3}"}, {"get_time", "{}"}}, false},
    {"hermes", "<think>\nThe user wants weather.\n</think>\n\n<tool_call>\n{\"arguments\": {\"city\": \"Oslo\"}, \"name\": "
               "\"get_weather\"}\n</tool_call>",
     "", "The user wants weather.", {{"get_weather", "{\"city\": \"Oslo\"}"}}, false},
    {"hermes", "I think about it.\n</think>\n\nIt is sunny in <b>Paris</b> {not a call}.", "It is sunny in <b>Paris</b> {not a call}.",
     "I think about it.", {{0}}, true},
    {"hermes", "a < b and <tool", "a < b and <tool", "", {{0}}, false},
    {"hermes", "<tool_call>not json at all", "<tool_call>not json at all", "", {{0}}, false},
    /* cut by max_tokens: a call not yet named is dropped, a named one keeps what it has */
    {"hermes", "Sure.\n<tool_call>\n{\"name\": \"get_wea", "Sure.", "", {{0}}, false},
    {"hermes", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa", "", "",
     {{"get_weather", "~{\"city\": \"Pa"}}, false},
    {"hermes", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Rome\\\"}\"}\n</tool_call>", "", "",
     {{"get_weather", "{\"city\": \"Rome\"}"}}, false},
    {"generic", "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>", "", "", {{"get_time", "{}"}}, false},
    {"qwen3-coder",
     "<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Jose, CA\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
     "</function>\n</tool_call>",
     "", "", {{"get_weather", "{\"city\": \"San Jose, CA\", \"days\": 3}"}}, false},
    {"qwen3-coder", "<tool_call>\n<function=get_time>\n</function>\n</tool_call>", "", "", {{"get_time", "{}"}}, false},
    {"glm-4.5", "<think>hm</think>Sure.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
                "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>",
     "Sure.", "hm", {{"get_weather", "{\"city\": \"Paris\", \"days\": 2}"}}, false},
    {"glm-4.5", "<tool_call>get_time</tool_call>", "", "", {{"get_time", "{}"}}, false},
    {"minimax-m2",
     "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Lima</parameter>\n</invoke>\n"
     "</minimax:tool_call>",
     "", "", {{"get_weather", "{\"city\": \"Lima\"}"}}, false},
    {"llama3", "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "", "",
     {{"get_weather", "{\"city\": \"Paris\"}"}}, false},
    {"llama3", "<|python_tag|>{\"name\": \"get_time\", \"parameters\": {}}", "", "", {{"get_time", "{}"}}, false},
    {"llama3", "The answer is {x} and {\"a\": 1}.", "The answer is {x} and {\"a\": 1}.", "", {{0}}, false},
    /* Llama 3.1's built-in tools: Python after <|python_tag|> */
    {"llama3", "<|python_tag|>brave_search.call(query=\"weather in Paris, \\\"today\\\"\", count=3)", "", "",
     {{"brave_search", "{\"query\": \"weather in Paris, \\\"today\\\"\", \"count\": 3}"}}, false},
    {"llama3", "<|python_tag|>brave_search.call(query='it\\'s (maybe) sunny')", "", "",
     {{"brave_search", "{\"query\": \"it's (maybe) sunny\"}"}}, false},
    {"llama3", "<|python_tag|>import math\nprint(\"pi\", math.pi)", "", "",
     {{"python", "{\"code\": \"import math\\nprint(\\\"pi\\\", math.pi)\"}"}}, false},
    {"llama3", "<|python_tag|>get_time.call()", "", "", {{"get_time", "{}"}}, false},
    {"llama3", "<|python_tag|>brave_search.call(query=make_query(1))", "", "",
     {{"python", "{\"code\": \"brave_search.call(query=make_query(1))\"}"}}, false},
    /* functionary v3.2: the prompt ends with `>>>`, `all` is the text */
    {"functionary-v3.2", "all\nLet me check.>>>get_weather\n{\"city\": \"Paris\"}", "Let me check.", "",
     {{"get_weather", "{\"city\": \"Paris\"}"}}, false},
    {"functionary-v3.2", "get_weather\n{\"city\": \"Paris\", \"days\": 2}>>>get_time\n{}", "", "",
     {{"get_weather", "{\"city\": \"Paris\", \"days\": 2}"}, {"get_time", "{}"}}, false},
    {"functionary-v3.2", "all\nIt is 3 > 2 and 2 >> 1.", "It is 3 > 2 and 2 >> 1.", "", {{0}}, false},
    {"functionary-v3.2", "Hello without a recipient", "Hello without a recipient", "", {{0}}, false},
    {"functionary-v3.2", "python\nprint(1)\n>>>get_time\n{}", "", "",
     {{"python", "{\"code\": \"print(1)\\n\"}"}, {"get_time", "{}"}}, false},
    {"mistral", "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[ARGS]{}", "", "",
     {{"get_weather", "{\"city\": \"Paris\"}"}, {"get_time", "{}"}}, false},
    {"mistral-nemo",
     "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abc123xyz\"}, "
     "{\"name\": \"get_time\", \"arguments\": {}}]",
     "", "", {{"get_weather", "{\"city\": \"Paris\"}"}, {"get_time", "{}"}}, false},
    {"deepseek-r1",
     "<think>\nhmm\n</think>\n\n" TC_BEGIN T_BEGIN "function" T_SEP "get_weather\n```json\n{\"city\": \"Paris\"}\n```" T_END TC_END,
     "", "hmm", {{"get_weather", "{\"city\": \"Paris\"}"}}, false},
    {"deepseek-v3.1",
     "Checking." TC_BEGIN T_BEGIN "get_weather" T_SEP "{\"city\": \"Paris\"}" T_END T_BEGIN "get_time" T_SEP "{}" T_END TC_END,
     "Checking.", "", {{"get_weather", "{\"city\": \"Paris\"}"}, {"get_time", "{}"}}, false},
    {"kimi-k2",
     "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
     "{\"city\": \"Paris\"}<|tool_call_end|><|tool_calls_section_end|>",
     "", "", {{"get_weather", "{\"city\": \"Paris\"}"}}, false},
    {"functionary-v3.1", "<function=get_weather>{\"city\": \"Paris\"}</function>", "", "",
     {{"get_weather", "{\"city\": \"Paris\"}"}}, false},
    {"command-r7b",
     "<|START_THINKING|>I will look it up.<|END_THINKING|><|START_ACTION|>[\n    {\"tool_call_id\": \"0\", "
     "\"tool_name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}\n]<|END_ACTION|>",
     "", "I will look it up.", {{"get_weather", "{\"city\": \"Paris\"}"}}, false},
    {"command-r7b", "<|START_RESPONSE|>Hello there.<|END_RESPONSE|>", "Hello there.", "", {{0}}, false},
    {"command-r-plus",
     "Action: ```json\n[\n    {\"tool_name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}\n]\n```", "", "",
     {{"get_weather", "{\"city\": \"Paris\"}"}}, false},
    {"granite", "<|tool_call|>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]", "", "",
     {{"get_weather", "{\"city\": \"Paris\"}"}}, false},
    {"gpt-oss",
     "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
     "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}",
     "", "Need the weather.", {{"get_weather", "{\"city\": \"Paris\"}"}}, false},
    {"gpt-oss", "<|channel|>analysis<|message|>Simple.<|end|><|start|>assistant<|channel|>final<|message|>Hi there!",
     "Hi there!", "Simple.", {{0}}, false},
};

static void expect_case(const pcase *c, const got *g) {
    if (strcmp(g->content, c->content) || strcmp(g->reasoning, c->reasoning ? c->reasoning : ""))
        fail_msg("%s: content '%s' (want '%s'), reasoning '%s' (want '%s')\n%s", c->family, g->content, c->content,
                 g->reasoning, c->reasoning, c->text);
    int want = 0;
    while (want < 3 && c->calls[want][0]) want++;
    if (g->n_calls != want) fail_msg("%s: %d calls, want %d\n%s", c->family, g->n_calls, want, c->text);
    assert_int_equal(g->order_errors, 0);
    for (int i = 0; i < want; i++) {
        assert_string_equal(g->names[i], c->calls[i][0]);
        if (c->calls[i][1][0] == '~') { /* raw text: a call cut short */
            assert_string_equal(g->args[i], c->calls[i][1] + 1);
            continue;
        }
        json_t *a = json_loads(g->args[i], 0, NULL), *b = json_loads(c->calls[i][1], 0, NULL);
        if (!a || !json_equal(a, b)) fail_msg("%s: call %d arguments '%s', want %s", c->family, i, g->args[i], c->calls[i][1]);
        json_decref(a), json_decref(b);
        assert_true(strlen(g->ids[i]) >= 9);
    }
}

static void test_parsers_whole(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        got g;
        parse_cut(CASES[i].family, CASES[i].text, NULL, 0, CASES[i].in_thinking, true, &g);
        expect_case(&CASES[i], &g);
    }
}

static bool same(const got *a, const got *b) {
    if (strcmp(a->content, b->content) || strcmp(a->reasoning, b->reasoning) || a->n_calls != b->n_calls) return false;
    for (int i = 0; i < a->n_calls; i++)
        if (strcmp(a->names[i], b->names[i]) || strcmp(a->args[i], b->args[i]) || strcmp(a->ids[i], b->ids[i]))
            return false;
    return true;
}

/* Streaming: cut once at every byte, and fed one byte at a time, the
 * deltas are exactly the whole parse's. */
static void test_parsers_cut_everywhere(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        const pcase *c = &CASES[i];
        got whole, part;
        parse_cut(c->family, c->text, NULL, 0, c->in_thinking, true, &whole);
        size_t n = strlen(c->text);
        for (size_t k = 1; k < n; k++) {
            parse_cut(c->family, c->text, &k, 1, c->in_thinking, true, &part);
            if (!same(&whole, &part))
                fail_msg("%s cut at %zu: content '%s' vs '%s'\n%s", c->family, k, part.content, whole.content, c->text);
        }
        size_t *cuts = malloc(sizeof *cuts * n);
        assert_non_null(cuts);
        for (size_t k = 1; k < n; k++) cuts[k - 1] = k;
        parse_cut(c->family, c->text, cuts, (int)n - 1, c->in_thinking, true, &part);
        free(cuts);
        if (!same(&whole, &part)) fail_msg("%s byte by byte: content '%s'\n%s", c->family, part.content, c->text);
    }
}

/* tool_choice "none": calls are not parsed, the text is content (and
 * thinking still goes apart). */
static void test_parser_without_calls(void **state) {
    (void)state;
    got g;
    parse_cut("hermes", "<think>x</think>\n<tool_call>\n{\"name\": \"get_time\"}\n</tool_call>", NULL, 0, false, false, &g);
    assert_int_equal(g.n_calls, 0);
    assert_string_equal(g.reasoning, "x");
    assert_string_equal(g.content, "<tool_call>\n{\"name\": \"get_time\"}\n</tool_call>");
}

/* ---- grammars ---- */

typedef struct gcase {
    const char *family;
    const char *reply; /* a whole reply under tool_choice required */
    bool in_thinking;
} gcase;

static const gcase GRAMMAR_CASES[] = {
    {"hermes", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", false},
    {"hermes", "<think>\nLet me see.\n</think>\n\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>", false},
    {"generic", "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>", false},
    {"qwen3-coder", "<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Jose, CA\n</parameter>\n<parameter=days>\n3\n"
                    "</parameter>\n</function>\n</tool_call>", false},
    {"glm-4.5", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>", false},
    {"minimax-m2", "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Lima</parameter>\n</invoke>\n"
                   "</minimax:tool_call>", false},
    {"llama3", "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", false},
    {"mistral", "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}", false},
    {"mistral-nemo", "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"get_time\", "
                     "\"arguments\": {}}]", false},
    {"deepseek-r1", "Thinking done.\n</think>\n\n" TC_BEGIN T_BEGIN "function" T_SEP "get_weather\n```json\n{\"city\": \"Paris\"}\n```" T_END TC_END, true},
    {"deepseek-v3.1", TC_BEGIN T_BEGIN "get_weather" T_SEP "{\"city\": \"Paris\"}" T_END TC_END, false},
    {"kimi-k2", "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
                "{\"city\": \"Paris\"}<|tool_call_end|><|tool_calls_section_end|>", false},
    {"functionary-v3.1", "<function=get_weather>{\"city\": \"Paris\"}</function>", false},
    {"command-r7b", "<|START_ACTION|>[\n    {\"tool_call_id\": \"0\", \"tool_name\": \"get_weather\", \"parameters\": "
                    "{\"city\": \"Paris\"}}\n]<|END_ACTION|>", false},
    {"command-r-plus", "Action: ```json\n[\n    {\"tool_name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}\n]\n```", false},
    {"granite", "<|tool_call|>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]", false},
    {"functionary-v3.2", "get_weather\n{\"city\": \"Paris\"}>>>get_time\n{}", false},
    {"gpt-oss", "<|channel|>analysis<|message|>Need it.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
                "<|constrain|>json<|message|>{\"city\": \"Paris\"}", false},
};

static kt_grammar *compile(const char *gbnf) {
    kt_error err = {0};
    kt_grammar *g = kt_grammar_parse(gbnf, strlen(gbnf), NULL, &err);
    if (!g) fail_msg("tool grammar does not parse: %s\n%s", err.msg, gbnf);
    return g;
}

/* The required-call grammar accepts the reply the family's parser reads
 * as a call, and refuses plain text and a call of a function not offered;
 * the trigger grammar accepts what follows the trigger. */
static void test_grammars_accept_their_calls(void **state) {
    (void)state;
    json_t *tools = json_loads(TOOLS_JSON, 0, NULL);
    for (size_t i = 0; i < sizeof GRAMMAR_CASES / sizeof GRAMMAR_CASES[0]; i++) {
        const gcase *c = &GRAMMAR_CASES[i];
        const kt_tool_format *f = kt_tool_format_by_name(c->family);
        kt_tool_grammar tg;
        kt_error err = {0};
        assert_int_equal(kt_tool_grammar_build(f, tools, KT_TOOL_REQUIRED, NULL, true, c->in_thinking ? KT_THINK_OPEN : KT_THINK_MAYBE, NULL, NULL, NULL, &tg, &err),
                         KT_OK);
        kt_grammar *g = compile(tg.grammar);
        if (!kt_grammar_accepts(g, (const uint8_t *)c->reply, strlen(c->reply)))
            fail_msg("%s: the required grammar refuses\n%s\n--- grammar:\n%s", c->family, c->reply, tg.grammar);
        assert_false(kt_grammar_accepts(g, (const uint8_t *)"Hello.", 6));
        kt_grammar_free(g);
        /* after the trigger */
        const char *at = strstr(c->reply, tg.triggers[0]);
        assert_non_null(at);
        const char *rest = at + strlen(tg.triggers[0]);
        if (!strcmp(c->family, "llama3")) rest = at + strlen(tg.triggers[0]);
        g = compile(tg.trigger_grammars[0]);
        if (!kt_grammar_accepts(g, (const uint8_t *)rest, strlen(rest)))
            fail_msg("%s: the trigger grammar refuses\n%s\n--- grammar:\n%s", c->family, rest, tg.trigger_grammars[0]);
        kt_grammar_free(g);
        /* the reply parses back to a call of get_weather or get_time */
        got gt;
        parse_cut(c->family, c->reply, NULL, 0, c->in_thinking, true, &gt);
        assert_true(gt.n_calls >= 1);
        assert_true(!strcmp(gt.names[0], "get_weather") || !strcmp(gt.names[0], "get_time"));
        assert_string_equal(gt.content, "");
        kt_tool_grammar_free(&tg);
    }
    json_decref(tools);
}

static void expect_accepts(const char *gbnf, const char *text, bool want) {
    kt_grammar *g = compile(gbnf);
    if (kt_grammar_accepts(g, (const uint8_t *)text, strlen(text)) != want)
        fail_msg("the grammar %s\n%s\n--- grammar:\n%.3000s", want ? "refuses" : "accepts", text, gbnf);
    kt_grammar_free(g);
}

/* The grammar of family's calls of `tools` under `choice` (no response
 * format, no control tokens); it must build. */
static void build_ok(const char *family, const json_t *tools, kt_tool_choice choice, bool parallel, kt_tool_think think,
                     kt_tool_grammar *tg) {
    kt_error err = {0};
    kt_status st = kt_tool_grammar_build(kt_tool_format_by_name(family), tools, choice, NULL, parallel, think, NULL,
                                         NULL, NULL, tg, &err);
    if (st != KT_OK) fail_msg("%s: %s", family, err.msg);
}

/* Llama 3.1's built-in tools: after <|python_tag|>, NAME.call(...) with
 * the schema's keywords, or code for the code tool; JSON still works. */
static void test_grammar_llama_builtins(void **state) {
    (void)state;
    json_t *tools = json_loads(TOOLS_JSON, 0, NULL);
    kt_tool_grammar tg;
    build_ok("llama3", tools, KT_TOOL_REQUIRED, false, KT_THINK_MAYBE, &tg);
    expect_accepts(tg.grammar, "{\"name\": \"get_time\", \"parameters\": {}}", true);
    expect_accepts(tg.grammar, "<|python_tag|>brave_search.call(query=\"Paris\")", true);
    expect_accepts(tg.grammar, "<|python_tag|>brave_search.call(query=\"Paris\", count=2)", true);
    expect_accepts(tg.grammar, "<|python_tag|>print(6 * 7)", true);
    expect_accepts(tg.grammar, "<|python_tag|>{\"name\": \"get_time\", \"parameters\": {}}", true);
    expect_accepts(tg.grammar, "<|python_tag|>{\"name\": \"nope\", \"parameters\": {}}", false); /* not offered */
    assert_int_equal(tg.n_triggers, 2);
    expect_accepts(tg.trigger_grammars[1], "brave_search.call(query=\"x\")", true);
    expect_accepts(tg.trigger_grammars[1], "import os", true);
    kt_tool_grammar_free(&tg);
    /* without a code tool, only the keywords of the schema */
    json_array_remove(tools, 3);
    build_ok("llama3", tools, KT_TOOL_REQUIRED, false, KT_THINK_MAYBE, &tg);
    expect_accepts(tg.grammar, "<|python_tag|>brave_search.call(query=\"Paris\")", true);
    expect_accepts(tg.grammar, "<|python_tag|>brave_search.call(count=2)", false); /* query is required */
    expect_accepts(tg.grammar, "<|python_tag|>print(6 * 7)", false);
    kt_tool_grammar_free(&tg);
    json_decref(tools);
}

/* A parameter schema that says nothing of other properties gets none in
 * a call (strict mode's reading); one that allows them keeps them. */
static void test_grammar_closes_objects(void **state) {
    (void)state;
    json_t *tools = json_loads(TOOLS_JSON, 0, NULL);
    kt_tool_grammar tg;
    build_ok("hermes", tools, KT_TOOL_REQUIRED, false, KT_THINK_DONE, &tg);
    const char *plain = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    const char *extra =
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"x\": 1}}\n</tool_call>";
    expect_accepts(tg.grammar, plain, true);
    expect_accepts(tg.grammar, extra, false);
    kt_tool_grammar_free(&tg);
    json_t *params = json_object_get(json_object_get(json_array_get(tools, 0), "function"), "parameters");
    json_object_set_new(params, "additionalProperties", json_true());
    build_ok("hermes", tools, KT_TOOL_REQUIRED, false, KT_THINK_DONE, &tg);
    expect_accepts(tg.grammar, extra, true);
    kt_tool_grammar_free(&tg);
    json_decref(tools);
}

/* functionary v3.2 under auto: the whole reply is constrained from the
 * `>>>` the prompt ends with: `all` and free text, then maybe calls, or
 * calls right away; never a function that is not offered. */
static void test_grammar_open_reply(void **state) {
    (void)state;
    json_t *tools = json_loads(TOOLS_JSON, 0, NULL);
    kt_tool_grammar tg;
    build_ok("functionary-v3.2", tools, KT_TOOL_AUTO, true, KT_THINK_MAYBE, &tg);
    assert_non_null(tg.grammar);
    expect_accepts(tg.grammar, "all\nIt is sunny, 3 > 2 >> 1.", true);
    expect_accepts(tg.grammar, "all\nChecking.>>>get_time\n{}", true);
    expect_accepts(tg.grammar, "get_weather\n{\"city\": \"Oslo\"}>>>get_time\n{}", true);
    expect_accepts(tg.grammar, "all\nChecking.>>>nope\n{}", false);
    expect_accepts(tg.grammar, "Hello.", false);
    kt_tool_grammar_free(&tg);
    build_ok("functionary-v3.2", tools, KT_TOOL_REQUIRED, false, KT_THINK_MAYBE, &tg);
    expect_accepts(tg.grammar, "get_time\n{}", true);
    expect_accepts(tg.grammar, "all\nNo call.", false);
    expect_accepts(tg.grammar, "get_time\n{}>>>get_time\n{}", false); /* parallel_tool_calls false */
    kt_tool_grammar_free(&tg);
    json_decref(tools);
}

/* Parameter schemas enforced only in part are built that far and said in
 * `relaxed`, never refused: Claude Code's Workflow tool (maxLength
 * 524288) in a JSON family, and string keywords the raw-text arguments of
 * an XML family cannot carry; a keyword no format can carry is still an
 * error. */
static void test_grammar_relaxed(void **state) {
    (void)state;
    json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"Workflow\",\"parameters\":{\"type\":"
                               "\"object\",\"properties\":{\"script\":{\"type\":\"string\",\"maxLength\":524288},"
                               "\"id\":{\"type\":\"string\",\"pattern\":\"^[a-z]+$\"}},\"required\":[\"script\"]}}}]",
                               0, NULL);
    assert_non_null(tools);
    kt_tool_grammar tg;
    kt_error err = {0};
    assert_int_equal(kt_tool_grammar_build(kt_tool_format_by_name("hermes"), tools, KT_TOOL_AUTO, NULL, true,
                                           KT_THINK_MAYBE, NULL, NULL, NULL, &tg, &err), KT_OK);
    assert_string_equal(tg.relaxed, "tool 'Workflow': at /properties/script: string length maximum 524288 not enforced "
                                    "(over 10000)");
    kt_tool_grammar_free(&tg);
    assert_int_equal(kt_tool_grammar_build(kt_tool_format_by_name("qwen3-coder"), tools, KT_TOOL_REQUIRED, NULL, true,
                                           KT_THINK_MAYBE, NULL, NULL, NULL, &tg, &err), KT_OK);
    assert_non_null(strstr(tg.relaxed, "tool 'Workflow': parameter 'script': 'maxLength' not enforced"));
    assert_non_null(strstr(tg.relaxed, "parameter 'id': 'pattern' not enforced"));
    kt_tool_grammar_free(&tg);
    json_t *fn = json_object_get(json_array_get(tools, 0), "function");
    json_object_set_new(json_object_get(json_object_get(json_object_get(fn, "parameters"), "properties"), "id"),
                        "contentMediaType", json_string("text/x"));
    assert_int_equal(kt_tool_grammar_build(kt_tool_format_by_name("qwen3-coder"), tools, KT_TOOL_AUTO, NULL, true,
                                           KT_THINK_MAYBE, NULL, NULL, NULL, &tg, &err), KT_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "'contentMediaType'"));
    json_decref(tools);
}

/* A named function: only it; a name not offered is an error naming it. */
static void test_grammar_named(void **state) {
    (void)state;
    json_t *tools = json_loads(TOOLS_JSON, 0, NULL);
    const kt_tool_format *f = kt_tool_format_by_name("hermes");
    kt_tool_grammar tg;
    kt_error err = {0};
    assert_int_equal(kt_tool_grammar_build(f, tools, KT_TOOL_NAMED, "get_time", false, KT_THINK_MAYBE, NULL, NULL, NULL, &tg, &err), KT_OK);
    kt_grammar *g = compile(tg.grammar);
    const char *ok = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
    const char *other = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"x\"}}\n</tool_call>";
    assert_true(kt_grammar_accepts(g, (const uint8_t *)ok, strlen(ok)));
    assert_false(kt_grammar_accepts(g, (const uint8_t *)other, strlen(other)));
    assert_int_equal(tg.max_calls, 1);
    kt_grammar_free(g);
    kt_tool_grammar_free(&tg);
    assert_int_equal(kt_tool_grammar_build(f, tools, KT_TOOL_NAMED, "nope", false, KT_THINK_MAYBE, NULL, NULL, NULL, &tg, &err), KT_ERR_ARG);
    assert_non_null(strstr(err.msg, "nope"));
    /* arguments must match the schema: a missing required key is refused */
    assert_int_equal(kt_tool_grammar_build(f, tools, KT_TOOL_REQUIRED, NULL, false, KT_THINK_MAYBE, NULL, NULL, NULL, &tg, &err), KT_OK);
    g = compile(tg.grammar);
    const char *missing = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"days\": 3}}\n</tool_call>";
    assert_false(kt_grammar_accepts(g, (const uint8_t *)missing, strlen(missing)));
    kt_grammar_free(g);
    kt_tool_grammar_free(&tg);
    /* none: nothing to constrain */
    assert_int_equal(kt_tool_grammar_build(f, tools, KT_TOOL_NONE, NULL, false, KT_THINK_MAYBE, NULL, NULL, NULL, &tg, &err), KT_OK);
    assert_null(tg.grammar);
    assert_int_equal(tg.n_triggers, 0);
    json_decref(tools);
}

/* Control-token markers become token references in the grammar. */
static int32_t fake_control(void *ctx, const char *s, size_t n) {
    (void)ctx;
    if (n == 12 && !memcmp(s, "[TOOL_CALLS]", 12)) return 5;
    if (n == 6 && !memcmp(s, "[ARGS]", 6)) return 7;
    return -1;
}

static void test_grammar_control_tokens(void **state) {
    (void)state;
    json_t *tools = json_loads(TOOLS_JSON, 0, NULL);
    kt_tool_grammar tg;
    kt_error err = {0};
    assert_int_equal(kt_tool_grammar_build(kt_tool_format_by_name("mistral"), tools, KT_TOOL_REQUIRED, NULL, false, KT_THINK_MAYBE,
                                           NULL, fake_control, NULL, &tg, &err),
                     KT_OK);
    assert_non_null(strstr(tg.grammar, "<[5]>"));
    assert_non_null(strstr(tg.grammar, "<[7]>"));
    assert_null(strstr(tg.grammar, "[ARGS]\""));
    assert_true(tg.special_text);
    kt_grammar *g = compile(tg.grammar);
    kt_gmatch *m = kt_gmatch_new(g, &err);
    assert_non_null(m);
    assert_true(kt_gmatch_token(m, 5, NULL, 0));
    assert_true(kt_gmatch_bytes(m, (const uint8_t *)"get_time", 8));
    assert_true(kt_gmatch_token(m, 7, NULL, 0));
    assert_true(kt_gmatch_bytes(m, (const uint8_t *)"{}", 2));
    assert_true(kt_gmatch_can_end(m));
    kt_gmatch_free(m);
    kt_grammar_free(g);
    kt_tool_grammar_free(&tg);
    json_decref(tools);
}

/* ---- detection of the real templates ---- */

static void test_detect_templates(void **state) {
    (void)state;
    static const char *const want[][2] = {
        {"Qwen-Qwen3-0.6B", "hermes"},
        {"Qwen-Qwen2.5-7B-Instruct", "hermes"},
        {"Qwen-QwQ-32B", "hermes"},
        {"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use", "hermes"},
        {"Qwen3-Coder", "qwen3-coder"},
        {"Qwen3.5-4B", "qwen3-coder"},
        {"meta-llama-Llama-3.1-8B-Instruct", "llama3"},
        {"meta-llama-Llama-3.2-3B-Instruct", "llama3"},
        {"Mistral-Small-3.2-24B-Instruct-2506", "mistral"},
        {"unsloth-mistral-Devstral-Small-2507", "mistral"},
        {"deepseek-ai-DeepSeek-R1-Distill-Llama-8B", "deepseek-r1"},
        {"llama-cpp-deepseek-r1", "deepseek-r1"},
        {"deepseek-ai-DeepSeek-V3.1", "deepseek-v3.1"},
        {"openai-gpt-oss-120b", "gpt-oss"},
        {"meetkai-functionary-medium-v3.1", "functionary-v3.1"},
        {"CohereForAI-c4ai-command-r-plus-tool_use", "command-r-plus"},
        {"ibm-granite-granite-3.3-2B-Instruct", "granite"},
        {"moonshotai-Kimi-K2", "kimi-k2"},
        {"GLM-4.6", "glm-4.5"},
        {"MiniMax-M2", "minimax-m2"},
        {"google-gemma-2-2b-it", "generic"},
        {"microsoft-Phi-3.5-mini-instruct", "generic"},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char path[1400];
        snprintf(path, sizeof path, "%s/%s.jinja", tu_shared("templates"), want[i][0]);
        char *t = tu_read_file(path, NULL);
        assert_non_null(t);
        const char *got_name = kt_tool_format_name(kt_tool_format_detect(t));
        if (strcmp(got_name, want[i][1])) fail_msg("%s detected as %s, want %s", want[i][0], got_name, want[i][1]);
        free(t);
    }
}

/* ---- preparing conversations ---- */

static void test_prepare(void **state) {
    (void)state;
    json_t *msgs = json_loads(
        "[{\"role\":\"user\",\"content\":\"Weather?\"},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_abcdefghijklmnop\",\"type\":\"function\","
        "\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\": \\\"Paris\\\"}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"call_abcdefghijklmnop\",\"content\":\"sunny\"}]",
        0, NULL);
    json_t *tools = json_loads(TOOLS_JSON, 0, NULL), *tools_out = NULL;
    kt_error err = {0};
    /* a template with tools: objects, "" content, tools passed through */
    json_t *p = kt_tool_prepare(kt_tool_format_by_name("hermes"), "{{ tools }}", msgs, tools, false, &tools_out, &err);
    assert_non_null(p);
    assert_ptr_equal(tools_out, tools);
    json_t *a = json_array_get(p, 1);
    assert_string_equal(json_string_value(json_object_get(a, "content")), "");
    json_t *args = json_object_get(json_object_get(json_array_get(json_object_get(a, "tool_calls"), 0), "function"), "arguments");
    assert_true(json_is_object(args));
    assert_string_equal(json_string_value(json_object_get(args, "city")), "Paris");
    json_decref(p), json_decref(tools_out);
    /* arguments kept as strings for templates that concatenate them */
    p = kt_tool_prepare(kt_tool_format_by_name("hermes"), "{{ tools }}", msgs, tools, true, &tools_out, &err);
    a = json_array_get(p, 1);
    args = json_object_get(json_object_get(json_array_get(json_object_get(a, "tool_calls"), 0), "function"), "arguments");
    assert_true(json_is_string(args));
    json_decref(p), json_decref(tools_out);
    /* Mistral: ids become 9 alphanumerics, the same for the call and its result */
    p = kt_tool_prepare(kt_tool_format_by_name("mistral"), "{{ tools }}", msgs, tools, false, &tools_out, &err);
    const char *id = json_string_value(json_object_get(json_array_get(json_object_get(json_array_get(p, 1), "tool_calls"), 0), "id"));
    const char *tid = json_string_value(json_object_get(json_array_get(p, 2), "tool_call_id"));
    assert_int_equal(strlen(id), 9);
    assert_string_equal(id, tid);
    json_decref(p), json_decref(tools_out);
    /* no place for tools: system message offers them, the loop becomes text */
    p = kt_tool_prepare(kt_tool_format_by_name("generic"), "{{ messages }}", msgs, tools, false, &tools_out, &err);
    assert_non_null(p);
    assert_null(tools_out);
    assert_int_equal(json_array_size(p), 4);
    assert_string_equal(json_string_value(json_object_get(json_array_get(p, 0), "role")), "system");
    assert_non_null(strstr(json_string_value(json_object_get(json_array_get(p, 0), "content")), "get_weather"));
    const char *call_text = json_string_value(json_object_get(json_array_get(p, 2), "content"));
    assert_non_null(strstr(call_text, "<tool_call>"));
    assert_null(json_object_get(json_array_get(p, 2), "tool_calls"));
    assert_string_equal(json_string_value(json_object_get(json_array_get(p, 3), "role")), "user");
    assert_non_null(strstr(json_string_value(json_object_get(json_array_get(p, 3), "content")), "sunny"));
    json_decref(p);
    json_decref(msgs), json_decref(tools);
}

/* Every template in shared/templates renders the second turn of an OpenAI
 * tool loop (content null beside tool_calls, arguments as a JSON string,
 * the tool's result):
 * the call, its result and (where the template has a place for tools) the
 * tools all appear in the prompt. */
static void test_render_tool_loop_everywhere(void **state) {
    (void)state;
    json_t *msgs = json_loads(
        "[{\"role\":\"system\",\"content\":\"You help.\"},{\"role\":\"user\",\"content\":\"Weather in Paris?\"},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_8f2k3j4h5g6d7s8a\",\"type\":\"function\","
        "\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\": \\\"Paris\\\"}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"call_8f2k3j4h5g6d7s8a\",\"name\":\"get_weather\",\"content\":\"sunny-21\"}]",
        0, NULL);
    assert_non_null(msgs);
    json_t *tools = json_loads(TOOLS_JSON, 0, NULL);
    json_t *vars = json_pack("{s:s, s:s, s:s}", "bos_token", "<s>", "eos_token", "</s>", "date_string", "26 Jul 2024");
    DIR_LIST_TEMPLATES(name) {
        char path[1400];
        snprintf(path, sizeof path, "%s/%s", tu_shared("templates"), name);
        char *t = tu_read_file(path, NULL);
        assert_non_null(t);
        const kt_tool_format *f = kt_tool_format_detect(t);
        kt_error err = {0};
        char *out = kt_tool_render(f, t, msgs, tools, vars, 1721952000, &err);
        if (!out) fail_msg("%s (%s): %s", name, kt_tool_format_name(f), err.msg);
        if (!strstr(out, "sunny-21") || !strstr(out, "Paris") || !strstr(out, "get_weather"))
            fail_msg("%s: the tool loop is not all in the prompt:\n%s", name, out);
        if (!strstr(out, "search") && !strstr(out, "get_time"))
            fail_msg("%s: the offered tools are not in the prompt:\n%s", name, out);
        free(out), free(t);
    }
    DIR_LIST_END;
    /* and every built-in */
    static const char *const builtins[] = {"chatml", "llama2", "llama3", "mistral", "phi3", "gemma"};
    for (size_t i = 0; i < sizeof builtins / sizeof builtins[0]; i++) {
        const char *t = kt_chat_builtin(builtins[i]);
        kt_error err = {0};
        char *out = kt_tool_render(kt_tool_format_detect(t), t, msgs, tools, vars, 1721952000, &err);
        if (!out) fail_msg("built-in %s: %s", builtins[i], err.msg);
        assert_non_null(strstr(out, "sunny-21"));
        assert_non_null(strstr(out, "get_time"));
        assert_non_null(strstr(out, "<tool_call>"));
        free(out);
    }
    json_decref(vars), json_decref(tools), json_decref(msgs);
}

/* A developer message (OpenAI's newer system role) and a system message
 * in the middle of the conversation (Claude Code sends one) reach the
 * prompt with every template: developer is system where the template has
 * no developer role, and a late system message is merged into the
 * leading one (then folded into the first user turn) where the template
 * refuses it in place. Before, developer vanished and a late system
 * message made Llama-style templates raise. */
static void test_render_developer_and_late_system(void **state) {
    (void)state;
    json_t *msgs = json_loads("[{\"role\":\"developer\",\"content\":\"Rules-XYZ\"},{\"role\":\"user\",\"content\":\"q1\"},"
                              "{\"role\":\"assistant\",\"content\":\"a1\"},{\"role\":\"system\",\"content\":\"Late-ABC\"},"
                              "{\"role\":\"user\",\"content\":\"q2\"}]",
                              0, NULL);
    assert_non_null(msgs);
    json_t *vars = json_pack("{s:s, s:s}", "bos_token", "<s>", "eos_token", "</s>");
    DIR_LIST_TEMPLATES(name) {
        char path[1400];
        snprintf(path, sizeof path, "%s/%s", tu_shared("templates"), name);
        char *t = tu_read_file(path, NULL);
        assert_non_null(t);
        kt_error err = {0};
        char *out = kt_tool_render(kt_tool_format_detect(t), t, msgs, NULL, vars, 1721952000, &err);
        if (!out) fail_msg("%s: %s", name, err.msg);
        if (!strstr(out, "Rules-XYZ") || !strstr(out, "Late-ABC") || !strstr(out, "q2"))
            fail_msg("%s: a developer or late system message is not in the prompt:\n%s", name, out);
        free(out), free(t);
    }
    DIR_LIST_END;
    json_decref(vars), json_decref(msgs);
}

/* The tool loop through functionary v3.2's template, and Llama 3.1's
 * built-in tools through its real template (builtin_tools, the earlier
 * call written in Python). */
static void test_render_v32_and_builtins(void **state) {
    (void)state;
    json_t *msgs = json_loads(
        "[{\"role\":\"user\",\"content\":\"Weather in Paris?\"},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\","
        "\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\": \\\"Paris\\\"}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"sunny-21\"}]",
        0, NULL);
    json_t *tools = json_loads(TOOLS_JSON, 0, NULL);
    json_t *vars = json_pack("{s:s}", "bos_token", "<|begin_of_text|>");
    assert_non_null(msgs);
    char *v32 = tu_read_file(KT_TEST_DATA "/functionary-v3.2.jinja", NULL);
    assert_non_null(v32);
    const kt_tool_format *f = kt_tool_format_detect(v32);
    assert_string_equal(kt_tool_format_name(f), "functionary-v3.2");
    kt_error err = {0};
    char *out = kt_tool_render(f, v32, msgs, tools, vars, 0, &err);
    if (!out) fail_msg("v3.2: %s", err.msg);
    assert_non_null(strstr(out, ">>>get_weather\n{\"city\": \"Paris\"}<|eot_id|>"));
    assert_non_null(strstr(out, "sunny-21"));
    assert_string_equal(out + strlen(out) - 3, ">>>");
    free(out), free(v32);
    /* Llama 3.1: brave_search and python are its built-in tools */
    json_t *m2 = json_loads(
        "[{\"role\":\"user\",\"content\":\"Search it.\"},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_2\",\"type\":\"function\","
        "\"function\":{\"name\":\"brave_search\",\"arguments\":\"{\\\"query\\\": \\\"Paris\\\"}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"call_2\",\"content\":\"found-it\"}]",
        0, NULL);
    char path[1400];
    snprintf(path, sizeof path, "%s/meta-llama-Llama-3.1-8B-Instruct.jinja", tu_shared("templates"));
    char *t = tu_read_file(path, NULL);
    assert_non_null(t);
    f = kt_tool_format_detect(t);
    out = kt_tool_render(f, t, m2, tools, vars, 1721952000, &err);
    if (!out) fail_msg("llama 3.1: %s", err.msg);
    if (!strstr(out, "Environment: ipython\nTools: brave_search\n") ||
        !strstr(out, "<|python_tag|>brave_search.call(query=\"Paris\")<|eom_id|>") || !strstr(out, "found-it") ||
        !strstr(out, "\"get_weather\"") || strstr(out, "\"brave_search\""))
        fail_msg("llama 3.1 built-in tools:\n%s", out);
    free(out), free(t);
    json_decref(m2), json_decref(vars), json_decref(tools), json_decref(msgs);
}

/* gpt-oss: the analysis a client sends back as reasoning_content (a
 * reply's own, the Responses API's reasoning item, Anthropic's thinking
 * block) is the template's `thinking`, rendered before the call as the
 * model wrote it; a later final answer drops it (the template's rule).
 * Before, it vanished from the prompt. The tools lack descriptions, which
 * the template prints: on that rung of kt_tool_render the arguments were
 * strings, which its `|tojson` wrote as a JSON string of JSON. */
static void test_render_harmony_thinking(void **state) {
    (void)state;
    char path[1400];
    snprintf(path, sizeof path, "%s/openai-gpt-oss-120b.jinja", tu_shared("templates"));
    char *t = tu_read_file(path, NULL);
    assert_non_null(t);
    const kt_tool_format *f = kt_tool_format_detect(t);
    json_t *tools = json_loads(TOOLS_JSON, 0, NULL), *vars = json_object();
    json_t *msgs = json_loads(
        "[{\"role\":\"user\",\"content\":\"Weather in Paris?\"},"
        "{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"Need-the-weather.\",\"tool_calls\":[{\"id\":"
        "\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\": \\\"Paris\\\"}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"sunny-21\"}]",
        0, NULL);
    assert_non_null(msgs);
    kt_error err = {0};
    char *out = kt_tool_render(f, t, msgs, tools, vars, 1721952000, &err);
    if (!out) fail_msg("gpt-oss: %s", err.msg);
    if (!strstr(out, "<|start|>assistant<|channel|>analysis<|message|>Need-the-weather.<|end|>"
                     "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
                     "{\"city\": \"Paris\"}<|call|>"))
        fail_msg("the analysis before the call is not in the prompt:\n%s", out);
    free(out);
    /* a final answer after it: the analysis is dropped, as in training */
    json_array_append_new(msgs, json_pack("{s:s, s:s, s:s}", "role", "assistant", "content", "Sunny.",
                                          "reasoning_content", "Say-it."));
    json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", "Thanks"));
    out = kt_tool_render(f, t, msgs, tools, vars, 1721952000, &err);
    if (!out) fail_msg("gpt-oss: %s", err.msg);
    if (strstr(out, "Need-the-weather.") || strstr(out, "Say-it.") ||
        !strstr(out, "<|start|>assistant<|channel|>final<|message|>Sunny.<|end|>"))
        fail_msg("the analysis of earlier turns is in the prompt:\n%s", out);
    free(out), free(t);
    json_decref(vars), json_decref(tools), json_decref(msgs);
}

/* gpt-oss: an assistant message with two calls (a client's history,
 * another model's) is two harmony messages, each followed by its own
 * result (here sent in the other order), named after its call. Before,
 * the template rendered the first call only and named both results after
 * it. */
static void test_render_harmony_two_calls(void **state) {
    (void)state;
    char path[1400];
    snprintf(path, sizeof path, "%s/openai-gpt-oss-120b.jinja", tu_shared("templates"));
    char *t = tu_read_file(path, NULL);
    assert_non_null(t);
    json_t *tools = json_loads(TOOLS_JSON, 0, NULL), *vars = json_object();
    json_t *msgs = json_loads(
        "[{\"role\":\"user\",\"content\":\"Weather and time?\"},"
        "{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"Two-things.\",\"tool_calls\":["
        "{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\": \\\"Paris\\\"}\"}},"
        "{\"id\":\"call_2\",\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"arguments\":\"{}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"call_2\",\"content\":\"noon-12\"},"
        "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"sunny-21\"},"
        "{\"role\":\"user\",\"content\":\"And?\"}]",
        0, NULL);
    assert_non_null(msgs);
    kt_error err = {0};
    char *out = kt_tool_render(kt_tool_format_detect(t), t, msgs, tools, vars, 1721952000, &err);
    if (!out) fail_msg("gpt-oss: %s", err.msg);
    if (!strstr(out, "<|start|>user<|message|>Weather and time?<|end|>"
                     "<|start|>assistant<|channel|>analysis<|message|>Two-things.<|end|>"
                     "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}<|call|>"
                     "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>\"sunny-21\"<|end|>"
                     "<|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{}<|call|>"
                     "<|start|>functions.get_time to=assistant<|channel|>commentary<|message|>\"noon-12\"<|end|>"
                     "<|start|>user<|message|>And?<|end|>"))
        fail_msg("two calls are not two harmony messages with their results:\n%s", out);
    free(out), free(t);
    json_decref(vars), json_decref(tools), json_decref(msgs);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parsers_whole),
        cmocka_unit_test(test_parsers_cut_everywhere),
        cmocka_unit_test(test_parser_without_calls),
        cmocka_unit_test(test_grammars_accept_their_calls),
        cmocka_unit_test(test_grammar_named),
        cmocka_unit_test(test_grammar_llama_builtins),
        cmocka_unit_test(test_grammar_open_reply),
        cmocka_unit_test(test_grammar_closes_objects),
        cmocka_unit_test(test_grammar_control_tokens),
        cmocka_unit_test(test_detect_templates),
        cmocka_unit_test(test_prepare),
        cmocka_unit_test(test_render_tool_loop_everywhere),
        cmocka_unit_test(test_render_harmony_thinking),
        cmocka_unit_test(test_render_harmony_two_calls),
        cmocka_unit_test(test_render_v32_and_builtins),
        cmocka_unit_test(test_render_developer_and_late_system),
        cmocka_unit_test(test_grammar_relaxed),
        cmocka_unit_test(test_parse_cut_marker),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
