/* vecmath_avx512.c: the AVX-512 kernels of qf_gemm_nn_f32, qf_bits_lookup, qf_vec_rows_dot,
 * qf_vec_cols_axpy_dense and qf_rope_pairs
 * (vecmath.h has the contracts). Built with the *_avx512.c flags (Makefile) and run only where qf_gemm_nn_f32_fast
 * says so.
 *
 * qf_gemm_nn_f32: C's rows six at a time and its columns 64 at a time (4 vectors of 16 lanes; the last vector
 * masked), so up to 24 accumulators live in registers across the whole k loop: per k, one load
 * of each B vector shared by the six rows, one broadcast of each row's A element and one fused
 * multiply-add per accumulator, acc = A * B + acc, in k order from the bias: lane for lane the
 * oracle's fmaf chain. */
#include <immintrin.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/vecmath.h"
#include "qforge/quant.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* Element types of B rows: f32 (the GEMM's), or a KV cache's f16 / q8_0 / q4_0 rows, whose 16
 * elements from e (a multiple of 16; of 32 blocks for q8_0 / q4_0, so e never splits a half
 * block) are dequantized in registers as qf_dequantize_row_ref computes them: f16 converted
 * exactly, q8_0 q * d and q4_0 (q - 8) * d, each one f32 product. */
enum { T_F32, T_F16, T_Q8, T_Q4 };
static inline __attribute__((always_inline)) __m512 ld16(const uint8_t *row, int e, const int T, __mmask16 mk) {
    if (T == T_F32) return _mm512_maskz_loadu_ps(mk, (const float *)(const void *)row + e);
    if (T == T_F16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk, (const uint16_t *)(const void *)row + e));
    const uint8_t *blk = row + (size_t)(e / 32) * (T == T_Q8 ? 34 : 18);
    uint16_t dh;
    memcpy(&dh, blk, 2);
    const __m512 d = _mm512_set1_ps(_cvtsh_ss(dh));
    const __m128i q = _mm_loadu_si128((const __m128i *)(const void *)(blk + 2 + (T == T_Q8 ? e % 32 : 0)));
    __m512i v;
    if (T == T_Q8) v = _mm512_cvtepi8_epi32(q);
    else
        v = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_and_si128(e % 32 ? _mm_srli_epi16(q, 4) : q, _mm_set1_epi8(0x0F))),
                             _mm512_set1_epi32(8));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(v), d);
}

/* R rows (1..6) by NV vectors (1..4) of C from column j0 (B's rows ldb bytes apart, of type T);
 * the last vector masked by `last` (T_F32 / T_F16 only: the quantized widths are whole blocks).
 * ACC: each accumulator starts from C's own element (qf_gemm_nn_f32_acc), not from the bias. */
static inline __attribute__((always_inline)) void block(const int R, const int NV, const int T, const int ACC, int m,
                                                        const float *A, size_t lda, const uint8_t *B, size_t ldb,
                                                        int j0, const float *bias, float *C, size_t ldc,
                                                        __mmask16 last) {
    __m512 acc[6][4];
    _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) {
        __mmask16 mk = v == NV - 1 ? last : (__mmask16)0xFFFF;
        if (ACC) {
            _Pragma("GCC unroll 6") for (int r = 0; r < R; r++) acc[r][v] =
                _mm512_maskz_loadu_ps(mk, C + (size_t)r * ldc + 16 * v);
            continue;
        }
        __m512 b0 = bias ? _mm512_maskz_loadu_ps(mk, bias + 16 * v) : _mm512_setzero_ps();
        _Pragma("GCC unroll 6") for (int r = 0; r < R; r++) acc[r][v] = b0;
    }
    for (int k = 0; k < m; k++) {
        const uint8_t *bk = B + (size_t)k * ldb;
        __m512 b[4];
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)
            b[v] = ld16(bk, j0 + 16 * v, T, v == NV - 1 ? last : (__mmask16)0xFFFF);
        _Pragma("GCC unroll 6") for (int r = 0; r < R; r++) {
            const __m512 a = _mm512_set1_ps(A[(size_t)r * lda + k]);
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[r][v] = _mm512_fmadd_ps(a, b[v], acc[r][v]);
        }
    }
    _Pragma("GCC unroll 6") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)
            _mm512_mask_storeu_ps(C + (size_t)r * ldc + 16 * v, v == NV - 1 ? last : (__mmask16)0xFFFF, acc[r][v]);
}

/* the row and vector counts as constants, so that each case unrolls fully */
#define NVS(R)                                                                                                     \
    switch (nv) {                                                                                                  \
    case 1: block(R, 1, T, ACC, m, a, lda, B, ldb, j0, bs, c, ldc, last); break;                                   \
    case 2: block(R, 2, T, ACC, m, a, lda, B, ldb, j0, bs, c, ldc, last); break;                                   \
    case 3: block(R, 3, T, ACC, m, a, lda, B, ldb, j0, bs, c, ldc, last); break;                                   \
    default: block(R, 4, T, ACC, m, a, lda, B, ldb, j0, bs, c, ldc, last); break;                                  \
    }

static inline __attribute__((always_inline)) void gemm_nn(const int T, const int ACC, int n, int m, int w,
                                                          const float *A, size_t lda, const uint8_t *B, size_t ldb,
                                                          const float *bias, float *C, size_t ldc) {
    /* columns 64 at a time: that B panel (m x 64 floats, 36 KB at m = 144) stays in L1 while
     * every row block of C passes over it */
    for (int j0 = 0; j0 < w; j0 += 64) {
        const int wj = w - j0 < 64 ? w - j0 : 64, nv = (wj + 15) / 16;
        const __mmask16 last = wj % 16 ? (__mmask16)((1u << (wj % 16)) - 1) : (__mmask16)0xFFFF;
        const float *bs = bias ? bias + j0 : NULL;
        for (int p = 0; p < n;) {
            const int R = n - p < 6 ? n - p : 6;
            const float *a = A + (size_t)p * lda;
            float *c = C + (size_t)p * ldc + j0;
            switch (R) {
            case 1: NVS(1) break;
            case 2: NVS(2) break;
            case 3: NVS(3) break;
            case 4: NVS(4) break;
            case 5: NVS(5) break;
            default: NVS(6) break;
            }
            p += R;
        }
    }
}

void qf_gemm_nn_f32_avx512(int n, int m, int w, const float *A, size_t lda, const float *B, size_t ldb,
                           const float *bias, float *C, size_t ldc) {
    gemm_nn(T_F32, 0, n, m, w, A, lda, (const uint8_t *)B, ldb * sizeof(float), bias, C, ldc);
}

void qf_gemm_nn_f32_acc_avx512(int n, int m, int w, const float *A, size_t lda, const float *B, size_t ldb, float *C,
                               size_t ldc) {
    gemm_nn(T_F32, 1, n, m, w, A, lda, (const uint8_t *)B, ldb * sizeof(float), NULL, C, ldc);
}

void qf_gemm_nn_kv_avx512(qf_type t, int n, int m, int w, const float *A, size_t lda, const void *B, size_t ldb,
                          float *C, size_t ldc) {
    if (t == QF_TYPE_F16) gemm_nn(T_F16, 0, n, m, w, A, lda, B, ldb, NULL, C, ldc);
    else if (t == QF_TYPE_Q8_0) gemm_nn(T_Q8, 0, n, m, w, A, lda, B, ldb, NULL, C, ldc);
    else gemm_nn(T_Q4, 0, n, m, w, A, lda, B, ldb, NULL, C, ldc);
}

/* m rows against x: per row 16 lane sums (lane l: the i = l mod 16, fused, in order), then lanes
 * k and k + 8, k + 4, k + 2, k + 1 added in turn; four rows a step for the FMA chains */
static inline __attribute__((always_inline)) float red16(__m512 v) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1)); /* (above: k, k + 8) k, k + 4 */
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));                                       /* k, k + 2 */
    b = _mm_add_ss(b, _mm_shuffle_ps(b, b, 1));                                   /* k, k + 1 */
    return _mm_cvtss_f32(b);
}
static inline __attribute__((always_inline)) void rows_dot(const int T, const uint8_t *A, size_t lda, int n,
                                                           const float *x, int m, float *y) {
    const __mmask16 all = 0xFFFF;
    int o = 0;
    for (; o + 4 <= m; o += 4) {
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        const uint8_t *r0 = A + (size_t)o * lda, *r1 = r0 + lda, *r2 = r1 + lda, *r3 = r2 + lda;
        for (int i = 0; i < n; i += 16) {
            const __m512 xv = _mm512_loadu_ps(x + i);
            a0 = _mm512_fmadd_ps(ld16(r0, i, T, all), xv, a0);
            a1 = _mm512_fmadd_ps(ld16(r1, i, T, all), xv, a1);
            a2 = _mm512_fmadd_ps(ld16(r2, i, T, all), xv, a2);
            a3 = _mm512_fmadd_ps(ld16(r3, i, T, all), xv, a3);
        }
        y[o] = red16(a0), y[o + 1] = red16(a1), y[o + 2] = red16(a2), y[o + 3] = red16(a3);
    }
    for (; o < m; o++) {
        __m512 a0 = _mm512_setzero_ps();
        const uint8_t *r0 = A + (size_t)o * lda;
        for (int i = 0; i < n; i += 16) a0 = _mm512_fmadd_ps(ld16(r0, i, T, all), _mm512_loadu_ps(x + i), a0);
        y[o] = red16(a0);
    }
}
void qf_vec_rows_dot_kv_avx512(qf_type t, const void *A, size_t lda, int n, const float *x, int m, float *y) {
    if (t == QF_TYPE_F16) rows_dot(T_F16, A, lda, n, x, m, y);
    else if (t == QF_TYPE_Q8_0) rows_dot(T_Q8, A, lda, n, x, m, y);
    else rows_dot(T_Q4, A, lda, n, x, m, y);
}

/* A group of 16 codes whose table entries lie within LK_CHUNKS * 32 floats reads them by permutes:
 * its span of the table copied once a call (lk_plan), then per row one two-source permute per
 * 32 entries and a tree of blends by the index's bits 5, 6, 7, 8 (chunk c's lanes win where the
 * index is in [32 c, 32 c + 32)); lanes of width 0 (mask 0) read the one entry tab[to[k]]: a
 * constant. A wider group reads its entries by two 8-lane gathers. Zen 5, one core (bench_kvrq_fast
 * codes, docs/kv-rq.md "Session 32"): a 16-lane gather ~6.4 ns, two 8-lane ones ~4.9, a permute
 * with its blend ~0.4 ns, so up to 16 chunks (512 entries) the permutes win. */
enum { LK_GROUPS = 16, LK_CHUNKS = 16 };
typedef struct {
    int nch[LK_GROUPS];                  /* 32-entry chunks of the group's span; 0: the gathers */
    __mmask16 cst[LK_GROUPS];            /* lanes of width 0 */
    _Alignas(64) int32_t rel[LK_GROUPS][16]; /* to[k] - the span's start (0 in constant lanes) */
    _Alignas(64) float cval[LK_GROUPS][16];  /* tab[to[k]] in constant lanes */
    _Alignas(64) float span[LK_GROUPS][LK_CHUNKS * 32]; /* the span's entries (0 past its end) */
} lk_plan;

/* the plan of the groups of m codes (groups past LK_GROUPS, or spanning more than LK_CHUNKS * 32
 * entries, read by the gathers: nch 0) */
static void lk_plan_make(lk_plan *P, int m, const int32_t *mk, const int32_t *to, const float *tab) {
    for (int g = 0; g < LK_GROUPS; g++) {
        P->nch[g] = 0;
        if (16 * g >= m) continue;
        const int k0 = 16 * g, nk = m - k0 < 16 ? m - k0 : 16;
        int32_t lo = INT32_MAX, hi = -1;
        __mmask16 cst = 0;
        for (int i = 0; i < nk; i++) {
            if (!mk[k0 + i]) {
                cst |= (__mmask16)(1u << i);
                continue;
            }
            lo = to[k0 + i] < lo ? to[k0 + i] : lo;
            hi = to[k0 + i] + mk[k0 + i] > hi ? to[k0 + i] + mk[k0 + i] : hi;
        }
        if (hi < 0) lo = hi = 0; /* every lane constant */
        const int nch = (hi - lo) / 32 + 1;
        if (nch > LK_CHUNKS) continue;
        P->nch[g] = nch, P->cst[g] = cst;
        for (int i = 0; i < 16; i++) {
            const bool c = i >= nk || (cst >> i & 1);
            P->rel[g][i] = c ? 0 : to[k0 + i] - lo;
            P->cval[g][i] = i < nk && c ? tab[to[k0 + i]] : 0.0f;
        }
        memcpy(P->span[g], tab + lo, (size_t)(hi - lo + 1) * sizeof(float));
        memset(P->span[g] + (hi - lo + 1), 0, (size_t)(nch * 32 - (hi - lo + 1)) * sizeof(float));
    }
}

/* the 16 codes of one group in each of n rows: their 4-byte windows by a byte permute of the
 * row's first 128 code bytes (PERM) or a gather, shifted and masked, then their table values by
 * NCH chunks' permutes (1..LK_CHUNKS) or, NCH 0, two 8-lane gathers; times the row's scale */
static inline __attribute__((always_inline, target("avx512vbmi"))) void
lk_group(const int NCH, const bool PERM, const uint8_t *code0, size_t stride, int n, const float *sc, __mmask16 lane,
         const int32_t *by, const int32_t *sh, const int32_t *mk, const int32_t *to, const float *tab,
         const lk_plan *P, int g, unsigned long long mlo, unsigned long long mhi, float *y, size_t ldy) {
    /* each lane's low byte to its four bytes, plus 0, 1, 2, 3: the window's byte indices (those
     * past 127 wrap, but bytes 2 and 3 only feed bits the mask drops: sh + width <= 16) */
    const __m512i rep = _mm512_set_epi8(60, 60, 60, 60, 56, 56, 56, 56, 52, 52, 52, 52, 48, 48, 48, 48, 44, 44, 44, 44,
                                        40, 40, 40, 40, 36, 36, 36, 36, 32, 32, 32, 32, 28, 28, 28, 28, 24, 24, 24,
                                        24, 20, 20, 20, 20, 16, 16, 16, 16, 12, 12, 12, 12, 8, 8, 8, 8, 4, 4, 4, 4, 0,
                                        0, 0, 0);
    const __m512i b = _mm512_maskz_loadu_epi32(lane, by);
    const __m512i widx = _mm512_add_epi8(_mm512_permutexvar_epi8(rep, b), _mm512_set1_epi32(0x03020100));
    const __m512i shv = _mm512_maskz_loadu_epi32(lane, sh), mkv = _mm512_maskz_loadu_epi32(lane, mk);
    const __m512i off = NCH ? _mm512_load_si512(P->rel[g]) : _mm512_maskz_loadu_epi32(lane, to);
    __m512 spv[2 * LK_CHUNKS];
    _Pragma("GCC unroll 16") for (int ch = 0; ch < NCH; ch++) {
        spv[2 * ch] = _mm512_load_ps(P->span[g] + 32 * ch);
        spv[2 * ch + 1] = _mm512_load_ps(P->span[g] + 32 * ch + 16);
    }
    const __m512 cval = NCH ? _mm512_load_ps(P->cval[g]) : _mm512_setzero_ps();
    const __mmask16 cst = NCH ? P->cst[g] : 0;
    for (int r = 0; r < n; r++) {
        const uint8_t *code = code0 + (size_t)r * stride;
        __m512i w;
        if (PERM) {
            const __m512i lo = _mm512_maskz_loadu_epi8(mlo, code);
            const __m512i hi = mhi ? _mm512_maskz_loadu_epi8(mhi, code + 64) : _mm512_setzero_si512();
            w = _mm512_permutex2var_epi8(lo, widx, hi);
        } else {
            w = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), lane, b, code, 1);
        }
        const __m512i i = _mm512_add_epi32(_mm512_and_si512(_mm512_srlv_epi32(w, shv), mkv), off);
        __m512 v;
        if (NCH) {
            __m512 t[LK_CHUNKS];
            _Pragma("GCC unroll 16") for (int ch = 0; ch < NCH; ch++) t[ch] =
                _mm512_permutex2var_ps(spv[2 * ch], i, spv[2 * ch + 1]);
            _Pragma("GCC unroll 4") for (int bit = 1; bit < NCH; bit *= 2) {
                const __mmask16 up = _mm512_test_epi32_mask(i, _mm512_set1_epi32(32 * bit));
                _Pragma("GCC unroll 16") for (int ch = 0; ch + bit < NCH; ch += 2 * bit) t[ch] =
                    _mm512_mask_blend_ps(up, t[ch], t[ch + bit]);
            }
            v = _mm512_mask_mov_ps(t[0], cst, cval);
        } else {
            const __m256 z = _mm256_setzero_ps();
            const __m256 v0 = _mm256_mmask_i32gather_ps(z, (__mmask8)lane, _mm512_castsi512_si256(i), tab, 4);
            const __m256 v1 = _mm256_mmask_i32gather_ps(z, (__mmask8)(lane >> 8), _mm512_extracti64x4_epi64(i, 1), tab, 4);
            v = _mm512_castpd_ps(
                _mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(v0)), _mm256_castps_pd(v1), 1));
        }
        _mm512_mask_storeu_ps(y + (size_t)r * ldy, lane, _mm512_mul_ps(v, _mm512_set1_ps(sc[r])));
    }
}

#define LK_NCH(NCH)                                                                                                \
    lk_group((NCH) <= LK_CHUNKS ? (NCH) : 0, perm, code0, stride, nr, sc, lane, by + k, sh + k, mk + k, to + k, tab, \
             &P, g, mlo, mhi, yk, ldy)

/* A group at a time over every row (its code windows' byte indices, shifts, masks and table
 * chunks loaded once), 64 rows a pass so that the rows' bytes stay in L1. Where the row's code
 * bytes fit 128 (by[m-1] + 2 <= 128: every row up to 5 bits of head_dim 128 or 2.5 of 256), they
 * are loaded masked (nothing past them) and each code's 4-byte window is picked by one byte
 * permute (VBMI); otherwise by a gather. by is nondecreasing (bit offsets). */
__attribute__((target("avx512vbmi"))) void qf_bits_lookup_avx512(const uint8_t *rows, size_t stride, int n, int off,
                                                                const float *sctab, int m, const int32_t *by,
                                                                const int32_t *sh, const int32_t *mk,
                                                                const int32_t *to, const float *tab, float *y,
                                                                size_t ldy) {
    if (m <= 0) return;
    const int nb = by[m - 1] + 2; /* the oracle reads bytes [0, nb) of a row's codes */
    const bool perm = nb <= 128;
    const unsigned long long all = ~0ull, mlo = nb >= 64 ? all : (1ull << nb) - 1,
                             mhi = nb <= 64 ? 0 : nb >= 128 ? all : (1ull << (nb - 64)) - 1;
    lk_plan P;
    const bool plan = n >= 4; /* a few rows do not pay for the plan */
    if (plan) lk_plan_make(&P, m, mk, to, tab);
    enum { PASS = 64 };
    float sc[PASS];
    for (int r0 = 0; r0 < n; r0 += PASS) {
        const int nr = n - r0 < PASS ? n - r0 : PASS;
        for (int r = 0; r < nr; r++) sc[r] = sctab[rows[(size_t)(r0 + r) * stride]];
        const uint8_t *code0 = rows + (size_t)r0 * stride + off;
        for (int k = 0; k < m; k += 16) {
            const __mmask16 lane = m - k >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (m - k)) - 1);
            const int g = k / 16, nch = plan && g < LK_GROUPS ? P.nch[g] : 0;
            float *yk = y + (size_t)r0 * ldy + k;
            switch (nch) {
            case 0: LK_NCH(0); break;
            case 1: LK_NCH(1); break;
            case 2: LK_NCH(2); break;
            case 3: LK_NCH(3); break;
            case 4: LK_NCH(4); break;
            case 5: LK_NCH(5); break;
            case 6: LK_NCH(6); break;
            case 7: LK_NCH(7); break;
            case 8: LK_NCH(8); break;
            case 9: LK_NCH(9); break;
            case 10: LK_NCH(10); break;
            case 11: LK_NCH(11); break;
            case 12: LK_NCH(12); break;
            case 13: LK_NCH(13); break;
            case 14: LK_NCH(14); break;
            case 15: LK_NCH(15); break;
            default: LK_NCH(16); break;
            }
        }
    }
}

/* qf_vec_rows_dot (vecmath.h): 16 outputs in the 16 lanes, two such blocks side by side for the
 * add chains' latency; 16 x 16 blocks of A transposed in registers (four rounds of shuffles), so
 * lane r of column i holds A[o + r][i]; acc = acc + column * x[i] (a multiply then an add, no FMA)
 * in i order, the last n % 16 elements of each row after them, in order, as the oracle does; the
 * last m % 16 outputs by the AVX2 kernel (the same bits). */
static inline __attribute__((always_inline)) void tr16(const float *a, size_t lda, int i, __m512 c[16]) {
    __m512 t[16], u[16];
    _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) {
        const __m512 r0 = _mm512_loadu_ps(a + (size_t)(2 * k) * lda + i);
        const __m512 r1 = _mm512_loadu_ps(a + (size_t)(2 * k + 1) * lda + i);
        t[2 * k] = _mm512_unpacklo_ps(r0, r1), t[2 * k + 1] = _mm512_unpackhi_ps(r0, r1);
    }
    _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
        const __m512d a0 = _mm512_castps_pd(t[4 * k]), a1 = _mm512_castps_pd(t[4 * k + 1]),
                      a2 = _mm512_castps_pd(t[4 * k + 2]), a3 = _mm512_castps_pd(t[4 * k + 3]);
        u[4 * k] = _mm512_castpd_ps(_mm512_unpacklo_pd(a0, a2));
        u[4 * k + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a0, a2));
        u[4 * k + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(a1, a3));
        u[4 * k + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(a1, a3));
    }
    /* u[4 k + e], 128-bit lane l: rows 4k..4k+3 of element 4 l + e */
    _Pragma("GCC unroll 4") for (int e = 0; e < 4; e++) {
        const __m512 w0 = _mm512_shuffle_f32x4(u[e], u[4 + e], 0x88), w1 = _mm512_shuffle_f32x4(u[e], u[4 + e], 0xDD);
        const __m512 w2 = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], 0x88);
        const __m512 w3 = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], 0xDD);
        c[e] = _mm512_shuffle_f32x4(w0, w2, 0x88), c[8 + e] = _mm512_shuffle_f32x4(w0, w2, 0xDD);
        c[4 + e] = _mm512_shuffle_f32x4(w1, w3, 0x88), c[12 + e] = _mm512_shuffle_f32x4(w1, w3, 0xDD);
    }
}
/* NB blocks of 16 rows from a: their outputs into y */
static inline __attribute__((always_inline)) void rows_dot16(const int NB, const float *a, size_t lda, int n,
                                                             const float *x, float *y) {
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        _Pragma("GCC unroll 2") for (int b = 0; b < NB; b++) {
            __m512 c[16];
            tr16(a + (size_t)(16 * b) * lda, lda, i, c);
            _Pragma("GCC unroll 16") for (int e = 0; e < 16; e++) acc[b] =
                _mm512_add_ps(acc[b], _mm512_mul_ps(c[e], _mm512_set1_ps(x[i + e])));
        }
    }
    _Pragma("GCC unroll 2") for (int b = 0; b < NB; b++) {
        float t[16];
        _mm512_storeu_ps(t, acc[b]);
        for (int k = i; k < n; k++)
            for (int r = 0; r < 16; r++) t[r] += a[(size_t)(16 * b + r) * lda + k] * x[k];
        memcpy(y + 16 * b, t, sizeof t);
    }
}
void qf_vec_rows_dot_avx512(const float *A, size_t lda, int n, const float *x, int m, float *y) {
    int o = 0;
    for (; o + 32 <= m; o += 32) rows_dot16(2, A + (size_t)o * lda, lda, n, x, y + o);
    for (; o + 16 <= m; o += 16) rows_dot16(1, A + (size_t)o * lda, lda, n, x, y + o);
    if (o < m) qf_vec_rows_dot_avx2(A + (size_t)o * lda, lda, n, x, m - o, y + o);
}

/* qf_vec_cols_axpy_dense (vecmath.h): 128 elements of acc in eight registers across every j
 * (vectors past n masked off), acc = acc + B row * y[j] (a multiply then an add) */
void qf_vec_cols_axpy_dense_avx512(const float *B, size_t ldb, int m, const float *y, int n, float *acc) {
    for (int i0 = 0; i0 < n; i0 += 128) {
        const int wi = n - i0 < 128 ? n - i0 : 128;
        __mmask16 mk[8];
        for (int v = 0; v < 8; v++) {
            const int left = wi - 16 * v;
            mk[v] = left >= 16 ? (__mmask16)0xFFFF : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
        }
        __m512 a[8];
        _Pragma("GCC unroll 8") for (int v = 0; v < 8; v++) a[v] = _mm512_maskz_loadu_ps(mk[v], acc + i0 + 16 * v);
        for (int j = 0; j < m; j++) {
            const float *b = B + (size_t)j * ldb + i0;
            const __m512 yj = _mm512_set1_ps(y[j]);
            _Pragma("GCC unroll 8") for (int v = 0; v < 8; v++) a[v] =
                _mm512_add_ps(a[v], _mm512_mul_ps(_mm512_maskz_loadu_ps(mk[v], b + 16 * v), yj));
        }
        _Pragma("GCC unroll 8") for (int v = 0; v < 8; v++) _mm512_mask_storeu_ps(acc + i0 + 16 * v, mk[v], a[v]);
    }
}

/* 8 pairs a step: cs, sn spread to both lanes of their pair (sn negated in the even lanes, an
 * exact sign flip), the partner of each lane by an in-lane swap; x * cs + partner * sn is then
 * x0 cs - x1 sn in the even lanes and x1 cs + x0 sn in the odd ones, the oracle's roundings */
void qf_rope_pairs_avx512(float *x, const float *cs, const float *sn, int half) {
    const __m512i dup = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    const __m512 sign = _mm512_set_ps(1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1);
    for (int i = 0; i < half; i += 8) {
        const int np = half - i < 8 ? half - i : 8;
        const __mmask8 m8 = (__mmask8)((1u << np) - 1);
        const __mmask16 m16 = (__mmask16)((1u << (2 * np)) - 1);
        const __m512 c = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_maskz_loadu_ps(m8, cs + i)));
        const __m512 s =
            _mm512_mul_ps(_mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_maskz_loadu_ps(m8, sn + i))), sign);
        const __m512 v = _mm512_maskz_loadu_ps(m16, x + 2 * i);
        const __m512 r = _mm512_add_ps(_mm512_mul_ps(v, c), _mm512_mul_ps(_mm512_permute_ps(v, 0xB1), s));
        _mm512_mask_storeu_ps(x + 2 * i, m16, r);
    }
}
