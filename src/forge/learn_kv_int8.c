/* learn_kv_int8.c: the kv-int8 learner (static int8 scales from captured KV vectors, per
 * channel or per head slot, absmax or a percentile) and the int8 row quantizer that the
 * engine's int8 KV mode runs on every token. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "qforge/kvlearn.h"
#include "util/util.h"

/* k-th smallest of v[0..n) (0-based), partially reordering v. Hoare-style quickselect
 * with a middle pivot: deterministic, O(n) on average. */
static float select_kth(float *v, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        float piv = v[lo + (hi - lo) / 2];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (v[i] < piv) i++;
            while (v[j] > piv) j--;
            if (i <= j) {
                float t = v[i];
                v[i] = v[j];
                v[j] = t;
                i++;
                j--;
            }
        }
        if (k <= j) hi = j;
        else if (k >= i) lo = i;
        else return v[k];
    }
    return v[k];
}

/* Clip value of |values|: absmax at 100, else the nearest-rank percentile. */
static float clip_of(float *absv, int64_t m, double percentile) {
    if (percentile >= 100.0) {
        float mx = 0;
        for (int64_t i = 0; i < m; i++) mx = fmaxf(mx, absv[i]);
        return mx;
    }
    int64_t k = (int64_t)ceil(percentile / 100.0 * (double)m) - 1;
    if (k < 0) k = 0;
    if (k >= m) k = m - 1;
    return select_kth(absv, m, k);
}

qf_status qf_kv_int8_fit(const float *x, int64_t n, int n_kv_head, int head_dim,
                         qf_kv_scale_mode mode, double percentile, float *scale, qf_error *err) {
    if (n_kv_head < 1 || head_dim < 1 || n <= 0 || n % n_kv_head != 0)
        return qf_fail(err, QF_ERR_ARG,
                       "kv int8 fit: %lld vectors, %d kv heads, head_dim %d: expected a positive "
                       "multiple of n_kv_head vectors",
                       (long long)n, n_kv_head, head_dim);
    if (!(percentile > 0 && percentile <= 100))
        return qf_fail(err, QF_ERR_ARG, "kv int8 fit: percentile %g: expected (0, 100]",
                       percentile);
    if (mode != QF_KV_SCALE_PER_CHANNEL && mode != QF_KV_SCALE_PER_HEAD)
        return qf_fail(err, QF_ERR_ARG, "kv int8 fit: mode %d: expected per-channel or per-head",
                       (int)mode);
    int64_t rows = n / n_kv_head;
    int64_t per = mode == QF_KV_SCALE_PER_HEAD ? rows * head_dim : rows;
    float *absv = malloc(sizeof(float) * (size_t)per);
    if (!absv) return qf_fail(err, QF_ERR_NOMEM, "kv int8 fit: %lld values: out of memory",
                              (long long)per);
    for (int h = 0; h < n_kv_head; h++) {
        int n_groups = mode == QF_KV_SCALE_PER_HEAD ? 1 : head_dim;
        for (int c = 0; c < n_groups; c++) {
            int64_t m = 0;
            bool bad = false;
            for (int64_t r = 0; r < rows; r++) {
                const float *v = x + (size_t)(r * n_kv_head + h) * head_dim;
                if (mode == QF_KV_SCALE_PER_HEAD) {
                    for (int t = 0; t < head_dim; t++) {
                        bad |= !isfinite(v[t]);
                        absv[m++] = fabsf(v[t]);
                    }
                } else {
                    bad |= !isfinite(v[c]);
                    absv[m++] = fabsf(v[c]);
                }
            }
            if (bad) {
                free(absv);
                return qf_fail(err, QF_ERR_ARG,
                               "kv int8 fit: kv head %d: expected finite values (NaN/inf found)",
                               h);
            }
            float clip = clip_of(absv, m, percentile);
            /* A channel that was always zero still gets a usable scale: a later nonzero
             * value saturates instead of dividing by zero. */
            float sc = clip > 0 ? clip / 127.0f : 1.0f / 127.0f;
            if (mode == QF_KV_SCALE_PER_HEAD)
                for (int t = 0; t < head_dim; t++) scale[h * head_dim + t] = sc;
            else
                scale[h * head_dim + c] = sc;
        }
    }
    free(absv);
    return QF_OK;
}

/* qf_kv_int8_inv_scale / _quantize / _dequantize (the row quantizer the engine calls per
 * token) live in src/engine/kv_codes.c. */
