/* cli_util.c: error printing, strict flag parsing and JSON output for the subcommands. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

int cli_fail(const char *cmd, const qf_error *e) {
    fprintf(stderr, "qforge %s: error: %s: %s\n", cmd, qf_status_name(e->code), e->msg);
    return qf_status_exit_code(e->code);
}

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
