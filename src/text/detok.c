/*
 * detok.c - incremental detokenization (see detok.h).
 *
 * Each push decodes one token's piece (kt_vocab_decode_piece), appends it
 * to the bytes held back from earlier pushes, and emits everything up to
 * the last point where UTF-8 is complete. Bytes that can never become a
 * valid sequence are replaced by U+FFFD, one per maximal subpart (the
 * Unicode recommendation, what most decoders do), so the output is always
 * valid UTF-8 whatever ids arrive.
 *
 * Invariant: `held` holds fewer than 4 bytes, and they are a valid but
 * incomplete prefix of one UTF-8 sequence.
 */
#include "text/detok.h"

#include <stdlib.h>
#include <string.h>

#include "text/utf8.h"

static const char REPLACEMENT[] = "\xEF\xBF\xBD"; /* U+FFFD */

struct kt_text_detok {
    const kt_vocab *v;
    bool strip_leading_space;
    bool show_control;      /* control tokens give their vocabulary text */
    bool started;           /* a piece with bytes has been seen */
    uint8_t held[4];
    int n_held;
    char *in;               /* held bytes + the new piece */
    size_t in_cap;
    char *out;              /* what the last call returned */
    size_t out_cap;
};

kt_text_detok *kt_text_detok_new(const kt_vocab *v, bool strip_leading_space) {
    if (!v) return NULL;
    kt_text_detok *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    d->v = v;
    d->strip_leading_space = strip_leading_space;
    d->in_cap = 64;
    d->out_cap = 3 * d->in_cap + 1;
    d->in = malloc(d->in_cap);
    d->out = malloc(d->out_cap);
    if (!d->in || !d->out) {
        kt_text_detok_free(d);
        return NULL;
    }
    d->out[0] = 0;
    return d;
}

void kt_text_detok_free(kt_text_detok *d) {
    if (!d) return;
    free(d->in);
    free(d->out);
    free(d);
}

/* Input room for n bytes, output room for their worst case (each byte a
 * U+FFFD) plus the NUL. */
static bool reserve(kt_text_detok *d, size_t n) {
    if (n > d->in_cap) {
        char *p = realloc(d->in, n);
        if (!p) return false;
        d->in = p;
        d->in_cap = n;
    }
    if (3 * n + 1 > d->out_cap) {
        char *p = realloc(d->out, 3 * n + 1);
        if (!p) return false;
        d->out = p;
        d->out_cap = 3 * n + 1;
    }
    return true;
}

/* Converts d->in[0..n) into d->out, keeping an incomplete tail in `held`
 * unless `final`, in which case it too becomes U+FFFD. */
static const char *drain(kt_text_detok *d, size_t n, bool final) {
    const uint8_t *s = (const uint8_t *)d->in;
    size_t i = 0, o = 0;
    d->n_held = 0;
    while (i < n) {
        int k = s[i] < 0x80 ? 1 : kt_utf8_seq(s + i, n - i);
        if (k > 0) {
            memcpy(d->out + o, s + i, (size_t)k);
            o += (size_t)k;
            i += (size_t)k;
        } else if (k == 0 && !final) {
            d->n_held = (int)(n - i); /* < 4: a prefix of one sequence */
            memcpy(d->held, s + i, n - i);
            break;
        } else {
            memcpy(d->out + o, REPLACEMENT, 3);
            o += 3;
            i += k < 0 ? (size_t)-k : n - i; /* k == 0 here: the whole tail */
        }
    }
    d->out[o] = 0;
    return d->out;
}

void kt_text_detok_show_control(kt_text_detok *d, bool on) {
    if (d) d->show_control = on;
}

/* A control token's vocabulary text (`<|python_tag|>`), or 0 bytes. */
static int control_text(const kt_text_detok *d, int32_t id, char *buf) {
    if (!d->show_control || kt_vocab_type(d->v, id) != KT_TOKEN_CONTROL) return 0;
    size_t n = 0;
    const char *p = kt_vocab_piece(d->v, id, &n);
    if (!p || n > 256) return 0;
    if (buf) memcpy(buf, p, n);
    return (int)n;
}

const char *kt_text_detok_push(kt_text_detok *d, int32_t id) {
    if (!d) return "";
    int need = kt_vocab_decode_piece(d->v, id, NULL, 0);
    if (need == 0 && (need = control_text(d, id, NULL)) > 0) {
        size_t n = (size_t)d->n_held + (size_t)need;
        if (!reserve(d, n)) return "";
        memcpy(d->in, d->held, (size_t)d->n_held);
        control_text(d, id, d->in + d->n_held);
        return drain(d, n, false);
    }
    size_t n = (size_t)d->n_held + (size_t)need;
    if (!reserve(d, n)) return ""; /* out of memory: drop the piece */
    memcpy(d->in, d->held, (size_t)d->n_held);
    char *piece = d->in + d->n_held;
    kt_vocab_decode_piece(d->v, id, piece, need);
    if (need > 0 && !d->started) {
        d->started = true;
        if (d->strip_leading_space && piece[0] == ' ') {
            memmove(piece, piece + 1, (size_t)need - 1);
            n--;
        }
    }
    return drain(d, n, false);
}

const char *kt_text_detok_flush(kt_text_detok *d) {
    if (!d) return "";
    memcpy(d->in, d->held, (size_t)d->n_held); /* in_cap >= 64 > 3 */
    return drain(d, (size_t)d->n_held, true);
}
