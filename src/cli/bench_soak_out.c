/*
 * bench_soak_out.c - `kettle bench soak`'s figures: counts by kind,
 * outcome and status, latency percentiles, the server's RSS and KV series,
 * the verdict, and the reports (Markdown, or one JSON document). See
 * bench_soak.h.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli/bench_soak.h"

/* ---- counts and samples ---- */

static bool push(sk_samples *s, double v) {
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 256;
        double *p = realloc(s->v, sizeof *p * (size_t)cap);
        if (!p) return false;
        s->v = p, s->cap = cap;
    }
    s->v[s->n++] = v;
    return true;
}

static void count_status(sk_stats *s, long status) {
    int i = 0;
    while (i < s->n_statuses && s->status_code[i] != status) i++;
    if (i == SK_MAX_STATUSES) return; /* more distinct statuses than a server has: the rest uncounted here */
    if (i == s->n_statuses) s->status_code[s->n_statuses++] = status;
    s->status_n[i]++;
}

bool sk_stats_add(sk_stats *s, const sk_request *r, long status, sk_outcome o, bool cut, double lat_ms,
                  double ttft_ms) {
    sk_kind_stats *k = &s->kinds[r->kind];
    k->n++, s->n_requests++;
    k->by_outcome[o]++;
    k->n_cut += cut;
    count_status(s, status);
    if (o != SK_OK) return true; /* latencies of what worked only: a failure's time says nothing */
    return push(&k->lat_ms, lat_ms) && (ttft_ms < 0 || push(&k->ttft_ms, ttft_ms));
}

bool sk_stats_add_sample(sk_stats *s, const sk_sample *x) {
    if (s->n_samples == s->cap_samples) {
        int cap = s->cap_samples ? 2 * s->cap_samples : 64;
        sk_sample *p = realloc(s->samples, sizeof *p * (size_t)cap);
        if (!p) return false;
        s->samples = p, s->cap_samples = cap;
    }
    s->samples[s->n_samples++] = *x;
    return true;
}

void sk_stats_free(sk_stats *s) {
    for (int k = 0; k < SK_N_KINDS; k++) free(s->kinds[k].lat_ms.v), free(s->kinds[k].ttft_ms.v);
    free(s->samples);
    memset(s, 0, sizeof *s);
}

double sk_rss_growth_pct(const sk_sample *s, int n, double duration_s) {
    const sk_sample *first = NULL, *last = NULL;
    for (int i = 0; i < n; i++) {
        if (s[i].t_s < duration_s / 2 || s[i].rss_bytes <= 0) continue;
        if (!first) first = &s[i];
        last = &s[i];
    }
    if (!first || first == last) return NAN;
    return 100.0 * (double)(last->rss_bytes - first->rss_bytes) / (double)first->rss_bytes;
}

bool sk_metric_sum(const char *text, const char *name, double *out) {
    size_t n = strlen(name);
    bool found = false;
    *out = 0;
    for (const char *line = text; line && *line; line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
        if (strncmp(line, name, n) || (line[n] != ' ' && line[n] != '{')) continue;
        const char *v = line + n;
        if (*v == '{' && !(v = strstr(v, "} "))) continue; /* label values may hold spaces: the value follows '} ' */
        char *end;
        double x = strtod(v + 1, &end);
        if (end == v + 1) continue;
        *out += x, found = true;
    }
    return found;
}

/* ---- the verdict ---- */

sk_verdict sk_judge(const sk_result *r) {
    const sk_stats *s = &r->stats;
    sk_verdict v = {.rss_judged = r->duration_s >= SK_RSS_MIN_DURATION_S};
    for (int i = 0; i < s->n_statuses; i++)
        if (s->status_code[i] >= 500 && s->status_code[i] != 503) v.n_5xx += s->status_n[i];
    for (int k = 0; k < SK_N_KINDS; k++) {
        const int *o = s->kinds[k].by_outcome;
        v.n_hung += o[SK_HUNG], v.n_transport += o[SK_TRANSPORT];
        v.n_bad_status += o[SK_BAD_STATUS], v.n_bad_answer += o[SK_BAD_ANSWER];
    }
    v.rss_growth_pct = sk_rss_growth_pct(s->samples, s->n_samples, r->duration_s);
    v.rss_ok = !v.rss_judged || (isfinite(v.rss_growth_pct) && v.rss_growth_pct < SK_RSS_MAX_GROWTH_PCT);
    v.kv_ok = r->settled && r->kv_end_used >= 0 && r->kv_idle_used >= 0 && r->kv_end_used <= r->kv_idle_used;
    v.ok = !v.n_5xx && !v.n_hung && !v.n_transport && !v.n_bad_status && !v.n_bad_answer && v.rss_ok && v.kv_ok;
    return v;
}

/* ---- figures for the reports ---- */

/* Every kind's samples of one series together (lat or ttft). */
static bs_pcts all_pcts(const sk_stats *s, bool ttft) {
    int n = 0, at = 0;
    for (int k = 0; k < SK_N_KINDS; k++) n += ttft ? s->kinds[k].ttft_ms.n : s->kinds[k].lat_ms.n;
    double *v = malloc(sizeof *v * (size_t)(n + 1));
    if (!v) return (bs_pcts){0};
    for (int k = 0; k < SK_N_KINDS; k++) {
        const sk_samples *x = ttft ? &s->kinds[k].ttft_ms : &s->kinds[k].lat_ms;
        if (x->n) memcpy(v + at, x->v, sizeof *v * (size_t)x->n); /* x->v is NULL while empty */
        at += x->n;
    }
    bs_pcts p = bs_pcts_of(v, n);
    free(v);
    return p;
}

/* bs_pcts_of sorts in place: the stats keep their samples in arrival
 * order for nothing, so sorting them is harmless. */
static bs_pcts pcts(const sk_samples *s) {
    return bs_pcts_of(s->v, s->n);
}

typedef struct row {
    const char *name;
    int pct, n, by_outcome[SK_N_OUTCOMES], n_cut;
    bs_pcts lat, ttft;
} row;

static row kind_row(const sk_stats *s, int k) {
    const sk_kind_stats *ks = &s->kinds[k];
    row r = {.name = sk_kind_names[k], .pct = sk_kind_pct[k], .n = ks->n, .n_cut = ks->n_cut,
             .lat = pcts(&ks->lat_ms), .ttft = pcts(&ks->ttft_ms)};
    memcpy(r.by_outcome, ks->by_outcome, sizeof r.by_outcome);
    return r;
}

static row total_row(const sk_stats *s) {
    row r = {.name = "all", .pct = 100, .lat = all_pcts(s, false), .ttft = all_pcts(s, true)};
    for (int k = 0; k < SK_N_KINDS; k++) {
        r.n += s->kinds[k].n, r.n_cut += s->kinds[k].n_cut;
        for (int o = 0; o < SK_N_OUTCOMES; o++) r.by_outcome[o] += s->kinds[k].by_outcome[o];
    }
    return r;
}

/* ---- Markdown ---- */

static void md_statuses(FILE *f, const sk_stats *s) {
    fprintf(f, "statuses:");
    for (int i = 0; i < s->n_statuses; i++) {
        fprintf(f, "%s", i ? ", " : " ");
        if (s->status_code[i]) fprintf(f, "%ld x %d", s->status_code[i], s->status_n[i]);
        else fprintf(f, "no answer x %d", s->status_n[i]);
    }
    fprintf(f, "%s\n", s->n_statuses ? "" : " none");
}

static void md_row(FILE *f, const row *r) {
    const int *o = r->by_outcome;
    fprintf(f, "| %s | %d | %d | %d | %d | %d | %d | %d | %d | %d |", r->name, r->pct, r->n, o[SK_OK], o[SK_OVERLOAD],
            o[SK_HUNG], o[SK_TRANSPORT], o[SK_BAD_STATUS], o[SK_BAD_ANSWER], r->n_cut);
    fprintf(f, " %.1f | %.1f | %.1f |", r->lat.p50, r->lat.p95, r->lat.p99);
    if (r->ttft.n) fprintf(f, " %.1f | %.1f | %.1f |\n", r->ttft.p50, r->ttft.p95, r->ttft.p99);
    else fprintf(f, " | | |\n");
}

static void md_kinds(FILE *f, const sk_stats *s) {
    fprintf(f, "\n| kind | mix %% | requests | ok | 503 | hung | transport | bad status | bad answer | cut | "
               "latency p50 ms | p95 | p99 | TTFT p50 ms | p95 | p99 |\n"
               "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int k = 0; k < SK_N_KINDS; k++) {
        row r = kind_row(s, k);
        md_row(f, &r);
    }
    row t = total_row(s);
    md_row(f, &t);
    fprintf(f, "\nok: the answer its kind must get (malformed: a 4xx error object; abandoned: streaming when the "
               "client hung up); cut: ok, but max_tokens ended a json_schema answer or a forced tool call before "
               "it could be checked; latency: sent .. last byte (abandoned: .. hang-up), ok answers only\n");
}

static void md_series(FILE *f, const sk_result *r) {
    fprintf(f, "\nServer every %d s (t from the start of the load; the last row after it settled):\n\n"
               "| t s | RSS MiB | KV used | KV cached | in flight | queued |\n|---:|---:|---:|---:|---:|---:|\n",
            r->rss_every_s);
    for (int i = 0; i < r->stats.n_samples; i++) {
        const sk_sample *x = &r->stats.samples[i];
        fprintf(f, "| %.0f | %.1f | %.0f | %.0f | %d | %.0f |\n", x->t_s,
                x->rss_bytes > 0 ? x->rss_bytes / 1048576.0 : -1, x->kv_used, x->kv_cached, x->in_flight, x->queued);
    }
}

static const char *pass(bool ok) {
    return ok ? "pass" : "FAIL";
}

static void md_checks(FILE *f, const sk_result *r, const sk_verdict *v) {
    fprintf(f, "\nKV blocks (of %.0f): idle %.0f used + %.0f cached; peak %.0f used under load; end %.0f used + "
               "%.0f cached (%s in %.1f s)\n", r->kv_total, r->kv_idle_used, r->kv_idle_cached, r->kv_peak_used,
            r->kv_end_used, r->kv_end_cached, r->settled ? "settled" : "NOT settled", r->settle_s);
    fprintf(f, "\nChecks:\n- 5xx other than 503: %d (%s)\n- hung requests (nothing for %d s): %d (%s)\n",
            v->n_5xx, pass(!v->n_5xx), r->timeout_s, v->n_hung, pass(!v->n_hung));
    fprintf(f, "- unexpected statuses %d, answers that do not check %d, transport errors %d (%s)\n", v->n_bad_status,
            v->n_bad_answer, v->n_transport, pass(!v->n_bad_status && !v->n_bad_answer && !v->n_transport));
    if (v->rss_judged)
        fprintf(f, "- RSS growth over the last half (t >= %d s): %+.2f%% (%s: under %.0f%%)\n", r->duration_s / 2,
                v->rss_growth_pct, pass(v->rss_ok), SK_RSS_MAX_GROWTH_PCT);
    else
        fprintf(f, "- RSS growth over the last half: %+.2f%% (not judged: runs under %d s are mostly warm-up)\n",
                v->rss_growth_pct, SK_RSS_MIN_DURATION_S);
    fprintf(f, "- KV blocks in use at the end: %.0f, idle level %.0f (%s)\n", r->kv_end_used, r->kv_idle_used,
            pass(v->kv_ok));
    fprintf(f, "\nResult: %s\n", v->ok ? "PASS" : "FAIL");
}

static void print_md(FILE *f, const sk_result *r, const sk_verdict *v) {
    fprintf(f, "kettle bench soak: %s, %d clients for %d s, seed %llu, --timeout %d s\n", r->target, r->clients,
            r->duration_s, (unsigned long long)r->seed, r->timeout_s);
    fprintf(f, "%d requests in %.1f s (%.1f/s); ", r->stats.n_requests, r->wall_s,
            r->wall_s > 0 ? r->stats.n_requests / r->wall_s : 0);
    md_statuses(f, &r->stats);
    md_kinds(f, &r->stats);
    md_series(f, r);
    md_checks(f, r, v);
}

/* ---- JSON ---- */

static json_t *pcts_json(const bs_pcts *p) {
    return json_pack("{s:f, s:f, s:f, s:i}", "p50", p->p50, "p95", p->p95, "p99", p->p99, "samples", p->n);
}

static json_t *row_json(const row *r) {
    json_t *o = json_object();
    for (int i = 0; o && i < SK_N_OUTCOMES; i++) json_object_set_new(o, sk_outcome_names[i], json_integer(r->by_outcome[i]));
    return json_pack("{s:s, s:i, s:i, s:o*, s:i, s:o*, s:o*}", "kind", r->name, "mix_pct", r->pct, "requests", r->n,
                     "outcomes", o, "cut", r->n_cut, "latency_ms", pcts_json(&r->lat), "ttft_ms",
                     r->ttft.n ? pcts_json(&r->ttft) : json_null());
}

static json_t *kinds_json(const sk_stats *s) {
    json_t *a = json_array();
    for (int k = 0; a && k <= SK_N_KINDS; k++) {
        row r = k < SK_N_KINDS ? kind_row(s, k) : total_row(s);
        json_array_append_new(a, row_json(&r));
    }
    return a;
}

static json_t *statuses_json(const sk_stats *s) {
    json_t *o = json_object();
    char key[24];
    for (int i = 0; o && i < s->n_statuses; i++) {
        snprintf(key, sizeof key, "%ld", s->status_code[i]); /* "0": no answer */
        json_object_set_new(o, key, json_integer(s->status_n[i]));
    }
    return o;
}

static json_t *samples_json(const sk_stats *s) {
    json_t *a = json_array();
    for (int i = 0; a && i < s->n_samples; i++) {
        const sk_sample *x = &s->samples[i];
        json_array_append_new(a, json_pack("{s:f, s:I, s:f, s:f, s:i, s:f}", "t_s", x->t_s, "rss_bytes",
                                           (json_int_t)x->rss_bytes, "kv_used", x->kv_used, "kv_cached",
                                           x->kv_cached, "in_flight", x->in_flight, "queued", x->queued));
    }
    return a;
}

static json_t *kv_json(const sk_result *r) {
    return json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:b, s:f}", "total", r->kv_total, "idle_used", r->kv_idle_used,
                     "idle_cached", r->kv_idle_cached, "peak_used", r->kv_peak_used, "end_used", r->kv_end_used,
                     "end_cached", r->kv_end_cached, "settled", r->settled, "settle_s", r->settle_s);
}

static json_t *checks_json(const sk_verdict *v) {
    return json_pack("{s:i, s:i, s:i, s:i, s:i, s:o, s:b, s:b, s:b}", "5xx_not_503", v->n_5xx, "hung", v->n_hung,
                     "transport", v->n_transport, "bad_status", v->n_bad_status, "bad_answer", v->n_bad_answer,
                     "rss_growth_pct_last_half", isfinite(v->rss_growth_pct) ? json_real(v->rss_growth_pct)
                                                                             : json_null(),
                     "rss_judged", v->rss_judged, "rss_ok", v->rss_ok, "kv_ok", v->kv_ok);
}

static bool print_json(FILE *f, const sk_result *r, const sk_verdict *v) {
    json_t *doc = json_pack("{s:s, s:i, s:i, s:I, s:i, s:i, s:f, s:i, s:o*, s:o*, s:o*, s:o*, s:o*, s:b}", "target",
                            r->target, "clients", r->clients, "duration_s", r->duration_s, "seed",
                            (json_int_t)r->seed, "timeout_s", r->timeout_s, "rss_every_s", r->rss_every_s, "wall_s",
                            r->wall_s, "requests", r->stats.n_requests, "statuses", statuses_json(&r->stats),
                            "kinds", kinds_json(&r->stats), "samples", samples_json(&r->stats), "kv", kv_json(r),
                            "checks", checks_json(v), "ok", v->ok);
    char *text = doc ? json_dumps(doc, JSON_INDENT(1)) : NULL;
    json_decref(doc);
    if (text) fprintf(f, "%s\n", text);
    free(text);
    return text != NULL;
}

bool sk_print(FILE *f, bs_fmt fmt, const sk_result *r, const sk_verdict *v) {
    if (fmt == BS_JSON) return print_json(f, r, v);
    print_md(f, r, v);
    return true;
}
