/*
 * json_schema_regex.c - a JSON Schema `pattern` (an ECMAScript regular
 * expression) as a GBNF expression over the *encoded* content of a JSON
 * string (see json_schema.h, kt_json_regex_gbnf).
 *
 * Why a translator and not a regex engine: the grammar matcher must know,
 * byte by byte, which continuations can still match, so the pattern has to
 * become grammar. Only a regular subset translates exactly; everything
 * else is refused by name, never approximated:
 *   - literals (any code point), escapes \d \D \w \W \s \S, \t \n \r \f \v
 *     \0, \xHH, \uHHHH, \u{H..}, escaped punctuation (\. \/ \- ...), `.`
 *     (any code point but \n \r U+2028 U+2029, as in ECMAScript);
 *   - classes [...] and [^...] with ranges and the escapes above;
 *   - groups ( ), (?: ), (?<name> ), alternation |;
 *   - quantifiers * + ? {n} {n,} {n,m}, and their lazy forms (*? ...:
 *     the same language);
 *   - anchors ^ and $ only at the two ends of a top-level alternative.
 *     JSON Schema patterns are unanchored searches, so an end without its
 *     anchor matches any string there: it becomes `char*`.
 * Refused: backreferences (\1, \k<..>), lookaround, \b \B, \p{..}, \c,
 * possessive quantifiers, anchors elsewhere, flags.
 *
 * A matched character is written the way a JSON string writes it: raw
 * when it may be, else escaped (\" \\ \n ... or \u00XX); `/` also as \/.
 * Other \uXXXX spellings of ordinary characters are not accepted: a
 * smaller language, never a larger one.
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "grammar/gbnf_text.h"

#define MAX_CP 0x10FFFFu
#define MAX_NEST 64u /* ( ) nesting in a pattern: below the GBNF parser's group depth */

/* ---- growing text: grammar/gbnf_text.h ---------------------------------- */

/* ---- sets of code points: sorted, disjoint, non-adjacent ranges -------- */

typedef struct crange {
    uint32_t lo, hi;
} crange;

typedef struct cset {
    crange *r;
    size_t n, cap;
    bool oom;
} cset;

static void cs_add(cset *s, uint32_t lo, uint32_t hi) {
    if (s->oom || lo > hi) return;
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        crange *r = realloc(s->r, cap * sizeof *r);
        if (!r) {
            s->oom = true;
            return;
        }
        s->r = r;
        s->cap = cap;
    }
    s->r[s->n++] = (crange){lo, hi};
}

static int cr_cmp(const void *a, const void *b) {
    const crange *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Sorts and merges overlapping or touching ranges. */
static void cs_norm(cset *s) {
    if (s->n < 2) return;
    qsort(s->r, s->n, sizeof *s->r, cr_cmp);
    size_t k = 0;
    for (size_t i = 1; i < s->n; i++) {
        if (s->r[i].lo <= s->r[k].hi + 1) {
            if (s->r[i].hi > s->r[k].hi) s->r[k].hi = s->r[i].hi;
        } else {
            s->r[++k] = s->r[i];
        }
    }
    s->n = k + 1;
}

/* Complement within the code points, surrogates excluded (they are not
 * characters and have no UTF-8 form). */
static void cs_negate(cset *s) {
    cs_norm(s);
    cset o = {0};
    uint32_t next = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (s->r[i].lo > next) cs_add(&o, next, s->r[i].lo - 1);
        next = s->r[i].hi + 1;
    }
    if (next <= MAX_CP) cs_add(&o, next, MAX_CP);
    bool oom = s->oom || o.oom;
    free(s->r);
    *s = o;
    s->oom = oom;
}

static bool cs_has(const cset *s, uint32_t c) {
    for (size_t i = 0; i < s->n; i++)
        if (c >= s->r[i].lo && c <= s->r[i].hi) return true;
    return false;
}

static void cs_add_digit(cset *s) { cs_add(s, '0', '9'); }

static void cs_add_word(cset *s) {
    cs_add(s, '0', '9');
    cs_add(s, 'A', 'Z');
    cs_add(s, '_', '_');
    cs_add(s, 'a', 'z');
}

/* ECMAScript's WhiteSpace and LineTerminator. */
static void cs_add_space(cset *s) {
    static const uint32_t r[][2] = {{0x09, 0x0D}, {0x20, 0x20}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A},
                                    {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000},
                                    {0xFEFF, 0xFEFF}};
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++) cs_add(s, r[i][0], r[i][1]);
}

/* ---- writing a set as GBNF over encoded JSON string content ------------ */

static void put_class_cp(sbuf *b, uint32_t c) {
    if (c < 0x80)
        sb_printf(b, "\\x%02X", c);
    else if (c < 0x10000)
        sb_printf(b, "\\u%04X", c);
    else
        sb_printf(b, "\\U%08X", c);
}

/* The JSON escape of control character c as GBNF alternatives. */
static void put_control(sbuf *b, uint32_t c) {
    static const char shortf[] = {['\b'] = 'b', ['\f'] = 'f', ['\n'] = 'n', ['\r'] = 'r', ['\t'] = 't'};
    if (c < sizeof shortf && shortf[c]) sb_printf(b, "\"\\\\%c\" | ", shortf[c]);
    const char *hex = "0123456789ABCDEF";
    char hi = hex[c >> 4], lo = hex[c & 15];
    if (lo >= 'A')
        sb_printf(b, "\"\\\\u00%c\" [%c%c]", hi, lo, lo + 32);
    else
        sb_printf(b, "\"\\\\u00%c%c\"", hi, lo);
}

/* Writes a parenthesised GBNF expression matching one encoded character
 * of `s`, or returns false when `s` is empty. */
static bool put_set(sbuf *b, cset *s) {
    cs_norm(s);
    bool any = false;
    if (s->n == 1 && s->r[0].lo == s->r[0].hi && s->r[0].lo >= 0x20 && s->r[0].lo < 0x7F && s->r[0].lo != '"' &&
        s->r[0].lo != '\\' && s->r[0].lo != '/') { /* a plain ASCII character: a literal */
        sb_printf(b, "\"%c\"", (char)s->r[0].lo);
        return true;
    }
    sb_puts(b, "(");
    /* raw: every member from U+0020 up, except " and \ (and surrogates) */
    sbuf cls = {0};
    for (size_t i = 0; i < s->n; i++) {
        uint32_t lo = s->r[i].lo < 0x20 ? 0x20 : s->r[i].lo, hi = s->r[i].hi;
        for (uint32_t a = lo; a <= hi && !cls.oom;) {
            uint32_t e = hi;
            if (a <= '"' && e >= '"') e = a == '"' ? a : '"' - 1;
            else if (a <= '\\' && e >= '\\') e = a == '\\' ? a : '\\' - 1;
            else if (a <= 0xDFFF && e >= 0xD800) e = a >= 0xD800 ? 0xDFFF : 0xD7FF;
            bool skip = a == '"' || a == '\\' || (a >= 0xD800 && a <= 0xDFFF);
            if (!skip) {
                put_class_cp(&cls, a);
                if (e > a) {
                    sb_puts(&cls, "-");
                    put_class_cp(&cls, e);
                }
            }
            if (e == MAX_CP) break;
            a = e + 1;
        }
    }
    if (cls.n) {
        sb_printf(b, "[%s]", cls.p);
        any = true;
    }
    if (cls.oom) b->oom = true;
    free(cls.p);
    static const struct { uint32_t c; const char *g; } esc[] = {
        {'"', "\"\\\\\\\"\""}, {'\\', "\"\\\\\\\\\""}, {'/', "\"\\\\/\""}};
    for (size_t i = 0; i < 3; i++) {
        if (!cs_has(s, esc[i].c)) continue;
        sb_printf(b, "%s%s", any ? " | " : "", esc[i].g);
        any = true;
    }
    for (uint32_t c = 0; c < 0x20; c++) {
        if (!cs_has(s, c)) continue;
        sb_puts(b, any ? " | " : "");
        put_control(b, c);
        any = true;
    }
    sb_puts(b, ")");
    return any;
}

/* ---- the parser -------------------------------------------------------- */

typedef struct rx {
    const unsigned char *s; /* the pattern */
    size_t i, n;
    sbuf out;
    kt_error *err;
    bool failed;
    unsigned nest;
} rx;

static bool rx_fail(rx *r, kt_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool rx_fail(rx *r, kt_status st, const char *fmt, ...) {
    if (r->failed) return false;
    r->failed = true;
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kt_error_set(r->err, st, "pattern '%.120s': %s", (const char *)r->s, msg);
    return false;
}

static bool rx_eof(const rx *r) { return r->i >= r->n; }
static int rx_peek(const rx *r) { return rx_eof(r) ? -1 : r->s[r->i]; }

/* Decodes one UTF-8 code point of the pattern (the pattern came from a
 * JSON string, so it is valid UTF-8). */
static uint32_t rx_utf8(rx *r) {
    unsigned c = r->s[r->i++];
    int extra = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
    uint32_t cp = extra == 3 ? c & 7 : extra == 2 ? c & 15 : extra == 1 ? c & 31 : c;
    for (int k = 0; k < extra && !rx_eof(r); k++) cp = (cp << 6) | (r->s[r->i++] & 63);
    return cp;
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Reads exactly `k` hex digits; -1 when they are not there. */
static long rx_hex(rx *r, int k) {
    long v = 0;
    for (int j = 0; j < k; j++) {
        int h = hexval(rx_peek(r));
        if (h < 0) return -1;
        v = v * 16 + h;
        r->i++;
    }
    return v;
}

/* After a backslash: adds what the escape denotes to `s`. `in_class`
 * makes \b a backspace instead of a (refused) word boundary. */
static bool rx_escape(rx *r, cset *s, bool in_class) {
    if (rx_eof(r)) return rx_fail(r, KT_ERR_ARG, "ends with a lone backslash");
    int c = r->s[r->i++];
    switch (c) {
    case 'd': cs_add_digit(s); return true;
    case 'w': cs_add_word(s); return true;
    case 's': cs_add_space(s); return true;
    case 'D': case 'W': case 'S': {
        cset t = {0};
        if (c == 'D') cs_add_digit(&t);
        else if (c == 'W') cs_add_word(&t);
        else cs_add_space(&t);
        cs_negate(&t);
        for (size_t i = 0; i < t.n; i++) cs_add(s, t.r[i].lo, t.r[i].hi);
        if (t.oom) s->oom = true;
        free(t.r);
        return true;
    }
    case 't': cs_add(s, 9, 9); return true;
    case 'n': cs_add(s, 10, 10); return true;
    case 'v': cs_add(s, 11, 11); return true;
    case 'f': cs_add(s, 12, 12); return true;
    case 'r': cs_add(s, 13, 13); return true;
    case 'x': {
        long v = rx_hex(r, 2);
        if (v < 0) return rx_fail(r, KT_ERR_ARG, "\\x needs two hex digits");
        cs_add(s, (uint32_t)v, (uint32_t)v);
        return true;
    }
    case 'u': {
        long v;
        if (rx_peek(r) == '{') {
            r->i++;
            v = 0;
            int k = 0;
            for (; hexval(rx_peek(r)) >= 0 && k < 7; k++) v = v * 16 + hexval(r->s[r->i++]);
            if (!k || rx_peek(r) != '}' || v > (long)MAX_CP)
                return rx_fail(r, KT_ERR_ARG, "bad \\u{...} escape");
            r->i++;
        } else if ((v = rx_hex(r, 4)) < 0) {
            return rx_fail(r, KT_ERR_ARG, "\\u needs four hex digits");
        }
        cs_add(s, (uint32_t)v, (uint32_t)v);
        return true;
    }
    case '0':
        if (hexval(rx_peek(r)) >= 0 && rx_peek(r) <= '9')
            return rx_fail(r, KT_ERR_UNSUPPORTED, "octal escapes are not supported");
        cs_add(s, 0, 0);
        return true;
    case 'b':
        if (in_class) {
            cs_add(s, 8, 8);
            return true;
        }
        return rx_fail(r, KT_ERR_UNSUPPORTED, "word boundary \\b is not supported");
    case 'B': return rx_fail(r, KT_ERR_UNSUPPORTED, "\\B is not supported");
    case 'k': return rx_fail(r, KT_ERR_UNSUPPORTED, "backreference \\k is not supported");
    case 'p': case 'P': return rx_fail(r, KT_ERR_UNSUPPORTED, "unicode property escape \\%c is not supported", c);
    case 'c': return rx_fail(r, KT_ERR_UNSUPPORTED, "control escape \\c is not supported");
    default:
        if (c >= '1' && c <= '9') return rx_fail(r, KT_ERR_UNSUPPORTED, "backreference \\%c is not supported", c);
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
            return rx_fail(r, KT_ERR_UNSUPPORTED, "escape \\%c is not supported", c);
        r->i--; /* escaped punctuation or a non-ASCII code point: itself */
        uint32_t cp = rx_utf8(r);
        cs_add(s, cp, cp);
        return true;
    }
}

/* One member of a class: a character (or escape) for ranges; a shorthand
 * class (\d ...) cannot bound a range, reported by returning false in
 * *single. */
static bool rx_class_atom(rx *r, cset *s, uint32_t *cp, bool *single) {
    *single = true;
    if (rx_peek(r) != '\\') {
        *cp = rx_utf8(r);
        return true;
    }
    r->i++;
    cset t = {0};
    bool ok = rx_escape(r, &t, true);
    cs_norm(&t);
    if (ok && t.n == 1 && t.r[0].lo == t.r[0].hi) {
        *cp = t.r[0].lo;
    } else {
        *single = false;
        for (size_t i = 0; i < t.n; i++) cs_add(s, t.r[i].lo, t.r[i].hi);
    }
    if (t.oom) s->oom = true;
    free(t.r);
    return ok;
}

/* After '[': reads the class up to its ']' into `s`. */
static bool rx_class(rx *r, cset *s) {
    bool neg = rx_peek(r) == '^';
    if (neg) r->i++;
    /* ECMAScript: ']' right after '[' closes the class ([] is empty) */
    while (!rx_eof(r) && rx_peek(r) != ']') {
        if (rx_peek(r) == '[' && r->i + 1 < r->n && strchr(":=.", r->s[r->i + 1]))
            return rx_fail(r, KT_ERR_UNSUPPORTED, "POSIX classes are not supported");
        uint32_t a, b;
        bool single;
        if (!rx_class_atom(r, s, &a, &single)) return false;
        if (!single) continue;
        if (rx_peek(r) == '-' && r->i + 1 < r->n && r->s[r->i + 1] != ']') {
            r->i++;
            bool single2;
            if (!rx_class_atom(r, s, &b, &single2)) return false;
            if (!single2) return rx_fail(r, KT_ERR_ARG, "a class shorthand cannot end a range");
            if (b < a) return rx_fail(r, KT_ERR_ARG, "range out of order in a class");
            cs_add(s, a, b);
        } else {
            cs_add(s, a, a);
        }
    }
    if (rx_eof(r)) return rx_fail(r, KT_ERR_ARG, "unterminated character class");
    r->i++; /* ']' */
    if (neg) cs_negate(s);
    return true;
}

static bool rx_alt(rx *r, bool top);

/* Writes a set atom (the set is consumed). An empty set matches nothing:
 * refused, since a grammar cannot spell "no character" portably. */
static bool rx_put_set(rx *r, cset *s) {
    bool ok = !s->oom && put_set(&r->out, s);
    bool oom = s->oom;
    free(s->r);
    *s = (cset){0};
    if (oom) return rx_fail(r, KT_ERR_NOMEM, "out of memory");
    if (!ok) return rx_fail(r, KT_ERR_UNSUPPORTED, "a class that matches nothing is not supported");
    return true;
}

static bool rx_atom(rx *r) {
    int c = rx_peek(r);
    cset s = {0};
    if (c == '(') {
        r->i++;
        if (rx_peek(r) == '?') {
            r->i++;
            int k = rx_peek(r);
            if (k == ':') {
                r->i++;
            } else if (k == '<' && r->i + 1 < r->n && r->s[r->i + 1] != '=' && r->s[r->i + 1] != '!') {
                while (!rx_eof(r) && rx_peek(r) != '>') r->i++;
                if (rx_eof(r)) return rx_fail(r, KT_ERR_ARG, "unterminated group name");
                r->i++;
            } else if (k == '=' || k == '!' || k == '<') {
                return rx_fail(r, KT_ERR_UNSUPPORTED, "lookaround assertions are not supported");
            } else {
                return rx_fail(r, KT_ERR_UNSUPPORTED, "group modifiers (?%c are not supported", k < 0 ? ' ' : k);
            }
        }
        if (++r->nest > MAX_NEST) return rx_fail(r, KT_ERR_UNSUPPORTED, "groups nest deeper than %u", MAX_NEST);
        sb_puts(&r->out, "(");
        if (!rx_alt(r, false)) return false;
        if (rx_peek(r) != ')') return rx_fail(r, KT_ERR_ARG, "unbalanced parenthesis");
        r->i++;
        r->nest--;
        sb_puts(&r->out, ")");
        return true;
    }
    if (c == '[') {
        r->i++;
        if (rx_class(r, &s)) return rx_put_set(r, &s);
        free(s.r); /* a class that fails after some ranges (found by fuzzing: a leak) */
        return false;
    }
    if (c == '.') {
        r->i++;
        cs_add(&s, '\n', '\n');
        cs_add(&s, '\r', '\r');
        cs_add(&s, 0x2028, 0x2029);
        cs_negate(&s);
        return rx_put_set(r, &s);
    }
    if (c == '\\') {
        r->i++;
        return rx_escape(r, &s, false) && rx_put_set(r, &s);
    }
    if (c == '*' || c == '+' || c == '?') return rx_fail(r, KT_ERR_ARG, "quantifier '%c' with nothing to repeat", c);
    uint32_t cp = rx_utf8(r);
    cs_add(&s, cp, cp);
    return rx_put_set(r, &s);
}

/* Parses "{n}", "{n,}", "{n,m}" at the cursor; false (cursor unchanged)
 * when the text there is not a quantifier (ECMAScript then reads '{' as
 * a literal). */
static bool rx_braces(rx *r, long *lo, long *hi) {
    size_t save = r->i;
    r->i++;
    long a = -1, b;
    while (rx_peek(r) >= '0' && rx_peek(r) <= '9') a = (a < 0 ? 0 : a) * 10 + (r->s[r->i++] - '0'), a = a > 1000000 ? 1000000 : a;
    if (a < 0) goto no;
    b = a;
    if (rx_peek(r) == ',') {
        r->i++;
        b = -1;
        while (rx_peek(r) >= '0' && rx_peek(r) <= '9') b = (b < 0 ? 0 : b) * 10 + (r->s[r->i++] - '0'), b = b > 1000000 ? 1000000 : b;
    }
    if (rx_peek(r) != '}') goto no;
    r->i++;
    *lo = a;
    *hi = b;
    return true;
no:
    r->i = save;
    return false;
}

/* A quantifier after an atom, if there is one. */
static bool rx_quant(rx *r) {
    int c = rx_peek(r);
    long lo, hi;
    if (c == '*' || c == '+' || c == '?') {
        r->i++;
        sb_printf(&r->out, "%c", c);
    } else if (c == '{' && rx_braces(r, &lo, &hi)) {
        if (lo > (long)KT_GRAMMAR_MAX_REPEAT || hi > (long)KT_GRAMMAR_MAX_REPEAT)
            return rx_fail(r, KT_ERR_UNSUPPORTED, "repetition count over %u", KT_GRAMMAR_MAX_REPEAT);
        if (hi >= 0 && hi < lo) return rx_fail(r, KT_ERR_ARG, "repetition {%ld,%ld} out of order", lo, hi);
        if (hi < 0) sb_printf(&r->out, "{%ld,}", lo);
        else sb_printf(&r->out, "{%ld,%ld}", lo, hi);
    } else {
        return true;
    }
    if (rx_peek(r) == '?') r->i++; /* lazy: same language */
    else if (rx_peek(r) == '+') return rx_fail(r, KT_ERR_UNSUPPORTED, "possessive quantifiers are not supported");
    c = rx_peek(r);
    if (c == '*' || c == '+' || c == '?' || (c == '{' && rx_braces(r, &lo, &hi)))
        return rx_fail(r, KT_ERR_ARG, "nothing to repeat before '%c'", c);
    return true;
}

/* One alternative; `top` allows the ^ and $ anchors at its ends. */
static bool rx_seq(rx *r, bool top) {
    bool start = true, anchored_start = false, anchored_end = false;
    size_t mark = r->out.n;
    if (top && rx_peek(r) == '^') {
        r->i++;
        anchored_start = true;
    }
    while (!rx_eof(r) && rx_peek(r) != '|' && rx_peek(r) != ')') {
        int c = rx_peek(r);
        if (c == '^') return rx_fail(r, KT_ERR_UNSUPPORTED, "'^' is supported only at the start");
        if (c == '$') {
            r->i++;
            if (!top || (!rx_eof(r) && rx_peek(r) != '|'))
                return rx_fail(r, KT_ERR_UNSUPPORTED, "'$' is supported only at the end");
            anchored_end = true;
            break;
        }
        sb_puts(&r->out, start ? "" : " ");
        start = false;
        if (!rx_atom(r) || !rx_quant(r)) return false;
    }
    if (start) sb_puts(&r->out, "\"\"");
    if (top && !anchored_start) {
        /* insert "char* " before the alternative: rebuild the tail */
        size_t len = r->out.n - mark;
        char *tail = malloc(len + 1);
        if (!tail) return rx_fail(r, KT_ERR_NOMEM, "out of memory");
        memcpy(tail, r->out.p + mark, len);
        tail[len] = 0;
        r->out.n = mark;
        sb_puts(&r->out, "char* ");
        sb_puts(&r->out, tail);
        free(tail);
    }
    if (top && !anchored_end) sb_puts(&r->out, " char*");
    return true;
}

static bool rx_alt(rx *r, bool top) {
    if (!rx_seq(r, top)) return false;
    while (rx_peek(r) == '|') {
        r->i++;
        sb_puts(&r->out, " | ");
        if (!rx_seq(r, top)) return false;
    }
    return true;
}

char *kt_json_regex_gbnf(const char *pattern, kt_error *err) {
    rx r = {.s = (const unsigned char *)pattern, .n = strlen(pattern), .err = err};
    sb_puts(&r.out, "(");
    bool ok = rx_alt(&r, true);
    if (ok && !rx_eof(&r)) ok = rx_fail(&r, KT_ERR_ARG, "unbalanced parenthesis");
    sb_puts(&r.out, ")");
    if (ok && r.out.oom) ok = rx_fail(&r, KT_ERR_NOMEM, "out of memory");
    if (!ok) {
        free(r.out.p);
        return NULL;
    }
    return r.out.p;
}
