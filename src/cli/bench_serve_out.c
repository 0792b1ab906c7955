/*
 * bench_serve_out.c - the reports of `kettle bench serve`: a Markdown table
 * (like `kettle bench`), CSV, one JSON document, and a self-contained SVG
 * plot written as text (no plotting library: the figure must be
 * reproducible on a bare machine). See bench_serve.h.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

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
    fprintf(f, "\"%s\": {\"p50\": %.6g, \"p95\": %.6g, \"p99\": %.6g, \"samples\": %d}", name, p->p50, p->p95,
            p->p99, p->n);
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

enum { PANEL_W = 320, PANEL_H = 280, PAD_L = 62, PAD_R = 14, PAD_T = 34, PAD_B = 46, MAX_SERIES = 4 };

typedef struct svg_series {
    const char *name, *color;
    double v[64];
} svg_series;

typedef struct svg_panel {
    const char *title, *y_label;
    svg_series s[MAX_SERIES];
    int n_series;
} svg_panel;

/* A "nice" tick step (1, 2 or 5 x 10^k) giving about 5 ticks up to max. */
static double nice_step(double max) {
    if (!(max > 0)) return 1;
    double raw = max / 5, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
}

static double panel_max(const svg_panel *p, int n) {
    double m = 0;
    for (int k = 0; k < p->n_series; k++)
        for (int i = 0; i < n; i++) m = fmax(m, p->s[k].v[i]);
    return m;
}

/* The x of point i of n, inside a panel whose plot area starts at x0. */
static double x_at(int i, int n, double x0) {
    double w = PANEL_W - PAD_L - PAD_R;
    return x0 + PAD_L + (n > 1 ? w * (0.06 + 0.88 * i / (n - 1)) : w / 2);
}

static void svg_axes(FILE *f, const svg_panel *p, const bs_report *r, double x0, double top) {
    double bottom = PANEL_H - PAD_B, w = PANEL_W - PAD_L - PAD_R;
    fprintf(f, "<text x=\"%.1f\" y=\"20\" text-anchor=\"middle\" font-weight=\"bold\">%s</text>\n",
            x0 + PAD_L + w / 2, p->title);
    fprintf(f, "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#444\"/>\n",
            x0 + PAD_L, PAD_T, w, bottom - PAD_T);
    double step = nice_step(top);
    for (double t = 0; t <= top * 1.0001; t += step) {
        double y = bottom - (bottom - PAD_T) * t / top;
        fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", x0 + PAD_L,
                x0 + PAD_L + w, y, y);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", x0 + PAD_L - 4, y + 4, t);
    }
    for (int i = 0; i < r->n_levels; i++)
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%d</text>\n", x_at(i, r->n_levels, x0),
                bottom + 16, r->levels[i].concurrency);
    fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">concurrent streams</text>\n", x0 + PAD_L + w / 2,
            PANEL_H - 8);
    fprintf(f, "<text transform=\"translate(%.1f %.1f) rotate(-90)\" text-anchor=\"middle\">%s</text>\n", x0 + 14,
            (PAD_T + bottom) / 2, p->y_label);
}

static void svg_series_draw(FILE *f, const svg_series *s, int k, int n, double x0, double top) {
    double bottom = PANEL_H - PAD_B;
    fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", s->color);
    for (int i = 0; i < n; i++)
        fprintf(f, "%.1f,%.1f ", x_at(i, n, x0), bottom - (bottom - PAD_T) * s->v[i] / top);
    fprintf(f, "\"/>\n");
    for (int i = 0; i < n; i++)
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", x_at(i, n, x0),
                bottom - (bottom - PAD_T) * s->v[i] / top, s->color);
    if (s->name) {
        double lx = x0 + PAD_L + 8, ly = PAD_T + 14 + 14 * k;
        fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"/>\n", lx,
                lx + 16, ly - 4, ly - 4, s->color);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", lx + 20, ly, s->name);
    }
}

static void svg_panel_draw(FILE *f, const svg_panel *p, const bs_report *r, int idx) {
    double x0 = idx * PANEL_W, m = panel_max(p, r->n_levels), step = nice_step(m * 1.05);
    double top = step * ceil(m * 1.05 / step);
    if (!(top > 0)) top = 1;
    svg_axes(f, p, r, x0, top);
    for (int k = 0; k < p->n_series; k++) svg_series_draw(f, &p->s[k], k, r->n_levels, x0, top);
}

static void fill_panels(svg_panel p[3], const bs_report *r) {
    p[0] = (svg_panel){"Aggregate throughput", "generated tokens/s", {{NULL, "#1f77b4", {0}}}, 1};
    p[1] = (svg_panel){"Time to first token", "TTFT (ms)", {{"p50", "#2ca02c", {0}}, {"p95", "#d62728", {0}}}, 2};
    p[2] = (svg_panel){"Inter-token latency", "ITL (ms)", {{"p50", "#2ca02c", {0}}, {"p95", "#d62728", {0}}}, 2};
    for (int i = 0; i < r->n_levels && i < 64; i++) {
        const bs_level *l = &r->levels[i];
        p[0].s[0].v[i] = l->tokens_per_s;
        p[1].s[0].v[i] = l->ttft_ms.p50, p[1].s[1].v[i] = l->ttft_ms.p95;
        p[2].s[0].v[i] = l->itl_ms.p50, p[2].s[1].v[i] = l->itl_ms.p95;
    }
}

static void svg_caption(FILE *f, const bs_report *r) {
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" fill=\"#555\">kettle bench serve: ", 3 * PANEL_W / 2,
            PANEL_H + 14);
    for (const char *s = r->target; *s; s++) { /* the target may hold &, < or > */
        if (*s == '&') fputs("&amp;", f);
        else if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else fputc(*s, f);
    }
    fprintf(f, ", prompt ~%d tokens, max_tokens %d</text>\n", r->prompt_tokens, r->max_tokens);
}

bool bs_write_svg(const char *path, const bs_report *r) {
    if (r->n_levels > 64) {
        errno = EINVAL;
        return false;
    }
    FILE *f = fopen(path, "w");
    if (!f) return false;
    svg_panel p[3];
    fill_panels(p, r);
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            3 * PANEL_W, PANEL_H + 22, 3 * PANEL_W, PANEL_H + 22);
    for (int i = 0; i < 3; i++) svg_panel_draw(f, &p[i], r, i);
    svg_caption(f, r);
    fprintf(f, "</svg>\n");
    bool ok = !ferror(f);
    return (fclose(f) == 0) && ok;
}
