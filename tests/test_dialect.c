/*
 * test_dialect.c - the Responses and Messages dialects (src/server/
 * dialect.h) without a server: request bodies rewritten into chat bodies,
 * chat completions into each API's answer, and chat chunk streams into its
 * events. The end-to-end checks with the real SDKs are in
 * tests/js/dialects_e2e.mjs; these cover what a random-weight model never
 * produces there (thinking, text and calls in one reply, a cut call, a
 * stop string among several) and run under the sanitizers.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/dialect.h"
#include "testutil.h"

static json_t *parse(const char *s) {
    json_error_t je;
    json_t *j = json_loads(s, 0, &je);
    if (!j) fail_msg("bad test JSON: %s: %s", je.text, s);
    return j;
}

/* The chat body the dialect makes of `body`, compared with `want`. */
static void expect_chat(const srv_dialect *d, const char *body, const char *want) {
    json_t *b = parse(body), *w = parse(want);
    srv_error e = {0};
    json_t *chat = d->to_chat(b, NULL, &e);
    if (!chat) fail_msg("refused (%d): %s", e.status, e.msg);
    if (!json_equal(chat, w)) {
        char *got = json_dumps(chat, JSON_COMPACT | JSON_SORT_KEYS);
        fail_msg("chat body\n got  %s\n want %s", got, want);
    }
    json_decref(chat), json_decref(b), json_decref(w);
}

/* The dialect refuses `body` with `status` and a message holding `part`. */
static void expect_refused(const srv_dialect *d, const char *body, int status, const char *part) {
    json_t *b = parse(body);
    srv_error e = {0};
    json_t *chat = d->to_chat(b, NULL, &e);
    if (chat) fail_msg("accepted: %s", body);
    assert_int_equal(e.status, status);
    if (!strstr(e.msg, part)) fail_msg("message '%s' lacks '%s'", e.msg, part);
    json_decref(b);
}

/* ---- Responses: requests ---- */

static void test_responses_request(void **state) {
    (void)state;
    const srv_dialect *d = &SRV_DIALECT_RESPONSES;
    expect_chat(d, "{\"model\":\"m\",\"input\":\"hi\",\"instructions\":\"be brief\",\"max_output_tokens\":9,\"temperature\":0,"
                   "\"store\":true,\"include\":[],\"truncation\":\"disabled\",\"metadata\":{\"a\":\"b\"}}",
                "{\"model\":\"m\",\"max_tokens\":9,\"temperature\":0,\"messages\":[{\"role\":\"system\",\"content\":\"be "
                "brief\"},{\"role\":\"user\",\"content\":\"hi\"}]}");
    /* a conversation of items: developer -> system, parts joined, a
     * reasoning item on the next assistant turn, two calls in one
     * assistant message, their outputs as tool messages with the name */
    expect_chat(d,
                "{\"input\":[{\"role\":\"developer\",\"content\":\"rules\"},"
                "{\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"a\"},"
                "{\"type\":\"input_text\",\"text\":\"b\"}]},"
                "{\"type\":\"reasoning\",\"id\":\"rs_1\",\"summary\":[],\"content\":[{\"type\":\"reasoning_text\","
                "\"text\":\"think\"}]},"
                "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":\"{}\"},"
                "{\"type\":\"function_call\",\"call_id\":\"c2\",\"name\":\"g\",\"arguments\":\"{\\\"x\\\":1}\"},"
                "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"r1\"},"
                "{\"type\":\"function_call_output\",\"call_id\":\"c2\",\"output\":[{\"type\":\"input_text\",\"text\":\"r2\"}]},"
                "{\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"done\"}]}]}",
                "{\"messages\":[{\"role\":\"system\",\"content\":\"rules\"},{\"role\":\"user\",\"content\":\"a\\n\\nb\"},"
                "{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"think\",\"tool_calls\":["
                "{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}},"
                "{\"id\":\"c2\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"{\\\"x\\\":1}\"}}]},"
                "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"r1\",\"name\":\"f\"},"
                "{\"role\":\"tool\",\"tool_call_id\":\"c2\",\"content\":\"r2\",\"name\":\"g\"},"
                "{\"role\":\"assistant\",\"content\":\"done\"}]}");
    /* tools, tool_choice, text.format */
    expect_chat(d,
                "{\"input\":\"q\",\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"description\":\"d\",\"parameters\":"
                "{\"type\":\"object\"},\"strict\":true}],\"tool_choice\":{\"type\":\"function\",\"name\":\"f\"},"
                "\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"s\",\"schema\":{\"type\":\"object\"},"
                "\"strict\":true}},\"parallel_tool_calls\":false}",
                "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"parallel_tool_calls\":false,\"tools\":["
                "{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"d\",\"parameters\":{\"type\":"
                "\"object\"},\"strict\":true}}],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}},"
                "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"s\",\"schema\":{\"type\":"
                "\"object\"},\"strict\":true}}}");
    expect_chat(d, "{\"input\":\"q\",\"text\":{\"format\":{\"type\":\"json_object\"}}}",
                "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"response_format\":{\"type\":\"json_object\"}}");
}

static void test_responses_refusals(void **state) {
    (void)state;
    const srv_dialect *d = &SRV_DIALECT_RESPONSES;
    expect_refused(d, "{}", 400, "'input' is required");
    expect_refused(d, "{\"input\":[]}", 400, "no messages");
    expect_refused(d, "{\"input\":\"q\",\"previous_response_id\":\"r\"}", 400, "whole conversation");
    expect_refused(d, "{\"input\":\"q\",\"conversation\":\"c\"}", 400, "statelessly");
    expect_refused(d, "{\"input\":\"q\",\"background\":true}", 400, "background");
    expect_refused(d, "{\"input\":\"q\",\"frobnicate\":1}", 400, "'frobnicate' is not a parameter");
    expect_refused(d, "{\"input\":\"q\",\"tool_choice\":{\"type\":\"frobnicate\"}}", 400, "'tool_choice' must be");
    expect_refused(d, "{\"input\":\"q\",\"text\":{\"format\":{\"type\":\"yaml\"}}}", 400, "text.format.type");
    expect_refused(d, "{\"input\":\"q\",\"max_output_tokens\":\"9\"}", 400, "'max_output_tokens' must be an integer");
    expect_refused(d, "{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\",\"file_id\":\"f\"}]}]}", 400,
                   "'file_id' cannot name one");
    /* an image goes on as a chat image_url part (the chat parser takes it, or refuses it without a tower) */
    expect_chat(d, "{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"q\"},"
                   "{\"type\":\"input_image\",\"image_url\":\"data:image/png;base64,AA==\"}]}]}",
                "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"q\"},{\"type\":\"image_url\","
                "\"image_url\":{\"url\":\"data:image/png;base64,AA==\"}}]}]}");
    expect_refused(d, "{\"input\":[{\"type\":\"item_reference\",\"id\":\"x\"}]}", 400, "item_reference");
    expect_refused(d, "{\"input\":[{\"type\":\"function_call\",\"name\":\"f\"}]}", 400, "call_id");
    expect_refused(d, "{\"input\":[{\"role\":\"tool\",\"content\":\"x\"}]}", 400, "role");
    expect_refused(d, "{\"input\":[{\"type\":\"computer_call\"}]}", 400, "'computer_call'");
}

/* ---- answers ---- */

static srv_reply reply_of(const char *id, int stop_string) {
    srv_reply rp = {.kind = SRV_CHAT, .model_name = "m", .created = 1700000000, .n_choices = 1};
    snprintf(rp.id, sizeof rp.id, "%s", id);
    rp.choices[0].stop_string = stop_string;
    return rp;
}

static const char *const DONE_ALL =
    "{\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"hello\",\"reasoning_content\":"
    "\"hmm\",\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":"
    "\"{\\\"a\\\":1}\"}}]},\"finish_reason\":\"tool_calls\"}],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":5,"
    "\"total_tokens\":15,\"prompt_tokens_details\":{\"cached_tokens\":4}}}";

static void expect_json(json_t *got, const char *path_desc, const char *want) {
    json_t *w = parse(want);
    if (!json_equal(got, w)) {
        char *g = json_dumps(got, JSON_COMPACT | JSON_SORT_KEYS);
        fail_msg("%s\n got  %s\n want %s", path_desc, g, want);
    }
    json_decref(w);
}

static void test_responses_answer(void **state) {
    (void)state;
    srv_reply rp = reply_of("resp_ab", 0);
    srv_gen_req r = {0};
    json_t *body = parse("{\"input\":\"q\",\"max_output_tokens\":9}"), *done = parse(DONE_ALL);
    json_t *a = SRV_DIALECT_RESPONSES.from_chat(body, done, &rp, &r);
    assert_non_null(a);
    assert_string_equal(json_string_value(json_object_get(a, "status")), "completed");
    assert_int_equal(json_integer_value(json_object_get(a, "max_output_tokens")), 9);
    expect_json(json_object_get(a, "output"), "output",
                "[{\"id\":\"rs_ab_0\",\"type\":\"reasoning\",\"summary\":[],\"content\":[{\"type\":\"reasoning_text\","
                "\"text\":\"hmm\"}]},{\"id\":\"msg_ab_1\",\"type\":\"message\",\"status\":\"completed\",\"role\":"
                "\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"hello\",\"annotations\":[],\"logprobs\":"
                "[]}]},{\"id\":\"fc_ab_2\",\"type\":\"function_call\",\"status\":\"completed\",\"call_id\":\"call_1\","
                "\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}]");
    expect_json(json_object_get(a, "usage"), "usage",
                "{\"input_tokens\":10,\"input_tokens_details\":{\"cached_tokens\":4},\"output_tokens\":5,\"total_tokens\":15}");
    json_decref(a), json_decref(done);
    /* cut by its length: incomplete, the last item too */
    done = parse("{\"choices\":[{\"message\":{\"role\":\"assistant\",\"content\":\"hel\"},\"finish_reason\":\"length\"}],"
                 "\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":3}}");
    a = SRV_DIALECT_RESPONSES.from_chat(body, done, &rp, &r);
    assert_string_equal(json_string_value(json_object_get(a, "status")), "incomplete");
    expect_json(json_object_get(a, "incomplete_details"), "incomplete_details", "{\"reason\":\"max_output_tokens\"}");
    json_t *item = json_array_get(json_object_get(a, "output"), 0);
    assert_string_equal(json_string_value(json_object_get(item, "status")), "incomplete");
    json_decref(a), json_decref(done), json_decref(body);
}

static void test_messages_answer(void **state) {
    (void)state;
    srv_reply rp = reply_of("msg_ab", 0);
    srv_gen_req r = {0};
    json_t *body = parse("{}"), *done = parse(DONE_ALL);
    json_t *a = SRV_DIALECT_MESSAGES.from_chat(body, done, &rp, &r);
    expect_json(a, "message",
                "{\"id\":\"msg_ab\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"m\",\"content\":["
                "{\"type\":\"thinking\",\"thinking\":\"hmm\",\"signature\":\"\"},{\"type\":\"text\",\"text\":\"hello\"},"
                "{\"type\":\"tool_use\",\"id\":\"call_1\",\"name\":\"f\",\"input\":{\"a\":1}}],\"stop_reason\":"
                "\"tool_use\",\"stop_sequence\":null,\"usage\":{\"input_tokens\":6,\"cache_creation_input_tokens\":0,"
                "\"cache_read_input_tokens\":4,\"output_tokens\":5}}");
    json_decref(a), json_decref(done);
    /* the second of two stop strings ended it */
    const char *stops[] = {"never", "END"};
    r.stop[0] = stops[0], r.stop[1] = stops[1], r.n_stop = 2;
    rp = reply_of("msg_ab", 2);
    done = parse("{\"choices\":[{\"message\":{\"role\":\"assistant\",\"content\":\"x\"},\"finish_reason\":\"stop\"}],"
                 "\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}");
    a = SRV_DIALECT_MESSAGES.from_chat(body, done, &rp, &r);
    assert_string_equal(json_string_value(json_object_get(a, "stop_reason")), "stop_sequence");
    assert_string_equal(json_string_value(json_object_get(a, "stop_sequence")), "END");
    json_decref(a), json_decref(done);
    /* an end of turn; a call cut by max_tokens is left out, not half-sent */
    rp = reply_of("msg_ab", 0);
    done = parse("{\"choices\":[{\"message\":{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c\","
                 "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":\"}}]},"
                 "\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":9}}");
    a = SRV_DIALECT_MESSAGES.from_chat(body, done, &rp, &r);
    assert_string_equal(json_string_value(json_object_get(a, "stop_reason")), "max_tokens");
    assert_int_equal(json_array_size(json_object_get(a, "content")), 0);
    json_decref(a), json_decref(done), json_decref(body);
}

/* ---- Messages: requests ---- */

static void test_messages_request(void **state) {
    (void)state;
    const srv_dialect *d = &SRV_DIALECT_MESSAGES;
    expect_chat(d,
                "{\"model\":\"m\",\"max_tokens\":8,\"system\":[{\"type\":\"text\",\"text\":\"sys\",\"cache_control\":"
                "{\"type\":\"ephemeral\"}}],\"stop_sequences\":[\"END\"],\"temperature\":0.5,\"top_k\":5,"
                "\"metadata\":{\"user_id\":\"u\"},\"thinking\":{\"type\":\"disabled\"},"
                "\"tools\":[{\"name\":\"f\",\"description\":\"d\",\"input_schema\":{\"type\":\"object\"}}],"
                "\"tool_choice\":{\"type\":\"any\",\"disable_parallel_tool_use\":true},"
                "\"messages\":[{\"role\":\"user\",\"content\":\"q\"},"
                "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"t\",\"signature\":\"s\"},"
                "{\"type\":\"text\",\"text\":\"calling\"},{\"type\":\"tool_use\",\"id\":\"tu1\",\"name\":\"f\",\"input\":"
                "{\"a\":1}}]},"
                "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"tu1\",\"content\":[{\"type\":"
                "\"text\",\"text\":\"r\"}]},{\"type\":\"tool_result\",\"tool_use_id\":\"tu2\",\"content\":\"bad\","
                "\"is_error\":true},{\"type\":\"text\",\"text\":\"and?\"}]}]}",
                "{\"model\":\"m\",\"max_tokens\":8,\"stop\":[\"END\"],\"temperature\":0.5,\"top_k\":5,"
                "\"chat_template_kwargs\":{\"enable_thinking\":false},\"tools\":[{\"type\":\"function\",\"function\":{"
                "\"name\":\"f\",\"description\":\"d\",\"parameters\":{\"type\":\"object\"}}}],\"tool_choice\":\"required\","
                "\"parallel_tool_calls\":false,\"messages\":[{\"role\":\"system\",\"content\":\"sys\"},{\"role\":\"user\","
                "\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"calling\",\"reasoning_content\":\"t\","
                "\"tool_calls\":[{\"id\":\"tu1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":"
                "\"{\\\"a\\\":1}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"tu1\",\"content\":\"r\"},{\"role\":\"tool\","
                "\"tool_call_id\":\"tu2\",\"content\":\"Error: bad\"},{\"role\":\"user\",\"content\":\"and?\"}]}");
    expect_chat(d, "{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"tool_choice\":{\"type\":\"tool\",\"name\":\"f\"}}",
                "{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"tool_choice\":{\"type\":"
                "\"function\",\"function\":{\"name\":\"f\"}},\"chat_template_kwargs\":{\"enable_thinking\":false}}");
    /* count_tokens: the same body without max_tokens (and no stream) */
    json_t *b = parse("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}");
    srv_error e = {0};
    json_t *chat = srv_messages_count_body(b, NULL, &e);
    expect_json(chat, "count body", "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],"
                "\"chat_template_kwargs\":{\"enable_thinking\":false}}");
    json_decref(chat), json_decref(b);
}

static void test_messages_refusals(void **state) {
    (void)state;
    const srv_dialect *d = &SRV_DIALECT_MESSAGES;
    expect_refused(d, "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}", 400, "'max_tokens' is required");
    expect_refused(d, "{\"max_tokens\":0,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}", 400, "at least 1");
    expect_refused(d, "{\"max_tokens\":1,\"messages\":[]}", 400, "non-empty");
    expect_refused(d, "{\"max_tokens\":1,\"messages\":[{\"role\":\"wizard\",\"content\":\"q\"}]}", 400, "role");
    expect_refused(d,
                   "{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\",\"source\":{}}]}]}",
                   400, "(image) needs a source");
    expect_refused(d, "{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"tools\":[{\"type\":"
                      "\"bash_20250124\",\"name\":\"bash\"}],\"tool_choice\":{\"type\":\"tool\",\"name\":\"bash\"}}",
                   400, "Anthropic's own tools");
    expect_refused(d, "{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"tools\":[{\"type\":"
                      "\"web_search_20250305\",\"name\":\"web_search\"}],\"tool_choice\":{\"type\":\"any\"}}",
                   400, "none of the tools");
    expect_refused(d, "{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"tools\":[{\"type\":"
                      "\"quantum_9\",\"name\":\"q\"}]}",
                   400, "does not know");
    expect_refused(d, "{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"tool_choice\":{\"type\":\"x\"}}",
                   400, "'tool_choice' must be");
    expect_refused(d, "{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"thinking\":{\"type\":\"on\"}}",
                   400, "thinking.type");
    expect_refused(d, "{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"mcp_servers\":[{}]}", 400,
                   "'mcp_servers' asks for Anthropic's hosted MCP connector");
    expect_refused(d, "{\"max_tokens\":1,\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":"
                      "\"x\",\"name\":\"f\"}]}]}",
                   400, "tool_use {id, name, input}");
    /* the error objects */
    srv_error e;
    srv_fail(&e, 401, "authentication_error", NULL, NULL, "no key");
    char *s = SRV_DIALECT_MESSAGES.error_json(&e);
    json_t *j = parse(s);
    expect_json(j, "anthropic error", "{\"type\":\"error\",\"error\":{\"type\":\"authentication_error\",\"message\":\"no key\"}}");
    json_decref(j), free(s);
    srv_fail(&e, 503, "server_error", NULL, NULL, "busy");
    s = SRV_DIALECT_MESSAGES.error_json(&e);
    assert_non_null(strstr(s, "overloaded_error"));
    free(s);
}

/* The chat body of `body` as compact sorted text, and the notes made. */
static char *chat_of(const srv_dialect *d, const char *body, srv_notes *notes) {
    json_t *b = parse(body);
    srv_error e = {0};
    json_t *chat = d->to_chat(b, notes, &e);
    if (!chat) fail_msg("refused (%d): %s", e.status, e.msg);
    char *s = json_dumps(chat, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(chat), json_decref(b);
    return s;
}

/* What Claude Code sends (2.1.x): fields of Anthropic's current API that
 * kettle once refused, each accepted with its meaning. */
static void test_messages_claude_code_fields(void **state) {
    (void)state;
    const srv_dialect *d = &SRV_DIALECT_MESSAGES;
    /* a system message inside messages stays in place; adaptive thinking
     * is thinking on; output_config.effort is the chat path's
     * reasoning_effort; context_management changes nothing here */
    expect_chat(d,
                "{\"max_tokens\":32000,\"thinking\":{\"type\":\"adaptive\"},\"output_config\":{\"effort\":\"high\"},"
                "\"context_management\":{\"edits\":[{\"type\":\"clear_thinking_20251015\",\"keep\":\"all\"}]},"
                "\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"a\"},"
                "{\"role\":\"system\",\"content\":[{\"type\":\"text\",\"text\":\"note\"}]},{\"role\":\"user\",\"content\":\"r\"}]}",
                "{\"max_tokens\":32000,\"chat_template_kwargs\":{\"enable_thinking\":true},\"reasoning_effort\":\"high\","
                "\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"a\"},"
                "{\"role\":\"system\",\"content\":\"note\"},{\"role\":\"user\",\"content\":\"r\"}]}");
    /* output_config.format and output_format: a JSON Schema answer */
    expect_chat(d,
                "{\"max_tokens\":5,\"thinking\":{\"type\":\"disabled\"},\"output_config\":{\"format\":{\"type\":"
                "\"json_schema\",\"schema\":{\"type\":\"object\"}}},\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}",
                "{\"max_tokens\":5,\"chat_template_kwargs\":{\"enable_thinking\":false},\"response_format\":{\"type\":"
                "\"json_schema\",\"json_schema\":{\"name\":\"output\",\"schema\":{\"type\":\"object\"},\"strict\":true}},"
                "\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}");
    /* the billing header block is not the model's: left out; the other
     * system blocks and a user message's text blocks are paragraphs */
    expect_chat(d,
                "{\"max_tokens\":5,\"system\":[{\"type\":\"text\",\"text\":\"x-anthropic-billing-header: cc_version="
                "2.1.197.abc; cc_entrypoint=sdk-cli; cch=00000;\"},{\"type\":\"text\",\"text\":\"You are an agent.\"},"
                "{\"type\":\"text\",\"text\":\"Be brief.\"}],\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
                "\"text\",\"text\":\"Hello\"},{\"type\":\"text\",\"text\":\"World\"}]}]}",
                "{\"max_tokens\":5,\"chat_template_kwargs\":{\"enable_thinking\":false},\"messages\":[{\"role\":\"system\","
                "\"content\":\"You are an agent.\\n\\nBe brief.\"},{\"role\":\"user\",\"content\":\"Hello\\n\\nWorld\"}]}");
    /* a user message's blocks keep their order; an empty final assistant
     * turn is no prefill (dropped), as Anthropic reads it */
    expect_chat(d,
                "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"first\"},"
                "{\"type\":\"tool_result\",\"tool_use_id\":\"t1\",\"content\":\"r\"},{\"type\":\"text\",\"text\":\"then\"}]},"
                "{\"role\":\"assistant\",\"content\":[]}]}",
                "{\"max_tokens\":5,\"chat_template_kwargs\":{\"enable_thinking\":false},\"messages\":[{\"role\":\"user\","
                "\"content\":\"first\"},{\"role\":\"tool\",\"tool_call_id\":\"t1\",\"content\":\"r\"},{\"role\":\"user\","
                "\"content\":\"then\"}]}");
    /* Anthropic's own tools under auto: left out, and said so */
    srv_notes notes = {0};
    char *got = chat_of(d,
                        "{\"max_tokens\":5,\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":2048},\"tools\":[{\"type\":"
                        "\"web_search_20250305\",\"name\":\"web_search\"},{\"name\":\"Read\",\"input_schema\":{\"type\":"
                        "\"object\"}}],\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}",
                        &notes);
    assert_non_null(strstr(got, "\"name\":\"Read\""));
    assert_null(strstr(got, "web_search"));
    assert_non_null(strstr(notes.text, "tools[0] (web_search_20250305 'web_search') left out"));
    assert_non_null(strstr(notes.text, "budget_tokens 2048 not enforced"));
    free(got);
    /* a tool_result the client got wrong is its fault: 400, never a 500
     * (SDKs retry 500s; the fallback would get it) */
    expect_refused(d, "{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\","
                      "\"tool_use_id\":\"t\",\"content\":5}]}]}",
                   400, "content");
    expect_refused(d, "{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\","
                      "\"tool_use_id\":\"t\",\"content\":[{\"type\":\"image\",\"source\":{}}]}]}]}",
                   400, "(image) needs a source");
    expect_refused(d, "{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\","
                      "\"content\":\"r\"}]}]}",
                   400, "tool_use_id");
    /* an empty message anywhere else is refused in Anthropic's words */
    expect_refused(d, "{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[]},{\"role\":\"user\",\"content\":\"q\"}]}",
                   400, "messages.0: all messages must have non-empty content");
    expect_refused(d, "{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"output_config\":{\"speed\":1}}",
                   400, "'output_config.speed'");
    expect_refused(d, "{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"thinking\":{\"type\":"
                      "\"enabled\",\"display\":\"x\"}}",
                   400, "'thinking.display'");
    /* a name the API does not have is refused whatever its value; null on
     * one it has is no setting (both dialects) */
    expect_refused(d, "{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"frobnicate\":null}", 400,
                   "'frobnicate'");
    free(chat_of(d, "{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"mcp_servers\":null,"
                    "\"top_k\":null}", NULL));
    expect_refused(&SRV_DIALECT_RESPONSES, "{\"input\":\"q\",\"frobnicate\":false}", 400, "'frobnicate'");
    free(chat_of(&SRV_DIALECT_RESPONSES, "{\"input\":\"q\",\"previous_response_id\":null,\"background\":false}", NULL));
}

/* ---- streams ---- */

/* The chunks of a reply that thinks, writes and calls one tool. */
static const char *const CHUNKS[] = {
    "{\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}",
    "{\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"hm\"}}]}",
    "{\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"m\"}}]}",
    "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hel\"}}]}",
    "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"}}]}",
    "{\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\","
    "\"function\":{\"name\":\"f\",\"arguments\":\"\"}}]}}]}",
    "{\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"a\\\"\"}}]}}]}",
    "{\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\":1}\"}}]}}]}",
    "{\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}",
};

/* The stream's events: their names in order and their data objects. */
static json_t *stream_events(const srv_dialect *d, const srv_reply *rp, const srv_gen_req *r, char *names, size_t cap) {
    json_t *body = parse("{\"input\":\"q\"}");
    srv_xlate *x = d->stream_new(body, rp, r, 10);
    assert_non_null(x);
    srv_buf out = {0};
    for (size_t i = 0; i < sizeof CHUNKS / sizeof CHUNKS[0]; i++) assert_true(d->stream_chunk(x, parse(CHUNKS[i]), &out));
    kt_request_usage u = {.prompt_tokens = 10, .cached_tokens = 4, .completion_tokens = 5};
    assert_true(d->stream_end(x, &u, &out));
    assert_true(srv_buf_append(&out, "", 1));
    d->stream_free(x);
    json_decref(body);
    json_t *events = json_array();
    names[0] = 0;
    for (char *p = out.data; (p = strstr(p, "event: "));) {
        char *nl = strchr(p, '\n'), *data = strstr(p, "\ndata: ");
        assert_non_null(nl);
        assert_true(data == nl);
        char *end = strstr(data, "\n\n");
        assert_non_null(end);
        snprintf(names + strlen(names), cap - strlen(names), "%.*s ", (int)(nl - p - 7), p + 7);
        json_t *ev = json_loadb(data + 7, (size_t)(end - data - 7), 0, NULL);
        assert_non_null(ev);
        /* each event's data says its own type */
        if (strncmp(json_string_value(json_object_get(ev, "type")), p + 7, (size_t)(nl - p - 7))) fail_msg("type of %.40s", p);
        json_array_append_new(events, ev);
        p = end;
    }
    srv_buf_free(&out);
    return events;
}

static void test_responses_stream(void **state) {
    (void)state;
    srv_reply rp = reply_of("resp_ab", 0);
    srv_gen_req r = {0};
    char names[2048];
    json_t *ev = stream_events(&SRV_DIALECT_RESPONSES, &rp, &r, names, sizeof names);
    assert_string_equal(names,
                        "response.created response.in_progress "
                        "response.output_item.added response.reasoning_text.delta response.reasoning_text.delta "
                        "response.reasoning_text.done response.output_item.done "
                        "response.output_item.added response.content_part.added response.output_text.delta "
                        "response.output_text.delta response.output_text.done response.content_part.done "
                        "response.output_item.done "
                        "response.output_item.added response.function_call_arguments.delta "
                        "response.function_call_arguments.delta response.function_call_arguments.done "
                        "response.output_item.done response.completed ");
    for (size_t i = 0; i < json_array_size(ev); i++)
        assert_int_equal(json_integer_value(json_object_get(json_array_get(ev, i), "sequence_number")), (json_int_t)i);
    /* the final response's output is what the whole answer has */
    json_t *last = json_object_get(json_array_get(ev, json_array_size(ev) - 1), "response");
    json_t *body = parse("{\"input\":\"q\"}"), *done = parse(DONE_ALL);
    json_t *whole = SRV_DIALECT_RESPONSES.from_chat(body, done, &rp, &r);
    assert_true(json_equal(json_object_get(last, "output"), json_object_get(whole, "output")));
    assert_true(json_equal(json_object_get(last, "usage"), json_object_get(whole, "usage")));
    json_decref(whole), json_decref(done), json_decref(body), json_decref(ev);
}

static void test_messages_stream(void **state) {
    (void)state;
    srv_reply rp = reply_of("msg_ab", 0);
    srv_gen_req r = {0};
    char names[2048];
    json_t *ev = stream_events(&SRV_DIALECT_MESSAGES, &rp, &r, names, sizeof names);
    assert_string_equal(names, "message_start ping content_block_start content_block_delta content_block_delta "
                               "content_block_stop content_block_start content_block_delta content_block_delta "
                               "content_block_stop content_block_start content_block_delta content_block_delta "
                               "content_block_stop message_delta message_stop ");
    expect_json(json_object_get(json_array_get(ev, 2), "content_block"), "thinking start",
                "{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}");
    expect_json(json_array_get(ev, 10), "tool_use start",
                "{\"type\":\"content_block_start\",\"index\":2,\"content_block\":{\"type\":\"tool_use\",\"id\":\"call_1\","
                "\"name\":\"f\",\"input\":{}}}");
    expect_json(json_array_get(ev, 12), "input delta",
                "{\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":"
                "\":1}\"}}");
    expect_json(json_array_get(ev, 14), "message_delta",
                "{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":"
                "{\"input_tokens\":6,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":4,\"output_tokens\":5}}");
    json_decref(ev);
}

/* ---- Responses: what Codex sends, under the compatibility policy ----
 * (README "API compatibility" -> "Responses API": every request field is
 * honoured, accepted with a stated meaning, or refused naming it) */

/* to_chat with a notes buffer: the chat body compared with `want`, and the
 * notes holding `note` (NULL: no notes at all). */
static void expect_chat_noted(const char *body, const char *want, const char *note) {
    json_t *b = parse(body), *w = parse(want);
    srv_error e = {0};
    srv_notes notes = {0};
    json_t *chat = SRV_DIALECT_RESPONSES.to_chat(b, &notes, &e);
    if (!chat) fail_msg("refused (%d): %s\n body %s", e.status, e.msg, body);
    if (!json_equal(chat, w)) {
        char *got = json_dumps(chat, JSON_COMPACT | JSON_SORT_KEYS);
        fail_msg("chat body\n got  %s\n want %s", got, want);
    }
    if (!note && notes.len) fail_msg("unexpected notes: %s", notes.text);
    if (note && !strstr(notes.text, note)) fail_msg("notes '%s' lack '%s'", notes.text, note);
    json_decref(chat), json_decref(b), json_decref(w);
}

/* The refusal's param too: the field a client must change. */
static void expect_refused_param(const char *body, const char *param, const char *part) {
    json_t *b = parse(body);
    srv_error e = {0};
    json_t *chat = SRV_DIALECT_RESPONSES.to_chat(b, NULL, &e);
    if (chat) fail_msg("accepted: %s", body);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, param);
    if (!strstr(e.msg, part)) fail_msg("message '%s' lacks '%s'", e.msg, part);
    json_decref(b);
}

#define Q_USER "\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]"

static void test_responses_policy_accepted(void **state) {
    (void)state;
    /* what Codex always sends (client_metadata, include, reasoning.summary)
     * and the metadata-like fields: accepted silently, nothing in the chat body */
    expect_chat_noted("{\"input\":\"q\",\"client_metadata\":{\"x-codex-installation-id\":\"i\"},\"metadata\":{\"a\":\"b\"},"
                      "\"user\":\"u\",\"safety_identifier\":\"s\",\"prompt_cache_key\":\"k\",\"prompt_cache_retention\":"
                      "\"24h\",\"prompt_cache_options\":{\"mode\":\"implicit\"},\"store\":false,\"service_tier\":\"default\","
                      "\"background\":false,\"truncation\":\"disabled\",\"stream_options\":{\"include_obfuscation\":false},"
                      "\"include\":[\"reasoning.encrypted_content\",\"web_search_call.action.sources\","
                      "\"file_search_call.results\"],\"reasoning\":{\"summary\":\"auto\",\"context\":\"auto\",\"mode\":"
                      "\"standard\"},\"text\":{\"verbosity\":\"medium\"},\"top_logprobs\":0}",
                      "{" Q_USER ",\"user\":\"u\"}", NULL);
    const char *const summaries[] = {"auto", "concise", "detailed", "none"};
    for (size_t i = 0; i < 4; i++) {
        char body[128];
        snprintf(body, sizeof body, "{\"input\":\"q\",\"reasoning\":{\"summary\":\"%s\",\"generate_summary\":null}}", summaries[i]);
        expect_chat_noted(body, "{" Q_USER "}", NULL);
    }
    /* reasoning.effort: the template's thinking switch, as chat's reasoning_effort */
    expect_chat_noted("{\"input\":\"q\",\"reasoning\":{\"effort\":\"none\"}}", "{" Q_USER ",\"reasoning_effort\":\"none\"}", NULL);
    expect_chat_noted("{\"input\":\"q\",\"reasoning\":{\"effort\":\"minimal\"}}", "{" Q_USER ",\"reasoning_effort\":\"minimal\"}", NULL);
    expect_chat_noted("{\"input\":\"q\",\"reasoning\":{\"effort\":\"medium\",\"summary\":\"auto\"}}",
                      "{" Q_USER ",\"reasoning_effort\":\"medium\"}", NULL);
    expect_chat_noted("{\"input\":\"q\",\"reasoning\":{\"effort\":\"xhigh\"}}", "{" Q_USER ",\"reasoning_effort\":\"xhigh\"}",
                      NULL);
    /* values that cannot change a delivered answer: accepted, said in a note */
    expect_chat_noted("{\"input\":\"q\",\"service_tier\":\"priority\"}", "{" Q_USER "}", "service_tier 'priority'");
    expect_chat_noted("{\"input\":\"q\",\"text\":{\"verbosity\":\"low\"}}", "{" Q_USER "}", "text.verbosity 'low'");
    expect_chat_noted("{\"input\":\"q\",\"truncation\":\"auto\"}", "{" Q_USER "}", "truncation 'auto'");
    expect_chat_noted("{\"input\":\"q\",\"context_management\":[{\"type\":\"compaction\",\"compact_threshold\":9000}]}",
                      "{" Q_USER "}", "context_management");
}

static void test_responses_policy_refused(void **state) {
    (void)state;
    expect_refused_param("{\"input\":\"q\",\"include\":[\"message.output_text.logprobs\"]}", "include",
                         "'message.output_text.logprobs'");
    expect_refused_param("{\"input\":\"q\",\"include\":[\"reasoning.encrypted_content\",\"bogus.field\"]}", "include",
                         "'bogus.field'");
    expect_refused_param("{\"input\":\"q\",\"reasoning\":{\"effort\":\"huge\"}}", "reasoning.effort", "'huge'");
    expect_refused_param("{\"input\":\"q\",\"reasoning\":{\"summary\":\"long\"}}", "reasoning.summary", "'long'");
    expect_refused_param("{\"input\":\"q\",\"reasoning\":{\"mode\":\"pro\"}}", "reasoning.mode", "'pro'");
    expect_refused_param("{\"input\":\"q\",\"reasoning\":{\"budget\":1}}", "reasoning", "'reasoning.budget'");
    expect_refused_param("{\"input\":\"q\",\"moderation\":{\"model\":\"omni-moderation-latest\"}}", "moderation", "moderation");
    expect_refused_param("{\"input\":\"q\",\"prompt\":{\"id\":\"pmpt_1\"}}", "prompt", "stored prompt");
    expect_refused_param("{\"input\":\"q\",\"background\":true}", "background", "background");
    expect_refused_param("{\"input\":\"q\",\"top_logprobs\":3}", "top_logprobs", "logprobs");
    expect_refused_param("{\"input\":\"q\",\"text\":{\"verbosity\":\"loud\"}}", "text.verbosity", "'loud'");
    expect_refused_param("{\"input\":\"q\",\"tools\":[{\"type\":\"frobnicator\"}]}", "tools", "'frobnicator'");
    /* a hosted tool forced by tool_choice: ignoring it would change the answer */
    expect_refused_param("{\"input\":\"q\",\"tools\":[{\"type\":\"web_search_preview\"}],\"tool_choice\":{\"type\":"
                         "\"web_search_preview\"}}",
                         "tool_choice", "'web_search_preview'");
    expect_refused_param("{\"input\":\"q\",\"tools\":[{\"type\":\"mcp\",\"server_label\":\"x\",\"server_url\":\"http://x\"}],"
                         "\"tool_choice\":{\"type\":\"mcp\",\"server_label\":\"x\"}}",
                         "tool_choice", "'mcp'");
    expect_refused_param("{\"input\":\"q\",\"tools\":[{\"type\":\"image_generation\"}],\"tool_choice\":\"required\"}",
                         "tool_choice", "required");
    expect_refused_param("{\"input\":\"q\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],\"tool_choice\":{\"type\":"
                         "\"function\",\"name\":\"g\"}}",
                         "tool_choice", "'g'");
    /* two tools the model would know by one name */
    expect_refused_param("{\"input\":\"q\",\"tools\":[{\"type\":\"function\",\"name\":\"exec\"},{\"type\":\"namespace\",\"name\":"
                         "\"functions\",\"description\":\"\",\"tools\":[{\"type\":\"function\",\"name\":\"exec\"}]}]}",
                         "tools", "'exec'");
}

#define TOOL_F "{\"type\":\"function\",\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}"
#define CHAT_F "{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}"
#define INPUT_SCHEMA "{\"type\":\"object\",\"properties\":{\"input\":{\"type\":\"string\"}},\"required\":[\"input\"],\"additionalProperties\":false}"
/* Codex's shape: MCP tools under their server's namespace, its own under "functions" */
#define NS_TOOLS                                                                                                          \
    "[{\"type\":\"namespace\",\"name\":\"mcp__w\",\"description\":\"Tools in the mcp__w namespace.\",\"tools\":["       \
    "{\"type\":\"function\",\"name\":\"get\",\"description\":\"Get\",\"strict\":false,\"defer_loading\":true,"          \
    "\"parameters\":{\"type\":\"object\"}},{\"type\":\"custom\",\"name\":\"raw\",\"description\":\"Raw\"}]},"           \
    "{\"type\":\"namespace\",\"name\":\"functions\",\"description\":\"\",\"tools\":[{\"type\":\"function\",\"name\":"   \
    "\"exec\",\"parameters\":{\"type\":\"object\"}}]}]"
#define NS_CHAT_TOOLS                                                                                                     \
    "[{\"type\":\"function\",\"function\":{\"name\":\"mcp__w__get\",\"description\":\"Get\",\"parameters\":{\"type\":"  \
    "\"object\"},\"strict\":false}},{\"type\":\"function\",\"function\":{\"name\":\"mcp__w__raw\",\"description\":"      \
    "\"Raw\",\"parameters\":" INPUT_SCHEMA "}},{\"type\":\"function\",\"function\":{\"name\":\"exec\",\"parameters\":" \
    "{\"type\":\"object\"}}}]"

static void test_responses_policy_tools(void **state) {
    (void)state;
    /* hosted tools under auto: left out of the prompt, said in a note */
    expect_chat_noted("{\"input\":\"q\",\"tools\":[" TOOL_F ",{\"type\":\"web_search\",\"external_web_access\":false},"
                      "{\"type\":\"image_generation\",\"output_format\":\"png\"}],\"tool_choice\":\"auto\"}",
                      "{" Q_USER ",\"tools\":[" CHAT_F "],\"tool_choice\":\"auto\"}", "web_search, image_generation");
    expect_chat_noted("{\"input\":\"q\",\"tools\":[{\"type\":\"web_search\"}]}", "{" Q_USER "}", "web_search");
    /* namespaces flattened: namespace__function, "functions" (Codex's default) bare;
     * a function_call item's namespace names the same function */
    expect_chat_noted("{\"input\":[{\"role\":\"user\",\"content\":\"q\"},{\"type\":\"function_call\",\"call_id\":\"c1\","
                      "\"name\":\"get\",\"namespace\":\"mcp__w\",\"arguments\":\"{}\",\"status\":\"completed\"},"
                      "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"r\",\"status\":\"completed\"}],"
                      "\"tools\":" NS_TOOLS ",\"tool_choice\":{\"type\":\"function\",\"name\":\"get\"}}",
                      "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":null,"
                      "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"mcp__w__get\","
                      "\"arguments\":\"{}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"r\",\"name\":"
                      "\"mcp__w__get\"}],\"tools\":" NS_CHAT_TOOLS ",\"tool_choice\":{\"type\":\"function\",\"function\":"
                      "{\"name\":\"mcp__w__get\"}}}",
                      NULL);
    /* custom tools: one string argument; a regex format is enforced as its
     * pattern, a Lark grammar is described to the model (and noted) */
    expect_chat_noted("{\"input\":[{\"role\":\"user\",\"content\":\"q\"},{\"type\":\"custom_tool_call\",\"call_id\":\"c2\","
                      "\"name\":\"note\",\"input\":\"a \\\"b\\\"\"},{\"type\":\"custom_tool_call_output\",\"call_id\":\"c2\","
                      "\"output\":\"ok\"}],\"tools\":[{\"type\":\"custom\",\"name\":\"note\",\"description\":\"Note\","
                      "\"format\":{\"type\":\"text\"}},{\"type\":\"custom\",\"name\":\"digits\",\"format\":{\"type\":"
                      "\"grammar\",\"syntax\":\"regex\",\"definition\":\"[0-9]+\"}}],\"tool_choice\":{\"type\":\"custom\","
                      "\"name\":\"digits\"}}",
                      "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":null,"
                      "\"tool_calls\":[{\"id\":\"c2\",\"type\":\"function\",\"function\":{\"name\":\"note\",\"arguments\":"
                      "\"{\\\"input\\\":\\\"a \\\\\\\"b\\\\\\\"\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"c2\","
                      "\"content\":\"ok\",\"name\":\"note\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
                      "\"note\",\"description\":\"Note\",\"parameters\":" INPUT_SCHEMA "}},{\"type\":\"function\","
                      "\"function\":{\"name\":\"digits\",\"parameters\":{\"type\":\"object\",\"properties\":{\"input\":"
                      "{\"type\":\"string\",\"pattern\":\"^(?:[0-9]+)$\"}},\"required\":[\"input\"],"
                      "\"additionalProperties\":false}}}],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":"
                      "\"digits\"}}}",
                      NULL);
    expect_chat_noted("{\"input\":\"q\",\"tools\":[{\"type\":\"custom\",\"name\":\"patch\",\"description\":\"Edit\","
                      "\"format\":{\"type\":\"grammar\",\"syntax\":\"lark\",\"definition\":\"start: \\\"x\\\"\"}}]}",
                      "{" Q_USER ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"patch\",\"description\":"
                      "\"Edit\\n\\nThe input must follow this Lark grammar:\\nstart: \\\"x\\\"\",\"parameters\":" INPUT_SCHEMA
                      "}}]}",
                      "custom tool 'patch': its Lark grammar is described to the model, not enforced");
    /* allowed_tools: the others left out, mode as tool_choice */
    expect_chat_noted("{\"input\":\"q\",\"tools\":[" TOOL_F ",{\"type\":\"function\",\"name\":\"g\"}],\"tool_choice\":"
                      "{\"type\":\"allowed_tools\",\"mode\":\"required\",\"tools\":[{\"type\":\"function\",\"name\":\"g\"}]}}",
                      "{" Q_USER ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"g\"}}],\"tool_choice\":"
                      "\"required\"}",
                      NULL);
    /* a qualified name longer than chat's 64 characters: cut, with a hash of the whole */
    json_t *b = parse("{\"input\":\"q\",\"tools\":[{\"type\":\"namespace\",\"name\":\"mcp__a_server_with_a_rather_long_"
                      "name_indeed\",\"description\":\"\",\"tools\":[{\"type\":\"function\",\"name\":\"and_a_long_tool_name\"}]}]}");
    srv_error e = {0};
    json_t *chat = SRV_DIALECT_RESPONSES.to_chat(b, NULL, &e);
    assert_non_null(chat);
    const char *name = json_string_value(json_object_get(
        json_object_get(json_array_get(json_object_get(chat, "tools"), 0), "function"), "name"));
    assert_non_null(name);
    assert_int_equal(strlen(name), 64);
    assert_memory_equal(name, "mcp__a_server_with_a_rather_long_name_indeed__and_a_long", 55);
    json_decref(chat), json_decref(b);
}

/* A chat completion whose calls are a namespaced function and a custom tool. */
static const char *const DONE_NS =
    "{\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":null,\"tool_calls\":["
    "{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"mcp__w__get\",\"arguments\":\"{}\"}},"
    "{\"id\":\"call_2\",\"type\":\"function\",\"function\":{\"name\":\"mcp__w__raw\",\"arguments\":"
    "\"{\\\"input\\\":\\\"*** Begin\\\\nx\\\"}\"}},"
    "{\"id\":\"call_3\",\"type\":\"function\",\"function\":{\"name\":\"exec\",\"arguments\":\"{}\"}}]},"
    "\"finish_reason\":\"tool_calls\"}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}";
static const char *const OUTPUT_NS =
    "[{\"id\":\"fc_ab_0\",\"type\":\"function_call\",\"status\":\"completed\",\"call_id\":\"call_1\",\"name\":\"get\","
    "\"namespace\":\"mcp__w\",\"arguments\":\"{}\"},"
    "{\"id\":\"ctc_ab_1\",\"type\":\"custom_tool_call\",\"status\":\"completed\",\"call_id\":\"call_2\",\"name\":\"raw\","
    "\"namespace\":\"mcp__w\",\"input\":\"*** Begin\\nx\"},"
    "{\"id\":\"fc_ab_2\",\"type\":\"function_call\",\"status\":\"completed\",\"call_id\":\"call_3\",\"name\":\"exec\","
    "\"namespace\":\"functions\",\"arguments\":\"{}\"}]";
static const char *const CHUNKS_NS[] = {
    "{\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}",
    "{\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\","
    "\"function\":{\"name\":\"mcp__w__get\",\"arguments\":\"{\"}}]}}]}",
    "{\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"}\"}}]}}]}",
    "{\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"id\":\"call_2\",\"type\":\"function\","
    "\"function\":{\"name\":\"mcp__w__raw\",\"arguments\":\"{\\\"input\\\":\\\"*** Be\"}}]}}]}",
    "{\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"function\":{\"arguments\":\"gin\\\\nx\\\"}\"}}]}}]}",
    "{\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":2,\"id\":\"call_3\",\"type\":\"function\","
    "\"function\":{\"name\":\"exec\",\"arguments\":\"{}\"}}]}}]}",
    "{\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}",
};
/* A reply that thinks, then writes. */
static const char *const CHUNKS_THINK[] = {
    "{\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}",
    "{\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"hm\"}}]}",
    "{\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"m\"}}]}",
    "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hello\"}}]}",
    "{\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}",
};

/* The Responses stream of `chunks` for `body`: event names (in `names`)
 * and data objects, each data's type its event's name. */
static json_t *responses_events(json_t *body, const char *const *chunks, size_t n, char *names, size_t cap) {
    srv_reply rp = reply_of("resp_ab", 0);
    srv_gen_req r = {0};
    srv_xlate *x = SRV_DIALECT_RESPONSES.stream_new(body, &rp, &r, 3);
    assert_non_null(x);
    srv_buf out = {0};
    for (size_t i = 0; i < n; i++) assert_true(SRV_DIALECT_RESPONSES.stream_chunk(x, parse(chunks[i]), &out));
    kt_request_usage u = {.prompt_tokens = 3, .completion_tokens = 4};
    assert_true(SRV_DIALECT_RESPONSES.stream_end(x, &u, &out));
    SRV_DIALECT_RESPONSES.stream_free(x);
    json_t *events = json_array();
    names[0] = 0;
    for (char *p = out.data; p && (p = strstr(p, "event: "));) {
        char *nl = strchr(p, '\n'), *end = strstr(p, "\n\n");
        assert_true(nl && end && !strncmp(nl, "\ndata: ", 7));
        snprintf(names + strlen(names), cap - strlen(names), "%.*s ", (int)(nl - p - 7), p + 7);
        json_t *ev = json_loadb(nl + 7, (size_t)(end - nl - 7), 0, NULL);
        assert_non_null(ev);
        if (strncmp(json_string_value(json_object_get(ev, "type")), p + 7, (size_t)(nl - p - 7))) fail_msg("type of %.60s", p);
        json_array_append_new(events, ev);
        p = end;
    }
    srv_buf_free(&out);
    return events;
}

/* The first event named `type` at or after `from`. */
static json_t *event_named(json_t *events, const char *type, size_t from) {
    for (size_t i = from; i < json_array_size(events); i++)
        if (!strcmp(json_string_value(json_object_get(json_array_get(events, i), "type")), type))
            return json_array_get(events, i);
    fail_msg("no %s event", type);
    return NULL;
}

static void test_responses_policy_calls_answered(void **state) {
    (void)state;
    /* whole: a call of a flattened function comes back with its own name and
     * namespace; a custom tool's call as a custom_tool_call with its input */
    srv_reply rp = reply_of("resp_ab", 0);
    srv_gen_req r = {0};
    json_t *body = parse("{\"input\":\"q\",\"tools\":" NS_TOOLS "}"), *done = parse(DONE_NS);
    json_t *a = SRV_DIALECT_RESPONSES.from_chat(body, done, &rp, &r);
    assert_non_null(a);
    expect_json(json_object_get(a, "output"), "output", OUTPUT_NS);
    /* streamed: the same items, a custom tool's input in its own events */
    char names[4096];
    json_t *ev = responses_events(body, CHUNKS_NS, sizeof CHUNKS_NS / sizeof CHUNKS_NS[0], names, sizeof names);
    assert_string_equal(names, "response.created response.in_progress "
                               "response.output_item.added response.function_call_arguments.delta "
                               "response.function_call_arguments.delta response.function_call_arguments.done "
                               "response.output_item.done "
                               "response.output_item.added response.custom_tool_call_input.delta "
                               "response.custom_tool_call_input.done response.output_item.done "
                               "response.output_item.added response.function_call_arguments.delta "
                               "response.function_call_arguments.done response.output_item.done response.completed ");
    json_t *last = json_array_get(ev, json_array_size(ev) - 1);
    expect_json(json_object_get(json_object_get(last, "response"), "output"), "completed output", OUTPUT_NS);
    expect_json(json_object_get(event_named(ev, "response.output_item.added", 0), "item"), "added function_call",
                "{\"id\":\"fc_ab_0\",\"type\":\"function_call\",\"status\":\"in_progress\",\"call_id\":\"call_1\","
                "\"name\":\"get\",\"namespace\":\"mcp__w\",\"arguments\":\"\"}");
    assert_string_equal(json_string_value(json_object_get(event_named(ev, "response.function_call_arguments.done", 0), "name")),
                        "get");
    expect_json(event_named(ev, "response.custom_tool_call_input.done", 0), "custom input done",
                "{\"type\":\"response.custom_tool_call_input.done\",\"item_id\":\"ctc_ab_1\",\"output_index\":1,"
                "\"input\":\"*** Begin\\nx\",\"sequence_number\":9}");
    json_decref(ev), json_decref(a), json_decref(done), json_decref(body);
}

static void test_responses_policy_reasoning(void **state) {
    (void)state;
    srv_reply rp = reply_of("resp_ab", 0);
    srv_gen_req r = {0};
    /* a summary asked for: the thinking is its own summary; encrypted_content
     * asked for: kettle's readable (not encrypted) copy of it */
    json_t *body = parse("{\"input\":\"q\",\"reasoning\":{\"summary\":\"auto\"},\"include\":[\"reasoning.encrypted_content\"]}");
    json_t *done = parse(DONE_ALL);
    json_t *a = SRV_DIALECT_RESPONSES.from_chat(body, done, &rp, &r);
    assert_non_null(a);
    json_t *rs = json_array_get(json_object_get(a, "output"), 0);
    expect_json(json_object_get(rs, "summary"), "summary", "[{\"type\":\"summary_text\",\"text\":\"hmm\"}]");
    expect_json(json_object_get(rs, "content"), "content", "[{\"type\":\"reasoning_text\",\"text\":\"hmm\"}]");
    char sealed[256];
    assert_non_null(json_string_value(json_object_get(rs, "encrypted_content")));
    snprintf(sealed, sizeof sealed, "%s", json_string_value(json_object_get(rs, "encrypted_content")));
    /* the next request: the item as Codex sends it back (no id, no content)
     * gives the assistant turn its reasoning */
    char next[1024];
    snprintf(next, sizeof next,
             "{\"input\":[{\"role\":\"user\",\"content\":\"q\"},{\"type\":\"reasoning\",\"summary\":[],\"encrypted_content\":"
             "\"%s\"},{\"type\":\"message\",\"role\":\"assistant\",\"status\":\"completed\",\"content\":[{\"type\":"
             "\"output_text\",\"text\":\"hello\"}]},{\"role\":\"user\",\"content\":\"more\"}]}",
             sealed);
    expect_chat_noted(next,
                      "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"hello\","
                      "\"reasoning_content\":\"hmm\"},{\"role\":\"user\",\"content\":\"more\"}]}",
                      NULL);
    /* another server's encrypted reasoning: left out with a note, never a 400 */
    expect_chat_noted("{\"input\":[{\"role\":\"user\",\"content\":\"q\"},{\"type\":\"reasoning\",\"summary\":[],"
                      "\"encrypted_content\":\"gAAAAABoForeignFernetToken==\"},{\"role\":\"assistant\",\"content\":\"hi\"}]}",
                      "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"hi\"}]}",
                      "encrypted_content");
    json_decref(a), json_decref(done);
    /* without them: no summary, no encrypted_content */
    json_t *plain = parse("{\"input\":\"q\",\"reasoning\":{\"summary\":\"none\"}}");
    done = parse(DONE_ALL);
    a = SRV_DIALECT_RESPONSES.from_chat(plain, done, &rp, &r);
    rs = json_array_get(json_object_get(a, "output"), 0);
    assert_int_equal(json_array_size(json_object_get(rs, "summary")), 0);
    assert_null(json_object_get(rs, "encrypted_content"));
    json_decref(a), json_decref(done), json_decref(plain);
    /* streamed: the summary part's events, and the same item at the end */
    char names[4096];
    json_t *ev = responses_events(body, CHUNKS_THINK, sizeof CHUNKS_THINK / sizeof CHUNKS_THINK[0], names, sizeof names);
    assert_string_equal(names, "response.created response.in_progress "
                               "response.output_item.added response.reasoning_summary_part.added "
                               "response.reasoning_text.delta response.reasoning_summary_text.delta "
                               "response.reasoning_text.delta response.reasoning_summary_text.delta "
                               "response.reasoning_text.done response.reasoning_summary_text.done "
                               "response.reasoning_summary_part.done response.output_item.done "
                               "response.output_item.added response.content_part.added response.output_text.delta "
                               "response.output_text.done response.content_part.done response.output_item.done "
                               "response.completed ");
    expect_json(event_named(ev, "response.reasoning_summary_text.delta", 0), "summary delta",
                "{\"type\":\"response.reasoning_summary_text.delta\",\"item_id\":\"rs_ab_0\",\"output_index\":0,"
                "\"summary_index\":0,\"delta\":\"hm\",\"sequence_number\":5}");
    json_t *item = json_object_get(event_named(ev, "response.output_item.done", 0), "item");
    expect_json(json_object_get(item, "summary"), "streamed summary", "[{\"type\":\"summary_text\",\"text\":\"hmm\"}]");
    assert_string_equal(json_string_value(json_object_get(item, "encrypted_content")), sealed);
    json_decref(ev), json_decref(body);
}

/* The context error names the Responses field, not chat's. */
static void test_responses_policy_error_param(void **state) {
    (void)state;
    kt_error err = {.status = KT_ERR_CONTEXT};
    snprintf(err.msg, sizeof err.msg, "the prompt has 9 tokens but the context holds 8");
    srv_error e;
    srv_submit_error(&err, KT_FIELD_PROMPT, SRV_CHAT, &e);
    char *s = SRV_DIALECT_RESPONSES.error_json(&e);
    json_t *j = parse(s);
    assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "param")), "input");
    assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "code")), "context_length_exceeded");
    json_decref(j), free(s);
    srv_fail(&e, 400, "invalid_request_error", "max_tokens", NULL, "too many");
    s = SRV_DIALECT_RESPONSES.error_json(&e);
    assert_non_null(strstr(s, "\"param\":\"max_output_tokens\""));
    free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_responses_request), cmocka_unit_test(test_responses_refusals),
        cmocka_unit_test(test_responses_answer),  cmocka_unit_test(test_messages_answer),
        cmocka_unit_test(test_messages_request),  cmocka_unit_test(test_messages_refusals),
        cmocka_unit_test(test_messages_claude_code_fields),
        cmocka_unit_test(test_responses_stream),  cmocka_unit_test(test_messages_stream),
        /* Responses: the compatibility policy */
        cmocka_unit_test(test_responses_policy_accepted), cmocka_unit_test(test_responses_policy_refused),
        cmocka_unit_test(test_responses_policy_tools), cmocka_unit_test(test_responses_policy_calls_answered),
        cmocka_unit_test(test_responses_policy_reasoning), cmocka_unit_test(test_responses_policy_error_param),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
