/*
 * fuzz_json_schema.c - libFuzzer target: JSON text -> json_loads ->
 * kt_json_schema_to_gbnf (grammar/json_schema.h) -> kt_grammar_parse of the
 * GBNF it wrote. A response_format schema or a tool's parameters come
 * from the client; whatever GBNF the converter writes must compile (a
 * parse failure of converter output is reported as a crash: a bug in the
 * converter, not in the input), unless a grammar limit refuses it.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_error_t jerr;
    json_t *schema = json_loadb((const char *)data, size, JSON_DECODE_ANY, &jerr);
    if (!schema) return 0;
    kt_error err = {0};
    char *gbnf = kt_json_schema_to_gbnf(schema, &err);
    json_decref(schema);
    if (!gbnf) return 0;
    kt_grammar *g = kt_grammar_parse(gbnf, strlen(gbnf), NULL, &err);
    if (!g && err.status != KT_ERR_ARG) {
        /* out of memory is the only other failure, and is not a bug */
    } else if (!g && !strstr(err.msg, "limit") && !strstr(err.msg, "too ")) {
        fprintf(stderr, "converter wrote GBNF that does not compile: %s\n%s\n", err.msg, gbnf);
        abort();
    }
    kt_grammar_free(g);
    free(gbnf);
    return 0;
}
