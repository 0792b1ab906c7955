/*
 * test_template.c - the Jinja interpreter and chat template rendering.
 *
 * 1. Every template in shared/templates against every case in cases.json:
 *    expected/NAME__CASE.txt must be reproduced byte for byte, and
 *    expected/NAME__CASE.error (a raise_exception message) must be the
 *    error. Files are discovered by listing the directory.
 * 2. A table of small templates, one or a few constructs each, whose
 *    expected outputs were produced by jinja2 3.1 configured as
 *    transformers does (trim_blocks, lstrip_blocks, loopcontrols,
 *    ImmutableSandboxedEnvironment, its tojson); malformed templates must
 *    fail with a message naming the problem and line.
 * 3. Robustness: every prefix and many one-byte mutations of every shared
 *    template are parsed and rendered; they may fail, never crash (run
 *    under ASan in CI).
 */
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "text/chat.h"
#include "text/chat_builtin.h"
#include "text/jinja.h"

#define FIXED_NOW 1721952000 /* 2024-07-26 00:00 UTC, as the reference */

/* ---- 1. the reference expectations ---------------------------------- */

static char *read_opt(const char *dir, const char *name, const char *cname,
                      const char *ext) {
    char path[2048];
    int n = snprintf(path, sizeof path, "%s/expected/%s__%s.%s", dir, name, cname, ext);
    if (n < 0 || (size_t)n >= sizeof path) return NULL;
    return tu_read_file(path, NULL);
}

/* "TemplateError: msg\n" -> "msg" (the file names the Python type) */
static const char *error_message(char *text) {
    size_t n = strlen(text);
    while (n && (text[n - 1] == '\n' || text[n - 1] == '\r')) text[--n] = 0;
    const char *colon = strstr(text, ": ");
    if (colon) {
        const char *p = text;
        while (p < colon && (p[0] == '_' || (p[0] >= 'A' && p[0] <= 'Z') ||
                             (p[0] >= 'a' && p[0] <= 'z') || (p[0] >= '0' && p[0] <= '9')))
            p++;
        if (p == colon && colon - text >= 5 && !strncmp(colon - 5, "Error", 5)) return colon + 2;
    }
    return text;
}

typedef struct tally { int matched, expected, none, checked; } tally;

static void check_case(const char *dir, const char *name, const char *tpl,
                       const char *cname, json_t *cv, json_t *ctx, tally *t) {
    char *want = read_opt(dir, name, cname, "txt");
    char *want_err = want ? NULL : read_opt(dir, name, cname, "error");
    kt_error err = {0};
    char *out = kt_chat_render_at(tpl, json_object_get(cv, "messages"),
                                  json_object_get(cv, "tools"),
                                  json_is_true(json_object_get(cv, "add_generation_prompt")),
                                  ctx, FIXED_NOW, &err);
    t->checked++;
    if (want) {
        t->expected++;
        if (out && !strcmp(out, want)) t->matched++;
        else print_message("MISMATCH %s__%s: %s\n", name, cname, out ? "output differs" : err.msg);
    } else if (want_err) {
        t->expected++;
        const char *msg = error_message(want_err);
        if (!out && err.status == KT_ERR_ARG && !strcmp(err.msg, msg)) t->matched++;
        else print_message("MISMATCH %s__%s: want error '%s', got %s\n", name, cname, msg,
                           out ? "output" : err.msg);
    } else {
        t->none++; /* the reference failed for reasons of its own language */
    }
    free(out);
    free(want);
    free(want_err);
}

static void test_reference_templates(void **state) {
    (void)state;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", tu_shared("templates"));
    char path[1400];
    snprintf(path, sizeof path, "%s/cases.json", dir);
    json_error_t jerr;
    json_t *cases = json_load_file(path, 0, &jerr);
    assert_non_null(cases);
    json_t *ctx = json_object_get(cases, "context");
    DIR *d = opendir(dir);
    assert_non_null(d);
    tally t = {0};
    int ntemplates = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 7 || strcmp(e->d_name + l - 6, ".jinja")) continue;
        char name[512];
        snprintf(name, sizeof name, "%.*s", (int)(l - 6), e->d_name);
        int pn = snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        assert_true(pn > 0 && (size_t)pn < sizeof path);
        char *tpl = tu_read_file(path, NULL);
        assert_non_null(tpl);
        ntemplates++;
        const char *cname;
        json_t *cv;
        json_object_foreach(json_object_get(cases, "cases"), cname, cv)
            check_case(dir, name, tpl, cname, cv, ctx, &t);
        free(tpl);
    }
    closedir(d);
    json_decref(cases);
    print_message("templates: %d, cases: %d, expectations matched: %d/%d, "
                  "no expectation: %d\n", ntemplates, t.checked, t.matched,
                  t.expected, t.none);
    assert_true(ntemplates > 0);
    assert_int_equal(t.matched, t.expected);
}

/* kettle's built-in templates render plain conversations exactly as the
 * published ones they stand in for: every case that published template
 * renders (a .txt expectation) must come out the same. */
static void check_builtin(const char *builtin, const char *published) {
    char dir[1024], path[1400];
    snprintf(dir, sizeof dir, "%s", tu_shared("templates"));
    snprintf(path, sizeof path, "%s/cases.json", dir);
    json_error_t jerr;
    json_t *cases = json_load_file(path, 0, &jerr);
    assert_non_null(cases);
    const char *tpl = kt_chat_builtin(builtin);
    assert_non_null(tpl);
    const char *cname;
    json_t *cv;
    int compared = 0;
    json_object_foreach(json_object_get(cases, "cases"), cname, cv) {
        char *want = read_opt(dir, published, cname, "txt");
        if (!want) continue;
        kt_error err = {0};
        char *out = kt_chat_render_at(tpl, json_object_get(cv, "messages"), json_object_get(cv, "tools"),
                                      json_is_true(json_object_get(cv, "add_generation_prompt")),
                                      json_object_get(cases, "context"), FIXED_NOW, &err);
        if (!out || strcmp(out, want)) print_message("builtin %s, case %s: %s\n", builtin, cname, out ? out : err.msg);
        assert_non_null(out);
        assert_string_equal(out, want);
        compared++;
        free(out);
        free(want);
    }
    assert_true(compared >= 2);
    json_decref(cases);
}

static void test_builtin_templates(void **state) {
    (void)state;
    check_builtin("phi3", "microsoft-Phi-3.5-mini-instruct");
    check_builtin("gemma", "google-gemma-2-2b-it");
    /* every built-in at least renders a system + user conversation */
    const char *names[] = {"chatml", "llama2", "llama3", "mistral", "phi3", "gemma"};
    json_t *msgs = json_loads("[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"U\"}]", 0, NULL);
    json_t *ctx = json_loads("{\"bos_token\":\"<s>\",\"eos_token\":\"</s>\"}", 0, NULL);
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        kt_error err = {0};
        char *out = kt_chat_render(kt_chat_builtin(names[i]), msgs, NULL, true, ctx, &err);
        assert_non_null(out);
        assert_non_null(strstr(out, "S"));
        assert_non_null(strstr(out, "U"));
        free(out);
    }
    json_decref(msgs);
    json_decref(ctx);
    assert_null(kt_chat_builtin("nonexistent"));
}

/* ---- 2. constructs, checked against jinja2 ---------------------------- */

typedef struct tcase {
    const char *tpl, *vars, *out, *err;
} tcase;

static const tcase CASES[] = {
    {"{{ 'a' }}\n{% if true %}\n  x\n{% endif %}\n  {{ 'b' }}\n",
     "{}",
     "a\n  x\n  b", NULL},
    {"  {% if true %}\n    yes\n  {% endif %}\nend\n",
     "{}",
     "    yes\nend", NULL},
    {"a\n  {#- c -#}  \nb",
     "{}",
     "ab", NULL},
    {"a {#+ c #}\n b",
     "{}",
     "a  b", NULL},
    {"{% for m in messages %}{{ loop.index }}/{{ loop.length }}:{{ m.role }}{% if not loop.last %},{% endif %}{% endfor %}",
     "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}",
     "1/3:system,2/3:user,3/3:assistant", NULL},
    {"{% for m in messages if m.role != 'system' %}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.revindex }}{{ loop.revindex0 }}{% endfor %}",
     "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}",
     "0TrueFalse211FalseTrue10", NULL},
    {"{% for m in [] %}x{% else %}empty{% endfor %}",
     "{}",
     "empty", NULL},
    {"{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
     "{\"d\": {\"b\": 1, \"a\": 2}}",
     "b=1;a=2;", NULL},
    {"{% for k, v in d|items %}{{ k }}={{ v }};{% endfor %}",
     "{\"d\": {\"b\": 1, \"a\": [1, \"x\"]}}",
     "b=1;a=[1, 'x'];", NULL},
    {"{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}",
     "{}",
     "0134", NULL},
    {"{% set ns = namespace(n=0, s='') %}{% for i in range(3) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}",
     "{}",
     "3", NULL},
    {"{% set x = 1 %}{% for i in range(3) %}{% set x = x + i %}{{ x }}{% endfor %}|{{ x }}",
     "{}",
     "123|1", NULL},
    {"{% macro f(a, b='B', c=none) %}[{{ a }}|{{ b }}|{{ c }}]{% endmacro %}{{ f(1) }}{{ f(1, 2) }}{{ f(1, c=3) }}{{ f(a=5) }}",
     "{}",
     "[1|B|None][1|2|None][1|B|3][5|B|None]", NULL},
    {"{%- macro rec(n) -%}{{ n }}{% if n > 0 %}{{ rec(n - 1) }}{% endif %}{%- endmacro -%}{{ rec(3) }}",
     "{}",
     "3210", NULL},
    {"{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1.5 + 1 }} {{ 'a' ~ 1 ~ none }}",
     "{}",
     "7 3 -4 1 2 3.5 1024 2.5 a1None", NULL},
    {"{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'ab' in 'cabd' }} {{ 1 not in [1, 2] }} {{ 'k' in {'k': 1} }}",
     "{}",
     "True False True False True", NULL},
    {"{{ 'yes' if x else 'no' }} {{ 'yes' if y }}|{{ x and y }} {{ x or y }} {{ not x }}",
     "{\"x\": 1, \"y\": 0}",
     "yes |0 1 False", NULL},
    {"{{ s[1:] }} {{ s[::-1] }} {{ s[-1] }} {{ l[1:3] }} {{ l[-2:] }} {{ l[::2] }} {{ s[1:-1] }} {{ l[-1] }}",
     "{\"s\": \"héllo\", \"l\": [1, 2, 3, 4]}",
     "éllo olléh o [2, 3] [3, 4] [1, 3] éll 4", NULL},
    {"{{ none }} {{ true }} {{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1e-5 }} {{ [1, 'a', none, true] }} {{ {'a': 'b\\'c'} }} {{ (1,) }}",
     "{}",
     "None True 1.0 0.30000000000000004 1e+20 1e-05 [1, 'a', None, True] {'a': \"b'c\"} (1,)", NULL},
    {"{{ x|tojson }} {{ x|tojson(indent=2) }}",
     "{\"x\": {\"a\": [1, 2.5, null, true, \"ü\\\"\\n\"], \"b\": {}, \"c\": []}}",
     "{\"a\": [1, 2.5, null, true, \"ü\\\"\\n\"], \"b\": {}, \"c\": []} {\n  \"a\": [\n    1,\n    2.5,\n    null,\n    true,\n    \"ü\\\"\\n\"\n  ],\n  \"b\": {},\n  \"c\": []\n}", NULL},
    {"{{ '  x  '|trim }}|{{ 'abc'|upper }}|{{ 'ABC'|lower }}|{{ 'hello world'|capitalize }}|{{ 'hello wORLD-x'|title }}",
     "{}",
     "x|ABC|abc|Hello world|Hello World-X", NULL},
    {"{{ [1,2,3]|length }} {{ 'héllo'|length }} {{ {'a':1}|count }} {{ [3,1,2]|sort }} {{ [3,1,2]|sort(reverse=true)|list }} {{ ['b','A','a']|unique|list }}",
     "{}",
     "3 5 1 [1, 2, 3] [3, 2, 1] ['b', 'A']", NULL},
    {"{{ [1,2]|join(', ') }} {{ l|map(attribute='n')|join }} {{ l|selectattr('n', 'equalto', 2)|list }} {{ l|rejectattr('n', 'even')|map(attribute='n')|list }}",
     "{\"l\": [{\"n\": 1}, {\"n\": 2}, {\"n\": 3}]}",
     "1, 2 123 [{'n': 2}] [1, 3]", NULL},
    {"{{ x|default('d') }} {{ y|default('d') }} {{ ''|default('d', true) }} {{ x|d('z') }}",
     "{\"y\": \"set\"}",
     "d set d z", NULL},
    {"{{ [1,2,3]|first }} {{ [1,2,3]|last }} {{ 'abc'|list }} {{ 42|string }} {{ '12'|int + 1 }} {{ '1.5'|float }} {{ -3|abs }} {{ 2.567|round(2) }} {{ 2.5|round }} {{ 3.5|round }}",
     "{}",
     "1 3 ['a', 'b', 'c'] 42 13 1.5 3 2.57 2.0 4.0", NULL},
    {"{{ 'a\nb\n\nc'|indent }}|{{ 'a\nb'|indent(2, first=true) }}|{{ 'a\n\nb'|indent(2, blank=true) }}",
     "{}",
     "a\n    b\n\n    c|  a\n  b|a\n  \n  b", NULL},
    {"{{ 'aXbXc'|replace('X', '-') }} {{ 'a,b,c'.split(',') }} {{ ' a b '.split() }} {{ 'abc'.startswith('a') }} {{ 'abc'.endswith('bc') }} {{ ' x '.strip() }}|{{ 'xxhixx'.strip('x') }} {{ 'ab'.upper() }}",
     "{}",
     "a-b-c ['a', 'b', 'c'] ['a', 'b'] True True x|hi AB", NULL},
    {"{{ d.get('a') }} {{ d.get('z', 'dflt') }} {{ d.keys()|list }} {{ d.values()|list }} {{ d['a'] }} {{ d.a }}",
     "{\"d\": {\"a\": 1, \"b\": 2}}",
     "1 dflt ['a', 'b'] [1, 2] 1 1", NULL},
    {"{{ x is defined }} {{ y is undefined }} {{ none is none }} {{ 'a' is string }} {{ 1 is number }} {{ 1 is integer }} {{ 1.0 is float }} {{ true is boolean }} {{ {} is mapping }} {{ [] is iterable }} {{ 'a' is sequence }} {{ 3 is odd }} {{ 4 is even }} {{ 6 is divisibleby 3 }} {{ 1 is in [1] }} {{ 'a' is equalto 'a' }} {{ x is not none }}",
     "{\"x\": 1}",
     "True True True True True True True True True True True True True True True True True", NULL},
    {"{% set a, b = [1, 2] %}{{ a }}{{ b }}{% set t %}block {{ a }}{% endset %}[{{ t }}]",
     "{}",
     "12[block 1]", NULL},
    {"{{ raise_exception('bad thing') }}",
     "{}",
     NULL, "bad thing"},
    {"{{ strftime_now('%d %b %Y') }}",
     "{}",
     "26 Jul 2024", NULL},
    {"{{ x.y }}",
     "{}",
     NULL, "template line 1: 'x' is undefined"},
    {"{{ x + 1 }}",
     "{}",
     NULL, "template line 1: 'x' is undefined"},
    {"{{ 'a' + 1 }}",
     "{}",
     NULL, "template line 1: can only concatenate str (not \"int\") to str"},
    {"{% if x %}",
     "{}",
     NULL, "template line 1: unexpected end of template: missing '{% endif %}' for the block opened on line 1"},
    {"{{ x|nofilter }}",
     "{}",
     NULL, "template line 1: unknown filter 'nofilter'"},
    {"{% for %}",
     "{}",
     NULL, "template line 1: expected a variable name"},
    {"{{ 'unterminated }}",
     "{}",
     NULL, "template line 1: unterminated string literal"},
    {"{{ {'a': {'b': 1}}}}",
     "{}",
     "{'a': {'b': 1}}", NULL},
    {"{% raw %}{{ not parsed }}{% endraw %}",
     "{}",
     "{{ not parsed }}", NULL},
    {"{{ \"\\u00e9\\x41\\n\\t\\\\\" }}",
     "{}",
     "éA\n\t\\", NULL},
    {"{%- for m in messages -%}\n  {{- m.content -}}\n{%- endfor -%}\n",
     "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}",
     "syshiyo", NULL},
    {"{% for m in messages %}\n    {% if m.role == 'user' %}\n        U:{{ m.content }}\n    {% endif %}\n{% endfor %}\n",
     "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}",
     "        U:hi\n", NULL},
    {"{{ loop }}",
     "{}",
     "", NULL},
    {"{% for x in l %}{{ loop.previtem }}-{{ loop.nextitem }};{% endfor %}",
     "{\"l\": [1, 2, 3]}",
     "-2;1-3;2-;", NULL},
    {"{{ [1,2]|tojson }} {{ 'é'|tojson }} {{ 1.0|tojson }} {{ none|tojson }}",
     "{}",
     "[1, 2] \"é\" 1.0 null", NULL},
    {"{{ '<a>'|e }} {{ '<a>'|safe }} {{ 'x'|safe + '<' }}",
     "{}",
     "&lt;a&gt; <a> x&lt;", NULL},
    {"{{ 10|wordcount if false else 'w' }} {{ 'hello big world'|wordcount }}",
     "{}",
     "w 3", NULL},
    {"{{ [1,5,3]|max }} {{ [1,5,3]|min }} {{ [1,2,3]|sum }} {{ [1,2,3]|reverse|list }} {{ 'abc'|reverse }}",
     "{}",
     "5 1 6 [3, 2, 1] cba", NULL},
    {"{% with a = 1 %}{{ a }}{% endwith %}{% filter upper %}up {{ 'x' }}{% endfilter %}",
     "{}",
     "1UP X", NULL},
    {"{{ dict(a=1, b=2) }} {{ namespace(a=1).a }}",
     "{}",
     "{'a': 1, 'b': 2} 1", NULL},
    {"{{ messages[0]['role'] }} {{ messages[-1].content }} {{ messages|selectattr('role', 'equalto', 'user')|list|length }}",
     "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}",
     "system yo 1", NULL},
    {"{{ 'a' * 3 }} {{ [0] * 2 }} {{ 3 * 'b' }}",
     "{}",
     "aaa [0, 0] bbb", NULL},
    {"{{ '%s'|format(1) }}",
     "{}",
     "1", NULL},
    {"{% for a in 1 %}{% endfor %}",
     "{}",
     NULL, "template line 1: 'int' object is not iterable"},
    {"{{ x|length }} {{ x|list }} {% for i in x %}no{% endfor %} {{ x is iterable }}",
     "{}",
     "0 []  True", NULL},
    {"{% if a is defined and a.b is defined %}y{% else %}n{% endif %}",
     "{\"a\": {}}",
     "n", NULL},
    {"{% if true %}a{% elif false %}b{% else %}c{% endif %}{% if false %}a{% elif true %}b{% else %}c{% endif %}{% if false %}a{% elif false %}b{% else %}c{% endif %}",
     "{}",
     "abc", NULL},
    {"x\n{% if true %}\ny\n{% endif %}\nz\n\n",
     "{}",
     "x\ny\nz\n", NULL},
    {"{{ 'a' }}\n{{ 'b' }}\n",
     "{}",
     "a\nb", NULL},
    {"{% if true -%}\n  a\n{%- endif %}\n",
     "{}",
     "a", NULL},
    {"  {{ 'indent kept' }}\n  {% set x = 1 %}\n  after",
     "{}",
     "  indent kept\n  after", NULL},
    {"{% set x = [1, 2] + [3] %}{{ x }} {{ (1, 2) + (3,) }}",
     "{}",
     "[1, 2, 3] (1, 2, 3)", NULL},
    {"{{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ none == none }}",
     "{}",
     "True True True True True", NULL},
    {"{{ -1|abs }} {{ -(1) }} {{ +1 }} {{ not 1 == 2 }}",
     "{}",
     "1 -1 1 True", NULL},
    {"{{ 1/0 }}",
     "{}",
     NULL, "template line 1: division by zero"},
    {"{{ x.items() }}",
     "{\"x\": {\"a\": 1}}",
     "dict_items([('a', 1)])", NULL},
    {"{{ [1, 2, 3]|map('string')|join('-') }} {{ ['a', 'b']|map('upper')|list }}",
     "{}",
     "1-2-3 ['A', 'B']", NULL},
    {"{{ 'abc'[0] }}{{ 'abc'[5] }}|{{ [1][3] }}|",
     "{}",
     "a||", NULL},
    {"{{ users|map(attribute='name', default='\?')|join(',') }}",
     "{\"users\": [{\"name\": \"a\"}, {}]}",
     "a,\?", NULL},
    {"{% macro m() %}{{ caller_var }}{% endmacro %}{% set caller_var = 'top' %}{{ m() }}",
     "{}",
     "top", NULL},
    {"{% for i in range(2) %}{% for j in range(2) %}{{ loop.index }}{{ i }}{{ j }} {% endfor %}{% endfor %}",
     "{}",
     "100 201 110 211 ", NULL},
    {"{{ range(3)|list }} {{ range(1, 7, 2)|list }} {{ range(5, 0, -2)|list }}",
     "{}",
     "[0, 1, 2] [1, 3, 5] [5, 3, 1]", NULL},
    {"{% set l = [3, 1] %}{{ l|sort|first }}{{ l|unique|list }}",
     "{}",
     "1[3, 1]", NULL},
    {"{{ '{' }}{{ '}}' }}x",
     "{}",
     "{}}x", NULL},
    {"{{- ' lead' }}",
     "{}",
     " lead", NULL},
    {"a   {{- 'x' -}}   b",
     "{}",
     "axb", NULL},
    {"{%+ if true %}  keep{% endif %}\n  {%+ if true %}x{% endif %}",
     "{}",
     "  keep  x", NULL},
    {"{% if true +%}\nnotrim{% endif %}",
     "{}",
     "\nnotrim", NULL},
    {"line\r\nwin\r\n{% if true %}\r\nx{% endif %}",
     "{}",
     "line\nwin\nx", NULL},
    {"{{ 'x' if none is none else 'y' }}{{ 1 if 0 else 2 if 1 else 3 }}",
     "{}",
     "x2", NULL},
    {"{{ 0.1|string }} {{ 100000000000000000.0 }} {{ 123456789012345678 }} {{ 1e16 }} {{ 1.5e-7 }} {{ 12345.678 }}",
     "{}",
     "0.1 1e+17 123456789012345678 1e+16 1.5e-07 12345.678", NULL},
    {"{{ d|tojson }}",
     "{\"d\": {\"f\": 1.2e-05, \"g\": 1e+300, \"i\": -5}}",
     "{\"f\": 1.2e-05, \"g\": 1e+300, \"i\": -5}", NULL},
    {"{{ 'a' is lower }}{{ 'A' is upper }}{{ 2 > 1 is true }}",
     "{}",
     "TrueTrueTrue", NULL},
    {"{{ m.content|tojson }}",
     "{\"m\": {\"content\": \"</script>&'\"}}",
     "\"</script>&'\"", NULL},
    {"{{ '\\n\\n\\nfoo\\n\\n'.split('\\n') }} {{ 'a b  c'.split(' ', 1) }}",
     "{}",
     "['', '', '', 'foo', '', ''] ['a', 'b  c']", NULL},
    {"{{ [1,2,3]|batch(2)|list }}",
     "{}",
     "[[1, 2], [3]]", NULL},
    {"{{ {'b': 2, 'a': 1}|dictsort }}",
     "{}",
     "[('a', 1), ('b', 2)]", NULL},
    {"{% for x in 'ab' %}{{ x }}{% endfor %}{% for x in {'k': 1} %}{{ x }}{% endfor %}",
     "{}",
     "abk", NULL},
    {"{{ undefined_fn() }}",
     "{}",
     NULL, "template line 1: 'undefined_fn' is undefined"},
    {"{{ 'abc'.nope() }}",
     "{}",
     NULL, "template line 1: 'str object' has no attribute 'nope'"},
    {"{% set l = [] %}{% set _ = l.append(1) %}{{ l }}",
     "{}",
     NULL, "template line 1: 'list object' has no attribute 'append'"},
    {"{% endif %}",
     "{}",
     NULL, "template line 1: unexpected 'endif': no open block it could close here"},
    {"{% if x %}{% endfor %}",
     "{}",
     NULL, "template line 1: unexpected 'endfor': no open block it could close here"},
    {"{{ a b }}",
     "{}",
     NULL, "template line 1: expected end of print statement, got 'b'"},
    {"{{ }}",
     "{}",
     NULL, "template line 1: unexpected end of print statement"},
    {"{# unclosed",
     "{}",
     NULL, "template line 1: unclosed comment '{#'"},
    {"{{ (1 }}",
     "{}",
     NULL, "template line 1: unexpected '}', expected ')'"},
    {"{% macro x( %}",
     "{}",
     NULL, "template line 1: unexpected '}', expected ')'"},
    {"{{ x[ }}",
     "{}",
     NULL, "template line 1: unexpected '}', expected ']'"},
    {"{{ 'a' | }}",
     "{}",
     NULL, "template line 1: expected a filter name after '|'"},
    {"{% set %}",
     "{}",
     NULL, "template line 1: expected a variable name"},
    {"{% for x in %}{% endfor %}",
     "{}",
     NULL, "template line 1: unexpected end of statement block"},
    {"{{ 1 is foo }}",
     "{}",
     NULL, "template line 1: unknown test 'foo'"},
    {"{% break %}",
     "{}",
     NULL, "template line 1: 'break' outside loop"},
    {"{{ '%s-%d-%5.2f-%r|%-4s|%03d %%' % ('a', 3, 2.5, 'q', 'x', 7) }}",
     "{}",
     "a-3- 2.50-'q'|x   |007 %", NULL},
    {"{{ '%(a)s=%(b)d'|format(a='k', b=2) }} {{ 'v=%s' % 5 }} {{ '%s'|format(none) }}",
     "{}",
     "k=2 v=5 None", NULL},
    {"{% for i in range(3) %}{% if true %}{% break %}{% endif %}{% endfor %}ok",
     "{}",
     "ok", NULL},
    {"{% macro m() %}{% break %}{% endmacro %}",
     "{}",
     NULL, "template line 1: 'break' outside loop"},
    {"{% for x in [1] %}{% macro m() %}{% continue %}{% endmacro %}{% endfor %}",
     "{}",
     NULL, "template line 1: 'continue' outside loop"},
    {"{% set ns = namespace(items=[]) %}{% for i in range(3) %}{% set ns.items = ns.items + [i] %}{% endfor %}{{ ns.items }}",
     "{}",
     "[0, 1, 2]", NULL},
    {"{% for m in messages %}{% set content = m.content %}{% if loop.first %}{% set content = 'F:' + content %}{% endif %}{{ content }};{% endfor %}",
     "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}",
     "F:sys;hi;yo;", NULL},
    {"{{ 'x'.title() }}{{ 'hello world'.title() }}{{ 'it''s'.title() }}",
     "{}",
     "XHello WorldIts", NULL},
    {"{{ x|tojson(sort_keys=true) }} {{ x|tojson(separators=(',', ':')) }} {{ x|tojson(indent=1, sort_keys=true) }} {{ x|tojson(ensure_ascii=false) }}",
     "{\"x\": {\"b\": [1, {\"z\": 1, \"a\": \"é\"}], \"a\": null}}",
     "{\"a\": null, \"b\": [1, {\"a\": \"é\", \"z\": 1}]} {\"b\":[1,{\"z\":1,\"a\":\"é\"}],\"a\":null} {\n \"a\": null,\n \"b\": [\n  1,\n  {\n   \"a\": \"é\",\n   \"z\": 1\n  }\n ]\n} {\"b\": [1, {\"z\": 1, \"a\": \"é\"}], \"a\": null}", NULL},
    {"{{ 'a' + [1] }}",
     "{}",
     NULL, "template line 1: can only concatenate str (not \"list\") to str"},
    {"{% for m in messages %}{% if m.role == 'user' %}{% set found = true %}{% endif %}{% endfor %}{{ found is defined }}",
     "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}",
     "False", NULL},
    {"{{ (messages|last).content }} {{ messages[1:]|map(attribute='role')|join(',') }} {{ (messages|selectattr('role','equalto','user')|first).content }}",
     "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}",
     "yo user,assistant hi", NULL},
    {"{% set x %}\n  inner\n{% endset %}[{{ x }}]",
     "{}",
     "[  inner\n]", NULL},
    {"{%- set system = messages[0].content if messages[0].role == 'system' else '' -%}[{{ system }}]",
     "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}",
     "[sys]", NULL},
    {"{{ '\\u2028'|tojson }} {{ '\\x7f\\x01'|tojson }}",
     "{}",
     "\" \" \"\\u0001\"", NULL},
    {"{{ 'abc'|replace('', '-') }} {{ 'aaa'|replace('a', 'b', 2) }}",
     "{}",
     "-a-b-c- bba", NULL},
    {"{{ ' \\t\\n x \\u00a0'|trim }}|{{ '\\u3000y\\u3000'.strip() }}|",
     "{}",
     "x|y|", NULL},
    {"{% if messages|length > 0 and messages[0]['role'] == 'system' %}S{% endif %}{{ messages|length }}",
     "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}",
     "S3", NULL},
    {"{{ 5 // 0 }}",
     "{}",
     NULL, "template line 1: integer division or modulo by zero"},
    {"{{ [1, 2] == [1, 2] }} {{ {'a': 1} == {'a': 1} }} {{ (1, 2) == [1, 2] }}",
     "{}",
     "True True False", NULL},
    {"{{ 3 - 1.5 }} {{ 2 * 2.5 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 1e3 }} {{ 2 ** -1 }}",
     "{}",
     "1.5 5.0 3.0 0.5 1000.0 0.5", NULL},
    {"{{ 'x' ~ 1.50 ~ true ~ [1] }}",
     "{}",
     "x1.5True[1]", NULL},
    {"{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}{% for (a, b) in [(1, 2)] %}{{ a }}{{ b }}{% endfor %}",
     "{}",
     "3712", NULL},
    {"{{ x['a']['b'] is defined }} {{ x.a.c is defined }}",
     "{\"x\": {\"a\": {\"b\": 1}}}",
     "True False", NULL},
    {"{{ 3 is gt 2 }}{{ 2 is ge 2 }}{{ 'a' is lt 'b' }}{{ 1 is le 0 }}{{ 3 is greaterthan 5 }}{{ 3 is lessthan 5 }}{{ 7 is divisibleby(7) }}{{ 1 is ne 2 }}{{ none is sameas none }}",
     "{}",
     "TrueTrueTrueFalseFalseTrueTrueTrueTrue", NULL},
    {"{{ 1 is divisibleby 0 }}",
     "{}",
     NULL, "template line 1: integer division or modulo by zero"},
    {"{% for i in range(5) %}{{ loop.cycle('a', 'b', 'c') }}{% endfor %}",
     "{}",
     "abcab", NULL},
    {"{% for i in range(2) %}{{ loop.cycle() }}{% endfor %}",
     "{}",
     NULL, "template line 1: no items for cycling given"},
    {"{{ d.keys() }} {{ d.values() }} {{ d.items()|list }} {{ d.keys()|length }} {{ d.keys()|first }} {{ 'a' in d.keys() }}",
     "{\"d\": {\"a\": 1, \"b\": [2]}}",
     "dict_keys(['a', 'b']) dict_values([1, [2]]) [('a', 1), ('b', [2])] 2 a True", NULL},
    {"{{ d.keys()[0] }}|{{ d.items() is sequence }}",
     "{\"d\": {\"a\": 1}}",
     "|False", NULL},
    {"{{ d.items()|tojson }}",
     "{\"d\": {\"a\": 1}}",
     NULL, "template line 1: tojson: Object of type dict_items is not JSON serializable"},
    {"{{ 7|round }} {{ 7.5|round }} {{ 2.675|round(2) }} {{ 7|round(1, 'floor') }} {{ -2.5|round }}",
     "{}",
     "7 8.0 2.67 7.0 -2.0", NULL},
    {"{{ 3.0 is odd }} {{ 4.0 is even }} {{ 9 is divisibleby 3.0 }} {{ -3 is odd }}",
     "{}",
     "True True True True", NULL},
    {"{{ 5|indent }}",
     "{}",
     NULL, "template line 1: unsupported operand type(s) for +=: 'int' and 'str'"},
    {"{{ '' is lower }} {{ 'abc1' is lower }} {{ 'ABC' is upper }} {{ 1 is lower }}",
     "{}",
     "False True True False", NULL},
    {"{{ 'abc' % 0 }}",
     "{}",
     NULL, "template line 1: not all arguments converted during string formatting"},
    {"{{ 'abc' % {} }}",
     "{}",
     "abc", NULL},
    {"{{ u|int }}",
     "{}",
     NULL, "template line 1: 'u' is undefined"},
};

static char *render(const char *tpl, const char *vars_json, kt_error *err) {
    json_t *vars = json_loads(vars_json, 0, NULL);
    kt_jinja *t = kt_jinja_parse(tpl, err);
    kt_jinja_options opts = {.now = FIXED_NOW};
    char *out = t ? kt_jinja_render(t, vars, &opts, err) : NULL;
    kt_jinja_free(t);
    json_decref(vars);
    return out;
}

static void test_constructs(void **state) {
    (void)state;
    int bad = 0;
    for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) {
        const tcase *tc = &CASES[i];
        kt_error err = {0};
        char *out = render(tc->tpl, tc->vars, &err);
        bool ok = tc->out ? out && !strcmp(out, tc->out)
                          : !out && !strcmp(err.msg, tc->err);
        if (!ok) {
            bad++;
            print_message("case %zu: %s\n  want: %s\n  got:  %s\n", i, tc->tpl,
                          tc->out ? tc->out : tc->err, out ? out : err.msg);
        }
        free(out);
    }
    assert_int_equal(bad, 0);
}

/* ---- targeted checks ------------------------------------------------- */

static void expect_error(const char *tpl, kt_status st, const char *msg) {
    kt_error err = {0};
    char *out = render(tpl, "{}", &err);
    if (out) print_message("unexpectedly rendered: %s\n", tpl);
    assert_null(out);
    if (strcmp(err.msg, msg)) print_message("got: %s\n", err.msg);
    assert_string_equal(err.msg, msg);
    assert_int_equal(err.status, st);
}

static void test_errors(void **state) {
    (void)state;
    expect_error("a\n\n{{ x|foo }}", KT_ERR_FORMAT, "template line 3: unknown filter 'foo'");
    expect_error("{% if true %}\n{% for x in y %}\n", KT_ERR_FORMAT,
                 "template line 2: unexpected end of template: missing "
                 "'{% endfor %}' for the block opened on line 2");
    expect_error("{{ raise_exception('Only user and assistant roles') }}", KT_ERR_ARG,
                 "Only user and assistant roles");
    expect_error("{% include 'x' %}", KT_ERR_FORMAT,
                 "template line 1: unknown or unsupported statement 'include'");
    expect_error("\n{{ 1 +  }}", KT_ERR_FORMAT, "template line 2: unexpected end of print statement");
    /* resource limits: errors, not crashes or hangs */
    expect_error("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", KT_ERR_FORMAT,
                 "template line 1: macro 'f': calls nested too deeply");
    expect_error("{{ range(100000000)|length }}", KT_ERR_UNSUPPORTED,
                 "template line 1: range() too large (over 1000000 items)");
    /* hostile templates (also tests/fuzz/regressions/jinja/): each ran for
     * minutes or grew toward a GiB before its limit existed */
    expect_error("{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}",
                 KT_ERR_FORMAT, "template line 1: template runs more than 1000000 steps (the limit)");
    expect_error("{% for i in range(1000000) %}x{% endfor %}", KT_ERR_FORMAT,
                 "template line 1: template runs more than 1000000 steps (the limit)");
    expect_error("{% for i in range(100) %}{{ 'x' * 1000000 }}{% endfor %}", KT_ERR_FORMAT,
                 "template line 1: template writes more than 8 MiB (the limit)");
    expect_error("{{ 'ab' * 100000000 }}", KT_ERR_FORMAT,
                 "template line 1: repetition result over 16 MiB (the limit)");
    expect_error("{% for i in range(40) %}{% set x = 'x' * 8000000 %}{% endfor %}",
                 KT_ERR_FORMAT, "template: the render needs more than 256 MiB of memory (the limit)");
    expect_error("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(30) %}"
                 "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}",
                 KT_ERR_FORMAT, "template: a string over 16 MiB (the limit)");
    expect_error("{% set s = 'x' * 16000000 %}{% for i in range(100000) %}{{ s|length }}{% endfor %}",
                 KT_ERR_FORMAT, "template line 1: template runs more than 1000000 steps (the limit)");
    {
        /* repetition is one copy now, and still exact */
        kt_error e = {0};
        char *out = render("{{ 'ab' * 3 }}|{{ ([1, 2] * 2)|length }}|{{ 'x' * 0 }}|{{ 'x' * -1 }}", "{}", &e);
        assert_non_null(out);
        assert_string_equal(out, "ababab|4||");
        free(out);
    }
    /* nested blocks in a deeply recursing macro: bounded, not a stack overflow */
    {
        size_t cap = 8192, n = 0;
        char *t = malloc(cap);
        assert_non_null(t);
        n += (size_t)sprintf(t + n, "{%% macro f(n) %%}");
        for (int i = 0; i < 150; i++) n += (size_t)sprintf(t + n, "{%% if true %%}");
        n += (size_t)sprintf(t + n, "{%% if n > 0 %%}{{ f(n - 1) }}{%% endif %%}");
        for (int i = 0; i < 150; i++) n += (size_t)sprintf(t + n, "{%% endif %%}");
        sprintf(t + n, "{%% endmacro %%}{{ f(99) }}");
        expect_error(t, KT_ERR_FORMAT, "template line 1: template nested too deeply when run");
        free(t);
    }
    char deep[3000];
    memset(deep, '(', sizeof deep);
    memcpy(deep, "{{ ", 3);
    deep[sizeof deep - 1] = 0;
    kt_error err = {0};
    assert_null(render(deep, "{}", &err));
    assert_non_null(strstr(err.msg, "nested too deeply"));
}

static void test_chat_api(void **state) {
    (void)state;
    const char *tpl =
        "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
        "{% if tools is defined %}[{{ tools|length }} tools]{% endif %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}|{{ strftime_now('%Y-%m-%d') }}";
    json_t *msgs = json_loads("[{\"role\":\"user\",\"content\":\"hé\"}]", 0, NULL);
    json_t *tools = json_loads("[{\"type\":\"function\"}]", 0, NULL);
    json_t *ctx = json_loads("{\"bos_token\":\"<s>\"}", 0, NULL);
    kt_error err = {0};
    char *out = kt_chat_render_at(tpl, msgs, NULL, true, ctx, FIXED_NOW, &err);
    assert_non_null(out);
    assert_string_equal(out, "<s><user>hé<assistant>|2024-07-26");
    free(out);
    out = kt_chat_render_at(tpl, msgs, tools, false, NULL, FIXED_NOW, &err);
    assert_non_null(out);
    assert_string_equal(out, "<user>hé[1 tools]|2024-07-26");
    free(out);
    assert_null(kt_chat_render(tpl, ctx, NULL, false, NULL, &err)); /* not a list */
    assert_int_equal(err.status, KT_ERR_ARG);
    json_decref(msgs);
    json_decref(tools);
    json_decref(ctx);

    /* one parsed template renders many times */
    kt_jinja *t = kt_jinja_parse("{{ x }}", &err);
    assert_non_null(t);
    for (int i = 0; i < 3; i++) {
        json_t *v = json_pack("{si}", "x", i);
        char *o = kt_jinja_render(t, v, NULL, &err);
        char want[16];
        int wn = snprintf(want, sizeof want, "%d", i);
        assert_true(wn > 0);
        assert_string_equal(o, want);
        free(o);
        json_decref(v);
    }
    kt_jinja_free(t);
}

/* ---- 3. robustness --------------------------------------------------- */

static void try_render(const char *text, json_t *vars) {
    kt_error err = {0};
    kt_jinja *t = kt_jinja_parse(text, &err);
    if (!t) {
        assert_true(err.msg[0] != 0);
        return;
    }
    kt_jinja_options opts = {.now = FIXED_NOW};
    char *out = kt_jinja_render(t, vars, &opts, &err);
    if (!out) assert_true(err.msg[0] != 0);
    free(out);
    kt_jinja_free(t);
}

static void test_no_crash_on_damage(void **state) {
    (void)state;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", tu_shared("templates"));
    char path[1400];
    snprintf(path, sizeof path, "%s/cases.json", dir);
    json_t *cases = json_load_file(path, 0, NULL);
    if (!cases) fail_msg("cannot read %s", path);
    json_t *c = json_object_get(json_object_get(cases, "cases"), "tool_round_trip");
    json_t *vars = json_object();
    json_object_update(vars, json_object_get(cases, "context"));
    json_object_set(vars, "messages", json_object_get(c, "messages"));
    json_object_set(vars, "tools", json_object_get(c, "tools"));
    json_object_set_new(vars, "add_generation_prompt", json_true());
    DIR *d = opendir(dir);
    assert_non_null(d);
    static const char subst[] = "{}%#-+()[]'\"|.,=~ \nx0";
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 7 || strcmp(e->d_name + l - 6, ".jinja")) continue;
        int pn = snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        assert_true(pn > 0 && (size_t)pn < sizeof path);
        size_t n;
        char *tpl = tu_read_file(path, &n);
        assert_non_null(tpl);
        char *buf = malloc(n + 1);
        assert_non_null(buf);
        for (size_t k = 0; k <= n; k++) { /* every prefix */
            memcpy(buf, tpl, k);
            buf[k] = 0;
            try_render(buf, vars);
        }
        for (size_t k = 0; k < n; k += 7) { /* one-byte mutations */
            memcpy(buf, tpl, n + 1);
            buf[k] = subst[(k / 7) % (sizeof subst - 1)];
            try_render(buf, vars);
        }
        free(buf);
        free(tpl);
    }
    closedir(d);
    json_decref(vars);
    json_decref(cases);
}

/* Tool-call arguments given as a JSON string (the OpenAI wire format) are
 * parsed into the object templates index; anything else is left alone. */
static void test_tool_arguments_parsed(void **state) {
    (void)state;
    json_t *m = json_loads("[{\"role\": \"assistant\", \"tool_calls\": ["
                           "{\"function\": {\"name\": \"f\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}},"
                           "{\"function\": {\"name\": \"g\", \"arguments\": \"not json\"}},"
                           "{\"function\": {\"name\": \"h\", \"arguments\": {\"x\": 1}}}]}]", 0, NULL);
    assert_non_null(m);
    assert_true(kt_chat_parse_tool_arguments(m));
    json_t *calls = json_object_get(json_array_get(m, 0), "tool_calls");
    json_t *a0 = json_object_get(json_object_get(json_array_get(calls, 0), "function"), "arguments");
    json_t *a1 = json_object_get(json_object_get(json_array_get(calls, 1), "function"), "arguments");
    json_t *a2 = json_object_get(json_object_get(json_array_get(calls, 2), "function"), "arguments");
    assert_string_equal(json_string_value(json_object_get(a0, "city")), "Paris");
    assert_string_equal(json_string_value(a1), "not json");
    assert_int_equal(json_integer_value(json_object_get(a2, "x")), 1);
    json_decref(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_templates),
        cmocka_unit_test(test_constructs),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_chat_api),
        cmocka_unit_test(test_no_crash_on_damage),
        cmocka_unit_test(test_tool_arguments_parsed),
        cmocka_unit_test(test_builtin_templates),
    };
    return tu_result(cmocka_run_group_tests(tests, NULL, NULL));
}
