/*
 * test_server.c - `kettle serve` end to end, plus the server's JSON layer
 * (src/server/openai.h, metrics.h) directly.
 *
 * The end-to-end tests start `kettle serve --port 0` on stories260K as a
 * child process, read the port from its "listening" line and talk to it
 * with libcurl, checking content, not just status codes: at temperature 0
 * a completion equals `kettle run --temp 0`, streamed deltas add up to the
 * non-streamed text, stop strings cut, logprobs are sorted, usage adds up,
 * and every bad input gets its status and a message that names the
 * problem. Each server is stopped with SIGTERM and must exit 0 (a clean
 * shutdown) within a few seconds, or it is killed and the test fails; so
 * no server outlives the test and a hung server fails rather than hangs.
 */
#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/timing.h"
#include "kettle.h"
#include "server/http.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "server/sampled.h"
#include "server_util.h"
#include "testutil.h"

#define PROMPT "Once upon a time"

/* ---- shared server for most tests ---- */

static server S;
static char *GREEDY; /* `kettle run --temp 0 -n 24` of PROMPT */

static int group_setup(void **state) {
    (void)state;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s run -m %s -p '%s' -n 24 --temp 0 -t 1", KT_BIN, tu_shared("models/stories260K.gguf"),
             PROMPT);
    if (tu_run(cmd, &GREEDY, NULL) != 0 || !GREEDY || !GREEDY[0]) return -1;
    S = start_server("serve-main.log", "--chat-template chatml --ctx 256");
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    stop_server(&S);
    free(GREEDY);
    curl_global_cleanup();
    return 0;
}

/* ---- completions ---- */

static void test_completion_greedy_matches_run(void **state) {
    (void)state;
    json_t *j = post_ok(&S, "/v1/completions", "{\"prompt\":\"" PROMPT "\",\"max_tokens\":24,\"temperature\":0}");
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "text_completion");
    assert_string_equal(json_string_value(json_object_get(c0, "text")), GREEDY);
    assert_string_equal(json_string_value(json_object_get(c0, "finish_reason")), "length");
    json_t *u = json_object_get(j, "usage");
    json_t *tok = post_ok(&S, "/tokenize", "{\"content\":\"" PROMPT "\"}");
    assert_int_equal(json_integer_value(json_object_get(u, "prompt_tokens")), json_array_size(json_object_get(tok, "tokens")));
    assert_int_equal(json_integer_value(json_object_get(u, "completion_tokens")), 24);
    assert_int_equal(json_integer_value(json_object_get(u, "total_tokens")),
                     json_integer_value(json_object_get(u, "prompt_tokens")) + 24);
    json_decref(tok);
    json_decref(j);
}

static long long metric(const server *s, const char *name);

static long long cached_tokens_of(json_t *usage) {
    json_t *d = json_object_get(usage, "prompt_tokens_details");
    if (!json_is_integer(json_object_get(d, "cached_tokens"))) fail_msg("no usage.prompt_tokens_details.cached_tokens");
    return json_integer_value(json_object_get(d, "cached_tokens"));
}

/* The same long prompt twice: the second reports its cached prompt
 * tokens (usage.prompt_tokens_details.cached_tokens, streamed usage too),
 * /metrics counts them, and the text is the same. */
static void test_prefix_cache_usage(void **state) {
    (void)state;
    const char *body = "{\"prompt\":\"Once upon a time, there was a little girl named Lily. She loved to play outside "
                       "in the park with her friends and her big red ball\",\"max_tokens\":8,\"temperature\":0}";
    long long hits_before = metric(&S, "kettle_cache_hit_tokens_total");
    json_t *a = post_ok(&S, "/v1/completions", body), *b = post_ok(&S, "/v1/completions", body);
    json_t *ua = json_object_get(a, "usage"), *ub = json_object_get(b, "usage");
    long long n_prompt = json_integer_value(json_object_get(ua, "prompt_tokens"));
    assert_true(n_prompt > 32);
    long long cached = cached_tokens_of(ub);
    assert_int_equal(cached, n_prompt - 1); /* all but the last token, whose logits start the reply */
    assert_true(cached_tokens_of(ua) <= cached);
    assert_string_equal(jstr(json_array_get(json_object_get(a, "choices"), 0), "text", NULL),
                        jstr(json_array_get(json_object_get(b, "choices"), 0), "text", NULL));
    assert_true(metric(&S, "kettle_cache_hit_tokens_total") >= hits_before + cached);
    json_decref(a), json_decref(b);
    /* streamed, with include_usage */
    char sbody[1024];
    snprintf(sbody, sizeof sbody, "%.*s,\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
             (int)strlen(body) - 1, body);
    reply r = post(&S, "/v1/completions", sbody);
    assert_int_equal(r.status, 200);
    json_t *events = sse_events(r.body);
    json_t *last = json_array_get(events, json_array_size(events) - 1);
    assert_int_equal(cached_tokens_of(json_object_get(last, "usage")), cached);
    json_decref(events);
    free(r.body);
}

static void test_completion_stream_matches(void **state) {
    (void)state;
    reply r = post(&S, "/v1/completions",
                   "{\"prompt\":\"" PROMPT "\",\"max_tokens\":24,\"temperature\":0,\"stream\":true,"
                   "\"stream_options\":{\"include_usage\":true}}");
    assert_int_equal(r.status, 200);
    json_t *ev = sse_events(r.body);
    char text[4096] = "";
    size_t i, n = json_array_size(ev);
    json_t *e;
    const char *finish = NULL;
    json_array_foreach(ev, i, e) {
        json_t *choices = json_object_get(e, "choices");
        assert_string_equal(jstr(e, "object", NULL), "text_completion");
        if (i + 1 == n) { /* usage chunk */
            assert_int_equal(json_array_size(choices), 0);
            assert_int_equal(json_integer_value(json_object_get(json_object_get(e, "usage"), "completion_tokens")), 24);
            continue;
        }
        json_t *c = json_array_get(choices, 0);
        strncat(text, json_string_value(json_object_get(c, "text")), sizeof text - strlen(text) - 1);
        if (json_is_string(json_object_get(c, "finish_reason"))) finish = json_string_value(json_object_get(c, "finish_reason"));
    }
    assert_string_equal(text, GREEDY);
    assert_non_null(finish);
    assert_string_equal(finish, "length");
    json_decref(ev);
    free(r.body);
}

static void test_completion_stop(void **state) {
    (void)state;
    /* a stop string from the middle of the greedy text */
    size_t len = strlen(GREEDY);
    assert_true(len > 12);
    char stop[8];
    snprintf(stop, sizeof stop, "%.3s", GREEDY + len / 2);
    const char *at = strstr(GREEDY, stop);
    json_t *req = json_pack("{s:s, s:i, s:i, s:[s,s]}", "prompt", PROMPT, "max_tokens", 24, "temperature", 0, "stop",
                            "zzzq", stop);
    char *body = json_dumps(req, JSON_COMPACT);
    json_t *j = post_ok(&S, "/v1/completions", body);
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    const char *text = json_string_value(json_object_get(c0, "text"));
    assert_int_equal(strlen(text), (size_t)(at - GREEDY));
    assert_memory_equal(text, GREEDY, strlen(text));
    assert_string_equal(json_string_value(json_object_get(c0, "finish_reason")), "stop");
    json_decref(j);
    free(body);
    /* streamed: the stop text never appears */
    json_object_set_new(req, "stream", json_true());
    json_object_set_new(req, "stop", json_string(stop));
    body = json_dumps(req, JSON_COMPACT);
    reply r = post(&S, "/v1/completions", body);
    free(body);
    json_decref(req);
    json_t *ev = sse_events(r.body);
    char all[4096] = "";
    size_t i;
    json_t *e;
    json_array_foreach(ev, i, e) strncat(all, json_string_value(json_object_get(json_array_get(json_object_get(e, "choices"), 0), "text")), sizeof all - strlen(all) - 1);
    assert_int_equal(strlen(all), (size_t)(at - GREEDY));
    json_decref(ev);
    free(r.body);
}

static void test_completion_logprobs(void **state) {
    (void)state;
    json_t *j = post_ok(&S, "/v1/completions", "{\"prompt\":\"" PROMPT "\",\"max_tokens\":8,\"temperature\":0,\"logprobs\":3}");
    json_t *lp = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
    json_t *toks = json_object_get(lp, "tokens"), *tlp = json_object_get(lp, "token_logprobs");
    json_t *top = json_object_get(lp, "top_logprobs"), *off = json_object_get(lp, "text_offset");
    assert_int_equal(json_array_size(toks), 8);
    assert_int_equal(json_array_size(tlp), 8);
    assert_int_equal(json_array_size(top), 8);
    assert_int_equal(json_array_size(off), 8);
    assert_int_equal(json_integer_value(json_array_get(off, 0)), strlen(PROMPT));
    char joined[1024] = "";
    for (size_t i = 0; i < 8; i++) {
        double l = json_number_value(json_array_get(tlp, i));
        assert_true(l <= 0);
        json_t *t = json_array_get(top, i);
        assert_true(json_object_size(t) >= 1 && json_object_size(t) <= 3);
        /* greedy: the sampled token is the most likely one */
        const char *k;
        json_t *v;
        double best = -INFINITY;
        json_object_foreach(t, k, v) best = fmax(best, json_number_value(v));
        assert_true(fabs(best - l) < 1e-6);
        if (i) assert_true(json_integer_value(json_array_get(off, i)) >= json_integer_value(json_array_get(off, i - 1)));
        strncat(joined, json_string_value(json_array_get(toks, i)), sizeof joined - strlen(joined) - 1);
    }
    assert_string_equal(joined, json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text")));
    json_decref(j);
}

/* presence_penalty and frequency_penalty reach the sampler through HTTP: at
 * temperature 0 the 40-token greedy text repeats tokens (its second "."
 * comes after token 24, so GREEDY's 24 tokens would change under neither
 * penalty), and either penalty alone changes it, the same penalized request
 * giving the same text again (a deterministic sampler, not noise). A
 * value out of OpenAI's [-2, 2] or not a number is a 400 naming the
 * field, on both endpoints. */
static void test_penalties(void **state) {
    (void)state;
    const char *req = "{\"prompt\":\"" PROMPT "\",\"max_tokens\":40,\"temperature\":0";
    char body[512];
    snprintf(body, sizeof body, "%s}", req);
    json_t *plain = post_ok(&S, "/v1/completions", body);
    const char *tp = jstr(json_array_get(json_object_get(plain, "choices"), 0), "text", NULL);
    static const char *const names[] = {"presence_penalty", "frequency_penalty"};
    for (size_t i = 0; i < 2; i++) {
        snprintf(body, sizeof body, "%s,\"%s\":2}", req, names[i]);
        json_t *a = post_ok(&S, "/v1/completions", body), *b = post_ok(&S, "/v1/completions", body);
        const char *ta = jstr(json_array_get(json_object_get(a, "choices"), 0), "text", NULL);
        const char *tb = jstr(json_array_get(json_object_get(b, "choices"), 0), "text", NULL);
        printf("  %s 2: '%s'\n", names[i], ta);
        if (!strcmp(ta, tp)) fail_msg("%s 2 left the greedy text as it was: '%s'", names[i], ta);
        assert_string_equal(ta, tb);
        json_decref(a), json_decref(b);
        char msg[128];
        snprintf(body, sizeof body, "{\"prompt\":\"x\",\"%s\":2.5}", names[i]);
        snprintf(msg, sizeof msg, "'%s' is 2.5; it must be between -2 and 2", names[i]);
        expect_error(&S, "/v1/completions", body, 400, msg);
        snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"%s\":-3}", names[i]);
        snprintf(msg, sizeof msg, "'%s' is -3; it must be between -2 and 2", names[i]);
        expect_error(&S, "/v1/chat/completions", body, 400, msg);
        snprintf(body, sizeof body, "{\"prompt\":\"x\",\"%s\":\"high\"}", names[i]);
        snprintf(msg, sizeof msg, "'%s' must be a number", names[i]);
        expect_error(&S, "/v1/completions", body, 400, msg);
    }
    printf("  without: '%s'\n", tp);
    json_decref(plain);
}

/* ---- chat ---- */

#define CHAT_MSGS "\"messages\":[{\"role\":\"system\",\"content\":\"Tell a story.\"},{\"role\":\"user\",\"content\":\"Once\"}]"

static void test_chat_stream_equals_plain(void **state) {
    (void)state;
    json_t *j = post_ok(&S, "/v1/chat/completions", "{" CHAT_MSGS ",\"max_tokens\":16,\"temperature\":0}");
    assert_string_equal(jstr(j, "object", NULL), "chat.completion");
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(jstr(c0, "message", "role"), "assistant");
    const char *plain = jstr(c0, "message", "content");
    assert_non_null(plain);
    assert_true(json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens")) > 5);

    reply r = post(&S, "/v1/chat/completions", "{" CHAT_MSGS ",\"max_tokens\":16,\"temperature\":0,\"stream\":true}");
    assert_int_equal(r.status, 200);
    json_t *ev = sse_events(r.body);
    char text[4096] = "";
    size_t i, n = json_array_size(ev);
    json_t *e;
    assert_true(n >= 2);
    json_array_foreach(ev, i, e) {
        assert_string_equal(jstr(e, "object", NULL), "chat.completion.chunk");
        json_t *c = json_array_get(json_object_get(e, "choices"), 0), *delta = json_object_get(c, "delta");
        if (i == 0) assert_string_equal(jstr(delta, "role", NULL), "assistant");
        else assert_null(json_object_get(delta, "role"));
        if (jstr(delta, "content", NULL)) strncat(text, jstr(delta, "content", NULL), sizeof text - strlen(text) - 1);
        if (i + 1 == n) assert_string_equal(json_string_value(json_object_get(c, "finish_reason")), json_string_value(json_object_get(c0, "finish_reason")));
        else assert_true(json_is_null(json_object_get(c, "finish_reason")));
    }
    assert_string_equal(text, plain);
    json_decref(ev);
    free(r.body);
    json_decref(j);
}

static void test_chat_n2_logprobs(void **state) {
    (void)state;
    json_t *j = post_ok(&S, "/v1/chat/completions",
                        "{" CHAT_MSGS ",\"max_tokens\":8,\"temperature\":0,\"n\":2,\"logprobs\":true,\"top_logprobs\":4}");
    json_t *ch = json_object_get(j, "choices");
    assert_int_equal(json_array_size(ch), 2);
    json_t *a = json_array_get(ch, 0), *b = json_array_get(ch, 1);
    assert_int_equal(json_integer_value(json_object_get(a, "index")), 0);
    assert_int_equal(json_integer_value(json_object_get(b, "index")), 1);
    assert_string_equal(jstr(a, "message", "content"), jstr(b, "message", "content"));
    json_t *content = json_object_get(json_object_get(a, "logprobs"), "content");
    long long completion = json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens"));
    assert_int_equal(completion, 2 * json_array_size(content)); /* both choices count */
    size_t i;
    json_t *item;
    json_array_foreach(content, i, item) {
        json_t *top = json_object_get(item, "top_logprobs");
        assert_int_equal(json_array_size(top), 4);
        assert_true(json_is_array(json_object_get(item, "bytes")));
        for (size_t k = 1; k < 4; k++)
            assert_true(json_number_value(json_object_get(json_array_get(top, k - 1), "logprob")) >=
                        json_number_value(json_object_get(json_array_get(top, k), "logprob")));
        assert_true(fabs(json_number_value(json_object_get(json_array_get(top, 0), "logprob")) -
                         json_number_value(json_object_get(item, "logprob"))) < 1e-6);
    }
    json_decref(j);
}

/* ---- other endpoints ---- */

static void test_health_models_metrics(void **state) {
    (void)state;
    reply r = get(&S, "/health");
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"ok\""));
    free(r.body);
    r = get(&S, "/v1/models");
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"stories260K.gguf\""));
    free(r.body);
    /* one model: its own name, and any other, retrieve it (no --strict-model-names) */
    const char *ids[] = {"/v1/models/stories260K.gguf", "/v1/models/gpt-4o", "/v1/models/Org/Repo:Q4_K_M"};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        r = get(&S, ids[i]);
        assert_int_equal(r.status, 200);
        assert_non_null(strstr(r.body, "\"id\":\"stories260K.gguf\""));
        assert_non_null(strstr(r.body, "\"object\":\"model\""));
        free(r.body);
    }
    r = get(&S, "/v1/models/");
    assert_int_equal(r.status, 404);
    free(r.body);
    r = get(&S, "/v1/models/%FF"); /* an id that is not UTF-8 */
    assert_int_equal(r.status, 404);
    assert_non_null(strstr(r.body, "not UTF-8"));
    free(r.body);
    r = http_full(&S, "POST", "/v1/models/stories260K.gguf", "{}", 2, NULL);
    assert_int_equal(r.status, 405);
    free(r.body);
    r = get(&S, "/metrics");
    assert_int_equal(r.status, 200);
    const char *families[] = {"kettle_http_requests_total{endpoint=\"health\",status=\"200\"} ",
                              "kettle_prompt_tokens_total ", "kettle_generated_tokens_total ",
                              "kettle_time_to_first_token_seconds_bucket{le=\"+Inf\"} ",
                              "kettle_time_to_first_token_seconds_sum ", "kettle_time_to_first_token_seconds_count ",
                              "kettle_inter_token_latency_seconds_bucket{le=\"+Inf\"} ", "kettle_queue_depth ",
                              "kettle_running_sequences ", "kettle_kv_blocks_used ", "kettle_kv_blocks_free ",
                              "kettle_kv_blocks_total ", "process_resident_memory_bytes "};
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (!strstr(r.body, families[i])) fail_msg("/metrics lacks %s:\n%s", families[i], r.body);
    const char *rss = strstr(r.body, "\nprocess_resident_memory_bytes ");
    assert_true(rss && atof(rss + 31) > 1e6); /* a loaded model: more than a megabyte resident */
    free(r.body);
}

/* method (GET or HEAD) path: the reply, and its Content-Type into type. */
static reply fetch_typed(const server *s, const char *method, const char *path, char *type, size_t cap) {
    reply r = {0};
    CURL *c = make_easy(s, method, path, NULL, 0, NULL, &r);
    if (!strcmp(method, "HEAD")) curl_easy_setopt(c, CURLOPT_NOBODY, 1L); /* else curl waits for the body */
    CURLcode rc = curl_easy_perform(c);
    if (rc != CURLE_OK) fail_msg("%s %s: %s", method, path, curl_easy_strerror(rc));
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
    const char *ct = NULL;
    curl_easy_getinfo(c, CURLINFO_CONTENT_TYPE, &ct);
    snprintf(type, cap, "%s", ct ? ct : "");
    curl_easy_cleanup(c);
    if (!r.body) r.body = calloc(1, 1);
    return r;
}

/* The built-in chat page: / and its files with their types, HEAD without
 * a body, other methods 405; --no-webui makes / a 404 (tests/js/webui_e2e.mjs
 * drives the page itself in Chromium). */
/* /v1/embeddings: refused on the shared server (a generator started
 * without --embeddings), answered with --embeddings, every bad input a
 * 400 naming it; a vector is unit length, base64 decodes to the floats. */
static void test_embeddings(void **state) {
    (void)state;
    const char *E = "/v1/embeddings";
    expect_error(&S, E, "{\"input\": \"hi\"}", 400, "start kettle serve with --embeddings");
    server es = start_server("embeddings.log", "--embeddings=last");
    json_t *j = post_ok(&es, E, "{\"input\": [\"Once upon a time\", [1, 403]], \"encoding_format\": \"float\"}");
    json_t *data = json_object_get(j, "data");
    assert_int_equal(json_array_size(data), 2);
    json_t *v = json_object_get(json_array_get(data, 0), "embedding");
    assert_int_equal(json_array_size(v), 64);
    double norm = 0;
    for (size_t i = 0; i < 64; i++) norm += json_real_value(json_array_get(v, i)) * json_real_value(json_array_get(v, i));
    assert_true(fabs(norm - 1) < 1e-5);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens")), 5 + 2);
    json_t *b = post_ok(&es, E, "{\"input\": \"Once upon a time\", \"encoding_format\": \"base64\"}");
    const char *b64 = json_string_value(json_object_get(json_array_get(json_object_get(b, "data"), 0), "embedding"));
    assert_non_null(b64);
    assert_int_equal(strlen(b64), (64 * 4 + 2) / 3 * 4);
    /* the first float, decoded by hand: 4 bytes from the first 8 characters (6 bytes) */
    static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    unsigned char raw[6];
    for (int g = 0; g < 2; g++) {
        unsigned x = 0;
        for (int k = 0; k < 4; k++) x = x << 6 | (unsigned)(strchr(A, b64[g * 4 + k]) - A);
        raw[g * 3] = (unsigned char)(x >> 16), raw[g * 3 + 1] = (unsigned char)(x >> 8), raw[g * 3 + 2] = (unsigned char)x;
    }
    float f0;
    memcpy(&f0, raw, 4);
    assert_true(fabs(f0 - json_real_value(json_array_get(v, 0))) < 1e-7);
    json_decref(b), json_decref(j);
    expect_error(&es, E, "{}", 400, "'input' is required");
    expect_error(&es, E, "{\"input\": \"\"}", 400, "'input[0]' is empty");
    expect_error(&es, E, "{\"input\": [[1, 99999]]}", 400, "not a token id");
    expect_error(&es, E, "{\"input\": [true]}", 400, "'input[0]' must be");
    expect_error(&es, E, "{\"input\": \"x\", \"dimensions\": 3}", 400, "64 dimensions");
    expect_error(&es, E, "{\"input\": \"x\", \"encoding_format\": \"int8\"}", 400, "encoding_format");
    expect_error(&es, E, "{\"input\": \"x\", \"pooling\": \"max\"}", 400, "'pooling' is not a parameter");
    stop_server(&es);
}

static void test_webui(void **state) {
    (void)state;
    char type[128];
    reply r = fetch_typed(&S, "GET", "/", type, sizeof type);
    assert_int_equal(r.status, 200);
    assert_string_equal(type, "text/html; charset=utf-8");
    assert_non_null(strstr(r.body, "<!doctype html>"));
    assert_non_null(strstr(r.body, "app.js"));
    free(r.body);
    const char *files[][2] = {{"/index.html", "text/html"}, {"/app.js", "text/javascript"}, {"/app.css", "text/css"}};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        r = fetch_typed(&S, "GET", files[i][0], type, sizeof type);
        assert_int_equal(r.status, 200);
        assert_true(r.len > 100);
        assert_non_null(strstr(type, files[i][1]));
        free(r.body);
    }
    r = fetch_typed(&S, "HEAD", "/", type, sizeof type);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.len, 0);
    free(r.body);
    r = http_full(&S, "POST", "/", "{}", 2, NULL);
    assert_int_equal(r.status, 405);
    free(r.body);
    r = get(&S, "/app.jsx");
    assert_int_equal(r.status, 404);
    free(r.body);
    server off = start_server("serve-no-webui.log", "--chat-template chatml --ctx 256 --no-webui");
    r = get(&off, "/");
    assert_int_equal(r.status, 404);
    free(r.body);
    r = get(&off, "/health");
    assert_int_equal(r.status, 200);
    free(r.body);
    stop_server(&off);
}

static void test_tokenize_roundtrip(void **state) {
    (void)state;
    json_t *t = post_ok(&S, "/tokenize", "{\"content\":\"Hello world, again.\",\"add_special\":false}");
    json_t *toks = json_object_get(t, "tokens");
    assert_true(json_array_size(toks) >= 3);
    json_t *body = json_pack("{s:O}", "tokens", toks);
    char *s = json_dumps(body, JSON_COMPACT);
    json_t *d = post_ok(&S, "/detokenize", s);
    assert_string_equal(jstr(d, "content", NULL), "Hello world, again.");
    free(s);
    json_decref(body), json_decref(t), json_decref(d);
}

/* ---- errors ---- */

/* An error's message and code, whichever API's shape it has. */
static void expect_api_error(const server *s, const char *path, const char *body, const char *code, const char *msg) {
    reply r = post(s, path, body);
    json_t *j = parse(r.body), *err = json_object_get(j, "error");
    const char *m = json_string_value(json_object_get(err, "message"));
    const char *c = json_string_value(json_object_get(err, "code"));
    if (r.status != 400 || !m || !strstr(m, msg) || (code && (!c || strcmp(c, code))))
        fail_msg("POST %s: %ld %s (want 400, code %s, '%s')", path, r.status, r.body, code ? code : "-", msg);
    json_decref(j);
    free(r.body);
}

/* The message_start of a /v1/messages stream: its usage's field `key`. */
static long long message_start_usage(const char *body, const char *key) {
    const char *at = strstr(body, "event: message_start\ndata: ");
    assert_non_null(at);
    at += strlen("event: message_start\ndata: ");
    char *line = strndup(at, strcspn(at, "\n"));
    json_t *j = parse(line);
    long long v = json_integer_value(json_object_get(json_object_get(json_object_get(j, "message"), "usage"), key));
    json_decref(j), free(line);
    return v;
}

/* A Messages stream's message_start says how much of the prompt the
 * prefix cache served (it said 0 always: it went out before the engine
 * had looked); message_delta's usage agrees. */
static void test_messages_stream_cache_usage(void **state) {
    (void)state;
    char body[2048];
    snprintf(body, sizeof body, "{\"max_tokens\":4,\"stream\":true,\"temperature\":0,\"messages\":[{\"role\":\"user\","
             "\"content\":\"%s %s %s\"}]}", PROMPT, PROMPT, PROMPT);
    reply first = post(&S, "/v1/messages", body), second = post(&S, "/v1/messages", body);
    assert_int_equal(first.status, 200);
    assert_int_equal(second.status, 200);
    long long cached = message_start_usage(second.body, "cache_read_input_tokens");
    if (cached <= 0) fail_msg("the repeated prompt's message_start reports %lld cached tokens:\n%.600s", cached, second.body);
    assert_non_null(strstr(second.body, "\"cache_read_input_tokens\":"));
    const char *delta = strstr(second.body, "event: message_delta");
    assert_non_null(delta);
    char want[64];
    snprintf(want, sizeof want, "\"cache_read_input_tokens\":%lld", cached);
    assert_non_null(strstr(delta, want));
    free(first.body), free(second.body);
}

/* max_tokens past the room the context leaves is cut to it and the reply
 * ends at "length" (agent clients ask for 32000 or 64000 whatever the
 * model); --strict-max-tokens refuses it. A prompt that does not fit, or
 * a strict refusal, is told in each API's own words, the ones clients'
 * recovery paths match. */
static void test_max_tokens_room(void **state) {
    (void)state;
    json_t *j = post_ok(&S, "/v1/completions",
                        "{\"prompt\":\"" PROMPT "\",\"max_tokens\":100000,\"temperature\":0,\"ignore_eos\":true}");
    json_t *u = json_object_get(j, "usage");
    assert_string_equal(jstr(json_array_get(json_object_get(j, "choices"), 0), "finish_reason", NULL), "length");
    assert_int_equal(json_integer_value(json_object_get(u, "prompt_tokens")) +
                         json_integer_value(json_object_get(u, "completion_tokens")), 256);
    json_decref(j);
    j = post_ok(&S, "/v1/messages",
                "{\"max_tokens\":64000,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"temperature\":0}");
    assert_string_equal(json_string_value(json_object_get(j, "type")), "message");
    json_decref(j);
    /* the prompt does not fit: OpenAI's code and wording, Anthropic's "prompt is too long" */
    char big[4096] = "{\"messages\":[{\"role\":\"user\",\"content\":\"";
    for (int i = 0; i < 300; i++) strcat(big, "ab ");
    strcat(big, "\"}],\"max_tokens\":8}");
    expect_api_error(&S, "/v1/chat/completions", big, "context_length_exceeded",
                     "This model's maximum context length is 256 tokens. However, your messages resulted in");
    reply r = post(&S, "/v1/messages", big);
    assert_int_equal(r.status, 400);
    assert_non_null(strstr(r.body, "\"message\":\"prompt is too long: "));
    assert_non_null(strstr(r.body, " tokens > 255 maximum\""));
    assert_non_null(strstr(r.body, "\"type\":\"invalid_request_error\""));
    free(r.body);
    server strict = start_server("serve-strict-max.log", "--chat-template chatml --ctx 256 --strict-max-tokens");
    expect_api_error(&strict, "/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":100000}", "context_length_exceeded",
                     "This model's maximum context length is 256 tokens. However, you requested");
    r = post(&strict, "/v1/messages", "{\"max_tokens\":64000,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
    assert_int_equal(r.status, 400);
    assert_non_null(strstr(r.body, "input length and `max_tokens` exceed context limit: "));
    assert_non_null(strstr(r.body, " + 64000 > 256"));
    free(r.body);
    json_decref(post_ok(&strict, "/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":8}"));
    stop_server(&strict);
}

static void test_errors(void **state) {
    (void)state;
    const char *C = "/v1/completions", *CH = "/v1/chat/completions";
    expect_error(&S, C, "{\"prompt\": ", 400, "malformed JSON");
    expect_error(&S, C, "[1,2]", 400, "JSON object");
    expect_error(&S, C, "{\"prompt\": 7}", 400, "'prompt' must be a string");
    expect_error(&S, C, "{\"prompt\":\"x\",\"temperature\":\"hot\"}", 400, "'temperature' must be a number");
    expect_error(&S, C, "{\"prompt\":\"x\",\"max_tokens\":\"5\"}", 400, "'max_tokens' must be an integer");
    expect_error(&S, C, "{\"prompt\":\"x\",\"n\":99}", 400, "'n' is 99");
    expect_error(&S, C, "{\"prompt\":\"x\",\"stop\":[1]}", 400, "'stop[0]' must be a string");
    expect_error(&S, C, "{\"prompt\":\"x\",\"logit_bias\":{\"abc\":1}}", 400, "not a token id");
    expect_error(&S, C, "{\"prompt\":[\"a\",\"b\"]}", 400, "not supported");
    expect_error(&S, C, "{\"prompt\":\"x\",\"model\":7}", 400, "'model' must be a string");
    expect_error(&S, CH, "{\"messages\":\"hi\"}", 400, "'messages' must be a non-empty array");
    expect_error(&S, CH, "{\"messages\":[{\"content\":\"hi\"}]}", 400, "'messages[0].role'");
    /* invalid UTF-8 inside a string */
    reply r = http_full(&S, "POST", C, "{\"prompt\":\"\xff\xfe\"}", 14, NULL);
    assert_int_equal(r.status, 400);
    assert_non_null(strstr(r.body, "UTF-8"));
    free(r.body);
    /* a prompt longer than the context (256): the message gives both numbers */
    size_t n = 4000;
    char *big = malloc(n + 64);
    strcpy(big, "{\"prompt\":\"");
    for (size_t i = 0; i < 600; i++) strcat(big, "a b ");
    strcat(big, "\"}");
    r = post(&S, C, big);
    assert_int_equal(r.status, 400);
    assert_non_null(strstr(r.body, "256"));
    assert_non_null(strstr(r.body, "context"));
    free(r.body), free(big);
    /* a body over the 8 MiB limit */
    size_t huge = (8u << 20) + 100;
    char *h = malloc(huge);
    memset(h, ' ', huge);
    r = http_full(&S, "POST", C, h, huge, NULL);
    assert_int_equal(r.status, 413);
    free(r.body), free(h);
    r = get(&S, "/v2/nothing");
    assert_int_equal(r.status, 404);
    assert_non_null(strstr(r.body, "/v2/nothing"));
    free(r.body);
    r = http_full(&S, "DELETE", "/v1/models", NULL, 0, NULL);
    assert_int_equal(r.status, 405);
    free(r.body);
    r = get(&S, "/v1/completions");
    assert_int_equal(r.status, 405);
    free(r.body);
}

/* ---- a client that leaves mid-stream ---- */

static long long metric(const server *s, const char *name) {
    reply r = get(s, "/metrics");
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = strstr(r.body, key);
    long long v = p ? atoll(p + strlen(key)) : -1;
    free(r.body);
    return v;
}

/* A stream whose client hangs up after its first bytes is cancelled and
 * its KV freed. Its own server with a long context, and a request that
 * cannot end by itself for seconds (ignore_eos, 32,000 tokens), so it is
 * surely still running at the hang-up. test_server_held.c checks every
 * stage, step by step. */
static void test_disconnect_frees_kv(void **state) {
    (void)state;
    server s = start_server("serve-disconnect.log", "--parallel 1 --ctx 32768");
    const char *body = "{\"prompt\":\"" PROMPT "\",\"max_tokens\":32000,\"temperature\":1,\"stream\":true,\"ignore_eos\":true}";
    reply r = {.abort_after = 1};
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    CURL *c = make_easy(&s, "POST", "/v1/completions", body, strlen(body), h, &r);
    CURLcode rc = curl_easy_perform(c);
    assert_int_equal(rc, CURLE_WRITE_ERROR); /* we hung up */
    curl_easy_cleanup(c);
    curl_slist_free_all(h);
    free(r.body);
    long long used = -1, running = -1;
    for (int i = 0; i < 100; i++) { /* 5 s */
        used = metric(&s, "kettle_kv_blocks_used"), running = metric(&s, "kettle_running_sequences");
        if (used == 0 && running == 0) break;
        sleep_ms(50);
    }
    assert_int_equal(used, 0);
    assert_int_equal(running, 0);
    assert_int_equal(metric(&s, "kettle_requests_finished_total{reason=\"cancelled\"}"), 1);
    assert_int_equal(metric(&s, "kettle_requests_finished_total{reason=\"length\"}"), 0);
    stop_server(&s);
}

/* ---- servers of their own ---- */

/* A template file that shows the tools it is given. */
static const char *tools_template(void) {
    static char path[512];
    snprintf(path, sizeof path, "%s", tu_tmp("tools.jinja"));
    const char *t = "{% for t in tools %}[tool {{ t.function.name }}]{% endfor %}"
                    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:";
    assert_int_equal(tu_write_file(path, t, strlen(t)), 0);
    return path;
}

static long long prompt_tokens(const server *s, const char *body) {
    reply r = http_full(s, "POST", "/v1/chat/completions", body, strlen(body), "Authorization: Bearer sekrit");
    if (r.status != 200) fail_msg("%ld %s", r.status, r.body);
    json_t *j = parse(r.body);
    long long n = json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens"));
    json_decref(j);
    free(r.body);
    return n;
}

/* --api-key, --alias (twice), --strict-model-names and a template file
 * that gets the request's tools. */
static void test_api_key_alias_tools(void **state) {
    (void)state;
    char args[1024];
    snprintf(args, sizeof args, "--api-key sekrit --alias tiny --alias org/tiny:Q8 --strict-model-names --log-requests "
             "--chat-template %s", tools_template());
    server s = start_server("serve-key.log", args);
    long long plain = prompt_tokens(&s, "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":1}");
    long long tools = prompt_tokens(&s, "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":1,"
                                        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{}}}]}");
    assert_true(tools > plain + 2); /* "[tool get_weather]" reached the prompt */
    reply r = get(&s, "/v1/models");
    assert_int_equal(r.status, 401);
    assert_non_null(strstr(r.body, "API key"));
    free(r.body);
    r = http_full(&s, "GET", "/v1/models", NULL, 0, "Authorization: Bearer wrong");
    assert_int_equal(r.status, 401);
    free(r.body);
    r = get(&s, "/"); /* the chat page is static: no key needed (its API calls need one) */
    assert_int_equal(r.status, 200);
    free(r.body);
    r = http_full(&s, "GET", "/v1/models", NULL, 0, "Authorization: Bearer sekrit");
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"tiny\""));
    assert_non_null(strstr(r.body, "\"org/tiny:Q8\""));
    assert_non_null(strstr(r.body, "\"stories260K.gguf\"")); /* the file's name stays */
    free(r.body);
    r = http_full(&s, "GET", "/v1/models/org/tiny:Q8", NULL, 0, "Authorization: Bearer sekrit");
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"id\":\"org/tiny:Q8\""));
    free(r.body);
    /* strict: another name is a 404 naming it and every served name, for a request and for retrieve */
    const char *chat = "{\"model\":\"gpt-9\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":1}";
    r = http_full(&s, "POST", "/v1/chat/completions", chat, strlen(chat), "Authorization: Bearer sekrit");
    assert_int_equal(r.status, 404);
    assert_non_null(strstr(r.body, "model_not_found"));
    assert_non_null(strstr(r.body, "gpt-9") && strstr(r.body, "'tiny'") && strstr(r.body, "'org/tiny:Q8'"));
    free(r.body);
    r = http_full(&s, "GET", "/v1/models/gpt-9", NULL, 0, "Authorization: Bearer sekrit");
    assert_int_equal(r.status, 404);
    assert_non_null(strstr(r.body, "model_not_found"));
    free(r.body);
    r = get(&s, "/health");
    assert_int_equal(r.status, 200);
    free(r.body);
    /* the other APIs' generation requests, for the log below */
    const char *dialects[][2] = {{"/v1/responses", "{\"model\":\"tiny\",\"input\":\"hi\",\"max_output_tokens\":1}"},
                                 {"/v1/messages", "{\"model\":\"tiny\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\","
                                                  "\"content\":\"hi\"}]}"}};
    for (int i = 0; i < 2; i++) {
        r = http_full(&s, "POST", dialects[i][0], dialects[i][1], strlen(dialects[i][1]), "Authorization: Bearer sekrit");
        assert_int_equal(r.status, 200);
        free(r.body);
    }
    stop_server(&s);
    /* --log-requests (the text request log, src/server/reqlog.h): a line per
     * request, a generation request's with its model and token counts,
     * whichever API it came in */
    char *log = tu_read_file(s.log, NULL);
    assert_non_null(log);
    const char *starts[] = {"Z POST /v1/chat/completions 200 model=\"tiny\" prompt=",
                            "Z POST /v1/responses 200 model=\"tiny\" prompt=", "Z POST /v1/messages 200 model=\"tiny\" prompt="};
    for (int i = 0; i < 3; i++) {
        const char *line = strstr(log, starts[i]);
        const char *eol = line ? strchr(line, '\n') : NULL;
        const char *gen = line ? strstr(line, " generated=1 ttft_ms=") : NULL;
        if (!eol || !gen || gen > eol) fail_msg("no line '%s... generated=1' in the log: %s", starts[i], log);
    }
    if (!strstr(log, "Z GET /v1/models/gpt-9 404 total_ms=")) fail_msg("no request line in the log: %s", log);
    free(log);
}

/* With one sequence at a time and a queue of one, a burst of long
 * requests gets 503 + Retry-After for the ones that do not fit. */
static void test_queue_full(void **state) {
    (void)state;
    server s = start_server("serve-busy.log", "--parallel 1 --queue 1 --ctx 512");
    enum { N = 6 };
    const char *body = "{\"prompt\":\"" PROMPT "\",\"max_tokens\":400,\"temperature\":1,\"logit_bias\":{\"2\":-100}}";
    reply r[N] = {{0}};
    CURL *easy[N];
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    CURLM *multi = curl_multi_init();
    for (int i = 0; i < N; i++) {
        easy[i] = make_easy(&s, "POST", "/v1/completions", body, strlen(body), h, &r[i]);
        curl_multi_add_handle(multi, easy[i]);
    }
    int running = 1;
    while (running) {
        curl_multi_perform(multi, &running);
        if (running) curl_multi_poll(multi, NULL, 0, 100, NULL);
    }
    int busy = 0, ok = 0;
    for (int i = 0; i < N; i++) {
        curl_easy_getinfo(easy[i], CURLINFO_RESPONSE_CODE, &r[i].status);
        if (r[i].status == 503) {
            busy++;
            assert_string_equal(r[i].retry_after, "1");
            assert_non_null(strstr(r[i].body, "\"error\""));
        }
        if (r[i].status == 200) ok++;
        curl_multi_remove_handle(multi, easy[i]);
        curl_easy_cleanup(easy[i]);
        free(r[i].body);
    }
    curl_multi_cleanup(multi);
    curl_slist_free_all(h);
    assert_true(ok >= 1);
    assert_true(busy >= 1);
    assert_int_equal(ok + busy, N);
    stop_server(&s);
}

/* The text of a completions stream: the deltas joined. */
static char *stream_text(const char *body) {
    json_t *events = sse_events(body);
    size_t cap = 1, n = 0;
    char *text = calloc(1, cap);
    assert_non_null(text);
    size_t i;
    json_t *ev;
    json_array_foreach(events, i, ev) {
        const char *t = json_string_value(json_object_get(json_array_get(json_object_get(ev, "choices"), 0), "text"));
        if (!t) continue;
        size_t add = strlen(t);
        text = realloc(text, cap = n + add + 1);
        assert_non_null(text);
        memcpy(text + n, t, add + 1);
        n += add;
    }
    json_decref(events);
    return text;
}

/* 16 streaming requests at once, temperature 0, different prompts: each
 * one's text is exactly what it produces alone. */
static void test_sixteen_concurrent_streams(void **state) {
    (void)state;
    enum { N = 16 };
    static const char *const PROMPTS16[N] = {
        "Once upon a time", "Lily had a red ball", "The cat sat on the mat", "Tom was sad because",
        "One day, a little bird", "The sun was hot and", "Mom said to Ben", "There was a big tree",
        "The dog ran to the park", "Sue liked to paint", "A boy found a box", "The fish swam fast",
        "It was a rainy day", "Max and Mia played", "The king had a crown", "At night the stars",
    };
    char bodies[N][256], *alone[N];
    for (int i = 0; i < N; i++) {
        snprintf(bodies[i], sizeof bodies[i],
                 "{\"prompt\":\"%s\",\"max_tokens\":40,\"temperature\":0,\"stream\":true}", PROMPTS16[i]);
        reply r = post(&S, "/v1/completions", bodies[i]);
        assert_int_equal(r.status, 200);
        alone[i] = stream_text(r.body);
        free(r.body);
    }
    reply r[N];
    memset(r, 0, sizeof r);
    CURL *easy[N];
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    CURLM *multi = curl_multi_init();
    for (int i = 0; i < N; i++) {
        easy[i] = make_easy(&S, "POST", "/v1/completions", bodies[i], strlen(bodies[i]), h, &r[i]);
        curl_multi_add_handle(multi, easy[i]);
    }
    int running = 1;
    while (running) {
        curl_multi_perform(multi, &running);
        if (running) curl_multi_poll(multi, NULL, 0, 100, NULL);
    }
    int distinct = 0;
    for (int i = 0; i < N; i++) {
        curl_easy_getinfo(easy[i], CURLINFO_RESPONSE_CODE, &r[i].status);
        assert_int_equal(r[i].status, 200);
        char *together = stream_text(r[i].body);
        assert_true(strlen(alone[i]) > 0);
        assert_string_equal(together, alone[i]);
        distinct += i > 0 && strcmp(alone[i], alone[0]) != 0;
        free(together);
        curl_multi_remove_handle(multi, easy[i]);
        curl_easy_cleanup(easy[i]);
        free(r[i].body);
    }
    assert_true(distinct >= 8);
    for (int i = 0; i < N; i++) free(alone[i]);
    curl_multi_cleanup(multi);
    curl_slist_free_all(h);
}

/* Threads of process pid (from /proc), or -1. */
static int thread_count(pid_t pid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    int n = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "Threads:", 8)) n = atoi(line + 8);
    if (f) fclose(f);
    return n;
}

/* 120 streams open at once (16 decoding, the rest waiting, suspended):
 * the server holds them with a handful of threads, and every one ends
 * with [DONE]. */
static void test_many_open_streams(void **state) {
    (void)state;
    enum { N = 120 };
    server s = start_server("serve-many.log", "--parallel 16 --queue 128 --ctx 256 --itl-stretch 1.5");
    const char *body = "{\"prompt\":\"" PROMPT "\",\"max_tokens\":60,\"temperature\":0,\"stream\":true,\"ignore_eos\":true}";
    static reply r[N];
    memset(r, 0, sizeof r);
    CURL *easy[N];
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    CURLM *multi = curl_multi_init();
    for (int i = 0; i < N; i++) {
        easy[i] = make_easy(&s, "POST", "/v1/completions", body, strlen(body), h, &r[i]);
        curl_multi_add_handle(multi, easy[i]);
    }
    int running = 1, max_threads = 0, polls = 0;
    while (running) {
        curl_multi_perform(multi, &running);
        if (running) curl_multi_poll(multi, NULL, 0, 20, NULL);
        int t = thread_count(s.pid);
        max_threads = t > max_threads ? t : max_threads;
        polls++;
    }
    for (int i = 0; i < N; i++) {
        curl_easy_getinfo(easy[i], CURLINFO_RESPONSE_CODE, &r[i].status);
        assert_int_equal(r[i].status, 200);
        assert_non_null(strstr(r[i].body, "data: [DONE]"));
        curl_multi_remove_handle(multi, easy[i]);
        curl_easy_cleanup(easy[i]);
        free(r[i].body);
    }
    curl_multi_cleanup(multi);
    curl_slist_free_all(h);
    /* main + engine + MHD's pool (4) and its listener; -t 1: no workers */
    assert_true(max_threads > 0 && polls > 0);
    print_message("%d open streams: at most %d server threads\n", N, max_threads);
    if (max_threads > 12) fail_msg("%d threads for %d open streams", max_threads, N);
    stop_server(&s);
}

/* Bad command-line values are refused before anything starts. */
static void test_bad_options(void **state) {
    (void)state;
    static const char *const CASES[][2] = {
        {"--itl-stretch -1", "--itl-stretch"}, {"--itl-stretch fast", "--itl-stretch"},
        {"--kv-type q4", "--kv-type"}, {"--parallel 0", "--parallel"}, {"--load disk", "--load"},
    };
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        char cmd[1024], *out = NULL, *err = NULL;
        snprintf(cmd, sizeof cmd, "%s serve -m %s --port 0 %s", KT_BIN, tu_shared("models/stories260K.gguf"), CASES[i][0]);
        int rc = tu_run(cmd, &out, &err);
        if (rc != 2 || !err || !strstr(err, CASES[i][1])) fail_msg("%s: exit %d, stderr '%s'", CASES[i][0], rc, err ? err : "");
        free(out), free(err);
    }
}

/* `kettle serve --help` names every route the server answers: it lists
 * them from the server's own table (srv_route_at), and this keeps it so. */
static void test_help_lists_routes(void **state) {
    (void)state;
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s serve --help", KT_BIN);
    assert_int_equal(tu_run(cmd, &out, NULL), 0);
    const char *list = strstr(out, "Endpoints:"), *path, *method;
    assert_non_null(list);
    size_t n = 0;
    for (; srv_route_at(n, &path, &method); n++) {
        bool found = false; /* whole: /v1/messages is not /v1/messages/count_tokens */
        for (const char *p = strstr(list, path); p && !found; p = strstr(p + 1, path))
            found = p[strlen(path)] && strchr(",\n ", p[strlen(path)]);
        if (!found) fail_msg("kettle serve --help does not list %s %s:\n%s", method, path, list);
    }
    assert_int_equal(n, 13);
    static const char *const NAMED[] = {"/v1/responses", "/v1/messages", "/v1/embeddings"}; /* once left out */
    for (size_t i = 0; i < sizeof NAMED / sizeof NAMED[0]; i++) assert_non_null(strstr(list, NAMED[i]));
    free(out);
}

/* A template that closes every turn with </s> (stories260K's EOS), as
 * chat templates close turns with an end-of-turn token. */
static const char *eos_template(void) {
    static char path[512];
    snprintf(path, sizeof path, "%s", tu_tmp("eos-turns.jinja"));
    const char *t = "{% for m in messages %}{{ m.role }}: {{ m.content }}</s>{% endfor %}"
                    "{% if add_generation_prompt %}assistant: {% endif %}";
    assert_int_equal(tu_write_file(path, t, strlen(t)), 0);
    return path;
}

/* Turn 2 sends turn 1's reply back as an assistant message: its prompt
 * is tokenized with the ids turn 1 sampled (not the reply's text
 * re-tokenized, which differs for a reply sampled at temperature 1.5), so
 * it hits the KV of turn 1's prompt and of every reply token computed. */
static void test_reply_ids_reused(void **state) {
    (void)state;
    char args[600];
    snprintf(args, sizeof args, "--chat-template %s --parallel 2", eos_template());
    server s = start_server("serve-splice.log", args);
    const char *turn1 = "{\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a story about a dog and a cat "
                        "who play in the park\"}],\"max_tokens\":24,\"temperature\":1.5,\"seed\":1,\"ignore_eos\":true}";
    json_t *a = post_ok(&s, "/v1/chat/completions", turn1);
    const char *reply = jstr(json_object_get(json_array_get(json_object_get(a, "choices"), 0), "message"), "content", NULL);
    long long p1 = json_integer_value(json_object_get(json_object_get(a, "usage"), "prompt_tokens"));
    json_t *msgs = json_pack("[{s:s, s:s}, {s:s, s:s}, {s:s, s:s}]", "role", "user", "content",
                             "Tell me a story about a dog and a cat who play in the park", "role", "assistant", "content",
                             reply, "role", "user", "content", "And then?");
    json_t *body = json_pack("{s:O, s:i, s:f}", "messages", msgs, "max_tokens", 4, "temperature", 0.0);
    char *text = json_dumps(body, JSON_COMPACT);
    json_t *b = post_ok(&s, "/v1/chat/completions", text);
    long long cached = cached_tokens_of(json_object_get(b, "usage"));
    /* turn 1 computed its prompt and 23 of its 24 tokens, all reused (the
     * last ones from the partial block turn 1 ended in) */
    assert_int_equal(cached, p1 + 23);
    free(text);
    json_decref(body), json_decref(msgs), json_decref(a), json_decref(b);
    stop_server(&s);
}

/* The content of choice 0 of a chat answer, and its finish_reason. */
static const char *content_of(json_t *a, const char **finish) {
    json_t *c0 = json_array_get(json_object_get(a, "choices"), 0);
    *finish = jstr(c0, "finish_reason", NULL);
    return jstr(json_object_get(c0, "message"), "content", NULL);
}

/* response_format and 'grammar': every answer that stops is valid (a
 * random-weight model at temperature 1, several seeds); what kettle cannot
 * enforce, or cannot parse, is a 400 that says why. */
static void test_structured_output(void **state) {
    (void)state;
    const char *schema = "{\"type\":\"object\",\"properties\":{\"ok\":{\"type\":\"boolean\"},\"color\":{\"enum\":"
                         "[\"red\",\"green\"]},\"n\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":9}},"
                         "\"required\":[\"ok\",\"color\",\"n\"],\"additionalProperties\":false}";
    int stops = 0;
    for (int seed = 1; seed <= 6; seed++) {
        char body[1024];
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"A color?\"}],\"max_tokens\":60,\"temperature\":1,"
                 "\"seed\":%d,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"c\","
                 "\"schema\":%s}}}",
                 seed, schema);
        json_t *a = post_ok(&S, "/v1/chat/completions", body);
        const char *finish, *text = content_of(a, &finish);
        if (!strcmp(finish, "stop")) {
            stops++;
            json_error_t je;
            json_t *v = json_loads(text, 0, &je);
            if (!v) fail_msg("seed %d: not JSON: %s", seed, text);
            assert_true(json_is_boolean(json_object_get(v, "ok")));
            const char *color = jstr(v, "color", NULL);
            assert_true(!strcmp(color, "red") || !strcmp(color, "green"));
            json_int_t n = json_integer_value(json_object_get(v, "n"));
            assert_true(n >= 1 && n <= 9);
            assert_int_equal(json_object_size(v), 3);
            json_decref(v);
        }
        json_decref(a);
    }
    assert_true(stops >= 3); /* the schema leaves little room: most answers end within 60 tokens */
    /* a GBNF grammar, on /v1/completions too */
    json_t *g = post_ok(&S, "/v1/completions",
                        "{\"prompt\":\"Is it?\",\"max_tokens\":8,\"temperature\":1,\"seed\":3,"
                        "\"grammar\":\"root ::= \\\"yes\\\" | \\\"no\\\"\"}");
    json_t *c0 = json_array_get(json_object_get(g, "choices"), 0);
    const char *t = jstr(c0, "text", NULL);
    assert_true(!strcmp(t, "yes") || !strcmp(t, "no"));
    assert_string_equal(jstr(c0, "finish_reason", NULL), "stop");
    json_decref(g);
    /* json_object: any object, and a finished answer parses as one. A story
     * model left to itself writes strings that outlast any max_tokens
     * (every seed tried ends at "length", so nothing would be checked):
     * a bias on '}' (the last token of "}": SentencePiece puts a space
     * piece first) closes the object where the grammar allows it, which
     * is only after a member's value; in strings the grammar still
     * decides. Seed 3 ends with a member in it; the finish reason is
     * asserted, since only a finished answer is checked for parsing. */
    json_t *tk = post_ok(&S, "/tokenize", "{\"content\":\"}\"}");
    json_t *ids = json_object_get(tk, "tokens");
    char body[512];
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":60,\"temperature\":1,"
             "\"seed\":3,\"logit_bias\":{\"%lld\":10},\"response_format\":{\"type\":\"json_object\"}}",
             (long long)json_integer_value(json_array_get(ids, json_array_size(ids) - 1)));
    json_decref(tk);
    json_t *o = post_ok(&S, "/v1/chat/completions", body);
    const char *finish, *text = content_of(o, &finish);
    assert_true(text[0] == '{' || text[0] == ' ' || text[0] == '\n'); /* the object's start, whitespace allowed */
    if (strcmp(finish, "stop")) fail_msg("json_object answer did not finish (%s), nothing to parse: %s", finish, text);
    json_error_t je;
    json_t *v = json_loads(text, 0, &je);
    if (!json_is_object(v) || json_object_size(v) == 0) fail_msg("json_object answer is not a non-empty object: %s", text);
    json_decref(v);
    json_decref(o);
    /* refusals */
    expect_error(&S, "/v1/chat/completions",
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_schema\","
                 "\"json_schema\":{\"name\":\"s\",\"schema\":{\"type\":\"array\",\"uniqueItems\":true}}}}",
                 400, "uniqueItems");
    expect_error(&S, "/v1/completions", "{\"prompt\":\"x\",\"grammar\":\"root ::= \\\"a\"}", 400, "line 1");
    expect_error(&S, "/v1/completions", "{\"prompt\":\"x\",\"grammar\":\"root ::= undefined-rule\"}", 400,
                 "undefined-rule");
    expect_error(&S, "/v1/chat/completions",
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"xml\"}}", 400,
                 "response_format.type");
    expect_error(&S, "/v1/chat/completions",
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_schema\"}}",
                 400, "json_schema");
}

/* --result-cache: a repeated deterministic request is answered from the
 * stored completion (marked), streamed or not, with the same text; a
 * sampled request without a seed, one with logprobs and one with other
 * parameters are not. */
static void test_result_cache(void **state) {
    (void)state;
    server s = start_server("serve-results.log", "--result-cache 8");
    const char *greedy = "{\"prompt\":\"" PROMPT "\",\"max_tokens\":12,\"temperature\":0}";
    reply a = post(&s, "/v1/completions", greedy), b = post(&s, "/v1/completions", greedy);
    assert_int_equal(a.status, 200);
    assert_int_equal(b.status, 200);
    assert_false(a.cache_hit);
    assert_true(b.cache_hit);
    json_t *ja = parse(a.body), *jb = parse(b.body);
    assert_string_equal(jstr(json_array_get(json_object_get(ja, "choices"), 0), "text", NULL),
                        jstr(json_array_get(json_object_get(jb, "choices"), 0), "text", NULL));
    assert_int_equal(cached_tokens_of(json_object_get(jb, "usage")),
                     json_integer_value(json_object_get(json_object_get(jb, "usage"), "prompt_tokens")));
    /* the same request streamed: the stored text as chunks */
    reply c = post(&s, "/v1/completions", "{\"prompt\":\"" PROMPT "\",\"max_tokens\":12,\"temperature\":0,\"stream\":true}");
    assert_true(c.cache_hit);
    json_t *ev = sse_events(c.body);
    {
        char text[512] = "";
        for (size_t i = 0; i < json_array_size(ev); i++) {
            const char *t = jstr(json_array_get(json_object_get(json_array_get(ev, i), "choices"), 0), "text", NULL);
            if (t) strncat(text, t, sizeof text - strlen(text) - 1);
        }
        assert_string_equal(text, jstr(json_array_get(json_object_get(ja, "choices"), 0), "text", NULL));
    }
    json_decref(ev), json_decref(ja), json_decref(jb);
    free(a.body), free(b.body), free(c.body);
    const char *never[] = {
        "{\"prompt\":\"" PROMPT "\",\"max_tokens\":12,\"temperature\":1}",             /* no seed */
        "{\"prompt\":\"" PROMPT "\",\"max_tokens\":12,\"temperature\":0,\"logprobs\":1}", /* logprobs */
        "{\"prompt\":\"" PROMPT "\",\"max_tokens\":11,\"temperature\":0}",             /* other length */
    };
    for (size_t k = 0; k < 3; k++)
        for (int rep = 0; rep < 2; rep++) {
            reply r = post(&s, "/v1/completions", never[k]);
            assert_int_equal(r.status, 200);
            if (r.cache_hit && (k < 2 || rep == 0)) fail_msg("request %zu answered from the cache", k);
            free(r.body);
        }
    /* a seeded sampled request is deterministic: stored */
    const char *seeded = "{\"prompt\":\"" PROMPT "\",\"max_tokens\":12,\"temperature\":1,\"seed\":9}";
    reply d = post(&s, "/v1/completions", seeded), e2 = post(&s, "/v1/completions", seeded);
    assert_false(d.cache_hit);
    assert_true(e2.cache_hit);
    json_t *jd = parse(d.body), *je = parse(e2.body);
    assert_string_equal(jstr(json_array_get(json_object_get(jd, "choices"), 0), "text", NULL),
                        jstr(json_array_get(json_object_get(je, "choices"), 0), "text", NULL));
    json_decref(jd), json_decref(je);
    free(d.body), free(e2.body);
    assert_int_equal(metric(&s, "kettle_result_cache_hits_total"), 4);
    stop_server(&s);
}

/* A stream of max_tokens; once its first bytes came, SIGTERM, and with
 * twice a second one 300 ms later. Returns the stream's body. */
static char *stream_through_sigterm(server *s, int max_tokens, bool twice) {
    char body[256];
    snprintf(body, sizeof body, "{\"prompt\":\"" PROMPT "\",\"max_tokens\":%d,\"stream\":true,\"ignore_eos\":true}",
             max_tokens);
    reply r = {0};
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    CURL *c = make_easy(s, "POST", "/v1/completions", body, strlen(body), h, &r);
    CURLM *multi = curl_multi_init();
    curl_multi_add_handle(multi, c);
    int running = 1;
    double sent_ms = 0;
    bool second = false;
    while (running) {
        curl_multi_perform(multi, &running);
        if (!sent_ms && r.len > 0) kill(s->pid, SIGTERM), sent_ms = kt_time_ms();
        if (twice && sent_ms && !second && kt_time_ms() - sent_ms > 300) kill(s->pid, SIGTERM), second = true;
        if (running) curl_multi_poll(multi, NULL, 0, 50, NULL);
    }
    assert_true(sent_ms > 0);
    json_decref(sse_events(r.body)); /* well-formed, ends with [DONE] */
    curl_multi_remove_handle(multi, c);
    curl_easy_cleanup(c);
    curl_multi_cleanup(multi);
    curl_slist_free_all(h);
    return r.body;
}

static void expect_finish(const char *body, const char *finish) {
    char want[64];
    snprintf(want, sizeof want, "\"finish_reason\":\"%s\"", finish);
    if (!strstr(body, want))
        fail_msg("no %s finish in: ...%s", finish, strlen(body) > 600 ? body + strlen(body) - 600 : body);
}

/* SIGTERM with --drain-s 0 while a stream runs: the stream ends as
 * "cancelled" with [DONE], and the server still exits 0. */
static void test_shutdown_mid_stream(void **state) {
    (void)state;
    server s = start_server("serve-term.log", "--parallel 1 --ctx 32768 --drain-s 0");
    char *body = stream_through_sigterm(&s, 32000, false);
    expect_finish(body, "cancelled");
    free(body);
    stop_server(&s);
}

/* SIGTERM with a drain: the running stream ends normally ("length") and
 * the server exits 0 once it has; a second SIGTERM during a drain stops at
 * once (the stream is cancelled, not waited for). stop_server allows 10 s. */
static void test_drain_on_sigterm(void **state) {
    (void)state;
    /* 600 tokens: long enough to be running at the signal, short enough
     * for the sanitizer builds to finish well inside the drain (under
     * ThreadSanitizer 6000 took over a minute) */
    server s = start_server("serve-drain.log", "--parallel 1 --ctx 8192 --drain-s 60");
    char *body = stream_through_sigterm(&s, 600, false);
    expect_finish(body, "length");
    free(body);
    char *log = NULL;
    for (int i = 0; i < 100 && !(log && strstr(log, "kettle serve: drained")); i++) /* it exits by itself */
        free(log), sleep_ms(50), log = tu_read_file(s.log, NULL);
    if (!log || !strstr(log, "kettle serve: drained")) fail_msg("no drained line in the log: %s", log ? log : "(none)");
    free(log);
    stop_server(&s);
    s = start_server("serve-drain2.log", "--parallel 1 --ctx 32768 --drain-s 60");
    body = stream_through_sigterm(&s, 32000, true);
    expect_finish(body, "cancelled");
    free(body);
    stop_server(&s);
    log = tu_read_file(s.log, NULL);
    assert_non_null(log && strstr(log, "terminated again, stopping now"));
    free(log);
}

/* ---- the JSON layer without HTTP ---- */

/* srv_parse_gen on `body` (chat): whether it is accepted, and if not, that
 * the message holds `part`. The request is freed; its body returned when
 * accepted (kept: the caller reads what parsing wrote into it). */
static json_t *parse_chat(const char *body, bool ok, const char *part) {
    srv_model_info mi = {.n_vocab = 100};
    srv_gen_req r;
    srv_error e = {0};
    json_t *b = json_loads(body, 0, NULL);
    assert_non_null(b);
    bool got = srv_parse_gen(b, SRV_CHAT, &mi, 1, &r, &e);
    if (got != ok) fail_msg("%s: %s (%s)", body, got ? "accepted" : "refused", e.msg);
    if (got) srv_gen_req_free(&r);
    if (!got && !strstr(e.msg, part)) fail_msg("%s: message '%s' lacks '%s'", body, e.msg, part);
    if (!got) json_decref(b), b = NULL;
    return b;
}

#define MSG "\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]"

/* Every field of OpenAI's chat API is honoured, accepted with a stated
 * meaning, or refused naming it; a name it does not have is refused
 * whatever its value (a `false` or `null` once passed silently), and so
 * are unknown roles, empty stop strings and unknown keys inside
 * response_format and stream_options. */
static void test_parse_field_policy(void **state) {
    (void)state;
    static const char *const accepted[] = {
        "\"service_tier\":\"flex\"", "\"store\":true", "\"metadata\":{\"a\":\"b\"}", "\"user\":\"u\"",
        "\"safety_identifier\":\"s\"", "\"prompt_cache_key\":\"k\"", "\"prediction\":{\"type\":\"content\",\"content\":\"x\"}",
        "\"modalities\":[\"text\"]", "\"verbosity\":\"medium\"", "\"functions\":null", "\"audio\":null",
        "\"stream_options\":{\"include_usage\":true,\"include_obfuscation\":false}",
        "\"messages\":[{\"role\":\"developer\",\"content\":\"d\"},{\"role\":\"user\",\"content\":\"q\"}]"};
    for (size_t i = 0; i < sizeof accepted / sizeof accepted[0]; i++) {
        char body[512];
        snprintf(body, sizeof body, "{%s%s%s}", strncmp(accepted[i], "\"messages\"", 11) ? MSG "," : "", accepted[i], "");
        json_decref(parse_chat(body, true, NULL));
    }
    static const char *const refused[][2] = {
        {"\"frobnicate\":false", "'frobnicate' is not a parameter"},
        {"\"frobnicate\":null", "'frobnicate' is not a parameter"},
        {"\"functions\":[{\"name\":\"f\"}]", "deprecated function-calling"},
        {"\"modalities\":[\"text\",\"audio\"]", "must be [\"text\"]"},
        {"\"verbosity\":\"low\"", "'verbosity'"},
        {"\"web_search_options\":{}", "web search"},
        {"\"reasoning_effort\":\"extreme\"", "'reasoning_effort' must be one of"},
        {"\"stop\":\"\"", "'stop' is empty"},
        {"\"stop\":[\"a\",\"\"]", "'stop[1]' is empty"},
        {"\"response_format\":{\"type\":\"text\",\"strict\":true}", "'response_format.strict'"},
        {"\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":{},\"x\":1}}",
         "'response_format.json_schema.x'"},
        {"\"stream_options\":{\"include_usage\":true,\"chunk\":1}", "'stream_options.chunk'"}};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        char body[512];
        snprintf(body, sizeof body, "{" MSG ",%s}", refused[i][0]);
        parse_chat(body, false, refused[i][1]);
    }
    parse_chat("{\"messages\":[{\"role\":\"wizard\",\"content\":\"q\"}]}", false, "'wizard' is not one of");
    parse_chat("{\"messages\":[{\"role\":\"function\",\"content\":\"q\"}]}", false, "use tool");
    /* reasoning_effort is the template's thinking switch and variable;
     * chat_template_kwargs, when it says, wins */
    json_t *b = parse_chat("{" MSG ",\"reasoning_effort\":\"low\"}", true, NULL);
    json_t *kw = json_object_get(b, "chat_template_kwargs");
    assert_true(json_is_true(json_object_get(kw, "enable_thinking")));
    assert_string_equal(json_string_value(json_object_get(kw, "reasoning_effort")), "low");
    json_decref(b);
    b = parse_chat("{" MSG ",\"reasoning_effort\":\"minimal\"}", true, NULL);
    assert_true(json_is_false(json_object_get(json_object_get(b, "chat_template_kwargs"), "enable_thinking")));
    json_decref(b);
    b = parse_chat("{" MSG ",\"reasoning_effort\":\"none\",\"chat_template_kwargs\":{\"enable_thinking\":true}}", true, NULL);
    assert_true(json_is_true(json_object_get(json_object_get(b, "chat_template_kwargs"), "enable_thinking")));
    json_decref(b);
}

static void test_parse_defaults_and_bias(void **state) {
    (void)state;
    srv_model_info mi = {.n_vocab = 100};
    srv_gen_req r;
    srv_error e;
    json_t *b = json_loads("{\"prompt\":\"hi\",\"logit_bias\":{\"5\":-100,\"7\":2.5},\"stop\":\"\\n\"}", 0, NULL);
    assert_true(srv_parse_gen(b, SRV_COMPLETION, &mi, 42, &r, &e));
    assert_true(r.sampling.temperature == 1.0f && r.sampling.top_p == 1.0f);
    assert_int_equal(r.sampling.top_k, 0);
    assert_true(r.sampling.min_p == 0.0f);
    assert_int_equal(r.sampling.seed, 42);
    assert_int_equal(r.max_tokens, 16); /* OpenAI's default for completions */
    assert_int_equal(r.top_logprobs, -1);
    assert_false(r.ignore_eos);
    assert_int_equal(r.n_stop, 1);
    assert_int_equal(r.n_logit_bias, 2);
    for (int i = 0; i < 2; i++) {
        if (r.logit_bias[i].token == 5) assert_true(isinf(r.logit_bias[i].bias) && r.logit_bias[i].bias < 0);
        else assert_true(r.logit_bias[i].token == 7 && r.logit_bias[i].bias == 2.5f);
    }
    srv_gen_req_free(&r);
    json_decref(b);
    b = json_loads("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]}],"
                   "\"max_completion_tokens\":3,\"top_logprobs\":2,\"logprobs\":true,\"seed\":-1}", 0, NULL);
    assert_true(srv_parse_gen(b, SRV_CHAT, &mi, 0, &r, &e));
    /* text parts are paragraphs, never glued into one word */
    assert_string_equal(json_string_value(json_object_get(json_array_get(r.messages, 0), "content")), "a\n\nb");
    assert_int_equal(r.max_tokens, 3);
    assert_int_equal(r.top_logprobs, 2);
    assert_true(r.sampling.seed == UINT64_MAX);
    srv_gen_req_free(&r);
    json_decref(b);
    b = json_loads("{\"prompt\":\"hi\",\"ignore_eos\":true}", 0, NULL);
    assert_true(srv_parse_gen(b, SRV_COMPLETION, &mi, 0, &r, &e));
    assert_true(r.ignore_eos);
    srv_gen_req_free(&r);
    json_decref(b);
    b = json_loads("{\"prompt\":\"hi\",\"ignore_eos\":1}", 0, NULL);
    assert_false(srv_parse_gen(b, SRV_COMPLETION, &mi, 0, &r, &e));
    assert_string_equal(e.param, "ignore_eos");
    json_decref(b);
    b = json_loads("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", 0, NULL);
    assert_false(srv_parse_gen(b, SRV_CHAT, &mi, 0, &r, &e));
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, "top_logprobs");
    json_decref(b);
}

static void test_error_json_and_utf8(void **state) {
    (void)state;
    srv_error e;
    srv_fail(&e, 404, "invalid_request_error", "model", "model_not_found", "no %s", "such");
    char *s = srv_error_json(&e);
    assert_string_equal(s, "{\"error\":{\"message\":\"no such\",\"type\":\"invalid_request_error\",\"param\":\"model\",\"code\":\"model_not_found\"}}");
    free(s);
    { const char *ok = "h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80"; assert_true(srv_utf8_valid(ok, strlen(ok))); }
    assert_false(srv_utf8_valid("\xff", 1));
    assert_false(srv_utf8_valid("\xc3", 1));
    assert_false(srv_utf8_valid("\xed\xa0\x80", 3)); /* a surrogate */
    assert_false(srv_utf8_valid("\xc0\xaf", 2));     /* overlong */
}

/* A refused submit is answered from the field the engine names, never
 * from words in its message: a message that says "prompt" and "context"
 * about n is still about n. */
static void test_submit_error_fields(void **state) {
    (void)state;
    struct {
        kt_status st;
        kt_gen_field field;
        srv_kind kind;
        int status;
        const char *param, *code;
    } cases[] = {
        {KT_ERR_CONTEXT, KT_FIELD_PROMPT, SRV_CHAT, 400, "messages", "context_length_exceeded"},
        {KT_ERR_CONTEXT, KT_FIELD_PROMPT, SRV_COMPLETION, 400, "prompt", "context_length_exceeded"},
        {KT_ERR_ARG, KT_FIELD_PROMPT, SRV_COMPLETION, 400, "prompt", NULL},
        {KT_ERR_ARG, KT_FIELD_MAX_TOKENS, SRV_CHAT, 400, "max_tokens", NULL},
        {KT_ERR_ARG, KT_FIELD_N_CHOICES, SRV_CHAT, 400, "n", NULL},
        {KT_ERR_ARG, KT_FIELD_STOP, SRV_CHAT, 400, "stop", NULL},
        {KT_ERR_ARG, KT_FIELD_TOP_LOGPROBS, SRV_CHAT, 400, "top_logprobs", NULL},
        {KT_ERR_ARG, KT_FIELD_TOP_LOGPROBS, SRV_COMPLETION, 400, "logprobs", NULL},
        {KT_ERR_ARG, KT_FIELD_LOGIT_BIAS, SRV_CHAT, 400, "logit_bias", NULL},
        {KT_ERR_BUSY, KT_FIELD_NONE, SRV_CHAT, 503, "", "server_busy"},
        {KT_ERR_NOMEM, KT_FIELD_NONE, SRV_CHAT, 500, "", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kt_error err = {.status = cases[i].st};
        snprintf(err.msg, sizeof err.msg, "the prompt's context says max_tokens (case %zu)", i);
        srv_error e;
        srv_submit_error(&err, cases[i].field, cases[i].kind, &e);
        assert_int_equal(e.status, cases[i].status);
        assert_string_equal(e.param, cases[i].param);
        if (cases[i].code) assert_string_equal(e.code, cases[i].code);
        else assert_null(e.code);
        assert_string_equal(e.msg, err.msg);
    }
}

/* The sampled-ids memory: found by exact text, the newest sampling of a
 * text wins, and the least recently used go past the token budget. */
static void test_sampled_memory(void **state) {
    (void)state;
    srv_sampled *m = srv_sampled_new(10);
    assert_non_null(m);
    int32_t a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, *got = NULL;
    srv_sampled_put(m, "hello", 5, a, 4);
    srv_sampled_put(m, "world", 5, b, 4);
    assert_int_equal(srv_sampled_get(m, "hello", 5, &got), 4);
    assert_memory_equal(got, a, sizeof a);
    free(got);
    assert_int_equal(srv_sampled_get(m, "hell", 4, &got), 0);
    assert_null(got);
    srv_sampled_put(m, "hello", 5, b, 3); /* resampled: replaced */
    assert_int_equal(srv_sampled_get(m, "hello", 5, &got), 3);
    free(got);
    srv_sampled_put(m, "third", 5, a, 4); /* 3 + 4 + 4 > 10: "world" is the oldest */
    assert_int_equal(srv_sampled_get(m, "world", 5, &got), 0);
    assert_int_equal(srv_sampled_get(m, "third", 5, &got), 4);
    free(got);
    srv_sampled_put(m, "huge", 4, (int32_t[11]){0}, 11); /* over the whole budget: not kept */
    assert_int_equal(srv_sampled_get(m, "huge", 4, &got), 0);
    srv_sampled_free(m);
}

static void test_metrics_histogram_cumulative(void **state) {
    (void)state;
    srv_metrics m;
    assert_true(srv_metrics_init(&m));
    srv_metrics_count(&m, "health", 200);
    srv_metrics_count(&m, "health", 200);
    srv_class_stats cs[2] = {{.name = "router"}, {.name = "big", .has_results = true, .result_hits = 5}};
    kt_engine_stats *st = &cs[0].engine;
    st->ttft.counts[0] = 2, st->ttft.counts[3] = 1, st->ttft.counts[KT_LAT_N_BUCKETS - 1] = 4;
    st->ttft.n = 7, st->ttft.sum_ms = 1500;
    cs[1].engine.queue_depth = 3;
    char *t = srv_metrics_text(&m, cs, 1);
    assert_non_null(strstr(t, "kettle_http_requests_total{endpoint=\"health\",status=\"200\"} 2\n"));
    char want[128];
    snprintf(want, sizeof want, "kettle_time_to_first_token_seconds_bucket{le=\"%g\"} 3\n", kt_lat_bucket_ms[3] / 1e3);
    assert_non_null(strstr(t, want));
    assert_non_null(strstr(t, "kettle_time_to_first_token_seconds_bucket{le=\"+Inf\"} 7\n"));
    assert_non_null(strstr(t, "kettle_time_to_first_token_seconds_sum 1.5\n"));
    assert_non_null(strstr(t, "kettle_time_to_first_token_seconds_count 7\n"));
    assert_null(strstr(t, "model=")); /* one class: no label, as before classes */
    free(t);
    /* two classes: every engine series has its model label, each family's header once */
    t = srv_metrics_text(&m, cs, 2);
    assert_non_null(strstr(t, "kettle_queue_depth{model=\"router\"} 0\nkettle_queue_depth{model=\"big\"} 3\n"));
    snprintf(want, sizeof want, "kettle_time_to_first_token_seconds_bucket{le=\"%g\",model=\"router\"} 3\n",
             kt_lat_bucket_ms[3] / 1e3);
    assert_non_null(strstr(t, want));
    assert_non_null(strstr(t, "kettle_time_to_first_token_seconds_count{model=\"router\"} 7\n"));
    assert_non_null(strstr(t, "kettle_requests_finished_total{reason=\"stop\",model=\"big\"} 0\n"));
    assert_non_null(strstr(t, "kettle_result_cache_hits_total{model=\"big\"} 5\n"));
    assert_null(strstr(t, "kettle_result_cache_hits_total{model=\"router\"}"));
    const char *h = strstr(t, "# TYPE kettle_queue_depth");
    assert_non_null(h);
    assert_null(strstr(h + 1, "# TYPE kettle_queue_depth"));
    free(t);
    srv_metrics_destroy(&m);
}

int main(void) {
    const struct CMUnitTest unit[] = {
        cmocka_unit_test(test_parse_defaults_and_bias),
        cmocka_unit_test(test_parse_field_policy),
        cmocka_unit_test(test_error_json_and_utf8),
        cmocka_unit_test(test_submit_error_fields),
        cmocka_unit_test(test_sampled_memory),
        cmocka_unit_test(test_metrics_histogram_cumulative),
    };
    const struct CMUnitTest e2e[] = {
        cmocka_unit_test(test_completion_greedy_matches_run),
        cmocka_unit_test(test_completion_stream_matches),
        cmocka_unit_test(test_prefix_cache_usage),
        cmocka_unit_test(test_completion_stop),
        cmocka_unit_test(test_completion_logprobs),
        cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_chat_stream_equals_plain),
        cmocka_unit_test(test_chat_n2_logprobs),
        cmocka_unit_test(test_health_models_metrics),
        cmocka_unit_test(test_webui),
        cmocka_unit_test(test_embeddings),
        cmocka_unit_test(test_tokenize_roundtrip),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_max_tokens_room),
        cmocka_unit_test(test_messages_stream_cache_usage),
        cmocka_unit_test(test_disconnect_frees_kv),
        cmocka_unit_test(test_sixteen_concurrent_streams),
        cmocka_unit_test(test_api_key_alias_tools),
        cmocka_unit_test(test_queue_full),
        cmocka_unit_test(test_many_open_streams),
        cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_help_lists_routes),
        cmocka_unit_test(test_shutdown_mid_stream),
        cmocka_unit_test(test_drain_on_sigterm),
        cmocka_unit_test(test_reply_ids_reused),
        cmocka_unit_test(test_result_cache),
        cmocka_unit_test(test_structured_output),
    };
    int failed = cmocka_run_group_tests_name("server json", unit, NULL, NULL);
    return tu_result(failed + cmocka_run_group_tests_name("kettle serve", e2e, group_setup, group_teardown));
}
