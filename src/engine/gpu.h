/* gpu.h: the engine side of the CUDA seam (gpu.c). A context runs on the GPU when
 * qf_gpu_attach decided so; everything else asks qf_context_device(). */
#ifndef QF_ENGINE_GPU_H
#define QF_ENGINE_GPU_H

#include "engine/engine.h"
#include "kernels/cuda/cuda_backend.h"
#include "qforge/sample.h"

/* The one place that decides the device of a context (from c->params.device and
 * c->params.reference) and, for the GPU, builds the backend context (weights uploaded, KV
 * cache mirrored from c->kv). CPU: c->gpu stays NULL. --device cuda without a plugin or a GPU
 * is QF_ERR_DEVICE; auto falls back to the CPU. */
qf_status qf_gpu_attach(qf_context *c, qf_error *err);
/* Free the backend context, if any (c->gpu NULL afterwards). */
void qf_gpu_detach(qf_context *c);
/* qf_decode on the GPU (c->gpu must be set; arguments already validated by qf_decode). */
qf_status qf_gpu_decode(qf_context *c, const int32_t *tokens, int n, int pos0, float *logits, int logits_from,
                        qf_error *err);
/* qf_generate's sampler on the device: true when c runs on the GPU with no tap and sp reduces
 * there (greedy, or temp > 0 with 1 <= top_k <= QF_GPU_TOPK_MAX) */
bool qf_gpu_topk_ok(const qf_context *c, const qf_sampler_params *sp);
/* Decode one token at pos on the GPU with its logits reduced on the device instead of copied
 * (cuda_backend.h decode_topk: max, argmax, non-finite count; temp > 0 the sum of expf((l -
 * max) / temp) and the k largest). Checks what qf_decode checks (qf_decode_check). */
qf_status qf_gpu_decode_topk(qf_context *c, int32_t token, int pos, float temp, int k, qf_gpu_topk *out, qf_error *err);
/* Rebuild the GPU cache in the modes of kv (c->kv, or a fresh cache about to replace it: dict
 * rows are then encoded through c->kv once it is swapped in). No-op on the CPU. */
qf_status qf_gpu_set_kv(qf_context *c, const qf_kv_cache *kv, qf_error *err);
/* Decode tokens [0, n) at pos0 and score rows [from, n) on the device: nll[r - from] =
 * -log softmax(logits[r])[targets[r - from]] (f32 max, double sum of expf, as ppl.c's
 * log_softmax_tok). QF_ERR_DEVICE when c does not run on the GPU. */
qf_status qf_decode_nll(qf_context *c, const int32_t *tokens, int n, int pos0, int from, const int32_t *targets,
                        double *nll, qf_error *err);
/* Device memory of a GPU context; false (and *out zeroed) on the CPU. */
bool qf_context_gpu_info(const qf_context *c, qf_cuda_info *out);

/* Tests: decode positions [0, n_pos) of layer il of c's kv-rq cache (host rows) on the GPU, as
 * the CUDA backend reads them: k_out / v_out [n_pos][n_head_kv][head_dim], K as stored (before
 * RoPE where the cache keeps it so), V with its prediction. QF_ERR_DEVICE without a GPU. */
qf_status qf_gpu_op_kv_rq_decode(qf_context *c, int il, int n_pos, float *k_out, float *v_out, qf_error *err);
/* Tests: n_pos tokens k, v [n_pos][n_head_kv][head_dim] (K as c's cache stores it) encoded on the
 * GPU as the CUDA backend writes layer il's rows (V's prediction from the device-decoded K):
 * k_rows / v_rows get n_pos x n_head_kv rows of the layer's row bytes each. */
qf_status qf_gpu_op_kv_rq_encode(qf_context *c, int il, int n_pos, const float *k, const float *v, uint8_t *k_rows,
                                 uint8_t *v_rows, qf_error *err);

#endif
