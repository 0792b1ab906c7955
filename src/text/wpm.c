/*
 * wpm.c - WordPiece (tokenizer.ggml.model = "bert"), as llama.cpp's
 * llm_tokenizer_wpm does it.
 *
 * GGUF stores BERT vocabularies converted: a word-initial piece carries a
 * "▁" prefix and a continuation piece has lost its "##". So a word is
 * matched as "▁" + word, greedily, longest token first from each position;
 * if some position matches no token, the word's tokens are dropped and it
 * becomes one unknown token.
 *
 * Words come from llama.cpp's preprocessing: every code point is replaced
 * by the first code point of its NFD (so accents go), White_Space ends a
 * word, NUL, U+FFFD and control/format characters are dropped, the rest
 * is lowercased; punctuation, ASCII symbols and CJK ideographs are words
 * of their own. The Unicode tables are generated (unicode_data.c).
 */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "text/unicode_data.h"
#include "text/utf8.h"
#include "text/vocab_impl.h"

static const char WPM_SPACE[] = "\xE2\x96\x81"; /* U+2581 "▁" */

/* ---- Unicode lookups ------------------------------------------------- */

static kt_uni_class uni_class(uint32_t cp) {
    size_t lo = 0, hi = kt_uni_n_classes; /* last range with start <= cp */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (kt_uni_classes[mid].start <= cp) lo = mid;
        else hi = mid;
    }
    return (kt_uni_class)kt_uni_classes[lo].cls;
}

static uint32_t uni_nfd_first(uint32_t cp) {
    size_t lo = 0, hi = kt_uni_n_nfd;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (kt_uni_nfd[mid].last < cp) lo = mid + 1;
        else hi = mid;
    }
    return lo < kt_uni_n_nfd && kt_uni_nfd[lo].first <= cp ? kt_uni_nfd[lo].nfd : cp;
}

static uint32_t uni_lower(uint32_t cp) {
    size_t lo = 0, hi = kt_uni_n_lower;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (kt_uni_lower[mid].from < cp) lo = mid + 1;
        else hi = mid;
    }
    return lo < kt_uni_n_lower && kt_uni_lower[lo].from == cp ? kt_uni_lower[lo].to : cp;
}

/* llama.cpp's (and HF's) CJK ranges, 0x2B920 included as they have it. */
static bool is_chinese(uint32_t cp) {
    return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
           (cp >= 0x20000 && cp <= 0x2A6DF) || (cp >= 0x2A700 && cp <= 0x2B73F) ||
           (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
           (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

/* ---- UTF-8 ------------------------------------------------------------ */

/* The code point at s (valid UTF-8, k = its length). */
static uint32_t decode_cp(const uint8_t *s, int k) {
    if (k == 1) return s[0];
    uint32_t cp = s[0] & (0x7F >> k);
    for (int i = 1; i < k; i++) cp = cp << 6 | (s[i] & 0x3F);
    return cp;
}

static int encode_cp(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12);
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18);
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* ---- words ------------------------------------------------------------- */

/* The current word, after the "▁" it is matched with. */
typedef struct wpm_word {
    char *p;
    size_t len, cap; /* len includes the 3-byte prefix */
} wpm_word;

static bool word_put(wpm_word *w, const char *s, size_t n) {
    if (w->len + n > w->cap) {
        size_t cap = 2 * (w->len + n) + 64;
        char *p = realloc(w->p, cap);
        if (!p) return false;
        w->p = p;
        w->cap = cap;
    }
    memcpy(w->p + w->len, s, n);
    w->len += n;
    return true;
}

/* Greedy longest-first matching of w->p[0..len); the word's ids, or one
 * unknown token if some position matches nothing. */
static kt_status match_word(const kt_vocab *v, const wpm_word *w, kt_ids_out *o,
                            kt_error *err) {
    size_t start = o->n, n = w->len;
    for (size_t i = 0; i < n;) {
        size_t j = n - i > (size_t)v->max_len ? i + v->max_len : n;
        int32_t id = -1;
        for (; j > i && (id = kt_vocab_find(v, w->p + i, j - i)) < 0; j--) {}
        if (id < 0) {
            o->n = start; /* drop the word's tokens */
            break;
        }
        kt_ids_emit(o, id);
        i = j;
    }
    if (o->n > start) return KT_OK;
    if (v->unk < 0)
        return kt_error_set(err, KT_ERR_UNSUPPORTED,
                            "cannot encode '%.*s': no token matches and no unknown token",
                            (int)(n - 3 > 64 ? 64 : n - 3), w->p + 3);
    kt_ids_emit(o, v->unk);
    return KT_OK;
}

/* Ends the current word (if any) and starts an empty one. */
static kt_status flush_word(const kt_vocab *v, wpm_word *w, kt_ids_out *o, kt_error *err) {
    kt_status st = w->len > 3 ? match_word(v, w, o, err) : KT_OK;
    w->len = 3;
    return st;
}

/* One code point of the text into the word stream. */
static kt_status add_cp(const kt_vocab *v, wpm_word *w, uint32_t cp, kt_ids_out *o,
                        kt_error *err) {
    cp = uni_nfd_first(cp);
    kt_uni_class c = uni_class(cp);
    if (c == KT_UNI_SPACE) return flush_word(v, w, o, err);
    if (cp == 0 || cp == 0xFFFD || c == KT_UNI_CONTROL) return KT_OK;
    char s[4];
    int k = encode_cp(uni_lower(cp), s);
    bool alone = c == KT_UNI_PUNCT || (cp < 0x7F && c == KT_UNI_SYMBOL) || is_chinese(cp);
    kt_status st = alone ? flush_word(v, w, o, err) : KT_OK;
    if (st == KT_OK && !word_put(w, s, (size_t)k))
        st = kt_error_set(err, KT_ERR_NOMEM, "tokenizer: out of memory");
    if (st == KT_OK && alone) st = flush_word(v, w, o, err);
    return st;
}

static kt_status encode_raw(const kt_vocab *v, wpm_word *w, const char *text, size_t len,
                            kt_ids_out *o, kt_error *err) {
    const uint8_t *s = (const uint8_t *)text;
    kt_status st = KT_OK;
    for (size_t i = 0; i < len && st == KT_OK;) {
        int k = kt_utf8_len(s[i]); /* the text is valid UTF-8 */
        if ((size_t)k > len - i) k = (int)(len - i);
        st = add_cp(v, w, decode_cp(s + i, k), o, err);
        i += (size_t)k;
    }
    return st == KT_OK ? flush_word(v, w, o, err) : st;
}

/* ---- entry point (see encode.c) ---------------------------------------- */

kt_status kt_wpm_encode_frags(const kt_vocab *v, const char *text, const kt_frag *fr,
                              size_t n_frag, kt_ids_out *o, kt_error *err) {
    wpm_word w = { 0 };
    if (!word_put(&w, WPM_SPACE, 3))
        return kt_error_set(err, KT_ERR_NOMEM, "tokenizer: out of memory");
    kt_status st = KT_OK;
    for (size_t k = 0; k < n_frag && st == KT_OK; k++) {
        if (fr[k].id >= 0) kt_ids_emit(o, fr[k].id);
        else st = encode_raw(v, &w, text + fr[k].off, fr[k].len, o, err);
    }
    free(w.p);
    return st;
}
