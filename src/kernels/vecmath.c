/* vecmath.c: dispatch of the elementwise kernels (see vecmath.h). */
#include <math.h>
#include <stdlib.h>

#include "kernels/canon.h"
#include "kernels/gemm.h"
#include "kernels/matvec.h"
#include "kernels/vecmath.h"
#include "qforge/quant.h"
#include "util/util.h"

void qf_vec_exp_ref(float *x, int n) {
    for (int i = 0; i < n; i++) x[i] = expf(x[i]);
}

/* the fast kernels' scalar fallbacks compute canon.h's canonical arithmetic, the same bits as
 * their AVX2 versions */
void qf_vec_exp(float *x, int n) {
    if (qf_quant_has_avx2() && qf_vec_exp_avx2(x, n)) return;
    for (int i = 0; i < n; i++) x[i] = qf_canon_exp(x[i]);
}

float qf_vec_max_ref(const float *x, int n) {
    float mx = -INFINITY;
    for (int i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    return mx;
}

double qf_vec_sum_exp_ref(const float *x, int n, float mx) {
    double sum = 0;
    for (int i = 0; i < n; i++) sum += expf(x[i] - mx);
    return sum;
}

void qf_softmax_ref(float *x, int n) {
    float mx = qf_vec_max_ref(x, n);
    for (int i = 0; i < n; i++) x[i] -= mx;
    qf_vec_exp_ref(x, n);
    double sum = 0;
    for (int i = 0; i < n; i++) sum += x[i];
    float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; i++) x[i] *= inv;
}

float qf_vec_max(const float *x, int n) { return qf_quant_has_avx2() ? qf_vec_max_avx2(x, n) : qf_vec_max_ref(x, n); }

double qf_vec_sum_exp(const float *x, int n, float mx) {
    return qf_quant_has_avx2() ? qf_vec_sum_exp_avx2(x, n, mx) : qf_canon_sum_exp(x, n, mx, NULL);
}

void qf_softmax(float *x, int n) {
    if (qf_quant_has_avx2()) qf_softmax_avx2(x, n);
    else qf_canon_softmax(x, n);
}

void qf_vec_silu_mul(float *g, const float *u, int n) {
    if (qf_quant_has_avx2()) qf_vec_silu_mul_avx2(g, u, n);
    else
        for (int i = 0; i < n; i++) g[i] = qf_canon_silu_mul(g[i], u[i]);
}

void qf_rmsnorm_row_ref(float *out, const float *x, const float *g, int n, float eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)(x[i] * x[i]);
    float scale = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * scale * g[i];
}

void qf_rmsnorm_row(float *out, const float *x, const float *g, int n, float eps) {
    if (qf_quant_has_avx2()) qf_rmsnorm_row_avx2(out, x, g, n, eps);
    else qf_canon_rmsnorm_row(out, x, g, n, eps);
}

void qf_vec_rows_dot_ref(const float *A, size_t lda, int n, const float *x, int m, float *y) {
    for (int o = 0; o < m; o++) {
        const float *a = A + (size_t)o * lda;
        float acc = 0;
        for (int i = 0; i < n; i++) acc += a[i] * x[i];
        y[o] = acc;
    }
}

void qf_vec_rows_dot(const float *A, size_t lda, int n, const float *x, int m, float *y) {
    if (qf_gemm_nn_f32_fast()) qf_vec_rows_dot_avx512(A, lda, n, x, m, y);
    else if (qf_quant_has_avx2()) qf_vec_rows_dot_avx2(A, lda, n, x, m, y);
    else qf_vec_rows_dot_ref(A, lda, n, x, m, y);
}

void qf_vec_cols_axpy_ref(const float *B, size_t ldb, int m, const float *y, int n, float *acc) {
    for (int j = 0; j < m; j++) {
        const float yj = y[j];
        if (yj == 0) continue;
        const float *b = B + (size_t)j * ldb;
        for (int i = 0; i < n; i++) acc[i] += b[i] * yj;
    }
}

void qf_vec_cols_axpy(const float *B, size_t ldb, int m, const float *y, int n, float *acc) {
    if (qf_quant_has_avx2()) qf_vec_cols_axpy_avx2(B, ldb, m, y, n, acc);
    else qf_vec_cols_axpy_ref(B, ldb, m, y, n, acc);
}

void qf_vec_cols_axpy_dense_ref(const float *B, size_t ldb, int m, const float *y, int n, float *acc) {
    for (int j = 0; j < m; j++) {
        const float yj = y[j], *b = B + (size_t)j * ldb;
        for (int i = 0; i < n; i++) acc[i] += b[i] * yj;
    }
}

void qf_vec_cols_axpy_dense(const float *B, size_t ldb, int m, const float *y, int n, float *acc) {
    if (qf_gemm_nn_f32_fast()) qf_vec_cols_axpy_dense_avx512(B, ldb, m, y, n, acc);
    else qf_vec_cols_axpy_dense_ref(B, ldb, m, y, n, acc);
}

void qf_vec_rows_dot_f64_ref(const float *A, size_t lda, int n, const float *x, int m, double *y) {
    for (int o = 0; o < m; o++) {
        const float *a = A + (size_t)o * lda;
        double acc = 0;
        for (int i = 0; i < n; i++) acc += (double)a[i] * (double)x[i];
        y[o] = acc;
    }
}

void qf_vec_rows_dot_f64(const float *A, size_t lda, int n, const float *x, int m, double *y) {
    if (qf_quant_has_avx2()) qf_vec_rows_dot_f64_avx2(A, lda, n, x, m, y);
    else qf_vec_rows_dot_f64_ref(A, lda, n, x, m, y);
}

void qf_gemm_nn_f32_ref(int n, int m, int w, const float *A, size_t lda, const float *B, size_t ldb,
                        const float *bias, float *C, size_t ldc) {
    for (int p = 0; p < n; p++)
        for (int i = 0; i < w; i++) {
            float acc = bias ? bias[i] : 0.0f;
            for (int k = 0; k < m; k++) acc = fmaf(A[(size_t)p * lda + k], B[(size_t)k * ldb + i], acc);
            C[(size_t)p * ldc + i] = acc;
        }
}

bool qf_gemm_nn_f32_fast(void) { return qf_gemm_isa_get() == QF_GEMM_ISA_AVX512; }

void qf_gemm_nn_f32(int n, int m, int w, const float *A, size_t lda, const float *B, size_t ldb, const float *bias,
                    float *C, size_t ldc) {
    if (qf_gemm_nn_f32_fast()) qf_gemm_nn_f32_avx512(n, m, w, A, lda, B, ldb, bias, C, ldc);
    else qf_gemm_nn_f32_ref(n, m, w, A, lda, B, ldb, bias, C, ldc);
}

void qf_gemm_nn_f32_acc_ref(int n, int m, int w, const float *A, size_t lda, const float *B, size_t ldb, float *C,
                            size_t ldc) {
    for (int p = 0; p < n; p++)
        for (int i = 0; i < w; i++) {
            float acc = C[(size_t)p * ldc + i];
            for (int k = 0; k < m; k++) acc = fmaf(A[(size_t)p * lda + k], B[(size_t)k * ldb + i], acc);
            C[(size_t)p * ldc + i] = acc;
        }
}

void qf_gemm_nn_f32_acc(int n, int m, int w, const float *A, size_t lda, const float *B, size_t ldb, float *C,
                        size_t ldc) {
    if (qf_gemm_nn_f32_fast()) qf_gemm_nn_f32_acc_avx512(n, m, w, A, lda, B, ldb, C, ldc);
    else qf_gemm_nn_f32_acc_ref(n, m, w, A, lda, B, ldb, C, ldc);
}

bool qf_bits_lookup_fast(void) { return qf_gemm_nn_f32_fast() && qf_cpu_has_vbmi(); }

void qf_bits_lookup_ref(const uint8_t *rows, size_t stride, int n, int off, const float *sctab, int m,
                        const int32_t *by, const int32_t *sh, const int32_t *mk, const int32_t *to, const float *tab,
                        float *y, size_t ldy) {
    for (int r = 0; r < n; r++) {
        const uint8_t *row = rows + (size_t)r * stride, *code = row + off;
        const float sc = sctab[row[0]];
        float *yr = y + (size_t)r * ldy;
        for (int k = 0; k < m; k++) {
            unsigned x = (unsigned)code[by[k]] | (unsigned)code[by[k] + 1] << 8;
            yr[k] = sc * tab[to[k] + (int32_t)((x >> sh[k]) & (unsigned)mk[k])];
        }
    }
}

void qf_bits_lookup(const uint8_t *rows, size_t stride, int n, int off, const float *sctab, int m, const int32_t *by,
                    const int32_t *sh, const int32_t *mk, const int32_t *to, const float *tab, float *y, size_t ldy) {
    if (qf_bits_lookup_fast()) qf_bits_lookup_avx512(rows, stride, n, off, sctab, m, by, sh, mk, to, tab, y, ldy);
    else qf_bits_lookup_ref(rows, stride, n, off, sctab, m, by, sh, mk, to, tab, y, ldy);
}

void qf_rope_pairs_ref(float *x, const float *cs, const float *sn, int half) {
    for (int i = 0; i < half; i++) {
        float x0 = x[2 * i], x1 = x[2 * i + 1];
        x[2 * i] = x0 * cs[i] - x1 * sn[i];
        x[2 * i + 1] = x0 * sn[i] + x1 * cs[i];
    }
}

void qf_rope_pairs(float *x, const float *cs, const float *sn, int half) {
    if (qf_gemm_nn_f32_fast()) qf_rope_pairs_avx512(x, cs, sn, half);
    else qf_rope_pairs_ref(x, cs, sn, half);
}

void qf_vec_axpy_diff_ref(const float *X, const float *Y, size_t ld, int m, const float *w, int n, float *acc) {
    for (int j = 0; j < m; j++) {
        const float a = w[j], *x = X + (size_t)j * ld, *y = Y + (size_t)j * ld;
        for (int i = 0; i < n; i++) acc[i] += a * (x[i] - y[i]);
    }
}

void qf_vec_axpy_diff(const float *X, const float *Y, size_t ld, int m, const float *w, int n, float *acc) {
    if (qf_quant_has_avx2()) qf_vec_axpy_diff_avx2(X, Y, ld, m, w, n, acc);
    else qf_vec_axpy_diff_ref(X, Y, ld, m, w, n, acc);
}

void qf_vec_gather_axpy_ref(const float *B, size_t ldb, const int32_t *idx, const float *c, int m, int n, float *out) {
    for (int i = 0; i < n; i++) out[i] = 0;
    for (int j = 0; j < m; j++) {
        const float a = c[j], *b = B + (size_t)idx[j] * ldb;
        for (int i = 0; i < n; i++) out[i] += a * b[i];
    }
}

void qf_vec_gather_axpy(const float *B, size_t ldb, const int32_t *idx, const float *c, int m, int n, float *out) {
    if (qf_quant_has_avx2()) qf_vec_gather_axpy_avx2(B, ldb, idx, c, m, n, out);
    else qf_vec_gather_axpy_ref(B, ldb, idx, c, m, n, out);
}

void qf_vec_dict_scores_ref(const float *P, const int32_t *idx, const float *coef, size_t ld, int s, int m, float *y) {
    for (int t = 0; t < m; t++) {
        float acc = 0;
        for (int j = 0; j < s; j++) acc += coef[(size_t)j * ld + t] * P[idx[(size_t)j * ld + t]];
        y[t] = acc;
    }
}

void qf_vec_dict_scores(const float *P, const int32_t *idx, const float *coef, size_t ld, int s, int m, float *y) {
    if (qf_quant_has_avx2()) qf_vec_dict_scores_avx2(P, idx, coef, ld, s, m, y);
    else qf_vec_dict_scores_ref(P, idx, coef, ld, s, m, y);
}

void qf_vec_dict_weights(const float *w, const int32_t *idx, const float *coef, size_t ld, int s, int m, float *W) {
    for (int j = 0; j < s; j++) {
        const int32_t *ij = idx + (size_t)j * ld;
        const float *cj = coef + (size_t)j * ld;
        for (int t = 0; t < m; t++)
            if (w[t] != 0) W[ij[t]] += w[t] * cj[t];
    }
}

bool qf_kv_rows_fast(qf_type t) {
    return (t == QF_TYPE_F16 || t == QF_TYPE_Q8_0 || t == QF_TYPE_Q4_0) && qf_gemm_nn_f32_fast();
}

void qf_gemm_nn_kv_ref(qf_type t, int n, int m, int w, const float *A, size_t lda, const void *B, size_t ld, float *C,
                       size_t ldc) {
    float *b = malloc(sizeof(float) * (size_t)(m > 0 ? m : 1) * (size_t)(w > 0 ? w : 1));
    QF_ASSERT(b != NULL);
    for (int k = 0; k < m; k++) qf_dequantize_row_ref(t, (const uint8_t *)B + (size_t)k * ld, b + (size_t)k * w, w);
    qf_gemm_nn_f32_ref(n, m, w, A, lda, b, (size_t)w, NULL, C, ldc);
    free(b);
}

void qf_gemm_nn_kv(qf_type t, int n, int m, int w, const float *A, size_t lda, const void *B, size_t ld, float *C,
                   size_t ldc) {
    if (qf_kv_rows_fast(t)) qf_gemm_nn_kv_avx512(t, n, m, w, A, lda, B, ld, C, ldc);
    else qf_gemm_nn_kv_ref(t, n, m, w, A, lda, B, ld, C, ldc);
}

void qf_vec_rows_dot_kv_ref(qf_type t, const void *A, size_t ld, int n, const float *x, int m, float *y) {
    float *r = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    QF_ASSERT(r != NULL);
    for (int o = 0; o < m; o++) {
        qf_dequantize_row_ref(t, (const uint8_t *)A + (size_t)o * ld, r, n);
        float l[16] = {0};
        for (int i = 0; i < n; i++) l[i % 16] = fmaf(r[i], x[i], l[i % 16]);
        for (int w = 8; w >= 1; w /= 2)
            for (int k = 0; k < w; k++) l[k] += l[k + w];
        y[o] = l[0];
    }
    free(r);
}

void qf_vec_rows_dot_kv(qf_type t, const void *A, size_t ld, int n, const float *x, int m, float *y) {
    if (qf_kv_rows_fast(t)) qf_vec_rows_dot_kv_avx512(t, A, ld, n, x, m, y);
    else qf_vec_rows_dot_kv_ref(t, A, ld, n, x, m, y);
}
