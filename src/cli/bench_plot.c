/*
 * bench_plot.c - SVG line plots for the bench reports, written as text (no
 * plotting library: the figure must be reproducible on a bare machine).
 * See bench_plot.h.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>

#include "cli/bench_plot.h"

enum { PANEL_W = 320, PANEL_H = 280, PAD_L = 62, PAD_R = 14, PAD_T = 34, PAD_B = 46 };

/* A "nice" tick step (1, 2 or 5 x 10^k) giving about 5 ticks up to max. */
static double nice_step(double max) {
    if (!(max > 0)) return 1;
    double raw = max / 5, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
}

static double panel_max(const bp_panel *p, int n) {
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

/* Text escaped for XML: targets and file names may hold &, < or >. */
static void put_escaped(FILE *f, const char *s) {
    for (; s && *s; s++) {
        if (*s == '&') fputs("&amp;", f);
        else if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else fputc(*s, f);
    }
}

/* Labels every x tick, or about 16 of them when there are many. */
static void svg_x_ticks(FILE *f, const bp_plot *plot, double x0, double bottom) {
    int every = plot->n_x > 16 ? (plot->n_x + 15) / 16 : 1;
    for (int i = 0; i < plot->n_x; i += every) {
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", x_at(i, plot->n_x, x0), bottom + 16);
        put_escaped(f, plot->x_tick[i]);
        fprintf(f, "</text>\n");
    }
}

static void svg_axes(FILE *f, const bp_panel *p, const bp_plot *plot, double x0, double top) {
    double bottom = PANEL_H - PAD_B, w = PANEL_W - PAD_L - PAD_R;
    fprintf(f, "<text x=\"%.1f\" y=\"20\" text-anchor=\"middle\" font-weight=\"bold\">", x0 + PAD_L + w / 2);
    put_escaped(f, p->title);
    fprintf(f, "</text>\n<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#444\"/>\n",
            x0 + PAD_L, PAD_T, w, bottom - PAD_T);
    double step = nice_step(top);
    for (double t = 0; t <= top * 1.0001; t += step) {
        double y = bottom - (bottom - PAD_T) * t / top;
        fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", x0 + PAD_L,
                x0 + PAD_L + w, y, y);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", x0 + PAD_L - 4, y + 4, t);
    }
    svg_x_ticks(f, plot, x0, bottom);
    fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">", x0 + PAD_L + w / 2, PANEL_H - 8);
    put_escaped(f, plot->x_label);
    fprintf(f, "</text>\n<text transform=\"translate(%.1f %.1f) rotate(-90)\" text-anchor=\"middle\">", x0 + 14,
            (PAD_T + bottom) / 2);
    put_escaped(f, p->y_label);
    fprintf(f, "</text>\n");
}

static void svg_legend(FILE *f, const bp_series *s, int k, double x0) {
    double lx = x0 + PAD_L + 8, ly = PAD_T + 14 + 14 * k;
    fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"%s/>\n", lx,
            lx + 16, ly - 4, ly - 4, s->color, s->dashed ? " stroke-dasharray=\"4 3\"" : "");
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">", lx + 20, ly);
    put_escaped(f, s->name);
    fprintf(f, "</text>\n");
}

static void svg_series_draw(FILE *f, const bp_series *s, int k, int n, double x0, double top) {
    double bottom = PANEL_H - PAD_B;
    fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"", s->color,
            s->dashed ? " stroke-dasharray=\"4 3\"" : "");
    for (int i = 0; i < n; i++)
        fprintf(f, "%.1f,%.1f ", x_at(i, n, x0), bottom - (bottom - PAD_T) * s->v[i] / top);
    fprintf(f, "\"/>\n");
    for (int i = 0; i < n; i++)
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", x_at(i, n, x0),
                bottom - (bottom - PAD_T) * s->v[i] / top, s->color);
    if (s->name) svg_legend(f, s, k, x0);
}

static void svg_panel_draw(FILE *f, const bp_panel *p, const bp_plot *plot, int idx) {
    double x0 = idx * PANEL_W, m = panel_max(p, plot->n_x), step = nice_step(m * 1.05);
    double top = step * ceil(m * 1.05 / step);
    if (!(top > 0)) top = 1;
    svg_axes(f, p, plot, x0, top);
    for (int k = 0; k < p->n_series; k++) svg_series_draw(f, &p->s[k], k, plot->n_x, x0, top);
}

bool bp_write_svg(const char *path, const bp_plot *p) {
    if (p->n_x < 1 || p->n_x > BP_MAX_X || p->n_panels < 1 || p->n_panels > BP_MAX_PANELS) {
        errno = EINVAL;
        return false;
    }
    for (int i = 0; i < p->n_panels; i++)
        if (p->panels[i].n_series < 0 || p->panels[i].n_series > BP_MAX_SERIES) {
            errno = EINVAL;
            return false;
        }
    FILE *f = fopen(path, "w");
    if (!f) return false;
    int w = p->n_panels * PANEL_W;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            w, PANEL_H + 22, w, PANEL_H + 22);
    for (int i = 0; i < p->n_panels; i++) svg_panel_draw(f, &p->panels[i], p, i);
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" fill=\"#555\">", w / 2, PANEL_H + 14);
    put_escaped(f, p->caption);
    fprintf(f, "</text>\n</svg>\n");
    bool ok = !ferror(f);
    return (fclose(f) == 0) && ok;
}
