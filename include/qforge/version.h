/* qforge/version.h: the engine version and the git commit it was built from (recorded in every
 * artifact's provenance). */
#ifndef QFORGE_VERSION_H
#define QFORGE_VERSION_H

#include "qforge/api.h"

QF_API const char *qf_version(void);
QF_API const char *qf_git_commit(void);

#endif
