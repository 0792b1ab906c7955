/*
 * results.h - the exact-result cache (`kettle serve --result-cache N`):
 * answers of deterministic requests, by everything that decides them.
 *
 * Why: agents retry identical calls (after a tool error, a timeout, a
 * crashed step). A request at temperature 0, or with an explicit seed,
 * gives the same answer every time (batch invariance), so kettle can
 * answer it again from the stored completion without decoding. The key
 * hashes the prompt's token ids and every parameter that changes the
 * output; requests with logprobs are not stored. Bounded to N answers,
 * least recently used dropped first. Thread-safe.
 */
#ifndef KT_SERVER_RESULTS_H
#define KT_SERVER_RESULTS_H

#include <stdbool.h>
#include <stdint.h>

#include "server/openai.h"

typedef struct srv_results srv_results;

typedef struct srv_result_key {
    uint64_t lo, hi;
} srv_result_key;

/* A stored answer: each choice's text and finish, and the usage. */
typedef struct srv_result {
    int n_choices;
    char *text[KT_MAX_CHOICES];
    size_t len[KT_MAX_CHOICES];
    kt_finish finish[KT_MAX_CHOICES];
    int stop_string[KT_MAX_CHOICES]; /* kt_event.stop_string of each choice's end */
    kt_request_usage usage;
} srv_result;

srv_results *srv_results_new(int max_entries);
void srv_results_free(srv_results *c);

/* Whether the request's answer is the same every time and may be stored:
 * greedy or an explicit seed, and no logprobs. */
bool srv_result_cacheable(const srv_gen_req *g);
/* The key of a request with prompt ids[0..n). */
srv_result_key srv_result_key_of(const srv_gen_req *g, const int32_t *ids, int n);

/* A copy of the answer stored for key in *out (free with
 * srv_result_clear); false when there is none. Counts hits. */
bool srv_results_get(srv_results *c, srv_result_key key, srv_result *out);
/* Stores a finished reply whose choices all ended by stop or length. */
void srv_results_put(srv_results *c, srv_result_key key, const srv_reply *rp, const kt_request_usage *u);
void srv_result_clear(srv_result *r);
uint64_t srv_results_hits(srv_results *c);

#endif
