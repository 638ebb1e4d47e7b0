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
 * writer stores as they are when the tensor's destination type is Q4_0. */
typedef const float *(*qf_tensor_override_fn)(void *user, const char *name, const void **q4_0);

/* Write src re-quantized to `type` (qf_quantize_model's rules) to out_path atomically.
 * override (may be NULL) supplies f32 contents for some tensors; with keep_float, overridden
 * 2-D tensors are written as F32 and every other tensor is copied unchanged (no quantization).
 * sha256 / tensor_sha256 (may be NULL) receive the SHA-256 of the file / of its data section. */
qf_status qf_forge_write_model(const qf_gguf *src, const char *out_path, qf_type type,
                               bool keep_float, qf_tensor_override_fn override, void *user,
                               int n_threads, uint8_t sha256[32], uint8_t tensor_sha256[32],
                               qf_error *err);

/* general.architecture is llama or qwen2 (QF_ERR_UNSUPPORTED naming the file otherwise). */
qf_status qf_forge_check_arch(const qf_gguf *g, qf_error *err);

#endif
