/* cmd_sweep.c: `qforge sweep`, certify several kv-dict configurations with one corpus, one
 * capture and one reference pass (qf_sweep_run in include/qforge/forge.h); one row each. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_job.h"
#include "qforge/forge.h"

#define MAX_CONFIGS 32

static const char *USAGE =
    "qforge sweep -m MODEL [--corpus PATH]... [--builtin] --configs 256x4,512x8,... [--gate G]\n"
    "             [--max-kld K] [--min-top1 T] [-c N] [--max-tok N] [--eval-chunks N] [-t N] [--device D]\n"
    "             [--iters N] [--coef f16|q8] [--max-train N] [--json]\n"
    "  --configs L   kv-dict configurations, ATOMSxSPARSITY, comma-separated (at most 32)\n"
    "  other flags as in qforge calibrate (defaults: -c 256, --max-tok 16384, --eval-chunks 16,\n"
    "  --iters 10, --coef f16, --gate 0.05); nothing is packaged: use qforge calibrate --artifact\n"
    "  kv-dict --atoms A --sparsity S for the configuration you pick";

int qf_cmd_sweep(int argc, char **argv) {
    qf_job j;
    qf_job_default(&j);
    j.kind = QF_ARTIFACT_KV_DICT;
    const char *val, *configs = NULL;
    const char **paths = calloc((size_t)argc + 1, sizeof(char *));
    int n_paths = 0, rc;
    bool json = false;
    char why[256];
    if (!paths) return 1;
#define BAD(...)                                     \
    do {                                             \
        rc = cli_usage("sweep", USAGE, __VA_ARGS__); \
        goto out;                                    \
    } while (0)
    for (int i = 1; i < argc; i++) {
        int r;
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            puts(USAGE);
            rc = 0;
            goto out;
        } else if ((r = cli_job_flag(argc, argv, &i, &j, paths, &n_paths, why, sizeof why))) {
            if (r < 0) BAD("%s", why);
        } else if ((r = cli_flag_value(argc, argv, &i, "--configs", NULL, &val))) {
            if (r < 0) goto missing;
            configs = val;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else {
            BAD("unknown option '%s'", a);
        }
        continue;
    missing:
        BAD("option '%s' needs a value", a);
    }
    if (!j.model_path) BAD("-m MODEL is required");
    if (!configs) BAD("--configs 256x4,512x8,... is required");
    qf_error err = {0};
    qf_dict_config cfg[MAX_CONFIGS];
    int n_cfg = 0;
    if (qf_dict_configs_parse(configs, cfg, MAX_CONFIGS, &n_cfg, &err)) {
        rc = cli_fail("sweep", &err);
        goto out;
    }
    if (n_paths == 0) j.builtin = true;
    j.corpus_paths = paths;
    j.n_corpus_paths = n_paths;
    j.log = cli_root() ? stderr : NULL; /* under mpirun rank 0 prints */
    j.progress = true;
    qf_sweep_row rows[MAX_CONFIGS];
    double ref_ppl;
    qf_status st = qf_sweep_run(&j, cfg, n_cfg, rows, &ref_ppl, &err);
    if (st) {
        rc = cli_fail("sweep", &err);
        goto out;
    }
    if (json) {
        json_t *arr = json_array();
        for (int i = 0; i < n_cfg; i++) {
            const qf_sweep_row *w = &rows[i];
            json_t *o = json_pack("{s:i, s:i, s:s, s:f, s:f, s:f, s:s}", "atoms", w->cfg.n_atoms, "sparsity",
                                  w->cfg.sparsity, "coef", qf_kv_coef_name(j.dict_coef), "bits_per_elem",
                                  w->bits_per_elem, "kv_bytes_per_token", w->kv_bytes_per_token,
                                  "f16_kv_bytes_per_token", w->f16_kv_bytes_per_token, "status",
                                  qf_status_name(w->status));
            if (w->status) {
                json_object_set_new(o, "error", json_string(w->error));
            } else {
                json_object_set_new(o, "cand_ppl", json_real(w->result.cand_ppl));
                json_object_set_new(o, "delta_ppl", json_real(w->result.delta_ppl));
                json_object_set_new(o, "kld_mean", json_real(w->result.kld_mean));
                json_object_set_new(o, "kld_p99", json_real(w->result.kld_p99));
                json_object_set_new(o, "top1", json_real(w->result.top1));
                json_object_set_new(o, "passed", json_boolean(w->result.passed));
            }
            json_array_append_new(arr, o);
        }
        json_t *top = json_pack("{s:s, s:f, s:f, s:o}", "model", j.model_path, "ref_ppl", ref_ppl, "gate_max_delta_ppl",
                                j.gate.max_delta_ppl, "configs", arr);
        cli_print_json(top);
    } else {
        printf("reference PPL %.4f (kv f32); gate: delta PPL <= %.4f%%\n", ref_ppl, 100 * j.gate.max_delta_ppl);
        printf("%-10s %9s %11s %9s %10s %10s %8s  %s\n", "config", "bits/elem", "KV B/token", "vs f16", "dPPL %",
               "KLD mean", "top-1 %", "passed");
        for (int i = 0; i < n_cfg; i++) {
            const qf_sweep_row *w = &rows[i];
            char name[32];
            snprintf(name, sizeof name, "%dx%d", w->cfg.n_atoms, w->cfg.sparsity);
            if (w->status) {
                printf("%-10s %9.3f %11s %9s %10s %10s %8s  %s: %s\n", name, w->bits_per_elem, "-", "-", "-", "-", "-",
                       qf_status_name(w->status), w->error);
                continue;
            }
            printf("%-10s %9.3f %11.0f %8.2fx %+10.4f %10.6f %8.2f  %s\n", name, w->bits_per_elem,
                   w->kv_bytes_per_token, w->f16_kv_bytes_per_token / w->kv_bytes_per_token,
                   100 * w->result.delta_ppl, w->result.kld_mean, 100 * w->result.top1,
                   w->result.passed ? "yes" : "no");
        }
    }
    rc = 0;
out:
    free(paths);
    return rc;
#undef BAD
}
