/* version.c: the version strings. This is the only file compiled with the git commit, and the
 * Makefile rebuilds it whenever HEAD moves, so an incremental build never records a stale one. */
#include "qforge/version.h"

#ifndef QF_GIT_COMMIT
#define QF_GIT_COMMIT "unknown"
#endif

const char *qf_version(void) { return QF_VERSION; }
const char *qf_git_commit(void) { return QF_GIT_COMMIT; }
