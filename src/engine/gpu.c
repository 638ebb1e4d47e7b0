/* gpu.c: the engine side of the CUDA seam. It decides the device of a context (once, here),
 * turns a qf_context into what the backend takes (a model view, a KV cache view, parameters)
 * and calls the plugin's function table (kernels/cuda/cuda_backend.h). The backend never
 * sees a qf_context. */
#include "engine/gpu.h"

#include <stdlib.h>
#include <string.h>

#include "engine/kv_codes.h"
#include "util/par.h"

/* dict rows on the GPU are encoded by the host cache's own encoder (c->kv.dict[s]) */
static void dict_encode(void *user, int s, int il, const float *rows, int64_t n, uint8_t *codes) {
    qf_context *c = user;
    struct qf_kv_dict_bind *d = c->kv.dict[s];
    const int hd = c->kv.head_dim;
    const size_t rb = c->kv.row_bytes[s];
    for (int64_t r = 0; r < n; r++) {
        qf_kv_omp_one(&d->layer[il], rows + (size_t)r * hd, d->sparsity, d->scratch, d->idx, d->coef_buf);
        qf_kv_code_pack(d->idx, d->coef_buf, d->sparsity, d->n_atoms, d->coef, codes + (size_t)r * rb);
    }
}

/* the view of kv; *atoms_out holds the per-layer atom pointers of dict streams (free it) */
static qf_status kv_view(qf_context *c, const qf_kv_cache *kv, qf_gpu_kv *v, const float ***atoms_out,
                         qf_error *err) {
    memset(v, 0, sizeof *v);
    *atoms_out = NULL;
    v->n_layer = kv->n_layer, v->n_ctx = kv->n_ctx, v->n_head_kv = kv->n_head_kv, v->head_dim = kv->head_dim;
    v->mode[0] = kv->mode_k, v->mode[1] = kv->mode_v;
    v->encode = dict_encode, v->encode_user = c;
    v->omp = (qf_gpu_dict_omp){QF_KV_OMP_STOP_CORR, QF_KV_OMP_STOP_PIVOT};
    v->k_prerope = kv->k_prerope, v->n_sink = kv->n_sink, v->n_window = kv->n_window;
    const float **at = NULL;
    for (int s = 0; s < 2; s++) {
        v->row_bytes[s] = kv->row_bytes[s];
        v->int8_scale[s] = kv->int8_scale[s], v->int8_inv_scale[s] = kv->int8_inv_scale[s];
        v->int8_layout[s] = kv->int8_layout[s];
        const struct qf_kv_rq_bind *r = kv->rq[s];
        if (v->mode[s] == QF_KV_RQ && r)
            v->rq[s] = (qf_gpu_kv_rq){.bits = r->bits, .row_bytes = r->row_bytes, .levels = r->levels,
                                      .mean = r->mean, .cs = r->cs, .inv_cs = r->inv_cs,
                                      .klt_enc = r->klt_enc, .klt_dec = r->klt_dec,
                                      .klt_sigma = r->klt_sigma, .klt_levels = r->klt_levels,
                                      .klt_width = r->klt_width, .pred = r->pred, .pred_on = r->pred_on};
        const struct qf_kv_dict_bind *d = kv->dict[s];
        if (v->mode[s] != QF_KV_DICT || !d) continue;
        /* the backend decodes the v1 code layout and its rows come from dict_encode (fixed
         * sparsity): a v2 payload (packed indices, error-bounded codes) stays on the CPU */
        if (d->fmt.packed || d->tol) {
            free(at);
            return qf_fail(err, QF_ERR_DEVICE, "the CUDA backend runs kv-dict v1 caches only (this one is v2: packed "
                                               "indices or error-bounded codes); use --device cpu");
        }
        /* [4][n_layer]: the atoms of K, of V, then their Gram matrices */
        if (!at && !(at = calloc((size_t)4 * kv->n_layer, sizeof *at)))
            return qf_fail(err, QF_ERR_NOMEM, "out of memory");
        for (int l = 0; l < kv->n_layer; l++) {
            at[(size_t)s * kv->n_layer + l] = d->layer[l].atoms;
            at[(size_t)(2 + s) * kv->n_layer + l] = d->layer[l].gram;
        }
        v->n_atoms[s] = d->n_atoms, v->sparsity[s] = d->sparsity, v->coef_q8[s] = d->coef == QF_KV_COEF_Q8;
        v->atoms[s] = at + (size_t)s * kv->n_layer;
        v->gram[s] = at + (size_t)(2 + s) * kv->n_layer;
    }
    *atoms_out = at;
    return QF_OK;
}

static void dequant_row(qf_type t, const void *src, float *dst, int64_t n) { qf_dequantize_row_ref(t, src, dst, n); }

qf_status qf_gpu_attach(qf_context *c, qf_error *err) {
    const qf_context_params *p = &c->params;
    c->gpu = NULL;
    /* the reference path is the CPU oracle by definition */
    if (p->reference || p->device == QF_DEVICE_CPU) return QF_OK;
    const char *why = NULL;
    const qf_cuda_api *a = qf_cuda_api_get(&why);
    const bool ok = a && a->available();
    if (!ok) {
        if (p->device == QF_DEVICE_AUTO) return QF_OK;
        if (!a) return qf_fail(err, QF_ERR_DEVICE, "--device cuda: the CUDA backend is not available: %s", why);
        return qf_fail(err, QF_ERR_DEVICE, "--device cuda: no CUDA GPU is available (cudaGetDeviceCount found none)");
    }
    /* a KV rotation the backend cannot run: auto stays on the CPU, an explicit cuda is refused */
    if (p->kv_rot != QF_KV_ROT_NONE && !qf_cuda_backend_kv_rot_ok(p->kv_rot)) {
        if (p->device == QF_DEVICE_AUTO) return QF_OK;
        return qf_fail(err, QF_ERR_UNSUPPORTED,
                       "--kv-rot %s is not supported by the CUDA backend of this build: use --device cpu (or auto, "
                       "which runs it on the CPU)",
                       qf_kv_rot_name(p->kv_rot));
    }
    const qf_model *m = c->model;
    /* every family runs on the GPU (docs/families.md); the per-layer windows and the MoE routing
     * are the CPU's own definitions (qf_hparams_layer_swa, qf_moe_route) */
    int *win = calloc((size_t)m->hp.n_layer, sizeof *win);
    if (!win) return qf_fail(err, QF_ERR_NOMEM, "out of memory");
    for (int il = 0; il < m->hp.n_layer; il++) win[il] = qf_hparams_layer_swa(&m->hp, il) ? m->hp.n_swa : 0;
    qf_gpu_model gm = {.hp = &m->hp, .path = m->path, .tok_embd = &m->tok_embd, .output_norm = &m->output_norm,
                       .output = &m->output, .rope_freqs = &m->rope_freqs, .layers = m->layers,
                       .dequant_row = dequant_row, .layer_window = win, .moe_route = qf_moe_route};
    qf_gpu_params gp = {.n_ctx = p->n_ctx, .n_batch = c->n_batch, .kv_rot = p->kv_rot,
                        .device_index = qf_par_device_index(), .knobs = p->cuda, .canonical = c->canon};
    qf_gpu_kv kv;
    const float **at;
    qf_status st = kv_view(c, &c->kv, &kv, &at, err);
    if (!st) st = a->ctx_new(&gm, &kv, &gp, &c->gpu, err);
    free(at);
    free(win);
    return st;
}

void qf_gpu_detach(qf_context *c) {
    if (!c->gpu) return;
    qf_cuda_api_get(NULL)->ctx_free(c->gpu);
    c->gpu = NULL;
}

qf_status qf_gpu_decode(qf_context *c, const int32_t *tokens, int n, int pos0, float *logits, int logits_from,
                        qf_error *err) {
    return qf_cuda_api_get(NULL)->decode(c->gpu, c->tap, tokens, n, pos0, logits, logits_from, NULL, NULL, err);
}

bool qf_gpu_topk_ok(const qf_context *c, const qf_sampler_params *sp) {
    return c->gpu && !c->tap && (sp->temp <= 0 || (sp->top_k >= 1 && sp->top_k <= QF_GPU_TOPK_MAX));
}

qf_status qf_gpu_decode_topk(qf_context *c, int32_t token, int pos, float temp, int k, qf_gpu_topk *out, qf_error *err) {
    if (!c->gpu) return qf_fail(err, QF_ERR_DEVICE, "decode_topk: the context does not run on the GPU");
    qf_status st = qf_decode_check(c, &token, 1, pos, err);
    if (st) return st;
    return qf_cuda_api_get(NULL)->decode_topk(c->gpu, token, pos, temp, temp > 0 ? k : 0, out, err);
}

qf_status qf_gpu_set_kv(qf_context *c, const qf_kv_cache *kv, qf_error *err) {
    if (!c->gpu) return QF_OK;
    qf_gpu_kv v;
    const float **at;
    qf_status st = kv_view(c, kv, &v, &at, err);
    if (!st) st = qf_cuda_api_get(NULL)->set_kv(c->gpu, &v, err);
    free(at);
    return st;
}

qf_status qf_decode_nll(qf_context *c, const int32_t *tokens, int n, int pos0, int from, const int32_t *targets,
                        double *nll, qf_error *err) {
    if (!c->gpu) return qf_fail(err, QF_ERR_DEVICE, "decode_nll: the context does not run on the GPU");
    if (n <= 0 || n > c->n_batch || pos0 < 0 || pos0 + n > c->params.n_ctx)
        return qf_fail(err, QF_ERR_ARG, "decode_nll: %d tokens at %d exceed the context (n_batch %d, n_ctx %d)", n,
                       pos0, c->n_batch, c->params.n_ctx);
    if (from < 0 || from >= n) return qf_fail(err, QF_ERR_ARG, "decode_nll: first scored row %d outside [0, %d)", from, n);
    const int nv = c->model->hp.n_vocab;
    for (int t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= nv)
            return qf_fail(err, QF_ERR_ARG, "decode_nll: token id %d out of range [0, %d)", tokens[t], nv);
    for (int r = from; r < n; r++)
        if (targets[r - from] < 0 || targets[r - from] >= nv)
            return qf_fail(err, QF_ERR_ARG, "decode_nll: target token %d out of range", targets[r - from]);
    return qf_cuda_api_get(NULL)->decode(c->gpu, c->tap, tokens, n, pos0, NULL, from, targets, nll, err);
}

bool qf_context_gpu_info(const qf_context *c, qf_cuda_info *out) {
    memset(out, 0, sizeof *out);
    if (!c->gpu) return false;
    qf_cuda_api_get(NULL)->info(c->gpu, out);
    return true;
}

/* the plugin and a view of c's kv-rq cache for the test ops below (free *at after) */
static qf_status rq_op_view(qf_context *c, int il, const char *what, const qf_cuda_api **a, qf_gpu_kv *v,
                            const float ***at, qf_error *err) {
    const char *why = NULL;
    *a = qf_cuda_api_get(&why);
    *at = NULL;
    if (!*a || !(*a)->available()) return qf_fail(err, QF_ERR_DEVICE, "no CUDA backend or GPU: %s", why ? why : "no GPU");
    if (c->kv.mode_k != QF_KV_RQ || c->kv.mode_v != QF_KV_RQ || il < 0 || il >= c->kv.n_layer)
        return qf_fail(err, QF_ERR_ARG, "kv-rq %s op: the context has no kv-rq cache, or layer %d is out of range", what, il);
    return kv_view(c, &c->kv, v, at, err);
}

qf_status qf_gpu_op_kv_rq_encode(qf_context *c, int il, int n_pos, const float *k, const float *v, uint8_t *k_rows,
                                 uint8_t *v_rows, qf_error *err) {
    const qf_cuda_api *a;
    qf_gpu_kv view;
    const float **at;
    qf_status st = rq_op_view(c, il, "encode", &a, &view, &at, err);
    if (!st) st = a->op_kv_rq_encode(&view, il, n_pos, k, v, k_rows, v_rows, err);
    free(at);
    return st;
}

qf_status qf_gpu_op_kv_rq_decode(qf_context *c, int il, int n_pos, float *k_out, float *v_out, qf_error *err) {
    const qf_cuda_api *a;
    qf_gpu_kv view;
    const float **at;
    qf_status st = rq_op_view(c, il, "decode", &a, &view, &at, err);
    if (!st) st = a->op_kv_rq_decode(&view, il, n_pos, c->kv.data[0][il], c->kv.data[1][il], k_out, v_out, err);
    free(at);
    return st;
}
