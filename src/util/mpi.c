/* mpi.c: the one file that talks to Open MPI (compiled with -DQF_HAVE_MPI when pkg-config
 * finds ompi-c; see the Makefile). Everything else uses qforge/mpi.h and util/par.h, whose
 * single-rank versions below are what a build without MPI, or a run without mpirun, gets.
 * All collectives run on MPI_COMM_WORLD with MPI_BYTE buffers; the byte counts of one call
 * must fit an int (2 GiB), which is checked. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef QF_HAVE_MPI
#include <mpi.h>
#endif

#include "util/par.h"

static int g_rank = 0, g_size = 1, g_local = 0;
static bool g_shared = false;
#ifdef QF_HAVE_MPI
static bool g_joined = false;
#endif
static int g_fail_rank = -1;
static bool g_fail_exit = false, g_fail_done = false;

bool qf_mpi_built(void) {
#ifdef QF_HAVE_MPI
    return true;
#else
    return false;
#endif
}

int qf_mpi_rank(void) { return g_rank; }
int qf_mpi_size(void) { return g_size; }
int qf_mpi_local_rank(void) { return g_local; }
bool qf_mpi_error_shared(const qf_error *e) { return e && g_shared; }
int qf_par_device_index(void) { return g_size > 1 ? g_local : -1; }
qf_status qf_mpi_check_same(const void *buf, size_t n, const char *what, qf_error *err) {
    return qf_par_same(buf, n, what, err);
}

void qf_mpi_inject_failure(int rank, bool hard_exit) {
    g_fail_rank = rank;
    g_fail_exit = hard_exit;
    g_fail_done = false;
}

qf_status qf_par_injected(const char *where, qf_error *err) {
    if (g_fail_rank != g_rank || g_fail_done) return QF_OK;
    g_fail_done = true;
    if (g_fail_exit) {
        fprintf(stderr, "qforge: rank %d: injected death in %s (--mpi-fail-rank)\n", g_rank, where);
        fflush(stderr);
        _exit(70);
    }
    return qf_fail(err, QF_ERR_IO, "%s: injected failure (--mpi-fail-rank %d)", where, g_rank);
}

#ifdef QF_HAVE_MPI

qf_status qf_mpi_init(int *argc, char ***argv, qf_error *err) {
    const char *ws = getenv("OMPI_COMM_WORLD_SIZE");
    if (g_joined || !ws || !*ws) return QF_OK; /* not started by mpirun: one rank */
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        return qf_fail(err, QF_ERR_IO, "MPI_Init failed (OMPI_COMM_WORLD_SIZE=%s)", ws);
    g_joined = true;
    /* a failing MPI call returns its code (reported as an error) instead of aborting silently */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    const char *lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    g_local = lr && *lr ? atoi(lr) : g_rank;
    return QF_OK;
}

void qf_mpi_finalize(void) {
    if (g_joined) MPI_Finalize();
    g_joined = false;
}

_Noreturn void qf_mpi_abort(int exit_code) {
    fflush(stdout);
    fflush(stderr);
    if (g_joined) MPI_Abort(MPI_COMM_WORLD, exit_code);
    exit(exit_code);
}

static qf_status mpi_err(qf_error *err, int rc, const char *what) {
    char s[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, s, &len);
    return qf_fail(err, QF_ERR_IO, "MPI: %s failed on rank %d of %d: %s", what, g_rank, g_size, s);
}

#define MPI_CK(call, what)                                                                         \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != MPI_SUCCESS) return mpi_err(err, rc_, what);                                    \
    } while (0)

static qf_status fits_int(size_t n, qf_error *err) {
    if (n > (size_t)INT_MAX) return qf_fail(err, QF_ERR_UNSUPPORTED, "MPI: one message of %zu bytes exceeds 2 GiB", n);
    return QF_OK;
}

qf_status qf_par_agree(qf_status st, qf_error *err) {
    if (g_size == 1) return st;
    int mine = (int)st, *all = malloc((size_t)g_size * sizeof(int));
    if (!all) return qf_fail(err, QF_ERR_NOMEM, "MPI: out of memory");
    int rc = MPI_Allgather(&mine, 1, MPI_INT, all, 1, MPI_INT, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) {
        free(all);
        return mpi_err(err, rc, "MPI_Allgather (status)");
    }
    int first = -1;
    for (int r = 0; r < g_size && first < 0; r++)
        if (all[r] != QF_OK) first = r;
    free(all);
    if (first < 0) return QF_OK;
    char msg[sizeof err->msg];
    memset(msg, 0, sizeof msg);
    if (first == g_rank && err) snprintf(msg, sizeof msg, "%s", err->msg);
    int code = (int)st;
    if ((rc = MPI_Bcast(&code, 1, MPI_INT, first, MPI_COMM_WORLD)) != MPI_SUCCESS) return mpi_err(err, rc, "MPI_Bcast");
    if ((rc = MPI_Bcast(msg, (int)sizeof msg, MPI_CHAR, first, MPI_COMM_WORLD)) != MPI_SUCCESS)
        return mpi_err(err, rc, "MPI_Bcast");
    msg[sizeof msg - 1] = 0;
    g_shared = true;
    return qf_fail(err, (qf_status)code, "rank %d of %d: %s", first, g_size, msg);
}

qf_status qf_par_same(const void *buf, size_t n, const char *what, qf_error *err) {
    if (g_size == 1) return QF_OK;
    qf_status st = fits_int(n, err);
    unsigned char *root = st ? NULL : malloc(n ? n : 1);
    if (!st && !root) st = qf_fail(err, QF_ERR_NOMEM, "MPI: out of memory");
    if (!st) {
        if (g_rank == 0) memcpy(root, buf, n);
        int rc = MPI_Bcast(root, (int)n, MPI_BYTE, 0, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) st = mpi_err(err, rc, "MPI_Bcast");
        else if (memcmp(root, buf, n) != 0)
            st = qf_fail(err, QF_ERR_ARG, "the %s differs from rank 0's: every rank must run the same inputs; refused "
                                          "before any work", what);
    }
    free(root);
    return qf_par_agree(st, err);
}

qf_status qf_par_gather(const void *send, size_t n, void *recv, qf_error *err) {
    if (g_size == 1) {
        if (n) memmove(recv, send, n);
        return QF_OK;
    }
    if (fits_int(n, err)) return QF_ERR_UNSUPPORTED;
    MPI_CK(MPI_Gather(send, (int)n, MPI_BYTE, recv, (int)n, MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Gather");
    return QF_OK;
}

qf_status qf_par_allgatherv(const void *send, size_t n, void **recv, size_t *counts, qf_error *err) {
    *recv = NULL;
    if (g_size == 1) {
        counts[0] = n;
        if (!(*recv = malloc(n ? n : 1))) return qf_fail(err, QF_ERR_NOMEM, "out of memory");
        if (n) memcpy(*recv, send, n);
        return QF_OK;
    }
    if (fits_int(n, err)) return QF_ERR_UNSUPPORTED;
    int mine = (int)n, *cnt = malloc((size_t)g_size * sizeof(int)), *disp = malloc((size_t)g_size * sizeof(int));
    if (!cnt || !disp) {
        free(cnt), free(disp);
        return qf_fail(err, QF_ERR_NOMEM, "MPI: out of memory");
    }
    qf_status st = QF_OK;
    int rc = MPI_Allgather(&mine, 1, MPI_INT, cnt, 1, MPI_INT, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) st = mpi_err(err, rc, "MPI_Allgather (sizes)");
    size_t total = 0;
    for (int r = 0; r < g_size && !st; r++) {
        disp[r] = (int)total;
        counts[r] = (size_t)cnt[r];
        total += (size_t)cnt[r];
    }
    if (!st) st = fits_int(total, err);
    if (!st && !(*recv = malloc(total ? total : 1))) st = qf_fail(err, QF_ERR_NOMEM, "MPI: out of memory for %zu bytes", total);
    if (!st && (rc = MPI_Allgatherv(send, mine, MPI_BYTE, *recv, cnt, disp, MPI_BYTE, MPI_COMM_WORLD)) != MPI_SUCCESS)
        st = mpi_err(err, rc, "MPI_Allgatherv");
    free(cnt), free(disp);
    if (st) free(*recv), *recv = NULL;
    return st;
}

qf_status qf_par_bcast(void *buf, size_t n, int root, qf_error *err) {
    if (g_size == 1) return QF_OK;
    if (fits_int(n, err)) return QF_ERR_UNSUPPORTED;
    MPI_CK(MPI_Bcast(buf, (int)n, MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
    return QF_OK;
}

qf_status qf_par_bcast_alloc(void **buf, size_t *n, int root, qf_error *err) {
    if (g_size == 1) return QF_OK;
    unsigned long long len = *n;
    MPI_CK(MPI_Bcast(&len, 1, MPI_UNSIGNED_LONG_LONG, root, MPI_COMM_WORLD), "MPI_Bcast");
    if (fits_int((size_t)len, err)) return QF_ERR_UNSUPPORTED;
    if (g_rank != root) {
        free(*buf);
        if (!(*buf = malloc(len ? (size_t)len : 1))) return qf_fail(err, QF_ERR_NOMEM, "MPI: out of memory");
        *n = (size_t)len;
    }
    MPI_CK(MPI_Bcast(*buf, (int)len, MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
    return QF_OK;
}

#else /* one rank: a build without Open MPI */

qf_status qf_mpi_init(int *argc, char ***argv, qf_error *err) {
    (void)argc, (void)argv, (void)err;
    return QF_OK;
}
void qf_mpi_finalize(void) {}
_Noreturn void qf_mpi_abort(int exit_code) {
    fflush(stdout);
    fflush(stderr);
    exit(exit_code);
}
qf_status qf_par_agree(qf_status st, qf_error *err) {
    (void)err;
    return st;
}
qf_status qf_par_same(const void *buf, size_t n, const char *what, qf_error *err) {
    (void)buf, (void)n, (void)what, (void)err;
    return QF_OK;
}
qf_status qf_par_gather(const void *send, size_t n, void *recv, qf_error *err) {
    (void)err;
    if (n) memmove(recv, send, n);
    return QF_OK;
}
qf_status qf_par_allgatherv(const void *send, size_t n, void **recv, size_t *counts, qf_error *err) {
    counts[0] = n;
    if (!(*recv = malloc(n ? n : 1))) return qf_fail(err, QF_ERR_NOMEM, "out of memory");
    if (n) memcpy(*recv, send, n);
    return QF_OK;
}
qf_status qf_par_bcast(void *buf, size_t n, int root, qf_error *err) {
    (void)buf, (void)n, (void)root, (void)err;
    return QF_OK;
}
qf_status qf_par_bcast_alloc(void **buf, size_t *n, int root, qf_error *err) {
    (void)buf, (void)n, (void)root, (void)err;
    return QF_OK;
}

#endif
