/* test_vecmath.c: the AVX2 exp against its scalar oracle (expf) over the range the softmax and
 * SiLU use, the flush to zero below -87.3 and saturation instead of overflow above 88. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/hadamard.h"
#include "kernels/canon.h"
#include "kernels/vecmath.h"
#include "qforge/quant.h"
#include "test.h"
#include "util/util.h"

/* a uniform double in [0, 1) from the xorshift state s: 53 random bits */
static double u01(uint64_t *s) { return (double)(qf_xorshift64s(s) >> 11) / 9007199254740992.0; }

TEST(exp_avx2_matches_expf) {
    if (!qf_quant_has_avx2()) SKIP("CPU without AVX2/FMA: the scalar oracle is what runs");
    int n = 1 << 20;
    float *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
    for (int i = 0; i < n; i++) a[i] = b[i] = -87.0f + 175.0f * (float)i / (float)n; /* [-87, 88) */
    qf_vec_exp_avx2(a, n);
    qf_vec_exp_ref(b, n);
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double r = fabs((double)a[i] - b[i]) / b[i];
        if (r > worst) worst = r;
    }
    printf("  max relative error vs expf: %.3e\n", worst);
    CHECK(worst < 2.5e-7);
    float edge[11] = {-1000.f, -88.f, -87.5f, 0.f, 1.f, -1.f, 88.0f, 89.f, 1000.f, -0.f, 0.5f};
    qf_vec_exp_avx2(edge, 11); /* the last three go through the scalar tail */
    CHECK(edge[0] == 0.0f && edge[1] == 0.0f && edge[2] == 0.0f);
    CHECK(edge[3] == 1.0f);
    CHECK(!isinf(edge[7]) && edge[7] > 1e38f); /* saturates at e^88 */
    CHECK_NEAR(edge[4], 2.718281828, 1e-6);
    free(a);
    free(b);
}

/* qf_vec_max exact, qf_vec_sum_exp and qf_softmax within their stated error of the oracles, over
 * lengths with and without a tail of < 8 (the attention rows: 1..512; a vocabulary row: 128256) */
TEST(softmax_and_sum_exp_match_oracles) {
    if (!qf_quant_has_avx2()) SKIP("CPU without AVX2/FMA: the scalar oracles are what runs");
    const int lens[] = {1, 7, 8, 9, 63, 64, 257, 512, 128256};
    uint64_t st = 99;
    for (size_t k = 0; k < sizeof lens / sizeof *lens; k++) {
        const int n = lens[k];
        float *x = malloc(sizeof(float) * n), *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
        for (int i = 0; i < n; i++) {
            st ^= st << 13, st ^= st >> 7, st ^= st << 17;
            x[i] = a[i] = b[i] = (float)(st >> 40) / 16777216.0f * 30.0f - 20.0f;
        }
        CHECK(qf_vec_max(x, n) == qf_vec_max_ref(x, n));
        const float mx = qf_vec_max_ref(x, n);
        const double sf = qf_vec_sum_exp(x, n, mx), sr = qf_vec_sum_exp_ref(x, n, mx);
        CHECK_MSG(fabs(sf - sr) / sr < 2.5e-7, "sum_exp n=%d: %.3e relative", n, fabs(sf - sr) / sr);
        qf_softmax(a, n);
        qf_softmax_ref(b, n);
        double worst = 0, tot = 0;
        for (int i = 0; i < n; i++) {
            double e = fabs((double)a[i] - b[i]) / (b[i] > 1e-30f ? b[i] : 1e-30);
            if (b[i] > 1e-30f && e > worst) worst = e;
            tot += a[i];
        }
        CHECK_MSG(worst < 5e-7, "softmax n=%d: %.3e relative", n, worst);
        CHECK_NEAR(tot, 1.0, 1e-5);
        free(x), free(a), free(b);
    }
    float one = 3.0f;
    qf_softmax(&one, 1);
    CHECK(one == 1.0f);
}

/* qf_vec_silu_mul bit-identical to the forward pass's former loops (negate, qf_vec_exp, divide,
 * multiply); qf_rmsnorm_row within float rounding of its in-order oracle */
TEST(silu_mul_and_rmsnorm_match) {
    if (!qf_quant_has_avx2()) SKIP("CPU without AVX2/FMA: the scalar oracles are what runs");
    const int lens[] = {1, 5, 8, 13, 64, 2048, 8192};
    uint64_t st = 7;
    for (size_t k = 0; k < sizeof lens / sizeof *lens; k++) {
        const int n = lens[k];
        float *g = malloc(sizeof(float) * n), *g2 = malloc(sizeof(float) * n), *u = malloc(sizeof(float) * n),
              *e = malloc(sizeof(float) * n), *o1 = malloc(sizeof(float) * n), *o2 = malloc(sizeof(float) * n);
        for (int i = 0; i < n; i++) {
            st ^= st << 13, st ^= st >> 7, st ^= st << 17;
            g[i] = g2[i] = (float)(st >> 40) / 16777216.0f * 40.0f - 20.0f;
            u[i] = (float)(st & 0xFFFF) / 65536.0f - 0.5f;
        }
        for (int i = 0; i < n; i++) e[i] = -g2[i];
        qf_vec_exp(e, n);
        for (int i = 0; i < n; i++) g2[i] = g2[i] / (1.0f + e[i]) * u[i];
        qf_rmsnorm_row_ref(o1, g, u, n, 1e-5f);
        qf_rmsnorm_row(o2, g, u, n, 1e-5f);
        double worst = 0;
        for (int i = 0; i < n; i++) {
            double d = fabs((double)o1[i] - o2[i]) / (fabs(o1[i]) + 1e-30);
            if (d > worst) worst = d;
        }
        CHECK_MSG(worst < 1e-6, "rmsnorm n=%d: %.3e relative", n, worst);
        qf_vec_silu_mul(g, u, n);
        CHECK_MSG(memcmp(g, g2, sizeof(float) * n) == 0, "silu_mul n=%d differs from the exp + loop form", n);
        free(g), free(g2), free(u), free(e), free(o1), free(o2);
    }
}

/* forced scalar, qf_vec_exp runs the canonical scalar exp (kernels/canon.h), the AVX2 lane's
 * arithmetic, not libm's expf (the _ref oracle) */
TEST(dispatch_follows_force_scalar) {
    float x[16], y[16];
    for (int i = 0; i < 16; i++) x[i] = y[i] = -3.0f + 0.37f * (float)i;
    qf_quant_force_scalar(true);
    qf_vec_exp(x, 16);
    qf_quant_force_scalar(false);
    for (int i = 0; i < 16; i++) y[i] = qf_canon_exp(y[i]);
    for (int i = 0; i < 16; i++) CHECK(x[i] == y[i]);
}

TEST(hadamard_matches_matrix_and_is_involution) {
    int sizes[] = {1, 2, 8, 32, 64, 128, 256};
    CHECK(!qf_hadamard_size_ok(0) && !qf_hadamard_size_ok(48) && !qf_hadamard_size_ok(-4));
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        int n = sizes[k];
        CHECK(qf_hadamard_size_ok(n));
        float x[256], y[256], z[256];
        double nx = 0, ny = 0;
        for (int i = 0; i < n; i++) {
            x[i] = z[i] = sinf(0.7f * (float)i + 0.3f) * (1.0f + (float)(i % 5));
            nx += (double)x[i] * x[i];
        }
        qf_hadamard_ref(x, y, n);
        qf_hadamard(z, n);
        for (int i = 0; i < n; i++) {
            CHECK_NEAR(z[i], y[i], 1e-5 * (1 + fabs(y[i])));
            ny += (double)z[i] * z[i];
        }
        CHECK_NEAR(ny, nx, 1e-4 * nx); /* orthogonal: the norm is kept */
        qf_hadamard(z, n);
        for (int i = 0; i < n; i++) CHECK_NEAR(z[i], x[i], 1e-5 * (1 + fabs(x[i]))); /* its own inverse */
    }
}

/* the f32-sum and double-sum row products of A [m][lda] (row length n) and x: how many of the
 * two kernels (AVX2 where it runs, else the dispatcher) differ from their oracles in any bit */
enum { RD_MAXN = 70, RD_MAXM = 35, RD_LDA = 77 };
static int rows_dot_differ(const float *A, const float *x, int n, int m) {
    float y0[RD_MAXM], y1[RD_MAXM];
    double d0[RD_MAXM], d1[RD_MAXM];
    qf_vec_rows_dot_ref(A, RD_LDA, n, x, m, y0);
    qf_vec_rows_dot_f64_ref(A, RD_LDA, n, x, m, d0);
    if (qf_quant_has_avx2()) {
        qf_vec_rows_dot_avx2(A, RD_LDA, n, x, m, y1);
        qf_vec_rows_dot_f64_avx2(A, RD_LDA, n, x, m, d1);
    } else {
        qf_vec_rows_dot(A, RD_LDA, n, x, m, y1);
        qf_vec_rows_dot_f64(A, RD_LDA, n, x, m, d1);
    }
    return (memcmp(y0, y1, sizeof(float) * (size_t)m) != 0) + (memcmp(d0, d1, sizeof(double) * (size_t)m) != 0);
}

/* qf_vec_cols_axpy: the AVX2 kernel (elements in the lanes, 32 kept in registers across the
 * columns) gives the oracle's bits (f32 product then add, column order, zero y skipped) for n
 * around multiples of 8 and 32 up to 130, a row stride wider than n, y with zeros and a -0; and
 * with infinities and NaN in B; forced scalar, the dispatcher runs the oracle */
enum { CA_MAXN = 130, CA_MAXM = 64, CA_LDB = 133 };
static int cols_axpy_differ(const float *B, const float *y, const float *acc0, int n, int m) {
    float a0[CA_MAXN], a1[CA_MAXN];
    memcpy(a0, acc0, sizeof(float) * (size_t)n), memcpy(a1, acc0, sizeof(float) * (size_t)n);
    qf_vec_cols_axpy_ref(B, CA_LDB, m, y, n, a0);
    if (qf_quant_has_avx2()) qf_vec_cols_axpy_avx2(B, CA_LDB, m, y, n, a1);
    else qf_vec_cols_axpy(B, CA_LDB, m, y, n, a1);
    return memcmp(a0, a1, sizeof(float) * (size_t)n) != 0;
}
TEST(cols_axpy_avx2_bit_identical) {
    static float B[CA_MAXM * CA_LDB], y[CA_MAXM], acc0[CA_MAXN];
    uint64_t s = 5;
    for (int i = 0; i < CA_MAXM * CA_LDB; i++) B[i] = (float)(u01(&s) - 0.5) * 3.0f;
    for (int i = 0; i < CA_MAXM; i++) y[i] = (float)(u01(&s) - 0.5) * 1e2f;
    for (int i = 0; i < CA_MAXN; i++) acc0[i] = (float)(u01(&s) - 0.5);
    y[2] = 0.0f, y[5] = -0.0f, y[11] = 0.0f; /* dropped coordinates */
    int bad = 0, runs = 0;
    static const int ns[] = {0, 1, 7, 8, 9, 31, 32, 33, 40, 64, 127, 128, 130}, ms[] = {0, 1, 3, 8, 17, 64};
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
        for (size_t b = 0; b < sizeof ms / sizeof *ms; b++) bad += cols_axpy_differ(B, y, acc0, ns[a], ms[b]), runs++;
    B[3] = INFINITY, B[CA_LDB + 40] = NAN, B[4 * CA_LDB + 3] = -INFINITY; /* element 3: inf - inf */
    bad += cols_axpy_differ(B, y, acc0, 128, 64), runs++;
    float a[128];
    memcpy(a, acc0, sizeof a);
    qf_vec_cols_axpy_ref(B, CA_LDB, 64, y, 128, a);
    CHECK(isnan(a[3]) && isnan(a[40]) && isfinite(a[4]));
    qf_quant_force_scalar(true);
    bad += cols_axpy_differ(B, y, acc0, 128, 64), runs++;
    qf_quant_force_scalar(false);
    printf("  %d shapes, %d differ from the oracle%s\n", runs, bad, qf_quant_has_avx2() ? "" : " (no AVX2: the dispatcher)");
    CHECK_EQ_INT(bad, 0);
}

/* qf_vec_rows_dot and its double-sum variant: the AVX2 kernels (outputs in the lanes, blocks
 * transposed in registers) give the oracles' bits (in-order sums, no FMA) for every shape: n
 * and m around multiples of 8, a row stride wider than n, then signed zeros, infinities and NaN
 * in the inputs; forced scalar, the dispatchers run the oracles */
TEST(rows_dot_avx2_bit_identical) {
    static float A[RD_MAXM * RD_LDA], x[RD_MAXN];
    uint64_t s = 3;
    for (int i = 0; i < RD_MAXM * RD_LDA; i++) A[i] = (float)(u01(&s) - 0.5) * 1e3f;
    for (int i = 0; i < RD_MAXN; i++) x[i] = (float)(u01(&s) - 0.5) * 1e-2f;
    int bad = 0, runs = 0;
    static const int ns[] = {0, 1, 7, 8, 9, 15, 16, 17, 64, 70}, ms[] = {0, 1, 7, 8, 9, 16, 17, 35};
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
        for (size_t b = 0; b < sizeof ms / sizeof *ms; b++) bad += rows_dot_differ(A, x, ns[a], ms[b]), runs++;
    x[1] = x[2] = x[5] = 1.0f, x[9] = 0.5f;
    A[3] = -0.0f, x[3] = 0.0f;                                   /* row 0: a -0 product */
    A[RD_LDA + 5] = INFINITY;                                    /* row 1: inf */
    A[2 * RD_LDA + 9] = NAN;                                     /* row 2: NaN */
    A[9 * RD_LDA + 1] = -INFINITY, A[9 * RD_LDA + 2] = INFINITY; /* row 9: inf - inf */
    bad += rows_dot_differ(A, x, 64, 16), runs++;
    float y[16];
    double d[16];
    qf_vec_rows_dot_ref(A, RD_LDA, 64, x, 16, y);
    qf_vec_rows_dot_f64_ref(A, RD_LDA, 64, x, 16, d);
    CHECK(isinf(y[1]) && isnan(y[2]) && isnan(y[9]) && isinf(d[1]) && isnan(d[2]) && isnan(d[9]));
    qf_quant_force_scalar(true);
    bad += rows_dot_differ(A, x, 64, 16), runs++;
    qf_quant_force_scalar(false);
    printf("  %d shapes x 2 kernels, %d differ from the oracles%s\n", runs, bad,
           qf_quant_has_avx2() ? "" : " (no AVX2 here: dispatchers only)");
    CHECK_EQ_INT(bad, 0);
}

/* The AVX-512 kernels of qf_vec_rows_dot (16 outputs in the lanes, 16 x 16 blocks transposed,
 * two blocks side by side, the AVX2 kernel for the last m % 16) and qf_vec_cols_axpy_dense (128
 * elements in registers, every coefficient taken, none skipped) give their oracles' bits on
 * random inputs: n and m around 16, 32 and 128 (tails of the lanes and of the transposed blocks),
 * strides wider than n, then zero coefficients (signed zeros in acc), infinities and NaN; the
 * memory past n (and past m outputs) is left untouched; forced scalar, the dispatchers run the
 * oracles. */
enum { R5_MAXM = 70, R5_MAXN = 260, R5_LDA = 263 };
static int rows_dot512_differ(const float *A, const float *x, int n, int m) {
    float y0[R5_MAXM + 1], y1[R5_MAXM + 1];
    for (int i = 0; i <= R5_MAXM; i++) y0[i] = y1[i] = -3.0f;
    qf_vec_rows_dot_ref(A, R5_LDA, n, x, m, y0);
    if (qf_gemm_nn_f32_fast()) qf_vec_rows_dot_avx512(A, R5_LDA, n, x, m, y1);
    else qf_vec_rows_dot(A, R5_LDA, n, x, m, y1);
    return memcmp(y0, y1, sizeof y0) != 0;
}
static int cols_dense_differ(const float *B, const float *y, const float *acc0, int n, int m) {
    float a0[R5_MAXN + 1], a1[R5_MAXN + 1];
    memcpy(a0, acc0, sizeof a0), memcpy(a1, acc0, sizeof a1);
    qf_vec_cols_axpy_dense_ref(B, R5_LDA, m, y, n, a0);
    if (qf_gemm_nn_f32_fast()) qf_vec_cols_axpy_dense_avx512(B, R5_LDA, m, y, n, a1);
    else qf_vec_cols_axpy_dense(B, R5_LDA, m, y, n, a1);
    return memcmp(a0, a1, sizeof a0) != 0;
}
TEST(rows_dot_cols_dense_avx512_bit_identical) {
    static float A[R5_MAXN * R5_LDA], x[R5_MAXN], acc0[R5_MAXN + 1];
    uint64_t s = 17;
    for (int i = 0; i < R5_MAXN * R5_LDA; i++) A[i] = (float)(u01(&s) - 0.5) * 1e3f;
    for (int i = 0; i < R5_MAXN; i++) x[i] = (float)(u01(&s) - 0.5) * 1e-2f;
    for (int i = 0; i <= R5_MAXN; i++) acc0[i] = (float)(u01(&s) - 0.5);
    int bad = 0, runs = 0;
    static const int ns[] = {0, 1, 15, 16, 17, 31, 32, 33, 100, 127, 128, 129, 160, 256, 260},
                     ms[] = {0, 1, 15, 16, 17, 31, 32, 33, 47, 48, 64, 70};
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
        for (size_t b = 0; b < sizeof ms / sizeof *ms; b++)
            bad += rows_dot512_differ(A, x, ns[a], ms[b]) + cols_dense_differ(A, x, acc0, ns[a], ms[b]), runs++;
    x[4] = 0.0f, x[6] = -0.0f, acc0[7] = -0.0f, acc0[8] = 0.0f;                /* zero coefficients, signed zeros */
    A[3] = INFINITY, A[R5_LDA + 40] = NAN, A[4 * R5_LDA + 3] = -INFINITY;       /* inf - inf, NaN */
    A[20 * R5_LDA + 17] = -INFINITY, A[33 * R5_LDA + 130] = NAN;
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++) bad += rows_dot512_differ(A, x, ns[a], 70), runs++;
    for (size_t b = 0; b < sizeof ms / sizeof *ms; b++) bad += cols_dense_differ(A, x, acc0, 260, ms[b]), runs++;
    float a0[R5_MAXN + 1];
    memcpy(a0, acc0, sizeof a0);
    qf_vec_cols_axpy_dense_ref(A, R5_LDA, 70, x, 260, a0);
    CHECK(isnan(a0[3]) && isnan(a0[40]) && isfinite(a0[5]) && a0[260] == acc0[260]);
    qf_quant_force_scalar(true);
    CHECK(!qf_gemm_nn_f32_fast());
    bad += rows_dot512_differ(A, x, 128, 70) + cols_dense_differ(A, x, acc0, 260, 70), runs++;
    qf_quant_force_scalar(false);
    printf("  %d shapes x 2 kernels, %d differ from the oracles%s\n", runs, bad,
           qf_gemm_nn_f32_fast() ? "" : " (no AVX-512: the dispatchers)");
    CHECK_EQ_INT(bad, 0);
}

/* qf_gemm_nn_f32: the AVX-512 kernel (6 rows x 64 columns of C in registers, the last vector
 * masked) gives the oracle's bits (one fmaf chain per element from the bias, k in order) for
 * rows, columns and k around its block sizes, strides wider than the widths, with and without a
 * bias, and with zeros, infinities and NaN in A and B; forced scalar, the dispatcher runs the
 * oracle. The memory past each row of C (its stride) is left untouched. */
enum { GN_MAXN = 13, GN_MAXM = 150, GN_MAXW = 290, GN_LDA = 151, GN_LDB = 293, GN_LDC = 297 };
static int gemm_nn_differ(const float *A, const float *B, const float *bias, int n, int m, int w) {
    static float c0[GN_MAXN * GN_LDC], c1[GN_MAXN * GN_LDC];
    for (int i = 0; i < GN_MAXN * GN_LDC; i++) c0[i] = c1[i] = -7.0f;
    qf_gemm_nn_f32_ref(n, m, w, A, GN_LDA, B, GN_LDB, bias, c0, GN_LDC);
    if (qf_gemm_nn_f32_fast()) qf_gemm_nn_f32_avx512(n, m, w, A, GN_LDA, B, GN_LDB, bias, c1, GN_LDC);
    else qf_gemm_nn_f32(n, m, w, A, GN_LDA, B, GN_LDB, bias, c1, GN_LDC);
    return memcmp(c0, c1, sizeof c0) != 0;
}
TEST(gemm_nn_f32_bit_identical) {
    static float A[GN_MAXN * GN_LDA], B[GN_MAXM * GN_LDB], bias[GN_LDB];
    uint64_t s = 9;
    for (int i = 0; i < GN_MAXN * GN_LDA; i++) A[i] = (float)(u01(&s) - 0.5) * 4.0f;
    for (int i = 0; i < GN_MAXM * GN_LDB; i++) B[i] = (float)(u01(&s) - 0.5) * 3.0f;
    for (int i = 0; i < GN_LDB; i++) bias[i] = (float)(u01(&s) - 0.5);
    A[3] = 0.0f, A[GN_LDA + 5] = -0.0f; /* dropped coefficients */
    int bad = 0, runs = 0;
    static const int ns[] = {0, 1, 2, 5, 6, 7, 12, 13}, ms[] = {0, 1, 17, 150}, ws[] = {1, 15, 16, 17, 63, 64, 65, 128, 130, 290};
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
        for (size_t b = 0; b < sizeof ms / sizeof *ms; b++)
            for (size_t c = 0; c < sizeof ws / sizeof *ws; c++)
                for (int bi = 0; bi < 2; bi++) bad += gemm_nn_differ(A, B, bi ? bias : NULL, ns[a], ms[b], ws[c]), runs++;
    B[7] = INFINITY, B[2 * GN_LDB + 40] = NAN, A[GN_LDA + 9] = -INFINITY;
    bad += gemm_nn_differ(A, B, bias, 13, 150, 130), runs++;
    qf_quant_force_scalar(true);
    CHECK(!qf_gemm_nn_f32_fast());
    bad += gemm_nn_differ(A, B, bias, 13, 150, 130), runs++;
    qf_quant_force_scalar(false);
    printf("  %d shapes, %d differ from the oracle%s\n", runs, bad,
           qf_gemm_nn_f32_fast() ? "" : " (no AVX-512: the dispatcher)");
    CHECK_EQ_INT(bad, 0);
}

/* qf_gemm_nn_f32_acc: the AVX-512 kernel gives the oracle's bits from any C (random values, with
 * zeros of both signs, an infinity and a NaN among them), for the shapes above; and a product split
 * over k into consecutive pieces (1, 7, 64, the rest), C zeroed first, gives qf_gemm_nn_f32's bits
 * with no bias (forward.c's fused kv-rq sums rely on it). The memory past each row of C is left
 * untouched. */
static int gemm_acc_differ(const float *A, const float *B, const float *C0, int n, int m, int w) {
    static float c0[GN_MAXN * GN_LDC], c1[GN_MAXN * GN_LDC], c2[GN_MAXN * GN_LDC], c3[GN_MAXN * GN_LDC];
    memcpy(c0, C0, sizeof c0), memcpy(c1, C0, sizeof c1);
    qf_gemm_nn_f32_acc_ref(n, m, w, A, GN_LDA, B, GN_LDB, c0, GN_LDC);
    if (qf_gemm_nn_f32_fast()) qf_gemm_nn_f32_acc_avx512(n, m, w, A, GN_LDA, B, GN_LDB, c1, GN_LDC);
    else qf_gemm_nn_f32_acc(n, m, w, A, GN_LDA, B, GN_LDB, c1, GN_LDC);
    int bad = memcmp(c0, c1, sizeof c0) != 0;
    /* pieces of k from zero against the whole product */
    for (int i = 0; i < GN_MAXN * GN_LDC; i++) c2[i] = -7.0f, c3[i] = -7.0f;
    for (int p = 0; p < n; p++) memset(c3 + (size_t)p * GN_LDC, 0, (size_t)w * sizeof(float));
    qf_gemm_nn_f32_ref(n, m, w, A, GN_LDA, B, GN_LDB, NULL, c2, GN_LDC);
    static const int piece[] = {1, 7, 64};
    int k0 = 0;
    for (int q = 0; k0 < m; q++) {
        const int len = q < 3 && piece[q] < m - k0 ? piece[q] : m - k0;
        qf_gemm_nn_f32_acc(n, len, w, A + k0, GN_LDA, B + (size_t)k0 * GN_LDB, GN_LDB, c3, GN_LDC);
        k0 += len;
    }
    return bad + (memcmp(c2, c3, sizeof c2) != 0);
}
TEST(gemm_nn_f32_acc_bit_identical) {
    static float A[GN_MAXN * GN_LDA], B[GN_MAXM * GN_LDB], C0[GN_MAXN * GN_LDC];
    uint64_t s = 21;
    for (int i = 0; i < GN_MAXN * GN_LDA; i++) A[i] = (float)(u01(&s) - 0.5) * 4.0f;
    for (int i = 0; i < GN_MAXM * GN_LDB; i++) B[i] = (float)(u01(&s) - 0.5) * 3.0f;
    for (int i = 0; i < GN_MAXN * GN_LDC; i++) C0[i] = (float)(u01(&s) - 0.5) * 2.0f;
    A[3] = 0.0f, A[GN_LDA + 5] = -0.0f, C0[1] = -0.0f, C0[2] = 0.0f;
    int bad = 0, runs = 0;
    static const int ns[] = {0, 1, 2, 4, 5, 6, 7, 13}, ms[] = {0, 1, 17, 64, 150}, ws[] = {1, 15, 16, 17, 64, 65, 128, 290};
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
        for (size_t b = 0; b < sizeof ms / sizeof *ms; b++)
            for (size_t c = 0; c < sizeof ws / sizeof *ws; c++) bad += gemm_acc_differ(A, B, C0, ns[a], ms[b], ws[c]), runs++;
    B[7] = INFINITY, B[2 * GN_LDB + 40] = NAN, C0[GN_LDC + 3] = -INFINITY, C0[4] = NAN;
    bad += gemm_acc_differ(A, B, C0, 13, 150, 130), runs++;
    qf_quant_force_scalar(true);
    CHECK(!qf_gemm_nn_f32_fast());
    bad += gemm_acc_differ(A, B, C0, 13, 150, 130), runs++;
    qf_quant_force_scalar(false);
    printf("  %d shapes, %d differ from the oracle or from the unsplit product%s\n", runs, bad,
           qf_gemm_nn_f32_fast() ? "" : " (no AVX-512: the dispatcher)");
    CHECK_EQ_INT(bad, 0);
}


/* qf_bits_lookup: the AVX-512 kernel gives the oracle's values for codes of widths 0..6 at every
 * bit offset, m around multiples of 16, on rows whose codes fit 128 bytes (the byte permute) and
 * on rows of 150 (the gather): rows back to back, each a scale byte then its codes, the last
 * ending 3 bytes before the buffer does (the kernel's reads stay inside: ASan checks it). Width
 * patterns (mode): 0 random 0..6 (groups spanning more than 512 table entries: the value
 * gathers), 1 all 6 (the code gather, 1024-entry spans), 2 falling as a KLT's (6 down to 0:
 * groups of every span, the permutes of 1 to 16 chunks and the gathers), 3 random 0..2 (narrow
 * spans, constant lanes), 4 all 4 and 5 all 5 (8 and 16 chunks, the widest permutes); NR rows
 * (>= 4: the kernel's permute plan; 65 and 130: more than one pass of 64 rows) or 3 (the gathers
 * alone) */
static int bits_lookup_differ(int mode, int NR, const int *ms, int nm) {
    enum { BM = 200, BTAB = BM * 64, NRMAX = 130 };
    static int32_t by[BM], sh[BM], mk[BM], to[BM];
    static float tab[BTAB], sctab[256], y0[NRMAX * BM], y1[NRMAX * BM];
    uint64_t s = 13 + (uint64_t)mode;
    unsigned bit = 0, nt = 0;
    for (int k = 0; k < BM; k++) {
        int w = mode == 1 ? 6 : mode == 2 ? (k < 168 ? 6 - k / 24 : 0) : mode == 3 ? (int)(qf_xorshift64s(&s) % 3)
                                                                              : mode >= 4 ? mode
                                                                              : (int)(qf_xorshift64s(&s) % 7);
        if (mode == 2 && k % 37 == 36) w = 0; /* a dropped coordinate among the coded ones */
        by[k] = (int32_t)(bit >> 3), sh[k] = (int32_t)(bit & 7), mk[k] = (1 << w) - 1;
        to[k] = (int32_t)(w ? nt : BTAB - 1);
        nt += w ? 1u << w : 0, bit += (unsigned)w;
    }
    for (int i = 0; i < BTAB; i++) tab[i] = (float)(u01(&s) - 0.5);
    tab[BTAB - 1] = 0.0f;
    for (int c = 0; c < 256; c++) sctab[c] = (float)c / 64.0f;
    const size_t stride = 1 + (bit + 7) / 8, nbuf = (size_t)NR * stride + 3;
    uint8_t *rows = malloc(nbuf);
    if (!rows) return 1;
    for (size_t i = 0; i < nbuf; i++) rows[i] = (uint8_t)qf_xorshift64s(&s);
    int bad = 0;
    for (int a = 0; a < nm; a++) {
        qf_bits_lookup_ref(rows, stride, NR, 1, sctab, ms[a], by, sh, mk, to, tab, y0, BM);
        if (qf_bits_lookup_fast()) qf_bits_lookup_avx512(rows, stride, NR, 1, sctab, ms[a], by, sh, mk, to, tab, y1, BM);
        else qf_bits_lookup(rows, stride, NR, 1, sctab, ms[a], by, sh, mk, to, tab, y1, BM);
        for (int r = 0; r < NR; r++)
            bad += memcmp(y0 + r * BM, y1 + r * BM, sizeof(float) * (size_t)ms[a]) != 0;
    }
    free(rows);
    return bad;
}
TEST(bits_lookup_bit_identical) {
    static const int ms[] = {0, 1, 15, 16, 17, 31, 33, 100, 150, 170, 200};
    const int nm = (int)(sizeof ms / sizeof *ms);
    int bad = 0, rows = 0;
    static const int nrs[] = {3, 6, 65, 130};
    for (int mode = 0; mode < 6; mode++)
        for (int q = 0; q < 4; q++) bad += bits_lookup_differ(mode, nrs[q], ms, nm), rows += nm * nrs[q];
    printf("  %d rows (6 width patterns, 11 lengths, 3, 6, 65 and 130 rows a call), %d differ from the oracle%s\n", rows, bad,
           qf_bits_lookup_fast() ? "" : " (no AVX-512 VBMI: the dispatcher)");
    CHECK_EQ_INT(bad, 0);
}

/* qf_rope_pairs: the AVX-512 kernel gives the oracle's bits for half around multiples of 8,
 * signed zeros among the inputs; forced scalar, the dispatcher runs the oracle */
TEST(rope_pairs_bit_identical) {
    enum { RH = 70 };
    static float x0[2 * RH + 1], cs[RH], sn[RH], a[2 * RH + 1], b[2 * RH + 1];
    uint64_t s = 17;
    for (int i = 0; i < 2 * RH + 1; i++) x0[i] = (float)(u01(&s) - 0.5) * 8.0f;
    for (int i = 0; i < RH; i++) {
        double t = u01(&s) * 6.283185307179586;
        cs[i] = (float)cos(t), sn[i] = (float)sin(t);
    }
    x0[4] = 0.0f, x0[5] = -0.0f, sn[2] = 0.0f, cs[3] = -0.0f;
    int bad = 0, runs = 0;
    static const int hs[] = {0, 1, 7, 8, 9, 16, 32, 63, 64, 70};
    for (int f = 0; f < 2; f++) {
        qf_quant_force_scalar(f == 1);
        for (size_t k = 0; k < sizeof hs / sizeof *hs; k++) {
            memcpy(a, x0, sizeof a), memcpy(b, x0, sizeof b);
            qf_rope_pairs_ref(a, cs, sn, hs[k]);
            if (qf_gemm_nn_f32_fast()) qf_rope_pairs_avx512(b, cs, sn, hs[k]);
            else qf_rope_pairs(b, cs, sn, hs[k]);
            bad += memcmp(a, b, sizeof a) != 0, runs++; /* the element past the pairs untouched too */
        }
    }
    qf_quant_force_scalar(false);
    printf("  %d lengths, %d differ from the oracle\n", runs, bad);
    CHECK_EQ_INT(bad, 0);
}

/* qf_vec_axpy_diff: the AVX2 kernel gives the oracle's bits for n around multiples of 8 and 32,
 * a row stride wider than n, signed zeros, infinities and NaN; forced scalar, the dispatcher
 * runs the oracle */
TEST(axpy_diff_bit_identical) {
    enum { AN = 130, AM = 40, ALD = 133 };
    static float X[AM * ALD], Y[AM * ALD], w[AM], acc0[AN], a0[AN], a1[AN];
    uint64_t s = 19;
    for (int i = 0; i < AM * ALD; i++) {
        X[i] = (float)(u01(&s) - 0.5) * 3.0f;
        Y[i] = (float)(u01(&s) - 0.5) * 3.0f;
    }
    for (int i = 0; i < AM; i++) w[i] = (float)(u01(&s));
    for (int i = 0; i < AN; i++) acc0[i] = (float)(u01(&s) - 0.5);
    w[3] = 0.0f, w[4] = -0.0f, X[5] = Y[5];
    int bad = 0, runs = 0;
    static const int ns[] = {0, 1, 7, 8, 9, 31, 32, 33, 64, 127, 128, 130}, ms[] = {0, 1, 5, 40};
    for (int f = 0; f < 3; f++) {
        if (f == 1) X[7] = INFINITY, Y[ALD + 9] = NAN;
        qf_quant_force_scalar(f == 2);
        for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
            for (size_t b = 0; b < sizeof ms / sizeof *ms; b++) {
                memcpy(a0, acc0, sizeof a0), memcpy(a1, acc0, sizeof a1);
                qf_vec_axpy_diff_ref(X, Y, ALD, ms[b], w, ns[a], a0);
                if (qf_quant_has_avx2()) qf_vec_axpy_diff_avx2(X, Y, ALD, ms[b], w, ns[a], a1);
                else qf_vec_axpy_diff(X, Y, ALD, ms[b], w, ns[a], a1);
                bad += memcmp(a0, a1, sizeof a0) != 0, runs++;
            }
    }
    qf_quant_force_scalar(false);
    printf("  %d shapes, %d differ from the oracle\n", runs, bad);
    CHECK_EQ_INT(bad, 0);
}

/* qf_vec_gather_axpy: the AVX2 kernel gives the oracle's bits for n around multiples of 8 and
 * 32, rows picked out of order and repeated, signed zeros, infinities and NaN; forced scalar, the
 * dispatcher runs the oracle */
TEST(gather_axpy_bit_identical) {
    enum { GN = 130, GR = 50, GLD = 131 };
    static float B[GR * GLD], c[16], o0[GN], o1[GN];
    static int32_t idx[16];
    uint64_t s = 29;
    for (int i = 0; i < GR * GLD; i++) B[i] = (float)(u01(&s) - 0.5) * 5.0f;
    for (int j = 0; j < 16; j++)
        idx[j] = (int32_t)(qf_xorshift64s(&s) % GR), c[j] = (float)(u01(&s) - 0.5);
    idx[3] = idx[1], c[4] = -0.0f;
    int bad = 0, runs = 0;
    static const int ns[] = {0, 1, 7, 8, 9, 31, 32, 33, 64, 127, 128, 130}, ms[] = {0, 1, 8, 16};
    for (int f = 0; f < 3; f++) {
        if (f == 1) B[(size_t)idx[2] * GLD + 5] = INFINITY, B[(size_t)idx[0] * GLD + 40] = NAN;
        qf_quant_force_scalar(f == 2);
        for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
            for (size_t b = 0; b < sizeof ms / sizeof *ms; b++) {
                memset(o0, 0xff, sizeof o0), memset(o1, 0xff, sizeof o1);
                qf_vec_gather_axpy_ref(B, GLD, idx, c, ms[b], ns[a], o0);
                if (qf_quant_has_avx2()) qf_vec_gather_axpy_avx2(B, GLD, idx, c, ms[b], ns[a], o1);
                else qf_vec_gather_axpy(B, GLD, idx, c, ms[b], ns[a], o1);
                bad += memcmp(o0, o1, sizeof o0) != 0, runs++;
            }
    }
    qf_quant_force_scalar(false);
    printf("  %d shapes, %d differ from the oracle\n", runs, bad);
    CHECK_EQ_INT(bad, 0);
}

/* qf_vec_dict_scores (kv-dict keys in the coefficient domain): the AVX2 kernel gives the oracle's
 * bits for row counts around multiples of 8, slot-major tables wider than the rows, sparsities 0
 * to 9, unused slots (index 0, coefficient 0), repeated indices, signed zeros, infinities and NaN
 * in P; forced scalar, the dispatcher runs the oracle. qf_vec_dict_weights (scalar only) against
 * a plain scatter loop in its documented order. */
TEST(dict_scores_bit_identical) {
    enum { DA = 40, DM = 70, DLD = 75, DS = 9 };
    static float P[DA], coef[DS * DLD], y0[DM], y1[DM], w[DM], W0[DA], W1[DA];
    static int32_t idx[DS * DLD];
    uint64_t s = 41;
    for (int a = 0; a < DA; a++) P[a] = (float)(u01(&s) - 0.5) * 7.0f;
    for (int i = 0; i < DS * DLD; i++) {
        idx[i] = (int32_t)(qf_xorshift64s(&s) % DA);
        coef[i] = (float)(u01(&s) - 0.5);
        if (i % 11 == 3) idx[i] = 0, coef[i] = 0; /* unused slots */
    }
    coef[5] = -0.0f, idx[DLD + 9] = idx[9];
    for (int t = 0; t < DM; t++) w[t] = t % 7 == 2 ? 0.0f : (float)(u01(&s));
    int bad = 0, runs = 0;
    static const int ms[] = {0, 1, 7, 8, 9, 15, 16, 17, 64, 70}, ss[] = {0, 1, 4, 8, 9};
    for (int f = 0; f < 3; f++) {
        if (f == 1) P[idx[2 * DLD + 4]] = INFINITY, P[idx[3]] = NAN;
        qf_quant_force_scalar(f == 2);
        for (size_t a = 0; a < sizeof ms / sizeof *ms; a++)
            for (size_t b = 0; b < sizeof ss / sizeof *ss; b++) {
                memset(y0, 0xff, sizeof y0), memset(y1, 0xff, sizeof y1);
                qf_vec_dict_scores_ref(P, idx, coef, DLD, ss[b], ms[a], y0);
                if (qf_quant_has_avx2()) qf_vec_dict_scores_avx2(P, idx, coef, DLD, ss[b], ms[a], y1);
                else qf_vec_dict_scores(P, idx, coef, DLD, ss[b], ms[a], y1);
                bad += memcmp(y0, y1, sizeof y0) != 0, runs++;
            }
    }
    qf_quant_force_scalar(false);
    printf("  %d shapes, %d differ from the oracle\n", runs, bad);
    CHECK_EQ_INT(bad, 0);
    memset(W0, 0, sizeof W0), memset(W1, 0, sizeof W1);
    qf_vec_dict_weights(w, idx, coef, DLD, DS, DM, W0);
    for (int j = 0; j < DS; j++)
        for (int t = 0; t < DM; t++)
            if (w[t] != 0) W1[idx[j * DLD + t]] += w[t] * coef[j * DLD + t];
    CHECK(memcmp(W0, W1, sizeof W0) == 0);
}

/* qf_vec_rows_dot_kv and qf_gemm_nn_kv (a KV cache's f16 / q8_0 / q4_0 rows read in place): the
 * AVX-512 kernels give the oracles' bits for rows around multiples of 4, widths of whole blocks
 * up to 160, rows strided wider than they are, values of every magnitude (subnormal halves
 * included); forced scalar, the oracles run */
TEST(kv_rows_kernels_bit_identical) {
    enum { FM = 37, FN = 160, FLDB = 400 }; /* FLDB: the rows' byte stride, past any type's 160 elements */
    static uint8_t A[FM * FLDB];
    static float x[FN], xr[FN], y0[FM], y1[FM], S[3 * FM], c0[3 * FN], c1[3 * FN];
    uint64_t s = 31;
    for (int i = 0; i < FN; i++) x[i] = (float)(u01(&s) - 0.5);
    for (int i = 0; i < 3 * FM; i++) S[i] = (float)(u01(&s));
    const qf_type ts[3] = {QF_TYPE_F16, QF_TYPE_Q8_0, QF_TYPE_Q4_0};
    int bad = 0, runs = 0;
    for (int ti = 0; ti < 3; ti++) {
        for (int o = 0; o < FM; o++) { /* each row: FN random values quantized to the type */
            for (int i = 0; i < FN; i++) {
                xr[i] = (float)(u01(&s) - 0.5) * 8.0f;
                if (i % 97 == 5) xr[i] *= 1e-5f;
            }
            qf_quantize_row_ref(ts[ti], xr, A + (size_t)o * FLDB, FN);
        }
        static const int ns[] = {32, 64, 128, 160}, ms[] = {0, 1, 3, 4, 5, 37};
        for (int f = 0; f < 2; f++) {
            qf_quant_force_scalar(f == 1);
            for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
                for (size_t b = 0; b < sizeof ms / sizeof *ms; b++) {
                    memset(y0, 0xff, sizeof y0), memset(y1, 0xff, sizeof y1);
                    qf_vec_rows_dot_kv_ref(ts[ti], A, FLDB, ns[a], x, ms[b], y0);
                    if (qf_kv_rows_fast(ts[ti])) qf_vec_rows_dot_kv_avx512(ts[ti], A, FLDB, ns[a], x, ms[b], y1);
                    else qf_vec_rows_dot_kv(ts[ti], A, FLDB, ns[a], x, ms[b], y1);
                    bad += memcmp(y0, y1, sizeof y0) != 0, runs++;
                }
            static const int ws[] = {32, 64, 96, 128, 160};
            for (int nq = 1; nq <= 3; nq++)
                for (size_t a = 0; a < sizeof ws / sizeof *ws; a++) {
                    memset(c0, 0xff, sizeof c0), memset(c1, 0xff, sizeof c1);
                    qf_gemm_nn_kv_ref(ts[ti], nq, FM, ws[a], S, FM, A, FLDB, c0, FN);
                    if (qf_kv_rows_fast(ts[ti])) qf_gemm_nn_kv_avx512(ts[ti], nq, FM, ws[a], S, FM, A, FLDB, c1, FN);
                    else qf_gemm_nn_kv(ts[ti], nq, FM, ws[a], S, FM, A, FLDB, c1, FN);
                    bad += memcmp(c0, c1, sizeof c0) != 0, runs++;
                }
        }
        qf_quant_force_scalar(false);
    }
    printf("  %d shapes (f16, q8_0, q4_0), %d differ from the oracles\n", runs, bad);
    CHECK_EQ_INT(bad, 0);
}

int main(void) {
    RUN(hadamard_matches_matrix_and_is_involution);
    RUN(exp_avx2_matches_expf);
    RUN(dispatch_follows_force_scalar);
    RUN(rows_dot_avx2_bit_identical);
    RUN(cols_axpy_avx2_bit_identical);
    RUN(rows_dot_cols_dense_avx512_bit_identical);
    RUN(gemm_nn_f32_bit_identical);
    RUN(gemm_nn_f32_acc_bit_identical);
    RUN(bits_lookup_bit_identical);
    RUN(rope_pairs_bit_identical);
    RUN(axpy_diff_bit_identical);
    RUN(gather_axpy_bit_identical);
    RUN(dict_scores_bit_identical);
    RUN(kv_rows_kernels_bit_identical);
    RUN(softmax_and_sum_exp_match_oracles);
    RUN(silu_mul_and_rmsnorm_match);
    return test_summary();
}
