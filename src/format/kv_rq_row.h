/* kv_rq_row.h: the one definition of a kv-rq KV cache row (calibrated rotated quantization,
 * src/engine/kv_rq.c; docs/kv-rq.md). A row is the head_dim-long vector of one (layer, stream,
 * position, kv head), stored as
 *
 *   byte  0                          the row scale code c: s = 2^((c - 128) / 8), c = 0: s = 0
 *                                    (a 9% step over 2^-16 .. 2^15.9: qf_kv_rq_scale)
 *   bytes [1, 1 + head_dim*bits/8)   head_dim codes of `bits` bits each: code i occupies bits
 *                                    [i*bits, (i+1)*bits) of the little-endian bit stream
 *                                    (bit j of the stream = bit j%8 of byte j/8)
 *
 * and decodes to x = mean + cs (.) H(s * levels[code]) (H the normalized Walsh-Hadamard
 * transform, cs the signed channel scales, levels the Lloyd-Max codebook of the (layer,
 * stream, head)). bits is 1..6 (2-4 for most rows; 5-6 for the few (layer, stream) the
 * allocation finds most sensitive; 1 for the least sensitive at low budgets, payload format 2); QF_KV_RQ_BITS_F16 marks a (layer, stream) kept as plain
 * halves (head_dim * 2 bytes, no scale), used by the learner's sensitivity runs and allowed in
 * artifacts (it is counted as 16 bits per element). head_dim must be a power of two >= 8
 * (Hadamard; whole bytes for 3- and 5-bit codes). */
#ifndef QF_KV_RQ_ROW_H
#define QF_KV_RQ_ROW_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#define QF_KV_RQ_SCALE_BYTES 1  /* the log-coded row scale */
#define QF_KV_RQ_SCALE_STEPS 8  /* scale codes per octave */
#define QF_KV_RQ_MIN_BITS 1      /* 1-bit rows: format 2 and later (format 1 had 2..6) */
#define QF_KV_RQ_SENS_BITS 2     /* the width the learner measures sensitivity at */
#define QF_KV_RQ_MAX_BITS 6
#define QF_KV_RQ_BITS_F16 16    /* a (layer, stream) stored as plain halves */
#define QF_KV_RQ_MAX_LEVELS 64  /* 1 << QF_KV_RQ_MAX_BITS */
#define QF_KV_RQ_MIN_HEAD_DIM 8
#define QF_KV_RQ_MAX_HEAD_DIM 256

/* the row scale of scale code c */
static inline float qf_kv_rq_scale(uint8_t c) {
    return c ? exp2f((float)((int)c - 128) / QF_KV_RQ_SCALE_STEPS) : 0.0f;
}

/* the scale code just below s > 0 (the encoder tries it and the next one): floor(8 log2 s) + 128
 * in double, so that the CPU and the GPU encoder compute the same code (for a float s, 8 log2 s
 * lies within a double's rounding of an integer only at powers of two, where log2 is exact;
 * float log2f, used before, can differ in its last bit between libraries) */
static inline int qf_kv_rq_scale_floor(float s) {
    return (int)floor(log2((double)s) * QF_KV_RQ_SCALE_STEPS) + 128;
}

/* true for the bit widths a row may have */
static inline int qf_kv_rq_bits_ok(int bits) {
    return (bits >= QF_KV_RQ_MIN_BITS && bits <= QF_KV_RQ_MAX_BITS) || bits == QF_KV_RQ_BITS_F16;
}

/* bytes of one row (0 for a head_dim or bit width the format does not define) */
static inline size_t qf_kv_rq_row_bytes(int head_dim, int bits) {
    if (head_dim < QF_KV_RQ_MIN_HEAD_DIM || head_dim > QF_KV_RQ_MAX_HEAD_DIM || (head_dim & (head_dim - 1)) ||
        !qf_kv_rq_bits_ok(bits))
        return 0;
    if (bits == QF_KV_RQ_BITS_F16) return (size_t)head_dim * 2;
    return QF_KV_RQ_SCALE_BYTES + (size_t)head_dim * (size_t)bits / 8;
}

/* the sizes the format promises, at the two head sizes the demo models use */
_Static_assert(QF_KV_RQ_MAX_LEVELS == 1 << QF_KV_RQ_MAX_BITS, "kv-rq codebook size");
_Static_assert(QF_KV_RQ_SCALE_BYTES + 64 * 2 / 8 == 17, "kv-rq 2-bit row, head_dim 64");
_Static_assert(QF_KV_RQ_SCALE_BYTES + 64 * 3 / 8 == 25, "kv-rq 3-bit row, head_dim 64");
_Static_assert(QF_KV_RQ_SCALE_BYTES + 128 * 4 / 8 == 65, "kv-rq 4-bit row, head_dim 128");
_Static_assert(QF_KV_RQ_SCALE_BYTES + 64 * 5 / 8 == 41, "kv-rq 5-bit row, head_dim 64");
_Static_assert(QF_KV_RQ_MIN_HEAD_DIM * QF_KV_RQ_MIN_BITS % 8 == 0 && QF_KV_RQ_MIN_HEAD_DIM * 3 % 8 == 0 &&
                   QF_KV_RQ_MIN_HEAD_DIM * 5 % 8 == 0,
               "kv-rq codes fill whole bytes");

#endif
