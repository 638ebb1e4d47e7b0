/* cuda_stub.c: the CUDA backend's entry points for builds without nvcc: nothing is available
 * and asking for the GPU is a clear error. */
#ifndef QF_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"

bool qf_cuda_backend_available(void) { return false; }

bool qf_cuda_backend_kv_rot_ok(qf_kv_rot rot) { return rot == QF_KV_ROT_NONE; }

qf_status qf_cuda_ctx_new(qf_context *c, qf_cuda_ctx **out, qf_error *err) {
    (void)c;
    *out = NULL;
    return qf_fail(err, QF_ERR_DEVICE, "this build of qforge has no CUDA backend (nvcc was not found at build time)");
}

void qf_cuda_ctx_free(qf_cuda_ctx *g) { (void)g; }

qf_status qf_cuda_decode(qf_context *c, qf_cuda_ctx *g, const int32_t *tokens, int n, int pos0,
                         float *logits, int logits_from, qf_error *err) {
    (void)c, (void)g, (void)tokens, (void)n, (void)pos0, (void)logits, (void)logits_from;
    return qf_fail(err, QF_ERR_DEVICE, "no CUDA backend in this build");
}

qf_status qf_cuda_ctx_set_kv(qf_cuda_ctx *g, const qf_kv_cache *kv, qf_error *err) {
    (void)g, (void)kv;
    return qf_fail(err, QF_ERR_DEVICE, "no CUDA backend in this build");
}
#else
typedef int qf_cuda_stub_unused; /* ISO C forbids an empty translation unit */
#endif
