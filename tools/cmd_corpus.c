/* cmd_corpus.c: `qforge corpus`: assemble a corpus from the given sources, split it and print
 * counts and hashes; with -o DIR also write DIR/calib.txt and DIR/eval.txt atomically. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "qforge/corpus.h"
#include "qforge/util.h"

static const char *USAGE =
    "qforge corpus [PATH...] [--builtin] [--stdin | -] [--eval-frac F] [--doc-kb N]\n"
    "              [--ollama URL --ollama-model M [--synth-docs N] [--synth-prompts FILE]]\n"
    "              [--json] [-o DIR]\n"
    "  PATH             a text file or a directory (recursive, binary files skipped)\n"
    "  --builtin        the demo corpus (assets/corpora/kerneldoc-demo; $QF_ASSETS_DIR overrides)\n"
    "  --stdin, -       read one more source from standard input\n"
    "  --eval-frac F    share of documents held out for evaluation (default 0.2)\n"
    "  --doc-kb N       split long texts at blank lines into ~N KiB documents (default 8, 0 = off)\n"
    "  --ollama URL     synthesize documents with a local Ollama server (e.g. http://127.0.0.1:11434)\n"
    "  --ollama-model M the Ollama model to ask\n"
    "  --synth-docs N   how many documents to synthesize (default 16)\n"
    "  --synth-prompts FILE  prompts, one per line, cycled (default: a built-in list)\n"
    "  --json           machine-readable output\n"
    "  -o DIR           write DIR/calib.txt and DIR/eval.txt";

static int write_outputs(const char *dir, const qf_corpus *c, qf_error *err) {
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return qf_fail(err, QF_ERR_IO, "%s: cannot create directory: %s", dir, strerror(errno));
    char path[PATH_MAX];
    size_t n;
    const char *t = qf_corpus_calib_text(c, &n);
    snprintf(path, sizeof path, "%s/calib.txt", dir);
    qf_status st = qf_write_file_atomic(path, t, n, err);
    if (st) return st;
    t = qf_corpus_eval_text(c, &n);
    snprintf(path, sizeof path, "%s/eval.txt", dir);
    return qf_write_file_atomic(path, t, n, err);
}

int qf_cmd_corpus(int argc, char **argv) {
    const char *cmd = "corpus";
    const char *out_dir = NULL, *val = NULL;
    bool json = false, builtin = false, use_stdin = false;
    double eval_frac = QF_CORPUS_DEFAULT_EVAL_FRAC;
    int doc_kb = QF_CORPUS_DEFAULT_DOC_KB;
    qf_ollama_opts ol = {.n_docs = 16};
    const char **paths = calloc((size_t)argc + 1, sizeof *paths);
    int n_paths = 0;
    if (!paths) {
        qf_error e;
        qf_fail(&e, QF_ERR_NOMEM, "out of memory");
        return cli_fail(cmd, &e);
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: %s\n", USAGE);
            free(paths);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "--builtin")) {
            builtin = true;
        } else if (!strcmp(a, "--stdin") || !strcmp(a, "-")) {
            use_stdin = true;
        } else if ((r = cli_flag_value(argc, argv, &i, "--eval-frac", NULL, &val))) {
            if (r < 0 || !cli_parse_double(val, 0, 1, &eval_frac) || eval_frac <= 0 || eval_frac >= 1) {
                free(paths);
                return cli_usage(cmd, USAGE, "--eval-frac: expected a fraction strictly between 0 and 1");
            }
        } else if ((r = cli_flag_value(argc, argv, &i, "--doc-kb", NULL, &val))) {
            if (r < 0 || !cli_parse_int(val, 0, 1 << 20, &doc_kb)) {
                free(paths);
                return cli_usage(cmd, USAGE, "--doc-kb: expected an integer in [0, 1048576]");
            }
        } else if ((r = cli_flag_value(argc, argv, &i, "--ollama", NULL, &val))) {
            if (r < 0) { free(paths); return cli_usage(cmd, USAGE, "--ollama: expected a URL"); }
            ol.url = val;
        } else if ((r = cli_flag_value(argc, argv, &i, "--ollama-model", NULL, &val))) {
            if (r < 0) { free(paths); return cli_usage(cmd, USAGE, "--ollama-model: expected a model name"); }
            ol.model = val;
        } else if ((r = cli_flag_value(argc, argv, &i, "--synth-docs", NULL, &val))) {
            if (r < 0 || !cli_parse_int(val, 1, 1000000, &ol.n_docs)) {
                free(paths);
                return cli_usage(cmd, USAGE, "--synth-docs: expected an integer in [1, 1000000]");
            }
        } else if ((r = cli_flag_value(argc, argv, &i, "--synth-prompts", NULL, &val))) {
            if (r < 0) { free(paths); return cli_usage(cmd, USAGE, "--synth-prompts: expected a file"); }
            ol.prompts_path = val;
        } else if ((r = cli_flag_value(argc, argv, &i, "-o", "--out", &val))) {
            if (r < 0) { free(paths); return cli_usage(cmd, USAGE, "-o: expected a directory"); }
            out_dir = val;
        } else if (a[0] == '-' && a[1]) {
            free(paths);
            return cli_usage(cmd, USAGE, "unknown option '%s'", a);
        } else {
            paths[n_paths++] = a;
        }
    }
    if (!ol.url != !ol.model) {
        free(paths);
        return cli_usage(cmd, USAGE, "--ollama and --ollama-model go together");
    }
    if (!n_paths && !builtin && !use_stdin && !ol.url) {
        free(paths);
        return cli_usage(cmd, USAGE, "no sources: give PATHs, --builtin, --stdin or --ollama");
    }

    qf_error err = {0};
    qf_status st = QF_OK;
    qf_corpus *c = qf_corpus_new();
    if (!c) st = qf_fail(&err, QF_ERR_NOMEM, "out of memory");
    if (!st) st = qf_corpus_set_doc_kb(c, (size_t)doc_kb, &err);
    for (int i = 0; !st && i < n_paths; i++) st = qf_corpus_add_path(c, paths[i], &err);
    if (!st && builtin) st = qf_corpus_add_builtin(c, &err);
    if (!st && use_stdin) st = qf_corpus_add_stdin(c, &err);
    if (!st && ol.url) st = qf_corpus_synthesize_ollama(c, &ol, &err);
    if (!st) st = qf_corpus_finalize(c, eval_frac, &err);
    if (!st && out_dir) st = write_outputs(out_dir, c, &err);
    free(paths);
    if (st) {
        qf_corpus_free(c);
        return cli_fail(cmd, &err);
    }

    const qf_corpus_info *in = qf_corpus_get_info(c);
    if (json) {
        json_t *j = json_pack(
            "{s:s, s:I, s:I, s:s, s:{s:I, s:I, s:s}, s:{s:I, s:I, s:s}, s:I, s:I, s:I, s:I, s:I, s:f}",
            "inputs", qf_corpus_inputs(c), "docs", (json_int_t)in->n_docs, "bytes",
            (json_int_t)in->n_bytes, "sha256", in->sha256_hex, "calib", "docs",
            (json_int_t)in->n_calib_docs, "bytes", (json_int_t)in->calib_bytes, "sha256",
            in->calib_sha256_hex, "eval", "docs", (json_int_t)in->n_eval_docs, "bytes",
            (json_int_t)in->eval_bytes, "sha256", in->eval_sha256_hex, "files",
            (json_int_t)in->n_files, "skipped_binary", (json_int_t)in->n_skipped_binary,
            "duplicates", (json_int_t)in->n_duplicate_docs, "synth_docs",
            (json_int_t)in->n_synth_docs, "doc_kb", (json_int_t)in->doc_kb, "eval_frac",
            in->eval_frac);
        if (j && out_dir) json_object_set_new(j, "out_dir", json_string(out_dir));
        if (j) cli_print_json(j);
    } else {
        printf("inputs:      %s\n", qf_corpus_inputs(c));
        printf("documents:   %zu (%zu bytes) from %zu files", in->n_docs, in->n_bytes, in->n_files);
        if (in->n_synth_docs) printf(", %zu synthesized", in->n_synth_docs);
        printf("; %zu binary files skipped, %zu duplicates dropped\n", in->n_skipped_binary,
               in->n_duplicate_docs);
        printf("split:       eval-frac %.3g, doc-kb %zu\n", in->eval_frac, in->doc_kb);
        printf("calibration: %zu documents, %zu bytes, sha256 %s\n", in->n_calib_docs,
               in->calib_bytes, in->calib_sha256_hex);
        printf("evaluation:  %zu documents, %zu bytes, sha256 %s\n", in->n_eval_docs,
               in->eval_bytes, in->eval_sha256_hex);
        printf("corpus:      sha256 %s\n", in->sha256_hex);
        if (out_dir) printf("wrote:       %s/calib.txt, %s/eval.txt\n", out_dir, out_dir);
    }
    qf_corpus_free(c);
    return 0;
}
