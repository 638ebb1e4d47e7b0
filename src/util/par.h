/* par.h: the collectives the sharded stages use (src/util/mpi.c is the only file that sees
 * MPI). Every call is collective: all ranks make it, in the same order. With one rank each is
 * a local copy or a no-op, so the single-process path runs the same code. Buffers are bytes;
 * the caller packs and unpacks them in a fixed (rank, then item) order. */
#ifndef QF_UTIL_PAR_H
#define QF_UTIL_PAR_H

#include <stddef.h>
#include <stdint.h>

#include "qforge/error.h"
#include "qforge/mpi.h"

/* Every rank passes its status (and its error in *err); all return the status of the lowest
 * failing rank, with its message prefixed "rank R of N: " (N > 1), on every rank. */
qf_status qf_par_agree(qf_status st, qf_error *err);
/* Refuse (QF_ERR_ARG, on every rank) when `n` bytes differ between any rank and rank 0;
 * `what` names them in the message ("model SHA-256"). */
qf_status qf_par_same(const void *buf, size_t n, const char *what, qf_error *err);
/* Gather `n` bytes from every rank (the same n everywhere) into recv (rank 0: N * n bytes in
 * rank order; ignored elsewhere). */
qf_status qf_par_gather(const void *send, size_t n, void *recv, qf_error *err);
/* Every rank contributes n bytes (n may differ); every rank gets the concatenation in rank
 * order in *recv (malloc'd) with counts[r] (caller's array of qf_mpi_size() entries). */
qf_status qf_par_allgatherv(const void *send, size_t n, void **recv, size_t *counts, qf_error *err);
/* Broadcast n bytes (the same n everywhere) from root. */
qf_status qf_par_bcast(void *buf, size_t n, int root, qf_error *err);
/* Broadcast a malloc'd buffer of root's size: on other ranks *buf is replaced by a new one. */
qf_status qf_par_bcast_alloc(void **buf, size_t *n, int root, qf_error *err);
/* The failure injection point of a sharded work unit: QF_ERR_IO on the rank chosen with
 * qf_mpi_inject_failure (once), QF_OK elsewhere. */
qf_status qf_par_injected(const char *where, qf_error *err);
/* The CUDA device index this rank prefers (its local rank), -1 when single. */
int qf_par_device_index(void);

#endif
