/*
 * grammar.h - a context-free grammar over bytes, and a reference matcher.
 *
 * kettle constrains generation with grammars written in GBNF, the format
 * llama.cpp defined and agents' tools already emit (rules, alternatives,
 * groups, * + ? {m,n}, character classes, literals, comments, token
 * references <[id]>). `kt_grammar_parse` compiles GBNF text into the
 * byte-level form below; the JSON-Schema converter (json_schema.h) writes
 * GBNF and goes through the same parser.
 *
 * The compiled form works on bytes, not code points: a character class
 * over code points becomes a small rule of UTF-8 byte-range sequences, so
 * a token whose bytes end inside a multi-byte character is matched up to
 * where it ends and the character is finished by the next token, and only
 * valid UTF-8 is ever accepted.
 *
 * Layout (llama.cpp's flat form, over bytes): every alternative of every
 * rule is a run of elements in `elems`, ended by a KT_GE_END element. A
 * *position* is an index into `elems`: the next element to match. A
 * parse state is a set of stacks of positions; the top of a stack is
 * always a terminal (BYTE, SET, TOKEN, NOT_TOKEN) or END of the root.
 *
 * Invariants kt_grammar_parse guarantees (the matchers rely on them):
 *   - every RULE element names a rule in [0, n_rules); every rule has at
 *     least one alternative; `root` names the rule called "root";
 *   - no rule is left-recursive, directly or through nullable rules (so
 *     expanding a stack's top to its terminals always terminates);
 *   - every SET element's value indexes `sets`.
 */
#ifndef KT_GRAMMAR_GRAMMAR_H
#define KT_GRAMMAR_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kettle.h"

typedef enum kt_gelem_type {
    KT_GE_END = 0,   /* end of an alternative: pop the rule */
    KT_GE_BYTE,      /* exactly the byte `value` */
    KT_GE_SET,       /* any byte in sets[value] */
    KT_GE_RULE,      /* call rule `value` */
    KT_GE_TOKEN,     /* exactly the token id `value` (GBNF <[id]>) */
    KT_GE_NOT_TOKEN  /* any one token except id `value` (GBNF !<[id]>) */
} kt_gelem_type;

typedef struct kt_gelem {
    uint32_t type;   /* kt_gelem_type */
    uint32_t value;
} kt_gelem;

/* 256 bits: bit b set <=> byte b is in the set. */
typedef struct kt_byteset {
    uint64_t bits[4];
} kt_byteset;

static inline bool kt_byteset_has(const kt_byteset *s, uint8_t b)
{
    return (s->bits[b >> 6] >> (b & 63)) & 1;
}

typedef struct kt_grule {
    uint32_t first_alt; /* into kt_grammar.alts */
    uint32_t n_alts;
} kt_grule;

typedef struct kt_grammar {
    kt_gelem *elems;    /* every alternative, each ended by KT_GE_END */
    uint32_t n_elems;
    uint32_t *alts;     /* alts[i]: position of the first element of alternative i */
    uint32_t n_alts_total;
    kt_grule *rules;
    uint32_t n_rules;
    char **rule_names;  /* rule_names[r]: as written, or generated ("x_3", "x_star_1") */
    kt_byteset *sets;
    uint32_t n_sets;
    uint32_t root;      /* the rule named "root" */
    /* Worked out at compile time for the token masks (lexical.c):
     * rule_lexical[r] says that rule r and every rule it can reach never
     * nest (call themselves other than last in an alternative);
     * rest_lexical[p] (n_elems + 1 entries) that everything from position
     * p to its alternative's END is a terminal or a lexical rule;
     * byte_class[b] numbers the classes of bytes no element tells apart
     * (every BYTE and SET takes all of a class or none of it), n_byte_classes
     * of them, so a matcher's steps need one entry per class, not per byte;
     * fingerprint is a 128-bit hash of the compiled form; rule_hash[r]
     * names the structure lexical rule r reaches (128 bits, equal across
     * grammars for equal structure; see lexical.c). */
    uint8_t byte_class[256];
    uint32_t n_byte_classes;
    uint8_t *rule_lexical;
    uint8_t *rest_lexical;
    uint64_t fingerprint[2];
    uint64_t (*rule_hash)[2];
} kt_grammar;

/* Fills rest_lexical and fingerprint of a compiled grammar; false when
 * out of memory. kt_grammar_parse calls it. */
bool kt_grammar_analyze(kt_grammar *g);

/* Limits that hold for hostile input (each breach is a KT_ERR_ARG with a
 * message naming the limit). */
#define KT_GRAMMAR_MAX_TEXT   (1u << 20) /* bytes of GBNF text */
#define KT_GRAMMAR_MAX_ELEMS  (1u << 22) /* elements after expansion */
#define KT_GRAMMAR_MAX_REPEAT 10000u     /* m and n in {m,n} */
#define KT_GRAMMAR_MAX_DEPTH  256u       /* nesting of ( ) groups */

/* Parses GBNF text (n bytes, need not be NUL-terminated) into a compiled
 * grammar. `root` names the start rule (NULL: "root"). Errors are
 * KT_ERR_ARG with "line L, column C: what is wrong" (1-based, columns in
 * bytes), or the name of an undefined rule, or "rule 'x' is left-recursive".
 * Returns NULL on error. */
/* Beside llama.cpp's syntax, `{,n}` means {0,n} and names may contain
 * '_'. Refused where llama.cpp is silently surprising: {m,n} with n < m,
 * the empty classes [] and [^], invalid UTF-8 in the text, a NUL byte,
 * a literal code point UTF-8 cannot encode (a surrogate, > U+10FFFF), and
 * <text> token references (no vocabulary here: write <[id]>). A rule
 * defined twice keeps its last definition, as in llama.cpp. Allocation
 * failure is KT_ERR_NOMEM. */
kt_grammar *kt_grammar_parse(const char *text, size_t n, const char *root, kt_error *err);
void kt_grammar_free(kt_grammar *g);

/* ---- the reference matcher ----------------------------------------------
 * A plain set-of-stacks pushdown matcher over the compiled grammar: the
 * oracle the fast token masks are tested against, and what the tests of
 * the grammar data use. Simple before fast: stacks are copied, not shared.
 */
typedef struct kt_gmatch kt_gmatch;

/* The state before any input: the root rule's alternatives expanded.
 * NULL on allocation failure (or if the expansion exceeds
 * KT_GMATCH_MAX_STACKS, with a message). */
#define KT_GMATCH_MAX_STACKS 4096u
kt_gmatch *kt_gmatch_new(const kt_grammar *g, kt_error *err);
kt_gmatch *kt_gmatch_clone(const kt_gmatch *m);
void kt_gmatch_free(kt_gmatch *m);

/* Advances by one byte. Returns false (and leaves the state unchanged)
 * when no stack accepts it. A step whose result would need more than
 * KT_GMATCH_MAX_STACKS stacks (or whose expansion passes an internal work
 * budget, only reachable with pathological nests of nullable rules) is
 * refused the same way: the oracle never answers from a truncated set. */
bool kt_gmatch_byte(kt_gmatch *m, uint8_t byte);
/* Advances by n bytes, all or nothing. */
bool kt_gmatch_bytes(kt_gmatch *m, const uint8_t *bytes, size_t n);
/* Advances by one whole token: stacks whose top is TOKEN(id) or
 * NOT_TOKEN(other id) step over it; when `bytes` is not NULL the token's
 * text is also matched byte by byte as above, on the other stacks (control
 * tokens pass bytes = NULL: they match only through token references).
 * All or nothing; false when nothing accepts it. */
bool kt_gmatch_token(kt_gmatch *m, int32_t token_id, const uint8_t *bytes, size_t n);
/* True when the input so far is a complete sentence of the grammar (some
 * stack is empty): end of generation is allowed here. */
bool kt_gmatch_can_end(const kt_gmatch *m);
/* True when no input at all can follow (every stack is empty). */
bool kt_gmatch_is_done(const kt_gmatch *m);

/* Whole-string check: the bytes are consumed and the grammar can end. */
bool kt_grammar_accepts(const kt_grammar *g, const uint8_t *bytes, size_t n);

#endif
