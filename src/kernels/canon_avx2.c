/* canon_avx2.c: the AVX2/FMA versions of canon_cpu.h's kernels (compiled with -mavx2 -mfma).
 * Lanes run over independent outputs (keys, rows or head dimensions), never over the summed
 * index, and _mm256_fmadd_ps rounds once like fmaf: every output is the oracle's chain, bit for
 * bit. Several outputs are kept in flight (4 queries x 16 keys, 2 queries x 32 dims, 16 rows x 4
 * tokens) so that the FMA latency does not serialize one chain. */
#include <immintrin.h>

#include "kernels/canon.h"
#include "kernels/canon_cpu.h"

bool qf_canon_scores_avx2(const float *Q, int64_t ldq, int nq, const float *K, int T, int hd, float scale, float *S,
                          int64_t lds, float *scratch) {
    const __m256 vs = _mm256_set1_ps(scale);
    int t = 0;
    for (; t + 16 <= T; t += 16) {
        /* the 16 keys transposed: scratch[d * 16 + j] = K[t + j][d] */
        for (int j = 0; j < 16; j++) {
            const float *kr = K + (int64_t)(t + j) * hd;
            for (int d = 0; d < hd; d++) scratch[d * 16 + j] = kr[d];
        }
        int i = 0;
        for (; i + 4 <= nq; i += 4) {
            __m256 a[4][2];
            for (int r = 0; r < 4; r++) a[r][0] = a[r][1] = _mm256_setzero_ps();
            const float *q0 = Q + i * ldq;
            for (int d = 0; d < hd; d++) {
                const __m256 k0 = _mm256_loadu_ps(scratch + d * 16), k1 = _mm256_loadu_ps(scratch + d * 16 + 8);
                for (int r = 0; r < 4; r++) {
                    const __m256 qb = _mm256_set1_ps(q0[r * ldq + d]);
                    a[r][0] = _mm256_fmadd_ps(qb, k0, a[r][0]);
                    a[r][1] = _mm256_fmadd_ps(qb, k1, a[r][1]);
                }
            }
            for (int r = 0; r < 4; r++) {
                _mm256_storeu_ps(S + (i + r) * lds + t, _mm256_mul_ps(a[r][0], vs));
                _mm256_storeu_ps(S + (i + r) * lds + t + 8, _mm256_mul_ps(a[r][1], vs));
            }
        }
        for (; i < nq; i++) {
            __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
            const float *q = Q + i * ldq;
            for (int d = 0; d < hd; d++) {
                const __m256 qb = _mm256_set1_ps(q[d]);
                a0 = _mm256_fmadd_ps(qb, _mm256_loadu_ps(scratch + d * 16), a0);
                a1 = _mm256_fmadd_ps(qb, _mm256_loadu_ps(scratch + d * 16 + 8), a1);
            }
            _mm256_storeu_ps(S + i * lds + t, _mm256_mul_ps(a0, vs));
            _mm256_storeu_ps(S + i * lds + t + 8, _mm256_mul_ps(a1, vs));
        }
    }
    for (; t < T; t++) /* the last keys: one chain each (scalar fmaf is the same instruction) */
        for (int i = 0; i < nq; i++) S[i * lds + t] = CN_MUL(qf_canon_dot(Q + i * ldq, K + (int64_t)t * hd, hd, 1), scale);
    return true;
}

bool qf_canon_gemm_rows_avx2(const float *W, int64_t K, int64_t nrows, const float *x, int n, float *y, int64_t ldy,
                             float *scratch) {
    int64_t r = 0;
    for (; r + 16 <= nrows; r += 16) {
        /* the 16 rows transposed: scratch[k * 16 + j] = W[r + j][k] */
        for (int j = 0; j < 16; j++) {
            const float *wr = W + (r + j) * K;
            for (int64_t k = 0; k < K; k++) scratch[k * 16 + j] = wr[k];
        }
        for (int t = 0; t < n; t += 4) {
            const int nt = n - t < 4 ? n - t : 4;
            __m256 a[4][2];
            for (int u = 0; u < 4; u++) a[u][0] = a[u][1] = _mm256_setzero_ps();
            for (int64_t k = 0; k < K; k++) {
                const __m256 w0 = _mm256_loadu_ps(scratch + k * 16), w1 = _mm256_loadu_ps(scratch + k * 16 + 8);
                for (int u = 0; u < nt; u++) {
                    const __m256 xb = _mm256_set1_ps(x[(int64_t)(t + u) * K + k]);
                    a[u][0] = _mm256_fmadd_ps(w0, xb, a[u][0]);
                    a[u][1] = _mm256_fmadd_ps(w1, xb, a[u][1]);
                }
            }
            for (int u = 0; u < nt; u++) {
                _mm256_storeu_ps(y + (int64_t)(t + u) * ldy + r, a[u][0]);
                _mm256_storeu_ps(y + (int64_t)(t + u) * ldy + r + 8, a[u][1]);
            }
        }
    }
    for (; r < nrows; r++) /* the last rows: one chain each */
        for (int t = 0; t < n; t++) y[(int64_t)t * ldy + r] = qf_canon_dot(W + r * K, x + (int64_t)t * K, (int)K, 1);
    return true;
}

/* four queries over 16 head dimensions (8 chains in flight): each key's 16 floats loaded once
 * for every query that reads the same row, as canon_avx512.c's pv4_64 (a long V streams from L2
 * once per four queries); each query's chain over its own keys in order */
static void pv4_16(const float *P, int64_t ldp, int nb, int t0, const float *V, const float *EV, int n_sink,
                   int n_window, int hd, int d0, float *O, int64_t ldo) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0, e0 = a0, e1 = a0;
    const int tmax = t0 + nb - 1;
    for (int t = 0; t <= tmax; t++) {
        const float *cur = NULL;
        __m256 x0 = _mm256_setzero_ps(), x1 = x0;
#define PV4_16_QUERY(r, u0, u1)                                                                             \
    if ((r) < nb && t <= t0 + (r)) {                                                                        \
        const float *vr = (qf_canon_exact(t, t0 + (r), n_sink, n_window) ? EV : V) + (int64_t)t * hd + d0; \
        if (vr != cur) cur = vr, x0 = _mm256_loadu_ps(vr), x1 = _mm256_loadu_ps(vr + 8);                    \
        const __m256 p = _mm256_set1_ps(P[(r) * ldp + t]);                                                  \
        u0 = _mm256_fmadd_ps(p, x0, u0), u1 = _mm256_fmadd_ps(p, x1, u1);                                   \
    }
        PV4_16_QUERY(0, a0, a1)
        PV4_16_QUERY(1, b0, b1)
        PV4_16_QUERY(2, c0, c1)
        PV4_16_QUERY(3, e0, e1)
#undef PV4_16_QUERY
    }
    const __m256 acc[4][2] = {{a0, a1}, {b0, b1}, {c0, c1}, {e0, e1}};
    for (int r = 0; r < nb; r++)
        _mm256_storeu_ps(O + r * ldo + d0, acc[r][0]), _mm256_storeu_ps(O + r * ldo + d0 + 8, acc[r][1]);
}

/* two queries at a time (8 chains in flight), each choosing its own row per key; with head_dim
 * a multiple of 16, four queries at a time (pv4_16) */
bool qf_canon_pv_avx2(const float *P, int64_t ldp, int nq, int cnt0, const float *V, const float *EV, int n_sink,
                      int n_window, int hd, float *O, int64_t ldo) {
    if (hd % 8) return false;
    if (!EV) EV = V, n_sink = n_window = 0; /* no exact rows: every key reads V */
    if (hd % 16 == 0) {
        for (int i = 0; i < nq; i += 4)
            for (int d0 = 0; d0 < hd; d0 += 16)
                pv4_16(P + i * ldp, ldp, nq - i < 4 ? nq - i : 4, cnt0 - 1 + i, V, EV, n_sink, n_window, hd, d0,
                       O + i * ldo, ldo);
        return true;
    }
    for (int i = 0; i < nq; i += 2) {
        const bool two = i + 1 < nq;
        const int ta = cnt0 - 1 + i, tb = ta + 1; /* the queries' positions (b: when two) */
        const float *Pa = P + i * ldp, *Pb = two ? Pa + ldp : NULL;
        for (int d0 = 0; d0 < hd; d0 += 32) {
            const int w = hd - d0 >= 32 ? 4 : (hd - d0) / 8;
            __m256 a[4], b[4];
            for (int j = 0; j < w; j++) a[j] = b[j] = _mm256_setzero_ps();
            for (int t = 0; t <= ta; t++) {
                const float *va = (qf_canon_exact(t, ta, n_sink, n_window) ? EV : V) + (int64_t)t * hd + d0;
                const __m256 pa = _mm256_set1_ps(Pa[t]);
                for (int j = 0; j < w; j++) a[j] = _mm256_fmadd_ps(pa, _mm256_loadu_ps(va + 8 * j), a[j]);
                if (two) {
                    const float *vb = (qf_canon_exact(t, tb, n_sink, n_window) ? EV : V) + (int64_t)t * hd + d0;
                    const __m256 pb = _mm256_set1_ps(Pb[t]);
                    for (int j = 0; j < w; j++) b[j] = _mm256_fmadd_ps(pb, _mm256_loadu_ps(vb + 8 * j), b[j]);
                }
            }
            if (two) { /* b's last key */
                const float *vb = (qf_canon_exact(tb, tb, n_sink, n_window) ? EV : V) + (int64_t)tb * hd + d0;
                const __m256 pb = _mm256_set1_ps(Pb[tb]);
                for (int j = 0; j < w; j++) b[j] = _mm256_fmadd_ps(pb, _mm256_loadu_ps(vb + 8 * j), b[j]);
            }
            for (int j = 0; j < w; j++) {
                _mm256_storeu_ps(O + i * ldo + d0 + 8 * j, a[j]);
                if (two) _mm256_storeu_ps(O + (i + 1) * ldo + d0 + 8 * j, b[j]);
            }
        }
    }
    return true;
}
