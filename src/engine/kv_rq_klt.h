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
 * coordinate's calibration mean). sum(w_i) = bits * head_dim, so a row has the same size as a
 * Hadamard row of `bits` bits (qf_kv_rq_row_bytes). */
#ifndef QF_ENGINE_KV_RQ_KLT_H
#define QF_ENGINE_KV_RQ_KLT_H

#include <stdint.h>

#include "format/kv_rq_row.h"

#define QF_KV_RQ_KLT_MAX_WIDTH 6 /* per coordinate; levels use QF_KV_RQ_MAX_LEVELS slots */

/* One (layer, stream, head) of format 3: enc, dec [D][D] row-major (y = enc (x - mean),
 * x = mean + dec y), sigma [D] (finite, > 0), width [D] (0..QF_KV_RQ_KLT_MAX_WIDTH),
 * levels [D][QF_KV_RQ_MAX_LEVELS] (first 2^width ascending). */
typedef struct {
    int head_dim;
    const float *mean, *enc, *dec, *sigma, *levels;
    const uint8_t *width;
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
/* Decode one row into out[D]. */
void qf_kv_rq_klt_decode(const qf_kv_rq_klt *c, const uint8_t *row, float *out);

/* Checks one head's parameters: 0 when valid, else a static reason ("width", "levels",
 * "sigma", "matrix", "bits"); total_bits: the widths must sum to it (bits * head_dim). */
const char *qf_kv_rq_klt_check(const qf_kv_rq_klt *c, int total_bits);

#endif
