/* learn_kv_rq.c: the kv-rq learner (include/qforge/kv_rq.h): per (layer, stream, kv head) the
 * mean, the signed channel scales (random signs, times rms^alpha for smoothing) and Lloyd-Max
 * codebooks at 2..6 bits fitted on the normalized rotated coordinates of the captured
 * vectors; the payload; bits per element; the greedy sensitivity-driven bit allocation. */
#include "qforge/kv_rq.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kv_rq.h"
#include "forge/kv_rq_learn_impl.h"
#include "kernels/cuda/cuda_forge.h"
#include "kernels/hadamard.h"
#include "util/util.h"

void qf_kv_rq_learn_params_default(qf_kv_rq_learn_params *p) {
    memset(p, 0, sizeof *p);
    p->k_alpha = 0.5;
    p->v_alpha = 0.0;
    p->lloyd_iters = 30;
    p->max_rows = 4096;
    p->seed = 1;
    p->v_pred_noise = 0.2;
}

void qf_kv_rq_fit_free(qf_kv_rq_fit *f) {
    if (!f) return;
    free(f->v_pred), free(f->v_pred_ratio);
    qf_kv_rq_klt_fit_free(f->klt); /* format 3: learn_kv_rq_klt.c */
    for (int s = 0; s < 2; s++) {
        free(f->mean[s]), free(f->cs[s]), free(f->rel_mse[s]);
        for (int w = 0; w < QF_KV_RQ_N_WIDTHS; w++) free(f->levels[s][w]);
    }
    memset(f, 0, sizeof *f);
}

/* Fit one (layer, stream, head): rows x_r = x + (r * stride) * D for r < n. */
static qf_status fit_one(const float *x, int64_t n, int64_t stride, int D, double alpha, const float *cw, uint64_t sign_seed,
                         int iters, float *mean, float *cs, float *levels[QF_KV_RQ_N_WIDTHS], double *rel_mse,
                         float *u, qf_error *err) {
    /* mean and per-channel rms around it */
    double *acc = calloc((size_t)D * 2, sizeof(double));
    if (!acc) return qf_fail(err, QF_ERR_NOMEM, "kv-rq learn: out of memory");
    for (int64_t r = 0; r < n; r++)
        for (int c = 0; c < D; c++) acc[c] += x[r * stride * D + c];
    for (int c = 0; c < D; c++) mean[c] = (float)(acc[c] / (double)n);
    for (int64_t r = 0; r < n; r++)
        for (int c = 0; c < D; c++) {
            double d = x[r * stride * D + c] - mean[c];
            acc[D + c] += d * d;
        }
    double lg = 0;
    for (int c = 0; c < D; c++) {
        double rms = sqrt(acc[D + c] / (double)n), wc = cw && cw[c] > 1e-12 ? sqrt((double)cw[c]) : 1.0;
        if (cw && !(cw[c] > 1e-12)) wc = 1e-6;
        rms = rms > 1e-6 ? rms : 1e-6;
        acc[c] = alpha > 0 ? pow(rms / wc, alpha) : 1.0;
        lg += log(acc[c]);
    }
    double gm = exp(lg / D);
    uint64_t st = sign_seed;
    for (int c = 0; c < D; c++) cs[c] = (float)(acc[c] / gm) * ((qf_splitmix64(&st) >> 63) ? -1.0f : 1.0f);
    free(acc);
    /* normalized rotated coordinates u = H((x - mean) / cs) / rms */
    float *ics = malloc(sizeof(float) * (size_t)D * 3);
    if (!ics) return qf_fail(err, QF_ERR_NOMEM, "kv-rq learn: out of memory");
    float *scratch = ics + D;
    for (int c = 0; c < D; c++) ics[c] = 1.0f / cs[c];
    int64_t m = 0;
    for (int64_t r = 0; r < n; r++) {
        float *y = u + m * D;
        double ss = 0;
        for (int c = 0; c < D; c++) y[c] = (x[r * stride * D + c] - mean[c]) * ics[c];
        qf_hadamard(y, D);
        for (int c = 0; c < D; c++) ss += (double)y[c] * y[c];
        if (!(ss > 0)) continue;
        float inv = (float)(1.0 / sqrt(ss / D));
        for (int c = 0; c < D; c++) y[c] *= inv;
        m++;
    }
    qf_status status = QF_OK;
    for (int w = 0; w < QF_KV_RQ_N_WIDTHS && !status; w++) {
        int bits = QF_KV_RQ_MIN_BITS + w, L = 1 << bits;
        for (int k = 0; k < QF_KV_RQ_MAX_LEVELS; k++) levels[w][k] = 0;
        /* u is sorted by the first fit and reused as it is by the others */
        if ((status = qf_kv_rq_lloyd(u, m * D, L, iters, levels[w], err))) break;
        for (int k = L; k < QF_KV_RQ_MAX_LEVELS; k++) levels[w][k] = levels[w][L - 1] + (float)(k - L + 1);
        /* measured: relative squared error of the real codec (row scale refined, half) */
        qf_kv_rq_codec cd = {.head_dim = D, .bits = bits, .levels = levels[w], .mean = mean, .cs = cs, .inv_cs = ics};
        uint8_t row[QF_KV_RQ_SCALE_BYTES + QF_KV_RQ_MAX_HEAD_DIM];
        double num = 0, den = 0;
        int64_t step = n > 2048 ? n / 2048 : 1;
        for (int64_t r = 0; r < n; r += step) {
            const float *xr = x + r * stride * D;
            qf_kv_rq_encode(&cd, xr, scratch, row);
            qf_kv_rq_decode(&cd, row, scratch);
            for (int c = 0; c < D; c++) {
                double d = (double)xr[c] - scratch[c], e = (double)xr[c] - mean[c];
                num += d * d, den += e * e;
            }
        }
        rel_mse[w] = den > 0 ? num / den : 0;
    }
    free(ics);
    return status;
}


/* ---- the dense steps on the thread pool ----
 * Every output element is computed by one thread, in the order the serial loops used, and the
 * running sums are added in that order too: the fit is bit-identical for any thread count
 * (test_kv_rq_klt `learn_threads_bit_identical`). A NULL pool runs everything on the caller. */

/* Cholesky factor of the SPD A [n][n] in place (lower factor in A), column j's rows in parallel.
 * false when A is not positive definite. */
typedef struct {
    double *A;
    int n, j;
    double d;
} chol_col;

static void chol_col_worker(void *arg, int ith, int nth) {
    const chol_col *c = arg;
    double *A = c->A;
    int n = c->n, j = c->j;
    for (int i = j + 1 + ith; i < n; i += nth) {
        double v = A[(size_t)i * n + j];
        for (int k = 0; k < j; k++) v -= A[(size_t)i * n + k] * A[(size_t)j * n + k];
        A[(size_t)i * n + j] = v / c->d;
    }
}

void qf_kv_rq_pred_minus(const float *y, const float *P, const float *x, int n_out, int n_in, double *out) {
    int o = 0;
    for (; o + 4 <= n_out; o += 4) {
        const float *p0 = P + (size_t)o * n_in, *p1 = p0 + n_in, *p2 = p1 + n_in, *p3 = p2 + n_in;
        double a0 = y[o], a1 = y[o + 1], a2 = y[o + 2], a3 = y[o + 3];
        for (int i = 0; i < n_in; i++) {
            const double xi = x[i];
            a0 -= (double)p0[i] * xi, a1 -= (double)p1[i] * xi, a2 -= (double)p2[i] * xi, a3 -= (double)p3[i] * xi;
        }
        out[o] = a0, out[o + 1] = a1, out[o + 2] = a2, out[o + 3] = a3;
    }
    for (; o < n_out; o++) {
        const float *po = P + (size_t)o * n_in;
        double a = y[o];
        for (int i = 0; i < n_in; i++) a -= (double)po[i] * x[i];
        out[o] = a;
    }
}

void qf_kv_rq_matvec_f64(const double *A, const float *x, int n, int D, double *y) {
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const double *a0 = A + (size_t)i * D, *a1 = a0 + D, *a2 = a1 + D, *a3 = a2 + D;
        double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (int j = 0; j < D; j++) {
            const double xj = x[j];
            s0 += a0[j] * xj, s1 += a1[j] * xj, s2 += a2[j] * xj, s3 += a3[j] * xj;
        }
        y[i] = s0, y[i + 1] = s1, y[i + 2] = s2, y[i + 3] = s3;
    }
    for (; i < n; i++) {
        const double *a = A + (size_t)i * D;
        double s = 0;
        for (int j = 0; j < D; j++) s += a[j] * x[j];
        y[i] = s;
    }
}

/* L y = b, then L^T x = y for each column of b [n][m] (x overwrites b); columns in parallel,
 * four at a time, each through its own contiguous copy (tmp: four n-vectors per thread); the
 * four columns' substitutions advance together, each in the order of one column alone. */
typedef struct {
    const double *A;
    double *b, *tmp;
    int n, m;
} chol_sub;

static void chol_sub_worker(void *arg, int ith, int nth) {
    const chol_sub *c = arg;
    const double *A = c->A;
    int n = c->n, m = c->m;
    double *t = c->tmp + (size_t)ith * 4 * n; /* column q's copy at t[4 i + q] */
    for (int c0 = 4 * ith; c0 < m; c0 += 4 * nth) {
        int nc = m - c0 < 4 ? m - c0 : 4;
        for (int i = 0; i < n; i++)
            for (int q = 0; q < 4; q++) t[4 * i + q] = q < nc ? c->b[(size_t)i * m + c0 + q] : 0;
        for (int i = 0; i < n; i++) {
            double v[4] = {t[4 * i], t[4 * i + 1], t[4 * i + 2], t[4 * i + 3]};
            for (int k = 0; k < i; k++) {
                const double a = A[(size_t)i * n + k];
                v[0] -= a * t[4 * k], v[1] -= a * t[4 * k + 1], v[2] -= a * t[4 * k + 2], v[3] -= a * t[4 * k + 3];
            }
            for (int q = 0; q < 4; q++) t[4 * i + q] = v[q] / A[(size_t)i * n + i];
        }
        for (int i = n - 1; i >= 0; i--) {
            double v[4] = {t[4 * i], t[4 * i + 1], t[4 * i + 2], t[4 * i + 3]};
            for (int k = i + 1; k < n; k++) {
                const double a = A[(size_t)k * n + i];
                v[0] -= a * t[4 * k], v[1] -= a * t[4 * k + 1], v[2] -= a * t[4 * k + 2], v[3] -= a * t[4 * k + 3];
            }
            for (int q = 0; q < 4; q++) t[4 * i + q] = v[q] / A[(size_t)i * n + i];
        }
        for (int i = 0; i < n; i++)
            for (int q = 0; q < nc; q++) c->b[(size_t)i * m + c0 + q] = t[4 * i + q];
    }
}

/* Cholesky solve of the SPD system A x = b in place (A [n][n] row-major, lower factor kept in A;
 * b [n][m] overwritten with x; gpu: the substitutions on the device, the same bits). false when
 * A is not positive definite, out of memory, or the device failed (*gst set, err filled). */
static bool chol_solve(double *A, int n, double *b, int m, qf_pool *pool, bool gpu, qf_status *gst, qf_error *err) {
    for (int j = 0; j < n; j++) {
        double d = A[(size_t)j * n + j];
        for (int k = 0; k < j; k++) d -= A[(size_t)j * n + k] * A[(size_t)j * n + k];
        if (!(d > 0)) return false;
        d = sqrt(d);
        A[(size_t)j * n + j] = d;
        chol_col c = {A, n, j, d};
        if (n - j > 64) qf_pool_run(pool, chol_col_worker, &c);
        else chol_col_worker(&c, 0, 1);
    }
    if (gpu) return !(*gst = qf_cuda_learn_chol_sub_f64(A, n, b, m, err));
    double *tmp = malloc(sizeof(double) * 4 * (size_t)n * (size_t)qf_pool_size(pool));
    if (!tmp) return false;
    chol_sub c = {A, b, tmp, n, m};
    qf_pool_run(pool, chol_sub_worker, &c);
    free(tmp);
    return true;
}

/* The centred Gram sums A [dx][dx] (lower triangle) and B [dx][dy] over the n rows of the
 * centred xc [n][dx] = x - mx and yc [n][dy] = y - my (doubles, each difference rounded once);
 * rows i of A and B interleaved over the threads, the rows in tiles so that row i stays in
 * cache. */
typedef struct {
    const double *xc, *yc;
    int64_t n;
    int dx, dy;
    double *A, *B;
} gram_job;

static void gram_worker(void *arg, int ith, int nth) {
    const gram_job *g = arg;
    enum { RT = 32 };
    for (int64_t r0 = 0; r0 < g->n; r0 += RT) {
        int64_t r1 = r0 + RT < g->n ? r0 + RT : g->n;
        for (int i = ith; i < g->dx; i += nth) {
            double *Ai = g->A + (size_t)i * g->dx, *Bi = g->B + (size_t)i * g->dy;
            for (int64_t r = r0; r < r1; r++) {
                const double *xr = g->xc + r * g->dx, *yr = g->yc + r * g->dy, a = xr[i];
                for (int k = 0; k <= i; k++) Ai[k] += a * xr[k];
                for (int k = 0; k < g->dy; k++) Bi[k] += a * yr[k];
            }
        }
    }
}

/* The held-in residual of the fit on noisy inputs, per element: d [n][dy] = y - my - W^T xn,
 * xn = x - mx + noise; row r's noise from splitmix64 state seed + (2 dx r) steps, i.e. the
 * sequence a serial pass over the rows draws. WT [dy][dx] (W transposed, the same doubles). */
typedef struct {
    const float *x, *y;
    int64_t n;
    int dx, dy;
    double noise;
    const double *mx, *my, *A, *WT;
    float *xn; /* [threads][dx]; [n][dx] when the device takes the products (noise_worker) */
    double *d;
} resid_job;

#define LIN_FIT_SEED 12345u

/* row r of x as the decoder will see it: centred, plus its noise */
static void noisy_row(const resid_job *j, int64_t r, float *xn) {
    int dx = j->dx;
    const float *xr = j->x + r * dx;
    uint64_t st = LIN_FIT_SEED + (uint64_t)r * 2u * (uint64_t)dx * 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < dx; i++) {
        double u1 = ((double)(qf_splitmix64(&st) >> 11) + 0.5) / 9007199254740992.0;
        double u2 = ((double)(qf_splitmix64(&st) >> 11) + 0.5) / 9007199254740992.0;
        double g = sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
        xn[i] = (float)(xr[i] - j->mx[i] + g * sqrt(j->noise * j->A[(size_t)i * dx + i] / (1.0 + j->noise) / (double)j->n));
    }
}

/* every noisy row into xn [n][dx] (the device then takes the products) */
static void noise_worker(void *arg, int ith, int nth) {
    const resid_job *j = arg;
    for (int64_t r = ith; r < j->n; r += nth) noisy_row(j, r, j->xn + (size_t)r * j->dx);
}

static void resid_worker(void *arg, int ith, int nth) {
    const resid_job *j = arg;
    int dx = j->dx, dy = j->dy;
    float *xn = j->xn + (size_t)ith * dx;
    for (int64_t r = ith; r < j->n; r += nth) {
        const float *yr = j->y + r * dy;
        noisy_row(j, r, xn);
        double *dr = j->d + r * dy; /* the prediction W x first, then the residual over it */
        qf_kv_rq_matvec_f64(j->WT, xn, dy, dx, dr);
        for (int k = 0; k < dy; k++) dr[k] = yr[k] - j->my[k] - dr[k];
    }
}

static double linear_fit(const float *x, const float *y, int64_t n, int dx, int dy, double noise, float *P,
                         qf_pool *pool, bool gpu, qf_status *gst, qf_error *err) {
    /* centred ridge regression y ~ W x; the ridge is noise * diag(var x) (inputs that will be
     * dequantized with that relative error); returns the held-in residual / total variance.
     * gpu: the Gram sums, the substitutions and the residual's products on the device (the same
     * bits); a device failure returns NAN with *gst set. */
    int nth = qf_pool_size(pool);
    double *mx = calloc((size_t)dx, sizeof(double)), *my = calloc((size_t)dy, sizeof(double));
    double *A = calloc((size_t)dx * dx, sizeof(double)), *B = calloc((size_t)dx * dy, sizeof(double));
    double *A2 = NULL, *WT = NULL, *d = NULL;
    float *xn = NULL;
    double ratio = NAN;
    if (!mx || !my || !A || !B || n < 2) goto done;
    for (int64_t r = 0; r < n; r++) {
        for (int i = 0; i < dx; i++) mx[i] += x[r * dx + i];
        for (int i = 0; i < dy; i++) my[i] += y[r * dy + i];
    }
    for (int i = 0; i < dx; i++) mx[i] /= (double)n;
    for (int i = 0; i < dy; i++) my[i] /= (double)n;
    double tot = 0;
    for (int64_t r = 0; r < n; r++) {
        const float *yr = y + r * dy;
        for (int k = 0; k < dy; k++) tot += (yr[k] - my[k]) * (yr[k] - my[k]);
    }
    if (gpu) {
        if ((*gst = qf_cuda_learn_gram_f64(x, y, n, dx, dy, mx, my, A, B, err))) goto done;
    } else {
        double *xc = malloc(sizeof(double) * (size_t)n * (size_t)(dx + dy)), *yc = xc + (size_t)n * dx;
        if (!xc) goto done;
        for (int64_t r = 0; r < n; r++) {
            for (int i = 0; i < dx; i++) xc[r * dx + i] = x[r * dx + i] - mx[i];
            for (int i = 0; i < dy; i++) yc[r * dy + i] = y[r * dy + i] - my[i];
        }
        gram_job g = {xc, yc, n, dx, dy, A, B};
        qf_pool_run(pool, gram_worker, &g);
        free(xc);
    }
    for (int i = 0; i < dx; i++)
        for (int k = 0; k < i; k++) A[(size_t)k * dx + i] = A[(size_t)i * dx + k];
    for (int i = 0; i < dx; i++) A[(size_t)i * dx + i] *= 1.0 + noise, A[(size_t)i * dx + i] += 1e-9;
    double *W = B; /* solved in place: B is not needed after */
    if (!(A2 = malloc((size_t)dx * dx * sizeof(double)))) goto done;
    memcpy(A2, A, (size_t)dx * dx * sizeof(double));
    if (!chol_solve(A2, dx, W, dy, pool, gpu, gst, err)) goto done;
    WT = malloc((size_t)dx * dy * sizeof(double)), xn = malloc(sizeof(float) * (size_t)dx * (gpu ? (size_t)n : (size_t)nth));
    d = malloc(sizeof(double) * (size_t)n * dy);
    if (!WT || !xn || !d) goto done;
    for (int i = 0; i < dx; i++)
        for (int k = 0; k < dy; k++) WT[(size_t)k * dx + i] = W[(size_t)i * dy + k];
    resid_job rj = {x, y, n, dx, dy, noise, mx, my, A, WT, xn, d};
    if (gpu) {
        qf_pool_run(pool, noise_worker, &rj);
        if ((*gst = qf_cuda_learn_resid_f64(y, xn, n, dx, dy, my, WT, d, err))) goto done;
    } else
        qf_pool_run(pool, resid_worker, &rj);
    double res = 0;
    for (size_t i = 0; i < (size_t)n * dy; i++) res += d[i] * d[i];
    ratio = tot > 0 ? res / tot : NAN;
    if (P)
        for (int k = 0; k < dy; k++)
            for (int i = 0; i < dx; i++) P[(size_t)k * dx + i] = (float)W[(size_t)i * dy + k];
done:
    free(mx), free(my), free(A), free(B), free(A2), free(WT), free(xn), free(d);
    return ratio;
}

double qf_kv_rq_linear_fit(const float *x, const float *y, int64_t n, int dx, int dy, double noise, float *P) {
    qf_status gst = QF_OK;
    return linear_fit(x, y, n, dx, dy, noise, P, NULL, false, &gst, NULL);
}

/* V minus its prediction from the same token's K, for the fitting rows only: out row r =
 * token r * stride (P [HD][HD], rows of HD), tokens over the threads. */
typedef struct {
    const float *k, *v, *P;
    int64_t rows, stride;
    int HD;
    float *out;
    double *acc; /* [threads][HD] */
} vres_job;

static void vres_worker(void *arg, int ith, int nth) {
    const vres_job *j = arg;
    int HD = j->HD;
    for (int64_t r = ith; r < j->rows; r += nth) {
        const float *kt = j->k + (size_t)(r * j->stride) * HD, *vt = j->v + (size_t)(r * j->stride) * HD;
        float *rt = j->out + (size_t)r * HD;
        double *a = j->acc + (size_t)ith * HD;
        qf_kv_rq_pred_minus(vt, j->P, kt, HD, HD, a);
        for (int o = 0; o < HD; o++) rt[o] = (float)a[o];
    }
}

/* The (layer, stream, head) fits, one unit each, over the threads (a shared counter hands them
 * out; each result lands in the unit's own slots, summed afterwards in the serial order). */
typedef struct {
    const qf_kv_capture_view *v;
    const qf_kv_rq_learn_params *p;
    qf_kv_rq_fit *f;
    float *const *resid; /* [L] V residual rows (rows x H*D), or NULL */
    const int64_t *rows, *stride;
    float *u;            /* [threads][max_rows * D] */
    int64_t max_rows;
    double *rm;          /* [unit][N_WIDTHS] */
    qf_status *st;       /* [unit] */
    qf_error *err;       /* [unit] */
    atomic_int next;
    int n_units;
} fit_job;

static void fit_worker(void *arg, int ith, int nth) {
    (void)nth;
    fit_job *j = arg;
    const qf_kv_rq_learn_params *p = j->p;
    int H = j->v->n_kv_head, D = j->v->head_dim;
    float *u = j->u + (size_t)ith * j->max_rows * D;
    for (int un; (un = atomic_fetch_add(&j->next, 1)) < j->n_units;) {
        int l = un / (2 * H), s = un / H % 2, h = un % H, ls = l * 2 + s;
        size_t o = ((size_t)l * H + h) * D, ol = ((size_t)l * H + h) * QF_KV_RQ_MAX_LEVELS;
        float *lv[QF_KV_RQ_N_WIDTHS];
        for (int w = 0; w < QF_KV_RQ_N_WIDTHS; w++) lv[w] = j->f->levels[s][w] + ol;
        /* rows of head h are vectors r * H + h: x + h * D with a stride of stride * H vectors
         * (the V residual holds the fitting rows only: stride 1) */
        const float *x = s ? j->v->v[l] : j->v->k[l];
        int64_t stride = j->stride[ls];
        if (s == 1 && j->resid) x = j->resid[l], stride = 1;
        j->st[un] = fit_one(x + (size_t)h * D, j->rows[ls], stride * H, D, s ? p->v_alpha : p->k_alpha,
                            p->chan_w[s] ? p->chan_w[s] + o : NULL,
                            p->seed * 0x9E3779B97F4A7C15ull + (uint64_t)((l * 2 + s) * H + h), p->lloyd_iters,
                            j->f->mean[s] + o, j->f->cs[s] + o, lv, j->rm + (size_t)un * QF_KV_RQ_N_WIDTHS, u,
                            &j->err[un]);
    }
}

qf_status qf_kv_rq_learn(const qf_kv_capture_view *v, const qf_kv_rq_learn_params *p, qf_kv_rq_fit *f,
                         qf_error *err) {
    memset(f, 0, sizeof *f);
    int L = v->n_layer, H = v->n_kv_head, D = v->head_dim;
    if (L < 1 || H < 1 || qf_kv_rq_row_bytes(D, QF_KV_RQ_MIN_BITS) == 0)
        return qf_fail(err, QF_ERR_ARG, "kv-rq learn: %d layers, %d kv heads, head_dim %d: expected head_dim a power of "
                                        "two in [%d, %d]",
                       L, H, D, QF_KV_RQ_MIN_HEAD_DIM, QF_KV_RQ_MAX_HEAD_DIM);
    f->n_layer = L, f->n_kv_head = H, f->head_dim = D;
    size_t nv = (size_t)L * H * D, nl = (size_t)L * H * QF_KV_RQ_MAX_LEVELS;
    int HD = H * D, U = 2 * L * H;
    qf_pool *pool = NULL;
    float **resid = NULL; /* [L] V minus its prediction from the same layer's K, when p->v_pred */
    int64_t *rows = calloc((size_t)2 * L, sizeof(int64_t)), *stride = calloc((size_t)2 * L, sizeof(int64_t));
    double *rm = calloc((size_t)U * QF_KV_RQ_N_WIDTHS, sizeof(double));
    qf_status *ust = calloc((size_t)U, sizeof(qf_status));
    qf_error *uerr = calloc((size_t)U, sizeof(qf_error));
    float *u = NULL;
    qf_status st = QF_OK;
    if (!rows || !stride || !rm || !ust || !uerr) goto oom;
    for (int s = 0; s < 2; s++) {
        f->mean[s] = malloc(nv * sizeof(float));
        f->cs[s] = malloc(nv * sizeof(float));
        f->rel_mse[s] = calloc((size_t)L * QF_KV_RQ_N_WIDTHS, sizeof(double));
        if (!f->mean[s] || !f->cs[s] || !f->rel_mse[s]) goto oom;
        for (int w = 0; w < QF_KV_RQ_N_WIDTHS; w++)
            if (!(f->levels[s][w] = malloc(nl * sizeof(float)))) goto oom;
    }
    int64_t max_rows = 0;
    for (int l = 0; l < L; l++)
        for (int s = 0; s < 2; s++) {
            int64_t n = s ? v->n_v[l] : v->n_k[l];
            const float *x = s ? v->v[l] : v->k[l];
            if (!x || n / H < 64) {
                st = qf_fail(err, QF_ERR_CAPTURE_FAILED, "kv-rq learn: layer %d %c: %lld captured vectors, need at "
                                                         "least %d (capture more tokens)",
                             l, s ? 'V' : 'K', (long long)n, 64 * H);
                goto fail;
            }
            int64_t nt = n / H, r = p->max_rows > 0 && nt > p->max_rows ? p->max_rows : nt;
            rows[l * 2 + s] = r, stride[l * 2 + s] = nt / r; /* strided subsample of the rows, in whole rows */
            if (r > max_rows) max_rows = r;
        }
    if (p->n_threads > 1 && !(pool = qf_pool_create(p->n_threads))) goto oom;
    if (p->v_pred) {
        for (int l = 0; l < L; l++)
            if (v->n_v[l] != v->n_v[0] || v->n_k[l] != v->n_v[0]) {
                st = qf_fail(err, QF_ERR_CAPTURE_FAILED, "kv-rq learn: V prediction needs as many K as V vectors in "
                                                         "every layer");
                goto fail;
            }
        if (!(f->v_pred = calloc((size_t)L * HD * HD, sizeof(float))) ||
            !(f->v_pred_ratio = calloc((size_t)L, sizeof(double))) || !(resid = calloc((size_t)L, sizeof(float *))))
            goto oom;
        for (int l = 0; l < L; l++) {
            /* ridge fit on up to 4096 tokens, then the residual of the fitting rows */
            int64_t nt = v->n_v[l] / H, nf = nt < 4096 ? nt : 4096;
            float *P = f->v_pred + (size_t)l * HD * HD;
            qf_status gst = QF_OK;
            f->v_pred_ratio[l] = linear_fit(v->k[l], v->v[l], nf, HD, HD, p->v_pred_noise, P, pool, p->gpu, &gst, err);
            if (gst) {
                st = gst;
                qf_error_prefix(err, "kv-rq learn: layer %d V predictor on the GPU: ", l);
                goto fail;
            }
            if (!(f->v_pred_ratio[l] < 0.9)) { /* explains too little: no prediction in this layer */
                memset(P, 0, sizeof(float) * (size_t)HD * HD);
                f->v_pred_ratio[l] = 1;
            }
            if (!(resid[l] = malloc(sizeof(float) * (size_t)rows[l * 2 + 1] * HD))) goto oom;
            if (p->gpu) {
                if ((st = qf_cuda_learn_rows_minus_f64(v->v[l], v->k[l], rows[l * 2 + 1], stride[l * 2 + 1], HD, P, NULL,
                                                       resid[l], err))) {
                    qf_error_prefix(err, "kv-rq learn: layer %d V residual on the GPU: ", l);
                    goto fail;
                }
            } else {
                double *acc = malloc(sizeof(double) * (size_t)HD * (size_t)qf_pool_size(pool));
                if (!acc) goto oom;
                vres_job vj = {v->k[l], v->v[l], P, rows[l * 2 + 1], stride[l * 2 + 1], HD, resid[l], acc};
                qf_pool_run(pool, vres_worker, &vj);
                free(acc);
            }
        }
    }
    if (!(u = malloc(sizeof(float) * (size_t)max_rows * D * (size_t)qf_pool_size(pool)))) goto oom;
    fit_job fj = {.v = v, .p = p, .f = f, .resid = resid, .rows = rows, .stride = stride, .u = u,
                  .max_rows = max_rows, .rm = rm, .st = ust, .err = uerr, .n_units = U};
    atomic_init(&fj.next, 0);
    qf_pool_run(pool, fit_worker, &fj);
    for (int un = 0; un < U; un++) /* the first failing unit in the serial order */
        if (ust[un]) {
            if (err) *err = uerr[un];
            st = ust[un];
            qf_error_prefix(err, "layer %d %c head %d: ", un / (2 * H), un / H % 2 ? 'V' : 'K', un % H);
            goto fail;
        }
    for (int un = 0; un < U; un++) {
        int l = un / (2 * H), s = un / H % 2;
        for (int w = 0; w < QF_KV_RQ_N_WIDTHS; w++) f->rel_mse[s][l * QF_KV_RQ_N_WIDTHS + w] += rm[(size_t)un * QF_KV_RQ_N_WIDTHS + w] / H;
    }
    goto out;
oom:
    st = qf_fail(err, QF_ERR_NOMEM, "kv-rq learn: out of memory");
fail:
    qf_kv_rq_fit_free(f);
out:
    for (int l = 0; resid && l < L; l++) free(resid[l]);
    free(resid), free(u), free(rows), free(stride), free(rm), free(ust), free(uerr);
    qf_pool_free(pool);
    return st;
}

/* the payload's arrays that depend on the allocation, stream s: b [L] the bits and lv [L][H][64]
 * the Hadamard codec's levels at each layer's whole-bit width (width 0's for other rates) */
static void bit_arrays(const qf_kv_rq_fit *f, const int *bits, int s, float *lv, uint8_t *b) {
    int L = f->n_layer, H = f->n_kv_head;
    for (int l = 0; l < L; l++) {
        int bb = bits[l];
        b[l] = (uint8_t)bb;
        int w = bb >= QF_KV_RQ_MIN_BITS && bb <= QF_KV_RQ_MAX_BITS ? bb - QF_KV_RQ_MIN_BITS : 0;
        memcpy(lv + (size_t)l * H * QF_KV_RQ_MAX_LEVELS, f->levels[s][w] + (size_t)l * H * QF_KV_RQ_MAX_LEVELS,
               (size_t)H * QF_KV_RQ_MAX_LEVELS * sizeof(float));
    }
}

/* pl's entry `name` when it has the type and element count given, else NULL */
static qf_payload_entry *entry_of(qf_payload *pl, const char *name, qf_payload_type type, size_t count) {
    for (size_t i = 0; i < pl->n; i++)
        if (!strcmp(pl->entries[i].name, name))
            return pl->entries[i].type == type && pl->entries[i].count == count ? &pl->entries[i] : NULL;
    return NULL;
}

qf_status qf_kv_rq_payload_update(const qf_kv_rq_fit *f, const int *const bits[2], int n_sink, int n_window,
                                  qf_payload *pl, qf_error *err) {
    int L = f->n_layer, H = f->n_kv_head, D = f->head_dim;
    size_t lhd = (size_t)L * H * D;
    qf_payload_entry *ns = entry_of(pl, "n_sink", QF_PAYLOAD_INT, 0), *nw = entry_of(pl, "n_window", QF_PAYLOAD_INT, 0);
    qf_payload_entry *eb[2], *el[2], *kw[2] = {NULL, NULL}, *kl[2] = {NULL, NULL};
    bool ok = ns && nw;
    for (int s = 0; s < 2 && ok; s++) { /* every entry found before any is written */
        char name[32];
        const char *sn = s ? "v" : "k";
        snprintf(name, sizeof name, "%s_bits", sn);
        eb[s] = entry_of(pl, name, QF_PAYLOAD_U8, (size_t)L);
        snprintf(name, sizeof name, "%s_levels", sn);
        el[s] = entry_of(pl, name, QF_PAYLOAD_F32, (size_t)L * H * QF_KV_RQ_MAX_LEVELS);
        if (f->klt) {
            snprintf(name, sizeof name, "%s_klt_width", sn);
            kw[s] = entry_of(pl, name, QF_PAYLOAD_U8, lhd);
            snprintf(name, sizeof name, "%s_klt_levels", sn);
            kl[s] = entry_of(pl, name, QF_PAYLOAD_F32, lhd * QF_KV_RQ_MAX_LEVELS);
        }
        ok = eb[s] && el[s] && (!f->klt || (kw[s] && kl[s]));
    }
    if (!ok) return qf_fail(err, QF_ERR_ARG, "kv-rq payload update: the payload was not built by qf_kv_rq_payload for this fit");
    for (int s = 0; s < 2; s++) {
        bit_arrays(f, bits[s], s, el[s]->f32, eb[s]->bytes);
        if (f->klt) qf_kv_rq_klt_bit_arrays(f, s, bits[s], kl[s]->f32, kw[s]->bytes);
    }
    ns->i = n_sink, nw->i = n_window;
    return QF_OK;
}

qf_status qf_kv_rq_payload(const qf_kv_rq_fit *f, const int *const bits[2], int n_sink, int n_window, qf_payload *pl,
                           qf_error *err) {
    int L = f->n_layer, H = f->n_kv_head, D = f->head_dim;
    size_t nl = (size_t)L * H * QF_KV_RQ_MAX_LEVELS;
    float *lv = malloc(nl * sizeof(float));
    uint8_t *b = malloc((size_t)L);
    if (!lv || !b) {
        free(lv), free(b);
        return qf_fail(err, QF_ERR_NOMEM, "kv-rq payload: out of memory");
    }
    qf_status st = qf_payload_add_int(pl, "format", f->klt ? QF_KV_RQ_FORMAT_KLT : QF_KV_RQ_FORMAT, err);
    if (!st) st = qf_payload_add_string(pl, "rotation", f->klt ? "klt" : "hadamard", err);
    if (!st && f->klt) st = qf_kv_rq_klt_payload(f, bits, pl, err); /* format 3: learn_kv_rq_klt.c */
    if (!st) st = qf_payload_add_int(pl, "n_sink", n_sink, err);
    if (!st) st = qf_payload_add_int(pl, "n_window", n_window, err);
    if (!st) st = qf_payload_add_int(pl, "k_prerope", f->k_prerope ? 1 : 0, err);
    if (!st && f->v_pred) {
        int64_t shp[3] = {L, (int64_t)H * D, (int64_t)H * D};
        st = qf_payload_add_f32(pl, "v_pred", f->v_pred, 3, shp, err);
    }
    for (int s = 0; s < 2 && !st; s++) {
        const char *sn = s ? "v" : "k";
        char name[32];
        bit_arrays(f, bits[s], s, lv, b);
        int64_t sh1[1] = {L}, sh3l[3] = {L, H, QF_KV_RQ_MAX_LEVELS}, sh3[3] = {L, H, D};
        snprintf(name, sizeof name, "%s_bits", sn);
        if (!st) st = qf_payload_add_u8(pl, name, b, 1, sh1, err);
        snprintf(name, sizeof name, "%s_levels", sn);
        if (!st) st = qf_payload_add_f32(pl, name, lv, 3, sh3l, err);
        snprintf(name, sizeof name, "%s_mean", sn);
        if (!st) st = qf_payload_add_f32(pl, name, f->mean[s], 3, sh3, err);
        snprintf(name, sizeof name, "%s_cs", sn);
        if (!st) st = qf_payload_add_f32(pl, name, f->cs[s], 3, sh3, err);
    }
    free(lv), free(b);
    return st;
}

double qf_kv_rq_bits_per_element(const int *const bits[2], int n_layer, int head_dim, int n_sink, int n_window,
                                 int n_ctx) {
    double b = 0;
    for (int s = 0; s < 2; s++)
        for (int l = 0; l < n_layer; l++) b += 8.0 * (double)qf_kv_rq_any_row_bytes(head_dim, bits[s][l]) / head_dim;
    b /= 2.0 * n_layer;
    if (n_ctx > 0) b += 16.0 * (n_sink + n_window) / n_ctx;
    return b;
}

double qf_kv_rq_allocate(const qf_kv_rq_fit *f, const double *const sens[2], double max_code_bits, int *const bits[2]) {
    return qf_kv_rq_allocate_min(f, sens, max_code_bits, QF_KV_RQ_SENS_BITS, bits);
}

double qf_kv_rq_allocate_min(const qf_kv_rq_fit *f, const double *const sens[2], double max_code_bits, int min_bits,
                             int *const bits[2]) {
    if (f->klt && f->klt->eighths) return qf_kv_rq_klt_allocate(f, sens, max_code_bits, min_bits, bits); /* format 3 */
    int L = f->n_layer, U = 2 * L;
    if (min_bits < QF_KV_RQ_MIN_BITS) min_bits = QF_KV_RQ_MIN_BITS;
    if (min_bits > QF_KV_RQ_MAX_BITS) min_bits = QF_KV_RQ_MAX_BITS;
    for (int s = 0; s < 2; s++)
        for (int l = 0; l < L; l++) bits[s][l] = min_bits;
    double total_bits = min_bits * (double)U;
    const int w0 = QF_KV_RQ_SENS_BITS - QF_KV_RQ_MIN_BITS; /* sens is measured at this width */
#define PRED(s, l, b) \
    (sens[s][l] * f->rel_mse[s][(l) * QF_KV_RQ_N_WIDTHS + (b) - QF_KV_RQ_MIN_BITS] / f->rel_mse[s][(l) * QF_KV_RQ_N_WIDTHS + w0])
    for (;;) {
        int bs = -1, bl = -1;
        double best = -1;
        if ((total_bits + 1) / U > max_code_bits + 1e-9) break;
        for (int s = 0; s < 2; s++)
            for (int l = 0; l < L; l++) {
                int b = bits[s][l];
                if (b >= QF_KV_RQ_MAX_BITS || !(f->rel_mse[s][l * QF_KV_RQ_N_WIDTHS + w0] > 0)) continue;
                double gain = PRED(s, l, b) - PRED(s, l, b + 1);
                if (gain > best) best = gain, bs = s, bl = l;
            }
        if (bs < 0) break;
        bits[bs][bl]++;
        total_bits += 1;
    }
    double pred = 0;
    for (int s = 0; s < 2; s++)
        for (int l = 0; l < L; l++)
            pred += f->rel_mse[s][l * QF_KV_RQ_N_WIDTHS + w0] > 0 ? PRED(s, l, bits[s][l]) : 0;
#undef PRED
    return pred;
}
