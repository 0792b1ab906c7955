/*
 * bench_agent_shots_out.c - the reports of `kettle bench agent
 * --screenshots`: Markdown tables (per step, then the run's figures), CSV
 * with one row per step measured, one JSON document (summaries and every
 * step). A figure a target does not give (the encoder's time where it has
 * no kettle /metrics, cached tokens where usage has none) is "-" or null,
 * never a guess. See bench_agent_shots.h.
 */
#include <string.h>

#include "cli/bench_agent_shots.h"

/* ---- Markdown ---- */

static void md_header(FILE *f, const ba_shots_report *r) {
    const ba_shots_opts *o = r->o;
    char keep[48] = "all";
    if (o->keep_screens) snprintf(keep, sizeof keep, "the last %d", o->keep_screens);
    fprintf(f, "kettle bench agent --screenshots: %d session%s x %d steps, %dx%d PNG screenshots, %s kept as images "
               "in the history, %d ms per action\n",
            o->sessions, o->sessions == 1 ? "" : "s", o->steps, o->screen_w, o->screen_h, keep, o->action_ms);
    fprintf(f, "one action per step under a JSON schema, max_tokens %d, temperature 0; streaming "
               "/v1/chat/completions; step time = request sent .. action parsed\n",
            o->gen_tokens);
}

static void md_steps(FILE *f, const ba_shots_summary *s) {
    fprintf(f, "\n| step | samples | images | prompt tok | cached tok | encode ms | encodes | TTFT p50 ms | p95 | "
               "step p50 ms | p95 |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int t = 0; t < s->n_steps; t++) {
        const ba_step_stats *st = &s->per_step[t];
        if (!st->n) { /* a failed target's steps never run */
            fprintf(f, "| %d | 0 | - | - | - | - | - | - | - | - | - |\n", t + 1);
            continue;
        }
        char cached[32] = "-", enc[32] = "-", encodes[32] = "-";
        if (st->n_cached) snprintf(cached, sizeof cached, "%.0f", st->cached_mean);
        if (st->n_encode) {
            snprintf(enc, sizeof enc, "%.1f", st->encode_ms_mean);
            snprintf(encodes, sizeof encodes, "%.2g", st->encodes_mean);
        }
        fprintf(f, "| %d | %d | %.1f | %.0f | %s | %s | %s | %.1f | %.1f | %.1f | %.1f |\n", t + 1, st->n,
                st->images_mean, st->prompt_mean, cached, enc, encodes, st->ttft_ms.p50, st->ttft_ms.p95,
                st->action_ms.p50, st->action_ms.p95);
    }
}

static void md_pcts(FILE *f, const char *what, const bs_pcts *p) {
    if (p->n) fprintf(f, "| %s | %.1f / %.1f ms (%d) |\n", what, p->p50, p->p95, p->n);
    else fprintf(f, "| %s | - |\n", what);
}

static void md_figures(FILE *f, const ba_shots_result *res, const ba_shots_summary *s) {
    fprintf(f, "\n| figure | value |\n|:---|---:|\n");
    md_pcts(f, "screenshot-to-action p50 / p95, every step", &s->action_ms);
    md_pcts(f, "TTFT p50 / p95, every step", &s->ttft_ms);
    md_pcts(f, res->prepare ? "TTFT p50 / p95, steps >= 2 (after a prepared step)" : "TTFT p50 / p95, steps >= 2",
            &s->ttft_later_ms);
    if (s->encode_ms.n || !s->n_steps_done) md_pcts(f, "image encode p50 / p95 per step (/metrics)", &s->encode_ms);
    else fprintf(f, "| image encode per step | - (no kettle_image_encode_seconds_total in /metrics) |\n");
    if (res->prepare) {
        md_pcts(f, "prepared request (max_tokens 0) p50 / p95", &s->prep_ms);
        fprintf(f, "| prepared requests that outlasted the action | %d |\n", s->n_prep_waits);
    }
    md_pcts(f, "task time p50 / p95 (sessions)", &s->task_ms);
    fprintf(f, "| valid actions | %d of %d |\n", s->n_valid, s->n_steps_done);
    if (s->n_cached)
        fprintf(f, "| cached prompt tokens | %lld of %lld (%.1f%%) |\n", s->cached_tokens, s->prompt_tokens,
                s->prompt_tokens ? 100.0 * (double)s->cached_tokens / (double)s->prompt_tokens : 0);
    else fprintf(f, "| cached prompt tokens | - (the server reports none) |\n");
}

static void md_ratios(FILE *f, const ba_shots_report *r) {
    for (int i = 1; i < r->n_targets; i++) {
        if (r->results[0].error[0] || r->results[i].error[0]) continue; /* a failed target has no ratio */
        double action, later, task;
        ba_shots_ratios(r, i, &action, &later, &task);
        fprintf(f, "\nratio %c/A (%c: %s, A: %s): step time p50 x%.3f, later-step TTFT p50 x%.3f, task time p50 "
                   "x%.3f\n",
                'A' + i, 'A' + i, r->results[i].target, r->results[0].target, action, later, task);
    }
}

static void print_md(FILE *f, const ba_shots_report *r) {
    md_header(f, r);
    for (int i = 0; i < r->n_targets; i++) {
        const ba_shots_result *res = &r->results[i];
        fprintf(f, "\n### %c: %s%s\n", 'A' + i, res->target, res->prepare ? " (with the prepared step)" : "");
        if (res->error[0]) fprintf(f, "\nFAILED: %s\n", res->error);
        md_steps(f, &r->sums[i]);
        md_figures(f, res, &r->sums[i]);
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

static void csv_int(FILE *f, int v) { /* -1: not known, an empty field */
    if (v >= 0) fprintf(f, "%d", v);
    fputc(',', f);
}

static void csv_step(FILE *f, const ba_step_rec *x) {
    fprintf(f, "%d,", x->images);
    csv_int(f, x->prompt_tokens), csv_int(f, x->cached_tokens);
    fprintf(f, "%.6g,%.6g,%d,", x->ttft_ms, x->action_ms, x->action_valid);
    if (x->encode_ms >= 0) fprintf(f, "%.6g", x->encode_ms);
    fputc(',', f);
    csv_int(f, x->encodes);
    if (x->prepared) fprintf(f, "%.6g", x->prep_ms);
    fputc(',', f);
    if (x->prepared && x->prep_cached_tokens >= 0) fprintf(f, "%d", x->prep_cached_tokens);
}

static void print_csv(FILE *f, const ba_shots_report *r) {
    fprintf(f, "target,prepare,session,step,images,prompt_tokens,cached_tokens,ttft_ms,step_ms,action_valid,"
               "encode_ms,encodes,prep_ms,prep_cached_tokens,task_ms\n");
    for (int i = 0; i < r->n_targets; i++)
        for (int k = 0; k < r->results[i].n_sess; k++) {
            const ba_shots_sess *ss = &r->results[i].sess[k];
            for (int t = 0; t < ss->n_steps; t++) {
                if (!ss->steps[t].done) continue;
                csv_string(f, r->results[i].target);
                fprintf(f, ",%d,%d,%d,", r->results[i].prepare, ss->session, t + 1);
                csv_step(f, &ss->steps[t]);
                fprintf(f, ",%.6g\n", ss->task_ms);
            }
        }
}

/* ---- JSON ---- */

static json_t *pcts_json(const bs_pcts *p) {
    if (!p->n) return json_null();
    return json_pack("{s:f, s:f, s:i}", "p50", p->p50, "p95", p->p95, "samples", p->n);
}

static json_t *int_or_null(int v) {
    return v >= 0 ? json_integer(v) : json_null();
}

static json_t *prep_json(const ba_step_rec *x) {
    if (!x->prepared) return json_null();
    return json_pack("{s:f, s:o, s:o, s:o, s:f}", "ms", x->prep_ms, "prompt_tokens", int_or_null(x->prep_prompt_tokens),
                     "cached_tokens", int_or_null(x->prep_cached_tokens), "encodes", int_or_null(x->prep_encodes),
                     "outlasted_action_ms", x->prep_wait_ms);
}

static json_t *step_json(const ba_step_rec *x, int t) {
    return json_pack("{s:i, s:i, s:o, s:o, s:i, s:f, s:f, s:b, s:s, s:s, s:o, s:o, s:o, s:o}", "step", t + 1,
                     "images", x->images, "prompt_tokens", int_or_null(x->prompt_tokens), "cached_tokens",
                     int_or_null(x->cached_tokens), "completion_tokens", x->completion_tokens, "ttft_ms", x->ttft_ms,
                     "step_ms", x->action_ms, "action_valid", x->action_valid, "reply", x->reply, "finish_reason",
                     x->finish, "encode_ms",
                     x->encode_ms >= 0 ? json_real(x->encode_ms) : json_null(), "encodes", int_or_null(x->encodes),
                     "encoder_cache_hits", int_or_null(x->encoder_hits), "prepared", prep_json(x));
}

static json_t *session_json(const ba_shots_sess *ss) {
    json_t *steps = json_array();
    for (int t = 0; steps && t < ss->n_steps; t++)
        if (ss->steps[t].done && json_array_append_new(steps, step_json(&ss->steps[t], t)))
            json_decref(steps), steps = NULL;
    return json_pack("{s:i, s:o, s:o}", "session", ss->session, "task_ms",
                     ss->task_ms > 0 ? json_real(ss->task_ms) : json_null(), "steps", steps);
}

static json_t *per_step_json(const ba_shots_summary *s) {
    json_t *a = json_array();
    for (int t = 0; a && t < s->n_steps; t++) {
        const ba_step_stats *st = &s->per_step[t];
        json_t *o = json_pack("{s:i, s:i, s:f, s:f, s:o, s:o, s:o, s:o, s:o}", "step", t + 1, "samples", st->n,
                              "images_mean", st->images_mean, "prompt_tokens_mean", st->prompt_mean,
                              "cached_tokens_mean", st->n_cached ? json_real(st->cached_mean) : json_null(),
                              "encode_ms_mean", st->n_encode ? json_real(st->encode_ms_mean) : json_null(),
                              "encodes_mean", st->n_encode ? json_real(st->encodes_mean) : json_null(), "ttft_ms",
                              pcts_json(&st->ttft_ms), "step_ms", pcts_json(&st->action_ms));
        if (json_array_append_new(a, o)) json_decref(a), a = NULL;
    }
    return a;
}

static json_t *target_json(const ba_shots_result *res, const ba_shots_summary *s) {
    json_t *sess = json_array();
    for (int k = 0; sess && k < res->n_sess; k++)
        if (json_array_append_new(sess, session_json(&res->sess[k]))) json_decref(sess), sess = NULL;
    return json_pack("{s:s, s:b, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:i, s:i, s:i, s:I, s:o, s:o}", "target",
                     res->target, "prepare", res->prepare, "failed",
                     res->error[0] ? json_string(res->error) : json_null(), "per_step", per_step_json(s), "step_ms",
                     pcts_json(&s->action_ms), "ttft_ms", pcts_json(&s->ttft_ms), "ttft_later_ms",
                     pcts_json(&s->ttft_later_ms), "encode_ms", pcts_json(&s->encode_ms), "prepare_ms",
                     pcts_json(&s->prep_ms), "task_ms", pcts_json(&s->task_ms), "prepare_outlasted_action",
                     s->n_prep_waits, "steps_done", s->n_steps_done, "valid_actions", s->n_valid, "prompt_tokens",
                     (json_int_t)s->prompt_tokens, "cached_tokens",
                     s->n_cached ? json_integer(s->cached_tokens) : json_null(), "sessions", sess);
}

static json_t *ratios_json(const ba_shots_report *r) {
    json_t *a = json_array();
    for (int i = 1; a && i < r->n_targets; i++) {
        if (r->results[0].error[0] || r->results[i].error[0]) continue;
        double action, later, task;
        ba_shots_ratios(r, i, &action, &later, &task);
        json_t *o = json_pack("{s:s, s:s, s:b, s:f, s:f, s:f}", "base", r->results[0].target, "target",
                              r->results[i].target, "prepare", r->results[i].prepare, "step_p50", action,
                              "ttft_later_p50", later, "task_p50", task);
        if (json_array_append_new(a, o)) json_decref(a), a = NULL;
    }
    return a;
}

static bool print_json(FILE *f, const ba_shots_report *r) {
    const ba_shots_opts *o = r->o;
    json_t *targets = json_array();
    for (int i = 0; targets && i < r->n_targets; i++)
        if (json_array_append_new(targets, target_json(&r->results[i], &r->sums[i])))
            json_decref(targets), targets = NULL;
    json_t *doc = json_pack("{s:s, s:i, s:i, s:i, s:i, s:o, s:i, s:i, s:o, s:o}", "mode", "screenshots", "sessions",
                            o->sessions, "steps", o->steps, "screen_width", o->screen_w, "screen_height", o->screen_h,
                            "keep_screens", o->keep_screens ? json_integer(o->keep_screens) : json_null(), "action_ms",
                            o->action_ms, "gen_tokens", o->gen_tokens, "targets", targets, "ratios", ratios_json(r));
    bool ok = doc && json_dumpf(doc, f, JSON_INDENT(1) | JSON_REAL_PRECISION(6)) == 0;
    if (ok) fputc('\n', f);
    json_decref(doc);
    return ok;
}

bool ba_shots_print(FILE *out, bs_fmt fmt, const ba_shots_report *r) {
    bool ok = true;
    if (fmt == BS_CSV) print_csv(out, r);
    else if (fmt == BS_JSON) ok = print_json(out, r);
    else print_md(out, r);
    fflush(out);
    return ok;
}
