/* cmd_calibrate.c: `qforge calibrate`, one forge job: corpus -> capture -> learn -> certify
 * -> package (qf_job_run in include/qforge/forge.h). Flags map onto qf_job fields. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_job.h"
#include "qforge/forge.h"

static const char *USAGE =
    "qforge calibrate -m MODEL --artifact kv-int8|kv-dict|awq|kv-rq [--corpus PATH]... [--builtin]\n"
    "                 [--gate G] [--max-kld K] [--max-kld-p99 K] [--min-top1 T] [--allow-worse-than-baseline]\n"
    "                 [-c N] [--ctx N,N...] [--max-tok N] [--eval-chunks N] [--device D] [--arith A]\n"
    "                 [-t N] [--sign-key PEM] -o OUT.qfa [--eval-out FILE] [--json]\n"
    "  --corpus PATH     a text file or directory (repeatable); none = the built-in demo corpus\n"
    "  --builtin         add the built-in demo corpus (assets/corpora/kerneldoc-demo)\n"
    "  --ollama URL --ollama-model M [--synth-docs N]   add documents synthesized by a local Ollama\n"
    "  --eval-frac F     share of documents held out for certification (default 0.2)\n"
    "  --gate G          max |relative PPL change|, fraction (default 0.05 = 5%)\n"
    "  --max-kld K       require mean KLD <= K (nats; default by the artifact's bits per element:\n"
    "                    >= 6 bits 0.002, >= 3.5 bits 0.02, below 0.05; awq: not gated)\n"
    "  --max-kld-p99 K   require p99 KLD <= K (default by rate: 0.02, 0.2, 0.5)\n"
    "  --min-top1 T      also require same-top-1 agreement >= T (fraction)\n"
    "  --allow-worse-than-baseline   accept a mean KLD above the free baseline's at the same rate\n"
    "                    (q8_0 above 6 bits, q4_0 + hadamard below; measured on the same tokens)\n"
    "  -c N              capture window and evaluation chunk, tokens (default 256)\n"
    "  --ctx N,N...      certify at each context (e.g. 512,4096; the first is the capture window and\n"
    "                    replaces -c); the certificate's certified_ctx lists those that passed, and\n"
    "                    ppl/generate --artifact refuse a larger -c\n"
    "  --max-tok N       calibration tokens to capture (default 16384; 0 = all)\n"
    "  --device D        where the capture runs: auto (default: the GPU when one is found), cpu, cuda;\n"
    "                    awq: its alpha search and block quantizer too;\n"
    "                    certification runs on the CPU, except kv-int8, kv-rq, awq and kv-dict (v1)\n"
    "                    with --device cuda: then on the GPU, its first chunk re-checked on the CPU\n"
    "                    (in the certificate)\n"
    "  --arith A         canonical (default): certify in the canonical arithmetic, the same numbers on\n"
    "                    the CPU and the GPU (the certificate records arith); fast: each device's own,\n"
    "                    faster route (the certificate then depends on the device)\n"
    "  --eval-chunks N   evaluation chunks of N tokens (default 16; 0 = all)\n"
    "  -t N              threads (default all cores)\n"
    "  --ref-kv T        reference KV cache type: f32 (default) or f16\n"
    "  --capture N       K (and V) vectors kept per layer (default 16384)\n"
    "  --seed S          capture and dictionary seed (default 1)\n"
    "  --percentile P    kv-int8 clip percentile of |x| (default 100 = absmax)\n"
    "  --atoms N --sparsity S --iters N --coef f16|q8 --max-train N   kv-dict settings\n"
    "                    (defaults 256, 8, 10, f16, all captured vectors)\n"
    "  --bits B          kv-rq: budget, bits per element at -c N with every overhead (codes, row scales,\n"
    "                    f16 sinks and window); none = the fewest bits that pass the gate\n"
    "  --sinks S --window R   kv-rq: f16 sink and recent-window tokens (default: chosen by the learner)\n"
    "  --rq-alpha A --sens-chunks N   kv-rq: K channel smoothing exponent (0.5), sensitivity chunks (2; 4 with format 3)\n"
    "  --k-prerope on|off --min-bits B  kv-rq: keys before RoPE, allocation floor 1|2 (default: on and 1 up to 3 bits)\n"
    "  --v-pred on|off   kv-rq: V predicted from the same layer's K, rows code the residual (on with pre-RoPE keys)\n"
    "  --v-pred-noise X  kv-rq: the predictor's ridge, relative noise on the K it reads (0.2)\n"
    "  --rq-weights on|off --rq-v-alpha A   kv-rq: query/attn_output-weighted channel scales (off), V exponent (0.5)\n"
    "  --rq-transform klt|hadamard   kv-rq: KLT + per-coordinate widths (payload format 3; the default with --bits) or Hadamard\n"
    "  --rq-klt-rates whole|eighths     kv-rq klt: code rates per (layer, stream) in 1/8 bits (default) or whole bits\n"
    "  --rq-klt-metric attention|plain  kv-rq klt: PCA weighted by query energy / attn_output Gram (default) or plain\n"
    "  --rq-min-bits B   kv-rq with --bits: no (layer, stream) below B code bits (default 2)\n"
    "  --sens-ctx N      kv-rq: tokens per sensitivity and window-split chunk (default min(-c, 512));\n"
    "                    -c N measures them at the certified context (slower, fits long contexts)\n"
    "  --dict-version 2   kv-dict v2: keys learned and stored before RoPE, bit-packed indices\n"
    "                     (up to 4096 atoms, 12 bits), CPU only; --sparsity is the cap\n"
    "  --tol-quantile Q   kv-dict v2: error-bounded OMP, bound = Q-quantile of the training\n"
    "                     residual at the cap (0 = fixed sparsity; rows stay sized at the cap)\n"
    "  --sign-key PEM    sign the artifact (PEM Ed25519 private key)\n"
    "  -o OUT.qfa        the artifact (written only when the gate passes)\n"
    "  --eval-out FILE   write the exact evaluation text (to rerun: qforge ppl --artifact OUT.qfa -f FILE)\n"
    "  --json            print the report as JSON";

static json_t *jnum(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static json_t *result_json(const qf_certify_result *r) {
    json_t *o = json_pack("{s:o, s:o, s:o, s:o, s:o, s:o, s:i, s:i, s:I, s:f, s:f, s:b}", "ref_ppl", jnum(r->ref_ppl),
                          "cand_ppl", jnum(r->cand_ppl), "delta_ppl", jnum(r->delta_ppl), "kld_mean", jnum(r->kld_mean),
                          "kld_p99", jnum(r->kld_p99), "top1", jnum(r->top1), "n_ctx", r->n_ctx, "chunks", r->n_chunks,
                          "eval_tokens", (json_int_t)r->eval_tokens, "kv_bytes_per_token", r->cand_kv_bytes_per_token,
                          "ref_kv_bytes_per_token", r->ref_kv_bytes_per_token, "passed", r->passed);
    json_object_set_new(o, "bits_per_element", jnum(r->bits_per_element));
    json_object_set_new(o, "delta_ppl_err", jnum(r->delta_ppl_err));
    if (r->has_baseline)
        json_object_set_new(o, "baseline",
                            json_pack("{s:s, s:f, s:o, s:o, s:o, s:o, s:o}", "kv", r->baseline, "bits_per_element",
                                      r->baseline_bits, "ppl", jnum(r->baseline_ppl), "delta_ppl", jnum(r->baseline_delta_ppl),
                                      "kld_mean", jnum(r->baseline_kld_mean), "kld_p99", jnum(r->baseline_kld_p99), "top1",
                                      jnum(r->baseline_top1)));
    if (r->why[0]) json_object_set_new(o, "gate_failed", json_string(r->why));
    return o;
}

int qf_cmd_calibrate(int argc, char **argv) {
    qf_job j;
    qf_job_default(&j);
    const char *val, *kind = NULL;
    const char **paths = calloc((size_t)argc + 1, sizeof(char *));
    int n_paths = 0, rc;
    bool json = false;
    char why[256];
    if (!paths) return 1;
#define BAD(...)                                  \
    do {                                          \
        rc = cli_usage("calibrate", USAGE, __VA_ARGS__); \
        goto out;                                 \
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
        } else if ((r = cli_flag_value(argc, argv, &i, "--artifact", NULL, &val))) {
            if (r < 0) goto missing;
            kind = val;
            if (!qf_artifact_kind_parse(val, &j.kind)) BAD("bad --artifact '%s' (kv-int8, kv-dict, awq, kv-rq)", val);
        } else if ((r = cli_flag_value(argc, argv, &i, "--percentile", NULL, &val))) {
            if (r < 0) goto missing;
            if (!cli_parse_double(val, 0, 100, &j.int8_percentile) || j.int8_percentile <= 0)
                BAD("bad --percentile '%s' (in (0, 100])", val);
        } else if ((r = cli_flag_value(argc, argv, &i, "--sign-key", NULL, &val))) {
            if (r < 0) goto missing;
            j.sign_key_path = val;
        } else if ((r = cli_flag_value(argc, argv, &i, "-o", "--output", &val))) {
            if (r < 0) goto missing;
            j.out_path = val;
        } else if ((r = cli_flag_value(argc, argv, &i, "--eval-out", NULL, &val))) {
            if (r < 0) goto missing;
            j.eval_out_path = val;
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
    if (!kind) BAD("--artifact kv-int8|kv-dict|awq|kv-rq is required");
    if (j.rq_bits > 0 && j.kind != QF_ARTIFACT_KV_RQ) BAD("--bits is a kv-rq setting");
    if (!j.out_path) BAD("-o OUT.qfa is required");
    if (j.ollama_url && !j.ollama_model) BAD("--ollama needs --ollama-model M");
    if (n_paths == 0 && !j.ollama_url) j.builtin = true; /* the embedded demo corpus */
    j.corpus_paths = paths;
    j.n_corpus_paths = n_paths;
    j.log = cli_root() ? stderr : NULL; /* under mpirun rank 0 prints */
    j.progress = true; /* bars only on a TTY */

    qf_error err = {0};
    qf_job_report rep;
    qf_status st = qf_job_run(&j, &rep, &err);
    if (json) {
        json_t *o = json_pack("{s:s, s:s, s:s, s:b, s:s}", "kind", qf_artifact_kind_name(j.kind), "variant", rep.variant,
                              "status", qf_status_name(st), "packaged", rep.packaged, "out", j.out_path);
        if (rep.n_tried > 0) {
            json_object_set_new(o, "result", result_json(&rep.result));
            json_t *tried = json_array();
            for (int i = 0; i < rep.n_tried; i++) {
                json_t *t = result_json(&rep.tried[i].result);
                json_object_set_new(t, "variant", json_string(rep.tried[i].variant));
                json_array_append_new(tried, t);
            }
            json_object_set_new(o, "tried", tried);
        }
        json_object_set_new(o, "f16_kv_bytes_per_token", json_real(rep.f16_kv_bytes_per_token));
        json_object_set_new(o, "calib_tokens", json_integer(rep.calib_tokens));
        const qf_gate *g = rep.n_tried > 0 ? &rep.result.gate : &j.gate; /* resolved for the rate when known */
        json_object_set_new(o, "gate_max_delta_ppl", json_real(g->max_delta_ppl));
        if (g->has_max_kld) json_object_set_new(o, "gate_max_kld", json_real(g->max_kld));
        if (g->has_max_kld_p99) json_object_set_new(o, "gate_max_kld_p99", json_real(g->max_kld_p99));
        if (g->has_min_top1) json_object_set_new(o, "gate_min_top1", json_real(g->min_top1));
        json_object_set_new(o, "gate_vs_baseline", json_boolean(g->vs_baseline));
        if (rep.n_ctx_results > 0) {
            json_t *per = json_array(), *cc = json_array();
            for (int i = 0; i < rep.n_ctx_results; i++) json_array_append_new(per, result_json(&rep.ctx_results[i].result));
            for (int i = 0; i < rep.n_certified_ctx; i++) json_array_append_new(cc, json_integer(rep.certified_ctx[i]));
            json_object_set_new(o, "ctx_results", per);
            json_object_set_new(o, "certified_ctx", cc);
        }
        json_t *secs = json_pack("{s:f, s:f, s:f, s:f, s:f}", "corpus", rep.seconds_corpus, "capture", rep.seconds_capture,
                                 "learn", rep.seconds_learn, "certify", rep.seconds_certify, "package", rep.seconds_package);
        json_object_set_new(o, "seconds", secs);
        if (j.kind == QF_ARTIFACT_KV_RQ && rep.n_tried > 0)
            json_object_set_new(o, "bits_per_element", json_real(rep.bits_per_element));
        if (isfinite(rep.table_bytes)) json_object_set_new(o, "table_bytes", json_real(rep.table_bytes));
        if (rep.tables_pay_off_ctx > 0) json_object_set_new(o, "tables_pay_off_ctx", json_integer(rep.tables_pay_off_ctx));
        if (j.kind == QF_ARTIFACT_AWQ && rep.n_tried > 1 && isfinite(rep.awq_gap_closed))
            json_object_set_new(o, "awq_share_of_rtn_gap_closed", json_real(rep.awq_gap_closed));
        if (st) json_object_set_new(o, "error", json_string(err.msg));
        cli_print_json(o);
    } else if (rep.n_tried > 0) {
        const qf_certify_result *r = &rep.result;
        printf("artifact   %s (%s)%s\n", qf_artifact_kind_name(j.kind), rep.variant, rep.packaged ? "" : "  NOT WRITTEN");
        printf("ref PPL    %.4f   candidate PPL %.4f   delta %+.4f%% +/- %.4f%% (paired per-chunk SE; gate |delta| %.4f%%)\n",
               r->ref_ppl, r->cand_ppl, 100 * r->delta_ppl, 100 * r->delta_ppl_err, 100 * r->gate.max_delta_ppl);
        printf("KLD        mean %.6f   p99 %.6f   same top-1 %.2f%%   (%.3f bits/element)\n", r->kld_mean, r->kld_p99,
               100 * r->top1, r->bits_per_element);
        if (r->has_baseline)
            printf("baseline   %s (%.1f bits, same tokens): delta %+.4f%%   KLD mean %.6f   p99 %.6f   same top-1 %.2f%%\n",
                   r->baseline, r->baseline_bits, 100 * r->baseline_delta_ppl, r->baseline_kld_mean,
                   r->baseline_kld_p99, 100 * r->baseline_top1);
        printf("gate       %s%s%s\n", r->passed ? "passed" : "FAILED", r->passed ? "" : ": ", r->why);
        for (int i = 1; i < rep.n_ctx_results; i++) {
            const qf_certify_result *x = &rep.ctx_results[i].result;
            printf("at -c %-5d delta %+.4f%% +/- %.4f%%   KLD mean %.6f   p99 %.6f   baseline KLD mean %.6f   %s%s%s\n",
                   x->n_ctx, 100 * x->delta_ppl, 100 * x->delta_ppl_err, x->kld_mean, x->kld_p99, x->baseline_kld_mean,
                   x->passed ? "passed" : "FAILED",
                   x->passed ? "" : ": ", x->why);
        }
        if (rep.n_ctx_results > 0) {
            printf("certified  -c");
            for (int i = 0; i < rep.n_certified_ctx; i++) printf("%s%d", i ? "," : " ", rep.certified_ctx[i]);
            printf("\n");
        }
        printf("KV cache   %.0f bytes/token (f16 %.0f, reference %.0f)\n", r->cand_kv_bytes_per_token,
               rep.f16_kv_bytes_per_token, r->ref_kv_bytes_per_token);
        if (j.kind == QF_ARTIFACT_KV_RQ)
            printf("bits       %.3f per element at -c %d (codes, row scales, f16 sinks and window)\n", rep.bits_per_element,
                   r->n_ctx);
        if (isfinite(rep.table_bytes) && rep.table_bytes > 0 && isfinite(rep.bits_per_element)) {
            /* the fixed tables amortized over one context (elements a token: the f16 cache's bytes / 2) */
            int c0 = r->n_ctx; /* the rate's context: the largest certified one */
            for (int i = 0; i < rep.n_certified_ctx; i++) c0 = rep.certified_ctx[i] > c0 ? rep.certified_ctx[i] : c0;
            printf("tables     %.2f %s fixed per model, not in the rate: %.3f bits per element with them at -c %d",
                   rep.table_bytes / (rep.table_bytes < 1e6 ? 1e3 : 1e6), rep.table_bytes < 1e6 ? "kB" : "MB",
                   rep.bits_per_element + rep.table_bytes * 16 / rep.f16_kv_bytes_per_token / c0, c0);
            if (rep.tables_pay_off_ctx > 0)
                printf("; at or below the baseline's %.1f (tables included) from -c %d", r->baseline_bits,
                       rep.tables_pay_off_ctx);
            printf("\n");
        }
        printf("eval       %d chunks x %d tokens from the evaluation split; calibration %lld tokens\n", r->n_chunks,
               r->n_ctx, (long long)rep.calib_tokens);
        if (j.kind == QF_ARTIFACT_AWQ && rep.n_tried > 1)
            printf("RTN q4_0   PPL %.4f   KLD mean %.6f   same top-1 %.2f%%   -> AWQ closes %.1f%% of RTN's gap\n",
                   rep.tried[1].result.cand_ppl, rep.tried[1].result.kld_mean, 100 * rep.tried[1].result.top1,
                   100 * rep.awq_gap_closed);
        if (rep.packaged) printf("wrote      %s\n", j.out_path);
    }
    rc = st ? cli_fail("calibrate", &err) : 0;
    qf_job_report_free(&rep);
out:
    free(paths);
    return rc;
#undef BAD
}
