/* cuda_backend.h: the seam between the CPU engine (forward.c) and the CUDA backend
 * (the .cu files under src/engine/cuda, built only when nvcc is present). Without CUDA, cuda_stub.c answers
 * "not available" so everything still builds and the CPU path runs. */
#ifndef QF_CUDA_BACKEND_H
#define QF_CUDA_BACKEND_H

#include "qforge/error.h"
#include "qforge/model.h"
#include "engine/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct qf_cuda_ctx qf_cuda_ctx;

bool qf_cuda_backend_available(void);
/* Whether the backend runs KV rotation `rot` (--kv-rot) in its cache; NONE always. When it
 * answers false, the one device decision (qf_context_new) keeps --device auto on the CPU and
 * refuses --device cuda. */
bool qf_cuda_backend_kv_rot_ok(qf_kv_rot rot);
/* Upload the model's weights in their stored types, allocate the KV cache and scratch for
 * the context (c->params: n_ctx, n_batch, kv modes). */
qf_status qf_cuda_ctx_new(qf_context *c, qf_cuda_ctx **out, qf_error *err);
void qf_cuda_ctx_free(qf_cuda_ctx *g);
/* Same contract as qf_decode; calls c->tap with K/V read back from GPU memory when set. */
qf_status qf_cuda_decode(qf_context *c, qf_cuda_ctx *g, const int32_t *tokens, int n, int pos0,
                         float *logits, int logits_from, qf_error *err);

/* Rebuild the GPU KV cache in the modes of kv (the context's CPU-side cache, or a fresh one
 * an artifact binding is about to swap in): int8 uploads kv's static scales, dict its
 * dictionaries (codes are encoded on the host by kv's encoder and decoded on the GPU). On
 * failure the GPU cache is left as it was. Cache contents are dropped. */
qf_status qf_cuda_ctx_set_kv(qf_cuda_ctx *g, const qf_kv_cache *kv, qf_error *err);

#ifdef __cplusplus
}
#endif
#endif
