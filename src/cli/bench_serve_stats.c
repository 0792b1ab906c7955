/*
 * bench_serve_stats.c - the network-free half of `kettle bench serve`: an
 * incremental parser for a streamed completion (server-sent events) that
 * timestamps each token chunk, and nearest-rank percentiles. See
 * bench_serve.h.
 *
 * Bytes arrive in arbitrary pieces (a chunk can be split anywhere, or
 * several can come in one read), so the parser keeps the incomplete last
 * line and handles each complete line as it ends. With keep_text it also
 * keeps what was generated (text and streamed tool calls), which
 * `kettle bench agent` sends back to the server in the next turn.
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli/bench_serve.h"

void bs_sse_init(bs_sse *s) {
    *s = (bs_sse){.completion_tokens = -1, .prompt_tokens = -1, .cached_tokens = -1};
}

void bs_sse_free(bs_sse *s) {
    free(s->line);
    free(s->tok_ms);
    free(s->text);
    json_decref(s->tool_calls);
    bs_sse_init(s);
}

static bool fail(bs_sse *s, const char *msg) {
    if (!s->error[0]) snprintf(s->error, sizeof s->error, "%s", msg);
    return false;
}

static bool push_token(bs_sse *s, double t_ms) {
    if (s->n_tok == s->tok_cap) {
        int cap = s->tok_cap ? 2 * s->tok_cap : 64;
        double *p = realloc(s->tok_ms, sizeof *p * (size_t)cap);
        if (!p) return fail(s, "out of memory");
        s->tok_ms = p, s->tok_cap = cap;
    }
    s->tok_ms[s->n_tok++] = t_ms;
    return true;
}

static bool append_text(bs_sse *s, const char *p, size_t n) {
    if (s->text_len + n + 1 > s->text_cap) {
        size_t cap = s->text_cap ? s->text_cap : 256;
        while (cap < s->text_len + n + 1) cap *= 2;
        char *q = realloc(s->text, cap);
        if (!q) return fail(s, "out of memory");
        s->text = q, s->text_cap = cap;
    }
    memcpy(s->text + s->text_len, p, n);
    s->text_len += n;
    s->text[s->text_len] = 0;
    return true;
}

/* Appends the string `piece` (if it is one) to obj[key], a string. */
static bool append_field(json_t *obj, const char *key, json_t *piece) {
    if (!json_is_string(piece) || !json_string_length(piece)) return true;
    json_t *old = json_object_get(obj, key);
    size_t a = json_string_length(old), b = json_string_length(piece);
    char *joined = malloc(a + b + 1);
    if (!joined) return false;
    memcpy(joined, json_string_value(old), a);
    memcpy(joined + a, json_string_value(piece), b);
    joined[a + b] = 0;
    bool ok = !json_object_set_new(obj, key, json_stringn(joined, a + b));
    free(joined);
    return ok;
}

/* The call at `index` of s->tool_calls, made (empty) if it is new. */
static json_t *tool_call_at(bs_sse *s, size_t index) {
    if (!s->tool_calls && !(s->tool_calls = json_array())) return NULL;
    while (json_array_size(s->tool_calls) <= index) {
        json_t *c = json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", "", "type", "function", "function", "name", "",
                              "arguments", "");
        if (!c || json_array_append_new(s->tool_calls, c)) return NULL;
    }
    return json_array_get(s->tool_calls, index);
}

/* Merges streamed tool-call pieces ({"index", "id"?, "function": {"name"?,
 * "arguments"?}}) into s->tool_calls: ids and names come once, the
 * arguments in pieces. */
static bool merge_tool_calls(bs_sse *s, json_t *calls) {
    size_t i;
    json_t *d;
    json_array_foreach(calls, i, d) {
        json_t *ix = json_object_get(d, "index"), *fn = json_object_get(d, "function");
        json_int_t k = json_is_integer(ix) ? json_integer_value(ix) : (json_int_t)i;
        if (k < 0 || k >= 64) return fail(s, "a tool_calls delta has an index outside 0..63");
        json_t *c = tool_call_at(s, (size_t)k), *cf = json_object_get(c, "function");
        if (!c || !append_field(c, "id", json_object_get(d, "id")) ||
            !append_field(cf, "name", json_object_get(fn, "name")) ||
            !append_field(cf, "arguments", json_object_get(fn, "arguments")))
            return fail(s, "out of memory");
    }
    return true;
}

/* Whether a choice carries generated output: "text" (completions),
 * "delta": {"content"} or {"tool_calls"} (chat); kept with keep_text.
 * Counts its finish_reason. -1: out of memory (s->error set). */
static int choice_has_text(bs_sse *s, json_t *c) {
    json_t *fr = json_object_get(c, "finish_reason");
    if (json_is_string(fr)) {
        snprintf(s->finish, sizeof s->finish, "%s", json_string_value(fr));
        if (!strcmp(json_string_value(fr), "length")) s->n_length++;
        else s->n_stop++;
    }
    json_t *t = json_object_get(c, "text"), *delta = json_object_get(c, "delta");
    if (!t) t = json_object_get(delta, "content");
    json_t *calls = json_object_get(delta, "tool_calls");
    bool has_text = json_is_string(t) && json_string_length(t) > 0;
    bool has_calls = json_is_array(calls) && json_array_size(calls) > 0;
    if (s->keep_text && has_text && !append_text(s, json_string_value(t), json_string_length(t))) return -1;
    if (s->keep_text && has_calls && !merge_tool_calls(s, calls)) return -1;
    return has_text || has_calls;
}

static void read_usage(bs_sse *s, json_t *u) {
    json_t *ct = json_object_get(u, "completion_tokens"), *pt = json_object_get(u, "prompt_tokens");
    json_t *cached = json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens");
    if (json_is_integer(ct)) s->completion_tokens = (int)json_integer_value(ct);
    if (json_is_integer(pt)) s->prompt_tokens = (int)json_integer_value(pt);
    if (json_is_integer(cached)) s->cached_tokens = (int)json_integer_value(cached);
}

/* One chunk's JSON: an error object, or choices and perhaps usage. */
static bool handle_chunk(bs_sse *s, json_t *doc, double t_ms) {
    json_t *err = json_object_get(doc, "error");
    if (err) {
        const char *m = json_string_value(json_object_get(err, "message"));
        snprintf(s->error, sizeof s->error, "error in stream: %s", m ? m : "(no message)");
        return false;
    }
    json_t *choices = json_object_get(doc, "choices"), *c;
    size_t i;
    bool text = false;
    json_array_foreach(choices, i, c) {
        int r = choice_has_text(s, c);
        if (r < 0) return false;
        text |= r > 0;
    }
    json_t *u = json_object_get(doc, "usage");
    if (json_is_object(u)) read_usage(s, u);
    return text ? push_token(s, t_ms) : true;
}

/* One complete line (without its end of line). */
static bool handle_line(bs_sse *s, const char *line, size_t len, double t_ms) {
    if (len < 5 || memcmp(line, "data:", 5) != 0) return true; /* blank, comment, event:, id: */
    line += 5, len -= 5;
    while (len && *line == ' ') line++, len--;
    if (len == 6 && !memcmp(line, "[DONE]", 6)) {
        s->done = true;
        return true;
    }
    if (s->done) return fail(s, "data after [DONE]");
    json_error_t jerr;
    json_t *doc = json_loadb(line, len, 0, &jerr);
    if (!json_is_object(doc)) {
        json_decref(doc);
        snprintf(s->error, sizeof s->error, "a data line is not a JSON object (%.60s): %.*s", jerr.text,
                 (int)(len < 80 ? len : 80), line);
        return false;
    }
    bool ok = handle_chunk(s, doc, t_ms);
    json_decref(doc);
    return ok;
}

static bool append_line(bs_sse *s, const char *p, size_t n) {
    if (s->line_len + n + 1 > s->line_cap) {
        size_t cap = s->line_cap ? s->line_cap : 1024;
        while (cap < s->line_len + n + 1) cap *= 2;
        char *q = realloc(s->line, cap);
        if (!q) return fail(s, "out of memory");
        s->line = q, s->line_cap = cap;
    }
    memcpy(s->line + s->line_len, p, n);
    s->line_len += n;
    return true;
}

bool bs_sse_feed(bs_sse *s, const char *data, size_t len, double t_ms) {
    if (s->error[0]) return false;
    while (len) {
        const char *nl = memchr(data, '\n', len);
        size_t n = nl ? (size_t)(nl - data) : len;
        if (!append_line(s, data, n)) return false;
        data += n, len -= n;
        if (!nl) break;
        data++, len--;
        size_t ll = s->line_len;
        if (ll && s->line[ll - 1] == '\r') ll--;
        s->line_len = 0;
        if (!handle_line(s, s->line, ll, t_ms)) return false;
    }
    return true;
}

/* ---- statistics ---- */

double bs_percentile(const double *sorted, int n, double p) {
    if (n <= 0) return 0;
    long rank = (long)ceil(p * n / 100.0); /* 1-based; p * n first keeps 95 * 20 / 100 exact */
    if (rank < 1) rank = 1;
    if (rank > n) rank = n;
    return sorted[rank - 1];
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void bs_sort(double *v, int n) {
    if (n > 1) qsort(v, (size_t)n, sizeof *v, cmp_double);
}

bs_pcts bs_pcts_of(double *v, int n) {
    bs_sort(v, n);
    return (bs_pcts){bs_percentile(v, n, 50), bs_percentile(v, n, 95), bs_percentile(v, n, 99), n > 0 ? v[n - 1] : 0.0,
                     n};
}
