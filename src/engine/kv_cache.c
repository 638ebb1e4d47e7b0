/* kv_cache.c: the KV cache and its storage modes.
 *
 * f32 and f16 store the vectors as they are; q8_0 and q4_0 store ggml blocks of 32 along
 * head_dim exactly like llama.cpp's -ctk/-ctv (the uncalibrated baselines); int8 stores one
 * signed byte per element with the static per-channel scales a certified kv-int8 artifact
 * binds; dict stores one packed sparse code per row (atom indices + coefficients, the
 * qf_kv_code_pack layout), OMP-encoded on write against the dictionaries a certified kv-dict
 * artifact binds and reconstructed on read, so the cache really holds only the codes.
 * int8, dict and rq caches are built only through qf_kv_cache_init_spec, with their data;
 * rq stores kv-rq rows (format/kv_rq_row.h, engine/kv_rq.c) with a bit width per layer.
 * Any mode can keep exact f16 copies of the attention sinks and of a recent window
 * (qf_kv_cache_set_exact; forward.c chooses exact or stored per (query, key) position).
 * --kv-rot hadamard (plain modes): each row is rotated by the normalized Walsh-Hadamard
 * transform before it is quantized and rotated back (H is its own inverse) after it is
 * dequantized, as llama.cpp does for quantized caches: outlier channels are spread over the
 * whole row, so one block scale fits every element better. Attention sees the same vectors. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "engine/kv_codes.h"
#include "engine/kv_rq.h"
#include "kernels/hadamard.h"
#include "kernels/vecmath.h"

#define EC_GROUP_MAX 256 /* kv-int8 ec-rot: elements per entropy-coded group of kv heads (ec_group) */
#define EC_ROW_MAX 1024  /* the codec's longest row: head_dim up to 1024 (then one head per group) */

static const char *const mode_names[QF_KV_MODE_COUNT] = {"f32", "f16", "q8_0", "q4_0", "int8", "dict", "rq"};

const char *qf_kv_mode_name(qf_kv_mode m) {
    return (unsigned)m < QF_KV_MODE_COUNT ? mode_names[m] : "unknown";
}

bool qf_kv_mode_from_name(const char *name, qf_kv_mode *out) {
    for (int i = 0; i < QF_KV_MODE_COUNT; i++)
        if (strcasecmp(name, mode_names[i]) == 0) {
            *out = (qf_kv_mode)i;
            return true;
        }
    return false;
}

qf_type qf_kv_mode_row_type(qf_kv_mode m) {
    switch (m) {
    case QF_KV_F32: return QF_TYPE_F32;
    case QF_KV_F16: return QF_TYPE_F16;
    case QF_KV_Q8_0: return QF_TYPE_Q8_0;
    case QF_KV_Q4_0: return QF_TYPE_Q4_0;
    default: return QF_TYPE_COUNT;
    }
}

/* kv-int8 layouts whose rows are stored rotated by qf_hadamard */
static bool int8_layout_rotated(int lay) {
    return lay == QF_KV_INT8_STATIC_ROT || lay == QF_KV_INT8_TOKEN_ROT || lay == QF_KV_INT8_EC_ROT;
}

static void dict_bind_free(struct qf_kv_dict_bind *d, int n_layer) {
    if (!d) return;
    if (d->layer)
        for (int l = 0; l < n_layer; l++) qf_kv_dict_free(&d->layer[l]);
    if (d->gram_d)
        for (int l = 0; l < n_layer; l++) free(d->gram_d[l]);
    free(d->gram_d);
    free(d->layer);
    free(d->tol);
    free(d->scratch);
    free(d->idx);
    free(d->coef_buf);
    free(d);
}

static qf_status dict_bind_new(const qf_kv_stream_spec *sp, const qf_hparams *hp, const char *sname,
                               struct qf_kv_dict_bind **out, qf_error *err) {
    *out = NULL;
    int hd = hp->head_dim;
    if (!sp->atoms || sp->n_atoms < 1 || sp->n_atoms > QF_KV_MAX_ATOMS || sp->sparsity < 1 ||
        sp->sparsity > hd || sp->sparsity > QF_KV_MAX_SPARSITY || sp->sparsity > sp->n_atoms ||
        (sp->coef != QF_KV_COEF_F16 && sp->coef != QF_KV_COEF_Q8))
        return qf_fail(err, QF_ERR_ARG,
                       "dict KV cache (%s): expected 1..%d atoms, sparsity 1..min(atoms, head_dim %d, %d) and "
                       "coefficients f16 or q8; got %d atoms, sparsity %d",
                       sname, QF_KV_MAX_ATOMS, hd, QF_KV_MAX_SPARSITY, sp->n_atoms, sp->sparsity);
    if (sp->tol)
        for (int l = 0; l < hp->n_layer; l++)
            if (!(sp->tol[l] >= 0 && sp->tol[l] < 1))
                return qf_fail(err, QF_ERR_ARG, "dict KV cache (%s): layer %d error bound %g: expected [0, 1)",
                               sname, l, (double)sp->tol[l]);
    struct qf_kv_dict_bind *d = calloc(1, sizeof *d);
    if (!d) goto oom;
    d->n_atoms = sp->n_atoms, d->sparsity = sp->sparsity, d->coef = sp->coef;
    d->fmt = (qf_kv_code_fmt){.n_atoms = sp->n_atoms, .sparsity = sp->sparsity, .coef = sp->coef, .packed = sp->packed};
    d->layer = calloc((size_t)hp->n_layer, sizeof *d->layer);
    if (sp->n_atoms <= QF_KV_CACHE_GRAM_D_ATOMS && !(d->gram_d = calloc((size_t)hp->n_layer, sizeof *d->gram_d))) goto oom;
    d->scratch = malloc(qf_kv_omp_scratch_floats(sp->n_atoms, sp->sparsity) * sizeof(float));
    d->idx = malloc((size_t)sp->sparsity * sizeof(uint16_t));
    d->coef_buf = malloc((size_t)sp->sparsity * sizeof(float));
    if (sp->tol && (d->tol = malloc((size_t)hp->n_layer * sizeof(float))))
        memcpy(d->tol, sp->tol, (size_t)hp->n_layer * sizeof(float));
    if (!d->layer || !d->scratch || !d->idx || !d->coef_buf || (sp->tol && !d->tol)) goto oom;
    for (int l = 0; l < hp->n_layer; l++) {
        if (!sp->atoms[l]) {
            dict_bind_free(d, hp->n_layer);
            return qf_fail(err, QF_ERR_ARG, "dict KV cache (%s): layer %d has no dictionary", sname, l);
        }
        qf_status st = qf_kv_dict_init(&d->layer[l], sp->atoms[l], sp->n_atoms, hd, err);
        if (st) {
            dict_bind_free(d, hp->n_layer);
            return qf_error_prefix(err, "dict KV cache (%s): layer %d: ", sname, l);
        }
        if (d->gram_d) {
            if (!(d->gram_d[l] = malloc(sizeof(double) * (size_t)sp->n_atoms * (size_t)sp->n_atoms))) goto oom;
            qf_kv_gram_d(&d->layer[l], d->gram_d[l]);
        }
    }
    *out = d;
    return QF_OK;
oom:
    dict_bind_free(d, hp->n_layer);
    return qf_fail(err, QF_ERR_NOMEM, "dict KV cache (%s): out of memory for the dictionaries", sname);
}

static void rq_bind_free(struct qf_kv_rq_bind *r) {
    if (!r) return;
    free(r->bits), free(r->row_bytes), free(r->levels), free(r->mean), free(r->cs), free(r->inv_cs), free(r->scratch);
    free(r->own_pred), free(r->pred_on), free(r->pred_buf);
    free(r->own_enc), free(r->own_dec), free(r->own_levels), free(r->klt_sigma), free(r->klt_width), free(r->klt_decT);
    free(r);
}

/* Format 3: copy (or, sp->rq_in_place, take in place enc, dec and levels) and check the transform-coding
 * parameters (kv_rq_klt.h) of every non-f16 layer. */
static qf_status rq_bind_klt(struct qf_kv_rq_bind *r, const qf_kv_stream_spec *sp, int L, int H, int hd,
                             const char *sname, qf_error *err) {
    if (!sp->rq_klt_enc || !sp->rq_klt_dec || !sp->rq_klt_sigma || !sp->rq_klt_levels || !sp->rq_klt_width)
        return qf_fail(err, QF_ERR_ARG, "rq KV cache (%s): format 3 needs enc, dec, sigma, width and levels", sname);
    size_t lh = (size_t)L * H, nm = lh * hd * hd, nv = lh * hd, nl = nv * QF_KV_RQ_MAX_LEVELS;
    bool copy = !sp->rq_in_place;
    if ((copy && (!(r->own_enc = malloc(nm * sizeof(float))) || !(r->own_dec = malloc(nm * sizeof(float))) ||
                  !(r->own_levels = malloc(nl * sizeof(float))))) ||
        !(r->klt_sigma = malloc(nv * sizeof(float))) || !(r->klt_width = malloc(nv)) ||
        !(r->klt_decT = malloc(nm * sizeof(float))))
        return qf_fail(err, QF_ERR_NOMEM, "rq KV cache (%s): out of memory for the transform", sname);
    if (copy) {
        memcpy(r->own_enc, sp->rq_klt_enc, nm * sizeof(float));
        memcpy(r->own_dec, sp->rq_klt_dec, nm * sizeof(float));
        memcpy(r->own_levels, sp->rq_klt_levels, nl * sizeof(float));
    }
    r->klt_enc = copy ? r->own_enc : sp->rq_klt_enc;
    r->klt_dec = copy ? r->own_dec : sp->rq_klt_dec;
    r->klt_levels = copy ? r->own_levels : sp->rq_klt_levels;
    for (size_t o = 0; o < lh; o++) /* the decoder's columns, contiguous (read in non-f16 layers only) */
        for (int i = 0; i < hd && r->bits[o / (size_t)H] != QF_KV_RQ_BITS_F16; i++)
            for (int j = 0; j < hd; j++)
                r->klt_decT[o * hd * hd + (size_t)j * hd + i] = r->klt_dec[o * hd * hd + (size_t)i * hd + j];
    memcpy(r->klt_sigma, sp->rq_klt_sigma, nv * sizeof(float));
    memcpy(r->klt_width, sp->rq_klt_width, nv);
    for (int l = 0; l < L; l++) {
        if (r->bits[l] == QF_KV_RQ_BITS_F16) continue;
        for (int h = 0; h < H; h++) {
            size_t o = (size_t)l * H + h;
            qf_kv_rq_klt c = {.head_dim = hd, .mean = r->mean + o * hd, .enc = r->klt_enc + o * hd * hd,
                              .dec = r->klt_dec + o * hd * hd, .sigma = r->klt_sigma + o * hd,
                              .levels = r->klt_levels + o * hd * QF_KV_RQ_MAX_LEVELS, .width = r->klt_width + o * hd};
            const char *why = qf_kv_rq_klt_check(&c, qf_kv_rq_klt_eighths(r->bits[l]) * hd / 8);
            if (why)
                return qf_fail(err, QF_ERR_ARG,
                               "rq KV cache (%s): layer %d head %d: format-3 %s invalid (widths 0..%d summing to %d bits, "
                               "ascending finite levels, finite matrices, sigma > 0)",
                               sname, l, h, why, QF_KV_RQ_KLT_MAX_WIDTH, qf_kv_rq_klt_eighths(r->bits[l]) * hd / 8);
        }
    }
    return QF_OK;
}

static qf_status rq_bind_new(const qf_kv_stream_spec *sp, const qf_hparams *hp, const char *sname,
                             struct qf_kv_rq_bind **out, qf_error *err) {
    *out = NULL;
    int L = hp->n_layer, H = hp->n_head_kv, hd = hp->head_dim;
    if (!sp->rq_bits || !sp->rq_levels || !sp->rq_mean || !sp->rq_cs)
        return qf_fail(err, QF_ERR_ARG, "rq KV cache (%s): bit widths, codebooks, means and channel scales are required",
                       sname);
    if (qf_kv_rq_row_bytes(hd, QF_KV_RQ_MIN_BITS) == 0)
        return qf_fail(err, QF_ERR_UNSUPPORTED, "rq KV cache needs head_dim a power of two in [%d, %d] (it is %d)",
                       QF_KV_RQ_MIN_HEAD_DIM, QF_KV_RQ_MAX_HEAD_DIM, hd);
    size_t nv = (size_t)L * H * hd, nl = (size_t)L * H * QF_KV_RQ_MAX_LEVELS;
    struct qf_kv_rq_bind *r = calloc(1, sizeof *r);
    if (!r || !(r->bits = malloc((size_t)L * sizeof(int))) || !(r->row_bytes = malloc((size_t)L * sizeof(size_t))) ||
        !(r->levels = malloc(nl * sizeof(float))) || !(r->mean = malloc(nv * sizeof(float))) ||
        !(r->cs = malloc(nv * sizeof(float))) || !(r->inv_cs = malloc(nv * sizeof(float))) ||
        !(r->scratch = malloc(2 * (size_t)hd * sizeof(float)))) {
        rq_bind_free(r);
        return qf_fail(err, QF_ERR_NOMEM, "rq KV cache (%s): out of memory", sname);
    }
    qf_status st = QF_OK;
    for (int l = 0; l < L && !st; l++) {
        int b = sp->rq_bits[l];
        if (!qf_kv_rq_bits_ok(b) && !(sp->rq_klt_enc && qf_kv_rq_any_row_bytes(hd, b))) { /* format 3: fractional rates */
            st = qf_fail(err, QF_ERR_ARG, "rq KV cache (%s): layer %d has %d bits (expected 1..6 or 16)", sname, l, b);
            break;
        }
        r->bits[l] = b;
        r->row_bytes[l] = qf_kv_rq_any_row_bytes(hd, b);
        for (int h = 0; h < H && b <= QF_KV_RQ_MAX_BITS && !st; h++) {
            const float *lv = sp->rq_levels + ((size_t)l * H + h) * QF_KV_RQ_MAX_LEVELS;
            for (int k = 0; k < (1 << b); k++)
                if (!isfinite(lv[k]) || (k > 0 && !(lv[k] > lv[k - 1])))
                    st = qf_fail(err, QF_ERR_ARG, "rq KV cache (%s): layer %d head %d: codebook not finite and ascending",
                                 sname, l, h);
        }
    }
    memcpy(r->levels, sp->rq_levels, nl * sizeof(float));
    for (size_t i = 0; i < nv && !st; i++) {
        float m = sp->rq_mean[i], c = sp->rq_cs[i];
        if (!isfinite(m) || !isfinite(c) || c == 0 || !isfinite(1.0f / c))
            st = qf_fail(err, QF_ERR_ARG, "rq KV cache (%s): mean/channel scale %zu is %g/%g (expected finite, scale "
                                          "nonzero)",
                         sname, i, (double)m, (double)c);
        r->mean[i] = m, r->cs[i] = c, r->inv_cs[i] = 1.0f / c;
    }
    if (!st && sp->rq_pred) {
        size_t HD = (size_t)H * hd, np = (size_t)L * HD * HD;
        if ((!sp->rq_in_place && !(r->own_pred = malloc(np * sizeof(float)))) ||
            !(r->pred_on = calloc((size_t)L, sizeof(bool))) || !(r->pred_buf = malloc(2 * HD * sizeof(float))))
            st = qf_fail(err, QF_ERR_NOMEM, "rq KV cache (%s): out of memory for the V predictor", sname);
        if (!st && r->own_pred) memcpy(r->own_pred, sp->rq_pred, np * sizeof(float));
        r->pred = r->own_pred ? r->own_pred : sp->rq_pred;
        for (int l = 0; l < L && !st; l++) { /* every coefficient finite; pred_on: any nonzero */
            const float *P = r->pred + (size_t)l * HD * HD;
            bool fin = true, on = false;
            for (size_t i = 0; i < HD * HD; i++) fin &= isfinite(P[i]) != 0, on |= P[i] != 0;
            size_t bad = 0;
            while (!fin && isfinite(P[bad])) bad++; /* the first non-finite one, for the message */
            if (!fin)
                st = qf_fail(err, QF_ERR_ARG, "rq KV cache (%s): V predictor coefficient %zu is not finite", sname,
                             (size_t)l * HD * HD + bad);
            r->pred_on[l] = on;
        }
    }
    if (!st && (sp->rq_klt_enc || sp->rq_klt_dec || sp->rq_klt_sigma || sp->rq_klt_levels || sp->rq_klt_width))
        st = rq_bind_klt(r, sp, L, H, hd, sname, err);
    if (st) {
        rq_bind_free(r);
        return st;
    }
    *out = r;
    return QF_OK;
}

/* The decoded K rows (every kv head, as stored: before RoPE) of (layer, position p) into kh
 * [n_head_kv * head_dim] (kv->rq[0] must be bound). */
static void rq_k_hat(const qf_kv_cache *kv, int layer, int p, float *kh);

static qf_kv_rq_codec rq_codec(const struct qf_kv_rq_bind *r, const qf_kv_cache *kv, int layer, int h);
static size_t layer_row_bytes(const qf_kv_cache *kv, int s, int layer);

static void rq_k_hat(const qf_kv_cache *kv, int layer, int p, float *kh) {
    int nh = kv->n_head_kv, hd = kv->head_dim;
    size_t rb = layer_row_bytes(kv, 0, layer);
    const uint8_t *base = kv->data[0][layer] + (size_t)p * nh * rb;
    for (int h = 0; h < nh; h++) {
        qf_kv_rq_codec c = rq_codec(kv->rq[0], kv, layer, h);
        qf_kv_rq_decode(&c, base + (size_t)h * rb, kh + (size_t)h * hd);
    }
}

static qf_kv_rq_codec rq_codec(const struct qf_kv_rq_bind *r, const qf_kv_cache *kv, int layer, int h) {
    size_t lh = (size_t)layer * kv->n_head_kv + h;
    return (qf_kv_rq_codec){.head_dim = kv->head_dim,
                            .bits = r->bits[layer],
                            .levels = r->levels + lh * QF_KV_RQ_MAX_LEVELS,
                            .mean = r->mean + lh * kv->head_dim,
                            .cs = r->cs + lh * kv->head_dim,
                            .inv_cs = r->inv_cs + lh * kv->head_dim,
                            .klt = r->klt_enc && r->bits[layer] != QF_KV_RQ_BITS_F16
                                       ? (qf_kv_rq_klt){.head_dim = kv->head_dim,
                                                        .mean = r->mean + lh * kv->head_dim,
                                                        .enc = r->klt_enc + lh * kv->head_dim * kv->head_dim,
                                                        .dec = r->klt_dec + lh * kv->head_dim * kv->head_dim,
                                                        .decT = r->klt_decT + lh * kv->head_dim * kv->head_dim,
                                                        .sigma = r->klt_sigma + lh * kv->head_dim,
                                                        .levels = r->klt_levels + lh * kv->head_dim * QF_KV_RQ_MAX_LEVELS,
                                                        .width = r->klt_width + lh * kv->head_dim}
                                       : (qf_kv_rq_klt){0}};
}

/* row bytes of (stream, layer): per layer for rq, per stream otherwise */
static size_t layer_row_bytes(const qf_kv_cache *kv, int s, int layer) {
    return kv->rq[s] ? kv->rq[s]->row_bytes[layer] : kv->row_bytes[s];
}

qf_status qf_kv_cache_init_spec(qf_kv_cache *kv, const qf_hparams *hp, int n_ctx, const qf_kv_stream_spec spec[2],
                                qf_error *err) {
    memset(kv, 0, sizeof *kv);
    if (hp->n_layer < 1 || hp->n_layer > 4096 || hp->n_head_kv < 1 || hp->head_dim < 1 || n_ctx < 1)
        return qf_fail(err, QF_ERR_ARG, "KV cache: %d layers, %d kv heads, head_dim %d, n_ctx %d: expected positive sizes",
                       hp->n_layer, hp->n_head_kv, hp->head_dim, n_ctx);
    kv->mode_k = spec[0].mode;
    kv->mode_v = spec[1].mode;
    kv->n_layer = hp->n_layer;
    kv->n_ctx = n_ctx;
    kv->n_head_kv = hp->n_head_kv;
    kv->head_dim = hp->head_dim;
    kv->k_prerope = spec[0].prerope;
    size_t n_scale = (size_t)hp->n_layer * hp->n_head_kv * hp->head_dim;
    for (int s = 0; s < 2; s++) {
        const qf_kv_stream_spec *sp = &spec[s];
        const char *sname = s ? "V" : "K";
        qf_status st;
        size_t rb;
        if ((unsigned)sp->mode >= QF_KV_MODE_COUNT) {
            qf_kv_cache_free(kv);
            return qf_fail(err, QF_ERR_ARG, "unknown KV cache mode %d", (int)sp->mode);
        }
        if (sp->mode == QF_KV_INT8) {
            if (!sp->int8_scale) {
                qf_kv_cache_free(kv);
                return qf_fail(err, QF_ERR_ARG, "int8 KV cache (%s): no scales given", sname);
            }
            kv->int8_scale[s] = malloc(n_scale * sizeof(float));
            kv->int8_inv_scale[s] = malloc(n_scale * sizeof(float));
            if (!kv->int8_scale[s] || !kv->int8_inv_scale[s]) goto oom;
            for (size_t i = 0; i < n_scale; i++) {
                float v = sp->int8_scale[i];
                if (!(v > 0) || !isfinite(v)) {
                    qf_kv_cache_free(kv);
                    return qf_fail(err, QF_ERR_ARG, "int8 KV cache (%s): scale %zu is %g, expected a finite value > 0",
                                   sname, i, (double)v);
                }
                kv->int8_scale[s][i] = v;
            }
            qf_kv_int8_inv_scale(kv->int8_scale[s], kv->int8_inv_scale[s], (int)n_scale);
            if (sp->int8_layout < 0 || sp->int8_layout >= QF_KV_INT8_LAYOUT_COUNT) {
                qf_kv_cache_free(kv);
                return qf_fail(err, QF_ERR_ARG, "int8 KV cache (%s): unknown row layout %d", sname, sp->int8_layout);
            }
            bool ec = sp->int8_layout == QF_KV_INT8_EC_ROT;
            bool rot = int8_layout_rotated(sp->int8_layout);
            bool tok = sp->int8_layout == QF_KV_INT8_TOKEN_ROT || sp->int8_layout == QF_KV_INT8_TOKEN;
            if ((rot && !qf_hadamard_size_ok(hp->head_dim)) ||
                (tok && (hp->head_dim < 8 || hp->head_dim % 8 || hp->head_dim > 1024)) ||
                (ec && (hp->head_dim < 16 || hp->head_dim > 1024))) {
                qf_kv_cache_free(kv);
                return qf_fail(err, QF_ERR_UNSUPPORTED,
                               "int8 KV cache (%s): the %s row layout needs head_dim %s (it is %d)", sname,
                               ec ? "entropy-coded" : tok ? "per-token" : "rotated",
                               ec ? "a power of two in [16, 1024]"
                                  : rot ? "a power of two" : "a multiple of 8 in [8, 1024]",
                               hp->head_dim);
            }
            kv->int8_layout[s] = (uint8_t)sp->int8_layout;
            /* the write buffer holds one rotated row, or one entropy-coded group of rows */
            if (rot && !kv->int8_buf && !(kv->int8_buf = malloc(EC_ROW_MAX * sizeof(float)))) goto oom;
            rb = (size_t)hp->head_dim;
        } else if (sp->mode == QF_KV_DICT) {
            if ((st = dict_bind_new(sp, hp, sname, &kv->dict[s], err))) {
                qf_kv_cache_free(kv);
                return st;
            }
            rb = qf_kv_fmt_bytes(&kv->dict[s]->fmt);
        } else if (sp->mode == QF_KV_RQ) {
            if ((st = rq_bind_new(sp, hp, sname, &kv->rq[s], err))) {
                qf_kv_cache_free(kv);
                return st;
            }
            rb = 0;
            for (int l = 0; l < hp->n_layer; l++) rb = kv->rq[s]->row_bytes[l] > rb ? kv->rq[s]->row_bytes[l] : rb;
        } else {
            rb = qf_row_bytes(qf_kv_mode_row_type(sp->mode), hp->head_dim);
            if (rb == 0) {
                qf_kv_cache_free(kv);
                return qf_fail(err, QF_ERR_UNSUPPORTED,
                               "KV cache type %s needs head_dim to be a multiple of 32 (it is %d)",
                               qf_kv_mode_name(sp->mode), hp->head_dim);
            }
        }
        if (s == 1 && kv->rq[1] && kv->rq[1]->pred && (!kv->rq[0] || !kv->k_prerope)) {
            qf_kv_cache_free(kv);
            return qf_fail(err, QF_ERR_ARG, "rq KV cache: a V predictor needs an rq K stream stored before RoPE");
        }
        kv->row_bytes[s] = rb;
        kv->data[s] = calloc((size_t)(unsigned)kv->n_layer, sizeof(uint8_t *));
        if (!kv->data[s]) goto oom;
        for (int l = 0; l < hp->n_layer; l++)
            /* QF_KV_ROW_PAD: kv_rq_lin.c reads each code with one 16-bit load */
            if (!(kv->data[s][l] = qf_malloc_aligned(layer_row_bytes(kv, s, l) * (size_t)n_ctx * (size_t)hp->n_head_kv +
                                                     QF_KV_ROW_PAD)))
                goto oom;
    }
    return QF_OK;
oom:
    qf_kv_cache_free(kv);
    return qf_fail(err, QF_ERR_NOMEM, "out of memory allocating the KV cache (%d positions)", n_ctx);
}

qf_status qf_kv_cache_init(qf_kv_cache *kv, const qf_hparams *hp, int n_ctx, qf_kv_mode mk,
                           qf_kv_mode mv, qf_error *err) {
    memset(kv, 0, sizeof *kv);
    qf_kv_mode modes[2] = {mk, mv};
    for (int s = 0; s < 2; s++)
        if (modes[s] == QF_KV_INT8 || modes[s] == QF_KV_DICT || modes[s] == QF_KV_RQ)
            return qf_fail(err, QF_ERR_ARTIFACT_NOT_CERTIFIED,
                           "the %s KV cache mode runs only a certified kv-%s artifact: create the context in a "
                           "plain mode and bind the artifact (qforge ... --artifact X.qfa)",
                           qf_kv_mode_name(modes[s]), qf_kv_mode_name(modes[s]));
    qf_kv_stream_spec spec[2] = {{.mode = mk}, {.mode = mv}};
    return qf_kv_cache_init_spec(kv, hp, n_ctx, spec, err);
}

static void exact_free(qf_kv_cache *kv) {
    for (int s = 0; s < 2; s++) {
        for (int l = 0; l < kv->n_layer; l++) {
            if (kv->sink[s]) free(kv->sink[s][l]);
            if (kv->win[s]) free(kv->win[s][l]);
        }
        free(kv->sink[s]), free(kv->win[s]);
        kv->sink[s] = kv->win[s] = NULL;
    }
    if (kv->win_pos)
        for (int l = 0; l < kv->n_layer; l++) free(kv->win_pos[l]);
    free(kv->win_pos);
    kv->win_pos = NULL;
    kv->n_sink = kv->n_window = 0;
}

qf_status qf_kv_cache_set_exact(qf_kv_cache *kv, int n_sink, int n_window, qf_error *err) {
    exact_free(kv);
    if (n_sink < 0 || n_window < 0 || n_sink > kv->n_ctx || n_window > kv->n_ctx)
        return qf_fail(err, QF_ERR_ARG, "KV cache: %d sink and %d window positions: expected each in [0, %d] (n_ctx)",
                       n_sink, n_window, kv->n_ctx);
    size_t row = (size_t)kv->n_head_kv * kv->head_dim;
    int L = kv->n_layer;
    for (int s = 0; s < 2; s++) {
        if (n_sink && !(kv->sink[s] = calloc((size_t)L, sizeof(uint16_t *)))) goto oom;
        if (n_window && !(kv->win[s] = calloc((size_t)L, sizeof(uint16_t *)))) goto oom;
        for (int l = 0; l < L; l++) {
            if (n_sink && !(kv->sink[s][l] = calloc((size_t)n_sink * row, sizeof(uint16_t)))) goto oom;
            if (n_window && !(kv->win[s][l] = calloc((size_t)n_window * row, sizeof(uint16_t)))) goto oom;
        }
    }
    if (n_window) {
        if (!(kv->win_pos = calloc((size_t)L, sizeof(int32_t *)))) goto oom;
        for (int l = 0; l < L; l++) {
            if (!(kv->win_pos[l] = malloc((size_t)n_window * sizeof(int32_t)))) goto oom;
            for (int i = 0; i < n_window; i++) kv->win_pos[l][i] = -1;
        }
    }
    kv->n_sink = n_sink, kv->n_window = n_window;
    return QF_OK;
oom:
    exact_free(kv);
    return qf_fail(err, QF_ERR_NOMEM, "KV cache: out of memory for %d sink and %d window positions", n_sink, n_window);
}

void qf_kv_cache_push_window(qf_kv_cache *kv, int layer, int pos0, int n, const float *k, const float *v) {
    int R = kv->n_window;
    if (R <= 0) return;
    size_t row = (size_t)kv->n_head_kv * kv->head_dim;
    int first = n > R ? n - R : 0;
    for (int t = first; t < n; t++) {
        int p = pos0 + t, slot = p % R;
        for (int s = 0; s < 2; s++) {
            const float *src = (s ? v : k) + (size_t)t * row;
            uint16_t *dst = kv->win[s][layer] + (size_t)slot * row;
            for (size_t i = 0; i < row; i++) dst[i] = qf_f32_to_f16(src[i]);
        }
        kv->win_pos[layer][slot] = p;
    }
}

bool qf_kv_cache_exact_row(const qf_kv_cache *kv, int stream, int layer, int h, int p, float *dst) {
    size_t row = (size_t)kv->n_head_kv * kv->head_dim;
    const uint16_t *src = NULL;
    if (p >= 0 && p < kv->n_sink) src = kv->sink[stream][layer] + (size_t)p * row;
    else if (kv->n_window > 0 && p >= 0 && kv->win_pos[layer][p % kv->n_window] == p)
        src = kv->win[stream][layer] + (size_t)(p % kv->n_window) * row;
    if (!src) return false;
    src += (size_t)h * kv->head_dim;
    qf_dequantize_row(QF_TYPE_F16, src, dst, kv->head_dim); /* the F16C row converter: qf_f16_to_f32's bits */
    return true;
}

static void ring_free(qf_kv_cache *kv) {
    if (kv->ring_pos)
        for (int l = 0; l < kv->n_layer; l++) free(kv->ring_pos[l]);
    free(kv->ring_pos);
    free(kv->ring_rows);
    kv->ring_pos = NULL;
    kv->ring_rows = NULL;
}

qf_status qf_kv_cache_set_swa(qf_kv_cache *kv, const qf_hparams *hp, int n_batch, qf_error *err) {
    if (hp->swa == QF_SWA_NONE || hp->n_swa <= 0 || kv->ring_rows) return QF_OK;
    long long rows = (long long)hp->n_swa - 1 + (n_batch > 0 ? n_batch : kv->n_ctx);
    if (rows >= kv->n_ctx) return QF_OK;
    kv->ring_rows = calloc((size_t)kv->n_layer, sizeof *kv->ring_rows);
    kv->ring_pos = calloc((size_t)kv->n_layer, sizeof *kv->ring_pos);
    if (!kv->ring_rows || !kv->ring_pos) goto oom;
    for (int l = 0; l < kv->n_layer; l++) {
        if (!qf_hparams_layer_swa(hp, l)) continue;
        kv->ring_rows[l] = (int)rows;
        if (!(kv->ring_pos[l] = malloc((size_t)rows * sizeof(int32_t)))) goto oom;
        for (long long i = 0; i < rows; i++) kv->ring_pos[l][i] = -1;
        for (int s = 0; s < 2; s++) {
            uint8_t *d = qf_malloc_aligned(layer_row_bytes(kv, s, l) * (size_t)rows * (size_t)kv->n_head_kv);
            if (!d) goto oom;
            free(kv->data[s][l]);
            kv->data[s][l] = d;
        }
    }
    return QF_OK;
oom:
    /* the layers already shrunk keep working as rings; the rest stay full */
    if (kv->ring_rows)
        for (int l = 0; l < kv->n_layer; l++)
            if (kv->ring_rows[l] && !kv->ring_pos[l]) kv->ring_rows[l] = 0;
    return qf_fail(err, QF_ERR_NOMEM, "KV cache: out of memory for the sliding-window rings");
}

bool qf_kv_cache_ring_holds(const qf_kv_cache *kv, int lo, int hi, int *layer, int *pos) {
    if (!kv->ring_rows) return true;
    for (int l = 0; l < kv->n_layer; l++) {
        int R = kv->ring_rows[l];
        if (!R) continue;
        for (int p = lo < 0 ? 0 : lo; p < hi; p++)
            if (kv->ring_pos[l][p % R] != p) {
                *layer = l;
                *pos = p;
                return false;
            }
    }
    return true;
}

void qf_kv_cache_free(qf_kv_cache *kv) {
    exact_free(kv);
    qf_kv_rq_lin_free(kv);
    ring_free(kv);
    free(kv->rq_par);
    kv->rq_par = NULL, kv->rq_par_n = 0;
    for (int s = 0; s < 2; s++) {
        if (kv->data[s])
            for (int l = 0; l < kv->n_layer; l++) free(kv->data[s][l]);
        free(kv->data[s]);
        free(kv->int8_scale[s]);
        free(kv->int8_inv_scale[s]);
        dict_bind_free(kv->dict[s], kv->n_layer);
        rq_bind_free(kv->rq[s]);
        kv->rq[s] = NULL;
        kv->data[s] = NULL;
        kv->int8_scale[s] = kv->int8_inv_scale[s] = NULL;
        kv->dict[s] = NULL;
    }
    free(kv->rot_buf);
    kv->rot_buf = NULL;
    kv->rot = QF_KV_ROT_NONE;
    free(kv->int8_buf);
    kv->int8_buf = NULL;
    kv->int8_layout[0] = kv->int8_layout[1] = QF_KV_INT8_STATIC;
}

const char *qf_kv_rot_name(qf_kv_rot r) {
    return r == QF_KV_ROT_NONE ? "none" : r == QF_KV_ROT_HADAMARD ? "hadamard" : "unknown";
}

bool qf_kv_rot_from_name(const char *name, qf_kv_rot *out) {
    if (!name) return false;
    if (!strcasecmp(name, "none")) *out = QF_KV_ROT_NONE;
    else if (!strcasecmp(name, "hadamard")) *out = QF_KV_ROT_HADAMARD;
    else return false;
    return true;
}

qf_status qf_kv_cache_set_rot(qf_kv_cache *kv, qf_kv_rot rot, qf_error *err) {
    if (rot == QF_KV_ROT_NONE) {
        free(kv->rot_buf);
        kv->rot_buf = NULL;
        kv->rot = rot;
        return QF_OK;
    }
    if (rot != QF_KV_ROT_HADAMARD) return qf_fail(err, QF_ERR_ARG, "unknown KV rotation %d", (int)rot);
    for (int s = 0; s < 2; s++) {
        qf_kv_mode m = s ? kv->mode_v : kv->mode_k;
        if (qf_kv_mode_row_type(m) == QF_TYPE_COUNT)
            return qf_fail(err, QF_ERR_ARG,
                           "--kv-rot %s applies to the plain KV cache types (f32, f16, q8_0, q4_0), not to %s "
                           "(a certified artifact defines its own storage)",
                           qf_kv_rot_name(rot), qf_kv_mode_name(m));
    }
    if (!qf_hadamard_size_ok(kv->head_dim))
        return qf_fail(err, QF_ERR_UNSUPPORTED,
                       "--kv-rot %s needs head_dim to be a power of two (this model's head_dim is %d)",
                       qf_kv_rot_name(rot), kv->head_dim);
    float *buf = malloc((size_t)kv->head_dim * sizeof(float));
    if (!buf) return qf_fail(err, QF_ERR_NOMEM, "out of memory for the KV rotation buffer");
    free(kv->rot_buf);
    kv->rot_buf = buf;
    kv->rot = rot;
    return QF_OK;
}

/* kv-int8 "ec-rot" codes g consecutive kv heads of one token as ONE entropy-coded row of
 * g * head_dim elements (g * head_dim bytes, where those heads' rows lie in the cache): a wider
 * row shares one step exponent and lets bits flow to the head that needs them. g is the largest
 * divisor of n_head_kv with g * head_dim <= EC_GROUP_MAX (1 when head_dim is larger). A read
 * of head h decodes its group up to the end of h. */
static int ec_group(const qf_kv_cache *kv) {
    int g = 1;
    for (int d = 1; d <= kv->n_head_kv; d++)
        if (kv->n_head_kv % d == 0 && (size_t)d * kv->head_dim <= EC_GROUP_MAX) g = d;
    return g;
}

/* kv-rq: encode positions [p0, p1) of a batch (src [n][n_head_kv][head_dim], dst its first
 * row) with the caller's scratch: pred 2 * n_head_kv * head_dim floats, sc 2 * head_dim. Each
 * position is encoded on its own (V's predictor reads the same token's stored K, written
 * first), so ranges may run on different threads and give the same bytes. */
static void rq_rows(const qf_kv_cache *kv, int stream, int layer, uint8_t *dst, const float *src, int p0, int p1,
                    float *pred, float *sc) {
    const struct qf_kv_rq_bind *r = kv->rq[stream];
    size_t rb = layer_row_bytes(kv, stream, layer);
    int hd = kv->head_dim, nh = kv->n_head_kv, HD = nh * hd;
    bool pr = r->pred && r->pred_on[layer];
    size_t slot0 = (size_t)(dst - kv->data[stream][layer]) / ((size_t)nh * rb); /* K of a token: same slot */
    for (int p = p0; p < p1; p++) {
        const float *x = src + (size_t)p * HD;
        if (pr) { /* code V minus its prediction from this token's stored K (written first) */
            float *kh = pred, *res = pred + HD;
            rq_k_hat(kv, layer, (int)(slot0 + (size_t)p), kh);
            /* each sum in order over K's values, as the GPU's k_kv_rq_vres adds them */
            qf_vec_rows_dot(r->pred + (size_t)layer * HD * HD, (size_t)HD, HD, kh, HD, res);
            for (int i = 0; i < HD; i++) res[i] = x[i] - res[i];
            x = res;
        }
        for (int h = 0; h < nh; h++) {
            qf_kv_rq_codec c = rq_codec(r, kv, layer, h);
            size_t i = (size_t)p * nh + h;
            qf_kv_rq_encode(&c, x + (size_t)h * hd, sc, dst + i * rb);
        }
    }
}

/* encode n_pos consecutive positions' rows (src [n_pos][n_head_kv][head_dim]) at dst */
static void write_rows(qf_kv_cache *kv, int stream, int layer, uint8_t *dst, const float *src, int n_pos) {
    qf_kv_mode mode = stream ? kv->mode_v : kv->mode_k;
    size_t rb = layer_row_bytes(kv, stream, layer);
    int hd = kv->head_dim, nh = kv->n_head_kv;
    if (mode == QF_KV_RQ) {
        rq_rows(kv, stream, layer, dst, src, 0, n_pos, kv->rq[stream]->pred_buf, kv->rq[stream]->scratch);
        return;
    }
    if (mode == QF_KV_INT8) {
        /* one token's row of all kv heads is [n_head_kv * head_dim], as the scales are laid out */
        const float *inv = kv->int8_inv_scale[stream] + (size_t)layer * nh * hd;
        int lay = kv->int8_layout[stream];
        if (lay == QF_KV_INT8_STATIC) {
            for (int p = 0; p < n_pos; p++)
                qf_kv_int8_quantize(src + (size_t)p * nh * hd, inv, (int8_t *)(dst + (size_t)p * nh * rb), nh * hd);
            return;
        }
        if (lay == QF_KV_INT8_EC_ROT) {
            int g = ec_group(kv);
            for (int r = 0; r < n_pos * nh; r += g) {
                for (int k = 0; k < g; k++) {
                    memcpy(kv->int8_buf + (size_t)k * hd, src + (size_t)(r + k) * hd, (size_t)hd * sizeof(float));
                    qf_hadamard(kv->int8_buf + (size_t)k * hd, hd);
                }
                qf_kv_int8_ec_quantize(kv->int8_buf, dst + (size_t)r * rb, g * hd); /* rb == hd */
            }
            return;
        }
        for (int r = 0; r < n_pos * nh; r++) {
            const float *x = src + (size_t)r * hd;
            int8_t *q = (int8_t *)(dst + (size_t)r * rb);
            if (lay != QF_KV_INT8_TOKEN) {
                memcpy(kv->int8_buf, x, (size_t)hd * sizeof(float));
                qf_hadamard(kv->int8_buf, hd);
                x = kv->int8_buf;
            }
            if (lay == QF_KV_INT8_STATIC_ROT) qf_kv_int8_quantize(x, inv + (size_t)(r % nh) * hd, q, hd);
            else qf_kv_int8_token_quantize(x, q, hd);
        }
        return;
    }
    if (mode == QF_KV_DICT) {
        struct qf_kv_dict_bind *d = kv->dict[stream];
        const qf_kv_dict *L = &d->layer[layer];
        double tol = d->tol ? d->tol[layer] : 0;
        for (int r = 0; r < n_pos * nh; r++) {
            qf_kv_omp_gd(L, d->gram_d ? d->gram_d[layer] : NULL, src + (size_t)r * hd, NULL, d->sparsity, tol, d->scratch,
                         d->idx, d->coef_buf);
            qf_kv_fmt_pack(&d->fmt, d->idx, d->coef_buf, dst + (size_t)r * rb);
        }
        return;
    }
    if (kv->rot == QF_KV_ROT_HADAMARD) {
        for (int r = 0; r < n_pos * nh; r++) {
            memcpy(kv->rot_buf, src + (size_t)r * hd, (size_t)hd * sizeof(float));
            qf_hadamard(kv->rot_buf, hd);
            qf_quantize_row(qf_kv_mode_row_type(mode), kv->rot_buf, dst + (size_t)r * rb, hd);
        }
        return;
    }
    const qf_type t = qf_kv_mode_row_type(mode);
    for (int r = 0; r < n_pos * nh; r++) qf_quantize_row(t, src + (size_t)r * hd, dst + (size_t)r * rb, hd);
}

void qf_kv_cache_write_sinks(qf_kv_cache *kv, int stream, int layer, int pos, int n_pos, const float *src) {
    size_t row = (size_t)kv->n_head_kv * kv->head_dim;
    for (int p = pos; p < pos + n_pos && p < kv->n_sink; p++) {
        const float *s = src + (size_t)(p - pos) * row;
        uint16_t *d = kv->sink[stream][layer] + (size_t)p * row;
        for (size_t i = 0; i < row; i++) d[i] = qf_f32_to_f16(s[i]);
    }
}

void qf_kv_cache_write(qf_kv_cache *kv, int stream, int layer, int pos, int n_pos,
                       const float *src) {
    size_t rb = layer_row_bytes(kv, stream, layer);
    int hd = kv->head_dim, nh = kv->n_head_kv;
    size_t row = (size_t)nh * hd;
    /* the exact copies of sink positions (the window ring is filled after attention); a
     * pre-RoPE K cache gets its post-RoPE sink copies from the caller (qf_kv_cache_write_sinks) */
    if (!(stream == 0 && kv->k_prerope)) qf_kv_cache_write_sinks(kv, stream, layer, pos, n_pos, src);
    int R = kv->ring_rows ? kv->ring_rows[layer] : 0;
    if (!R) {
        write_rows(kv, stream, layer, kv->data[stream][layer] + (size_t)pos * nh * rb, src, n_pos);
        return;
    }
    /* a ring: at most the last R positions matter, in up to two runs of slots */
    int skip = n_pos > R ? n_pos - R : 0;
    for (int p = pos + skip; p < pos + n_pos;) {
        int slot = p % R, run = R - slot < pos + n_pos - p ? R - slot : pos + n_pos - p;
        write_rows(kv, stream, layer, kv->data[stream][layer] + (size_t)slot * nh * rb, src + (size_t)(p - pos) * row, run);
        for (int i = 0; i < run; i++) kv->ring_pos[layer][slot + i] = p + i;
        p += run;
    }
}

typedef struct {
    const qf_kv_cache *kv;
    int stream, layer, n_pos;
    uint8_t *dst;
    const float *src;
    float *buf; /* per thread: 2 HD + 2 hd floats */
    size_t per;
} rq_par_job;

static void rq_par_worker(void *arg, int ith, int nth) {
    rq_par_job *j = arg;
    int p0 = (int)((int64_t)j->n_pos * ith / nth), p1 = (int)((int64_t)j->n_pos * (ith + 1) / nth);
    float *b = j->buf + (size_t)ith * j->per;
    rq_rows(j->kv, j->stream, j->layer, j->dst, j->src, p0, p1, b, b + 2 * (size_t)j->kv->n_head_kv * j->kv->head_dim);
}

void qf_kv_cache_write_pool(qf_kv_cache *kv, int stream, int layer, int pos, int n_pos, const float *src, qf_pool *pool) {
    qf_kv_mode mode = stream ? kv->mode_v : kv->mode_k;
    int nth = pool ? qf_pool_size(pool) : 1;
    if (mode != QF_KV_RQ || nth < 2 || n_pos < 2 * nth || (kv->ring_rows && kv->ring_rows[layer])) {
        qf_kv_cache_write(kv, stream, layer, pos, n_pos, src);
        return;
    }
    size_t hd = (size_t)kv->head_dim, per = 2 * (size_t)kv->n_head_kv * hd + 2 * hd;
    if (kv->rq_par_n < per * (size_t)nth) {
        float *b = realloc(kv->rq_par, per * (size_t)nth * sizeof(float));
        if (!b) { /* no scratch for the threads: one thread, the same bytes */
            qf_kv_cache_write(kv, stream, layer, pos, n_pos, src);
            return;
        }
        kv->rq_par = b, kv->rq_par_n = per * (size_t)nth;
    }
    if (!(stream == 0 && kv->k_prerope)) qf_kv_cache_write_sinks(kv, stream, layer, pos, n_pos, src);
    size_t rb = layer_row_bytes(kv, stream, layer);
    rq_par_job j = {.kv = kv, .stream = stream, .layer = layer, .n_pos = n_pos, .src = src, .buf = kv->rq_par, .per = per,
                    .dst = kv->data[stream][layer] + (size_t)pos * kv->n_head_kv * rb};
    qf_pool_run(pool, rq_par_worker, &j);
}

/* decode n_pos consecutive stored rows of kv head h, starting at slot `slot` (position pos), into
 * dst. A predicted V stream adds each position's prediction from the K heads' stored rows,
 * decoded here one at a time or, with kdec, read from kdec (the K heads' rows decoded as this
 * function decodes them: head g's position p at kdec + g * kstride + p * head_dim) */
/* how many of `left` ec rows the decoders take next: 32 or 16 where the AVX-512 kernels run
 * (wide), else 4, then 1 */
static int ec_batch(int left, bool wide) { return wide && left >= 32 ? 32 : wide && left >= 16 ? 16 : left >= 4 ? 4 : 1; }

/* nr (4 or 1) ec rows of n bytes at gb, stride apart, into out[r] (n_out floats each): four
 * interleaved (qf_kv_int8_ec_dequantize4) or one */
static void ec_decode_few(const uint8_t *gb, size_t stride, int n, int nr, float *const *out, int n_out) {
    if (nr == 4) {
        const uint8_t *rows[4] = {gb, gb + stride, gb + 2 * stride, gb + 3 * stride};
        qf_kv_int8_ec_dequantize4(rows, n, out, n_out);
    } else qf_kv_int8_ec_dequantize(gb, n, out[0], n_out);
}

/* kv-int8 ec rows of a group of heads (n bytes each, stride apart from gb): heads [k0, k1) of
 * positions [0, n_pos) into dst + (k - k0) hstride + p hd; each row decoded up to head k1 - 1:
 * 32 or 16 rows at a time (qf_kv_int8_ec_dequantize16: AVX-512 lanes) while that many are
 * left and the CPU has the kernel and k1 hd <= EC_GROUP_MAX (every grouped row), the rest four
 * rows interleaved (qf_kv_int8_ec_dequantize4), then one at a time. The 16 / 32-row decodes
 * store each head's part straight into dst where hd % 16 == 0 (qf_kv_int8_ec_dequantize16_seg);
 * otherwise, and for the rest, the rows go through buf and are copied. */
static void ec_read(const uint8_t *gb, size_t stride, int n, int hd, int n_pos, int k0, int k1, float *dst,
                    size_t hstride) {
    _Static_assert(32 * EC_GROUP_MAX >= 4 * EC_ROW_MAX, "ec_read's scratch holds 4 rows of EC_ROW_MAX");
    float buf[32 * EC_GROUP_MAX]; /* decoded rows, n_out floats apart */
    float *out[32];
    const int n_out = k1 * hd;
    const bool wide = n_out <= EC_GROUP_MAX && qf_kv_int8_ec16_fast();
    for (int p = 0; p < n_pos;) {
        const int nr = ec_batch(n_pos - p, wide);
        if (nr >= 16 && hd % 16 == 0) { /* straight into dst: the kernel's 16-element blocks stay in one head */
            for (int r = 0; r < nr; r++) out[r] = dst + (size_t)(p + r) * hd;
            qf_kv_int8_ec_dequantize16_seg(gb + p * stride, stride, n, nr, out, n_out, k0 * hd, hd, hstride);
            p += nr;
            continue;
        }
        for (int r = 0; r < nr; r++) out[r] = buf + (size_t)r * n_out;
        if (nr >= 16) qf_kv_int8_ec_dequantize16(gb + p * stride, stride, n, nr, out, n_out);
        else ec_decode_few(gb + p * stride, stride, n, nr, out, n_out);
        for (int r = 0; r < nr; r++)
            for (int k = k0; k < k1; k++)
                memcpy(dst + (size_t)(k - k0) * hstride + (size_t)(p + r) * hd, out[r] + (size_t)k * hd,
                       (size_t)hd * sizeof(float));
        p += nr;
    }
}

static void read_rows(const qf_kv_cache *kv, int stream, int layer, int h, int slot, int pos, int n_pos, float *dst,
                      const float *kdec, size_t kstride, bool rotated) {
    qf_kv_mode mode = stream ? kv->mode_v : kv->mode_k;
    size_t rb = layer_row_bytes(kv, stream, layer);
    int hd = kv->head_dim, nh = kv->n_head_kv;
    const uint8_t *base = kv->data[stream][layer] + (size_t)slot * nh * rb + (size_t)h * rb;
    size_t stride = (size_t)nh * rb;
    if (mode == QF_KV_RQ) {
        const struct qf_kv_rq_bind *r = kv->rq[stream];
        qf_kv_rq_codec c = rq_codec(r, kv, layer, h);
        for (int p = 0; p < n_pos; p++) qf_kv_rq_decode(&c, base + p * stride, dst + (size_t)p * hd);
        if (r->pred && r->pred_on[layer]) { /* add the prediction from each position's stored K */
            int HD = nh * hd;
            size_t rbk = layer_row_bytes(kv, 0, layer);
            const float *P = r->pred + (size_t)layer * HD * HD + (size_t)h * hd * HD;
            float kg[QF_KV_RQ_MAX_HEAD_DIM]; /* one decoded K row at a time: no allocation here */
            for (int p = 0; p < n_pos; p++) {
                float *o = dst + (size_t)p * hd;
                for (int g = 0; g < nh; g++) {
                    const float *k = kg;
                    if (kdec) k = kdec + g * kstride + (size_t)(pos + p) * hd;
                    else {
                        qf_kv_rq_codec ck = rq_codec(kv->rq[0], kv, layer, g);
                        qf_kv_rq_decode(&ck, kv->data[0][layer] + ((size_t)(slot + p) * nh + g) * rbk, kg);
                    }
                    float a[QF_KV_RQ_MAX_HEAD_DIM]; /* o[i] += the group's sum, in order over its hd values */
                    qf_vec_rows_dot(P + (size_t)g * hd, (size_t)HD, hd, k, hd, a);
                    for (int i = 0; i < hd; i++) o[i] += a[i];
                }
            }
        }
    } else if (mode == QF_KV_F32) {
        for (int p = 0; p < n_pos; p++) memcpy(dst + (size_t)p * hd, base + p * stride, hd * sizeof(float));
    } else if (mode == QF_KV_INT8) {
        const float *sc = kv->int8_scale[stream] + ((size_t)layer * nh + h) * hd;
        int lay = kv->int8_layout[stream];
        if (lay == QF_KV_INT8_EC_ROT) { /* decode head h's group up to the end of h */
            int g = ec_group(kv), k = h % g;
            ec_read(base - (size_t)k * rb, stride, g * hd, hd, n_pos, k, k + 1, dst, 0);
        }
        for (int p = 0; p < n_pos && lay != QF_KV_INT8_EC_ROT; p++) {
            const int8_t *q = (const int8_t *)(base + p * stride);
            float *x = dst + (size_t)p * hd;
            if (lay == QF_KV_INT8_STATIC || lay == QF_KV_INT8_STATIC_ROT) qf_kv_int8_dequantize(q, sc, x, hd);
            else qf_kv_int8_token_dequantize(q, x, hd);
        }
        if (int8_layout_rotated(lay) && !rotated)
            qf_hadamard_rows(dst, hd, n_pos);
    } else if (mode == QF_KV_DICT) {
        const struct qf_kv_dict_bind *d = kv->dict[stream];
        const qf_kv_dict *L = &d->layer[layer];
        for (int p = 0; p < n_pos; p++) qf_kv_fmt_decode(&d->fmt, L, base + p * stride, dst + (size_t)p * hd);
    } else {
        qf_type t = qf_kv_mode_row_type(mode);
        qf_dequantize_rows(t, base, stride, n_pos, dst, hd);
    }
    if (kv->rot == QF_KV_ROT_HADAMARD && !rotated) qf_hadamard_rows(dst, hd, n_pos);
}

void qf_kv_cache_read_pos(const qf_kv_cache *kv, int stream, int layer, int h, int p, float *dst) {
    int R = kv->ring_rows ? kv->ring_rows[layer] : 0;
    read_rows(kv, stream, layer, h, R ? p % R : p, p, 1, dst, NULL, 0, false);
}

static void read_head(const qf_kv_cache *kv, int stream, int layer, int h, int n_pos, float *dst, const float *kdec,
                      size_t kstride, bool rotated) {
    int R = kv->ring_rows ? kv->ring_rows[layer] : 0;
    if (!R) {
        read_rows(kv, stream, layer, h, 0, 0, n_pos, dst, kdec, kstride, rotated);
        return;
    }
    int hd = kv->head_dim, lo = n_pos > R ? n_pos - R : 0;
    memset(dst, 0, (size_t)lo * hd * sizeof(float)); /* outside the window: never weighted */
    for (int p = lo; p < n_pos;) {
        int slot = p % R, run = R - slot < n_pos - p ? R - slot : n_pos - p;
        read_rows(kv, stream, layer, h, slot, p, run, dst + (size_t)p * hd, kdec, kstride, rotated);
        p += run;
    }
}

void qf_kv_cache_read_head(const qf_kv_cache *kv, int stream, int layer, int h, int n_pos,
                           float *dst) {
    read_head(kv, stream, layer, h, n_pos, dst, NULL, 0, false);
}

void qf_kv_cache_read_head_rotated(const qf_kv_cache *kv, int stream, int layer, int h, int n_pos, float *dst) {
    read_head(kv, stream, layer, h, n_pos, dst, NULL, 0, true);
}

int qf_kv_cache_head_group(const qf_kv_cache *kv, int stream) {
    qf_kv_mode mode = stream ? kv->mode_v : kv->mode_k;
    return mode == QF_KV_INT8 && kv->int8_layout[stream] == QF_KV_INT8_EC_ROT ? ec_group(kv) : 1;
}

void qf_kv_cache_read_heads(const qf_kv_cache *kv, int stream, int layer, int h, int n_pos, float *dst, size_t hstride,
                            bool rotated) {
    const int g = qf_kv_cache_head_group(kv, stream);
    QF_ASSERT(h % g == 0 && h + g <= kv->n_head_kv);
    if (g == 1 || (kv->ring_rows && kv->ring_rows[layer])) { /* head by head */
        for (int j = 0; j < g; j++) read_head(kv, stream, layer, h + j, n_pos, dst + (size_t)j * hstride, NULL, 0, rotated);
        return;
    }
    /* ec rows: each position's group row decoded once for all its heads */
    qf_kv_cache_read_heads_span(kv, stream, layer, h, 0, n_pos, dst, hstride, rotated);
}

bool qf_kv_cache_int8_ec_plain(const qf_kv_cache *kv, int stream, int layer) {
    qf_kv_mode mode = stream ? kv->mode_v : kv->mode_k;
    return mode == QF_KV_INT8 && kv->int8_layout[stream] == QF_KV_INT8_EC_ROT && !(kv->ring_rows && kv->ring_rows[layer]);
}

/* the ec group rows of kv heads [h, h + g) of a plain ec-rot layer (g: the stream's group), at
 * position 0, and the bytes from one position's to the next; checks the span [p0, p1) */
static const uint8_t *ec_group_rows(const qf_kv_cache *kv, int stream, int layer, int h, int p0, int p1,
                                    size_t *stride) {
    const int g = qf_kv_cache_head_group(kv, stream);
    QF_ASSERT(qf_kv_cache_int8_ec_plain(kv, stream, layer) && h % g == 0 && h + g <= kv->n_head_kv && 0 <= p0 && p0 <= p1);
    const size_t rb = layer_row_bytes(kv, stream, layer);
    *stride = (size_t)kv->n_head_kv * rb;
    return kv->data[stream][layer] + (size_t)h * rb;
}

void qf_kv_cache_read_heads_span(const qf_kv_cache *kv, int stream, int layer, int h, int p0, int p1, float *dst,
                                 size_t hstride, bool rotated) {
    const int g = qf_kv_cache_head_group(kv, stream), hd = kv->head_dim;
    size_t stride;
    const uint8_t *gb = ec_group_rows(kv, stream, layer, h, p0, p1, &stride);
    ec_read(gb + (size_t)p0 * stride, stride, g * hd, hd, p1 - p0, 0, g, dst + (size_t)p0 * hd, hstride);
    if (!rotated)
        for (int j = 0; j < g; j++) qf_hadamard_rows(dst + (size_t)j * hstride + (size_t)p0 * hd, hd, p1 - p0);
}

void qf_kv_cache_int8_scores(const qf_kv_cache *kv, int layer, int h, int p0, int p1, const float *q, int gq, float *y,
                             size_t ystride) {
    const int g = qf_kv_cache_head_group(kv, 0), hd = kv->head_dim, n = g * hd;
    QF_ASSERT(gq >= 1 && gq <= QF_KV_EC_DOT_MAXQ && n <= QF_KV_EC_SEG_MAX);
    size_t stride;
    const uint8_t *gb = ec_group_rows(kv, 0, layer, h, p0, p1, &stride);
    const float *qv = q + (size_t)h * gq * hd;
    float *yb = y + (size_t)h * gq * ystride;
    float buf[4 * QF_KV_EC_SEG_MAX]; /* the last rows (fewer than 16), decoded */
    const bool wide = qf_kv_int8_ec16_fast();
    for (int p = p0; p < p1;) {
        const int nr = ec_batch(p1 - p, wide);
        if (nr >= 16) {
            qf_kv_int8_ec_dot16(gb + p * stride, stride, n, nr, g, hd, qv, gq, (size_t)hd, yb + p, ystride);
        } else {
            float *const out[4] = {buf, buf + n, buf + 2 * n, buf + 3 * n};
            ec_decode_few(gb + p * stride, stride, n, nr, out, n);
            for (int k = 0; k < g; k++)
                for (int i = 0; i < gq; i++)
                    qf_vec_rows_dot(buf + (size_t)k * hd, (size_t)n, hd, qv + (size_t)(k * gq + i) * hd, nr,
                                    yb + (size_t)(k * gq + i) * ystride + p);
        }
        p += nr;
    }
}

void qf_kv_cache_int8_vsum(const qf_kv_cache *kv, int layer, int h, int p0, int p1, const float *w, int gq, size_t wstride,
                           float *acc, float *y, size_t ystride) {
    const int g = qf_kv_cache_head_group(kv, 1), hd = kv->head_dim, n = g * hd;
    QF_ASSERT(gq >= 1 && gq <= QF_KV_EC_DOT_MAXQ && n <= QF_KV_EC_SEG_MAX);
    size_t stride;
    const uint8_t *gb = ec_group_rows(kv, 1, layer, h, p0, p1, &stride);
    const float *wb = w + (size_t)h * gq * wstride;
    float *yb = y + (size_t)h * gq * ystride;
    float buf[4 * QF_KV_EC_SEG_MAX]; /* the last rows (fewer than 16), decoded */
    const bool wide = qf_kv_int8_ec16_fast();
    for (int p = p0; p < p1;) {
        const int nr = ec_batch(p1 - p, wide);
        if (nr >= 16) {
            qf_kv_int8_ec_wsum16(gb + p * stride, stride, n, nr, g, hd, wb + p, gq, wstride, acc, yb, ystride);
        } else {
            float *const out[4] = {buf, buf + n, buf + 2 * n, buf + 3 * n};
            ec_decode_few(gb + p * stride, stride, n, nr, out, n);
            for (int r = 0; r < nr; r++)
                for (int k = 0; k < g; k++)
                    for (int i = 0; i < gq; i++) {
                        const float wi = wb[(size_t)(k * gq + i) * wstride + (size_t)(p + r)];
                        float *yo = yb + (size_t)(k * gq + i) * ystride;
                        for (int e = 0; e < hd; e++) yo[e] += wi * out[r][(size_t)k * hd + e];
                    }
        }
        p += nr;
    }
    qf_kv_int8_ec_wsum_fold(acc, g, hd, gq, yb, ystride);
}

const qf_kv_dict *qf_kv_cache_dict(const qf_kv_cache *kv, int stream, int layer, int *sparsity) {
    qf_kv_mode mode = stream ? kv->mode_v : kv->mode_k;
    if (mode != QF_KV_DICT || !kv->dict[stream]) return NULL;
    if (sparsity) *sparsity = kv->dict[stream]->sparsity;
    return &kv->dict[stream]->layer[layer];
}

void qf_kv_cache_dict_slots(const qf_kv_cache *kv, int stream, int layer, int h, int n_pos, int32_t *idx, float *coef,
                            size_t ld) {
    const struct qf_kv_dict_bind *d = kv->dict[stream];
    QF_ASSERT((stream ? kv->mode_v : kv->mode_k) == QF_KV_DICT && d && !(kv->ring_rows && kv->ring_rows[layer]));
    size_t rb = layer_row_bytes(kv, stream, layer), stride = (size_t)kv->n_head_kv * rb;
    const uint8_t *base = kv->data[stream][layer] + (size_t)h * rb;
    const int na = d->layer[layer].n_atoms;
    qf_kv_fmt_slots_rows(&d->fmt, na, base, stride, n_pos, idx, coef, ld);
}

bool qf_kv_cache_stream_rotated(const qf_kv_cache *kv, int stream) {
    if (kv->rot == QF_KV_ROT_HADAMARD) return true;
    qf_kv_mode mode = stream ? kv->mode_v : kv->mode_k;
    return mode == QF_KV_INT8 && int8_layout_rotated(kv->int8_layout[stream]);
}

bool qf_kv_cache_v_predicted(const qf_kv_cache *kv, int layer) {
    const struct qf_kv_rq_bind *r = kv->mode_v == QF_KV_RQ ? kv->rq[1] : NULL;
    return r && r->pred && r->pred_on[layer] && kv->mode_k == QF_KV_RQ;
}

void qf_kv_cache_read_head_vpred(const qf_kv_cache *kv, int layer, int h, int n_pos, const float *kdec, size_t kstride,
                                 float *dst) {
    read_head(kv, 1, layer, h, n_pos, dst, kdec, kstride, false);
}

double qf_kv_cache_bytes_per_token(const qf_kv_cache *kv) {
    double b = 0;
    for (int s = 0; s < 2; s++)
        for (int l = 0; l < kv->n_layer; l++) {
            double rows = kv->ring_rows && kv->ring_rows[l] && kv->n_ctx > 0 ? (double)kv->ring_rows[l] / kv->n_ctx : 1.0;
            b += rows * (double)kv->n_head_kv * (double)layer_row_bytes(kv, s, l);
        }
    if (kv->n_ctx > 0) /* the f16 sink and window copies, spread over the context */
        b += 2.0 * kv->n_layer * kv->n_head_kv * kv->head_dim * 2.0 * (kv->n_sink + kv->n_window) / kv->n_ctx;
    return b;
}
