/* kv_cache.c: the KV cache and its storage modes.
 *
 * f32 and f16 store the vectors as they are; q8_0 and q4_0 store ggml blocks of 32 along
 * head_dim exactly like llama.cpp's -ctk/-ctv (the uncalibrated baselines); int8 stores one
 * signed byte per element with static scales that a certified kv-int8 artifact binds; dict
 * stores sparse codes that a certified kv-dict artifact's dictionaries reconstruct. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

static const char *const mode_names[QF_KV_MODE_COUNT] = {"f32", "f16", "q8_0", "q4_0", "int8", "dict"};

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

static qf_type mode_type(qf_kv_mode m) {
    switch (m) {
    case QF_KV_F32: return QF_TYPE_F32;
    case QF_KV_F16: return QF_TYPE_F16;
    case QF_KV_Q8_0: return QF_TYPE_Q8_0;
    case QF_KV_Q4_0: return QF_TYPE_Q4_0;
    default: return QF_TYPE_COUNT;
    }
}

static size_t mode_row_bytes(qf_kv_mode m, int head_dim) {
    if (m == QF_KV_INT8) return (size_t)head_dim;
    qf_type t = mode_type(m);
    return t == QF_TYPE_COUNT ? 0 : qf_row_bytes(t, head_dim);
}

qf_status qf_kv_cache_init(qf_kv_cache *kv, const qf_hparams *hp, int n_ctx, qf_kv_mode mk,
                           qf_kv_mode mv, qf_error *err) {
    memset(kv, 0, sizeof *kv);
    kv->mode_k = mk;
    kv->mode_v = mv;
    kv->n_layer = hp->n_layer;
    kv->n_ctx = n_ctx;
    kv->n_head_kv = hp->n_head_kv;
    kv->head_dim = hp->head_dim;
    qf_kv_mode modes[2] = {mk, mv};
    for (int s = 0; s < 2; s++) {
        if ((unsigned)modes[s] >= QF_KV_MODE_COUNT)
            return qf_fail(err, QF_ERR_ARG, "unknown KV cache mode %d", (int)modes[s]);
        if (modes[s] == QF_KV_DICT)
            return qf_fail(err, QF_ERR_NOT_IMPLEMENTED,
                           "the dict KV cache mode needs a certified kv-dict artifact (--artifact)");
        size_t rb = mode_row_bytes(modes[s], hp->head_dim);
        if (rb == 0)
            return qf_fail(err, QF_ERR_UNSUPPORTED, "KV cache type %s needs head_dim to be a multiple of 32 (it is %d)",
                           qf_kv_mode_name(modes[s]), hp->head_dim);
        kv->row_bytes[s] = rb;
        kv->data[s] = calloc((size_t)hp->n_layer, sizeof(uint8_t *));
        if (!kv->data[s]) goto oom;
        size_t per_layer = rb * (size_t)n_ctx * (size_t)hp->n_head_kv;
        for (int l = 0; l < hp->n_layer; l++) {
            kv->data[s][l] = qf_malloc_aligned(per_layer);
            if (!kv->data[s][l]) goto oom;
        }
        if (modes[s] == QF_KV_INT8) {
            size_t n = (size_t)hp->n_layer * hp->n_head_kv * hp->head_dim;
            kv->int8_scale[s] = malloc(n * sizeof(float));
            kv->int8_inv_scale[s] = malloc(n * sizeof(float));
            if (!kv->int8_scale[s] || !kv->int8_inv_scale[s]) goto oom;
            /* until an artifact binds calibrated scales, a fixed conservative range */
            for (size_t i = 0; i < n; i++) {
                kv->int8_scale[s][i] = 16.0f / 127.0f;
                kv->int8_inv_scale[s][i] = 127.0f / 16.0f;
            }
        }
    }
    return QF_OK;
oom:
    qf_kv_cache_free(kv);
    return qf_fail(err, QF_ERR_NOMEM, "out of memory allocating the KV cache (%d positions)", n_ctx);
}

void qf_kv_cache_free(qf_kv_cache *kv) {
    for (int s = 0; s < 2; s++) {
        if (kv->data[s])
            for (int l = 0; l < kv->n_layer; l++) free(kv->data[s][l]);
        free(kv->data[s]);
        free(kv->int8_scale[s]);
        free(kv->int8_inv_scale[s]);
        kv->data[s] = NULL;
        kv->int8_scale[s] = kv->int8_inv_scale[s] = NULL;
    }
}

/* Bind static int8 scales ([layer][kv head][head_dim]) for one stream. */
void qf_kv_cache_set_int8_scales(qf_kv_cache *kv, int stream, const float *scales) {
    size_t n = (size_t)kv->n_layer * kv->n_head_kv * kv->head_dim;
    for (size_t i = 0; i < n; i++) {
        float s = scales[i] > 0 ? scales[i] : 1e-8f;
        kv->int8_scale[stream][i] = s;
        kv->int8_inv_scale[stream][i] = 1.0f / s;
    }
}

void qf_kv_cache_write(qf_kv_cache *kv, int stream, int layer, int pos, int n_pos,
                       const float *src) {
    qf_kv_mode mode = stream ? kv->mode_v : kv->mode_k;
    size_t rb = kv->row_bytes[stream];
    int hd = kv->head_dim, nh = kv->n_head_kv;
    uint8_t *dst = kv->data[stream][layer] + (size_t)pos * nh * rb;
    for (int r = 0; r < n_pos * nh; r++) {
        const float *x = src + (size_t)r * hd;
        uint8_t *d = dst + (size_t)r * rb;
        if (mode == QF_KV_INT8) {
            const float *inv = kv->int8_inv_scale[stream] + ((size_t)layer * nh + r % nh) * hd;
            int8_t *q = (int8_t *)d;
            for (int i = 0; i < hd; i++) {
                float v = roundf(x[i] * inv[i]);
                q[i] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
            }
        } else {
            qf_quantize_row(mode_type(mode), x, d, hd);
        }
    }
}

void qf_kv_cache_read_head(const qf_kv_cache *kv, int stream, int layer, int h, int n_pos,
                           float *dst) {
    qf_kv_mode mode = stream ? kv->mode_v : kv->mode_k;
    size_t rb = kv->row_bytes[stream];
    int hd = kv->head_dim, nh = kv->n_head_kv;
    const uint8_t *base = kv->data[stream][layer] + (size_t)h * rb;
    size_t stride = (size_t)nh * rb;
    if (mode == QF_KV_F32) {
        for (int p = 0; p < n_pos; p++) memcpy(dst + (size_t)p * hd, base + p * stride, hd * sizeof(float));
    } else if (mode == QF_KV_INT8) {
        const float *sc = kv->int8_scale[stream] + ((size_t)layer * nh + h) * hd;
        for (int p = 0; p < n_pos; p++) {
            const int8_t *q = (const int8_t *)(base + p * stride);
            float *o = dst + (size_t)p * hd;
            for (int i = 0; i < hd; i++) o[i] = (float)q[i] * sc[i];
        }
    } else {
        qf_type t = mode_type(mode);
        for (int p = 0; p < n_pos; p++) qf_dequantize_row(t, base + p * stride, dst + (size_t)p * hd, hd);
    }
}

double qf_kv_cache_bytes_per_token(const qf_kv_cache *kv) {
    return (double)kv->n_layer * kv->n_head_kv * (double)(kv->row_bytes[0] + kv->row_bytes[1]);
}
