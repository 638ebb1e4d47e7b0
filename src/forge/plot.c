/* plot.c: the forge's one SVG line plot (log-scale y), see plot.h. */
#include "plot.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "util/util.h"

typedef struct {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf;

__attribute__((format(printf, 2, 3))) static void sb_printf(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = true;
            return;
        }
        if (b->p && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t nc = b->cap ? b->cap * 2 : 4096;
        while (nc < b->n + (size_t)k + 1) nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
}

/* text with the XML specials escaped */
static void sb_escaped(sbuf *b, const char *s) {
    for (; s && *s; s++) {
        if (*s == '<') sb_printf(b, "&lt;");
        else if (*s == '>') sb_printf(b, "&gt;");
        else if (*s == '&') sb_printf(b, "&amp;");
        else if (*s == '"') sb_printf(b, "&quot;");
        else sb_printf(b, "%c", *s);
    }
}

qf_status qf_plot_write_svg(const qf_plot *p, const char *path, qf_error *err) {
    static const char *const colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                         "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
    const int n_colors = (int)(sizeof colors / sizeof colors[0]);
    const double W = 800, H = 500, ml = 70, mr = 210, mt = 40, mb = 50;
    double x0 = INFINITY, x1 = -INFINITY, e0 = INFINITY, e1 = -INFINITY;
    for (int c = 0; c < p->n_curves; c++)
        for (int k = 0; k < p->curves[c].n; k++) {
            double x = p->curves[c].x[k], y = p->curves[c].y[k];
            if (!isfinite(x)) continue;
            x0 = fmin(x0, x);
            x1 = fmax(x1, x);
            if (y > 0 && isfinite(y)) e0 = fmin(e0, y), e1 = fmax(e1, y);
        }
    if (!(x0 <= x1)) return qf_fail(err, QF_ERR_ARG, "svg: %s: expected at least one point", path);
    if (!(e0 <= e1)) e0 = e1 = 1e-6; /* nothing positive: one decade anywhere */
    x0 = floor(x0);
    x1 = ceil(x1);
    if (x1 <= x0) x1 = x0 + 1;
    double y0 = floor(log10(e0)), y1 = ceil(log10(e1));
    if (y1 <= y0) y1 = y0 + 1;
    const double floor_y = pow(10, y0); /* y <= 0 sits on the bottom edge */
    double pw = W - ml - mr, ph = H - mt - mb;
#define PX(b) (ml + ((b) - x0) / (x1 - x0) * pw)
#define PY(e) (mt + (y1 - log10(fmax((e), floor_y))) / (y1 - y0) * ph)
    sbuf b = {0};
    sb_printf(&b,
              "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
              "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
              "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"12\">\n"
              "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
              W, H, W, H);
    sb_printf(&b, "<text x=\"%.1f\" y=\"22\" font-size=\"15\" text-anchor=\"middle\">", ml + pw / 2);
    sb_escaped(&b, p->title ? p->title : "");
    sb_printf(&b, "</text>\n");
    /* grid and ticks: integer x, decades on y */
    double xstep = x1 - x0 > 20 ? ceil((x1 - x0) / 20) : 1;
    for (double xb = x0; xb <= x1 + 1e-9; xb += xstep) {
        sb_printf(&b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", PX(xb), mt, PX(xb),
                  mt + ph);
        sb_printf(&b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%g</text>\n", PX(xb), mt + ph + 16, xb);
    }
    for (double yd = y0; yd <= y1 + 1e-9; yd += 1) {
        double py = mt + (y1 - yd) / (y1 - y0) * ph;
        sb_printf(&b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", ml, py, ml + pw, py);
        sb_printf(&b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">1e%d</text>\n", ml - 6, py + 4, (int)yd);
    }
    sb_printf(&b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"black\"/>\n", ml, mt,
              pw, ph);
    sb_printf(&b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", ml + pw / 2, H - 12);
    sb_escaped(&b, p->x_label ? p->x_label : "");
    sb_printf(&b, "</text>\n<text x=\"16\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 16 %.1f)\">",
              mt + ph / 2, mt + ph / 2);
    sb_escaped(&b, p->y_label ? p->y_label : "");
    sb_printf(&b, "</text>\n");
    int legend = 0;
    if (p->n_front > 0) {
        /* a step line: the best y available at each x */
        sb_printf(&b, "<polyline fill=\"none\" stroke=\"black\" stroke-width=\"1.5\" stroke-dasharray=\"6 4\" points=\"");
        for (int k = 0; k < p->n_front; k++) {
            if (k) sb_printf(&b, " %.1f,%.1f", PX(p->front_x[k]), PY(p->front_y[k - 1]));
            sb_printf(&b, "%s%.1f,%.1f", k ? " " : "", PX(p->front_x[k]), PY(p->front_y[k]));
        }
        sb_printf(&b, "\"/>\n");
        double ly = mt + 10;
        sb_printf(&b,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\" stroke-dasharray=\"6 4\"/>\n"
                  "<text x=\"%.1f\" y=\"%.1f\">",
                  ml + pw + 12, ly, ml + pw + 36, ly, ml + pw + 42, ly + 4);
        sb_escaped(&b, p->front_name ? p->front_name : "frontier");
        sb_printf(&b, "</text>\n");
        legend++;
    }
    for (int c = 0; c < p->n_curves; c++) {
        const qf_plot_curve *cv = &p->curves[c];
        const char *col = colors[c % n_colors];
        sb_printf(&b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", col);
        for (int k = 0; k < cv->n; k++) sb_printf(&b, "%s%.1f,%.1f", k ? " " : "", PX(cv->x[k]), PY(cv->y[k]));
        sb_printf(&b, "\"/>\n");
        for (int k = 0; k < cv->n; k++) {
            sb_printf(&b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"><title>", PX(cv->x[k]), PY(cv->y[k]), col);
            sb_escaped(&b, cv->name);
            if (cv->label) {
                sb_printf(&b, " ");
                sb_escaped(&b, cv->label[k]);
            }
            sb_printf(&b, ": %.3f, %.3e</title></circle>\n", cv->x[k], cv->y[k]);
        }
        double ly = mt + 10 + legend++ * 20;
        sb_printf(&b,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"/>\n"
                  "<text x=\"%.1f\" y=\"%.1f\">",
                  ml + pw + 12, ly, ml + pw + 36, ly, col, ml + pw + 42, ly + 4);
        sb_escaped(&b, cv->name);
        sb_printf(&b, "</text>\n");
    }
#undef PX
#undef PY
    sb_printf(&b, "</svg>\n");
    if (b.oom) {
        free(b.p);
        return qf_fail(err, QF_ERR_NOMEM, "svg: %s: out of memory", path);
    }
    qf_status st = qf_write_file_atomic(path, b.p, b.n, err);
    free(b.p);
    return st;
}
