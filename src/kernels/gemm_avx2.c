/* gemm_avx2.c: the AVX2 (and AVX-VNNI) panel kernels of the integer prefill GEMM for Q8_0 / Q4_0 /
 * Q5_0 weights, for CPUs without AVX-512 VNNI (gemm.h has the math and the panel layout, gemm.c the
 * packing, the oracle and the dispatch). Built with -mavx2 -mfma -mf16c (Makefile: *_avx2.c); the
 * AVX-VNNI variant enables `avxvnni` on its function alone and runs only where cpuid reports it.
 *
 * One call computes the panel's 16 weight rows (two ymm of 8 int32 lanes, one lane per row) for
 * tokens [t0, t1), 2 tokens at a time. Per 32-element block and group of 4 quants, the integer
 * dot of 4 weight quants of 8 rows with one token's 4 activation quants is
 *   AVX2, unsigned weights (Q4_0 nibble q in [0,15], Q5_0 q in [0,31]): vpmaddubsw (u x s, pairs
 *     summed in int16: at most 2 * 31 * 127, no saturation) then vpmaddwd with ones;
 *   AVX2, Q8_0 (stored as u = w ^ 0x80): the signed w = u ^ 0x80 through the sign trick
 *     (|w| x sign(x, w), at most 2 * 128 * 127 < 32767; Q8 activations never hold -128), so the
 *     block's offset correction is not added (the same exact integer either way);
 *   AVX-VNNI: vpdpbusd, as the AVX-512 kernel.
 * Then per block one f32 FMA with d_w * d_x, in the oracle's order: bit-identical to it. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/gemm.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#define A2_NT 2 /* tokens per step: 2 x (2 int32 + 2 f32) accumulators + 2 weight registers */

static inline int32_t ld32(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* mode 0: AVX2, unsigned weights; 1: AVX2, Q8_0 (signed through the sign trick); 2: AVX-VNNI */
#define A2_KERNEL(NAME, ATTR, DOT)                                                                                   \
    static inline __attribute__((always_inline)) ATTR void NAME(const int q4, const int mode, const uint8_t *panel,  \
                                                                int64_t K, const uint8_t *act, size_t stride, int t,  \
                                                                const int NT, float *y, int64_t ldy, int nrows) {     \
        const int64_t nb = K / 32;                                                                                   \
        const size_t bb = q4 ? 4 * 64 : 8 * 64;                                                                      \
        const float *sc = (const float *)(const void *)(panel + (size_t)nb * bb);                                    \
        const uint8_t *xr[A2_NT];                                                                                    \
        const float *dx[A2_NT];                                                                                      \
        const int32_t *cr[A2_NT];                                                                                    \
        __m256 acc[A2_NT][2];                                                                                        \
        for (int i = 0; i < NT; i++) {                                                                               \
            xr[i] = act + (size_t)(t + i) * stride;                                                                  \
            const qf_gemm_act_row a = qf_gemm_act_view(xr[i], K);                                                    \
            dx[i] = a.d, cr[i] = a.corr;                                                                             \
            acc[i][0] = acc[i][1] = _mm256_setzero_ps();                                                             \
        }                                                                                                            \
        const __m256i lo4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1), x80 = _mm256_set1_epi8((char)0x80); \
        (void)ones, (void)x80;                                                                                       \
        for (int64_t b = 0; b < nb; b++) {                                                                           \
            const uint8_t *pb = panel + (size_t)b * bb;                                                              \
            __m256i ia[A2_NT][2];                                                                                    \
            for (int i = 0; i < NT; i++)                                                                             \
                ia[i][0] = ia[i][1] = mode == 1 ? _mm256_setzero_si256() : _mm256_set1_epi32(cr[i][b]);              \
            for (int g = 0; g < 8; g++) {                                                                            \
                __m256i wv[2];                                                                                       \
                for (int h = 0; h < 2; h++) {                                                                        \
                    if (q4) {                                                                                        \
                        __m256i raw = _mm256_loadu_si256((const __m256i *)(const void *)(pb + (g & 3) * 64 + h * 32)); \
                        wv[h] = _mm256_and_si256(g < 4 ? raw : _mm256_srli_epi16(raw, 4), lo4);                      \
                    } else {                                                                                         \
                        wv[h] = _mm256_loadu_si256((const __m256i *)(const void *)(pb + g * 64 + h * 32));           \
                        if (mode == 1) wv[h] = _mm256_xor_si256(wv[h], x80);                                         \
                    }                                                                                                \
                }                                                                                                    \
                for (int i = 0; i < NT; i++) {                                                                       \
                    const __m256i xb = _mm256_set1_epi32(ld32(xr[i] + b * 32 + (q4 ? (g & 3) * 4 + (g >> 2) * 16 : g * 4))); \
                    for (int h = 0; h < 2; h++) ia[i][h] = DOT(ia[i][h], wv[h], xb);                                 \
                }                                                                                                    \
            }                                                                                                        \
            for (int h = 0; h < 2; h++) {                                                                            \
                const __m256 s = _mm256_loadu_ps(sc + b * 16 + h * 8);                                               \
                for (int i = 0; i < NT; i++)                                                                         \
                    acc[i][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[i][h]), _mm256_mul_ps(s, _mm256_set1_ps(dx[i][b])), \
                                                acc[i][h]);                                                          \
            }                                                                                                        \
        }                                                                                                            \
        for (int i = 0; i < NT; i++) {                                                                               \
            float tmp[16];                                                                                           \
            _mm256_storeu_ps(tmp, acc[i][0]);                                                                        \
            _mm256_storeu_ps(tmp + 8, acc[i][1]);                                                                    \
            memcpy(y + (size_t)(t + i) * ldy, tmp, (size_t)nrows * sizeof(float));                                   \
        }                                                                                                            \
    }

/* the per-group integer dots (ia += 4-quant dots of 8 rows) */
static inline __attribute__((always_inline)) __m256i dot_u(__m256i ia, __m256i w, __m256i x) {
    return _mm256_add_epi32(ia, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
}
static inline __attribute__((always_inline)) __m256i dot_s(__m256i ia, __m256i w, __m256i x) {
    return _mm256_add_epi32(ia, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)),
                                                  _mm256_set1_epi16(1)));
}
static inline __attribute__((always_inline, target("avxvnni"))) __m256i dot_vnni(__m256i ia, __m256i w, __m256i x) {
    return _mm256_dpbusd_avx_epi32(ia, w, x);
}
#define DOT_AVX2(ia, w, x) (mode == 1 ? dot_s(ia, w, x) : dot_u(ia, w, x))

A2_KERNEL(kern_avx2, , DOT_AVX2)
A2_KERNEL(kern_vnni, __attribute__((target("avxvnni"))), dot_vnni)

void qf_gemm_panel_avx2(qf_type wt, const uint8_t *panel, int64_t K, const uint8_t *act, int t0, int t1, float *y,
                        int64_t ldy, int nrows) {
    const size_t stride = qf_gemm_act_stride(K);
    const int q4 = wt == QF_TYPE_Q4_0, mode = wt == QF_TYPE_Q8_0 ? 1 : 0;
    for (int t = t0; t < t1; t += A2_NT) {
        if (t1 - t >= 2) {
            if (q4) kern_avx2(1, 0, panel, K, act, stride, t, 2, y, ldy, nrows);
            else kern_avx2(0, mode, panel, K, act, stride, t, 2, y, ldy, nrows);
        } else {
            if (q4) kern_avx2(1, 0, panel, K, act, stride, t, 1, y, ldy, nrows);
            else kern_avx2(0, mode, panel, K, act, stride, t, 1, y, ldy, nrows);
        }
    }
}

__attribute__((target("avxvnni"))) void qf_gemm_panel_avxvnni(qf_type wt, const uint8_t *panel, int64_t K,
                                                               const uint8_t *act, int t0, int t1, float *y,
                                                               int64_t ldy, int nrows) {
    const size_t stride = qf_gemm_act_stride(K);
    const int q4 = wt == QF_TYPE_Q4_0;
    for (int t = t0; t < t1; t += A2_NT) {
        if (t1 - t >= 2) {
            if (q4) kern_vnni(1, 2, panel, K, act, stride, t, 2, y, ldy, nrows);
            else kern_vnni(0, 2, panel, K, act, stride, t, 2, y, ldy, nrows);
        } else {
            if (q4) kern_vnni(1, 2, panel, K, act, stride, t, 1, y, ldy, nrows);
            else kern_vnni(0, 2, panel, K, act, stride, t, 1, y, ldy, nrows);
        }
    }
}
