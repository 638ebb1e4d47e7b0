/* error.c: the qf_error record, status names and their exit codes. */
#include "qforge/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"

static const char *const status_names[QF_STATUS_COUNT] = {
    [QF_OK] = "Ok",
    [QF_ERR_ARG] = "BadArgument",
    [QF_ERR_IO] = "IoError",
    [QF_ERR_NOMEM] = "OutOfMemory",
    [QF_ERR_FORMAT] = "BadFormat",
    [QF_ERR_UNSUPPORTED] = "Unsupported",
    [QF_ERR_NOT_IMPLEMENTED] = "NotYetImplemented",
    [QF_ERR_CORPUS_EMPTY] = "CorpusEmpty",
    [QF_ERR_OLLAMA_UNAVAILABLE] = "OllamaUnavailable",
    [QF_ERR_CAPTURE_FAILED] = "CaptureFailed",
    [QF_ERR_CERTIFY_FAILED] = "CertifyFailed",
    [QF_ERR_PACKAGE_FAILED] = "PackageFailed",
    [QF_ERR_ARTIFACT_CORRUPT] = "ArtifactCorrupt",
    [QF_ERR_ARTIFACT_VERSION] = "ArtifactUnknownVersion",
    [QF_ERR_ARTIFACT_NOT_CERTIFIED] = "ArtifactNotCertified",
    [QF_ERR_ARTIFACT_WRONG_MODEL] = "ArtifactWrongModel",
    [QF_ERR_ARTIFACT_BAD_SIGNATURE] = "ArtifactBadSignature",
    [QF_ERR_DEVICE] = "DeviceError",
};

_Noreturn void qf_assert_fail(const char *file, int line, const char *cond) {
    fprintf(stderr, "%s:%d: assertion failed: %s\n", file, line, cond);
    fflush(stderr);
    abort();
}

qf_status qf_fail(qf_error *e, qf_status code, const char *fmt, ...) {
    if (e) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
        va_end(ap);
        e->code = code;
    }
    return code;
}

qf_status qf_error_prefix(qf_error *e, const char *fmt, ...) {
    if (!e) return QF_ERR_ARG;
    char prefix[512], old[sizeof e->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, e->msg, sizeof old);
    snprintf(e->msg, sizeof e->msg, "%s%s", prefix, old);
    return e->code;
}

void qf_error_clear(qf_error *e) {
    if (e) {
        e->code = QF_OK;
        e->msg[0] = '\0';
    }
}

const char *qf_status_name(qf_status s) {
    if ((unsigned)s >= QF_STATUS_COUNT || !status_names[s]) return "Unknown";
    return status_names[s];
}

int qf_status_exit_code(qf_status s) {
    /* 0 ok, 1 generic usage error stays reserved for getopt-level failures in the CLI,
     * so every status maps to 2 + its enum value. */
    if (s == QF_OK) return 0;
    if ((unsigned)s >= QF_STATUS_COUNT) return 1;
    return 2 + (int)s;
}
