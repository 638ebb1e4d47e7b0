/* canon.h: the canonical arithmetic, one definition for the CPU (C) and the GPU (CUDA).
 *
 * A context with qf_context_params.canonical computes every number in the order and with the
 * roundings written here, so that the CPU (any thread count; AVX-512, AVX2 or no SIMD) and the
 * GPU give the same bits, and a certificate is the same on either device (docs/gpu.md,
 * "Canonical arithmetic"). The definitions are the CPU's fast route where that route was
 * already exact and ISA-independent (the integer GEMMs, the AVX2 exp, the 8-lane double sums of
 * RMSNorm and the softmax), and new only where it was not (attention, which went through BLAS;
 * the exp of a row's tail, which was libm's; weights without an integer kernel, which went
 * through BLAS):
 *
 *   exp(x)        qf_canon_exp: Cephes' expf polynomial, as vecmath_avx2.c's exp8, every lane
 *   row sums      8 double lanes L[j] += (double)v[8m + j] over the whole groups of 8, then
 *                 ((L0 + L4) + (L2 + L6)) + ((L1 + L5) + (L3 + L7)), then the tail in order
 *   RMSNorm       ss by the row sum of x*x (f32 products); scale = 1 / sqrtf((float)(ss / n) + eps);
 *                 out = (x * scale) * g
 *   softmax       mx = max; e = exp(x - mx); sum by the row sum; x = e * (float)(1 / sum)
 *   SiLU * up     g / (1 + exp(-g)) * u
 *   RoPE          (x0 c - x1 s, x0 s + x1 c), each product rounded
 *   dot (f32)     acc = fmaf(a[k], b[k], acc) for k = 0, 1, ..., from acc = 0 (one chain)
 *   q8 GEMM step  acc = fmaf((float)isum_b, d_w * d_x, acc) per 32-block b (gemm.h)
 *   K GEMM step   acc = fmaf((float)isum_b, d * d_x, acc) [- fmaf(-(float)m_b, dmin * d_x, acc)]
 *   attention     s_t = dot(q, k_t) * scale for t <= the query's position; softmax; o[d] =
 *                 fmaf chain over t = 0..pos of p_t * v_t[d], from 0
 *
 * Every operation below is one IEEE operation rounded to nearest: on the device the intrinsics
 * keep nvcc from contracting a * b + c into an FMA (its default), on the host C11 mode keeps gcc
 * from doing so (-ffp-contract=off under -std=c11) and the pragma keeps clang from it. */
#ifndef QF_KERNELS_CANON_H
#define QF_KERNELS_CANON_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#if defined(__CUDACC__)
#define QF_CANON static __host__ __device__ inline
#else
#define QF_CANON static inline
#endif

#if defined(__CUDA_ARCH__)
#define CN_MUL(a, b) __fmul_rn((a), (b))
#define CN_ADD(a, b) __fadd_rn((a), (b))
#define CN_SUB(a, b) __fsub_rn((a), (b))
#define CN_DIV(a, b) __fdiv_rn((a), (b))
#define CN_FMA(a, b, c) __fmaf_rn((a), (b), (c))
#define CN_SQRT(a) __fsqrt_rn(a)
#define CN_DADD(a, b) __dadd_rn((a), (b))
#define CN_DDIV(a, b) __ddiv_rn((a), (b))
#else
#define CN_MUL(a, b) ((a) * (b))
#define CN_ADD(a, b) ((a) + (b))
#define CN_SUB(a, b) ((a) - (b))
#define CN_DIV(a, b) ((a) / (b))
#define CN_FMA(a, b, c) fmaf((a), (b), (c))
#define CN_SQRT(a) sqrtf(a)
#define CN_DADD(a, b) ((a) + (b))
#define CN_DDIV(a, b) ((a) / (b))
#endif

/* exp(x) = 2^k p(r), k = rint(x log2 e), r = x - k ln 2 (ln 2 in two parts), p Cephes' degree-6
 * polynomial; x below -87.3 gives 0, x is clamped to 88 above (vecmath_avx2.c's exp8 lane) */
QF_CANON float qf_canon_exp(float x) {
    const int under = x < -87.3f;
    x = fminf(fmaxf(x, -87.3f), 88.0f);
    const float k = rintf(CN_MUL(x, 1.44269504088896341f));
    float r = CN_FMA(-k, 0.693359375f, x);
    r = CN_FMA(-k, -2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = CN_FMA(p, r, 1.3981999507e-3f);
    p = CN_FMA(p, r, 8.3334519073e-3f);
    p = CN_FMA(p, r, 4.1665795894e-2f);
    p = CN_FMA(p, r, 1.6666665459e-1f);
    p = CN_FMA(p, r, 5.0000001201e-1f);
    const float r2 = CN_MUL(r, r);
    p = CN_FMA(p, r2, CN_ADD(r, 1.0f));
    const uint32_t eb = (uint32_t)((int32_t)k + 127) << 23;
    float e;
    memcpy(&e, &eb, 4);
    return under ? 0.0f : CN_MUL(p, e);
}

/* SiLU(g) * u */
QF_CANON float qf_canon_silu_mul(float g, float u) { return CN_MUL(CN_DIV(g, CN_ADD(1.0f, qf_canon_exp(-g))), u); }

/* the 8 double lanes of a row sum, combined as the AVX2 kernels' horizontal add */
QF_CANON double qf_canon_lanes(const double L[8]) {
    const double a0 = CN_DADD(L[0], L[4]), a1 = CN_DADD(L[1], L[5]), a2 = CN_DADD(L[2], L[6]),
                 a3 = CN_DADD(L[3], L[7]);
    return CN_DADD(CN_DADD(a0, a2), CN_DADD(a1, a3));
}

/* sum of (double)(x[i] * x[i]) (f32 products) in the canonical row-sum order */
QF_CANON double qf_canon_sumsq(const float *x, int n) {
    double L[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) L[j] = CN_DADD(L[j], (double)CN_MUL(x[i + j], x[i + j]));
    double s = qf_canon_lanes(L);
    for (; i < n; i++) s = CN_DADD(s, (double)CN_MUL(x[i], x[i]));
    return s;
}

/* RMSNorm's scale from the sum of squares */
QF_CANON float qf_canon_rms_scale(double ss, int n, float eps) {
    return CN_DIV(1.0f, CN_SQRT(CN_ADD((float)CN_DDIV(ss, (double)n), eps)));
}

QF_CANON void qf_canon_rmsnorm_row(float *out, const float *x, const float *g, int n, float eps) {
    const float scale = qf_canon_rms_scale(qf_canon_sumsq(x, n), n, eps);
    for (int i = 0; i < n; i++) out[i] = CN_MUL(CN_MUL(x[i], scale), g[i]);
}

/* sum of (double)exp(x[i] - mx) in the canonical row-sum order; e (may be x, or NULL) receives
 * the exponentials */
QF_CANON double qf_canon_sum_exp(const float *x, int n, float mx, float *e) {
    double L[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) {
            const float v = qf_canon_exp(CN_SUB(x[i + j], mx));
            if (e) e[i + j] = v;
            L[j] = CN_DADD(L[j], (double)v);
        }
    double s = qf_canon_lanes(L);
    for (; i < n; i++) {
        const float v = qf_canon_exp(CN_SUB(x[i], mx));
        if (e) e[i] = v;
        s = CN_DADD(s, (double)v);
    }
    return s;
}

/* softmax of x[0..n) in place, n >= 1 */
QF_CANON void qf_canon_softmax(float *x, int n) {
    float mx = -INFINITY;
    for (int i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    const float inv = (float)CN_DDIV(1.0, qf_canon_sum_exp(x, n, mx, x));
    for (int i = 0; i < n; i++) x[i] = CN_MUL(x[i], inv);
}

/* one RoPE pair (x0, x1) rotated by (c, s) */
QF_CANON void qf_canon_rope_pair(float *x0, float *x1, float c, float s) {
    const float a = *x0, b = *x1;
    *x0 = CN_SUB(CN_MUL(a, c), CN_MUL(b, s));
    *x1 = CN_ADD(CN_MUL(a, s), CN_MUL(b, c));
}

/* the f32 dot chain: fmaf over k in order from 0 (strides in floats) */
QF_CANON float qf_canon_dot(const float *a, const float *b, int n, int64_t sb) {
    float acc = 0.0f;
    for (int k = 0; k < n; k++) acc = CN_FMA(a[k], b[(int64_t)k * sb], acc);
    return acc;
}

/* forward.c's exact-key rule (kv-rq's f16 sinks and recent window): the query at position tq
 * reads key p < = tq exactly when p < n_sink or p > tq - n_window */
QF_CANON int qf_canon_exact(int p, int tq, int n_sink, int n_window) { return p < n_sink || p > tq - n_window; }

/* one block step of the integer GEMMs (gemm.h): acc + isum * (dw * dx), one rounding for the product
 * of the scales and one for the fma */
QF_CANON float qf_canon_q8_step(float acc, int32_t isum, float dw, float dx) {
    return CN_FMA((float)isum, CN_MUL(dw, dx), acc);
}

#endif
