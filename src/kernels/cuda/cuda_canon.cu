/* cuda_canon.cu: the canonical arithmetic on the GPU (kernels/canon.h; docs/gpu.md "Canonical
 * arithmetic"). Each kernel computes every output with the host's operations in the host's
 * order, one IEEE rounding each (the CN_ macros and __*_rn intrinsics keep nvcc from
 * contracting a * b + c): the forward pass of a canonical context gives the CPU's bits.
 *
 *   RMSNorm       one warp per row: lanes 0..7 the 8 double lane sums, then canon.h's combine
 *   GEMM q8       Q4_0 / Q8_0 / Q5_0 weights (and the Q4_0 G8 layout): the activation quantized
 *                 to q8_0 (k_quant_act, quant.c's bytes), per 32-block the exact integer dot
 *                 (__dp4a) and acc = fmaf((float)isum, dw * dx, acc), gemm.c's oracle
 *   GEMM K        Q4_K / Q6_K weights on Q8_K activations (k_quant_act_k), per 256-block
 *                 gemm.c's qf_gemm_k_rows_ref: integer sub-block sums, then one or two fmaf
 *   GEMM chain    any other type, dequantized by deq32 (quant.c's oracle): fmaf over k in order
 *   attention     scores (fmaf chain over d, times the scale), canon.h's softmax per row, the
 *                 weighted sum (fmaf chain over the query's keys) on f32 K/V rows
 *   RoPE, SiLU    canon.h's per-element functions
 *
 * The GEMM tiles keep 4 x 4 (K: 4 x 2) outputs per thread, each its own chain; tiles only
 * change which thread computes an output, never the order of its sums. */
#include "kernels/canon.h"
#include "kernels/cuda/cuda_common.cuh"

/* ---- RMSNorm ---- */

__global__ void k_canon_rmsnorm(const float *__restrict__ x, const float *__restrict__ g, int n, int d, float eps,
                                float *__restrict__ out) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= n) return;
    const float *xr = x + (size_t)row * d;
    const int full = d / 8 * 8;
    double L = 0.0;
    if (lane < 8)
        for (int i = lane; i < full; i += 8) L = __dadd_rn(L, (double)__fmul_rn(xr[i], xr[i]));
    double Ls[8];
#pragma unroll
    for (int j = 0; j < 8; j++) Ls[j] = __shfl_sync(0xffffffffu, L, j);
    double ss = qf_canon_lanes(Ls);
    for (int i = full; i < d; i++) ss = __dadd_rn(ss, (double)__fmul_rn(xr[i], xr[i]));
    const float scale = qf_canon_rms_scale(ss, d, eps);
    __syncwarp();
    for (int i = lane; i < d; i += 32) out[(size_t)row * d + i] = __fmul_rn(__fmul_rn(xr[i], scale), g[i]);
}

void launch_canon_rmsnorm(const float *x, const float *g, int n, int d, float eps, float *out, cudaStream_t s) {
    k_canon_rmsnorm<<<nblk((size_t)n, 8), 256, 0, s>>>(x, g, n, d, eps, out);
}

/* ---- RoPE and SiLU * up ---- */

__global__ void k_canon_rope(float *v, int n, int n_heads, int hd, int half, bool neox, const float *cs,
                             const float *sn) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)n * n_heads * half) return;
    const int p = (int)(i % half);
    const int64_t th = i / half; /* token * n_heads + head */
    const int t = (int)(th / n_heads);
    float *x = v + th * hd;
    const float c = cs[(size_t)t * half + p], s = sn[(size_t)t * half + p];
    if (neox) qf_canon_rope_pair(&x[p], &x[p + half], c, s);
    else qf_canon_rope_pair(&x[2 * p], &x[2 * p + 1], c, s);
}

void launch_canon_rope(float *v, int n, int n_heads, int hd, int half, bool neox, const float *cs, const float *sn,
                       cudaStream_t s) {
    k_canon_rope<<<nblk((size_t)n * n_heads * half, 256), 256, 0, s>>>(v, n, n_heads, hd, half, neox, cs, sn);
}

__global__ void k_canon_silu(float *g, const float *u, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = qf_canon_silu_mul(g[i], u[i]);
}

void launch_canon_silu(float *g, const float *u, size_t n, cudaStream_t s) {
    k_canon_silu<<<nblk(n, 256), 256, 0, s>>>(g, u, n);
}

/* ---- GEMMs ---- */

#define CG_BM 64 /* weight rows per block */
#define CG_BN 64 /* tokens per block (K GEMM: 32) */

/* the signed integer values of block b of a q8-family row (value / d) and the f32 of its scale */
template <int T> __device__ static inline float blk_ints(const uint8_t *row, int b, int8_t *v);
template <> __device__ inline float blk_ints<QF_TYPE_Q4_0>(const uint8_t *row, int b, int8_t *v) {
    const block_q4_0 *q = (const block_q4_0 *)row + b;
    for (int j = 0; j < 16; j++) v[j] = (int8_t)((q->qs[j] & 0xF) - 8), v[j + 16] = (int8_t)((q->qs[j] >> 4) - 8);
    return h2f_bits(q->d);
}
template <> __device__ inline float blk_ints<QFD_Q4_0G8>(const uint8_t *row, int b, int8_t *v) {
    const uint8_t *gp = row + (size_t)(b >> 3) * Q4G_GROUP, *qs = gp + 16 + 16 * (b & 7);
    for (int j = 0; j < 16; j++) v[j] = (int8_t)((qs[j] & 0xF) - 8), v[j + 16] = (int8_t)((qs[j] >> 4) - 8);
    return h2f_bits(((const uint16_t *)gp)[b & 7]);
}
template <> __device__ inline float blk_ints<QFD_Q8_0G8>(const uint8_t *row, int b, int8_t *v) {
    const uint8_t *gp = row + (size_t)(b >> 3) * Q8G_GROUP;
    const int8_t *qs = (const int8_t *)(gp + 16 + 32 * (b & 7));
    for (int j = 0; j < 32; j++) v[j] = qs[j];
    return h2f_bits(((const uint16_t *)gp)[b & 7]);
}
template <> __device__ inline float blk_ints<QF_TYPE_Q8_0>(const uint8_t *row, int b, int8_t *v) {
    const block_q8_0 *q = (const block_q8_0 *)row + b;
    for (int j = 0; j < 32; j++) v[j] = q->qs[j];
    return h2f_bits(q->d);
}
template <> __device__ inline float blk_ints<QF_TYPE_Q5_0>(const uint8_t *row, int b, int8_t *v) {
    const block_q5_0 *q = (const block_q5_0 *)row + b;
    const uint32_t qh = (uint32_t)q->qh[0] | ((uint32_t)q->qh[1] << 8) | ((uint32_t)q->qh[2] << 16) | ((uint32_t)q->qh[3] << 24);
    for (int j = 0; j < 16; j++) {
        v[j] = (int8_t)(((q->qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - 16);
        v[j + 16] = (int8_t)(((q->qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16);
    }
    return h2f_bits(q->d);
}

/* one token's activation block into shared memory: `bytes` quants from xq + at and the scale
 * xd[xi]; zeros past the last token */
__device__ static inline void load_act_block(int *dst, float *dx, const int8_t *xq, const float *xd, bool in, size_t at,
                                             size_t xi, int bytes) {
    if (in) {
        memcpy(dst, xq + at, bytes);
        *dx = xd[xi];
    } else {
        for (int w = 0; w < bytes / 4; w++) dst[w] = 0;
        *dx = 0.0f;
    }
}

/* a thread's NI x NJ outputs: rows r0.., tokens t0.. of y [n][N], those inside */
template <int NI, int NJ>
__device__ static inline void store_tile(const float (&acc)[NI][NJ], float *y, int r0, int t0, int N, int n) {
#pragma unroll
    for (int i = 0; i < NI; i++)
#pragma unroll
        for (int j = 0; j < NJ; j++)
            if (r0 + i < N && t0 + j < n) y[(size_t)(t0 + j) * N + r0 + i] = acc[i][j];
}

/* one block's integer dot products of a 16 x 8 tile: mma.sync m16n8k32 on int8, C = 0, so each
 * of d[0..3] is the exact int32 sum of 32 products (|sum| <= 32 * 127 * 128: no overflow), the
 * value __dp4a's chain computes */
__device__ static inline void mma_s8_16832(int *d, const int *a, int b0, int b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%10,%10,%10,%10};\n"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
#else
    (void)a, (void)b0, (void)b1;
    d[0] = d[1] = d[2] = d[3] = 0;
#endif
}

/* the same for 16 products: mma.sync m16n8k16 on int8 (Q6_K's sub-blocks) */
__device__ static inline void mma_s8_16816(int *d, const int *a, int b0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};\n"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(b0), "r"(0));
#else
    (void)a, (void)b0;
    d[0] = d[1] = d[2] = d[3] = 0;
#endif
}

/* y[t][r] (t < n, r < N, row stride N) = sum over blocks of fmaf((float)isum, dw * dx, acc):
 * 256 threads, 64 rows x 64 tokens; CG_KB blocks of K a shared-memory stage, each thread loading
 * one (row, block) of the weights and one (token, block) of the activation, then every output's
 * steps in block order (the oracle's order: a stage only changes when the data arrive).
 * sm_80 and later: warp w owns rows 16 (w % 4).. and tokens 32 (w / 4)..; a block's integer sums
 * of its four 16 x 8 tiles come from mma.sync (int8 in, exact int32 out) instead of eight __dp4a
 * a sum, and each output's float step is the same qf_canon_q8_step. Older GPUs: thread (tr, tt)
 * the rows 4 tr.. and tokens 4 tt.., __dp4a. Shared rows are padded to 36 ints so that the
 * fragment loads (8 rows x 4 words) hit 32 distinct banks. Against one block a stage (128
 * loading threads, two barriers a block), H200, 8B q4_0 shape, `qforge ppl --arith canonical
 * --chunks 8` 4.1-4.4 s against 6.3-6.5 s end to end, the same PPL bits (docs/gpu.md
 * "Session 20"). */
#define CG_KB 4
#define CG_PAD (CG_KB * 8 + 4)
template <int T>
__global__ void __launch_bounds__(256) k_canon_gemm_q8(const uint8_t *__restrict__ W, size_t rb, int K, int N,
                                                       const int8_t *__restrict__ xq, const float *__restrict__ xd,
                                                       int n, float *__restrict__ y) {
    static_assert(CG_BM * CG_KB == 256 && CG_BN * CG_KB == 256, "a (row, block) and a (token, block) a thread");
    __shared__ __align__(16) int sw[CG_BM][CG_PAD];
    __shared__ __align__(16) int sx[CG_BN][CG_PAD];
    __shared__ float sdw[CG_BM][CG_KB], sdx[CG_BN][CG_KB];
    const int tid = threadIdx.x, lr = tid / CG_KB, lk = tid % CG_KB;
    const int r0 = blockIdx.x * CG_BM, t0 = blockIdx.y * CG_BN, nb = K / 32;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const int lane = tid % 32, g = lane / 4, q = lane % 4, wr = (tid / 32) % 4 * 16, wt = (tid / 32) / 4 * 32;
#else
    const int tr = tid % 16, tt = tid / 16;
#endif
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    for (int b0 = 0; b0 < nb; b0 += CG_KB) {
        const int b = b0 + lk;
        {
            const int r = r0 + lr;
            int8_t v[32];
            float d = 0.0f;
            if (r < N && b < nb) d = blk_ints<T>(W + (size_t)r * rb, b, v);
            else
                for (int u = 0; u < 32; u++) v[u] = 0;
            memcpy(&sw[lr][lk * 8], v, 32);
            sdw[lr][lk] = d;
        }
        {
            const int t = t0 + lr;
            load_act_block(&sx[lr][lk * 8], &sdx[lr][lk], xq, xd, t < n && b < nb, (size_t)t * K + (size_t)b * 32,
                           (size_t)t * nb + b, 32);
        }
        __syncthreads();
        const int kn = nb - b0 < CG_KB ? nb - b0 : CG_KB;
        for (int kb = 0; kb < kn; kb++) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
            /* acc[j][c]: tile j (tokens wt + 8 j..), c = 0/1 row wr + g, c = 2/3 row wr + g + 8,
             * tokens wt + 8 j + 2 q + (c & 1) */
            const int a[4] = {sw[wr + g][kb * 8 + q], sw[wr + g + 8][kb * 8 + q], sw[wr + g][kb * 8 + 4 + q],
                              sw[wr + g + 8][kb * 8 + 4 + q]};
            const float dw0 = sdw[wr + g][kb], dw1 = sdw[wr + g + 8][kb];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int tok = wt + 8 * j;
                int d[4];
                mma_s8_16832(d, a, sx[tok + g][kb * 8 + q], sx[tok + g][kb * 8 + 4 + q]);
                const float dx0 = sdx[tok + 2 * q][kb], dx1 = sdx[tok + 2 * q + 1][kb];
                acc[j][0] = qf_canon_q8_step(acc[j][0], d[0], dw0, dx0);
                acc[j][1] = qf_canon_q8_step(acc[j][1], d[1], dw0, dx1);
                acc[j][2] = qf_canon_q8_step(acc[j][2], d[2], dw1, dx0);
                acc[j][3] = qf_canon_q8_step(acc[j][3], d[3], dw1, dx1);
            }
#else
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int *a = &sw[4 * tr + i][kb * 8], *c = &sx[4 * tt + j][kb * 8];
                    int isum = 0;
#pragma unroll
                    for (int w = 0; w < 8; w++) isum = __dp4a(a[w], c[w], isum);
                    acc[i][j] = qf_canon_q8_step(acc[i][j], isum, sdw[4 * tr + i][kb], sdx[4 * tt + j][kb]);
                }
#endif
        }
        __syncthreads();
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const int r = r0 + wr + g + (c >> 1) * 8, t = t0 + wt + 8 * j + 2 * q + (c & 1);
            if (r < N && t < n) y[(size_t)t * N + r] = acc[j][c];
        }
#else
    store_tile<4, 4>(acc, y, r0 + 4 * tr, t0 + 4 * tt, N, n);
#endif
}

#define CK_BN 32 /* the K GEMM's tokens per block */

/* the K GEMM: 64 rows x 32 tokens, one super-block a stage, every thread loading: thread (row
 * tid / 4, quarter tid % 4) unpacks 64 quants of the weights (the quarter-0 thread the row's
 * scales too), thread (token tid / 8, part tid % 8) 32 bytes of the activation and their
 * sub-block sums (Q8_K's bsums, once a stage instead of once an output). Each output's integer
 * sums and its two fmaf are those of gemm.c's qf_gemm_k_rows_ref, in the same order (the integer
 * sums are exact, so only the two fmaf have an order). sm_80 and later: warp w owns rows
 * 16 (w % 4).. and tokens 16 (w / 4)..; each sub-block's 16 x 8 tiles of integer sums come from
 * mma.sync (m16n8k32 for Q4_K's 32-element sub-blocks, m16n8k16 for Q6_K's 16) instead of __dp4a.
 * Older GPUs: thread (tr, tt) the rows 4 tr.. and tokens 2 tt.., __dp4a. Shared rows padded to 68
 * words (conflict-free fragments). Against one thread unpacking a row's whole super-block, H200,
 * 8B q4_k_m shape, `qforge ppl --arith canonical --chunks 8` 14.2-14.3 s against 23.7-23.8 s end
 * to end, the same PPL bits (docs/gpu.md "Session 21"). */
#define CK_PAD 68
template <int Q6>
__global__ void __launch_bounds__(256) k_canon_gemm_k(const uint8_t *__restrict__ W, size_t rb, int K, int N,
                                                      const int8_t *__restrict__ xq, const float *__restrict__ xd,
                                                      int n, float *__restrict__ y) {
    constexpr int NS = Q6 ? 16 : 8, SUB = 256 / NS;
    static_assert(CG_BM * 4 == 256 && CK_BN * 8 == 256, "a row quarter and a token part a thread");
    __shared__ __align__(16) int sw[CG_BM][CK_PAD];
    __shared__ __align__(16) int sx[CK_BN][CK_PAD];
    __shared__ int ssc[CG_BM][NS], smn[CG_BM][8], sxs[CK_BN][NS];
    __shared__ float sd[CG_BM], sdm[CG_BM], sdx[CK_BN];
    const int tid = threadIdx.x, lr = tid / 4, lq = tid % 4, lt = tid / 8, l8 = tid % 8;
    const int r0 = blockIdx.x * CG_BM, t0 = blockIdx.y * CK_BN, nb = K / 256;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    /* acc[j][c]: tile j (tokens wt + 8 j..), c = 0/1 row wr + g, c = 2/3 row wr + g + 8,
     * tokens wt + 8 j + 2 q + (c & 1) */
    const int lane = tid % 32, g = lane / 4, q = lane % 4, wr = (tid / 32) % 4 * 16, wt = (tid / 32) / 4 * 16;
    float acc[2][4];
#pragma unroll
    for (int j = 0; j < 2; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#else
    const int tr = tid % 16, tt = tid / 16;
    float acc[4][2];
#pragma unroll
    for (int i = 0; i < 4; i++) acc[i][0] = acc[i][1] = 0.0f;
#endif
    for (int b = 0; b < nb; b++) {
        {
            const int r = r0 + lr;
            __align__(16) uint8_t qv[64];
            if (r < N) qf_k_unpack_quarter(Q6, W + (size_t)r * rb, b, lq, qv);
            else
                for (int j = 0; j < 64; j++) qv[j] = 0;
            memcpy(&sw[lr][16 * lq], qv, 64);
            if (lq == 0) {
                int32_t sc[16] = {0}, mn[8] = {0};
                uint16_t dh = 0, mh = 0;
                if (r < N) qf_k_unpack_scales(Q6, W + (size_t)r * rb, b, sc, mn, &dh, &mh);
                for (int j = 0; j < NS; j++) ssc[lr][j] = sc[j];
                if (!Q6)
                    for (int j = 0; j < 8; j++) smn[lr][j] = mn[j];
                sd[lr] = h2f_bits(dh), sdm[lr] = Q6 ? 0.0f : h2f_bits(mh);
            }
        }
        {
            const int t = t0 + lt;
            int4 v[2] = {make_int4(0, 0, 0, 0), make_int4(0, 0, 0, 0)};
            if (t < n) {
                const int4 *p = (const int4 *)(xq + (size_t)t * K + (size_t)b * 256 + 32 * l8);
                v[0] = p[0], v[1] = p[1];
            }
            *(int4 *)&sx[lt][8 * l8] = v[0], *(int4 *)&sx[lt][8 * l8 + 4] = v[1];
            const int *wv = (const int *)v;
            int h[2] = {0, 0};
#pragma unroll
            for (int w = 0; w < 8; w++) h[w / 4] = __dp4a(0x01010101, wv[w], h[w / 4]);
            if (Q6) sxs[lt][2 * l8] = h[0], sxs[lt][2 * l8 + 1] = h[1];
            else sxs[lt][l8] = h[0] + h[1];
            if (l8 == 0) sdx[lt] = t < n ? xd[(size_t)t * (K / 32) + b] : 0.0f;
        }
        __syncthreads();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        int iacc[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}}, im[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
#pragma unroll
        for (int sb = 0; sb < NS; sb++) {
            constexpr int WS = SUB / 4; /* words a sub-block */
            const int sc0 = ssc[wr + g][sb], sc1 = ssc[wr + g + 8][sb];
            const int mn0 = Q6 ? 0 : smn[wr + g][sb], mn1 = Q6 ? 0 : smn[wr + g + 8][sb];
            int a[4];
            if (Q6) {
                a[0] = sw[wr + g][sb * WS + q], a[1] = sw[wr + g + 8][sb * WS + q];
            } else {
                a[0] = sw[wr + g][sb * WS + q], a[1] = sw[wr + g + 8][sb * WS + q];
                a[2] = sw[wr + g][sb * WS + 4 + q], a[3] = sw[wr + g + 8][sb * WS + 4 + q];
            }
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int tok = wt + 8 * j;
                int d[4];
                if (Q6) mma_s8_16816(d, a, sx[tok + g][sb * WS + q]);
                else mma_s8_16832(d, a, sx[tok + g][sb * WS + q], sx[tok + g][sb * WS + 4 + q]);
                const int xs0 = sxs[tok + 2 * q][sb], xs1 = sxs[tok + 2 * q + 1][sb];
                const int xs[4] = {xs0, xs1, xs0, xs1}, sc[4] = {sc0, sc0, sc1, sc1}, mn[4] = {mn0, mn0, mn1, mn1};
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    int is = d[c];
                    if (Q6) is -= 32 * xs[c];
                    else im[j][c] += mn[c] * xs[c];
                    iacc[j][c] += is * sc[c];
                }
            }
        }
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int rr = wr + g + (c >> 1) * 8, tk = wt + 8 * j + 2 * q + (c & 1);
                float v = __fmaf_rn((float)iacc[j][c], __fmul_rn(sd[rr], sdx[tk]), acc[j][c]);
                if (!Q6) v = __fmaf_rn(-(float)im[j][c], __fmul_rn(sdm[rr], sdx[tk]), v);
                acc[j][c] = v;
            }
#else
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int rr = 4 * tr + i, tk = 2 * tt + j;
                const int *a = sw[rr], *c = sx[tk];
                int iacc = 0, im = 0;
#pragma unroll
                for (int sb = 0; sb < NS; sb++) {
                    int is = 0;
#pragma unroll
                    for (int w = sb * SUB / 4; w < (sb + 1) * SUB / 4; w++) is = __dp4a(a[w], c[w], is);
                    const int xs = sxs[tk][sb];
                    if (Q6) is -= 32 * xs;
                    else im += smn[rr][sb] * xs;
                    iacc += is * ssc[rr][sb];
                }
                float v = __fmaf_rn((float)iacc, __fmul_rn(sd[rr], sdx[tk]), acc[i][j]);
                if (!Q6) v = __fmaf_rn(-(float)im, __fmul_rn(sdm[rr], sdx[tk]), v);
                acc[i][j] = v;
            }
#endif
        __syncthreads();
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#pragma unroll
    for (int j = 0; j < 2; j++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const int r = r0 + wr + g + (c >> 1) * 8, t = t0 + wt + 8 * j + 2 * q + (c & 1);
            if (r < N && t < n) y[(size_t)t * N + r] = acc[j][c];
        }
#else
    store_tile<4, 2>(acc, y, r0 + 4 * tr, t0 + 2 * tt, N, n);
#endif
}

/* the f32 chain over dequantized rows: 64 rows x 64 tokens, K in stages of CC_KB 32-blocks;
 * thread tid < 128 dequantizes block tid % 2 of row tid / 2 of the stage, the others load the
 * activation's (token, block); every output takes its fmaf over k in order. Against one block a
 * stage with half the threads loading, H200, 8B f16 shape, `qforge ppl --arith canonical
 * --chunks 8` 8.9-9.6 s against 12.1-12.6 s end to end, the same PPL bits. */
#define CC_KB 2
template <int T>
__global__ void __launch_bounds__(256) k_canon_gemm_chain(const uint8_t *__restrict__ W, size_t rb, int K, int N,
                                                          const float *__restrict__ x, int n, float *__restrict__ y) {
    static_assert(CG_BM * CC_KB == 128 && CG_BN * CC_KB == 128, "a (row, block) or a (token, block) a thread");
    __shared__ float sw[CG_BM][32 * CC_KB + 1], sx[CG_BN][32 * CC_KB + 1];
    const int tid = threadIdx.x, tr = tid % 16, tt = tid / 16, nb = K / 32;
    const int r0 = blockIdx.x * CG_BM, t0 = blockIdx.y * CG_BN;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    for (int b0 = 0; b0 < nb; b0 += CC_KB) {
        const int u = (tid % 128) / CC_KB, kb = tid % CC_KB, b = b0 + kb;
        float v[32];
        if (tid < 128) {
            const int r = r0 + u;
            if (r < N && b < nb) deq32<T>(W + (size_t)r * rb, b, v);
            else
                for (int j = 0; j < 32; j++) v[j] = 0.0f;
            for (int j = 0; j < 32; j++) sw[u][32 * kb + j] = v[j];
        } else {
            const int t = t0 + u;
            if (t < n && b < nb) {
                const float4 *p = (const float4 *)(x + (size_t)t * K + (size_t)b * 32);
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const float4 f = p[j];
                    v[4 * j] = f.x, v[4 * j + 1] = f.y, v[4 * j + 2] = f.z, v[4 * j + 3] = f.w;
                }
            } else
                for (int j = 0; j < 32; j++) v[j] = 0.0f;
            for (int j = 0; j < 32; j++) sx[u][32 * kb + j] = v[j];
        }
        __syncthreads();
        const int kn = 32 * (nb - b0 < CC_KB ? nb - b0 : CC_KB);
        for (int k = 0; k < kn; k++)
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = __fmaf_rn(sw[4 * tr + i][k], sx[4 * tt + j][k], acc[i][j]);
        __syncthreads();
    }
    store_tile<4, 4>(acc, y, r0 + 4 * tr, t0 + 4 * tt, N, n);
}

qf_status canon_matmul(const dweight *w, const float *x, int n, float *y, void *act, cudaStream_t s, qf_error *err) {
    const int K = (int)w->ne0, N = (int)w->ne1, T = dw_type(w);
    if (K % 32) return cu_fail(err, QF_ERR_DEVICE, "canonical GEMM: K = %d is not a multiple of 32", K);
    const act_q a = act_q_view(act, n, K);
    const dim3 grid(nblk((size_t)N, CG_BM), nblk((size_t)n, CG_BN));
    switch (T) {
    case QF_TYPE_Q4_0: case QFD_Q4_0G8: case QF_TYPE_Q8_0: case QFD_Q8_0G8: case QF_TYPE_Q5_0:
        launch_quant_act(x, n, K, act, s);
        if (T == QF_TYPE_Q4_0) k_canon_gemm_q8<QF_TYPE_Q4_0><<<grid, 256, 0, s>>>(w->d, w->row_bytes, K, N, a.qs, a.xd, n, y);
        else if (T == QFD_Q4_0G8) k_canon_gemm_q8<QFD_Q4_0G8><<<grid, 256, 0, s>>>(w->d, w->row_bytes, K, N, a.qs, a.xd, n, y);
        else if (T == QF_TYPE_Q8_0) k_canon_gemm_q8<QF_TYPE_Q8_0><<<grid, 256, 0, s>>>(w->d, w->row_bytes, K, N, a.qs, a.xd, n, y);
        else if (T == QFD_Q8_0G8) k_canon_gemm_q8<QFD_Q8_0G8><<<grid, 256, 0, s>>>(w->d, w->row_bytes, K, N, a.qs, a.xd, n, y);
        else k_canon_gemm_q8<QF_TYPE_Q5_0><<<grid, 256, 0, s>>>(w->d, w->row_bytes, K, N, a.qs, a.xd, n, y);
        break;
    case QF_TYPE_Q4_K: case QF_TYPE_Q6_K: case QFD_Q6_KG: {
        const dim3 gk(nblk((size_t)N, CG_BM), nblk((size_t)n, CK_BN));
        launch_quant_act_k(x, n, K, act, s);
        if (T == QF_TYPE_Q6_K) k_canon_gemm_k<1><<<gk, 256, 0, s>>>(w->d, w->row_bytes, K, N, a.qs, a.xd, n, y);
        else if (T == QFD_Q6_KG) k_canon_gemm_k<2><<<gk, 256, 0, s>>>(w->d, w->row_bytes, K, N, a.qs, a.xd, n, y);
        else k_canon_gemm_k<0><<<gk, 256, 0, s>>>(w->d, w->row_bytes, K, N, a.qs, a.xd, n, y);
        break;
    }
    default:
        QF_TYPE_DISPATCH(T, (cu_launch(k_canon_gemm_chain<TT>, grid, dim3(256), 0, s, (const uint8_t *)w->d, w->row_bytes, K,
                                       N, x, n, y)));
        break;
    }
    return QF_OK;
}

/* ---- attention over f32 K/V rows [pos][n_head_kv][hd] ----
 * S [n_head][n][T]: scores, then (in place) the probabilities of query i over keys [0, pos0 + i] */

#define CA_KT 32 /* keys per block */
#define CA_QT 8  /* queries per block */
__global__ void __launch_bounds__(128) k_canon_scores(const float *__restrict__ q, const float *__restrict__ K, int n,
                                                      int pos0, int T, int n_head, int nkv, int hd, float scale,
                                                      float *__restrict__ S) {
    extern __shared__ float sm[];
    float *ks = sm, *qs = sm + CA_KT * (hd + 1); /* [32][hd + 1], [8][hd] */
    const int h = blockIdx.z, kvh = h / (n_head / nkv), t0 = blockIdx.x * CA_KT, i0 = blockIdx.y * CA_QT;
    const int last = pos0 + (i0 + CA_QT < n ? i0 + CA_QT : n) - 1; /* the block's last query position */
    if (t0 > last) return;                                           /* keys no query of the block sees */
    for (int e = threadIdx.x; e < CA_KT * hd; e += blockDim.x) {
        const int kt = e / hd, d = e % hd, t = t0 + kt;
        ks[kt * (hd + 1) + d] = t < T ? K[((size_t)t * nkv + kvh) * hd + d] : 0.0f;
    }
    for (int e = threadIdx.x; e < CA_QT * hd; e += blockDim.x) {
        const int qi = e / hd, d = e % hd, i = i0 + qi;
        qs[qi * hd + d] = i < n ? q[((size_t)i * n_head + h) * hd + d] : 0.0f;
    }
    __syncthreads();
    const int kt = threadIdx.x % 32, qa = threadIdx.x / 32 * 2, t = t0 + kt;
    float a0 = 0.0f, a1 = 0.0f;
    const float *kr = ks + kt * (hd + 1), *q0 = qs + qa * hd, *q1 = q0 + hd;
    for (int d = 0; d < hd; d++) {
        a0 = __fmaf_rn(q0[d], kr[d], a0);
        a1 = __fmaf_rn(q1[d], kr[d], a1);
    }
    if (t < T) {
        if (i0 + qa < n) S[((size_t)h * n + i0 + qa) * T + t] = __fmul_rn(a0, scale);
        if (i0 + qa + 1 < n) S[((size_t)h * n + i0 + qa + 1) * T + t] = __fmul_rn(a1, scale);
    }
}

/* kv-rq's exact keys: their scores again from the exact rows EK (the same chain), over the
 * stored keys' */
__global__ void k_canon_scores_exact(const float *__restrict__ q, const float *__restrict__ EK, int n, int pos0, int T,
                                     int n_head, int nkv, int hd, float scale, int n_sink, int n_window,
                                     float *__restrict__ S) {
    const int r = blockIdx.x, h = r / n, i = r % n, kvh = h / (n_head / nkv), tq = pos0 + i;
    const float *qr = q + ((size_t)i * n_head + h) * hd;
    for (int p = threadIdx.x; p <= tq; p += blockDim.x) {
        if (!qf_canon_exact(p, tq, n_sink, n_window)) continue;
        const float *kr = EK + ((size_t)p * nkv + kvh) * hd;
        float a = 0.0f;
        for (int d = 0; d < hd; d++) a = __fmaf_rn(qr[d], kr[d], a);
        S[(size_t)r * T + p] = __fmul_rn(a, scale);
    }
}

__global__ void k_canon_softmax(float *S, int n, int pos0, int T, int n_head) {
    const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; /* h * n + i */
    if (r >= (int64_t)n_head * n) return;
    qf_canon_softmax(S + r * T, pos0 + (int)(r % n) + 1);
}

/* out[i][h][d] = fmaf chain over t <= pos0 + i of P[h][i][t] * V[t][kvh][d]: a block per (8
 * queries, head), a thread per d */
__global__ void k_canon_pv(const float *__restrict__ S, const float *__restrict__ V, const float *__restrict__ EV,
                           int n_sink, int n_window, int n, int pos0, int T, int n_head, int nkv, int hd,
                           float *__restrict__ out) {
    const int h = blockIdx.y, kvh = h / (n_head / nkv), i0 = blockIdx.x * CA_QT, d = threadIdx.x;
    if (d >= hd) return;
    const int nq = n - i0 < CA_QT ? n - i0 : CA_QT, tmax = pos0 + i0 + nq; /* the last query's key count */
    float acc[CA_QT];
#pragma unroll
    for (int k = 0; k < CA_QT; k++) acc[k] = 0.0f;
    const float *P = S + ((size_t)h * n + i0) * T;
    for (int t = 0; t < tmax; t++) {
        const size_t at = ((size_t)t * nkv + kvh) * hd + d;
        const float v = V[at], ve = EV ? EV[at] : v;
#pragma unroll
        for (int k = 0; k < CA_QT; k++) {
            const int tq = pos0 + i0 + k;
            if (k < nq && t <= tq)
                acc[k] = __fmaf_rn(P[(size_t)k * T + t], EV && qf_canon_exact(t, tq, n_sink, n_window) ? ve : v, acc[k]);
        }
    }
    for (int k = 0; k < nq; k++) out[((size_t)(i0 + k) * n_head + h) * hd + d] = acc[k];
}

void launch_canon_attention(const float *q, const float *K, const float *V, const float *EK, const float *EV, int n_sink,
                            int n_window, int n, int pos0, int n_head, int nkv, int hd, float scale, float *S, float *out,
                            cudaStream_t s) {
    const int T = pos0 + n;
    const size_t smem = (size_t)(CA_KT * (hd + 1) + CA_QT * hd) * sizeof(float);
    k_canon_scores<<<dim3(nblk((size_t)T, CA_KT), nblk((size_t)n, CA_QT), n_head), 128, smem, s>>>(q, K, n, pos0, T, n_head,
                                                                                                 nkv, hd, scale, S);
    if (EK) k_canon_scores_exact<<<(unsigned)(n_head * n), 128, 0, s>>>(q, EK, n, pos0, T, n_head, nkv, hd, scale, n_sink,
                                                                        n_window, S);
    k_canon_softmax<<<nblk((size_t)n_head * n, 128), 128, 0, s>>>(S, n, pos0, T, n_head);
    k_canon_pv<<<dim3(nblk((size_t)n, CA_QT), n_head), hd, 0, s>>>(S, V, EK ? EV : NULL, n_sink, n_window, n, pos0, T,
                                                                    n_head, nkv, hd, out);
}
