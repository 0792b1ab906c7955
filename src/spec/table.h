/*
 * table.h - n-gram lookup across requests: what earlier requests of the
 * same model went on to say.
 *
 * Agents repeat themselves across sessions and turns (the same tool
 * result quoted, the same JSON shape, the same file reproduced), and a
 * request's own context does not hold what another session wrote. The
 * table keeps the last `cap` tokens that finished requests generated (each
 * with the few prompt tokens before it, so a reply's first tokens can be
 * found from the end of its prompt) in a ring, and a hash index from the
 * last SPEC_TABLE_NGRAM tokens to the position after their latest
 * occurrence. Memory is bounded: the ring and an index of twice its size.
 * Old entries are overwritten, never freed; an index hit is checked
 * against the ring, so a stale or colliding entry is a miss, never a
 * wrong proposal's source.
 *
 * One thread only (the engine's).
 */
#ifndef KT_SPEC_TABLE_H
#define KT_SPEC_TABLE_H

#include <stddef.h>
#include <stdint.h>

#define SPEC_TABLE_NGRAM 3

typedef struct spec_table spec_table;

/* A table of cap tokens (>= 64); NULL when out of memory. */
spec_table *spec_table_new(size_t cap);
void spec_table_free(spec_table *t);
/* Appends a run of tokens, not joined to the one before (no n-gram spans
 * two runs). Runs longer than the table keep their end. */
void spec_table_add(spec_table *t, const int32_t *tokens, int n);
/* Up to k tokens that followed the latest occurrence of ctx's last
 * SPEC_TABLE_NGRAM tokens (ctx[0..n)); returns how many (0: none). */
int spec_table_propose(const spec_table *t, const int32_t *ctx, int n, int k, int32_t *out);
/* Bytes the table holds (for the stats). */
size_t spec_table_bytes(const spec_table *t);

#endif
