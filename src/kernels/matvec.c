/* matvec.c: the decode matvec's dispatch, activation preparation and scalar oracle (matvec.h has
 * the layouts; the kernels are in matvec_avx512.c). */
#include "kernels/matvec.h"

#include <cpuid.h>
#include <stdatomic.h>
#include <string.h>

#include "format/quant_blocks.h"
#include "kernels/gemm.h"
#include "util/util.h"

bool qf_cpu_has_vbmi(void) {
    static _Atomic int cached = -1;
    int v = cached;
    if (v < 0) {
        unsigned a, b, c = 0, d;
        v = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (c & (1u << 1));
        cached = v;
    }
    return v == 1;
}

bool qf_matvec_supported(qf_type wt, int64_t K) {
    if (K <= 0 || K % 128 != 0) return false;
    switch (wt) {
    case QF_TYPE_Q4_0: return qf_gemm_isa_get() == QF_GEMM_ISA_AVX512 && qf_cpu_has_vbmi(); /* not capped or forced scalar */
    case QF_TYPE_F16: return qf_gemm_f16_supported();
    case QF_TYPE_Q4_K:
    case QF_TYPE_Q5_K:
    case QF_TYPE_Q6_K: return K % 256 == 0 && qf_gemm_isa_get() == QF_GEMM_ISA_AVX512;
    default: return false;
    }
}

/* the K formats' activation: x quantized to Q8_K (qf_quantize_row's bits) block by block, laid
 * out for the kernels */
static void prepare_k(qf_type wt, const float *x, int64_t K, uint8_t *act) {
    for (int64_t b = 0; b < K / 256; b++) {
        block_q8_K q;
        qf_quantize_row(QF_TYPE_Q8_K, x + b * 256, &q, 256);
        if (wt == QF_TYPE_Q4_K || wt == QF_TYPE_Q5_K) {
            uint8_t *ab = act + b * MV_K4_BLOCK;
            /* [sub-blocks 0|2][1|3][4|6][5|7]: the order of the nibble halves of the two 64-byte loads */
            static const int sb[8] = {0, 2, 1, 3, 4, 6, 5, 7};
            for (int k = 0; k < 8; k++) memcpy(ab + 32 * k, q.qs + 32 * sb[k], 32);
            int16_t s32[8];
            for (int s = 0; s < 8; s++) s32[s] = (int16_t)(q.bsums[2 * s] + q.bsums[2 * s + 1]);
            memcpy(ab + MV_K4_SUMS, s32, sizeof s32);
            memcpy(ab + MV_K4_DX, &q.d, 4);
        } else {
            uint8_t *ab = act + b * MV_K6_BLOCK;
            memcpy(ab, q.qs, 256);
            int32_t c[64]; /* lane L of the 64-element chunk k: -8 * the sum of its 16-element group */
            for (int k = 0; k < 4; k++)
                for (int L = 0; L < 16; L++) c[16 * k + L] = -8 * q.bsums[4 * k + L / 4];
            memcpy(ab + MV_K6_CORR, c, sizeof c);
            memcpy(ab + MV_K6_DX, &q.d, 4);
        }
    }
}

size_t qf_matvec_act_bytes(qf_type wt, int64_t K) {
    switch (wt) {
    case QF_TYPE_Q4_0: return (size_t)(K / 128) * 256 + 64; /* + 64: room for the Q8_0 staging copy's tail */
    case QF_TYPE_F16: return ((size_t)K * 4 + 63) & ~(size_t)63;
    case QF_TYPE_Q4_K:
    case QF_TYPE_Q5_K: return (size_t)(K / 256) * MV_K4_BLOCK;
    case QF_TYPE_Q6_K: return (size_t)(K / 256) * MV_K6_BLOCK;
    default: return 0;
    }
}

void qf_matvec_prepare(qf_type wt, const float *x, int64_t K, void *act) {
    if (wt == QF_TYPE_Q4_K || wt == QF_TYPE_Q5_K || wt == QF_TYPE_Q6_K) {
        prepare_k(wt, x, K, act);
        return;
    }
    if (wt == QF_TYPE_F16) { /* ggml's F16 activation, kept as f32; through the (AVX2 / F16C) row converters,
                              * bit-exact with qf_f32_to_f16 / qf_f16_to_f32: 1 us instead of 30 at K = 8192 */
        float *o = act;
        uint16_t h[256];
        for (int64_t i = 0; i < K; i += 256) {
            int64_t m = K - i < 256 ? K - i : 256;
            qf_quantize_row(QF_TYPE_F16, x + i, h, m);
            qf_dequantize_row(QF_TYPE_F16, h, o + i, m);
        }
        return;
    }
    /* Q4_0: Q8_0 blocks (qf_quantize_row's bits), regrouped 4 blocks at a time */
    const int64_t nb = K / 32;
    block_q8_0 blk[4];
    uint8_t *a = act;
    for (int64_t g = 0; g < nb / 4; g++) {
        qf_quantize_row(QF_TYPE_Q8_0, x + g * 128, blk, 128);
        uint8_t *ag = a + g * 256;
        int32_t corr[16] = {0};
        float dx[16];
        for (int j = 0; j < 4; j++) {
            memcpy(ag + 16 * j, blk[j].qs, 16);
            memcpy(ag + 64 + 16 * j, blk[j].qs + 16, 16);
            int32_t s = 0;
            for (int k = 0; k < 32; k++) s += blk[j].qs[k];
            corr[4 * j] = -8 * s;
            for (int k = 0; k < 4; k++) dx[4 * j + k] = qf_f16_to_f32(blk[j].d);
        }
        memcpy(ag + 128, corr, sizeof corr);
        memcpy(ag + 192, dx, sizeof dx);
    }
}

void qf_matvec_rows(qf_type wt, const void *w, size_t row_bytes, int64_t K, int64_t r0, int64_t r1, const void *act,
                    float *y) {
    QF_ASSERT(qf_matvec_supported(wt, K));
    if (wt == QF_TYPE_Q4_0) qf_matvec_q4_0_avx512(w, row_bytes, K, r0, r1, act, y);
    else if (wt == QF_TYPE_F16) qf_matvec_f16_avx512(w, row_bytes, K, r0, r1, act, y);
    else qf_matvec_k_avx512(wt, w, row_bytes, K, r0, r1, act, y);
}

void qf_matvec_rows_ref(qf_type wt, const void *w, size_t row_bytes, int64_t K, int64_t r0, int64_t r1, const float *x,
                        float *y, void *xq) {
    qf_type vt = qf_vec_dot_type(wt);
    qf_quantize_row_ref(vt, x, xq, K);
    for (int64_t r = r0; r < r1; r++) y[r] = qf_vec_dot_ref(wt, K, (const uint8_t *)w + (size_t)r * row_bytes, xq);
}
