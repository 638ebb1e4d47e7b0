/* engine.h: engine-internal structures shared by model.c, kv_cache.c and forward.c.
 * The public view of these is include/qforge/model.h. */
#ifndef QF_ENGINE_H
#define QF_ENGINE_H

#include "qforge/model.h"
#include "util/util.h"

struct qf_model {
    char path[4096];
    qf_gguf *gguf;
    qf_tokenizer *tok;
    qf_hparams hp;
    qf_weight tok_embd, output_norm, output;
    qf_weight rope_freqs; /* Llama-3.1 style per-dimension frequency factors; data NULL if absent */
    qf_layer_weights *layers;
    uint8_t sha256[32];
    bool sha_done;
};

/* ---- KV cache (kv_cache.c) ----
 * One row = the head_dim-long vector of one (layer, stream, position, kv head); rows of a
 * layer/stream are contiguous by position then kv head. */
typedef struct {
    qf_kv_mode mode_k, mode_v;
    int n_layer, n_ctx, n_head_kv, head_dim;
    size_t row_bytes[2];   /* [0] = K, [1] = V */
    uint8_t **data[2];     /* data[stream][layer] */
    /* QF_KV_INT8: static per-channel scales, [layer][kv head][head_dim] (per-head-slot scales
     * are stored expanded). NULL until an artifact binds them. */
    float *int8_scale[2], *int8_inv_scale[2];
    struct qf_kv_dict_bind *dict[2]; /* QF_KV_DICT: per-layer dictionaries, bound by an artifact */
} qf_kv_cache;

qf_status qf_kv_cache_init(qf_kv_cache *kv, const qf_hparams *hp, int n_ctx, qf_kv_mode mk,
                           qf_kv_mode mv, qf_error *err);
void qf_kv_cache_free(qf_kv_cache *kv);
/* Write n_rows consecutive rows starting at (pos, kv head 0): src is [n_rows][head_dim]. */
void qf_kv_cache_write(qf_kv_cache *kv, int stream, int layer, int pos, int n_pos,
                       const float *src);
/* Read kv head `h` for positions [0, n_pos) into dst [n_pos][head_dim] f32. */
void qf_kv_cache_read_head(const qf_kv_cache *kv, int stream, int layer, int h, int n_pos,
                           float *dst);
double qf_kv_cache_bytes_per_token(const qf_kv_cache *kv);

struct qf_cuda_ctx;

struct qf_context {
    qf_model *model;
    struct qf_cuda_ctx *gpu; /* non-NULL when the context runs on the GPU */
    qf_context_params params;
    qf_pool *pool;
    qf_kv_cache kv;
    const qf_tap *tap;
    int n_batch;
    /* scratch activations, sized for n_batch tokens */
    float *x, *xn, *q, *k, *v, *att, *hb, *hb2, *logits_tmp;
    /* per-thread scratch for matmul tiles and attention */
    float **thr_buf;
    size_t thr_buf_floats;
    void *xq;             /* quantized activations for the vec_dot path */
    size_t xq_bytes;
    float *rope_cos, *rope_sin; /* [n_batch][n_rot/2] for the current batch */
};

#endif
