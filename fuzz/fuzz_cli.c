/* fuzz_cli.c: libFuzzer harness for the CLI's argument parsing (tools/cli_util.c,
 * tools/cli_job.c): the input is split at NUL bytes into an argv (at most 32 words) and
 * parsed the way `ppl`/`generate` (cli_engine_flag + cli_engine_check) and `calibrate`/`sweep`
 * (cli_job_flag) parse it; every other word goes through the strict number parsers and the
 * name tables (KV mode, device, tensor type, artifact kind). Then the output-path checks run
 * on pairs of words (qf_same_file, qf_check_outputs, qf_check_writable: stat/realpath/access
 * only, nothing is created). Invariants: a parser that accepts a value leaves it in range; a
 * refusal always says why; the argv index only moves forward and stays in range. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tools/cli_util.c" /* first: it #undefs its BAD macro, cli_job.c defines its own */
#include "../tools/cli_job.c"
#include "qforge/artifact.h"
#include "qforge/quant.h"

static volatile uint64_t sink;

/* As in fuzz_tokenizer.c: ASan's 256 MiB quarantine and 4 KiB malloc fill made every input pay
 * for fresh pages (perf: page faults and memset ~30% here); 16 MiB of quarantine still outlives
 * anything one input frees, the fill detects nothing by itself. ASAN_OPTIONS still overrides. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "quarantine_size_mb=16:max_malloc_fill_size=0"; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 4096) return 0;
    char *buf = malloc(size + 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = 0;
    char *argv[33];
    int argc = 0;
    argv[argc++] = "qforge";
    for (size_t i = 0; i <= size && argc < 32;) {
        argv[argc++] = buf + i;
        size_t l = strlen(buf + i);
        i += l + 1;
    }
    argv[argc] = NULL;

    cli_engine_opts eo = {.cp = qf_context_default_params()};
    qf_job j;
    qf_job_default(&j);
    const char *paths[34];
    int n_paths = 0;
    char msg[256];
    for (int i = 1; i < argc; i++) {
        int before = i, r;
        msg[0] = 0;
        if ((r = cli_engine_flag(argc, argv, &i, &eo, msg, sizeof msg)) != 0) {
            if (r < 0 && !msg[0]) abort();
        } else if ((r = cli_job_flag(argc, argv, &i, &j, paths, &n_paths, msg, sizeof msg)) != 0) {
            if (r < 0 && !msg[0]) abort();
        } else {
            int iv;
            int64_t lv;
            double dv;
            qf_kv_mode km;
            qf_device dev;
            qf_type ty;
            qf_artifact_kind kind;
            if (cli_parse_int(argv[i], -5, 1000, &iv) && (iv < -5 || iv > 1000)) abort();
            if (cli_parse_i64(argv[i], 0, INT64_MAX, &lv) && lv < 0) abort();
            if (cli_parse_double(argv[i], 0, 1, &dv) && !(dv >= 0 && dv <= 1)) abort();
            sink += qf_kv_mode_from_name(argv[i], &km) + qf_device_from_name(argv[i], &dev) +
                    qf_type_from_name(argv[i], &ty) + qf_artifact_kind_parse(argv[i], &kind);
        }
        if (i < before || i >= argc) abort();
    }
    if (n_paths > argc) abort();
    if (eo.cp.n_ctx < 0 || eo.cp.n_threads < 0) abort();
    if (!cli_engine_check(&eo, msg, sizeof msg) && !msg[0]) abort();

    if (argc >= 3) {
        const char *ins[2] = {argv[1], argv[argc - 1]}, *in_names[2] = {"a", "b"};
        const char *outs[2] = {argv[2], argv[1]}, *out_names[2] = {"o1", "o2"};
        qf_error e = {0};
        /* the same path is always the same file */
        if (!qf_same_file(argv[1], argv[1]) && strcmp(argv[1], "-") != 0) abort();
        qf_status st = qf_check_outputs(ins, in_names, 2, outs, out_names, 2, &e);
        if (strcmp(argv[1], "-") != 0 && st != QF_ERR_ARG) abort(); /* o2 is input a */
        sink += qf_check_writable(argv[2], QF_ERR_IO, &e);
    }
    free(buf);
    return 0;
}
