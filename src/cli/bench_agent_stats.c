/*
 * bench_agent_stats.c - the figures of `kettle bench agent` from its
 * per-turn records: TTFT percentiles per turn index and for first vs
 * later turns (what a prefix cache should change: later turns re-send a
 * history the server has seen), task time per session, and token totals.
 * Percentiles are bench serve's nearest-rank ones (bench_serve_stats.c):
 * every figure is a latency that was actually observed. See bench_agent.h.
 */
#include <stdlib.h>
#include <string.h>

#include "cli/bench_agent.h"

bool ba_result_init(ba_result *r, const char *target, const ba_workload *w, int rounds) {
    *r = (ba_result){.target = target, .peak_rss = -1, .n_sess = rounds * w->n};
    r->sess = calloc((size_t)r->n_sess, sizeof *r->sess);
    if (!r->sess) return false;
    for (int k = 0; k < r->n_sess; k++) {
        const ba_session *s = &w->s[k % w->n];
        ba_sess_rec *sr = &r->sess[k];
        *sr = (ba_sess_rec){.round = k / w->n + 1, .session = k % w->n + 1, .name = s->name, .n_turns = s->n_turns};
        if (!(sr->turns = calloc((size_t)s->n_turns, sizeof *sr->turns))) return ba_result_free(r), false;
    }
    return true;
}

void ba_result_free(ba_result *r) {
    for (int k = 0; r->sess && k < r->n_sess; k++) free(r->sess[k].turns);
    free(r->sess);
    r->sess = NULL, r->n_sess = 0;
}

static int most_turns(const ba_result *r) {
    int n = 0;
    for (int k = 0; k < r->n_sess; k++)
        if (r->sess[k].n_turns > n) n = r->sess[k].n_turns;
    return n;
}

/* Turn index t (0-based) across all sessions; v holds n_sess doubles. */
static void per_turn(const ba_result *r, int t, double *v, double *w, ba_turn_stats *ts) {
    long long prompt = 0, cached = 0;
    *ts = (ba_turn_stats){0};
    for (int k = 0; k < r->n_sess; k++) {
        if (t >= r->sess[k].n_turns) continue;
        const ba_turn_rec *tr = &r->sess[k].turns[t];
        v[ts->n] = tr->ttft_ms, w[ts->n] = tr->turn_ms;
        ts->n++;
        prompt += tr->prompt_tokens > 0 ? tr->prompt_tokens : 0;
        if (tr->cached_tokens >= 0) cached += tr->cached_tokens, ts->n_cached++;
    }
    ts->ttft_ms = bs_pcts_of(v, ts->n);
    ts->turn_ms = bs_pcts_of(w, ts->n);
    ts->prompt_mean = ts->n ? (double)prompt / ts->n : 0;
    ts->cached_mean = ts->n_cached ? (double)cached / ts->n_cached : 0;
}

/* A JSON value of the JSON Schema type name `type`. */
static bool of_type(const json_t *v, const char *type) {
    if (!strcmp(type, "string")) return json_is_string(v);
    if (!strcmp(type, "integer")) return json_is_integer(v);
    if (!strcmp(type, "number")) return json_is_number(v);
    if (!strcmp(type, "boolean")) return json_is_boolean(v);
    if (!strcmp(type, "object")) return json_is_object(v);
    if (!strcmp(type, "array")) return json_is_array(v);
    if (!strcmp(type, "null")) return json_is_null(v);
    return true; /* a type this check does not know: not judged */
}

static bool args_valid(const json_t *params, const json_t *args) {
    if (!json_is_object(args)) return false;
    const json_t *props = json_object_get(params, "properties"), *req = json_object_get(params, "required");
    size_t i;
    json_t *r;
    json_array_foreach(req, i, r) if (json_is_string(r) && !json_object_get(args, json_string_value(r))) return false;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)args, k, v) {
        const json_t *prop = json_object_get(props, k), *ty = json_object_get(prop, "type");
        if (!prop && json_is_false(json_object_get(params, "additionalProperties"))) return false;
        if (json_is_string(ty) && !of_type(v, json_string_value(ty))) return false;
    }
    return true;
}

bool ba_calls_valid(const json_t *tools, const json_t *calls) {
    size_t i, j;
    json_t *c, *t;
    json_array_foreach(calls, i, c) {
        const json_t *fn = json_object_get(c, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        const char *args = json_string_value(json_object_get(fn, "arguments"));
        const json_t *params = NULL;
        bool offered = false;
        json_array_foreach(tools, j, t) {
            const json_t *tf = json_object_get(t, "function");
            const char *tn = json_string_value(json_object_get(tf, "name"));
            if (name && tn && !strcmp(name, tn)) offered = true, params = json_object_get(tf, "parameters");
        }
        json_t *parsed = offered && args ? json_loads(args, 0, NULL) : NULL;
        bool ok = parsed && args_valid(params, parsed);
        json_decref(parsed);
        if (!ok) return false;
    }
    return true;
}

/* Token totals and decode speed over every turn. */
static void totals(const ba_result *r, ba_summary *s) {
    double decode_ms = 0;
    long long after_first = 0;
    for (int k = 0; k < r->n_sess; k++)
        for (int t = 0; t < r->sess[k].n_turns; t++) {
            const ba_turn_rec *tr = &r->sess[k].turns[t];
            s->n_turns_total++;
            s->prompt_tokens += tr->prompt_tokens > 0 ? tr->prompt_tokens : 0;
            if (tr->cached_tokens >= 0) s->cached_tokens += tr->cached_tokens, s->n_cached++;
            s->decode_tokens += tr->completion_tokens;
            if (tr->n_calls) s->n_call_turns++, s->n_valid_call_turns += tr->calls_valid;
            if (tr->completion_tokens > 1) after_first += tr->completion_tokens - 1, decode_ms += tr->decode_ms;
        }
    s->prefill_tokens = s->prompt_tokens - s->cached_tokens;
    s->decode_tokens_per_s = decode_ms > 0 ? after_first / (decode_ms / 1e3) : 0;
}

/* TTFT of first turns and of later ones (turn >= 2), and task times. */
static bool first_later_task(const ba_result *r, ba_summary *s) {
    double *first = malloc(sizeof(double) * (size_t)(r->n_sess + 1));
    double *later = malloc(sizeof(double) * (size_t)(s->n_turns_total + 1));
    double *task = malloc(sizeof(double) * (size_t)(r->n_sess + 1));
    bool ok = first && later && task;
    int nf = 0, nl = 0;
    for (int k = 0; ok && k < r->n_sess; k++) {
        const ba_sess_rec *sr = &r->sess[k];
        for (int t = 0; t < sr->n_turns; t++) {
            if (t == 0) first[nf++] = sr->turns[t].ttft_ms;
            else later[nl++] = sr->turns[t].ttft_ms;
        }
        task[k] = sr->task_ms;
    }
    if (ok) {
        s->ttft_first_ms = bs_pcts_of(first, nf);
        s->ttft_later_ms = bs_pcts_of(later, nl);
        s->task_ms = bs_pcts_of(task, r->n_sess);
    }
    free(first), free(later), free(task);
    return ok;
}

bool ba_summarize(const ba_result *r, ba_summary *s) {
    *s = (ba_summary){.n_turns = most_turns(r), .peak_rss = r->peak_rss};
    s->per_turn = calloc((size_t)(s->n_turns ? s->n_turns : 1), sizeof *s->per_turn);
    double *v = malloc(sizeof(double) * (size_t)(r->n_sess + 1)), *w = malloc(sizeof(double) * (size_t)(r->n_sess + 1));
    bool ok = s->per_turn && v && w;
    for (int t = 0; ok && t < s->n_turns; t++) per_turn(r, t, v, w, &s->per_turn[t]);
    free(v), free(w);
    if (ok) totals(r, s);
    ok = ok && first_later_task(r, s);
    if (!ok) ba_summary_free(s);
    return ok;
}

void ba_summary_free(ba_summary *s) {
    free(s->per_turn);
    s->per_turn = NULL, s->n_turns = 0;
}

void ba_ratios(const ba_report *r, int i, double *task_p50, double *ttft_later_p50) {
    const ba_summary *a = &r->sums[0], *b = &r->sums[i];
    *task_p50 = a->task_ms.p50 > 0 ? b->task_ms.p50 / a->task_ms.p50 : 0;
    *ttft_later_p50 = a->ttft_later_ms.p50 > 0 ? b->ttft_later_ms.p50 / a->ttft_later_ms.p50 : 0;
}
