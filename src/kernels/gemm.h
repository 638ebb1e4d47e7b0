/* gemm.h: the integer prefill GEMM for Q8_0 / Q4_0 weights (docs/kernels.md, "int8 GEMM").
 *
 *   y[t][r] = sum over blocks b of  (d_w[r][b] * d_x[t][b]) * isum(r, t, b)      (f32, in block order)
 *
 * where the activations x[t] are quantized to Q8_0 exactly as the decode path (qf_quantize_row)
 * and isum is the exact integer dot of the block's quants. This is ggml's math for Q8_0/Q4_0
 * weights (llama.cpp quantizes activations to Q8_0 for these types too), done as a GEMM:
 * the weight rows are repacked per panel of QF_GEMM_NR rows so that one 512-bit VNNI
 * instruction (vpdpbusd) multiplies 4 quants of 16 rows by 4 quants of one token.
 *
 * The integer trick: vpdpbusd multiplies unsigned by signed bytes, so the weight side is made
 * unsigned (Q8_0: w + 128, i.e. w ^ 0x80; Q4_0: the raw nibble q, value q - 8) and the offset is
 * taken back through the activation's block sum: isum = sum u*x - off * sum x (off 128 or 8),
 * stored per activation block as `corr`. Exact in int32 for any block.
 *
 * qf_gemm_q8_rows_ref is the scalar oracle: the same sums in the same order with fmaf, so the
 * fast kernel is bit-identical to it (tests/test_quant.c), and the oracle itself is checked
 * against qf_vec_dot_ref (double-precision) within float rounding. */
#ifndef QF_KERNELS_GEMM_H
#define QF_KERNELS_GEMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qforge/quant.h"

#define QF_GEMM_NR 16 /* weight rows per panel (one zmm of int32 lanes) */

/* The instruction set the integer kernels use on this CPU, highest first: AVX-512 F/BW/VL + VNNI
 * (every kernel here), AVX-VNNI or AVX2 (the Q8_0/Q4_0/Q5_0 GEMM panels only: gemm_avx2.c), none
 * (no AVX2/FMA/F16C, or qf_quant_force_scalar). */
typedef enum { QF_GEMM_ISA_NONE = 0, QF_GEMM_ISA_AVX2 = 1, QF_GEMM_ISA_AVXVNNI = 2, QF_GEMM_ISA_AVX512 = 3 } qf_gemm_isa;
qf_gemm_isa qf_gemm_isa_get(void);
/* Tests: use at most `cap` (QF_GEMM_ISA_AVX512 restores the default). Capping below AVX512 turns
 * off the f16 and K-quant GEMMs, the AVX-512 decode dot and the decode matvec too (their callers
 * then take the dequantize + sgemm or vec_dot routes). Capping at AVXVNNI on a CPU with AVX-512
 * VNNI but no AVX-VNNI gives AVX2. Not thread-safe against running kernels. The environment
 * variable QF_GEMM_ISA=avx2|avxvnni caps it the same way for a whole process. */
void qf_gemm_cap_isa(qf_gemm_isa cap);

/* True when the fast integer GEMM exists for weight type t on this CPU (AVX2 at least, and
 * qf_quant_force_scalar off). Types: Q8_0, Q4_0, Q5_0 (unpacked per panel to bytes
 * q in [0, 31], value q - 16, offset 16). */
bool qf_gemm_q8_supported(qf_type t);
/* True for the types the oracle knows (Q8_0, Q4_0, Q5_0), whatever the CPU. */
bool qf_gemm_q8_type(qf_type t);

/* Bytes of one quantized activation row of K elements (K a multiple of 32): K int8 quants,
 * K/32 f32 scales, K/32 int32 corrections, padded to 64 bytes. */
size_t qf_gemm_act_stride(int64_t K);

/* The three parts of one activation row of K elements in that layout, for its readers: the int8
 * quants [K], the f32 block scales [K/32], the int32 block corrections [K/32]. */
typedef struct {
    const int8_t *qs;
    const float *d;
    const int32_t *corr;
} qf_gemm_act_row;
static inline qf_gemm_act_row qf_gemm_act_view(const uint8_t *row, int64_t K) {
    const qf_gemm_act_row v = {(const int8_t *)row, (const float *)(const void *)(row + K),
                               (const int32_t *)(const void *)(row + K + (K / 32) * 4)};
    return v;
}

/* Quantize rows [t0, t1) of x[.][K] (row stride K floats) for weight type wt into act (row stride
 * qf_gemm_act_stride(K)). tmp: scratch of at least qf_row_bytes(Q8_0, K) bytes. The quants are
 * qf_quantize_row(Q8_0)'s, bit for bit. */
void qf_gemm_quantize_act(qf_type wt, const float *x, int64_t K, int t0, int t1, uint8_t *act, void *tmp);

/* Scratch bytes qf_gemm_q8_rows needs for a tile of up to `rows` weight rows of length K. */
size_t qf_gemm_scratch_bytes(qf_type wt, int64_t K, int64_t rows);

/* y[t * ldy + r] for rows r in [r0, r1) and tokens t in [0, n): w points at weight row 0 (row
 * stride row_bytes), act at the n activation rows made by qf_gemm_quantize_act. scratch: at least
 * qf_gemm_scratch_bytes(wt, K, r1 - r0), 64-byte aligned. Only call when qf_gemm_q8_supported(wt). */
void qf_gemm_q8_rows(qf_type wt, const void *w, size_t row_bytes, int64_t K, int64_t r0, int64_t r1,
                     const uint8_t *act, int n, float *y, int64_t ldy, void *scratch);

/* The scalar oracle of qf_gemm_q8_rows (any CPU, no scratch): bit-identical results. */
void qf_gemm_q8_rows_ref(qf_type wt, const void *w, size_t row_bytes, int64_t K, int64_t r0, int64_t r1,
                         const uint8_t *act, int n, float *y, int64_t ldy);

/* ---- f16 weights x f32 activations ----
 * y[t * ldy + r] = sum_k f32(w[r][k]) * x[t][k] for rows [r0, r1) and tokens [0, n), x row stride K,
 * K a multiple of 16. The fast kernel (AVX-512, gemm_avx512.c) converts the rows once per K block of
 * QF_GEMM_F16_KB to f32 panels of 32 rows transposed to [k][row] (in scratch), then keeps 32 rows x
 * 12 tokens in 24 zmm accumulators (lanes over rows, x[t][k] broadcast): each (row, token) sums over
 * k in order in one f32 lane, through y between K blocks. It agrees with the oracle (double
 * precision) within float rounding, 1e-5 of sum|w*x|. scratch: qf_gemm_f16_scratch_bytes(r1 - r0),
 * 64-byte aligned (unused by the oracle). */
#ifndef QF_GEMM_F16_KB
#define QF_GEMM_F16_KB 256
#endif
#define QF_GEMM_F16_MR 32 /* rows per panel */
bool qf_gemm_f16_supported(void); /* AVX-512 F/BW/VL/VNNI (qf_gemm_isa_get() == AVX512) */
size_t qf_gemm_f16_scratch_bytes(int64_t rows);
void qf_gemm_f16_rows(const void *w, size_t row_bytes, int64_t K, int64_t r0, int64_t r1, const float *x, int n,
                      float *y, int64_t ldy, void *scratch);
void qf_gemm_f16_rows_ref(const void *w, size_t row_bytes, int64_t K, int64_t r0, int64_t r1, const float *x, int n,
                          float *y, int64_t ldy);

/* ---- Q4_K / Q6_K weights x Q8_K activations ----
 * The same idea for the K-quants, with ggml's Q8_K activations (as decode): the weight quants are
 * unpacked once per tile to unsigned bytes in element order (Q4_K: q in [0,15]; Q6_K: q in [0,63])
 * with their integer sub-block scales, and per 256-block
 *   Q4_K: y += (d_w*d_x) * sum_s sc_s * (q.x)_s  -  (dmin_w*d_x) * sum_s m_s * (sum x)_s   (sub-blocks of 32)
 *   Q6_K: y += (d_w*d_x) * sum_s sc_s * ((q.x)_s - 32 (sum x)_s)                         (sub-blocks of 16)
 * with exact int32 sums (the activation sums are Q8_K's bsums), one float conversion per block,
 * as ggml. qf_gemm_k_rows_ref is the bit-identical oracle. */
bool qf_gemm_k_type(qf_type t);      /* Q4_K, Q6_K */
bool qf_gemm_k_supported(qf_type t); /* and the CPU runs the fast kernel */
size_t qf_gemm_k_act_stride(int64_t K); /* K int8 + K/256 f32 scales + K/16 int32 sums, padded to 64 */
/* quantize rows [t0, t1) to Q8_K (qf_quantize_row's bits) in the layout above; tmp: qf_row_bytes(Q8_K, K) */
void qf_gemm_k_quantize_act(const float *x, int64_t K, int t0, int t1, uint8_t *act, void *tmp);
size_t qf_gemm_k_scratch_bytes(qf_type wt, int64_t K, int64_t rows);
void qf_gemm_k_rows(qf_type wt, const void *w, size_t row_bytes, int64_t K, int64_t r0, int64_t r1,
                    const uint8_t *act, int n, float *y, int64_t ldy, void *scratch);
void qf_gemm_k_rows_ref(qf_type wt, const void *w, size_t row_bytes, int64_t K, int64_t r0, int64_t r1,
                        const uint8_t *act, int n, float *y, int64_t ldy);
size_t qf_gemm_k_panel_bytes(qf_type wt, int64_t K);
void qf_gemm_k_pack_panel(qf_type wt, const void *w, size_t row_bytes, int64_t K, int64_t r, int nrows, uint8_t *panel);
void qf_gemm_k_panel_avx512(qf_type wt, const uint8_t *panel, int64_t K, const uint8_t *act, int t0, int t1,
                            float *y, int64_t ldy, int nrows);

/* ---- Q4_0 repacked into 16-row panels: the CPU's private copy of a Q4_0 weight (Q4X16) ----
 * The same GEMM (math and oracle above: y = sum over blocks of (d_w * d_x) * isum, block order,
 * fmaf) read from a copy of the weight rearranged once at load (engine/repack.c), so that decode
 * (n = 1..3) and prefill read one contiguous stream with 16 rows per 64-byte load and no packing:
 *   panel p = rows [16p, 16p + 16) (rows past N: zero quants, zero scales), K / 64 pairs of blocks,
 *   576 bytes a pair: the 32 f16 scales (block 2i's 16 rows, then block 2i + 1's), then block 2i's
 *   quants as [group g < 4][row < 16][the 4 qs bytes 4g..4g+3] (low nibbles: elements 4g..4g+3,
 *   high: 16+4g..16+4g+3; value nibble - 8), then block 2i + 1's.
 * That is exactly the GGUF bytes of the 16 rows, rearranged: K * 9 bytes a panel, no extra memory
 * per weight beyond the one copy. The activations are qf_gemm_quantize_act(QF_TYPE_Q4_0)'s. */
bool qf_gemm_q4x16_shape_ok(int64_t K, int64_t N); /* K a positive multiple of 64, N > 0 */
size_t qf_gemm_q4x16_bytes(int64_t K, int64_t N);   /* the whole repacked weight (64-byte multiple) */
/* Repack panels [p0, p1) of the Q4_0 weight w (N rows of row_bytes, K elements) into out (the
 * whole repacked weight's buffer; panel p at out + p * 9 * K). Any CPU; panels are independent. */
void qf_gemm_q4x16_pack(const void *w, size_t row_bytes, int64_t K, int64_t N, int64_t p0, int64_t p1, uint8_t *out);
/* True when the fast kernel runs (AVX-512 F/BW/VL/VNNI: qf_gemm_isa_get() == QF_GEMM_ISA_AVX512). */
bool qf_gemm_q4x16_supported(void);
/* y[t * ldy + r] for rows [r0, r1) (r0 a multiple of 16 unless the range is empty, r1 <= N) and tokens [0, n) from the repacked
 * weight wp (qf_gemm_q4x16_pack of all N rows) and act (qf_gemm_quantize_act rows, stride
 * qf_gemm_act_stride(K)). Bit-identical to qf_gemm_q8_rows_ref(QF_TYPE_Q4_0, ...) on the GGUF rows.
 * Without the fast kernel it runs the oracle below. */
void qf_gemm_q4x16_rows(const uint8_t *wp, int64_t K, int64_t r0, int64_t r1, const uint8_t *act, int n, float *y,
                        int64_t ldy);
/* The scalar oracle reading the repacked bytes: bit-identical to qf_gemm_q8_rows_ref on the GGUF rows. */
void qf_gemm_q4x16_rows_ref(const uint8_t *wp, int64_t K, int64_t r0, int64_t r1, const uint8_t *act, int n, float *y,
                            int64_t ldy);
/* internal: the AVX-512 kernel of one panel (gemm_avx512.c), tokens [t0, t1), the panel's first nrows rows */
void qf_gemm_q4x16_panel_avx512(const uint8_t *panel, int64_t K, const uint8_t *act, int t0, int t1, float *y,
                                int64_t ldy, int nrows);

/* internal: the AVX-512 VNNI panel kernel (gemm_avx512.c) and the panel packer (gemm.c) */
size_t qf_gemm_panel_bytes(qf_type wt, int64_t K);
void qf_gemm_pack_panel(qf_type wt, const void *w, size_t row_bytes, int64_t K, int64_t r, int nrows, uint8_t *panel);
void qf_gemm_quantize_act_avx512(qf_type wt, const float *x, int64_t K, int t0, int t1, uint8_t *act);
void qf_gemm_f16_rows_avx512(const void *w, size_t row_bytes, int64_t K, int64_t r0, int64_t r1, const float *x,
                             int n, float *y, int64_t ldy, void *scratch);
float qf_vec_dot_q8_avx512(qf_type t, int64_t n, const void *w, const void *x); /* Q8_0 / Q4_0 . Q8_0 */
void qf_gemm_panel_avx512(qf_type wt, const uint8_t *panel, int64_t K, const uint8_t *act, int t0, int t1,
                          float *y, int64_t ldy, int nrows);
/* the AVX2 and AVX-VNNI panel kernels of the same GEMM (gemm_avx2.c), bit-identical to the oracle */
void qf_gemm_panel_avx2(qf_type wt, const uint8_t *panel, int64_t K, const uint8_t *act, int t0, int t1, float *y,
                        int64_t ldy, int nrows);
void qf_gemm_panel_avxvnni(qf_type wt, const uint8_t *panel, int64_t K, const uint8_t *act, int t0, int t1, float *y,
                           int64_t ldy, int nrows);

#endif
