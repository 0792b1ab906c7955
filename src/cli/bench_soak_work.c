/*
 * bench_soak_work.c - what `kettle bench soak`'s clients send, and how
 * each answer is judged. See bench_soak.h.
 *
 * Everything about a request (its kind, prompt, lengths, sampling, the
 * way a malformed one is wrong) is drawn from the client's own seeded
 * generator, so a run's sequence of requests is the same on every machine
 * for a seed; only the interleaving of the clients depends on timing.
 * Prompts are bench agent's word salads (ba_words): different for every
 * request, behind one of a few shared system messages, so the prefix
 * cache both hits and misses.
 */
#include <stdlib.h>
#include <string.h>

#include "cli/bench_agent.h"
#include "cli/bench_soak.h"

const char *const sk_kind_names[SK_N_KINDS] = {
    "chat", "chat stream", "completion", "completion stream", "n 2..3", "tools", "json_schema", "stop strings",
    "abandoned stream", "malformed"};
const int sk_kind_pct[SK_N_KINDS] = {14, 14, 12, 12, 8, 10, 8, 7, 10, 5};

const char *const sk_fault_names[SK_N_FAULTS] = {"broken JSON", "wrong type", "unknown field", "invalid UTF-8",
                                                  "empty stop string", "invalid schema", "n > 16",
                                                  "9 stop strings"};
const char *const sk_outcome_names[SK_N_OUTCOMES] = {"ok", "503", "hung", "transport", "bad status", "bad answer"};
const char *const sk_stop_strings[SK_N_STOP_STRINGS] = {".", " the", "\n", "ing", " and"};

static const char TOOLS_JSON[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"The weather in a city\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":12}},"
    "\"required\":[\"city\"],\"additionalProperties\":false}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"add\",\"description\":\"Adds two numbers\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":0,"
    "\"maximum\":999},\"b\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":999}},\"required\":[\"a\",\"b\"],"
    "\"additionalProperties\":false}}}]";

/* Small and closed, so most answers finish within max_tokens. */
static const char SCHEMA_JSON[] =
    "{\"type\":\"object\",\"properties\":{\"mood\":{\"enum\":[\"happy\",\"sad\",\"calm\"]},"
    "\"ok\":{\"type\":\"boolean\"}},\"required\":[\"mood\",\"ok\"],\"additionalProperties\":false}";

static const char *const SYSTEMS[] = {"You are a helpful assistant.", "You tell short stories to children.",
                                      "Answer in one sentence."};

const json_t *sk_tools(void) {
    static json_t *tools; /* one client thread: made once, never freed */
    if (!tools) tools = json_loads(TOOLS_JSON, 0, NULL);
    return tools;
}

/* ---- drawing ---- */

static int draw(kt_rng *r, int lo, int hi) {
    return lo + (int)(kt_rng_u64(r) % (uint64_t)(hi - lo + 1));
}

static bool coin(kt_rng *r) {
    return kt_rng_u64(r) & 1;
}

sk_kind sk_pick(kt_rng *rng) {
    int x = draw(rng, 0, 99), k = 0;
    while (k < SK_N_KINDS - 1 && x >= sk_kind_pct[k]) x -= sk_kind_pct[k++];
    return (sk_kind)k;
}

/* 3..24 words. */
static json_t *short_text(kt_rng *r) {
    char *s = ba_words(kt_rng_u64(r), draw(r, 3, 24));
    json_t *j = s ? json_string(s) : NULL;
    free(s);
    return j;
}

/* Usually a short prompt, sometimes a long one (25..150 words: about 300
 * tokens in a Llama 2 vocabulary, so with tools and max_tokens any
 * request fits a context of 1024). */
static json_t *prompt_text(kt_rng *r) {
    if (coin(r)) return short_text(r);
    char *s = ba_words(kt_rng_u64(r), draw(r, 25, 150));
    json_t *j = s ? json_string(s) : NULL;
    free(s);
    return j;
}

static bool push_message(json_t *msgs, const char *role, json_t *content) {
    return content && !json_array_append_new(msgs, json_pack("{s:s, s:o}", "role", role, "content", content));
}

/* One user message; or a system message before it; or a short earlier
 * turn. */
static json_t *messages(kt_rng *r) {
    json_t *m = json_array();
    int shape = draw(r, 0, 2);
    bool ok = m != NULL;
    if (ok && shape == 1) ok = push_message(m, "system", json_string(SYSTEMS[draw(r, 0, 2)]));
    if (ok && shape == 2) ok = push_message(m, "user", short_text(r)) && push_message(m, "assistant", short_text(r));
    if (ok) ok = push_message(m, "user", prompt_text(r));
    if (!ok) json_decref(m);
    return ok ? m : NULL;
}

/* ---- bodies ---- */

/* What every kind sends: the prompt, max_tokens, sampling, stream, n. */
static json_t *base_body(kt_rng *r, const sk_request *q) {
    json_t *b = json_object(), *p = q->chat ? messages(r) : prompt_text(r);
    if (!b || !p) return json_decref(b), json_decref(p), NULL;
    double temp = coin(r) ? 0.0 : 0.8;
    bool ok = !json_object_set_new(b, q->chat ? "messages" : "prompt", p) &&
              !json_object_set_new(b, "max_tokens", json_integer(q->max_tokens)) &&
              !json_object_set_new(b, "temperature", json_real(temp)) &&
              !json_object_set_new(b, "seed", json_integer(draw(r, 0, 1 << 30)));
    if (ok && q->stream)
        ok = !json_object_set_new(b, "stream", json_true()) &&
             !json_object_set_new(b, "stream_options", json_pack("{s:b}", "include_usage", 1));
    if (ok && q->n_choices > 1) ok = !json_object_set_new(b, "n", json_integer(q->n_choices));
    if (!ok) json_decref(b);
    return ok ? b : NULL;
}

static json_t *tool_choice_json(sk_tool_choice tc) {
    static const char *const NAMES[] = {"auto", "required", NULL, "none"};
    if (tc == SK_TC_NAMED) return json_pack("{s:s, s:{s:s}}", "type", "function", "function", "name", "get_weather");
    return json_string(NAMES[tc]);
}

static bool add_tools(json_t *b, const sk_request *q) {
    const json_t *tools = sk_tools();
    return tools && !json_object_set_new(b, "tools", json_deep_copy(tools)) &&
           !json_object_set_new(b, "tool_choice", tool_choice_json(q->tool_choice)) &&
           !json_object_set_new(b, "parallel_tool_calls", json_false()); /* one call, then the grammar ends */
}

static bool add_schema(json_t *b, const char *schema_text) {
    json_t *schema = json_loads(schema_text, 0, NULL);
    json_t *rf = schema ? json_pack("{s:s, s:{s:s, s:o}}", "type", "json_schema", "json_schema", "name", "answer",
                                    "schema", schema)
                        : NULL;
    return rf && !json_object_set_new(b, "response_format", rf);
}

static bool add_stops(json_t *b, unsigned mask) {
    json_t *a = json_array();
    for (int i = 0; a && i < SK_N_STOP_STRINGS; i++)
        if ((mask & (1u << i)) && json_array_append_new(a, json_string(sk_stop_strings[i]))) return json_decref(a), false;
    return a && !json_object_set_new(b, "stop", a);
}

/* ---- malformed bodies ---- */

static bool set_wrong_type(kt_rng *r, json_t *b, bool chat) {
    switch (draw(r, 0, 4)) {
    case 0: return !json_object_set_new(b, "max_tokens", json_string("ten"));
    case 1: return !json_object_set_new(b, "temperature", json_string("hot"));
    case 2: return !json_object_set_new(b, "stream", json_string("yes"));
    case 3: return !json_object_set_new(b, "stop", json_integer(5));
    default: return !json_object_set_new(b, chat ? "messages" : "prompt", json_integer(42));
    }
}

static bool set_unknown(kt_rng *r, json_t *b, bool chat) {
    switch (draw(r, 0, 2)) {
    case 0: return !json_object_set_new(b, "frobnicate", json_integer(3));
    case 1: return !json_object_set_new(b, "best_of", json_integer(2));
    default:
        return chat ? !json_object_set_new(b, "functions", json_pack("[{s:s}]", "name", "f"))
                    : !json_object_set_new(b, "suffix", json_string("the end"));
    }
}

static bool set_bad_schema(kt_rng *r, json_t *b) {
    switch (draw(r, 0, 2)) {
    case 0: return add_schema(b, "{\"type\":\"frob\"}");
    case 1: return add_schema(b, "{\"$ref\":\"#/definitions/missing\"}");
    default: return add_schema(b, "{\"type\":\"object\",\"properties\":{\"a\":{\"pattern\":\"(unclosed\"}}}");
    }
}

static bool set_nine_stops(json_t *b) {
    json_t *a = json_array();
    for (int i = 0; a && i < 9; i++) {
        char s[16];
        snprintf(s, sizeof s, "s%d", i);
        if (json_array_append_new(a, json_string(s))) return json_decref(a), false;
    }
    return a && !json_object_set_new(b, "stop", a);
}

/* The faults that are still JSON: set on the body before it is written. */
static bool corrupt_json(kt_rng *r, json_t *b, const sk_request *q) {
    switch (q->fault) {
    case SK_FAULT_TYPE: return set_wrong_type(r, b, q->chat);
    case SK_FAULT_UNKNOWN: return set_unknown(r, b, q->chat);
    case SK_FAULT_EMPTY_STOP: return !json_object_set_new(b, "stop", json_pack("[s]", ""));
    case SK_FAULT_SCHEMA: return set_bad_schema(r, b);
    case SK_FAULT_N: return !json_object_set_new(b, "n", json_integer(17));
    case SK_FAULT_STOP: return set_nine_stops(b);
    default: return true; /* JSON and UTF-8 are broken in the text */
    }
}

/* Two bytes that are no UTF-8 (a lone 0xFF, 0xFE) at the start of the
 * prompt's or the last message's text. NULL if out of memory. */
static char *insert_bad_utf8(char *text, bool chat) {
    const char *key = chat ? "\"content\":\"" : "\"prompt\":\"";
    char *at = NULL;
    for (char *p = strstr(text, key); p; p = strstr(p + 1, key)) at = p + strlen(key);
    size_t n = strlen(text), off = at ? (size_t)(at - text) : 1;
    char *s = malloc(n + 3);
    if (!s) return free(text), NULL;
    memcpy(s, text, off);
    s[off] = (char)0xFF, s[off + 1] = (char)0xFE;
    memcpy(s + off + 2, text + off, n - off + 1);
    free(text);
    return s;
}

/* The faults of the text: a strict prefix of a compact JSON object is
 * never JSON (its closing brace is the last byte). */
static char *corrupt_text(kt_rng *r, char *text, const sk_request *q) {
    if (q->fault == SK_FAULT_UTF8) return insert_bad_utf8(text, q->chat);
    if (q->fault == SK_FAULT_JSON) text[draw(r, 1, (int)strlen(text) - 2)] = 0;
    return text;
}

/* ---- requests ---- */

/* The kind's shape: endpoint, stream, n, lengths, and its own choices. */
static void shape(kt_rng *r, sk_request *q) {
    q->n_choices = 1;
    q->max_tokens = draw(r, 1, 128);
    switch (q->kind) {
    case SK_CHAT: q->chat = true; break;
    case SK_CHAT_STREAM: q->chat = q->stream = true; break;
    case SK_COMPLETION: break;
    case SK_COMPLETION_STREAM: q->stream = true; break;
    case SK_MULTI:
        q->chat = coin(r), q->stream = coin(r), q->n_choices = draw(r, 2, 3), q->max_tokens = draw(r, 1, 64);
        break;
    case SK_TOOLS:
        q->chat = true, q->stream = coin(r), q->tool_choice = (sk_tool_choice)draw(r, 0, SK_N_TC - 1);
        q->max_tokens = draw(r, 32, 160);
        break;
    case SK_SCHEMA: q->chat = true, q->stream = coin(r), q->max_tokens = draw(r, 160, 256); break;
    case SK_STOP: q->stream = coin(r), q->stop_mask = (unsigned)draw(r, 1, (1 << SK_N_STOP_STRINGS) - 1); break;
    case SK_ABANDON:
        /* long enough (ignore_eos) that the hang-up comes mid-stream */
        q->chat = coin(r), q->stream = true, q->max_tokens = draw(r, 256, 512), q->abandon_after = draw(r, 1, 4);
        break;
    default: q->chat = coin(r), q->stream = coin(r), q->fault = (sk_fault)draw(r, 0, SK_N_FAULTS - 1); break;
    }
}

static bool kind_fields(kt_rng *r, json_t *b, const sk_request *q) {
    switch (q->kind) {
    case SK_TOOLS: return add_tools(b, q);
    case SK_SCHEMA: return add_schema(b, SCHEMA_JSON);
    case SK_STOP: return add_stops(b, q->stop_mask);
    case SK_ABANDON: return !json_object_set_new(b, "ignore_eos", json_true());
    case SK_MALFORMED: return corrupt_json(r, b, q);
    default: return true;
    }
}

bool sk_request_make_kind(kt_rng *rng, sk_kind kind, sk_request *out) {
    *out = (sk_request){.kind = kind};
    shape(rng, out);
    json_t *b = base_body(rng, out);
    bool ok = b && kind_fields(rng, b, out);
    char *text = ok ? json_dumps(b, JSON_COMPACT) : NULL;
    json_decref(b);
    out->body = text && kind == SK_MALFORMED ? corrupt_text(rng, text, out) : text;
    return out->body != NULL;
}

bool sk_request_make(kt_rng *rng, sk_request *out) {
    return sk_request_make_kind(rng, sk_pick(rng), out);
}

void sk_request_free(sk_request *r) {
    free(r->body);
    r->body = NULL;
}

const char *sk_request_path(const sk_request *r) {
    return r->chat ? "/v1/chat/completions" : "/v1/completions";
}
