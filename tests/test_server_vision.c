/*
 * test_server_vision.c - images through `kettle serve --mmproj` over HTTP,
 * in C so that the sanitized builds drive the server's image path (data:
 * URLs, base64, decoding, the prompt's markers, the engine's encode and
 * cache, the Anthropic and Responses translations). The real clients'
 * view of the same is tests/js/vision_e2e.mjs (optimized build).
 *
 * The model: golden/arch's random-weight Qwen 3.5 with its qwen3vl
 * projector; the image: the golden's 40x30 PNG (12 tokens, a 4x3 grid),
 * small enough for a sanitized build.
 */
#include <nettle/base64.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fake_server.h"
#include "server_util.h"
#include "testutil.h"

static server S;
static char *image_url; /* data:image/png;base64,... of image-tiny.png */
static const int TINY_TOKENS = 4 * 3;

static char *data_url(const char *rel, size_t cut) {
    size_t n;
    char *bytes = tu_read_file(tu_shared(rel), &n);
    assert_non_null(bytes);
    if (cut && cut < n) n = cut;
    char *url = tu_xmalloc(32 + BASE64_ENCODE_RAW_LENGTH(n) + 1);
    int head = sprintf(url, "data:image/png;base64,");
    base64_encode_raw((char *)url + head, n, (const uint8_t *)bytes);
    url[head + BASE64_ENCODE_RAW_LENGTH(n)] = 0;
    free(bytes);
    return url;
}

static int setup(void **state) {
    (void)state;
    char args[2048], model[1024];
    snprintf(model, sizeof model, "%s", tu_shared("golden/arch/qwen35-F16.gguf"));
    snprintf(args, sizeof args, "--mmproj '%s' --chat-template chatml --ctx 2048 --parallel 2",
             tu_shared("golden/arch/mmproj-qwen3vl-F32.gguf"));
    S = start_server_model("server_vision", model, args);
    image_url = data_url("golden/arch/image-tiny.png", 0);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    stop_server(&S);
    free(image_url);
    return 0;
}

/* A chat body: the system line, then a user message of an image part and
 * a text part; extra goes in the body. */
static char *chat_body(const char *url, const char *extra) {
    json_t *b = json_pack("{s:s, s:[{s:s, s:s}, {s:s, s:[{s:s, s:{s:s}}, {s:s, s:s}]}], s:i, s:f}", "model", "m",
                          "messages", "role", "system", "content", "You are a computer-use agent.", "role", "user",
                          "content", "type", "image_url", "image_url", "url", url, "type", "text", "text",
                          "Where is the Settings button?", "max_tokens", 6, "temperature", 0.0);
    json_t *more = extra ? parse(extra) : NULL;
    if (more) json_object_update(b, more), json_decref(more);
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    return s;
}

static const char *content_of(json_t *reply) {
    json_t *c = json_array_get(json_object_get(reply, "choices"), 0);
    const char *s = json_string_value(json_object_get(json_object_get(c, "message"), "content"));
    assert_non_null(s);
    return s;
}

static double metric(const char *name) {
    reply r = get(&S, "/metrics");
    assert_int_equal(r.status, 200);
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *at = strstr(r.body, key);
    if (!at) fail_msg("%s is not in /metrics", name);
    double v = atof(at + strlen(key));
    free(r.body);
    return v;
}

/* The image's tokens are counted; the same request again is served from
 * the prefix cache with the same text, the image's bytes known (not
 * decoded again) and the tower not run again. */
static void test_image_counted_and_cached(void **state) {
    (void)state;
    char *body = chat_body(image_url, NULL);
    json_t *a = post_ok(&S, "/v1/chat/completions", body);
    const double encodes = metric("kettle_image_encodes_total"), decodes = metric("kettle_image_decodes_total"),
                 skipped = metric("kettle_image_decodes_skipped_total");
    json_t *b = post_ok(&S, "/v1/chat/completions", body);
    json_t *ua = json_object_get(a, "usage"), *ub = json_object_get(b, "usage");
    const long long prompt = json_integer_value(json_object_get(ua, "prompt_tokens"));
    assert_true(prompt > TINY_TOKENS + 10);
    assert_int_equal(json_integer_value(json_object_get(ub, "prompt_tokens")), prompt);
    assert_true(json_integer_value(json_object_get(json_object_get(ub, "prompt_tokens_details"), "cached_tokens")) >=
                prompt - 16);
    assert_string_equal(content_of(a), content_of(b));
    assert_true(encodes >= 1);
    assert_true(metric("kettle_image_encodes_total") == encodes);
    assert_true(decodes >= 1);
    assert_true(metric("kettle_image_decodes_total") == decodes); /* the bytes were seen: not decoded again */
    assert_true(metric("kettle_image_decodes_skipped_total") == skipped + 1);
    printf("  %lld prompt tokens (%d of the image); again: cached, the same text, the image neither decoded nor "
           "encoded\n", prompt, TINY_TOKENS);
    json_decref(a), json_decref(b);
    free(body);
}

/* max_tokens 0 prefills and answers nothing. */
static void test_prefill_only(void **state) {
    (void)state;
    char *body = chat_body(image_url, "{\"max_tokens\": 0, \"messages\": [{\"role\": \"system\", \"content\": \"Another "
                                      "system line.\"}, {\"role\": \"user\", \"content\": \"hi\"}]}");
    json_t *r = post_ok(&S, "/v1/chat/completions", body);
    json_t *c = json_array_get(json_object_get(r, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(c, "finish_reason")), "length");
    assert_string_equal(json_string_value(json_object_get(json_object_get(c, "message"), "content")), "");
    assert_int_equal(json_integer_value(json_object_get(json_object_get(r, "usage"), "completion_tokens")), 0);
    json_decref(r);
    free(body);
    expect_error(&S, "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"max_tokens\":0,\"n\":2}",
                 400, "one choice");
}

/* The Anthropic and Responses shapes carry the image as chat does: the
 * same prompt count. */
static void test_dialects(void **state) {
    (void)state;
    const char *b64 = strchr(image_url, ',') + 1;
    json_t *m = json_pack("{s:s, s:i, s:f, s:s, s:[{s:s, s:[{s:s, s:{s:s, s:s, s:s}}, {s:s, s:s}]}]}", "model", "m",
                          "max_tokens", 6, "temperature", 0.0, "system", "You are a computer-use agent.", "messages",
                          "role", "user", "content", "type", "image", "source", "type", "base64", "media_type",
                          "image/png", "data", b64, "type", "text", "text", "Where is the Settings button?");
    char *mb = json_dumps(m, JSON_COMPACT);
    json_t *ra = post_ok(&S, "/v1/messages", mb);
    json_t *usage = json_object_get(ra, "usage");
    const long long in = json_integer_value(json_object_get(usage, "input_tokens")) +
                         json_integer_value(json_object_get(usage, "cache_read_input_tokens"));
    char *body = chat_body(image_url, NULL);
    json_t *rc = post_ok(&S, "/v1/chat/completions", body);
    assert_int_equal(in, json_integer_value(json_object_get(json_object_get(rc, "usage"), "prompt_tokens")));
    json_t *resp = json_pack("{s:s, s:i, s:s, s:[{s:s, s:[{s:s, s:s}, {s:s, s:s}]}]}", "model", "m",
                             "max_output_tokens", 6, "instructions", "You are a computer-use agent.", "input", "role",
                             "user", "content", "type", "input_image", "image_url", image_url, "type", "input_text",
                             "text", "Where is the Settings button?");
    char *rb = json_dumps(resp, JSON_COMPACT);
    json_t *rr = post_ok(&S, "/v1/responses", rb);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(rr, "usage"), "input_tokens")), in);
    json_decref(m), json_decref(ra), json_decref(rc), json_decref(resp), json_decref(rr);
    free(mb), free(body), free(rb);
}

/* Bad images: each a 400 saying why, the server still serving. */
static void test_bad_images(void **state) {
    (void)state;
    char *cut = data_url("golden/arch/image-tiny.png", 60), *body = chat_body(cut, NULL);
    expect_error(&S, "/v1/chat/completions", body, 400, "image 0");
    free(body), free(cut);
    body = chat_body("https://example.com/a.png", NULL);
    expect_error(&S, "/v1/chat/completions", body, 400, "data: URL");
    free(body);
    body = chat_body("data:image/png;base64,!!!!", NULL);
    expect_error(&S, "/v1/chat/completions", body, 400, "base64");
    free(body);
    body = chat_body("data:image/png;base64,R0lGODlhAQABAAAAACw=", NULL); /* a GIF */
    expect_error(&S, "/v1/chat/completions", body, 400, "PNG, JPEG or WebP");
    free(body);
    expect_error(&S, "/v1/chat/completions",
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"look: <__media__>\"}],\"max_tokens\":2}", 400,
                 "stands for an image");
    /* more image tokens than the context holds: refused before the rest are decoded */
    char *photo = data_url("golden/arch/image-photo.jpg", 0);
    json_t *parts = json_array();
    for (int i = 0; i < 14; i++) /* 160 tokens each, 2048 in the context */
        json_array_append_new(parts, json_pack("{s:s, s:{s:s}}", "type", "image_url", "image_url", "url", photo));
    json_t *many = json_pack("{s:[{s:s, s:o}], s:i}", "messages", "role", "user", "content", parts, "max_tokens", 2);
    char *mb = json_dumps(many, JSON_COMPACT);
    expect_error(&S, "/v1/chat/completions", mb, 400, "the context holds 2048");
    json_decref(many), free(mb), free(photo);
    reply r = get(&S, "/health");
    assert_int_equal(r.status, 200);
    free(r.body);
}

/* --allow-image-urls: an http URL is fetched (the same tokens as its data:
 * URL), a missing one and one over the byte limit are 400s naming why;
 * without the flag the URL is refused naming it. */
static void serve_png(int fd, const char *req, void *arg) {
    (void)arg;
    size_t n;
    char *png = tu_read_file(tu_shared("golden/arch/image-tiny.png"), &n);
    char head[256];
    const bool big = strstr(req, "GET /big") != NULL, found = big || strstr(req, "GET /tiny.png") != NULL;
    const size_t len = big ? 64 * 1024 : n;
    int k = snprintf(head, sizeof head, "HTTP/1.1 %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
                     found ? "200 OK" : "404 Not Found", found ? len : 0);
    if (write(fd, head, (size_t)k) != k) return;
    for (size_t sent = 0; found && sent < len; sent += n)
        if (write(fd, png, n < len - sent ? n : len - sent) < 0) break;
    free(png);
}

static void test_image_urls(void **state) {
    (void)state;
    int port;
    pid_t fake = tu_fake_server_start(serve_png, NULL, true, &port);
    char args[2048], model[1024], url[128];
    snprintf(model, sizeof model, "%s", tu_shared("golden/arch/qwen35-F16.gguf"));
    snprintf(args, sizeof args, "--mmproj '%s' --chat-template chatml --ctx 2048 --parallel 2 --allow-image-urls "
             "--image-max-bytes 32768", tu_shared("golden/arch/mmproj-qwen3vl-F32.gguf"));
    server f = start_server_model("server_vision_urls", model, args);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/tiny.png", port);
    char *body = chat_body(url, NULL), *ref = chat_body(image_url, NULL);
    json_t *a = post_ok(&f, "/v1/chat/completions", body), *b = post_ok(&S, "/v1/chat/completions", ref);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(a, "usage"), "prompt_tokens")),
                     json_integer_value(json_object_get(json_object_get(b, "usage"), "prompt_tokens")));
    assert_string_equal(content_of(a), content_of(b));
    expect_error(&S, "/v1/chat/completions", body, 400, "--allow-image-urls");
    free(body), json_decref(a), json_decref(b);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/missing.png", port);
    body = chat_body(url, NULL);
    expect_error(&f, "/v1/chat/completions", body, 400, "fetching");
    free(body);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/big", port);
    body = chat_body(url, NULL);
    expect_error(&f, "/v1/chat/completions", body, 400, "over 32768 bytes");
    free(body), free(ref);
    stop_server(&f);
    tu_fake_server_stop(fake);
}

/* The encoder cache's disk tier: after a kill -9 and a restart on the
 * same --cache-dir, the same image behind another system prompt (no KV
 * hit before it) is read back, not encoded; a corrupt file is refused and
 * the image encoded again. */
static long long counter(const server *s, const char *name) {
    reply r = get(s, "/metrics");
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *at = r.body ? strstr(r.body, key) : NULL;
    long long v = at ? atoll(at + strlen(key)) : -1;
    free(r.body);
    if (v < 0) fail_msg("%s is not in /metrics", name);
    return v;
}

static void test_embeddings_on_disk(void **state) {
    (void)state;
    char dir[512], args[2048], model[1024];
    snprintf(dir, sizeof dir, "%s", tu_tmp("vision_cache"));
    char rm[600];
    snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
    assert_int_equal(system(rm), 0);
    snprintf(model, sizeof model, "%s", tu_shared("golden/arch/qwen35-F16.gguf"));
    snprintf(args, sizeof args, "--mmproj '%s' --chat-template chatml --ctx 2048 --parallel 2 --cache-dir '%s'",
             tu_shared("golden/arch/mmproj-qwen3vl-F32.gguf"), dir);
    server a = start_server_model("server_vision_disk", model, args);
    char *body = chat_body(image_url, NULL);
    json_t *r = post_ok(&a, "/v1/chat/completions", body);
    json_decref(r);
    assert_int_equal(counter(&a, "kettle_image_encodes_total"), 1);
    kill(a.pid, SIGKILL); /* the embeddings' file is written before the step goes on */
    waitpid(a.pid, NULL, 0);
    a = start_server_model("server_vision_disk", model, args);
    /* another system line: the image's KV is not cached before it */
    json_t *o = parse(body);
    json_object_set_new(json_array_get(json_object_get(o, "messages"), 0), "content", json_string("Another agent."));
    char *other = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    r = post_ok(&a, "/v1/chat/completions", other);
    json_decref(r);
    assert_int_equal(counter(&a, "kettle_image_encodes_total"), 0);
    assert_int_equal(counter(&a, "kettle_image_disk_hits_total"), 1);
    stop_server(&a);
    /* every embedding file cut short: refused, the image encoded again */
    char cut[700];
    snprintf(cut, sizeof cut, "for f in '%s'/images-*/*.kve; do truncate -s 100 \"$f\"; done", dir);
    assert_int_equal(system(cut), 0);
    a = start_server_model("server_vision_disk", model, args);
    o = parse(body);
    json_object_set_new(json_array_get(json_object_get(o, "messages"), 0), "content", json_string("A third agent."));
    char *third = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    r = post_ok(&a, "/v1/chat/completions", third);
    json_decref(r);
    assert_int_equal(counter(&a, "kettle_image_disk_hits_total"), 0);
    assert_int_equal(counter(&a, "kettle_image_encodes_total"), 1);
    printf("  after kill -9: the image's embeddings read back from --cache-dir, not encoded; cut short: encoded\n");
    stop_server(&a);
    free(body), free(other), free(third);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_image_counted_and_cached),
        cmocka_unit_test(test_prefill_only),
        cmocka_unit_test(test_dialects),
        cmocka_unit_test(test_bad_images),
        cmocka_unit_test(test_image_urls),
        cmocka_unit_test(test_embeddings_on_disk),
    };
    return tu_result(cmocka_run_group_tests(tests, setup, teardown));
}
