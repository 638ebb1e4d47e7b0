/* kv_rq_klt.h: the kv-rq format-3 row codec, transform coding with per-coordinate bit widths
 * (a KLT in the metric the attention sees instead of the Hadamard; docs/kv-rq.md "Format 3").
 *
 * One (layer, stream, kv head) has an encode matrix E [D][D] and a decode matrix F [D][D]
 * (F E = I: E = R^T M, F = M^-1 R, R the principal axes of M x, M the metric's square root),
 * per coordinate i a standard deviation sigma_i > 0, a width w_i in 0..6 and a Lloyd-Max
 * codebook of 2^w_i ascending levels in units of sigma_i. A row is
 *
 *   byte 0                        the row scale code (kv_rq_row.h: s = 2^((c - 128) / 8))
 *   bytes [1, 1 + sum(w_i) / 8)   the codes, coordinate i in bits [sum_{j<i} w_j, +w_i) of the
 *                                 little-endian bit stream (width-0 coordinates take no bits)
 *
 * and decodes to x = mean + F y, y_i = s sigma_i levels_i[code_i] (0 when w_i = 0: the
 * coordinate's calibration mean). sum(w_i) = bits * head_dim (whole bits: the size of a Hadamard
 * row of `bits` bits), or head_dim * e / 8 at a fractional rate (qf_kv_rq_any_row_bytes). */
#ifndef QF_ENGINE_KV_RQ_KLT_H
#define QF_ENGINE_KV_RQ_KLT_H

#include <stdbool.h>
#include <stdint.h>

#include "format/kv_rq_row.h"

#define QF_KV_RQ_KLT_MAX_WIDTH 6 /* per coordinate; levels use QF_KV_RQ_MAX_LEVELS slots */

/* Format 3 also allows fractional code rates: a layer's bit value 32 + e (e in 4..48) means e/8
 * code bits per element (row: scale byte + head_dim * e / 64 bytes); 1..6 mean whole bits and
 * QF_KV_RQ_BITS_F16 plain halves as in formats 1 and 2. */
#define QF_KV_RQ_KLT_EIGHTHS_BASE 32
#define QF_KV_RQ_KLT_MIN_EIGHTHS 4
#define QF_KV_RQ_KLT_MAX_EIGHTHS (8 * QF_KV_RQ_KLT_MAX_WIDTH)

/* code bits per element in eighths of a layer's bit value (0: f16 or not a code rate) */
static inline int qf_kv_rq_klt_eighths(int bits) {
    if (bits >= 1 && bits <= QF_KV_RQ_MAX_BITS) return 8 * bits;
    if (bits >= QF_KV_RQ_KLT_EIGHTHS_BASE + QF_KV_RQ_KLT_MIN_EIGHTHS && bits <= QF_KV_RQ_KLT_EIGHTHS_BASE + QF_KV_RQ_KLT_MAX_EIGHTHS)
        return bits - QF_KV_RQ_KLT_EIGHTHS_BASE;
    return 0;
}

/* bytes of one row for any bit value (qf_kv_rq_row_bytes, plus the fractional format-3 rates;
 * 0 when undefined, e.g. a fractional rate that does not fill whole bytes at this head_dim) */
static inline size_t qf_kv_rq_any_row_bytes(int head_dim, int bits) {
    if (bits > QF_KV_RQ_KLT_EIGHTHS_BASE) {
        int e = qf_kv_rq_klt_eighths(bits);
        if (!e || qf_kv_rq_row_bytes(head_dim, 2) == 0 || ((size_t)head_dim * e) % 64) return 0;
        return QF_KV_RQ_SCALE_BYTES + (size_t)head_dim * e / 64;
    }
    return qf_kv_rq_row_bytes(head_dim, bits);
}

/* One (layer, stream, head) of format 3: enc, dec [D][D] row-major (y = enc (x - mean),
 * x = mean + dec y), sigma [D] (finite, > 0), width [D] (0..QF_KV_RQ_KLT_MAX_WIDTH),
 * levels [D][QF_KV_RQ_MAX_LEVELS] (first 2^width ascending). decT, optional: dec transposed
 * (decT[j][i] = dec[i][j]), which the decoder then reads column by column: the same sums in the
 * same order, from contiguous memory. */
typedef struct {
    int head_dim;
    const float *mean, *enc, *dec, *sigma, *levels;
    const uint8_t *width;
    const float *decT;
} qf_kv_rq_klt;

/* Pack / unpack D codes of per-coordinate widths (stream layout above). dst gets
 * ceil(sum(width) / 8) bytes (zeroed first). */
void qf_kv_rq_klt_pack(const uint8_t *codes, const uint8_t *width, int n, uint8_t *dst);
void qf_kv_rq_klt_unpack(const uint8_t *src, const uint8_t *width, int n, uint8_t *codes);

/* Encode x[D] into one row (1 + sum(width)/8 bytes); scratch holds 2 * D floats. The row scale
 * starts at the rms of the standardized coordinates and is refined twice by weighted least
 * squares (weights sigma_i^2: the metric's error); of the two scale codes around it the one that
 * errs least is kept. Non-finite input encodes as a zero row (scale code 0: decodes to mean). */
void qf_kv_rq_klt_encode(const qf_kv_rq_klt *c, const float *x, float *scratch, uint8_t *row);
/* qf_kv_rq_klt_encode in two steps, the same bits: the transform z[D] = enc (x - mean) / sigma
 * (scratch: D floats) with ss = sum z_i^2 (false when x is not finite: z and ss unset), then the
 * row from it. The forge measures one row at several widths of the same transform. */
bool qf_kv_rq_klt_transform(const qf_kv_rq_klt *c, const float *x, float *scratch, float *z, double *ss);
void qf_kv_rq_klt_encode_z(const qf_kv_rq_klt *c, const float *z, double ss, bool finite, uint8_t *row);
/* y[i] = sum_j (double)A[i][j] * x[j] for the n rows of A [n][D], each sum in j order (the
 * products exact, one rounding per sum): qf_vec_rows_dot_f64 (kernels/vecmath.h), several rows
 * at a time in the AVX2 lanes, the same bits as one row at a time. */
void qf_kv_rq_klt_matvec(const float *A, const float *x, int n, int D, double *y);
/* Decode one row into out[D]. */
void qf_kv_rq_klt_decode(const qf_kv_rq_klt *c, const uint8_t *row, float *out);

/* Checks one head's parameters: 0 when valid, else a static reason ("width", "levels",
 * "sigma", "matrix", "bits"); total_bits: the widths must sum to it (bits * head_dim). */
const char *qf_kv_rq_klt_check(const qf_kv_rq_klt *c, int total_bits);

#endif
