/*
 * gbnf_text.c - the growing text buffer the JSON-Schema converter and its
 * regex translator write GBNF into (see gbnf_text.h).
 */
#include "grammar/gbnf_text.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


void sb_putn(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void sb_puts(sbuf *b, const char *s) { sb_putn(b, s, strlen(s)); }

void sb_printf(sbuf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof tmp) {
        sb_putn(b, tmp, (size_t)n);
    } else if (n > 0) { /* long text (a rule body): format it in place */
        char *big = malloc((size_t)n + 1);
        if (!big) b->oom = true;
        else vsnprintf(big, (size_t)n + 1, fmt, ap2), sb_putn(b, big, (size_t)n), free(big);
    }
    va_end(ap2);
}


static bool word_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* Copies a quoted literal or a character class starting at s[0] (its
 * opening byte), escapes included; returns the length. */
static size_t quoted_len(const char *s, char close) {
    size_t i = 1;
    while (s[i] && s[i] != close) i += s[i] == '\\' && s[i + 1] ? 2 : 1;
    return s[i] ? i + 1 : i;
}

void sb_gbnf_prefixed(sbuf *b, const char *gbnf, const char *prefix) {
    const char *s = gbnf;
    while (*s) {
        size_t n;
        if (*s == '"' || *s == '[') {
            n = quoted_len(s, *s == '"' ? '"' : ']');
        } else if (*s == '{') { /* a repetition count: digits, not names */
            n = strcspn(s, "}");
            n += s[n] == '}';
        } else if (*s == '#') {
            n = strcspn(s, "\n");
        } else if (word_char(*s)) {
            for (n = 0; word_char(s[n]); n++) continue;
            sb_puts(b, prefix);
        } else {
            n = 1;
        }
        sb_putn(b, s, n);
        s += n;
    }
}
