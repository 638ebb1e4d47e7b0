/* artifact_bind.c: bind a loaded, verified KV artifact to an inference context: read the
 * kv-int8 scales or the kv-dict dictionaries out of its payload, validate every shape
 * against the context's model, and rebuild the context's KV cache in the artifact's storage
 * mode (kv_cache.c); unbind restores the context's own modes. Engine side: no forge code. */
#include "qforge/artifact_bind.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "engine/kv_rq_klt.h"
#include "format/kv_rq_row.h"
#include "engine/gpu.h"

/* Swap in a freshly built cache with n_sink / n_window exact positions (kv_cache.c); the old
 * one is freed only when the new one exists. */
static qf_status rebuild_exact(qf_context *c, const qf_kv_stream_spec spec[2], int n_sink, int n_window,
                               qf_error *err) {
    /* the GPU cache runs every kv-int8 row layout (static, static-rot, token-rot, token: the
     * same bytes as the CPU cache, test_cuda op_kv_int8_dict) */
    qf_kv_cache fresh;
    qf_status st = qf_kv_cache_init_spec(&fresh, &c->model->hp, c->params.n_ctx, spec, err);
    if (st) return st;
    if ((st = qf_kv_cache_set_swa(&fresh, &c->model->hp, c->n_batch, err))) { /* sliding-window rings */
        qf_kv_cache_free(&fresh);
        return st;
    }
    if ((n_sink || n_window) && (st = qf_kv_cache_set_exact(&fresh, n_sink, n_window, err))) {
        qf_kv_cache_free(&fresh);
        return st;
    }
    /* a GPU context gets the same cache on the device (scales, dictionaries uploaded) */
    if (c->gpu && (st = qf_gpu_set_kv(c, &fresh, err))) {
        qf_kv_cache_free(&fresh);
        return st;
    }
    qf_kv_cache_free(&c->kv);
    c->kv = fresh;
    c->params.kv_k = spec[0].mode;
    c->params.kv_v = spec[1].mode;
    return QF_OK;
}

static qf_status rebuild(qf_context *c, const qf_kv_stream_spec spec[2], qf_error *err) {
    return rebuild_exact(c, spec, 0, 0, err);
}

/* kv-rq (include/qforge/kv_rq.h has the payload): every shape checked against this model;
 * in_place: the cache reads the predictor and format 3's matrices from p (they stay p's) */
static qf_status bind_rq(qf_context *c, const qf_payload *p, bool in_place, qf_error *err) {
    const qf_hparams *hp = &c->model->hp;
    int64_t fmt = 0, S = -1, R = -1, L = hp->n_layer, H = hp->n_head_kv, D = hp->head_dim, prerope = 0;
    const char *rot = qf_payload_get_string(p, "rotation");
    /* format 1: bits 2..6, K after RoPE; 2: also 1-bit rows and 'k_prerope' (required) */
    /* 3: the same with a learned transform and per-coordinate widths (rotation "klt") */
    if (!qf_payload_get_int(p, "format", &fmt) || fmt < 1 || fmt > 3)
        return qf_fail(err, QF_ERR_ARTIFACT_VERSION,
                       "kv-rq payload: 'format' %lld: this build reads formats 1, 2 and 3 (an artifact from a newer "
                       "qforge? re-calibrate, or use that version)",
                       (long long)fmt);
    if (fmt >= 2 && (!qf_payload_get_int(p, "k_prerope", &prerope) || prerope < 0 || prerope > 1))
        return qf_fail(err, QF_ERR_ARTIFACT_CORRUPT, "kv-rq payload: 'k_prerope': expected an int 0 or 1 (format 2)");
    if (!rot || strcmp(rot, fmt == 3 ? "klt" : "hadamard"))
        return qf_fail(err, QF_ERR_ARTIFACT_CORRUPT, "kv-rq payload: 'rotation': expected \"%s\" (format %lld)",
                       fmt == 3 ? "klt" : "hadamard", (long long)fmt);
    if (!qf_payload_get_int(p, "n_sink", &S) || !qf_payload_get_int(p, "n_window", &R) || S < 0 || R < 0 ||
        S > c->params.n_ctx || R > c->params.n_ctx)
        return qf_fail(err, QF_ERR_ARTIFACT_CORRUPT, "kv-rq payload: 'n_sink'/'n_window': expected ints in [0, %d]",
                       c->params.n_ctx);
    int *bits[2] = {calloc((size_t)L, sizeof(int)), calloc((size_t)L, sizeof(int))};
    const float *arr[2][3] = {{0}};
    static const char *const an[3] = {"levels", "mean", "cs"};
    qf_status st = QF_OK;
    if (!bits[0] || !bits[1]) st = qf_fail(err, QF_ERR_NOMEM, "kv-rq: out of memory");
    for (int s = 0; s < 2 && !st; s++) {
        char name[32];
        snprintf(name, sizeof name, "%c_bits", s ? 'v' : 'k');
        const qf_payload_entry *e = qf_payload_get(p, name);
        if (!e || e->type != QF_PAYLOAD_U8 || e->n_dims != 1 || e->shape[0] != L) {
            st = qf_fail(err, QF_ERR_ARTIFACT_CORRUPT, "kv-rq payload: '%s': expected u8 [%lld] (n_layer of this model)",
                         name, (long long)L);
            break;
        }
        for (int l = 0; l < L; l++) bits[s][l] = e->bytes[l];
        for (int l = 0; l < L && !st; l++)
            if (fmt < 2 && bits[s][l] < 2)
                st = qf_fail(err, QF_ERR_ARTIFACT_CORRUPT, "kv-rq payload: '%s' layer %d: %d bits (format 1 has 2..6 or 16)",
                             name, l, bits[s][l]);
        for (int a = 0; a < 3 && !st; a++) {
            snprintf(name, sizeof name, "%c_%s", s ? 'v' : 'k', an[a]);
            int64_t last = a == 0 ? QF_KV_RQ_MAX_LEVELS : D;
            e = qf_payload_get(p, name);
            if (!e || e->type != QF_PAYLOAD_F32 || e->n_dims != 3 || e->shape[0] != L || e->shape[1] != H ||
                e->shape[2] != last)
                st = qf_fail(err, QF_ERR_ARTIFACT_CORRUPT,
                             "kv-rq payload: '%s': expected f32 [%lld, %lld, %lld] (n_layer, n_head_kv, %s of this model)",
                             name, (long long)L, (long long)H, (long long)last, a == 0 ? "64 levels" : "head_dim");
            else arr[s][a] = e->f32;
        }
    }
    const float *pred = NULL; /* format 2: optional V-from-K predictor */
    const qf_payload_entry *pe = fmt >= 2 ? qf_payload_get(p, "v_pred") : NULL;
    if (!st && pe) {
        if (pe->type != QF_PAYLOAD_F32 || pe->n_dims != 3 || pe->shape[0] != L || pe->shape[1] != H * D ||
            pe->shape[2] != H * D)
            st = qf_fail(err, QF_ERR_ARTIFACT_CORRUPT, "kv-rq payload: 'v_pred': expected f32 [%lld, %lld, %lld]",
                         (long long)L, (long long)(H * D), (long long)(H * D));
        else if (!prerope)
            st = qf_fail(err, QF_ERR_ARTIFACT_CORRUPT, "kv-rq payload: 'v_pred' needs 'k_prerope' 1");
        else pred = pe->f32;
    }
    /* format 3: the transform-coding arrays (kv_rq.h), shapes here, values in the cache bind */
    const void *klt[2][5] = {{0}};
    static const char *const kn[5] = {"enc", "dec", "sigma", "levels", "width"};
    for (int s = 0; s < 2 && !st && fmt == 3; s++)
        for (int a = 0; a < 5 && !st; a++) {
            char name[32];
            snprintf(name, sizeof name, "%c_klt_%s", s ? 'v' : 'k', kn[a]);
            const qf_payload_entry *e = qf_payload_get(p, name);
            int64_t last = a < 2 ? D : a == 3 ? QF_KV_RQ_MAX_LEVELS : 0;
            int nd = last ? 4 : 3;
            if (!e || e->type != (a == 4 ? QF_PAYLOAD_U8 : QF_PAYLOAD_F32) || e->n_dims != nd || e->shape[0] != L ||
                e->shape[1] != H || e->shape[2] != D || (last && e->shape[3] != last))
                st = qf_fail(err, QF_ERR_ARTIFACT_CORRUPT, "kv-rq payload: '%s': expected %s [%lld, %lld, %lld%s] (format 3)",
                             name, a == 4 ? "u8" : "f32", (long long)L, (long long)H, (long long)D,
                             a < 2 ? ", head_dim" : a == 3 ? ", 64" : "");
            else klt[s][a] = a == 4 ? (const void *)e->bytes : (const void *)e->f32;
        }
    if (!st) {
        qf_kv_stream_spec spec[2];
        for (int s = 0; s < 2; s++)
            spec[s] = (qf_kv_stream_spec){.mode = QF_KV_RQ, .rq_bits = bits[s], .rq_levels = arr[s][0],
                                          .rq_mean = arr[s][1], .rq_cs = arr[s][2], .prerope = s == 0 && prerope,
                                          .rq_pred = s == 1 ? pred : NULL, .rq_klt_enc = klt[s][0],
                                          .rq_klt_dec = klt[s][1], .rq_klt_sigma = klt[s][2],
                                          .rq_klt_levels = klt[s][3], .rq_klt_width = klt[s][4],
                                          .rq_in_place = in_place};
        st = rebuild_exact(c, spec, (int)S, (int)R, err);
        if (st == QF_ERR_ARG) err->code = st = QF_ERR_ARTIFACT_CORRUPT; /* bad bits, codebook or scale */
    }
    free(bits[0]), free(bits[1]);
    return st;
}

static qf_status int8_scales(const qf_payload *p, const char *name, const qf_hparams *hp, float **out,
                             qf_error *err) {
    *out = NULL;
    const qf_payload_entry *e = qf_payload_get(p, name);
    if (!e || e->type != QF_PAYLOAD_F32)
        return qf_fail(err, QF_ERR_ARTIFACT_CORRUPT, "kv-int8 payload: '%s': expected an f32 array", name);
    size_t L = (size_t)hp->n_layer, H = (size_t)hp->n_head_kv, D = (size_t)hp->head_dim;
    bool per_channel = e->n_dims == 3 && e->shape[0] == (int64_t)L && e->shape[1] == (int64_t)H &&
                       e->shape[2] == (int64_t)D;
    bool per_head = e->n_dims == 2 && e->shape[0] == (int64_t)L && e->shape[1] == (int64_t)H;
    if (!per_channel && !per_head)
        return qf_fail(err, QF_ERR_ARTIFACT_CORRUPT,
                       "kv-int8 payload: '%s': expected shape [%zu, %zu, %zu] or [%zu, %zu] for this model "
                       "(n_layer, n_head_kv, head_dim), got %d dims [%lld, ...]",
                       name, L, H, D, L, H, e->n_dims, (long long)e->shape[0]);
    float *s = malloc(L * H * D * sizeof(float));
    if (!s) return qf_fail(err, QF_ERR_NOMEM, "kv-int8: out of memory");
    for (size_t i = 0; i < L * H; i++)
        for (size_t d = 0; d < D; d++) s[i * D + d] = per_channel ? e->f32[i * D + d] : e->f32[i];
    *out = s;
    return QF_OK;
}

static const char *const int8_layout_names[QF_KV_INT8_LAYOUT_COUNT] = {"static", "static-rot", "token-rot", "token", "ec-rot"};

/* "k_layout" / "v_layout" (absent: the original static layout) */
static qf_status int8_layout(const qf_payload *p, const char *name, int *out, qf_error *err) {
    *out = QF_KV_INT8_STATIC;
    const qf_payload_entry *e = qf_payload_get(p, name);
    if (!e) return QF_OK;
    if (e->type == QF_PAYLOAD_STRING)
        for (int i = 0; i < QF_KV_INT8_LAYOUT_COUNT; i++)
            if (!strcmp(e->str, int8_layout_names[i])) return *out = i, QF_OK;
    return qf_fail(err, QF_ERR_ARTIFACT_CORRUPT,
                   "kv-int8 payload: '%s': expected \"static\", \"static-rot\", \"token-rot\", \"token\" or \"ec-rot\"", name);
}

static qf_status bind_int8(qf_context *c, const qf_payload *p, qf_error *err) {
    float *ks = NULL, *vs = NULL;
    int kl = 0, vl = 0;
    qf_status st = int8_layout(p, "k_layout", &kl, err);
    if (!st) st = int8_layout(p, "v_layout", &vl, err);
    if (!st) st = int8_scales(p, "k_scale", &c->model->hp, &ks, err);
    if (!st) st = int8_scales(p, "v_scale", &c->model->hp, &vs, err);
    if (!st) {
        qf_kv_stream_spec spec[2] = {{.mode = QF_KV_INT8, .int8_scale = ks, .int8_layout = kl},
                                     {.mode = QF_KV_INT8, .int8_scale = vs, .int8_layout = vl}};
        st = rebuild(c, spec, err);
    }
    free(ks);
    free(vs);
    return st;
}

static qf_status bind_dict(qf_context *c, const qf_payload *p, qf_error *err) {
    const qf_hparams *hp = &c->model->hp;
    int64_t na = 0, s = 0;
    const char *coef = qf_payload_get_string(p, "coef");
    if (!qf_payload_get_int(p, "n_atoms", &na) || !qf_payload_get_int(p, "sparsity", &s) || !coef)
        return qf_fail(err, QF_ERR_ARTIFACT_CORRUPT,
                       "kv-dict payload: expected int 'n_atoms', int 'sparsity' and string 'coef'");
    qf_kv_coef cf;
    if (!strcmp(coef, "f16")) cf = QF_KV_COEF_F16;
    else if (!strcmp(coef, "q8")) cf = QF_KV_COEF_Q8;
    else return qf_fail(err, QF_ERR_ARTIFACT_CORRUPT, "kv-dict payload: 'coef': expected \"f16\" or \"q8\", got \"%s\"", coef);
    if (na < 1 || na > QF_KV_MAX_ATOMS || s < 1 || s > hp->head_dim || s > na || s > QF_KV_MAX_SPARSITY)
        return qf_fail(err, QF_ERR_ARTIFACT_CORRUPT, "kv-dict payload: n_atoms %lld / sparsity %lld out of range",
                       (long long)na, (long long)s);
    /* payload versions: 1 (no 'version' key): post-RoPE K, byte indices, fixed sparsity;
     * 2: bit-packed indices, 'k_prerope' (keys stored before RoPE), optional per-layer error
     * bounds 'k_tol'/'v_tol' (f32 [n_layer]) */
    int64_t version = 1, prerope = 0;
    if (qf_payload_get(p, "version") && !qf_payload_get_int(p, "version", &version))
        return qf_fail(err, QF_ERR_ARTIFACT_CORRUPT, "kv-dict payload: 'version': expected an int");
    if (version < 1 || version > 2)
        return qf_fail(err, QF_ERR_UNSUPPORTED, "kv-dict payload version %lld: this build reads versions 1 and 2",
                       (long long)version);
    if (version == 2 && qf_payload_get(p, "k_prerope") && !qf_payload_get_int(p, "k_prerope", &prerope))
        return qf_fail(err, QF_ERR_ARTIFACT_CORRUPT, "kv-dict payload: 'k_prerope': expected an int");
    if (version == 2 && c->gpu)
        return qf_fail(err, QF_ERR_UNSUPPORTED,
                       "kv-dict v2 (bit-packed indices%s) runs on the CPU only: the CUDA backend decodes v1 codes; "
                       "rerun with --device cpu",
                       prerope ? ", keys stored before RoPE" : "");
    const float *tol[2] = {NULL, NULL};
    for (int sidx = 0; sidx < 2 && version == 2; sidx++) {
        const qf_payload_entry *e = qf_payload_get(p, sidx ? "v_tol" : "k_tol");
        if (!e) continue;
        if (e->type != QF_PAYLOAD_F32 || e->n_dims != 1 || e->shape[0] != hp->n_layer)
            return qf_fail(err, QF_ERR_ARTIFACT_CORRUPT, "kv-dict payload: '%s': expected f32 [%d] (n_layer)",
                           sidx ? "v_tol" : "k_tol", hp->n_layer);
        tol[sidx] = e->f32;
    }
    const float **atoms[2];
    atoms[0] = calloc((size_t)hp->n_layer, sizeof(float *));
    atoms[1] = calloc((size_t)hp->n_layer, sizeof(float *));
    qf_status st = QF_OK;
    if (!atoms[0] || !atoms[1]) {
        st = qf_fail(err, QF_ERR_NOMEM, "kv-dict: out of memory");
        goto done;
    }
    for (int sidx = 0; sidx < 2 && !st; sidx++)
        for (int l = 0; l < hp->n_layer && !st; l++) {
            char name[32];
            snprintf(name, sizeof name, "%c.%d", sidx ? 'v' : 'k', l);
            const qf_payload_entry *e = qf_payload_get(p, name);
            if (!e || e->type != QF_PAYLOAD_F32 || e->n_dims != 2 || e->shape[0] != na || e->shape[1] != hp->head_dim)
                st = qf_fail(err, QF_ERR_ARTIFACT_CORRUPT,
                             "kv-dict payload: '%s': expected f32 [%lld, %d] (n_atoms, head_dim of this model)", name,
                             (long long)na, hp->head_dim);
            else atoms[sidx][l] = e->f32;
        }
    if (!st) {
        qf_kv_stream_spec spec[2];
        for (int sidx = 0; sidx < 2; sidx++)
            spec[sidx] = (qf_kv_stream_spec){.mode = QF_KV_DICT, .n_atoms = (int)na, .sparsity = (int)s, .coef = cf,
                                             .atoms = (const float *const *)atoms[sidx], .packed = version == 2,
                                             .tol = tol[sidx], .prerope = sidx == 0 && prerope != 0};
        st = rebuild(c, spec, err);
        /* a zero or non-finite atom (FORMAT), a bound out of range (ARG): the artifact is corrupt */
        if (st == QF_ERR_ARG || st == QF_ERR_FORMAT) err->code = st = QF_ERR_ARTIFACT_CORRUPT;
    }
done:
    free(atoms[0]);
    free(atoms[1]);
    return st;
}

static qf_status bind_payload(qf_context *c, qf_artifact_kind kind, const qf_payload *p, bool in_place,
                              qf_error *err) {
    qf_error local; /* err is optional: the helpers below re-label err->code */
    if (!err) err = &local;
    if (kind == QF_ARTIFACT_AWQ)
        return qf_fail(err, QF_ERR_UNSUPPORTED,
                       "an awq artifact is not a KV artifact: it names a re-quantized GGUF file to load instead");
    if (kind != QF_ARTIFACT_KV_INT8 && kind != QF_ARTIFACT_KV_DICT && kind != QF_ARTIFACT_KV_RQ)
        return qf_fail(err, QF_ERR_ARG, "unknown artifact kind %d", (int)kind);
    if (c->params.kv_rot != QF_KV_ROT_NONE)
        return qf_fail(err, QF_ERR_ARG,
                       "binding %s: --kv-rot %s applies to the plain KV cache types only; a KV artifact defines its "
                       "own storage (and rotation): drop --kv-rot to run the artifact",
                       qf_artifact_kind_name(kind), qf_kv_rot_name(c->params.kv_rot));
    qf_kv_mode bk = c->bound ? c->base_kv_k : c->params.kv_k, bv = c->bound ? c->base_kv_v : c->params.kv_v;
    qf_status st = kind == QF_ARTIFACT_KV_INT8 ? bind_int8(c, p, err)
                   : kind == QF_ARTIFACT_KV_RQ ? bind_rq(c, p, in_place, err)
                                               : bind_dict(c, p, err);
    if (st) return qf_error_prefix(err, "binding %s: ", qf_artifact_kind_name(kind));
    c->base_kv_k = bk, c->base_kv_v = bv;
    c->bound = 1 + (int)kind;
    return QF_OK;
}

qf_status qf_context_bind_payload(qf_context *c, qf_artifact_kind kind, const qf_payload *p, qf_error *err) {
    return bind_payload(c, kind, p, false, err);
}

qf_status qf_context_bind_payload_in_place(qf_context *c, qf_artifact_kind kind, const qf_payload *p, qf_error *err) {
    return bind_payload(c, kind, p, true, err);
}

qf_status qf_context_bind_artifact(qf_context *c, const qf_artifact *a, qf_error *err) {
    qf_status st = qf_artifact_check(a, qf_model_sha256(c->model), err);
    if (st) return st;
    return qf_context_bind_payload(c, a->cert.kind, &a->payload, err);
}

qf_status qf_context_unbind(qf_context *c, qf_error *err) {
    if (!c->bound) return QF_OK;
    qf_kv_stream_spec spec[2] = {{.mode = c->base_kv_k}, {.mode = c->base_kv_v}};
    qf_status st = rebuild(c, spec, err);
    if (st) return st;
    c->bound = 0;
    return QF_OK;
}

bool qf_artifact_cpu_only(const qf_artifact *a) {
    int64_t v = 1;
    return a && a->cert.kind == QF_ARTIFACT_KV_DICT && qf_payload_get_int(&a->payload, "version", &v) && v >= 2;
}

bool qf_context_bound(const qf_context *c, qf_artifact_kind *kind) {
    if (c->bound && kind) *kind = (qf_artifact_kind)(c->bound - 1);
    return c->bound != 0;
}

/* ---- bits per element, one function per kind ---- */

/* kv-int8: one byte per element; the static scales are a fixed table (not counted) */
static double bits_int8(const qf_payload *p, const qf_hparams *hp, int n_ctx) {
    (void)n_ctx;
    if (!qf_payload_get(p, "k_scale") || !qf_payload_get(p, "v_scale") || hp->head_dim < 1) return NAN;
    return 8.0;
}

/* kv-dict: one packed code per row of head_dim elements (what the cache stores, padding included) */
static double bits_dict(const qf_payload *p, const qf_hparams *hp, int n_ctx) {
    (void)n_ctx;
    int64_t na = 0, s = 0;
    const char *coef = qf_payload_get_string(p, "coef");
    if (!qf_payload_get_int(p, "n_atoms", &na) || !qf_payload_get_int(p, "sparsity", &s) || !coef) return NAN;
    if (na < 1 || na > QF_KV_MAX_ATOMS || s < 1 || s > na || hp->head_dim < 1) return NAN;
    qf_kv_coef cf = !strcmp(coef, "q8") ? QF_KV_COEF_Q8 : QF_KV_COEF_F16;
    return 8.0 * (double)qf_kv_code_bytes((int)na, (int)s, cf) / hp->head_dim;
}

/* kv-rq: every row's bytes (codes + scale) per element, averaged over layers and K/V, plus the
 * f16 sink and window copies spread over n_ctx */
static double bits_rq(const qf_payload *p, const qf_hparams *hp, int n_ctx) {
    int64_t S = 0, R = 0;
    size_t nk = 0, nv = 0;
    const uint8_t *kb = qf_payload_get_bytes(p, "k_bits", &nk), *vb = qf_payload_get_bytes(p, "v_bits", &nv);
    int L = hp->n_layer;
    if (!qf_payload_get_int(p, "n_sink", &S) || !qf_payload_get_int(p, "n_window", &R) || !kb || !vb ||
        nk != (size_t)L || nv != (size_t)L || L < 1 || S < 0 || R < 0 || n_ctx < 1)
        return NAN;
    double b = 0;
    for (int l = 0; l < L; l++) {
        size_t rk = qf_kv_rq_any_row_bytes(hp->head_dim, kb[l]), rv = qf_kv_rq_any_row_bytes(hp->head_dim, vb[l]);
        if (!rk || !rv) return NAN;
        b += 8.0 * (double)(rk + rv) / hp->head_dim;
    }
    return b / (2.0 * L) + 16.0 * (double)(S + R) / n_ctx;
}

double qf_artifact_bits_per_element(qf_artifact_kind kind, const qf_payload *p, const qf_hparams *hp, int n_ctx) {
    if (!p || !hp) return NAN;
    switch (kind) {
    case QF_ARTIFACT_KV_INT8: return bits_int8(p, hp, n_ctx);
    case QF_ARTIFACT_KV_DICT: return bits_dict(p, hp, n_ctx);
    case QF_ARTIFACT_KV_RQ: return bits_rq(p, hp, n_ctx);
    default: return NAN; /* awq is a weight artifact; a new KV kind adds its case here */
    }
}

double qf_artifact_table_bytes(qf_artifact_kind kind, const qf_payload *p) {
    if (!p || kind == QF_ARTIFACT_AWQ) return NAN;
    double b = 0;
    for (size_t i = 0; i < p->n; i++) {
        const qf_payload_entry *e = &p->entries[i];
        if (e->type == QF_PAYLOAD_F32) b += 4.0 * (double)e->count;
        else if (e->type == QF_PAYLOAD_U8 || e->type == QF_PAYLOAD_I8) b += (double)e->count;
    }
    return b;
}
