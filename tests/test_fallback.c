/*
 * test_fallback.c - `kettle serve --fallback URL` end to end (see
 * src/server/fallback.h).
 *
 * Two kinds of upstream on loopback: a second `kettle serve` with a
 * larger context (what a prompt too long here, a full queue or an unknown
 * model gets instead), and a stub written here, one thread on a socket,
 * that records what it was sent (path, Authorization, x-api-key, body)
 * and answers canned JSON, a canned event stream sent slowly in pieces,
 * an error status, or nothing at all. The servers under test:
 *
 *   A  --ctx 512 --parallel 1 --queue 1 --strict-model-names, -> the kettle upstream (every trigger)
 *   B  --ctx 64 --strict-model-names --fallback-on unknown-model,error, -> the stub, a key, 1 s / 3 s timeouts
 *   D  -> a port nobody listens on
 *
 * Every answer is checked for its bytes, not only its status: what the
 * client got equals what the upstream sent, and what the upstream got
 * equals what the client sent.
 */
#include <curl/curl.h>
#include <jansson.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/timing.h"
#include "fake_server.h"
#include "server/fallback.h"
#include "server_util.h"
#include "testutil.h"

#define KEY "sk-fallback-test-7f3a9c"

/* ---- the stub upstream ---- */

typedef enum stub_mode { STUB_JSON, STUB_SSE, STUB_STATUS, STUB_SLOW } stub_mode;

static const char STUB_JSON_BODY[] =
    "{\"id\":\"chatcmpl-up\",\"object\":\"chat.completion\",\"created\":1,\"model\":\"up\",\"choices\":[{\"index\":0,"
    "\"message\":{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\","
    "\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},"
    "\"finish_reason\":\"tool_calls\"}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":7,\"total_tokens\":12}}";

static const char STUB_STATUS_BODY[] = "{\"error\":{\"message\":\"slow down\",\"type\":\"rate_limit\",\"code\":null}}";

/* The stream's pieces, sent 100 ms apart (one split mid-event). */
static const char *const STUB_SSE_PARTS[] = {
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\","
    "\"content\":\"\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel",
    "lo\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},"
    "\"finish_reason\":\"stop\"}]}\n\n",
    "data: [DONE]\n\n"};

static struct {
    int fd, port;
    pthread_t thread;
    int mode, stop; /* __atomic */
    pthread_mutex_t mu;
    int n_requests;
    char path[256], auth[256], xapi[256];
    char *body;
    size_t body_len;
    double slow_closed_ms; /* when kettle closed a connection the stub never answered */
} STUB = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void send_all(int fd, const char *s, size_t n) {
    while (n) {
        ssize_t k = send(fd, s, n, MSG_NOSIGNAL);
        if (k <= 0) return;
        s += k, n -= (size_t)k;
    }
}

/* "Name: value" of the header block into out (cut at the line's end). */
static void header_of(const char *head, const char *name, char *out, size_t cap) {
    out[0] = 0;
    size_t k = strlen(name);
    for (const char *p = strstr(head, "\r\n"); p && p[2]; p = strstr(p + 2, "\r\n"))
        if (!strncasecmp(p + 2, name, k) && p[2 + k] == ':') {
            const char *v = p + 3 + k;
            while (*v == ' ') v++;
            snprintf(out, cap, "%.*s", (int)strcspn(v, "\r\n"), v);
            return;
        }
}

/* Reads one request (headers and Content-Length body) and records it. */
static bool stub_read(int fd) {
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    char *end = NULL;
    while (buf && !(end = len ? strstr(buf, "\r\n\r\n") : NULL) && len < cap - 1) {
        ssize_t k = recv(fd, buf + len, cap - 1 - len, 0);
        if (k <= 0) break;
        len += (size_t)k, buf[len] = 0;
    }
    if (!end) return free(buf), false;
    *end = 0;
    char cl[32];
    header_of(buf, "Content-Length", cl, sizeof cl);
    size_t want = (size_t)atol(cl), have = len - (size_t)(end + 4 - buf);
    char *body = malloc(want + 1);
    if (!body) return free(buf), false;
    memcpy(body, end + 4, have < want ? have : want);
    while (have < want) {
        ssize_t k = recv(fd, body + have, want - have, 0);
        if (k <= 0) break;
        have += (size_t)k;
    }
    body[want] = 0;
    pthread_mutex_lock(&STUB.mu);
    STUB.n_requests++;
    snprintf(STUB.path, sizeof STUB.path, "%.*s", (int)strcspn(buf + strcspn(buf, " ") + 1, " "),
             buf + strcspn(buf, " ") + 1);
    header_of(buf, "Authorization", STUB.auth, sizeof STUB.auth);
    header_of(buf, "x-api-key", STUB.xapi, sizeof STUB.xapi);
    free(STUB.body);
    STUB.body = body, STUB.body_len = want;
    pthread_mutex_unlock(&STUB.mu);
    free(buf);
    return true;
}

static void stub_answer(int fd, stub_mode mode) {
    char head[256];
    if (mode == STUB_JSON || mode == STUB_STATUS) {
        const char *body = mode == STUB_JSON ? STUB_JSON_BODY : STUB_STATUS_BODY;
        snprintf(head, sizeof head, "HTTP/1.1 %s\r\nContent-Type: application/json\r\n%sContent-Length: %zu\r\n"
                 "Connection: close\r\n\r\n", mode == STUB_JSON ? "200 OK" : "429 Too Many Requests",
                 mode == STUB_STATUS ? "Retry-After: 7\r\n" : "", strlen(body));
        send_all(fd, head, strlen(head));
        send_all(fd, body, strlen(body));
    } else if (mode == STUB_SSE) {
        snprintf(head, sizeof head, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n");
        send_all(fd, head, strlen(head));
        for (size_t i = 0; i < sizeof STUB_SSE_PARTS / sizeof STUB_SSE_PARTS[0]; i++) {
            sleep_ms(100);
            send_all(fd, STUB_SSE_PARTS[i], strlen(STUB_SSE_PARTS[i]));
        }
    } else { /* slow: nothing, until kettle gives up and closes */
        struct pollfd p = {fd, POLLIN, 0};
        char b;
        while (poll(&p, 1, 10000) == 1 && recv(fd, &b, 1, 0) > 0) {}
        pthread_mutex_lock(&STUB.mu);
        STUB.slow_closed_ms = kt_time_ms();
        pthread_mutex_unlock(&STUB.mu);
    }
}

static void *stub_run(void *arg) {
    (void)arg;
    while (!__atomic_load_n(&STUB.stop, __ATOMIC_ACQUIRE)) {
        struct pollfd p = {STUB.fd, POLLIN, 0};
        if (poll(&p, 1, 100) != 1) continue;
        int fd = accept(STUB.fd, NULL, NULL);
        if (fd < 0) continue;
        struct timeval tv = {5, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        if (stub_read(fd)) stub_answer(fd, (stub_mode)__atomic_load_n(&STUB.mode, __ATOMIC_ACQUIRE));
        close(fd);
    }
    return NULL;
}

static void stub_mode_set(stub_mode m) {
    __atomic_store_n(&STUB.mode, (int)m, __ATOMIC_RELEASE);
}

static int stub_requests(void) {
    pthread_mutex_lock(&STUB.mu);
    int n = STUB.n_requests;
    pthread_mutex_unlock(&STUB.mu);
    return n;
}

/* ---- the client ---- */

/* server_util's replies carry the fallback's headers and the timing. */
typedef reply fb_reply;

static CURL *fb_easy(const server *s, const char *path, const char *body, fb_reply *r, struct curl_slist *h) {
    return make_easy(s, "POST", path, body, strlen(body), h, r);
}

/* POSTs; a client timeout (timeout_ms > 0) is allowed to cut it. */
static fb_reply fb_post_t(const server *s, const char *path, const char *body, long timeout_ms) {
    fb_reply r = {0};
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    CURL *c = fb_easy(s, path, body, &r, h);
    if (timeout_ms) curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
    CURLcode rc = curl_easy_perform(c);
    r.t_end_ms = kt_time_ms();
    if (rc != CURLE_OK && !(timeout_ms && rc == CURLE_OPERATION_TIMEDOUT))
        fail_msg("POST %s: %s", path, curl_easy_strerror(rc));
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
    curl_easy_cleanup(c);
    curl_slist_free_all(h);
    if (!r.body) r.body = calloc(1, 1);
    return r;
}

static fb_reply fb_post(const server *s, const char *path, const char *body) {
    return fb_post_t(s, path, body, 0);
}

static void expect_fallback(const fb_reply *r, long status, const char *reason) {
    if (r->status != status || strcmp(r->served_by, "fallback") || strcmp(r->fallback_reason, reason))
        fail_msg("want %ld served by the fallback (%s); got %ld served-by '%s' reason '%s': %s", status, reason,
                 r->status, r->served_by, r->fallback_reason, r->body);
}

static void expect_local(const fb_reply *r, long status, const char *msg) {
    if (r->status != status || r->served_by[0] || !strstr(r->body, msg))
        fail_msg("want a local %ld saying '%s'; got %ld served-by '%s': %s", status, msg, r->status, r->served_by, r->body);
}

static long long metric_of(const server *s, const char *line) {
    reply r = get(s, "/metrics");
    const char *p = strstr(r.body, line);
    if (!p) fail_msg("/metrics lacks %s:\n%s", line, r.body);
    long long v = atoll(p + strlen(line));
    free(r.body);
    return v;
}

static long long fallbacks(const server *s) {
    return metric_of(s, "kettle_fallback_requests_total{reason=\"context\"} ") +
           metric_of(s, "kettle_fallback_requests_total{reason=\"busy\"} ") +
           metric_of(s, "kettle_fallback_requests_total{reason=\"unknown-model\"} ") +
           metric_of(s, "kettle_fallback_requests_total{reason=\"error\"} ");
}

/* ---- the servers ---- */

static server U, A, B, D;
static char *LONG_PROMPT; /* more tokens than A's context of 512 */

static int group_setup(void **state) {
    (void)state;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    STUB.fd = tu_loopback_socket(16, &STUB.port);
    if (pthread_create(&STUB.thread, NULL, stub_run, NULL)) return -1;
    int dead_port;
    close(tu_loopback_socket(0, &dead_port)); /* free now, and nobody listens */
    LONG_PROMPT = calloc(1, 17 * 200 + 1);
    for (int i = 0; i < 200; i++) strcat(LONG_PROMPT, "Once upon a time ");
    setenv("FB_TEST_KEY", KEY, 1);
    char args[1024];
    U = start_server("fb-upstream.log", "--chat-template chatml --ctx 2048 --alias upstream-name");
    snprintf(args, sizeof args, "--chat-template chatml --ctx 512 --parallel 1 --queue 1 --strict-model-names "
             "--fallback http://127.0.0.1:%d/v1 --fallback-model upstream-name", U.port);
    A = start_server("fb-a.log", args);
    snprintf(args, sizeof args, "--chat-template chatml --ctx 64 --strict-model-names --fallback http://127.0.0.1:%d/ "
             "--fallback-key-env FB_TEST_KEY --fallback-on unknown-model,error --fallback-timeout-s 1 "
             "--fallback-max-s 3", STUB.port);
    B = start_server("fb-b.log", args);
    snprintf(args, sizeof args, "--ctx 64 --fallback http://127.0.0.1:%d/v1", dead_port);
    D = start_server("fb-d.log", args);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    stop_server(&A), stop_server(&B), stop_server(&D), stop_server(&U);
    __atomic_store_n(&STUB.stop, 1, __ATOMIC_RELEASE);
    pthread_join(STUB.thread, NULL);
    close(STUB.fd);
    free(STUB.body), free(LONG_PROMPT);
    curl_global_cleanup();
    return 0;
}

static char *completion_body(const char *prompt, const char *extra) {
    char *b = malloc(strlen(prompt) + strlen(extra) + 128);
    sprintf(b, "{\"prompt\":\"%s\",\"max_tokens\":8,\"temperature\":0%s}", prompt, extra);
    return b;
}

/* ---- triggers, against the kettle upstream ---- */

/* A prompt longer than A's context: U answers it, the same text as asked
 * directly, under the --fallback-model name. */
static void test_context(void **state) {
    (void)state;
    char *body = completion_body(LONG_PROMPT, "");
    fb_reply r = fb_post(&A, "/v1/completions", body);
    expect_fallback(&r, 200, "context");
    json_t *j = parse(r.body), *direct = post_ok(&U, "/v1/completions", body);
    assert_string_equal(jstr(j, "model", NULL), "upstream-name");
    assert_true(json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens")) > 512);
    assert_string_equal(jstr(json_array_get(json_object_get(j, "choices"), 0), "text", NULL),
                        jstr(json_array_get(json_object_get(direct, "choices"), 0), "text", NULL));
    json_decref(j), json_decref(direct), free(r.body);
    /* streamed: an event stream through, the same text */
    char *sbody = completion_body(LONG_PROMPT, ",\"stream\":true");
    fb_reply s = fb_post(&A, "/v1/completions", sbody);
    expect_fallback(&s, 200, "context");
    assert_string_equal(s.content_type, "text/event-stream");
    json_t *events = sse_events(s.body);
    assert_true(json_array_size(events) >= 2);
    json_decref(events);
    assert_true(metric_of(&A, "kettle_fallback_requests_total{reason=\"context\"} ") >= 2);
    free(s.body), free(sbody), free(body);
}

/* An unknown model under --strict-model-names, with tools under
 * tool_choice required: U's tool call comes back as U makes it. */
static void test_unknown_model_tools(void **state) {
    (void)state;
    const char *fmt = "{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"weather in Paris?\"}],"
                      "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":"
                      "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}}],"
                      "\"tool_choice\":\"required\",\"temperature\":0,\"max_tokens\":60}";
    char body[1024], direct_body[1024];
    snprintf(body, sizeof body, fmt, "gpt-4o");
    snprintf(direct_body, sizeof direct_body, fmt, "upstream-name");
    fb_reply r = fb_post(&A, "/v1/chat/completions", body);
    expect_fallback(&r, 200, "unknown-model");
    json_t *j = parse(r.body), *direct = post_ok(&U, "/v1/chat/completions", direct_body);
    json_t *m = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
    json_t *dm = json_object_get(json_array_get(json_object_get(direct, "choices"), 0), "message");
    json_t *call = json_object_get(json_array_get(json_object_get(m, "tool_calls"), 0), "function");
    json_t *dcall = json_object_get(json_array_get(json_object_get(dm, "tool_calls"), 0), "function");
    assert_non_null(call);
    assert_string_equal(jstr(call, "name", NULL), "get_weather");
    assert_true(json_equal(call, dcall));
    json_decref(j), json_decref(direct), free(r.body);
    /* a served name is not forwarded: A answers it */
    snprintf(body, sizeof body, fmt, "stories260K.gguf");
    fb_reply local = fb_post(&A, "/v1/chat/completions", body);
    assert_int_equal(local.status, 200);
    assert_string_equal(local.served_by, "");
    free(local.body);
}

/* A burst on one sequence and a queue of one: what does not fit is served
 * by U instead of a 503. */
static void test_busy(void **state) {
    (void)state;
    enum { N = 6 };
    const char *body = "{\"prompt\":\"Once upon a time\",\"max_tokens\":400,\"temperature\":1,\"logit_bias\":{\"2\":-100}}";
    fb_reply r[N] = {{0}};
    CURL *easy[N];
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    CURLM *multi = curl_multi_init();
    for (int i = 0; i < N; i++) curl_multi_add_handle(multi, easy[i] = fb_easy(&A, "/v1/completions", body, &r[i], h));
    int running = 1;
    while (running) {
        curl_multi_perform(multi, &running);
        if (running) curl_multi_poll(multi, NULL, 0, 100, NULL);
    }
    int busy = 0;
    for (int i = 0; i < N; i++) {
        curl_easy_getinfo(easy[i], CURLINFO_RESPONSE_CODE, &r[i].status);
        if (r[i].status != 200) fail_msg("request %d: %ld %s", i, r[i].status, r[i].body);
        if (!strcmp(r[i].fallback_reason, "busy")) busy++, assert_string_equal(r[i].served_by, "fallback");
        assert_non_null(strstr(r[i].body, "\"text_completion\""));
        curl_multi_remove_handle(multi, easy[i]);
        curl_easy_cleanup(easy[i]);
        free(r[i].body);
    }
    curl_multi_cleanup(multi);
    curl_slist_free_all(h);
    assert_true(busy >= 1);
    assert_int_equal(metric_of(&A, "kettle_fallback_requests_total{reason=\"busy\"} "), busy);
}

/* The request's own faults stay kettle's answers: nothing is forwarded. */
static void test_own_fault_not_forwarded(void **state) {
    (void)state;
    long long before = fallbacks(&A);
    fb_reply r = fb_post(&A, "/v1/chat/completions", "{\"model\":\"gpt-4o\",\"messages\":[");
    expect_local(&r, 400, "malformed JSON");
    free(r.body);
    r = fb_post(&A, "/v1/completions", "{\"prompt\":\"hi\",\"temperature\":\"hot\"}");
    expect_local(&r, 400, "temperature");
    free(r.body);
    int n = stub_requests();
    r = fb_post(&B, "/v1/chat/completions", "{\"model\":\"gpt-4o\",\"messages\":\"nope\"");
    expect_local(&r, 400, "malformed JSON");
    free(r.body);
    /* a malformed Anthropic tool_result is the client's fault (a 400): it
     * was a 500 "out of memory", which B forwards (--fallback-on error) */
    r = fb_post(&B, "/v1/messages", "{\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
                                    "\"tool_result\",\"tool_use_id\":\"t\",\"content\":5}]}]}");
    expect_local(&r, 400, "content");
    free(r.body);
    assert_int_equal(stub_requests(), n);
    assert_int_equal(fallbacks(&A), before);
}

/* ---- pass-through, against the stub ---- */

/* The client's bytes reach the upstream as sent, with the key; the
 * upstream's bytes reach the client as sent. */
static void test_json_passthrough(void **state) {
    (void)state;
    stub_mode_set(STUB_JSON);
    const char *body = "{\"model\":\"gpt-x\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi\"}]}],"
                       "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"w\",\"schema\":"
                       "{\"type\":\"object\"}}},\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}],"
                       "\"tool_choice\":\"required\"}";
    fb_reply r = fb_post(&B, "/v1/chat/completions", body);
    expect_fallback(&r, 200, "unknown-model");
    assert_string_equal(r.body, STUB_JSON_BODY);
    assert_string_equal(r.content_type, "application/json");
    pthread_mutex_lock(&STUB.mu);
    assert_string_equal(STUB.path, "/v1/chat/completions"); /* B's URL is the root: /v1 is added, '/' not doubled */
    assert_string_equal(STUB.body, body);
    assert_string_equal(STUB.auth, "Bearer " KEY);
    assert_string_equal(STUB.xapi, "");
    pthread_mutex_unlock(&STUB.mu);
    free(r.body);
    /* the other APIs go to their own paths; /v1/messages also carries x-api-key */
    r = fb_post(&B, "/v1/responses", "{\"model\":\"gpt-x\",\"input\":\"hi\"}");
    expect_fallback(&r, 200, "unknown-model");
    pthread_mutex_lock(&STUB.mu);
    assert_string_equal(STUB.path, "/v1/responses");
    pthread_mutex_unlock(&STUB.mu);
    free(r.body);
    r = fb_post(&B, "/v1/messages", "{\"model\":\"claude-x\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
    expect_fallback(&r, 200, "unknown-model");
    pthread_mutex_lock(&STUB.mu);
    assert_string_equal(STUB.path, "/v1/messages");
    assert_string_equal(STUB.xapi, KEY);
    pthread_mutex_unlock(&STUB.mu);
    free(r.body);
}

/* A stream goes through as it comes: the same bytes, the first of them
 * long before the last (the stub sends a piece every 100 ms). */
static void test_stream_passthrough(void **state) {
    (void)state;
    stub_mode_set(STUB_SSE);
    fb_reply r = fb_post(&B, "/v1/chat/completions",
                         "{\"model\":\"gpt-x\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
    expect_fallback(&r, 200, "unknown-model");
    assert_string_equal(r.content_type, "text/event-stream");
    char want[2048] = "";
    for (size_t i = 0; i < sizeof STUB_SSE_PARTS / sizeof STUB_SSE_PARTS[0]; i++) strcat(want, STUB_SSE_PARTS[i]);
    assert_string_equal(r.body, want);
    if (r.t_end_ms - r.t_first_ms < 250) fail_msg("the stream came in one piece (%.0f ms)", r.t_end_ms - r.t_first_ms);
    free(r.body);
}

/* An upstream error status is passed on, Retry-After too, and counted. */
static void test_upstream_status(void **state) {
    (void)state;
    stub_mode_set(STUB_STATUS);
    long long before = metric_of(&B, "kettle_fallback_failures_total{kind=\"status\"} ");
    fb_reply r = fb_post(&B, "/v1/chat/completions", "{\"model\":\"gpt-x\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
    expect_fallback(&r, 429, "unknown-model");
    assert_string_equal(r.body, STUB_STATUS_BODY);
    assert_string_equal(r.retry_after, "7");
    assert_int_equal(metric_of(&B, "kettle_fallback_failures_total{kind=\"status\"} "), before + 1);
    free(r.body);
}

/* An upstream that accepts and never answers: a stream's first byte is
 * bounded by --fallback-timeout-s (1 s), a whole answer by
 * --fallback-max-s (3 s); both 504, never a hang, and never retried (the
 * request reached the upstream: the stub counts one each). */
static void test_slow_upstream(void **state) {
    (void)state;
    stub_mode_set(STUB_SLOW);
    long long before = metric_of(&B, "kettle_fallback_failures_total{kind=\"timeout\"} ");
    int n = stub_requests();
    double t0 = kt_time_ms();
    fb_reply r = fb_post(&B, "/v1/chat/completions",
                         "{\"model\":\"gpt-x\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
    double ms = kt_time_ms() - t0;
    expect_fallback(&r, 504, "unknown-model");
    assert_non_null(strstr(r.body, "did not answer in time"));
    if (ms < 900 || ms > 2500) fail_msg("the stream's 504 came after %.0f ms, not about 1 s", ms);
    free(r.body);
    t0 = kt_time_ms();
    r = fb_post(&B, "/v1/chat/completions", "{\"model\":\"gpt-x\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
    ms = kt_time_ms() - t0;
    expect_fallback(&r, 504, "unknown-model");
    if (ms < 2800 || ms > 5000) fail_msg("the whole answer's 504 came after %.0f ms, not about 3 s", ms);
    free(r.body);
    assert_int_equal(stub_requests(), n + 2);
    assert_int_equal(metric_of(&B, "kettle_fallback_failures_total{kind=\"timeout\"} "), before + 2);
}

/* A client that leaves ends the upstream transfer at once, not at the
 * 3 s cap: the stub sees its connection closed. */
static void test_client_gone_cancels(void **state) {
    (void)state;
    stub_mode_set(STUB_SLOW);
    pthread_mutex_lock(&STUB.mu);
    STUB.slow_closed_ms = 0;
    pthread_mutex_unlock(&STUB.mu);
    fb_reply r = fb_post_t(&B, "/v1/chat/completions",
                           "{\"model\":\"gpt-x\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", 300);
    double left = kt_time_ms(), closed = 0;
    for (int i = 0; i < 60 && !closed; i++) {
        sleep_ms(50);
        pthread_mutex_lock(&STUB.mu);
        closed = STUB.slow_closed_ms;
        pthread_mutex_unlock(&STUB.mu);
    }
    if (!closed || closed - left > 1500) fail_msg("the upstream transfer outlived its client by %.0f ms", closed - left);
    free(r.body);
}

/* Nobody listening: a 502 at once, after the one retry of a refused
 * connection (200 ms later), naming the upstream. */
static void test_dead_upstream(void **state) {
    (void)state;
    char *body = completion_body(LONG_PROMPT, "");
    double t0 = kt_time_ms();
    fb_reply r = fb_post(&D, "/v1/completions", body);
    double ms = kt_time_ms() - t0;
    expect_fallback(&r, 502, "context");
    assert_non_null(strstr(r.body, "the fallback upstream 127.0.0.1:"));
    if (ms < 150 || ms > 2000) fail_msg("the 502 took %.0f ms (want one retry 200 ms after the refusal)", ms);
    assert_int_equal(metric_of(&D, "kettle_fallback_failures_total{kind=\"connect\"} "), 1);
    free(r.body), free(body);
}

/* A trigger not in --fallback-on: the local error, unchanged. */
static void test_trigger_not_enabled(void **state) {
    (void)state;
    int n = stub_requests();
    char *body = completion_body(LONG_PROMPT, "");
    fb_reply r = fb_post(&B, "/v1/completions", body);
    expect_local(&r, 400, "context");
    assert_non_null(strstr(r.body, "\"context_length_exceeded\""));
    assert_int_equal(stub_requests(), n);
    free(r.body), free(body);
}

/* The key never reaches kettle's log; the request log marks forwards. */
static void test_log(void **state) {
    (void)state;
    char *log = tu_read_file(B.log, NULL);
    assert_non_null(log);
    if (strstr(log, KEY)) fail_msg("the API key is in kettle's stderr:\n%s", log);
    if (!strstr(log, "POST /v1/chat/completions 200 fallback=unknown-model total_ms="))
        fail_msg("no request line marks the forward:\n%s", log);
    if (!strstr(log, "fallback upstream http://127.0.0.1:") || !strstr(log, "(API key from $FB_TEST_KEY)"))
        fail_msg("the start banner does not describe the fallback:\n%s", log);
    free(log);
}

/* ---- settings ---- */

static void test_reason_of(void **state) {
    (void)state;
    struct { int status; const char *code; srv_fb_reason want; } cases[] = {
        {400, "context_length_exceeded", SRV_FB_CONTEXT}, {503, "server_busy", SRV_FB_BUSY},
        {404, "model_not_found", SRV_FB_UNKNOWN_MODEL},   {500, NULL, SRV_FB_ERROR},
        {400, NULL, SRV_FB_NONE},                         {404, "not_found", SRV_FB_NONE},
        {413, "request_too_large", SRV_FB_NONE},          {503, NULL, SRV_FB_NONE}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        srv_error e = {.status = cases[i].status, .code = cases[i].code};
        assert_int_equal(srv_fb_reason_of(&e), cases[i].want);
    }
    unsigned set = 0;
    char msg[200];
    assert_true(srv_fb_parse_triggers("context,unknown-model", &set, msg, sizeof msg));
    assert_int_equal(set, (1u << SRV_FB_CONTEXT) | (1u << SRV_FB_UNKNOWN_MODEL));
    assert_false(srv_fb_parse_triggers("context,,busy", &set, msg, sizeof msg));
    assert_false(srv_fb_parse_triggers("queue", &set, msg, sizeof msg));
    assert_non_null(strstr(msg, "'queue' is not a fallback trigger"));
    assert_true(srv_fb_check_url("https://api.openai.com/v1", msg, sizeof msg));
    assert_false(srv_fb_check_url("ftp://host/v1", msg, sizeof msg));
    assert_false(srv_fb_check_url("http://user:secret@host/v1", msg, sizeof msg));
    assert_non_null(strstr(msg, "--fallback-key-env"));
}

/* Bad options are usage errors (exit 2) naming the problem, before any
 * model is loaded. */
static void test_cli_errors(void **state) {
    (void)state;
    struct { const char *args, *msg; } cases[] = {
        {"--fallback ftp://h/v1", "http:// or https://"},
        {"--fallback http://h/v1 --fallback-on context,queue", "'queue' is not a fallback trigger"},
        {"--fallback-timeout-s 5", "need --fallback URL"},
        {"--fallback http://h/v1 --fallback-key-env FB_UNSET_VAR_93", "FB_UNSET_VAR_93: that environment variable is not set"},
        {"--fallback http://h/v1 --fallback-key-env sk-123", "not an environment variable's name"},
        {"--fallback http://h/v1 --fallback-timeout-s 0", "--fallback-timeout-s"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char cmd[512], *err = NULL;
        snprintf(cmd, sizeof cmd, "%s serve -m /nonexistent.gguf --port 0 %s", KT_BIN, cases[i].args);
        int rc = tu_run(cmd, NULL, &err);
        if (rc != 2 || !err || !strstr(err, cases[i].msg))
            fail_msg("%s: exit %d, stderr %s (want 2, '%s')", cases[i].args, rc, err ? err : "", cases[i].msg);
        free(err);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_context),          cmocka_unit_test(test_unknown_model_tools),
        cmocka_unit_test(test_busy),             cmocka_unit_test(test_own_fault_not_forwarded),
        cmocka_unit_test(test_json_passthrough), cmocka_unit_test(test_stream_passthrough),
        cmocka_unit_test(test_upstream_status),  cmocka_unit_test(test_slow_upstream),
        cmocka_unit_test(test_client_gone_cancels), cmocka_unit_test(test_dead_upstream),
        cmocka_unit_test(test_trigger_not_enabled), cmocka_unit_test(test_log),
        cmocka_unit_test(test_reason_of),        cmocka_unit_test(test_cli_errors),
    };
    return tu_result(cmocka_run_group_tests(tests, group_setup, group_teardown));
}
