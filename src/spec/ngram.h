/*
 * ngram.h - prompt lookup: what an agent's context says comes next.
 *
 * Agents quote their context back (code being edited, tool results, JSON
 * keys and values): when the last few tokens also stand earlier in the
 * context, the tokens that followed them there are a cheap guess at what
 * follows now. Verifying the guess costs one forward pass over k + 1
 * tokens, which reads the weights once like a single decode step does.
 */
#ifndef KT_SPEC_NGRAM_H
#define KT_SPEC_NGRAM_H

#include <stdint.h>

/* Finds the latest earlier occurrence of the context's last m tokens,
 * for the longest m in [min_match, max_match] that has one, and copies
 * up to k of the tokens that followed it to out. Returns how many (0: no
 * match). ctx[0..n) is the whole sequence (prompt and output so far). */
int spec_ngram_propose(const int32_t *ctx, int n, int min_match, int max_match, int k, int32_t *out);

#endif
