/* cmd_verify.c: `qforge verify X.qfa [-m MODEL.gguf] [--trust-key PEM] [--json]`: verify an
 * artifact as the engine would before using it, print its certificate (a table, or one JSON
 * document) and exit with the refusal's own code. A certificate that was read intact is
 * printed even when the model or gate check then refuses it, so the reason is visible. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "qforge/artifact.h"
#include "qforge/artifact_bind.h"
#include "qforge/model.h"
#include "qforge/util.h"

#define VERIFY_USAGE "qforge verify X.qfa [-m MODEL.gguf] [--trust-key PEM] [--json]"

static const char *const type_names[] = {"f32", "u8", "i8", "int", "float", "string"};

/* Strings come from the file: keep control bytes off the terminal. */
static const char *clean(const char *s, char *buf, size_t cap) {
    size_t i = 0;
    for (; s[i] && i + 1 < cap; i++) buf[i] = (unsigned char)s[i] < 0x20 || s[i] == 0x7f ? '?' : s[i];
    buf[i] = '\0';
    return buf;
}

static json_t *jstr(const char *s) {
    json_t *j = json_string(s);
    return j ? j : json_string("(invalid UTF-8)");
}

static json_t *jhex(const uint8_t *b, size_t n) {
    char h[2 * 64 + 1];
    qf_hex(b, n, h);
    return json_string(h);
}

/* JSON has no NaN or infinity: those come out as null rather than losing the document. */
static json_t *jnum(double v) {
    json_t *j = json_real(v);
    return j ? j : json_null();
}

static json_t *jscalar(const qf_payload_entry *e) {
    switch (e->type) {
    case QF_PAYLOAD_INT: return json_integer(e->i);
    case QF_PAYLOAD_FLOAT: return jnum(e->f);
    case QF_PAYLOAD_STRING: return jstr(e->str);
    default: return json_null();
    }
}

static json_t *jopt(bool has, double v) { return has ? jnum(v) : json_null(); }

/* The artifact's rate at its largest certified context: the certificate's "bits_per_element"
 * when it records one, else the kind's own function on the model (-m) when one is given. */
static double bits_of(const qf_artifact *a, const char *model_path) {
    double b = NAN;
    if (qf_payload_get_float(&a->cert.config, "bits_per_element", &b)) return b;
    if (!model_path) return NAN;
    qf_error e = {0};
    qf_model *m = qf_model_load(model_path, &e);
    if (!m) return NAN;
    int mx = qf_artifact_max_certified_ctx(a);
    b = qf_artifact_bits_per_element(a->cert.kind, &a->payload, qf_model_hparams(m),
                                     mx > 0 ? mx : qf_model_hparams(m)->n_ctx_train);
    qf_model_free(m);
    return b;
}

static json_t *to_json(const char *path, const qf_artifact *a, qf_status st, const qf_error *e, double bits) {
    const qf_certificate *c = &a->cert;
    json_t *cfg = json_object(), *pl = json_array();
    for (size_t i = 0; i < c->config.n; i++)
        json_object_set_new(cfg, c->config.entries[i].name, jscalar(&c->config.entries[i]));
    for (size_t i = 0; i < a->payload.n; i++) {
        const qf_payload_entry *en = &a->payload.entries[i];
        json_t *o = json_pack("{s:o, s:s}", "name", jstr(en->name), "type", type_names[en->type]);
        if (en->type <= QF_PAYLOAD_I8) {
            json_t *shape = json_array();
            for (int d = 0; d < en->n_dims; d++) json_array_append_new(shape, json_integer(en->shape[d]));
            json_object_set_new(o, "shape", shape);
            json_object_set_new(o, "count", json_integer((json_int_t)en->count));
        } else {
            json_object_set_new(o, "value", jscalar(en));
        }
        json_array_append_new(pl, o);
    }
    json_t *j = json_pack(
        "{s:s, s:i, s:s, s:b, s:o, s:o,"
        " s:{s:o, s:o, s:o, s:o, s:I, s:I, s:I, s:o, s:I, s:I, s:o, s:o, s:o},"
        " s:{s:o, s:o, s:o, s:o, s:o, s:o},"
        " s:{s:o, s:o, s:o, s:b},"
        " s:o, s:o, s:o, s:{s:s, s:s}}",
        "file", path, "format_version", (int)a->version, "kind", qf_artifact_kind_name(c->kind),
        "signed", a->is_signed, "signer_public_key",
        a->is_signed ? jhex(a->signer_public_key, 32) : json_null(), "file_sha256",
        jhex(a->file_sha256, 32),
        "provenance", "model_sha256", jhex(c->model_sha256, 32), "model_name", jstr(c->model_name),
        "model_arch", jstr(c->model_arch), "corpus_sha256", jhex(c->corpus_sha256, 32),
        "corpus_docs", (json_int_t)c->corpus_docs, "calib_docs", (json_int_t)c->calib_docs,
        "eval_docs", (json_int_t)c->eval_docs, "split", jstr(c->split), "calib_tokens",
        (json_int_t)c->calib_tokens, "eval_tokens", (json_int_t)c->eval_tokens, "engine_version",
        jstr(c->engine_version), "engine_commit", jstr(c->engine_commit), "config", cfg,
        "metrics", "ref_ppl", jnum(c->ref_ppl), "cand_ppl", jnum(c->cand_ppl), "delta_ppl",
        jnum(c->delta_ppl), "kld_mean", jnum(c->kld_mean), "kld_p99", jnum(c->kld_p99),
        "top1_agreement", jnum(c->top1_agreement),
        "gate", "max_delta_ppl", jnum(c->gate_max_delta_ppl), "max_kld",
        jopt(c->gate_has_max_kld, c->gate_max_kld), "min_top1",
        jopt(c->gate_has_min_top1, c->gate_min_top1), "passed", c->passed,
        "created_utc", jstr(c->created_utc), "payload_sha256", jhex(c->payload_sha256, 32),
        "payload", pl,
        "verdict", "status", qf_status_name(st), "message", st == QF_OK ? "verified" : e->msg);
    /* issue 15's top-level keys: the rate (every overhead included) and the certified contexts */
    json_object_set_new(j, "bits_per_element", isfinite(bits) ? json_real(bits) : json_null());
    double tb = qf_artifact_table_bytes(c->kind, &a->payload);
    json_object_set_new(j, "table_bytes", isfinite(tb) ? json_real(tb) : json_null());
    int ctx[16];
    int n = qf_certificate_certified_ctx(c, ctx, 16);
    json_t *cc = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(cc, json_integer(ctx[i]));
    json_object_set_new(j, "certified_ctx", cc);
    return j;
}

static void print_table(const char *path, const qf_artifact *a, double bits) {
    const qf_certificate *c = &a->cert;
    char h[65], b[256];
    printf("artifact        %s\n", clean(path, b, sizeof b));
    printf("format          .qfa version %u, kind %s\n", a->version, qf_artifact_kind_name(c->kind));
    qf_hex(a->file_sha256, 32, h);
    printf("checksum        %s (ok)\n", h);
    if (a->is_signed) {
        qf_hex(a->signer_public_key, 32, h);
        printf("signature       Ed25519 by %s (ok)\n", h);
    } else {
        printf("signature       none\n");
    }
    qf_hex(c->model_sha256, 32, h);
    printf("model           %s (%s)\n", clean(c->model_name, b, sizeof b), c->model_arch);
    printf("model sha256    %s\n", h);
    qf_hex(c->corpus_sha256, 32, h);
    printf("corpus sha256   %s\n", h);
    printf("corpus          %" PRId64 " docs: %" PRId64 " calibration, %" PRId64 " evaluation (split %s)\n",
           c->corpus_docs, c->calib_docs, c->eval_docs, clean(c->split, b, sizeof b));
    printf("tokens          %" PRId64 " calibration, %" PRId64 " evaluation\n", c->calib_tokens,
           c->eval_tokens);
    printf("engine          qforge %s (%s)\n", clean(c->engine_version, b, sizeof b), c->engine_commit);
    printf("created         %s\n", clean(c->created_utc, b, sizeof b));
    for (size_t i = 0; i < c->config.n; i++) {
        const qf_payload_entry *e = &c->config.entries[i];
        printf("config          %s = ", clean(e->name, b, sizeof b));
        if (e->type == QF_PAYLOAD_INT) printf("%" PRId64 "\n", e->i);
        else if (e->type == QF_PAYLOAD_FLOAT) printf("%.9g\n", e->f);
        else printf("\"%s\"\n", clean(e->str, b, sizeof b));
    }
    printf("ppl             ref %.4f, cand %.4f, delta %+.3f%%\n", c->ref_ppl, c->cand_ppl,
           100.0 * c->delta_ppl);
    printf("kld             mean %.6f, p99 %.6f\n", c->kld_mean, c->kld_p99);
    printf("top-1 agreement %.2f%%\n", 100.0 * c->top1_agreement);
    qf_gate g;
    qf_gate_numbers gn;
    qf_certificate_gate(c, &g, &gn);
    printf("gate            %s <= %.3f%%", g.two_sided ? "|delta_ppl|" : "delta_ppl", 100.0 * g.max_delta_ppl);
    if (g.has_max_kld) printf(", kld_mean <= %.6f", g.max_kld);
    if (g.has_max_kld_p99) printf(", kld_p99 <= %.6f", g.max_kld_p99);
    if (g.has_min_top1) printf(", top-1 >= %.2f%%", 100.0 * g.min_top1);
    if (g.vs_baseline) printf(", kld_mean <= free baseline's %.6f", gn.baseline_kld_mean);
    printf(": %s\n", c->passed ? "PASSED" : "FAILED");
    if (isfinite(bits)) printf("bits/element    %.4f\n", bits);
    double tb = qf_artifact_table_bytes(c->kind, &a->payload);
    if (isfinite(tb)) printf("tables          %.0f bytes fixed per model (not in bits/element)\n", tb);
    int ctx[16];
    int n = qf_certificate_certified_ctx(c, ctx, 16);
    printf("certified ctx  ");
    for (int i = 0; i < n; i++) printf("%s%d", i ? "," : " ", ctx[i]);
    printf("%s\n", n > 0 ? "" : " (not recorded)");
    qf_hex(c->payload_sha256, 32, h);
    printf("payload sha256  %s\n", h);
    for (size_t i = 0; i < a->payload.n; i++) {
        const qf_payload_entry *e = &a->payload.entries[i];
        printf("payload         %-24s %-6s ", clean(e->name, b, sizeof b), type_names[e->type]);
        if (e->type <= QF_PAYLOAD_I8) {
            for (int d = 0; d < e->n_dims; d++) printf("%s%" PRId64, d ? "x" : "[", e->shape[d]);
            printf("]\n");
        } else if (e->type == QF_PAYLOAD_INT) printf("%" PRId64 "\n", e->i);
        else if (e->type == QF_PAYLOAD_FLOAT) printf("%.9g\n", e->f);
        else printf("\"%s\"\n", clean(e->str, b, sizeof b));
    }
}

/* The loader's own checks, run on the model: `ppl --artifact` binds a KV artifact to a context
 * of the model (payload names, shapes, scales, dictionaries against n_layer/n_head_kv/head_dim);
 * verify binds it to a small CPU context of the same model the same way, so it says "verified"
 * exactly when ppl/generate would run the artifact. An awq artifact has nothing to bind (the
 * GGUF it names is what runs). Returns QF_OK or the bind's refusal (in *e). */
static qf_status bind_check(const char *model_path, const qf_artifact *a, qf_error *e) {
    if (a->cert.kind == QF_ARTIFACT_AWQ) return QF_OK;
    qf_model *m = qf_model_load(model_path, e);
    if (!m) return e->code;
    qf_context_params cp = qf_context_default_params();
    cp.n_ctx = 16;
    cp.n_batch = 1;
    cp.n_threads = 1;
    cp.device = QF_DEVICE_CPU;
    cp.reference = true; /* nothing is decoded: no BLAS buffers needed, so it fits tight limits */
    qf_context *c = qf_context_new(m, &cp, e);
    qf_status st = c ? qf_context_bind_artifact(c, a, e) : e->code;
    qf_context_free(c);
    qf_model_free(m);
    return st;
}

int qf_cmd_verify(int argc, char **argv) {
    const char *cmd = "verify", *path = NULL, *model = NULL, *trust = NULL, *v;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        int r;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: %s\n", VERIFY_USAGE);
            return 0;
        }
        if (!strcmp(argv[i], "--json")) { json = true; continue; }
        if ((r = cli_flag_value(argc, argv, &i, "--model", "-m", &v))) {
            if (r < 0) return cli_usage(cmd, VERIFY_USAGE, "%s needs a value", argv[i]);
            if (model) return cli_usage(cmd, VERIFY_USAGE, "-m given twice ('%s', '%s')", model, v);
            model = v;
            continue;
        }
        if ((r = cli_flag_value(argc, argv, &i, "--trust-key", NULL, &v))) {
            if (r < 0) return cli_usage(cmd, VERIFY_USAGE, "%s needs a value", argv[i]);
            if (trust) return cli_usage(cmd, VERIFY_USAGE, "--trust-key given twice");
            trust = v;
            continue;
        }
        if (argv[i][0] == '-') return cli_usage(cmd, VERIFY_USAGE, "unknown flag '%s'", argv[i]);
        if (path) return cli_usage(cmd, VERIFY_USAGE, "one artifact at a time ('%s')", argv[i]);
        path = argv[i];
    }
    if (!path) return cli_usage(cmd, VERIFY_USAGE, "missing the artifact path");

    qf_error e;
    uint8_t msha[32];
    if (model && qf_sha256_file(model, msha, &e) != QF_OK) return cli_fail(cmd, &e);
    qf_artifact a;
    qf_status st = qf_artifact_read(path, trust, &a, &e);
    if (st != QF_OK) return cli_fail(cmd, &e);
    qf_artifact_kind kind = a.cert.kind;
    st = qf_artifact_check(&a, model ? msha : NULL, &e);
    if (st == QF_OK && model) st = bind_check(model, &a, &e);
    double bits = bits_of(&a, model);
    if (json) cli_print_json(to_json(path, &a, st, &e, bits));
    else print_table(path, &a, bits);
    qf_artifact_free(&a);
    if (st != QF_OK) return cli_fail(cmd, &e);
    if (!json)
        printf("verdict         verified%s%s\n", model ? " for this model" : " (model and payload not checked: no -m)",
               kind == QF_ARTIFACT_AWQ ? " (awq: run the GGUF it names; it is not a --artifact for the KV cache)" : "");
    return 0;
}
