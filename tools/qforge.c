/* qforge.c: the command-line entry point. It only dispatches: each subcommand lives in
 * tools/cmd_<name>.c and maps onto public API calls. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

/* Declared weak so the CLI links while a subcommand is still being built; a missing one
 * answers NotYetImplemented instead of pretending. */
#define QF_CMD(name) int qf_cmd_##name(int argc, char **argv) __attribute__((weak));
QF_CMD(info)
QF_CMD(tokenize)
QF_CMD(ppl)
QF_CMD(generate)
QF_CMD(quantize)
QF_CMD(analyze)
QF_CMD(calibrate)
QF_CMD(sweep)
QF_CMD(verify)
QF_CMD(corpus)
#undef QF_CMD

static const struct {
    const char *name;
    const char *help;
} commands[] = {
    {"info", "show a GGUF file's metadata and tensor table"},
    {"tokenize", "tokenize text with a model's vocabulary"},
    {"ppl", "perplexity / KL divergence, as llama-perplexity"},
    {"generate", "generate text from a prompt"},
    {"quantize", "re-quantize a GGUF model (f16, q8_0, q4_0)"},
    {"corpus", "assemble a calibration corpus and print its split and hash"},
    {"analyze", "KV capture and the sparse-dictionary go/no-go analysis"},
    {"calibrate", "corpus -> capture -> learn -> certify -> package"},
    {"sweep", "certify several dictionary configs with one capture"},
    {"verify", "verify a .qfa artifact and print its certificate"},
};

static cli_cmd_fn lookup(const char *name) {
#define M(n) if (strcmp(name, #n) == 0) return qf_cmd_##n;
    M(info) M(tokenize) M(ppl) M(generate) M(quantize) M(analyze) M(calibrate) M(sweep) M(verify)
    M(corpus)
#undef M
    return NULL;
}

static void usage(FILE *f) {
    fprintf(f, "qforge %s (%s): LLM inference engine and certified compression forge\n\n"
               "usage: qforge <command> [options]   (qforge <command> --help for its options)\n\n",
            QF_VERSION, QF_GIT_COMMIT);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 1;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        printf("qforge %s (%s)\n", QF_VERSION, QF_GIT_COMMIT);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(cmd, commands[i].name) != 0) continue;
        cli_cmd_fn fn = lookup(cmd);
        if (!fn) {
            qf_error e;
            qf_fail(&e, QF_ERR_NOT_IMPLEMENTED, "'%s' is not built yet", cmd);
            return cli_fail(cmd, &e);
        }
        return fn(argc - 1, argv + 1);
    }
    fprintf(stderr, "qforge: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 1;
}
