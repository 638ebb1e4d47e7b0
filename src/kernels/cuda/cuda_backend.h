/* cuda_backend.h: the narrow seam between the engine and the CUDA backend.
 *
 * The backend sees weights, a view of the KV cache and parameters: never a qf_context. It is
 * built (when nvcc is found) as its own shared object, libqforge-cuda.so, which links cudart
 * and cuBLAS; libqforge loads it with dlopen() at the first GPU use (cuda_loader.c) and reaches
 * it only through the function table below, so the CPU commands never map the CUDA libraries.
 * Without the plugin, or without a GPU, every entry answers "not available" (QF_ERR_DEVICE).
 *
 * The engine side of the seam (src/engine/gpu.c) builds these views from a qf_context and is
 * the one place that decides on which device a context runs. */
#ifndef QF_CUDA_BACKEND_H
#define QF_CUDA_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qforge/error.h"
#include "qforge/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI of the function table; the loader refuses a plugin built for another one.
 * 4: qf_gpu_model carries the family features' per-layer windows and the host's MoE routing
 * (the backend runs every family of docs/families.md). 5: qf_cuda_params gains no_pdl and
 * no_q4_regroup. 6: qf_gpu_kv carries kv-rq caches (qf_gpu_kv_rq), pre-RoPE K and the exact
 * sinks / recent window. 7: the AWQ learner's entries (awq_group_*, awq_quantize). 8: qf_gpu_params
 * gains canonical. 9: qf_gpu_kv carries the dictionaries' Gram matrices (dict rows encoded on the
 * device), the table gains op_kv_dict_encode. 10: op_attention's route 3 (the decode step's fused
 * split-K attention against the separate launches). 11: op_rmsnorm returns the norm's fused
 * q8_0 activation next to the separate quantization's. 12: kv-rq's learning steps (learn_*_f64).
 * 13: learn_klt_measure (the KLT fit's codec-error measurement). 14: qf_cuda_info.graph_steps.
 * 15: qf_cuda_params gains i8_expand (int8 decode reads the cache in place by default).
 * 16: decode_topk and op_topk (qf_generate's sampler reads the logits' top-k, reduced on the device).
 * 17: op_topk loses one_block (one route for every row length: merge levels, no radix select).
 * 18: op_attention's route 4 (route 3 with --kv-rot hadamard folded into k_attn_one).
 * 19: qf_cuda_params gains no_norm_fold. 20: qf_cuda_info gains graph_nodes. */
#define QF_CUDA_ABI 20

typedef struct qf_cuda_ctx qf_cuda_ctx;
typedef struct qf_cuda_awq qf_cuda_awq; /* one AWQ group's search state on the device */

/* kv-rq format 3's codec-error measurement for one (layer, stream) of the KLT fit: the inputs
 * and the per-row results of learn_kv_rq_klt.c klt_unit's measurement loop (the contract is
 * cuda_forge.h's qf_cuda_learn_klt_measure). All pointers are host memory. */
typedef struct {
    int n_head, head_dim, n_widths;  /* H; D (8..256, a power of two); NW, the widths 1..NW bits */
    int64_t n_rows;                  /* measured rows of each head */
    const float *x;                  /* [n_rows][H][D] the rows minus the fit's mean */
    const float *mean, *cs;          /* [H][D] the fit's mean, the Hadamard codec's channel scales */
    const float *enc, *dec, *sigma;  /* format 3: [H][D][D], [H][D][D], [H][D] */
    const uint8_t *width;            /* [NW][H][D] format 3's coordinate widths at b bits an element */
    const float *klevels;            /* [NW][H][D][64] each coordinate's levels at that width */
    const float *hlevels;            /* [NW][H][64] the Hadamard codec's levels at b bits */
    double *den;                     /* out [n_rows][H]: |enc x|^2 */
    double *err3, *errh;             /* out [NW][n_rows][H]: |enc (x' - decode(encode(x')))|^2, x' = x + mean,
                                        format 3's codec and the Hadamard codec */
} qf_cuda_klt_measure;

/* What the backend runs: the model's hyper-parameters and its weights as stored (the data
 * pointers stay valid for the context's life). dequant_row is the host's scalar oracle
 * (qf_dequantize_row_ref), used for the small f32 vectors (norms, biases, rope factors). */
typedef struct {
    const qf_hparams *hp;
    const char *path;                   /* for messages */
    const qf_weight *tok_embd, *output_norm, *output, *rope_freqs; /* rope_freqs->data may be NULL */
    const qf_layer_weights *layers;     /* [hp->n_layer] */
    void (*dequant_row)(qf_type t, const void *src, float *dst, int64_t n);
    /* the sliding window of each layer (hp->n_swa where qf_hparams_layer_swa, else 0: global),
     * [hp->n_layer]; the backend copies it */
    const int *layer_window;
    /* MoE (hp->n_expert > 0): the host's routing, forward.c's qf_moe_route: router logits
     * [n][n_expert] (overwritten with the softmax) -> the top-k experts ids[n][n_expert_used]
     * and their weights w[n][n_expert_used] */
    void (*moe_route)(const qf_hparams *hp, float *logits, int n, int *ids, float *w);
} qf_gpu_model;

/* One kv-rq stream (engine.h struct qf_kv_rq_bind, row format format/kv_rq_row.h): the
 * arrays are the host cache's and stay valid while the backend copies them (set_kv). */
typedef struct {
    const int *bits;                     /* [n_layer]: 1..6, QF_KV_RQ_BITS_F16 or a format-3 rate */
    const size_t *row_bytes;             /* [n_layer] */
    const float *levels;                 /* [n_layer][n_head_kv][QF_KV_RQ_MAX_LEVELS] */
    const float *mean, *cs, *inv_cs;     /* [n_layer][n_head_kv][head_dim]; inv_cs the host's 1 / cs */
    /* format 3 (NULL otherwise): enc, dec [n_layer][n_head_kv][head_dim][head_dim] (y = enc (x -
     * mean), x = mean + dec y), sigma [..][head_dim], levels [..][head_dim][QF_KV_RQ_MAX_LEVELS],
     * width [..][head_dim] */
    const float *klt_enc, *klt_dec, *klt_sigma, *klt_levels;
    const uint8_t *klt_width;
    /* V only, or NULL: pred [n_layer][H*D][H*D] predicts V from the token's decoded pre-RoPE K;
     * pred_on[layer] says which layers have one */
    const float *pred;
    const bool *pred_on;
} qf_gpu_kv_rq;

/* The OMP encoder's stopping rules (kv.h's QF_KV_OMP_STOP_CORR, QF_KV_OMP_STOP_PIVOT), which the
 * engine owns: the device's dict encoder stops where the host's does. */
typedef struct {
    double stop_corr, stop_pivot;
} qf_gpu_dict_omp;

/* A view of the KV cache the backend mirrors: its shape and storage modes, plus what a bound
 * artifact brings (int8: static scales and the host's reciprocals; dict: unit-norm atoms per
 * layer and the host's encoder, which the backend calls for every dict row it stores). */
typedef struct {
    int n_layer, n_ctx, n_head_kv, head_dim;
    qf_kv_mode mode[2];                 /* [0] = K, [1] = V */
    size_t row_bytes[2];                /* bytes of one head_dim row as the host stores it */
    const float *int8_scale[2], *int8_inv_scale[2]; /* INT8: [n_layer][n_head_kv * head_dim] */
    int int8_layout[2];                             /* INT8: qf_kv_int8_layout (engine.h) */
    int n_atoms[2], sparsity[2], coef_q8[2];        /* DICT */
    const float *const *atoms[2];                   /* DICT: atoms[s][layer] = [n_atoms][head_dim] */
    const float *const *gram[2];                    /* DICT: gram[s][layer] = [n_atoms][n_atoms], the host's */
    qf_gpu_dict_omp omp;                                   /* DICT: the encoder's stopping rules */
    /* DICT: encode n rows [n][head_dim] of stream s for layer il into packed codes (row_bytes[s]
     * each), exactly as the host cache would; user is encode_user. The backend encodes on the
     * device (the same bytes) where the encoder's scratch fits, else calls this */
    void (*encode)(void *user, int s, int il, const float *rows, int64_t n, uint8_t *codes);
    void *encode_user;
    /* RQ: the codecs (the backend encodes and decodes the rows as the host cache does) */
    qf_gpu_kv_rq rq[2];
    /* K rows are stored before RoPE (the reader rotates them); the first n_sink positions and
     * the last n_window written ones are also kept as f16 and read exactly (kv_cache.c's
     * qf_kv_cache_set_exact, forward.c's rule) */
    bool k_prerope;
    int n_sink, n_window;
} qf_gpu_kv;

/* Per-context backend parameters (qf_context_params.cuda plus the sizes the engine chose). */
typedef struct {
    int n_ctx, n_batch;
    qf_kv_rot kv_rot;                   /* HADAMARD: K/V rows rotated before they are stored */
    int device_index;                   /* under mpirun, the local rank: device index % count; -1 = default */
    qf_cuda_params knobs;               /* gemm_f32, attn_warp, gu16, no_f16_cache, profile */
    /* the canonical arithmetic (kernels/canon.h): forward.c's canonical route bit for bit, where the
     * model and cache are covered (llama / qwen2 layers; f32, f16, q8_0, q4_0, int8, kv-rq KV); the
     * knobs' routes elsewhere */
    bool canonical;
} qf_gpu_params;

/* One token's logits reduced on the device for the sampler (decode_topk), instead of the whole
 * row copied to the host (513 KB at a 128k vocabulary, 50-70 us of a 1.7 ms 8B step). */
#define QF_GPU_TOPK_MAX 256
typedef struct {
    float lmax;          /* the largest finite logit (-inf when none is finite) */
    int32_t argmax;      /* the first index of lmax */
    int32_t n_nonfinite; /* logits that are NaN or infinite (qf_generate refuses the step) */
    int32_t n;           /* entries in id / logit: min(k, finite logits) */
    double sum;          /* temp > 0: the sum over finite logits of expf((l - lmax) / temp), in double */
    int32_t id[QF_GPU_TOPK_MAX];  /* the n largest logits' ids (equal logits: the lower ids), in no order */
    float logit[QF_GPU_TOPK_MAX]; /* and their values */
} qf_gpu_topk;

/* Sizes the context holds on the GPU (bench), how many one-token steps replayed the decode
 * graph (tests: that a cache kind runs under the graph, not on the plain launches' fallback) and
 * how many nodes that graph has (tests: that a fusion removed its launches). */
typedef struct {
    size_t weight_bytes, kv_bytes, scratch_bytes, f16_cache_bytes;
    long graph_steps;
    long graph_nodes; /* the nodes of the decode graph last captured (kernel launches and copies), 0 before */
} qf_cuda_info;

/* The plugin's function table (libqforge-cuda.so exports qf_cuda_plugin_api). Every pointer
 * argument is host memory unless it says otherwise. */
typedef struct qf_cuda_api {
    int abi; /* QF_CUDA_ABI */
    /* true when a CUDA device answers (cached after the first call) */
    bool (*available)(void);
    /* upload the weights in their stored types, allocate the KV cache (kv's modes) and scratch */
    qf_status (*ctx_new)(const qf_gpu_model *m, const qf_gpu_kv *kv, const qf_gpu_params *p, qf_cuda_ctx **out,
                         qf_error *err);
    void (*ctx_free)(qf_cuda_ctx *g);
    /* qf_decode's contract: tokens [0, n) at positions [pos0, pos0 + n); logits (or NULL) of rows
     * [logits_from, n); with targets/nll set, nll[r - logits_from] = -log softmax(logits[r])
     * [targets[r - logits_from]] computed on the device instead (no logits copied). tap: NULL or
     * the capture hooks, handed K/V and activations read back from the GPU. */
    qf_status (*decode)(qf_cuda_ctx *g, const qf_tap *tap, const int32_t *tokens, int n, int pos0, float *logits,
                        int logits_from, const int32_t *targets, double *nll, qf_error *err);
    /* rebuild the GPU KV cache in kv's modes (contents dropped); on failure it is left as it was */
    qf_status (*set_kv)(qf_cuda_ctx *g, const qf_gpu_kv *kv, qf_error *err);
    void (*info)(const qf_cuda_ctx *g, qf_cuda_info *out);
    /* single operations for tests/test_cuda.c: see cuda_ops.h for each contract */
    qf_status (*op_dequant)(qf_type t, const void *src, size_t row_bytes, int64_t rows, int64_t k, float *dst,
                            qf_error *err);
    qf_status (*op_matmul)(const qf_weight *w, const float *x, int n, float *y, int route, qf_error *err);
    qf_status (*op_rmsnorm)(const float *x, const float *g, int n, int d, float eps, float *out, int act, void *xq,
                            void *xq_ref, qf_error *err);
    qf_status (*op_rope)(float *v, int n, int n_heads, int head_dim, int n_rot, qf_rope_type type, const float *cs,
                         const float *sn, qf_error *err);
    qf_status (*op_silu_mul)(const float *g, const float *u, size_t n, float *out, qf_error *err);
    /* route: 0 the warp kernel, 1 flash, 2 split-K, 3 split-K fused as the decode step runs it,
     * 4 the same under --kv-rot hadamard */
    qf_status (*op_attention)(const float *q, const float *k, const float *v, int n, int pos0, int n_head,
                              int n_head_kv, int hd, qf_kv_mode mode, int route, float *out, qf_error *err);
    qf_status (*op_kv_roundtrip)(qf_kv_mode mode, qf_kv_rot rot, const float *x, int64_t rows, int hd, void *bytes,
                                 float *out, qf_error *err);
    qf_status (*op_kv_int8_roundtrip)(const float *x, int64_t rows, int dkv, int hd, int layout, const float *scale,
                                      const float *inv, int8_t *bytes, float *out, qf_error *err);
    qf_status (*op_kv_dict_decode)(const uint8_t *codes, int64_t rows, int hd, size_t rb, const float *atoms,
                                   int n_atoms, int sparsity, int coef_q8, float *out, qf_error *err);
    qf_status (*bench_gemm)(int M, int N, int K, int flags, int iters, double *ms, qf_error *err);
    qf_status (*op_matvec_gu)(const qf_weight *w, const float *x, int n, int F, float *hb, qf_error *err);
    /* kv-rq: positions [0, n_pos) of layer il decoded on the device (K as stored, V with its
     * prediction from those K rows); rows as the host cache stores them */
    qf_status (*op_kv_rq_decode)(const qf_gpu_kv *kv, int il, int64_t n_pos, const uint8_t *k_rows,
                                 const uint8_t *v_rows, float *k_out, float *v_out, qf_error *err);
    /* kv-rq: n_pos tokens k, v [n_pos][n_head_kv][head_dim] (K as the cache stores it) encoded
     * into layer il's rows on the device, V's prediction from the device-decoded K rows */
    qf_status (*op_kv_rq_encode)(const qf_gpu_kv *kv, int il, int64_t n_pos, const float *k, const float *v,
                                 uint8_t *k_rows, uint8_t *v_rows, qf_error *err);
    /* the AWQ learner (kernels/cuda/cuda_forge.h has the contracts) */
    qf_status (*awq_group_new)(const float *X, int64_t n, int64_t D, const float *W, int64_t R, qf_cuda_awq **out,
                               qf_error *err);
    qf_status (*awq_group_mse)(qf_cuda_awq *a, const float *s, int quant, const float *imp, const float *cov,
                               double *mse, qf_error *err);
    void (*awq_group_free)(qf_cuda_awq *a);
    qf_status (*awq_quantize)(const float *W, int64_t R, int64_t D, const float *s, int quant, const float *imp,
                              const float *cov, void *q4, float *ratio, float *deq, qf_error *err);
    /* kv-dict: rows x [rows][hd] encoded on the device against unit-norm atoms [n_atoms][hd] and
     * their Gram matrix (v1 codes of rb bytes); QF_ERR_DEVICE where the encoder does not fit */
    qf_status (*op_kv_dict_encode)(const float *x, int64_t rows, int hd, const float *atoms, const float *gram,
                                   int n_atoms, int sparsity, int coef_q8, size_t rb, qf_gpu_dict_omp omp, uint8_t *codes,
                                   qf_error *err);
    /* kv-rq's learner (kernels/cuda/cuda_forge.h has the contracts) */
    qf_status (*learn_gram_f64)(const float *x, const float *y, int64_t n, int dx, int dy, const double *mx,
                                const double *my, double *A, double *B, qf_error *err);
    qf_status (*learn_chol_sub_f64)(const double *L, int n, double *b, int m, qf_error *err);
    qf_status (*learn_rows_minus_f64)(const float *y, const float *x, int64_t rows, int64_t stride, int d,
                                      const float *P, const float *mean, float *out, qf_error *err);
    qf_status (*learn_resid_f64)(const float *y, const float *xn, int64_t n, int dx, int dy, const double *my,
                                 const double *WT, double *d, qf_error *err);
    qf_status (*learn_klt_measure)(const qf_cuda_klt_measure *m, qf_error *err);
    /* decode's contract for one token at pos0 (no tap), but the logits stay on the device and
     * come back reduced into *out: max, argmax and the count of non-finite values always; with
     * temp > 0 the sum of expf((l - max) / temp) and the k largest (1 <= k <= QF_GPU_TOPK_MAX) */
    qf_status (*decode_topk)(qf_cuda_ctx *g, int32_t token, int pos0, float temp, int k, qf_gpu_topk *out,
                             qf_error *err);
    /* decode_topk's reduction of one row of V logits (tests; cuda_ops.h) */
    qf_status (*op_topk)(const float *logits, int V, float temp, int k, qf_gpu_topk *out, qf_error *err);
} qf_cuda_api;

/* Exported by libqforge-cuda.so: the table when abi == QF_CUDA_ABI, else NULL. */
const qf_cuda_api *qf_cuda_plugin_api(int abi);

/* ---- the loader (cuda_loader.c, part of libqforge) ---- */

/* The plugin's table, loading libqforge-cuda.so on the first call (NULL when it is missing or
 * was built for another ABI; *why, if given, says which). Thread-safe; never unloaded. */
const qf_cuda_api *qf_cuda_api_get(const char **why);
/* true when the plugin loads and a CUDA device answers */
bool qf_cuda_backend_available(void);
/* Whether the backend runs KV rotation `rot` (--kv-rot) in its cache: NONE and HADAMARD (q8_0
 * and q4_0 caches, and f32/f16; not int8/dict artifacts). When it answers false, the one device
 * decision (engine/gpu.c) keeps --device auto on the CPU and refuses --device cuda. */
bool qf_cuda_backend_kv_rot_ok(qf_kv_rot rot);

#ifdef __cplusplus
}
#endif
#endif
