/* learn_awq.c: the AWQ learner. Runs the reference model over calibration tokens with a tap
 * that feeds the capture stage's per-channel statistics, accumulates each 32-channel block's
 * input covariance and keeps a bounded reservoir of real input rows per layer and site;
 * searches one alpha per group of linears sharing an input (s = mean|x|^alpha, scored on those
 * rows with the final Q4_0 quantizer in the loop: the group's outputs, or optionally for gate/up
 * the FFN block output W_down (silu(gate) * up)), folds the scales into the RMSNorm gains / the previous
 * linear's rows (v -> o tied per kv head under GQA), quantizes each Q4_0 block with a
 * covariance-weighted scale search and rounding descent, and writes the Q4_0 GGUF through
 * quantize.c. Also qf_awq_embed_certificate (the qforge.* metadata rewrite). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/blas.h"
#include "kernels/cuda/cuda_forge.h"
#include "forge/awq_impl.h"
#include "format/quant_blocks.h"
#include "qforge/awq.h"
#include "qforge/capture.h"
#include "qforge/tokenizer.h"
#include "util/util.h"

#define AWQ_IMP_FLOOR 0.01 /* importance floor, as a share of the mean importance */

const char *qf_awq_group_name(qf_awq_group g) {
    switch (g) {
    case QF_AWQ_QKV: return "qkv";
    case QF_AWQ_GATE_UP: return "gate_up";
    case QF_AWQ_DOWN: return "down";
    case QF_AWQ_VO: return "vo";
    default: return "?";
    }
}

qf_awq_params qf_awq_default_params(void) {
    qf_awq_params p = {
        .n_grid = 20,
        .rows_per_site = 512,
        .n_ctx = 0,
        .max_tokens = 8192,
        .clip = true,
        .scale_vo = true,
        .ffn_act_loss = false,
        .block_cov = true,
        .duo = false,
        .fixed_alpha = -1.0f,
        .keep_float = false,
        .n_threads = 0,
        .progress = false,
        .seed = 0x5eed,
        .device = QF_DEVICE_CPU,
    };
    return p;
}

void qf_awq_report_free(qf_awq_report *r) {
    if (!r) return;
    free(r->alpha);
    free(r->clip);
    free(r->mse_rtn);
    free(r->mse_awq);
    r->alpha = r->clip = NULL;
    r->mse_rtn = r->mse_awq = NULL;
}

/* ---- calibration rows: a reservoir per (layer, site) fed by the tap ---- */
typedef struct {
    int dim;
    int64_t seen, kept;
    float *rows; /* [cap][dim] */
    double *cov; /* [dim/32][32][32] sum of x_b x_b^T (upper triangle), or NULL */
    int64_t cov_n;
} reservoir;

typedef struct {
    const qf_tap *cap_tap;
    reservoir *res; /* [n_layer][QF_ACT_SITE_COUNT] */
    int64_t cap;
    uint64_t rng;
    qf_pool *pool;  /* the block covariances' threads */
    float *tmp;     /* [pool threads][32 * 32] */
} awq_tap_state;

typedef struct {
    const awq_tap_state *s;
    reservoir *r;
    const float *x;
    int n_tok, dim;
} cov_job;

/* blocks of 32 channels split over the pool: each block's sum of x_b x_b^T (upper triangle) */
static void cov_worker(void *arg, int ith, int nth) {
    cov_job *j = arg;
    int64_t lo, hi;
    qf_split_range(j->dim / 32, ith, nth, &lo, &hi);
    float *tmp = j->s->tmp + (size_t)ith * 1024;
    for (int64_t b = lo; b < hi; b++) {
        qf_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, 32, j->n_tok, 1.0f, j->x + b * 32, j->dim, 0.0f, tmp, 32);
        double *c = j->r->cov + (size_t)b * 1024;
        for (int i = 0; i < 32; i++)
            for (int k = i; k < 32; k++) c[i * 32 + k] += tmp[i * 32 + k];
    }
}

static void awq_on_act(void *user, int layer, qf_act_site site, int n_tok, int dim, const float *x) {
    awq_tap_state *s = user;
    if (s->cap_tap && s->cap_tap->on_act) s->cap_tap->on_act(s->cap_tap->user, layer, site, n_tok, dim, x);
    reservoir *r = &s->res[layer * QF_ACT_SITE_COUNT + site];
    if (r->dim != dim) return;
    if (r->cov) {
        cov_job j = {.s = s, .r = r, .x = x, .n_tok = n_tok, .dim = dim};
        qf_pool_run(s->pool, cov_worker, &j);
        r->cov_n += n_tok;
    }
    if (!r->rows) return;
    for (int t = 0; t < n_tok; t++) {
        int64_t slot = -1;
        r->seen++;
        if (r->kept < s->cap) slot = r->kept++;
        else {
            uint64_t j = qf_splitmix64(&s->rng) % (uint64_t)r->seen;
            if (j < (uint64_t)s->cap) slot = (int64_t)j;
        }
        if (slot >= 0) memcpy(r->rows + slot * dim, x + (size_t)t * dim, (size_t)dim * sizeof(float));
    }
}

/* ---- f32 copies of the reference weights ---- */
typedef struct {
    const qf_weight *w;
    float *out;
} deq_job;

static void deq_worker(void *arg, int ith, int nth) {
    deq_job *j = arg;
    int64_t lo, hi;
    qf_split_range(j->w->ne1 > 0 ? j->w->ne1 : 1, ith, nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++)
        qf_dequantize_row(j->w->type, (const uint8_t *)j->w->data + (size_t)r * j->w->row_bytes, j->out + r * j->w->ne0,
                          j->w->ne0);
}

/* The weight as f32 [ne1][ne0] (malloc'ed; NULL when out of memory), its rows over the pool
 * (an 8B-shaped layer is ~220M weights: single-threaded, this conversion led the GPU route). */
static float *weight_f32(const qf_weight *w, qf_pool *pool) {
    int64_t n = w->ne0 * (w->ne1 > 0 ? w->ne1 : 1);
    float *out = malloc((size_t)n * sizeof(float));
    if (!out) return NULL;
    deq_job j = {.w = w, .out = out};
    qf_pool_run(pool, deq_worker, &j);
    return out;
}

/* ---- per-block Q4_0 scale search on a folded weight ----
 * For each block of 32: the RTN encoding and 19 candidate scales (ggml's make_qx_quants
 * recipe: iscale = -(8 + 0.1 k) / max, k = -9..9, then a weighted least-squares refit of d and
 * one re-round), keeping the one with the smallest error under the block's importance:
 *   diagonal:   sum_i imp_i (w_i - d q_i)^2, imp = E[x_i^2] of the folded input channels;
 *   covariance: (w - d q)^T H (w - d q), H = E[x_b x_b^T] of the folded block (the exact output
 *               MSE of this block's contribution), followed by a greedy rounding descent
 *               (move single q_i by +-1 while the error falls, refit d, repeat).
 * RTN is a candidate, so no block gets worse under its metric. The result is ordinary Q4_0
 * (d f16, 4-bit q - 8). */

static double q4_block_err(const float *x, const float *imp, const int8_t *l, float d) {
    float e = 0;
    for (int i = 0; i < 32; i++) {
        float r = x[i] - d * (float)l[i];
        e += imp[i] * r * r;
    }
    return e;
}

/* round to nearest, clamped to the Q4_0 levels [-8, 7] (half away from zero is fine here) */
static inline int8_t q4_level(float v) {
    v = v < -8.0f ? -8.0f : v > 7.0f ? 7.0f : v;
    return (int8_t)((int)(v + 8.5f) - 8);
}

/* The block's levels and its scale as a float. */
static void q4_unpack(const block_q4_0 *in, int8_t *l, float *d) {
    *d = qf_f16_to_f32(in->d);
    for (int i = 0; i < QK; i++) l[i] = (int8_t)qf_q4_0_level(in, i);
}

/* Returns the chosen d relative to RTN's (1 = RTN). */
static float q4_block_search(const float *x, const float *imp, block_q4_0 *out) {
    float dq[32];
    int8_t l[32], bl[32];
    qf_quantize_row(QF_TYPE_Q4_0, x, out, 32);
    qf_dequantize_row(QF_TYPE_Q4_0, out, dq, 32);
    uint16_t dh_rtn = out->d;
    float d_rtn = qf_f16_to_f32(dh_rtn);
    double best = 0;
    for (int i = 0; i < 32; i++) {
        double r = (double)x[i] - (double)dq[i];
        best += (double)imp[i] * r * r;
    }
    float amax = 0, mx = 0;
    for (int i = 0; i < 32; i++)
        if (fabsf(x[i]) > amax) amax = fabsf(x[i]), mx = x[i];
    if (amax == 0 || d_rtn == 0) return 1;
    bool found = false;
    uint16_t best_dh = dh_rtn;
    for (int k = -9; k <= 9; k++) {
        float iscale = -(8.0f + 0.1f * (float)k) / mx;
        float slx = 0, sl2 = 0;
        for (int i = 0; i < 32; i++) {
            int8_t v = q4_level(iscale * x[i]);
            l[i] = v;
            slx += imp[i] * x[i] * (float)v;
            sl2 += imp[i] * (float)v * (float)v;
        }
        if (!(sl2 > 0)) continue;
        for (int it = 0; it < 2; it++) {
            uint16_t dh = qf_f32_to_f16(slx / sl2);
            float d = qf_f16_to_f32(dh);
            if (!(d != 0) || !isfinite(d)) break;
            double e = q4_block_err(x, imp, l, d);
            if (e < best) {
                best = e;
                best_dh = dh;
                memcpy(bl, l, sizeof l);
                found = true;
            }
            /* re-round with the refitted d and refit once more */
            slx = sl2 = 0;
            float id = 1.0f / d;
            for (int i = 0; i < 32; i++) {
                int8_t v = q4_level(x[i] * id);
                l[i] = v;
                slx += imp[i] * x[i] * (float)v;
                sl2 += imp[i] * (float)v * (float)v;
            }
            if (!(sl2 > 0)) break;
        }
    }
    if (!found) return 1;
    qf_q4_0_pack(out, best_dh, bl);
    return fabsf(qf_f16_to_f32(best_dh) / d_rtn);
}

/* y = H v (32 x 32, row-major) */
static void mv32(const float *H, const float *v, float *y) {
    for (int i = 0; i < 32; i++) {
        float t = 0;
        for (int j = 0; j < 32; j++) t += H[i * 32 + j] * v[j];
        y[i] = t;
    }
}

/* (x - d l)^T H (x - d l) */
static double q4_block_err_h(const float *x, const float *H, const int8_t *l, float d) {
    float e[32], he[32];
    for (int i = 0; i < 32; i++) e[i] = x[i] - d * (float)l[i];
    mv32(H, e, he);
    double t = 0;
    for (int i = 0; i < 32; i++) t += (double)e[i] * he[i];
    return t;
}

/* Least-squares d for levels l under H: (l^T H x) / (l^T H l); 0 when undefined. */
static float q4_refit_h(const float *H, const float *hx, const int8_t *l) {
    float lf[32], hl[32];
    for (int i = 0; i < 32; i++) lf[i] = (float)l[i];
    mv32(H, lf, hl);
    double num = 0, den = 0;
    for (int i = 0; i < 32; i++) {
        num += (double)lf[i] * hx[i];
        den += (double)lf[i] * hl[i];
    }
    if (!(den > 0)) return 0;
    return qf_f16_to_f32(qf_f32_to_f16((float)(num / den)));
}

/* Greedy rounding descent at fixed d: q_i +- 1 while (x - d q)^T H (x - d q) falls. */
static void q4_descent_h(const float *x, const float *H, int8_t *l, float d) {
    float e[32], g[32];
    for (int i = 0; i < 32; i++) e[i] = x[i] - d * (float)l[i];
    mv32(H, e, g); /* g = H e */
    for (int pass = 0; pass < 4; pass++) {
        bool moved = false;
        for (int i = 0; i < 32; i++) {
            float hii = H[i * 32 + i];
            for (int dl = -1; dl <= 1; dl += 2) {
                int nl = l[i] + dl;
                if (nl < -8 || nl > 7) continue;
                /* err(l + dl e_i) - err(l) = -2 d dl g_i + d^2 H_ii */
                float delta = -2.0f * d * (float)dl * g[i] + d * d * hii;
                if (delta < -1e-12f * fabsf(d * d * hii)) {
                    l[i] = (int8_t)nl;
                    for (int j = 0; j < 32; j++) g[j] -= d * (float)dl * H[j * 32 + i];
                    moved = true;
                    break;
                }
            }
        }
        if (!moved) break;
    }
}

static float q4_block_search_h(const float *x, const float *H, block_q4_0 *out) {
    int8_t l[32], bl[32];
    qf_quantize_row(QF_TYPE_Q4_0, x, out, 32);
    float d_rtn;
    q4_unpack(out, bl, &d_rtn);
    double best = q4_block_err_h(x, H, bl, d_rtn);
    float best_d = d_rtn;
    if (d_rtn == 0) return 1;
    float hx[32], dg[32];
    mv32(H, x, hx);
    bool found = false;
    /* start: the diagonal search under diag(H) (cheap), then the full metric */
    for (int i = 0; i < 32; i++) dg[i] = H[i * 32 + i];
    block_q4_0 tmp;
    q4_block_search(x, dg, &tmp);
    float d;
    q4_unpack(&tmp, l, &d);
    if (d != 0 && isfinite(d)) {
        double e = q4_block_err_h(x, H, l, d);
        if (e < best) {
            best = e;
            best_d = d;
            memcpy(bl, l, sizeof l);
            found = true;
        }
    }
    /* rounding descent from the best candidate, refit d, again */
    memcpy(l, bl, sizeof l);
    d = best_d;
    for (int round = 0; round < 3; round++) {
        q4_descent_h(x, H, l, d);
        double e = q4_block_err_h(x, H, l, d);
        if (e < best) {
            best = e;
            best_d = d;
            memcpy(bl, l, sizeof l);
            found = true;
        }
        float d2 = q4_refit_h(H, hx, l);
        if (!(d2 != 0) || !isfinite(d2) || d2 == d) break;
        double e2 = q4_block_err_h(x, H, l, d2);
        if (!(e2 < best)) break;
        best = e2;
        best_d = d = d2;
        memcpy(bl, l, sizeof l);
        found = true;
    }
    if (!found) return 1;
    qf_q4_0_pack(out, qf_f32_to_f16(best_d), bl);
    return fabsf(best_d / d_rtn);
}

/* Quantize one folded row (D a multiple of 32) with the chosen block quantizer: cov (the
 * folded [D/32][32][32] covariance) when non-NULL, else imp (diagonal) when non-NULL, else RTN.
 * q4 receives the Q4_0 row; deq (may be NULL) its dequantized values; ratio (may be NULL) each
 * block's d ratio to RTN. Returns the sum of those ratios. */
static double quant_row(const float *row, int64_t D, const float *imp, const float *cov, block_q4_0 *q4,
                        float *deq, float *ratio) {
    double sum = 0;
    if (!imp && !cov) {
        qf_quantize_row(QF_TYPE_Q4_0, row, q4, D);
        sum = (double)(D / 32);
        if (ratio)
            for (int64_t b = 0; b < D / 32; b++) ratio[b] = 1;
    } else
        for (int64_t b = 0; b < D / 32; b++) {
            float r = cov ? q4_block_search_h(row + b * 32, cov + b * 1024, q4 + b)
                          : q4_block_search(row + b * 32, imp + b * 32, q4 + b);
            if (ratio) ratio[b] = r;
            sum += r;
        }
    if (deq) qf_dequantize_row(QF_TYPE_Q4_0, q4, deq, D);
    return sum;
}

qf_status qf_awq_quant_rows(const float *W, int64_t R, int64_t D, const float *s, int quant, const float *imp,
                            const float *cov, void *q4v, float *ratio, float *deq) {
    block_q4_0 *q4 = q4v, *tmp = q4 ? NULL : malloc((size_t)(D / 32) * sizeof(block_q4_0));
    float *x = malloc((size_t)D * sizeof(float));
    if (!x || (!q4 && !tmp)) {
        free(x), free(tmp);
        return QF_ERR_NOMEM;
    }
    const int64_t nb = D / 32;
    for (int64_t r = 0; r < R; r++) { /* the search's and the block quantizer's own route: quant_row */
        const float *w = W + r * D;
        for (int64_t c = 0; c < D; c++) x[c] = s ? w[c] * s[c] : w[c];
        float *dr = deq ? deq + r * D : NULL;
        quant_row(x, D, quant == QF_CUDA_AWQ_DIAG ? imp : NULL, quant == QF_CUDA_AWQ_COV ? cov : NULL,
                  q4 ? q4 + r * nb : tmp, dr, ratio ? ratio + r * nb : NULL);
        if (dr && s)
            for (int64_t c = 0; c < D; c++) dr[c] /= s[c];
    }
    free(x), free(tmp);
    return QF_OK;
}

/* ---- scales ----
 * s over the group's scale channels (Ds of them; under GQA the v -> o group has one per
 * kv-head channel, cmap maps wo's input channel to it), normalized by sqrt(max * min), as
 * AutoAWQ: s = x^alpha (or x^alpha / w^(1-alpha) with duo), clamped at 1e-4. */
static void make_scales(const float *mean_abs, const float *wmean, int64_t Ds, float alpha, float *s) {
    float mx = 0, mn = INFINITY;
    for (int64_t c = 0; c < Ds; c++) {
        float v = powf(fmaxf(mean_abs[c], 1e-12f), alpha);
        if (wmean) v /= powf(fmaxf(wmean[c], 1e-12f), 1.0f - alpha) + 1e-4f;
        if (v < 1e-4f) v = 1e-4f;
        s[c] = v;
        mx = fmaxf(mx, v);
        mn = fminf(mn, v);
    }
    float norm = sqrtf(mx * mn);
    if (!(norm > 0) || !isfinite(norm)) norm = 1;
    for (int64_t c = 0; c < Ds; c++) s[c] /= norm;
}

static void expand_scales(const float *ss, const int *cmap, int64_t D, float *s) {
    for (int64_t c = 0; c < D; c++) s[c] = cmap ? ss[cmap[c]] : ss[c];
}

/* Folded importance: imp = E[(x/s)^2] plus a floor; cov (may be NULL) = E[x_b x_b^T] / (s_i s_j)
 * plus the same floor on the diagonal. raw_cov is [D/32][32][32] (full, symmetric). */
static void folded_importance(const float *msq, const float *raw_cov, const float *s, int64_t D, float *imp,
                              float *cov) {
    double mean = 0;
    for (int64_t c = 0; c < D; c++) {
        imp[c] = msq[c] / (s[c] * s[c]);
        mean += imp[c];
    }
    mean /= (double)D;
    float floor_ = (float)(AWQ_IMP_FLOOR * mean);
    for (int64_t c = 0; c < D; c++) imp[c] += floor_;
    if (!cov) return;
    for (int64_t b = 0; b < D / 32; b++) {
        const float *rc = raw_cov + b * 1024, *sb = s + b * 32;
        float *cb = cov + b * 1024;
        for (int i = 0; i < 32; i++)
            for (int j = 0; j < 32; j++) cb[i * 32 + j] = rc[i * 32 + j] / (sb[i] * sb[j]) + (i == j ? floor_ : 0);
    }
}

/* ---- alpha search for one group ---- */
typedef enum { QUANT_RTN = QF_CUDA_AWQ_RTN, QUANT_DIAG = QF_CUDA_AWQ_DIAG, QUANT_COV = QF_CUDA_AWQ_COV } quant_kind;

typedef struct {
    const float *X;        /* [n][D] calibration rows */
    const float *W;        /* [R][D] the group's weights, stacked */
    const float *Y;        /* [n][R] reference output */
    const float *mean_abs; /* [Ds] per scale channel */
    const float *wmean;    /* [Ds] duo weight term, or NULL */
    const int *cmap;       /* [D] scale channel of each input channel, or NULL (Ds = D) */
    const float *msq;      /* [D] E[x^2] */
    const float *raw_cov;  /* [D/32][32][32] E[x_b x_b^T], or NULL */
    quant_kind quant;
    const float *Wdown;    /* gate_up scored on Wdown (silu(gate) * up): [Dout][R/2]; or NULL */
    const float *Href;     /* [n][R/2] reference silu(gate) * up */
    int64_t n, D, Ds, R, Dout;
    int n_alpha;
    const float *alphas;
    double *mse;          /* [n_alpha] */
    float **wbuf, **ybuf, **hbuf, **obuf; /* per thread [R][D], [n][R], [n][R/2], [n][Dout] */
    void **qbuf;          /* per thread Q4_0 row */
    bool failed;
} search_job;

static float silu(float x) { return x / (1.0f + expf(-x)); }

/* One alpha's scales: ss [Ds] per scale channel, s [D] per input channel, and the folded
 * importance the quantizer reads (imp [D]; cov [D/32][32][32] for QUANT_COV, else unused). */
static void alpha_fold(const search_job *j, float alpha, float *ss, float *s, float *imp, float *cov) {
    make_scales(j->mean_abs, j->wmean, j->Ds, alpha, ss);
    expand_scales(ss, j->cmap, j->D, s);
    if (j->quant != QUANT_RTN) folded_importance(j->msq, j->raw_cov, s, j->D, imp, j->quant == QUANT_COV ? cov : NULL);
}

/* The search on the GPU: j->mse[a] for every alpha, the group's X and W already on the device
 * (g). The folding is the host's (cheap); the quantized weight, the GEMM and the error run
 * there. */
static qf_status gpu_search(search_job *j, qf_cuda_awq *g, qf_error *err) {
    const int64_t D = j->D;
    float *ss = malloc((size_t)j->Ds * sizeof(float)), *s = malloc((size_t)D * sizeof(float));
    float *imp = malloc((size_t)D * sizeof(float));
    float *cov = j->quant == QUANT_COV ? malloc((size_t)D * 32 * sizeof(float)) : NULL;
    qf_status st = QF_OK;
    if (!ss || !s || !imp || (j->quant == QUANT_COV && !cov)) st = qf_fail(err, QF_ERR_NOMEM, "awq: out of memory");
    for (int a = 0; a < j->n_alpha && !st; a++) {
        alpha_fold(j, j->alphas[a], ss, s, imp, cov);
        st = qf_cuda_awq_group_mse(g, s, (int)j->quant, imp, cov, &j->mse[a], err);
    }
    free(ss), free(s), free(imp), free(cov);
    return st;
}

static double group_mse(search_job *j, int ith, float alpha) {
    const int64_t D = j->D, R = j->R, n = j->n;
    float *Wq = j->wbuf[ith], *Yq = j->ybuf[ith];
    float *ss = malloc((size_t)j->Ds * sizeof(float)), *s = malloc((size_t)D * sizeof(float));
    float *row = malloc((size_t)D * sizeof(float)), *imp = malloc((size_t)D * sizeof(float));
    float *cov = j->quant == QUANT_COV ? malloc((size_t)D * 32 * sizeof(float)) : NULL;
    if (!ss || !s || !row || !imp || (j->quant == QUANT_COV && !cov)) {
        free(ss), free(s), free(row), free(imp), free(cov);
        j->failed = true;
        return INFINITY;
    }
    alpha_fold(j, alpha, ss, s, imp, cov);
    for (int64_t r = 0; r < R; r++) {
        const float *w = j->W + r * D;
        for (int64_t c = 0; c < D; c++) row[c] = w[c] * s[c];
        quant_row(row, D, j->quant == QUANT_DIAG ? imp : NULL, j->quant == QUANT_COV ? cov : NULL, j->qbuf[ith],
                  Wq + r * D, NULL);
        for (int64_t c = 0; c < D; c++) Wq[r * D + c] /= s[c];
    }
    free(ss), free(s), free(row), free(imp), free(cov);
    qf_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)R, (int)D, 1.0f, j->X, (int)D, Wq,
                (int)D, 0.0f, Yq, (int)R);
    double e = 0;
    if (j->Wdown) {
        const int64_t F = R / 2;
        float *h = j->hbuf[ith], *o = j->obuf[ith];
        for (int64_t i = 0; i < n; i++)
            for (int64_t c = 0; c < F; c++)
                h[i * F + c] = j->Href[i * F + c] - silu(Yq[i * R + c]) * Yq[i * R + F + c];
        qf_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)j->Dout, (int)F, 1.0f, h, (int)F,
                    j->Wdown, (int)F, 0.0f, o, (int)j->Dout);
        for (int64_t i = 0; i < n * j->Dout; i++) e += (double)o[i] * o[i];
        return e / (double)(n * j->Dout);
    }
    for (int64_t i = 0; i < n * R; i++) {
        double d = (double)Yq[i] - (double)j->Y[i];
        e += d * d;
    }
    return e / (double)(n * R);
}

static void search_worker(void *arg, int ith, int nth) {
    search_job *j = arg;
    for (int a = ith; a < j->n_alpha; a += nth) j->mse[a] = group_mse(j, ith, j->alphas[a]);
}

/* j->mse for every alpha of j: on the GPU when g holds the group, else over the pool */
static qf_status run_search(search_job *j, qf_pool *pool, qf_cuda_awq *g, qf_error *err) {
    if (g) return gpu_search(j, g, err);
    qf_pool_run(pool, search_worker, j);
    return j->failed ? qf_fail(err, QF_ERR_NOMEM, "awq: out of memory") : QF_OK;
}

typedef struct {
    const float *W;    /* [R][D] folded f32 */
    block_q4_0 *q4;    /* [R][D/32] out */
    const float *imp;  /* [D] */
    const float *cov;  /* [D/32][32][32] or NULL */
    int64_t R, D;
    double *ratio_sum; /* [nth] */
} clip_job;

static void clip_worker(void *arg, int ith, int nth) {
    clip_job *j = arg;
    int64_t lo, hi;
    qf_split_range(j->R, ith, nth, &lo, &hi);
    double sum = 0;
    int64_t nb = j->D / 32;
    for (int64_t r = lo; r < hi; r++)
        sum += quant_row(j->W + r * j->D, j->D, j->cov ? NULL : j->imp, j->cov, j->q4 + r * nb, NULL, NULL);
    j->ratio_sum[ith] = sum;
}

/* ---- folded tensors handed to the writer ---- */
typedef struct {
    char name[96];
    float *data;
    block_q4_0 *q4; /* Q4_0 rows from the block search, or NULL */
    int64_t n;
} override_t;

typedef struct {
    override_t *v;
    int n, cap;
} override_set;

static float *ov_add(override_set *o, const char *name, float *data, int64_t n) {
    if (!data) return NULL;
    if (o->n == o->cap) {
        int cap = o->cap ? o->cap * 2 : 64;
        override_t *nv = realloc(o->v, (size_t)cap * sizeof *nv);
        if (!nv) {
            free(data);
            return NULL;
        }
        o->v = nv;
        o->cap = cap;
    }
    snprintf(o->v[o->n].name, sizeof o->v[o->n].name, "%s", name);
    o->v[o->n].data = data;
    o->v[o->n].q4 = NULL;
    o->v[o->n].n = n;
    o->n++;
    return data;
}

static float *ov_get(override_set *o, const char *name) {
    for (int i = 0; i < o->n; i++)
        if (!strcmp(o->v[i].name, name)) return o->v[i].data;
    return NULL;
}

static const float *ov_lookup(void *user, const char *name, const void **q4) {
    override_set *o = user;
    for (int i = 0; i < o->n; i++)
        if (!strcmp(o->v[i].name, name)) {
            *q4 = o->v[i].q4;
            return o->v[i].data; /* NULL once the block quantizer has run (q4 holds the rows) */
        }
    return NULL;
}

static void ov_free(override_set *o) {
    for (int i = 0; i < o->n; i++) {
        free(o->v[i].data);
        free(o->v[i].q4);
    }
    free(o->v);
}

/* Folded f32 tensor for blk.<il>.<what>: created from the model's weight on first use. */
static float *ov_tensor(override_set *o, int il, const char *what, const qf_weight *w, qf_pool *pool) {
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s", il, what);
    float *d = ov_get(o, name);
    if (d) return d;
    return ov_add(o, name, weight_f32(w, pool), w->ne0 * (w->ne1 > 0 ? w->ne1 : 1));
}

static void scale_cols(float *W, int64_t R, int64_t D, const float *s) {
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < D; c++) W[r * D + c] *= s[c];
}

static void scale_rows_inv(float *W, int64_t R, int64_t D, const float *s) {
    for (int64_t r = 0; r < R; r++) {
        float inv = 1.0f / s[r];
        for (int64_t c = 0; c < D; c++) W[r * D + c] *= inv;
    }
}

static bool is_q4(const qf_weight *w) { return w->ne0 % 32 == 0; }

/* Full symmetric float copy of a site's accumulated covariance, divided by its count. */
static float *site_cov(const reservoir *r) {
    if (!r->cov || r->cov_n < 1) return NULL;
    float *c = malloc((size_t)(r->dim / 32) * 1024 * sizeof(float));
    if (!c) return NULL;
    for (int b = 0; b < r->dim / 32; b++)
        for (int i = 0; i < 32; i++)
            for (int j = 0; j < 32; j++) {
                const double *rc = r->cov + (size_t)b * 1024;
                c[b * 1024 + i * 32 + j] = (float)((i <= j ? rc[i * 32 + j] : rc[j * 32 + i]) / (double)r->cov_n);
            }
    return c;
}

qf_status qf_awq_run(qf_model *m, const int32_t *calib_tokens, int64_t n_calib,
                     const qf_awq_params *pin, const char *out_gguf, qf_awq_report *rep,
                     qf_error *err) {
    double t0 = qf_now_sec();
    qf_awq_params p = pin ? *pin : qf_awq_default_params();
    qf_awq_report local_rep;
    if (!rep) rep = &local_rep; /* the search needs the alphas whether or not the caller wants them */
    memset(rep, 0, sizeof *rep);
    if (!m || !out_gguf) return qf_fail(err, QF_ERR_ARG, "awq: model and output path are required");
    if (p.n_grid < 1 || p.n_grid > 1000)
        return qf_fail(err, QF_ERR_ARG, "awq: n_grid %d: expected 1..1000", p.n_grid);
    if (p.rows_per_site < 1)
        return qf_fail(err, QF_ERR_ARG, "awq: rows_per_site %d: expected >= 1", p.rows_per_site);
    if (p.fixed_alpha > 1 || isnan(p.fixed_alpha))
        return qf_fail(err, QF_ERR_ARG, "awq: fixed_alpha %g: expected < 0 (search) or [0, 1]",
                       (double)p.fixed_alpha);
    const qf_gguf *src = qf_model_gguf(m);
    qf_status st = qf_forge_check_arch(src, err);
    if (st) return st;
    const qf_hparams *hp = qf_model_hparams(m);
    /* the scales fold into named tensors (attn_norm, ffn_norm, attn_v, ffn_up) and each group's
     * rows come from every token: fused tensors and routed experts have neither */
    if (hp->n_expert)
        return qf_fail(err, QF_ERR_UNSUPPORTED,
                       "awq: %s has mixture-of-experts FFNs (%d experts, ffn_*_exps): AWQ needs calibration rows per "
                       "expert, which the router hands out unevenly; not supported (plain quantize works)",
                       hp->arch_name, hp->n_expert);
    if (hp->fused_qkv || hp->fused_gate_up)
        return qf_fail(err, QF_ERR_UNSUPPORTED,
                       "awq: %s stores fused tensors (attn_qkv, ffn_up = gate|up): AWQ's scale folding is not "
                       "implemented for them (plain quantize works)",
                       hp->arch_name);
    int n_ctx = p.n_ctx > 0 ? p.n_ctx : (hp->n_ctx_train < 512 ? hp->n_ctx_train : 512);
    if (n_ctx < 2) n_ctx = 2;
    int64_t n_tok = n_calib;
    if (p.max_tokens > 0 && p.max_tokens < n_tok) n_tok = p.max_tokens;
    if (!calib_tokens || n_tok < 2)
        return qf_fail(err, QF_ERR_ARG, "awq: %lld calibration tokens: expected at least 2",
                       (long long)n_tok);
    int n_threads = p.n_threads > 0 ? p.n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n_threads < 1) n_threads = 1;
    if (p.device == QF_DEVICE_CUDA && !qf_cuda_available())
        return qf_fail(err, QF_ERR_DEVICE,
                       "awq --device cuda: no CUDA GPU answers (this build has no CUDA backend, or no GPU is "
                       "visible); run with --device cpu");
    bool gpu = p.device == QF_DEVICE_CUDA || (p.device == QF_DEVICE_AUTO && qf_cuda_available());
    const int L = hp->n_layer, D = hp->n_embd, F = hp->n_ff, Dq = hp->n_head * hp->head_dim;
    const int hd = hp->head_dim, Dkv = hp->n_head_kv * hp->head_dim;
    /* v -> o: one scale per kv-head channel; query head h reads kv head h / (n_head / n_head_kv) */
    const bool vo_ok = hp->n_head_kv > 0 && hp->n_head % hp->n_head_kv == 0;
    const int q_per_kv = vo_ok ? hp->n_head / hp->n_head_kv : 1;
    const bool quantize = !p.keep_float;
    const bool want_cov = p.clip && p.block_cov && quantize;
    const quant_kind final_quant = !p.clip || !quantize ? QUANT_RTN : p.block_cov ? QUANT_COV : QUANT_DIAG;
    const int G = QF_AWQ_GROUP_COUNT;

    /* ---- capture: statistics (capture.h) + row reservoirs and block covariances (our tap) ---- */
    qf_capture_params cpar = {.max_per_layer = 0, .activations = true, .seed = p.seed};
    qf_capture *cap = qf_capture_new(hp, &cpar, err);
    if (!cap) return err ? err->code : QF_ERR_NOMEM;
    awq_tap_state ts = {.cap_tap = qf_capture_tap(cap), .cap = p.rows_per_site, .rng = p.seed};
    ts.res = calloc((size_t)L * QF_ACT_SITE_COUNT, sizeof(reservoir));
    qf_pool *pool = qf_pool_create(n_threads); /* the capture's covariances, then the search */
    ts.pool = pool;
    ts.tmp = malloc((size_t)n_threads * 1024 * sizeof(float));
    qf_context *ctx = NULL;
    qf_cuda_awq *gdev = NULL; /* the current group's search state on the GPU */
    float *gratio = NULL;     /* [R][D/32] the GPU quantizer's d ratios */
    override_set ov = {0};
    search_job sj = {0};
    float *Y = NULL, *Wstack = NULL, *mean_abs = NULL, *mean_s = NULL, *wmean = NULL, *wmean_s = NULL;
    float *msq = NULL, *s = NULL, *ss = NULL, *alphas = NULL, *s_all = NULL, *Wdown = NULL, *Href = NULL;
    float *raw_cov = NULL, *imp = NULL, *fcov = NULL;
    double *mse = NULL, *ratio_sum = NULL;
    int *cmap = NULL;
    if (!ts.res || !pool || !ts.tmp) goto nomem;
    for (int l = 0; l < L; l++)
        for (int si = 0; si < QF_ACT_SITE_COUNT; si++) {
            reservoir *r = &ts.res[l * QF_ACT_SITE_COUNT + si];
            r->dim = si == QF_ACT_FFN_DOWN ? F : si == QF_ACT_ATTN_OUT ? Dq : D;
            if (si == QF_ACT_ATTN_OUT && !(vo_ok && p.scale_vo)) continue;
            r->rows = malloc((size_t)p.rows_per_site * (size_t)r->dim * sizeof(float));
            if (!r->rows) goto nomem;
            if (want_cov && r->dim % 32 == 0) {
                r->cov = calloc((size_t)(r->dim / 32) * 1024, sizeof(double));
                if (!r->cov) goto nomem;
            }
        }
    /* wo is quantized with its block covariance even when v -> o is not scaled */
    if (want_cov && !(vo_ok && p.scale_vo) && Dq % 32 == 0)
        for (int l = 0; l < L; l++) {
            reservoir *r = &ts.res[l * QF_ACT_SITE_COUNT + QF_ACT_ATTN_OUT];
            r->cov = calloc((size_t)(Dq / 32) * 1024, sizeof(double));
            if (!r->cov) goto nomem;
        }
    qf_context_params cp = qf_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = n_ctx;
    cp.n_threads = n_threads;
    cp.device = gpu ? QF_DEVICE_CUDA : QF_DEVICE_CPU;
    cp.cuda.gemm_f32 = gpu; /* f32 GEMMs where the canonical arithmetic does not apply */
    /* the canonical arithmetic (kernels/canon.h): the same captured activations on the CPU and
     * the GPU, so the search and the block quantizer (bit-exact with the CPU's) see the same inputs */
    cp.canonical = true;
    ctx = qf_context_new(m, &cp, err);
    if (!ctx && gpu && p.device == QF_DEVICE_AUTO) { /* a model the GPU backend refuses: auto means the CPU */
        gpu = false;
        cp.device = QF_DEVICE_CPU;
        cp.cuda.gemm_f32 = false;
        if (err) qf_error_clear(err);
        ctx = qf_context_new(m, &cp, err);
    }
    rep->on_gpu = gpu;
    if (!ctx) {
        st = err ? err->code : QF_ERR_NOMEM;
        goto done;
    }
    {
        const qf_tokenizer *tok = qf_model_tokenizer(m);
        bool add_bos = qf_tokenizer_add_bos(tok) && qf_tokenizer_bos(tok) >= 0;
        int32_t *w = malloc((size_t)n_ctx * sizeof(int32_t));
        if (!w) goto nomem;
        qf_tap tap = {.user = &ts, .on_kv = NULL, .on_act = awq_on_act};
        qf_context_set_tap(ctx, &tap);
        qf_progress bar;
        if (p.progress) qf_progress_begin(&bar, "awq capture", n_tok);
        /* windows of n_ctx spread evenly over the whole text (not its first n_tok tokens),
         * so every part of the calibration split is represented */
        int64_t n_win = (n_tok + n_ctx - 1) / n_ctx, done_tok = 0;
        for (int64_t wi = 0; wi < n_win && !st; wi++) {
            int n = (int)(n_tok - done_tok < n_ctx ? n_tok - done_tok : n_ctx);
            int64_t start = wi * n_ctx;
            if (n_calib > n_tok && n_win > 1) start = wi * ((n_calib - n) / (n_win - 1));
            if (start + n > n_calib) start = n_calib - n;
            memcpy(w, calib_tokens + start, (size_t)n * sizeof(int32_t));
            done_tok += n;
            if (add_bos) w[0] = qf_tokenizer_bos(tok);
            st = qf_decode(ctx, w, n, 0, NULL, n, err);
            if (p.progress) qf_progress_update(&bar, done_tok);
        }
        if (p.progress) qf_progress_end(&bar);
        qf_context_set_tap(ctx, NULL);
        free(w);
        if (st) {
            qf_error_prefix(err, "awq capture: ");
            st = QF_ERR_CAPTURE_FAILED;
            if (err) err->code = st;
            goto done;
        }
    }
    qf_context_free(ctx);
    ctx = NULL;
    rep->seconds_capture = qf_now_sec() - t0;
    double t_search = qf_now_sec();

    {
        size_t k = (size_t)L * G;
        rep->n_layer = L;
        rep->alpha = malloc(k * sizeof(float));
        rep->clip = malloc(k * sizeof(float));
        rep->mse_rtn = calloc(k, sizeof(double));
        rep->mse_awq = calloc(k, sizeof(double));
        if (!rep->alpha || !rep->clip || !rep->mse_rtn || !rep->mse_awq) goto nomem;
        for (size_t i = 0; i < k; i++) rep->alpha[i] = -1, rep->clip[i] = 1;
        rep->vo_skipped_gqa = !vo_ok && p.scale_vo;
        rep->calib_tokens = n_tok;
        rep->rows_used = ts.res[QF_ACT_ATTN_IN].kept;
        rep->n_grid = p.n_grid;
    }

    /* ---- search and fold, layer by layer ---- */
    int n_alpha = p.fixed_alpha >= 0 ? 2 : p.n_grid;
    int64_t maxR = 2 * (int64_t)F + Dq, maxD = F > Dq ? F : Dq;
    if (D > maxD) maxD = D;
    if (3 * (int64_t)D > maxR) maxR = 3 * (int64_t)D;
    if (Dq + 2 * (int64_t)Dkv > maxR) maxR = Dq + 2 * (int64_t)Dkv;
    /* the largest stacked group: q|k|v [Dq + 2 Dkv][D], gate|up [2F][D], down [D][F], o [D][Dq]
     * (not maxR x maxD, which no group reaches: 1.9 GB per search thread on an 8B shape for
     * gate|up's 0.47 GB) */
    int64_t maxRD = (Dq + 2 * (int64_t)Dkv) * D;
    if (2 * (int64_t)F * D > maxRD) maxRD = 2 * (int64_t)F * D;
    if ((int64_t)D * F > maxRD) maxRD = (int64_t)D * F;
    if ((int64_t)D * Dq > maxRD) maxRD = (int64_t)D * Dq;
    int64_t nrows = p.rows_per_site;
    alphas = malloc((size_t)(n_alpha > 3 ? n_alpha : 3) * sizeof(float));
    mse = malloc((size_t)(n_alpha > 3 ? n_alpha : 3) * sizeof(double));
    sj.wbuf = calloc((size_t)n_threads, sizeof(float *));
    sj.ybuf = calloc((size_t)n_threads, sizeof(float *));
    sj.hbuf = calloc((size_t)n_threads, sizeof(float *));
    sj.obuf = calloc((size_t)n_threads, sizeof(float *));
    sj.qbuf = calloc((size_t)n_threads, sizeof(void *));
    Wstack = malloc((size_t)maxRD * sizeof(float));
    mean_abs = malloc((size_t)maxD * sizeof(float));
    mean_s = malloc((size_t)maxD * sizeof(float));
    wmean = malloc((size_t)maxD * sizeof(float));
    wmean_s = malloc((size_t)maxD * sizeof(float));
    msq = malloc((size_t)maxD * sizeof(float));
    s = malloc((size_t)maxD * sizeof(float));
    ss = malloc((size_t)maxD * sizeof(float));
    imp = malloc((size_t)maxD * sizeof(float));
    fcov = malloc((size_t)maxD * 32 * sizeof(float));
    cmap = malloc((size_t)maxD * sizeof(int));
    s_all = malloc((size_t)L * G * (size_t)maxD * sizeof(float));
    Y = malloc((size_t)nrows * (size_t)maxR * sizeof(float));
    Href = malloc((size_t)nrows * (size_t)F * sizeof(float));
    ratio_sum = calloc((size_t)n_threads, sizeof(double));
    if (gpu) gratio = malloc((size_t)(maxRD / QK) * sizeof(float)); /* one tensor's blocks at most */
    if (!pool || !alphas || !mse || !sj.wbuf || !sj.ybuf || !sj.hbuf || !sj.obuf || !sj.qbuf || !Wstack ||
        !mean_abs || !mean_s || !wmean || !wmean_s || !msq || !s || !ss || !imp || !fcov || !cmap || !s_all ||
        !Y || !Href || !ratio_sum || (gpu && !gratio))
        goto nomem;
    /* the CPU search's per-thread buffers (~2 GB each on an 8B shape): not needed on the GPU */
    for (int t = 0; t < ((gpu && !p.ffn_act_loss) ? 0 : n_threads); t++) {
        sj.wbuf[t] = malloc((size_t)maxRD * sizeof(float));
        sj.ybuf[t] = malloc((size_t)nrows * (size_t)maxR * sizeof(float));
        sj.hbuf[t] = malloc((size_t)nrows * (size_t)F * sizeof(float));
        sj.obuf[t] = malloc((size_t)nrows * (size_t)D * sizeof(float));
        sj.qbuf[t] = malloc(qf_row_bytes(QF_TYPE_Q4_0, 32) * (size_t)(maxD / 32 + 1));
        if (!sj.wbuf[t] || !sj.ybuf[t] || !sj.hbuf[t] || !sj.obuf[t] || !sj.qbuf[t]) goto nomem;
    }
    if (p.fixed_alpha >= 0) alphas[0] = 0, alphas[1] = p.fixed_alpha;
    else
        for (int a = 0; a < n_alpha; a++) alphas[a] = (float)a / (float)p.n_grid;
    for (int64_t i = 0; i < (int64_t)L * G * maxD; i++) s_all[i] = 1;
    qf_progress bar;
    double t_quant = 0; /* the block quantizer's share of the layer loop */
    if (p.progress) qf_progress_begin(&bar, "awq search", (int64_t)L * G);
    for (int l = 0; l < L && !st; l++) {
        const qf_layer_weights *lw = qf_model_layer(m, l);
        for (int g = 0; g < G && !st; g++) {
            if (p.progress) qf_progress_update(&bar, (int64_t)l * G + g);
            const qf_weight *ws[3] = {0};
            int nw = 0;
            qf_act_site site;
            switch (g) {
            case QF_AWQ_QKV: ws[0] = &lw->wq, ws[1] = &lw->wk, ws[2] = &lw->wv, nw = 3, site = QF_ACT_ATTN_IN; break;
            case QF_AWQ_GATE_UP: ws[0] = &lw->w_gate, ws[1] = &lw->w_up, nw = 2, site = QF_ACT_FFN_IN; break;
            case QF_AWQ_DOWN: ws[0] = &lw->w_down, nw = 1, site = QF_ACT_FFN_DOWN; break;
            default: ws[0] = &lw->wo, nw = 1, site = QF_ACT_ATTN_OUT; break;
            }
            if (g == QF_AWQ_VO && !(vo_ok && p.scale_vo)) continue;
            bool ok = true;
            for (int k = 0; k < nw; k++) ok = ok && is_q4(ws[k]);
            if (g == QF_AWQ_DOWN) ok = ok && is_q4(&lw->w_up); /* up's rows get 1/s */
            if (g == QF_AWQ_VO) ok = ok && is_q4(&lw->wv) && lw->wv.ne1 == Dkv && ws[0]->ne0 == Dq;
            reservoir *res = &ts.res[l * QF_ACT_SITE_COUNT + site];
            const qf_act_stats *as = qf_capture_act(cap, l, site);
            if (!ok || !res->rows || res->kept < 1 || !as || as->count < 1) continue;
            int64_t Din = res->dim, R = 0, Ds = Din;
            for (int k = 0; k < nw; k++) ok = ok && ws[k]->ne0 == Din, R += ws[k]->ne1;
            if (!ok || R * Din > maxRD) continue; /* a shape the hyper-parameters did not promise: RTN */
            for (int64_t k = 0, r0 = 0; k < nw; r0 += ws[k]->ne1, k++) {
                float *wf = weight_f32(ws[k], pool);
                if (!wf) goto nomem;
                memcpy(Wstack + r0 * Din, wf, (size_t)(ws[k]->ne1 * Din) * sizeof(float));
                free(wf);
            }
            for (int64_t c = 0; c < Din; c++) {
                mean_abs[c] = (float)(as->sum_abs[c] / (double)as->count);
                msq[c] = (float)(as->sum_sq[c] / (double)as->count);
            }
            /* duo term: mean over the group's rows of |w| / (max |w| of its block of 32) */
            for (int64_t c = 0; c < Din; c++) wmean[c] = 0;
            if (p.duo)
                for (int64_t r = 0; r < R; r++)
                    for (int64_t b = 0; b < Din; b += 32) {
                        const float *w = Wstack + r * Din + b;
                        float mx = 0;
                        for (int i = 0; i < 32; i++) mx = fmaxf(mx, fabsf(w[i]));
                        for (int i = 0; i < 32; i++) wmean[b + i] += mx > 0 ? fabsf(w[i]) / mx / (float)R : 0;
                    }
            /* scale channels: the input channels, or under GQA for v -> o the kv-head channels */
            bool tied = g == QF_AWQ_VO && q_per_kv > 1;
            if (tied) {
                Ds = Dkv;
                for (int64_t c = 0; c < Din; c++) cmap[c] = (int)(((c / hd) / q_per_kv) * hd + c % hd);
                for (int64_t c = 0; c < Ds; c++) mean_s[c] = wmean_s[c] = 0;
                for (int64_t c = 0; c < Din; c++) {
                    mean_s[cmap[c]] += mean_abs[c] / (float)q_per_kv;
                    wmean_s[cmap[c]] += wmean[c] / (float)q_per_kv;
                }
            } else {
                memcpy(mean_s, mean_abs, (size_t)Din * sizeof(float));
                memcpy(wmean_s, wmean, (size_t)Din * sizeof(float));
            }
            free(raw_cov);
            raw_cov = final_quant == QUANT_COV ? site_cov(res) : NULL;
            if (final_quant == QUANT_COV && !raw_cov) goto nomem;
            int64_t n = res->kept;
            bool act = g == QF_AWQ_GATE_UP && p.ffn_act_loss && R == 2 * (int64_t)F;
            /* the GPU scores every group but the act-loss one (its W_down term is CPU-only) */
            if (gpu && !act) {
                if ((st = qf_cuda_awq_group_new(res->rows, n, Din, Wstack, R, &gdev, err))) goto done;
            } else
                qf_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)R, (int)Din, 1.0f, res->rows,
                         (int)Din, Wstack, (int)Din, 0.0f, Y, (int)R);
            free(Wdown);
            Wdown = NULL;
            if (act) {
                Wdown = weight_f32(&lw->w_down, pool);
                if (!Wdown) goto nomem;
                for (int64_t i = 0; i < n; i++)
                    for (int64_t c = 0; c < F; c++) Href[i * F + c] = silu(Y[i * R + c]) * Y[i * R + F + c];
            }
            sj.X = res->rows, sj.W = Wstack, sj.Y = Y, sj.mean_abs = mean_s, sj.msq = msq;
            sj.wmean = p.duo ? wmean_s : NULL, sj.cmap = tied ? cmap : NULL, sj.raw_cov = raw_cov;
            sj.Wdown = Wdown, sj.Href = Href, sj.Dout = D;
            sj.n = n, sj.D = Din, sj.Ds = Ds, sj.R = R;
            /* plain RTN at alpha 0 is the reference the report compares with */
            float a0 = 0;
            double m0 = 0;
            sj.quant = QUANT_RTN, sj.n_alpha = 1, sj.alphas = &a0, sj.mse = &m0;
            if ((st = run_search(&sj, pool, gdev, err))) goto done;
            /* the grid, scored with RTN (cheap); the final quantizer rescores the best below */
            sj.quant = QUANT_RTN;
            sj.n_alpha = n_alpha, sj.alphas = alphas, sj.mse = mse;
            if ((st = run_search(&sj, pool, gdev, err))) goto done;
            int best = 0;
            if (p.fixed_alpha >= 0) best = 1;
            else
                for (int a = 1; a < n_alpha; a++)
                    if (mse[a] < mse[best]) best = a;
            float alpha = alphas[best];
            double mse_best = mse[best];
            if (final_quant != QUANT_RTN && p.fixed_alpha < 0) {
                /* the alpha RTN liked may not be the best once the block quantizer runs: rescore
                 * 0, best/2 and best with the final quantizer and keep the best */
                float cand[3] = {0, alphas[best / 2], alpha};
                double cm[3];
                int nc = best == 0 ? 1 : best / 2 == 0 ? 2 : 3;
                if (nc == 2) cand[1] = alpha;
                sj.quant = final_quant;
                sj.n_alpha = nc, sj.alphas = cand, sj.mse = cm;
                if ((st = run_search(&sj, pool, gdev, err))) goto done;
                int bc = 0;
                for (int c = 1; c < nc; c++)
                    if (cm[c] < cm[bc]) bc = c;
                alpha = cand[bc];
                mse_best = cm[bc];
            }
            qf_cuda_awq_group_free(gdev);
            gdev = NULL;
            int k_rep = l * G + g;
            rep->alpha[k_rep] = alpha;
            rep->mse_rtn[k_rep] = m0;
            rep->mse_awq[k_rep] = mse_best;
            make_scales(mean_s, p.duo ? wmean_s : NULL, Ds, alpha, ss);
            float *sg = s_all + (size_t)k_rep * maxD;
            expand_scales(ss, tied ? cmap : NULL, Din, sg);
            /* fold: the consumers' columns *= s, the producer /= s */
            for (int k = 0; k < nw; k++) {
                const char *nm = g == QF_AWQ_QKV ? (k == 0 ? "attn_q.weight" : k == 1 ? "attn_k.weight" : "attn_v.weight")
                                 : g == QF_AWQ_GATE_UP ? (k == 0 ? "ffn_gate.weight" : "ffn_up.weight")
                                 : g == QF_AWQ_DOWN ? "ffn_down.weight" : "attn_output.weight";
                float *wf = ov_tensor(&ov, l, nm, ws[k], pool);
                if (!wf) goto nomem;
                scale_cols(wf, ws[k]->ne1, Din, sg);
            }
            if (g == QF_AWQ_QKV || g == QF_AWQ_GATE_UP) {
                const qf_weight *nw_ = g == QF_AWQ_QKV ? &lw->attn_norm : &lw->ffn_norm;
                float *gain = ov_tensor(&ov, l, g == QF_AWQ_QKV ? "attn_norm.weight" : "ffn_norm.weight", nw_, pool);
                if (!gain) goto nomem;
                for (int64_t c = 0; c < Din; c++) gain[c] /= sg[c];
            } else {
                /* the producer's output channels are the scale channels (ffn_up: F; attn_v: the
                 * kv-head channels, one per group of query heads) */
                const qf_weight *prod = g == QF_AWQ_DOWN ? &lw->w_up : &lw->wv;
                float *wf = ov_tensor(&ov, l, g == QF_AWQ_DOWN ? "ffn_up.weight" : "attn_v.weight", prod, pool);
                if (!wf) goto nomem;
                const float *sp = tied ? ss : sg;
                scale_rows_inv(wf, prod->ne1, prod->ne0, sp);
                if (g == QF_AWQ_VO && lw->bv.data) {
                    float *bv = ov_tensor(&ov, l, "attn_v.bias", &lw->bv, pool);
                    if (!bv) goto nomem;
                    for (int64_t c = 0; c < lw->bv.ne0; c++) bv[c] /= sp[c];
                }
            }
        }
        /* ---- the final block quantizer on this layer's folded weights (every group of the
         * layer is folded now; later layers never touch them), then their f32 copies freed:
         * the peak is one layer's f32 weights, not the model's ---- */
        double t_q = qf_now_sec();
        if (final_quant != QUANT_RTN && !st) {
            static const char *names[7] = {"attn_q.weight", "attn_k.weight", "attn_v.weight",
                                           "attn_output.weight", "ffn_gate.weight", "ffn_up.weight",
                                           "ffn_down.weight"};
            const qf_weight *wts[7] = {&lw->wq, &lw->wk, &lw->wv, &lw->wo, &lw->w_gate, &lw->w_up, &lw->w_down};
            static const qf_act_site sites[7] = {QF_ACT_ATTN_IN, QF_ACT_ATTN_IN, QF_ACT_ATTN_IN,
                                                 QF_ACT_ATTN_OUT, QF_ACT_FFN_IN, QF_ACT_FFN_IN,
                                                 QF_ACT_FFN_DOWN};
            static const int groups[7] = {QF_AWQ_QKV, QF_AWQ_QKV, QF_AWQ_QKV, QF_AWQ_VO,
                                          QF_AWQ_GATE_UP, QF_AWQ_GATE_UP, QF_AWQ_DOWN};
            for (int k = 0; k < 7; k++) {
                const qf_weight *w = wts[k];
                if (!is_q4(w)) continue;
                const qf_act_stats *as = qf_capture_act(cap, l, sites[k]);
                if (!as || as->count < 1 || as->dim != w->ne0) continue;
                float *wf = ov_tensor(&ov, l, names[k], w, pool);
                if (!wf) goto nomem;
                /* the folded input is x / s (s = 1 for an unscaled group) */
                const float *sg = s_all + (size_t)(l * G + groups[k]) * maxD;
                for (int64_t c = 0; c < w->ne0; c++) msq[c] = (float)(as->sum_sq[c] / (double)as->count);
                const float *cv = NULL;
                if (final_quant == QUANT_COV) {
                    free(raw_cov);
                    raw_cov = site_cov(&ts.res[l * QF_ACT_SITE_COUNT + sites[k]]);
                    if (!raw_cov) goto nomem;
                    cv = fcov;
                }
                folded_importance(msq, raw_cov, sg, w->ne0, imp, final_quant == QUANT_COV ? fcov : NULL);
                override_t *oe = NULL;
                for (int i = 0; i < ov.n; i++)
                    if (ov.v[i].data == wf) oe = &ov.v[i];
                if (oe && !oe->q4) oe->q4 = malloc((size_t)w->ne1 * (size_t)(w->ne0 / QK) * sizeof(block_q4_0));
                if (!oe || !oe->q4) goto nomem;
                double tot = 0;
                if (gpu && w->ne1 * w->ne0 <= maxRD) { /* the same blocks, bit for bit (test_cuda op_awq_quant) */
                    const int64_t nbk = w->ne1 * (w->ne0 / QK);
                    if ((st = qf_cuda_awq_quantize(wf, w->ne1, w->ne0, NULL, cv ? QUANT_COV : QUANT_DIAG, imp, cv,
                                                   oe->q4, gratio, NULL, err)))
                        goto done;
                    for (int64_t i = 0; i < nbk; i++) tot += gratio[i];
                } else {
                    clip_job cj = {.W = wf, .q4 = oe->q4, .imp = imp, .cov = cv, .R = w->ne1, .D = w->ne0,
                                   .ratio_sum = ratio_sum};
                    memset(ratio_sum, 0, (size_t)n_threads * sizeof(double));
                    qf_pool_run(pool, clip_worker, &cj);
                    for (int t = 0; t < n_threads; t++) tot += ratio_sum[t];
                }
                if (k == 0 || k == 3 || k == 4 || k == 6) /* q / gate stand for their group */
                    rep->clip[l * G + groups[k]] = (float)(tot / (double)(w->ne1 * (w->ne0 / 32)));
                /* the writer stores these rows as they are: the f32 copy has done its work */
                free(oe->data);
                oe->data = NULL;
            }
        }
        t_quant += qf_now_sec() - t_q;
    }
    if (p.progress) qf_progress_end(&bar);
    rep->seconds_search = qf_now_sec() - t_search - t_quant;

    rep->seconds_quant = t_quant;
    double t_write = qf_now_sec();
    st = qf_forge_write_model(src, out_gguf, QF_TYPE_Q4_0, p.keep_float, ov_lookup, &ov, n_threads,
                              rep->sha256, rep->tensor_sha256, err);
    rep->seconds_write = qf_now_sec() - t_write;
    if (!st) {
        qf_hex(rep->sha256, 32, rep->sha256_hex);
        qf_hex(rep->tensor_sha256, 32, rep->tensor_sha256_hex);
        rep->seconds = qf_now_sec() - t0;
    }
    goto done;

nomem:
    st = qf_fail(err, QF_ERR_NOMEM, "awq: out of memory");
done:
    if (ts.res) {
        for (int i = 0; i < L * QF_ACT_SITE_COUNT; i++) {
            free(ts.res[i].rows);
            free(ts.res[i].cov);
        }
        free(ts.res);
    }
    free(ts.tmp);
    for (int t = 0; t < n_threads; t++) {
        if (sj.wbuf) free(sj.wbuf[t]);
        if (sj.ybuf) free(sj.ybuf[t]);
        if (sj.hbuf) free(sj.hbuf[t]);
        if (sj.obuf) free(sj.obuf[t]);
        if (sj.qbuf) free(sj.qbuf[t]);
    }
    free(sj.wbuf), free(sj.ybuf), free(sj.hbuf), free(sj.obuf), free(sj.qbuf);
    free(Y), free(Wstack), free(mean_abs), free(mean_s), free(wmean), free(wmean_s), free(msq), free(s);
    free(ss), free(alphas), free(s_all), free(Wdown), free(Href), free(raw_cov), free(imp), free(fcov);
    free(mse), free(ratio_sum), free(cmap);
    if (pool) qf_pool_free(pool);
    qf_cuda_awq_group_free(gdev);
    free(gratio);
    ov_free(&ov);
    if (ctx) qf_context_free(ctx);
    qf_capture_free(cap);
    if (st || rep == &local_rep) qf_awq_report_free(rep);
    return st;
}

/* ---- the qforge.* certificate keys ---- */
qf_status qf_awq_embed_certificate(const char *gguf_path, const qf_certificate *cert,
                                   const qf_awq_report *rep, uint8_t sha256_out[32],
                                   qf_error *err) {
    if (!gguf_path || !cert) return qf_fail(err, QF_ERR_ARG, "awq certificate: path and certificate are required");
    qf_gguf *g = qf_gguf_open(gguf_path, err);
    if (!g) return err ? err->code : QF_ERR_IO;
    qf_status st = QF_OK;
    qf_gguf_writer *w = qf_gguf_writer_new();
    char *alpha_str = NULL;
    if (!w) {
        st = qf_fail(err, QF_ERR_NOMEM, "awq certificate: out of memory");
        goto done;
    }
    st = qf_gguf_writer_copy_kv(w, g, "qforge.", err);
    if (st) goto done;
    char hex[65];
    qf_gguf_writer_set_str(w, "qforge.kind", qf_artifact_kind_name(cert->kind));
    qf_gguf_writer_set_str(w, "qforge.engine_version", cert->engine_version);
    qf_gguf_writer_set_str(w, "qforge.engine_commit", cert->engine_commit);
    qf_gguf_writer_set_str(w, "qforge.created_utc", cert->created_utc);
    qf_hex(cert->model_sha256, 32, hex);
    qf_gguf_writer_set_str(w, "qforge.model_sha256", hex);
    qf_gguf_writer_set_str(w, "qforge.model_name", cert->model_name);
    qf_hex(cert->corpus_sha256, 32, hex);
    qf_gguf_writer_set_str(w, "qforge.corpus_sha256", hex);
    qf_gguf_writer_set_str(w, "qforge.split", cert->split);
    qf_gguf_writer_set_u32(w, "qforge.calib_tokens",
                           cert->calib_tokens > UINT32_MAX ? UINT32_MAX : (uint32_t)(cert->calib_tokens > 0 ? cert->calib_tokens : 0));
    qf_gguf_writer_set_u32(w, "qforge.eval_tokens",
                           cert->eval_tokens > UINT32_MAX ? UINT32_MAX : (uint32_t)(cert->eval_tokens > 0 ? cert->eval_tokens : 0));
    qf_gguf_writer_set_f32(w, "qforge.ref_ppl", (float)cert->ref_ppl);
    qf_gguf_writer_set_f32(w, "qforge.cand_ppl", (float)cert->cand_ppl);
    qf_gguf_writer_set_f32(w, "qforge.delta_ppl", (float)cert->delta_ppl);
    qf_gguf_writer_set_f32(w, "qforge.kld_mean", (float)cert->kld_mean);
    qf_gguf_writer_set_f32(w, "qforge.kld_p99", (float)cert->kld_p99);
    qf_gguf_writer_set_f32(w, "qforge.top1_agreement", (float)cert->top1_agreement);
    qf_gguf_writer_set_f32(w, "qforge.gate_max_delta_ppl", (float)cert->gate_max_delta_ppl);
    qf_gguf_writer_set_bool(w, "qforge.passed", cert->passed);
    if (rep && rep->alpha) {
        size_t cap = (size_t)rep->n_layer * QF_AWQ_GROUP_COUNT * 8 + 1;
        alpha_str = malloc(cap);
        if (!alpha_str) {
            st = qf_fail(err, QF_ERR_NOMEM, "awq certificate: out of memory");
            goto done;
        }
        size_t o = 0;
        alpha_str[0] = 0;
        for (int l = 0; l < rep->n_layer; l++)
            for (int k = 0; k < QF_AWQ_GROUP_COUNT; k++)
                o += (size_t)snprintf(alpha_str + o, cap - o, "%s%.2f", k ? "," : (l ? ";" : ""),
                                      (double)rep->alpha[l * QF_AWQ_GROUP_COUNT + k]);
        qf_gguf_writer_set_str(w, "qforge.awq.alpha", alpha_str);
        qf_gguf_writer_set_u32(w, "qforge.awq.grid", (uint32_t)rep->n_grid);
        qf_gguf_writer_set_u32(w, "qforge.awq.rows", (uint32_t)rep->rows_used);
        qf_gguf_writer_set_str(w, "qforge.awq.type", "q4_0");
        qf_gguf_writer_set_str(w, "qforge.awq.tensor_sha256", rep->tensor_sha256_hex);
    }
    for (uint64_t i = 0; i < qf_gguf_n_tensors(g) && !st; i++) {
        const qf_gguf_tensor *t = qf_gguf_tensor_at(g, i);
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)(t->name.len < 255 ? t->name.len : 255), t->name.ptr);
        st = qf_gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data, t->nbytes, err);
    }
    if (!st) st = qf_gguf_writer_write(w, gguf_path, err);
    if (!st && sha256_out) st = qf_sha256_file(gguf_path, sha256_out, err);
done:
    free(alpha_str);
    qf_gguf_writer_free(w);
    qf_gguf_close(g);
    return st;
}
