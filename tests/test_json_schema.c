/*
 * test_json_schema.c - the JSON-Schema-to-GBNF converter (src/grammar/
 * json_schema.h), checked through the real GBNF parser and the reference
 * matcher (grammar.h).
 *
 * The hard property everywhere: no JSON text the schema rejects is ever
 * accepted (zero false positives). Schemas kettle cannot enforce must be
 * refused with a message naming the keyword. Data sets:
 *   - llama.cpp's schema tests (passing/failing strings, SUCCESS/FAILURE);
 *   - the official JSON-Schema-Test-Suite, draft 2020-12, compared with
 *     llguidance's published results on it;
 *   - JSONSchemaBench's real-world schemas with valid/invalid instances.
 * The counts are printed and held to floors measured when the converter
 * was written, so a regression fails and an improvement is free.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "testutil.h"

#define SUITE_MIN_COMPILED 143
#define SUITE_MIN_VALID_OK 297
#define SUITE_MIN_PASS 501
#define BENCH_MIN_COMPILED 145
#define BENCH_MIN_VALID_OK 175

/* ---- helpers ---------------------------------------------------------- */

/* Converts and parses; NULL (and err) on refusal. A converted grammar that
 * the parser rejects is a converter bug: the test fails. */
static kt_grammar *build(const json_t *schema, kt_error *err) {
    char *gbnf = kt_json_schema_to_gbnf(schema, err);
    if (!gbnf) return NULL;
    kt_error perr = {0};
    kt_grammar *g = kt_grammar_parse(gbnf, strlen(gbnf), NULL, &perr);
    if (!g) {
        char *s = json_dumps(schema, JSON_COMPACT);
        fprintf(stderr, "schema %.300s\ngrammar:\n%.3000s\n", s, gbnf);
        free(s);
        free(gbnf);
        fail_msg("converted grammar does not parse: %s", perr.msg);
    }
    free(gbnf);
    return g;
}

static kt_grammar *build_text(const char *schema_json) {
    json_error_t je;
    json_t *s = json_loads(schema_json, JSON_DECODE_ANY, &je);
    if (!s) fail_msg("bad test schema: %s", je.text);
    kt_error err = {0};
    kt_grammar *g = build(s, &err);
    json_decref(s);
    if (!g) fail_msg("schema %s refused: %s", schema_json, err.msg);
    return g;
}

static bool accepts(const kt_grammar *g, const char *s) {
    return kt_grammar_accepts(g, (const uint8_t *)s, strlen(s));
}

static bool accepts_value(const kt_grammar *g, const json_t *v) {
    char *s = json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY);
    assert_non_null(s);
    bool ok = accepts(g, s);
    free(s);
    return ok;
}

static void expect(const kt_grammar *g, const char *s, bool ok) {
    if (accepts(g, s) != ok) fail_msg("'%s' should be %s", s, ok ? "accepted" : "rejected");
}

static void expect_refusal(const char *schema_json, kt_status st, const char *msg) {
    json_t *s = json_loads(schema_json, JSON_DECODE_ANY, NULL);
    assert_non_null(s);
    kt_error err = {0};
    char *g = kt_json_schema_to_gbnf(s, &err);
    json_decref(s);
    if (g) fail_msg("%s should be refused, got\n%s", schema_json, g);
    assert_int_equal(err.status, st);
    if (msg && strcmp(err.msg, msg)) fail_msg("message '%s', expected '%s'", err.msg, msg);
}

/* Count bounds past the grammar's repeat limit: refused, naming where
 * (once said "at the root" whatever the depth), or under relax_bounds
 * enforced as far as a grammar can and said (a maximum left out, a
 * minimum lowered to the limit); the relaxed grammar still takes a long
 * value and still refuses a wrong type. */
static void test_relaxed_bounds(void **state) {
    (void)state;
    const char *schema_json = "{\"type\":\"object\",\"properties\":{\"script\":{\"type\":\"string\",\"maxLength\":524288},"
                              "\"xs\":{\"type\":\"array\",\"minItems\":20000}}}";
    expect_refusal(schema_json, KT_ERR_UNSUPPORTED, "at /properties/script: string length bound over 10000");
    json_t *s = json_loads(schema_json, 0, NULL);
    char relaxed[400] = "";
    kt_schema_opts opts = {.relax_bounds = true, .relaxed = relaxed, .relaxed_cap = sizeof relaxed};
    kt_error err = {0};
    char *g = kt_json_schema_to_gbnf_ex(s, &opts, &err);
    if (!g) fail_msg("relaxed: %s", err.msg);
    assert_string_equal(relaxed, "at /properties/script: string length maximum 524288 not enforced (over 10000); "
                                 "at /properties/xs: item count minimum 20000 enforced as 10000");
    kt_grammar *gr = kt_grammar_parse(g, strlen(g), NULL, &err);
    assert_non_null(gr);
    char *long_value = malloc(30000);
    assert_non_null(long_value);
    strcpy(long_value, "{\"script\":\"");
    memset(long_value + 11, 'a', 20000);
    strcpy(long_value + 20011, "\"}");
    assert_true(accepts(gr, long_value));
    assert_false(accepts(gr, "{\"script\":5}"));
    free(long_value), kt_grammar_free(gr), free(g), json_decref(s);
}

static json_t *load(const char *path) {
    json_error_t je;
    json_t *j = json_load_file(path, JSON_ALLOW_NUL, &je);
    if (!j) fail_msg("%s: %s", path, je.text);
    return j;
}

static bool in_names(const char *name, const char *const *list) {
    for (; *list; list++)
        if (!strcmp(name, *list)) return true;
    return false;
}

/* ---- unit tests -------------------------------------------------------- */

static void test_integer_ranges(void **state) {
    (void)state;
    kt_grammar *g = build_text("{\"type\":\"integer\",\"minimum\":-5,\"maximum\":123}");
    for (int v = -200; v <= 300; v++) {
        char s[16];
        snprintf(s, sizeof s, "%d", v);
        expect(g, s, v >= -5 && v <= 123);
    }
    expect(g, "-0", false);
    expect(g, "007", false);
    expect(g, "1.0", false);
    kt_grammar_free(g);
    g = build_text("{\"type\":\"integer\",\"exclusiveMinimum\":-1000,\"exclusiveMaximum\":-7}");
    for (int v = -1200; v <= 10; v++) {
        char s[16];
        snprintf(s, sizeof s, "%d", v);
        expect(g, s, v > -1000 && v < -7);
    }
    kt_grammar_free(g);
    g = build_text("{\"type\":\"integer\",\"minimum\":99}");
    expect(g, "99", true);
    expect(g, "100", true);
    expect(g, "9999999999999999", true);
    expect(g, "98", false);
    expect(g, "-99", false);
    kt_grammar_free(g);
}

static void test_number_ranges(void **state) {
    (void)state;
    kt_grammar *g = build_text("{\"type\":\"number\",\"exclusiveMinimum\":0,\"maximum\":10}");
    const char *yes[] = {"0.5", "1", "10", "10.0", "10.000", "0.001", "9.999", "3"};
    const char *no[] = {"0", "0.0", "-1", "10.01", "11", "-0.5", "100", "1e2"};
    for (size_t i = 0; i < 8; i++) expect(g, yes[i], true);
    for (size_t i = 0; i < 8; i++) expect(g, no[i], false);
    kt_grammar_free(g);
    g = build_text("{\"type\":\"number\",\"minimum\":-2.0,\"exclusiveMaximum\":-1}");
    expect(g, "-2", true);
    expect(g, "-1.5", true);
    expect(g, "-1.0001", true);
    expect(g, "-1", false);
    expect(g, "-2.1", false);
    expect(g, "0", false);
    kt_grammar_free(g);
    expect_refusal("{\"type\":\"number\",\"minimum\":0.5}", KT_ERR_UNSUPPORTED,
                   "at the root: a bound on a number that is not an integer (or over 1e15) is not supported");
}

static void test_formats(void **state) {
    (void)state;
    static const struct {
        const char *format, *yes[4], *no[5];
    } F[] = {
        {"date", {"\"2024-02-29\"", "\"2023-12-31\"", "\"2000-02-29\"", "\"1999-04-30\""},
         {"\"2023-02-29\"", "\"1900-02-29\"", "\"2023-04-31\"", "\"2023-13-01\"", "\"2023-1-01\""}},
        {"time", {"\"18:25:43.511Z\"", "\"00:00:00Z\"", "\"23:59:59+05:30\"", "\"12:00:00-01:00\""},
         {"\"24:00:00Z\"", "\"12:60:00Z\"", "\"12:00:00\"", "\"12:00Z\"", "\"1:00:00Z\""}},
        {"date-time", {"\"2012-04-23T18:25:43.511Z\"", "\"2020-01-01T00:00:00+01:00\"", NULL, NULL},
         {"\"2012-04-23 18:25:43Z\"", "\"2012-04-23T18:25:43\"", "\"2012-02-30T00:00:00Z\"", NULL, NULL}},
        {"uuid", {"\"12345678-1234-1234-1234-1234567890ab\"", "\"ABCDEF01-2345-6789-ABCD-EF0123456789\"", NULL, NULL},
         {"\"12345678-1234-1234-1234-1234567890a\"", "\"1234567812341234123412345678901a\"",
          "\"g2345678-1234-1234-1234-1234567890ab\"", NULL, NULL}},
        {"email", {"\"joe.bloggs@example.com\"", "\"a+b@x\"", "\"te~st@example.com\"", NULL},
         {"\"joe..bloggs@example.com\"", "\".joe@example.com\"", "\"joe@-example.com\"", "\"@example.com\"",
          "\"joe\""}},
        {"uri", {"\"http://example.com/a?b=c#d\"", "\"urn:isbn:0451450523\"", "\"mailto:a@b.c\"", "\"file:///tmp/x\""},
         {"\"//example.com\"", "\"http://exa mple.com\"", "\"1http://x\"", "\"http://x/%zz\"", "\"abc\""}},
        {"ipv4", {"\"192.168.0.1\"", "\"0.0.0.0\"", "\"255.255.255.255\"", NULL},
         {"\"256.1.1.1\"", "\"1.2.3\"", "\"01.2.3.4\"", "\"1.2.3.4.5\"", NULL}},
    };
    for (size_t i = 0; i < sizeof F / sizeof F[0]; i++) {
        char schema[128];
        snprintf(schema, sizeof schema, "{\"type\":\"string\",\"format\":\"%s\"}", F[i].format);
        kt_grammar *g = build_text(schema);
        for (size_t k = 0; k < 4 && F[i].yes[k]; k++) expect(g, F[i].yes[k], true);
        for (size_t k = 0; k < 5 && F[i].no[k]; k++) expect(g, F[i].no[k], false);
        kt_grammar_free(g);
    }
    expect_refusal("{\"type\":\"string\",\"format\":\"hostname\"}", KT_ERR_UNSUPPORTED,
                   "at the root: format 'hostname' is not supported");
    /* a format no JSON Schema draft defines is an annotation: zod writes
     * {"format":"starts_with","pattern":"^ab.*"}, and the pattern decides */
    kt_grammar *g = build_text("{\"type\":\"string\",\"format\":\"starts_with\",\"pattern\":\"^ab.*\"}");
    expect(g, "\"abc\"", true);
    expect(g, "\"xab\"", false);
    kt_grammar_free(g);
    g = build_text("{\"type\":\"string\",\"format\":\"my-own-format\"}");
    expect(g, "\"anything\"", true);
    kt_grammar_free(g);
    /* a class that fails after it took ranges: an error, and (under the
     * sanitizers) nothing leaked; found by fuzzing */
    expect_refusal("{\"type\":\"string\",\"pattern\":\"(a|[bc-d\"}", KT_ERR_ARG, NULL);
    /* a defined format beside a pattern: both cannot be enforced at once */
    expect_refusal("{\"type\":\"string\",\"format\":\"email\",\"pattern\":\"^a.*$\"}", KT_ERR_UNSUPPORTED,
                   "at the root: 'pattern' together with 'format' is not supported");
    /* z.record(z.string(), ...): propertyNames {type: string} holds for every object */
    g = build_text("{\"type\":\"object\",\"propertyNames\":{\"type\":\"string\"},"
                   "\"additionalProperties\":{\"type\":\"boolean\"}}");
    expect(g, "{\"a\":true}", true);
    expect(g, "{\"a\":1}", false);
    kt_grammar_free(g);
    expect_refusal("{\"type\":\"object\",\"propertyNames\":{\"maxLength\":3}}", KT_ERR_UNSUPPORTED,
                   "at the root: keyword 'propertyNames' is not supported");
}

static void test_patterns(void **state) {
    (void)state;
    kt_grammar *g = build_text("{\"type\":\"string\",\"pattern\":\"^(\\\\([0-9]{3}\\\\))?[0-9]{3}-[0-9]{4}$\"}");
    expect(g, "\"555-1212\"", true);
    expect(g, "\"(888)555-1212\"", true);
    expect(g, "\"(888)555-1212 ext. 532\"", false);
    expect(g, "\"(800)FLOWERS\"", false);
    kt_grammar_free(g);
    g = build_text("{\"pattern\":\"a+b?\"}"); /* unanchored: a search */
    expect(g, "\"xxaayy\"", true);
    expect(g, "\"xyz\"", false);
    expect(g, "12", true); /* pattern constrains strings only */
    kt_grammar_free(g);
    g = build_text("{\"type\":\"string\",\"pattern\":\"^[^a-c\\\\s]\\\\w*\\\\.\\\\d{1,2}$\"}");
    expect(g, "\"x_1.5\"", true);
    expect(g, "\"\\u00e9.12\"", false); /* \u escapes of ordinary characters are not kettle's form */
    expect(g, "\"\xc3\xa9z.12\"", true);
    expect(g, "\"a.1\"", false);
    expect(g, "\" x.1\"", false);
    expect(g, "\"x.123\"", false);
    kt_grammar_free(g);
    g = build_text("{\"type\":\"string\",\"pattern\":\"^\\\"q\\\\\\\\$\"}"); /* a quote and a backslash */
    expect(g, "\"\\\"q\\\\\"", true);
    expect(g, "\"q\"", false);
    kt_grammar_free(g);
    expect_refusal("{\"type\":\"string\",\"pattern\":\"^(a)\\\\1$\"}", KT_ERR_UNSUPPORTED,
                   "at the root: pattern '^(a)\\1$': backreference \\1 is not supported");
    expect_refusal("{\"type\":\"string\",\"pattern\":\"^(?=a)a$\"}", KT_ERR_UNSUPPORTED,
                   "at the root: pattern '^(?=a)a$': lookaround assertions are not supported");
    expect_refusal("{\"type\":\"string\",\"pattern\":\"a^b\"}", KT_ERR_UNSUPPORTED, NULL);
}

static void test_recursive_ref(void **state) {
    (void)state;
    kt_grammar *g = build_text(
        "{\"$ref\":\"#/$defs/tree\",\"$defs\":{\"tree\":{\"type\":\"object\",\"properties\":{"
        "\"value\":{\"type\":\"integer\"},\"children\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/tree\"}}},"
        "\"required\":[\"value\"],\"additionalProperties\":false}}}");
    expect(g, "{\"value\":1}", true);
    expect(g, "{\"value\":1,\"children\":[{\"value\":2},{\"value\":3,\"children\":[{\"value\":4,\"children\":[]}]}]}", true);
    expect(g, "{\"value\":1,\"children\":[{\"value\":\"x\"}]}", false);
    expect(g, "{\"value\":1,\"children\":[{}]}", false);
    expect(g, "{\"children\":[]}", false);
    kt_grammar_free(g);
    /* "#" and a definitions ref through a JSON pointer with escapes */
    g = build_text("{\"type\":[\"array\",\"integer\"],\"items\":{\"$ref\":\"#\"},\"maxItems\":2}");
    expect(g, "[[1,[]],2]", true);
    expect(g, "[1,2,3]", false);
    kt_grammar_free(g);
    g = build_text("{\"definitions\":{\"a/b\":{\"const\":7}},\"$ref\":\"#/definitions/a~1b\"}");
    expect(g, "7", true);
    expect(g, "8", false);
    kt_grammar_free(g);
}

static void test_objects(void **state) {
    (void)state;
    kt_grammar *g = build_text(
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"ab\":{\"type\":\"string\"}},"
        "\"required\":[\"ab\"],\"additionalProperties\":{\"type\":\"boolean\"}}");
    expect(g, "{\"ab\":\"x\"}", true);
    expect(g, "{\"a\":1,\"ab\":\"x\",\"abc\":true,\"\":false}", true);
    expect(g, "{\"ab\":\"x\",\"a\":true}", false); /* a named key can never be an additional one */
    expect(g, "{\"ab\":\"x\",\"ab\":true}", false);
    expect(g, "{\"ab\":\"x\",\"b\":1}", false);
    expect(g, "{ \"ab\" : \"x\" ,\n  \"q\": false }", true);
    kt_grammar_free(g);
    g = build_text("{\"allOf\":[{\"properties\":{\"x\":{\"minimum\":3}}},{\"properties\":{\"x\":{\"type\":\"integer\"}},"
                   "\"required\":[\"x\"],\"additionalProperties\":false}]}");
    expect(g, "{\"x\":3}", true);
    expect(g, "{\"x\":3,\"y\":1}", false);
    expect(g, "{\"x\":2}", false);
    expect(g, "{\"x\":3.5}", false);
    expect(g, "{}", false);
    kt_grammar_free(g);
    /* oneOf with a discriminator */
    g = build_text("{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"k\":{\"const\":\"a\"},\"v\":{\"type\":\"integer\"}},"
                   "\"required\":[\"k\"]},{\"type\":\"object\",\"properties\":{\"k\":{\"const\":\"b\"}},\"required\":[\"k\"]}]}");
    expect(g, "{\"k\":\"a\",\"v\":1}", true);
    expect(g, "{\"k\":\"b\"}", true);
    expect(g, "{\"k\":\"c\"}", false);
    kt_grammar_free(g);
}

static void test_refusals(void **state) {
    (void)state;
    expect_refusal("{\"type\":\"object\",\"properties\":{\"tags\":{\"type\":\"array\",\"uniqueItems\":true}}}",
                   KT_ERR_UNSUPPORTED, "at /properties/tags: keyword 'uniqueItems' is not supported");
    expect_refusal("{\"not\":{\"type\":\"string\"}}", KT_ERR_UNSUPPORTED, "at the root: keyword 'not' is not supported");
    expect_refusal("{\"items\":[{\"multipleOf\":2}]}", KT_ERR_UNSUPPORTED, "at /items/0: keyword 'multipleOf' is not supported");
    expect_refusal("{\"oneOf\":[{\"type\":\"integer\"},{\"minimum\":2}]}", KT_ERR_UNSUPPORTED,
                   "at the root: keyword 'oneOf' is supported only with provably disjoint branches");
    expect_refusal("{\"$ref\":\"http://example.com/x.json\"}", KT_ERR_UNSUPPORTED, NULL);
    expect_refusal("{\"$ref\":\"#/$defs/missing\"}", KT_ERR_ARG, NULL);
    expect_refusal("{\"type\":\"strin\"}", KT_ERR_ARG, "at the root: 'strin' is not a type name");
    expect_refusal("false", KT_ERR_UNSUPPORTED, "at the root: the schema allows no JSON value");
    expect_refusal("{\"type\":\"string\",\"maxLength\":100000}", KT_ERR_UNSUPPORTED, NULL);
    /* annotations are fine */
    kt_grammar *g = build_text("{\"title\":\"t\",\"description\":\"d\",\"examples\":[1],\"default\":2,\"$comment\":\"c\","
                               "\"deprecated\":false,\"type\":\"integer\"}");
    kt_grammar_free(g);
}

/* Deeply nested schemas hit the depth limit with a message, not a crash. */
static void test_limits(void **state) {
    (void)state;
    json_t *s = json_object();
    json_t *cur = s;
    for (int i = 0; i < 200; i++) {
        json_t *inner = json_object();
        json_object_set_new(cur, "items", inner);
        cur = inner;
    }
    kt_error err = {0};
    char *g = kt_json_schema_to_gbnf(s, &err);
    json_decref(s);
    assert_null(g);
    assert_int_equal(err.status, KT_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "deeper than"));
}

static void test_any(void **state) {
    (void)state;
    for (int obj = 0; obj < 2; obj++) {
        const char *t = kt_json_any_gbnf(obj);
        kt_error err = {0};
        kt_grammar *g = kt_grammar_parse(t, strlen(t), NULL, &err);
        if (!g) fail_msg("%s", err.msg);
        expect(g, "{\"a\":[1,2.5e-3,true,null,\"\\u00e9\\ud83d\\ude00\"]}", true);
        expect(g, "[1]", !obj);
        expect(g, "{\"a\":\"\\ud83d\"}", false); /* a lone surrogate */
        expect(g, "{\"a\":\"\x01\"}", false);
        expect(g, "{\"a\":\"\xff\"}", false);
        kt_grammar_free(g);
    }
}

/* ---- llama.cpp's cases --------------------------------------------------- */

/* Strings llama.cpp rejects but JSON Schema accepts: kettle follows JSON
 * Schema (no type means every type; the empty schema is any value). */
static const struct {
    const char *name, *string;
} LLAMA_SEMANTIC[] = {
    {"empty schema (object)", "[]"},
    {"empty schema (object)", "null"},
    {"empty schema (object)", "\"\""},
    {"empty schema (object)", "true"},
    {"min+max items", "1"},
    /* additionalProperties defaults to true (llama.cpp: false) */
    {"object properties", "{ \"number\": 1600, \"street_name\": \"Pennsylvania\", \"street_type\":\"Avenue\", \"direction\":\"NW\"}"},
};

/* Schemas llama.cpp converts that kettle refuses, on purpose. */
static const char *const LLAMA_REFUSED[] = {
    "required props", /* uniqueItems (llama.cpp ignores it: a known upstream gap) */
    NULL};

static bool semantic_exception(const char *name, const char *s) {
    for (size_t i = 0; i < sizeof LLAMA_SEMANTIC / sizeof LLAMA_SEMANTIC[0]; i++)
        if (!strcmp(LLAMA_SEMANTIC[i].name, name) && !strcmp(LLAMA_SEMANTIC[i].string, s)) return true;
    return false;
}

static void test_llamacpp_integration(void **state) {
    (void)state;
    json_t *d = load(tu_shared("structured/llamacpp_grammar/llamacpp_grammar_tests.json"));
    size_t i, n_cases = 0, n_refused = 0;
    json_t *c;
    json_array_foreach(json_object_get(d, "grammar_integration"), i, c) {
        if (strcmp(json_string_value(json_object_get(c, "kind")), "json_schema")) continue;
        const char *name = json_string_value(json_object_get(c, "name"));
        json_t *schema = json_loads(json_string_value(json_object_get(c, "schema")), JSON_DECODE_ANY, NULL);
        assert_non_null(schema);
        kt_error err = {0};
        kt_grammar *g = build(schema, &err);
        json_decref(schema);
        n_cases++;
        if (!g) {
            if (!in_names(name, LLAMA_REFUSED)) fail_msg("'%s' refused: %s", name, err.msg);
            n_refused++;
            printf("llama.cpp '%s': refused as expected (%s)\n", name, err.msg);
            continue;
        }
        assert_false(in_names(name, LLAMA_REFUSED));
        size_t k;
        json_t *s;
        json_array_foreach(json_object_get(c, "passing"), k, s) {
            if (!accepts(g, json_string_value(s))) fail_msg("'%s': '%s' should pass", name, json_string_value(s));
        }
        json_array_foreach(json_object_get(c, "failing"), k, s) {
            const char *str = json_string_value(s);
            bool exc = semantic_exception(name, str);
            if (accepts(g, str) != exc) fail_msg("'%s': '%s' should %s", name, str, exc ? "pass (JSON Schema)" : "fail");
        }
        kt_grammar_free(g);
    }
    printf("llama.cpp integration: %zu json_schema cases, %zu refused\n", n_cases, n_refused);
    json_decref(d);
}

static const char *const LLAMA_JS2G_REFUSED[] = {
    NULL};

static void test_llamacpp_js2g(void **state) {
    (void)state;
    json_t *d = load(tu_shared("structured/llamacpp_grammar/llamacpp_grammar_tests.json"));
    size_t i, ok = 0, refused = 0;
    json_t *c;
    json_array_foreach(json_object_get(d, "json_schema_to_grammar"), i, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        bool success = !strcmp(json_string_value(json_object_get(c, "status")), "SUCCESS");
        json_t *schema = json_loads(json_string_value(json_object_get(c, "schema")), JSON_DECODE_ANY, NULL);
        kt_error err = {0};
        kt_grammar *g = schema ? build(schema, &err) : NULL;
        if (!schema) snprintf(err.msg, sizeof err.msg, "not JSON");
        json_decref(schema);
        bool expect_refuse = !success || in_names(name, LLAMA_JS2G_REFUSED);
        if (g && expect_refuse) fail_msg("'%s' should be refused", name);
        if (!g && !expect_refuse) fail_msg("'%s' refused: %s", name, err.msg);
        if (!g) printf("js2g '%s': refused (%s)\n", name, err.msg);
        g ? ok++ : refused++;
        kt_grammar_free(g);
    }
    printf("llama.cpp json_schema_to_grammar: %zu converted, %zu refused\n", ok, refused);
    json_decref(d);
}

typedef struct reason {
    char text[96];
    int count;
} reason;

/* The refusal message without its pointer: "keyword 'x' is not supported". */
static void note_reason(reason *r, int *n, const char *msg) {
    const char *colon = strstr(msg, ": ");
    const char *m = colon ? colon + 2 : msg;
    char key[96];
    size_t len = strlen(m) < sizeof key - 1 ? strlen(m) : sizeof key - 1;
    memcpy(key, m, len);
    key[len] = 0;
    /* fold pattern texts and names into their kind */
    char *q = strstr(key, "pattern '");
    if (q) {
        char *e = strstr(q, "': ");
        if (e) memmove(q + 8, e + 1, strlen(e + 1) + 1);
    }
    for (int i = 0; i < *n; i++)
        if (!strcmp(r[i].text, key)) {
            r[i].count++;
            return;
        }
    if (*n < 256) {
        snprintf(r[*n].text, sizeof r[*n].text, "%s", key);
        r[(*n)++].count = 1;
    }
}

static int cmp_reason(const void *a, const void *b) { return ((const reason *)b)->count - ((const reason *)a)->count; }

/* ---- JSON-Schema-Test-Suite -------------------------------------------- */

typedef struct tally {
    int schemas, compiled, refused;
    int valid, valid_ok, invalid, invalid_ok, false_pos;
    /* per test against llguidance */
    int llg_pass, ours_pass, both_pass, only_ours, only_llg;
    reason reasons[256];
    int n_reasons;
} tally;

static bool remote_ref(const json_t *v) {
    if (json_is_object(v)) {
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)v, k, x) {
            if (!strcmp(k, "$ref") && json_is_string(x) && !strncmp(json_string_value(x), "http", 4)) return true;
            if (remote_ref(x)) return true;
        }
    } else if (json_is_array(v)) {
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) if (remote_ref(x)) return true;
    }
    return false;
}

static void suite_file(const char *dir, const char *file, const char *llg_key, const json_t *llg, tally *t) {
    char path[2400];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    json_t *groups = load(path);
    const json_t *lf = json_object_get(llg, llg_key);
    size_t i;
    json_t *grp;
    json_array_foreach(groups, i, grp) {
        const char *gdesc = json_string_value(json_object_get(grp, "description"));
        const json_t *lg = json_object_get(lf, gdesc);
        json_t *schema = json_object_get(grp, "schema");
        kt_error err = {0};
        bool remote = remote_ref(schema);
        kt_grammar *g = remote ? NULL : build(schema, &err);
        if (!g) note_reason(t->reasons, &t->n_reasons, remote ? "remote $ref (skipped)" : err.msg);
        t->schemas++;
        g ? t->compiled++ : t->refused++;
        size_t k;
        json_t *tc;
        json_array_foreach(json_object_get(grp, "tests"), k, tc) {
            bool valid = json_is_true(json_object_get(tc, "valid"));
            const char *tdesc = json_string_value(json_object_get(tc, "description"));
            bool acc = g && accepts_value(g, json_object_get(tc, "data"));
            bool pass = g && acc == valid;
            if (valid) t->valid++, t->valid_ok += acc;
            else t->invalid++, t->invalid_ok += pass;
            if (g && acc && !valid) {
                char *s = json_dumps(json_object_get(tc, "data"), JSON_COMPACT | JSON_ENCODE_ANY);
                char *sc = json_dumps(schema, JSON_COMPACT);
                printf("FALSE POSITIVE %s / %s / %s: %s\n  schema %s\n", file, gdesc, tdesc, s, sc);
                free(s);
                free(sc);
                t->false_pos++;
            }
            const json_t *lr = json_object_get(lg, tdesc);
            bool lpass = json_is_string(lr) && !strcmp(json_string_value(lr), "pass");
            t->llg_pass += lpass;
            t->ours_pass += pass;
            t->both_pass += pass && lpass;
            t->only_ours += pass && !lpass;
            t->only_llg += !pass && lpass;
        }
        kt_grammar_free(g);
    }
    json_decref(groups);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The *.json names of a directory, sorted. */
static int list_json(const char *dir, char ***out) {
    DIR *d = opendir(dir);
    if (!d) fail_msg("cannot open %s", dir);
    char **v = NULL;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 6 || strcmp(e->d_name + len - 5, ".json")) continue;
        v = realloc(v, sizeof *v * (size_t)(n + 1));
        assert_non_null(v);
        v[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(v, (size_t)n, sizeof *v, cmp_str);
    *out = v;
    return n;
}

static void print_tally(const char *what, const tally *t) {
    printf("%s: %d schemas, %d compiled, %d refused; valid instances accepted %d/%d, invalid rejected %d/%d, "
           "false positives %d\n",
           what, t->schemas, t->compiled, t->refused, t->valid_ok, t->valid, t->invalid_ok, t->invalid, t->false_pos);
    printf("%s vs llguidance (per test, 'pass'): llguidance %d, kettle %d, both %d, only kettle %d, only llguidance %d\n",
           what, t->llg_pass, t->ours_pass, t->both_pass, t->only_ours, t->only_llg);
    reason r[256];
    memcpy(r, t->reasons, sizeof r);
    qsort(r, (size_t)t->n_reasons, sizeof *r, cmp_reason);
    printf("%s refusal reasons:\n", what);
    for (int i = 0; i < t->n_reasons; i++) printf("  %3d  %s\n", r[i].count, r[i].text);
}

static void run_suite_dir(const char *rel, const char *prefix, const json_t *llg, tally *t) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", tu_shared(rel));
    char **names;
    int n = list_json(dir, &names);
    for (int i = 0; i < n; i++) {
        char key[600];
        snprintf(key, sizeof key, "%.64s%.*s", prefix, (int)(strlen(names[i]) - 5 > 500 ? 500 : strlen(names[i]) - 5), names[i]);
        suite_file(dir, names[i], key, llg, t);
        free(names[i]);
    }
    free(names);
}

static void test_suite(void **state) {
    (void)state;
    json_t *llg_all = load(tu_shared("structured/json-schema-test-suite/llguidance_expected_results.json"));
    const json_t *llg = json_object_get(llg_all, "draft2020-12");
    static tally t, f;
    run_suite_dir("structured/json-schema-test-suite/draft2020-12", "", llg, &t);
    print_tally("test suite draft2020-12", &t);
    run_suite_dir("structured/json-schema-test-suite/draft2020-12/optional/format", "optional/format/", llg, &f);
    print_tally("test suite optional/format", &f);
    json_decref(llg_all);
    assert_int_equal(t.false_pos, 0);
    assert_int_equal(f.false_pos, 0);
    /* floors measured when written */
    assert_true(t.compiled >= SUITE_MIN_COMPILED);
    assert_true(t.valid_ok >= SUITE_MIN_VALID_OK);
    assert_true(t.ours_pass >= SUITE_MIN_PASS);
}

/* ---- JSONSchemaBench ------------------------------------------------------ */

static void test_bench(void **state) {
    (void)state;
    const char *root = tu_shared("structured/jsonschemabench");
    char rootdir[1024];
    snprintf(rootdir, sizeof rootdir, "%s", root);
    DIR *d = opendir(rootdir);
    assert_non_null(d);
    char *sub[64];
    int n_sub = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n_sub < 64)
        if (e->d_name[0] != '.' && !strchr(e->d_name, '.')) sub[n_sub++] = strdup(e->d_name);
    closedir(d);
    qsort(sub, (size_t)n_sub, sizeof *sub, cmp_str);
    static reason reasons[256];
    int n_reasons = 0, schemas = 0, compiled = 0, valid = 0, valid_ok = 0, invalid = 0, fp = 0;
    for (int s = 0; s < n_sub; s++) {
        char dir[1200];
        snprintf(dir, sizeof dir, "%s/%s", rootdir, sub[s]);
        char **names;
        int n = list_json(dir, &names);
        int c0 = compiled, s0 = schemas;
        for (int i = 0; i < n; i++) {
            char path[1500];
            snprintf(path, sizeof path, "%s/%s", dir, names[i]);
            json_t *doc = load(path);
            kt_error err = {0};
            kt_grammar *g = build(json_object_get(doc, "schema"), &err);
            schemas++;
            if (g) {
                compiled++;
            } else {
                if (err.status != KT_ERR_UNSUPPORTED && err.status != KT_ERR_ARG)
                    fail_msg("%s: refused with status %d: %s", path, err.status, err.msg);
                note_reason(reasons, &n_reasons, err.msg);
            }
            size_t k;
            json_t *tc;
            json_array_foreach(json_object_get(doc, "tests"), k, tc) {
                bool v = json_is_true(json_object_get(tc, "valid"));
                bool acc = g && accepts_value(g, json_object_get(tc, "data"));
                v ? valid++ : invalid++;
                valid_ok += v && acc;
                if (!v && acc) {
                    printf("FALSE POSITIVE %s test %zu\n", path, k);
                    fp++;
                }
            }
            kt_grammar_free(g);
            json_decref(doc);
            free(names[i]);
        }
        free(names);
        printf("bench %-16s %3d schemas, %3d compiled\n", sub[s], schemas - s0, compiled - c0);
        free(sub[s]);
    }
    qsort(reasons, (size_t)n_reasons, sizeof *reasons, cmp_reason);
    printf("bench: %d schemas, %d compiled, %d refused; valid instances accepted %d/%d; invalid %d; false positives %d\n",
           schemas, compiled, schemas - compiled, valid_ok, valid, invalid, fp);
    printf("bench refusal reasons:\n");
    for (int i = 0; i < n_reasons; i++) printf("  %3d  %s\n", reasons[i].count, reasons[i].text);
    assert_int_equal(fp, 0);
    assert_true(compiled >= BENCH_MIN_COMPILED);
    assert_true(valid_ok >= BENCH_MIN_VALID_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_integer_ranges),
        cmocka_unit_test(test_number_ranges),
        cmocka_unit_test(test_formats),
        cmocka_unit_test(test_patterns),
        cmocka_unit_test(test_recursive_ref),
        cmocka_unit_test(test_objects),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_any),
        cmocka_unit_test(test_llamacpp_integration),
        cmocka_unit_test(test_llamacpp_js2g),
        cmocka_unit_test(test_relaxed_bounds),
        cmocka_unit_test(test_suite),
        cmocka_unit_test(test_bench),
    };
    return tu_result(cmocka_run_group_tests(tests, NULL, NULL));
}
