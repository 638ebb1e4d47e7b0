/* quant_avx2.c: AVX2/FMA/F16C versions of the hot kernels in quant.c: dequantize (prefill
 * GEMM tiles), vec_dot (decode) and the activation quantizers (Q8_0, Q8_K, F16, BF16).
 * Compiled with -mavx2 -mfma -mf16c; quant.c calls in here only after checking the CPU.
 * Dequantize and quantize are bit-exact with the oracle (same float operations, no FMA where
 * the oracle has none); vec_dot does the same integer dot per block and differs from the
 * oracle only in the order of the float accumulation. */
#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>
#include <string.h>

#include "kernels/quant_impl.h"
#include "util/util.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float hmax_ps(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __m256 abs_ps(__m256 v) {
    return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v);
}

/* 32 bytes: nibbles of 16 bytes, the low ones in lane 0 and the high ones in lane 1, which
 * is the element order of the _0 formats (element j low nibble, element j+16 high). */
static inline __m256i nibbles_32(const uint8_t *q) {
    __m128i b = _mm_loadu_si128((const __m128i *)q);
    __m256i v = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
    return _mm256_and_si256(v, _mm256_set1_epi8(0xF));
}

/* Byte k = 0xFF where bit k of the 32-bit word is set. */
static inline __m256i bits_to_bytes(const uint8_t *p) {
    uint32_t w;
    memcpy(&w, p, 4);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                           0x0101010101010101, 0x0000000000000000);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)w), shuf);
    b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1));
}

/* ---- dequantization ---- */

/* y[0..32) = (float)q * d for 32 signed bytes; the oracle's int*float multiply. */
static inline void store_i8x32(__m256i q, float d, float *y) {
    const __m256 vd = _mm256_set1_ps(d);
    __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    _mm256_storeu_ps(y + 0, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), vd));
    _mm256_storeu_ps(y + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), vd));
    _mm256_storeu_ps(y + 16, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), vd));
    _mm256_storeu_ps(y + 24, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), vd));
}

/* y[0..32) = a * q - b for 32 unsigned bytes (K formats: scale times quant minus min). */
static inline void store_u8x32_affine(__m256i q, float a, float b, float *y) {
    const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
    __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int k = 0; k < 4; k++) {
        __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[k]));
        _mm256_storeu_ps(y + 8 * k, _mm256_sub_ps(_mm256_mul_ps(va, f), vb));
    }
}

/* y[0..16) = ds * q for 16 signed bytes. */
static inline void store_i8x16(__m128i q, float ds, float *y) {
    const __m256 vd = _mm256_set1_ps(ds);
    _mm256_storeu_ps(y, _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q))));
    _mm256_storeu_ps(y + 8, _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)))));
}

static void dequant_q4_0(const block_q4_0 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK)
        store_i8x32(_mm256_sub_epi8(nibbles_32(x[i].qs), _mm256_set1_epi8(8)), h2f(x[i].d), y);
}

static void dequant_q5_0(const block_q5_0 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK) {
        /* (q | h<<4) - 16 == q | (h ? 0 : 0xF0) as a signed byte */
        __m256i hi = _mm256_andnot_si256(bits_to_bytes(x[i].qh), _mm256_set1_epi8((char)0xF0));
        store_i8x32(_mm256_or_si256(nibbles_32(x[i].qs), hi), h2f(x[i].d), y);
    }
}

static void dequant_q8_0(const block_q8_0 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK)
        store_i8x32(_mm256_loadu_si256((const __m256i *)x[i].qs), h2f(x[i].d), y);
}

static void dequant_q4_K(const block_q4_K *x, float *y, int64_t nb) {
    const __m256i m4 = _mm256_set1_epi8(0xF);
    for (int64_t i = 0; i < nb; i++) {
        const float d = h2f(x[i].d), dmin = h2f(x[i].dmin);
        uint8_t sc[8], m[8];
        qf_k4_scale_min_all(x[i].scales, sc, m);
        for (int s = 0; s < 8; s += 2, y += 64) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 16 * s));
            store_u8x32_affine(_mm256_and_si256(q, m4), d * sc[s], dmin * m[s], y);
            store_u8x32_affine(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), d * sc[s + 1], dmin * m[s + 1], y + 32);
        }
    }
}

static void dequant_q5_K(const block_q5_K *x, float *y, int64_t nb) {
    const __m256i m4 = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
    for (int64_t i = 0; i < nb; i++) {
        const float d = h2f(x[i].d), dmin = h2f(x[i].dmin);
        const __m256i qh = _mm256_loadu_si256((const __m256i *)x[i].qh);
        uint8_t sc[8], m[8];
        qf_k4_scale_min_all(x[i].scales, sc, m);
        for (int s = 0; s < 8; s += 2, y += 64) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 16 * s));
            __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(s)), one), 4);
            __m256i h2 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(s + 1)), one), 4);
            store_u8x32_affine(_mm256_or_si256(_mm256_and_si256(q, m4), h1), d * sc[s], dmin * m[s], y);
            store_u8x32_affine(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), h2),
                               d * sc[s + 1], dmin * m[s + 1], y + 32);
        }
    }
}

/* The four 32-element groups of one 128-element half of a Q6_K block, as unsigned 0..63. */
static inline void q6_groups(const uint8_t *ql, const uint8_t *qh, __m256i g[4]) {
    const __m256i m4 = _mm256_set1_epi8(0xF), m3 = _mm256_set1_epi8(3), m30 = _mm256_set1_epi8(0x30);
    const __m256i a = _mm256_loadu_si256((const __m256i *)ql);
    const __m256i b = _mm256_loadu_si256((const __m256i *)(ql + 32));
    const __m256i h = _mm256_loadu_si256((const __m256i *)qh);
    g[0] = _mm256_or_si256(_mm256_and_si256(a, m4), _mm256_slli_epi16(_mm256_and_si256(h, m3), 4));
    g[1] = _mm256_or_si256(_mm256_and_si256(b, m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m3), 4));
    g[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), m4), _mm256_and_si256(h, m30));
    g[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b, 4), m4),
                           _mm256_and_si256(_mm256_srli_epi16(h, 2), m30));
}

static void dequant_q6_K(const block_q6_K *x, float *y, int64_t nb) {
    const __m256i m32 = _mm256_set1_epi8(32);
    for (int64_t i = 0; i < nb; i++) {
        const float d = h2f(x[i].d);
        for (int half = 0; half < 2; half++) {
            const int8_t *sc = x[i].scales + 8 * half;
            __m256i g[4];
            q6_groups(x[i].ql + 64 * half, x[i].qh + 32 * half, g);
            for (int k = 0; k < 4; k++, y += 32) {
                __m256i q = _mm256_sub_epi8(g[k], m32);
                store_i8x16(_mm256_castsi256_si128(q), d * sc[2 * k], y);
                store_i8x16(_mm256_extracti128_si256(q, 1), d * sc[2 * k + 1], y + 16);
            }
        }
    }
}

bool qf_dequantize_row_avx2(qf_type t, const void *src, float *dst, int64_t n) {
    const int64_t blck = qf_type_block_elems(t);
    if (n <= 0 || blck == 0 || n % blck != 0) return false;
    const int64_t nb = n / blck;
    switch (t) {
    case QF_TYPE_F16: {
        const uint16_t *h = src;
        int64_t i = 0;
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
        for (; i < n; i++) dst[i] = qf_f16_to_f32(h[i]);
        return true;
    }
    case QF_TYPE_BF16: {
        const uint16_t *h = src;
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) {
            __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(h + i)));
            _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(u, 16)));
        }
        for (; i < n; i++) dst[i] = qf_bf16_to_f32(h[i]);
        return true;
    }
    case QF_TYPE_Q4_0: dequant_q4_0(src, dst, nb); return true;
    case QF_TYPE_Q5_0: dequant_q5_0(src, dst, nb); return true;
    case QF_TYPE_Q8_0: dequant_q8_0(src, dst, nb); return true;
    case QF_TYPE_Q4_K: dequant_q4_K(src, dst, nb); return true;
    case QF_TYPE_Q5_K: dequant_q5_K(src, dst, nb); return true;
    case QF_TYPE_Q6_K: dequant_q6_K(src, dst, nb); return true;
    default: return false; /* F32 is a memcpy already; the rest have no fast version */
    }
}

/* ---- quantization ---- */

/* roundf(): half away from zero. x - trunc(x) is exact, so the tie test is exact too. */
static inline __m256 round_away(__m256 x) {
    __m256 t = _mm256_round_ps(x, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256 frac = abs_ps(_mm256_sub_ps(x, t));
    __m256 step = _mm256_or_ps(_mm256_and_ps(x, _mm256_set1_ps(-0.0f)), _mm256_set1_ps(1.0f));
    __m256 up = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    return _mm256_add_ps(t, _mm256_and_ps(up, step));
}

/* Four vectors of 8 int32 (each in [-128, 127]) to 32 int8 in element order. */
static inline __m256i pack_i32x32(__m256i a, __m256i b, __m256i c, __m256i d) {
    __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
    __m256i v = _mm256_packs_epi16(ab, cd);
    /* the packs interleave 128-bit lanes; put the 4-byte groups back in order */
    return _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static void quant_q8_0(const float *x, block_q8_0 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK) {
        __m256 v[4];
        __m256 amax = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(x + 8 * k);
            amax = _mm256_max_ps(amax, abs_ps(v[k]));
        }
        /* the oracle's exact scalar steps: d = amax/127, id = 1/d (not 127/amax) */
        const float d = hmax_ps(amax) / 127;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = qf_f32_to_f16(d);
        const __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int k = 0; k < 4; k++) q[k] = _mm256_cvttps_epi32(round_away(_mm256_mul_ps(v[k], vid)));
        _mm256_storeu_si256((__m256i *)y[i].qs, pack_i32x32(q[0], q[1], q[2], q[3]));
    }
}

static void quant_q8_K(const float *x, block_q8_K *y, int64_t nb) {
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    const __m256i max127 = _mm256_set1_epi32(127);
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        __m256 amaxv = _mm256_setzero_ps();
        for (int k = 0; k < QK_K; k += 8) amaxv = _mm256_max_ps(amaxv, abs_ps(_mm256_loadu_ps(x + k)));
        const float amax = hmax_ps(amaxv);
        if (amax == 0.0f) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        /* the signed value of the first element of largest magnitude, as the oracle picks */
        float max = 0.0f;
        for (int k = 0; k < QK_K; k += 8) {
            int m = _mm256_movemask_ps(_mm256_cmp_ps(abs_ps(_mm256_loadu_ps(x + k)), _mm256_set1_ps(amax), _CMP_EQ_OQ));
            if (m) {
                max = x[k + __builtin_ctz((unsigned)m)];
                break;
            }
        }
        const float iscale = -127.f / max;
        const __m256 vs = _mm256_set1_ps(iscale);
        for (int k = 0; k < QK_K; k += 32) {
            __m256i q[4];
            for (int j = 0; j < 4; j++) {
                __m256 p = _mm256_mul_ps(_mm256_loadu_ps(x + k + 8 * j), vs);
                q[j] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_round_ps(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)), max127);
            }
            __m256i b = pack_i32x32(q[0], q[1], q[2], q[3]);
            _mm256_storeu_si256((__m256i *)(y[i].qs + k), b);
            /* sums of 4 consecutive quants, then of 16: lane 0 of each 128-bit half */
            __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, b), ones16);
            s = _mm256_hadd_epi32(s, s);
            s = _mm256_hadd_epi32(s, s);
            y[i].bsums[k / 16] = (int16_t)_mm256_cvtsi256_si32(s);
            y[i].bsums[k / 16 + 1] = (int16_t)_mm256_extract_epi32(s, 4);
        }
        y[i].d = 1 / iscale;
    }
}

bool qf_quantize_row_avx2(qf_type t, const float *src, void *dst, int64_t n) {
    const int64_t blck = qf_type_block_elems(t);
    if (n < 0 || blck == 0 || n % blck != 0) return false;
    switch (t) {
    case QF_TYPE_F16: {
        uint16_t *h = dst;
        int64_t i = 0;
        for (; i + 8 <= n; i += 8)
            _mm_storeu_si128((__m128i *)(h + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
        for (; i < n; i++) h[i] = qf_f32_to_f16(src[i]);
        return true;
    }
    case QF_TYPE_BF16: {
        uint16_t *h = dst;
        int64_t i = 0;
        const __m256i absmask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
        for (; i + 8 <= n; i += 8) {
            __m256i u = _mm256_castps_si256(_mm256_loadu_ps(src + i));
            __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
            __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
            __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, absmask), inf);
            __m256i qnan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(64));
            r = _mm256_blendv_epi8(r, qnan, nan);
            r = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xD8);
            _mm_storeu_si128((__m128i *)(h + i), _mm256_castsi256_si128(r));
        }
        for (; i < n; i++) h[i] = qf_f32_to_bf16(src[i]);
        return true;
    }
    case QF_TYPE_Q8_0: quant_q8_0(src, dst, n / blck); return true;
    case QF_TYPE_Q8_K: quant_q8_K(src, dst, n / blck); return true;
    default: return false;
    }
}

/* ---- dot products ---- */

/* Signed bytes times signed bytes, summed in pairs then quads: 8 int32 as floats. maddubs
 * wants one unsigned operand, so move x's sign onto y. y must not hold -128 (the Q8
 * activation quantizers never produce it). */
static inline __m256 dot_i8_ps(__m256i x, __m256i y) {
    __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

static float dot_q4_0(const block_q4_0 *w, const block_q8_0 *x, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        __m256i q = _mm256_sub_epi8(nibbles_32(w[i].qs), _mm256_set1_epi8(8));
        __m256 p = dot_i8_ps(q, _mm256_loadu_si256((const __m256i *)x[i].qs));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[i].d) * h2f(x[i].d)), p, acc);
    }
    return hsum_ps(acc);
}

static float dot_q5_0(const block_q5_0 *w, const block_q8_0 *x, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        __m256i hi = _mm256_andnot_si256(bits_to_bytes(w[i].qh), _mm256_set1_epi8((char)0xF0));
        __m256i q = _mm256_or_si256(nibbles_32(w[i].qs), hi);
        __m256 p = dot_i8_ps(q, _mm256_loadu_si256((const __m256i *)x[i].qs));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[i].d) * h2f(x[i].d)), p, acc);
    }
    return hsum_ps(acc);
}

static float dot_q8_0(const block_q8_0 *w, const block_q8_0 *x, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        __m256 p = dot_i8_ps(_mm256_loadu_si256((const __m256i *)w[i].qs),
                             _mm256_loadu_si256((const __m256i *)x[i].qs));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[i].d) * h2f(x[i].d)), p, acc);
    }
    return hsum_ps(acc);
}

/* Sum over the 8 sub-blocks of min * (sum of the sub-block's activations), from bsums. */
static inline int k4_min_sum(const uint8_t m[8], const int16_t *bsums) {
    __m128i mins = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)m));
    __m128i pairs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)bsums), _mm_loadu_si128((const __m128i *)(bsums + 8)));
    __m128i s = _mm_madd_epi16(mins, pairs);
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

static float dot_q4_K(const block_q4_K *w, const block_q8_K *x, int64_t nb) {
    const __m256i m4 = _mm256_set1_epi8(0xF);
    __m256 acc = _mm256_setzero_ps();
    float acc_m = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        uint8_t sc[8], m[8];
        qf_k4_scale_min_all(w[i].scales, sc, m);
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * j));
            __m256i a0 = _mm256_loadu_si256((const __m256i *)(x[i].qs + 64 * j));
            __m256i a1 = _mm256_loadu_si256((const __m256i *)(x[i].qs + 64 * j + 32));
            __m256i p0 = _mm256_maddubs_epi16(_mm256_and_si256(q, m4), a0);
            __m256i p1 = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), a1);
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p0, _mm256_set1_epi16(sc[2 * j])));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p1, _mm256_set1_epi16(sc[2 * j + 1])));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[i].d) * x[i].d), _mm256_cvtepi32_ps(sumi), acc);
        acc_m += h2f(w[i].dmin) * x[i].d * k4_min_sum(m, x[i].bsums);
    }
    return hsum_ps(acc) - acc_m;
}

static float dot_q5_K(const block_q5_K *w, const block_q8_K *x, int64_t nb) {
    const __m256i m4 = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps();
    float acc_m = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        uint8_t sc[8], m[8];
        qf_k4_scale_min_all(w[i].scales, sc, m);
        const __m256i qh = _mm256_loadu_si256((const __m256i *)w[i].qh);
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * j));
            __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * j)), one), 4);
            __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * j + 1)), one), 4);
            __m256i q0 = _mm256_or_si256(_mm256_and_si256(q, m4), h0);
            __m256i q1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), h1);
            __m256i a0 = _mm256_loadu_si256((const __m256i *)(x[i].qs + 64 * j));
            __m256i a1 = _mm256_loadu_si256((const __m256i *)(x[i].qs + 64 * j + 32));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(q0, a0), _mm256_set1_epi16(sc[2 * j])));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(q1, a1), _mm256_set1_epi16(sc[2 * j + 1])));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[i].d) * x[i].d), _mm256_cvtepi32_ps(sumi), acc);
        acc_m += h2f(w[i].dmin) * x[i].d * k4_min_sum(m, x[i].bsums);
    }
    return hsum_ps(acc) - acc_m;
}

static float dot_q6_K(const block_q6_K *w, const block_q8_K *x, int64_t nb) {
    const __m256i m32 = _mm256_set1_epi8(32);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        __m256i sumi = _mm256_setzero_si256();
        for (int half = 0; half < 2; half++) {
            const int8_t *sc = w[i].scales + 8 * half;
            const int8_t *a = x[i].qs + 128 * half;
            __m256i g[4];
            q6_groups(w[i].ql + 64 * half, w[i].qh + 32 * half, g);
            for (int k = 0; k < 4; k++) {
                __m256i av = _mm256_loadu_si256((const __m256i *)(a + 32 * k));
                /* (q - 32).a == q.a - 32*sum(a), both as pair sums in int16 */
                __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(g[k], av), _mm256_maddubs_epi16(m32, av));
                __m256i s = _mm256_set_m128i(_mm_set1_epi16(sc[2 * k + 1]), _mm_set1_epi16(sc[2 * k]));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, s));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[i].d) * x[i].d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_ps(acc);
}

static float dot_f32(const float *a, const float *b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

static inline __m256 ld_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline __m256 ld_bf16(const uint16_t *p) {
    __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}

static float dot_f16(const uint16_t *a, const uint16_t *b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(ld_f16(a + i), ld_f16(b + i), s0);
        s1 = _mm256_fmadd_ps(ld_f16(a + i + 8), ld_f16(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(ld_f16(a + i + 16), ld_f16(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(ld_f16(a + i + 24), ld_f16(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(ld_f16(a + i), ld_f16(b + i), s0);
    float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++) sum += qf_f16_to_f32(a[i]) * qf_f16_to_f32(b[i]);
    return sum;
}

static float dot_bf16(const uint16_t *a, const uint16_t *b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(ld_bf16(a + i), ld_bf16(b + i), s0);
        s1 = _mm256_fmadd_ps(ld_bf16(a + i + 8), ld_bf16(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(ld_bf16(a + i + 16), ld_bf16(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(ld_bf16(a + i + 24), ld_bf16(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(ld_bf16(a + i), ld_bf16(b + i), s0);
    float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++) sum += qf_bf16_to_f32(a[i]) * qf_bf16_to_f32(b[i]);
    return sum;
}

bool qf_vec_dot_avx2(qf_type t, int64_t n, const void *w, const void *x, float *out) {
    const int64_t blck = qf_type_block_elems(t);
    if (n <= 0 || blck == 0 || n % blck != 0) return false;
    const int64_t nb = n / blck;
    switch (t) {
    case QF_TYPE_F32: *out = dot_f32(w, x, n); return true;
    case QF_TYPE_F16: *out = dot_f16(w, x, n); return true;
    case QF_TYPE_BF16: *out = dot_bf16(w, x, n); return true;
    case QF_TYPE_Q4_0: *out = dot_q4_0(w, x, nb); return true;
    case QF_TYPE_Q5_0: *out = dot_q5_0(w, x, nb); return true;
    case QF_TYPE_Q8_0: *out = dot_q8_0(w, x, nb); return true;
    case QF_TYPE_Q4_K: *out = dot_q4_K(w, x, nb); return true;
    case QF_TYPE_Q5_K: *out = dot_q5_K(w, x, nb); return true;
    case QF_TYPE_Q6_K: *out = dot_q6_K(w, x, nb); return true;
    default: return false;
    }
}

#else /* not x86: no fast kernels; quant.c never calls these */

#include "kernels/quant_impl.h"

bool qf_dequantize_row_avx2(qf_type t, const void *src, float *dst, int64_t n) { return false; }
bool qf_quantize_row_avx2(qf_type t, const float *src, void *dst, int64_t n) { return false; }
bool qf_vec_dot_avx2(qf_type t, int64_t n, const void *w, const void *x, float *out) { return false; }

#endif
