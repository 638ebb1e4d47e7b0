/* rd_analysis.c: the sparse-dictionary go/no-go over captured KV vectors, the
 * rate-distortion baselines it is judged against (per-vector uniform, Hadamard-rotated,
 * KIVI-style per-channel), the report table and the SVG plot of the curves.
 *
 * The seed's rule (calibration_mod.rs, analyze_kv_capture) is kept: per (layer, stream),
 * GO when the dictionary's error is at most uniform quantization's at
 * round(code bits / head_dim) bits, overall GO by majority. We add a held-out evaluation
 * split and a stricter gate that counts scale overheads and takes the best baseline at a
 * rate no higher than the dictionary's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/hadamard.h"
#include "plot.h"
#include "qforge/kvlearn.h"
#include "util/util.h"

/* ---- baselines ---- */

static float f16_round(float v) { return qf_f16_to_f32(qf_f32_to_f16(v)); }

static void uniform_one(const float *x, int dim, int bits, float *out) {
    float m = 0;
    for (int i = 0; i < dim; i++) m = fmaxf(m, fabsf(x[i]));
    float L = (float)((1 << (bits - 1)) - 1);
    float sc = f16_round(m / L);
    float inv = sc > 0 ? 1.0f / sc : 0;
    for (int i = 0; i < dim; i++) {
        float v = fminf(fmaxf(x[i] * inv, -L), L);
        out[i] = (float)(int)(v + (v >= 0 ? 0.5f : -0.5f)) * sc;
    }
}

void qf_kv_rt_uniform(const float *x, int64_t n, int dim, int bits, float *out) {
    for (int64_t i = 0; i < n; i++) uniform_one(x + (size_t)i * dim, dim, bits, out + (size_t)i * dim);
}

double qf_kv_bits_uniform(int dim, int bits) { return bits + 16.0 / dim; }

qf_status qf_kv_rt_hadamard(const float *x, int64_t n, int dim, int bits, float *out,
                            qf_error *err) {
    if (dim < 1 || (dim & (dim - 1)) != 0)
        return qf_fail(err, QF_ERR_ARG, "hadamard: dim %d: expected a power of two", dim);
    float *t = malloc(sizeof(float) * (size_t)dim);
    if (!t) return qf_fail(err, QF_ERR_NOMEM, "hadamard: out of memory");
    for (int64_t i = 0; i < n; i++) {
        memcpy(t, x + (size_t)i * dim, sizeof(float) * (size_t)dim);
        qf_hadamard(t, dim);
        uniform_one(t, dim, bits, t);
        qf_hadamard(t, dim);
        memcpy(out + (size_t)i * dim, t, sizeof(float) * (size_t)dim);
    }
    free(t);
    return QF_OK;
}

void qf_kv_rt_per_channel(const float *x, int64_t n, int dim, int n_kv_head, int group, int bits,
                          float *out) {
    if (n_kv_head < 1) n_kv_head = 1;
    if (group < 1) group = 1;
    float top = (float)((1 << bits) - 1);
    for (int h = 0; h < n_kv_head; h++) {
        int64_t nh = n > h ? (n - h + n_kv_head - 1) / n_kv_head : 0; /* tokens of head h */
        for (int64_t g0 = 0; g0 < nh; g0 += group) {
            int64_t g1 = g0 + group < nh ? g0 + group : nh;
            for (int c = 0; c < dim; c++) {
                float lo = INFINITY, hi = -INFINITY;
                for (int64_t t = g0; t < g1; t++) {
                    float v = x[(size_t)(t * n_kv_head + h) * dim + c];
                    lo = fminf(lo, v);
                    hi = fmaxf(hi, v);
                }
                float zero = f16_round(lo);
                float sc = f16_round((hi - zero) / top);
                float inv = sc > 0 ? 1.0f / sc : 0;
                for (int64_t t = g0; t < g1; t++) {
                    size_t o = (size_t)(t * n_kv_head + h) * dim + c;
                    float v = fminf(fmaxf((x[o] - zero) * inv, 0.0f), top);
                    out[o] = zero + (float)(int)(v + 0.5f) * sc;
                }
            }
        }
    }
}

double qf_kv_bits_per_channel(int group, int bits) { return bits + 32.0 / (group < 1 ? 1 : group); }

/* ---- analysis ---- */

void qf_kv_analysis_params_default(qf_kv_analysis_params *p) {
    memset(p, 0, sizeof *p);
    p->n_atoms = 256;
    p->sparsity = 4;
    p->iters = 20;
    p->coef = QF_KV_COEF_F16;
    p->layer_stride = 1;
    p->holdout_every = 8;
    p->seed = 1;
    p->n_threads = 1;
    p->rd_iters = 10;
    p->max_train = 4096;
    p->kivi_group = 64;
}

void qf_kv_report_free(qf_kv_report *r) {
    if (!r) return;
    free(r->layers);
    memset(r, 0, sizeof *r);
}

enum { M_UNIFORM, M_HADAMARD, M_CHANNEL, N_BASE };
static const char *const base_names[N_BASE] = {"uniform", "hadamard", "per-channel"};
#define N_BITS 7 /* 2..8 */

/* One pair's sweep before compaction: NaN marks a point not measured. */
typedef struct {
    double base_bits[N_BASE][N_BITS], base_err[N_BASE][N_BITS];
    double dict_bits[QF_KV_RD_MAX_POINTS], dict_err[QF_KV_RD_MAX_POINTS];
} raw_sweep;

static void curve_add(qf_kv_rd_curve *c, double bits, double err, const char *label) {
    if (c->n >= QF_KV_RD_MAX_POINTS + QF_KV_RD_MAX_BITS || isnan(err)) return;
    c->bits[c->n] = bits;
    c->err[c->n] = err;
    snprintf(c->label[c->n], sizeof c->label[0], "%s", label);
    c->n++;
}

static void raw_to_table(const raw_sweep *rs, const qf_kv_analysis_params *p, const char *title,
                         qf_kv_rd_table *t) {
    memset(t, 0, sizeof *t);
    snprintf(t->title, sizeof t->title, "%s", title);
    for (int m = 0; m < N_BASE; m++) {
        qf_kv_rd_curve *c = &t->curves[t->n_curves++];
        snprintf(c->name, sizeof c->name, "%s", base_names[m]);
        for (int b = 0; b < N_BITS; b++) {
            char lab[16];
            snprintf(lab, sizeof lab, "%db", b + 2);
            curve_add(c, rs->base_bits[m][b], rs->base_err[m][b], lab);
        }
        if (c->n == 0) t->n_curves--;
    }
    if (p->n_rd > 0) {
        qf_kv_rd_curve *c = &t->curves[t->n_curves++];
        snprintf(c->name, sizeof c->name, "dict-%s", qf_kv_coef_name(p->coef));
        /* sorted by rate so the polyline runs left to right */
        int order[QF_KV_RD_MAX_POINTS];
        for (int j = 0; j < p->n_rd; j++) order[j] = j;
        for (int a = 1; a < p->n_rd; a++)
            for (int b = a; b > 0 && rs->dict_bits[order[b]] < rs->dict_bits[order[b - 1]]; b--) {
                int tmp = order[b];
                order[b] = order[b - 1];
                order[b - 1] = tmp;
            }
        for (int k = 0; k < p->n_rd; k++) {
            int j = order[k];
            char lab[16];
            snprintf(lab, sizeof lab, "%d/%d", p->rd_atoms[j] % 100000, p->rd_sparsity[j] % 1000);
            curve_add(c, rs->dict_bits[j], rs->dict_err[j], lab);
        }
        if (c->n == 0) t->n_curves--;
    }
}

/* Learn on train, evaluate on eval: relative error with coefficients rounded to `coef`. */
static qf_status dict_point(const float *train, int64_t n_train, const float *eval, int64_t n_eval,
                            int dim, int atoms, int s, int iters, const qf_kv_analysis_params *p,
                            double *err_eval, double *err_train, qf_error *err) {
    qf_kv_dict_params dp;
    qf_kv_dict_params_default(&dp);
    dp.n_atoms = atoms;
    dp.sparsity = s;
    dp.iters = iters;
    dp.seed = p->seed;
    dp.n_threads = p->n_threads;
    dp.max_train = p->max_train;
    double *trace = malloc(sizeof(double) * (size_t)(iters + 1));
    uint16_t *idx = malloc(sizeof(uint16_t) * (size_t)n_eval * s);
    float *coef = malloc(sizeof(float) * (size_t)n_eval * s);
    float *rec = malloc(sizeof(float) * (size_t)n_eval * dim);
    qf_kv_dict d = {0};
    qf_status st = QF_OK;
    if (!trace || !idx || !coef || !rec) {
        st = qf_fail(err, QF_ERR_NOMEM, "kv analysis: out of memory");
        goto done;
    }
    dp.err_trace = trace;
    st = qf_kv_dict_learn(train, n_train, dim, &dp, &d, err);
    if (st) goto done;
    st = qf_kv_dict_encode(&d, eval, n_eval, s, p->n_threads, idx, coef, err);
    if (st) goto done;
    for (int64_t i = 0; i < n_eval; i++) qf_kv_coef_round(coef + (size_t)i * s, s, p->coef);
    qf_kv_dict_decode(&d, idx, coef, s, n_eval, rec);
    *err_eval = qf_rel_mse(eval, rec, n_eval * dim);
    if (err_train) *err_train = trace[iters];
done:
    qf_kv_dict_free(&d);
    free(trace);
    free(idx);
    free(coef);
    free(rec);
    return st;
}

static qf_status analyze_pair(const float *vecs, int64_t n_vec, int layer, char stream,
                              const qf_kv_capture_view *cap, const qf_kv_analysis_params *p,
                              qf_kv_layer_verdict *v, raw_sweep *rs, double *eval_energy,
                              qf_error *err) {
    const int dim = cap->head_dim, H = cap->n_kv_head > 0 ? cap->n_kv_head : 1;
    double t0 = qf_now_sec();
    memset(v, 0, sizeof *v);
    v->layer = layer;
    v->stream = stream;
    v->n_vectors = n_vec;
    /* Split by token rows (all kv heads of a token together) so both halves keep the
     * capture layout the per-head int8 fit and the per-channel baseline rely on. */
    int64_t rows = n_vec / H;
    int64_t he = p->holdout_every > 1 ? p->holdout_every : 0;
    int64_t eval_rows = he ? rows / he : rows;
    int64_t train_rows = he ? rows - eval_rows : rows;
    qf_status st = QF_OK;
    float *train = NULL, *eval = NULL, *rec = NULL, *scale = NULL;
    size_t row_f = (size_t)H * dim;
    if (he) {
        train = malloc(sizeof(float) * (size_t)train_rows * row_f);
        eval = malloc(sizeof(float) * (size_t)(eval_rows ? eval_rows : 1) * row_f);
        if (!train || !eval) goto oom;
        int64_t a = 0, b = 0;
        for (int64_t r = 0; r < rows; r++) {
            bool out = r % he == he - 1;
            float *dst = out ? eval + (size_t)b++ * row_f : train + (size_t)a++ * row_f;
            memcpy(dst, vecs + (size_t)r * row_f, sizeof(float) * row_f);
        }
    }
    const float *tr = he ? train : vecs, *ev = he ? eval : vecs;
    int64_t n_tr = train_rows * H, n_ev = eval_rows * H;
    v->n_train = n_tr;
    v->n_eval = n_ev;
    if (n_ev < 1) {
        st = qf_fail(err, QF_ERR_ARG, "kv analysis: layer %d %c: no evaluation vectors", layer,
                     stream);
        goto done;
    }
    rec = malloc(sizeof(float) * (size_t)n_ev * dim);
    scale = malloc(sizeof(float) * row_f * 2);
    if (!rec || !scale) goto oom;
    double energy = 0;
    for (int64_t i = 0; i < n_ev * dim; i++) energy += (double)ev[i] * (double)ev[i];
    *eval_energy = energy;

    /* int8: per vector (the seed's incumbent) and static calibrated scales (the engine's) */
    qf_kv_rt_uniform(ev, n_ev, dim, 8, rec);
    v->recon_int8 = qf_rel_mse(ev, rec, n_ev * dim);
    v->int8_bits = qf_kv_bits_uniform(dim, 8) * dim;
    st = qf_kv_int8_fit(tr, n_tr, H, dim, QF_KV_SCALE_PER_CHANNEL, 100.0, scale, err);
    if (st) goto done;
    qf_kv_int8_inv_scale(scale, scale + row_f, (int)row_f);
    {
        int8_t *q = malloc(row_f);
        if (!q) goto oom;
        for (int64_t r = 0; r < eval_rows; r++) {
            qf_kv_int8_quantize(ev + (size_t)r * row_f, scale + row_f, q, (int)row_f);
            qf_kv_int8_dequantize(q, scale, rec + (size_t)r * row_f, (int)row_f);
        }
        free(q);
    }
    v->recon_int8_static = qf_rel_mse(ev, rec, n_ev * dim);

    /* baselines at 2..8 bits (Hadamard only for power-of-two head_dim) */
    for (int m = 0; m < N_BASE; m++)
        for (int b = 0; b < N_BITS; b++) {
            int bits = b + 2;
            rs->base_bits[m][b] = rs->base_err[m][b] = NAN;
            if (m == M_UNIFORM) {
                qf_kv_rt_uniform(ev, n_ev, dim, bits, rec);
                rs->base_bits[m][b] = qf_kv_bits_uniform(dim, bits);
            } else if (m == M_HADAMARD) {
                if (qf_kv_rt_hadamard(ev, n_ev, dim, bits, rec, NULL) != QF_OK) continue;
                rs->base_bits[m][b] = qf_kv_bits_uniform(dim, bits);
            } else {
                qf_kv_rt_per_channel(ev, n_ev, dim, H, p->kivi_group, bits, rec);
                rs->base_bits[m][b] = qf_kv_bits_per_channel(p->kivi_group, bits);
            }
            rs->base_err[m][b] = qf_rel_mse(ev, rec, n_ev * dim);
        }

    /* the go/no-go dictionary */
    st = dict_point(tr, n_tr, ev, n_ev, dim, p->n_atoms, p->sparsity, p->iters, p, &v->recon_dict,
                    &v->recon_dict_train, err);
    if (st) goto done;
    v->dict_code_bits = qf_kv_code_bits(p->n_atoms, p->sparsity, p->coef);
    int mb = (int)lround(v->dict_code_bits / dim);
    v->matched_bits = mb < 2 ? 2 : mb > 8 ? 8 : mb;
    v->recon_uniform_matched = rs->base_err[M_UNIFORM][v->matched_bits - 2];
    v->go = v->recon_dict <= v->recon_uniform_matched;

    /* the strict gate */
    double rate = v->dict_code_bits / dim;
    int bm = -1, bb = -1;
    for (int pass = 0; pass < 2 && bm < 0; pass++)
        for (int m = 0; m < N_BASE; m++)
            for (int b = 0; b < N_BITS; b++) {
                double bits = rs->base_bits[m][b], e = rs->base_err[m][b];
                if (isnan(e) || (pass == 0 && bits > rate)) continue;
                if (bm < 0) { bm = m, bb = b; continue; }
                double cb = rs->base_bits[bm][bb], ce = rs->base_err[bm][bb];
                bool better = pass == 0 ? e < ce : (bits < cb || (bits == cb && e < ce));
                if (better) bm = m, bb = b;
            }
    snprintf(v->best_baseline, sizeof v->best_baseline, "%s %db", base_names[bm], bb + 2);
    v->best_baseline_bits = rs->base_bits[bm][bb];
    v->recon_best_baseline = rs->base_err[bm][bb];
    v->go_strict = v->recon_dict <= v->recon_best_baseline;

    /* the dictionary sweep */
    for (int j = 0; j < p->n_rd; j++) {
        int a = p->rd_atoms[j], s = p->rd_sparsity[j];
        rs->dict_bits[j] = qf_kv_code_bits(a, s, p->coef) / dim;
        rs->dict_err[j] = NAN;
        if (a < 1 || a > n_tr || s < 1 || s > dim || s > a) continue;
        if (a == p->n_atoms && s == p->sparsity) { /* the go/no-go point: already measured */
            rs->dict_err[j] = v->recon_dict;
            continue;
        }
        st = dict_point(tr, n_tr, ev, n_ev, dim, a, s, p->rd_iters, p, &rs->dict_err[j], NULL,
                        err);
        if (st) goto done;
    }
    char title[64];
    snprintf(title, sizeof title, "layer %d %c", layer, stream);
    raw_to_table(rs, p, title, &v->rd);
    v->seconds = qf_now_sec() - t0;
    goto done;
oom:
    st = qf_fail(err, QF_ERR_NOMEM, "kv analysis: layer %d %c: out of memory", layer, stream);
done:
    free(train);
    free(eval);
    free(rec);
    free(scale);
    return st;
}

qf_status qf_kv_analyze(const qf_kv_capture_view *cap, const qf_kv_analysis_params *p,
                        qf_kv_report *out, qf_error *err) {
    memset(out, 0, sizeof *out);
    if (!cap || cap->n_layer < 1 || cap->head_dim < 1 || cap->n_kv_head < 1)
        return qf_fail(err, QF_ERR_ARG,
                       "kv analysis: capture: expected n_layer, head_dim and n_kv_head >= 1");
    if (p->n_rd < 0 || p->n_rd > QF_KV_RD_MAX_POINTS || p->layer_stride < 0 || p->iters < 0 ||
        p->rd_iters < 0)
        return qf_fail(err, QF_ERR_ARG,
                       "kv analysis: params: expected 0..%d sweep points, iters >= 0",
                       QF_KV_RD_MAX_POINTS);
    if (p->sparsity < 1 || p->sparsity > cap->head_dim || p->n_atoms < p->sparsity ||
        p->n_atoms > QF_KV_MAX_ATOMS)
        return qf_fail(err, QF_ERR_ARG,
                       "kv analysis: n_atoms %d, sparsity %d: expected 1 <= sparsity <= "
                       "min(head_dim %d, n_atoms), n_atoms <= %d",
                       p->n_atoms, p->sparsity, cap->head_dim, QF_KV_MAX_ATOMS);
    double t0 = qf_now_sec();
    int stride = p->layer_stride > 0 ? p->layer_stride : 1;
    out->head_dim = cap->head_dim;
    out->n_kv_head = cap->n_kv_head;
    out->n_layer = cap->n_layer;
    out->n_atoms = p->n_atoms;
    out->sparsity = p->sparsity;
    out->coef = p->coef;
    out->layers = calloc((size_t)(2 * cap->n_layer), sizeof *out->layers);
    raw_sweep *rs = malloc(sizeof *rs);
    double *pool_num = calloc(N_BASE * N_BITS + QF_KV_RD_MAX_POINTS, sizeof(double));
    double *pool_den = calloc(N_BASE * N_BITS + QF_KV_RD_MAX_POINTS, sizeof(double));
    raw_sweep *pooled = calloc(1, sizeof *pooled);
    qf_status st = QF_OK;
    if (!out->layers || !rs || !pool_num || !pool_den || !pooled) {
        st = qf_fail(err, QF_ERR_NOMEM, "kv analysis: out of memory");
        goto done;
    }
    int min_vec = p->n_atoms > 16 ? p->n_atoms : 16;
    for (int l = 0; l < cap->n_layer; l += stride)
        for (int si = 0; si < 2; si++) {
            const float *vecs = si == 0 ? (cap->k ? cap->k[l] : NULL) : (cap->v ? cap->v[l] : NULL);
            int64_t n = si == 0 ? (cap->n_k ? cap->n_k[l] : 0) : (cap->n_v ? cap->n_v[l] : 0);
            /* the dictionary learns from the training split, which must hold n_atoms */
            int64_t rows = n / cap->n_kv_head;
            int64_t he = p->holdout_every > 1 ? p->holdout_every : 0;
            int64_t n_train = (he ? rows - rows / he : rows) * cap->n_kv_head;
            if (!vecs || n < min_vec || n_train < p->n_atoms || (he && rows < he)) continue;
            qf_kv_layer_verdict *v = &out->layers[out->n_layers];
            double energy = 0;
            st = analyze_pair(vecs, n, l, si == 0 ? 'K' : 'V', cap, p, v, rs, &energy, err);
            if (st) goto done;
            out->n_layers++;
            /* pool the sweep: error-weighted by each pair's evaluation energy */
            for (int k = 0; k < N_BASE * N_BITS + p->n_rd; k++) {
                double e = k < N_BASE * N_BITS ? rs->base_err[k / N_BITS][k % N_BITS]
                                               : rs->dict_err[k - N_BASE * N_BITS];
                if (isnan(e) || isnan(pool_num[k])) {
                    pool_num[k] = NAN;
                    continue;
                }
                pool_num[k] += e * energy;
                pool_den[k] += energy;
            }
            if (out->n_layers == 1) *pooled = *rs; /* the rates are the same for every pair */
        }
    if (out->n_layers == 0) {
        st = qf_fail(err, QF_ERR_CAPTURE_FAILED,
                     "kv analysis: capture: no (layer, stream) had at least max(n_atoms %d, 16) "
                     "vectors with n_atoms in the training split",
                     p->n_atoms);
        goto done;
    }
    for (int k = 0; k < N_BASE * N_BITS + p->n_rd; k++) {
        double e = isnan(pool_num[k]) || !(pool_den[k] > 0) ? NAN : pool_num[k] / pool_den[k];
        if (k < N_BASE * N_BITS) pooled->base_err[k / N_BITS][k % N_BITS] = e;
        else pooled->dict_err[k - N_BASE * N_BITS] = e;
    }
    raw_to_table(pooled, p, "all layers", &out->rd_all);
    int go = 0, gos = 0;
    for (int i = 0; i < out->n_layers; i++) {
        go += out->layers[i].go;
        gos += out->layers[i].go_strict;
    }
    out->overall_go = go * 2 >= out->n_layers;
    out->overall_go_strict = gos * 2 >= out->n_layers;
    double per_tok = (double)cap->n_kv_head * 2 * cap->n_layer;
    out->f16_bytes_per_token = per_tok * 2 * cap->head_dim;
    out->int8_bytes_per_token = per_tok * cap->head_dim;
    out->dict_bytes_per_token = per_tok * (double)qf_kv_code_bytes(p->n_atoms, p->sparsity, p->coef);
    out->seconds = qf_now_sec() - t0;
done:
    free(rs);
    free(pool_num);
    free(pool_den);
    free(pooled);
    if (st) qf_kv_report_free(out);
    return st;
}

void qf_kv_report_print(const qf_kv_report *r, FILE *fp) {
    fprintf(fp, "kv dictionary go/no-go: head_dim %d, %d atoms, sparsity %d, %s coefficients "
                "(%.0f code bits/vector)\n",
            r->head_dim, r->n_atoms, r->sparsity, qf_kv_coef_name(r->coef),
            qf_kv_code_bits(r->n_atoms, r->sparsity, r->coef));
    fprintf(fp, "%5s %2s %7s %10s %10s %10s %10s %4s %10s %3s %-16s %10s %6s %6s\n", "layer", "kv",
            "vectors", "int8", "int8_stat", "dict", "dict_trn", "bits", "uniform", "go",
            "best_baseline", "its_err", "strict", "secs");
    for (int i = 0; i < r->n_layers; i++) {
        const qf_kv_layer_verdict *v = &r->layers[i];
        fprintf(fp, "%5d %2c %7lld %10.3e %10.3e %10.3e %10.3e %4d %10.3e %3s %-16s %10.3e %6s %6.2f\n",
                v->layer, v->stream, (long long)v->n_vectors, v->recon_int8, v->recon_int8_static,
                v->recon_dict, v->recon_dict_train, v->matched_bits, v->recon_uniform_matched,
                v->go ? "GO" : "no", v->best_baseline, v->recon_best_baseline,
                v->go_strict ? "GO" : "no", v->seconds);
    }
    fprintf(fp, "overall: %s (seed rule), %s (strict); KV bytes/token: f16 %.0f, int8 %.0f, dict %.0f; %.2f s\n",
            r->overall_go ? "GO" : "NO-GO", r->overall_go_strict ? "GO" : "NO-GO",
            r->f16_bytes_per_token, r->int8_bytes_per_token, r->dict_bytes_per_token, r->seconds);
    const qf_kv_rd_table *t = &r->rd_all;
    fprintf(fp, "rate-distortion (%s): bits/element -> relative MSE\n", t->title);
    for (int c = 0; c < t->n_curves; c++) {
        fprintf(fp, "  %-12s", t->curves[c].name);
        for (int k = 0; k < t->curves[c].n; k++)
            fprintf(fp, " %s:%.2f=%.2e", t->curves[c].label[k], t->curves[c].bits[k],
                    t->curves[c].err[k]);
        fputc('\n', fp);
    }
}

/* ---- SVG ---- */

qf_status qf_kv_rd_write_svg(const qf_kv_rd_table *t, const char *path, qf_error *err) {
    qf_plot_curve cv[QF_KV_RD_MAX_CURVES];
    const char *labels[QF_KV_RD_MAX_CURVES][QF_KV_RD_MAX_POINTS + QF_KV_RD_MAX_BITS];
    int n = t->n_curves < QF_KV_RD_MAX_CURVES ? t->n_curves : QF_KV_RD_MAX_CURVES;
    for (int c = 0; c < n; c++) {
        for (int k = 0; k < t->curves[c].n; k++) labels[c][k] = t->curves[c].label[k];
        cv[c] = (qf_plot_curve){.name = t->curves[c].name, .n = t->curves[c].n, .x = t->curves[c].bits,
                                .y = t->curves[c].err, .label = labels[c]};
    }
    qf_plot pl = {.title = t->title[0] ? t->title : "rate-distortion",
                  .x_label = "bits per element (scale overheads included)",
                  .y_label = "relative MSE (log)",
                  .n_curves = n,
                  .curves = cv};
    return qf_plot_write_svg(&pl, path, err);
}
