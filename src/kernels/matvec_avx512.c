/* matvec_avx512.c: the decode matvec kernels (matvec.h has the layouts and the math). Built with
 * -mavx512f -mavx512bw -mavx512vl -mavx512vnni (Makefile: *_avx512.c); the Q4_0 kernel also uses
 * AVX512_VBMI, enabled on that function alone (target attribute), and runs only where
 * qf_matvec_supported found it. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include <stddef.h>

#include "format/quant_blocks.h"
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

/* ---- Q4_K / Q5_K / Q6_K on Q8_K activations (matvec.h has the layouts) ---- */
#ifndef MV_PF_K
#define MV_PF_K 1024
#endif

/* Q4_K: the integer dots D0..D3 (sub-blocks 0|2, 1|3, 4|6, 5|7, 8 int32 lanes each) fit int16,
 * so they are packed in pairs (vpackssdw: per 128-bit lane c, 4 lanes of D0 then 4 of D1) and
 * multiplied by the scales with vpmaddwd. K4_S: per 128-bit lane, the byte indices of the scales
 * in that order (lane c < 2: sub-blocks 0 and 1, c >= 2: 2 and 3; +4 for D2, D3) */
#define SP4(a) a, a, a, a
static const uint8_t K4_S[2][32] __attribute__((aligned(32))) = {
    {SP4(0), SP4(1), SP4(0), SP4(1), SP4(2), SP4(3), SP4(2), SP4(3)},
    {SP4(4), SP4(5), SP4(4), SP4(5), SP4(6), SP4(7), SP4(6), SP4(7)}};
/* Q6_K: the 4 scales of 16-element groups g0..g0+3 over 16 lanes, 4 each */
static const uint8_t K6_S[4][16] __attribute__((aligned(16))) = {
    {SP4(0), SP4(1), SP4(2), SP4(3)}, {SP4(4), SP4(5), SP4(6), SP4(7)},
    {SP4(8), SP4(9), SP4(10), SP4(11)}, {SP4(12), SP4(13), SP4(14), SP4(15)}};

/* a 16-bit-lane shift count vector: a in the low 256 bits, b in the high */
static inline __attribute__((always_inline)) __m512i sh2(int a, int b) {
    return _mm512_inserti64x4(_mm512_set1_epi16((short)a), _mm256_set1_epi16((short)b), 1);
}

/* Q4_K, or Q5_K (q5: the fifth bit of sub-block s's element l is bit s of qh[l], added to the
 * nibble vectors from the 32 qh bytes, twice, shifted per half; the activation layout is Q4_K's) */
static inline __attribute__((always_inline)) float q4k_row(const uint8_t *wr, const uint8_t *act, int64_t nb,
                                                           const bool q5) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m1 = _mm512_set1_epi8(0x01);
    const __m256i i01 = _mm256_load_si256((const __m256i *)(const void *)K4_S[0]),
                  i23 = _mm256_load_si256((const __m256i *)(const void *)K4_S[1]);
    const __m512i c02 = sh2(0, 2), c13 = sh2(1, 3), c46 = sh2(4, 6), c57 = sh2(5, 7);
    const size_t bb = q5 ? sizeof(block_q5_K) : sizeof(block_q4_K),
                 qo = q5 ? offsetof(block_q5_K, qs) : offsetof(block_q4_K, qs);
    __m512 acc = _mm512_setzero_ps();
    float accm = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = wr + (size_t)b * bb, *ab = act + (size_t)b * MV_K4_BLOCK;
        if (MV_PF_K) _mm_prefetch((const char *)(blk + MV_PF_K), _MM_HINT_T0);
        uint32_t u[4];
        qf_k4_scale_min_words(blk + offsetof(block_q4_K, scales), u); /* the same offset in Q5_K */
        const uint64_t sc = (uint64_t)u[0] | ((uint64_t)u[1] << 32), mn = (uint64_t)u[2] | ((uint64_t)u[3] << 32);
        const __m256i s8 = _mm256_set1_epi64x((long long)sc);
        const __m512i S01 = _mm512_cvtepu8_epi16(_mm256_shuffle_epi8(s8, i01)),
                      S23 = _mm512_cvtepu8_epi16(_mm256_shuffle_epi8(s8, i23));
        const __m512i Q0 = _mm512_loadu_si512((const void *)(blk + qo)), Q1 = _mm512_loadu_si512((const void *)(blk + qo + 64));
        __m512i n0 = _mm512_and_si512(Q0, m4), n1 = _mm512_and_si512(_mm512_srli_epi16(Q0, 4), m4),
                n2 = _mm512_and_si512(Q1, m4), n3 = _mm512_and_si512(_mm512_srli_epi16(Q1, 4), m4);
        if (q5) { /* n0: sub-blocks 0 | 2, n1: 1 | 3, n2: 4 | 6, n3: 5 | 7 */
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(const void *)(blk + offsetof(block_q5_K, qh)));
            const __m512i QH = _mm512_inserti64x4(_mm512_castsi256_si512(qh), qh, 1);
#define HB(c) _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(QH, c), m1), 4)
            n0 = _mm512_or_si512(n0, HB(c02)), n1 = _mm512_or_si512(n1, HB(c13));
            n2 = _mm512_or_si512(n2, HB(c46)), n3 = _mm512_or_si512(n3, HB(c57));
#undef HB
        }
        const __m512i z = _mm512_setzero_si512();
        const __m512i D0 = _mm512_dpbusd_epi32(z, n0, _mm512_load_si512((const void *)ab));
        const __m512i D1 = _mm512_dpbusd_epi32(z, n1, _mm512_load_si512((const void *)(ab + 64)));
        const __m512i D2 = _mm512_dpbusd_epi32(z, n2, _mm512_load_si512((const void *)(ab + 128)));
        const __m512i D3 = _mm512_dpbusd_epi32(z, n3, _mm512_load_si512((const void *)(ab + 192)));
        const __m512i V = _mm512_add_epi32(_mm512_madd_epi16(_mm512_packs_epi32(D0, D1), S01),
                                           _mm512_madd_epi16(_mm512_packs_epi32(D2, D3), S23));
        float dx;
        memcpy(&dx, ab + MV_K4_DX, 4);
        uint16_t dh, dmh; /* d and dmin lead both block types */
        memcpy(&dh, blk + offsetof(block_q4_K, d), 2), memcpy(&dmh, blk + offsetof(block_q4_K, dmin), 2);
        const float d = _cvtsh_ss(dh), dmin = _cvtsh_ss(dmh);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(V), _mm512_set1_ps(d * dx), acc);
        /* the mins: sum_s m_s * (sum of sub-block s's activation quants), int16 pairs */
        const __m128i p = _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)mn)),
                                         _mm_load_si128((const __m128i *)(const void *)(ab + MV_K4_SUMS)));
        const __m128i p2 = _mm_add_epi32(p, _mm_shuffle_epi32(p, 0x4E));
        const int32_t im = _mm_cvtsi128_si32(_mm_add_epi32(p2, _mm_shuffle_epi32(p2, 0xB1)));
        accm += dmin * dx * (float)im;
    }
    return _mm512_reduce_add_ps(acc) - accm;
}

static inline __attribute__((always_inline)) float q6k_row(const uint8_t *wr, const uint8_t *act, int64_t nb) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m3 = _mm512_set1_epi8(0x03);
    /* per 16-bit lane shift counts for the qh bits: quarters 0 / 1 (low / high 256 bits), 2 / 3 */
    const __m512i sh01 = sh2(0, 2), sh23 = sh2(4, 6);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = wr + (size_t)b * sizeof(block_q6_K), *ab = act + (size_t)b * MV_K6_BLOCK;
        if (MV_PF_K) _mm_prefetch((const char *)(blk + MV_PF_K), _MM_HINT_T0);
        const __m128i sc16 = _mm_loadu_si128((const __m128i *)(const void *)(blk + offsetof(block_q6_K, scales)));
        __m512i V = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++) {
            const __m512i QL = _mm512_loadu_si512((const void *)(blk + offsetof(block_q6_K, ql) + 64 * h));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(const void *)(blk + offsetof(block_q6_K, qh) + 32 * h));
            const __m512i QH = _mm512_inserti64x4(_mm512_castsi256_si512(qh), qh, 1);
            const __m512i v0 = _mm512_or_si512(_mm512_and_si512(QL, m4),
                                               _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(QH, sh01), m3), 4));
            const __m512i v1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(QL, 4), m4),
                                               _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(QH, sh23), m3), 4));
            const uint8_t *ah = ab + 128 * h;
            const __m512i D0 = _mm512_dpbusd_epi32(_mm512_load_si512((const void *)(ab + MV_K6_CORR + 128 * h)), v0,
                                                   _mm512_load_si512((const void *)ah));
            const __m512i D1 = _mm512_dpbusd_epi32(_mm512_load_si512((const void *)(ab + MV_K6_CORR + 128 * h + 64)), v1,
                                                   _mm512_load_si512((const void *)(ah + 64)));
            const __m512i S0 = _mm512_cvtepi8_epi32(_mm_shuffle_epi8(sc16, _mm_load_si128((const __m128i *)(const void *)K6_S[2 * h]))),
                          S1 = _mm512_cvtepi8_epi32(_mm_shuffle_epi8(sc16, _mm_load_si128((const __m128i *)(const void *)K6_S[2 * h + 1])));
            V = _mm512_add_epi32(V, _mm512_add_epi32(_mm512_mullo_epi32(D0, S0), _mm512_mullo_epi32(D1, S1)));
        }
        float dx;
        memcpy(&dx, ab + MV_K6_DX, 4);
        uint16_t dh;
        memcpy(&dh, blk + offsetof(block_q6_K, d), 2);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(V), _mm512_set1_ps(_cvtsh_ss(dh) * dx), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

void qf_matvec_k_avx512(qf_type wt, const void *w, size_t row_bytes, int64_t K, int64_t r0, int64_t r1, const void *act,
                        float *y) {
    const int64_t nb = K / 256;
    const uint8_t *wb = w;
    if (wt == QF_TYPE_Q4_K)
        for (int64_t r = r0; r < r1; r++) y[r] = q4k_row(wb + (size_t)r * row_bytes, act, nb, false);
    else if (wt == QF_TYPE_Q5_K)
        for (int64_t r = r0; r < r1; r++) y[r] = q4k_row(wb + (size_t)r * row_bytes, act, nb, true);
    else
        for (int64_t r = r0; r < r1; r++) y[r] = q6k_row(wb + (size_t)r * row_bytes, act, nb);
}
