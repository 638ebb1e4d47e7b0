/* kv_rq.c: the kv-rq row codec (kv_rq.h): bit packing, nearest level, row encode/decode and
 * the Lloyd-Max codebook fit. */
#include "engine/kv_rq.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/hadamard.h"
#include "util/util.h"

void qf_kv_rq_pack(const uint8_t *codes, int n, int bits, uint8_t *dst) {
    memset(dst, 0, (size_t)n * bits / 8);
    uint32_t mask = (1u << bits) - 1;
    for (int i = 0; i < n; i++) {
        uint32_t b = (uint32_t)i * bits, v = codes[i] & mask;
        dst[b >> 3] |= (uint8_t)(v << (b & 7));
        if ((b & 7) + bits > 8) dst[(b >> 3) + 1] |= (uint8_t)(v >> (8 - (b & 7)));
    }
}

void qf_kv_rq_unpack(const uint8_t *src, int n, int bits, uint8_t *codes) {
    uint32_t mask = (1u << bits) - 1;
    for (int i = 0; i < n; i++) {
        uint32_t b = (uint32_t)i * bits, w = src[b >> 3];
        if ((b & 7) + bits > 8) w |= (uint32_t)src[(b >> 3) + 1] << 8;
        codes[i] = (uint8_t)((w >> (b & 7)) & mask);
    }
}

int qf_kv_rq_nearest_ref(const float *levels, int n, float v) {
    /* the first level whose upper decision boundary (midpoint to the next) is >= v */
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (v <= 0.5f * (levels[mid] + levels[mid + 1])) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

int qf_kv_rq_nearest(const float *levels, int n, float v) {
    /* the same index without a branch a step (the encoders' hot loop, where a random v
     * mispredicts half the binary search's branches): the answer stays in [base, base + len),
     * each step asks whether it lies past the boundary below level base + half; an odd len
     * keeps a range that still holds the answer. The same midpoints and the same test, so the
     * same index for every v (NaN: the last level, as the reference) */
    int base = 0;
    for (int len = n; len > 1;) {
        const int half = len >> 1;
        base += !(v <= 0.5f * (levels[base + half - 1] + levels[base + half])) ? half : 0;
        len -= half;
    }
    return base;
}

void qf_kv_rq_encode(const qf_kv_rq_codec *c, const float *x, float *scratch, uint8_t *row) {
    int hd = c->head_dim, L = 1 << (c->bits < 8 ? c->bits : 0);
    if (c->bits == QF_KV_RQ_BITS_F16) {
        uint16_t *h = (uint16_t *)row;
        for (int i = 0; i < hd; i++) h[i] = qf_f32_to_f16(x[i]);
        return;
    }
    if (c->klt.enc) {
        qf_kv_rq_klt_encode(&c->klt, x, scratch, row);
        return;
    }
    float *y = scratch;
    uint8_t codes[QF_KV_RQ_MAX_HEAD_DIM];
    bool finite = true;
    for (int i = 0; i < hd; i++) {
        y[i] = (x[i] - c->mean[i]) * c->inv_cs[i];
        finite &= isfinite(y[i]) != 0;
    }
    double ss = 0;
    if (finite) {
        qf_hadamard(y, hd);
        for (int i = 0; i < hd; i++) ss += (double)y[i] * y[i];
    }
    float s = finite ? (float)sqrt(ss / hd) : 0.0f;
    if (!(s > 0) || !isfinite(s)) {
        int z = qf_kv_rq_nearest(c->levels, L, 0.0f);
        memset(codes, z, (size_t)hd);
        s = 0;
    } else {
        for (int it = 0; it < 3; it++) {
            float inv = 1.0f / s;
            double num = 0, den = 0;
            for (int i = 0; i < hd; i++) {
                codes[i] = (uint8_t)qf_kv_rq_nearest(c->levels, L, y[i] * inv);
                float l = c->levels[codes[i]];
                num += (double)y[i] * l, den += (double)l * l;
            }
            if (it == 2 || !(den > 0) || !(num > 0)) break; /* the last pass only re-codes */
            s = (float)(num / den);
        }
    }
    /* the scale code: of the two codes around s, the one whose re-coded row errs least */
    uint8_t sc = 0;
    if (s > 0) {
        int c0 = qf_kv_rq_scale_floor(s);
        double best = INFINITY;
        uint8_t tmp[QF_KV_RQ_MAX_HEAD_DIM];
        for (int cand = c0; cand <= c0 + 1; cand++) {
            uint8_t cc = (uint8_t)(cand < 1 ? 1 : cand > 255 ? 255 : cand);
            float sv = qf_kv_rq_scale(cc), inv = 1.0f / sv;
            double e = 0;
            for (int i = 0; i < hd; i++) {
                tmp[i] = (uint8_t)qf_kv_rq_nearest(c->levels, L, y[i] * inv);
                double d = y[i] - sv * c->levels[tmp[i]];
                e += d * d;
            }
            if (e < best) best = e, sc = cc, memcpy(codes, tmp, (size_t)hd);
        }
    }
    row[0] = sc;
    qf_kv_rq_pack(codes, hd, c->bits, row + QF_KV_RQ_SCALE_BYTES);
}

void qf_kv_rq_decode(const qf_kv_rq_codec *c, const uint8_t *row, float *out) {
    int hd = c->head_dim;
    if (c->bits == QF_KV_RQ_BITS_F16) {
        const uint16_t *h = (const uint16_t *)row;
        for (int i = 0; i < hd; i++) out[i] = qf_f16_to_f32(h[i]);
        return;
    }
    if (c->klt.enc) {
        qf_kv_rq_klt_decode(&c->klt, row, out);
        return;
    }
    float s = qf_kv_rq_scale(row[0]);
    uint8_t codes[QF_KV_RQ_MAX_HEAD_DIM];
    qf_kv_rq_unpack(row + QF_KV_RQ_SCALE_BYTES, hd, c->bits, codes);
    for (int i = 0; i < hd; i++) out[i] = s * c->levels[codes[i]];
    qf_hadamard(out, hd);
    for (int i = 0; i < hd; i++) out[i] = c->mean[i] + c->cs[i] * out[i];
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* first index in sorted v[0..n) whose value is > t */
static int64_t upper(const float *v, int64_t n, float t) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t m = lo + (hi - lo) / 2;
        if (v[m] <= t) lo = m + 1;
        else hi = m;
    }
    return lo;
}

qf_status qf_kv_rq_lloyd(float *v, int64_t n, int n_levels, int iters, float *levels, qf_error *err) {
    if (n_levels < 2 || n_levels > QF_KV_RQ_MAX_LEVELS || n < n_levels || iters < 0)
        return qf_fail(err, QF_ERR_ARG, "kv-rq Lloyd-Max: %lld values for %d levels: expected 2..%d levels and at "
                                        "least as many values",
                       (long long)n, n_levels, QF_KV_RQ_MAX_LEVELS);
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(v[i])) return qf_fail(err, QF_ERR_ARG, "kv-rq Lloyd-Max: value %lld is not finite", (long long)i);
    double *pre = malloc(sizeof(double) * (size_t)(n + 1));
    if (!pre) return qf_fail(err, QF_ERR_NOMEM, "kv-rq Lloyd-Max: out of memory for %lld values", (long long)n);
    bool sorted = true;
    for (int64_t i = 1; i < n && sorted; i++) sorted = v[i - 1] <= v[i];
    if (!sorted && !qf_sort_floats(v, (size_t)n)) qsort(v, (size_t)n, sizeof(float), cmp_float); /* same order */
    pre[0] = 0;
    for (int64_t i = 0; i < n; i++) pre[i + 1] = pre[i] + v[i];
    for (int k = 0; k < n_levels; k++) levels[k] = v[(int64_t)(((double)k + 0.5) / n_levels * (double)n)];
    for (int it = 0; it < iters; it++) {
        int64_t a = 0;
        bool moved = false;
        for (int k = 0; k < n_levels; k++) {
            int64_t b = k == n_levels - 1 ? n : upper(v, n, 0.5f * (levels[k] + levels[k + 1]));
            if (b > a) {
                float nl = (float)((pre[b] - pre[a]) / (double)(b - a));
                moved |= nl != levels[k];
                levels[k] = nl;
            }
            a = b;
        }
        /* keep strictly ascending (an empty cell keeps its level; ties are nudged apart) */
        for (int k = 1; k < n_levels; k++)
            if (!(levels[k] > levels[k - 1])) levels[k] = nextafterf(levels[k - 1], INFINITY);
        if (!moved) break;
    }
    free(pre);
    return QF_OK;
}
