/* qforge/util.h: the few file, hash and clock helpers that programs built on libqforge (the
 * qforge CLI among them) share with the library. */
#ifndef QFORGE_UTIL_H
#define QFORGE_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "qforge/api.h"
#include "qforge/error.h"

/* Read a whole file (or "-" for stdin) into a malloc'd NUL-terminated buffer; *len receives
 * the length without the NUL. The caller frees *out. */
QF_API qf_status qf_read_file(const char *path, char **out, size_t *len, qf_error *err);

/* Write n bytes to `path` atomically: a temp file in the same directory, fsync, rename, fsync
 * of the directory. On failure `path` is untouched and no temp file is left. */
QF_API qf_status qf_write_file_atomic(const char *path, const void *buf, size_t n, qf_error *err);

/* SHA-256 of n bytes in memory. */
QF_API void qf_sha256(const void *data, size_t n, uint8_t out[32]);

/* SHA-256 of a file's contents (streamed). */
QF_API qf_status qf_sha256_file(const char *path, uint8_t out[32], qf_error *err);

/* Lower-case hex of n bytes into out (2n + 1 bytes, NUL-terminated). */
QF_API void qf_hex(const uint8_t *bytes, size_t n, char *out);

/* Seconds on the monotonic clock (for durations only). */
QF_API double qf_now_sec(void);

#endif
