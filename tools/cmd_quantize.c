/* cmd_quantize.c: `qforge quantize IN.gguf OUT.gguf TYPE`: round-to-nearest re-quantization
 * (f16, q8_0, q4_0) as llama-quantize does it, or with --awq activation-aware Q4_0 scales
 * learned on the calibration part of a corpus (the evaluation part is held out). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "qforge/awq.h"
#include "qforge/corpus.h"
#include "qforge/model.h"
#include "qforge/tokenizer.h"

static const char *USAGE =
    "qforge quantize IN.gguf OUT.gguf TYPE [--awq [CORPUS options] [AWQ options]] [--json]\n"
    "  TYPE           f16, q8_0 or q4_0 (round-to-nearest, llama-quantize's tensor rules)\n"
    "  --awq          activation-aware scales for q4_0, learned on the calibration split\n"
    "  corpus:  --calib PATH (file or directory, repeatable) | --builtin (the demo corpus);\n"
    "           --eval-frac F (default 0.2: the held-out part is not used here)\n"
    "  awq:     --max-tokens N (calibration tokens, default 8192)  --rows N (rows per site,\n"
    "           default 512)  --grid N (alpha grid, default 20)  --alpha A (fixed alpha)\n"
    "           --no-clip  --no-vo  -c N (window, default 512)  -t N (threads)\n"
    "           --device cpu|cuda|auto (capture, alpha search and block quantizer; default cpu)\n"
    "  --json         print the result as JSON";

static int awq_main(const char *in, const char *out, const char **paths, int n_paths,
                    bool builtin, double eval_frac, qf_awq_params *ap, bool json) {
    qf_error e;
    qf_error_clear(&e);
    qf_corpus *corp = qf_corpus_new();
    if (!corp) {
        qf_fail(&e, QF_ERR_NOMEM, "out of memory");
        return cli_fail("quantize", &e);
    }
    qf_model *m = NULL;
    int32_t *toks = NULL;
    size_t n_toks = 0;
    qf_awq_report rep;
    memset(&rep, 0, sizeof rep);
    qf_status st = QF_OK;
    for (int i = 0; i < n_paths && !st; i++) st = qf_corpus_add_path(corp, paths[i], &e);
    if (!st && builtin) st = qf_corpus_add_builtin(corp, &e);
    if (!st) st = qf_corpus_finalize(corp, eval_frac, &e);
    if (!st && !(m = qf_model_load(in, &e))) st = e.code;
    size_t len = 0;
    const char *calib = st ? NULL : qf_corpus_calib_text(corp, &len);
    if (!st) {
        const qf_tokenizer *tok = qf_model_tokenizer(m);
        st = qf_tokenize(tok, calib, len, qf_tokenizer_add_bos(tok), false, &toks, &n_toks, &e);
    }
    if (!st) st = qf_awq_run(m, toks, (int64_t)n_toks, ap, out, &rep, &e);
    if (st) {
        qf_awq_report_free(&rep);
        free(toks);
        qf_model_free(m);
        qf_corpus_free(corp);
        return cli_fail("quantize", &e);
    }
    const qf_corpus_info *ci = qf_corpus_get_info(corp);
    if (json) {
        json_t *j = json_object();
        json_object_set_new(j, "output", json_string(out));
        json_object_set_new(j, "sha256", json_string(rep.sha256_hex));
        json_object_set_new(j, "tensor_sha256", json_string(rep.tensor_sha256_hex));
        json_object_set_new(j, "calib_tokens", json_integer(rep.calib_tokens));
        json_object_set_new(j, "calib_sha256", json_string(ci->calib_sha256_hex));
        json_object_set_new(j, "rows_per_site", json_integer(rep.rows_used));
        json_object_set_new(j, "vo_skipped_gqa", json_boolean(rep.vo_skipped_gqa));
        json_object_set_new(j, "seconds", json_real(rep.seconds));
        json_t *layers = json_array();
        for (int l = 0; l < rep.n_layer; l++) {
            json_t *lj = json_object();
            for (int g = 0; g < QF_AWQ_GROUP_COUNT; g++) {
                int k = l * QF_AWQ_GROUP_COUNT + g;
                json_t *gj = json_object();
                json_object_set_new(gj, "alpha", json_real(rep.alpha[k]));
                json_object_set_new(gj, "clip", json_real(rep.clip[k]));
                json_object_set_new(gj, "mse_rtn", json_real(rep.mse_rtn[k]));
                json_object_set_new(gj, "mse_awq", json_real(rep.mse_awq[k]));
                json_object_set_new(lj, qf_awq_group_name((qf_awq_group)g), gj);
            }
            json_array_append_new(layers, lj);
        }
        json_object_set_new(j, "layers", layers);
        cli_print_json(j);
    } else {
        printf("awq: %lld calibration tokens (calibration split sha256 %s), %lld rows per site, "
               "%.1f s\n",
               (long long)rep.calib_tokens, ci->calib_sha256_hex, (long long)rep.rows_used,
               rep.seconds);
        printf("%-6s", "layer");
        for (int g = 0; g < QF_AWQ_GROUP_COUNT; g++)
            printf("  %-24s", qf_awq_group_name((qf_awq_group)g));
        printf("\n%-6s", "");
        for (int g = 0; g < QF_AWQ_GROUP_COUNT; g++) printf("  %-24s", "alpha  mse awq/rtn");
        printf("\n");
        for (int l = 0; l < rep.n_layer; l++) {
            printf("%-6d", l);
            for (int g = 0; g < QF_AWQ_GROUP_COUNT; g++) {
                int k = l * QF_AWQ_GROUP_COUNT + g;
                if (rep.alpha[k] < 0) printf("  %-24s", "-");
                else
                    printf("  %-5.2f  %-16.3f", rep.alpha[k],
                           rep.mse_rtn[k] > 0 ? rep.mse_awq[k] / rep.mse_rtn[k] : 1.0);
            }
            printf("\n");
        }
        if (rep.vo_skipped_gqa) printf("v->o group skipped: grouped-query attention (n_head != n_head_kv)\n");
        printf("wrote %s (sha256 %s)\n", out, rep.sha256_hex);
    }
    qf_awq_report_free(&rep);
    free(toks);
    qf_model_free(m);
    qf_corpus_free(corp);
    return 0;
}

int qf_cmd_quantize(int argc, char **argv) {
    const char *pos[3] = {0}, *val;
    int n_pos = 0;
    const char *paths[64];
    int n_paths = 0;
    bool awq = false, builtin = false, json = false;
    double eval_frac = QF_CORPUS_DEFAULT_EVAL_FRAC;
    qf_awq_params ap = qf_awq_default_params();
    for (int i = 1; i < argc; i++) {
        int r;
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            puts(USAGE);
            return 0;
        } else if (!strcmp(a, "--awq")) {
            awq = true;
        } else if (!strcmp(a, "--builtin")) {
            builtin = true;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "--no-clip")) {
            ap.clip = false;
        } else if (!strcmp(a, "--no-vo")) {
            ap.scale_vo = false;
        } else if ((r = cli_flag_value(argc, argv, &i, "--calib", NULL, &val))) {
            if (r < 0) goto missing;
            if (n_paths >= 64) return cli_usage("quantize", USAGE, "too many --calib paths (64 at most)");
            paths[n_paths++] = val;
        } else if ((r = cli_flag_value(argc, argv, &i, "--eval-frac", NULL, &val))) {
            if (r < 0) goto missing;
            if (!cli_parse_double(val, 1e-9, 1 - 1e-9, &eval_frac))
                return cli_usage("quantize", USAGE, "--eval-frac '%s': expected a number in (0, 1)", val);
        } else if ((r = cli_flag_value(argc, argv, &i, "--max-tokens", NULL, &val))) {
            if (r < 0) goto missing;
            if (!cli_parse_i64(val, 1, INT64_MAX, &ap.max_tokens))
                return cli_usage("quantize", USAGE, "--max-tokens '%s': expected a positive integer", val);
        } else if ((r = cli_flag_value(argc, argv, &i, "--rows", NULL, &val))) {
            if (r < 0) goto missing;
            if (!cli_parse_int(val, 1, 1 << 20, &ap.rows_per_site))
                return cli_usage("quantize", USAGE, "--rows '%s': expected 1..1048576", val);
        } else if ((r = cli_flag_value(argc, argv, &i, "--grid", NULL, &val))) {
            if (r < 0) goto missing;
            if (!cli_parse_int(val, 1, 1000, &ap.n_grid))
                return cli_usage("quantize", USAGE, "--grid '%s': expected 1..1000", val);
        } else if ((r = cli_flag_value(argc, argv, &i, "--alpha", NULL, &val))) {
            if (r < 0) goto missing;
            double a2;
            if (!cli_parse_double(val, 0, 1, &a2))
                return cli_usage("quantize", USAGE, "--alpha '%s': expected a number in [0, 1]", val);
            ap.fixed_alpha = (float)a2;
        } else if ((r = cli_flag_value(argc, argv, &i, "-c", "--ctx-size", &val))) {
            if (r < 0) goto missing;
            if (!cli_parse_int(val, 2, 1 << 20, &ap.n_ctx))
                return cli_usage("quantize", USAGE, "-c '%s': expected an integer >= 2", val);
        } else if ((r = cli_flag_value(argc, argv, &i, "--device", NULL, &val))) {
            if (r < 0) goto missing;
            if (!qf_device_from_name(val, &ap.device))
                return cli_usage("quantize", USAGE, "--device '%s': expected cpu, cuda or auto", val);
        } else if ((r = cli_flag_value(argc, argv, &i, "-t", "--threads", &val))) {
            if (r < 0) goto missing;
            if (!cli_parse_int(val, 1, 1024, &ap.n_threads))
                return cli_usage("quantize", USAGE, "-t '%s': expected 1..1024", val);
        } else if (a[0] == '-' && a[1]) {
            return cli_usage("quantize", USAGE, "unknown option '%s'", a);
        } else {
            if (n_pos >= 3) return cli_usage("quantize", USAGE, "unexpected argument '%s'", a);
            pos[n_pos++] = a;
        }
        continue;
    missing:
        return cli_usage("quantize", USAGE, "%s needs a value", a);
    }
    if (n_pos != 3) return cli_usage("quantize", USAGE, "expected IN.gguf OUT.gguf TYPE");
    {   /* OUT must not be IN (nor a corpus file): refused before anything is read or written */
        const char *ins[65], *in_names[65];
        ins[0] = pos[0], in_names[0] = "IN";
        for (int k = 0; k < n_paths; k++) ins[k + 1] = paths[k], in_names[k + 1] = "--calib";
        const char *outs[] = {pos[1]}, *out_names[] = {"OUT"};
        int rc = cli_check_outputs("quantize", ins, in_names, n_paths + 1, outs, out_names, 1);
        if (rc) return rc;
    }
    qf_type type;
    qf_error e;
    qf_error_clear(&e);
    if (!qf_type_from_name(pos[2], &type) ||
        (type != QF_TYPE_F16 && type != QF_TYPE_Q8_0 && type != QF_TYPE_Q4_0)) {
        qf_fail(&e, QF_ERR_ARG, "type '%s': expected f16, q8_0 or q4_0", pos[2]);
        return cli_fail("quantize", &e);
    }
    if (awq) {
        if (type != QF_TYPE_Q4_0) {
            qf_fail(&e, QF_ERR_ARG, "--awq: type '%s': AWQ writes q4_0 only", pos[2]);
            return cli_fail("quantize", &e);
        }
        if (!n_paths && !builtin)
            return cli_usage("quantize", USAGE, "--awq needs a corpus: --calib PATH or --builtin");
        ap.progress = !json;
        return awq_main(pos[0], pos[1], paths, n_paths, builtin, eval_frac, &ap, json);
    }
    if (qf_quantize_model(pos[0], pos[1], type, &e) != QF_OK) return cli_fail("quantize", &e);
    if (json) {
        json_t *j = json_object();
        json_object_set_new(j, "input", json_string(pos[0]));
        json_object_set_new(j, "output", json_string(pos[1]));
        json_object_set_new(j, "type", json_string(qf_type_name(type)));
        cli_print_json(j);
    } else {
        printf("wrote %s (%s)\n", pos[1], qf_type_name(type));
    }
    return 0;
}
