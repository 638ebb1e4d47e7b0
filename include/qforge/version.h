/* qforge/version.h: the engine version and the git commit it was built from (recorded in every
 * artifact's provenance). */
#ifndef QFORGE_VERSION_H
#define QFORGE_VERSION_H

const char *qf_version(void);
const char *qf_git_commit(void);

#endif
