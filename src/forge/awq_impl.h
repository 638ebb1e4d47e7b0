/* awq_impl.h: forge-internal glue between quantize.c (the GGUF re-quantizing writer) and
 * learn_awq.c (which hands it folded f32 tensors). Not public API. */
#ifndef QF_AWQ_IMPL_H
#define QF_AWQ_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "qforge/awq.h"
#include "qforge/gguf.h"

/* Replacement f32 contents of a tensor (same shape), or NULL to use the source tensor. When the
 * learner quantized the tensor itself it also sets *q4_0 to the tensor's Q4_0 rows, which the
 * writer stores as they are when the tensor's destination type is Q4_0; the f32 contents may
 * then be NULL (the learner freed them: an 8B model's f32 copies are 28 GB), and a destination
 * other than Q4_0 is an error. */
typedef const float *(*qf_tensor_override_fn)(void *user, const char *name, const void **q4_0);

/* Write src re-quantized to `type` (qf_quantize_model's rules) to out_path atomically.
 * override (may be NULL) supplies f32 contents for some tensors; with keep_float, overridden
 * 2-D tensors are written as F32 and every other tensor is copied unchanged (no quantization).
 * sha256 / tensor_sha256 (may be NULL) receive the SHA-256 of the file / of its data section. */
qf_status qf_forge_write_model(const qf_gguf *src, const char *out_path, qf_type type,
                               bool keep_float, qf_tensor_override_fn override, void *user,
                               int n_threads, uint8_t sha256[32], uint8_t tensor_sha256[32],
                               qf_error *err);

/* The CPU's Q4_0 block quantizer of learn_awq.c on R rows of W[R][D] (D a multiple of 32), each
 * row multiplied by s[D] first when s is non-NULL: quant 0 = RTN, 1 = the scale search under
 * imp[D], 2 = the search under cov[D/32][32][32] with the rounding descent. Any of q4
 * ([R][D/32] blocks), ratio ([R][D/32]: chosen d / RTN's d) and deq ([R][D]: the dequantized
 * blocks divided by s) may be NULL. It runs the learner's own row quantizer, the oracle
 * test_cuda holds the GPU's (qf_cuda_awq_quantize) to, byte for byte. QF_ERR_NOMEM when its
 * row buffer cannot be allocated. */
qf_status qf_awq_quant_rows(const float *W, int64_t R, int64_t D, const float *s, int quant, const float *imp,
                            const float *cov, void *q4, float *ratio, float *deq);

/* general.architecture is llama or qwen2 (QF_ERR_UNSUPPORTED naming the file otherwise). */
qf_status qf_forge_check_arch(const qf_gguf *g, qf_error *err);

#endif
