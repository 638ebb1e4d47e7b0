/* qforge.c: the command-line entry point. It only dispatches: each subcommand lives in
 * tools/cmd_<name>.c and maps onto public API calls. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "qforge/mpi.h"
#include "qforge/version.h"

int qf_cmd_info(int argc, char **argv);
int qf_cmd_tokenize(int argc, char **argv);
int qf_cmd_ppl(int argc, char **argv);
int qf_cmd_generate(int argc, char **argv);
int qf_cmd_quantize(int argc, char **argv);
int qf_cmd_corpus(int argc, char **argv);
int qf_cmd_analyze(int argc, char **argv);
int qf_cmd_calibrate(int argc, char **argv);
int qf_cmd_sweep(int argc, char **argv);
int qf_cmd_verify(int argc, char **argv);

static const struct {
    const char *name;
    cli_cmd_fn fn;
    const char *help;
} commands[] = {
    {"info", qf_cmd_info, "show a GGUF file's metadata and tensor table"},
    {"tokenize", qf_cmd_tokenize, "tokenize text with a model's vocabulary"},
    {"ppl", qf_cmd_ppl, "perplexity / KL divergence, as llama-perplexity"},
    {"generate", qf_cmd_generate, "generate text from a prompt"},
    {"quantize", qf_cmd_quantize, "re-quantize a GGUF model (f16, q8_0, q4_0; --awq)"},
    {"corpus", qf_cmd_corpus, "assemble a calibration corpus and print its split and hash"},
    {"analyze", qf_cmd_analyze, "KV capture and the sparse-dictionary go/no-go analysis"},
    {"calibrate", qf_cmd_calibrate, "corpus -> capture -> learn -> certify -> package"},
    {"sweep", qf_cmd_sweep, "certify several dictionary configs with one capture"},
    {"verify", qf_cmd_verify, "verify a .qfa artifact and print its certificate"},
};

static void usage(FILE *f) {
    fprintf(f, "qforge %s (%s): LLM inference engine and certified compression forge\n\n"
               "usage: qforge <command> [options]   (qforge <command> --help for its options)\n\n",
            qf_version(), qf_git_commit());
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
}

/* Run one subcommand inside the MPI job when started by mpirun (docs/mpi.md): ranks other
 * than 0 print nothing on stdout; the hidden test flag --mpi-fail-rank R[:exit] (anywhere on
 * the line) is taken out before the subcommand parses its flags. */
static int run_command(cli_cmd_fn fn, int argc, char **argv) {
    qf_error err = {0};
    if (qf_mpi_init(&argc, &argv, &err)) return cli_fail(argv[0], &err);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--mpi-fail-rank") != 0) continue;
        if (i + 1 >= argc) return cli_usage(argv[0], "--mpi-fail-rank R[:exit]", "option '--mpi-fail-rank' needs a value");
        char *end;
        long r = strtol(argv[i + 1], &end, 10);
        if (end == argv[i + 1] || r < 0 || (*end && strcmp(end, ":exit") != 0))
            return cli_usage(argv[0], "--mpi-fail-rank R[:exit]", "bad --mpi-fail-rank '%s'", argv[i + 1]);
        qf_mpi_inject_failure((int)r, *end != 0);
        memmove(argv + i, argv + i + 2, (size_t)(argc - i - 2) * sizeof *argv);
        argc -= 2;
        break;
    }
    if (qf_mpi_rank() != 0 && !freopen("/dev/null", "w", stdout)) {
        fprintf(stderr, "qforge: rank %d: cannot silence stdout\n", qf_mpi_rank());
        qf_mpi_abort(1);
    }
    int rc = fn(argc, argv);
    qf_mpi_finalize();
    return rc;
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
        printf("qforge %s (%s)\n", qf_version(), qf_git_commit());
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(cmd, commands[i].name) == 0) return run_command(commands[i].fn, argc - 1, argv + 1);
    fprintf(stderr, "qforge: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 1;
}
