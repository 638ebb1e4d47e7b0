/* kv_rq_lin.c: kv-rq rows in the coefficient domain (engine.h, "kv-rq in the coefficient
 * domain"): the tables that read a row's coefficients straight from its bits, decode a run of
 * rows with one GEMM, and apply the per-head linear maps (the transform, and V's predictor
 * folded into K's coefficients) to attention-weighted sums. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/kv_rq.h"
#include "kernels/blas.h"
#include "kernels/hadamard.h"
#include "kernels/vecmath.h"
#include "util/util.h"

enum { LIN_F16 = 0, LIN_HAD = 2, LIN_KLT = 3 };

struct qf_kv_rq_lin {
    int L, H, hd;
    uint8_t *kind;  /* [2][L]: LIN_F16, LIN_HAD (format 1/2 rows) or LIN_KLT (format 3) */
    int *m;         /* [2][L][H]: coefficients per row */
    int *kdim;      /* [L]: sum of m over the K heads (the K coefficient row of one position) */
    int *koff;      /* [L][H]: K head g's first column in that row */
    /* coefficient k of (stream, layer, head) o, at [o][k]: its code is bits [sh, sh + width) of
     * the bytes from code byte `byte` (little endian; mask = 2^width - 1), its value in units of
     * the row scale tab[toff + code] (format 3: sigma_j levels_j; formats 1/2: the head's levels);
     * int32 for qf_bits_lookup's vector loads */
    int32_t *byte, *toff, *sh, *mask;
    float *tab;     /* [2][L][H][hd * QF_KV_RQ_MAX_LEVELS] at most; each coefficient's 2^width values */
    float sctab[256]; /* qf_kv_rq_scale of every scale byte */
    /* LIN_KLT heads: T[o] [m][hd], row k = column k of dec: the first m rows of the cache's own
     * decT (engine.h, qf_kv_rq_bind), read in place. Coefficient k is coordinate k, m is one past
     * the last coded coordinate (widths fall with the KLT's eigenvalues, so the few dropped
     * coordinates below m, 0.1-0.4% of the coefficients on the demo models' artifacts, read 0). */
    const float **T; /* [2][L][H] */
    bool *pred_on;   /* [L] */
};

static size_t slh(const qf_kv_rq_lin *t, int s, int l, int h) { return ((size_t)s * t->L + l) * t->H + h; }

void qf_kv_rq_lin_free(qf_kv_cache *kv) {
    qf_kv_rq_lin *t = kv->rq_lin;
    if (!t) return;
    free(t->kind), free(t->m), free(t->kdim), free(t->koff), free(t->byte), free(t->toff), free(t->sh), free(t->mask);
    free(t->tab), free(t->T);
    free(t->pred_on);
    free(t);
    kv->rq_lin = NULL;
}

qf_status qf_kv_rq_lin_build(qf_kv_cache *kv, qf_error *err) {
    if (kv->rq_lin || !kv->rq[0] || !kv->rq[1]) return QF_OK;
    int L = kv->n_layer, H = kv->n_head_kv, hd = kv->head_dim;
    qf_kv_rq_lin *t = calloc(1, sizeof *t);
    size_t n2 = 2 * (size_t)L * H;
    if (!t) goto oom;
    kv->rq_lin = t;
    t->L = L, t->H = H, t->hd = hd;
    for (int c = 0; c < 256; c++) t->sctab[c] = qf_kv_rq_scale((uint8_t)c);
    if (!(t->kind = calloc(2 * (size_t)L, 1)) || !(t->m = calloc(n2, sizeof(int))) ||
        !(t->kdim = calloc((size_t)L, sizeof(int))) || !(t->koff = calloc((size_t)L * H, sizeof(int))) ||
        !(t->byte = calloc(n2 * hd, sizeof(int32_t))) || !(t->toff = calloc(n2 * hd, sizeof(int32_t))) ||
        !(t->sh = calloc(n2 * hd, sizeof(int32_t))) || !(t->mask = calloc(n2 * hd, sizeof(int32_t))) ||
        !(t->tab = calloc(n2 * hd * QF_KV_RQ_MAX_LEVELS, sizeof(float))) || !(t->T = calloc(n2, sizeof *t->T)) ||
        !(t->pred_on = calloc((size_t)L, sizeof(bool))))
        goto oom;
    for (int s = 0; s < 2; s++) {
        const struct qf_kv_rq_bind *r = kv->rq[s];
        for (int l = 0; l < L; l++) {
            int b = r->bits[l];
            uint8_t kind = b == QF_KV_RQ_BITS_F16 ? LIN_F16 : r->klt_enc ? LIN_KLT : LIN_HAD;
            t->kind[s * L + l] = kind;
            for (int h = 0; h < H; h++) {
                size_t o = slh(t, s, l, h), lh = (size_t)l * H + h;
                int32_t *by = t->byte + o * hd, *to = t->toff + o * hd, *sh = t->sh + o * hd, *mk = t->mask + o * hd;
                float *tab = t->tab + o * hd * QF_KV_RQ_MAX_LEVELS;
                int m = 0;
                unsigned bit = 0, nt = 0;
                if (kind == LIN_F16) {
                    m = hd;
                } else if (kind == LIN_HAD) { /* one codebook for the head */
                    memcpy(tab, r->levels + lh * QF_KV_RQ_MAX_LEVELS, sizeof(float) << b);
                    for (int k = 0; k < hd; k++, bit += (unsigned)b)
                        by[k] = (int32_t)(bit >> 3), sh[k] = (int32_t)(bit & 7), mk[k] = (1 << b) - 1, to[k] = 0;
                    m = hd;
                } else {
                    const uint8_t *w = r->klt_width + lh * hd;
                    const float *sg = r->klt_sigma + lh * hd, *lv = r->klt_levels + lh * hd * QF_KV_RQ_MAX_LEVELS;
                    /* coefficients 0..m-1 = coordinates 0..m-1 (m: past the last coded one), so that
                     * T is decT's first m rows in place; a dropped coordinate among them reads
                     * mask 0 and the head table's last entry, which stays 0 (a head with a dropped
                     * coordinate fills at most (hd - 1) * 64 entries): its coefficient is exactly 0 */
                    const unsigned zero = (unsigned)hd * QF_KV_RQ_MAX_LEVELS - 1;
                    t->T[o] = r->klt_decT + lh * hd * hd;
                    for (int j = 0; j < hd; j++)
                        if (w[j]) m = j + 1;
                    for (int j = 0; j < m; j++) {
                        by[j] = (int32_t)(bit >> 3), sh[j] = (int32_t)(bit & 7), mk[j] = (1 << w[j]) - 1;
                        to[j] = (int32_t)(w[j] ? nt : zero);
                        for (int c = 0; c < (1 << w[j]) && w[j]; c++)
                            tab[nt++] = sg[j] * lv[(size_t)j * QF_KV_RQ_MAX_LEVELS + c];
                        bit += w[j];
                    }
                }
                t->m[o] = m;
                if (s == 0) t->koff[(size_t)l * H + h] = t->kdim[l], t->kdim[l] += m;
            }
        }
    }
    if (kv->rq[1]->pred)
        for (int l = 0; l < L; l++) t->pred_on[l] = kv->rq[1]->pred_on[l];
    return QF_OK;
oom:
    qf_kv_rq_lin_free(kv);
    return qf_fail(err, QF_ERR_NOMEM, "kv-rq: out of memory for the coefficient-domain tables");
}

int qf_kv_rq_lin_dim(const qf_kv_cache *kv, int s, int l, int h) { return kv->rq_lin->m[slh(kv->rq_lin, s, l, h)]; }
int qf_kv_rq_lin_kdim(const qf_kv_cache *kv, int l) { return kv->rq_lin->kdim[l]; }
int qf_kv_rq_lin_koff(const qf_kv_cache *kv, int l, int g) { return kv->rq_lin->koff[(size_t)l * kv->n_head_kv + g]; }
bool qf_kv_rq_lin_pred_on(const qf_kv_cache *kv, int l) { return kv->rq_lin->pred_on[l]; }

void qf_kv_rq_lin_coef(const qf_kv_cache *kv, int s, int l, int h, int p0, int n, float *dst, size_t ld) {
    const qf_kv_rq_lin *t = kv->rq_lin;
    int hd = t->hd, H = t->H;
    size_t rb = kv->rq[s]->row_bytes[l], stride = (size_t)H * rb, o = slh(t, s, l, h);
    const uint8_t *base = kv->data[s][l] + (size_t)p0 * stride + (size_t)h * rb;
    if (t->kind[s * t->L + l] == LIN_F16) {
        for (int p = 0; p < n; p++) {
            const uint16_t *x = (const uint16_t *)(base + (size_t)p * stride);
            qf_dequantize_row(QF_TYPE_F16, x, dst + (size_t)p * ld, hd); /* F16C: qf_f16_to_f32's bits */
        }
        return;
    }
    int m = t->m[o];
    const int32_t *by = t->byte + o * hd, *to = t->toff + o * hd, *sh = t->sh + o * hd, *mk = t->mask + o * hd;
    const float *tab = t->tab + o * hd * QF_KV_RQ_MAX_LEVELS;
    /* a code's bits may reach 3 bytes past the row (the fast kernel's gather reads 4 at a time):
     * the next row's, or QF_KV_ROW_PAD */
    qf_bits_lookup(base, stride, n, QF_KV_RQ_SCALE_BYTES, t->sctab, m, by, sh, mk, to, tab, dst, ld);
}

void qf_kv_rq_lin_decode(const qf_kv_cache *kv, int s, int l, int h, int n, const float *y, size_t ld, float *dst) {
    const qf_kv_rq_lin *t = kv->rq_lin;
    int hd = t->hd;
    size_t o = slh(t, s, l, h);
    if (t->kind[s * t->L + l] != LIN_KLT) { /* one row at a time: the map with weight 1 (1 * mean is exact) */
        for (int p = 0; p < n; p++) qf_kv_rq_lin_apply(kv, s, l, h, y + (size_t)p * ld, 1.0f, dst + (size_t)p * hd);
        return;
    }
    const float *mu = kv->rq[s]->mean + ((size_t)l * t->H + h) * hd;
    if (qf_gemm_nn_f32_fast()) { /* mean + y T without OpenBLAS's packing (vecmath.h) */
        qf_gemm_nn_f32(n, t->m[o], hd, y, ld, t->T[o], (size_t)hd, mu, dst, (size_t)hd);
        return;
    }
    for (int p = 0; p < n; p++) memcpy(dst + (size_t)p * hd, mu, (size_t)hd * sizeof(float));
    if (t->m[o] > 0)
        qf_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, hd, t->m[o], 1.0f, y, (int)ld, t->T[o], hd, 1.0f, dst,
                 hd);
}

void qf_kv_rq_lin_pred(const qf_kv_cache *kv, int l, int h, int n, const float *yk, size_t ld, float *dst,
                       float *scratch) {
    const qf_kv_rq_lin *t = kv->rq_lin;
    if (!t->pred_on[l]) return;
    int hd = t->hd, H = t->H, HD = H * hd;
    /* per K head g: its rows k^ = mean + T y ([n][hd] in scratch), then P_h's g block on them */
    const float *P = kv->rq[1]->pred + ((size_t)l * HD + (size_t)h * hd) * HD;
    for (int g = 0; g < H; g++) {
        qf_kv_rq_lin_decode(kv, 0, l, g, n, yk + qf_kv_rq_lin_koff(kv, l, g), ld, scratch);
        qf_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, hd, hd, 1.0f, scratch, hd, P + (size_t)g * hd, HD, 1.0f,
                 dst, hd);
    }
}

void qf_kv_rq_lin_apply(const qf_kv_cache *kv, int s, int l, int h, const float *ysum, float wsum, float *out) {
    const qf_kv_rq_lin *t = kv->rq_lin;
    int hd = t->hd;
    size_t lh = (size_t)l * t->H + h, o = slh(t, s, l, h);
    const struct qf_kv_rq_bind *r = kv->rq[s];
    const float *mu = r->mean + lh * hd;
    uint8_t kind = t->kind[s * t->L + l];
    if (kind == LIN_F16) {
        memcpy(out, ysum, (size_t)hd * sizeof(float));
    } else if (kind == LIN_HAD) {
        const float *cs = r->cs + lh * hd;
        memcpy(out, ysum, (size_t)hd * sizeof(float));
        qf_hadamard(out, hd);
        for (int i = 0; i < hd; i++) out[i] = wsum * mu[i] + cs[i] * out[i];
    } else {
        for (int i = 0; i < hd; i++) out[i] = wsum * mu[i];
        qf_vec_cols_axpy_dense(t->T[o], (size_t)hd, t->m[o], ysum, hd, out); /* out[i] += T[k][i] ysum[k], k in order */
    }
}

void qf_kv_rq_lin_apply_pred(const qf_kv_cache *kv, int l, int h, const float *yksum, float wsum, float *out,
                             float *scratch) {
    const qf_kv_rq_lin *t = kv->rq_lin;
    if (!t->pred_on[l]) return;
    int hd = t->hd, H = t->H, HD = H * hd;
    /* z = sum_p w_p k^_p over every K head (scratch [HD]), then out += P_h z */
    for (int g = 0; g < H; g++)
        qf_kv_rq_lin_apply(kv, 0, l, g, yksum + qf_kv_rq_lin_koff(kv, l, g), wsum, scratch + (size_t)g * hd);
    const float *P = kv->rq[1]->pred + ((size_t)l * HD + (size_t)h * hd) * HD;
    float *pz = scratch + HD;
    qf_vec_rows_dot(P, (size_t)HD, HD, scratch, hd, pz);
    for (int i = 0; i < hd; i++) out[i] += pz[i];
}
