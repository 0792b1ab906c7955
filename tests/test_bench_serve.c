/*
 * test_bench_serve.c - `kettle bench serve`, the server load generator.
 *
 * Its stream parser and percentiles are checked on fixed text and numbers
 * (the parser is fed a stream split at every byte, as the network may
 * split it); then a few-second smoke run against a real `kettle serve` on
 * stories260K checks that the output parses and its numbers are sane
 * (positive, p50 <= p95 <= p99, tokens = requests x max_tokens, ratios
 * consistent), that --long-prompt reports its extra figures, and that
 * failures (unreachable server, rejected request, bad options) give a
 * message naming the level and request and a non-zero exit status.
 * Every time figure is at most the command's own duration (the test's
 * clock), and a run against a fake server that answers at a known pace
 * bounds TTFT, ITL and wall time from below too, so a figure in the wrong
 * unit fails. Benchmarks are not tests: no speed is asserted.
 */
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/bench_serve.h"
#include "fake_server.h"
#include "testutil.h"

static const char SSE_COMPLETION[] =
    "data: {\"id\":\"c1\",\"object\":\"text_completion\",\"choices\":[{\"text\":\"Once\",\"index\":0,"
    "\"finish_reason\":null}],\"usage\":null}\n\n"
    "data: {\"id\":\"c1\",\"choices\":[{\"text\":\" upon\",\"index\":0,\"finish_reason\":null}]}\r\n\r\n"
    ": a comment line\n\n"
    "data: {\"id\":\"c1\",\"choices\":[{\"text\":\"\",\"index\":0,\"finish_reason\":\"length\"}]}\n\n"
    "data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,"
    "\"total_tokens\":7}}\n\n"
    "data: [DONE]\n\n";

/* The stream split into two pieces at every offset, the second piece
 * arriving later: the same result, the second token stamped with the time
 * its line was completed. */
static void test_sse_split_anywhere(void **state) {
    (void)state;
    size_t n = strlen(SSE_COMPLETION);
    size_t end1 = (size_t)(strchr(SSE_COMPLETION, '\n') - SSE_COMPLETION);
    size_t end2 = (size_t)(strchr(strstr(SSE_COMPLETION, "\" upon\""), '\n') - SSE_COMPLETION);
    for (size_t cut = 0; cut <= n; cut++) {
        bs_sse s;
        bs_sse_init(&s);
        assert_true(bs_sse_feed(&s, SSE_COMPLETION, cut, 10.0));
        assert_true(bs_sse_feed(&s, SSE_COMPLETION + cut, n - cut, 20.0));
        assert_true(s.done);
        assert_int_equal(s.n_tok, 2);
        assert_int_equal(s.completion_tokens, 2);
        assert_int_equal(s.prompt_tokens, 5);
        assert_int_equal(s.n_length, 1);
        assert_string_equal(s.finish, "length");
        /* a token is stamped when the line holding it is complete */
        assert_true(s.tok_ms[0] == (cut > end1 ? 10.0 : 20.0));
        assert_true(s.tok_ms[1] == (cut > end2 ? 10.0 : 20.0));
        bs_sse_free(&s);
    }
}

static void test_sse_chat_and_errors(void **state) {
    (void)state;
    bs_sse s;
    bs_sse_init(&s);
    const char *chat = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"
                       "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n"
                       "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n";
    assert_true(bs_sse_feed(&s, chat, strlen(chat), 1.0));
    assert_int_equal(s.n_tok, 1); /* the role chunk carries no text */
    assert_int_equal(s.n_stop, 1);
    assert_int_equal(s.completion_tokens, -1);
    assert_true(s.done);
    bs_sse_free(&s);

    const char *err = "data: {\"error\":{\"message\":\"out of KV blocks\",\"type\":\"server_error\"}}\n";
    assert_false(bs_sse_feed(&s, err, strlen(err), 1.0));
    assert_non_null(strstr(s.error, "out of KV blocks"));
    bs_sse_free(&s);

    assert_false(bs_sse_feed(&s, "data: {not json\n", 16, 1.0));
    assert_non_null(strstr(s.error, "not a JSON object"));
    bs_sse_free(&s);
}

/* Nearest rank: sorted[ceil(p/100 n) - 1]. */
static void test_percentiles(void **state) {
    (void)state;
    double v[20];
    for (int i = 0; i < 20; i++) v[i] = 20 - i; /* 20..1, sorted by bs_pcts_of */
    bs_pcts p = bs_pcts_of(v, 10);               /* 20..11 -> 11..20 */
    assert_true(p.p50 == 15 && p.p95 == 20 && p.p99 == 20 && p.max == 20 && p.n == 10);
    p = bs_pcts_of(v, 0);
    assert_true(p.max == 0 && p.n == 0);
    for (int i = 0; i < 20; i++) v[i] = i + 1;
    assert_true(bs_percentile(v, 20, 95) == 19); /* rank exactly 19, no rounding up */
    assert_true(bs_percentile(v, 20, 50) == 10);
    assert_true(bs_percentile(v, 20, 99) == 20);
    assert_true(bs_percentile(v, 20, 0) == 1);
    assert_true(bs_percentile(v, 1, 99) == 1);
    assert_true(bs_percentile(v, 0, 50) == 0);
}

static double pct(json_t *level, const char *figure, const char *which) {
    return json_number_value(json_object_get(json_object_get(level, figure), which));
}

/* ITL may be 0: two chunks can arrive in one read. */
static void check_pcts(json_t *p, int min_samples, bool may_be_zero) {
    double p50 = json_number_value(json_object_get(p, "p50")), p95 = json_number_value(json_object_get(p, "p95")),
           p99 = json_number_value(json_object_get(p, "p99")), max = json_number_value(json_object_get(p, "max"));
    assert_true(json_integer_value(json_object_get(p, "samples")) >= min_samples);
    assert_true((p50 > 0 || (may_be_zero && p50 == 0)) && p50 <= p95 && p95 <= p99 && p99 <= max && isfinite(max));
}

/* The JSON of `kettle bench serve -m stories260K ARGS`; *wall_ms: how long
 * the whole command took by the test's clock, the most any of its time
 * figures can be. */
static json_t *run_json(const char *args, int want_rc, double *wall_ms) {
    char cmd[8192], *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd, "%s bench serve -m '%s' -t 2 %s --json", KT_BIN, tu_shared("models/stories260K.gguf"),
             args);
    double t0 = tu_now_ms();
    int rc = tu_run(cmd, &out, &err);
    *wall_ms = tu_now_ms() - t0;
    if (rc != want_rc) fprintf(stderr, "%s\n-> %d\n%s\n%s\n", cmd, rc, out, err);
    assert_int_equal(rc, want_rc);
    json_error_t jerr;
    json_t *doc = json_loads(out, 0, &jerr);
    if (!doc) fprintf(stderr, "not JSON: %s\n%s\n", jerr.text, out);
    assert_non_null(doc);
    free(out), free(err);
    return doc;
}

/* max_ms: the command's duration, which no time figure can exceed. */
static void check_level(json_t *l, int c, int n_req, int max_tokens, double max_ms) {
    assert_int_equal(json_integer_value(json_object_get(l, "concurrency")), c);
    assert_int_equal(json_integer_value(json_object_get(l, "requests")), n_req);
    long tokens = (long)json_integer_value(json_object_get(l, "tokens"));
    assert_int_equal(tokens, n_req * max_tokens); /* ignore_eos: every request runs to max_tokens */
    assert_int_equal(json_integer_value(json_object_get(l, "finish_length")), n_req);
    double pt = json_number_value(json_object_get(l, "prompt_tokens_mean"));
    assert_true(pt >= 16 && pt <= 64); /* asked for about 32 */
    double wall = json_number_value(json_object_get(l, "wall_ms")), tps = json_number_value(json_object_get(l, "tokens_per_s"));
    assert_true(wall > 0 && tps > 0 && fabs(tps - tokens / (wall / 1e3)) < 1e-3 * tps);
    assert_true(wall <= max_ms);
    check_pcts(json_object_get(l, "ttft_ms"), n_req, false);
    /* one gap between consecutive token chunks; a chunk may hold no text */
    json_t *itl = json_object_get(l, "itl_ms");
    check_pcts(itl, 1, true);
    /* a request's TTFT and each of its gaps lie within the level's time */
    assert_true(pct(l, "ttft_ms", "max") <= wall && pct(l, "itl_ms", "max") <= wall);
    assert_true(json_integer_value(json_object_get(itl, "samples")) <= tokens - n_req);
    assert_true(json_is_null(json_object_get(l, "long_prompt")));
}

static void test_smoke_levels(void **state) {
    (void)state;
    const char *svg = tu_tmp("bench_serve.svg");
    remove(svg);
    char args[4096];
    snprintf(args, sizeof args, "-c 1,2,4 --requests 4 -p 32 -n 16 --svg '%s'", svg);
    double cmd_ms;
    json_t *doc = run_json(args, 0, &cmd_ms);
    assert_int_equal(json_integer_value(json_object_get(doc, "max_tokens")), 16);
    assert_int_equal(json_integer_value(json_object_get(doc, "ratio_base_concurrency")), 1);
    json_t *lv = json_object_get(doc, "levels");
    assert_int_equal(json_array_size(lv), 3);
    double tps1 = json_number_value(json_object_get(json_array_get(lv, 0), "tokens_per_s"));
    for (size_t i = 0; i < 3; i++) {
        json_t *l = json_array_get(lv, i);
        check_level(l, 1 << i, 4, 16, cmd_ms);
        double ratio = json_number_value(json_object_get(l, "ratio"));
        assert_true(fabs(ratio - json_number_value(json_object_get(l, "tokens_per_s")) / tps1) < 1e-3 * ratio);
    }
    json_decref(doc);
    char *text = tu_read_file(svg, NULL);
    assert_non_null(text);
    assert_true(!strncmp(text, "<svg ", 5) && strstr(text, "</svg>\n"));
    assert_non_null(strstr(text, "tokens/s"));
    assert_non_null(strstr(text, "TTFT (ms)"));
    assert_non_null(strstr(text, "ITL (ms)"));
    free(text);
}

static void test_smoke_long_prompt(void **state) {
    (void)state;
    /* with a key: the server started by -m requires it, so every request must carry it */
    double cmd_ms;
    json_t *doc = run_json("-c 2 --requests 2 -p 16 -n 400 --long-prompt 600 --long-at-ms 100 --api-key k3y", 0, &cmd_ms);
    json_t *l = json_array_get(json_object_get(doc, "levels"), 0), *lp = json_object_get(l, "long_prompt");
    assert_true(json_is_object(lp));
    assert_true(json_integer_value(json_object_get(lp, "prompt_tokens")) >= 300);
    double long_ttft = json_number_value(json_object_get(lp, "ttft_ms"));
    assert_true(long_ttft > 0 && long_ttft <= cmd_ms); /* bounded from below by test_timing_units */
    assert_true(json_integer_value(json_object_get(lp, "health_polls")) >= 1);
    assert_true(json_number_value(json_object_get(lp, "health_max_ms")) > 0);
    json_t *out = json_object_get(lp, "itl_outside_ms");
    check_pcts(out, 1, true);
    /* the long request is not one of the level's: its token is not counted */
    assert_int_equal(json_integer_value(json_object_get(l, "tokens")), 2 * 400);
    json_decref(doc);
}

/* The fake server's pace (test_timing_units): a stream's first token
 * PACED_FIRST_MS after its request, its second PACED_GAP_MS after that;
 * the long-prompt request (max_tokens 1) its one token PACED_LONG_MS after
 * it. */
#define PACED_FIRST_MS 100
#define PACED_GAP_MS 50
#define PACED_LONG_MS 100

static void paced_reply(int c, const char *req, void *arg) {
    (void)arg;
    static const char HEAD[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n";
    static const char CHUNK[] = "data: {\"choices\":[{\"text\":\"x\",\"index\":0,\"finish_reason\":null}]}\n\n";
    if (!strncmp(req, "GET /health", 11)) {
        const char *ok = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}";
        (void)!write(c, ok, strlen(ok));
        return;
    }
    if (!strstr(req, "/v1/completions")) { /* /tokenize: counts unknown, bench serve falls back */
        const char *nf = "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        (void)!write(c, nf, strlen(nf));
        return;
    }
    bool long_req = strstr(req, "\"max_tokens\":1,") != NULL;
    (void)!write(c, HEAD, sizeof HEAD - 1);
    tu_nap_ms(long_req ? PACED_LONG_MS : PACED_FIRST_MS);
    (void)!write(c, CHUNK, sizeof CHUNK - 1);
    if (!long_req) {
        tu_nap_ms(PACED_GAP_MS);
        (void)!write(c, CHUNK, sizeof CHUNK - 1);
    }
    (void)!write(c, "data: [DONE]\n\n", 14);
}

/* The figures are in the unit they claim. Against the paced fake server
 * the sleeps give floors: every TTFT >= PACED_FIRST_MS, every gap >=
 * PACED_GAP_MS / 2 (below), the long request's TTFT >= PACED_LONG_MS, and the level
 * (2 requests one after another at c = 1) >= 2 x (first + gap). From
 * above, at c = 1 a request's TTFT and its gap lie within its own time
 * and the requests within the level's, and the level within the whole
 * command's time on the test's clock (a few times the sleeps: two
 * warm-up requests, the long one, process start). A figure 10x too small
 * is under its floor, one 10x too large over its ceiling. TTFTs start
 * when the request leaves the client, before the server's sleeps, so
 * load only lengthens them; a gap is between two arrivals, and a first
 * token that reaches the client late shrinks it (CI saw 48.8 ms for a
 * 50 ms sleep), so its floor is half the sleep, still 5x above a figure
 * 10x too small. */
static void test_timing_units(void **state) {
    (void)state;
    int port;
    pid_t pid = tu_fake_server_start(paced_reply, NULL, false, &port);
    char cmd[1024], *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd, "%s bench serve --url http://127.0.0.1:%d -c 1 --requests 2 -p 16 -n 2 "
             "--long-prompt 64 --long-at-ms 0 --json", KT_BIN, port);
    double t0 = tu_now_ms();
    int rc = tu_run(cmd, &out, &err);
    double cmd_ms = tu_now_ms() - t0;
    tu_fake_server_stop(pid);
    if (rc != 0) fail_msg("%s\n-> %d\n%s", cmd, rc, err);
    json_t *doc = json_loads(out, 0, NULL);
    assert_non_null(doc);
    json_t *l = json_array_get(json_object_get(doc, "levels"), 0), *lp = json_object_get(l, "long_prompt");
    double wall = json_number_value(json_object_get(l, "wall_ms"));
    double ttft_min = pct(l, "ttft_ms", "p50"), ttft_max = pct(l, "ttft_ms", "max"); /* p50 of 2: the smaller */
    double itl_min = pct(l, "itl_ms", "p50"), itl_max = pct(l, "itl_ms", "max");
    double long_ttft = json_number_value(json_object_get(lp, "ttft_ms"));
    printf("  TTFT %.1f-%.1f ms (>= %d), ITL %.1f-%.1f ms (>= %d), long TTFT %.1f ms (>= %d), level %.1f ms, "
           "command %.1f ms\n", ttft_min, ttft_max, PACED_FIRST_MS, itl_min, itl_max, PACED_GAP_MS / 2, long_ttft,
           PACED_LONG_MS, wall, cmd_ms);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(l, "itl_ms"), "samples")), 2);
    assert_true(ttft_min >= PACED_FIRST_MS && itl_min >= PACED_GAP_MS / 2 && long_ttft >= PACED_LONG_MS);
    assert_true(wall >= 2 * (PACED_FIRST_MS + PACED_GAP_MS));
    assert_true(ttft_max + itl_max <= wall * (1 + 1e-6) && wall <= cmd_ms && long_ttft <= cmd_ms);
    json_decref(doc);
    free(out), free(err);
}

static void test_md_and_csv(void **state) {
    (void)state;
    char cmd[8192], *out = NULL;
    const char *model = tu_shared("models/stories260K.gguf");
    snprintf(cmd, sizeof cmd, "%s bench serve -m '%s' -t 2 -c 1,2 --requests 4 -p 16 -n 4", KT_BIN, model);
    assert_int_equal(tu_run(cmd, &out, NULL), 0);
    assert_non_null(strstr(out, "| c | requests | prompt tok | tokens | TTFT p50 ms |"));
    assert_non_null(strstr(out, "\n| 1 | 4 | "));
    assert_non_null(strstr(out, "\n| 2 | 4 | "));
    assert_null(strstr(out, "Long prompt"));
    free(out);
    snprintf(cmd, sizeof cmd, "%s bench serve -m '%s' -t 2 -c 2 --requests 4 -p 16 -n 4 --csv", KT_BIN, model);
    assert_int_equal(tu_run(cmd, &out, NULL), 0);
    assert_true(!strncmp(out, "concurrency,requests,prompt_tokens_mean,tokens,", 47));
    assert_non_null(strstr(out, "\n2,4,"));
    free(out);
}

static void expect_failure(const char *args, int want_rc, const char *msg1, const char *msg2) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s bench serve %s", KT_BIN, args);
    tu_expect_run(cmd, want_rc, msg1, msg2);
}

static void test_failures(void **state) {
    (void)state;
    char args[4096];
    expect_failure("--url http://127.0.0.1:1 -c 1", 1, "warm-up, request 1/1", "connect");
    snprintf(args, sizeof args, "-m '%s' -t 2 --ctx 256 -c 1 -p 300 -n 8", tu_shared("models/stories260K.gguf"));
    expect_failure(args, 1, "level c=1, request 1/4: HTTP 400", "context");
    expect_failure("-m /nonexistent.gguf", 1, "exited before listening", "nonexistent");
    expect_failure("--url http://127.0.0.1:1 -t 2", 2, "need -m", NULL);
    expect_failure("-m x.gguf -c 0", 2, "-c", NULL);
    expect_failure("", 2, "--url URL or -m MODEL", NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sse_split_anywhere),
        cmocka_unit_test(test_sse_chat_and_errors),
        cmocka_unit_test(test_percentiles),
        cmocka_unit_test(test_smoke_levels),
        cmocka_unit_test(test_smoke_long_prompt),
        cmocka_unit_test(test_md_and_csv),
        cmocka_unit_test(test_failures),
        cmocka_unit_test(test_timing_units),
    };
    signal(SIGPIPE, SIG_IGN); /* the fake server writes to clients that may have gone */
    return tu_result(cmocka_run_group_tests(tests, NULL, NULL));
}
