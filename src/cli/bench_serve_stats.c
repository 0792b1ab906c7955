/*
 * bench_serve_stats.c - the network-free half of `kettle bench serve`: an
 * incremental parser for a streamed completion (server-sent events) that
 * timestamps each token chunk, and nearest-rank percentiles. See
 * bench_serve.h.
 *
 * Bytes arrive in arbitrary pieces (a chunk can be split anywhere, or
 * several can come in one read), so the parser keeps the incomplete last
 * line and handles each complete line as it ends.
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli/bench_serve.h"

void bs_sse_init(bs_sse *s) {
    *s = (bs_sse){.completion_tokens = -1, .prompt_tokens = -1};
}

void bs_sse_free(bs_sse *s) {
    free(s->line);
    free(s->tok_ms);
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

/* True if a choice carries generated text: "text" (completions) or
 * "delta": {"content"} (chat). Counts its finish_reason. */
static bool choice_has_text(bs_sse *s, json_t *c) {
    json_t *fr = json_object_get(c, "finish_reason");
    if (json_is_string(fr)) {
        snprintf(s->finish, sizeof s->finish, "%s", json_string_value(fr));
        if (!strcmp(json_string_value(fr), "length")) s->n_length++;
        else s->n_stop++;
    }
    json_t *t = json_object_get(c, "text");
    if (!t) t = json_object_get(json_object_get(c, "delta"), "content");
    return json_is_string(t) && json_string_length(t) > 0;
}

static void read_usage(bs_sse *s, json_t *u) {
    json_t *ct = json_object_get(u, "completion_tokens"), *pt = json_object_get(u, "prompt_tokens");
    if (json_is_integer(ct)) s->completion_tokens = (int)json_integer_value(ct);
    if (json_is_integer(pt)) s->prompt_tokens = (int)json_integer_value(pt);
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
    json_array_foreach(choices, i, c) text |= choice_has_text(s, c);
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
    return (bs_pcts){bs_percentile(v, n, 50), bs_percentile(v, n, 95), bs_percentile(v, n, 99), n};
}
