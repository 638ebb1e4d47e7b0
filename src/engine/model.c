/* model.c: hyper-parameters and tensor binding for the llama and qwen2 families.
 *
 * Everything is read from GGUF metadata and checked against the tensor table before the
 * model is handed out: a missing tensor, a shape that disagrees with the hyper-parameters or
 * a type our kernels do not run is an error naming the file and the tensor. */
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

static qf_status read_hparams(qf_model *m, qf_error *err) {
    qf_hparams *hp = &m->hp;
    const qf_gguf *g = m->gguf;
    if (!qf_gguf_get_str(g, "general.architecture", hp->arch_name, sizeof hp->arch_name))
        return qf_fail(err, QF_ERR_FORMAT, "%s: missing metadata 'general.architecture'", m->path);
    if (strcmp(hp->arch_name, "llama") == 0) hp->arch = QF_ARCH_LLAMA;
    else if (strcmp(hp->arch_name, "qwen2") == 0) hp->arch = QF_ARCH_QWEN2;
    else
        return qf_fail(err, QF_ERR_UNSUPPORTED,
                       "%s: architecture '%s' is not supported (qforge runs llama and qwen2)", m->path,
                       hp->arch_name);
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
    hp->rope_type = hp->arch == QF_ARCH_QWEN2 ? QF_ROPE_NEOX : QF_ROPE_NORM;
    return QF_OK;
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
    if (read_hparams(m, err)) goto fail;
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
    if (!m->layers) {
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
        W(wq, "attn_q.weight", D, Dq, true)
        W(wk, "attn_k.weight", D, Dkv, true)
        W(wv, "attn_v.weight", D, Dkv, true)
        W(wo, "attn_output.weight", Dq, D, true)
        W(ffn_norm, "ffn_norm.weight", D, 1, true)
        W(w_gate, "ffn_gate.weight", D, F, true)
        W(w_up, "ffn_up.weight", D, F, true)
        W(w_down, "ffn_down.weight", F, D, true)
        bool bias = hp->arch == QF_ARCH_QWEN2;
        W(bq, "attn_q.bias", Dq, 1, bias)
        W(bk, "attn_k.bias", Dkv, 1, bias)
        W(bv, "attn_v.bias", Dkv, 1, bias)
#undef W
        const qf_weight *norms[] = {&L->attn_norm, &L->ffn_norm, &L->bq, &L->bk, &L->bv};
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
    qf_tokenizer_free(m->tok);
    free(m->layers);
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
