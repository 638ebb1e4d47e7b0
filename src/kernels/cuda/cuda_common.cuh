/* cuda_common.cuh: what the CUDA backend's translation units share: the device readers of
 * every weight and KV block format (built on format/quant_blocks.h, the one definition of the
 * layouts), the type dispatch, error helpers, the device weight record, and the launchers each
 * kernel family exports (cuda_gemm.cu, cuda_norm.cu, cuda_kv.cu, cuda_attention.cu,
 * cuda_score.cu). Host memory never appears in a launcher: every pointer is device memory and
 * every launch goes to the current stream `s` (the default stream when 0). */
#ifndef QF_CUDA_COMMON_CUH
#define QF_CUDA_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <atomic>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "format/quant_blocks.h"
#include "kernels/cuda/cuda_backend.h"
}

#define MATVEC_MAX 8   /* batches up to this many tokens use the matrix-vector kernels */
#define HD_MAX 256     /* attention keeps head_dim / 32 values per lane in registers */

/* ---- errors (the plugin has its own: it links nothing of libqforge) ---- */
qf_status cu_fail(qf_error *err, qf_status code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
qf_status cu_prefix(qf_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *cu_type_name(qf_type t);
const char *cu_kv_mode_name(qf_kv_mode m);
static inline qf_status cuda_fail(qf_error *err, cudaError_t e, const char *what) {
    return cu_fail(err, QF_ERR_DEVICE, "CUDA: %s: %s", what, cudaGetErrorString(e));
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
            st = cu_fail(err, QF_ERR_DEVICE, "cuBLAS: %s failed (status %d)", #call, (int)s_);      \
            goto done;                                                                              \
        }                                                                                           \
    } while (0)

static inline unsigned nblk(size_t n, unsigned bs) { return (unsigned)((n + bs - 1) / bs); }

/* ---- the device buffers of one host call (the single ops, the learners' entries), freed together ---- */
typedef struct {
    void *p[20];
    int n;
} dallocs;
/* bytes of device memory recorded in a (NULL when a is full or cudaMalloc fails) */
static inline void *dalloc(dallocs *a, size_t bytes) {
    void *p = NULL;
    if (a->n >= 20 || cudaMalloc(&p, bytes ? bytes : 4) != cudaSuccess) return NULL;
    a->p[a->n++] = p;
    return p;
}
static inline void dfree(dallocs *a) {
    for (int i = 0; i < a->n; i++) cudaFree(a->p[i]);
    a->n = 0;
}
/* a device copy of bytes of host memory h (NULL on failure; a buffer made is still in a) */
static inline void *dup_to(dallocs *a, const void *h, size_t bytes) {
    void *d = dalloc(a, bytes);
    if (d && cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice) != cudaSuccess) return NULL;
    return d;
}

/* ---- programmatic dependent launch (Hopper; docs/gpu.md "Decode") ----
 * The one-token decode graph launches its kernels with the programmatic-stream-serialization
 * attribute (cu_launch while cu_pdl() is on): a kernel may then start while its predecessor
 * drains. The contract every kernel launched that way keeps: pdl_trigger() first (its successor
 * may be scheduled once all of this grid's blocks have started), then nothing but reads of
 * memory no kernel of the graph writes before pdl_wait(): weights, the step's position (*dpos,
 * copied in before the launch) and K/V cache rows older than that position (written by earlier
 * launches; the split-K attention's `early`). pdl_wait() returns when the predecessor grid
 * has completed and its writes are visible. Both are no-ops for a plain launch and below sm_90.
 * Kernels launched with <<<>>> keep the full stream order. */
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
/* on while the decode graph is captured on this thread (cuda_backend.cu) */
bool cu_pdl(void);
void cu_pdl_set(bool on);
/* kern<<<grid, block, smem, s>>>(args...), with the programmatic-serialization attribute when
 * cu_pdl() (kern must keep the contract above) */
template <typename... KP, typename... A>
static inline void cu_launch(void (*kern)(KP...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, A... args) {
    if (!cu_pdl()) {
        kern<<<grid, block, smem, s>>>(args...);
        return;
    }
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = s;
    cfg.attrs = at, cfg.numAttrs = 1;
    cudaLaunchKernelEx(&cfg, kern, args...);
}
static inline size_t wmax(size_t a, size_t b) { return a > b ? a : b; }

/* the current device's opt-in shared memory a block (cudaDevAttrMaxSharedMemoryPerBlockOptin:
 * 227 KiB on sm_90, 99 on sm_86 / sm_89), asked once a device and kept; 0 when the runtime does
 * not answer (its error cleared). Thread-safe. */
int cu_smem_optin(void);
/* lets kern take up to `bytes` of dynamic shared memory on the current device: one
 * cudaFuncSetAttribute a device (the attribute belongs to the device's context, not to the
 * process), `done` being that kernel's own flags (bit d: device d; devices from 64 on ask every
 * call). Thread-safe (a race sets the same value twice). */
template <typename... KP>
static inline void cu_allow_smem(void (*kern)(KP...), size_t bytes, std::atomic<unsigned long long> &done) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        cudaGetLastError(); /* clear: the launch reports the device's state */
        return;
    }
    const unsigned long long bit = dev < 64 ? 1ull << dev : 0;
    if (bit && (done.load(std::memory_order_acquire) & bit)) return;
    if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes) == cudaSuccess)
        done.fetch_or(bit, std::memory_order_acq_rel);
    else cudaGetLastError(); /* clear: the launch then fails and reports it */
}

/* ---- block formats (layouts: format/quant_blocks.h) ---- */

__host__ __device__ static inline float h2f_bits(uint16_t u) {
    __half_raw r;
    r.x = u;
    return __half2float(__half(r));
}
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
#define KV_SUB(a, b) __fsub_rn((a), (b))
#define KV_DMUL(a, b) __dmul_rn((a), (b))
#define KV_DADD(a, b) __dadd_rn((a), (b))
#define KV_DSUB(a, b) __dsub_rn((a), (b))
#else
#define KV_MUL(a, b) ((a) * (b))
#define KV_ADD(a, b) ((a) + (b))
#define KV_DIV(a, b) ((a) / (b))
#define KV_SUB(a, b) ((a) - (b))
#define KV_DMUL(a, b) ((a) * (b))
#define KV_DADD(a, b) ((a) + (b))
#define KV_DSUB(a, b) ((a) - (b))
#endif

/* q8_0 or q4_0: the cache modes stored as 32-blocks of codes and a step (kv_quant_block), which
 * k_attn_one and split-K's vectorized form read in either stream */
__host__ __device__ static inline bool kv_qz(qf_kv_mode m) { return m == QF_KV_Q8_0 || m == QF_KV_Q4_0; }
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

/* one warp quantizes a 32-block (x: its lane's element) into out in mode M (q8_0 / q4_0):
 * kv_quant_block's bytes. Its amax is a max of non-NaN magnitudes from 0 either way, and q4_0's
 * signed extreme the first element of that magnitude (the loop's strict >), 0 when it is 0. */
template <int M> __device__ static inline void kv_quant_warp(float x, int lane, uint8_t *out) {
    float amax = fmaxf(0.0f, fabsf(x));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if constexpr (M == QF_KV_Q8_0) {
        block_q8_0 *b = (block_q8_0 *)out;
        const float d = KV_DIV(amax, 127.0f);
        const float id = d ? KV_DIV(1.0f, d) : 0.0f;
        b->qs[lane] = (int8_t)roundf(KV_MUL(x, id));
        if (lane == 0) b->d = f32_to_f16_bits(d);
    } else {
        block_q4_0 *b = (block_q4_0 *)out;
        const unsigned hit = __ballot_sync(0xffffffffu, amax > 0.0f && fabsf(x) == amax);
        const float xm = __shfl_sync(0xffffffffu, x, hit ? __ffs(hit) - 1 : 0);
        const float mx = hit ? xm : 0.0f;
        const float d = KV_DIV(mx, -8.0f);
        const float id = d ? KV_DIV(1.0f, d) : 0.0f;
        const int q = (int)KV_ADD(KV_MUL(x, id), 8.5f);
        const int qh = __shfl_down_sync(0xffffffffu, q, 16);
        if (lane < QK / 2) b->qs[lane] = (uint8_t)((q < 15 ? q : 15) | ((qh < 15 ? qh : 15) << 4));
        if (lane == 0) b->d = f32_to_f16_bits(d);
    }
}
/* an f16 stored at an address that may be only byte-aligned (packed dict codes) */
__host__ __device__ static inline float h2f(const uint8_t *p) { return h2f_bits((uint16_t)(p[0] | (p[1] << 8))); }

/* Dequantize elements [32*sb, 32*sb+32) of a row of type T into y[32], exactly as quant.c's
 * scalar oracle (qf_dequantize_row_ref). */
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
    const block_q4_0 *b = (const block_q4_0 *)row + sb;
    const float d = h2f_bits(b->d);
    for (int j = 0; j < QK / 2; j++) {
        y[j] = ((b->qs[j] & 0xF) - 8) * d;
        y[j + QK / 2] = ((b->qs[j] >> 4) - 8) * d;
    }
}
template <> __host__ __device__ inline void deq32<QF_TYPE_Q5_0>(const uint8_t *row, int sb, float *y) {
    const block_q5_0 *b = (const block_q5_0 *)row + sb;
    const float d = h2f_bits(b->d);
    const uint32_t qh = (uint32_t)b->qh[0] | ((uint32_t)b->qh[1] << 8) | ((uint32_t)b->qh[2] << 16) |
                        ((uint32_t)b->qh[3] << 24);
    for (int j = 0; j < QK / 2; j++) {
        int h0 = (qh >> j) & 1, h1 = (qh >> (j + 16)) & 1;
        y[j] = (((b->qs[j] & 0xF) | (h0 << 4)) - 16) * d;
        y[j + QK / 2] = (((b->qs[j] >> 4) | (h1 << 4)) - 16) * d;
    }
}
template <> __host__ __device__ inline void deq32<QF_TYPE_Q8_0>(const uint8_t *row, int sb, float *y) {
    const block_q8_0 *b = (const block_q8_0 *)row + sb;
    const float d = h2f_bits(b->d);
    for (int j = 0; j < QK; j++) y[j] = b->qs[j] * d;
}
template <> __host__ __device__ inline void deq32<QF_TYPE_Q4_K>(const uint8_t *row, int sb, float *y) {
    const block_q4_K *b = (const block_q4_K *)row + (sb >> 3);
    const int s = sb & 7;
    const float d = h2f_bits(b->d), dmin = h2f_bits(b->dmin);
    uint8_t sc, m;
    qf_k4_scale_min(s, b->scales, &sc, &m);
    const float d1 = d * sc, m1 = dmin * m;
    const uint8_t *q = b->qs + 32 * (s >> 1);
    if (s & 1)
        for (int l = 0; l < 32; l++) y[l] = d1 * (q[l] >> 4) - m1;
    else
        for (int l = 0; l < 32; l++) y[l] = d1 * (q[l] & 0xF) - m1;
}
template <> __host__ __device__ inline void deq32<QF_TYPE_Q5_K>(const uint8_t *row, int sb, float *y) {
    const block_q5_K *b = (const block_q5_K *)row + (sb >> 3);
    const int s = sb & 7;
    const float d = h2f_bits(b->d), dmin = h2f_bits(b->dmin);
    uint8_t sc, m;
    qf_k4_scale_min(s, b->scales, &sc, &m);
    const float d1 = d * sc, m1 = dmin * m;
    const uint8_t *qh = b->qh, *ql = b->qs + 32 * (s >> 1);
    const uint8_t u = (uint8_t)(1u << s);
    if (s & 1)
        for (int l = 0; l < 32; l++) y[l] = d1 * ((ql[l] >> 4) + (qh[l] & u ? 16 : 0)) - m1;
    else
        for (int l = 0; l < 32; l++) y[l] = d1 * ((ql[l] & 0xF) + (qh[l] & u ? 16 : 0)) - m1;
}
/* sub-block sb of a Q6_K row in either layout (g8: quant_blocks.h's G8) */
__host__ __device__ inline void deq32_q6k(const uint8_t *row, int sb, float *y, int g8) {
    const qf_q6k_fields f = qf_q6k_at(row, sb >> 3, g8);
    const int s = sb & 7, half = s >> 2, k = s & 3;
    const uint8_t *ql = f.ql + 64 * half + ((k & 1) ? 32 : 0), *qh = f.qh + 32 * half;
    const int8_t *sc = f.scales + 8 * half;
    const float d = h2f_bits(*f.d);
    const int nsh = (k >> 1) * 4, hsh = 2 * k;
    for (int l = 0; l < 32; l++) {
        const int q = (((ql[l] >> nsh) & 0xF) | (((qh[l] >> hsh) & 3) << 4)) - 32;
        y[l] = d * sc[l / 16 + 2 * k] * q;
    }
}
template <> __host__ __device__ inline void deq32<QF_TYPE_Q6_K>(const uint8_t *row, int sb, float *y) {
    deq32_q6k(row, sb, y, 0);
}

/* ---- q4_0 regrouped for the device (G8) ----
 * A q4_0 row whose width is a multiple of 256 is stored on the device in groups of 8 blocks:
 * the 8 f16 scales (16 bytes), then the 8 blocks' 16 quant bytes each (128 bytes), 144 bytes a
 * group, the same bytes as the GGUF row in another order (row_bytes unchanged, so rows and row
 * ranges are sliced as before). Every block's quants are then 16-byte aligned: the decode
 * matvec reads a block with one 16-byte load (k_matvec_q4g). QFD_Q4_0G8 is the device-only type
 * code of that layout (dweight.g8; never a qf_type); deq32<QFD_Q4_0G8> gives deq32<Q4_0>'s
 * values bit for bit. */
#define QFD_Q4_0G8 1000
#define Q4G_GROUP 144 /* bytes of one group of 8 blocks */
template <> __host__ __device__ inline void deq32<QFD_Q4_0G8>(const uint8_t *row, int sb, float *y) {
    const uint8_t *gp = row + (size_t)(sb >> 3) * Q4G_GROUP;
    const float d = h2f_bits(((const uint16_t *)gp)[sb & 7]);
    const uint8_t *qs = gp + 16 + 16 * (sb & 7);
    for (int j = 0; j < QK / 2; j++) {
        y[j] = ((qs[j] & 0xF) - 8) * d;
        y[j + QK / 2] = ((qs[j] >> 4) - 8) * d;
    }
}
/* ---- q8_0 regrouped for the device (G8), as q4_0's ----
 * A q8_0 row whose width is a multiple of 256: groups of 8 blocks, the 8 f16 scales (16 bytes),
 * then the 8 blocks' 32 quant bytes each (256 bytes), 272 bytes a group, the same bytes as the
 * GGUF row in another order (row_bytes unchanged). A block's quants are two 16-byte loads (a GGUF
 * q8_0 block is 34 bytes: 2-byte loads). QFD_Q8_0G8: its device type code; deq32<QFD_Q8_0G8>
 * gives deq32<Q8_0>'s values bit for bit. */
#define QFD_Q8_0G8 1002
#define Q8G_GROUP 272 /* bytes of one group of 8 blocks */
template <> __host__ __device__ inline void deq32<QFD_Q8_0G8>(const uint8_t *row, int sb, float *y) {
    const uint8_t *gp = row + (size_t)(sb >> 3) * Q8G_GROUP;
    const float d = h2f_bits(((const uint16_t *)gp)[sb & 7]);
    const int8_t *qs = (const int8_t *)(gp + 16 + 32 * (sb & 7));
    for (int j = 0; j < QK; j++) y[j] = qs[j] * d;
}
static_assert(8 * sizeof(block_q8_0) == Q8G_GROUP && 8 * sizeof(block_q4_0) == Q4G_GROUP, "G8 groups");
static_assert(offsetof(block_q4_0, qs) == 2 && offsetof(block_q8_0, qs) == 2, "a _0 block: its f16 d, then its quants");

/* Q6_K regrouped for the device: quant_blocks.h's G8 layout (qf_q6k_at), the device-only type
 * code QFD_Q6_KG (dweight.g8 on a Q6_K weight); deq32<QFD_Q6_KG> gives deq32<Q6_K>'s values
 * bit for bit. The one-token matvec then reads each lane's share with 16-byte loads (k_mv1_k). */
#define QFD_Q6_KG 1001
template <> __host__ __device__ inline void deq32<QFD_Q6_KG>(const uint8_t *row, int sb, float *y) {
    deq32_q6k(row, sb, y, 1);
}
/* does a weight of type t and width k take a G8 layout on the device (q4_0, q8_0 or Q6_K) */
static inline bool g8_ok(qf_type t, int64_t k) {
    return ((t == QF_TYPE_Q4_0 || t == QF_TYPE_Q8_0) && k % 256 == 0) || (t == QF_TYPE_Q6_K && qf_q6k_g8_ok(k));
}
/* GGUF q4_0 (q8 false) or q8_0 rows -> their G8 rows (host memory, rows of k elements,
 * k % 256 == 0): each group of 8 blocks as its 8 d, then its 8 blocks' quants */
static inline void g8_regroup_0(const uint8_t *src, uint8_t *dst, int64_t rows, int64_t k, bool q8) {
    const size_t qb = q8 ? sizeof(((block_q8_0 *)0)->qs) : sizeof(((block_q4_0 *)0)->qs), bb = 2 + qb;
    const int64_t nb = k / QK;
    const size_t rb = (size_t)nb * bb;
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *b = src + (size_t)r * rb;
        uint8_t *o = dst + (size_t)r * rb;
        for (int64_t g = 0; g < nb / 8; g++, o += 8 * bb)
            for (int j = 0; j < 8; j++, b += bb) {
                memcpy(o + 2 * j, b, 2);
                memcpy(o + 16 + qb * j, b + 2, qb);
            }
    }
}

/* call BODY with constexpr int TT = t for a runtime type */
#define QF_TYPE_DISPATCH(t, BODY)                          \
    switch ((int)(t)) {                                           \
    case QF_TYPE_F32: { constexpr int TT = QF_TYPE_F32; BODY; } break;   \
    case QF_TYPE_F16: { constexpr int TT = QF_TYPE_F16; BODY; } break;   \
    case QF_TYPE_BF16: { constexpr int TT = QF_TYPE_BF16; BODY; } break; \
    case QF_TYPE_Q4_0: { constexpr int TT = QF_TYPE_Q4_0; BODY; } break; \
    case QF_TYPE_Q5_0: { constexpr int TT = QF_TYPE_Q5_0; BODY; } break; \
    case QF_TYPE_Q8_0: { constexpr int TT = QF_TYPE_Q8_0; BODY; } break; \
    case QF_TYPE_Q4_K: { constexpr int TT = QF_TYPE_Q4_K; BODY; } break; \
    case QF_TYPE_Q5_K: { constexpr int TT = QF_TYPE_Q5_K; BODY; } break; \
    case QF_TYPE_Q6_K: { constexpr int TT = QF_TYPE_Q6_K; BODY; } break; \
    case QFD_Q4_0G8: { constexpr int TT = QFD_Q4_0G8; BODY; } break;     \
    case QFD_Q6_KG: { constexpr int TT = QFD_Q6_KG; BODY; } break;       \
    case QFD_Q8_0G8: { constexpr int TT = QFD_Q8_0G8; BODY; } break;     \
    default: break;                                        \
    }

static inline bool gpu_type_ok(qf_type t) {
    switch (t) {
    case QF_TYPE_F32: case QF_TYPE_F16: case QF_TYPE_BF16: case QF_TYPE_Q4_0: case QF_TYPE_Q5_0:
    case QF_TYPE_Q8_0: case QF_TYPE_Q4_K: case QF_TYPE_Q5_K: case QF_TYPE_Q6_K: return true;
    default: return false;
    }
}

/* 8 f16 (or bf16) values of a 16-byte load to f32 */
__device__ static inline void h8_to_f(const uint4 &u, float *w, bool bf16) {
    const uint32_t v[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (bf16) {
            w[2 * i] = __uint_as_float(v[i] << 16);
            w[2 * i + 1] = __uint_as_float(v[i] & 0xFFFF0000u);
        } else {
            __half2_raw r;
            r.x = (unsigned short)(v[i] & 0xFFFF), r.y = (unsigned short)(v[i] >> 16);
            const float2 f = __half22float2(__half2(r));
            w[2 * i] = f.x, w[2 * i + 1] = f.y;
        }
    }
}

__device__ static inline float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
/* the sum of v over the block (blockDim.x a multiple of 32, at most 1024) in a fixed order: each
 * warp's warp_sum, then warp 0's warp_sum of those, for every thread; red: 32 floats of shared
 * memory. Every thread of the block calls it. */
__device__ static inline float block_sum(float v, float *red) {
    v = warp_sum(v);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        float r = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.0f;
        r = warp_sum(r);
        if (threadIdx.x == 0) red[0] = r;
    }
    __syncthreads();
    return red[0];
}

/* 16-byte asynchronous copy global -> shared; src_bytes 0 writes zeros (src must still be a
 * valid address) */
__device__ static inline void cp_async16(void *smem, const void *gmem, int src_bytes) {
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sa), "l"(gmem), "r"(src_bytes) : "memory");
}
__device__ static inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ static inline void cp_async_wait1() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }

/* 4- and 8-byte asynchronous copies (cp.async.ca), zero-filled like cp_async16 */
__device__ static inline void cp_async8(void *smem, const void *gmem, int src_bytes) {
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(sa), "l"(gmem), "r"(src_bytes) : "memory");
}
__device__ static inline void cp_async4(void *smem, const void *gmem, int src_bytes) {
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(sa), "l"(gmem), "r"(src_bytes) : "memory");
}
__device__ static inline void cp_async_wait0() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

/* The normalized Walsh-Hadamard transform (--kv-rot hadamard) of the n floats at v (shared
 * memory, n a power of two <= HD_MAX) by one warp, all of its lanes calling: hadamard.c's
 * qf_hadamard in the same order (len = 1, 2, 4, ...: x[j], x[j + len] <- a + b, a - b), then
 * x *= scale (the host's 1 / sqrtf(n)). Each element sees the same f32 operations as on the CPU
 * (no product to contract into an FMA), so the result is bit-identical. The one definition
 * k_hadamard and k_attn_one's folded rotation share. */
__device__ static inline void hadamard_warp(float *v, int n, int lane, float scale) {
    for (int len = 1; len < n; len <<= 1) {
        for (int p = lane; p < n / 2; p += 32) {
            const int i = (p / len) * 2 * len + p % len;
            const float a = v[i], b = v[i + len];
            v[i] = __fadd_rn(a, b);
            v[i + len] = __fsub_rn(a, b);
        }
        __syncwarp();
    }
    for (int i = lane; i < n; i += 32) v[i] = __fmul_rn(v[i], scale);
    __syncwarp();
}

/* A row of hd floats held one a thread (thread e < hd holds o = element e) rotated back under
 * --kv-rot: through buf (hd floats of shared memory), the block's first warp running
 * hadamard_warp; returns thread e's element of the rotated row (o itself past hd). Every thread
 * of the block calls it (two __syncthreads). k_attn_one's and k_attn_merge's output rows. */
__device__ static inline float rotate_back(float o, int e, int hd, float *buf, float scale) {
    if (e < hd) buf[e] = o;
    __syncthreads();
    if (threadIdx.x < 32) hadamard_warp(buf, hd, threadIdx.x, scale);
    __syncthreads();
    return e < hd ? buf[e] : o;
}

/* One 32-block of a q8_0 activation, a warp's 32 lanes holding its values in order (v: this
 * lane's): quant.c's quant_q8_0 (d = amax / 127, id = d ? 1 / d : 0, q = roundf(x * id), each
 * operation rounded on its own), the quant to *qs, and from lane 0 the f32 of d's f16 rounding to
 * *xd and the int sum of the block's quants to *xs (the ACT_Q_BYTES layout's three arrays). The
 * one definition of k_quant_act's bytes, which the split-K merge writes as well. f16 false: d
 * itself to *xd (norm_fold's unscaled step, which can lie below f16's normal range). */
__device__ static inline void quant_q8_warp(float v, int lane, int8_t *qs, float *xd, int *xs, bool f16 = true) {
    float amax = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = __fdiv_rn(amax, 127.0f);
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    const int q = (int)roundf(__fmul_rn(v, id));
    *qs = (int8_t)q;
    int sum = q;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) *xd = f16 ? __half2float(__float2half_rn(d)) : d, *xs = sum;
}

/* ---- the fused q|k|v row: bias and RoPE of one pair of elements ----
 * One pair j < hd / 2 of one head row src: bias b (if any), RoPE when rot and j < half (k_rope's
 * pairs: (j, j + half) for NEOX, else (2j, 2j + 1); row t of the cos / sin tables), stored as
 * OT (f32, or the f16 rounding of the same f32). The one definition that k_qkv_split and the
 * decode attention's fused split (k_attn_split_h) share, so both give the same bits. */
__device__ static inline void st_out(float *p, float x) { *p = x; }
__device__ static inline void st_out(__half *p, float x) { *p = __float2half_rn(x); }
template <typename OT>
__device__ static inline void qkv_pair(const float *src, int j, int half, int neox, const float *cs, const float *sn,
                                       const float *b, bool rot, int t, OT *dst) {
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

/* ---- KV cache rows ---- */

/* element e of one head_dim row stored in mode M */
template <int M> __host__ __device__ static inline float kv_elem(const uint8_t *row, int e);
template <> __host__ __device__ inline float kv_elem<QF_KV_F32>(const uint8_t *row, int e) { return ((const float *)row)[e]; }
template <> __host__ __device__ inline float kv_elem<QF_KV_F16>(const uint8_t *row, int e) {
    return __half2float(((const __half *)row)[e]);
}
template <> __host__ __device__ inline float kv_elem<QF_KV_Q8_0>(const uint8_t *row, int e) {
    const block_q8_0 *b = (const block_q8_0 *)row + (e >> 5);
    return b->qs[e & 31] * h2f_bits(b->d);
}
template <> __host__ __device__ inline float kv_elem<QF_KV_Q4_0>(const uint8_t *row, int e) {
    const block_q4_0 *b = (const block_q4_0 *)row + (e >> 5);
    const int i = e & 31;
    const int q = i < QK / 2 ? (b->qs[i] & 0xF) : (b->qs[i - QK / 2] >> 4);
    return (q - 8) * h2f_bits(b->d);
}

/* bytes of one head_dim row of a plain cache mode; 0 when the mode or size is not supported */
static inline size_t kv_row_bytes(qf_kv_mode m, int hd) {
    switch (m) {
    case QF_KV_F32: return (size_t)hd * 4;
    case QF_KV_F16: return (size_t)hd * 2;
    case QF_KV_Q8_0: return hd % QK ? 0 : (size_t)hd / QK * sizeof(block_q8_0);
    case QF_KV_Q4_0: return hd % QK ? 0 : (size_t)hd / QK * sizeof(block_q4_0);
    default: return 0;
    }
}

/* ---- a weight on the device ---- */
typedef struct {
    qf_type type;
    int64_t ne0, ne1;
    size_t row_bytes;
    uint8_t *d;
    __half *h16;           /* prefill: persistent f16 copy of a quantized weight (f16 cache), or NULL */
    bool view;             /* d and h16 point into a fused weight (wqkv, wgu), which owns them */
    bool g8;               /* q4_0, q8_0 or Q6_K stored regrouped (QFD_Q4_0G8, QFD_Q8_0G8, QFD_Q6_KG, above) */
} dweight;
/* ---- the q8_0 activation of the int8 matvecs (k_quant_act, k_rmsnorm4 write it) ----
 * One scratch of ACT_Q_BYTES(n, K): int8 quants [n][K] (16-byte aligned), the f32 value of each
 * block's f16 scale [n][K/32], the int32 sum of each block's quants [n][K/32] (the -8 offset of
 * the G8 kernel). */
#define ACT_Q_BYTES(n, K) ((size_t)(n) * (K) + (size_t)(n) * ((K) / 32) * 8)
typedef struct {
    int8_t *qs;
    float *xd;
    int *xs;
} act_q;
__host__ __device__ static inline act_q act_q_view(void *xq, int n, int K) {
    act_q a;
    a.qs = (int8_t *)xq;
    a.xd = (float *)((uint8_t *)xq + (size_t)n * K);
    a.xs = (int *)(a.xd + (size_t)n * (K / 32));
    return a;
}

/* ---- decode's RMSNorm folded into the matvecs around it (knob no_norm_fold: off) ----
 * The q8_0 activation of x g rs (rs = 1 / sqrt(mean(x^2) + eps)) has the quants of x g and
 * steps rs times theirs, so the norm needs no pass of its own. Its producer, the one-token
 * matvec x += W a before it (o, or the layer's down; for the first layer's attention norm the
 * embedding, launch_embed_fold), 32 rows a block, quantizes x g for its 32 rows into xq
 * (ACT_Q_BYTES(1, d), unscaled) and writes their sum of squares into ss[block]; its consumer,
 * the matvec after it (q|k|v, gate|up, or the logits'), reads xq as its activation, sums ss
 * in a fixed order and multiplies its row sums by rs before their end (SiLU(gate) * up for
 * gate|up). Against launch_rmsnorm's activation only roundings differ: the unscaled steps are
 * kept in f32 (not rounded to f16: x g can be small enough for subnormal f16 steps), rs
 * multiplies a row's sum instead of each block's step, and the sum of squares is added in
 * another order. launch_matvec_fold / launch_matvec_norm (cuda_gemm.cu) launch the two;
 * fold_prod_ok / fold_cons_ok say where they apply. The sums are written NF_REP times and
 * consumer block b reads copy b % NF_REP: were every consumer warp to read the same 512 bytes,
 * those L2 lines would be hot (8B q4_0 at position 4000, H100: 1.02x with the copies; docs/gpu.md
 * "Session 43"). */
#define NF_REP 16
typedef struct {
    float *ss;      /* [NF_REP][d / 32] sums of squares of x, one a 32-row block */
    const float *g; /* the norm's weight [d] */
    void *xq;       /* x g as a q8_0 activation, ACT_Q_BYTES(1, d), 16-byte aligned */
    int d;
    float eps;
} norm_fold;

/* the device layout's type code: w->type, or QFD_Q4_0G8 / QFD_Q8_0G8 / QFD_Q6_KG */
static inline int dw_type(const dweight *w) {
    return !w->g8 ? (int)w->type
           : w->type == QF_TYPE_Q6_K ? QFD_Q6_KG
           : w->type == QF_TYPE_Q8_0 ? QFD_Q8_0G8
                                     : QFD_Q4_0G8;
}
/* Copy rows of a host weight of type t (GGUF layout) into device memory, regrouped to its G8
 * layout when g8 (through a bounded host staging buffer); false on an allocation or copy failure
 * (*e says which). */
bool h2d_weight(uint8_t *dst, const void *src, qf_type t, int64_t k, int64_t rows, size_t rb, bool g8, cudaError_t *e);

/* matmul routes (the values of cuda_ops.h's qf_cuda_mm_route) */
enum { MM_AUTO = 0, MM_MATVEC = 1, MM_GEMM_F16 = 2, MM_GEMM_F32 = 3, MM_CANON = 4 };

/* ---- cuda_gemm.cu: dequantization, matrix-vector and GEMM ---- */
/* x [n][K] quantized for the integer matvecs and GEMMs into xq (ACT_Q_BYTES(n, K)): q8_0 blocks
 * (quant.c's quant_q8_0 bytes; xd the f32 of each f16 scale) or Q8_K (quant_q8_K's; xd one scale
 * per 256, xs the sum of each 32 quants) */
void launch_quant_act(const float *x, int n, int K, void *xq, cudaStream_t s);
void launch_quant_act_k(const float *x, int n, int K, void *xq, cudaStream_t s);
/* dst[ne1][ne0] = dequantize(w), f32 or f16 */
void launch_dequant(const dweight *w, void *dst, bool f32, cudaStream_t s);
/* x[t] = dequantize(E[tok[t]]), t < n */
void launch_embed(const dweight *E, const int32_t *tok, int n, int d, float *x, cudaStream_t s);
/* y[n][N] (+)= x[n][K] . W^T; wdeq / xh: scratch of N*K*4 and n*K*2 bytes (route: MM_*) */
qf_status dev_matmul(cublasHandle_t blas, const dweight *w, const float *x, int n, float *y, bool accumulate,
                     int route, void *wdeq, __half *xh, cudaStream_t s, qf_error *err, bool xq_ready = false);
/* xq_ready (dev_matmul, launch_matvec_gu): xh already holds x's activation in the format the
 * weight's int8 matvec reads (q8_0 for Q4_0 / Q8_0: launch_rmsnorm's xq or launch_quant_act; Q8_K
 * for the K formats: launch_quant_act_k), so the matvec skips its quantization launch; other
 * routes read x as always */
/* norm_fold's producer: x[N] += W a for one token (a: xq's activation of x_in, quantized here
 * unless ready), and nf's activation and sums of squares of the new x; its consumer: y = rs (W
 * nf.xq) for one token (gu: hb[F] = SiLU(gate) * up of the fused [2F][K] weight). Launch only
 * where fold_prod_ok / fold_cons_ok (and launch_matvec_gu for gu) say they apply. */
bool fold_prod_ok(const dweight *w);
bool fold_cons_ok(const dweight *w, bool gu);
void launch_matvec_fold(const dweight *w, const float *x_in, void *xq, bool ready, float *x, const norm_fold *nf,
                        cudaStream_t s);
void launch_matvec_norm(const dweight *w, float *y, bool gu, const norm_fold *nf, cudaStream_t s);
/* norm_fold's producer for the first layer: x = E[tok[0]] (launch_embed's bits, one token) and
 * nf's activation and sums of squares of it (nf->d % 32 == 0) */
void launch_embed_fold(const dweight *E, const int32_t *tok, float *x, const norm_fold *nf, cudaStream_t s);
/* decode gate|up with SiLU(gate) * up fused: hb[n][F] from the [2F][K] weight (xq: scratch as
 * dev_matmul's xh); false when it does not apply (nothing launched) */
bool launch_matvec_gu(const dweight *w, const float *x, int n, int F, float *hb, void *xq, cudaStream_t s,
                      bool xq_ready = false);
/* y[n][N] (+)= xh[n][K] . W^T, f16 inputs already in place, f32 (or yt) output */
qf_status dev_gemm_h(cublasHandle_t blas, const dweight *w, const __half *xh, int n, void *y, bool accumulate,
                     void *wdeq, qf_error *err, cudaDataType yt = CUDA_R_32F);
qf_status gemm_bench(int M, int N, int K, int flags, int iters, double *ms, qf_error *err);

/* ---- cuda_norm.cu: RMSNorm, RoPE, bias, SiLU, the q/k/v split, the Hadamard rotation ---- */
/* xq set: also the q8_0 activation of the result for the int8 matvecs (ACT_Q_BYTES layout,
 * cuda_gemm.cu), where the register kernel runs and d % 32 == 0; returns whether xq was written.
 * (Q8_K, the K formats' activation, is not written here: one block a row on the step's critical
 * path took longer than launch_quant_act_k's separate launch; docs/gpu.md "Session 22") */
bool launch_rmsnorm(const float *x, const float *g, int n, int d, float eps, float *out, __half *out16, cudaStream_t s,
                    void *xq = NULL);
void launch_rope(float *v, int n, int n_heads, int hd, int half, bool neox, const float *cs, const float *sn,
                 cudaStream_t s);
void launch_add_bias(float *x, const float *b, int n, int d, cudaStream_t s);
void launch_silu_mul(float *g, const float *u, size_t n, cudaStream_t s);
/* o16 = SiLU(gate) * up from the fused [n][2F] gate|up output (f32 or f16); o32 too when set */
void launch_silu_gu(const void *gu, bool gu_f16, int n, int F, float *o32, __half *o16, cudaStream_t s);
/* lo[i] = __float2half_rn(x[i] - hi[i]): the f16 residual of x after hi = its f16 rounding, so
 * hi + lo carries x to about 22 bits (two f16 GEMMs, the second accumulating, then give the
 * product at nearly f32 input precision) */
void launch_f16_lo(const float *x, const __half *hi, __half *lo, size_t n, cudaStream_t s);
/* bias + RoPE of the fused [n][Dq + 2 Dkv] q|k|v output into q, k, v: kind 0 all f32; 1 f16 Q
 * and f16 cache rows (prefill); 2 f32 q and f16 cache rows (decode). dpos set (graph replay):
 * k and v move to row *dpos */
void launch_qkv_split(const float *qkv, int kind, int n, int nh, int nkv, int hd, int half, bool neox,
                      const float *cs, const float *sn, const float *bq, const float *bk, const float *bv, void *q,
                      void *k, void *v, cudaStream_t s, const int *dpos = NULL);
/* a layer's K and V caches at position 0 (plain modes: f32, f16, q8_0, q4_0), rows of rb bytes */
typedef struct {
    uint8_t *c[2];
    int mode[2]; /* qf_kv_mode */
    size_t rb[2];
} kv_rows;
/* The decode split (launch_qkv_split kind 0's q) with the cache write folded in: n <= 8 tokens'
 * q rows in f32 into q, their K and V rows (bias, RoPE as kind 0) stored into kv at positions
 * pos0 .. pos0 + n - 1 (dpos set, graph replay: from *dpos) as launch_kv_write2 stores them;
 * rot != 0 (--kv-rot hadamard, rot = 1 / sqrtf(hd) as the host computes it; hd a power of two):
 * q, K and V rotated first, as launch_hadamard_n would. The same bits as the split, the
 * rotation and the K|V write launched apart (op_attention's fused route compares them); one
 * launch where they are two or three. hd <= HD_MAX, a multiple of 32 for q8_0 / q4_0. */
void launch_qkv_split_store(const float *qkv, int n, int nh, int nkv, int hd, int half, bool neox, const float *cs,
                            const float *sn, const float *bq, const float *bk, const float *bv, float *q, kv_rows kv,
                            float rot, int pos0, cudaStream_t s, const int *dpos = NULL);
/* ---- the family features (docs/families.md), forward.c's formulas ---- */
/* x[i] *= c, i < n (gemma's embedding scale) */
void launch_scale(float *x, size_t n, float c, cudaStream_t s);
/* x[i] = c * tanhf(x[i] / c), i < n (gemma2's final logit soft-capping) */
void launch_softcap(float *x, size_t n, float c, cudaStream_t s);
/* x[i] += y[i], i < n (the residual add after a post norm) */
void launch_add(float *x, const float *y, size_t n, cudaStream_t s);
/* g[i] = act(g[i]) * u[i], i < n: gelu = false SiLU (SwiGLU), true gelu with the tanh
 * approximation (GeGLU, gemma) */
void launch_glu(bool gelu, float *g, const float *u, size_t n, cudaStream_t s);
/* MoE: out[i] = x[rows[i]] (rows of d floats), i < r */
void launch_gather_rows(const float *x, const int *rows, int r, int d, float *out, cudaStream_t s);
/* MoE: acc[rows[i]] += w[i] * y[i] (rows of d floats), i < r; rows distinct */
void launch_scatter_add(float *acc, const float *y, const int *rows, const float *w, int r, int d, cudaStream_t s);
/* MoE shared expert (qwen2moe): acc[t] += sigmoid(gl[t]) * y[t] (rows of d floats), t < n */
void launch_sigmoid_gate_add(float *acc, const float *y, const float *gl, int n, int d, cudaStream_t s);
/* x[rows][n] <- H_n x / sqrt(n) per row, in place (the butterfly of hadamard.c, bit-exact) */
void launch_hadamard(float *x, int64_t rows, int n, cudaStream_t s);
/* the same for cnt <= 3 arrays x[i] of rows[i] rows each, in one launch */
void launch_hadamard_n(float *const *x, const int64_t *rows, int cnt, int n, cudaStream_t s);

/* ---- cuda_kv.cu: KV cache writes and reads ---- */
/* dpos set (CUDA graph replay): dst += *dpos * pos_stride bytes, read on the device */
void launch_kv_write(qf_kv_mode mode, const float *src, int64_t rows, int hd, size_t rb, uint8_t *dst, cudaStream_t s,
                     const int *dpos = NULL, size_t pos_stride = 0);
/* K and V (plain modes, each its own mode and row size) in one launch, as two launch_kv_write */
void launch_kv_write2(const qf_kv_mode mode[2], const float *const src[2], int64_t rows, int hd, const size_t rb[2],
                      uint8_t *const dst[2], cudaStream_t s, const int *dpos, const size_t pos_stride[2]);
void launch_kv_read(qf_kv_mode mode, const uint8_t *src, int64_t rows, int hd, size_t rb, float *out, cudaStream_t s);
/* kv-int8 in any row layout (0 STATIC, 1 STATIC_ROT, 2 TOKEN_ROT, 3 TOKEN, 4 EC_ROT: engine.h):
 * n_tok rows of nkv heads x hd; inv / scale: the layer's static [nkv * hd] (static layouts);
 * step: kv_tok_steps' KV_STEPS_N steps on the device. The write rotates src in place (rot
 * layouts). */
void kv_tok_steps(float *t);
/* kv_tok_steps' table: [0, 256) the token layouts' steps, [KV_EC_STEP_OFF, + 1024) ec-rot's */
#define KV_EC_STEP_OFF 256
#define KV_STEPS_N (KV_EC_STEP_OFF + 1024)
/* ec-rot: kv heads coded together per token (kv_cache.c's ec_group) */
int kv_ec_group(int nkv, int hd);
/* ec-rot's row index (the GPU's own, beside the host's bytes): a coded row of n bytes (n
 * elements) is decoded in chunks of KV_EC_CHUNK elements by a thread each, chunk c > 0 starting
 * at the bit the encoder recorded, index[row][c - 1] (uint16). kv_ec_index: the entries a row
 * (0: rows under 2 chunks are decoded whole). */
#define KV_EC_CHUNK 32
__host__ __device__ static inline int kv_ec_index(int n) { return n >= 2 * KV_EC_CHUNK ? (n + KV_EC_CHUNK - 1) / KV_EC_CHUNK - 1 : 0; }
/* ec-rot's chunk decoder, bit for bit kv_codes.c's qf_kv_int8_ec_dequantize: elements [i, i1)
 * of a coded row held as 32-bit words q[0, nw) (shared memory), the first code at bit pos (10
 * for chunk 0, else the row's index entry), step d; put(i, v) stores element i. The caller
 * keeps q readable up to word nw + 2; what lies past nw does not matter, since bits past the
 * row's total only ever belong to a code that is dropped. A code: h from its first bits (0h:
 * h < 2; 1tt: h = 2 + tt for tt < 3; 111 then ones up to a zero: h = 5 + ones), then 4 low bits
 * and the sign. A round reads the 64 bits at pos (three words, two funnel shifts; no window to
 * refill) and decodes two codes from them: the first from its low 32 bits, the second from the
 * 32 bits after the first code. h and the prefix length are selected, not branched on, so the
 * lanes of a warp (each decoding its own chunk) do not diverge; only a code that does not fit
 * 32 bits (24 ones or more: h >= 29, |c| >= 464) is read field by field, alone in its round
 * (words past nw read as zeros there). Returns where it stopped: i1, or the element whose code
 * would end past the row's total bits (rows the encoder wrote never do; the caller zeroes the
 * rest). One definition for the expansion (cuda_kv.cu) and split-K attention
 * (cuda_attention.cu). H100, 8B q4_0, ec-rot K and V: 1.05x decode at position 4000 and 1.14x
 * at 16000 against the 64-bit refill window it replaced (docs/gpu.md "Session 37"). */
__device__ static inline uint32_t ec_bits32(const uint32_t *q, int pos) { /* bits [pos, pos + 32) */
    const int wi = pos >> 5;
    return __funnelshift_r(q[wi], q[wi + 1], (uint32_t)pos);
}
/* h and the prefix length plen of the code at w's first bit; true: a long code */
__device__ static inline bool ec_head(uint32_t w, uint32_t &h, int &plen) {
    const uint32_t b0 = w & 1u, t = (w >> 1) & 3u;
    const int ones = __ffs(~(w >> 3)) - 1; /* ones after 111: at most 29 */
    h = !b0 ? (t & 1u) : t < 3 ? t + 2 : 5u + (uint32_t)ones;
    plen = !b0 ? 2 : t < 3 ? 3 : 4 + ones;
    return b0 && t == 3 && ones > 23;
}
/* a long code's h: its ones word by word from bit pos + 3 (words past nw read as zeros); pos
 * is left at its low bits */
__device__ static inline uint32_t ec_long(const uint32_t *q, int nw, int &pos) {
    int p = pos + 3;
    uint32_t h = 5;
    for (;;) {
        const int wi = p >> 5;
        const uint32_t x = __funnelshift_r(wi < nw ? q[wi] : 0u, wi + 1 < nw ? q[wi + 1] : 0u, (uint32_t)p);
        if (x == 0xffffffffu) {
            h += 32, p += 32;
            continue;
        }
        const int o = __ffs(~x) - 1;
        h += (uint32_t)o, p += o + 1;
        break;
    }
    pos = p;
    return h;
}
/* the element of the code whose h is h and whose low bits and sign start at bit plen of w */
__device__ static inline float ec_value(uint32_t w, uint32_t h, int plen, float d) {
    const uint32_t tail = w >> plen;
    const uint32_t c = h << 4 | (tail & 15u), sg = (tail >> 4) & 1u;
    const float v = __fmul_rn((float)c, d);
    return sg ? -v : v;
}
template <class Put>
__device__ static inline int ec_decode_run(const uint32_t *q, int nw, int pos, int total, int i, int i1, float d,
                                           Put put) {
    if (pos > total) return i; /* so every main-path read below is of words <= nw + 2 */
    while (i < i1) {
        const int wi = pos >> 5;
        const uint32_t q0 = q[wi], q1 = q[wi + 1], q2 = q[wi + 2];
        const uint32_t lo = __funnelshift_r(q0, q1, (uint32_t)pos), hi = __funnelshift_r(q1, q2, (uint32_t)pos);
        uint32_t h;
        int plen;
        if (ec_head(lo, h, plen)) { /* a long code: alone this round */
            h = ec_long(q, nw, pos);
            const uint32_t w = ec_bits32(q, pos); /* pos <= nw * 32 + 1: words <= nw + 1 */
            pos += 5;
            if (pos > total) break;
            put(i++, ec_value(w, h, 0, d));
            continue;
        }
        const int len = plen + 5; /* <= 32 */
        const float v1 = ec_value(lo, h, plen, d);
        /* the second code from the 32 bits after the first (lo:hi is 64 bits from pos) */
        const uint32_t w2 = len == 32 ? hi : __funnelshift_r(lo, hi, (uint32_t)len);
        uint32_t h2;
        int plen2;
        const bool long2 = ec_head(w2, h2, plen2);
        pos += len;
        if (pos > total) break;
        put(i++, v1);
        if (long2 || i >= i1) continue; /* a long second code: the next round's first */
        const float v2 = ec_value(w2, h2, plen2, d);
        pos += plen2 + 5;
        if (pos > total) break;
        put(i++, v2);
    }
    return i;
}
/* the index entries of one position of one stream (ec-rot) */
static inline size_t kv_ec_index_per_pos(int nkv, int hd) {
    const int n = kv_ec_group(nkv, hd) * hd;
    return (size_t)(nkv * hd / n) * kv_ec_index(n);
}
/* One stream's buffers of an int8 write or expansion; the launchers below take ns = 1 or 2 of
 * them (K and V) in one launch each (blockIdx.y picks the stream; the same layout for both). */
typedef struct {
    float *src;         /* write: [n_tok][nkv][hd] f32 (rotated in place first for the rot layouts) */
    int8_t *dst;        /* write: the token's row (with dpos: the layer's row 0, see below) */
    uint16_t *ix;       /* write: ec-rot's index at dst's position */
    const float *inv;   /* static layouts: the layer's [nkv * hd] reciprocal scales (write) */
    const float *scale; /* static layouts: the layer's [nkv * hd] scales (expansion) */
    const int8_t *codes; /* expansion: the layer's rows, position 0 */
    const uint16_t *eix; /* expansion: ec-rot's index of the layer, position 0 */
    float *out;         /* expansion: [n_tok][nkv][hd] f32, or f16 rows in its memory (h16) */
} kv8_io;
typedef struct {
    kv8_io s[2];
} kv8_pair;
/* the stream blockIdx.y picks, field by field (an indexed parameter would go through a stack copy) */
__device__ static inline kv8_io kv8_pick(const kv8_pair &p) {
    const bool b = blockIdx.y != 0;
    kv8_io a;
    a.src = b ? p.s[1].src : p.s[0].src, a.dst = b ? p.s[1].dst : p.s[0].dst, a.ix = b ? p.s[1].ix : p.s[0].ix;
    a.inv = b ? p.s[1].inv : p.s[0].inv, a.scale = b ? p.s[1].scale : p.s[0].scale;
    a.codes = b ? p.s[1].codes : p.s[0].codes, a.eix = b ? p.s[1].eix : p.s[0].eix, a.out = b ? p.s[1].out : p.s[0].out;
    return a;
}
/* dpos (graph replay, one token): dst is the layer's row 0 and the token goes to row *dpos, read
 * on the device (pos_stride bytes a token; ix moves with it); NULL: dst is the token's own row.
 * rotate: the rot layouts' src rows are Hadamard-rotated in place first (false: the caller did) */
void launch_kv_int8_write(int layout, const kv8_io *io, int ns, int64_t n_tok, int nkv, int hd, const float *step,
                          cudaStream_t s, const int *dpos, size_t pos_stride, bool rotate);
/* positions [0, n_tok) expanded; with dpos (graph replay, one token) only [0, *dpos + 1) of them,
 * read on the device (n_tok is then the grid's size: n_ctx). rot_back: the rotated layouts'
 * rows are rotated back (H x); without it they stay as stored (H k, H v), and attention runs
 * on H q and rotates its output back (--kv-rot's way: O(1) a step instead of O(positions)).
 * h16: out holds f16 rows (the __float2half_rn of each value; not with rot_back), which the
 * vectorized split-K kernel reads */
void launch_kv_int8_expand(int layout, const kv8_io *io, int ns, int64_t n_tok, int nkv, int hd, const float *step,
                           cudaStream_t s, const int *dpos, bool rot_back, bool h16);
/* layouts stored Hadamard-rotated (static-rot, token-rot, ec-rot) */
static inline bool kv_int8_rotated(int layout) { return layout == 1 || layout == 2 || layout == 4; }
/* kv-dict rows on the device: n rows x[n][hd] OMP-encoded against unit-norm atoms [A][hd] with
 * their Gram matrix [A][A] (the host's, uploaded) at sparsity s, packed into codes (rb bytes a
 * row, v1 layout: byte or 2-byte indices, f16 or q8 coefficients): the host encoder's bytes
 * (qf_kv_omp_one + qf_kv_code_pack). false (nothing launched) where its scratch does not fit */
bool launch_kv_dict_encode(const float *x, int64_t n, int hd, const float *atoms, const float *gram, int A, int s, int q8,
                           size_t rb, uint8_t *codes, qf_gpu_dict_omp omp, cudaStream_t st);
void launch_kv_expand_dict(const uint8_t *codes, int64_t n_rows, int hd, size_t rb, const float *atoms, int na,
                           int sparsity, int q8, float *out, cudaStream_t s);
/* kv-rq: one (layer, stream) as the decoder reads it (cuda_backend.cu set_kv uploads the host
 * cache's codecs; the matrices transposed so that threads read consecutive floats) */
struct rq_layer_dev {
    const uint8_t *codes;              /* the layer's rows [n_ctx][nkv], rb bytes each */
    size_t rb;
    int bits;                          /* 1..6, 16 (f16 rows), or a format-3 rate (decT set) */
    const float *levels, *mean, *cs;   /* [nkv][64], [nkv][hd], [nkv][hd] */
    const float *scale;                /* [256]: qf_kv_rq_scale(c), the host's exp2f */
    float hs;                          /* 1 / sqrtf(hd), the host's */
    const float *decT;                 /* format 3: [nkv][hd (j)][hd (i)] = dec[i][j], else NULL */
    const float *sigma, *klevels;      /* format 3: [nkv][hd], [nkv][hd][64] */
    const uint8_t *width;              /* format 3: [nkv][hd] */
    const uint16_t *boff;              /* format 3: [nkv][hd] bit offset of each code */
    const float *predT;                /* V with a predictor: [HD (col)][HD (row)], else NULL */
    const float *khat;                 /* with predT: [n_pos][HD] the decoded pre-RoPE K rows */
};
/* the format-3 layouts above: bo[h][i] = the bit offset of coordinate i's code in a row of
 * head h's widths w[h][D] (boff), built on the host; encT and decT (dst[h][j][i] = src[h][i][j]
 * for nh D x D matrices) by launch_transpose_sq on the device */
static inline void rq_bit_offsets(const uint8_t *w, size_t nh, int D, uint16_t *bo) {
    for (size_t h = 0; h < nh; h++) {
        unsigned b = 0;
        for (int i = 0; i < D; i++) bo[h * D + i] = (uint16_t)b, b += w[h * D + i];
    }
}
/* dst[b][j][i] = src[b][i][j] for nb n x n matrices (src and dst device memory, distinct): the
 * format-3 encT / decT and the V predictor's predT */
void launch_transpose_sq(const float *src, size_t nb, int n, float *dst, cudaStream_t s);
/* sc[c] = qf_kv_rq_scale(c) for every scale code c (the host's exp2f; sc[0] = 0) */
static inline void rq_scale_table(float sc[256]) {
    sc[0] = 0.0f;
    for (int c = 1; c < 256; c++) sc[c] = exp2f((float)(c - 128) / 8);
}
/* one (layer, stream) as the encoder writes it: the rows go to dst ([n][nkv] rows of rb bytes) */
struct rq_enc_dev {
    uint8_t *dst;
    size_t rb;
    int bits;                          /* 1..6, 16, or a format-3 rate (encT set) */
    const float *levels, *mean, *inv_cs; /* [nkv][64], [nkv][hd], [nkv][hd] */
    const float *scale;                /* [256]: qf_kv_rq_scale(c) */
    float hs;                          /* 1 / sqrtf(hd) */
    const float *encT;                 /* format 3: [nkv][hd (j)][hd (i)] = enc[i][j], else NULL */
    const float *sigma, *klevels;      /* format 3: [nkv][hd], [nkv][hd][64] */
    const uint8_t *width;              /* format 3: [nkv][hd] */
};
/* n_rows rows x[n_rows][hd] (row r is kv head r % nkv) encoded into a.dst: the host encoder's bytes */
void launch_kv_rq_encode(const rq_enc_dev *a, const float *x, int64_t n_rows, int nkv, int hd, cudaStream_t s);
/* res[n][HD] = v - P khat (kv-rq's V predictor, P given transposed: predT[i][o] = P[o][i]) */
void launch_kv_rq_vres(const float *v, const float *khat, const float *predT, int n, int HD, float *res, cudaStream_t s);
/* format-3 rows [0, n_pos) x nkv as coefficients y [n_pos][nkv][hd] and out = their means (then
 * out += y dec^T per head decodes them: cuda_backend.cu rq_store) */
void launch_kv_rq_coef3(const rq_layer_dev *a, int64_t n_pos, int nkv, int hd, float *y, float *out, cudaStream_t s);
/* rows [0, n_pos) x nkv of one layer decoded to f32 [n_pos][nkv][hd] (bit-identical to the host) */
void launch_kv_rq_expand(const rq_layer_dev *a, int64_t n_pos, int nkv, int hd, float *out, cudaStream_t s);
/* exact sinks / recent window (kv_cache.c qf_kv_cache_set_exact): store the batch's sink rows,
 * gather the exact view of a batch (dst may be stored: one query), push the window ring */
void launch_kv_sink_write(uint16_t *sink, const float *fresh, int pos0, int n, int n_sink, int dkv, cudaStream_t s);
void launch_kv_exact_gather(float *dst, const float *stored, const float *fresh, const uint16_t *sink,
                            const uint16_t *win, const int *win_pos, int n_sink, int n_window, int pos0, int n, int dkv,
                            cudaStream_t s);
void launch_kv_window_push(uint16_t *win, int *win_pos, const float *fresh, int pos0, int n, int n_window, int dkv,
                           cudaStream_t s);

/* ---- cuda_attention.cu ---- */
/* flash route: K and V in one mode, f16 (cp.async tiles) or f32 / q8_0 / q4_0 (tiles dequantized
 * to f16 by the kernel), head_dim <= 256 */
static inline bool flash_ok(qf_kv_mode mk, qf_kv_mode mv, int hd) {
    return mk == mv && (mk == QF_KV_F16 || mk == QF_KV_F32 || mk == QF_KV_Q8_0 || mk == QF_KV_Q4_0) && hd <= 256;
}
/* Causal GQA attention of n queries at [pos0, pos0 + n) over the cache rows [0, pos0 + n).
 * flash false: one warp per (query, head), f32; true: the tensor-core kernel where flash_ok
 * and rbk == rbv (other caches take the warp kernel). q16 set (flash only): f16 Q instead of q;
 * out16 set (flash only): f16 output instead of out. The family features (forward.c's
 * attention_worker): scale (0: 1/sqrt(hd)) multiplies q.k; cap > 0 soft-caps the scores,
 * cap * tanh(s / cap); window > 0 lets the query at t see only keys t - window < p <= t. Any of
 * them set takes the warp kernel. */
void launch_attention(qf_kv_mode mk, qf_kv_mode mv, const float *q, const uint8_t *K, const uint8_t *V, size_t rbk,
                      size_t rbv, int n, int pos0, int n_head, int n_head_kv, int hd, float *out, bool flash,
                      __half *out16, const __half *q16, cudaStream_t s, float scale = 0.0f, float cap = 0.0f,
                      int window = 0);
/* The same over f32 rows K, V [pos][n_head_kv][hd] with exact sinks and a recent window: the
 * query at t reads EK / EV (the exact view) for keys p < n_sink and t - n_window < p <= t, K / V
 * for the others (forward.c attention_worker's per-(t, p) choice); one warp per (query, head). */
void launch_attention_exact(const float *q, const float *K, const float *V, const float *EK, const float *EV, int n,
                            int pos0, int n_head, int n_head_kv, int hd, int n_sink, int n_window, float *out,
                            cudaStream_t s);
/* The same on the tensor-core flash kernel (head_dim <= 256): the stored keys S <= p <= t - R as
 * causal flash attention over the rows from S on with the queries shifted by R + S, the exact
 * keys by one warp per (query, head), the two merged by their softmax denominators. part:
 * attention_exact_flash_floats(n, n_head, hd) floats of device scratch. */
void launch_attention_exact_flash(const float *q, const float *K, const float *V, const float *EK, const float *EV, int n,
                                  int pos0, int n_head, int n_head_kv, int hd, int n_sink, int n_window, float *part,
                                  float *out, cudaStream_t s);
size_t attention_exact_flash_floats(int n, int n_head, int hd);

/* Split-K ("flash decoding") attention for decode batches: the keys of each query cut into up
 * to 256 ranges of >= 16 keys attended to in parallel, then merged (any plain cache mode).
 * part: attention_split_floats(n, n_head, hd) floats of device scratch. dpos set (CUDA graph
 * replay): the position is read from device memory instead of pos0, and the grid is sized for
 * any position up to n_ctx (the results are the same as with pos0 = *dpos). GQA groups of up
 * to 8 heads run one block per (range, kv head); n_ctx (0: pos0 + n) picks the kernel. early:
 * K and V are the cache itself (not a per-call expansion), so rows before pos0 are loaded
 * before the kernel waits for its predecessor (see pdl_wait). */
/* What the decode step folds into split-K attention (launch_attention_split's fx), so the step
 * launches fewer kernels:
 * - qkv set (f16 cache with rows of hd * 2 bytes; K and V each q8_0 or q4_0, or f16 under rot,
 *   where attention_one_runs): the q|k|v split (k_qkv_split kind 2; otherwise kind 0 and the K|V
 *   write). qkv is
 *   the fused projection's output [n][n_head + 2 n_head_kv][hd]; bq / bk / bv the biases (or
 *   NULL), cs / sn the call's RoPE tables, half and neox qkv_pair's operands. For one token with
 *   the vectorized kernel, each block rotates its heads' q itself and the block whose range holds
 *   position pos0 writes the token's K and V rows into the cache; otherwise k_qkv_split is
 *   launched first (into q and the cache rows at pos0 / *dpos). The same bits either way.
 * - xq set (hd % 32 == 0): the merge also writes the q8_0 activation of its output
 *   (ACT_Q_BYTES(n, n_head * hd) layout, k_quant_act's bytes), so the o matvec needs no
 *   quantization launch. */
typedef struct {
    const float *qkv, *cs, *sn, *bq, *bk, *bv;
    int half, neox;
    void *xq;
    /* the cache's rows rotated (--kv-rot hadamard, or an int8 layout's rotated V): the output is
     * rotated back (hadamard_warp, this scale: 1 / sqrtf(hd) as the host computes it) by the
     * kernel that writes it (k_attn_one or k_attn_merge), before the o activation; with qkv
     * (k_attn_one only) the token's q, K and V rows are rotated before K and V are stored.
     * 0: no rotation. Without qkv the caller has rotated q. */
    float rot;
} attn_fuse;
/* int8 K and V read in place by split-K decode (launch_attention_split's i8; mk = mv =
 * QF_KV_INT8, K and V the layer's cache at position 0, rows in their stored basis: a rotated
 * layout's caller rotates q and the output), dequantized as the expansion does (static: code *
 * scale; token: code * the step its parities name; ec-rot: ec_decode_run from the row's index),
 * so no per-step expansion of the layer is written or read. Static and token rows are read
 * straight from global memory (k_attn_split_h's int8 form); with ec-rot in either stream each
 * range's rows are staged in shared memory 32 keys at a time (k_attn_split_i8). */
typedef struct {
    int lay[2];            /* qf_kv_int8_layout of K and V */
    const float *scale[2]; /* static layouts: the layer's [nkv * hd] scales */
    const uint16_t *ix[2]; /* ec-rot: the layer's row index at position 0 (kv_ec_index entries a row) */
    const float *steps;    /* kv_tok_steps' table on the device (KV_STEPS_N) */
    int ec_n;              /* ec-rot: elements (and bytes) of a coded row, kv_ec_group * hd */
} attn_i8;
/* whether launch_attention_split reads int8 in place for this shape (head_dim 64 or 128, GQA
 * group 1, 2, 3, 4 or 8, its shared memory within 48 KB at n_ctx, 16-byte aligned rows) */
bool attention_split_i8_ok(int n_head, int n_head_kv, int hd, int n_ctx, const attn_i8 *i8);
/* One token over at most this many keys (0: never) of an mk / mv cache with head_dim hd runs
 * one block a query head (k_attn_one: no ranges, no merge) instead of split-K; for K and V both
 * f16, or each q8_0 or q4_0, 512 at head_dim 64 and 256 at 128. launch_attention_split takes it
 * for plain launches by the position, and under graph capture (dpos) when n_ctx is at most this:
 * a caller that replays graphs at longer contexts captures one for the short positions (n_ctx
 * this) and one for the rest, so each gives the plain launches' bits. */
int attention_one_keys(qf_kv_mode mk, qf_kv_mode mv, int hd);
/* whether launch_attention_split with these arguments runs k_attn_one (one token, 16-byte
 * aligned caches of kv_row_bytes rows, the keys within attention_one_keys). Only then may a
 * q8_0 / q4_0 (or rotated) cache's caller fold the q|k|v split and the K|V write into it
 * (fx->qkv). */
bool attention_one_runs(qf_kv_mode mk, qf_kv_mode mv, const void *K, const void *V, size_t rbk, size_t rbv, int n,
                        int hd, int pos0, const int *dpos, int n_ctx);
/* returns whether fx->xq was written */
bool launch_attention_split(qf_kv_mode mk, qf_kv_mode mv, const float *q, const uint8_t *K, const uint8_t *V,
                            size_t rbk, size_t rbv, int n, int pos0, int n_head, int n_head_kv, int hd, float *out,
                            float *part, cudaStream_t s, const int *dpos = NULL, int n_ctx = 0, bool early = false,
                            const attn_fuse *fx = NULL, const attn_i8 *i8 = NULL);
size_t attention_split_floats(int n, int n_head, int hd);

/* ---- cuda_canon.cu: the canonical arithmetic (kernels/canon.h), the CPU's bits ---- */
/* out[r] = RMSNorm of x[r] times g, r < n rows of d */
void launch_canon_rmsnorm(const float *x, const float *g, int n, int d, float eps, float *out, cudaStream_t s);
void launch_canon_rope(float *v, int n, int n_heads, int hd, int half, bool neox, const float *cs, const float *sn,
                       cudaStream_t s);
/* g[i] = SiLU(g[i]) * u[i], i < n */
void launch_canon_silu(float *g, const float *u, size_t n, cudaStream_t s);
/* y[n][N] = x[n][K] . W^T as forward.c's canonical route computes it (q8 / K integer GEMMs on
 * quantized activations, else the f32 chain); act: ACT_Q_BYTES(n, K) bytes of scratch */
qf_status canon_matmul(const dweight *w, const float *x, int n, float *y, void *act, cudaStream_t s, qf_error *err);
/* causal GQA attention of n queries q [n][n_head][hd] at [pos0, pos0 + n) over f32 rows K, V
 * [pos][nkv][hd]: out [n][n_head][hd]; S: n_head * n * (pos0 + n) floats of scratch. EK, EV
 * (kv-rq's exact view, or NULL): the rows the query at tq reads instead for keys p < n_sink and
 * p > tq - n_window (canon.h qf_canon_exact) */
void launch_canon_attention(const float *q, const float *K, const float *V, const float *EK, const float *EV, int n_sink,
                            int n_window, int n, int pos0, int n_head, int nkv, int hd, float scale, float *S, float *out,
                            cudaStream_t s);

/* ---- cuda_score.cu ---- */
/* nll[r] = -log softmax(logits[r])[tgt[r]], r < n_rows */
void launch_nll(const float *logits, int n_rows, int V, const int32_t *tgt, double *nll, cudaStream_t s);
/* *out (device memory) = one row of V logits reduced for the sampler (decode_topk's contract in
 * cuda_backend.h): max, argmax, non-finite count; temp > 0 the sum of expf((l - max) / temp) and
 * the k largest (1 <= k <= QF_GPU_TOPK_MAX), equal values taken from the lower ids. */
void launch_topk(const float *logits, int V, float temp, int k, qf_gpu_topk *out, void *scratch, cudaStream_t s);
/* launch_topk's scratch (device memory, required) for a row of V logits */
size_t topk_scratch_bytes(int V);

/* ---- cuda_ops.cu: the single operations of the function table (cuda_backend.h) ---- */
qf_status op_dequant(qf_type t, const void *src, size_t rb, int64_t rows, int64_t k, float *dst, qf_error *err);
qf_status op_matmul(const qf_weight *w, const float *x, int n, float *y, int route, qf_error *err);
qf_status op_matvec_gu(const qf_weight *w, const float *x, int n, int F, float *hb, qf_error *err);
qf_status op_rmsnorm(const float *x, const float *g, int n, int d, float eps, float *out, int act, void *xq,
                     void *xq_ref, qf_error *err);
qf_status op_rope(float *v, int n, int n_heads, int head_dim, int n_rot, qf_rope_type type, const float *cs,
                  const float *sn, qf_error *err);
qf_status op_silu_mul(const float *g, const float *u, size_t n, float *out, qf_error *err);
qf_status op_topk(const float *logits, int V, float temp, int k, qf_gpu_topk *out, qf_error *err);
qf_status op_attention(const float *q, const float *k, const float *v, int n, int pos0, int n_head, int n_head_kv,
                       int hd, qf_kv_mode mode, int route, float *out, qf_error *err);
qf_status op_kv_roundtrip(qf_kv_mode mode, qf_kv_rot rot, const float *x, int64_t rows, int hd, void *bytes,
                          float *out, qf_error *err);
qf_status op_kv_int8_roundtrip(const float *x, int64_t rows, int dkv, int hd, int layout, const float *scale,
                               const float *inv, int8_t *bytes, float *out, qf_error *err);
qf_status op_kv_dict_encode(const float *x, int64_t rows, int hd, const float *atoms, const float *gram, int n_atoms,
                            int sparsity, int coef_q8, size_t rb, qf_gpu_dict_omp omp, uint8_t *codes, qf_error *err);
qf_status op_kv_dict_decode(const uint8_t *codes, int64_t rows, int hd, size_t rb, const float *atoms, int n_atoms,
                            int sparsity, int coef_q8, float *out, qf_error *err);

/* ---- cuda_awq.cu: the AWQ learner's search and block quantizer (cuda_backend.h) ---- */
qf_status awq_group_new(const float *X, int64_t n, int64_t D, const float *W, int64_t R, qf_cuda_awq **out,
                        qf_error *err);
qf_status awq_group_mse(qf_cuda_awq *a, const float *s, int quant, const float *imp, const float *cov, double *mse,
                        qf_error *err);
void awq_group_free(qf_cuda_awq *a);
qf_status awq_quantize(const float *W, int64_t R, int64_t D, const float *s, int quant, const float *imp,
                       const float *cov, void *q4, float *ratio, float *deq, qf_error *err);

/* ---- cuda_learn.cu: kv-rq's dense double-precision learning steps (cuda_forge.h) ---- */
qf_status learn_gram_f64(const float *x, const float *y, int64_t n, int dx, int dy, const double *mx, const double *my,
                         double *A, double *B, qf_error *err);
qf_status learn_chol_sub_f64(const double *L, int n, double *b, int m, qf_error *err);
qf_status learn_rows_minus_f64(const float *y, const float *x, int64_t rows, int64_t stride, int d, const float *P,
                               const float *mean, float *out, qf_error *err);
qf_status learn_klt_measure(const qf_cuda_klt_measure *m, qf_error *err);
qf_status learn_resid_f64(const float *y, const float *xn, int64_t n, int dx, int dy, const double *my, const double *WT,
                          double *d, qf_error *err);

#endif
