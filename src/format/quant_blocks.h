/* quant_blocks.h: the one definition of every quantized block layout qforge reads or writes
 * (the ggml formats of GGUF weights and of the q8_0/q4_0 KV caches), for C and CUDA alike, as
 * ggml-common.h is for ggml. Halves are stored as raw uint16_t bits; every layout matches
 * ggml-common.h byte for byte, and each size is checked at compile time. Include this header
 * wherever a block is read, written or sized: never write 18/34/144 by hand. */
#ifndef QF_QUANT_BLOCKS_H
#define QF_QUANT_BLOCKS_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define QF_HD __host__ __device__
#define QF_STATIC_ASSERT(c, m) static_assert(c, m)
#else
#define QF_HD
#define QF_STATIC_ASSERT(c, m) _Static_assert(c, m)
#endif

#define QK 32    /* elements per block of the _0 formats */
#define QK_K 256 /* elements per super-block of the K formats */

typedef struct { uint16_t d; uint8_t qs[QK / 2]; } block_q4_0;
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[QK / 2]; } block_q5_0;
typedef struct { uint16_t d; int8_t qs[QK]; } block_q8_0;
/* Eight 32-element sub-blocks, each with a 6-bit scale and a 6-bit min packed into scales[12]. */
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[QK_K / 2]; } block_q4_K;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; } block_q5_K;
/* Sixteen 16-element sub-blocks with int8 scales; 4 low bits in ql, 2 high bits in qh. */
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d; } block_q6_K;
/* Activation side of the K dot products: bsums are the sums of each 16 quants, so the
 * weight's min/offset term costs one small dot product per block. */
typedef struct { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; } block_q8_K;

QF_STATIC_ASSERT(sizeof(block_q4_0) == 18, "q4_0 layout");
QF_STATIC_ASSERT(sizeof(block_q5_0) == 22, "q5_0 layout");
QF_STATIC_ASSERT(sizeof(block_q8_0) == 34, "q8_0 layout");
QF_STATIC_ASSERT(sizeof(block_q4_K) == 144, "q4_K layout");
QF_STATIC_ASSERT(sizeof(block_q5_K) == 176, "q5_K layout");
QF_STATIC_ASSERT(sizeof(block_q6_K) == 210, "q6_K layout");
QF_STATIC_ASSERT(sizeof(block_q8_K) == 292, "q8_K layout");

/* Q4_0 levels: element i (0..31) of a block is d * l_i with l_i = q_i - 8 in [-8, 7]; element
 * j < 16 is the low nibble of qs[j], element j + 16 its high nibble. */
QF_HD static inline int qf_q4_0_level(const block_q4_0 *b, int i) {
    return i < QK / 2 ? (b->qs[i] & 0xF) - 8 : (b->qs[i - QK / 2] >> 4) - 8;
}
/* Store levels l[0..31] (each in [-8, 7]) and the f16 bits of d into b. */
QF_HD static inline void qf_q4_0_pack(block_q4_0 *b, uint16_t d, const int8_t *l) {
    b->d = d;
    for (int j = 0; j < QK / 2; j++) b->qs[j] = (uint8_t)((l[j] + 8) | ((l[j + QK / 2] + 8) << 4));
}

/* 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K block (ggml's get_scale_min_k4);
 * q = the block's scales[12]. */
QF_HD static inline void qf_k4_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}
/* All eight at once, qf_k4_scale_min for j = 0..7 with 32-bit masks (ggml's form, little-endian):
 * byte j of u[0..1] is scale j, byte j of u[2..3] min j. */
QF_HD static inline void qf_k4_scale_min_words(const uint8_t *q, uint32_t u[4]) {
    memcpy(u, q, 12);
    const uint32_t six = 0x3f3f3f3f, lo4 = 0x0f0f0f0f, top2 = 0x03030303;
    u[3] = ((u[2] >> 4) & lo4) | (((u[1] >> 6) & top2) << 4); /* mins 4..7 */
    const uint32_t mins03 = u[1] & six;
    u[1] = (u[2] & lo4) | (((u[0] >> 6) & top2) << 4); /* scales 4..7 */
    u[2] = mins03;
    u[0] &= six;
}
/* the same as byte arrays: sc[j], m[j] */
QF_HD static inline void qf_k4_scale_min_all(const uint8_t *q, uint8_t sc[8], uint8_t m[8]) {
    uint32_t u[4];
    qf_k4_scale_min_words(q, u);
    memcpy(sc, u, 8);
    memcpy(m, u + 2, 8);
}

/* ---- Q6_K regrouped for the GPU (G8) ----
 * A Q6_K row whose width is a multiple of 8 super-blocks is stored on the device in groups of
 * 8 super-blocks: their ql (8 x 128 bytes), then their qh (8 x 64), their scales (8 x 16), their
 * d (8 x 2): 1680 bytes a group, the same bytes as the GGUF row in another order (the row's
 * size is unchanged). Every field of every super-block is then 16-byte aligned (scales 8, d 2),
 * where a GGUF Q6_K super-block (210 bytes) allows only 2-byte loads. qf_q6k_at gives the four
 * fields of super-block b in either layout; qf_q6k_regroup writes the device layout. */
#define Q6KG_GROUP (8 * (int)sizeof(block_q6_K))
QF_STATIC_ASSERT(8 * sizeof(block_q6_K) == 8 * (128 + 64 + 16 + 2), "q6_K G8 group");
typedef struct {
    const uint8_t *ql, *qh;
    const int8_t *scales;
    const uint16_t *d;
} qf_q6k_fields;
QF_HD static inline qf_q6k_fields qf_q6k_at(const uint8_t *row, int64_t b, int g8) {
    qf_q6k_fields f;
    if (!g8) {
        const block_q6_K *blk = (const block_q6_K *)(const void *)row + b;
        f.ql = blk->ql, f.qh = blk->qh, f.scales = blk->scales, f.d = &blk->d;
    } else {
        const uint8_t *gp = row + (size_t)(b >> 3) * Q6KG_GROUP;
        const int j = (int)(b & 7);
        f.ql = gp + 128 * j, f.qh = gp + 8 * 128 + 64 * j, f.scales = (const int8_t *)(gp + 8 * 192 + 16 * j);
        f.d = (const uint16_t *)(const void *)(gp + 8 * 208) + j;
    }
    return f;
}
/* does a Q6_K row of k elements take the G8 layout (whole groups) */
QF_HD static inline int qf_q6k_g8_ok(int64_t k) { return k % (8 * QK_K) == 0; }
/* GGUF Q6_K rows -> G8 rows (rows of k elements, qf_q6k_g8_ok(k)) */
static inline void qf_q6k_regroup(const uint8_t *src, uint8_t *dst, int64_t rows, int64_t k) {
    const int64_t nb = k / QK_K;
    const size_t rb = (size_t)nb * sizeof(block_q6_K);
    for (int64_t r = 0; r < rows; r++) {
        const block_q6_K *b = (const block_q6_K *)(const void *)(src + (size_t)r * rb);
        uint8_t *o = dst + (size_t)r * rb;
        for (int64_t g = 0; g < nb / 8; g++, o += Q6KG_GROUP)
            for (int j = 0; j < 8; j++) {
                const block_q6_K *x = b + 8 * g + j;
                memcpy(o + 128 * j, x->ql, 128);
                memcpy(o + 8 * 128 + 64 * j, x->qh, 64);
                memcpy(o + 8 * 192 + 16 * j, x->scales, 16);
                memcpy(o + 8 * 208 + 2 * j, &x->d, 2);
            }
    }
}

/* Quarter j (0..3) of super-block b of a Q4_K (q6 = 0) or Q6_K (q6 = 1; 2: the G8 layout) row,
 * unpacked for the integer GEMMs (gemm.c through qf_k_unpack, cuda_canon.cu's k_canon_gemm_k): q[0..63] = the
 * unsigned quants of elements 64 j .. 64 j + 63 (Q4_K 0..15; Q6_K 0..63, value q - 32). */
QF_HD static inline void qf_k_unpack_quarter(int q6, const uint8_t *row, int64_t b, int j, uint8_t *q) {
    if (!q6) {
        const uint8_t *qs = ((const block_q4_K *)(const void *)row + b)->qs + 32 * j;
        for (int l = 0; l < 32; l++) q[l] = qs[l] & 0xF, q[32 + l] = qs[l] >> 4;
    } else {
        const qf_q6k_fields f = qf_q6k_at(row, b, q6 == 2);
        const uint8_t *ql = f.ql + 64 * (j / 2), *qh = f.qh + 32 * (j / 2);
        if (j % 2 == 0)
            for (int l = 0; l < 32; l++) {
                q[l] = (uint8_t)((ql[l] & 0xF) | ((qh[l] & 3) << 4));
                q[l + 32] = (uint8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
            }
        else
            for (int l = 0; l < 32; l++) {
                q[l] = (uint8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
                q[l + 32] = (uint8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
            }
    }
}
/* The scales of super-block b (q6 as above): sc the sub-block scales (8 of 32 elements, or 16 of 16), mn
 * Q4_K's 8 mins (untouched for Q6_K), *d / *dmin the f16 bits of the super-block scales (dmin
 * 0 for Q6_K). */
QF_HD static inline void qf_k_unpack_scales(int q6, const uint8_t *row, int64_t b, int32_t *sc, int32_t *mn, uint16_t *d,
                                            uint16_t *dmin) {
    if (!q6) {
        const block_q4_K *blk = (const block_q4_K *)(const void *)row + b;
        for (int s = 0; s < 8; s++) {
            uint8_t a, m;
            qf_k4_scale_min(s, blk->scales, &a, &m);
            sc[s] = a, mn[s] = m;
        }
        *d = blk->d, *dmin = blk->dmin;
    } else {
        const qf_q6k_fields f = qf_q6k_at(row, b, q6 == 2);
        for (int s = 0; s < 16; s++) sc[s] = f.scales[s];
        *d = *f.d, *dmin = 0;
    }
}
/* Super-block b of a Q4_K (q6 = 0) or Q6_K (q6 = 1) row unpacked for the integer GEMMs (CPU
 * gemm.c): q[256] the unsigned quants in element order (the four quarters), and the scales
 * (qf_k_unpack_scales). */
QF_HD static inline void qf_k_unpack(int q6, const uint8_t *row, int64_t b, uint8_t *q, int32_t *sc, int32_t *mn,
                                     uint16_t *d, uint16_t *dmin) {
    for (int j = 0; j < 4; j++) qf_k_unpack_quarter(q6, row, b, j, q + 64 * j);
    qf_k_unpack_scales(q6, row, b, sc, mn, d, dmin);
}

#endif
