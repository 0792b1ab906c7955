/*
 * bpe.c - byte-level BPE (tokenizer.ggml.model = "gpt2") and Gemma 4's
 * BPE ("gemma4"), as llama.cpp's llm_tokenizer_bpe does them.
 *
 * Raw text is split into words by the vocabulary's pre-tokenizer
 * (pretok.c); each word's bytes become GPT-2 characters (every byte maps
 * to one printable code point, see kt_bpe_byte_char), one symbol each.
 * Then the adjacent pair with the lowest merge rank (ties: leftmost) is
 * merged until no pair is a merge; a min-heap holds the candidates and
 * stale ones (a side absorbed or grown) are dropped when popped, exactly as
 * in llama.cpp. A final symbol that is not a token is emitted as the
 * tokens of its single bytes, where those exist (llama.cpp's fallback).
 *
 * Gemma 4 runs the same merges over other symbols, as llama.cpp does for
 * its pre-tokenizer type GEMMA4: the pieces are SentencePiece's (UTF-8,
 * "▁" for a space), so a word is a line or a run of newlines
 * (kt_pretok_split_lines), each ' ' becomes "▁", each UTF-8 character is
 * a symbol, and a final symbol that is not a token falls back to the
 * <0xNN> tokens of its bytes. A run of newlines that is itself a token is
 * taken whole, before any merge (llama.cpp's "fix for gemma 4"; with the
 * real vocabulary the merges happen to build the same tokens). The two
 * kinds differ only in the tables of kt_bpe_prepare (the token each ASCII
 * byte starts as, the token each byte falls back to), in the split, in
 * load_word_* and in whole_word.
 *
 * Words repeat (" the", "    ", "->"), so one call keeps a cache of the
 * ids of the short words it has encoded, keyed by their bytes in the text;
 * this doubles the throughput on English and C. It lives for one call
 * only, so the vocabulary stays read-only and thread-safe.
 *
 * Merges are looked up by the ids of their two sides: the loader checks
 * that both sides of every merge are tokens, so a symbol whose text is not
 * a token (id -1) can take part in no merge, and comparing ids is the
 * same as comparing texts.
 */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "text/utf8.h"
#include "text/vocab_impl.h"

static const char SPM_SPACE[] = "\xE2\x96\x81"; /* U+2581 "▁" */

/* ---- GPT-2's byte <-> unicode table ---------------------------------- */

/* Bytes 33..126, 161..172 and 174..255 stand for themselves; the other 68
 * bytes, in order, for U+0100..U+0143. */
static uint32_t byte_cp(uint8_t b) {
    if (b <= 32) return 256u + b;
    if (b >= 127 && b <= 160) return 256u + 33 + (b - 127u);
    if (b == 173) return 256u + 67;
    return b;
}

int kt_bpe_byte_char(uint8_t b, char out[2]) {
    uint32_t cp = byte_cp(b);
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

int kt_bpe_char_byte(uint32_t cp) {
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255))
        return (int)cp;
    if (cp >= 256 && cp <= 288) return (int)(cp - 256);
    if (cp >= 289 && cp <= 322) return (int)(cp - 289 + 127);
    if (cp == 323) return 173;
    return -1;
}

/* ---- the merge table ------------------------------------------------- */

static uint64_t mix64(uint64_t x) {
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static const kt_bpe_merge *merge_find(const kt_vocab *v, int32_t left, int32_t right) {
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    for (uint64_t i = mix64(key) & v->merge_mask;; i = (i + 1) & v->merge_mask) {
        if (v->merges[i].key == key) return &v->merges[i];
        if (v->merges[i].key == KT_BPE_NO_MERGE) return NULL;
    }
}

/* The first rank of a pair wins (llama.cpp's emplace keeps it). */
static void merge_insert(kt_vocab *v, uint64_t key, int32_t rank, int32_t id) {
    uint64_t i = mix64(key) & v->merge_mask;
    while (v->merges[i].key != KT_BPE_NO_MERGE) {
        if (v->merges[i].key == key) return;
        i = (i + 1) & v->merge_mask;
    }
    v->merges[i] = (kt_bpe_merge){ key, rank, id };
}

/* Parses merge i ("left right", split at the first space after the first
 * byte, as llama.cpp) into the table. Both sides are tokens, so at most
 * max_len bytes each: buf has room for 2 * max_len. */
static kt_status add_merge(kt_vocab *v, int32_t i, gguf_str s, char *buf, kt_error *err) {
    const char *sp = s.len > 1 ? memchr(s.ptr + 1, ' ', s.len - 1) : NULL;
    size_t nl = sp ? (size_t)(sp - s.ptr) : 0, nr = sp ? s.len - nl - 1 : 0;
    int32_t l = sp ? kt_vocab_find(v, s.ptr, nl) : -1;
    int32_t r = sp && nr > 0 ? kt_vocab_find(v, sp + 1, nr) : -1;
    if (l < 0 || r < 0)
        return kt_error_set(err, KT_ERR_FORMAT,
                            "tokenizer.ggml.merges[%d]: '%.*s' is not two tokens "
                            "separated by a space",
                            i, (int)(s.len > 64 ? 64 : s.len), s.ptr);
    memcpy(buf, s.ptr, nl);
    memcpy(buf + nl, sp + 1, nr);
    merge_insert(v, (uint64_t)(uint32_t)l << 32 | (uint32_t)r, i, kt_vocab_find(v, buf, nl + nr));
    return KT_OK;
}

/* "gpt2": byte b starts as the token of its GPT-2 character and falls
 * back to the token whose piece is b itself. */
static void build_byte_tables(kt_vocab *v) {
    for (int b = 0; b < 256; b++) {
        char c[2], raw = (char)b;
        v->bpe_char_tok[b] = kt_vocab_find(v, c, (size_t)kt_bpe_byte_char((uint8_t)b, c));
        v->bpe_raw_tok[b] = kt_vocab_find(v, &raw, 1);
    }
}

/* "gemma4": an ASCII byte starts as the token of its character (' ' as
 * "▁"; other characters are looked up whole), and any byte falls back to
 * "<0xNN>" only (llama.cpp: never to a one-byte piece). */
static void build_utf8_tables(kt_vocab *v) {
    static const char hex[] = "0123456789ABCDEF";
    for (int b = 0; b < 256; b++) {
        char raw = (char)b, p[6] = { '<', '0', 'x', hex[b >> 4], hex[b & 15], '>' };
        v->bpe_char_tok[b] = b == ' '  ? kt_vocab_find(v, SPM_SPACE, 3)
                             : b < 0x80 ? kt_vocab_find(v, &raw, 1)
                                        : -1;
        v->bpe_raw_tok[b] = kt_vocab_find(v, p, 6);
    }
}

kt_status kt_bpe_prepare(kt_vocab *v, const gguf_file *f, int64_t idx, kt_error *err) {
    if (v->kind == KT_VOCAB_GEMMA4) build_utf8_tables(v);
    else build_byte_tables(v);
    uint64_t n = gguf_kv_arr_n(f, idx), size = 16;
    if (n > INT32_MAX)
        return kt_error_set(err, KT_ERR_FORMAT, "tokenizer.ggml.merges: %llu merges (max %d)",
                            (unsigned long long)n, INT32_MAX);
    while (size < 2 * n) size *= 2;
    v->merges = malloc(size * sizeof *v->merges);
    char *buf = malloc((size_t)v->max_len * 2 + 2);
    if (!v->merges || !buf) {
        free(buf);
        return kt_error_set(err, KT_ERR_NOMEM, "tokenizer.ggml.merges: out of memory");
    }
    for (uint64_t i = 0; i < size; i++) v->merges[i] = (kt_bpe_merge){ KT_BPE_NO_MERGE, 0, 0 };
    v->merge_mask = size - 1;
    kt_status st = KT_OK;
    for (uint64_t i = 0; i < n && st == KT_OK; i++) {
        st = add_merge(v, (int32_t)i, gguf_kv_arr_str(f, idx, i), buf, err);
    }
    free(buf);
    return st;
}

/* ---- merging one word ------------------------------------------------ */

typedef struct bpe_sym {
    int32_t prev, next; /* -1 at the ends */
    uint32_t off, n;    /* byte range in the mapped word; n == 0: absorbed */
    int32_t id;         /* token of the range, -1 if it is none */
} bpe_sym;

typedef struct bpe_pair {
    int32_t rank, left, right;
    uint32_t size; /* bytes of left + right when pushed */
    int32_t id;
} bpe_pair;

/* A cached word: its bytes (in the caller's text) and its ids. */
typedef struct bpe_cached {
    const char *word;    /* NULL: empty slot */
    uint32_t len, at, n; /* ids are cache_ids[at .. at + n) */
} bpe_cached;

#define CACHE_MAX_WORD 48     /* longer words are rare: not cached */
#define CACHE_MAX_SLOTS 65536 /* at most half of them used */

typedef struct bpe_work {
    char *buf;       /* the word's symbols (GPT-2 characters, or UTF-8 with "▁") */
    bpe_sym *sym;
    bpe_pair *heap;
    int32_t *wids;   /* the word's ids (at most 3 per byte) */
    size_t cap, heap_len; /* bytes of the longest word room is held for */
    kt_span_list words, tmp;
    bpe_cached *cache;
    size_t cache_mask, cache_used;
    int32_t *cache_ids;
    size_t n_cache_ids, cap_cache_ids;
} bpe_work;

static bool pair_before(const bpe_pair *a, const bpe_pair *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->left < b->left;
}

static void heap_push(bpe_work *w, bpe_pair p) {
    size_t i = w->heap_len++;
    while (i > 0 && pair_before(&p, &w->heap[(i - 1) / 2])) {
        w->heap[i] = w->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    w->heap[i] = p;
}

static bpe_pair heap_pop(bpe_work *w) {
    bpe_pair top = w->heap[0], last = w->heap[--w->heap_len];
    size_t i = 0, n = w->heap_len;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && pair_before(&w->heap[c + 1], &w->heap[c])) c++;
        if (!pair_before(&w->heap[c], &last)) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n > 0) w->heap[i] = last;
    return top;
}

static void try_pair(const kt_vocab *v, bpe_work *w, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const bpe_sym *l = &w->sym[left], *r = &w->sym[right];
    if (l->id < 0 || r->id < 0) return;
    const kt_bpe_merge *m = merge_find(v, l->id, r->id);
    if (m) heap_push(w, (bpe_pair){ m->rank, left, right, l->n + r->n, m->id });
}

/* Room for a word of n bytes: 3n mapped bytes (a GPT-2 character is at
 * most 2 bytes, "▁" for ' ' is 3), n symbols, the heap (n - 1 initial
 * candidates + 2 per merge, at most n - 1 merges), and 3n ids (a symbol
 * that is no token gives at most one per mapped byte). */
static bool reserve(bpe_work *w, size_t n) {
    if (n <= w->cap) return true;
    size_t cap = n < 64 ? 64 : n;
    char *b = realloc(w->buf, 3 * cap);
    if (b) w->buf = b;
    bpe_sym *s = b ? realloc(w->sym, cap * sizeof *s) : NULL;
    if (s) w->sym = s;
    bpe_pair *h = s ? realloc(w->heap, 3 * cap * sizeof *h) : NULL;
    if (h) w->heap = h;
    int32_t *ids = h ? realloc(w->wids, 3 * cap * sizeof *ids) : NULL;
    if (!ids) return false;
    w->wids = ids;
    w->cap = cap;
    return true;
}

/* "gpt2": maps the word's bytes to GPT-2 characters, one symbol each.
 * Returns the number of symbols (n); *bytes gets the mapped length. */
static uint32_t load_word_bytes(const kt_vocab *v, bpe_work *w, const uint8_t *s, uint32_t n,
                                uint32_t *bytes) {
    uint32_t at = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t k = (uint32_t)kt_bpe_byte_char(s[i], w->buf + at);
        w->sym[i] = (bpe_sym){ (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1, at, k,
                               v->bpe_char_tok[s[i]] };
        at += k;
    }
    *bytes = at;
    return n;
}

/* "gemma4": one symbol per UTF-8 character (valid: checked by the
 * caller), ' ' written "▁". Returns the number of symbols (>= 1 for
 * n >= 1); *bytes gets the escaped length. */
static uint32_t load_word_utf8(const kt_vocab *v, bpe_work *w, const uint8_t *s, uint32_t n,
                               uint32_t *bytes) {
    uint32_t at = 0, m = 0;
    for (uint32_t i = 0; i < n; m++) {
        bool sp = s[i] == ' ';
        uint32_t k = sp ? 1 : (uint32_t)kt_utf8_len(s[i]);
        if (k > n - i) k = n - i; /* cannot happen on valid input */
        uint32_t out = sp ? 3 : k;
        memcpy(w->buf + at, sp ? (const uint8_t *)SPM_SPACE : s + i, out);
        int32_t id = s[i] < 0x80 ? v->bpe_char_tok[s[i]] : kt_vocab_find(v, w->buf + at, out);
        w->sym[m] = (bpe_sym){ (int32_t)m - 1, (int32_t)m + 1, at, out, id };
        at += out;
        i += k;
    }
    w->sym[m - 1].next = -1;
    *bytes = at;
    return m;
}

/* The token a word is taken as whole, before any merge, or -1: for
 * "gpt2" with ignore_merges any word that is a token; for "gemma4" a run
 * of newlines that is one (the split makes a word that starts with '\n'
 * all newlines). */
static int32_t whole_word(const kt_vocab *v, const char *mapped, uint32_t bytes,
                          const uint8_t *s) {
    bool whole = v->kind == KT_VOCAB_GEMMA4 ? s[0] == '\n' : v->ignore_merges;
    return whole ? kt_vocab_find(v, mapped, bytes) : -1;
}

static void merge_word(const kt_vocab *v, bpe_work *w, uint32_t n) {
    w->heap_len = 0;
    for (uint32_t i = 1; i < n; i++) try_pair(v, w, (int32_t)i - 1, (int32_t)i);
    while (w->heap_len > 0) {
        bpe_pair p = heap_pop(w);
        bpe_sym *l = &w->sym[p.left], *r = &w->sym[p.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != p.size) continue; /* stale */
        l->n += r->n;
        l->id = p.id;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) w->sym[r->next].prev = p.left;
        try_pair(v, w, l->prev, p.left);
        try_pair(v, w, p.left, l->next);
    }
}

/* A final symbol: its token, else the tokens of its single bytes. */
static void emit_symbol(const kt_vocab *v, const bpe_sym *s, const char *buf, kt_ids_out *o) {
    if (s->id >= 0) {
        kt_ids_emit(o, s->id);
        return;
    }
    for (uint32_t j = 0; j < s->n; j++) {
        int32_t id = v->bpe_raw_tok[(uint8_t)buf[s->off + j]];
        if (id >= 0) kt_ids_emit(o, id);
    }
}

/* Encodes one word (n >= 1 bytes) into w->wids; returns the count, or -1
 * out of memory. */
static int64_t encode_word(const kt_vocab *v, bpe_work *w, const uint8_t *s, uint32_t n) {
    if (!reserve(w, n)) return -1;
    kt_ids_out o = { w->wids, (int)(3 * n), 0 };
    uint32_t bytes,
        n_sym = v->kind == KT_VOCAB_GEMMA4 ? load_word_utf8(v, w, s, n, &bytes)
                                           : load_word_bytes(v, w, s, n, &bytes);
    int32_t whole = whole_word(v, w->buf, bytes, s);
    if (whole >= 0) {
        kt_ids_emit(&o, whole);
        return 1;
    }
    merge_word(v, w, n_sym);
    for (int32_t i = 0; i != -1; i = w->sym[i].next) emit_symbol(v, &w->sym[i], w->buf, &o);
    return (int64_t)o.n;
}

/* ---- the per-call word cache ------------------------------------------- */

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
    return h;
}

/* Sized for the text (about a slot per 8 bytes), allocated on first use;
 * false if there is no cache (out of memory is not an error here). */
static bool cache_ready(bpe_work *w, size_t text_len) {
    if (w->cache) return true;
    size_t slots = 256;
    while (slots < text_len / 8 && slots < CACHE_MAX_SLOTS) slots *= 2;
    w->cache = calloc(slots, sizeof *w->cache);
    w->cache_mask = slots - 1;
    return w->cache != NULL;
}

/* The slot of word s[0..n): its entry, or the empty slot it would take. */
static bpe_cached *cache_slot(bpe_work *w, const char *s, uint32_t n) {
    for (size_t i = hash_bytes(s, n) & w->cache_mask;; i = (i + 1) & w->cache_mask) {
        bpe_cached *e = &w->cache[i];
        if (!e->word || (e->len == n && memcmp(e->word, s, n) == 0)) return e;
    }
}

/* Remembers the ids in w->wids[0..k) for word s[0..n) in slot e. */
static void cache_put(bpe_work *w, bpe_cached *e, const char *s, uint32_t n, size_t k) {
    if (2 * (w->cache_used + 1) > w->cache_mask + 1) return; /* full enough */
    if (w->n_cache_ids + k > w->cap_cache_ids) {
        size_t cap = 2 * (w->n_cache_ids + k) + 1024;
        int32_t *p = realloc(w->cache_ids, cap * sizeof *p);
        if (!p) return;
        w->cache_ids = p;
        w->cap_cache_ids = cap;
    }
    memcpy(w->cache_ids + w->n_cache_ids, w->wids, k * sizeof *w->wids);
    *e = (bpe_cached){ s, n, (uint32_t)w->n_cache_ids, (uint32_t)k };
    w->n_cache_ids += k;
    w->cache_used++;
}

/* Emits the ids of word s[0..n), from the cache when it has them. */
static bool emit_word(const kt_vocab *v, bpe_work *w, const char *s, uint32_t n,
                      size_t text_len, kt_ids_out *o) {
    bpe_cached *e = n <= CACHE_MAX_WORD && cache_ready(w, text_len) ? cache_slot(w, s, n) : NULL;
    if (e && e->word) {
        for (uint32_t i = 0; i < e->n; i++) kt_ids_emit(o, w->cache_ids[e->at + i]);
        return true;
    }
    int64_t k = encode_word(v, w, (const uint8_t *)s, n);
    if (k < 0) return false;
    for (int64_t i = 0; i < k; i++) kt_ids_emit(o, w->wids[i]);
    if (e) cache_put(w, e, s, n, (size_t)k);
    return true;
}

/* ---- entry point (see encode.c) ---------------------------------------- */

static kt_status encode_raw(const kt_vocab *v, bpe_work *w, const char *text, size_t len,
                            kt_ids_out *o, kt_error *err) {
    kt_status st = v->kind == KT_VOCAB_GEMMA4
                       ? kt_pretok_split_lines(text, len, &w->words, err)
                       : kt_pretok_split(v->pretok, text, len, &w->words, &w->tmp, err);
    for (size_t i = 0; st == KT_OK && i < w->words.n; i++) {
        kt_span sp = w->words.s[i];
        if (!emit_word(v, w, text + sp.off, sp.len, len, o))
            st = kt_error_set(err, KT_ERR_NOMEM, "tokenizer: out of memory (%u bytes)", sp.len);
    }
    return st;
}

kt_status kt_bpe_encode_frags(const kt_vocab *v, const char *text, const kt_frag *fr,
                              size_t n_frag, kt_ids_out *o, kt_error *err) {
    bpe_work w = { 0 };
    kt_status st = KT_OK;
    for (size_t k = 0; k < n_frag && st == KT_OK; k++) {
        if (fr[k].id >= 0) kt_ids_emit(o, fr[k].id);
        else st = encode_raw(v, &w, text + fr[k].off, fr[k].len, o, err);
    }
    free(w.buf);
    free(w.sym);
    free(w.heap);
    free(w.wids);
    free(w.cache);
    free(w.cache_ids);
    kt_span_list_free(&w.words);
    kt_span_list_free(&w.tmp);
    return st;
}
