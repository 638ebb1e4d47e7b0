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

#endif
