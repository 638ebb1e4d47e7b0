/* cmd_generate.c: `qforge generate`, streaming text from a prompt. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "qforge/artifact.h"
#include "qforge/artifact_bind.h"
#include "qforge/model.h"
#include "qforge/sample.h"
#include "qforge/util.h"

static const char *USAGE =
    "qforge generate -m MODEL -p PROMPT [-n N] [--temp T] [--top-k K] [--top-p P] [--seed S]\n"
    "                [-c N] [-t N] [-ctk T] [-ctv T] [--kv-rot none|hadamard]\n"
    "                [--artifact X.qfa [--trust-key PEM] [--force-uncertified-ctx]]\n"
    "  -n N       tokens to generate (default 128; stops early at end-of-text)\n"
    "  --temp T   temperature (default 0.8; 0 = greedy)\n"
    "  --top-k K  keep the K most likely tokens (default 40; 0 = off)\n"
    "  --top-p P  nucleus sampling mass (default 0.95; 1 = off)\n"
    "  --seed S   random seed (default 42)\n"
    "  --device D cpu, cuda or auto (default auto: the GPU when one answers)\n"
    "  --artifact X   run a certified kv-int8 / kv-dict artifact in the KV cache (refused unless\n"
    "                 certified for this exact model file)\n"
    "  --trust-key K  require the artifact to be signed by this Ed25519 key (PEM)";

int qf_cmd_generate(int argc, char **argv) {
    const char *prompt = NULL, *val;
    cli_engine_opts eo = {.cp = qf_context_default_params()};
    char why[256];
    int n_gen = 128;
    double temp = 0.8, top_p = 0.95;
    int top_k = 40;
    int64_t seed = 42;
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
            prompt = val;
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
    const char *model_path = eo.model_path, *artifact_path = eo.artifact_path, *trust_key = eo.trust_key;
    qf_context_params cp = eo.cp;
    if (!model_path) return cli_usage("generate", USAGE, "-m MODEL is required");
    if (!prompt) return cli_usage("generate", USAGE, "-p PROMPT is required");
    if (trust_key && !artifact_path) return cli_usage("generate", USAGE, "--trust-key needs --artifact X.qfa");

    qf_error err = {0};
    qf_model *m = qf_model_load(model_path, &err);
    if (!m) return cli_fail("generate", &err);
    const qf_tokenizer *tok = qf_model_tokenizer(m);
    int32_t *ids = NULL;
    size_t n_prompt = 0;
    qf_context *c = NULL;
    float *logits = NULL;
    qf_sampler smp = {0};
    qf_artifact art = {0};
    int rc = 0;
    /* an artifact is verified against this exact model file before anything runs */
    if (artifact_path) {
        if (qf_artifact_load(artifact_path, qf_model_sha256(m), trust_key, &art, &err)) goto fail;
    }
    if (qf_tokenize(tok, prompt, strlen(prompt), qf_tokenizer_add_bos(tok), false, &ids, &n_prompt, &err)) goto fail;
    if (n_prompt == 0) {
        qf_fail(&err, QF_ERR_ARG, "the prompt tokenizes to nothing");
        goto fail;
    }
    if (cp.n_ctx <= 0) {
        cp.n_ctx = qf_model_hparams(m)->n_ctx_train > 0 ? qf_model_hparams(m)->n_ctx_train : 2048;
        /* no -c with an artifact: at most the context it is certified at */
        int mx = artifact_path ? qf_artifact_max_certified_ctx(&art) : 0;
        if (mx > 0 && mx < cp.n_ctx) cp.n_ctx = mx;
    }
    if (artifact_path && (rc = cli_artifact_ctx("generate", &eo, &art, cp.n_ctx))) goto fail_rc;
    if ((int)n_prompt >= cp.n_ctx) {
        qf_fail(&err, QF_ERR_ARG, "the prompt has %zu tokens, more than the context size %d", n_prompt, cp.n_ctx);
        goto fail;
    }
    if (artifact_path && cp.device == QF_DEVICE_AUTO && qf_artifact_cpu_only(&art)) cp.device = QF_DEVICE_CPU;
    if (!(c = qf_context_new(m, &cp, &err))) goto fail;
    if (artifact_path && qf_context_bind_artifact(c, &art, &err)) goto fail;
    int n_vocab = qf_model_hparams(m)->n_vocab;
    logits = malloc((size_t)n_vocab * sizeof(float));
    qf_sampler_params sp = {.temp = (float)temp, .top_k = top_k, .top_p = (float)top_p, .seed = (uint64_t)seed};
    if (!logits || qf_sampler_init(&smp, &sp, n_vocab)) {
        qf_fail(&err, QF_ERR_NOMEM, "out of memory");
        goto fail;
    }
    fputs(prompt, stdout);
    fflush(stdout);
    double t0 = qf_now_sec();
    int pos = 0;
    for (size_t i = 0; i < n_prompt; i += (size_t)qf_context_params_get(c)->n_batch) {
        int bs = (int)(n_prompt - i) < qf_context_params_get(c)->n_batch ? (int)(n_prompt - i) : qf_context_params_get(c)->n_batch;
        bool last = i + (size_t)bs == n_prompt;
        if (qf_decode(c, ids + i, bs, pos, last ? logits : NULL, bs - 1, &err)) goto fail;
        pos += bs;
    }
    double t1 = qf_now_sec();
    int n_done = 0;
    char piece[256];
    for (; n_done < n_gen && pos < cp.n_ctx; n_done++) {
        int32_t next = qf_sample(&smp, logits);
        if (next == qf_tokenizer_eos(tok)) break;
        int len = qf_token_to_piece(tok, next, false, piece, sizeof piece);
        if (len > 0) fwrite(piece, 1, (size_t)(len < (int)sizeof piece ? len : (int)sizeof piece), stdout);
        fflush(stdout);
        if (qf_decode(c, &next, 1, pos, logits, 0, &err)) goto fail;
        pos++;
    }
    double t2 = qf_now_sec();
    fputc('\n', stdout);
    fprintf(stderr, "generate: prompt %zu tokens in %.2f s (%.1f t/s), generated %d tokens in %.2f s (%.1f t/s)\n",
            n_prompt, t1 - t0, (double)n_prompt / (t1 - t0 + 1e-9), n_done, t2 - t1, n_done / (t2 - t1 + 1e-9));
    goto done;
fail:
    rc = cli_fail("generate", &err);
fail_rc:
done:
    qf_artifact_free(&art);
    qf_sampler_free(&smp);
    free(logits);
    free(ids);
    qf_context_free(c);
    qf_model_free(m);
    return rc;
}
