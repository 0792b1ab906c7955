/*
 * sampled.h - the token ids kettle sampled for its recent replies, by
 * the reply's text.
 *
 * Why: an agent sends each reply back as an assistant message on its next
 * turn. Re-tokenizing that text need not give the ids that were sampled
 * (BPE merges across token boundaries differently; a random-weight model
 * emits pieces no tokenizer would choose), and then the prompt stops
 * matching the KV the prefix cache holds for the reply. With the sampled
 * ids the prompt is exactly what the model saw and wrote, so the next turn
 * hits the reply's KV. Bounded: least recently used replies are dropped
 * past a token budget. Thread-safe (HTTP threads share it).
 */
#ifndef KT_SERVER_SAMPLED_H
#define KT_SERVER_SAMPLED_H

#include <stddef.h>
#include <stdint.h>

typedef struct srv_sampled srv_sampled;

/* A memory of at most max_tokens ids in all; NULL when out of memory. */
srv_sampled *srv_sampled_new(size_t max_tokens);
void srv_sampled_free(srv_sampled *m);

/* Remembers that the reply text[0..len) was sampled as ids[0..n) (n >= 1;
 * both copied). Out of memory: not remembered. */
void srv_sampled_put(srv_sampled *m, const char *text, size_t len, const int32_t *ids, int n);

/* The ids sampled for text[0..len), as a malloc'ed copy in *ids; returns
 * their count, or 0 (and *ids NULL) when the text is not remembered. */
int srv_sampled_get(srv_sampled *m, const char *text, size_t len, int32_t **ids);

#endif
