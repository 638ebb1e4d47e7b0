/* cmd_analyze.c: `qforge analyze`, the sparse-dictionary go/no-go on our engine's real KV
 * vectors: corpus -> capture (fast route, cross-checked against the reference route on a
 * prefix) -> per-layer analysis and rate-distortion sweep -> table, JSON, SVG. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "qforge/capture.h"
#include "qforge/corpus.h"
#include "qforge/kvlearn.h"
#include "qforge/model.h"
#include "qforge/util.h"

static const char *USAGE =
    "qforge analyze -m MODEL [--corpus PATH]... [--builtin] [--atoms N] [--sparsity S] [--iters I]\n"
    "               [--layer-stride L] [--max-per-layer N] [--max-tok N] [-c N] [-t N]\n"
    "               [--rd 256x4,512x8,...] [--no-cross-check] [--device auto|cpu|cuda] [--json] [--svg FILE]\n"
    "  --corpus PATH      calibration text (file or directory; repeatable); default: the built-in demo corpus\n"
    "  --atoms/--sparsity/--iters   the go/no-go dictionary (default 256 / 4 / 20, the seed's)\n"
    "  --layer-stride L   analyse every L-th layer (default 1)\n"
    "  --max-per-layer N  K (and V) vectors kept per layer (default 4096)\n"
    "  --max-tok N        calibration tokens run through the model (default 8192)\n"
    "  --rd LIST          rate-distortion points atoms x sparsity (default 64x2,128x4,256x4,256x8,512x8)\n"
    "  --no-cross-check   skip the reference-route capture of the first window\n"
    "  --device D         where the capture runs (default auto: the GPU when one is found; K/V are\n"
    "                     read back from GPU memory); the cross-check always uses the CPU reference\n"
    "  --svg FILE         draw the pooled rate-distortion curves";

static bool parse_rd(const char *s, qf_kv_analysis_params *p) {
    p->n_rd = 0;
    while (*s) {
        if (p->n_rd >= QF_KV_RD_MAX_POINTS) return false;
        char *end;
        long a = strtol(s, &end, 10);
        if (end == s || *end != 'x') return false;
        s = end + 1;
        long sp = strtol(s, &end, 10);
        if (end == s || a < 1 || a > QF_KV_MAX_ATOMS || sp < 1 || sp > 64) return false;
        p->rd_atoms[p->n_rd] = (int)a;
        p->rd_sparsity[p->n_rd] = (int)sp;
        p->n_rd++;
        s = end;
        if (*s == ',') s++;
        else if (*s) return false;
    }
    return p->n_rd > 0;
}

static json_t *rd_json(const qf_kv_rd_table *t) {
    json_t *arr = json_array();
    for (int c = 0; c < t->n_curves; c++) {
        const qf_kv_rd_curve *cv = &t->curves[c];
        json_t *pts = json_array();
        for (int i = 0; i < cv->n; i++)
            json_array_append_new(pts, json_pack("{s:s, s:f, s:f}", "label", cv->label[i], "bits_per_elem", cv->bits[i],
                                                 "rel_mse", cv->err[i]));
        json_array_append_new(arr, json_pack("{s:s, s:o}", "method", cv->name, "points", pts));
    }
    return arr;
}

int qf_cmd_analyze(int argc, char **argv) {
    const char *model_path = NULL, *svg = NULL, *val;
    const char *corpora[64];
    int n_corpora = 0, n_ctx = 512, n_threads = 0;
    bool json = false, builtin = false, cross_check = true;
    qf_device device = QF_DEVICE_AUTO;
    int64_t max_per_layer = 4096, max_tok = 8192;
    qf_kv_analysis_params ap;
    qf_kv_analysis_params_default(&ap);
    parse_rd("64x2,128x4,256x4,256x8,512x8", &ap);
    for (int i = 1; i < argc; i++) {
        int r;
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            puts(USAGE);
            return 0;
        } else if ((r = cli_flag_value(argc, argv, &i, "-m", "--model", &val))) {
            if (r < 0) goto missing;
            model_path = val;
        } else if ((r = cli_flag_value(argc, argv, &i, "--corpus", NULL, &val))) {
            if (r < 0) goto missing;
            if (n_corpora == 64) return cli_usage("analyze", USAGE, "too many --corpus");
            corpora[n_corpora++] = val;
        } else if (!strcmp(a, "--builtin")) {
            builtin = true;
        } else if ((r = cli_flag_value(argc, argv, &i, "--atoms", NULL, &val))) {
            if (r < 0) goto missing;
            if (!cli_parse_int(val, 2, QF_KV_MAX_ATOMS, &ap.n_atoms)) return cli_usage("analyze", USAGE, "bad --atoms '%s'", val);
        } else if ((r = cli_flag_value(argc, argv, &i, "--sparsity", NULL, &val))) {
            if (r < 0) goto missing;
            if (!cli_parse_int(val, 1, 64, &ap.sparsity)) return cli_usage("analyze", USAGE, "bad --sparsity '%s'", val);
        } else if ((r = cli_flag_value(argc, argv, &i, "--iters", NULL, &val))) {
            if (r < 0) goto missing;
            if (!cli_parse_int(val, 0, 1000, &ap.iters)) return cli_usage("analyze", USAGE, "bad --iters '%s'", val);
        } else if ((r = cli_flag_value(argc, argv, &i, "--layer-stride", NULL, &val))) {
            if (r < 0) goto missing;
            if (!cli_parse_int(val, 1, 1000, &ap.layer_stride)) return cli_usage("analyze", USAGE, "bad --layer-stride '%s'", val);
        } else if ((r = cli_flag_value(argc, argv, &i, "--max-per-layer", NULL, &val))) {
            if (r < 0) goto missing;
            if (!cli_parse_i64(val, 16, (int64_t)1 << 28, &max_per_layer)) return cli_usage("analyze", USAGE, "bad --max-per-layer '%s'", val);
        } else if ((r = cli_flag_value(argc, argv, &i, "--max-tok", NULL, &val))) {
            if (r < 0) goto missing;
            if (!cli_parse_i64(val, 1, (int64_t)1 << 40, &max_tok)) return cli_usage("analyze", USAGE, "bad --max-tok '%s'", val);
        } else if ((r = cli_flag_value(argc, argv, &i, "-c", "--ctx-size", &val))) {
            if (r < 0) goto missing;
            if (!cli_parse_int(val, 8, 1 << 20, &n_ctx)) return cli_usage("analyze", USAGE, "bad -c '%s'", val);
        } else if ((r = cli_flag_value(argc, argv, &i, "-t", "--threads", &val))) {
            if (r < 0) goto missing;
            if (!cli_parse_int(val, 1, 1024, &n_threads)) return cli_usage("analyze", USAGE, "bad -t '%s'", val);
        } else if ((r = cli_flag_value(argc, argv, &i, "--rd", NULL, &val))) {
            if (r < 0) goto missing;
            if (!parse_rd(val, &ap)) return cli_usage("analyze", USAGE, "bad --rd '%s' (e.g. 256x4,512x8)", val);
        } else if ((r = cli_flag_value(argc, argv, &i, "--svg", NULL, &val))) {
            if (r < 0) goto missing;
            svg = val;
        } else if ((r = cli_flag_value(argc, argv, &i, "--device", NULL, &val))) {
            if (r < 0) goto missing;
            if (!qf_device_from_name(val, &device)) return cli_usage("analyze", USAGE, "bad --device '%s'", val);
        } else if (!strcmp(a, "--no-cross-check")) {
            cross_check = false;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else {
            return cli_usage("analyze", USAGE, "unknown option '%s'", a);
        }
        continue;
    missing:
        return cli_usage("analyze", USAGE, "option '%s' needs a value", a);
    }
    if (!model_path) return cli_usage("analyze", USAGE, "-m MODEL is required");
    if (ap.sparsity > ap.n_atoms) return cli_usage("analyze", USAGE, "--sparsity must not exceed --atoms");

    qf_error err = {0};
    int rc = 0;
    qf_model *m = NULL;
    qf_context *c = NULL;
    qf_capture *cap = NULL, *cap_ref = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    qf_kv_report rep = {0};
    double t0 = qf_now_sec();
    qf_corpus *corpus = qf_corpus_new();
    if (!corpus) {
        qf_fail(&err, QF_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < n_corpora; i++)
        if (qf_corpus_add_path(corpus, corpora[i], &err)) goto fail;
    if ((builtin || n_corpora == 0) && qf_corpus_add_builtin(corpus, &err)) goto fail;
    if (qf_corpus_finalize(corpus, QF_CORPUS_DEFAULT_EVAL_FRAC, &err)) goto fail;
    if (!(m = qf_model_load(model_path, &err))) goto fail;
    const qf_hparams *hp = qf_model_hparams(m);
    size_t calib_len;
    const char *calib = qf_corpus_calib_text(corpus, &calib_len);
    if (qf_tokenize(qf_model_tokenizer(m), calib, calib_len, qf_tokenizer_add_bos(qf_model_tokenizer(m)), false, &ids,
                    &n_ids, &err))
        goto fail;
    if (n_ctx > hp->n_ctx_train && hp->n_ctx_train > 0) n_ctx = hp->n_ctx_train;
    qf_context_params cp = qf_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_threads = n_threads;
    cp.kv_k = cp.kv_v = QF_KV_F32;
    cp.device = device;
    if (!(c = qf_context_new(m, &cp, &err))) goto fail;
    ap.n_threads = qf_context_params_get(c)->n_threads;
    qf_capture_params capp = {.max_per_layer = max_per_layer, .activations = false, .seed = 1};
    if (!(cap = qf_capture_new(hp, &capp, &err))) goto fail;
    if (!json)
        fprintf(stderr, "analyze: %s, calibration split %zu tokens, capturing up to %lld on the %s\n", model_path, n_ids,
                (long long)max_tok, qf_context_device(c) == QF_DEVICE_CUDA ? "GPU (read back)" : "CPU");
    if (qf_capture_run(c, cap, ids, (int64_t)n_ids, n_ctx, max_tok, true, &err)) goto fail;
    double t_capture = qf_now_sec() - t0;

    double cross = -1;
    int cross_tokens = n_ctx < 128 ? n_ctx : 128;
    if (cross_check) {
        /* the same first window through the scalar reference route and the fast route */
        qf_context_params rp = cp;
        rp.reference = true;
        rp.n_ctx = cross_tokens;
        qf_context *rc_ctx = qf_context_new(m, &rp, &err);
        qf_context_params fp = cp;
        fp.n_ctx = cross_tokens;
        qf_context *fc_ctx = rc_ctx ? qf_context_new(m, &fp, &err) : NULL;
        qf_capture *cap_fast = NULL;
        qf_capture_params xp = {.max_per_layer = (int64_t)cross_tokens * hp->n_head_kv, .seed = 1};
        if (fc_ctx && (cap_ref = qf_capture_new(hp, &xp, &err)) && (cap_fast = qf_capture_new(hp, &xp, &err)) &&
            !qf_capture_run(rc_ctx, cap_ref, ids, (int64_t)n_ids, cross_tokens, cross_tokens, false, &err) &&
            !qf_capture_run(fc_ctx, cap_fast, ids, (int64_t)n_ids, cross_tokens, cross_tokens, false, &err))
            cross = qf_capture_max_rel_diff(cap_ref, cap_fast);
        qf_capture_free(cap_fast);
        qf_context_free(fc_ctx);
        qf_context_free(rc_ctx);
        if (cross < 0) goto fail;
    }

    qf_kv_capture_view view = qf_capture_kv_view(cap);
    if (qf_kv_analyze(&view, &ap, &rep, &err)) goto fail;
    double total = qf_now_sec() - t0;
    if (svg && qf_kv_rd_write_svg(&rep.rd_all, svg, &err)) goto fail;

    if (json) {
        json_t *layers = json_array();
        for (int i = 0; i < rep.n_layers; i++) {
            const qf_kv_layer_verdict *v = &rep.layers[i];
            char stream[2] = {v->stream, 0};
            json_t *row = json_pack(
                "{s:i, s:s, s:I, s:f, s:f, s:f, s:f, s:f, s:i, s:f, s:b, s:s, s:f, s:f, s:b}", "layer", v->layer, "stream",
                stream, "n_vectors", (json_int_t)v->n_vectors, "int8_rel_mse", v->recon_int8, "int8_bits", v->int8_bits,
                "int8_static_rel_mse", v->recon_int8_static, "dict_rel_mse", v->recon_dict, "dict_code_bits",
                v->dict_code_bits, "uniform_matched_bits", v->matched_bits, "uniform_matched_rel_mse",
                v->recon_uniform_matched, "go", v->go, "best_baseline", v->best_baseline, "best_baseline_bits",
                v->best_baseline_bits, "best_baseline_rel_mse", v->recon_best_baseline, "go_strict", v->go_strict);
            json_array_append_new(layers, row);
        }
        json_t *j = json_pack("{s:s, s:I, s:I, s:i, s:i, s:i, s:o, s:b, s:b, s:f, s:f, s:f, s:o, s:f, s:f}", "model",
                              model_path, "calib_tokens", (json_int_t)n_ids, "captured_tokens",
                              (json_int_t)qf_capture_tokens_seen(cap), "n_atoms", rep.n_atoms, "sparsity", rep.sparsity,
                              "head_dim", rep.head_dim, "layers", layers, "go", rep.overall_go, "go_strict",
                              rep.overall_go_strict, "f16_bytes_per_token", rep.f16_bytes_per_token,
                              "int8_bytes_per_token", rep.int8_bytes_per_token, "dict_bytes_per_token",
                              rep.dict_bytes_per_token, "rate_distortion", rd_json(&rep.rd_all), "capture_seconds",
                              t_capture, "seconds", total);
        json_object_set_new(j, "capture_device", json_string(qf_device_name(qf_context_device(c))));
        if (cross >= 0) {
            json_object_set_new(j, "cross_check_tokens", json_integer(cross_tokens));
            json_object_set_new(j, "cross_check_max_rel_diff", json_real(cross));
        }
        cli_print_json(j);
    } else {
        qf_kv_report_print(&rep, stdout);
        if (cross >= 0)
            printf("capture routes: CPU reference vs %s on the first %d tokens: max relative difference %.3e\n",
                   qf_context_device(c) == QF_DEVICE_CUDA ? "GPU read-back" : "CPU fast path", cross_tokens, cross);
        printf("verdict: %s (seed rule), %s (strict: best baseline at no more bits)\n", rep.overall_go ? "GO" : "NO-GO",
               rep.overall_go_strict ? "GO" : "NO-GO");
        printf("time: capture %.1f s, total %.1f s\n", t_capture, total);
    }
    goto done;
fail:
    rc = cli_fail("analyze", &err);
done:
    qf_kv_report_free(&rep);
    qf_capture_free(cap);
    qf_capture_free(cap_ref);
    free(ids);
    qf_context_free(c);
    qf_model_free(m);
    qf_corpus_free(corpus);
    return rc;
}
