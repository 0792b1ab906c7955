/*
 * gbnf_text.h - growing text for writing GBNF (json_schema.c and
 * json_schema_regex.c). Out of memory is sticky: the first failed growth
 * sets `oom`, later writes do nothing, and the writer checks it once at
 * the end.
 */
#ifndef KT_GRAMMAR_GBNF_TEXT_H
#define KT_GRAMMAR_GBNF_TEXT_H

#include <stdbool.h>
#include <stddef.h>

typedef struct sbuf {
    char *p; /* NUL-terminated once anything was written */
    size_t n, cap;
    bool oom;
} sbuf;

void sb_putn(sbuf *b, const char *s, size_t n);
void sb_puts(sbuf *b, const char *s);
void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Appends GBNF text with every rule name (definitions and references)
 * prefixed, so that several grammars' rules can live in one grammar
 * (tool calls: one JSON Schema per function). Literals, character
 * classes, repetition counts and comments are copied as they are. */
void sb_gbnf_prefixed(sbuf *b, const char *gbnf, const char *prefix);

#endif
