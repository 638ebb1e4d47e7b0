/* quantize.c: model re-quantization to GGUF (qforge quantize IN OUT TYPE): llama-quantize's
 * type rules for f16 / q8_0 / q4_0 with ggml's reference round-to-nearest quantizers, every
 * metadata key copied, general.file_type updated, written atomically. Also the writer the AWQ
 * learner uses to emit its folded model (tensor overrides, keep-float mode for tests). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "forge/awq_impl.h"
#include "qforge/awq.h"
#include "util/util.h"

/* llama.cpp's llama_ftype numbers for general.file_type */
static uint32_t ftype_of(qf_type t) {
    switch (t) {
    case QF_TYPE_F16: return 1;
    case QF_TYPE_Q4_0: return 2;
    case QF_TYPE_Q8_0: return 7;
    default: return 0;
    }
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && memcmp(s + n - m, suffix, m) == 0;
}

qf_type qf_quantize_tensor_type(const char *name, uint32_t n_dims, const int64_t *ne, qf_type type,
                                bool output_tied) {
    if (n_dims < 2 || !ends_with(name, "weight") || strstr(name, "_norm.weight"))
        return QF_TYPE_COUNT; /* copied unchanged */
    if (strstr(name, "ffn_gate_inp.weight")) return QF_TYPE_COUNT; /* MoE router: llama-quantize keeps it */
    qf_type t = type;
    if (type == QF_TYPE_Q4_0 || type == QF_TYPE_Q8_0) {
        bool is_output = !strcmp(name, "output.weight") ||
                         (output_tied && !strcmp(name, "token_embd.weight"));
        if (is_output) t = QF_TYPE_Q8_0; /* llama.cpp: Q6_K when ne0 % 256 == 0, else Q8_0 */
    }
    if (ne[0] % qf_type_block_elems(t) != 0) t = QF_TYPE_F16; /* llama.cpp's last fallback */
    return t;
}

qf_status qf_forge_check_arch(const qf_gguf *g, qf_error *err) {
    char arch[64];
    if (!qf_gguf_get_str(g, "general.architecture", arch, sizeof arch))
        return qf_fail(err, QF_ERR_FORMAT, "%s: general.architecture: missing or not a string",
                       qf_gguf_path(g));
    char list[256] = "";
    size_t n = 0;
    for (int i = 0; i < QF_ARCH_COUNT; i++) { /* model.c's list (qf_arch_name) */
        if (strcmp(arch, qf_arch_name((qf_arch)i)) == 0) return QF_OK;
        if (n < sizeof list) n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "", qf_arch_name((qf_arch)i));
    }
    return qf_fail(err, QF_ERR_UNSUPPORTED, "%s: general.architecture '%s': expected one of the families qforge runs (%s)",
                   qf_gguf_path(g), arch, list);
}

typedef struct {
    const qf_gguf_tensor *t;
    const float *f32; /* override, or NULL */
    qf_type dst;
    uint8_t *out;
    int64_t ne0, nrows;
    size_t src_row, dst_row;
    bool failed;
} conv_job;

static void conv_worker(void *arg, int ith, int nth) {
    conv_job *j = arg;
    int64_t lo, hi;
    qf_split_range(j->nrows, ith, nth, &lo, &hi);
    float *buf = j->f32 ? NULL : malloc((size_t)j->ne0 * sizeof(float));
    if (!j->f32 && !buf) {
        j->failed = true;
        return;
    }
    for (int64_t r = lo; r < hi; r++) {
        const float *row;
        if (j->f32) {
            row = j->f32 + (size_t)r * (size_t)j->ne0;
        } else {
            qf_dequantize_row(j->t->type, (const uint8_t *)j->t->data + (size_t)r * j->src_row, buf,
                              j->ne0);
            row = buf;
        }
        if (!qf_quantize_row(j->dst, row, j->out + (size_t)r * j->dst_row, j->ne0)) j->failed = true;
    }
    free(buf);
}

static char *tensor_name(const qf_gguf_tensor *t) {
    char *s = malloc(t->name.len + 1);
    if (!s) return NULL;
    memcpy(s, t->name.ptr, t->name.len);
    s[t->name.len] = 0;
    return s;
}

qf_status qf_forge_write_model(const qf_gguf *src, const char *out_path, qf_type type,
                               bool keep_float, qf_tensor_override_fn override, void *user,
                               int n_threads, uint8_t sha256[32], uint8_t tensor_sha256[32],
                               qf_error *err) {
    if (type != QF_TYPE_F16 && type != QF_TYPE_Q8_0 && type != QF_TYPE_Q4_0)
        return qf_fail(err, QF_ERR_ARG, "quantize: type %s: expected f16, q8_0 or q4_0",
                       qf_type_name(type) ? qf_type_name(type) : "?");
    qf_status st = qf_forge_check_arch(src, err);
    if (st != QF_OK) return st;
    uint64_t nt = qf_gguf_n_tensors(src);
    bool tied = qf_gguf_find_tensor(src, "output.weight") == NULL;

    qf_gguf_writer *w = qf_gguf_writer_new();
    uint8_t **bufs = calloc(nt ? nt : 1, sizeof *bufs);
    if (n_threads <= 0) n_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    qf_pool *pool = qf_pool_create(n_threads > 0 ? n_threads : 1);
    if (!w || !bufs || !pool) {
        st = qf_fail(err, QF_ERR_NOMEM, "quantize: out of memory");
        goto done;
    }
    st = qf_gguf_writer_copy_kv(w, src, NULL, err);
    if (st != QF_OK) goto done;
    if (!keep_float) {
        qf_gguf_writer_set_u32(w, "general.file_type", ftype_of(type));
        if (type != QF_TYPE_F16) qf_gguf_writer_set_u32(w, "general.quantization_version", 2);
    }

    for (uint64_t i = 0; i < nt; i++) {
        const qf_gguf_tensor *t = qf_gguf_tensor_at(src, i);
        char *name = tensor_name(t);
        if (!name) {
            st = qf_fail(err, QF_ERR_NOMEM, "quantize: out of memory");
            goto done;
        }
        const void *q4 = NULL;
        const float *ov = override ? override(user, name, &q4) : NULL;
        qf_type dst = qf_quantize_tensor_type(name, t->n_dims, t->ne, type, tied);
        if (keep_float) dst = ov ? QF_TYPE_F32 : QF_TYPE_COUNT;
        if (dst == QF_TYPE_COUNT && ov) dst = t->type == QF_TYPE_F16 ? QF_TYPE_F16 : QF_TYPE_F32;
        if (dst == QF_TYPE_COUNT || (dst == t->type && !ov)) {
            st = qf_gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data, t->nbytes, err);
            free(name);
            if (st != QF_OK) goto done;
            continue;
        }
        if (!ov && (!qf_type_is_supported(t->type) || t->ne[0] % qf_type_block_elems(t->type) != 0)) {
            st = qf_fail(err, QF_ERR_UNSUPPORTED, "%s: tensor '%s': type %s: cannot be re-quantized",
                         qf_gguf_path(src), name, qf_type_name(t->type) ? qf_type_name(t->type) : "?");
            free(name);
            goto done;
        }
        int64_t nel = qf_gguf_tensor_nelements(t);
        if (q4 && !ov && dst != QF_TYPE_Q4_0) { /* the learner dropped its f32 copy: only q4 is left */
            st = qf_fail(err, QF_ERR_UNSUPPORTED, "quantize: tensor '%s': the learner kept only its Q4_0 rows, but the "
                         "file wants %s", name, qf_type_name(dst));
            free(name);
            goto done;
        }
        if (q4 && dst == QF_TYPE_Q4_0) {
            st = qf_gguf_writer_add_tensor(w, name, dst, t->n_dims, t->ne, q4,
                                           qf_row_bytes(dst, t->ne[0]) * (size_t)(nel / t->ne[0]), err);
            free(name);
            if (st != QF_OK) goto done;
            continue;
        }
        conv_job j = {.t = t, .f32 = ov, .dst = dst, .ne0 = t->ne[0], .nrows = nel / t->ne[0]};
        j.src_row = qf_row_bytes(t->type, t->ne[0]);
        j.dst_row = qf_row_bytes(dst, t->ne[0]);
        size_t nbytes = j.dst_row * (size_t)j.nrows;
        bufs[i] = j.out = malloc(nbytes ? nbytes : 1);
        if (!j.out) {
            free(name);
            st = qf_fail(err, QF_ERR_NOMEM, "quantize: out of memory for tensor of %zu bytes", nbytes);
            goto done;
        }
        qf_pool_run(pool, conv_worker, &j);
        if (j.failed) {
            st = qf_fail(err, QF_ERR_UNSUPPORTED, "quantize: tensor '%s': cannot convert to %s",
                         name, qf_type_name(dst));
            free(name);
            goto done;
        }
        st = qf_gguf_writer_add_tensor(w, name, dst, t->n_dims, t->ne, j.out, nbytes, err);
        free(name);
        if (st != QF_OK) goto done;
    }
    st = qf_gguf_writer_write(w, out_path, err);
    if (st != QF_OK) goto done;

    if (sha256 || tensor_sha256) {
        qf_gguf *g = qf_gguf_open(out_path, err);
        if (!g) {
            st = qf_error_prefix(err, "re-reading the written file: ");
            goto done;
        }
        size_t size;
        const uint8_t *data = qf_gguf_file_data(g, &size);
        if (sha256) qf_sha256(data, size, sha256);
        uint64_t off = qf_gguf_data_offset(g);
        if (tensor_sha256) qf_sha256(data + off, off <= size ? size - off : 0, tensor_sha256);
        qf_gguf_close(g);
    }

done:
    if (bufs)
        for (uint64_t i = 0; i < nt; i++) free(bufs[i]);
    free(bufs);
    qf_gguf_writer_free(w);
    if (pool) qf_pool_free(pool);
    return st;
}

qf_status qf_quantize_model(const char *in_path, const char *out_path, qf_type type, qf_error *err) {
    if (!in_path || !out_path) return qf_fail(err, QF_ERR_ARG, "quantize: input and output paths are required");
    if (type != QF_TYPE_F16 && type != QF_TYPE_Q8_0 && type != QF_TYPE_Q4_0)
        return qf_fail(err, QF_ERR_ARG, "quantize: type %s: expected f16, q8_0 or q4_0",
                       qf_type_name(type) ? qf_type_name(type) : "?");
    qf_gguf *g = qf_gguf_open(in_path, err);
    if (!g) return err ? err->code : QF_ERR_IO;
    qf_status st = qf_forge_write_model(g, out_path, type, false, NULL, NULL, 0, NULL, NULL, err);
    qf_gguf_close(g);
    return st;
}
