/* cuda_norm.cu: RMSNorm, RoPE, bias, SiLU*up, the fused q/k/v split, the Hadamard rotation and
 * the family features' elementwise kernels (scale, soft-cap, GeGLU, residual add, MoE gather/scatter). */
#include "kernels/cuda/cuda_common.cuh"

__global__ void k_rmsnorm(const float *x, const float *g, int d, float eps, float *out, __half *out16) {
    pdl_trigger();
    pdl_wait();
    const float *xr = x + (size_t)blockIdx.x * d;
    float *o = out ? out + (size_t)blockIdx.x * d : NULL;
    __half *o16 = out16 ? out16 + (size_t)blockIdx.x * d : NULL;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) ss += xr[i] * xr[i];
    __shared__ float red[32];
    const float scale = 1.0f / sqrtf(block_sum(ss, red) / d + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float v = xr[i] * scale * g[i];
        if (o) o[i] = v;
        if (o16) o16[i] = __float2half_rn(v);
    }
}

/* k_rmsnorm with the row held in registers: float4 loads, one read of x. d a multiple of 4 and
 * at most 4 * NV * blockDim.x (launch_rmsnorm checks) */
/* xq set (d % 32 == 0): the normalized row is also quantized to q8_0 as k_quant_act does it
 * (the same bytes: the 8 lanes holding a 32-block reduce its amax and its quant sum by
 * shuffles), into xq in ACT_Q_BYTES layout for n rows of d: int8 [n][d], f32 scales [n][d/32],
 * int32 sums [n][d/32]. */
template <int NV>
__global__ void k_rmsnorm4(const float *x, const float *g, int d, float eps, float *out, __half *out16, void *xq) {
    pdl_trigger();
    const int d4 = d / 4;
    /* the norm's weights before pdl_wait (a weight: no kernel writes it) */
    float4 gw[NV];
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        gw[k] = i < d4 ? ((const float4 *)g)[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    pdl_wait();
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
    const float scale = 1.0f / sqrtf(block_sum(ss, red) / d + eps);
    /* the NV chunks side by side, step by step (every lane takes part in the shuffles: a 32-block
     * is 8 lanes of one chunk, all in the row or all past it, as d4 % 8 == 0 and blockDim % 8 == 0) */
    float4 r[NV];
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const float4 gg = gw[k];
        r[k] = make_float4(v[k].x * scale * gg.x, v[k].y * scale * gg.y, v[k].z * scale * gg.z, v[k].w * scale * gg.w);
        const int i = threadIdx.x + k * blockDim.x;
        if (i >= d4) continue;
        if (out) ((float4 *)(out + (size_t)blockIdx.x * d))[i] = r[k];
        if (out16) {
            __half2 *h = (__half2 *)(out16 + (size_t)blockIdx.x * d) + 2 * i;
            h[0] = __halves2half2(__float2half_rn(r[k].x), __float2half_rn(r[k].y));
            h[1] = __halves2half2(__float2half_rn(r[k].z), __float2half_rn(r[k].w));
        }
    }
    if (!xq) return;
    /* the q8_0 activation, k_quant_act's bytes: each 32-block's amax and quant sum over its 8 lanes */
    float amax[NV];
#pragma unroll
    for (int k = 0; k < NV; k++) amax[k] = fmaxf(fmaxf(fabsf(r[k].x), fabsf(r[k].y)), fmaxf(fabsf(r[k].z), fabsf(r[k].w)));
#pragma unroll
    for (int o = 1; o < 8; o <<= 1)
#pragma unroll
        for (int k = 0; k < NV; k++) amax[k] = fmaxf(amax[k], __shfl_xor_sync(0xffffffffu, amax[k], o));
    int sum[NV];
    const act_q a = act_q_view(xq, (int)gridDim.x, d);
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const float dq = __fdiv_rn(amax[k], 127.0f);
        const float id = dq != 0.0f ? __fdiv_rn(1.0f, dq) : 0.0f;
        const int q0 = (int)roundf(__fmul_rn(r[k].x, id)), q1 = (int)roundf(__fmul_rn(r[k].y, id)),
                  q2 = (int)roundf(__fmul_rn(r[k].z, id)), q3 = (int)roundf(__fmul_rn(r[k].w, id));
        const int i = threadIdx.x + k * blockDim.x;
        if (i < d4)
            ((char4 *)(a.qs + (size_t)blockIdx.x * d))[i] = make_char4((signed char)q0, (signed char)q1, (signed char)q2,
                                                                    (signed char)q3);
        sum[k] = q0 + q1 + q2 + q3;
        amax[k] = dq; /* the step, kept for the store below */
    }
#pragma unroll
    for (int o = 1; o < 8; o <<= 1)
#pragma unroll
        for (int k = 0; k < NV; k++) sum[k] += __shfl_xor_sync(0xffffffffu, sum[k], o);
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i < d4 && (i & 7) == 0) {
            const size_t b = (size_t)blockIdx.x * (d / 32) + i / 8;
            a.xd[b] = __half2float(__float2half_rn(amax[k])), a.xs[b] = sum[k];
        }
    }
}

/* one launch of RMSNorm over n rows of d: the register kernel when the row fits, else k_rmsnorm */
bool launch_rmsnorm(const float *x, const float *g, int n, int d, float eps, float *out, __half *out16, cudaStream_t s,
                    void *xq) {
    if (n <= 0) return false;
    if (d % 32 || ((uintptr_t)xq % 16)) xq = NULL;
    if (d % 4 == 0 && d <= 4 * 4 * 256) cu_launch(k_rmsnorm4<4>, dim3(n), dim3(256), 0, s, x, g, d, eps, out, out16, xq);
    else if (d % 4 == 0 && d <= 4 * 8 * 256) cu_launch(k_rmsnorm4<8>, dim3(n), dim3(256), 0, s, x, g, d, eps, out, out16, xq);
    else {
        cu_launch(k_rmsnorm, dim3(n), dim3(256), 0, s, x, g, d, eps, out, out16);
        return false; /* the plain kernel writes no q8_0 activation */
    }
    return xq != NULL;
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
    if (o16) {
        __half2 *h = (__half2 *)(o16 + t * F + j);
        h[0] = __halves2half2(__float2half_rn(v[0]), __float2half_rn(v[1]));
        h[1] = __halves2half2(__float2half_rn(v[2]), __float2half_rn(v[3]));
    }
    if (o32) *(float4 *)(o32 + t * F + j) = make_float4(v[0], v[1], v[2], v[3]);
}

/* fused q/k/v: qkv[t] = [q (nh heads) | k (nkv) | v (nkv)] x hd; adds the biases (if any),
 * rotates q and k (k_rope's pairs and formula) and writes q, k, v to their own buffers.
 * One thread per (token, head, pair of elements): qkv_pair (cuda_common.cuh). */
/* OT = __half: q goes to the flash kernel's f16 Q and k, v straight into the f16 KV cache
 * (rows [t][nkv][hd] from pos0), the __float2half_rn of the same f32 values that the f32
 * route's k_kv_write and the flash kernel's Q load would round */
/* QT = float, KT = __half (decode, f16 cache): q stays f32 for the split-K attention, k and v go
 * to the cache rows; dpos (graph replay) moves k and v to row *dpos */
template <typename QT, typename KT>
__global__ void k_qkv_split(const float *qkv, int n, int nh, int nkv, int hd, int half, int neox, const float *cs,
                            const float *sn, const float *bq, const float *bk, const float *bv, QT *q, KT *k, KT *v,
                            const int *dpos) {
    pdl_trigger();
    pdl_wait();
    /* grid (H * hd / 2 / 256, n) */
    const int hp = hd / 2, H = nh + 2 * nkv;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= H * hp) return;
    const int h = i / hp, j = i - h * hp, t = blockIdx.y;
    const float *src = qkv + ((int64_t)t * H + h) * hd;
    const int64_t at = dpos ? (int64_t)*dpos * nkv * hd : 0;
    if (h < nh) {
        qkv_pair(src, j, half, neox, cs, sn, bq ? bq + (size_t)h * hd : NULL, true, t, q + ((int64_t)t * nh + h) * hd);
    } else if (h < nh + nkv) {
        qkv_pair(src, j, half, neox, cs, sn, bk ? bk + (size_t)(h - nh) * hd : NULL, true, t,
                 k + at + ((int64_t)t * nkv + h - nh) * hd);
    } else {
        qkv_pair(src, j, half, neox, cs, sn, bv ? bv + (size_t)(h - nh - nkv) * hd : NULL, false, t,
                 v + at + ((int64_t)t * nkv + h - nh - nkv) * hd);
    }
}

void launch_rope(float *v, int n, int n_heads, int hd, int half, bool neox, const float *cs, const float *sn,
                 cudaStream_t s) {
    k_rope<<<nblk((size_t)n * n_heads * half, 256), 256, 0, s>>>(v, n, n_heads, hd, half, neox, cs, sn);
}

void launch_add_bias(float *x, const float *b, int n, int d, cudaStream_t s) {
    k_add_bias<<<nblk((size_t)n * d, 256), 256, 0, s>>>(x, b, n, d);
}

__global__ void k_f16_lo(const float *x, const __half *hi, __half *lo, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) lo[i] = __float2half_rn(__fsub_rn(x[i], __half2float(hi[i])));
}
void launch_f16_lo(const float *x, const __half *hi, __half *lo, size_t n, cudaStream_t s) {
    k_f16_lo<<<nblk(n, 256), 256, 0, s>>>(x, hi, lo, n);
}

void launch_silu_mul(float *g, const float *u, size_t n, cudaStream_t s) { k_silu_mul<<<nblk(n, 256), 256, 0, s>>>(g, u, n); }

void launch_silu_gu(const void *gu, bool gu_f16, int n, int F, float *o32, __half *o16, cudaStream_t s) {
    const dim3 sg(nblk((size_t)F / 4, 256), (unsigned)n);
    if (gu_f16) k_silu_gu<__half><<<sg, 256, 0, s>>>((const __half *)gu, F, o32, o16);
    else k_silu_gu<float><<<sg, 256, 0, s>>>((const float *)gu, F, o32, o16);
}

void launch_qkv_split(const float *qkv, int kind, int n, int nh, int nkv, int hd, int half, bool neox,
                      const float *cs, const float *sn, const float *bq, const float *bk, const float *bv, void *q,
                      void *k, void *v, cudaStream_t s, const int *dpos) {
    const dim3 sg(nblk((size_t)(nh + 2 * nkv) * (hd / 2), 256), (unsigned)n);
    const int nx = neox;
    if (kind == 1)
        cu_launch(k_qkv_split<__half, __half>, sg, dim3(256), 0, s, qkv, n, nh, nkv, hd, half, nx, cs, sn, bq, bk, bv,
                  (__half *)q, (__half *)k, (__half *)v, dpos);
    else if (kind == 2)
        cu_launch(k_qkv_split<float, __half>, sg, dim3(256), 0, s, qkv, n, nh, nkv, hd, half, nx, cs, sn, bq, bk, bv,
                  (float *)q, (__half *)k, (__half *)v, dpos);
    else
        cu_launch(k_qkv_split<float, float>, sg, dim3(256), 0, s, qkv, n, nh, nkv, hd, half, nx, cs, sn, bq, bk, bv,
                  (float *)q, (float *)k, (float *)v, dpos);
}

/* The decode split with the K|V write folded in (the contract: cuda_common.cuh
 * launch_qkv_split_store). One warp a (token t, head row r) of the q|k|v rows, r < nh + 2 nkv:
 * the row's pairs (qkv_pair: k_qkv_split's values) into shared memory, rotated when rot
 * (hadamard_warp: k_hadamard's values), then a q row written in f32 and a K or V row stored as
 * launch_kv_write2 stores it (f32; f16 __float2half_rn; q8_0 / q4_0 a 32-block at a time by
 * kv_quant_warp: kv_quant_block's bytes) at position pos0 + t (dpos: *dpos + t). */
#define SQ_WARPS 4
__global__ void __launch_bounds__(SQ_WARPS * 32)
    k_qkv_split_store(const float *qkv, int nh, int nkv, int hd, int half, int neox, const float *cs, const float *sn,
                      const float *bq, const float *bk, const float *bv, float *q, kv_rows kv, float rot, int pos0,
                      const int *dpos) {
    pdl_trigger();
    pdl_wait();
    __shared__ float sm[SQ_WARPS][HD_MAX];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, H = nh + 2 * nkv;
    const int r = blockIdx.x * SQ_WARPS + warp, t = blockIdx.y;
    if (r >= H) return; /* the warp's row: nothing below synchronizes beyond the warp */
    float *x = sm[warp];
    const int s = r < nh ? -1 : r < nh + nkv ? 0 : 1, kh = s < 0 ? r : s == 0 ? r - nh : r - nh - nkv; /* s: K 0, V 1 */
    const float *b = s < 0 ? bq : s == 0 ? bk : bv;
    const float *src = qkv + ((int64_t)t * H + r) * hd;
    for (int j = lane; j < hd / 2; j += 32) qkv_pair(src, j, half, neox, cs, sn, b ? b + (size_t)kh * hd : NULL, s <= 0, t, x);
    __syncwarp();
    if (rot != 0.0f) hadamard_warp(x, hd, lane, rot);
    if (s < 0) {
        for (int i = lane; i < hd; i += 32) q[((int64_t)t * nh + kh) * hd + i] = x[i];
        return;
    }
    const int pos = (dpos ? *dpos : pos0) + t, m = s ? kv.mode[1] : kv.mode[0];
    uint8_t *dst = (s ? kv.c[1] : kv.c[0]) + ((size_t)pos * nkv + kh) * (s ? kv.rb[1] : kv.rb[0]);
    if (m == QF_KV_F32)
        for (int i = lane; i < hd; i += 32) ((float *)dst)[i] = x[i];
    else if (m == QF_KV_F16)
        for (int i = lane; i < hd; i += 32) ((__half *)dst)[i] = __float2half_rn(x[i]);
    else if (m == QF_KV_Q8_0)
        for (int c = 0; c < hd / QK; c++) kv_quant_warp<QF_KV_Q8_0>(x[c * QK + lane], lane, dst + c * sizeof(block_q8_0));
    else
        for (int c = 0; c < hd / QK; c++) kv_quant_warp<QF_KV_Q4_0>(x[c * QK + lane], lane, dst + c * sizeof(block_q4_0));
}
void launch_qkv_split_store(const float *qkv, int n, int nh, int nkv, int hd, int half, bool neox, const float *cs,
                            const float *sn, const float *bq, const float *bk, const float *bv, float *q, kv_rows kv,
                            float rot, int pos0, cudaStream_t s, const int *dpos) {
    const dim3 grid((unsigned)((nh + 2 * nkv + SQ_WARPS - 1) / SQ_WARPS), (unsigned)n);
    cu_launch(k_qkv_split_store, grid, dim3(SQ_WARPS * 32), 0, s, qkv, nh, nkv, hd, half, (int)neox, cs, sn, bq, bk, bv, q,
              kv, rot, pos0, dpos);
}

/* ---- the normalized Walsh-Hadamard transform (--kv-rot hadamard) ----
 * One warp per row of n <= HD_MAX floats, copied into shared memory and transformed there by
 * hadamard_warp (cuda_common.cuh: bit-identical to hadamard.c's qf_hadamard). */
#define HAD_WARPS 4
/* up to 3 arrays in one launch (blockIdx.y picks one) */
typedef struct {
    float *x[3];
    int64_t rows[3];
} had_set;
__global__ void __launch_bounds__(HAD_WARPS * 32) k_hadamard(had_set hs, int n, float scale) {
    pdl_trigger();
    pdl_wait();
    __shared__ float sm[HAD_WARPS][HD_MAX];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t r = (int64_t)blockIdx.x * HAD_WARPS + warp;
    const int y = blockIdx.y; /* picked by selects: an indexed parameter would go through a stack copy */
    if (r >= (y == 0 ? hs.rows[0] : y == 1 ? hs.rows[1] : hs.rows[2])) return;
    float *v = sm[warp], *g = (y == 0 ? hs.x[0] : y == 1 ? hs.x[1] : hs.x[2]) + r * n;
    for (int i = lane; i < n; i += 32) v[i] = g[i];
    __syncwarp();
    hadamard_warp(v, n, lane, scale);
    for (int i = lane; i < n; i += 32) g[i] = v[i];
}

void launch_hadamard_n(float *const *x, const int64_t *rows, int cnt, int n, cudaStream_t s) {
    had_set hs = {};
    int64_t most = 0;
    int k = 0;
    for (int i = 0; i < cnt; i++)
        if (rows[i] > 0) hs.x[k] = x[i], hs.rows[k] = rows[i], most = rows[i] > most ? rows[i] : most, k++;
    if (!k) return;
    const float scale = 1.0f / sqrtf((float)n); /* on the host, as hadamard.c computes it */
    cu_launch(k_hadamard, dim3(nblk((size_t)most, HAD_WARPS), (unsigned)k), dim3(HAD_WARPS * 32), 0, s, hs, n, scale);
}
void launch_hadamard(float *x, int64_t rows, int n, cudaStream_t s) { launch_hadamard_n(&x, &rows, 1, n, s); }

/* ---- the family features (docs/families.md): the elementwise formulas of forward.c ---- */

__global__ void k_scale(float *x, size_t n, float c) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= c;
}

__global__ void k_softcap(float *x, size_t n, float c) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = c * tanhf(x[i] / c);
}

__global__ void k_add(float *x, const float *y, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

/* gelu with the tanh approximation (forward.c's gelu_tanh) times up */
__global__ void k_gelu_mul(float *g, const float *u, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float k = 0.7978845608028654f; /* sqrt(2/pi) */
        const float x = g[i];
        g[i] = 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x))) * u[i];
    }
}

__global__ void k_gather_rows(const float *x, const int *rows, int r, int d, float *out) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)r * d) return;
    const int64_t row = i / d, e = i % d;
    out[i] = x[(int64_t)rows[row] * d + e];
}

__global__ void k_scatter_add(float *acc, const float *y, const int *rows, const float *w, int r, int d) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)r * d) return;
    const int64_t row = i / d, e = i % d;
    acc[(int64_t)rows[row] * d + e] += w[row] * y[i];
}

void launch_scale(float *x, size_t n, float c, cudaStream_t s) {
    if (n) k_scale<<<nblk(n, 256), 256, 0, s>>>(x, n, c);
}
void launch_softcap(float *x, size_t n, float c, cudaStream_t s) {
    if (n) k_softcap<<<nblk(n, 256), 256, 0, s>>>(x, n, c);
}
void launch_add(float *x, const float *y, size_t n, cudaStream_t s) {
    if (n) k_add<<<nblk(n, 256), 256, 0, s>>>(x, y, n);
}
void launch_glu(bool gelu, float *g, const float *u, size_t n, cudaStream_t s) {
    if (!n) return;
    if (gelu) k_gelu_mul<<<nblk(n, 256), 256, 0, s>>>(g, u, n);
    else k_silu_mul<<<nblk(n, 256), 256, 0, s>>>(g, u, n);
}
void launch_gather_rows(const float *x, const int *rows, int r, int d, float *out, cudaStream_t s) {
    if (r > 0) k_gather_rows<<<nblk((size_t)r * d, 256), 256, 0, s>>>(x, rows, r, d, out);
}
void launch_scatter_add(float *acc, const float *y, const int *rows, const float *w, int r, int d, cudaStream_t s) {
    if (r > 0) k_scatter_add<<<nblk((size_t)r * d, 256), 256, 0, s>>>(acc, y, rows, w, r, d);
}

__global__ void k_sigmoid_gate_add(float *acc, const float *y, const float *gl, int n, int d) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)n * d) return;
    const float s = 1.0f / (1.0f + expf(-gl[i / d])); /* forward.c's shared-expert gate */
    acc[i] += s * y[i];
}
void launch_sigmoid_gate_add(float *acc, const float *y, const float *gl, int n, int d, cudaStream_t s) {
    if (n > 0) k_sigmoid_gate_add<<<nblk((size_t)n * d, 256), 256, 0, s>>>(acc, y, gl, n, d);
}
