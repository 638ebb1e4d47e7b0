/* cuda_backend.cu: the CUDA backend's context, its forward pass and the plugin's function table
 * (cuda_backend.h). It runs qf_decode's contract on the GPU with the same math as forward.c (the
 * CPU oracle it is certified against, tests/test_cuda.c); the kernels live by family in
 * cuda_gemm.cu, cuda_norm.cu, cuda_kv.cu, cuda_attention.cu and cuda_score.cu:
 *
 *   weights stay on the GPU in their stored GGUF type (F32 F16 BF16 Q4_0 Q5_0 Q8_0 Q4_K Q5_K
 *   Q6_K); every format is read through one device function, deq32<T>(row, sub-block), which
 *   dequantizes 32 consecutive elements exactly as quant.c's oracle does;
 *   a batch of n > 8 tokens (prefill) dequantizes each weight to f16 (F16 weights are used in
 *   place) and multiplies with cuBLAS (f16 x f16, f32 accumulation; QF_CUDA_GEMM=f32 selects
 *   f32 dequantization and sgemm); n <= 8 (decode) uses a fused dequantize-and-dot kernel with
 *   f32 activations, one warp per output row;
 *   RMSNorm, RoPE (NORM and NEOX, cos/sin tables computed on the host by the same f32 theta
 *   recurrence as forward.c's rope_tables), bias, SiLU*up and residuals are small kernels;
 *   prefill attention over an f16 cache is a flash-attention kernel on tensor cores
 *   (k_flash_f16: mma.sync f16 x f16 -> f32, K/V tiles shared by a GQA group, causal tiles
 *   skipped); decode and other caches use one warp per (query, head): q k^T, causal online
 *   softmax and the V sum in one pass over the cache, which lives on the GPU in f32, f16, q8_0
 *   or q4_0 (ggml blocks quantized on the GPU with ggml's reference rounding, bit-exact), int8
 *   (an artifact's static scales), dict codes (OMP-encoded on the GPU, the host encoder's
 *   bytes, or by the host's encoder where the device's scratch does not fit; decoded on the
 *   GPU) or kv-rq rows (encoded and decoded on the GPU, the host codec's bytes
 *   and values, with exact f16 sinks and a recent window); int8, dict and rq layers are
 *   expanded to f32 for attention;
 *   quantized weights keep a persistent f16 copy for prefill GEMMs (f16 cache, memory
 *   permitting); decode with targets scores PPL rows on the GPU (log-softmax, NLL);
 *   with a tap set, K (post-RoPE), V and the activation sites are read back to the host and
 *   handed to the tap in forward.c's layout;
 *   --kv-rot hadamard: K/V rows are rotated per kv head (k_hadamard, bit-identical to
 *   hadamard.c) before they are stored; attention then runs on the rotated Q (H is orthogonal,
 *   so q.k is unchanged) and its output is rotated back (the V sum is linear). */
#include "kernels/cuda/cuda_common.cuh"

#define PROF_NCAT 7

/* ---------------------------------------------------------------------------------------- */
/* context                                                                                   */

typedef struct {
    dweight wq, wk, wv, wo, wg, wu, wd;
    /* fused prefill weights: q|k|v and gate|up rows in one allocation (wq..wv, wg/wu are views
     * into them); d is NULL where the parts differ in type or row size */
    dweight wqkv, wgu;
    float *attn_norm, *ffn_norm, *bq, *bk, *bv;
    /* the family features (NULL / 0 where the family has none) */
    float *q_norm, *k_norm, *post_attn_norm, *post_ffw_norm;
    int window;                  /* sliding window of this layer (qf_gpu_model.layer_window), 0 = global */
    /* MoE: the router and each expert's gate, up, down (views into exp_buf[0..2], which own
     * the n_expert experts of each kind in one allocation) */
    dweight gate_inp;
    dweight *eg, *eu, *ed;
    uint8_t *exp_buf[3];
    dweight sh_inp, sh_g, sh_u, sh_d; /* qwen2moe's shared expert (d NULL when none) */
} dlayer;

struct qf_cuda_ctx {
    cublasHandle_t blas;
    dlayer *layers;
    int n_layer;
    dweight tok_embd, output;
    float *output_norm;
    qf_kv_mode kv_mode[2];
    size_t kv_rb[2];
    uint8_t *kv[2];        /* [layer][n_ctx][n_head_kv] rows */
    size_t kv_layer_bytes[2];
    /* int8 / dict KV, bound from an artifact (set_kv) */
    float *kv_scale[2], *kv_inv[2]; /* int8: [n_layer][n_head_kv * head_dim] */
    int kv_layout[2];               /* int8: row layout (engine.h qf_kv_int8_layout) */
    float *tok_step;                /* int8 token layouts: the 256 steps (kv_tok_steps), device */
    float *kv_atoms[2];             /* dict: [n_layer][n_atoms][head_dim], unit norm */
    float *kv_gram[2];              /* dict: [n_layer][n_atoms][n_atoms] (the host's), or NULL: the host encodes */
    qf_gpu_dict_omp kv_omp;                /* dict: the encoder's stopping rules (the engine's) */
    int kv_na[2], kv_s[2], kv_q8[2];
    float *kv_f32[2];               /* int8 / dict: the layer's cache expanded to f32, [n_ctx][n_head_kv][head_dim] */
    uint16_t *kv_ecix[2];           /* int8 ec-rot: the rows' index, [n_layer][n_ctx][kv_ec_index_per_pos] (or NULL) */
    uint8_t *h_codes;               /* dict: host staging of the codes of one batch */
    void (*encode)(void *user, int s, int il, const float *rows, int64_t n, uint8_t *codes); /* dict: the host's */
    void *encode_user;
    bool kv_rot;                    /* --kv-rot hadamard */
    struct rq_state *rq;            /* kv-rq caches (both streams), or NULL */
    int nkv, hd;
    qf_hparams hp;                  /* the model's */
    /* a family feature beyond llama/qwen2 (docs/families.md): the forward pass then takes the
     * plain routes (separate q/k/v and gate/up matmuls, the warp attention kernel, no graphs) */
    bool fam;
    float *rcos_swa, *rsin_swa;     /* gemma3: RoPE tables of the sliding-window layers' base (device) */
    float *h_cos2, *h_sin2;         /* their host staging */
    /* MoE: router logits, gathered rows of one expert (in, out), the FFN sum, the routed
     * tokens and weights grouped by expert (device); the host's copies for the routing */
    float *moe_logits, *moe_x, *moe_y, *moe_acc, *moe_rw;
    int *moe_rows;
    float *h_moe_logits, *h_moe_w, *h_moe_rw;
    int *h_moe_ids, *h_moe_rows;
    void (*moe_route)(const qf_hparams *hp, float *logits, int n, int *ids, float *w);
    int n_ctx, n_batch;
    bool gemm_f32;
    bool attn_warp;        /* QF_CUDA_ATTN=warp: the one-warp-per-(query, head) kernel for prefill too */
    bool gu16;             /* QF_CUDA_GU16=1 (experimental, not certified): the gate|up GEMM writes f16 */
    bool f16_cache;        /* quantized weights keep an f16 copy for prefill GEMMs (knob no_f16_cache: off) */
    bool q4g;              /* q4_0 / q8_0 / Q6_K weights of whole groups take the G8 layouts (knob no_q4_regroup: off) */
    bool pdl;              /* the decode graph uses programmatic dependent launch (knob no_pdl: off) */
    bool i8_expand;        /* knob i8_expand: int8 decode expands the layer every step (not in place) */
    bool norm_fold;        /* decode's RMSNorms folded into the matvecs around them (knob no_norm_fold: off) */
    float *h_lg;           /* pinned staging for one row of logits (forward_graph's copy), or NULL */
#define LG_CHUNKS 4
    cudaEvent_t lg_ev[LG_CHUNKS];
    /* the canonical arithmetic (qf_gpu_params.canonical, a llama / qwen2 model): forward_canon, when
     * the cache is covered too (canon_on); ck, cv the layer's K, V as f32 [n_ctx][n_head_kv][hd]
     * for a plain cache (allocated on first use, NULL until then), cs the attention scores
     * [n_head][n_batch][n_ctx] */
    bool canon;
    float *ck, *cv, *cs;
    size_t f16_cache_bytes;
    /* device scratch */
    float *x, *xn, *q, *k, *v, *att, *hb, *hb2, *logits, *rcos, *rsin;
    float *qkv, *gu;       /* fused GEMM outputs: [n_batch][Dq + 2 Dkv], [n_batch][2 n_ff] */
    float *part;           /* split-K decode attention partials (attention_split_floats) */
    void *wdeq;            /* dequantized weight (f16 or f32) */
    size_t wdeq_bytes;
    __half *xh;            /* f16 activations for the f16 gemm */
    __half *xl;            /* [B][n_embd] their f16 residual (launch_f16_lo): q|k|v with a quantized cache */
    void *xq2;             /* norm_fold's activation, ACT_Q_BYTES(1, n_embd) */
    float *nss;            /* norm_fold's sums of squares [NF_REP][n_embd / 32] */
    /* the output norm folded into the last down, for the forward_logits after it (one token):
     * forward_layers sets onf_on where it applies */
    ::norm_fold onf;
    bool onf_on;
    int32_t *tok, *tgt;
    double *nll;           /* [n_batch] per-row NLL of the PPL scoring kernel */
    float *h_pin;          /* pinned staging for the logits copy (2 halves), or NULL */
    size_t pin_bytes;
    cudaEvent_t pin_ev[2];
    /* host */
    float *h_cos, *h_sin, *h_k, *h_v, *h_act, *rope_ff;
    float *h_kpre;                  /* [n_batch][Dkv]: K before RoPE (kv-rq's host encoder, the on_k_prerope tap) */
    size_t weight_bytes, kv_bytes, scratch_bytes;
    /* QF_CUDA_PROFILE=1: events between the stages of each decode, summed per category and
     * printed when the context is freed */
    cudaEvent_t *ev;
    int *ev_cat, n_ev, prof_calls;
    /* decode steps of one token replay a CUDA graph of the whole step (see forward_graph) */
    cudaStream_t stream;   /* the graph's stream (blocking: ordered with the default stream) */
    /* instantiated at the first eligible step of its band; dropped when the KV cache changes.
     * [0]: positions whose attention runs k_attn_one (attention_one_keys; the whole context when
     * that is 0 or covers it), [1]: the longer ones, split-K */
    cudaGraphExec_t gexec[2];
    int graph_nctx;        /* while [0] is captured for a longer context: the keys it serves, else 0 */
    bool graph_off;        /* knob no_graph (QF_CUDA_GRAPH=0), or capture failed once */
    long graph_steps;      /* steps replayed from the graph (qf_cuda_info) */
    long graph_nodes;      /* the last captured graph's nodes (qf_cuda_info) */
    float *dstep, *h_step; /* [cos half | sin half | token | pos]: device, and pinned host staging */
    qf_gpu_topk *dtopk, *h_topk; /* decode_topk's reduction: device, and pinned host (at its first call) */
    void *topk_scr;              /* and launch_topk's scratch */
    double prof_ms[PROF_NCAT], prof_first[PROF_NCAT]; /* all calls; the first call alone */
    /* uploads keyed by host pointer (tied output shares the embedding) */
};

/* A kv-rq cache on the GPU (set_kv): the rows as the host cache stores them (encoded by the host
 * cache itself, gpu.c's rq_write), decoded on the device for attention (k_kv_rq_expand), plus
 * the exact sinks and recent window and the tables that rotate pre-RoPE K rows on read. */
struct rq_state {
    rq_layer_dev *lay[2];      /* host [n_layer] per stream (codes point into kv[s]) */
    rq_enc_dev *enc[2];        /* host [n_layer] per stream: the encoder's view (dst: the layer's rows) */
    void *mem[2];              /* device: the codec arrays of each stream */
    size_t *loff[2];           /* host [n_layer + 1]: byte offset of each layer's rows in kv[s] */
    float *scale;              /* device [256]: the row scales, the host's exp2f */
    bool k_prerope;
    int n_sink, n_window;
    uint16_t *sink[2], *win[2]; /* device f16 bits [n_layer][n_sink][dkv], [n_layer][n_window][dkv] */
    int *win_pos;              /* device [n_layer][n_window]: the position a window slot holds, -1 none */
    float *ex[2];              /* device [n_ctx][dkv]: the exact view of a batch (more than one query) */
    float *kr_cos, *kr_sin;    /* device [n_ctx][n_rot / 2]: RoPE of every position (pre-RoPE K) */
    float *kpre, *vres;        /* device [n_batch][dkv]: K before RoPE, V minus its prediction */
    float *coef;               /* device [n_ctx][dkv]: format-3 coefficients of one layer (rq_store) */
    float *fpart;              /* device: launch_attention_exact_flash's two partial results */
};

static void rq_state_free(struct rq_state *r) {
    if (!r) return;
    for (int s = 0; s < 2; s++) {
        free(r->lay[s]), free(r->enc[s]), free(r->loff[s]);
        void *ps[] = {r->mem[s], r->sink[s], r->win[s], r->ex[s]};
        for (int i = 0; i < 4; i++)
            if (ps[i]) cudaFree(ps[i]);
    }
    void *ps[] = {r->scale, r->win_pos, r->kr_cos, r->kr_sin, r->kpre, r->vres, r->fpart, r->coef};
    for (int i = 0; i < 8; i++)
        if (ps[i]) cudaFree(ps[i]);
    free(r);
}

static bool available(void) {
    static int cached = -1;
    if (cached < 0) {
        int n = 0;
        cudaError_t e = cudaGetDeviceCount(&n);
        cached = (e == cudaSuccess && n > 0) ? 1 : 0;
        if (e != cudaSuccess) cudaGetLastError(); /* clear */
    }
    return cached == 1;
}

/* the contract: cuda_common.cuh (value + 1 a device; 0: not asked yet) */
int cu_smem_optin(void) {
    static std::atomic<int> known[64];
    int dev = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        cudaGetLastError(); /* clear */
        return 0;
    }
    if (dev < 64) {
        const int k = known[dev].load(std::memory_order_acquire);
        if (k) return k - 1;
    }
    if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
        cudaGetLastError(); /* clear; asked again next time */
        return 0;
    }
    if (dev < 64) known[dev].store(optin + 1, std::memory_order_release);
    return optin;
}

/* ---- programmatic dependent launch: on while this thread captures a decode graph ---- */
static thread_local bool tls_pdl;
bool cu_pdl(void) { return tls_pdl; }
void cu_pdl_set(bool on) { tls_pdl = on; }

/* the contract: cuda_common.cuh */
bool h2d_weight(uint8_t *dst, const void *src, qf_type t, int64_t k, int64_t rows, size_t rb, bool g8, cudaError_t *e) {
    *e = cudaSuccess;
    if (!g8) {
        *e = cudaMemcpy(dst, src, rb * (size_t)rows, cudaMemcpyHostToDevice);
        return *e == cudaSuccess;
    }
    const int64_t chunk = (int64_t)((64u << 20) / rb) > 0 ? (int64_t)((64u << 20) / rb) : 1; /* ~64 MiB of rows */
    const int64_t cr = chunk < rows ? chunk : rows;
    uint8_t *stage = (uint8_t *)malloc(rb * (size_t)cr);
    if (!stage) {
        *e = cudaErrorMemoryAllocation;
        return false;
    }
    for (int64_t r = 0; r < rows && *e == cudaSuccess; r += cr) {
        const int64_t nr = rows - r < cr ? rows - r : cr;
        if (t == QF_TYPE_Q6_K) qf_q6k_regroup((const uint8_t *)src + rb * (size_t)r, stage, nr, k);
        else g8_regroup_0((const uint8_t *)src + rb * (size_t)r, stage, nr, k, t == QF_TYPE_Q8_0);
        *e = cudaMemcpy(dst + rb * (size_t)r, stage, rb * (size_t)nr, cudaMemcpyHostToDevice);
    }
    free(stage);
    return *e == cudaSuccess;
}

static qf_status upload_weight(qf_cuda_ctx *g, const qf_weight *w, const char *name, dweight *out, qf_error *err) {
    qf_status st = QF_OK;
    memset(out, 0, sizeof *out);
    if (!w->data) return QF_OK;
    if (!gpu_type_ok(w->type) || (w->ne0 % 32 && w->type != QF_TYPE_F32)) /* f32: sgemm at any width */
        return cu_fail(err, QF_ERR_DEVICE, "CUDA backend: tensor %s has type %s, which the GPU path does not run", name,
                       cu_type_name(w->type));
    size_t bytes = w->row_bytes * (size_t)w->ne1;
    out->type = w->type, out->ne0 = w->ne0, out->ne1 = w->ne1, out->row_bytes = w->row_bytes;
    out->g8 = g->q4g && g8_ok(w->type, w->ne0);
    CK(cudaMalloc((void **)&out->d, bytes));
    {
        cudaError_t e;
        if (!h2d_weight(out->d, w->data, w->type, w->ne0, w->ne1, w->row_bytes, out->g8, &e)) CK(e);
    }
    g->weight_bytes += bytes;
done:
    return st;
}

static qf_status upload_vec(qf_cuda_ctx *g, const qf_gpu_model *m, const qf_weight *w, float **out, qf_error *err) {
    qf_status st = QF_OK;
    *out = NULL;
    if (!w->data) return QF_OK;
    float *tmp = (float *)malloc((size_t)w->ne0 * sizeof(float));
    if (!tmp) return cu_fail(err, QF_ERR_NOMEM, "out of memory");
    m->dequant_row(w->type, w->data, tmp, w->ne0);
    CK(cudaMalloc((void **)out, (size_t)w->ne0 * sizeof(float)));
    CK(cudaMemcpy(*out, tmp, (size_t)w->ne0 * sizeof(float), cudaMemcpyHostToDevice));
    g->weight_bytes += (size_t)w->ne0 * sizeof(float);
done:
    free(tmp);
    return st;
}

static void free_weight(dweight *w) {
    if (!w->view) {
        if (w->d) cudaFree(w->d);
        if (w->h16) cudaFree(w->h16);
    }
    w->d = NULL, w->h16 = NULL;
}

/* Upload cnt weights that share type and row size as consecutive rows of one allocation
 * (*fused), the parts being views into it; otherwise upload them one by one (fused->d NULL). */
static qf_status upload_fused(qf_cuda_ctx *g, const qf_weight *const *ws, const char *const *names, int cnt,
                              dweight *const *parts, dweight *fused, qf_error *err) {
    qf_status st = QF_OK;
    bool ok = true;
    int64_t rows = 0;
    memset(fused, 0, sizeof *fused);
    for (int i = 0; i < cnt; i++) {
        const qf_weight *w = ws[i];
        ok = ok && w->data && w->type == ws[0]->type && w->ne0 == ws[0]->ne0 && w->row_bytes == ws[0]->row_bytes &&
             gpu_type_ok(w->type) && w->type != QF_TYPE_F32 && w->ne0 % 32 == 0;
        rows += w->ne1;
    }
    if (!ok) {
        for (int i = 0; i < cnt; i++)
            if ((st = upload_weight(g, ws[i], names[i], parts[i], err))) return st;
        return QF_OK;
    }
    const size_t rb = ws[0]->row_bytes;
    fused->type = ws[0]->type, fused->ne0 = ws[0]->ne0, fused->ne1 = rows, fused->row_bytes = rb;
    fused->g8 = g->q4g && g8_ok(ws[0]->type, ws[0]->ne0);
    CK(cudaMalloc((void **)&fused->d, rb * (size_t)rows));
    g->weight_bytes += rb * (size_t)rows;
    rows = 0;
    for (int i = 0; i < cnt; i++) {
        dweight *p = parts[i];
        memset(p, 0, sizeof *p);
        p->type = ws[i]->type, p->ne0 = ws[i]->ne0, p->ne1 = ws[i]->ne1, p->row_bytes = rb, p->view = true;
        p->g8 = fused->g8;
        p->d = fused->d + rb * (size_t)rows;
        cudaError_t e;
        if (!h2d_weight(p->d, ws[i]->data, ws[i]->type, ws[i]->ne0, ws[i]->ne1, rb, p->g8, &e)) CK(e);
        rows += ws[i]->ne1;
    }
done:
    return st;
}

#define PROF_MAX_EV 4096
static const char *const prof_names[PROF_NCAT] = {"norm/rope/misc", "matmul q/k/v", "attention+kv", "logits",
                                                  "matmul o",       "matmul gate/up", "matmul down"};
/* close the stage that ends here as category `cat` */
static void prof_mark(qf_cuda_ctx *g, int cat) {
    if (!g->ev || g->n_ev >= PROF_MAX_EV) return;
    g->ev_cat[g->n_ev] = cat;
    cudaEventRecord(g->ev[g->n_ev++], 0);
}
static void prof_collect(qf_cuda_ctx *g) {
    if (!g->ev || g->n_ev < 2) return;
    cudaEventSynchronize(g->ev[g->n_ev - 1]);
    for (int i = 1; i < g->n_ev; i++) {
        float ms = 0;
        cudaEventElapsedTime(&ms, g->ev[i - 1], g->ev[i]);
        g->prof_ms[g->ev_cat[i]] += ms;
        if (!g->prof_calls) g->prof_first[g->ev_cat[i]] += ms;
    }
    g->n_ev = 0;
    g->prof_calls++;
}

static void ctx_free(qf_cuda_ctx *g) {
    if (!g) return;
    if (g->ev) {
        fprintf(stderr, "QF_CUDA_PROFILE: %d decode calls:", g->prof_calls);
        for (int i = 0; i < PROF_NCAT; i++) fprintf(stderr, " %s %.2f ms;", prof_names[i], g->prof_ms[i]);
        fprintf(stderr, "\n");
        if (g->prof_calls > 1) {
            fprintf(stderr, "QF_CUDA_PROFILE: per call after the first (%d calls):", g->prof_calls - 1);
            for (int i = 0; i < PROF_NCAT; i++)
                fprintf(stderr, " %s %.3f ms;", prof_names[i], (g->prof_ms[i] - g->prof_first[i]) / (g->prof_calls - 1));
            fprintf(stderr, "\n");
        }
        for (int i = 0; i < PROF_MAX_EV; i++) cudaEventDestroy(g->ev[i]);
        free(g->ev), free(g->ev_cat);
    }
    if (g->layers) {
        for (int il = 0; il < g->n_layer; il++) {
            dlayer *L = &g->layers[il];
            free_weight(&L->wq), free_weight(&L->wk), free_weight(&L->wv), free_weight(&L->wo);
            free_weight(&L->wg), free_weight(&L->wu), free_weight(&L->wd);
            free_weight(&L->wqkv), free_weight(&L->wgu);
            float *vs[] = {L->attn_norm, L->ffn_norm, L->bq, L->bk, L->bv, L->q_norm, L->k_norm, L->post_attn_norm,
                           L->post_ffw_norm};
            for (int i = 0; i < 9; i++)
                if (vs[i]) cudaFree(vs[i]);
            free_weight(&L->gate_inp);
            free_weight(&L->sh_inp), free_weight(&L->sh_g), free_weight(&L->sh_u), free_weight(&L->sh_d);
            for (int k = 0; k < 3; k++)
                if (L->exp_buf[k]) cudaFree(L->exp_buf[k]);
            free(L->eg), free(L->eu), free(L->ed);
        }
        free(g->layers);
    }
    if (g->output.d != g->tok_embd.d) free_weight(&g->output);
    else if (g->output.h16) cudaFree(g->output.h16); /* tied: only the f16 cache is the output's own */
    free_weight(&g->tok_embd);
    void *bufs[] = {g->output_norm, g->kv[0], g->kv[1], g->x, g->xn, g->q, g->k, g->v, g->att, g->hb,
                    g->hb2, g->logits, g->rcos, g->rsin, g->wdeq, g->xh, g->xl, g->tok, g->tgt, g->nll,
                    g->qkv, g->gu, g->part, g->rcos_swa, g->rsin_swa, g->moe_logits, g->moe_x, g->moe_y,
                    g->moe_acc, g->moe_rw, g->moe_rows, g->ck, g->cv, g->cs, g->xq2, g->nss};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) cudaFree(bufs[i]);
    if (g->blas) cublasDestroy(g->blas);
    for (int b = 0; b < 2; b++)
        if (g->gexec[b]) cudaGraphExecDestroy(g->gexec[b]);
    if (g->stream) cudaStreamDestroy(g->stream);
    if (g->dstep) cudaFree(g->dstep);
    if (g->tok_step) cudaFree(g->tok_step);
    if (g->h_step) cudaFreeHost(g->h_step);
    if (g->dtopk) cudaFree(g->dtopk);
    if (g->topk_scr) cudaFree(g->topk_scr);
    if (g->h_topk) cudaFreeHost(g->h_topk);
    if (g->h_lg) {
        cudaFreeHost(g->h_lg);
        for (int c = 0; c < LG_CHUNKS; c++)
            if (g->lg_ev[c]) cudaEventDestroy(g->lg_ev[c]);
    }
    if (g->h_pin) {
        cudaFreeHost(g->h_pin);
        cudaEventDestroy(g->pin_ev[0]), cudaEventDestroy(g->pin_ev[1]);
    }
    for (int s = 0; s < 2; s++) {
        void *ps[] = {g->kv_scale[s], g->kv_inv[s], g->kv_atoms[s], g->kv_f32[s], g->kv_gram[s], g->kv_ecix[s]};
        for (int i = 0; i < 6; i++)
            if (ps[i]) cudaFree(ps[i]);
    }
    rq_state_free(g->rq);
    free(g->h_codes);
    free(g->h_cos), free(g->h_sin), free(g->h_k), free(g->h_v), free(g->h_act), free(g->rope_ff), free(g->h_kpre);
    free(g->h_cos2), free(g->h_sin2), free(g->h_moe_logits), free(g->h_moe_w), free(g->h_moe_rw), free(g->h_moe_ids);
    free(g->h_moe_rows);
    free(g);
}

static void rope_host(const qf_cuda_ctx *g, int n, int pos0, float *cs, float *sn);

/* carve n bytes (16-aligned) from a host-planned device block: off advances */
static size_t rq_take(size_t *off, size_t n) {
    const size_t at = *off;
    *off += (n + 15) & ~(size_t)15;
    return at;
}

/* kv-rq on the device from kv's codecs (both streams kv-rq); the rows themselves are allocated
 * by set_kv from (*out)->loff. Format-3 and predictor matrices are uploaded as they are, each
 * array in one copy, and transposed on the device (launch_transpose_sq: encT, decT, predT as
 * rq_layer_dev names them; on the host the predictor's transposes alone took 0.27 s a bind at the
 * 8B shape on a 2-core machine, and the certifier binds 64 times); the bit offsets of format-3 codes are
 * precomputed (the prefix sums of the widths). */
static qf_status rq_state_new(const qf_cuda_ctx *g, const qf_gpu_kv *kv, struct rq_state **out, qf_error *err) {
    qf_status st = QF_OK;
    const int L = g->n_layer, H = g->nkv, D = g->hd, HD = H * D, half = g->hp.n_rot / 2;
    const size_t nl = (size_t)L * H;
    uint16_t *bo = NULL; /* host: the format-3 bit offsets [nl][D] */
    float *stage = NULL; /* device: a matrix array before its transpose */
    struct rq_state *r = (struct rq_state *)calloc(1, sizeof *r);
    *out = NULL;
    if (!r) return cu_fail(err, QF_ERR_NOMEM, "out of memory");
    if (kv->mode[0] != QF_KV_RQ || kv->mode[1] != QF_KV_RQ) {
        st = cu_fail(err, QF_ERR_DEVICE, "CUDA backend: kv-rq runs with both K and V in kv-rq rows");
        goto done;
    }
    if (kv->k_prerope && g->rcos_swa) {
        st = cu_fail(err, QF_ERR_DEVICE, "CUDA backend: pre-RoPE K with two RoPE bases (gemma3) is not supported");
        goto done;
    }
    r->k_prerope = kv->k_prerope, r->n_sink = kv->n_sink, r->n_window = kv->n_window;
    for (int s = 0; s < 2; s++) {
        const qf_gpu_kv_rq *q = &kv->rq[s];
        if (!q->bits || !q->row_bytes || !q->levels || !q->mean || !q->cs || !q->inv_cs) {
            st = cu_fail(err, QF_ERR_ARG, "CUDA backend: kv-rq cache without codecs");
            goto done;
        }
        const bool klt = q->klt_dec != NULL, pred = s == 1 && q->pred;
        if (pred && (size_t)HD * sizeof(float) > 48 * 1024) { /* k_kv_rq_expand's shared partial sums */
            st = cu_fail(err, QF_ERR_DEVICE, "CUDA backend: a kv-rq V predictor over %d K values per token exceeds the "
                                             "GPU decoder's %d (use --device cpu)", HD, 12 * 1024);
            goto done;
        }
        if (klt && (!q->klt_enc || !q->klt_sigma || !q->klt_levels || !q->klt_width)) {
            st = cu_fail(err, QF_ERR_ARG, "CUDA backend: kv-rq format 3 without its arrays");
            goto done;
        }
        r->lay[s] = (rq_layer_dev *)calloc((size_t)L, sizeof(rq_layer_dev));
        r->enc[s] = (rq_enc_dev *)calloc((size_t)L, sizeof(rq_enc_dev));
        r->loff[s] = (size_t *)calloc((size_t)L + 1, sizeof(size_t));
        if (!r->lay[s] || !r->enc[s] || !r->loff[s]) {
            st = cu_fail(err, QF_ERR_NOMEM, "out of memory");
            goto done;
        }
        size_t off = 0;
        const size_t o_lv = rq_take(&off, nl * 64 * 4), o_mean = rq_take(&off, nl * D * 4), o_cs = rq_take(&off, nl * D * 4),
                     o_inv = rq_take(&off, nl * D * 4);
        size_t o_dec = 0, o_enc = 0, o_sig = 0, o_klv = 0, o_w = 0, o_bo = 0, o_pred = 0;
        if (klt) {
            o_dec = rq_take(&off, nl * D * D * 4), o_enc = rq_take(&off, nl * D * D * 4), o_sig = rq_take(&off, nl * D * 4);
            o_klv = rq_take(&off, nl * D * 64 * 4), o_w = rq_take(&off, nl * D), o_bo = rq_take(&off, nl * D * 2);
        }
        if (pred) o_pred = rq_take(&off, (size_t)L * HD * HD * 4);
        CK(cudaMalloc(&r->mem[s], off));
        uint8_t *m = (uint8_t *)r->mem[s];
        CK(cudaMemcpy(m + o_lv, q->levels, nl * 64 * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(m + o_mean, q->mean, nl * D * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(m + o_cs, q->cs, nl * D * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(m + o_inv, q->inv_cs, nl * D * 4, cudaMemcpyHostToDevice));
        const size_t stage_n = wmax(klt ? nl * D * D : 0, pred ? (size_t)L * HD * HD : 0);
        if (stage) { /* the previous stream's (its transposes ran before, in order on stream 0) */
            CK(cudaFree(stage));
            stage = NULL;
        }
        if (stage_n) CK(cudaMalloc((void **)&stage, stage_n * 4));
        if (klt) {
            CK(cudaMemcpy(m + o_sig, q->klt_sigma, nl * D * 4, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(m + o_klv, q->klt_levels, nl * D * 64 * 4, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(m + o_w, q->klt_width, nl * D, cudaMemcpyHostToDevice));
            for (int w = 0; w < 2; w++) { /* dec and enc, transposed per head */
                CK(cudaMemcpy(stage, w ? q->klt_enc : q->klt_dec, nl * D * D * 4, cudaMemcpyHostToDevice));
                launch_transpose_sq(stage, nl, D, (float *)(m + (w ? o_enc : o_dec)), 0);
                CK(cudaGetLastError());
            }
            if (!bo && !(bo = (uint16_t *)malloc(nl * D * 2))) {
                st = cu_fail(err, QF_ERR_NOMEM, "out of memory");
                goto done;
            }
            rq_bit_offsets(q->klt_width, nl, D, bo);
            CK(cudaMemcpy(m + o_bo, bo, nl * D * 2, cudaMemcpyHostToDevice));
        }
        if (pred) { /* every layer's, transposed (predT below only where pred_on) */
            CK(cudaMemcpy(stage, q->pred, (size_t)L * HD * HD * 4, cudaMemcpyHostToDevice));
            launch_transpose_sq(stage, (size_t)L, HD, (float *)(m + o_pred), 0);
            CK(cudaGetLastError());
        }
        for (int l = 0; l < L; l++) {
            rq_layer_dev *a = &r->lay[s][l];
            r->loff[s][l + 1] = r->loff[s][l] + ((q->row_bytes[l] * (size_t)g->n_ctx * H + 255) & ~(size_t)255);
            a->rb = q->row_bytes[l], a->bits = q->bits[l];
            a->levels = (const float *)(m + o_lv) + (size_t)l * H * 64;
            a->mean = (const float *)(m + o_mean) + (size_t)l * H * D;
            a->cs = (const float *)(m + o_cs) + (size_t)l * H * D;
            a->hs = 1.0f / sqrtf((float)D); /* as qf_hadamard computes it */
            rq_enc_dev *en = &r->enc[s][l];
            en->rb = a->rb, en->bits = a->bits, en->levels = a->levels, en->mean = a->mean, en->hs = a->hs;
            en->inv_cs = (const float *)(m + o_inv) + (size_t)l * H * D;
            if (klt && a->bits != 16) {
                en->encT = (const float *)(m + o_enc) + (size_t)l * H * D * D;
                en->sigma = (const float *)(m + o_sig) + (size_t)l * H * D;
                en->klevels = (const float *)(m + o_klv) + (size_t)l * H * D * 64;
                en->width = (const uint8_t *)(m + o_w) + (size_t)l * H * D;
                a->decT = (const float *)(m + o_dec) + (size_t)l * H * D * D;
                a->sigma = (const float *)(m + o_sig) + (size_t)l * H * D;
                a->klevels = (const float *)(m + o_klv) + (size_t)l * H * D * 64;
                a->width = (const uint8_t *)(m + o_w) + (size_t)l * H * D;
                a->boff = (const uint16_t *)(m + o_bo) + (size_t)l * H * D;
            } else if (a->bits < 1 || (a->bits > 6 && a->bits != 16)) {
                st = cu_fail(err, QF_ERR_ARG, "CUDA backend: kv-rq layer %d has %d bits", l, a->bits);
                goto done;
            }
            if (pred && q->pred_on && q->pred_on[l]) a->predT = (const float *)(m + o_pred) + (size_t)l * HD * HD;
        }
    }
    {
        float sc[256];
        rq_scale_table(sc);
        CK(cudaMalloc((void **)&r->scale, sizeof sc));
        CK(cudaMemcpy(r->scale, sc, sizeof sc, cudaMemcpyHostToDevice));
        for (int s = 0; s < 2; s++)
            for (int l = 0; l < L; l++) r->lay[s][l].scale = r->enc[s][l].scale = r->scale;
        const size_t nb = (size_t)(g->n_batch > 0 ? g->n_batch : 1) * HD * 4;
        CK(cudaMalloc((void **)&r->kpre, nb));
        CK(cudaMalloc((void **)&r->vres, nb));
        CK(cudaMalloc((void **)&r->coef, (size_t)g->n_ctx * HD * 4));
    }
    if (r->n_sink || r->n_window) {
        for (int s = 0; s < 2; s++) {
            if (r->n_sink) CK(cudaMalloc((void **)&r->sink[s], (size_t)L * r->n_sink * HD * 2));
            if (r->n_window) CK(cudaMalloc((void **)&r->win[s], (size_t)L * r->n_window * HD * 2));
            CK(cudaMalloc((void **)&r->ex[s], (size_t)g->n_ctx * HD * 4));
        }
        if (g->n_batch > MATVEC_MAX) /* prefill batches on the flash route */
            CK(cudaMalloc((void **)&r->fpart, attention_exact_flash_floats(g->n_batch, g->hp.n_head, D) * 4));
        if (r->n_window) {
            CK(cudaMalloc((void **)&r->win_pos, (size_t)L * r->n_window * 4));
            CK(cudaMemset(r->win_pos, 0xff, (size_t)L * r->n_window * 4)); /* -1: no position */
        }
    }
    if (r->k_prerope) {
        const size_t nb = (size_t)g->n_ctx * half * 4;
        float *hc = (float *)malloc(nb + 4), *hs = (float *)malloc(nb + 4);
        if (!hc || !hs) {
            free(hc), free(hs);
            st = cu_fail(err, QF_ERR_NOMEM, "out of memory");
            goto done;
        }
        rope_host(g, g->n_ctx, 0, hc, hs); /* the tables of every position, as forward.c's kv_rope_tables */
        cudaError_t e = cudaMalloc((void **)&r->kr_cos, nb + 4);
        if (e == cudaSuccess) e = cudaMalloc((void **)&r->kr_sin, nb + 4);
        if (e == cudaSuccess) e = cudaMemcpy(r->kr_cos, hc, nb, cudaMemcpyHostToDevice);
        if (e == cudaSuccess) e = cudaMemcpy(r->kr_sin, hs, nb, cudaMemcpyHostToDevice);
        free(hc), free(hs);
        if (e != cudaSuccess) {
            st = cuda_fail(err, e, "kv-rq RoPE tables");
            goto done;
        }
    }
    CK(cudaStreamSynchronize(0)); /* the transposes done (and their errors seen) before the stage goes */
done:
    free(bo);
    if (stage) cudaFree(stage);
    if (st) rq_state_free(r);
    else *out = r;
    return st;
}

/* (Re)build the GPU KV cache in kv's modes: f32, f16, q8_0, q4_0 as they are; int8 with
 * kv's static scales (and their reciprocals, the host's own, so the device quantizes with
 * the same bits); dict with kv's normalised dictionaries and their Gram matrices (the codes are
 * encoded on the device, or on the host, see kv_store). The old cache is freed only once the new
 * one exists. */
static qf_status set_kv(qf_cuda_ctx *g, const qf_gpu_kv *kv, qf_error *err) {
    qf_status st = QF_OK;
    const int hd = g->hd, nkv = g->nkv, L = g->n_layer, dkv = nkv * hd;
    qf_kv_mode mode[2] = {kv->mode[0], kv->mode[1]};
    size_t rb[2] = {0, 0}, lb[2] = {0, 0}, codes = 0;
    uint8_t *d[2] = {NULL, NULL}, *hc = NULL;
    uint16_t *ix[2] = {NULL, NULL};
    float *sc[2] = {NULL, NULL}, *inv[2] = {NULL, NULL}, *at[2] = {NULL, NULL}, *f32[2] = {NULL, NULL};
    float *gr[2] = {NULL, NULL};
    int na[2] = {0, 0}, sp[2] = {0, 0}, q8[2] = {0, 0};
    struct rq_state *rq = NULL;
    if (kv->n_layer != L || kv->n_head_kv != nkv || kv->head_dim != hd || kv->n_ctx != g->n_ctx)
        return cu_fail(err, QF_ERR_ARG, "CUDA backend: the KV cache's shape does not match the GPU context");
    if (mode[0] == QF_KV_RQ || mode[1] == QF_KV_RQ) {
        if (g->kv_rot) return cu_fail(err, QF_ERR_ARG, "CUDA backend: --kv-rot applies to f32/f16/q8_0/q4_0 caches, not to rq");
        if (g->hp.attn_softcap > 0 || g->hp.swa != QF_SWA_NONE || g->hp.attn_scale != 1.0f / sqrtf((float)hd))
            return cu_fail(err, QF_ERR_DEVICE, "CUDA backend: kv-rq with soft-capped, sliding-window or rescaled "
                                               "attention is not supported (use --device cpu)");
        if ((st = rq_state_new(g, kv, &rq, err))) return st;
    } else if (kv->k_prerope || kv->n_sink || kv->n_window)
        return cu_fail(err, QF_ERR_DEVICE, "CUDA backend: pre-RoPE K and exact sinks / window run with kv-rq caches only");
    for (int s = 0; s < 2; s++) {
        if (mode[s] == QF_KV_INT8) {
            if (!kv->int8_scale[s] || !kv->int8_inv_scale[s])
                return cu_fail(err, QF_ERR_ARG, "CUDA backend: int8 KV cache without scales");
            const int lay = kv->int8_layout[s];
            if (lay < 0 || lay > 4 || hd > HD_MAX || ((lay == 1 || lay == 2 || lay == 4) && (hd & (hd - 1))) ||
                (lay == 4 && (kv_ec_group(nkv, hd) * hd < 16 || hd % 4)))
                return cu_fail(err, QF_ERR_DEVICE, "CUDA backend: int8 KV row layout %d with head_dim %d is not supported",
                               kv->int8_layout[s], hd);
            rb[s] = (size_t)hd;
        } else if (mode[s] == QF_KV_DICT) {
            if (!kv->atoms[s] || !kv->encode)
                return cu_fail(err, QF_ERR_ARG, "CUDA backend: dict KV cache without dictionaries");
            na[s] = kv->n_atoms[s], sp[s] = kv->sparsity[s], q8[s] = kv->coef_q8[s];
            rb[s] = kv->row_bytes[s];
            codes = wmax(codes, rb[s]);
        } else if (mode[s] == QF_KV_RQ) {
            for (int l = 0; l < L; l++) rb[s] = wmax(rb[s], kv->rq[s].row_bytes[l]);
        } else {
            rb[s] = kv_row_bytes(mode[s], hd);
        }
        if (!rb[s] || rb[s] != kv->row_bytes[s]) {
            rq_state_free(rq);
            return cu_fail(err, QF_ERR_DEVICE, "CUDA backend: KV cache type %s (head_dim %d) is not supported on the GPU",
                           cu_kv_mode_name(mode[s]), hd);
        }
        if (g->kv_rot && (mode[s] == QF_KV_INT8 || mode[s] == QF_KV_DICT))
            return cu_fail(err, QF_ERR_ARG, "CUDA backend: --kv-rot applies to f32/f16/q8_0/q4_0 caches, not to %s",
                           cu_kv_mode_name(mode[s]));
        lb[s] = rb[s] * (size_t)g->n_ctx * nkv;
        if (mode[s] == QF_KV_RQ) { /* rows of each layer's own width */
            CK(cudaMalloc((void **)&d[s], rq->loff[s][L]));
            for (int l = 0; l < L; l++) rq->lay[s][l].codes = rq->enc[s][l].dst = d[s] + rq->loff[s][l];
        } else
            CK(cudaMalloc((void **)&d[s], lb[s] * L));
        if (mode[s] == QF_KV_INT8 && kv->int8_layout[s] == 4 && kv_ec_index_per_pos(nkv, hd))
            CK(cudaMalloc((void **)&ix[s], (size_t)L * g->n_ctx * kv_ec_index_per_pos(nkv, hd) * 2));
        if (mode[s] == QF_KV_INT8) {
            CK(cudaMalloc((void **)&sc[s], (size_t)L * dkv * 4));
            CK(cudaMalloc((void **)&inv[s], (size_t)L * dkv * 4));
            CK(cudaMemcpy(sc[s], kv->int8_scale[s], (size_t)L * dkv * 4, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(inv[s], kv->int8_inv_scale[s], (size_t)L * dkv * 4, cudaMemcpyHostToDevice));
        }
        if (mode[s] == QF_KV_DICT) {
            const size_t per = (size_t)na[s] * hd, pg = (size_t)na[s] * na[s];
            CK(cudaMalloc((void **)&at[s], per * L * 4));
            for (int l = 0; l < L; l++)
                CK(cudaMemcpy(at[s] + per * l, kv->atoms[s][l], per * 4, cudaMemcpyHostToDevice));
            if (kv->gram[s]) { /* the device encoder's: the host's Gram matrices as they are */
                CK(cudaMalloc((void **)&gr[s], pg * L * 4));
                for (int l = 0; l < L; l++)
                    CK(cudaMemcpy(gr[s] + pg * l, kv->gram[s][l], pg * 4, cudaMemcpyHostToDevice));
            }
        }
        if (mode[s] == QF_KV_INT8 || mode[s] == QF_KV_DICT || mode[s] == QF_KV_RQ)
            CK(cudaMalloc((void **)&f32[s], (size_t)g->n_ctx * dkv * 4));
    }
    if (codes && !(hc = (uint8_t *)malloc(codes * nkv * (size_t)g->n_batch))) {
        st = cu_fail(err, QF_ERR_NOMEM, "out of memory");
        goto done;
    }
done:
    if (st) {
        for (int s = 0; s < 2; s++) {
            void *ps[] = {d[s], sc[s], inv[s], at[s], f32[s], gr[s], ix[s]};
            for (int i = 0; i < 7; i++)
                if (ps[i]) cudaFree(ps[i]);
        }
        free(hc);
        rq_state_free(rq);
        return st;
    }
    g->kv_bytes = 0;
    for (int s = 0; s < 2; s++) {
        void *ps[] = {g->kv[s], g->kv_scale[s], g->kv_inv[s], g->kv_atoms[s], g->kv_f32[s], g->kv_gram[s], g->kv_ecix[s]};
        for (int i = 0; i < 7; i++)
            if (ps[i]) cudaFree(ps[i]);
        g->kv_mode[s] = mode[s], g->kv_rb[s] = rb[s], g->kv_layer_bytes[s] = lb[s], g->kv[s] = d[s];
        g->kv_scale[s] = sc[s], g->kv_inv[s] = inv[s], g->kv_atoms[s] = at[s], g->kv_f32[s] = f32[s];
        g->kv_gram[s] = gr[s], g->kv_ecix[s] = ix[s];
        g->kv_na[s] = na[s], g->kv_s[s] = sp[s], g->kv_q8[s] = q8[s];
        g->kv_layout[s] = mode[s] == QF_KV_INT8 ? kv->int8_layout[s] : 0;
        g->kv_bytes += mode[s] == QF_KV_RQ ? rq->loff[s][L] : lb[s] * L;
        if (ix[s]) g->kv_bytes += (size_t)L * g->n_ctx * kv_ec_index_per_pos(nkv, hd) * 2; /* ec-rot's index */
    }
    rq_state_free(g->rq);
    g->rq = rq;
    free(g->h_codes);
    g->h_codes = hc;
    for (int b = 0; b < 2; b++)
        if (g->gexec[b]) { /* the graphs hold the old cache's addresses */
            cudaGraphExecDestroy(g->gexec[b]);
            g->gexec[b] = NULL;
        }
    g->encode = kv->encode, g->encode_user = kv->encode_user;
    g->kv_omp = kv->omp;
    return QF_OK;
}


static qf_status ctx_new(const qf_gpu_model *m, const qf_gpu_kv *kv, const qf_gpu_params *p, qf_cuda_ctx **out,
                         qf_error *err) {
    *out = NULL;
    if (!available())
        return cu_fail(err, QF_ERR_DEVICE, "--device cuda: no CUDA GPU is available (cudaGetDeviceCount found none)");
    if (p->device_index >= 0) { /* under mpirun one rank per GPU: local rank r drives device r % count (docs/mpi.md) */
        int count = 0;
        if (cudaGetDeviceCount(&count) == cudaSuccess && count > 0 && cudaSetDevice(p->device_index % count) != cudaSuccess)
            cudaGetLastError();
    }
    const qf_hparams *hp = m->hp;
    qf_status st = QF_OK;
    if (p->kv_rot == QF_KV_ROT_HADAMARD && (hp->head_dim & (hp->head_dim - 1)))
        return cu_fail(err, QF_ERR_ARG, "--kv-rot hadamard needs a power-of-two head_dim (this model: %d)", hp->head_dim);
    if (hp->head_dim > HD_MAX)
        return cu_fail(err, QF_ERR_DEVICE, "CUDA backend: head_dim %d exceeds %d", hp->head_dim, HD_MAX);
    if (hp->n_embd % 32 || (!hp->n_expert && hp->n_ff % 32) || (hp->n_head * hp->head_dim) % 32)
        return cu_fail(err, QF_ERR_DEVICE, "CUDA backend: n_embd %d, n_ff %d and n_head*head_dim must be multiples of 32",
                       hp->n_embd, hp->n_ff);
    qf_cuda_ctx *g = (qf_cuda_ctx *)calloc(1, sizeof *g);
    if (!g) return cu_fail(err, QF_ERR_NOMEM, "out of memory");
    g->n_layer = hp->n_layer;
    g->hp = *hp;
    g->n_ctx = p->n_ctx;
    g->n_batch = p->n_batch;
    g->gemm_f32 = p->knobs.gemm_f32;
    g->attn_warp = p->knobs.attn_warp;
    g->gu16 = p->knobs.gu16;
    g->f16_cache = !p->knobs.no_f16_cache;
    g->graph_off = p->knobs.no_graph;
    g->q4g = !p->knobs.no_q4_regroup;
    g->pdl = !p->knobs.no_pdl;
    g->i8_expand = p->knobs.i8_expand;
    g->norm_fold = !p->knobs.no_norm_fold;
    g->kv_rot = p->kv_rot == QF_KV_ROT_HADAMARD;
    g->fam = hp->qk_norm || hp->post_norms || hp->attn_softcap > 0 || hp->final_softcap > 0 || hp->swa != QF_SWA_NONE ||
             hp->ffn_act != QF_FFN_SILU || hp->embd_scale != 1.0f || hp->n_expert > 0 ||
             hp->rope_freq_base_swa != hp->rope_freq_base || hp->attn_scale != 1.0f / sqrtf((float)hp->head_dim);
    if (g->fam) g->graph_off = true;
    g->canon = p->canonical && !g->fam;
    g->moe_route = m->moe_route;
    if (hp->n_expert && !m->moe_route) {
        free(g);
        return cu_fail(err, QF_ERR_ARG, "CUDA backend: an MoE model without the host's routing function");
    }
    const int F0 = hp->n_ff > hp->n_ff_exp ? hp->n_ff : hp->n_ff_exp;
    const int D = hp->n_embd, F = F0 > hp->n_ff_shexp ? F0 : hp->n_ff_shexp, Dq = hp->n_head * hp->head_dim, Dkv = hp->n_head_kv * hp->head_dim,
              B = p->n_batch, half = hp->n_rot / 2;
    const size_t V = (size_t)hp->n_vocab;
    size_t max_w = 0; /* largest weight in elements */

    if (cublasCreate(&g->blas) != CUBLAS_STATUS_SUCCESS) {
        st = cu_fail(err, QF_ERR_DEVICE, "CUDA backend: cublasCreate failed");
        goto done;
    }
    g->layers = (dlayer *)calloc((size_t)hp->n_layer, sizeof(dlayer));
    if (!g->layers) {
        st = cu_fail(err, QF_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((st = upload_weight(g, m->tok_embd, "token_embd.weight", &g->tok_embd, err))) goto done;
    if (m->output->data == m->tok_embd->data) g->output = g->tok_embd;
    else if ((st = upload_weight(g, m->output, "output.weight", &g->output, err))) goto done;
    max_w = (size_t)g->output.ne0 * g->output.ne1;
    if ((st = upload_vec(g, m, m->output_norm, &g->output_norm, err))) goto done;
    for (int il = 0; il < hp->n_layer; il++) {
        const qf_layer_weights *L = &m->layers[il];
        dlayer *dl = &g->layers[il];
        struct { const qf_weight *w; dweight *d; const char *n; } ws[] = {
            {&L->wq, &dl->wq, "attn_q"}, {&L->wk, &dl->wk, "attn_k"}, {&L->wv, &dl->wv, "attn_v"},
            {&L->wo, &dl->wo, "attn_output"}, {&L->w_gate, &dl->wg, "ffn_gate"}, {&L->w_up, &dl->wu, "ffn_up"},
            {&L->w_down, &dl->wd, "ffn_down"}};
        char nm[7][96];
        const char *nmp[7];
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
            snprintf(nm[i], sizeof nm[i], "blk.%d.%s.weight", il, ws[i].n);
            nmp[i] = nm[i];
            max_w = wmax(max_w, (size_t)ws[i].w->ne0 * ws[i].w->ne1);
        }
        {
            const qf_weight *f3[3] = {&L->wq, &L->wk, &L->wv}, *f2[2] = {&L->w_gate, &L->w_up};
            dweight *p3[3] = {&dl->wq, &dl->wk, &dl->wv}, *p2[2] = {&dl->wg, &dl->wu};
            if ((st = upload_fused(g, f3, nmp, 3, p3, &dl->wqkv, err))) goto done;
            if ((st = upload_fused(g, f2, nmp + 4, 2, p2, &dl->wgu, err))) goto done;
        }
        for (int i = 3; i < 7; i += 3)
            if ((st = upload_weight(g, ws[i].w, nmp[i], ws[i].d, err))) goto done;
        if ((st = upload_vec(g, m, &L->attn_norm, &dl->attn_norm, err)) ||
            (st = upload_vec(g, m, &L->ffn_norm, &dl->ffn_norm, err)) || (st = upload_vec(g, m, &L->bq, &dl->bq, err)) ||
            (st = upload_vec(g, m, &L->bk, &dl->bk, err)) || (st = upload_vec(g, m, &L->bv, &dl->bv, err)) ||
            (st = upload_vec(g, m, &L->q_norm, &dl->q_norm, err)) || (st = upload_vec(g, m, &L->k_norm, &dl->k_norm, err)) ||
            (st = upload_vec(g, m, &L->post_attn_norm, &dl->post_attn_norm, err)) ||
            (st = upload_vec(g, m, &L->post_ffw_norm, &dl->post_ffw_norm, err)))
            goto done;
        dl->window = m->layer_window ? m->layer_window[il] : 0;
        if (L->exp_gate) { /* MoE: the router and the experts, each kind in one allocation */
            char nm2[96];
            snprintf(nm2, sizeof nm2, "blk.%d.ffn_gate_inp.weight", il);
            if ((st = upload_weight(g, &L->gate_inp, nm2, &dl->gate_inp, err))) goto done;
            const int E = hp->n_expert;
            dl->eg = (dweight *)calloc((size_t)E, sizeof(dweight));
            dl->eu = (dweight *)calloc((size_t)E, sizeof(dweight));
            dl->ed = (dweight *)calloc((size_t)E, sizeof(dweight));
            if (!dl->eg || !dl->eu || !dl->ed) {
                st = cu_fail(err, QF_ERR_NOMEM, "out of memory");
                goto done;
            }
            const qf_weight *hx[3] = {L->exp_gate, L->exp_up, L->exp_down};
            dweight *dx[3] = {dl->eg, dl->eu, dl->ed};
            static const char *const kn[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
            for (int k = 0; k < 3; k++) {
                const qf_weight *w0 = &hx[k][0];
                if (!gpu_type_ok(w0->type) || (w0->ne0 % 32 && w0->type != QF_TYPE_F32)) {
                    st = cu_fail(err, QF_ERR_DEVICE, "CUDA backend: tensor blk.%d.%s.weight has type %s, which the GPU path "
                                 "does not run", il, kn[k], cu_type_name(w0->type));
                    goto done;
                }
                const size_t eb = w0->row_bytes * (size_t)w0->ne1;
                CK(cudaMalloc((void **)&dl->exp_buf[k], eb * E));
                g->weight_bytes += eb * E;
                for (int x = 0; x < E; x++) {
                    const qf_weight *w = &hx[k][x];
                    dweight *d = &dx[k][x];
                    d->type = w->type, d->ne0 = w->ne0, d->ne1 = w->ne1, d->row_bytes = w->row_bytes, d->view = true;
                    d->d = dl->exp_buf[k] + eb * x;
                    CK(cudaMemcpy(d->d, w->data, eb, cudaMemcpyHostToDevice));
                    max_w = wmax(max_w, (size_t)w->ne0 * w->ne1);
                }
            }
            max_w = wmax(max_w, (size_t)L->gate_inp.ne0 * L->gate_inp.ne1);
            const qf_weight *sw[4] = {&L->gate_inp_shexp, &L->w_gate_shexp, &L->w_up_shexp, &L->w_down_shexp};
            dweight *sd[4] = {&dl->sh_inp, &dl->sh_g, &dl->sh_u, &dl->sh_d};
            static const char *const sn[4] = {"ffn_gate_inp_shexp", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"};
            for (int k = 0; k < 4; k++) {
                snprintf(nm2, sizeof nm2, "blk.%d.%s.weight", il, sn[k]);
                if ((st = upload_weight(g, sw[k], nm2, sd[k], err))) goto done;
                max_w = wmax(max_w, (size_t)sw[k]->ne0 * sw[k]->ne1);
            }
        }
    }
    /* KV cache, in the modes of the host's cache */
    g->nkv = hp->n_head_kv, g->hd = hp->head_dim;
    if ((st = set_kv(g, kv, err))) goto done;
    /* scratch */
    {
        size_t maxK = wmax(wmax((size_t)D, (size_t)F), (size_t)Dq);
        size_t sc = 0;
        CK(cudaMalloc((void **)&g->x, (size_t)B * D * 4)); sc += (size_t)B * D * 4;
        CK(cudaMalloc((void **)&g->xn, (size_t)B * maxK * 4)); sc += (size_t)B * maxK * 4;
        CK(cudaMalloc((void **)&g->q, (size_t)B * Dq * 4)); sc += (size_t)B * Dq * 4;
        CK(cudaMalloc((void **)&g->k, (size_t)B * Dkv * 4)); sc += (size_t)B * Dkv * 4;
        CK(cudaMalloc((void **)&g->v, (size_t)B * Dkv * 4)); sc += (size_t)B * Dkv * 4;
        CK(cudaMalloc((void **)&g->att, (size_t)B * Dq * 4)); sc += (size_t)B * Dq * 4;
        CK(cudaMalloc((void **)&g->hb, (size_t)B * F * 4)); sc += (size_t)B * F * 4;
        CK(cudaMalloc((void **)&g->hb2, (size_t)B * F * 4)); sc += (size_t)B * F * 4;
        CK(cudaMalloc((void **)&g->qkv, (size_t)B * (Dq + 2 * Dkv) * 4)); sc += (size_t)B * (Dq + 2 * Dkv) * 4;
        CK(cudaMalloc((void **)&g->gu, (size_t)B * 2 * F * 4)); sc += (size_t)B * 2 * F * 4;
        {
            const size_t pf = attention_split_floats(B < MATVEC_MAX ? B : MATVEC_MAX, hp->n_head, hp->head_dim);
            CK(cudaMalloc((void **)&g->part, pf * 4)); sc += pf * 4;
        }
        CK(cudaMalloc((void **)&g->logits, (size_t)B * V * 4)); sc += (size_t)B * V * 4;
        CK(cudaMalloc((void **)&g->rcos, (size_t)B * half * 4 + 4));
        CK(cudaMalloc((void **)&g->rsin, (size_t)B * half * 4 + 4));
        CK(cudaMalloc((void **)&g->xh, (size_t)B * maxK * 2)); sc += (size_t)B * maxK * 2;
        CK(cudaMalloc((void **)&g->xl, (size_t)B * D * 2)); sc += (size_t)B * D * 2;
        CK(cudaMalloc(&g->xq2, ACT_Q_BYTES(1, D))); sc += ACT_Q_BYTES(1, D);
        CK(cudaMalloc((void **)&g->nss, (size_t)NF_REP * (D / 32) * 4 + 4)); sc += (size_t)NF_REP * (D / 32) * 4 + 4;
        CK(cudaMalloc((void **)&g->tok, (size_t)B * 4));
        if (cudaMallocHost((void **)&g->h_lg, (size_t)V * 4) != cudaSuccess) {
            cudaGetLastError();
            g->h_lg = NULL;
        } else
            for (int c = 0; c < LG_CHUNKS; c++) CK(cudaEventCreateWithFlags(&g->lg_ev[c], cudaEventDisableTiming));
        if (hp->rope_freq_base_swa != hp->rope_freq_base) { /* gemma3: the local layers' RoPE base */
            CK(cudaMalloc((void **)&g->rcos_swa, (size_t)B * half * 4 + 4));
            CK(cudaMalloc((void **)&g->rsin_swa, (size_t)B * half * 4 + 4));
            g->h_cos2 = (float *)malloc((size_t)B * half * 4 + 4);
            g->h_sin2 = (float *)malloc((size_t)B * half * 4 + 4);
            if (!g->h_cos2 || !g->h_sin2) {
                st = cu_fail(err, QF_ERR_NOMEM, "out of memory");
                goto done;
            }
        }
        if (hp->n_expert) {
            const size_t E = (size_t)hp->n_expert, K = (size_t)hp->n_expert_used;
            CK(cudaMalloc((void **)&g->moe_logits, (size_t)B * E * 4)); sc += (size_t)B * E * 4;
            CK(cudaMalloc((void **)&g->moe_x, (size_t)B * D * 4)); sc += (size_t)B * D * 4;
            CK(cudaMalloc((void **)&g->moe_y, (size_t)B * D * 4)); sc += (size_t)B * D * 4;
            CK(cudaMalloc((void **)&g->moe_acc, (size_t)B * D * 4)); sc += (size_t)B * D * 4;
            CK(cudaMalloc((void **)&g->moe_rw, (size_t)B * K * 4)); sc += (size_t)B * K * 4;
            CK(cudaMalloc((void **)&g->moe_rows, (size_t)B * K * 4)); sc += (size_t)B * K * 4;
            g->h_moe_logits = (float *)malloc((size_t)B * E * 4);
            g->h_moe_w = (float *)malloc((size_t)B * K * 4);
            g->h_moe_rw = (float *)malloc((size_t)B * K * 4);
            g->h_moe_ids = (int *)malloc((size_t)B * K * 4);
            g->h_moe_rows = (int *)malloc((size_t)B * K * 4);
            if (!g->h_moe_logits || !g->h_moe_w || !g->h_moe_rw || !g->h_moe_ids || !g->h_moe_rows) {
                st = cu_fail(err, QF_ERR_NOMEM, "out of memory");
                goto done;
            }
        }
        CK(cudaMalloc((void **)&g->dstep, (size_t)(2 * half + 2) * 4));
        {
            float steps[KV_STEPS_N];
            kv_tok_steps(steps);
            CK(cudaMalloc((void **)&g->tok_step, sizeof steps));
            CK(cudaMemcpy(g->tok_step, steps, sizeof steps, cudaMemcpyHostToDevice));
        }
        CK(cudaMallocHost((void **)&g->h_step, (size_t)(2 * half + 2) * 4));
        CK(cudaStreamCreate(&g->stream));
        CK(cudaMalloc((void **)&g->tgt, (size_t)B * 4));
        CK(cudaMalloc((void **)&g->nll, (size_t)B * 8));
        /* pinned staging for logits copies of more than one row: 2 x 16 MiB */
        if (B > 1 && cudaMallocHost((void **)&g->h_pin, (size_t)32 << 20) == cudaSuccess) {
            g->pin_bytes = (size_t)32 << 20;
            CK(cudaEventCreateWithFlags(&g->pin_ev[0], cudaEventDisableTiming));
            CK(cudaEventCreateWithFlags(&g->pin_ev[1], cudaEventDisableTiming));
        } else {
            cudaGetLastError();
            g->h_pin = NULL;
        }
        if (g->canon) {
            const size_t ns = (size_t)hp->n_head * B * g->n_ctx * 4;
            CK(cudaMalloc((void **)&g->cs, ns)); sc += ns;
        }
        g->wdeq_bytes = max_w * (g->gemm_f32 ? 4 : 2);
        CK(cudaMalloc(&g->wdeq, g->wdeq_bytes)); sc += g->wdeq_bytes;
        g->scratch_bytes = sc;
        g->h_cos = (float *)malloc((size_t)B * half * 4 + 4);
        g->h_sin = (float *)malloc((size_t)B * half * 4 + 4);
        g->h_k = (float *)malloc((size_t)B * Dkv * 4);
        g->h_v = (float *)malloc((size_t)B * Dkv * 4);
        g->h_act = (float *)malloc((size_t)B * maxK * 4);
        g->h_kpre = (float *)malloc((size_t)B * Dkv * 4);
        if (!g->h_cos || !g->h_sin || !g->h_k || !g->h_v || !g->h_act || !g->h_kpre) {
            st = cu_fail(err, QF_ERR_NOMEM, "out of memory");
            goto done;
        }
    }
    if (p->knobs.profile) {
        g->ev = (cudaEvent_t *)calloc(PROF_MAX_EV, sizeof(cudaEvent_t));
        g->ev_cat = (int *)calloc(PROF_MAX_EV, sizeof(int));
        if (!g->ev || !g->ev_cat) {
            st = cu_fail(err, QF_ERR_NOMEM, "out of memory");
            goto done;
        }
        for (int i = 0; i < PROF_MAX_EV; i++) CK(cudaEventCreate(&g->ev[i]));
    }
    if (m->rope_freqs && m->rope_freqs->data) {
        g->rope_ff = (float *)malloc((size_t)half * 4);
        if (!g->rope_ff) {
            st = cu_fail(err, QF_ERR_NOMEM, "out of memory");
            goto done;
        }
        m->dequant_row(m->rope_freqs->type, m->rope_freqs->data, g->rope_ff, half);
    }
done:
    if (st) {
        if (st == QF_ERR_DEVICE && strstr(err ? err->msg : "", "out of memory"))
            cu_prefix(err, "uploading %s (%.2f GiB of weights so far): ", m->path, g->weight_bytes / 1073741824.0);
        ctx_free(g);
        return st;
    }
    *out = g;
    return QF_OK;
}

static void ctx_info(const qf_cuda_ctx *g, qf_cuda_info *out) {
    out->weight_bytes = g->weight_bytes;
    out->kv_bytes = g->kv_bytes;
    out->scratch_bytes = g->scratch_bytes;
    out->f16_cache_bytes = g->f16_cache_bytes;
    out->graph_steps = g->graph_steps;
    out->graph_nodes = g->graph_nodes;
}

/* which activation w's decode matvec reads (launch_matvec's xq): ACT_Q8_0 (Q4_0, Q8_0: the
 * norm before it can write it, launch_rmsnorm's xq), ACT_Q8_K (the K formats: launch_quant_act_k)
 * or ACT_NONE (f32 x) */
enum { ACT_NONE = 0, ACT_Q8_0 = 1, ACT_Q8_K = 2 };
static int act_kind(const dweight *w) {
    if (w->type == QF_TYPE_Q4_0 || w->type == QF_TYPE_Q8_0) return ACT_Q8_0;
    if (w->type == QF_TYPE_Q4_K || w->type == QF_TYPE_Q5_K || w->type == QF_TYPE_Q6_K) return ACT_Q8_K;
    return ACT_NONE;
}
static bool q8_act(const dweight *w) { return act_kind(w) == ACT_Q8_0; }

/* can w run dev_gemm_h: f16 or cached-f16 weights, or a per-call dequantization that fits wdeq */

static bool gemm_h_ok(const qf_cuda_ctx *g, const dweight *w) {
    return w->d && w->type != QF_TYPE_F32 &&
           (w->h16 || w->type == QF_TYPE_F16 || (size_t)w->ne0 * w->ne1 * 2 <= g->wdeq_bytes);
}

/* stream s's int8 buffers for a write of n tokens from src at pos0 (at *dpos under graph replay:
 * then dst and ix are the layer's position 0) and the expansion of layer il into kv_f32[s] */
static kv8_io int8_io(const qf_cuda_ctx *g, int s, int il, float *src, int pos0, const int *dpos) {
    const int hd = g->hd, nkv = g->nkv, dkv = nkv * hd;
    const size_t tok = (size_t)nkv * g->kv_rb[s], ipp = kv_ec_index_per_pos(nkv, hd); /* bytes, index entries a position */
    uint8_t *C = g->kv[s] + g->kv_layer_bytes[s] * il;
    uint16_t *ix = g->kv_ecix[s] ? g->kv_ecix[s] + (size_t)il * g->n_ctx * ipp : NULL; /* the layer's, position 0 */
    kv8_io io = {};
    io.src = src, io.dst = (int8_t *)(dpos ? C : C + (size_t)pos0 * tok), io.codes = (const int8_t *)C;
    io.ix = ix && !dpos ? ix + (size_t)pos0 * ipp : ix, io.eix = ix;
    io.inv = g->kv_inv[s] + (size_t)il * dkv, io.scale = g->kv_scale[s] + (size_t)il * dkv, io.out = g->kv_f32[s];
    return io;
}

/* Decode over int8 K and V in one row layout (int8_pair): both streams' writes in one launch and
 * both expansions (f16 rows, in their stored basis) in another, the rotated layouts' q, K and V
 * rows rotated first in one more; kv_store's views. */
static bool int8_pair(const qf_cuda_ctx *g) {
    return g->kv_mode[0] == QF_KV_INT8 && g->kv_mode[1] == QF_KV_INT8 && g->kv_layout[0] == g->kv_layout[1];
}
static void int8_store_pair(qf_cuda_ctx *g, int il, int n, int pos0, const int *dpos, cudaStream_t S,
                            const uint8_t *view[2], qf_kv_mode vmode[2], size_t vrb[2], bool inplace) {
    const int hd = g->hd, nkv = g->nkv, lay = g->kv_layout[0];
    kv8_io io[2] = {int8_io(g, 0, il, g->k, pos0, dpos), int8_io(g, 1, il, g->v, pos0, dpos)};
    if (kv_int8_rotated(lay)) {
        float *x[3] = {g->q, g->k, g->v};
        const int64_t rows[3] = {(int64_t)n * g->hp.n_head, (int64_t)n * nkv, (int64_t)n * nkv};
        launch_hadamard_n(x, rows, 3, hd, S);
    }
    launch_kv_int8_write(lay, io, 2, n, nkv, hd, g->tok_step, S, dpos, (size_t)nkv * g->kv_rb[0], false);
    if (inplace) { /* split-K reads the cache itself (attn_i8) */
        for (int s = 0; s < 2; s++)
            view[s] = g->kv[s] + g->kv_layer_bytes[s] * il, vmode[s] = QF_KV_INT8, vrb[s] = g->kv_rb[s];
        return;
    }
    launch_kv_int8_expand(lay, io, 2, dpos ? g->n_ctx : pos0 + n, nkv, hd, g->tok_step, S, dpos, false, true);
    for (int s = 0; s < 2; s++) view[s] = (const uint8_t *)g->kv_f32[s], vmode[s] = QF_KV_F16, vrb[s] = (size_t)hd * 2;
}

/* Decode over int8 K and V read in place by split-K (attention_split_i8_ok): layer il's view
 * of both streams in *a; false where the shape or the knob (i8_expand) keeps the expansion */
static bool int8_inplace(const qf_cuda_ctx *g, int il, attn_i8 *a) {
    if (g->i8_expand || g->kv_mode[0] != QF_KV_INT8 || g->kv_mode[1] != QF_KV_INT8) return false;
    const int hd = g->hd, nkv = g->nkv;
    const size_t dkv = (size_t)nkv * hd, ipp = kv_ec_index_per_pos(nkv, hd);
    *a = attn_i8{};
    a->steps = g->tok_step, a->ec_n = kv_ec_group(nkv, hd) * hd;
    for (int s = 0; s < 2; s++) {
        a->lay[s] = g->kv_layout[s];
        a->scale[s] = g->kv_scale[s] ? g->kv_scale[s] + il * dkv : NULL;
        a->ix[s] = g->kv_ecix[s] ? g->kv_ecix[s] + (size_t)il * g->n_ctx * ipp : NULL;
        if (g->kv_rb[s] != (size_t)hd || (size_t)g->kv_layer_bytes[s] % 16) return false;
    }
    return attention_split_i8_ok(g->hp.n_head, nkv, hd, g->n_ctx, a);
}

/* Store n tokens of stream s (src [n][n_head_kv][head_dim] f32 on the device) at pos0 in
 * layer il's cache, and say how attention reads the layer: the cache itself (f32, f16, q8_0,
 * q4_0), or, for int8 and dict, positions [0, pos0 + n) expanded to f32 in g->kv_f32[s].
 * dict rows are OMP-encoded on the device (launch_kv_dict_encode: the host encoder's bytes for
 * the same vectors), or where its scratch does not fit by the host cache's own encoder
 * (g->encode, codes uploaded); then decoded on the device. With --kv-rot the rows are rotated
 * first (src is scratch: rotated in place). in_basis (int8, decode): the expansion is f16 rows
 * (*vmode F16), the rotated layouts' as stored (H k, H v; the caller rotates q and the output),
 * and dpos (graph replay, one token) is honoured: the row goes to *dpos and [0, *dpos + 1) is
 * expanded.
 * Without it (prefill, the canonical route) rows are rotated back and dpos must be NULL for int8.
 * inplace (int8, with in_basis: int8_inplace): the row is only written; *view is the cache. */
static qf_status kv_store(qf_cuda_ctx *g, int s, int il, float *src, int n, int pos0, const int *dpos, cudaStream_t S,
                          bool in_basis, bool inplace, const uint8_t **view, qf_kv_mode *vmode, size_t *vrb,
                          qf_error *err) {
    qf_status st = QF_OK;
    const int hd = g->hd, nkv = g->nkv;
    const qf_kv_mode mode = g->kv_mode[s];
    const size_t rb = g->kv_rb[s];
    uint8_t *C = g->kv[s] + g->kv_layer_bytes[s] * il;
    const int64_t rows = (int64_t)n * nkv, all = (int64_t)(pos0 + n) * nkv;
    *view = C, *vmode = mode, *vrb = rb;
    if (mode == QF_KV_INT8) {
        const kv8_io io = int8_io(g, s, il, src, pos0, dpos);
        launch_kv_int8_write(g->kv_layout[s], &io, 1, n, nkv, hd, g->tok_step, S, dpos, (size_t)nkv * rb, true);
        if (inplace) return QF_OK; /* split-K reads the cache itself (attn_i8): *view is C */
        launch_kv_int8_expand(g->kv_layout[s], &io, 1, dpos ? g->n_ctx : pos0 + n, nkv, hd, g->tok_step, S, dpos,
                              !in_basis, in_basis);
        if (in_basis) { /* decode: f16 rows in kv_f32's memory, for the vectorized split-K kernel */
            *view = (const uint8_t *)g->kv_f32[s], *vmode = QF_KV_F16, *vrb = (size_t)hd * 2;
            return QF_OK;
        }
    } else if (mode == QF_KV_DICT) {
        const int na = g->kv_na[s];
        if (!g->kv_gram[s] || !launch_kv_dict_encode(src, rows, hd, g->kv_atoms[s] + (size_t)il * na * hd,
                                                     g->kv_gram[s] + (size_t)il * na * na, na, g->kv_s[s],
                                                     g->kv_q8[s], rb, C + (size_t)pos0 * nkv * rb, g->kv_omp, 0)) {
            float *h = s ? g->h_v : g->h_k;
            CK(cudaMemcpy(h, src, (size_t)rows * hd * 4, cudaMemcpyDeviceToHost));
            g->encode(g->encode_user, s, il, h, rows, g->h_codes);
            CK(cudaMemcpy(C + (size_t)pos0 * nkv * rb, g->h_codes, (size_t)rows * rb, cudaMemcpyHostToDevice));
        }
        launch_kv_expand_dict(C, all, hd, rb, g->kv_atoms[s] + (size_t)il * g->kv_na[s] * hd, g->kv_na[s], g->kv_s[s],
                              g->kv_q8[s], g->kv_f32[s], 0);
    } else {
        if (g->kv_rot) launch_hadamard(src, rows, hd, S);
        /* dpos (graph replay): the row offset is read on the device */
        launch_kv_write(mode, src, rows, hd, rb, dpos ? C : C + (size_t)pos0 * nkv * rb, S, dpos, (size_t)nkv * rb);
        return QF_OK;
    }
    *view = (const uint8_t *)g->kv_f32[s], *vmode = QF_KV_F32, *vrb = (size_t)hd * 4;
done:
    return st;
}

/* Store a batch's K and V rows in layer il's kv-rq cache and expand the layer for attention,
 * all on the device: K (r->kpre, the rows before RoPE, when the artifact stores them so) is
 * encoded (k_kv_rq_encode: the host encoder's bytes) and positions [0, pos0 + n) decoded into
 * g->kv_f32[0] (format-3 rows by GEMMs, the batch's own rows by the host's decoder); V minus
 * its prediction from the batch's decoded K rows is encoded, and V decoded with the prediction
 * added back (one GEMM); then K is rotated when it is stored before RoPE. The batch's sink
 * positions go to the sink store. */
/* encode_only (the canonical route, which expands [0, T) itself the host's way): encode the
 * batch's rows and decode only the batch's own K rows the V encoder reads; no GEMM decode of
 * [0, T), no V prediction, no RoPE of the expansion */
static qf_status rq_store(qf_cuda_ctx *g, int il, int n, int pos0, cudaStream_t S, qf_error *err,
                          bool encode_only = false) {
    struct rq_state *r = g->rq;
    qf_status st = QF_OK;
    const int hd = g->hd, nkv = g->nkv, dkv = nkv * hd, T = pos0 + n;
    for (int s = 0; s < 2; s++) {
        rq_enc_dev e = r->enc[s][il];
        rq_layer_dev a = r->lay[s][il];
        e.dst += (size_t)pos0 * nkv * e.rb;
        const float *src = s ? g->v : r->k_prerope ? r->kpre : g->k;
        if (s == 1 && a.predT) { /* V minus its prediction from this token's stored K (decoded above) */
            launch_kv_rq_vres(g->v, g->kv_f32[0] + (size_t)pos0 * dkv, a.predT, n, dkv, r->vres, S);
            src = r->vres;
        }
        launch_kv_rq_encode(&e, src, (int64_t)n * nkv, nkv, hd, S);
        /* positions [0, T) for attention: format-3 rows by GEMMs over their coefficients (the
         * same sums as the host's row decoder in another order), V's prediction by one GEMM
         * over the decoded pre-RoPE K (not one HD x HD product per position) */
        const float one = 1.0f;
        rq_layer_dev b = a;
        b.predT = NULL;
        if (encode_only) {
            if (s == 0) { /* the batch's own K rows as the host decodes them: V's encoder reads them */
                b.codes += (size_t)pos0 * nkv * b.rb;
                launch_kv_rq_expand(&b, n, nkv, hd, g->kv_f32[0] + (size_t)pos0 * dkv, S);
            }
            continue;
        }
        if (a.decT && a.bits != 16) {
            launch_kv_rq_coef3(&b, T, nkv, hd, r->coef, g->kv_f32[s], S);
            CKB(cublasSgemmStridedBatched(g->blas, CUBLAS_OP_N, CUBLAS_OP_N, hd, T, hd, &one, a.decT, hd,
                                          (long long)hd * hd, r->coef, dkv, hd, &one, g->kv_f32[s], dkv, hd, nkv));
            if (s == 0) { /* the batch's own K rows as the host decodes them: V's encoder reads them */
                b.codes += (size_t)pos0 * nkv * b.rb;
                launch_kv_rq_expand(&b, n, nkv, hd, g->kv_f32[0] + (size_t)pos0 * dkv, S);
            }
        } else {
            launch_kv_rq_expand(&b, T, nkv, hd, g->kv_f32[s], S);
        }
        if (a.predT) /* V[p] += P khat[p]: (col-major) V^T += P K^T, predT's col-major view being P */
            CKB(cublasSgemm(g->blas, CUBLAS_OP_N, CUBLAS_OP_N, dkv, T, dkv, &one, a.predT, dkv, g->kv_f32[0], dkv, &one,
                            g->kv_f32[1], dkv));
    }
    if (r->k_prerope && !encode_only)
        launch_rope(g->kv_f32[0], T, nkv, hd, g->hp.n_rot / 2, g->hp.rope_type == QF_ROPE_NEOX, r->kr_cos, r->kr_sin, S);
    if (r->n_sink)
        for (int s = 0; s < 2; s++)
            launch_kv_sink_write(r->sink[s] + (size_t)il * r->n_sink * dkv, s ? g->v : g->k, pos0, n, r->n_sink, dkv, S);
done:
    return st;
}

/* Attention of a batch over layer il's expanded kv-rq rows (rq_store), with forward.c's
 * per-(query, key) choice between the exact and the stored rows: one query takes the split-K
 * kernel on the stored rows with its exact ones written over them; more queries take the warp
 * kernel over both views. Then the batch's last rows enter the window ring. */
static void rq_attention(qf_cuda_ctx *g, int il, int n, int pos0, bool split, cudaStream_t S) {
    struct rq_state *r = g->rq;
    const qf_hparams *hp = &g->hp;
    const int hd = g->hd, nkv = g->nkv, dkv = nkv * hd;
    const size_t rb = (size_t)hd * 4;
    const uint8_t *K = (const uint8_t *)g->kv_f32[0], *V = (const uint8_t *)g->kv_f32[1];
    const bool ex = r->n_sink || r->n_window;
    const uint16_t *sink[2], *win[2];
    const int *wpos = r->n_window ? r->win_pos + (size_t)il * r->n_window : NULL;
    for (int s = 0; s < 2; s++) {
        sink[s] = r->n_sink ? r->sink[s] + (size_t)il * r->n_sink * dkv : NULL;
        win[s] = r->n_window ? r->win[s] + (size_t)il * r->n_window * dkv : NULL;
    }
    const float *fresh[2] = {g->k, g->v};
    if (split && (!ex || n == 1)) {
        for (int s = 0; s < 2 && ex; s++)
            launch_kv_exact_gather(g->kv_f32[s], g->kv_f32[s], fresh[s], sink[s], win[s], wpos, r->n_sink, r->n_window,
                                   pos0, n, dkv, S);
        launch_attention_split(QF_KV_F32, QF_KV_F32, g->q, K, V, rb, rb, n, pos0, hp->n_head, nkv, hd, g->att, g->part,
                               S, NULL, g->n_ctx, false);
    } else if (ex) {
        for (int s = 0; s < 2; s++)
            launch_kv_exact_gather(r->ex[s], g->kv_f32[s], fresh[s], sink[s], win[s], wpos, r->n_sink, r->n_window, pos0,
                                   n, dkv, S);
        if (n > MATVEC_MAX && r->fpart && !g->attn_warp && flash_ok(QF_KV_F32, QF_KV_F32, hd)) /* prefill */
            launch_attention_exact_flash(g->q, g->kv_f32[0], g->kv_f32[1], r->ex[0], r->ex[1], n, pos0, hp->n_head, nkv,
                                         hd, r->n_sink, r->n_window, r->fpart, g->att, S);
        else
            launch_attention_exact(g->q, g->kv_f32[0], g->kv_f32[1], r->ex[0], r->ex[1], n, pos0, hp->n_head, nkv, hd,
                                   r->n_sink, r->n_window, g->att, S);
    } else {
        const bool fl = n > MATVEC_MAX && !g->attn_warp && flash_ok(QF_KV_F32, QF_KV_F32, hd);
        launch_attention(QF_KV_F32, QF_KV_F32, g->q, K, V, rb, rb, n, pos0, hp->n_head, nkv, hd, g->att, fl, NULL, NULL,
                         S);
    }
    if (r->n_window)
        for (int s = 0; s < 2; s++)
            launch_kv_window_push(r->win[s] + (size_t)il * r->n_window * dkv, r->win_pos + (size_t)il * r->n_window,
                                  fresh[s], pos0, n, r->n_window, dkv, S);
}

/* ---------------------------------------------------------------------------------------- */
/* the forward pass                                                                          */

/* f16 cache: on the first prefill GEMM of a quantized weight, dequantize it once into a
 * persistent f16 matrix (the same k_dequant as the per-call route, so the GEMM sees identical
 * values) while at least 2 GiB of device memory stay free; otherwise keep dequantizing per call. */
static void ensure_h16(qf_cuda_ctx *g, dweight *w, int n) {
    if (!g->f16_cache || g->gemm_f32 || n <= MATVEC_MAX || w->h16 || w->view || !w->d || w->type == QF_TYPE_F16 ||
        w->type == QF_TYPE_F32)
        return;
    const size_t bytes = (size_t)w->ne0 * w->ne1 * 2;
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess || fr < bytes + ((size_t)2 << 30)) {
        g->f16_cache = false;
        return;
    }
    if (cudaMalloc((void **)&w->h16, bytes) != cudaSuccess) {
        cudaGetLastError();
        w->h16 = NULL;
        g->f16_cache = false;
        return;
    }
    launch_dequant(w, w->h16, false, 0);
    g->f16_cache_bytes += bytes;
}

/* the same for a fused weight; its parts then read their rows of the fused f16 copy */
static void ensure_h16_fused(qf_cuda_ctx *g, dweight *f, dweight *const *parts, int cnt, int n) {
    if (!f->d) return;
    ensure_h16(g, f, n);
    if (!f->h16 || parts[0]->h16) return;
    int64_t rows = 0;
    for (int i = 0; i < cnt; i++) {
        parts[i]->h16 = f->h16 + (size_t)rows * f->ne0;
        rows += parts[i]->ne1;
    }
}

/* copy a device activation to the host and hand it to the tap */
static qf_status tap_act(qf_cuda_ctx *g, const qf_tap *tap, int il, qf_act_site site, int n, int dim, const float *d,
                         qf_error *err) {
    qf_status st = QF_OK;
    if (!tap || !tap->on_act) return QF_OK;
    CK(cudaMemcpy(g->h_act, d, (size_t)n * dim * 4, cudaMemcpyDeviceToHost));
    tap->on_act(tap->user, il, site, n, dim, g->h_act);
done:
    return st;
}

/* the taps between RoPE and the cache, in forward.c's order: q after RoPE, K before it (already
 * in g->h_kpre), then (tap_kv) K after it and V */
static qf_status tap_q_kpre(qf_cuda_ctx *g, const qf_tap *tap, int il, int pos0, int n, qf_error *err) {
    qf_status st = QF_OK;
    const qf_hparams *hp = &g->hp;
    if (tap && tap->on_q) {
        CK(cudaMemcpy(g->h_act, g->q, (size_t)n * hp->n_head * hp->head_dim * 4, cudaMemcpyDeviceToHost));
        tap->on_q(tap->user, il, pos0, n, hp->n_head, hp->head_dim, g->h_act);
    }
    if (tap && tap->on_k_prerope) tap->on_k_prerope(tap->user, il, pos0, n, g->nkv, g->hd, g->h_kpre);
done:
    return st;
}
static qf_status tap_kv(qf_cuda_ctx *g, const qf_tap *tap, int il, int pos0, int n, qf_error *err) {
    qf_status st = QF_OK;
    const size_t bytes = (size_t)n * g->nkv * g->hd * 4;
    if (!tap || !tap->on_kv) return QF_OK;
    CK(cudaMemcpy(g->h_k, g->k, bytes, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(g->h_v, g->v, bytes, cudaMemcpyDeviceToHost));
    tap->on_kv(tap->user, il, pos0, n, g->nkv, g->hd, g->h_k, g->h_v);
done:
    return st;
}

/* bytes of device memory src -> pageable host memory dst through pinned staging: ns slots of
 * slot bytes at pin, one event each (ev), copies on stream s. Every slot is primed with the next
 * piece; then, slot after slot in ring order, the host copies a piece out as soon as its event
 * fires and the slot takes the next piece, so the host copy of one piece overlaps the device
 * copies of the others. ns <= STAGE_MAX. Returns the first CUDA error (dst then incomplete). */
#define STAGE_MAX 8
static_assert(LG_CHUNKS <= STAGE_MAX, "forward_graph's logits copy: one slot a chunk");
static cudaError_t copy_staged(void *dst, const void *src, size_t bytes, uint8_t *pin, size_t slot, cudaEvent_t *ev,
                               int ns, cudaStream_t s) {
    uint8_t *d = (uint8_t *)dst;
    const uint8_t *sp = (const uint8_t *)src;
    size_t off[STAGE_MAX] = {0}, len[STAGE_MAX] = {0}, next = 0;
    cudaError_t e = cudaSuccess;
    auto issue = [&](int k) { /* slot k takes the next piece, if any */
        off[k] = next, len[k] = bytes - next < slot ? bytes - next : slot;
        next += len[k];
        if (!len[k]) return cudaSuccess;
        cudaError_t r = cudaMemcpyAsync(pin + k * slot, sp + off[k], len[k], cudaMemcpyDeviceToHost, s);
        return r ? r : cudaEventRecord(ev[k], s);
    };
    for (int k = 0; k < ns; k++)
        if ((e = issue(k))) return e;
    for (int b = 0; len[b]; b = (b + 1) % ns) {
        if ((e = cudaEventSynchronize(ev[b]))) return e;
        memcpy(d + off[b], pin + b * slot, len[b]);
        if ((e = issue(b))) return e;
    }
    return cudaSuccess;
}

/* device logits -> pageable host memory through the pinned staging buffer (two halves, the
 * legacy stream); small copies and contexts without the buffer copy directly */
static cudaError_t copy_logits(qf_cuda_ctx *g, float *dst, const float *src, size_t bytes) {
    if (!g->h_pin || bytes <= ((size_t)1 << 20)) return cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
    return copy_staged(dst, src, bytes, (uint8_t *)g->h_pin, g->pin_bytes / 2, g->pin_ev, 2, 0);
}

/* The mixture-of-experts FFN of layer L (mixtral, qwen3moe) on g->xn [n][n_embd] (the ffn_norm
 * output), result in g->xn; forward.c's moe_ffn on the device. The router logits are read back
 * and routed on the host by the CPU's own qf_moe_route (g->moe_route: softmax, top-k, renormalized
 * weights), so the GPU picks the experts by the CPU's rule; then each expert with tokens runs as
 * one batch of its gathered rows (gate, up, act * up, down: a GEMM per expert in prefill, the
 * matvec in decode) and its output is added into the sum with the token's weight, experts in
 * index order as on the CPU; then qwen2moe's shared expert on every token, gated by a sigmoid. Cost: one device-to-host copy of n x n_expert floats and a
 * synchronization per layer (no CUDA graph), and up to n_expert launches of 5 kernels each. */
static qf_status moe_ffn(qf_cuda_ctx *g, const dlayer *L, int n, cudaStream_t S, qf_error *err) {
    const qf_hparams *hp = &g->hp;
    const int D = hp->n_embd, E = hp->n_expert, K = hp->n_expert_used, Fe = hp->n_ff_exp;
    const int route = g->gemm_f32 ? MM_GEMM_F32 : MM_AUTO;
    qf_status st = QF_OK;
    int off = 0;
    if ((st = dev_matmul(g->blas, &L->gate_inp, g->xn, n, g->moe_logits, false, route, g->wdeq, g->xh, S, err)))
        goto done;
    CK(cudaMemcpyAsync(g->h_moe_logits, g->moe_logits, (size_t)n * E * 4, cudaMemcpyDeviceToHost, S));
    CK(cudaStreamSynchronize(S));
    g->moe_route(hp, g->h_moe_logits, n, g->h_moe_ids, g->h_moe_w);
    for (int x = 0; x < E; x++) /* (token, weight) pairs grouped by expert, tokens ascending */
        for (int t = 0; t < n; t++)
            for (int k = 0; k < K; k++)
                if (g->h_moe_ids[(size_t)t * K + k] == x) {
                    g->h_moe_rows[off] = t;
                    g->h_moe_rw[off] = g->h_moe_w[(size_t)t * K + k];
                    off++;
                }
    CK(cudaMemcpyAsync(g->moe_rows, g->h_moe_rows, (size_t)off * 4, cudaMemcpyHostToDevice, S));
    CK(cudaMemcpyAsync(g->moe_rw, g->h_moe_rw, (size_t)off * 4, cudaMemcpyHostToDevice, S));
    CK(cudaMemsetAsync(g->moe_acc, 0, (size_t)n * D * 4, S));
    off = 0;
    for (int x = 0; x < E; x++) {
        int r = 0;
        for (int t = 0; t < n; t++)
            for (int k = 0; k < K; k++) r += g->h_moe_ids[(size_t)t * K + k] == x;
        if (!r) continue;
        launch_gather_rows(g->xn, g->moe_rows + off, r, D, g->moe_x, S);
        if ((st = dev_matmul(g->blas, &L->eg[x], g->moe_x, r, g->hb, false, route, g->wdeq, g->xh, S, err))) goto done;
        if ((st = dev_matmul(g->blas, &L->eu[x], g->moe_x, r, g->hb2, false, route, g->wdeq, g->xh, S, err))) goto done;
        launch_glu(hp->ffn_act == QF_FFN_GELU_TANH, g->hb, g->hb2, (size_t)r * Fe, S);
        if ((st = dev_matmul(g->blas, &L->ed[x], g->hb, r, g->moe_y, false, route, g->wdeq, g->xh, S, err))) goto done;
        launch_scatter_add(g->moe_acc, g->moe_y, g->moe_rows + off, g->moe_rw + off, r, D, S);
        off += r;
    }
    if (L->sh_g.d) { /* qwen2moe: + sigmoid(xn . g) * down(silu(gate xn) * up xn), every token */
        if ((st = dev_matmul(g->blas, &L->sh_inp, g->xn, n, g->moe_logits, false, route, g->wdeq, g->xh, S, err))) goto done;
        if ((st = dev_matmul(g->blas, &L->sh_g, g->xn, n, g->hb, false, route, g->wdeq, g->xh, S, err))) goto done;
        if ((st = dev_matmul(g->blas, &L->sh_u, g->xn, n, g->hb2, false, route, g->wdeq, g->xh, S, err))) goto done;
        launch_glu(hp->ffn_act == QF_FFN_GELU_TANH, g->hb, g->hb2, (size_t)n * hp->n_ff_shexp, S);
        if ((st = dev_matmul(g->blas, &L->sh_d, g->hb, n, g->moe_y, false, route, g->wdeq, g->xh, S, err))) goto done;
        launch_sigmoid_gate_add(g->moe_acc, g->moe_y, g->moe_logits, n, D, S);
    }
    CK(cudaMemcpyAsync(g->xn, g->moe_acc, (size_t)n * D * 4, cudaMemcpyDeviceToDevice, S));
done:
    return st;
}

/* norm_fold (cuda_common.cuh) between the one-token matvec wp (o, down; NULL: the embedding) and
 * wc (q|k|v, the output, or gate|up when gu) over the norm of weight nw: decode of one token, no
 * tap, no family features, the knob on, and both matvecs of the forms it has kernels for */
static bool fold_norm(const qf_cuda_ctx *g, const qf_tap *tap, int n, const dweight *wp, const dweight *wc, bool gu,
                      const float *nw, norm_fold *nf) {
    if (!g->norm_fold || n != 1 || tap || g->fam || (wp && !fold_prod_ok(wp)) || !fold_cons_ok(wc, gu)) return false;
    nf->ss = g->nss, nf->g = nw, nf->xq = g->xq2, nf->d = g->hp.n_embd, nf->eps = g->hp.rms_eps;
    return true;
}
/* fold_norm of layer Ln's attention norm (NULL: none), its fused q|k|v the consumer where that
 * layer's decode takes the fused route (forward_layers' dqkv then decides) */
static bool fold_attn_norm(const qf_cuda_ctx *g, const qf_tap *tap, int n, const dweight *wp, const dlayer *Ln,
                           norm_fold *nf) {
    return Ln && Ln->wqkv.d && g->hp.head_dim % 2 == 0 && !g->rq &&
           fold_norm(g, tap, n, wp, &Ln->wqkv, false, Ln->attn_norm, nf);
}

/* The layers of one decode call, from the embedding to the last layer's residual in g->x, on
 * stream S. rc, rs, tok: the call's RoPE tables and tokens on the device. dpos set (graph
 * capture): the position is read from *dpos by the kernels that depend on it (the KV row
 * written, the split-K ranges), so the captured graph replays at any position. */
static qf_status forward_layers(qf_cuda_ctx *g, const qf_tap *tap, int n, int pos0, const int *dpos, const float *rc,
                                const float *rs, const int32_t *tok, cudaStream_t S, qf_error *err) {
    const qf_hparams *hp = &g->hp;
    const int D = hp->n_embd, hd = hp->head_dim, Dq = hp->n_head * hd, Dkv = hp->n_head_kv * hd, F = hp->n_ff,
              half = hp->n_rot / 2, nkv = hp->n_head_kv;
    qf_status st = QF_OK;
    const int route = g->gemm_f32 ? MM_GEMM_F32 : MM_AUTO;
    prof_mark(g, 0);
    /* norm_fold: fa (nfa) this layer's attention norm folded into the previous layer's down (the
     * first layer's into the embedding), ff (nff) the FFN norm into o; the activation in g->xq2 */
    norm_fold fa = {}, ff = {};
    bool nfa = D % 32 == 0 && hp->embd_scale == 1.0f &&
               fold_attn_norm(g, tap, n, NULL, hp->n_layer > 0 ? &g->layers[0] : NULL, &fa);
    if (nfa) launch_embed_fold(&g->tok_embd, tok, g->x, &fa, S);
    else launch_embed(&g->tok_embd, tok, n, D, g->x, S);
    if (hp->embd_scale != 1.0f) launch_scale(g->x, (size_t)n * D, hp->embd_scale, S); /* gemma: x sqrt(n_embd) */
    g->onf_on = false;

    for (int il = 0; il < hp->n_layer; il++) {
        dlayer *L = &g->layers[il];
        {
            dweight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->wg, &L->wu, &L->wd};
            for (int i = 0; i < 7; i++) ensure_h16(g, ws[i], n);
            dweight *p3[3] = {&L->wq, &L->wk, &L->wv}, *p2[2] = {&L->wg, &L->wu};
            ensure_h16_fused(g, &L->wqkv, p3, 3, n), ensure_h16_fused(g, &L->wgu, p2, 2, n);
        }
        /* prefill on the f16 route with fused weights: one GEMM for q|k|v (f32 and f16 KV
         * only, see below) and one for gate|up, the norms and SiLU*up writing the GEMMs' f16
         * inputs directly */
        const bool fam = g->fam; /* the family features: plain routes (see qf_cuda_ctx.fam) */
        const bool pre16 = !fam && n > MATVEC_MAX && route == MM_AUTO && g->qkv;
        /* a quantized cache (q8_0, q4_0, int8, dict) rounds K and V to a coarse grid or picks
         * atoms by argmax, so one f16 rounding of the GEMM input moves some of those decisions
         * away from the CPU's: with such a cache the fused q|k|v GEMM runs twice, on the f16
         * input and on its f16 residual (kvq: about 22 bits of input, f32 accumulation) */
        const bool kvq = !(g->kv_mode[0] == QF_KV_F32 || g->kv_mode[0] == QF_KV_F16) ||
                         !(g->kv_mode[1] == QF_KV_F32 || g->kv_mode[1] == QF_KV_F16);
        /* kv-rq: separate q, k, v projections (the host encodes pre-RoPE K rows) */
        const bool tap_qk = tap && (tap->on_q || tap->on_k_prerope); /* taps between the projections and RoPE */
        const bool fqkv = pre16 && gemm_h_ok(g, &L->wqkv) && hd % 2 == 0 && (!kvq || g->xl) && !g->rq && !tap_qk;
        const bool fgu = pre16 && gemm_h_ok(g, &L->wgu);
        const bool want_act = tap && tap->on_act;
        /* decode (n <= MATVEC_MAX): one matrix-vector launch over the fused q|k|v rows and one
         * over gate|up (f32 activations, the same matvec kernel), then the split / SiLU*up */
        const bool dec = n <= MATVEC_MAX && route == MM_AUTO;
        const bool dqkv = !fam && dec && L->wqkv.d && hd % 2 == 0 && !g->rq && !tap_qk, dgu = !fam && dec && L->wgu.d;
        /* f16 KV on the flash route, no K/V tap: the split writes the f16 Q and the cache rows */
        const bool kv16 = fqkv && !g->kv_rot && g->kv_mode[0] == QF_KV_F16 && g->kv_mode[1] == QF_KV_F16 && !g->attn_warp &&
                          flash_ok(QF_KV_F16, QF_KV_F16, hd) && g->kv_rb[0] == (size_t)hd * 2 &&
                          g->kv_rb[1] == (size_t)hd * 2 && !(tap && tap->on_kv);
        __half *const q16 = kv16 ? (__half *)g->q : NULL; /* f16 Q in g->q's memory */
        /* decode with an f16 cache, no rotation, no K/V tap: the split writes the cache rows
         * (the same __float2half_rn of the same f32 values as the K|V write) */
        const bool dkv16 = dqkv && !g->kv_rot && g->kv_mode[0] == QF_KV_F16 && g->kv_mode[1] == QF_KV_F16 &&
                           g->kv_rb[0] == (size_t)hd * 2 && g->kv_rb[1] == (size_t)hd * 2 && !(tap && tap->on_kv);
        bool att16 = false, oq = false; /* oq: g->xh holds the attention output's q8_0 activation */
        /* one token with an f16 cache: the q|k|v split runs inside the split-K attention (one
         * launch fewer a layer) */
        const bool fold_split = dkv16 && n == 1 && g->part;
        /* one token with K and V each in q8_0 or q4_0, or both f16 under --kv-rot (no K/V tap),
         * whose attention is k_attn_one: the split, the rotations and the K|V write run inside
         * it (two launches fewer, seven with the rotation) */
        const int actx = g->graph_nctx ? g->graph_nctx : g->n_ctx; /* launch_attention_split's n_ctx */
        const bool fold_q = dqkv && n == 1 && g->part &&
                            ((kv_qz(g->kv_mode[0]) && kv_qz(g->kv_mode[1])) ||
                             (g->kv_rot && g->kv_mode[0] == QF_KV_F16 && g->kv_mode[1] == QF_KV_F16)) &&
                            !(tap && tap->on_kv) &&
                            attention_one_runs(g->kv_mode[0], g->kv_mode[1], g->kv[0] + g->kv_layer_bytes[0] * il,
                                               g->kv[1] + g->kv_layer_bytes[1] * il, g->kv_rb[0], g->kv_rb[1], 1, hd,
                                               pos0, dpos, actx);
        /* decode not folded into k_attn_one (past its keys, or f32 caches) over plain caches but
         * the f16 one without rotation (whose split writes it already), no K/V tap: the split
         * rotates (--kv-rot) and stores the K and V rows itself (launch_qkv_split_store), one
         * launch where the split, the rotation and the K|V write were three */
        bool plain_kv = true;
        for (int s = 0; s < 2; s++)
            plain_kv = plain_kv && (g->kv_mode[s] == QF_KV_F32 || g->kv_mode[s] == QF_KV_F16 || kv_qz(g->kv_mode[s]));
        const float hs = 1.0f / sqrtf((float)hd); /* --kv-rot's scale, as qf_hadamard computes it */
        const bool sq = dqkv && !fold_q && !dkv16 && plain_kv && hd % 32 == 0 && hd <= HD_MAX && !(tap && tap->on_kv);
        /* decode: the norm also writes the q8_0 activation of the int8 matvecs (into xh, their
         * scratch), which then skip their own quantization launch */
        const bool q8a = dqkv && !fqkv && q8_act(&L->wqkv);
        nfa = nfa && dqkv; /* (the down before set it only where this layer's q|k|v takes it) */
        bool xq1 = !nfa && launch_rmsnorm(g->x, L->attn_norm, n, D, hp->rms_eps, !fqkv || want_act || kvq ? g->xn : NULL,
                                          fqkv ? g->xh : NULL, S, q8a ? (void *)g->xh : NULL);
        /* decode with separate q, k, v matvecs (q4_k_m's layers whose v is Q6_K and q, k Q4_K):
         * where all three read the same int8 activation it is quantized once for them, not three
         * times */
        const int aq = act_kind(&L->wq);
        if (!fam && dec && !dqkv && !fqkv && aq != ACT_NONE && act_kind(&L->wk) == aq && act_kind(&L->wv) == aq) {
            if (aq == ACT_Q8_K) launch_quant_act_k(g->xn, n, D, g->xh, S);
            else launch_quant_act(g->xn, n, D, g->xh, S);
            xq1 = true;
        }
        if ((st = tap_act(g, tap, il, QF_ACT_ATTN_IN, n, D, g->xn, err))) goto done;
        prof_mark(g, 0);
        if (fqkv) {
            if ((st = dev_gemm_h(g->blas, &L->wqkv, g->xh, n, g->qkv, false, g->wdeq, err))) goto done;
            if (kvq) { /* += W (x - f16(x)) */
                launch_f16_lo(g->xn, g->xh, g->xl, (size_t)n * D, S);
                if ((st = dev_gemm_h(g->blas, &L->wqkv, g->xl, n, g->qkv, true, g->wdeq, err))) goto done;
            }
            prof_mark(g, 1);
            if (kv16) {
                const size_t at = (size_t)pos0 * nkv * hd; /* f16 elements before row pos0 */
                launch_qkv_split(g->qkv, 1, n, hp->n_head, nkv, hd, half, hp->rope_type == QF_ROPE_NEOX, rc,
                                 rs, L->bq, L->bk, L->bv, q16, (__half *)(g->kv[0] + g->kv_layer_bytes[0] * il) + at,
                                 (__half *)(g->kv[1] + g->kv_layer_bytes[1] * il) + at, S);
            } else
                launch_qkv_split(g->qkv, 0, n, hp->n_head, nkv, hd, half, hp->rope_type == QF_ROPE_NEOX, rc,
                                 rs, L->bq, L->bk, L->bv, g->q, g->k, g->v, S);
        } else if (dqkv) {
            if (nfa) launch_matvec_norm(&L->wqkv, g->qkv, false, &fa, S);
            else if ((st = dev_matmul(g->blas, &L->wqkv, g->xn, n, g->qkv, false, MM_MATVEC, g->wdeq, g->xh, S, err, xq1)))
                goto done;
            prof_mark(g, 1);
            if ((dkv16 && fold_split) || fold_q) {
                /* one token: the attention kernel rotates q and writes the K and V rows itself
                 * (launch_attention_split's fx, below) */
            } else if (dkv16) { /* f16 cache: K and V rows straight into it (at *dpos under graph capture) */
                const size_t at = dpos ? 0 : (size_t)pos0 * nkv * hd;
                launch_qkv_split(g->qkv, 2, n, hp->n_head, nkv, hd, half, hp->rope_type == QF_ROPE_NEOX, rc, rs, L->bq,
                                 L->bk, L->bv, g->q, (__half *)(g->kv[0] + g->kv_layer_bytes[0] * il) + at,
                                 (__half *)(g->kv[1] + g->kv_layer_bytes[1] * il) + at, S, dpos);
            } else if (sq) {
                kv_rows kr = {};
                for (int s = 0; s < 2; s++)
                    kr.c[s] = g->kv[s] + g->kv_layer_bytes[s] * il, kr.mode[s] = g->kv_mode[s], kr.rb[s] = g->kv_rb[s];
                launch_qkv_split_store(g->qkv, n, hp->n_head, nkv, hd, half, hp->rope_type == QF_ROPE_NEOX, rc, rs, L->bq,
                                       L->bk, L->bv, g->q, kr, g->kv_rot ? hs : 0.0f, pos0, S, dpos);
            } else
                launch_qkv_split(g->qkv, 0, n, hp->n_head, nkv, hd, half, hp->rope_type == QF_ROPE_NEOX, rc, rs,
                                 L->bq, L->bk, L->bv, g->q, g->k, g->v, S);
        } else {
            if ((st = dev_matmul(g->blas, &L->wq, g->xn, n, g->q, false, route, g->wdeq, g->xh, S, err, xq1))) goto done;
            {
                /* a quantized cache (q8_0, q4_0, int8, dict) rounds K and V to a coarse grid or picks
                 * atoms by argmax, and f16 GEMM inputs move some of those decisions away from the
                 * CPU's: with such a cache the prefill projects K and V in f32 (sgemm) */
                int rkv[2];
                const dweight *wkv[2] = {&L->wk, &L->wv};
                for (int s = 0; s < 2; s++)
                    rkv[s] = n > MATVEC_MAX && g->kv_mode[s] != QF_KV_F32 && g->kv_mode[s] != QF_KV_F16 &&
                                     (size_t)wkv[s]->ne0 * wkv[s]->ne1 * 4 <= g->wdeq_bytes
                                 ? MM_GEMM_F32
                                 : route;
                /* xq1 (decode only): the routes are all the matvec's, none overwrites xh */
                if ((st = dev_matmul(g->blas, &L->wk, g->xn, n, g->k, false, rkv[0], g->wdeq, g->xh, S, err, xq1)))
                    goto done;
                if ((st = dev_matmul(g->blas, &L->wv, g->xn, n, g->v, false, rkv[1], g->wdeq, g->xh, S, err, xq1)))
                    goto done;
            }
            prof_mark(g, 1);
            if (L->bq) launch_add_bias(g->q, L->bq, n, Dq, S);
            if (L->bk) launch_add_bias(g->k, L->bk, n, Dkv, S);
            if (L->bv) launch_add_bias(g->v, L->bv, n, Dkv, S);
            /* per-head RMS norm of q and k before RoPE (qwen3, gemma3) */
            if (L->q_norm) launch_rmsnorm(g->q, L->q_norm, n * hp->n_head, hd, hp->rms_eps, g->q, NULL, S);
            if (L->k_norm) launch_rmsnorm(g->k, L->k_norm, n * nkv, hd, hp->rms_eps, g->k, NULL, S);
            /* K before RoPE: the rows a pre-RoPE kv-rq cache encodes, and the on_k_prerope tap */
            if (g->rq && g->rq->k_prerope)
                CK(cudaMemcpyAsync(g->rq->kpre, g->k, (size_t)n * Dkv * 4, cudaMemcpyDeviceToDevice, S));
            if (tap && tap->on_k_prerope) CK(cudaMemcpy(g->h_kpre, g->k, (size_t)n * Dkv * 4, cudaMemcpyDeviceToHost));
            /* gemma3's sliding-window layers rotate with their own base */
            const bool swa_rope = g->rcos_swa && L->window > 0;
            const float *lrc = swa_rope ? g->rcos_swa : rc, *lrs = swa_rope ? g->rsin_swa : rs;
            launch_rope(g->q, n, hp->n_head, hd, half, hp->rope_type == QF_ROPE_NEOX, lrc, lrs, S);
            launch_rope(g->k, n, nkv, hd, half, hp->rope_type == QF_ROPE_NEOX, lrc, lrs, S);
            if ((st = tap_q_kpre(g, tap, il, pos0, n, err))) goto done;
        }
        if ((st = tap_kv(g, tap, il, pos0, n, err))) goto done;
        prof_mark(g, 0);
        if (g->rq) {
            if ((st = rq_store(g, il, n, pos0, S, err))) goto done;
            rq_attention(g, il, n, pos0, dec && g->part && !fam, S);
        } else {
            const uint8_t *kvp[2];
            qf_kv_mode km[2];
            size_t krb[2];
            bool plain = !kv16 && !dkv16;
            for (int s = 0; s < 2; s++) plain = plain && g->kv_mode[s] != QF_KV_INT8 && g->kv_mode[s] != QF_KV_DICT;
            /* decode (split-K) over an int8 cache: the expansion covers [0, *dpos + 1) under graph
             * replay, and a rotated layout's rows stay as stored (H k, H v): attention runs on H q
             * and its output is rotated back, as with --kv-rot (i8k, i8v) */
            const bool i8b = dec && g->part && !fam;
            const bool i8k = i8b && g->kv_mode[0] == QF_KV_INT8 && kv_int8_rotated(g->kv_layout[0]);
            const bool i8v = i8b && g->kv_mode[1] == QF_KV_INT8 && kv_int8_rotated(g->kv_layout[1]);
            bool qrot = false; /* q already rotated (int8_store_pair) */
            attn_i8 i8a;
            const bool i8in = i8b && int8_inplace(g, il, &i8a); /* int8 read in place by split-K */
            if (plain) { /* K and V rows in one launch */
                uint8_t *dst[2];
                const float *src[2] = {g->k, g->v};
                size_t stride[2];
                for (int s = 0; s < 2; s++) {
                    uint8_t *C = g->kv[s] + g->kv_layer_bytes[s] * il;
                    kvp[s] = C, km[s] = g->kv_mode[s], krb[s] = g->kv_rb[s];
                    stride[s] = (size_t)nkv * g->kv_rb[s];
                    dst[s] = dpos ? C : C + (size_t)pos0 * stride[s];
                }
                if (g->kv_rot && !fold_q && !sq) { /* K, V and q in one launch */
                    float *rx[3] = {g->k, g->v, g->q};
                    const int64_t rr[3] = {(int64_t)n * nkv, (int64_t)n * nkv, (int64_t)n * hp->n_head};
                    launch_hadamard_n(rx, rr, 3, hd, S);
                }
                if (!fold_q && !sq) launch_kv_write2(km, src, (int64_t)n * nkv, hd, krb, dst, S, dpos, stride);
            } else if (i8b && int8_pair(g)) {
                int8_store_pair(g, il, n, pos0, dpos, S, kvp, km, krb, i8in);
                qrot = i8k; /* q rotated with K and V */
            } else
                for (int s = 0; s < 2; s++)
                    if (kv16 || dkv16) /* already written by the split */
                        kvp[s] = g->kv[s] + g->kv_layer_bytes[s] * il, km[s] = QF_KV_F16, krb[s] = g->kv_rb[s];
                    else if ((st = kv_store(g, s, il, s ? g->v : g->k, n, pos0, dpos, S, i8b, i8in, &kvp[s], &km[s],
                                            &krb[s], err)))
                        goto done;
            /* prefill: the tensor-core flash kernel reads f16, q8_0 and q4_0 caches and the f32
             * expansion of int8 / dict layers itself (tiles dequantized to f16 in shared memory); a
             * plain f32 cache keeps the f32 warp kernel (f32 is asked for precision) */
            const bool expanded = g->kv_mode[0] == QF_KV_INT8 || g->kv_mode[0] == QF_KV_DICT;
            const bool fl = n > MATVEC_MAX && !g->attn_warp && !fam && flash_ok(km[0], km[1], hd) && krb[0] == krb[1] &&
                            (km[0] != QF_KV_F32 || expanded);
            att16 = fl && pre16 && !want_act && !g->kv_rot && gemm_h_ok(g, &L->wo);
            /* --kv-rot: the cache holds H k and H v, so attention runs on H q and its output,
             * H (sum p v), is rotated back */
            /* (with the plain modes q was rotated with K and V above, or by the split that stores
             * the rows, or in k_attn_one) */
            if (i8k && !qrot) launch_hadamard(g->q, (int64_t)n * hp->n_head, hd, S);
            if (dec && g->part && !fam) { /* decode: split-K over the cache */
                attn_fuse fx = {};
                if (fold_split || fold_q)
                    fx.qkv = g->qkv, fx.cs = rc, fx.sn = rs, fx.bq = L->bq, fx.bk = L->bk, fx.bv = L->bv, fx.half = half,
                    fx.neox = hp->rope_type == QF_ROPE_NEOX;
                /* rotated rows: the output is rotated back where it is written */
                if (g->kv_rot || i8v) fx.rot = hs;
                /* the merge (or k_attn_one) writes the o matvec's q8_0 activation (it then skips
                 * its quantization) */
                if (!L->post_attn_norm && q8_act(&L->wo)) fx.xq = g->xh;
                oq = launch_attention_split(km[0], km[1], g->q, kvp[0], kvp[1], krb[0], krb[1], n, pos0, hp->n_head, nkv,
                                            hd, g->att, g->part, S, dpos, actx,
                                            i8in || (!expanded && g->kv_mode[1] != QF_KV_INT8 && g->kv_mode[1] != QF_KV_DICT),
                                            &fx, i8in ? &i8a : NULL);
            } else {
                launch_attention(km[0], km[1], g->q, kvp[0], kvp[1], krb[0], krb[1], n, pos0, hp->n_head, nkv, hd, g->att,
                                 fl, att16 ? g->xh : NULL, q16, S, fam ? hp->attn_scale : 0.0f, hp->attn_softcap,
                                 L->window);
                if (g->kv_rot) launch_hadamard(g->att, (int64_t)n * hp->n_head, hd, S); /* H (sum p v), rotated back */
            }
        }
        prof_mark(g, 2);
        if ((st = tap_act(g, tap, il, QF_ACT_ATTN_OUT, n, Dq, g->att, err))) goto done;
        /* the FFN norm folded into o (producer) and gate|up (consumer) */
        const bool nff = !att16 && !L->post_attn_norm && dgu && !fgu && !L->eg &&
                         fold_norm(g, tap, n, &L->wo, &L->wgu, true, L->ffn_norm, &ff);
        if (nff) {
            launch_matvec_fold(&L->wo, g->att, g->xh, oq, g->x, &ff, S);
        } else if (att16) {
            if ((st = dev_gemm_h(g->blas, &L->wo, g->xh, n, g->x, true, g->wdeq, err))) goto done;
        } else if (L->post_attn_norm) { /* gemma: x += rmsnorm(att W_o) * post_attn_norm */
            if ((st = dev_matmul(g->blas, &L->wo, g->att, n, g->xn, false, route, g->wdeq, g->xh, S, err))) goto done;
            launch_rmsnorm(g->xn, L->post_attn_norm, n, D, hp->rms_eps, g->xn, NULL, S);
            launch_add(g->x, g->xn, (size_t)n * D, S);
        } else if ((st = dev_matmul(g->blas, &L->wo, g->att, n, g->x, true, route, g->wdeq, g->xh, S, err, oq))) goto done;
        prof_mark(g, 4);

        const bool xq2 = !nff && launch_rmsnorm(g->x, L->ffn_norm, n, D, hp->rms_eps, !fgu || want_act ? g->xn : NULL,
                                                fgu ? g->xh : NULL, S,
                                                dgu && !fgu && !L->eg && q8_act(&L->wgu) ? (void *)g->xh : NULL);
        if ((st = tap_act(g, tap, il, QF_ACT_FFN_IN, n, D, g->xn, err))) goto done;
        prof_mark(g, 0);
        nfa = false; /* (this layer's q|k|v took it; the down below may set it for the next) */
        if (L->eg) {
            /* MoE: g->xn <- the routed experts' sum, then the residual (after a post norm) */
            if ((st = moe_ffn(g, L, n, S, err))) goto done;
            if (L->post_ffw_norm) launch_rmsnorm(g->xn, L->post_ffw_norm, n, D, hp->rms_eps, g->xn, NULL, S);
            launch_add(g->x, g->xn, (size_t)n * D, S);
        } else if (fgu) {
            /* gu16: f16 gate|up in g->gu's memory */
            if ((st = dev_gemm_h(g->blas, &L->wgu, g->xh, n, g->gu, false, g->wdeq, err,
                                 g->gu16 ? CUDA_R_16F : CUDA_R_32F)))
                goto done;
            prof_mark(g, 5);
            launch_silu_gu(g->gu, g->gu16, n, F, want_act ? g->hb : NULL, g->xh, S);
            if ((st = tap_act(g, tap, il, QF_ACT_FFN_DOWN, n, F, g->hb, err))) goto done;
            prof_mark(g, 0);
            if ((st = dev_gemm_h(g->blas, &L->wd, g->xh, n, g->x, true, g->wdeq, err))) goto done;
        } else if (dgu) {
            /* SiLU(gate) * up at the end of the matvec where it applies (the same bits) */
            if (nff) launch_matvec_norm(&L->wgu, g->hb, true, &ff, S);
            else if (!launch_matvec_gu(&L->wgu, g->xn, n, F, g->hb, g->xh, S, xq2)) {
                if ((st = dev_matmul(g->blas, &L->wgu, g->xn, n, g->gu, false, MM_MATVEC, g->wdeq, g->xh, S, err, xq2)))
                    goto done;
                launch_silu_gu(g->gu, false, n, F, g->hb, NULL, S);
            }
            prof_mark(g, 5);
            if ((st = tap_act(g, tap, il, QF_ACT_FFN_DOWN, n, F, g->hb, err))) goto done;
            prof_mark(g, 0);
            /* the next layer's attention norm folded into down (producer) and its q|k|v (consumer) */
            const dlayer *Ln = il + 1 < hp->n_layer ? &g->layers[il + 1] : NULL;
            nfa = fold_attn_norm(g, tap, n, &L->wd, Ln, &fa);
            /* the last down: the output norm folded into it and the logits matvec (forward_logits) */
            g->onf_on = !Ln && route == MM_AUTO && fold_norm(g, tap, n, &L->wd, &g->output, false, g->output_norm, &g->onf);
            if (nfa) launch_matvec_fold(&L->wd, g->hb, g->xh, false, g->x, &fa, S);
            else if (g->onf_on) launch_matvec_fold(&L->wd, g->hb, g->xh, false, g->x, &g->onf, S);
            else if ((st = dev_matmul(g->blas, &L->wd, g->hb, n, g->x, true, route, g->wdeq, g->xh, S, err))) goto done;
        } else {
            if ((st = dev_matmul(g->blas, &L->wg, g->xn, n, g->hb, false, route, g->wdeq, g->xh, S, err))) goto done;
            if ((st = dev_matmul(g->blas, &L->wu, g->xn, n, g->hb2, false, route, g->wdeq, g->xh, S, err))) goto done;
            prof_mark(g, 5);
            launch_glu(hp->ffn_act == QF_FFN_GELU_TANH, g->hb, g->hb2, (size_t)n * F, S); /* SwiGLU or GeGLU */
            if ((st = tap_act(g, tap, il, QF_ACT_FFN_DOWN, n, F, g->hb, err))) goto done;
            prof_mark(g, 0);
            if (L->post_ffw_norm) { /* gemma: x += rmsnorm(h W_down) * post_ffw_norm */
                if ((st = dev_matmul(g->blas, &L->wd, g->hb, n, g->xn, false, route, g->wdeq, g->xh, S, err))) goto done;
                launch_rmsnorm(g->xn, L->post_ffw_norm, n, D, hp->rms_eps, g->xn, NULL, S);
                launch_add(g->x, g->xn, (size_t)n * D, S);
            } else if ((st = dev_matmul(g->blas, &L->wd, g->hb, n, g->x, true, route, g->wdeq, g->xh, S, err))) goto done;
        }
        prof_mark(g, 6);
    }
done:
    return st;
}

/* The canonical arithmetic's cache modes (qf_context_canonical's list; dict takes the knobs'
 * routes) */
static bool canon_on(const qf_cuda_ctx *g) {
    if (!g->canon) return false;
    if (g->rq) return true; /* kv-rq: its rows decoded as the host decodes them (forward_canon) */
    for (int s = 0; s < 2; s++)
        if (g->kv_mode[s] != QF_KV_F32 && g->kv_mode[s] != QF_KV_F16 && g->kv_mode[s] != QF_KV_Q8_0 &&
            g->kv_mode[s] != QF_KV_Q4_0 && g->kv_mode[s] != QF_KV_INT8)
            return false;
    return true;
}

/* forward.c's canonical route (kernels/canon.h), stage by stage, each the CPU's bits: the norms,
 * RoPE and SiLU of cuda_canon.cu, its GEMMs (the CPU's integer GEMMs or f32 chains), the cache
 * rows written as always (the host's bytes) and read back to f32 as the host reads them (and
 * rotated back under --kv-rot), attention in fmaf chains, residuals added after each matmul.
 * Then the logits of rows [first, n) (first = n: none). */
static qf_status forward_canon(qf_cuda_ctx *g, const qf_tap *tap, int n, int pos0, int first, const float *rc,
                               const float *rs, const int32_t *tok, qf_error *err) {
    const qf_hparams *hp = &g->hp;
    const int D = hp->n_embd, hd = hp->head_dim, Dq = hp->n_head * hd, Dkv = hp->n_head_kv * hd, F = hp->n_ff,
              half = hp->n_rot / 2, nkv = hp->n_head_kv, T = pos0 + n;
    const bool neox = hp->rope_type == QF_ROPE_NEOX;
    const cudaStream_t S = 0;
    qf_status st = QF_OK;
    launch_embed(&g->tok_embd, tok, n, D, g->x, S);
    for (int il = 0; il < hp->n_layer; il++) {
        dlayer *L = &g->layers[il];
        launch_canon_rmsnorm(g->x, L->attn_norm, n, D, hp->rms_eps, g->xn, S);
        if ((st = tap_act(g, tap, il, QF_ACT_ATTN_IN, n, D, g->xn, err))) goto done;
        if ((st = canon_matmul(&L->wq, g->xn, n, g->q, g->xh, S, err)) ||
            (st = canon_matmul(&L->wk, g->xn, n, g->k, g->xh, S, err)) ||
            (st = canon_matmul(&L->wv, g->xn, n, g->v, g->xh, S, err)))
            goto done;
        if (L->bq) launch_add_bias(g->q, L->bq, n, Dq, S);
        if (L->bk) launch_add_bias(g->k, L->bk, n, Dkv, S);
        if (L->bv) launch_add_bias(g->v, L->bv, n, Dkv, S);
        if (tap && tap->on_k_prerope) CK(cudaMemcpy(g->h_kpre, g->k, (size_t)n * Dkv * 4, cudaMemcpyDeviceToHost));
        if (g->rq && g->rq->k_prerope) /* the rows a pre-RoPE kv-rq cache encodes */
            CK(cudaMemcpyAsync(g->rq->kpre, g->k, (size_t)n * Dkv * 4, cudaMemcpyDeviceToDevice, S));
        launch_canon_rope(g->q, n, hp->n_head, hd, half, neox, rc, rs, S);
        launch_canon_rope(g->k, n, nkv, hd, half, neox, rc, rs, S);
        if ((st = tap_q_kpre(g, tap, il, pos0, n, err)) || (st = tap_kv(g, tap, il, pos0, n, err))) goto done;
        if (g->rq) { /* kv-rq: the host encoder's rows, read back as the host's row decoder reads them */
            struct rq_state *r = g->rq;
            if ((st = rq_store(g, il, n, pos0, S, err, true))) goto done;
            rq_layer_dev a = r->lay[0][il], b = r->lay[1][il];
            a.predT = NULL;
            launch_kv_rq_expand(&a, T, nkv, hd, g->kv_f32[0], S); /* K as stored (before RoPE where it is so) */
            if (b.predT) b.khat = g->kv_f32[0];
            launch_kv_rq_expand(&b, T, nkv, hd, g->kv_f32[1], S); /* V, its prediction from those K rows added */
            if (r->k_prerope) launch_canon_rope(g->kv_f32[0], T, nkv, hd, half, neox, r->kr_cos, r->kr_sin, S);
            const bool ex = r->n_sink || r->n_window;
            const int *wpos = r->n_window ? r->win_pos + (size_t)il * r->n_window : NULL;
            const float *fresh[2] = {g->k, g->v};
            for (int s = 0; s < 2 && ex; s++)
                launch_kv_exact_gather(r->ex[s], g->kv_f32[s], fresh[s], r->n_sink ? r->sink[s] + (size_t)il * r->n_sink * Dkv : NULL,
                                       r->n_window ? r->win[s] + (size_t)il * r->n_window * Dkv : NULL, wpos, r->n_sink,
                                       r->n_window, pos0, n, Dkv, S);
            launch_canon_attention(g->q, g->kv_f32[0], g->kv_f32[1], ex ? r->ex[0] : NULL, ex ? r->ex[1] : NULL, r->n_sink,
                                   r->n_window, n, pos0, hp->n_head, nkv, hd, hp->attn_scale, g->cs, g->att, S);
            for (int s = 0; s < 2 && r->n_window; s++)
                launch_kv_window_push(r->win[s] + (size_t)il * r->n_window * Dkv, r->win_pos + (size_t)il * r->n_window,
                                      fresh[s], pos0, n, r->n_window, Dkv, S);
        } else {
            const float *kv32[2];
            for (int s = 0; s < 2; s++) { /* store the rows; the layer's positions [0, T) as f32 */
                const uint8_t *view;
                qf_kv_mode vm;
                size_t vrb;
                if ((st = kv_store(g, s, il, s ? g->v : g->k, n, pos0, NULL, S, false, false, &view, &vm, &vrb, err))) goto done;
                if (g->kv_mode[s] == QF_KV_INT8) { /* expanded to f32 by kv_store */
                    kv32[s] = g->kv_f32[s];
                    continue;
                }
                float **buf = s ? &g->cv : &g->ck;
                if (!*buf) { /* a plain cache's f32 view, made on its first use (kv-int8 and kv-rq, which
                              * may be bound to this context instead, read kv_f32) */
                    CK(cudaMalloc((void **)buf, (size_t)g->n_ctx * Dkv * 4));
                    g->scratch_bytes += (size_t)g->n_ctx * Dkv * 4;
                }
                float *dst = *buf;
                launch_kv_read(vm, view, (int64_t)T * nkv, hd, vrb, dst, S);
                if (g->kv_rot) launch_hadamard(dst, (int64_t)T * nkv, hd, S);
                kv32[s] = dst;
            }
            launch_canon_attention(g->q, kv32[0], kv32[1], NULL, NULL, 0, 0, n, pos0, hp->n_head, nkv, hd, hp->attn_scale, g->cs,
                                   g->att, S);
        }
        if ((st = tap_act(g, tap, il, QF_ACT_ATTN_OUT, n, Dq, g->att, err))) goto done;
        if ((st = canon_matmul(&L->wo, g->att, n, g->xn, g->xh, S, err))) goto done;
        launch_add(g->x, g->xn, (size_t)n * D, S);
        launch_canon_rmsnorm(g->x, L->ffn_norm, n, D, hp->rms_eps, g->xn, S);
        if ((st = tap_act(g, tap, il, QF_ACT_FFN_IN, n, D, g->xn, err))) goto done;
        if ((st = canon_matmul(&L->wg, g->xn, n, g->hb, g->xh, S, err)) ||
            (st = canon_matmul(&L->wu, g->xn, n, g->hb2, g->xh, S, err)))
            goto done;
        launch_canon_silu(g->hb, g->hb2, (size_t)n * F, S);
        if ((st = tap_act(g, tap, il, QF_ACT_FFN_DOWN, n, F, g->hb, err))) goto done;
        if ((st = canon_matmul(&L->wd, g->hb, n, g->xn, g->xh, S, err))) goto done;
        launch_add(g->x, g->xn, (size_t)n * D, S);
    }
    if (first < n) {
        launch_canon_rmsnorm(g->x + (size_t)first * D, g->output_norm, n - first, D, hp->rms_eps, g->xn, S);
        st = canon_matmul(&g->output, g->xn, n - first, g->logits, g->xh, S, err);
    }
done:
    return st;
}

/* logits rows [first, n) of the last forward_layers into g->logits, on stream S */
static qf_status forward_logits(qf_cuda_ctx *g, int n, int first, cudaStream_t S, qf_error *err) {
    const qf_hparams *hp = &g->hp;
    const int D = hp->n_embd, n_out = n - first;
    const int route = g->gemm_f32 ? MM_GEMM_F32 : MM_AUTO;
    qf_status st = QF_OK;
    ensure_h16(g, &g->output, n_out);
    if (g->onf_on && n == 1 && first == 0) /* the last down wrote the norm's activation (forward_layers) */
        launch_matvec_norm(&g->output, g->logits, false, &g->onf, S);
    else if (n_out > MATVEC_MAX && route == MM_AUTO && gemm_h_ok(g, &g->output)) {
        launch_rmsnorm(g->x + (size_t)first * D, g->output_norm, n_out, D, hp->rms_eps, NULL, g->xh, S);
        if ((st = dev_gemm_h(g->blas, &g->output, g->xh, n_out, g->logits, false, g->wdeq, err))) goto done;
    } else {
        const bool mv = n_out <= MATVEC_MAX && route == MM_AUTO;
        const bool xq = launch_rmsnorm(g->x + (size_t)first * D, g->output_norm, n_out, D, hp->rms_eps, g->xn, NULL, S,
                                       mv && q8_act(&g->output) ? (void *)g->xh : NULL);
        if ((st = dev_matmul(g->blas, &g->output, g->xn, n_out, g->logits, false, route, g->wdeq, g->xh, S, err, xq)))
            goto done;
    }
    if (hp->final_softcap > 0) launch_softcap(g->logits, (size_t)n_out * hp->n_vocab, hp->final_softcap, S); /* gemma2 */
done:
    return st;
}

/* host RoPE tables for positions [pos0, pos0 + n), exactly as forward.c's rope_row_base: base
 * and freq_scale are the model's (or, for gemma3's sliding-window layers, rope_freq_base_swa
 * and 1, as forward.c's rope_tables) */
static void rope_host_base(const qf_cuda_ctx *g, float base, float freq_scale, int n, int pos0, float *cs, float *sn) {
    const qf_hparams *hp = &g->hp;
    const int half = hp->n_rot / 2;
    float theta_scale = powf(base, -2.0f / (float)hp->n_rot);
    for (int t = 0; t < n; t++) {
        float theta = (float)(pos0 + t);
        for (int i = 0; i < half; i++) {
            float th = freq_scale * (g->rope_ff ? theta / g->rope_ff[i] : theta);
            cs[t * half + i] = cosf(th);
            sn[t * half + i] = sinf(th);
            theta *= theta_scale;
        }
    }
}
static void rope_host(const qf_cuda_ctx *g, int n, int pos0, float *cs, float *sn) {
    rope_host_base(g, g->hp.rope_freq_base, g->hp.rope_freq_scale, n, pos0, cs, sn);
}

/* One-token decode as a CUDA graph: the step's RoPE row, token and position go to g->dstep (one
 * copy from pinned memory), then the graph of the whole step (layers, output norm, logits
 * matvec) is replayed on g->stream; captured at the first such call. The kernels are the
 * same as the plain path's with the same arguments, except that the KV row written and the
 * split-K ranges come from the device's copy of the position, so the logits are the same
 * bits. On a capture failure the context turns graphs off and the caller runs the plain path
 * (*fallback). logits NULL: they stay in g->logits and the call returns without waiting for
 * g->stream. */
static qf_status forward_graph(qf_cuda_ctx *g, int32_t token, int pos0, float *logits, bool *fallback, qf_error *err) {
    const qf_hparams *hp = &g->hp;
    const int half = hp->n_rot / 2;
    float *h = g->h_step;
    float *rc = g->dstep, *rs = g->dstep + half;
    int32_t *tok = (int32_t *)(g->dstep + 2 * half);
    const int *dpos = (const int *)(g->dstep + 2 * half + 1);
    /* the band: short positions' attention is k_attn_one, which a graph runs only when every
     * position it serves is short (attention_one_keys) */
    const int ok = attention_one_keys(g->kv_mode[0], g->kv_mode[1], hp->head_dim);
    const bool banded = ok > 0 && ok < g->n_ctx;
    const int b = banded && pos0 + 1 > ok ? 1 : 0;
    qf_status st = QF_OK;
    *fallback = false;
    rope_host(g, 1, pos0, h, h + half);
    memcpy(h + 2 * half, &token, 4);
    memcpy(h + 2 * half + 1, &pos0, 4);
    CK(cudaMemcpyAsync(g->dstep, h, (size_t)(2 * half + 2) * 4, cudaMemcpyHostToDevice, g->stream));
    if (!g->gexec[b]) {
        cudaGraph_t gr = NULL;
        CK(cudaStreamBeginCapture(g->stream, cudaStreamCaptureModeThreadLocal));
        cu_pdl_set(g->pdl); /* the step's kernels may overlap their predecessors' tails */
        g->graph_nctx = banded && b == 0 ? ok : 0;
        st = forward_layers(g, NULL, 1, pos0, dpos, rc, rs, tok, g->stream, err);
        g->graph_nctx = 0;
        if (!st) st = forward_logits(g, 1, 0, g->stream, err);
        cu_pdl_set(false);
        cudaError_t e = cudaStreamEndCapture(g->stream, &gr);
        if (!st && e == cudaSuccess) {
            size_t nn = 0;
            if (cudaGraphGetNodes(gr, NULL, &nn) == cudaSuccess) g->graph_nodes = (long)nn;
            e = cudaGraphInstantiate(&g->gexec[b], gr, 0);
        }
        if (gr) cudaGraphDestroy(gr);
        if (st || e != cudaSuccess) {
            cudaGetLastError(); /* clear */
            g->gexec[b] = NULL;
            g->graph_off = true;
            *fallback = true;
            CK(cudaStreamSynchronize(g->stream));
            return QF_OK;
        }
    }
    CK(cudaGraphLaunch(g->gexec[b], g->stream));
    g->graph_steps++;
    if (!logits) return QF_OK; /* decode_topk: the logits stay in g->logits, g->stream not waited for */
    if (g->h_lg) { /* through pinned memory in LG_CHUNKS pieces (the row fits: each slot used once) */
        const size_t V = (size_t)hp->n_vocab, ch = (V + LG_CHUNKS - 1) / LG_CHUNKS;
        CK(copy_staged(logits, g->logits, V * 4, (uint8_t *)g->h_lg, ch * 4, g->lg_ev, LG_CHUNKS, g->stream));
    } else
        CK(cudaMemcpyAsync(logits, g->logits, (size_t)hp->n_vocab * 4, cudaMemcpyDeviceToHost, g->stream));
    CK(cudaStreamSynchronize(g->stream));
done:
    return st;
}

/* the table's decode (see cuda_backend.h); S_out set (decode_topk, logits NULL): the logits of
 * rows [logits_from, n) are computed into g->logits and not copied, and the call returns without
 * waiting for the stream it ran on, which *S_out names */
static qf_status forward_impl(qf_cuda_ctx *g, const qf_tap *tap, const int32_t *tokens, int n, int pos0, float *logits,
                              int logits_from, const int32_t *targets, double *nll, cudaStream_t *S_out, qf_error *err) {
    const qf_hparams *hp = &g->hp;
    const bool dev = S_out != NULL; /* the logits stay on the device */
    const int half = hp->n_rot / 2;
    qf_status st = QF_OK;
    const int route = g->gemm_f32 ? MM_GEMM_F32 : MM_AUTO;
    cudaError_t le;
    if (n > g->n_batch || pos0 + n > g->n_ctx)
        return cu_fail(err, QF_ERR_ARG, "decode: batch exceeds the GPU context's sizes");
    {
        /* one token, logits of it, no tap, no profile, a plain or int8 cache: replay the step's graph */
        bool plain = true;
        for (int s = 0; s < 2; s++)
            plain = plain && (g->kv_mode[s] == QF_KV_F32 || g->kv_mode[s] == QF_KV_F16 || g->kv_mode[s] == QF_KV_Q8_0 ||
                              g->kv_mode[s] == QF_KV_Q4_0 || g->kv_mode[s] == QF_KV_INT8);
        if (!g->graph_off && n == 1 && !tap && !g->ev && !nll && !targets && (logits || dev) && logits_from <= 0 &&
            g->part && route == MM_AUTO && plain && g->stream && !canon_on(g)) {
            bool fallback = false;
            if (S_out) *S_out = g->stream;
            st = forward_graph(g, tokens[0], pos0, logits, &fallback, err);
            if (st || !fallback) return st;
        }
    }
    if (S_out) *S_out = 0;
    rope_host(g, n, pos0, g->h_cos, g->h_sin);
    CK(cudaMemcpy(g->rcos, g->h_cos, (size_t)n * half * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(g->rsin, g->h_sin, (size_t)n * half * 4, cudaMemcpyHostToDevice));
    if (g->rcos_swa) {
        rope_host_base(g, hp->rope_freq_base_swa, 1.0f, n, pos0, g->h_cos2, g->h_sin2);
        CK(cudaMemcpy(g->rcos_swa, g->h_cos2, (size_t)n * half * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(g->rsin_swa, g->h_sin2, (size_t)n * half * 4, cudaMemcpyHostToDevice));
    }
    CK(cudaMemcpy(g->tok, tokens, (size_t)n * 4, cudaMemcpyHostToDevice));
    if (canon_on(g)) {
        const int first = (logits || nll || dev) && logits_from < n ? (logits_from < 0 ? 0 : logits_from) : n;
        if ((st = forward_canon(g, tap, n, pos0, first, g->rcos, g->rsin, g->tok, err))) goto done;
    } else if ((st = forward_layers(g, tap, n, pos0, NULL, g->rcos, g->rsin, g->tok, 0, err)))
        goto done;
    le = cudaGetLastError();
    if (le != cudaSuccess) {
        st = cuda_fail(err, le, "forward kernels");
        goto done;
    }
    if ((logits || nll || dev) && logits_from < n) {
        int first = logits_from < 0 ? 0 : logits_from, n_out = n - first;
        if (!canon_on(g) && (st = forward_logits(g, n, first, 0, err))) goto done;
        if (nll) {
            CK(cudaMemcpy(g->tgt, targets, (size_t)n_out * 4, cudaMemcpyHostToDevice));
            launch_nll(g->logits, n_out, hp->n_vocab, g->tgt, g->nll, 0);
            CK(cudaGetLastError());
            CK(cudaMemcpy(nll, g->nll, (size_t)n_out * 8, cudaMemcpyDeviceToHost));
        }
        if (logits) CK(copy_logits(g, logits, g->logits, (size_t)n_out * hp->n_vocab * 4));
        prof_mark(g, 3);
    } else {
        CK(cudaDeviceSynchronize());
    }
done:
    prof_collect(g);
    return st;
}

static qf_status cuda_forward(qf_cuda_ctx *g, const qf_tap *tap, const int32_t *tokens, int n, int pos0, float *logits,
                              int logits_from, const int32_t *targets, double *nll, qf_error *err) {
    return forward_impl(g, tap, tokens, n, pos0, logits, logits_from, targets, nll, NULL, err);
}

/* the table's decode_topk: see cuda_backend.h */
static qf_status cuda_decode_topk(qf_cuda_ctx *g, int32_t token, int pos0, float temp, int k, qf_gpu_topk *out,
                                  qf_error *err) {
    qf_status st = QF_OK;
    cudaStream_t S = 0;
    if (k < 0 || k > QF_GPU_TOPK_MAX || isnan(temp))
        return cu_fail(err, QF_ERR_ARG, "decode_topk: k %d outside [0, %d] or a NaN temperature", k, QF_GPU_TOPK_MAX);
    /* each at the first call that finds it missing (a failed allocation is retried next time) */
    if (!g->dtopk) CK(cudaMalloc((void **)&g->dtopk, sizeof *out));
    if (!g->h_topk) CK(cudaMallocHost((void **)&g->h_topk, sizeof *out));
    if (!g->topk_scr) CK(cudaMalloc(&g->topk_scr, topk_scratch_bytes(g->hp.n_vocab)));
    if ((st = forward_impl(g, NULL, &token, 1, pos0, NULL, 0, NULL, NULL, &S, err))) goto done;
    launch_topk(g->logits, g->hp.n_vocab, temp, k, g->dtopk, g->topk_scr, S);
    CK(cudaGetLastError());
    CK(cudaMemcpyAsync(g->h_topk, g->dtopk, sizeof *out, cudaMemcpyDeviceToHost, S));
    CK(cudaStreamSynchronize(S));
    memcpy(out, g->h_topk, sizeof *out);
done:
    return st;
}


/* ---------------------------------------------------------------------------------------- */
/* errors and names (the plugin links nothing of libqforge)                                 */

qf_status cu_fail(qf_error *err, qf_status code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

qf_status cu_prefix(qf_error *err, const char *fmt, ...) {
    if (!err) return QF_ERR_DEVICE;
    char old[sizeof err->msg], pre[sizeof err->msg];
    memcpy(old, err->msg, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    snprintf(err->msg, sizeof err->msg, "%s%s", pre, old);
    return err->code;
}

const char *cu_type_name(qf_type t) {
    switch (t) {
    case QF_TYPE_F32: return "f32";
    case QF_TYPE_F16: return "f16";
    case QF_TYPE_BF16: return "bf16";
    case QF_TYPE_Q4_0: return "q4_0";
    case QF_TYPE_Q5_0: return "q5_0";
    case QF_TYPE_Q8_0: return "q8_0";
    case QF_TYPE_Q4_K: return "q4_K";
    case QF_TYPE_Q5_K: return "q5_K";
    case QF_TYPE_Q6_K: return "q6_K";
    default: return "unsupported";
    }
}

const char *cu_kv_mode_name(qf_kv_mode m) {
    static const char *const names[] = {"f32", "f16", "q8_0", "q4_0", "int8", "dict"};
    return (unsigned)m < sizeof names / sizeof names[0] ? names[m] : "unknown";
}

/* ---------------------------------------------------------------------------------------- */
/* the plugin's function table                                                               */

/* tests (qf_gpu_op_kv_rq_decode): the first n_pos positions of layer il of a kv-rq view decoded
 * by the forward pass's kernel, K as stored (before RoPE where the cache keeps it so) and V
 * with its prediction from those K rows; k_rows / v_rows as the host cache stores them */
static qf_status op_kv_rq_decode(const qf_gpu_kv *kv, int il, int64_t n_pos, const uint8_t *k_rows, const uint8_t *v_rows,
                                 float *k_out, float *v_out, qf_error *err) {
    qf_status st = QF_OK;
    struct rq_state *r = NULL;
    uint8_t *dr[2] = {NULL, NULL};
    float *dout[2] = {NULL, NULL};
    const int H = kv->n_head_kv, D = kv->head_dim;
    qf_gpu_kv v = *kv;
    qf_cuda_ctx *g = NULL;
    if (!available()) return cu_fail(err, QF_ERR_DEVICE, "no CUDA GPU is available");
    if (il < 0 || il >= kv->n_layer || n_pos <= 0 || n_pos > kv->n_ctx || D > HD_MAX)
        return cu_fail(err, QF_ERR_ARG, "op_kv_rq_decode: layer %d, %lld positions", il, (long long)n_pos);
    if (!(g = (qf_cuda_ctx *)calloc(1, sizeof *g))) return cu_fail(err, QF_ERR_NOMEM, "out of memory");
    g->n_layer = kv->n_layer, g->nkv = H, g->hd = D, g->n_ctx = kv->n_ctx;
    v.k_prerope = false, v.n_sink = v.n_window = 0; /* the stored rows only */
    if ((st = rq_state_new(g, &v, &r, err))) goto done;
    for (int s = 0; s < 2; s++) {
        rq_layer_dev a = r->lay[s][il];
        const size_t nb = (size_t)n_pos * H * a.rb;
        CK(cudaMalloc((void **)&dr[s], nb));
        CK(cudaMemcpy(dr[s], s ? v_rows : k_rows, nb, cudaMemcpyHostToDevice));
        CK(cudaMalloc((void **)&dout[s], (size_t)n_pos * H * D * 4));
        a.codes = dr[s];
        if (a.predT) a.khat = dout[0];
        launch_kv_rq_expand(&a, n_pos, H, D, dout[s], 0);
        CK(cudaGetLastError());
        CK(cudaMemcpy(s ? v_out : k_out, dout[s], (size_t)n_pos * H * D * 4, cudaMemcpyDeviceToHost));
    }
done:
    for (int s = 0; s < 2; s++) {
        if (dr[s]) cudaFree(dr[s]);
        if (dout[s]) cudaFree(dout[s]);
    }
    rq_state_free(r);
    free(g);
    return st;
}

static qf_status bench_gemm(int M, int N, int K, int flags, int iters, double *ms, qf_error *err) {
    return gemm_bench(M, N, K, flags, iters, ms, err);
}

/* tests (qf_gpu_op_kv_rq_encode): n_pos tokens of K and V encoded into layer il's rows as the
 * forward pass writes them (V's prediction from the device-decoded K rows) */
static qf_status op_kv_rq_encode(const qf_gpu_kv *kv, int il, int64_t n_pos, const float *k, const float *v,
                                 uint8_t *k_rows, uint8_t *v_rows, qf_error *err) {
    qf_status st = QF_OK;
    struct rq_state *r = NULL;
    uint8_t *dr[2] = {NULL, NULL};
    float *dx[2] = {NULL, NULL}, *dk = NULL, *dres = NULL;
    const int H = kv->n_head_kv, D = kv->head_dim, HD = H * D;
    qf_gpu_kv v2 = *kv;
    qf_cuda_ctx *g = NULL;
    if (!available()) return cu_fail(err, QF_ERR_DEVICE, "no CUDA GPU is available");
    if (il < 0 || il >= kv->n_layer || n_pos <= 0 || n_pos > kv->n_ctx || D > HD_MAX)
        return cu_fail(err, QF_ERR_ARG, "op_kv_rq_encode: layer %d, %lld positions", il, (long long)n_pos);
    if (!(g = (qf_cuda_ctx *)calloc(1, sizeof *g))) return cu_fail(err, QF_ERR_NOMEM, "out of memory");
    g->n_layer = kv->n_layer, g->nkv = H, g->hd = D, g->n_ctx = kv->n_ctx, g->n_batch = 1;
    v2.k_prerope = false, v2.n_sink = v2.n_window = 0;
    if ((st = rq_state_new(g, &v2, &r, err))) goto done;
    CK(cudaMalloc((void **)&dk, (size_t)n_pos * HD * 4));
    CK(cudaMalloc((void **)&dres, (size_t)n_pos * HD * 4));
    for (int s = 0; s < 2; s++) {
        rq_enc_dev e = r->enc[s][il];
        rq_layer_dev a = r->lay[s][il];
        const size_t nb = (size_t)n_pos * H * e.rb;
        CK(cudaMalloc((void **)&dr[s], nb));
        CK(cudaMalloc((void **)&dx[s], (size_t)n_pos * HD * 4));
        CK(cudaMemcpy(dx[s], s ? v : k, (size_t)n_pos * HD * 4, cudaMemcpyHostToDevice));
        e.dst = dr[s], a.codes = dr[s];
        const float *src = dx[s];
        if (s == 1 && a.predT) {
            launch_kv_rq_vres(dx[1], dk, a.predT, (int)n_pos, HD, dres, 0);
            src = dres;
        }
        launch_kv_rq_encode(&e, src, n_pos * H, H, D, 0);
        if (s == 0) launch_kv_rq_expand(&a, n_pos, H, D, dk, 0); /* the decoded K the predictor reads */
        CK(cudaGetLastError());
        CK(cudaMemcpy(s ? v_rows : k_rows, dr[s], nb, cudaMemcpyDeviceToHost));
    }
done:
    for (int s = 0; s < 2; s++) {
        if (dr[s]) cudaFree(dr[s]);
        if (dx[s]) cudaFree(dx[s]);
    }
    if (dk) cudaFree(dk);
    if (dres) cudaFree(dres);
    rq_state_free(r);
    free(g);
    return st;
}

static const qf_cuda_api the_api = {
    QF_CUDA_ABI,      available,       ctx_new,      ctx_free,    cuda_forward,
    set_kv,           ctx_info,        op_dequant,   op_matmul,   op_rmsnorm,
    op_rope,          op_silu_mul,     op_attention, op_kv_roundtrip, op_kv_int8_roundtrip,
    op_kv_dict_decode, bench_gemm,      op_matvec_gu, op_kv_rq_decode, op_kv_rq_encode,
    awq_group_new,    awq_group_mse,   awq_group_free, awq_quantize, op_kv_dict_encode,
    learn_gram_f64,   learn_chol_sub_f64, learn_rows_minus_f64, learn_resid_f64, learn_klt_measure,
    cuda_decode_topk, op_topk,
};

extern "C" __attribute__((visibility("default"))) const qf_cuda_api *qf_cuda_plugin_api(int abi) {
    return abi == QF_CUDA_ABI ? &the_api : NULL;
}
