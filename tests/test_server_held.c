/*
 * test_server_cancel.c - a client that hangs up is cancelled within one
 * engine step, at every stage (queued, prefilling, decoding), streaming or
 * not.
 *
 * The server runs in this process (srv_start over an engine made here), so
 * the test can hold the engine (kt_engine_hold) and grant it steps one at
 * a time: nothing depends on how fast this machine is. Clients are raw
 * sockets, so the test decides exactly when the connection closes. A
 * suspended connection (waiting for its turn or for its first token) is
 * not polled by libmicrohttpd; only the engine's client_gone check can see
 * it close, and the test asserts that it does in the very next step.
 *
 * The states a load balancer reads from /health: a server opened before
 * its model answers 503 "loading" (and every request but /metrics 503);
 * a draining one answers 503 "draining", refuses new generation with 503,
 * and lets the requests it has run to their normal end.
 *
 * Out of memory mid-stream: jansson's allocator is ours here, and can be
 * made to fail; the stream must end with an error event and [DONE], after
 * the whole events it had, never go quiet or drop text silently.
 *
 * Keep-alives (--sse-keepalive-ms): libcurl clients that give up on a
 * stream after 2 s without a byte wait 10 s for their first token (the
 * engine held) and 2.5 s more between two tokens, on every streaming API
 * at once; with keep-alives they get the whole answer, with its pings or
 * comments where the API allows them; without, they all give up.
 */
#include <arpa/inet.h>
#include <curl/curl.h>
#include <jansson.h>
#include <stdatomic.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine.h"
#include "kettle.h"
#include "server/http.h"
#include "base/timing.h"
#include "server/openai.h"
#include "testutil.h"


static kt_model *g_model;
static atomic_bool g_json_oom; /* jansson's allocations fail while set */

static void *json_malloc(size_t n) {
    return atomic_load(&g_json_oom) ? NULL : malloc(n);
}

static int setup(void **state) {
    (void)state;
    json_set_alloc_funcs(json_malloc, free); /* before any server thread */
    curl_global_init(CURL_GLOBAL_DEFAULT);
    kt_error err = {0};
    g_model = kt_model_load(tu_shared("models/stories260K.gguf"), &err);
    if (!g_model) fprintf(stderr, "%s\n", err.msg);
    return g_model ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    kt_model_free(g_model);
    return 0;
}

typedef struct rig {
    kt_engine *engine;
    srv_server *srv;
    int port;
} rig;

/* A held engine of n_parallel sequences and steps of batch_tokens behind
 * a server of cfg. */
static rig rig_start_with(int n_parallel, int batch_tokens, srv_config cfg) {
    kt_engine_params p = kt_engine_defaults();
    p.n_ctx = 512, p.n_parallel = n_parallel, p.batch_tokens = batch_tokens, p.n_threads = 1;
    p.strict_max_tokens = true; /* test_stop_while_refusing's max_tokens past the context is refused, not cut */
    kt_error err = {0};
    rig r = {0};
    r.engine = kt_engine_new(g_model, &p, &err);
    if (!r.engine) fail_msg("%s", err.msg);
    kt_engine_hold(r.engine, true);
    r.srv = srv_start(g_model, r.engine, &cfg, &err);
    if (!r.srv) fail_msg("%s", err.msg);
    r.port = srv_port(r.srv);
    return r;
}

/* One sequence at a time and 16-token steps: a second request queues, and
 * a 200-token prompt takes 13 steps to read. */
static rig rig_start(void) {
    return rig_start_with(1, 16, (srv_config){.port = 0, .model_name = "stories260K", .http_threads = 2});
}

static void rig_stop(rig *r) {
    kt_engine_hold(r->engine, false);
    srv_stop(r->srv); /* frees the engine */
}

static kt_engine_stats stats(const rig *r) {
    kt_engine_stats st;
    kt_engine_get_stats(r->engine, &st);
    return st;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Waits (up to 10 s) until the HTTP thread has queued `n` requests. */
static void wait_queued(const rig *r, int n) {
    for (int i = 0; i < 1000 && stats(r).queue_depth < n; i++) sleep_ms(10);
    assert_int_equal(stats(r).queue_depth, n);
}

/* A completion request of a prompt of `words` words on a raw socket. */
static int send_request(const rig *r, int words, bool stream) {
    char prompt[4096] = "";
    for (int i = 0; i < words; i++) strcat(prompt, i % 2 ? " the cat" : " a dog");
    char body[8192], req[9000];
    int n = snprintf(body, sizeof body,
                     "{\"prompt\":\"%s\",\"max_tokens\":200,\"temperature\":0,\"ignore_eos\":true,\"stream\":%s}",
                     prompt, stream ? "true" : "false");
    int len = snprintf(req, sizeof req,
                       "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                       "Content-Length: %d\r\n\r\n%s",
                       n, body);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)r->port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(send(fd, req, (size_t)len, 0), len);
    return fd;
}

/* A stream's first event arrives within 10 s (the headers come before
 * it, when the response starts). */
static void expect_event(int fd) {
    char buf[8192];
    size_t got = 0;
    for (int i = 0; i < 1000 && !memmem(buf, got, "data: ", 6); i++) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 10) != 1) continue;
        ssize_t n = recv(fd, buf + got, sizeof buf - got, 0);
        assert_true(n > 0 && got + (size_t)n < sizeof buf);
        got += (size_t)n;
    }
    assert_non_null(memmem(buf, got, "data: ", 6));
}

/* The request has its first token: for a stream, its bytes are here. */
static void run_to_first_token(const rig *r, int fd, bool stream) {
    uint64_t before = stats(r).generated_tokens;
    for (int i = 0; i < 100 && stats(r).generated_tokens == before; i++) kt_engine_run_steps(r->engine, 1);
    assert_true(stats(r).generated_tokens > before);
    if (stream) expect_event(fd);
}

/* Hangs up; the very next step must cancel the request and free its KV. */
static void hang_up_and_step(const rig *r, int fd, int still_running) {
    uint64_t cancelled = stats(r).requests_finished[KT_FINISH_CANCELLED];
    close(fd);
    kt_engine_run_steps(r->engine, 1);
    kt_engine_stats st = stats(r);
    assert_int_equal(st.requests_finished[KT_FINISH_CANCELLED], cancelled + 1);
    assert_int_equal(st.requests_running, still_running);
    if (!still_running) {
        assert_int_equal(st.kv_blocks_used, 0);
        assert_int_equal(st.kv_blocks_reserved, 0);
    }
}

static void check_stages(bool stream) {
    rig r = rig_start();

    /* prefilling: 200 words, 16 tokens a step */
    int fd = send_request(&r, 100, stream);
    wait_queued(&r, 1);
    kt_engine_run_steps(r.engine, 2);
    kt_engine_stats st = stats(&r);
    assert_int_equal(st.requests_running, 1);
    assert_true(st.kv_blocks_reserved > 0);
    assert_int_equal(st.prompt_tokens, 32); /* two steps of 16 */
    assert_int_equal(st.generated_tokens, 0);
    hang_up_and_step(&r, fd, 0);

    /* decoding */
    fd = send_request(&r, 4, stream);
    wait_queued(&r, 1);
    run_to_first_token(&r, fd, stream);
    hang_up_and_step(&r, fd, 0);

    /* queued behind a running request, which goes on */
    int busy = send_request(&r, 4, true);
    wait_queued(&r, 1);
    run_to_first_token(&r, busy, true);
    fd = send_request(&r, 4, stream);
    wait_queued(&r, 1);
    uint64_t cancelled = stats(&r).requests_finished[KT_FINISH_CANCELLED];
    close(fd);
    kt_engine_run_steps(r.engine, 1);
    st = stats(&r);
    assert_int_equal(st.requests_finished[KT_FINISH_CANCELLED], cancelled + 1);
    assert_int_equal(st.queue_depth, 0);
    assert_int_equal(st.requests_running, 1);
    hang_up_and_step(&r, busy, 0);

    rig_stop(&r);
}

static void test_hang_up_plain(void **state) {
    (void)state;
    check_stages(false);
}

static void test_hang_up_stream(void **state) {
    (void)state;
    check_stages(true);
}

/* A client that stays is not mistaken for one that left: with the engine
 * running freely, a request whose client keeps its socket open finishes. */
static void test_client_that_stays(void **state) {
    (void)state;
    rig r = rig_start();
    kt_engine_hold(r.engine, false);
    int fd = send_request(&r, 4, false);
    char buf[65536];
    size_t got = 0;
    for (int i = 0; i < 1000 && !memmem(buf, got, "\"finish_reason\"", 15); i++) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 10) != 1) continue;
        ssize_t n = recv(fd, buf + got, sizeof buf - 1 - got, 0);
        assert_true(n > 0);
        got += (size_t)n;
    }
    buf[got] = 0;
    assert_non_null(strstr(buf, "HTTP/1.1 200"));
    assert_non_null(strstr(buf, "\"finish_reason\":\"length\""));
    close(fd);
    assert_int_equal(stats(&r).requests_finished[KT_FINISH_CANCELLED], 0);
    rig_stop(&r);
}

/* srv_chunk_event tells "nothing to send" from "out of memory". */
static void test_chunk_event_oom(void **state) {
    (void)state;
    srv_gen_req g = {.kind = SRV_CHAT, .n_choices = 1, .top_logprobs = -1};
    srv_reply rp;
    assert_true(srv_reply_init(&rp, &g, g_model, "m", "id", 0));
    kt_event ev = {.choice = 0, .token = 5, .text = "hi", .text_len = 2};
    json_t *j = NULL;
    assert_true(srv_chunk_event(&rp, &ev, false, &j));
    assert_non_null(j);
    json_decref(j);
    kt_event empty = {.choice = 0, .token = -1, .text = "", .text_len = 0};
    assert_true(srv_chunk_event(&rp, &empty, false, &j));
    assert_null(j);
    atomic_store(&g_json_oom, true);
    bool ok = srv_chunk_event(&rp, &ev, false, &j);
    atomic_store(&g_json_oom, false);
    assert_false(ok);
    assert_null(j);
    srv_reply_free(&rp);
}

/* Reads until the stream's end ([DONE]) or 10 s; returns what came. */
static char *read_stream(int fd) {
    size_t cap = 1 << 16, got = 0;
    char *buf = tu_xmalloc(cap);
    for (int i = 0; i < 1000; i++) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 10) != 1) continue;
        ssize_t n = recv(fd, buf + got, cap - 1 - got, 0);
        if (n <= 0) break;
        got += (size_t)n;
        buf[got] = 0;
        if (strstr(buf, "data: [DONE]") || got + 1 >= cap) break;
    }
    buf[got] = 0;
    return buf;
}

/* A stream whose next chunk cannot be allocated ends with an error event
 * the client can read, then [DONE]; the request is cancelled. */
static void test_stream_out_of_memory(void **state) {
    (void)state;
    rig r = rig_start();
    int fd = send_request(&r, 4, true);
    wait_queued(&r, 1);
    run_to_first_token(&r, fd, true);
    atomic_store(&g_json_oom, true);
    kt_engine_run_steps(r.engine, 1); /* a token the stream cannot turn into a chunk */
    char *got = read_stream(fd);
    atomic_store(&g_json_oom, false);
    if (!strstr(got, "\"code\":\"out_of_memory\"") || !strstr(got, "data: [DONE]"))
        fail_msg("no out-of-memory ending in: %s", got);
    free(got);
    uint64_t cancelled = stats(&r).requests_finished[KT_FINISH_CANCELLED];
    kt_engine_run_steps(r.engine, 1);
    assert_int_equal(stats(&r).requests_finished[KT_FINISH_CANCELLED], cancelled + 1);
    assert_int_equal(stats(&r).requests_running, 0);
    close(fd);
    rig_stop(&r);
}

/* Sends a request the engine refuses (max_tokens past the context) and
 * returns the HTTP status, or 0 once the server no longer accepts. */
static int refused_request(int port) {
    static const char body[] = "{\"prompt\":\"a dog\",\"max_tokens\":100000}";
    char req[512];
    int len = snprintf(req, sizeof req,
                       "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                       "Content-Length: %zu\r\n\r\n%s",
                       sizeof body - 1, body);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int status = 0;
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0 && send(fd, req, (size_t)len, 0) == len) {
        char buf[2048];
        ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
        if (n > 12 && !strncmp(buf, "HTTP/1.1 ", 9)) status = atoi(buf + 9);
        else status = n <= 0 ? 0 : -1; /* closed or reset at shutdown, or not HTTP */
    }
    if (fd >= 0) close(fd);
    return status;
}

typedef struct hammer {
    int port, answered, bad;
    atomic_bool stop;
} hammer;

static void *hammer_main(void *arg) {
    hammer *h = arg;
    for (int i = 0; i < 2000 && !atomic_load(&h->stop); i++) {
        int st = refused_request(h->port);
        if (st == 0) break;
        if (st == 400 || st == 503) __atomic_add_fetch(&h->answered, 1, __ATOMIC_RELAXED);
        else __atomic_store_n(&h->bad, st, __ATOMIC_RELAXED);
    }
    return NULL;
}

/* Refused submits racing the shutdown: each is answered 400 (or 503 once
 * the engine is gone), never anything else. Under ThreadSanitizer this
 * also checks that the submit path reads the engine pointer only under
 * engine_mu (it once read it after unlocking, to word the error). */
static void test_stop_while_refusing(void **state) {
    (void)state;
    rig r = rig_start();
    kt_engine_hold(r.engine, false);
    hammer h = {.port = r.port};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&t[i], NULL, hammer_main, &h), 0);
    for (int i = 0; i < 1000 && __atomic_load_n(&h.answered, __ATOMIC_RELAXED) < 20; i++) sleep_ms(5);
    assert_true(__atomic_load_n(&h.answered, __ATOMIC_RELAXED) >= 20);
    srv_stop(r.srv); /* frees the engine while submits are in flight */
    atomic_store(&h.stop, true);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    assert_int_equal(__atomic_load_n(&h.bad, __ATOMIC_RELAXED), 0);
}

/* One request with Connection: close; the status (0: no answer) and, in
 * body (cap bytes), what came. */
static int one_request(int port, const char *method, const char *path, const char *body, char *out, size_t cap) {
    char req[1024];
    int len = snprintf(req, sizeof req,
                       "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\n"
                       "Content-Length: %zu\r\n\r\n%s",
                       method, path, strlen(body), body);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(send(fd, req, (size_t)len, 0), len);
    size_t got = 0;
    ssize_t n;
    while (got + 1 < cap && (n = recv(fd, out + got, cap - 1 - got, 0)) > 0) got += (size_t)n;
    out[got] = 0;
    close(fd);
    return !strncmp(out, "HTTP/1.1 ", 9) ? atoi(out + 9) : 0;
}

static const char SHORT_COMPLETION[] = "{\"prompt\":\"a dog\",\"max_tokens\":4}";

/* Bound before the model: 503 "loading" until srv_ready, then 200. */
static void test_health_while_loading(void **state) {
    (void)state;
    kt_error err = {0};
    srv_config cfg = {.port = 0, .model_name = "stories260K", .http_threads = 2};
    srv_server *srv = srv_open(&cfg, &err);
    if (!srv) fail_msg("%s", err.msg);
    int port = srv_port(srv);
    char buf[8192];
    assert_int_equal(srv_get_state(srv), SRV_LOADING);
    assert_int_equal(one_request(port, "GET", "/health", "", buf, sizeof buf), 503);
    assert_non_null(strstr(buf, "{\"status\":\"loading\"}"));
    assert_int_equal(one_request(port, "POST", "/v1/completions", SHORT_COMPLETION, buf, sizeof buf), 503);
    assert_non_null(strstr(buf, "Retry-After: 1"));
    assert_non_null(strstr(buf, "\"code\":\"loading\""));
    assert_int_equal(one_request(port, "GET", "/v1/models", "", buf, sizeof buf), 503);
    assert_int_equal(one_request(port, "GET", "/metrics", "", buf, sizeof buf), 200);
    kt_engine_params p = kt_engine_defaults();
    p.n_ctx = 512, p.n_parallel = 1, p.n_threads = 1;
    kt_engine *engine = kt_engine_new(g_model, &p, &err);
    if (!engine) fail_msg("%s", err.msg);
    srv_ready(srv, g_model, engine, KT_POOL_NONE);
    assert_int_equal(one_request(port, "GET", "/health", "", buf, sizeof buf), 200);
    assert_non_null(strstr(buf, "\"state\":\"ready\""));
    assert_non_null(strstr(buf, "\"kv_blocks_free\":"));
    assert_int_equal(one_request(port, "POST", "/v1/completions", SHORT_COMPLETION, buf, sizeof buf), 200);
    srv_stop(srv);
}

/* Draining: the stream that runs ends normally ("length", not
 * "cancelled"); meanwhile /health and new generation are 503, other
 * endpoints still answer; once it ends nothing is busy. */
static void test_drain_lets_running_finish(void **state) {
    (void)state;
    rig r = rig_start();
    int fd = send_request(&r, 4, true);
    wait_queued(&r, 1);
    run_to_first_token(&r, fd, true);
    char buf[8192];
    assert_int_equal(one_request(r.port, "GET", "/health", "", buf, sizeof buf), 200);
    srv_drain(r.srv);
    assert_int_equal(srv_get_state(r.srv), SRV_DRAINING);
    assert_int_equal(srv_busy(r.srv), 1);
    assert_int_equal(one_request(r.port, "GET", "/health", "", buf, sizeof buf), 503);
    assert_non_null(strstr(buf, "\"status\":\"draining\""));
    assert_int_equal(one_request(r.port, "POST", "/v1/completions", SHORT_COMPLETION, buf, sizeof buf), 503);
    assert_non_null(strstr(buf, "\"code\":\"draining\""));
    assert_non_null(strstr(buf, "Retry-After: 1"));
    assert_int_equal(one_request(r.port, "POST", "/tokenize", "{\"content\":\"a dog\"}", buf, sizeof buf), 200);
    assert_int_equal(stats(&r).queue_depth, 0); /* the refused request never reached the engine */
    kt_engine_hold(r.engine, false);
    char *got = read_stream(fd);
    if (!strstr(got, "\"finish_reason\":\"length\"") || !strstr(got, "data: [DONE]"))
        fail_msg("the drained stream did not end normally: ...%s", strlen(got) > 400 ? got + strlen(got) - 400 : got);
    free(got);
    close(fd);
    for (int i = 0; i < 500 && srv_busy(r.srv); i++) sleep_ms(10);
    assert_int_equal(srv_busy(r.srv), 0);
    assert_int_equal(stats(&r).requests_finished[KT_FINISH_CANCELLED], 0);
    rig_stop(&r);
}

/* ---- keep-alives ---- */

#define IDLE_TIMEOUT_MS 2000 /* the clients give up on a stream silent this long */

typedef enum api { API_CHAT, API_COMPLETIONS, API_RESPONSES, API_MESSAGES, N_APIS } api;

/* prompts that differ, so none waits to share another's prefill */
#define TELL(what) "\"messages\":[{\"role\":\"user\",\"content\":\"Tell me " what "\"}]"
static const struct {
    const char *path, *body;
    const char *text; /* in the first event that carries text, and none before */
} APIS[N_APIS] = {
    {"/v1/chat/completions", "{" TELL("a story") ",\"max_tokens\":16,\"temperature\":0,\"ignore_eos\":true,\"stream\":true}",
     "\"delta\":{\"content\":\""},
    {"/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":16,\"temperature\":0,\"ignore_eos\":true,"
     "\"stream\":true}", "\"text\":\""},
    {"/v1/responses", "{\"input\":\"Tell me a joke\",\"max_output_tokens\":16,\"temperature\":0,\"stream\":true}",
     "response.output_text.delta"},
    {"/v1/messages", "{" TELL("a tale") ",\"max_tokens\":16,\"temperature\":0,\"stream\":true}", "content_block_delta"},
};

/* One streaming client: libcurl, giving up after IDLE_TIMEOUT_MS without
 * a byte (checked every 50 ms by the loop; libcurl's own low-speed limit,
 * 1 byte/s over 2 s, is set too, as a client would). */
typedef struct ka_client {
    api api;
    CURL *h;
    char *data;
    size_t len, cap;
    double last_byte_ms;
    atomic_bool has_text;  /* the first text event came */
    atomic_bool gave_up;   /* silent for IDLE_TIMEOUT_MS, or libcurl's low-speed limit */
    bool done;
    CURLcode rc;
    long status;
} ka_client;

typedef struct ka_run {
    int port;
    ka_client c[N_APIS];
} ka_run;

static size_t ka_on_body(char *p, size_t size, size_t n, void *arg) {
    ka_client *c = arg;
    size_t len = size * n;
    if (c->len + len + 1 > c->cap) {
        c->cap = (c->len + len + 1) * 2;
        c->data = realloc(c->data, c->cap);
        if (!c->data) return 0;
    }
    memcpy(c->data + c->len, p, len);
    c->len += len;
    c->data[c->len] = 0;
    c->last_byte_ms = kt_time_ms();
    if (strstr(c->data, APIS[c->api].text)) atomic_store(&c->has_text, true);
    return len;
}

static size_t ka_on_header(char *p, size_t size, size_t n, void *arg) {
    (void)p;
    ((ka_client *)arg)->last_byte_ms = kt_time_ms();
    return size * n;
}

static void ka_add(CURLM *m, ka_client *c, int port, struct curl_slist *headers) {
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, APIS[c->api].path);
    c->h = curl_easy_init();
    assert_non_null(c->h);
    curl_easy_setopt(c->h, CURLOPT_URL, url);
    curl_easy_setopt(c->h, CURLOPT_POSTFIELDS, APIS[c->api].body);
    curl_easy_setopt(c->h, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(c->h, CURLOPT_WRITEFUNCTION, ka_on_body);
    curl_easy_setopt(c->h, CURLOPT_WRITEDATA, c);
    curl_easy_setopt(c->h, CURLOPT_HEADERFUNCTION, ka_on_header);
    curl_easy_setopt(c->h, CURLOPT_HEADERDATA, c);
    curl_easy_setopt(c->h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c->h, CURLOPT_LOW_SPEED_TIME, 2L);
    c->last_byte_ms = kt_time_ms();
    curl_multi_add_handle(m, c->h);
}

/* Gives up on the clients silent for IDLE_TIMEOUT_MS. */
static void ka_idle_check(CURLM *m, ka_run *run) {
    double now = kt_time_ms();
    for (int i = 0; i < N_APIS; i++) {
        ka_client *c = &run->c[i];
        if (c->done || now - c->last_byte_ms < IDLE_TIMEOUT_MS) continue;
        curl_multi_remove_handle(m, c->h);
        c->done = true;
        atomic_store(&c->gave_up, true);
    }
}

/* Every API's stream at once, until each has ended or its client gave up. */
static void *ka_clients(void *arg) {
    ka_run *run = arg;
    CURLM *m = curl_multi_init();
    struct curl_slist *headers = curl_slist_append(NULL, "Content-Type: application/json");
    for (int i = 0; i < N_APIS; i++) run->c[i].api = (api)i, ka_add(m, &run->c[i], run->port, headers);
    for (int left = N_APIS; left > 0;) {
        int running, queued;
        curl_multi_perform(m, &running);
        CURLMsg *msg;
        while ((msg = curl_multi_info_read(m, &queued)))
            for (int i = 0; msg->msg == CURLMSG_DONE && i < N_APIS; i++) {
                ka_client *c = &run->c[i];
                if (c->h != msg->easy_handle) continue;
                c->rc = msg->data.result, c->done = true;
                curl_easy_getinfo(c->h, CURLINFO_RESPONSE_CODE, &c->status);
                if (c->rc == CURLE_OPERATION_TIMEDOUT) atomic_store(&c->gave_up, true);
                curl_multi_remove_handle(m, c->h);
            }
        ka_idle_check(m, run);
        left = 0;
        for (int i = 0; i < N_APIS; i++) left += !run->c[i].done;
        if (left) curl_multi_poll(m, NULL, 0, 50, NULL);
    }
    for (int i = 0; i < N_APIS; i++) curl_easy_cleanup(run->c[i].h);
    curl_multi_cleanup(m);
    curl_slist_free_all(headers);
    return NULL;
}

/* What a stream held: keep-alives before and after its first text event. */
typedef struct ka_tally {
    int before, after;
    bool ended; /* its last event is the API's end */
} ka_tally;

/* One event (an SSE block, its "\n\n" cut off) of an API that names its
 * events: the data's type is the event's name; Anthropic's ping is
 * exactly {"type":"ping"}. Returns the type (valid while j lives). */
static const char *ka_named_event(api a, char *block, json_t **j) {
    char *data = strstr(block, "\ndata: ");
    if (strncmp(block, "event: ", 7) || !data) fail_msg("%s: not an event: %s", APIS[a].path, block);
    *data = 0;
    json_error_t je;
    *j = json_loads(data + 7, 0, &je);
    const char *type = json_string_value(json_object_get(*j, "type"));
    if (!type || strcmp(type, block + 7)) fail_msg("%s: event %s has data %s", APIS[a].path, block + 7, data + 7);
    if (!strcmp(type, "ping") && json_object_size(*j) != 1) fail_msg("a ping with more: %s", data + 7);
    return type;
}

/* Checks every event of a stream (whole or cut short) and counts its
 * keep-alives: SSE comments, and on /v1/messages ping events (but the one
 * that always follows message_start); there comments may only come before
 * message_start, and pings only after it. */
static ka_tally ka_check_stream(api a, const char *data) {
    ka_tally t = {0};
    char *copy = strdup(data), *save = NULL, *last = NULL;
    bool text = false;
    int n = 0, seq = -1; /* n: events so far, comments not counted */
    for (char *b = copy; b && *b; b = save) {
        char *end = strstr(b, "\n\n");
        if (!end) fail_msg("%s: a cut event at the end: %s", APIS[a].path, b);
        const char *orig = data + (b - copy); /* the block as it came (b is cut up below) */
        text = text || memmem(orig, (size_t)(end - b), APIS[a].text, strlen(APIS[a].text));
        *end = 0, save = end + 2;
        bool ka = false;
        json_t *j = NULL;
        if (b[0] == ':') {
            if (strcmp(b, ": keep-alive") || (a == API_MESSAGES && n > 0))
                fail_msg("%s: comment %s after %d events", APIS[a].path, b, n);
            ka = true;
        } else if (a == API_CHAT || a == API_COMPLETIONS) {
            if (strncmp(b, "data: ", 6)) fail_msg("%s: not a data line: %s", APIS[a].path, b);
            if (strcmp(b, "data: [DONE]") && !(j = json_loads(b + 6, 0, NULL))) fail_msg("not JSON: %s", b);
            last = b, n++;
        } else {
            const char *type = ka_named_event(a, b, &j);
            if (n == 0 && strcmp(type, a == API_MESSAGES ? "message_start" : "response.created"))
                fail_msg("%s: the first event is %s", APIS[a].path, type);
            if (a == API_RESPONSES) { /* the comments are not events: no number is skipped */
                json_int_t sn = json_integer_value(json_object_get(j, "sequence_number"));
                if (sn != ++seq) fail_msg("sequence_number %lld after %d", (long long)sn, seq - 1);
            }
            ka = !strcmp(type, "ping") && n != 1; /* n 1: the ping of the stream's start */
            last = strcpy(b, type), n++;
        }
        json_decref(j);
        if (ka) *(text ? &t.after : &t.before) += 1;
    }
    const char *want = a == API_MESSAGES ? "message_stop" : a == API_RESPONSES ? "response." : "data: [DONE]";
    t.ended = last && !strncmp(last, want, strlen(want)) && (a != API_RESPONSES || strstr(last, "complete"));
    free(copy);
    return t;
}

static bool ka_all_have_text(ka_run *run) {
    for (int i = 0; i < N_APIS; i++)
        if (!atomic_load(&run->c[i].has_text)) return false;
    return true;
}

static srv_config ka_config(int keepalive_ms) {
    return (srv_config){.port = 0, .model_name = "stories260K", .http_threads = 2, .sse_keepalive_ms = keepalive_ms,
                        .template_text = kt_chat_builtin_template("chatml")};
}

/* With keep-alives every second, clients that give up after 2 s of
 * silence wait 10 s for their first token and 2.5 s between two, then get
 * the whole answer: comments while queued (on /v1/messages too: its
 * message_start waits for the first token), then between tokens pings on
 * /v1/messages and comments elsewhere. */
static void test_keepalive_holds_idle_clients(void **state) {
    (void)state;
    rig r = rig_start_with(N_APIS, 512, ka_config(1000));
    ka_run run = {.port = r.port};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, ka_clients, &run), 0);
    wait_queued(&r, N_APIS);
    sleep_ms(10000); /* queued, as behind a long prefill */
    /* the prompts, read whole (512-token steps): a first token each, in a step or a few */
    for (int i = 0; i < 8 && !ka_all_have_text(&run); i++) {
        kt_engine_run_steps(r.engine, 1);
        for (int k = 0; k < 100 && !ka_all_have_text(&run); k++) sleep_ms(10);
    }
    bool text = ka_all_have_text(&run);
    if (text) sleep_ms(2500); /* a gap between tokens */
    kt_engine_hold(r.engine, false);
    pthread_join(t, NULL); /* before any check: the clients write to `run` */
    for (int i = 0; i < N_APIS; i++) {
        ka_client *c = &run.c[i];
        if (atomic_load(&c->gave_up) || c->rc != CURLE_OK || c->status != 200)
            fail_msg("%s: gave up %d, curl %d, status %ld: %s", APIS[i].path, atomic_load(&c->gave_up), c->rc,
                     c->status, c->data ? c->data : "");
        ka_tally k = ka_check_stream((api)i, c->data);
        if (!k.ended || k.before < 8 || k.after < 1)
            fail_msg("%s: ended %d, %d keep-alives before the text, %d after: %s", APIS[i].path, k.ended, k.before,
                     k.after, c->data);
        free(c->data);
    }
    assert_true(text);
    rig_stop(&r);
}

/* The negative control: without keep-alives (0) the same clients give up
 * on every API while the engine is held, with nothing but the streams'
 * opening events (none on /v1/messages) received. */
static void test_keepalive_off_clients_give_up(void **state) {
    (void)state;
    rig r = rig_start_with(N_APIS, 512, ka_config(0));
    ka_run run = {.port = r.port};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, ka_clients, &run), 0);
    wait_queued(&r, N_APIS);
    bool all = false;
    for (int i = 0; i < 600 && !all; i++) { /* up to 6 s, 2 s of silence each */
        sleep_ms(10);
        all = true;
        for (int k = 0; k < N_APIS; k++) all = all && atomic_load(&run.c[k].gave_up);
    }
    kt_engine_hold(r.engine, false); /* any client still there gets its answer, and the test fails */
    pthread_join(t, NULL);
    for (int i = 0; i < N_APIS; i++) {
        ka_client *c = &run.c[i];
        if (!atomic_load(&c->gave_up)) fail_msg("%s: the client did not give up: %s", APIS[i].path, c->data);
        ka_tally k = ka_check_stream((api)i, c->data ? c->data : "");
        assert_int_equal(k.before + k.after, 0);
        assert_false(k.ended);
        free(c->data);
    }
    rig_stop(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hang_up_plain),
        cmocka_unit_test(test_hang_up_stream),
        cmocka_unit_test(test_client_that_stays),
        cmocka_unit_test(test_chunk_event_oom),
        cmocka_unit_test(test_stream_out_of_memory),
        cmocka_unit_test(test_stop_while_refusing),
        cmocka_unit_test(test_health_while_loading),
        cmocka_unit_test(test_drain_lets_running_finish),
        cmocka_unit_test(test_keepalive_holds_idle_clients),
        cmocka_unit_test(test_keepalive_off_clients_give_up),
    };
    return tu_result(cmocka_run_group_tests(tests, setup, teardown));
}
