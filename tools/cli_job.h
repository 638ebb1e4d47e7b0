/* cli_job.h: the flags `qforge calibrate` and `qforge sweep` share, parsed into a qf_job. */
#ifndef QF_CLI_JOB_H
#define QF_CLI_JOB_H

#include <stddef.h>

#include "qforge/forge.h"

/* If argv[*i] is a shared job flag, parse it (and its value, advancing *i) into j; corpus
 * paths are appended to paths (room for argc entries). Returns 1 when handled, 0 when the
 * flag is not a job flag, -1 on a missing or bad value (the reason is written to msg). */
int cli_job_flag(int argc, char **argv, int *i, qf_job *j, const char **paths, int *n_paths, char *msg,
                 size_t cap);

#endif
