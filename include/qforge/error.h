/* qforge/error.h: status codes and the error record every fallible call fills.
 *
 * Every public function that can fail returns a qf_status and, when given a non-NULL
 * qf_error, writes a human message naming the file, the field and what was expected.
 * Each status has its own process exit code so scripts can tell refusals apart. */
#ifndef QFORGE_ERROR_H
#define QFORGE_ERROR_H

#include "qforge/api.h"
#include <stddef.h>

typedef enum {
    QF_OK = 0,
    QF_ERR_ARG,            /* bad flag or argument */
    QF_ERR_IO,             /* open/read/write/fsync/rename failed (disk full lands here) */
    QF_ERR_NOMEM,
    QF_ERR_FORMAT,         /* malformed input file (GGUF, corpus, tokenizer metadata) */
    QF_ERR_UNSUPPORTED,    /* well-formed but not something we run (arch, tensor type) */
    QF_ERR_NOT_IMPLEMENTED,/* an artifact kind or mode that is not built yet */
    /* forge pipeline failures (corpus -> capture -> learn -> certify -> package) */
    QF_ERR_CORPUS_EMPTY,
    QF_ERR_OLLAMA_UNAVAILABLE,
    QF_ERR_CAPTURE_FAILED,
    QF_ERR_CERTIFY_FAILED,
    QF_ERR_PACKAGE_FAILED,
    /* artifact refusals (engine side) */
    QF_ERR_ARTIFACT_CORRUPT,
    QF_ERR_ARTIFACT_VERSION,
    QF_ERR_ARTIFACT_NOT_CERTIFIED,
    QF_ERR_ARTIFACT_WRONG_MODEL,
    QF_ERR_ARTIFACT_BAD_SIGNATURE,
    QF_ERR_DEVICE,         /* GPU backend unavailable or failed */
    QF_STATUS_COUNT
} qf_status;

typedef struct {
    qf_status code;
    char msg[1024];
} qf_error;

/* Record an error (printf-style message) and return `code`. `e` may be NULL. */
QF_API qf_status qf_fail(qf_error *e, qf_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefix an existing message with context ("loading X: " + old message); returns e->code. */
QF_API qf_status qf_error_prefix(qf_error *e, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

QF_API void qf_error_clear(qf_error *e);

/* Stable name, e.g. "CorpusEmpty", used in messages and --json output. */
QF_API const char *qf_status_name(qf_status s);

/* Process exit code for a status: 0 for QF_OK, distinct small integers otherwise. */
QF_API int qf_status_exit_code(qf_status s);

#endif
