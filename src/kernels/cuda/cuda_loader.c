/* cuda_loader.c: finds and loads the CUDA backend plugin (libqforge-cuda.so) at the first GPU
 * use, and forwards the single-op entry points of cuda_ops.h to its function table.
 *
 * The plugin is looked for, in order: $QF_CUDA_PLUGIN (a path, for tests and odd installs);
 * next to the code that holds this loader (the executable, or libqforge.so) and one folder up
 * (build/tests/x -> build/); in ../lib beside it (PREFIX/bin/qforge -> PREFIX/lib); in the
 * install folder the build was configured with (QF_PLUGIN_DIR); then by the dynamic loader's
 * own search (LD_LIBRARY_PATH, ld.so.cache). Nothing here links CUDA: a process that never
 * asks for the GPU never maps cudart or cuBLAS. */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_forge.h"
#include "kernels/cuda/cuda_ops.h"
#include "qforge/quant.h"

#define PLUGIN_NAME "libqforge-cuda.so"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static const qf_cuda_api *api;
static char why_not[512] = "the CUDA backend was not loaded";

/* try one path; true when it loaded and answered with the right ABI */
static int try_open(const char *path) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        /* a plugin that exists but fails to load (missing cudart, say) is the reason to report;
         * a path where there is none is not */
        if ((!strchr(path, '/') || access(path, F_OK) == 0) && !strstr(why_not, "cannot"))
            snprintf(why_not, sizeof why_not, "%s", e ? e : path);
        return 0;
    }
    const qf_cuda_api *(*get)(int) = (const qf_cuda_api *(*)(int))dlsym(h, "qf_cuda_plugin_api");
    const qf_cuda_api *a = get ? get(QF_CUDA_ABI) : NULL;
    if (!a || a->abi != QF_CUDA_ABI) {
        snprintf(why_not, sizeof why_not, "%s was built for another version of qforge (ABI %d expected)", path,
                 QF_CUDA_ABI);
        dlclose(h);
        return 0;
    }
    api = a;
    return 1;
}

static void load(void) {
    snprintf(why_not, sizeof why_not, "%s not found (this build of qforge has no CUDA backend, or it is not installed)",
             PLUGIN_NAME);
    const char *env = getenv("QF_CUDA_PLUGIN");
    /* No GPU device node: do not map the plugin at all. Loading it maps cudart and cuBLAS
     * (~600 MB of address space for libcublasLt alone) just to learn that no GPU answers, which
     * made `--device auto` CPU runs fail under `ulimit -v` 1 GB (OpenBLAS then waited forever
     * for its work buffer). An explicit QF_CUDA_PLUGIN is still tried. */
    if (!(env && *env) && access("/dev/nvidiactl", F_OK) != 0 && access("/dev/nvidia0", F_OK) != 0 &&
        access("/dev/dxg", F_OK) != 0) {
        snprintf(why_not, sizeof why_not, "no NVIDIA GPU device on this machine (/dev/nvidia*)");
        return;
    }
    if (env && *env) {
        try_open(env); /* why_not says why it did not load */
        return; /* an explicit path is the only one tried */
    }
    char dir[PATH_MAX], path[PATH_MAX + 64];
    Dl_info info;
    if (dladdr((void *)&load, &info) && info.dli_fname) {
        snprintf(dir, sizeof dir, "%s", info.dli_fname);
        char *slash = strrchr(dir, '/');
        if (slash) {
            *slash = 0;
            const char *rel[] = {"", "/..", "/../lib"};
            for (int i = 0; i < 3; i++) {
                snprintf(path, sizeof path, "%s%s/%s", dir, rel[i], PLUGIN_NAME);
                if (try_open(path)) return;
            }
        }
    }
#ifdef QF_PLUGIN_DIR
    snprintf(path, sizeof path, "%s/%s", QF_PLUGIN_DIR, PLUGIN_NAME);
    if (try_open(path)) return;
#endif
    try_open(PLUGIN_NAME);
}

const qf_cuda_api *qf_cuda_api_get(const char **why) {
    pthread_once(&once, load);
    if (!api && why) *why = why_not;
    return api;
}

bool qf_cuda_backend_available(void) {
    const qf_cuda_api *a = qf_cuda_api_get(NULL);
    return a && a->available();
}

bool qf_cuda_backend_kv_rot_ok(qf_kv_rot rot) { return rot == QF_KV_ROT_NONE || rot == QF_KV_ROT_HADAMARD; }

/* ---- cuda_ops.h: forwarded to the plugin ---- */

static const qf_cuda_api *need(qf_error *err) {
    const char *why = NULL;
    const qf_cuda_api *a = qf_cuda_api_get(&why);
    if (!a) {
        qf_fail(err, QF_ERR_DEVICE, "CUDA backend not available: %s", why);
        return NULL;
    }
    if (!a->available()) {
        qf_fail(err, QF_ERR_DEVICE, "CUDA backend not available: no CUDA GPU answers");
        return NULL;
    }
    return a;
}
#define NEED_API()                      \
    const qf_cuda_api *a = need(err);   \
    if (!a) return QF_ERR_DEVICE

qf_status qf_cuda_op_dequant(qf_type t, const void *src, int64_t rows, int64_t k, float *dst, qf_error *err) {
    NEED_API();
    return a->op_dequant(t, src, qf_row_bytes(t, k), rows, k, dst, err);
}
qf_status qf_cuda_op_matmul(const qf_weight *w, const float *x, int n, float *y, qf_cuda_mm_route route,
                            qf_error *err) {
    NEED_API();
    return a->op_matmul(w, x, n, y, (int)route, err);
}
qf_status qf_cuda_op_rmsnorm(const float *x, const float *g, int n, int d, float eps, float *out, int act, void *xq,
                             void *xq_ref, qf_error *err) {
    NEED_API();
    return a->op_rmsnorm(x, g, n, d, eps, out, act, xq, xq_ref, err);
}
qf_status qf_cuda_op_rope(float *v, int n, int n_heads, int head_dim, int n_rot, qf_rope_type type, const float *cs,
                          const float *sn, qf_error *err) {
    NEED_API();
    return a->op_rope(v, n, n_heads, head_dim, n_rot, type, cs, sn, err);
}
qf_status qf_cuda_op_silu_mul(const float *g, const float *u, size_t n, float *out, qf_error *err) {
    NEED_API();
    return a->op_silu_mul(g, u, n, out, err);
}
qf_status qf_cuda_op_topk(const float *logits, int V, float temp, int k, qf_gpu_topk *out, qf_error *err) {
    NEED_API();
    return a->op_topk(logits, V, temp, k, out, err);
}
qf_status qf_cuda_op_attention(const float *q, const float *k, const float *v, int n, int pos0, int n_head,
                               int n_head_kv, int hd, qf_kv_mode mode, float *out, qf_error *err) {
    NEED_API();
    return a->op_attention(q, k, v, n, pos0, n_head, n_head_kv, hd, mode, 0, out, err);
}
qf_status qf_cuda_op_attention_route(const float *q, const float *k, const float *v, int n, int pos0, int n_head,
                                     int n_head_kv, int hd, qf_kv_mode mode, bool flash, float *out, qf_error *err) {
    NEED_API();
    return a->op_attention(q, k, v, n, pos0, n_head, n_head_kv, hd, mode, flash ? 1 : 0, out, err);
}
qf_status qf_cuda_op_attention_split(const float *q, const float *k, const float *v, int n, int pos0, int n_head,
                                     int n_head_kv, int hd, qf_kv_mode mode, float *out, qf_error *err) {
    NEED_API();
    return a->op_attention(q, k, v, n, pos0, n_head, n_head_kv, hd, mode, 2, out, err);
}
qf_status qf_cuda_op_attention_fused(const float *q, const float *k, const float *v, int pos0, int n_head, int n_head_kv,
                                     int hd, qf_kv_mode mode, qf_kv_rot rot, float *out, qf_error *err) {
    NEED_API();
    return a->op_attention(q, k, v, 1, pos0, n_head, n_head_kv, hd, mode, rot == QF_KV_ROT_HADAMARD ? 4 : 3, out, err);
}
qf_status qf_cuda_op_kv_roundtrip(qf_kv_mode mode, const float *x, int64_t rows, int hd, void *bytes, float *out,
                                  qf_error *err) {
    NEED_API();
    return a->op_kv_roundtrip(mode, QF_KV_ROT_NONE, x, rows, hd, bytes, out, err);
}
qf_status qf_cuda_op_kv_roundtrip_rot(qf_kv_mode mode, qf_kv_rot rot, const float *x, int64_t rows, int hd,
                                      void *bytes, float *out, qf_error *err) {
    NEED_API();
    return a->op_kv_roundtrip(mode, rot, x, rows, hd, bytes, out, err);
}
qf_status qf_cuda_op_kv_int8_roundtrip(const float *x, int64_t rows, int dkv, int hd, int layout, const float *scale,
                                       const float *inv, int8_t *bytes, float *out, qf_error *err) {
    NEED_API();
    return a->op_kv_int8_roundtrip(x, rows, dkv, hd, layout, scale, inv, bytes, out, err);
}
qf_status qf_cuda_op_matvec_gu(const qf_weight *w, const float *x, int n, int F, float *hb, qf_error *err) {
    NEED_API();
    return a->op_matvec_gu(w, x, n, F, hb, err);
}
qf_status qf_cuda_op_kv_dict_decode(const uint8_t *codes, int64_t rows, int hd, size_t rb, const float *atoms,
                                    int n_atoms, int sparsity, int coef_q8, float *out, qf_error *err) {
    NEED_API();
    return a->op_kv_dict_decode(codes, rows, hd, rb, atoms, n_atoms, sparsity, coef_q8, out, err);
}
qf_status qf_cuda_op_kv_dict_encode(const float *x, int64_t rows, int hd, const float *atoms, const float *gram,
                                    int n_atoms, int sparsity, int coef_q8, size_t rb, double stop_corr,
                                    double stop_pivot, uint8_t *codes, qf_error *err) {
    NEED_API();
    const qf_gpu_dict_omp omp = {stop_corr, stop_pivot};
    return a->op_kv_dict_encode(x, rows, hd, atoms, gram, n_atoms, sparsity, coef_q8, rb, omp, codes, err);
}
qf_status qf_cuda_bench_gemm(int M, int N, int K, int flags, int iters, double *ms, qf_error *err) {
    NEED_API();
    return a->bench_gemm(M, N, K, flags, iters, ms, err);
}

/* ---- cuda_forge.h ---- */

qf_status qf_cuda_awq_group_new(const float *X, int64_t n, int64_t D, const float *W, int64_t R, qf_cuda_awq **out,
                                qf_error *err) {
    *out = NULL;
    NEED_API();
    return a->awq_group_new(X, n, D, W, R, out, err);
}
qf_status qf_cuda_awq_group_mse(qf_cuda_awq *g, const float *s, int quant, const float *imp, const float *cov,
                                double *mse, qf_error *err) {
    NEED_API();
    return a->awq_group_mse(g, s, quant, imp, cov, mse, err);
}
void qf_cuda_awq_group_free(qf_cuda_awq *g) {
    const qf_cuda_api *a = g ? qf_cuda_api_get(NULL) : NULL;
    if (a) a->awq_group_free(g);
}
qf_status qf_cuda_awq_quantize(const float *W, int64_t R, int64_t D, const float *s, int quant, const float *imp,
                               const float *cov, void *q4, float *ratio, float *deq, qf_error *err) {
    NEED_API();
    return a->awq_quantize(W, R, D, s, quant, imp, cov, q4, ratio, deq, err);
}
qf_status qf_cuda_learn_gram_f64(const float *x, const float *y, int64_t n, int dx, int dy, const double *mx,
                                 const double *my, double *A, double *B, qf_error *err) {
    NEED_API();
    return a->learn_gram_f64(x, y, n, dx, dy, mx, my, A, B, err);
}
qf_status qf_cuda_learn_chol_sub_f64(const double *L, int n, double *b, int m, qf_error *err) {
    NEED_API();
    return a->learn_chol_sub_f64(L, n, b, m, err);
}
qf_status qf_cuda_learn_rows_minus_f64(const float *y, const float *x, int64_t rows, int64_t stride, int d,
                                       const float *P, const float *mean, float *out, qf_error *err) {
    NEED_API();
    return a->learn_rows_minus_f64(y, x, rows, stride, d, P, mean, out, err);
}
qf_status qf_cuda_learn_resid_f64(const float *y, const float *xn, int64_t n, int dx, int dy, const double *my,
                                  const double *WT, double *d, qf_error *err) {
    NEED_API();
    return a->learn_resid_f64(y, xn, n, dx, dy, my, WT, d, err);
}
qf_status qf_cuda_learn_klt_measure(const qf_cuda_klt_measure *m, qf_error *err) {
    NEED_API();
    return a->learn_klt_measure(m, err);
}
