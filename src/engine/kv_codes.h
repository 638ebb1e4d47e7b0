/* kv_codes.h: engine-internal view of the KV code formats (kv_codes.c). The public
 * declarations of the shared helpers (qf_kv_code_pack/decode/bytes, the int8 row quantizer)
 * stay in include/qforge/kvlearn.h; this header adds the engine's own per-vector encoder. */
#ifndef QF_ENGINE_KV_CODES_H
#define QF_ENGINE_KV_CODES_H

#include "qforge/kvlearn.h"

/* Floats of scratch qf_kv_omp_one needs for a dictionary of n_atoms atoms and s nonzeros. */
size_t qf_kv_omp_scratch_floats(int n_atoms, int s);

/* Orthogonal matching pursuit of ONE vector x[head_dim] against d (atoms and gram must be
 * set): at most s atoms, least squares by an incrementally updated Cholesky factor of the
 * Gram sub-matrix. Unused slots get idx 0 / coef 0. Deterministic; no allocation. */
void qf_kv_omp_one(const qf_kv_dict *d, const float *x, int s, float *scratch, uint16_t *idx,
                   float *coef);

/* gram[n][n] = atoms * atoms^T (double accumulation). */
void qf_kv_gram(const float *atoms, int n_atoms, int head_dim, float *gram);

#endif
