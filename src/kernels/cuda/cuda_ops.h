/* cuda_ops.h: single CUDA operations of the backend, exposed for tests/test_cuda.c, which
 * checks each one against the CPU scalar oracle. They are part of libqforge in every build
 * (cuda_loader.c forwards them to the plugin's table) and fail with QF_ERR_DEVICE when the
 * plugin or a GPU is missing. Every pointer argument is host memory; each call uploads its
 * inputs, runs the same kernel the forward pass runs and downloads the result. */
#ifndef QF_CUDA_OPS_H
#define QF_CUDA_OPS_H

#include "qforge/error.h"
#include "qforge/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* matmul routes */
typedef enum {
    QF_CUDA_MM_AUTO = 0,  /* what the forward pass picks for this n */
    QF_CUDA_MM_MATVEC,    /* fused dequantize + dot, f32 activations (decode, n <= 8) */
    QF_CUDA_MM_GEMM_F16,  /* dequantize to f16, cuBLAS f16 x f16 -> f32 accumulate (prefill) */
    QF_CUDA_MM_GEMM_F32,  /* dequantize to f32, cuBLAS sgemm (QF_CUDA_GEMM=f32) */
    QF_CUDA_MM_CANON      /* the canonical arithmetic (kernels/canon.h): the CPU canonical route's bits */
} qf_cuda_mm_route;

/* dst[rows][k] = dequantize(src) (src: rows of type t, k a multiple of the block size) */
qf_status qf_cuda_op_dequant(qf_type t, const void *src, int64_t rows, int64_t k, float *dst, qf_error *err);
/* y[n][w->ne1] = x[n][w->ne0] . W^T */
qf_status qf_cuda_op_matmul(const qf_weight *w, const float *x, int n, float *y, qf_cuda_mm_route route,
                            qf_error *err);
/* out[n][d] = RMSNorm(x) g; act 1: also the norm's fused q8_0 activation of out into xq (what
 * the decode step's int8 matvecs read) and the separate quantization launch's into xq_ref (each
 * ACT_Q_BYTES(n, d): int8 [n][d], f32 [n][d / 32], int32 [n][d / 32]; QF_ERR_DEVICE where the
 * norm does not write it, d % 32 != 0) */
qf_status qf_cuda_op_rmsnorm(const float *x, const float *g, int n, int d, float eps, float *out, int act, void *xq,
                             void *xq_ref, qf_error *err);
/* rotate in place: v[n][n_heads][head_dim], tables cs/sn [n][n_rot/2] */
qf_status qf_cuda_op_rope(float *v, int n, int n_heads, int head_dim, int n_rot, qf_rope_type type,
                          const float *cs, const float *sn, qf_error *err);
qf_status qf_cuda_op_silu_mul(const float *g, const float *u, size_t n, float *out, qf_error *err);
/* decode_topk's reduction (cuda_backend.h qf_gpu_topk) of one row of V logits: max, argmax,
 * non-finite count; temp > 0 the sum of expf((l - max) / temp) and the k largest (launch_topk) */
qf_status qf_cuda_op_topk(const float *logits, int V, float temp, int k, qf_gpu_topk *out, qf_error *err);
/* Causal GQA attention of n queries at positions [pos0, pos0+n) against a cache holding
 * positions [0, pos0+n): q[n][n_head][hd], k/v [pos0+n][n_head_kv][hd] (f32; stored in the
 * cache in `mode`: f32, f16, q8_0, q4_0), out[n][n_head][hd]. */
qf_status qf_cuda_op_attention(const float *q, const float *k, const float *v, int n, int pos0, int n_head,
                               int n_head_kv, int hd, qf_kv_mode mode, float *out, qf_error *err);
/* The same with the route chosen: flash = the tensor-core kernel prefill uses (f32, f16, q8_0
 * or q4_0 cache, read by the kernel and rounded to f16 in its tiles; head_dim <= 256; Q and P
 * rounded to f16, f32 accumulation), else the one-warp-per-(query, head) f32 kernel. */
qf_status qf_cuda_op_attention_route(const float *q, const float *k, const float *v, int n, int pos0, int n_head,
                                     int n_head_kv, int hd, qf_kv_mode mode, bool flash, float *out, qf_error *err);
/* The decode route: split-K ("flash decoding"), each query's keys cut into ranges attended to
 * in parallel and merged by their softmax maxima and sums (f32 caches of any plain mode). */
qf_status qf_cuda_op_attention_split(const float *q, const float *k, const float *v, int n, int pos0, int n_head,
                                     int n_head_kv, int hd, qf_kv_mode mode, float *out, qf_error *err);
/* One token's decode attention as the decode step runs it, with the q|k|v split (bias, RoPE,
 * the K / V row write) and the o matvec's q8_0 activation folded into the attention kernels,
 * checked against the separate launches on the same row [q | k[pos0] | v[pos0]] (biases, RoPE
 * tables and pair order made up from pos0; hd % 32 == 0): QF_ERR_DEVICE names what differs by a
 * single bit (cache rows, output, activation). mode: f16, q8_0 or q4_0: k_attn_one over short
 * caches (at most 512 keys at head_dim 64, 256 at 128), split-K past them, where a q8_0 / q4_0
 * cache's split stores the rows itself (launch_qkv_split_store); the separate launches are the
 * f32 split and the K|V write. rot QF_KV_ROT_HADAMARD (head_dim a power of two): --kv-rot folded
 * in too (into k_attn_one, or into the split and split-K's merge), against the split, one
 * rotation launch over K, V and q, the K|V write, the attention and the output's rotation. out:
 * the fused output. */
qf_status qf_cuda_op_attention_fused(const float *q, const float *k, const float *v, int pos0, int n_head, int n_head_kv,
                                     int hd, qf_kv_mode mode, qf_kv_rot rot, float *out, qf_error *err);

/* Write rows x hd floats into a GPU cache of `mode` and read them back: the stored bytes
 * (rows x row bytes, ggml layout) and their f32 values as the attention kernel sees them. */
qf_status qf_cuda_op_kv_roundtrip(qf_kv_mode mode, const float *x, int64_t rows, int hd, void *bytes, float *out,
                                  qf_error *err);
/* The same with a rotation: HADAMARD stores quantize(H x) (H the normalized Walsh-Hadamard
 * transform of hadamard.h, per row; hd a power of two) and out = H dequantize(stored), the
 * vectors attention sees up to quantization error. */
qf_status qf_cuda_op_kv_roundtrip_rot(qf_kv_mode mode, qf_kv_rot rot, const float *x, int64_t rows, int hd,
                                      void *bytes, float *out, qf_error *err);

/* kv-int8: quantize rows x dkv floats (dkv = heads x hd) in row layout `layout` (engine.h
 * qf_kv_int8_layout: 0 static, 1 static-rot, 2 token-rot, 3 token, 4 ec-rot) with inv (dkv reciprocal
 * scales, one per channel; static layouts) as the GPU cache writes them, and expand them with
 * scale: the stored bytes and the f32 values attention sees. */
qf_status qf_cuda_op_kv_int8_roundtrip(const float *x, int64_t rows, int dkv, int hd, int layout, const float *scale,
                                       const float *inv, int8_t *bytes, float *out, qf_error *err);
/* decode gate|up with SiLU fused: w is the [2F][K] gate|up weight (gate rows first); hb[n][F] =
 * SiLU(x . gate^T) * (x . up^T), the decode route's kernel; QF_ERR_DEVICE where the fused kernel
 * does not apply (2F < 8192, or a type other than f16, bf16, q4_0, q8_0) */
qf_status qf_cuda_op_matvec_gu(const qf_weight *w, const float *x, int n, int F, float *hb, qf_error *err);
/* kv-dict: encode rows x [rows][hd] against unit-norm atoms [n_atoms][hd] and their Gram
 * matrix [n_atoms][n_atoms] into v1 codes of rb bytes, as the GPU cache writes them (the host's
 * qf_kv_omp_one + qf_kv_code_pack bytes, given kv.h's stopping constants stop_corr and
 * stop_pivot); QF_ERR_DEVICE where the encoder's scratch does not fit. */
qf_status qf_cuda_op_kv_dict_encode(const float *x, int64_t rows, int hd, const float *atoms, const float *gram,
                                    int n_atoms, int sparsity, int coef_q8, size_t rb, double stop_corr,
                                    double stop_pivot, uint8_t *codes, qf_error *err);
/* kv-dict: decode rows packed codes of rb bytes (qf_kv_code_pack layout) against atoms
 * [n_atoms][hd] as the GPU cache reads them. */
qf_status qf_cuda_op_kv_dict_decode(const uint8_t *codes, int64_t rows, int hd, size_t rb, const float *atoms,
                                    int n_atoms, int sparsity, int coef_q8, float *out, qf_error *err);

/* Time cublasGemmEx y[M][N] = x[M][K] W[N][K]^T (f16 in, f32 accumulate): mean ms. flags: bit 0 =
 * f16 output (else f32), bit 1 = accumulate (beta = 1, f32 output), bit 2 = cold L2 (cycle
 * through 4 copies of W, as in a forward pass where the weight was not just read). */
qf_status qf_cuda_bench_gemm(int M, int N, int K, int out_f16, int iters, double *ms, qf_error *err);

#ifdef __cplusplus
}
#endif
#endif
