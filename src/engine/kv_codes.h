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
/* qf_kv_int8_ec_dequantize of nr rows (16 or 32) of n bytes, row r at q + r * stride, into
 * x[r] (n_out floats each, n_out clamped to n): the same values as nr calls; writes nothing
 * else. Reads only the rows' n bytes. With AVX-512 (qf_kv_int8_ec16_fast) 16 rows decode side
 * by side, one SIMD lane each, 32 as two such groups whose chains interleave
 * (qf_kv_int8_ec_run16_avx512 / run32, then the scalar steps for what a lane left); otherwise,
 * or when (nr - 1) * stride + n exceeds INT32_MAX (the kernel's 32-bit gather offsets) or
 * n < 16, nr / 4 calls of qf_kv_int8_ec_dequantize4. */
void qf_kv_int8_ec_dequantize16(const uint8_t *q, size_t stride, int n, int nr, float *const *x, int n_out);
/* qf_kv_int8_ec_dequantize16 with the decoded elements stored in segments: element i of row r,
 * for skip <= i < n_out (n_out clamped to n), at x[r][(i - skip) / seg * sstride + (i - skip) % seg];
 * the elements before skip are decoded (a row's codes form one chain) but not stored. The same
 * values as qf_kv_int8_ec_dequantize_ref's elements; writes nothing else. Needs 0 <= skip,
 * seg >= 1, and n_out <= QF_KV_EC_SEG_MAX unless skip == 0 and n_out <= seg (x[r][i]). The
 * AVX-512 kernel stores straight into the segments where skip and seg are multiples of 16 (or
 * one segment, skip a multiple of 16); otherwise the rows go through scratch. The kv-int8 cache's
 * group rows (several kv heads in one row) go to their heads' f32 views this way, with no copy
 * (kv_cache.c ec_read: seg = head_dim, sstride = the views' head stride). */
#define QF_KV_EC_SEG_MAX 1024
void qf_kv_int8_ec_dequantize16_seg(const uint8_t *q, size_t stride, int n, int nr, float *const *x, int n_out, int skip,
                                    int seg, size_t sstride);
/* The rows' dot products with queries, without storing the rows (a one-query decode step's key
 * scores, kv_cache.c qf_kv_cache_int8_scores): nr rows (16 or 32) of n bytes at q + r * stride,
 * each cut into nseg segments of seg elements (nseg seg <= n, nseg seg <= QF_KV_EC_SEG_MAX);
 * segment k of row r against each of its nq queries (1 <= nq <= QF_KV_EC_DOT_MAXQ; query i of
 * segment k at qv + (k nq + i) qstride, seg floats): y[(k nq + i) ystride + r] = sum over e < seg
 * of row[k seg + e] * query[e], an f32 product then an f32 sum in order from 0 (the bits of
 * qf_vec_rows_dot over the decoded rows). Writes nothing else. The AVX-512 kernel
 * (qf_kv_int8_ec_dot16_avx512 / dot32) where qf_kv_int8_ec16_fast, seg % 16 == 0, n >= 16 and the
 * offsets fit 32 bits; rows it leaves (long tails, corrupt rows) and every row otherwise decoded
 * by the scalar decoder and summed by one chain. Oracle: qf_kv_int8_ec_dot_ref. */
#define QF_KV_EC_DOT_MAXQ 8
void qf_kv_int8_ec_dot16(const uint8_t *q, size_t stride, int n, int nr, int nseg, int seg, const float *qv, int nq,
                         size_t qstride, float *y, size_t ystride);
/* qf_kv_int8_ec_dot16's oracle for nr >= 1 rows: each row by qf_kv_int8_ec_dequantize_ref, then
 * one chain per (segment, query) */
void qf_kv_int8_ec_dot_ref(const uint8_t *q, size_t stride, int n, int nr, int nseg, int seg, const float *qv, int nq,
                           size_t qstride, float *y, size_t ystride);
/* whether qf_kv_int8_ec_dequantize16 runs the AVX-512 kernel: AVX-512 F/BW/VL/VNNI, the
 * kernels' level (qf_gemm_isa_get() == QF_GEMM_ISA_AVX512, so QF_GEMM_ISA / qf_gemm_cap_isa
 * and qf_quant_force_scalar turn it off too) */
bool qf_kv_int8_ec16_fast(void);
/* internal: one element of an ec row (q, n bytes; step d != 0) from bit *pos into *out, when
 * its code ends inside the row and inside the 64-bit window at its first byte: true and *pos
 * advanced past it; else false, nothing written. Exactly the decoder's fast step (the values of
 * qf_kv_int8_ec_dequantize_ref); reads only q[0, n). The ec lookup table must have been built
 * (qf_kv_int8_ec_dequantize16 builds it before it calls the kernel). */
bool qf_kv_int8_ec_one(const uint8_t *q, int n, uint32_t *pos, float d, float *out);
/* internal: the AVX-512 kernel of qf_kv_int8_ec_dequantize16 (kv_codes_avx512.c). Rows r in
 * [0, 16) at q + r * stride, n bytes each (n >= 4, 15 * stride + n <= INT32_MAX). Each lane r
 * whose bit is set in `live` decodes its row's elements 0, 1, ... from bit pos0 at step d[r]
 * (nonzero), all lanes at the same element per step, into x[r][i] for i < n_out (n_out <= n):
 * an element whose code ends inside the row and its 32-bit window in SIMD, one that ends
 * inside the row but past that window by qf_kv_int8_ec_one; the first element that fits
 * neither stops the lane: at[r] = its index, pos[r] = its first bit, and the caller finishes
 * the row from there (the reference's steps). A lane that decodes all n_out: at[r] = n_out.
 * Lanes not live get at[r] = n_out too. Element i >= skip goes to x[r][(i - skip) / seg *
 * sstride + (i - skip) % seg] (skip % 16 == 0, and seg % 16 == 0 or n_out - skip <= seg: a block
 * of 16 elements stays in one segment; skip 0, seg INT_MAX: x[r][i]); elements before skip are
 * not stored. Writes every such place of [skip, n_out); the values at and past at[r], and every
 * value of a lane not live, are unspecified (the caller writes them). Reads only the rows' n
 * bytes (the gather address is clamped to the row's last 4 bytes). */
void qf_kv_int8_ec_run16_avx512(const uint8_t *q, size_t stride, int n, const float d[16], unsigned live, uint32_t pos0,
                                int n_out, float *const x[16], int skip, int seg, size_t sstride, int at[16],
                                uint32_t pos[16]);
/* the same for 32 rows (q + r * stride, r < 32; 31 * stride + n <= INT32_MAX; live a 32-bit
 * mask): two groups of 16 lanes, one step of each per element, their chains interleaved */
void qf_kv_int8_ec_run32_avx512(const uint8_t *q, size_t stride, int n, const float d[32], uint32_t live, uint32_t pos0,
                                int n_out, float *const x[32], int skip, int seg, size_t sstride, int at[32],
                                uint32_t pos[32]);
/* internal: the dot kernels of qf_kv_int8_ec_dot16: as qf_kv_int8_ec_run16_avx512 / run32 (the
 * same lanes, at[] and pos[]), but no row is stored: for a lane that decodes all n_out elements
 * (n_out a multiple of seg, seg of 16), y[(k nq + i) ystride + r] = the dot product of segment k
 * (elements [k seg, (k + 1) seg)) with query i of it, qv + (k nq + i) qstride, for i < nq <=
 * QF_KV_EC_DOT_MAXQ; other lanes' y unspecified. */
void qf_kv_int8_ec_dot16_avx512(const uint8_t *q, size_t stride, int n, const float d[16], unsigned live, uint32_t pos0,
                                int n_out, int seg, const float *qv, int nq, size_t qstride, float *y, size_t ystride,
                                int at[16], uint32_t pos[16]);
void qf_kv_int8_ec_dot32_avx512(const uint8_t *q, size_t stride, int n, const float d[32], uint32_t live, uint32_t pos0,
                                int n_out, int seg, const float *qv, int nq, size_t qstride, float *y, size_t ystride,
                                int at[32], uint32_t pos[32]);
/* The rows' weighted sums, without storing the rows (a one-query decode step's V, kv_cache.c
 * qf_kv_cache_int8_vsum): nr rows (16 or 32) of n bytes at q + r * stride, each cut into nseg
 * segments of seg elements (nseg seg <= n, nseg seg <= QF_KV_EC_SEG_MAX); segment k of row r
 * weighted by each of its nq weights (1 <= nq <= QF_KV_EC_DOT_MAXQ; weight i of segment k of row
 * r at w[(k nq + i) wstride + r]) and added to the sums of (k, i): with the AVX-512 kernel
 * (qf_kv_int8_ec16_fast, seg % 16 == 0, n >= 16, offsets within 32 bits) into the lane sums
 * acc[((k nq + i) seg + e) 16 + lane] (64-byte aligned; row r in lane r % 16, an f32 fused
 * multiply-add per row in row order), the rows the kernel leaves and every row otherwise into
 * y[(k nq + i) ystride + e] directly (a product then a sum, rows in order). Fold acc into y with
 * qf_kv_int8_ec_wsum_fold. Oracle: qf_kv_int8_ec_wsum_ref (the same sums up to the order). */
void qf_kv_int8_ec_wsum16(const uint8_t *q, size_t stride, int n, int nr, int nseg, int seg, const float *w, int nq,
                          size_t wstride, float *acc, float *y, size_t ystride);
/* y[(k nq + i) ystride + e] += the 16 lane sums of acc (lanes in order), and acc zeroed */
void qf_kv_int8_ec_wsum_fold(float *acc, int nseg, int seg, int nq, float *y, size_t ystride);
/* qf_kv_int8_ec_wsum16's oracle for nr >= 1 rows: each row by qf_kv_int8_ec_dequantize_ref, then
 * y[(k nq + i) ystride + e] += weight * element, rows in order (no lane sums) */
void qf_kv_int8_ec_wsum_ref(const uint8_t *q, size_t stride, int n, int nr, int nseg, int seg, const float *w, int nq,
                            size_t wstride, float *y, size_t ystride);
/* internal: the weighted-sum kernels of qf_kv_int8_ec_wsum16 (the lanes of run16 / run32; the
 * lanes' sums to acc for the elements before at[r]) */
void qf_kv_int8_ec_wsum16_avx512(const uint8_t *q, size_t stride, int n, const float d[16], unsigned live, uint32_t pos0,
                                 int n_out, int seg, const float *w, int nq, size_t wstride, float *acc, int at[16],
                                 uint32_t pos[16]);
void qf_kv_int8_ec_wsum32_avx512(const uint8_t *q, size_t stride, int n, const float d[32], uint32_t live, uint32_t pos0,
                                 int n_out, int seg, const float *w, int nq, size_t wstride, float *acc, int at[32],
                                 uint32_t pos[32]);
/* qf_kv_int8_ec_dequantize one bit at a time (its reference: the same values for every row,
 * corrupt ones included; tests/test_kvrot.c) */
void qf_kv_int8_ec_dequantize_ref(const uint8_t *q, int n, float *x, int n_out);

#endif
