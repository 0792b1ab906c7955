/*
 * encode.c - kt_vocab_encode / kt_vocab_encode_ex: argument checks, the
 * split of the text around tokens matched whole (special tokens), and the
 * dispatch of the raw text between them to the vocabulary's encoder
 * (spm.c, bpe.c or wpm.c). One mechanism for every tokenizer model, as llama.cpp's
 * tokenizer_st_partition.
 *
 * The split follows llama.cpp: the special tokens are taken longest first;
 * each one splits every raw fragment left by the longer ones at its
 * occurrences (leftmost first, not overlapping). User-defined tokens are
 * always matched; control and unknown tokens only when the caller asks
 * (parse_specials), so user text cannot inject them by default.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "text/utf8.h"
#include "text/vocab_impl.h"

typedef struct frag_list {
    kt_frag *f;
    size_t n, cap;
} frag_list;

static bool frag_add(frag_list *l, size_t off, size_t len, int32_t id) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        kt_frag *f = realloc(l->f, cap * sizeof *f);
        if (!f) return false;
        l->f = f;
        l->cap = cap;
    }
    l->f[l->n++] = (kt_frag){ off, len, id };
    return true;
}

/* Splits one raw fragment at the occurrences of tok[0..tl) into out. */
static bool split_frag(const char *text, kt_frag f, const char *tok, size_t tl, int32_t id,
                       frag_list *out) {
    size_t pos = f.off, end = f.off + f.len;
    const char *hit;
    while (end - pos >= tl && (hit = memmem(text + pos, end - pos, tok, tl)) != NULL) {
        size_t at = (size_t)(hit - text);
        if (at > pos && !frag_add(out, pos, at - pos, -1)) return false;
        if (!frag_add(out, at, tl, id)) return false;
        pos = at + tl;
    }
    return pos >= end || frag_add(out, pos, end - pos, -1);
}

/* Splits every raw fragment of `in` at the occurrences of token id. */
static bool split_on(const kt_vocab *v, const char *text, const frag_list *in, int32_t id,
                     frag_list *out) {
    const char *tok = v->arena + v->off[id];
    size_t tl = v->len[id];
    out->n = 0;
    for (size_t k = 0; k < in->n; k++) {
        kt_frag f = in->f[k];
        bool ok = f.id >= 0 || f.len < tl ? frag_add(out, f.off, f.len, f.id)
                                          : split_frag(text, f, tok, tl, id, out);
        if (!ok) return false;
    }
    return true;
}

static bool matched_whole(const kt_vocab *v, int32_t id, bool parse_specials) {
    return parse_specials || v->type[id] == KT_TOKEN_USER_DEFINED;
}

/* The fragments of text after splitting out the special tokens. */
static bool partition(const kt_vocab *v, const char *text, size_t len, bool parse_specials,
                      frag_list *res) {
    frag_list a = { 0 }, b = { 0 };
    if (len > 0 && !frag_add(&a, 0, len, -1)) return false;
    for (int u = 0; u < v->n_special; u++) {
        if (!matched_whole(v, v->special[u], parse_specials)) continue;
        if (!split_on(v, text, &a, v->special[u], &b)) {
            free(a.f);
            free(b.f);
            return false;
        }
        frag_list t = a; a = b; b = t;
    }
    free(b.f);
    *res = a;
    return true;
}

static kt_status check_args(const kt_vocab *v, const char *text, size_t len, bool add_bos,
                            const int32_t *ids, int cap, kt_error *err) {
    size_t bad;
    if (!v || (!text && len > 0) || cap < 0 || (!ids && cap > 0))
        return kt_error_set(err, KT_ERR_ARG, "kt_vocab_encode: invalid arguments");
    if (len > (size_t)INT_MAX / 4)
        return kt_error_set(err, KT_ERR_ARG, "kt_vocab_encode: text too long (%zu bytes)", len);
    if (add_bos && v->bos < 0)
        return kt_error_set(err, KT_ERR_ARG, "kt_vocab_encode: the vocabulary has no BOS token");
    if (len > 0 && !kt_utf8_valid(text, len, &bad))
        return kt_error_set(err, KT_ERR_ARG, "text is not valid UTF-8 (at byte offset %zu)", bad);
    return KT_OK;
}

int kt_vocab_encode_ex(const kt_vocab *v, const char *text, size_t len, bool add_bos,
                       bool parse_specials, int32_t *ids, int cap, kt_error *err) {
    if (check_args(v, text, len, add_bos, ids, cap, err) != KT_OK) return -1;
    kt_ids_out o = { ids, cap, 0 };
    if (add_bos) kt_ids_emit(&o, v->bos);
    frag_list fr = { 0 };
    if (!partition(v, text, len, parse_specials, &fr)) {
        kt_error_set(err, KT_ERR_NOMEM, "tokenizer: out of memory");
        return -1;
    }
    kt_status st;
    switch (v->kind) {
    case KT_VOCAB_BPE:
    case KT_VOCAB_GEMMA4: st = kt_bpe_encode_frags(v, text, fr.f, fr.n, &o, err); break;
    case KT_VOCAB_WPM: st = kt_wpm_encode_frags(v, text, fr.f, fr.n, &o, err); break;
    case KT_VOCAB_SPM:
    default: st = kt_spm_encode_frags(v, text, fr.f, fr.n, &o, err); break;
    }
    free(fr.f);
    if (st != KT_OK) return -1;
    /* ids <= bytes of the normalized text <= 3 * len + 3 per fragment. */
    if (o.n > (size_t)INT_MAX) {
        kt_error_set(err, KT_ERR_ARG, "kt_vocab_encode: too many tokens");
        return -1;
    }
    return (int)o.n;
}

int kt_vocab_encode(const kt_vocab *v, const char *text, size_t len, bool add_bos,
                    int32_t *ids, int cap, kt_error *err) {
    return kt_vocab_encode_ex(v, text, len, add_bos, false, ids, cap, err);
}
