/* cuda_attention.cu: causal GQA attention: the one-warp-per-(query, head) kernel over any cache
 * mode, and flash attention on tensor cores for f16 caches (prefill). */
#include "kernels/cuda/cuda_common.cuh"

#include <type_traits>

/* f(MK, MV) with MK, MV the plain cache modes of K and V (f32, f16, q8_0, q4_0) as
 * std::integral_constant<int, mode>, for launching a kernel templated on them; other modes call
 * nothing */
template <class F> static void by_modes(qf_kv_mode mk, qf_kv_mode mv, F f) {
    auto with_v = [&](auto MK) {
        switch (mv) {
        case QF_KV_F32: f(MK, std::integral_constant<int, QF_KV_F32>{}); break;
        case QF_KV_F16: f(MK, std::integral_constant<int, QF_KV_F16>{}); break;
        case QF_KV_Q8_0: f(MK, std::integral_constant<int, QF_KV_Q8_0>{}); break;
        case QF_KV_Q4_0: f(MK, std::integral_constant<int, QF_KV_Q4_0>{}); break;
        default: break;
        }
    };
    switch (mk) {
    case QF_KV_F32: with_v(std::integral_constant<int, QF_KV_F32>{}); break;
    case QF_KV_F16: with_v(std::integral_constant<int, QF_KV_F16>{}); break;
    case QF_KV_Q8_0: with_v(std::integral_constant<int, QF_KV_Q8_0>{}); break;
    case QF_KV_Q4_0: with_v(std::integral_constant<int, QF_KV_Q4_0>{}); break;
    default: break;
    }
}

/* one warp per (query i, head h): online softmax over positions [0, pos0 + i] */
template <int MK, int MV, bool EX = false>
__global__ void k_attention(const float *q, const uint8_t *K, const uint8_t *V, size_t rbk, size_t rbv, int n,
                            int pos0, int n_head, int n_head_kv, int hd, float scale, float cap, int window,
                            float *out, const uint8_t *EK = NULL, const uint8_t *EV = NULL, int n_sink = 0,
                            int n_window = 0) {
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
    /* a sliding-window layer: keys last - window < t <= last */
    const int first = window > 0 && last - window + 1 > 0 ? last - window + 1 : 0;
    for (int t = first; t <= last; t++) {
        /* EX: exact sinks and window (launch_attention_exact) */
        const bool ex = EX && (t < n_sink || t > last - n_window);
        const uint8_t *kr = (ex ? EK : K) + ((size_t)t * n_head_kv + kvh) * rbk;
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < HD_MAX / 32; j++) {
            const int e = lane + 32 * j;
            if (j < nj && e < hd) s += qr[j] * kv_elem<MK>(kr, e);
        }
        s = warp_sum(s) * scale;
        if (cap > 0.0f) s = cap * tanhf(s / cap); /* soft-capping (gemma2) */
        const float mn = fmaxf(m, s);
        const float corr = expf(m - mn), p = expf(s - mn);
        l = l * corr + p;
        const uint8_t *vr = (ex ? EV : V) + ((size_t)t * n_head_kv + kvh) * rbv;
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

/* q8_0 / q4_0 caches: their raw rows are staged in shared memory (cp.async, two stages) and
 * dequantized from there into the f16 tile; the bytes of one staged row (padded to 16) */
template <int HDP, int M> __host__ __device__ constexpr int flash_raw_row() {
    return M == QF_KV_Q8_0 ? (HDP / 32 * 34 + 15) / 16 * 16 : M == QF_KV_Q4_0 ? (HDP / 32 * 18 + 15) / 16 * 16 : 0;
}
/* dynamic shared memory of k_flash_f16: two stages of f16 K and V tiles, and for q8_0 / q4_0
 * two stages of raw K and V rows */
template <int HDP, int BC, int M = QF_KV_F16> constexpr size_t flash_smem() {
    return (size_t)2 * 2 * BC * (HDP + 8) * sizeof(__half) + (size_t)2 * 2 * BC * flash_raw_row<HDP, M>();
}

__device__ static inline float ld_f(const float *p) { return *p; }
__device__ static inline float ld_f(const __half *p) { return __half2float(*p); }

/* QT: f32 Q, or f16 Q written by k_qkv_split<__half> (the same f16 values: Q is rounded to
 * f16 on load either way) */
/* M: the cache mode of K and V. f16 tiles are copied with cp.async; q8_0 and q4_0 rows (whose
 * size is a multiple of 4 bytes: head_dim a multiple of 64) are copied raw with cp.async into a
 * second pair of stages and dequantized there once they have landed; f32 rows (the f32
 * expansion of int8 and dict layers) and other q8_0 / q4_0 rows are read and dequantized
 * straight from global memory. Either way the f16 tiles hold the __float2half_rn of
 * kv_elem<M>, the value every other
 * attention kernel reads (the values the old separate conversion pass, k_kv_to_f16, wrote).
 * rb: bytes of one (token, kv head) row. */
template <int HDP, int BC, typename QT, int M>
__global__ void __launch_bounds__(128) k_flash_f16(const QT *q, const uint8_t *Kb, const uint8_t *Vb, size_t rb, int n,
                                                   int pos0, int n_head, int n_head_kv, int hd, float scale_log2,
                                                   float *out, __half *out16, float *lse2 = NULL) {
    const __half *K = (const __half *)Kb, *V = (const __half *)Vb;
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
    /* q8_0 / q4_0 rows whose size is a multiple of 4 bytes: staged raw (cp.async), then
     * dequantized in shared memory; other rows are read and dequantized straight from global */
    constexpr int RBS = flash_raw_row<HDP, M>();
    const bool raw = RBS > 0 && rb % 4 == 0 && rb <= (size_t)RBS;
    const int cw = rb % 8 == 0 ? 8 : 4, per = (int)rb / cw;
    unsigned char *const rbase = flash_sm + (size_t)2 * 2 * BC * LD * sizeof(__half);
    /* K/V tile of keys [j0, j0 + BC) into stage st; rows past kmax and columns past hd are zero */
    auto load_tile = [&](int j0, int st) {
        __half *dK = sbase + (size_t)st * 2 * BC * LD, *dV = dK + BC * LD;
        if (RBS > 0 && raw) { /* raw rows into raw stage st; rows past kmax zero (dequantize to 0) */
            unsigned char *rK = rbase + (size_t)st * 2 * BC * RBS, *rV = rK + BC * RBS;
            for (int idx = threadIdx.x; idx < BC * per; idx += 128) {
                const int key = idx / per, c = (idx % per) * cw, t = j0 + key;
                const bool in = t <= kmax;
                const size_t off = in ? ((size_t)t * n_head_kv + kvh) * rb + c : 0;
                if (cw == 8) {
                    cp_async8(rK + key * RBS + c, Kb + off, in ? 8 : 0);
                    cp_async8(rV + key * RBS + c, Vb + off, in ? 8 : 0);
                } else {
                    cp_async4(rK + key * RBS + c, Kb + off, in ? 4 : 0);
                    cp_async4(rV + key * RBS + c, Vb + off, in ? 4 : 0);
                }
            }
            cp_async_commit();
            return;
        }
#pragma unroll 4
        for (int idx = threadIdx.x; idx < BC * (HDP / 8); idx += 128) {
            const int key = idx / (HDP / 8), d = (idx % (HDP / 8)) * 8, t = j0 + key;
            const bool in = t <= kmax && d < hd;
            if (M != QF_KV_F16) { /* quantized / f32 rows: dequantize 8 elements into the f16 tile */
                const size_t ro = ((size_t)t * n_head_kv + kvh) * rb;
                __half kh[8], vh[8];
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    const bool ie = in && d + e < hd;
                    kh[e] = __float2half_rn(ie ? kv_elem<M>(Kb + ro, d + e) : 0.0f);
                    vh[e] = __float2half_rn(ie ? kv_elem<M>(Vb + ro, d + e) : 0.0f);
                }
                *(uint4 *)(dK + key * LD + d) = *(const uint4 *)kh;
                *(uint4 *)(dV + key * LD + d) = *(const uint4 *)vh;
                continue;
            }
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
        if (RBS > 0 && raw) { /* raw stage st -> f16 stage st: the __float2half_rn of kv_elem<M> */
            const unsigned char *rK = rbase + (size_t)st * 2 * BC * RBS, *rV = rK + BC * RBS;
            __half *dK = sbase + (size_t)st * 2 * BC * LD, *dV = dK + BC * LD;
            for (int idx = threadIdx.x; idx < BC * (HDP / 8); idx += 128) {
                const int key = idx / (HDP / 8), d = (idx % (HDP / 8)) * 8;
                __half kh[8], vh[8];
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    const bool ie = d + e < hd;
                    kh[e] = __float2half_rn(ie ? kv_elem<M>(rK + key * RBS, d + e) : 0.0f);
                    vh[e] = __float2half_rn(ie ? kv_elem<M>(rV + key * RBS, d + e) : 0.0f);
                }
                *(uint4 *)(dK + key * LD + d) = *(const uint4 *)kh;
                *(uint4 *)(dV + key * LD + d) = *(const uint4 *)vh;
            }
            __syncthreads();
        }
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
        float corr[2], msafe[2];
#pragma unroll
        for (int u = 0; u < 2; u++) {
            mx[u] = fmaxf(mx[u], __shfl_xor_sync(0xffffffffu, mx[u], 1));
            mx[u] = fmaxf(mx[u], __shfl_xor_sync(0xffffffffu, mx[u], 2));
            const float mn = fmaxf(mrow[u], mx[u]);
            /* a row with no key yet (pos0 < 0: launch_attention_rq's shifted part) stays at m = -inf */
            msafe[u] = mn == -INFINITY ? 0.0f : mn;
            corr[u] = exp2f(mrow[u] - msafe[u]); /* first tile: exp2(-inf) = 0 */
            mrow[u] = mn;
            lrow[u] *= corr[u];
        }
#pragma unroll
        for (int nt = 0; nt < BC / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int u = e >> 1;
                const float p = exp2f(s[nt][e] - msafe[u]);
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
        const float inv = lrow[u] > 0.0f ? 1.0f / lrow[u] : 0.0f; /* no key: a zero output of weight 0 */
        if (lse2 && tig == 0) /* log2 of the row's softmax denominator, in the scaled score's units */
            lse2[(size_t)rowi[u] * n_head + rowh[u]] = lrow[u] > 0.0f ? mrow[u] + log2f(lrow[u]) : -INFINITY;
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

/* one instantiation of k_flash_f16; its dynamic shared memory (over 48 KiB) is allowed once a device */
template <int HDP, int BC, typename QT, int M>
static void launch_flash_t(dim3 grid, const QT *q, const uint8_t *K, const uint8_t *V, size_t rb, int n, int pos0,
                           int n_head, int n_head_kv, int hd, float scale_log2, float *out, __half *out16,
                           cudaStream_t s, float *lse2 = NULL) {
    static std::atomic<unsigned long long> allowed{0};
    cu_allow_smem(k_flash_f16<HDP, BC, QT, M>, flash_smem<HDP, BC, M>(), allowed);
    k_flash_f16<HDP, BC, QT, M><<<grid, 128, flash_smem<HDP, BC, M>(), s>>>(q, K, V, rb, n, pos0, n_head, n_head_kv, hd,
                                                                        scale_log2, out, out16, lse2);
}

template <typename QT, int M>
static void launch_flash(const QT *q, const uint8_t *K, const uint8_t *V, size_t rb, int n, int pos0, int n_head,
                         int n_head_kv, int hd, float *out, __half *out16, cudaStream_t s, float *lse2 = NULL) {
    const float scale_log2 = 1.4426950408889634f / sqrtf((float)hd);
    const int G = n_head / n_head_kv;
    dim3 grid((unsigned)n_head_kv, nblk((size_t)n * G, 64));
    if (hd <= 64)
        launch_flash_t<64, 64, QT, M>(grid, q, K, V, rb, n, pos0, n_head, n_head_kv, hd, scale_log2, out, out16, s, lse2);
    else if (hd <= 128)
        launch_flash_t<128, 64, QT, M>(grid, q, K, V, rb, n, pos0, n_head, n_head_kv, hd, scale_log2, out, out16, s, lse2);
    else launch_flash_t<256, 32, QT, M>(grid, q, K, V, rb, n, pos0, n_head, n_head_kv, hd, scale_log2, out, out16, s, lse2);
}

void launch_attention(qf_kv_mode mk, qf_kv_mode mv, const float *q, const uint8_t *K, const uint8_t *V, size_t rbk,
                      size_t rbv, int n, int pos0, int n_head, int n_head_kv, int hd, float *out, bool flash,
                      __half *out16, const __half *q16, cudaStream_t s, float scale, float cap, int window) {
    const float scale0 = 1.0f / sqrtf((float)hd);
    if (scale == 0.0f) scale = scale0;
    if (scale != scale0 || cap > 0.0f || window > 0) flash = false; /* the family features: warp kernel */
    if (flash && flash_ok(mk, mv, hd) && rbk == rbv) { /* out16 set: f16 output only */
        switch (mk) {
        case QF_KV_F16:
            if (q16) launch_flash<__half, QF_KV_F16>(q16, K, V, rbk, n, pos0, n_head, n_head_kv, hd, out, out16, s);
            else launch_flash<float, QF_KV_F16>(q, K, V, rbk, n, pos0, n_head, n_head_kv, hd, out, out16, s);
            return;
        case QF_KV_F32: launch_flash<float, QF_KV_F32>(q, K, V, rbk, n, pos0, n_head, n_head_kv, hd, out, out16, s); return;
        case QF_KV_Q8_0: launch_flash<float, QF_KV_Q8_0>(q, K, V, rbk, n, pos0, n_head, n_head_kv, hd, out, out16, s); return;
        case QF_KV_Q4_0: launch_flash<float, QF_KV_Q4_0>(q, K, V, rbk, n, pos0, n_head, n_head_kv, hd, out, out16, s); return;
        default: break;
        }
    }
    const size_t warps = (size_t)n * n_head;
    by_modes(mk, mv, [&](auto MK, auto MV) {
        k_attention<MK.value, MV.value><<<nblk(warps, 4), 128, 0, s>>>(q, K, V, rbk, rbv, n, pos0, n_head, n_head_kv,
                                                                       hd, scale, cap, window, out);
    });
}

void launch_attention_exact(const float *q, const float *K, const float *V, const float *EK, const float *EV, int n,
                            int pos0, int n_head, int n_head_kv, int hd, int n_sink, int n_window, float *out,
                            cudaStream_t s) {
    const size_t warps = (size_t)n * n_head, rb = (size_t)hd * 4;
    k_attention<QF_KV_F32, QF_KV_F32, true><<<nblk(warps, 4), 128, 0, s>>>(
        q, (const uint8_t *)K, (const uint8_t *)V, rb, rb, n, pos0, n_head, n_head_kv, hd, 1.0f / sqrtf((float)hd), 0.0f,
        0, out, (const uint8_t *)EK, (const uint8_t *)EV, n_sink, n_window);
}

/* ---- exact sinks and window on the flash route (kv-rq prefill) ----
 * The query at t reads the stored rows for keys S <= p <= t - R and the exact view for the
 * others, so its softmax splits into two disjoint key sets whose partial results combine by
 * their denominators: A, the stored keys, is causal attention over the rows from S on with the
 * queries shifted by R + S (the flash kernel at pos0 - R - S; a row with no such key has weight
 * 0); B, at most S + R exact keys per query, takes one warp per (query, head). */
__global__ void k_attn_exact_part(const float *q, const float *EK, const float *EV, int n, int pos0, int n_head,
                                  int n_head_kv, int hd, float scale, int n_sink, int n_window, float *out, float *lse) {
    const int w = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (w >= n * n_head) return;
    const int i = w / n_head, h = w % n_head, kvh = h / (n_head / n_head_kv);
    const int Dq = n_head * hd, nj = (hd + 31) / 32, last = pos0 + i;
    float qr[HD_MAX / 32], acc[HD_MAX / 32];
#pragma unroll
    for (int j = 0; j < HD_MAX / 32; j++) {
        const int e = lane + 32 * j;
        qr[j] = (j < nj && e < hd) ? q[(size_t)i * Dq + (size_t)h * hd + e] : 0.0f;
        acc[j] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    const int ns = n_sink < last + 1 ? n_sink : last + 1, lw = last - n_window + 1, w0 = lw > n_sink ? lw : n_sink;
    for (int pass = 0; pass < 2; pass++)
        for (int t = pass ? w0 : 0; t < (pass ? last + 1 : ns); t++) {
            const float *kr = EK + ((size_t)t * n_head_kv + kvh) * hd, *vr = EV + ((size_t)t * n_head_kv + kvh) * hd;
            float s = 0.0f;
#pragma unroll
            for (int j = 0; j < HD_MAX / 32; j++) {
                const int e = lane + 32 * j;
                if (j < nj && e < hd) s += qr[j] * kr[e];
            }
            s = warp_sum(s) * scale;
            const float mn = fmaxf(m, s), corr = expf(m - mn), p = expf(s - mn);
            l = l * corr + p;
#pragma unroll
            for (int j = 0; j < HD_MAX / 32; j++) {
                const int e = lane + 32 * j;
                if (j < nj && e < hd) acc[j] = acc[j] * corr + p * vr[e];
            }
            m = mn;
        }
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
    for (int j = 0; j < HD_MAX / 32; j++) {
        const int e = lane + 32 * j;
        if (j < nj && e < hd) out[(size_t)i * Dq + (size_t)h * hd + e] = acc[j] * inv;
    }
    if (lane == 0) lse[(size_t)i * n_head + h] = l > 0.0f ? m + logf(l) : -INFINITY;
}

/* out = the two parts weighted by their denominators (la2: log2, lb: natural log) */
__global__ void k_attn_merge2(const float *oa, const float *la2, const float *ob, const float *lb, int64_t n_rows, int hd,
                              float *out) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_rows * hd) return;
    const int64_t r = i / hd;
    const float a = la2[r] * 0.6931471805599453f, b = lb[r], M = fmaxf(a, b);
    const float wa = a == -INFINITY ? 0.0f : expf(a - M), wb = b == -INFINITY ? 0.0f : expf(b - M);
    out[i] = (wa * oa[i] + wb * ob[i]) / (wa + wb);
}

void launch_attention_exact_flash(const float *q, const float *K, const float *V, const float *EK, const float *EV, int n,
                                  int pos0, int n_head, int n_head_kv, int hd, int n_sink, int n_window, float *part,
                                  float *out, cudaStream_t s) {
    const size_t nr = (size_t)n * n_head, rb = (size_t)hd * 4, skip = (size_t)n_sink * n_head_kv * rb;
    float *oa = part, *ob = oa + nr * hd, *la = ob + nr * hd, *lb = la + nr;
    launch_flash<float, QF_KV_F32>(q, (const uint8_t *)K + skip, (const uint8_t *)V + skip, rb, n, pos0 - n_window - n_sink,
                                   n_head, n_head_kv, hd, oa, NULL, s, la);
    k_attn_exact_part<<<nblk(nr, 4), 128, 0, s>>>(q, EK, EV, n, pos0, n_head, n_head_kv, hd, 1.0f / sqrtf((float)hd),
                                                  n_sink, n_window, ob, lb);
    k_attn_merge2<<<nblk(nr * hd, 256), 256, 0, s>>>(oa, la, ob, lb, (int64_t)nr, hd, out);
}

size_t attention_exact_flash_floats(int n, int n_head, int hd) { return (size_t)n * n_head * (2 * (size_t)hd + 2); }

/* ---- split-K decode attention ("flash decoding") ----
 * The one-warp-per-(query, head) kernel walks the whole cache with one warp: 32 warps for a
 * decode step of an 8B model, whatever the context. Here the keys of query i, [0, pos0 + i],
 * are cut into nsplit ranges of L keys; block (c, h, i) runs SPLIT_WARPS warps over range c
 * (keys interleaved between the warps, each with its own online softmax, f32, the body of
 * k_attention), merges its warps and writes a partial (max m, sum l, unnormalised o[hd]) to
 * part; k_attn_merge combines the ranges: O = sum_c o_c e^(m_c - M) / sum_c l_c e^(m_c - M). */
#define SPLIT_WARPS 4
#define SPLIT_L_MIN 16
#define SPLIT_MAX 256

/* the ranges of a batch whose last query sees Tmax keys: L keys each, nsplit of them */
__host__ __device__ static inline void split_ranges(int Tmax, int *L, int *nsplit) {
    int l = (Tmax + SPLIT_MAX - 1) / SPLIT_MAX;
    if (l < SPLIT_L_MIN) l = SPLIT_L_MIN;
    *L = l, *nsplit = (Tmax + l - 1) / l;
}

/* dpos set (CUDA graph replay): pos0 = *dpos, and the ranges follow from it; blocks past the
 * last range leave at once (the grid is sized for the largest position) */
template <int MK, int MV>
__global__ void __launch_bounds__(SPLIT_WARPS * 32)
    k_attn_split(const float *q, const uint8_t *K, const uint8_t *V, size_t rbk, size_t rbv, int pos0, int n_head,
                 int n_head_kv, int hd, float scale, int n, const int *dpos, float *part) {
    pdl_trigger();
    pdl_wait();
    const int c = blockIdx.x, h = blockIdx.y, i = blockIdx.z;
    if (dpos) pos0 = *dpos;
    int L, nsplit;
    split_ranges(pos0 + n, &L, &nsplit);
    if (c >= nsplit) return;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int kvh = h / (n_head / n_head_kv), Dq = n_head * hd, nj = (hd + 31) / 32;
    const int T = pos0 + i + 1, j0 = c * L, j1 = min(T, j0 + L);
    __shared__ float sm_m[SPLIT_WARPS], sm_l[SPLIT_WARPS];
    __shared__ float sm_acc[SPLIT_WARPS][HD_MAX];
    float qr[HD_MAX / 32], acc[HD_MAX / 32];
#pragma unroll
    for (int j = 0; j < HD_MAX / 32; j++) {
        const int e = lane + 32 * j;
        qr[j] = (j < nj && e < hd) ? q[(size_t)i * Dq + (size_t)h * hd + e] : 0.0f;
        acc[j] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int t = j0 + warp; t < j1; t += SPLIT_WARPS) {
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
    if (lane == 0) sm_m[warp] = m, sm_l[warp] = l;
#pragma unroll
    for (int j = 0; j < HD_MAX / 32; j++) {
        const int e = lane + 32 * j;
        if (j < nj && e < hd) sm_acc[warp][e] = acc[j];
    }
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < SPLIT_WARPS; w++)
        if (sm_l[w] > 0) M = fmaxf(M, sm_m[w]);
    float *pp = part + (((size_t)i * n_head + h) * nsplit + c) * (hd + 2);
    for (int e = threadIdx.x; e < hd; e += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < SPLIT_WARPS; w++)
            if (sm_l[w] > 0) o += sm_acc[w][e] * expf(sm_m[w] - M);
        pp[2 + e] = o;
    }
    if (threadIdx.x == 0) {
        float ls = 0.0f;
        for (int w = 0; w < SPLIT_WARPS; w++)
            if (sm_l[w] > 0) ls += sm_l[w] * expf(sm_m[w] - M);
        pp[0] = M, pp[1] = ls;
    }
}

/* ---- split-K decode attention, one block per (range, kv head, query): the GQA group's G
 * query heads share each K/V row read. At most SPLITG_MAX ranges of L >= 16 keys (for
 * T <= 1024 keys ranges of 16, then T / 64).
 * Phase 1: warp w scores keys j0 + w, j0 + w + 4, ... for all G heads (lane e-stride over
 * head_dim as k_attention, f32, warp sums), into shared memory. Phase 2: per head the range's
 * max m and the p = exp(s - m) in place, l = sum p. Phase 3: thread e sums p[g][t] v[t][e]
 * over the range for every head (V rows read once, coalesced). The partial (m, l, o) goes to
 * part in k_attn_split's layout, so k_attn_merge combines them. */
#define SPLITG_L_MIN 16
#ifndef SPLITG_MAX
#define SPLITG_MAX 64
#endif
#define SPLITG_GMAX 8
#define SPLITG_KB 4 /* phase 1: K rows of one warp in flight */
#define SPLITG_VB 16 /* phase 3: V rows in flight (a decode range's 16 keys: one batch) */
__host__ __device__ static inline void split_ranges_g(int Tmax, int *L, int *nsplit) {
    int l = (Tmax + SPLITG_MAX - 1) / SPLITG_MAX;
    if (l < SPLITG_L_MIN) l = SPLITG_L_MIN;
    *L = l, *nsplit = (Tmax + l - 1) / l;
}
static size_t splitg_smem(int G, int hd, int L) { return (size_t)(G * hd + G * L + 2 * G) * sizeof(float); }

/* phase 2 of the grouped split kernels: for head g (warp g, g + SPLIT_WARPS, ...) the range's
 * max m of the scores S[g][0..len), p = exp(s - m) in place, ml[2g] = m, ml[2g + 1] = sum p
 * (0 for an empty range) */
__device__ static inline void split_softmax(float *S, int L, int len, int G, float *ml, int warp, int lane) {
    for (int g = warp; g < G; g += SPLIT_WARPS) {
        float m = -INFINITY;
        for (int t = lane; t < len; t += 32) m = fmaxf(m, S[g * L + t]);
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        float l = 0.0f;
        for (int t = lane; t < len; t += 32) {
            const float p = expf(S[g * L + t] - m);
            S[g * L + t] = p;
            l += p;
        }
        l = warp_sum(l);
        if (lane == 0) ml[2 * g] = m, ml[2 * g + 1] = len > 0 ? l : 0.0f;
    }
}

template <int MK, int MV>
__global__ void __launch_bounds__(SPLIT_WARPS * 32)
    k_attn_split_g(const float *q, const uint8_t *K, const uint8_t *V, size_t rbk, size_t rbv, int pos0, int n_head,
                   int n_head_kv, int hd, float scale, int n, const int *dpos, float *part, int early) {
    extern __shared__ float smg[];
    pdl_trigger();
    const int c = blockIdx.x, kh = blockIdx.y, i = blockIdx.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (dpos) pos0 = *dpos;
    int L, nsplit;
    split_ranges_g(pos0 + n, &L, &nsplit);
    if (c >= nsplit) return;
    const int G = n_head / n_head_kv, Dq = n_head * hd, nj = (hd + 31) / 32;
    const int T = pos0 + i + 1, j0 = c * L, len = min(T, j0 + L) - j0; /* len <= 0: no keys */
    float *qs = smg, *S = smg + G * hd, *ml = S + G * L;
    /* early (the cache itself, not a per-step expansion): range rows t < tp were written by
     * earlier calls, so the first batch of K rows (phase 1) and of V rows (phase 3) is loaded
     * before pdl_wait, overlapping the predecessor (the K|V write of row pos0 + i) */
    const int tp = early ? pos0 - j0 : 0, t00 = warp * SPLITG_KB, e3 = threadIdx.x;
    float kv0[SPLITG_KB][HD_MAX / 32], v0[SPLITG_VB];
#pragma unroll
    for (int u = 0; u < SPLITG_KB; u++) {
        const uint8_t *kr = K + ((size_t)(j0 + t00 + u) * n_head_kv + kh) * rbk;
#pragma unroll
        for (int j = 0; j < HD_MAX / 32; j++) {
            const int e = lane + 32 * j;
            kv0[u][j] = (t00 + u < len && t00 + u < tp && j < nj && e < hd) ? kv_elem<MK>(kr, e) : 0.0f;
        }
    }
#pragma unroll
    for (int u = 0; u < SPLITG_VB; u++)
        v0[u] = u < len && u < tp && e3 < hd ? kv_elem<MV>(V + ((size_t)(j0 + u) * n_head_kv + kh) * rbv, e3) : 0.0f;
    pdl_wait();
    for (int x = threadIdx.x; x < G * hd; x += blockDim.x) qs[x] = q[(size_t)i * Dq + (size_t)kh * G * hd + x];
    __syncthreads();
    /* phase 1, SPLITG_KB keys per warp at a time: their rows are loaded before any is scored, so
     * the loads are in flight together (a decode range is 16 keys: one batch per warp) */
    for (int t0 = t00; t0 < len; t0 += SPLIT_WARPS * SPLITG_KB) {
        float kv[SPLITG_KB][HD_MAX / 32];
#pragma unroll
        for (int u = 0; u < SPLITG_KB; u++) {
            const uint8_t *kr = K + ((size_t)(j0 + t0 + u) * n_head_kv + kh) * rbk;
            const bool pre = t0 == t00 && t0 + u < tp;
#pragma unroll
            for (int j = 0; j < HD_MAX / 32; j++) {
                const int e = lane + 32 * j;
                kv[u][j] = pre ? kv0[u][j] : (t0 + u < len && j < nj && e < hd) ? kv_elem<MK>(kr, e) : 0.0f;
            }
        }
        for (int g = 0; g < G; g++) {
            float a[SPLITG_KB];
#pragma unroll
            for (int u = 0; u < SPLITG_KB; u++) {
                a[u] = 0.0f;
#pragma unroll
                for (int j = 0; j < HD_MAX / 32; j++) {
                    const int e = lane + 32 * j;
                    if (j < nj && e < hd) a[u] += qs[g * hd + e] * kv[u][j];
                }
            }
#pragma unroll
            for (int u = 0; u < SPLITG_KB; u++) {
                const float v = warp_sum(a[u]);
                if (lane == 0 && t0 + u < len) S[g * L + t0 + u] = v * scale;
            }
        }
    }
    __syncthreads();
    split_softmax(S, L, len, G, ml, warp, lane);
    __syncthreads();
    /* phase 3: thread e sums p v[e] over the range, SPLITG_VB V rows loaded at a time */
    for (int e = threadIdx.x; e < hd; e += blockDim.x) {
        float acc[SPLITG_GMAX];
#pragma unroll
        for (int g = 0; g < SPLITG_GMAX; g++) acc[g] = 0.0f;
        for (int t0 = 0; t0 < len; t0 += SPLITG_VB) {
            float v[SPLITG_VB];
#pragma unroll
            for (int u = 0; u < SPLITG_VB; u++)
                v[u] = e == e3 && t0 == 0 && u < tp                                                 ? v0[u]
                       : t0 + u < len ? kv_elem<MV>(V + ((size_t)(j0 + t0 + u) * n_head_kv + kh) * rbv, e)
                                      : 0.0f;
#pragma unroll
            for (int u = 0; u < SPLITG_VB; u++)
#pragma unroll
                for (int g = 0; g < SPLITG_GMAX; g++)
                    if (g < G && t0 + u < len) acc[g] += S[g * L + t0 + u] * v[u];
        }
#pragma unroll
        for (int g = 0; g < SPLITG_GMAX; g++)
            if (g < G) part[(((size_t)i * n_head + kh * G + g) * nsplit + c) * (hd + 2) + 2 + e] = acc[g];
    }
    if (threadIdx.x < G) {
        float *pp = part + (((size_t)i * n_head + kh * G + threadIdx.x) * nsplit + c) * (hd + 2);
        pp[0] = ml[2 * threadIdx.x], pp[1] = ml[2 * threadIdx.x + 1];
    }
}

/* ---- the vectorized split-K kernels' shared steps (k_attn_split_h, k_attn_split_i8) ----
 * phase 1 for one key: the dots of the G heads' q slices qv (16 dimensions a lane) with the
 * key's slice kf, summed across the key's LPK lanes; the key's first lane writes them, times
 * scale, to S[g][t] where `write` */
template <int G, int LPK>
__device__ static inline void split_score(const float (&qv)[G][16], const float (&kf)[16], bool write, float *S, int L,
                                          int t, float scale) {
    float a[G];
#pragma unroll
    for (int g = 0; g < G; g++) {
        a[g] = 0.0f;
#pragma unroll
        for (int k = 0; k < 16; k++) a[g] += qv[g][k] * kf[k];
    }
#pragma unroll
    for (int g = 0; g < G; g++)
#pragma unroll
        for (int o = LPK / 2; o > 0; o >>= 1) a[g] += __shfl_xor_sync(0xffffffffu, a[g], o);
    if (write)
#pragma unroll
        for (int g = 0; g < G; g++) S[g * L + t] = a[g] * scale;
}
/* the end of phase 3: acc (thread (key group, 8-dim chunk d8) of NC8 chunks) summed over the key
 * groups of a warp (lanes d8 + NC8 j), then the warps' in a fixed order through red (ALIAS: red
 * is memory the block read before, so synced first), and the range's partial (m, l, o[HD]) of
 * each head to part in k_attn_split's layout */
template <int G, int HD, int NC8, bool ALIAS>
__device__ static inline void split_finish(float (&acc)[G][8], float *red, const float *ml, float *part, int i,
                                           int n_head, int kh, int nsplit, int c) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, d8 = threadIdx.x % NC8;
#pragma unroll
    for (int g = 0; g < G; g++)
#pragma unroll
        for (int k = 0; k < 8; k++)
#pragma unroll
            for (int o = NC8; o < 32; o <<= 1) acc[g][k] += __shfl_xor_sync(0xffffffffu, acc[g][k], o);
    if (ALIAS) __syncthreads();
    if (lane < NC8)
#pragma unroll
        for (int g = 0; g < G; g++)
#pragma unroll
            for (int k = 0; k < 8; k++) red[(warp * G + g) * HD + 8 * d8 + k] = acc[g][k];
    __syncthreads();
    for (int x = threadIdx.x; x < G * HD; x += blockDim.x) {
        const int g = x / HD, e = x % HD;
        float o = 0.0f;
#pragma unroll
        for (int w = 0; w < SPLIT_WARPS; w++) o += red[(w * G + g) * HD + e];
        part[(((size_t)i * n_head + kh * G + g) * nsplit + c) * (HD + 2) + 2 + e] = o;
    }
    if (threadIdx.x < G) {
        float *pp = part + (((size_t)i * n_head + kh * G + threadIdx.x) * nsplit + c) * (HD + 2);
        pp[0] = ml[2 * threadIdx.x], pp[1] = ml[2 * threadIdx.x + 1];
    }
}

/* ---- int8 rows of the fixed-length layouts (static, token) read straight from global memory
 * by k_attn_split_h<G, HD, true>: the values the staged decoder (k_attn_split_i8's decode)
 * writes, KV_MUL(code, scale[e]) or KV_MUL(code, step) ---- */
enum { I8_STATIC, I8_TOKEN, I8_EC };
__host__ __device__ static inline int i8_class(int lay) { return lay == 4 ? I8_EC : (lay == 2 || lay == 3) ? I8_TOKEN : I8_STATIC; }
/* the parities of the low bits of 8 codes, elements e .. e + 7 with e % 8 == 0 (bytes of lo, then
 * hi): bit j is element group (e + j) % 8's, as kv_codes.c's token code spells its exponent */
__device__ static inline uint32_t i8_tok_par8(uint32_t lo, uint32_t hi) {
    const uint32_t m = (lo & 1u) | (lo >> 7 & 2u) | (lo >> 14 & 4u) | (lo >> 21 & 8u);
    return m | ((hi & 1u) | (hi >> 7 & 2u) | (hi >> 14 & 4u) | (hi >> 21 & 8u)) << 4;
}
/* 16 codes (elements 16 c .. 16 c + 15): groups 0-3 in words x and z, 4-7 in y and w */
__device__ static inline uint32_t i8_tok_par16(uint4 w) { return i8_tok_par8(w.x ^ w.z, w.y ^ w.w); }
/* the row's token step from lane parities m, the row's NL lanes adjacent (a power of two); every
 * lane of the warp calls it */
template <int NL> __device__ static inline float i8_tok_step(uint32_t m, const float *steps) {
#pragma unroll
    for (int o = NL / 2; o > 0; o >>= 1) m ^= __shfl_xor_sync(0xffffffffu, m, o);
    return __ldg(steps + m);
}
/* N codes of words w as KV_MUL(code, sc[j]) (static: sc the elements' scales) or KV_MUL(code,
 * st) (token) */
template <int N> __device__ static inline void i8_codes(const uint32_t *w, bool tok, const float *sc, float st, float *f) {
#pragma unroll
    for (int j = 0; j < N; j++) f[j] = KV_MUL((float)(int8_t)(w[j / 4] >> (8 * (j % 4))), tok ? st : sc[j]);
}

/* The decode step's folded q|k|v split (attn_fuse fx, one token), pair j < hd / 2 of a row, as
 * k_qkv_split computes it (qkv_pair): query head h's rotated q row into q (f32), and kv head
 * kh's rotated K row and its V row into kd / vd (f16: their roundings, the cache's bits; f32: the
 * rows k_qkv_split writes for the K|V write to quantize). The one definition k_attn_split_h and
 * k_attn_one share. */
__device__ static inline void fold_q_pair(const attn_fuse &fx, int hd, int h, int j, float *q) {
    qkv_pair(fx.qkv + (size_t)h * hd, j, fx.half, fx.neox, fx.cs, fx.sn, fx.bq ? fx.bq + (size_t)h * hd : NULL, true, 0,
             q);
}
template <typename OT>
__device__ static inline void fold_kv_pair(const attn_fuse &fx, int hd, int n_head, int n_head_kv, int kh, int j, OT *kd,
                                           OT *vd) {
    qkv_pair(fx.qkv + (size_t)(n_head + kh) * hd, j, fx.half, fx.neox, fx.cs, fx.sn,
             fx.bk ? fx.bk + (size_t)kh * hd : NULL, true, 0, kd);
    qkv_pair(fx.qkv + (size_t)(n_head + n_head_kv + kh) * hd, j, fx.half, fx.neox, fx.cs, fx.sn,
             fx.bv ? fx.bv + (size_t)kh * hd : NULL, false, 0, vd);
}

/* f(QK, QV) with K's and V's modes (each q8_0 or q4_0) as std::integral_constant values */
template <typename F> static void qz_modes(qf_kv_mode mk, qf_kv_mode mv, F f) {
    using Q8 = std::integral_constant<int, QF_KV_Q8_0>;
    using Q4 = std::integral_constant<int, QF_KV_Q4_0>;
    if (mk == QF_KV_Q8_0) {
        if (mv == QF_KV_Q8_0) f(Q8{}, Q8{});
        else f(Q8{}, Q4{});
    } else {
        if (mv == QF_KV_Q8_0) f(Q4{}, Q8{});
        else f(Q4{}, Q4{});
    }
}

/* f(ZK, ZV) for K and V each f16 (0), q8_0 or q4_0, not both f16, as std::integral_constant values:
 * k_attn_split_h's QZ and QV */
template <typename F> static void hq_modes(qf_kv_mode mk, qf_kv_mode mv, F f) {
    using F16 = std::integral_constant<int, 0>;
    using Q8 = std::integral_constant<int, QF_KV_Q8_0>;
    using Q4 = std::integral_constant<int, QF_KV_Q4_0>;
    if (kv_qz(mk) && kv_qz(mv)) qz_modes(mk, mv, f);
    else if (mk == QF_KV_F16) {
        if (mv == QF_KV_Q8_0) f(F16{}, Q8{});
        else f(F16{}, Q4{});
    } else if (mk == QF_KV_Q8_0) f(Q8{}, F16{});
    else f(Q4{}, F16{});
}

/* ---- q8_0 / q4_0 rows read straight from global memory by k_attn_split_h<G, HD, false, QZ, QV> ----
 * A lane's bytes of a block (2-byte aligned: blocks are 34 or 18 bytes) as NW words, and its codes
 * as kv_elem gives them: q8_0 the signed bytes, q4_0 the low (hi false) or high nibbles less 8,
 * times the block's step d. */
template <int NW> __device__ static inline void qz_words(const uint8_t *p, uint32_t *w) {
    const uint16_t *h = (const uint16_t *)p;
#pragma unroll
    for (int k = 0; k < NW; k++) w[k] = (uint32_t)h[2 * k] | ((uint32_t)h[2 * k + 1] << 16);
}
template <int QZ, int N> __device__ static inline void qz_codes(const uint32_t *w, float d, bool hi, float *f) {
#pragma unroll
    for (int j = 0; j < N; j++) {
        const unsigned b = (w[j / 4] >> (8 * (j % 4))) & 0xFFu;
        if constexpr (QZ == QF_KV_Q8_0) f[j] = (float)(int8_t)b * d;
        else f[j] = (float)((int)(hi ? b >> 4 : b & 0xFu) - 8) * d;
    }
}

/* ---- the split-K kernel for an f16 cache with head_dim HD (64 or 128) and GQA group G (1, 2,
 * 4, 8): the grouped kernel's ranges, partials and phases, vectorized. Phase 1: HD / 16 lanes a
 * key (16 dimensions each, two 16-byte loads), 4 keys a warp for HD 128, the G heads' q slices in
 * registers, the dot reduced across the key's lanes. Phase 2: as k_attn_split_g. Phase 3: thread
 * (key group kg, 8-dim chunk d8) sums p v over keys kg, kg + NKG, ... for the G heads, then the
 * key groups are summed (shuffles in the warp, shared memory across the 4 warps). early: the
 * first pass of K and V rows older than pos0 is loaded before pdl_wait, as k_attn_split_g.
 * I8 (groups 1, 2, 3, 4, 8): int8 rows of attn_i8 a's static or token classes (no ec-rot), HD
 * bytes each, read the same way (one 16-byte load a lane in phase 1, 8 bytes in phase 3) and
 * turned into the staged kernel's values in registers: by construction the same scores and sums
 * as k_attn_split_i8 (its phase 3 takes a thread's keys in the same order), without the staging.
 * QZ / QV (K's / V's mode, q8_0 or q4_0 each; groups 1, 2, 3, 4, 8): a lane's 16 elements are
 * half a block, its 16 code bytes (q4_0: the whole block's, one nibble of each) and the block's
 * step, phase 3's 8 elements a quarter (8 bytes); kv_elem's values (qz_codes). */
static size_t splith_smem(int G, int hd, int L) { return (size_t)(G * L + SPLIT_WARPS * G * hd + 2 * G) * sizeof(float); }

template <int G, int HD, bool I8, int QZ = 0, int QV = QZ>
__global__ void __launch_bounds__(SPLIT_WARPS * 32)
    k_attn_split_h(const float *q, const uint8_t *K, const uint8_t *V, size_t rbk, size_t rbv, int pos0, int n_head,
                   int n_head_kv, float scale, int n, const int *dpos, float *part, int early, attn_fuse fx, attn_i8 a) {
    constexpr int LPK = HD / 16, KPW = 32 / LPK, KPB = KPW * SPLIT_WARPS; /* phase 1: lanes a key, keys a pass */
    constexpr int NC8 = HD / 8, NKG = SPLIT_WARPS * 32 / NC8;            /* phase 3: 8-dim chunks, key groups */
    constexpr int KW = I8 || QZ ? 1 : 2;                                  /* 16-byte words of a lane's key slice */
    /* QZ: bytes a block; a lane's key slice in block sub / 2 (q8_0: its half sub % 2), a thread's
     * V chunk in block d8 / 4 (q8_0: its quarter d8 % 4; q4_0: bytes 8 (d8 % 2), nibbles d8 % 4 / 2) */
    constexpr int QB = QZ == QF_KV_Q8_0 ? (int)sizeof(block_q8_0) : (int)sizeof(block_q4_0);
    constexpr int QBV = QV == QF_KV_Q8_0 ? (int)sizeof(block_q8_0) : (int)sizeof(block_q4_0);
    extern __shared__ float smh[];
    pdl_trigger();
    const int c = blockIdx.x, kh = blockIdx.y, i = blockIdx.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (dpos) pos0 = *dpos; /* written before the graph launch */
    int L, nsplit;
    split_ranges_g(pos0 + n, &L, &nsplit);
    if (c >= nsplit) return;
    const int T = pos0 + i + 1, j0 = c * L, len = min(T, j0 + L) - j0; /* len <= 0: no keys */
    const int tp = early ? pos0 - j0 : 0;
    float *S = smh, *red = S + G * L, *ml = red + SPLIT_WARPS * G * HD;
    const int t1 = warp * KPW + lane / LPK, sub = lane % LPK; /* phase 1: this lane's key in a pass, slice */
    const int d8 = threadIdx.x % NC8, kg = threadIdx.x / NC8;  /* phase 3 */
    const uint4 z4 = make_uint4(0, 0, 0, 0);
    /* a lane's K slice (KW 16-byte words) and a thread's V chunk (VT: 16 bytes of f16, 8 of int8,
     * q8_0 or q4_0); QZ: d the block's step */
    auto kslice = [&](int t, uint4 *w, float &d) {
        const uint8_t *row = K + ((size_t)(j0 + t) * n_head_kv + kh) * rbk;
        if constexpr (QZ) {
            const uint8_t *b = row + sub / 2 * QB;
            uint32_t x[4];
            qz_words<4>(b + 2 + (QZ == QF_KV_Q8_0 ? 16 * (sub % 2) : 0), x);
            w[0] = make_uint4(x[0], x[1], x[2], x[3]), d = h2f_bits(*(const uint16_t *)b);
        } else {
            const uint4 *kr = (const uint4 *)row + KW * sub;
#pragma unroll
            for (int u = 0; u < KW; u++) w[u] = kr[u];
        }
    };
    using VT = typename std::conditional<I8 || QV, uint2, uint4>::type;
    auto vchunk = [&](int t, float &d) -> VT {
        const uint8_t *row = V + ((size_t)(j0 + t) * n_head_kv + kh) * rbv;
        if constexpr (QV) {
            const uint8_t *b = row + d8 / 4 * QBV;
            uint32_t x[2];
            qz_words<2>(b + 2 + 8 * (QV == QF_KV_Q8_0 ? d8 % 4 : d8 % 2), x);
            d = h2f_bits(*(const uint16_t *)b);
            return make_uint2(x[0], x[1]);
        } else
            return ((const VT *)row)[d8];
    };
    uint4 k0[KW];
    VT v0[2] = {VT{}, VT{}};
    float kd0 = 0.0f, vd0[2] = {0.0f, 0.0f};
#pragma unroll
    for (int u = 0; u < KW; u++) k0[u] = z4;
    if (t1 < len && t1 < tp) kslice(t1, k0, kd0);
#pragma unroll
    for (int u = 0; u < 2; u++)
        if (kg + u * NKG < len && kg + u * NKG < tp) v0[u] = vchunk(kg + u * NKG, vd0[u]);
    /* I8: each stream's class and, static, phase 1's scales (elements 16 sub ..) */
    const bool ktok = I8 && i8_class(a.lay[0]) == I8_TOKEN, vtok = I8 && i8_class(a.lay[1]) == I8_TOKEN;
    float ksc[I8 ? 16 : 1], vsc[I8 ? 8 : 1];
    if (I8)
#pragma unroll
        for (int k = 0; k < 16; k++) ksc[k] = ktok ? 0.0f : __ldg(a.scale[0] + (size_t)kh * HD + 16 * sub + k);
    pdl_wait();
    float qv[G][16];
    if (!I8 && !QZ && !QV && fx.qkv) { /* the split folded in (one token): red holds the G rotated q rows until phase 3 */
        for (int x = threadIdx.x; x < G * HD / 2; x += blockDim.x) {
            const int g = x / (HD / 2), j = x % (HD / 2);
            fold_q_pair(fx, HD, kh * G + g, j, red + g * HD);
        }
        if (c == nsplit - 1) { /* the range that holds position pos0: the token's K and V rows */
            __half *kd = (__half *)const_cast<uint8_t *>(K + ((size_t)pos0 * n_head_kv + kh) * rbk);
            __half *vd = (__half *)const_cast<uint8_t *>(V + ((size_t)pos0 * n_head_kv + kh) * rbv);
            for (int j = threadIdx.x; j < HD / 2; j += blockDim.x) fold_kv_pair(fx, HD, n_head, n_head_kv, kh, j, kd, vd);
        }
        __syncthreads(); /* the q rows, and the K / V rows phase 1 and 3 read back */
#pragma unroll
        for (int g = 0; g < G; g++)
#pragma unroll
            for (int k = 0; k < 16; k++) qv[g][k] = red[g * HD + 16 * sub + k];
        __syncthreads(); /* red is phase 3's again */
    } else
#pragma unroll
        for (int g = 0; g < G; g++) {
            const float4 *qp = (const float4 *)(q + (size_t)i * n_head * HD + ((size_t)kh * G + g) * HD + 16 * sub);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const float4 v = qp[k];
                qv[g][4 * k] = v.x, qv[g][4 * k + 1] = v.y, qv[g][4 * k + 2] = v.z, qv[g][4 * k + 3] = v.w;
            }
        }
    /* phase 1: S[g][t] = q_g . k_t * scale */
    for (int tb = 0; tb < len; tb += KPB) {
        const int t = tb + t1;
        uint4 kw[KW];
        float kd = 0.0f;
#pragma unroll
        for (int u = 0; u < KW; u++) kw[u] = z4;
        if (tb == 0 && t < tp) {
#pragma unroll
            for (int u = 0; u < KW; u++) kw[u] = k0[u];
            kd = kd0;
        } else if (t < len)
            kslice(t, kw, kd);
        float kf[16];
        if constexpr (QZ) {
            const uint32_t w4[4] = {kw[0].x, kw[0].y, kw[0].z, kw[0].w};
            qz_codes<QZ, 16>(w4, kd, sub % 2, kf);
        } else if constexpr (I8) { /* the step from the row's LPK lanes: every lane takes part */
            const float st = ktok ? i8_tok_step<LPK>(i8_tok_par16(kw[0]), a.steps) : 0.0f;
            const uint32_t w4[4] = {kw[0].x, kw[0].y, kw[0].z, kw[0].w};
            i8_codes<16>(w4, ktok, ksc, st, kf);
        } else
            h8_to_f(kw[0], kf, false), h8_to_f(kw[1], kf + 8, false);
        split_score<G, LPK>(qv, kf, sub == 0 && t < len, S, L, t, scale);
    }
    __syncthreads();
    split_softmax(S, L, len, G, ml, warp, lane);
    __syncthreads();
    /* phase 3: acc[g][0..8) = sum over this key group's keys of p[g][t] v[t][8 d8 ..] */
    float acc[G][8];
#pragma unroll
    for (int g = 0; g < G; g++)
#pragma unroll
        for (int k = 0; k < 8; k++) acc[g][k] = 0.0f;
    if (I8) /* static: phase 3's scales (elements 8 d8 ..) */
#pragma unroll
        for (int k = 0; k < 8; k++) vsc[k] = vtok ? 0.0f : __ldg(a.scale[1] + (size_t)kh * HD + 8 * d8 + k);
    for (int tb = 0; tb < len; tb += 2 * NKG) {
        VT vv[2];
        float vst[2] = {0.0f, 0.0f}, vd[2] = {0.0f, 0.0f};
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const int t = tb + kg + u * NKG;
            if (tb == 0 && t < tp) vv[u] = v0[u], vd[u] = vd0[u];
            else vv[u] = t < len ? vchunk(t, vd[u]) : VT{};
            if constexpr (I8)
                if (vtok) vst[u] = i8_tok_step<NC8>(i8_tok_par8(vv[u].x, vv[u].y), a.steps); /* the row's NC8 threads */
        }
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const int t = tb + kg + u * NKG;
            if (t >= len) break;
            float vf[8];
            if constexpr (QV) {
                const uint32_t w2[2] = {vv[u].x, vv[u].y};
                qz_codes<QV, 8>(w2, vd[u], d8 % 4 >= 2, vf);
            } else if constexpr (I8) {
                const uint32_t w2[2] = {vv[u].x, vv[u].y};
                i8_codes<8>(w2, vtok, vsc, vst[u], vf);
            } else
                h8_to_f(vv[u], vf, false);
#pragma unroll
            for (int g = 0; g < G; g++) {
                const float p = S[g * L + t];
#pragma unroll
                for (int k = 0; k < 8; k++) acc[g][k] += p * vf[k];
            }
        }
    }
    split_finish<G, HD, NC8, false>(acc, red, ml, part, i, n_head, kh, nsplit, c);
}

/* ---- one block per query head for short caches (one token, head_dim 64 or 128) ----
 * Split-K cuts even a cache of 20 keys into ranges and merges them in a second kernel, whose
 * rounds (load the partials, combine, store) cost more than the attention itself at short
 * positions. Here block h attends over all T <= one_keys<HD>() keys of its kv head alone: every row
 * older than pos0 is copied into shared memory (cp.async) before pdl_wait when `early`, the
 * token's q (and, folded, its K and V rows: qkv_pair, the same bits as k_qkv_split) come after
 * it, and the block writes the final output (and the o matvec's q8_0 activation) itself, so
 * neither the split kernel nor the merge has work. Phase 1: HD / 16 lanes a key, each two
 * 8-element chunks of the row (chunks sub and sub + HD / 16: for f16 two 16-byte words,
 * conflict-free), the dot reduced across the key's lanes, each key group keeping its running
 * max; the block's max M from each warp's (one barrier). Phase 3: thread (key group kg, 8-dim
 * chunk d8) forms p = exp(s - M) where it uses it and sums p v over keys kg, kg + NKG, ..., and
 * p into the group's l; the key groups' sums (and l's) added in order through shared memory, out
 * = o * (1 / l) as k_attn_merge. So two block barriers follow phase 1, where a softmax phase of
 * its own (max, exp in place, block sum) took about six: on the H100, 8B q4_0 decode at positions
 * 1..256, 1.03x the step with the producers' early loads (k_mv1_q4g), 1.00x without them
 * (docs/gpu.md "Session 46"). 512 threads a block (16 warps): 256 ran the step at 0.996x.
 * Blocks of a GQA group each rotate the group's K row themselves; the group's first block writes
 * K and V to the cache. Shared memory holds tmax rows (a graph's longest position). On the H100,
 * 8B q4_0 decode at positions 1..256: 1.06x the step of split-K and merge (docs/gpu.md "Session
 * 40").
 * MK, MV, the modes of K and V: both f16, or each q8_0 or q4_0. A quantized row (one_rb bytes)
 * is staged raw, in the widest pieces its size allows (16, 8 or 4 bytes), and dequantized where
 * phases 1 and 3 read it (one_load8: kv_elem's values). Folded, the token's K and V rows are
 * formed in f32 (the rows k_qkv_split writes) and each 32-block quantized by a warp as
 * kv_quant_block does it (kv_quant_warp: the K|V write's bytes). Under --kv-rot (fx.rot) the
 * output is rotated back before it is written and quantized, and, folded, the token's q, K and V
 * rows are rotated in f32 (hadamard_warp: k_hadamard's values) before K and V are stored, in any
 * of the three modes: on the H100, 8B q4_0 at positions 1..256, 1.16x (f16) to 1.21x (q4_0) the
 * step of the separate launches. */
#define ONE_THREADS 512
/* shared floats after the key groups' sums: each warp's max (phase 1), then each key group's l
 * (phase 3; NKG <= ONE_THREADS / 8 at HD >= 64) */
#define ONE_SC (ONE_THREADS / 32 + ONE_THREADS / 8)
/* the most keys k_attn_one takes: what fits about 146 KiB of shared memory (one_smem) with f16
 * rows; q8_0 and q4_0 take as many */
template <int HD> constexpr int one_keys() { return HD == 64 ? 512 : 256; }
/* bytes of one (token, kv head) row in mode M, and its stride in shared memory (16-byte aligned) */
template <int HD, int M> __host__ __device__ constexpr int one_rb() {
    return M == QF_KV_Q8_0 ? HD / QK * (int)sizeof(block_q8_0) : M == QF_KV_Q4_0 ? HD / QK * (int)sizeof(block_q4_0) : HD * 2;
}
template <int HD, int M> __host__ __device__ constexpr int one_rbs() { return (one_rb<HD, M>() + 15) / 16 * 16; }
template <int HD, int MK, int MV> static size_t one_smem(int tmax) {
    constexpr int NKG = ONE_THREADS / (HD / 8);
    return (size_t)tmax * (one_rbs<HD, MK>() + one_rbs<HD, MV>()) + (size_t)(tmax + HD + NKG * HD + ONE_SC) * sizeof(float);
}

/* elements [8c, 8c + 8) of a row staged in mode M, as kv_elem<M> gives them (q8_0 / q4_0:
 * qz_words and qz_codes, split-K's reading of a V chunk) */
template <int M> __device__ static inline void one_load8(const uint8_t *row, int c, float *f) {
    if constexpr (M == QF_KV_F16) {
        h8_to_f(((const uint4 *)row)[c], f, false);
    } else {
        constexpr int QB = M == QF_KV_Q8_0 ? (int)sizeof(block_q8_0) : (int)sizeof(block_q4_0);
        const uint8_t *b = row + c / 4 * QB;
        uint32_t w[2];
        qz_words<2>(b + 2 + 8 * (M == QF_KV_Q8_0 ? c % 4 : c % 2), w);
        qz_codes<M, 8>(w, h2f_bits(*(const uint16_t *)b), c % 4 >= 2, f);
    }
}
/* rows [t0, t1) of kv head kh of a cache (rows of rb bytes, n_head_kv a position) into dst (rows
 * RBS apart), PER pieces of CW bytes a row, cp.async by the block's ONE_THREADS threads (tid) */
template <int CW, int PER, int RBS>
__device__ static inline void one_stage(uint8_t *dst, const uint8_t *src, size_t rb, int t0, int t1, int n_head_kv,
                                        int kh, int tid) {
    for (int x = t0 * PER + tid; x < t1 * PER; x += ONE_THREADS) {
        const int t = x / PER, c = x % PER * CW;
        uint8_t *d = dst + (size_t)t * RBS + c;
        const uint8_t *g = src + ((size_t)t * n_head_kv + kh) * rb + c;
        if constexpr (CW == 16) cp_async16(d, g, 16);
        else if constexpr (CW == 8) cp_async8(d, g, 8);
        else cp_async4(d, g, 4);
    }
}
/* CW bytes from src to dst (both CW-aligned): one load and store */
template <int CW> __device__ static inline void one_copy(void *dst, const void *src) {
    if constexpr (CW == 16) *(uint4 *)dst = *(const uint4 *)src;
    else if constexpr (CW == 8) *(uint2 *)dst = *(const uint2 *)src;
    else *(uint32_t *)dst = *(const uint32_t *)src;
}

template <int HD, int MK, int MV>
__global__ void __launch_bounds__(ONE_THREADS)
    k_attn_one(const float *q, const uint8_t *K, const uint8_t *V, size_t rbk, size_t rbv, int pos0, int n_head,
               int n_head_kv, float scale, const int *dpos, int tmax, int early, float *out, attn_fuse fx, act_q aq) {
    /* rbk = RBK, rbv = RBV (launch_attention_split); staged in pieces of CWK / CWV bytes */
    constexpr int RBK = one_rb<HD, MK>(), RBSK = one_rbs<HD, MK>(), RBV = one_rb<HD, MV>(), RBSV = one_rbs<HD, MV>();
    constexpr int CWK = RBK % 16 == 0 ? 16 : RBK % 8 == 0 ? 8 : 4, PERK = RBK / CWK;
    constexpr int CWV = RBV % 16 == 0 ? 16 : RBV % 8 == 0 ? 8 : 4, PERV = RBV / CWV;
    constexpr int LPK = HD / 16, KPB = ONE_THREADS / LPK; /* phase 1: lanes a key, keys a pass */
    constexpr int NC8 = HD / 8, NKG = ONE_THREADS / NC8;  /* phase 3: 8-dim chunks, key groups */
    extern __shared__ __align__(16) float smo[];
    pdl_trigger();
    const int h = blockIdx.x, G = n_head / n_head_kv, kh = h / G, tid = threadIdx.x, lane = tid % 32;
    if (dpos) pos0 = *dpos; /* written before the graph launch */
    const int T = pos0 + 1;
    if (T > tmax) { /* not launched so (launch_attention_split); keep the chain, compute nothing */
        if (h == 0) pdl_wait();
        return;
    }
    uint8_t *Ks = (uint8_t *)smo, *Vs = Ks + (size_t)tmax * RBSK;
    float *S = (float *)(Vs + (size_t)tmax * RBSV), *qs = S + tmax, *red = qs + HD, *sc = red + NKG * HD;
    auto stage = [&](int t0, int t1) { /* rows [t0, t1) of K and V into Ks, Vs */
        one_stage<CWK, PERK, RBSK>(Ks, K, rbk, t0, t1, n_head_kv, kh, tid);
        one_stage<CWV, PERV, RBSV>(Vs, V, rbv, t0, t1, n_head_kv, kh, tid);
        cp_async_commit();
    };
    const int tp = early ? pos0 : 0; /* rows before pos0 were written by earlier steps */
    stage(0, tp);
    pdl_wait();
    stage(tp, fx.qkv ? pos0 : T);
    if (fx.qkv) { /* the split folded in: q rotated into qs, the token's K and V rows into Ks / Vs */
        uint8_t *kd = Ks + (size_t)pos0 * RBSK, *vd = Vs + (size_t)pos0 * RBSV;
        if (MK == QF_KV_F16 && fx.rot == 0.0f) {
            for (int j = tid; j < HD / 2; j += ONE_THREADS) {
                fold_q_pair(fx, HD, h, j, qs);
                fold_kv_pair(fx, HD, n_head, n_head_kv, kh, j, (__half *)kd, (__half *)vd);
            }
        } else { /* f32 rows in red (free until phase 3), rotated (--kv-rot), then stored */
            for (int j = tid; j < HD / 2; j += ONE_THREADS) {
                fold_q_pair(fx, HD, h, j, qs);
                fold_kv_pair(fx, HD, n_head, n_head_kv, kh, j, red, red + HD);
            }
            __syncthreads();
            const int w = tid / 32;
            if (fx.rot != 0.0f) { /* q, K, V: a warp each (k_hadamard's values) */
                if (w < 3) hadamard_warp(w ? red + (w - 1) * HD : qs, HD, lane, fx.rot);
                __syncthreads();
            }
            if constexpr (MK == QF_KV_F16) { /* the K|V write's roundings (MV f16 too) */
                for (int e = tid; e < 2 * HD; e += ONE_THREADS)
                    ((__half *)(e < HD ? kd : vd))[e % HD] = __float2half_rn(red[e]);
            } else { /* a warp a 32-block (8 warps: 2 HD / 32 <= 8), kv_quant_block's bytes */
                constexpr int NB = HD / QK; /* blocks a row; their bytes RBK / NB, RBV / NB */
                if (w < NB) kv_quant_warp<MK>(red[w * QK + lane], lane, kd + w * (RBK / NB));
                else if (w < 2 * NB) kv_quant_warp<MV>(red[HD + (w - NB) * QK + lane], lane, vd + (w - NB) * (RBV / NB));
            }
        }
    } else
        for (int e = tid; e < HD; e += ONE_THREADS) qs[e] = q[(size_t)h * HD + e];
    cp_async_wait0();
    __syncthreads();
    if (fx.qkv && h % G == 0) /* the group's first block: the token's rows into the cache */
        for (int x = tid; x < PERK + PERV; x += ONE_THREADS) {
            if (x < PERK)
                one_copy<CWK>(const_cast<uint8_t *>(K) + ((size_t)pos0 * n_head_kv + kh) * rbk + x * CWK,
                              Ks + (size_t)pos0 * RBSK + x * CWK);
            else
                one_copy<CWV>(const_cast<uint8_t *>(V) + ((size_t)pos0 * n_head_kv + kh) * rbv + (x - PERK) * CWV,
                              Vs + (size_t)pos0 * RBSV + (x - PERK) * CWV);
        }
    /* phase 1: S[t] = q . k_t * scale, and mloc the max over this thread's keys */
    const int sub = tid % LPK, t1 = tid / LPK;
    float qv[16], mloc = -INFINITY;
#pragma unroll
    for (int u = 0; u < 2; u++)
#pragma unroll
        for (int k = 0; k < 8; k++) qv[8 * u + k] = qs[8 * (u * LPK + sub) + k];
    for (int tb = 0; tb < T; tb += KPB) { /* every lane to the end: the shuffles take the whole warp */
        const int t = tb + t1;
        float a = 0.0f;
        if (t < T) {
            float kf[16];
            one_load8<MK>(Ks + (size_t)t * RBSK, sub, kf), one_load8<MK>(Ks + (size_t)t * RBSK, LPK + sub, kf + 8);
#pragma unroll
            for (int k = 0; k < 16; k++) a += qv[k] * kf[k];
        }
#pragma unroll
        for (int o = LPK / 2; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
        if (sub == 0 && t < T) S[t] = a * scale;
        if (t < T) mloc = fmaxf(mloc, a * scale);
    }
    /* M = the max over the block: each warp's into sc, then all of them read by every thread */
    for (int o = 16; o > 0; o >>= 1) mloc = fmaxf(mloc, __shfl_xor_sync(0xffffffffu, mloc, o));
    if (lane == 0) sc[tid / 32] = mloc;
    __syncthreads(); /* S and the warps' maxima */
    float m = sc[0];
#pragma unroll
    for (int w = 1; w < ONE_THREADS / 32; w++) m = fmaxf(m, sc[w]);
    /* phase 3: acc[0..8) = sum over this key group's keys of p_t v_t[8 d8 ..], p_t = exp(s_t - M)
     * formed here, lg = the group's sum of p */
    const int d8 = tid % NC8, kg = tid / NC8;
    float acc[8], lg = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; k++) acc[k] = 0.0f;
    for (int t = kg; t < T; t += NKG) {
        float vf[8];
        one_load8<MV>(Vs + (size_t)t * RBSV, d8, vf);
        const float p = expf(S[t] - m);
        lg += p;
#pragma unroll
        for (int k = 0; k < 8; k++) acc[k] += p * vf[k];
    }
#pragma unroll
    for (int k = 0; k < 8; k++) red[kg * HD + 8 * d8 + k] = acc[k];
    if (d8 == 0) sc[ONE_THREADS / 32 + kg] = lg;
    __syncthreads();
    float o = 0.0f;
    if (tid < HD) { /* the key groups in order: their sums and their l */
        float l = 0.0f;
#pragma unroll 4
        for (int g = 0; g < NKG; g++) o += red[g * HD + tid], l += sc[ONE_THREADS / 32 + g];
        o = o * (1.0f / l);
    }
    /* the cache's rows rotated: the output rotated back (qs is free since phase 1) */
    if (fx.rot != 0.0f) o = rotate_back(o, tid, HD, qs, fx.rot);
    if (tid >= HD) return;
    const size_t at = (size_t)h * HD + tid;
    out[at] = o;
    /* aq set (HD % 32 == 0: every warp one whole 32-block): the o matvec's q8_0 activation */
    if (aq.qs) quant_q8_warp(o, tid % 32, aq.qs + at, aq.xd + at / 32, aq.xs + at / 32);
}
#define ONE_SMEM_MAX (227 * 1024) /* sm_90: 227 KiB of shared memory a block */
/* The shared memory a k_attn_one block takes: what tmax needs, and at least 138 KiB (256 keys
 * of f16 rows at head_dim 128 need 146 KiB with 512 threads' key groups). Measured on the
 * H100 (8B q4_0 decode at positions 1..128, docs/gpu.md "Session 40"): the 73 KiB that 128 keys
 * need ran the step at 0.87x of 138 KiB, 164 KiB at 0.99x, 207 KiB (or 138 with the carveout
 * preference at 100%) at 0.91x. Below half an SM's 228 KiB two blocks can share an SM; above
 * 196 the SM takes its largest carveout; which of the two costs the time is not established. */
#define ONE_SMEM_MIN (138 * 1024)
template <int HD, int MK, int MV> static size_t one_smem_launch(int tmax) {
    const size_t b = one_smem<HD, MK, MV>(tmax);
    return b > ONE_SMEM_MIN ? b : ONE_SMEM_MIN;
}
/* f(HD, MK, MV) as std::integral_constant values for K and V both f16, or each q8_0 or q4_0,
 * head_dim 64 or 128; other shapes call nothing */
template <typename F> static void one_by_shape(qf_kv_mode mk, qf_kv_mode mv, int hd, F f) {
    auto with_m = [&](auto HH) {
        if (mk == QF_KV_F16 && mv == QF_KV_F16)
            f(HH, std::integral_constant<int, QF_KV_F16>{}, std::integral_constant<int, QF_KV_F16>{});
        else if (kv_qz(mk) && kv_qz(mv)) qz_modes(mk, mv, [&](auto ZK, auto ZV) { f(HH, ZK, ZV); });
    };
    if (hd == 128) with_m(std::integral_constant<int, 128>{});
    else if (hd == 64) with_m(std::integral_constant<int, 64>{});
}
int attention_one_keys(qf_kv_mode mk, qf_kv_mode mv, int hd) {
    if (!((mk == QF_KV_F16 && mv == QF_KV_F16) || (kv_qz(mk) && kv_qz(mv))) || !(hd == 64 || hd == 128)) return 0;
    /* the current device's opt-in limit a block (sm_86 / sm_89: 99 KiB; then split-K) */
    const int optin = cu_smem_optin();
    if (optin <= 0) return 0;
    const size_t lim = (size_t)optin < ONE_SMEM_MAX ? (size_t)optin : ONE_SMEM_MAX;
    int keys = 0;
    one_by_shape(mk, mv, hd, [&](auto HH, auto MK, auto MV) {
        constexpr int H = HH.value;
        keys = one_smem_launch<H, MK.value, MV.value>(one_keys<H>()) <= lim ? one_keys<H>() : 0;
    });
    return keys;
}
bool attention_one_runs(qf_kv_mode mk, qf_kv_mode mv, const void *K, const void *V, size_t rbk, size_t rbv, int n,
                        int hd, int pos0, const int *dpos, int n_ctx) {
    if (n != 1 || ((uintptr_t)K % 16) || ((uintptr_t)V % 16) || rbk != kv_row_bytes(mk, hd) || rbv != kv_row_bytes(mv, hd))
        return false;
    const int tone = attention_one_keys(mk, mv, hd);
    return tone && (dpos ? n_ctx > 0 && n_ctx <= tone : pos0 + 1 <= tone);
}
/* k_attn_one<HD, MK, MV> over at most tmax <= one_keys<HD>() keys; its shared memory (over 48
 * KiB) allowed once a device */
template <int HD, int MK, int MV>
static void launch_one(const float *q, const uint8_t *K, const uint8_t *V, size_t rbk, size_t rbv, int pos0, int n_head,
                       int n_head_kv, float scale, const int *dpos, int tmax, bool early, float *out, attn_fuse f,
                       act_q aq, cudaStream_t s) {
    static std::atomic<unsigned long long> allowed{0};
    cu_allow_smem(k_attn_one<HD, MK, MV>, one_smem_launch<HD, MK, MV>(one_keys<HD>()), allowed);
    cu_launch(k_attn_one<HD, MK, MV>, dim3((unsigned)n_head), dim3(ONE_THREADS), one_smem_launch<HD, MK, MV>(tmax), s, q, K,
              V, rbk, rbv, pos0, n_head, n_head_kv, scale, dpos, tmax, (int)early, out, f, aq);
}

/* ---- split-K over int8 caches read in place (attn_i8): the grouped kernels' ranges, phases and
 * partials; a range's K rows, then (after the softmax) its V rows, are staged 32 keys at a time:
 * the coded bytes copied into shared memory (16-byte loads; rows before pos0 of the first K
 * tile before pdl_wait), dequantized there into f32 rows X[key][HD] as the expansion kernels do,
 * and read by phase 1 (HD / 16 lanes a key, as k_attn_split_h) or phase 3 (thread (key group,
 * 8-dim chunk)). Static rows: code * scale[e]; token rows: code * the step whose exponent the
 * parities of the 8 element groups (e % 8) spell, from the HD / 16 lanes of a row; ec-rot: a
 * thread per 32-element chunk of the head's share of the coded row (ec_decode_run, from the
 * row's index). The reduction buffer shares the tiles' memory. */
#define I8_TK 32 /* keys a tile */
/* shared floats before the tiles (S, ml; 16-byte aligned), and in all */
__host__ __device__ static inline int spliti8_head(int G, int L) { return (G * L + 2 * G + 3) & ~3; }
static size_t spliti8_smem(int G, int hd, int L, int ec_n) {
    const int rw = (ec_n > hd ? ec_n : hd) / 4 + 4; /* staged words a key */
    size_t u = (size_t)I8_TK * (hd + 4) + (size_t)I8_TK * rw;
    const size_t red = (size_t)SPLIT_WARPS * G * hd;
    if (red > u) u = red;
    return ((size_t)spliti8_head(G, L) + u) * sizeof(float);
}

template <int G, int HD>
__global__ void __launch_bounds__(SPLIT_WARPS * 32)
    k_attn_split_i8(const float *q, const uint8_t *K, const uint8_t *V, int pos0, int n_head, int n_head_kv, float scale,
                    int n, const int *dpos, float *part, attn_i8 a) {
    constexpr int NT = SPLIT_WARPS * 32, LPK = HD / 16, KPW = 32 / LPK, KPB = KPW * SPLIT_WARPS;
    constexpr int NC8 = HD / 8, NKG = NT / NC8, XS = HD + 4, CPK = HD / KV_EC_CHUNK;
    extern __shared__ __align__(16) float smi[];
    pdl_trigger();
    const int c = blockIdx.x, kh = blockIdx.y, i = blockIdx.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tid = threadIdx.x;
    if (dpos) pos0 = *dpos; /* written before the graph launch */
    int L, nsplit;
    split_ranges_g(pos0 + n, &L, &nsplit);
    if (c >= nsplit) return;
    const int T = pos0 + i + 1, j0 = c * L, len = min(T, j0 + L) - j0; /* len <= 0: no keys */
    const int tp = max(0, pos0 - j0); /* range rows before it were written by earlier steps */
    float *S = smi, *ml = S + G * L, *X = smi + spliti8_head(G, L), *red = X;
    uint32_t *raw = (uint32_t *)(X + I8_TK * XS);
    const int ec_n = a.ec_n, gh = max(1, ec_n / HD), ngrp = n_head_kv / gh, nix = kv_ec_index(ec_n);
    /* stream s's class, bytes a staged row and row address (field by field, no indexed parameter) */
    auto cls_of = [&](int s) { return i8_class(s ? a.lay[1] : a.lay[0]); };
    auto row_words = [&](int s) { return (cls_of(s) == I8_EC ? ec_n : HD) / 4; };
    auto row_at = [&](int s, int p) -> const uint8_t * {
        const uint8_t *base = s ? V : K;
        return cls_of(s) == I8_EC ? base + ((size_t)p * ngrp + kh / gh) * ec_n : base + ((size_t)p * n_head_kv + kh) * HD;
    };
    /* keys [k0, k1) of the tile at tb: their coded rows into raw (stride RW + 4 words: ec_decode_run
     * reads up to two words past a row) */
    auto stage = [&](int s, int tb, int k0, int k1) {
        const int RW = row_words(s), n4 = RW / 4;
        for (int w = tid; w < (k1 - k0) * n4; w += NT) {
            const int k = k0 + w / n4, v = w % n4;
            *(uint4 *)(raw + k * (RW + 4) + 4 * v) = __ldg((const uint4 *)row_at(s, j0 + tb + k) + v);
        }
    };
    /* the tile's nk staged rows of stream s to f32 in X */
    auto decode = [&](int s, int tb, int nk) {
        const int cl = cls_of(s), RW = row_words(s);
        if (cl == I8_EC) {
            const int k = tid / CPK, cc = tid % CPK, ch0 = (kh % gh) * CPK, ch = ch0 + cc, e0 = ch * KV_EC_CHUNK;
            if (k < nk) {
                const uint32_t *qw = raw + k * (RW + 4);
                float *x = X + k * XS + cc * KV_EC_CHUNK - e0; /* x[e0 + j]: the head's element cc * 32 + j */
                const uint32_t e = qw[0] & 1023u;
                int ii = e0;
                if (e) {
                    const uint16_t *ix = s ? a.ix[1] : a.ix[0];
                    const int pos = ch ? __ldg(ix + ((size_t)(j0 + tb + k) * ngrp + kh / gh) * nix + ch - 1) : 10;
                    ii = ec_decode_run(qw, RW, pos, ec_n * 8, e0, e0 + KV_EC_CHUNK, a.steps[KV_EC_STEP_OFF + e],
                                       [&](int j, float v) { x[j] = v; });
                }
                for (; ii < e0 + KV_EC_CHUNK; ii++) x[ii] = 0.0f;
            }
            return;
        }
        const float *sc = cl == I8_STATIC ? (s ? a.scale[1] : a.scale[0]) + (size_t)kh * HD : NULL;
#pragma unroll
        for (int r = 0; r < I8_TK * LPK / NT; r++) {
            const int task = tid + NT * r, k = task / LPK, c16 = task % LPK; /* a row's LPK lanes are adjacent */
            const uint4 w = k < nk ? *(const uint4 *)(raw + k * (RW + 4) + 4 * c16) : make_uint4(0, 0, 0, 0);
            const bool tok = cl == I8_TOKEN;
            const float st = tok ? i8_tok_step<LPK>(i8_tok_par16(w), a.steps) : 0.0f;
            if (k >= nk) continue;
            const uint32_t wv[4] = {w.x, w.y, w.z, w.w};
            float scv[16], f[16];
#pragma unroll
            for (int j = 0; j < 16; j++) scv[j] = tok ? 0.0f : __ldg(sc + 16 * c16 + j);
            i8_codes<16>(wv, tok, scv, st, f);
            float4 *xo = (float4 *)(X + k * XS + 16 * c16);
#pragma unroll
            for (int j = 0; j < 4; j++) xo[j] = make_float4(f[4 * j], f[4 * j + 1], f[4 * j + 2], f[4 * j + 3]);
        }
    };
    const int nk0 = min(len, I8_TK);
    if (len > 0) stage(0, 0, 0, min(nk0, tp)); /* rows older than pos0, in the predecessor's shadow */
    pdl_wait();
    const int t1 = warp * KPW + lane / LPK, sub = lane % LPK; /* phase 1: this lane's key in a pass, slice */
    float qv[G][16];
#pragma unroll
    for (int g = 0; g < G; g++) {
        const float4 *qp = (const float4 *)(q + (size_t)i * n_head * HD + ((size_t)kh * G + g) * HD + 16 * sub);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float4 v = qp[k];
            qv[g][4 * k] = v.x, qv[g][4 * k + 1] = v.y, qv[g][4 * k + 2] = v.z, qv[g][4 * k + 3] = v.w;
        }
    }
    /* phase 1: S[g][t] = q_g . k_t * scale, a tile at a time */
    for (int tb = 0; tb < len; tb += I8_TK) {
        const int nk = min(len - tb, I8_TK);
        if (tb) __syncthreads(); /* the last tile's X read */
        stage(0, tb, tb ? 0 : min(nk, tp), nk);
        __syncthreads();
        decode(0, tb, nk);
        __syncthreads();
        for (int kb = 0; kb < nk; kb += KPB) {
            const int t = kb + t1;
            float kf[16];
            const float4 *xr = (const float4 *)(X + (t < nk ? t : 0) * XS + 16 * sub);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const float4 v = xr[k];
                kf[4 * k] = v.x, kf[4 * k + 1] = v.y, kf[4 * k + 2] = v.z, kf[4 * k + 3] = v.w;
            }
            split_score<G, LPK>(qv, kf, sub == 0 && t < nk, S, L, tb + t, scale);
        }
    }
    __syncthreads();
    split_softmax(S, L, len, G, ml, warp, lane);
    /* phase 3: acc[g][0..8) = sum over this key group's keys of p[g][t] v[t][8 d8 ..] */
    const int d8 = tid % NC8, kg = tid / NC8;
    float acc[G][8];
#pragma unroll
    for (int g = 0; g < G; g++)
#pragma unroll
        for (int k = 0; k < 8; k++) acc[g][k] = 0.0f;
    for (int tb = 0; tb < len; tb += I8_TK) {
        const int nk = min(len - tb, I8_TK);
        __syncthreads(); /* the softmax's S, the last tile's X read */
        stage(1, tb, 0, nk);
        __syncthreads();
        decode(1, tb, nk);
        __syncthreads();
        for (int t = kg; t < nk; t += NKG) {
            const float4 *xr = (const float4 *)(X + t * XS + 8 * d8);
            const float4 u0 = xr[0], u1 = xr[1];
            const float vf[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
#pragma unroll
            for (int g = 0; g < G; g++) {
                const float p = S[g * L + tb + t];
#pragma unroll
                for (int k = 0; k < 8; k++) acc[g][k] += p * vf[k];
            }
        }
    }
    split_finish<G, HD, NC8, true>(acc, red, ml, part, i, n_head, kh, nsplit, c); /* red is the tiles' memory */
}

/* One block per (head, query), a thread per element e of the head: after the wait every thread
 * loads the ranges' (m_c, l_c) (thread c) and its own o_c[e] of the first MERGE_R ranges in one
 * round trip, warp 0 finds M = max m_c over the non-empty ranges, the weights w_c = e^(m_c - M)
 * (0 for an empty range) and l = sum w_c l_c, then thread e writes sum_c o_c[e] w_c / l (the
 * ranges in order). dpos is read before the wait (the host writes it before the graph launch). */
#define MERGE_R 32
__global__ void k_attn_merge(const float *part, int pos0, int n_head, int hd, int n, const int *dpos, int grouped,
                             float *out, act_q aq, float rot) {
    pdl_trigger();
    __shared__ float wc[SPLIT_MAX], lc[SPLIT_MAX];
    __shared__ float inv_ls;
    __shared__ float orow[HD_MAX]; /* rot: the output row, rotated back */
    const int h = blockIdx.x, i = blockIdx.y, e = threadIdx.x;
    if (dpos) pos0 = *dpos; /* written before the graph launch */
    int L, nsplit;
    if (grouped) split_ranges_g(pos0 + n, &L, &nsplit);
    else split_ranges(pos0 + n, &L, &nsplit);
    const int T = pos0 + i + 1, ns = (T + L - 1) / L;
    const float *pp = part + ((size_t)i * n_head + h) * nsplit * (hd + 2);
    pdl_wait();
    for (int c = threadIdx.x; c < ns; c += blockDim.x) wc[c] = pp[(size_t)c * (hd + 2)], lc[c] = pp[(size_t)c * (hd + 2) + 1];
    float pv[MERGE_R];
#pragma unroll
    for (int u = 0; u < MERGE_R; u++) pv[u] = u < ns && e < hd ? pp[(size_t)u * (hd + 2) + 2 + e] : 0.0f;
    __syncthreads();
    if (threadIdx.x < 32) {
        float M = -INFINITY;
        for (int c = threadIdx.x; c < ns; c += 32)
            if (lc[c] > 0) M = fmaxf(M, wc[c]);
        for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
        float ls = 0.0f;
        for (int c = threadIdx.x; c < ns; c += 32) {
            const float w = lc[c] > 0 ? expf(wc[c] - M) : 0.0f;
            ls += w * lc[c];
            wc[c] = w;
        }
        ls = warp_sum(ls);
        if (threadIdx.x == 0) inv_ls = 1.0f / ls;
    }
    __syncthreads();
    float o = 0.0f;
    if (e < hd) {
#pragma unroll
        for (int u = 0; u < MERGE_R; u++)
            if (u < ns) o += pv[u] * wc[u];
        for (int c = MERGE_R; c < ns; c++) o += pp[(size_t)c * (hd + 2) + 2 + e] * wc[c];
        o = o * inv_ls;
    }
    /* the cache's rows rotated (--kv-rot, int8 rotated V): H o, rotated back */
    if (rot != 0.0f) o = rotate_back(o, e, hd, orow, rot);
    if (e >= hd) return;
    const size_t at = (size_t)i * n_head * hd + (size_t)h * hd + e;
    out[at] = o;
    /* aq set (hd % 32 == 0: every warp one whole 32-block): the o matvec's q8_0 activation */
    if (aq.qs) quant_q8_warp(o, e % 32, aq.qs + at, aq.xd + at / 32, aq.xs + at / 32);
}

size_t attention_split_floats(int n, int n_head, int hd) { return (size_t)n * n_head * SPLIT_MAX * (hd + 2); }

/* whether neither stream is ec-rot: k_attn_split_h reads both in place, no staging */
static bool i8_direct(const attn_i8 *i8) { return i8_class(i8->lay[0]) != I8_EC && i8_class(i8->lay[1]) != I8_EC; }

bool attention_split_i8_ok(int n_head, int n_head_kv, int hd, int n_ctx, const attn_i8 *i8) {
    const int G = n_head / n_head_kv;
    if (!i8 || n_head % n_head_kv || !(hd == 64 || hd == 128) || !(G == 1 || G == 2 || G == 3 || G == 4 || G == 8))
        return false;
    for (int s = 0; s < 2; s++) {
        const int cl = i8_class(i8->lay[s]);
        if (cl == I8_EC && (!i8->ix[s] || i8->ec_n % hd || i8->ec_n > HD_MAX || n_head_kv % (i8->ec_n / hd) ||
                            kv_ec_index(i8->ec_n) == 0))
            return false;
        if (cl == I8_STATIC && !i8->scale[s]) return false;
    }
    int L, nsplit;
    split_ranges_g(n_ctx, &L, &nsplit);
    return i8->steps && spliti8_smem(G, hd, L, i8->ec_n) <= 48 * 1024;
}

bool launch_attention_split(qf_kv_mode mk, qf_kv_mode mv, const float *q, const uint8_t *K, const uint8_t *V,
                            size_t rbk, size_t rbv, int n, int pos0, int n_head, int n_head_kv, int hd, float *out,
                            float *part, cudaStream_t s, const int *dpos, int n_ctx, bool early, const attn_fuse *fx,
                            const attn_i8 *i8) {
    const int G = n_head / n_head_kv;
    int L, nsplit;
    /* the grouped kernel where the group and its shared memory fit, sized for the longest
     * range any position up to n_ctx has (so graph replay and plain launches agree) */
    split_ranges_g(n_ctx > 0 ? n_ctx : pos0 + n, &L, &nsplit); /* the same choice at every position of a context */
    const size_t gsm = splitg_smem(G, hd, L);
    const bool grouped = i8 || (G <= SPLITG_GMAX && gsm <= 48 * 1024);
    const size_t ism = i8 ? spliti8_smem(G, hd, L, i8->ec_n) : 0; /* L: n_ctx's, as hsm's */
    /* the vectorized kernel (k_attn_split_h, the same ranges and partials) for f16 rows of
     * head_dim 64 or 128, 16-byte aligned, groups of 1, 2, 4 or 8: on the H200, 8B shape, -c 512,
     * 5.8 us per layer against 12.7 for k_attn_split_g (Nsight Compute) */
    const size_t hsm = splith_smem(G, hd, L);
    const bool vh = grouped && mk == QF_KV_F16 && mv == QF_KV_F16 && (hd == 64 || hd == 128) &&
                    (G == 1 || G == 2 || G == 4 || G == 8) && hsm <= 48 * 1024 &&
                    ((uintptr_t)K % 16) == 0 && ((uintptr_t)V % 16) == 0 && rbk % 16 == 0 && rbv % 16 == 0 &&
                    ((uintptr_t)q % 16) == 0;
    /* its q8_0 / q4_0 form (K and V each either, rows of kv_row_bytes; groups 1, 2, 3, 4, 8)
     * instead of k_attn_split_g's kv_elem an element: on the H100, 8B q4_0 decode with a q8_0
     * cache at positions 4000.. 245.0 -> 394.9 tok/s, at 16000.. 99.2 -> 293.1 (docs/gpu.md
     * "Session 41") */
    /* (and where one of K, V is f16 and the other q8_0 or q4_0: the f16 stream as vh reads it) */
    const bool vq = grouped && (kv_qz(mk) || mk == QF_KV_F16) && (kv_qz(mv) || mv == QF_KV_F16) &&
                    !(mk == QF_KV_F16 && mv == QF_KV_F16) && (hd == 64 || hd == 128) &&
                    (G == 1 || G == 2 || G == 3 || G == 4 || G == 8) && hsm <= 48 * 1024 && ((uintptr_t)K % 16) == 0 &&
                    ((uintptr_t)V % 16) == 0 && rbk == kv_row_bytes(mk, hd) && rbv == kv_row_bytes(mv, hd) &&
                    ((uintptr_t)q % 16) == 0;
    if (grouped) {
        split_ranges_g(pos0 + n, &L, &nsplit);
        if (dpos) { /* the most ranges any Tmax <= n_ctx has: ceil(T / 16) up to T = 1024, then SPLITG_MAX */
            nsplit = (n_ctx + SPLITG_L_MIN - 1) / SPLITG_L_MIN;
            if (nsplit > SPLITG_MAX) nsplit = SPLITG_MAX;
        }
    } else {
        split_ranges(pos0 + n, &L, &nsplit);
        if (dpos) { /* the most ranges any Tmax <= n_ctx has: ceil(T / 16) up to T = 4096, then SPLIT_MAX */
            nsplit = (n_ctx + SPLIT_L_MIN - 1) / SPLIT_L_MIN;
            if (nsplit > SPLIT_MAX) nsplit = SPLIT_MAX;
        }
    }
    const float scale = 1.0f / sqrtf((float)hd);
    const dim3 grid((unsigned)nsplit, (unsigned)(grouped ? n_head_kv : n_head), (unsigned)n);
    act_q aq = {};
    const bool wq = fx && fx->xq && hd % 32 == 0;
    if (wq) aq = act_q_view(fx->xq, n, n_head * hd);
    /* one token over at most attention_one_keys keys: k_attn_one alone, for plain launches by
     * the position, for a graph when every position it serves (up to n_ctx keys) is short */
    const bool one = attention_one_runs(mk, mv, K, V, rbk, rbv, n, hd, pos0, dpos, n_ctx);
    attn_fuse f = {};
    if (fx && fx->qkv) {
        if (n == 1 && (one || (vh && fx->rot == 0.0f))) f = *fx, f.xq = NULL; /* folded into k_attn_one / k_attn_split_h */
        else if (mk != QF_KV_F16 || mv != QF_KV_F16 || fx->rot != 0.0f) {
            /* only k_attn_one folds a quantized cache's rows or the rotation: an invariant */
            fprintf(stderr, "qforge: a quantized cache's K|V write or --kv-rot folded into split-K attention\n");
            abort();
        }
        else /* the split first: q to q, K and V to the cache rows */
            launch_qkv_split(fx->qkv, 2, n, n_head, n_head_kv, hd, fx->half, fx->neox != 0, fx->cs, fx->sn, fx->bq, fx->bk,
                             fx->bv, (void *)q, (void *)(K + (dpos ? 0 : (size_t)pos0 * n_head_kv * rbk)),
                             (void *)(V + (dpos ? 0 : (size_t)pos0 * n_head_kv * rbv)), s, dpos);
    }
    if (fx) f.rot = fx->rot; /* the output rotated back by whichever kernel writes it */
    if (one) {
        const int tmax = dpos ? n_ctx : pos0 + 1;
        one_by_shape(mk, mv, hd, [&](auto HH, auto MK, auto MV) {
            launch_one<HH.value, MK.value, MV.value>(q, K, V, rbk, rbv, pos0, n_head, n_head_kv, scale, dpos, tmax, early, out, f, aq,
                                           s);
        });
        return wq;
    }
    /* int8 in place (the caller checked attention_split_i8_ok): static and token rows straight
     * from global memory by k_attn_split_h<G, HD, true>, ec-rot (either stream) staged */
    const bool i8d = i8 && i8_direct(i8) && ((uintptr_t)q % 16) == 0 && hsm <= 48 * 1024;
    /* the vectorized kernels by group (1, 2, 3, 4, 8) and head_dim (64, 128), as
     * std::integral_constant<int, value>; other shapes call nothing */
    auto by_shape = [&](auto launch) {
        auto with_g = [&](auto GG) {
            if (hd == 128) launch(GG, std::integral_constant<int, 128>{});
            else launch(GG, std::integral_constant<int, 64>{});
        };
        switch (G) {
        case 1: with_g(std::integral_constant<int, 1>{}); break;
        case 2: with_g(std::integral_constant<int, 2>{}); break;
        case 3: with_g(std::integral_constant<int, 3>{}); break;
        case 4: with_g(std::integral_constant<int, 4>{}); break;
        case 8: with_g(std::integral_constant<int, 8>{}); break;
        default: break;
        }
    };
    if (i8d)
        by_shape([&](auto GG, auto HH) {
            cu_launch(k_attn_split_h<GG.value, HH.value, true>, grid, dim3(SPLIT_WARPS * 32), hsm, s, q, K, V, (size_t)hd,
                      (size_t)hd, pos0, n_head, n_head_kv, scale, n, dpos, part, (int)early, f, *i8);
        });
    else if (i8)
        by_shape([&](auto GG, auto HH) {
            cu_launch(k_attn_split_i8<GG.value, HH.value>, grid, dim3(SPLIT_WARPS * 32), ism, s, q, K, V, pos0, n_head,
                      n_head_kv, scale, n, dpos, part, *i8);
        });
    else if (vq)
        by_shape([&](auto GG, auto HH) {
            hq_modes(mk, mv, [&](auto ZK, auto ZV) {
                cu_launch(k_attn_split_h<GG.value, HH.value, false, ZK.value, ZV.value>, grid, dim3(SPLIT_WARPS * 32), hsm,
                          s, q, K, V, rbk, rbv, pos0, n_head, n_head_kv, scale, n, dpos, part, (int)early, f, attn_i8{});
            });
        });
    else if (vh)
        by_shape([&](auto GG, auto HH) {
            if constexpr (GG.value != 3) /* vh: no f16 kernel for the group of 3 */
                cu_launch(k_attn_split_h<GG.value, HH.value, false>, grid, dim3(SPLIT_WARPS * 32), hsm, s, q, K, V, rbk,
                          rbv, pos0, n_head, n_head_kv, scale, n, dpos, part, (int)early, f, attn_i8{});
        });
    else
        by_modes(mk, mv, [&](auto MK, auto MV) {
            if (grouped)
                cu_launch(k_attn_split_g<MK.value, MV.value>, grid, dim3(SPLIT_WARPS * 32), gsm, s, q, K, V, rbk, rbv,
                          pos0, n_head, n_head_kv, hd, scale, n, dpos, part, (int)early);
            else
                cu_launch(k_attn_split<MK.value, MV.value>, grid, dim3(SPLIT_WARPS * 32), 0, s, q, K, V, rbk, rbv, pos0,
                          n_head, n_head_kv, hd, scale, n, dpos, part);
        });
    cu_launch(k_attn_merge, dim3((unsigned)n_head, (unsigned)n), dim3((unsigned)((hd + 31) / 32 * 32)), 0, s,
              (const float *)part, pos0, n_head, hd, n, dpos, (int)grouped, out, aq, f.rot);
    return wq;
}
