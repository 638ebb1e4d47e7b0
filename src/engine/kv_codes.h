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

/* The s = f->sparsity slots of one packed code (qf_kv_fmt_pack's layout), parsed: slot j's atom
 * index at idx[j * ld] and its coefficient at coef[j * ld] (ld 1: contiguous; the row length of a
 * slot-major table). A slot that qf_kv_fmt_decode skips (coefficient 0, or an index >= n_atoms,
 * the dictionary's size) gets index 0 and coefficient +0. qf_kv_fmt_decode is these slots' sum. */
void qf_kv_fmt_slots(const qf_kv_code_fmt *f, int n_atoms, const uint8_t *code, int32_t *idx, float *coef,
                     size_t ld);

/* qf_kv_fmt_slots of n codes, code r at code + r * stride, into column r of the table (slot j at
 * idx[j * ld + r], coef[j * ld + r]): the same values, the common layout (byte indices, f16
 * coefficients) parsed slot by slot without a call per code. */
void qf_kv_fmt_slots_rows(const qf_kv_code_fmt *f, int n_atoms, const uint8_t *code, size_t stride, int n,
                          int32_t *idx, float *coef, size_t ld);

/* qf_kv_int8_ec_dequantize of four rows of n bytes (q[r] into x[r]), their decoding interleaved:
 * the same values as four calls */
void qf_kv_int8_ec_dequantize4(const uint8_t *const q[4], int n, float *const x[4], int n_out);
/* qf_kv_int8_ec_dequantize one bit at a time (its reference: the same values for every row,
 * corrupt ones included; tests/test_kvrot.c) */
void qf_kv_int8_ec_dequantize_ref(const uint8_t *q, int n, float *x, int n_out);

#endif
