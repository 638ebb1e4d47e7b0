/* cli_util.c: error printing, strict flag parsing and JSON output for the subcommands. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "qforge/mpi.h"
#include "qforge/util.h"

int cli_fail(const char *cmd, const qf_error *e) {
    if (qf_mpi_size() == 1) {
        fprintf(stderr, "qforge %s: error: %s: %s\n", cmd, qf_status_name(e->code), e->msg);
        return qf_status_exit_code(e->code);
    }
    /* under mpirun: a failure every rank agreed on (its message names the rank) is printed by
     * rank 0 and every rank exits with its code; a failure only this rank saw is printed with
     * the rank and ends the whole job (MPI_Abort) so no rank waits forever */
    bool shared = qf_mpi_error_shared(e);
    char who[48] = "";
    if (!shared) snprintf(who, sizeof who, "rank %d of %d: ", qf_mpi_rank(), qf_mpi_size());
    if (!shared || qf_mpi_rank() == 0)
        fprintf(stderr, "qforge %s: error: %s: %s%s\n", cmd, qf_status_name(e->code), who, e->msg);
    if (!shared) qf_mpi_abort(qf_status_exit_code(e->code));
    qf_mpi_finalize();
    return qf_status_exit_code(e->code);
}

bool cli_root(void) { return qf_mpi_rank() == 0; }

int cli_usage(const char *cmd, const char *usage, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "qforge %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nusage: %s\n", usage);
    return 1;
}

bool cli_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    if (!s || !*s) return false;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool cli_parse_int(const char *s, long lo, long hi, int *out) {
    int64_t v;
    if (!cli_parse_i64(s, lo, hi, &v)) return false;
    *out = (int)v;
    return true;
}

bool cli_parse_double(const char *s, double lo, double hi, double *out) {
    if (!s || !*s) return false;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno || *end || !(v >= lo && v <= hi)) return false;
    *out = v;
    return true;
}

bool cli_parse_arith(const char *s, bool *canonical) {
    if (!s || (strcmp(s, "canonical") && strcmp(s, "fast"))) return false;
    *canonical = !strcmp(s, "canonical");
    return true;
}

int cli_flag_value(int argc, char **argv, int *i, const char *name, const char *alias,
                   const char **val) {
    const char *a = argv[*i];
    if (strcmp(a, name) != 0 && !(alias && strcmp(a, alias) == 0)) return 0;
    if (*i + 1 >= argc) return -1;
    *val = argv[++*i];
    return 1;
}

void cli_print_json(json_t *j) {
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(10));
    if (s) {
        fputs(s, stdout);
        fputc('\n', stdout);
        free(s);
    }
    json_decref(j);
}

int cli_engine_flag(int argc, char **argv, int *i, cli_engine_opts *o, char *msg, size_t cap) {
    const char *a = argv[*i], *val = NULL;
    int r;
#define FLAG(name, alias) ((r = cli_flag_value(argc, argv, i, name, alias, &val)) != 0)
#define BAD(...) return snprintf(msg, cap, __VA_ARGS__), -1
    if (FLAG("-m", "--model")) {
        if (r < 0) goto missing;
        if (!cli_set_once(&o->model_path, a, val, msg, cap)) return -1;
    } else if (FLAG("-c", "--ctx-size")) {
        if (r < 0) goto missing;
        if (!cli_parse_int(val, 2, 1 << 20, &o->cp.n_ctx)) BAD("bad -c '%s'", val);
    } else if (FLAG("-t", "--threads")) {
        if (r < 0) goto missing;
        if (!cli_parse_int(val, 1, 1024, &o->cp.n_threads)) BAD("bad -t '%s'", val);
    } else if (FLAG("--device", NULL)) {
        if (r < 0) goto missing;
        if (!qf_device_from_name(val, &o->cp.device)) BAD("bad --device '%s' (cpu, cuda or auto)", val);
    } else if (FLAG("-ctk", "--cache-type-k") || FLAG("-ctv", "--cache-type-v")) {
        if (r < 0) goto missing;
        qf_kv_mode *dst = a[3] == 'k' || !strcmp(a, "--cache-type-k") ? &o->cp.kv_k : &o->cp.kv_v;
        if (!qf_kv_mode_from_name(val, dst) || *dst >= QF_KV_INT8)
            BAD("bad %s '%s' (f32, f16, q8_0, q4_0; int8/dict come with --artifact)", a, val);
        o->kv_given = true;
    } else if (FLAG("--kv-rot", NULL)) {
        if (r < 0) goto missing;
        if (!qf_kv_rot_from_name(val, &o->cp.kv_rot)) BAD("bad --kv-rot '%s' (none or hadamard)", val);
    } else if (!strcmp(a, "--force-uncertified-ctx")) {
        o->force_uncertified_ctx = true;
        return 1;
    } else if (FLAG("--artifact", NULL)) {
        if (r < 0) goto missing;
        if (!cli_set_once(&o->artifact_path, a, val, msg, cap)) return -1;
    } else if (FLAG("--trust-key", NULL)) {
        if (r < 0) goto missing;
        if (!cli_set_once(&o->trust_key, a, val, msg, cap)) return -1;
    } else {
        return 0;
    }
    return 1;
missing:
    BAD("option '%s' needs a value", a);
#undef BAD
#undef FLAG
}

bool cli_set_once(const char **slot, const char *flag, const char *val, char *msg, size_t cap) {
    if (*slot) {
        snprintf(msg, cap, "%s given twice ('%s' and '%s'): give it once", flag, *slot, val);
        return false;
    }
    *slot = val;
    return true;
}

bool cli_engine_check(const cli_engine_opts *o, char *msg, size_t cap) {
    if (o->kv_given && o->artifact_path) {
        snprintf(msg, cap, "-ctk/-ctv and --artifact conflict: the artifact sets the KV cache type");
        return false;
    }
    if (o->cp.reference && o->cp.device == QF_DEVICE_CUDA) {
        snprintf(msg, cap, "--reference and --device cuda conflict: the reference path is the CPU oracle");
        return false;
    }
    if (o->trust_key && !o->artifact_path) {
        snprintf(msg, cap, "--trust-key needs --artifact X.qfa");
        return false;
    }
    return true;
}

void cli_warn_ctx(const char *cmd, const qf_model *m, int n_ctx) {
    int train = qf_model_hparams(m)->n_ctx_train;
    if (train > 0 && n_ctx > train)
        fprintf(stderr, "qforge %s: warning: -c %d exceeds the model's trained context (%d tokens); "
                        "positions past %d are out of distribution and quality degrades\n",
                cmd, n_ctx, train, train);
}

void cli_nomem_hint(qf_error *e) {
    if (e->code != QF_ERR_NOMEM) return;
    size_t n = strlen(e->msg);
    snprintf(e->msg + n, sizeof e->msg - n, " (a smaller -b batch, or a smaller -c, needs less memory)");
}

int cli_check_outputs(const char *cmd, const char *const *ins, const char *const *in_names, int n_in,
                      const char *const *outs, const char *const *out_names, int n_out) {
    qf_error e = {0};
    if (qf_check_outputs(ins, in_names, n_in, outs, out_names, n_out, &e)) return cli_fail(cmd, &e);
    for (int i = 0; i < n_out; i++)
        if (outs[i] && qf_check_writable(outs[i], QF_ERR_IO, &e)) return cli_fail(cmd, &e);
    return 0;
}

void cli_warn_uncertified_ctx(const char *cmd, const qf_run *run) {
    if (!run->uncertified_ctx || !cli_root()) return;
    fprintf(stderr,
            "qforge %s: warning: --force-uncertified-ctx: running at -c %d, above the largest context the "
            "artifact is certified at (%d); its certificate does not cover these numbers\n",
            cmd, qf_context_params_get(run->ctx)->n_ctx, run->certified_ctx);
}

