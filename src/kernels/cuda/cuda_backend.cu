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
 *   prefill attention over an f16 cache is a flash-attention kernel on tensor cores
 *   (k_flash_f16: mma.sync f16 x f16 -> f32, K/V tiles shared by a GQA group, causal tiles
 *   skipped); decode and other caches use one warp per (query, head): q k^T, causal online
 *   softmax and the V sum in one pass over the cache, which lives on the GPU in f32, f16, q8_0
 *   or q4_0 (ggml blocks quantized on the GPU with ggml's reference rounding, bit-exact), int8
 *   (an artifact's static scales) or dict codes (encoded on the host by the CPU's OMP encoder,
 *   decoded on the GPU); int8 and dict layers are expanded to f32 for attention;
 *   quantized weights keep a persistent f16 copy for prefill GEMMs (f16 cache, memory
 *   permitting); qf_cuda_decode_nll scores PPL rows on the GPU (log-softmax, NLL);
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
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_ops.h"
#include "engine/engine.h"
#include "engine/kv_codes.h"
}

#define MATVEC_MAX 8   /* batches up to this many tokens use the fused matvec kernel */
#define PROF_NCAT 7
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

/* one block per token; writes the f32 result to out and/or its f16 rounding to out16 (either
 * may be NULL): the f16 values are the same as converting out afterwards */
__global__ void k_rmsnorm(const float *x, const float *g, int d, float eps, float *out, __half *out16 = NULL) {
    const float *xr = x + (size_t)blockIdx.x * d;
    float *o = out ? out + (size_t)blockIdx.x * d : NULL;
    __half *o16 = out16 ? out16 + (size_t)blockIdx.x * d : NULL;
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
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float v = xr[i] * scale * g[i];
        if (o) o[i] = v;
        if (o16) o16[i] = __float2half_rn(v);
    }
}

/* k_rmsnorm with the row held in registers: float4 loads, one read of x. d a multiple of 4 and
 * at most 4 * NV * blockDim.x (launch_rmsnorm checks) */
template <int NV>
__global__ void k_rmsnorm4(const float *x, const float *g, int d, float eps, float *out, __half *out16) {
    const int d4 = d / 4;
    const float4 *xr = (const float4 *)(x + (size_t)blockIdx.x * d);
    float4 v[NV];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        v[k] = i < d4 ? xr[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
    }
    __shared__ float red[32];
    ss = warp_sum(ss);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        float r = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.0f;
        r = warp_sum(r);
        if (threadIdx.x == 0) red[0] = r;
    }
    __syncthreads();
    const float scale = 1.0f / sqrtf(red[0] / d + eps);
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i >= d4) break;
        const float4 gg = ((const float4 *)g)[i];
        const float4 r = make_float4(v[k].x * scale * gg.x, v[k].y * scale * gg.y, v[k].z * scale * gg.z,
                                     v[k].w * scale * gg.w);
        if (out) ((float4 *)(out + (size_t)blockIdx.x * d))[i] = r;
        if (out16) {
            __half2 *h = (__half2 *)(out16 + (size_t)blockIdx.x * d) + 2 * i;
            h[0] = __halves2half2(__float2half_rn(r.x), __float2half_rn(r.y));
            h[1] = __halves2half2(__float2half_rn(r.z), __float2half_rn(r.w));
        }
    }
}

/* one launch of RMSNorm over n rows of d: the register kernel when the row fits, else k_rmsnorm */
static void launch_rmsnorm(const float *x, const float *g, int n, int d, float eps, float *out, __half *out16 = NULL) {
    if (n <= 0) return;
    if (d % 4 == 0 && d <= 4 * 4 * 256) k_rmsnorm4<4><<<n, 256>>>(x, g, d, eps, out, out16);
    else if (d % 4 == 0 && d <= 4 * 8 * 256) k_rmsnorm4<8><<<n, 256>>>(x, g, d, eps, out, out16);
    else k_rmsnorm<<<n, 256>>>(x, g, d, eps, out, out16);
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

/* fused gate/up: gu[t] = [gate (F) | up (F)]; silu(gate) * up to o16 (f16, the down GEMM's
 * input) and, when o32 is set (activation taps), to o32 in f32 */
__device__ static inline float4 ld4(const float *p) { return *(const float4 *)p; }
__device__ static inline float4 ld4(const __half *p) {
    const __half2 a = ((const __half2 *)p)[0], b = ((const __half2 *)p)[1];
    return make_float4(__low2float(a), __high2float(a), __low2float(b), __high2float(b));
}

/* IT = __half: the gate|up GEMM wrote f16 (QF_CUDA_GU16=1, not certified) */
template <typename IT>
__global__ void k_silu_gu(const IT *gu, int F, float *o32, __half *o16) {
    /* grid (F / 4 / 256, n): four elements per thread, F a multiple of 32 */
    const int j = 4 * (blockIdx.x * blockDim.x + threadIdx.x);
    if (j >= F) return;
    const size_t t = blockIdx.y;
    const float4 x = ld4(gu + t * 2 * F + j), u = ld4(gu + t * 2 * F + F + j);
    const float v[4] = {x.x / (1.0f + expf(-x.x)) * u.x, x.y / (1.0f + expf(-x.y)) * u.y,
                        x.z / (1.0f + expf(-x.z)) * u.z, x.w / (1.0f + expf(-x.w)) * u.w};
    __half2 *h = (__half2 *)(o16 + t * F + j);
    h[0] = __halves2half2(__float2half_rn(v[0]), __float2half_rn(v[1]));
    h[1] = __halves2half2(__float2half_rn(v[2]), __float2half_rn(v[3]));
    if (o32) *(float4 *)(o32 + t * F + j) = make_float4(v[0], v[1], v[2], v[3]);
}

/* fused q/k/v: qkv[t] = [q (nh heads) | k (nkv) | v (nkv)] x hd; adds the biases (if any),
 * rotates q and k (k_rope's pairs and formula) and writes q, k, v to their own buffers.
 * One thread per (token, head, pair of elements). */
__device__ static inline void st_out(float *p, float x) { *p = x; }
__device__ static inline void st_out(__half *p, float x) { *p = __float2half_rn(x); }

/* OT = __half: q goes to the flash kernel's f16 Q and k, v straight into the f16 KV cache
 * (rows [t][nkv][hd] from pos0), the __float2half_rn of the same f32 values that the f32
 * route's k_kv_write and the flash kernel's Q load would round */
template <typename OT>
__global__ void k_qkv_split(const float *qkv, int n, int nh, int nkv, int hd, int half, int neox, const float *cs,
                            const float *sn, const float *bq, const float *bk, const float *bv, OT *q, OT *k, OT *v) {
    /* grid (H * hd / 2 / 256, n) */
    const int hp = hd / 2, H = nh + 2 * nkv;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= H * hp) return;
    const int h = i / hp, j = i - h * hp, t = blockIdx.y;
    const float *src = qkv + ((int64_t)t * H + h) * hd;
    OT *dst;
    const float *b;
    bool rot = true;
    if (h < nh) dst = q + ((int64_t)t * nh + h) * hd, b = bq ? bq + (size_t)h * hd : NULL;
    else if (h < nh + nkv) dst = k + ((int64_t)t * nkv + h - nh) * hd, b = bk ? bk + (size_t)(h - nh) * hd : NULL;
    else dst = v + ((int64_t)t * nkv + h - nh - nkv) * hd, b = bv ? bv + (size_t)(h - nh - nkv) * hd : NULL, rot = false;
    rot = rot && j < half;
    const int a = rot && neox ? j : 2 * j, c = rot && neox ? j + half : 2 * j + 1;
    float x0 = src[a], x1 = src[c];
    if (b) x0 += b[a], x1 += b[c];
    if (rot) {
        const float cc = cs[(size_t)t * half + j], s = sn[(size_t)t * half + j];
        const float y0 = x0 * cc - x1 * s, y1 = x0 * s + x1 * cc;
        st_out(dst + a, y0), st_out(dst + c, y1);
    } else {
        st_out(dst + a, x0), st_out(dst + c, x1);
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

/* IEEE f32 operations, each rounded to nearest on its own: on the device the intrinsics keep
 * nvcc from contracting a*b+c into an FMA (-fmad=true is nvcc's default), so the device
 * rounds exactly like the host's C oracle (quant.c, kv_codes.c). */
#ifdef __CUDA_ARCH__
#define KV_MUL(a, b) __fmul_rn((a), (b))
#define KV_ADD(a, b) __fadd_rn((a), (b))
#define KV_DIV(a, b) __fdiv_rn((a), (b))
#else
#define KV_MUL(a, b) ((a) * (b))
#define KV_ADD(a, b) ((a) + (b))
#define KV_DIV(a, b) ((a) / (b))
#endif

/* one 32-element block of a q8_0 / q4_0 cache row, as ggml's reference quantizers */
__host__ __device__ static inline void kv_quant_block(int mode, const float *x, uint8_t *out) {
    if (mode == QF_KV_Q8_0) {
        uint8_t *o = out;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = KV_DIV(amax, 127.0f);
        const float id = d ? KV_DIV(1.0f, d) : 0.0f;
        const uint16_t hx = f32_to_f16_bits(d);
        o[0] = (uint8_t)(hx & 0xFF), o[1] = (uint8_t)(hx >> 8);
        for (int j = 0; j < 32; j++) ((int8_t *)o)[2 + j] = (int8_t)roundf(KV_MUL(x[j], id));
    } else { /* QF_KV_Q4_0 */
        uint8_t *o = out;
        float amax = 0.0f, mx = 0.0f;
        for (int j = 0; j < 32; j++)
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                mx = x[j];
            }
        const float d = KV_DIV(mx, -8.0f);
        const float id = d ? KV_DIV(1.0f, d) : 0.0f;
        const uint16_t hx = f32_to_f16_bits(d);
        o[0] = (uint8_t)(hx & 0xFF), o[1] = (uint8_t)(hx >> 8);
        for (int j = 0; j < 16; j++) {
            /* x*id and +8.5 rounded separately, as the C oracle does: nvcc would otherwise
             * contract them into one FMA (one rounding), which changes some nibbles */
            int q0 = (int)KV_ADD(KV_MUL(x[j], id), 8.5f), q1 = (int)KV_ADD(KV_MUL(x[j + 16], id), 8.5f);
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

/* kv-int8: one signed byte per element with the static per-channel scales of a kv-int8
 * artifact, as qf_kv_int8_quantize: clamp(x * inv_scale, -127, 127), rounded half away from
 * zero by truncating v +- 0.5. src is [n_tok][dkv], inv [dkv] (this layer's). */
__global__ void k_kv_write_int8(const float *src, int64_t n, int dkv, const float *inv, int8_t *dst) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = fminf(fmaxf(KV_MUL(src[i], inv[i % dkv]), -127.0f), 127.0f);
    dst[i] = (int8_t)(int)KV_ADD(v, v >= 0 ? 0.5f : -0.5f);
}

/* Expand rows [0, n_rows) of a layer's int8 cache to f32: q * scale (qf_kv_int8_dequantize). */
__global__ void k_kv_expand_int8(const int8_t *src, int64_t n, int dkv, const float *scale, float *out) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = KV_MUL((float)src[i], scale[i % dkv]);
}

/* Expand packed kv-dict codes (qf_kv_code_pack layout) to f32 rows, as qf_kv_code_decode:
 * out[t] = sum over the code's atoms, in code order, of coef * atom[t] (f32, no FMA); a
 * corrupt index or a zero coefficient adds nothing. One thread per (row, element). */
__global__ void k_kv_expand_dict(const uint8_t *codes, int64_t n_rows, int hd, size_t rb, const float *atoms, int na,
                                 int s, int q8, float *out) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_rows * hd) return;
    const int64_t r = i / hd;
    const int t = (int)(i % hd);
    const uint8_t *ci = codes + r * rb;
    const uint8_t *cc = ci + (size_t)s * (na <= 256 ? 1 : 2);
    float sc = 0;
    if (q8) {
        sc = h2f(cc);
        cc += 2;
    }
    float o = 0;
    for (int j = 0; j < s; j++) {
        const int a = na <= 256 ? ci[j] : (ci[2 * j] | ci[2 * j + 1] << 8);
        const float c = q8 ? KV_MUL((float)(int8_t)cc[j], sc) : h2f(cc + 2 * j);
        if (a >= na || c == 0) continue;
        o = KV_ADD(o, KV_MUL(c, atoms[(size_t)a * hd + t]));
    }
    out[i] = o;
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

/* ---- PPL scoring: -log softmax(logits[r])[target[r]], one block per row, as ppl.c's
 * log_softmax_tok: f32 max, sum of expf(l - max) accumulated in double ---- */
__global__ void k_nll(const float *logits, int V, const int32_t *tgt, double *nll) {
    const float *l = logits + (size_t)blockIdx.x * V;
    __shared__ float smx[32];
    __shared__ double ssum[32];
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, l[i]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (threadIdx.x % 32 == 0) smx[threadIdx.x / 32] = mx;
    __syncthreads();
    mx = smx[0];
    for (int w = 1; w < (int)blockDim.x / 32; w++) mx = fmaxf(mx, smx[w]);
    double sum = 0;
    for (int i = threadIdx.x; i < V; i += blockDim.x) sum += (double)expf(l[i] - mx);
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (threadIdx.x % 32 == 0) ssum[threadIdx.x / 32] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0;
        for (int w = 0; w < (int)blockDim.x / 32; w++) t += ssum[w];
        nll[blockIdx.x] = -((double)(l[tgt[blockIdx.x]] - mx) - log(t));
    }
}

/* ---- flash attention on tensor cores (f16 KV cache, prefill) ----
 * One block of 4 warps per (64 rows, kv head). The rows of a kv head are its (query, head of
 * the group) pairs, r = i * G + g, so the K/V tile in shared memory serves the whole GQA group.
 * Each warp owns 16 rows: S = Q K^T and O += P V run as mma.sync m16n8k16 (f16 inputs, f32
 * accumulation) with Q and P rounded to f16; the online softmax (running max, exp2, sum) is in
 * f32. Tiles past the block's last query are never loaded (causal skip); head_dim is zero-
 * padded to HDP (64, 128 or 256). */
__device__ static inline uint32_t pack_h2(float a, float b) {
    __half2 h = __floats2half2_rn(a, b);
    uint32_t u;
    memcpy(&u, &h, 4);
    return u;
}
__device__ static inline void mma16816(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* 16-byte asynchronous copy global -> shared; src_bytes 0 writes zeros (src must still be a
 * valid address) */
__device__ static inline void cp_async16(void *smem, const void *gmem, int src_bytes) {
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sa), "l"(gmem), "r"(src_bytes) : "memory");
}
__device__ static inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ static inline void cp_async_wait1() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }

/* dynamic shared memory of k_flash_f16: two stages of K and V tiles */
template <int HDP, int BC> constexpr size_t flash_smem() { return (size_t)2 * 2 * BC * (HDP + 8) * sizeof(__half); }

__device__ static inline float ld_f(const float *p) { return *p; }
__device__ static inline float ld_f(const __half *p) { return __half2float(*p); }

/* QT: f32 Q, or f16 Q written by k_qkv_split<__half> (the same f16 values: Q is rounded to
 * f16 on load either way) */
template <int HDP, int BC, typename QT>
__global__ void __launch_bounds__(128) k_flash_f16(const QT *q, const __half *K, const __half *V, int n, int pos0,
                                                   int n_head, int n_head_kv, int hd, float scale_log2, float *out,
                                                   __half *out16) {
    constexpr int LD = HDP + 8; /* padded row: conflict-free fragment loads */
    /* two stages of [K tile | V tile]: the next tile is copied (cp.async) while this one is used */
    extern __shared__ __align__(16) unsigned char flash_sm[];
    __half *const sbase = (__half *)flash_sm;
    /* grid (kv heads, row blocks); the row blocks run last-first, so the longest (causal) start first */
    const int kvh = blockIdx.x, G = n_head / n_head_kv;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gq = lane >> 2, tig = lane & 3;
    const int R = n * G, rb0 = (gridDim.y - 1 - blockIdx.y) * 64;
    const int i_lo = rb0 / G, i_hi = (min(R, rb0 + 64) - 1) / G;
    const int kmax = pos0 + i_hi; /* last key any row of the block sees */
    const int nc = (hd + 15) / 16;
    const bool vec = (hd % 8) == 0;
    /* K/V tile of keys [j0, j0 + BC) into stage st; rows past kmax and columns past hd are zero */
    auto load_tile = [&](int j0, int st) {
        __half *dK = sbase + (size_t)st * 2 * BC * LD, *dV = dK + BC * LD;
#pragma unroll 4
        for (int idx = threadIdx.x; idx < BC * (HDP / 8); idx += 128) {
            const int key = idx / (HDP / 8), d = (idx % (HDP / 8)) * 8, t = j0 + key;
            const bool in = t <= kmax && d < hd;
            const size_t off = in ? ((size_t)t * n_head_kv + kvh) * hd + d : 0;
            if (vec) {
                cp_async16(dK + key * LD + d, K + off, in ? 16 : 0);
                cp_async16(dV + key * LD + d, V + off, in ? 16 : 0);
            } else {
                __half kh[8], vh[8];
                for (int e = 0; e < 8; e++) {
                    kh[e] = in && d + e < hd ? K[off + e] : __float2half(0.0f);
                    vh[e] = in && d + e < hd ? V[off + e] : __float2half(0.0f);
                }
                memcpy(dK + key * LD + d, kh, 16);
                memcpy(dV + key * LD + d, vh, 16);
            }
        }
        cp_async_commit();
    };
    load_tile(0, 0); /* in flight while Q is read */
    /* this thread's two rows */
    int rowi[2], rowh[2], lim[2];
    bool ok[2];
#pragma unroll
    for (int u = 0; u < 2; u++) {
        const int r = rb0 + warp * 16 + gq + 8 * u;
        ok[u] = r < R;
        const int rr = ok[u] ? r : R - 1;
        rowi[u] = rr / G;
        rowh[u] = kvh * G + rr % G;
        lim[u] = pos0 + rowi[u];
    }
    uint32_t qa[HDP / 16][4];
#pragma unroll
    for (int c = 0; c < HDP / 16; c++) {
#pragma unroll
        for (int hi = 0; hi < 2; hi++)
#pragma unroll
            for (int u = 0; u < 2; u++) {
                const int d = c * 16 + hi * 8 + tig * 2;
                const QT *qp = q + ((size_t)rowi[u] * n_head + rowh[u]) * hd;
                const float x0 = ok[u] && d < hd ? ld_f(qp + d) : 0.0f, x1 = ok[u] && d + 1 < hd ? ld_f(qp + d + 1) : 0.0f;
                qa[c][hi * 2 + u] = pack_h2(x0, x1);
            }
    }
    float o[HDP / 8][4];
#pragma unroll
    for (int j = 0; j < HDP / 8; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f};
    int st = 0;
    for (int j0 = 0; j0 <= kmax; j0 += BC, st ^= 1) {
        if (j0 + BC <= kmax) load_tile(j0 + BC, st ^ 1);
        else cp_async_commit(); /* an empty group keeps the wait below uniform */
        cp_async_wait1();       /* this tile's group has landed (the next may be in flight) */
        __syncthreads();
        const __half *sK = sbase + (size_t)st * 2 * BC * LD, *sV = sK + BC * LD;
        float s[BC / 8][4];
#pragma unroll
        for (int nt = 0; nt < BC / 8; nt++) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
            const __half *kr = sK + (nt * 8 + gq) * LD + tig * 2;
#pragma unroll
            for (int c = 0; c < HDP / 16; c++)
                if (c < nc) mma16816(s[nt], qa[c], *(const uint32_t *)(kr + c * 16), *(const uint32_t *)(kr + c * 16 + 8));
        }
        const bool mask = j0 + BC - 1 > pos0 + i_lo;
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < BC / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int u = e >> 1, key = j0 + nt * 8 + tig * 2 + (e & 1);
                float v = s[nt][e] * scale_log2;
                if (mask && key > lim[u]) v = -INFINITY;
                s[nt][e] = v;
                mx[u] = fmaxf(mx[u], v);
            }
        float corr[2];
#pragma unroll
        for (int u = 0; u < 2; u++) {
            mx[u] = fmaxf(mx[u], __shfl_xor_sync(0xffffffffu, mx[u], 1));
            mx[u] = fmaxf(mx[u], __shfl_xor_sync(0xffffffffu, mx[u], 2));
            const float mn = fmaxf(mrow[u], mx[u]);
            corr[u] = exp2f(mrow[u] - mn); /* first tile: exp2(-inf) = 0 */
            mrow[u] = mn;
            lrow[u] *= corr[u];
        }
#pragma unroll
        for (int nt = 0; nt < BC / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int u = e >> 1;
                const float p = exp2f(s[nt][e] - mrow[u]);
                s[nt][e] = p;
                lrow[u] += p;
            }
#pragma unroll
        for (int j = 0; j < HDP / 8; j++) {
            o[j][0] *= corr[0], o[j][1] *= corr[0];
            o[j][2] *= corr[1], o[j][3] *= corr[1];
        }
#pragma unroll
        for (int kc = 0; kc < BC / 16; kc++) {
            uint32_t pa[4] = {pack_h2(s[2 * kc][0], s[2 * kc][1]), pack_h2(s[2 * kc][2], s[2 * kc][3]),
                              pack_h2(s[2 * kc + 1][0], s[2 * kc + 1][1]), pack_h2(s[2 * kc + 1][2], s[2 * kc + 1][3])};
            const int mi = lane >> 3, key = kc * 16 + (lane & 7) + (mi & 1) * 8;
#pragma unroll
            for (int dp = 0; dp < HDP / 16; dp++) {
                if (dp >= nc) continue;
                const unsigned addr = (unsigned)__cvta_generic_to_shared(sV + key * LD + dp * 16 + (mi >> 1) * 8);
                uint32_t b0, b1, b2, b3;
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                             : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3)
                             : "r"(addr));
                mma16816(o[2 * dp], pa, b0, b1);
                mma16816(o[2 * dp + 1], pa, b2, b3);
            }
        }
        __syncthreads(); /* every warp is done with stage st before it is refilled */
    }
#pragma unroll
    for (int u = 0; u < 2; u++) {
        lrow[u] += __shfl_xor_sync(0xffffffffu, lrow[u], 1);
        lrow[u] += __shfl_xor_sync(0xffffffffu, lrow[u], 2);
    }
#pragma unroll
    for (int u = 0; u < 2; u++) {
        if (!ok[u]) continue;
        const float inv = 1.0f / lrow[u];
        const size_t ob = ((size_t)rowi[u] * n_head + rowh[u]) * hd;
        if (out16) { /* f16 output (the wo GEMM's input): the rounding of the f32 values */
#pragma unroll
            for (int j = 0; j < HDP / 8; j++) {
                const int d = j * 8 + tig * 2;
                if (d < hd) out16[ob + d] = __float2half_rn(o[j][2 * u] * inv);
                if (d + 1 < hd) out16[ob + d + 1] = __float2half_rn(o[j][2 * u + 1] * inv);
            }
            continue;
        }
        float *op = out + ob;
#pragma unroll
        for (int j = 0; j < HDP / 8; j++) {
            const int d = j * 8 + tig * 2;
            if (d < hd) op[d] = o[j][2 * u] * inv;
            if (d + 1 < hd) op[d + 1] = o[j][2 * u + 1] * inv;
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* context                                                                                   */

typedef struct {
    qf_type type;
    int64_t ne0, ne1;
    size_t row_bytes;
    uint8_t *d;
    __half *h16;           /* prefill: persistent f16 copy of a quantized weight (f16 cache), or NULL */
    bool view;             /* d and h16 point into a fused weight (wqkv, wgu), which owns them */
} dweight;

typedef struct {
    dweight wq, wk, wv, wo, wg, wu, wd;
    /* fused prefill weights: q|k|v and gate|up rows in one allocation (wq..wv, wg/wu are views
     * into them); d is NULL where the parts differ in type or row size */
    dweight wqkv, wgu;
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
    /* int8 / dict KV, bound from an artifact (qf_cuda_ctx_set_kv) */
    float *kv_scale[2], *kv_inv[2]; /* int8: [n_layer][n_head_kv * head_dim] */
    float *kv_atoms[2];             /* dict: [n_layer][n_atoms][head_dim], unit norm */
    int kv_na[2], kv_s[2], kv_q8[2];
    float *kv_f32[2];               /* int8 / dict: the layer's cache expanded to f32, [n_ctx][n_head_kv][head_dim] */
    uint8_t *h_codes;               /* dict: host staging of the codes of one batch */
    int nkv, hd;
    int n_ctx, n_batch;
    bool gemm_f32;
    bool attn_warp;        /* QF_CUDA_ATTN=warp: the one-warp-per-(query, head) kernel for prefill too */
    bool gu16;             /* QF_CUDA_GU16=1 (experimental, not certified): the gate|up GEMM writes f16 */
    bool f16_cache;        /* quantized weights keep an f16 copy for prefill GEMMs (QF_CUDA_F16_CACHE=0: off) */
    size_t f16_cache_bytes;
    /* device scratch */
    float *x, *xn, *q, *k, *v, *att, *hb, *hb2, *logits, *rcos, *rsin;
    float *qkv, *gu;       /* fused GEMM outputs: [n_batch][Dq + 2 Dkv], [n_batch][2 n_ff] */
    void *wdeq;            /* dequantized weight (f16 or f32) */
    size_t wdeq_bytes;
    __half *xh;            /* f16 activations for the f16 gemm */
    int32_t *tok, *tgt;
    double *nll;           /* [n_batch] per-row NLL of the PPL scoring kernel */
    float *h_pin;          /* pinned staging for the logits copy (2 halves), or NULL */
    size_t pin_bytes;
    cudaEvent_t pin_ev[2];
    /* host */
    float *h_cos, *h_sin, *h_k, *h_v, *h_act, *rope_ff;
    size_t weight_bytes, kv_bytes, scratch_bytes;
    /* QF_CUDA_PROFILE=1: events between the stages of each decode, summed per category and
     * printed when the context is freed */
    cudaEvent_t *ev;
    int *ev_cat, n_ev, prof_calls;
    double prof_ms[PROF_NCAT], prof_first[PROF_NCAT]; /* all calls; the first call alone */
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

/* --kv-rot: not in the GPU cache yet (the CPU route runs it; see qf_context_new) */
extern "C" bool qf_cuda_backend_kv_rot_ok(qf_kv_rot rot) { return rot == QF_KV_ROT_NONE; }

extern "C" int qf_par_device_index(void); /* util/par.h: the MPI local rank, -1 alone */

extern "C" bool qf_cuda_backend_available(void) {
    static int cached = -1;
    if (cached < 0) {
        int n = 0;
        cudaError_t e = cudaGetDeviceCount(&n);
        cached = (e == cudaSuccess && n > 0) ? 1 : 0;
        if (e != cudaSuccess) cudaGetLastError(); /* clear */
        /* under mpirun one rank per GPU: local rank r drives device r % n (docs/mpi.md) */
        int want = qf_par_device_index();
        if (cached == 1 && want >= 0 && cudaSetDevice(want % n) != cudaSuccess) cudaGetLastError();
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
    if (!w->view) {
        if (w->d) cudaFree(w->d);
        if (w->h16) cudaFree(w->h16);
    }
    w->d = NULL, w->h16 = NULL;
}

/* Upload cnt weights that share type and row size as consecutive rows of one allocation
 * (*fused), the parts being views into it; otherwise upload them one by one (fused->d NULL). */
static qf_status upload_fused(qf_cuda_ctx *g, const qf_weight *const *ws, const char *const *names, int cnt,
                              dweight *const *parts, dweight *fused, qf_error *err) {
    qf_status st = QF_OK;
    bool ok = true;
    int64_t rows = 0;
    memset(fused, 0, sizeof *fused);
    for (int i = 0; i < cnt; i++) {
        const qf_weight *w = ws[i];
        ok = ok && w->data && w->type == ws[0]->type && w->ne0 == ws[0]->ne0 && w->row_bytes == ws[0]->row_bytes &&
             gpu_type_ok(w->type) && w->type != QF_TYPE_F32 && w->ne0 % 32 == 0;
        rows += w->ne1;
    }
    if (!ok) {
        for (int i = 0; i < cnt; i++)
            if ((st = upload_weight(g, ws[i], names[i], parts[i], err))) return st;
        return QF_OK;
    }
    const size_t rb = ws[0]->row_bytes;
    fused->type = ws[0]->type, fused->ne0 = ws[0]->ne0, fused->ne1 = rows, fused->row_bytes = rb;
    CK(cudaMalloc((void **)&fused->d, rb * (size_t)rows));
    g->weight_bytes += rb * (size_t)rows;
    rows = 0;
    for (int i = 0; i < cnt; i++) {
        dweight *p = parts[i];
        memset(p, 0, sizeof *p);
        p->type = ws[i]->type, p->ne0 = ws[i]->ne0, p->ne1 = ws[i]->ne1, p->row_bytes = rb, p->view = true;
        p->d = fused->d + rb * (size_t)rows;
        CK(cudaMemcpy(p->d, ws[i]->data, rb * (size_t)ws[i]->ne1, cudaMemcpyHostToDevice));
        rows += ws[i]->ne1;
    }
done:
    return st;
}

#define PROF_MAX_EV 4096
static const char *const prof_names[PROF_NCAT] = {"norm/rope/misc", "matmul q/k/v", "attention+kv", "logits",
                                                  "matmul o",       "matmul gate/up", "matmul down"};
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
        if (!g->prof_calls) g->prof_first[g->ev_cat[i]] += ms;
    }
    g->n_ev = 0;
    g->prof_calls++;
}

extern "C" void qf_cuda_ctx_free(qf_cuda_ctx *g) {
    if (!g) return;
    if (g->ev) {
        fprintf(stderr, "QF_CUDA_PROFILE: %d decode calls:", g->prof_calls);
        for (int i = 0; i < PROF_NCAT; i++) fprintf(stderr, " %s %.2f ms;", prof_names[i], g->prof_ms[i]);
        fprintf(stderr, "\n");
        if (g->prof_calls > 1) {
            fprintf(stderr, "QF_CUDA_PROFILE: per call after the first (%d calls):", g->prof_calls - 1);
            for (int i = 0; i < PROF_NCAT; i++)
                fprintf(stderr, " %s %.3f ms;", prof_names[i], (g->prof_ms[i] - g->prof_first[i]) / (g->prof_calls - 1));
            fprintf(stderr, "\n");
        }
        for (int i = 0; i < PROF_MAX_EV; i++) cudaEventDestroy(g->ev[i]);
        free(g->ev), free(g->ev_cat);
    }
    if (g->layers) {
        for (int il = 0; il < g->n_layer; il++) {
            dlayer *L = &g->layers[il];
            free_weight(&L->wq), free_weight(&L->wk), free_weight(&L->wv), free_weight(&L->wo);
            free_weight(&L->wg), free_weight(&L->wu), free_weight(&L->wd);
            free_weight(&L->wqkv), free_weight(&L->wgu);
            float *vs[] = {L->attn_norm, L->ffn_norm, L->bq, L->bk, L->bv};
            for (int i = 0; i < 5; i++)
                if (vs[i]) cudaFree(vs[i]);
        }
        free(g->layers);
    }
    if (g->output.d != g->tok_embd.d) free_weight(&g->output);
    else if (g->output.h16) cudaFree(g->output.h16); /* tied: only the f16 cache is the output's own */
    free_weight(&g->tok_embd);
    void *bufs[] = {g->output_norm, g->kv[0], g->kv[1], g->x, g->xn, g->q, g->k, g->v, g->att, g->hb,
                    g->hb2, g->logits, g->rcos, g->rsin, g->wdeq, g->xh, g->tok, g->tgt, g->nll,
                    g->qkv, g->gu};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) cudaFree(bufs[i]);
    if (g->blas) cublasDestroy(g->blas);
    if (g->h_pin) {
        cudaFreeHost(g->h_pin);
        cudaEventDestroy(g->pin_ev[0]), cudaEventDestroy(g->pin_ev[1]);
    }
    for (int s = 0; s < 2; s++) {
        float *ps[] = {g->kv_scale[s], g->kv_inv[s], g->kv_atoms[s], g->kv_f32[s]};
        for (int i = 0; i < 4; i++)
            if (ps[i]) cudaFree(ps[i]);
    }
    free(g->h_codes);
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

/* (Re)build the GPU KV cache in kv's modes: f32, f16, q8_0, q4_0 as they are; int8 with
 * kv's static scales (and their reciprocals, the host's own, so the device quantizes with
 * the same bits); dict with kv's normalised dictionaries (the codes are encoded on the host,
 * see kv_store). The old cache is freed only once the new one exists. */
extern "C" qf_status qf_cuda_ctx_set_kv(qf_cuda_ctx *g, const qf_kv_cache *kv, qf_error *err) {
    qf_status st = QF_OK;
    const int hd = g->hd, nkv = g->nkv, L = g->n_layer, dkv = nkv * hd;
    qf_kv_mode mode[2] = {kv->mode_k, kv->mode_v};
    size_t rb[2] = {0, 0}, lb[2] = {0, 0}, codes = 0;
    uint8_t *d[2] = {NULL, NULL}, *hc = NULL;
    float *sc[2] = {NULL, NULL}, *inv[2] = {NULL, NULL}, *at[2] = {NULL, NULL}, *f32[2] = {NULL, NULL};
    int na[2] = {0, 0}, sp[2] = {0, 0}, q8[2] = {0, 0};
    if (kv->n_layer != L || kv->n_head_kv != nkv || kv->head_dim != hd || kv->n_ctx != g->n_ctx)
        return qf_fail(err, QF_ERR_ARG, "CUDA backend: the KV cache's shape does not match the GPU context");
    for (int s = 0; s < 2; s++) {
        if (mode[s] == QF_KV_INT8) {
            if (!kv->int8_scale[s] || !kv->int8_inv_scale[s])
                return qf_fail(err, QF_ERR_ARG, "CUDA backend: int8 KV cache without scales");
            rb[s] = (size_t)hd;
        } else if (mode[s] == QF_KV_DICT) {
            const struct qf_kv_dict_bind *db = kv->dict[s];
            if (!db) return qf_fail(err, QF_ERR_ARG, "CUDA backend: dict KV cache without dictionaries");
            na[s] = db->n_atoms, sp[s] = db->sparsity, q8[s] = db->coef == QF_KV_COEF_Q8;
            rb[s] = qf_kv_code_bytes(db->n_atoms, db->sparsity, db->coef);
            codes = wmax(codes, rb[s]);
        } else {
            rb[s] = kv_row_bytes(mode[s], hd);
        }
        if (!rb[s] || rb[s] != kv->row_bytes[s])
            return qf_fail(err, QF_ERR_DEVICE, "CUDA backend: KV cache type %s (head_dim %d) is not supported on the GPU",
                           qf_kv_mode_name(mode[s]), hd);
        lb[s] = rb[s] * (size_t)g->n_ctx * nkv;
        CK(cudaMalloc((void **)&d[s], lb[s] * L));
        if (mode[s] == QF_KV_INT8) {
            CK(cudaMalloc((void **)&sc[s], (size_t)L * dkv * 4));
            CK(cudaMalloc((void **)&inv[s], (size_t)L * dkv * 4));
            CK(cudaMemcpy(sc[s], kv->int8_scale[s], (size_t)L * dkv * 4, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(inv[s], kv->int8_inv_scale[s], (size_t)L * dkv * 4, cudaMemcpyHostToDevice));
        }
        if (mode[s] == QF_KV_DICT) {
            const size_t per = (size_t)na[s] * hd;
            CK(cudaMalloc((void **)&at[s], per * L * 4));
            for (int l = 0; l < L; l++)
                CK(cudaMemcpy(at[s] + per * l, kv->dict[s]->layer[l].atoms, per * 4, cudaMemcpyHostToDevice));
        }
        if (mode[s] == QF_KV_INT8 || mode[s] == QF_KV_DICT) CK(cudaMalloc((void **)&f32[s], (size_t)g->n_ctx * dkv * 4));
    }
    if (codes && !(hc = (uint8_t *)malloc(codes * nkv * (size_t)g->n_batch))) {
        st = qf_fail(err, QF_ERR_NOMEM, "out of memory");
        goto done;
    }
done:
    if (st) {
        for (int s = 0; s < 2; s++) {
            void *ps[] = {d[s], sc[s], inv[s], at[s], f32[s]};
            for (int i = 0; i < 5; i++)
                if (ps[i]) cudaFree(ps[i]);
        }
        free(hc);
        return st;
    }
    g->kv_bytes = 0;
    for (int s = 0; s < 2; s++) {
        void *ps[] = {g->kv[s], g->kv_scale[s], g->kv_inv[s], g->kv_atoms[s], g->kv_f32[s]};
        for (int i = 0; i < 5; i++)
            if (ps[i]) cudaFree(ps[i]);
        g->kv_mode[s] = mode[s], g->kv_rb[s] = rb[s], g->kv_layer_bytes[s] = lb[s], g->kv[s] = d[s];
        g->kv_scale[s] = sc[s], g->kv_inv[s] = inv[s], g->kv_atoms[s] = at[s], g->kv_f32[s] = f32[s];
        g->kv_na[s] = na[s], g->kv_s[s] = sp[s], g->kv_q8[s] = q8[s];
        g->kv_bytes += lb[s] * L;
    }
    free(g->h_codes);
    g->h_codes = hc;
    return QF_OK;
}


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
    const char *am = getenv("QF_CUDA_ATTN");
    g->attn_warp = am && strcmp(am, "warp") == 0;
    g->gu16 = getenv("QF_CUDA_GU16") && atoi(getenv("QF_CUDA_GU16")) == 1;
    g->f16_cache = !(getenv("QF_CUDA_F16_CACHE") && atoi(getenv("QF_CUDA_F16_CACHE")) == 0);
    const int D = hp->n_embd, F = hp->n_ff, Dq = hp->n_head * hp->head_dim, Dkv = hp->n_head_kv * hp->head_dim,
              B = c->n_batch, half = hp->n_rot / 2;
    const size_t V = (size_t)hp->n_vocab;
    size_t max_w = 0; /* largest weight in elements */

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
        char nm[7][96];
        const char *nmp[7];
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
            snprintf(nm[i], sizeof nm[i], "blk.%d.%s.weight", il, ws[i].n);
            nmp[i] = nm[i];
            max_w = wmax(max_w, (size_t)ws[i].w->ne0 * ws[i].w->ne1);
        }
        {
            const qf_weight *f3[3] = {&L->wq, &L->wk, &L->wv}, *f2[2] = {&L->w_gate, &L->w_up};
            dweight *p3[3] = {&dl->wq, &dl->wk, &dl->wv}, *p2[2] = {&dl->wg, &dl->wu};
            if ((st = upload_fused(g, f3, nmp, 3, p3, &dl->wqkv, err))) goto done;
            if ((st = upload_fused(g, f2, nmp + 4, 2, p2, &dl->wgu, err))) goto done;
        }
        for (int i = 3; i < 7; i += 3)
            if ((st = upload_weight(g, ws[i].w, nmp[i], ws[i].d, err))) goto done;
        if ((st = upload_vec(g, &L->attn_norm, &dl->attn_norm, err)) || (st = upload_vec(g, &L->ffn_norm, &dl->ffn_norm, err)) ||
            (st = upload_vec(g, &L->bq, &dl->bq, err)) || (st = upload_vec(g, &L->bk, &dl->bk, err)) ||
            (st = upload_vec(g, &L->bv, &dl->bv, err)))
            goto done;
    }
    /* KV cache, in the modes of the context's CPU-side cache (c->kv) */
    g->nkv = hp->n_head_kv, g->hd = hp->head_dim;
    if ((st = qf_cuda_ctx_set_kv(g, &c->kv, err))) goto done;
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
        if (B > MATVEC_MAX) {
            CK(cudaMalloc((void **)&g->qkv, (size_t)B * (Dq + 2 * Dkv) * 4)); sc += (size_t)B * (Dq + 2 * Dkv) * 4;
            CK(cudaMalloc((void **)&g->gu, (size_t)B * 2 * F * 4)); sc += (size_t)B * 2 * F * 4;
        }
        CK(cudaMalloc((void **)&g->logits, (size_t)B * V * 4)); sc += (size_t)B * V * 4;
        CK(cudaMalloc((void **)&g->rcos, (size_t)B * half * 4 + 4));
        CK(cudaMalloc((void **)&g->rsin, (size_t)B * half * 4 + 4));
        CK(cudaMalloc((void **)&g->xh, (size_t)B * maxK * 2)); sc += (size_t)B * maxK * 2;
        CK(cudaMalloc((void **)&g->tok, (size_t)B * 4));
        CK(cudaMalloc((void **)&g->tgt, (size_t)B * 4));
        CK(cudaMalloc((void **)&g->nll, (size_t)B * 8));
        /* pinned staging for logits copies of more than one row: 2 x 16 MiB */
        if (B > 1 && cudaMallocHost((void **)&g->h_pin, (size_t)32 << 20) == cudaSuccess) {
            g->pin_bytes = (size_t)32 << 20;
            CK(cudaEventCreateWithFlags(&g->pin_ev[0], cudaEventDisableTiming));
            CK(cudaEventCreateWithFlags(&g->pin_ev[1], cudaEventDisableTiming));
        } else {
            cudaGetLastError();
            g->h_pin = NULL;
        }
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
    out->f16_cache_bytes = g->f16_cache_bytes;
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
        if (w->h16) W = w->h16;
        else if (w->type != QF_TYPE_F16) {
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

/* y[n][N] (+)= xh[n][K] . W^T, the f16 route with f16 activations already in place */
static qf_status dev_gemm_h(cublasHandle_t blas, const dweight *w, const __half *xh, int n, void *y, bool accumulate,
                            void *wdeq, qf_error *err, cudaDataType yt = CUDA_R_32F) {
    qf_status st = QF_OK;
    const int K = (int)w->ne0, N = (int)w->ne1;
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    const __half *W = (const __half *)w->d;
    if (w->h16) W = w->h16;
    else if (w->type != QF_TYPE_F16) {
        launch_dequant(w, wdeq, false);
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
static bool gemm_h_ok(const qf_cuda_ctx *g, const dweight *w) {
    return w->d && w->type != QF_TYPE_F32 &&
           (w->h16 || w->type == QF_TYPE_F16 || (size_t)w->ne0 * w->ne1 * 2 <= g->wdeq_bytes);
}

/* flash route: f16 K and V, head_dim <= 256 */
static bool flash_ok(qf_kv_mode mk, qf_kv_mode mv, int hd) { return mk == QF_KV_F16 && mv == QF_KV_F16 && hd <= 256; }

/* one instantiation of k_flash_f16; its dynamic shared memory (over 48 KiB) is allowed once */
template <int HDP, int BC, typename QT>
static void launch_flash_t(dim3 grid, const QT *q, const __half *K, const __half *V, int n, int pos0, int n_head,
                           int n_head_kv, int hd, float scale_log2, float *out, __half *out16) {
    static bool attr_set = false;
    if (!attr_set) {
        cudaFuncSetAttribute(k_flash_f16<HDP, BC, QT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)flash_smem<HDP, BC>());
        attr_set = true;
    }
    k_flash_f16<HDP, BC, QT><<<grid, 128, flash_smem<HDP, BC>()>>>(q, K, V, n, pos0, n_head, n_head_kv, hd,
                                                                  scale_log2, out, out16);
}

template <typename QT>
static void launch_flash(const QT *q, const uint8_t *K, const uint8_t *V, int n, int pos0, int n_head, int n_head_kv,
                         int hd, float *out, __half *out16 = NULL) {
    const float scale_log2 = 1.4426950408889634f / sqrtf((float)hd);
    const int G = n_head / n_head_kv;
    dim3 grid((unsigned)n_head_kv, nblk((size_t)n * G, 64));
    const __half *Kh = (const __half *)K, *Vh = (const __half *)V;
    if (hd <= 64) launch_flash_t<64, 64>(grid, q, Kh, Vh, n, pos0, n_head, n_head_kv, hd, scale_log2, out, out16);
    else if (hd <= 128) launch_flash_t<128, 64>(grid, q, Kh, Vh, n, pos0, n_head, n_head_kv, hd, scale_log2, out, out16);
    else launch_flash_t<256, 32>(grid, q, Kh, Vh, n, pos0, n_head, n_head_kv, hd, scale_log2, out, out16);
}

/* q16 set (flash route only): Q in f16, q unused */
static void launch_attention(qf_kv_mode mk, qf_kv_mode mv, const float *q, const uint8_t *K, const uint8_t *V,
                             size_t rbk, size_t rbv, int n, int pos0, int n_head, int n_head_kv, int hd, float *out,
                             bool flash, __half *out16 = NULL, const __half *q16 = NULL) {
    if (flash && flash_ok(mk, mv, hd)) { /* out16 set: f16 output only */
        if (q16) launch_flash(q16, K, V, n, pos0, n_head, n_head_kv, hd, out, out16);
        else launch_flash(q, K, V, n, pos0, n_head, n_head_kv, hd, out, out16);
        return;
    }
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

/* Store n tokens of stream s (src [n][n_head_kv][head_dim] f32 on the device) at pos0 in
 * layer il's cache, and say how attention reads the layer: the cache itself (f32, f16, q8_0,
 * q4_0), or, for int8 and dict, positions [0, pos0 + n) expanded to f32 in g->kv_f32[s].
 * dict rows are OMP-encoded on the host by the CPU cache's own encoder and dictionaries
 * (c->kv.dict[s]: qf_kv_omp_one + qf_kv_code_pack), so the codes are the CPU's for the same
 * vectors; the codes are then uploaded and decoded on the device. */
static qf_status kv_store(qf_context *c, qf_cuda_ctx *g, int s, int il, const float *src, int n, int pos0,
                          const uint8_t **view, qf_kv_mode *vmode, size_t *vrb, qf_error *err) {
    qf_status st = QF_OK;
    const int hd = g->hd, nkv = g->nkv, dkv = nkv * hd;
    const qf_kv_mode mode = g->kv_mode[s];
    const size_t rb = g->kv_rb[s];
    uint8_t *C = g->kv[s] + g->kv_layer_bytes[s] * il;
    const int64_t rows = (int64_t)n * nkv, all = (int64_t)(pos0 + n) * nkv;
    *view = C, *vmode = mode, *vrb = rb;
    if (mode == QF_KV_INT8) {
        k_kv_write_int8<<<nblk((size_t)rows * hd, 256), 256>>>(src, rows * hd, dkv, g->kv_inv[s] + (size_t)il * dkv,
                                                              (int8_t *)(C + (size_t)pos0 * nkv * rb));
        k_kv_expand_int8<<<nblk((size_t)all * hd, 256), 256>>>((const int8_t *)C, all * hd, dkv,
                                                               g->kv_scale[s] + (size_t)il * dkv, g->kv_f32[s]);
    } else if (mode == QF_KV_DICT) {
        struct qf_kv_dict_bind *d = c->kv.dict[s];
        if (!d || d->n_atoms != g->kv_na[s] || d->sparsity != g->kv_s[s])
            return qf_fail(err, QF_ERR_DEVICE, "CUDA backend: the dict KV cache is not bound on the host side");
        float *h = s ? g->h_v : g->h_k;
        CK(cudaMemcpy(h, src, (size_t)rows * hd * 4, cudaMemcpyDeviceToHost));
        const qf_kv_dict *Ld = &d->layer[il];
        for (int64_t r = 0; r < rows; r++) {
            qf_kv_omp_one(Ld, h + (size_t)r * hd, d->sparsity, d->scratch, d->idx, d->coef_buf);
            qf_kv_code_pack(d->idx, d->coef_buf, d->sparsity, d->n_atoms, d->coef, g->h_codes + (size_t)r * rb);
        }
        CK(cudaMemcpy(C + (size_t)pos0 * nkv * rb, g->h_codes, (size_t)rows * rb, cudaMemcpyHostToDevice));
        k_kv_expand_dict<<<nblk((size_t)all * hd, 256), 256>>>(C, all, hd, rb, g->kv_atoms[s] + (size_t)il * g->kv_na[s] * hd,
                                                               g->kv_na[s], g->kv_s[s], g->kv_q8[s], g->kv_f32[s]);
    } else {
        launch_kv_write(mode, src, rows, hd, rb, C + (size_t)pos0 * nkv * rb);
        return QF_OK;
    }
    *view = (const uint8_t *)g->kv_f32[s], *vmode = QF_KV_F32, *vrb = (size_t)hd * 4;
done:
    return st;
}

/* ---------------------------------------------------------------------------------------- */
/* the forward pass                                                                          */

/* f16 cache: on the first prefill GEMM of a quantized weight, dequantize it once into a
 * persistent f16 matrix (the same k_dequant as the per-call route, so the GEMM sees identical
 * values) while at least 2 GiB of device memory stay free; otherwise keep dequantizing per call. */
static void ensure_h16(qf_cuda_ctx *g, dweight *w, int n) {
    if (!g->f16_cache || g->gemm_f32 || n <= MATVEC_MAX || w->h16 || w->view || !w->d || w->type == QF_TYPE_F16 ||
        w->type == QF_TYPE_F32)
        return;
    const size_t bytes = (size_t)w->ne0 * w->ne1 * 2;
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess || fr < bytes + ((size_t)2 << 30)) {
        g->f16_cache = false;
        return;
    }
    if (cudaMalloc((void **)&w->h16, bytes) != cudaSuccess) {
        cudaGetLastError();
        w->h16 = NULL;
        g->f16_cache = false;
        return;
    }
    launch_dequant(w, w->h16, false);
    g->f16_cache_bytes += bytes;
}

/* the same for a fused weight; its parts then read their rows of the fused f16 copy */
static void ensure_h16_fused(qf_cuda_ctx *g, dweight *f, dweight *const *parts, int cnt, int n) {
    if (!f->d) return;
    ensure_h16(g, f, n);
    if (!f->h16 || parts[0]->h16) return;
    int64_t rows = 0;
    for (int i = 0; i < cnt; i++) {
        parts[i]->h16 = f->h16 + (size_t)rows * f->ne0;
        rows += parts[i]->ne1;
    }
}

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

/* device logits -> pageable host memory through the pinned staging buffer: the copy of one
 * half overlaps the host memcpy of the other */
static cudaError_t copy_logits(qf_cuda_ctx *g, float *dst, const float *src, size_t bytes) {
    if (!g->h_pin || bytes <= ((size_t)1 << 20)) return cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
    const size_t half = g->pin_bytes / 2;
    uint8_t *pin = (uint8_t *)g->h_pin, *d = (uint8_t *)dst;
    const uint8_t *sp = (const uint8_t *)src;
    size_t off[2] = {0, 0}, len[2] = {0, 0}, next = 0;
    cudaError_t e = cudaSuccess;
    int b = 0;
    for (int k = 0; k < 2 && next < bytes; k++) { /* prime both halves */
        off[k] = next, len[k] = bytes - next < half ? bytes - next : half;
        if ((e = cudaMemcpyAsync(pin + k * half, sp + off[k], len[k], cudaMemcpyDeviceToHost, 0))) return e;
        if ((e = cudaEventRecord(g->pin_ev[k], 0))) return e;
        next += len[k];
    }
    while (len[b]) {
        if ((e = cudaEventSynchronize(g->pin_ev[b]))) return e;
        memcpy(d + off[b], pin + b * half, len[b]);
        len[b] = 0;
        if (next < bytes) {
            off[b] = next, len[b] = bytes - next < half ? bytes - next : half;
            if ((e = cudaMemcpyAsync(pin + b * half, sp + off[b], len[b], cudaMemcpyDeviceToHost, 0))) return e;
            if ((e = cudaEventRecord(g->pin_ev[b], 0))) return e;
            next += len[b];
        }
        b ^= 1;
    }
    return cudaSuccess;
}

static qf_status cuda_forward(qf_context *c, qf_cuda_ctx *g, const int32_t *tokens, int n, int pos0, float *logits,
                              int logits_from, const int32_t *targets, double *nll, qf_error *err);

extern "C" qf_status qf_cuda_decode(qf_context *c, qf_cuda_ctx *g, const int32_t *tokens, int n, int pos0,
                                    float *logits, int logits_from, qf_error *err) {
    return cuda_forward(c, g, tokens, n, pos0, logits, logits_from, NULL, NULL, err);
}

extern "C" qf_status qf_cuda_decode_nll(qf_context *c, const int32_t *tokens, int n, int pos0, int from,
                                        const int32_t *targets, double *nll, qf_error *err) {
    if (!c->gpu) return qf_fail(err, QF_ERR_DEVICE, "decode_nll: the context does not run on the GPU");
    if (from < 0 || from >= n) return qf_fail(err, QF_ERR_ARG, "decode_nll: first scored row %d outside [0, %d)", from, n);
    for (int r = from; r < n; r++)
        if (targets[r - from] < 0 || targets[r - from] >= c->model->hp.n_vocab)
            return qf_fail(err, QF_ERR_ARG, "decode_nll: target token %d out of range", targets[r - from]);
    return cuda_forward(c, c->gpu, tokens, n, pos0, NULL, from, targets, nll, err);
}

static qf_status cuda_forward(qf_context *c, qf_cuda_ctx *g, const int32_t *tokens, int n, int pos0, float *logits,
                              int logits_from, const int32_t *targets, double *nll, qf_error *err) {
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
        dlayer *L = &g->layers[il];
        {
            dweight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->wg, &L->wu, &L->wd};
            for (int i = 0; i < 7; i++) ensure_h16(g, ws[i], n);
            dweight *p3[3] = {&L->wq, &L->wk, &L->wv}, *p2[2] = {&L->wg, &L->wu};
            ensure_h16_fused(g, &L->wqkv, p3, 3, n), ensure_h16_fused(g, &L->wgu, p2, 2, n);
        }
        /* prefill on the f16 route with fused weights: one GEMM for q|k|v (f32 and f16 KV
         * only, see below) and one for gate|up, the norms and SiLU*up writing the GEMMs' f16
         * inputs directly */
        const bool pre16 = n > MATVEC_MAX && route == QF_CUDA_MM_AUTO && g->qkv;
        const bool fqkv = pre16 && gemm_h_ok(g, &L->wqkv) && hd % 2 == 0 &&
                          (g->kv_mode[0] == QF_KV_F32 || g->kv_mode[0] == QF_KV_F16) &&
                          (g->kv_mode[1] == QF_KV_F32 || g->kv_mode[1] == QF_KV_F16);
        const bool fgu = pre16 && gemm_h_ok(g, &L->wgu);
        const bool want_act = tap && tap->on_act;
        /* f16 KV on the flash route, no K/V tap: the split writes the f16 Q and the cache rows */
        const bool kv16 = fqkv && g->kv_mode[0] == QF_KV_F16 && g->kv_mode[1] == QF_KV_F16 && !g->attn_warp &&
                          flash_ok(QF_KV_F16, QF_KV_F16, hd) && g->kv_rb[0] == (size_t)hd * 2 &&
                          g->kv_rb[1] == (size_t)hd * 2 && !(tap && tap->on_kv);
        __half *const q16 = kv16 ? (__half *)g->q : NULL; /* f16 Q in g->q's memory */
        bool att16 = false;
        launch_rmsnorm(g->x, L->attn_norm, n, D, hp->rms_eps, !fqkv || want_act ? g->xn : NULL, fqkv ? g->xh : NULL);
        if ((st = tap_act(g, tap, il, QF_ACT_ATTN_IN, n, D, g->xn, err))) goto done;
        prof_mark(g, 0);
        if (fqkv) {
            if ((st = dev_gemm_h(g->blas, &L->wqkv, g->xh, n, g->qkv, false, g->wdeq, err))) goto done;
            prof_mark(g, 1);
            const dim3 sg(nblk((size_t)(hp->n_head + 2 * nkv) * (hd / 2), 256), (unsigned)n);
            if (kv16) {
                const size_t at = (size_t)pos0 * nkv * hd; /* f16 elements before row pos0 */
                k_qkv_split<__half><<<sg, 256>>>(g->qkv, n, hp->n_head, nkv, hd, half, hp->rope_type == QF_ROPE_NEOX,
                                                 g->rcos, g->rsin, L->bq, L->bk, L->bv, q16,
                                                 (__half *)(g->kv[0] + g->kv_layer_bytes[0] * il) + at,
                                                 (__half *)(g->kv[1] + g->kv_layer_bytes[1] * il) + at);
            } else
                k_qkv_split<float><<<sg, 256>>>(g->qkv, n, hp->n_head, nkv, hd, half, hp->rope_type == QF_ROPE_NEOX,
                                                g->rcos, g->rsin, L->bq, L->bk, L->bv, g->q, g->k, g->v);
        } else {
            if ((st = dev_matmul(g->blas, &L->wq, g->xn, n, g->q, false, route, g->wdeq, g->xh, err))) goto done;
            {
                /* a quantized cache (q8_0, q4_0, int8, dict) rounds K and V to a coarse grid or picks
                 * atoms by argmax, and f16 GEMM inputs move some of those decisions away from the
                 * CPU's: with such a cache the prefill projects K and V in f32 (sgemm) */
                qf_cuda_mm_route rkv[2];
                const dweight *wkv[2] = {&L->wk, &L->wv};
                for (int s = 0; s < 2; s++)
                    rkv[s] = n > MATVEC_MAX && g->kv_mode[s] != QF_KV_F32 && g->kv_mode[s] != QF_KV_F16 &&
                                     (size_t)wkv[s]->ne0 * wkv[s]->ne1 * 4 <= g->wdeq_bytes
                                 ? QF_CUDA_MM_GEMM_F32
                                 : route;
                if ((st = dev_matmul(g->blas, &L->wk, g->xn, n, g->k, false, rkv[0], g->wdeq, g->xh, err))) goto done;
                if ((st = dev_matmul(g->blas, &L->wv, g->xn, n, g->v, false, rkv[1], g->wdeq, g->xh, err))) goto done;
            }
            prof_mark(g, 1);
            if (L->bq) k_add_bias<<<nblk((size_t)n * Dq, 256), 256>>>(g->q, L->bq, n, Dq);
            if (L->bk) k_add_bias<<<nblk((size_t)n * Dkv, 256), 256>>>(g->k, L->bk, n, Dkv);
            if (L->bv) k_add_bias<<<nblk((size_t)n * Dkv, 256), 256>>>(g->v, L->bv, n, Dkv);
            k_rope<<<nblk((size_t)n * hp->n_head * half, 256), 256>>>(g->q, n, hp->n_head, hd, half,
                                                                      hp->rope_type == QF_ROPE_NEOX, g->rcos, g->rsin);
            k_rope<<<nblk((size_t)n * nkv * half, 256), 256>>>(g->k, n, nkv, hd, half, hp->rope_type == QF_ROPE_NEOX,
                                                                 g->rcos, g->rsin);
        }
        if (tap && tap->on_kv) {
            CK(cudaMemcpy(g->h_k, g->k, (size_t)n * Dkv * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(g->h_v, g->v, (size_t)n * Dkv * 4, cudaMemcpyDeviceToHost));
            tap->on_kv(tap->user, il, pos0, n, nkv, hd, g->h_k, g->h_v);
        }
        prof_mark(g, 0);
        {
            const uint8_t *kvp[2];
            qf_kv_mode km[2];
            size_t krb[2];
            for (int s = 0; s < 2; s++)
                if (kv16) /* already written by the split */
                    kvp[s] = g->kv[s] + g->kv_layer_bytes[s] * il, km[s] = QF_KV_F16, krb[s] = g->kv_rb[s];
                else if ((st = kv_store(c, g, s, il, s ? g->v : g->k, n, pos0, &kvp[s], &km[s], &krb[s], err)))
                    goto done;
            /* flash attention on the f16 route writes the wo GEMM's f16 input directly */
            const bool fl = n > MATVEC_MAX && !g->attn_warp && flash_ok(km[0], km[1], hd);
            att16 = fl && pre16 && !want_act && gemm_h_ok(g, &L->wo);
            launch_attention(km[0], km[1], g->q, kvp[0], kvp[1], krb[0], krb[1], n, pos0, hp->n_head, nkv, hd, g->att,
                             n > MATVEC_MAX && !g->attn_warp, att16 ? g->xh : NULL, q16);
        }
        prof_mark(g, 2);
        if ((st = tap_act(g, tap, il, QF_ACT_ATTN_OUT, n, Dq, g->att, err))) goto done;
        if (att16) {
            if ((st = dev_gemm_h(g->blas, &L->wo, g->xh, n, g->x, true, g->wdeq, err))) goto done;
        } else if ((st = dev_matmul(g->blas, &L->wo, g->att, n, g->x, true, route, g->wdeq, g->xh, err))) goto done;
        prof_mark(g, 4);

        launch_rmsnorm(g->x, L->ffn_norm, n, D, hp->rms_eps, !fgu || want_act ? g->xn : NULL, fgu ? g->xh : NULL);
        if ((st = tap_act(g, tap, il, QF_ACT_FFN_IN, n, D, g->xn, err))) goto done;
        prof_mark(g, 0);
        if (fgu) {
            const dim3 sg(nblk((size_t)F / 4, 256), (unsigned)n);
            if (g->gu16) { /* f16 gate|up in g->gu's memory */
                if ((st = dev_gemm_h(g->blas, &L->wgu, g->xh, n, g->gu, false, g->wdeq, err, CUDA_R_16F))) goto done;
                prof_mark(g, 5);
                k_silu_gu<__half><<<sg, 256>>>((const __half *)g->gu, F, want_act ? g->hb : NULL, g->xh);
            } else {
                if ((st = dev_gemm_h(g->blas, &L->wgu, g->xh, n, g->gu, false, g->wdeq, err))) goto done;
                prof_mark(g, 5);
                k_silu_gu<float><<<sg, 256>>>(g->gu, F, want_act ? g->hb : NULL, g->xh);
            }
            if ((st = tap_act(g, tap, il, QF_ACT_FFN_DOWN, n, F, g->hb, err))) goto done;
            prof_mark(g, 0);
            if ((st = dev_gemm_h(g->blas, &L->wd, g->xh, n, g->x, true, g->wdeq, err))) goto done;
        } else {
            if ((st = dev_matmul(g->blas, &L->wg, g->xn, n, g->hb, false, route, g->wdeq, g->xh, err))) goto done;
            if ((st = dev_matmul(g->blas, &L->wu, g->xn, n, g->hb2, false, route, g->wdeq, g->xh, err))) goto done;
            prof_mark(g, 5);
            k_silu_mul<<<nblk((size_t)n * F, 256), 256>>>(g->hb, g->hb2, (size_t)n * F);
            if ((st = tap_act(g, tap, il, QF_ACT_FFN_DOWN, n, F, g->hb, err))) goto done;
            prof_mark(g, 0);
            if ((st = dev_matmul(g->blas, &L->wd, g->hb, n, g->x, true, route, g->wdeq, g->xh, err))) goto done;
        }
        prof_mark(g, 6);
    }
    le = cudaGetLastError();
    if (le != cudaSuccess) {
        st = cuda_fail(err, le, "forward kernels");
        goto done;
    }
    if ((logits || nll) && logits_from < n) {
        int first = logits_from < 0 ? 0 : logits_from, n_out = n - first;
        ensure_h16(g, &g->output, n_out);
        if (n_out > MATVEC_MAX && route == QF_CUDA_MM_AUTO && gemm_h_ok(g, &g->output)) {
            launch_rmsnorm(g->x + (size_t)first * D, g->output_norm, n_out, D, hp->rms_eps, NULL, g->xh);
            if ((st = dev_gemm_h(g->blas, &g->output, g->xh, n_out, g->logits, false, g->wdeq, err))) goto done;
        } else {
            launch_rmsnorm(g->x + (size_t)first * D, g->output_norm, n_out, D, hp->rms_eps, g->xn);
            if ((st = dev_matmul(g->blas, &g->output, g->xn, n_out, g->logits, false, route, g->wdeq, g->xh, err))) goto done;
        }
        if (nll) {
            CK(cudaMemcpy(g->tgt, targets, (size_t)n_out * 4, cudaMemcpyHostToDevice));
            k_nll<<<n_out, 1024>>>(g->logits, hp->n_vocab, g->tgt, g->nll);
            CK(cudaGetLastError());
            CK(cudaMemcpy(nll, g->nll, (size_t)n_out * 8, cudaMemcpyDeviceToHost));
        }
        if (logits) CK(copy_logits(g, logits, g->logits, (size_t)n_out * hp->n_vocab * 4));
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
    launch_rmsnorm(dx, dg, n, d, eps, dout);
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
    return qf_cuda_op_attention_route(q, k, v, n, pos0, n_head, n_head_kv, hd, mode, false, out, err);
}

extern "C" qf_status qf_cuda_op_attention_route(const float *q, const float *k, const float *v, int n, int pos0, int n_head,
                                                int n_head_kv, int hd, qf_kv_mode mode, bool flash, float *out, qf_error *err) {
    size_t rb = kv_row_bytes(mode, hd);
    if (flash && !flash_ok(mode, mode, hd))
        return qf_fail(err, QF_ERR_DEVICE, "CUDA op: flash attention needs an f16 cache and head_dim <= 256");
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
    launch_attention(mode, mode, dq, ck, cv, rb, rb, n, pos0, n_head, n_head_kv, hd, dout, flash);
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

extern "C" qf_status qf_cuda_op_kv_int8_roundtrip(const float *x, int64_t rows, int dkv, const float *scale,
                                                  const float *inv, int8_t *bytes, float *out, qf_error *err) {
    dallocs a = {};
    const size_t n = (size_t)rows * dkv;
    float *dx = (float *)dup_to(&a, x, n * 4), *ds = (float *)dup_to(&a, scale, (size_t)dkv * 4),
          *di = (float *)dup_to(&a, inv, (size_t)dkv * 4), *dout = (float *)dalloc(&a, n * 4);
    int8_t *c = (int8_t *)dalloc(&a, n);
    OP_NEED(dx && ds && di && dout && c);
    k_kv_write_int8<<<nblk(n, 256), 256>>>(dx, (int64_t)n, dkv, di, c);
    k_kv_expand_int8<<<nblk(n, 256), 256>>>(c, (int64_t)n, dkv, ds, dout);
    if (cudaMemcpy(bytes, c, n, cudaMemcpyDeviceToHost) != cudaSuccess) {
        dfree(&a);
        return qf_fail(err, QF_ERR_DEVICE, "CUDA op: copy failed");
    }
    return op_finish(&a, out, dout, n * 4, err);
}

extern "C" qf_status qf_cuda_op_kv_dict_decode(const uint8_t *codes, int64_t rows, int hd, size_t rb, const float *atoms,
                                               int n_atoms, int sparsity, int coef_q8, float *out, qf_error *err) {
    dallocs a = {};
    uint8_t *dc = (uint8_t *)dup_to(&a, codes, (size_t)rows * rb);
    float *da = (float *)dup_to(&a, atoms, (size_t)n_atoms * hd * 4), *dout = (float *)dalloc(&a, (size_t)rows * hd * 4);
    OP_NEED(dc && da && dout);
    k_kv_expand_dict<<<nblk((size_t)rows * hd, 256), 256>>>(dc, rows, hd, rb, da, n_atoms, sparsity, coef_q8, dout);
    return op_finish(&a, out, dout, (size_t)rows * hd * 4, err);
}

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
extern "C" qf_status qf_cuda_bench_gemm(int M, int N, int K, int flags, int iters, double *ms, qf_error *err) {
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
    if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) return qf_fail(err, QF_ERR_DEVICE, "cublasCreate failed");
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
