/* qforge/mpi.h: the process group a command runs in. Under `mpirun -np N qforge ...` (a build
 * with Open MPI, docs/mpi.md) the perplexity, capture, certification and sweep work is sharded
 * over N ranks and reduced in a fixed order, so every printed number is identical for any N.
 * Without mpirun, or in a build without MPI, there is one rank and nothing changes. */
#ifndef QFORGE_MPI_H
#define QFORGE_MPI_H

#include "qforge/api.h"
#include <stdbool.h>
#include <stddef.h>

#include "qforge/api.h"
#include "qforge/error.h"

/* Join the job when the process was started by mpirun (OMPI_COMM_WORLD_SIZE in the
 * environment); otherwise (or in a build without MPI) stay a single rank. Call once, first. */
QF_API qf_status qf_mpi_init(int *argc, char ***argv, qf_error *err);
/* Leave the job (MPI_Finalize when it was joined). Safe to call without qf_mpi_init. */
QF_API void qf_mpi_finalize(void);
/* Whether this build has Open MPI compiled in. */
QF_API bool qf_mpi_built(void);
/* This process's rank, the job's size (1 when not under mpirun) and its rank on this host
 * (OMPI_COMM_WORLD_LOCAL_RANK: the GPU it drives with --device cuda). */
QF_API int qf_mpi_rank(void);
QF_API int qf_mpi_size(void);
QF_API int qf_mpi_local_rank(void);
/* End the whole job with this exit code (MPI_Abort; exit() when single). */
QF_API _Noreturn void qf_mpi_abort(int exit_code);
/* Whether `e` was agreed by every rank (a collective failure: every rank holds the same error,
 * rank 0 reports it); false for a failure only this rank saw. */
QF_API bool qf_mpi_error_shared(const qf_error *e);
/* Refuse (QF_ERR_ARG, on every rank, before any work) when these n bytes (a model or corpus
 * SHA-256) differ between any rank and rank 0. Collective: every rank calls it. */
QF_API qf_status qf_mpi_check_same(const void *buf, size_t n, const char *what, qf_error *err);
/* Test hook (the hidden flag --mpi-fail-rank R[:exit]): rank R fails its first sharded work
 * unit with QF_ERR_IO, or with :exit leaves at once with _exit(70) as a dead rank would. */
QF_API void qf_mpi_inject_failure(int rank, bool hard_exit);

#endif
