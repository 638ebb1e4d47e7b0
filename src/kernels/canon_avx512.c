/* canon_avx512.c: the AVX-512 versions of canon_cpu.h's attention kernels (compiled with the
 * AVX-512 flags, dispatched when qf_gemm_isa_get() is QF_GEMM_ISA_AVX512). As in canon_avx2.c,
 * lanes run over independent outputs (keys, head dimensions), never over the summed index, and
 * _mm512_fmadd_ps rounds once like fmaf: every output is the oracle's chain, bit for bit, twice
 * as many a register as the AVX2 kernels. */
#include <immintrin.h>

#include "kernels/canon.h"
#include "kernels/canon_cpu.h"

/* 4 queries x 32 keys a block (8 chains of 16 lanes in flight). The last T % 32 keys run as one
 * more block whose missing keys are zeros in the scratch and whose stores are masked to the real
 * keys: a lane's chain depends only on its own key, so the real ones are the oracle's. */
bool qf_canon_scores_avx512(const float *Q, int64_t ldq, int nq, const float *K, int T, int hd, float scale, float *S,
                            int64_t lds, float *scratch) {
    const __m512 vs = _mm512_set1_ps(scale);
    for (int t = 0; t < T; t += 32) {
        const int nk = T - t < 32 ? T - t : 32;
        const __mmask16 m0 = (__mmask16)(nk >= 16 ? 0xFFFF : (1u << nk) - 1),
                        m1 = (__mmask16)(nk >= 32 ? 0xFFFF : nk > 16 ? (1u << (nk - 16)) - 1 : 0);
        /* the keys transposed: scratch[d * 32 + j] = K[t + j][d], zeros past the last key */
        for (int j = 0; j < 32; j++) {
            const float *kr = K + (int64_t)(t + j) * hd;
            if (j < nk)
                for (int d = 0; d < hd; d++) scratch[d * 32 + j] = kr[d];
            else
                for (int d = 0; d < hd; d++) scratch[d * 32 + j] = 0.0f;
        }
        int i = 0;
        for (; i + 4 <= nq; i += 4) {
            __m512 a[4][2];
            for (int r = 0; r < 4; r++) a[r][0] = a[r][1] = _mm512_setzero_ps();
            const float *q0 = Q + i * ldq;
            for (int d = 0; d < hd; d++) {
                const __m512 k0 = _mm512_loadu_ps(scratch + d * 32), k1 = _mm512_loadu_ps(scratch + d * 32 + 16);
                for (int r = 0; r < 4; r++) {
                    const __m512 qb = _mm512_set1_ps(q0[r * ldq + d]);
                    a[r][0] = _mm512_fmadd_ps(qb, k0, a[r][0]);
                    a[r][1] = _mm512_fmadd_ps(qb, k1, a[r][1]);
                }
            }
            for (int r = 0; r < 4; r++) {
                _mm512_mask_storeu_ps(S + (i + r) * lds + t, m0, _mm512_mul_ps(a[r][0], vs));
                _mm512_mask_storeu_ps(S + (i + r) * lds + t + 16, m1, _mm512_mul_ps(a[r][1], vs));
            }
        }
        for (; i < nq; i++) {
            __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
            const float *q = Q + i * ldq;
            for (int d = 0; d < hd; d++) {
                const __m512 qb = _mm512_set1_ps(q[d]);
                a0 = _mm512_fmadd_ps(qb, _mm512_loadu_ps(scratch + d * 32), a0);
                a1 = _mm512_fmadd_ps(qb, _mm512_loadu_ps(scratch + d * 32 + 16), a1);
            }
            _mm512_mask_storeu_ps(S + i * lds + t, m0, _mm512_mul_ps(a0, vs));
            _mm512_mask_storeu_ps(S + i * lds + t + 16, m1, _mm512_mul_ps(a1, vs));
        }
    }
    return true;
}

/* four queries at a time over 64 head dimensions (16 chains in flight): each key's 64 floats
 * are loaded once and used by every query that reads the same row (the queries are consecutive
 * positions, so they differ only on their last keys and where the sink / window rule picks
 * another row), so a long V streams from L2 once per four queries instead of once per query.
 * Each query's chain runs over its own keys in order, as the oracle's. */
static void pv4_64(const float *P, int64_t ldp, int nb, int t0, const float *V, const float *EV, int n_sink,
                   int n_window, int hd, int d0, float *O, int64_t ldo) {
    __m512 a[4][4];
    for (int r = 0; r < 4; r++)
        for (int j = 0; j < 4; j++) a[r][j] = _mm512_setzero_ps();
    const int tmax = t0 + nb - 1;
    for (int t = 0; t <= tmax; t++) {
        const float *cur = NULL;
        __m512 x0 = _mm512_setzero_ps(), x1 = x0, x2 = x0, x3 = x0;
#define PV4_QUERY(r)                                                                                        \
    if ((r) < nb && t <= t0 + (r)) {                                                                        \
        const float *vr = (qf_canon_exact(t, t0 + (r), n_sink, n_window) ? EV : V) + (int64_t)t * hd + d0; \
        if (vr != cur) {                                                                                    \
            cur = vr;                                                                                       \
            x0 = _mm512_loadu_ps(vr), x1 = _mm512_loadu_ps(vr + 16);                                        \
            x2 = _mm512_loadu_ps(vr + 32), x3 = _mm512_loadu_ps(vr + 48);                                   \
        }                                                                                                   \
        const __m512 p = _mm512_set1_ps(P[(r) * ldp + t]);                                                  \
        a[r][0] = _mm512_fmadd_ps(p, x0, a[r][0]), a[r][1] = _mm512_fmadd_ps(p, x1, a[r][1]);               \
        a[r][2] = _mm512_fmadd_ps(p, x2, a[r][2]), a[r][3] = _mm512_fmadd_ps(p, x3, a[r][3]);               \
    }
        PV4_QUERY(0)
        PV4_QUERY(1)
        PV4_QUERY(2)
        PV4_QUERY(3)
#undef PV4_QUERY
    }
    for (int r = 0; r < nb; r++)
        for (int j = 0; j < 4; j++) _mm512_storeu_ps(O + r * ldo + d0 + 16 * j, a[r][j]);
}

/* four queries at a time (pv4_64); head_dim a multiple of 64 (64, 128, 256), else false and the
 * AVX2 kernel runs (its four-query pass takes 16 dimensions at a time) */
bool qf_canon_pv_avx512(const float *P, int64_t ldp, int nq, int cnt0, const float *V, const float *EV, int n_sink,
                        int n_window, int hd, float *O, int64_t ldo) {
    if (hd % 64) return false;
    if (!EV) EV = V, n_sink = n_window = 0; /* no exact rows: every key reads V */
    for (int i = 0; i < nq; i += 4)
        for (int d0 = 0; d0 < hd; d0 += 64)
            pv4_64(P + i * ldp, ldp, nq - i < 4 ? nq - i : 4, cnt0 - 1 + i, V, EV, n_sink, n_window, hd, d0, O + i * ldo,
                   ldo);
    return true;
}
