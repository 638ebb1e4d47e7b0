/* cmd_ppl.c: `qforge ppl`, perplexity and KL divergence the way llama-perplexity reports them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "qforge/mpi.h"
#include "qforge/ppl.h"
#include "qforge/run.h"

static const char *USAGE =
    "qforge ppl -m MODEL -f TEXT [-c N] [-t N] [-b N] [--chunks N] [-ctk T] [-ctv T] [--kv-rot R]\n"
    "           [--kl-divergence-base FILE] [--kl-divergence] [--reference] [--arith A] [--device D] [--json]\n"
    "           [--artifact X.qfa [--trust-key PEM] [--force-uncertified-ctx]]\n"
    "  -c N          chunk (context) size, default 512\n"
    "  -t N          threads, default all cores\n"
    "  -b N          batch size (tokens per forward call), default = -c\n"
    "  --chunks N    evaluate at most N chunks\n"
    "  -ctk/-ctv T   KV cache type for K/V: f32, f16 (default), q8_0, q4_0\n"
    "  --kv-rot R    none (default) or hadamard: Walsh-Hadamard rotate each K/V row before it is\n"
    "                stored, rotate back on read (as llama.cpp; head_dim must be a power of two)\n"
    "  --kl-divergence-base FILE  save this run's log-probs to FILE (the reference)\n"
    "  --kl-divergence            compare against --kl-divergence-base FILE\n"
    "  --reference   use the scalar CPU reference path (slow; the oracle)\n"
    "  --arith A     canonical or fast: canonical (the default with --artifact) computes every number\n"
    "                the same on the CPU and the GPU, as certification does, so the certificate's\n"
    "                PPL is reproduced exactly; fast (the default otherwise): each device's fastest route\n"
    "  --device D    cpu, cuda or auto (default auto: the GPU when one answers)\n"
    "  --artifact X  run a certified kv-int8 / kv-dict / kv-rq artifact (.qfa) in the KV cache; it must be\n"
    "                certified for this exact model file (refused otherwise, with its exit code)\n"
    "  --trust-key K require the artifact to be signed by this Ed25519 key (PEM)\n"
    "  --force-uncertified-ctx  run an artifact at a -c above its largest certified context\n"
    "                (refused otherwise, ArtifactNotCertified); a warning says so\n"
    "  --json        print the result as JSON";

int qf_cmd_ppl(int argc, char **argv) {
    const char *text_path = NULL, *kl_base = NULL, *val;
    cli_engine_opts eo = {.cp = qf_context_default_params()};
    cli_cuda_env(&eo.cp.cuda);
    qf_ppl_params pp = qf_ppl_default_params();
    eo.cp.n_ctx = pp.n_ctx;
    bool json = false, kl = false, reference = false;
    int arith = -1; /* -1: canonical with --artifact, else fast */
    int n_batch = 0;
    char why[256];
    for (int i = 1; i < argc; i++) {
        int r;
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            puts(USAGE);
            return 0;
        } else if ((r = cli_engine_flag(argc, argv, &i, &eo, why, sizeof why))) {
            if (r < 0) return cli_usage("ppl", USAGE, "%s", why);
        } else if ((r = cli_flag_value(argc, argv, &i, "-f", "--file", &val))) {
            if (r < 0) goto missing;
            if (!cli_set_once(&text_path, a, val, why, sizeof why)) return cli_usage("ppl", USAGE, "%s", why);
        } else if ((r = cli_flag_value(argc, argv, &i, "-b", "--batch-size", &val))) {
            if (r < 0) goto missing;
            if (!cli_parse_int(val, 1, 1 << 20, &n_batch)) return cli_usage("ppl", USAGE, "bad -b '%s'", val);
        } else if ((r = cli_flag_value(argc, argv, &i, "--chunks", NULL, &val))) {
            if (r < 0) goto missing;
            if (!cli_parse_int(val, 1, 1 << 30, &pp.n_chunks)) return cli_usage("ppl", USAGE, "bad --chunks '%s'", val);
        } else if ((r = cli_flag_value(argc, argv, &i, "--kl-divergence-base", NULL, &val))) {
            if (r < 0) goto missing;
            if (!cli_set_once(&kl_base, a, val, why, sizeof why)) return cli_usage("ppl", USAGE, "%s", why);
        } else if (!strcmp(a, "--kl-divergence")) {
            kl = true;
        } else if (!strcmp(a, "--reference")) {
            reference = true;
        } else if ((r = cli_flag_value(argc, argv, &i, "--arith", NULL, &val))) {
            if (r < 0) goto missing;
            bool canonical;
            if (!cli_parse_arith(val, &canonical)) return cli_usage("ppl", USAGE, "bad --arith '%s' (canonical or fast)", val);
            arith = canonical;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else {
            return cli_usage("ppl", USAGE, "unknown option '%s'", a);
        }
        continue;
    missing:
        return cli_usage("ppl", USAGE, "option '%s' needs a value", a);
    }
    const char *model_path = eo.model_path, *artifact_path = eo.artifact_path;
    if (!model_path) return cli_usage("ppl", USAGE, "-m MODEL is required");
    if (!text_path) return cli_usage("ppl", USAGE, "-f TEXT is required");
    if (kl && !kl_base) return cli_usage("ppl", USAGE, "--kl-divergence needs --kl-divergence-base FILE");
    if (reference && arith == 1) return cli_usage("ppl", USAGE, "--reference and --arith canonical are two different routes: pick one");
    eo.cp.reference = reference;
    if (!cli_engine_check(&eo, why, sizeof why)) return cli_usage("ppl", USAGE, "%s", why);
    if (kl) pp.kl_base_read = kl_base;
    else pp.kl_base_write = kl_base;
    if (pp.kl_base_write) { /* the base file is the one output: never one of the inputs */
        const char *ins[] = {model_path, text_path, artifact_path, eo.trust_key};
        const char *in_names[] = {"-m", "-f", "--artifact", "--trust-key"};
        const char *outs[] = {pp.kl_base_write}, *out_names[] = {"--kl-divergence-base"};
        int rc = cli_check_outputs("ppl", ins, in_names, 4, outs, out_names, 1);
        if (rc) return rc;
    }
    qf_run_params rp = qf_run_default_params();
    rp.model_path = model_path;
    rp.artifact_path = artifact_path;
    rp.trust_key = eo.trust_key;
    rp.cp = eo.cp;
    rp.cp.reference = reference;
    rp.cp.canonical = !reference && (arith == 1 || (arith < 0 && artifact_path));
    rp.cp.n_batch = n_batch; /* 0: the chunk */
    rp.force_uncertified_ctx = eo.force_uncertified_ctx;

    qf_error err = {0};
    char *text = NULL;
    size_t len = 0;
    uint8_t text_sha[32];
    if (qf_ppl_read_text(text_path, &text, &len, text_sha, &err)) return cli_fail("ppl", &err);
    char mpi_note[96];
    snprintf(mpi_note, sizeof mpi_note, ", %d MPI ranks (chunk i on rank i %% %d)", qf_mpi_size(), qf_mpi_size());
    qf_run run;
    if (qf_run_open(&rp, &run, &err)) {
        free(text);
        cli_nomem_hint(&err);
        return cli_fail("ppl", &err);
    }
    cli_warn_ctx("ppl", run.model, qf_context_params_get(run.ctx)->n_ctx);
    cli_warn_uncertified_ctx("ppl", &run);
    qf_context *c = run.ctx;
    const qf_context_params *cp = qf_context_params_get(c);
    pp.n_ctx = cp->n_ctx; /* the chunk is the context */
    if (run.has_artifact && cli_root())
        fprintf(stderr, "perplexity: artifact %s (%s, certified delta PPL %+.4f%%, KV %.0f bytes/token)\n", artifact_path,
                qf_artifact_kind_name(run.artifact.cert.kind), 100 * run.artifact.cert.delta_ppl,
                qf_context_kv_bytes_per_token(c));
    if (!json) {
        if (cli_root()) {
        fprintf(stderr, "perplexity: model %s (%s, %d layers, n_embd %d), kv %s/%s%s%s, %d threads%s\n", model_path,
                qf_model_hparams(run.model)->arch_name, qf_model_hparams(run.model)->n_layer,
                qf_model_hparams(run.model)->n_embd, qf_kv_mode_name(cp->kv_k), qf_kv_mode_name(cp->kv_v),
                cp->kv_rot != QF_KV_ROT_NONE ? " rot " : "", cp->kv_rot != QF_KV_ROT_NONE ? qf_kv_rot_name(cp->kv_rot) : "",
                cp->n_threads, cp->reference ? ", reference path" : qf_context_canonical(c) ? ", canonical arithmetic" : "");
        fprintf(stderr, "perplexity: calculating perplexity over chunks of n_ctx=%d, batch_size=%d%s\n", pp.n_ctx,
                cp->n_batch, qf_mpi_size() > 1 ? mpi_note : "");
        }
        pp.log = stdout;
        pp.progress = false;
    } else {
        pp.progress = true;
    }
    qf_ppl_result r;
    /* the same model and text on every rank, refused before any work otherwise (one process: nothing
     * to compare, and hashing the whole model file costs ~1.5 s for a 2.5 GB f16 GGUF) */
    if (qf_mpi_size() > 1 && (qf_mpi_check_same(qf_model_sha256(run.model), 32, "model SHA-256", &err) ||
                              qf_mpi_check_same(text_sha, 32, "text file's SHA-256", &err))) {
        free(text);
        qf_run_close(&run);
        return cli_fail("ppl", &err);
    }
    qf_status st = qf_perplexity_text(c, text, len, &pp, &r, &err);
    free(text);
    int rc = 0;
    if (st) {
        cli_nomem_hint(&err);
        rc = cli_fail("ppl", &err);
    } else if (json) {
        json_t *j = json_pack("{s:s, s:s, s:i, s:i, s:I, s:I, s:f, s:f, s:f, s:f, s:s, s:s}", "model", model_path,
                              "file", text_path, "n_ctx", pp.n_ctx, "chunks", r.n_chunks, "tokens", (json_int_t)r.n_tokens_text,
                              "scored", (json_int_t)r.n_scored, "ppl", r.ppl, "ppl_err", r.ppl_err, "seconds", r.seconds,
                              "tokens_per_sec", r.tokens_per_sec, "cache_type_k", qf_kv_mode_name(cp->kv_k),
                              "cache_type_v", qf_kv_mode_name(cp->kv_v));
        if (artifact_path) json_object_set_new(j, "artifact", json_string(artifact_path));
        json_object_set_new(j, "kv_rot", json_string(qf_kv_rot_name(cp->kv_rot)));
        json_object_set_new(j, "kv_bytes_per_token", json_real(qf_context_kv_bytes_per_token(c)));
        if (r.has_kl) {
            json_object_set_new(j, "ppl_base", json_real(r.ppl_base));
            json_object_set_new(j, "kld_mean", json_real(r.kld_mean));
            json_object_set_new(j, "kld_err", json_real(r.kld_err));
            json_object_set_new(j, "kld_median", json_real(r.kld_median));
            json_object_set_new(j, "kld_p99", json_real(r.kld_p99));
            json_object_set_new(j, "kld_max", json_real(r.kld_max));
            json_object_set_new(j, "same_top_p", json_real(r.same_top_p));
            json_object_set_new(j, "rms_dp", json_real(r.rms_dp));
        }
        cli_print_json(j);
    } else {
        printf("Final estimate: PPL = %.4f +/- %.5f\n", r.ppl, r.ppl_err);
        if (r.has_kl) {
            printf("Mean    KLD: %10.6f +/- %10.6f\n", r.kld_mean, r.kld_err);
            printf("Delta   PPL: %+9.4f%% +/- %8.4f%% (paired vs the base, per-chunk standard error over %d chunks; "
                   "log-probs floored as the base stores them)\n",
                   100.0 * r.delta_ppl, 100.0 * r.delta_ppl_err, r.n_chunks);
            printf("Median  KLD: %10.6f\n", r.kld_median);
            printf("99.0%%   KLD: %10.6f\n", r.kld_p99);
            printf("Maximum KLD: %10.6f\n", r.kld_max);
            printf("Same top p: %6.3f +/- %6.3f %%\n", 100.0 * r.same_top_p, 100.0 * r.same_top_p_err);
            printf("RMS Δp    : %6.3f %%\n", 100.0 * r.rms_dp);
        }
        if (cli_root())
            fprintf(stderr, "perplexity: %d chunks, %lld tokens in the text, %.2f s, %.1f tokens/s\n", r.n_chunks,
                (long long)r.n_tokens_text, r.seconds, r.tokens_per_sec);
    }
    qf_run_close(&run);
    return rc;
}
