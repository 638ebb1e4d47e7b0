/* kv_rq.h: the kv-rq row codec (calibrated rotated quantization of KV vectors; row layout in
 * src/format/kv_rq_row.h, method and numbers in docs/kv-rq.md).
 *
 * Encoding one row x[head_dim] of a (layer, stream, kv head):
 *   y = H((x - mean) (.) inv_cs)             centre, smooth channels (signed scales), rotate
 *   s = argmin_s |y - s levels[q(y/s)]|      per-row scale (two least-squares refinements
 *                                            starting at rms(y)), stored as a log code
 *                                            (the neighbour that errs least)
 *   code_i = nearest level to y_i / s        Lloyd-Max codebook of 2^bits levels
 * Decoding: x = mean + cs (.) H(s levels[code]) (H is its own inverse).
 * The learner (src/forge/learn_kv_rq.c) fits mean, cs and levels on the calibration split. */
#ifndef QF_ENGINE_KV_RQ_H
#define QF_ENGINE_KV_RQ_H

#include <stdint.h>

#include "engine/kv_rq_klt.h"
#include "format/kv_rq_row.h"
#include "qforge/error.h"

/* The parameters of one (layer, stream, kv head). For QF_KV_RQ_BITS_F16 only head_dim and
 * bits are read. levels: 2^bits values in ascending order; cs/inv_cs: signed, nonzero,
 * inv_cs[i] = 1 / cs[i]. */
typedef struct {
    int head_dim, bits;
    const float *levels, *mean, *cs, *inv_cs;
    qf_kv_rq_klt klt; /* format 3 (klt.enc != NULL): the row is a kv_rq_klt.h row instead (levels,
                         cs, inv_cs unused; klt.mean == mean) */
} qf_kv_rq_codec;

/* Pack n codes (each < 2^bits) into n*bits/8 bytes (n*bits a multiple of 8), the stream
 * layout of kv_rq_row.h; unpack is its inverse. */
void qf_kv_rq_pack(const uint8_t *codes, int n, int bits, uint8_t *dst);
void qf_kv_rq_unpack(const uint8_t *src, int n, int bits, uint8_t *codes);

/* Index of the level nearest to v (ties to the lower level); levels ascending, n >= 1: the first
 * level whose midpoint to the next, 0.5f * (l[k] + l[k + 1]), is >= v (n - 1 for NaN). The _ref
 * version is the plain binary search, the oracle of the branch-free one. */
int qf_kv_rq_nearest(const float *levels, int n, float v);
int qf_kv_rq_nearest_ref(const float *levels, int n, float v);

/* Encode x[head_dim] into one row of qf_kv_rq_row_bytes(head_dim, bits) bytes; scratch holds
 * 2 * head_dim floats. Non-finite inputs encode as a zero row (scale 0). */
void qf_kv_rq_encode(const qf_kv_rq_codec *c, const float *x, float *scratch, uint8_t *row);
/* Decode one row into out[head_dim]. */
void qf_kv_rq_decode(const qf_kv_rq_codec *c, const uint8_t *row, float *out);

/* Lloyd-Max: fit n_levels (2..64) ascending levels to the n values v (n >= n_levels,
 * finite) minimizing the squared error of nearest-level quantization; starts from the
 * quantiles, runs `iters` rounds. v is sorted in place (already sorted input is not re-sorted). QF_ERR_ARG on bad sizes or a
 * non-finite value, QF_ERR_NOMEM. */
qf_status qf_kv_rq_lloyd(float *v, int64_t n, int n_levels, int iters, float *levels, qf_error *err);

#endif
