/* plot.h (forge-internal): one SVG line plot with a log-scale y axis, the picture behind
 * `qforge analyze --svg` (KL divergence vs bits per element) and qf_kv_rd_write_svg (relative
 * MSE vs bits per element). Plain SVG 1.1, written atomically. */
#ifndef QF_FORGE_PLOT_H
#define QF_FORGE_PLOT_H

#include "qforge/error.h"

typedef struct {
    const char *name;          /* legend text */
    int n;                     /* points, drawn in the given order as one polyline */
    const double *x, *y;       /* y <= 0 is drawn on the bottom edge (the floor of the log scale) */
    const char *const *label;  /* per point tooltip label, or NULL */
} qf_plot_curve;

typedef struct {
    const char *title, *x_label, *y_label;
    int n_curves;
    const qf_plot_curve *curves;
    /* optional: a dashed black step line through these points (a Pareto frontier), legend name */
    int n_front;
    const double *front_x, *front_y;
    const char *front_name;
} qf_plot;

/* Write the plot to `path` atomically. x: linear, integer ticks; y: log10, decade ticks, the
 * range from the positive values (a curve with no positive y still gets a decade). Errors:
 * QF_ERR_ARG when no curve has a point, QF_ERR_NOMEM, the atomic write's QF_ERR_IO. */
qf_status qf_plot_write_svg(const qf_plot *p, const char *path, qf_error *err);

#endif
