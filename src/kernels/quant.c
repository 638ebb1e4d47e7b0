/* quant.c: ggml tensor block formats: the type table, the scalar reference kernels (the
 * oracle every fast kernel is tested against) and the run-time dispatch to quant_avx2.c.
 * Block layouts and rounding follow ggml (ggml-quants.c) so results are bit-exact with it. */
#include <ctype.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <math.h>
#include <string.h>
#include <strings.h>

#include "kernels/gemm.h"
#include "kernels/quant_impl.h"
#include "qforge/quant.h"
#include "util/util.h"

/* The oracle must round exactly like ggml's C: no fused multiply-add (clang contracts by default). */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* ---- type table ----
 * Every type ggml defines a size for, including ones we only recognise (so the GGUF reader
 * can size their data and give a precise "unsupported" message). The sizes of the types we
 * read or write come from their layouts in format/quant_blocks.h; the recognised-only types
 * have no layout here, only ggml's block size in bytes. */
typedef struct {
    const char *name;
    int64_t blck;
    size_t bytes;
    bool supported;
} type_info;

static const type_info TYPES[QF_TYPE_COUNT] = {
    [QF_TYPE_F32] = {"f32", 1, 4, true},
    [QF_TYPE_F16] = {"f16", 1, 2, true},
    [QF_TYPE_Q4_0] = {"q4_0", QK, sizeof(block_q4_0), true},
    [QF_TYPE_Q4_1] = {"q4_1", 32, 20, false},
    [QF_TYPE_Q5_0] = {"q5_0", QK, sizeof(block_q5_0), true},
    [QF_TYPE_Q5_1] = {"q5_1", 32, 24, false},
    [QF_TYPE_Q8_0] = {"q8_0", QK, sizeof(block_q8_0), true},
    [QF_TYPE_Q8_1] = {"q8_1", 32, 36, false},
    [QF_TYPE_Q2_K] = {"q2_K", 256, 84, false},
    [QF_TYPE_Q3_K] = {"q3_K", 256, 110, false},
    [QF_TYPE_Q4_K] = {"q4_K", QK_K, sizeof(block_q4_K), true},
    [QF_TYPE_Q5_K] = {"q5_K", QK_K, sizeof(block_q5_K), true},
    [QF_TYPE_Q6_K] = {"q6_K", QK_K, sizeof(block_q6_K), true},
    /* Q8_K is an activation format only: a weight of this type has no vec_dot partner. */
    [QF_TYPE_Q8_K] = {"q8_K", QK_K, sizeof(block_q8_K), false},
    [16] = {"iq2_xxs", 256, 66, false},
    [17] = {"iq2_xs", 256, 74, false},
    [18] = {"iq3_xxs", 256, 98, false},
    [19] = {"iq1_s", 256, 50, false},
    [20] = {"iq4_nl", 32, 18, false},
    [21] = {"iq3_s", 256, 110, false},
    [22] = {"iq2_s", 256, 82, false},
    [23] = {"iq4_xs", 256, 136, false},
    [QF_TYPE_I8] = {"i8", 1, 1, false},
    [QF_TYPE_I16] = {"i16", 1, 2, false},
    [QF_TYPE_I32] = {"i32", 1, 4, false},
    [QF_TYPE_I64] = {"i64", 1, 8, false},
    [QF_TYPE_F64] = {"f64", 1, 8, false},
    [29] = {"iq1_m", 256, 56, false},
    [QF_TYPE_BF16] = {"bf16", 1, 2, true},
    [34] = {"tq1_0", 256, 54, false},
    [35] = {"tq2_0", 256, 66, false},
    [39] = {"mxfp4", 32, 17, false},
};

static const type_info *info(qf_type t) {
    if ((int)t < 0 || (int)t >= QF_TYPE_COUNT || !TYPES[t].name) return NULL;
    return &TYPES[t];
}

const char *qf_type_name(qf_type t) {
    const type_info *ti = info(t);
    return ti ? ti->name : NULL;
}

bool qf_type_from_name(const char *name, qf_type *out) {
    if (!name) return false;
    for (int t = 0; t < QF_TYPE_COUNT; t++) {
        if (TYPES[t].name && strcasecmp(TYPES[t].name, name) == 0) {
            if (out) *out = (qf_type)t;
            return true;
        }
    }
    return false;
}

bool qf_type_is_known(qf_type t) { return info(t) != NULL; }

bool qf_type_is_supported(qf_type t) {
    const type_info *ti = info(t);
    return ti && ti->supported;
}

int64_t qf_type_block_elems(qf_type t) {
    const type_info *ti = info(t);
    return ti ? ti->blck : 0;
}

size_t qf_type_block_bytes(qf_type t) {
    const type_info *ti = info(t);
    return ti ? ti->bytes : 0;
}

size_t qf_row_bytes(qf_type t, int64_t n) {
    const type_info *ti = info(t);
    if (!ti || n < 0 || n % ti->blck != 0) return 0;
    size_t r;
    if (__builtin_mul_overflow((size_t)(n / ti->blck), ti->bytes, &r)) return 0; /* 0 = no size */
    return r;
}

qf_type qf_vec_dot_type(qf_type t) {
    switch (t) {
    case QF_TYPE_Q4_0:
    case QF_TYPE_Q5_0:
    case QF_TYPE_Q8_0: return QF_TYPE_Q8_0;
    case QF_TYPE_Q4_K:
    case QF_TYPE_Q5_K:
    case QF_TYPE_Q6_K: return QF_TYPE_Q8_K;
    default: return t;
    }
}

/* ---- scalar dequantization (the oracle; each mirrors ggml's dequantize_row_*) ---- */

static float h2f(uint16_t h) { return qf_f16_to_f32(h); }

static void dequant_q4_0(const block_q4_0 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK) {
        const float d = h2f(x[i].d);
        for (int j = 0; j < QK / 2; j++) {
            y[j] = ((x[i].qs[j] & 0xF) - 8) * d;
            y[j + QK / 2] = ((x[i].qs[j] >> 4) - 8) * d;
        }
    }
}

static void dequant_q5_0(const block_q5_0 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK) {
        const float d = h2f(x[i].d);
        uint32_t qh;
        memcpy(&qh, x[i].qh, 4);
        /* bit j of qh is the 5th bit of element j, bit j+16 that of element j+16 */
        for (int j = 0; j < QK / 2; j++) {
            int h0 = (qh >> j) & 1, h1 = (qh >> (j + 16)) & 1;
            y[j] = (((x[i].qs[j] & 0xF) | (h0 << 4)) - 16) * d;
            y[j + QK / 2] = (((x[i].qs[j] >> 4) | (h1 << 4)) - 16) * d;
        }
    }
}

static void dequant_q8_0(const block_q8_0 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK) {
        const float d = h2f(x[i].d);
        for (int j = 0; j < QK; j++) y[j] = x[i].qs[j] * d;
    }
}

static void dequant_q4_K(const block_q4_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = h2f(x[i].d), dmin = h2f(x[i].dmin);
        const uint8_t *q = x[i].qs;
        /* 64 elements per step: 32 low nibbles (sub-block 2s), then 32 high (2s+1) */
        for (int s = 0; s < 8; s += 2, q += 32) {
            uint8_t sc, m;
            qf_k4_scale_min(s, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            qf_k4_scale_min(s + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
        }
    }
}

static void dequant_q5_K(const block_q5_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = h2f(x[i].d), dmin = h2f(x[i].dmin);
        const uint8_t *ql = x[i].qs, *qh = x[i].qh;
        /* the 5th bit of sub-block s lives in bit s of qh[l] */
        for (int s = 0; s < 8; s += 2, ql += 32) {
            uint8_t sc, m;
            qf_k4_scale_min(s, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            qf_k4_scale_min(s + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            const uint8_t u1 = (uint8_t)(1u << s), u2 = (uint8_t)(2u << s);
            for (int l = 0; l < 32; l++) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        }
    }
}

static void dequant_q6_K(const block_q6_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = h2f(x[i].d);
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        const int8_t *sc = x[i].scales;
        /* 128 elements per half: element l+32k takes nibble (k&1 ? ql[l+32] : ql[l]) >> 4*(k>>1)
         * and bits 2k..2k+1 of qh[l]; scale index l/16 + 2k */
        for (int half = 0; half < 2; half++, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * sc[is] * q1;
                y[l + 32] = d * sc[is + 2] * q2;
                y[l + 64] = d * sc[is + 4] * q3;
                y[l + 96] = d * sc[is + 6] * q4;
            }
        }
    }
}

static void dequant_q8_K(const block_q8_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK_K)
        for (int j = 0; j < QK_K; j++) y[j] = x[i].d * x[i].qs[j];
}

void qf_dequantize_row_ref(qf_type t, const void *src, float *dst, int64_t n) {
    const int64_t blck = qf_type_block_elems(t);
    if (n <= 0 || blck == 0 || n % blck != 0) return;
    const int64_t nb = n / blck;
    switch (t) {
    case QF_TYPE_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case QF_TYPE_F16: {
        const uint16_t *h = src;
        for (int64_t i = 0; i < n; i++) dst[i] = qf_f16_to_f32(h[i]);
        break;
    }
    case QF_TYPE_BF16: {
        const uint16_t *h = src;
        for (int64_t i = 0; i < n; i++) dst[i] = qf_bf16_to_f32(h[i]);
        break;
    }
    case QF_TYPE_Q4_0: dequant_q4_0(src, dst, nb); break;
    case QF_TYPE_Q5_0: dequant_q5_0(src, dst, nb); break;
    case QF_TYPE_Q8_0: dequant_q8_0(src, dst, nb); break;
    case QF_TYPE_Q4_K: dequant_q4_K(src, dst, nb); break;
    case QF_TYPE_Q5_K: dequant_q5_K(src, dst, nb); break;
    case QF_TYPE_Q6_K: dequant_q6_K(src, dst, nb); break;
    case QF_TYPE_Q8_K: dequant_q8_K(src, dst, nb); break;
    default: break; /* unsupported: callers check qf_type_is_supported first */
    }
}

/* ---- scalar quantization (ggml's quantize_row_*_ref, round-to-nearest) ---- */

/* Index of the first element of largest magnitude (ggml keeps the first on ties). */
static int argmax_abs(const float *x, int n) {
    int best = 0;
    float amax = 0.0f;
    for (int j = 0; j < n; j++) {
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            best = j;
        }
    }
    return best;
}

static void quant_q4_0(const float *x, block_q4_0 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK) {
        /* the signed extreme maps to -8, so the full [-8, 7] range is used */
        const float d = x[argmax_abs(x, QK)] / -8;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = qf_f32_to_f16(d);
        for (int j = 0; j < QK / 2; j++) {
            int q0 = (int)(x[j] * id + 8.5f), q1 = (int)(x[j + QK / 2] * id + 8.5f);
            y[i].qs[j] = (uint8_t)((q0 < 15 ? q0 : 15) | ((q1 < 15 ? q1 : 15) << 4));
        }
    }
}

static void quant_q5_0(const float *x, block_q5_0 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK) {
        const float d = x[argmax_abs(x, QK)] / -16;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = qf_f32_to_f16(d);
        uint32_t qh = 0;
        for (int j = 0; j < QK / 2; j++) {
            int q0 = (int)(x[j] * id + 16.5f), q1 = (int)(x[j + QK / 2] * id + 16.5f);
            q0 = q0 < 31 ? q0 : 31;
            q1 = q1 < 31 ? q1 : 31;
            y[i].qs[j] = (uint8_t)((q0 & 0xF) | ((q1 & 0xF) << 4));
            qh |= (uint32_t)(q0 >> 4) << j;
            qh |= (uint32_t)(q1 >> 4) << (j + QK / 2);
        }
        memcpy(y[i].qh, &qh, 4);
    }
}

static void quant_q8_0(const float *x, block_q8_0 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK) {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = qf_f32_to_f16(d);
        for (int j = 0; j < QK; j++) y[i].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

/* Round half to even via the 1.5*2^23 trick, exactly as ggml's nearest_int. */
static int nearest_int(float v) {
    float f = v + 12582912.f;
    int32_t i;
    memcpy(&i, &f, 4);
    return (i & 0x007fffff) - 0x00400000;
}

static void quant_q8_K(const float *x, block_q8_K *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        const float max = x[argmax_abs(x, QK_K)];
        if (max == 0.0f) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -127.f / max;
        for (int j = 0; j < QK_K; j++) {
            int v = nearest_int(iscale * x[j]);
            y[i].qs[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int g = 0; g < QK_K / 16; g++) {
            int sum = 0;
            for (int j = 0; j < 16; j++) sum += y[i].qs[g * 16 + j];
            y[i].bsums[g] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
    }
}

bool qf_quantize_row_ref(qf_type t, const float *src, void *dst, int64_t n) {
    const int64_t blck = qf_type_block_elems(t);
    if (n < 0 || blck == 0 || n % blck != 0) return false;
    const int64_t nb = n / blck;
    switch (t) {
    case QF_TYPE_F32: memcpy(dst, src, (size_t)n * sizeof(float)); return true;
    case QF_TYPE_F16: {
        uint16_t *h = dst;
        for (int64_t i = 0; i < n; i++) h[i] = qf_f32_to_f16(src[i]);
        return true;
    }
    case QF_TYPE_BF16: {
        uint16_t *h = dst;
        for (int64_t i = 0; i < n; i++) h[i] = qf_f32_to_bf16(src[i]);
        return true;
    }
    case QF_TYPE_Q4_0: quant_q4_0(src, dst, nb); return true;
    case QF_TYPE_Q5_0: quant_q5_0(src, dst, nb); return true;
    case QF_TYPE_Q8_0: quant_q8_0(src, dst, nb); return true;
    case QF_TYPE_Q8_K: quant_q8_K(src, dst, nb); return true;
    default: return false;
    }
}

/* ---- scalar dot products ----
 * The quantized ones follow ggml: an exact integer dot product per block (per sub-block for
 * the K formats, weighted by the integer sub-block scales), then one float multiply by the
 * block scales. Float rows accumulate in double, as ggml's generic code does. */

static float dot_q4_0(const block_q4_0 *w, const block_q8_0 *x, int64_t nb) {
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int isum = 0;
        for (int j = 0; j < QK / 2; j++) {
            isum += ((w[i].qs[j] & 0xF) - 8) * x[i].qs[j];
            isum += ((w[i].qs[j] >> 4) - 8) * x[i].qs[j + QK / 2];
        }
        sum += isum * h2f(w[i].d) * h2f(x[i].d);
    }
    return sum;
}

static float dot_q5_0(const block_q5_0 *w, const block_q8_0 *x, int64_t nb) {
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        uint32_t qh;
        memcpy(&qh, w[i].qh, 4);
        int isum = 0;
        for (int j = 0; j < QK / 2; j++) {
            int h0 = (qh >> j) & 1, h1 = (qh >> (j + 16)) & 1;
            isum += (((w[i].qs[j] & 0xF) | (h0 << 4)) - 16) * x[i].qs[j];
            isum += (((w[i].qs[j] >> 4) | (h1 << 4)) - 16) * x[i].qs[j + QK / 2];
        }
        sum += isum * h2f(w[i].d) * h2f(x[i].d);
    }
    return sum;
}

static float dot_q8_0(const block_q8_0 *w, const block_q8_0 *x, int64_t nb) {
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int isum = 0;
        for (int j = 0; j < QK; j++) isum += w[i].qs[j] * x[i].qs[j];
        sum += isum * (h2f(w[i].d) * h2f(x[i].d));
    }
    return sum;
}

/* Q4_K/Q5_K: w = d*sc*q - dmin*m per sub-block, so the dot is
 * d*xd*sum_s(sc_s * q.x_s) - dmin*xd*sum_s(m_s * sum(x_s)), the latter from bsums. */
static float dot_q4_K(const block_q4_K *w, const block_q8_K *x, int64_t nb) {
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *q = w[i].qs;
        const int8_t *a = x[i].qs;
        int isum = 0, msum = 0;
        for (int s = 0; s < 8; s += 2, q += 32, a += 64) {
            uint8_t sc1, m1, sc2, m2;
            qf_k4_scale_min(s, w[i].scales, &sc1, &m1);
            qf_k4_scale_min(s + 1, w[i].scales, &sc2, &m2);
            int d1 = 0, d2 = 0;
            for (int l = 0; l < 32; l++) {
                d1 += (q[l] & 0xF) * a[l];
                d2 += (q[l] >> 4) * a[l + 32];
            }
            isum += sc1 * d1 + sc2 * d2;
            msum += m1 * (x[i].bsums[2 * s] + x[i].bsums[2 * s + 1]) +
                    m2 * (x[i].bsums[2 * s + 2] + x[i].bsums[2 * s + 3]);
        }
        sum += h2f(w[i].d) * x[i].d * isum - h2f(w[i].dmin) * x[i].d * msum;
    }
    return sum;
}

static float dot_q5_K(const block_q5_K *w, const block_q8_K *x, int64_t nb) {
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *ql = w[i].qs, *qh = w[i].qh;
        const int8_t *a = x[i].qs;
        int isum = 0, msum = 0;
        for (int s = 0; s < 8; s += 2, ql += 32, a += 64) {
            uint8_t sc1, m1, sc2, m2;
            qf_k4_scale_min(s, w[i].scales, &sc1, &m1);
            qf_k4_scale_min(s + 1, w[i].scales, &sc2, &m2);
            int d1 = 0, d2 = 0;
            for (int l = 0; l < 32; l++) {
                d1 += ((ql[l] & 0xF) | (((qh[l] >> s) & 1) << 4)) * a[l];
                d2 += ((ql[l] >> 4) | (((qh[l] >> (s + 1)) & 1) << 4)) * a[l + 32];
            }
            isum += sc1 * d1 + sc2 * d2;
            msum += m1 * (x[i].bsums[2 * s] + x[i].bsums[2 * s + 1]) +
                    m2 * (x[i].bsums[2 * s + 2] + x[i].bsums[2 * s + 3]);
        }
        sum += h2f(w[i].d) * x[i].d * isum - h2f(w[i].dmin) * x[i].d * msum;
    }
    return sum;
}

static float dot_q6_K(const block_q6_K *w, const block_q8_K *x, int64_t nb) {
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *ql = w[i].ql, *qh = w[i].qh;
        const int8_t *sc = w[i].scales, *a = x[i].qs;
        int isum = 0;
        for (int half = 0; half < 2; half++, ql += 64, qh += 32, sc += 8, a += 128) {
            int g[8] = {0}; /* per 16-element sub-block, in scale order */
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                g[is + 0] += (((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32) * a[l];
                g[is + 2] += (((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32) * a[l + 32];
                g[is + 4] += (((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32) * a[l + 64];
                g[is + 6] += (((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32) * a[l + 96];
            }
            for (int k = 0; k < 8; k++) isum += sc[k] * g[k];
        }
        sum += h2f(w[i].d) * x[i].d * isum;
    }
    return sum;
}

float qf_vec_dot_ref(qf_type t, int64_t n, const void *w, const void *x) {
    const int64_t blck = qf_type_block_elems(t);
    if (n <= 0 || blck == 0 || n % blck != 0) return 0.0f;
    const int64_t nb = n / blck;
    double acc = 0.0;
    switch (t) {
    case QF_TYPE_F32: {
        const float *a = w, *b = x;
        for (int64_t i = 0; i < n; i++) acc += (double)(a[i] * b[i]);
        return (float)acc;
    }
    case QF_TYPE_F16: {
        const uint16_t *a = w, *b = x;
        for (int64_t i = 0; i < n; i++) acc += (double)(qf_f16_to_f32(a[i]) * qf_f16_to_f32(b[i]));
        return (float)acc;
    }
    case QF_TYPE_BF16: {
        const uint16_t *a = w, *b = x;
        for (int64_t i = 0; i < n; i++) acc += (double)(qf_bf16_to_f32(a[i]) * qf_bf16_to_f32(b[i]));
        return (float)acc;
    }
    case QF_TYPE_Q4_0: return dot_q4_0(w, x, nb);
    case QF_TYPE_Q5_0: return dot_q5_0(w, x, nb);
    case QF_TYPE_Q8_0: return dot_q8_0(w, x, nb);
    case QF_TYPE_Q4_K: return dot_q4_K(w, x, nb);
    case QF_TYPE_Q5_K: return dot_q5_K(w, x, nb);
    case QF_TYPE_Q6_K: return dot_q6_K(w, x, nb);
    default: return 0.0f;
    }
}

/* ---- dispatch ---- */

static _Atomic bool force_scalar;

void qf_quant_force_scalar(bool on) { force_scalar = on; }

/* Checked once: cpuid serialises the pipeline and dispatch runs once per row. */
static bool cpu_has_avx2(void) {
    static _Atomic int cached = -1;
    int v = cached;
    if (v < 0) {
#if defined(__x86_64__) || defined(__i386__)
        /* clang's __builtin_cpu_supports does not know "f16c": ask cpuid (leaf 1, ecx bit 29) */
        unsigned a, b, c = 0, d;
        bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
        v = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
#else
        v = 0;
#endif
        cached = v;
    }
    return v == 1;
}

bool qf_quant_has_avx2(void) { return !force_scalar && cpu_has_avx2(); }

void qf_dequantize_row(qf_type t, const void *src, float *dst, int64_t n) {
    if (qf_quant_has_avx2() && qf_dequantize_row_avx2(t, src, dst, n)) return;
    qf_dequantize_row_ref(t, src, dst, n);
}

void qf_dequantize_rows(qf_type t, const void *src, size_t stride, int64_t n_rows, float *dst, int64_t n) {
    const uint8_t *s = src;
    const bool fast = qf_quant_has_avx2();
    for (int64_t r = 0; r < n_rows; r++, s += stride, dst += n)
        if (!fast || !qf_dequantize_row_avx2(t, s, dst, n)) qf_dequantize_row_ref(t, s, dst, n);
}

bool qf_quantize_row(qf_type t, const float *src, void *dst, int64_t n) {
    if (qf_quant_has_avx2() && qf_quantize_row_avx2(t, src, dst, n)) return true;
    return qf_quantize_row_ref(t, src, dst, n);
}

float qf_vec_dot(qf_type t, int64_t n, const void *w, const void *x) {
    float out;
    /* Q8_0 / Q4_0 on AVX-512 VNNI: two blocks per vpdpbusd (kernels/gemm.h) */
    if ((t == QF_TYPE_Q8_0 || t == QF_TYPE_Q4_0) && qf_gemm_isa_get() == QF_GEMM_ISA_AVX512) return qf_vec_dot_q8_avx512(t, n, w, x);
    if (qf_quant_has_avx2() && qf_vec_dot_avx2(t, n, w, x, &out)) return out;
    return qf_vec_dot_ref(t, n, w, x);
}
