/* hadamard.h: the normalized Walsh-Hadamard transform used to rotate KV vectors before they are
 * quantized (--kv-rot hadamard, kv-rq artifacts), as llama.cpp does for quantized caches.
 *
 * H_n (n a power of two) is symmetric and orthogonal once scaled by 1/sqrt(n), so the transform
 * is its own inverse: qf_hadamard(qf_hadamard(x)) == x up to rounding, and dot products are
 * preserved (q.k == (Hq).(Hk)). The fast version is the in-place butterfly (n log n); the oracle
 * multiplies by the explicit matrix, H[i][j] = (-1)^popcount(i & j) / sqrt(n). */
#ifndef QF_HADAMARD_H
#define QF_HADAMARD_H

#include <stdbool.h>

/* true when n >= 1 is a power of two (the only sizes the transform is defined for) */
bool qf_hadamard_size_ok(int n);
/* x[0..n) <- H_n x / sqrt(n) in place. n must satisfy qf_hadamard_size_ok (a QF_ASSERT
 * aborts otherwise: callers validate sizes when the cache or artifact is set up). */
void qf_hadamard(float *x, int n);
/* n_vec consecutive vectors of length n, each transformed in place */
void qf_hadamard_rows(float *x, int n, int n_vec);
/* the oracle: dst = H_n src / sqrt(n) by the explicit matrix, in double; dst != src */
void qf_hadamard_ref(const float *src, float *dst, int n);

#endif
