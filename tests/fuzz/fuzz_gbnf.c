/*
 * fuzz_gbnf.c - libFuzzer target: the GBNF parser (grammar/grammar.h) on
 * arbitrary text (a request's `grammar` field is client input); when it
 * compiles, the reference matcher runs over the first bytes of the input,
 * which exercises the compiled form the parser promises is well formed
 * (no left recursion, valid rule and set indices).
 */
#include <stdint.h>
#include <stdlib.h>

#include "grammar/grammar.h"

#define MATCH_BYTES 64 /* enough to walk a few rules; more only slows runs */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kt_error err = {0};
    kt_grammar *g = kt_grammar_parse((const char *)data, size, NULL, &err);
    if (!g) return 0;
    kt_gmatch *m = kt_gmatch_new(g, &err);
    if (m) {
        size_t n = size < MATCH_BYTES ? size : MATCH_BYTES;
        for (size_t i = 0; i < n && kt_gmatch_byte(m, data[i]); i++) {
        }
        volatile bool end = kt_gmatch_can_end(m) || kt_gmatch_is_done(m);
        (void)end;
        kt_gmatch_free(m);
    }
    kt_grammar_free(g);
    return 0;
}
