/*
 * vocab.c - loading, validating, looking up, decoding and writing a
 * vocabulary (see vocab.h). Encoding lives in encode.c (entry point,
 * special tokens), spm.c, bpe.c (byte-level BPE and Gemma 4's) and wpm.c.
 *
 * Both sources end in the same kt_vocab: GGUF `tokenizer.ggml.*` metadata
 * (what llama.cpp writes) and llama2.c's tokenizer.bin. llama2.c stores
 * pieces with " " where SentencePiece has "▁" and wraps BOS/EOS in
 * newlines ("\n<s>\n"), so its loader maps them back: the same vocabulary
 * through either file gives the same pieces and so the same token ids.
 *
 * Everything a caller may later rely on is checked here, once: ids of
 * special tokens are in range, types are known, byte tokens say which byte
 * they stand for, every other piece is valid UTF-8. Errors name the key
 * (or file) and the index at fault.
 */
#include "text/vocab_impl.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "text/utf8.h"

static const char SPM_SPACE[] = "\xE2\x96\x81"; /* U+2581 "▁" */

/* ---- construction ---------------------------------------------------- */

typedef struct arena_buf {
    char *p;
    size_t len, cap;
} arena_buf;

static bool arena_put(arena_buf *a, const void *s, size_t n) {
    if (a->cap - a->len < n + 1) {
        size_t cap = a->cap ? a->cap : 4096;
        while (cap - a->len < n + 1) {
            if (cap > SIZE_MAX / 2) return false;
            cap *= 2;
        }
        char *p = realloc(a->p, cap);
        if (!p) return false;
        a->p = p;
        a->cap = cap;
    }
    if (n) memcpy(a->p + a->len, s, n);
    a->len += n;
    return true;
}

static kt_vocab *vocab_alloc(int n) {
    kt_vocab *v = calloc(1, sizeof *v);
    if (!v) return NULL;
    v->n = n;
    v->off = calloc((size_t)n, sizeof *v->off);
    v->len = calloc((size_t)n, sizeof *v->len);
    v->score = calloc((size_t)n, sizeof *v->score);
    v->type = calloc((size_t)n, sizeof *v->type);
    if (!v->off || !v->len || !v->score || !v->type) {
        kt_vocab_free(v);
        return NULL;
    }
    v->bos = v->eos = v->unk = v->pad = -1;
    v->add_bos = true;
    v->add_eos = false;
    v->add_space_prefix = true;
    for (int b = 0; b < 256; b++) v->byte_token[b] = -1;
    return v;
}

void kt_vocab_free(kt_vocab *v) {
    if (!v) return;
    free(v->arena);
    free(v->off);
    free(v->len);
    free(v->score);
    free(v->type);
    free(v->slot);
    free(v->special);
    free(v->pairs);
    free(v->merges);
    kt_pretok_free(v->pretok);
    free(v);
}

/* Appends piece i (escaping ' ' as "▁" when asked) and its NUL. */
static bool put_piece(kt_vocab *v, arena_buf *a, int i, const char *s, size_t n,
                      bool escape_space) {
    size_t start = a->len;
    if (!escape_space) {
        if (!arena_put(a, s, n)) return false;
    } else {
        for (size_t j = 0; j < n; j++) {
            bool ok = s[j] == ' ' ? arena_put(a, SPM_SPACE, 3) : arena_put(a, s + j, 1);
            if (!ok) return false;
        }
    }
    if (a->len - start > UINT32_MAX / 2) return false;
    a->p[a->len++] = 0; /* arena_put always leaves room for it */
    v->off[i] = start;
    v->len[i] = (uint32_t)(a->len - 1 - start);
    return true;
}

/* ---- piece -> id hash table ------------------------------------------ */

static uint64_t fnv1a(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static bool piece_eq(const kt_vocab *v, int32_t id, const char *s, size_t n) {
    return v->len[id] == n && memcmp(v->arena + v->off[id], s, n) == 0;
}

int32_t kt_vocab_find(const kt_vocab *v, const char *s, size_t n) {
    if (n > v->max_len) return -1;
    for (uint64_t i = fnv1a(s, n) & v->mask;; i = (i + 1) & v->mask) {
        int32_t id = v->slot[i];
        if (id < 0) return -1;
        if (piece_eq(v, id, s, n)) return id;
    }
}

static bool build_table(kt_vocab *v) {
    uint64_t size = 16;
    while (size < 2 * (uint64_t)v->n) size *= 2;
    v->slot = malloc(size * sizeof *v->slot);
    if (!v->slot) return false;
    memset(v->slot, 0xff, size * sizeof *v->slot); /* all -1 */
    v->mask = size - 1;
    for (int32_t id = 0; id < v->n; id++) {
        const char *s = v->arena + v->off[id];
        uint64_t i = fnv1a(s, v->len[id]) & v->mask;
        while (v->slot[i] >= 0 && !piece_eq(v, v->slot[i], s, v->len[id]))
            i = (i + 1) & v->mask;
        v->slot[i] = id; /* a repeated piece: the later id wins */
    }
    return true;
}

/* ---- byte tokens ----------------------------------------------------- */

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* The byte a byte token stands for: "<0xNN>" or the raw byte itself;
 * -1 if the piece is neither. */
static int byte_of_piece(const char *s, size_t n) {
    if (n == 1) return (uint8_t)s[0];
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int hi = hex_digit(s[3]), lo = hex_digit(s[4]);
    return (hi < 0 || lo < 0) ? -1 : hi * 16 + lo;
}

/* Like llama.cpp's byte_to_token: the piece "<0xNN>", else the one-byte
 * piece itself. */
static void build_byte_tokens(kt_vocab *v) {
    static const char hex[] = "0123456789ABCDEF";
    for (int b = 0; b < 256; b++) {
        char p[6] = { '<', '0', 'x', hex[b >> 4], hex[b & 15], '>' };
        char raw = (char)b;
        int32_t id = kt_vocab_find(v, p, 6);
        if (id < 0) id = kt_vocab_find(v, &raw, 1);
        v->byte_token[b] = id;
    }
}

/* ---- special tokens (matched in text whole) --------------------------- */

typedef struct user_key {
    uint32_t len;
    int32_t id;
} user_key;

static int cmp_user(const void *pa, const void *pb) {
    const user_key *a = pa, *b = pb;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return a->id < b->id ? -1 : (a->id > b->id);
}

/* User-defined, control and unknown tokens (llama.cpp's special token
 * cache); empty pieces are left out. */
static bool is_special(const kt_vocab *v, int i) {
    uint8_t t = v->type[i];
    return v->len[i] > 0 &&
           (t == KT_TOKEN_USER_DEFINED || t == KT_TOKEN_CONTROL || t == KT_TOKEN_UNKNOWN);
}

/* Longest first, so a longer token wins over one it contains (llama.cpp's
 * order; ties by id to stay deterministic). */
static bool build_special_list(kt_vocab *v) {
    int n = 0;
    for (int i = 0; i < v->n; i++) n += is_special(v, i);
    if (n == 0) return true;
    user_key *keys = malloc((size_t)n * sizeof *keys);
    v->special = malloc((size_t)n * sizeof *v->special);
    if (!keys || !v->special) {
        free(keys);
        return false;
    }
    for (int i = 0, k = 0; i < v->n; i++)
        if (is_special(v, i)) keys[k++] = (user_key){ v->len[i], i };
    qsort(keys, (size_t)n, sizeof *keys, cmp_user);
    for (int k = 0; k < n; k++) v->special[k] = keys[k].id;
    v->n_special = n;
    free(keys);
    return true;
}

/* ---- validation and indexes ------------------------------------------ */

/* `what` names the token list in messages ("tokenizer.ggml.tokens"). */
static kt_status check_pieces(kt_vocab *v, const char *what, kt_error *err) {
    for (int i = 0; i < v->n; i++) {
        const char *s = v->arena + v->off[i];
        size_t bad;
        if (v->type[i] == KT_TOKEN_BYTE) {
            if (byte_of_piece(s, v->len[i]) < 0)
                return kt_error_set(err, KT_ERR_FORMAT,
                                    "%s[%d]: byte token '%.*s' is not of the form <0xNN>",
                                    what, i, (int)(v->len[i] > 32 ? 32 : v->len[i]), s);
        } else if (!kt_utf8_valid(s, v->len[i], &bad)) {
            return kt_error_set(err, KT_ERR_FORMAT,
                                "%s[%d]: piece is not valid UTF-8 (at byte %zu)", what, i, bad);
        }
        if (v->len[i] > v->max_len) v->max_len = v->len[i];
    }
    return KT_OK;
}

static kt_status vocab_finish(kt_vocab *v, const char *what, kt_error *err) {
    kt_status st = check_pieces(v, what, err);
    if (st != KT_OK) return st;
    if (!build_table(v) || !build_special_list(v) ||
        (v->kind == KT_VOCAB_SPM && !kt_spm_prepare(v)))
        return kt_error_set(err, KT_ERR_NOMEM, "vocabulary: out of memory (%d tokens)", v->n);
    build_byte_tokens(v);
    return KT_OK;
}

/* ---- GGUF ------------------------------------------------------------ */

/* A string key; *found false (and KT_OK) when absent. */
static kt_status get_str(const gguf_file *f, const char *key, gguf_str *s, bool *found,
                         kt_error *err) {
    int64_t i = gguf_find_key(f, key);
    *found = i >= 0;
    if (i < 0) return KT_OK;
    if (!gguf_kv_get_str(f, i, s))
        return kt_error_set(err, KT_ERR_FORMAT, "%s: expected a string, got %s", key,
                            gguf_type_name(gguf_kv_type(f, i)));
    return KT_OK;
}

static kt_status check_model(const gguf_file *f, kt_vocab_kind *kind, kt_error *err) {
    const char *key = "tokenizer.ggml.model";
    gguf_str s;
    bool found;
    if (get_str(f, key, &s, &found, err) != KT_OK) return err->status;
    if (!found) return kt_error_set(err, KT_ERR_FORMAT, "missing key %s", key);
    if (gguf_str_eq(s, "llama")) *kind = KT_VOCAB_SPM;
    else if (gguf_str_eq(s, "gpt2")) *kind = KT_VOCAB_BPE;
    else if (gguf_str_eq(s, "bert")) *kind = KT_VOCAB_WPM;
    else if (gguf_str_eq(s, "gemma4")) *kind = KT_VOCAB_GEMMA4;
    else
        return kt_error_set(err, KT_ERR_UNSUPPORTED,
                            "tokenizer model '%.*s' is not supported yet",
                            (int)(s.len > 64 ? 64 : s.len), s.ptr);
    return KT_OK;
}

/* Index of an array key with elements of one of the given types, -1 if
 * absent (fine when !required); n must match *n unless *n < 0. */
static kt_status find_array(const gguf_file *f, const char *key, gguf_type t1,
                            gguf_type t2, bool required, int64_t *n, int64_t *idx,
                            kt_error *err) {
    *idx = gguf_find_key(f, key);
    if (*idx < 0)
        return required ? kt_error_set(err, KT_ERR_FORMAT, "missing key %s", key) : KT_OK;
    gguf_type t = gguf_kv_type(f, *idx);
    gguf_type et = t == GGUF_ARRAY ? gguf_kv_arr_type(f, *idx) : GGUF_TYPE_COUNT;
    if (et != t1 && et != t2)
        return kt_error_set(err, KT_ERR_FORMAT, "%s: expected an array of %s, got %s%s%s",
                            key, gguf_type_name(t1), gguf_type_name(t),
                            t == GGUF_ARRAY ? " of " : "",
                            t == GGUF_ARRAY ? gguf_type_name(et) : "");
    uint64_t m = gguf_kv_arr_n(f, *idx);
    if (*n < 0) {
        if (m == 0 || m > INT32_MAX)
            return kt_error_set(err, KT_ERR_FORMAT, "%s: %llu tokens (need 1 to %d)", key,
                                (unsigned long long)m, INT32_MAX);
        *n = (int64_t)m;
    } else if (m != (uint64_t)*n) {
        return kt_error_set(err, KT_ERR_FORMAT,
                            "%s: %llu entries, but tokenizer.ggml.tokens has %lld", key,
                            (unsigned long long)m, (long long)*n);
    }
    return KT_OK;
}

static kt_status load_pieces(kt_vocab *v, const gguf_file *f, int64_t idx, kt_error *err) {
    arena_buf a = { 0 };
    for (int i = 0; i < v->n; i++) {
        gguf_str s = gguf_kv_arr_str(f, idx, (uint64_t)i);
        if (s.len > UINT32_MAX / 2 || !put_piece(v, &a, i, s.ptr, (size_t)s.len, false)) {
            free(a.p);
            return kt_error_set(err, KT_ERR_NOMEM, "tokenizer.ggml.tokens: out of memory");
        }
    }
    v->arena = a.p;
    return KT_OK;
}

/* Array data may be unaligned inside the mapping: copy element by element. */
static kt_status load_scores(kt_vocab *v, const gguf_file *f, int64_t idx, kt_error *err) {
    if (idx < 0) return KT_OK; /* all 0 */
    const unsigned char *d = gguf_kv_arr_data(f, idx);
    for (int i = 0; i < v->n; i++) {
        memcpy(&v->score[i], d + 4 * (size_t)i, 4);
        if (isnan(v->score[i]))
            return kt_error_set(err, KT_ERR_FORMAT, "tokenizer.ggml.scores[%d] is NaN", i);
    }
    return KT_OK;
}

static kt_status load_types(kt_vocab *v, const gguf_file *f, int64_t idx, kt_error *err) {
    if (idx < 0) {
        memset(v->type, KT_TOKEN_NORMAL, (size_t)v->n);
        return KT_OK;
    }
    const unsigned char *d = gguf_kv_arr_data(f, idx);
    bool is_signed = gguf_kv_arr_type(f, idx) == GGUF_I32;
    for (int i = 0; i < v->n; i++) {
        uint32_t u;
        memcpy(&u, d + 4 * (size_t)i, 4);
        int64_t t = is_signed ? (int64_t)(int32_t)u : (int64_t)u;
        if (t < KT_TOKEN_UNDEFINED || t > KT_TOKEN_BYTE)
            return kt_error_set(err, KT_ERR_FORMAT,
                                "tokenizer.ggml.token_type[%d] = %lld is not a token type (0..6)",
                                i, (long long)t);
        v->type[i] = (uint8_t)t;
    }
    return KT_OK;
}

/* A special id: absent keeps *id; -1 (or u32 0xFFFFFFFF, how llama.cpp
 * writes "none") means none; anything else must be a valid id. */
static kt_status load_special(const gguf_file *f, const char *key, int n, int32_t *id,
                              kt_error *err) {
    int64_t i = gguf_find_key(f, key), x;
    if (i < 0) return KT_OK;
    if (!gguf_kv_get_i64(f, i, &x))
        return kt_error_set(err, KT_ERR_FORMAT, "%s: expected an integer, got %s", key,
                            gguf_type_name(gguf_kv_type(f, i)));
    if (x == -1 || x == (int64_t)UINT32_MAX) {
        *id = -1;
        return KT_OK;
    }
    if (x < 0 || x >= n)
        return kt_error_set(err, KT_ERR_FORMAT,
                            "%s = %lld is out of range (the vocabulary has %d tokens)", key,
                            (long long)x, n);
    *id = (int32_t)x;
    return KT_OK;
}

static kt_status load_flag(const gguf_file *f, const char *key, bool *out, kt_error *err) {
    int64_t i = gguf_find_key(f, key);
    if (i < 0) return KT_OK;
    if (!gguf_kv_get_bool(f, i, out))
        return kt_error_set(err, KT_ERR_FORMAT, "%s: expected a bool, got %s", key,
                            gguf_type_name(gguf_kv_type(f, i)));
    return KT_OK;
}

/* Defaults before the keys, as llama.cpp's per model. */
static void default_specials(kt_vocab *v) {
    v->pad = -1;
    if (v->kind == KT_VOCAB_BPE) {
        v->unk = -1;
        v->bos = v->eos = v->n > 11 ? 11 : -1;
        v->add_space_prefix = false; /* add_bos: the pre-tokenizer's default */
    } else if (v->kind == KT_VOCAB_WPM) {
        v->bos = v->n > 101 ? 101 : -1; /* [CLS] */
        v->eos = v->n > 102 ? 102 : -1; /* [SEP] */
        v->unk = v->n > 100 ? 100 : -1;
        v->pad = 0;
        v->add_eos = true;
        v->add_space_prefix = false;
    } else if (v->kind == KT_VOCAB_GEMMA4) {
        v->bos = v->eos = v->unk = -1; /* only what the keys say */
        v->add_space_prefix = false;
    } else {
        v->unk = v->n > 0 ? 0 : -1;
        v->bos = v->n > 1 ? 1 : -1;
        v->eos = v->n > 2 ? 2 : -1;
    }
}

static kt_status load_specials(kt_vocab *v, const gguf_file *f, kt_error *err) {
    default_specials(v);
    kt_status st = KT_OK;
    if (st == KT_OK) st = load_special(f, "tokenizer.ggml.bos_token_id", v->n, &v->bos, err);
    if (st == KT_OK) st = load_special(f, "tokenizer.ggml.eos_token_id", v->n, &v->eos, err);
    if (st == KT_OK) st = load_special(f, "tokenizer.ggml.unknown_token_id", v->n, &v->unk, err);
    if (st == KT_OK) st = load_special(f, "tokenizer.ggml.padding_token_id", v->n, &v->pad, err);
    if (st == KT_OK) st = load_flag(f, "tokenizer.ggml.add_bos_token", &v->add_bos, err);
    if (st == KT_OK) st = load_flag(f, "tokenizer.ggml.add_eos_token", &v->add_eos, err);
    if (st == KT_OK)
        st = load_flag(f, "tokenizer.ggml.add_space_prefix", &v->add_space_prefix, err);
    if (st == KT_OK && v->kind == KT_VOCAB_WPM)
        st = load_special(f, "tokenizer.ggml.cls_token_id", v->n, &v->bos, err);
    if (st == KT_OK && v->kind == KT_VOCAB_WPM) /* sic: llama.cpp's spelling */
        st = load_special(f, "tokenizer.ggml.seperator_token_id", v->n, &v->eos, err);
    /* As llama.cpp ("workaround for Gemma 4"): the model is run with BOS
     * even where its file says add_bos_token false. */
    if (v->kind == KT_VOCAB_GEMMA4) v->add_bos = true;
    return st;
}

/* "gpt2": the pre-tokenizer ("default" when the key is absent, as
 * llama.cpp) and its defaults. */
static kt_status load_pretok(kt_vocab *v, const gguf_file *f, kt_error *err) {
    gguf_str s;
    bool found;
    if (get_str(f, "tokenizer.ggml.pre", &s, &found, err) != KT_OK) return err->status;
    if (!found) s = (gguf_str){ "default", 7 };
    v->pretok = kt_pretok_new(s.ptr, (size_t)s.len, &v->ignore_merges, &v->add_bos, err);
    return v->pretok ? KT_OK : err->status;
}

/* "gpt2" and "gemma4": the merges, once the pieces and their table are
 * final. */
static kt_status load_merges(kt_vocab *v, const gguf_file *f, kt_error *err) {
    int64_t n = -1, idx;
    kt_status st = find_array(f, "tokenizer.ggml.merges", GGUF_STRING, GGUF_STRING, true, &n,
                              &idx, err);
    return st != KT_OK ? st : kt_bpe_prepare(v, f, idx, err);
}

static kt_status load_gguf(kt_vocab *v, const gguf_file *f, int64_t i_tok, int64_t i_score,
                           int64_t i_type, kt_error *err) {
    kt_status st = load_pieces(v, f, i_tok, err);
    if (st == KT_OK) st = load_scores(v, f, i_score, err);
    if (st == KT_OK) st = load_types(v, f, i_type, err);
    if (st == KT_OK && v->kind == KT_VOCAB_BPE) st = load_pretok(v, f, err);
    if (st == KT_OK) st = load_specials(v, f, err);
    if (st == KT_OK) st = vocab_finish(v, "tokenizer.ggml.tokens", err);
    if (st == KT_OK && (v->kind == KT_VOCAB_BPE || v->kind == KT_VOCAB_GEMMA4))
        st = load_merges(v, f, err);
    return st;
}

kt_vocab *kt_vocab_from_gguf(const gguf_file *f, kt_error *err) {
    kt_error local;
    if (!err) err = &local; /* the loaders read back err->status */
    if (!f) {
        kt_error_set(err, KT_ERR_ARG, "kt_vocab_from_gguf: no file");
        return NULL;
    }
    int64_t n = -1, i_tok, i_score, i_type;
    kt_vocab_kind kind = KT_VOCAB_SPM;
    if (check_model(f, &kind, err) != KT_OK ||
        find_array(f, "tokenizer.ggml.tokens", GGUF_STRING, GGUF_STRING, true, &n, &i_tok,
                   err) != KT_OK ||
        find_array(f, "tokenizer.ggml.scores", GGUF_F32, GGUF_F32, false, &n, &i_score,
                   err) != KT_OK ||
        find_array(f, "tokenizer.ggml.token_type", GGUF_I32, GGUF_U32, false, &n, &i_type,
                   err) != KT_OK)
        return NULL;
    kt_vocab *v = vocab_alloc((int)n);
    if (!v) {
        kt_error_set(err, KT_ERR_NOMEM, "vocabulary: out of memory (%lld tokens)", (long long)n);
        return NULL;
    }
    v->kind = kind;
    if (load_gguf(v, f, i_tok, i_score, i_type, err) != KT_OK) {
        kt_vocab_free(v);
        return NULL;
    }
    return v;
}

/* ---- llama2.c tokenizer.bin ------------------------------------------ */

typedef struct reader {
    const unsigned char *p;
    size_t len, pos;
} reader;

static bool rd_bytes(reader *r, void *out, size_t n) {
    if (r->len - r->pos < n) return false;
    memcpy(out, r->p + r->pos, n);
    r->pos += n;
    return true;
}

/* llama2.c's fixed layout: 0 <unk>, 1 <s>, 2 </s>, 3..258 bytes. */
static kt_token_type llama2c_type(int i) {
    if (i == 0) return KT_TOKEN_UNKNOWN;
    if (i == 1 || i == 2) return KT_TOKEN_CONTROL;
    if (i >= 3 && i <= 258) return KT_TOKEN_BYTE;
    return KT_TOKEN_NORMAL;
}

/* Stores token i's piece in SentencePiece form: control pieces lose the
 * newlines llama2.c wraps them in, normal ones get "▁" back for " ". */
static bool llama2c_piece(kt_vocab *v, arena_buf *a, int i, const char *s, size_t n) {
    kt_token_type t = llama2c_type(i);
    if (t == KT_TOKEN_CONTROL) {
        while (n > 0 && s[0] == '\n') { s++; n--; }
        while (n > 0 && s[n - 1] == '\n') n--;
    }
    return put_piece(v, a, i, s, n, t == KT_TOKEN_NORMAL);
}

/* Counts the entries of a well-formed file (for n_vocab <= 0). */
static int llama2c_count(reader r, int32_t max_len) {
    int n = 0;
    float score;
    int32_t len;
    while (r.pos < r.len) {
        if (!rd_bytes(&r, &score, 4) || !rd_bytes(&r, &len, 4) || len < 0 || len > max_len ||
            r.len - r.pos < (size_t)len || n == INT32_MAX)
            return -1;
        r.pos += (size_t)len;
        n++;
    }
    return n;
}

static kt_status llama2c_parse(kt_vocab *v, reader *r, int32_t max_len, const char *path,
                               kt_error *err) {
    arena_buf a = { 0 };
    int at = 0;
    for (int i = 0; i < v->n; i++) {
        int32_t len;
        at = i;
        if (!rd_bytes(r, &v->score[i], 4) || !rd_bytes(r, &len, 4)) goto trunc;
        if (len < 0 || len > max_len) {
            free(a.p);
            return kt_error_set(err, KT_ERR_FORMAT,
                                "%s: token %d has length %d (max_token_length is %d)", path, i,
                                len, max_len);
        }
        if (r->len - r->pos < (size_t)len) goto trunc;
        if (!llama2c_piece(v, &a, i, (const char *)r->p + r->pos, (size_t)len)) {
            free(a.p);
            return kt_error_set(err, KT_ERR_NOMEM, "%s: out of memory", path);
        }
        r->pos += (size_t)len;
        v->type[i] = (uint8_t)llama2c_type(i);
    }
    v->arena = a.p;
    if (r->pos != r->len)
        return kt_error_set(err, KT_ERR_FORMAT, "%s: %zu bytes left after %d tokens", path,
                            r->len - r->pos, v->n);
    return KT_OK;
trunc:
    free(a.p);
    return kt_error_set(err, KT_ERR_FORMAT, "%s: file ends inside token %d of %d", path,
                        at, v->n);
}

static unsigned char *read_whole(const char *path, size_t *size, kt_error *err) {
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        kt_error_set(err, KT_ERR_IO, "%s: cannot open", path);
        return NULL;
    }
    unsigned char *buf = NULL;
    long n = -1;
    if (fseek(fp, 0, SEEK_END) == 0) n = ftell(fp);
    if (n >= 0 && fseek(fp, 0, SEEK_SET) == 0) buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, fp) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(fp);
    if (!buf) kt_error_set(err, KT_ERR_IO, "%s: cannot read", path);
    else *size = (size_t)n;
    return buf;
}

static kt_vocab *llama2c_build(reader *r, int n_vocab, const char *path, kt_error *err) {
    int32_t max_len;
    if (!rd_bytes(r, &max_len, 4) || max_len <= 0) {
        kt_error_set(err, KT_ERR_FORMAT, "%s: bad header (max_token_length)", path);
        return NULL;
    }
    if (n_vocab <= 0) n_vocab = llama2c_count(*r, max_len);
    if (n_vocab < 259) {
        kt_error_set(err, KT_ERR_FORMAT,
                     "%s: a llama2.c tokenizer needs at least 259 well-formed tokens "
                     "(<unk>, <s>, </s>, 256 bytes)", path);
        return NULL;
    }
    kt_vocab *v = vocab_alloc(n_vocab);
    if (!v) {
        kt_error_set(err, KT_ERR_NOMEM, "%s: out of memory", path);
        return NULL;
    }
    v->unk = 0;
    v->bos = 1;
    v->eos = 2;
    if (llama2c_parse(v, r, max_len, path, err) != KT_OK ||
        vocab_finish(v, path, err) != KT_OK) {
        kt_vocab_free(v);
        return NULL;
    }
    return v;
}

/* Byte token i must be <0xNN> with NN == i - 3 (the encoder relies on the
 * byte table agreeing with llama2.c's fixed layout). */
static kt_status llama2c_check_bytes(const kt_vocab *v, const char *path, kt_error *err) {
    for (int b = 0; b < 256; b++)
        if (byte_of_piece(v->arena + v->off[b + 3], v->len[b + 3]) != b)
            return kt_error_set(err, KT_ERR_FORMAT, "%s: token %d should be <0x%02X>", path,
                                b + 3, b);
    return KT_OK;
}

kt_vocab *kt_vocab_from_llama2c(const char *path, int n_vocab, kt_error *err) {
    if (!path) {
        kt_error_set(err, KT_ERR_ARG, "kt_vocab_from_llama2c: no path");
        return NULL;
    }
    size_t size = 0;
    unsigned char *buf = read_whole(path, &size, err);
    if (!buf) return NULL;
    reader r = { buf, size, 0 };
    kt_vocab *v = llama2c_build(&r, n_vocab, path, err);
    free(buf);
    if (v && llama2c_check_bytes(v, path, err) != KT_OK) {
        kt_vocab_free(v);
        return NULL;
    }
    return v;
}

/* ---- accessors ------------------------------------------------------- */

static bool valid_id(const kt_vocab *v, int32_t id) { return v && id >= 0 && id < v->n; }

kt_vocab_kind kt_vocab_get_kind(const kt_vocab *v) { return v ? v->kind : KT_VOCAB_SPM; }
int kt_vocab_size(const kt_vocab *v) { return v ? v->n : 0; }
int kt_vocab_bos(const kt_vocab *v) { return v ? v->bos : -1; }
int kt_vocab_eos(const kt_vocab *v) { return v ? v->eos : -1; }
int kt_vocab_unk(const kt_vocab *v) { return v ? v->unk : -1; }
int kt_vocab_pad(const kt_vocab *v) { return v ? v->pad : -1; }
bool kt_vocab_add_bos(const kt_vocab *v) { return v && v->add_bos; }
bool kt_vocab_add_eos(const kt_vocab *v) { return v && v->add_eos; }
bool kt_vocab_add_space_prefix(const kt_vocab *v) { return v && v->add_space_prefix; }

const char *kt_vocab_piece(const kt_vocab *v, int32_t id, size_t *len) {
    if (!valid_id(v, id)) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = v->len[id];
    return v->arena + v->off[id];
}

float kt_vocab_score(const kt_vocab *v, int32_t id) {
    return valid_id(v, id) ? v->score[id] : 0.0f;
}

kt_token_type kt_vocab_type(const kt_vocab *v, int32_t id) {
    return valid_id(v, id) ? (kt_token_type)v->type[id] : KT_TOKEN_UNDEFINED;
}

/* ---- decoding -------------------------------------------------------- */

/* Copies s[0..n) into buf as far as cap allows; returns n. */
static int copy_out(const char *s, size_t n, char *buf, int cap) {
    size_t k = cap > 0 ? ((size_t)cap < n ? (size_t)cap : n) : 0;
    if (k) memcpy(buf, s, k);
    return (int)n;
}

/* The piece with every "▁" turned into " ". */
static int unescape_out(const char *s, size_t n, char *buf, int cap) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        bool sp = n - i >= 3 && memcmp(s + i, SPM_SPACE, 3) == 0;
        if (o < (size_t)(cap > 0 ? cap : 0)) buf[o] = sp ? ' ' : s[i];
        o++;
        i += sp ? 3 : 1;
    }
    return (int)o;
}

/* A byte-level BPE piece: each GPT-2 character becomes its byte; any
 * other character (not produced by encoding) is copied as is. */
static int unmap_out(const char *s, size_t n, char *buf, int cap) {
    size_t o = 0, lim = (size_t)(cap > 0 ? cap : 0);
    for (size_t i = 0; i < n;) {
        size_t k = (size_t)kt_utf8_len((uint8_t)s[i]);
        if (k > n - i) k = n - i;
        uint32_t cp = k == 1 ? (uint8_t)s[i] : 0;
        if (k == 2) cp = ((uint32_t)(s[i] & 0x1F) << 6) | (uint32_t)(s[i + 1] & 0x3F);
        int b = k <= 2 ? kt_bpe_char_byte(cp) : -1;
        for (size_t j = 0; j < (b >= 0 ? 1 : k); j++, o++)
            if (o < lim) buf[o] = b >= 0 ? (char)b : s[i + j];
        i += k;
    }
    return (int)o;
}

int kt_vocab_decode_piece(const kt_vocab *v, int32_t id, char *buf, int cap) {
    if (!valid_id(v, id)) return 0;
    const char *s = v->arena + v->off[id];
    size_t n = v->len[id];
    switch ((kt_token_type)v->type[id]) {
    case KT_TOKEN_NORMAL:
        if (v->kind == KT_VOCAB_BPE) return unmap_out(s, n, buf, cap);
        return unescape_out(s, n, buf, cap); /* "llama", "bert", "gemma4" */
    case KT_TOKEN_BYTE: {
        char b = (char)byte_of_piece(s, n); /* validated at load */
        return copy_out(&b, 1, buf, cap);
    }
    case KT_TOKEN_USER_DEFINED:
    case KT_TOKEN_UNKNOWN:
        return copy_out(s, n, buf, cap);
    case KT_TOKEN_CONTROL:
    case KT_TOKEN_UNUSED:
    case KT_TOKEN_UNDEFINED:
    default:
        return 0;
    }
}

/* ---- writing --------------------------------------------------------- */

static kt_status write_arrays(const kt_vocab *v, gguf_writer *w, kt_error *err) {
    gguf_str *strs = malloc((size_t)v->n * sizeof *strs);
    int32_t *types = malloc((size_t)v->n * sizeof *types);
    kt_status st = KT_OK;
    if (!strs || !types) st = kt_error_set(err, KT_ERR_NOMEM, "vocabulary: out of memory");
    for (int i = 0; st == KT_OK && i < v->n; i++) {
        strs[i].ptr = v->arena + v->off[i];
        strs[i].len = v->len[i];
        types[i] = v->type[i];
    }
    if (st == KT_OK)
        st = gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", strs, (uint64_t)v->n, err);
    if (st == KT_OK)
        st = gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_F32, v->score,
                                 (uint64_t)v->n, err);
    if (st == KT_OK)
        st = gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_I32, types,
                                 (uint64_t)v->n, err);
    free(strs);
    free(types);
    return st;
}

static kt_status write_id(gguf_writer *w, const char *key, int32_t id, kt_error *err) {
    return id < 0 ? KT_OK : gguf_writer_set_u32(w, key, (uint32_t)id, err);
}

kt_status kt_vocab_write_gguf(const kt_vocab *v, gguf_writer *w, kt_error *err) {
    if (!v || !w) return kt_error_set(err, KT_ERR_ARG, "kt_vocab_write_gguf: NULL argument");
    if (v->kind != KT_VOCAB_SPM)
        return kt_error_set(err, KT_ERR_UNSUPPORTED,
                            "kt_vocab_write_gguf: only \"llama\" vocabularies can be written");
    kt_status st = gguf_writer_set_str(w, "tokenizer.ggml.model", "llama", err);
    if (st == KT_OK) st = write_arrays(v, w, err);
    if (st == KT_OK) st = write_id(w, "tokenizer.ggml.bos_token_id", v->bos, err);
    if (st == KT_OK) st = write_id(w, "tokenizer.ggml.eos_token_id", v->eos, err);
    if (st == KT_OK) st = write_id(w, "tokenizer.ggml.unknown_token_id", v->unk, err);
    if (st == KT_OK) st = write_id(w, "tokenizer.ggml.padding_token_id", v->pad, err);
    if (st == KT_OK) st = gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", v->add_bos, err);
    if (st == KT_OK) st = gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", v->add_eos, err);
    if (st == KT_OK)
        st = gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", v->add_space_prefix,
                                  err);
    return st;
}
