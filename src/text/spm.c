/*
 * spm.c - SentencePiece-style BPE, as llama.cpp's llm_tokenizer_spm does
 * it (see the contract of kt_vocab_encode in vocab.h; encode.c splits out
 * special tokens and calls kt_spm_encode_frags).
 *
 * Per fragment of text the work is O(n log n) in its UTF-8 characters:
 * the characters form a doubly linked list of symbols, and a binary
 * max-heap holds every candidate merge (adjacent pair whose concatenation
 * is a token), keyed by (score desc, left position asc). Merging a pair
 * absorbs the right symbol into the left one and pushes at most two new
 * candidates; stale candidates (a side already absorbed or grown) are
 * recognised when popped by their recorded size and dropped.
 *
 * The fragment is streamed in runs, cut between two characters that occur
 * next to each other in no token that merges can produce: no symbol can
 * ever span such a cut, candidates never cross it, and the merges inside
 * one run happen in the same relative order as in the whole fragment, so
 * the ids are exactly those of one pass over the whole fragment. Runs are
 * about a word long, so the working set (normalized bytes, symbols, heap)
 * stays in cache whatever the length of the text; one heap over a whole
 * megabyte made encoding ten times slower on cache misses.
 *
 * Invariants relied on:
 * - Symbols are contiguous byte ranges of the run's normalized bytes and
 *   list neighbours are adjacent in it, so a pair's text is one range and
 *   is looked up without copying.
 * - Symbol 0 (the first of a run) is never absorbed (it has no left
 *   neighbour), so the run's list always starts there.
 * - Pushes <= (n - 1) initial + 2 per merge, merges <= n - 1: the heap
 *   never holds more than 3n entries for n symbols, which is what is
 *   reserved.
 */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "text/utf8.h"
#include "text/vocab_impl.h"

static const char SPM_SPACE[] = "\xE2\x96\x81"; /* U+2581 "▁" */

typedef struct spm_sym {
    int32_t prev, next; /* -1 at the ends */
    uint32_t off, n;    /* byte range in the fragment; n == 0: absorbed */
    int32_t id;         /* token of the range when known from a merge, else -1 */
} spm_sym;

typedef struct spm_pair {
    float score;
    int32_t left, right;
    uint32_t size; /* bytes of left + right when pushed */
    int32_t id;
} spm_pair;

typedef struct spm_work {
    char *buf;          /* the current run, normalized */
    size_t len, buf_cap;
    spm_sym *sym;
    spm_pair *heap;
    size_t sym_cap, heap_len;
} spm_work;

/* ---- the candidate heap ---------------------------------------------- */

static bool pair_better(const spm_pair *a, const spm_pair *b) {
    if (a->score != b->score) return a->score > b->score;
    return a->left < b->left;
}

static void heap_push(spm_work *w, spm_pair p) {
    size_t i = w->heap_len++;
    w->heap[i] = p;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!pair_better(&w->heap[i], &w->heap[parent])) break;
        spm_pair t = w->heap[i]; w->heap[i] = w->heap[parent]; w->heap[parent] = t;
        i = parent;
    }
}

static spm_pair heap_pop(spm_work *w) {
    spm_pair top = w->heap[0];
    w->heap[0] = w->heap[--w->heap_len];
    size_t i = 0, n = w->heap_len;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && pair_better(&w->heap[l], &w->heap[m])) m = l;
        if (r < n && pair_better(&w->heap[r], &w->heap[m])) m = r;
        if (m == i) break;
        spm_pair t = w->heap[i]; w->heap[i] = w->heap[m]; w->heap[m] = t;
        i = m;
    }
    return top;
}

/* Tokens that merges may produce: not control, unknown or byte. */
static bool mergeable_type(uint8_t t) {
    return t != KT_TOKEN_CONTROL && t != KT_TOKEN_UNKNOWN && t != KT_TOKEN_BYTE;
}

/* ---- the pair set (run cuts) ------------------------------------------ */

/* One UTF-8 character (1..4 bytes) as a number; never 0xFFFFFFFF because
 * no lead byte is 0xFF. */
static uint32_t pack_char(const char *s, uint32_t n) {
    uint32_t x = 0;
    for (uint32_t i = 0; i < n; i++) x = x << 8 | (uint8_t)s[i];
    return x;
}

static uint64_t mix64(uint64_t x) {
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static bool pair_known(const kt_vocab *v, uint64_t key) {
    for (uint64_t i = mix64(key) & v->pair_mask;; i = (i + 1) & v->pair_mask) {
        if (v->pairs[i] == key) return true;
        if (v->pairs[i] == KT_SPM_NO_PAIR) return false;
    }
}

static void pair_insert(kt_vocab *v, uint64_t key) {
    uint64_t i = mix64(key) & v->pair_mask;
    while (v->pairs[i] != KT_SPM_NO_PAIR && v->pairs[i] != key) i = (i + 1) & v->pair_mask;
    v->pairs[i] = key;
}

/* Pieces of mergeable tokens are valid UTF-8 (checked at load), so they
 * split into whole characters. */
bool kt_spm_prepare(kt_vocab *v) {
    uint64_t bound = 0, size = 16;
    for (int i = 0; i < v->n; i++)
        if (mergeable_type(v->type[i])) bound += v->len[i];
    while (size < 2 * bound) size *= 2;
    v->pairs = malloc(size * sizeof *v->pairs);
    if (!v->pairs) return false;
    memset(v->pairs, 0xff, size * sizeof *v->pairs); /* all KT_SPM_NO_PAIR */
    v->pair_mask = size - 1;
    for (int i = 0; i < v->n; i++) {
        if (!mergeable_type(v->type[i])) continue;
        const char *s = v->arena + v->off[i];
        uint32_t n = v->len[i], prev = 0, at = 0;
        bool first = true;
        while (at < n) {
            uint32_t k = (uint32_t)kt_utf8_len((uint8_t)s[at]);
            if (k > n - at) k = n - at;
            uint32_t c = pack_char(s + at, k);
            if (!first) pair_insert(v, (uint64_t)prev << 32 | c);
            prev = c;
            first = false;
            at += k;
        }
    }
    return true;
}

/* ---- merging --------------------------------------------------------- */

/* The token the piece s[0..n) can merge into, or -1. */
static int32_t merge_token(const kt_vocab *v, const char *s, size_t n) {
    int32_t id = kt_vocab_find(v, s, n);
    return id >= 0 && mergeable_type(v->type[id]) ? id : -1;
}

static void try_pair(const kt_vocab *v, spm_work *w, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const spm_sym *l = &w->sym[left], *r = &w->sym[right];
    uint32_t size = l->n + r->n;
    if (size > v->max_len) return;
    int32_t id = merge_token(v, w->buf + l->off, size);
    if (id < 0) return;
    heap_push(w, (spm_pair){ v->score[id], left, right, size, id });
}

/* Merges the symbols [0, n) of one run. */
static void merge_run(const kt_vocab *v, spm_work *w, int32_t n) {
    w->heap_len = 0;
    for (int32_t i = 1; i < n; i++) try_pair(v, w, i - 1, i);
    while (w->heap_len > 0) {
        spm_pair p = heap_pop(w);
        spm_sym *l = &w->sym[p.left], *r = &w->sym[p.right];
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

/* A final symbol: its token, else its bytes as byte tokens, else unk. */
static kt_status emit_symbol(const kt_vocab *v, const spm_sym *s, const char *buf,
                             kt_ids_out *o, kt_error *err) {
    int32_t id = s->id >= 0 ? s->id : merge_token(v, buf + s->off, s->n);
    if (id >= 0) {
        kt_ids_emit(o, id);
        return KT_OK;
    }
    bool all_bytes = true;
    for (uint32_t j = 0; j < s->n; j++)
        if (v->byte_token[(uint8_t)buf[s->off + j]] < 0) all_bytes = false;
    if (all_bytes) {
        for (uint32_t j = 0; j < s->n; j++)
            kt_ids_emit(o, v->byte_token[(uint8_t)buf[s->off + j]]);
        return KT_OK;
    }
    if (v->unk < 0)
        return kt_error_set(err, KT_ERR_UNSUPPORTED,
                            "cannot encode '%.*s': no token, no byte tokens and no unknown token",
                            (int)s->n, buf + s->off);
    kt_ids_emit(o, v->unk);
    return KT_OK;
}

/* ---- streaming a fragment in runs ------------------------------------- */

/* Appends one normalized character of k bytes as a new symbol, growing
 * the buffers (3 heap entries per symbol; see the invariants above). */
static bool add_sym(spm_work *w, const char *c, uint32_t k, int32_t n) {
    if (w->len + k > w->buf_cap) {
        size_t cap = 2 * w->buf_cap + 64;
        char *b = realloc(w->buf, cap);
        if (!b) return false;
        w->buf = b;
        w->buf_cap = cap;
    }
    if ((size_t)n == w->sym_cap) {
        size_t cap = 2 * w->sym_cap + 64;
        spm_sym *s = realloc(w->sym, cap * sizeof *s);
        if (!s) return false;
        w->sym = s;
        spm_pair *h = realloc(w->heap, 3 * cap * sizeof *h);
        if (!h) return false;
        w->heap = h;
        w->sym_cap = cap; /* only once both grew */
    }
    memcpy(w->buf + w->len, c, k);
    w->sym[n] = (spm_sym){ n - 1, n + 1, (uint32_t)w->len, k, -1 };
    w->len += k;
    return true;
}

/* The fragment as a stream of normalized characters: an optional "▁"
 * prefix, then its characters with ' ' turned into "▁". */
typedef struct spm_reader {
    const char *s;
    size_t n, pos;
    bool prefix;
} spm_reader;

/* The next character into c[0..4); its length, 0 at the end. */
static uint32_t next_char(spm_reader *r, char c[4]) {
    if (r->prefix || (r->pos < r->n && r->s[r->pos] == ' ')) {
        if (r->prefix) r->prefix = false;
        else r->pos++;
        memcpy(c, SPM_SPACE, 3);
        return 3;
    }
    if (r->pos >= r->n) return 0;
    size_t k = (size_t)kt_utf8_len((uint8_t)r->s[r->pos]);
    if (k > r->n - r->pos) k = r->n - r->pos; /* cannot happen on valid input */
    memcpy(c, r->s + r->pos, k);
    r->pos += k;
    return (uint32_t)k;
}

/* Reads one run, starting with the character already in c[0..*k), into
 * w; on return c holds the character that cut it (*k == 0 at the end of
 * the fragment). Returns the number of symbols, or -1 out of memory. */
static int32_t read_run(const kt_vocab *v, spm_work *w, spm_reader *r, char c[4],
                        uint32_t *k) {
    int32_t n = 0;
    uint32_t prev = 0;
    w->len = 0;
    do {
        uint32_t cur = pack_char(c, *k);
        if (n > 0 && !pair_known(v, (uint64_t)prev << 32 | cur)) break;
        if (n == INT32_MAX || !add_sym(w, c, *k, n)) return -1;
        n++;
        prev = cur;
    } while ((*k = next_char(r, c)) > 0);
    w->sym[n - 1].next = -1;
    return n;
}

static kt_status encode_fragment(const kt_vocab *v, spm_work *w, const char *s, size_t n,
                                 bool prefix, kt_ids_out *o, kt_error *err) {
    spm_reader r = { s, n, 0, prefix };
    char c[4];
    uint32_t k = next_char(&r, c);
    while (k > 0) {
        int32_t n_sym = read_run(v, w, &r, c, &k);
        if (n_sym < 0)
            return kt_error_set(err, KT_ERR_NOMEM, "tokenizer: out of memory (%zu bytes)", n);
        merge_run(v, w, n_sym);
        for (int32_t i = 0; i != -1; i = w->sym[i].next) {
            kt_status st = emit_symbol(v, &w->sym[i], w->buf, o, err);
            if (st != KT_OK) return st;
        }
    }
    return KT_OK;
}

/* ---- entry point (see encode.c) ---------------------------------------- */

kt_status kt_spm_encode_frags(const kt_vocab *v, const char *text, const kt_frag *fr,
                              size_t n_frag, kt_ids_out *o, kt_error *err) {
    spm_work w = { 0 };
    kt_status st = KT_OK;
    bool prev_special = true; /* the first fragment is prefixed too */
    for (size_t k = 0; k < n_frag && st == KT_OK; k++) {
        const kt_frag *f = &fr[k];
        if (f->id >= 0) {
            kt_ids_emit(o, f->id);
            prev_special = true;
        } else {
            st = encode_fragment(v, &w, text + f->off, f->len,
                                 v->add_space_prefix && prev_special, o, err);
            prev_special = false;
        }
    }
    free(w.buf);
    free(w.sym);
    free(w.heap);
    return st;
}
