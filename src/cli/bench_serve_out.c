/*
 * bench_serve_out.c - the reports of `kettle bench serve`: a Markdown table
 * (like `kettle bench`), CSV, one JSON document, and an SVG plot
 * (bench_plot.c). See bench_serve.h.
 */
#include <errno.h>
#include <string.h>

#include "cli/bench_plot.h"
#include "cli/bench_serve.h"

static double mean_prompt(const bs_level *l) {
    return l->n_requests ? (double)l->n_prompt_tokens / l->n_requests : 0;
}

static bool any_long(const bs_report *r) {
    for (int i = 0; i < r->n_levels; i++)
        if (r->levels[i].has_long) return true;
    return false;
}

/* ---- Markdown ---- */

static void print_md_long(FILE *f, const bs_report *r) {
    fprintf(f, "\nLong prompt submitted while the streams decode (ITL of the other streams; "
               "\"in window\" overlaps the long request's submit .. first token):\n\n");
    fprintf(f, "| c | long prompt tok | long TTFT ms | ITL p95 in window ms | ITL p95 outside ms | in / out "
               "| /health max ms |\n|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < r->n_levels; i++) {
        const bs_level *l = &r->levels[i];
        if (!l->has_long) continue;
        double q = l->itl_out_ms.p95 > 0 ? l->itl_in_ms.p95 / l->itl_out_ms.p95 : 0;
        fprintf(f, "| %d | %d | %.1f | %.2f (%d) | %.2f (%d) | %.2f | %.2f (%d polls) |\n", l->concurrency,
                l->long_prompt_tokens, l->long_ttft_ms, l->itl_in_ms.p95, l->itl_in_ms.n, l->itl_out_ms.p95,
                l->itl_out_ms.n, q, l->health_max_ms, l->n_health);
    }
}

static void print_md(FILE *f, const bs_report *r) {
    fprintf(f, "%s, prompt ~%d tokens, max_tokens %d, streaming /v1/completions at temperature 0\n\n", r->target,
            r->prompt_tokens, r->max_tokens);
    fprintf(f, "| c | requests | prompt tok | tokens | TTFT p50 ms | p95 | p99 | ITL p50 ms | p95 | p99 | tokens/s "
               "| x c=%d |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
            r->ratio_base_c);
    for (int i = 0; i < r->n_levels; i++) {
        const bs_level *l = &r->levels[i];
        fprintf(f, "| %d | %d | %.0f | %ld | %.1f | %.1f | %.1f | %.2f | %.2f | %.2f | %.1f | %.2f |\n",
                l->concurrency, l->n_requests, mean_prompt(l), l->n_tokens, l->ttft_ms.p50, l->ttft_ms.p95,
                l->ttft_ms.p99, l->itl_ms.p50, l->itl_ms.p95, l->itl_ms.p99, l->tokens_per_s, l->ratio);
    }
    if (any_long(r)) print_md_long(f, r);
}

/* ---- CSV ---- */

static void print_csv(FILE *f, const bs_report *r) {
    fprintf(f, "concurrency,requests,prompt_tokens_mean,tokens,finish_length,wall_ms,tokens_per_s,ratio,"
               "ttft_p50_ms,ttft_p95_ms,ttft_p99_ms,itl_p50_ms,itl_p95_ms,itl_p99_ms,itl_samples,"
               "long_prompt_tokens,long_ttft_ms,itl_p95_in_window_ms,itl_in_window_samples,"
               "itl_p95_outside_ms,itl_outside_samples,health_max_ms,health_polls\n");
    for (int i = 0; i < r->n_levels; i++) {
        const bs_level *l = &r->levels[i];
        fprintf(f, "%d,%d,%.6g,%ld,%d,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%d", l->concurrency,
                l->n_requests, mean_prompt(l), l->n_tokens, l->n_finish_length, l->wall_ms, l->tokens_per_s,
                l->ratio, l->ttft_ms.p50, l->ttft_ms.p95, l->ttft_ms.p99, l->itl_ms.p50, l->itl_ms.p95,
                l->itl_ms.p99, l->itl_ms.n);
        if (l->has_long)
            fprintf(f, ",%d,%.6g,%.6g,%d,%.6g,%d,%.6g,%d\n", l->long_prompt_tokens, l->long_ttft_ms,
                    l->itl_in_ms.p95, l->itl_in_ms.n, l->itl_out_ms.p95, l->itl_out_ms.n, l->health_max_ms,
                    l->n_health);
        else
            fprintf(f, ",,,,,,,,\n");
    }
}

/* ---- JSON ---- */

static void print_json_pcts(FILE *f, const char *name, const bs_pcts *p) {
    fprintf(f, "\"%s\": {\"p50\": %.6g, \"p95\": %.6g, \"p99\": %.6g, \"max\": %.6g, \"samples\": %d}", name, p->p50,
            p->p95, p->p99, p->max, p->n);
}

static void print_json_long(FILE *f, const bs_level *l) {
    if (!l->has_long) {
        fprintf(f, "null");
        return;
    }
    fprintf(f, "{\"prompt_tokens\": %d, \"ttft_ms\": %.6g, ", l->long_prompt_tokens, l->long_ttft_ms);
    print_json_pcts(f, "itl_in_window_ms", &l->itl_in_ms);
    fprintf(f, ", ");
    print_json_pcts(f, "itl_outside_ms", &l->itl_out_ms);
    fprintf(f, ", \"health_max_ms\": %.6g, \"health_polls\": %d}", l->health_max_ms, l->n_health);
}

static void print_json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", *s);
        else fputc(*s, f);
    }
    fputc('"', f);
}

static void print_json(FILE *f, const bs_report *r) {
    fprintf(f, "{\"target\": ");
    print_json_string(f, r->target);
    fprintf(f, ", \"prompt_tokens\": %d, \"max_tokens\": %d, \"ratio_base_concurrency\": %d, \"levels\": [",
            r->prompt_tokens, r->max_tokens, r->ratio_base_c);
    for (int i = 0; i < r->n_levels; i++) {
        const bs_level *l = &r->levels[i];
        fprintf(f, "%s\n  {\"concurrency\": %d, \"requests\": %d, \"prompt_tokens_mean\": %.6g, \"tokens\": %ld, "
                   "\"finish_length\": %d, \"wall_ms\": %.6g, \"tokens_per_s\": %.6g, \"ratio\": %.6g, ",
                i ? "," : "", l->concurrency, l->n_requests, mean_prompt(l), l->n_tokens, l->n_finish_length,
                l->wall_ms, l->tokens_per_s, l->ratio);
        print_json_pcts(f, "ttft_ms", &l->ttft_ms);
        fprintf(f, ", ");
        print_json_pcts(f, "itl_ms", &l->itl_ms);
        fprintf(f, ", \"long_prompt\": ");
        print_json_long(f, l);
        fprintf(f, "}");
    }
    fprintf(f, "\n]}\n");
}

void bs_print(FILE *out, bs_fmt fmt, const bs_report *r) {
    if (fmt == BS_CSV) print_csv(out, r);
    else if (fmt == BS_JSON) print_json(out, r);
    else print_md(out, r);
    fflush(out);
}

/* ---- SVG ---- */

static void fill_panels(bp_plot *p, const bs_report *r) {
    p->panels[0] = (bp_panel){"Aggregate throughput", "generated tokens/s", {{NULL, "#1f77b4", false, {0}}}, 1};
    p->panels[1] = (bp_panel){
        "Time to first token", "TTFT (ms)", {{"p50", "#2ca02c", false, {0}}, {"p95", "#d62728", false, {0}}}, 2};
    p->panels[2] = (bp_panel){
        "Inter-token latency", "ITL (ms)", {{"p50", "#2ca02c", false, {0}}, {"p95", "#d62728", false, {0}}}, 2};
    p->n_panels = 3;
    for (int i = 0; i < r->n_levels && i < BP_MAX_X; i++) {
        const bs_level *l = &r->levels[i];
        p->panels[0].s[0].v[i] = l->tokens_per_s;
        p->panels[1].s[0].v[i] = l->ttft_ms.p50, p->panels[1].s[1].v[i] = l->ttft_ms.p95;
        p->panels[2].s[0].v[i] = l->itl_ms.p50, p->panels[2].s[1].v[i] = l->itl_ms.p95;
        snprintf(p->x_tick[i], sizeof p->x_tick[i], "%d", l->concurrency);
    }
}

bool bs_write_svg(const char *path, const bs_report *r) {
    if (r->n_levels > BP_MAX_X) {
        errno = EINVAL;
        return false;
    }
    static bp_plot p; /* ~13 KB: off the stack; the bench is single-threaded */
    p = (bp_plot){.n_x = r->n_levels, .x_label = "concurrent streams"};
    fill_panels(&p, r);
    char caption[1400];
    snprintf(caption, sizeof caption, "kettle bench serve: %.1000s, prompt ~%d tokens, max_tokens %d", r->target,
             r->prompt_tokens, r->max_tokens);
    p.caption = caption;
    return bp_write_svg(path, &p);
}
