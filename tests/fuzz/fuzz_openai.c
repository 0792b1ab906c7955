/*
 * fuzz_openai.c - libFuzzer target: the server's request parser, without
 * HTTP: JSON text -> json_loads -> srv_parse_gen as a chat and as a
 * completions body, and the Responses and Anthropic Messages bodies
 * translated into chat bodies (dialect.h) and parsed the same way. Any
 * process on the machine can send these bytes.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>

#include "server/dialect.h"
#include "server/openai.h"

/* A model as routing hands it to the parser: only the vocabulary size
 * matters (logit_bias keys). */
static const srv_model_info MODEL = {.n_vocab = 32000};

static void parse_as(json_t *body, srv_kind kind) {
    srv_gen_req r;
    srv_error e;
    if (srv_parse_gen(body, kind, &MODEL, 42, &r, &e)) srv_gen_req_free(&r);
    else free(srv_error_json(&e));
}

static void translate(const srv_dialect *d, json_t *body) {
    srv_error e;
    json_t *chat = d->to_chat(body, NULL, &e);
    if (!chat) {
        free(d->error_json(&e));
        return;
    }
    parse_as(chat, SRV_CHAT);
    json_decref(chat);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_error_t jerr;
    json_t *body = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &jerr);
    if (!body) return 0;
    if (json_is_object(body)) {
        parse_as(body, SRV_CHAT);
        parse_as(body, SRV_COMPLETION);
        translate(&SRV_DIALECT_RESPONSES, body);
        translate(&SRV_DIALECT_MESSAGES, body);
        srv_error e;
        json_t *count = srv_messages_count_body(body, NULL, &e);
        json_decref(count);
    }
    json_decref(body);
    return 0;
}
