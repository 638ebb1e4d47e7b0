/* canon_cpu.h: the CPU kernels of the canonical arithmetic (canon.h) that have no exact fast
 * version elsewhere: attention's scores and weighted sums, and the f32 GEMM chain for weights
 * without an integer kernel. Each has a scalar oracle (_ref, canon.h's loops) and an AVX2/FMA
 * version (canon_avx2.c; the attention kernels an AVX-512 one too, canon_avx512.c) that
 * vectorizes over independent outputs only, so each output is the
 * same chain of fmaf: the dispatching function returns the oracle's bits on every CPU
 * (tests/test_canon.c checks it). */
#ifndef QF_KERNELS_CANON_CPU_H
#define QF_KERNELS_CANON_CPU_H

#include <stdbool.h>
#include <stdint.h>

/* S[i * lds + t] = qf_canon_dot(Q + i * ldq, K + t * hd, hd) * scale for i < nq, t < T (K rows of
 * hd floats). scratch: QF_CANON_SCRATCH(hd) floats (unused by the oracle). */
#define QF_CANON_SCRATCH(k) (32 * (int64_t)(k) + 32)
void qf_canon_scores(const float *Q, int64_t ldq, int nq, const float *K, int T, int hd, float scale, float *S,
                     int64_t lds, float *scratch);
void qf_canon_scores_ref(const float *Q, int64_t ldq, int nq, const float *K, int T, int hd, float scale, float *S,
                         int64_t lds);

/* O[i * ldo + d] = fmaf chain over t < cnt0 + i of P[i * ldp + t] * R_t[d], from 0, for i < nq,
 * d < hd (query i of a causal block, at position tq = cnt0 - 1 + i, sees cnt0 + i keys). R_t is
 * row t of V, or of EV (kv-rq's exact sinks and window; NULL: none) when qf_canon_exact(t, tq,
 * n_sink, n_window), forward.c's per-(query, key) rule. */
void qf_canon_pv(const float *P, int64_t ldp, int nq, int cnt0, const float *V, const float *EV, int n_sink,
                 int n_window, int hd, float *O, int64_t ldo);
void qf_canon_pv_ref(const float *P, int64_t ldp, int nq, int cnt0, const float *V, const float *EV, int n_sink,
                     int n_window, int hd, float *O, int64_t ldo);

/* y[t * ldy + r] = qf_canon_dot(W + r * K, x + t * K, K) for r < nrows, t < n: f32 weight rows.
 * scratch: QF_CANON_SCRATCH(K) floats (unused by the oracle). */
void qf_canon_gemm_rows(const float *W, int64_t K, int64_t nrows, const float *x, int n, float *y, int64_t ldy,
                        float *scratch);
void qf_canon_gemm_rows_ref(const float *W, int64_t K, int64_t nrows, const float *x, int n, float *y, int64_t ldy);

/* internal: the AVX2/FMA versions (false when not built for AVX2) */
bool qf_canon_scores_avx2(const float *Q, int64_t ldq, int nq, const float *K, int T, int hd, float scale, float *S,
                          int64_t lds, float *scratch);
bool qf_canon_pv_avx2(const float *P, int64_t ldp, int nq, int cnt0, const float *V, const float *EV, int n_sink,
                      int n_window, int hd, float *O, int64_t ldo);
/* internal: the AVX-512 versions (canon_avx512.c) */
bool qf_canon_scores_avx512(const float *Q, int64_t ldq, int nq, const float *K, int T, int hd, float scale, float *S,
                            int64_t lds, float *scratch);
bool qf_canon_pv_avx512(const float *P, int64_t ldp, int nq, int cnt0, const float *V, const float *EV, int n_sink,
                        int n_window, int hd, float *O, int64_t ldo);
bool qf_canon_gemm_rows_avx2(const float *W, int64_t K, int64_t nrows, const float *x, int n, float *y, int64_t ldy,
                             float *scratch);

#endif
