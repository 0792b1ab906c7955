/*
 * test_harmony_flow.c - gpt-oss's harmony format through the server's
 * request and answer path for all three APIs (chat completions, OpenAI's
 * Responses, Anthropic's Messages), whole and streamed, with the model's
 * text given by the test instead of sampled.
 *
 * Why not over HTTP with a model, as test_server_tools does: the reply
 * gpt-oss agents always write, an analysis message and then a call on
 * the commentary channel, cannot be drawn from a random-weight model. The
 * tool-call grammar lets the analysis be any text (it must: that is the
 * model's thinking), and a random model in there never writes its end, so
 * neither a 'grammar' (which under tools only shapes the text answer) nor
 * a logit_bias can force the pair. So the text a model would write is fed
 * here as engine events into the very functions the server runs on a
 * request (gen.c's order): the dialect's to_chat, srv_parse_gen,
 * srv_prompt_tokens with gpt-oss's real template (on stories260K's
 * vocabulary: only the prompt's text matters here), srv_reply_* and
 * srv_chunk_*, then the dialect's from_chat or its stream translation.
 *
 * Checked: (a) analysis then a call gives reasoning_content + tool_calls
 * (chat), a reasoning item + a function_call item (Responses), a thinking
 * block + a tool_use block (Messages), the streams carrying the same; (b)
 * reasoning_format "none" without tools keeps the markers (the engine is
 * told to write control tokens as text) and returns the harmony text as
 * content, unparsed; (c) reasoning_effort / reasoning.effort /
 * output_config.effort is the "Reasoning: LEVEL" line of the rendered
 * prompt (medium when absent, the template's default).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kettle.h"
#include "server/dialect.h"
#include "testutil.h"

static kt_model *g_model;
static char *g_template;

static int setup(void **state) {
    (void)state;
    kt_error err = {0};
    g_model = kt_model_load(tu_shared("models/stories260K.gguf"), &err);
    if (!g_model) fprintf(stderr, "stories260K: %s\n", err.msg);
    g_template = tu_read_file(tu_shared("templates/openai-gpt-oss-120b.jinja"), NULL);
    return g_model && g_template ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    kt_model_free(g_model);
    free(g_template);
    return 0;
}

#define TOOLS                                                                                                          \
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather of a city\","         \
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}}]"
/* the same tool in the Responses and Messages shapes */
#define TOOLS_RESPONSES                                                                                                \
    "[{\"type\":\"function\",\"name\":\"get_weather\",\"description\":\"Weather of a city\",\"parameters\":"        \
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}]"
#define TOOLS_MESSAGES                                                                                                 \
    "[{\"name\":\"get_weather\",\"description\":\"Weather of a city\",\"input_schema\":"                            \
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}]"

#define ANALYSIS "The user wants the weather in Paris, so I call get_weather."
/* what gpt-oss writes: an analysis message, then the call (its <|call|>
 * is the end-of-turn token, which ends the reply and writes nothing) */
static const char REPLY_CALL[] = "<|channel|>analysis<|message|>" ANALYSIS
                                 "<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
                                 "<|constrain|>json<|message|>{\"city\":\"Paris\"}";
static const char REPLY_FINAL[] = "<|channel|>analysis<|message|>Just greet.<|end|><|start|>assistant<|channel|>final"
                                  "<|message|>Hello there!";

/* One request through the server's path: the API's body (d: a dialect,
 * NULL: chat), the model's reply text fed in pieces of `step` bytes (a
 * token's worth), then an end of turn. *prompt gets the rendered prompt's
 * text; the answer is the whole one, or for a stream the SSE text (chat:
 * its chunks, a dialect: its events). */
typedef struct flow {
    char *prompt;
    json_t *answer; /* whole: the API's answer object */
    srv_buf sse;    /* stream: what the client reads */
    bool special_text;
} flow;

static void flow_free(flow *f) {
    free(f->prompt);
    json_decref(f->answer);
    srv_buf_free(&f->sse);
}

static void sse_chunk(srv_buf *out, const srv_dialect *d, srv_xlate *x, json_t *chunk) {
    assert_non_null(chunk);
    if (d) assert_true(d->stream_chunk(x, chunk, out));
    else assert_true(srv_buf_sse(out, chunk));
}

static flow run_flow(const srv_dialect *d, const char *body_text, const char *reply, size_t step) {
    flow f = {0};
    json_error_t je;
    json_t *body = json_loads(body_text, 0, &je);
    if (!body) fail_msg("bad test JSON: %s: %s", je.text, body_text);
    srv_error e = {0};
    json_t *chat = d ? d->to_chat(body, NULL, &e) : json_incref(body);
    if (!chat) fail_msg("to_chat refused (%d): %s", e.status, e.msg);
    srv_model_info mi = {.n_vocab = kt_model_describe(g_model)->n_vocab};
    srv_gen_req r;
    if (!srv_parse_gen(chat, SRV_CHAT, &mi, 1, &r, &e)) fail_msg("refused (%d): %s", e.status, e.msg);
    int32_t *ids = NULL;
    int n = srv_prompt_tokens(g_model, g_template, NULL, &r, NULL, &ids, &e);
    if (n < 0) fail_msg("prompt refused (%d): %s", e.status, e.msg);
    srv_buf p = {0};
    kt_detok *dt = kt_detok_new_ex(g_model, true);
    assert_non_null(dt);
    for (int i = 0; i < n; i++) {
        const char *s = kt_detok_push(dt, ids[i]);
        assert_true(srv_buf_append(&p, s, strlen(s)));
    }
    const char *s = kt_detok_flush(dt);
    assert_true(srv_buf_append(&p, s, strlen(s)) && srv_buf_append(&p, "", 1));
    kt_detok_free(dt);
    free(ids);
    f.prompt = p.data;
    f.special_text = srv_gen_special_text(&r);

    const char *id = d == &SRV_DIALECT_RESPONSES ? "resp_ab" : d ? "msg_ab" : "chatcmpl-ab";
    srv_reply rp;
    assert_true(srv_reply_init(&rp, &r, g_model, "m", id, 1700000000));
    srv_xlate *x = NULL;
    if (r.stream) {
        if (d) assert_non_null(x = d->stream_new(body, &rp, &r, n));
        sse_chunk(&f.sse, d, x, srv_chunk_role(&rp, 0, r.include_usage));
    }
    const size_t len = strlen(reply);
    int n_out = 0;
    assert_true(step >= 1 && step < 128);
    for (size_t at = 0;; at += step) {
        char piece[128]; /* step bytes and the terminator */
        const size_t k = at >= len ? 0 : len - at < step ? len - at : step;
        memcpy(piece, reply + at, k);
        piece[k] = 0;
        kt_event ev = {.choice = 0, .token = k ? 1 : -1, .text = piece, .text_len = k,
                       .finish = k ? KT_FINISH_NONE : KT_FINISH_STOP};
        n_out += k > 0;
        if (!r.stream) {
            assert_true(srv_reply_add(&rp, &ev));
        } else {
            assert_true(srv_reply_track(&rp, &ev));
            json_t *chunks;
            assert_true(srv_chunk_event(&rp, &ev, r.include_usage, &chunks));
            size_t i;
            json_t *c;
            json_array_foreach(chunks, i, c) sse_chunk(&f.sse, d, x, json_incref(c));
            json_decref(chunks);
            if (ev.finish != KT_FINISH_NONE) sse_chunk(&f.sse, d, x, srv_chunk_finish(&rp, 0, ev.finish, r.include_usage));
        }
        if (!k) break;
    }
    kt_request_usage u = {.prompt_tokens = n, .completion_tokens = n_out};
    if (!r.stream) {
        json_t *done = srv_reply_json(&rp, &u);
        assert_non_null(done);
        f.answer = d ? d->from_chat(body, done, &rp, &r) : json_incref(done);
        assert_non_null(f.answer);
        json_decref(done);
    } else if (d) {
        assert_true(d->stream_end(x, &u, &f.sse));
        d->stream_free(x);
    }
    assert_true(srv_buf_append(&f.sse, "", 1));
    srv_reply_free(&rp);
    srv_gen_req_free(&r);
    json_decref(chat);
    json_decref(body);
    return f;
}

/* The data objects of an SSE text (chat chunks or dialect events), in
 * order; "[DONE]" and comments skipped. */
static json_t *sse_data(const char *text) {
    json_t *all = json_array();
    for (const char *p = text; (p = strstr(p, "data: ")); p += 6) {
        const char *end = strstr(p, "\n\n");
        assert_non_null(end);
        json_t *j = json_loadb(p + 6, (size_t)(end - p - 6), 0, NULL);
        if (j) json_array_append_new(all, j);
    }
    return all;
}

static const char *jstr(json_t *o, const char *key) { return json_string_value(json_object_get(o, key)); }

/* The arguments text is the JSON object {"city": "Paris"}. */
static void expect_paris(const char *args) {
    json_t *a = args ? json_loads(args, 0, NULL) : NULL;
    if (!a || json_object_size(a) != 1 || !jstr(a, "city") || strcmp(jstr(a, "city"), "Paris"))
        fail_msg("arguments: %s", args ? args : "(none)");
    json_decref(a);
}

/* ---- (a) analysis, then a call ---- */

static void test_chat_analysis_then_call(void **state) {
    (void)state;
    static const size_t steps[] = {1, 3, 7, 64};
    for (int stream = 0; stream < 2; stream++)
        for (size_t k = 0; k < sizeof steps / sizeof steps[0]; k++) {
            char body[2048];
            snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}],"
                     "\"tools\":" TOOLS "%s}", stream ? ",\"stream\":true" : "");
            flow f = run_flow(NULL, body, REPLY_CALL, steps[k]);
            assert_true(f.special_text);
            if (!stream) {
                json_t *c = json_array_get(json_object_get(f.answer, "choices"), 0), *m = json_object_get(c, "message");
                if (!jstr(m, "reasoning_content") || strcmp(jstr(m, "reasoning_content"), ANALYSIS) ||
                    json_string_length(json_object_get(m, "content")) || strcmp(jstr(c, "finish_reason"), "tool_calls") ||
                    json_array_size(json_object_get(m, "tool_calls")) != 1)
                    fail_msg("step %zu: %s", steps[k], json_dumps(f.answer, 0));
                json_t *fn = json_object_get(json_array_get(json_object_get(m, "tool_calls"), 0), "function");
                assert_string_equal(jstr(fn, "name"), "get_weather");
                expect_paris(jstr(fn, "arguments"));
            } else {
                /* the reasoning and the call's arguments joined, the name and
                 * id once, one finish, no marker anywhere */
                json_t *chunks = sse_data(f.sse.data), *ch;
                char reasoning[512] = "", args[256] = "", name[64] = "";
                int n_ids = 0, n_finish = 0;
                size_t i;
                json_array_foreach(chunks, i, ch) {
                    json_t *c = json_array_get(json_object_get(ch, "choices"), 0), *dl = json_object_get(c, "delta");
                    if (jstr(dl, "reasoning_content")) strncat(reasoning, jstr(dl, "reasoning_content"), 200);
                    if (json_string_length(json_object_get(dl, "content"))) fail_msg("content: %s", json_dumps(ch, 0));
                    json_t *tc = json_array_get(json_object_get(dl, "tool_calls"), 0), *fn = json_object_get(tc, "function");
                    n_ids += jstr(tc, "id") != NULL;
                    if (jstr(fn, "name")) strncat(name, jstr(fn, "name"), 60);
                    if (jstr(fn, "arguments")) strncat(args, jstr(fn, "arguments"), 200);
                    if (jstr(c, "finish_reason")) n_finish++, assert_string_equal(jstr(c, "finish_reason"), "tool_calls");
                }
                assert_string_equal(reasoning, ANALYSIS);
                assert_string_equal(name, "get_weather");
                assert_int_equal(n_ids, 1);
                assert_int_equal(n_finish, 1);
                expect_paris(args);
                assert_null(strstr(f.sse.data, "<|"));
                json_decref(chunks);
            }
            flow_free(&f);
        }
}

static void test_responses_analysis_then_call(void **state) {
    (void)state;
    json_t *whole_output = NULL;
    for (int stream = 0; stream < 2; stream++) {
        char body[2048];
        snprintf(body, sizeof body, "{\"model\":\"m\",\"input\":\"Weather in Paris?\",\"tools\":" TOOLS_RESPONSES "%s}",
                 stream ? ",\"stream\":true" : "");
        flow f = run_flow(&SRV_DIALECT_RESPONSES, body, REPLY_CALL, 5);
        json_t *out;
        if (!stream) {
            out = json_incref(json_object_get(f.answer, "output"));
            whole_output = json_incref(out);
        } else {
            json_t *events = sse_data(f.sse.data), *last = json_array_get(events, json_array_size(events) - 1);
            assert_string_equal(jstr(last, "type"), "response.completed");
            out = json_incref(json_object_get(json_object_get(last, "response"), "output"));
            /* the stream's final output is the whole answer's */
            if (!json_equal(out, whole_output))
                fail_msg("stream output %s\nwhole %s", json_dumps(out, 0), json_dumps(whole_output, 0));
            json_decref(events);
        }
        json_t *rs = json_array_get(out, 0), *fc = json_array_get(out, 1);
        if (json_array_size(out) != 2 || strcmp(jstr(rs, "type"), "reasoning") || strcmp(jstr(fc, "type"), "function_call"))
            fail_msg("output: %s", json_dumps(out, 0));
        assert_string_equal(jstr(json_array_get(json_object_get(rs, "content"), 0), "text"), ANALYSIS);
        assert_string_equal(jstr(fc, "name"), "get_weather");
        expect_paris(jstr(fc, "arguments"));
        json_decref(out);
        flow_free(&f);
    }
    json_decref(whole_output);
}

static void test_messages_analysis_then_call(void **state) {
    (void)state;
    for (int stream = 0; stream < 2; stream++) {
        char body[2048];
        snprintf(body, sizeof body, "{\"model\":\"m\",\"max_tokens\":64,\"messages\":[{\"role\":\"user\",\"content\":"
                 "\"Weather in Paris?\"}],\"tools\":" TOOLS_MESSAGES "%s}", stream ? ",\"stream\":true" : "");
        flow f = run_flow(&SRV_DIALECT_MESSAGES, body, REPLY_CALL, 4);
        if (!stream) {
            json_t *content = json_object_get(f.answer, "content"), *th = json_array_get(content, 0),
                   *tu = json_array_get(content, 1);
            if (json_array_size(content) != 2 || strcmp(jstr(th, "type"), "thinking") || strcmp(jstr(tu, "type"), "tool_use") ||
                strcmp(jstr(f.answer, "stop_reason"), "tool_use"))
                fail_msg("message: %s", json_dumps(f.answer, 0));
            assert_string_equal(jstr(th, "thinking"), ANALYSIS);
            assert_string_equal(jstr(tu, "name"), "get_weather");
            char *input = json_dumps(json_object_get(tu, "input"), 0);
            expect_paris(input);
            free(input);
        } else {
            /* block 0 thinking (its deltas the analysis), block 1 tool_use
             * (its partial JSON the arguments), stop_reason tool_use */
            json_t *events = sse_data(f.sse.data), *ev;
            char kinds[64] = "", thinking[512] = "", input[256] = "", stop[32] = "";
            size_t i;
            json_array_foreach(events, i, ev) {
                const char *t = jstr(ev, "type");
                json_t *dl = json_object_get(ev, "delta");
                if (!strcmp(t, "content_block_start")) {
                    json_t *b = json_object_get(ev, "content_block");
                    strncat(kinds, jstr(b, "type"), 20), strcat(kinds, " ");
                    if (!strcmp(jstr(b, "type"), "tool_use")) assert_string_equal(jstr(b, "name"), "get_weather");
                }
                if (!strcmp(t, "content_block_delta") && jstr(dl, "thinking")) strncat(thinking, jstr(dl, "thinking"), 200);
                if (!strcmp(t, "content_block_delta") && jstr(dl, "partial_json")) strncat(input, jstr(dl, "partial_json"), 200);
                if (!strcmp(t, "message_delta")) snprintf(stop, sizeof stop, "%s", jstr(dl, "stop_reason"));
            }
            assert_string_equal(kinds, "thinking tool_use ");
            assert_string_equal(thinking, ANALYSIS);
            assert_string_equal(stop, "tool_use");
            expect_paris(input);
            json_decref(events);
        }
        flow_free(&f);
    }
}

/* ---- (b) reasoning_format "none" without tools ---- */

/* The harmony text as content, markers and all, whole and streamed; the
 * engine is told to write the control tokens (in o200k the markers are
 * control tokens: without that they would be dropped from the text). With
 * the default the same text is split. */
static void test_reasoning_format_none(void **state) {
    (void)state;
    for (int stream = 0; stream < 2; stream++) {
        char body[1024];
        snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"reasoning_format\":\"none\"%s}",
                 stream ? ",\"stream\":true" : "");
        flow f = run_flow(NULL, body, REPLY_FINAL, 6);
        assert_true(f.special_text);
        char content[512] = "";
        if (!stream) {
            json_t *m = json_object_get(json_array_get(json_object_get(f.answer, "choices"), 0), "message");
            assert_null(json_object_get(m, "reasoning_content"));
            snprintf(content, sizeof content, "%s", jstr(m, "content"));
        } else {
            json_t *chunks = sse_data(f.sse.data), *ch;
            size_t i;
            json_array_foreach(chunks, i, ch) {
                json_t *dl = json_object_get(json_array_get(json_object_get(ch, "choices"), 0), "delta");
                if (json_object_get(dl, "reasoning_content")) fail_msg("reasoning: %s", json_dumps(ch, 0));
                if (jstr(dl, "content")) strncat(content, jstr(dl, "content"), 200);
            }
            json_decref(chunks);
        }
        assert_string_equal(content, REPLY_FINAL);
        flow_free(&f);
    }
    flow f = run_flow(NULL, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", REPLY_FINAL, 6);
    json_t *m = json_object_get(json_array_get(json_object_get(f.answer, "choices"), 0), "message");
    assert_string_equal(jstr(m, "reasoning_content"), "Just greet.");
    assert_string_equal(jstr(m, "content"), "Hello there!");
    flow_free(&f);
}

/* ---- (c) reasoning effort in the rendered prompt ---- */

static void expect_effort(const srv_dialect *d, const char *body, const char *level) {
    flow f = run_flow(d, body, REPLY_FINAL, 64);
    char want[64];
    snprintf(want, sizeof want, "Reasoning: %s\n", level);
    if (!strstr(f.prompt, want)) fail_msg("no '%s' in the prompt of %s:\n%s", level, body, f.prompt);
    static const char *const levels[] = {"low", "medium", "high"};
    for (int i = 0; i < 3; i++) /* and no other level */
        if (strcmp(levels[i], level)) {
            snprintf(want, sizeof want, "Reasoning: %s", levels[i]);
            if (strstr(f.prompt, want)) fail_msg("'%s' in the prompt of %s", want, body);
        }
    flow_free(&f);
}

static void test_effort_rendered(void **state) {
    (void)state;
    static const char *const levels[] = {"low", "medium", "high"};
    for (int i = 0; i < 3; i++) {
        char body[1024];
        snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"reasoning_effort\":\"%s\"}",
                 levels[i]);
        expect_effort(NULL, body, levels[i]);
        snprintf(body, sizeof body, "{\"model\":\"m\",\"input\":\"Hi\",\"reasoning\":{\"effort\":\"%s\"}}", levels[i]);
        expect_effort(&SRV_DIALECT_RESPONSES, body, levels[i]);
        snprintf(body, sizeof body, "{\"model\":\"m\",\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
                 "\"output_config\":{\"effort\":\"%s\"}}", levels[i]);
        expect_effort(&SRV_DIALECT_MESSAGES, body, levels[i]);
    }
    /* none given: the template's default */
    expect_effort(NULL, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", "medium");
    expect_effort(&SRV_DIALECT_RESPONSES, "{\"model\":\"m\",\"input\":\"Hi\"}", "medium");
    expect_effort(&SRV_DIALECT_MESSAGES, "{\"model\":\"m\",\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}",
                  "medium");
    /* chat_template_kwargs win over reasoning_effort */
    expect_effort(NULL, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"reasoning_effort\":\"low\","
                  "\"chat_template_kwargs\":{\"reasoning_effort\":\"high\"}}", "high");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_analysis_then_call), cmocka_unit_test(test_responses_analysis_then_call),
        cmocka_unit_test(test_messages_analysis_then_call), cmocka_unit_test(test_reasoning_format_none),
        cmocka_unit_test(test_effort_rendered),
    };
    return tu_result(cmocka_run_group_tests(tests, setup, teardown));
}
