/* cuda_gemm.cu: dequantization, the decode matrix-vector kernels and the prefill GEMMs
 * (cuBLAS, f16 x f16 -> f32, or f32 sgemm). */
#include "kernels/cuda/cuda_common.cuh"


/* dst[r][k] for rows [0, rows): one thread per (row, 32-element sub-block) */
template <int T, typename O>
__global__ void k_dequant(const uint8_t *src, size_t rb, int64_t rows, int k, O *dst) {
    const int nsb = k / 32;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * nsb) return;
    const int64_t r = i / nsb;
    const int sb = (int)(i % nsb);
    float y[32];
    deq32<T>(src + (size_t)r * rb, sb, y);
    O *o = dst + (size_t)r * k + (size_t)sb * 32;
    /* 16-byte stores: a thread's 32 outputs are contiguous and 16-byte aligned */
    if (sizeof(O) == 2) {
        uint4 *o4 = (uint4 *)o;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            __half2 h[4];
#pragma unroll
            for (int u = 0; u < 4; u++) h[u] = __floats2half2_rn(y[8 * j + 2 * u], y[8 * j + 2 * u + 1]);
            uint4 v;
            memcpy(&v, h, 16);
            o4[j] = v;
        }
    } else {
        float4 *o4 = (float4 *)o;
#pragma unroll
        for (int j = 0; j < 8; j++) o4[j] = make_float4(y[4 * j], y[4 * j + 1], y[4 * j + 2], y[4 * j + 3]);
    }
}

/* embedding rows: x[t] = dequantize(E[tokens[t]]) */
template <int T> __global__ void k_embed(const uint8_t *E, size_t rb, const int32_t *tok, int n, int d, float *x) {
    pdl_trigger();
    pdl_wait();
    const int nsb = d / 32;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * nsb) return;
    const int t = i / nsb, sb = i % nsb;
    deq32<T>(E + (size_t)tok[t] * rb, sb, x + (size_t)t * d + sb * 32);
}

/* A producer's end of norm_fold (cuda_common.cuh) for one 32-block b of x, a warp's 32 lanes
 * holding its new values in order (xr: this lane's, gr: the norm's weight g[32 b + lane], read
 * by the caller): x[32 b + lane] = xr, x g quantized into nf.xq (quant_q8_warp, the step kept in
 * f32) and the block's sum of squares into each of nf.ss's NF_REP copies. Stores only.
 * k_embed_fold's and mv1_finish_fold's. */
__device__ static inline void nf_store_block(float xr, float gr, int b, int lane, float *x, const norm_fold &nf) {
    const int r = b * 32 + lane;
    x[r] = xr;
    const act_q a = act_q_view(nf.xq, 1, nf.d);
    quant_q8_warp(xr * gr, lane, a.qs + r, a.xd + b, a.xs + b, false);
    const float s2 = warp_sum(xr * xr);
    if (lane < NF_REP) nf.ss[lane * (nf.d / 32) + b] = s2; /* NF_REP copies */
}
/* One token's embedding as norm_fold's producer (the first layer's attention norm): x = E[tok],
 * one warp a 32-block (deq32 into shared memory, then a value a lane), then nf_store_block */
template <int T> __global__ void k_embed_fold(const uint8_t *E, size_t rb, const int32_t *tok, float *x, norm_fold nf) {
    __shared__ float v[4][32];
    pdl_trigger();
    pdl_wait();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, sb = (int)blockIdx.x * 4 + warp;
    if (sb >= nf.d / 32) return;
    if (lane == 0) deq32<T>(E + (size_t)tok[0] * rb, sb, v[warp]);
    __syncwarp();
    nf_store_block(v[warp][lane], __ldg(nf.g + sb * 32 + lane), sb, lane, x, nf);
}

/* y[t][r] (+)= sum_k W[r][k] x[t][k]; one warp per output row, lanes stride over sub-blocks */
template <int T>
__global__ void k_matvec(const uint8_t *W, size_t rb, int K, int N, const float *x, int n, float *y, int accumulate) {
    pdl_trigger();
    pdl_wait();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int r = blockIdx.x * (blockDim.x / 32) + warp;
    if (r >= N) return;
    const uint8_t *row = W + (size_t)r * rb;
    float acc[MATVEC_MAX];
    for (int t = 0; t < MATVEC_MAX; t++) acc[t] = 0.0f;
    const int nsb = K / 32;
    for (int sb = lane; sb < nsb; sb += 32) {
        float w[32];
        deq32<T>(row, sb, w);
        for (int t = 0; t < n; t++) {
            const float4 *xp = (const float4 *)(x + (size_t)t * K + sb * 32);
            float s = 0.0f;
            for (int j = 0; j < 8; j++) {
                float4 v = xp[j];
                s += w[4 * j] * v.x + w[4 * j + 1] * v.y + w[4 * j + 2] * v.z + w[4 * j + 3] * v.w;
            }
            acc[t] += s;
        }
    }
    for (int t = 0; t < n; t++) {
        float s = warp_sum(acc[t]);
        if (lane == 0) {
            float *o = y + (size_t)t * N + r;
            *o = accumulate ? *o + s : s;
        }
    }
}

/* ---- decode matrix-vector: each weight byte read once, with wide coalesced loads ----
 * One warp per output row. The row streams through the warp's slice of shared memory in tiles
 * of MV_SPT * 32 sub-blocks (32 elements each): the lanes copy a tile with 8-byte loads
 * (consecutive lanes, consecutive addresses: 256 bytes per load instruction, each byte once),
 * then lane l dequantizes sub-blocks l, l + 32, ... of the tile with the same deq32<T> as every
 * other route (bit-identical weights) and dots them with the f32 activations. A tile is whole
 * blocks and super-blocks for every type, so deq32 reads it in place. Needs row_bytes and the
 * row base 8-byte aligned (checked by launch_matvec, which falls back to k_matvec). */
#define MV_WARPS 4
#define MV_SPT 2
template <int T> __host__ __device__ constexpr int mv_tile_bytes() { /* bytes of 32 sub-blocks */
    return T == QF_TYPE_F32    ? 32 * 32 * 4
           : T == QF_TYPE_F16  ? 32 * 32 * 2
           : T == QF_TYPE_BF16 ? 32 * 32 * 2
           : T == QF_TYPE_Q4_0 || T == QFD_Q4_0G8 ? 32 * (int)sizeof(block_q4_0)
           : T == QF_TYPE_Q5_0 ? 32 * (int)sizeof(block_q5_0)
           : T == QF_TYPE_Q8_0 || T == QFD_Q8_0G8 ? 32 * (int)sizeof(block_q8_0)
           : T == QF_TYPE_Q4_K ? 4 * (int)sizeof(block_q4_K)
           : T == QF_TYPE_Q5_K ? 4 * (int)sizeof(block_q5_K)
                               : 4 * (int)sizeof(block_q6_K); /* Q6_K, QFD_Q6_KG */
}
static_assert(mv_tile_bytes<QFD_Q6_KG>() * MV_SPT % Q6KG_GROUP == 0, "k_matvec_wide: a tile is whole Q6_K G8 groups");

template <int T, int NT>
__global__ void __launch_bounds__(MV_WARPS * 32)
    k_matvec_wide(const uint8_t *__restrict__ W, size_t rb, int K, int N, const float *__restrict__ x, int n,
                  float *y, int accumulate) {
    pdl_trigger();
    pdl_wait();
    constexpr int TB = mv_tile_bytes<T>() * MV_SPT;
    static_assert(TB % 8 == 0, "tiles are whole 8-byte words");
    __shared__ __align__(16) uint8_t sm[MV_WARPS][TB];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int r = blockIdx.x * MV_WARPS + warp;
    if (r >= N) return; /* only __syncwarp below: whole warps leave together */
    const uint8_t *row = W + (size_t)r * rb;
    uint8_t *s = sm[warp];
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    const int nsb = K / 32;
    for (int sb0 = 0; sb0 < nsb; sb0 += 32 * MV_SPT) {
        const size_t off = (size_t)(sb0 / (32 * MV_SPT)) * TB;
        const int bytes = (int)(rb - off < (size_t)TB ? rb - off : (size_t)TB);
        __syncwarp();
        for (int i = lane * 8; i < bytes; i += 256) *(uint2 *)(s + i) = __ldg((const uint2 *)(row + off + i));
        __syncwarp();
#pragma unroll
        for (int u = 0; u < MV_SPT; u++) {
            const int ls = lane + 32 * u, sb = sb0 + ls;
            if (sb >= nsb) break;
            float w[32];
            deq32<T>(s, ls, w);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= n) break;
                const float4 *xp = (const float4 *)(x + (size_t)t * K + (size_t)sb * 32);
                float a = 0.0f;
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const float4 v = __ldg(xp + j);
                    a += w[4 * j] * v.x + w[4 * j + 1] * v.y + w[4 * j + 2] * v.z + w[4 * j + 3] * v.w;
                }
                acc[t] += a;
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t >= n) break;
        const float v = warp_sum(acc[t]);
        if (lane == 0) {
            float *o = y + (size_t)t * N + r;
            *o = accumulate ? *o + v : v;
        }
    }
}

/* End of a matrix-vector kernel with WPR warps per row: each warp reduces its partial sums,
 * the first warp of the row adds the others' in a fixed order and writes y. All warps of the
 * block reach the barrier (rows past N only skip their loads). */
template <int NT, int WPR>
__device__ static inline void mv_finish(const float *acc, int warp, int lane, int part, bool live, int r, int N, int n,
                                        float *y, int accumulate) {
    __shared__ float red[MV_WARPS][NT];
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float v = warp_sum(acc[t]);
        if (WPR > 1 && lane == 0) red[warp][t] = v;
        if (WPR == 1 && lane == 0 && live && t < n) {
            float *o = y + (size_t)t * N + r;
            *o = accumulate ? *o + v : v;
        }
    }
    if (WPR == 1) return;
    __syncthreads();
    if (part == 0 && lane == 0 && live)
        for (int t = 0; t < n && t < NT; t++) {
            float v = red[warp][t];
            for (int p = 1; p < WPR; p++) v += red[warp + p][t];
            float *o = y + (size_t)t * N + r;
            *o = accumulate ? *o + v : v;
        }
}

/* The gate|up matvec with SiLU(gate) * up as its end (GU kernels): block b's warps take gate
 * rows 2b, 2b + 1 (warps 0, 1) and the matching up rows F + 2b, F + 2b + 1 (warps 2, 3), one
 * warp per row; the gate warps then write hb[t][r] = SiLU(g) * u, k_silu_gu's expression on the
 * same f32 sums (the same bits as the matvec followed by k_silu_gu). */
__device__ static inline int gu_row(int warp, int F) {
    const int r = 2 * blockIdx.x + (warp & 1);
    return warp >> 1 ? F + r : r;
}
template <int NT>
__device__ static inline void mv_finish_gu(const float *acc, int warp, int lane, int F, int n, float *hb) {
    __shared__ float red[MV_WARPS][NT];
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float v = warp_sum(acc[t]);
        if (lane == 0) red[warp][t] = v;
    }
    __syncthreads();
    const int r = 2 * blockIdx.x + (warp & 1);
    if (warp < 2 && lane == 0 && r < F)
        for (int t = 0; t < n && t < NT; t++) {
            const float x = red[warp][t], u = red[warp + 2][t];
            hb[(size_t)t * F + r] = x / (1.0f + expf(-x)) * u;
        }
}

/* f16 / bf16 rows: no staging. Lane l reads 16-byte chunks l, l + 32, ... of the row (8
 * halves each; consecutive lanes, consecutive chunks: 512 bytes per load instruction) and the
 * 8 matching activations as two float4 (h8_to_f: cuda_common.cuh). Needs K % 8 == 0 and 16-byte
 * aligned rows. */
template <bool BF16, int NT, int WPR, bool GU = false>
__global__ void __launch_bounds__(MV_WARPS * 32)
    k_matvec_h(const uint8_t *__restrict__ W, size_t rb, int K, int N, const float *__restrict__ x, int n, float *y,
               int accumulate) {
    pdl_trigger();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, part = warp % WPR;
    /* GU: N is F, y is hb, the weight has 2F rows */
    const int r = GU ? gu_row(warp, N) : blockIdx.x * (MV_WARPS / WPR) + warp / WPR;
    const bool live = GU ? (2 * (int)blockIdx.x + (warp & 1)) < N : r < N;
    const uint4 *row = (const uint4 *)(W + (size_t)(live ? r : 0) * rb);
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    const int nc = live ? K / 8 : 0;
    int c = lane + 32 * part;
    constexpr int S = 32 * WPR; /* chunk stride of one warp */
    /* under PDL the first four chunks are loaded before the activations exist */
    uint4 u0[4];
    bool pre = c + 3 * S < nc;
    if (pre)
#pragma unroll
        for (int k = 0; k < 4; k++) u0[k] = __ldg(row + c + k * S);
    pdl_wait();
    /* four chunks in flight per lane, then two */
    for (; c + 3 * S < nc; c += 4 * S) {
        uint4 u[4];
        if (pre) {
#pragma unroll
            for (int k = 0; k < 4; k++) u[k] = u0[k];
            pre = false;
        } else
#pragma unroll
            for (int k = 0; k < 4; k++) u[k] = __ldg(row + c + k * S);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float w0[8];
            h8_to_f(u[k], w0, BF16);
            const int ck = c + k * S;
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= n) break;
                const float4 *xp = (const float4 *)(x + (size_t)t * K);
                const float4 a0 = __ldg(xp + 2 * ck), a1 = __ldg(xp + 2 * ck + 1);
                acc[t] += w0[0] * a0.x + w0[1] * a0.y + w0[2] * a0.z + w0[3] * a0.w + w0[4] * a1.x + w0[5] * a1.y +
                          w0[6] * a1.z + w0[7] * a1.w;
            }
        }
    }
    for (; c + S < nc; c += 2 * S) {
        const uint4 u0 = __ldg(row + c), u1 = __ldg(row + c + S);
        float w0[8], w1[8];
        h8_to_f(u0, w0, BF16), h8_to_f(u1, w1, BF16);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= n) break;
            const float4 *xp = (const float4 *)(x + (size_t)t * K);
            const float4 a0 = __ldg(xp + 2 * c), a1 = __ldg(xp + 2 * c + 1);
            const float4 b0 = __ldg(xp + 2 * (c + S)), b1 = __ldg(xp + 2 * (c + S) + 1);
            acc[t] += w0[0] * a0.x + w0[1] * a0.y + w0[2] * a0.z + w0[3] * a0.w + w0[4] * a1.x + w0[5] * a1.y +
                      w0[6] * a1.z + w0[7] * a1.w;
            acc[t] += w1[0] * b0.x + w1[1] * b0.y + w1[2] * b0.z + w1[3] * b0.w + w1[4] * b1.x + w1[5] * b1.y +
                      w1[6] * b1.z + w1[7] * b1.w;
        }
    }
    for (; c < nc; c += S) {
        const uint4 u0 = __ldg(row + c);
        float w0[8];
        h8_to_f(u0, w0, BF16);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= n) break;
            const float4 *xp = (const float4 *)(x + (size_t)t * K);
            const float4 a0 = __ldg(xp + 2 * c), a1 = __ldg(xp + 2 * c + 1);
            acc[t] += w0[0] * a0.x + w0[1] * a0.y + w0[2] * a0.z + w0[3] * a0.w + w0[4] * a1.x + w0[5] * a1.y +
                      w0[6] * a1.z + w0[7] * a1.w;
        }
    }
    if (GU) mv_finish_gu<NT>(acc, warp, lane, N, n, y);
    else mv_finish<NT, WPR>(acc, warp, lane, part, live, r, N, n, y, accumulate);
}

/* q4_0 / q8_0 rows: 8 lanes per 32-element block, 4 blocks per warp step. Lane i of a block
 * reads 2 (q4_0) or 4 (q8_0) bytes of quants with 2-byte loads (blocks are 2-byte aligned) and
 * the matching activations, which are contiguous across the 8 lanes (coalesced, unlike one
 * block per lane). The weights are deq32's values ((q - 8) * d, q * d) bit for bit. */
template <int T, int NT, int WPR>
__global__ void __launch_bounds__(MV_WARPS * 32)
    k_matvec_q0(const uint8_t *__restrict__ W, size_t rb, int K, int N, const float *__restrict__ x, int n, float *y,
                int accumulate) {
    pdl_trigger();
    pdl_wait();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, part = warp % WPR;
    const int r = blockIdx.x * (MV_WARPS / WPR) + warp / WPR;
    const bool live = r < N;
    const uint8_t *row = W + (size_t)(live ? r : 0) * rb;
    const int nb = live ? K / QK : 0, sub = lane >> 3, i = lane & 7;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
#pragma unroll 8
    for (int b = sub + 4 * part; b < nb; b += 4 * WPR) {
        if (T == QF_TYPE_Q4_0) {
            const block_q4_0 *bk = (const block_q4_0 *)row + b;
            const float d = h2f_bits(__ldg(&bk->d));
            const unsigned q = __ldg((const unsigned short *)(bk->qs + 2 * i));
            const unsigned q0 = q & 0xFF, q1 = q >> 8;
            const float w0 = ((int)(q0 & 0xF) - 8) * d, w1 = ((int)(q1 & 0xF) - 8) * d;
            const float w2 = ((int)(q0 >> 4) - 8) * d, w3 = ((int)(q1 >> 4) - 8) * d;
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= n) break;
                const float *xb = x + (size_t)t * K + (size_t)b * QK;
                const float2 a = __ldg((const float2 *)(xb + 2 * i)), c = __ldg((const float2 *)(xb + QK / 2 + 2 * i));
                acc[t] += w0 * a.x + w1 * a.y + w2 * c.x + w3 * c.y;
            }
        } else { /* QF_TYPE_Q8_0 */
            const block_q8_0 *bk = (const block_q8_0 *)row + b;
            const float d = h2f_bits(__ldg(&bk->d));
            const unsigned q01 = __ldg((const unsigned short *)(bk->qs + 4 * i)),
                           q23 = __ldg((const unsigned short *)(bk->qs + 4 * i + 2));
            const float w0 = (float)(int8_t)(q01 & 0xFF) * d, w1 = (float)(int8_t)(q01 >> 8) * d;
            const float w2 = (float)(int8_t)(q23 & 0xFF) * d, w3 = (float)(int8_t)(q23 >> 8) * d;
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= n) break;
                const float4 a = __ldg((const float4 *)(x + (size_t)t * K + (size_t)b * QK + 4 * i));
                acc[t] += w0 * a.x + w1 * a.y + w2 * a.z + w3 * a.w;
            }
        }
    }
    mv_finish<NT, WPR>(acc, warp, lane, part, live, r, N, n, y, accumulate);
}

/* ---- q4_0 / q8_0 rows with int8 activations (the CPU's vec_dot route, as llama.cpp's MMVQ) ----
 * The activation is quantized to q8_0 first (k_quant_act: ggml's reference quantizer, the same
 * bytes as qf_quantize_row(Q8_0)), stored split: int8 quants [n][K] (16-byte aligned, so the
 * dot loads are 4-byte words) and each block's scale as the f32 value of its f16 [n][K/32].
 * The kernel then multiplies bytes with __dp4a: q4_0 with 4 lanes per block (lane i takes quant
 * bytes 4i..4i+3 = weights 4i..4i+3 and 16+4i..16+4i+3, as one 4-byte word read by two 2-byte
 * loads: blocks are only 2-byte aligned), 8 blocks per warp step; q8_0 with 8 lanes per block.
 * Each lane's partial integer sum is exact; the float step is the oracle's per block,
 * isum * dw * dx (q4_0) or isum * (dw * dx) (q8_0), over a partial isum, then summed: only the
 * rounding of the partial products and the summation order differ from qf_vec_dot_ref. */
/* (the scratch layout: act_q, cuda_common.cuh) */

__global__ void k_quant_act(const float *__restrict__ x, int64_t nblocks, int8_t *__restrict__ qs, float *__restrict__ xd,
                            int *__restrict__ xs) {
    pdl_trigger();
    const int64_t b = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    pdl_wait();
    if (b >= nblocks) return;
    quant_q8_warp(x[b * 32 + lane], lane, qs + b * 32 + lane, xd + b, xs + b); /* quant.c's quant_q8_0 */
}

void launch_quant_act(const float *x, int n, int K, void *xq, cudaStream_t s) {
    const int64_t nb = (int64_t)n * (K / 32);
    const act_q a = act_q_view(xq, n, K);
    cu_launch(k_quant_act, dim3(nblk((size_t)nb, 8)), dim3(256), 0, s, x, nb, a.qs, a.xd, a.xs);
}

__device__ static inline int ld_w32_b2(const uint8_t *p) { /* a 4-byte word at a 2-byte aligned address */
    const unsigned short *h = (const unsigned short *)p;
    return (int)((unsigned)__ldg(h) | ((unsigned)__ldg(h + 1) << 16));
}

template <int T, int NT, int WPR, bool GU = false>
__global__ void __launch_bounds__(MV_WARPS * 32)
    k_matvec_dp4a(const uint8_t *__restrict__ W, size_t rb, int K, int N, const int8_t *__restrict__ xq,
                  const float *__restrict__ xd, int n, float *y, int accumulate) {
    constexpr int LPB = T == QF_TYPE_Q4_0 ? 4 : 8; /* lanes per block */
    constexpr int BPS = 32 / LPB;                  /* blocks per warp step */
    pdl_trigger();
    pdl_wait();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, part = warp % WPR;
    const int r = GU ? gu_row(warp, N) : blockIdx.x * (MV_WARPS / WPR) + warp / WPR; /* GU: as k_matvec_h */
    const bool live = GU ? (2 * (int)blockIdx.x + (warp & 1)) < N : r < N;
    const uint8_t *row = W + (size_t)(live ? r : 0) * rb;
    const int nb = live ? K / QK : 0, sub = lane / LPB, i = lane % LPB;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
#pragma unroll 4
    for (int b = sub + BPS * part; b < nb; b += BPS * WPR) {
        if (T == QF_TYPE_Q4_0) {
            const block_q4_0 *bk = (const block_q4_0 *)row + b;
            const float d = h2f_bits(__ldg(&bk->d));
            const int v = ld_w32_b2(bk->qs + 4 * i);
            const int lo = v & 0x0F0F0F0F, hi = (v >> 4) & 0x0F0F0F0F;
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= n) break;
                const int *xb = (const int *)(xq + (size_t)t * K + (size_t)b * QK);
                const int a0 = __ldg(xb + i), a1 = __ldg(xb + 4 + i);
                /* sum (q - 8) a = sum q a - 8 sum a */
                const int s = __dp4a(hi, a1, __dp4a(lo, a0, 0)) - 8 * __dp4a(0x01010101, a1, __dp4a(0x01010101, a0, 0));
                acc[t] += (float)s * d * __ldg(xd + (size_t)t * (K / QK) + b);
            }
        } else { /* QF_TYPE_Q8_0 */
            const block_q8_0 *bk = (const block_q8_0 *)row + b;
            const float d = h2f_bits(__ldg(&bk->d));
            const int v = ld_w32_b2((const uint8_t *)bk->qs + 4 * i);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= n) break;
                const int a = __ldg((const int *)(xq + (size_t)t * K + (size_t)b * QK) + i);
                acc[t] += (float)__dp4a(v, a, 0) * (d * __ldg(xd + (size_t)t * (K / QK) + b));
            }
        }
    }
    if (GU) mv_finish_gu<NT>(acc, warp, lane, N, n, y);
    else mv_finish<NT, WPR>(acc, warp, lane, part, live, r, N, n, y, accumulate);
}

/* ---- q4_0 rows in the G8 layout (cuda_common.cuh) with int8 activations ----
 * Lane l of a row's warp takes block b = l + 32 part + S u (S = 32 WPR): one 16-byte load of
 * its 16 quant bytes (consecutive lanes read consecutive blocks of a group: a warp reads 4
 * whole groups, 576 contiguous bytes) and its 2-byte scale, U blocks in flight per lane. The
 * activation block is 32 int8 (two 16-byte loads), its f32 scale and the sum of its quants
 * (k_quant_act), so a block's integer dot is 8 __dp4a on the nibbles less 8 x that sum: the
 * whole block's isum, exactly the oracle's, and the float step isum * dw * dx is the oracle's
 * per block (qf_vec_dot_ref); only the order of the per-block sums differs. Under PDL the first
 * U weight loads are issued before pdl_wait() (weights are never written). */
#define Q4G_U 4
/* sum q a over a block: its 16 quant bytes (low nibbles: elements 0..15, high: 16..31) against
 * the activation's 32 int8 (a0: 0..15, a1: 16..31), 8 __dp4a */
__device__ static inline int q4g_dot(const uint4 &q, const int4 &a0, const int4 &a1) {
    const int w[4] = {(int)q.x, (int)q.y, (int)q.z, (int)q.w};
    int sdot = __dp4a(w[0] & 0x0F0F0F0F, a0.x, 0);
    sdot = __dp4a(w[1] & 0x0F0F0F0F, a0.y, sdot);
    sdot = __dp4a(w[2] & 0x0F0F0F0F, a0.z, sdot);
    sdot = __dp4a(w[3] & 0x0F0F0F0F, a0.w, sdot);
    sdot = __dp4a((w[0] >> 4) & 0x0F0F0F0F, a1.x, sdot);
    sdot = __dp4a((w[1] >> 4) & 0x0F0F0F0F, a1.y, sdot);
    sdot = __dp4a((w[2] >> 4) & 0x0F0F0F0F, a1.z, sdot);
    return __dp4a((w[3] >> 4) & 0x0F0F0F0F, a1.w, sdot);
}
/* q8_0 rows in their G8 layout take the same kernels (Q8): a block's 32 quant bytes are two
 * 16-byte words, its integer dot 8 __dp4a on the signed bytes (no offset) */
template <bool Q8> __host__ __device__ constexpr int g8_qw() { return Q8 ? 2 : 1; } /* 16-byte words a block */
/* block b of a G8 row: its quants and its scale */
template <bool Q8> __device__ static inline const uint8_t *g8_quants(const uint8_t *row, int b) {
    return row + (size_t)(b >> 3) * (Q8 ? Q8G_GROUP : Q4G_GROUP) + 16 + 16 * g8_qw<Q8>() * (b & 7);
}
template <bool Q8> __device__ static inline const unsigned short *g8_scale(const uint8_t *row, int b) {
    return (const unsigned short *)(row + (size_t)(b >> 3) * (Q8 ? Q8G_GROUP : Q4G_GROUP)) + (b & 7);
}
/* a block's isum against the activation block (a0, a1: its 32 int8, sx: their sum) */
template <bool Q8> __device__ static inline int g8_isum(const uint4 *q, const int4 &a0, const int4 &a1, int sx) {
    if constexpr (Q8) {
        int t = __dp4a((int)q[0].x, a0.x, 0);
        t = __dp4a((int)q[0].y, a0.y, t), t = __dp4a((int)q[0].z, a0.z, t), t = __dp4a((int)q[0].w, a0.w, t);
        t = __dp4a((int)q[1].x, a1.x, t), t = __dp4a((int)q[1].y, a1.y, t), t = __dp4a((int)q[1].z, a1.z, t);
        return __dp4a((int)q[1].w, a1.w, t);
    } else
        return q4g_dot(q[0], a0, a1) - 8 * sx;
}
/* the quants and scale of blocks b0 + u S, u < Q4G_U, of a G8 row (those < nb) */
template <bool Q8>
__device__ static inline void q4g_load(const uint8_t *row, int b0, int S, int nb, uint4 (*qv)[g8_qw<Q8>()], unsigned short *dv) {
#pragma unroll
    for (int u = 0; u < Q4G_U; u++) {
        const int b = b0 + u * S;
        if (b < nb) {
            const uint4 *q = (const uint4 *)g8_quants<Q8>(row, b);
#pragma unroll
            for (int w = 0; w < g8_qw<Q8>(); w++) qv[u][w] = __ldg(q + w);
            dv[u] = __ldg(g8_scale<Q8>(row, b));
        }
    }
}
template <int NT, int WPR, bool GU = false, bool Q8 = false>
__global__ void __launch_bounds__(MV_WARPS * 32)
    k_matvec_q4g(const uint8_t *__restrict__ W, size_t rb, int K, int N, const int8_t *__restrict__ xq,
                 const float *__restrict__ xd, const int *__restrict__ xs, int n, float *y, int accumulate) {
    pdl_trigger();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, part = warp % WPR;
    const int r = GU ? gu_row(warp, N) : blockIdx.x * (MV_WARPS / WPR) + warp / WPR; /* GU: as k_matvec_h */
    const bool live = GU ? (2 * (int)blockIdx.x + (warp & 1)) < N : r < N;
    const uint8_t *row = W + (size_t)(live ? r : 0) * rb;
    const int nb = live ? K / QK : 0, nbk = K / QK;
    constexpr int S = 32 * WPR;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    uint4 qv[Q4G_U][g8_qw<Q8>()];
    unsigned short dv[Q4G_U];
    int b0 = lane + 32 * part;
    /* the first U blocks' weights, before the activations exist */
    q4g_load<Q8>(row, b0, S, nb, qv, dv);
    pdl_wait();
    for (;;) {
#pragma unroll
        for (int u = 0; u < Q4G_U; u++) {
            const int b = b0 + u * S;
            if (b >= nb) break;
            const float d = h2f_bits(dv[u]);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= n) break;
                const int4 *xa = (const int4 *)(xq + (size_t)t * K + (size_t)b * QK);
                const int isum = g8_isum<Q8>(qv[u], __ldg(xa), __ldg(xa + 1), Q8 ? 0 : __ldg(xs + (size_t)t * nbk + b));
                acc[t] += (float)isum * d * __ldg(xd + (size_t)t * nbk + b);
            }
        }
        b0 += Q4G_U * S;
        if (b0 >= nb) break;
        q4g_load<Q8>(row, b0, S, nb, qv, dv);
    }
    if (GU) mv_finish_gu<NT>(acc, warp, lane, N, n, y);
    else mv_finish<NT, WPR>(acc, warp, lane, part, live, r, N, n, y, accumulate);
}

/* ---- one-token decode matvecs (n == 1, N >= MV_SPLIT_ROWS): rows in groups ----
 * A block is W warp groups of P warps; group g takes R consecutive rows, its P warps split each
 * row's blocks (q4_0 G8) or 16-byte chunks (f16 / bf16) between them, U per lane in flight for
 * every one of the R rows. The activation of a block or chunk is loaded once and used for the R
 * rows; the R x U weight loads of the first step are issued before pdl_wait. Weights are read
 * with the L2 evict-first policy: a decode step reads each weight byte once, so its lines should
 * leave L2 first (the activations and the K/V rows stay). The parts' sums are added in part order
 * (fixed: graph and plain launches give the same bits). GU: the block's group 0 takes gate rows
 * r0 .. r0 + R - 1, group 1 the matching up rows F + r0 ..; the gate group writes
 * hb[r] = SiLU(g) * u (k_silu_gu's expression). Measured on the Llama-3-8B shapes (H200, the
 * matvecs of a step chained in a graph, docs/gpu.md "Session 18"): q4_0 1.540 -> 1.168 ms,
 * f16 4.039 -> 3.537 ms against one warp per row with plain loads. */
__device__ static inline uint64_t l2_evict_first(void) {
    uint64_t pol = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
#endif
    return pol;
}
/* 16 bytes of weights that no kernel writes (read-only path, not kept in L1, L2 evict-first) */
__device__ static inline uint4 ld_stream16(const void *p, uint64_t pol) {
    uint4 r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p), "l"(pol));
#else
    (void)pol;
    r = __ldg((const uint4 *)p);
#endif
    return r;
}
/* the grouped kernels' part sums: warp w's sum of row j into red[w][j], then the block joined */
template <int R>
__device__ static __forceinline__ void mv1_parts(const float *acc, int warp, int lane, float (*red)[R]) {
#pragma unroll
    for (int j = 0; j < R; j++) {
        const float v = warp_sum(acc[j]);
        if (lane == 0) red[warp][j] = v;
    }
    __syncthreads();
}
/* a consumer's rs = 1 / sqrt(mean(x^2) + eps) from the producer's sums of squares, copy
 * blockIdx % NF_REP (every lane the same value: a fixed order) */
__device__ static inline float norm_fold_rs(const norm_fold &nf, int lane) {
    float t = 0.0f;
    const float *ss = nf.ss + (blockIdx.x % NF_REP) * (nf.d / 32);
    for (int i = lane; i < nf.d / 32; i += 32) t += ss[i];
    return 1.0f / sqrtf(warp_sum(t) / nf.d + nf.eps);
}
/* the end of a grouped kernel: part sums of warp w, row j in red[w][j] */
template <int R, int W, int P, bool GU>
__device__ static inline void mv1_finish(const float *acc, int warp, int lane, int r0, int N, float *y,
                                         int accumulate) {
    __shared__ float red[W * P][R];
    mv1_parts<R>(acc, warp, lane, red);
    if (warp % P || lane >= R) return;
    const int r = r0 + lane;
    if (GU) {
        if (warp != 0 || r >= N) return;
        float g = 0.0f, u = 0.0f;
        for (int p = 0; p < P; p++) g += red[p][lane];
        for (int p = 0; p < P; p++) u += red[P + p][lane];
        y[r] = g / (1.0f + expf(-g)) * u;
        return;
    }
    if (r >= N) return;
    float v = 0.0f;
    for (int p = 0; p < P; p++) v += red[warp + p][lane];
    y[r] = accumulate ? y[r] + v : v;
}
/* the first output row of warp group grp (GU: both groups share it, gate rows and up rows) */
template <int R, int W, bool GU> __device__ static inline int mv1_r0(int grp) {
    return GU ? (int)blockIdx.x * R : ((int)blockIdx.x * W + grp) * R;
}
/* The end of a producer of norm_fold (cuda_common.cuh): the block's W R = 32 rows are one q8_0
 * block of x. Their sums as mv1_finish adds them (parts in order), xo + the sum (xo: warp 0's
 * lane's x[32 b + lane] as read before, so the accumulating store's bits), then warp 0 stores the
 * block (nf_store_block, gr: g[32 b + lane], also read before). */
template <int R, int W, int P>
__device__ static inline void mv1_finish_fold(const float *acc, int warp, int lane, float *x, const norm_fold &nf,
                                              float xo, float gr) {
    static_assert(W * R == 32, "a producer block's rows are one q8_0 block");
    __shared__ float red[W * P][R];
    mv1_parts<R>(acc, warp, lane, red);
    if (warp) return;
    const int grp = lane / R, j = lane % R;
    float v = 0.0f;
    for (int p = 0; p < P; p++) v += red[grp * P + p][j];
    nf_store_block(xo + v, gr, (int)blockIdx.x, lane, x, nf);
}
/* NF (W R = 32, no GU): the producer of nf (y is the residual x, accumulated); else nf.ss set:
 * a consumer, its row sums times rs before their end */
template <int R, int U, int W, int P, bool GU, bool Q8 = false, bool NF = false>
__global__ void __launch_bounds__(W * P * 32)
    k_mv1_q4g(const uint8_t *__restrict__ Wt, size_t rb, int K, int N, const int8_t *__restrict__ xq,
              const float *__restrict__ xd, const int *__restrict__ xs, float *y, int accumulate, norm_fold nf) {
    static_assert(!GU || W == 2, "GU: a gate group and an up group");
    static_assert(!NF || !GU, "the producer of a norm is o or down");
    pdl_trigger();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, grp = warp / P, part = warp % P;
    const int r0 = mv1_r0<R, W, GU>(grp), nb = K / QK;
    const uint64_t pol = l2_evict_first();
    constexpr int S = 32 * P;
    float acc[R];
    uint4 qv[R][U][g8_qw<Q8>()];
    unsigned short dv[R][U];
#pragma unroll
    for (int j = 0; j < R; j++) acc[j] = 0.0f;
    const uint8_t *rows[R];
#pragma unroll
    for (int j = 0; j < R; j++) /* rows past N read row N - 1 and are not written */
        rows[j] = Wt + (size_t)((GU && grp ? N : 0) + min(r0 + j, N - 1)) * rb;
    int b0 = lane + 32 * part;
    auto load = [&](int b0) {
#pragma unroll
        for (int j = 0; j < R; j++)
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int b = b0 + S * u;
                if (b < nb) {
                    const uint8_t *q = g8_quants<Q8>(rows[j], b);
#pragma unroll
                    for (int w = 0; w < g8_qw<Q8>(); w++) qv[j][u][w] = ld_stream16(q + 16 * w, pol);
                    dv[j][u] = __ldg(g8_scale<Q8>(rows[j], b));
                }
            }
    };
    load(b0); /* weights only: before the activations exist */
    /* NF: warp 0's lane's x and g of the block's 32 rows, read at the start so that the block
     * ends in stores only (a load at its end is an L2 round trip the wave waits on). On the
     * H100, 8B q4_0 decode at positions 1..256: 1.016x the loads at the end, and 1.03x with
     * k_attn_one's softmax in phase 3 (docs/gpu.md "Session 46"). g is a weight (never written);
     * x is the residual, final once the wait returns, and only this block writes its 32 rows */
    float xo = 0.0f, gr = 0.0f;
    if (NF && warp == 0) gr = __ldg(nf.g + blockIdx.x * 32 + lane);
    pdl_wait();
    if (NF && warp == 0) xo = y[blockIdx.x * 32 + lane];
    for (;;) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int b = b0 + S * u;
            if (b >= nb) break;
            const int4 *xa = (const int4 *)(xq + (size_t)b * QK);
            const int4 a0 = __ldg(xa), a1 = __ldg(xa + 1);
            const int sx = Q8 ? 0 : __ldg(xs + b);
            const float dx = __ldg(xd + b);
#pragma unroll
            for (int j = 0; j < R; j++) {
                /* the oracle's per-block step: isum * dw * dx */
                acc[j] += (float)g8_isum<Q8>(qv[j][u], a0, a1, sx) * h2f_bits(dv[j][u]) * dx;
            }
        }
        b0 += S * U;
        if (b0 >= nb) break;
        load(b0);
    }
    if constexpr (NF) {
        mv1_finish_fold<R, W, P>(acc, warp, lane, y, nf, xo, gr);
    } else {
        if (nf.ss) {
            const float rs = norm_fold_rs(nf, lane);
#pragma unroll
            for (int j = 0; j < R; j++) acc[j] *= rs;
        }
        mv1_finish<R, W, P, GU>(acc, warp, lane, r0, N, y, accumulate);
    }
}
template <bool BF16, int R, int U, int W, int P, bool GU>
__global__ void __launch_bounds__(W * P * 32)
    k_mv1_h(const uint8_t *__restrict__ Wt, size_t rb, int K, int N, const float *__restrict__ x, float *y,
            int accumulate) {
    static_assert(!GU || W == 2, "GU: a gate group and an up group");
    pdl_trigger();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, grp = warp / P, part = warp % P;
    const int r0 = mv1_r0<R, W, GU>(grp), nc = K / 8;
    const uint64_t pol = l2_evict_first();
    constexpr int S = 32 * P;
    float acc[R];
    uint4 qv[R][U];
#pragma unroll
    for (int j = 0; j < R; j++) acc[j] = 0.0f;
    const uint4 *rows[R];
#pragma unroll
    for (int j = 0; j < R; j++) rows[j] = (const uint4 *)(Wt + (size_t)((GU && grp ? N : 0) + min(r0 + j, N - 1)) * rb);
    int c0 = lane + 32 * part;
    auto load = [&](int c0) {
#pragma unroll
        for (int j = 0; j < R; j++)
#pragma unroll
            for (int u = 0; u < U; u++)
                if (c0 + S * u < nc) qv[j][u] = ld_stream16(rows[j] + c0 + S * u, pol);
    };
    load(c0);
    pdl_wait();
    const float4 *xp = (const float4 *)x;
    for (;;) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c = c0 + S * u;
            if (c >= nc) break;
            const float4 a0 = __ldg(xp + 2 * c), a1 = __ldg(xp + 2 * c + 1);
#pragma unroll
            for (int j = 0; j < R; j++) {
                float w0[8];
                h8_to_f(qv[j][u], w0, BF16);
                acc[j] += w0[0] * a0.x + w0[1] * a0.y + w0[2] * a0.z + w0[3] * a0.w + w0[4] * a1.x + w0[5] * a1.y +
                          w0[6] * a1.z + w0[7] * a1.w;
            }
        }
        c0 += S * U;
        if (c0 >= nc) break;
        load(c0);
    }
    mv1_finish<R, W, P, GU>(acc, warp, lane, r0, N, y, accumulate);
}

/* Rows below which 4 warps share each row of a decode matvec (fewer rows: the grid would not
 * fill the GPU). 2048: the 8B shape's q|k|v (6144), o and down (4096) rows take one warp each;
 * H200, 8B q4_0 decode at 256: 374.8 / 375.4 tok/s against 360.7 / 363.2 with 8192, f16 184.3 /
 * 183.9 against 183.0 / 182.3 (docs/gpu.md). */
#define MV_SPLIT_ROWS 2048
/* gate|up rows (2 n_ff) from which the fused gate|up kernels (SiLU(gate) * up at their end) run:
 * launch_matvec_gu, and norm_fold's gate|up consumer with it */
#define MV_GU_ROWS 8192

/* ---- Q4_K / Q5_K / Q6_K rows with int8 activations (the CPU's vec_dot route) ----
 * The activation is quantized to Q8_K first (k_quant_act_k: quant.c's quant_q8_K bit for bit:
 * one f32 scale per 256 elements), stored in the ACT_Q_BYTES layout: int8 quants [n][K], the
 * scale of super-block j of row t at xd[t * K / 32 + j], the int32 sum of each 32 quants at
 * xs[t * K / 32 + s] (the sum of two of quant_q8_K's bsums). Eight lanes take one weight
 * super-block (four per warp step): for Q4_K / Q5_K lane i takes sub-blocks 2 (i / 2) and
 * 2 (i / 2) + 1, 16 of their 32 elements each (one 16-byte load of quant bytes; Q5_K one more
 * of high bits), for Q6_K lane i takes 8 of the 32 element offsets of one half, for all four
 * of its 32-element quarters (2-byte loads: Q6_K blocks are 210 bytes). The lanes' integer sums
 * are added by shuffles into the super-block's exact isum (and msum, the mins' term), and the
 * float step is dot_q4_K's / dot_q6_K's per super-block, d * xd * isum - dmin * xd * msum, each
 * product rounded on its own: only the order of the super-block sums differs from
 * qf_vec_dot_ref. */
__global__ void k_quant_act_k(const float *__restrict__ x, int64_t nblocks, int K, int8_t *__restrict__ qs,
                              float *__restrict__ xd, int *__restrict__ xs) {
    pdl_trigger();
    const int64_t b = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    pdl_wait();
    if (b >= nblocks) return;
    const float4 *p = (const float4 *)(x + b * 256 + 8 * lane);
    const float4 v0 = p[0], v1 = p[1];
    const float v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
    /* argmax_abs: the first element of the largest |x| (ties: the lowest index) */
    float am = 0.0f, mv = v[0];
    int ai = 8 * lane;
#pragma unroll
    for (int j = 0; j < 8; j++)
        if (fabsf(v[j]) > am) am = fabsf(v[j]), mv = v[j], ai = 8 * lane + j;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float oam = __shfl_xor_sync(0xffffffffu, am, o), omv = __shfl_xor_sync(0xffffffffu, mv, o);
        const int oai = __shfl_xor_sync(0xffffffffu, ai, o);
        if (oam > am || (oam == am && oai < ai)) am = oam, mv = omv, ai = oai;
    }
    const int64_t t = b / (K / 256), j = b % (K / 256);
    int q[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    float iscale = 0.0f;
    if (mv != 0.0f) {
        iscale = __fdiv_rn(-127.0f, mv);
#pragma unroll
        for (int k = 0; k < 8; k++) q[k] = min(__float2int_rn(__fmul_rn(iscale, v[k])), 127); /* nearest_int */
    }
    char4 c0 = make_char4((signed char)q[0], (signed char)q[1], (signed char)q[2], (signed char)q[3]);
    char4 c1 = make_char4((signed char)q[4], (signed char)q[5], (signed char)q[6], (signed char)q[7]);
    char4 *qo = (char4 *)(qs + b * 256 + 8 * lane);
    qo[0] = c0, qo[1] = c1;
    int sum = q[0] + q[1] + q[2] + q[3] + q[4] + q[5] + q[6] + q[7];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    if (lane % 4 == 0) xs[t * (K / 32) + 8 * j + lane / 4] = sum;
    if (lane == 0) xd[t * (K / 32) + j] = mv != 0.0f ? __fdiv_rn(1.0f, iscale) : 0.0f;
}

void launch_quant_act_k(const float *x, int n, int K, void *xq, cudaStream_t s) {
    const int64_t nb = (int64_t)n * (K / 256);
    const act_q a = act_q_view(xq, n, K);
    cu_launch(k_quant_act_k, dim3(nblk((size_t)nb, 8)), dim3(256), 0, s, x, nb, K, a.qs, a.xd, a.xs);
}

/* the sum of v over the 8 lanes of a super-block group (m: the group's lanes) */
__device__ static inline int group8_sum(int v, unsigned m) {
    v += __shfl_xor_sync(m, v, 1);
    v += __shfl_xor_sync(m, v, 2);
    return v + __shfl_xor_sync(m, v, 4);
}

/* One lane's slice of a K-format super-block, in registers (kq_load), so that a lane's first
 * KQ_U super-blocks are loaded before pdl_wait and later ones a whole batch at a time */
template <int T> struct kq_slice;
template <> struct kq_slice<QF_TYPE_Q4_K> { uint4 q; unsigned dd, s0, s1, s2; };
template <> struct kq_slice<QF_TYPE_Q5_K> { uint4 q, h; unsigned dd, s0, s1, s2; };
template <> struct kq_slice<QF_TYPE_Q6_K> { int l0[2], l1[2], hh[2], sc[4]; unsigned short d; };
template <> struct kq_slice<QFD_Q6_KG> : kq_slice<QF_TYPE_Q6_K> {}; /* the G8 layout, the same lanes */
template <int T> __host__ __device__ constexpr bool kq_q6() { return T == QF_TYPE_Q6_K || T == QFD_Q6_KG; }
template <int T> __host__ __device__ constexpr int kq_block_bytes() {
    return T == QF_TYPE_Q4_K ? (int)sizeof(block_q4_K) : T == QF_TYPE_Q5_K ? (int)sizeof(block_q5_K) : (int)sizeof(block_q6_K);
}
#ifndef KQ_U
#define KQ_U 2 /* super-blocks in flight per lane (k_matvec_k; the one-token k_mv1_k takes 2 of its own): H200, 8B q4_k_m decode 333.1 / 335.7 tok/s against 326.3 / 326.5 with 1 and 274.6 / 274.2 with 4 (more registers, fewer warps) */
#endif

/* lane i (of the super-block's 8) of super-block b of the row at row */
template <int T> __device__ static inline void kq_load(const uint8_t *row, int b, int i, kq_slice<T> &k) {
    if constexpr (T == QF_TYPE_Q4_K || T == QF_TYPE_Q5_K) {
        const uint8_t *bp = row + (size_t)b * kq_block_bytes<T>();
        const int j = i >> 1, h = i & 1;
        /* d and dmin (one word), the 12 scale bytes: the block's first 16 bytes in both types,
         * one 16-byte load (kq_ok: 16-byte aligned rows of 16-byte multiple blocks) */
        static_assert(offsetof(block_q4_K, d) == 0 && offsetof(block_q4_K, scales) == 4 &&
                          offsetof(block_q5_K, d) == 0 && offsetof(block_q5_K, scales) == 4,
                      "Q4_K / Q5_K header: d, dmin, scales[12]");
        const uint4 hd = __ldg((const uint4 *)bp);
        k.dd = hd.x, k.s0 = hd.y, k.s1 = hd.z, k.s2 = hd.w;
        constexpr size_t qo = T == QF_TYPE_Q4_K ? offsetof(block_q4_K, qs) : offsetof(block_q5_K, qs);
        const uint64_t pol = l2_evict_first(); /* the quants stream through L2 (ld_stream16) */
        k.q = ld_stream16(bp + qo + 32 * j + 16 * h, pol);
        if constexpr (T == QF_TYPE_Q5_K) k.h = ld_stream16(bp + offsetof(block_q5_K, qh) + 16 * h, pol);
    } else {
        const int half = i >> 2, w = i & 3;
        const qf_q6k_fields f = qf_q6k_at(row, b, T == QFD_Q6_KG);
        const uint8_t *ql = f.ql + 64 * half + 8 * w, *qh = f.qh + 32 * half + 8 * w;
        const int8_t *scp = f.scales + 8 * half + (w >> 1);
        if constexpr (T == QFD_Q6_KG) { /* 8-byte aligned: one load a field */
            const uint2 a = __ldg((const uint2 *)ql), c = __ldg((const uint2 *)(ql + 32)), h = __ldg((const uint2 *)qh);
            k.l0[0] = (int)a.x, k.l0[1] = (int)a.y, k.l1[0] = (int)c.x, k.l1[1] = (int)c.y, k.hh[0] = (int)h.x, k.hh[1] = (int)h.y;
        } else {
#pragma unroll
            for (int u = 0; u < 2; u++)
                k.l0[u] = ld_w32_b2(ql + 4 * u), k.l1[u] = ld_w32_b2(ql + 32 + 4 * u), k.hh[u] = ld_w32_b2(qh + 4 * u);
        }
#pragma unroll
        for (int q = 0; q < 4; q++) k.sc[q] = __ldg(scp + 2 * q);
        k.d = __ldg((const unsigned short *)f.d);
    }
}

/* Lane i's slice of a Q4_K / Q5_K super-block as 4-bit (5-bit) values: lo[q], hi[q] the words
 * of its 16 elements of sub-blocks 2 (i / 2) and 2 (i / 2) + 1 (kq_unpack_q), with those
 * sub-blocks' scales and mins; Q6_K: q[quarter][word] the 6-bit quants less 32, as signed bytes */
template <int T> __device__ static inline void kq_unpack_q(const kq_slice<T> &k, int j, int *lo, int *hi) {
    lo[0] = (int)k.q.x, lo[1] = (int)k.q.y, lo[2] = (int)k.q.z, lo[3] = (int)k.q.w;
#pragma unroll
    for (int q = 0; q < 4; q++) hi[q] = (lo[q] >> 4) & 0x0F0F0F0F, lo[q] &= 0x0F0F0F0F;
    if constexpr (T == QF_TYPE_Q5_K) {
        const int hb[4] = {(int)k.h.x, (int)k.h.y, (int)k.h.z, (int)k.h.w};
#pragma unroll
        for (int q = 0; q < 4; q++) {
            lo[q] |= ((hb[q] >> (2 * j)) & 0x01010101) << 4;
            hi[q] |= ((hb[q] >> (2 * j + 1)) & 0x01010101) << 4;
        }
    }
}
/* the scales and mins of sub-blocks 2 j and 2 j + 1 (qf_k4_scale_min's values) from the 12
 * scale bytes in three words (w0: bytes 0..3, w1: 4..7, w2: 8..11), without branches or a local
 * array: all four 6-bit scales (mins) of the half that holds them as the bytes of one word, then
 * two bytes of it */
__device__ static inline void k4_scale_min_pair(int j, unsigned w0, unsigned w1, unsigned w2, int *sc1, int *m1,
                                                int *sc2, int *m2) {
    const unsigned scw = j < 2 ? (w0 & 0x3F3F3F3Fu) : ((w2 & 0x0F0F0F0Fu) | ((w0 >> 2) & 0x30303030u));
    const unsigned mw = j < 2 ? (w1 & 0x3F3F3F3Fu) : (((w2 >> 4) & 0x0F0F0F0Fu) | ((w1 >> 2) & 0x30303030u));
    const int sh = 16 * (j & 1);
    *sc1 = (int)((scw >> sh) & 0xFF), *sc2 = (int)((scw >> (sh + 8)) & 0xFF);
    *m1 = (int)((mw >> sh) & 0xFF), *m2 = (int)((mw >> (sh + 8)) & 0xFF);
}
template <int T>
__device__ static inline void kq_unpack(const kq_slice<T> &k, int i, int *lo, int *hi, int *sc1, int *m1, int *sc2,
                                        int *m2) {
    const int j = i >> 1;
    k4_scale_min_pair(j, k.s0, k.s1, k.s2, sc1, m1, sc2, m2);
    kq_unpack_q<T>(k, j, lo, hi);
}
__device__ static inline void kq_unpack6(const kq_slice<QF_TYPE_Q6_K> &k, int (*q)[2]) {
#pragma unroll
    for (int u = 0; u < 2; u++) {
        const int l0 = k.l0[u], l1 = k.l1[u], hh = k.hh[u];
        q[0][u] = __vsub4((l0 & 0x0F0F0F0F) | ((hh & 0x03030303) << 4), 0x20202020);
        q[1][u] = __vsub4((l1 & 0x0F0F0F0F) | (((hh >> 2) & 0x03030303) << 4), 0x20202020);
        q[2][u] = __vsub4(((l0 >> 4) & 0x0F0F0F0F) | (((hh >> 4) & 0x03030303) << 4), 0x20202020);
        q[3][u] = __vsub4(((l1 >> 4) & 0x0F0F0F0F) | (((hh >> 6) & 0x03030303) << 4), 0x20202020);
    }
}

/* acc[t] += the super-block's dot with activation row t (b: the super-block's index in the row,
 * gm: the mask of its 8 lanes; lane i == 0 adds it) */
template <int T, int NT>
__device__ static inline void kq_dot(const kq_slice<T> &k, int b, int i, unsigned gm, int K, const int8_t *__restrict__ xq,
                                     const float *__restrict__ xd, const int *__restrict__ xs, int n, float *acc) {
    const int xr = K / 32;
    if constexpr (T == QF_TYPE_Q4_K || T == QF_TYPE_Q5_K) {
        const int j = i >> 1, h = i & 1;
        const float d = h2f_bits((uint16_t)(k.dd & 0xFFFF)), dmin = h2f_bits((uint16_t)(k.dd >> 16));
        int sc1, m1, sc2, m2, lo[4], hi[4];
        kq_unpack<T>(k, i, lo, hi, &sc1, &m1, &sc2, &m2);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= n) break;
            const int8_t *xb = xq + (size_t)t * K + (size_t)b * 256 + 64 * j + 16 * h;
            const int4 a0 = __ldg((const int4 *)xb), a1 = __ldg((const int4 *)(xb + 32));
            int d1 = __dp4a(lo[0], a0.x, 0);
            d1 = __dp4a(lo[1], a0.y, d1), d1 = __dp4a(lo[2], a0.z, d1), d1 = __dp4a(lo[3], a0.w, d1);
            int d2 = __dp4a(hi[0], a1.x, 0);
            d2 = __dp4a(hi[1], a1.y, d2), d2 = __dp4a(hi[2], a1.z, d2), d2 = __dp4a(hi[3], a1.w, d2);
            int isum = sc1 * d1 + sc2 * d2, msum = 0;
            if (h == 0) {
                const int *xsb = xs + (size_t)t * xr + 8 * b + 2 * j;
                msum = m1 * __ldg(xsb) + m2 * __ldg(xsb + 1);
            }
            isum = group8_sum(isum, gm), msum = group8_sum(msum, gm);
            if (i == 0) {
                const float xdb = __ldg(xd + (size_t)t * xr + b);
                acc[t] += __fsub_rn(__fmul_rn(__fmul_rn(d, xdb), (float)isum), __fmul_rn(__fmul_rn(dmin, xdb), (float)msum));
            }
        }
    } else {
        const int half = i >> 2, w = i & 3;
        int q[4][2]; /* [quarter][word]: the 6-bit quants less 32, as signed bytes */
        kq_unpack6(k, q);
        const float d = h2f_bits(k.d);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= n) break;
            const int8_t *xb = xq + (size_t)t * K + (size_t)b * 256 + 128 * half + 8 * w;
            int isum = 0;
#pragma unroll
            for (int qq = 0; qq < 4; qq++) {
                const int2 a = __ldg((const int2 *)(xb + 32 * qq));
                isum += k.sc[qq] * __dp4a(q[qq][1], a.y, __dp4a(q[qq][0], a.x, 0));
            }
            isum = group8_sum(isum, gm);
            if (i == 0) acc[t] += __fmul_rn(__fmul_rn(d, __ldg(xd + (size_t)t * xr + b)), (float)isum);
        }
    }
}

template <int T, int NT, int WPR, bool GU = false>
__global__ void __launch_bounds__(MV_WARPS * 32)
    k_matvec_k(const uint8_t *__restrict__ W, size_t rb, int K, int N, const int8_t *__restrict__ xq,
               const float *__restrict__ xd, const int *__restrict__ xs, int n, float *y, int accumulate) {
    pdl_trigger();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, part = warp % WPR;
    const int r = GU ? gu_row(warp, N) : blockIdx.x * (MV_WARPS / WPR) + warp / WPR; /* GU: as k_matvec_h */
    const bool live = GU ? (2 * (int)blockIdx.x + (warp & 1)) < N : r < N;
    const uint8_t *row = W + (size_t)(live ? r : 0) * rb;
    const int nsb = live ? K / 256 : 0, sub = lane / 8, i = lane % 8;
    constexpr int S = 4 * WPR; /* super-blocks per warp step */
    const unsigned gm = 0xFFu << (8 * sub);
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    kq_slice<T> kb[KQ_U];
    int b0 = sub + 4 * part;
    /* the first KQ_U super-blocks' weights, before the activations exist (weights are never written) */
#pragma unroll
    for (int u = 0; u < KQ_U; u++)
        if (b0 + u * S < nsb) kq_load<T>(row, b0 + u * S, i, kb[u]);
    pdl_wait();
    while (b0 < nsb) {
#pragma unroll
        for (int u = 0; u < KQ_U; u++) {
            const int b = b0 + u * S;
            if (b >= nsb) break;
            kq_dot<T, NT>(kb[u], b, i, gm, K, xq, xd, xs, n, acc);
        }
        b0 += KQ_U * S;
#pragma unroll
        for (int u = 0; u < KQ_U; u++)
            if (b0 + u * S < nsb) kq_load<T>(row, b0 + u * S, i, kb[u]);
    }
    if (GU) mv_finish_gu<NT>(acc, warp, lane, N, n, y);
    else mv_finish<NT, WPR>(acc, warp, lane, part, live, r, N, n, y, accumulate);
}

/* A lane's share of a K-format super-block in the one-token kernel (k_mv1_k): Q4_K / Q5_K take
 * 4 lanes a super-block, lane i the 32 quant bytes of sub-blocks 2 i and 2 i + 1 (two 16-byte
 * loads, Q5_K the 32 high-bit bytes too: two more) and the header, so that the scales, the mins'
 * term and the float step come once per 64 elements; Q6_K in the GGUF layout takes kq_slice's 8
 * lanes (its 210-byte blocks allow only 2-byte loads), in the G8 layout 4 lanes with 16-byte
 * loads (kq_pair<QFD_Q6_KG>) */
template <int T> struct kq_pair { kq_slice<T> h[2]; };
template <> struct kq_pair<QF_TYPE_Q6_K> { kq_slice<QF_TYPE_Q6_K> h[1]; };
/* Q6_K in the G8 layout: lane i (of 4) takes half i / 2 of the super-block, its 16 element
 * offsets 16 (i % 2) .. + 15 in all four 32-element quarters: ql of quarters 0 / 2 (l0), of 1 /
 * 3 (l1), their qh (hh), three 16-byte loads; the half's 8 scales (one 8-byte load) and d */
template <> struct kq_pair<QFD_Q6_KG> { uint4 l0, l1, hh; uint2 sc; unsigned short d; };
template <int T> __host__ __device__ constexpr int kq_lanes() { return T == QF_TYPE_Q6_K ? 8 : 4; }

/* lane i (of the super-block's kq_lanes) of super-block b of the row at row */
template <int T> __device__ static inline void kq_load_pair(const uint8_t *row, int b, int i, kq_pair<T> &k) {
    if constexpr (T == QF_TYPE_Q6_K) kq_load<T>(row, b, i, k.h[0]);
    else if constexpr (T == QFD_Q6_KG) {
        const qf_q6k_fields f = qf_q6k_at(row, b, 1);
        const int half = i >> 1, o = 16 * (i & 1);
        const uint64_t pol = l2_evict_first();
        k.l0 = ld_stream16(f.ql + 64 * half + o, pol), k.l1 = ld_stream16(f.ql + 64 * half + 32 + o, pol);
        k.hh = ld_stream16(f.qh + 32 * half + o, pol);
        k.sc = __ldg((const uint2 *)(f.scales + 8 * half));
        k.d = __ldg((const unsigned short *)f.d);
    } else {
        const uint8_t *bp = row + (size_t)b * kq_block_bytes<T>();
        /* kq_slice's lanes 2 i and 2 i + 1: h[0] the header and the first 16 of the 32 bytes,
         * h[1] only the second 16 (Q5_K: and their high bits; kq_dot_pair reads the header
         * from h[0]) */
        kq_load<T>(row, b, 2 * i, k.h[0]);
        const uint64_t pol = l2_evict_first();
        constexpr size_t qo = T == QF_TYPE_Q4_K ? offsetof(block_q4_K, qs) : offsetof(block_q5_K, qs);
        k.h[1].q = ld_stream16(bp + qo + 32 * i + 16, pol);
        if constexpr (T == QF_TYPE_Q5_K) k.h[1].h = ld_stream16(bp + offsetof(block_q5_K, qh) + 16, pol);
    }
}

/* The position in shared memory of the activation's 16-byte chunk c (k_mv1_k stores chunk c
 * there). Q4_K / Q5_K: the low three bits XOR the next three, so that the 8 lanes of a quarter
 * warp (two super-blocks' 4 lanes, 64 bytes apart, 16-byte reads) take 8 different bank groups;
 * without it 4 of them shared one. Q6_K: bits 1-2 XOR bits 3-4, so that the 16 lanes of a half
 * warp (two super-blocks, two halves each, 8-byte reads) take 16 different bank pairs. H200,
 * 8B q4_k gate|up under Nsight Compute: shared-memory bank conflicts 951 k -> 128 k. */
template <int T> __device__ static inline int kq_swz(int c) {
    return kq_q6<T>() ? c ^ (((c >> 3) & 3) << 1) : c ^ ((c >> 3) & 7);
}

/* acc + lane i's share of super-block b's dot with the one token's Q8_K activation staged in
 * shared memory (aq quants, as the sums of 32, ad the scales: k_mv1_k), as a float: the lane's
 * integer sums (kq_dot's, over its share) times the super-block's scales, each product rounded
 * on its own. The lanes' shares are added with the rest of the row at the end, not per
 * super-block. */
template <int T>
__device__ static inline float kq_dot_pair(const kq_pair<T> &k, int b, int i, const int8_t *aq, const int *as,
                                           const float *ad, float acc) {
    if constexpr (T == QF_TYPE_Q4_K || T == QF_TYPE_Q5_K) {
        const float d = h2f_bits((uint16_t)(k.h[0].dd & 0xFFFF)), dmin = h2f_bits((uint16_t)(k.h[0].dd >> 16));
        int sc1, m1, sc2, m2, d1 = 0, d2 = 0;
        k4_scale_min_pair(i, k.h[0].s0, k.h[0].s1, k.h[0].s2, &sc1, &m1, &sc2, &m2);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int lo[4], hi[4];
            kq_unpack_q<T>(k.h[h], i, lo, hi);
            const int c = 16 * b + 4 * i + h; /* the 16-byte chunk of the low nibbles' activation */
            const int4 a0 = ((const int4 *)aq)[kq_swz<T>(c)], a1 = ((const int4 *)aq)[kq_swz<T>(c + 2)];
            d1 = __dp4a(lo[0], a0.x, d1), d1 = __dp4a(lo[1], a0.y, d1), d1 = __dp4a(lo[2], a0.z, d1);
            d1 = __dp4a(lo[3], a0.w, d1);
            d2 = __dp4a(hi[0], a1.x, d2), d2 = __dp4a(hi[1], a1.y, d2), d2 = __dp4a(hi[2], a1.z, d2);
            d2 = __dp4a(hi[3], a1.w, d2);
        }
        const int isum = sc1 * d1 + sc2 * d2, msum = m1 * as[8 * b + 2 * i] + m2 * as[8 * b + 2 * i + 1];
        const float xdb = ad[b];
        return acc + __fsub_rn(__fmul_rn(__fmul_rn(d, xdb), (float)isum), __fmul_rn(__fmul_rn(dmin, xdb), (float)msum));
    } else if constexpr (T == QFD_Q6_KG) {
        /* quarter qq of the lane's 16 offsets: ql's low nibbles (qq 0, 1) or high (2, 3) of l0
         * (qq even) or l1 (odd), qh's bits 2 qq, 2 qq + 1; scale 2 qq + (i & 1) of the half */
        const int half = i >> 1;
        const int c0 = 16 * b + 8 * half + (i & 1); /* the activation's 16-byte chunk of quarter 0 */
        const unsigned l0[4] = {k.l0.x, k.l0.y, k.l0.z, k.l0.w}, l1[4] = {k.l1.x, k.l1.y, k.l1.z, k.l1.w},
                       hh[4] = {k.hh.x, k.hh.y, k.hh.z, k.hh.w};
        const unsigned scw = (i & 1) ? __byte_perm(k.sc.x, k.sc.y, 0x7531) : __byte_perm(k.sc.x, k.sc.y, 0x6420);
        int isum = 0;
#pragma unroll
        for (int qq = 0; qq < 4; qq++) {
            const int4 a = ((const int4 *)aq)[kq_swz<T>(c0 + 2 * qq)];
            const int av[4] = {a.x, a.y, a.z, a.w};
            int dq = 0;
#pragma unroll
            for (int v = 0; v < 4; v++) {
                const unsigned l = (qq & 1) ? l1[v] : l0[v];
                const int q = (int)__vsub4(((qq < 2 ? l : l >> 4) & 0x0F0F0F0Fu) | (((hh[v] >> (2 * qq)) & 0x03030303u) << 4),
                                           0x20202020u);
                dq = __dp4a(q, av[v], dq);
            }
            isum += (int)(signed char)(scw >> (8 * qq)) * dq;
        }
        return acc + __fmul_rn(__fmul_rn(h2f_bits(k.d), ad[b]), (float)isum);
    } else {
        const int half = i >> 2, w = i & 3;
        const int o = 256 * b + 128 * half + 8 * w; /* the byte offset of the first quarter's 8 */
        int q[4][2], isum = 0;
        kq_unpack6(k.h[0], q);
#pragma unroll
        for (int qq = 0; qq < 4; qq++) {
            const int oq = o + 32 * qq;
            const int2 a = *(const int2 *)(aq + 16 * kq_swz<T>(oq >> 4) + (oq & 15));
            isum += k.h[0].sc[qq] * __dp4a(q[qq][1], a.y, __dp4a(q[qq][0], a.x, 0));
        }
        return acc + __fmul_rn(__fmul_rn(h2f_bits(k.h[0].d), ad[b]), (float)isum);
    }
}

/* One token through K-format rows: each warp takes one row (k_matvec_k's WPR 1 rows and ends:
 * gu_row, mv_finish, mv_finish_gu), kq_lanes lanes a super-block (kq_pair), so that a warp step
 * covers 32 / kq_lanes super-blocks; U steps in flight, the first before pdl_wait. After the
 * wait the block stages the token's Q8_K activation in shared memory (K quants, the K / 32 sums,
 * the K / 256 scales: K + K / 8 + K / 64 bytes; the quants' 16-byte chunks swizzled, kq_swz),
 * and each lane keeps its own float sum of its shares (kq_dot_pair), reduced once per row at the
 * end: no shuffles and no L2 round trip per super-block (k_matvec_k, under Nsight Compute on the
 * 8B q4_k shape, reached 24-45% of the DRAM bandwidth, latency-bound). Against k_matvec_k only
 * the rounding of the partial products and the order of the sums differ. GU: the gate|up + SiLU
 * form, as k_matvec_k's. Launched with U 2: H200, 8B decode (`bench_gpu --decode-only
 * --decode-pos 1`, docs/gpu.md "Session 22"): q4_k_m 427.0 tok/s, q4_k 506.6, q6_k 313.1
 * against 363.3, 437.5, 256.8 with 8 lanes a Q4_K super-block, no swizzle and U 4. Q6_K's G8
 * layout (U 1): q6_k 410.1 / 412.0, q4_k_m 458-463 against 313.0 / 433.0 in its GGUF layout
 * (docs/gpu.md "Session 24"). */
template <int T, int U, bool GU>
__global__ void __launch_bounds__(MV_WARPS * 32)
    k_mv1_k(const uint8_t *__restrict__ W, size_t rb, int K, int N, const int8_t *__restrict__ xq,
            const float *__restrict__ xd, const int *__restrict__ xs, float *y, int accumulate) {
    constexpr int LP = kq_lanes<T>(), S = 32 / LP;
    extern __shared__ int4 smk[];
    pdl_trigger();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, sub = lane / LP, i = lane % LP;
    const int r = GU ? gu_row(warp, N) : (int)blockIdx.x * MV_WARPS + warp;
    const bool live = GU ? (2 * (int)blockIdx.x + (warp & 1)) < N : r < N;
    const uint8_t *row = W + (size_t)(live ? r : 0) * rb;
    const int nsb = K / 256, nrb = live ? nsb : 0; /* the row's super-blocks: none past N */
    float acc[1] = {0.0f};
    kq_pair<T> kb[U];
    int b0 = sub;
#pragma unroll
    for (int u = 0; u < U; u++)
        if (b0 + S * u < nrb) kq_load_pair<T>(row, b0 + S * u, i, kb[u]);
    pdl_wait();
    int8_t *aq = (int8_t *)smk;
    int *as = (int *)(aq + K);
    float *ad = (float *)(as + K / 32);
    for (int x = threadIdx.x; x < K / 16; x += blockDim.x) smk[kq_swz<T>(x)] = __ldg((const int4 *)xq + x);
    for (int x = threadIdx.x; x < K / 32; x += blockDim.x) as[x] = __ldg(xs + x);
    for (int x = threadIdx.x; x < nsb; x += blockDim.x) ad[x] = __ldg(xd + x);
    __syncthreads();
    while (b0 < nrb) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int b = b0 + S * u;
            if (b >= nrb) break;
            acc[0] = kq_dot_pair<T>(kb[u], b, i, aq, as, ad, acc[0]);
        }
        b0 += S * U;
#pragma unroll
        for (int u = 0; u < U; u++)
            if (b0 + S * u < nrb) kq_load_pair<T>(row, b0 + S * u, i, kb[u]);
    }
    if (GU) mv_finish_gu<1>(acc, warp, lane, N, 1, y);
    else mv_finish<1, 1>(acc, warp, lane, 0, live, r, N, 1, y, accumulate);
}
/* k_mv1_k's shared memory: the Q8_K activation of one token of width K */
static size_t mv1k_smem(int K) { return (size_t)K + (size_t)K / 8 + (size_t)K / 64; }

/* can w take k_matvec_k: a K format with the kernel's alignment (16-byte rows for Q4_K / Q5_K,
 * 2-byte for Q6_K) and 16-byte aligned activations and scratch */
static bool kq_ok(const dweight *w, const float *x, const void *xq) {
    if (!xq || ((uintptr_t)xq % 16) || ((uintptr_t)x % 16) || w->ne0 % 256) return false;
    if (w->type == QF_TYPE_Q4_K || w->type == QF_TYPE_Q5_K || (w->type == QF_TYPE_Q6_K && w->g8))
        return ((uintptr_t)w->d % 16) == 0 && w->row_bytes % 16 == 0;
    return w->type == QF_TYPE_Q6_K && ((uintptr_t)w->d % 2) == 0;
}

/* the K-format matvec (kq_ok); GU: the gate|up + SiLU form, N = F. ready: xq already holds x's
 * Q8_K activation (the caller's launch_quant_act_k: forward_layers quantizes once for separate
 * q, k, v), else x is quantized here */
template <bool GU>
static void launch_matvec_k(const dweight *w, const float *x, int n, int N, float *y, bool accumulate, void *xq,
                            cudaStream_t s, bool ready) {
    const int K = (int)w->ne0;
    if (!ready) launch_quant_act_k(x, n, K, xq, s);
    const act_q a = act_q_view(xq, n, K);
    const int8_t *qs = a.qs;
    const float *xd = a.xd;
    const int *xs = a.xs;
    const int acc = accumulate;
    const bool split = !GU && N < MV_SPLIT_ROWS;
    if (n == 1 && !split && mv1k_smem(K) <= 48 * 1024) { /* one token: the row-group kernel */
        const dim3 g1(GU ? nblk((size_t)N, 2) : nblk((size_t)N, MV_WARPS));
        const size_t sm = mv1k_smem(K);
#define QF_MV1K(TY) cu_launch(k_mv1_k<TY, 2, GU>, g1, dim3(MV_WARPS * 32), sm, s, w->d, w->row_bytes, K, N, qs, xd, xs, y, acc)
        /* Q6_K's G8 layout with one step in flight (58 bytes a lane): H200, 8B q6_k decode 410.1 /
         * 412.0 tok/s against 380.9 / 381.6 with 2, 381.0 / 377.8 with 3 (docs/gpu.md "Session 24") */
        if (w->type == QF_TYPE_Q4_K) QF_MV1K(QF_TYPE_Q4_K);
        else if (w->type == QF_TYPE_Q5_K) QF_MV1K(QF_TYPE_Q5_K);
        else if (w->g8) cu_launch(k_mv1_k<QFD_Q6_KG, 1, GU>, g1, dim3(MV_WARPS * 32), sm, s, w->d, w->row_bytes, K, N, qs, xd, xs, y, acc);
        else QF_MV1K(QF_TYPE_Q6_K);
#undef QF_MV1K
        return;
    }
    const dim3 grid(GU ? (unsigned)((N + 1) / 2) : split ? (unsigned)N : nblk((size_t)N, MV_WARPS));
#define QF_MVK(TY, NT, WPR) cu_launch(k_matvec_k<TY, NT, WPR, GU>, grid, dim3(MV_WARPS * 32), 0, s, w->d, w->row_bytes, K, N, qs, xd, xs, n, y, acc)
#define QF_MVK_T(TY)                                                                                    \
    do {                                                                                                \
        if (split && n == 1) QF_MVK(TY, 1, MV_WARPS);                                                   \
        else if (split) QF_MVK(TY, MATVEC_MAX, MV_WARPS);                                               \
        else if (n == 1) QF_MVK(TY, 1, 1);                                                              \
        else QF_MVK(TY, MATVEC_MAX, 1);                                                                 \
    } while (0)
    if (w->type == QF_TYPE_Q4_K) QF_MVK_T(QF_TYPE_Q4_K);
    else if (w->type == QF_TYPE_Q5_K) QF_MVK_T(QF_TYPE_Q5_K);
    else if (w->g8) QF_MVK_T(QFD_Q6_KG);
    else QF_MVK_T(QF_TYPE_Q6_K);
#undef QF_MVK_T
#undef QF_MVK
}


/* the G8 kernels of q4_0 (Q8 false) or q8_0 rows: one token over many rows in row groups */
template <bool GU, bool Q8>
static void g8_launch(const dweight *w, int n, int N, float *y, const int8_t *qs, const float *xd, const int *xs, int acc,
                      cudaStream_t s, const norm_fold *nfp = NULL) {
    const int K = (int)w->ne0;
    /* q8_0: 2 rows a group, 2 blocks in flight (64 bytes a lane and row): H200, 8B q8_0 decode
     * 402.7 / 398.1 tok/s against 350.8 / 351.4 with 4 rows and 1 block, 399.4 / 399.7 with 4 and
     * 2, 377.1 / 372.9 with 2 and 3, 352.9 / 354.6 with 1 and 2 (docs/gpu.md "Session 24") */
    constexpr int U = 2, RR = Q8 ? 2 : 4;
    const norm_fold nf = nfp ? *nfp : norm_fold{};
    if (n == 1 && (GU || N >= MV_SPLIT_ROWS)) { /* one token: the grouped kernels */
        if (GU) cu_launch(k_mv1_q4g<RR, U, 2, 2, true, Q8>, dim3(nblk((size_t)N, RR)), dim3(128), 0, s, w->d, w->row_bytes, K, N, qs, xd, xs, y, 0, nf);
        else if (K >= 8192) cu_launch(k_mv1_q4g<2, U, 2, 2, false, Q8>, dim3(nblk((size_t)N, 4)), dim3(128), 0, s, w->d, w->row_bytes, K, N, qs, xd, xs, y, acc, nf);
        else cu_launch(k_mv1_q4g<RR, U, 2, 2, false, Q8>, dim3(nblk((size_t)N, 2 * RR)), dim3(128), 0, s, w->d, w->row_bytes, K, N, qs, xd, xs, y, acc, nf);
        return;
    }
    if (GU) { /* n > 1 here */
        const dim3 grid((unsigned)((N + 1) / 2));
        cu_launch(k_matvec_q4g<MATVEC_MAX, 1, true, Q8>, grid, dim3(MV_WARPS * 32), 0, s, w->d, w->row_bytes, K, N, qs, xd, xs, n, y, 0);
        return;
    }
    const bool split = N < MV_SPLIT_ROWS; /* as launch_matvec: 4 warps share a row */
    const dim3 grid(split ? (unsigned)N : nblk((size_t)N, MV_WARPS));
    if (split && n == 1) cu_launch(k_matvec_q4g<1, MV_WARPS, false, Q8>, grid, dim3(MV_WARPS * 32), 0, s, w->d, w->row_bytes, K, N, qs, xd, xs, n, y, acc);
    else if (split) cu_launch(k_matvec_q4g<MATVEC_MAX, MV_WARPS, false, Q8>, grid, dim3(MV_WARPS * 32), 0, s, w->d, w->row_bytes, K, N, qs, xd, xs, n, y, acc);
    else cu_launch(k_matvec_q4g<MATVEC_MAX, 1, false, Q8>, grid, dim3(MV_WARPS * 32), 0, s, w->d, w->row_bytes, K, N, qs, xd, xs, n, y, acc);
}

/* the G8 matvec on int8 activations (xq: ACT_Q_BYTES(n, K) of 16-byte aligned scratch), q4_0 or
 * q8_0 rows; GU: the gate|up + SiLU form, N = F */
template <bool GU>
static void launch_matvec_q4g(const dweight *w, const float *x, int n, int N, float *y, bool accumulate, void *xq,
                              cudaStream_t s, bool ready) {
    const int K = (int)w->ne0;
    if (!ready) launch_quant_act(x, n, K, xq, s);
    const act_q a = act_q_view(xq, n, K);
    const int8_t *qs = a.qs;
    const float *xd = a.xd;
    const int *xs = a.xs;
    const int acc = accumulate;
    if (w->type == QF_TYPE_Q8_0) g8_launch<GU, true>(w, n, N, y, qs, xd, xs, acc, s);
    else g8_launch<GU, false>(w, n, N, y, qs, xd, xs, acc, s);
}

/* norm_fold (cuda_common.cuh): the producer is a one-token G8 matvec of at least MV_SPLIT_ROWS
 * rows, 32 a block (8 groups of 4 rows, 2 warps a row: 16 warps); the consumer one that
 * g8_launch sends to the grouped kernels (k_mv1_q4g; gate|up as launch_matvec_gu takes it) */
static bool fold_g8(const dweight *w) {
    return w->d && w->g8 && (w->type == QF_TYPE_Q4_0 || w->type == QF_TYPE_Q8_0) && ((uintptr_t)w->d % 16) == 0;
}
bool fold_prod_ok(const dweight *w) { return fold_g8(w) && w->ne1 >= MV_SPLIT_ROWS && w->ne1 % 32 == 0; }
bool fold_cons_ok(const dweight *w, bool gu) { return fold_g8(w) && w->ne1 >= (gu ? MV_GU_ROWS : MV_SPLIT_ROWS); }
void launch_matvec_fold(const dweight *w, const float *x_in, void *xq, bool ready, float *x, const norm_fold *nf,
                        cudaStream_t s) {
    const int K = (int)w->ne0, N = (int)w->ne1;
    const dim3 grid((unsigned)(N / 32));
    const act_q a = act_q_view(xq, 1, K);
    if (!ready) launch_quant_act(x_in, 1, K, xq, s);
    if (w->type == QF_TYPE_Q8_0)
        cu_launch(k_mv1_q4g<4, 2, 8, 2, false, true, true>, grid, dim3(512), 0, s, w->d, w->row_bytes, K, N, a.qs, a.xd,
                  a.xs, x, 1, *nf);
    else
        cu_launch(k_mv1_q4g<4, 2, 8, 2, false, false, true>, grid, dim3(512), 0, s, w->d, w->row_bytes, K, N, a.qs, a.xd,
                  a.xs, x, 1, *nf);
}
void launch_matvec_norm(const dweight *w, float *y, bool gu, const norm_fold *nf, cudaStream_t s) {
    const int K = (int)w->ne0, N = gu ? (int)(w->ne1 / 2) : (int)w->ne1;
    const act_q a = act_q_view(nf->xq, 1, K);
    if (gu && w->type == QF_TYPE_Q8_0) g8_launch<true, true>(w, 1, N, y, a.qs, a.xd, a.xs, 0, s, nf);
    else if (gu) g8_launch<true, false>(w, 1, N, y, a.qs, a.xd, a.xs, 0, s, nf);
    else if (w->type == QF_TYPE_Q8_0) g8_launch<false, true>(w, 1, N, y, a.qs, a.xd, a.xs, 0, s, nf);
    else g8_launch<false, false>(w, 1, N, y, a.qs, a.xd, a.xs, 0, s, nf);
}

/* y[n][N] (+)= x[n][K] . W^T for n <= MATVEC_MAX: the wide kernel where the rows are 8-byte
 * aligned, else the sub-block-per-lane kernel */
static void launch_matvec(const dweight *w, const float *x, int n, float *y, bool accumulate, void *xq, cudaStream_t s,
                          bool ready) {
    const int K = (int)w->ne0, N = (int)w->ne1;
    if (w->g8 && w->type != QF_TYPE_Q6_K && xq && ((uintptr_t)xq % 16) == 0 && ((uintptr_t)w->d % 16) == 0) {
        launch_matvec_q4g<false>(w, x, n, N, y, accumulate, xq, s, ready);
        return;
    }
    if (kq_ok(w, x, xq)) {
        launch_matvec_k<false>(w, x, n, N, y, accumulate, xq, s, ready);
        return;
    }
    const int dt = dw_type(w);
    const bool wide = w->row_bytes % 8 == 0 && ((uintptr_t)w->d % 8) == 0 && ((uintptr_t)x % 16) == 0;
    const bool h = (w->type == QF_TYPE_F16 || w->type == QF_TYPE_BF16) && w->row_bytes % 16 == 0 &&
                   ((uintptr_t)w->d % 16) == 0 && ((uintptr_t)x % 16) == 0 && K % 8 == 0;
    const dim3 grid(nblk((size_t)N, MV_WARPS));
    const bool q0 = !w->g8 && (w->type == QF_TYPE_Q4_0 || w->type == QF_TYPE_Q8_0) && ((uintptr_t)w->d % 2) == 0 &&
                    ((uintptr_t)x % 16) == 0;
    /* few rows (MV_SPLIT_ROWS): 4 warps share each row so the grid fills the GPU */
    const bool split = N < MV_SPLIT_ROWS;
    const dim3 g4(split ? (unsigned)N : grid.x);
#define QF_MV(KERN, ...)                                                                                        \
    do {                                                                                                        \
        if (split) cu_launch(KERN<__VA_ARGS__, MV_WARPS>, g4, dim3(MV_WARPS * 32), 0, s, w->d, w->row_bytes, K, N, x, n, y, (int)accumulate); \
        else cu_launch(KERN<__VA_ARGS__, 1>, g4, dim3(MV_WARPS * 32), 0, s, w->d, w->row_bytes, K, N, x, n, y, (int)accumulate);           \
    } while (0)
    if (q0 && xq && ((uintptr_t)xq % 16) == 0 && K % QK == 0) {
        /* int8 activations: quantized once per call, then __dp4a (the CPU vec_dot's numerics) */
        if (!ready) launch_quant_act(x, n, K, xq, s);
        const act_q a = act_q_view(xq, n, K);
        const int8_t *qs = a.qs;
        const float *xd = a.xd;
#define QF_MVQ(T, NT)                                                                                                   \
    do {                                                                                                                \
        if (split) cu_launch(k_matvec_dp4a<T, NT, MV_WARPS>, g4, dim3(MV_WARPS * 32), 0, s, w->d, w->row_bytes, K, N, qs, xd, n, y, (int)accumulate); \
        else cu_launch(k_matvec_dp4a<T, NT, 1>, g4, dim3(MV_WARPS * 32), 0, s, w->d, w->row_bytes, K, N, qs, xd, n, y, (int)accumulate);           \
    } while (0)
        if (w->type == QF_TYPE_Q4_0 && n == 1) QF_MVQ(QF_TYPE_Q4_0, 1);
        else if (w->type == QF_TYPE_Q4_0) QF_MVQ(QF_TYPE_Q4_0, MATVEC_MAX);
        else if (n == 1) QF_MVQ(QF_TYPE_Q8_0, 1);
        else QF_MVQ(QF_TYPE_Q8_0, MATVEC_MAX);
#undef QF_MVQ
    } else if (q0) {
        if (w->type == QF_TYPE_Q4_0 && n == 1) QF_MV(k_matvec_q0, QF_TYPE_Q4_0, 1);
        else if (w->type == QF_TYPE_Q4_0) QF_MV(k_matvec_q0, QF_TYPE_Q4_0, MATVEC_MAX);
        else if (n == 1) QF_MV(k_matvec_q0, QF_TYPE_Q8_0, 1);
        else QF_MV(k_matvec_q0, QF_TYPE_Q8_0, MATVEC_MAX);
    } else if (h && n == 1 && !split) { /* one token: the grouped kernel */
        const bool bf = w->type == QF_TYPE_BF16;
        const dim3 g1(nblk((size_t)N, 4));
        const int acc = accumulate;
        if (bf) cu_launch(k_mv1_h<true, 4, 2, 1, 4, false>, g1, dim3(128), 0, s, w->d, w->row_bytes, K, N, x, y, acc);
        else cu_launch(k_mv1_h<false, 4, 2, 1, 4, false>, g1, dim3(128), 0, s, w->d, w->row_bytes, K, N, x, y, acc);
    } else if (h) {
        const bool bf = w->type == QF_TYPE_BF16;
        /* one token reaches here only with split rows (the grouped kernel took the others) */
        if (n == 1 && bf) cu_launch(k_matvec_h<true, 1, MV_WARPS>, g4, dim3(MV_WARPS * 32), 0, s, w->d, w->row_bytes, K, N, x, n, y, (int)accumulate);
        else if (n == 1) cu_launch(k_matvec_h<false, 1, MV_WARPS>, g4, dim3(MV_WARPS * 32), 0, s, w->d, w->row_bytes, K, N, x, n, y, (int)accumulate);
        else if (bf) QF_MV(k_matvec_h, true, MATVEC_MAX);
        else QF_MV(k_matvec_h, false, MATVEC_MAX);
#undef QF_MV
    } else if (wide && n == 1) {
        QF_TYPE_DISPATCH(dt, (cu_launch(k_matvec_wide<TT, 1>, dim3(nblk((size_t)N, MV_WARPS)), dim3(MV_WARPS * 32), 0, s,
                                        w->d, w->row_bytes, K, N, x, n, y, (int)accumulate)));
    } else if (wide) {
        QF_TYPE_DISPATCH(dt, (cu_launch(k_matvec_wide<TT, MATVEC_MAX>, dim3(nblk((size_t)N, MV_WARPS)), dim3(MV_WARPS * 32), 0, s,
                                        w->d, w->row_bytes, K, N, x, n, y, (int)accumulate)));
    } else {
        QF_TYPE_DISPATCH(dt, (cu_launch(k_matvec<TT>, dim3(nblk((size_t)N, 4)), dim3(128), 0, s, w->d, w->row_bytes, K, N, x,
                                        n, y, (int)accumulate)));
    }
}

/* hb[n][F] = SiLU(x W_gate^T) * (x W_up^T) from the fused [2F][K] gate|up weight, one launch
 * (GU kernels); false when the weight or its size does not fit them (the caller then runs the
 * matvec and k_silu_gu) */
bool launch_matvec_gu(const dweight *w, const float *x, int n, int F, float *hb, void *xq, cudaStream_t s, bool ready) {
    const int K = (int)w->ne0;
    if (n > MATVEC_MAX || w->ne1 != 2 * (int64_t)F || 2 * F < MV_GU_ROWS || ((uintptr_t)x % 16)) return false;
    const dim3 grid((unsigned)((F + 1) / 2));
    if (w->g8 && w->type != QF_TYPE_Q6_K) { /* q4_0, q8_0 */
        if (!xq || ((uintptr_t)xq % 16) || ((uintptr_t)w->d % 16)) return false;
        launch_matvec_q4g<true>(w, x, n, F, hb, false, xq, s, ready);
        return true;
    }
    if (kq_ok(w, x, xq)) {
        launch_matvec_k<true>(w, x, n, F, hb, false, xq, s, ready);
        return true;
    }
    if ((w->type == QF_TYPE_Q4_0 || w->type == QF_TYPE_Q8_0) && xq && ((uintptr_t)xq % 16) == 0 && K % QK == 0 &&
        ((uintptr_t)w->d % 2) == 0) {
        if (!ready) launch_quant_act(x, n, K, xq, s);
        const act_q a = act_q_view(xq, n, K);
        const int8_t *qs = a.qs;
        const float *xd = a.xd;
#define QF_GUQ(T, NT) cu_launch(k_matvec_dp4a<T, NT, 1, true>, grid, dim3(MV_WARPS * 32), 0, s, w->d, w->row_bytes, K, F, qs, xd, n, hb, 0)
        if (w->type == QF_TYPE_Q4_0 && n == 1) QF_GUQ(QF_TYPE_Q4_0, 1);
        else if (w->type == QF_TYPE_Q4_0) QF_GUQ(QF_TYPE_Q4_0, MATVEC_MAX);
        else if (n == 1) QF_GUQ(QF_TYPE_Q8_0, 1);
        else QF_GUQ(QF_TYPE_Q8_0, MATVEC_MAX);
#undef QF_GUQ
        return true;
    }
    if ((w->type == QF_TYPE_F16 || w->type == QF_TYPE_BF16) && w->row_bytes % 16 == 0 && ((uintptr_t)w->d % 16) == 0 &&
        K % 8 == 0) {
        const bool bf = w->type == QF_TYPE_BF16;
        if (n == 1) { /* one token: the grouped kernel */
            const dim3 g1(nblk((size_t)F, 2));
            if (bf) cu_launch(k_mv1_h<true, 2, 2, 2, 2, true>, g1, dim3(128), 0, s, w->d, w->row_bytes, K, F, x, hb, 0);
            else cu_launch(k_mv1_h<false, 2, 2, 2, 2, true>, g1, dim3(128), 0, s, w->d, w->row_bytes, K, F, x, hb, 0);
            return true;
        }
        if (bf) cu_launch(k_matvec_h<true, MATVEC_MAX, 1, true>, grid, dim3(MV_WARPS * 32), 0, s, w->d, w->row_bytes, K, F, x, n, hb, 0);
        else cu_launch(k_matvec_h<false, MATVEC_MAX, 1, true>, grid, dim3(MV_WARPS * 32), 0, s, w->d, w->row_bytes, K, F, x, n, hb, 0);
        return true;
    }
    return false;
}

__global__ void k_f32_to_f16(const float *x, size_t n, __half *y) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2half_rn(x[i]);
}

/* one block per token; writes the f32 result to out and/or its f16 rounding to out16 (either
 * may be NULL): the f16 values are the same as converting out afterwards */
/* ---------------------------------------------------------------------------------------- */
/* operations on device buffers                                                              */

void launch_dequant(const dweight *w, void *dst, bool f32, cudaStream_t s) {
    const size_t nthr = (size_t)w->ne1 * (w->ne0 / 32);
    if (f32) {
        QF_TYPE_DISPATCH(dw_type(w), (k_dequant<TT, float><<<nblk(nthr, 256), 256, 0, s>>>(w->d, w->row_bytes, w->ne1, (int)w->ne0, (float *)dst)));
    } else {
        QF_TYPE_DISPATCH(dw_type(w), (k_dequant<TT, __half><<<nblk(nthr, 256), 256, 0, s>>>(w->d, w->row_bytes, w->ne1, (int)w->ne0, (__half *)dst)));
    }
}

void launch_embed(const dweight *E, const int32_t *tok, int n, int d, float *x, cudaStream_t s) {
    QF_TYPE_DISPATCH(dw_type(E), (cu_launch(k_embed<TT>, dim3(nblk((size_t)n * (d / 32), 128)), dim3(128), 0, s,
                                            (const uint8_t *)E->d, E->row_bytes, tok, n, d, x)));
}

void launch_embed_fold(const dweight *E, const int32_t *tok, float *x, const norm_fold *nf, cudaStream_t s) {
    QF_TYPE_DISPATCH(dw_type(E), (cu_launch(k_embed_fold<TT>, dim3(nblk((size_t)(nf->d / 32), 4)), dim3(128), 0, s,
                                            (const uint8_t *)E->d, E->row_bytes, tok, x, *nf)));
}

/* y[n][N] (+)= x[n][K] . W^T on device buffers; wdeq/xh are scratch of the right sizes */
qf_status dev_matmul(cublasHandle_t blas, const dweight *w, const float *x, int n, float *y, bool accumulate,
                     int route, void *wdeq, __half *xh, cudaStream_t s, qf_error *err, bool xq_ready) {
    qf_status st = QF_OK;
    const int K = (int)w->ne0, N = (int)w->ne1;
    if (route == MM_AUTO) route = n <= MATVEC_MAX ? MM_MATVEC : MM_GEMM_F16;
    if (route == MM_MATVEC && n > MATVEC_MAX) route = MM_GEMM_F16;
    /* an f32 weight whose rows are not whole 32-element sub-blocks (an MoE expert's down
     * projection of width 48, say): sgemm reads it in place, at any n */
    if (w->type == QF_TYPE_F32 && K % 32) route = MM_GEMM_F32;
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    if (route == MM_MATVEC) {
        launch_matvec(w, x, n, y, accumulate, xh, s, xq_ready);
    } else if (route == MM_GEMM_F32 || w->type == QF_TYPE_F32) {
        const float *W = (const float *)w->d;
        if (w->type != QF_TYPE_F32) {
            launch_dequant(w, wdeq, true, s);
            W = (const float *)wdeq;
        }
        CKB(cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, N, n, K, &one, W, K, x, K, &beta, y, N));
    } else {
        const __half *W = (const __half *)w->d;
        if (w->h16) W = w->h16;
        else if (w->type != QF_TYPE_F16) {
            launch_dequant(w, wdeq, false, s);
            W = (const __half *)wdeq;
        }
        size_t nx = (size_t)n * K;
        k_f32_to_f16<<<nblk(nx, 256), 256, 0, s>>>(x, nx, xh);
        CKB(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, N, n, K, &one, W, CUDA_R_16F, K, xh, CUDA_R_16F, K, &beta, y,
                         CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    {
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) st = cuda_fail(err, e, "matmul kernel");
    }
done:
    return st;
}

/* y[n][N] (+)= xh[n][K] . W^T, the f16 route with f16 activations already in place */
qf_status dev_gemm_h(cublasHandle_t blas, const dweight *w, const __half *xh, int n, void *y, bool accumulate,
                     void *wdeq, qf_error *err, cudaDataType yt) {
    qf_status st = QF_OK;
    const int K = (int)w->ne0, N = (int)w->ne1;
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    const __half *W = (const __half *)w->d;
    if (w->h16) W = w->h16;
    else if (w->type != QF_TYPE_F16) {
        cudaStream_t s = 0;
        cublasGetStream(blas, &s);
        launch_dequant(w, wdeq, false, s);
        W = (const __half *)wdeq;
    }
    CKB(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, N, n, K, &one, W, CUDA_R_16F, K, xh, CUDA_R_16F, K, &beta, y, yt,
                     N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    {
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) st = cuda_fail(err, e, "matmul kernel");
    }
done:
    return st;
}

/* can w run dev_gemm_h: f16 or cached-f16 weights, or a per-call dequantization that fits wdeq */
/* GEMM microbenchmark for bench_gpu: y[M][N] = x[M][K] . W[N][K]^T as the prefill route runs
 * it (cublasGemmEx, f16 inputs, CUBLAS_COMPUTE_32F), with f32 or f16 output; mean ms over
 * iters after a warm-up. Inputs are small random values. */
__global__ void k_fill_h(__half *p, size_t n, uint32_t seed) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        p[i] = __float2half(((h & 0xFFFF) / 65536.0f - 0.5f) * 0.1f);
    }
}
qf_status gemm_bench(int M, int N, int K, int flags, int iters, double *ms, qf_error *err) {
    qf_status st = QF_OK;
    cublasHandle_t blas = NULL;
    __half *W = NULL, *X = NULL;
    void *Y = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    const bool out_f16 = (flags & 1) && !(flags & 2);
    const int copies = flags & 4 ? 4 : 1;
    const size_t wn = (size_t)N * K;
    const float one = 1.0f, beta = flags & 2 ? 1.0f : 0.0f;
    float t = 0;
    if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) return cu_fail(err, QF_ERR_DEVICE, "cublasCreate failed");
    CK(cudaMalloc((void **)&W, wn * 2 * copies));
    CK(cudaMalloc((void **)&X, (size_t)M * K * 2));
    CK(cudaMalloc(&Y, (size_t)M * N * 4));
    CK(cudaMemset(Y, 0, (size_t)M * N * 4));
    k_fill_h<<<nblk(wn * copies, 256), 256>>>(W, wn * copies, 1);
    k_fill_h<<<nblk((size_t)M * K, 256), 256>>>(X, (size_t)M * K, 2);
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int it = -2; it < iters; it++) {
        if (it == 0) CK(cudaEventRecord(e0, 0));
        const __half *Wi = W + wn * (size_t)((it + 2) % copies);
        CKB(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, Wi, CUDA_R_16F, K, X, CUDA_R_16F, K, &beta, Y,
                         out_f16 ? CUDA_R_16F : CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    CK(cudaEventRecord(e1, 0));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&t, e0, e1));
    *ms = t / iters;
done:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(W), cudaFree(X), cudaFree(Y);
    cublasDestroy(blas);
    return st;
}
