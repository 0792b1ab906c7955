/*
 * jinja_lex.c - the Jinja lexer: template text to tokens.
 *
 * It mirrors jinja2's lexer as transformers configures it, because the
 * whitespace a chat template emits is decided here: newlines normalized to
 * "\n" and one trailing newline dropped; `{%- ... -%}` strip whitespace;
 * trim_blocks drops the newline after a block or comment tag; lstrip_blocks
 * drops the indentation before one; tag ends only count when brackets are
 * balanced; string literals decode Python escapes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_int.h"

typedef struct lexer {
    ja_arena *a;
    const char *s;
    size_t n, pos;
    int line;
    jtok *toks;
    size_t ntok, cap;
    kt_error *err;
    bool line_starting;
    char stack[64]; /* expected closing brackets */
    int depth;
} lexer;

static bool lfail(lexer *L, const char *fmt, const char *arg) {
    char msg[200];
    snprintf(msg, sizeof msg, fmt, arg);
    kt_error_set(L->err, KT_ERR_FORMAT, "template line %d: %s", L->line, msg);
    return false;
}

static jtok *emit(lexer *L, jt_kind k, const char *s, size_t n) {
    if (L->ntok == L->cap) {
        size_t nc = L->cap ? L->cap * 2 : 256;
        jtok *p = ja_alloc(L->a, nc * sizeof *p);
        if (!p) {
            kt_error_set(L->err, KT_ERR_NOMEM, "template: out of memory");
            return NULL;
        }
        if (L->ntok) memcpy(p, L->toks, L->ntok * sizeof *p);
        L->toks = p;
        L->cap = nc;
    }
    jtok *t = &L->toks[L->ntok++];
    memset(t, 0, sizeof *t);
    t->kind = k;
    t->line = L->line;
    t->s = s;
    t->n = n;
    return t;
}

static void count_lines(lexer *L, size_t from, size_t to) {
    for (size_t i = from; i < to; i++)
        if (L->s[i] == '\n') L->line++;
}

/* Length of leading whitespace (Python \s) at p. */
static size_t skip_ws(const char *p, size_t n) {
    size_t i = 0, l;
    while (i < n && (l = ju_space(p + i, n - i)) > 0) i += l;
    return i;
}

/* ---- string literals ------------------------------------------------- */

static size_t put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Decodes one escape after the backslash at p[0]; returns bytes consumed
 * (0 for an unknown escape, kept literally as Python does). */
static size_t decode_escape(const char *p, size_t n, char *o, size_t *olen) {
    static const char from[] = "nrtabfv\\'\"\n", to[] = "\n\r\t\a\b\f\v\\'\"";
    const char *k = n ? strchr(from, p[0]) : NULL;
    if (k && p[0]) {
        if (p[0] == '\n') { *olen = 0; return 1; } /* line continuation */
        o[0] = to[k - from];
        *olen = 1;
        return 1;
    }
    int digits = n && p[0] == 'x' ? 2 : n && p[0] == 'u' ? 4 : n && p[0] == 'U' ? 8 : 0;
    if (digits) {
        uint32_t cp = 0;
        for (int i = 1; i <= digits; i++) {
            if ((size_t)i >= n || hexval(p[i]) < 0) return 0;
            cp = cp * 16 + (uint32_t)hexval(p[i]);
        }
        if (cp > 0x10FFFF) return 0;
        *olen = put_utf8(o, cp);
        return (size_t)digits + 1;
    }
    if (n && p[0] >= '0' && p[0] <= '7') {
        uint32_t cp = 0;
        size_t i = 0;
        while (i < 3 && i < n && p[i] >= '0' && p[i] <= '7') cp = cp * 8 + (uint32_t)(p[i++] - '0');
        *olen = put_utf8(o, cp);
        return i;
    }
    return 0;
}

static bool lex_string(lexer *L) {
    char q = L->s[L->pos];
    size_t i = L->pos + 1;
    while (i < L->n && L->s[i] != q) i += L->s[i] == '\\' ? 2 : 1;
    if (i >= L->n) return lfail(L, "unterminated string literal%s", "");
    const char *src = L->s + L->pos + 1;
    size_t len = i - L->pos - 1;
    char *out = ja_alloc(L->a, len + 1);
    if (!out) return kt_error_set(L->err, KT_ERR_NOMEM, "template: out of memory"), false;
    size_t o = 0;
    for (size_t k = 0; k < len;) {
        if (src[k] != '\\' || k + 1 >= len) { out[o++] = src[k++]; continue; }
        size_t olen = 0, used = decode_escape(src + k + 1, len - k - 1, out + o, &olen);
        if (!used) { out[o++] = src[k++]; continue; }
        o += olen;
        k += used + 1;
    }
    jtok *t = emit(L, JT_STRING, out, o);
    if (!t) return false;
    count_lines(L, L->pos, i + 1);
    L->pos = i + 1;
    return true;
}

/* ---- numbers, names, operators -------------------------------------- */

static size_t digits_(const char *p, size_t n) {
    size_t i = 0;
    while (i < n && (p[i] >= '0' && p[i] <= '9')) {
        i++;
        if (i + 1 < n && p[i] == '_' && p[i + 1] >= '0' && p[i + 1] <= '9') i++;
    }
    return i;
}

static bool lex_number(lexer *L) {
    const char *p = L->s + L->pos;
    size_t n = L->n - L->pos, i = digits_(p, n);
    bool is_float = false;
    if (i + 1 < n && p[i] == '.' && p[i + 1] >= '0' && p[i + 1] <= '9') {
        i += 1 + digits_(p + i + 1, n - i - 1);
        is_float = true;
    }
    if (i < n && (p[i] == 'e' || p[i] == 'E')) {
        size_t j = i + 1;
        if (j < n && (p[j] == '+' || p[j] == '-')) j++;
        size_t d = digits_(p + j, n - j);
        if (d) { i = j + d; is_float = true; }
    }
    char buf[64];
    size_t k = 0;
    for (size_t j = 0; j < i && k < sizeof buf - 1; j++)
        if (p[j] != '_') buf[k++] = p[j];
    buf[k] = 0;
    jtok *t = emit(L, is_float ? JT_FLOAT : JT_INT, p, i);
    if (!t) return false;
    if (is_float) t->f = strtod(buf, NULL);
    else {
        char *end;
        t->i = strtoll(buf, &end, 10);
        if (i > 18 && strlen(buf) > 18) return lfail(L, "integer literal %s is too large", buf);
    }
    L->pos += i;
    return true;
}

static bool is_name_start(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static bool lex_op(lexer *L) {
    static const char *ops[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-",
                                "/", "*", "%", "~", "[", "]", "(", ")", "{",
                                "}", ">", "<", "=", ".", ":", "|", ",", ";"};
    const char *p = L->s + L->pos;
    for (size_t k = 0; k < sizeof ops / sizeof *ops; k++) {
        size_t l = strlen(ops[k]);
        if (L->n - L->pos < l || memcmp(p, ops[k], l)) continue;
        char c = p[0];
        if (l == 1 && (c == '(' || c == '[' || c == '{')) {
            if (L->depth >= (int)sizeof L->stack) return lfail(L, "brackets nested too deeply%s", "");
            L->stack[L->depth++] = c == '(' ? ')' : c == '[' ? ']' : '}';
        } else if (l == 1 && (c == ')' || c == ']' || c == '}')) {
            if (!L->depth || L->stack[L->depth - 1] != c) {
                char m[24];
                if (L->depth) snprintf(m, sizeof m, "%c', expected '%c", c, L->stack[L->depth - 1]);
                else snprintf(m, sizeof m, "%c", c);
                return lfail(L, "unexpected '%s'", m);
            }
            L->depth--;
        }
        if (!emit(L, JT_OP, ops[k], l)) return false;
        L->pos += l;
        return true;
    }
    char m[2] = {p[0], 0};
    return lfail(L, "unexpected character '%s'", m);
}

/* Matches a tag end at pos (only with balanced brackets); returns its
 * length (including stripped whitespace / trimmed newline) or 0. */
static size_t match_end(lexer *L, char close) {
    if (L->depth) return 0;
    const char *p = L->s + L->pos;
    size_t n = L->n - L->pos;
    if (n >= 3 && p[0] == '-' && p[1] == close && p[2] == '}')
        return 3 + skip_ws(p + 3, n - 3);
    if (close == '%' && n >= 3 && p[0] == '+' && p[1] == '%' && p[2] == '}')
        return 3;
    if (n >= 2 && p[0] == close && p[1] == '}')
        return close == '%' && n >= 3 && p[2] == '\n' ? 3 : 2;
    return 0;
}

/* Tokens inside {{ }} or {% %} up to and including the end. */
static bool lex_tag(lexer *L, char close) {
    L->depth = 0;
    for (;;) {
        size_t ws = skip_ws(L->s + L->pos, L->n - L->pos);
        count_lines(L, L->pos, L->pos + ws);
        L->pos += ws;
        if (L->pos >= L->n)
            return lfail(L, close == '%' ? "unclosed block tag '{%%'%s"
                                        : "unclosed expression '{{'%s", "");
        size_t e = match_end(L, close);
        if (e) {
            if (!emit(L, close == '%' ? JT_BLOCK_END : JT_VAR_END, NULL, 0)) return false;
            L->line_starting = L->s[L->pos + e - 1] == '\n';
            count_lines(L, L->pos, L->pos + e);
            L->pos += e;
            return true;
        }
        char c = L->s[L->pos];
        bool ok;
        if (c == '\'' || c == '"') ok = lex_string(L);
        else if (c >= '0' && c <= '9') ok = lex_number(L);
        else if (is_name_start(c)) {
            size_t i = L->pos;
            while (i < L->n && (is_name_start(L->s[i]) || (L->s[i] >= '0' && L->s[i] <= '9'))) i++;
            ok = emit(L, JT_NAME, L->s + L->pos, i - L->pos) != NULL;
            L->pos = i;
        } else ok = lex_op(L);
        if (!ok) return false;
    }
}

/* ---- root state ----------------------------------------------------- */

static bool lex_comment(lexer *L) {
    for (size_t i = L->pos; i + 1 < L->n; i++) {
        if (L->s[i] != '#' || L->s[i + 1] != '}') continue;
        size_t end = i + 2;
        if (i > L->pos && L->s[i - 1] == '-') end += skip_ws(L->s + end, L->n - end);
        else if (!(i > L->pos && L->s[i - 1] == '+') && end < L->n && L->s[end] == '\n') end++;
        L->line_starting = L->s[end - 1] == '\n';
        count_lines(L, L->pos, end);
        L->pos = end;
        return true;
    }
    return lfail(L, "unclosed comment '{#'%s", "");
}

/* `{% raw %}` at pos? Returns the length of the opening tag or 0. */
static size_t match_raw(const lexer *L, size_t pos) {
    const char *p = L->s + pos + 2;
    size_t n = L->n - pos - 2, i = 0;
    if (i < n && (p[i] == '-' || p[i] == '+')) i++;
    i += skip_ws(p + i, n - i);
    if (n - i < 3 || memcmp(p + i, "raw", 3)) return 0;
    i += 3;
    i += skip_ws(p + i, n - i);
    if (i < n && p[i] == '-') {
        if (n - i >= 3 && !memcmp(p + i, "-%}", 3)) return 2 + i + 3 + skip_ws(p + i + 3, n - i - 3);
        return 0;
    }
    if (n - i >= 2 && !memcmp(p + i, "%}", 2)) return 2 + i + 2;
    return 0;
}

static bool lex_raw(lexer *L, size_t open) {
    L->pos += open;
    for (size_t i = L->pos; i + 1 < L->n; i++) {
        if (L->s[i] != '{' || L->s[i + 1] != '%') continue;
        size_t j = i + 2;
        bool minus = j < L->n && L->s[j] == '-';
        if (minus || (j < L->n && L->s[j] == '+')) j++;
        j += skip_ws(L->s + j, L->n - j);
        if (L->n - j < 6 || memcmp(L->s + j, "endraw", 6)) continue;
        size_t text_end = i;
        if (minus) while (text_end > L->pos && ju_space_back(L->s + L->pos, text_end - L->pos))
            text_end -= ju_space_back(L->s + L->pos, text_end - L->pos);
        if (text_end > L->pos && !emit(L, JT_DATA, L->s + L->pos, text_end - L->pos)) return false;
        count_lines(L, L->pos, j);
        L->pos = j + 6;
        L->pos += skip_ws(L->s + L->pos, L->n - L->pos);
        L->depth = 0;
        size_t e = match_end(L, '%');
        if (!e) return lfail(L, "malformed endraw tag%s", "");
        L->line_starting = L->s[L->pos + e - 1] == '\n';
        count_lines(L, L->pos, L->pos + e);
        L->pos += e;
        return true;
    }
    return lfail(L, "missing endraw for raw block%s", "");
}

/* Text before a tag, with `-` and lstrip_blocks applied. */
static bool emit_text(lexer *L, size_t from, size_t to, char sign, bool var) {
    const char *t = L->s + from;
    size_t n = to - from;
    if (sign == '-') {
        size_t l;
        while (n && (l = ju_space_back(t, n)) > 0) n -= l;
    } else if (sign != '+' && !var) {
        size_t lpos = n;
        while (lpos > 0 && t[lpos - 1] != '\n') lpos--;
        if (lpos > 0 || L->line_starting) {
            size_t ws = skip_ws(t + lpos, n - lpos);
            if (lpos + ws == n) n = lpos;
        }
    }
    if (n && !emit(L, JT_DATA, t, n)) return false;
    count_lines(L, from, to);
    return true;
}

static bool lex_root(lexer *L) {
    while (L->pos < L->n) {
        size_t i = L->pos;
        const char *p = NULL;
        for (; i + 1 < L->n; i++)
            if (L->s[i] == '{' && (L->s[i + 1] == '{' || L->s[i + 1] == '%' ||
                                   L->s[i + 1] == '#')) {
                p = L->s + i;
                break;
            }
        if (!p) return emit_text(L, L->pos, L->n, 0, true);
        char kind = p[1];
        char sign = i + 2 < L->n && (p[2] == '-' || p[2] == '+') ? p[2] : 0;
        size_t raw = kind == '%' ? match_raw(L, i) : 0;
        if (!emit_text(L, L->pos, i, sign, kind == '{')) return false;
        L->line_starting = false;
        L->pos = i + 2 + (sign ? 1 : 0);
        bool ok;
        if (raw) { L->pos = i; ok = lex_raw(L, raw); }
        else if (kind == '#') ok = lex_comment(L);
        else {
            ok = emit(L, kind == '%' ? JT_BLOCK_BEGIN : JT_VAR_BEGIN, NULL, 0) != NULL;
            ok = ok && lex_tag(L, kind == '%' ? '%' : '}');
        }
        if (!ok) return false;
    }
    return true;
}

/* Newlines to "\n" and one trailing newline dropped, like jinja2. */
static char *normalize(ja_arena *a, const char *src, size_t *n) {
    size_t len = strlen(src);
    char *o = ja_alloc(a, len + 1);
    if (!o) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            o[k++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else o[k++] = src[i];
    }
    if (k && o[k - 1] == '\n') k--;
    o[k] = 0;
    *n = k;
    return o;
}

bool jlex(ja_arena *a, const char *src, jtok **toks, size_t *ntok,
          kt_error *err) {
    lexer L = {.a = a, .line = 1, .err = err, .line_starting = true};
    L.s = normalize(a, src, &L.n);
    if (!L.s) return kt_error_set(err, KT_ERR_NOMEM, "template: out of memory"), false;
    if (!lex_root(&L)) return false;
    if (!emit(&L, JT_EOF, NULL, 0)) return false;
    *toks = L.toks;
    *ntok = L.ntok;
    return true;
}
