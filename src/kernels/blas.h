/* blas.h: single-precision GEMM from OpenBLAS, loaded on first use (dlopen), never linked.
 *
 * Why not linked: a linked OpenBLAS starts its own thread pool (one thread per core) in its
 * library constructor, before main() can say OPENBLAS_NUM_THREADS=1; `info` and `verify` then
 * pay for threads they never use, and under an address-space limit (ulimit -v) its first sgemm
 * retries a failed 128 MiB work-buffer allocation forever (OpenBLAS 0.3.21's
 * blas_memory_alloc loops until an allocation succeeds), so `ppl` hung instead of failing.
 * Loaded here: OPENBLAS_NUM_THREADS=1 is set before the library initialises (our pool does the
 * parallelism: each pool thread calls a single-threaded sgemm), and qf_blas_init reserves the
 * address space the per-thread work buffers will take first, so a limit is an out-of-memory
 * error in milliseconds, never a hang. */
#ifndef QF_KERNELS_BLAS_H
#define QF_KERNELS_BLAS_H

#include <cblas.h> /* the CBLAS enums only: no symbol of the library is linked */

#include "qforge/error.h"

/* OpenBLAS's per-call work buffer (BUFFER_SIZE + a page on Debian bookworm's
 * libopenblas0-pthread 0.3.21, measured: blas_memory_alloc mallocs 134221824 bytes), with room. */
#define QF_BLAS_BUFFER_BYTES ((size_t)(128u << 20) + (1u << 20))

/* Load OpenBLAS (idempotent, thread-safe) and check that n_threads concurrent callers' work
 * buffers fit the address-space limit (RLIMIT_AS; nothing to check when unlimited).
 * QF_ERR_NOMEM when the library cannot be mapped or the buffers do not fit (the message says
 * how much is needed and that a smaller -t needs less); QF_ERR_UNSUPPORTED when no OpenBLAS is
 * installed. Call before the first qf_sgemm. */
qf_status qf_blas_init(int n_threads, qf_error *err);

/* cblas_sgemm / cblas_ssyrk through the loaded library. They load it themselves when nobody
 * called qf_blas_init (and abort with a message when no OpenBLAS is installed: callers that can
 * report an error call qf_blas_init first). */
void qf_ssyrk(enum CBLAS_ORDER order, enum CBLAS_UPLO uplo, enum CBLAS_TRANSPOSE trans, int n, int k, float alpha,
              const float *a, int lda, float beta, float *c, int ldc);
void qf_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int m, int n, int k,
              float alpha, const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);

#endif
