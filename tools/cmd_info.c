/* cmd_info.c: `qforge info MODEL [--json]`: a GGUF file's header, metadata (long arrays
 * summarised), tensor table and totals, as text or as one JSON document. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "qforge/gguf.h"
#include "qforge/model.h"

#define INFO_USAGE "qforge info MODEL.gguf [--json]"
#define ARRAY_HEAD 8   /* array elements shown before "..." */
#define STR_CLIP 80    /* string bytes shown in text output */

/* ---- text ---- */

static void print_str(const qf_gguf_str *s) {
    putchar('"');
    uint64_t n = s->len < STR_CLIP ? s->len : STR_CLIP;
    for (uint64_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s->ptr[i];
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c == '\n') fputs("\\n", stdout);
        else if (c < 0x20 || c == 0x7f) printf("\\x%02x", c);
        else putchar(c);
    }
    putchar('"');
    if (s->len > n) printf("...(%" PRIu64 " bytes)", s->len);
}

static void print_value(const qf_gguf *g, const qf_gguf_value *v) {
    switch (v->type) {
    case QF_GGUF_UINT8: case QF_GGUF_UINT16: case QF_GGUF_UINT32: case QF_GGUF_UINT64:
        printf("%" PRIu64, v->v.u64);
        break;
    case QF_GGUF_INT8: case QF_GGUF_INT16: case QF_GGUF_INT32: case QF_GGUF_INT64:
        printf("%" PRId64, v->v.i64);
        break;
    case QF_GGUF_FLOAT32: case QF_GGUF_FLOAT64: printf("%.9g", v->v.f64); break;
    case QF_GGUF_BOOL: fputs(v->v.u64 ? "true" : "false", stdout); break;
    case QF_GGUF_STRING: print_str(&v->v.str); break;
    case QF_GGUF_ARRAY: {
        printf("%s[%" PRIu64 "] [", qf_gguf_type_name(v->v.arr.elem_type), v->v.arr.count);
        for (uint64_t i = 0; i < v->v.arr.count && i < ARRAY_HEAD; i++) {
            qf_gguf_value e;
            if (!qf_gguf_array_get(g, v, i, &e)) break;
            if (i) fputs(", ", stdout);
            print_value(g, &e);
        }
        if (v->v.arr.count > ARRAY_HEAD) fputs(", ...", stdout);
        putchar(']');
        break;
    }
    default: fputs("?", stdout); break;
    }
}

/* ---- JSON ---- */

/* jansson refuses invalid UTF-8; such strings come out with the bad bytes as '?'. */
static json_t *json_str(const char *p, uint64_t len) {
    json_t *j = json_stringn(p, len);
    if (j) return j;
    char *copy = malloc(len + 1);
    if (!copy) return json_null();
    for (uint64_t i = 0; i < len; i++) copy[i] = (unsigned char)p[i] < 0x80 ? p[i] : '?';
    copy[len] = 0;
    j = json_stringn(copy, len);
    free(copy);
    return j ? j : json_null();
}

static json_t *json_value(const qf_gguf *g, const qf_gguf_value *v) {
    switch (v->type) {
    case QF_GGUF_UINT8: case QF_GGUF_UINT16: case QF_GGUF_UINT32: case QF_GGUF_UINT64:
        /* json_int_t is signed 64-bit; the rare larger value goes out as a string. */
        if (v->v.u64 > INT64_MAX) {
            char b[32];
            snprintf(b, sizeof b, "%" PRIu64, v->v.u64);
            return json_string(b);
        }
        return json_integer((json_int_t)v->v.u64);
    case QF_GGUF_INT8: case QF_GGUF_INT16: case QF_GGUF_INT32: case QF_GGUF_INT64:
        return json_integer((json_int_t)v->v.i64);
    case QF_GGUF_FLOAT32: case QF_GGUF_FLOAT64: return json_real(v->v.f64);
    case QF_GGUF_BOOL: return json_boolean(v->v.u64 != 0);
    case QF_GGUF_STRING: return json_str(v->v.str.ptr, v->v.str.len);
    case QF_GGUF_ARRAY: {
        json_t *head = json_array();
        for (uint64_t i = 0; i < v->v.arr.count && i < ARRAY_HEAD; i++) {
            qf_gguf_value e;
            if (!qf_gguf_array_get(g, v, i, &e)) break;
            json_array_append_new(head, json_value(g, &e));
        }
        return json_pack("{s:s, s:s, s:I, s:o, s:b}", "type", "array", "elem_type",
                         qf_gguf_type_name(v->v.arr.elem_type), "count",
                         (json_int_t)v->v.arr.count, "head", head, "truncated",
                         v->v.arr.count > ARRAY_HEAD);
    }
    default: return json_null();
    }
}

/* ---- the model qforge would run: family and features, or why it would not ---- */

typedef struct {
    bool runnable;
    char family[96];
    char summary[256];
    char features[512];
    char error[512];
} model_view;

static void model_describe(const char *path, model_view *mv) {
    memset(mv, 0, sizeof *mv);
    qf_error err = {0};
    qf_model *m = qf_model_load(path, &err);
    if (!m) {
        snprintf(mv->error, sizeof mv->error, "%s", err.msg);
        return;
    }
    const qf_hparams *hp = qf_model_hparams(m);
    mv->runnable = true;
    snprintf(mv->family, sizeof mv->family, "%s%s", hp->arch_name,
             hp->arch == QF_ARCH_LLAMA && hp->n_expert ? " (mixtral-style MoE)" : "");
    snprintf(mv->summary, sizeof mv->summary,
             "%d layers, n_embd %d, %d heads (%d kv) x %d, n_ff %d, vocab %d, rope %s base %g%s", hp->n_layer,
             hp->n_embd, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_ff, hp->n_vocab,
             hp->rope_type == QF_ROPE_NEOX ? "neox" : "norm", hp->rope_freq_base,
             hp->tied_output ? ", tied output" : "");
    qf_hparams_features(hp, mv->features, sizeof mv->features);
    qf_model_free(m);
}

/* ---- totals per tensor type ---- */

typedef struct {
    uint64_t tensors, params, bytes;
} type_total;

int qf_cmd_info(int argc, char **argv) {
    const char *path = NULL;
    bool as_json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) as_json = true;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: %s\n", INFO_USAGE);
            return 0;
        } else if (argv[i][0] == '-' && argv[i][1]) return cli_usage("info", INFO_USAGE, "unknown flag '%s'", argv[i]);
        else if (path) return cli_usage("info", INFO_USAGE, "more than one file given");
        else path = argv[i];
    }
    if (!path) return cli_usage("info", INFO_USAGE, "missing MODEL argument");

    qf_error err = {0};
    qf_gguf *g = qf_gguf_open(path, &err);
    if (!g) return cli_fail("info", &err);
    size_t file_size;
    qf_gguf_file_data(g, &file_size);

    type_total by_type[QF_TYPE_COUNT] = {{0}};
    uint64_t total_params = 0, total_bytes = 0;
    for (uint64_t i = 0; i < qf_gguf_n_tensors(g); i++) {
        const qf_gguf_tensor *t = qf_gguf_tensor_at(g, i);
        uint64_t n = (uint64_t)qf_gguf_tensor_nelements(t);
        by_type[t->type].tensors++;
        by_type[t->type].params += n;
        by_type[t->type].bytes += t->nbytes;
        total_params += n;
        total_bytes += t->nbytes;
    }

    if (as_json) {
        json_t *meta = json_object();
        for (uint64_t i = 0; i < qf_gguf_n_kv(g); i++) {
            const qf_gguf_kv *kv = qf_gguf_kv_at(g, i);
            json_t *k = json_str(kv->key.ptr, kv->key.len);
            const char *key = json_is_string(k) ? json_string_value(k) : "?";
            json_object_set_new(meta, key,
                                json_pack("{s:s, s:o}", "type", qf_gguf_type_name(kv->value.type),
                                          "value", json_value(g, &kv->value)));
            json_decref(k);
        }
        json_t *tensors = json_array();
        for (uint64_t i = 0; i < qf_gguf_n_tensors(g); i++) {
            const qf_gguf_tensor *t = qf_gguf_tensor_at(g, i);
            json_t *shape = json_array();
            for (uint32_t d = 0; d < t->n_dims; d++) json_array_append_new(shape, json_integer(t->ne[d]));
            json_array_append_new(tensors,
                                  json_pack("{s:o, s:s, s:o, s:I, s:I, s:I}", "name",
                                            json_str(t->name.ptr, t->name.len), "type",
                                            qf_type_name(t->type), "shape", shape, "offset",
                                            (json_int_t)t->offset, "bytes", (json_int_t)t->nbytes,
                                            "params", (json_int_t)qf_gguf_tensor_nelements(t)));
        }
        json_t *per_type = json_object();
        for (int t = 0; t < QF_TYPE_COUNT; t++)
            if (by_type[t].tensors)
                json_object_set_new(per_type, qf_type_name((qf_type)t),
                                    json_pack("{s:I, s:I, s:I}", "tensors",
                                              (json_int_t)by_type[t].tensors, "params",
                                              (json_int_t)by_type[t].params, "bytes",
                                              (json_int_t)by_type[t].bytes));
        model_view mv;
        model_describe(path, &mv);
        json_t *model = mv.runnable ? json_pack("{s:b, s:s, s:s, s:s}", "runnable", 1, "family", mv.family, "summary",
                                                mv.summary, "features", mv.features)
                                    : json_pack("{s:b, s:s}", "runnable", 0, "error", mv.error);
        json_t *out = json_pack(
            "{s:s, s:I, s:i, s:I, s:I, s:I, s:I, s:o, s:o, s:{s:I, s:I, s:o}, s:o}", "file", path,
            "file_size", (json_int_t)file_size, "version", (int)qf_gguf_version(g), "alignment",
            (json_int_t)qf_gguf_alignment(g), "data_offset", (json_int_t)qf_gguf_data_offset(g),
            "n_kv", (json_int_t)qf_gguf_n_kv(g), "n_tensors", (json_int_t)qf_gguf_n_tensors(g),
            "metadata", meta, "tensors", tensors, "totals", "params", (json_int_t)total_params,
            "bytes", (json_int_t)total_bytes, "by_type", per_type, "model", model);
        cli_print_json(out);
        qf_gguf_close(g);
        return 0;
    }

    printf("file:        %s\n", path);
    printf("size:        %zu bytes\n", file_size);
    printf("version:     %u\n", qf_gguf_version(g));
    printf("alignment:   %" PRIu64 "\n", qf_gguf_alignment(g));
    printf("data offset: %" PRIu64 "\n", qf_gguf_data_offset(g));
    printf("\nmetadata (%" PRIu64 " keys):\n", qf_gguf_n_kv(g));
    for (uint64_t i = 0; i < qf_gguf_n_kv(g); i++) {
        const qf_gguf_kv *kv = qf_gguf_kv_at(g, i);
        printf("  %-44.*s %-8s ", (int)(kv->key.len < 200 ? kv->key.len : 200), kv->key.ptr,
               qf_gguf_type_name(kv->value.type));
        print_value(g, &kv->value);
        putchar('\n');
    }
    printf("\ntensors (%" PRIu64 "):\n", qf_gguf_n_tensors(g));
    if (qf_gguf_n_tensors(g))
        printf("  %5s %-32s %-6s %-24s %12s %12s\n", "#", "name", "type", "shape", "offset", "bytes");
    for (uint64_t i = 0; i < qf_gguf_n_tensors(g); i++) {
        const qf_gguf_tensor *t = qf_gguf_tensor_at(g, i);
        char shape[128];
        int n = 0;
        for (uint32_t d = 0; d < t->n_dims; d++)
            n += snprintf(shape + n, sizeof shape - (size_t)n, "%s%" PRId64, d ? " x " : "", t->ne[d]);
        printf("  %5" PRIu64 " %-32.*s %-6s %-24s %12" PRIu64 " %12" PRIu64 "\n", i,
               (int)(t->name.len < 200 ? t->name.len : 200), t->name.ptr, qf_type_name(t->type),
               shape, t->offset, t->nbytes);
    }
    printf("\ntotals: %" PRIu64 " params, %" PRIu64 " bytes of tensor data\n", total_params,
           total_bytes);
    for (int t = 0; t < QF_TYPE_COUNT; t++)
        if (by_type[t].tensors)
            printf("  %-6s %5" PRIu64 " tensors %12" PRIu64 " params %12" PRIu64 " bytes\n",
                   qf_type_name((qf_type)t), by_type[t].tensors, by_type[t].params, by_type[t].bytes);
    model_view mv;
    model_describe(path, &mv);
    if (mv.runnable) {
        printf("\nmodel:       %s: %s\n", mv.family, mv.summary);
        printf("features:    %s\n", mv.features[0] ? mv.features : "(none beyond llama)");
    } else {
        printf("\nmodel:       not runnable by qforge: %s\n", mv.error);
    }
    qf_gguf_close(g);
    return 0;
}
