/*
 * token_trie.c - building the flat byte trie of a vocabulary (see
 * token_trie.h).
 *
 * Build: sort the tokens by their bytes, then read them in order keeping
 * the path from the root to the previous token; each token shares its
 * longest common prefix with the previous one, so the path is cut back to
 * that depth (closing the subtrees it leaves: their `end` is the node
 * count then) and the token's remaining bytes are new nodes. Nodes are
 * thus created in preorder.
 */
#include "grammar/token_trie.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

static const kt_token_trie *g_sort_trie; /* qsort has no context argument in C11 */

static int cmp_tokens(const void *a, const void *b) {
    const kt_token_trie *t = g_sort_trie;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = t->tok_len[x], ly = t->tok_len[y], l = lx < ly ? lx : ly;
    int c = memcmp(t->bytes + t->tok_off[x], t->bytes + t->tok_off[y], l);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

static _Atomic uint64_t g_next_trie_id = 1;

void kt_token_trie_free(kt_token_trie *t) {
    if (!t) return;
    free(t->byte), free(t->end), free(t->first), free(t->sorted);
    free(t->tok_off), free(t->tok_len), free(t->bytes);
    free(t->below_ascii), free(t->below_flags), free(t->below_height);
    free(t);
}

static kt_token_trie *nomem(kt_token_trie *t, kt_error *err) {
    kt_token_trie_free(t);
    kt_error_set(err, KT_ERR_NOMEM, "out of memory building the vocabulary's token trie");
    return NULL;
}

/* Nodes for the sorted tokens, in preorder (see the top of the file). A
 * trie has at most 1 + total bytes nodes. */
static bool build_nodes(kt_token_trie *t, size_t total_bytes) {
    size_t cap = 1 + total_bytes;
    t->byte = malloc(cap), t->end = malloc(cap * sizeof *t->end);
    t->first = malloc((cap + 1) * sizeof *t->first);
    uint32_t *path = malloc((65536 + 1) * sizeof *path);
    if (!t->byte || !t->end || !t->first || !path) return free(path), false;
    uint32_t n = 1, depth = 0; /* path[0..depth] are open nodes; path[0] the root */
    path[0] = 0, t->byte[0] = 0, t->first[0] = 0;
    const uint8_t *prev = NULL;
    uint32_t prev_len = 0;
    for (uint32_t k = 0; k < t->n_sorted; k++) {
        int32_t id = t->sorted[k];
        const uint8_t *b = t->bytes + t->tok_off[id];
        uint32_t len = t->tok_len[id], lcp = 0;
        while (lcp < len && lcp < prev_len && b[lcp] == prev[lcp]) lcp++;
        for (; depth > lcp; depth--) t->end[path[depth]] = n; /* close what the path leaves */
        if (len > t->max_depth) t->max_depth = len;
        for (; depth < len; n++) {
            t->byte[n] = b[depth];
            t->first[n] = k;
            path[++depth] = n;
        }
        prev = b, prev_len = len;
    }
    for (; depth > 0; depth--) t->end[path[depth]] = n;
    t->end[0] = n;
    t->first[n] = t->n_sorted;
    t->n_nodes = n;
    free(path);
    return true;
}

/* UTF-8 decoding phases: at a character boundary, n continuation bytes
 * still due, or the restricted second byte of E0, ED, F0 and F4 (no
 * overlong forms, no surrogates, nothing past U+10FFFF). */
enum { U8_BOUNDARY, U8_CONT1, U8_CONT2, U8_CONT3, U8_E0, U8_ED, U8_F0, U8_F4 };

/* The phase after byte b in phase p, or -1 where b is not valid there. */
static int utf8_next(int p, uint8_t b) {
    switch (p) {
    case U8_BOUNDARY:
        if (b < 0x80) return U8_BOUNDARY;
        if (b >= 0xC2 && b <= 0xDF) return U8_CONT1;
        if (b == 0xE0) return U8_E0;
        if (b == 0xED) return U8_ED;
        if (b >= 0xE1 && b <= 0xEF) return U8_CONT2;
        if (b == 0xF0) return U8_F0;
        if (b >= 0xF1 && b <= 0xF3) return U8_CONT3;
        if (b == 0xF4) return U8_F4;
        return -1;
    case U8_CONT1: case U8_CONT2: case U8_CONT3:
        return b >= 0x80 && b <= 0xBF ? p - 1 : -1;
    case U8_E0: return b >= 0xA0 && b <= 0xBF ? U8_CONT1 : -1;
    case U8_ED: return b >= 0x80 && b <= 0x9F ? U8_CONT1 : -1;
    case U8_F0: return b >= 0x90 && b <= 0xBF ? U8_CONT2 : -1;
    default: return b >= 0x80 && b <= 0x8F ? U8_CONT2 : -1; /* U8_F4 */
    }
}

/* below_ascii and below_flags (see token_trie.h), children before their
 * parent: in preorder a node's children come after it. valid[i] has bit p
 * when node i's byte is valid in phase p and so is every path below. */
static bool summarize(kt_token_trie *t) {
    const uint32_t n = t->n_nodes;
    t->below_ascii = calloc(n, sizeof *t->below_ascii);
    t->below_flags = calloc(n, 1);
    t->below_height = calloc(n, sizeof *t->below_height);
    uint8_t *valid = malloc(n);
    if (!t->below_ascii || !t->below_flags || !t->below_height || !valid) return free(valid), false;
    for (uint32_t i = n; i-- > 0;) {
        uint8_t kids_valid = 0xff, flags = 0;
        for (uint32_t x = i + 1; x < t->end[i]; x = t->end[x]) {
            kids_valid &= valid[x];
            if (t->below_height[x] + 1 > t->below_height[i]) t->below_height[i] = (uint16_t)(t->below_height[x] + 1);
            t->below_ascii[i][0] |= t->below_ascii[x][0], t->below_ascii[i][1] |= t->below_ascii[x][1];
            if (t->byte[x] < 0x80) t->below_ascii[i][t->byte[x] >> 6] |= 1ull << (t->byte[x] & 63);
            flags |= (t->below_flags[x] & KT_TRIE_HIGH_BELOW) | (t->byte[x] >= 0x80 ? KT_TRIE_HIGH_BELOW : 0);
        }
        if (kids_valid & (1u << U8_BOUNDARY)) flags |= KT_TRIE_UTF8_BELOW;
        t->below_flags[i] = flags;
        valid[i] = 0;
        for (int p = 0; p < 8; p++) {
            int np = utf8_next(p, t->byte[i]);
            if (np >= 0 && ((kids_valid >> np) & 1)) valid[i] |= (uint8_t)(1u << p);
        }
    }
    free(valid);
    return true;
}

kt_token_trie *kt_token_trie_new(int n_vocab, const uint8_t *const *bytes, const uint32_t *lens, kt_error *err) {
    kt_token_trie *t = calloc(1, sizeof *t);
    if (!t || n_vocab < 0) return nomem(t, err);
    t->n_vocab = n_vocab;
    t->tok_off = calloc((size_t)n_vocab + 1, sizeof *t->tok_off);
    t->tok_len = calloc((size_t)n_vocab + 1, sizeof *t->tok_len);
    t->sorted = malloc(((size_t)n_vocab + 1) * sizeof *t->sorted);
    if (!t->tok_off || !t->tok_len || !t->sorted) return nomem(t, err);
    size_t total = 0;
    for (int i = 0; i < n_vocab; i++)
        if (bytes[i] && lens[i] > 0 && lens[i] <= 65535) total += lens[i];
    t->bytes = malloc(total + 1);
    if (!t->bytes) return nomem(t, err);
    size_t off = 0;
    for (int i = 0; i < n_vocab; i++) {
        if (!bytes[i] || lens[i] == 0 || lens[i] > 65535) continue;
        memcpy(t->bytes + off, bytes[i], lens[i]);
        t->tok_off[i] = (uint32_t)off, t->tok_len[i] = (uint16_t)lens[i];
        t->sorted[t->n_sorted++] = i;
        off += lens[i];
    }
    g_sort_trie = t;
    qsort(t->sorted, t->n_sorted, sizeof *t->sorted, cmp_tokens);
    g_sort_trie = NULL;
    if (!build_nodes(t, total) || !summarize(t)) return nomem(t, err);
    t->id = atomic_fetch_add(&g_next_trie_id, 1);
    return t;
}

/* Tokens whose bytes are the decoded text (see token_trie.h). */
static bool in_trie(const kt_vocab *v, int32_t id) {
    kt_token_type ty = kt_vocab_type(v, id);
    return ty == KT_TOKEN_NORMAL || ty == KT_TOKEN_BYTE || ty == KT_TOKEN_USER_DEFINED;
}

kt_token_trie *kt_token_trie_from_vocab(const kt_vocab *v, kt_error *err) {
    const int n = kt_vocab_size(v);
    const uint8_t **bytes = calloc((size_t)n + 1, sizeof *bytes);
    uint32_t *lens = calloc((size_t)n + 1, sizeof *lens);
    char *buf = NULL;
    size_t used = 0, cap = 0;
    kt_token_trie *t = NULL;
    uint32_t *offs = calloc((size_t)n + 1, sizeof *offs);
    if (!bytes || !lens || !offs) goto done;
    for (int32_t i = 0; i < n; i++) {
        if (!in_trie(v, i)) continue;
        int need = kt_vocab_decode_piece(v, i, NULL, 0);
        if (need <= 0) continue;
        if (used + (size_t)need > cap) {
            size_t nc = cap ? cap * 2 : 1 << 20;
            while (nc < used + (size_t)need) nc *= 2;
            char *nb = realloc(buf, nc);
            if (!nb) goto done;
            buf = nb, cap = nc;
        }
        kt_vocab_decode_piece(v, i, buf + used, need);
        offs[i] = (uint32_t)used, lens[i] = (uint32_t)need;
        used += (size_t)need;
    }
    for (int32_t i = 0; i < n; i++)
        if (lens[i]) bytes[i] = (const uint8_t *)buf + offs[i];
    t = kt_token_trie_new(n, bytes, lens, err);
    free(bytes), free(lens), free(offs), free(buf);
    return t;
done:
    free(bytes), free(lens), free(offs), free(buf);
    kt_error_set(err, KT_ERR_NOMEM, "out of memory building the vocabulary's token trie");
    return NULL;
}
