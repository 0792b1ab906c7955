/*
 * utf8.c - strict UTF-8 scanning; see utf8.h.
 */
#include "text/utf8.h"

/* Bytes a lead byte announces (0: cannot lead), and the allowed range of
 * the second byte, which is where overlongs, surrogates and values past
 * U+10FFFF are ruled out (RFC 3629 table). */
static int lead_info(uint8_t b, uint8_t *lo, uint8_t *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (b < 0x80) return 1;
    if (b < 0xC2) return 0;
    if (b < 0xE0) return 2;
    if (b < 0xF0) {
        if (b == 0xE0) *lo = 0xA0;
        if (b == 0xED) *hi = 0x9F;
        return 3;
    }
    if (b < 0xF5) {
        if (b == 0xF0) *lo = 0x90;
        if (b == 0xF4) *hi = 0x8F;
        return 4;
    }
    return 0;
}

int kt_utf8_seq(const uint8_t *s, size_t n) {
    uint8_t lo, hi;
    int need = lead_info(s[0], &lo, &hi);
    if (need == 0) return -1;
    for (int i = 1; i < need; i++) {
        if ((size_t)i >= n) return 0;
        if (s[i] < lo || s[i] > hi) return -i;
        lo = 0x80;
        hi = 0xBF;
    }
    return need;
}

bool kt_utf8_valid(const char *s, size_t n, size_t *bad_off) {
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0;
    while (i < n) {
        if (u[i] < 0x80) { i++; continue; }
        int k = kt_utf8_seq(u + i, n - i);
        if (k <= 0) {
            if (bad_off) *bad_off = i;
            return false;
        }
        i += (size_t)k;
    }
    return true;
}
