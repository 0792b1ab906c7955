/*
 * dialect.c - what the Responses and Messages dialects share (see
 * dialect.h): chat-chunk deltas turned into output blocks, SSE events with
 * a name, and small JSON helpers for the request rewrites.
 */
#include "server/dialect.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json_safe.h"

/* ---- blocks ---- */

static bool block_close(srv_blocks *bs, const srv_block_ops *ops, void *ctx) {
    if (!bs->open) return true;
    bs->open = false;
    bool ok = ops->close(ctx, &bs->cur);
    srv_buf_free(&bs->cur.text);
    return ok;
}

static bool block_open(srv_blocks *bs, srv_block_kind kind, const char *id, const char *name, const srv_block_ops *ops,
                       void *ctx) {
    if (!block_close(bs, ops, ctx)) return false;
    bs->cur = (srv_block){.kind = kind, .index = bs->n_blocks++};
    snprintf(bs->cur.call_id, sizeof bs->cur.call_id, "%s", id ? id : "");
    snprintf(bs->cur.name, sizeof bs->cur.name, "%s", name ? name : "");
    bs->open = true;
    return ops->open(ctx, &bs->cur);
}

/* Text of `kind` for the open block of that kind (opening it if needed). */
static bool block_text(srv_blocks *bs, srv_block_kind kind, json_t *s, const srv_block_ops *ops, void *ctx) {
    size_t n = json_string_length(s);
    if (!n) return true; /* the role chunk's "" opens nothing */
    if ((!bs->open || bs->cur.kind != kind) && !block_open(bs, kind, NULL, NULL, ops, ctx)) return false;
    const char *t = json_string_value(s);
    return srv_buf_append(&bs->cur.text, t, n) && ops->delta(ctx, &bs->cur, t, n);
}

/* tool_calls[0]: with an id a new call opens, then its arguments grow. */
static bool block_call(srv_blocks *bs, json_t *call, const srv_block_ops *ops, void *ctx) {
    json_t *fn = json_object_get(call, "function"), *id = json_object_get(call, "id");
    json_t *args = json_object_get(fn, "arguments");
    if (json_is_string(id) &&
        !block_open(bs, SRV_BLOCK_CALL, json_string_value(id), json_string_value(json_object_get(fn, "name")), ops, ctx))
        return false;
    if (!bs->open || bs->cur.kind != SRV_BLOCK_CALL || !json_string_length(args)) return true;
    const char *t = json_string_value(args);
    size_t n = json_string_length(args);
    return srv_buf_append(&bs->cur.text, t, n) && ops->delta(ctx, &bs->cur, t, n);
}

bool srv_blocks_feed(srv_blocks *bs, json_t *chunk, const srv_block_ops *ops, void *ctx) {
    json_t *choice = json_array_get(json_object_get(chunk, "choices"), 0);
    if (!choice) return true; /* the usage chunk */
    json_t *delta = json_object_get(choice, "delta"), *finish = json_object_get(choice, "finish_reason");
    json_t *reasoning = json_object_get(delta, "reasoning_content"), *content = json_object_get(delta, "content");
    json_t *calls = json_object_get(delta, "tool_calls");
    bool ok = (!json_is_string(reasoning) || block_text(bs, SRV_BLOCK_REASONING, reasoning, ops, ctx)) &&
              (!json_is_string(content) || block_text(bs, SRV_BLOCK_TEXT, content, ops, ctx));
    size_t i;
    json_t *call;
    json_array_foreach(calls, i, call) ok = ok && block_call(bs, call, ops, ctx);
    if (ok && json_is_string(finish)) {
        snprintf(bs->finish, sizeof bs->finish, "%s", json_string_value(finish));
        ok = block_close(bs, ops, ctx);
    }
    return ok;
}

bool srv_blocks_close(srv_blocks *bs, const srv_block_ops *ops, void *ctx) { return block_close(bs, ops, ctx); }

void srv_blocks_free(srv_blocks *bs) {
    srv_buf_free(&bs->cur.text);
    bs->open = false;
}

/* ---- shared helpers ---- */

bool srv_buf_event(srv_buf *b, const char *name, json_t *j) {
    char *s = j ? kt_json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    bool ok = s && srv_buf_append(b, "event: ", 7) && srv_buf_append(b, name, strlen(name)) &&
              srv_buf_append(b, "\ndata: ", 7) && srv_buf_append(b, s, strlen(s)) && srv_buf_append(b, "\n\n", 2);
    free(s);
    return ok;
}

bool srv_copy_field(json_t *chat, json_t *body, const char *key) {
    json_t *v = json_object_get(body, key);
    return !v || json_is_null(v) || !json_object_set(chat, key, v);
}

static bool type_in(const char *t, const char *const *types) {
    for (int i = 0; t && types[i]; i++)
        if (!strcmp(t, types[i])) return true;
    return false;
}

json_t *srv_parts_text(json_t *content, const char *const *types, const char *where, srv_error *e) {
    if (json_is_string(content)) return json_incref(content);
    if (!json_is_array(content)) {
        srv_fail(e, 400, "invalid_request_error", where, NULL, "'%s' must be a string or an array of text parts", where);
        return NULL;
    }
    srv_buf b = {0};
    size_t i;
    json_t *p;
    json_array_foreach(content, i, p) {
        const char *t = json_string_value(json_object_get(p, "type"));
        json_t *text = json_object_get(p, "text");
        if (!type_in(t, types) || !json_is_string(text)) {
            srv_buf_free(&b);
            srv_fail(e, 400, "invalid_request_error", where, "unsupported_content",
                     "'%s[%zu]' is a part of type '%.40s'; only text parts (type '%s') are supported: kettle "
                     "serves text models",
                     where, i, t ? t : "(none)", types[0]);
            return NULL;
        }
        if ((i && !srv_buf_append(&b, SRV_TEXT_PART_SEP, strlen(SRV_TEXT_PART_SEP))) ||
            !srv_buf_append(&b, json_string_value(text), json_string_length(text))) {
            srv_buf_free(&b);
            srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
            return NULL;
        }
    }
    json_t *s = json_stringn(b.data ? b.data : "", b.len);
    srv_buf_free(&b);
    return s;
}

/* An image part of any of the three APIs as an OpenAI chat image_url
 * part (new reference); NULL if p is not an image part. Anthropic's
 * {"type": "image", "source": {"type": "base64", "media_type", "data"}}
 * (or a "url" source), the Responses API's {"type": "input_image",
 * "image_url": "..."} and chat's own {"type": "image_url", ...}. *bad
 * is set (with e) when p is an image part that cannot be taken. */
json_t *srv_image_part(json_t *p, const char *where, size_t i, bool *bad, srv_error *e) {
    const char *t = json_string_value(json_object_get(p, "type"));
    *bad = false;
    if (!t) return NULL;
    if (!strcmp(t, "image_url")) return json_incref(p);
    if (!strcmp(t, "input_image")) {
        json_t *u = json_object_get(p, "image_url");
        if (json_is_string(u)) return json_pack("{s:s, s:{s:O}}", "type", "image_url", "image_url", "url", u);
        *bad = true;
        srv_fail(e, 400, "invalid_request_error", where, "unsupported_content", "'%s[%zu]' (input_image) needs an "
                 "'image_url' (a data: URL); kettle keeps no files, so 'file_id' cannot name one", where, i);
        return NULL;
    }
    if (strcmp(t, "image")) return NULL;
    json_t *src = json_object_get(p, "source");
    const char *st = json_string_value(json_object_get(src, "type"));
    json_t *mt = json_object_get(src, "media_type"), *data = json_object_get(src, "data");
    if (st && !strcmp(st, "base64") && json_is_string(mt) && json_is_string(data)) {
        char *url = malloc(json_string_length(mt) + json_string_length(data) + 16);
        if (!url) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory"), *bad = true, NULL;
        int n = sprintf(url, "data:%s;base64,", json_string_value(mt));
        memcpy(url + n, json_string_value(data), json_string_length(data));
        json_t *part = json_pack("{s:s, s:{s:s%}}", "type", "image_url", "image_url", "url", url,
                                 (size_t)n + json_string_length(data));
        free(url);
        if (!part) srv_fail(e, 500, "server_error", NULL, NULL, "out of memory"), *bad = true;
        return part;
    }
    if (st && !strcmp(st, "url") && json_is_string(json_object_get(src, "url")))
        return json_pack("{s:s, s:{s:O}}", "type", "image_url", "image_url", "url", json_object_get(src, "url"));
    *bad = true;
    srv_fail(e, 400, "invalid_request_error", where, "unsupported_content", "'%s[%zu]' (image) needs a source "
             "{\"type\": \"base64\", \"media_type\", \"data\"}", where, i);
    return NULL;
}

json_t *srv_parts_chat(json_t *content, const char *const *types, const char *where, srv_error *e) {
    bool any_image = false, bad = false;
    size_t i;
    json_t *p;
    json_array_foreach(content, i, p) {
        json_t *img = json_is_array(content) ? srv_image_part(p, where, i, &bad, e) : NULL;
        if (bad) return NULL;
        any_image |= img != NULL;
        json_decref(img);
    }
    if (!any_image) return srv_parts_text(content, types, where, e);
    json_t *parts = json_array();
    json_array_foreach(content, i, p) {
        const char *t = json_string_value(json_object_get(p, "type"));
        json_t *text = json_object_get(p, "text");
        json_t *part = srv_image_part(p, where, i, &bad, e);
        if (!part && !bad && type_in(t, types) && json_is_string(text))
            part = json_pack("{s:s, s:O}", "type", "text", "text", text);
        else if (!part && !bad)
            srv_fail(e, 400, "invalid_request_error", where, "unsupported_content",
                     "'%s[%zu]' is a part of type '%.40s'; only text and image parts are supported", where, i,
                     t ? t : "(none)");
        if (!part || !parts || json_array_append_new(parts, part)) {
            if (part && !parts) json_decref(part);
            if (!parts || (part && !bad)) srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
            json_decref(parts);
            return NULL;
        }
    }
    return parts;
}

json_t *srv_args_object(const char *s, size_t n, bool *oom) {
    json_error_t je;
    json_t *j = kt_json_loadb(s, n, JSON_DECODE_ANY, &je);
    *oom = !j && json_error_code(&je) == json_error_out_of_memory;
    if (j && !json_is_object(j)) json_decref(j), j = NULL;
    return j;
}
