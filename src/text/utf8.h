/*
 * utf8.h - strict UTF-8 scanning shared by the tokenizer (input and piece
 * validation) and the incremental detokenizer.
 *
 * "Valid" is RFC 3629: no overlong forms, no surrogates (U+D800..DFFF),
 * nothing above U+10FFFF. Invalid input is measured in "maximal subparts"
 * (Unicode's recommended practice for U+FFFD substitution): the longest
 * prefix of a well-formed sequence, or one byte if there is none.
 */
#ifndef KT_TEXT_UTF8_H
#define KT_TEXT_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Looks at the sequence starting at s[0] (n >= 1 bytes available):
 *   > 0: a complete valid sequence of that many bytes;
 *     0: a valid but incomplete prefix that runs to the end of s[0..n);
 *   < 0: invalid; -k is the length of its maximal subpart (k >= 1). */
int kt_utf8_seq(const uint8_t *s, size_t n);

/* True when s[0..n) is entirely valid UTF-8; otherwise *bad_off (if not
 * NULL) gets the offset of the first byte that is not. */
bool kt_utf8_valid(const char *s, size_t n, size_t *bad_off);

/* Bytes of the sequence led by `lead`, assuming valid UTF-8 (1 for
 * anything that cannot lead). */
static inline int kt_utf8_len(uint8_t lead) {
    if (lead < 0x80) return 1;
    if ((lead & 0xE0) == 0xC0) return 2;
    if ((lead & 0xF0) == 0xE0) return 3;
    if ((lead & 0xF8) == 0xF0) return 4;
    return 1;
}

#endif
