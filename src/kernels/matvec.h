/* matvec.h: the decode matrix-vector product, y[r] = W[r] . x for one activation row, several
 * weight rows per step (docs/kernels.md, "Decode matvec").
 *
 * Decode reads every weight byte once per token and is bound by memory bandwidth when the
 * kernel keeps up; the per-row qf_vec_dot (quant.c) spends ~20 instructions per 64 Q4_0 weights
 * and runs below the bandwidth. Here the activation is prepared once per matmul in the layout
 * the kernel wants, and the weight rows are read straight from the GGUF bytes. (Q4_0 weights the
 * model has a repacked copy of go through gemm.h's Q4X16 panels instead, 1.8x faster in cache;
 * these kernels serve the rest: QF_NO_REPACK, shapes the repack does not take.)
 *
 *   Q4_0 (AVX-512 VNNI + VBMI): x quantized to Q8_0 exactly as qf_quantize_row, then per group of
 *     4 blocks [x quants of elements 0..15 of each block][16..31 of each][-8 * block sum, in the
 *     block's first int32 lane][d_x of each block, 4 lanes each] (256 bytes per 128 elements).
 *     Per group and row: two 64-byte loads of the 72 GGUF bytes, one vpermt2b gathers the 4 x 16
 *     quant bytes, one vpermb the 4 f16 scales (4 lanes each), two vpdpbusd (low and high
 *     nibbles, the -8 offset preloaded from the activation) and one FMA with d_w * d_x.
 *   F16 (AVX-512 F): x rounded to f16 and back (qf_vec_dot_type(F16) is F16: ggml's rounding),
 *     kept as f32 so only the weights are converted; 16-lane FMAs.
 *   Q4_K (AVX-512 VNNI): x quantized to Q8_K exactly as qf_quantize_row, then per 256-block (320
 *     bytes) the quants in the order of the weight's two 64-byte quant loads [sub-blocks 0|2][1|3]
 *     [4|6][5|7] (low nibbles of bytes 0-63: elements 0-31 and 64-95, ...), each sub-block's quant
 *     sum (int16 x 8) and d_x. Per block and row: two 64-byte loads, four vpdpbusd (one per nibble
 *     half), the integer sub-block scales spread over the lanes (vpshufb + vpmovzxbd) and applied
 *     by vpmulld, one FMA with d_w * d_x; the mins by one vpmaddwd against the quant sums.
 *   Q5_K: Q4_K's activation and kernel, the fifth bit of each quant ORed into the nibble vectors
 *     from the 32 qh bytes (bit s of qh[l] for sub-block s).
 *   Q6_K (AVX-512 VNNI): Q8_K quants in element order, then per 64 elements the -8 * (16-element
 *     quant sums) in each lane (the -32 offset of the 6-bit quants, preloaded as the vpdpbusd
 *     accumulator), d_x (576 bytes per block). Per half-block: one 64-byte load of the low
 *     nibbles, 32 bytes of high bits for two quarter pairs, two vpdpbusd, the signed int8 scales of
 *     the 16-element groups by vpmulld.
 * One weight row per step by default (matvec_avx512.c: MV_R, measured). Results equal qf_vec_dot_ref of the same row and the same
 * quantized activation up to float summation order (the integer sums are exact); the oracle,
 * qf_matvec_rows_ref, is exactly that per-row reference. */
#ifndef QF_KERNELS_MATVEC_H
#define QF_KERNELS_MATVEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qforge/quant.h"

/* True when the fast matvec exists for weight type wt and row length K on this CPU (Q4_0: AVX-512
 * F/BW/VL/VNNI + VBMI; F16, Q4_K, Q5_K, Q6_K: AVX-512 F/BW/VL/VNNI, the prefill GEMMs' requirement; K a
 * multiple of 128, 256 for the K formats) and qf_quant_force_scalar is off. */
bool qf_matvec_supported(qf_type wt, int64_t K);
/* AVX512_VBMI (cpuid leaf 7, ecx bit 1): vpermb / vpermt2b, for the Q4_0 kernel's and
 * qf_bits_lookup's byte permutes. The CPU's answer only: callers also check qf_gemm_isa_get. */
bool qf_cpu_has_vbmi(void);
/* Bytes of one prepared activation row for (wt, K) (64-byte multiple); 0 for an unsupported type. */
size_t qf_matvec_act_bytes(qf_type wt, int64_t K);
/* Prepare x[K] into act (qf_matvec_act_bytes, 64-byte aligned). Only when qf_matvec_supported. */
void qf_matvec_prepare(qf_type wt, const float *x, int64_t K, void *act);
/* y[r] = W[r] . x for rows r in [r0, r1): w points at weight row 0 (row stride row_bytes), act was
 * made by qf_matvec_prepare. Only when qf_matvec_supported(wt, K). */
void qf_matvec_rows(qf_type wt, const void *w, size_t row_bytes, int64_t K, int64_t r0, int64_t r1, const void *act,
                    float *y);
/* The oracle (any CPU, any type qf_vec_dot_ref knows): x quantized with qf_quantize_row_ref to
 * qf_vec_dot_type(wt), then y[r] = qf_vec_dot_ref per row. xq: scratch of qf_row_bytes(that type, K). */
void qf_matvec_rows_ref(qf_type wt, const void *w, size_t row_bytes, int64_t K, int64_t r0, int64_t r1, const float *x,
                        float *y, void *xq);

/* internal: the K formats' activation layouts (bytes of one 256-block, 64-byte multiples, and the
 * offsets in it; matvec.c writes them, matvec_avx512.c reads them) */
#define MV_K4_BLOCK 320 /* Q4_K / Q5_K: quants [0, 256), int16 sub-block sums [256, 272), d_x at 272 */
#define MV_K4_SUMS 256
#define MV_K4_DX 272
#define MV_K6_BLOCK 576 /* Q6_K: quants [0, 256), int32 offsets [256, 512), d_x at 512 */
#define MV_K6_CORR 256
#define MV_K6_DX 512

/* internal: the AVX-512 kernels (matvec_avx512.c) */
void qf_matvec_q4_0_avx512(const void *w, size_t row_bytes, int64_t K, int64_t r0, int64_t r1, const void *act, float *y);
void qf_matvec_f16_avx512(const void *w, size_t row_bytes, int64_t K, int64_t r0, int64_t r1, const void *act, float *y);
void qf_matvec_k_avx512(qf_type wt, const void *w, size_t row_bytes, int64_t K, int64_t r0, int64_t r1, const void *act,
                        float *y);

#endif
