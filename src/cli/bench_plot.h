/*
 * bench_plot.h - line plots for the bench reports (`kettle bench serve`,
 * `kettle bench agent`): side-by-side panels sharing one x axis, written
 * as a self-contained SVG file by hand, so a figure can be made on a bare
 * machine with no plotting library.
 */
#ifndef KT_CLI_BENCH_PLOT_H
#define KT_CLI_BENCH_PLOT_H

#include <stdbool.h>

#define BP_MAX_X 64
#define BP_MAX_SERIES 8
#define BP_MAX_PANELS 4

typedef struct bp_series {
    const char *name;  /* legend text; NULL: no legend entry */
    const char *color; /* an SVG color, "#1f77b4" */
    bool dashed;
    double v[BP_MAX_X]; /* one value per x tick */
} bp_series;

typedef struct bp_panel {
    const char *title, *y_label;
    bp_series s[BP_MAX_SERIES];
    int n_series;
} bp_panel;

typedef struct bp_plot {
    bp_panel panels[BP_MAX_PANELS];
    int n_panels;
    char x_tick[BP_MAX_X][16]; /* the labels of the x ticks, shared by every panel */
    int n_x;
    const char *x_label; /* under every panel */
    const char *caption; /* under the panels; escaped for XML here */
} bp_plot;

/* Writes the plot to path; false (errno set) if the file cannot be written
 * or the plot is larger than the limits above (EINVAL). */
bool bp_write_svg(const char *path, const bp_plot *p);

#endif
