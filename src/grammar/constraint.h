/*
 * constraint.h - token masks for a grammar: what the sampler may pick.
 *
 * A kt_constraint follows one generation through a compiled grammar
 * (grammar.h) and answers, for the vocabulary of a kt_token_trie, which
 * tokens may come next. It is the fast twin of the reference matcher
 * (kt_gmatch): the same language, tested against it token by token.
 *
 * How it is fast (the ideas of xgrammar and llguidance, our way):
 *  - States are interned. A parse state is a set of stacks; stacks are
 *    hash-consed frames (position, parent frame), a state is a sorted set
 *    of frame ids, and (state, byte class) -> state is memoized in a
 *    dense row per state (bytes no terminal tells apart share a class),
 *    so matching a byte is usually one array load: the grammar becomes a
 *    lazily built automaton.
 *  - Token classes per lexeme. A state's frames are grouped by rule call;
 *    for a group the trie is walked once with the frames of its lexeme
 *    and the fixed text after it (up the stack while the rest is lexical,
 *    see lexical.c, to the first rule that nests) and the rest of the
 *    stack unknown. A token consumed inside is allowed whatever lies
 *    below: it goes into the class's accept set. Where the chain ends
 *    with bytes left, the trie node's children are remembered by byte: at
 *    run time only those whose byte the real continuation takes are
 *    walked again. Inside a JSON string body that is almost the whole
 *    vocabulary decided by one 16 KB OR, and a few subtrees after the
 *    closing quote and the colon.
 *  - Walks take whole subtrees. Where every byte below a trie node leads
 *    the state to one same live state, character after character (a
 *    string body loops, a bounded string chains), every token below is
 *    allowed without visiting it (token_trie.h keeps what lies below each
 *    node).
 *  - Classes are shared: keyed by the structure they cover (each frame's
 *    alternative rest, the rules it calls named by structural hash, see
 *    grammar.h), so the string, number and whitespace rules of every
 *    JSON-Schema grammar are classified once per vocabulary and process
 *    (kt_gmask_cache), and a class running past a lexeme's closing quote
 *    is composed from the lexeme's shared class and a short walk of what
 *    follows.
 *  - The sampler checks the token it drew first (a few lookups) and asks
 *    for the full mask only when that token is rejected.
 *
 * Not thread-safe: one constraint per generation, used by one thread; a
 * kt_gmask_cache is used by the thread that owns it (the engine's).
 */
#ifndef KT_GRAMMAR_CONSTRAINT_H
#define KT_GRAMMAR_CONSTRAINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "grammar/grammar.h"
#include "grammar/token_trie.h"

/* Token classes of grammar positions, shared by every constraint over one
 * trie; bounded by max_bytes (least recently used classes go first). */
typedef struct kt_gmask_cache kt_gmask_cache;
kt_gmask_cache *kt_gmask_cache_new(const kt_token_trie *trie, size_t max_bytes, kt_error *err);
void kt_gmask_cache_free(kt_gmask_cache *c);
/* Classes computed and found, for /metrics and benchmarks. */
void kt_gmask_cache_counts(const kt_gmask_cache *c, uint64_t *computed, uint64_t *hits, size_t *bytes);

typedef struct kt_constraint kt_constraint;

/* A constraint at the start of g. The grammar, trie and cache must outlive
 * it. `eog` lists the ids that end generation (allowed exactly where the
 * grammar can end). NULL with err on allocation failure or when the
 * grammar's start state exceeds the limits. */
kt_constraint *kt_constraint_new(const kt_grammar *g, const kt_token_trie *trie, kt_gmask_cache *cache,
                                 const int32_t *eog, int n_eog, kt_error *err);
void kt_constraint_free(kt_constraint *c);

/* May `token` come next? (An end-of-generation id: iff the grammar can
 * end here.) Changes nothing. */
bool kt_constraint_allows(kt_constraint *c, int32_t token);
/* Every token that may come next: bit t of mask ((n_vocab + 63) / 64
 * words) set iff kt_constraint_allows(c, t). */
void kt_constraint_mask(kt_constraint *c, uint64_t *mask);
/* How many of tokens[0..n) the grammar takes one after another from here
 * (an end-of-generation id counts where the grammar can end, and nothing
 * after it): speculative decoding's proposals cut before the first token
 * that could never be drawn. Changes nothing. */
int kt_constraint_allows_run(kt_constraint *c, const int32_t *tokens, int n);
/* Takes `token`; false (nothing changed) if it is not allowed. */
bool kt_constraint_accept(kt_constraint *c, int32_t token);
/* Takes text that arrived inside a token the grammar did not see (the
 * bytes after a lazy grammar's trigger, engine.h); false (nothing
 * changed) if the grammar refuses them. */
bool kt_constraint_accept_bytes(kt_constraint *c, const uint8_t *bytes, size_t n);
/* The text so far is a complete sentence of the grammar. */
bool kt_constraint_can_end(const kt_constraint *c);
/* Nothing can follow: only end of generation is allowed. */
bool kt_constraint_is_done(const kt_constraint *c);
/* The constraint hit a limit (states, frames or expansion steps of a
 * pathological grammar): it then allows nothing, and this says why. NULL
 * when it has not. */
const char *kt_constraint_error(const kt_constraint *c);

#endif
