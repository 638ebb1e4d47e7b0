/* gemm_avx512.c: the AVX-512 VNNI panel kernel of the integer prefill GEMM (gemm.h has the
 * math, gemm.c the packing, the oracle and the dispatch). Built with -mavx512f -mavx512bw
 * -mavx512vl -mavx512vnni (Makefile: *_avx512.c); called only when the CPU has them.
 *
 * One call computes QF_GEMM_NR = 16 weight rows (one zmm of int32 lanes, one lane per row) for
 * tokens [t0, t1), 8 tokens at a time: per 32-element block, the 8 groups of 4 weight quants of
 * the 16 rows are loaded once (Q4_0: 4 loads split into low and high nibbles) and each token's
 * 4 quants are broadcast from memory into vpdpbusd. 8 int32 and 8 f32 accumulators + 8 weight
 * registers + the scales: 25 of the 32 zmm registers. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/gemm.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

static inline int32_t ld32(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* the 16 rows x 32 quants of a Q4_0 panel block: 4 x 64 bytes, the low nibbles (elements 0-15
 * of each row) to wv[0..4), the high nibbles (16-31) to wv[4..8) */
static inline __attribute__((always_inline)) void q4_nibbles(const uint8_t *pb, __m512i *wv) {
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
    _Pragma("GCC unroll 4")
    for (int g = 0; g < 4; g++) {
        const __m512i raw = _mm512_loadu_si512((const void *)(pb + g * 64));
        wv[g] = _mm512_and_si512(raw, lo4);
        wv[g + 4] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), lo4);
    }
}

/* the NT activation rows from token t (qf_gemm_act_view: int8 quants, then the f32 block
 * scales, then the int32 block corrections) and NT zeroed accumulators */
static inline __attribute__((always_inline)) void act_rows(const uint8_t *act, size_t stride, int t, const int NT,
                                                           int64_t K, const uint8_t **xr, const float **dx,
                                                           const int32_t **cr, __m512 *acc) {
    _Pragma("GCC unroll 8")
    for (int i = 0; i < NT; i++) {
        xr[i] = act + (size_t)(t + i) * stride;
        const qf_gemm_act_row a = qf_gemm_act_view(xr[i], K);
        dx[i] = a.d, cr[i] = a.corr;
        acc[i] = _mm512_setzero_ps();
    }
}

static inline __attribute__((always_inline)) void kern(const int q8, const uint8_t *panel, int64_t K,
                                                       const uint8_t *act, size_t stride, int t, const int NT,
                                                       float *y, int64_t ldy, __mmask16 m) {
    const int64_t nb = K / 32;
    const size_t bb = q8 ? 8 * 64 : 4 * 64;
    const float *sc = (const float *)(const void *)(panel + (size_t)nb * bb);
    const uint8_t *xr[8];
    const float *dx[8];
    const int32_t *cr[8];
    __m512 acc[8];
    act_rows(act, stride, t, NT, K, xr, dx, cr, acc);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *pb = panel + (size_t)b * bb;
        __m512i wv[8];
        if (q8) {
            _Pragma("GCC unroll 8")
            for (int g = 0; g < 8; g++) wv[g] = _mm512_loadu_si512((const void *)(pb + g * 64));
        } else {
            q4_nibbles(pb, wv);
        }
        __m512i ia[8];
        _Pragma("GCC unroll 8")
        for (int i = 0; i < NT; i++) ia[i] = _mm512_set1_epi32(cr[i][b]);
        _Pragma("GCC unroll 8")
        for (int g = 0; g < 8; g++)
            _Pragma("GCC unroll 8")
            for (int i = 0; i < NT; i++)
                ia[i] = _mm512_dpbusd_epi32(ia[i], wv[g], _mm512_set1_epi32(ld32(xr[i] + b * 32 + g * 4)));
        const __m512 s = _mm512_loadu_ps(sc + b * 16);
        _Pragma("GCC unroll 8")
        for (int i = 0; i < NT; i++)
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[i]), _mm512_mul_ps(s, _mm512_set1_ps(dx[i][b])), acc[i]);
    }
    _Pragma("GCC unroll 8")
    for (int i = 0; i < NT; i++) _mm512_mask_storeu_ps(y + (size_t)(t + i) * ldy, m, acc[i]);
}

#define KERN_CASES(Q8)                                                                   \
    switch (nt) {                                                                        \
    case 8: kern(Q8, panel, K, act, stride, t, 8, y, ldy, m); break;                     \
    case 7: kern(Q8, panel, K, act, stride, t, 7, y, ldy, m); break;                     \
    case 6: kern(Q8, panel, K, act, stride, t, 6, y, ldy, m); break;                     \
    case 5: kern(Q8, panel, K, act, stride, t, 5, y, ldy, m); break;                     \
    case 4: kern(Q8, panel, K, act, stride, t, 4, y, ldy, m); break;                     \
    case 3: kern(Q8, panel, K, act, stride, t, 3, y, ldy, m); break;                     \
    case 2: kern(Q8, panel, K, act, stride, t, 2, y, ldy, m); break;                     \
    default: kern(Q8, panel, K, act, stride, t, 1, y, ldy, m); break;                    \
    }

void qf_gemm_panel_avx512(qf_type wt, const uint8_t *panel, int64_t K, const uint8_t *act, int t0, int t1,
                          float *y, int64_t ldy, int nrows) {
    const size_t stride = qf_gemm_act_stride(K);
    const __mmask16 m = (__mmask16)((1u << nrows) - 1);
    for (int t = t0; t < t1; t += 8) {
        int nt = t1 - t < 8 ? t1 - t : 8;
        if (wt == QF_TYPE_Q4_0) {
            KERN_CASES(0)
        } else { /* Q8_0 and Q5_0: 8 groups of unsigned bytes */
            KERN_CASES(1)
        }
    }
}

/* ---- Q4_0 repacked panels (gemm.h: Q4X16) ----
 * The Q4_0 path of kern above, reading a panel of the CPU's repacked copy: per pair of blocks one
 * 64-byte line of 32 f16 scales, then 2 x 4 lines of quants; no packing step, one stream. For
 * NT <= 4 (decode: 1-3 tokens) the low and the high nibbles go to two int32 chains (4 vpdpbusd
 * deep instead of 8) added at the end of the block: an exact integer sum, so the result is the
 * same bit for bit. */
/* software prefetch distance (bytes) along the panel for decode (NT <= 4); 0: none. Measured on the
 * 1B q4_0 decode (qforge generate, -t 2, interleaved runs): 0 / 512 / 1024 / 2048 / 4096 / 8192 gave
 * medians 47.6 / 43.4 / 48.0 / 48.5 / 48.9 / 48.0 t/s, within the machine's noise of each other except
 * 512; kept at 4096 (the L2 streamer does most of the work either way). */
#ifndef Q4X16_PF
#define Q4X16_PF 4096
#endif
static inline __attribute__((always_inline)) void kern_q4x16(const uint8_t *panel, int64_t K, const uint8_t *act,
                                                             size_t stride, int t, const int NT, float *y, int64_t ldy,
                                                             __mmask16 m) {
    const int64_t nb = K / 32;
    const uint8_t *xr[8];
    const float *dx[8];
    const int32_t *cr[8];
    __m512 acc[8];
    act_rows(act, stride, t, NT, K, xr, dx, cr, acc);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *pair = panel + (size_t)(b >> 1) * 576, *pb = pair + 64 + (b & 1) * 256;
        if (Q4X16_PF && NT <= 4) {
            if (!(b & 1)) _mm_prefetch((const char *)(pair + Q4X16_PF), _MM_HINT_T0);
            _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++) _mm_prefetch((const char *)(pb + g * 64 + Q4X16_PF), _MM_HINT_T0);
        }
        __m512i wv[8];
        q4_nibbles(pb, wv);
        __m512i ia[8];
        _Pragma("GCC unroll 8")
        for (int i = 0; i < NT; i++) ia[i] = _mm512_set1_epi32(cr[i][b]);
        if (NT <= 4) {
            __m512i ib[4];
            _Pragma("GCC unroll 4")
            for (int i = 0; i < NT; i++) ib[i] = _mm512_setzero_si512();
            _Pragma("GCC unroll 4")
            for (int g = 0; g < 4; g++)
                _Pragma("GCC unroll 4")
                for (int i = 0; i < NT; i++) {
                    ia[i] = _mm512_dpbusd_epi32(ia[i], wv[g], _mm512_set1_epi32(ld32(xr[i] + b * 32 + g * 4)));
                    ib[i] = _mm512_dpbusd_epi32(ib[i], wv[g + 4], _mm512_set1_epi32(ld32(xr[i] + b * 32 + 16 + g * 4)));
                }
            _Pragma("GCC unroll 4")
            for (int i = 0; i < NT; i++) ia[i] = _mm512_add_epi32(ia[i], ib[i]);
        } else {
            _Pragma("GCC unroll 8")
            for (int g = 0; g < 8; g++)
                _Pragma("GCC unroll 8")
                for (int i = 0; i < NT; i++)
                    ia[i] = _mm512_dpbusd_epi32(ia[i], wv[g], _mm512_set1_epi32(ld32(xr[i] + b * 32 + g * 4)));
        }
        const __m512 s = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(const void *)(pair + (b & 1) * 32)));
        _Pragma("GCC unroll 8")
        for (int i = 0; i < NT; i++)
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[i]), _mm512_mul_ps(s, _mm512_set1_ps(dx[i][b])), acc[i]);
    }
    _Pragma("GCC unroll 8")
    for (int i = 0; i < NT; i++) _mm512_mask_storeu_ps(y + (size_t)(t + i) * ldy, m, acc[i]);
}

void qf_gemm_q4x16_panel_avx512(const uint8_t *panel, int64_t K, const uint8_t *act, int t0, int t1, float *y,
                                int64_t ldy, int nrows) {
    const size_t stride = qf_gemm_act_stride(K);
    const __mmask16 m = (__mmask16)((1u << nrows) - 1);
    for (int t = t0; t < t1; t += 8) {
        switch (t1 - t < 8 ? t1 - t : 8) {
        case 8: kern_q4x16(panel, K, act, stride, t, 8, y, ldy, m); break;
        case 7: kern_q4x16(panel, K, act, stride, t, 7, y, ldy, m); break;
        case 6: kern_q4x16(panel, K, act, stride, t, 6, y, ldy, m); break;
        case 5: kern_q4x16(panel, K, act, stride, t, 5, y, ldy, m); break;
        case 4: kern_q4x16(panel, K, act, stride, t, 4, y, ldy, m); break;
        case 3: kern_q4x16(panel, K, act, stride, t, 3, y, ldy, m); break;
        case 2: kern_q4x16(panel, K, act, stride, t, 2, y, ldy, m); break;
        default: kern_q4x16(panel, K, act, stride, t, 1, y, ldy, m); break;
        }
    }
}

/* roundf() on 16 lanes: half away from zero (x - trunc(x) is exact, so the tie test is too) */
static inline __m512 round_away(__m512 x) {
    __m512 t = _mm512_roundscale_ps(x, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m512 frac = _mm512_abs_ps(_mm512_sub_ps(x, t));
    __mmask16 up = _mm512_cmp_ps_mask(frac, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    __m512 step = _mm512_castsi512_ps(_mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN)),
                                                      _mm512_castps_si512(_mm512_set1_ps(1.0f))));
    return _mm512_mask_add_ps(t, up, t, step);
}

/* qf_gemm_quantize_act on AVX-512: the same steps as quantize_row_q8_0_ref (d = amax/127 stored as
 * f16 round-to-nearest-even, id = 1/d, q = roundf(x*id)), written straight into the GEMM layout */
void qf_gemm_quantize_act_avx512(qf_type wt, const float *x, int64_t K, int t0, int t1, uint8_t *act) {
    const int64_t nb = K / 32;
    const int32_t off = wt == QF_TYPE_Q8_0 ? 128 : wt == QF_TYPE_Q4_0 ? 8 : 16;
    const size_t stride = qf_gemm_act_stride(K);
    for (int t = t0; t < t1; t++) {
        const float *xr = x + (size_t)t * K;
        uint8_t *row = act + (size_t)t * stride;
        float *d = (float *)(void *)(row + K);
        int32_t *corr = (int32_t *)(void *)(row + K + nb * 4);
        for (int64_t b = 0; b < nb; b++) {
            __m512 v0 = _mm512_loadu_ps(xr + b * 32), v1 = _mm512_loadu_ps(xr + b * 32 + 16);
            float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
            const float dd = amax / 127;
            const float id = dd ? 1.0f / dd : 0.0f;
            const __m512 vid = _mm512_set1_ps(id);
            __m512i q0 = _mm512_cvttps_epi32(round_away(_mm512_mul_ps(v0, vid)));
            __m512i q1 = _mm512_cvttps_epi32(round_away(_mm512_mul_ps(v1, vid)));
            _mm_storeu_si128((__m128i *)(void *)(row + b * 32), _mm512_cvtsepi32_epi8(q0));
            _mm_storeu_si128((__m128i *)(void *)(row + b * 32 + 16), _mm512_cvtsepi32_epi8(q1));
            d[b] = _cvtsh_ss(_cvtss_sh(dd, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            corr[b] = -off * _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
        }
    }
}

/* ---- f16 weights x f32 activations, packed panels (qf_gemm_f16_rows) ----
 * The weights of a tile, one K block (QF_GEMM_F16_KB) at a time, are converted to f32 and
 * transposed into panels of 32 rows: panel[k][32] (two zmm a k, lanes over rows). The micro-kernel
 * keeps 32 rows x 12 tokens in 24 zmm accumulators and per k does 2 panel loads and 24 FMAs with
 * the token's x[t][k] broadcast from memory: no conversion, no horizontal sum, FMA-bound. Each
 * (row, token) sums over k in order in one f32 lane (the result goes through y between K blocks). */
#define F16P_MR QF_GEMM_F16_MR
#ifndef F16P_NR
#define F16P_NR 12
#endif

/* in-register transpose of 16 x 16 f32: r[i] = row i on entry, column i on return */
static inline __attribute__((always_inline)) void tr16(__m512 r[16]) {
    __m512 t[16], u[16];
    _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);     /* per 128-bit lane L: a[4L] b[4L] a[4L+1] b[4L+1] */
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]); /* a[4L+2] b[4L+2] a[4L+3] b[4L+3] */
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) { /* u[4i+j], lane L: rows 4i..4i+3 of column 4L+j */
        u[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) { /* column 4L+j = lane L of u[j], u[4+j], u[8+j], u[12+j] */
        __m512 a = _mm512_shuffle_f32x4(u[j], u[4 + j], 0x88), b = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0x88);
        __m512 c = _mm512_shuffle_f32x4(u[j], u[4 + j], 0xDD), d = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0xDD);
        r[j] = _mm512_shuffle_f32x4(a, b, 0x88);
        r[8 + j] = _mm512_shuffle_f32x4(a, b, 0xDD);
        r[4 + j] = _mm512_shuffle_f32x4(c, d, 0x88);
        r[12 + j] = _mm512_shuffle_f32x4(c, d, 0xDD);
    }
}

/* panels of rows [r, r + nr) (nr <= tile rows; missing rows zero), k in [k0, k0 + kl), kl % 16 == 0:
 * panel g (rows r + 32g ...) at out + g * kl * 32, element [k][row % 32] */
static void pack_f16p(const uint8_t *w, size_t row_bytes, int64_t r, int nr, int64_t k0, int kl, float *out) {
    for (int b = 0; b * 16 < nr; b++) { /* 16-row blocks */
        float *pg = out + (size_t)(b / 2) * kl * F16P_MR + (b % 2) * 16;
        const uint16_t *rows[16];
        int valid = nr - b * 16 < 16 ? nr - b * 16 : 16;
        for (int i = 0; i < 16; i++)
            rows[i] = (const uint16_t *)(const void *)(w + (size_t)(r + b * 16 + (i < valid ? i : 0)) * row_bytes) + k0;
        for (int k = 0; k < kl; k += 16) {
            __m512 v[16];
            _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++)
                v[i] = i < valid ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(rows[i] + k)))
                                 : _mm512_setzero_ps();
            tr16(v);
            _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) _mm512_store_ps(pg + (size_t)(k + i) * F16P_MR, v[i]);
        }
    }
    if (nr % F16P_MR > 0 && nr % F16P_MR <= 16) { /* the second half of a last, half-filled panel: zero */
        float *pg = out + (size_t)((nr - 1) / 32) * kl * F16P_MR + 16;
        for (int k = 0; k < kl; k++) _mm512_store_ps(pg + (size_t)k * F16P_MR, _mm512_setzero_ps());
    }
}

static inline __attribute__((always_inline)) void kern_f16p(const float *panel, int kl, const float *x, int64_t K,
                                                            const int NT, float *y, int64_t ldy, __mmask16 m0,
                                                            __mmask16 m1, bool add) {
    __m512 a0[F16P_NR], a1[F16P_NR];
    _Pragma("GCC unroll 14") for (int t = 0; t < NT; t++) {
        a0[t] = add ? _mm512_maskz_loadu_ps(m0, y + (size_t)t * ldy) : _mm512_setzero_ps();
        a1[t] = add ? _mm512_maskz_loadu_ps(m1, y + (size_t)t * ldy + 16) : _mm512_setzero_ps();
    }
    for (int k = 0; k < kl; k++) {
        const __m512 w0 = _mm512_load_ps(panel + (size_t)k * F16P_MR), w1 = _mm512_load_ps(panel + (size_t)k * F16P_MR + 16);
        _Pragma("GCC unroll 14") for (int t = 0; t < NT; t++) {
            const __m512 xb = _mm512_set1_ps(x[(size_t)t * K + k]);
            a0[t] = _mm512_fmadd_ps(w0, xb, a0[t]);
            a1[t] = _mm512_fmadd_ps(w1, xb, a1[t]);
        }
    }
    _Pragma("GCC unroll 14") for (int t = 0; t < NT; t++) {
        _mm512_mask_storeu_ps(y + (size_t)t * ldy, m0, a0[t]);
        _mm512_mask_storeu_ps(y + (size_t)t * ldy + 16, m1, a1[t]);
    }
}

void qf_gemm_f16_rows_avx512(const void *w, size_t row_bytes, int64_t K, int64_t r0, int64_t r1, const float *x,
                              int n, float *y, int64_t ldy, void *scratch) {
    float *panels = scratch;
    const int nr = (int)(r1 - r0), ng = (nr + F16P_MR - 1) / F16P_MR;
    for (int64_t k0 = 0; k0 < K; k0 += QF_GEMM_F16_KB) {
        const int kl = K - k0 < QF_GEMM_F16_KB ? (int)(K - k0) : QF_GEMM_F16_KB;
        const bool add = k0 > 0;
        pack_f16p(w, row_bytes, r0, nr, k0, kl, panels);
        for (int t = 0; t < n; t += F16P_NR) {
            const int nt = n - t < F16P_NR ? n - t : F16P_NR;
            const float *xt = x + (size_t)t * K + k0;
            for (int g = 0; g < ng; g++) {
                const int left = nr - g * F16P_MR;
                const __mmask16 m0 = left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1);
                const __mmask16 m1 = left >= 32 ? 0xFFFF : left <= 16 ? 0 : (__mmask16)((1u << (left - 16)) - 1);
                const float *pg = panels + (size_t)g * kl * F16P_MR;
                float *yt = y + (size_t)t * ldy + r0 + g * F16P_MR;
                switch (nt) {
#if F16P_NR >= 14
                case 14: kern_f16p(pg, kl, xt, K, 14, yt, ldy, m0, m1, add); break;
                case 13: kern_f16p(pg, kl, xt, K, 13, yt, ldy, m0, m1, add); break;
#endif
                case 12: kern_f16p(pg, kl, xt, K, 12, yt, ldy, m0, m1, add); break;
                case 11: kern_f16p(pg, kl, xt, K, 11, yt, ldy, m0, m1, add); break;
                case 10: kern_f16p(pg, kl, xt, K, 10, yt, ldy, m0, m1, add); break;
                case 9: kern_f16p(pg, kl, xt, K, 9, yt, ldy, m0, m1, add); break;
                case 8: kern_f16p(pg, kl, xt, K, 8, yt, ldy, m0, m1, add); break;
                case 7: kern_f16p(pg, kl, xt, K, 7, yt, ldy, m0, m1, add); break;
                case 6: kern_f16p(pg, kl, xt, K, 6, yt, ldy, m0, m1, add); break;
                case 5: kern_f16p(pg, kl, xt, K, 5, yt, ldy, m0, m1, add); break;
                case 4: kern_f16p(pg, kl, xt, K, 4, yt, ldy, m0, m1, add); break;
                case 3: kern_f16p(pg, kl, xt, K, 3, yt, ldy, m0, m1, add); break;
                case 2: kern_f16p(pg, kl, xt, K, 2, yt, ldy, m0, m1, add); break;
                default: kern_f16p(pg, kl, xt, K, 1, yt, ldy, m0, m1, add); break;
                }
            }
        }
    }
}

/* ---- decode: one weight row . one Q8_0 activation row, AVX-512 VNNI (qf_vec_dot's Q8_0 / Q4_0) ----
 * Two blocks per step in one zmm: the weight quants made unsigned (Q4_0: the nibble; Q8_0: w ^ 0x80)
 * times the signed activation quants with vpdpbusd, the offset (8 or 128) times the activation's
 * block sum taken back by a second vpdpbusd, then per-lane block scales d_w * d_x and an f32 FMA. */
#include "format/quant_blocks.h"

static inline __m512i two_blocks_x(const block_q8_0 *x) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)x[0].qs)),
                              _mm256_loadu_si256((const __m256i *)(const void *)x[1].qs), 1);
}

static inline __m512 two_scales(float a, float b) {
    return _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(a), _mm512_set1_ps(b));
}

float qf_vec_dot_q8_avx512(qf_type t, int64_t n, const void *wv, const void *xv) {
    const int64_t nb = n / 32;
    const block_q8_0 *x = xv;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t i = 0;
    if (t == QF_TYPE_Q4_0) {
        const block_q4_0 *w = wv;
        const __m512i lo4 = _mm512_set1_epi8(0x0F), off = _mm512_set1_epi8(8);
        for (; i + 1 < nb; i += 2) {
            /* [w0 qs | w1 qs] -> [w0 lo | w0 hi | w1 lo | w1 hi] in 128-bit lanes: element order */
            __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)w[i].qs)),
                                                _mm_loadu_si128((const __m128i *)(const void *)w[i + 1].qs), 1);
            __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(q), _mm256_srli_epi16(q, 4), 1);
            z = _mm512_and_si512(_mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0)), lo4);
            __m512i xq = two_blocks_x(x + i);
            __m512i s = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), z, xq),
                                         _mm512_dpbusd_epi32(_mm512_setzero_si512(), off, xq));
            __m512 d = two_scales(_cvtsh_ss(w[i].d) * _cvtsh_ss(x[i].d), _cvtsh_ss(w[i + 1].d) * _cvtsh_ss(x[i + 1].d));
            if (i & 2) acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), d, acc1);
            else acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), d, acc0);
        }
    } else {
        const block_q8_0 *w = wv;
        const __m512i off = _mm512_set1_epi8((char)0x80);
        for (; i + 1 < nb; i += 2) {
            __m512i z = _mm512_xor_si512(two_blocks_x(w + i), off);
            __m512i xq = two_blocks_x(x + i);
            __m512i s = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), z, xq),
                                         _mm512_dpbusd_epi32(_mm512_setzero_si512(), off, xq));
            __m512 d = two_scales(_cvtsh_ss(w[i].d) * _cvtsh_ss(x[i].d), _cvtsh_ss(w[i + 1].d) * _cvtsh_ss(x[i + 1].d));
            if (i & 2) acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), d, acc1);
            else acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), d, acc0);
        }
    }
    float sum = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    for (; i < nb; i++) { /* an odd last block */
        int32_t s = 0;
        if (t == QF_TYPE_Q4_0) {
            const block_q4_0 *w = (const block_q4_0 *)wv + i;
            for (int j = 0; j < 16; j++) s += ((w->qs[j] & 0xF) - 8) * x[i].qs[j] + ((w->qs[j] >> 4) - 8) * x[i].qs[j + 16];
            sum += (float)s * (_cvtsh_ss(w->d) * _cvtsh_ss(x[i].d));
        } else {
            const block_q8_0 *w = (const block_q8_0 *)wv + i;
            for (int j = 0; j < 32; j++) s += w->qs[j] * x[i].qs[j];
            sum += (float)s * (_cvtsh_ss(w->d) * _cvtsh_ss(x[i].d));
        }
    }
    return sum;
}

/* ---- Q4_K / Q6_K panels (gemm.h): 16 rows x 6 tokens; per sub-block an int32 dot (vpdpbusd),
 * times the rows' integer scales (vpmulld), summed per 256-block; then one float FMA per block
 * (Q4_K: and one for the mins), in the oracle's order. ---- */
#define K_NT 6
static inline __attribute__((always_inline)) void kern_k(const int q4, const uint8_t *panel, int64_t K,
                                                         const uint8_t *act, size_t stride, int t, const int NT,
                                                         float *y, int64_t ldy, __mmask16 m) {
    const int64_t nb = K / 256;
    const int ns = q4 ? 8 : 16, gps = q4 ? 8 : 4; /* sub-blocks, groups of 4 per sub-block */
    const size_t bb = 256 * 16 + (size_t)ns * 64 + 64 + (q4 ? 8 * 64 + 64 : 0);
    const uint8_t *xr[K_NT];
    const float *dx[K_NT];
    const int32_t *bs[K_NT];
    __m512 acc[K_NT];
    _Pragma("GCC unroll 6") for (int i = 0; i < NT; i++) {
        xr[i] = act + (size_t)(t + i) * stride;
        dx[i] = (const float *)(const void *)(xr[i] + K);
        bs[i] = (const int32_t *)(const void *)(xr[i] + K + nb * 4);
        acc[i] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *pb = panel + (size_t)b * bb;
        const int32_t *sc = (const int32_t *)(const void *)(pb + 256 * 16), *mn = sc + ns * 16;
        const float *d = (const float *)(const void *)(mn + (q4 ? 8 * 16 : 0)), *dmin = d + 16;
        __m512i iacc[K_NT], im[K_NT];
        _Pragma("GCC unroll 6") for (int i = 0; i < NT; i++) iacc[i] = im[i] = _mm512_setzero_si512();
        for (int s = 0; s < ns; s++) {
            __m512i ia[K_NT];
            _Pragma("GCC unroll 6") for (int i = 0; i < NT; i++)
                ia[i] = q4 ? _mm512_setzero_si512() : _mm512_set1_epi32(-32 * bs[i][b * 16 + s]);
            _Pragma("GCC unroll 8") for (int g = 0; g < gps; g++) {
                const __m512i wv = _mm512_loadu_si512((const void *)(pb + (size_t)(s * gps + g) * 64));
                const int64_t off = b * 256 + (int64_t)s * gps * 4 + g * 4;
                _Pragma("GCC unroll 6") for (int i = 0; i < NT; i++)
                    ia[i] = _mm512_dpbusd_epi32(ia[i], wv, _mm512_set1_epi32(ld32(xr[i] + off)));
            }
            const __m512i scv = _mm512_loadu_si512((const void *)(sc + s * 16));
            _Pragma("GCC unroll 6") for (int i = 0; i < NT; i++) iacc[i] = _mm512_add_epi32(iacc[i], _mm512_mullo_epi32(ia[i], scv));
            if (q4) {
                const __m512i mv = _mm512_loadu_si512((const void *)(mn + s * 16));
                _Pragma("GCC unroll 6") for (int i = 0; i < NT; i++)
                    im[i] = _mm512_add_epi32(im[i], _mm512_mullo_epi32(mv, _mm512_set1_epi32(bs[i][b * 16 + 2 * s] + bs[i][b * 16 + 2 * s + 1])));
            }
        }
        const __m512 dv = _mm512_loadu_ps(d);
        _Pragma("GCC unroll 6") for (int i = 0; i < NT; i++)
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[i]), _mm512_mul_ps(dv, _mm512_set1_ps(dx[i][b])), acc[i]);
        if (q4) {
            const __m512 dmv = _mm512_loadu_ps(dmin);
            _Pragma("GCC unroll 6") for (int i = 0; i < NT; i++)
                acc[i] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(im[i]), _mm512_mul_ps(dmv, _mm512_set1_ps(dx[i][b])), acc[i]);
        }
    }
    _Pragma("GCC unroll 6") for (int i = 0; i < NT; i++) _mm512_mask_storeu_ps(y + (size_t)(t + i) * ldy, m, acc[i]);
}

#define KERN_K_CASES(Q4)                                                                 \
    switch (nt) {                                                                        \
    case 6: kern_k(Q4, panel, K, act, stride, t, 6, y, ldy, m); break;                   \
    case 5: kern_k(Q4, panel, K, act, stride, t, 5, y, ldy, m); break;                   \
    case 4: kern_k(Q4, panel, K, act, stride, t, 4, y, ldy, m); break;                   \
    case 3: kern_k(Q4, panel, K, act, stride, t, 3, y, ldy, m); break;                   \
    case 2: kern_k(Q4, panel, K, act, stride, t, 2, y, ldy, m); break;                   \
    default: kern_k(Q4, panel, K, act, stride, t, 1, y, ldy, m); break;                  \
    }

void qf_gemm_k_panel_avx512(qf_type wt, const uint8_t *panel, int64_t K, const uint8_t *act, int t0, int t1,
                            float *y, int64_t ldy, int nrows) {
    const size_t stride = qf_gemm_k_act_stride(K);
    const __mmask16 m = (__mmask16)((1u << nrows) - 1);
    for (int t = t0; t < t1; t += K_NT) {
        int nt = t1 - t < K_NT ? t1 - t : K_NT;
        if (wt == QF_TYPE_Q4_K) {
            KERN_K_CASES(1)
        } else {
            KERN_K_CASES(0)
        }
    }
}

