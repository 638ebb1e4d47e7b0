/* cli_job.c: parsing of the forge job flags shared by `qforge calibrate` and `qforge sweep`. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_job.h"

#define BAD(...) return snprintf(msg, cap, __VA_ARGS__), -1

int cli_job_flag(int argc, char **argv, int *i, qf_job *j, const char **paths, int *n_paths, char *msg,
                 size_t cap) {
    const char *a = argv[*i], *val = NULL;
    int64_t i64;
    int r;
#define FLAG(name, alias) ((r = cli_flag_value(argc, argv, i, name, alias, &val)) != 0)
    if (!strcmp(a, "--builtin")) {
        j->builtin = true;
        return 1;
    }
    if (FLAG("-m", "--model")) {
        if (r < 0) goto missing;
        j->model_path = val;
    } else if (FLAG("--corpus", NULL)) {
        if (r < 0) goto missing;
        paths[(*n_paths)++] = val;
    } else if (FLAG("--ollama", NULL)) {
        if (r < 0) goto missing;
        j->ollama_url = val;
    } else if (FLAG("--ollama-model", NULL)) {
        if (r < 0) goto missing;
        j->ollama_model = val;
    } else if (FLAG("--synth-docs", NULL)) {
        if (r < 0) goto missing;
        if (!cli_parse_int(val, 1, 100000, &j->synth_docs)) BAD("bad --synth-docs '%s'", val);
    } else if (FLAG("--eval-frac", NULL)) {
        if (r < 0) goto missing;
        if (!cli_parse_double(val, 0, 1, &j->eval_frac) || j->eval_frac <= 0 || j->eval_frac >= 1)
            BAD("bad --eval-frac '%s' (a fraction strictly between 0 and 1)", val);
    } else if (FLAG("--gate", NULL)) {
        if (r < 0) goto missing;
        if (!cli_parse_double(val, 0, 1e6, &j->gate.max_delta_ppl)) BAD("bad --gate '%s' (a fraction >= 0)", val);
    } else if (FLAG("--max-kld", NULL)) {
        if (r < 0) goto missing;
        if (!cli_parse_double(val, 0, 1e6, &j->gate.max_kld)) BAD("bad --max-kld '%s'", val);
        j->gate.has_max_kld = true;
    } else if (FLAG("--max-kld-p99", NULL)) {
        if (r < 0) goto missing;
        if (!cli_parse_double(val, 0, 1e6, &j->gate.max_kld_p99)) BAD("bad --max-kld-p99 '%s'", val);
        j->gate.has_max_kld_p99 = true;
    } else if (!strcmp(a, "--allow-worse-than-baseline")) {
        j->gate.vs_baseline = false;
    } else if (FLAG("--ctx", NULL)) {
        if (r < 0) goto missing;
        qf_error e = {0};
        if (qf_ctx_list_parse(val, j->ctx_list, QF_JOB_MAX_CTX, &j->n_ctx_list, &e)) BAD("%s", e.msg);
    } else if (FLAG("--min-top1", NULL)) {
        if (r < 0) goto missing;
        if (!cli_parse_double(val, 0, 1, &j->gate.min_top1)) BAD("bad --min-top1 '%s' (a fraction in [0, 1])", val);
        j->gate.has_min_top1 = true;
    } else if (FLAG("-c", "--ctx-size")) {
        if (r < 0) goto missing;
        if (!cli_parse_int(val, 8, 1 << 16, &j->n_ctx)) BAD("bad -c '%s'", val);
    } else if (FLAG("--device", NULL)) {
        if (r < 0) goto missing;
        if (!qf_device_from_name(val, &j->capture_device)) BAD("bad --device '%s' (auto, cpu, cuda)", val);
    } else if (FLAG("--arith", NULL)) {
        if (r < 0) goto missing;
        bool canonical;
        if (!cli_parse_arith(val, &canonical)) BAD("bad --arith '%s' (canonical or fast)", val);
        j->arith_fast = !canonical;
    } else if (FLAG("--max-tok", NULL)) {
        if (r < 0) goto missing;
        if (!cli_parse_i64(val, 0, INT64_MAX, &j->max_calib_tokens)) BAD("bad --max-tok '%s'", val);
        if (j->max_calib_tokens == 0) j->max_calib_tokens = -1; /* all */
    } else if (FLAG("--eval-chunks", NULL)) {
        if (r < 0) goto missing;
        if (!cli_parse_int(val, 0, 1 << 30, &j->eval_chunks)) BAD("bad --eval-chunks '%s'", val);
        if (j->eval_chunks == 0) j->eval_chunks = -1; /* all */
    } else if (FLAG("-t", "--threads")) {
        if (r < 0) goto missing;
        if (!cli_parse_int(val, 1, 1024, &j->n_threads)) BAD("bad -t '%s'", val);
    } else if (FLAG("--ref-kv", NULL)) {
        if (r < 0) goto missing;
        if (!qf_kv_mode_from_name(val, &j->ref_kv) || j->ref_kv >= QF_KV_INT8) BAD("bad --ref-kv '%s'", val);
    } else if (FLAG("--capture", NULL)) {
        if (r < 0) goto missing;
        if (!cli_parse_i64(val, 16, (int64_t)1 << 32, &j->capture_per_layer)) BAD("bad --capture '%s'", val);
    } else if (FLAG("--seed", NULL)) {
        if (r < 0) goto missing;
        if (!cli_parse_i64(val, 0, INT64_MAX, &i64)) BAD("bad --seed '%s'", val);
        j->seed = (uint64_t)i64;
    } else if (FLAG("--atoms", NULL)) {
        if (r < 0) goto missing;
        if (!cli_parse_int(val, 1, QF_KV_MAX_ATOMS, &j->dict_atoms)) BAD("bad --atoms '%s'", val);
    } else if (FLAG("--sparsity", NULL)) {
        if (r < 0) goto missing;
        if (!cli_parse_int(val, 1, 64, &j->dict_sparsity)) BAD("bad --sparsity '%s'", val);
    } else if (FLAG("--iters", NULL)) {
        if (r < 0) goto missing;
        if (!cli_parse_int(val, 1, 1000, &j->dict_iters)) BAD("bad --iters '%s'", val);
    } else if (FLAG("--max-train", NULL)) {
        if (r < 0) goto missing;
        if (!cli_parse_i64(val, 0, INT64_MAX, &j->dict_max_train)) BAD("bad --max-train '%s'", val);
    } else if (FLAG("--bits", NULL)) {
        if (r < 0) goto missing;
        if (!cli_parse_double(val, 1.0, 16.0, &j->rq_bits)) BAD("bad --bits '%s' (kv-rq budget, bits per element in [1, 16])", val);
    } else if (FLAG("--sinks", NULL)) {
        if (r < 0) goto missing;
        if (!cli_parse_int(val, 0, 1 << 20, &j->rq_sink)) BAD("bad --sinks '%s'", val);
    } else if (FLAG("--window", NULL)) {
        if (r < 0) goto missing;
        if (!cli_parse_int(val, 0, 1 << 20, &j->rq_window)) BAD("bad --window '%s'", val);
    } else if (FLAG("--rq-alpha", NULL)) {
        if (r < 0) goto missing;
        if (!cli_parse_double(val, 0, 2, &j->rq_k_alpha)) BAD("bad --rq-alpha '%s' (in [0, 2])", val);
    } else if (FLAG("--k-prerope", NULL)) {
        if (r < 0) goto missing;
        if (!strcmp(val, "on")) j->rq_prerope = 1;
        else if (!strcmp(val, "off")) j->rq_prerope = 0;
        else BAD("bad --k-prerope '%s' (on, off)", val);
    } else if (FLAG("--rq-weights", NULL)) {
        if (r < 0) goto missing;
        if (!strcmp(val, "on")) j->rq_qaware = 1;
        else if (!strcmp(val, "off")) j->rq_qaware = 0;
        else BAD("bad --rq-weights '%s' (on, off)", val);
    } else if (FLAG("--rq-v-alpha", NULL)) {
        if (r < 0) goto missing;
        if (!cli_parse_double(val, 0, 2, &j->rq_v_alpha)) BAD("bad --rq-v-alpha '%s' (in [0, 2])", val);
    } else if (FLAG("--v-pred", NULL)) {
        if (r < 0) goto missing;
        if (!strcmp(val, "on")) j->rq_vpred = 1;
        else if (!strcmp(val, "off")) j->rq_vpred = 0;
        else BAD("bad --v-pred '%s' (on, off)", val);
    } else if (FLAG("--rq-transform", NULL)) {
        if (r < 0) goto missing;
        if (!strcmp(val, "klt")) j->rq_transform = 1;
        else if (!strcmp(val, "hadamard")) j->rq_transform = 0;
        else BAD("bad --rq-transform '%s' (klt, hadamard)", val);
    } else if (FLAG("--rq-klt-rates", NULL)) {
        if (r < 0) goto missing;
        if (!strcmp(val, "eighths")) j->rq_klt_eighths = 1;
        else if (!strcmp(val, "whole")) j->rq_klt_eighths = 0;
        else BAD("bad --rq-klt-rates '%s' (whole, eighths)", val);
    } else if (FLAG("--rq-klt-metric", NULL)) {
        if (r < 0) goto missing;
        if (!strcmp(val, "attention")) j->rq_klt_plain = 0;
        else if (!strcmp(val, "plain")) j->rq_klt_plain = 1;
        else BAD("bad --rq-klt-metric '%s' (attention, plain)", val);
    } else if (FLAG("--v-pred-noise", NULL)) {
        if (r < 0) goto missing;
        if (!cli_parse_double(val, 0, 10, &j->rq_vpred_noise)) BAD("bad --v-pred-noise '%s' (in [0, 10])", val);
    } else if (FLAG("--min-bits", NULL)) {
        if (r < 0) goto missing;
        if (!cli_parse_int(val, 1, 6, &j->rq_min_bits)) BAD("bad --min-bits '%s' (1..6)", val);
    } else if (FLAG("--sens-chunks", NULL)) {
        if (r < 0) goto missing;
        if (!cli_parse_int(val, 1, 1000, &j->rq_sens_chunks)) BAD("bad --sens-chunks '%s'", val);
    } else if (FLAG("--rq-min-bits", NULL)) {
        if (r < 0) goto missing;
        if (!cli_parse_int(val, 1, 6, &j->rq_min_bits)) BAD("bad --rq-min-bits '%s' (1..6)", val);
    } else if (FLAG("--sens-ctx", NULL)) {
        if (r < 0) goto missing;
        if (!cli_parse_int(val, 2, 1 << 20, &j->rq_sens_ctx)) BAD("bad --sens-ctx '%s'", val);
    } else if (FLAG("--dict-version", NULL)) {
        if (r < 0) goto missing;
        if (!cli_parse_int(val, 1, 2, &j->dict_version)) BAD("bad --dict-version '%s' (1, 2)", val);
    } else if (FLAG("--tol-quantile", NULL)) {
        if (r < 0) goto missing;
        char *end;
        double q = strtod(val, &end);
        if (*end || !(q >= 0 && q <= 1)) BAD("bad --tol-quantile '%s' (0..1)", val);
        j->dict_tol_quantile = q;
    } else if (FLAG("--coef", NULL)) {
        if (r < 0) goto missing;
        if (!strcmp(val, "f16")) j->dict_coef = QF_KV_COEF_F16;
        else if (!strcmp(val, "q8")) j->dict_coef = QF_KV_COEF_Q8;
        else BAD("bad --coef '%s' (f16, q8)", val);
    } else {
        return 0;
    }
#undef FLAG
    return 1;
missing:
    BAD("option '%s' needs a value", a);
}
