/* kv_codes.h: engine-internal additions to the KV codecs of include/qforge/kv.h (implemented
 * in kv_codes.c). The public declarations (dictionary, encoder, code layouts, int8 rows) are
 * in qforge/kv.h; this header keeps the fixed-sparsity encoder entry point the CPU cache and
 * the CUDA backend's host-side encode share. It includes nothing from the forge. */
#ifndef QF_ENGINE_KV_CODES_H
#define QF_ENGINE_KV_CODES_H

#include "qforge/kv.h"

/* Floats of scratch qf_kv_omp_one needs (qf_kv_omp_scratch_bytes rounded up to floats). */
size_t qf_kv_omp_scratch_floats(int n_atoms, int s);

/* qf_kv_omp_ex(d, x, NULL, s, 0, ...): at most s atoms, no error bound. */
void qf_kv_omp_one(const qf_kv_dict *d, const float *x, int s, float *scratch, uint16_t *idx,
                   float *coef);

/* gram_d[b][a] = the dot product of atoms a and b in double, the products exact and summed in
 * order over head_dim (qf_vec_rows_dot_f64): the encoder's Cholesky dots, which it recomputes
 * for every vector. gram_d is n_atoms^2 doubles. */
void qf_kv_gram_d(const qf_kv_dict *d, double *gram_d);
/* The largest dictionary the learner and qf_kv_dict_encode_ex build that table for (8 MiB); above
 * it the encoder computes the dots per vector (the same codes). */
#define QF_KV_GRAM_D_MAX_ATOMS 1024

/* qf_kv_omp_ex reading those dots from gram_d (qf_kv_gram_d of d; NULL: computed as
 * qf_kv_omp_ex does): the same codes bit for bit, about 5x fewer sequential double sums a
 * vector at sparsity 8 (the learner's many passes over one dictionary). */
int qf_kv_omp_gd(const qf_kv_dict *d, const double *gram_d, const float *x, const float *alpha0, int s,
                 double tol, void *scratch, uint16_t *idx, float *coef);

/* qf_kv_int8_ec_dequantize of four rows of n bytes (q[r] into x[r]), their decoding interleaved:
 * the same values as four calls */
void qf_kv_int8_ec_dequantize4(const uint8_t *const q[4], int n, float *const x[4], int n_out);
/* qf_kv_int8_ec_dequantize one bit at a time (its reference: the same values for every row,
 * corrupt ones included; tests/test_kvrot.c) */
void qf_kv_int8_ec_dequantize_ref(const uint8_t *q, int n, float *x, int n_out);

#endif
