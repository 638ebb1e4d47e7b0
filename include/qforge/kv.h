/* qforge/kv.h: the engine's KV codecs: the sparse-dictionary code format the kv-dict cache
 * stores (dictionary, OMP encoder, code layouts) and the kv-int8 row quantizer.
 *
 * This is an engine-level header (src/engine/kv_codes.c implements it): the KV cache stores
 * and reads these formats at inference time, and the forge's learners (qforge/kvlearn.h)
 * call the SAME functions to measure what they learn, so what a learner measures is what the
 * cache stores. It includes nothing from the forge.
 *
 * Encoder thresholds (one set, used by the cache and by every learner measurement):
 *   - OMP stops when max_a |<atom_a, r>| <= 1e-6 * ||x|| (below the float noise of the
 *     correlations: the residual is zero), when the best atom is already selected (round-off),
 *     when the new atom's Cholesky pivot 1 - |L^-1 G_I,a|^2 is <= 1e-10 (the atom is in the
 *     span of the selected ones; the Cholesky factor is built from exact double dot products,
 *     so an exactly sparse signal is recovered to ~1e-12), or, with an error bound tol > 0,
 *     as soon as ||r||^2 <= tol^2 * ||x||^2 (error-bounded OMP: the sparsity is chosen per
 *     vector up to the cap).
 *   - A zero or non-finite vector encodes to nothing (every coefficient 0). */
#ifndef QFORGE_KV_H
#define QFORGE_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qforge/api.h"
#include "qforge/error.h"

#define QF_KV_MAX_ATOMS 4096 /* 12-bit indices; the Gram matrix is n_atoms^2 floats (64 MiB) */
#define QF_KV_MAX_SPARSITY 64
#define QF_KV_OMP_STOP_CORR 1e-6   /* relative correlation floor, see above */
#define QF_KV_OMP_STOP_PIVOT 1e-10 /* Cholesky pivot floor, see above */

/* A dictionary of unit-norm atoms and its Gram matrix. */
typedef struct {
    int head_dim;
    int n_atoms;
    float *atoms; /* [n_atoms][head_dim], each row unit norm */
    float *gram;  /* [n_atoms][n_atoms] = atoms * atoms^T (single-precision GEMM) */
} qf_kv_dict;

/* Build a dictionary from stored atoms (an artifact's, or a learner's): copies them,
 * re-normalises each to unit norm and computes the Gram matrix. The ONE validation of a
 * dictionary: QF_ERR_ARG for n_atoms outside 1..QF_KV_MAX_ATOMS or head_dim < 1,
 * QF_ERR_FORMAT for a zero or non-finite atom (the data is malformed), QF_ERR_NOMEM.
 * On failure *d is zeroed. */
QF_API qf_status qf_kv_dict_init(qf_kv_dict *d, const float *atoms, int n_atoms, int head_dim,
                          qf_error *err);
QF_API void qf_kv_dict_free(qf_kv_dict *d);
/* gram[n][n] = atoms * atoms^T (cblas_sgemm; deterministic for given inputs). */
QF_API void qf_kv_gram(const float *atoms, int n_atoms, int head_dim, float *gram);

/* ---- the encoder ---- */

/* Bytes of scratch qf_kv_omp_ex needs for n_atoms atoms and sparsity cap s (8-aligned). */
QF_API size_t qf_kv_omp_scratch_bytes(int n_atoms, int s);

/* Orthogonal matching pursuit of ONE vector x[head_dim]: at most s (<= QF_KV_MAX_SPARSITY)
 * atoms, stopping early by the rules at the top of this file; tol = 0 runs to s atoms (or a
 * zero residual). alpha0 is NULL (the encoder computes the correlations atoms * x itself:
 * this is what the cache does) or the caller's precomputed correlations (a batch fast path
 * for training only: a GEMM may round them differently in the last bit). Writes idx[s],
 * coef[s] (unused slots idx 0 / coef 0) and returns the atoms used. Deterministic; no
 * allocation; scratch is qf_kv_omp_scratch_bytes() bytes, 8-aligned. */
QF_API int qf_kv_omp_ex(const qf_kv_dict *d, const float *x, const float *alpha0, int s, double tol,
                 void *scratch, uint16_t *idx, float *coef);

/* ---- code storage: atom indices + coefficients in a fixed number of bytes ----
 * Layout of one code, s slots (the sparsity cap):
 *   indices  V1: s bytes when n_atoms <= 256, else s u16 little-endian;
 *            PACKED (v2): s indices of ceil(log2 n_atoms) bits each (12 for 4096 atoms),
 *            LSB-first bit stream, padded to whole bytes;
 *   coefficients  F16: s f16;  Q8: one f16 scale (max|coef| / 127) then s int8.
 * A slot whose coefficient is 0 is unused (error-bounded codes use fewer than s). */
typedef enum { QF_KV_COEF_F16 = 0, QF_KV_COEF_Q8 = 1 } qf_kv_coef;

typedef struct {
    int n_atoms, sparsity; /* sparsity = slots per code (the cap) */
    qf_kv_coef coef;
    bool packed; /* bit-packed indices (artifact payload version 2) */
} qf_kv_code_fmt;

QF_API const char *qf_kv_coef_name(qf_kv_coef f); /* "f16", "q8" */
QF_API int qf_kv_index_bits(int n_atoms);          /* ceil(log2 n_atoms), at least 1 */
QF_API size_t qf_kv_fmt_bytes(const qf_kv_code_fmt *f);
QF_API void qf_kv_fmt_pack(const qf_kv_code_fmt *f, const uint16_t *idx, const float *coef,
                    uint8_t *out);
/* Decode a packed code to head_dim floats; an index >= n_atoms decodes to nothing. The format's
 * sparsity is at most QF_KV_MAX_SPARSITY (asserted: the binds and learners refuse more). */
QF_API void qf_kv_fmt_decode(const qf_kv_code_fmt *f, const qf_kv_dict *d, const uint8_t *code,
                      float *out);

/* The V1 layout (u8/u16 indices), as the CUDA backend reads it. */
QF_API size_t qf_kv_code_bytes(int n_atoms, int s, qf_kv_coef f);
QF_API void qf_kv_code_pack(const uint16_t *idx, const float *coef, int s, int n_atoms, qf_kv_coef f,
                     uint8_t *out);
QF_API void qf_kv_code_decode(const qf_kv_dict *d, const uint8_t *code, int s, qf_kv_coef f,
                       float *out);
/* Information content of a code: s*ceil(log2 n_atoms) index bits + coefficient bits
 * (+16 for the q8 scale). Dictionary storage is amortised away, as at deployment scale. */
QF_API double qf_kv_code_bits(int n_atoms, int s, qf_kv_coef f);
/* Round coefficients in place to what the storage format keeps (for measuring error). */
QF_API void qf_kv_coef_round(float *coef, int s, qf_kv_coef f);
/* out[n][head_dim] = sum_j coef[j] * atom[idx[j]] (coef 0 or idx >= n_atoms: skipped). */
QF_API void qf_kv_dict_decode(const qf_kv_dict *d, const uint16_t *idx, const float *coef, int s,
                       int64_t n, float *out);

/* ---- kv-int8 row quantizer ---- */

/* inv[i] = 1 / scale[i] (0 for a zero scale): compute once, quantize with it per token. */
QF_API void qf_kv_int8_inv_scale(const float *scale, float *inv, int n);
/* q[i] = clamp(round(x[i] * inv_scale[i]), -127, 127), round half away from zero; NaN -> -127.
 * The engine calls these on a whole K or V row (n = n_kv_head * head_dim) per token. */
QF_API void qf_kv_int8_quantize(const float *x, const float *inv_scale, int8_t *q, int n);
QF_API void qf_kv_int8_dequantize(const int8_t *q, const float *scale, float *x, int n);
/* The per-row dynamic layout (kv-int8 "token"): one row of n elements (a multiple of 8, at
 * most 1024) as n int8 codes; the parities of 8 strided groups of codes carry the row's scale
 * exponent (s = 2^((e-176)/8)): exactly 8 bits per element, no static scale (kv_codes.c). */
QF_API void qf_kv_int8_token_quantize(const float *x, int8_t *q, int n);
QF_API void qf_kv_int8_token_dequantize(const int8_t *q, float *x, int n);
/* The entropy-coded layout (kv-int8 "ec-rot" on rotated rows): one row of n elements (a
 * multiple of 8 in [16, 1024]) in exactly n bytes: a 10-bit step exponent, then a prefix code
 * per element (magnitude, sign) designed for a Gaussian row; the encoder picks the finest step
 * whose codes fit (kv_codes.c has the bit layout). Non-finite elements encode as 0; a row that
 * is all zero (or all non-finite) decodes to zeros. Dequantize decodes the first n_out <= n
 * elements of an n-element row (the stream is sequential: element i needs the codes before
 * it). The decoder never reads past n bytes and decodes any byte string to finite values (a
 * corrupt tail decodes to zeros). */
QF_API void qf_kv_int8_ec_quantize(const float *x, uint8_t *q, int n);
QF_API void qf_kv_int8_ec_dequantize(const uint8_t *q, int n, float *x, int n_out);

#endif
