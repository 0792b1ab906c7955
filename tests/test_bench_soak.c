/*
 * test_bench_soak.c - `kettle bench soak`, the soak and load test.
 *
 * Its network-free half is checked on fixed inputs: the mix's proportions
 * from a seed (and that a seed fixes the sequence), every kind's body
 * (fields as drawn; a malformed one really is malformed in its own way),
 * the judging of crafted answers (each rule fails when it should), the
 * counts, RSS growth, /metrics parsing and the verdict. Then the command
 * itself against fake servers that misbehave (every generation a 500; a
 * stall past --timeout; KV blocks left in use): each run must fail,
 * saying why. In the optimized build only, a 10-second soak of 16 clients
 * against `kettle serve` on stories260K must pass (timing-bound: under
 * the sanitizers it would be mostly queueing).
 */
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cli/bench_soak.h"
#include "fake_server.h"
#include "testutil.h"

/* ---- the mix ---- */

static void test_mix_proportions(void **state) {
    (void)state;
    enum { N = 100000 };
    int sum = 0, counts[SK_N_KINDS] = {0};
    for (int k = 0; k < SK_N_KINDS; k++) sum += sk_kind_pct[k];
    assert_int_equal(sum, 100);
    assert_int_equal(sk_kind_pct[SK_ABANDON], 10); /* the issue's ~10% and ~5% */
    assert_int_equal(sk_kind_pct[SK_MALFORMED], 5);
    kt_rng r;
    kt_rng_seed(&r, 1);
    for (int i = 0; i < N; i++) counts[sk_pick(&r)]++;
    for (int k = 0; k < SK_N_KINDS; k++) {
        double share = 100.0 * counts[k] / N; /* binomial sd <= 0.16 points at N = 1e5 */
        if (fabs(share - sk_kind_pct[k]) > 0.8) fail_msg("%s: %.2f%%, not %d%%", sk_kind_names[k], share, sk_kind_pct[k]);
    }
}

/* The whole request, drawn with everything else from one generator: the
 * same kinds in the same proportions, the same bodies for a seed. */
static void test_mix_seeded(void **state) {
    (void)state;
    enum { N = 4000 };
    kt_rng a, b, c;
    kt_rng_seed(&a, 7), kt_rng_seed(&b, 7), kt_rng_seed(&c, 8);
    int counts[SK_N_KINDS] = {0}, faults[SK_N_FAULTS] = {0}, same_as_other_seed = 0;
    for (int i = 0; i < N; i++) {
        sk_request x, y, z;
        assert_true(sk_request_make(&a, &x) && sk_request_make(&b, &y) && sk_request_make(&c, &z));
        assert_int_equal(x.kind, y.kind);
        assert_string_equal(x.body, y.body);
        same_as_other_seed += !strcmp(x.body, z.body);
        counts[x.kind]++;
        if (x.kind == SK_MALFORMED) faults[x.fault]++;
        sk_request_free(&x), sk_request_free(&y), sk_request_free(&z);
    }
    assert_int_equal(same_as_other_seed, 0);
    for (int k = 0; k < SK_N_KINDS; k++) /* sd <= 0.55 points at N = 4000 */
        if (fabs(100.0 * counts[k] / N - sk_kind_pct[k]) > 2.5) fail_msg("%s: %d of %d", sk_kind_names[k], counts[k], N);
    for (int f = 0; f < SK_N_FAULTS; f++)
        if (!faults[f]) fail_msg("no malformed request was '%s'", sk_fault_names[f]);
}

/* ---- bodies ---- */

static json_t *body_of(const sk_request *q) {
    json_t *doc = json_loads(q->body, 0, NULL);
    if (!json_is_object(doc)) fail_msg("%s: not a JSON object: %s", sk_kind_names[q->kind], q->body);
    return doc;
}

static bool has_true(json_t *doc, const char *key) {
    return json_is_true(json_object_get(doc, key));
}

/* What every valid body holds: its endpoint's prompt field, max_tokens,
 * stream with usage, n. */
static void check_common(const sk_request *q, json_t *doc) {
    assert_true(json_is_array(json_object_get(doc, "messages")) == q->chat);
    assert_true(json_is_string(json_object_get(doc, "prompt")) == !q->chat);
    assert_int_equal(json_integer_value(json_object_get(doc, "max_tokens")), q->max_tokens);
    assert_true(q->max_tokens >= 1 && q->max_tokens <= 512);
    assert_true(has_true(doc, "stream") == q->stream);
    if (q->stream) assert_true(has_true(json_object_get(doc, "stream_options"), "include_usage"));
    json_t *n = json_object_get(doc, "n");
    assert_int_equal(n ? json_integer_value(n) : 1, q->n_choices);
}

static void check_kind_fields(const sk_request *q, json_t *doc) {
    json_t *rf = json_object_get(doc, "response_format"), *stop = json_object_get(doc, "stop");
    assert_true((json_object_get(doc, "tools") != NULL) == (q->kind == SK_TOOLS));
    assert_true((rf != NULL) == (q->kind == SK_SCHEMA));
    assert_true(has_true(doc, "ignore_eos") == (q->kind == SK_ABANDON));
    if (q->kind == SK_MULTI) assert_true(q->n_choices >= 2 && q->n_choices <= 3);
    if (q->kind == SK_ABANDON) assert_true(q->stream && q->abandon_after >= 1 && q->abandon_after <= 4);
    if (q->kind == SK_TOOLS) assert_true(json_is_false(json_object_get(doc, "parallel_tool_calls")));
    if (q->kind != SK_STOP) return assert_null(stop);
    size_t i;
    json_t *s;
    unsigned mask = 0;
    json_array_foreach(stop, i, s) for (int k = 0; k < SK_N_STOP_STRINGS; k++) if (!strcmp(json_string_value(s), sk_stop_strings[k])) mask |= 1u << k;
    assert_int_equal(mask, q->stop_mask);
    assert_int_equal(json_array_size(stop), (size_t)__builtin_popcount(mask));
}

/* A malformed body is wrong the way its fault says (and only a few are
 * not JSON at all). */
static void check_fault(const sk_request *q) {
    json_t *doc = json_loads(q->body, 0, NULL);
    if (q->fault == SK_FAULT_JSON || q->fault == SK_FAULT_UTF8) {
        assert_null(doc);
        if (q->fault == SK_FAULT_UTF8) assert_non_null(strstr(q->body, "\xFF\xFE"));
        return;
    }
    assert_non_null(doc);
    json_t *n = json_object_get(doc, "n"), *stop = json_object_get(doc, "stop");
    json_t *rf = json_object_get(json_object_get(doc, "response_format"), "json_schema");
    switch (q->fault) {
    case SK_FAULT_EMPTY_STOP: assert_string_equal(json_string_value(json_array_get(stop, 0)), ""); break;
    case SK_FAULT_SCHEMA: assert_non_null(json_object_get(rf, "schema")); break;
    case SK_FAULT_N: assert_int_equal(json_integer_value(n), 17); break;
    case SK_FAULT_STOP: assert_int_equal(json_array_size(stop), 9); break;
    case SK_FAULT_UNKNOWN:
        assert_true(json_object_get(doc, "frobnicate") || json_object_get(doc, "best_of") ||
                    json_object_get(doc, "functions") || json_object_get(doc, "suffix"));
        break;
    default: /* SK_FAULT_TYPE: some known field is a string or number where it must not be */
        assert_true(json_is_string(json_object_get(doc, "max_tokens")) || json_is_string(json_object_get(doc, "temperature")) ||
                    json_is_string(json_object_get(doc, "stream")) || json_is_integer(json_object_get(doc, "stop")) ||
                    json_is_integer(json_object_get(doc, "messages")) || json_is_integer(json_object_get(doc, "prompt")));
    }
    json_decref(doc);
}

static void test_bodies(void **state) {
    (void)state;
    kt_rng r;
    kt_rng_seed(&r, 3);
    for (int k = 0; k < SK_N_KINDS; k++)
        for (int i = 0; i < 300; i++) {
            sk_request q;
            assert_true(sk_request_make_kind(&r, (sk_kind)k, &q));
            assert_int_equal(q.kind, k);
            assert_string_equal(sk_request_path(&q), q.chat ? "/v1/chat/completions" : "/v1/completions");
            if (k == SK_MALFORMED) {
                check_fault(&q);
            } else {
                json_t *doc = body_of(&q);
                check_common(&q, doc);
                check_kind_fields(&q, doc);
                json_decref(doc);
            }
            sk_request_free(&q);
        }
    assert_non_null(sk_tools());
    assert_int_equal(json_array_size(sk_tools()), 2);
}

/* ---- judging answers ---- */

static sk_outcome judge(const sk_request *q, const sk_answer *a, bool *cut) {
    char why[640];
    bool c;
    sk_outcome o = sk_check(q, a, cut ? cut : &c, why, sizeof why);
    if (o != SK_OK) assert_true(why[0]); /* every failure says why */
    return o;
}

static sk_outcome judge_whole(const sk_request *q, long status, const char *body, bool *cut) {
    sk_answer a = {.status = status, .body = body};
    return judge(q, &a, cut);
}

static void test_check_statuses(void **state) {
    (void)state;
    sk_request chat = {.kind = SK_CHAT, .chat = true, .n_choices = 1, .max_tokens = 8};
    const char *ok = "{\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"Hi\"},"
                     "\"finish_reason\":\"stop\"}],\"usage\":{\"completion_tokens\":2}}";
    assert_int_equal(judge_whole(&chat, 200, ok, NULL), SK_OK);
    assert_int_equal(judge_whole(&chat, 503, "{}", NULL), SK_OVERLOAD);
    assert_int_equal(judge_whole(&chat, 500, "{\"error\":{\"message\":\"x\"}}", NULL), SK_BAD_STATUS);
    assert_int_equal(judge_whole(&chat, 400, "{\"error\":{\"message\":\"x\"}}", NULL), SK_BAD_STATUS);
    assert_int_equal(judge_whole(&chat, 200, "{\"choices\":", NULL), SK_BAD_ANSWER);
    sk_answer hung = {.net = SK_NET_TIMEOUT}, dropped = {.net = SK_NET_ERROR};
    assert_int_equal(judge(&chat, &hung, NULL), SK_HUNG);
    assert_int_equal(judge(&chat, &dropped, NULL), SK_TRANSPORT);
    /* usage past max_tokens, a missing finish reason, choices short of n */
    assert_int_equal(judge_whole(&chat, 200, "{\"choices\":[{\"message\":{\"content\":\"Hi\"},\"finish_reason\":"
                                             "\"stop\"}],\"usage\":{\"completion_tokens\":9}}", NULL), SK_BAD_ANSWER);
    assert_int_equal(judge_whole(&chat, 200, "{\"choices\":[{\"message\":{\"content\":\"Hi\"}}],\"usage\":"
                                             "{\"completion_tokens\":1}}", NULL), SK_BAD_ANSWER);
    sk_request multi = {.kind = SK_MULTI, .chat = true, .n_choices = 2, .max_tokens = 8};
    assert_int_equal(judge_whole(&multi, 200, ok, NULL), SK_BAD_ANSWER);
    /* malformed: a 4xx error object, nothing else */
    sk_request bad = {.kind = SK_MALFORMED, .fault = SK_FAULT_TYPE, .chat = true, .n_choices = 1};
    assert_int_equal(judge_whole(&bad, 400, "{\"error\":{\"message\":\"'max_tokens' must be an integer\"}}", NULL),
                     SK_OK);
    assert_int_equal(judge_whole(&bad, 413, "{\"error\":{\"message\":\"too big\"}}", NULL), SK_OK);
    assert_int_equal(judge_whole(&bad, 400, "bad request", NULL), SK_BAD_ANSWER);
    assert_int_equal(judge_whole(&bad, 200, ok, NULL), SK_BAD_STATUS);
    assert_int_equal(judge_whole(&bad, 500, "{\"error\":{\"message\":\"x\"}}", NULL), SK_BAD_STATUS);
}

static bs_sse stream_of(const char *text) {
    bs_sse s;
    bs_sse_init(&s);
    s.keep_text = true;
    bs_sse_feed(&s, text, strlen(text), 1.0);
    return s;
}

static void test_check_streams(void **state) {
    (void)state;
    sk_request q = {.kind = SK_COMPLETION_STREAM, .stream = true, .n_choices = 1, .max_tokens = 4};
    const char *good = "data: {\"choices\":[{\"index\":0,\"text\":\"Once\",\"finish_reason\":null}]}\n\n"
                       "data: {\"choices\":[{\"index\":0,\"text\":\"\",\"finish_reason\":\"length\"}]}\n\n"
                       "data: {\"choices\":[],\"usage\":{\"completion_tokens\":4}}\n\ndata: [DONE]\n\n";
    bs_sse s = stream_of(good);
    sk_answer a = {.status = 200, .sse = &s};
    assert_int_equal(judge(&q, &a, NULL), SK_OK);
    bs_sse_free(&s);
    char cut[512]; /* without [DONE] */
    snprintf(cut, sizeof cut, "%.*s", (int)(strstr(good, "data: [DONE]") - good), good);
    s = stream_of(cut);
    assert_int_equal(judge(&q, &a, NULL), SK_BAD_ANSWER);
    /* ... unless the client hung up on purpose */
    q.kind = SK_ABANDON, a.abandoned = true;
    assert_int_equal(judge(&q, &a, NULL), SK_OK);
    bs_sse_free(&s);
    q.kind = SK_COMPLETION_STREAM, a.abandoned = false;
    s = stream_of("data: {\"error\":{\"message\":\"engine failed\"}}\n\ndata: [DONE]\n\n");
    assert_int_equal(judge(&q, &a, NULL), SK_BAD_ANSWER);
    bs_sse_free(&s);
    /* no usage chunk though include_usage was asked */
    s = stream_of("data: {\"choices\":[{\"index\":0,\"text\":\"x\",\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n");
    assert_int_equal(judge(&q, &a, NULL), SK_BAD_ANSWER);
    bs_sse_free(&s);
}

static void test_check_stop_and_schema(void **state) {
    (void)state;
    sk_request stop = {.kind = SK_STOP, .n_choices = 1, .max_tokens = 16, .stop_mask = 1u << 1}; /* " the" */
    const char *fmt = "{\"choices\":[{\"text\":\"%s\",\"finish_reason\":\"stop\"}],\"usage\":{\"completion_tokens\":3}}";
    char body[512];
    snprintf(body, sizeof body, fmt, "Once upon a time.");
    assert_int_equal(judge_whole(&stop, 200, body, NULL), SK_OK); /* '.' was not sent */
    snprintf(body, sizeof body, fmt, "Once upon the time");
    assert_int_equal(judge_whole(&stop, 200, body, NULL), SK_BAD_ANSWER);

    sk_request schema = {.kind = SK_SCHEMA, .chat = true, .n_choices = 1, .max_tokens = 200};
    const char *sfmt = "{\"choices\":[{\"message\":{\"content\":\"%s\"},\"finish_reason\":\"%s\"}],"
                       "\"usage\":{\"completion_tokens\":20}}";
    bool cut;
    snprintf(body, sizeof body, sfmt, "{ \\\"mood\\\" : \\\"calm\\\", \\\"ok\\\": false }", "stop");
    assert_int_equal(judge_whole(&schema, 200, body, &cut), SK_OK);
    assert_false(cut);
    snprintf(body, sizeof body, sfmt, "{ \\\"mood\\\" : \\\"angry\\\", \\\"ok\\\": false }", "stop");
    assert_int_equal(judge_whole(&schema, 200, body, NULL), SK_BAD_ANSWER);
    snprintf(body, sizeof body, sfmt, "{ \\\"mood\\\" : \\\"calm\\\", \\\"ok\\\": false, \\\"x\\\": 1 }", "stop");
    assert_int_equal(judge_whole(&schema, 200, body, NULL), SK_BAD_ANSWER);
    snprintf(body, sizeof body, sfmt, "{ \\\"mood\\\" : \\\"ca", "length");
    assert_int_equal(judge_whole(&schema, 200, body, &cut), SK_OK);
    assert_true(cut);
}

static sk_outcome judge_tools(sk_tool_choice tc, const char *finish, const char *calls, bool *cut) {
    sk_request q = {.kind = SK_TOOLS, .chat = true, .n_choices = 1, .max_tokens = 64, .tool_choice = tc};
    char body[1024];
    snprintf(body, sizeof body, "{\"choices\":[{\"message\":{\"content\":null%s%s},\"finish_reason\":\"%s\"}],"
             "\"usage\":{\"completion_tokens\":30}}", calls ? ",\"tool_calls\":" : "", calls ? calls : "", finish);
    return judge_whole(&q, 200, body, cut);
}

static void test_check_tools(void **state) {
    (void)state;
    const char *weather = "[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                          "\"arguments\":\"{\\\"city\\\": \\\"Oslo\\\"}\"}}]";
    const char *add = "[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"add\","
                      "\"arguments\":\"{\\\"a\\\": 1, \\\"b\\\": 2}\"}}]";
    const char *unknown = "[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"rm\",\"arguments\":\"{}\"}}]";
    const char *bad_args = "[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"add\","
                           "\"arguments\":\"{\\\"a\\\": \\\"1\\\"}\"}}]";
    bool cut;
    assert_int_equal(judge_tools(SK_TC_AUTO, "tool_calls", weather, NULL), SK_OK);
    assert_int_equal(judge_tools(SK_TC_REQUIRED, "tool_calls", add, NULL), SK_OK);
    assert_int_equal(judge_tools(SK_TC_NAMED, "tool_calls", weather, NULL), SK_OK);
    assert_int_equal(judge_tools(SK_TC_NAMED, "tool_calls", add, NULL), SK_BAD_ANSWER);
    assert_int_equal(judge_tools(SK_TC_AUTO, "tool_calls", unknown, NULL), SK_BAD_ANSWER);
    assert_int_equal(judge_tools(SK_TC_AUTO, "tool_calls", bad_args, NULL), SK_BAD_ANSWER);
    assert_int_equal(judge_tools(SK_TC_AUTO, "tool_calls", NULL, NULL), SK_BAD_ANSWER);
    assert_int_equal(judge_tools(SK_TC_NONE, "stop", weather, NULL), SK_BAD_ANSWER);
    assert_int_equal(judge_tools(SK_TC_AUTO, "stop", NULL, &cut), SK_OK);
    assert_false(cut);
    assert_int_equal(judge_tools(SK_TC_REQUIRED, "stop", NULL, NULL), SK_BAD_ANSWER);
    assert_int_equal(judge_tools(SK_TC_REQUIRED, "length", NULL, &cut), SK_OK);
    assert_true(cut);
}

/* ---- counts, samples, the verdict ---- */

static void test_metrics_and_growth(void **state) {
    (void)state;
    const char *text = "# HELP kettle_kv_blocks_used KV cache blocks in use\n# TYPE kettle_kv_blocks_used gauge\n"
                       "kettle_kv_blocks_used_total 99\n"
                       "kettle_kv_blocks_used{model=\"a b\"} 3\nkettle_kv_blocks_used{model=\"c\"} 4\n"
                       "kettle_cache_blocks 12\nprocess_resident_memory_bytes 1.5e+07";
    double v;
    assert_true(sk_metric_sum(text, "kettle_kv_blocks_used", &v));
    assert_true(v == 7);
    assert_true(sk_metric_sum(text, "kettle_cache_blocks", &v) && v == 12);
    assert_true(sk_metric_sum(text, "process_resident_memory_bytes", &v) && v == 1.5e7); /* the last line */
    assert_false(sk_metric_sum(text, "kettle_kv_blocks", &v));

    sk_sample s[] = {{.t_s = 0, .rss_bytes = 100}, {.t_s = 10, .rss_bytes = 200}, {.t_s = 20, .rss_bytes = 1000},
                     {.t_s = 30, .rss_bytes = -1}, {.t_s = 40, .rss_bytes = 1040}};
    assert_true(fabs(sk_rss_growth_pct(s, 5, 40) - 4.0) < 1e-9); /* t >= 20: 1000 -> 1040; unknown skipped */
    assert_true(isnan(sk_rss_growth_pct(s, 3, 40)));             /* one sample in the last half */
}

static sk_result fake_result(int duration_s) {
    sk_result r = {.target = "fake <model>", .clients = 2, .duration_s = duration_s, .rss_every_s = 10,
                   .timeout_s = 5, .seed = 1, .wall_s = 1, .kv_total = 64, .settled = true};
    sk_request q = {.kind = SK_CHAT, .n_choices = 1};
    for (int i = 0; i < 10; i++) assert_true(sk_stats_add(&r.stats, &q, 200, SK_OK, false, 10 + i, -1));
    q.kind = SK_CHAT_STREAM;
    assert_true(sk_stats_add(&r.stats, &q, 200, SK_OK, false, 50, 5));
    assert_true(sk_stats_add(&r.stats, &q, 503, SK_OVERLOAD, false, 1, -1));
    for (int t = 0; t <= duration_s; t += 10) {
        sk_sample x = {.t_s = t, .rss_bytes = 1000000 + t, .kv_used = 1, .kv_cached = 2, .in_flight = 2};
        assert_true(sk_stats_add_sample(&r.stats, &x));
    }
    return r;
}

static void test_verdict(void **state) {
    (void)state;
    sk_result r = fake_result(200);
    sk_verdict v = sk_judge(&r);
    assert_true(v.ok && v.rss_judged && v.rss_ok && v.kv_ok);
    assert_int_equal(r.stats.kinds[SK_CHAT].lat_ms.n, 10);
    assert_int_equal(r.stats.kinds[SK_CHAT_STREAM].by_outcome[SK_OVERLOAD], 1);
    /* each failure alone fails the run */
    r.kv_end_used = 1;
    assert_false(sk_judge(&r).ok);
    r.kv_end_used = 0, r.settled = false;
    assert_false(sk_judge(&r).ok);
    r.settled = true;
    sk_request q = {.kind = SK_TOOLS};
    assert_true(sk_stats_add(&r.stats, &q, 502, SK_BAD_STATUS, false, 1, -1));
    v = sk_judge(&r);
    assert_false(v.ok);
    assert_int_equal(v.n_5xx, 1);
    assert_int_equal(v.n_bad_status, 1);
    sk_stats_free(&r.stats);
    r = fake_result(200);
    assert_true(sk_stats_add(&r.stats, &q, 0, SK_HUNG, false, 1, -1));
    assert_int_equal(sk_judge(&r).n_hung, 1);
    assert_false(sk_judge(&r).ok);
    sk_stats_free(&r.stats);
    /* RSS: +6% over the last half fails a long run, not a short one */
    for (int d = 100; d <= 200; d += 100) {
        r = fake_result(d);
        sk_sample x = {.t_s = d + 1.0, .rss_bytes = (long long)(1000000 * 1.07)};
        assert_true(sk_stats_add_sample(&r.stats, &x));
        v = sk_judge(&r);
        assert_true(v.rss_growth_pct > 5);
        assert_true(v.ok == (d < SK_RSS_MIN_DURATION_S));
        sk_stats_free(&r.stats);
    }
}

static char *report_text(const sk_result *r, const sk_verdict *v, bs_fmt fmt) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    assert_true(sk_print(f, fmt, r, v));
    fclose(f);
    return text;
}

static void test_reports(void **state) {
    (void)state;
    sk_result r = fake_result(200);
    r.kv_end_used = 3;
    sk_verdict v = sk_judge(&r);
    char *md = report_text(&r, &v, BS_MD);
    assert_non_null(strstr(md, "| chat | 14 | 10 | 10 | 0 |"));
    assert_non_null(strstr(md, "statuses: 200 x 11, 503 x 1"));
    assert_non_null(strstr(md, "KV blocks in use at the end: 3, idle level 0 (FAIL)"));
    assert_non_null(strstr(md, "Result: FAIL"));
    free(md);
    char *js = report_text(&r, &v, BS_JSON);
    json_t *doc = json_loads(js, 0, NULL);
    assert_non_null(doc);
    assert_true(json_is_false(json_object_get(doc, "ok")));
    assert_int_equal(json_array_size(json_object_get(doc, "kinds")), SK_N_KINDS + 1);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(doc, "statuses"), "503")), 1);
    json_t *all = json_array_get(json_object_get(doc, "kinds"), SK_N_KINDS);
    assert_int_equal(json_integer_value(json_object_get(all, "requests")), 12);
    assert_int_equal(json_array_size(json_object_get(doc, "samples")), 21);
    assert_true(json_is_false(json_object_get(json_object_get(doc, "checks"), "kv_ok")));
    json_decref(doc);
    free(js);
    sk_stats_free(&r.stats);
}

/* ---- the command against servers that misbehave ---- */

static int run_soak(const char *args, char **out, char **err) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s bench soak %s", KT_BIN, args);
    return tu_run(cmd, out, err);
}

static void expect(const char *args, int want_rc, const char *msg1, const char *msg2) {
    char *out = NULL, *err = NULL;
    int rc = run_soak(args, &out, &err);
    bool ok = rc == want_rc && (strstr(err, msg1) || strstr(out, msg1)) && (!msg2 || strstr(err, msg2) || strstr(out, msg2));
    if (!ok) fprintf(stderr, "bench soak %s\n-> %d\n%s\n%s\n", args, rc, out, err);
    assert_true(ok);
    free(out), free(err);
}

/* A fake server's answers (fake_server.h, a process per connection):
 * /metrics with KV figures (in "leak" mode, blocks in use once any
 * generation came), /health idle, the warm-up answered; every other
 * generation gets what the mode says: "500", "stall" (nothing for 30 s),
 * or "leak" (a 503, which is no failure). n_gen is shared memory. */
typedef struct fake_state {
    const char *mode;
    int *n_gen;
} fake_state;

static void fake_reply(int c, const char *req, void *arg) {
    const char *mode = ((fake_state *)arg)->mode;
    int *n_gen = ((fake_state *)arg)->n_gen;
    char head[256], body[256];
    int status = 200;
    const char *type = "application/json";
    if (strstr(req, "GET /metrics")) {
        type = "text/plain";
        snprintf(body, sizeof body, "kettle_kv_blocks_used %d\nkettle_cache_blocks 1\nkettle_kv_blocks_total 64\n"
                 "process_resident_memory_bytes 1000000\n", !strcmp(mode, "leak") && *n_gen ? 3 : 0);
    } else if (strstr(req, "GET /health")) {
        snprintf(body, sizeof body, "{\"status\":\"ok\",\"running\":0,\"queued\":0}");
    } else if (strstr(req, "\"Hello.\"")) {
        snprintf(body, sizeof body, "{\"choices\":[{\"message\":{\"content\":\"Hi\"},\"finish_reason\":\"stop\"}]}");
    } else {
        __atomic_add_fetch(n_gen, 1, __ATOMIC_SEQ_CST);
        if (!strcmp(mode, "stall")) sleep(30);
        status = !strcmp(mode, "500") ? 500 : 503;
        snprintf(body, sizeof body, "{\"error\":{\"message\":\"fake %d\"}}", status);
    }
    snprintf(head, sizeof head, "HTTP/1.1 %d X\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
             status, type, strlen(body));
    (void)!write(c, head, strlen(head));
    (void)!write(c, body, strlen(body));
}

static void expect_fake(const char *mode, const char *extra, const char *msg1, const char *msg2) {
    int *n_gen = mmap(NULL, sizeof *n_gen, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(n_gen != MAP_FAILED);
    fake_state f = {mode, n_gen};
    int port;
    pid_t pid = tu_fake_server_start(fake_reply, &f, true, &port);
    char args[512];
    snprintf(args, sizeof args, "--url http://127.0.0.1:%d --clients 2 --duration 1 --rss-every 1 %s", port, extra);
    expect(args, 1, msg1, msg2);
    tu_fake_server_stop(pid);
    munmap(n_gen, sizeof *n_gen);
}

static void test_failures(void **state) {
    (void)state;
    expect_fake("500", "", "5xx other than 503: ", "bad status: HTTP 500: {\"error\":{\"message\":\"fake 500\"}}");
    expect_fake("stall", "--timeout 1", "hung requests (nothing for 1 s): ", "hung: nothing received");
    expect_fake("leak", "", "KV blocks in use at the end: 3, idle level 0 (FAIL)", "503 x ");
    expect("--url http://127.0.0.1:1", 1, "cannot read the KV blocks from /metrics", NULL);
    expect("", 2, "give either --url URL or -m MODEL", NULL);
    expect("--url http://x -t 2", 2, "need -m", NULL);
    expect("--url http://x --clients 0", 2, "--clients", NULL);
    expect("--url http://x --seed x1", 2, "--seed", NULL);
    char *out = NULL;
    assert_int_equal(run_soak("--help", &out, NULL), 0);
    const char *opts[] = {"--url", "--model", "--clients", "--duration", "--seed", "--rss-every", "--timeout",
                          "--api-key", "--md", "--json", "--parallel", "--chat-template"};
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) assert_non_null(strstr(out, opts[i]));
    free(out);
}

/* ---- a real soak, short ---- */

#if KT_SOAK_RUN
static int kind_count(json_t *doc, int k, const char *outcome) {
    json_t *row = json_array_get(json_object_get(doc, "kinds"), (size_t)k);
    return (int)json_integer_value(outcome ? json_object_get(json_object_get(row, "outcomes"), outcome)
                                           : json_object_get(row, "requests"));
}

/* 16 clients for 10 s on stories260K: every kind came and every answer
 * checked; KV back to idle. */
static void test_soak_stories(void **state) {
    (void)state;
    char args[1024], *out = NULL, *err = NULL;
    snprintf(args, sizeof args, "-m '%s' -t 2 --clients 16 --duration 10 --rss-every 3 --json",
             tu_shared("models/stories260K.gguf"));
    int rc = run_soak(args, &out, &err);
    if (rc) fprintf(stderr, "-> %d\n%s\n%s\n", rc, out, err);
    assert_int_equal(rc, 0);
    json_t *doc = json_loads(out, 0, NULL);
    assert_non_null(doc);
    assert_true(json_is_true(json_object_get(doc, "ok")));
    for (int k = 0; k < SK_N_KINDS; k++) {
        if (kind_count(doc, k, NULL) < 1) fail_msg("no '%s' request in the run", sk_kind_names[k]);
        assert_int_equal(kind_count(doc, k, "ok") + kind_count(doc, k, "503"), kind_count(doc, k, NULL));
    }
    json_t *kv = json_object_get(doc, "kv");
    assert_true(json_is_true(json_object_get(kv, "settled")));
    assert_true(json_number_value(json_object_get(kv, "end_used")) == json_number_value(json_object_get(kv, "idle_used")));
    assert_true(json_number_value(json_object_get(kv, "peak_used")) > 0);
    json_t *samples = json_object_get(doc, "samples");
    assert_true(json_array_size(samples) == 5); /* t = 0, 3, 6, 9 and the end */
    assert_true(json_integer_value(json_object_get(json_array_get(samples, 0), "rss_bytes")) > 1000000);
    json_decref(doc);
    free(out), free(err);
}
#endif

int main(void) {
    signal(SIGPIPE, SIG_IGN); /* the fake server writes to clients that may have gone */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mix_proportions),
        cmocka_unit_test(test_mix_seeded),
        cmocka_unit_test(test_bodies),
        cmocka_unit_test(test_check_statuses),
        cmocka_unit_test(test_check_streams),
        cmocka_unit_test(test_check_stop_and_schema),
        cmocka_unit_test(test_check_tools),
        cmocka_unit_test(test_metrics_and_growth),
        cmocka_unit_test(test_verdict),
        cmocka_unit_test(test_reports),
        cmocka_unit_test(test_failures),
#if KT_SOAK_RUN
        cmocka_unit_test(test_soak_stories),
#endif
    };
    return tu_result(cmocka_run_group_tests(tests, NULL, NULL));
}
