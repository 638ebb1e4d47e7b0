/* cmd_generate.c: `qforge generate`, streaming text from a prompt. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "qforge/run.h"

static const char *USAGE =
    "qforge generate -m MODEL -p PROMPT [-n N] [--temp T] [--top-k K] [--top-p P] [--seed S]\n"
    "                [-c N] [-b N] [-t N] [-ctk T] [-ctv T] [--kv-rot none|hadamard]\n"
    "                [--artifact X.qfa [--trust-key PEM] [--force-uncertified-ctx]]\n"
    "  -c N       context size (default: the model's trained context); generation stops, with a\n"
    "             message, when it is full\n"
    "  -b N       batch size for the prompt (tokens per forward call; default = -c); a smaller\n"
    "             batch needs less memory\n"
    "  -n N       tokens to generate (default 128; stops early at end-of-text)\n"
    "  --temp T   temperature (default 0.8; 0 = greedy)\n"
    "  --top-k K  keep the K most likely tokens (default 40; 0 = off)\n"
    "  --top-p P  nucleus sampling mass (default 0.95; 1 = off)\n"
    "  --seed S   random seed (default 42)\n"
    "  --device D cpu, cuda or auto (default auto: the GPU when one answers)\n"
    "  --artifact X   run a certified kv-int8 / kv-dict / kv-rq artifact in the KV cache (refused unless\n"
    "                 certified for this exact model file)\n"
    "  --trust-key K  require the artifact to be signed by this Ed25519 key (PEM)";

/* Stream the prompt and each generated piece to stdout as it comes. */
static void print_text(void *user, const char *text, size_t len) {
    (void)user;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
}

int qf_cmd_generate(int argc, char **argv) {
    const char *prompt = NULL, *val;
    cli_engine_opts eo = {.cp = qf_context_default_params()};
    cli_cuda_env(&eo.cp.cuda);
    char why[256];
    int n_gen = 128;
    double temp = 0.8, top_p = 0.95;
    int top_k = 40;
    int64_t seed = 42;
    int n_batch = 0;
    eo.cp.n_ctx = 0;
    for (int i = 1; i < argc; i++) {
        int r;
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            puts(USAGE);
            return 0;
        } else if ((r = cli_engine_flag(argc, argv, &i, &eo, why, sizeof why))) {
            if (r < 0) return cli_usage("generate", USAGE, "%s", why);
        } else if ((r = cli_flag_value(argc, argv, &i, "-p", "--prompt", &val))) {
            if (r < 0) goto missing;
            if (!cli_set_once(&prompt, a, val, why, sizeof why)) return cli_usage("generate", USAGE, "%s", why);
        } else if ((r = cli_flag_value(argc, argv, &i, "-b", "--batch-size", &val))) {
            if (r < 0) goto missing;
            if (!cli_parse_int(val, 1, 1 << 20, &n_batch)) return cli_usage("generate", USAGE, "bad -b '%s'", val);
        } else if ((r = cli_flag_value(argc, argv, &i, "-n", "--n-predict", &val))) {
            if (r < 0) goto missing;
            if (!cli_parse_int(val, 0, 1 << 20, &n_gen)) return cli_usage("generate", USAGE, "bad -n '%s'", val);
        } else if ((r = cli_flag_value(argc, argv, &i, "--temp", NULL, &val))) {
            if (r < 0) goto missing;
            if (!cli_parse_double(val, 0, 100, &temp)) return cli_usage("generate", USAGE, "bad --temp '%s'", val);
        } else if ((r = cli_flag_value(argc, argv, &i, "--top-k", NULL, &val))) {
            if (r < 0) goto missing;
            if (!cli_parse_int(val, 0, 1 << 30, &top_k)) return cli_usage("generate", USAGE, "bad --top-k '%s'", val);
        } else if ((r = cli_flag_value(argc, argv, &i, "--top-p", NULL, &val))) {
            if (r < 0) goto missing;
            if (!cli_parse_double(val, 0, 1, &top_p)) return cli_usage("generate", USAGE, "bad --top-p '%s'", val);
        } else if ((r = cli_flag_value(argc, argv, &i, "--seed", NULL, &val))) {
            if (r < 0) goto missing;
            if (!cli_parse_i64(val, 0, INT64_MAX, &seed)) return cli_usage("generate", USAGE, "bad --seed '%s'", val);
        } else {
            return cli_usage("generate", USAGE, "unknown option '%s'", a);
        }
        continue;
    missing:
        return cli_usage("generate", USAGE, "option '%s' needs a value", a);
    }
    if (!eo.model_path) return cli_usage("generate", USAGE, "-m MODEL is required");
    if (!prompt) return cli_usage("generate", USAGE, "-p PROMPT is required");
    if (!cli_engine_check(&eo, why, sizeof why)) return cli_usage("generate", USAGE, "%s", why);

    qf_run_params rp = qf_run_default_params();
    rp.model_path = eo.model_path;
    rp.artifact_path = eo.artifact_path;
    rp.trust_key = eo.trust_key;
    rp.cp = eo.cp; /* -c 0 / not given: the model's context (an artifact's certified one) */
    rp.force_uncertified_ctx = eo.force_uncertified_ctx;
    qf_generate_params gp = {.n_predict = n_gen,
                             .sampler = {.temp = (float)temp, .top_k = top_k, .top_p = (float)top_p, .seed = (uint64_t)seed},
                             .on_text = print_text};
    qf_error err = {0};
    qf_run run;
    qf_generate_stats gs;
    if (qf_run_open(&rp, &run, &err)) {
        cli_nomem_hint(&err);
        return cli_fail("generate", &err);
    }
    cli_warn_ctx("generate", run.model, qf_context_params_get(run.ctx)->n_ctx);
    cli_warn_uncertified_ctx("generate", &run);
    int n_ctx = qf_context_params_get(run.ctx)->n_ctx;
    qf_status st = qf_generate(run.ctx, prompt, strlen(prompt), &gp, &gs, &err);
    qf_run_close(&run);
    if (st) return cli_fail("generate", &err);
    fputc('\n', stdout);
    fprintf(stderr, "generate: prompt %d tokens in %.2f s (%.1f t/s), generated %d tokens in %.2f s (%.1f t/s)\n",
            gs.n_prompt, gs.prompt_seconds, gs.n_prompt / (gs.prompt_seconds + 1e-9), gs.n_generated, gs.gen_seconds,
            gs.n_generated / (gs.gen_seconds + 1e-9));
    if (gs.context_full)
        fprintf(stderr, "generate: the context (-c %d) is full: stopped after %d of %d tokens (a larger -c generates more)\n",
                n_ctx, gs.n_generated, gp.n_predict);
    return 0;
}
