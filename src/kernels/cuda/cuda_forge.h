/* cuda_forge.h: the forge's dense learning steps on the GPU, forwarded to the plugin
 * (cuda_loader.c); every call fails with QF_ERR_DEVICE when the plugin or a GPU is missing, so
 * a learner asks qf_cuda_available() first and keeps its CPU route for the rest. Pointers are
 * host memory. */
#ifndef QF_CUDA_FORGE_H
#define QF_CUDA_FORGE_H

#include <stdint.h>

#include "kernels/cuda/cuda_backend.h"
#include "qforge/error.h"

/* The Q4_0 block quantizers of learn_awq.c (QF_CUDA_AWQ_RTN: quant.c's round to nearest; DIAG:
 * the per-block scale search under a diagonal importance imp[D]; COV: the search under each
 * block's 32x32 input covariance cov[D/32][32][32], with the rounding descent). */
enum { QF_CUDA_AWQ_RTN = 0, QF_CUDA_AWQ_DIAG = 1, QF_CUDA_AWQ_COV = 2 };

/* One group's search state: the calibration rows X[n][D] and the stacked weight W[R][D]
 * uploaded, the reference output X W^T computed there (cuBLAS f32). D a multiple of 32.
 * QF_ERR_ARG for shapes out of range, QF_ERR_DEVICE for a CUDA failure (out of GPU memory
 * included); *out NULL then. */
qf_status qf_cuda_awq_group_new(const float *X, int64_t n, int64_t D, const float *W, int64_t R, qf_cuda_awq **out,
                                qf_error *err);
/* mse = || X W^T - X (Q(W s) / s)^T ||^2 / (n R) for the input-channel scales s[D] and the
 * quantizer `quant` (imp for DIAG, cov for COV, folded as learn_awq.c folds them). The
 * quantized weight is bit-identical to the CPU's; the sums are cuBLAS's and a fixed-order
 * double reduction, so mse agrees with the CPU's to ~1e-7 relative, not to the bit. */
qf_status qf_cuda_awq_group_mse(qf_cuda_awq *a, const float *s, int quant, const float *imp, const float *cov,
                                double *mse, qf_error *err);
void qf_cuda_awq_group_free(qf_cuda_awq *a); /* NULL is fine */
/* Quantize W[R][D] (times s[D] first when s is non-NULL) with `quant`: any of q4 (block_q4_0
 * [R][D/32]), ratio ([R][D/32], the chosen d over RTN's, 1 = RTN) and deq ([R][D], the
 * dequantized blocks divided by s) may be NULL. Bit-identical to learn_awq.c's quant_row. */
qf_status qf_cuda_awq_quantize(const float *W, int64_t R, int64_t D, const float *s, int quant, const float *imp,
                               const float *cov, void *q4, float *ratio, float *deq, qf_error *err);

/* kv-rq's learner (forge/learn_kv_rq.c, learn_kv_rq_klt.c): its dense double-precision loops.
 * Each output is one running sum over k in the host loop's order, every product and sum rounded
 * on its own, so every result is the host's bit for bit (test_cuda `op_rq_learn`). QF_ERR_ARG
 * for a NULL array or a shape out of range, QF_ERR_DEVICE for a CUDA failure (out of GPU memory
 * included); the outputs are then undefined. */

/* The centred Gram sums of x [n][dx] and y [n][dy] (learn_kv_rq.c gram_worker):
 * A[i][k] = sum_r (x[r][i] - mx[i]) (x[r][k] - mx[k]) for every i, k (both triangles),
 * B[i][k] = sum_r (x[r][i] - mx[i]) (y[r][k] - my[k]); A [dx][dx], B [dx][dy]. */
qf_status qf_cuda_learn_gram_f64(const float *x, const float *y, int64_t n, int dx, int dy, const double *mx,
                                 const double *my, double *A, double *B, qf_error *err);
/* L y = b, then L^T x = y, for each column of b [n][m] in place; L [n][n] row-major, its lower
 * triangle the Cholesky factor (learn_kv_rq.c chol_sub_worker). */
qf_status qf_cuda_learn_chol_sub_f64(const double *L, int n, double *b, int m, qf_error *err);
/* out[r][o] = (float)(y_r[o] - sum_i P[o][i] x_r[i] - mean[o]) for rows r < rows, with
 * y_r = y + r * stride * d and x_r likewise (P [d][d] f32; mean NULL: no mean term; the sum
 * starts at y_r[o] and subtracts each product: learn_kv_rq.c vres_worker, learn_kv_rq_klt.c
 * klt_unit). */
qf_status qf_cuda_learn_rows_minus_f64(const float *y, const float *x, int64_t rows, int64_t stride, int d,
                                       const float *P, const float *mean, float *out, qf_error *err);
/* d[r][k] = (y[r][k] - my[k]) - sum_i WT[k][i] xn[r][i] (the sum from 0; y [n][dy], xn [n][dx],
 * WT [dy][dx]; learn_kv_rq.c resid_worker). */
qf_status qf_cuda_learn_resid_f64(const float *y, const float *xn, int64_t n, int dx, int dy, const double *my,
                                  const double *WT, double *d, qf_error *err);
/* The KLT fit's codec-error measurement for one (layer, stream) (learn_kv_rq_klt.c klt_unit):
 * each row x' = x + mean encoded and decoded by format 3 at each width's coordinate widths and
 * levels, and by the Hadamard codec at the same bits, with the cache's device codecs (the host
 * codecs' bytes, test_cuda e2e_kv_rq); per row the error |enc (x' - x^)|^2 and the denominator
 * |enc x|^2, qf_kv_rq_klt_matvec's sums then the squares in i order: the host's doubles bit for
 * bit, which the caller adds over the rows in its own order. */
qf_status qf_cuda_learn_klt_measure(const qf_cuda_klt_measure *m, qf_error *err);

#endif
