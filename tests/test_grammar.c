/*
 * test_grammar.c - the GBNF parser (src/grammar/gbnf.c) and the reference
 * matcher (src/grammar/match_ref.c) against llama.cpp's own test tables
 * (shared/structured/llamacpp_grammar/llamacpp_grammar_tests.json), its
 * grammars (the .gbnf files), and our own cases: UTF-8 byte-level classes, escapes,
 * repetition bounds, exact error positions, limits on hostile input and
 * the matcher's all-or-nothing steps.
 */
#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "grammar/grammar.h"
#include "testutil.h"

#define DATA_DIR "structured/llamacpp_grammar"

/* ---- helpers ------------------------------------------------------------ */

static kt_grammar *parse_ok(const char *text) {
    kt_error err = {0};
    kt_grammar *g = kt_grammar_parse(text, strlen(text), NULL, &err);
    if (!g) fail_msg("grammar should parse: %s\n--\n%s", err.msg, text);
    return g;
}

/* Parses text that must fail; returns the message (static). */
static const char *parse_err(const char *text) {
    static kt_error err;
    memset(&err, 0, sizeof err);
    kt_grammar *g = kt_grammar_parse(text, strlen(text), NULL, &err);
    if (g) {
        kt_grammar_free(g);
        fail_msg("grammar should be refused:\n%s", text);
    }
    assert_int_not_equal(err.status, KT_OK);
    assert_true(err.msg[0] != 0);
    return err.msg;
}

static bool accepts(const kt_grammar *g, const char *s) {
    return kt_grammar_accepts(g, (const uint8_t *)s, strlen(s));
}

/* Does the message start with "line L, column C: " (L, C >= 1)? */
static bool has_position(const char *msg) {
    unsigned line, col;
    return sscanf(msg, "line %u, column %u:", &line, &col) == 2 && line >= 1 && col >= 1;
}

static void assert_msg_has(const char *msg, const char *want) {
    if (!strstr(msg, want)) fail_msg("message '%s' should contain '%s'", msg, want);
}

static void assert_msg_starts(const char *msg, const char *prefix) {
    if (strncmp(msg, prefix, strlen(prefix)) != 0) fail_msg("message '%s' should start with '%s'", msg, prefix);
}

static json_t *load_tests(void) {
    json_error_t jerr;
    json_t *root = json_load_file(tu_shared(DATA_DIR "/llamacpp_grammar_tests.json"), 0, &jerr);
    if (!root) fail_msg("cannot load the test tables: %s", jerr.text);
    return root;
}

/* ---- llama.cpp's tables ------------------------------------------------- */

static void test_integration(void **state) {
    (void)state;
    json_t *root = load_tests();
    json_t *cases = json_object_get(root, "grammar_integration");
    assert_true(json_is_array(cases));
    int n_cases = 0, n_pass = 0, n_fail = 0, bad = 0;
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        if (strcmp(json_string_value(json_object_get(c, "kind")), "grammar") != 0) continue;
        const char *name = json_string_value(json_object_get(c, "name"));
        kt_grammar *g = parse_ok(json_string_value(json_object_get(c, "grammar")));
        n_cases++;
        size_t k;
        json_t *s;
        json_array_foreach(json_object_get(c, "passing"), k, s) {
            bool ok = kt_grammar_accepts(g, (const uint8_t *)json_string_value(s), json_string_length(s));
            if (!ok) printf("  [%s] should accept '%s'\n", name, json_string_value(s)), bad++;
            n_pass++;
        }
        json_array_foreach(json_object_get(c, "failing"), k, s) {
            bool ok = kt_grammar_accepts(g, (const uint8_t *)json_string_value(s), json_string_length(s));
            if (ok) printf("  [%s] should reject '%s'\n", name, json_string_value(s)), bad++;
            n_fail++;
        }
        kt_grammar_free(g);
    }
    printf("grammar_integration: %d grammars, %d/%d strings right (%d passing, %d failing)\n", n_cases,
           n_pass + n_fail - bad, n_pass + n_fail, n_pass, n_fail);
    assert_true(n_cases >= 10);
    assert_int_equal(bad, 0);
    json_decref(root);
}

static void test_build_must_fail(void **state) {
    (void)state;
    json_t *root = load_tests();
    size_t i;
    json_t *c;
    int n = 0;
    json_array_foreach(json_object_get(root, "grammar_build_must_fail"), i, c) {
        const char *msg = parse_err(json_string_value(json_object_get(c, "grammar")));
        assert_msg_has(msg, "left-recursive");
        n++;
    }
    printf("grammar_build_must_fail: %d/%d refused\n", n, n);
    assert_int_equal(n, 4);
    json_decref(root);
}

static void test_parser_must_fail(void **state) {
    (void)state;
    json_t *root = load_tests();
    size_t i;
    json_t *c;
    int n = 0;
    json_array_foreach(json_object_get(root, "grammar_parser_must_fail"), i, c) {
        const char *msg = parse_err(json_string_value(c));
        if (!has_position(msg)) fail_msg("no position in '%s'", msg);
        n++;
    }
    printf("grammar_parser_must_fail: %d/%d refused with a position\n", n, n);
    assert_int_equal(n, 2);
    json_decref(root);
}

static void test_parser_must_parse(void **state) {
    (void)state;
    json_t *root = load_tests();
    size_t i;
    json_t *c;
    int n = 0;
    json_array_foreach(json_object_get(root, "grammar_parser_must_parse"), i, c) {
        kt_grammar_free(parse_ok(json_string_value(c)));
        n++;
    }
    printf("grammar_parser_must_parse: %d/%d parsed\n", n, n);
    assert_int_equal(n, 14);
    json_decref(root);
}

/* Feeds one token-level string: {"token": N} segments as control tokens,
 * text code point by code point as token 0. */
static bool feed_segments(const kt_grammar *g, json_t *segments) {
    kt_error err = {0};
    kt_gmatch *m = kt_gmatch_new(g, &err);
    if (!m) fail_msg("%s", err.msg);
    bool ok = true;
    size_t i;
    json_t *seg;
    json_array_foreach(segments, i, seg) {
        if (!ok) break;
        if (json_is_object(seg)) {
            ok = kt_gmatch_token(m, (int32_t)json_integer_value(json_object_get(seg, "token")), NULL, 0);
            continue;
        }
        const uint8_t *s = (const uint8_t *)json_string_value(seg);
        size_t n = json_string_length(seg);
        for (size_t k = 0; k < n && ok;) {
            size_t len = s[k] < 0x80 ? 1 : s[k] < 0xE0 ? 2 : s[k] < 0xF0 ? 3 : 4;
            ok = kt_gmatch_token(m, 0, s + k, len);
            k += len;
        }
    }
    ok = ok && kt_gmatch_can_end(m);
    kt_gmatch_free(m);
    return ok;
}

static void test_token_level(void **state) {
    (void)state;
    json_t *root = load_tests();
    size_t i;
    json_t *c;
    int n = 0, right = 0;
    json_array_foreach(json_object_get(root, "grammar_integration_token_level"), i, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        kt_grammar *g = parse_ok(json_string_value(json_object_get(c, "grammar")));
        size_t k;
        json_t *s;
        json_array_foreach(json_object_get(c, "passing"), k, s) {
            n++;
            if (feed_segments(g, s)) right++;
            else printf("  [%s] passing #%zu rejected\n", name, k);
        }
        json_array_foreach(json_object_get(c, "failing"), k, s) {
            n++;
            if (!feed_segments(g, s)) right++;
            else printf("  [%s] failing #%zu accepted\n", name, k);
        }
        kt_grammar_free(g);
    }
    printf("grammar_integration_token_level: %d/%d strings right\n", right, n);
    assert_int_equal(n, 20);
    assert_int_equal(right, n);
    json_decref(root);
}

/* ---- the .gbnf files ------------------------------------------------------ */

static kt_grammar *load_gbnf(const char *file) {
    char rel[256];
    snprintf(rel, sizeof rel, DATA_DIR "/grammars/%s", file);
    size_t size;
    char *text = tu_read_file(tu_shared(rel), &size);
    if (!text) fail_msg("cannot read %s", rel);
    kt_error err = {0};
    kt_grammar *g = kt_grammar_parse(text, size, NULL, &err);
    free(text);
    if (!g) fail_msg("%s: %s", file, err.msg);
    return g;
}

static void test_gbnf_files_parse(void **state) {
    (void)state;
    DIR *d = opendir(tu_shared(DATA_DIR "/grammars"));
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 6 || strcmp(e->d_name + len - 5, ".gbnf") != 0) continue;
        kt_grammar *g = load_gbnf(e->d_name);
        kt_gmatch *m = kt_gmatch_new(g, NULL);
        assert_non_null(m);
        kt_gmatch_free(m);
        kt_grammar_free(g);
        n++;
    }
    closedir(d);
    printf("grammars/*.gbnf: %d/%d parsed\n", n, n);
    assert_int_equal(n, 8);
}

static void test_gbnf_sentences(void **state) {
    (void)state;
    kt_grammar *g = load_gbnf("json.gbnf");
    assert_true(accepts(g, "{\"a\": [1, 2.5, -3e4, true, null], \"b\": {\"c\": \"d\\n\\u00e9 \xc3\xa9\"}}"));
    assert_true(accepts(g, "{}"));
    assert_false(accepts(g, "{\"a\": [1, 2"));         /* truncated */
    assert_false(accepts(g, "{\"a\": 01}"));           /* leading zero */
    assert_false(accepts(g, "[1]"));                    /* root is an object */
    assert_false(accepts(g, "{\"a\": \"\x01\"}"));     /* control character in a string */
    assert_false(accepts(g, "{\"a\": \"\xc3\"}"));     /* invalid UTF-8 */
    kt_grammar_free(g);

    g = load_gbnf("arithmetic.gbnf");
    assert_true(accepts(g, "1+2=3\n"));
    assert_true(accepts(g, "(x +y1)*2 = z\nq=1\n"));
    assert_false(accepts(g, "1+2=3"));  /* each equation ends in a newline */
    assert_false(accepts(g, "1+=3\n"));
    assert_false(accepts(g, "1+ 2=3\n")); /* no space after an operator */
    kt_grammar_free(g);

    g = load_gbnf("list.gbnf");
    assert_true(accepts(g, "- eggs\n- m\xc3\xbcsli\n"));
    assert_false(accepts(g, "- eggs"));
    assert_false(accepts(g, "- a\xe2\x80\xa8" "b\n")); /* U+2028 is excluded */
    kt_grammar_free(g);

    g = load_gbnf("chess.gbnf");
    assert_true(accepts(g, "1. e4 e5\n2. Nf3 Nc6\n"));
    assert_false(accepts(g, "1. e4 e5\n"));
    kt_grammar_free(g);

    g = load_gbnf("japanese.gbnf");
    assert_true(accepts(g, "\xe3\x81\x93\xe3\x82\x93\xe3\x81\xab\xe3\x81\xa1\xe3\x81\xaf")); /* こんにちは */
    assert_false(accepts(g, "hello"));
    kt_grammar_free(g);
}

/* ---- our own cases ------------------------------------------------------ */

static void test_compiled_form(void **state) {
    (void)state;
    /* an ASCII class is one SET inline; a literal is BYTEs; sets dedupe */
    kt_grammar *g = parse_ok("root ::= [a-c] \"xy\" [a-c] [b]");
    const kt_grule *r = &g->rules[g->root];
    assert_int_equal(r->n_alts, 1);
    const kt_gelem *e = &g->elems[g->alts[r->first_alt]];
    assert_int_equal(e[0].type, KT_GE_SET);
    assert_int_equal(e[1].type, KT_GE_BYTE);
    assert_int_equal(e[1].value, 'x');
    assert_int_equal(e[2].type, KT_GE_BYTE);
    assert_int_equal(e[2].value, 'y');
    assert_int_equal(e[3].type, KT_GE_SET);
    assert_int_equal(e[3].value, e[0].value);
    assert_int_equal(e[4].type, KT_GE_BYTE); /* [b]: one byte */
    assert_int_equal(e[4].value, 'b');
    assert_int_equal(e[5].type, KT_GE_END);
    assert_int_equal(g->n_sets, 1);
    assert_true(kt_byteset_has(&g->sets[0], 'a') && kt_byteset_has(&g->sets[0], 'c'));
    assert_false(kt_byteset_has(&g->sets[0], 'd'));
    assert_string_equal(g->rule_names[g->root], "root");
    kt_grammar_free(g);

    /* a non-ASCII class is a RULE to a generated rule of byte sequences */
    g = parse_ok("root ::= [a\xc3\xa9]");
    e = &g->elems[g->alts[g->rules[g->root].first_alt]];
    assert_int_equal(e[0].type, KT_GE_RULE);
    assert_int_equal(g->rules[e[0].value].n_alts, 2); /* 'a' | C3 A9 */
    kt_grammar_free(g);

    /* a literal of a 3-byte character is its UTF-8 bytes */
    g = parse_ok("root ::= \"\\u20AC\"");
    e = &g->elems[g->alts[g->rules[g->root].first_alt]];
    assert_int_equal(e[0].value, 0xE2);
    assert_int_equal(e[1].value, 0x82);
    assert_int_equal(e[2].value, 0xAC);
    assert_int_equal(e[3].type, KT_GE_END);
    kt_grammar_free(g);
}

static void test_utf8_classes(void **state) {
    (void)state;
    /* é (2 bytes), € (3 bytes), 😀 (4 bytes) */
    kt_grammar *g = parse_ok("root ::= [\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80]+");
    assert_true(accepts(g, "\xc3\xa9"));
    assert_true(accepts(g, "\xe2\x82\xac"));
    assert_true(accepts(g, "\xf0\x9f\x98\x80\xc3\xa9"));
    assert_false(accepts(g, "e"));
    assert_false(accepts(g, "\xc3\xa8"));           /* è */
    assert_false(accepts(g, "\xe2\x82\xad"));       /* ₭ */
    assert_false(accepts(g, "\xf0\x9f\x98\x81"));   /* 😁 */
    assert_false(accepts(g, "\xc3"));               /* a character cut short */
    kt_grammar_free(g);

    g = parse_ok("root ::= [^\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80]");
    assert_true(accepts(g, "e"));
    assert_true(accepts(g, "\xc3\xa8"));
    assert_true(accepts(g, "\xe2\x82\xad"));
    assert_true(accepts(g, "\xf0\x9f\x98\x81"));
    assert_true(accepts(g, "\xf4\x8f\xbf\xbf"));    /* U+10FFFF */
    assert_false(accepts(g, "\xc3\xa9"));
    assert_false(accepts(g, "\xe2\x82\xac"));
    assert_false(accepts(g, "\xf0\x9f\x98\x80"));
    /* invalid UTF-8 is never accepted, even by a negated class */
    assert_false(accepts(g, "\xff"));
    assert_false(accepts(g, "\x80"));
    assert_false(accepts(g, "\xc0\xaf"));           /* overlong '/' */
    assert_false(accepts(g, "\xe0\x80\xaf"));       /* overlong '/' */
    assert_false(accepts(g, "\xed\xa0\x80"));       /* surrogate D800 */
    assert_false(accepts(g, "\xf4\x90\x80\x80"));   /* above U+10FFFF */
    kt_grammar_free(g);

    /* ranges across encoded-length boundaries */
    g = parse_ok("root ::= [\\x7E-\\u0801]");
    assert_true(accepts(g, "~"));
    assert_true(accepts(g, "\x7f"));
    assert_true(accepts(g, "\xc2\x80"));
    assert_true(accepts(g, "\xdf\xbf"));
    assert_true(accepts(g, "\xe0\xa0\x80"));
    assert_true(accepts(g, "\xe0\xa0\x81"));
    assert_false(accepts(g, "\xe0\xa0\x82"));
    assert_false(accepts(g, "}"));
    kt_grammar_free(g);

    /* '.' is any scalar value, not any byte */
    g = parse_ok("root ::= . .");
    assert_true(accepts(g, "a\xf0\x9f\x98\x80"));
    assert_false(accepts(g, "a"));
    assert_false(accepts(g, "a\xed\xbf\xbf"));
    kt_grammar_free(g);

    /* a character split across two kt_gmatch_bytes calls */
    g = parse_ok("root ::= \"x\" [\xe2\x82\xac] \"y\"");
    kt_gmatch *m = kt_gmatch_new(g, NULL);
    assert_non_null(m);
    assert_true(kt_gmatch_bytes(m, (const uint8_t *)"x\xe2", 2));
    assert_false(kt_gmatch_can_end(m));
    assert_true(kt_gmatch_bytes(m, (const uint8_t *)"\x82\xac" "y", 3));
    assert_true(kt_gmatch_can_end(m));
    assert_true(kt_gmatch_is_done(m));
    kt_gmatch_free(m);
    kt_grammar_free(g);
}

static void test_escapes(void **state) {
    (void)state;
    kt_grammar *g = parse_ok("root ::= \"\\n\\r\\t\\\\\\\"\\[\\]\\x41\\u00e9\\U0001F600\"");
    assert_true(accepts(g, "\n\r\t\\\"[]A\xc3\xa9\xf0\x9f\x98\x80"));
    assert_false(accepts(g, "\n\r\t\\\"[]A\xc3\xa9"));
    kt_grammar_free(g);

    /* \xHH is the code point U+00HH (UTF-8 encoded), as in llama.cpp */
    g = parse_ok("root ::= \"\\xe9\"");
    assert_true(accepts(g, "\xc3\xa9"));
    assert_false(accepts(g, "\xe9"));
    kt_grammar_free(g);

    g = parse_ok("root ::= [\\]\\[\\-\\\\]+");
    assert_true(accepts(g, "]-[\\"));
    assert_false(accepts(g, "a"));
    kt_grammar_free(g);

    /* '-' first or last in a class is itself */
    g = parse_ok("root ::= [-a] [b-]");
    assert_true(accepts(g, "-b"));
    assert_true(accepts(g, "a-"));
    assert_false(accepts(g, "bb"));
    kt_grammar_free(g);

    assert_msg_has(parse_err("root ::= \"\\q\""), "unknown escape");
    assert_msg_has(parse_err("root ::= \"\\x4\""), "hex digits");
    assert_msg_has(parse_err("root ::= \"\\uD800\""), "no UTF-8 encoding");
    assert_msg_has(parse_err("root ::= \"\\U00110000\""), "no UTF-8 encoding");
}

static void test_repeat_bounds(void **state) {
    (void)state;
    char buf[64];
    kt_grammar *g = parse_ok("root ::= \"a\"{2,4}");
    for (int n = 0; n <= 6; n++) {
        memset(buf, 'a', (size_t)n);
        buf[n] = 0;
        assert_int_equal(accepts(g, buf), n >= 2 && n <= 4);
    }
    kt_grammar_free(g);

    g = parse_ok("root ::= \"ab\"{3}");
    assert_true(accepts(g, "ababab"));
    assert_false(accepts(g, "abab"));
    assert_false(accepts(g, "abababab"));
    kt_grammar_free(g);

    g = parse_ok("root ::= \"a\"{2,}");
    assert_false(accepts(g, "a"));
    assert_true(accepts(g, "aa"));
    assert_true(accepts(g, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"));
    kt_grammar_free(g);

    g = parse_ok("root ::= \"a\"{,2} \"b\"");
    assert_true(accepts(g, "b"));
    assert_true(accepts(g, "aab"));
    assert_false(accepts(g, "aaab"));
    kt_grammar_free(g);

    g = parse_ok("root ::= \"x\" \"a\"{0} \"y\"");
    assert_true(accepts(g, "xy"));
    assert_false(accepts(g, "xay"));
    kt_grammar_free(g);

    /* as in llama.cpp a repetition applies to the symbol it follows, and a
     * second one to the expansion of the first: "a"{2}* is (aa)* */
    g = parse_ok("root ::= \"a\"{2}*");
    assert_true(accepts(g, ""));
    assert_true(accepts(g, "aaaa"));
    assert_false(accepts(g, "aaa"));
    kt_grammar_free(g);

    g = parse_ok("root ::= (\"0x\" [A-F0-9]{2} \" \"?){3,5}");
    assert_true(accepts(g, "0xFF 0x12 0xAB"));
    assert_false(accepts(g, "0xFF 0x12"));
    kt_grammar_free(g);

    assert_msg_has(parse_err("root ::= \"a\"{3,2}"), "maximum below its minimum");
    assert_msg_has(parse_err("root ::= \"a\"{,}"), "expecting a repeat count");
    assert_msg_has(parse_err("root ::= *"), "expecting an item before '*'");
}

static void test_error_positions(void **state) {
    (void)state;
    assert_string_equal(parse_err("root ::= \"a\" )"),
                        "line 1, column 14: expecting a newline or the end after the rule");
    assert_string_equal(parse_err("root ::= \"a\"\nfoo ::= (\"b\""), "line 2, column 13: expecting ')'");
    assert_string_equal(parse_err("root ::= x\n\n  x ::= \"abc"), "line 3, column 9: unterminated string literal");
    assert_string_equal(parse_err("root ::= [a-z"), "line 1, column 10: unterminated character class");
    assert_string_equal(parse_err("root := \"a\""), "line 1, column 6: expecting '::='");
    assert_string_equal(parse_err("root ::= \"a\"\n  | \"b\""), "line 2, column 3: expecting a rule name");
    assert_string_equal(parse_err("root ::= a b\na ::= \"x\""), "line 1, column 12: undefined rule 'b'");
    assert_string_equal(parse_err("root ::= \"a\" \"b\\z\""), "line 1, column 16: unknown escape '\\z'");
    assert_string_equal(parse_err("root ::= []"), "line 1, column 10: empty character class");
    assert_string_equal(parse_err("root ::= <foo>"),
                        "line 1, column 10: a token written as text (<...>) needs a vocabulary; write its id as <[id]>");
    assert_string_equal(parse_err("root ::= \"\xc3\x28\""), "line 1, column 11: invalid UTF-8 in the grammar text");
    assert_string_equal(parse_err("foo ::= \"a\""), "grammar has no rule named 'root'");
    assert_string_equal(parse_err("  # only a comment\n\n"), "empty grammar: no rules");
    assert_string_equal(parse_err(""), "empty grammar: no rules");

    /* newlines: allowed inside groups and after '|', not elsewhere */
    kt_grammar *g = parse_ok("root ::= (\n  \"a\" # comment\n  | \"b\"\n) \"c\" |\n  \"d\"\n");
    assert_true(accepts(g, "ac"));
    assert_true(accepts(g, "bc"));
    assert_true(accepts(g, "d"));
    kt_grammar_free(g);

    /* another start rule */
    kt_error err = {0};
    const char *text = "a ::= \"x\" b\nb ::= \"y\"";
    g = kt_grammar_parse(text, strlen(text), "b", &err);
    assert_non_null(g);
    assert_true(accepts(g, "y"));
    assert_false(accepts(g, "xy"));
    kt_grammar_free(g);

    /* a rule defined twice keeps its last definition, as in llama.cpp */
    g = parse_ok("root ::= \"a\"\nroot ::= \"b\"");
    assert_true(accepts(g, "b"));
    assert_false(accepts(g, "a"));
    kt_grammar_free(g);
}

static void test_left_recursion(void **state) {
    (void)state;
    assert_msg_starts(parse_err("root ::= \"a\" | root \"a\""), "rule 'root' is left-recursive:");
    assert_msg_starts(parse_err("root ::= a\na ::= b \"x\" | \"y\"\nb ::= \"z\" | a"), "rule 'a' is left-recursive:");
    /* through a rule that is nullable only transitively */
    assert_msg_has(parse_err("root ::= e root \"x\" | \"y\"\ne ::= f f\nf ::= \"q\" |"), "left-recursive");
    /* a star over something nullable */
    assert_msg_has(parse_err("root ::= (\"a\"?)*"), "left-recursive");
    /* right recursion and recursion after a terminal are fine */
    kt_grammar *g = parse_ok("root ::= \"(\" root \")\" | \"x\" root | ");
    assert_true(accepts(g, "((x))"));
    assert_true(accepts(g, "xx()"));
    assert_false(accepts(g, "(()"));
    kt_grammar_free(g);
    /* nullable but not recursive */
    g = parse_ok("root ::= e e \"x\"\ne ::= f f\nf ::= \"q\" |");
    assert_true(accepts(g, "x"));
    assert_true(accepts(g, "qqqqx"));
    assert_false(accepts(g, "qqqqqx"));
    kt_grammar_free(g);
}

static void test_limits(void **state) {
    (void)state;
    assert_msg_has(parse_err("root ::= \"a\"{100000}"), "limit");
    assert_msg_has(parse_err("root ::= \"a\"{1,100000}"), "limit");
    assert_msg_has(parse_err("root ::= \"a\"{99999999999999999999999}"), "limit");
    kt_grammar_free(parse_ok("root ::= \"a\"{10000}"));

    size_t depth = 10000;
    char *deep = tu_xmalloc(2 * depth + 32);
    char *w = deep + sprintf(deep, "root ::= ");
    for (size_t i = 0; i < depth; i++) *w++ = '(';
    *w++ = '"', *w++ = 'a', *w++ = '"';
    for (size_t i = 0; i < depth; i++) *w++ = ')';
    *w = 0;
    assert_msg_has(parse_err(deep), "nested deeper");
    free(deep);

    /* copies multiply: 2000 bytes x 10000 is past the element limit */
    char *big = tu_xmalloc(2100);
    w = big + sprintf(big, "root ::= \"");
    for (int i = 0; i < 2000; i++) *w++ = 'a';
    sprintf(w, "\"{10000}");
    assert_msg_has(parse_err(big), "elements");
    free(big);

    /* text over the size limit is refused before it is read */
    kt_error err = {0};
    assert_null(kt_grammar_parse("root ::= \"a\"", KT_GRAMMAR_MAX_TEXT + 1, NULL, &err));
    assert_msg_has(err.msg, "limit");
    assert_null(kt_grammar_parse("root ::= \"a\"\0", 13, NULL, &err));
    assert_msg_has(err.msg, "NUL");
}

static void test_matcher_limits(void **state) {
    (void)state;
    /* 2000 optional items in a row: every step meets the same nullable
     * chain; right answers (and quickly, since a step expands each
     * intermediate stack once) */
    char *text = tu_xmalloc(16 * 2000 + 32);
    char *w = text + sprintf(text, "root ::= ");
    for (int i = 0; i < 2000; i++) w += sprintf(w, "\"a\"? ");
    sprintf(w, "\"b\"");
    kt_grammar *g = parse_ok(text);
    assert_true(accepts(g, "aaab"));
    assert_true(accepts(g, "b"));
    assert_false(accepts(g, "aaa"));
    kt_grammar_free(g);
    free(text);

    /* a start state wider than KT_GMATCH_MAX_STACKS is refused with a
     * message, not truncated */
    g = parse_ok("root ::= ((\"ab\"{0,10000}){0,10000})");
    kt_error err = {0};
    assert_null(kt_gmatch_new(g, &err));
    assert_msg_has(err.msg, "stacks");
    assert_false(accepts(g, "ab"));
    kt_grammar_free(g);
}

static void test_matcher_state(void **state) {
    (void)state;
    kt_grammar *g = parse_ok("root ::= \"ab\" [0-9]+ \"c\"");
    kt_gmatch *m = kt_gmatch_new(g, NULL);
    assert_non_null(m);
    assert_false(kt_gmatch_can_end(m));
    assert_false(kt_gmatch_byte(m, 'x'));   /* rejected: state unchanged */
    assert_true(kt_gmatch_byte(m, 'a'));
    assert_false(kt_gmatch_byte(m, 'a'));
    assert_true(kt_gmatch_byte(m, 'b'));
    assert_false(kt_gmatch_byte(m, 'c'));   /* needs a digit first */
    assert_true(kt_gmatch_byte(m, '7'));
    /* kt_gmatch_bytes is all or nothing */
    assert_false(kt_gmatch_bytes(m, (const uint8_t *)"12x", 3));
    kt_gmatch *c = kt_gmatch_clone(m);
    assert_non_null(c);
    assert_true(kt_gmatch_bytes(m, (const uint8_t *)"12c", 3));
    assert_true(kt_gmatch_can_end(m));
    assert_true(kt_gmatch_is_done(m));
    assert_false(kt_gmatch_byte(m, 'c'));
    assert_true(kt_gmatch_is_done(m));
    /* the clone is independent and still before "12c" */
    assert_false(kt_gmatch_can_end(c));
    assert_true(kt_gmatch_byte(c, 'c'));
    assert_true(kt_gmatch_can_end(c));
    kt_gmatch_free(c);
    kt_gmatch_free(m);
    kt_grammar_free(g);

    /* can_end without is_done: more may follow */
    g = parse_ok("root ::= \"a\"+");
    m = kt_gmatch_new(g, NULL);
    assert_true(kt_gmatch_byte(m, 'a'));
    assert_true(kt_gmatch_can_end(m));
    assert_false(kt_gmatch_is_done(m));
    kt_gmatch_free(m);
    kt_grammar_free(g);
}

static void test_tokens(void **state) {
    (void)state;
    kt_grammar *g = parse_ok("root ::= <[5]> \"hi\" !<[7]> <[7]>");
    kt_gmatch *m = kt_gmatch_new(g, NULL);
    assert_false(kt_gmatch_token(m, 6, NULL, 0));
    assert_false(kt_gmatch_token(m, 6, (const uint8_t *)"x", 1)); /* text cannot stand for a token ref */
    kt_gmatch *c = kt_gmatch_clone(m);
    assert_true(kt_gmatch_token(c, 5, (const uint8_t *)"x", 1));  /* the id decides, whatever its text */
    kt_gmatch_free(c);
    assert_true(kt_gmatch_token(m, 5, NULL, 0));
    assert_false(kt_gmatch_token(m, 9, NULL, 0));                 /* control token where text is due */
    assert_true(kt_gmatch_token(m, 9, (const uint8_t *)"h", 1));
    assert_true(kt_gmatch_token(m, 3, (const uint8_t *)"i", 1));
    assert_false(kt_gmatch_token(m, 7, NULL, 0));                 /* !<[7]> refuses 7 */
    assert_true(kt_gmatch_token(m, 8, NULL, 0));
    assert_false(kt_gmatch_can_end(m));
    assert_false(kt_gmatch_byte(m, 'x'));                         /* a token ref takes no bytes */
    assert_true(kt_gmatch_token(m, 7, NULL, 0));
    assert_true(kt_gmatch_is_done(m));
    kt_gmatch_free(m);
    kt_grammar_free(g);

    assert_msg_has(parse_err("root ::= <[99999999999]>"), "token id");
    assert_msg_has(parse_err("root ::= !\"a\""), "expecting '<'");
}

/* Damaged grammars (bytes flipped, cut, duplicated) either compile or fail
 * with a message: never crash, hang or leak (run under ASan). The seeded
 * generator makes every run the same. */
static void test_damage(void **state) {
    (void)state;
    char rel[128];
    snprintf(rel, sizeof rel, DATA_DIR "/grammars/json.gbnf");
    size_t size;
    char *orig = tu_read_file(tu_shared(rel), &size);
    assert_non_null(orig);
    char *buf = tu_xmalloc(size * 2 + 1);
    uint64_t x = 0x2545F4914F6CDD1Dull;
    int n_ok = 0, n_err = 0;
    for (int round = 0; round < 400; round++) {
        memcpy(buf, orig, size);
        size_t n = size;
        for (int k = 0; k < 1 + round % 4; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            size_t at = (size_t)(x % n);
            static const char pick[] = "()[]{}|*+?\\\"\n#-^.,0123456789x<>!:=\xc3\xff";
            switch ((x >> 32) % 3) {
            case 0: buf[at] = pick[(x >> 40) % (sizeof pick - 1)]; break;
            case 1: n = at + 1; break;
            default: memmove(buf + at + 1, buf + at, n - at), n++; break;
            }
        }
        kt_error err = {0};
        kt_grammar *g = kt_grammar_parse(buf, n, NULL, &err);
        if (g) {
            n_ok++;
            accepts(g, "{\"a\": [1, \"b\"]}");
            kt_grammar_free(g);
        } else {
            n_err++;
            assert_true(err.msg[0] != 0);
        }
    }
    printf("damaged json.gbnf: %d compiled, %d refused\n", n_ok, n_err);
    assert_true(n_err > 0);
    free(buf);
    free(orig);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_integration),
        cmocka_unit_test(test_build_must_fail),
        cmocka_unit_test(test_parser_must_fail),
        cmocka_unit_test(test_parser_must_parse),
        cmocka_unit_test(test_token_level),
        cmocka_unit_test(test_gbnf_files_parse),
        cmocka_unit_test(test_gbnf_sentences),
        cmocka_unit_test(test_compiled_form),
        cmocka_unit_test(test_utf8_classes),
        cmocka_unit_test(test_escapes),
        cmocka_unit_test(test_repeat_bounds),
        cmocka_unit_test(test_error_positions),
        cmocka_unit_test(test_left_recursion),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_matcher_limits),
        cmocka_unit_test(test_matcher_state),
        cmocka_unit_test(test_tokens),
        cmocka_unit_test(test_damage),
    };
    return tu_result(cmocka_run_group_tests(tests, NULL, NULL));
}
