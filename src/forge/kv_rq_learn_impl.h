/* kv_rq_learn_impl.h: forge-internal glue between learn_kv_rq.c and learn_kv_rq_klt.c. Not
 * public API. */
#ifndef QF_KV_RQ_LEARN_IMPL_H
#define QF_KV_RQ_LEARN_IMPL_H

#include <stdint.h>

#include "qforge/kv_rq.h"

/* V minus its prediction from the same token's K, one row: out[o] = y[o] - sum_i P[o][i] x[i]
 * for o < n_out (P [n_out][n_in] f32 rows). Each sum starts at y[o] and subtracts the products
 * (double) in i order, the bits of the plain loop (and of the device's, cuda_learn.cu); four
 * outputs advance together so the subtractions are not one dependent chain. */
void qf_kv_rq_pred_minus(const float *y, const float *P, const float *x, int n_out, int n_in, double *out);
/* y[i] = sum_j A[i][j] * x[j] for the n rows of the double A [n][D] (x f32), each sum in j order,
 * four rows advancing together: the bits of one row at a time (qf_kv_rq_klt_matvec for f32 A). */
void qf_kv_rq_matvec_f64(const double *A, const float *x, int n, int D, double *y);

/* Format 3's payload arrays that depend on the allocation, stream s, bits[l] per layer: each
 * coordinate's levels at its width lv [L][H][D][64] and the widths wd [L][H][D] (an f16 layer:
 * widths 0, levels 0..63), as qf_kv_rq_klt_payload adds them and qf_kv_rq_payload_update
 * rewrites them. */
void qf_kv_rq_klt_bit_arrays(const qf_kv_rq_fit *f, int s, const int *bits, float *lv, uint8_t *wd);

#endif
