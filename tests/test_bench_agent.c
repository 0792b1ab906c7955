/*
 * test_bench_agent.c - `kettle bench agent`, the agent-session benchmark.
 *
 * Its network-free half is checked on fixed inputs: the synthetic workload
 * is deterministic, shares its system prompt between sessions, and grows
 * its history turn by turn with the server's replies fed back verbatim;
 * the replay reader converts a small inline JSONL as documented and reads
 * every conversation of the real files in shared/agent with the right
 * number of turns; the stream parser keeps reply text, tool calls and
 * cached tokens; the statistics and reports agree with hand-made records.
 * Then end-to-end runs against `kettle serve` on stories260K check the
 * JSON (2 sessions x 3 turns, prompts growing, later turns served from
 * the prefix cache, times consistent and within the command's own
 * duration); a run against a fake server that answers at a known pace
 * checks the time figures' units from both sides; and failures
 * (unreachable, HTTP 400, a malformed stream, one cut short, one that
 * stalls past --timeout, bad options) give a message naming the session
 * and turn and exit status 1 (2 for usage). No speed is asserted.
 *
 * --screenshots (the computer-use loop): its screens are deterministic,
 * decode losslessly with kettle's own decoder at the asked size and change
 * a little from step to step; the history drops old screenshots as
 * --keep-screens says; the action check and the figures agree with
 * hand-made records; runs against `kettle serve` with golden/arch's
 * random-weight Qwen 3.5 and its qwen3vl projector count one encode per
 * step from /metrics over 10 steps (a history of 10 screenshots), find
 * the earlier history in the prefix cache, and
 * with --prepare the next step finds the prepared prompt there; a
 * llama-server-like fake (no /metrics, max_tokens 0 refused) gives "not
 * known" figures and a failed prepared run with the server's message.
 */
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/bench_agent.h"
#include "cli/bench_agent_shots.h"
#include "cli/bench_screens.h"
#include "image/image.h"
#include "fake_server.h"
#include "testutil.h"

static const ba_sizing FIXED_SIZING = {1.0, 0.3, false};

static ba_synth_opts synth_opts(int sessions, int turns) {
    return (ba_synth_opts){.sessions = sessions, .turns = turns, .system_tokens = 1100, .doc_tokens = 1300,
                           .tool_tokens = 280, .seed = 1, .sz = FIXED_SIZING};
}

static int n_words(const char *s) {
    int n = 0;
    for (bool in = false; *s; s++) {
        bool sp = *s == ' ' || *s == '\n';
        if (!sp && !in) n++;
        in = !sp;
    }
    return n;
}

static const char *content_of(json_t *msgs, size_t i) {
    return json_string_value(json_object_get(json_array_get(msgs, i), "content"));
}

static const char *role_of(json_t *msgs, size_t i) {
    return json_string_value(json_object_get(json_array_get(msgs, i), "role"));
}

/* ---- the synthetic workload ---- */

static void test_words(void **state) {
    (void)state;
    char *a = ba_words(5, 200), *b = ba_words(5, 200), *c = ba_words(6, 200), *d = ba_words(5, 50);
    assert_string_equal(a, b);
    assert_string_not_equal(a, c);
    assert_int_equal(n_words(a), 200);
    assert_int_equal(strncmp(a, d, strlen(d) - 1), 0); /* a prefix, up to the last word's period */
    assert_true(a[strlen(a) - 1] == '.');
    free(a), free(b), free(c), free(d);
}

static void test_synth_deterministic(void **state) {
    (void)state;
    ba_synth_opts o = synth_opts(3, 4);
    ba_workload w1, w2;
    char err[256];
    assert_true(ba_synth_build(&o, &w1, err, sizeof err));
    assert_true(ba_synth_build(&o, &w2, err, sizeof err));
    assert_true(w1.synthetic && w1.n == 3);
    for (int i = 0; i < 3; i++) {
        assert_true(json_equal(w1.s[i].base, w2.s[i].base));
        assert_true(json_equal(w1.s[i].tool_texts, w2.s[i].tool_texts));
        assert_int_equal(json_array_size(w1.s[i].base), 2);
        assert_int_equal(json_array_size(w1.s[i].tool_texts), 3); /* one per turn but the last */
        assert_int_equal(w1.s[i].n_turns, 4);
        /* the system prompt and tools are shared; documents are each session's own */
        assert_true(json_equal(json_array_get(w1.s[i].base, 0), json_array_get(w1.s[0].base, 0)));
        assert_true(json_equal(w1.s[i].tools, w1.s[0].tools));
        if (i) assert_string_not_equal(content_of(w1.s[i].base, 1), content_of(w1.s[0].base, 1));
    }
    assert_int_equal(json_array_size(w1.s[0].tools), 4); /* ~1100 tokens leave room for all four schemas */
    /* at one token per word: the document is ~1300 words, a tool result ~280 */
    int doc = n_words(content_of(w1.s[0].base, 1));
    int tool = n_words(json_string_value(json_array_get(w1.s[0].tool_texts, 0)));
    assert_true(doc >= 1250 && doc <= 1350);
    assert_true(tool >= 260 && tool <= 290);
    int sys = n_words(content_of(w1.s[0].base, 0));
    assert_true(sys >= 500 && sys < 1100); /* the schemas take the rest */
    assert_string_equal(role_of(w1.s[0].base, 0), "system");
    assert_string_equal(role_of(w1.s[0].base, 1), "user");
    o.seed = 2; /* another seed: other texts */
    ba_workload_free(&w1);
    assert_true(ba_synth_build(&o, &w1, err, sizeof err));
    assert_string_not_equal(content_of(w1.s[0].base, 1), content_of(w2.s[0].base, 1));
    ba_workload_free(&w1), ba_workload_free(&w2);
}

static void test_synth_small_and_tools(void **state) {
    (void)state;
    ba_synth_opts o = synth_opts(1, 2);
    o.system_tokens = 100, o.doc_tokens = 100, o.tool_tokens = 30;
    ba_workload w;
    char err[256];
    assert_true(ba_synth_build(&o, &w, err, sizeof err));
    assert_null(w.s[0].tools); /* no schema fits in 60 of 100 tokens */
    assert_non_null(strstr(w.desc, "0 tool schemas"));
    ba_workload_free(&w);
    /* --tools-in-system: the schemas are in the system text, no tools field */
    o = synth_opts(1, 2);
    o.tools_in_system = true;
    assert_true(ba_synth_build(&o, &w, err, sizeof err));
    assert_null(w.s[0].tools);
    const char *sys = json_string_value(json_object_get(json_array_get(w.s[0].base, 0), "content"));
    assert_non_null(sys);
    assert_non_null(strstr(sys, "Tools (JSON schemas): [{"));
    assert_non_null(strstr(sys, "read_file"));
    ba_workload_free(&w);
    json_t *t = ba_synth_tools(1100, &FIXED_SIZING);
    assert_int_equal(json_array_size(t), 4);
    assert_string_equal(json_string_value(json_object_get(json_object_get(json_array_get(t, 0), "function"), "name")),
                        "read_file");
    json_decref(t);
}

/* The history a session sends grows by the reply, verbatim, and a tool result per turn. */
static void test_history_grows(void **state) {
    (void)state;
    ba_synth_opts o = synth_opts(1, 3);
    ba_workload w;
    char err[256];
    assert_true(ba_synth_build(&o, &w, err, sizeof err));
    const ba_session *s = &w.s[0];
    json_t *h = ba_history_new(s, 1);
    json_t *m0 = ba_turn_messages(s, h, 0);
    assert_int_equal(json_array_size(m0), 2);
    json_decref(m0);
    const char *reply = "I will read the file.\n  Then \"edit\" it. ";
    assert_true(ba_feed_reply(s, h, 0, reply, NULL));
    json_t *m1 = ba_turn_messages(s, h, 1);
    assert_int_equal(json_array_size(m1), 4);
    assert_string_equal(role_of(m1, 2), "assistant");
    assert_string_equal(content_of(m1, 2), reply);
    assert_string_equal(role_of(m1, 3), "user");
    assert_true(!strncmp(content_of(m1, 3), "Tool result: exit status 0, call 1 of session 1:", 48));
    assert_true(json_equal(json_array_get(m1, 0), json_array_get(s->base, 0))); /* the start is unchanged */
    json_decref(m1);
    /* a reply with tool calls: the calls go back, the result as role "tool" with their id */
    json_t *calls = json_loads("[{\"id\":\"call_7\",\"type\":\"function\",\"function\":{\"name\":\"read_file\","
                               "\"arguments\":\"{\\\"path\\\":\\\"a.c\\\"}\"}}]", 0, NULL);
    assert_true(ba_feed_reply(s, h, 1, "", calls));
    assert_int_equal(json_array_size(h), 6);
    json_t *a = json_array_get(h, 4), *t = json_array_get(h, 5);
    assert_true(json_equal(json_object_get(a, "tool_calls"), calls));
    assert_true(json_is_null(json_object_get(a, "content")));
    assert_string_equal(role_of(h, 5), "tool");
    assert_string_equal(json_string_value(json_object_get(t, "tool_call_id")), "call_7");
    assert_true(ba_feed_reply(s, h, 2, "last", NULL)); /* the last turn adds nothing */
    assert_int_equal(json_array_size(h), 6);
    json_decref(calls), json_decref(h);
    /* from round 2 on the first message is marked, so no cache carries over */
    h = ba_history_new(s, 2);
    assert_true(!strncmp(content_of(h, 0), "(round 2)\nYou are an agent", 26));
    json_decref(h);
    ba_workload_free(&w);
}

/* ---- replay ---- */

static const char INLINE_JSONL[] =
    "{\"id\":\"conv-a\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}],"
    "\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},{\"role\":\"user\",\"content\":\"hi\"},"
    "{\"role\":\"assistant\",\"content\":\"let me look\",\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
    "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}}]},"
    "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"res\"},{\"role\":\"user\",\"content\":\"and?\"},"
    "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c2\",\"type\":\"function\","
    "\"function\":{\"name\":\"g\",\"arguments\":\"{}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"c2\","
    "\"content\":[{\"type\":\"text\",\"text\":\"ok\"}]},{\"role\":\"assistant\",\"content\":\"done\"}]}\n"
    "\n"
    "{\"messages_display\":\"user: where is my order?\\nassistant: None\\ntool: {\\\"id\\\": 1}\\n"
    "assistant: It is on its way.\\n\\nAnything else?\\nuser: no\\nassistant: bye\"}\n"
    "{\"task_id\":3,\"tools\":\"agent_tools.json\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"},"
    "{\"role\":\"assistant\",\"content\":\"y\"}]}\n";

static void write_inline(void) {
    const char *tools = "[{\"type\":\"function\",\"function\":{\"name\":\"t\"}}]";
    assert_int_equal(tu_write_file(tu_tmp("agent_tools.json"), tools, strlen(tools)), 0);
    assert_int_equal(tu_write_file(tu_tmp("agent.jsonl"), INLINE_JSONL, strlen(INLINE_JSONL)), 0);
}

static void test_replay_inline_text(void **state) {
    (void)state;
    write_inline();
    char path[4096], err[512];
    snprintf(path, sizeof path, "%s", tu_tmp("agent.jsonl"));
    ba_replay_opts o = {.path = path};
    ba_workload w;
    assert_true(ba_replay_load(&o, &w, err, sizeof err) || (fprintf(stderr, "%s\n", err), false));
    assert_int_equal(w.n, 3);
    assert_false(w.synthetic);
    /* conversation 1: tool calls as text, tool results as user messages merged with the next user message */
    const ba_session *s = &w.s[0];
    assert_non_null(strstr(s->name, "agent.jsonl:1 (conv-a)"));
    assert_int_equal(json_array_size(s->tools), 1);
    assert_int_equal(s->n_turns, 3);
    assert_int_equal(json_array_size(s->base), 7);
    assert_string_equal(content_of(s->base, 2),
                        "let me look\n<tool_call>{\"name\": \"f\", \"arguments\": {\"a\":1}}</tool_call>");
    assert_string_equal(role_of(s->base, 3), "user");
    assert_string_equal(content_of(s->base, 3), "Tool result: res\n\nand?");
    assert_string_equal(content_of(s->base, 4), "<tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>");
    assert_string_equal(content_of(s->base, 5), "Tool result: ok");
    /* turn k sends everything before the k-th assistant message */
    int want_end[] = {2, 4, 6};
    json_t *h = ba_history_new(s, 1);
    for (int k = 0; k < 3; k++) {
        assert_int_equal(s->turn_end[k], want_end[k]);
        json_t *m = ba_turn_messages(s, h, k);
        assert_int_equal(json_array_size(m), (size_t)want_end[k]);
        assert_string_not_equal(role_of(m, json_array_size(m) - 1), "assistant");
        json_decref(m);
    }
    assert_true(ba_feed_reply(s, h, 0, "whatever", NULL)); /* replay: the recorded history stays */
    assert_int_equal(json_array_size(h), 7);
    json_decref(h);
    /* conversation 2: a transcript; "None" is an unrecorded tool call; blank lines stay */
    s = &w.s[1];
    assert_int_equal(s->n_turns, 3);
    assert_int_equal(json_array_size(s->base), 6);
    assert_string_equal(content_of(s->base, 1), "<tool_call>(not recorded)</tool_call>");
    assert_string_equal(content_of(s->base, 2), "Tool result: {\"id\": 1}");
    assert_string_equal(content_of(s->base, 3), "It is on its way.\n\nAnything else?");
    assert_null(s->tools);
    /* conversation 3: tools from a file beside the JSONL */
    s = &w.s[2];
    assert_non_null(strstr(s->name, "agent.jsonl:4 (task 3)"));
    json_t *fn = json_object_get(json_array_get(s->tools, 0), "function");
    assert_string_equal(json_string_value(json_object_get(fn, "name")), "t");
    assert_int_equal(s->n_turns, 1);
    ba_workload_free(&w);
}

static void test_replay_inline_native_and_limits(void **state) {
    (void)state;
    write_inline();
    char path[4096], err[512];
    snprintf(path, sizeof path, "%s", tu_tmp("agent.jsonl"));
    json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"dflt\"}}]", 0, NULL);
    ba_replay_opts o = {.path = path, .native = true, .limit = 2, .max_turns = 2, .tools = tools};
    ba_workload w;
    assert_true(ba_replay_load(&o, &w, err, sizeof err));
    assert_int_equal(w.n, 2);
    assert_int_equal(w.s[0].n_turns, 2);
    assert_int_equal(json_array_size(w.s[0].base), 8); /* as recorded */
    assert_string_equal(role_of(w.s[0].base, 3), "tool");
    assert_true(json_is_array(json_object_get(json_array_get(w.s[0].base, 2), "tool_calls")));
    /* a transcript has no tool-call ids: text form even when native */
    assert_string_equal(role_of(w.s[1].base, 2), "user");
    assert_true(json_equal(w.s[1].tools, tools)); /* --replay-tools for one that names none */
    ba_workload_free(&w);
    json_decref(tools);
}

static void expect_load_error(const char *text, const char *msg) {
    char path[4096], err[512];
    snprintf(path, sizeof path, "%s", tu_tmp("bad.jsonl"));
    assert_int_equal(tu_write_file(path, text, strlen(text)), 0);
    ba_replay_opts o = {.path = path};
    ba_workload w;
    bool ok = ba_replay_load(&o, &w, err, sizeof err);
    if (ok || !strstr(err, msg)) fprintf(stderr, "%s -> %s\n", text, ok ? "loaded" : err);
    assert_false(ok);
    assert_non_null(strstr(err, msg));
}

static void test_replay_errors(void **state) {
    (void)state;
    expect_load_error("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
                      "{\"role\":\"assistant\",\"content\":\"b\"}]}\n{not json\n",
                      "bad.jsonl:2: not a JSON object");
    expect_load_error("{\"conversation\":[]}\n", "bad.jsonl:1: no \"messages\" array");
    expect_load_error("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}\n", "no assistant message to replay");
    expect_load_error("{\"messages\":[{\"content\":\"a\"}]}\n", "messages[0] has no \"role\"");
    expect_load_error("{\"messages_display\":\"hello\\nuser: x\"}\n", "does not start with a 'user: '");
    expect_load_error("{\"tools\":\"missing.json\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
                      "{\"role\":\"assistant\",\"content\":\"b\"}]}\n", "missing.json");
    expect_load_error("\n\n", "holds no conversation");
    char err[512];
    ba_workload w;
    ba_replay_opts o = {.path = "/nonexistent/x.jsonl"};
    assert_false(ba_replay_load(&o, &w, err, sizeof err));
    assert_non_null(strstr(err, "cannot read /nonexistent/x.jsonl"));
}

/* Every conversation of the real files parses, with one turn per assistant message. */
static void test_replay_real_files(void **state) {
    (void)state;
    char tau[4096], swe[4096], err[512];
    snprintf(tau, sizeof tau, "%s", tu_shared("agent/tau_bench/MockRetailDomainEnv-few_shot.jsonl"));
    snprintf(swe, sizeof swe, "%s", tu_shared("agent/swe_agent/swe_agent_function_calling_demos.jsonl"));
    ba_workload w;
    ba_replay_opts o = {.path = tau};
    assert_true(ba_replay_load(&o, &w, err, sizeof err) || (fprintf(stderr, "%s\n", err), false));
    assert_int_equal(w.n, 69);
    /* count the transcript's assistant lines independently */
    char *text = tu_read_file(tau, NULL);
    assert_non_null(text);
    char *save = NULL;
    int i = 0;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save), i++) {
        json_t *doc = json_loads(line, 0, NULL);
        const char *d = json_string_value(json_object_get(doc, "messages_display"));
        int n = !strncmp(d, "assistant: ", 11);
        for (const char *p = d; (p = strstr(p, "\nassistant: ")); p++) n++;
        assert_true(n > 0);
        assert_int_equal(w.s[i].n_turns, n);
        assert_string_equal(role_of(w.s[i].base, 0), "user");
        json_decref(doc);
    }
    assert_int_equal(i, 69);
    free(text);
    ba_workload_free(&w);
    o.path = swe;
    assert_true(ba_replay_load(&o, &w, err, sizeof err) || (fprintf(stderr, "%s\n", err), false));
    assert_int_equal(w.n, 4);
    int want[] = {11, 11, 13, 5};
    for (int k = 0; k < 4; k++) {
        assert_int_equal(w.s[k].n_turns, want[k]);
        assert_true(json_array_size(w.s[k].tools) >= 5); /* 5..7 schemas */
        assert_string_equal(role_of(w.s[k].base, 0), "system");
        assert_non_null(strstr(content_of(w.s[k].base, 2), "<tool_call>{\"name\": "));
    }
    ba_workload_free(&w);
}

/* ---- the stream parser's reply capture ---- */

static const char SSE_TOOLS[] =
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo \\u00e9\"}}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\","
    "\"function\":{\"name\":\"read_file\",\"arguments\":\"\"}}]}}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,"
    "\"function\":{\"arguments\":\"{\\\"pa\"}}]}}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,"
    "\"function\":{\"arguments\":\"th\\\": 1}\"}}]}}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n"
    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":900,\"completion_tokens\":7,"
    "\"prompt_tokens_details\":{\"cached_tokens\":768}}}\n\n"
    "data: [DONE]\n\n";

static void test_sse_keeps_reply(void **state) {
    (void)state;
    size_t n = strlen(SSE_TOOLS);
    for (size_t cut = 0; cut <= n; cut += 7) {
        bs_sse s;
        bs_sse_init(&s);
        s.keep_text = true;
        assert_true(bs_sse_feed(&s, SSE_TOOLS, cut, 1.0));
        assert_true(bs_sse_feed(&s, SSE_TOOLS + cut, n - cut, 2.0));
        assert_true(s.done);
        assert_string_equal(s.text, "Hello \xc3\xa9");
        assert_int_equal(s.n_tok, 5); /* 2 content chunks + 3 tool-call chunks */
        assert_int_equal(s.prompt_tokens, 900);
        assert_int_equal(s.cached_tokens, 768);
        json_t *want = json_loads("[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"read_file\","
                                  "\"arguments\":\"{\\\"path\\\": 1}\"}}]", 0, NULL);
        assert_true(json_equal(s.tool_calls, want));
        json_decref(want);
        bs_sse_free(&s);
    }
    bs_sse s; /* without keep_text nothing is kept, and no cached tokens is -1 */
    bs_sse_init(&s);
    const char *plain = "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}],\"usage\":{\"prompt_tokens\":3}}\n";
    assert_true(bs_sse_feed(&s, plain, strlen(plain), 1.0));
    assert_null(s.text);
    assert_int_equal(s.cached_tokens, -1);
    assert_int_equal(s.n_tok, 1);
    bs_sse_free(&s);
}

/* ---- statistics and reports ---- */

/* 2 sessions x 3 turns; TTFT of session s turn t = 10 (s + 1) (t + 1) ms. */
static void fake_result(ba_workload *w, ba_result *r, bool cached) {
    static ba_session sess[2] = {{.name = "one", .n_turns = 3}, {.name = "two", .n_turns = 3}};
    *w = (ba_workload){.s = sess, .n = 2, .synthetic = true};
    snprintf(w->desc, sizeof w->desc, "fake <workload> & more");
    assert_true(ba_result_init(r, "http://a", w, 1));
    for (int s = 0; s < 2; s++) {
        for (int t = 0; t < 3; t++)
            r->sess[s].turns[t] = (ba_turn_rec){.prompt_tokens = 100 * (t + 1), .cached_tokens = cached ? 50 * t : -1,
                                                .completion_tokens = 5, .ttft_ms = 10.0 * (s + 1) * (t + 1),
                                                .turn_ms = 10.0 * (s + 1) * (t + 1) + 4, .decode_ms = 4};
        r->sess[s].task_ms = 100.0 * (s + 1);
    }
}

static void test_stats(void **state) {
    (void)state;
    ba_workload w;
    ba_result r;
    ba_summary s;
    fake_result(&w, &r, true);
    assert_int_equal(r.sess[1].round, 1);
    assert_int_equal(r.sess[1].session, 2);
    assert_true(ba_summarize(&r, &s));
    assert_int_equal(s.n_turns, 3);
    /* turn 2: TTFTs 20 and 40; nearest rank: p50 = 20, p95 = 40 */
    assert_true(s.per_turn[1].ttft_ms.p50 == 20 && s.per_turn[1].ttft_ms.p95 == 40 && s.per_turn[1].n == 2);
    assert_true(s.per_turn[2].prompt_mean == 300 && s.per_turn[2].cached_mean == 100);
    /* first turns 10, 20; later turns 20, 30, 40, 60 */
    assert_true(s.ttft_first_ms.p50 == 10 && s.ttft_first_ms.p99 == 20 && s.ttft_first_ms.n == 2);
    assert_true(s.ttft_later_ms.p50 == 30 && s.ttft_later_ms.p95 == 60 && s.ttft_later_ms.n == 4);
    assert_true(s.task_ms.p50 == 100 && s.task_ms.p95 == 200);
    assert_true(s.prompt_tokens == 1200 && s.cached_tokens == 300 && s.prefill_tokens == 900);
    assert_true(s.decode_tokens == 30 && s.n_cached == 6);
    assert_true(fabs(s.decode_tokens_per_s - 24 / 0.024) < 1e-6); /* 4 tokens in 4 ms, 6 times */
    ba_summary_free(&s);
    ba_result_free(&r);
    fake_result(&w, &r, false); /* a server that reports no cached tokens */
    assert_true(ba_summarize(&r, &s));
    assert_true(s.n_cached == 0 && s.cached_tokens == 0 && s.prefill_tokens == 1200);
    assert_int_equal(s.per_turn[0].n_cached, 0);
    ba_summary_free(&s);
    ba_result_free(&r);
}

static char *print_to_string(bs_fmt fmt, const ba_report *rep) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    assert_true(ba_print(f, fmt, rep));
    fclose(f);
    return buf;
}

static void test_reports(void **state) {
    (void)state;
    ba_workload w;
    ba_result r[2];
    ba_summary s[2];
    fake_result(&w, &r[0], true);
    fake_result(&w, &r[1], false);
    r[1].target = "http://b";
    for (int t = 0; t < 3; t++) r[1].sess[0].turns[t].ttft_ms *= 2; /* B's later-turn TTFT p50: 40 vs 30 */
    r[1].sess[0].task_ms = 150;
    assert_true(ba_summarize(&r[0], &s[0]) && ba_summarize(&r[1], &s[1]));
    ba_report rep = {.w = &w, .rounds = 1, .concurrency = 2, .gen_tokens = 5, .results = r, .sums = s, .n_targets = 2};
    double task, later;
    ba_ratios(&rep, 1, &task, &later);
    assert_true(fabs(task - 1.5) < 1e-9 && fabs(later - 40.0 / 30) < 1e-9);

    char *md = print_to_string(BS_MD, &rep);
    assert_non_null(strstr(md, "| turn | samples | prompt tok | cached tok | TTFT p50 ms |"));
    assert_non_null(strstr(md, "\n| 2 | 2 | 200 | 50 | 20.0 | 40.0 | 40.0 | 24.0 |"));
    assert_non_null(strstr(md, "\n| 2 | 2 | 200 | n/a | ")); /* B reports no cached tokens */
    assert_non_null(strstr(md, "### B: http://b"));
    assert_non_null(
        strstr(md, "ratio B/A (B: http://b, A: http://a): task time p50 x1.500, later-turn TTFT p50 x1.333"));
    free(md);

    char *csv = print_to_string(BS_CSV, &rep);
    const char *head = "target,round,session,name,turn,prompt_tokens,cached_tokens,completion_tokens,ttft_ms,";
    assert_true(!strncmp(csv, head, strlen(head)));
    int rows = 0;
    for (char *p = csv; (p = strchr(p, '\n')); p++) rows++;
    assert_int_equal(rows, 1 + 2 * 2 * 3);
    assert_non_null(strstr(csv, "\n\"http://b\",1,2,\"two\",3,300,,5,"));
    free(csv);

    char *js = print_to_string(BS_JSON, &rep);
    json_t *doc = json_loads(js, 0, NULL);
    assert_non_null(doc);
    json_t *b = json_array_get(json_object_get(doc, "targets"), 1);
    assert_true(json_is_null(json_object_get(b, "cached_tokens")));
    assert_int_equal(json_integer_value(json_object_get(b, "prompt_tokens")), 1200);
    assert_int_equal(json_array_size(json_object_get(b, "sessions")), 2);
    json_t *ratio = json_array_get(json_object_get(doc, "ratios"), 0);
    assert_true(json_number_value(json_object_get(ratio, "task_p50")) == 1.5);
    json_decref(doc);
    free(js);

    const char *svg = tu_tmp("bench_agent_unit.svg");
    assert_true(ba_write_svg(svg, &rep));
    char *text = tu_read_file(svg, NULL);
    assert_true(!strncmp(text, "<svg ", 5) && strstr(text, "</svg>\n") && strstr(text, "TTFT p50 (ms)"));
    assert_non_null(strstr(text, "fake &lt;workload&gt; &amp; more"));
    assert_non_null(strstr(text, "B: http://b"));
    free(text);
    for (int i = 0; i < 2; i++) ba_summary_free(&s[i]), ba_result_free(&r[i]);
}

/* ---- end to end ---- */

/* The JSON of `kettle bench agent -m stories260K ARGS`; *wall_ms: how long
 * the whole command took by the test's clock, the most any of its
 * figures can be. */
static json_t *run_json(const char *args, int want_rc, double *wall_ms) {
    char cmd[8192], *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd, "%s bench agent -m '%s' -t 2 %s --json", KT_BIN, tu_shared("models/stories260K.gguf"),
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

static double num(json_t *o, const char *key) {
    return json_number_value(json_object_get(o, key));
}

/* Every turn: prompts grow, exactly gen tokens, 0 < TTFT <= turn time,
 * TTFT + decode time = turn time, and no time longer than the whole
 * command took (wall_ms, the test's clock: a figure 10x too large is
 * caught where the turns are most of the command; test_timing_units
 * bounds each figure from below too). From turn 2 on, the prompt is the
 * previous one, its reply and more, and the server keeps the previous
 * prompt's KV: at least that many tokens must come from the prefix
 * cache (the server reuses the reply's sampled ids too, so this is
 * met with room). */
static void check_session(json_t *s, int n_turns, int gen, double wall_ms) {
    json_t *turns = json_object_get(s, "turns");
    assert_int_equal(json_array_size(turns), (size_t)n_turns);
    double sum = 0, last_prompt = 0;
    for (int t = 0; t < n_turns; t++) {
        json_t *tr = json_array_get(turns, (size_t)t);
        assert_int_equal(json_integer_value(json_object_get(tr, "turn")), t + 1);
        double p = num(tr, "prompt_tokens"), ttft = num(tr, "ttft_ms"), ms = num(tr, "turn_ms");
        double dec = num(tr, "decode_ms"), cached = num(tr, "cached_tokens");
        assert_true(p > last_prompt);
        if (gen) assert_int_equal(json_integer_value(json_object_get(tr, "completion_tokens")), gen);
        assert_true(ttft > 0 && ttft <= ms && ms <= wall_ms);
        assert_true(fabs(ttft + dec - ms) <= 1e-3 * ms); /* the JSON's 6 digits */
        assert_true(json_is_integer(json_object_get(tr, "cached_tokens"))); /* kettle serve reports it */
        if (t > 0 && cached < last_prompt)
            fail_msg("turn %d: %.0f of %.0f prompt tokens cached; turn %d's %.0f should all be", t + 1, cached, p, t,
                     last_prompt);
        last_prompt = p, sum += ms;
    }
    assert_true(num(s, "task_ms") >= sum * 0.999 && num(s, "task_ms") <= wall_ms); /* turns run one after another */
}

static void test_end_to_end(void **state) {
    (void)state;
    const char *svg = tu_tmp("bench_agent.svg");
    remove(svg);
    char args[4096];
    snprintf(args, sizeof args, "--sessions 2 --turns 3 --system-tokens 100 --doc-tokens 100 --tool-tokens 30 "
             "--gen-tokens 8 --logit-bias '{\"5\": -100}' --svg '%s'", svg); /* the server takes the bias */
    double wall;
    json_t *doc = run_json(args, 0, &wall);
    assert_string_equal(json_string_value(json_object_get(doc, "mode")), "synthetic");
    json_t *tg = json_array_get(json_object_get(doc, "targets"), 0), *sess = json_object_get(tg, "sessions");
    assert_int_equal(json_array_size(sess), 2);
    for (size_t i = 0; i < 2; i++) check_session(json_array_get(sess, i), 3, 8, wall);
    /* at ~100 + 100 tokens, the first prompt is a few hundred tokens (a 512-token vocabulary) */
    double p1 = num(json_array_get(json_object_get(tg, "per_turn"), 0), "prompt_tokens_mean");
    assert_true(p1 >= 150 && p1 <= 600);
    assert_int_equal(json_integer_value(json_object_get(tg, "decode_tokens")), 2 * 3 * 8);
    json_t *later = json_object_get(tg, "ttft_later_ms");
    assert_int_equal(json_integer_value(json_object_get(later, "samples")), 4);
    assert_true(num(later, "p50") > 0 && num(later, "p50") <= num(later, "p95"));
    assert_true(num(tg, "peak_rss_bytes") > 1e6); /* our child: VmHWM was read */
    /* what was prefilled is what was sent less what the cache served */
    assert_true(num(tg, "prefill_tokens") == num(tg, "prompt_tokens") - num(tg, "cached_tokens"));
    json_decref(doc);
    char *text = tu_read_file(svg, NULL);
    assert_true(text && !strncmp(text, "<svg ", 5) && strstr(text, "Time to first token"));
    free(text);
}

static void test_end_to_end_replay(void **state) {
    (void)state;
    char args[4096];
    snprintf(args, sizeof args, "--ctx 4096 --replay '%s' --replay-limit 2 --turns 2 --gen-tokens 4 --concurrency 1",
             tu_shared("agent/tau_bench/MockRetailDomainEnv-few_shot.jsonl"));
    double wall;
    json_t *doc = run_json(args, 0, &wall);
    assert_string_equal(json_string_value(json_object_get(doc, "mode")), "replay");
    assert_int_equal(json_integer_value(json_object_get(doc, "concurrency")), 1);
    json_t *sess = json_object_get(json_array_get(json_object_get(doc, "targets"), 0), "sessions");
    assert_int_equal(json_array_size(sess), 2);
    for (size_t i = 0; i < 2; i++) check_session(json_array_get(sess, i), 2, 4, wall);
    json_decref(doc);
}

/* ---- --screenshots: the screens ---- */

/* Pixels that differ between two w x h RGB pictures. */
static long pixels_apart(const uint8_t *a, const uint8_t *b, int w, int h) {
    long n = 0;
    for (size_t i = 0; i < (size_t)w * (size_t)h; i++) n += memcmp(a + 3 * i, b + 3 * i, 3) != 0;
    return n;
}

/* The same seed and step give the same bytes; the PNG decodes with
 * kettle's own decoder to the asked size and exactly the drawn pixels
 * (PNG is lossless, so the tower sees what was drawn). */
static void check_screen_png(int w, int h) {
    uint8_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    char err[256];
    assert_true(ba_screen_png(9, 2, w, h, &a, &na, err, sizeof err));
    assert_true(ba_screen_png(9, 2, w, h, &b, &nb, err, sizeof err));
    assert_true(na == nb && na > 100 && !memcmp(a, b, na));
    kt_image_limits lim;
    kt_image_limits_default(&lim);
    kt_image img = {0};
    kt_error e = {0};
    assert_int_equal(kt_image_decode(a, na, &lim, &img, &e), KT_OK);
    assert_int_equal(img.width, w);
    assert_int_equal(img.height, h);
    uint8_t *px = ba_screen_pixels(9, 2, w, h);
    assert_non_null(px);
    assert_int_equal(pixels_apart(px, img.rgb, w, h), 0);
    printf("  %dx%d: a %zu-byte PNG\n", w, h, na);
    free(px), kt_image_free(&img), free(a), free(b);
}

/* Consecutive steps differ a little (a new row of text, another button
 * lit, the pointer moved), not wholly; another seed is another desktop. */
static void test_screens(void **state) {
    (void)state;
    check_screen_png(1280, 720);
    check_screen_png(320, 200);
    check_screen_png(BA_SCREEN_MIN_W, BA_SCREEN_MIN_H);
    const int w = 1280, h = 720;
    uint8_t *s0 = ba_screen_pixels(1, 0, w, h), *s1 = ba_screen_pixels(1, 1, w, h);
    uint8_t *s1b = ba_screen_pixels(1, 1, w, h), *o1 = ba_screen_pixels(2, 1, w, h);
    assert_true(s0 && s1 && s1b && o1);
    long step = pixels_apart(s0, s1, w, h), seed = pixels_apart(s1, o1, w, h), all = (long)w * h;
    printf("  1280x720: %ld pixels change from step 1 to 2, %ld between two seeds\n", step, seed);
    assert_int_equal(pixels_apart(s1, s1b, w, h), 0);
    assert_true(step > 500 && step < all / 10);
    assert_true(seed > all / 5); /* the wallpaper's colours and the rows' words are the seed's, the window is not */
    free(s0), free(s1), free(s1b), free(o1);
}

static void test_base64(void **state) {
    (void)state;
    static const char *const CASES[][2] = {{"", ""},         {"f", "Zg=="},         {"fo", "Zm8="},
                                           {"foo", "Zm9v"},  {"foob", "Zm9vYg=="},  {"fooba", "Zm9vYmE="},
                                           {"foobar", "Zm9vYmFy"}};
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        char *b = ba_base64((const uint8_t *)CASES[i][0], strlen(CASES[i][0]));
        assert_non_null(b);
        assert_string_equal(b, CASES[i][1]);
        free(b);
    }
}

/* ---- --screenshots: the conversation ---- */

static int omitted_in(json_t *msgs) {
    char *text = json_dumps(msgs, JSON_COMPACT);
    int n = 0;
    for (const char *p = text; (p = strstr(p, BA_SHOT_OMITTED)); p++) n++;
    free(text);
    return n;
}

static void test_shots_history(void **state) {
    (void)state;
    json_t *h = ba_shots_history_new();
    assert_non_null(h);
    char url[64];
    for (int k = 0; k < 4; k++) {
        snprintf(url, sizeof url, "data:image/png;base64,STEP%d", k);
        assert_true(ba_shots_add_screen(h, k, url));
        if (k < 3) assert_true(ba_shots_add_reply(h, "{\"action\":\"done\",\"x\":0,\"y\":0}"));
    }
    assert_int_equal(json_array_size(h), 1 + 4 + 3); /* system, 4 screens, 3 replies */
    assert_string_equal(role_of(h, 0), "system");
    assert_string_equal(role_of(h, 2), "assistant");
    int n_img;
    json_t *all = ba_shots_messages(h, 0, 0, &n_img); /* keep all: the history as it is */
    assert_int_equal(n_img, 4);
    assert_true(json_equal(all, h));
    json_t *two = ba_shots_messages(h, 2, 0, &n_img);
    assert_int_equal(n_img, 2);
    assert_int_equal(omitted_in(two), 2);
    char *text = json_dumps(two, JSON_COMPACT);
    assert_true(!strstr(text, "STEP0") && !strstr(text, "STEP1") && strstr(text, "STEP2") && strstr(text, "STEP3"));
    free(text);
    assert_true(json_equal(json_array_get(two, 7), json_array_get(h, 7))); /* the newest untouched */
    /* the prepared step counts the screenshot to come: one more dropped already */
    json_t *prep = ba_shots_messages(h, 2, 1, &n_img);
    assert_int_equal(n_img, 1);
    assert_int_equal(omitted_in(prep), 3);
    assert_int_equal(omitted_in(h), 0); /* the history itself keeps every screenshot */
    json_decref(all), json_decref(two), json_decref(prep), json_decref(h);
    /* the response_format: the action schema, x and y on the screen */
    json_t *rf = ba_shots_response_format(320, 200);
    json_t *schema = json_object_get(json_object_get(rf, "json_schema"), "schema");
    assert_string_equal(json_string_value(json_object_get(rf, "type")), "json_schema");
    assert_true(json_is_false(json_object_get(schema, "additionalProperties")));
    assert_int_equal(json_array_size(json_object_get(schema, "required")), 3);
    json_t *x = json_object_get(json_object_get(schema, "properties"), "x");
    assert_int_equal(json_integer_value(json_object_get(x, "maximum")), 319);
    json_decref(rf);
}

/* The reply's start kept for the report is cut at a character boundary:
 * a cut inside a UTF-8 sequence made the JSON report fail (jansson
 * refuses invalid UTF-8) after a whole run against llama-server. */
static void test_reply_start(void **state) {
    (void)state;
    char text[256], dst[128];
    memset(text, 'a', 126);
    strcpy(text + 126, "\xe2\x82\xac tail"); /* a 3-byte character across the cut at 127 */
    ba_reply_start(dst, sizeof dst, text);
    assert_int_equal(strlen(dst), 126);
    json_t *j = json_string(dst);
    assert_non_null(j);
    json_decref(j);
    memset(text, 'a', 127);
    strcpy(text + 127, "\xc3\xa9"); /* a 2-byte character just past the cut */
    ba_reply_start(dst, sizeof dst, text);
    assert_int_equal(strlen(dst), 127);
    ba_reply_start(dst, sizeof dst, "{\"action\":\"click\"} \xc3\xa9");
    assert_string_equal(dst, "{\"action\":\"click\"} \xc3\xa9");
}

static void test_action_valid(void **state) {
    (void)state;
    static const struct { const char *text; bool ok; } CASES[] = {
        {"{\"action\":\"click\",\"x\":10,\"y\":20}", true},
        {" {\"action\": \"type\", \"x\": 0, \"y\": 199, \"text\": \"hello\"}\n", true},
        {"{\"action\":\"done\",\"x\":319,\"y\":0,\"text\":\"0123456789012345678901234567890123456789\"}", true},
        {"{\"action\":\"done\",\"x\":319,\"y\":0,\"text\":\"01234567890123456789012345678901234567890\"}", false},
        {"{\"action\":\"drag\",\"x\":1,\"y\":2}", false},           /* not in the enum */
        {"{\"action\":\"click\",\"x\":1}", false},                  /* y missing */
        {"{\"action\":\"click\",\"x\":320,\"y\":2}", false},        /* off the screen */
        {"{\"action\":\"click\",\"x\":1.5,\"y\":2}", false},        /* not an integer */
        {"{\"action\":\"click\",\"x\":1,\"y\":2,\"why\":\"\"}", false}, /* another key */
        {"{\"action\":\"click\",\"x\":1,\"y\":", false},            /* cut at max_tokens */
        {"", false},
    };
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++)
        if (ba_action_valid(CASES[i].text, 320, 200) != CASES[i].ok) fail_msg("case %zu: %s", i, CASES[i].text);
    assert_false(ba_action_valid(NULL, 320, 200));
}

/* ---- --screenshots: figures and reports on made-up records ---- */

static ba_step_rec fake_step(int k, bool metrics) {
    return (ba_step_rec){.done = true, .images = k + 1, .prompt_tokens = 100 * (k + 1), .cached_tokens = 100 * k,
                         .completion_tokens = 10, .ttft_ms = 50.0 + k, .action_ms = 200.0 + 10 * k,
                         .action_valid = k != 1, .encode_ms = metrics ? 20.0 + k : -1, .encodes = metrics ? 1 : -1,
                         .encoder_hits = metrics ? 0 : -1, .prep_encodes = -1};
}

static void test_shots_stats_reports(void **state) {
    (void)state;
    ba_shots_result r[2];
    assert_true(ba_shots_result_init(&r[0], "http://a", false, 2, 3));
    assert_true(ba_shots_result_init(&r[1], "http://b +prepare", true, 2, 3));
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 2; k++) {
            for (int t = 0; t < 3; t++) {
                ba_step_rec x = fake_step(t, i == 0);
                x.ttft_ms *= i + 1, x.action_ms *= i + 1, x.ttft_ms += k;
                if (i == 1 && t < 2) x.prepared = true, x.prep_ms = 30, x.prep_wait_ms = t == 1 ? 5 : 0;
                r[i].sess[k].steps[t] = x;
            }
            r[i].sess[k].task_ms = 1000.0 * (i + 1) + k;
        }
    ba_shots_summary s[2];
    for (int i = 0; i < 2; i++) assert_true(ba_shots_summarize(&r[i], &s[i]));
    assert_int_equal(s[0].n_steps, 3);
    assert_int_equal(s[0].n_steps_done, 6);
    assert_int_equal(s[0].n_valid, 4);
    assert_true(s[0].per_step[2].images_mean == 3 && s[0].per_step[2].encodes_mean == 1);
    assert_true(s[0].per_step[1].ttft_ms.p50 == 51 && s[0].per_step[1].ttft_ms.p95 == 52);
    assert_int_equal(s[0].ttft_later_ms.n, 4);
    assert_int_equal(s[0].encode_ms.n, 6);
    assert_int_equal(s[1].encode_ms.n, 0); /* no /metrics: nothing assumed */
    assert_int_equal(s[1].prep_ms.n, 4);
    assert_int_equal(s[1].n_prep_waits, 2);
    assert_true(s[0].task_ms.p50 == 1000 && s[1].task_ms.p50 == 2000);
    assert_int_equal(s[0].cached_tokens, 2 * (0 + 100 + 200));
    ba_shots_opts o = {.steps = 3, .sessions = 2, .screen_w = 320, .screen_h = 200, .action_ms = 300, .gen_tokens = 48};
    ba_shots_report rep = {.o = &o, .results = r, .sums = s, .n_targets = 2};
    double action, later, task;
    ba_shots_ratios(&rep, 1, &action, &later, &task);
    assert_true(fabs(action - 2) < 1e-9 && fabs(task - 2) < 1e-3);
    /* Markdown: the tables, '-' for what the target does not give */
    char *md = NULL;
    size_t md_len = 0;
    FILE *f = open_memstream(&md, &md_len);
    assert_true(ba_shots_print(f, BS_MD, &rep));
    fclose(f);
    assert_non_null(strstr(md, "| 3 | 2 | 3.0 | 300 | 200 | 22.0 | 1 | 52.0 | 53.0 | 220.0 | 220.0 |"));
    assert_non_null(strstr(md, "| 3 | 2 | 3.0 | 300 | 200 | - | - |"));
    assert_non_null(strstr(md, "### B: http://b +prepare (with the prepared step)"));
    assert_non_null(strstr(md, "prepared requests that outlasted the action | 2 |"));
    assert_non_null(strstr(md, "ratio B/A (B: http://b +prepare, A: http://a): step time p50 x2.000"));
    free(md);
    /* JSON: null where unknown, a failed target's message */
    snprintf(r[1].error, sizeof r[1].error, "session 2, step 1/3: HTTP 400: no");
    char *js = NULL;
    size_t js_len = 0;
    f = open_memstream(&js, &js_len);
    assert_true(ba_shots_print(f, BS_JSON, &rep));
    fclose(f);
    json_t *doc = json_loads(js, 0, NULL);
    assert_non_null(doc);
    json_t *tb = json_array_get(json_object_get(doc, "targets"), 1);
    assert_string_equal(json_string_value(json_object_get(tb, "failed")), "session 2, step 1/3: HTTP 400: no");
    assert_true(json_is_null(json_object_get(tb, "encode_ms")));
    json_t *st = json_array_get(json_object_get(json_array_get(json_object_get(tb, "sessions"), 0), "steps"), 0);
    assert_true(json_is_null(json_object_get(st, "encode_ms")));
    assert_true(num(json_object_get(st, "prepared"), "ms") == 30);
    assert_int_equal(json_array_size(json_object_get(doc, "ratios")), 0); /* none with a failed target */
    json_decref(doc);
    free(js);
    for (int i = 0; i < 2; i++) ba_shots_summary_free(&s[i]), ba_shots_result_free(&r[i]);
}

/* ---- failures ---- */

static void expect_failure(const char *args, int want_rc, const char *msg1, const char *msg2) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s bench agent %s", KT_BIN, args);
    tu_expect_run(cmd, want_rc, msg1, msg2);
}

/* "paced": a turn's first token comes PACED_FIRST_MS after its request,
 * the second PACED_GAP_MS after that (test_timing_units). */
#define PACED_FIRST_MS 200
#define PACED_GAP_MS 100

/* A fake server's answer (fake_server.h): /tokenize is 404, the warm-up
 * ("Hello.") gets a good stream, a turn gets what the mode (arg) says. */
static void fake_reply(int c, const char *req, void *arg) {
    const char *mode = arg;
    static const char HEAD[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n";
    static const char CHUNK[] = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\n";
    if (strstr(req, "/tokenize")) {
        const char *nf = "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        (void)!write(c, nf, strlen(nf));
        return;
    }
    bool turn = strstr(req, "DOCUMENT") != NULL, paced = turn && !strcmp(mode, "paced");
    (void)!write(c, HEAD, sizeof HEAD - 1);
    if (paced) tu_nap_ms(PACED_FIRST_MS);
    (void)!write(c, CHUNK, sizeof CHUNK - 1);
    if (paced) {
        tu_nap_ms(PACED_GAP_MS);
        (void)!write(c, CHUNK, sizeof CHUNK - 1);
        (void)!write(c, "data: [DONE]\n\n", 14);
    } else if (!turn) (void)!write(c, "data: [DONE]\n\n", 14);
    else if (!strcmp(mode, "malformed")) (void)!write(c, "data: {oops\n\n", 13);
    else if (!strcmp(mode, "stall")) sleep(30);
}

static void expect_fake_failure(const char *mode, const char *extra, const char *msg) {
    int port;
    pid_t pid = tu_fake_server_start(fake_reply, (void *)mode, false, &port);
    char args[512];
    snprintf(args, sizeof args, "--url http://127.0.0.1:%d --sessions 2 --turns 2 --system-tokens 50 "
             "--doc-tokens 50 --tool-tokens 10 --gen-tokens 4 %s", port, extra);
    expect_failure(args, 1, ", turn 1/2: ", msg); /* "URL, round 1, session N, turn 1/2: MSG" */
    tu_fake_server_stop(pid);
}

/* The figures are in the unit they claim. Against the "paced" fake server
 * a turn's first token takes at least PACED_FIRST_MS and its second at
 * least PACED_GAP_MS more, so TTFT, decode time, turn and task times have
 * floors the sleeps guarantee; and none can exceed the whole command's
 * time on the test's own clock, which is a few times the sleeps (the rest
 * is a warm-up reply and process start). A figure 10x too small is under
 * its floor, one 10x too large is over the command's time.
 * TTFT and turn time start when the request leaves the client, before the
 * server's sleeps begin, so load only lengthens them. Decode time is the
 * gap between two arrivals: when the first token reaches the client later
 * than the second does after its own send (a loaded machine, CI saw
 * 99.8 ms for a 100 ms sleep), the gap shrinks by that difference, so its
 * floor is half the sleep, still 5x above a figure 10x too small.
 * Within a turn, TTFT + decode time = turn time, and decode tokens/s is
 * the tokens after the first over the decode time. */
static void test_timing_units(void **state) {
    (void)state;
    int port;
    pid_t pid = tu_fake_server_start(fake_reply, (void *)"paced", false, &port);
    char cmd[1024], *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd, "%s bench agent --url http://127.0.0.1:%d --sessions 1 --turns 2 --system-tokens 50 "
             "--doc-tokens 50 --tool-tokens 10 --gen-tokens 2 --json", KT_BIN, port);
    double t0 = tu_now_ms();
    int rc = tu_run(cmd, &out, &err);
    double wall = tu_now_ms() - t0;
    tu_fake_server_stop(pid);
    if (rc != 0) fail_msg("%s\n-> %d\n%s", cmd, rc, err);
    json_t *doc = json_loads(out, 0, NULL);
    assert_non_null(doc);
    json_t *tg = json_array_get(json_object_get(doc, "targets"), 0);
    json_t *sess = json_array_get(json_object_get(tg, "sessions"), 0), *turns = json_object_get(sess, "turns");
    assert_int_equal(json_array_size(turns), 2);
    double decode_sum = 0;
    for (size_t t = 0; t < 2; t++) {
        json_t *tr = json_array_get(turns, t);
        double ttft = num(tr, "ttft_ms"), dec = num(tr, "decode_ms"), ms = num(tr, "turn_ms");
        printf("  turn %zu: TTFT %.1f ms (>= %d), decode %.1f ms (>= %d), turn %.1f ms (>= %d); the command took %.1f ms\n",
               t + 1, ttft, PACED_FIRST_MS, dec, PACED_GAP_MS / 2, ms, PACED_FIRST_MS + PACED_GAP_MS, wall);
        assert_int_equal(json_integer_value(json_object_get(tr, "completion_tokens")), 2);
        assert_true(ttft >= PACED_FIRST_MS && ttft <= wall);
        assert_true(dec >= PACED_GAP_MS / 2 && dec <= wall);
        assert_true(ms >= PACED_FIRST_MS + PACED_GAP_MS && ms <= wall);
        assert_true(fabs(ttft + dec - ms) <= 1e-3 * ms); /* the JSON's 6 digits */
        decode_sum += dec;
    }
    double task = num(sess, "task_ms");
    assert_true(task >= 2 * (PACED_FIRST_MS + PACED_GAP_MS) && task <= wall);
    /* one token after the first per turn */
    double tps = num(tg, "decode_tokens_per_s");
    assert_true(fabs(tps - 2 / (decode_sum / 1e3)) <= 1e-3 * tps);
    json_decref(doc);
    free(out), free(err);
}

static void test_failures(void **state) {
    (void)state;
    char args[4096];
    expect_failure("--url http://127.0.0.1:1", 1, "http://127.0.0.1:1, warm-up request: connection failed", NULL);
    snprintf(args, sizeof args, "-m '%s' -t 2 --ctx 256 --sessions 1", tu_shared("models/stories260K.gguf"));
    expect_failure(args, 1, "round 1, session 1, turn 1/4: HTTP 400", "context");
    expect_fake_failure("malformed", "", "a data line is not a JSON object");
    expect_fake_failure("cut", "", "the stream ended before 'data: [DONE]'");
    expect_fake_failure("stall", "--timeout 1", "timed out");
    expect_failure("-m /nonexistent.gguf", 1, "exited before listening", "nonexistent");
    expect_failure("", 2, "--url URL (up to 4) or -m MODEL", NULL);
    expect_failure("--url a --url b --url c --url d --url e", 2, "at most 4 --url", NULL);
    expect_failure("--url http://x -t 2", 2, "need -m", NULL);
    expect_failure("--url http://x --replay f.jsonl --doc-tokens 8k", 2, "--doc-tokens is for the synthetic", NULL);
    expect_failure("--url http://x --replay-limit 3", 2, "need --replay", NULL);
    expect_failure("--url http://x --tool-format xml", 2, "text or native", NULL);
    expect_failure("--url http://x --logit-bias '[1]'", 2, "--logit-bias takes a JSON object", NULL);
    expect_failure("--url http://x --doc-tokens 3q", 2, "--doc-tokens", NULL);
    expect_failure("--url http://127.0.0.1:1 --replay /nonexistent.jsonl", 1, "cannot read /nonexistent.jsonl", NULL);
    char *out = NULL;
    snprintf(args, sizeof args, "%s bench agent --help", KT_BIN);
    assert_int_equal(tu_run(args, &out, NULL), 0);
    const char *opts[] = {"--url", "--model", "--sessions", "--concurrency", "--turns", "--system-tokens",
                          "--doc-tokens", "--tool-tokens", "--gen-tokens", "--seed", "--replay ", "--replay-limit",
                          "--replay-tools", "--tool-format", "--logit-bias", "--rounds", "--model-name", "--api-key", "--timeout",
                          "--json", "--csv", "--svg", "--chat-template"};
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) assert_non_null(strstr(out, opts[i]));
    free(out);
}

/* The check a client's retry depends on: every way a call can be unusable. */
static void test_calls_valid(void **state) {
    (void)state;
    json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
                               "\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}},"
                               "\"required\":[\"a\"],\"additionalProperties\":false}}}]", 0, NULL);
    assert_non_null(tools);
    static const struct { const char *calls; bool ok; } cases[] = {
        {"[{\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\": 1, \\\"b\\\": \\\"x\\\"}\"}}]", true},
        {"[{\"function\":{\"name\":\"g\",\"arguments\":\"{\\\"a\\\": 1}\"}}]", false},        /* not offered */
        {"[{\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\": 1\"}}]", false},          /* not JSON */
        {"[{\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"b\\\": \\\"x\\\"}\"}}]", false}, /* a missing */
        {"[{\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\": \\\"1\\\"}\"}}]", false}, /* a's type */
        {"[{\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\": 1, \\\"c\\\": 2}\"}}]", false}, /* extra key */
        {"[{\"function\":{\"name\":\"f\",\"arguments\":\"[1]\"}}]", false},                        /* not an object */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *calls = json_loads(cases[i].calls, 0, NULL);
        assert_non_null(calls);
        if (ba_calls_valid(tools, calls) != cases[i].ok) fail_msg("case %zu: %s", i, cases[i].calls);
        json_decref(calls);
    }
    json_decref(tools);
}

/* ---- --screenshots end to end ---- */

/* The JSON of `kettle bench agent ARGS --json` (args name the server),
 * exiting want_rc; *wall_ms: the command's time by the test's clock. */
static json_t *shots_json(const char *args, int want_rc, double *wall_ms) {
    char cmd[8192], *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd, "%s bench agent %s --screenshots --json", KT_BIN, args);
    double t0 = tu_now_ms();
    int rc = tu_run(cmd, &out, &err);
    *wall_ms = tu_now_ms() - t0;
    if (rc != want_rc) fprintf(stderr, "%s\n-> %d\n%s\n%s\n", cmd, rc, out, err);
    assert_int_equal(rc, want_rc);
    json_t *doc = json_loads(out, 0, NULL);
    if (!doc) fprintf(stderr, "not JSON:\n%s\n%s\n", out, err);
    assert_non_null(doc);
    free(out), free(err);
    return doc;
}

/* "-m TEXT --mmproj MMPROJ ..." for golden/arch's random-weight Qwen 3.5
 * with its qwen3vl projector. */
static void vision_server_args(char *buf, size_t cap, const char *more) {
    char model[1024];
    snprintf(model, sizeof model, "%s", tu_shared("golden/arch/qwen35-F16.gguf"));
    snprintf(buf, cap, "-m '%s' --mmproj '%s' --chat-template chatml -t 2 --ctx 4096 %s", model,
             tu_shared("golden/arch/mmproj-qwen3vl-F32.gguf"), more);
}

static json_t *step_of(json_t *target, int session, int step) {
    json_t *s = json_array_get(json_object_get(target, "sessions"), (size_t)session);
    return json_array_get(json_object_get(s, "steps"), (size_t)step);
}

/* Every step of a target's one session: all screenshots kept as images,
 * exactly the new one encoded (kettle's /metrics), the encoder's time
 * inside the wait for the first token, TTFT within the step time within
 * the command's time, the prompt growing, and the earlier history (the
 * last step's whole prompt) served from the prefix cache. */
static void check_shots_steps(json_t *tg, int n_steps, int action_ms, double wall_ms) {
    double sum = 0;
    for (int t = 0; t < n_steps; t++) {
        json_t *x = step_of(tg, 0, t), *prev = t ? step_of(tg, 0, t - 1) : NULL;
        double ttft = num(x, "ttft_ms"), ms = num(x, "step_ms"), enc = num(x, "encode_ms");
        double prompt = num(x, "prompt_tokens"), cached = num(x, "cached_tokens");
        printf("  %s step %d: %.0f prompt tokens, %.0f cached, encode %.1f ms, TTFT %.1f ms, step %.1f ms\n",
               json_string_value(json_object_get(tg, "target")), t + 1, prompt, cached, enc, ttft, ms);
        assert_int_equal(json_integer_value(json_object_get(x, "step")), t + 1);
        assert_int_equal(json_integer_value(json_object_get(x, "images")), t + 1);
        assert_int_equal(json_integer_value(json_object_get(x, "encodes")), 1);
        assert_true(json_is_integer(json_object_get(x, "cached_tokens")));
        assert_true(enc > 0 && enc <= ttft);
        assert_true(ttft > 0 && ttft <= ms && ms <= wall_ms);
        if (prev && prompt <= num(prev, "prompt_tokens")) fail_msg("step %d: the prompt did not grow", t + 1);
        if (prev && cached < num(prev, "prompt_tokens"))
            fail_msg("step %d: %.0f tokens cached; step %d's %.0f should all be", t + 1, cached, t,
                     num(prev, "prompt_tokens"));
        sum += ms;
    }
    json_t *per = json_object_get(tg, "per_step");
    assert_int_equal(json_array_size(per), (size_t)n_steps);
    assert_true(num(json_array_get(per, (size_t)n_steps - 1), "encodes_mean") == 1);
    assert_int_equal(json_integer_value(json_object_get(tg, "steps_done")), n_steps);
    double task = num(json_array_get(json_object_get(tg, "sessions"), 0), "task_ms");
    assert_true(task >= sum + (n_steps - 1) * action_ms && task <= wall_ms); /* steps and actions in turn */
    assert_int_equal(json_integer_value(json_object_get(json_object_get(tg, "step_ms"), "samples")), n_steps);
}

/* The prepared step: after each step but the last, a max_tokens 0 request
 * of the history with the reply just given; it encodes nothing (every
 * screenshot in it was seen), and the next step finds that prompt in the
 * prefix cache but for its tail: the generation prompt the next step does
 * not have (<|im_start|>assistant\n, 3 tokens) and the cache's last
 * partial block (16 tokens). */
static void check_prepared(json_t *tg, int n_steps) {
    assert_true(json_is_true(json_object_get(tg, "prepare")));
    for (int t = 0; t < n_steps; t++) {
        json_t *x = step_of(tg, 0, t), *p = json_object_get(x, "prepared");
        if (t == n_steps - 1) {
            assert_true(json_is_null(p));
            continue;
        }
        double pp = num(p, "prompt_tokens"), next_cached = num(step_of(tg, 0, t + 1), "cached_tokens");
        printf("  prepared after step %d: %.1f ms, %.0f prompt tokens; step %d then had %.0f cached\n", t + 1,
               num(p, "ms"), pp, t + 2, next_cached);
        assert_true(num(p, "ms") > 0);
        assert_int_equal(json_integer_value(json_object_get(p, "encodes")), 0);
        assert_true(pp > num(x, "prompt_tokens"));
        assert_true(next_cached >= pp - 3 - 16);
    }
    json_t *later = json_object_get(tg, "ttft_later_ms"), *prep = json_object_get(tg, "prepare_ms");
    assert_int_equal(json_integer_value(json_object_get(later, "samples")), n_steps - 1);
    assert_int_equal(json_integer_value(json_object_get(prep, "samples")), n_steps - 1);
    assert_true(num(later, "p50") > 0);
}

/* 10 steps, as an agent's history of 10 screenshots: each step encodes
 * only its new one and finds the rest in the prefix cache. */
#define SHOT_STEPS 10

static void test_shots_end_to_end(void **state) {
    (void)state;
    char args[4096];
    vision_server_args(args, sizeof args, "--steps 10 --screen 224x160 --gen-tokens 12 --prepare --action-ms 50");
    double wall;
    json_t *doc = shots_json(args, 0, &wall);
    assert_string_equal(json_string_value(json_object_get(doc, "mode")), "screenshots");
    json_t *tgs = json_object_get(doc, "targets");
    assert_int_equal(json_array_size(tgs), 2); /* plain, then with the prepared step */
    for (size_t i = 0; i < 2; i++) {
        json_t *tg = json_array_get(tgs, i);
        assert_true(json_is_null(json_object_get(tg, "failed")));
        check_shots_steps(tg, SHOT_STEPS, 50, wall);
    }
    assert_true(json_is_false(json_object_get(json_array_get(tgs, 0), "prepare")));
    check_prepared(json_array_get(tgs, 1), SHOT_STEPS);
    assert_int_equal(json_array_size(json_object_get(doc, "ratios")), 1);
    json_decref(doc);
    /* --keep-screens 1: one image per request, the older ones as text; the
     * history after a dropped screenshot is no longer a prefix the cache
     * has, unless the prepared step sent it, dropped, during the action */
    vision_server_args(args, sizeof args, "--steps 3 --screen 320x200 --gen-tokens 12 --keep-screens 1 --action-ms 0 --prepare");
    doc = shots_json(args, 0, &wall);
    for (size_t i = 0; i < 2; i++) {
        json_t *tg = json_array_get(json_object_get(doc, "targets"), i);
        for (int t = 0; t < 3; t++) {
            json_t *x = step_of(tg, 0, t), *p = json_object_get(x, "prepared");
            assert_int_equal(json_integer_value(json_object_get(x, "images")), 1);
            assert_int_equal(json_integer_value(json_object_get(x, "encodes")), 1);
            if (i == 0 || t == 2) continue;
            assert_int_equal(json_integer_value(json_object_get(p, "encodes")), 0);
            double next_cached = num(step_of(tg, 0, t + 1), "cached_tokens");
            printf("  --keep-screens 1: prepared after step %d, %.0f prompt tokens; step %d then had %.0f cached\n",
                   t + 1, num(p, "prompt_tokens"), t + 2, next_cached);
            assert_true(next_cached >= num(p, "prompt_tokens") - 3 - 16);
        }
        if (i == 0) assert_true(num(step_of(tg, 0, 2), "cached_tokens") < num(step_of(tg, 0, 1), "prompt_tokens"));
    }
    json_decref(doc);
}

/* A llama-server-like fake: no /metrics, and max_tokens 0 refused; a
 * request with a kettle-only field is refused too, so the test sees it. */
static void fake_shots(int c, const char *req, void *arg) {
    (void)arg;
    static const char HEAD[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n";
    static const char ACTION[] = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":"
                                 "\"{\\\"action\\\":\\\"click\\\",\\\"x\\\":5,\\\"y\\\":6}\"}}]}\n\n"
                                 "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n"
                                 "data: [DONE]\n\n";
    const char *body = strstr(req, "\r\n\r\n"), *refusal = NULL;
    if (strstr(req, "GET /metrics")) refusal = "404 Not Found";
    else if (body && (strstr(body, "ignore_eos") || strstr(body, "cache_prompt") || strstr(body, "kettle")))
        refusal = "400 Bad Request";
    else if (body && strstr(body, "\"max_tokens\":0")) refusal = "400 Bad Request";
    if (!refusal) {
        (void)!write(c, HEAD, sizeof HEAD - 1);
        (void)!write(c, ACTION, sizeof ACTION - 1);
        return;
    }
    char out[512];
    const char *msg = strstr(refusal, "404") ? "" : strstr(body, "\"max_tokens\":0") ?
        "{\"error\":{\"message\":\"max_tokens must be at least 1\"}}" : "{\"error\":{\"message\":\"unknown field\"}}";
    int n = snprintf(out, sizeof out, "HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n%s", refusal, strlen(msg), msg);
    (void)!write(c, out, (size_t)n);
}

static void test_shots_other_server(void **state) {
    (void)state;
    int port;
    pid_t pid = tu_fake_server_start(fake_shots, NULL, false, &port);
    char args[512];
    snprintf(args, sizeof args, "--url http://127.0.0.1:%d --steps 2 --screen 160x120 --prepare --action-ms 0", port);
    double wall;
    json_t *doc = shots_json(args, 1, &wall); /* the prepared run failed: status 1, and the report */
    tu_fake_server_stop(pid);
    json_t *a = json_array_get(json_object_get(doc, "targets"), 0), *b = json_array_get(json_object_get(doc, "targets"), 1);
    assert_true(json_is_null(json_object_get(a, "failed")));
    assert_int_equal(json_integer_value(json_object_get(a, "steps_done")), 2);
    assert_int_equal(json_integer_value(json_object_get(a, "valid_actions")), 2);
    assert_true(json_is_null(json_object_get(a, "encode_ms"))); /* no /metrics: not known, not 0 */
    assert_true(json_is_null(json_object_get(step_of(a, 0, 0), "encode_ms")));
    assert_true(json_is_null(json_object_get(step_of(a, 0, 0), "cached_tokens")));
    const char *why = json_string_value(json_object_get(b, "failed"));
    assert_non_null(why);
    assert_non_null(strstr(why, "session 1, step 1/2, the prepared request (max_tokens 0): HTTP 400"));
    assert_non_null(strstr(why, "max_tokens must be at least 1"));
    json_decref(doc);
}

static void test_shots_failures(void **state) {
    (void)state;
    char args[4096];
    /* a server without a vision projector: the step's 400, named */
    snprintf(args, sizeof args, "-m '%s' -t 2 --screenshots --steps 2 --screen 160x120 --action-ms 0",
             tu_shared("models/stories260K.gguf"));
    expect_failure(args, 1, "FAILED: session 1, step 1/2: HTTP 400", NULL);
    expect_failure("--url http://x --steps 3", 2, "--steps needs --screenshots", NULL);
    expect_failure("--url http://x --prepare", 2, "--prepare needs --screenshots", NULL);
    expect_failure("--url http://x --screenshots --turns 3", 2, "--turns is not for --screenshots", NULL);
    expect_failure("--url http://x --screenshots --screen 100x100", 2, "--screen takes WIDTHxHEIGHT", NULL);
    expect_failure("--url http://x --screenshots --screen 1280x720x3", 2, "--screen takes WIDTHxHEIGHT", NULL);
    char cmd[512], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s bench agent --help", KT_BIN);
    assert_int_equal(tu_run(cmd, &out, NULL), 0);
    const char *opts[] = {"--screenshots", "--steps", "--screen", "--keep-screens", "--action-ms", "--prepare",
                          "--mmproj"};
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) assert_non_null(strstr(out, opts[i]));
    free(out);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN); /* the fake server writes to clients that may have gone */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_calls_valid),
        cmocka_unit_test(test_words),
        cmocka_unit_test(test_synth_deterministic),
        cmocka_unit_test(test_synth_small_and_tools),
        cmocka_unit_test(test_history_grows),
        cmocka_unit_test(test_replay_inline_text),
        cmocka_unit_test(test_replay_inline_native_and_limits),
        cmocka_unit_test(test_replay_errors),
        cmocka_unit_test(test_replay_real_files),
        cmocka_unit_test(test_sse_keeps_reply),
        cmocka_unit_test(test_stats),
        cmocka_unit_test(test_reports),
        cmocka_unit_test(test_end_to_end),
        cmocka_unit_test(test_end_to_end_replay),
        cmocka_unit_test(test_failures),
        cmocka_unit_test(test_timing_units),
        cmocka_unit_test(test_screens),
        cmocka_unit_test(test_base64),
        cmocka_unit_test(test_shots_history),
        cmocka_unit_test(test_action_valid),         cmocka_unit_test(test_reply_start),
        cmocka_unit_test(test_shots_stats_reports),
        cmocka_unit_test(test_shots_end_to_end),
        cmocka_unit_test(test_shots_other_server),
        cmocka_unit_test(test_shots_failures),
    };
    return tu_result(cmocka_run_group_tests(tests, NULL, NULL));
}
