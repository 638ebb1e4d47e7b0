/* kv_codes_avx512.c: the kv-int8 "ec" row decoder 16 rows at a time (AVX-512 F/BW/VL), one
 * row per SIMD lane: kv_codes.h's qf_kv_int8_ec_run16_avx512, dispatched at run time by
 * qf_kv_int8_ec_dequantize16 (kv_codes.c, which has the bit layout and the scalar decoder
 * that is its oracle). A row's elements form one serial chain (element i starts where i - 1
 * ends), so the scalar decoder waits on a load and a table lookup per element; here 16 rows'
 * chains move side by side: a gather of each lane's 32-bit window, then two elements from it
 * (two codes average ~16 bits) by the prefix code without a table lookup in memory (the unary
 * tail's ones counted through an int -> float conversion, no AVX512CD needed), their values
 * and the next bit position; 32 rows run as two such groups, interleaved.
 */
#include <immintrin.h>
#include <stdalign.h>
#include <string.h>

#include "engine/kv_codes.h"

/* v[j] (lane r: element j of row r) transposed in place: v[r] (lane j: element j of row r).
 * The usual three stages: 32-bit pairs, 64-bit pairs, then 128-bit lanes (twice). */
static inline void transpose16(__m512 v[16]) {
    __m512 t[16];
    for (int k = 0; k < 16; k += 2) {
        t[k] = _mm512_unpacklo_ps(v[k], v[k + 1]);
        t[k + 1] = _mm512_unpackhi_ps(v[k], v[k + 1]);
    }
    for (int k = 0; k < 16; k += 4) {
        v[k] = _mm512_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(1, 0, 1, 0));
        v[k + 1] = _mm512_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(3, 2, 3, 2));
        v[k + 2] = _mm512_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(1, 0, 1, 0));
        v[k + 3] = _mm512_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int k = 0; k < 4; k++) {
        t[k] = _mm512_shuffle_f32x4(v[k], v[k + 4], 0x88);
        t[k + 4] = _mm512_shuffle_f32x4(v[k], v[k + 4], 0xdd);
        t[k + 8] = _mm512_shuffle_f32x4(v[k + 8], v[k + 12], 0x88);
        t[k + 12] = _mm512_shuffle_f32x4(v[k + 8], v[k + 12], 0xdd);
    }
    for (int k = 0; k < 8; k++) {
        v[k] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0x88);
        v[k + 8] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0xdd);
    }
}

/* the prefix code's tables, by the code's first 3 bits (entries 8-15 repeat 0-7): h, the
 * prefix's bits, and whether the unary tail follows (all ones: -1); a tail's h and bits are 5
 * and 4 less the 127 of the float exponent its ones are counted in (ec_elem) */
typedef struct {
    __m512i th, tlen, ttail;
} ec_tabs;

/* one element per lane from the window w (its first bit at bit 0, the bits past the window's
 * valid ones zero) at step vd: the value (the reference's: (float)c * d, negated when the
 * sign bit is set) into *v; returns the prefix's bits (the code has 5 more). The prefix by its
 * first 3 bits (bit 0 read first): bit 0 = 0: h = bit 1, 2 bits; else h = 2 + bits 1-2, 3
 * bits; "111": h = 5 + the unary tail's ones, 4 + ones bits (with its zero). ones = trailing
 * zeros of ~(w >> 3) (nonzero: its top 3 bits are set): its lowest set bit ~s3 & (s3 + 1), a
 * power of two, converted to float exactly has exponent ones + 127. Then the 4 low bits of c
 * and the sign: bits 0-3 and 4 of t = w >> prefix. A code longer than the valid bits gives a
 * garbage value and a length the caller finds too long. */
static inline __attribute__((always_inline)) __m512i ec_elem(__m512i w, __m512 vd, const ec_tabs *tb, __m512 *v) {
    const __m512i s3 = _mm512_srli_epi32(w, 3);
    const __m512i low = _mm512_andnot_si512(s3, _mm512_add_epi32(s3, _mm512_set1_epi32(1)));
    const __m512i oe = _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(_mm512_cvtepu32_ps(low)), 23),
                                        _mm512_permutexvar_epi32(w, tb->ttail));
    const __m512i h = _mm512_add_epi32(_mm512_permutexvar_epi32(w, tb->th), oe);
    const __m512i plen = _mm512_add_epi32(_mm512_permutexvar_epi32(w, tb->tlen), oe);
    const __m512i t = _mm512_srlv_epi32(w, plen);
    const __m512i c = _mm512_ternarylogic_epi32(_mm512_slli_epi32(h, 4), t, _mm512_set1_epi32(15), 0xF8); /* h << 4 | (t & 15) */
    const __m512 a = _mm512_mul_ps(_mm512_cvtepi32_ps(c), vd);
    /* -a when the sign bit is set, without a branch: a ^ ((t << 27) & sign) */
    *v = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_castps_si512(a), _mm512_slli_epi32(t, 27),
                                                       _mm512_set1_epi32(INT32_MIN), 0x78));
    return plen;
}

/* the kernel for G groups of 16 lanes (rows r = 16 g + lane), their chains interleaved: see
 * qf_kv_int8_ec_run16_avx512 (kv_codes.h), here for 16 G rows, live a mask of 16 G bits. D (the
 * dot kernels, qf_kv_int8_ec_dot16_avx512): no x; each block of 16 elements, still one element a
 * register across the rows, goes into the rows' dot products with the block's segment's nq
 * queries (a product then a sum, in order: qf_vec_rows_dot's chain), stored to y at each
 * segment's end. One
 * gather serves two elements per lane (two codes average ~16 bits, the window has at least 25
 * valid bits): when every live lane's two fit and the block has room, both are taken; else only
 * the first (a lane whose first does not fit: qf_kv_int8_ec_one, or the lane stops). */
static inline __attribute__((always_inline)) void ec_run(const uint8_t *q, size_t stride, int n, const float *d,
                                                          uint32_t live, uint32_t pos0, int n_out, float *const *x,
                                                          int skip, int seg, size_t sstride, const float *qv, int nq,
                                                          size_t qstride, float *y, size_t ystride, int *at,
                                                          uint32_t *pos, const int G, const bool D, const bool W) {
    for (int r = 0; r < 16 * G; r++) at[r] = n_out, pos[r] = pos0;
    uint32_t act = G == 2 ? live : live & 0xffffu; /* the lanes still decoding in SIMD */
    if (n_out <= 0 || !act) return;
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i last = _mm512_set1_epi32(n - 4); /* the last 4-byte window inside the row */
    const __m512i five = _mm512_set1_epi32(5), w27 = _mm512_set1_epi32(27);
    const ec_tabs tb = {_mm512_setr_epi32(0, 2, 1, 3, 0, 4, 1, 5 - 127, 0, 2, 1, 3, 0, 4, 1, 5 - 127),
                        _mm512_setr_epi32(2, 3, 2, 3, 2, 3, 2, 4 - 127, 2, 3, 2, 3, 2, 3, 2, 4 - 127),
                        _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0, -1)};
    __m512i row[2], p[2];
    __m512 vd[2];
    for (int g = 0; g < G; g++) {
        row[g] = _mm512_mullo_epi32(_mm512_add_epi32(lane, _mm512_set1_epi32(16 * g)), _mm512_set1_epi32((int)stride));
        vd[g] = _mm512_loadu_ps(d + 16 * g);
        p[g] = _mm512_set1_epi32((int)pos0); /* each lane's next element's first bit */
    }
    alignas(64) float blk[2][17][16]; /* blk[g][j][lane]: element i0 + j of row 16 g + lane; row 16 spare */
    memset(blk, 0, sizeof blk);       /* a short block's transpose reads rows it did not write */
    __m512 acc[2][QF_KV_EC_DOT_MAXQ]; /* D: the dot products of the current segment, [g][query] */
    for (int i0 = 0; i0 < n_out && act; i0 += 16) {
        const int m = n_out - i0 < 16 ? n_out - i0 : 16;
        const uint32_t act0 = act; /* W: the lanes that take part in this block */
        int j = 0;
        while (j < m && act) {
            uint32_t bad1 = 0, bad2 = 0;
            __m512i np1[2], np2[2];
            for (int g = 0; g < G; g++) {
                /* the 4 bytes at the element's first byte, or the row's last 4 (then the shift is
                 * larger and fewer bits are valid: 32 - sh of them, the row's end among them) */
                const __m512i byte = _mm512_min_epi32(_mm512_srli_epi32(p[g], 3), last);
                const __m512i sh = _mm512_sub_epi32(p[g], _mm512_slli_epi32(byte, 3));
                const __m512i w = _mm512_srlv_epi32(_mm512_i32gather_epi32(_mm512_add_epi32(row[g], byte), q, 1), sh);
                __m512 v;
                const __m512i len1 = _mm512_add_epi32(ec_elem(w, vd[g], &tb, &v), five);
                _mm512_store_ps(blk[g][j], v);
                np1[g] = _mm512_add_epi32(p[g], len1);
                /* a code must end inside the window's valid bits (else a long tail, the row's end) */
                const __m512i sh2 = _mm512_add_epi32(sh, len1);
                bad1 |= (uint32_t)_mm512_cmpgt_epi32_mask(sh2, _mm512_set1_epi32(32)) << 16 * g;
                /* the next element from the same window */
                const __m512i plen2 = ec_elem(_mm512_srlv_epi32(w, len1), vd[g], &tb, &v);
                _mm512_store_ps(blk[g][j + 1], v);
                np2[g] = _mm512_add_epi32(np1[g], _mm512_add_epi32(plen2, five));
                bad2 |= (uint32_t)_mm512_cmpgt_epi32_mask(_mm512_add_epi32(plen2, sh2), w27) << 16 * g;
            }
            if (j + 1 < m && !((bad1 | bad2) & act)) { /* the common case: two elements */
                for (int g = 0; g < G; g++) p[g] = np2[g];
                j += 2;
                continue;
            }
            bad1 &= act; /* element j alone (element j + 1 is decoded again next) */
            if (bad1) { /* rare: from the 64-bit window (qf_kv_int8_ec_one), or the lane stops */
                alignas(64) uint32_t pb[2][16], pn[2][16];
                for (int g = 0; g < G; g++) _mm512_store_si512(pb[g], p[g]), _mm512_store_si512(pn[g], np1[g]);
                for (uint32_t b = bad1; b; b &= b - 1) {
                    const int r = __builtin_ctz(b), g = r >> 4, l = r & 15;
                    uint32_t pr = pb[g][l];
                    if (qf_kv_int8_ec_one(q + (size_t)r * stride, n, &pr, d[r], &blk[g][j][l])) pn[g][l] = pr;
                    else at[r] = i0 + j, pos[r] = pb[g][l], act &= ~(1u << r);
                }
                for (int g = 0; g < G; g++) np1[g] = _mm512_load_si512(pn[g]);
            }
            for (int g = 0; g < G; g++) p[g] = np1[g];
            j++;
        }
        if (W) { /* each live row's elements, weighted by its row's weight, into its lane's sums */
            for (uint32_t b = act0 & ~act; b; b &= b - 1) { /* lanes stopped in this block: from at[r] on, 0 */
                const int r = __builtin_ctz(b), g = r >> 4, l = r & 15;
                for (int e = at[r] - i0; e < j; e++) blk[g][e][l] = 0.0f;
            }
            const int k = i0 / seg, e0 = i0 % seg;
            for (int i = 0; i < nq; i++) {
                const float *wq = qv + (size_t)(k * nq + i) * qstride;
                __m512 wg[2];
                for (int g = 0; g < G; g++) wg[g] = _mm512_maskz_loadu_ps((__mmask16)(act0 >> 16 * g), wq + 16 * g);
                float *a = y + ((size_t)(k * nq + i) * (size_t)seg + (size_t)e0) * 16;
                for (int e = 0; e < j; e++) {
                    __m512 v = _mm512_load_ps(a + 16 * e);
                    for (int g = 0; g < G; g++) v = _mm512_fmadd_ps(_mm512_load_ps(blk[g][e]), wg[g], v);
                    _mm512_store_ps(a + 16 * e, v);
                }
            }
            continue;
        }
        if (D) { /* each row's dot products with its segment's queries, in order over the elements */
            const int k = i0 / seg, e0 = i0 % seg;
            if (e0 == 0)
                for (int g = 0; g < G; g++)
                    for (int i = 0; i < nq; i++) acc[g][i] = _mm512_setzero_ps();
            for (int i = 0; i < nq; i++) {
                const float *qq = qv + (size_t)(k * nq + i) * qstride + e0;
                for (int g = 0; g < G; g++)
                    for (int e = 0; e < j; e++)
                        acc[g][i] = _mm512_add_ps(acc[g][i], _mm512_mul_ps(_mm512_load_ps(blk[g][e]), _mm512_set1_ps(qq[e])));
            }
            if (e0 + 16 >= seg)
                for (int i = 0; i < nq; i++)
                    for (int g = 0; g < G; g++) _mm512_storeu_ps(y + (size_t)(k * nq + i) * ystride + 16 * g, acc[g][i]);
            continue;
        }
        /* elements [i0, i0 + j) of each row (lanes stopped or not live: unspecified values), at
         * their segment's place; a block before skip is not stored (skip % 16 == 0) */
        if (i0 < skip) continue;
        const __mmask16 mk = (__mmask16)((1u << j) - 1);
        const size_t off = (size_t)((i0 - skip) / seg) * sstride + (size_t)((i0 - skip) % seg);
        for (int g = 0; g < G; g++) {
            __m512 t[16];
            for (int k = 0; k < 16; k++) t[k] = _mm512_load_ps(blk[g][k]);
            transpose16(t);
            for (int l = 0; l < 16; l++) _mm512_mask_storeu_ps(x[16 * g + l] + off, mk, t[l]);
        }
    }
}

void qf_kv_int8_ec_run16_avx512(const uint8_t *q, size_t stride, int n, const float d[16], unsigned live, uint32_t pos0,
                                int n_out, float *const x[16], int skip, int seg, size_t sstride, int at[16],
                                uint32_t pos[16]) {
    ec_run(q, stride, n, d, live, pos0, n_out, x, skip, seg, sstride, NULL, 0, 0, NULL, 0, at, pos, 1, false, false);
}

void qf_kv_int8_ec_run32_avx512(const uint8_t *q, size_t stride, int n, const float d[32], uint32_t live, uint32_t pos0,
                                int n_out, float *const x[32], int skip, int seg, size_t sstride, int at[32],
                                uint32_t pos[32]) {
    ec_run(q, stride, n, d, live, pos0, n_out, x, skip, seg, sstride, NULL, 0, 0, NULL, 0, at, pos, 2, false, false);
}

void qf_kv_int8_ec_dot32_avx512(const uint8_t *q, size_t stride, int n, const float d[32], uint32_t live, uint32_t pos0,
                                int n_out, int seg, const float *qv, int nq, size_t qstride, float *y, size_t ystride,
                                int at[32], uint32_t pos[32]) {
    ec_run(q, stride, n, d, live, pos0, n_out, NULL, 0, seg, 0, qv, nq, qstride, y, ystride, at, pos, 2, true, false);
}

void qf_kv_int8_ec_dot16_avx512(const uint8_t *q, size_t stride, int n, const float d[16], unsigned live, uint32_t pos0,
                                int n_out, int seg, const float *qv, int nq, size_t qstride, float *y, size_t ystride,
                                int at[16], uint32_t pos[16]) {
    ec_run(q, stride, n, d, live, pos0, n_out, NULL, 0, seg, 0, qv, nq, qstride, y, ystride, at, pos, 1, true, false);
}

void qf_kv_int8_ec_wsum16_avx512(const uint8_t *q, size_t stride, int n, const float d[16], unsigned live, uint32_t pos0,
                                 int n_out, int seg, const float *w, int nq, size_t wstride, float *acc, int at[16],
                                 uint32_t pos[16]) {
    ec_run(q, stride, n, d, live, pos0, n_out, NULL, 0, seg, 0, w, nq, wstride, acc, 0, at, pos, 1, false, true);
}

void qf_kv_int8_ec_wsum32_avx512(const uint8_t *q, size_t stride, int n, const float d[32], uint32_t live, uint32_t pos0,
                                 int n_out, int seg, const float *w, int nq, size_t wstride, float *acc, int at[32],
                                 uint32_t pos[32]) {
    ec_run(q, stride, n, d, live, pos0, n_out, NULL, 0, seg, 0, w, nq, wstride, acc, 0, at, pos, 2, false, true);
}
