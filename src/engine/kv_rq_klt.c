/* kv_rq_klt.c: the kv-rq format-3 row codec (kv_rq_klt.h): variable-width packing, encode and
 * decode through a learned transform with per-coordinate Lloyd-Max codebooks. */
#include "engine/kv_rq_klt.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "engine/kv_rq.h"
#include "kernels/vecmath.h"

void qf_kv_rq_klt_pack(const uint8_t *codes, const uint8_t *width, int n, uint8_t *dst) {
    uint32_t b = 0;
    for (int i = 0; i < n; i++) b += width[i];
    memset(dst, 0, (b + 7) / 8);
    b = 0;
    for (int i = 0; i < n; i++) {
        int w = width[i];
        if (!w) continue;
        uint32_t v = codes[i] & ((1u << w) - 1);
        dst[b >> 3] |= (uint8_t)(v << (b & 7));
        if ((b & 7) + w > 8) dst[(b >> 3) + 1] |= (uint8_t)(v >> (8 - (b & 7)));
        b += (uint32_t)w;
    }
}

void qf_kv_rq_klt_unpack(const uint8_t *src, const uint8_t *width, int n, uint8_t *codes) {
    uint32_t b = 0;
    for (int i = 0; i < n; i++) {
        int w = width[i];
        if (!w) {
            codes[i] = 0;
            continue;
        }
        uint32_t x = src[b >> 3];
        if ((b & 7) + w > 8) x |= (uint32_t)src[(b >> 3) + 1] << 8;
        codes[i] = (uint8_t)((x >> (b & 7)) & ((1u << w) - 1));
        b += (uint32_t)w;
    }
}

/* codes of z / s and the weighted error sum_i sigma_i^2 (z_i - s l_i)^2 over coded coordinates */
static double code_at(const qf_kv_rq_klt *c, const float *z, float s, uint8_t *codes) {
    double e = 0;
    float inv = 1.0f / s;
    for (int i = 0; i < c->head_dim; i++) {
        int w = c->width[i];
        if (!w) continue;
        const float *lv = c->levels + (size_t)i * QF_KV_RQ_MAX_LEVELS;
        codes[i] = (uint8_t)qf_kv_rq_nearest(lv, 1 << w, z[i] * inv);
        double d = z[i] - s * lv[codes[i]], g = c->sigma[i];
        e += g * g * d * d;
    }
    return e;
}

void qf_kv_rq_klt_matvec(const float *A, const float *x, int n, int D, double *y) {
    qf_vec_rows_dot_f64(A, (size_t)D, D, x, n, y);
}

bool qf_kv_rq_klt_transform(const qf_kv_rq_klt *c, const float *x, float *scratch, float *z, double *ss) {
    int D = c->head_dim;
    float *d = scratch;
    bool finite = true;
    for (int i = 0; i < D; i++) {
        d[i] = x[i] - c->mean[i];
        finite &= isfinite(d[i]) != 0;
    }
    if (!finite) return false;
    double a[QF_KV_RQ_MAX_HEAD_DIM], s2 = 0;
    qf_kv_rq_klt_matvec(c->enc, d, D, D, a);
    for (int i = 0; i < D; i++) {
        z[i] = (float)(a[i] / c->sigma[i]);
        s2 += (double)z[i] * z[i];
    }
    *ss = s2;
    return true;
}

void qf_kv_rq_klt_encode(const qf_kv_rq_klt *c, const float *x, float *scratch, uint8_t *row) {
    double ss = 0;
    const bool finite = qf_kv_rq_klt_transform(c, x, scratch, scratch + c->head_dim, &ss);
    qf_kv_rq_klt_encode_z(c, scratch + c->head_dim, ss, finite, row);
}

void qf_kv_rq_klt_encode_z(const qf_kv_rq_klt *c, const float *z, double ss, bool finite, uint8_t *row) {
    int D = c->head_dim;
    uint8_t codes[QF_KV_RQ_MAX_HEAD_DIM] = {0};
    float s = finite && isfinite(ss) ? (float)sqrt(ss / D) : 0.0f;
    uint8_t sc = 0;
    if (s > 0 && isfinite(s)) {
        for (int it = 0; it < 2; it++) { /* weighted least-squares refinements */
            code_at(c, z, s, codes);
            double num = 0, den = 0;
            for (int i = 0; i < D; i++) {
                if (!c->width[i]) continue;
                double l = c->levels[(size_t)i * QF_KV_RQ_MAX_LEVELS + codes[i]], g2 = (double)c->sigma[i] * c->sigma[i];
                num += g2 * z[i] * l, den += g2 * l * l;
            }
            if (!(den > 0) || !(num > 0)) break;
            s = (float)(num / den);
        }
        int c0 = qf_kv_rq_scale_floor(s);
        double best = INFINITY;
        uint8_t tmp[QF_KV_RQ_MAX_HEAD_DIM] = {0};
        for (int cand = c0; cand <= c0 + 1; cand++) {
            uint8_t cc = (uint8_t)(cand < 1 ? 1 : cand > 255 ? 255 : cand);
            double e = code_at(c, z, qf_kv_rq_scale(cc), tmp);
            if (e < best) best = e, sc = cc, memcpy(codes, tmp, (size_t)D);
        }
    }
    if (!sc) /* zero row: every coded coordinate at its level nearest 0 (scaled by 0 anyway) */
        for (int i = 0; i < D; i++)
            codes[i] = c->width[i] ? (uint8_t)qf_kv_rq_nearest(c->levels + (size_t)i * QF_KV_RQ_MAX_LEVELS, 1 << c->width[i], 0.0f) : 0;
    row[0] = sc;
    qf_kv_rq_klt_pack(codes, c->width, D, row + QF_KV_RQ_SCALE_BYTES);
}

void qf_kv_rq_klt_decode(const qf_kv_rq_klt *c, const uint8_t *row, float *out) {
    int D = c->head_dim;
    float s = qf_kv_rq_scale(row[0]), y[QF_KV_RQ_MAX_HEAD_DIM];
    uint8_t codes[QF_KV_RQ_MAX_HEAD_DIM];
    qf_kv_rq_klt_unpack(row + QF_KV_RQ_SCALE_BYTES, c->width, D, codes);
    for (int i = 0; i < D; i++)
        y[i] = c->width[i] ? s * c->sigma[i] * c->levels[(size_t)i * QF_KV_RQ_MAX_LEVELS + codes[i]] : 0.0f;
    float acc[QF_KV_RQ_MAX_HEAD_DIM]; /* a local sum: the column loop keeps no store to memory it might alias */
    for (int i = 0; i < D; i++) acc[i] = c->mean[i];
    /* acc += dec[:, j] y_j in j order, skipping dropped coordinates: decT's rows are dec's columns */
    if (c->decT) qf_vec_cols_axpy(c->decT, (size_t)D, D, y, D, acc);
    else
        for (int j = 0; j < D; j++) {
            const float yj = y[j];
            if (yj == 0) continue;
            for (int i = 0; i < D; i++) acc[i] += c->dec[(size_t)i * D + j] * yj;
        }
    memcpy(out, acc, (size_t)D * sizeof(float));
}

const char *qf_kv_rq_klt_check(const qf_kv_rq_klt *c, int total_bits) {
    int D = c->head_dim, sum = 0;
    for (int i = 0; i < D; i++) {
        int w = c->width[i];
        if (w > QF_KV_RQ_KLT_MAX_WIDTH) return "width";
        sum += w;
        const float *lv = c->levels + (size_t)i * QF_KV_RQ_MAX_LEVELS;
        for (int k = 0; w && k < (1 << w); k++)
            if (!isfinite(lv[k]) || (k > 0 && !(lv[k] > lv[k - 1]))) return "levels";
        if (!isfinite(c->sigma[i]) || !(c->sigma[i] > 0)) return "sigma";
    }
    if (sum != total_bits) return "bits";
    for (size_t i = 0; i < (size_t)D * D; i++)
        if (!isfinite(c->enc[i]) || !isfinite(c->dec[i])) return "matrix";
    return 0;
}
