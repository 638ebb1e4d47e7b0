/* model.c: hyper-parameters and tensor binding for the llama, qwen2, qwen2moe, qwen3, qwen3moe, gemma2,
 * gemma3 and phi3 families (and the llama-architecture MoE, mixtral), with llama.cpp's GGUF key
 * and tensor names.
 *
 * Everything is read from GGUF metadata and checked against the tensor table before the
 * model is handed out: a missing tensor, a shape that disagrees with the hyper-parameters, a
 * type our kernels do not run, or a tensor the family's graph does not use (a feature qforge
 * does not implement) is an error naming the file and the tensor. Each family's features are
 * flags in qf_hparams (read_family); forward.c branches on the flags, not on the family. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

static qf_status bind_weight(qf_model *m, qf_weight *w, const char *name, int64_t ne0, int64_t ne1,
                             bool required, qf_error *err) {
    memset(w, 0, sizeof *w);
    const qf_gguf_tensor *t = qf_gguf_find_tensor(m->gguf, name);
    if (!t) {
        if (!required) return QF_OK;
        return qf_fail(err, QF_ERR_FORMAT, "%s: missing tensor '%s'", m->path, name);
    }
    if (m->bound) m->bound[t - qf_gguf_tensor_at(m->gguf, 0)] = true;
    int64_t got1 = t->n_dims >= 2 ? t->ne[1] : 1;
    if (t->ne[0] != ne0 || got1 != ne1 || (t->n_dims > 2 && (t->ne[2] != 1 || t->ne[3] != 1)))
        return qf_fail(err, QF_ERR_FORMAT,
                       "%s: tensor '%s' has shape [%lld, %lld], expected [%lld, %lld]", m->path,
                       name, (long long)t->ne[0], (long long)got1, (long long)ne0, (long long)ne1);
    if (!qf_type_is_supported(t->type))
        return qf_fail(err, QF_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s (id %d), which qforge does not run",
                       m->path, name, qf_type_name(t->type) ? qf_type_name(t->type) : "unknown",
                       (int)t->type);
    w->type = t->type;
    w->ne0 = ne0;
    w->ne1 = ne1;
    w->data = t->data;
    w->row_bytes = qf_row_bytes(t->type, ne0);
    if (w->row_bytes == 0)
        return qf_fail(err, QF_ERR_FORMAT, "%s: tensor '%s': row length %lld is not a multiple of the %s block size",
                       m->path, name, (long long)ne0, qf_type_name(t->type));
    return QF_OK;
}

/* rows [r0, r0 + n) of a bound weight, as a weight of its own (fused tensors) */
static qf_weight row_view(const qf_weight *w, int64_t r0, int64_t n) {
    qf_weight v = *w;
    v.data = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
    v.ne1 = n;
    return v;
}

/* A 3-D expert tensor [ne0, ne1, n_expert] as n_expert 2-D weights out[0..E) */
static qf_status bind_experts(qf_model *m, qf_weight *out, const char *name, int64_t ne0, int64_t ne1, int64_t E,
                              qf_error *err) {
    const qf_gguf_tensor *t = qf_gguf_find_tensor(m->gguf, name);
    if (!t) return qf_fail(err, QF_ERR_FORMAT, "%s: missing tensor '%s'", m->path, name);
    if (t->n_dims != 3 || t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != E)
        return qf_fail(err, QF_ERR_FORMAT, "%s: tensor '%s' has shape [%lld, %lld, %lld], expected [%lld, %lld, %lld]",
                       m->path, name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)ne0,
                       (long long)ne1, (long long)E);
    if (!qf_type_is_supported(t->type))
        return qf_fail(err, QF_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s (id %d), which qforge does not run", m->path,
                       name, qf_type_name(t->type) ? qf_type_name(t->type) : "unknown", (int)t->type);
    size_t rb = qf_row_bytes(t->type, ne0);
    if (rb == 0)
        return qf_fail(err, QF_ERR_FORMAT, "%s: tensor '%s': row length %lld is not a multiple of the %s block size",
                       m->path, name, (long long)ne0, qf_type_name(t->type));
    m->bound[t - qf_gguf_tensor_at(m->gguf, 0)] = true;
    for (int64_t e = 0; e < E; e++)
        out[e] = (qf_weight){.type = t->type, .ne0 = ne0, .ne1 = ne1, .row_bytes = rb,
                             .data = (const uint8_t *)t->data + (size_t)(e * ne1) * rb};
    return QF_OK;
}

static bool get_arch_u32(const qf_gguf *g, const char *arch, const char *suffix, uint32_t *out) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return qf_gguf_get_u32(g, key, out);
}

static bool get_arch_f32(const qf_gguf *g, const char *arch, const char *suffix, float *out) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return qf_gguf_get_f32(g, key, out);
}

static const char *const arch_names[QF_ARCH_COUNT] = {"llama", "qwen2",  "qwen3", "qwen3moe",
                                                      "gemma2", "gemma3", "phi3",  "qwen2moe"};

const char *qf_arch_name(qf_arch a) { return (unsigned)a < QF_ARCH_COUNT ? arch_names[a] : NULL; }

bool qf_hparams_layer_swa(const qf_hparams *hp, int il) {
    switch (hp->swa) {
    case QF_SWA_ALL: return true;
    case QF_SWA_EVEN: return il % 2 == 0;
    case QF_SWA_PATTERN: return hp->swa_pattern > 0 && il % hp->swa_pattern != hp->swa_pattern - 1;
    default: return false;
    }
}

const char *qf_hparams_features(const qf_hparams *hp, char *buf, size_t size) {
    size_t n = 0;
    buf[0] = 0;
#define ADD(...)                                                                   \
    do {                                                                           \
        if (n < size) n += (size_t)snprintf(buf + n, size - n, n ? ", " : "");     \
        if (n < size) n += (size_t)snprintf(buf + n, size - n, __VA_ARGS__);       \
    } while (0)
    if (hp->n_expert) ADD("moe (%d experts, top-%d, %s, expert ff %d)", hp->n_expert, hp->n_expert_used,
                          hp->expert_norm_w ? "softmax then renormalized" : "softmax", hp->n_ff_exp);
    if (hp->n_ff_shexp) ADD("shared expert (ff %d, sigmoid-gated)", hp->n_ff_shexp);
    if (hp->qk_norm) ADD("q/k rms norm");
    if (hp->fused_qkv) ADD("fused qkv");
    if (hp->fused_gate_up) ADD("fused gate|up");
    if (hp->ffn_act == QF_FFN_GELU_TANH) ADD("geglu (gelu tanh)");
    if (hp->embd_scale != 1.0f) ADD("embedding scale %.4g", hp->embd_scale);
    if (hp->post_norms) ADD("post-attention and post-ffn norms");
    if (hp->attn_softcap > 0) ADD("attention softcap %g", hp->attn_softcap);
    if (hp->final_softcap > 0) ADD("final logit softcap %g", hp->final_softcap);
    if (hp->swa == QF_SWA_ALL) ADD("sliding window %d (every layer)", hp->n_swa);
    if (hp->swa == QF_SWA_EVEN) ADD("sliding window %d (even layers)", hp->n_swa);
    if (hp->swa == QF_SWA_PATTERN)
        ADD("sliding window %d (all but every %dth layer)", hp->n_swa, hp->swa_pattern);
    if (hp->rope_freq_base_swa != hp->rope_freq_base)
        ADD("rope base %g global / %g local", hp->rope_freq_base, hp->rope_freq_base_swa);
    if (fabsf(hp->attn_scale * sqrtf((float)hp->head_dim) - 1.0f) > 1e-6f) ADD("attention scale %.6g", hp->attn_scale);
#undef ADD
    return buf;
}

/* The family's features (qf_hparams' second half) from the architecture and its keys; the
 * neutral values for llama/qwen2. A key that asks for something this family's graph here does
 * not do is QF_ERR_UNSUPPORTED naming the key. */
static qf_status read_family(qf_model *m, qf_error *err) {
    qf_hparams *hp = &m->hp;
    const qf_gguf *g = m->gguf;
    const char *a = hp->arch_name;
    uint32_t v;
    float f;
    hp->embd_scale = 1.0f;
    hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
    hp->rope_freq_base_swa = hp->rope_freq_base;
    hp->ffn_act = QF_FFN_SILU;
    hp->rope_type = hp->arch == QF_ARCH_LLAMA ? QF_ROPE_NORM : QF_ROPE_NEOX;
    bool moe = hp->arch == QF_ARCH_QWEN3MOE || hp->arch == QF_ARCH_QWEN2MOE;
    if (get_arch_u32(g, a, "expert_count", &v) && v > 0) {
        if (hp->arch != QF_ARCH_LLAMA && hp->arch != QF_ARCH_QWEN3MOE && hp->arch != QF_ARCH_QWEN2MOE)
            return qf_fail(err, QF_ERR_UNSUPPORTED, "%s: metadata '%s.expert_count' = %u: qforge runs no %s MoE",
                           m->path, a, v, a);
        moe = true;
    }
    if (moe) {
        uint32_t ne = 0, nu = 0;
        if (!get_arch_u32(g, a, "expert_count", &ne) || ne < 1 || ne > 1024)
            return qf_fail(err, QF_ERR_FORMAT, "%s: metadata '%s.expert_count' missing or out of range", m->path, a);
        if (!get_arch_u32(g, a, "expert_used_count", &nu) || nu < 1 || nu > ne)
            return qf_fail(err, QF_ERR_FORMAT, "%s: metadata '%s.expert_used_count' missing or not in 1..%u", m->path, a, ne);
        hp->n_expert = (int)ne;
        hp->n_expert_used = (int)nu;
        /* llama.cpp's defaults: n_ff (llama), n_ff / top-k (qwen2moe) */
        hp->n_ff_exp = hp->arch == QF_ARCH_QWEN2MOE ? hp->n_ff / (int)nu : hp->n_ff;
        if (get_arch_u32(g, a, "expert_feed_forward_length", &v)) hp->n_ff_exp = (int)v;
        else if (hp->arch == QF_ARCH_QWEN3MOE)
            return qf_fail(err, QF_ERR_FORMAT, "%s: missing metadata '%s.expert_feed_forward_length'", m->path, a);
        if (hp->n_ff_exp <= 0 || hp->n_ff_exp > (1 << 24))
            return qf_fail(err, QF_ERR_FORMAT, "%s: expert feed-forward length %d is out of range", m->path, hp->n_ff_exp);
        /* mixtral and qwen3moe (norm_topk_prob) renormalize the top-k; qwen2moe does not (llama.cpp's
         * graph, transformers' norm_topk_prob = false) */
        hp->expert_norm_w = hp->arch != QF_ARCH_QWEN2MOE;
        if (hp->arch == QF_ARCH_QWEN2MOE) { /* the shared expert: llama.cpp's default size n_ff */
            hp->n_ff_shexp = hp->n_ff;
            if (get_arch_u32(g, a, "expert_shared_feed_forward_length", &v)) hp->n_ff_shexp = (int)v;
            if (hp->n_ff_shexp <= 0 || hp->n_ff_shexp > (1 << 24))
                return qf_fail(err, QF_ERR_FORMAT, "%s: shared expert feed-forward length %d is out of range", m->path,
                               hp->n_ff_shexp);
        } else if (get_arch_u32(g, a, "expert_shared_count", &v) && v > 0)
            return qf_fail(err, QF_ERR_UNSUPPORTED, "%s: metadata '%s.expert_shared_count' = %u: shared experts are not supported",
                           m->path, a, v);
    }
    switch (hp->arch) {
    case QF_ARCH_QWEN3:
    case QF_ARCH_QWEN3MOE:
        hp->qk_norm = true;
        break;
    case QF_ARCH_GEMMA2:
    case QF_ARCH_GEMMA3:
        hp->embd_scale = sqrtf((float)hp->n_embd);
        hp->post_norms = true;
        hp->ffn_act = QF_FFN_GELU_TANH;
        if (hp->arch == QF_ARCH_GEMMA2) {
            /* llama.cpp's gemma2 defaults when the keys are absent */
            hp->attn_softcap = 50.0f;
            hp->final_softcap = 30.0f;
            hp->n_swa = 4096;
            hp->swa = QF_SWA_EVEN;
            if (hp->n_layer == 46) hp->attn_scale = 1.0f / sqrtf((float)(hp->n_embd / hp->n_head)); /* 27B */
        } else {
            hp->qk_norm = true;
            hp->swa = QF_SWA_PATTERN;
            hp->swa_pattern = 6;
            hp->rope_freq_base_swa = 10000.0f;
            if (get_arch_u32(g, a, "attention.sliding_window_pattern", &v)) hp->swa_pattern = (int)v;
            if (get_arch_f32(g, a, "rope.freq_base_swa", &f)) hp->rope_freq_base_swa = f;
            if (!get_arch_u32(g, a, "attention.sliding_window", &v))
                return qf_fail(err, QF_ERR_FORMAT, "%s: missing metadata '%s.attention.sliding_window'", m->path, a);
            if (hp->n_layer == 62) hp->attn_scale = 1.0f / sqrtf((float)(hp->n_embd / hp->n_head)); /* 27B */
            if (hp->swa_pattern < 1 || hp->swa_pattern > 1024 || !(hp->rope_freq_base_swa > 0) || !isfinite(hp->rope_freq_base_swa))
                return qf_fail(err, QF_ERR_FORMAT, "%s: invalid gemma3 sliding-window pattern %d or local rope base", m->path,
                               hp->swa_pattern);
        }
        if (get_arch_f32(g, a, "attn_logit_softcapping", &f)) hp->attn_softcap = f;
        if (get_arch_f32(g, a, "final_logit_softcapping", &f)) hp->final_softcap = f;
        if (!(hp->attn_softcap >= 0) || !(hp->final_softcap >= 0) || !isfinite(hp->attn_softcap) || !isfinite(hp->final_softcap))
            return qf_fail(err, QF_ERR_FORMAT, "%s: invalid %s softcapping values", m->path, a);
        break;
    case QF_ARCH_PHI3:
        /* fused attn_qkv as llama.cpp's converter writes it; separate attn_q/k/v (which
         * llama.cpp's phi3 graph also takes) when the file has no blk.0.attn_qkv */
        hp->fused_qkv = qf_gguf_find_tensor(g, "blk.0.attn_qkv.weight") != NULL;
        hp->fused_gate_up = true;
        if (qf_gguf_find_tensor(g, "rope_factors_long.weight") || qf_gguf_find_tensor(g, "rope_factors_short.weight"))
            return qf_fail(err, QF_ERR_UNSUPPORTED,
                           "%s: tensor 'rope_factors_long.weight': phi3 LongRoPE (128k context) is not supported", m->path);
        hp->swa = QF_SWA_ALL;
        break;
    default:
        break;
    }
    if (hp->swa != QF_SWA_NONE && get_arch_u32(g, a, "attention.sliding_window", &v)) hp->n_swa = (int)v;
    if (hp->swa == QF_SWA_ALL && hp->n_swa == 0) hp->swa = QF_SWA_NONE;
    if (hp->swa != QF_SWA_NONE && (hp->n_swa <= 0 || hp->n_swa > (1 << 24)))
        return qf_fail(err, QF_ERR_FORMAT, "%s: metadata '%s.attention.sliding_window' = %d is out of range", m->path, a,
                       hp->n_swa);
    return QF_OK;
}

static qf_status read_hparams(qf_model *m, qf_error *err) {
    qf_hparams *hp = &m->hp;
    const qf_gguf *g = m->gguf;
    if (!qf_gguf_get_str(g, "general.architecture", hp->arch_name, sizeof hp->arch_name))
        return qf_fail(err, QF_ERR_FORMAT, "%s: missing metadata 'general.architecture'", m->path);
    hp->arch = QF_ARCH_COUNT;
    for (int i = 0; i < QF_ARCH_COUNT; i++)
        if (strcmp(hp->arch_name, arch_names[i]) == 0) hp->arch = (qf_arch)i;
    if (hp->arch == QF_ARCH_COUNT)
        return qf_fail(err, QF_ERR_UNSUPPORTED,
                       "%s: general.architecture '%s' is not supported (qforge runs llama (and its mixtral-style "
                       "MoE), qwen2, qwen2moe, qwen3, qwen3moe, gemma2, gemma3 and phi3)",
                       m->path, hp->arch_name);
    if (!qf_gguf_get_str(g, "general.name", hp->name, sizeof hp->name)) snprintf(hp->name, sizeof hp->name, "%s", hp->arch_name);

    const char *a = hp->arch_name;
    struct { const char *key; int *dst; bool required; } ints[] = {
        {"block_count", &hp->n_layer, true},
        {"embedding_length", &hp->n_embd, true},
        {"attention.head_count", &hp->n_head, true},
        {"feed_forward_length", &hp->n_ff, true},
        {"context_length", &hp->n_ctx_train, false},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        uint32_t v;
        if (!get_arch_u32(g, a, ints[i].key, &v)) {
            if (ints[i].required)
                return qf_fail(err, QF_ERR_FORMAT, "%s: missing or non-integer metadata '%s.%s'", m->path, a, ints[i].key);
            v = 0;
        }
        if (v > (1u << 24))
            return qf_fail(err, QF_ERR_FORMAT, "%s: metadata '%s.%s' = %u is out of range", m->path, a, ints[i].key, v);
        *ints[i].dst = (int)v;
    }
    uint32_t v;
    hp->n_head_kv = get_arch_u32(g, a, "attention.head_count_kv", &v) ? (int)v : hp->n_head;
    if (hp->n_layer <= 0 || hp->n_embd <= 0 || hp->n_head <= 0 || hp->n_ff <= 0 || hp->n_head_kv <= 0 ||
        hp->n_head % hp->n_head_kv != 0)
        return qf_fail(err, QF_ERR_FORMAT,
                       "%s: inconsistent hyper-parameters (n_layer %d, n_embd %d, n_head %d, n_head_kv %d, n_ff %d)",
                       m->path, hp->n_layer, hp->n_embd, hp->n_head, hp->n_head_kv, hp->n_ff);
    if (get_arch_u32(g, a, "attention.key_length", &v)) hp->head_dim = (int)v;
    else {
        if (hp->n_embd % hp->n_head)
            return qf_fail(err, QF_ERR_FORMAT, "%s: n_embd %d is not a multiple of n_head %d", m->path, hp->n_embd, hp->n_head);
        hp->head_dim = hp->n_embd / hp->n_head;
    }
    uint32_t vlen;
    if (get_arch_u32(g, a, "attention.value_length", &vlen) && (int)vlen != hp->head_dim)
        return qf_fail(err, QF_ERR_UNSUPPORTED, "%s: key_length %d != value_length %u is not supported", m->path, hp->head_dim, vlen);
    if (hp->head_dim <= 0 || hp->head_dim > 1024 || hp->head_dim % 2)
        return qf_fail(err, QF_ERR_FORMAT, "%s: head_dim %d is not supported", m->path, hp->head_dim);
    hp->n_rot = get_arch_u32(g, a, "rope.dimension_count", &v) ? (int)v : hp->head_dim;
    if (hp->n_rot <= 0 || hp->n_rot > hp->head_dim || hp->n_rot % 2)
        return qf_fail(err, QF_ERR_FORMAT, "%s: rope.dimension_count %d is invalid for head_dim %d", m->path, hp->n_rot, hp->head_dim);
    if (!get_arch_f32(g, a, "rope.freq_base", &hp->rope_freq_base)) hp->rope_freq_base = 10000.0f;
    hp->rope_freq_scale = 1.0f;
    float factor;
    char stype[32] = "";
    char key[160];
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    qf_gguf_get_str(g, key, stype, sizeof stype);
    if (get_arch_f32(g, a, "rope.scaling.factor", &factor) && factor > 0 && strcmp(stype, "none") != 0) {
        if (stype[0] && strcmp(stype, "linear") != 0)
            return qf_fail(err, QF_ERR_UNSUPPORTED, "%s: rope scaling '%s' is not supported (linear only)", m->path, stype);
        hp->rope_freq_scale = 1.0f / factor;
    }
    if (!get_arch_f32(g, a, "attention.layer_norm_rms_epsilon", &hp->rms_eps)) hp->rms_eps = 1e-5f;
    if (!(hp->rope_freq_base > 0) || !isfinite(hp->rope_freq_base) || !(hp->rms_eps >= 0))
        return qf_fail(err, QF_ERR_FORMAT, "%s: invalid rope.freq_base or rms epsilon", m->path);
    return read_family(m, err);
}

static int cmp_tensor_offset(const void *a, const void *b) {
    uint64_t x = (*(const qf_gguf_tensor *const *)a)->offset, y = (*(const qf_gguf_tensor *const *)b)->offset;
    return (x > y) - (x < y);
}

/* The loader's cheap guard against a tensor whose type (or shape) was changed without its data:
 * GGUF writers (ggml's, ours) store tensor data back to back, each padded to the alignment, so
 * the declared sizes tile the data section. A tensor that leaves a whole alignment unit or more
 * unused before the next tensor (or the end of the file) declares fewer bytes than it occupies:
 * its type does not describe its data (f16 relabelled q4_0 reads 768-byte rows as 216-byte
 * ones). QF_ERR_FORMAT naming the tensor. Costs one sort of the tensor table, no data is read;
 * what it cannot see (a relabel that keeps the byte count) is caught at run time, where
 * perplexity and generation refuse non-finite logits. */
static qf_status check_packed(const qf_model *m, qf_error *err) {
    const qf_gguf *g = m->gguf;
    uint64_t n = qf_gguf_n_tensors(g), align = qf_gguf_alignment(g);
    if (n == 0) return QF_OK;
    const qf_gguf_tensor **order = malloc(n * sizeof *order);
    if (!order) return qf_fail(err, QF_ERR_NOMEM, "%s: out of memory", m->path);
    for (uint64_t i = 0; i < n; i++) order[i] = qf_gguf_tensor_at(g, i);
    qsort(order, n, sizeof *order, cmp_tensor_offset);
    size_t size;
    qf_gguf_file_data(g, &size);
    uint64_t data_size = size - qf_gguf_data_offset(g);
    qf_status st = QF_OK;
    for (uint64_t i = 0; i < n && !st; i++) {
        const qf_gguf_tensor *t = order[i];
        uint64_t end = t->offset + t->nbytes, next = i + 1 < n ? order[i + 1]->offset : data_size;
        if (next - end >= align) {
            char nm[96];
            snprintf(nm, sizeof nm, "%.*s", (int)(t->name.len < 80 ? t->name.len : 80), t->name.ptr);
            st = qf_fail(err, QF_ERR_FORMAT,
                         "%s: tensor '%s' (%s) declares %llu bytes but occupies %llu: its type or shape does not "
                         "match its data (relabelled?)",
                         m->path, nm, qf_type_name(t->type), (unsigned long long)t->nbytes,
                         (unsigned long long)(next - t->offset));
        }
    }
    free(order);
    return st;
}

qf_model *qf_model_load(const char *path, qf_error *err) {
    qf_model *m = calloc(1, sizeof *m);
    if (!m) {
        qf_fail(err, QF_ERR_NOMEM, "%s: out of memory", path);
        return NULL;
    }
    snprintf(m->path, sizeof m->path, "%s", path);
    m->gguf = qf_gguf_open(path, err);
    if (!m->gguf) goto fail;
    if (check_packed(m, err)) goto fail;
    if (read_hparams(m, err)) goto fail;
    m->bound = calloc(qf_gguf_n_tensors(m->gguf) + 1, sizeof *m->bound);
    if (!m->bound) {
        qf_fail(err, QF_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    qf_hparams *hp = &m->hp;

    const qf_gguf_tensor *te = qf_gguf_find_tensor(m->gguf, "token_embd.weight");
    if (!te || te->n_dims < 2) {
        qf_fail(err, QF_ERR_FORMAT, "%s: missing tensor 'token_embd.weight'", path);
        goto fail;
    }
    hp->n_vocab = (int)te->ne[1];
    int64_t D = hp->n_embd, Dq = (int64_t)hp->n_head * hp->head_dim,
            Dkv = (int64_t)hp->n_head_kv * hp->head_dim, F = hp->n_ff, V = hp->n_vocab;
    if (bind_weight(m, &m->tok_embd, "token_embd.weight", D, V, true, err)) goto fail;
    if (bind_weight(m, &m->output_norm, "output_norm.weight", D, 1, true, err)) goto fail;
    if (bind_weight(m, &m->output, "output.weight", D, V, false, err)) goto fail;
    hp->tied_output = m->output.data == NULL;
    if (hp->tied_output) m->output = m->tok_embd;
    if (bind_weight(m, &m->rope_freqs, "rope_freqs.weight", hp->n_rot / 2, 1, false, err)) goto fail;
    if (m->rope_freqs.data && m->rope_freqs.type != QF_TYPE_F32) {
        qf_fail(err, QF_ERR_UNSUPPORTED, "%s: rope_freqs.weight must be f32", path);
        goto fail;
    }

    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (hp->n_expert) m->experts = calloc((size_t)hp->n_layer * 3 * hp->n_expert, sizeof *m->experts);
    if (!m->layers || (hp->n_expert && !m->experts)) {
        qf_fail(err, QF_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    for (int il = 0; il < hp->n_layer; il++) {
        qf_layer_weights *L = &m->layers[il];
        char n[96];
#define W(field, suffix, ne0, ne1, req)                                        \
        snprintf(n, sizeof n, "blk.%d.%s", il, suffix);                        \
        if (bind_weight(m, &L->field, n, ne0, ne1, req, err)) goto fail;
        W(attn_norm, "attn_norm.weight", D, 1, true)
        if (hp->fused_qkv) {
            qf_weight qkv;
            snprintf(n, sizeof n, "blk.%d.attn_qkv.weight", il);
            if (bind_weight(m, &qkv, n, D, Dq + 2 * Dkv, true, err)) goto fail;
            L->wq = row_view(&qkv, 0, Dq);
            L->wk = row_view(&qkv, Dq, Dkv);
            L->wv = row_view(&qkv, Dq + Dkv, Dkv);
        } else {
            W(wq, "attn_q.weight", D, Dq, true)
            W(wk, "attn_k.weight", D, Dkv, true)
            W(wv, "attn_v.weight", D, Dkv, true)
        }
        W(wo, "attn_output.weight", Dq, D, true)
        W(ffn_norm, "ffn_norm.weight", D, 1, true)
        if (hp->n_expert) {
            int64_t E = hp->n_expert, Fe = hp->n_ff_exp;
            W(gate_inp, "ffn_gate_inp.weight", D, E, true)
            qf_weight *xw = m->experts + (size_t)il * 3 * E;
            L->exp_gate = xw, L->exp_up = xw + E, L->exp_down = xw + 2 * E;
            static const char *const xn[3] = {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"};
            /* legacy mixtral files (llama.cpp before the 3-D tensors, still loaded by b4748): one
             * 2-D tensor per expert, blk.N.ffn_{gate,up,down}.X.weight */
            static const char *const xl[3] = {"ffn_gate", "ffn_up", "ffn_down"};
            snprintf(n, sizeof n, "blk.%d.%s", il, xn[0]);
            bool legacy = hp->arch == QF_ARCH_LLAMA && !qf_gguf_find_tensor(m->gguf, n);
            for (int k = 0; k < 3; k++) {
                if (legacy) {
                    for (int64_t x = 0; x < E; x++) {
                        snprintf(n, sizeof n, "blk.%d.%s.%lld.weight", il, xl[k], (long long)x);
                        if (bind_weight(m, &xw[k * E + x], n, k == 2 ? Fe : D, k == 2 ? D : Fe, true, err)) goto fail;
                    }
                    continue;
                }
                snprintf(n, sizeof n, "blk.%d.%s", il, xn[k]);
                if (bind_experts(m, xw + k * E, n, k == 2 ? Fe : D, k == 2 ? D : Fe, E, err)) goto fail;
            }
        } else if (hp->fused_gate_up) {
            qf_weight gu;
            snprintf(n, sizeof n, "blk.%d.ffn_up.weight", il);
            if (bind_weight(m, &gu, n, D, 2 * F, true, err)) goto fail;
            L->w_gate = row_view(&gu, 0, F);
            L->w_up = row_view(&gu, F, F);
        } else {
            W(w_gate, "ffn_gate.weight", D, F, true)
            W(w_up, "ffn_up.weight", D, F, true)
        }
        if (!hp->n_expert) {
            W(w_down, "ffn_down.weight", F, D, true)
        }
        if (hp->n_ff_shexp) { /* qwen2moe's shared expert */
            const int64_t Fs = hp->n_ff_shexp;
            W(gate_inp_shexp, "ffn_gate_inp_shexp.weight", D, 1, true)
            W(w_gate_shexp, "ffn_gate_shexp.weight", D, Fs, true)
            W(w_up_shexp, "ffn_up_shexp.weight", D, Fs, true)
            W(w_down_shexp, "ffn_down_shexp.weight", Fs, D, true)
        }
        bool bias = hp->arch == QF_ARCH_QWEN2 || hp->arch == QF_ARCH_QWEN2MOE;
        W(bq, "attn_q.bias", Dq, 1, bias)
        W(bk, "attn_k.bias", Dkv, 1, bias)
        W(bv, "attn_v.bias", Dkv, 1, bias)
        W(q_norm, "attn_q_norm.weight", hp->head_dim, 1, hp->qk_norm)
        W(k_norm, "attn_k_norm.weight", hp->head_dim, 1, hp->qk_norm)
        W(post_attn_norm, "post_attention_norm.weight", D, 1, hp->post_norms)
        W(post_ffw_norm, "post_ffw_norm.weight", D, 1, hp->post_norms)
#undef W
        const qf_weight *norms[] = {&L->attn_norm, &L->ffn_norm, &L->bq, &L->bk, &L->bv, &L->q_norm, &L->k_norm,
                                    &L->post_attn_norm, &L->post_ffw_norm};
        for (size_t i = 0; i < sizeof norms / sizeof norms[0]; i++)
            if (norms[i]->data && norms[i]->type != QF_TYPE_F32 && norms[i]->type != QF_TYPE_F16) {
                qf_fail(err, QF_ERR_UNSUPPORTED, "%s: blk.%d: norm/bias tensors must be f32 or f16", path, il);
                goto fail;
            }
    }
    if (m->output_norm.type != QF_TYPE_F32 && m->output_norm.type != QF_TYPE_F16) {
        qf_fail(err, QF_ERR_UNSUPPORTED, "%s: output_norm.weight must be f32 or f16", path);
        goto fail;
    }

    /* a tensor no weight was bound to is a feature of the file that this graph would ignore */
    for (uint64_t i = 0; i < qf_gguf_n_tensors(m->gguf); i++) {
        const qf_gguf_tensor *t = qf_gguf_tensor_at(m->gguf, i);
        if (m->bound[i]) continue;
        qf_fail(err, QF_ERR_UNSUPPORTED, "%s: tensor '%.*s' is not used by qforge's %s graph (an unsupported feature)", path,
                (int)(t->name.len < 96 ? t->name.len : 96), t->name.ptr, hp->arch_name);
        goto fail;
    }
    free(m->bound);
    m->bound = NULL;

    m->tok = qf_tokenizer_load(m->gguf, err);
    if (!m->tok) {
        qf_error_prefix(err, "%s: tokenizer: ", path);
        goto fail;
    }
    if (qf_tokenizer_n_vocab(m->tok) != hp->n_vocab && qf_tokenizer_n_vocab(m->tok) > hp->n_vocab) {
        qf_fail(err, QF_ERR_FORMAT, "%s: tokenizer has %d tokens but token_embd has %d rows", path,
                qf_tokenizer_n_vocab(m->tok), hp->n_vocab);
        goto fail;
    }
    return m;
fail:
    qf_model_free(m);
    return NULL;
}

void qf_model_free(qf_model *m) {
    if (!m) return;
    qf_model_repack_free(m);
    qf_tokenizer_free(m->tok);
    free(m->layers);
    free(m->experts);
    free(m->bound);
    qf_gguf_close(m->gguf);
    free(m);
}

const qf_hparams *qf_model_hparams(const qf_model *m) { return &m->hp; }
const qf_tokenizer *qf_model_tokenizer(const qf_model *m) { return m->tok; }
const qf_gguf *qf_model_gguf(const qf_model *m) { return m->gguf; }
const qf_layer_weights *qf_model_layer(const qf_model *m, int il) { return &m->layers[il]; }
const qf_weight *qf_model_tok_embd(const qf_model *m) { return &m->tok_embd; }
const qf_weight *qf_model_output_norm(const qf_model *m) { return &m->output_norm; }
const qf_weight *qf_model_output(const qf_model *m) { return &m->output; }

const uint8_t *qf_model_sha256(qf_model *m) {
    if (!m->sha_done) {
        size_t size;
        const uint8_t *data = qf_gguf_file_data(m->gguf, &size);
        qf_sha256(data ? (const void *)data : "", size, m->sha256);
        m->sha_done = true;
    }
    return m->sha256;
}
