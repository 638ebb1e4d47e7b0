/* cuda_backend.cu: the CUDA backend. It runs qf_decode's contract on the GPU with the same
 * math as forward.c (the CPU oracle it is certified against, tests/test_cuda.c):
 *
 *   weights stay on the GPU in their stored GGUF type (F32 F16 BF16 Q4_0 Q5_0 Q8_0 Q4_K Q5_K
 *   Q6_K); every format is read through one device function, deq32<T>(row, sub-block), which
 *   dequantizes 32 consecutive elements exactly as quant.c's oracle does;
 *   a batch of n > 8 tokens (prefill) dequantizes each weight to f16 (F16 weights are used in
 *   place) and multiplies with cuBLAS (f16 x f16, f32 accumulation; QF_CUDA_GEMM=f32 selects
 *   f32 dequantization and sgemm); n <= 8 (decode) uses a fused dequantize-and-dot kernel with
 *   f32 activations, one warp per output row;
 *   RMSNorm, RoPE (NORM and NEOX, cos/sin tables computed on the host by the same f32 theta
 *   recurrence as forward.c's rope_tables), bias, SiLU*up and residuals are small kernels;
 *   attention is one warp per (query, head): q k^T, causal online softmax and the V sum in
 *   one pass over the cache, which lives on the GPU in f32, f16, q8_0 or q4_0 (ggml blocks
 *   quantized on the GPU with ggml's reference rounding);
 *   with a tap set, K (post-RoPE), V and the activation sites are read back to the host and
 *   handed to the tap in forward.c's layout. */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_ops.h"
#include "engine/engine.h"
}

#define MATVEC_MAX 8   /* batches up to this many tokens use the fused matvec kernel */
#define HD_MAX 256     /* attention keeps head_dim / 32 values per lane in registers */

/* ---------------------------------------------------------------------------------------- */
/* block formats                                                                             */

__host__ __device__ static inline float h2f(const uint8_t *p) {
    uint16_t u = (uint16_t)(p[0] | (p[1] << 8));
    __half_raw r;
    r.x = u;
    return __half2float(__half(r));
}

__host__ __device__ static inline void k4_scale_min(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Dequantize elements [32*sb, 32*sb+32) of a row of type T into y[32]. */
template <int T> __host__ __device__ static inline void deq32(const uint8_t *row, int sb, float *y);

template <> __host__ __device__ inline void deq32<QF_TYPE_F32>(const uint8_t *row, int sb, float *y) {
    const float *p = (const float *)row + sb * 32;
    for (int j = 0; j < 32; j++) y[j] = p[j];
}
template <> __host__ __device__ inline void deq32<QF_TYPE_F16>(const uint8_t *row, int sb, float *y) {
    const __half *p = (const __half *)row + sb * 32;
    for (int j = 0; j < 32; j++) y[j] = __half2float(p[j]);
}
template <> __host__ __device__ inline void deq32<QF_TYPE_BF16>(const uint8_t *row, int sb, float *y) {
    const uint16_t *p = (const uint16_t *)row + sb * 32;
    for (int j = 0; j < 32; j++) {
        uint32_t u = (uint32_t)p[j] << 16;
        float f;
        memcpy(&f, &u, 4);
        y[j] = f;
    }
}
template <> __host__ __device__ inline void deq32<QF_TYPE_Q4_0>(const uint8_t *row, int sb, float *y) {
    const uint8_t *b = row + (size_t)sb * 18;
    const float d = h2f(b);
    for (int j = 0; j < 16; j++) {
        y[j] = ((b[2 + j] & 0xF) - 8) * d;
        y[j + 16] = ((b[2 + j] >> 4) - 8) * d;
    }
}
template <> __host__ __device__ inline void deq32<QF_TYPE_Q5_0>(const uint8_t *row, int sb, float *y) {
    const uint8_t *b = row + (size_t)sb * 22;
    const float d = h2f(b);
    const uint32_t qh = (uint32_t)b[2] | ((uint32_t)b[3] << 8) | ((uint32_t)b[4] << 16) | ((uint32_t)b[5] << 24);
    const uint8_t *qs = b + 6;
    for (int j = 0; j < 16; j++) {
        int h0 = (qh >> j) & 1, h1 = (qh >> (j + 16)) & 1;
        y[j] = (((qs[j] & 0xF) | (h0 << 4)) - 16) * d;
        y[j + 16] = (((qs[j] >> 4) | (h1 << 4)) - 16) * d;
    }
}
template <> __host__ __device__ inline void deq32<QF_TYPE_Q8_0>(const uint8_t *row, int sb, float *y) {
    const uint8_t *b = row + (size_t)sb * 34;
    const float d = h2f(b);
    const int8_t *qs = (const int8_t *)(b + 2);
    for (int j = 0; j < 32; j++) y[j] = qs[j] * d;
}
/* block_q4_K: d, dmin (f16), scales[12], qs[128]: 144 bytes */
template <> __host__ __device__ inline void deq32<QF_TYPE_Q4_K>(const uint8_t *row, int sb, float *y) {
    const uint8_t *b = row + (size_t)(sb >> 3) * 144;
    const int s = sb & 7;
    const float d = h2f(b), dmin = h2f(b + 2);
    int sc, m;
    k4_scale_min(s, b + 4, &sc, &m);
    const float d1 = d * sc, m1 = dmin * m;
    const uint8_t *q = b + 16 + 32 * (s >> 1);
    if (s & 1)
        for (int l = 0; l < 32; l++) y[l] = d1 * (q[l] >> 4) - m1;
    else
        for (int l = 0; l < 32; l++) y[l] = d1 * (q[l] & 0xF) - m1;
}
/* block_q5_K: d, dmin, scales[12], qh[32], qs[128]: 176 bytes */
template <> __host__ __device__ inline void deq32<QF_TYPE_Q5_K>(const uint8_t *row, int sb, float *y) {
    const uint8_t *b = row + (size_t)(sb >> 3) * 176;
    const int s = sb & 7;
    const float d = h2f(b), dmin = h2f(b + 2);
    int sc, m;
    k4_scale_min(s, b + 4, &sc, &m);
    const float d1 = d * sc, m1 = dmin * m;
    const uint8_t *qh = b + 16, *ql = b + 48 + 32 * (s >> 1);
    const uint8_t u = (uint8_t)(1u << s);
    if (s & 1)
        for (int l = 0; l < 32; l++) y[l] = d1 * ((ql[l] >> 4) + (qh[l] & u ? 16 : 0)) - m1;
    else
        for (int l = 0; l < 32; l++) y[l] = d1 * ((ql[l] & 0xF) + (qh[l] & u ? 16 : 0)) - m1;
}
/* block_q6_K: ql[128], qh[64], scales[16] (int8), d: 210 bytes */
template <> __host__ __device__ inline void deq32<QF_TYPE_Q6_K>(const uint8_t *row, int sb, float *y) {
    const uint8_t *b = row + (size_t)(sb >> 3) * 210;
    const int s = sb & 7, half = s >> 2, k = s & 3;
    const uint8_t *ql = b + 64 * half + ((k & 1) ? 32 : 0), *qh = b + 128 + 32 * half;
    const int8_t *sc = (const int8_t *)(b + 192) + 8 * half;
    const float d = h2f(b + 208);
    const int nsh = (k >> 1) * 4, hsh = 2 * k;
    for (int l = 0; l < 32; l++) {
        const int q = (((ql[l] >> nsh) & 0xF) | (((qh[l] >> hsh) & 3) << 4)) - 32;
        y[l] = d * sc[l / 16 + 2 * k] * q;
    }
}

/* call F.template operator()<T>() for a runtime type */
#define QF_TYPE_DISPATCH(t, BODY)                          \
    switch (t) {                                           \
    case QF_TYPE_F32: { constexpr int TT = QF_TYPE_F32; BODY; } break;   \
    case QF_TYPE_F16: { constexpr int TT = QF_TYPE_F16; BODY; } break;   \
    case QF_TYPE_BF16: { constexpr int TT = QF_TYPE_BF16; BODY; } break; \
    case QF_TYPE_Q4_0: { constexpr int TT = QF_TYPE_Q4_0; BODY; } break; \
    case QF_TYPE_Q5_0: { constexpr int TT = QF_TYPE_Q5_0; BODY; } break; \
    case QF_TYPE_Q8_0: { constexpr int TT = QF_TYPE_Q8_0; BODY; } break; \
    case QF_TYPE_Q4_K: { constexpr int TT = QF_TYPE_Q4_K; BODY; } break; \
    case QF_TYPE_Q5_K: { constexpr int TT = QF_TYPE_Q5_K; BODY; } break; \
    case QF_TYPE_Q6_K: { constexpr int TT = QF_TYPE_Q6_K; BODY; } break; \
    default: break;                                        \
    }

static bool gpu_type_ok(qf_type t) {
    switch (t) {
    case QF_TYPE_F32: case QF_TYPE_F16: case QF_TYPE_BF16: case QF_TYPE_Q4_0: case QF_TYPE_Q5_0:
    case QF_TYPE_Q8_0: case QF_TYPE_Q4_K: case QF_TYPE_Q5_K: case QF_TYPE_Q6_K: return true;
    default: return false;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* kernels                                                                                   */

__device__ static inline float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <typename O> __device__ static inline O cvt_out(float v);
template <> __device__ inline float cvt_out<float>(float v) { return v; }
template <> __device__ inline __half cvt_out<__half>(float v) { return __float2half_rn(v); }

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
    const int nsb = d / 32;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * nsb) return;
    const int t = i / nsb, sb = i % nsb;
    deq32<T>(E + (size_t)tok[t] * rb, sb, x + (size_t)t * d + sb * 32);
}

/* y[t][r] (+)= sum_k W[r][k] x[t][k]; one warp per output row, lanes stride over sub-blocks */
template <int T>
__global__ void k_matvec(const uint8_t *W, size_t rb, int K, int N, const float *x, int n, float *y, int accumulate) {
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

__global__ void k_f32_to_f16(const float *x, size_t n, __half *y) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2half_rn(x[i]);
}

/* one block per token */
__global__ void k_rmsnorm(const float *x, const float *g, int d, float eps, float *out) {
    const float *xr = x + (size_t)blockIdx.x * d;
    float *o = out + (size_t)blockIdx.x * d;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) ss += xr[i] * xr[i];
    __shared__ float red[32];
    ss = warp_sum(ss);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.0f;
        v = warp_sum(v);
        if (threadIdx.x == 0) red[0] = v;
    }
    __syncthreads();
    const float scale = 1.0f / sqrtf(red[0] / d + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) o[i] = xr[i] * scale * g[i];
}

/* v[t][h][hd] rotated; one thread per (t, h, pair) */
__global__ void k_rope(float *v, int n, int n_heads, int hd, int half, int neox, const float *cs, const float *sn) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)n * n_heads * half) return;
    const int p = (int)(i % half);
    const int64_t th = i / half;
    const int t = (int)(th / n_heads);
    float *x = v + th * hd;
    const int a = neox ? p : 2 * p, b = neox ? p + half : 2 * p + 1;
    const float c = cs[(size_t)t * half + p], s = sn[(size_t)t * half + p];
    const float x0 = x[a], x1 = x[b];
    x[a] = x0 * c - x1 * s;
    x[b] = x0 * s + x1 * c;
}

__global__ void k_add_bias(float *x, const float *b, int n, int d) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (int64_t)n * d) x[i] += b[i % d];
}

__global__ void k_silu_mul(float *g, const float *u, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float x = g[i];
        g[i] = x / (1.0f + expf(-x)) * u[i];
    }
}

/* ---- KV cache rows: f32, f16, q8_0, q4_0 (ggml's reference quantizers) ---- */

/* f32 -> f16 bits, round to nearest even, in integer arithmetic (the same on host and device) */
__host__ __device__ static inline uint16_t f32_to_f16_bits(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7FFFFFFFu;
    if (ax >= 0x7F800000u) return (uint16_t)(sign | 0x7C00u | (ax > 0x7F800000u ? 0x200u : 0)); /* inf, nan */
    if (ax >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u); /* rounds to >= 65520: inf */
    if (ax < 0x38800000u) { /* f16 subnormal or zero */
        if (ax < 0x33000000u) return (uint16_t)sign;
        const uint32_t e = ax >> 23, m = (ax & 0x7FFFFFu) | 0x800000u;
        const int shift = 126 - (int)e; /* 14..24 */
        uint32_t r = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((ax - 0x38000000u) >> 13);
    const uint32_t rem = ax & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1))) r++;
    return (uint16_t)(sign | r);
}

/* one 32-element block of a q8_0 / q4_0 cache row, as ggml's reference quantizers */
__host__ __device__ static inline void kv_quant_block(int mode, const float *x, uint8_t *out) {
    if (mode == QF_KV_Q8_0) {
        uint8_t *o = out;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127;
        const float id = d ? 1.0f / d : 0.0f;
        const uint16_t hx = f32_to_f16_bits(d);
        o[0] = (uint8_t)(hx & 0xFF), o[1] = (uint8_t)(hx >> 8);
        for (int j = 0; j < 32; j++) ((int8_t *)o)[2 + j] = (int8_t)roundf(x[j] * id);
    } else { /* QF_KV_Q4_0 */
        uint8_t *o = out;
        float amax = 0.0f, mx = 0.0f;
        for (int j = 0; j < 32; j++)
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                mx = x[j];
            }
        const float d = mx / -8;
        const float id = d ? 1.0f / d : 0.0f;
        const uint16_t hx = f32_to_f16_bits(d);
        o[0] = (uint8_t)(hx & 0xFF), o[1] = (uint8_t)(hx >> 8);
        for (int j = 0; j < 16; j++) {
            int q0 = (int)(x[j] * id + 8.5f), q1 = (int)(x[j + 16] * id + 8.5f);
            o[2 + j] = (uint8_t)((q0 < 15 ? q0 : 15) | ((q1 < 15 ? q1 : 15) << 4));
        }
    }
}

/* one thread per 32-element block of the n_rows x hd source */
__global__ void k_kv_write(int mode, const float *src, int64_t n_rows, int hd, size_t rb, uint8_t *dst) {
    const int nb = hd / 32 > 0 ? hd / 32 : 1;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (mode == QF_KV_F32 || mode == QF_KV_F16) {
        if (i >= n_rows * hd) return;
        const int64_t r = i / hd;
        const int e = (int)(i % hd);
        if (mode == QF_KV_F32) ((float *)(dst + r * rb))[e] = src[i];
        else ((__half *)(dst + r * rb))[e] = __float2half_rn(src[i]);
        return;
    }
    if (i >= n_rows * nb) return;
    const int64_t r = i / nb;
    const int b = (int)(i % nb);
    kv_quant_block(mode, src + r * hd + b * 32, dst + r * rb + b * (mode == QF_KV_Q8_0 ? 34 : 18));
}

template <int M> __host__ __device__ static inline float kv_elem(const uint8_t *row, int e);
template <> __host__ __device__ inline float kv_elem<QF_KV_F32>(const uint8_t *row, int e) { return ((const float *)row)[e]; }
template <> __host__ __device__ inline float kv_elem<QF_KV_F16>(const uint8_t *row, int e) {
    return __half2float(((const __half *)row)[e]);
}
template <> __host__ __device__ inline float kv_elem<QF_KV_Q8_0>(const uint8_t *row, int e) {
    const uint8_t *b = row + (e >> 5) * 34;
    return ((const int8_t *)b)[2 + (e & 31)] * __half2float(*(const __half *)b);
}
template <> __host__ __device__ inline float kv_elem<QF_KV_Q4_0>(const uint8_t *row, int e) {
    const uint8_t *b = row + (e >> 5) * 18;
    const int i = e & 31;
    const int q = i < 16 ? (b[2 + i] & 0xF) : (b[2 + i - 16] >> 4);
    return (q - 8) * __half2float(*(const __half *)b);
}

/* one warp per (query i, head h): online softmax over positions [0, pos0 + i] */
template <int MK, int MV>
__global__ void k_attention(const float *q, const uint8_t *K, const uint8_t *V, size_t rbk, size_t rbv, int n,
                            int pos0, int n_head, int n_head_kv, int hd, float scale, float *out) {
    const int w = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (w >= n * n_head) return;
    const int i = w / n_head, h = w % n_head, kvh = h / (n_head / n_head_kv);
    const int Dq = n_head * hd, nj = (hd + 31) / 32;
    float qr[HD_MAX / 32], acc[HD_MAX / 32];
#pragma unroll
    for (int j = 0; j < HD_MAX / 32; j++) {
        const int e = lane + 32 * j;
        qr[j] = (j < nj && e < hd) ? q[(size_t)i * Dq + (size_t)h * hd + e] : 0.0f;
        acc[j] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    const int last = pos0 + i;
    for (int t = 0; t <= last; t++) {
        const uint8_t *kr = K + ((size_t)t * n_head_kv + kvh) * rbk;
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < HD_MAX / 32; j++) {
            const int e = lane + 32 * j;
            if (j < nj && e < hd) s += qr[j] * kv_elem<MK>(kr, e);
        }
        s = warp_sum(s) * scale;
        const float mn = fmaxf(m, s);
        const float corr = expf(m - mn), p = expf(s - mn);
        l = l * corr + p;
        const uint8_t *vr = V + ((size_t)t * n_head_kv + kvh) * rbv;
#pragma unroll
        for (int j = 0; j < HD_MAX / 32; j++) {
            const int e = lane + 32 * j;
            if (j < nj && e < hd) acc[j] = acc[j] * corr + p * kv_elem<MV>(vr, e);
        }
        m = mn;
    }
    const float inv = 1.0f / l;
#pragma unroll
    for (int j = 0; j < HD_MAX / 32; j++) {
        const int e = lane + 32 * j;
        if (j < nj && e < hd) out[(size_t)i * Dq + (size_t)h * hd + e] = acc[j] * inv;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* context                                                                                   */

typedef struct {
    qf_type type;
    int64_t ne0, ne1;
    size_t row_bytes;
    uint8_t *d;
} dweight;

typedef struct {
    dweight wq, wk, wv, wo, wg, wu, wd;
    float *attn_norm, *ffn_norm, *bq, *bk, *bv;
} dlayer;

struct qf_cuda_ctx {
    cublasHandle_t blas;
    dlayer *layers;
    int n_layer;
    dweight tok_embd, output;
    float *output_norm;
    qf_kv_mode kv_mode[2];
    size_t kv_rb[2];
    uint8_t *kv[2];        /* [layer][n_ctx][n_head_kv] rows */
    size_t kv_layer_bytes[2];
    int n_ctx, n_batch;
    bool gemm_f32;
    /* device scratch */
    float *x, *xn, *q, *k, *v, *att, *hb, *hb2, *logits, *rcos, *rsin;
    void *wdeq;            /* dequantized weight (f16 or f32) */
    size_t wdeq_bytes;
    __half *xh;            /* f16 activations for the f16 gemm */
    int32_t *tok;
    /* host */
    float *h_cos, *h_sin, *h_k, *h_v, *h_act, *rope_ff;
    size_t weight_bytes, kv_bytes, scratch_bytes;
    /* QF_CUDA_PROFILE=1: events between the stages of each decode, summed per category and
     * printed when the context is freed */
    cudaEvent_t *ev;
    int *ev_cat, n_ev, prof_calls;
    double prof_ms[4];
    /* uploads keyed by host pointer (tied output shares the embedding) */
};

static qf_status cuda_fail(qf_error *err, cudaError_t e, const char *what) {
    return qf_fail(err, QF_ERR_DEVICE, "CUDA: %s: %s", what, cudaGetErrorString(e));
}
#define CK(call)                                                    \
    do {                                                            \
        cudaError_t e_ = (call);                                    \
        if (e_ != cudaSuccess) {                                    \
            st = cuda_fail(err, e_, #call);                         \
            goto done;                                              \
        }                                                           \
    } while (0)
#define CKB(call)                                                                                   \
    do {                                                                                            \
        cublasStatus_t s_ = (call);                                                                 \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                          \
            st = qf_fail(err, QF_ERR_DEVICE, "cuBLAS: %s failed (status %d)", #call, (int)s_);      \
            goto done;                                                                              \
        }                                                                                           \
    } while (0)

extern "C" bool qf_cuda_backend_available(void) {
    static int cached = -1;
    if (cached < 0) {
        int n = 0;
        cudaError_t e = cudaGetDeviceCount(&n);
        cached = (e == cudaSuccess && n > 0) ? 1 : 0;
        if (e != cudaSuccess) cudaGetLastError(); /* clear */
    }
    return cached == 1;
}

static unsigned nblk(size_t n, unsigned bs) { return (unsigned)((n + bs - 1) / bs); }

static qf_status upload_weight(qf_cuda_ctx *g, const qf_weight *w, const char *name, dweight *out, qf_error *err) {
    qf_status st = QF_OK;
    memset(out, 0, sizeof *out);
    if (!w->data) return QF_OK;
    if (!gpu_type_ok(w->type) || w->ne0 % 32)
        return qf_fail(err, QF_ERR_DEVICE, "CUDA backend: tensor %s has type %s, which the GPU path does not run", name,
                       qf_type_name(w->type) ? qf_type_name(w->type) : "unknown");
    size_t bytes = w->row_bytes * (size_t)w->ne1;
    out->type = w->type, out->ne0 = w->ne0, out->ne1 = w->ne1, out->row_bytes = w->row_bytes;
    CK(cudaMalloc((void **)&out->d, bytes));
    CK(cudaMemcpy(out->d, w->data, bytes, cudaMemcpyHostToDevice));
    g->weight_bytes += bytes;
done:
    return st;
}

static qf_status upload_vec(qf_cuda_ctx *g, const qf_weight *w, float **out, qf_error *err) {
    qf_status st = QF_OK;
    *out = NULL;
    if (!w->data) return QF_OK;
    float *tmp = (float *)malloc((size_t)w->ne0 * sizeof(float));
    if (!tmp) return qf_fail(err, QF_ERR_NOMEM, "out of memory");
    qf_dequantize_row_ref(w->type, w->data, tmp, w->ne0);
    CK(cudaMalloc((void **)out, (size_t)w->ne0 * sizeof(float)));
    CK(cudaMemcpy(*out, tmp, (size_t)w->ne0 * sizeof(float), cudaMemcpyHostToDevice));
    g->weight_bytes += (size_t)w->ne0 * sizeof(float);
done:
    free(tmp);
    return st;
}

static void free_weight(dweight *w) {
    if (w->d) cudaFree(w->d);
    w->d = NULL;
}

#define PROF_MAX_EV 4096
static const char *const prof_names[4] = {"norm/rope/misc", "matmul", "attention+kv", "logits"};
/* close the stage that ends here as category `cat` */
static void prof_mark(qf_cuda_ctx *g, int cat) {
    if (!g->ev || g->n_ev >= PROF_MAX_EV) return;
    g->ev_cat[g->n_ev] = cat;
    cudaEventRecord(g->ev[g->n_ev++], 0);
}
static void prof_collect(qf_cuda_ctx *g) {
    if (!g->ev || g->n_ev < 2) return;
    cudaEventSynchronize(g->ev[g->n_ev - 1]);
    for (int i = 1; i < g->n_ev; i++) {
        float ms = 0;
        cudaEventElapsedTime(&ms, g->ev[i - 1], g->ev[i]);
        g->prof_ms[g->ev_cat[i]] += ms;
    }
    g->n_ev = 0;
    g->prof_calls++;
}

extern "C" void qf_cuda_ctx_free(qf_cuda_ctx *g) {
    if (!g) return;
    if (g->ev) {
        fprintf(stderr, "QF_CUDA_PROFILE: %d decode calls:", g->prof_calls);
        for (int i = 0; i < 4; i++) fprintf(stderr, " %s %.2f ms;", prof_names[i], g->prof_ms[i]);
        fprintf(stderr, "\n");
        for (int i = 0; i < PROF_MAX_EV; i++) cudaEventDestroy(g->ev[i]);
        free(g->ev), free(g->ev_cat);
    }
    if (g->layers) {
        for (int il = 0; il < g->n_layer; il++) {
            dlayer *L = &g->layers[il];
            free_weight(&L->wq), free_weight(&L->wk), free_weight(&L->wv), free_weight(&L->wo);
            free_weight(&L->wg), free_weight(&L->wu), free_weight(&L->wd);
            float *vs[] = {L->attn_norm, L->ffn_norm, L->bq, L->bk, L->bv};
            for (int i = 0; i < 5; i++)
                if (vs[i]) cudaFree(vs[i]);
        }
        free(g->layers);
    }
    if (g->output.d != g->tok_embd.d) free_weight(&g->output);
    free_weight(&g->tok_embd);
    void *bufs[] = {g->output_norm, g->kv[0], g->kv[1], g->x, g->xn, g->q, g->k, g->v, g->att, g->hb,
                    g->hb2, g->logits, g->rcos, g->rsin, g->wdeq, g->xh, g->tok};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) cudaFree(bufs[i]);
    if (g->blas) cublasDestroy(g->blas);
    free(g->h_cos), free(g->h_sin), free(g->h_k), free(g->h_v), free(g->h_act), free(g->rope_ff);
    free(g);
}

static size_t kv_row_bytes(qf_kv_mode m, int hd) {
    switch (m) {
    case QF_KV_F32: return (size_t)hd * 4;
    case QF_KV_F16: return (size_t)hd * 2;
    case QF_KV_Q8_0: return hd % 32 ? 0 : (size_t)hd / 32 * 34;
    case QF_KV_Q4_0: return hd % 32 ? 0 : (size_t)hd / 32 * 18;
    default: return 0;
    }
}

static size_t wmax(size_t a, size_t b) { return a > b ? a : b; }

extern "C" qf_status qf_cuda_ctx_new(qf_context *c, qf_cuda_ctx **out, qf_error *err) {
    *out = NULL;
    if (!qf_cuda_backend_available())
        return qf_fail(err, QF_ERR_DEVICE, "--device cuda: no CUDA GPU is available (cudaGetDeviceCount found none)");
    const qf_model *m = c->model;
    const qf_hparams *hp = &m->hp;
    qf_status st = QF_OK;
    if (hp->head_dim > HD_MAX)
        return qf_fail(err, QF_ERR_DEVICE, "CUDA backend: head_dim %d exceeds %d", hp->head_dim, HD_MAX);
    if (hp->n_embd % 32 || hp->n_ff % 32 || (hp->n_head * hp->head_dim) % 32)
        return qf_fail(err, QF_ERR_DEVICE, "CUDA backend: n_embd %d, n_ff %d and n_head*head_dim must be multiples of 32",
                       hp->n_embd, hp->n_ff);
    qf_cuda_ctx *g = (qf_cuda_ctx *)calloc(1, sizeof *g);
    if (!g) return qf_fail(err, QF_ERR_NOMEM, "out of memory");
    g->n_layer = hp->n_layer;
    g->n_ctx = c->params.n_ctx;
    g->n_batch = c->n_batch;
    const char *gm = getenv("QF_CUDA_GEMM");
    g->gemm_f32 = gm && strcmp(gm, "f32") == 0;
    const int D = hp->n_embd, F = hp->n_ff, Dq = hp->n_head * hp->head_dim, Dkv = hp->n_head_kv * hp->head_dim,
              B = c->n_batch, half = hp->n_rot / 2;
    const size_t V = (size_t)hp->n_vocab;
    size_t max_w = 0; /* largest weight in elements */
    char name[96];

    if (cublasCreate(&g->blas) != CUBLAS_STATUS_SUCCESS) {
        st = qf_fail(err, QF_ERR_DEVICE, "CUDA backend: cublasCreate failed");
        goto done;
    }
    g->layers = (dlayer *)calloc((size_t)hp->n_layer, sizeof(dlayer));
    if (!g->layers) {
        st = qf_fail(err, QF_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((st = upload_weight(g, &m->tok_embd, "token_embd.weight", &g->tok_embd, err))) goto done;
    if (m->output.data == m->tok_embd.data) g->output = g->tok_embd;
    else if ((st = upload_weight(g, &m->output, "output.weight", &g->output, err))) goto done;
    max_w = (size_t)g->output.ne0 * g->output.ne1;
    if ((st = upload_vec(g, &m->output_norm, &g->output_norm, err))) goto done;
    for (int il = 0; il < hp->n_layer; il++) {
        const qf_layer_weights *L = &m->layers[il];
        dlayer *dl = &g->layers[il];
        struct { const qf_weight *w; dweight *d; const char *n; } ws[] = {
            {&L->wq, &dl->wq, "attn_q"}, {&L->wk, &dl->wk, "attn_k"}, {&L->wv, &dl->wv, "attn_v"},
            {&L->wo, &dl->wo, "attn_output"}, {&L->w_gate, &dl->wg, "ffn_gate"}, {&L->w_up, &dl->wu, "ffn_up"},
            {&L->w_down, &dl->wd, "ffn_down"}};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", il, ws[i].n);
            if ((st = upload_weight(g, ws[i].w, name, ws[i].d, err))) goto done;
            max_w = wmax(max_w, (size_t)ws[i].w->ne0 * ws[i].w->ne1);
        }
        if ((st = upload_vec(g, &L->attn_norm, &dl->attn_norm, err)) || (st = upload_vec(g, &L->ffn_norm, &dl->ffn_norm, err)) ||
            (st = upload_vec(g, &L->bq, &dl->bq, err)) || (st = upload_vec(g, &L->bk, &dl->bk, err)) ||
            (st = upload_vec(g, &L->bv, &dl->bv, err)))
            goto done;
    }
    /* KV cache */
    for (int s = 0; s < 2; s++) {
        qf_kv_mode mode = s ? c->params.kv_v : c->params.kv_k;
        g->kv_mode[s] = mode;
        g->kv_rb[s] = kv_row_bytes(mode, hp->head_dim);
        /* the q8_0/q4_0 GPU cache rows do not yet match qf_quantize_row bit for bit on the
         * device (tests/test_cuda.c op_kv_cache with QF_CUDA_KV_QUANT=1), so they are refused
         * until they certify */
        if ((mode == QF_KV_Q8_0 || mode == QF_KV_Q4_0) && !getenv("QF_CUDA_KV_QUANT")) g->kv_rb[s] = 0;
        if (!g->kv_rb[s]) {
            st = qf_fail(err, QF_ERR_DEVICE, "CUDA backend: KV cache type %s is not supported on the GPU (f32 and f16 are; use --device cpu)",
                         qf_kv_mode_name(mode));
            goto done;
        }
        g->kv_layer_bytes[s] = g->kv_rb[s] * (size_t)g->n_ctx * hp->n_head_kv;
        CK(cudaMalloc((void **)&g->kv[s], g->kv_layer_bytes[s] * hp->n_layer));
        g->kv_bytes += g->kv_layer_bytes[s] * hp->n_layer;
    }
    /* scratch */
    {
        size_t maxK = wmax(wmax((size_t)D, (size_t)F), (size_t)Dq);
        size_t sc = 0;
        CK(cudaMalloc((void **)&g->x, (size_t)B * D * 4)); sc += (size_t)B * D * 4;
        CK(cudaMalloc((void **)&g->xn, (size_t)B * maxK * 4)); sc += (size_t)B * maxK * 4;
        CK(cudaMalloc((void **)&g->q, (size_t)B * Dq * 4)); sc += (size_t)B * Dq * 4;
        CK(cudaMalloc((void **)&g->k, (size_t)B * Dkv * 4)); sc += (size_t)B * Dkv * 4;
        CK(cudaMalloc((void **)&g->v, (size_t)B * Dkv * 4)); sc += (size_t)B * Dkv * 4;
        CK(cudaMalloc((void **)&g->att, (size_t)B * Dq * 4)); sc += (size_t)B * Dq * 4;
        CK(cudaMalloc((void **)&g->hb, (size_t)B * F * 4)); sc += (size_t)B * F * 4;
        CK(cudaMalloc((void **)&g->hb2, (size_t)B * F * 4)); sc += (size_t)B * F * 4;
        CK(cudaMalloc((void **)&g->logits, (size_t)B * V * 4)); sc += (size_t)B * V * 4;
        CK(cudaMalloc((void **)&g->rcos, (size_t)B * half * 4 + 4));
        CK(cudaMalloc((void **)&g->rsin, (size_t)B * half * 4 + 4));
        CK(cudaMalloc((void **)&g->xh, (size_t)B * maxK * 2)); sc += (size_t)B * maxK * 2;
        CK(cudaMalloc((void **)&g->tok, (size_t)B * 4));
        g->wdeq_bytes = max_w * (g->gemm_f32 ? 4 : 2);
        CK(cudaMalloc(&g->wdeq, g->wdeq_bytes)); sc += g->wdeq_bytes;
        g->scratch_bytes = sc;
        g->h_cos = (float *)malloc((size_t)B * half * 4 + 4);
        g->h_sin = (float *)malloc((size_t)B * half * 4 + 4);
        g->h_k = (float *)malloc((size_t)B * Dkv * 4);
        g->h_v = (float *)malloc((size_t)B * Dkv * 4);
        g->h_act = (float *)malloc((size_t)B * maxK * 4);
        if (!g->h_cos || !g->h_sin || !g->h_k || !g->h_v || !g->h_act) {
            st = qf_fail(err, QF_ERR_NOMEM, "out of memory");
            goto done;
        }
    }
    if (getenv("QF_CUDA_PROFILE") && atoi(getenv("QF_CUDA_PROFILE")) > 0) {
        g->ev = (cudaEvent_t *)calloc(PROF_MAX_EV, sizeof(cudaEvent_t));
        g->ev_cat = (int *)calloc(PROF_MAX_EV, sizeof(int));
        if (!g->ev || !g->ev_cat) {
            st = qf_fail(err, QF_ERR_NOMEM, "out of memory");
            goto done;
        }
        for (int i = 0; i < PROF_MAX_EV; i++) CK(cudaEventCreate(&g->ev[i]));
    }
    if (m->rope_freqs.data) {
        g->rope_ff = (float *)malloc((size_t)half * 4);
        if (!g->rope_ff) {
            st = qf_fail(err, QF_ERR_NOMEM, "out of memory");
            goto done;
        }
        qf_dequantize_row_ref(m->rope_freqs.type, m->rope_freqs.data, g->rope_ff, half);
    }
done:
    if (st) {
        if (st == QF_ERR_DEVICE && strstr(err ? err->msg : "", "out of memory"))
            qf_error_prefix(err, "uploading %s (%.2f GiB of weights so far): ", m->path, g->weight_bytes / 1073741824.0);
        qf_cuda_ctx_free(g);
        return st;
    }
    *out = g;
    return QF_OK;
}

extern "C" void qf_cuda_ctx_info(const qf_cuda_ctx *g, qf_cuda_info *out) {
    out->weight_bytes = g->weight_bytes;
    out->kv_bytes = g->kv_bytes;
    out->scratch_bytes = g->scratch_bytes;
}

/* ---------------------------------------------------------------------------------------- */
/* operations on device buffers                                                              */

static void launch_dequant(const dweight *w, void *dst, bool f32) {
    const size_t nthr = (size_t)w->ne1 * (w->ne0 / 32);
    if (f32) {
        QF_TYPE_DISPATCH(w->type, (k_dequant<TT, float><<<nblk(nthr, 256), 256>>>(w->d, w->row_bytes, w->ne1, (int)w->ne0, (float *)dst)));
    } else {
        QF_TYPE_DISPATCH(w->type, (k_dequant<TT, __half><<<nblk(nthr, 256), 256>>>(w->d, w->row_bytes, w->ne1, (int)w->ne0, (__half *)dst)));
    }
}

/* y[n][N] (+)= x[n][K] . W^T on device buffers; wdeq/xh are scratch of the right sizes */
static qf_status dev_matmul(cublasHandle_t blas, const dweight *w, const float *x, int n, float *y, bool accumulate,
                            qf_cuda_mm_route route, void *wdeq, __half *xh, qf_error *err) {
    qf_status st = QF_OK;
    const int K = (int)w->ne0, N = (int)w->ne1;
    if (route == QF_CUDA_MM_AUTO) route = n <= MATVEC_MAX ? QF_CUDA_MM_MATVEC : QF_CUDA_MM_GEMM_F16;
    if (route == QF_CUDA_MM_MATVEC && n > MATVEC_MAX) route = QF_CUDA_MM_GEMM_F16;
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    if (route == QF_CUDA_MM_MATVEC) {
        QF_TYPE_DISPATCH(w->type, (k_matvec<TT><<<nblk((size_t)N, 4), 128>>>(w->d, w->row_bytes, K, N, x, n, y, accumulate)));
    } else if (route == QF_CUDA_MM_GEMM_F32 || w->type == QF_TYPE_F32) {
        const float *W = (const float *)w->d;
        if (w->type != QF_TYPE_F32) {
            launch_dequant(w, wdeq, true);
            W = (const float *)wdeq;
        }
        CKB(cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, N, n, K, &one, W, K, x, K, &beta, y, N));
    } else {
        const __half *W = (const __half *)w->d;
        if (w->type != QF_TYPE_F16) {
            launch_dequant(w, wdeq, false);
            W = (const __half *)wdeq;
        }
        size_t nx = (size_t)n * K;
        k_f32_to_f16<<<nblk(nx, 256), 256>>>(x, nx, xh);
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

static void launch_attention(qf_kv_mode mk, qf_kv_mode mv, const float *q, const uint8_t *K, const uint8_t *V,
                             size_t rbk, size_t rbv, int n, int pos0, int n_head, int n_head_kv, int hd, float *out) {
    const size_t warps = (size_t)n * n_head;
    const float scale = 1.0f / sqrtf((float)hd);
#define QF_ATT(MK, MV) k_attention<MK, MV><<<nblk(warps, 4), 128>>>(q, K, V, rbk, rbv, n, pos0, n_head, n_head_kv, hd, scale, out)
#define QF_ATT_V(MK)                                   \
    switch (mv) {                                      \
    case QF_KV_F32: QF_ATT(MK, QF_KV_F32); break;      \
    case QF_KV_F16: QF_ATT(MK, QF_KV_F16); break;      \
    case QF_KV_Q8_0: QF_ATT(MK, QF_KV_Q8_0); break;    \
    case QF_KV_Q4_0: QF_ATT(MK, QF_KV_Q4_0); break;    \
    default: break;                                    \
    }
    switch (mk) {
    case QF_KV_F32: QF_ATT_V(QF_KV_F32); break;
    case QF_KV_F16: QF_ATT_V(QF_KV_F16); break;
    case QF_KV_Q8_0: QF_ATT_V(QF_KV_Q8_0); break;
    case QF_KV_Q4_0: QF_ATT_V(QF_KV_Q4_0); break;
    default: break;
    }
#undef QF_ATT_V
#undef QF_ATT
}

static void launch_kv_write(qf_kv_mode mode, const float *src, int64_t rows, int hd, size_t rb, uint8_t *dst) {
    size_t nthr = (mode == QF_KV_F32 || mode == QF_KV_F16) ? (size_t)rows * hd : (size_t)rows * (hd / 32);
    k_kv_write<<<nblk(nthr, 256), 256>>>((int)mode, src, rows, hd, rb, dst);
}

/* ---------------------------------------------------------------------------------------- */
/* the forward pass                                                                          */

/* copy a device activation to the host and hand it to the tap */
static qf_status tap_act(qf_cuda_ctx *g, const qf_tap *tap, int il, qf_act_site site, int n, int dim, const float *d,
                         qf_error *err) {
    qf_status st = QF_OK;
    if (!tap || !tap->on_act) return QF_OK;
    CK(cudaMemcpy(g->h_act, d, (size_t)n * dim * 4, cudaMemcpyDeviceToHost));
    tap->on_act(tap->user, il, site, n, dim, g->h_act);
done:
    return st;
}

extern "C" qf_status qf_cuda_decode(qf_context *c, qf_cuda_ctx *g, const int32_t *tokens, int n, int pos0,
                                    float *logits, int logits_from, qf_error *err) {
    const qf_model *m = c->model;
    const qf_hparams *hp = &m->hp;
    const int D = hp->n_embd, hd = hp->head_dim, Dq = hp->n_head * hd, Dkv = hp->n_head_kv * hd, F = hp->n_ff,
              half = hp->n_rot / 2, nkv = hp->n_head_kv;
    const qf_tap *tap = c->tap;
    qf_status st = QF_OK;
    const qf_cuda_mm_route route = g->gemm_f32 ? QF_CUDA_MM_GEMM_F32 : QF_CUDA_MM_AUTO;
    cudaError_t le;
    if (n > g->n_batch || pos0 + n > g->n_ctx)
        return qf_fail(err, QF_ERR_ARG, "decode: batch exceeds the GPU context's sizes");
    /* rope tables exactly as forward.c's rope_tables */
    {
        float theta_scale = powf(hp->rope_freq_base, -2.0f / (float)hp->n_rot);
        for (int t = 0; t < n; t++) {
            float theta = (float)(pos0 + t);
            for (int i = 0; i < half; i++) {
                float th = hp->rope_freq_scale * (g->rope_ff ? theta / g->rope_ff[i] : theta);
                g->h_cos[t * half + i] = cosf(th);
                g->h_sin[t * half + i] = sinf(th);
                theta *= theta_scale;
            }
        }
    }
    CK(cudaMemcpy(g->rcos, g->h_cos, (size_t)n * half * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(g->rsin, g->h_sin, (size_t)n * half * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(g->tok, tokens, (size_t)n * 4, cudaMemcpyHostToDevice));
    prof_mark(g, 0);
    QF_TYPE_DISPATCH(g->tok_embd.type,
                     (k_embed<TT><<<nblk((size_t)n * (D / 32), 128), 128>>>(g->tok_embd.d, g->tok_embd.row_bytes, g->tok, n, D, g->x)));

    for (int il = 0; il < hp->n_layer; il++) {
        const dlayer *L = &g->layers[il];
        k_rmsnorm<<<n, 256>>>(g->x, L->attn_norm, D, hp->rms_eps, g->xn);
        if ((st = tap_act(g, tap, il, QF_ACT_ATTN_IN, n, D, g->xn, err))) goto done;
        prof_mark(g, 0);
        if ((st = dev_matmul(g->blas, &L->wq, g->xn, n, g->q, false, route, g->wdeq, g->xh, err))) goto done;
        if ((st = dev_matmul(g->blas, &L->wk, g->xn, n, g->k, false, route, g->wdeq, g->xh, err))) goto done;
        if ((st = dev_matmul(g->blas, &L->wv, g->xn, n, g->v, false, route, g->wdeq, g->xh, err))) goto done;
        prof_mark(g, 1);
        if (L->bq) k_add_bias<<<nblk((size_t)n * Dq, 256), 256>>>(g->q, L->bq, n, Dq);
        if (L->bk) k_add_bias<<<nblk((size_t)n * Dkv, 256), 256>>>(g->k, L->bk, n, Dkv);
        if (L->bv) k_add_bias<<<nblk((size_t)n * Dkv, 256), 256>>>(g->v, L->bv, n, Dkv);
        k_rope<<<nblk((size_t)n * hp->n_head * half, 256), 256>>>(g->q, n, hp->n_head, hd, half,
                                                                  hp->rope_type == QF_ROPE_NEOX, g->rcos, g->rsin);
        k_rope<<<nblk((size_t)n * nkv * half, 256), 256>>>(g->k, n, nkv, hd, half, hp->rope_type == QF_ROPE_NEOX,
                                                             g->rcos, g->rsin);
        if (tap && tap->on_kv) {
            CK(cudaMemcpy(g->h_k, g->k, (size_t)n * Dkv * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(g->h_v, g->v, (size_t)n * Dkv * 4, cudaMemcpyDeviceToHost));
            tap->on_kv(tap->user, il, pos0, n, nkv, hd, g->h_k, g->h_v);
        }
        prof_mark(g, 0);
        uint8_t *Kc = g->kv[0] + g->kv_layer_bytes[0] * il, *Vc = g->kv[1] + g->kv_layer_bytes[1] * il;
        launch_kv_write(g->kv_mode[0], g->k, (int64_t)n * nkv, hd, g->kv_rb[0], Kc + (size_t)pos0 * nkv * g->kv_rb[0]);
        launch_kv_write(g->kv_mode[1], g->v, (int64_t)n * nkv, hd, g->kv_rb[1], Vc + (size_t)pos0 * nkv * g->kv_rb[1]);
        launch_attention(g->kv_mode[0], g->kv_mode[1], g->q, Kc, Vc, g->kv_rb[0], g->kv_rb[1], n, pos0, hp->n_head, nkv, hd,
                         g->att);
        prof_mark(g, 2);
        if ((st = tap_act(g, tap, il, QF_ACT_ATTN_OUT, n, Dq, g->att, err))) goto done;
        if ((st = dev_matmul(g->blas, &L->wo, g->att, n, g->x, true, route, g->wdeq, g->xh, err))) goto done;
        prof_mark(g, 1);

        k_rmsnorm<<<n, 256>>>(g->x, L->ffn_norm, D, hp->rms_eps, g->xn);
        if ((st = tap_act(g, tap, il, QF_ACT_FFN_IN, n, D, g->xn, err))) goto done;
        prof_mark(g, 0);
        if ((st = dev_matmul(g->blas, &L->wg, g->xn, n, g->hb, false, route, g->wdeq, g->xh, err))) goto done;
        if ((st = dev_matmul(g->blas, &L->wu, g->xn, n, g->hb2, false, route, g->wdeq, g->xh, err))) goto done;
        prof_mark(g, 1);
        k_silu_mul<<<nblk((size_t)n * F, 256), 256>>>(g->hb, g->hb2, (size_t)n * F);
        if ((st = tap_act(g, tap, il, QF_ACT_FFN_DOWN, n, F, g->hb, err))) goto done;
        prof_mark(g, 0);
        if ((st = dev_matmul(g->blas, &L->wd, g->hb, n, g->x, true, route, g->wdeq, g->xh, err))) goto done;
        prof_mark(g, 1);
    }
    le = cudaGetLastError();
    if (le != cudaSuccess) {
        st = cuda_fail(err, le, "forward kernels");
        goto done;
    }
    if (logits && logits_from < n) {
        int first = logits_from < 0 ? 0 : logits_from, n_out = n - first;
        k_rmsnorm<<<n_out, 256>>>(g->x + (size_t)first * D, g->output_norm, D, hp->rms_eps, g->xn);
        if ((st = dev_matmul(g->blas, &g->output, g->xn, n_out, g->logits, false, route, g->wdeq, g->xh, err))) goto done;
        CK(cudaMemcpy(logits, g->logits, (size_t)n_out * hp->n_vocab * 4, cudaMemcpyDeviceToHost));
        prof_mark(g, 3);
    } else {
        CK(cudaDeviceSynchronize());
    }
done:
    prof_collect(g);
    return st;
}

/* ---------------------------------------------------------------------------------------- */
/* single operations for the tests                                                           */

typedef struct {
    void *p[8];
    int n;
} dallocs;

static void *dalloc(dallocs *a, size_t bytes) {
    void *p = NULL;
    if (a->n >= 8 || cudaMalloc(&p, bytes ? bytes : 4) != cudaSuccess) return NULL;
    a->p[a->n++] = p;
    return p;
}
static void dfree(dallocs *a) {
    for (int i = 0; i < a->n; i++) cudaFree(a->p[i]);
    a->n = 0;
}
static void *dup_to(dallocs *a, const void *h, size_t bytes) {
    void *d = dalloc(a, bytes);
    if (d && cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice) != cudaSuccess) return NULL;
    return d;
}
static qf_status op_finish(dallocs *a, void *hdst, const void *dsrc, size_t bytes, qf_error *err) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaMemcpy(hdst, dsrc, bytes, cudaMemcpyDeviceToHost);
    dfree(a);
    return e == cudaSuccess ? QF_OK : cuda_fail(err, e, "test op");
}
#define OP_NEED(p)                                                               \
    if (!(p)) {                                                                  \
        dfree(&a);                                                               \
        return qf_fail(err, QF_ERR_DEVICE, "CUDA op: device allocation failed"); \
    }

extern "C" qf_status qf_cuda_op_dequant(qf_type t, const void *src, int64_t rows, int64_t k, float *dst, qf_error *err) {
    if (!gpu_type_ok(t) || k % 32) return qf_fail(err, QF_ERR_DEVICE, "CUDA op: type %d not supported", (int)t);
    dallocs a = {};
    size_t rb = qf_row_bytes(t, k);
    dweight w = {t, k, rows, rb, (uint8_t *)dup_to(&a, src, rb * rows)};
    float *out = (float *)dalloc(&a, (size_t)rows * k * 4);
    OP_NEED(w.d && out);
    launch_dequant(&w, out, true);
    return op_finish(&a, dst, out, (size_t)rows * k * 4, err);
}

extern "C" qf_status qf_cuda_op_matmul(const qf_weight *w, const float *x, int n, float *y, qf_cuda_mm_route route,
                                       qf_error *err) {
    if (!gpu_type_ok(w->type)) return qf_fail(err, QF_ERR_DEVICE, "CUDA op: type %d not supported", (int)w->type);
    static cublasHandle_t blas;
    if (!blas && cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) return qf_fail(err, QF_ERR_DEVICE, "cublasCreate failed");
    dallocs a = {};
    const size_t K = (size_t)w->ne0, N = (size_t)w->ne1;
    dweight dw = {w->type, w->ne0, w->ne1, w->row_bytes, (uint8_t *)dup_to(&a, w->data, w->row_bytes * N)};
    float *dx = (float *)dup_to(&a, x, (size_t)n * K * 4);
    float *dy = (float *)dalloc(&a, (size_t)n * N * 4);
    void *wdeq = dalloc(&a, N * K * 4);
    __half *xh = (__half *)dalloc(&a, (size_t)n * K * 2);
    OP_NEED(dw.d && dx && dy && wdeq && xh);
    qf_status st = dev_matmul(blas, &dw, dx, n, dy, false, route, wdeq, xh, err);
    if (st) {
        dfree(&a);
        return st;
    }
    return op_finish(&a, y, dy, (size_t)n * N * 4, err);
}

extern "C" qf_status qf_cuda_op_rmsnorm(const float *x, const float *gn, int n, int d, float eps, float *out, qf_error *err) {
    dallocs a = {};
    float *dx = (float *)dup_to(&a, x, (size_t)n * d * 4), *dg = (float *)dup_to(&a, gn, (size_t)d * 4);
    float *dout = (float *)dalloc(&a, (size_t)n * d * 4);
    OP_NEED(dx && dg && dout);
    k_rmsnorm<<<n, 256>>>(dx, dg, d, eps, dout);
    return op_finish(&a, out, dout, (size_t)n * d * 4, err);
}

extern "C" qf_status qf_cuda_op_rope(float *v, int n, int n_heads, int head_dim, int n_rot, qf_rope_type type,
                                     const float *cs, const float *sn, qf_error *err) {
    dallocs a = {};
    const int half = n_rot / 2;
    size_t bytes = (size_t)n * n_heads * head_dim * 4;
    float *dv = (float *)dup_to(&a, v, bytes);
    float *dc = (float *)dup_to(&a, cs, (size_t)n * half * 4), *ds = (float *)dup_to(&a, sn, (size_t)n * half * 4);
    OP_NEED(dv && dc && ds);
    k_rope<<<nblk((size_t)n * n_heads * half, 256), 256>>>(dv, n, n_heads, head_dim, half, type == QF_ROPE_NEOX, dc, ds);
    return op_finish(&a, v, dv, bytes, err);
}

extern "C" qf_status qf_cuda_op_silu_mul(const float *gt, const float *u, size_t n, float *out, qf_error *err) {
    dallocs a = {};
    float *dg = (float *)dup_to(&a, gt, n * 4), *du = (float *)dup_to(&a, u, n * 4);
    OP_NEED(dg && du);
    k_silu_mul<<<nblk(n, 256), 256>>>(dg, du, n);
    return op_finish(&a, out, dg, n * 4, err);
}

extern "C" qf_status qf_cuda_op_attention(const float *q, const float *k, const float *v, int n, int pos0, int n_head,
                                          int n_head_kv, int hd, qf_kv_mode mode, float *out, qf_error *err) {
    size_t rb = kv_row_bytes(mode, hd);
    if (!rb || hd > HD_MAX) return qf_fail(err, QF_ERR_DEVICE, "CUDA op: kv mode %s / head_dim %d not supported", qf_kv_mode_name(mode), hd);
    dallocs a = {};
    const int T = pos0 + n;
    const size_t rows = (size_t)T * n_head_kv;
    float *dq = (float *)dup_to(&a, q, (size_t)n * n_head * hd * 4);
    float *dk = (float *)dup_to(&a, k, rows * hd * 4), *dv = (float *)dup_to(&a, v, rows * hd * 4);
    uint8_t *ck = (uint8_t *)dalloc(&a, rows * rb), *cv = (uint8_t *)dalloc(&a, rows * rb);
    float *dout = (float *)dalloc(&a, (size_t)n * n_head * hd * 4);
    OP_NEED(dq && dk && dv && ck && cv && dout);
    launch_kv_write(mode, dk, (int64_t)rows, hd, rb, ck);
    launch_kv_write(mode, dv, (int64_t)rows, hd, rb, cv);
    launch_attention(mode, mode, dq, ck, cv, rb, rb, n, pos0, n_head, n_head_kv, hd, dout);
    return op_finish(&a, out, dout, (size_t)n * n_head * hd * 4, err);
}

template <int M> __global__ void k_kv_read(const uint8_t *src, int64_t n_rows, int hd, size_t rb, float *out) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n_rows * hd) out[i] = kv_elem<M>(src + (i / hd) * rb, (int)(i % hd));
}

extern "C" qf_status qf_cuda_op_kv_roundtrip(qf_kv_mode mode, const float *x, int64_t rows, int hd, void *bytes, float *out,
                                             qf_error *err) {
    size_t rb = kv_row_bytes(mode, hd);
    if (!rb) return qf_fail(err, QF_ERR_DEVICE, "CUDA op: kv mode %s not supported", qf_kv_mode_name(mode));
    dallocs a = {};
    float *dx = (float *)dup_to(&a, x, (size_t)rows * hd * 4), *dout = (float *)dalloc(&a, (size_t)rows * hd * 4);
    uint8_t *c = (uint8_t *)dalloc(&a, rows * rb);
    OP_NEED(dx && dout && c);
    launch_kv_write(mode, dx, rows, hd, rb, c);
    unsigned nb = nblk((size_t)rows * hd, 256);
    switch (mode) {
    case QF_KV_F32: k_kv_read<QF_KV_F32><<<nb, 256>>>(c, rows, hd, rb, dout); break;
    case QF_KV_F16: k_kv_read<QF_KV_F16><<<nb, 256>>>(c, rows, hd, rb, dout); break;
    case QF_KV_Q8_0: k_kv_read<QF_KV_Q8_0><<<nb, 256>>>(c, rows, hd, rb, dout); break;
    case QF_KV_Q4_0: k_kv_read<QF_KV_Q4_0><<<nb, 256>>>(c, rows, hd, rb, dout); break;
    default: break;
    }
    if (cudaMemcpy(bytes, c, rows * rb, cudaMemcpyDeviceToHost) != cudaSuccess) {
        dfree(&a);
        return qf_fail(err, QF_ERR_DEVICE, "CUDA op: copy failed");
    }
    return op_finish(&a, out, dout, (size_t)rows * hd * 4, err);
}
