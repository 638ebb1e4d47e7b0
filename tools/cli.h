/* cli.h: what the qforge subcommands share: error reporting with per-status exit codes,
 * strict number parsing for flags, and JSON printing. No pipeline logic lives in tools/. */
#ifndef QF_CLI_H
#define QF_CLI_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "qforge/artifact.h"
#include "qforge/error.h"
#include "qforge/model.h"
#include "qforge/run.h"
#include "cuda_env.h" /* cli_cuda_env */

/* Print "qforge <cmd>: error: <StatusName>: <message>" to stderr; return the exit code. */
int cli_fail(const char *cmd, const qf_error *e);
/* Whether this process prints informational output (rank 0 of an mpirun job, or alone). */
bool cli_root(void);
/* Usage error: print the message and the subcommand's usage, return 1. */
int cli_usage(const char *cmd, const char *usage, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Strict parsers: the whole string must be a number in range; false otherwise. */
bool cli_parse_int(const char *s, long lo, long hi, int *out);
bool cli_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out);
bool cli_parse_double(const char *s, double lo, double hi, double *out);
/* --arith's value: "canonical" (*canonical = true) or "fast" (false); false for anything else */
bool cli_parse_arith(const char *s, bool *canonical);

/* `argv[*i]` is flag `name`: take its value into *val (advancing *i), or report a missing
 * value. Returns 1 when matched, 0 when not this flag, -1 on a missing value. */
int cli_flag_value(int argc, char **argv, int *i, const char *name, const char *alias,
                   const char **val);

/* The engine flags `ppl` and `generate` share: -m MODEL, -c N (into cp->n_ctx), -t N,
 * --device D, -ctk T, -ctv T, --kv-rot R, --artifact X.qfa, --trust-key PEM,
 * --force-uncertified-ctx. Returns 1 when argv[*i] was
 * one of them (value consumed), 0 when not, -1 on a missing or bad value (reason in msg). */
typedef struct {
    const char *model_path, *artifact_path, *trust_key;
    qf_context_params cp;
    bool kv_given; /* -ctk or -ctv was given */
    bool force_uncertified_ctx; /* --force-uncertified-ctx: run an artifact above its certified context */
} cli_engine_opts;
/* The warning --force-uncertified-ctx earns when qf_run_open ran an artifact above the largest
 * context it is certified at (qf_run_open refuses that without the flag); nothing otherwise. */
void cli_warn_uncertified_ctx(const char *cmd, const qf_run *run);

/* A path flag given twice (-m, --artifact, --trust-key) is refused, never "last one wins". */
int cli_engine_flag(int argc, char **argv, int *i, cli_engine_opts *o, char *msg, size_t cap);

/* After parsing: flags that contradict each other are refused rather than one silently
 * ignored: -ctk/-ctv with --artifact (the artifact sets the KV cache), --reference with
 * --device cuda (the reference is the CPU oracle), --trust-key without --artifact. Returns
 * false with the reason in msg. */
bool cli_engine_check(const cli_engine_opts *o, char *msg, size_t cap);

/* A path flag that may be given once: false (reason in msg) when *slot is already set. */
bool cli_set_once(const char **slot, const char *flag, const char *val, char *msg, size_t cap);

/* Warn on stderr when n_ctx exceeds the model's trained context (quality degrades past it). */
void cli_warn_ctx(const char *cmd, const qf_model *m, int n_ctx);

/* Append to an out-of-memory error that a smaller -b (batch) and -c lower the memory needed. */
void cli_nomem_hint(qf_error *e);

/* Refuse outputs that are inputs or each other (qf_check_outputs) and outputs that cannot be
 * written (qf_check_writable, QF_ERR_IO), before any work. 0 or the printed error's exit code. */
int cli_check_outputs(const char *cmd, const char *const *ins, const char *const *in_names, int n_in,
                      const char *const *outs, const char *const *out_names, int n_out);

/* Print a JSON value (indented) to stdout followed by a newline, and free it. */
void cli_print_json(json_t *j);

/* Subcommands: one function each, in tools/cmd_<name>.c. */
typedef int (*cli_cmd_fn)(int argc, char **argv);

#endif
