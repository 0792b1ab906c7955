/*
 * bench_agent_out.c - the reports of `kettle bench agent`: Markdown tables
 * (per turn index, then the session-level figures), CSV with one row per
 * turn measured (for a spreadsheet: every figure can be recomputed from
 * it), one JSON document (summaries and every turn), and an SVG of TTFT
 * per turn drawn by bench_plot.c, as bench serve's. See bench_agent.h.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cli/bench_agent.h"
#include "cli/bench_plot.h"

/* ---- Markdown ---- */

static void md_header(FILE *f, const ba_report *r) {
    fprintf(f, "kettle bench agent: %s\n", r->w->desc);
    fprintf(f, "max_tokens %d per turn (temperature 0, ignore_eos), %d sessions at once, %d round%s; "
               "streaming /v1/chat/completions\n",
            r->gen_tokens, r->concurrency, r->rounds, r->rounds == 1 ? "" : "s");
}

static void md_turns(FILE *f, const ba_summary *s) {
    fprintf(f, "\n| turn | samples | prompt tok | cached tok | TTFT p50 ms | p95 | p99 | turn p50 ms |\n"
               "|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int t = 0; t < s->n_turns; t++) {
        const ba_turn_stats *ts = &s->per_turn[t];
        char cached[32] = "n/a";
        if (ts->n_cached) snprintf(cached, sizeof cached, "%.0f", ts->cached_mean);
        fprintf(f, "| %d | %d | %.0f | %s | %.1f | %.1f | %.1f | %.1f |\n", t + 1, ts->n, ts->prompt_mean, cached,
                ts->ttft_ms.p50, ts->ttft_ms.p95, ts->ttft_ms.p99, ts->turn_ms.p50);
    }
}

static void md_pcts3(FILE *f, const char *what, const bs_pcts *p) {
    fprintf(f, "| %s | %.1f / %.1f / %.1f ms (%d) |\n", what, p->p50, p->p95, p->p99, p->n);
}

static void md_figures(FILE *f, const ba_summary *s) {
    fprintf(f, "\n| figure | value |\n|:---|---:|\n");
    md_pcts3(f, "TTFT p50 / p95 / p99, first turns", &s->ttft_first_ms);
    md_pcts3(f, "TTFT p50 / p95 / p99, later turns (>= 2)", &s->ttft_later_ms);
    fprintf(f, "| task time p50 / p95 (sessions) | %.1f / %.1f ms (%d) |\n", s->task_ms.p50, s->task_ms.p95,
            s->task_ms.n);
    fprintf(f, "| prompt tokens sent | %lld |\n", s->prompt_tokens);
    if (s->n_cached)
        fprintf(f, "| cached tokens | %lld (%.1f%%) |\n", s->cached_tokens,
                s->prompt_tokens ? 100.0 * s->cached_tokens / s->prompt_tokens : 0);
    else
        fprintf(f, "| cached tokens | n/a (the server reports none) |\n");
    fprintf(f, "| prefill tokens (prompt - cached) | %lld |\n", s->prefill_tokens);
    fprintf(f, "| decode tokens, tokens/s per stream | %lld, %.1f |\n", s->decode_tokens, s->decode_tokens_per_s);
    if (s->n_call_turns)
        fprintf(f, "| turns with tool calls, valid (retries a client makes) | %d, %d = %.1f%% (%d) |\n",
                s->n_call_turns, s->n_valid_call_turns, 100.0 * s->n_valid_call_turns / s->n_call_turns,
                s->n_call_turns - s->n_valid_call_turns);
    else fprintf(f, "| turns with tool calls | 0 |\n");
    if (s->peak_rss >= 0) fprintf(f, "| peak server RSS | %.1f MiB |\n", s->peak_rss / 1048576.0);
    else fprintf(f, "| peak server RSS | n/a (not our child) |\n");
}

static void md_ratios(FILE *f, const ba_report *r) {
    for (int i = 1; i < r->n_targets; i++) {
        double task, later;
        ba_ratios(r, i, &task, &later);
        fprintf(f, "\nratio %c/A (%c: %s, A: %s): task time p50 x%.3f, later-turn TTFT p50 x%.3f\n", 'A' + i,
                'A' + i, r->results[i].target, r->results[0].target, task, later);
    }
}

static void print_md(FILE *f, const ba_report *r) {
    md_header(f, r);
    for (int i = 0; i < r->n_targets; i++) {
        if (r->n_targets > 1) fprintf(f, "\n### %c: %s\n", 'A' + i, r->results[i].target);
        else fprintf(f, "target: %s\n", r->results[i].target);
        md_turns(f, &r->sums[i]);
        md_figures(f, &r->sums[i]);
    }
    md_ratios(f, r);
}

/* ---- CSV ---- */

static void csv_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

static void print_csv(FILE *f, const ba_report *r) {
    fprintf(f, "target,round,session,name,turn,prompt_tokens,cached_tokens,completion_tokens,ttft_ms,turn_ms,"
               "decode_ms,task_ms,tool_calls,calls_valid\n");
    for (int i = 0; i < r->n_targets; i++)
        for (int k = 0; k < r->results[i].n_sess; k++) {
            const ba_sess_rec *sr = &r->results[i].sess[k];
            for (int t = 0; t < sr->n_turns; t++) {
                const ba_turn_rec *tr = &sr->turns[t];
                csv_string(f, r->results[i].target);
                fprintf(f, ",%d,%d,", sr->round, sr->session);
                csv_string(f, sr->name);
                fprintf(f, ",%d,%d,", t + 1, tr->prompt_tokens);
                if (tr->cached_tokens >= 0) fprintf(f, "%d", tr->cached_tokens);
                fprintf(f, ",%d,%.6g,%.6g,%.6g,%.6g,%d,%d\n", tr->completion_tokens, tr->ttft_ms, tr->turn_ms,
                        tr->decode_ms, sr->task_ms, tr->n_calls, tr->calls_valid);
            }
        }
}

/* ---- JSON ---- */

static json_t *pcts_json(const bs_pcts *p) {
    return json_pack("{s:f, s:f, s:f, s:i}", "p50", p->p50, "p95", p->p95, "p99", p->p99, "samples", p->n);
}

static json_t *count_or_null(long long v, bool known) {
    return known ? json_integer(v) : json_null();
}

static json_t *turn_json(const ba_turn_rec *tr, int t) {
    return json_pack("{s:i, s:o, s:o, s:i, s:f, s:f, s:f}", "turn", t + 1, "prompt_tokens",
                     count_or_null(tr->prompt_tokens, tr->prompt_tokens >= 0), "cached_tokens",
                     count_or_null(tr->cached_tokens, tr->cached_tokens >= 0), "completion_tokens",
                     tr->completion_tokens, "ttft_ms", tr->ttft_ms, "turn_ms", tr->turn_ms, "decode_ms", tr->decode_ms);
}

static json_t *session_json(const ba_sess_rec *sr) {
    json_t *turns = json_array();
    for (int t = 0; turns && t < sr->n_turns; t++)
        if (json_array_append_new(turns, turn_json(&sr->turns[t], t))) json_decref(turns), turns = NULL;
    return json_pack("{s:i, s:i, s:s, s:f, s:o}", "round", sr->round, "session", sr->session, "name", sr->name,
                     "task_ms", sr->task_ms, "turns", turns);
}

static json_t *per_turn_json(const ba_summary *s) {
    json_t *a = json_array();
    for (int t = 0; a && t < s->n_turns; t++) {
        const ba_turn_stats *ts = &s->per_turn[t];
        json_t *o = json_pack("{s:i, s:i, s:f, s:o, s:o, s:o}", "turn", t + 1, "samples", ts->n, "prompt_tokens_mean",
                              ts->prompt_mean, "cached_tokens_mean",
                              ts->n_cached ? json_real(ts->cached_mean) : json_null(), "ttft_ms",
                              pcts_json(&ts->ttft_ms), "turn_ms", pcts_json(&ts->turn_ms));
        if (json_array_append_new(a, o)) json_decref(a), a = NULL;
    }
    return a;
}

static json_t *target_json(const ba_result *res, const ba_summary *s) {
    json_t *sess = json_array();
    for (int k = 0; sess && k < res->n_sess; k++)
        if (json_array_append_new(sess, session_json(&res->sess[k]))) json_decref(sess), sess = NULL;
    return json_pack("{s:s, s:o, s:o, s:o, s:o, s:o, s:I, s:o, s:I, s:I, s:f, s:o, s:i, s:i}", "target", res->target,
                     "per_turn", per_turn_json(s), "ttft_first_ms", pcts_json(&s->ttft_first_ms), "ttft_later_ms",
                     pcts_json(&s->ttft_later_ms), "task_ms", pcts_json(&s->task_ms), "sessions", sess,
                     "prompt_tokens", (json_int_t)s->prompt_tokens, "cached_tokens",
                     count_or_null(s->cached_tokens, s->n_cached > 0), "prefill_tokens",
                     (json_int_t)s->prefill_tokens, "decode_tokens", (json_int_t)s->decode_tokens,
                     "decode_tokens_per_s", s->decode_tokens_per_s, "peak_rss_bytes",
                     count_or_null(s->peak_rss, s->peak_rss >= 0), "tool_call_turns", s->n_call_turns,
                     "valid_tool_call_turns", s->n_valid_call_turns);
}

static json_t *ratios_json(const ba_report *r) {
    json_t *a = json_array();
    for (int i = 1; a && i < r->n_targets; i++) {
        double task, later;
        ba_ratios(r, i, &task, &later);
        json_t *o = json_pack("{s:s, s:s, s:f, s:f}", "base", r->results[0].target, "target", r->results[i].target,
                              "task_p50", task, "ttft_later_p50", later);
        if (json_array_append_new(a, o)) json_decref(a), a = NULL;
    }
    return a;
}

static bool print_json(FILE *f, const ba_report *r) {
    json_t *targets = json_array();
    for (int i = 0; targets && i < r->n_targets; i++)
        if (json_array_append_new(targets, target_json(&r->results[i], &r->sums[i])))
            json_decref(targets), targets = NULL;
    json_t *doc = json_pack("{s:s, s:s, s:i, s:i, s:i, s:o, s:o}", "mode", r->w->synthetic ? "synthetic" : "replay",
                            "workload", r->w->desc, "gen_tokens", r->gen_tokens, "concurrency", r->concurrency,
                            "rounds", r->rounds, "targets", targets, "ratios", ratios_json(r));
    bool ok = doc && json_dumpf(doc, f, JSON_INDENT(1) | JSON_REAL_PRECISION(6)) == 0;
    if (ok) fputc('\n', f);
    json_decref(doc);
    return ok;
}

bool ba_print(FILE *out, bs_fmt fmt, const ba_report *r) {
    bool ok = true;
    if (fmt == BS_CSV) print_csv(out, r);
    else if (fmt == BS_JSON) ok = print_json(out, r);
    else print_md(out, r);
    fflush(out);
    return ok;
}

/* ---- SVG ---- */

static const char *const COLORS[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd"};

static void svg_series(bp_plot *p, const ba_report *r, int i, char names[][64]) {
    const ba_summary *s = &r->sums[i];
    const char *name = NULL;
    if (r->n_targets > 1) {
        snprintf(names[i], 64, "%c: %.56s", 'A' + i, r->results[i].target);
        name = names[i];
    }
    bp_series *p50 = &p->panels[0].s[p->panels[0].n_series++], *p95 = &p->panels[1].s[p->panels[1].n_series++];
    bp_series *pt = &p->panels[2].s[p->panels[2].n_series++], *ct = &p->panels[2].s[p->panels[2].n_series++];
    *p50 = (bp_series){name, COLORS[i % 4], false, {0}};
    *p95 = (bp_series){name, COLORS[i % 4], false, {0}};
    *pt = (bp_series){r->n_targets > 1 ? NULL : "prompt", COLORS[i % 4], false, {0}};
    *ct = (bp_series){r->n_targets > 1 ? NULL : "cached", COLORS[i % 4], true, {0}};
    for (int t = 0; t < s->n_turns && t < BP_MAX_X; t++) {
        p50->v[t] = s->per_turn[t].ttft_ms.p50, p95->v[t] = s->per_turn[t].ttft_ms.p95;
        pt->v[t] = s->per_turn[t].prompt_mean, ct->v[t] = s->per_turn[t].cached_mean;
    }
}

bool ba_write_svg(const char *path, const ba_report *r) {
    static bp_plot p; /* ~14 KB: off the stack; the bench is single-threaded */
    char names[4][64], caption[700];
    int n_x = 0;
    for (int i = 0; i < r->n_targets; i++)
        if (r->sums[i].n_turns > n_x) n_x = r->sums[i].n_turns;
    if (r->n_targets > 4 || n_x < 1) return errno = EINVAL, false;
    p = (bp_plot){.n_panels = 3, .n_x = n_x < BP_MAX_X ? n_x : BP_MAX_X, .x_label = "turn", .caption = caption};
    p.panels[0] = (bp_panel){.title = "Time to first token, p50", .y_label = "TTFT p50 (ms)"};
    p.panels[1] = (bp_panel){.title = "Time to first token, p95", .y_label = "TTFT p95 (ms)"};
    p.panels[2] = (bp_panel){.title = "Prompt tokens (dashed: cached)", .y_label = "tokens per request"};
    for (int t = 0; t < p.n_x; t++) snprintf(p.x_tick[t], sizeof p.x_tick[t], "%d", t + 1);
    for (int i = 0; i < r->n_targets; i++) svg_series(&p, r, i, names);
    snprintf(caption, sizeof caption, "kettle bench agent%s%.80s: %.500s", r->n_targets == 1 ? " on " : "",
             r->n_targets == 1 ? r->results[0].target : "", r->w->desc);
    return bp_write_svg(path, &p);
}
