/* forward.c: the batched forward pass of the transformer families (llama, qwen2, docs/families.md).
 *
 * One call runs n tokens at positions [pos0, pos0+n) through every layer, reading and
 * writing the KV cache, and produces logits. It reads top to bottom like the math:
 *
 *   x = embed(tokens)
 *   for each layer:  xn = rmsnorm(x) * attn_norm;  q,k,v = xn W_{q,k,v} (+ bias)
 *                    rope(q, k);  cache <- k, v;  a = softmax(q k^T / sqrt(d) + causal) v
 *                    x += a W_o;  xn = rmsnorm(x) * ffn_norm;  x += (silu(xn W_g) * xn W_u) W_d
 *   logits = (rmsnorm(x) * output_norm) W_out
 *
 * Matmuls take one of two fast routes: a batch (prefill) dequantizes row tiles of the
 * weight to f32 and multiplies them with OpenBLAS sgemm; a single token (decode) quantizes
 * the activation to the weight's vec_dot type and uses the integer dot kernels, as ggml does.
 * The reference route (params.reference) uses the scalar oracle kernels and plain loops: it is
 * the CPU reference path that the fast route and the GPU are checked against. The canonical
 * route (params.canonical, kernels/canon.h) is the fast route with every sum in one defined
 * order: the integer GEMMs at any batch size (their scalar oracles where the CPU lacks the
 * instructions), an fmaf chain for the other weights and for attention: the GPU computes the
 * same bits (docs/gpu.md "Canonical arithmetic"), and certification runs this way. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "kernels/blas.h"
#include "kernels/canon.h"
#include "kernels/canon_cpu.h"
#include "kernels/gemm.h"
#include "kernels/matvec.h"
#include "engine/gpu.h"
#include "engine/kv_codes.h"
#include "kernels/hadamard.h"
#include "kernels/vecmath.h"

#ifndef TILE_ROWS
#define TILE_ROWS 128   /* weight rows dequantized per sgemm call (fewer calls = less operand packing) */
#endif
#ifndef ATT_QBLOCK
#define ATT_QBLOCK 64   /* query rows per attention block: each block only reads its causal prefix */
#endif
/* kv-rq, att_job.cfused: rows a piece of the weighted coefficient sums (rq_csum_worker): 64 KB of
 * scratch at most, in L2 */
#define RQ_CSUB 128
#define GEMM_MIN_TOKENS 4 /* below this, the vec_dot route wins */
#define MV_MAX_W 3        /* weights one decode matvec job runs together (q, k, v) */
/* bytes of weights a thread takes at a time in the decode matvec (at most; see matvec_multi). Measured on
 * the 1B shape with the chunk switched token by token: 64-row chunks (f16 256 KB, q4_0 73 KB) against
 * 128 / 256 / 512 rows: f16 52.0 -> 48.9 / 48.6 ms a token, q4_0 24.0 -> 23.2 / 22.5 / 22.3 ms (each chunk
 * costs an atomic on a shared line and restarts the prefetch stream) */
#define MV_CHUNK_BYTES (512u << 10)

qf_context_params qf_context_default_params(void) {
    qf_context_params p = {0};
    p.kv_k = QF_KV_F16; /* llama.cpp's default cache type */
    p.kv_v = QF_KV_F16;
    return p;
}

/* f32 copies of the small per-layer vectors (norm gains, biases), whatever their stored type */
typedef struct {
    float *attn_norm, *ffn_norm, *bq, *bk, *bv;
    float *q_norm, *k_norm, *post_attn_norm, *post_ffw_norm; /* NULL when the family has none */
} layer_vecs;

typedef struct {
    layer_vecs *layers;
    float *output_norm;
    float *rope_ff; /* rope frequency factors or NULL */
} ctx_vecs;

static float *vec_to_f32(const qf_weight *w) {
    if (!w->data) return NULL;
    float *out = malloc((size_t)w->ne0 * sizeof(float));
    if (out) qf_dequantize_row_ref(w->type, w->data, out, w->ne0);
    return out;
}

/* ---------------------------------------------------------------------------------------- */
/* context                                                                                   */

typedef struct qf_context_ext {
    struct qf_context base;
    ctx_vecs vecs;
    float *kbuf, *vbuf; /* [n_head_kv][n_ctx][head_dim] f32 views of the cache for one layer */
    /* exact (f16-valued) views of the sink and window positions the current batch reads, same
     * layout; only the sink rows and the window rows of the batch are filled (kv.n_sink/n_window) */
    float *ekbuf, *evbuf;
    /* kv-rq fast route (kv.rq_lin): K's coefficients of every kv head for one layer [n_ctx][kdim],
     * and per-thread scratch (rq_thr_per floats each); allocated at the first such decode */
    float *ykbuf, *rq_thr;
    size_t rq_thr_per;
    /* kv-rq fast route, one query (att_job.kfused): the stored keys' scores q . k (unscaled) of
     * every query head [n_head][n_ctx], made by the gather from each run's decoded keys */
    float *rq_sc;
    /* kv-rq fast route, att_job.cfused: every query head's softmax weights [n_head][n_ctx] (the
     * exact keys' zeroed), their sums [n_head], the exact keys' values [n_head][head_dim], and the
     * weighted coefficient sums of V [n_head][head_dim] and of K (V's predictor) [n_head][kdim] */
    float *rq_w, *rq_wsum, *rq_ex, *rq_cv, *rq_ck;
    bool rq_nofuse; /* QF_RQ_NOFUSE: never att_job.kfused */
    bool i8_nofuse; /* QF_I8_NOFUSE: never att_job.i8kfused */
    /* kv-int8 ec-rot, one query (att_job.i8kfused): the stored keys' scores q . k (unscaled) of
     * every query head [n_head][n_ctx], made by i8_gather_worker; allocated at the first such step */
    float *i8_sc;
    /* kv-int8 ec-rot, one query, V summed as decoded (att_job.i8vfused): every query head's softmax
     * weights [n_head][n_ctx]; the partial outputs of each chunk of I8_VCHUNK positions
     * [n_ctx / I8_VCHUNK][n_head][head_dim]; per thread, the kernel's lane sums (i8_vacc_per
     * floats each); allocated at the first such step */
    float *i8_w, *i8_vpart, *i8_vacc;
    size_t i8_vacc_per;
    int i8_vacc_nth; /* the threads i8_vacc has room for */
    bool i8_novfuse; /* QF_I8_NOVFUSE: never att_job.i8vfused (V decoded into vbuf) */
    bool rq_nocfuse; /* QF_RQ_NOCFUSE: never att_job.cfused (the coefficients through ykbuf / vbuf) */
    bool rq_kcodes;  /* QF_RQ_KCODES: att_job.cfused reads K's codes again for the sums, ykbuf not written */
    int rq_csub;     /* rq_csum_worker's rows a piece: RQ_CSUB, or QF_RQ_CSUB=N (1..RQ_CSUB; tests) */
    bool rq_nobatch; /* QF_RQ_NOBATCH: never att_job.vgroup (one V coefficient sum per query head) */
    float *kr_cos, *kr_sin; /* pre-RoPE K cache: [n_ctx][n_rot/2] tables for every position, or NULL */
    float *kr_cos_swa, *kr_sin_swa; /* the same for sliding-window layers with their own base (gemma3) */
    /* sliding-window layers with their own RoPE base (gemma3): [n_batch][n_rot/2], or NULL */
    float *rope_cos_swa, *rope_sin_swa;
    /* MoE scratch (n_expert > 0): router logits [n_batch][n_expert], the chosen experts and their
     * weights [n_batch][n_expert_used], gathered rows of one expert [n_batch][n_embd] (input,
     * output), the token and weight of each gathered row, the FFN sum [n_batch][n_embd] */
    float *moe_logits, *moe_w, *moe_x, *moe_y, *moe_acc, *moe_rw;
    int *moe_ids, *moe_rows;
    uint8_t *gact; /* int8 GEMM activations (kernels/gemm.h): n_batch rows of the widest input */
    uint8_t *mvact; /* decode matvec activations (kernels/matvec.h): MV_MAX_W x GEMM_MIN_TOKENS rows */
    size_t mvact_row; /* bytes of one of them (the widest input, any supported type) */
    bool no_skip; /* QF_NO_SKIP set at creation: the last layer computes every row (qf_decode) */
    bool no_rotq; /* QF_NO_ROTQ set at creation: rows stored rotated are rotated back on read */
    bool no_kv_direct; /* QF_KV_GATHER set at creation: decode reads a plain cache through its f32 view */
    /* the canonical route's exact-key scores of one query block (attention_worker), per thread
     * canon_ex_per floats: [ATT_QBLOCK][n_sink + ATT_QBLOCK + n_window]; allocated at the first
     * decode with exact sinks or a window */
    float *canon_ex;
    size_t canon_ex_per;
    /* kv-dict attention in the coefficient domain (att_job.kdict / vdict): a dict stream's codes
     * of one layer parsed slot-major (qf_kv_cache_dict_slots), [n_head_kv][sparsity][n_ctx]
     * indices and coefficients (dict_n[stream] elements allocated), and per-thread scratch
     * (dict_thr_per floats: P or W [n_atoms], the exact keys' values [head_dim]); allocated at
     * the first decode step that takes the route, grown when a bind needs more */
    int32_t *dict_idx[2];
    float *dict_coef[2], *dict_thr;
    size_t dict_n[2], dict_thr_per;
    int dict_route; /* QF_KV_DICT_EXPAND at creation: DICT_ROUTE_AUTO, _EXPAND (set, not "0"), _COEF ("0") */
} ctx_ext;

enum { DICT_ROUTE_AUTO, DICT_ROUTE_EXPAND, DICT_ROUTE_COEF };

static ctx_ext *ext(qf_context *c) { return (ctx_ext *)c; }

void qf_context_free(qf_context *c) {
    if (!c) return;
    ctx_ext *e = ext(c);
    qf_gpu_detach(c);
    if (e->vecs.layers) {
        for (int il = 0; il < c->model->hp.n_layer; il++) {
            layer_vecs *lv = &e->vecs.layers[il];
            free(lv->attn_norm), free(lv->ffn_norm), free(lv->bq), free(lv->bk), free(lv->bv);
            free(lv->q_norm), free(lv->k_norm), free(lv->post_attn_norm), free(lv->post_ffw_norm);
        }
        free(e->vecs.layers);
    }
    free(e->vecs.output_norm);
    free(e->vecs.rope_ff);
    free(e->kr_cos), free(e->kr_sin), free(e->kr_cos_swa), free(e->kr_sin_swa);
    free(e->rope_cos_swa), free(e->rope_sin_swa);
    free(e->moe_logits), free(e->moe_w), free(e->moe_x), free(e->moe_y), free(e->moe_acc), free(e->moe_rw);
    free(e->moe_ids), free(e->moe_rows);
    free(e->kbuf), free(e->vbuf), free(e->ekbuf), free(e->evbuf), free(e->gact), free(e->mvact);
    free(e->ykbuf), free(e->rq_thr), free(e->rq_sc), free(e->rq_w), free(e->canon_ex), free(e->i8_sc);
    free(e->i8_w), free(e->i8_vpart), free(e->i8_vacc);
    free(e->dict_idx[0]), free(e->dict_idx[1]), free(e->dict_coef[0]), free(e->dict_coef[1]), free(e->dict_thr);
    qf_kv_cache_free(&c->kv);
    free(c->x), free(c->xn), free(c->q), free(c->k), free(c->v), free(c->att), free(c->hb),
        free(c->hb2), free(c->xq), free(c->rope_cos), free(c->rope_sin);
    if (c->thr_buf)
        for (int i = 0; i < qf_pool_size(c->pool); i++) free(c->thr_buf[i]);
    free(c->thr_buf);
    qf_pool_free(c->pool);
    free(c);
}

qf_context *qf_context_new(qf_model *m, const qf_context_params *p, qf_error *err) {
    ctx_ext *e = calloc(1, sizeof *e);
    if (!e) {
        qf_fail(err, QF_ERR_NOMEM, "out of memory");
        return NULL;
    }
    qf_context *c = &e->base;
    const qf_hparams *hp = &m->hp;
    c->model = m;
    c->params = p ? *p : qf_context_default_params();
    if (c->params.n_ctx <= 0) c->params.n_ctx = hp->n_ctx_train > 0 ? hp->n_ctx_train : 2048;
    if (c->params.n_ctx > (1 << 20)) {
        qf_fail(err, QF_ERR_ARG, "context size %d is too large", c->params.n_ctx);
        goto fail;
    }
    if (c->params.n_batch <= 0 || c->params.n_batch > c->params.n_ctx) c->params.n_batch = c->params.n_ctx;
    if (c->params.n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        c->params.n_threads = n > 0 ? (int)n : 1;
    }
    c->n_batch = c->params.n_batch;
    /* our pool does the parallelism; each thread calls a single-threaded sgemm (kernels/blas.h:
     * OpenBLAS is loaded here, and its work buffers must fit an address-space limit) */
    if (!c->params.reference && qf_blas_init(c->params.n_threads, err)) goto fail;
    c->pool = qf_pool_create(c->params.n_threads);
    if (!c->pool) {
        qf_fail(err, QF_ERR_NOMEM, "cannot start %d threads", c->params.n_threads);
        goto fail;
    }
    if (qf_kv_cache_init(&c->kv, hp, c->params.n_ctx, c->params.kv_k, c->params.kv_v, err)) goto fail;
    if (qf_kv_cache_set_rot(&c->kv, c->params.kv_rot, err)) goto fail;
    /* sliding-window layers keep only their window (+ one batch) in the cache */
    if (qf_kv_cache_set_swa(&c->kv, hp, c->n_batch, err)) goto fail;

    size_t B = (size_t)c->n_batch, D = hp->n_embd, Dq = (size_t)hp->n_head * hp->head_dim,
           Dkv = (size_t)hp->n_head_kv * hp->head_dim,
           F = (size_t)(hp->n_ff > hp->n_ff_exp ? hp->n_ff : hp->n_ff_exp); /* dense or expert FFN */
    if ((size_t)hp->n_ff_shexp > F) F = (size_t)hp->n_ff_shexp; /* qwen2moe's shared expert */
    c->x = qf_malloc_aligned(B * D * 4);
    c->xn = qf_malloc_aligned(B * (D > F ? D : F) * 4);
    c->q = qf_malloc_aligned(B * Dq * 4);
    c->k = qf_malloc_aligned(B * Dkv * 4);
    c->v = qf_malloc_aligned(B * Dkv * 4);
    c->att = qf_malloc_aligned(B * Dq * 4);
    c->hb = qf_malloc_aligned(B * F * 4);
    c->hb2 = qf_malloc_aligned(B * F * 4);
    c->rope_cos = qf_malloc_aligned(B * hp->n_rot / 2 * 4);
    c->rope_sin = qf_malloc_aligned(B * hp->n_rot / 2 * 4);
    size_t maxK = D > F ? D : F;
    if (Dq > maxK) maxK = Dq;
    /* vec_dot activations: at most GEMM_MIN_TOKENS rows of the widest input, in the largest
     * block format (Q8_K: 292 bytes per 256 = 1.15 B/elem; F32 is 4 B/elem) */
    c->xq_bytes = (size_t)GEMM_MIN_TOKENS * maxK * 4 + 1024;
    c->xq = qf_malloc_aligned(c->xq_bytes);
    e->kbuf = qf_malloc_aligned((size_t)hp->n_head_kv * c->params.n_ctx * hp->head_dim * 4);
    e->vbuf = qf_malloc_aligned((size_t)hp->n_head_kv * c->params.n_ctx * hp->head_dim * 4);
    e->ekbuf = qf_malloc_aligned((size_t)hp->n_head_kv * c->params.n_ctx * hp->head_dim * 4);
    e->evbuf = qf_malloc_aligned((size_t)hp->n_head_kv * c->params.n_ctx * hp->head_dim * 4);
    size_t gs = qf_gemm_act_stride((int64_t)maxK), gks = qf_gemm_k_act_stride((int64_t)maxK);
    e->gact = qf_malloc_aligned(B * (gs > gks ? gs : gks));
    e->mvact_row = qf_matvec_act_bytes(QF_TYPE_F16, (int64_t)((maxK + 127) & ~(size_t)127)); /* the widest layout */
    e->mvact = qf_malloc_aligned((size_t)MV_MAX_W * GEMM_MIN_TOKENS * e->mvact_row);
    /* per-thread scratch: a weight tile (TILE_ROWS x maxK) or one attention score block */
    size_t tile = (size_t)TILE_ROWS * maxK, f16s = qf_gemm_f16_scratch_bytes(TILE_ROWS) / sizeof(float);
    if (tile < f16s) tile = f16s; /* the f16 GEMM's panels of one K block (small models: maxK < QF_GEMM_F16_KB) */
    size_t scores = B * (size_t)c->params.n_ctx;
    c->thr_buf_floats = tile > scores ? tile : scores;
    c->canon = c->params.canonical && !c->params.reference;
    if (c->canon) { /* the canonical kernels' transposed panels, after the tile / score block */
        c->canon_scr = c->thr_buf_floats;
        c->thr_buf_floats += (size_t)QF_CANON_SCRATCH(maxK);
    }
    int nthr = qf_pool_size(c->pool);
    c->thr_buf = calloc((size_t)nthr + 1, sizeof(float *));
    if (!c->x || !c->xn || !c->q || !c->k || !c->v || !c->att || !c->hb || !c->hb2 || !c->rope_cos ||
        !c->rope_sin || !c->xq || !e->kbuf || !e->vbuf || !e->ekbuf || !e->evbuf || !e->gact || !e->mvact || !c->thr_buf)
        goto oom;
    if (hp->rope_freq_base_swa != hp->rope_freq_base) {
        e->rope_cos_swa = qf_malloc_aligned(B * hp->n_rot / 2 * 4);
        e->rope_sin_swa = qf_malloc_aligned(B * hp->n_rot / 2 * 4);
        if (!e->rope_cos_swa || !e->rope_sin_swa) goto oom;
    }
    if (hp->n_expert) {
        size_t E = (size_t)hp->n_expert, K = (size_t)hp->n_expert_used;
        e->moe_logits = malloc(B * E * sizeof(float));
        e->moe_w = malloc(B * K * sizeof(float));
        e->moe_ids = malloc(B * K * sizeof(int));
        e->moe_rows = malloc(B * sizeof(int));
        e->moe_rw = malloc(B * sizeof(float));
        e->moe_x = qf_malloc_aligned(B * D * 4);
        e->moe_y = qf_malloc_aligned(B * D * 4);
        e->moe_acc = qf_malloc_aligned(B * D * 4);
        if (!e->moe_logits || !e->moe_w || !e->moe_ids || !e->moe_rows || !e->moe_rw || !e->moe_x || !e->moe_y ||
            !e->moe_acc)
            goto oom;
    }
    for (int i = 0; i < nthr; i++)
        if (!(c->thr_buf[i] = qf_malloc_aligned(c->thr_buf_floats * 4))) goto oom;

    e->vecs.layers = calloc((size_t)hp->n_layer, sizeof(layer_vecs));
    if (!e->vecs.layers) goto oom;
    for (int il = 0; il < hp->n_layer; il++) {
        const qf_layer_weights *L = &m->layers[il];
        layer_vecs *lv = &e->vecs.layers[il];
        lv->attn_norm = vec_to_f32(&L->attn_norm);
        lv->ffn_norm = vec_to_f32(&L->ffn_norm);
        lv->bq = vec_to_f32(&L->bq);
        lv->bk = vec_to_f32(&L->bk);
        lv->bv = vec_to_f32(&L->bv);
        lv->q_norm = vec_to_f32(&L->q_norm);
        lv->k_norm = vec_to_f32(&L->k_norm);
        lv->post_attn_norm = vec_to_f32(&L->post_attn_norm);
        lv->post_ffw_norm = vec_to_f32(&L->post_ffw_norm);
        if (!lv->attn_norm || !lv->ffn_norm || (L->bq.data && !lv->bq) || (L->bk.data && !lv->bk) ||
            (L->bv.data && !lv->bv) || (L->q_norm.data && !lv->q_norm) || (L->k_norm.data && !lv->k_norm) ||
            (L->post_attn_norm.data && !lv->post_attn_norm) || (L->post_ffw_norm.data && !lv->post_ffw_norm))
            goto oom;
    }
    e->vecs.output_norm = vec_to_f32(&m->output_norm);
    if (!e->vecs.output_norm) goto oom;
    if (m->rope_freqs.data && !(e->vecs.rope_ff = vec_to_f32(&m->rope_freqs))) goto oom;
    /* the one place that decides the device (gpu.c) */
    if (qf_gpu_attach(c, err)) goto fail;
    /* the CPU's repacked Q4_0 weights (repack.c), once per model; QF_NO_REPACK=1 reads the GGUF
     * rows as before (to measure the difference) */
    if (!c->gpu) qf_model_prefault(m);
    if (!c->gpu && !c->params.reference && !getenv("QF_NO_REPACK")) qf_model_repack(m, c->pool);
    e->no_skip = getenv("QF_NO_SKIP") != NULL; /* read once, not on every decode */
    e->no_rotq = getenv("QF_NO_ROTQ") != NULL;
    e->no_kv_direct = getenv("QF_KV_GATHER") != NULL;
    e->rq_nofuse = getenv("QF_RQ_NOFUSE") != NULL; /* kv-rq: session 29's unfused key scores (A/B) */
    e->i8_nofuse = getenv("QF_I8_NOFUSE") != NULL; /* kv-int8: session 31's gather (A/B) */
    e->i8_novfuse = getenv("QF_I8_NOVFUSE") != NULL; /* kv-int8: V decoded into vbuf, then summed (A/B) */
    e->rq_nobatch = getenv("QF_RQ_NOBATCH") != NULL; /* kv-rq: one V coefficient sum per query head (A/B) */
    e->rq_nocfuse = getenv("QF_RQ_NOCFUSE") != NULL; /* kv-rq: coefficients through ykbuf / vbuf (A/B) */
    e->rq_kcodes = getenv("QF_RQ_KCODES") != NULL; /* kv-rq: no ykbuf at all, K codes read twice (A/B) */
    e->rq_csub = getenv("QF_RQ_CSUB") ? atoi(getenv("QF_RQ_CSUB")) : RQ_CSUB; /* kv-rq: short pieces (tests) */
    e->rq_csub = e->rq_csub < 1 || e->rq_csub > RQ_CSUB ? RQ_CSUB : e->rq_csub;
    /* QF_KV_DICT_EXPAND=1: a kv-dict cache is always decoded to f32 rows and attended as rows (the
     * route before the coefficient domain, for A/B runs); =0: the coefficient domain wherever it
     * applies, without dict_coef_pays's estimate (tests) */
    const char *dx = getenv("QF_KV_DICT_EXPAND");
    e->dict_route = !dx ? DICT_ROUTE_AUTO : !strcmp(dx, "0") ? DICT_ROUTE_COEF : DICT_ROUTE_EXPAND;
    const char *route = getenv("QF_RQ_ROUTE");
    c->rq_route = !route ? QF_RQ_ROUTE_AUTO
                  : !strcmp(route, "rows") ? QF_RQ_ROUTE_ROWS
                  : !strcmp(route, "explicit") ? QF_RQ_ROUTE_EXPLICIT
                  : !strcmp(route, "coef") ? QF_RQ_ROUTE_COEF : QF_RQ_ROUTE_AUTO;
    return c;
oom:
    qf_fail(err, QF_ERR_NOMEM, "out of memory allocating a context (n_ctx %d, n_batch %d)",
            c->params.n_ctx, c->n_batch);
fail:
    qf_context_free(c);
    return NULL;
}

const qf_context_params *qf_context_params_get(const qf_context *c) { return &c->params; }
qf_device qf_context_device(const qf_context *c) { return c->gpu ? QF_DEVICE_CUDA : QF_DEVICE_CPU; }

static const char *const device_names[] = {"auto", "cpu", "cuda"};
const char *qf_device_name(qf_device d) { return (unsigned)d < 3 ? device_names[d] : "unknown"; }
bool qf_device_from_name(const char *name, qf_device *out) {
    for (int i = 0; i < 3; i++)
        if (strcmp(name, device_names[i]) == 0) {
            *out = (qf_device)i;
            return true;
        }
    return false;
}
bool qf_cuda_available(void) { return qf_cuda_backend_available(); }
qf_model *qf_context_model(const qf_context *c) { return c->model; }

bool qf_context_canonical(const qf_context *c) {
    const qf_hparams *hp = &c->model->hp;
    if (!c->canon || hp->n_expert || hp->qk_norm || hp->post_norms || hp->attn_softcap > 0 || hp->final_softcap > 0 ||
        hp->swa != QF_SWA_NONE || hp->embd_scale != 1.0f || hp->ffn_act != QF_FFN_SILU)
        return false;
    const qf_kv_cache *kv = &c->kv;
    const qf_kv_mode m[2] = {kv->mode_k, kv->mode_v};
    if (m[0] == QF_KV_RQ && m[1] == QF_KV_RQ) return !kv->ring_rows; /* kv-rq: its rows, exact sinks / window */
    if (kv->n_sink || kv->n_window || kv->k_prerope) return false;
    for (int s = 0; s < 2; s++)
        if (m[s] != QF_KV_F32 && m[s] != QF_KV_F16 && m[s] != QF_KV_Q8_0 && m[s] != QF_KV_Q4_0 && m[s] != QF_KV_INT8)
            return false;
    return true;
}
void qf_context_set_tap(qf_context *c, const qf_tap *tap) { c->tap = tap; }
double qf_context_kv_bytes_per_token(const qf_context *c) { return qf_kv_cache_bytes_per_token(&c->kv); }

/* ---------------------------------------------------------------------------------------- */
/* matmul: y[n][N] = x[n][K] . W[N][K]^T                                                     */

/* Prefill jobs (routes 0 and 3) hand out rows in units of MM_UNIT (one f16 panel, two int8 panels):
 * TILE_ROWS at a time while much is left, then (remaining / 2 nth) units, down to MM_MIN_UNITS, so
 * the threads finish a matmul together. Each output row is computed by one call whatever the
 * split (every kernel sums a (row, token) in its own order, independent of the tile), so the
 * split does not change a digit. Measured (bench/bench_gemm_f16, 1B shapes, -t 2, interleaved):
 * fixed 128-row tiles left one thread idle for up to half a tile at the end of every matmul
 * (k/v: 4 tiles, 2.98-3.19 ms; down: 8/7 tiles of 5 ms each); shrinking to 64 rows: k/v 2.36 ms,
 * down 39.3-40.6 ms against 40.6-47.4; shrinking to 32 rows was in between (each chunk re-reads
 * the whole activation). */
#define MM_UNIT 32
#define MM_MIN_UNITS 2

typedef struct {
    qf_context *c;
    const qf_weight *w; /* routes 1, 2, 4: the weight (route 4: the first of ws) */
    const float *x;
    float *y;
    int n;
    int route; /* 0 gemm, 1 vec_dot, 2 reference, 3 int8 gemm (kernels/gemm.h), 4 its activations */
    /* routes 0 and 3: nw weights reading the same x (q, k, v or gate, up: one pool job), ws[k] into
     * ys[k]; weight k owns row units [u0[k], u0[k+1]); rps[k]: its repacked Q4_0 copy (repack.c) or
     * NULL. Units are taken from `next` (0 before a run) by mm_grab. */
    int nw;
    const qf_weight *ws[MV_MAX_W];
    float *ys[MV_MAX_W];
    const uint8_t *rps[MV_MAX_W];
    int64_t u0[MV_MAX_W + 1];
    _Atomic int64_t next;
    size_t xq_row;
} mm_job;

/* The next chunk of a prefill job: rows [*r0, *r1) of weight *k; false when none is left. The size
 * depends only on how many units are left (see MM_UNIT) and a chunk never spans two weights. */
static bool mm_grab(mm_job *j, int nth, int *k, int64_t *r0, int64_t *r1) {
    const int64_t U = j->u0[j->nw], tu = TILE_ROWS / MM_UNIT;
    int64_t cur = atomic_load(&j->next), sz;
    int kk;
    do {
        if (cur >= U) return false;
        sz = (U - cur) / (2 * nth);
        sz = sz > tu ? tu : sz < MM_MIN_UNITS ? MM_MIN_UNITS : sz;
        kk = 0;
        while (cur >= j->u0[kk + 1]) kk++;
        if (sz > j->u0[kk + 1] - cur) sz = j->u0[kk + 1] - cur;
    } while (!atomic_compare_exchange_weak(&j->next, &cur, cur + sz));
    const int64_t N = j->ws[kk]->ne1, r = (cur - j->u0[kk]) * MM_UNIT;
    *k = kk;
    *r0 = r;
    *r1 = r + sz * MM_UNIT < N ? r + sz * MM_UNIT : N;
    return true;
}

static void mm_worker(void *arg, int ith, int nth) {
    mm_job *j = arg;
    float *buf = j->c->thr_buf[ith];
    if (j->route == 4) { /* quantize this thread's share of the tokens for route 3 */
        const qf_weight *w = j->w;
        int64_t K = w->ne0, a0, a1;
        qf_split_range(j->n, ith, nth, &a0, &a1);
        if (qf_gemm_k_type(w->type)) qf_gemm_k_quantize_act(j->x, K, (int)a0, (int)a1, ext(j->c)->gact, buf);
        else qf_gemm_quantize_act(w->type, j->x, K, (int)a0, (int)a1, ext(j->c)->gact, buf);
        return;
    }
    if (j->route == 0 || j->route == 3) {
        int k;
        int64_t r, re;
        while (mm_grab(j, nth, &k, &r, &re)) { /* one packed chunk in buf at a time */
            const qf_weight *w = j->ws[k];
            const int64_t K = w->ne0, N = w->ne1, tr = re - r;
            const uint8_t *wd = w->data;
            float *y = j->ys[k];
            if (j->route == 3) { /* the oracles only on the canonical route of a CPU without the kernel */
                const uint8_t *act = ext(j->c)->gact;
                if (j->rps[k]) qf_gemm_q4x16_rows(j->rps[k], K, r, re, act, j->n, y, N);
                else if (qf_gemm_k_type(w->type)) {
                    if (qf_gemm_k_supported(w->type)) qf_gemm_k_rows(w->type, wd, w->row_bytes, K, r, re, act, j->n, y, N, buf);
                    else qf_gemm_k_rows_ref(w->type, wd, w->row_bytes, K, r, re, act, j->n, y, N);
                } else if (qf_gemm_q8_supported(w->type))
                    qf_gemm_q8_rows(w->type, wd, w->row_bytes, K, r, re, act, j->n, y, N, buf);
                else qf_gemm_q8_rows_ref(w->type, wd, w->row_bytes, K, r, re, act, j->n, y, N);
                continue;
            }
            if (w->type == QF_TYPE_F16 && K % 16 == 0 && qf_gemm_f16_supported()) {
                /* f16 converted in registers, AVX-512 FMA micro-kernel (kernels/gemm.h) */
                qf_gemm_f16_rows(wd, w->row_bytes, K, r, re, j->x, j->n, y, N, buf);
                continue;
            }
            const float *wt;
            if (w->type == QF_TYPE_F32) wt = (const float *)(wd + (size_t)r * w->row_bytes);
            else {
                for (int64_t i = 0; i < tr; i++)
                    (j->c->canon ? qf_dequantize_row_ref : qf_dequantize_row)(w->type, wd + (size_t)(r + i) * w->row_bytes,
                                                                            buf + i * K, K);
                wt = buf;
            }
            if (j->c->canon) { /* the f32 chain of each (row, token): the same sums as the f16 kernel */
                qf_canon_gemm_rows(wt, K, tr, j->x, j->n, y + r, N, buf + j->c->canon_scr);
                continue;
            }
            qf_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->n, (int)tr, (int)K, 1.0f, j->x, (int)K, wt, (int)K,
                     0.0f, y + r, (int)N);
        }
        return;
    }
    const qf_weight *w = j->w;
    int64_t K = w->ne0, N = w->ne1, r0, r1;
    qf_split_range(N, ith, nth, &r0, &r1);
    const uint8_t *wd = w->data;
    if (j->route == 1) {
        const uint8_t *xq = j->c->xq;
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *wr = wd + (size_t)r * w->row_bytes;
            for (int t = 0; t < j->n; t++) j->y[(size_t)t * N + r] = qf_vec_dot(w->type, K, wr, xq + t * j->xq_row);
        }
    } else {
        for (int64_t r = r0; r < r1; r++) {
            qf_dequantize_row_ref(w->type, wd + (size_t)r * w->row_bytes, buf, K);
            for (int t = 0; t < j->n; t++) {
                const float *xr = j->x + (size_t)t * K;
                double s = 0;
                for (int64_t i = 0; i < K; i++) s += (double)xr[i] * buf[i];
                j->y[(size_t)t * N + r] = (float)s;
            }
        }
    }
}

/* ---- decode: several weights that read the same input in one pool job (kernels/matvec.h) ----
 * y_k[t][r] = x[t] . W_k[r] for k < nw, t < n (n < GEMM_MIN_TOKENS): the activation is prepared
 * once per (type, token), then the threads take chunks of rows (rows[k] a chunk of weight k: about
 * MV_CHUNK_BYTES, fewer in a small job so that each thread gets several) of all the weights from one
 * atomic counter: one pool wake-up for q, k and v (or gate and up) instead of three. */
typedef struct {
    int nw, n;
    const qf_weight *w[MV_MAX_W];
    float *y[MV_MAX_W];
    const uint8_t *act[MV_MAX_W]; /* token t's prepared row at act[k] + t * act_stride */
    const uint8_t *rp[MV_MAX_W];  /* the repacked Q4_0 copy of w[k] (repack.c; act[k]: qf_gemm_quantize_act
                                   * rows, qf_gemm_act_stride apart) or NULL (act[k]: qf_matvec_prepare's) */
    size_t act_stride;
    int64_t chunk0[MV_MAX_W + 1]; /* weight k owns chunks [chunk0[k], chunk0[k+1]) */
    int64_t rows[MV_MAX_W];       /* rows of weight k a chunk (a multiple of 16) */
    _Atomic int64_t next;
} mv_job;

static void mv_worker(void *arg, int ith, int nth) {
    mv_job *j = arg;
    for (int64_t ch; (ch = atomic_fetch_add(&j->next, 1)) < j->chunk0[j->nw];) {
        int k = 0;
        while (ch >= j->chunk0[k + 1]) k++;
        const qf_weight *w = j->w[k];
        int64_t r0 = (ch - j->chunk0[k]) * j->rows[k], r1 = r0 + j->rows[k] < w->ne1 ? r0 + j->rows[k] : w->ne1;
        if (j->rp[k]) { /* all tokens at once: each weight line is loaded once */
            qf_gemm_q4x16_rows(j->rp[k], w->ne0, r0, r1, j->act[k], j->n, j->y[k], w->ne1);
            continue;
        }
        for (int t = 0; t < j->n; t++)
            qf_matvec_rows(w->type, w->data, w->row_bytes, w->ne0, r0, r1, j->act[k] + (size_t)t * j->act_stride,
                           j->y[k] + (size_t)t * w->ne1);
    }
}

/* Run the nw matmuls y[k] = x . W[k]^T as one decode matvec job; false (nothing done) when the
 * route does not apply (prefill, the reference route, a type or shape without the fast kernel). */
static bool matvec_multi(qf_context *c, int nw, const qf_weight *const *ws, const float *x, int n, float *const *ys) {
    if (c->params.reference || c->canon || n >= GEMM_MIN_TOKENS || nw > MV_MAX_W) return false;
    int64_t K = ws[0]->ne0;
    ctx_ext *e = ext(c);
    mv_job j = {.nw = nw, .n = n, .act_stride = e->mvact_row};
    const bool x16 = qf_gemm_q4x16_supported();
    for (int k = 0; k < nw; k++) {
        j.rp[k] = x16 ? qf_model_repacked(c->model, ws[k]) : NULL;
        if (ws[k]->ne0 != K || !(j.rp[k] || qf_matvec_supported(ws[k]->type, K))) return false;
    }
    j.chunk0[0] = 0;
    for (int k = 0; k < nw; k++) {
        j.w[k] = ws[k];
        j.y[k] = ys[k];
        int same = -1;
        for (int q = 0; q < k; q++)
            if (ws[q]->type == ws[k]->type && !j.rp[q] == !j.rp[k]) same = q;
        if (same >= 0) j.act[k] = j.act[same];
        else {
            /* room: GEMM_MIN_TOKENS rows of mvact_row bytes (the f16 layout, 4 bytes an element), more
             * than n rows of qf_gemm_act_stride (1.25 bytes an element) */
            uint8_t *a = e->mvact + (size_t)k * GEMM_MIN_TOKENS * e->mvact_row;
            if (j.rp[k]) qf_gemm_quantize_act(QF_TYPE_Q4_0, x, K, 0, n, a, c->xq);
            else
                for (int t = 0; t < n; t++) qf_matvec_prepare(ws[k]->type, x + (size_t)t * K, K, a + (size_t)t * e->mvact_row);
            j.act[k] = a;
        }
    }
    /* chunk size: MV_CHUNK_BYTES, or an eighth of the job per thread when that is smaller (q4_0 q|k|v at
     * 1B is 3.5 MB: one 512 KB chunk left to one thread at the end would be 15% of the job) */
    size_t job_bytes = 0;
    for (int k = 0; k < nw; k++) job_bytes += (size_t)ws[k]->ne1 * ws[k]->row_bytes;
    size_t target = job_bytes / (8 * (size_t)qf_pool_size(c->pool));
    if (target > MV_CHUNK_BYTES) target = MV_CHUNK_BYTES;
    for (int k = 0; k < nw; k++) {
        int64_t rows = (int64_t)(target / ws[k]->row_bytes) & ~(int64_t)15;
        j.rows[k] = rows < 16 ? 16 : rows;
        j.chunk0[k + 1] = j.chunk0[k] + (ws[k]->ne1 + j.rows[k] - 1) / j.rows[k];
    }
    atomic_store(&j.next, 0);
    qf_pool_run(c->pool, mv_worker, &j);
    return true;
}

/* the prefill route of weight type t: 3 (int8 / K-quant GEMM on quantized activations) or 0 (f16
 * micro-kernel, dequantize + sgemm, or the canonical chain). The canonical route takes 3 for every
 * type the integer GEMMs know, with their scalar oracles where this CPU lacks the kernel. */
static int prefill_route(const qf_context *c, qf_type t) {
    if (c->canon) return qf_gemm_q8_type(t) || qf_gemm_k_type(t) ? 3 : 0;
    return qf_gemm_q8_supported(t) || qf_gemm_k_supported(t) ? 3 : 0;
}

/* Weights whose prefill can share one job: the same route, K and activation layout (route 3: the
 * same Q8_0-family type, or both K-quants, whose Q8_K activations are the same) */
static bool prefill_compatible(const qf_context *c, const qf_weight *a, const qf_weight *b) {
    if (a->ne0 != b->ne0 || prefill_route(c, a->type) != prefill_route(c, b->type)) return false;
    if (prefill_route(c, a->type) == 0) return true;
    return a->type == b->type || (qf_gemm_k_type(a->type) && qf_gemm_k_type(b->type));
}

/* The prefill GEMM (n >= GEMM_MIN_TOKENS, not the reference route) of nw weights that read the same x,
 * as one pool job (route 3: after one job quantizing x). */
static void matmul_prefill(qf_context *c, int nw, const qf_weight *const *ws, const float *x, int n, float *const *ys) {
    mm_job j = {.c = c, .w = ws[0], .x = x, .y = ys[0], .n = n, .nw = nw};
    j.route = prefill_route(c, ws[0]->type);
    j.u0[0] = 0;
    for (int k = 0; k < nw; k++) {
        j.ws[k] = ws[k];
        j.ys[k] = ys[k];
        j.rps[k] = j.route == 3 && qf_gemm_q4x16_supported() ? qf_model_repacked(c->model, ws[k]) : NULL;
        j.u0[k + 1] = j.u0[k] + (ws[k]->ne1 + MM_UNIT - 1) / MM_UNIT;
    }
    if (j.route == 3) { /* Q8_0 / Q4_0 / Q4_K / Q6_K: activations to Q8_0 or Q8_K (as decode and ggml do) */
        j.route = 4;
        qf_pool_run(c->pool, mm_worker, &j);
        j.route = 3;
    }
    atomic_store(&j.next, 0);
    qf_pool_run(c->pool, mm_worker, &j);
}

static void matmul(qf_context *c, const qf_weight *w, const float *x, int n, float *y);

/* q, k, v (or gate, up): one decode matvec job or one prefill job when it applies, else one matmul each */
static void matmul_n(qf_context *c, int nw, const qf_weight *const *ws, const float *x, int n, float *const *ys) {
    if (matvec_multi(c, nw, ws, x, n, ys)) return;
    bool one = !c->params.reference && (n >= GEMM_MIN_TOKENS || c->canon);
    for (int k = 1; k < nw && one; k++) one = prefill_compatible(c, ws[0], ws[k]);
    if (one) {
        matmul_prefill(c, nw, ws, x, n, ys);
        return;
    }
    for (int k = 0; k < nw; k++) matmul(c, ws[k], x, n, ys[k]);
}

static void matmul(qf_context *c, const qf_weight *w, const float *x, int n, float *y) {
    if (matvec_multi(c, 1, &w, x, n, &y)) return;
    if (!c->params.reference && (n >= GEMM_MIN_TOKENS || c->canon)) {
        matmul_prefill(c, 1, &w, x, n, &y);
        return;
    }
    mm_job j = {.c = c, .w = w, .x = x, .y = y, .n = n};
    if (c->params.reference) j.route = 2;
    else {
        j.route = 1;
        qf_type vt = qf_vec_dot_type(w->type);
        j.xq_row = qf_row_bytes(vt, w->ne0);
        QF_ASSERT((size_t)n * j.xq_row <= c->xq_bytes); /* sized in qf_context_new for GEMM_MIN_TOKENS rows */
        for (int t = 0; t < n; t++)
            qf_quantize_row(vt, x + (size_t)t * w->ne0, (uint8_t *)c->xq + t * j.xq_row, w->ne0);
    }
    qf_pool_run(c->pool, mm_worker, &j);
}

/* ---------------------------------------------------------------------------------------- */
/* elementwise pieces                                                                        */

/* cos/sin of every rotated pair for positions pos0..pos0+n, as ggml's rope cache computes them
 * (theta advanced by repeated multiplication in f32) */
static void rope_row_base(qf_context *c, float base, float freq_scale, int pos, float *cs, float *sn) {
    const qf_hparams *hp = &c->model->hp;
    int half = hp->n_rot / 2;
    float theta_scale = powf(base, -2.0f / (float)hp->n_rot);
    const float *ff = ext(c)->vecs.rope_ff;
    float theta = (float)pos;
    for (int i = 0; i < half; i++) {
        float th = freq_scale * (ff ? theta / ff[i] : theta);
        cs[i] = cosf(th);
        sn[i] = sinf(th);
        theta *= theta_scale;
    }
}

static void rope_row(qf_context *c, int pos, float *cs, float *sn) {
    rope_row_base(c, c->model->hp.rope_freq_base, c->model->hp.rope_freq_scale, pos, cs, sn);
}

/* the batch's tables; and those of the sliding-window layers when they have their own base
 * (gemma3: local base, no frequency scaling) */
static void rope_tables(qf_context *c, int pos0, int n) {
    const qf_hparams *hp = &c->model->hp;
    int half = hp->n_rot / 2;
    for (int t = 0; t < n; t++) rope_row(c, pos0 + t, c->rope_cos + t * half, c->rope_sin + t * half);
    if (ext(c)->rope_cos_swa)
        for (int t = 0; t < n; t++)
            rope_row_base(c, hp->rope_freq_base_swa, 1.0f, pos0 + t, ext(c)->rope_cos_swa + t * half,
                          ext(c)->rope_sin_swa + t * half);
}

/* A cache that stores K before RoPE (kv.k_prerope) is rotated on read with tables for every
 * position, computed once per context by the same rope_row: bit-identical to rotating first. */
static qf_status kv_rope_tables(qf_context *c, qf_error *err) {
    ctx_ext *e = ext(c);
    if (e->kr_cos) return QF_OK;
    int half = c->model->hp.n_rot / 2, n_ctx = c->params.n_ctx;
    const qf_hparams *hp = &c->model->hp;
    bool two = e->rope_cos_swa != NULL; /* gemma3: local layers have their own base */
    e->kr_cos = malloc((size_t)n_ctx * half * sizeof(float) + 1);
    e->kr_sin = malloc((size_t)n_ctx * half * sizeof(float) + 1);
    if (two) {
        e->kr_cos_swa = malloc((size_t)n_ctx * half * sizeof(float) + 1);
        e->kr_sin_swa = malloc((size_t)n_ctx * half * sizeof(float) + 1);
    }
    if (!e->kr_cos || !e->kr_sin || (two && (!e->kr_cos_swa || !e->kr_sin_swa))) {
        free(e->kr_cos), free(e->kr_sin), free(e->kr_cos_swa), free(e->kr_sin_swa);
        e->kr_cos = e->kr_sin = e->kr_cos_swa = e->kr_sin_swa = NULL;
        return qf_fail(err, QF_ERR_NOMEM, "decode: out of memory for the pre-RoPE K tables");
    }
    for (int p = 0; p < n_ctx; p++) {
        rope_row(c, p, e->kr_cos + (size_t)p * half, e->kr_sin + (size_t)p * half);
        if (two)
            rope_row_base(c, hp->rope_freq_base_swa, 1.0f, p, e->kr_cos_swa + (size_t)p * half,
                          e->kr_sin_swa + (size_t)p * half);
    }
    return QF_OK;
}

/* rotate n_heads heads of one vector by the tables cs, sn (NORM: adjacent pairs; NEOX: halves) */
static void rope_rotate(const qf_hparams *hp, const float *cs, const float *sn, float *v, int n_heads) {
    int half = hp->n_rot / 2, hd = hp->head_dim;
    for (int h = 0; h < n_heads; h++) {
        float *x = v + (size_t)h * hd;
        if (hp->rope_type == QF_ROPE_NEOX) { /* the same operations, one loop per layout (vectorizes) */
            for (int i = 0; i < half; i++) {
                float x0 = x[i], x1 = x[i + half];
                x[i] = x0 * cs[i] - x1 * sn[i];
                x[i + half] = x0 * sn[i] + x1 * cs[i];
            }
        } else {
            qf_rope_pairs(x, cs, sn, half); /* the same operations, AVX-512 where it runs */
        }
    }
}

/* rotate every head of one token's q or k in the current batch by the tables cs, sn */
static void rope_apply(const qf_context *c, const float *cs, const float *sn, float *v, int n_heads, int t) {
    int half = c->model->hp.n_rot / 2;
    rope_rotate(&c->model->hp, cs + t * half, sn + t * half, v, n_heads);
}

/* ---------------------------------------------------------------------------------------- */
/* attention                                                                                 */

typedef struct {
    qf_context *c;
    int layer, n, pos0;
    bool vcoef; /* kv-rq fast route: vbuf holds V's coefficients, attention sums them (rq_vcoef) */
    int gphase; /* kv_gather_worker's phase: 0 all at once, or 1, 2, 3 (V predicted from K) */
    int rq_run; /* kv-rq fast route: positions per work item of the gather (rq_run_len, rq_run_even) */
    /* kv-rq fast route, a one-query step (rq_kfused): the gather decodes each run of keys into
     * per-thread scratch, RoPE and all, and scores it against the group's queries there (rq_sc):
     * kbuf is not written, nor read back once per query head */
    bool kfused;
    /* kv-rq fast route, vcoef with few queries (rq_vgroup): attention_worker takes a kv head's
     * query heads together, their V coefficient sums one product of gq x n rows (vbuf's and
     * ykbuf's rows read once per kv head, not once per query head) */
    bool vgroup;
    /* kv-rq fast route, kfused and vgroup (rq_cfused): V's coefficients do not go to vbuf. The
     * gather does K only (ykbuf and the scores, as kfused); attention_worker makes every query
     * head's weights (rq_w); rq_csum_worker per kv head g reads V's codes of head g, RQ_CSUB rows at
     * a time into scratch, and adds them to the weighted sums of g's query heads, and adds K head g's
     * ykbuf columns to every query head's K sums (ykbuf read once a layer, not once per kv head);
     * rq_apply_worker maps the sums to the outputs. QF_RQ_KCODES=1: K's codes are looked up a few
     * rows at a time in the gather and again in rq_csum_worker, ykbuf not written at all */
    bool cfused;
    int q0; /* attention_worker: queries before q0's ATT_QBLOCK block are not computed (their output is
             * not needed); 0 for all */
    /* rows stored rotated (--kv-rot, kv-int8 *_ROT layouts) attended in that basis: kbuf (rotk)
     * holds H k as stored and attention_worker rotates each query head (H q) in c->q; vbuf (rotv)
     * holds H v and the head's output is rotated back (H o). H is orthonormal and symmetric, so
     * the scores and outputs are the same to rounding. */
    bool rotk, rotv;
    /* a decode step over a plain f16 / q8_0 / q4_0 cache: no gather, attention_worker reads the
     * cache's rows (qf_vec_rows_dot_kv for the scores, qf_gemm_nn_kv for the values), of types
     * kt and vt */
    bool kv_direct;
    qf_type kt, vt;
    /* a decode step over a kv-dict stream, in the coefficient domain (engine.h qf_kv_cache_dict_slots;
     * docs/kv-learners.md): kv_gather_worker parses the stream's codes into dict_idx / dict_coef
     * instead of decoding rows; K (stored after RoPE only): each query's dot products with the
     * atoms, P = A q, then a key's score is sum_j c_j P[i_j]; V: each atom's total softmax weight,
     * then one weighted sum of the atoms */
    bool kdict, vdict;
    /* a one-query step over kv-int8 ec-rot streams (i8_kfused): i8_gather_worker scores the keys
     * as it decodes them (qf_kv_cache_int8_scores into i8_sc; kbuf not written, c->q rotated
     * before the gather) and decodes V into vbuf, both in runs of i8_run positions */
    bool i8kfused;
    int i8_run;
    /* i8kfused, and V summed as it is decoded (i8_vfused): the gather does K only; i8_weights_worker
     * makes every query head's weights (i8_w), i8_vsum_worker per (V group, chunk of I8_VCHUNK
     * positions) decodes the rows and adds them, weighted, into the chunk's partial outputs
     * (qf_kv_cache_int8_vsum: no vbuf), i8_vreduce_worker sums the chunks in order (the same bits
     * for any thread count) and rotates each head's output back */
    bool i8vfused;
} att_job;

/* ---- exact sinks and recent window (kv_cache.c's qf_kv_cache_set_exact) ----
 * For query position t, keys p < n_sink and t - n_window < p <= t are exact (f16 values) and
 * every other key is the stored row. The stored-row scores and output come from the usual
 * sgemm; the exact keys then replace their scores before the softmax and add
 * w_p (Vexact_p - Vstored_p) after it, a per-(t, p) choice costing (n_sink + n_window) * head_dim
 * per query. exact_gather fills the exact view of one (stream, kv head) for the positions a
 * batch at [pos0, pos0+n) reads exactly: the sinks and [pos0 - n_window + 1, pos0 + n). The
 * batch's own positions come from its fresh k/v rounded to f16 (what the window ring will
 * hold), earlier ones from the cache's sink store or window ring; a position neither holds
 * (e.g. after a rewind) falls back to the stored row `stored`. So decode and batched prefill
 * read the same values. */
static void exact_gather(qf_context *c, const void *jv, int stream, int h, const float *stored);

/* gather the cache's f32 view of every kv head for positions [0, pos0+n). Phases (att_job.gphase):
 * 0 every (stream, kv head) read and finished in one item; where V is predicted from the stored
 * K (a kv-rq V predictor), 1 reads the K heads as stored, 2 the V heads with their prediction
 * from those rows (each K row decoded once a layer, not once per V head), 3 finishes both
 * streams (RoPE on K, the exact sink / window views) */
static void kv_gather_worker(void *arg, int ith, int nth) {
    att_job *j = arg;
    qf_context *c = j->c;
    const qf_hparams *hp = &c->model->hp;
    int T = j->pos0 + j->n, nh = hp->n_head_kv;
    const size_t hs = (size_t)c->params.n_ctx * hp->head_dim; /* floats a kv head of kbuf / vbuf */
    /* work items: per stream, its kv heads, or the groups of heads stored in one row (kv-int8
     * ec), read together (phase 0 only) */
    const int G0 = j->gphase == 0 ? qf_kv_cache_head_group(&c->kv, 0) : 1,
              G1 = j->gphase == 0 ? qf_kv_cache_head_group(&c->kv, 1) : 1, n0 = nh / G0;
    for (int idx = ith; idx < n0 + nh / G1; idx += nth) {
        const int stream = idx >= n0, G = stream ? G1 : G0, h = (stream ? idx - n0 : idx) * G;
        if ((j->gphase == 1 && stream) || (j->gphase == 2 && !stream)) continue;
        if (stream ? j->vdict : j->kdict) { /* kv-dict in the coefficient domain: the codes parsed, no rows */
            int sp;
            qf_kv_cache_dict(&c->kv, stream, j->layer, &sp);
            const size_t nc = (size_t)c->params.n_ctx, o = (size_t)h * sp * nc;
            qf_kv_cache_dict_slots(&c->kv, stream, j->layer, h, T, ext(c)->dict_idx[stream] + o,
                                   ext(c)->dict_coef[stream] + o, nc);
            if (c->kv.n_sink || c->kv.n_window) exact_gather(c, j, stream, h, NULL); /* G == 1 */
            continue;
        }
        float *dst = (stream ? ext(c)->vbuf : ext(c)->kbuf) + (size_t)h * hs;
        const bool rotated = stream ? j->rotv : j->rotk;
        if (j->gphase == 2) qf_kv_cache_read_head_vpred(&c->kv, j->layer, h, T, ext(c)->kbuf, hs, dst);
        else if (j->gphase < 3 && G > 1) qf_kv_cache_read_heads(&c->kv, stream, j->layer, h, T, dst, hs, rotated);
        else if (j->gphase < 3 && rotated) qf_kv_cache_read_head_rotated(&c->kv, stream, j->layer, h, T, dst);
        else if (j->gphase < 3) qf_kv_cache_read_head(&c->kv, stream, j->layer, h, T, dst);
        if (j->gphase == 1 || j->gphase == 2) continue;
        for (int jh = h; jh < h + G; jh++) {
            float *dj = (stream ? ext(c)->vbuf : ext(c)->kbuf) + (size_t)jh * hs;
            if (stream == 0 && c->kv.k_prerope) { /* RoPE on read, per position */
                int half = hp->n_rot / 2;
                bool swa = ext(c)->kr_cos_swa && qf_hparams_layer_swa(hp, j->layer);
                const float *kc = swa ? ext(c)->kr_cos_swa : ext(c)->kr_cos, *ks = swa ? ext(c)->kr_sin_swa : ext(c)->kr_sin;
                for (int p = 0; p < T; p++)
                    rope_rotate(hp, kc + (size_t)p * half, ks + (size_t)p * half, dj + (size_t)p * hp->head_dim, 1);
            }
            if (c->kv.n_sink || c->kv.n_window) exact_gather(c, j, stream, jh, dj);
        }
    }
}

/* att_job.i8kfused: a one-query step (n == 1) over kv-int8 ec-rot rows in plain slots, attended
 * in their rotated basis (rotk, rotv: no RoPE on read, no exact keys, not the canonical or
 * reference routes), G * head_dim within the dot kernel's row, gq within its queries, and
 * i8_sc allocated. The keys' rows then never go to kbuf and back: each is scored right after it
 * is decoded (qf_kv_cache_int8_scores: qf_vec_rows_dot's bits over the rows as read), and both
 * streams' rows are split into runs so that every thread decodes about as many rows of each.
 * QF_I8_NOFUSE=1: never. */
static bool i8_kfused(qf_context *c, const att_job *j, int n) {
    const qf_hparams *hp = &c->model->hp;
    const int gq = hp->n_head / hp->n_head_kv, l = j->layer;
    if (n != 1 || !j->rotk || !j->rotv || j->kv_direct || j->kdict || j->vdict || ext(c)->i8_nofuse) return false;
    if (!qf_kv_cache_int8_ec_plain(&c->kv, 0, l) || !qf_kv_cache_int8_ec_plain(&c->kv, 1, l) ||
        qf_kv_cache_v_predicted(&c->kv, l) || gq > QF_KV_EC_DOT_MAXQ ||
        qf_kv_cache_head_group(&c->kv, 0) * hp->head_dim > QF_KV_EC_SEG_MAX)
        return false;
    if (!ext(c)->i8_sc) ext(c)->i8_sc = qf_malloc_aligned((size_t)hp->n_head * c->params.n_ctx * sizeof(float));
    return ext(c)->i8_sc != NULL;
}

#define I8_VCHUNK 64 /* positions a V item of att_job.i8vfused sums (a multiple of 32: the kernels' rows) */

/* att_job.i8vfused: i8kfused, V's group rows within the kernels' segments (head_dim % 16 == 0),
 * and the buffers allocated. QF_I8_NOVFUSE=1: never. */
static bool i8_vfused(qf_context *c, const att_job *j) {
    const qf_hparams *hp = &c->model->hp;
    if (!j->i8kfused || ext(c)->i8_novfuse || hp->head_dim % 16 ||
        qf_kv_cache_head_group(&c->kv, 1) * hp->head_dim > QF_KV_EC_SEG_MAX)
        return false;
    ctx_ext *e = ext(c);
    const size_t nc = (size_t)c->params.n_ctx, nch = (nc + I8_VCHUNK - 1) / I8_VCHUNK;
    const int gq = hp->n_head / hp->n_head_kv;
    if (!e->i8_w) e->i8_w = qf_malloc_aligned((size_t)hp->n_head * nc * sizeof(float));
    if (!e->i8_vpart) e->i8_vpart = qf_malloc_aligned(nch * (size_t)hp->n_head * hp->head_dim * sizeof(float));
    if (e->i8_vacc && e->i8_vacc_nth < qf_pool_size(c->pool)) free(e->i8_vacc), e->i8_vacc = NULL;
    if (!e->i8_vacc) {
        e->i8_vacc_nth = qf_pool_size(c->pool);
        e->i8_vacc_per = ((size_t)qf_kv_cache_head_group(&c->kv, 1) * gq * hp->head_dim * 16 + 15) / 16 * 16;
        e->i8_vacc = qf_malloc_aligned(e->i8_vacc_per * (size_t)qf_pool_size(c->pool) * sizeof(float));
        if (e->i8_vacc) memset(e->i8_vacc, 0, e->i8_vacc_per * (size_t)qf_pool_size(c->pool) * sizeof(float));
    }
    return e->i8_w && e->i8_vpart && e->i8_vacc;
}

/* att_job.i8kfused's runs: the T positions in one run per thread, a multiple of 32 rows (the
 * kernels' width) but the last */
static int i8_run_len(const qf_context *c, int T) {
    const int nth = qf_pool_size(c->pool), r = (T + nth - 1) / nth;
    return (r + 31) / 32 * 32;
}

/* att_job.i8kfused's gather: items (K group, run) then (V group, run), handed out round-robin;
 * a K item scores its rows against the group's query heads (c->q, already rotated) into i8_sc, a
 * V item decodes its rows into vbuf as kv_gather_worker would (no V items with j->i8vfused) */
static void i8_gather_worker(void *arg, int ith, int nth) {
    att_job *j = arg;
    qf_context *c = j->c;
    const qf_hparams *hp = &c->model->hp;
    const int T = j->pos0 + j->n, nh = hp->n_head_kv, gq = hp->n_head / nh, R = j->i8_run, nr = (T + R - 1) / R;
    const int G0 = qf_kv_cache_head_group(&c->kv, 0), G1 = qf_kv_cache_head_group(&c->kv, 1);
    const int nK = nh / G0 * nr, nV = j->i8vfused ? 0 : nh / G1 * nr;
    const size_t hs = (size_t)c->params.n_ctx * hp->head_dim, nc = (size_t)c->params.n_ctx;
    for (int idx = ith; idx < nK + nV; idx += nth) {
        const int stream = idx >= nK, e = stream ? idx - nK : idx, h = e / nr * (stream ? G1 : G0), p0 = e % nr * R;
        const int p1 = T - p0 < R ? T : p0 + R;
        if (!stream) qf_kv_cache_int8_scores(&c->kv, j->layer, h, p0, p1, c->q, gq, ext(c)->i8_sc, nc);
        else qf_kv_cache_read_heads_span(&c->kv, 1, j->layer, h, p0, p1, ext(c)->vbuf + (size_t)h * hs, hs, true);
    }
}

/* att_job.i8vfused, after the gather: every query head's softmax weights into i8_w */
static void head_weights(qf_context *c, const att_job *j, int ith, int h, int i0, int nb, float *S);
static void i8_weights_worker(void *arg, int ith, int nth) {
    att_job *j = arg;
    qf_context *c = j->c;
    for (int h = ith; h < c->model->hp.n_head; h += nth)
        head_weights(c, j, ith, h, 0, 1, ext(c)->i8_w + (size_t)h * c->params.n_ctx);
}

/* att_job.i8vfused: items (V group, chunk), each chunk's partial outputs of the group's query heads */
static void i8_vsum_worker(void *arg, int ith, int nth) {
    att_job *j = arg;
    qf_context *c = j->c;
    const qf_hparams *hp = &c->model->hp;
    const int T = j->pos0 + j->n, nh = hp->n_head_kv, gq = hp->n_head / nh, hd = hp->head_dim;
    const int G = qf_kv_cache_head_group(&c->kv, 1), nch = (T + I8_VCHUNK - 1) / I8_VCHUNK;
    const size_t nc = (size_t)c->params.n_ctx, per = (size_t)hp->n_head * hd;
    float *acc = ext(c)->i8_vacc + (size_t)ith * ext(c)->i8_vacc_per;
    for (int idx = ith; idx < nh / G * nch; idx += nth) {
        const int h = idx / nch * G, ch = idx % nch, p0 = ch * I8_VCHUNK, p1 = T - p0 < I8_VCHUNK ? T : p0 + I8_VCHUNK;
        float *y = ext(c)->i8_vpart + (size_t)ch * per;
        memset(y + (size_t)h * gq * hd, 0, (size_t)G * gq * hd * sizeof(float));
        qf_kv_cache_int8_vsum(&c->kv, j->layer, h, p0, p1, ext(c)->i8_w, gq, nc, acc, y, (size_t)hd);
    }
}

/* att_job.i8vfused: each query head's output, the chunks summed in order, then out of V's rotated basis */
static void i8_vreduce_worker(void *arg, int ith, int nth) {
    att_job *j = arg;
    qf_context *c = j->c;
    const qf_hparams *hp = &c->model->hp;
    const int T = j->pos0 + j->n, hd = hp->head_dim, nch = (T + I8_VCHUNK - 1) / I8_VCHUNK;
    const size_t per = (size_t)hp->n_head * hd;
    for (int h = ith; h < hp->n_head; h += nth) {
        float *O = c->att + (size_t)h * hd;
        const float *P = ext(c)->i8_vpart + (size_t)h * hd;
        memcpy(O, P, (size_t)hd * sizeof(float));
        for (int ch = 1; ch < nch; ch++)
            for (int e = 0; e < hd; e++) O[e] += P[(size_t)ch * per + e];
        if (j->rotv) qf_hadamard(O, hd);
    }
}

/* ---- kv-rq caches, fast route (engine.h "kv-rq in the coefficient domain") ----
 * Phase 1, per (stream, kv head, run of j->rq_run positions): the rows' coefficients; K decoded
 * by one GEMM per run into kbuf (and rotated, for a pre-RoPE cache), its coefficients kept in
 * ykbuf for V's predictor; V either decoded the same way into vbuf (phase 2 adds the
 * prediction) or, with j->vcoef, left as coefficients in vbuf for attention_worker to sum.
 * Phase 2: the prediction, and the exact sink/window views. */
#define RQ_RUN_MIN 64
#define RQ_RUN_MAX 512 /* the per-thread scratch holds one run of V coefficients */

/* long runs (fewer, larger GEMMs), but about 4 work items per thread */
static int rq_run_len(const qf_context *c, int T) {
    int nth = qf_pool_size(c->pool), per = (4 * nth + 2 * c->model->hp.n_head_kv - 1) / (2 * c->model->hp.n_head_kv);
    int run = (T + per - 1) / per;
    return run < RQ_RUN_MIN ? RQ_RUN_MIN : run > RQ_RUN_MAX ? RQ_RUN_MAX : run;
}

/* A one-query step's runs (att_job.kfused: rows decoded by qf_gemm_nn_f32, whose rows do not
 * depend on the split, so any run length gives the same bits): rq_run_len's count per kv head,
 * raised until the kv heads' runs share out evenly over the threads (the gather hands its items
 * out round-robin), the T positions split into runs that differ by at most one row. With
 * rq_run_len's runs, whose last is short, one thread took two full runs where the other took a
 * full one and a short one (27m model, 2 threads, T = 1683: 2048 rows against 1318). */
static int rq_run_even(const qf_context *c, int T) {
    const int nth = qf_pool_size(c->pool), nh = c->model->hp.n_head_kv, R0 = rq_run_len(c, T);
    int nr = (T + R0 - 1) / R0;
    while ((nh * nr) % nth && (T + nr) / (nr + 1) >= RQ_RUN_MIN) nr++;
    return (T + nr - 1) / nr;
}

/* V attention in the coefficient domain pays when the queries per kv head are few: it sums
 * (m_v + kdim) coefficients per (query, key) instead of decoding each key's V once
 * (head_dim (m_v + kdim) per key) */
static bool rq_vcoef(const qf_context *c, int n, int T) {
    const qf_hparams *hp = &c->model->hp;
    double gq = (double)hp->n_head / hp->n_head_kv;
    return gq * n * ((double)T + hp->head_dim) < (double)T * hp->head_dim;
}

/* A one-query step's keys scored in the gather pays where they are many: the decoded rows of a
 * run stay in cache (RQ_SUB of them at a time) instead of going to kbuf and back once per query
 * head. Needs the GEMM kernel whose rows do not depend on the run's split (qf_gemm_nn_f32). */
#define RQ_SUB 64
#define RQ_ROW_MAX 512 /* rq_key_row's stack row */
static bool rq_kfused(qf_context *c, int n) {
    return n == 1 && qf_gemm_nn_f32_fast() && c->model->hp.head_dim <= RQ_ROW_MAX && !ext(c)->rq_nofuse;
}

/* The query heads of a kv head (GQA) share its V coefficients, so rq_values_coef can sum them
 * for all gq x n of their queries in one product: where the queries fit one block of rq_values_coef's
 * scratch (ATT_QBLOCK rows; S's gq n rows fit thr_buf's n_batch rows), every thread still gets a
 * kv head, and the product is qf_gemm_nn_f32, each of whose elements is one chain independent of
 * the other rows (so the bits are those of one product per query head; OpenBLAS's sgemm promises
 * no such thing). QF_RQ_NOBATCH=1: never (the product per query head, for A/B runs and tests). */
static bool rq_vgroup(qf_context *c, int n) {
    const qf_hparams *hp = &c->model->hp;
    const int gq = hp->n_head / hp->n_head_kv;
    return gq * n <= ATT_QBLOCK && gq * n <= c->n_batch && hp->n_head_kv >= qf_pool_size(c->pool) &&
           qf_gemm_nn_f32_fast() && !ext(c)->rq_nobatch;
}

/* A one-query step's V coefficients never stored (att_job.cfused): V's codes are looked up a few
 * rows at a time into per-thread scratch right where the weighted sums take them, instead of going
 * to vbuf (out of L2: ~0.9 MB a layer on the 27m at -c 2048) and back, and ykbuf's K
 * coefficients are read once a layer (a column split over the K heads, every query head's rows)
 * instead of once per kv head. The sums are qf_gemm_nn_f32_acc's pieces of rq_values_coef's
 * products: the same bits. QF_RQ_NOCFUSE=1: never. */
_Static_assert(RQ_CSUB <= RQ_RUN_MAX && 2 * RQ_SUB <= RQ_RUN_MAX, "kv-rq: the per-thread scratch holds RQ_RUN_MAX rows");
static bool rq_cfused(qf_context *c, int n) { return rq_kfused(c, n) && rq_vgroup(c, n) && !ext(c)->rq_nocfuse; }

/* n decoded K rows of positions p0.. (rows of head_dim) rotated to their positions where the
 * kv-rq cache stores K before RoPE (the kr_cos / kr_sin tables); else left as they are */
static void rq_rope_keys(qf_context *c, int p0, int n, float *rows) {
    if (!c->kv.k_prerope) return;
    const qf_hparams *hp = &c->model->hp;
    const int half = hp->n_rot / 2;
    for (int p = 0; p < n; p++)
        rope_rotate(hp, ext(c)->kr_cos + (size_t)(p0 + p) * half, ext(c)->kr_sin + (size_t)(p0 + p) * half,
                    rows + (size_t)p * hp->head_dim, 1);
}

/* keys [p0, p0 + np) of kv head h (coefficients yk, stride kd) decoded RQ_SUB rows at a time into
 * scr, rotated (a pre-RoPE cache) and scored against each query head of the group: rq_sc's
 * entries, the bits attention_worker's qf_vec_rows_dot over kbuf gives (the decode's GEMM
 * elements do not depend on the rows around them, nor rows_dot's outputs). yk NULL
 * (att_job.cfused): each RQ_SUB rows' coefficients looked up into scr's second half first (scr:
 * 2 RQ_SUB head_dim floats) */
static void rq_key_scores(qf_context *c, int l, int h, int p0, int np, const float *yk, size_t kd, float *scr) {
    const qf_hparams *hp = &c->model->hp;
    const int hd = hp->head_dim, gq = hp->n_head / hp->n_head_kv;
    const size_t nc = (size_t)c->params.n_ctx;
    const size_t m = (size_t)qf_kv_rq_lin_dim(&c->kv, 0, l, h); /* <= hd */
    float *yc = scr + (size_t)RQ_SUB * hd;
    for (int s0 = 0; s0 < np; s0 += RQ_SUB) {
        const int ns = np - s0 < RQ_SUB ? np - s0 : RQ_SUB;
        if (yk) {
            qf_kv_rq_lin_decode(&c->kv, 0, l, h, ns, yk + (size_t)s0 * kd, kd, scr);
        } else {
            qf_kv_rq_lin_coef(&c->kv, 0, l, h, p0 + s0, ns, yc, m);
            qf_kv_rq_lin_decode(&c->kv, 0, l, h, ns, yc, m, scr);
        }
        rq_rope_keys(c, p0 + s0, ns, scr);
        for (int qh = h * gq; qh < (h + 1) * gq; qh++)
            qf_vec_rows_dot(scr, (size_t)hd, hd, c->q + (size_t)qh * hd, ns, ext(c)->rq_sc + qh * nc + p0 + s0);
    }
}

/* one stored key row (position p, kv head h) as the fused route decodes it, for exact_gather
 * (a sink / window position neither store holds): its coefficients, the GEMM, RoPE */
static void rq_key_row(qf_context *c, int l, int h, int p, float *dst) {
    const qf_hparams *hp = &c->model->hp;
    float y[RQ_ROW_MAX];
    qf_kv_rq_lin_coef(&c->kv, 0, l, h, p, 1, y, (size_t)hp->head_dim);
    qf_kv_rq_lin_decode(&c->kv, 0, l, h, 1, y, (size_t)hp->head_dim, dst);
    rq_rope_keys(c, p, 1, dst);
}

static void rq_gather_worker(void *arg, int ith, int nth) {
    att_job *j = arg;
    qf_context *c = j->c;
    const qf_hparams *hp = &c->model->hp;
    const qf_kv_cache *kv = &c->kv;
    int T = j->pos0 + j->n, nh = hp->n_head_kv, hd = hp->head_dim, l = j->layer, R = j->rq_run, nr = (T + R - 1) / R;
    size_t kd = (size_t)qf_kv_rq_lin_kdim(kv, l), nc = (size_t)c->params.n_ctx;
    float *y = ext(c)->rq_thr + (size_t)ith * ext(c)->rq_thr_per;
    for (int idx = ith; idx < (j->cfused ? 1 : 2) * nh * nr; idx += nth) { /* cfused: K only */
        int stream = idx / (nh * nr), h = idx / nr % nh, p0 = idx % nr * R, np = T - p0 < R ? T - p0 : R;
        if (stream == 0 && j->cfused && ext(c)->rq_kcodes) { /* ykbuf not written */
            rq_key_scores(c, l, h, p0, np, NULL, 0, y);
        } else if (stream == 0) {
            float *yk = ext(c)->ykbuf + (size_t)p0 * kd + qf_kv_rq_lin_koff(kv, l, h);
            float *dst = ext(c)->kbuf + ((size_t)h * nc + p0) * hd;
            qf_kv_rq_lin_coef(kv, 0, l, h, p0, np, yk, kd);
            if (j->kfused) {
                rq_key_scores(c, l, h, p0, np, yk, kd, y);
                continue;
            }
            qf_kv_rq_lin_decode(kv, 0, l, h, np, yk, kd, dst);
            rq_rope_keys(c, p0, np, dst);
        } else {
            float *dst = ext(c)->vbuf + ((size_t)h * nc + p0) * hd;
            if (j->vcoef) {
                qf_kv_rq_lin_coef(kv, 1, l, h, p0, np, dst, (size_t)hd);
            } else {
                qf_kv_rq_lin_coef(kv, 1, l, h, p0, np, y, (size_t)hd);
                qf_kv_rq_lin_decode(kv, 1, l, h, np, y, (size_t)hd, dst);
            }
        }
    }
}

static void rq_gather2_worker(void *arg, int ith, int nth) {
    att_job *j = arg;
    qf_context *c = j->c;
    const qf_kv_cache *kv = &c->kv;
    int T = j->pos0 + j->n, nh = c->model->hp.n_head_kv, hd = c->model->hp.head_dim, l = j->layer;
    int R = j->rq_run, nr = (T + R - 1) / R;
    int n_pred = !j->vcoef && qf_kv_rq_lin_pred_on(kv, l) ? nh * nr : 0, n_ex = kv->n_sink || kv->n_window ? 2 * nh : 0;
    size_t kd = (size_t)qf_kv_rq_lin_kdim(kv, l), nc = (size_t)c->params.n_ctx;
    for (int idx = ith; idx < n_pred + n_ex; idx += nth) {
        if (idx < n_pred) {
            int h = idx / nr, p0 = idx % nr * R, np = T - p0 < R ? T - p0 : R;
            qf_kv_rq_lin_pred(kv, l, h, np, ext(c)->ykbuf + (size_t)p0 * kd, kd, ext(c)->vbuf + ((size_t)h * nc + p0) * hd,
                              ext(c)->rq_thr + (size_t)ith * ext(c)->rq_thr_per); /* np <= RQ_RUN_MAX */
        } else {
            int e = idx - n_pred, stream = e / nh, h = e % nh;
            const float *stored = stream ? (j->vcoef ? NULL : ext(c)->vbuf) : j->kfused ? NULL : ext(c)->kbuf;
            exact_gather(c, j, stream, h, stored ? stored + (size_t)h * nc * hd : NULL);
        }
    }
}

/* The positions read exactly (the f16 sinks and recent window) by queries whose window starts at
 * lw (a query at t: lw = t - n_window + 1): [0, s1) and [w0, ...), in increasing order:
 *   for (int p = exact_first(kv, lw, &s); p <= last; p = exact_next(&s, p))
 * (the two spans may meet or overlap; no position is visited twice). */
typedef struct {
    int s1, w0;
} exact_span;

static inline int exact_first(const qf_kv_cache *kv, int lw, exact_span *s) {
    s->s1 = kv->n_sink;
    s->w0 = lw > s->s1 ? lw : s->s1;
    return s->s1 > 0 ? 0 : s->w0;
}
static inline int exact_next(const exact_span *s, int p) { return p + 1 == s->s1 ? s->w0 : p + 1; }

static void exact_gather(qf_context *c, const void *jv, int stream, int h, const float *stored) {
    const att_job *j = jv;
    const qf_hparams *hp = &c->model->hp;
    int hd = hp->head_dim, Dkv = hp->n_head_kv * hd;
    int hi = j->pos0 + j->n;
    float *dst = (stream ? ext(c)->evbuf : ext(c)->ekbuf) + (size_t)h * c->params.n_ctx * hd;
    const float *fresh = stream ? c->v : c->k;
    exact_span sp;
    for (int p = exact_first(&c->kv, j->pos0 - c->kv.n_window + 1, &sp); p < hi; p = exact_next(&sp, p)) {
        float *d = dst + (size_t)p * hd;
        if (p >= j->pos0) {
            const float *f = fresh + (size_t)(p - j->pos0) * Dkv + (size_t)h * hd;
            for (int i = 0; i < hd; i++) d[i] = qf_f16_to_f32(qf_f32_to_f16(f[i]));
        } else if (!qf_kv_cache_exact_row(&c->kv, stream, j->layer, h, p, d)) {
            if (stored) memcpy(d, stored + (size_t)p * hd, (size_t)hd * sizeof(float));
            else if (stream == 0 && j->kfused) rq_key_row(c, j->layer, h, p, d); /* kbuf not written */
            else qf_kv_cache_read_pos(&c->kv, stream, j->layer, h, p, d); /* vbuf holds coefficients */
        }
    }
}

/* query at tq: the exact keys' scores (before the softmax). The reference route sums each in
 * double, in order; the others by qf_vec_rows_dot over the two contiguous spans (f32 sums in
 * order, eight keys in the lanes), as the stored keys' f32 GEMM scores them. */
static void exact_scores(const qf_context *c, int tq, const float *q, const float *EK, float *row, float scale) {
    int hd = c->model->hp.head_dim;
    exact_span sp;
    if (!c->params.reference) {
        int p = exact_first(&c->kv, tq - c->kv.n_window + 1, &sp);
        int s1 = sp.s1 < tq + 1 ? sp.s1 : tq + 1;
        if (p < s1) qf_vec_rows_dot(EK, (size_t)hd, hd, q, s1, row); /* the sinks [0, s1) */
        if (sp.w0 <= tq)
            qf_vec_rows_dot(EK + (size_t)sp.w0 * hd, (size_t)hd, hd, q, tq - sp.w0 + 1, row + sp.w0); /* the window */
        for (p = exact_first(&c->kv, tq - c->kv.n_window + 1, &sp); p <= tq; p = exact_next(&sp, p)) row[p] *= scale;
        return;
    }
    for (int p = exact_first(&c->kv, tq - c->kv.n_window + 1, &sp); p <= tq; p = exact_next(&sp, p)) {
        double s = 0;
        for (int d = 0; d < hd; d++) s += (double)q[d] * EK[(size_t)p * hd + d];
        row[p] = (float)s * scale;
    }
}

/* query at tq with softmax weights w: o += w_p (Vexact_p - Vstored_p) over the exact keys, in
 * position order (the sinks' span, then the window's: qf_vec_axpy_diff's f32 steps, vectorized) */
static void exact_values(const qf_context *c, int tq, const float *w, const float *EV, const float *V, float *o) {
    int hd = c->model->hp.head_dim;
    exact_span sp;
    int p = exact_first(&c->kv, tq - c->kv.n_window + 1, &sp);
    int s1 = sp.s1 < tq + 1 ? sp.s1 : tq + 1;
    if (p < s1) qf_vec_axpy_diff(EV, V, (size_t)hd, s1, w, hd, o);
    if (sp.w0 <= tq)
        qf_vec_axpy_diff(EV + (size_t)sp.w0 * hd, V + (size_t)sp.w0 * hd, (size_t)hd, tq - sp.w0 + 1, w + sp.w0, hd, o);
}

/* query at tq with softmax weights w: e += w_p Vexact_p over the exact keys (position order), and
 * their w_p zeroed, so a sum over the stored rows leaves them out (the coefficient-domain V sums:
 * rq_values_coef, dict_values) */
static void exact_take(const qf_kv_cache *kv, int tq, int hd, float *w, const float *EV, float *e) {
    exact_span sp;
    for (int p = exact_first(kv, tq - kv->n_window + 1, &sp); p <= tq; p = exact_next(&sp, p)) {
        for (int d = 0; d < hd; d++) e[d] += w[p] * EV[(size_t)p * hd + d];
        w[p] = 0;
    }
}

/* a query's softmax weights w over the Tb keys (the query at position tq) made ready for the kv-rq
 * coefficient sums: e = the exact keys' values (exact_take; 0 without exact keys), their weights
 * zeroed; returns the sum of all Tb weights (a double chain, in order), the maps' weight
 * (rq_values_coef and att_job.cfused's attention_worker) */
static float rq_weights_take(const qf_kv_cache *kv, int tq, int hd, int Tb, float *w, const float *EV, float *e) {
    memset(e, 0, (size_t)hd * sizeof(float));
    if (kv->n_sink || kv->n_window) exact_take(kv, tq, hd, w, EV, e);
    double a = 0;
    for (int p = 0; p < Tb; p++) a += w[p];
    return (float)a;
}

/* one query's output o (hd floats) from its weighted coefficient sums of kv head kvh, cv (V's) and,
 * with V's predictor on, ck (K's), weight sum ws: the head's maps, then the exact keys' values e
 * (pz: qf_kv_rq_lin_apply_pred's scratch; rq_values_coef and rq_apply_worker) */
static void rq_out_row(const qf_kv_cache *kv, int l, int kvh, bool pred, const float *cv, const float *ck, float ws,
                       const float *e, int hd, float *o, float *pz) {
    qf_kv_rq_lin_apply(kv, 1, l, kvh, cv, ws, o);
    if (pred) qf_kv_rq_lin_apply_pred(kv, l, kvh, ck, ws, o, pz);
    for (int d = 0; d < hd; d++) o[d] += e[d];
}

/* The output of a block of nb queries (rows i0..) of ng query heads of kv head kvh (the first
 * at Ob, the next hd floats on; row i of head g at Ob + g hd + i Dq), their softmax weights S
 * [ng][nb][Tb] (head-major), ng nb <= ATT_QBLOCK, over a kv-rq V in the coefficient domain (vbuf:
 * V's coefficients of kv head kvh; ykbuf: K's): the exact keys' values are added as they are and
 * their weights zeroed, then the stored keys' weighted coefficient sums (one product of ng nb
 * rows: qf_gemm_nn_f32's elements do not depend on the other rows, so any ng gives each row's
 * bits) go through the head's linear maps once per query (engine.h). */
static void rq_values_coef(qf_context *c, const att_job *j, int ith, int kvh, int i0, int nb, int ng, int Tb, float *S,
                           const float *Yv, const float *EV, float *Ob) {
    const qf_hparams *hp = &c->model->hp;
    const qf_kv_cache *kv = &c->kv;
    int hd = hp->head_dim, Dq = hp->n_head * hd, l = j->layer, mv = qf_kv_rq_lin_dim(kv, 1, l, kvh);
    int kd = qf_kv_rq_lin_kdim(kv, l), nr = ng * nb;
    bool pred = qf_kv_rq_lin_pred_on(kv, l);
    float *ex = ext(c)->rq_thr + (size_t)ith * ext(c)->rq_thr_per; /* [nr][hd] exact part */
    float *cv = ex + (size_t)ATT_QBLOCK * hd, *ck = cv + (size_t)ATT_QBLOCK * hd; /* [nr][mv], [nr][kd] */
    float *pz = ck + (size_t)ATT_QBLOCK * hp->n_head_kv * hd;                   /* [(H + 1) hd] */
    float wsum[ATT_QBLOCK];
    for (int r = 0; r < nr; r++)
        wsum[r] = rq_weights_take(kv, j->pos0 + i0 + r % nb, hd, Tb, S + (size_t)r * Tb, EV, ex + (size_t)r * hd);
    if (qf_gemm_nn_f32_fast()) { /* few queries: thin products, faster without OpenBLAS's packing */
        qf_gemm_nn_f32(nr, Tb, mv, S, (size_t)Tb, Yv, (size_t)hd, NULL, cv, (size_t)mv);
        if (pred) qf_gemm_nn_f32(nr, Tb, kd, S, (size_t)Tb, ext(c)->ykbuf, (size_t)kd, NULL, ck, (size_t)kd);
    } else {
        qf_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nr, mv, Tb, 1.0f, S, Tb, Yv, hd, 0.0f, cv, mv);
        if (pred)
            qf_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nr, kd, Tb, 1.0f, S, Tb, ext(c)->ykbuf, kd, 0.0f, ck, kd);
    }
    for (int r = 0; r < nr; r++)
        rq_out_row(kv, l, kvh, pred, cv + (size_t)r * mv, ck + (size_t)r * kd, wsum[r], ex + (size_t)r * hd, hd,
                   Ob + (size_t)(r / nb) * hd + (size_t)(r % nb) * Dq, pz);
}

/* att_job.cfused, after attention_worker made every query head's weights (rq_w, the exact keys'
 * zeroed): per kv head g (an item per thread, rq_vgroup), its V codes looked up RQ_CSUB rows at a
 * time into per-thread scratch and added to rq_cv's rows of g's query heads, and K head g's
 * coefficients (ykbuf's columns; QF_RQ_KCODES: its codes looked up again the same way) added to
 * every query head's rq_ck columns of g (V's predictor): the elements of rq_values_coef's two
 * products, each one chain over the positions in order (the pieces by qf_gemm_nn_f32_acc from
 * zero), so the same bits */
static void rq_csum_worker(void *arg, int ith, int nth) {
    att_job *j = arg;
    qf_context *c = j->c;
    const qf_hparams *hp = &c->model->hp;
    const qf_kv_cache *kv = &c->kv;
    const int hd = hp->head_dim, nq = hp->n_head, gq = nq / hp->n_head_kv, l = j->layer, T = j->pos0 + j->n;
    const size_t nc = (size_t)c->params.n_ctx, kd = (size_t)qf_kv_rq_lin_kdim(kv, l);
    const bool pred = qf_kv_rq_lin_pred_on(kv, l);
    float *yc = ext(c)->rq_thr + (size_t)ith * ext(c)->rq_thr_per; /* [RQ_CSUB][<= hd] */
    for (int g = ith; g < hp->n_head_kv; g += nth) {
        const int mv = qf_kv_rq_lin_dim(kv, 1, l, g), mk = qf_kv_rq_lin_dim(kv, 0, l, g);
        const size_t ko = (size_t)qf_kv_rq_lin_koff(kv, l, g);
        const float *Wg = ext(c)->rq_w + (size_t)g * gq * nc;
        float *cv = ext(c)->rq_cv + (size_t)g * gq * hd, *ck = ext(c)->rq_ck + ko;
        for (int r = 0; r < gq; r++) memset(cv + (size_t)r * hd, 0, (size_t)mv * sizeof(float));
        if (pred)
            for (int r = 0; r < nq; r++) memset(ck + (size_t)r * kd, 0, (size_t)mk * sizeof(float));
        for (int s0 = 0, cs = ext(c)->rq_csub; s0 < T; s0 += cs) {
            const int ns = T - s0 < cs ? T - s0 : cs;
            qf_kv_rq_lin_coef(kv, 1, l, g, s0, ns, yc, (size_t)mv);
            qf_gemm_nn_f32_acc(gq, ns, mv, Wg + s0, nc, yc, (size_t)mv, cv, (size_t)hd);
            if (!pred) continue;
            if (!ext(c)->rq_kcodes) { /* K's coefficients from ykbuf (the gather's), columns of head g */
                qf_gemm_nn_f32_acc(nq, ns, mk, ext(c)->rq_w + s0, nc, ext(c)->ykbuf + (size_t)s0 * kd + ko, kd, ck, kd);
                continue;
            }
            qf_kv_rq_lin_coef(kv, 0, l, g, s0, ns, yc, (size_t)mk);
            qf_gemm_nn_f32_acc(nq, ns, mk, ext(c)->rq_w + s0, nc, yc, (size_t)mk, ck, kd);
        }
    }
}

/* att_job.cfused, last: each query head's output from its sums (rq_csum_worker) through its kv
 * head's maps, then the exact keys' values: rq_values_coef's steps in its order */
static void rq_apply_worker(void *arg, int ith, int nth) {
    att_job *j = arg;
    qf_context *c = j->c;
    const qf_hparams *hp = &c->model->hp;
    const qf_kv_cache *kv = &c->kv;
    const int hd = hp->head_dim, gq = hp->n_head / hp->n_head_kv, l = j->layer;
    const size_t kd = (size_t)qf_kv_rq_lin_kdim(kv, l);
    const bool pred = qf_kv_rq_lin_pred_on(kv, l);
    float *pz = ext(c)->rq_thr + (size_t)ith * ext(c)->rq_thr_per; /* [(H + 1) hd] */
    for (int h = ith; h < hp->n_head; h += nth)
        rq_out_row(kv, l, h / gq, pred, ext(c)->rq_cv + (size_t)h * hd, ext(c)->rq_ck + (size_t)h * kd,
                   ext(c)->rq_wsum[h], ext(c)->rq_ex + (size_t)h * hd, hd, c->att + (size_t)h * hd, pz);
}

/* The output of a block of nb queries (the last at position Tb - 1, softmax weights S [nb][Tb],
 * outputs at Ob with stride n_head * head_dim) over a kv-dict V in
 * the coefficient domain (att_job.vdict; the codes of kv head kvh parsed in dict_idx[1] /
 * dict_coef[1]): the exact keys' values are added as they are and their weights zeroed (as
 * rq_values_coef does), then each atom's total weight over the stored keys W[a] = sum_t w_t
 * sum_j c_tj [i_tj == a] (qf_vec_dict_weights, T s adds) and the output sum_a W[a] atom_a
 * (qf_vec_cols_axpy, atoms of weight 0 skipped): n_atoms x head_dim, not T x s x head_dim. */
static void dict_values(qf_context *c, const att_job *j, int ith, int kvh, int nb, int Tb, float *S, const float *EV,
                        float *Ob) {
    const qf_hparams *hp = &c->model->hp;
    const qf_kv_cache *kv = &c->kv;
    const int hd = hp->head_dim, Dq = hp->n_head * hd;
    int sp;
    const qf_kv_dict *D = qf_kv_cache_dict(kv, 1, j->layer, &sp);
    const size_t nc = (size_t)c->params.n_ctx, off = (size_t)kvh * sp * nc;
    float *W = ext(c)->dict_thr + (size_t)ith * ext(c)->dict_thr_per, *ex = W + D->n_atoms;
    const bool exact = kv->n_sink || kv->n_window;
    for (int i = 0; i < nb; i++) {
        float *w = S + (size_t)i * Tb, *o = Ob + (size_t)i * Dq;
        if (exact) {
            memset(ex, 0, (size_t)hd * sizeof(float));
            exact_take(kv, Tb - nb + i, hd, w, EV, ex); /* query i's position (Tb = pos0 + i0 + nb) */
        }
        memset(W, 0, (size_t)D->n_atoms * sizeof(float));
        qf_vec_dict_weights(w, ext(c)->dict_idx[1] + off, ext(c)->dict_coef[1] + off, nc, sp, Tb, W);
        memset(o, 0, (size_t)hd * sizeof(float));
        qf_vec_cols_axpy(D->atoms, (size_t)hd, D->n_atoms, W, hd, o);
        if (exact)
            for (int d = 0; d < hd; d++) o[d] += ex[d];
    }
}

/* The softmax weights of query head h's block of nb queries from row i0 (the last at position
 * pos0 + i0 + nb - 1) over the Tb = pos0 + i0 + nb keys the block can see, into S [nb][Tb]: the
 * job's route's scores (the exact keys' included), soft-capping, then each query's softmax over
 * its causal (and sliding) window, 0 outside it. c->q's rows of head h as the keys' basis wants
 * them (attention_worker rotates them first for rotk). */
static void head_weights(qf_context *c, const att_job *j, int ith, int h, int i0, int nb, float *S) {
    const qf_hparams *hp = &c->model->hp;
    int hd = hp->head_dim, gq = hp->n_head / hp->n_head_kv, kvh = h / gq;
    int Dq = hp->n_head * hd;
    float scale = hp->attn_scale, cap = hp->attn_softcap;
    /* a sliding-window layer: the query at t sees keys t - n_swa < p <= t */
    int swa = qf_hparams_layer_swa(hp, j->layer) ? hp->n_swa : 0;
    const float *K = ext(c)->kbuf + (size_t)kvh * c->params.n_ctx * hd;
    int Tb = j->pos0 + i0 + nb; /* keys this block can see */
    const float *Qb = c->q + (size_t)h * hd + (size_t)i0 * Dq;
    bool exact = c->kv.n_sink || c->kv.n_window;
    /* the canonical route's attention (kernels/canon.h): fmaf chains over d, then over t;
     * the exact keys (kv-rq) scored and summed from their exact rows in the same chains */
    const bool canon = c->canon && !j->vcoef;
    const float *EK = ext(c)->ekbuf + (size_t)kvh * c->params.n_ctx * hd;
    /* exact keys: their scores from EK by the same kernel, for the sinks and the span of
     * window keys any query of the block reads, [0, ns) and [xlo, hi) -> Sx [nb][ns + hi - xlo] */
    int ns = 0, xlo = 0, hi = 0;
    float *Sx = NULL;
    if (canon) {
        qf_canon_scores(Qb, Dq, nb, K, Tb, hd, scale, S, Tb, c->thr_buf[ith] + c->canon_scr);
        if (exact) {
            ns = c->kv.n_sink < Tb ? c->kv.n_sink : Tb;
            xlo = j->pos0 + i0 - c->kv.n_window + 1;
            xlo = xlo > ns ? xlo : ns;
            hi = Tb;
            const int W = ns + hi - xlo;
            Sx = ext(c)->canon_ex + (size_t)ith * ext(c)->canon_ex_per;
            if (ns) qf_canon_scores(Qb, Dq, nb, EK, ns, hd, scale, Sx, W, c->thr_buf[ith] + c->canon_scr);
            if (hi > xlo)
                qf_canon_scores(Qb, Dq, nb, EK + (size_t)xlo * hd, hi - xlo, hd, scale, Sx + ns, W,
                                c->thr_buf[ith] + c->canon_scr);
        }
    } else if (c->params.reference) {
        for (int i = 0; i < nb; i++)
            for (int t = 0; t < Tb; t++) {
                double s = 0;
                for (int d = 0; d < hd; d++) s += (double)Qb[(size_t)i * Dq + d] * K[(size_t)t * hd + d];
                S[(size_t)i * Tb + t] = (float)s * scale;
            }
    } else if (j->kdict) { /* kv-dict keys in the coefficient domain: P = A q, then s lookups a key */
        int sp;
        const qf_kv_dict *D = qf_kv_cache_dict(&c->kv, 0, j->layer, &sp);
        const size_t nc = (size_t)c->params.n_ctx, o = (size_t)kvh * sp * nc;
        float *P = ext(c)->dict_thr + (size_t)ith * ext(c)->dict_thr_per;
        for (int i = 0; i < nb; i++) {
            float *row = S + (size_t)i * Tb;
            qf_vec_rows_dot(D->atoms, (size_t)hd, hd, Qb + (size_t)i * Dq, D->n_atoms, P);
            qf_vec_dict_scores(P, ext(c)->dict_idx[0] + o, ext(c)->dict_coef[0] + o, nc, sp, Tb, row);
            for (int t = 0; t < Tb; t++) row[t] *= scale;
        }
    } else if (j->kv_direct) { /* decode over the cache's own rows, no f32 copy */
        const size_t rb = c->kv.row_bytes[0];
        const uint8_t *Kr = c->kv.data[0][j->layer] + (size_t)kvh * rb;
        for (int i = 0; i < nb; i++) {
            float *row = S + (size_t)i * Tb;
            qf_vec_rows_dot_kv(j->kt, Kr, (size_t)hp->n_head_kv * rb, hd, Qb + (size_t)i * Dq, Tb, row);
            for (int t = 0; t < Tb; t++) row[t] *= scale;
        }
    } else if (j->kfused || j->i8kfused) { /* the gather scored the stored keys (rq_key_scores, i8_gather_worker) */
        const float *sc = (j->i8kfused ? ext(c)->i8_sc : ext(c)->rq_sc) + (size_t)h * c->params.n_ctx;
        for (int t = 0; t < Tb; t++) S[t] = sc[t] * scale;
    } else if (nb <= 2) { /* decode: K . q per query, not OpenBLAS's packing of a thin product */
        for (int i = 0; i < nb; i++) {
            float *row = S + (size_t)i * Tb;
            qf_vec_rows_dot(K, (size_t)hd, hd, Qb + (size_t)i * Dq, Tb, row);
            for (int t = 0; t < Tb; t++) row[t] *= scale;
        }
    } else {
        qf_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nb, Tb, hd, scale, Qb, Dq, K, hd, 0.0f, S, Tb);
    }
    for (int i = 0; i < nb; i++) {
        float *row = S + (size_t)i * Tb;
        int last = j->pos0 + i0 + i; /* causal: query sees positions <= its own */
        if (exact && canon) {
            const float *sx = Sx + (size_t)i * (ns + hi - xlo);
            exact_span sp;
            for (int p = exact_first(&c->kv, last - c->kv.n_window + 1, &sp); p <= last; p = exact_next(&sp, p))
                row[p] = p < ns ? sx[p] : sx[ns + p - xlo];
        } else if (exact)
            exact_scores(c, last, Qb + (size_t)i * Dq, EK, row, scale);
        int lo = swa && last - swa + 1 > 0 ? last - swa + 1 : 0;
        if (cap > 0) /* soft-capping (gemma2): c * tanh(s / c) */
            for (int t = lo; t <= last; t++) row[t] = cap * tanhf(row[t] / cap);
        if (c->params.reference) qf_softmax_ref(row + lo, last + 1 - lo);
        else qf_softmax(row + lo, last + 1 - lo);
        memset(row, 0, (size_t)lo * sizeof(float));
        memset(row + last + 1, 0, (size_t)(Tb - last - 1) * sizeof(float));
    }
}

/* The attention output of the job's queries (rows from q0's block on) into c->att: per query
 * head, its blocks' weights (head_weights), then their values' sum by the job's route; with
 * j->vgroup per kv head, its query heads' weights side by side and one rq_values_coef. */
static void attention_worker(void *arg, int ith, int nth) {
    att_job *j = arg;
    qf_context *c = j->c;
    const qf_hparams *hp = &c->model->hp;
    int hd = hp->head_dim, n = j->n, gq = hp->n_head / hp->n_head_kv;
    int Dq = hp->n_head * hd;
    const size_t hs = (size_t)c->params.n_ctx * hd; /* floats a kv head of vbuf / evbuf */
    float *S = c->thr_buf[ith];
    if (j->cfused) { /* one query: every head's weights for rq_csum_worker (rq_values_coef's first steps) */
        const size_t nc = (size_t)c->params.n_ctx;
        for (int kvh = ith; kvh < hp->n_head_kv; kvh += nth)
            for (int h = kvh * gq; h < (kvh + 1) * gq; h++) {
                float *w = ext(c)->rq_w + (size_t)h * nc;
                head_weights(c, j, ith, h, 0, 1, w);
                ext(c)->rq_wsum[h] = rq_weights_take(&c->kv, j->pos0, hd, j->pos0 + n, w, ext(c)->evbuf + kvh * hs,
                                                     ext(c)->rq_ex + (size_t)h * hd);
            }
        return;
    }
    if (j->vgroup) { /* a kv head's query heads together (rq_vgroup: one block of n <= ATT_QBLOCK / gq rows) */
        const int T = j->pos0 + n;
        for (int kvh = ith; kvh < hp->n_head_kv; kvh += nth) {
            for (int g = 0; g < gq; g++) head_weights(c, j, ith, kvh * gq + g, 0, n, S + (size_t)g * n * T);
            rq_values_coef(c, j, ith, kvh, 0, n, gq, T, S, ext(c)->vbuf + kvh * hs, ext(c)->evbuf + kvh * hs,
                           c->att + (size_t)kvh * gq * hd);
        }
        return;
    }
    for (int h = ith; h < hp->n_head; h += nth) {
        int kvh = h / gq;
        const float *V = ext(c)->vbuf + kvh * hs, *EV = ext(c)->evbuf + kvh * hs;
        float *O = c->att + (size_t)h * hd;
        const int i_first = j->q0 / ATT_QBLOCK * ATT_QBLOCK; /* the first row computed */
        if (j->rotk && !j->i8kfused) /* this head's queries into the keys' rotated basis (c->q is not read again;
                                       * i8kfused: rotated before the gather) */
            for (int i = i_first; i < n; i++) qf_hadamard(c->q + (size_t)i * Dq + (size_t)h * hd, hd);
        for (int i0 = i_first; i0 < n; i0 += ATT_QBLOCK) { /* the same blocks for any q0 */
            int nb = n - i0 < ATT_QBLOCK ? n - i0 : ATT_QBLOCK;
            int Tb = j->pos0 + i0 + nb; /* keys this block can see */
            bool exact = c->kv.n_sink || c->kv.n_window;
            head_weights(c, j, ith, h, i0, nb, S);
            float *Ob = O + (size_t)i0 * Dq;
            if (j->vcoef) {
                rq_values_coef(c, j, ith, kvh, i0, nb, 1, Tb, S, V, EV, Ob);
                continue;
            }
            if (j->vdict) {
                dict_values(c, j, ith, kvh, nb, Tb, S, EV, Ob);
                continue;
            }
            if (c->canon) { /* the exact keys' rows chosen inside the chains: no exact_values below */
                qf_canon_pv(S, Tb, nb, j->pos0 + i0 + 1, V, exact ? EV : NULL, c->kv.n_sink, c->kv.n_window, hd, Ob, Dq);
                continue;
            } else if (c->params.reference) {
                for (int i = 0; i < nb; i++)
                    for (int d = 0; d < hd; d++) {
                        double s = 0;
                        for (int t = 0; t < Tb; t++) s += (double)S[(size_t)i * Tb + t] * V[(size_t)t * hd + d];
                        Ob[(size_t)i * Dq + d] = (float)s;
                    }
            } else if (j->kv_direct) {
                const size_t rb = c->kv.row_bytes[1];
                const uint8_t *Vr = c->kv.data[1][j->layer] + (size_t)kvh * rb;
                qf_gemm_nn_kv(j->vt, nb, Tb, hd, S, (size_t)Tb, Vr, (size_t)hp->n_head_kv * rb, Ob, (size_t)Dq);
            } else if (nb <= 2 && qf_gemm_nn_f32_fast()) { /* decode: the weighted sum of V's rows, as above */
                qf_gemm_nn_f32(nb, Tb, hd, S, (size_t)Tb, V, (size_t)hd, NULL, Ob, (size_t)Dq);
            } else {
                qf_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nb, hd, Tb, 1.0f, S, Tb, V, hd, 0.0f, Ob, Dq);
            }
            if (exact)
                for (int i = 0; i < nb; i++)
                    exact_values(c, j->pos0 + i0 + i, S + (size_t)i * Tb, EV, V, Ob + (size_t)i * Dq);
        }
        if (j->rotv) /* the output back from the values' rotated basis */
            for (int i = i_first; i < n; i++) qf_hadamard(O + (size_t)i * Dq, hd);
    }
}

/* ---------------------------------------------------------------------------------------- */

/* The elementwise stages between matmuls, split over the pool by tokens: before attention
 * (bias, RoPE), and the SwiGLU gate (silu(gate) * up, exp vectorized). */
typedef struct {
    qf_context *c;
    const layer_vecs *lv;
    int n;
    int stage; /* 0: bias, q/k norm, rope on q, k; 1: hb = act(hb) * hb2; 2: rope on k */
    bool defer_k_rope; /* stage 0 leaves k unrotated (stage 2 rotates it) */
    const float *rcos, *rsin; /* this layer's RoPE tables (c->rope_cos/sin or the sliding-window ones) */
    int ff; /* stage 1: row length of hb, hb2 (n_ff, or n_ff_exp for an expert) */
} ew_job;

/* gelu with the tanh approximation (gemma's gelu_pytorch_tanh) */
static inline float gelu_tanh(float x) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

static void ew_worker(void *arg, int ith, int nth) {
    ew_job *j = arg;
    qf_context *c = j->c;
    const qf_hparams *hp = &c->model->hp;
    int64_t t0, t1;
    qf_split_range(j->n, ith, nth, &t0, &t1);
    if (j->stage == 0) {
        const int Dq = hp->n_head * hp->head_dim, Dkv = hp->n_head_kv * hp->head_dim;
        const layer_vecs *lv = j->lv;
        for (int64_t t = t0; t < t1; t++) {
            if (lv->bq) for (int i = 0; i < Dq; i++) c->q[(size_t)t * Dq + i] += lv->bq[i];
            if (lv->bk) for (int i = 0; i < Dkv; i++) c->k[(size_t)t * Dkv + i] += lv->bk[i];
            if (lv->bv) for (int i = 0; i < Dkv; i++) c->v[(size_t)t * Dkv + i] += lv->bv[i];
            if (lv->q_norm) /* per-head RMS norm of q and k (qwen3, gemma3) */
                for (int h = 0; h < hp->n_head; h++) {
                    float *qh = c->q + (size_t)t * Dq + (size_t)h * hp->head_dim;
                    qf_rmsnorm_row_ref(qh, qh, lv->q_norm, hp->head_dim, hp->rms_eps);
                }
            if (lv->k_norm)
                for (int h = 0; h < hp->n_head_kv; h++) {
                    float *kh = c->k + (size_t)t * Dkv + (size_t)h * hp->head_dim;
                    qf_rmsnorm_row_ref(kh, kh, lv->k_norm, hp->head_dim, hp->rms_eps);
                }
            rope_apply(c, j->rcos, j->rsin, c->q + (size_t)t * Dq, hp->n_head, (int)t);
            if (!j->defer_k_rope) rope_apply(c, j->rcos, j->rsin, c->k + (size_t)t * Dkv, hp->n_head_kv, (int)t);
        }
    } else if (j->stage == 2) {
        const int Dkv = hp->n_head_kv * hp->head_dim;
        for (int64_t t = t0; t < t1; t++) rope_apply(c, j->rcos, j->rsin, c->k + (size_t)t * Dkv, hp->n_head_kv, (int)t);
    } else if (hp->ffn_act == QF_FFN_GELU_TANH) {
        const int F = j->ff;
        for (int64_t t = t0; t < t1; t++) {
            float *g = c->hb + (size_t)t * F, *u = c->hb2 + (size_t)t * F;
            for (int i = 0; i < F; i++) g[i] = gelu_tanh(g[i]) * u[i];
        }
    } else {
        const int F = j->ff;
        float *e = c->thr_buf[ith]; /* exp(-gate) for one token */
        for (int64_t t = t0; t < t1; t++) {
            float *g = c->hb + (size_t)t * F, *u = c->hb2 + (size_t)t * F;
            if (!c->params.reference) { /* the same bits as the loops below with qf_vec_exp, in 8 lanes */
                qf_vec_silu_mul(g, u, F);
                continue;
            }
            for (int i = 0; i < F; i++) e[i] = -g[i];
            qf_vec_exp_ref(e, F);
            for (int i = 0; i < F; i++) g[i] = g[i] / (1.0f + e[i]) * u[i];
        }
    }
}

typedef struct {
    qf_context *c;
    float *out;
    const float *x, *g;
    int n;
} norm_job;

static void norm_worker(void *arg, int ith, int nth) {
    norm_job *j = arg;
    const qf_hparams *hp = &j->c->model->hp;
    int64_t t0, t1;
    qf_split_range(j->n, ith, nth, &t0, &t1);
    const bool ref = j->c->params.reference;
    for (int64_t t = t0; t < t1; t++) {
        float *o = j->out + (size_t)t * hp->n_embd;
        const float *x = j->x + (size_t)t * hp->n_embd;
        if (ref) qf_rmsnorm_row_ref(o, x, j->g, hp->n_embd, hp->rms_eps);
        else qf_rmsnorm_row(o, x, j->g, hp->n_embd, hp->rms_eps);
    }
}

/* the elementwise stages split by tokens: one token (decode) runs on the calling thread, which
 * saves a pool wake-up and gives the same result (the other threads would get no token) */
static void rmsnorm_rows(qf_context *c, float *out, const float *x, const float *g, int n) {
    norm_job j = {.c = c, .out = out, .x = x, .g = g, .n = n};
    if (n == 1) norm_worker(&j, 0, 1);
    else qf_pool_run(c->pool, norm_worker, &j);
}

static void ew_run(qf_context *c, ew_job *j) {
    if (j->n == 1) ew_worker(j, 0, 1);
    else qf_pool_run(c->pool, ew_worker, j);
}

void qf_moe_route(const qf_hparams *hp, float *logits, int n, int *ids_all, float *w_all) {
    const int E = hp->n_expert, K = hp->n_expert_used;
    for (int t = 0; t < n; t++) {
        float *p = logits + (size_t)t * E;
        float mx = -INFINITY;
        for (int x = 0; x < E; x++) mx = p[x] > mx ? p[x] : mx;
        double sum = 0;
        for (int x = 0; x < E; x++) sum += (p[x] = expf(p[x] - mx));
        for (int x = 0; x < E; x++) p[x] = (float)(p[x] / sum);
        int *ids = ids_all + (size_t)t * K;
        float *w = w_all + (size_t)t * K;
        double wsum = 0;
        for (int k = 0; k < K; k++) { /* selection: K is small */
            int best = -1;
            for (int x = 0; x < E; x++) {
                bool taken = false;
                for (int q = 0; q < k; q++) taken |= ids[q] == x;
                if (!taken && (best < 0 || p[x] > p[best])) best = x;
            }
            ids[k] = best;
            w[k] = p[best];
            wsum += p[best];
        }
        if (hp->expert_norm_w)
            for (int k = 0; k < K; k++) w[k] = (float)(w[k] / wsum);
    }
}

/* The mixture-of-experts FFN of one layer (mixtral, qwen3moe, qwen2moe) on c->xn [n][n_embd]
 * (the ffn_norm output), result in c->xn:
 *   p = softmax(xn W_router);  top-k experts by p (ties: lower index);  w = p_top (/ sum p_top
 *   when expert_norm_w);  out = sum_k w_k * down_k(act(gate_k xn) * up_k xn)
 *   (+ sigmoid(xn . g_shexp) * down_shexp(act(gate_shexp xn) * up_shexp xn) with a shared expert)
 * Each expert runs as one batch of the tokens routed to it (gathered rows), so prefill stays
 * a GEMM per expert. j is the layer's elementwise job (stage 1 is reused with ff = n_ff_exp). */
static void moe_ffn(qf_context *c, const qf_layer_weights *L, ew_job *j) {
    const qf_hparams *hp = &c->model->hp;
    ctx_ext *e = ext(c);
    const int n = j->n, D = hp->n_embd, E = hp->n_expert, K = hp->n_expert_used, Fe = hp->n_ff_exp;
    matmul(c, &L->gate_inp, c->xn, n, e->moe_logits);
    qf_moe_route(hp, e->moe_logits, n, e->moe_ids, e->moe_w);
    memset(e->moe_acc, 0, (size_t)n * D * sizeof(float));
    ew_job gj = *j;
    gj.stage = 1;
    gj.ff = Fe;
    for (int x = 0; x < E; x++) {
        int r = 0;
        for (int t = 0; t < n; t++)
            for (int k = 0; k < K; k++)
                if (e->moe_ids[(size_t)t * K + k] == x) {
                    e->moe_rows[r] = t;
                    e->moe_rw[r] = e->moe_w[(size_t)t * K + k];
                    memcpy(e->moe_x + (size_t)r * D, c->xn + (size_t)t * D, (size_t)D * sizeof(float));
                    r++;
                }
        if (!r) continue;
        matmul(c, &L->exp_gate[x], e->moe_x, r, c->hb);
        matmul(c, &L->exp_up[x], e->moe_x, r, c->hb2);
        gj.n = r;
        qf_pool_run(c->pool, ew_worker, &gj); /* hb = act(hb) * hb2 over [r][n_ff_exp] */
        matmul(c, &L->exp_down[x], c->hb, r, e->moe_y);
        for (int i = 0; i < r; i++) {
            float *acc = e->moe_acc + (size_t)e->moe_rows[i] * D;
            const float *y = e->moe_y + (size_t)i * D;
            for (int d = 0; d < D; d++) acc[d] += e->moe_rw[i] * y[d];
        }
    }
    if (L->w_gate_shexp.data) { /* qwen2moe: + sigmoid(xn . g) * down(silu(gate xn) * up xn), every token */
        matmul(c, &L->gate_inp_shexp, c->xn, n, e->moe_logits); /* [n][1]; the router logits are spent */
        matmul(c, &L->w_gate_shexp, c->xn, n, c->hb);
        matmul(c, &L->w_up_shexp, c->xn, n, c->hb2);
        gj.n = n;
        gj.ff = hp->n_ff_shexp;
        qf_pool_run(c->pool, ew_worker, &gj);
        matmul(c, &L->w_down_shexp, c->hb, n, e->moe_y);
        for (int t = 0; t < n; t++) {
            const float s = 1.0f / (1.0f + expf(-e->moe_logits[t]));
            float *acc = e->moe_acc + (size_t)t * D;
            const float *y = e->moe_y + (size_t)t * D;
            for (int d = 0; d < D; d++) acc[d] += s * y[d];
        }
    }
    memcpy(c->xn, e->moe_acc, (size_t)n * D * sizeof(float));
}

/* the kv-rq fast route's tables and buffers, once per cache / context */
static qf_status rq_fast_init(qf_context *c, qf_error *err) {
    qf_status st = qf_kv_rq_lin_build(&c->kv, err);
    if (st) return st;
    ctx_ext *e = ext(c);
    if (e->ykbuf) return QF_OK;
    const qf_hparams *hp = &c->model->hp;
    size_t hd = (size_t)hp->head_dim, HD = (size_t)hp->n_head_kv * hd;
    size_t per = (size_t)ATT_QBLOCK * (2 * hd + HD) + HD + hd; /* rq_values_coef */
    if (per < (size_t)RQ_RUN_MAX * hd) per = (size_t)RQ_RUN_MAX * hd;   /* the gathers' runs */
    e->rq_thr_per = (per + 15) & ~(size_t)15;
    e->ykbuf = qf_malloc_aligned((size_t)c->params.n_ctx * HD * sizeof(float));
    e->rq_thr = qf_malloc_aligned((size_t)qf_pool_size(c->pool) * e->rq_thr_per * sizeof(float));
    e->rq_sc = qf_malloc_aligned((size_t)hp->n_head * c->params.n_ctx * sizeof(float));
    /* att_job.cfused's rq_w, rq_wsum, rq_ex, rq_cv, rq_ck in one block (each a multiple of 16 floats) */
    const size_t nq = (size_t)hp->n_head, nw = nq * c->params.n_ctx, ns = (nq + 15) & ~(size_t)15;
    e->rq_w = qf_malloc_aligned((nw + ns + 2 * nq * hd + nq * HD) * sizeof(float));
    if (!e->ykbuf || !e->rq_thr || !e->rq_sc || !e->rq_w) {
        free(e->ykbuf), free(e->rq_thr), free(e->rq_sc), free(e->rq_w);
        e->ykbuf = e->rq_thr = e->rq_sc = e->rq_w = NULL;
        return qf_fail(err, QF_ERR_NOMEM, "decode: out of memory for the kv-rq buffers");
    }
    e->rq_wsum = e->rq_w + nw, e->rq_ex = e->rq_wsum + ns, e->rq_cv = e->rq_ex + nq * hd, e->rq_ck = e->rq_cv + nq * hd;
    return QF_OK;
}

/* kv-dict in the coefficient domain (att_job.kdict / vdict): the parsed codes of each dict stream
 * (n_head_kv x sparsity x n_ctx) and the per-thread scratch, (re)allocated when the bound cache
 * needs more than is there */
static qf_status dict_coef_init(qf_context *c, qf_error *err) {
    ctx_ext *e = ext(c);
    const qf_hparams *hp = &c->model->hp;
    size_t A = 0;
    for (int s = 0; s < 2; s++) {
        int sp;
        const qf_kv_dict *d = qf_kv_cache_dict(&c->kv, s, 0, &sp);
        if (!d) continue;
        if ((size_t)d->n_atoms > A) A = (size_t)d->n_atoms;
        size_t need = (size_t)hp->n_head_kv * (size_t)sp * (size_t)c->params.n_ctx;
        if (e->dict_n[s] >= need) continue;
        free(e->dict_idx[s]), free(e->dict_coef[s]);
        e->dict_idx[s] = qf_malloc_aligned(need * sizeof(int32_t));
        e->dict_coef[s] = qf_malloc_aligned(need * sizeof(float));
        e->dict_n[s] = e->dict_idx[s] && e->dict_coef[s] ? need : 0;
        if (!e->dict_n[s]) return qf_fail(err, QF_ERR_NOMEM, "decode: out of memory for the kv-dict codes");
    }
    size_t per = (A + (size_t)hp->head_dim + 15) & ~(size_t)15;
    if (e->dict_thr_per < per) {
        free(e->dict_thr);
        e->dict_thr = qf_malloc_aligned((size_t)qf_pool_size(c->pool) * per * sizeof(float));
        e->dict_thr_per = e->dict_thr ? per : 0;
        if (!e->dict_thr) return qf_fail(err, QF_ERR_NOMEM, "decode: out of memory for the kv-dict scratch");
    }
    return QF_OK;
}

/* Does the coefficient domain pay for a dict stream at a decode step of n queries over T keys? Per
 * kv head, decoding the rows costs T s head_dim and attending them gq n T head_dim; the
 * coefficient domain parses the codes (about 4 T s) and, per query, n_atoms head_dim (P = A q, or
 * the atoms' weighted sum) plus T s. Short contexts with large dictionaries decode rows. */
static bool dict_coef_pays(const qf_context *c, int stream, int n, int T) {
    if (((const ctx_ext *)c)->dict_route == DICT_ROUTE_COEF) return true;
    const qf_hparams *hp = &c->model->hp;
    int sp;
    const qf_kv_dict *d = qf_kv_cache_dict(&c->kv, stream, 0, &sp);
    const double q = (double)hp->n_head / hp->n_head_kv * n, hd = hp->head_dim;
    return q * ((double)d->n_atoms * hd + (double)T * sp) + 4.0 * T * sp < (double)T * hd * (sp + q);
}

qf_status qf_decode_check(const qf_context *c, const int32_t *tokens, int n, int pos0, qf_error *err) {
    const int nv = c->model->hp.n_vocab;
    if (n <= 0) return qf_fail(err, QF_ERR_ARG, "decode: empty batch");
    if (n > c->n_batch)
        return qf_fail(err, QF_ERR_ARG, "decode: batch of %d tokens exceeds n_batch %d", n, c->n_batch);
    if (pos0 < 0 || pos0 + n > c->params.n_ctx)
        return qf_fail(err, QF_ERR_ARG, "decode: positions %d..%d exceed the context size %d", pos0,
                       pos0 + n - 1, c->params.n_ctx);
    for (int t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= nv)
            return qf_fail(err, QF_ERR_ARG, "decode: token id %d out of range [0, %d)", tokens[t], nv);
    return QF_OK;
}

qf_status qf_decode(qf_context *c, const int32_t *tokens, int n, int pos0, float *logits,
                    int logits_from, qf_error *err) {
    qf_model *m = c->model;
    const qf_hparams *hp = &m->hp;
    const qf_status bad = qf_decode_check(c, tokens, n, pos0, err);
    if (bad) return bad;

    if (c->gpu) return qf_gpu_decode(c, tokens, n, pos0, logits, logits_from, err);
    int miss_layer, miss_pos; /* a rewind past what the sliding-window rings still hold */
    if (pos0 > 0 && !qf_kv_cache_ring_holds(&c->kv, pos0 - hp->n_swa + 1, pos0, &miss_layer, &miss_pos))
        return qf_fail(err, QF_ERR_ARG,
                       "decode: the sliding-window cache of layer %d no longer holds position %d (a rewind to %d goes "
                       "back further than its window plus one batch); start again at position 0",
                       miss_layer, miss_pos, pos0);

    const int D = hp->n_embd, hd = hp->head_dim, Dq = hp->n_head * hd, F = hp->n_ff;
    const qf_tap *tap = c->tap;
    ctx_vecs *vecs = &ext(c)->vecs;
    bool ref = c->params.reference;

    for (int t = 0; t < n; t++) {
        const uint8_t *row = (const uint8_t *)m->tok_embd.data + (size_t)tokens[t] * m->tok_embd.row_bytes;
        if (ref || c->canon) qf_dequantize_row_ref(m->tok_embd.type, row, c->x + (size_t)t * D, D);
        else qf_dequantize_row(m->tok_embd.type, row, c->x + (size_t)t * D, D);
    }
    if (hp->embd_scale != 1.0f) /* gemma: embeddings times sqrt(n_embd) */
        for (size_t i = 0; i < (size_t)n * D; i++) c->x[i] *= hp->embd_scale;
    rope_tables(c, pos0, n);
    /* K before RoPE: for a cache that stores it so, and for a tap that asks for it */
    bool defer_k = c->kv.k_prerope || (tap && tap->on_k_prerope);
    if (c->kv.k_prerope) {
        qf_status st = kv_rope_tables(c, err);
        if (st) return st;
    }
    bool rq_fast = false;
    if (c->kv.rq[0] && c->kv.rq[1] && !ref && !c->canon && !ext(c)->rope_cos_swa && !c->kv.ring_rows &&
        c->rq_route != QF_RQ_ROUTE_ROWS) { /* (the canonical route reads the rows) */
        qf_status st = rq_fast_init(c, err);
        if (st) return st;
        rq_fast = true;
    }

    /* a decode step (as att_job.kv_direct: at most 2 queries) over a kv-dict stream may attend it
     * in the coefficient domain (not the reference or canonical routes, whose arithmetic is fixed) */
    const bool dict_any = n <= 2 && (c->kv.mode_k == QF_KV_DICT || c->kv.mode_v == QF_KV_DICT) && !ref && !c->canon &&
                          !rq_fast && ext(c)->dict_route != DICT_ROUTE_EXPAND;
    if (dict_any) {
        qf_status st = dict_coef_init(c, err);
        if (st) return st;
    }

    if (c->canon && (c->kv.n_sink || c->kv.n_window)) { /* attention_worker's exact-key scores */
        ctx_ext *e = ext(c);
        size_t per = (size_t)ATT_QBLOCK * ((size_t)c->kv.n_sink + ATT_QBLOCK + (size_t)c->kv.n_window);
        if (e->canon_ex_per < per) {
            float *b = malloc(sizeof(float) * per * (size_t)qf_pool_size(c->pool));
            if (!b) return qf_fail(err, QF_ERR_NOMEM, "decode: out of memory for the exact keys' scores");
            free(e->canon_ex);
            e->canon_ex = b, e->canon_ex_per = per;
        }
    }

    /* The last layer computes the attention output, o-projection and FFN only for the rows whose
     * logits are asked for (from row `skip` on; the others need only their K and V, written before the
     * attention): llama.cpp's inp_out_ids, which it applies after the o-projection. Exact: every
     * stage computes a row independently of the others (the GEMMs sum each (row, token) on its own
     * and the attention keeps its ATT_QBLOCK blocks), so the remaining rows get the same bits. Not
     * with a tap (it sees every row), an MoE layer, or when the skip would move the matmuls from the
     * GEMM to the decode route (fewer than GEMM_MIN_TOKENS rows left of at least as many). */
    int skip = !logits ? n : logits_from < 0 ? 0 : logits_from < n ? logits_from : n;
    if (tap || m->layers[hp->n_layer - 1].exp_gate ||
        (n >= GEMM_MIN_TOKENS && n - skip < GEMM_MIN_TOKENS && n - skip > 0) || ext(c)->no_skip)
        skip = 0;

    for (int il = 0; il < hp->n_layer; il++) {
        const qf_layer_weights *L = &m->layers[il];
        const layer_vecs *lv = &vecs->layers[il];
        const int s0 = il == hp->n_layer - 1 ? skip : 0, nr = n - s0; /* rows [s0, n) past the attention */
        float *xs = c->x + (size_t)s0 * D;

        rmsnorm_rows(c, c->xn, c->x, lv->attn_norm, n);
        if (tap && tap->on_act) tap->on_act(tap->user, il, QF_ACT_ATTN_IN, n, D, c->xn);
        {
            const qf_weight *ws[3] = {&L->wq, &L->wk, &L->wv};
            float *ys[3] = {c->q, c->k, c->v};
            matmul_n(c, 3, ws, c->xn, n, ys);
        }
        bool swa_rope = ext(c)->rope_cos_swa && qf_hparams_layer_swa(hp, il); /* gemma3 local layers */
        ew_job ej = {.c = c, .lv = lv, .n = n, .stage = 0, .defer_k_rope = defer_k, .ff = hp->n_ff,
                     .rcos = swa_rope ? ext(c)->rope_cos_swa : c->rope_cos,
                     .rsin = swa_rope ? ext(c)->rope_sin_swa : c->rope_sin};
        ew_run(c, &ej); /* bias, RoPE */
        if (tap && tap->on_q) tap->on_q(tap->user, il, pos0, n, hp->n_head, hd, c->q);
        if (defer_k) {
            if (tap && tap->on_k_prerope) tap->on_k_prerope(tap->user, il, pos0, n, hp->n_head_kv, hd, c->k);
            if (c->kv.k_prerope) qf_kv_cache_write_pool(&c->kv, 0, il, pos0, n, c->k, c->pool);
            ej.stage = 2;
            ew_run(c, &ej); /* RoPE on k */
            if (c->kv.k_prerope) qf_kv_cache_write_sinks(&c->kv, 0, il, pos0, n, c->k); /* exact = post-RoPE */
        }
        if (tap && tap->on_kv) tap->on_kv(tap->user, il, pos0, n, hp->n_head_kv, hd, c->k, c->v);
        if (!c->kv.k_prerope) qf_kv_cache_write_pool(&c->kv, 0, il, pos0, n, c->k, c->pool);
        qf_kv_cache_write_pool(&c->kv, 1, il, pos0, n, c->v, c->pool);

        att_job aj = {.c = c, .layer = il, .n = n, .pos0 = pos0, .q0 = s0};
        /* rows stored rotated: attention in their basis, not one inverse rotation per cached row
         * and step (not for the reference and canonical routes, whose arithmetic is fixed, nor
         * where RoPE or the exact f16 rows need the rows unrotated) */
        const bool rot_ok = !c->kv.k_prerope && !c->kv.n_sink && !c->kv.n_window && !c->canon &&
                            !c->params.reference && !rq_fast && !ext(c)->no_rotq && !qf_kv_cache_v_predicted(&c->kv, il);
        aj.rotk = rot_ok && qf_kv_cache_stream_rotated(&c->kv, 0);
        aj.rotv = rot_ok && qf_kv_cache_stream_rotated(&c->kv, 1);
        /* a decode step over a plain f16 / q8_0 / q4_0 cache reads its rows in place (every block
         * has at most 2 queries: the kernels above; a --kv-rot cache's in its rotated basis, as
         * rotk / rotv say), unless something needs the f32 view */
        aj.kt = qf_kv_mode_row_type(c->kv.mode_k), aj.vt = qf_kv_mode_row_type(c->kv.mode_v);
        aj.kv_direct = n <= 2 && qf_kv_rows_fast(aj.kt) && qf_kv_rows_fast(aj.vt) && /* f16, q8_0, q4_0 rows */
                       (c->kv.rot == QF_KV_ROT_NONE || (aj.rotk && aj.rotv)) &&
                       !c->kv.k_prerope && !c->kv.n_sink &&
                       !c->kv.n_window && !(c->kv.ring_rows && c->kv.ring_rows[il]) && !c->canon &&
                       !c->params.reference && !rq_fast && hd % 32 == 0 &&
                       c->kv.row_bytes[0] == qf_row_bytes(aj.kt, hd) && c->kv.row_bytes[1] == qf_row_bytes(aj.vt, hd) &&
                       !ext(c)->no_kv_direct;
        /* kv-dict in the coefficient domain: K only when stored after RoPE (a pre-RoPE key is rotated
         * by its position's RoPE after decoding: q . R_p k is not a fixed function of the atoms'
         * dot products with q), not in a sliding-window ring, and where it pays */
        const bool dict_ok = dict_any && !(c->kv.ring_rows && c->kv.ring_rows[il]);
        aj.kdict = dict_ok && c->kv.mode_k == QF_KV_DICT && !c->kv.k_prerope && dict_coef_pays(c, 0, n, pos0 + n);
        aj.vdict = dict_ok && c->kv.mode_v == QF_KV_DICT && dict_coef_pays(c, 1, n, pos0 + n);
        if (rq_fast) {
            aj.vcoef = c->rq_route == QF_RQ_ROUTE_AUTO ? rq_vcoef(c, nr, pos0 + n) : c->rq_route == QF_RQ_ROUTE_COEF;
            aj.kfused = aj.vcoef && rq_kfused(c, n);
            aj.rq_run = aj.kfused ? rq_run_even(c, pos0 + n) : rq_run_len(c, pos0 + n);
            aj.vgroup = aj.vcoef && rq_vgroup(c, n);
            aj.cfused = aj.vcoef && rq_cfused(c, n);
            qf_pool_run(c->pool, rq_gather_worker, &aj);
            qf_pool_run(c->pool, rq_gather2_worker, &aj);
        } else if (aj.kv_direct) { /* attention_worker reads the cache */
        } else if ((aj.i8kfused = i8_kfused(c, &aj, n))) {
            for (int h = 0; h < hp->n_head; h++) qf_hadamard(c->q + (size_t)h * hd, hd); /* the keys' basis (n == 1) */
            aj.i8_run = i8_run_len(c, pos0 + n);
            aj.i8vfused = nr > 0 && i8_vfused(c, &aj);
            qf_pool_run(c->pool, i8_gather_worker, &aj);
            if (aj.i8vfused) {
                qf_pool_run(c->pool, i8_weights_worker, &aj);
                qf_pool_run(c->pool, i8_vsum_worker, &aj);
                qf_pool_run(c->pool, i8_vreduce_worker, &aj);
            }
        } else if (qf_kv_cache_v_predicted(&c->kv, il)) {
            for (aj.gphase = 1; aj.gphase <= 3; aj.gphase++) qf_pool_run(c->pool, kv_gather_worker, &aj);
        } else {
            qf_pool_run(c->pool, kv_gather_worker, &aj);
        }
        if (nr > 0 && !aj.i8vfused) qf_pool_run(c->pool, attention_worker, &aj);
        if (nr > 0 && aj.cfused) { /* the weighted sums, then the outputs (att_job.cfused) */
            qf_pool_run(c->pool, rq_csum_worker, &aj);
            qf_pool_run(c->pool, rq_apply_worker, &aj);
        }
        qf_kv_cache_push_window(&c->kv, il, pos0, n, c->k, c->v); /* exact window: keep this batch's f16 */
        if (nr == 0) continue;
        if (tap && tap->on_act) tap->on_act(tap->user, il, QF_ACT_ATTN_OUT, n, Dq, c->att);
        /* from here on rows [s0, n): x at xs, the others compact from row 0 */
        matmul(c, &L->wo, c->att + (size_t)s0 * Dq, nr, c->xn);
        if (lv->post_attn_norm) rmsnorm_rows(c, c->xn, c->xn, lv->post_attn_norm, nr); /* gemma */
        for (size_t i = 0; i < (size_t)nr * D; i++) xs[i] += c->xn[i];

        rmsnorm_rows(c, c->xn, xs, lv->ffn_norm, nr);
        if (tap && tap->on_act) tap->on_act(tap->user, il, QF_ACT_FFN_IN, n, D, c->xn);
        if (L->exp_gate) {
            moe_ffn(c, L, &ej); /* c->xn <- sum over the top-k experts */
        } else {
            const qf_weight *ws[2] = {&L->w_gate, &L->w_up};
            float *ys[2] = {c->hb, c->hb2};
            matmul_n(c, 2, ws, c->xn, nr, ys);
            ej.stage = 1;
            ej.n = nr;
            ew_run(c, &ej); /* hb = silu(hb) * hb2 (or gelu_tanh(hb) * hb2) */
            if (tap && tap->on_act) tap->on_act(tap->user, il, QF_ACT_FFN_DOWN, n, F, c->hb);
            matmul(c, &L->w_down, c->hb, nr, c->xn);
        }
        if (lv->post_ffw_norm) rmsnorm_rows(c, c->xn, c->xn, lv->post_ffw_norm, nr); /* gemma */
        for (size_t i = 0; i < (size_t)nr * D; i++) xs[i] += c->xn[i];
    }

    if (!logits || logits_from >= n) return QF_OK;
    int first = logits_from < 0 ? 0 : logits_from, n_out = n - first;
    for (int t = first; t < n; t++)
        (ref ? qf_rmsnorm_row_ref : qf_rmsnorm_row)(c->xn + (size_t)(t - first) * D, c->x + (size_t)t * D,
                                                    vecs->output_norm, D, hp->rms_eps);
    matmul(c, &m->output, c->xn, n_out, logits);
    if (hp->final_softcap > 0) { /* gemma2: c * tanh(logits / c) */
        const float cap = hp->final_softcap;
        for (size_t i = 0; i < (size_t)n_out * hp->n_vocab; i++) logits[i] = cap * tanhf(logits[i] / cap);
    }
    return QF_OK;
}
