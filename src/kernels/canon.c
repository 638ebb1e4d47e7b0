/* canon.c: the canonical CPU kernels' scalar oracles and their dispatch (canon_cpu.h). */
#include "kernels/canon.h"

#include "kernels/canon_cpu.h"
#include "kernels/gemm.h"
#include "qforge/quant.h"

void qf_canon_scores_ref(const float *Q, int64_t ldq, int nq, const float *K, int T, int hd, float scale, float *S,
                         int64_t lds) {
    for (int i = 0; i < nq; i++)
        for (int t = 0; t < T; t++) S[i * lds + t] = CN_MUL(qf_canon_dot(Q + i * ldq, K + (int64_t)t * hd, hd, 1), scale);
}

void qf_canon_scores(const float *Q, int64_t ldq, int nq, const float *K, int T, int hd, float scale, float *S,
                     int64_t lds, float *scratch) {
    if (qf_quant_has_avx2() && qf_gemm_isa_get() == QF_GEMM_ISA_AVX512 &&
        qf_canon_scores_avx512(Q, ldq, nq, K, T, hd, scale, S, lds, scratch))
        return;
    if (qf_quant_has_avx2() && qf_canon_scores_avx2(Q, ldq, nq, K, T, hd, scale, S, lds, scratch)) return;
    qf_canon_scores_ref(Q, ldq, nq, K, T, hd, scale, S, lds);
}

void qf_canon_gemm_rows_ref(const float *W, int64_t K, int64_t nrows, const float *x, int n, float *y, int64_t ldy) {
    for (int64_t r = 0; r < nrows; r++)
        for (int t = 0; t < n; t++) y[t * ldy + r] = qf_canon_dot(W + r * K, x + (int64_t)t * K, (int)K, 1);
}

void qf_canon_gemm_rows(const float *W, int64_t K, int64_t nrows, const float *x, int n, float *y, int64_t ldy,
                        float *scratch) {
    if (qf_quant_has_avx2() && qf_canon_gemm_rows_avx2(W, K, nrows, x, n, y, ldy, scratch)) return;
    qf_canon_gemm_rows_ref(W, K, nrows, x, n, y, ldy);
}

void qf_canon_pv_ref(const float *P, int64_t ldp, int nq, int cnt0, const float *V, const float *EV, int n_sink,
                     int n_window, int hd, float *O, int64_t ldo) {
    for (int i = 0; i < nq; i++) {
        const int tq = cnt0 - 1 + i;
        for (int d = 0; d < hd; d++) {
            float acc = 0.0f;
            for (int t = 0; t <= tq; t++) {
                const float *row = EV && qf_canon_exact(t, tq, n_sink, n_window) ? EV : V;
                acc = CN_FMA(P[i * ldp + t], row[(int64_t)t * hd + d], acc);
            }
            O[i * ldo + d] = acc;
        }
    }
}

void qf_canon_pv(const float *P, int64_t ldp, int nq, int cnt0, const float *V, const float *EV, int n_sink,
                 int n_window, int hd, float *O, int64_t ldo) {
    if (qf_quant_has_avx2() && qf_gemm_isa_get() == QF_GEMM_ISA_AVX512 &&
        qf_canon_pv_avx512(P, ldp, nq, cnt0, V, EV, n_sink, n_window, hd, O, ldo))
        return;
    if (qf_quant_has_avx2() && qf_canon_pv_avx2(P, ldp, nq, cnt0, V, EV, n_sink, n_window, hd, O, ldo)) return;
    qf_canon_pv_ref(P, ldp, nq, cnt0, V, EV, n_sink, n_window, hd, O, ldo);
}
