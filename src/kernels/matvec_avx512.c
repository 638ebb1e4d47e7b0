/* matvec_avx512.c: the decode matvec kernels (matvec.h has the layouts and the math). Built with
 * -mavx512f -mavx512bw -mavx512vl -mavx512vnni (Makefile: *_avx512.c); the Q4_0 kernel also uses
 * AVX512_VBMI, enabled on that function alone (target attribute), and runs only where
 * qf_matvec_supported found it. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/matvec.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* Rows per step (MV_R) and the software prefetch distance along the row (bytes; 0: none).
 * Measured on the 1B shape's matrices (65536 x 2048 Q4_0, 32768 x 2048 F16, far larger than the
 * caches; one core of the Zen 5 development machine): several rows per step share the activation
 * loads and win when the weights are in cache (Q4_0 4 rows: 30 GB/s of weights against 26 for one
 * row) but lose from memory (4 rows: 8-10 GB/s, one row: 12.5), where the hardware prefetcher
 * follows one stream better than four; one row with a 1 KB prefetch: 15-16 GB/s (qf_vec_dot:
 * 11.5, compute-bound). F16: one row, 27 GB/s without prefetch in that test; in the whole decode
 * (1B f16, qforge decode with the distance switched token by token, so that both see the same
 * machine noise) a prefetch 3-12 KB ahead is 20-25% faster than none (e.g. 0 / 2048 / 4096 / 8192:
 * 104.3 / 88.0 / 81.3 / 83.0 ms a token; 3072 / 4096 / 6144 / 8192 / 12288: 70.9 / 69.9 / 69.6 /
 * 69.6 / 70.8 ms): far enough ahead to cover the 4 KB page boundaries the hardware prefetcher stops at. */
#ifndef MV_R
#define MV_R 1
#endif
#ifndef MV_PF_Q4
#define MV_PF_Q4 1024
#endif
#ifndef MV_PF_F16
#define MV_PF_F16 6144
#endif

/* Q4_0: the GGUF blocks are 18 bytes {f16 d, 16 bytes of nibbles}; a group of 4 blocks is 72
 * bytes, read as A = bytes [0, 64) and B = bytes [8, 72). QS_IDX gathers the 4 x 16 nibble bytes
 * (block j at 18j + 2; block 3 from B), D_IDX the f16 scale of block l/4 into word l. */
#define QS(j, k) ((j) < 3 ? 18 * (j) + 2 + (k) : 64 + 18 * (j) + 2 + (k) - 8)
#define QS4(j, k) QS(j, k), QS(j, k + 1), QS(j, k + 2), QS(j, k + 3)
#define QS16(j) QS4(j, 0), QS4(j, 4), QS4(j, 8), QS4(j, 12)
#define D2(j) 18 * (j), 18 * (j) + 1
#define D8(j) D2(j), D2(j), D2(j), D2(j)

static const uint8_t QS_IDX[64] __attribute__((aligned(64))) = {QS16(0), QS16(1), QS16(2), QS16(3)};
static const uint8_t D_IDX[64] __attribute__((aligned(64))) = {D8(0), D8(1), D8(2), D8(3)};

/* one group of 4 blocks of one row: acc += d_w * d_x * (integer dots) */
static inline __attribute__((always_inline, target("avx512vbmi"))) __m512 q4_group(const uint8_t *p, const uint8_t *ag,
                                                                                   __m512i iq, __m512i id, __m512 acc) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    if (MV_PF_Q4) _mm_prefetch((const char *)(p + MV_PF_Q4), _MM_HINT_T0);
    const __m512i A = _mm512_loadu_si512((const void *)p), B = _mm512_loadu_si512((const void *)(p + 8));
    const __m512i z = _mm512_permutex2var_epi8(A, iq, B);
    const __m512i lo = _mm512_and_si512(z, m4), hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
    const __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_load_si512((const void *)(ag + 128)), lo,
                                                              _mm512_load_si512((const void *)ag)),
                                          hi, _mm512_load_si512((const void *)(ag + 64)));
    const __m512 dw = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi8(id, A)));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_load_ps((const void *)(ag + 192))), acc);
}

/* one row: groups in pairs on two accumulators (the FMA chain is the loop's only dependency) */
static inline __attribute__((always_inline, target("avx512vbmi"))) float q4_row(const uint8_t *wr, const uint8_t *act,
                                                                                int64_t ng) {
    const __m512i iq = _mm512_load_si512((const void *)QS_IDX), id = _mm512_load_si512((const void *)D_IDX);
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t g = 0;
    for (; g + 2 <= ng; g += 2) {
        a0 = q4_group(wr + g * 72, act + g * 256, iq, id, a0);
        a1 = q4_group(wr + (g + 1) * 72, act + (g + 1) * 256, iq, id, a1);
    }
    if (g < ng) a0 = q4_group(wr + g * 72, act + g * 256, iq, id, a0);
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

static inline __attribute__((always_inline, target("avx512vbmi"))) void
q4_rows(const uint8_t *const *wr, const int R, const uint8_t *act, int64_t ng, float *y) {
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) y[r] = q4_row(wr[r], act, ng);
}

__attribute__((target("avx512vbmi"))) void qf_matvec_q4_0_avx512(const void *w, size_t row_bytes, int64_t K, int64_t r0,
                                                                int64_t r1, const void *act, float *y) {
    const int64_t ng = K / 128;
    const uint8_t *wb = w;
    int64_t r = r0;
    for (; r + MV_R <= r1; r += MV_R) {
        const uint8_t *wr[MV_R];
        for (int i = 0; i < MV_R; i++) wr[i] = wb + (size_t)(r + i) * row_bytes;
        q4_rows(wr, MV_R, act, ng, y + r);
    }
    for (; r < r1; r++) {
        const uint8_t *wr[1] = {wb + (size_t)r * row_bytes};
        q4_rows(wr, 1, act, ng, y + r);
    }
}

static inline __attribute__((always_inline)) void f16_rows(const uint16_t *const *wr, const int R, const float *x,
                                                           int64_t K, float *y) {
    __m512 acc[MV_R][2];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 32) {
        const __m512 x0 = _mm512_load_ps(x + k), x1 = _mm512_load_ps(x + k + 16);
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            if (MV_PF_F16) _mm_prefetch((const char *)(wr[r] + k) + MV_PF_F16, _MM_HINT_T0);
            acc[r][0] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(wr[r] + k))), x0,
                                        acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(
                _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(wr[r] + k + 16))), x1, acc[r][1]);
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) y[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]));
}

void qf_matvec_f16_avx512(const void *w, size_t row_bytes, int64_t K, int64_t r0, int64_t r1, const void *act, float *y) {
    const uint8_t *wb = w;
    int64_t r = r0;
    for (; r + MV_R <= r1; r += MV_R) {
        const uint16_t *wr[MV_R];
        for (int i = 0; i < MV_R; i++) wr[i] = (const uint16_t *)(const void *)(wb + (size_t)(r + i) * row_bytes);
        f16_rows(wr, MV_R, act, K, y + r);
    }
    for (; r < r1; r++) {
        const uint16_t *wr[1] = {(const uint16_t *)(const void *)(wb + (size_t)r * row_bytes)};
        f16_rows(wr, 1, act, K, y + r);
    }
}
