/* learn_kv_rq_klt.c: the kv-rq format-3 learner (include/qforge/kv_rq.h "Format 3"): per
 * (layer, stream, kv head) a KLT in the attention's metric, per-coordinate Lloyd-Max codebooks
 * and greedy reverse water-filling of the row's bits over the coordinates. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kv_rq.h"
#include "engine/kv_rq_klt.h"
#include "forge/kv_rq_learn_impl.h"
#include "kernels/cuda/cuda_forge.h"
#include "qforge/kv_rq.h"
#include "util/util.h"

#define NW QF_KV_RQ_N_WIDTHS
#define QF_KV_RQ_MAX_LAYERS_ALLOC 256 /* layers whose allocation state fits on the stack */
#define NL QF_KV_RQ_MAX_LEVELS

void qf_kv_rq_klt_fit_free(qf_kv_rq_klt_fit *k) {
    if (!k) return;
    for (int s = 0; s < 2; s++) {
        free(k->enc[s]), free(k->dec[s]), free(k->sigma[s]), free(k->levels[s]), free(k->width[s]);
        free(k->eig[s]), free(k->had_rel_mse[s]), free(k->rel8[s]);
    }
    free(k);
}

/* Cyclic Jacobi eigen-decomposition of the symmetric A [n][n] (destroyed): w[n] eigenvalues
 * descending, V [n][n] with the matching eigenvectors as columns. */
static void jacobi_eig(double *A, int n, double *V, double *w) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) V[(size_t)i * n + j] = i == j;
    for (int sweep = 0; sweep < 60; sweep++) {
        double off = 0, diag = 0;
        for (int i = 0; i < n; i++) {
            diag += A[(size_t)i * n + i] * A[(size_t)i * n + i];
            for (int j = i + 1; j < n; j++) off += A[(size_t)i * n + j] * A[(size_t)i * n + j];
        }
        if (!(off > 1e-24 * diag)) break;
        for (int p = 0; p < n; p++)
            for (int q = p + 1; q < n; q++) {
                double apq = A[(size_t)p * n + q];
                if (fabs(apq) < 1e-300) continue;
                double app = A[(size_t)p * n + p], aqq = A[(size_t)q * n + q];
                double th = 0.5 * (aqq - app) / apq;
                double t = (th >= 0 ? 1.0 : -1.0) / (fabs(th) + sqrt(th * th + 1.0));
                double c = 1.0 / sqrt(t * t + 1.0), sn = t * c;
                for (int k = 0; k < n; k++) { /* A <- J^T A J (columns then rows) */
                    double akp = A[(size_t)k * n + p], akq = A[(size_t)k * n + q];
                    A[(size_t)k * n + p] = c * akp - sn * akq;
                    A[(size_t)k * n + q] = sn * akp + c * akq;
                }
                for (int k = 0; k < n; k++) {
                    double apk = A[(size_t)p * n + k], aqk = A[(size_t)q * n + k];
                    A[(size_t)p * n + k] = c * apk - sn * aqk;
                    A[(size_t)q * n + k] = sn * apk + c * aqk;
                }
                for (int k = 0; k < n; k++) {
                    double vkp = V[(size_t)k * n + p], vkq = V[(size_t)k * n + q];
                    V[(size_t)k * n + p] = c * vkp - sn * vkq;
                    V[(size_t)k * n + q] = sn * vkp + c * vkq;
                }
            }
    }
    for (int i = 0; i < n; i++) w[i] = A[(size_t)i * n + i];
    for (int i = 0; i < n; i++) { /* selection sort, descending, columns along */
        int m = i;
        for (int j = i + 1; j < n; j++)
            if (w[j] > w[m]) m = j;
        if (m == i) continue;
        double t = w[i];
        w[i] = w[m], w[m] = t;
        for (int k = 0; k < n; k++) {
            t = V[(size_t)k * n + i];
            V[(size_t)k * n + i] = V[(size_t)k * n + m], V[(size_t)k * n + m] = t;
        }
    }
}

/* One (layer, stream, head): rows X [n][D] already centred (minus the fit's mean). Writes enc,
 * dec, sigma, levels [D][NW][NL], width [49][D] (stride wstride between rates), eig, rel8 [49]. */
static qf_status fit_head(const float *X, int64_t n, int D, const double *M, const double *Minv, float *enc, float *dec,
                          float *sigma, float *levels, uint8_t *width, size_t wstride, double *eig, double *rel8,
                          qf_error *err) {
    size_t DD = (size_t)D * D;
    double *C = calloc(DD, sizeof(double)), *R = malloc(DD * sizeof(double)), *u = malloc((size_t)D * sizeof(double));
    float *t = malloc(sizeof(float) * (size_t)n * D), *col = malloc(sizeof(float) * (size_t)n);
    double *dist = malloc(sizeof(double) * (size_t)D * (NW + 1));
    qf_status st = QF_OK;
    if (!C || !R || !u || !t || !col || !dist) {
        st = qf_fail(err, QF_ERR_NOMEM, "kv-rq klt: out of memory");
        goto done;
    }
    /* covariance of M x */
    for (int64_t r = 0; r < n; r++) {
        qf_kv_rq_matvec_f64(M, X + r * D, D, D, u);
        for (int i = 0; i < D; i++)
            for (int j = 0; j <= i; j++) C[(size_t)i * D + j] += u[i] * u[j];
    }
    for (int i = 0; i < D; i++)
        for (int j = 0; j <= i; j++) C[(size_t)j * D + i] = C[(size_t)i * D + j] /= (double)n;
    jacobi_eig(C, D, R, eig);
    double floor_ = eig[0] > 0 ? eig[0] * 1e-10 : 1e-30;
    for (int i = 0; i < D; i++) {
        if (!(eig[i] > floor_)) eig[i] = floor_;
        sigma[i] = (float)sqrt(eig[i]);
    }
    /* enc = R^T M, dec = Minv R */
    for (int i = 0; i < D; i++)
        for (int j = 0; j < D; j++) {
            double a = 0, b = 0;
            for (int k = 0; k < D; k++) a += R[(size_t)k * D + i] * M[(size_t)k * D + j], b += Minv[(size_t)i * D + k] * R[(size_t)k * D + j];
            enc[(size_t)i * D + j] = (float)a, dec[(size_t)i * D + j] = (float)b;
        }
    /* standardized, row-scaled coordinates t = z / rms(z), z_i = (enc x)_i / sigma_i */
    int64_t m = 0;
    double ua[QF_KV_RQ_MAX_HEAD_DIM];
    for (int64_t r = 0; r < n; r++) {
        const float *x = X + r * D;
        float *tr = t + m * D;
        double ss = 0;
        qf_kv_rq_klt_matvec(enc, x, D, D, ua);
        for (int i = 0; i < D; i++) {
            tr[i] = (float)(ua[i] / sigma[i]);
            ss += (double)tr[i] * tr[i];
        }
        if (!(ss > 0) || !isfinite(ss)) continue;
        float inv = (float)(1.0 / sqrt(ss / D));
        for (int i = 0; i < D; i++) tr[i] *= inv;
        m++;
    }
    if (m < 2 * NL) {
        st = qf_fail(err, QF_ERR_CAPTURE_FAILED, "kv-rq klt: %lld nonzero rows, need at least %d", (long long)m, 2 * NL);
        goto done;
    }
    /* per coordinate: Lloyd-Max at widths 1..NW and the measured distortion (eigenvalue units) */
    for (int i = 0; i < D && !st; i++) {
        double e0 = 0;
        for (int64_t r = 0; r < m; r++) col[r] = t[r * D + i], e0 += (double)col[r] * col[r];
        dist[(size_t)i * (NW + 1)] = eig[i] * e0 / (double)m;
        for (int w = 1; w <= NW && !st; w++) {
            float *lv = levels + ((size_t)i * NW + (w - 1)) * NL;
            for (int k = 0; k < NL; k++) lv[k] = 0;
            if ((st = qf_kv_rq_lloyd(col, m, 1 << w, 30, lv, err))) break;
            for (int k = 1 << w; k < NL; k++) lv[k] = lv[(1 << w) - 1] + (float)(k - (1 << w) + 1);
            double e = 0;
            for (int64_t r = 0; r < m; r++) {
                double d = col[r] - lv[qf_kv_rq_nearest(lv, 1 << w, col[r])];
                e += d * d;
            }
            dist[(size_t)i * (NW + 1) + w] = eig[i] * e / (double)m;
        }
    }
    /* greedy reverse water-filling, one bit at a time (the path is nested): the widths at
     * e * D / 8 bits are snapshot e, with the predicted relative error sum_i dist_i / sum_i eig_i */
    if (!st) {
        uint8_t wd[QF_KV_RQ_MAX_HEAD_DIM] = {0};
        double tot = 0, cur = 0;
        for (int i = 0; i < D; i++) tot += eig[i], cur += dist[(size_t)i * (NW + 1)];
        for (int used = 0, e = 0; e < QF_KV_RQ_KLT_N_RATES; e++) {
            for (; used < e * D / 8; used++) {
                int bi = -1;
                double best = -INFINITY;
                for (int i = 0; i < D; i++) {
                    if (wd[i] >= QF_KV_RQ_KLT_MAX_WIDTH) continue;
                    double g = dist[(size_t)i * (NW + 1) + wd[i]] - dist[(size_t)i * (NW + 1) + wd[i] + 1];
                    if (g > best) best = g, bi = i;
                }
                if (bi < 0) break;
                cur -= dist[(size_t)bi * (NW + 1) + wd[bi]] - dist[(size_t)bi * (NW + 1) + wd[bi] + 1];
                wd[bi]++;
            }
            memcpy(width + (size_t)e * wstride, wd, (size_t)D);
            rel8[e] = tot > 0 ? cur / tot : 0;
        }
    }
done:
    free(C), free(R), free(u), free(t), free(col), free(dist);
    return st;
}

/* the metric's square root M and its inverse [D][D] for (layer, stream, head) */
static void metric(int s, const float *kw, const float *vgram, int D, double *M, double *Minv, double *scratch) {
    size_t DD = (size_t)D * D;
    memset(M, 0, DD * sizeof(double)), memset(Minv, 0, DD * sizeof(double));
    if (s == 0 && kw) {
        double lg = 0, mx = 0;
        for (int i = 0; i < D; i++) mx = kw[i] > mx ? kw[i] : mx;
        for (int i = 0; i < D; i++) lg += log(kw[i] > mx * 1e-6 ? kw[i] : mx * 1e-6 + 1e-30);
        double gm = exp(lg / D);
        for (int i = 0; i < D; i++) {
            double wv = (kw[i] > mx * 1e-6 ? kw[i] : mx * 1e-6 + 1e-30) / gm;
            M[(size_t)i * D + i] = sqrt(wv), Minv[(size_t)i * D + i] = 1.0 / sqrt(wv);
        }
        return;
    }
    if (s == 1 && vgram) {
        double *A = scratch, *V = scratch + DD, *w = scratch + 2 * DD, tr = 0;
        for (int i = 0; i < D; i++) tr += vgram[(size_t)i * D + i];
        tr = tr > 0 ? tr / D : 1;
        for (size_t i = 0; i < DD; i++) A[i] = vgram[i] / tr;
        jacobi_eig(A, D, V, w);
        double fl = w[0] * 1e-4 > 1e-12 ? w[0] * 1e-4 : 1e-12;
        for (int k = 0; k < D; k++) {
            double e = w[k] > fl ? w[k] : fl, r = sqrt(e);
            for (int i = 0; i < D; i++)
                for (int j = 0; j < D; j++) {
                    double vv = V[(size_t)i * D + k] * V[(size_t)j * D + k];
                    M[(size_t)i * D + j] += r * vv, Minv[(size_t)i * D + j] += vv / r;
                }
        }
        return;
    }
    for (int i = 0; i < D; i++) M[(size_t)i * D + i] = Minv[(size_t)i * D + i] = 1;
}

/* One (layer, stream, head) unit of qf_kv_rq_learn_klt per call of the shared counter; its
 * results land in its own slots (r8, rel3, relh), summed in the serial order afterwards. */
typedef struct {
    const qf_kv_capture_view *v;
    const float *kw, *vgram;
    const qf_kv_rq_fit *f;
    qf_kv_rq_klt_fit *k;
    int64_t max_rows;
    double *scratch;       /* [threads][2 DD + D + DD + DD]: scr, M, Minv */
    float *xs;             /* [threads][max_rows * D + 5 D] */
    float **vres;          /* [L] V minus its prediction and the mean, rows x H*D (the device's), or NULL */
    uint8_t *rowb;         /* [threads][scale + D] */
    int64_t mz;            /* rows a unit's codec error measures, at most (< 2048) */
    float *zbuf;           /* [threads][mz * D + D * D]: format 3's transform of those rows, dec transposed */
    double *zss;           /* [threads][mz]: their sums of squares */
    uint8_t *zfin;         /* [threads][mz]: finite or not */
    double *r8, *rel3, *relh; /* [unit][N_RATES], [unit][NW], [unit][NW] */
    qf_status *st;
    qf_error *err;
    atomic_int next;
    int n_units;
    bool gpu_measure;      /* the codecs' error measured on the device after the fits (klt_measure_gpu) */
} klt_job;

/* the fitting rows of (layer l, stream s) per kv head: min(tokens, max_rows) of them, every
 * *stride-th token (the fit, the V residual and the codec-error measurement read the same) */
static int64_t fit_rows(const klt_job *j, int l, int s, int64_t *stride) {
    int64_t nt = (s ? j->v->n_v[l] : j->v->n_k[l]) / j->f->n_kv_head, rows = nt < j->max_rows ? nt : j->max_rows;
    *stride = nt / rows;
    return rows;
}
/* the codec-error measurement reads every step-th fitting row: ceil(rows / step) < 2048 */
static int64_t measure_step(int64_t rows) { return rows > 1024 ? rows / 1024 : 1; }
/* each of n coordinates' levels at its width wd[i] (width 0: width 1's, never read), from
 * lv [n][NW][NL] into out [n][NL] */
static void levels_at_widths(const float *lv, const uint8_t *wd, size_t n, float *out) {
    for (size_t i = 0; i < n; i++)
        memcpy(out + i * NL, lv + (i * NW + (size_t)(wd[i] ? wd[i] - 1 : 0)) * NL, NL * sizeof(float));
}

/* fitting row r of (layer l, stream s, head h) minus the fit's mean: X [D] (scr: D doubles) */
static void unit_row(const klt_job *j, int l, int s, int h, int64_t r, int64_t stride, float *X, double *scr) {
    const qf_kv_capture_view *v = j->v;
    const qf_kv_rq_fit *f = j->f;
    int H = f->n_kv_head, D = f->head_dim, HD = H * D;
    const float *src = s ? v->v[l] : v->k[l], *xt = src + (size_t)(r * stride) * HD;
    const float *P = s && f->v_pred ? f->v_pred + (size_t)l * HD * HD : NULL;
    const float *mean = f->mean[s] + ((size_t)l * H + h) * D;
    if (P && j->vres) /* computed on the device: the same expression and bits as below */
        memcpy(X, j->vres[l] + (size_t)r * HD + (size_t)h * D, sizeof(float) * (size_t)D);
    else if (P) { /* V minus its prediction from the same token's (exact) K */
        qf_kv_rq_pred_minus(xt + (size_t)h * D, P + (size_t)h * D * HD, v->k[l] + (size_t)(r * stride) * HD, D, HD, scr);
        for (int oo = 0; oo < D; oo++) X[oo] = (float)(scr[oo] - mean[oo]);
    } else
        for (int c = 0; c < D; c++) X[c] = xt[h * D + c] - mean[c];
}

static void klt_unit(klt_job *j, int un, int ith, double *scr, double *M, double *Minv, float *X, float *xh, uint8_t *row) {
    const qf_kv_rq_fit *f = j->f;
    qf_kv_rq_klt_fit *k = j->k;
    int L = f->n_layer, H = f->n_kv_head, D = f->head_dim;
    size_t lhd = (size_t)L * H * D, DD = (size_t)D * D;
    int l = un / (2 * H), s = un / H % 2, h = un % H;
    int64_t stride, rows = fit_rows(j, l, s, &stride);
    size_t o = ((size_t)l * H + h) * D;
    const float *mean = f->mean[s] + o;
    for (int64_t r = 0; r < rows; r++) unit_row(j, l, s, h, r, stride, X + r * D, scr);
    metric(s, j->kw ? j->kw + o : NULL, j->vgram ? j->vgram + o * D : NULL, D, M, Minv, scr);
    float *enc = k->enc[s] + o * D, *dec = k->dec[s] + o * D, *sig = k->sigma[s] + o, *lv = k->levels[s] + o * NW * NL;
    j->st[un] = fit_head(X, rows, D, M, Minv, enc, dec, sig, lv, k->width[s] + o, lhd, k->eig[s] + o,
                         j->r8 + (size_t)un * QF_KV_RQ_KLT_N_RATES, &j->err[un]);
    if (j->st[un] || j->gpu_measure) return; /* measured on the device: klt_measure_gpu */
    /* the real codecs' relative error in the metric, |enc (x - x^)|^2 / |enc (x - mean)|^2,
     * at each unit width: format 3 and the Hadamard rows of the same fit */
    float lvw[QF_KV_RQ_MAX_HEAD_DIM * NL];
    int64_t step = measure_step(rows);
    /* the denominator is the same at every width: sum over the rows of |enc (x - mean)|^2, the
     * rows and each sum in the order the width loop added them */
    double den = 0, ea[QF_KV_RQ_MAX_HEAD_DIM];
    for (int64_t r = 0; r < rows; r += step) {
        double d0 = 0;
        qf_kv_rq_klt_matvec(enc, X + r * D, D, D, ea);
        for (int i = 0; i < D; i++) d0 += ea[i] * ea[i];
        den += d0;
    }
    /* format 3's transform of each measured row does not depend on the widths: once per row
     * (qf_kv_rq_klt_transform, the encoder's own first step), and dec transposed for the decoder
     * (the same sums from contiguous memory) */
    float *zs = j->zbuf + (size_t)ith * ((size_t)j->mz * D + DD), *decT = zs + (size_t)j->mz * D;
    double *zss = j->zss + (size_t)ith * j->mz;
    uint8_t *zfin = j->zfin + (size_t)ith * j->mz;
    for (int i = 0; i < D; i++)
        for (int c = 0; c < D; c++) decT[(size_t)c * D + i] = dec[(size_t)i * D + c];
    {
        qf_kv_rq_klt c0 = {.head_dim = D, .mean = mean, .enc = enc, .dec = dec, .sigma = sig, .levels = lv, .width = NULL};
        for (int64_t r = 0, q = 0; r < rows; r += step, q++) {
            float *x = xh;
            for (int c = 0; c < D; c++) x[c] = X[r * D + c] + mean[c];
            zfin[q] = qf_kv_rq_klt_transform(&c0, x, xh + D, zs + (size_t)q * D, &zss[q]);
        }
    }
    for (int b = 1; b <= NW; b++) {
        const uint8_t *wd = k->width[s] + (size_t)(8 * b) * lhd + o;
        levels_at_widths(lv, wd, (size_t)D, lvw);
        qf_kv_rq_klt c3 = {.head_dim = D, .mean = mean, .enc = enc, .dec = dec, .sigma = sig, .levels = lvw, .width = wd, .decT = decT};
        float ics[QF_KV_RQ_MAX_HEAD_DIM];
        for (int c = 0; c < D; c++) ics[c] = 1.0f / f->cs[s][o + c];
        qf_kv_rq_codec ch = {.head_dim = D, .bits = b, .levels = f->levels[s][b - 1] + ((size_t)l * H + h) * NL,
                             .mean = mean, .cs = f->cs[s] + o, .inv_cs = ics};
        double num3 = 0, numh = 0;
        for (int64_t r = 0, q = 0; r < rows; r += step, q++) {
            float *x = xh, *y = xh + D, *sc = xh + 2 * D;
            for (int c = 0; c < D; c++) x[c] = X[r * D + c] + mean[c];
            for (int pass = 0; pass < 2; pass++) {
                if (pass == 0)
                    qf_kv_rq_klt_encode_z(&c3, zs + (size_t)q * D, zss[q], zfin[q], row), qf_kv_rq_klt_decode(&c3, row, y);
                else qf_kv_rq_encode(&ch, x, sc, row), qf_kv_rq_decode(&ch, row, y);
                double e = 0;
                float *dx = xh + 4 * D; /* x - y, as floats (the product's operand) */
                for (int jj = 0; jj < D; jj++) dx[jj] = x[jj] - y[jj];
                qf_kv_rq_klt_matvec(enc, dx, D, D, ea);
                for (int i = 0; i < D; i++) e += ea[i] * ea[i];
                if (pass == 0) num3 += e;
                else numh += e;
            }
        }
        j->rel3[(size_t)un * NW + b - 1] = den > 0 ? num3 / den / H : 0;
        j->relh[(size_t)un * NW + b - 1] = den > 0 ? numh / den / H : 0;
    }
}

static void klt_worker(void *arg, int ith, int nth) {
    (void)nth;
    klt_job *j = arg;
    int D = j->f->head_dim;
    size_t DD = (size_t)D * D;
    double *scr = j->scratch + (size_t)ith * (4 * DD + D), *M = scr + 2 * DD + D, *Minv = M + DD;
    float *X = j->xs + (size_t)ith * ((size_t)j->max_rows * D + 5 * (size_t)D), *xh = X + (size_t)j->max_rows * D;
    uint8_t *row = j->rowb + (size_t)ith * (QF_KV_RQ_SCALE_BYTES + (size_t)D);
    for (int un; (un = atomic_fetch_add(&j->next, 1)) < j->n_units;) klt_unit(j, un, ith, scr, M, Minv, X, xh, row);
}

/* klt_unit's codec-error measurement for every (layer, stream) on the device, after the fits:
 * the device answers each measured row's error and denominator (the host's doubles), summed
 * here over the rows in klt_unit's order, so rel3 / relh are the host route's bit for bit */
static qf_status klt_measure_gpu(klt_job *j, qf_error *err) {
    const qf_kv_rq_fit *f = j->f;
    qf_kv_rq_klt_fit *k = j->k;
    int L = f->n_layer, H = f->n_kv_head, D = f->head_dim, HD = H * D;
    size_t lhd = (size_t)L * HD;
    int64_t mq = j->mz; /* rows a unit measures, at most */
    float *x = malloc(sizeof(float) * (size_t)mq * HD), *kl = malloc(sizeof(float) * (size_t)NW * HD * NL);
    float *hl = malloc(sizeof(float) * (size_t)NW * H * NL);
    uint8_t *wd = malloc((size_t)NW * HD);
    double *den = malloc(sizeof(double) * (size_t)mq * H), *e3 = malloc(sizeof(double) * (size_t)NW * mq * H);
    double *eh = malloc(sizeof(double) * (size_t)NW * mq * H), scr[QF_KV_RQ_MAX_HEAD_DIM];
    qf_status st = QF_OK;
    if (!x || !kl || !hl || !wd || !den || !e3 || !eh) {
        st = qf_fail(err, QF_ERR_NOMEM, "kv-rq klt: out of memory");
        goto out;
    }
    for (int l = 0; l < L && !st; l++)
        for (int s = 0; s < 2 && !st; s++) {
            int64_t stride, rows = fit_rows(j, l, s, &stride), step = measure_step(rows), nq = (rows + step - 1) / step;
            for (int h = 0; h < H; h++)
                for (int64_t q = 0; q < nq; q++) unit_row(j, l, s, h, q * step, stride, x + ((size_t)q * H + h) * D, scr);
            size_t o = (size_t)l * HD;
            for (int b = 1; b <= NW; b++) {
                uint8_t *w = wd + (size_t)(b - 1) * HD;
                memcpy(w, k->width[s] + (size_t)(8 * b) * lhd + o, (size_t)HD);
                levels_at_widths(k->levels[s] + o * NW * NL, w, (size_t)HD, kl + (size_t)(b - 1) * HD * NL);
                memcpy(hl + (size_t)(b - 1) * H * NL, f->levels[s][b - 1] + (size_t)l * H * NL, sizeof(float) * H * NL);
            }
            qf_cuda_klt_measure m = {.n_head = H, .head_dim = D, .n_widths = NW, .n_rows = nq, .x = x,
                                     .mean = f->mean[s] + o, .cs = f->cs[s] + o, .enc = k->enc[s] + o * D,
                                     .dec = k->dec[s] + o * D, .sigma = k->sigma[s] + o, .width = wd, .klevels = kl,
                                     .hlevels = hl, .den = den, .err3 = e3, .errh = eh};
            if ((st = qf_cuda_learn_klt_measure(&m, err))) {
                qf_error_prefix(err, "kv-rq klt: layer %d %s codec error on the GPU: ", l, s ? "V" : "K");
                break;
            }
            for (int h = 0; h < H; h++) {
                int un = (l * 2 + s) * H + h;
                double dn = 0;
                for (int64_t q = 0; q < nq; q++) dn += den[q * H + h];
                for (int b = 0; b < NW; b++) {
                    double n3 = 0, nh = 0;
                    for (int64_t q = 0; q < nq; q++) {
                        n3 += e3[((size_t)b * nq + q) * H + h];
                        nh += eh[((size_t)b * nq + q) * H + h];
                    }
                    j->rel3[(size_t)un * NW + b] = dn > 0 ? n3 / dn / H : 0;
                    j->relh[(size_t)un * NW + b] = dn > 0 ? nh / dn / H : 0;
                }
            }
        }
out:
    free(x), free(kl), free(hl), free(wd), free(den), free(e3), free(eh);
    return st;
}

/* V minus its prediction and the mean for every layer's fitting rows, on the device (j->vres) */
static qf_status klt_vres_gpu(klt_job *j, qf_error *err) {
    const qf_kv_capture_view *v = j->v;
    const qf_kv_rq_fit *f = j->f;
    int L = f->n_layer, H = f->n_kv_head, HD = H * f->head_dim;
    if (!(j->vres = calloc((size_t)L, sizeof(float *)))) return qf_fail(err, QF_ERR_NOMEM, "kv-rq klt: out of memory");
    for (int l = 0; l < L; l++) {
        int64_t stride, rows = fit_rows(j, l, 1, &stride);
        if (!(j->vres[l] = malloc(sizeof(float) * (size_t)rows * HD))) return qf_fail(err, QF_ERR_NOMEM, "kv-rq klt: out of memory");
        qf_status st = qf_cuda_learn_rows_minus_f64(v->v[l], v->k[l], rows, stride, HD, f->v_pred + (size_t)l * HD * HD,
                                                    f->mean[1] + (size_t)l * HD, j->vres[l], err);
        if (st) return qf_error_prefix(err, "kv-rq klt: layer %d V residual on the GPU: ", l), st;
    }
    return QF_OK;
}

qf_status qf_kv_rq_learn_klt(const qf_kv_capture_view *v, const float *kw, const float *vgram,
                             const qf_kv_rq_learn_params *p, qf_kv_rq_fit *f, qf_error *err) {
    int L = f->n_layer, H = f->n_kv_head, D = f->head_dim, U = 2 * L * H;
    size_t DD = (size_t)D * D, lhd = (size_t)L * H * D;
    int64_t max_rows = p->max_rows > 0 ? p->max_rows : 4096;
    int n_threads = p->n_threads;
    qf_pool *pool = n_threads > 1 ? qf_pool_create(n_threads) : NULL;
    int nth = qf_pool_size(pool);
    qf_kv_rq_klt_fit *k = calloc(1, sizeof *k);
    klt_job j = {.v = v, .kw = kw, .vgram = vgram, .f = f, .k = k, .max_rows = max_rows, .n_units = U};
    atomic_init(&j.next, 0);
    j.scratch = malloc(sizeof(double) * (4 * DD + D) * nth);
    j.xs = malloc(sizeof(float) * ((size_t)max_rows * D + 5 * (size_t)D) * nth);
    j.rowb = malloc((QF_KV_RQ_SCALE_BYTES + (size_t)D) * nth);
    j.mz = max_rows < 2048 ? max_rows : 2048; /* klt_unit measures ceil(rows / step) < 2048 rows */
    j.gpu_measure = p->gpu;
    if (!j.gpu_measure) { /* the measurement's per-thread buffers (klt_unit); the device's route needs none */
        j.zbuf = malloc(sizeof(float) * ((size_t)j.mz * D + DD) * nth);
        j.zss = malloc(sizeof(double) * (size_t)j.mz * nth), j.zfin = malloc((size_t)j.mz * nth);
    }
    j.r8 = calloc((size_t)U * QF_KV_RQ_KLT_N_RATES, sizeof(double));
    j.rel3 = calloc((size_t)U * NW, sizeof(double)), j.relh = calloc((size_t)U * NW, sizeof(double));
    j.st = calloc((size_t)U, sizeof(qf_status)), j.err = calloc((size_t)U, sizeof(qf_error));
    qf_status st = QF_OK;
    if ((n_threads > 1 && !pool) || !k || !j.scratch || !j.xs || !j.rowb || !j.r8 || !j.rel3 || !j.relh || !j.st || !j.err ||
        (!j.gpu_measure && (!j.zbuf || !j.zss || !j.zfin)))
        goto oom;
    for (int s = 0; s < 2; s++)
        if (!(k->enc[s] = malloc(lhd * D * sizeof(float))) || !(k->dec[s] = malloc(lhd * D * sizeof(float))) ||
            !(k->sigma[s] = malloc(lhd * sizeof(float))) || !(k->levels[s] = malloc(lhd * NW * NL * sizeof(float))) ||
            !(k->width[s] = malloc(QF_KV_RQ_KLT_N_RATES * lhd)) || !(k->eig[s] = malloc(lhd * sizeof(double))) ||
            !(k->rel8[s] = calloc((size_t)L * QF_KV_RQ_KLT_N_RATES, sizeof(double))) ||
            !(k->had_rel_mse[s] = calloc((size_t)L * NW, sizeof(double))))
            goto oom;
    if (p->gpu && f->v_pred && (st = klt_vres_gpu(&j, err))) goto out;
    qf_pool_run(pool, klt_worker, &j);
    for (int un = 0; un < U && !st; un++) /* the first failing unit in the serial order */
        if (j.st[un]) {
            st = j.st[un];
            if (err) *err = j.err[un];
        }
    if (!st && j.gpu_measure) st = klt_measure_gpu(&j, err);
    if (!st) /* the per-unit results summed over the heads in the serial order */
        for (int l = 0; l < L; l++)
            for (int s = 0; s < 2; s++) {
                double rel[NW] = {0};
                for (int h = 0; h < H; h++) {
                    int un = (l * 2 + s) * H + h;
                    for (int e = 0; e < QF_KV_RQ_KLT_N_RATES; e++)
                        k->rel8[s][l * QF_KV_RQ_KLT_N_RATES + e] += j.r8[(size_t)un * QF_KV_RQ_KLT_N_RATES + e] / H;
                    for (int b = 0; b < NW; b++) {
                        rel[b] += j.rel3[(size_t)un * NW + b];
                        k->had_rel_mse[s][l * NW + b] += j.relh[(size_t)un * NW + b];
                    }
                }
                for (int b = 0; b < NW; b++) f->rel_mse[s][l * NW + b] = rel[b];
            }
    goto out;
oom:
    st = qf_fail(err, QF_ERR_NOMEM, "kv-rq klt: out of memory");
out:
    for (int l = 0; j.vres && l < L; l++) free(j.vres[l]);
    free(j.vres);
    free(j.scratch), free(j.xs), free(j.rowb), free(j.zbuf), free(j.zss), free(j.zfin);
    free(j.r8), free(j.rel3), free(j.relh), free(j.st), free(j.err);
    qf_pool_free(pool);
    if (st) {
        qf_kv_rq_klt_fit_free(k);
        return st;
    }
    qf_kv_rq_klt_fit_free(f->klt);
    f->klt = k;
    return QF_OK;
}

void qf_kv_rq_klt_bit_arrays(const qf_kv_rq_fit *f, int s, const int *bits, float *lv, uint8_t *wd) {
    const qf_kv_rq_klt_fit *k = f->klt;
    int L = f->n_layer, H = f->n_kv_head, D = f->head_dim;
    size_t lhd = (size_t)L * H * D;
    for (int l = 0; l < L; l++) {
        int e = qf_kv_rq_klt_eighths(bits[l]); /* 0: an f16 layer (widths unused, zeros) */
        for (size_t i = (size_t)l * H * D; i < (size_t)(l + 1) * H * D; i++) {
            int w = e ? k->width[s][(size_t)e * lhd + i] : 0;
            wd[i] = (uint8_t)w;
            if (w) memcpy(lv + i * NL, k->levels[s] + (i * NW + (size_t)(w - 1)) * NL, NL * sizeof(float));
            else
                for (int q = 0; q < NL; q++) lv[i * NL + q] = (float)q;
        }
    }
}

qf_status qf_kv_rq_klt_payload(const qf_kv_rq_fit *f, const int *const bits[2], qf_payload *pl, qf_error *err) {
    const qf_kv_rq_klt_fit *k = f->klt;
    int L = f->n_layer, H = f->n_kv_head, D = f->head_dim;
    size_t lhd = (size_t)L * H * D;
    float *lv = malloc(lhd * NL * sizeof(float));
    uint8_t *wd = malloc(lhd);
    qf_status st = QF_OK;
    if (!lv || !wd) st = qf_fail(err, QF_ERR_NOMEM, "kv-rq klt payload: out of memory");
    for (int s = 0; s < 2 && !st; s++) {
        qf_kv_rq_klt_bit_arrays(f, s, bits[s], lv, wd);
        const char *sn = s ? "v" : "k";
        char name[32];
        int64_t sh4[4] = {L, H, D, D}, sh3[3] = {L, H, D}, sh4l[4] = {L, H, D, NL};
        snprintf(name, sizeof name, "%s_klt_enc", sn);
        if (!st) st = qf_payload_add_f32(pl, name, k->enc[s], 4, sh4, err);
        snprintf(name, sizeof name, "%s_klt_dec", sn);
        if (!st) st = qf_payload_add_f32(pl, name, k->dec[s], 4, sh4, err);
        snprintf(name, sizeof name, "%s_klt_sigma", sn);
        if (!st) st = qf_payload_add_f32(pl, name, k->sigma[s], 3, sh3, err);
        snprintf(name, sizeof name, "%s_klt_width", sn);
        if (!st) st = qf_payload_add_u8(pl, name, wd, 3, sh3, err);
        snprintf(name, sizeof name, "%s_klt_levels", sn);
        if (!st) st = qf_payload_add_f32(pl, name, lv, 4, sh4l, err);
    }
    free(lv), free(wd);
    return st;
}

double qf_kv_rq_klt_allocate(const qf_kv_rq_fit *f, const double *const sens[2], double max_code_bits, int min_bits,
                             int *const bits[2]) {
    const qf_kv_rq_klt_fit *k = f->klt;
    int L = f->n_layer, U = 2 * L, step = f->head_dim >= 64 ? 1 : 64 / f->head_dim; /* whole row bytes */
    int e0 = 8 * (min_bits < 1 ? 1 : min_bits < NW ? min_bits : NW);
    e0 = (e0 + step - 1) / step * step;
    int e[2][QF_KV_RQ_MAX_LAYERS_ALLOC];
    int *ep[2] = {L <= QF_KV_RQ_MAX_LAYERS_ALLOC ? e[0] : malloc(sizeof(int) * (size_t)L),
                  L <= QF_KV_RQ_MAX_LAYERS_ALLOC ? e[1] : malloc(sizeof(int) * (size_t)L)};
    double pred = 0;
    if (!ep[0] || !ep[1]) goto out;
    for (int s = 0; s < 2; s++)
        for (int l = 0; l < L; l++) ep[s][l] = e0;
    double total = (double)e0 * U;
    const int es = 8 * QF_KV_RQ_SENS_BITS; /* sens is measured at 2 bits */
#define R8(s, l, x) k->rel8[s][(l) * QF_KV_RQ_KLT_N_RATES + (x)]
#define PRED(s, l, x) (R8(s, l, es) > 0 ? sens[s][l] * R8(s, l, x) / R8(s, l, es) : 0)
    for (;;) {
        if ((total + step) / (8.0 * U) > max_code_bits + 1e-9) break;
        int bs = -1, bl = -1;
        double best = -1;
        for (int s = 0; s < 2; s++)
            for (int l = 0; l < L; l++) {
                int x = ep[s][l];
                if (x + step > QF_KV_RQ_KLT_MAX_EIGHTHS) continue;
                double g = PRED(s, l, x) - PRED(s, l, x + step);
                if (g > best) best = g, bs = s, bl = l;
            }
        if (bs < 0) break;
        ep[bs][bl] += step;
        total += step;
    }
    for (int s = 0; s < 2; s++)
        for (int l = 0; l < L; l++) {
            pred += PRED(s, l, ep[s][l]);
            bits[s][l] = QF_KV_RQ_KLT_EIGHTHS_BASE + ep[s][l];
        }
#undef PRED
#undef R8
out:
    if (L > QF_KV_RQ_MAX_LAYERS_ALLOC) free(ep[0]), free(ep[1]);
    return pred;
}
