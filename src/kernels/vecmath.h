/* vecmath.h: elementwise math on float arrays for the forward pass: exp in place (softmax,
 * SiLU). The _ref versions (libm's expf, in-order sums) are the reference route's oracles; the
 * fast versions compute canon.h's canonical arithmetic (Cephes' exp polynomial, 8-lane double row
 * sums): the AVX2/FMA kernels (vecmath_avx2.c, chosen at run time with the quant kernels' CPU
 * check) and the scalar fallbacks give the same bits, within 2e-7 relative of the oracles. */
#ifndef QF_VECMATH_H
#define QF_VECMATH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qforge/quant.h"

void qf_vec_exp(float *x, int n);     /* x[i] = exp(x[i]), fastest kernel this CPU runs */
void qf_vec_exp_ref(float *x, int n); /* the oracle: expf */
bool qf_vec_exp_avx2(float *x, int n); /* false when not built for AVX2 */

/* max of x[0..n) (-INFINITY for n == 0): exact, so every kernel returns the oracle's value (no NaN inputs) */
float qf_vec_max(const float *x, int n);
float qf_vec_max_ref(const float *x, int n);
/* sum over i < n of exp(x[i] - mx) in double. The oracle: expf, summed in order. The fast kernel: the
 * AVX2 exp (within 2e-7 of expf) on 8 lanes, summed in 8 double lanes then the tail: within ~1e-7
 * relative of the oracle (log-softmax of the PPL scores). */
double qf_vec_sum_exp(const float *x, int n, float mx);
double qf_vec_sum_exp_ref(const float *x, int n, float mx);
/* softmax in place: mx = max, x = exp(x - mx) (f32 subtraction), sum in double, x *= (float)(1 / sum).
 * The oracle: expf and an in-order double sum (the attention's arithmetic before this kernel); the
 * fast kernel: qf_vec_exp's exp (the same values as qf_vec_exp on the row) and the double sum in 8
 * lanes: within ~2e-7 relative of the oracle. n >= 1. */
void qf_softmax(float *x, int n);
void qf_softmax_ref(float *x, int n);
/* g[i] = g[i] / (1 + exp(-g[i])) * u[i] (SwiGLU), f32 operations in that order, the exp of qf_vec_exp
 * (the AVX2 one in 8-lane groups from i = 0, expf for a tail): bit-identical to negating g into a
 * buffer, qf_vec_exp on it and the same f32 loop, which is what the forward pass did before. */
void qf_vec_silu_mul(float *g, const float *u, int n);
/* RMSNorm of one row: ss = sum of (double)(x[i] * x[i]) (the product in f32), scale =
 * 1 / sqrtf((float)(ss / n) + eps), out[i] = x[i] * scale * g[i] (out may be x). The oracle sums in
 * order; the fast kernel in 8 double lanes (the only difference: the order of the double sum). */
void qf_rmsnorm_row(float *out, const float *x, const float *g, int n, float eps);
void qf_rmsnorm_row_ref(float *out, const float *x, const float *g, int n, float eps);
/* y[o] = sum_{i < n} A[o * lda + i] * x[i] for o < m: for each output an f32 product and an f32
 * sum in order over i, no fused multiply-add (kv-rq's V predictor, kv_cache.c; the GPU's
 * k_kv_rq_vres adds in the same order). The oracle: one chain per output. The fast kernel: eight
 * outputs in the eight AVX2 lanes (8 x 8 blocks of A transposed in registers), the tail of each
 * row and the last m % 8 outputs as the oracle: the same bits. */
void qf_vec_rows_dot(const float *A, size_t lda, int n, const float *x, int m, float *y);
void qf_vec_rows_dot_ref(const float *A, size_t lda, int n, const float *x, int m, float *y);
/* The AVX-512 kernel of qf_vec_rows_dot (dispatched where qf_gemm_nn_f32_fast): 16 outputs in the
 * 16 lanes, 16 x 16 blocks of A transposed in registers, two blocks of outputs side by side; the
 * tail of each row in order after its vector part, the last m % 16 outputs by the AVX2 kernel:
 * the same bits as the oracle. */
void qf_vec_rows_dot_avx512(const float *A, size_t lda, int n, const float *x, int m, float *y);
/* The same with double sums: y[o] = sum_{i < n} (double)A[o * lda + i] * (double)x[i], each
 * product exact (two floats), each sum in double in order over i (kv-rq format 3's transform,
 * kv_rq_klt.c; the GPU's k_klt_err and k_kv_rq_encode add in that order). The AVX2 kernel: four
 * outputs in the four double lanes, eight a step in two accumulators, 4 x 4 blocks transposed in
 * registers; the same bits as the oracle. */
void qf_vec_rows_dot_f64(const float *A, size_t lda, int n, const float *x, int m, double *y);
void qf_vec_rows_dot_f64_ref(const float *A, size_t lda, int n, const float *x, int m, double *y);
/* acc[i] += B[j * ldb + i] * y[j] for i < n, over j < m in order, skipping every j with y[j] == 0:
 * an f32 product then an f32 add, no fused multiply-add (kv-rq format 3's decoder, x = mean +
 * dec y through dec's transpose, kv_rq_klt.c; the GPU's k_kv_rq_expand adds in the same order).
 * The oracle: one element at a time. The fast kernel: eight elements in the eight AVX2 lanes, 32
 * kept in registers across every j, the last n % 8 as the oracle: the same bits. */
void qf_vec_cols_axpy(const float *B, size_t ldb, int m, const float *y, int n, float *acc);
void qf_vec_cols_axpy_ref(const float *B, size_t ldb, int m, const float *y, int n, float *acc);
/* acc[i] = acc[i] + B[j * ldb + i] * y[j] for i < n, over every j < m in order (none skipped): an
 * f32 product then an f32 add, no fused multiply-add (kv-rq's linear maps on weighted coefficient
 * sums, kv_rq_lin.c qf_kv_rq_lin_apply: out += T^T ysum). The oracle: one element at a time. The
 * fast kernel (vecmath_avx512.c, where qf_gemm_nn_f32_fast): 16 elements a lane vector, 128 of acc
 * kept in registers across every j: the same bits. */
void qf_vec_cols_axpy_dense(const float *B, size_t ldb, int m, const float *y, int n, float *acc);
void qf_vec_cols_axpy_dense_ref(const float *B, size_t ldb, int m, const float *y, int n, float *acc);
/* C[p][i] = bias[i] + sum_{k < m} A[p lda + k] B[k ldb + i] for p < n, i < w (row-major C = bias +
 * A B; bias NULL: 0): each element one chain, acc = fmaf(A, B, acc) over k in order from the bias.
 * For kv-rq's fast route (kv_rq_lin.c, forward.c): decoding a run of rows from their coefficients
 * (n rows, m coefficients, w = head_dim) and attention-weighted coefficient sums (n queries, m =
 * positions): shapes too small or too thin for OpenBLAS to pay for its packing. The fast kernel
 * (vecmath_avx512.c): two rows by up to 128 columns of C in registers, 16 lanes a vector: the
 * same bits as the oracle. qf_gemm_nn_f32_fast says whether it runs (AVX-512 F, qf_gemm_isa_get);
 * elsewhere qf_gemm_nn_f32 runs the oracle, so callers keep OpenBLAS for CPUs without it. */
void qf_gemm_nn_f32(int n, int m, int w, const float *A, size_t lda, const float *B, size_t ldb, const float *bias,
                    float *C, size_t ldc);
void qf_gemm_nn_f32_ref(int n, int m, int w, const float *A, size_t lda, const float *B, size_t ldb,
                        const float *bias, float *C, size_t ldc);
bool qf_gemm_nn_f32_fast(void);
/* C[p][i] = C[p][i] + sum_{k < m} A[p lda + k] B[k ldb + i] for p < n, i < w: qf_gemm_nn_f32's chain
 * continued from C's element (acc = C; acc = fmaf(A, B, acc) over k in order), so a product over
 * k split into consecutive pieces, C zeroed before the first, gives qf_gemm_nn_f32's bits with no
 * bias (forward.c's fused kv-rq coefficient sums: B looked up a few rows at a time, in cache).
 * The fast kernel: qf_gemm_nn_f32's blocks with their accumulators loaded from C; the same bits
 * as the oracle. */
void qf_gemm_nn_f32_acc(int n, int m, int w, const float *A, size_t lda, const float *B, size_t ldb, float *C,
                        size_t ldc);
void qf_gemm_nn_f32_acc_ref(int n, int m, int w, const float *A, size_t lda, const float *B, size_t ldb, float *C,
                            size_t ldc);
/* The attention of a decode step read straight from a KV cache's rows (forward.c), their type t
 * F16, Q8_0 or Q4_0 (qf_kv_rows_fast: the fast kernels run), rows `ld` bytes apart:
 *   qf_vec_rows_dot_kv: y[o] = sum_{i < n} A_o[i] x[i] for rows o < m, n a multiple of 32: 16
 *     lane sums (lane l over the i = l mod 16, fmaf in order), then lanes k and k + 8, k + 4,
 *     k + 2, k + 1 added in that order (the kernel's reduction);
 *   qf_gemm_nn_kv: C[p][i] = sum_{k < m} A[p lda + k] B_k[i], i < w (a multiple of 32), one fmaf
 *     chain per element from 0 (qf_gemm_nn_f32's).
 * A row's elements are those of qf_dequantize_row_ref (f16 exact; q8_0 q d, q4_0 (q - 8) d). The
 * oracles dequantize each row that way first; the AVX-512 kernels (vecmath_avx512.c) in
 * registers: the same bits. */
bool qf_kv_rows_fast(qf_type t);
void qf_vec_rows_dot_kv(qf_type t, const void *A, size_t ld, int n, const float *x, int m, float *y);
void qf_vec_rows_dot_kv_ref(qf_type t, const void *A, size_t ld, int n, const float *x, int m, float *y);
void qf_gemm_nn_kv(qf_type t, int n, int m, int w, const float *A, size_t lda, const void *B, size_t ld, float *C,
                   size_t ldc);
void qf_gemm_nn_kv_ref(qf_type t, int n, int m, int w, const float *A, size_t lda, const void *B, size_t ld, float *C,
                       size_t ldc);
/* n rows of variable-width codes read through a table (kv-rq's coefficients, kv_rq_lin.c): row r
 * starts at rows + r stride, its scale is sctab[its first byte] and its codes start `off` bytes
 * in; y[r ldy + k] = scale * tab[to[k] + ((the codes' bits from byte by[k], little endian) >>
 * sh[k] & mk[k])] for k < m. by nondecreasing, sh[k] + the code's width <= 16. The fast kernel
 * (vecmath_avx512.c, AVX-512 with VBMI: qf_bits_lookup_fast) takes 16 codes at a time, their
 * bytes by a permute of the row (a gather past 128 bytes: it then reads 4 bytes from code +
 * by[k], so 3 bytes past the last row's last code byte must be readable) and their values by
 * permutes of the table entries a group of 16 codes spans (<= 128 floats, n >= 4) or a gather.
 * Exact: the same table values times the scale, whichever kernel. */
void qf_bits_lookup(const uint8_t *rows, size_t stride, int n, int off, const float *sctab, int m, const int32_t *by,
                    const int32_t *sh, const int32_t *mk, const int32_t *to, const float *tab, float *y, size_t ldy);
void qf_bits_lookup_ref(const uint8_t *rows, size_t stride, int n, int off, const float *sctab, int m,
                        const int32_t *by, const int32_t *sh, const int32_t *mk, const int32_t *to, const float *tab,
                        float *y, size_t ldy);
bool qf_bits_lookup_fast(void);
/* RoPE on interleaved pairs (llama's layout): x[2i] = x0 cs[i] - x1 sn[i], x[2i+1] = x0 sn[i] +
 * x1 cs[i] for i < half, each product and the sum rounded in f32, no FMA (forward.c's
 * rope_rotate). The fast kernel (vecmath_avx512.c): 8 pairs a vector, the tables spread to
 * the pairs' lanes, the partner by an in-lane swap: the same bits. */
void qf_rope_pairs(float *x, const float *cs, const float *sn, int half);
void qf_rope_pairs_ref(float *x, const float *cs, const float *sn, int half);
/* internal: the AVX-512 kernels (vecmath_avx512.c) */
void qf_rope_pairs_avx512(float *x, const float *cs, const float *sn, int half);
void qf_bits_lookup_avx512(const uint8_t *rows, size_t stride, int n, int off, const float *sctab, int m,
                           const int32_t *by, const int32_t *sh, const int32_t *mk, const int32_t *to, const float *tab,
                           float *y, size_t ldy);
void qf_vec_cols_axpy_dense_avx512(const float *B, size_t ldb, int m, const float *y, int n, float *acc);
void qf_gemm_nn_f32_avx512(int n, int m, int w, const float *A, size_t lda, const float *B, size_t ldb,
                           const float *bias, float *C, size_t ldc);
void qf_gemm_nn_f32_acc_avx512(int n, int m, int w, const float *A, size_t lda, const float *B, size_t ldb, float *C,
                               size_t ldc);
void qf_gemm_nn_kv_avx512(qf_type t, int n, int m, int w, const float *A, size_t lda, const void *B, size_t ldb,
                          float *C, size_t ldc);
void qf_vec_rows_dot_kv_avx512(qf_type t, const void *A, size_t lda, int n, const float *x, int m, float *y);
/* acc[i] += w[j] * (X[j * ld + i] - Y[j * ld + i]) for i < n, over j < m in order: an f32
 * difference, product and add, no fused multiply-add (the attention's exact-key correction,
 * forward.c). The fast kernel: eight elements in the AVX2 lanes, 32 in registers across every
 * j, the tail as the oracle: the same bits. */
void qf_vec_axpy_diff(const float *X, const float *Y, size_t ld, int m, const float *w, int n, float *acc);
void qf_vec_axpy_diff_ref(const float *X, const float *Y, size_t ld, int m, const float *w, int n, float *acc);
/* out[i] = sum over j < m, in order, of c[j] * B[idx[j] * ldb + i] for i < n, from 0: an f32
 * product then an f32 add (a kv-dict row from its atoms, kv_codes.c). The fast kernel: eight
 * elements in the AVX2 lanes, 32 in registers across every j, the tail as the oracle: the same
 * bits. */
void qf_vec_gather_axpy(const float *B, size_t ldb, const int32_t *idx, const float *c, int m, int n, float *out);
void qf_vec_gather_axpy_ref(const float *B, size_t ldb, const int32_t *idx, const float *c, int m, int n, float *out);
/* kv-dict attention in the coefficient domain (forward.c): a key row is sum_j c_j atom[i_j], so
 * q . k = sum_j c_j P[i_j] with P = the query's dot products with the atoms. Codes are stored
 * slot-major: slot j of row t at idx[j * ld + t], coef[j * ld + t] (an unused slot: index 0,
 * coefficient 0). y[t] = sum over j < s, in order, of coef * P[idx] for t < m, from 0: an f32
 * product then an f32 add. The fast kernel: eight rows in the AVX2 lanes (P gathered), the last
 * m % 8 rows as the oracle: the same bits. */
void qf_vec_dict_scores(const float *P, const int32_t *idx, const float *coef, size_t ld, int s, int m, float *y);
void qf_vec_dict_scores_ref(const float *P, const int32_t *idx, const float *coef, size_t ld, int s, int m, float *y);
/* The values' side: W[idx[j * ld + t]] += w[t] * coef[j * ld + t] over j < s (outer) then t < m
 * (inner), in order, skipping every t with w[t] == 0: an f32 product then an f32 add (each
 * atom's total weight; the output is then sum_a W[a] atom[a]). Scalar only (a scatter). */
void qf_vec_dict_weights(const float *w, const int32_t *idx, const float *coef, size_t ld, int s, int m, float *W);
/* internal: the AVX2 kernels (vecmath_avx2.c) */
void qf_vec_dict_scores_avx2(const float *P, const int32_t *idx, const float *coef, size_t ld, int s, int m, float *y);
void qf_vec_gather_axpy_avx2(const float *B, size_t ldb, const int32_t *idx, const float *c, int m, int n, float *out);
void qf_vec_axpy_diff_avx2(const float *X, const float *Y, size_t ld, int m, const float *w, int n, float *acc);
void qf_vec_cols_axpy_avx2(const float *B, size_t ldb, int m, const float *y, int n, float *acc);
void qf_vec_rows_dot_f64_avx2(const float *A, size_t lda, int n, const float *x, int m, double *y);
void qf_vec_rows_dot_avx2(const float *A, size_t lda, int n, const float *x, int m, float *y);
void qf_vec_silu_mul_avx2(float *g, const float *u, int n);
void qf_rmsnorm_row_avx2(float *out, const float *x, const float *g, int n, float eps);
float qf_vec_max_avx2(const float *x, int n);
double qf_vec_sum_exp_avx2(const float *x, int n, float mx);
void qf_softmax_avx2(float *x, int n);

#endif
