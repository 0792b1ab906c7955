/*
 * openai.c - request validation and response building for the OpenAI API
 * (see openai.h).
 *
 * Validation is strict about types (a string where a number belongs is a
 * 400 naming the field) and lenient about fields kettle does not use
 * (ignored, as OpenAI-compatible servers do). Defaults are OpenAI's, not
 * `kettle run`'s: temperature 1, top_p 1, no top_k / min_p unless given,
 * max_tokens 16 for completions and "until the context is full" for chat.
 */
#include "server/openai.h"

#include "base/error.h"
#include "base/json_safe.h"
#include "grammar/json_schema.h"
#include "server/sampled.h"
#include "text/utf8.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define INVALID "invalid_request_error"

bool srv_fail(srv_error *e, int status, const char *type, const char *param, const char *code,
              const char *fmt, ...) {
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return false;
}

void srv_note(srv_notes *n, const char *fmt, ...) {
    if (!n) return;
    char item[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(item, sizeof item, fmt, ap);
    va_end(ap);
    for (char *p = item; *p; p++)
        if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e) *p = '?';
    const size_t cap = sizeof n->text, sep = n->len ? 2 : 0, len = strlen(item);
    if (n->cut) return;
    if (n->len + sep + len + 4 > cap) { /* "..." always fits: it is kept room for */
        memcpy(n->text + n->len, "...", 4);
        n->len += 3, n->cut = true;
        return;
    }
    memcpy(n->text + n->len, "; ", sep);
    memcpy(n->text + n->len + sep, item, len + 1);
    n->len += sep + len;
}

char *srv_error_json(const srv_error *e) {
    /* messages may quote user text cut at a byte limit: keep them valid */
    char msg[sizeof e->msg];
    snprintf(msg, sizeof msg, "%s", srv_utf8_valid(e->msg, strlen(e->msg)) ? e->msg : "invalid request");
    json_t *j = json_pack("{s:{s:s, s:s, s:o, s:o}}", "error", "message", msg, "type",
                          e->type ? e->type : "server_error", "param",
                          e->param[0] ? json_string(e->param) : json_null(), "code",
                          e->code ? json_string(e->code) : json_null());
    char *s = j ? kt_json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    return s;
}

/* ---- field readers: absent or null -> untouched and true ---- */

static json_t *field(json_t *body, const char *key) {
    json_t *v = json_object_get(body, key);
    return json_is_null(v) ? NULL : v;
}

static bool read_int(json_t *body, const char *key, long long lo, long long hi, long long *out,
                     srv_error *e) {
    json_t *v = field(body, key);
    if (!v) return true;
    if (!json_is_integer(v)) return srv_fail(e, 400, INVALID, key, NULL, "'%s' must be an integer", key);
    long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return srv_fail(e, 400, INVALID, key, NULL, "'%s' is %lld; it must be between %lld and %lld", key, x, lo,
                        hi);
    *out = x;
    return true;
}

static bool read_float(json_t *body, const char *key, double lo, double hi, float *out, srv_error *e) {
    json_t *v = field(body, key);
    if (!v) return true;
    if (!json_is_number(v)) return srv_fail(e, 400, INVALID, key, NULL, "'%s' must be a number", key);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi))
        return srv_fail(e, 400, INVALID, key, NULL, "'%s' is %g; it must be between %g and %g", key, x, lo, hi);
    *out = (float)x;
    return true;
}

static bool read_bool(json_t *body, const char *key, bool *out, srv_error *e) {
    json_t *v = field(body, key);
    if (!v) return true;
    if (!json_is_boolean(v)) return srv_fail(e, 400, INVALID, key, NULL, "'%s' must be true or false", key);
    *out = json_is_true(v);
    return true;
}

/* ---- the parts of a generation request ---- */

/* Which class a model name is was decided by the server's routing
 * (classes.c); here it only has to be a string. */
static bool parse_model(json_t *body, srv_error *e) {
    json_t *v = field(body, "model");
    if (v && !json_is_string(v)) return srv_fail(e, 400, INVALID, "model", NULL, "'model' must be a string");
    return true;
}

/* An image part's URL ({"type": "image_url", "image_url": {"url": ...}}
 * or "image_url": "..."), or NULL when the part is not one. */
static json_t *image_part_url(json_t *p) {
    json_t *type = json_object_get(p, "type"), *iu = json_object_get(p, "image_url");
    if (!json_is_string(type) || strcmp(json_string_value(type), "image_url")) return NULL;
    json_t *url = json_is_object(iu) ? json_object_get(iu, "url") : iu;
    return json_is_string(url) ? url : NULL;
}

/* OpenAI content parts ([{"type":"text","text":...}]) joined into one
 * string, which is what chat templates expect. With `images` (the model
 * has a vision tower), an image part becomes SRV_IMAGE_MARKER in the text
 * and its URL is appended to images. NULL if a part is neither, or
 * (*oom) when out of memory. */
static json_t *join_text_parts(json_t *parts, json_t *images, bool *oom) {
    srv_buf b = {0};
    size_t i;
    json_t *p;
    *oom = false;
    json_array_foreach(parts, i, p) {
        json_t *type = json_object_get(p, "type"), *text = json_object_get(p, "text");
        json_t *url = images ? image_part_url(p) : NULL;
        const bool is_text = json_is_string(type) && !strcmp(json_string_value(type), "text") && json_is_string(text);
        const char *piece = url ? SRV_IMAGE_MARKER : json_string_value(text);
        const size_t len = url ? strlen(SRV_IMAGE_MARKER) : json_string_length(text);
        if ((!is_text && !url) || (i && !srv_buf_append(&b, SRV_TEXT_PART_SEP, strlen(SRV_TEXT_PART_SEP))) ||
            !srv_buf_append(&b, piece, len) || (url && json_array_append(images, url))) {
            *oom = is_text || url;
            srv_buf_free(&b);
            return NULL;
        }
    }
    json_t *s = json_stringn(b.data ? b.data : "", b.len); /* valid UTF-8: jansson parsed the parts */
    srv_buf_free(&b);
    *oom = !s;
    return s;
}

static bool check_message(json_t *msg, size_t i, const srv_model_info *mi, srv_gen_req *r, srv_error *e) {
    if (!json_is_object(msg))
        return srv_fail(e, 400, INVALID, "messages", NULL, "'messages[%zu]' must be an object", i);
    json_t *role = json_object_get(msg, "role"), *content = json_object_get(msg, "content");
    if (!json_is_string(role))
        return srv_fail(e, 400, INVALID, "messages", NULL, "'messages[%zu].role' must be a string", i);
    static const char *const ROLES[] = {"system", "developer", "user", "assistant", "tool", NULL};
    bool known = false;
    for (int k = 0; ROLES[k] && !known; k++) known = !strcmp(ROLES[k], json_string_value(role));
    if (!known)
        return srv_fail(e, 400, INVALID, "messages", NULL,
                        "'messages[%zu].role' '%.40s' is not one of \"system\", \"developer\", \"user\", "
                        "\"assistant\", \"tool\"%s",
                        i, json_string_value(role),
                        strcmp(json_string_value(role), "function") ? "" : " (the deprecated function role: use tool)");
    if (content && !json_is_null(content) && !json_is_string(content) && !json_is_array(content))
        return srv_fail(e, 400, INVALID, "messages", NULL,
                        "'messages[%zu].content' must be a string or an array of text parts", i);
    if (json_is_string(content) && mi->vision && strstr(json_string_value(content), SRV_IMAGE_MARKER))
        return srv_fail(e, 400, INVALID, "messages", NULL, "'messages[%zu].content' has the text " SRV_IMAGE_MARKER
                        ", which stands for an image here: send images as image_url parts", i);
    if (json_is_array(content)) {
        bool oom;
        if (mi->vision && !r->image_urls && !(r->image_urls = json_array()))
            return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        json_t *joined = join_text_parts(content, r->image_urls, &oom);
        if (!joined && !oom) {
            size_t k;
            json_t *p;
            json_array_foreach(content, k, p) if (image_part_url(p) || json_is_string(json_object_get(p, "image_url")))
                return srv_fail(e, 400, INVALID, "messages", NULL, "'messages[%zu].content[%zu]': the model takes no "
                                "images (start kettle with --mmproj FILE, the model's vision projector)", i, k);
            return srv_fail(e, 400, INVALID, "messages", NULL,
                            "'messages[%zu].content': only parts of type \"text\"%s are supported", i,
                            mi->vision ? " and \"image_url\"" : "");
        }
        if (!joined || json_object_set_new(msg, "content", joined))
            return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    return true;
}

static bool parse_messages(json_t *body, const srv_model_info *mi, srv_gen_req *r, srv_error *e) {
    json_t *v = field(body, "messages");
    if (!v) return srv_fail(e, 400, INVALID, "messages", NULL, "'messages' is required");
    if (!json_is_array(v) || json_array_size(v) == 0)
        return srv_fail(e, 400, INVALID, "messages", NULL, "'messages' must be a non-empty array");
    if (json_array_size(v) > SRV_MAX_MESSAGES)
        return srv_fail(e, 400, INVALID, "messages", NULL, "'messages' has %zu entries; at most %d are allowed",
                        json_array_size(v), SRV_MAX_MESSAGES);
    size_t i;
    json_t *msg;
    json_array_foreach(v, i, msg) if (!check_message(msg, i, mi, r, e)) return false;
    if (json_array_size(r->image_urls) > KT_MAX_IMAGES)
        return srv_fail(e, 400, INVALID, "messages", NULL, "the messages have %zu images; at most %d are allowed",
                        json_array_size(r->image_urls), KT_MAX_IMAGES);
    r->messages = v;
    return true;
}

/* ---- tools ---- */

static bool check_tool(json_t *t, size_t i, srv_error *e) {
    json_t *type = json_object_get(t, "type"), *fn = json_object_get(t, "function");
    if (!json_is_object(t) || !json_is_string(type) || strcmp(json_string_value(type), "function") || !json_is_object(fn))
        return srv_fail(e, 400, INVALID, "tools", NULL, "'tools[%zu]' must be {\"type\": \"function\", \"function\": {...}}", i);
    json_t *name = json_object_get(fn, "name"), *params = field(fn, "parameters");
    if (!json_is_string(name) || !json_string_length(name) || json_string_length(name) > 64)
        return srv_fail(e, 400, INVALID, "tools", NULL, "'tools[%zu].function.name' must be a string of 1 to 64 characters", i);
    for (const char *c = json_string_value(name); *c; c++)
        if (!(*c == '_' || *c == '-' || *c == '.' || (*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'z') ||
              (*c >= 'A' && *c <= 'Z')))
            return srv_fail(e, 400, INVALID, "tools", NULL,
                            "'tools[%zu].function.name' '%.64s' may only have letters, digits, '_', '-' and '.'", i,
                            json_string_value(name));
    if (params && !json_is_object(params))
        return srv_fail(e, 400, INVALID, "tools", NULL, "'tools[%zu].function.parameters' must be a JSON Schema object", i);
    return true;
}

/* tools, tool_choice, parallel_tool_calls. */
static bool parse_tools(json_t *body, srv_gen_req *r, srv_error *e) {
    json_t *tools = field(body, "tools"), *choice = field(body, "tool_choice");
    r->parallel_tool_calls = true;
    if (!read_bool(body, "parallel_tool_calls", &r->parallel_tool_calls, e)) return false;
    if (tools && !json_is_array(tools)) return srv_fail(e, 400, INVALID, "tools", NULL, "'tools' must be an array");
    if (json_array_size(tools) > SRV_MAX_TOOLS)
        return srv_fail(e, 400, INVALID, "tools", NULL, "'tools' has %zu functions; at most %d are allowed",
                        json_array_size(tools), SRV_MAX_TOOLS);
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) if (!check_tool(t, i, e)) return false;
    r->tools = json_array_size(tools) ? tools : NULL;
    r->tool_choice = r->tools ? KT_TOOL_AUTO : KT_TOOL_NONE;
    if (!choice) return true;
    if (json_is_string(choice)) {
        const char *c = json_string_value(choice);
        if (!strcmp(c, "none")) r->tool_choice = KT_TOOL_NONE;
        else if (!strcmp(c, "auto")) r->tool_choice = r->tools ? KT_TOOL_AUTO : KT_TOOL_NONE;
        else if (!strcmp(c, "required")) r->tool_choice = KT_TOOL_REQUIRED;
        else
            return srv_fail(e, 400, INVALID, "tool_choice", NULL,
                            "'tool_choice' '%.40s' is not one of \"none\", \"auto\", \"required\" or "
                            "{\"type\": \"function\", \"function\": {\"name\": ...}}",
                            c);
    } else {
        json_t *fn = json_is_object(choice) ? json_object_get(choice, "function") : NULL;
        json_t *type = json_is_object(choice) ? json_object_get(choice, "type") : NULL;
        json_t *name = json_object_get(fn, "name");
        if (!json_is_string(type) || strcmp(json_string_value(type), "function") || !json_is_string(name))
            return srv_fail(e, 400, INVALID, "tool_choice", NULL,
                            "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                            "\"function\": {\"name\": ...}}");
        r->tool_choice = KT_TOOL_NAMED, r->tool_name = json_string_value(name);
    }
    if ((r->tool_choice == KT_TOOL_REQUIRED || r->tool_choice == KT_TOOL_NAMED) && !r->tools)
        return srv_fail(e, 400, INVALID, "tool_choice", NULL, "'tool_choice' asks for a tool call but 'tools' is empty");
    return true;
}

/* kwargs[key] = v (stolen) unless the request set that variable itself. */
static bool default_kwarg(json_t *kw, const char *key, json_t *v) {
    if (json_object_get(kw, key)) return json_decref(v), true;
    return !json_object_set_new(kw, key, v);
}

/* reasoning_effort (OpenAI's "none" | "minimal" | "low" | "medium" |
 * "high" | "xhigh", and Anthropic's "max" through the Messages API) is the
 * template's thinking switch: enable_thinking false for none and minimal,
 * true otherwise; and the value itself as the variable reasoning_effort,
 * which gpt-oss's template reads. chat_template_kwargs, when it sets
 * either, wins. *kw may be made here (inside the body, which owns it). */
static bool parse_effort(json_t *body, json_t **kw, srv_gen_req *r, srv_error *e) {
    static const char *const EFFORTS[] = {"none", "minimal", "low", "medium", "high", "xhigh", "max", NULL};
    json_t *v = field(body, "reasoning_effort");
    if (!v) return true;
    bool known = false;
    for (int i = 0; EFFORTS[i] && json_is_string(v) && !known; i++) known = !strcmp(EFFORTS[i], json_string_value(v));
    if (!known)
        return srv_fail(e, 400, INVALID, "reasoning_effort", NULL,
                        "'reasoning_effort' must be one of \"none\", \"minimal\", \"low\", \"medium\", \"high\", "
                        "\"xhigh\", \"max\"");
    const char *s = json_string_value(v);
    r->effort = s;
    if (!*kw && (json_object_set_new(body, "chat_template_kwargs", json_object()) ||
                 !(*kw = json_object_get(body, "chat_template_kwargs"))))
        return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    bool off = !strcmp(s, "none") || !strcmp(s, "minimal");
    if (!default_kwarg(*kw, "enable_thinking", json_boolean(!off)) || !default_kwarg(*kw, "reasoning_effort", json_string(s)))
        return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    return true;
}

/* reasoning_format ("auto" | "none", as llama-server's) and
 * chat_template_kwargs (extra template variables, as vLLM's and
 * llama-server's: {"enable_thinking": false}). */
static bool parse_reasoning(json_t *body, srv_gen_req *r, srv_error *e) {
    json_t *rf = field(body, "reasoning_format"), *kw = field(body, "chat_template_kwargs");
    r->reasoning_split = true;
    if (rf) {
        const char *v = json_string_value(rf);
        if (!v || (strcmp(v, "none") && strcmp(v, "auto") && strcmp(v, "deepseek")))
            return srv_fail(e, 400, INVALID, "reasoning_format", NULL,
                            "'reasoning_format' must be \"auto\" (thinking goes to reasoning_content) or \"none\" "
                            "(it stays in content)");
        r->reasoning_split = strcmp(v, "none") != 0;
    }
    if (kw && !json_is_object(kw))
        return srv_fail(e, 400, INVALID, "chat_template_kwargs", NULL, "'chat_template_kwargs' must be an object");
    if (!parse_effort(body, &kw, r, e)) return false;
    r->template_kwargs = kw;
    return true;
}

/* Every parameter a request may have (the README's compatibility table
 * says what each does). One kettle does not implement is a 400 naming
 * it: a client must never believe a setting took effect when it did not. */
static const char *const CHAT_PARAMS[] = {
    "model", "messages", "tools", "tool_choice", "parallel_tool_calls", "max_tokens", "max_completion_tokens", "n",
    "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "seed", "stop", "logprobs",
    "top_logprobs", "logit_bias", "response_format", "grammar", "stream", "stream_options", "priority",
    "ignore_eos", "reasoning_format", "chat_template_kwargs", "reasoning_effort", NULL};
static const char *const COMPLETION_PARAMS[] = {
    "model", "prompt", "echo", "max_tokens", "n", "temperature", "top_p", "top_k", "min_p", "presence_penalty",
    "frequency_penalty", "seed", "stop", "logprobs", "logit_bias", "response_format", "grammar", "stream",
    "stream_options", "priority", "ignore_eos", NULL};
/* OpenAI's fields that change nothing a local server answers, accepted
 * with any value: who is asking (user, safety_identifier, metadata), the
 * provider's prompt cache (prompt_cache_key, prompt_cache_retention:
 * kettle's prefix cache needs no key), stored completions (store: kettle
 * stores nothing), the billing tier (service_tier), a predicted output
 * (prediction: a latency hint; the answer does not depend on it). */
static const char *const ACCEPTED_PARAMS[] = {"user", "safety_identifier", "metadata", "prompt_cache_key",
                                              "prompt_cache_retention", "store", "service_tier", "prediction", NULL};
/* OpenAI's fields kettle cannot honour: fine when null or false (not set), a
 * 400 saying why otherwise. Any other name is a 400 whatever its value. */
static const char *const REFUSED_PARAMS[] = {"functions", "function_call", "best_of", "suffix", "audio", "modalities",
                                             "web_search_options", "verbosity", NULL};

static bool in_list(const char *const *list, const char *k) {
    for (int i = 0; list[i]; i++)
        if (!strcmp(list[i], k)) return true;
    return false;
}

static const char *why_unsupported(const char *k) {
    if (!strcmp(k, "functions") || !strcmp(k, "function_call"))
        return "the deprecated function-calling API is not supported; use 'tools' and 'tool_choice'";
    if (!strcmp(k, "best_of")) return "'best_of' is not supported; use 'n'";
    if (!strcmp(k, "suffix")) return "'suffix' (fill-in-the-middle) is not supported";
    if (!strcmp(k, "audio")) return "'audio' output is not supported: kettle serves text models";
    if (!strcmp(k, "web_search_options")) return "'web_search_options': a local server has no web search";
    if (!strcmp(k, "verbosity")) return "'verbosity' is not supported: no chat template kettle knows takes it";
    return NULL;
}

/* modalities ["text"] is what kettle does anyway; verbosity "medium" is the default. */
static bool is_default_value(const char *k, json_t *v) {
    if (!strcmp(k, "modalities"))
        return json_is_array(v) && json_array_size(v) == 1 && json_is_string(json_array_get(v, 0)) &&
               !strcmp(json_string_value(json_array_get(v, 0)), "text");
    if (!strcmp(k, "verbosity")) return json_is_string(v) && !strcmp(json_string_value(v), "medium");
    return false;
}

static bool check_params(json_t *body, srv_kind kind, srv_error *e) {
    const char *const *known = kind == SRV_CHAT ? CHAT_PARAMS : COMPLETION_PARAMS;
    const char *k;
    json_t *v;
    json_object_foreach(body, k, v) {
        if (in_list(known, k) || in_list(ACCEPTED_PARAMS, k)) continue;
        if (in_list(REFUSED_PARAMS, k)) {
            /* an explicit "off" is no setting at all */
            if (json_is_null(v) || json_is_false(v) || is_default_value(k, v)) continue;
            const char *why = why_unsupported(k);
            if (why) return srv_fail(e, 400, INVALID, k, "unsupported_parameter", "%s", why);
            return srv_fail(e, 400, INVALID, k, "unsupported_parameter",
                            "'%.60s' must be [\"text\"]: kettle serves text models", k);
        }
        return srv_fail(e, 400, INVALID, k, "unsupported_parameter",
                        "'%.60s' is not a parameter kettle implements for %s; remove it", k,
                        kind == SRV_CHAT ? "/v1/chat/completions" : "/v1/completions");
    }
    return true;
}

static bool parse_prompt(json_t *body, srv_gen_req *r, srv_error *e) {
    json_t *v = field(body, "prompt");
    if (json_is_array(v) && json_array_size(v) == 1 && json_is_string(json_array_get(v, 0)))
        v = json_array_get(v, 0);
    if (!v) return srv_fail(e, 400, INVALID, "prompt", NULL, "'prompt' is required");
    if (json_is_array(v))
        return srv_fail(e, 400, INVALID, "prompt", NULL,
                        "'prompt' as an array (several prompts, or token ids) is not supported; send one string");
    if (!json_is_string(v)) return srv_fail(e, 400, INVALID, "prompt", NULL, "'prompt' must be a string");
    r->prompt = json_string_value(v);
    bool echo = false;
    if (!read_bool(body, "echo", &echo, e)) return false;
    if (echo) return srv_fail(e, 400, INVALID, "echo", NULL, "'echo' is not supported");
    return true;
}

static bool parse_stop(json_t *body, srv_gen_req *r, srv_error *e) {
    json_t *v = field(body, "stop");
    if (!v) return true;
    if (json_is_string(v)) {
        if (!json_string_length(v))
            return srv_fail(e, 400, INVALID, "stop", NULL, "'stop' is empty: an empty stop string would end every reply at once");
        r->stop[r->n_stop++] = json_string_value(v);
        return true;
    }
    if (!json_is_array(v)) return srv_fail(e, 400, INVALID, "stop", NULL, "'stop' must be a string or an array of strings");
    if (json_array_size(v) > KT_MAX_STOP)
        return srv_fail(e, 400, INVALID, "stop", NULL, "'stop' has %zu strings; at most %d are allowed",
                        json_array_size(v), KT_MAX_STOP);
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) {
        if (!json_is_string(s)) return srv_fail(e, 400, INVALID, "stop", NULL, "'stop[%zu]' must be a string", i);
        if (!json_string_length(s))
            return srv_fail(e, 400, INVALID, "stop", NULL,
                            "'stop[%zu]' is empty: an empty stop string would end every reply at once", i);
        r->stop[r->n_stop++] = json_string_value(s);
    }
    return true;
}

static bool parse_token_id(const char *key, int n_vocab, int32_t *out) {
    char *end;
    long v = strtol(key, &end, 10);
    if (end == key || *end || v < 0 || v >= n_vocab) return false;
    *out = (int32_t)v;
    return true;
}

static bool parse_logit_bias(json_t *body, const srv_model_info *mi, srv_gen_req *r, srv_error *e) {
    json_t *v = field(body, "logit_bias");
    if (!v) return true;
    if (!json_is_object(v))
        return srv_fail(e, 400, INVALID, "logit_bias", NULL, "'logit_bias' must be an object of token id -> bias");
    size_t n = json_object_size(v);
    if (n == 0) return true;
    if (n > SRV_MAX_LOGIT_BIAS) /* each entry costs every step of every choice */
        return srv_fail(e, 400, INVALID, "logit_bias", NULL, "'logit_bias' has %zu entries; at most %d are allowed", n,
                        SRV_MAX_LOGIT_BIAS);
    if (!(r->logit_bias = calloc(n, sizeof *r->logit_bias)))
        return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    const char *key;
    json_t *b;
    json_object_foreach(v, key, b) {
        kt_logit_bias *lb = &r->logit_bias[r->n_logit_bias];
        if (!parse_token_id(key, mi->n_vocab, &lb->token))
            return srv_fail(e, 400, INVALID, "logit_bias", NULL,
                            "'logit_bias' key '%.40s' is not a token id (0..%d)", key, mi->n_vocab - 1);
        double x = json_is_number(b) ? json_number_value(b) : NAN;
        if (!(x >= -100 && x <= 100))
            return srv_fail(e, 400, INVALID, "logit_bias", NULL,
                            "'logit_bias' of token %s must be a number between -100 and 100", key);
        lb->bias = x <= -100 ? -INFINITY : (float)x;
        r->n_logit_bias++;
    }
    return true;
}

static bool parse_logprobs(json_t *body, srv_gen_req *r, srv_error *e) {
    long long top = 0;
    r->top_logprobs = -1;
    if (r->kind == SRV_COMPLETION) { /* "logprobs": N alternatives */
        long long n = -1;
        if (!read_int(body, "logprobs", 0, KT_MAX_TOP_LOGPROBS, &n, e)) return false;
        r->logprobs = n >= 0;
        r->top_logprobs = (int)n;
        return true;
    }
    if (!read_bool(body, "logprobs", &r->logprobs, e)) return false;
    if (!read_int(body, "top_logprobs", 0, KT_MAX_TOP_LOGPROBS, &top, e)) return false;
    if (field(body, "top_logprobs") && !r->logprobs)
        return srv_fail(e, 400, INVALID, "top_logprobs", NULL, "'top_logprobs' needs 'logprobs': true");
    if (r->logprobs) r->top_logprobs = (int)top;
    return true;
}

/* OpenAI's sampling defaults, then the request's values. */
static bool parse_sampling(json_t *body, uint64_t random_seed, srv_gen_req *r, srv_error *e) {
    kt_sampler_params *sp = &r->sampling;
    *sp = kt_sampler_defaults();
    sp->temperature = 1.0f, sp->top_p = 1.0f, sp->top_k = 0, sp->min_p = 0.0f, sp->seed = random_seed;
    long long top_k = 0, seed = 0;
    if (!read_float(body, "temperature", 0, 2, &sp->temperature, e) || !read_float(body, "top_p", 0, 1, &sp->top_p, e) ||
        !read_float(body, "min_p", 0, 1, &sp->min_p, e) || !read_int(body, "top_k", 0, 1 << 24, &top_k, e) ||
        !read_float(body, "presence_penalty", -2, 2, &sp->presence_penalty, e) ||
        !read_float(body, "frequency_penalty", -2, 2, &sp->frequency_penalty, e))
        return false;
    sp->top_k = (int)top_k;
    if (field(body, "seed")) {
        if (!read_int(body, "seed", INT64_MIN, INT64_MAX, &seed, e)) return false;
        sp->seed = (uint64_t)seed;
        r->seed_given = true;
    }
    return true;
}

static bool parse_lengths(json_t *body, srv_gen_req *r, srv_error *e) {
    long long max = r->kind == SRV_COMPLETION ? 16 : -1, n = 1, prio = 0;
    if (!read_int(body, "max_tokens", 0, 1 << 30, &max, e) ||
        !read_int(body, "max_completion_tokens", 0, 1 << 30, &max, e) ||
        !read_int(body, "n", 1, KT_MAX_CHOICES, &n, e) || !read_int(body, "priority", -1000000, 1000000, &prio, e))
        return false;
    /* max_tokens 0: the prepared step of an agent loop. The prompt is read
     * into the prefix cache and the answer is empty (finish_reason
     * "length"), so the request the agent sends next with it as prefix
     * starts after it: send the history while the agent acts */
    r->prefill_only = max == 0;
    if (r->prefill_only && n != 1)
        return srv_fail(e, 400, INVALID, "n", NULL, "max_tokens 0 (prefill only) takes one choice");
    r->max_tokens = (int)max, r->n_choices = (int)n, r->priority = (int)prio;
    /* kettle's extension (as llama.cpp's server): generate past end-of-turn
     * tokens, for benchmarks that need exactly max_tokens */
    return read_bool(body, "ignore_eos", &r->ignore_eos, e);
}

/* response_format ({"type": "text" | "json_object" | "json_schema"}) or
 * llama-server's 'grammar' (GBNF) become the GBNF every choice must match.
 * A schema kettle cannot enforce is a 400 naming the keyword, never a
 * silently unconstrained answer. The grammar itself is parsed by the
 * engine's submit (a 400 with line and column). */
/* A key of obj outside `keys` (NULL-terminated) is a 400 naming it. */
static bool only_keys(json_t *obj, const char *const *keys, const char *where, srv_error *e) {
    const char *k;
    json_t *v;
    json_object_foreach(obj, k, v) if (!in_list(keys, k))
        return srv_fail(e, 400, INVALID, "response_format", "unsupported_parameter",
                        "'%s.%.40s' is not a field kettle implements; remove it", where, k);
    return true;
}

static bool parse_structured(json_t *body, srv_gen_req *r, srv_error *e) {
    json_t *gr = field(body, "grammar"), *rf = field(body, "response_format");
    if (gr && !json_is_string(gr)) return srv_fail(e, 400, INVALID, "grammar", NULL, "'grammar' must be a GBNF string");
    const char *type = NULL;
    if (rf) {
        json_t *t = json_is_object(rf) ? field(rf, "type") : NULL;
        if (!json_is_string(t))
            return srv_fail(e, 400, INVALID, "response_format", NULL,
                            "'response_format' must be an object with a 'type' (\"text\", \"json_object\" or "
                            "\"json_schema\")");
        type = json_string_value(t);
        static const char *const RF_KEYS[] = {"type", "json_schema", NULL};
        static const char *const JS_KEYS[] = {"name", "description", "schema", "strict", NULL};
        if (!only_keys(rf, RF_KEYS, "response_format", e) ||
            (json_is_object(field(rf, "json_schema")) &&
             !only_keys(field(rf, "json_schema"), JS_KEYS, "response_format.json_schema", e)))
            return false;
        if (strcmp(type, "text") && strcmp(type, "json_object") && strcmp(type, "json_schema"))
            return srv_fail(e, 400, INVALID, "response_format", NULL,
                            "'response_format.type' '%.40s' is not one of \"text\", \"json_object\", \"json_schema\"",
                            type);
        if (!strcmp(type, "text")) type = NULL;
    }
    if (gr && type)
        return srv_fail(e, 400, INVALID, "grammar", NULL, "give either 'grammar' or a JSON 'response_format', not both");
    if (gr) {
        if (!(r->grammar = strdup(json_string_value(gr))))
            return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory for the grammar");
        return true;
    }
    if (!type) return true;
    if (!strcmp(type, "json_object")) {
        if (!(r->grammar = strdup(kt_json_any_gbnf(true))))
            return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory for the grammar");
        return true;
    }
    json_t *js = field(rf, "json_schema");
    json_t *schema = json_is_object(js) ? field(js, "schema") : NULL;
    if (!schema)
        return srv_fail(e, 400, INVALID, "response_format", NULL,
                        "'response_format' of type \"json_schema\" needs 'json_schema': {\"name\", \"schema\"}");
    kt_error err = {0};
    if (!(r->grammar = kt_json_schema_to_gbnf(schema, &err)))
        return srv_fail(e, err.status == KT_ERR_NOMEM ? 500 : 400, err.status == KT_ERR_NOMEM ? "server_error" : INVALID,
                        "response_format", NULL, "'response_format.json_schema.schema': %s", err.msg);
    return true;
}

static bool parse_stream(json_t *body, srv_gen_req *r, srv_error *e) {
    if (!read_bool(body, "stream", &r->stream, e)) return false;
    json_t *so = field(body, "stream_options");
    if (!so) return true;
    if (!json_is_object(so)) return srv_fail(e, 400, INVALID, "stream_options", NULL, "'stream_options' must be an object");
    const char *k;
    json_t *v;
    json_object_foreach(so, k, v) /* include_obfuscation pads chunks against a network observer: none here */
        if (strcmp(k, "include_usage") && strcmp(k, "include_obfuscation"))
            return srv_fail(e, 400, INVALID, "stream_options", "unsupported_parameter",
                            "'stream_options.%.40s' is not an option kettle implements (include_usage, "
                            "include_obfuscation)", k);
    json_t *iu = field(so, "include_usage");
    if (iu && !json_is_boolean(iu))
        return srv_fail(e, 400, INVALID, "stream_options", NULL, "'stream_options.include_usage' must be true or false");
    r->include_usage = json_is_true(iu);
    return true;
}

bool srv_parse_gen(json_t *body, srv_kind kind, const srv_model_info *mi, uint64_t random_seed,
                   srv_gen_req *out, srv_error *e) {
    *out = (srv_gen_req){.kind = kind};
    if (!json_is_object(body)) return srv_fail(e, 400, INVALID, NULL, NULL, "the request body must be a JSON object");
    bool ok = check_params(body, kind, e) && parse_model(body, e) &&
              (kind == SRV_CHAT ? parse_messages(body, mi, out, e) && parse_tools(body, out, e) &&
                                      parse_reasoning(body, out, e)
                                : parse_prompt(body, out, e)) &&
              parse_lengths(body, out, e) && parse_sampling(body, random_seed, out, e) &&
              parse_stop(body, out, e) && parse_logprobs(body, out, e) && parse_logit_bias(body, mi, out, e) &&
              parse_structured(body, out, e) && parse_stream(body, out, e);
    if (!ok) srv_gen_req_free(out);
    return ok;
}

void srv_gen_req_free(srv_gen_req *r) {
    json_decref(r->image_urls);
    r->image_urls = NULL;
    srv_images_free(r);
    free(r->logit_bias);
    r->logit_bias = NULL;
    r->n_logit_bias = 0;
    free(r->grammar);
    r->grammar = NULL;
    kt_tool_grammar_free(&r->tools_grammar);
}

/* ---- prompts ---- */

static int tokenize_alloc(const kt_model *m, const char *text, int add_bos, bool specials, int32_t **ids,
                          srv_error *e) {
    kt_error err = {0};
    size_t len = strlen(text);
    int n = kt_tokenize_ex(m, text, len, NULL, 0, add_bos, specials, &err);
    if (n < 0) return srv_fail(e, 400, INVALID, NULL, NULL, "%s", err.msg), -1;
    if (!(*ids = malloc(sizeof(int32_t) * ((size_t)n + 1))))
        return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory for %d prompt tokens", n), -1;
    n = kt_tokenize_ex(m, text, len, *ids, n, add_bos, specials, &err);
    if (n < 0) {
        free(*ids), *ids = NULL;
        return srv_fail(e, 400, INVALID, NULL, NULL, "%s", err.msg), -1;
    }
    return n;
}

/* ids[0..n) grown by the tokens of text[0..len) (add_bos as kt_tokenize_ex),
 * or by the given ids (text NULL); false with e filled. */
static bool ids_add(const kt_model *m, int32_t **ids, int *n, const char *text, size_t len, int add_bos,
                    const int32_t *more, int n_more, srv_error *e) {
    kt_error err = {0};
    int k = more ? n_more : kt_tokenize_ex(m, text, len, NULL, 0, add_bos, true, &err);
    if (k < 0) return srv_fail(e, 400, INVALID, "messages", NULL, "%s", err.msg);
    int32_t *p = realloc(*ids, sizeof(int32_t) * ((size_t)*n + (size_t)k + 1));
    if (!p) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory for %d prompt tokens", *n + k);
    *ids = p;
    if (more) memcpy(p + *n, more, sizeof(int32_t) * (size_t)k);
    else if (kt_tokenize_ex(m, text, len, p + *n, k, add_bos, true, &err) != k)
        return srv_fail(e, 400, INVALID, "messages", NULL, "%s", err.msg);
    *n += k;
    return true;
}

/* The rendered prompt with remembered replies spliced in as their sampled
 * ids: the text between them is tokenized piece by piece. A piece after a
 * reply must start with an end-of-turn token (the template closing the
 * turn), so the split changes no tokenization at the reply's end; the
 * text before a reply is what the previous turn's prompt ended with.
 * Returns the count, 0 when nothing was spliced (tokenize the whole text
 * instead), -1 on error. */
/* The piece of ids from `from` on starts with an end-of-turn token (or is
 * empty): the split after a reply changed no tokenization. */
static bool closes_turn(const kt_model *m, const int32_t *ids, int n, int from) {
    return from < 0 || from >= n || kt_token_is_eog(m, ids[from]);
}

typedef enum splice_result { SPLICE_NONE, SPLICE_DONE, SPLICE_FAILED } splice_result;

/* Adds text[at..upto) then, if reply, the reply's ids; the piece of text
 * must close the previous reply's turn. */
static splice_result add_piece(const kt_model *m, int32_t **ids, int *n, const char *text, size_t at, size_t upto,
                               int add_bos, int eog_at, const int32_t *reply, int n_reply, srv_error *e) {
    if (!ids_add(m, ids, n, text + at, upto - at, at == 0 ? add_bos : 0, NULL, 0, e)) return SPLICE_FAILED;
    if (!closes_turn(m, *ids, *n, eog_at)) return SPLICE_NONE;
    if (reply && !ids_add(m, ids, n, NULL, 0, 0, reply, n_reply, e)) return SPLICE_FAILED;
    return SPLICE_DONE;
}

static int splice_replies(const kt_model *m, srv_sampled *mem, json_t *messages, const char *text, int add_bos,
                          int32_t **out, srv_error *e) {
    int32_t *ids = NULL;
    int n = 0, eog_at = -1; /* where the piece after the last reply starts */
    size_t at = 0;          /* text[0..at) is in ids */
    splice_result res = SPLICE_NONE;
    for (size_t i = 0; i < json_array_size(messages) && res != SPLICE_FAILED; i++) {
        json_t *msg = json_array_get(messages, i), *content = json_object_get(msg, "content");
        const char *role = json_string_value(json_object_get(msg, "role"));
        if (!role || strcmp(role, "assistant") || !json_is_string(content) || !json_string_length(content)) continue;
        int32_t *reply = NULL;
        int n_reply = srv_sampled_get(mem, json_string_value(content), json_string_length(content), &reply);
        const char *hit = n_reply ? strstr(text + at, json_string_value(content)) : NULL;
        if (hit) {
            res = add_piece(m, &ids, &n, text, at, (size_t)(hit - text), add_bos, eog_at, reply, n_reply, e);
            at = (size_t)(hit - text) + json_string_length(content);
            eog_at = n;
        }
        free(reply);
        if (hit && res == SPLICE_NONE) break; /* a reply its template does not close: no splicing */
    }
    if (res == SPLICE_DONE) res = add_piece(m, &ids, &n, text, at, strlen(text), add_bos, eog_at, NULL, 0, e);
    if (res != SPLICE_DONE) {
        free(ids);
        return res == SPLICE_FAILED ? -1 : 0;
    }
    *out = ids;
    return n;
}

static int32_t control_id(void *ctx, const char *s, size_t n) {
    return kt_token_control_id(ctx, s, n);
}

/* The conversation rendered with the template (kt_tool_render: made
 * ready for it first), with the model's variables and the request's
 * chat_template_kwargs. */
static char *render_chat(const kt_model *m, const char *tmpl, srv_gen_req *r, srv_error *e) {
    const char *text = tmpl ? tmpl : kt_model_chat_template(m);
    r->format = kt_tool_format_detect(text);
    if (!text)
        return srv_fail(e, 400, INVALID, "messages", NULL, "the model has no chat template; start the server with "
                        "--chat-template (a Jinja file, or a built-in)"), NULL;
    /* gpt-oss's system message says "Reasoning: <effort>", and the model
     * knows three levels (it cannot stop reasoning): another value would
     * reach it as text it was never trained on */
    const char *effort = json_string_value(json_object_get(r->template_kwargs, "reasoning_effort"));
    if (r->effort && effort && !strcmp(effort, r->effort) && !strcmp(kt_tool_format_name(r->format), "gpt-oss") &&
        strcmp(effort, "low") && strcmp(effort, "medium") && strcmp(effort, "high"))
        return srv_fail(e, 400, INVALID, "reasoning_effort", NULL,
                        "the reasoning effort \"%.20s\" is not one of gpt-oss's levels: \"low\", \"medium\", \"high\"",
                        r->effort), NULL;
    char *ctx = kt_chat_context_json(m);
    json_t *vars = ctx ? kt_json_loads(ctx, 0, NULL) : NULL;
    free(ctx);
    kt_error err = {0};
    char *out = NULL;
    if (!vars || (r->template_kwargs && json_object_update(vars, r->template_kwargs)))
        kt_error_set(&err, KT_ERR_NOMEM, "out of memory");
    else out = kt_tool_render(r->format, text, r->messages, r->tools, vars, 0, &err);
    json_decref(vars);
    if (!out) srv_fail(e, err.status == KT_ERR_NOMEM ? 500 : 400, err.status == KT_ERR_NOMEM ? "server_error" : INVALID,
                       "messages", NULL, "%s", err.msg[0] ? err.msg : "out of memory");
    return out;
}

/* The grammar that keeps the calls valid. Under "auto" a response_format
 * becomes the alternative to a call; under required / a named function
 * there is no text answer for it to shape. */
static bool tools_grammar(const kt_model *m, srv_gen_req *r, srv_error *e) {
    if (!r->tools || r->tool_choice == KT_TOOL_NONE) return true;
    if (r->grammar && r->tool_choice != KT_TOOL_AUTO)
        return srv_fail(e, 400, INVALID, "response_format", NULL,
                        "'response_format' / 'grammar' shape a text answer, and 'tool_choice' asks for a tool call "
                        "instead; give one of them");
    kt_error err = {0};
    if (kt_tool_grammar_build(r->format, r->tools, r->tool_choice, r->tool_name, r->parallel_tool_calls, r->think,
                              r->grammar, control_id, (void *)m, &r->tools_grammar, &err) != KT_OK)
        return srv_fail(e, err.status == KT_ERR_NOMEM ? 500 : 400, err.status == KT_ERR_NOMEM ? "server_error" : INVALID,
                        r->tool_choice == KT_TOOL_NAMED && err.status == KT_ERR_ARG ? "tool_choice" : "tools", NULL,
                        "%s", err.msg);
    if (r->tools_grammar.relaxed[0]) srv_note(r->notes, "%s", r->tools_grammar.relaxed);
    return true;
}

/* The text piece [from, upto) of the rendered prompt appended to ids, with
 * remembered replies spliced in where it has them. */
static bool add_text_piece(const kt_model *m, srv_sampled *mem, json_t *messages, const char *from, size_t len,
                           int add_bos, int32_t **ids, int *n, srv_error *e) {
    char *piece = malloc(len + 1);
    if (!piece) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    memcpy(piece, from, len), piece[len] = 0;
    int32_t *got = NULL;
    int k = splice_replies(m, mem, messages, piece, add_bos, &got, e);
    if (k == 0) k = len ? tokenize_alloc(m, piece, add_bos, true, &got, e) : 0;
    free(piece);
    const bool ok = k >= 0 && (k == 0 || ids_add(m, ids, n, NULL, 0, 0, got, k, e));
    free(got);
    return ok;
}

/* A prompt with images: the rendered text tokenized between the image
 * markers, and at each one the image's start token, a placeholder per
 * image token (submit writes the image's keys) and its end token; each
 * image's `at` set. Returns the count or -1. */
static int image_prompt(const kt_model *m, srv_sampled *mem, srv_gen_req *r, const char *text, int add_bos,
                        int32_t **ids, srv_error *e) {
    static const char START[] = "<|vision_start|>", END[] = "<|vision_end|>";
    const int32_t start = kt_token_control_id(m, START, strlen(START)), end = kt_token_control_id(m, END, strlen(END));
    if (start < 0 || end < 0)
        return srv_fail(e, 400, INVALID, "messages", NULL, "the model's vocabulary has no %s / %s tokens to hold an "
                        "image", START, END), -1;
    int n = 0, i = 0;
    const char *at = text, *mark;
    *ids = NULL;
    while ((mark = strstr(at, SRV_IMAGE_MARKER)) && i < r->n_images) {
        kt_prompt_image *im = &r->images[i++];
        if (!add_text_piece(m, mem, r->messages, at, (size_t)(mark - at), at == text ? add_bos : 0, ids, &n, e) ||
            !ids_add(m, ids, &n, NULL, 0, 0, &start, 1, e))
            goto fail;
        im->at = n;
        for (int t = 0; t < im->grid_x * im->grid_y; t++) {
            const int32_t zero = 0; /* submit writes the image's key ids here */
            if (!ids_add(m, ids, &n, NULL, 0, 0, &zero, 1, e)) goto fail;
        }
        if (!ids_add(m, ids, &n, NULL, 0, 0, &end, 1, e)) goto fail;
        at = mark + strlen(SRV_IMAGE_MARKER);
    }
    if (i < r->n_images || strstr(at, SRV_IMAGE_MARKER)) {
        srv_fail(e, 400, INVALID, "messages", NULL, "the chat template left %d of the %d images in the prompt (it "
                 "drops or repeats message content)", i, r->n_images);
        goto fail;
    }
    if (!add_text_piece(m, mem, r->messages, at, strlen(at), at == text ? add_bos : 0, ids, &n, e)) goto fail;
    return n;
fail:
    free(*ids), *ids = NULL;
    return -1;
}

/* As `kettle chat` does: the template writes BOS itself when it wants one. */
static int chat_tokens(const kt_model *m, const char *tmpl, srv_sampled *mem, srv_gen_req *r, int32_t **ids,
                       srv_error *e) {
    char *text = render_chat(m, tmpl, r, e);
    if (!text) return -1;
    r->think = kt_tool_think_state(r->format, text);
    /* a template that never writes the thinking markers (Qwen 2.5 beside
     * Qwen 3 in the Hermes family) is of a model that does not think */
    const char *open = kt_tool_format_think_open(r->format), *tmpl_text = tmpl ? tmpl : kt_model_chat_template(m);
    if (open && tmpl_text && !strstr(tmpl_text, open)) r->think = KT_THINK_DONE;
    const char *var = kt_tool_format_think_var(r->format); /* opt-in thinking, not asked for: none */
    if (var && !json_is_true(json_object_get(r->template_kwargs, var))) r->think = KT_THINK_DONE;
    if (!tools_grammar(m, r, e)) return free(text), -1;
    char bos[64] = "";
    int bos_id = kt_model_describe(m)->bos_id;
    if (bos_id >= 0) kt_token_text(m, bos_id, bos, sizeof bos);
    int add_bos = bos[0] && strncmp(text, bos, strlen(bos)) == 0 ? 0 : -1;
    int n = r->n_images ? image_prompt(m, mem, r, text, add_bos, ids, e) : splice_replies(m, mem, r->messages, text, add_bos, ids, e);
    if (n == 0) n = tokenize_alloc(m, text, add_bos, true, ids, e);
    free(text);
    return n;
}

int srv_prompt_tokens(const kt_model *m, const char *template_text, srv_sampled *sampled, srv_gen_req *r,
                      const srv_vision_env *vis, int32_t **ids, srv_error *e) {
    *ids = NULL;
    if (r->image_urls && !srv_images_load(r, vis, e)) return -1;
    int n = r->kind == SRV_CHAT ? chat_tokens(m, template_text, sampled, r, ids, e)
                                : tokenize_alloc(m, r->prompt, -1, false, ids, e);
    if (n == 0) {
        free(*ids), *ids = NULL;
        return srv_fail(e, 400, INVALID, r->kind == SRV_CHAT ? "messages" : "prompt", NULL,
                        "the prompt is empty (and the model adds no BOS token)"), -1;
    }
    return n;
}

bool srv_gen_special_text(const srv_gen_req *r) {
    if (!r->format || !kt_tool_format_special_text(r->format)) return false;
    /* gpt-oss always: its reply is all channels, parsed into reasoning and
     * content, or with reasoning_format "none" returned as written, which
     * without the markers (<|channel|>, <|message|>, <|end|>, ... are
     * control tokens in o200k) would be the channel names run into the
     * text ("analysisThe user...finalHi") */
    return r->tools_grammar.n_triggers > 0 || !strcmp(kt_tool_format_name(r->format), "gpt-oss");
}

/* The request's name for a kt_gen_params field. */
static const char *field_param(kt_gen_field f, srv_kind kind) {
    switch (f) {
    case KT_FIELD_PROMPT: return kind == SRV_CHAT ? "messages" : "prompt";
    case KT_FIELD_MAX_TOKENS: return "max_tokens";
    case KT_FIELD_N_CHOICES: return "n";
    case KT_FIELD_STOP: return "stop";
    case KT_FIELD_TOP_LOGPROBS: return kind == SRV_CHAT ? "top_logprobs" : "logprobs";
    case KT_FIELD_LOGIT_BIAS: return "logit_bias";
    case KT_FIELD_GRAMMAR: return "grammar";
    default: return NULL;
    }
}

void srv_submit_error(const kt_error *err, kt_gen_field field, srv_kind kind, srv_error *e) {
    if (err->status == KT_ERR_BUSY) {
        srv_fail(e, 503, "server_error", NULL, "server_busy", "%s", err->msg[0] ? err->msg : "the server is busy; retry");
    } else if (err->status == KT_ERR_CONTEXT) {
        srv_fail(e, 400, INVALID, field_param(KT_FIELD_PROMPT, kind), "context_length_exceeded", "%s", err->msg);
    } else if (err->status == KT_ERR_ARG) {
        srv_fail(e, 400, INVALID, field_param(field, kind), NULL, "%s", err->msg);
    } else {
        srv_fail(e, 500, "server_error", NULL, NULL, "%s", err->msg[0] ? err->msg : "the engine failed");
    }
}

/* ---- buffers ---- */

bool srv_buf_append(srv_buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d) return false;
        b->data = d, b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
    return true;
}

bool srv_buf_sse(srv_buf *b, json_t *j) {
    char *s = j ? kt_json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    bool ok = s && srv_buf_append(b, "data: ", 6) && srv_buf_append(b, s, strlen(s)) && srv_buf_append(b, "\n\n", 2);
    free(s);
    return ok;
}

void srv_buf_free(srv_buf *b) {
    free(b->data);
    *b = (srv_buf){0};
}

/* ---- JSON nesting ---- */

int srv_json_depth(const char *s, size_t n) {
    int depth = 0, max = 0;
    bool in_string = false;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (in_string) {
            if (ch == '\\') i++; /* the escaped byte cannot end the string */
            else if (ch == '"') in_string = false;
        } else if (ch == '"') {
            in_string = true;
        } else if (ch == '{' || ch == '[') {
            if (++depth > max) max = depth;
        } else if ((ch == '}' || ch == ']') && depth > 0) {
            depth--;
        }
    }
    return max;
}

/* ---- UTF-8 and tokens ---- */

bool srv_utf8_valid(const char *s, size_t n) {
    return kt_utf8_valid(s, n, NULL);
}

/* The token decoded alone (what it adds to the text); control tokens,
 * which decode to nothing, show their vocabulary text. */
static bool token_bytes(const kt_model *m, int32_t token, srv_buf *b) {
    kt_detok *d = kt_detok_new(m);
    if (!d) return false;
    const char *a = kt_detok_push(d, token);
    bool ok = srv_buf_append(b, a, strlen(a));
    const char *rest = kt_detok_flush(d);
    ok = ok && srv_buf_append(b, rest, strlen(rest));
    kt_detok_free(d);
    if (ok && b->len == 0) {
        char piece[256];
        int n = kt_token_text(m, token, piece, sizeof piece);
        if (n > 0 && n < (int)sizeof piece && srv_utf8_valid(piece, (size_t)n)) ok = srv_buf_append(b, piece, (size_t)n);
    }
    return ok;
}

json_t *srv_token_json(const kt_model *m, int32_t token, json_t **bytes) {
    srv_buf b = {0};
    json_t *s = NULL;
    if (token_bytes(m, token, &b)) s = json_stringn(b.data ? b.data : "", b.len);
    if (s && bytes) {
        *bytes = json_array();
        for (size_t i = 0; *bytes && i < b.len; i++) /* out of memory: no array, rather than one missing bytes */
            if (json_array_append_new(*bytes, json_integer((unsigned char)b.data[i]))) json_decref(*bytes), *bytes = NULL;
        if (!*bytes) json_decref(s), s = NULL;
    }
    srv_buf_free(&b);
    return s;
}

/* ---- /tokenize, /detokenize ---- */

json_t *srv_tokenize(const kt_model *m, json_t *body, srv_error *e) {
    json_t *content = json_object_get(body, "content");
    bool add_special = true, with_pieces = false;
    if (!json_is_string(content))
        return srv_fail(e, 400, INVALID, "content", NULL, "'content' must be a string"), NULL;
    if (!read_bool(body, "add_special", &add_special, e) || !read_bool(body, "with_pieces", &with_pieces, e)) return NULL;
    kt_error err = {0};
    const char *text = json_string_value(content);
    size_t len = json_string_length(content);
    int n = kt_tokenize(m, text, len, NULL, 0, add_special ? -1 : 0, &err);
    int32_t *ids = n >= 0 ? malloc(sizeof(int32_t) * ((size_t)n + 1)) : NULL;
    if (ids) n = kt_tokenize(m, text, len, ids, n, add_special ? -1 : 0, &err);
    json_t *arr = ids && n >= 0 ? json_array() : NULL;
    for (int i = 0; arr && i < n; i++) json_array_append_new(arr, json_integer(ids[i]));
    free(ids);
    if (!arr) return srv_fail(e, n < 0 ? 400 : 500, INVALID, "content", NULL, "%s", n < 0 ? err.msg : "out of memory"), NULL;
    return json_pack("{s:o}", "tokens", arr);
}

/* True for SentencePiece-style vocabularies, which tokenize "a" as "▁a":
 * /detokenize then drops the one leading space the tokenizer added, so
 * that detokenize(tokenize(text)) == text. */
static bool adds_prefix_space(const kt_model *m) {
    int32_t ids[4];
    int n = kt_tokenize(m, "a", 1, ids, 4, 0, NULL);
    if (n != 1) return false;
    json_t *t = srv_token_json(m, ids[0], NULL);
    bool yes = t && !strcmp(json_string_value(t), " a");
    json_decref(t);
    return yes;
}

json_t *srv_detokenize(const kt_model *m, json_t *body, srv_error *e) {
    json_t *tokens = json_object_get(body, "tokens");
    int n_vocab = kt_model_describe(m)->n_vocab;
    if (!json_is_array(tokens))
        return srv_fail(e, 400, INVALID, "tokens", NULL, "'tokens' must be an array of token ids"), NULL;
    size_t i;
    json_t *t;
    json_array_foreach(tokens, i, t) {
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= n_vocab)
            return srv_fail(e, 400, INVALID, "tokens", NULL, "'tokens[%zu]' is not a token id (0..%d)", i, n_vocab - 1), NULL;
    }
    kt_detok *d = kt_detok_new(m);
    srv_buf b = {0};
    bool ok = d != NULL;
    json_array_foreach(tokens, i, t) {
        const char *s = ok ? kt_detok_push(d, (int32_t)json_integer_value(t)) : "";
        ok = ok && srv_buf_append(&b, s, strlen(s));
    }
    const char *rest = ok ? kt_detok_flush(d) : "";
    ok = ok && srv_buf_append(&b, rest, strlen(rest));
    size_t skip = ok && b.len && b.data[0] == ' ' && adds_prefix_space(m) ? 1 : 0;
    json_t *out = ok ? json_pack("{s:s%}", "content", b.data ? b.data + skip : "", b.len - skip) : NULL;
    kt_detok_free(d);
    srv_buf_free(&b);
    if (!out) srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    return out;
}
