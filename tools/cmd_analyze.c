/* cmd_analyze.c: `qforge analyze`, every KV-cache method judged on the end metric (ΔPPL, mean
 * and p99 KLD, same-top-1 vs the f32-KV model on the held-out split), the Pareto frontier over
 * bits per element and a verdict per method. Argument parsing and printing only: the pipeline
 * is qf_analyze_run (include/qforge/analyze.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "qforge/analyze.h"

static const char *USAGE =
    "qforge analyze -m MODEL [--corpus PATH]... [--builtin] [--eval-frac F] [-c N] [--chunks N]\n"
    "               [--methods LIST] [--dict 256x4,256x8,...] [--dict-iters N] [--dict-coef f16|q8]\n"
    "               [--rq-bits 3,4] [--max-tok N] [--max-per-layer N] [--tables-in-rate]\n"
    "               [--no-cross-check] [--device auto|cpu|cuda] [-t N] [--seed S] [--json] [--svg FILE]\n"
    "  --corpus PATH      text (file or directory; repeatable), split into calibration and held-out\n"
    "                     evaluation documents as the forge splits it; default: the built-in demo corpus\n"
    "  --eval-frac F      share of documents held out for evaluation (default 0.2)\n"
    "  -c N               evaluation chunk and capture window (default 512, at most the model's context)\n"
    "  --chunks N         evaluation chunks per method and rate (default 12; 0 = all the split holds)\n"
    "  --methods LIST     comma-separated subset of: f16, q8_0, q4_0, q8_0+hadamard, q4_0+hadamard,\n"
    "                     kv-int8, kv-dict (default: all)\n"
    "  --dict LIST        kv-dict sizes, atoms x sparsity (default 256x4,256x8,256x16)\n"
    "  --dict-iters N     k-SVD iterations per dictionary (default 10)\n"
    "  --dict-coef C      kv-dict coefficient storage, f16 or q8 (default f16)\n"
    "  --rq-bits LIST     kv-rq budgets in bits per element, overheads included (default 3,4)\n"
    "  --max-tok N        calibration tokens captured for the learners (default 8192)\n"
    "  --max-per-layer N  K (and V) vectors kept per layer (default 4096)\n"
    "  --tables-in-rate   judge on bits per element with the learned side tables (scales,\n"
    "                     dictionaries) amortised over one context, not on per-token storage\n"
    "  --no-cross-check   skip the capture of the first window on the scalar reference route\n"
    "  --device D         where the capture runs (default auto); every evaluation runs on the CPU\n"
    "  --svg FILE         mean KLD (log) vs bits per element, one curve per method, the frontier";

/* "2,3,4" -> out[], each in [lo, hi]. */
static bool parse_int_list(const char *s, int lo, int hi, int *out, int max, int *n) {
    *n = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < lo || v > hi || *n >= max) return false;
        out[(*n)++] = (int)v;
        s = end;
        if (*s == ',') s++;
        else if (*s) return false;
    }
    return *n > 0;
}

static json_t *point_json(const qf_analyze_report *rep, const qf_analyze_point *pt) {
    json_t *o = json_pack("{s:s, s:s, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:b, s:b, s:f}", "method",
                          pt->method, "label", pt->label, "bits_per_element", pt->bits_per_element,
                          "bits_per_element_with_tables", pt->bits_per_element_with_tables, "table_bytes",
                          pt->table_bytes, "kv_bytes_per_token", pt->kv_bytes_per_token, "ppl", pt->ppl, "delta_ppl",
                          pt->delta_ppl, "kld_mean", pt->kld_mean, "kld_err", pt->kld_err, "kld_p99", pt->kld_p99,
                          "top1", pt->top1, "passes_gate", pt->passes_gate, "on_frontier", pt->on_frontier, "seconds",
                          pt->seconds);
    if (pt->dominated_by >= 0) {
        const qf_analyze_point *d = &rep->points[pt->dominated_by];
        json_object_set_new(o, "dominated_by",
                            json_pack("{s:s, s:s, s:b}", "method", d->method, "label", d->label, "within_noise",
                                      pt->within_noise));
    } else {
        json_object_set_new(o, "dominated_by", json_null());
    }
    return o;
}

static void print_json(const char *model_path, const qf_analyze_report *rep) {
    json_t *points = json_array(), *frontier = json_array(), *verdicts = json_array(), *skipped = json_array();
    for (int i = 0; i < rep->n_points; i++) json_array_append_new(points, point_json(rep, &rep->points[i]));
    for (int k = 0; k < rep->n_frontier; k++)
        json_array_append_new(frontier, point_json(rep, &rep->points[rep->frontier[k]]));
    for (int m = 0; m < rep->n_verdicts; m++)
        json_array_append_new(verdicts, json_pack("{s:s, s:s, s:i, s:i}", "method", rep->verdicts[m].method, "verdict",
                                                  rep->verdicts[m].verdict, "points", rep->verdicts[m].n_points,
                                                  "on_frontier", rep->verdicts[m].n_on_frontier));
    for (int k = 0; k < rep->n_skipped; k++)
        json_array_append_new(skipped, json_pack("{s:s, s:s, s:s}", "method", rep->skipped[k].method, "label",
                                                 rep->skipped[k].label, "reason", rep->skipped[k].reason));
    json_t *j = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:I, s:I, s:I, s:I, s:I, s:s}", "model", model_path,
                          "n_layer", rep->n_layer, "n_head_kv", rep->n_head_kv, "head_dim", rep->head_dim, "n_ctx",
                          rep->n_ctx, "chunks", rep->n_chunks, "scored", (json_int_t)rep->n_scored, "eval_tokens",
                          (json_int_t)rep->eval_tokens, "calib_tokens", (json_int_t)rep->calib_tokens, "calib_docs",
                          (json_int_t)rep->calib_docs, "eval_docs", (json_int_t)rep->eval_docs, "rate",
                          rep->tables_in_rate ? "bits_per_element_with_tables" : "bits_per_element");
    json_object_set_new(j, "reference", json_pack("{s:s, s:f, s:f}", "kv", "f32", "ppl", rep->ref_ppl,
                                                  "bits_per_element", rep->ref_bits_per_element));
    json_object_set_new(j, "frontier", frontier);
    json_object_set_new(j, "points", points);
    json_object_set_new(j, "verdicts", verdicts);
    json_object_set_new(j, "skipped", skipped);
    if (rep->capture_device[0]) json_object_set_new(j, "capture_device", json_string(rep->capture_device));
    if (rep->cross_check_tokens > 0) {
        json_object_set_new(j, "cross_check_tokens", json_integer(rep->cross_check_tokens));
        json_object_set_new(j, "cross_check_max_rel_diff", json_real(rep->cross_check_max_rel_diff));
    }
    json_object_set_new(j, "capture_seconds", json_real(rep->seconds_capture));
    json_object_set_new(j, "reference_seconds", json_real(rep->seconds_reference));
    json_object_set_new(j, "seconds", json_real(rep->seconds));
    cli_print_json(j);
}

int qf_cmd_analyze(int argc, char **argv) {
    const char *svg = NULL, *val;
    const char **corpora = calloc((size_t)argc, sizeof *corpora);
    if (!corpora) return cli_usage("analyze", USAGE, "out of memory");
    bool json = false;
    qf_analyze_params ap;
    qf_analyze_params_default(&ap);
    qf_error err = {0};
    int rc = 0;
    for (int i = 1; i < argc; i++) {
        int r;
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            puts(USAGE);
            goto out;
        } else if ((r = cli_flag_value(argc, argv, &i, "-m", "--model", &val))) {
            if (r < 0) goto missing;
            ap.model_path = val;
        } else if ((r = cli_flag_value(argc, argv, &i, "--corpus", NULL, &val))) {
            if (r < 0) goto missing;
            corpora[ap.n_corpus_paths++] = val;
        } else if (!strcmp(a, "--builtin")) {
            ap.builtin = true;
        } else if ((r = cli_flag_value(argc, argv, &i, "--eval-frac", NULL, &val))) {
            if (r < 0) goto missing;
            if (!cli_parse_double(val, 0.01, 0.99, &ap.eval_frac)) {
                rc = cli_usage("analyze", USAGE, "bad --eval-frac '%s' (0.01 .. 0.99)", val);
                goto out;
            }
        } else if ((r = cli_flag_value(argc, argv, &i, "-c", "--ctx-size", &val))) {
            if (r < 0) goto missing;
            if (!cli_parse_int(val, 8, 1 << 20, &ap.n_ctx)) goto bad;
        } else if ((r = cli_flag_value(argc, argv, &i, "--chunks", NULL, &val))) {
            if (r < 0) goto missing;
            if (!cli_parse_int(val, 0, 1 << 30, &ap.eval_chunks)) goto bad;
            if (ap.eval_chunks == 0) ap.eval_chunks = -1; /* all */
        } else if ((r = cli_flag_value(argc, argv, &i, "--methods", NULL, &val))) {
            if (r < 0) goto missing;
            ap.methods = val;
        } else if ((r = cli_flag_value(argc, argv, &i, "--dict", NULL, &val))) {
            if (r < 0) goto missing;
            if (qf_dict_configs_parse(val, ap.dict, QF_ANALYZE_MAX_RATES, &ap.n_dict, &err)) {
                rc = cli_usage("analyze", USAGE, "bad --dict: %s", err.msg);
                goto out;
            }
        } else if ((r = cli_flag_value(argc, argv, &i, "--dict-iters", NULL, &val))) {
            if (r < 0) goto missing;
            if (!cli_parse_int(val, 1, 1000, &ap.dict_iters)) goto bad;
        } else if ((r = cli_flag_value(argc, argv, &i, "--dict-coef", NULL, &val))) {
            if (r < 0) goto missing;
            if (!strcmp(val, "f16")) ap.dict_coef = QF_KV_COEF_F16;
            else if (!strcmp(val, "q8")) ap.dict_coef = QF_KV_COEF_Q8;
            else goto bad;
        } else if ((r = cli_flag_value(argc, argv, &i, "--rq-bits", NULL, &val))) {
            if (r < 0) goto missing;
            if (!parse_int_list(val, 1, 8, ap.rq_bits, QF_ANALYZE_MAX_RATES, &ap.n_rq_bits)) goto bad;
        } else if ((r = cli_flag_value(argc, argv, &i, "--max-tok", NULL, &val))) {
            if (r < 0) goto missing;
            if (!cli_parse_i64(val, 1, (int64_t)1 << 40, &ap.max_calib_tokens)) goto bad;
        } else if ((r = cli_flag_value(argc, argv, &i, "--max-per-layer", NULL, &val))) {
            if (r < 0) goto missing;
            if (!cli_parse_i64(val, 16, (int64_t)1 << 28, &ap.capture_per_layer)) goto bad;
        } else if ((r = cli_flag_value(argc, argv, &i, "-t", "--threads", &val))) {
            if (r < 0) goto missing;
            if (!cli_parse_int(val, 1, 1024, &ap.n_threads)) goto bad;
        } else if ((r = cli_flag_value(argc, argv, &i, "--seed", NULL, &val))) {
            if (r < 0) goto missing;
            int64_t s;
            if (!cli_parse_i64(val, 0, INT64_MAX, &s)) goto bad;
            ap.seed = (uint64_t)s;
        } else if ((r = cli_flag_value(argc, argv, &i, "--svg", NULL, &val))) {
            if (r < 0) goto missing;
            svg = val;
        } else if ((r = cli_flag_value(argc, argv, &i, "--device", NULL, &val))) {
            if (r < 0) goto missing;
            if (!qf_device_from_name(val, &ap.capture_device)) goto bad;
        } else if (!strcmp(a, "--tables-in-rate")) {
            ap.tables_in_rate = true;
        } else if (!strcmp(a, "--no-cross-check")) {
            ap.cross_check = false;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else {
            rc = cli_usage("analyze", USAGE, "unknown option '%s'", a);
            goto out;
        }
        continue;
    missing:
        rc = cli_usage("analyze", USAGE, "option '%s' needs a value", a);
        goto out;
    bad:
        rc = cli_usage("analyze", USAGE, "bad %s '%s'", a, val);
        goto out;
    }
    if (!ap.model_path) {
        rc = cli_usage("analyze", USAGE, "-m MODEL is required");
        goto out;
    }
    ap.corpus_paths = corpora;
    /* under mpirun every rank runs the same analysis (capture and evaluation are sharded
     * inside the library); rank 0 prints */
    ap.log = json || !cli_root() ? NULL : stderr;
    ap.progress = json && cli_root();
    qf_analyze_report rep;
    if (qf_analyze_run(&ap, &rep, &err)) {
        rc = cli_fail("analyze", &err);
    } else if (!cli_root()) {
        /* nothing to print */
    } else if (json) {
        print_json(ap.model_path, &rep);
    } else {
        qf_analyze_report_print(&rep, stdout);
        if (rep.cross_check_tokens > 0)
            printf("capture routes: CPU reference vs %s on the first %d tokens: max relative difference %.3e\n",
                   !strcmp(rep.capture_device, "cuda") ? "GPU read-back" : "CPU fast path", rep.cross_check_tokens,
                   rep.cross_check_max_rel_diff);
        printf("time: capture %.1f s, reference %.1f s, total %.1f s\n", rep.seconds_capture, rep.seconds_reference,
               rep.seconds);
    }
    /* the numbers are out before the picture: a bad --svg path loses nothing but the picture */
    if (!rc && svg && cli_root()) {
        fflush(stdout);
        if (qf_analyze_write_svg(&rep, svg, &err)) rc = cli_fail("analyze", &err);
    }
    qf_analyze_report_free(&rep);
out:
    free(corpora);
    return rc;
}
