/*
 * token_trie.h - a vocabulary's tokens as a byte trie, for token masks.
 *
 * A grammar allows a token iff the token's bytes extend the text so far
 * to a valid prefix. Checking 128k tokens one by one costs milliseconds;
 * walking them as a trie shares every common prefix's work and drops a
 * whole subtree the moment its prefix is rejected.
 *
 * Layout (llguidance's flat trie): nodes in preorder, each with its byte
 * and the index just past its subtree (`end`), so a walk is a loop over
 * an array that skips a rejected subtree with one assignment. Tokens are
 * sorted by their bytes; because preorder is lexicographic order, the
 * tokens ending at node i are sorted[first[i] .. first[i + 1]) and those
 * in its subtree sorted[first[i] .. first[end[i]]).
 *
 * Which tokens are in it: every token with decoded bytes (normal, byte,
 * user-defined). Control, unknown, unused and undefined tokens are not:
 * they decode to nothing (or to a placeholder) and are reached only
 * through a grammar's token references (<[id]>) or as end of generation.
 */
#ifndef KT_GRAMMAR_TOKEN_TRIE_H
#define KT_GRAMMAR_TOKEN_TRIE_H

#include <stdbool.h>
#include <stdint.h>

#include "kettle.h"
#include "text/vocab.h"

typedef struct kt_token_trie {
    int n_vocab;         /* ids are in [0, n_vocab) */
    uint32_t n_nodes;    /* node 0 is the root (no byte) */
    uint32_t max_depth;  /* bytes of the longest token */
    uint8_t *byte;       /* per node */
    uint32_t *end;       /* per node: index past its subtree */
    uint32_t *first;     /* per node, and first[n_nodes] = n_sorted */
    int32_t *sorted;     /* token ids in the trie, by bytes */
    uint32_t n_sorted;
    uint32_t *tok_off;   /* per id: its bytes in `bytes` (tok_len 0: not in the trie) */
    uint16_t *tok_len;
    uint8_t *bytes;
    /* What lies strictly below each node, so a walk can take a whole
     * subtree at once where the grammar state cannot change inside it
     * (a string body): below_ascii[i] has bit b for every ASCII byte b
     * under node i; below_flags[i] has KT_TRIE_HIGH_BELOW when a byte >=
     * 0x80 is under it, KT_TRIE_UTF8_BELOW when every path under it, read
     * from a character boundary, is a prefix of valid UTF-8;
     * below_height[i] is the most bytes a path under it has. */
    uint64_t (*below_ascii)[2];
    uint8_t *below_flags;
    uint16_t *below_height;
    uint64_t id;         /* distinct per trie built in this process: caches key on it */
} kt_token_trie;

enum { KT_TRIE_HIGH_BELOW = 1, KT_TRIE_UTF8_BELOW = 2 };

/* The trie of v's tokens; NULL with err when out of memory. */
kt_token_trie *kt_token_trie_from_vocab(const kt_vocab *v, kt_error *err);
/* The same from explicit token bytes (tests, tools): token i has
 * lens[i] bytes at bytes[i] (lens[i] == 0 or bytes[i] == NULL: not in the
 * trie). Tokens longer than 65535 bytes are left out. */
kt_token_trie *kt_token_trie_new(int n_vocab, const uint8_t *const *bytes, const uint32_t *lens, kt_error *err);
void kt_token_trie_free(kt_token_trie *t);

static inline bool kt_token_trie_has(const kt_token_trie *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && t->tok_len[id] > 0;
}

#endif
